"""The chart of ``report --compare --chart FILE``: the phases of several sources side by side.

Drawn from ``CompareResult.to_json()`` with the primitives of ``eaglepatch.report.chart.draw`` (SVG by hand, PNG
with matplotlib): per group (mode and key) a panel of grouped bars, for each phase and the cycle one bar per
source (its p50 in ms, labelled, with its change against the first source).
"""

from __future__ import annotations

from typing import Any, Mapping

from eaglepatch.report.chart.draw import (
    BETTER,
    GRID,
    INK,
    LABEL_SIZE,
    MUTED,
    SOURCE_COLORS,
    WORSE,
    Scene,
    draw_axis,
    draw_legend,
    draw_title_block,
    ellipsize,
    fmt_num,
    fmt_tick,
    nice_ticks,
    render_scene,
    text_width,
    write_atomic,
)
from eaglepatch.report.labels import CYCLE


def _compare_groups(doc: Mapping[str, Any]) -> list[tuple[Mapping[str, Any], list[str], dict[str, list]]]:
    """Per group with any phase or cycle p50: the group, its categories (phases in order, then cycle) and the
    rows by category."""
    out = []
    for g in doc.get("groups") or []:
        rows = {r["metric"]: r for r in g.get("rows") or []}
        cats: list[str] = []
        for r in g.get("rows") or []:
            m = r["metric"]
            if m.endswith(" p50 ms") and m not in ("cycle p50 ms", "between p50 ms"):
                if any(v is not None for v in r["values"]):
                    cats.append(m[:-len(" p50 ms")])
        if any(v is not None for v in (rows.get("cycle p50 ms") or {}).get("values") or []):
            cats.append("cycle")
        if cats:
            out.append((g, cats, rows))
    return out


def _group_title(g: Mapping[str, Any]) -> str:
    key = " ".join(f"{k}={'?' if v is None else v}" for k, v in (g.get("key") or {}).items())
    return " ".join(x for x in (str(g.get("mode") or ""), key) if x)


def compare_scene(doc: Mapping[str, Any]) -> Scene:
    """Lay out the chart of a ``report --compare`` result (``CompareResult.to_json()``)."""
    if hasattr(doc, "to_json"):
        doc = doc.to_json()
    sources = [str(s) for s in doc.get("sources") or []]
    S = max(1, len(sources))
    colors = [SOURCE_COLORS[i % len(SOURCE_COLORS)] for i in range(S)]
    groups = _compare_groups(doc)
    margin = 18.0
    bar_w = 34.0 if S <= 4 else 26.0
    gap = 22.0
    max_cats = max((len(c) for _g, c, _r in groups), default=1)
    cat_w = S * bar_w + gap
    ticks_all = []
    for _g, cats, rows in groups:
        vals = [v for c in cats for v in (rows[f"{c} p50 ms"]["values"]) if v is not None]
        ticks_all.append(nice_ticks(max(vals + [0.0]) * 200 / (200 - 34)))
    tick_w = max((text_width(fmt_tick(v, t), 10.5) for t in ticks_all for v in t), default=20)
    left = margin + 18 + 8 + tick_w + 8
    right = 22.0
    W = max(640.0, left + max_cats * cat_w + right)
    inner = W - 2 * margin
    title = "Phase times per source: " + " vs ".join(sources)
    sub = [f"report --compare: p50 ms of each phase and of the whole cycle, per group; the % over a bar is its "
           f"change against {sources[0] if sources else 'the first source'} (lower is faster)"]
    sc = Scene(W, 0, title=title)
    y = draw_title_block(sc, margin, inner, title, sub, 34)
    y = draw_legend(sc, margin, y + 26, inner, [("box", colors[i], s) for i, s in enumerate(sources)])
    if not groups:
        y += 24
        sc.text(margin, y, "no phase timings to compare", size=12, color=MUTED)
    p_h = 200.0
    for (g, cats, rows), ticks in zip(groups, ticks_all):
        y += 30
        head = _group_title(g) or "all records"
        extra = []
        for metric, name, nd in (("n", "records", 0), ("accept_len", "accept length", 2),
                                 ("tokens_per_s", CYCLE, 0)):
            r = rows.get(metric)
            if r and any(v is not None for v in r["values"]):
                extra.append(f"{name} " + " | ".join("-" if v is None else f"{v:,.{nd}f}" for v in r["values"]))
        sc.text(margin, y, head, size=13, bold=True)
        if extra:
            sc.text(margin + text_width(head, 13, True) + 12, y,
                    ellipsize("; ".join(extra), 10.5, inner - text_width(head, 13, True) - 12),
                    size=10.5, color=MUTED)
        top = y + 16
        width = len(cats) * cat_w
        draw_axis(sc, left, top, width, p_h, ticks, "ms (p50)", left - tick_w - 24)
        vmax = ticks[-1]

        def yv(v: float) -> float:
            return top + p_h - p_h * v / vmax

        for c_i, cat in enumerate(cats):
            row = rows[f"{cat} p50 ms"]
            x0 = left + c_i * cat_w + gap / 2
            for s_i in range(len(sources)):
                v = row["values"][s_i] if s_i < len(row["values"]) else None
                cx = x0 + s_i * bar_w + bar_w / 2
                if v is None:
                    sc.text(cx, top + p_h - 5, "n/a", size=9, color=MUTED, anchor="middle")
                    continue
                d = row["delta_pct"][s_i] if s_i < len(row.get("delta_pct") or []) else None
                tip = f"{head}: {cat.replace('_', ' ')} p50 {v:.3f} ms, {sources[s_i]}" + (
                    f" ({d:+.1f}% against {sources[0]})" if d is not None else "")
                sc.rect(cx - bar_w / 2 + 1.5, yv(v), bar_w - 3, yv(0) - yv(v), colors[s_i], tip=tip)
                ty = yv(v) - 5
                if d is not None:
                    sc.text(cx, ty, f"{d:+.0f}%", size=9, bold=True, anchor="middle",
                            color=BETTER if d < 0 else WORSE if d > 0 else MUTED)
                    ty -= 12
                sc.text(cx, ty, fmt_num(v, 1 if v >= 10 else 2), size=9, color=INK, anchor="middle")
            if cat == "cycle" and c_i:
                xs = left + c_i * cat_w
                sc.line(xs, top + 4, xs, top + p_h, GRID, 1.0, dash=(3, 3))
            sc.text(x0 + S * bar_w / 2, top + p_h + 16, "whole cycle" if cat == "cycle" else cat.replace("_", " "),
                    size=LABEL_SIZE, anchor="middle")
        y = top + p_h + 22
    sc.h = y + 20
    return sc


def render_compare_chart(compare_json: Mapping[str, Any], path: str) -> bytes:
    """The compare chart's bytes for ``path`` (.svg, or .png with matplotlib), from ``CompareResult.to_json()``
    (or the CompareResult itself)."""
    return render_scene(compare_scene(compare_json), path)


def write_compare_chart(compare_json: Mapping[str, Any], path: str) -> None:
    """Write the chart of a ``report --compare`` result (``CompareResult.to_json()``) to ``path`` (.svg or
    .png); UsageError for another name, or for .png without matplotlib (``check_chart_path`` says so first)."""
    write_atomic(render_compare_chart(compare_json, path), path)
