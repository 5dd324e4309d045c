"""Compare several ``ReportResult``s side by side (``report --compare``). Pure: values in, values/text out
(``aggregate_each``, which reads the sources' files and writes their traces, aside).

Columns: one per source, or, for a source whose result holds several runs (not merged), one per run of it,
labelled ``<label>#1``, ``<label>#2``... (oldest first; ``CompareResult.columns`` and the table's legend say
which run each is), so that runs are compared, never blended. A single source holding several runs can thus be
compared with itself. Groups are matched across the columns by (mode, key), the key's ``run`` left out. Per group
the rows are: ``n``; for each phase (canonical order, the union over the columns) and then ``cycle`` and
``between``: ``"<name> p50 ms"`` and ``"<name> mean ms"``; then ``accept_len``, ``tokens_per_s`` and
``wall_tokens_per_s``. ``delta_pct[i]`` is the change of column ``i`` against the first column in percent,
``(v_i - v_0) / v_0 * 100`` rounded to 2 decimals; ``None`` for the first column, and when either value is
missing or the first is 0.
"""

from __future__ import annotations

import csv
import io
import os
from dataclasses import dataclass
from typing import Any, Sequence

from tabulate import tabulate

from eaglepatch.errors import UsageError
from eaglepatch.report.aggregation import aggregate
from eaglepatch.report.labels import CYCLE, WALL
from eaglepatch.report.model import GroupStats, ReportResult, RunInfo
from eaglepatch.report.stats import key_sort_value, mode_sort_value, phase_order, round_json


@dataclass(frozen=True)
class CompareRow:
    """One metric of one group across the sources: ``values[i]`` for source ``i`` (``None`` where the group or
    the metric is missing) and ``delta_pct[i]`` against source 0 (``delta_pct[0]`` is always ``None``)."""

    metric: str
    values: tuple[float | None, ...]
    delta_pct: tuple[float | None, ...]

    def to_json(self) -> dict[str, Any]:
        """Return ``{"metric", "values", "delta_pct"}`` (values rounded to 4 decimals, deltas to 2)."""
        return {
            "metric": self.metric,
            "values": [round_json(v) for v in self.values],
            "delta_pct": [round_json(v, 2) for v in self.delta_pct],
        }


@dataclass(frozen=True)
class CompareGroup:
    """The rows of one (mode, key) group."""

    mode: str
    key: tuple[tuple[str, Any], ...]
    rows: tuple[CompareRow, ...]

    def key_label(self) -> str:
        """``""`` or e.g. ``"bs=1"``."""
        return " ".join(f"{k}={'?' if v is None else v}" for k, v in self.key)

    def row(self, metric: str) -> CompareRow | None:
        """Return the row of that metric (e.g. ``"draft p50 ms"``), or ``None``."""
        for r in self.rows:
            if r.metric == metric:
                return r
        return None

    def to_json(self) -> dict[str, Any]:
        """Return ``{"mode", "key", "rows": [...]}``."""
        return {"mode": self.mode, "key": dict(self.key), "rows": [r.to_json() for r in self.rows]}


@dataclass(frozen=True)
class CompareColumn:
    """One value column: its ``label``, the ``source`` label it comes from, and its ``runs``: one, several when
    the source's runs were merged (``merge_runs``), none when the result has no run information."""

    label: str
    source: str
    runs: tuple[RunInfo, ...] = ()

    @property
    def run(self) -> RunInfo | None:
        """The column's run when it has exactly one."""
        return self.runs[0] if len(self.runs) == 1 else None

    def legend(self) -> str | None:
        """``"<label>: run 2026-12-01 15:46:44  EAGLE3 ...  timer=events  (id ...)"``; for merged runs
        ``"<label>: N runs merged, their figures blend: ID (start, timer), ..."``; ``None`` without runs."""
        if not self.runs:
            return None
        if len(self.runs) > 1:
            return (f"{self.label}: {len(self.runs)} runs merged, their figures blend: "
                    + "; ".join(r.short() for r in self.runs))
        return f"{self.label}: {self.runs[0].title()}"

    def to_json(self) -> dict[str, Any]:
        """``{"label", "source", "runs": [RunInfo.to_json()]}``."""
        return {"label": self.label, "source": self.source, "runs": [r.to_json() for r in self.runs]}


@dataclass(frozen=True)
class CompareResult:
    """What ``compare`` returns; ``sources`` are the column labels, in order (the labels given, where each
    source is one column); ``columns`` say where each column comes from."""

    sources: tuple[str, ...]
    groups: tuple[CompareGroup, ...]
    columns: tuple[CompareColumn, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """Return ``{"sources": [column labels], "groups": [{"mode", "key", "rows": [{"metric", "values",
        "delta_pct"}]}], "columns": [CompareColumn.to_json()]}`` (``values[i]`` belongs to ``sources[i]``)."""
        return {"sources": list(self.sources), "groups": [g.to_json() for g in self.groups],
                "columns": [c.to_json() for c in self.columns]}


def _delta(v0: float | None, v: float | None) -> float | None:
    if v0 is None or v is None or v0 == 0:
        return None
    return (v - v0) / v0 * 100.0


def _make_row(metric: str, values: Sequence[float | None]) -> CompareRow:
    v0 = values[0]
    deltas = tuple([None] + [_delta(v0, v) for v in values[1:]])
    return CompareRow(metric=metric, values=tuple(values), delta_pct=deltas)


def _columns(results: Sequence[ReportResult], labels: Sequence[str]) -> list[tuple[CompareColumn, list[GroupStats]]]:
    """Split each result into its columns: one per run that has groups where it holds several (not merged),
    else one."""
    out: list[tuple[CompareColumn, list[GroupStats]]] = []
    for label, res in zip(labels, results):
        runs = [r for r in res.runs if res.run_groups(r.id)] if not res.merged else []
        if len(runs) > 1:
            for i, run in enumerate(runs, 1):
                out.append((CompareColumn(f"{label}#{i}", label, (run,)), list(res.run_groups(run.id))))
            ids = {r.id for r in runs}
            rest = [g for g in res.groups if g.run not in ids]
            if rest:  # groups of no known run (not from aggregate): a column of their own
                out.append((CompareColumn(f"{label}#?", label), rest))
        else:
            # merged: all its runs; else the one run with groups (or, with none, the one run it holds)
            col_runs = res.runs if res.merged else tuple(runs) or (res.runs if len(res.runs) == 1 else ())
            out.append((CompareColumn(label, label, col_runs), list(res.groups)))
    return out


def compare(results: Sequence[ReportResult], labels: Sequence[str]) -> CompareResult:
    """Match the groups of ``results`` by (mode, key without its run) and put their numbers side by side with
    deltas, one column per source, or per run of a source that holds several (see the module docstring).

    ``labels`` names each result (e.g. the SOURCE arguments). Returns a ``CompareResult`` whose groups are
    ordered like a report's (decode first, then by key). Raises ``UsageError`` when the number of labels
    differs, or when fewer than two columns result (one source with one run).
    """
    if len(labels) != len(results):
        raise UsageError(f"--compare got {len(results)} results but {len(labels)} labels")
    cols = _columns(results, labels)
    if len(cols) < 2:
        raise UsageError("--compare needs two or more sources (or a source holding several runs); give each "
                         "run's logs as its own SOURCE")
    index: dict[tuple[str, tuple[tuple[str, Any], ...]], list[GroupStats | None]] = {}
    for i, (_col, gs_i) in enumerate(cols):
        for g in gs_i:
            key = tuple((k, v) for k, v in g.key if k != "run")
            slot = index.setdefault((g.mode, key), [None] * len(cols))
            slot[i] = g
    keys = sorted(
        index,
        key=lambda mk: (mode_sort_value(mk[0]), tuple(key_sort_value(v) for _, v in mk[1]), repr(mk[1])),
    )
    groups: list[CompareGroup] = []
    for mode, key in keys:
        gs = index[(mode, key)]
        rows: list[CompareRow] = [_make_row("n", [g.n if g else None for g in gs])]
        names = phase_order(p.name for g in gs if g for p in g.phases)
        for name in names:
            ps = [g.phase(name) if g else None for g in gs]
            rows.append(_make_row(f"{name} p50 ms", [p.stats.p50 if p else None for p in ps]))
            rows.append(_make_row(f"{name} mean ms", [p.stats.mean if p else None for p in ps]))
        rows.append(_make_row("cycle p50 ms", [g.cycle.p50 if g else None for g in gs]))
        rows.append(_make_row("cycle mean ms", [g.cycle.mean if g else None for g in gs]))
        if any(g is not None and g.between is not None for g in gs):
            bs = [g.between if g else None for g in gs]
            rows.append(_make_row("between p50 ms", [b.p50 if b else None for b in bs]))
            rows.append(_make_row("between mean ms", [b.mean if b else None for b in bs]))
        rows.append(_make_row("accept_len", [g.accept_len if g else None for g in gs]))
        rows.append(_make_row("tokens_per_s", [g.tokens_per_s if g else None for g in gs]))
        rows.append(_make_row("wall_tokens_per_s", [g.wall_tokens_per_s if g else None for g in gs]))
        groups.append(CompareGroup(mode=mode, key=key, rows=tuple(rows)))
    columns = tuple(c for c, _ in cols)
    return CompareResult(sources=tuple(c.label for c in columns), groups=tuple(groups), columns=columns)


def numbered_paths(path: str, n: int) -> list[str]:
    """``n`` paths made from ``path`` by inserting ``.1``, ``.2``... before its extension: ``t.json`` ->
    ``t.1.json``, ``t.2.json``; ``trace`` -> ``trace.1``; ``dir.d/t`` -> ``dir.d/t.1``."""
    root, ext = os.path.splitext(path)
    return [f"{root}.{i}{ext}" for i in range(1, n + 1)]


def aggregate_each(
    file_lists: Sequence[Sequence[str]],
    labels: Sequence[str] | None = None,
    *,
    trace_path: str | None = None,
    each: Sequence[dict[str, Any]] | None = None,
    **kwargs: Any,
) -> tuple[list[ReportResult], list[str]]:
    """Aggregate each source on its own (what ``report --compare`` does): ``file_lists[i]`` are the log files of
    source ``i`` (``iter_log_files([source])``), ``labels[i]`` its name (the result's ``sources``; default: the
    files). ``kwargs`` go to every ``aggregate`` call (``by``, ``skip``, ``latest``, ``since``, ``run_ids``,
    ``merge_runs``...): a selection applies to each source by itself (``latest``: each source's newest run);
    ``each[i]``, when given, adds source ``i``'s own (``launches``, ``latest``: a TARGET's current run).

    ``trace_path``: write one trace per source, at ``numbered_paths(trace_path, len(file_lists))`` (``t.json`` ->
    ``t.1.json``, ``t.2.json``...). Returns the results and the trace paths written (``[]`` without
    ``trace_path``). Raises what ``aggregate`` raises (a ``UsageError`` names the source when a run id is
    unknown to it).
    """
    if labels is not None and len(labels) != len(file_lists):
        raise UsageError(f"got {len(file_lists)} sources but {len(labels)} labels")
    paths = numbered_paths(trace_path, len(file_lists)) if trace_path is not None else []
    results: list[ReportResult] = []
    for i, files in enumerate(file_lists):
        label = labels[i] if labels is not None else None
        try:
            own = {**kwargs, **(each[i] if each is not None else {})}
            results.append(aggregate(files, trace_path=paths[i] if paths else None,
                                     sources=[label] if label is not None else None, **own))
        except UsageError as exc:
            if label is None:
                raise
            raise UsageError(f"{label}: {exc}") from None
    return results, paths


def _fmt_val(metric: str, v: float | None) -> str:
    if v is None:
        return "-"
    if metric == "n":
        return str(int(v))
    if metric.endswith("tokens_per_s"):
        return f"{v:.1f}"
    return f"{v:.3f}"


# the text table's names of the metrics whose JSON and CSV name is a key: whose tok/s each is (labels)
_SHOWN = {"tokens_per_s": CYCLE, "wall_tokens_per_s": WALL}


def _fmt_delta(d: float | None) -> str:
    return "" if d is None else f"{d:+.1f}%"


def render_compare_table(result: CompareResult, *, tablefmt: str = "simple") -> str:
    """Return the side-by-side tables: first a legend line per column whose run is known (its label and the
    run's header line), then per group a title line (mode and key), then one row per metric with one value
    column per column and one ``Δ% <label>`` column per later column (the tok/s metrics by their labels:
    ``in-cycle tok/s``, ``records' wall tok/s``); no trailing newline."""
    labels = list(result.sources)
    headers = ["metric", *labels, *[f"Δ% {lab}" for lab in labels[1:]]]
    out: list[str] = []
    legend = [line for line in (c.legend() for c in result.columns) if line]
    if legend:
        out.extend(legend)
        out.append("")
    if not result.groups:
        out.append("no timing records to compare")
    for g in result.groups:
        out.append(" ".join([g.mode, g.key_label()]).strip())
        rows = [
            [_SHOWN.get(r.metric, r.metric), *[_fmt_val(r.metric, v) for v in r.values],
             *[_fmt_delta(d) for d in r.delta_pct[1:]]]
            for r in g.rows
        ]
        colalign = ("left",) + ("right",) * (len(headers) - 1)
        out.append(tabulate(rows, headers=headers, tablefmt=tablefmt, disable_numparse=True, colalign=colalign))
        out.append("")
    while out and out[-1] == "":
        out.pop()
    return "\n".join(out)


def _csv_cell(v: float | None, ndigits: int) -> str:
    r = round_json(v, ndigits)
    return "" if r is None else repr(r)


def render_compare_csv(result: CompareResult) -> str:
    """Return CSV text: ``mode,key,metric,<label>...,delta_pct_<label>...`` (a delta column per later source),
    one row per group and metric; missing values are empty."""
    labels = list(result.sources)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["mode", "key", "metric", *labels, *[f"delta_pct_{lab}" for lab in labels[1:]]])
    for g in result.groups:
        for r in g.rows:
            vals = [_csv_cell(v, 4) for v in r.values]
            deltas = [_csv_cell(d, 2) for d in r.delta_pct[1:]]
            w.writerow([g.mode, g.key_label(), r.metric, *vals, *deltas])
    return buf.getvalue()
