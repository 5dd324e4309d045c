"""``sweep --live`` against the adaptive speculative code of every pinned release that has it, run here
(adaptive_harness.py: the release's own adaptive_spec_params.py and adaptive_runtime_state.py, no GPU needed):

- what eaglepatch.tuning.adaptive reads of each release (config format, zero steps, limits, defaults);
- the configs eaglepatch writes (a live sweep's launch, ``--emit-adaptive-config``) load with the release's own
  loader and route each batch size to the candidates eaglepatch meant;
- eaglepatch's refusals agree with the release's own ``adaptive_unsupported_reason``;
- the runtime pins a step count through the release's real ``AdaptiveController`` (its policy held off, its
  built states applied with the worker's ``apply_runtime_state``) and hands back to it;
- the real ``eagle_worker_v2.py`` has what the runtime calls, with the signatures it calls them with.
"""

from __future__ import annotations

import ast
import atexit
import importlib.util
import itertools
import json
import os
import time
from pathlib import Path

import pytest

from adaptive_harness import controller, feed, init_states, real_adaptive
from eaglepatch.tuning import adaptive as ad

pytestmark = pytest.mark.real

ADAPTIVE = ["0.5.12", "0.5.16", "0.5.21", "0.5.23"]
WITHOUT = ["0.5.6", "0.5.10"]
RUNTIME = Path(__file__).resolve().parents[2] / "eaglepatch" / "runtime" / "_eaglepatch_runtime.py"
_n = itertools.count()

# What each release is, read by hand from its files (adaptive_spec_params.py, eagle_worker_v2.py).
EXPECTED = {
    "0.5.12": dict(format=ad.ConfigFormat.FLAT, zero_steps=False, min_candidates=2, bs_switch=False,
                   default={1: (1, 3, 7)}),
    "0.5.16": dict(format=ad.ConfigFormat.TIERS, zero_steps=True, min_candidates=1, bs_switch=True,
                   default={1: (1, 3, 7), 8: (0, 1, 3), 32: (0, 1), 64: (0,)}),
    "0.5.21": dict(format=ad.ConfigFormat.TIERS, zero_steps=True, min_candidates=1, bs_switch=True,
                   default={1: (1, 3, 5, 7), 8: (0, 1, 3), 32: (0, 1), 64: (0,)}),
    "0.5.23": dict(format=ad.ConfigFormat.TIERS, zero_steps=True, min_candidates=1, bs_switch=True,
                   default={1: (1, 3, 5, 7), 8: (0, 1, 3), 32: (0, 1), 64: (0,)}),
}


def _files(site: Path) -> dict[str, str | None]:
    return {p: (site / p).read_text() if (site / p).exists() else None for p in ad.SOURCES}


def _release(sglang_release, version: str) -> tuple[Path, ad.AdaptiveRelease]:
    site = sglang_release(version)
    rel = ad.read_release(_files(site), version)
    assert rel is not None
    return site, rel


@pytest.mark.parametrize("version", ADAPTIVE)
def test_what_is_read_of_each_release(sglang_release, version):
    _site, rel = _release(sglang_release, version)
    for key, value in EXPECTED[version].items():
        assert getattr(rel, key) == value, key
    assert rel.algorithms == ("EAGLE", "EAGLE3")
    assert {ad.LIMITS[n][0] for n in rel.limits} == {"enable-dp-attention", "enable-multi-layer-eagle",
                                                      "enable-two-batch-overlap", "enable-pdmux"}


@pytest.mark.parametrize("version", WITHOUT)
def test_releases_without_adaptive_mode_are_refused(sglang_release, version):
    assert ad.read_release(_files(sglang_release(version)), version) is None
    with pytest.raises(ad.Unsupported, match="no adaptive speculative decoding"):
        ad.check_live_grid(None, [1, 3])


@pytest.mark.parametrize("version", ADAPTIVE)
def test_the_default_config_read_is_the_releases_own(sglang_release, version):
    site, rel = _release(sglang_release, version)
    with real_adaptive(site) as (params, _state):
        if rel.format is ad.ConfigFormat.TIERS:
            assert ad.tiers_of(params.DEFAULT_ADAPTIVE_CONFIG, rel.format) == rel.default
        else:
            assert params.AdaptiveSpeculativeParams(initial_steps=3, config={}).candidate_steps == [1, 3, 7]


def _load_policy(params, rel: ad.AdaptiveRelease, path: Path, initial: int):
    if rel.format is ad.ConfigFormat.FLAT:
        return params.AdaptiveSpeculativeParams(initial_steps=initial, config=params.load_adaptive_config(str(path)))
    return params.AdaptiveSpeculativeParams(initial_steps=initial, cfg_path=str(path))


@pytest.mark.parametrize("version", ADAPTIVE)
def test_a_live_launch_config_loads_with_the_releases_loader(sglang_release, version, tmp_path):
    """One tier holding every candidate: every batch size reaches every state (with its CUDA graphs), and the
    launch's step count (the largest) is a candidate, as 0.5.16+ require."""
    site, rel = _release(sglang_release, version)
    steps = [0, 1, 3, 7] if rel.zero_steps else [1, 3, 7]
    tiers = ad.live_tiers(steps)
    path = tmp_path / "live.json"
    path.write_text(ad.dumps(ad.config_document(rel, tiers)))
    with real_adaptive(site) as (params, _state):
        policy = _load_policy(params, rel, path, ad.launch_steps(tiers))
        assert policy.candidate_steps == steps
        if rel.format is ad.ConfigFormat.TIERS:
            assert params.resolve_candidate_steps_from_config(str(path)) == steps
            policy.set_cuda_graph_bs([1, 2, 4, 8, 16, 32, 64, 128])
            for s in steps:
                assert policy.cuda_graph_bs_for_step(s) == [1, 2, 4, 8, 16, 32, 64, 128]
            assert {policy.get_steps_for_batch(bs) for bs in (1, 7, 100)} == {7}  # starts at the launch's


@pytest.mark.parametrize("version", ADAPTIVE)
def test_an_emitted_config_loads_and_routes_each_batch_size_as_meant(sglang_release, version, tmp_path):
    site, rel = _release(sglang_release, version)
    zero = 0 if rel.zero_steps else 1
    measures = [ad.StepMeasure(s, bs, tps) for bs, row in {
        1: {zero: 100.0, 3: 180.0, 5: 175.0, 7: 150.0},
        4: {zero: 300.0, 3: 330.0, 5: 290.0, 7: 250.0},
        16: {zero: 900.0, 3: 700.0, 5: 600.0, 7: 500.0},
    }.items() for s, tps in row.items()]
    tiers = ad.choose_tiers(measures)
    assert tiers == {1: (3, 5), 4: (3,), 16: (zero,)}
    doc = ad.emitted(rel, tiers, str(tmp_path / "adaptive.json"))
    path = tmp_path / "adaptive.json"
    path.write_text(ad.dumps(doc["config"]))
    assert doc["launch_flags"][doc["launch_flags"].index("--speculative-num-steps") + 1] == "5"
    with real_adaptive(site) as (params, _state):
        policy = _load_policy(params, rel, path, ad.launch_steps(tiers))
        if rel.format is ad.ConfigFormat.FLAT:  # no tiers: every tier's candidates together
            assert policy.candidate_steps == sorted({1, 3, 5})
            return
        assert policy.candidate_steps == sorted({zero, 3, 5})
        for bs in (1, 2, 3, 4, 9, 16, 40):
            assert policy._route(bs).candidate_steps == list(tiers[ad.tier_for(tiers, bs)]), bs


class _Args:
    def __init__(self, **kw):
        self.speculative_algorithm, self.speculative_eagle_topk = "EAGLE3", 1
        self.enable_dp_attention = self.enable_multi_layer_eagle = False
        self.enable_two_batch_overlap = self.enable_pdmux = False
        self.__dict__.update(kw)


SHAPES = [
    ({}, {}),
    ({"speculative-algorithm": "EAGLE"}, {"speculative_algorithm": "EAGLE"}),
    ({"speculative-algorithm": "NGRAM"}, {"speculative_algorithm": "NGRAM"}),
    ({"speculative-algorithm": "STANDALONE"}, {"speculative_algorithm": "STANDALONE"}),
    ({"speculative-eagle-topk": "4"}, {"speculative_eagle_topk": 4}),
    ({"enable-dp-attention": "on"}, {"enable_dp_attention": True}),
    ({"enable-multi-layer-eagle": "on"}, {"enable_multi_layer_eagle": True}),
    ({"enable-two-batch-overlap": "on"}, {"enable_two_batch_overlap": True}),
    ({"enable-pdmux": "on"}, {"enable_pdmux": True}),
]


@pytest.mark.parametrize("version", ADAPTIVE)
def test_refusals_agree_with_the_releases_own_reason(sglang_release, version):
    site, rel = _release(sglang_release, version)
    with real_adaptive(site) as (params, _state):
        for flags, attrs in SHAPES:
            ours = ad.unsupported_reason(rel, dict({"speculative-algorithm": "EAGLE3"}, **flags))
            theirs = params.adaptive_unsupported_reason(_Args(**attrs))
            assert (ours is None) == (theirs is None), (flags, ours, theirs)


# ----------------------------------------------------------------------------------------------------------------
# The runtime's pin through the real controller


def _runtime(log_dir: Path):
    spec = importlib.util.spec_from_file_location("_eaglepatch_runtime_live_%d" % next(_n), str(RUNTIME))
    rt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rt)  # type: ignore[union-attr]
    atexit.unregister(rt._at_exit)
    rt.configure(mode="cpu", log_dir=str(log_dir), summary_every=0, flush_seconds=600.0)
    rt._WRITER_THREAD = False
    return rt


class _Req:
    def __init__(self, rid: str):
        self.rid = rid


class _Mode:
    def __init__(self, extend: bool):
        self.extend = extend

    def is_extend(self) -> bool:
        return self.extend


class _Batch:
    """A ScheduleBatch as the entry method reads it: a decode batch, or with ``extend`` a prefill one."""

    def __init__(self, *rids: str, extend: bool = False):
        self.reqs = [_Req(r) for r in rids]
        self.forward_mode, self.is_extend_in_batch = _Mode(extend), False


def _worker(rt, state_mod, params_mod, rel: ad.AdaptiveRelease, cfg: Path, launch: int):
    """An EAGLEWorkerV2 as far as the controller sees it: the AdaptiveSpecWorker protocol (build a state, apply
    one), its decode cycle calling activate_step_by_batch (0.5.16+) and the scheduler's on_verify_complete after
    it (0.5.12 V1 calls it inside the cycle)."""

    class EAGLEWorkerV2:
        def __init__(self):
            self.topk, self.speculative_num_steps, self.speculative_num_draft_tokens = 1, launch, launch + 1
            self.applied = []
            self.adaptive_controller = controller(state_mod, params_mod, self, str(cfg))
            s = self._state(launch)
            self.adaptive_controller.register(s)
            init_states(self.adaptive_controller)

        def _state(self, steps):
            return state_mod.SpecRuntimeState(
                speculative_num_steps=steps, speculative_num_draft_tokens=steps + 1, draft_attn_backend=None,
                cuda_graph_runner=None, target_attn_backend=None, target_graph_runner=None,
                draft_extend_attn_backend=None, cuda_graph_runner_for_draft_extend=None)

        def build_adaptive_runtime_state(self, speculative_num_steps, speculative_num_draft_tokens,
                                         cuda_graph_bs=None):
            return self._state(speculative_num_steps)

        def apply_runtime_state(self, state):
            if self.speculative_num_steps == state.speculative_num_steps:
                return
            self.applied.append(state.speculative_num_steps)
            self.speculative_num_steps = state.speculative_num_steps
            self.speculative_num_draft_tokens = state.speculative_num_draft_tokens

        @rt.entry
        def forward_batch_generation(self, batch):
            if rel.bs_switch and not (batch.forward_mode.is_extend() or batch.is_extend_in_batch):
                self.adaptive_controller.activate_step_by_batch(len(batch.reqs))
            rt.begin("draft", "decode")
            rt.end("draft")
            return self.speculative_num_steps

    return EAGLEWorkerV2()


@pytest.mark.parametrize("version", ADAPTIVE)
def test_the_runtime_pins_each_step_count_through_the_real_controller(sglang_release, version, tmp_path):
    site, rel = _release(sglang_release, version)
    steps = [0, 1, 3, 7] if rel.zero_steps else [1, 3, 7]
    cfg = tmp_path / "live.json"
    cfg.write_text(ad.dumps(ad.config_document(rel, ad.live_tiers(steps))))
    logs = tmp_path / "logs"
    logs.mkdir(mode=0o700)
    rt = _runtime(logs)
    token = "feedc0ffee123456"
    with real_adaptive(site) as (params, state):
        w = _worker(rt, state, params, rel, cfg, launch=7)
        policy = w.adaptive_controller.params
        assert w.forward_batch_generation(_Batch("user-0")) == 7
        name, answer = rt._live_names()
        (logs / name).write_text(json.dumps({"v": 1, "token": token, "steps": steps, "deadline": time.time() + 60}))
        os.chmod(str(logs / name), 0o600)
        rt._live_next = 0.0
        rt._live_poll()
        assert (logs / answer).exists()
        for n, s in enumerate(steps * 2):
            rid = f"eaglepatch-{token}-s{s}-{n}-0"
            was = w.speculative_num_steps
            assert w.forward_batch_generation(_Batch(rid, rid + "b", extend=True)) == was  # a prefill: untouched
            assert w.forward_batch_generation(_Batch(rid, rid + "b")) == s
            for _ in range(30):  # nothing accepted, ever: sglang's policy would move down, and learns nothing
                feed(w.adaptive_controller, [0, 0])
            assert w.speculative_num_steps == s
        assert w.adaptive_controller.params.policy is policy
        rt.flush()
        recs = [json.loads(x) for f in logs.glob("*.jsonl") for x in f.read_text().splitlines()]
        cycles = [r for r in recs if "spec" in r][1:]  # after user-0's: (prefill, decode) per window
        assert [(r["spec"]["steps"], r["spec"].get("pinned", False)) for r in cycles[1::2]] == [(s, True)
                                                                                               for s in steps * 2]
        assert [r["spec"]["steps"] for r in cycles[0::2]] == [7] + (steps * 2)[:-1]  # each prefill: the state before
        # hand back: the policy's own choice, and it learns again
        back = w.forward_batch_generation(_Batch("user-1"))
        assert w.adaptive_controller.params is policy and back in steps
        for _ in range(40):
            feed(w.adaptive_controller, [0, 0])
        own = policy.get_steps_for_batch(1) if rel.bs_switch else policy.current_steps
        assert own < 3 and w.forward_batch_generation(_Batch("user-2")) == own
        assert rt._stats()["errors"] == 0


# ----------------------------------------------------------------------------------------------------------------
# The real worker and controller have what the runtime calls


def _methods(tree: ast.Module, cls: str) -> dict[str, ast.FunctionDef]:
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    return {n.name: n for n in node.body if isinstance(n, ast.FunctionDef)}


def _self_attrs(func: ast.FunctionDef) -> set[str]:
    return {t.attr for n in ast.walk(func) for t in getattr(n, "targets", [getattr(n, "target", None)])
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}


@pytest.mark.parametrize("version", ADAPTIVE)
def test_the_real_files_have_what_the_runtime_calls(sglang_release, version):
    """eagle_worker_v2.py: EAGLEWorkerV2.apply_runtime_state(self, state) sets speculative_num_steps;
    adaptive_controller set in __init__. adaptive_runtime_state.py: AdaptiveController keeps the policy in
    ``params`` and the built states in ``_states`` keyed by step count, and asks the policy what _Pinned answers
    (get_steps_for_batch / on_verify_complete from 0.5.16, update / current_steps in 0.5.12)."""
    site, rel = _release(sglang_release, version)
    spec = site / "sglang" / "srt" / "speculative"
    worker = _methods(ast.parse((spec / "eagle_worker_v2.py").read_text()), "EAGLEWorkerV2")
    apply = worker["apply_runtime_state"]
    assert [a.arg for a in apply.args.args] == ["self", "state"]
    assert "speculative_num_steps" in _self_attrs(apply)
    assert "adaptive_controller" in _self_attrs(worker["__init__"])
    ctl = _methods(ast.parse((spec / "adaptive_runtime_state.py").read_text()), "AdaptiveController")
    assert {"params", "_states"} <= _self_attrs(ctl["__init__"])
    asked = {n.attr for m in ctl.values() for n in ast.walk(m)
             if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Attribute) and n.value.attr == "params"}
    assert asked <= {"get_steps_for_batch", "on_verify_complete", "update", "current_steps", "candidate_steps",
                     "set_cuda_graph_bs", "cuda_graph_bs_for_step"}, asked
    assert ({"get_steps_for_batch", "on_verify_complete"} <= asked) == rel.bs_switch
    assert ({"update", "current_steps"} <= asked) == (not rel.bs_switch)


@pytest.mark.parametrize("version", ADAPTIVE)
def test_the_real_entry_methods_switch_on_the_guard_the_runtime_reads(sglang_release, version):
    """Every worker class with apply_runtime_state takes the prefill path on ``<batch>.forward_mode.is_extend() or
    <batch>.is_extend_in_batch`` (its entry method's first test; <batch> its first argument after self) and lets its
    controller switch only in the other branch (0.5.16+: activate_step_by_batch; 0.5.12 V1: on_verify_complete
    after its verify; 0.5.12 V2: not in the entry method at all, the scheduler calls on_verify_complete_cpu after a
    decode cycle), the guard the runtime's _decode_batch reads before it switches a pinned state."""
    spec = sglang_release(version) / "sglang" / "srt" / "speculative"
    seen = 0
    for path in sorted(spec.glob("eagle_worker*.py")):
        tree = ast.parse(path.read_text())
        for cls in tree.body:
            methods = _methods(tree, cls.name) if isinstance(cls, ast.ClassDef) else {}
            if "apply_runtime_state" not in methods:
                continue
            entry = methods["forward_batch_generation"]
            arg = entry.args.args[1].arg
            first = next(n for n in entry.body if isinstance(n, ast.If))
            assert ast.unparse(first.test) == f"{arg}.forward_mode.is_extend() or {arg}.is_extend_in_batch", path
            switch = [n for n in ast.walk(entry) if isinstance(n, ast.Attribute) and n.attr in (
                "activate_step_by_batch", "on_verify_complete")]
            in_prefill = [n for stmt in first.body for n in ast.walk(stmt) if n in switch]
            assert (switch or "on_verify_complete_cpu" in methods) and not in_prefill, (path, cls.name)
            seen += 1
    assert seen == (2 if version == "0.5.12" else 1)
