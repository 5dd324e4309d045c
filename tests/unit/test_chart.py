"""The charts (eaglepatch/report/chart/, eaglepatch/tuning/sweep_chart.py): the sweep's two panels and the
``report --compare`` chart, as SVG (parsed back with ElementTree: the words and the bars a reader sees) and as PNG
through matplotlib; the clear error without matplotlib, before a sweep runs."""

from __future__ import annotations

import builtins
import json
import re
import struct
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from eaglepatch.report.chart import draw
from eaglepatch.report.chart.compare import render_compare_chart, write_compare_chart
from eaglepatch.report.chart.draw import check_chart_path
from eaglepatch.tuning import sweep_summary
from eaglepatch.tuning import sweep as sw
from eaglepatch.tuning.sweep_chart import render_chart, sweep_scene, write_chart
from eaglepatch.errors import ExitCode, UsageError
from eaglepatch.report import aggregate, compare

NS = "{http://www.w3.org/2000/svg}"
PH = {"draft": 3.1, "verify": 7.9, "draft_extend": 1.0, "cycle": 12.2}
GPU = Path(__file__).resolve().parents[2] / "docs" / "gpu"


def _run(p, rep, tps, acc=None, phases=None, status="ok", **kw):
    return dict({"point": p.key, "rep": rep, "status": status, "tokens_per_s": tps, "accept_len": acc,
                 "phases_p50": phases or {}}, **kw)


def _doc(baseline: bool = True, phases: dict | None = PH, repeat: int = 1) -> dict[str, Any]:
    """baseline (90.2), steps=1 (94.0, best), steps=2 (70.0), steps=3 failed."""
    pts = sw.make_points(sw.parse_grid(["speculative-num-steps=1,2,3"]), (), baseline)
    spec = pts[1:] if baseline else pts
    runs = [_run(spec[0], 0, 94.0, 2.9, phases), _run(spec[1], 0, 70.0, 3.3, phases),
            _run(spec[2], 0, None, status="failed", error="not ready within 900 s")]
    if baseline:
        runs.append(_run(pts[0], 0, 90.2))
    return sweep_summary.summarize("root@gpu1", pts, runs, baseline=baseline, repeat=repeat)


def _svg(data: bytes) -> ET.Element:
    root = ET.fromstring(data)  # valid XML, or this raises
    assert root.tag == f"{NS}svg"
    return root


def _text(el: ET.Element) -> str:
    """What a <text> shows: its own text and its tspans' (a <title> tooltip left out)."""
    parts = [el.text or ""]
    for ch in el:
        if ch.tag == f"{NS}tspan":
            parts.append(ch.text or "")
        parts.append(ch.tail or "")
    return " ".join(p.strip() for p in parts if p.strip())


def _texts(root: ET.Element) -> list[str]:
    return [_text(t) for t in root.iter(f"{NS}text")]


def _bars(root: ET.Element, fill: str) -> list[dict[str, float]]:
    """The bars of that colour: rectangles that say what they show (a <title>), legend swatches left out."""
    return [{k: float(r.get(k)) for k in ("x", "y", "width", "height")} for r in root.iter(f"{NS}rect")
            if r.get("fill") == fill and r.get("fill-opacity") is None and r.find(f"{NS}title") is not None]


# ----------------------------------------------------------------------------------------------------------------
# the sweep chart as SVG


def test_svg_is_valid_xml_with_real_text_two_panels_and_every_label():
    doc = _doc()
    data = render_chart(doc, "sweep.svg")
    assert data.startswith(b"<?xml")
    root = _svg(data)
    w, h = float(root.get("width")), float(root.get("height"))
    assert root.get("viewBox") == f"0 0 {root.get('width')} {root.get('height')}" and w >= 640 and h > 500
    texts = _texts(root)
    assert all(t.get("font-family") == "sans-serif" for t in root.iter(f"{NS}text"))
    assert "Sweep of root@gpu1" in texts  # the title names the target
    # two panels, each with its title and its own y axis title with units, and the shared x axis's title
    assert "Throughput per point (client tok/s, higher is better)" in texts
    assert "Time per decode step by phase (p50 ms, lower is better)" in texts
    x_title = "sweep point (flags and environment of the server's launch)"
    for axis in ("client tok/s", "ms per step (p50)", x_title):
        assert axis in texts
    for p in doc["points"]:  # every point's label, under its point
        assert p["label"] in texts
    # the speedups over the baseline, the best point marked, the legend
    assert [p["speedup"] for p in doc["points"]] == [1.0, 1.042, 0.776, None]
    for label in ("1.00\u00d7", "1.04\u00d7", "0.78\u00d7"):
        assert label in texts
    assert texts.count("best") == 1
    for legend in ("baseline (no speculation)", "baseline median", "speculative point", "best point", "draft",
                   "verify", "draft extend"):
        assert legend in texts
    # tick labels on both axes: tok/s up to 100 or more, ms up to 12.2 or more
    ticks = {t for t in texts if re.fullmatch(r"[\d,.]+", t)}
    assert {"0", "100"} <= ticks


def test_svg_bars_are_to_scale_on_their_own_axes():
    doc = _doc()
    root = _svg(render_chart(doc, "s.svg"))
    base, best, spec = _bars(root, draw.BASE), _bars(root, draw.BEST), _bars(root, draw.BAR)
    assert len(base) == 1 and len(best) == 1 and len(spec) == 1  # baseline, steps=1, steps=2; no bar when failed
    assert best[0]["height"] / base[0]["height"] == pytest.approx(94.0 / 90.2, rel=1e-3)
    assert spec[0]["height"] / base[0]["height"] == pytest.approx(70.0 / 90.2, rel=1e-3)
    bottom = base[0]["y"] + base[0]["height"]
    assert best[0]["y"] + best[0]["height"] == pytest.approx(bottom, abs=0.02) == spec[0]["y"] + spec[0]["height"]
    # the stacks: one segment per phase per point with timings, below the tok/s panel, on a ms scale
    segs = {name: _bars(root, color) for name, color in draw.PHASE_COLORS.items()}
    assert [len(s) for s in segs.values()] == [2, 2, 2]
    assert segs["verify"][0]["height"] / segs["draft"][0]["height"] == pytest.approx(7.9 / 3.1, rel=1e-3)
    assert min(r["y"] for s in segs.values() for r in s) > bottom
    # stacked: draft at the bottom, verify on it, draft extend on top
    d, v, e = segs["draft"][0], segs["verify"][0], segs["draft_extend"][0]
    assert v["y"] + v["height"] == pytest.approx(d["y"], abs=0.02)
    assert e["y"] + e["height"] == pytest.approx(v["y"], abs=0.02)
    assert "12.20 ms" in _texts(root)  # the whole cycle, marked and labelled


def test_failed_points_are_shown_failed_not_as_zero_bars():
    doc = _doc()
    root = _svg(render_chart(doc, "s.svg"))
    texts = _texts(root)
    assert texts.count("failed") == 2  # in both panels
    assert "not ready within 900 s" in texts
    assert any("failed: speculative-num-steps=3: not ready within 900 s" in t for t in texts)
    bands = [r for r in root.iter(f"{NS}rect") if r.get("fill") == draw.FAIL]
    assert all("not ready within 900 s" in r.find(f"{NS}title").text for r in bands)
    assert len(bands) == 2 and all(r.get("fill-opacity") for r in bands)
    # the failed point's slot holds no bar: 3 tok/s bars for 4 points
    assert sum(len(_bars(root, c)) for c in (draw.BASE, draw.BAR, draw.BEST)) == 3


def test_sweep_without_baseline_has_no_speedups():
    doc = _doc(baseline=False)
    root = _svg(render_chart(doc, "s.svg"))
    texts = _texts(root)
    assert not [t for t in texts if re.fullmatch(r"\d+\.\d\d\u00d7", t)]
    assert "no baseline point (sweep --baseline adds one): no speedups" in texts
    assert not _bars(root, draw.BASE)
    assert not [ln for ln in root.iter(f"{NS}line") if ln.get("stroke-dasharray") and ln.get("stroke") == draw.INK
                and float(ln.get("x2")) - float(ln.get("x1")) > 100]  # no baseline median line
    assert "sweep point" in texts and "baseline median" not in texts
    assert {p["label"] for p in doc["points"]} <= set(texts)


def test_sweep_without_phases_says_so_instead_of_stacks():
    doc = _doc(phases=None)
    assert doc["notes"] and any(n.startswith("no per-phase timings") for n in doc["notes"])
    root = _svg(render_chart(doc, "s.svg"))
    texts = _texts(root)
    assert not any(_bars(root, c) for c in draw.PHASE_COLORS.values())
    assert "ms per step (p50)" not in texts
    said = " ".join(texts)
    assert said.count("the target is not patched") == 1  # said once, not again as a note
    assert "Throughput per point (client tok/s, higher is better)" in texts
    assert {p["label"] for p in doc["points"]} <= set(texts)


def test_many_long_labels_are_slanted_and_kept_whole():
    flags = sw.parse_grid(["speculative-num-steps=1,2,3,5", "speculative-eagle-topk=1,4"])
    pts = sw.make_points(flags, sw.parse_env_grid(["NCCL_ALGO=Ring,Tree"]), baseline=True)
    runs = [_run(p, 0, 1000.0 + 10 * i, 3.0, None if i == 0 else PH) for i, p in enumerate(pts)]
    doc = sweep_summary.summarize("t", pts, runs, baseline=True, repeat=1)
    root = _svg(render_chart(doc, "s.svg"))
    slanted = [t for t in root.iter(f"{NS}text") if (t.get("transform") or "").startswith("rotate(-35 ")]
    assert len(slanted) == len(pts)
    assert {_text(t) for t in slanted} == {p.label for p in pts}
    # no slanted label starts left of the picture: its width along the slant, from its anchor
    for t in slanted:
        lines = [ts.text for ts in t.iter(f"{NS}tspan")] or [t.text]
        reach = max(draw.text_width(s, float(t.get("font-size"))) for s in lines) * 0.82
        assert float(t.get("x")) - reach > 0
    assert float(root.get("width")) < 1600


def test_text_is_escaped_and_terminal_codes_dropped():
    pts = sw.make_points(sw.parse_grid(["speculative-num-steps=1"]), sw.parse_env_grid(["X=<a&b>"]), False)
    runs = [_run(pts[0], 0, None, status="failed", error="boom \x1b[31mred\x1b[0m \x00 <tag> & \"q\"")]
    doc = sweep_summary.summarize('host<&>"', pts, runs, baseline=False, repeat=1)
    data = render_chart(doc, "s.svg")
    assert b"\x1b" not in data and b"\x00" not in data and b"[31m" not in data
    texts = _texts(_svg(data))
    assert 'Sweep of host<&>"' in texts
    assert "speculative-num-steps=1 X=<a&b>" in texts
    assert any('boom red <tag> & "q"' in t for t in texts)


def test_real_h200_sweeps_render(tmp_path):
    for name in ("sweep_agree", "sweep_rand", "sweep_repeat_agree", "sweep_repeat_rand"):
        doc = json.loads((GPU / f"{name}.json").read_text())
        out = tmp_path / f"{name}.svg"
        write_chart(doc, str(out))
        texts = _texts(_svg(out.read_bytes()))
        assert f"Sweep of {doc['target']}" in texts
        assert {p["label"] for p in doc["points"]} <= set(texts)
        for p in doc["points"]:
            assert f"{round(p['speedup'], 2):.2f}\u00d7" in texts
    # the repeated sweeps have ranges: whiskers and their legend
    texts = _texts(_svg((tmp_path / "sweep_repeat_agree.svg").read_bytes()))
    assert "min-max over the launches (bar: median)" in texts and "best" in texts


# ----------------------------------------------------------------------------------------------------------------
# PNG, and the chart's file name


def test_png_through_matplotlib(tmp_path):
    pytest.importorskip("matplotlib")
    from PIL import Image

    path = tmp_path / "sweep.png"
    write_chart(_doc(), str(path))
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    w, h = struct.unpack(">II", data[16:24])
    scene = sweep_scene(_doc())
    assert (w, h) == (pytest.approx(2 * scene.w, abs=2), pytest.approx(2 * scene.h, abs=2))
    colors = {c for _n, c in Image.open(path).convert("RGB").getcolors(maxcolors=1 << 20)}

    def rgb(hex_: str) -> tuple[int, int, int]:
        return tuple(int(hex_[i:i + 2], 16) for i in (1, 3, 5))

    for c in (draw.BEST, draw.BASE, draw.PHASE_COLORS["verify"], draw.PHASE_COLORS["draft"]):
        assert rgb(c) in colors


def _hide_matplotlib(monkeypatch):
    real = builtins.__import__

    def fake(name, *a, **kw):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError(f"No module named {name!r}")
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", fake)


def test_png_without_matplotlib_is_one_clear_usage_error(monkeypatch, tmp_path):
    _hide_matplotlib(monkeypatch)
    png = str(tmp_path / "sweep.png")
    with pytest.raises(UsageError) as exc:
        check_chart_path(png)
    msg = str(exc.value)
    assert "\n" not in msg and "matplotlib" in msg and "pip install 'eaglepatch[plot]'" in msg and ".svg" in msg
    assert exc.value.exit_code == ExitCode.USAGE == 2
    with pytest.raises(UsageError, match="eaglepatch\\[plot\\]"):
        write_chart(_doc(), png)
    assert not (tmp_path / "sweep.png").exists()
    # SVG needs nothing
    check_chart_path(str(tmp_path / "sweep.svg"))
    write_chart(_doc(), str(tmp_path / "sweep.svg"))
    _svg((tmp_path / "sweep.svg").read_bytes())


def test_check_chart_path_folder_and_extension(tmp_path):
    check_chart_path(str(tmp_path / "a.SVG"))
    with pytest.raises(UsageError, match="no such folder"):
        check_chart_path(str(tmp_path / "nope" / "a.svg"))
    for bad in ("a.jpg", "a", "a.svg.txt"):
        with pytest.raises(UsageError, match="name the chart .svg"):
            check_chart_path(str(tmp_path / bad))
    with pytest.raises(UsageError, match="name the chart .svg"):
        render_chart(_doc(), "chart.pdf")


def test_sweep_cli_refuses_a_png_chart_without_matplotlib_before_it_runs(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from eaglepatch import cli, cli_output

    def touched(*a, **kw):
        raise AssertionError("the target was touched")

    monkeypatch.setattr(cli_output, "check_targets", touched)
    _hide_matplotlib(monkeypatch)
    res = CliRunner().invoke(cli.app, ["sweep", str(tmp_path), "--grid", "speculative-num-steps=1,2",
                                       "--chart", str(tmp_path / "s.png")])
    assert res.exit_code == 2, res.output
    assert "eaglepatch[plot]" in res.output


# ----------------------------------------------------------------------------------------------------------------
# the compare chart


def _rec(t: float, cycle: float, phases: dict[str, float], mode: str = "decode") -> dict[str, Any]:
    return {"v": 1, "t": t, "host": "gpu1", "pid": 4242, "rank": 0, "worker": "EAGLEWorker", "mode": mode,
            "bs": 1, "cycle_ms": cycle, "timer": "sync", "phases": phases, "accepted": 2}


def _log(path: Path, recs: list[dict[str, Any]]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return str(path)


def _compare(tmp_path: Path):
    t0 = 1764500000.0
    before = _log(tmp_path / "before" / "a.jsonl",
                  [_rec(t0 + i * 0.012, 10.0, {"draft": 4.0, "verify": 5.0, "draft_extend": 1.0}) for i in range(3)])
    after = _log(tmp_path / "after" / "a.jsonl",
                 [_rec(t0 + i * 0.01, 8.0, {"draft": 3.0, "verify": 4.0, "draft_extend": 1.0}) for i in range(3)]
                 + [_rec(t0 + 10, 30.0, {"target": 30.0}, mode="prefill")])
    return compare([aggregate([before]), aggregate([after])], ["before", "after"])


def test_compare_chart_groups_the_phases_per_source(tmp_path):
    result = _compare(tmp_path)
    doc = result.to_json()
    root = _svg(render_compare_chart(doc, "c.svg"))
    texts = _texts(root)
    assert "Phase times per source: before vs after" in texts
    for words in ("before", "after", "decode", "prefill", "draft", "verify", "draft extend",
                  "whole cycle", "target", "ms (p50)"):
        assert words in texts, words
    # decode: 4 categories x 2 sources; prefill: target and cycle, "after" only
    blue, orange = _bars(root, draw.SOURCE_COLORS[0]), _bars(root, draw.SOURCE_COLORS[1])
    assert len(blue) == 4 and len(orange) == 4 + 2
    assert texts.count("n/a") == 2
    for label in ("4.00", "3.00", "-25%", "-20%", "10.0", "8.00", "+0%"):
        assert label in texts, label
    bars = sorted(blue, key=lambda r: r["y"] + r["height"])[:4], sorted(orange, key=lambda r: r["y"] + r["height"])[:4]
    bars = sorted(bars[0], key=lambda r: r["x"]), sorted(bars[1], key=lambda r: r["x"])
    assert bars[1][0]["height"] / bars[0][0]["height"] == pytest.approx(3.0 / 4.0, rel=1e-3)  # draft
    assert bars[0][3]["height"] / bars[0][0]["height"] == pytest.approx(10.0 / 4.0, rel=1e-3)  # cycle
    # the CompareResult itself is taken too, and a file written
    assert render_compare_chart(result, "c.svg") == render_compare_chart(doc, "c.svg")
    write_compare_chart(doc, str(tmp_path / "c.svg"))
    _svg((tmp_path / "c.svg").read_bytes())


def test_compare_chart_without_phases_and_as_png(tmp_path):
    doc = {"sources": ["a", "b"], "groups": [{"mode": "decode", "key": {}, "rows": [
        {"metric": "n", "values": [3, 4], "delta_pct": [None, 33.33]}]}], "columns": []}
    texts = _texts(_svg(render_compare_chart(doc, "c.svg")))
    assert "no phase timings to compare" in texts and "ms (p50)" not in texts
    pytest.importorskip("matplotlib")
    write_compare_chart(_compare(tmp_path).to_json(), str(tmp_path / "c.png"))
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
