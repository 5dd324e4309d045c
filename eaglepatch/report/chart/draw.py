"""The drawing primitives of eaglepatch's charts: a chart is laid out once as a ``Scene`` (rectangles, lines,
text in a coordinate space of points, y down) and written either as SVG, by hand (real ``<text>``,
``font-family="sans-serif"``, a ``viewBox``: no dependency), or as PNG, drawn by matplotlib (the optional extra
``pip install 'eaglepatch[plot]'``). The file name decides: ``.svg`` or ``.png``; ``check_chart_path`` says
before any work whether a name can be written.

Beside the scene: the palette, text metrics (widths, wrapping, ellipsis), and the parts every chart uses (axes,
legend, title block, notes). The charts themselves: ``eaglepatch.report.chart.compare`` (``report --compare``),
``eaglepatch.report.chart.predict`` (``report --predict``), ``eaglepatch.tuning.sweep_chart`` (``sweep``).
"""

from __future__ import annotations

import io
import math
import os
import re
from typing import Any, Sequence
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


def write_atomic(data: bytes, path: str) -> None:
    """Write ``data`` to ``path`` through a temporary file beside it and a rename (no half-written chart)."""
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
    """A tick's label, with as many decimals as the step between ``ticks`` needs."""
    step = ticks[1] - ticks[0] if len(ticks) > 1 else 1.0
    digits = max(0, -math.floor(math.log10(step) + 1e-9)) if step < 1 else (1 if step % 1 else 0)
    s = f"{v:,.{digits}f}"
    return s


def draw_axis(sc: Scene, left: float, top: float, width: float, height: float, ticks: Sequence[float],
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


def wrap_to(s: str, size: float, count: int) -> list[str]:
    """``s`` cut at its spaces into at most ``count`` lines of about equal width (fewer when a word is wide)."""
    width = max([text_width(w, size) for w in s.split()] + [text_width(s, size) / count])
    while True:
        lines = wrap(s, size, width)
        if len(lines) <= count:
            return lines
        width *= 1.08


def draw_legend(sc: Scene, x0: float, y: float, width: float, items: Sequence[tuple[str, str, str]]) -> float:
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


def draw_title_block(sc: Scene, margin: float, width: float, title: str, subtitle: Sequence[str],
                     y: float) -> float:
    """The title (bold, ellipsized) at baseline ``y`` and the subtitle lines wrapped below; returns the last y."""
    sc.text(margin, y, ellipsize(title, 17, width, True), size=17, bold=True, tip=title)
    y += 8
    for line in subtitle:
        for part in wrap(line, 11.5, width):
            y += 16
            sc.text(margin, y, part, size=11.5, color=MUTED)
    return y


def draw_notes(sc: Scene, margin: float, width: float, notes: Sequence[str], y: float) -> float:
    """Each note as ``note: ...`` wrapped below ``y``; returns the last y."""
    for note in notes:
        for i, part in enumerate(wrap(f"note: {note}", 10.5, width)):
            y += 14 if i else 17
            sc.text(margin, y, part, size=10.5, color=MUTED)
    return y


LABEL_SIZE = 11.0  # the labels under an x axis


def fmt_num(v: float, nd: int = 2) -> str:
    """``v`` with ``nd`` decimals and thousands separators: ``"1,234.50"``."""
    return f"{v:,.{nd}f}"


def fmt_tps(v: float) -> str:
    """A tok/s figure: no decimals from 100 up, one below."""
    return f"{v:,.0f}" if v >= 100 else f"{v:,.1f}"
