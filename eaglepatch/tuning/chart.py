"""The sweep chart: per point, a bar of the median tok/s (with its min-max range) and a stacked bar of the p50 of
draft, verify and draft extend. Written as SVG when the file name ends in ``.svg``, else as PNG.

No plotting library: one layout (rectangles and text) rendered either to SVG text or to pixels, which a small PNG
writer (zlib + struct) encodes. PNG text uses a 3x5 pixel font (upper case, digits and a few signs), scaled.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any, Mapping

Color = tuple[int, int, int]
WHITE: Color = (255, 255, 255)
BLACK: Color = (30, 30, 30)
GREY: Color = (200, 200, 200)
TPS: Color = (70, 110, 190)
BEST: Color = (40, 150, 70)
FAILED: Color = (200, 60, 60)
PHASE_COLORS: dict[str, Color] = {"draft": (240, 170, 60), "verify": (150, 90, 190), "draft_extend": (90, 180, 190)}

# A 3x5 font: five rows of three pixels per glyph ('#' on). Lower case letters are drawn as upper case; a sign
# not here as '?'.
_FONT = {
    "A": ".#. #.# ### #.# #.#", "B": "##. #.# ##. #.# ##.", "C": ".## #.. #.. #.. .##", "D": "##. #.# #.# #.# ##.",
    "E": "### #.. ##. #.. ###", "F": "### #.. ##. #.. #..", "G": ".## #.. #.# #.# .##", "H": "#.# #.# ### #.# #.#",
    "I": "### .#. .#. .#. ###", "J": "..# ..# ..# #.# .#.", "K": "#.# #.# ##. #.# #.#", "L": "#.. #.. #.. #.. ###",
    "M": "#.# ### ### #.# #.#", "N": "##. #.# #.# #.# #.#", "O": ".#. #.# #.# #.# .#.", "P": "##. #.# ##. #.. #..",
    "Q": ".#. #.# #.# ##. .##", "R": "##. #.# ##. #.# #.#", "S": ".## #.. .#. ..# ##.", "T": "### .#. .#. .#. .#.",
    "U": "#.# #.# #.# #.# ###", "V": "#.# #.# #.# #.# .#.", "W": "#.# #.# ### ### #.#", "X": "#.# #.# .#. #.# #.#",
    "Y": "#.# #.# .#. .#. .#.", "Z": "### ..# .#. #.. ###",
    "0": "### #.# #.# #.# ###", "1": ".#. ##. .#. .#. ###", "2": "##. ..# .#. #.. ###", "3": "##. ..# .#. ..# ##.",
    "4": "#.# #.# ### ..# ..#", "5": "### #.. ##. ..# ##.", "6": ".## #.. ### #.# ###", "7": "### ..# .#. .#. .#.",
    "8": "### #.# ### #.# ###", "9": "### #.# ### ..# ##.",
    ".": "... ... ... ... .#.", ",": "... ... ... .#. #..", "-": "... ... ### ... ...", "=": "... ### ... ### ...",
    "_": "... ... ... ... ###", ":": "... .#. ... .#. ...", ";": "... .#. ... .#. #..", "(": ".#. #.. #.. #.. .#.",
    ")": ".#. ..# ..# ..# .#.", "/": "..# ..# .#. #.. #..", "*": "#.# .#. #.# ... ...", "~": "... .## ##. ... ...",
    "%": "#.# ..# .#. #.. #.#", "+": "... .#. ### .#. ...", "#": "#.# ### #.# ### #.#", "?": "##. ..# .#. ... .#.",
    " ": "... ... ... ... ...",
}


def _glyph(ch: str) -> list[str]:
    return (_FONT.get(ch) or _FONT.get(ch.upper()) or _FONT["?"]).split()


class Canvas:
    """An RGB pixel buffer with rectangles and 3x5-font text, encoded as PNG."""

    def __init__(self, width: int, height: int, bg: Color = WHITE):
        self.w, self.h = width, height
        self.px = bytearray(bytes(bg) * (width * height))

    def rect(self, x: float, y: float, w: float, h: float, color: Color) -> None:
        x0, y0 = max(0, int(round(x))), max(0, int(round(y)))
        x1, y1 = min(self.w, int(round(x + w))), min(self.h, int(round(y + h)))
        if x1 <= x0 or y1 <= y0:
            return
        row = bytes(color) * (x1 - x0)
        for yy in range(y0, y1):
            i = (yy * self.w + x0) * 3
            self.px[i:i + len(row)] = row

    def text(self, x: float, y: float, s: str, color: Color = BLACK, scale: int = 2, anchor: str = "start") -> None:
        width = len(s) * 4 * scale
        if anchor == "middle":
            x -= width / 2
        elif anchor == "end":
            x -= width
        for n, ch in enumerate(s):
            for r, row in enumerate(_glyph(ch)):
                for c, on in enumerate(row):
                    if on == "#":
                        self.rect(x + (n * 4 + c) * scale, y + r * scale, scale, scale, color)

    def png(self) -> bytes:
        raw = bytearray()
        stride = self.w * 3
        for y in range(self.h):
            raw.append(0)  # filter: none
            raw += self.px[y * stride:(y + 1) * stride]

        def chunk(kind: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

        head = struct.pack(">IIBBBBB", self.w, self.h, 8, 2, 0, 0, 0)
        return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", head) + chunk(b"IDAT", zlib.compress(bytes(raw), 9))
                + chunk(b"IEND", b""))


class _Svg:
    def __init__(self, width: int, height: int):
        self.w, self.h = width, height
        self.items: list[str] = [f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>']

    def rect(self, x: float, y: float, w: float, h: float, color: Color) -> None:
        if w > 0 and h > 0:
            self.items.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" '
                              f'fill="rgb{color}"/>')

    def text(self, x: float, y: float, s: str, color: Color = BLACK, scale: int = 2, anchor: str = "start") -> None:
        esc = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        self.items.append(f'<text x="{x:.1f}" y="{y + 5 * scale:.1f}" font-family="sans-serif" '
                          f'font-size="{6 * scale}" text-anchor="{anchor}" fill="rgb{color}">{esc}</text>')

    def svg(self) -> bytes:
        return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.w}" height="{self.h}" '
                f'viewBox="0 0 {self.w} {self.h}">' + "".join(self.items) + "</svg>\n").encode()


def _nice(x: float) -> float:
    """A round number at or above ``x`` for an axis maximum."""
    if x <= 0:
        return 1.0
    mag = 10 ** len(str(int(x))) / 10
    for m in (1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        if m * mag >= x:
            return m * mag
    return 10 * mag


def draw(doc: Mapping[str, Any], out: Any) -> None:
    """Lay the sweep summary ``doc`` (``eaglepatch.sweep.summarize``) out on ``out`` (a Canvas or an _Svg)."""
    points = doc["points"]
    left, top, plot_h = 60, 40, 220
    slot = 90
    ml = 8
    w = out.w
    base_y = top + plot_h
    tps_max = _nice(max([(p.get("tokens_per_s") or {}).get("max") or 0 for p in points] + [1]))
    cyc_max = _nice(max([sum((p.get("phases_p50") or {}).get(k, 0) for k in PHASE_COLORS) for p in points] + [0]))
    out.text(left, 8, "TOK/S PER POINT (BARS: MEDIAN, MIN-MAX) AND P50 MS OF THE PHASES (STACKS)", BLACK, 2)
    out.rect(left - 2, top, 2, plot_h, BLACK)
    out.rect(left - 2, base_y, w - left - 10, 2, BLACK)
    for frac in (0.5, 1.0):
        y = base_y - plot_h * frac
        out.rect(left, y, w - left - 10, 1, GREY)
        out.text(left - 6, y - 5, f"{tps_max * frac:g}", BLACK, 2, anchor="end")
    for i, p in enumerate(points):
        x = left + ml + i * slot
        tps = p.get("tokens_per_s") or {}
        if p.get("status") != "ok" or not tps:
            out.text(x + 20, base_y - 20, "FAILED" if p.get("status") == "failed" else "-", FAILED, 2)
        else:
            color = BEST if i == doc.get("best") else TPS
            bh = plot_h * tps["median"] / tps_max
            out.rect(x, base_y - bh, 34, bh, color)
            lo, hi = plot_h * tps["min"] / tps_max, plot_h * tps["max"] / tps_max
            out.rect(x + 16, base_y - hi, 2, max(1.0, hi - lo), BLACK)
            out.rect(x + 11, base_y - hi, 12, 2, BLACK)
            out.rect(x + 11, base_y - lo, 12, 2, BLACK)
            out.text(x + 17, base_y - hi - 14, f"{tps['median']:.0f}", BLACK, 2, anchor="middle")
            ph = p.get("phases_p50") or {}
            y = base_y
            for name, col in PHASE_COLORS.items():
                if ph.get(name) and cyc_max > 0:
                    seg = plot_h * ph[name] / cyc_max
                    out.rect(x + 40, y - seg, 34, seg, col)
                    y -= seg
        out.text(x + 37, base_y + 8, f"{i}", BLACK, 2, anchor="middle")
        if p.get("speedup") is not None:
            out.text(x + 37, base_y + 22, f"{p['speedup']:.2f}x", BLACK, 2, anchor="middle")
    # legend: what each index is
    y = base_y + 44
    out.text(left, y, f"BARS: TOK/S (AXIS 0-{tps_max:g}); STACKS: MS (TOP = {cyc_max:g} MS)", BLACK, 2)
    lx = left
    for name, col in PHASE_COLORS.items():
        out.rect(lx, y + 16, 10, 10, col)
        out.text(lx + 14, y + 16, name.replace("_", " "), BLACK, 2)
        lx += 14 + (len(name) + 2) * 8
    for i, p in enumerate(points):
        best = "  (BEST)" if i == doc.get("best") else ""
        out.text(left, y + 36 + i * 14, f"{i}: {p.get('label', '')}{best}"[:110], BLACK, 2)


def chart_size(doc: Mapping[str, Any]) -> tuple[int, int]:
    n = len(doc["points"])
    return max(680, 60 + 8 + n * 90 + 20), 40 + 220 + 44 + 40 + n * 14 + 10


def render_chart(doc: Mapping[str, Any], path: str) -> bytes:
    """The chart's bytes for ``path``: SVG when it ends in ``.svg``, else PNG."""
    w, h = chart_size(doc)
    if path.lower().endswith(".svg"):
        svg = _Svg(w, h)
        draw(doc, svg)
        return svg.svg()
    canvas = Canvas(w, h)
    draw(doc, canvas)
    return canvas.png()


def write_chart(doc: Mapping[str, Any], path: str) -> None:
    data = render_chart(doc, path)
    with open(path, "wb") as f:
        f.write(data)
