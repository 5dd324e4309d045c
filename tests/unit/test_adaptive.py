"""eaglepatch.tuning.adaptive on small hand-written cases: release facts from source text, config documents (read
and written), refusals, and the choice of candidates per batch-size tier. The same against each pinned release's
own files and loader: tests/real/test_live_releases.py."""

from __future__ import annotations

import pytest

from eaglepatch.errors import Unsupported, UsageError
from eaglepatch.tuning import adaptive as ad

PARAMS_TIERS = '''
DEFAULT_ADAPTIVE_CONFIG: dict[str, dict] = {"1": {"candidate_steps": [1, 3]}, "8": {"candidate_steps": [0, 1]}}

def adaptive_unsupported_reason(server_args):
    if server_args.speculative_algorithm not in ("EAGLE", "EAGLE3"):
        return "no"
    if server_args.enable_two_batch_overlap:
        return "tbo"
    return None

def _load_adaptive_config(cfg_path):
    pass
'''
PARAMS_FLAT = '''
def adaptive_unsupported_reason(server_args):
    if server_args.enable_dp_attention:
        return "dp"

def load_adaptive_config(path):
    pass
'''
WORKER = '''
class EAGLEWorkerV2:
    def forward_batch_generation(self, batch):
        self.activate_step_by_batch(3)
        if self.speculative_num_steps == 0:
            pass

    def apply_runtime_state(self, state):
        pass
'''


def files(params=PARAMS_TIERS, worker=WORKER, state="class AdaptiveController: pass\n"):
    return {ad.PARAMS_PATH: params, ad.WORKER_PATH: worker, ad.STATE_PATH: state}


def release(**kw) -> ad.AdaptiveRelease:
    base = dict(version="9.9", format=ad.ConfigFormat.TIERS, zero_steps=True, min_candidates=1,
                algorithms=("EAGLE", "EAGLE3"), limits=tuple(ad.LIMITS), default={1: (1, 3)}, bs_switch=True)
    base.update(kw)
    return ad.AdaptiveRelease(**base)


def test_a_tiered_release_is_read_from_its_files():
    rel = ad.read_release(files(), "9.9")
    assert rel == ad.AdaptiveRelease("9.9", ad.ConfigFormat.TIERS, True, 1, ("EAGLE", "EAGLE3"),
                                     ("enable_two_batch_overlap",), {1: (1, 3), 8: (0, 1)}, True)


def test_a_flat_release_without_zero_steps_or_per_batch_switching():
    worker = "class EAGLEWorkerV2:\n    def apply_runtime_state(self, state):\n        pass\n"
    rel = ad.read_release(files(PARAMS_FLAT, worker), "0.5.12")
    assert (rel.format, rel.zero_steps, rel.min_candidates, rel.bs_switch, rel.limits, rel.default) == (
        ad.ConfigFormat.FLAT, False, 2, False, ("enable_dp_attention",), {1: (1, 3, 7)})


@pytest.mark.parametrize("change", [
    {ad.PARAMS_PATH: None},
    {ad.STATE_PATH: None},
    {ad.WORKER_PATH: "class EAGLEWorkerV2:\n    pass\n"},        # no apply_runtime_state: no adaptive worker
    {ad.WORKER_PATH: "def broken(:\n"},
])
def test_no_adaptive_mode_without_its_files_or_protocol(change):
    assert ad.read_release(dict(files(), **change)) is None


@pytest.mark.parametrize("doc, expected", [
    ({"1": {"candidate_steps": [7, 1, 3, 3]}}, {1: (1, 3, 7)}),
    ({"8": {"candidate_steps": [0]}, "1": {"candidate_steps": [3]}, "ema_alpha": 0.3}, {1: (3,), 8: (0,)}),
])
def test_tiers_of_a_tiered_document(doc, expected):
    assert ad.tiers_of(doc, ad.ConfigFormat.TIERS) == expected


@pytest.mark.parametrize("doc, words", [
    ([], "must be a JSON object"),
    ({"ema_alpha": 0.2}, "at least one batch-size tier"),
    ({"1": {"candidate_steps": []}}, "non-negative ints"),
    ({"1": {"candidate_steps": [-1]}}, "non-negative ints"),
    ({"1": {"candidate_steps": [True]}}, "non-negative ints"),
    ({"1": {}}, "non-negative ints"),
])
def test_a_tiered_document_sglang_would_refuse(doc, words):
    with pytest.raises(UsageError, match=words):
        ad.tiers_of(doc, ad.ConfigFormat.TIERS)


def test_a_flat_document_gets_the_launch_steps_added_and_needs_two():
    assert ad.tiers_of({}, ad.ConfigFormat.FLAT) == {1: (1, 3, 7)}
    assert ad.tiers_of({"candidate_steps": [2]}, ad.ConfigFormat.FLAT, initial_steps=5) == {1: (2, 5)}
    with pytest.raises(UsageError, match="at least 2 distinct"):
        ad.tiers_of({"candidate_steps": [3]}, ad.ConfigFormat.FLAT, initial_steps=3)


@pytest.mark.parametrize("bs, tier", [(0, 1), (1, 1), (7, 1), (8, 8), (31, 8), (64, 64), (1000, 64)])
def test_a_batch_goes_to_the_largest_tier_not_above_it(bs, tier):
    assert ad.tier_for({1: (1,), 8: (1,), 64: (0,)}, bs) == tier


def test_the_written_document_and_the_launch_steps():
    rel = release()
    assert ad.config_document(rel, {1: (7, 1), 8: (0, 3)}) == {"1": {"candidate_steps": [1, 7]},
                                                                "8": {"candidate_steps": [0, 3]}}
    assert ad.config_document(release(format=ad.ConfigFormat.FLAT, zero_steps=False, min_candidates=2),
                              {1: (3,), 8: (1, 3)}) == {"candidate_steps": [1, 3]}
    assert ad.launch_steps({1: (1, 7), 8: (0, 3)}) == 7
    assert ad.live_tiers([3, 0, 7, 1]) == {1: (0, 1, 3, 7)}


def test_candidates_a_release_cannot_run_are_refused():
    flat = release(format=ad.ConfigFormat.FLAT, zero_steps=False, min_candidates=2, version="0.5.12")
    with pytest.raises(Unsupported, match="no zero-step state"):
        ad.check_live_grid(flat, [0, 1, 3])
    with pytest.raises(Unsupported, match="at least 2 distinct"):
        ad.config_document(flat, {1: (3,)})
    with pytest.raises(Unsupported, match="no adaptive speculative decoding"):
        ad.check_live_grid(None, [1, 3])
    assert ad.check_live_grid(release(), [0, 1, 3, 7]) == release()


@pytest.mark.parametrize("values, words", [
    ({}, "runs no speculation"),
    ({"speculative-algorithm": "NGRAM"}, "runs EAGLE and EAGLE3 only"),
    ({"speculative-algorithm": "EAGLE3", "speculative-eagle-topk": "4"}, "top-k 1 only"),
    ({"speculative-algorithm": "EAGLE", "enable-dp-attention": "on"}, "--enable-dp-attention"),
    ({"speculative-algorithm": "EAGLE", "enable-two-batch-overlap": "on"}, "TboAttnBackend"),
    ({"speculative-algorithm": "EAGLE", "enable-multi-layer-eagle": "on"}, "MultiLayerEagleWorkerV2"),
    ({"speculative-algorithm": "EAGLE", "enable-pdmux": "on"}, "--enable-pdmux"),
])
def test_shapes_the_adaptive_mode_does_not_run_are_named(values, words):
    assert words in ad.unsupported_reason(release(), values)


@pytest.mark.parametrize("values", [
    {"speculative-algorithm": "EAGLE3"},
    {"speculative-algorithm": "NEXTN", "speculative-eagle-topk": "1"},      # NEXTN is EAGLE by then
    {"speculative-algorithm": "eagle", "enable-dp-attention": "off"},
])
def test_shapes_it_runs(values):
    assert ad.unsupported_reason(release(), values) is None


def test_a_limit_a_release_does_not_check_is_not_refused():
    assert ad.unsupported_reason(release(limits=()), {"speculative-algorithm": "EAGLE",
                                                      "enable-two-batch-overlap": "on"}) is None


def test_a_running_config_covers_a_grid_only_where_the_loads_batches_reach():
    tiers = {1: (1, 3, 7), 8: (0, 1, 3), 32: (0, 1)}
    assert ad.covers(tiers, [1, 3], 2)          # bs 1..4 reach tier 1 only
    assert not ad.covers(tiers, [1, 7], 4)      # bs up to 8 (padded) reach tier 8, which lacks 7
    assert ad.covers(tiers, [0, 1], 64) is False
    assert ad.covers({1: (0, 1, 3, 7)}, [0, 1, 3, 7], 256)


def M(steps, bs, tps, low=None, high=None):
    return ad.StepMeasure(steps, bs, tps, low, high)


def test_the_choice_per_tier_keeps_what_may_be_as_good_as_the_best():
    measures = [M(0, 1, 100), M(1, 1, 150, 140, 160), M(3, 1, 190, 180, 200), M(7, 1, 170, 150, 182),
                M(0, 8, 800), M(1, 8, 700), M(3, 8, 600), M(7, 8, 400),
                M(0, 16, 1500), M(1, 16, 1200), M(3, 16, 1000), M(7, 16, 700)]
    assert ad.choose_tiers(measures) == {1: (3, 7), 8: (0,)}   # 16 chose as 8 did: one tier


def test_the_smallest_measured_tier_starts_at_one_and_a_tolerance_without_ranges():
    assert ad.choose_tiers([M(1, 4, 100.0), M(3, 4, 98.0), M(7, 4, 90.0)]) == {1: (1, 3)}
    assert ad.choose_tiers([M(1, 4, 100.0), M(3, 4, 98.0)], tolerance=0.01) == {1: (1,)}


def test_nothing_measured_chooses_nothing():
    with pytest.raises(UsageError, match="no measured point"):
        ad.choose_tiers([M(1, 1, 0.0)])


def test_measures_from_a_live_sweep_prefer_the_servers_per_batch_figures():
    points = [{"steps": 1, "status": "ok", "tokens_per_s": {"median": 90.0, "min": 80.0, "max": 95.0}},
              {"steps": 3, "status": "ok", "tokens_per_s": {"median": 99.0, "min": 97.0, "max": 100.0}},
              {"steps": 7, "status": "failed", "tokens_per_s": None}]
    assert ad.measures_of(points, {}, 4) == [M(1, 4, 90.0, 80.0, 95.0), M(3, 4, 99.0, 97.0, 100.0)]
    by_bs = {1: {1: [10.0, 12.0, 11.0], 2: [20.0]}, 3: {1: [14.0, 15.0]}}
    # bs 2 was measured at one step count only: it is left out
    assert ad.measures_of(points, by_bs, 4) == [M(1, 1, 11.0, 10.0, 12.0), M(3, 1, 14.5, 14.0, 15.0)]


def P(steps, bs, tps, spread, basis):
    return ad.StepMeasure(steps, bs, tps, tps * (1 - spread), tps * (1 + spread), basis)


def test_the_acceptance_model_fills_what_no_window_measured():
    """Windows at 1 and 3 steps (the grid); at batch size 1 both were measured, at 2 only 3 steps (ramp-up): the
    model's figures from the 3-step windows stand for 2 steps at both sizes (between the grid's points) and for 1
    step at size 2 (the median over windows); a size no window measured, and step counts above the grid's largest,
    are left out."""
    points = [{"steps": 1, "status": "ok", "tokens_per_s": {"median": 90.0}},
              {"steps": 3, "status": "ok", "tokens_per_s": {"median": 99.0}}]
    by_bs = {1: {1: [10.0, 12.0, 11.0]}, 3: {1: [14.0, 15.0], 2: [26.0]}}
    predicted = {1: {1: [[11.5, 0.1, "profile"]], 2: [[13.0, 0.1, "profile"], [15.0, 0.3, "profile"]],
                     4: [[16.0, 0.2, "extrapolated"]]},
                 2: {1: [[20.0, 0.2, "profile"], [22.0, 0.2, "profile"]], 2: [[24.0, 0.1, "profile"]]},
                 8: {1: [[50.0, 0.1, "profile"]], 2: [[60.0, 0.1, "profile"]]}}
    assert ad.measures_of(points, by_bs, 4, predicted) == [
        M(1, 1, 11.0, 10.0, 12.0), P(2, 1, 14.0, 0.2, "profile"), M(3, 1, 14.5, 14.0, 15.0),
        P(1, 2, 21.0, 0.2, "profile"), P(2, 2, 24.0, 0.1, "profile"), M(3, 2, 26.0, 26.0, 26.0)]
    # without the model, size 2 (one step count measured) is left out, as before
    assert [(m.steps, m.bs) for m in ad.measures_of(points, by_bs, 4)] == [(1, 1), (3, 1)]


def test_a_predicted_step_count_joins_by_its_figure_not_its_spread():
    """The best is always a measured point; a predicted one joins when its predicted tok/s itself reaches the
    floor (a wide spread alone does not make a candidate)."""
    measured = [M(1, 1, 100.0, 95.0, 105.0), M(3, 1, 120.0, 118.0, 122.0)]
    assert ad.choose_tiers(measured + [P(2, 1, 119.0, 0.2, "profile")]) == {1: (2, 3)}
    assert ad.choose_tiers(measured + [P(2, 1, 110.0, 0.5, "profile")]) == {1: (3,)}
    # a prediction above every measurement is a candidate beside the measured best, never instead of it
    assert ad.choose_tiers(measured + [P(2, 1, 150.0, 0.1, "profile")]) == {1: (2, 3)}
    with pytest.raises(UsageError, match="no measured point"):
        ad.choose_tiers([P(2, 1, 150.0, 0.1, "profile")])


def test_what_emit_reports():
    doc = ad.emitted(release(), {1: (3, 7), 8: (0,)}, "/tmp/a.json")
    assert doc["config"] == {"1": {"candidate_steps": [3, 7]}, "8": {"candidate_steps": [0]}}
    assert doc["launch_flags"] == ["--speculative-adaptive", "--speculative-adaptive-config", "/tmp/a.json",
                                   "--speculative-num-steps", "7", "--speculative-eagle-topk", "1",
                                   "--speculative-num-draft-tokens", "8"]
    assert doc["tiers"] == {"1": [3, 7], "8": [0]} and "eaglepatch bench" in doc["check"]
    assert "static_flags" not in doc and "static_flags" not in ad.emitted(release(), {1: (5,), 8: (3,)}, "/tmp/a")


def test_what_emit_reports_for_one_candidate_everywhere():
    """One candidate at every batch size (the H200's p = 0.7 sweep: {"1": [5]}): the static launch that runs it
    without the adaptive controller, said in the check; the adaptive flags still given. No speculation
    everywhere: launch without the --speculative-* flags."""
    doc = ad.emitted(release(), {1: (5,), 16: (5,)}, "/tmp/a.json")
    assert doc["static_flags"] == ["--speculative-num-steps", "5", "--speculative-eagle-topk", "1",
                                   "--speculative-num-draft-tokens", "6"]
    assert doc["check"].startswith("every batch size's best is 5 steps: a static launch with static_flags")
    assert doc["launch_flags"][:2] == ["--speculative-adaptive", "--speculative-adaptive-config"]
    assert ad.emitted(release(), {1: (1,)}, "/tmp/a.json")["check"].startswith("every batch size's best is 1 step: ")
    off = ad.emitted(release(), {1: (0,)}, "/tmp/a.json")
    assert off["static_flags"] == [] and off["check"].startswith("every batch size's best is no speculation")


# -- tiers that never stretch over unmeasured batch sizes --------------------------------------------------------

def _row(bs: int, zero: tuple[float, float, str], *spec: tuple[int, float, float, str]) -> dict:
    pts = [{"steps": 0, "tokens_per_s": zero[0], "spread": zero[1], "basis": zero[2]}]
    pts += [{"steps": j, "tokens_per_s": t, "spread": sp, "basis": b} for j, t, sp, b in spec]
    return {"bs": bs, "best": 0, "points": pts}


def test_curve_tiers_extend_the_measured_ones_and_turn_speculation_off_where_it_stops_paying():
    """Measured up to 4 requests ({1: [3]}); the curve at 8 (3 steps best, 2 within 3%), 16 (2 best), 32 and 64
    (no step count beats the measured no speculation beyond the spreads): tier 5 (the first unmeasured batch
    size, priced with 8's figures) [2, 3], 16 [2], 32 [0]; 64 the same as 32, so no tier of its own; each tier's
    basis said. A step count outside the grid (5) never becomes a candidate."""
    rows = [_row(4, (900, 0.3, "estimate"), (3, 1500, 0.02, "measured")),
            _row(8, (1700, 0.3, "estimate"), (2, 2950, 0.02, "fitted"), (3, 3000, 0.02, "fitted"),
                 (5, 3100, 0.02, "extrapolated")),
            _row(16, (3200, 0.4, "estimate"), (2, 5600, 0.02, "fitted"), (3, 5000, 0.02, "fitted")),
            _row(32, (9000, 0.02, "measured"), (2, 8800, 0.03, "fitted"), (3, 8000, 0.03, "extrapolated")),
            _row(64, (16000, 0.02, "measured"), (2, 12000, 0.03, "extrapolated"))]
    tiers, basis = ad.curve_tiers({1: (3,)}, rows, 4, [2, 3])
    assert tiers == {1: (3,), 5: (2, 3), 16: (2,), 32: (0,)}
    assert basis == {1: "measured", 5: "fitted curve, no speculation estimated",
                     16: "fitted curve, no speculation estimated", 32: "fitted curve"}


def test_a_curve_with_nothing_above_the_measured_leaves_the_tiers():
    rows = [_row(4, (900, 0.3, "estimate"), (3, 1500, 0.02, "measured"))]
    assert ad.curve_tiers({1: (3,)}, rows, 4, [3]) == ({1: (3,)}, {1: "measured"})
