"""Aggregate timing logs (CONTRACT.md "The timing log") into per-group statistics.

``aggregate`` streams every line of every file once and never holds the records: per group it keeps one compact
``array('d')`` per series (cycle, each phase, between, and the host-clock series of the ``events`` timer) so that
percentiles are exact, plus a few running sums. Memory is about 8 bytes per value of each series.

Assumptions, stated once:

* The records of one process (host, pid, rank) come in ``t`` order within a file, and when one process spans
  several files, the files are given in time order (``iter_log_files`` sorts names). ``t`` is the cycle's start
  (wall clock, seconds).
* ``between_ms`` is attributed to the group of the cycle that *follows* the gap (the scheduler's work that led to
  that cycle). A gap longer than ``idle_gap_s`` counts as idle and is left out; a small negative gap (clock
  jitter) counts as 0; a gap more negative than ``-idle_gap_s`` (records out of order) is left out.
* The cycle's duration for ``between`` is ``host_cycle_ms`` when the record has it (``events`` timer, host
  clock), else ``cycle_ms``.
* A valid record has ``"v": 1``, a number ``t``, a string ``host``, int ``pid`` and ``rank``, a string ``mode``,
  a number ``cycle_ms`` and an object ``phases`` of numbers; ``bs`` and ``accepted`` are numbers or null;
  ``host_cycle_ms`` / ``host_phases`` are optional. Anything else (bad JSON, trailing garbage, a non-object,
  a missing or mistyped field, ``NaN``/``Infinity`` literals, another ``v``) is counted in ``skipped_lines``.
  Blank lines are ignored and not counted.
"""

from __future__ import annotations

import json
import math
import os
from array import array
from bisect import bisect_right
from collections import Counter
from itertools import accumulate
from dataclasses import dataclass
from typing import Any, Sequence

from eaglepatch.errors import UsageError
from eaglepatch.report.stats import (
    key_sort_value,
    mode_sort_value,
    percentile,
    phase_order,
    round_json,
)

BY_CHOICES: tuple[str, ...] = ("bs", "rank", "host")


# --------------------------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stats:
    """Summary of one series of milliseconds: count, mean, p50/p90/p99 (numpy-linear), max and the total."""

    n: int
    mean: float
    p50: float
    p90: float
    p99: float
    max: float
    total: float

    def to_json(self) -> dict[str, Any]:
        """Return ``{"mean", "p50", "p90", "p99", "max"}`` rounded to 4 decimals (the CONTRACT.md shape)."""
        return {
            "mean": round_json(self.mean),
            "p50": round_json(self.p50),
            "p90": round_json(self.p90),
            "p99": round_json(self.p99),
            "max": round_json(self.max),
        }


@dataclass(frozen=True)
class PhaseStats:
    """One phase of a group: stats over the cycles in which it ran, and its share of the group's cycle time.

    ``host``/``host_share`` are the same over the host clock (``events`` timer); ``None`` without host times.
    """

    name: str
    stats: Stats
    share: float
    host: Stats | None = None
    host_share: float | None = None

    def to_json(self) -> dict[str, Any]:
        """Return ``{"mean","p50","p90","p99","max","share"}`` plus the extra keys ``"n"`` and ``"host"``
        (``{"n","mean","p50","p90","p99","max","share"}`` or ``None``)."""
        out = self.stats.to_json()
        out["share"] = round_json(self.share)
        out["n"] = self.stats.n
        if self.host is not None:
            host = self.host.to_json()
            host["share"] = round_json(self.host_share)
            host["n"] = self.host.n
            out["host"] = host
        else:
            out["host"] = None
        return out


@dataclass(frozen=True)
class BetweenStats:
    """Gaps between one cycle's end and the next cycle's start in the same process, in milliseconds."""

    n: int
    mean: float
    p50: float
    p90: float
    total: float

    def to_json(self) -> dict[str, Any]:
        """Return ``{"mean","p50","p90"}`` (CONTRACT.md) plus the extra key ``"n"``."""
        return {
            "mean": round_json(self.mean),
            "p50": round_json(self.p50),
            "p90": round_json(self.p90),
            "n": self.n,
        }


@dataclass(frozen=True)
class GroupStats:
    """The statistics of one group, keyed by ``mode`` and ``key``.

    ``key`` is ``()`` without ``--by``, else ``(("bs", 4),)`` and the like (a tuple so the value stays hashable;
    ``key_dict()`` gives the JSON form). ``phases`` is in canonical order. ``accept_len``, ``tokens_per_s`` and
    ``wall_tokens_per_s`` are ``None`` when no record of the group has ``accepted``; ``between`` is ``None``
    when no gap was measured. ``tokens`` is the sum of ``accepted``.
    """

    mode: str
    key: tuple[tuple[str, Any], ...]
    n: int
    cycle: Stats
    phases: tuple[PhaseStats, ...]
    accept_len: float | None
    tokens_per_s: float | None
    between: BetweenStats | None
    wall_tokens_per_s: float | None
    tokens: float
    host_cycle: Stats | None = None

    def key_dict(self) -> dict[str, Any]:
        """Return the key as a dict: ``{}`` or e.g. ``{"bs": 1}``."""
        return dict(self.key)

    def key_label(self) -> str:
        """Return the key for people: ``""`` or e.g. ``"bs=1"``."""
        return " ".join(f"{k}={'?' if v is None else v}" for k, v in self.key)

    def phase(self, name: str) -> PhaseStats | None:
        """Return the named phase's stats, or ``None`` when that phase never ran in this group."""
        for p in self.phases:
            if p.name == name:
                return p
        return None

    @property
    def has_host(self) -> bool:
        """Whether host-clock times (``events`` timer) exist for this group."""
        return self.host_cycle is not None

    def to_json(self) -> dict[str, Any]:
        """Return the CONTRACT.md group object; extra keys: ``"host_cycle_ms"`` (stats or ``None``) and per phase
        ``"n"`` and ``"host"``; ``between_ms`` has an extra ``"n"``."""
        return {
            "mode": self.mode,
            "key": self.key_dict(),
            "n": self.n,
            "cycle_ms": self.cycle.to_json(),
            "phases": {p.name: p.to_json() for p in self.phases},
            "accept_len": round_json(self.accept_len),
            "tokens_per_s": round_json(self.tokens_per_s),
            "between_ms": self.between.to_json() if self.between is not None else None,
            "wall_tokens_per_s": round_json(self.wall_tokens_per_s),
            "host_cycle_ms": self.host_cycle.to_json() if self.host_cycle is not None else None,
        }


@dataclass(frozen=True)
class ReportResult:
    """What ``aggregate`` returns.

    ``records`` counts every valid record read, *including* the ones ``skip`` dropped (so ``records`` minus the
    sum of the groups' ``n`` is the number skipped); ``skipped_lines`` counts the lines that did not parse.
    ``groups`` is ordered: decode first, then prefill, then other modes; within a mode by key (numbers
    ascending, then strings, null last).
    """

    sources: tuple[str, ...]
    records: int
    skipped_lines: int
    groups: tuple[GroupStats, ...]
    by: str | None = None
    skip: int = 0

    @property
    def has_host(self) -> bool:
        """Whether any group carries host-clock times."""
        return any(g.has_host for g in self.groups)

    def group(self, mode: str, **key: Any) -> GroupStats | None:
        """Return the group with this mode and key (e.g. ``group("decode", bs=4)``), or ``None``."""
        want = tuple(key.items())
        for g in self.groups:
            if g.mode == mode and g.key == want:
                return g
        return None

    def to_json(self) -> dict[str, Any]:
        """Return exactly the CONTRACT.md ``report --json`` object (plus the extra keys documented on
        ``GroupStats.to_json``); floats rounded to 4 decimals."""
        return {
            "sources": list(self.sources),
            "records": self.records,
            "skipped_lines": self.skipped_lines,
            "groups": [g.to_json() for g in self.groups],
        }


# --------------------------------------------------------------------------------------------------------------
# Finding files
# --------------------------------------------------------------------------------------------------------------


def iter_log_files(paths: Sequence[str]) -> list[str]:
    """Expand local files and folders into the list of log files to read.

    A file is taken as given (any name). A folder contributes every ``*.jsonl`` file below it (recursively),
    sorted by path. Duplicates (the same file reached twice) are kept once, at their first place.

    Returns the list of paths. Raises ``UsageError`` when a path does not exist, or when a folder holds no
    ``*.jsonl`` file.
    """
    out: list[str] = []
    seen: set[str] = set()

    def add(p: str) -> None:
        real = os.path.realpath(p)
        if real not in seen:
            seen.add(real)
            out.append(p)

    for path in paths:
        if os.path.isdir(path):
            found: list[str] = []
            for root, dirs, names in os.walk(path):
                dirs.sort()
                for name in names:
                    if name.endswith(".jsonl"):
                        found.append(os.path.join(root, name))
            if not found:
                raise UsageError(
                    f"no *.jsonl timing logs in {path}: apply the patch, send the server some requests, "
                    "then report on its log dir (default /tmp/eaglepatch)"
                )
            for p in sorted(found):
                add(p)
        elif os.path.exists(path):
            add(path)
        else:
            raise UsageError(
                f"no such file or folder: {path}; give timing log files (*.jsonl), folders holding them, or a TARGET"
            )
    return out


# --------------------------------------------------------------------------------------------------------------
# Aggregation
# --------------------------------------------------------------------------------------------------------------


class _Acc:
    """Per-group accumulator used by the hot loop (mutable; never leaves this module)."""

    __slots__ = (
        "mode",
        "keyval",
        "cyc",
        "cyc_app",
        "ph",
        "btw",
        "btw_app",
        "hcyc",
        "hcyc_app",
        "hph",
        "acc",
        "cyc_acc",
        "btw_acc",
        "acc_ab",
        "bs_ab",
    )

    def __init__(self, mode: str, keyval: Any):
        self.mode = mode
        self.keyval = keyval
        self.cyc = array("d")
        self.cyc_app = self.cyc.append
        self.ph: dict[str, Any] = {}  # phase name -> bound append of its array('d')
        self.btw = array("d")
        self.btw_app = self.btw.append
        self.hcyc = array("d")
        self.hcyc_app = self.hcyc.append
        self.hph: dict[str, Any] = {}
        self.acc = 0
        self.cyc_acc = 0.0
        self.btw_acc = 0.0
        self.acc_ab = 0
        self.bs_ab = 0


class _BadLine(ValueError):
    """A record that does not match the timing-log format (counted, never raised out of ``aggregate``)."""


def _reject_constant(name: str) -> Any:
    raise _BadLine(f"non-finite number {name}")


def _is_num(x: Any) -> bool:
    if type(x) is float:
        return True
    if type(x) is int:
        try:
            float(x)
        except OverflowError:
            return False
        return True
    if isinstance(x, (int, float)):  # bool and subclasses: array('d') takes them, so do we
        return True
    return False


def _append_phases_slow(pm: dict[str, Any], phases: Any) -> None:
    """Slow path after the fast ``pm[name](ms)`` loop raised: undo what it appended, then append every phase
    (creating arrays for new names) or raise ``_BadLine`` having appended nothing."""
    if not isinstance(phases, dict):
        raise _BadLine("phases is not an object")
    items = list(phases.items())
    # The fast loop appended exactly the leading items whose name had an array and whose value was a number.
    for name, ms in items:
        if name in pm and _is_num(ms):
            pm[name].__self__.pop()
        else:
            break
    for _name, ms in items:
        if not _is_num(ms):
            raise _BadLine("a phase time is not a number")
    for name, ms in items:
        app = pm.get(name)
        if app is None:
            app = pm[name] = array("d").append
        app(ms)


def _pop_phases(pm: dict[str, Any], phases: dict[str, Any]) -> None:
    """Undo one fully appended phases dict."""
    for name in phases:
        pm[name].__self__.pop()


def _check_skipped(d: dict[str, Any]) -> None:
    """Validate the parts of a record that ``skip`` would otherwise not look at; raise ``_BadLine``."""
    phases = d["phases"]
    if not isinstance(phases, dict) or not all(_is_num(v) for v in phases.values()):
        raise _BadLine("bad phases")
    for name in ("accepted", "bs", "host_cycle_ms"):
        v = d.get(name)
        if v is not None and not _is_num(v):
            raise _BadLine(f"bad {name}")
    hp = d.get("host_phases")
    if hp is not None and (not isinstance(hp, dict) or not all(_is_num(v) for v in hp.values())):
        raise _BadLine("bad host_phases")


_NO = object()  # "no current process" sentinel; compares unequal to anything a record holds

_BAD_ERRORS = (
    ValueError,  # includes json.JSONDecodeError and _BadLine
    KeyError,
    TypeError,
    AttributeError,
    StopIteration,  # the C scanner's "nothing parses at this index"
    OverflowError,
    IndexError,
    RecursionError,
)


def _scan(
    files: Sequence[str],
    by: str | None,
    skip: int,
    idle_gap_s: float,
    tracer: Any,
    t_min: float | None = None,
    t_max: float | None = None,
) -> tuple[dict[Any, _Acc], int, int]:
    """The hot loop. Returns (groups by key, valid records, bad lines).

    Speed matters here (CONTRACT-sized logs have millions of lines): the C scanner's ``scan_once`` is called
    directly, the current process's and the current group's running state live in local variables and are
    written back only when the process or group changes, and a record is validated before anything is
    mutated (the phase appends, the one step that can fail half-way, are rolled back by the slow path).
    """
    scan = json.JSONDecoder(parse_constant=_reject_constant).scan_once
    bycode = 0 if by is None else 1 + BY_CHOICES.index(by)
    groups: dict[Any, _Acc] = {}
    procs: dict[tuple[Any, Any, Any], tuple[int, float]] = {}
    records = 0
    bad = 0
    ninf = -math.inf
    idle = float(idle_gap_s)
    nidle = -idle
    c_host: Any = _NO
    c_pid: Any = _NO
    c_rank: Any = _NO
    cnt = 0
    last_end = ninf
    bad_errors = _BAD_ERRORS
    slow = _append_phases_slow
    cur_gk: Any = _NO
    g: Any = None
    pm: Any = None
    cyc_app: Any = None
    btw_app: Any = None
    s_acc = s_acc_ab = s_bs_ab = 0
    s_cyc_acc = s_btw_acc = 0.0
    # The time window: records whose ``t`` lies outside it are passed over as if absent (only their JSON and
    # their ``t`` are read), so ``skip``, ``between`` and ``records`` see the window alone.
    windowed = t_min is not None or t_max is not None
    lo = -math.inf if t_min is None else float(t_min)
    hi = math.inf if t_max is None else float(t_max)

    for path in files:
        try:
            f = open(path, encoding="utf-8", errors="replace")
        except OSError as exc:
            raise UsageError(f"cannot read {path}: {exc.strerror}; check the path and its permissions") from None
        with f:
            for line in f:
                try:
                    try:
                        d, end = scan(line, 0)
                    except StopIteration:
                        line = line.strip()
                        if not line:
                            continue
                        d, end = scan(line, 0)
                    if end != len(line) - 1 and line[end:].strip():
                        raise _BadLine("trailing data")
                    if d["v"] != 1:
                        raise _BadLine("unknown version")
                    t = d["t"]
                    if windowed and not lo <= t <= hi:  # TypeError on a non-number: a bad line
                        if not _is_num(t):
                            raise _BadLine("bad t")
                        continue
                    cyc = d["cycle_ms"]
                    phases = d["phases"]
                    mode = d["mode"]
                    host = d["host"]
                    pid = d["pid"]
                    rank = d["rank"]
                    try:
                        acc = d["accepted"]
                    except KeyError:
                        acc = None
                    try:
                        bs = d["bs"]
                    except KeyError:
                        bs = None
                    hcyc = d["host_cycle_ms"] if "host_cycle_ms" in d else None

                    if host != c_host or pid != c_pid or rank != c_rank:
                        if type(host) is not str or type(pid) is not int or type(rank) is not int:
                            raise _BadLine("bad process fields")
                        if c_host is not _NO:
                            procs[(c_host, c_pid, c_rank)] = (cnt, last_end)
                        c_host = host
                        c_pid = pid
                        c_rank = rank
                        cnt, last_end = procs.get((host, pid, rank), (0, ninf))

                    # Validates t and the durations (TypeError on non-numbers) before anything is mutated.
                    if hcyc is None:
                        e = t + cyc * 0.001
                    else:
                        e = t + hcyc * 0.001 + cyc * 0.0

                    if cnt < skip:
                        _check_skipped(d)
                        if type(mode) is not str:
                            raise _BadLine("bad mode")
                        cnt += 1
                        last_end = e
                        records += 1
                        if tracer is not None:
                            tracer.add(d, host, pid, rank, mode, t, True)
                        continue

                    if bycode == 0:
                        gk = mode
                    elif bycode == 1:
                        gk = (mode, bs)
                    elif bycode == 2:
                        gk = (mode, rank)
                    else:
                        gk = (mode, host)
                    if gk != cur_gk:
                        try:
                            ng = groups[gk]
                        except KeyError:
                            if type(mode) is not str:
                                raise _BadLine("bad mode") from None
                            kv = None if bycode == 0 else gk[1]
                            if bycode == 1 and kv is not None and not _is_num(kv):
                                raise _BadLine("bad bs") from None
                            ng = groups[gk] = _Acc(mode, kv)
                        if g is not None:
                            g.acc = s_acc
                            g.acc_ab = s_acc_ab
                            g.bs_ab = s_bs_ab
                            g.cyc_acc = s_cyc_acc
                            g.btw_acc = s_btw_acc
                        g = ng
                        cur_gk = gk
                        s_acc = g.acc
                        s_acc_ab = g.acc_ab
                        s_bs_ab = g.bs_ab
                        s_cyc_acc = g.cyc_acc
                        s_btw_acc = g.btw_acc
                        pm = g.ph
                        cyc_app = g.cyc_app
                        btw_app = g.btw_app

                    if acc is not None:
                        x_acc = s_acc + acc  # validates accepted
                        if bs is not None:
                            x_accab = s_acc_ab + acc
                            x_bsab = s_bs_ab + bs  # validates bs

                    try:
                        for name, ms in phases.items():
                            pm[name](ms)
                    except Exception:
                        slow(pm, phases)

                    if hcyc is not None:
                        hp = d.get("host_phases")
                        if hp is not None:
                            hpm = g.hph
                            try:
                                try:
                                    for name, ms in hp.items():
                                        hpm[name](ms)
                                except Exception:
                                    slow(hpm, hp)
                            except _BadLine:
                                _pop_phases(pm, phases)
                                raise
                        g.hcyc_app(hcyc)

                    # Nothing below can fail.
                    cyc_app(cyc)
                    gap = t - last_end
                    if nidle <= gap <= idle:
                        gap = gap * 1000.0 if gap > 0.0 else 0.0
                        btw_app(gap)
                        if acc is not None:
                            s_btw_acc += gap
                    if acc is not None:
                        s_acc = x_acc
                        s_cyc_acc += cyc
                        if bs is not None:
                            s_acc_ab = x_accab
                            s_bs_ab = x_bsab
                    cnt += 1
                    last_end = e
                    records += 1
                    if tracer is not None:
                        tracer.add(d, host, pid, rank, mode, t, False)
                except bad_errors:
                    bad += 1
    if g is not None:
        g.acc = s_acc
        g.acc_ab = s_acc_ab
        g.bs_ab = s_bs_ab
        g.cyc_acc = s_cyc_acc
        g.btw_acc = s_btw_acc
    return groups, records, bad


class _Counted:
    """A sorted sequence given as distinct values and cumulative counts; indexable like the sorted list."""

    __slots__ = ("keys", "cum", "n")

    def __init__(self, keys: list[float], cum: list[int]):
        self.keys = keys
        self.cum = cum
        self.n = cum[-1] if cum else 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> float:
        if i < 0:
            i += self.n
        if not 0 <= i < self.n:
            raise IndexError(i)
        return self.keys[bisect_right(self.cum, i)]


_COUNT_MIN = 1 << 16  # below this many values a plain sort is quick enough
_COUNT_CHUNK = 1 << 16


def _ordered(values: array) -> Sequence[float]:
    """The values in ascending order, as something ``percentile`` can index.

    The runtime rounds times to 0.1 us, so a long series has far fewer distinct values than values; counting
    them (C-speed ``Counter``) and sorting the distinct ones is then quicker than sorting everything. When the
    values turn out mostly distinct, fall back to ``sorted``. Both give exactly the same order statistics.
    """
    n = len(values)
    if n >= _COUNT_MIN:
        counts: Counter[float] = Counter()
        for i in range(0, n, _COUNT_CHUNK):
            counts.update(values[i : i + _COUNT_CHUNK])
            if len(counts) * 2 > min(n, i + _COUNT_CHUNK):
                break  # mostly distinct: counting does not pay
        else:
            keys = sorted(counts)
            cum = list(accumulate([counts[k] for k in keys]))
            return _Counted(keys, cum)
        del counts
    return sorted(values)


def _series_stats(values: array) -> Stats | None:
    """Stats of one series; ``None`` when empty."""
    n = len(values)
    if n == 0:
        return None
    total = math.fsum(values)
    s = _ordered(values)
    return Stats(
        n=n,
        mean=total / n,
        p50=percentile(s, 50),  # type: ignore[arg-type]
        p90=percentile(s, 90),  # type: ignore[arg-type]
        p99=percentile(s, 99),  # type: ignore[arg-type]
        max=float(s[n - 1]),
        total=total,
    )


def _finish_group(g: _Acc, by: str | None) -> GroupStats:
    cycle = _series_stats(g.cyc)
    assert cycle is not None
    g.cyc = array("d")
    g.cyc_app = None
    cyc_total = cycle.total
    host_cycle = _series_stats(g.hcyc)
    g.hcyc = array("d")
    g.hcyc_app = None
    phases: list[PhaseStats] = []
    for name in phase_order(set(g.ph) | set(g.hph)):
        app = g.ph.pop(name, None)
        st = _series_stats(app.__self__) if app is not None else None
        del app
        happ = g.hph.pop(name, None)
        hst = _series_stats(happ.__self__) if happ is not None else None
        del happ
        if st is None:
            continue  # a host time without a GPU time: not a phase of this group
        share = st.total / cyc_total if cyc_total else 0.0
        hshare = None
        if hst is not None and host_cycle is not None:
            hshare = hst.total / host_cycle.total if host_cycle.total else 0.0
        phases.append(PhaseStats(name=name, stats=st, share=share, host=hst, host_share=hshare))

    between: BetweenStats | None = None
    bst = _series_stats(g.btw)
    g.btw = array("d")
    g.btw_app = None
    if bst is not None:
        between = BetweenStats(n=bst.n, mean=bst.mean, p50=bst.p50, p90=bst.p90, total=bst.total)

    # No record with accepted (and bs) leaves these sums at 0: the values are then null.
    accept_len = g.acc_ab / g.bs_ab if g.bs_ab > 0 else None
    tokens_per_s = g.acc / g.cyc_acc * 1000.0 if g.cyc_acc > 0 else None
    wall_den = g.cyc_acc + g.btw_acc
    wall = g.acc / wall_den * 1000.0 if g.cyc_acc > 0 and wall_den > 0 else None
    key: tuple[tuple[str, Any], ...] = () if by is None else ((by, g.keyval),)
    return GroupStats(
        mode=g.mode,
        key=key,
        n=cycle.n,
        cycle=cycle,
        phases=tuple(phases),
        accept_len=accept_len,
        tokens_per_s=tokens_per_s,
        between=between,
        wall_tokens_per_s=wall,
        tokens=g.acc,
        host_cycle=host_cycle,
    )


def aggregate(
    files: Sequence[str],
    *,
    by: str | None = None,
    skip: int = 0,
    trace_path: str | None = None,
    idle_gap_s: float = 1.0,
    sources: Sequence[str] | None = None,
    t_min: float | None = None,
    t_max: float | None = None,
) -> ReportResult:
    """Read the timing logs ``files`` (local paths, read in the given order) and return their statistics.

    ``by``: ``None`` (one group per mode), ``"bs"``, ``"rank"`` or ``"host"`` (groups per mode and that value).
    ``skip``: drop the first ``skip`` valid cycles of every process (host, pid, rank), counted across files.
    ``trace_path``: also write a Chrome trace-event JSON file there (see ``eaglepatch.report.trace``); it holds
    every valid record, the skipped ones too (marked ``"skipped": true`` in their args).
    ``idle_gap_s``: gaps between cycles longer than this count as idle and are left out of ``between_ms``.
    ``sources``: what the result's ``sources`` lists (default: ``files``), e.g. the SOURCE arguments as given.
    ``t_min``/``t_max``: a time window (wall clock, seconds, inclusive): only records whose ``t`` (the cycle's
    start) lies in it count; the others are passed over as if absent (not in ``records``, not counted by
    ``skip``, no ``between`` gap to or from them). ``None``: no bound on that side.

    Statistics (per group): cycle and phase stats (a phase's over the cycles in which it ran), each phase's
    ``share`` = its total time / the group's total cycle time, ``accept_len`` = sum(accepted) / sum(bs) over
    records with both, ``tokens_per_s`` = sum(accepted) / sum(cycle_ms) * 1000 over records with ``accepted``,
    ``between_ms`` and ``wall_tokens_per_s`` = the same tokens / (their cycle time + the gaps before them) * 1000
    (equal to ``tokens_per_s`` when no gap was measured). See the module docstring for the assumptions.

    Returns a ``ReportResult``; ``records`` counts all valid records, those dropped by ``skip`` included.
    Raises ``UsageError`` for a bad ``by``/``skip``/``idle_gap_s``, a file that cannot be opened, or a trace
    file that cannot be written. Lines that do not parse are counted, never raised.
    """
    if by is not None and by not in BY_CHOICES:
        raise UsageError(f"--by must be one of {', '.join(BY_CHOICES)}, not {by!r}")
    if not isinstance(skip, int) or skip < 0:
        raise UsageError(f"--skip must be a whole number >= 0, not {skip!r}")
    if not idle_gap_s > 0:
        raise UsageError(f"the idle gap must be a positive number of seconds, not {idle_gap_s!r}")
    if t_min is not None and t_max is not None and t_min > t_max:
        raise UsageError(f"the time window is empty: t_min {t_min!r} is after t_max {t_max!r}")
    files = list(files)
    tracer = None
    if trace_path is not None:
        from eaglepatch.report.trace import TraceWriter

        tracer = TraceWriter(trace_path)
    try:
        accs, records, bad = _scan(files, by, skip, idle_gap_s, tracer, t_min, t_max)
    finally:
        if tracer is not None:
            tracer.close()
    # A group whose only records were rejected after it was created holds no cycle: leave it out.
    live = [a for a in accs.values() if len(a.cyc)]
    order = sorted(live, key=lambda a: (mode_sort_value(a.mode), key_sort_value(a.keyval)))
    del live
    accs.clear()
    groups = []
    for acc in order:
        groups.append(_finish_group(acc, by))
    return ReportResult(
        sources=tuple(files if sources is None else sources),
        records=records,
        skipped_lines=bad,
        groups=tuple(groups),
        by=by,
        skip=skip,
    )
