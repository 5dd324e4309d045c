"""The chart of ``eaglepatch sweep --chart FILE``, from the ``sweep --json`` object (``render_chart``/
``write_chart``), drawn with the primitives of ``eaglepatch.report.chart.draw`` (SVG by hand, PNG with matplotlib).

Two panels on one x axis of the points, each labelled with the point's label (wrapped at its spaces, or slanted
when the labels are long or many): tok/s per point (bar: the median over the launches; whisker: their min-max;
the baseline grey with a dashed line at its median across the panel; each bar labelled with its median and its
speedup over the baseline; the best point green and marked) and the p50 of draft, verify and draft extend
stacked, in ms, on an axis of its own, with the p50 of the whole cycle marked. A failed point is shown as failed
in both panels; a sweep without per-phase timings (target not patched) says so instead of its second panel.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from eaglepatch.report.chart.draw import (
    AXIS,
    BAR,
    BASE,
    BEST,
    BETTER,
    FAIL,
    INK,
    LABEL_SIZE,
    MUTED,
    PHASE_COLORS,
    WHITE,
    WORSE,
    Scene,
    clean,
    draw_axis,
    draw_legend,
    draw_notes,
    draw_title_block,
    ellipsize,
    fmt_num,
    fmt_tick,
    fmt_tps,
    nice_ticks,
    render_scene,
    text_width,
    wrap,
    wrap_to,
    write_atomic,
)
from eaglepatch.report.labels import CLIENT

SLANT = 35.0  # degrees: the slant of long or many point labels


def sweep_scene(doc: Mapping[str, Any]) -> Scene:
    """Lay out the chart of a sweep summary (``eaglepatch.tuning.sweep_summary.summarize``, the ``sweep --json`` object)."""
    points = list(doc.get("points") or [])
    n = max(1, len(points))
    best = doc.get("best")
    base = doc.get("baseline")
    target = str(doc.get("target") or "?")
    labels = [str(p.get("label") or f"point {i}") for i, p in enumerate(points)] or ["no points"]
    ok = [p.get("status") == "ok" and bool(p.get("tokens_per_s")) for p in points]
    phased = [bool(ok[i] and any((p.get("phases_p50") or {}).get(k) for k in PHASE_COLORS))
              for i, p in enumerate(points)]
    has_phases = any(phased)
    margin = 18.0

    # the x axis: labels wrapped at their spaces under each point, or slanted when long or many
    widest_word = max(text_width(w, LABEL_SIZE) for lab in labels for w in (lab.split() or [lab]))
    slot = max(88.0, widest_word + 14)
    slanted = slot > 200 or n * slot > 1300
    step = LABEL_SIZE * 1.25
    if slanted:
        slot = 64.0
        rad = math.radians(SLANT)
        wrapped = [wrap_to(lab, LABEL_SIZE, max(1, int(slot * math.sin(rad) // step))) for lab in labels]
        label_w = max(text_width(line, LABEL_SIZE) for w in wrapped for line in w)
        label_h = label_w * math.sin(rad) + max(len(w) for w in wrapped) * step * math.cos(rad) + 6
    else:
        wrapped = [wrap(lab, LABEL_SIZE, slot - 10) for lab in labels]
        label_h = max(len(w) for w in wrapped) * step + 6

    tps_vals = [p["tokens_per_s"].get("max") or p["tokens_per_s"].get("median") or 0
                for i, p in enumerate(points) if ok[i]]
    p1_h, p2_h = 250.0, 200.0
    # headroom above the tallest whisker for its labels (best, speedup, median: ~48 pt)
    tps_top = max(tps_vals + [0.0]) * p1_h / (p1_h - 50) if tps_vals else 1.0
    tps_ticks = nice_ticks(tps_top) if tps_vals else []

    def stack(p: Mapping[str, Any]) -> float:
        ph = p.get("phases_p50") or {}
        return sum(ph.get(k) or 0 for k in PHASE_COLORS)

    ms_vals = [max(stack(p), (p.get("phases_p50") or {}).get("cycle") or 0) for i, p in enumerate(points)
               if phased[i]]
    ms_ticks = nice_ticks(max(ms_vals + [0.0]) * p2_h / (p2_h - 22) if ms_vals else 1.0)

    tick_w = max([text_width(fmt_tick(v, t), 10.5) for t in (tps_ticks, ms_ticks) for v in t] + [20.0])
    left = margin + 18 + 8 + tick_w + 8
    if slanted:  # the first label reaches left of its point
        overhang = max(max(text_width(line, LABEL_SIZE) for line in w) * math.cos(math.radians(SLANT))
                       - (i + 0.5) * slot + 4 for i, w in enumerate(wrapped))
        left = max(left, margin + overhang)
    right = 22.0
    min_w = 680.0
    if left + n * slot + right < min_w:
        slot = (min_w - left - right) / n
        if not slanted:
            wrapped = [wrap(lab, LABEL_SIZE, min(slot - 10, 220)) for lab in labels]
            label_h = max(len(w) for w in wrapped) * step + 6
    W = left + n * slot + right
    title_x = left - tick_w - 24
    bar_w = min(slot * 0.56, 60.0)
    inner = W - 2 * margin

    # the text above the panels
    if doc.get("live"):  # a live sweep: windows inside one server
        launches = doc.get("launches", 0)
        sub = [f"{len(points)} point{'s' if len(points) != 1 else ''} \u00d7 {doc.get('rounds', 1)} windows of "
               f"{doc.get('window_s', 0):g} s inside one server ({launches} launch{'es' if launches != 1 else ''})"
               f"; {CLIENT}: what the load's client received; phases: p50 ms over the decode steps"]
    else:
        repeat = doc.get("repeat") or 1
        sub = [f"{len(points)} point{'s' if len(points) != 1 else ''} \u00d7 {repeat} launch{'es' if repeat != 1 else ''}"
               f"; {CLIENT}: what the load's client received; phases: p50 ms over the decode steps"]
    if best is not None and 0 <= best < len(points):
        bp = points[best]
        if best == base:
            sub.append(f"best: the baseline, no speculation ({fmt_tps(bp['tokens_per_s']['median'])} {CLIENT}): no "
                       "speculative point beat it")
        else:
            sp = f", {bp['speedup']:.2f}\u00d7 the baseline" if bp.get("speedup") is not None else ""
            sub.append(f"best: {bp.get('label')} ({fmt_tps(bp['tokens_per_s']['median'])} {CLIENT}{sp})")
    if base is None:
        sub.append("no baseline point (sweep --baseline adds one): no speedups")
    elif not (0 <= base < len(points) and ok[base]):
        sub.append("the baseline did not run: no speedups")

    sc = Scene(W, 0, title=f"Sweep of {target}")
    y = draw_title_block(sc, margin, inner, f"Sweep of {target}", sub, 34)

    def slot_x(i: int) -> float:
        return left + i * slot + slot / 2

    # panel 1: tok/s
    y += 30
    sc.text(margin, y, f"Throughput per point ({CLIENT}, higher is better)", size=13, bold=True)
    y = draw_legend(sc, left, y + 20, W - left - right, _tps_legend(doc, points, ok))
    top1 = y + 12
    draw_axis(sc, left, top1, n * slot, p1_h, tps_ticks, CLIENT, title_x)
    vmax = tps_ticks[-1] if tps_ticks else 1.0

    def y1(v: float) -> float:
        return top1 + p1_h - p1_h * v / vmax

    if base is not None and 0 <= base < len(points) and ok[base]:  # behind the bars
        yb = y1(points[base]["tokens_per_s"]["median"])
        sc.line(left, yb, left + n * slot, yb, INK, 1.2, dash=(5, 4))
    for i, p in enumerate(points):
        cx = slot_x(i)
        if not ok[i]:
            _not_ok(sc, p, cx, slot, top1, p1_h, detail=True)
            continue
        t = p["tokens_per_s"]
        med, lo, hi = t["median"], t.get("min", t["median"]), t.get("max", t["median"])
        color = BASE if i == base else (BEST if i == best else BAR)
        tip = f"{labels[i]}: {fmt_tps(med)} {CLIENT} median of {_measured(p)}, min {fmt_tps(lo)}, " \
              f"max {fmt_tps(hi)}" + (f", {p['speedup']:.3f}\u00d7 the baseline" if p.get("speedup") is not None
                                      else "")
        sc.rect(cx - bar_w / 2, y1(med), bar_w, y1(0) - y1(med), color, tip=tip)
        if hi > lo:
            sc.line(cx, y1(hi), cx, y1(lo), INK, 1.3)
            sc.line(cx - 7, y1(hi), cx + 7, y1(hi), INK, 1.3)
            sc.line(cx - 7, y1(lo), cx + 7, y1(lo), INK, 1.3)
        ty = min(y1(hi), y1(med)) - 5
        sc.text(cx, ty, fmt_tps(med), size=10.5, color=MUTED, anchor="middle", halo=True)
        ty -= 14
        if p.get("speedup") is not None:
            sp = round(p["speedup"], 2)
            sc.text(cx, ty, f"{sp:.2f}\u00d7", size=12, bold=True, anchor="middle", halo=True,
                    color=INK if i == base else (BETTER if sp > 1 else WORSE if sp < 1 else INK))
            ty -= 14
        if i == best:
            sc.text(cx, ty, "best", size=11, bold=True, color=BEST, anchor="middle", halo=True)
        elif p.get("within_noise"):
            sc.text(cx, ty, "\u2248 best", size=10.5, color=BEST, anchor="middle", halo=True,
                    tip=f"within noise of the best: its {CLIENT} range overlaps the best point's")
    y = top1 + p1_h

    # panel 2: the phases
    if has_phases:
        y += 34
        sc.text(margin, y, "Time per decode step by phase (p50 ms, lower is better)", size=13, bold=True)
        y = draw_legend(sc, left, y + 20, W - left - right, _phase_legend())
        top2 = y + 12
        draw_axis(sc, left, top2, n * slot, p2_h, ms_ticks, "ms per step (p50)", title_x)
        mmax = ms_ticks[-1]

        def y2(v: float) -> float:
            return top2 + p2_h - p2_h * v / mmax

        for i, p in enumerate(points):
            cx = slot_x(i)
            if not ok[i]:
                _not_ok(sc, p, cx, slot, top2, p2_h, detail=False)
                continue
            ph = p.get("phases_p50") or {}
            if not phased[i]:
                why = "no speculation" if i == base else "no timings"
                lines = wrap(why, 10.5, slot - 8)
                sc.text(cx, top2 + p2_h - 8 - (len(lines) - 1) * 10.5 * 1.25, lines, size=10.5, color=MUTED,
                        anchor="middle")
                continue
            acc = 0.0
            for name, col in PHASE_COLORS.items():
                v = ph.get(name) or 0
                if v <= 0:
                    continue
                ya, yb = y2(acc + v), y2(acc)
                sc.rect(cx - bar_w / 2, ya, bar_w, yb - ya, col,
                        tip=f"{labels[i]}: {name.replace('_', ' ')} p50 {v:.3f} ms")
                txt = fmt_num(v)
                if yb - ya >= 13 and text_width(txt, 9.5) + 4 <= bar_w:
                    sc.text(cx, (ya + yb) / 2 + 3.5, txt, size=9.5, color=WHITE, anchor="middle")
                acc += v
            top_y = y2(acc)
            cyc = ph.get("cycle")
            if cyc:
                sc.line(cx - bar_w / 2 - 5, y2(cyc), cx + bar_w / 2 + 5, y2(cyc), INK, 2.2)
                top_y = min(top_y, y2(cyc))
                sc.text(cx, top_y - 6, f"{fmt_num(cyc)} ms", size=10.5, color=INK, anchor="middle", halo=True,
                        tip=f"{labels[i]}: cycle p50 {cyc:.3f} ms (draft+verify+draft extend+the rest)")
        y = top2 + p2_h

    # the shared x axis
    for i in range(len(points)):
        cx = slot_x(i)
        sc.line(cx, y, cx, y + 4, AXIS, 1.0)
        if slanted:  # the block of lines centred on the tick
            back = (len(wrapped[i]) - 1) / 2 * step
            rad = math.radians(SLANT)
            sc.text(cx + 4 - back * math.sin(rad), y + 14 - back * math.cos(rad), wrapped[i], size=LABEL_SIZE,
                    anchor="end", rotate=SLANT)
        else:
            sc.text(cx, y + 17, wrapped[i], size=LABEL_SIZE, anchor="middle")
    y += label_h + 20
    axis = ("sweep point (the step count pinned inside the one server)" if doc.get("live")
            else "sweep point (flags and environment of the server's launch)")
    sc.text(left + n * slot / 2, y, axis, size=11.5, anchor="middle")

    if not has_phases:
        y += 32
        sc.text(margin, y, "Time per decode step by phase", size=13, bold=True)
        msg = (f"no per-phase timings: the target is not patched (eaglepatch apply TARGET first); {CLIENT} and "
               "the client's accept length only") if any(ok) else "no point ran: no timings"
        for part in wrap(msg, 11.5, inner):
            y += 18
            sc.text(margin, y, part, size=11.5, color=MUTED)
    y = draw_notes(sc, margin, inner, _all_notes(doc, points), y + 8)
    sc.h = y + 18
    return sc


def _measured(p: Mapping[str, Any]) -> str:
    """What a point's figures are the median of: ``3 launch(es)``, or a live sweep's ``5 window(s)``."""
    if "windows" in p:
        return f"{p['windows']} window(s)"
    return f"{p.get('runs', 1)} launch(es)"


def _tps_legend(doc: Mapping[str, Any], points: Sequence[Mapping[str, Any]],
                ok: Sequence[bool]) -> list[tuple[str, str, str]]:
    base, best = doc.get("baseline"), doc.get("best")
    items: list[tuple[str, str, str]] = []
    if base is not None and 0 <= base < len(points) and ok[base]:
        items += [("box", BASE, "baseline (no speculation)"), ("dash", INK, "baseline median")]
    if any(ok[i] and i not in (base, best) for i in range(len(points))):
        items.append(("box", BAR, "speculative point" if base is not None else "sweep point"))
    if best is not None and best != base:
        items.append(("box", BEST, "best point"))
    if any(ok[i] and (p["tokens_per_s"].get("max") or 0) > (p["tokens_per_s"].get("min") or 0)
           for i, p in enumerate(points)):
        items.append(("whisker", INK, f"min-max over the {'windows' if doc.get('live') else 'launches'} (bar: "
                                      "median)"))
    return items


def _phase_legend() -> list[tuple[str, str, str]]:
    return [("box", PHASE_COLORS["draft"], "draft"), ("box", PHASE_COLORS["verify"], "verify"),
            ("box", PHASE_COLORS["draft_extend"], "draft extend"),
            ("mark", INK, "cycle p50: the whole step (labelled)")]


def _all_notes(doc: Mapping[str, Any], points: Sequence[Mapping[str, Any]]) -> list[str]:
    notes = [str(n) for n in doc.get("notes") or [] if not str(n).startswith("no per-phase timings")]
    for p in points:
        if p.get("status") == "failed":
            err = " ".join(clean(p.get("error") or "failed").split())
            notes.append(f"failed: {p.get('label')}: {err[:300]}")
    return notes


def _not_ok(sc: Scene, p: Mapping[str, Any], cx: float, slot: float, top: float, height: float,
            detail: bool) -> None:
    """A point with no figures: failed (red band and word) or not run."""
    failed = p.get("status") == "failed"
    color = FAIL if failed else MUTED
    err = " ".join(clean(p.get("error") or "").split())
    tip = f"{p.get('label')}: " + (f"failed: {err}" if failed else "not run")
    sc.rect(cx - slot / 2 + 3, top, slot - 6, height, color, opacity=0.07, tip=tip)
    word = "failed" if failed else "not run"
    sc.text(cx, top + height / 2, word, size=12, bold=True, color=color, anchor="middle", tip=tip)
    if detail and failed and err:
        lines = wrap(err, 9.5, slot - 12)[:3]
        if len(lines) == 3:
            lines[2] = ellipsize(lines[2] + "\u2026", 9.5, slot - 12)
        sc.text(cx, top + height / 2 + 15, lines, size=9.5, color=color, anchor="middle")


def render_chart(doc: Mapping[str, Any], path: str) -> bytes:
    """The sweep chart's bytes for ``path``: SVG when it ends in .svg, PNG (matplotlib) when in .png; UsageError
    for another name, or for .png without matplotlib."""
    return render_scene(sweep_scene(doc), path)


def write_chart(doc: Mapping[str, Any], path: str) -> None:
    """Write the sweep chart of ``doc`` (the ``sweep --json`` object) to ``path`` (.svg or .png)."""
    write_atomic(render_chart(doc, path), path)

