"""``report``: the timing logs of local files and of TARGETs (fetched into the cache), each source's runs chosen
(``RunSelection``: by default a TARGET's current run), aggregated, compared or predicted, as a table, CSV or JSON."""

from __future__ import annotations

import dataclasses
import functools
import json
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
           sweep_of: SweepOf | None = None) -> str:
    """The report of ``sources`` (local timing logs, or TARGETs whose logs are fetched first), as the text to
    print; ``sweep_of``: where ``--predict`` finds a TARGET's measured baseline (none: predicted without it)."""
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
                       compare=compare, fmt=fmt, say=say, chart=chart, predict=predict, steps=steps, sweep=sweep)
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
            sweep: dict[str, Any] | None) -> str:
    """``report`` once each source's files and runs are known: aggregated (the follower's result, where it has the
    same), compared or predicted, rendered."""
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
            return json.dumps(cmp.to_json(), indent=1) + "\n"
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
    if result is None:
        result = rep.aggregate(files, **kwargs) if files else rep.aggregate([], by=by, skip=skip)
    if trace:
        say(f"trace written to {trace}: open it in https://ui.perfetto.dev")
    preds = None
    by_bs: dict[str | None, Any] = {}
    if predict:
        from eaglepatch.report.predict import MIN_CYCLES, predict as predict_groups
        from eaglepatch.report.predict_bs import for_runs

        preds = predict_groups(result, steps=steps, sweep=sweep, min_cycles=MIN_CYCLES)
        # the cost curves need the decode cycles by batch size: a second pass over the same files unless --by bs
        per_bs = result if by == "bs" else (rep.aggregate(files, **dict(kwargs, by="bs", trace_path=None))
                                             if files else result)
        by_bs = for_runs(per_bs, steps=steps, sweep=sweep, min_cycles=MIN_CYCLES)
    if fmt == "json" or (predict and chart is not None):
        doc = result.to_json()
        doc["sources"] = list(sources)
        for gd, pred in zip(doc["groups"], preds or ()):
            if pred is not None:
                gd.update(pred.to_json())
        attach_by_bs(doc, by_bs)
        if predict and chart is not None:
            from eaglepatch.report.chart.predict import write_predict_chart

            write_predict_chart(doc, chart, sweep)
            say(f"chart written to {chart}")
        if fmt == "json":
            return json.dumps(doc, indent=1) + "\n"
    if fmt == "csv":
        return rep.render_csv(result)
    return rep.render_table(result, predictions=preds, by_bs=by_bs) + "\n"


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
