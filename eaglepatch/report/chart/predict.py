"""The chart of ``report --predict --chart FILE``: predicted tok/s against the draft step count, beside the
acceptance profile, per decode group.

Drawn from the ``report --json`` document (groups with ``predict`` and ``acceptance``), with the same scene and
writers as the other charts (``eaglepatch.report.chart.draw``): SVG by hand, PNG with matplotlib. Per group, a
row of two panels:

* left, tok/s by step count: the prediction as a line through its points, its uncertainty (``spread``) as a band,
  each point marked by its basis (measured: a filled dot; profile and extrapolated: open circles; the
  no-speculation estimate: a dashed line across the panel, solid when measured), the best point labelled, and the
  points of a sweep of the same server when one is given (diamonds, with their min-max whiskers);
* right, the acceptance profile: for each position ``i`` the share of request-cycles that produced at least ``i``
  tokens, as bars, each labelled with its share and, from the second on, the per-position rate.

Then, per run with ``predict_by_bs``, tok/s against the batch size: a line per step count, no speculation in black
(dashed where estimated), measured points filled, the crossover marked.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from eaglepatch.report.chart.draw import (
    AXIS,
    BAR,
    BASE,
    BEST,
    INK,
    MUTED,
    Scene,
    draw_axis,
    draw_notes,
    draw_title_block,
    fmt_tick,
    fmt_tps,
    nice_ticks,
    render_scene,
    text_width,
    write_atomic,
)
from eaglepatch.report.labels import CLIENT, WALL, predicted

LINE = "#4e79a7"
BAND = "#4e79a7"
SWEEP = "#e15759"
PANEL_H = 230.0
LEFT_W = 470.0
RIGHT_W = 300.0


def _group_title(g: Mapping[str, Any]) -> str:
    key = " ".join(f"{k}={'?' if v is None else v}" for k, v in (g.get("key") or {}).items() if k != "run")
    return " ".join(x for x in ("decode", key) if x)


def _sweep_points(sweep: Mapping[str, Any] | None) -> list[tuple[int, float, float, float]]:
    """(steps, median, min, max) of a sweep's ok points that set only the step count (no speculation: 0)."""
    out = []
    base = sweep.get("baseline") if sweep else None
    for i, p in enumerate((sweep or {}).get("points") or []):
        tps = p.get("tokens_per_s") or {}
        if p.get("status") != "ok" or not tps.get("median"):
            continue
        flags = p.get("flags") or {}
        if i == base:
            steps = 0
        elif set(flags) <= {"speculative-num-steps", "speculative-num-draft-tokens"} and \
                str(flags.get("speculative-num-steps", "")).isdigit():
            steps = int(flags["speculative-num-steps"])
        else:
            continue
        out.append((steps, tps["median"], tps.get("min") or tps["median"], tps.get("max") or tps["median"]))
    return out


def _plot_area(sc: Scene, x0: float, y0: float, top_value: float, width_all: float, right: float, height: float,
               title: str) -> tuple[float, float, float, float, float]:
    """A panel's axis from 0 to at least ``top_value``, its tick labels and title at the left of ``x0``, ``right``
    pixels kept free on the right; ``(left, width, top, height, vmax)`` of its plot area."""
    ticks = nice_ticks(top_value)
    tick_w = max(text_width(fmt_tick(v, ticks), 10.5) for v in ticks)
    left = x0 + 18 + 8 + tick_w + 8
    width = width_all - (left - x0) - right
    top = y0 + 8
    draw_axis(sc, left, top, width, height, ticks, title, left - tick_w - 22)
    return left, width, top, height, ticks[-1]


def _tps_panel(sc: Scene, x0: float, y0: float, g: Mapping[str, Any], sweep: list[tuple[int, float, float, float]]
               ) -> None:
    pts = g.get("predict") or []
    spec = [p for p in pts if p["steps"] > 0]
    zero = next((p for p in pts if p["steps"] == 0), None)
    tops = [p["tokens_per_s"] * (1 + (p.get("spread") or 0)) for p in pts] + [m for _s, _m, _lo, m in sweep]
    left, width, top, height, vmax = _plot_area(sc, x0, y0, max(tops + [1.0]) * 1.12, LEFT_W, 10, PANEL_H,
                                                predicted(WALL))
    steps = sorted({p["steps"] for p in pts} | {s for s, *_ in sweep})
    smin, smax = min(steps), max(steps)
    span = max(smax - smin, 1)

    def X(s: float) -> float:
        return left + 16 + (width - 32) * (s - smin) / span

    def Y(v: float) -> float:
        return top + height - height * min(v, vmax) / vmax

    for s in steps:
        sc.text(X(s), top + height + 15, str(s), size=10.5, color=MUTED, anchor="middle")
    sc.text(left + width / 2, top + height + 32, "draft steps (0: no speculation)", size=11, color=INK,
            anchor="middle")
    if spec:
        upper = [(X(p["steps"]), Y(p["tokens_per_s"] * (1 + (p.get("spread") or 0)))) for p in spec]
        lower = [(X(p["steps"]), Y(max(p["tokens_per_s"] * (1 - (p.get("spread") or 0)), 0))) for p in spec]
        sc.poly(upper + lower[::-1], BAND, opacity=0.16)
        for a, b in zip(spec, spec[1:]):
            sc.line(X(a["steps"]), Y(a["tokens_per_s"]), X(b["steps"]), Y(b["tokens_per_s"]), LINE, 2.0)
    if zero is not None:
        yz = Y(zero["tokens_per_s"])
        measured = zero["basis"] == "measured"
        sc.line(left, yz, left + width, yz, BASE if not measured else INK, 1.5, dash=None if measured else (5, 4))
        label = f"no speculation, {'measured' if measured else 'estimated'}: {fmt_tps(zero['tokens_per_s'])}"
        sc.text(left + width - 4, yz - 5, label, size=10, color=MUTED, anchor="end", halo=True)
    for p in spec:
        x, y = X(p["steps"]), Y(p["tokens_per_s"])
        if p["basis"] == "measured":
            sc.rect(x - 4.5, y - 4.5, 9, 9, INK, tip=f"measured at {p['steps']} steps: {fmt_tps(p['tokens_per_s'])}")
        else:
            sc.rect(x - 3.5, y - 3.5, 7, 7, "#ffffff", stroke=LINE, stroke_width=1.5,
                    tip=f"{p['basis']}: {p['steps']} steps, {fmt_tps(p['tokens_per_s'])} {WALL}")
    for s, med, lo, hi in sweep:
        x = X(s) + 7
        sc.line(x, Y(lo), x, Y(hi), SWEEP, 1.3)
        sc.rect(x - 3.5, Y(med) - 3.5, 7, 7, SWEEP,
                tip=f"sweep: {s} steps, {fmt_tps(med)} {CLIENT} ({fmt_tps(lo)}-{fmt_tps(hi)})")
    best = g.get("predict_best")
    if best is not None and 0 <= best < len(pts):
        bp = pts[best]
        x, y = X(bp["steps"]), Y(bp["tokens_per_s"])
        k = bp["steps"]
        what = "no speculation" if k == 0 else f"{k} step{'s' if k > 1 else ''}"
        sc.text(x, y - 10, f"best: {what}, {fmt_tps(bp['tokens_per_s'])}", size=10.5, color=BEST,
                anchor="middle", bold=True, halo=True)


def _profile_panel(sc: Scene, x0: float, y0: float, g: Mapping[str, Any]) -> None:
    acc = g.get("acceptance") or {}
    al = list(acc.get("at_least") or [])
    rates = list(acc.get("rates") or [])
    ticks = [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    left = x0 + 18 + 8 + text_width("0.8", 10.5) + 8
    width = RIGHT_W - (left - x0) - 6
    top, height = y0 + 8, PANEL_H
    draw_axis(sc, left, top, width, height, ticks, "share of request-cycles", left - text_width("0.8", 10.5) - 22)
    if not al:
        sc.text(left + width / 2, top + height / 2, "no per-request counts", size=11, color=MUTED, anchor="middle")
        return
    slot = width / len(al)
    bw = min(slot * 0.62, 40.0)
    for i, share in enumerate(al):
        cx = left + slot * (i + 0.5)
        h = height * share
        sc.rect(cx - bw / 2, top + height - h, bw, h, BAR, tip=f"at least {i + 1} token(s): {share:.3f}")
        label = f"{share:.2f}" if not i else f"{share:.2f} ({rates[i - 1]:.2f})" if rates[i - 1] is not None \
            else f"{share:.2f}"
        sc.text(cx, top + height - h - 5, label, size=9.5, color=INK, anchor="middle", halo=True)
        sc.text(cx, top + height + 15, f"\u2265{i + 1}", size=10.5, color=MUTED, anchor="middle")
    sc.text(left + width / 2, top + height + 32, f"tokens per request-cycle ({acc.get('samples', 0)} samples)",
            size=11, color=INK, anchor="middle")


# a line per step count in the by-batch-size panel (0, no speculation, in INK)
STEP_COLORS = ("#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#ff9da7", "#9c755f", "#bab0ac")
BS_H = 260.0


def _by_bs_panel(sc: Scene, x0: float, y0: float, width_all: float, run: Mapping[str, Any]) -> None:
    """tok/s against the batch size (a log2 axis), a line per step count, no speculation in black (dashed where
    estimated), measured points filled, the crossover marked."""
    rows = run.get("predict_by_bs") or []
    lines: dict[int, list[tuple[int, Mapping[str, Any]]]] = {}
    for r in rows:
        for p in r["points"]:
            lines.setdefault(p["steps"], []).append((r["bs"], p))
    tops = [p["tokens_per_s"] for r in rows for p in r["points"]]
    left, width, top, height, vmax = _plot_area(sc, x0, y0, max(tops + [1.0]) * 1.08, width_all, 90, BS_H,
                                                predicted(WALL))
    bss = sorted({r["bs"] for r in rows})
    lo, hi = math.log2(bss[0]), math.log2(max(bss[-1], bss[0] * 2))

    def X(b: float) -> float:
        return left + 12 + (width - 24) * (math.log2(b) - lo) / (hi - lo)

    def Y(v: float) -> float:
        return top + height - height * min(v, vmax) / vmax

    for b in bss:
        if b in (bss[0], bss[-1]) or b & (b - 1) == 0:
            sc.text(X(b), top + height + 15, str(b), size=10.5, color=MUTED, anchor="middle")
    sc.text(left + width / 2, top + height + 32, "requests a cycle (batch size)", size=11, color=INK, anchor="middle")
    labels = []
    for k, pts in sorted(lines.items()):
        color = INK if k == 0 else STEP_COLORS[(k - 1) % len(STEP_COLORS)]
        for (b1, p1), (b2, p2) in zip(pts, pts[1:]):
            est = k == 0 and (p1["basis"] == "estimate" or p2["basis"] == "estimate")
            sc.line(X(b1), Y(p1["tokens_per_s"]), X(b2), Y(p2["tokens_per_s"]), color, 1.6,
                    dash=(5, 4) if est else None)
        for b, p in pts:
            if p["basis"] == "measured":
                sc.rect(X(b) - 3.5, Y(p["tokens_per_s"]) - 3.5, 7, 7, color,
                        tip=f"measured: {k} steps at {b} requests, {fmt_tps(p['tokens_per_s'])} {WALL}")
        b, p = pts[-1]
        labels.append([Y(p["tokens_per_s"]) + 4, X(b) + 8,
                       "no speculation" if k == 0 else f"{k} step{'s' if k > 1 else ''}", color])
    labels.sort()
    for a, b in zip(labels, labels[1:]):  # each label at least a line below the one above it
        b[0] = max(b[0], a[0] + 12)
    for ly, lx, text, color in labels:
        sc.text(lx, ly, text, size=10, color=color, halo=True)
    cross = run.get("crossover_bs")
    if cross:
        x = X(cross)
        sc.line(x, top, x, top + height, BEST, 1.2, dash=(3, 3))
        sc.text(x + 4, top + 12, f"speculation stops paying: {cross}", size=10.5, color=BEST, bold=True, halo=True)


def predict_scene(doc: Mapping[str, Any], sweep: Mapping[str, Any] | None = None) -> Scene:
    """Lay out the chart of a ``report --predict --json`` document (one row per decode group with a prediction),
    with the points of ``sweep`` (a ``sweep --json`` object) where given."""
    groups = [g for g in doc.get("groups") or [] if g.get("mode") == "decode" and g.get("predict")]
    margin = 18.0
    W = margin * 2 + LEFT_W + RIGHT_W + 20
    sources = ", ".join(str(s) for s in doc.get("sources") or []) or "timing logs"
    sub = ["predicted from one run's phase times and acceptance profile; the band: the prediction's uncertainty",
           "filled: measured; open: predicted (fewer steps from the profile, more extrapolated); dashed: no "
           "speculation, estimated" + (f"; red: the sweep's points ({CLIENT}, another scale)" if sweep else "")]
    sc = Scene(W, 0, title=f"Predicted {WALL} by draft steps: {sources}")
    y = draw_title_block(sc, margin, W - 2 * margin, f"Predicted {WALL} by draft steps: {sources}", sub, 34)
    sp = _sweep_points(sweep)
    if not groups:
        y += 30
        sc.text(margin, y, "no decode group with a prediction (see report --predict for why)", size=12, color=MUTED)
    for g in groups:
        y += 30
        sc.text(margin, y, _group_title(g), size=13, color=INK, bold=True)
        _tps_panel(sc, margin, y + 6, g, sp)
        _profile_panel(sc, margin + LEFT_W + 20, y + 6, g)
        y += 6 + 8 + PANEL_H + 40
        y = draw_notes(sc, margin, W - 2 * margin, [n for n in g.get("predict_notes") or []][:2], y)
    for run in [r for r in doc.get("runs") or [] if r.get("predict_by_bs")] + (
            [doc] if doc.get("predict_by_bs") else []):
        y += 30
        sc.text(margin, y, f"best step count per batch size{' (run ' + str(run['id']) + ')' if run.get('id') else ''}",
                size=13, color=INK, bold=True)
        _by_bs_panel(sc, margin, y + 6, W - 2 * margin, run)
        y += 6 + 8 + BS_H + 40
        y = draw_notes(sc, margin, W - 2 * margin, list(run.get("predict_by_bs_notes") or [])[:2], y)
    sc.line(margin, y + 12, W - margin, y + 12, AXIS, 0.5)
    sc.h = y + 22
    return sc


def write_predict_chart(doc: Mapping[str, Any], path: str, sweep: Mapping[str, Any] | None = None) -> None:
    """Write the prediction chart of ``doc`` (``report --predict --json``) to ``path`` (.svg or .png)."""
    write_atomic(render_scene(predict_scene(doc, sweep), path), path)


__all__: Sequence[str] = ("predict_scene", "write_predict_chart")
