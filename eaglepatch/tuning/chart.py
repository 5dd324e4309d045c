"""Charts: the sweep's (``eaglepatch sweep --chart FILE``) and the phases of ``report --compare`` side by side.

A chart is laid out once as a ``Scene`` (rectangles, lines, text in a coordinate space of points, y down) and
written either as SVG, by hand (real ``<text>``, ``font-family="sans-serif"``, a ``viewBox``: no dependency), or
as PNG, drawn by matplotlib (the optional extra ``pip install 'eaglepatch[plot]'``). The file name decides:
``.svg`` or ``.png``; ``check_chart_path`` says before any work whether a name can be written.

The sweep chart (``render_chart``/``write_chart``, from the ``sweep --json`` object) has two panels on one x axis
of the points, each labelled with the point's label (wrapped at its spaces, or slanted when the labels are
long or many): tok/s per point (bar: the median over the launches; whisker: their min-max; the baseline grey
with a dashed line at its median across the panel; each bar labelled with its median and its speedup over the
baseline; the best point green and marked) and the p50 of draft, verify and draft extend stacked, in ms, on an
axis of its own, with the p50 of the whole cycle marked. A failed point is shown as failed in both panels; a
sweep without per-phase timings (target not patched) says so instead of its second panel.

The compare chart (``render_compare_chart``/``write_compare_chart``, from ``CompareResult.to_json()``): per
group (mode and key) a panel of grouped bars, for each phase and the cycle one bar per source (its p50 in ms,
labelled, with its change against the first source).
"""

from __future__ import annotations

import io
import math
import os
import re
from typing import Any, Mapping, Sequence
from xml.sax.saxutils import escape

from eaglepatch.errors import UsageError

INK = "#222222"
MUTED = "#5f6368"
AXIS = "#9aa0a6"
GRID = "#e6e6e6"
WHITE = "#ffffff"
BAR = "#4e79a7"
BEST = "#3f9142"
BASE = "#a9aeb3"
FAIL = "#d62728"
BETTER = "#2e7d32"
WORSE = "#c62828"
PHASE_COLORS = {"draft": "#f28e2b", "verify": "#9c6ade", "draft_extend": "#59a9a4"}
SOURCE_COLORS = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
                 "#9c755f", "#79706e")
FONT = "sans-serif"
FORMATS = (".svg", ".png")
PNG_HINT = "pip install 'eaglepatch[plot]' (matplotlib), or name the chart .svg"

# ----------------------------------------------------------------------------------------------------------------
# Text metrics: advance widths of DejaVu Sans (matplotlib's sans-serif) for ASCII 32..126, in 1/1000 em. Browsers'
# sans-serif (Arial, Helvetica, Liberation Sans) is a little narrower, so a layout that fits these fits there.

_WIDTHS = (
    318, 401, 460, 838, 636, 950, 780, 275, 390, 390, 500, 838, 318, 361, 318, 337, 636, 636, 636, 636, 636, 636,
    636, 636, 636, 636, 337, 337, 838, 838, 838, 531, 1000, 684, 686, 698, 770, 632, 575, 775, 752, 295, 295, 656,
    557, 863, 748, 787, 603, 787, 695, 635, 611, 732, 684, 989, 685, 611, 685, 390, 337, 390, 838, 500, 500, 613,
    635, 550, 635, 615, 352, 635, 634, 278, 278, 579, 278, 974, 634, 612, 635, 635, 411, 521, 392, 634, 592, 818,
    592, 592, 525, 636, 337, 636, 838,
)


def text_width(s: str, size: float, bold: bool = False) -> float:
    """The width of ``s`` at font size ``size`` (a little more than most sans-serif fonts need)."""
    em = sum(_WIDTHS[ord(c) - 32] if 32 <= ord(c) < 127 else 700 for c in s) / 1000.0
    return em * size * (1.1 if bold else 1.0)


def wrap(s: str, size: float, width: float, bold: bool = False) -> list[str]:
    """``s`` cut at its spaces into lines of at most ``width`` (a word wider than that stays whole)."""
    lines: list[str] = []
    cur = ""
    for word in s.split():
        cand = f"{cur} {word}" if cur else word
        if cur and text_width(cand, size, bold) > width:
            lines.append(cur)
            cur = word
        else:
            cur = cand
    if cur or not lines:
        lines.append(cur)
    return lines


def ellipsize(s: str, size: float, width: float, bold: bool = False) -> str:
    """``s``, cut in the middle with an ellipsis when wider than ``width``."""
    if text_width(s, size, bold) <= width:
        return s
    keep = len(s)
    while keep > 4:
        keep -= 1
        head, tail = s[:(keep + 1) // 2], s[len(s) - keep // 2:]
        cut = f"{head}\u2026{tail}"
        if text_width(cut, size, bold) <= width:
            return cut
    return s[:4] + "\u2026"


# ----------------------------------------------------------------------------------------------------------------
# The scene and its two writers


class Scene:
    """Shapes and text in a ``w`` x ``h`` space of points (y down), in drawing order."""

    def __init__(self, w: float, h: float, title: str = ""):
        self.w, self.h, self.title = w, h, title
        self.items: list[tuple[str, dict[str, Any]]] = []

    def rect(self, x: float, y: float, w: float, h: float, fill: str | None, *, stroke: str | None = None,
             stroke_width: float = 1.0, opacity: float = 1.0, tip: str | None = None) -> None:
        if w > 0 and h > 0:
            self.items.append(("rect", dict(x=x, y=y, w=w, h=h, fill=fill, stroke=stroke, sw=stroke_width,
                                            opacity=opacity, tip=tip)))

    def poly(self, points: Sequence[tuple[float, float]], fill: str, *, opacity: float = 1.0) -> None:
        """A filled polygon (an uncertainty band), no outline."""
        if len(points) >= 3:
            self.items.append(("poly", dict(points=[(float(x), float(y)) for x, y in points], fill=fill,
                                            opacity=opacity)))

    def line(self, x1: float, y1: float, x2: float, y2: float, color: str, width: float = 1.0,
             dash: tuple[float, float] | None = None) -> None:
        self.items.append(("line", dict(x1=x1, y1=y1, x2=x2, y2=y2, color=color, width=width, dash=dash)))

    def text(self, x: float, y: float, s: str | Sequence[str], *, size: float = 11, color: str = INK,
             anchor: str = "start", bold: bool = False, rotate: float = 0.0, leading: float = 1.25,
             halo: bool = False, tip: str | None = None) -> None:
        """Text whose first line's baseline is at ``y``; ``anchor`` start/middle/end; ``rotate`` degrees
        counter-clockwise about (x, y); a list of strings is one text of several lines, each below the last
        (in the text's own direction); ``halo``: a white outline, to stay readable over lines."""
        lines = [clean(t) for t in ([s] if isinstance(s, str) else s)]
        self.items.append(("text", dict(x=x, y=y, lines=lines, size=size, color=color, anchor=anchor, bold=bold,
                                        rotate=rotate, leading=leading, halo=halo,
                                        tip=clean(tip) if tip else None)))

    def texts(self) -> list[str]:
        """Every text, its lines joined by a space (what a reader of the chart sees)."""
        return [" ".join(d["lines"]) for kind, d in self.items if kind == "text"]


_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")
_CONTROL = re.compile("[\x00-\x1f\x7f\ud800-\udfff\ufffe\uffff]")


def clean(s: str) -> str:
    """``s`` without terminal colour codes and control characters (which XML cannot hold), tabs and newlines
    as spaces."""
    return _CONTROL.sub("", _ANSI.sub("", str(s)).replace("\t", " ").replace("\n", " ").replace("\r", " "))


def _x(s: str) -> str:
    return escape(clean(s))


def _n(v: float) -> str:
    return f"{v:.2f}".rstrip("0").rstrip(".")


def to_svg(scene: Scene) -> bytes:
    """The scene as an SVG document (UTF-8)."""
    w, h = math.ceil(scene.w), math.ceil(scene.h)
    out = ['<?xml version="1.0" encoding="UTF-8"?>',
           f'<svg xmlns="http://www.w3.org/2000/svg" version="1.1" width="{w}" height="{h}" '
           f'viewBox="0 0 {w} {h}" font-family="{FONT}">']
    if scene.title:
        out.append(f"<title>{_x(scene.title)}</title>")
    out.append(f'<rect x="0" y="0" width="{w}" height="{h}" fill="{WHITE}"/>')
    for kind, d in scene.items:
        if kind == "rect":
            attrs = (f'x="{_n(d["x"])}" y="{_n(d["y"])}" width="{_n(d["w"])}" height="{_n(d["h"])}" '
                     f'fill="{d["fill"] or "none"}"')
            if d["stroke"]:
                attrs += f' stroke="{d["stroke"]}" stroke-width="{_n(d["sw"])}"'
            if d["opacity"] != 1.0:
                attrs += f' fill-opacity="{_n(d["opacity"])}"'
            if d["tip"]:
                out.append(f"<rect {attrs}><title>{_x(d['tip'])}</title></rect>")
            else:
                out.append(f"<rect {attrs}/>")
        elif kind == "poly":
            pts = " ".join(f"{_n(x)},{_n(y)}" for x, y in d["points"])
            op = f' fill-opacity="{_n(d["opacity"])}"' if d["opacity"] != 1.0 else ""
            out.append(f'<polygon points="{pts}" fill="{d["fill"]}"{op}/>')
        elif kind == "line":
            dash = f' stroke-dasharray="{_n(d["dash"][0])} {_n(d["dash"][1])}"' if d["dash"] else ""
            out.append(f'<line x1="{_n(d["x1"])}" y1="{_n(d["y1"])}" x2="{_n(d["x2"])}" y2="{_n(d["y2"])}" '
                       f'stroke="{d["color"]}" stroke-width="{_n(d["width"])}"{dash}/>')
        else:
            x, y = _n(d["x"]), _n(d["y"])
            attrs = (f'x="{x}" y="{y}" font-family="{FONT}" font-size="{_n(d["size"])}" '
                     f'text-anchor="{d["anchor"]}" fill="{d["color"]}"')
            if d["bold"]:
                attrs += ' font-weight="bold"'
            if d["halo"]:
                attrs += f' stroke="{WHITE}" stroke-width="3" stroke-linejoin="round" paint-order="stroke"'
            if d["rotate"]:
                attrs += f' transform="rotate({_n(-d["rotate"])} {x} {y})"'
            if len(d["lines"]) == 1:
                body = _x(d["lines"][0])
            else:
                dy = _n(d["size"] * d["leading"])
                body = "".join(f'<tspan x="{x}"{"" if i == 0 else f" dy={chr(34)}{dy}{chr(34)}"}>{_x(line)}</tspan>'
                               for i, line in enumerate(d["lines"]))
            if d["tip"]:
                body = f"<title>{_x(d['tip'])}</title>" + body
            out.append(f"<text {attrs}>{body}</text>")
    out.append("</svg>")
    return ("\n".join(out) + "\n").encode("utf-8")


def _matplotlib(path: str) -> Any:
    """matplotlib, or a UsageError that says how to get it."""
    try:
        import matplotlib  # noqa: F401
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: F401
        from matplotlib.figure import Figure  # noqa: F401
    except ImportError:
        raise UsageError(f"--chart {path}: a PNG chart needs matplotlib, which is not installed: "
                         f"{PNG_HINT}") from None
    return matplotlib


def to_png(scene: Scene, path: str = "chart.png", scale: float = 2.0) -> bytes:
    """The scene drawn by matplotlib as PNG, ``scale`` pixels per point; UsageError without matplotlib."""
    _matplotlib(path)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Polygon, Rectangle
    from matplotlib.patheffects import withStroke

    w, h = math.ceil(scene.w), math.ceil(scene.h)
    fig = Figure(figsize=(w / 72.0, h / 72.0), dpi=72, facecolor=WHITE)
    FigureCanvasAgg(fig)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, w)
    ax.set_ylim(h, 0)
    ax.set_axis_off()
    for z, (kind, d) in enumerate(scene.items):  # in the scene's order, as SVG paints
        if kind == "rect":
            ax.add_patch(Rectangle((d["x"], d["y"]), d["w"], d["h"], facecolor=d["fill"] or "none",
                                   edgecolor=d["stroke"] or "none", linewidth=d["sw"] if d["stroke"] else 0,
                                   alpha=None if d["opacity"] == 1.0 else d["opacity"], zorder=z))
        elif kind == "poly":
            ax.add_patch(Polygon(d["points"], closed=True, facecolor=d["fill"], edgecolor="none",
                                 alpha=None if d["opacity"] == 1.0 else d["opacity"], zorder=z))
        elif kind == "line":
            ax.plot([d["x1"], d["x2"]], [d["y1"], d["y2"]], color=d["color"], linewidth=d["width"],
                    linestyle=(0, d["dash"]) if d["dash"] else "-", solid_capstyle="butt",
                    dash_capstyle="butt", zorder=z)
        else:
            step = d["size"] * d["leading"]
            rad = math.radians(d["rotate"])
            for i, line in enumerate(d["lines"]):
                # the next line's baseline, down the text's own (rotated) y axis
                x = d["x"] + i * step * math.sin(rad)
                y = d["y"] + i * step * math.cos(rad)
                ax.text(x, y, line, fontsize=d["size"], color=d["color"], family=FONT,
                        fontweight="bold" if d["bold"] else "normal", ha={"start": "left", "middle": "center",
                                                                           "end": "right"}[d["anchor"]],
                        va="baseline", rotation=d["rotate"], rotation_mode="anchor", zorder=z, parse_math=False,
                        path_effects=[withStroke(linewidth=3, foreground=WHITE)] if d["halo"] else None)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=72 * scale, facecolor=WHITE)
    return buf.getvalue()


def _format_of(path: str) -> str:
    ext = os.path.splitext(path)[1].lower()
    if ext not in FORMATS:
        raise UsageError(f"--chart {path}: name the chart .svg (or .png, which needs matplotlib: "
                         f"pip install 'eaglepatch[plot]')")
    return ext[1:]


def check_chart_path(path: str) -> None:
    """Raise UsageError (one line) unless a chart can be written at ``path``: its folder exists, it ends in .svg
    or .png, and for .png matplotlib is installed. For the CLI to call before any work."""
    if not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        raise UsageError(f"--chart {path}: no such folder")
    if _format_of(path) == "png":
        _matplotlib(path)


def render_scene(scene: Scene, path: str) -> bytes:
    """The scene's bytes in the format ``path`` names (.svg or .png)."""
    return to_png(scene, path) if _format_of(path) == "png" else to_svg(scene)


def _write(data: bytes, path: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


# ----------------------------------------------------------------------------------------------------------------
# Axes


def nice_ticks(top: float, count: int = 5) -> list[float]:
    """Round tick values from 0 to at least ``top``, about ``count`` steps."""
    if not top or top <= 0 or not math.isfinite(top):
        top = 1.0
    raw = top / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw * 0.999)
    n = math.ceil(top / step - 1e-9)
    return [round(i * step, 10) for i in range(n + 1)]


def fmt_tick(v: float, ticks: Sequence[float]) -> str:
    step = ticks[1] - ticks[0] if len(ticks) > 1 else 1.0
    digits = max(0, -math.floor(math.log10(step) + 1e-9)) if step < 1 else (1 if step % 1 else 0)
    s = f"{v:,.{digits}f}"
    return s


def _axis(sc: Scene, left: float, top: float, width: float, height: float, ticks: Sequence[float],
          title: str, title_x: float) -> None:
    """Gridlines, tick labels and the y axis title of a plot area (no ticks: the axes alone, no scale)."""
    vmax = ticks[-1] if ticks else 1.0
    if not ticks:
        sc.line(left, top + height, left + width, top + height, AXIS, 1.0)
    for v in ticks:
        y = top + height - height * v / vmax
        sc.line(left, y, left + width, y, GRID if v else AXIS, 1.0)
        sc.text(left - 7, y + 4, fmt_tick(v, ticks), size=10.5, color=MUTED, anchor="end")
    sc.line(left, top, left, top + height, AXIS, 1.0)
    sc.text(title_x, top + height / 2, title, size=11.5, color=INK, anchor="middle", rotate=90)


def _wrap_to(s: str, size: float, count: int) -> list[str]:
    """``s`` cut at its spaces into at most ``count`` lines of about equal width (fewer when a word is wide)."""
    width = max([text_width(w, size) for w in s.split()] + [text_width(s, size) / count])
    while True:
        lines = wrap(s, size, width)
        if len(lines) <= count:
            return lines
        width *= 1.08


def _legend(sc: Scene, x0: float, y: float, width: float, items: Sequence[tuple[str, str, str]]) -> float:
    """Legend entries (kind "box", "whisker", "dash", "mark"; color; text) flowed from (x0, y) over ``width``;
    returns the y below them."""
    x = x0
    size = 10.5
    for kind, color, label in items:
        need = 22 + text_width(label, size) + 16
        if x > x0 and x + need > x0 + width:
            x, y = x0, y + 17
        if kind == "box":
            sc.rect(x, y - 9, 12, 12, color)
        elif kind == "whisker":
            sc.line(x + 6, y - 10, x + 6, y + 4, color, 1.3)
            sc.line(x + 2, y - 10, x + 10, y - 10, color, 1.3)
            sc.line(x + 2, y + 4, x + 10, y + 4, color, 1.3)
        elif kind == "dash":
            sc.line(x - 2, y - 3, x + 14, y - 3, color, 1.5, dash=(4, 3))
        elif kind == "mark":
            sc.line(x - 2, y - 3, x + 14, y - 3, color, 2.5)
        sc.text(x + 19, y + 1, label, size=size, color=INK)
        x += need
    return y + 10


def _title_block(sc: Scene, margin: float, width: float, title: str, subtitle: Sequence[str], y: float) -> float:
    sc.text(margin, y, ellipsize(title, 17, width, True), size=17, bold=True, tip=title)
    y += 8
    for line in subtitle:
        for part in wrap(line, 11.5, width):
            y += 16
            sc.text(margin, y, part, size=11.5, color=MUTED)
    return y


def _notes(sc: Scene, margin: float, width: float, notes: Sequence[str], y: float) -> float:
    for note in notes:
        for i, part in enumerate(wrap(f"note: {note}", 10.5, width)):
            y += 14 if i else 17
            sc.text(margin, y, part, size=10.5, color=MUTED)
    return y


# ----------------------------------------------------------------------------------------------------------------
# The sweep chart

LABEL_SIZE = 11.0
SLANT = 35.0


def _fnum(v: float, nd: int = 2) -> str:
    return f"{v:,.{nd}f}"


def _tps(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:,.1f}"


def sweep_scene(doc: Mapping[str, Any]) -> Scene:
    """Lay out the chart of a sweep summary (``tuning.sweep_summary.summarize``, the ``sweep --json`` object)."""
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
        wrapped = [_wrap_to(lab, LABEL_SIZE, max(1, int(slot * math.sin(rad) // step))) for lab in labels]
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
               f"; tok/s as the client saw it; phases: p50 ms over the decode steps"]
    else:
        repeat = doc.get("repeat") or 1
        sub = [f"{len(points)} point{'s' if len(points) != 1 else ''} \u00d7 {repeat} launch{'es' if repeat != 1 else ''}"
               f"; tok/s as the client saw it; phases: p50 ms over the decode steps"]
    if best is not None and 0 <= best < len(points):
        bp = points[best]
        if best == base:
            sub.append(f"best: the baseline, no speculation ({_tps(bp['tokens_per_s']['median'])} tok/s): no "
                       "speculative point beat it")
        else:
            sp = f", {bp['speedup']:.2f}\u00d7 the baseline" if bp.get("speedup") is not None else ""
            sub.append(f"best: {bp.get('label')} ({_tps(bp['tokens_per_s']['median'])} tok/s{sp})")
    if base is None:
        sub.append("no baseline point (sweep --baseline adds one): no speedups")
    elif not (0 <= base < len(points) and ok[base]):
        sub.append("the baseline did not run: no speedups")

    sc = Scene(W, 0, title=f"Sweep of {target}")
    y = _title_block(sc, margin, inner, f"Sweep of {target}", sub, 34)

    def slot_x(i: int) -> float:
        return left + i * slot + slot / 2

    # panel 1: tok/s
    y += 30
    sc.text(margin, y, "Throughput per point (tokens/s, higher is better)", size=13, bold=True)
    y = _legend(sc, left, y + 20, W - left - right, _tps_legend(doc, points, ok))
    top1 = y + 12
    _axis(sc, left, top1, n * slot, p1_h, tps_ticks, "tokens/s (client)", title_x)
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
        tip = f"{labels[i]}: {_tps(med)} tok/s median of {_measured(p)}, min {_tps(lo)}, " \
              f"max {_tps(hi)}" + (f", {p['speedup']:.3f}\u00d7 the baseline" if p.get("speedup") is not None else "")
        sc.rect(cx - bar_w / 2, y1(med), bar_w, y1(0) - y1(med), color, tip=tip)
        if hi > lo:
            sc.line(cx, y1(hi), cx, y1(lo), INK, 1.3)
            sc.line(cx - 7, y1(hi), cx + 7, y1(hi), INK, 1.3)
            sc.line(cx - 7, y1(lo), cx + 7, y1(lo), INK, 1.3)
        ty = min(y1(hi), y1(med)) - 5
        sc.text(cx, ty, _tps(med), size=10.5, color=MUTED, anchor="middle", halo=True)
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
                    tip="within noise of the best: its tok/s range overlaps the best point's")
    y = top1 + p1_h

    # panel 2: the phases
    if has_phases:
        y += 34
        sc.text(margin, y, "Time per decode step by phase (p50 ms, lower is better)", size=13, bold=True)
        y = _legend(sc, left, y + 20, W - left - right, _phase_legend())
        top2 = y + 12
        _axis(sc, left, top2, n * slot, p2_h, ms_ticks, "ms per step (p50)", title_x)
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
                txt = _fnum(v)
                if yb - ya >= 13 and text_width(txt, 9.5) + 4 <= bar_w:
                    sc.text(cx, (ya + yb) / 2 + 3.5, txt, size=9.5, color=WHITE, anchor="middle")
                acc += v
            top_y = y2(acc)
            cyc = ph.get("cycle")
            if cyc:
                sc.line(cx - bar_w / 2 - 5, y2(cyc), cx + bar_w / 2 + 5, y2(cyc), INK, 2.2)
                top_y = min(top_y, y2(cyc))
                sc.text(cx, top_y - 6, f"{_fnum(cyc)} ms", size=10.5, color=INK, anchor="middle", halo=True,
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
        msg = ("no per-phase timings: the target is not patched (eaglepatch apply TARGET first); tok/s and "
               "accept length are the client's") if any(ok) else "no point ran: no timings"
        for part in wrap(msg, 11.5, inner):
            y += 18
            sc.text(margin, y, part, size=11.5, color=MUTED)
    y = _notes(sc, margin, inner, _all_notes(doc, points), y + 8)
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
    _write(render_chart(doc, path), path)


# ----------------------------------------------------------------------------------------------------------------
# The compare chart


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
    y = _title_block(sc, margin, inner, title, sub, 34)
    y = _legend(sc, margin, y + 26, inner, [("box", colors[i], s) for i, s in enumerate(sources)])
    if not groups:
        y += 24
        sc.text(margin, y, "no phase timings to compare", size=12, color=MUTED)
    p_h = 200.0
    for (g, cats, rows), ticks in zip(groups, ticks_all):
        y += 30
        head = _group_title(g) or "all records"
        extra = []
        for metric, name, nd in (("n", "records", 0), ("accept_len", "accept length", 2),
                                 ("tokens_per_s", "tok/s", 0)):
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
        _axis(sc, left, top, width, p_h, ticks, "ms (p50)", left - tick_w - 24)
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
                sc.text(cx, ty, _fnum(v, 1 if v >= 10 else 2), size=9, color=INK, anchor="middle")
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
    _write(render_compare_chart(compare_json, path), path)
