"""The scan: every line of every timing log read once, each record validated and added to its group's
accumulator (``Acc``), the runs learnt from their header lines and records. The hot loop of ``report``.

Two readers share the scan's state (``Scan``): the batch path (``eaglepatch.report.batch``: a file read in pieces,
each decoded at once by msgspec into typed records, added a column at a time) and the line loop
(``eaglepatch.report.lines``: a line at a time, decoded by msgspec, or by the standard library's scanner where
msgspec refuses the line). The batch path leaves to the line loop every line it cannot vouch for, and a file read
either way gives the same records, groups, skipped lines and runs. Without msgspec, with
``EAGLEPATCH_JSON_PARSER=json`` or with a trace, the line loop reads everything (with the standard library alone
in the first two cases); ``parser_name`` says which parser ran. What a valid record is:
``eaglepatch.report.record``.

Assumptions, stated once:

* The records of one process (host, pid, rank) come in ``t`` order within a file, and when one process spans
  several files, the files are given in time order (``iter_log_files`` sorts names). ``t`` is the cycle's start
  (wall clock, seconds).
* The ranks of one data-parallel group (a record's ``"dp"``; records without one are one group) are the tensor-
  parallel ranks of one batch, and record the same cycles; ranks of different DP groups serve different requests.
  The scan keeps one accumulator per DP group (its ``"dp"`` last in the group key) and one acceptance histogram per
  rank; ``eaglepatch.report.groups`` reads the histogram from one rank and adds the DP groups' tok/s. ``"dp"`` and
  ``"node"`` (the node rank) are read with the process's fields: a change of either is a change of process.
* ``between_ms`` is attributed to the group of the cycle that *follows* the gap (the scheduler's work that led to
  that cycle). A gap longer than ``idle_gap_s`` counts as idle and is left out; a small negative gap (clock
  jitter) counts as 0; a gap more negative than ``-idle_gap_s`` (records out of order) is left out.
* The cycle's duration for ``between`` is ``host_cycle_ms`` when the record has it (``events`` timer, host
  clock), else ``cycle_ms``.
* What a client sees follows the cadence of cycle starts on the host: a record with ``accepted`` is charged its
  own duration (as for ``between``), the gap before it, and the durations and gaps of the process's records
  without ``accepted`` (prefill cycles) since its previous one; ``wall_tokens_per_s`` is the accepted tokens over
  that time, ``cadence_ms`` that time per such record.
* A record with ``"every": N`` (apply --every N) stands for N cycles: itself and the N - 1 untimed ones after it.
  The gap before it then holds N - 1 untimed cycles and N betweens; each series and sum above takes this record's
  share per cycle (``lines.per_cycle``: wall (gap + its cycle) / N, between that less the process's recent mean
  cycle; idle where gap / N is over ``idle_gap_s``), so its tokens over its per-cycle wall time give what the
  cycles it stands for gave. The line loop alone reads such records.

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

import io
import math
import os
import sys
from collections import Counter
from typing import Any, Iterable, Sequence

from eaglepatch.collector import few_collections
from eaglepatch.errors import UsageError
from eaglepatch.report.batch import Batches
from eaglepatch.report.files import open_log, skip_note
from eaglepatch.report.groups import Acc
from eaglepatch.report.lines import NO, read_lines
from eaglepatch.report.model import BY_CHOICES
from eaglepatch.report.reader import text_lines
from eaglepatch.report.record import MAX_T, BadLine, accept_cap, is_num, spec_label


# The parser. msgspec decodes a line about four times faster than the standard library, and typed records in
# batches faster still (benchmarks/bench_report.py names the parser that ran). It refuses some lines that json
# accepts (NaN/Infinity literals, 1e400, lone surrogates, trailing data, blank lines) and accepts none that json
# refuses, with the same values where both accept; so a line msgspec refuses goes to the standard parser, which
# decides it exactly as it would alone, and the records and skipped lines are the same with either.
# EAGLEPATCH_JSON_PARSER=json forces the standard library (the tests run both).
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


class _Run:
    """What the scan learns of one run (mutable; read by ``aggregate``, never leaves the report package)."""

    __slots__ = ("id", "start", "timers", "header_timers", "flags", "headers", "skipped", "skipped_cycles", "traced",
                 "runtime", "files")

    def __init__(self, rid: str, traced: bool):
        self.runtime: str | None = None
        # small tuples, not sets (a log of many short launches holds tens of thousands of runs)
        self.files: tuple[int, ...] = ()  # indexes of the files its lines came from
        self.id = rid
        self.start = math.inf
        self.timers: tuple[str, ...] = ()  # named by records
        self.header_timers: tuple[str, ...] = ()
        self.flags: dict[str, Any] = {}
        self.headers = 0
        self.skipped = 0  # valid records that ``skip`` dropped
        self.skipped_cycles = 0  # the cycles they stand for ("every": N)
        self.traced = traced

    def timer(self) -> str | None:
        names = set(self.header_timers) | set(self.timers)
        if self.timers:
            names.discard("auto")
        return "+".join(sorted(names)) or None


class ScanOut:
    """The scan's findings: accumulators per (run id, spec), runs by id, records, bad lines, and the notes on the
    files it did not read (no regular file: ``eaglepatch.report.files.open_log``)."""

    __slots__ = ("ctxs", "runs", "records", "bad", "notes", "drops", "only", "scratch")

    def __init__(self, only: Any = None) -> None:
        self.ctxs: dict[tuple[str, str | None], dict[Any, Acc]] = {}
        # ``only``: the run ids whose groups are kept (None: all); the records of the others go to ``scratch``, one
        # set of groups for them all (their runs, skip and records counted as ever; their groups not kept apart)
        self.only = only
        self.scratch: dict[Any, Acc] = {}
        self.runs: dict[str, _Run] = {}
        self.records = 0
        self.bad = 0
        self.notes: list[str] = []
        # the runtime's drops lines ({"kind": "drops"}: running totals) per (host, pid, rank): the largest seen
        self.drops: dict[tuple[Any, Any, Any], tuple[int, dict[str, int]]] = {}

    def add_drops(self, d: dict[str, Any]) -> None:
        key = (d.get("host"), d["pid"], d["rank"])
        if key not in self.drops or d["dropped"] > self.drops[key][0]:
            why = {str(k)[:32]: v for k, v in d["reasons"].items() if type(v) is int and 0 <= v <= 10**12}
            self.drops[key] = (d["dropped"], why)

    def drops_note(self) -> str | None:
        """What the runtime dropped over the logs read, said once (None when nothing was)."""
        total = sum(n for n, _ in self.drops.values())
        if not total:
            return None
        reasons: dict[str, int] = {}
        for _, why in self.drops.values():
            for k, v in why.items():
                reasons[k] = reasons.get(k, 0) + v
        parts = ", ".join(f"{k} {v}" for k, v in sorted(reasons.items()) if v)
        return (f"note: the runtime dropped {total} record(s) it could not write ({parts}): the figures above lack "
                "them (apply --max-log-mb and --min-free-mb bound the logs; docs/contract.md, \"Bounds inside the "
                "server\")")


def _file_run_ids(files: Sequence[str]) -> list[str]:
    """The synthetic run id of each file, for its records without ``"run"``: ``"file:<basename>"``, or
    ``"file:<path>"`` where another file given has the same basename."""
    names = Counter(os.path.basename(p) for p in files)
    return [f"file:{os.path.basename(p)}" if names[os.path.basename(p)] == 1 else f"file:{p}" for p in files]


class Scan:
    """The scan's running state, shared by the line-by-line loop (``lines``) and the batch path
    (``eaglepatch.report.batch``): the current process (host, pid, rank) with its count, last cycle end and carry,
    the current run (the raw ``"run"`` and ``"spec"`` values, its ``_Run``, id, spec string and groups), and the
    current group. Whoever reads records writes this state back before the other goes on, so that a file read
    partly in batches and partly line by line gives what a line-by-line read gives."""

    def __init__(self, by: str | None, skip: int, idle_gap_s: float, tracer: Any, t_min: float | None,
                 t_max: float | None, trace_runs: Any, fast: Any, only_runs: Any = None):
        self.out = ScanOut(only_runs)
        self.ctxs = self.out.ctxs
        self.runs = self.out.runs
        self.by = by
        self.bycode = 0 if by is None else 1 + BY_CHOICES.index(by)
        self.skip = skip
        self.idle = float(idle_gap_s)
        self.tracer = tracer
        self.trace_runs = trace_runs
        # The time window: records whose ``t`` lies outside it are passed over as if absent (only their JSON and
        # their ``t`` are read), so ``skip``, ``between`` and ``records`` see the window alone.
        self.windowed = t_min is not None or t_max is not None
        self.lo = -math.inf if t_min is None else float(t_min)
        self.hi = math.inf if t_max is None else float(t_max)
        self.fast = fast  # msgspec's decode of one line, or None
        self.fast_errors = _FAST_ERRORS
        self.spec_cache: dict[Any, str | None] = {}
        self.procs: dict[tuple[Any, Any, Any], tuple[int, float, float]] = {}
        # per process whose records stand for several cycles ("every"): (records seen, up to lines._EVERY_MEAN; the
        # moving mean of their cycle times), read by the line loop alone (the batch path leaves such records to it)
        self.every_u: dict[tuple[Any, Any, Any], tuple[int, float]] = {}
        self.records = 0
        self.bad = 0
        self.file_index = 0
        self.file_run = ""
        # the current process
        self.c_host: Any = NO
        self.c_pid: Any = NO
        self.c_rank: Any = NO
        self.c_dp: Any = NO  # its records' "dp" and "node" (None where they have none)
        self.c_node: Any = NO
        self.cnt = 0
        self.last_end = -math.inf
        self.carry = 0.0  # wall time (ms) of the process's cycles without accepted (prefill) since its last one with
        # the current run: the record's raw "run" and "spec" values (compared with the next record's), its _Run and
        # its id and spec string (for new groups), its groups
        self.c_rraw: Any = NO
        self.c_sraw: Any = NO
        self.c_acap = accept_cap(None)  # the most tokens a request of the current spec produces (record.accept_cap)
        self.R: Any = None
        self.c_rid = ""
        self.c_spec: str | None = None
        self.groups: dict[Any, Acc] = {}
        # the current group (its running sums live in ``lines``' locals and are written back to it)
        self.cur_gk: Any = NO
        self.g: Any = None

    def new_run(self, rid: str) -> _Run:
        r = self.runs[rid] = _Run(rid, self.trace_runs is None or rid in self.trace_runs)
        return r

    def add_header(self, h: dict[str, Any]) -> None:
        rid = h["run"]
        r = self.runs.get(rid) or self.new_run(rid)
        r.headers += 1
        t = h.get("t")
        if is_num(t) and 0 <= t <= MAX_T and t < r.start:
            r.start = float(t)
        timer = h.get("timer")
        if type(timer) is str and timer:
            if timer not in r.header_timers:
                r.header_timers += (sys.intern(timer),)
        flags = h.get("flags")
        if type(flags) is dict:
            for k, v in flags.items():
                # the same names and values in every run's header (many launches): one string each
                r.flags.setdefault(sys.intern(str(k)), sys.intern(v) if type(v) is str else v)
        runtime = h.get("runtime")
        if type(runtime) is str and runtime and r.runtime is None:
            r.runtime = runtime
        if self.file_index not in r.files:
            r.files += (self.file_index,)

    def spec_of(self, sraw: Any) -> str | None:
        """The spec string of a record's ``"spec"`` (``None`` for none); raises ``BadLine``."""
        if sraw is None:
            return None
        try:
            skey: Any = tuple(sraw.items())
            return self.spec_cache[skey]
        except (KeyError, TypeError, AttributeError):
            spec = spec_label(sraw)
            skey = tuple(sraw.items())
            if len(self.spec_cache) < 4096:
                self.spec_cache[skey] = spec
            return spec

    def forget_group(self) -> None:
        """No current group: the line loop looks its next record's group up."""
        self.g = None
        self.cur_gk = NO

    def switch_process(self, host: Any, pid: Any, rank: Any, dp: Any = None, node: Any = None) -> None:
        """Make (host, pid, rank) the current process (its record count, last cycle end and carry), its records of
        data-parallel group ``dp`` on node ``node``."""
        if self.c_host is not NO:
            self.procs[(self.c_host, self.c_pid, self.c_rank)] = (self.cnt, self.last_end, self.carry)
        self.c_host = host
        self.c_pid = pid
        self.c_rank = rank
        self.c_dp = dp
        self.c_node = node
        self.cnt, self.last_end, self.carry = self.procs.get((host, pid, rank), (0, -math.inf, 0.0))
        self.c_rraw = NO  # a run's start is looked for where the process changes, too

    def switch_run(self, rraw: Any, sraw: Any, t: Any, timer: Any) -> None:
        """Another run or spec (or file, or process): validate them (``BadLine`` before anything changes), find
        their groups. This record's t and timer count for the run's start and timer (see the module docstring)."""
        if rraw is None:
            rid = self.file_run
        elif type(rraw) is str and rraw:
            rid = rraw
        else:
            raise BadLine("bad run")
        spec = self.spec_of(sraw)
        R = self.runs.get(rid) or self.new_run(rid)
        if self.file_index not in R.files:
            R.files += (self.file_index,)
        if t < R.start:
            R.start = float(t)
        if type(timer) is str and timer:
            if timer not in R.timers:
                R.timers += (sys.intern(timer),)
        ctx = self.ctxs.get((rid, spec))
        if ctx is None:
            if self.out.only is not None and rid not in self.out.only:
                ctx = self.out.scratch
            else:
                ctx = self.ctxs[(rid, spec)] = {}
        self.R = R
        self.groups = ctx
        self.c_rid = rid
        self.c_spec = spec
        self.c_rraw = rraw
        self.c_sraw = sraw
        self.c_acap = accept_cap(sraw)
        self.cur_gk = NO

    def text(self, data: bytes) -> None:
        """Read the lines of ``data`` (whole lines of a file's bytes, none over the cap) one by one, as ``lines``
        reads a file."""
        self.lines(text_lines(io.BytesIO(data)))

    def lines(self, source: Iterable[str]) -> None:
        """Read ``source``'s lines (text, as a file opened in text mode gives them) one by one."""
        read_lines(self, source)


def scan_files(
    files: Sequence[str],
    by: str | None,
    skip: int,
    idle_gap_s: float,
    tracer: Any,
    t_min: float | None = None,
    t_max: float | None = None,
    trace_runs: Any = None,
    only_runs: Any = None,
) -> ScanOut:
    """The hot loop. Returns the accumulators per (run, spec) and group key, the runs, the valid records and
    the bad lines. ``trace_runs``: the run ids whose records go to ``tracer`` (``None``: all); ``only_runs``: the run
    ids whose groups are kept (``None``: all; the others' records go to ``ScanOut.scratch``)."""
    fast = _fast_decode()
    st = Scan(by, skip, idle_gap_s, tracer, t_min, t_max, trace_runs, fast, only_runs)
    batches = Batches(st) if fast is not None and tracer is None else None
    with few_collections():  # records decoded by the thousand, freed by reference counting: ~4% of the time
        _scan(st, batches, files)
    out = st.out
    out.records = st.records
    out.bad = st.bad
    return out


def _scan(st: Scan, batches: Batches | None, files: Sequence[str]) -> None:
    for file_index, (path, file_run) in enumerate(zip(files, _file_run_ids(files))):
        st.file_index = file_index
        st.file_run = file_run
        st.c_rraw = NO  # a record without "run" belongs to this file's run: look again
        try:
            f, why = open_log(path)
        except OSError as exc:
            raise UsageError(f"cannot read {path}: {exc.strerror}; check the path and its permissions") from None
        if f is None:
            st.out.notes.append(skip_note(path, why))
            continue
        with f:
            if batches is not None:
                batches.read(f)
            else:
                st.lines(text_lines(f))
