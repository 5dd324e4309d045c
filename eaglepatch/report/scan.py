"""The scan: every line of every timing log read once, each record validated and added to its group's
accumulator (``Acc``), the runs learnt from their header lines and records. The hot loop of ``report``.

Each line is decoded by msgspec when it is installed, else (or for the lines msgspec refuses) by the standard
library's scanner; ``parser_name`` says which. What a valid record is: ``eaglepatch.report.record``.

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

Runs (docs/contract.md "The timing log"), as the scan learns them:

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
* The accumulators are per run, per ``"spec"`` (a record's speculative settings under adaptive speculation, as
  the compact string ``"steps=3,topk=1,draft_tokens=4"``), per mode and per ``by`` value; ``aggregate`` groups
  them.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from typing import Any, Sequence

from eaglepatch.errors import UsageError
from eaglepatch.report.groups import Acc
from eaglepatch.report.model import BY_CHOICES
from eaglepatch.report.record import (
    BadLine,
    append_phases_slow,
    check_skipped,
    hist_counts,
    is_num,
    pop_phases,
    reject_constant,
    spec_label,
)


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
    ValueError,  # includes json.JSONDecodeError and BadLine
    KeyError,
    TypeError,
    AttributeError,
    StopIteration,  # the C scanner's "nothing parses at this index"
    OverflowError,
    IndexError,
    RecursionError,
)


class _Run:
    """What the scan learns of one run (mutable; read by ``aggregate``, never leaves the report package)."""

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
        h = json.loads(line, parse_constant=reject_constant)
    except (ValueError, RecursionError):
        return None
    if type(h) is not dict or h.get("kind") != "run" or h.get("v") != 1:
        return None
    rid = h.get("run")
    if type(rid) is not str or not rid:
        return None
    return h


class ScanOut:
    """The scan's findings: accumulators per (run id, spec), runs by id, records, bad lines."""

    __slots__ = ("ctxs", "runs", "records", "bad")

    def __init__(self) -> None:
        self.ctxs: dict[tuple[str, str | None], dict[Any, Acc]] = {}
        self.runs: dict[str, _Run] = {}
        self.records = 0
        self.bad = 0


def _file_run_ids(files: Sequence[str]) -> list[str]:
    """The synthetic run id of each file, for its records without ``"run"``: ``"file:<basename>"``, or
    ``"file:<path>"`` where another file given has the same basename."""
    names = Counter(os.path.basename(p) for p in files)
    return [f"file:{os.path.basename(p)}" if names[os.path.basename(p)] == 1 else f"file:{p}" for p in files]


def scan_files(
    files: Sequence[str],
    by: str | None,
    skip: int,
    idle_gap_s: float,
    tracer: Any,
    t_min: float | None = None,
    t_max: float | None = None,
    trace_runs: Any = None,
) -> ScanOut:
    """The hot loop. Returns the accumulators per (run, spec) and group key, the runs, the valid records and
    the bad lines. ``trace_runs``: the run ids whose records go to ``tracer`` (``None``: all).

    Speed matters here (CONTRACT-sized logs have millions of lines): the C scanner's ``scan_once`` is called
    directly, the current process's, run's and group's running state live in local variables and are
    written back only when the process, the run (or spec) or the group changes, and a record is validated
    before anything is mutated (the phase appends, the one step that can fail half-way, are rolled back by the
    slow path). A record costs two dict look-ups for its run (``"run"``, ``"spec"``) and one comparison of each
    with the previous record's.
    """
    scan = json.JSONDecoder(parse_constant=reject_constant).scan_once
    fast = _fast_decode()
    fast_errors = _FAST_ERRORS
    bycode = 0 if by is None else 1 + BY_CHOICES.index(by)
    out = ScanOut()
    ctxs = out.ctxs
    runs = out.runs
    spec_cache: dict[Any, str | None] = {}
    groups: dict[Any, Acc] = {}
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
    slow = append_phases_slow
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
        if is_num(t) and t < r.start:
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
                            raise BadLine("trailing data")
                    if d["v"] != 1:
                        raise BadLine("unknown version")
                    t = d["t"]
                    if windowed and not lo <= t <= hi:  # TypeError on a non-number: a bad line
                        if not is_num(t):
                            raise BadLine("bad t")
                        if "kind" in d:
                            raise BadLine("a header, or no record")  # the handler below reads headers
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
                            raise BadLine("bad process fields")
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
                            raise BadLine("bad run")
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
                        check_skipped(d)
                        if type(mode) is not str:
                            raise BadLine("bad mode")
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
                                raise BadLine("bad mode") from None
                            kv = None if bycode == 0 else gk[1]
                            if bycode == 1 and kv is not None and not is_num(kv):
                                raise BadLine("bad bs") from None
                            ng = groups[gk] = Acc(mode, kv, c_rid, c_spec)
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
                    if acs is not None:
                        # the common case, validated here without a call: a list of whole numbers, at least 0
                        if type(acs) is not list:
                            raise BadLine("bad accepts")
                        for x in acs:
                            if type(x) is not int or x < 0:
                                raise BadLine("bad accepts")
                    elif ahs is not None:
                        pairs = hist_counts(ahs)

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
                            except BadLine:
                                pop_phases(pm, phases)
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
                    if acs is not None:
                        ah = g.ahist
                        for x in acs:
                            ah[x] = ah.get(x, 0) + 1
                    elif ahs is not None:
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
