"""``report``: the timing logs of local files and of TARGETs (fetched into the cache), each source's runs chosen
(``RunSelection``: by default a TARGET's current run), aggregated, compared or predicted, as a table, CSV or JSON."""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from typing import Any, Callable, Sequence

from eaglepatch import console
from eaglepatch.errors import UsageError
from eaglepatch.hosts.target import is_local_target
from eaglepatch.ops.logs import FetchedLogs, fetch_logs, logs_of
from eaglepatch.ops.target import Connect, target_spec

Say = Callable[[str], None]
# the newest sweep kept on this machine of a target (by its name) whose baseline ran, else None: the measured
# no-speculation point of --predict (``eaglepatch.tuning.saved.sweep_with_baseline``; the CLI hands it over)
SweepOf = Callable[[str], "dict[str, Any] | None"]


@dataclasses.dataclass(frozen=True)
class RunSelection:
    """``report``'s choice of runs: ``merge`` (all together, said so), ``ids`` (these, by id or prefix), ``since``
    (runs that started at or after an epoch), ``all`` (every run apart). None of them: a TARGET's current runs
    (those of the servers that run now, else its newest), every run of local files."""

    merge: bool = False
    ids: tuple[str, ...] = ()
    since: float | None = None
    all: bool = False

    def __post_init__(self) -> None:
        if sum((self.merge, bool(self.ids), self.since is not None, self.all)) > 1:
            raise UsageError("--merge-runs, --run, --since and --all-runs exclude each other: give one")

    @property
    def explicit(self) -> bool:
        return self.merge or bool(self.ids) or self.since is not None or self.all


def parse_since(text: str, now: float | None = None) -> float:
    """``--since``: an epoch (``1764500000``), a local date and time (``2026-12-01 15:40``, ``2026-12-01T15:40:00``)
    or an age (``30m``, ``2h``, ``1d``, ``90s``). Raises UsageError."""
    import datetime

    now = time.time() if now is None else now
    t = text.strip()
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if t[-1:] in units and t[:-1].replace(".", "", 1).isdigit():
        return now - float(t[:-1]) * units[t[-1]]
    try:
        return float(t)
    except ValueError:
        pass
    try:
        return datetime.datetime.fromisoformat(t.replace(" ", "T", 1)).timestamp()
    except ValueError:
        raise UsageError(f"--since {text!r}: give an epoch, a date and time (2026-12-01 15:40) or an age "
                         "(30m, 2h, 1d)") from None


def _is_log_source(path: str) -> bool:
    """A local SOURCE that is timing logs itself (a .jsonl file, or a folder with some), not an install."""
    from eaglepatch import report as rep

    if os.path.isfile(path):
        return True
    try:
        return bool(rep.iter_log_files([path]))
    except UsageError:  # a folder without logs: an install, or nothing
        return False


def report(sources: Sequence[str], c: Connect, *, by: str | None, skip: int, trace: str | None, compare: bool,
           log_dir: str | None, fmt: str, say: Say, runs: RunSelection = RunSelection(),
           chart: str | None = None, predict: bool = False, steps: Sequence[int] | None = None,
           sweep_of: SweepOf | None = None, write: Callable[[str], Any] | None = None) -> str:
    """The report of ``sources`` (local timing logs, or TARGETs whose logs are fetched first), as the text to
    print; ``sweep_of``: where ``--predict`` finds a TARGET's measured baseline (none: predicted without it).
    ``write`` (e.g. ``sys.stdout.write``): the JSON (``fmt="json"``) is handed to it piece by piece as it is made,
    and ``""`` returned, so that a report of many runs never holds its whole text (the tables and the CSV are
    returned as ever)."""
    from eaglepatch import report as rep

    per_source: list[list[str]] = []  # the log files of each source
    own: list[dict[str, Any]] = []  # each source's own selection: a TARGET's current run by default
    sweep: dict[str, Any] | None = None  # a TARGET's sweep with a baseline, for --predict
    select: dict[str, Any] = {"merge_runs": runs.merge, "run_ids": list(runs.ids) or None, "since": runs.since}
    # one TARGET alone: its logs are aggregated while they arrive, beside the fetch (ops.follow)
    follower = None
    if len(sources) == 1 and not compare and os.environ.get("EAGLEPATCH_FOLLOW") != "0" and not (
            (os.path.exists(sources[0]) or is_local_target(sources[0])) and _is_log_source(sources[0])):
        from eaglepatch.ops.follow import Follower

        follower = Follower()
    try:
        for s in sources:
            if (os.path.exists(s) or is_local_target(s)) and _is_log_source(s):
                skipped: list[str] = []  # a FIFO, a device, a loop of links among the logs: named, never read
                per_source.append(rep.iter_log_files([s], skipped))
                for note in skipped:
                    say(note)
                own.append({})
                continue
            # a TARGET: a remote one, or a local install (package, venv, checkout): the same code path
            ahead = None
            if follower is not None:
                kwargs = {"by": by, "skip": skip, "trace_path": trace, "origins": None, **select}
                ahead = functools.partial(_Ahead, follower, runs=runs, kwargs=kwargs)
            fetched = fetch_logs(target_spec(s, c), c, log_dir, say, watch=ahead)
            chosen = _own_runs(fetched, rep.iter_log_files([fetched.folder]), runs)
            if chosen is None:
                # the server runs and has timed nothing: another server's numbers in its place would mislead
                raise UsageError(f"{s}: {_no_records(fetched)}")
            files, sel = chosen
            if sel.get("latest"):
                say(f"note: {s}: no server of this install runs: its newest run is shown (--all-runs for every "
                    "run)")
            per_source.append(files)
            own.append(sel)
            if predict and sweep is None and sweep_of is not None:
                sweep = sweep_of(fetched.name)
        return _report(rep, per_source, own, sources, select, follower, by=by, skip=skip, trace=trace,
                       compare=compare, fmt=fmt, say=say, chart=chart, predict=predict, steps=steps, sweep=sweep,
                       write=write)
    finally:
        if follower is not None:
            follower.close()


def _own_runs(fetched: FetchedLogs, files: list[str], runs: RunSelection) -> tuple[list[str], dict[str, Any]] | None:
    """A TARGET's log files and its own choice of runs (``aggregate``'s arguments) among ``files``: by default its
    current run; None where its servers run and have written no record."""
    if runs.explicit:
        return files, {}
    # by default the current run: the runs of the servers that run now (every rank), read from their processes'
    # files; never an earlier launch that had the same pid
    mine = logs_of(files, fetched.current)
    if mine:
        return mine, {"launches": fetched.launches}
    if fetched.current:
        return None
    # no server of the install runs: its newest run, never one that another install's runtime wrote
    return files, {"latest": True, "install": fetched.package}


@dataclasses.dataclass
class _Ahead:
    """The ``LogWatch`` of a TARGET's fetch whose logs ``follower`` aggregates as they arrive: the files that the
    fetch will leave and the same choice of runs as ``report`` will make of them."""

    follower: Any  # ops.follow.Follower
    fetched: FetchedLogs
    runs: RunSelection
    kwargs: dict[str, Any]

    def begin(self, files: list[str], sizes: dict[str, int]) -> None:
        chosen = _own_runs(self.fetched, files, self.runs)
        if chosen is not None and chosen[0]:
            self.follower.start(chosen[0], sizes, {**self.kwargs, **chosen[1]})

    def wrote(self, path: str, size: int, replaced: bool) -> None:
        self.follower.wrote(path, size, replaced)

    def complete(self, path: str) -> None:
        self.follower.complete(path)


def _report(rep: Any, per_source: list[list[str]], own: list[dict[str, Any]], sources: Sequence[str],
            select: dict[str, Any], follower: Any, *, by: str | None, skip: int, trace: str | None, compare: bool,
            fmt: str, say: Say, chart: str | None, predict: bool, steps: Sequence[int] | None,
            sweep: dict[str, Any] | None, write: Callable[[str], Any] | None = None) -> str:
    """``report`` once each source's files and runs are known: aggregated (the follower's result, where it has the
    same), compared or predicted, rendered."""
    from eaglepatch.report.jsontext import indented, write_indented

    def json_text(doc: dict[str, Any]) -> str:
        # piece by piece: the same text as json.dumps(doc, indent=1), never the whole document at once
        if write is None:
            return indented(doc)
        write_indented(doc, write)
        return ""

    if compare:
        results, traces = rep.aggregate_each(per_source, list(sources), trace_path=trace, by=by, skip=skip,
                                             each=own, **select)
        for path in traces:
            say(f"trace written to {path}: open it in https://ui.perfetto.dev")
        cmp = rep.compare(results, list(sources))
        if chart is not None:
            from eaglepatch.report.chart.compare import write_compare_chart

            write_compare_chart(cmp.to_json(), chart)
            say(f"chart written to {chart}")
        if fmt == "json":
            return json_text(cmp.to_json())
        if fmt == "csv":
            return rep.render_compare_csv(cmp)
        return rep.render_compare_table(cmp) + "\n"
    files = [f for fs in per_source for f in fs]
    if not files:
        raise UsageError(f"no timing logs (*.jsonl) in {', '.join(sources)}: apply first, then put load on the "
                         "server")
    if any(own) and len(sources) > 1:
        # several sources in one table: each source's own selection picks its run ids first (a TARGET's current
        # run must not cut the runs of the files given beside it), then one aggregation of those runs
        picked: list[str] = []
        for fs, sel in zip(per_source, own):
            if fs:
                picked += [r.id for r in rep.aggregate(fs, by=None, skip=skip, **select, **sel).runs]
        select = {**select, "run_ids": picked or None, "since": None}
        own = [{}]
        if not picked:
            files = []
    # several sources in one report: each run's table says which SOURCE it came from
    origins = [src for fs, src in zip(per_source, sources) for _f in fs] if len(sources) > 1 else None
    kwargs = {"by": by, "skip": skip, "trace_path": trace, "origins": origins, **select, **own[0]}
    result = follower.result(files, kwargs) if follower is not None and files else None
    if follower is not None and os.environ.get("EAGLEPATCH_DEBUG"):
        console.line(f"eaglepatch: report: aggregated {'after the fetch: ' + str(follower.why) if result is None else 'while fetching'}")
    by_bs: dict[str | None, Any] | None = None
    if predict:
        from eaglepatch.report.predict import MIN_CYCLES, predict as predict_groups
        from eaglepatch.report.predict_bs import for_runs

        if result is None and by not in ("bs", None) and files:
            # the cost curves need the decode cycles by batch size: a pass of their own, priced and dropped before
            # the report's pass (many runs: the groups of both passes never held at once)
            per_bs = rep.aggregate(files, **dict(kwargs, by="bs", trace_path=None))
            by_bs = for_runs(per_bs, steps=steps, sweep=sweep, min_cycles=MIN_CYCLES)
            del per_bs
    if result is None:
        result = rep.aggregate(files, **kwargs) if files else rep.aggregate([], by=by, skip=skip)
    if trace:
        say(f"trace written to {trace}: open it in https://ui.perfetto.dev")
    preds = None
    if predict:
        preds = predict_groups(result, steps=steps, sweep=sweep, min_cycles=MIN_CYCLES)
        if by_bs is None and by is None and files and not result.merged:
            by_bs = _priced_by_bs(rep, result, files, kwargs, steps=steps, sweep=sweep, min_cycles=MIN_CYCLES)
        if by_bs is None:
            # the same second pass after a result aggregated while fetching (or --by bs: the result is it)
            per_bs = result if by == "bs" or not files else rep.aggregate(files, **dict(kwargs, by="bs",
                                                                                          trace_path=None))
            by_bs = for_runs(per_bs, steps=steps, sweep=sweep, min_cycles=MIN_CYCLES)
            del per_bs
    by_bs = by_bs or {}
    if fmt == "json" or (predict and chart is not None):
        doc = report_doc(result, sources, preds, by_bs)
        if predict and chart is not None:
            from eaglepatch.report.chart.predict import write_predict_chart

            doc["groups"] = doc["groups"].materialize()
            doc["runs"] = doc["runs"].materialize()
            write_predict_chart(doc, chart, sweep)
            say(f"chart written to {chart}")
        if fmt == "json":
            return json_text(doc)
    if fmt == "csv":
        return rep.render_csv(result)
    return rep.render_table(result, predictions=preds, by_bs=by_bs) + "\n"


def _priced_by_bs(rep: Any, result: Any, files: list[str], kwargs: dict[str, Any], *, steps: Sequence[int] | None,
                  sweep: dict[str, Any] | None, min_cycles: int) -> dict[str | None, Any] | None:
    """``predict_bs.for_runs`` of ``result``'s runs (aggregated ``by=None``) by batch size, with a second pass (by
    batch size) that keeps the groups of the runs that may be priced alone: those whose decode records (the main
    pass counts them) reach ``min_cycles``, and those of several ranks (their count per rank is the second pass's).
    Each other run's count of cycles, for its note, is its decode records: exact where every one of them has a
    ``bs``, which the second pass checks; where one has none, None (the caller makes the pass of every run)."""
    from eaglepatch.report.predict_bs import decode_bounds, for_runs, too_few

    bounds = decode_bounds(result)
    keep = [run for run, (n, one) in bounds.items() if n >= min_cycles or not one]
    priced: dict[str | None, Any] = {}
    if len(keep) < len(bounds):
        over: list[tuple[str, Any]] = []
        if keep:
            per_bs = rep.aggregate(files, **dict(kwargs, by="bs", trace_path=None, run_ids=keep, since=None,
                                                 only_runs=keep, passed_over=over))
        else:
            # no run to price: a pass that keeps no group, for the check below (no selection: no run to name)
            per_bs = rep.aggregate(files, **dict(kwargs, by="bs", trace_path=None, run_ids=None, since=None,
                                                 latest=False, only_runs=(), passed_over=over))
        from eaglepatch.report.predict import as_int

        if any(mode == "decode" and as_int(bs) is None for mode, bs in over):
            return None  # a decode record without a batch size: its run's count is the second pass's
        priced = for_runs(per_bs, steps=steps, sweep=sweep, min_cycles=min_cycles) if keep else {}
        del per_bs
    elif keep:
        per_bs = rep.aggregate(files, **dict(kwargs, by="bs", trace_path=None))
        priced = for_runs(per_bs, steps=steps, sweep=sweep, min_cycles=min_cycles)
        del per_bs
    out: dict[str | None, Any] = {}
    for run, (n, _one) in bounds.items():  # for_runs' order: the runs' (their groups') order
        if run in priced:
            out[run] = priced[run]
        elif n < min_cycles and run not in keep:
            out[run] = too_few(n, min_cycles)
    return out


def report_doc(result: Any, sources: Sequence[str], preds: Sequence[Any] | None,
               by_bs: dict[str | None, Any]) -> dict[str, Any]:
    """The ``report --json`` document of ``result`` (``ReportResult.to_json``): ``sources`` as given, each decode
    group's prediction (``preds``, one per group or None) in its object, each run's prices by batch size
    (``attach_by_bs``). Its ``groups`` and ``runs`` are ``Items``, made as ``indented`` writes them."""
    from eaglepatch.report.jsontext import Items

    preds = list(preds or ())

    def groups() -> Any:
        for i, g in enumerate(result.groups):
            gd = g.to_json()
            pred = preds[i] if i < len(preds) else None
            if pred is not None:
                gd.update(pred.to_json())
            yield gd

    def runs() -> Any:
        for r in result.runs:
            rd = r.to_json()
            b = by_bs.get(r.id)
            if b is not None:
                rd.update(b.to_json())
            yield rd

    doc = result.to_json(lazy=True)
    doc["sources"] = list(sources)
    doc["groups"] = Items(groups())
    doc["runs"] = Items(runs())
    listed = {r.id for r in result.runs}
    for run, b in by_bs.items():  # a run the document does not list (older logs without run ids): the top level
        if run not in listed:
            doc.update(b.to_json())
    return doc


def attach_by_bs(doc: dict[str, Any], by_bs: dict[str | None, Any]) -> None:
    """Each run's ``cost_model``, ``predict_by_bs`` and ``crossover_bs`` into its object in ``doc["runs"]``
    (docs/contract.md); a run the document does not list (older logs without run ids) at the top level."""
    listed = {r.get("id"): r for r in doc.get("runs") or ()}
    for run, b in by_bs.items():
        (listed[run] if run in listed else doc).update(b.to_json())


def _no_records(fetched: FetchedLogs) -> str:
    """Why ``report TARGET`` shows nothing: the servers that run now have written no timing record."""
    which = ", ".join(f"pid {pid}" + (f" on :{port}" if port else "") for pid, port in fetched.servers)
    return (f"the server that runs now ({which or 'pid ' + ', '.join(map(str, sorted(fetched.current)))}) has "
            "written no timing record yet: it is not patched, or has had no load since it started (eaglepatch "
            "status says which; eaglepatch bench puts load on it); --all-runs shows the earlier runs")
