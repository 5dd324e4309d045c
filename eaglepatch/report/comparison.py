"""Compare several ``ReportResult``s side by side (``report --compare``). Pure: values in, values/text out.

Groups are matched by (mode, key). Per group the rows are: ``n``; for each phase (canonical order, the union over
the sources) and then ``cycle`` and ``between``: ``"<name> p50 ms"`` and ``"<name> mean ms"``; then
``accept_len``, ``tokens_per_s`` and ``wall_tokens_per_s``. ``delta_pct[i]`` is the change of source ``i``
against the first source in percent, ``(v_i - v_0) / v_0 * 100`` rounded to 2 decimals; ``None`` for the first
source, and when either value is missing or the first is 0.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from typing import Any, Sequence

from tabulate import tabulate

from eaglepatch.errors import UsageError
from eaglepatch.report.aggregation import GroupStats, ReportResult
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
class CompareResult:
    """What ``compare`` returns; ``sources`` are the labels, in the order given."""

    sources: tuple[str, ...]
    groups: tuple[CompareGroup, ...]

    def to_json(self) -> dict[str, Any]:
        """Return ``{"sources": [labels], "groups": [{"mode", "key", "rows": [{"metric", "values",
        "delta_pct"}]}]}``."""
        return {"sources": list(self.sources), "groups": [g.to_json() for g in self.groups]}


def _delta(v0: float | None, v: float | None) -> float | None:
    if v0 is None or v is None or v0 == 0:
        return None
    return (v - v0) / v0 * 100.0


def _make_row(metric: str, values: Sequence[float | None]) -> CompareRow:
    v0 = values[0]
    deltas = tuple([None] + [_delta(v0, v) for v in values[1:]])
    return CompareRow(metric=metric, values=tuple(values), delta_pct=deltas)


def compare(results: Sequence[ReportResult], labels: Sequence[str]) -> CompareResult:
    """Match the groups of ``results`` by (mode, key) and put their numbers side by side with deltas.

    ``labels`` names each result (e.g. the SOURCE arguments). Returns a ``CompareResult`` whose groups are
    ordered like a report's (decode first, then by key). Raises ``UsageError`` when fewer than two results are
    given or the number of labels differs.
    """
    if len(results) < 2:
        raise UsageError("--compare needs two or more sources; give each run's logs as its own SOURCE")
    if len(labels) != len(results):
        raise UsageError(f"--compare got {len(results)} results but {len(labels)} labels")
    index: dict[tuple[str, tuple[tuple[str, Any], ...]], list[GroupStats | None]] = {}
    for i, res in enumerate(results):
        for g in res.groups:
            slot = index.setdefault((g.mode, g.key), [None] * len(results))
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
    return CompareResult(sources=tuple(labels), groups=tuple(groups))


def _fmt_val(metric: str, v: float | None) -> str:
    if v is None:
        return "-"
    if metric == "n":
        return str(int(v))
    if metric.endswith("tokens_per_s"):
        return f"{v:.1f}"
    return f"{v:.3f}"


def _fmt_delta(d: float | None) -> str:
    return "" if d is None else f"{d:+.1f}%"


def render_compare_table(result: CompareResult, *, tablefmt: str = "simple") -> str:
    """Return the side-by-side tables: per group a title line (mode and key), then one row per metric with
    one value column per source and one ``Δ% <label>`` column per later source; no trailing newline."""
    labels = list(result.sources)
    headers = ["metric", *labels, *[f"Δ% {lab}" for lab in labels[1:]]]
    out: list[str] = []
    if not result.groups:
        out.append("no timing records to compare")
    for g in result.groups:
        out.append(" ".join([g.mode, g.key_label()]).strip())
        rows = [
            [r.metric, *[_fmt_val(r.metric, v) for v in r.values], *[_fmt_delta(d) for d in r.delta_pct[1:]]]
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
