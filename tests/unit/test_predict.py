"""The acceptance profile, the wall time a client sees, and the prediction of other step counts
(eaglepatch/report/: scan.py, groups.py, predict.py): synthetic records with known per-position
acceptance and known phase costs in, the numbers computed by hand out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from eaglepatch.errors import UsageError
from eaglepatch.report import aggregate, render_table
from eaglepatch.report.predict import Baseline, baseline_from_sweep, parse_steps, predict, predict_group, shape_of
from eaglepatch.report.chart.predict import predict_scene, write_predict_chart

approx = pytest.approx
T0 = 1764500000.0
FLAGS = {"speculative-algorithm": "EAGLE3", "speculative-num-steps": "3", "speculative-eagle-topk": "1",
         "speculative-num-draft-tokens": "4"}
# 8 request-cycles: tokens 1, 2, 2, 3, 3, 4, 4, 4 -> at least 1: 8/8, 2: 7/8, 3: 5/8, 4: 3/8
COUNTS = (1, 2, 2, 3, 3, 4, 4, 4)


def header(run: str = "r1", flags: dict[str, Any] | None = None, timer: str = "sync") -> dict[str, Any]:
    return {"v": 1, "kind": "run", "run": run, "t": T0, "host": "gpu1", "pid": 1, "rank": 0, "timer": timer,
            "flags": FLAGS if flags is None else flags}


def records(counts=COUNTS, repeat: int = 10, *, cycle: float = 6.5, gap: float = 1.5, run: str = "r1",
            phases: dict[str, float] | None = None, host: tuple[float, dict[str, float]] | None = None,
            spec: dict[str, int] | None = None, t0: float = T0, bs: int = 1) -> list[dict[str, Any]]:
    """Decode records of one process, one per cycle, each cycle's requests taking ``counts`` in turn; the next
    cycle starts ``gap`` ms after this one ends (by the host clock: ``host`` when given, else ``cycle``)."""
    out, t, i = [], t0, 0
    phases = phases or {"draft": 3.0, "verify": 2.0, "draft_extend": 1.0}
    for _ in range(repeat * len(counts) // bs):
        acs = [counts[(i + j) % len(counts)] for j in range(bs)]
        i += bs
        r = {"v": 1, "t": round(t, 6), "host": "gpu1", "pid": 1, "rank": 0, "run": run, "worker": "EAGLEWorker",
             "mode": "decode", "bs": bs, "cycle_ms": cycle, "timer": "events" if host else "sync",
             "phases": phases, "accepted": sum(acs), "accepts": acs}
        if host:
            r["host_cycle_ms"], r["host_phases"] = host
        if spec:
            r["spec"] = spec
        out.append(r)
        t += ((host[0] if host else cycle) + gap) / 1000.0
    return out


def write(path: Path, items: list[Any]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((it if isinstance(it, str) else json.dumps(it)) + "\n" for it in items))
    return str(path)


# ----------------------------------------------------------------------------------------------------------------
# The acceptance profile


def test_the_acceptance_profile_by_hand(tmp_path):
    """Two requests a cycle: 1+2, 3+1, 4+2, 2+2 tokens: 8 request-cycles, at least 1: 1, 2: 6/8, 3: 2/8, 4: 1/8;
    the per-position rates 6/8, 2/6, 1/2; their sum is the accept length."""
    recs = [dict(r, accepts=a, accepted=sum(a), bs=2) for r, a in
            zip(records(repeat=1)[:4], ([1, 2], [3, 1], [4, 2], [2, 2]))]
    res = aggregate([write(tmp_path / "a.jsonl", recs)])
    (g,) = res.groups
    acc = g.acceptance
    assert acc.samples == 8 and acc.at_least == (1.0, 0.75, 0.25, 0.125)
    assert acc.rates == approx((0.75, 1 / 3, 0.5))
    assert sum(acc.at_least) == approx(g.accept_len) == 17 / 8
    assert acc.mean_tokens(2) == approx(1.75)  # each capped at 2 tokens: what 1 step would have produced
    assert g.to_json()["acceptance"] == {"samples": 8, "at_least": [1.0, 0.75, 0.25, 0.125],
                                         "rates": [0.75, 0.3333, 0.5]}
    line = [ln for ln in render_table(res).splitlines() if ln.startswith("acceptance")]
    assert line == ["acceptance (8 request-cycles): at least 1: 1.00  2: 0.75  3: 0.25  4: 0.12; per position "
                    "0.75 0.33 0.50"]


def test_a_histogram_counts_like_its_list(tmp_path):
    """Above 256 requests the runtime writes accept_hist; it adds to the same profile as accepts lists."""
    recs = records(repeat=1)[:2]
    recs[0] = dict(recs[0], accepts=None, accept_hist={"1": 3, "4": 1}, bs=4)  # no more requests than bs
    del recs[0]["accepts"]
    recs[1] = dict(recs[1], accepts=[2, 2], bs=2)
    (g,) = aggregate([write(tmp_path / "a.jsonl", recs)]).groups
    assert g.acceptance.samples == 6 and dict(g.acceptance.hist) == {1: 3, 2: 2, 4: 1}


def test_records_without_accepts_have_no_profile(tmp_path):
    recs = records(repeat=1)
    for r in recs:
        del r["accepts"]
    (g,) = aggregate([write(tmp_path / "a.jsonl", recs)]).groups
    assert g.acceptance is None and "acceptance" not in g.to_json()
    assert not [ln for ln in render_table(aggregate([str(tmp_path / "a.jsonl")])).splitlines()
                if ln.startswith("acceptance")]


@pytest.mark.parametrize("bad", [{"accepts": "3"}, {"accepts": [1, -1]}, {"accepts": [1.5]}, {"accepts": [True]},
                                 {"accept_hist": {"a": 1}}, {"accept_hist": {"1": -2}}, {"accept_hist": [1]}])
def test_a_bad_per_request_count_makes_a_skipped_line(tmp_path, bad):
    """Like any mistyped field: the line is counted as skipped and none of it counts (not its phases either)."""
    recs = records(repeat=1)[:3]
    r = dict(recs[1], **bad)
    if "accept_hist" in bad:
        del r["accepts"]
    recs[1] = r
    res = aggregate([write(tmp_path / "a.jsonl", recs)])
    (g,) = res.groups
    assert res.skipped_lines == 1 and g.n == 2 and g.acceptance.samples == 2
    assert g.phase("draft").stats.n == 2


def test_runs_merged_merge_their_profiles(tmp_path):
    a = write(tmp_path / "a.jsonl", [header("r1")] + records(repeat=1, run="r1"))
    b = write(tmp_path / "b.jsonl", [header("r2")] + records(counts=(4,), repeat=2, run="r2", t0=T0 + 100))
    (g,) = aggregate([a, b], merge_runs=True).groups
    assert g.acceptance.samples == 10 and dict(g.acceptance.hist)[4] == 3 + 2


# ----------------------------------------------------------------------------------------------------------------
# What a client sees: the cadence of cycle starts


def test_wall_tokens_per_s_follows_the_host_clock_under_the_events_timer(tmp_path):
    """Events timer, overlap scheduler: the GPU's cycle reads 12 ms, the host's 8 ms, and the next cycle starts 2
    ms after the host's end. Three cycles of 4 tokens: the cadence is 10 ms, so a client sees 12 tokens in
    8 + 10 + 10 ms = 428.6 tok/s (GPU cycle + between would say 12 / (36 + 4) = 300)."""
    recs = records(counts=(4,), repeat=3, cycle=12.0, gap=2.0, host=(8.0, {"draft": 2.0, "verify": 4.0,
                                                                           "draft_extend": 1.0}))
    (g,) = aggregate([write(tmp_path / "a.jsonl", recs)]).groups
    assert g.tokens_per_s == approx(12 / 36 * 1000)
    assert g.wall_tokens_per_s == approx(12 / 28 * 1000, rel=1e-4)  # (t is written to the microsecond)
    assert g.cadence_ms == approx(28 / 3, rel=1e-4) and g.accepted_cycles == 3
    assert g.between.mean == approx(2.0, abs=1e-3)


def test_wall_tokens_per_s_without_host_times_is_cycle_plus_between(tmp_path):
    recs = records(counts=(2,), repeat=3, cycle=6.0, gap=1.0)
    (g,) = aggregate([write(tmp_path / "a.jsonl", recs)]).groups
    assert g.wall_tokens_per_s == approx(6 / (18 + 2) * 1000, rel=1e-4)


def test_window_rates_split_the_run(tmp_path):
    """100 cycles: two windows of 50 (the least a window holds); the second runs at half the tokens."""
    recs = records(counts=(2,), repeat=50) + records(counts=(1,), repeat=50, t0=T0 + 50 * 0.0075 + 0.0015)
    (g,) = aggregate([write(tmp_path / "a.jsonl", recs)]).groups
    w = g.window_tokens_per_s
    assert len(w) == 2 and w[0] == approx(2 * w[1], rel=0.02)


# ----------------------------------------------------------------------------------------------------------------
# The prediction, by hand


def one_group(tmp_path: Path, recs: list[dict[str, Any]], flags: dict[str, Any] | None = None, **kw: Any):
    res = aggregate([write(tmp_path / "a.jsonl", [header(flags=flags)] + recs)], **kw)
    return res, predict(res)


def test_predictions_by_hand(tmp_path):
    """3 steps, sync timer: draft 3 ms (1 a step), verify 2, draft extend 1, the rest of the cycle 0.5, 1.5 ms
    between cycles; tokens per request-cycle 1, 2, 2, 3, 3, 4, 4, 4 (at least: 1, 7/8, 5/8, 3/8). For j steps:
    accept length = at_least[0] + ... + at_least[j] (j <= 3), the cycle changes by the draft's (j - 3) ms, and
    tok/s = accept length / cadence; no speculation is estimated as the forward alone (verify, 2 ms), its spread
    half the way to the cycle without the draft and the draft extend (C - 4 ms), here below its floor of 30%;
    beyond 3 steps the last position's rate (30 + 1/2) / (50 + 1) carries on."""
    res, (p,) = one_group(tmp_path, records())
    (g,) = res.groups
    C = g.cadence_ms
    assert C == approx((80 * 6.5 + 79 * 1.5) / 80, rel=1e-4)
    pts = {x.steps: x for x in p.points}
    assert [x.steps for x in p.points] == list(range(0, 9)) and p.measured_steps == 3
    assert pts[3].basis == "measured" and pts[3].accept_len == approx(2.875)
    assert pts[3].tokens_per_s == approx(g.wall_tokens_per_s) == approx(2.875 / C * 1000)
    assert pts[2].basis == pts[1].basis == "profile"
    assert pts[2].accept_len == approx(2.5) and pts[2].tokens_per_s == approx(2.5 / (C - 1) * 1000)
    assert pts[1].accept_len == approx(1.875) and pts[1].tokens_per_s == approx(1.875 / (C - 2) * 1000)
    assert pts[0].basis == "estimate" and pts[0].accept_len == 1.0
    assert pts[0].tokens_per_s == approx(1 / 2.0 * 1000)
    assert (1 - 2.0 / (C - 4)) / 2 < 0.3 and pts[0].spread == approx(0.3)   # no less than the estimate has missed by
    r = 30.5 / 51
    assert pts[4].basis == "extrapolated" and pts[4].accept_len == approx(2.875 + 0.375 * r)
    assert pts[5].accept_len == approx(2.875 + 0.375 * (r + r * r))
    assert pts[4].tokens_per_s == approx(pts[4].accept_len / (C + 1) * 1000)
    # cycle_ms + between_ms is the cadence; between as measured
    assert pts[2].between_ms == approx(g.between.mean) and pts[2].cycle_ms + pts[2].between_ms == approx(C - 1)
    assert p.best == max(range(9), key=lambda i: p.points[i].tokens_per_s)
    # spread: none measured for the run's own point (too few cycles for two windows), more the further away
    assert pts[3].spread == 0.0 and 0 < pts[2].spread < pts[1].spread and 0 < pts[4].spread < pts[6].spread


def test_the_estimate_spread_is_half_the_way_to_the_slow_bound_when_that_is_wider(tmp_path):
    """Verify 0.5 ms in a cycle of 9.5 ms (draft 6, draft extend 2, the rest 1), 1.5 ms between: the forward alone
    is 0.5 ms and the slow bound C - 8 ms, so half the way is above the 30% floor and stands."""
    recs = records(cycle=9.5, phases={"draft": 6.0, "verify": 0.5, "draft_extend": 2.0})
    res, (p,) = one_group(tmp_path, recs)
    C = res.groups[0].cadence_ms
    (zero,) = [x for x in p.points if x.steps == 0]
    assert zero.basis == "estimate" and zero.tokens_per_s == approx(1 / 0.5 * 1000)
    half = (1 - 0.5 / (C - 8)) / 2
    assert half > 0.3 and zero.spread == approx(half)
    assert any("at least 30%" in n for n in p.notes)


def test_the_cadence_moves_with_the_gpu_when_the_gpu_sets_it(tmp_path):
    """Events timer, GPU-bound: GPU cycle 10 ms (draft 3, verify 6, extend 1), host cycle 2 ms, 0.5 ms between:
    the host waits, cycles start every 10 ms (the test's clock: host + gap = 2.5 ms, so the cadence is taken as
    measured: min(1, C / G) scales the GPU time). Two steps: the GPU's cycle is 9 ms, so the cadence 9/10 of
    the measured one; the host's change (its draft 0.3 ms a step) is smaller and does not decide."""
    host = (2.0, {"draft": 0.9, "verify": 0.6, "draft_extend": 0.3})
    recs = records(cycle=10.0, gap=0.5, host=host, phases={"draft": 3.0, "verify": 6.0, "draft_extend": 1.0})
    res, (p,) = one_group(tmp_path, recs)
    (g,) = res.groups
    C = g.cadence_ms
    r = min(1.0, C / 10.0)
    pts = {x.steps: x for x in p.points}
    assert pts[2].tokens_per_s == approx(2.5 / max(C - 0.3, 9.0 * r) * 1000)
    assert pts[5].tokens_per_s == approx(pts[5].accept_len / max(C + 0.6, 12.0 * r) * 1000)


def test_a_gpu_bound_cadence_keeps_its_gap_and_ignores_the_hosts_slack(tmp_path):
    """Events timer, the GPU setting the pace: GPU cycle 10 ms (draft 3 at 3 steps, 1.5 ms a forward), host cycle 2
    ms, the next cycle 10 ms after the host's end (C about 12 ms: the host waits out the GPU, then 2 ms more). At 2
    steps the GPU's cycle is 8.5 ms (the draft follows its forwards here) and the cadence C - G + G(j) = 10.5 ms,
    not the host clock's C - 0.3 (11.6 ms: the host's own saving would be lost in its wait); at 5 steps 15 ms; the
    measured point stays C. From a run at 1 step (no draft forward measured) the rule is not used."""
    host = (2.0, {"draft": 0.9, "verify": 0.6, "draft_extend": 0.3})
    recs = records(cycle=10.0, gap=10.0, host=host, phases={"draft": 3.0, "verify": 6.0, "draft_extend": 1.0})
    res, (p,) = one_group(tmp_path, recs)
    (g,) = res.groups
    C = g.cadence_ms
    assert C == approx((80 * 2.0 + 79 * 10.0) / 80, rel=1e-4)  # 80 cycles, 79 gaps: about 12 ms
    pts = {x.steps: x for x in p.points}
    assert pts[3].tokens_per_s == approx(2.875 / C * 1000)
    assert pts[2].tokens_per_s == approx(2.5 / (C - 10.0 + 8.5) * 1000)
    assert pts[1].tokens_per_s == approx(1.875 / (C - 10.0 + 7.0) * 1000)
    assert pts[5].tokens_per_s == approx(pts[5].accept_len / (C - 10.0 + 13.0) * 1000)
    # the no-speculation estimate says how it has read on such servers; a host-bound run's notes do not
    assert any(n.startswith("estimate: the GPU sets this server's pace") for n in p.notes)
    _, (hb,) = one_group(tmp_path / "hb", records())
    assert not any("GPU sets this server's pace" in n for n in hb.notes)


@pytest.mark.parametrize("flags, why", [
    ({**FLAGS, "speculative-eagle-topk": "4", "speculative-num-draft-tokens": "8"}, "top-k 4"),
    ({}, "step count this run used is not known"),
])
def test_no_prediction_says_why(tmp_path, flags, why):
    res, (p,) = one_group(tmp_path, records(repeat=1), flags=flags)
    assert p.points == () and why in p.why
    assert p.to_json() == {"predict": None, "predict_note": p.why}
    assert f"prediction: none: {p.why}" in render_table(res, predictions=[p])


def test_the_zero_step_state_says_why(tmp_path):
    """An adaptive server's cycles at 0 steps have no draft to profile: said so, not an unknown step count."""
    recs = records(repeat=1, spec={"steps": 0, "topk": 1, "draft_tokens": 1})
    res, (p,) = one_group(tmp_path, recs, flags={**FLAGS, "speculative-adaptive": True})
    assert p.points == () and "0 draft steps" in p.why


def test_prefill_groups_get_no_prediction(tmp_path):
    recs = records(repeat=1)
    recs[0] = dict(recs[0], mode="prefill")
    res, preds = one_group(tmp_path, recs)
    assert [g.mode for g in res.groups] == ["decode", "prefill"] and preds[1] is None


def test_a_chain_without_topk_in_the_flags_is_told_by_its_draft_tokens(tmp_path):
    flags = {"speculative-num-steps": "3", "speculative-num-draft-tokens": "4"}
    res, (p,) = one_group(tmp_path, records(repeat=1), flags=flags)
    assert p.why is None and shape_of(res.groups[0], flags).topk == 1


def test_records_without_accepts_use_a_geometric_profile_and_say_so(tmp_path):
    """Accept length 1 + p + p^2 + p^3 = 2.875 fitted: p = 0.757...; fewer steps follow that chain."""
    recs = records()
    for r in recs:
        del r["accepts"]
    res, (p,) = one_group(tmp_path, recs)
    pts = {x.steps: x for x in p.points}
    q = next(x / 1000 for x in range(1000) if sum((x / 1000) ** i for i in range(4)) >= 2.875)
    assert pts[1].accept_len == approx(1 + q, abs=2e-3) and pts[3].accept_len == approx(2.875)
    assert any("geometric profile" in n for n in p.notes)


def test_adaptive_spec_groups_fit_the_cost_of_each_phase(tmp_path):
    """An adaptive server's records at 1 and 3 steps (its spec groups): the draft costs 1 and 3 ms, verify 2.0 and
    2.4 ms: each phase is fitted on the step count (draft = j, verify = 1.8 + 0.2 j), so 2 steps cost 2 + 2.2 + 1 +
    0.5 ms, not the proportional 2 + 2.4 + 1 + 0.5."""
    one = records(counts=(1, 2), repeat=10, cycle=4.5, phases={"draft": 1.0, "verify": 2.0, "draft_extend": 1.0},
                  spec={"steps": 1, "topk": 1, "draft_tokens": 2})
    three = records(cycle=6.9, phases={"draft": 3.0, "verify": 2.4, "draft_extend": 1.0},
                    spec={"steps": 3, "topk": 1, "draft_tokens": 4}, t0=T0 + 10)
    res, preds = one_group(tmp_path, one + three, flags={**FLAGS, "speculative-adaptive": True})
    g3, p3 = next((g, p) for g, p in zip(res.groups, preds) if g.spec == "steps=3,topk=1,draft_tokens=4")
    pts = {x.steps: x for x in p3.points}
    C = g3.cadence_ms
    assert pts[2].tokens_per_s == approx(2.5 / (C + (2 + 2.2 + 1 + 0.5) - 6.9) * 1000)
    assert pts[0].tokens_per_s == approx(1 / 1.8 * 1000)  # the forward alone: verify's line at 0 steps
    assert any("fitted on the step counts of 2 groups" in n for n in p3.notes)


def test_a_sweeps_runs_at_several_step_counts_fit_the_cost_of_each_phase(tmp_path):
    """A sweep's runs (one launch at 1 step, one at 3, each with its own run header and flags, read together):
    the same fit as an adaptive server's spec groups, across runs: 2 steps cost 2 + 2.2 + 1 + 0.5 ms; each run
    stays a group of its own, and each run's prediction uses the other's measurement."""
    flags1 = {**FLAGS, "speculative-num-steps": "1", "speculative-num-draft-tokens": "2"}
    one = records(counts=(1, 2), repeat=10, cycle=4.5, phases={"draft": 1.0, "verify": 2.0, "draft_extend": 1.0},
                  run="r1")
    three = records(cycle=6.9, phases={"draft": 3.0, "verify": 2.4, "draft_extend": 1.0}, run="r3", t0=T0 + 100)
    res = aggregate([write(tmp_path / "one.jsonl", [header("r1", flags1)] + one),
                     write(tmp_path / "three.jsonl", [header("r3")] + three)])
    assert len(res.groups) == 2 and {g.run for g in res.groups} == {"r1", "r3"}
    preds = predict(res)
    g3, p3 = next((g, p) for g, p in zip(res.groups, preds) if g.run == "r3")
    pts = {x.steps: x for x in p3.points}
    assert pts[3].basis == "measured" and pts[2].basis == "profile"
    assert pts[2].tokens_per_s == approx(2.5 / (g3.cadence_ms + (2 + 2.2 + 1 + 0.5) - 6.9) * 1000)
    assert any("fitted on the step counts of 2 groups" in n for n in p3.notes)
    g1, p1 = next((g, p) for g, p in zip(res.groups, preds) if g.run == "r1")
    assert {x.steps: x.basis for x in p1.points}[1] == "measured"
    assert any("fitted on the step counts of 2 groups" in n for n in p1.notes)


def test_predictions_per_batch_size_group(tmp_path):
    """``--by bs``: one prediction per batch-size group, each from its own records (the profile of the requests
    of that batch size; the cycle of that batch size)."""
    res = aggregate([write(tmp_path / "a.jsonl", [header()] + records(bs=1) + records(bs=2, cycle=8.0,
                                                                                     t0=T0 + 100))], by="bs")
    assert [g.key_dict()["bs"] for g in res.groups] == [1, 2]
    p1, p2 = predict(res)
    assert p1.point(3).basis == p2.point(3).basis == "measured"
    g1, g2 = res.groups
    assert p1.point(3).cycle_ms == approx(6.5, rel=0.01) and p2.point(3).cycle_ms == approx(8.0, rel=0.01)
    assert p1.point(3).tokens_per_s == approx(g1.wall_tokens_per_s)
    assert p2.point(3).tokens_per_s == approx(g2.wall_tokens_per_s)
    assert p1.point(2).accept_len == approx(g1.acceptance.mean_tokens(3))


def sweep_doc(base: float, at3: float | None) -> dict[str, Any]:
    pts = [{"flags": {}, "status": "ok", "tokens_per_s": {"median": base, "min": base * 0.9, "max": base * 1.1}}]
    if at3 is not None:
        pts.append({"flags": {"speculative-num-steps": "3"}, "status": "ok",
                    "tokens_per_s": {"median": at3, "min": at3, "max": at3}})
    return {"baseline": 0, "points": pts, "path": "/cache/sweep.jsonl"}


def test_a_sweeps_baseline_is_the_no_speculation_point(tmp_path):
    """With the sweep's own point at the same 3 steps, the baseline scales the records' tok/s by their ratio (the
    sweep's load need not be the records'); without it, the baseline's tok/s itself; marked measured."""
    res = aggregate([write(tmp_path / "a.jsonl", [header()] + records())])
    (g,) = res.groups
    (p,) = predict(res, sweep=sweep_doc(500.0, 400.0))
    zero = p.point(0)
    assert zero.basis == "measured" and zero.tokens_per_s == approx(1.25 * g.wall_tokens_per_s)
    assert zero.spread == approx(0.1) and any("the sweep /cache/sweep.jsonl" in n for n in p.notes)
    (p,) = predict(res, sweep=sweep_doc(500.0, None))
    assert p.point(0).tokens_per_s == 500.0
    assert baseline_from_sweep({"baseline": None, "points": []}, 3) is None
    assert baseline_from_sweep({"baseline": 0, "points": [{"status": "failed"}]}, 3) is None
    assert isinstance(baseline_from_sweep(sweep_doc(1.0, 1.0), 3), Baseline)


def test_steps_chosen(tmp_path):
    res = aggregate([write(tmp_path / "a.jsonl", [header()] + records())])
    (p,) = predict(res, steps=[0, 2, 3])
    assert [x.steps for x in p.points] == [0, 2, 3]
    assert predict_group(res.groups[0], shape_of(res.groups[0], FLAGS), steps=[1]).points[0].steps == 1


@pytest.mark.parametrize("text, steps", [("0,1,3", [0, 1, 3]), ("0-3", [0, 1, 2, 3]), ("5, 2", [2, 5])])
def test_parse_steps(text, steps):
    assert parse_steps(text) == steps


@pytest.mark.parametrize("text", ["", "a", "3-1", "65", "-1"])
def test_parse_steps_refuses(text):
    with pytest.raises(UsageError, match="--steps"):
        parse_steps(text)


def test_the_rendered_prediction(tmp_path):
    res, preds = one_group(tmp_path, records())
    text = render_table(res, predictions=preds)
    assert "predicted records' wall tok/s, per draft step count (* the best; steps 0: no speculation):" in text
    rows = [ln.split() for ln in text.splitlines() if ln[:1].isdigit()]
    assert [r[0] for r in rows][:4] == ["0", "1", "2", "3"] and any(r[1] == "*" for r in rows)
    assert "basis: estimate: no speculation's cycle taken as the target's forward alone" in text


# ----------------------------------------------------------------------------------------------------------------
# The chart


def test_the_chart_shows_the_prediction_beside_the_profile(tmp_path):
    res, preds = one_group(tmp_path, records())
    doc = res.to_json()
    doc["groups"][0].update(preds[0].to_json())
    sweep = sweep_doc(300.0, 350.0)
    sc = predict_scene(doc, sweep)
    texts = sc.texts()
    best = preds[0].best_point
    assert best.steps == 0 and f"best: no speculation, {best.tokens_per_s:,.0f}" in texts
    for k, label in ((1, "best: 1 step, "), (3, "best: 3 steps, ")):  # the point named as the table names it
        one = json.loads(json.dumps(doc))
        one["groups"][0]["predict_best"] = next(i for i, p in enumerate(one["groups"][0]["predict"]) if p["steps"] == k)
        assert any(t.startswith(label) for t in predict_scene(one, sweep).texts()), label
    assert any(t.startswith("no speculation, estimated: ") for t in texts)
    assert [t for t in texts if t.startswith("\u2265")] == ["\u22651", "\u22652", "\u22653", "\u22654"]
    assert "0.88 (0.88)" in texts and "0.62 (0.71)" in texts  # share at least 2 and 3 tokens, with their rates
    assert any(kind == "poly" for kind, _ in sc.items)  # the uncertainty band
    assert sum(1 for kind, d in sc.items if kind == "rect" and (d.get("tip") or "").startswith("sweep: ")) == 2
    path = tmp_path / "p.svg"
    write_predict_chart(doc, str(path), sweep)
    svg = path.read_text()
    assert svg.startswith("<?xml") and "<polygon points=" in svg


def test_a_chart_without_predictions_says_so():
    assert "no decode group with a prediction (see report --predict for why)" in predict_scene({"groups": []}).texts()


def test_the_png_chart(tmp_path):
    pytest.importorskip("matplotlib")
    res, preds = one_group(tmp_path, records())
    doc = res.to_json()
    doc["groups"][0].update(preds[0].to_json())
    write_predict_chart(doc, str(tmp_path / "p.png"))
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_prefill_cycles_count_in_the_wall_time_of_the_decode_cycles_after_them(tmp_path):
    """A client waits for a new request's prefill too: decode (8 ms), 2 ms, prefill (5 ms), 1 ms, decode (8 ms),
    2 ms, decode: the second decode cycle's wall time is its 8 ms, the 1 ms before it and the prefill's 5 + 2 ms;
    the prefill itself has no accepted tokens."""
    d = records(counts=(3,), repeat=1)[0]
    recs = [dict(d, t=T0, cycle_ms=8.0), dict(d, t=T0 + 0.010, mode="prefill", cycle_ms=5.0, accepted=None,
                                              accepts=None, phases={"target": 4.0, "draft_extend": 1.0}),
            dict(d, t=T0 + 0.016, cycle_ms=8.0), dict(d, t=T0 + 0.026, cycle_ms=8.0)]
    for r in recs:
        if r["accepts"] is None:
            del r["accepts"]
    res = aggregate([write(tmp_path / "a.jsonl", recs)])
    dec = res.group("decode")
    assert dec.n == 3 and dec.tokens == 9
    assert dec.cadence_ms == approx((8 + (8 + 1 + 5 + 2) + (8 + 2)) / 3, rel=1e-4)
    assert dec.wall_tokens_per_s == approx(9 / (8 + 16 + 10) * 1000, rel=1e-4)
    assert res.group("prefill").wall_tokens_per_s is None


def test_an_idle_gap_leaves_the_prefill_before_it_out_of_the_wall_time(tmp_path):
    """Over a second without a cycle is idle: a prefill before it is not a client's wait for the next decode; one
    after it is (its own time, not the idle gap)."""
    d = records(counts=(3,), repeat=1)[0]
    pre = dict(d, mode="prefill", cycle_ms=5.0, accepted=None, phases={"target": 5.0})
    del pre["accepts"]
    recs = [dict(d, t=T0, cycle_ms=8.0), dict(pre, t=T0 + 0.010), dict(pre, t=T0 + 2.0),
            dict(d, t=T0 + 2.006, cycle_ms=8.0)]
    dec = aggregate([write(tmp_path / "a.jsonl", recs)]).group("decode")
    assert dec.cadence_ms == approx((8 + (5 + 1 + 8)) / 2, rel=1e-4)


# ----------------------------------------------------------------------------------------------------------------
# What report prints of a prediction, and the cycles it needs


def _pred(points: list[tuple[int, float, float, str]], best: int, measured: int):
    from eaglepatch.report.predict import Point, Prediction

    return Prediction(points=tuple(Point(k, k + 1, 1.0 + 0.1 * k, 5.0, 1.0, tps, spread, basis)
                                   for k, tps, spread, basis in points), best=best, measured_steps=measured)


def test_the_best_line_names_the_sweep_that_measures_it():
    """The H200's p = 0.2 server, from one 3-step run: 1 step best, the no-speculation estimate within its 30% of
    it: the best line (singular "1 step", a live sweep of 1 and 3, no zero-step state) and the line that says only
    a launch without speculation tells. No speculation best: the restart sweep with --baseline confirms it, never
    the live sweep (its steps 0 still runs the draft extend). The estimate far below the best: no such line."""
    from eaglepatch.report.render import render_prediction

    close = _pred([(0, 678.0, 0.3, "estimate"), (1, 741.0, 0.04, "profile"), (3, 720.0, 0.03, "measured")], 1, 3)
    text = render_prediction(close)
    assert ("best: 1 step, 741.0 records' wall tok/s, +3% over the 720.0 at the 3 steps measured (profile; confirm "
            "with eaglepatch sweep "
            "TARGET --live --grid speculative-num-steps=1,3)") in text
    assert ("no speculation: estimated 678.0 records' wall tok/s (\u00b130%), within reach of the best: only a "
            "launch without "
            "speculation tells whether speculation pays here (eaglepatch sweep TARGET --baseline --repeat 3 --grid "
            "speculative-num-steps=1,3)") in text
    slow = _pred([(0, 900.0, 0.3, "estimate"), (1, 741.0, 0.04, "profile"), (3, 720.0, 0.03, "measured")], 0, 3)
    text = render_prediction(slow)
    assert ("best: no speculation, 900.0 records' wall tok/s, +25% over the 720.0 at the 3 steps measured "
            "(estimate; confirm with eaglepatch "
            "sweep TARGET --baseline --repeat 3 --grid speculative-num-steps=3)") in text
    assert "--live" not in text and "within reach" not in text
    far = _pred([(0, 400.0, 0.3, "estimate"), (1, 741.0, 0.04, "profile"), (3, 720.0, 0.03, "measured")], 1, 3)
    assert "within reach" not in render_prediction(far)
    measured = _pred([(0, 700.0, 0.01, "measured"), (1, 741.0, 0.04, "profile"), (3, 720.0, 0.03, "measured")], 1, 3)
    assert "within reach" not in render_prediction(measured)
    here = _pred([(0, 600.0, 0.3, "estimate"), (1, 741.0, 0.04, "measured")], 1, 1)
    assert "best: the 1 step measured (741.0 records' wall tok/s)" in render_prediction(here)


def test_no_prediction_from_fewer_cycles_than_asked(tmp_path):
    """80 decode cycles: predicted with min_cycles 50, none with 100, the reason said (report, bench and doctor
    ask for MIN_CYCLES = 50)."""
    from eaglepatch.report.predict import MIN_CYCLES

    res, (p,) = one_group(tmp_path, records())
    assert res.groups[0].n == 80 and MIN_CYCLES == 50
    assert p.why is None and predict(res, min_cycles=MIN_CYCLES)[0].why is None
    (few,) = predict(res, min_cycles=100)
    assert few.why == ("only 80 decode cycle(s) recorded, too few to predict from (at least 100): load the server "
                       "first (eaglepatch bench)")
    assert few.measured_steps == 3 and few.to_json() == {"predict": None, "predict_note": few.why}


def test_the_cycles_asked_for_are_per_rank_and_come_after_the_shape(tmp_path):
    """Two ranks (TP 2) of 40 cycles each: 80 records in the group, 40 cycles: none at 50, said per rank; 60 each:
    predicted. A top-k 2 group of 8 cycles says top-k, not too few cycles (loading it would not help). An adaptive
    server's spec group of 20 cycles at 1 step is left out of the 3-step group's cost fit at 50."""
    from eaglepatch.report.predict import MIN_CYCLES

    def two_ranks(folder: Path, repeat: int) -> list[str]:
        recs = records(repeat=repeat)
        return [write(folder / f"r{rank}.jsonl", [dict(header(), rank=rank)] + [dict(r, rank=rank) for r in recs])
                for rank in (0, 1)]

    res = aggregate(two_ranks(tmp_path / "a", 5))
    (g,) = res.groups
    assert g.n == 80 and g.ranks == 2
    (p,) = predict(res, min_cycles=MIN_CYCLES)
    assert p.why.startswith("only 40 decode cycle(s) recorded per rank, too few to predict from (at least 50)")
    (ok,) = predict(aggregate(two_ranks(tmp_path / "b", 8)), min_cycles=MIN_CYCLES)
    assert ok.why is None
    flags = {**FLAGS, "speculative-eagle-topk": "2", "speculative-num-draft-tokens": "8"}
    res = aggregate([write(tmp_path / "c" / "a.jsonl", [header(flags=flags)] + records(repeat=1))])
    assert predict(res, min_cycles=MIN_CYCLES)[0].why.startswith("top-k 2")
    one = records(counts=(1, 2), repeat=10, cycle=4.5, phases={"draft": 1.0, "verify": 2.0, "draft_extend": 1.0},
                  spec={"steps": 1, "topk": 1, "draft_tokens": 2})
    three = records(cycle=6.9, phases={"draft": 3.0, "verify": 2.4, "draft_extend": 1.0},
                    spec={"steps": 3, "topk": 1, "draft_tokens": 4}, t0=T0 + 10)
    res = aggregate([write(tmp_path / "d" / "a.jsonl", [header(flags={**FLAGS, "speculative-adaptive": True})]
                           + one + three)])
    preds = predict(res, min_cycles=MIN_CYCLES)
    p1, p3 = (next(p for g, p in zip(res.groups, preds) if g.spec == f"steps={k},topk=1,draft_tokens={k + 1}")
              for k in (1, 3))
    assert p1.why.startswith("only 20 decode cycle(s) recorded, too few")
    assert p3.why is None and not any("fitted on the step counts" in n for n in p3.notes)
    assert any("fitted on the step counts of 2 groups" in n for n in predict(res)[
        next(i for i, g in enumerate(res.groups) if g.spec == "steps=3,topk=1,draft_tokens=4")].notes)
