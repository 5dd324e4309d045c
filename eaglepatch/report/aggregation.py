"""Aggregate timing logs (docs/contract.md "The timing log") into per-group statistics: ``aggregate``, the one
entry point of the report's core.

``aggregate`` streams every line of every file once (``eaglepatch.report.scan``, where the assumptions on the
records are stated) and never holds the records: per group it keeps one compact ``array('f')`` per series (cycle,
each phase, between, and the host-clock series of the ``events`` timer) so that percentiles are computed from every
value, plus a few running sums (``eaglepatch.report.groups``). Memory is 4 bytes per value of each series: a 32-bit
float holds 7 significant digits, finer than the runtime's 0.1 us below a second (docs/design.md, "How report
parses the lines", says what that changes).

Runs (docs/contract.md "The timing log"; never merged unless asked):

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

import math
from collections import Counter
from typing import Any, Collection, Sequence

from eaglepatch.errors import UsageError
from eaglepatch.report.groups import Acc, finish_group, merge_into
from eaglepatch.report.model import BY_CHOICES, ReportResult, RunInfo
from eaglepatch.report.record import is_num
from eaglepatch.report.scan import ScanOut, scan_files
from eaglepatch.report.stats import key_sort_value, mode_sort_value


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
    only_runs: Collection[str] | None = None,
    passed_over: list[tuple[str, Any]] | None = None,
) -> ReportResult:
    """Read the timing logs ``files`` (local paths, read in the given order) and return their statistics.

    ``by``: ``None`` (one group per mode and run), ``"bs"``, ``"rank"`` or ``"host"`` (groups per mode, run and
    that value).
    ``skip``: drop the first ``skip`` valid cycles of every process (host, pid, rank), counted across files: a
    record of ``"every": N`` (apply --every N) stands for N cycles, and is dropped where it begins within them
    (so at N > 1 up to N - 1 more than ``skip`` go, never fewer).
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
    run's ``sources`` (a report of several SOURCEs says whose each run is). ``only_runs`` (with ``run_ids`` naming
    no other run): the groups of these runs alone are kept while the files are read (a run whose records all go
    elsewhere may be missing from the result's runs); ``passed_over``, a list: the (mode, ``by`` value) of each
    group that the other runs' records fell in is appended to it.
    ``merge_runs``: the selected runs' records together, as one run (the result's ``merged`` is true when that put
    several runs together, and the renderers warn).

    Statistics (per group): cycle and phase stats (a phase's over the cycles in which it ran), each phase's
    ``share`` = its total time / the group's total cycle time, ``accept_len`` = sum(accepted) / sum(bs) over
    records with both, ``tokens_per_s`` = sum(accepted) / sum(cycle_ms) * 1000 over records with ``accepted``,
    ``between_ms`` and ``wall_tokens_per_s`` = the same tokens / their wall time * 1000 (the host clock's time
    from one cycle's start to the next: their cycles, the gaps before them and the prefill cycles between them).
    See ``eaglepatch.report.scan``'s docstring for the assumptions.

    Returns a ``ReportResult``; ``records`` counts all valid records of the selected runs, those dropped by
    ``skip`` included; ``skipped_cycles`` the cycles ``skip`` dropped; a group's ``n`` its cycles (a record of
    ``"every": N`` counts N), its ``record_count`` its records. Raises ``UsageError`` for a bad ``by``/``skip``/``idle_gap_s``/``since``, a run id that
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
    if since is not None and (not is_num(since) or not math.isfinite(float(since))):
        raise UsageError(f"since must be a time (seconds since the epoch), not {since!r}")
    if isinstance(run_ids, str):
        run_ids = [run_ids]
    files = list(files)
    windowed = t_min is not None or t_max is not None
    selecting = bool(run_ids) or since is not None or latest

    def scan(trace_runs: Any) -> ScanOut:
        tracer = None
        if trace_path is not None:
            from eaglepatch.report.trace import TraceWriter

            tracer = TraceWriter(trace_path)
        try:
            return scan_files(files, by, skip, idle_gap_s, tracer, t_min, t_max, trace_runs,
                              None if only_runs is None else frozenset(only_runs))
        finally:
            if tracer is not None:
                tracer.close()

    # With a trace, the first pass writes every run's records; should the selection leave a run out, a second
    # pass writes the trace again with the selected runs alone (its numbers are the same as the first's).
    out = scan(None)
    if passed_over is not None:
        passed_over.extend((a.mode, a.keyval) for a in out.scratch.values() if len(a.cyc))
    out.scratch.clear()
    dropped = out.drops_note()
    unread = tuple(out.notes) + ((dropped,) if dropped else ())

    # The runs: records per run (kept + dropped by skip), known runs, oldest first.
    counts: Counter[str] = Counter()
    for (rid, _spec), ctx in out.ctxs.items():
        for a in ctx.values():
            counts[rid] += len(a.cyc)
    infos: list[RunInfo] = []
    shared: dict[Any, Any] = {}  # one tuple for the runs of the same flags (many launches of one server)
    skipped_cycles = {rid: r.skipped_cycles for rid, r in out.runs.items() if r.skipped_cycles}
    for rid, r in out.runs.items():
        n = counts[rid] + r.skipped
        if n == 0 and (windowed or not r.headers):
            continue  # only rejected records, or (in a window) a header alone
        labels = tuple(dict.fromkeys(origins[i] for i in sorted(r.files))) if origins is not None else ()
        flags = tuple(r.flags.items())
        try:
            flags = shared.setdefault(flags, flags)
        except TypeError:  # a flag whose value is a list or an object
            pass
        infos.append(RunInfo(id=rid, start=r.start if math.isfinite(r.start) else None, timer=r.timer(),
                             flags=flags, records=n, runtime=r.runtime, sources=labels))
    infos.sort(key=lambda r: (r.start is not None, r.start or 0.0, r.id))
    out.runs.clear()  # what the scan learnt of the runs is in ``infos`` now
    del shared

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
    base: dict[tuple[Any, ...], dict[str | None, Acc]] = {}
    for (rid, spec), ctx in out.ctxs.items():
        if rid not in chosen_ids:
            continue
        for a in ctx.values():
            if not len(a.cyc):
                continue  # a group whose only records were rejected after it was created
            # the DP groups of one group are one Acc each: merged here, their sums kept apart (groups.merge_into);
            # --by rank: the node too, where the records say it (a multi-node server)
            bkey = (None if merged else rid, a.mode, a.keyval, a.node if by == "rank" else None)
            specs = base.setdefault(bkey, {})
            have = specs.get(spec)
            if have is None:
                specs[spec] = a
            else:
                merge_into(have, a)
    out.ctxs.clear()

    def sort_key(item: tuple[tuple[Any, ...], str | None, Acc]) -> Any:
        (rid, mode, kv, node), spec, _a = item
        return (order.get(rid, 0), mode_sort_value(mode), key_sort_value(kv), key_sort_value(node), spec is None,
                spec or "")

    flat = [(bkey, spec, a) for bkey, specs in base.items() for spec, a in specs.items()]
    varying = {bkey for bkey, specs in base.items() if len(specs) > 1}
    flat.sort(key=sort_key)
    base.clear()
    groups = []
    for i, (bkey, spec, a) in enumerate(flat):
        flat[i] = None  # type: ignore[call-overload]  # each accumulator freed once finished: never all of both
        rid = bkey[0]
        key: list[tuple[str, Any]] = [] if by is None else [(by, bkey[2])]
        if bkey[3] is not None:
            key.insert(0, ("node", bkey[3]))
        if bkey in varying:
            key.append(("spec", spec))
        if multi:
            key.append(("run", rid))
        groups.append(finish_group(a, tuple(key), rid if not merged else None))
        del a
    del flat
    return ReportResult(
        sources=tuple(files if sources is None else sources),
        records=sum(r.records for r in chosen),
        skipped_lines=out.bad,
        skipped_cycles=sum(skipped_cycles.get(r.id, 0) for r in chosen),
        groups=tuple(groups),
        by=by,
        skip=skip,
        runs=tuple(chosen),
        merged=merged,
        other_runs=others,
        unread=unread,
    )

