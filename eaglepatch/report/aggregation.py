"""Aggregate timing logs (docs/contract.md "The timing log") into per-group statistics.

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
* What a client sees follows the cadence of cycle starts on the host: a record with ``accepted`` is charged its
  own duration (as for ``between``), the gap before it, and the durations and gaps of the process's records
  without ``accepted`` (prefill cycles) since its previous one; ``wall_tokens_per_s`` is the accepted tokens over
  that time, ``cadence_ms`` that time per such record.
* A valid record has ``"v": 1``, a number ``t``, a string ``host``, int ``pid`` and ``rank``, a string ``mode``,
  a number ``cycle_ms`` and an object ``phases`` of numbers; ``bs`` and ``accepted`` are numbers or null;
  ``host_cycle_ms`` / ``host_phases`` are optional. Anything else (bad JSON, trailing garbage, a non-object,
  a missing or mistyped field, ``NaN``/``Infinity`` literals, another ``v``) is counted in ``skipped_lines``.
  Blank lines are ignored and not counted.

Runs (docs/contract.md "The timing log"; never merged unless asked):

* A record's ``"run"`` (a string) names the server launch that wrote it; a record without one (older logs, or
  ``null``) belongs to the synthetic run ``"file:<basename>"`` of its file (``"file:<path>"`` when two files
  given share a basename). A ``"run"`` of another type makes the line a skipped line.
* A run header line (``{"v": 1, "kind": "run", "run": ID, "t", "timer", "flags", ...}``) is metadata: neither a
  record nor a skipped line. It is read wherever it lies, also outside a ``t_min``/``t_max`` window. A line with
  ``"kind": "run"`` that is not a valid header (no string ``run``, another ``v``) is a skipped line.
* A run's ``start`` is the earliest ``t`` of its header lines and of its records (inside the window). Records are
  looked at for this only where the run (or the spec, the file or the process) changes from one line to the
  next, which gives the earliest ``t`` under the assumption above (a process's records in ``t`` order within a
  file); so does the record's ``timer``. A run's ``timer`` is the set of the timers its header lines and those
  records name, ``"auto"`` left out when a record names the timer it resolved to, joined with ``"+"`` when
  several; ``flags`` come from its header lines (the first header wins a conflict).
* The groups are per run, per mode, per ``by`` value and per ``"spec"`` (a record's speculative settings under
  adaptive speculation, as the compact string ``"steps=3,topk=1,draft_tokens=4"``); the spec shows in a
  group's key only where it varies within the (run, mode, ``by``) group, the run only where the result holds
  more than one run. ``merge_runs`` concatenates the runs' series afterwards (exact percentiles still).
* The runs known to a result are those with a valid record (in the window), plus, without a window, those
  that only have header lines (a server started that has timed nothing yet). Selection (``run_ids``,
  ``since``, ``latest``) picks among them after the scan; with ``trace_path`` and a selection that leaves a run
  out, the files are read a second time to write the trace of the selected runs alone.
"""

from __future__ import annotations

import json
import math
import os
import time
from array import array
from bisect import bisect_right
from collections import Counter
from itertools import accumulate
from dataclasses import dataclass
from typing import Any, Collection, Sequence

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
        """Return ``{"mean", "p50", "p90", "p99", "max"}`` rounded to 4 decimals (the docs/contract.md shape)."""
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
        """Return ``{"mean","p50","p90"}`` (docs/contract.md) plus the extra key ``"n"``."""
        return {
            "mean": round_json(self.mean),
            "p50": round_json(self.p50),
            "p90": round_json(self.p90),
            "n": self.n,
        }


@dataclass(frozen=True)
class Acceptance:
    """A decode group's acceptance profile, from the records' per-request counts (``accepts``/``accept_hist``):
    ``hist`` holds ``(tokens, request-cycles)`` pairs, tokens ascending (a request-cycle is one request in one
    cycle; its tokens include the bonus token), ``samples`` their total."""

    samples: int
    hist: tuple[tuple[int, int], ...]

    @property
    def at_least(self) -> tuple[float, ...]:
        """``at_least[i]``: the share of request-cycles that produced at least ``i + 1`` tokens (so their sum is the
        mean tokens per request-cycle); up to the largest count seen."""
        if not self.samples or not self.hist:
            return ()
        top = self.hist[-1][0]
        more = [0] * (top + 2)  # more[t]: request-cycles with exactly t tokens, then summed from the top
        for t, n in self.hist:
            more[t] += n
        for t in range(top - 1, -1, -1):
            more[t] += more[t + 1]
        return tuple(more[i + 1] / self.samples for i in range(top))

    @property
    def rates(self) -> tuple[float | None, ...]:
        """The per-position rates ``at_least[i] / at_least[i - 1]`` for ``i >= 1`` (the share of request-cycles
        that got past position ``i`` among those that reached it; ``None`` where none reached it)."""
        al = self.at_least
        return tuple(al[i] / al[i - 1] if al[i - 1] else None for i in range(1, len(al)))

    def mean_tokens(self, cap: int | None = None) -> float:
        """The mean tokens per request-cycle, each count capped at ``cap`` tokens (``None``: not capped): what a
        run with ``cap - 1`` draft steps would have produced from the same draft guesses."""
        if not self.samples:
            return 0.0
        return sum(min(t, cap) * n if cap is not None else t * n for t, n in self.hist) / self.samples

    def to_json(self) -> dict[str, Any]:
        """``{"samples", "at_least"}`` (docs/contract.md) plus the extra key ``"rates"``."""
        return {"samples": self.samples, "at_least": [round_json(x) for x in self.at_least],
                "rates": [round_json(x) for x in self.rates]}

    @staticmethod
    def from_json(d: dict[str, Any]) -> "Acceptance":
        """The inverse of ``to_json`` (counts rebuilt from the rounded shares)."""
        n = int(d.get("samples") or 0)
        al = list(d.get("at_least") or ()) + [0.0]
        hist = []
        for i in range(len(al) - 1):
            c = round(n * (al[i] - al[i + 1]))
            if c > 0:
                hist.append((i + 1, c))
        return Acceptance(samples=n, hist=tuple(hist))


def key_label(key: Sequence[tuple[str, Any]]) -> str:
    """A group key for people, without its ``run``: ``""``, ``"bs=1"``, ``"bs=? spec=steps=3,topk=1,..."``."""
    return " ".join(f"{k}={'?' if v is None else v}" for k, v in key if k != "run")


def local_time(epoch: float | None) -> str:
    """``epoch`` as local time, ``"2026-12-01 15:46:44"``; ``"?"`` when unknown."""
    if epoch is None:
        return "?"
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))
    except (OverflowError, OSError, ValueError):
        return "?"


# Speculative flags shown first in a run's compact flags, with their short names.
_FLAG_SHORT: tuple[tuple[str, str], ...] = (
    ("speculative-algorithm", ""),
    ("speculative-draft-model-path", "draft"),
    ("speculative-num-steps", "steps"),
    ("speculative-eagle-topk", "topk"),
    ("speculative-num-draft-tokens", "draft_tokens"),
)


def compact_flags(flags: Sequence[tuple[str, Any]] | dict[str, Any]) -> str:
    """A run's speculative flags in one short string: ``"EAGLE3 draft=llama-eagle3 steps=3 topk=1
    draft_tokens=4"``.

    Only the ``speculative-*`` flags show (the JSON's ``flags`` keep them all). The algorithm's value stands
    alone; the draft model path shows by its last component; the others lose their ``speculative-`` prefix
    (``name=value``; after the well-known ones, by name). A flag whose value is ``true`` shows by its name alone,
    ``false``/``null`` ones are left out."""
    items = dict(flags)
    out: list[str] = []

    def one(name: str, short: str, v: Any) -> None:
        if v is None or v is False:
            return
        if v is True:
            out.append(short or name)
            return
        text = str(v)
        if name == "speculative-draft-model-path":
            text = text.rstrip("/").rsplit("/", 1)[-1] or text
        out.append(text if not short else f"{short}={text}")

    for name, short in _FLAG_SHORT:
        if name in items:
            one(name, short, items.pop(name))
    for name in sorted(items):
        if name.startswith("speculative-"):
            one(name, name[len("speculative-"):], items[name])
    return " ".join(out)


@dataclass(frozen=True)
class RunInfo:
    """One run (a server launch with one patch configuration): ``id`` (a record's ``"run"``, or
    ``"file:<basename>"`` for records without one), ``start`` (epoch seconds: the earliest ``t`` of its header
    lines and records; ``None`` when unknown), ``timer`` (``"sync"``, ``"events"``, ``"cpu"``, ``"auto"``,
    several joined with ``"+"``, or ``None``), ``flags`` (from its header lines, as ``(name, value)`` pairs in
    the header's order) and ``records`` (its valid records, those ``skip`` dropped included)."""

    id: str
    start: float | None
    timer: str | None = None
    flags: tuple[tuple[str, Any], ...] = ()
    records: int = 0
    runtime: str | None = None  # its header's "runtime": the runtime module that wrote it, inside its install
    sources: tuple[str, ...] = ()  # the SOURCEs its lines came from, when the report reads several

    def flags_dict(self) -> dict[str, Any]:
        """The flags as a dict."""
        return dict(self.flags)

    def start_label(self) -> str:
        """The start as local time, ``"2026-12-01 15:46:44"`` (``"?"`` when unknown)."""
        return local_time(self.start)

    def title(self) -> str:
        """The run's header line: ``"run 2026-12-01 15:46:44  EAGLE3 steps=3 topk=1 draft_tokens=4  timer=events
        (id ...)"`` (no flags part without header flags, ``timer=?`` when unknown)."""
        parts = [f"run {self.start_label()}"]
        flags = compact_flags(self.flags)
        if flags:
            parts.append(flags)
        parts.append(f"timer={self.timer or '?'}")
        parts.append(f"(id {self.id})")
        if self.sources:
            parts.append(f"from {', '.join(self.sources)}")
        return "  ".join(parts)

    def short(self) -> str:
        """One line for lists: ``"ID (2026-12-01 15:46:44, timer=sync, EAGLE3 steps=3)"``."""
        flags = compact_flags(self.flags)
        return f"{self.id} ({self.start_label()}, timer={self.timer or '?'}{', ' + flags if flags else ''})"

    def to_json(self) -> dict[str, Any]:
        """``{"id", "start", "timer", "flags", "records"}`` (``records`` is an extra key), and ``"sources"`` when
        the report read several."""
        doc = {"id": self.id, "start": self.start, "timer": self.timer, "flags": self.flags_dict(),
               "records": self.records}
        if self.sources:
            doc["sources"] = list(self.sources)
        return doc

    @staticmethod
    def from_json(d: dict[str, Any]) -> "RunInfo":
        """The inverse of ``to_json``."""
        return RunInfo(id=d["id"], start=d.get("start"), timer=d.get("timer"),
                       flags=tuple((d.get("flags") or {}).items()), records=d.get("records", 0),
                       sources=tuple(d.get("sources") or ()))


@dataclass(frozen=True)
class GroupStats:
    """The statistics of one group, keyed by ``mode`` and ``key``.

    ``key`` is ``()`` without ``--by``, else ``(("bs", 4),)`` and the like (a tuple so the value stays hashable;
    ``key_dict()`` gives the JSON form); then ``("spec", "steps=3,topk=1,draft_tokens=4")`` where the spec varies
    within the group (``None`` for its records without a spec), then ``("run", ID)`` where the result holds
    several runs (not merged). ``phases`` is in canonical order. ``accept_len``, ``tokens_per_s`` and
    ``wall_tokens_per_s`` are ``None`` when no record of the group has ``accepted``; ``between`` is ``None``
    when no gap was measured. ``tokens`` is the sum of ``accepted``. ``run`` is the id of the group's run,
    also when the key leaves it out (one run); ``None`` when runs were merged or it is not known.
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
    run: str | None = None
    acceptance: Acceptance | None = None
    # the wall time per cycle over the records with accepted (host clock: the cycle plus the gap before it), how
    # many such records, and the wall tok/s of up to 10 successive windows of them (the spread over the run)
    cadence_ms: float | None = None
    accepted_cycles: int = 0
    window_tokens_per_s: tuple[float, ...] = ()
    spec: str | None = None  # the records' speculative settings under adaptive speculation, also when not in key

    def key_dict(self) -> dict[str, Any]:
        """Return the key as a dict: ``{}`` or e.g. ``{"bs": 1}`` (``{"bs": 1, "run": "..."}`` with runs)."""
        return dict(self.key)

    def key_label(self) -> str:
        """Return the key for people, the run left out (run header lines and the CSV ``run`` column show it):
        ``""`` or e.g. ``"bs=1"``, ``"bs=1 spec=steps=3,topk=1,draft_tokens=4"``."""
        return key_label(self.key)

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
        """Return the docs/contract.md group object; extra keys: ``"host_cycle_ms"`` (stats or ``None``) and per phase
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
            **({"acceptance": self.acceptance.to_json()} if self.acceptance is not None else {}),
        }


@dataclass(frozen=True)
class ReportResult:
    """What ``aggregate`` returns.

    ``records`` counts every valid record of the selected runs read, *including* the ones ``skip`` dropped (so
    ``records`` minus the sum of the groups' ``n`` is the number skipped); ``skipped_lines`` counts the lines
    that did not parse (in all files, whatever the selection). ``groups`` is ordered by run (oldest first), then
    decode first, then prefill, then other modes; within a mode by key (numbers ascending, then strings, null
    last). ``runs`` are the selected runs, oldest first; ``merged`` is true when ``merge_runs`` put several of
    them into the same groups; ``other_runs`` are the runs of the logs that the selection left out.
    """

    sources: tuple[str, ...]
    records: int
    skipped_lines: int
    groups: tuple[GroupStats, ...]
    by: str | None = None
    skip: int = 0
    runs: tuple[RunInfo, ...] = ()
    merged: bool = False
    other_runs: tuple[RunInfo, ...] = ()

    @property
    def has_host(self) -> bool:
        """Whether any group carries host-clock times."""
        return any(g.has_host for g in self.groups)

    def group(self, mode: str, **key: Any) -> GroupStats | None:
        """Return the group with this mode and key (e.g. ``group("decode", bs=4)``,
        ``group("decode", run="abc")`` with several runs), or ``None``."""
        for g in self.groups:
            if g.mode == mode and dict(g.key) == key:
                return g
        return None

    def run_groups(self, run: str | None) -> tuple[GroupStats, ...]:
        """The groups of one run (by id), in order."""
        return tuple(g for g in self.groups if g.run == run)

    def merge_warning(self) -> str | None:
        """``"merged 3 runs: ...; their figures blend"`` when ``merged``, else ``None``."""
        if not self.merged:
            return None
        timers = {r.timer for r in self.runs}
        flags = {repr(r.flags) for r in self.runs if r.flags}  # a run without header flags: unknown
        what = []
        if len(timers) > 1:
            what.append(f"{len(timers)} timers")
        if len(flags) > 1:
            what.append(f"{len(flags)} flag sets")
        differ = f" ({' and '.join(what)})" if what else ""
        return (f"merged {len(self.runs)} runs{differ}: " + ", ".join(r.short() for r in self.runs)
                + "; their figures blend")

    def to_json(self) -> dict[str, Any]:
        """Return exactly the docs/contract.md ``report --json`` object (plus the extra keys documented on
        ``GroupStats.to_json``); floats rounded to 4 decimals. Then ``"runs"`` (``RunInfo.to_json``, oldest
        first), and, only when several runs were merged, ``"merged": true`` and ``"warnings": [text]``."""
        out: dict[str, Any] = {
            "sources": list(self.sources),
            "records": self.records,
            "skipped_lines": self.skipped_lines,
            "groups": [g.to_json() for g in self.groups],
            "runs": [r.to_json() for r in self.runs],
        }
        warning = self.merge_warning()
        if warning is not None:
            out["merged"] = True
            out["warnings"] = [warning]
        return out

    @staticmethod
    def from_json(doc: dict[str, Any]) -> "ReportResult":
        """A ``ReportResult`` rebuilt from ``to_json``'s dict (e.g. ``bench``'s stored timings), for the
        renderers: the JSON's rounding stays, a stat's ``total`` is ``mean * n``, ``tokens`` is 0; documents
        without ``"runs"`` (older ones) give no runs."""

        def stats(d: dict[str, Any] | None, n: int) -> Stats | None:
            if not d:
                return None
            k = d.get("n", n)
            return Stats(n=k, mean=d["mean"], p50=d["p50"], p90=d["p90"], p99=d["p99"], max=d["max"],
                         total=(d["mean"] or 0.0) * k)

        runs = tuple(RunInfo.from_json(r) for r in doc.get("runs") or ())
        merged = bool(doc.get("merged"))
        only = runs[0].id if len(runs) == 1 else None
        groups = []
        for g in doc["groups"]:
            cyc = stats(g["cycle_ms"], g["n"])
            phases = []
            for name, p in g["phases"].items():
                host = p.get("host")
                phases.append(PhaseStats(name=name, stats=stats(p, p.get("n", g["n"])),  # type: ignore[arg-type]
                                         share=p["share"], host=stats(host, g["n"]) if host else None,
                                         host_share=host.get("share") if host else None))
            b = g.get("between_ms")
            between = (BetweenStats(n=b.get("n", 0), mean=b["mean"], p50=b["p50"], p90=b["p90"],
                                    total=(b["mean"] or 0.0) * b.get("n", 0)) if b else None)
            key = tuple(g["key"].items())
            run = None if merged else g["key"].get("run", only)
            acceptance = Acceptance.from_json(g["acceptance"]) if g.get("acceptance") else None
            groups.append(GroupStats(mode=g["mode"], key=key, n=g["n"], cycle=cyc,  # type: ignore[arg-type]
                                     phases=tuple(phases), accept_len=g["accept_len"],
                                     tokens_per_s=g["tokens_per_s"], between=between,
                                     wall_tokens_per_s=g["wall_tokens_per_s"], tokens=0.0,
                                     host_cycle=stats(g.get("host_cycle_ms"), g["n"]), run=run,
                                     acceptance=acceptance))
        return ReportResult(sources=tuple(doc.get("sources") or ()), records=doc["records"],
                            skipped_lines=doc["skipped_lines"], groups=tuple(groups), runs=runs, merged=merged)


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
        "wcyc_acc",
        "ahist",
        "accs",
        "walls",
        "run",
        "spec",
    )

    def __init__(self, mode: str, keyval: Any, run: str = "", spec: str | None = None):
        self.mode = mode
        self.keyval = keyval
        self.run = run
        self.spec = spec
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
        self.wcyc_acc = 0.0  # the host clock's cycle time of the records with accepted (cycle_ms without it)
        self.ahist: dict[int, int] = {}  # tokens a request produced in a cycle -> request-cycles ("accepts")
        # per record with accepted, in order: its tokens and its wall time (host cycle + the gap before it), for
        # the spread of tok/s over windows of the run
        self.accs = array("f")
        self.walls = array("f")


def _accept_counts(acs: Any, hist: Any) -> list[tuple[int, int]]:
    """The (tokens, request-cycles) pairs of a record's ``accepts`` list or ``accept_hist`` object, validated
    (whole numbers, at least 0; a histogram's keys are their decimal strings). Raises ``_BadLine``."""
    out: list[tuple[int, int]] = []
    if acs is not None:
        if type(acs) is not list:
            raise _BadLine("bad accepts")
        for x in acs:
            if type(x) is not int or x < 0:
                raise _BadLine("bad accepts")
            out.append((x, 1))
        return out
    if type(hist) is not dict:
        raise _BadLine("bad accept_hist")
    for k, v in hist.items():
        if not k.isdigit() or type(v) is not int or v < 0:
            raise _BadLine("bad accept_hist")
        out.append((int(k), v))
    return out


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


# The parser. msgspec decodes a line about four times faster than the standard library (benchmarks/bench_report.py
# names the one that ran). It refuses some lines that json accepts (NaN/Infinity literals, 1e400, lone
# surrogates, trailing data, blank lines) and accepts none that json refuses, with the same values where both
# accept; so a line msgspec refuses goes to the standard parser, which decides it exactly as it would alone,
# and the records and skipped lines are the same with either. EAGLEPATCH_JSON_PARSER=json forces the standard
# library (the tests run both).
try:
    import msgspec as _msgspec
except ImportError:  # pragma: no cover - msgspec is a dependency; a bare install still reports
    _msgspec = None  # type: ignore[assignment]

_FAST_ERRORS: tuple[type[BaseException], ...] = (
    (_msgspec.MsgspecError, ValueError, RecursionError) if _msgspec is not None else (ValueError,))


def parser_name() -> str:
    """The parser ``aggregate`` uses now: ``"msgspec"``, or ``"json"`` (the standard library: msgspec is not
    installed, or ``EAGLEPATCH_JSON_PARSER=json``)."""
    return "msgspec" if _fast_decode() is not None else "json"


def _fast_decode() -> Any:
    """msgspec's decode of one line to plain objects, or ``None`` where the standard library is to parse alone."""
    if _msgspec is None or os.environ.get("EAGLEPATCH_JSON_PARSER", "").strip().lower() == "json":
        return None
    return _msgspec.json.Decoder().decode


_NO = object()  # "no current process/run" sentinel; compares unequal to anything a record holds

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

# The spec keys in the order the compact string shows them; others follow by name.
_SPEC_ORDER = {"steps": 0, "topk": 1, "draft_tokens": 2}


def spec_label(spec: dict[str, Any]) -> str | None:
    """A record's ``"spec"`` as the compact key string ``"steps=3,topk=1,draft_tokens=4"`` (steps, topk,
    draft_tokens first, other keys by name); ``None`` for an empty object. Raises ``_BadLine`` for anything but
    an object of numbers, strings, booleans and nulls."""
    if type(spec) is not dict:
        raise _BadLine("spec is not an object")
    parts = []
    for k in sorted(spec, key=lambda k: (_SPEC_ORDER.get(k, 3), k)):
        v = spec[k]
        if v is None or isinstance(v, (str, bool)):
            text = "?" if v is None else str(v).lower() if isinstance(v, bool) else v
        elif _is_num(v):
            text = repr(v) if type(v) is float else str(v)
        else:
            raise _BadLine("a spec value is not a scalar")
        parts.append(f"{k}={text}")
    return ",".join(parts) or None


class _Run:
    """What the scan learns of one run (mutable; never leaves this module)."""

    __slots__ = ("id", "start", "timers", "header_timers", "flags", "headers", "skipped", "traced", "runtime",
                 "files")

    def __init__(self, rid: str, traced: bool):
        self.runtime: str | None = None
        self.files: set[int] = set()  # indexes of the files its lines came from
        self.id = rid
        self.start = math.inf
        self.timers: set[str] = set()  # named by records
        self.header_timers: set[str] = set()
        self.flags: dict[str, Any] = {}
        self.headers = 0
        self.skipped = 0  # valid records that ``skip`` dropped
        self.traced = traced

    def timer(self) -> str | None:
        names = self.header_timers | self.timers
        if self.timers:
            names.discard("auto")
        return "+".join(sorted(names)) or None


def _header(line: str) -> dict[str, Any] | None:
    """The run header of this line (``{"v": 1, "kind": "run", "run": ID, ...}``), else ``None``."""
    if '"kind"' not in line:
        return None
    try:
        h = json.loads(line, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        return None
    if type(h) is not dict or h.get("kind") != "run" or h.get("v") != 1:
        return None
    rid = h.get("run")
    if type(rid) is not str or not rid:
        return None
    return h


class _ScanOut:
    """The scan's findings: accumulators per (run id, spec), runs by id, records, bad lines."""

    __slots__ = ("ctxs", "runs", "records", "bad")

    def __init__(self) -> None:
        self.ctxs: dict[tuple[str, str | None], dict[Any, _Acc]] = {}
        self.runs: dict[str, _Run] = {}
        self.records = 0
        self.bad = 0


def _file_run_ids(files: Sequence[str]) -> list[str]:
    """The synthetic run id of each file, for its records without ``"run"``: ``"file:<basename>"``, or
    ``"file:<path>"`` where another file given has the same basename."""
    names = Counter(os.path.basename(p) for p in files)
    return [f"file:{os.path.basename(p)}" if names[os.path.basename(p)] == 1 else f"file:{p}" for p in files]


def _scan(
    files: Sequence[str],
    by: str | None,
    skip: int,
    idle_gap_s: float,
    tracer: Any,
    t_min: float | None = None,
    t_max: float | None = None,
    trace_runs: Any = None,
) -> _ScanOut:
    """The hot loop. Returns the accumulators per (run, spec) and group key, the runs, the valid records and
    the bad lines. ``trace_runs``: the run ids whose records go to ``tracer`` (``None``: all).

    Speed matters here (CONTRACT-sized logs have millions of lines): the C scanner's ``scan_once`` is called
    directly, the current process's, run's and group's running state live in local variables and are
    written back only when the process, the run (or spec) or the group changes, and a record is validated
    before anything is mutated (the phase appends, the one step that can fail half-way, are rolled back by the
    slow path). A record costs two dict look-ups for its run (``"run"``, ``"spec"``) and one comparison of each
    with the previous record's.
    """
    scan = json.JSONDecoder(parse_constant=_reject_constant).scan_once
    fast = _fast_decode()
    fast_errors = _FAST_ERRORS
    bycode = 0 if by is None else 1 + BY_CHOICES.index(by)
    out = _ScanOut()
    ctxs = out.ctxs
    runs = out.runs
    spec_cache: dict[Any, str | None] = {}
    groups: dict[Any, _Acc] = {}
    procs: dict[tuple[Any, Any, Any], tuple[int, float, float]] = {}
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
    carry = 0.0  # wall time (ms) of the process's cycles without accepted (prefill) since its last one with
    bad_errors = _BAD_ERRORS
    slow = _append_phases_slow
    cur_gk: Any = _NO
    g: Any = None
    pm: Any = None
    cyc_app: Any = None
    btw_app: Any = None
    s_acc = s_acc_ab = s_bs_ab = 0
    s_cyc_acc = s_btw_acc = 0.0
    # The current run: the record's raw "run" and "spec" values (compared with the next record's), its _Run
    # and its id and spec string (for new groups).
    c_rraw: Any = _NO
    c_sraw: Any = _NO
    R: Any = None
    c_rid = ""
    c_spec: str | None = None
    # The time window: records whose ``t`` lies outside it are passed over as if absent (only their JSON and
    # their ``t`` are read), so ``skip``, ``between`` and ``records`` see the window alone.
    windowed = t_min is not None or t_max is not None
    lo = -math.inf if t_min is None else float(t_min)
    hi = math.inf if t_max is None else float(t_max)

    def new_run(rid: str) -> _Run:
        r = runs[rid] = _Run(rid, trace_runs is None or rid in trace_runs)
        return r

    def add_header(h: dict[str, Any]) -> None:
        rid = h["run"]
        r = runs.get(rid) or new_run(rid)
        r.headers += 1
        t = h.get("t")
        if _is_num(t) and t < r.start:
            r.start = float(t)
        timer = h.get("timer")
        if type(timer) is str and timer:
            r.header_timers.add(timer)
        flags = h.get("flags")
        if type(flags) is dict:
            for k, v in flags.items():
                r.flags.setdefault(str(k), v)
        runtime = h.get("runtime")
        if type(runtime) is str and runtime and r.runtime is None:
            r.runtime = runtime
        r.files.add(file_index)

    file_index = 0
    for file_index, (path, file_run) in enumerate(zip(files, _file_run_ids(files))):
        try:
            f = open(path, encoding="utf-8", errors="replace")
        except OSError as exc:
            raise UsageError(f"cannot read {path}: {exc.strerror}; check the path and its permissions") from None
        c_rraw = _NO  # a record without "run" belongs to this file's run: look again
        with f:
            for line in f:
                try:
                    d = _NO
                    if fast is not None:
                        try:
                            d = fast(line)
                        except fast_errors:
                            d = _NO  # refused: the standard parser decides, as it would alone
                    if d is _NO:
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
                        if "kind" in d:
                            raise _BadLine("a header, or no record")  # the handler below reads headers
                        continue
                    cyc = d["cycle_ms"]  # KeyError on a run header line: read by the handler below
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
                    acs = d.get("accepts")
                    ahs = d.get("accept_hist") if acs is None else None
                    rraw = d.get("run")
                    sraw = d.get("spec")

                    if host != c_host or pid != c_pid or rank != c_rank:
                        if type(host) is not str or type(pid) is not int or type(rank) is not int:
                            raise _BadLine("bad process fields")
                        if c_host is not _NO:
                            procs[(c_host, c_pid, c_rank)] = (cnt, last_end, carry)
                        c_host = host
                        c_pid = pid
                        c_rank = rank
                        cnt, last_end, carry = procs.get((host, pid, rank), (0, ninf, 0.0))
                        c_rraw = _NO  # a run's start is looked for where the process changes, too

                    # Validates t and the durations (TypeError on non-numbers) before anything is mutated.
                    if hcyc is None:
                        e = t + cyc * 0.001
                    else:
                        e = t + hcyc * 0.001 + cyc * 0.0

                    if rraw != c_rraw or sraw != c_sraw:
                        # Another run or spec (or file, or process): validate them, find their groups. This
                        # record's t and timer count for the run's start and timer (see the module docstring).
                        if rraw is None:
                            rid = file_run
                        elif type(rraw) is str and rraw:
                            rid = rraw
                        else:
                            raise _BadLine("bad run")
                        if sraw is None:
                            spec = None
                        else:
                            try:
                                skey: Any = tuple(sraw.items())
                                spec = spec_cache[skey]
                            except (KeyError, TypeError, AttributeError):
                                spec = spec_label(sraw)
                                skey = tuple(sraw.items())
                                if len(spec_cache) < 4096:
                                    spec_cache[skey] = spec
                        R = runs.get(rid) or new_run(rid)
                        R.files.add(file_index)
                        if t < R.start:
                            R.start = float(t)
                        timer = d.get("timer")
                        if type(timer) is str and timer:
                            R.timers.add(timer)
                        ctx = ctxs.get((rid, spec))
                        if ctx is None:
                            ctx = ctxs[(rid, spec)] = {}
                        groups = ctx
                        c_rid = rid
                        c_spec = spec
                        c_rraw = rraw
                        c_sraw = sraw
                        cur_gk = _NO

                    if cnt < skip:
                        _check_skipped(d)
                        if type(mode) is not str:
                            raise _BadLine("bad mode")
                        cnt += 1
                        last_end = e
                        records += 1
                        R.skipped += 1
                        if tracer is not None and R.traced:
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
                            ng = groups[gk] = _Acc(mode, kv, c_rid, c_spec)
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
                    wc = cyc if hcyc is None else hcyc
                    if acs is not None or ahs is not None:
                        pairs = _accept_counts(acs, ahs)

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
                    else:
                        gap = -1.0
                    if acc is not None:
                        s_acc = x_acc
                        s_cyc_acc += cyc
                        # the wall time a client waits for these tokens: this cycle (host clock), the gap before
                        # it, and the prefill cycles (and their gaps) since the process's last counted cycle
                        wc += carry
                        carry = 0.0
                        g.wcyc_acc += wc
                        if gap >= 0.0:
                            s_btw_acc += gap
                            wc += gap
                        g.accs.append(acc)
                        g.walls.append(wc)
                        if bs is not None:
                            s_acc_ab = x_accab
                            s_bs_ab = x_bsab
                    elif gap >= 0.0:
                        carry += wc + gap
                    else:
                        carry = wc  # after an idle gap only this cycle itself
                    if acs is not None or ahs is not None:
                        ah = g.ahist
                        for k, v in pairs:
                            ah[k] = ah.get(k, 0) + v
                    cnt += 1
                    last_end = e
                    records += 1
                    if tracer is not None and R.traced:
                        tracer.add(d, host, pid, rank, mode, t, False)
                except bad_errors:
                    h = _header(line)
                    if h is None:
                        bad += 1
                    else:
                        add_header(h)
    if g is not None:
        g.acc = s_acc
        g.acc_ab = s_acc_ab
        g.bs_ab = s_bs_ab
        g.cyc_acc = s_cyc_acc
        g.btw_acc = s_btw_acc
    out.records = records
    out.bad = bad
    return out


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


def _finish_group(g: _Acc, key: tuple[tuple[str, Any], ...], run: str | None) -> GroupStats:
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
    # What a client sees follows the cadence of cycle starts on the host: each cycle's host-clock time plus the gap
    # before it. Under the overlap scheduler the GPU's cycle (cycle_ms of the events timer) overlaps the
    # scheduler's work between cycles, so cycle_ms + between would count that time twice.
    wall_den = g.wcyc_acc + g.btw_acc
    wall = g.acc / wall_den * 1000.0 if g.cyc_acc > 0 and wall_den > 0 else None
    n_acc = len(g.walls)
    cadence = wall_den / n_acc if n_acc and wall_den > 0 else None
    windows = _window_rates(g.accs, g.walls)
    g.accs = array("f")
    g.walls = array("f")
    hist = tuple(sorted(g.ahist.items()))
    acceptance = Acceptance(samples=sum(n for _t, n in hist), hist=hist) if hist else None
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
        run=run,
        acceptance=acceptance,
        cadence_ms=cadence,
        accepted_cycles=n_acc,
        window_tokens_per_s=windows,
        spec=g.spec,
    )


_WINDOWS = 10  # windows of a group's records for the spread of its tok/s
_WINDOW_MIN = 50  # records a window holds at least


def _window_rates(accs: array, walls: array) -> tuple[float, ...]:
    """Wall tok/s of up to ``_WINDOWS`` successive, equal windows of the records (tokens over their wall time), at
    least ``_WINDOW_MIN`` records each; ``()`` when there are too few records for two windows."""
    n = len(accs)
    w = min(_WINDOWS, n // _WINDOW_MIN)
    if w < 2:
        return ()
    out = []
    for i in range(w):
        lo, hi = i * n // w, (i + 1) * n // w
        den = math.fsum(walls[lo:hi])
        if den > 0:
            out.append(math.fsum(accs[lo:hi]) / den * 1000.0)
    return tuple(out)


def _merge_into(a: _Acc, b: _Acc) -> None:
    """Append ``b``'s series to ``a``'s and add its sums (``merge_runs``); ``b`` is left empty."""
    a.cyc.extend(b.cyc)
    a.btw.extend(b.btw)
    a.hcyc.extend(b.hcyc)
    for mine, theirs in ((a.ph, b.ph), (a.hph, b.hph)):
        for name, app in theirs.items():
            have = mine.get(name)
            if have is None:
                mine[name] = app
            else:
                have.__self__.extend(app.__self__)
        theirs.clear()
    b.cyc = array("d")
    b.btw = array("d")
    b.hcyc = array("d")
    a.acc += b.acc
    a.cyc_acc += b.cyc_acc
    a.btw_acc += b.btw_acc
    a.acc_ab += b.acc_ab
    a.bs_ab += b.bs_ab
    a.wcyc_acc += b.wcyc_acc
    for t, n in b.ahist.items():
        a.ahist[t] = a.ahist.get(t, 0) + n
    b.ahist.clear()
    a.accs.extend(b.accs)
    a.walls.extend(b.walls)
    b.accs = array("f")
    b.walls = array("f")


def launch_of(run_id: str) -> tuple[int, int] | None:
    """(launcher pid, its start in clock ticks) of a run id the runtime wrote (``<host>-<pid>-<ticks>-<8 hex>``),
    else None (``file:...`` ids of older logs, or ids of another shape)."""
    parts = run_id.rsplit("-", 3)
    if len(parts) != 4 or not parts[1].isdigit() or not parts[2].isdigit() or len(parts[3]) != 8:
        return None
    try:
        int(parts[3], 16)
    except ValueError:
        return None
    return int(parts[1]), int(parts[2])


def _resolve_run_ids(wanted: Sequence[str], known: Sequence[RunInfo]) -> set[str]:
    """The ids that ``wanted`` names: each an id or an unambiguous prefix of one. Raises ``UsageError`` naming
    the runs that exist (or those that the prefix fits) otherwise."""
    ids = [r.id for r in known]
    listing = "; ".join(r.short() for r in known) or "none"
    out: set[str] = set()
    for w in wanted:
        if not isinstance(w, str) or not w:
            raise UsageError(f"a run id must be a non-empty string, not {w!r}; runs in these logs: {listing}")
        if w in ids:
            out.add(w)
            continue
        fits = [r for r in known if r.id.startswith(w)]
        if len(fits) == 1:
            out.add(fits[0].id)
        elif not fits:
            raise UsageError(f"no run {w!r} in these logs; runs: {listing}")
        else:
            raise UsageError(f"run id {w!r} is ambiguous: it begins {len(fits)} runs: "
                             + "; ".join(r.short() for r in fits) + "; give more of the id")
    return out


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
    merge_runs: bool = False,
    run_ids: Sequence[str] | None = None,
    since: float | None = None,
    latest: bool = False,
    launches: Collection[tuple[int, int]] | None = None,
    install: str | None = None,
    origins: Sequence[str] | None = None,
) -> ReportResult:
    """Read the timing logs ``files`` (local paths, read in the given order) and return their statistics.

    ``by``: ``None`` (one group per mode and run), ``"bs"``, ``"rank"`` or ``"host"`` (groups per mode, run and
    that value).
    ``skip``: drop the first ``skip`` valid cycles of every process (host, pid, rank), counted across files.
    ``trace_path``: also write a Chrome trace-event JSON file there (see ``eaglepatch.report.trace``); it holds
    every valid record of the selected runs, the skipped ones too (marked ``"skipped": true`` in their args).
    ``idle_gap_s``: gaps between cycles longer than this count as idle and are left out of ``between_ms``.
    ``sources``: what the result's ``sources`` lists (default: ``files``), e.g. the SOURCE arguments as given.
    ``t_min``/``t_max``: a time window (wall clock, seconds, inclusive): only records whose ``t`` (the cycle's
    start) lies in it count; the others are passed over as if absent (not in ``records``, not counted by
    ``skip``, no ``between`` gap to or from them). ``None``: no bound on that side.

    Runs (see the module docstring) are never merged unless ``merge_runs``: the groups are per run, and with
    more than one run selected each group's key holds ``"run"``. Selection, applied in this order:
    ``run_ids`` (only these runs; an unambiguous prefix of an id is enough), ``since`` (only runs whose start is
    at or after this epoch time), ``launches`` (only the runs of these server launches, ``(launcher pid, start
    ticks)``, and runs of logs without run ids), ``install`` (leave out the runs whose header names a runtime
    outside this sglang package folder: another install's; runs whose headers name none stay), ``latest`` (only
    the newest of what is left, by start). ``origins``: a label per file (the SOURCE it came from), for each
    run's ``sources`` (a report of several SOURCEs says whose each run is).
    ``merge_runs``: the selected runs' records together, as one run (the result's ``merged`` is true when that put
    several runs together, and the renderers warn).

    Statistics (per group): cycle and phase stats (a phase's over the cycles in which it ran), each phase's
    ``share`` = its total time / the group's total cycle time, ``accept_len`` = sum(accepted) / sum(bs) over
    records with both, ``tokens_per_s`` = sum(accepted) / sum(cycle_ms) * 1000 over records with ``accepted``,
    ``between_ms`` and ``wall_tokens_per_s`` = the same tokens / their wall time * 1000 (the host clock's time
    from one cycle's start to the next: their cycles, the gaps before them and the prefill cycles between them).
    See the module docstring for the assumptions.

    Returns a ``ReportResult``; ``records`` counts all valid records of the selected runs, those dropped by
    ``skip`` included. Raises ``UsageError`` for a bad ``by``/``skip``/``idle_gap_s``/``since``, a run id that
    names no run (or several), a file that cannot be opened, or a trace file that cannot be written. Lines that
    do not parse are counted, never raised.
    """
    if by is not None and by not in BY_CHOICES:
        raise UsageError(f"--by must be one of {', '.join(BY_CHOICES)}, not {by!r}")
    if not isinstance(skip, int) or skip < 0:
        raise UsageError(f"--skip must be a whole number >= 0, not {skip!r}")
    if not idle_gap_s > 0:
        raise UsageError(f"the idle gap must be a positive number of seconds, not {idle_gap_s!r}")
    if t_min is not None and t_max is not None and t_min > t_max:
        raise UsageError(f"the time window is empty: t_min {t_min!r} is after t_max {t_max!r}")
    if since is not None and (not _is_num(since) or not math.isfinite(float(since))):
        raise UsageError(f"since must be a time (seconds since the epoch), not {since!r}")
    if isinstance(run_ids, str):
        run_ids = [run_ids]
    files = list(files)
    windowed = t_min is not None or t_max is not None
    selecting = bool(run_ids) or since is not None or latest

    def scan(trace_runs: Any) -> _ScanOut:
        tracer = None
        if trace_path is not None:
            from eaglepatch.report.trace import TraceWriter

            tracer = TraceWriter(trace_path)
        try:
            return _scan(files, by, skip, idle_gap_s, tracer, t_min, t_max, trace_runs)
        finally:
            if tracer is not None:
                tracer.close()

    # With a trace, the first pass writes every run's records; should the selection leave a run out, a second
    # pass writes the trace again with the selected runs alone (its numbers are the same as the first's).
    out = scan(None)

    # The runs: records per run (kept + dropped by skip), known runs, oldest first.
    counts: Counter[str] = Counter()
    for (rid, _spec), ctx in out.ctxs.items():
        for a in ctx.values():
            counts[rid] += len(a.cyc)
    infos: list[RunInfo] = []
    for rid, r in out.runs.items():
        n = counts[rid] + r.skipped
        if n == 0 and (windowed or not r.headers):
            continue  # only rejected records, or (in a window) a header alone
        labels = tuple(dict.fromkeys(origins[i] for i in sorted(r.files))) if origins is not None else ()
        infos.append(RunInfo(id=rid, start=r.start if math.isfinite(r.start) else None, timer=r.timer(),
                             flags=tuple(r.flags.items()), records=n, runtime=r.runtime, sources=labels))
    infos.sort(key=lambda r: (r.start is not None, r.start or 0.0, r.id))

    chosen = infos
    if run_ids:
        ids = _resolve_run_ids(list(run_ids), infos)
        chosen = [r for r in chosen if r.id in ids]
    if since is not None:
        chosen = [r for r in chosen if r.start is not None and r.start >= since]
    if launches is not None:
        # The runs of these server launches (launcher pid, its start in clock ticks: the middle of the runtime's
        # run ids), and runs whose ids say no launch (logs of an older runtime, read by file); never another
        # launch's run in the same file (a pid used again, in a container or after a reboot).
        want = set(launches)
        chosen = [r for r in chosen if launch_of(r.id) in want or launch_of(r.id) is None]
    if install is not None:
        # another install's runs are not this one's, whatever their time (a shared /tmp/eaglepatch)
        inside = install.rstrip("/") + "/"
        chosen = [r for r in chosen if r.runtime is None or r.runtime.startswith(inside)]
    if latest and chosen:
        # the newest, even one that has written only its header (a launch that timed nothing yet): never an
        # earlier launch's numbers in its place
        chosen = chosen[-1:]
    chosen_ids = {r.id for r in chosen}
    others = tuple(r for r in infos if r.id not in chosen_ids)

    if trace_path is not None and selecting and others:
        out = scan(chosen_ids)

    # Group the accumulators: per run (or all runs together when merged), mode and by-value; the spec splits a
    # group only where it varies in it.
    merged = merge_runs and len(chosen) > 1
    multi = len(chosen) > 1 and not merged
    order = {r.id: i for i, r in enumerate(chosen)}
    base: dict[tuple[Any, ...], dict[str | None, _Acc]] = {}
    for (rid, spec), ctx in out.ctxs.items():
        if rid not in chosen_ids:
            continue
        for a in ctx.values():
            if not len(a.cyc):
                continue  # a group whose only records were rejected after it was created
            bkey = (None if merged else rid, a.mode, a.keyval)
            specs = base.setdefault(bkey, {})
            have = specs.get(spec)
            if have is None:
                specs[spec] = a
            else:
                _merge_into(have, a)
    out.ctxs.clear()

    def sort_key(item: tuple[tuple[Any, ...], str | None, _Acc]) -> Any:
        (rid, mode, kv), spec, _a = item
        return (order.get(rid, 0), mode_sort_value(mode), key_sort_value(kv), spec is None, spec or "")

    flat = [(bkey, spec, a) for bkey, specs in base.items() for spec, a in specs.items()]
    varying = {bkey for bkey, specs in base.items() if len(specs) > 1}
    flat.sort(key=sort_key)
    base.clear()
    groups = []
    for bkey, spec, a in flat:
        rid = bkey[0]
        key: list[tuple[str, Any]] = [] if by is None else [(by, bkey[2])]
        if bkey in varying:
            key.append(("spec", spec))
        if multi:
            key.append(("run", rid))
        groups.append(_finish_group(a, tuple(key), rid if not merged else None))
    del flat
    return ReportResult(
        sources=tuple(files if sources is None else sources),
        records=sum(r.records for r in chosen),
        skipped_lines=out.bad,
        groups=tuple(groups),
        by=by,
        skip=skip,
        runs=tuple(chosen),
        merged=merged,
        other_runs=others,
    )

