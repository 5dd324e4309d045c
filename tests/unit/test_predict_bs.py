"""Costs that follow the work and the best step count per batch size (eaglepatch/report/costs.py, predict_bs.py):
synthetic records with known token-dependent costs at several batch sizes in, the curve's coefficients, the
predictions and the crossover out, through the real aggregation (``aggregate(..., by="bs")``).

The CPU world of issue 38 is a world that can disagree with the model: its verify has a knee (flat while
memory-bound, then per token), its draft a forward per step with a square term, a plain decode costs less than verify at one token per
request (verify's mode of the forward costs more), and acceptance varies by prompt (two kinds of request) and by
position (each later position passes less often). A 5-step run whose traffic spans 1 to 64 requests at a time;
its truth: 2 steps best at 32 requests, no speculation best at 64 (by 24%).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from eaglepatch.report import aggregate
from eaglepatch.report import costs
from eaglepatch.report.predict_bs import (BaselinePoint, crossover, estimate_spread, for_runs, ladder,
                                          predict_by_bs)

approx = pytest.approx
T0 = 1764500000.0
FLAGS = {"speculative-algorithm": "EAGLE3", "speculative-num-steps": "5", "speculative-eagle-topk": "1",
         "speculative-num-draft-tokens": "6", "cuda-graph-max-bs": "64"}


def write(path: Path, items: list[Any]) -> str:
    path.write_text("".join(json.dumps(it) + "\n" for it in items))
    return str(path)


def header(flags: dict[str, Any] = FLAGS) -> dict[str, Any]:
    return {"v": 1, "kind": "run", "run": "r1", "t": T0, "host": "gpu1", "pid": 1, "rank": 0, "timer": "sync",
            "flags": flags}


def run_records(cost, accepts, batch_sizes, steps: int, cycles: int) -> list[dict[str, Any]]:
    """Decode records of one process: ``cycles`` cycles at each batch size in turn, phases priced by ``cost(phase,
    bs, steps)``, the scheduler's ``cost("rest", ...)`` between cycles, each request's tokens from
    ``accepts(request, steps)``."""
    out, t, req = [], T0, 0
    for bs in batch_sizes:
        for _ in range(cycles):
            ph = {p: cost(p, bs, steps) for p in ("draft", "verify", "draft_extend")}
            acs = [accepts(req + i, steps) for i in range(bs)]
            req += bs
            cyc = sum(ph.values())
            out.append({"v": 1, "t": round(t, 6), "host": "gpu1", "pid": 1, "rank": 0, "run": "r1",
                        "worker": "EAGLEWorker", "mode": "decode", "bs": bs, "cycle_ms": round(cyc, 6),
                        "timer": "sync", "phases": {k: round(v, 6) for k, v in ph.items()},
                        "accepted": sum(acs), "accepts": acs})
            t += (cyc + cost("rest", bs, steps)) / 1000.0
    return out


# -- a world linear in the tokens: the curve's coefficients by hand ------------------------------------------

LINEAR = {"draft": (0.2, 0.01), "verify": (1.5, 0.02), "draft_extend": (0.4, 0.005), "rest": (1.0, 0.03)}


def linear_cost(phase: str, bs: int, steps: int) -> float:
    """Each forward ``a + b x tokens``: the draft's once per step."""
    a, b = LINEAR[phase]
    return costs.forwards_of(phase, steps) * (a + b * costs.tokens_of(phase, bs, steps))


def test_the_curves_of_a_linear_world_are_its_own_coefficients(tmp_path):
    """Every request accepts 3 tokens at 3 steps; each forward's cost linear in its tokens (the draft's 3 forwards
    of the requests' tokens each): each curve's fixed and per-token cost come back as written (the rest is what the
    cadence holds beyond the phases: the time between cycles), its token range is the measured one, and a point
    priced inside it is ``fitted``, outside ``extrapolated``."""
    recs = run_records(linear_cost, lambda r, k: 3, (1, 4, 16), 3, 60)
    res = aggregate([write(tmp_path / "a.jsonl", [header(dict(FLAGS, **{"speculative-num-steps": "3",
                                                                          "speculative-num-draft-tokens": "4"})),
                                                  *recs])], by="bs")
    (out,) = for_runs(res).values()
    m = out.model
    for phase, (a, b) in LINEAR.items():
        # the rest within 2%: the process's first cycle has no gap before it, so the 1-request group's cadence
        # holds 59 gaps for 60 cycles
        tol = 0.02 if phase == "rest" else 2e-3
        assert m.curves[phase].fixed_ms == approx(a, abs=tol), phase
        assert m.curves[phase].per_token_ms == approx(b, rel=tol), phase
    assert (m.curves["verify"].lo, m.curves["verify"].hi) == (4, 64)  # 1 x 4 to 16 x 4 tokens
    assert (m.curves["draft"].lo, m.curves["draft"].hi) == (1, 16)  # one forward of the requests' tokens
    assert (m.curves["rest"].lo, m.curves["rest"].hi) == (1, 16)
    # 2 steps at 8 requests: verify 1.5 + 0.02 x 24, draft 2 x (0.2 + 0.01 x 8), extend 0.4 + 0.005 x 24, rest
    # 1.0 + 0.03 x 8: 1.98 + 0.56 + 0.52 + 1.24 = 4.30 ms; 3 tokens capped at 3: 8 x 3 / 4.30 ms
    row = next(r for r in out.rows if r.bs == 8)
    p2 = next(p for p in row.points if p.steps == 2)
    assert p2.cycle_ms == approx(4.30, abs=0.02) and p2.basis == "fitted"
    assert p2.tokens_per_s == approx(8 * 3 / 4.30 * 1000, rel=5e-3)
    # a measured batch size at the run's own steps: its own figures
    assert next(p for p in next(r for r in out.rows if r.bs == 4).points if p.steps == 3).basis == "measured"
    # 64 requests at 3 steps: verify at 256 tokens, beyond the 64 measured
    assert next(p for p in out.rows[-1].points if p.steps == 3).basis == "extrapolated"
    assert out.max_bs == 64 and [r.bs for r in out.rows] == [1, 2, 4, 8, 16, 32, 64]
    doc = out.to_json()
    assert doc["cost_model"]["verify"]["tokens"] == [4, 64]
    assert doc["crossover_bs"] is None or isinstance(doc["crossover_bs"], int)


def test_the_ladder_and_the_estimates_spread():
    assert ladder([3, 24], 48) == [1, 2, 3, 4, 8, 16, 24, 32, 48]
    assert estimate_spread(1) == 0.3 and estimate_spread(8) == 0.3
    assert estimate_spread(16) == approx(0.4) and estimate_spread(32) == 0.5
    assert estimate_spread(64) == 0.7 and estimate_spread(256) == 0.7


# -- the CPU world of issue 38 -------------------------------------------------------------------------------

def world_cost(phase: str, bs: int, steps: int) -> float:
    x = costs.tokens_of(phase, bs, steps)
    if phase == "verify":
        return max(2.5, 0.1 + 0.03 * x)  # a knee: flat while memory-bound, then per token
    if phase == "draft":  # a forward per step, with a square term the model's roofline does not have
        return steps * (0.08 + 0.005 * bs + 0.00005 * bs * bs)
    if phase == "draft_extend":
        return 0.4 + 0.006 * x
    return 1.2 + 0.02 * bs  # the scheduler, between cycles


def plain_cycle(bs: int) -> float:
    """A decode without speculation: a cheaper forward than verify's at one token per request, plus the rest."""
    return max(1.5, 0.5 + 0.005 * bs) + world_cost("rest", bs, 0)


RATES = (0.8, 0.5)  # the first position's pass rate of even and odd requests (two kinds of prompt)


def pass_rate(req: int, pos: int) -> float:
    return RATES[req % 2] * 0.93 ** pos


def world_accepts(seed: int):
    rng = random.Random(seed)

    def draw(req: int, steps: int) -> int:
        n = 1
        while n <= steps and rng.random() < pass_rate(req, n - 1):
            n += 1
        return n
    return draw


def true_accept(steps: int) -> float:
    out = 0.0
    for kind in range(2):
        reach, a = 1.0, 1.0
        for pos in range(steps):
            reach *= pass_rate(kind, pos)
            a += reach
        out += a / 2
    return out


def true_tps(bs: int, steps: int) -> float:
    if steps == 0:
        return bs / plain_cycle(bs) * 1000
    cyc = sum(world_cost(p, bs, steps) for p in ("draft", "verify", "draft_extend", "rest"))
    return bs * true_accept(steps) / cyc * 1000


def world_result(tmp_path: Path):
    recs = run_records(world_cost, world_accepts(7), (1, 2, 4, 8, 16, 32, 64), 5, 150)
    return aggregate([write(tmp_path / "w.jsonl", [header(), *recs])], by="bs")


def test_the_cpu_world_truth_is_what_the_issue_says():
    best = {bs: max(range(9), key=lambda j: true_tps(bs, j)) for bs in (32, 64)}
    assert best == {32: 2, 64: 0}
    assert true_tps(64, 0) / max(true_tps(64, j) for j in range(1, 9)) == approx(1.24, abs=0.01)


def test_the_cpu_world_with_no_speculation_measured_at_32_and_64(tmp_path):
    """With a launch without speculation measured at 32 and 64 requests (the world's plain decode, 2% spread): 2
    steps best at 32 and no speculation at 64, as in the world; every predicted step count within 5% of the truth
    at 8-64 requests. (The fit's own spreads run 0.3-0.5% here, narrower than the misses of the geometric
    continuation of acceptance beyond the 5 steps measured, while the world's rates keep falling: 6-8 steps at 8
    requests read 2-3% high.) Speculation stops paying from 64."""
    res = world_result(tmp_path)
    base = [BaselinePoint(bs, true_tps(bs, 0), 0.02) for bs in (32, 64)]
    out = predict_by_bs([(dict(g.key)["bs"], 5, g) for g in res.groups if g.mode == "decode"], max_bs=64,
                        baseline=base)
    rows = {r.bs: r for r in out.rows}
    assert rows[32].points[rows[32].best].steps == 2
    assert rows[64].points[rows[64].best].steps == 0
    assert rows[64].note is None  # no speculation measured there
    for bs in (8, 16, 32, 64):
        for p in rows[bs].points:
            if p.steps == 0:
                assert p.basis == "measured" if bs in (32, 64) else p.basis == "estimate"
                continue
            miss = abs(p.tokens_per_s / true_tps(bs, p.steps) - 1)
            assert miss <= 0.05, (bs, p, true_tps(bs, p.steps))
    assert out.crossover_bs == 64


def test_the_cpu_world_without_a_baseline_never_names_a_step_count_over_the_estimate_silently(tmp_path):
    """No launch without speculation: no speculation is an estimate at every batch size, its spread growing with
    the batch; wherever a step count is best, the row says only a baseline launch decides."""
    (out,) = for_runs(world_result(tmp_path)).values()
    for row in out.rows:
        zero = next(p for p in row.points if p.steps == 0)
        assert zero.basis == "estimate" and zero.spread == estimate_spread(row.bs)
        if row.points[row.best].steps > 0:
            assert row.note and "only a launch without speculation at this load decides" in row.note
    assert any("no speculation: estimated at every batch size" in n for n in out.notes)


def test_the_crossover_is_the_first_batch_size_from_which_no_step_count_pays():
    from eaglepatch.report.predict import Point
    from eaglepatch.report.predict_bs import BsRow

    def row(bs: int, zero: float, spec: float) -> BsRow:
        return BsRow(bs, (Point(0, 1, 1.0, 1.0, 0.0, zero, 0.1, "measured"),
                          Point(2, 3, 2.0, 1.0, 0.0, spec, 0.1, "fitted")), 0)
    # 1: 150 x 0.9 = 135 > 100 x 1.1 = 110 pays; 8: 120 x 0.9 = 108 < 110 does not; 16: 200 x 0.9 = 180 > 110 pays
    assert crossover([row(1, 100, 150), row(8, 100, 120), row(16, 100, 200)]) is None
    assert crossover([row(1, 100, 150), row(8, 100, 120), row(16, 100, 110)]) == 8
    assert crossover([row(1, 100, 100)]) == 1
    assert crossover([]) is None


def test_a_sweeps_ladder_gives_no_speculation_at_each_concurrency(tmp_path):
    """A sweep with --baseline over the ladder 32, 64 that also ran the records' 5 steps: no speculation at each
    concurrency is the records' own 5-step figure there times the sweep's ratio (client over client, so the two
    scales need not agree), basis measured; 16 is below the ladder: an estimate."""
    from eaglepatch.report.predict_bs import baselines_of

    def point(flags, loads):
        return {"flags": flags, "status": "ok", "tokens_per_s": {"median": loads[0][1], "min": loads[0][1],
                                                               "max": loads[0][1]},
                "loads": [{"concurrency": c, "tokens_per_s": {"median": t, "min": t * 0.98, "max": t * 1.02}}
                          for c, t in loads]}
    sweep = {"baseline": 0, "load": {"concurrency": 32},
             "points": [point({}, [(32, 8000.0), (64, 12000.0)]),
                        point({"speculative-num-steps": "5"}, [(32, 6400.0), (64, 6000.0)])]}
    base = baselines_of(sweep, 5)
    assert [(b.bs, b.tokens_per_s, b.ratio) for b in base] == [(32, 8000.0, 1.25), (64, 12000.0, 2.0)]
    assert base[0].spread == approx(0.02)
    (out,) = for_runs(world_result(tmp_path), sweep=sweep).values()
    rows = {r.bs: r for r in out.rows}
    z32 = rows[32].points[0]
    own32 = next(p for p in rows[32].points if p.steps == 5)
    assert z32.basis == "measured" and z32.tokens_per_s == approx(1.25 * own32.tokens_per_s)
    assert rows[16].points[0].basis == "estimate"


def test_no_speculation_between_two_measured_batch_sizes_is_interpolated():
    """Each cycle's time per batch linear in the batch between 32 (8,000 tok/s: 4 ms) and 64 (12,000: 5.33 ms):
    at 48, 4.67 ms, 10,286 tok/s, its spread halfway; outside them, none."""
    from eaglepatch.report.predict_bs import _baseline_at

    pts = [BaselinePoint(32, 8000.0, 0.02), BaselinePoint(64, 12000.0, 0.04)]
    b = _baseline_at(48, pts)
    assert b.tokens_per_s == approx(48 / (32 / 8000 + 0.5 * (64 / 12000 - 32 / 8000))) == approx(10285.7, abs=0.1)
    assert b.spread == approx(0.03)
    assert _baseline_at(16, pts) is None and _baseline_at(128, pts) is None


def test_a_baseline_from_one_launch_never_reads_0_percent():
    """One launch per point (min = max): the baseline's spread is the launch-to-launch floor (2%), not 0."""
    from eaglepatch.report.predict import LAUNCH_SPREAD, baseline_from_sweep
    from eaglepatch.report.predict_bs import baselines_of

    one = {"median": 4264.0, "min": 4264.0, "max": 4264.0}
    sweep = {"baseline": 0, "load": {"concurrency": 32},
             "points": [{"flags": {}, "status": "ok", "tokens_per_s": one,
                         "loads": [{"concurrency": 32, "tokens_per_s": one}]}]}
    assert LAUNCH_SPREAD == 0.02
    assert baseline_from_sweep(sweep, 5).spread == 0.02
    assert [b.spread for b in baselines_of(sweep, 5)] == [0.02]


def test_an_open_loop_sweep_is_no_baseline_at_its_cap():
    """A sweep of --request-rate at --concurrency 64: 64 caps what is in flight, it is not the batch size its
    figures were measured at, so no baseline point is read from it (neither its loads nor its one concurrency)."""
    from eaglepatch.report.predict_bs import baselines_of

    t = {"median": 4000.0, "min": 3900.0, "max": 4100.0}
    closed = {"baseline": 0, "load": {"concurrency": 64},
              "points": [{"flags": {}, "status": "ok", "tokens_per_s": t, "loads": [{"concurrency": 64,
                                                                                       "tokens_per_s": t}]}]}
    assert [b.bs for b in baselines_of(closed, 5)] == [64]
    rate = {"baseline": 0, "load": {"concurrency": 64, "request_rate": 8.0},
            "points": [{"flags": {}, "status": "ok", "tokens_per_s": t}]}
    assert baselines_of(rate, 5) == []
    ladder = {"baseline": 0, "load": {"concurrency": 64, "request_rate": 2.0, "request_rate_ladder": [2.0, 8.0]},
              "points": [{"flags": {}, "status": "ok", "tokens_per_s": t, "loads": [
                  {"concurrency": 64, "request_rate": 2.0, "tokens_per_s": t},
                  {"concurrency": 64, "request_rate": 8.0, "tokens_per_s": t}]}]}
    assert baselines_of(ladder, 5) == []


def test_the_chart_draws_tok_s_against_the_batch_size(tmp_path):
    """report --predict --chart: under the groups, per run with predict_by_bs, a line per step count against the
    batch size (a label each, "1 step", "no speculation"), the measured points filled and the crossover marked;
    a document without predict_by_bs has no such panel."""
    from eaglepatch.report.chart.draw import to_svg
    from eaglepatch.report.chart.predict import predict_scene

    res = world_result(tmp_path)
    base = [BaselinePoint(bs, true_tps(bs, 0), 0.02) for bs in (32, 64)]
    out = predict_by_bs([(dict(g.key)["bs"], 5, g) for g in res.groups if g.mode == "decode"], max_bs=64,
                        baseline=base)
    doc = {"sources": ["w.jsonl"], "groups": [], "runs": [dict(id="r1", **out.to_json())]}
    sc = predict_scene(doc)
    texts = sc.texts()
    assert "best step count per batch size (run r1)" in texts
    assert {"1 step", "2 steps", "8 steps", "no speculation"} <= set(texts)
    assert "speculation stops paying: 64" in texts
    tips = [it[1].get("tip") or "" for it in sc.items if it[0] == "rect"]
    assert any(t.startswith("measured: 5 steps at 32 requests") for t in tips)
    assert any(t.startswith("measured: 0 steps at 64 requests") for t in tips)
    svg = to_svg(sc).decode()
    assert "requests a cycle (batch size)" in svg
    assert "best step count per batch size" not in predict_scene({"groups": [], "runs": [{"id": "r"}]}).texts()


def test_a_live_sweeps_curve_stops_at_the_servers_own_batch_limit(tmp_path):
    """The live sweep reads the server's max_running_requests (sglang lowers it for a speculative launch: 48 on the
    H100 launched with --cuda-graph-max-bs 64) and prices batch sizes up to it, not the flags' 64: a tier above it
    would never run (the H100's emitted config put [0] at 49, where no batch ever came)."""
    import http.server
    import threading

    from eaglepatch.tuning.live_finish import curve_of, max_running_requests

    recs = run_records(world_cost, world_accepts(7), (1, 2, 4, 8, 16, 32), 5, 150)
    f = write(tmp_path / "w.jsonl", [header(dict(FLAGS, **{"cuda-graph-max-bs": "64"})), *recs])
    assert curve_of([f])["max_bs"] == 64
    capped = curve_of([f], 48)
    assert capped["max_bs"] == 48 and capped["predict_by_bs"][-1]["bs"] == 48

    docs = {"/get_server_info": {"max_running_requests": 48}}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            doc = docs.get(self.path)
            body = json.dumps(doc).encode() if doc is not None else b"not found"
            self.send_response(200 if doc is not None else 404)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        assert max_running_requests(url, None) == 48  # the older path, after /server_info's 404
        docs["/server_info"] = {"max_running_requests": 4096}
        assert max_running_requests(url, "k") == 4096
        docs["/server_info"] = {"max_running_requests": "many"}
        docs.pop("/get_server_info")
        assert max_running_requests(url, None) is None
    finally:
        srv.shutdown()
