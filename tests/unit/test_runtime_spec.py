"""The record's "spec" (speculative settings per cycle) for workers that can change them at run time.

sglang's adaptive speculative decoding (`--speculative-adaptive`; sglang/srt/speculative/adaptive_runtime_state.py,
0.5.12 and later) switches the number of draft steps (and draft tokens) of an EAGLEWorkerV2 while the server runs:
`apply_runtime_state()` sets `speculative_num_steps` / `speculative_num_draft_tokens`, called from
`activate_step_by_batch()` at the start of a decode cycle and from `on_verify_complete_cpu()` between cycles.
A worker whose `adaptive_controller` is set gets `"spec": {"steps", "topk", "draft_tokens"}` in each record, read
at the cycle's end; every other worker's records stay as they were (no "spec").
"""
import ast

import pytest

from runtime_helpers import RECORD_KEYS, Batch, Obj, records
from torch_fakes import FakeTensor


class _Policy(object):
    """Steps for a batch size, as AdaptiveSpeculativeParams.get_steps_for_batch does: fewer for big batches."""

    def get_steps_for_batch(self, bs):
        return 1 if bs >= 8 else 3


class AdaptiveController(object):
    """The part of sglang's AdaptiveController the worker calls (adaptive_runtime_state.py)."""

    def __init__(self, worker):
        self.worker, self.params = worker, _Policy()

    def activate_step_by_batch(self, batch_size):
        target = self.params.get_steps_for_batch(batch_size)
        if target != self.worker.speculative_num_steps:
            self.worker.apply_runtime_state(Obj(speculative_num_steps=target, speculative_num_draft_tokens=target + 1))

    def on_verify_complete(self, num_correct_drafts_per_req, batch_size):
        if sum(num_correct_drafts_per_req) == 0:
            self.worker.apply_runtime_state(Obj(speculative_num_steps=2, speculative_num_draft_tokens=3))


def v2_worker_0_5_23(rt, adaptive, steps=3, topk=1, draft=4):
    """Shaped like sglang 0.5.23's EAGLEWorkerV2 (eagle_worker_v2.py): the settings are plain int attributes set in
    __init__ from get_spec(); adaptive_controller is None unless --speculative-adaptive."""

    class BaseSpecWorker(object):
        def on_verify_complete_cpu(self, num_correct_drafts_per_req, batch_size=0):
            pass

        def activate_step_by_batch(self, batch_size):
            pass

    class EAGLEWorkerV2(BaseSpecWorker):
        def __init__(self):
            self.topk = topk
            self.speculative_num_steps = steps
            self.speculative_num_draft_tokens = draft
            self.adaptive_controller = AdaptiveController(self) if adaptive else None

        @rt.entry
        def forward_batch_generation(self, batch):
            if getattr(batch, "prefill", False):
                rt.begin("target", "prefill")
                rt.end("target")
                return "prefill"
            self.activate_step_by_batch(len(batch.reqs))
            rt.begin("draft", "decode")
            rt.end("draft")
            rt.begin("verify", "decode")
            rt.end("verify")
            rt.accepted(Obj(accept_lens=[1] * len(batch.reqs)), ("accept_lens",), 0)
            return "decode"

        def on_verify_complete_cpu(self, num_correct_drafts_per_req, batch_size=0):
            if self.adaptive_controller is not None:
                self.adaptive_controller.on_verify_complete(num_correct_drafts_per_req, batch_size)

        def activate_step_by_batch(self, batch_size):
            if self.adaptive_controller is not None:
                self.adaptive_controller.activate_step_by_batch(batch_size)

        def apply_runtime_state(self, state):
            if self.speculative_num_steps == state.speculative_num_steps:
                return
            self.speculative_num_steps = state.speculative_num_steps
            self.speculative_num_draft_tokens = state.speculative_num_draft_tokens

    return EAGLEWorkerV2()


def v2_worker_0_5_16(rt, adaptive):
    """Shaped like sglang 0.5.16's EAGLEWorkerV2: the same protocol, settings read from server_args."""
    server_args = Obj(speculative_eagle_topk=4, speculative_num_steps=5, speculative_num_draft_tokens=8,
                      speculative_adaptive=adaptive)

    class EAGLEWorkerV2(object):
        def __init__(self):
            self.server_args = server_args
            self.topk = server_args.speculative_eagle_topk
            self.speculative_num_steps = server_args.speculative_num_steps
            self.speculative_num_draft_tokens = server_args.speculative_num_draft_tokens
            self.adaptive_controller = AdaptiveController(self) if server_args.speculative_adaptive else None

        @rt.entry
        def forward_batch_generation(self, model_worker_batch):
            rt.begin("draft", "decode")
            rt.end("draft")
            return "decode"

        def apply_runtime_state(self, state):
            self.speculative_num_steps = state.speculative_num_steps
            self.speculative_num_draft_tokens = state.speculative_num_draft_tokens

    return EAGLEWorkerV2()


def v2_worker_0_5_10(rt):
    """0.5.10's EAGLEWorkerV2: no adaptive speculation at all (no apply_runtime_state, no adaptive_controller)."""

    class EAGLEWorkerV2(object):
        def __init__(self):
            self.topk, self.speculative_num_steps, self.speculative_num_draft_tokens = 1, 3, 4

        @rt.entry
        def forward_batch_generation(self, model_worker_batch):
            rt.begin("draft", "decode")
            rt.end("draft")

    return EAGLEWorkerV2()


def test_an_adaptive_worker_records_its_settings_per_cycle(rt, logs):
    w = v2_worker_0_5_23(rt, adaptive=True)
    w.forward_batch_generation(Batch(2))                        # steps 3 (draft tokens 4)
    w.forward_batch_generation(Batch(8))                        # activate_step_by_batch: steps 1 in this cycle
    w.on_verify_complete_cpu([0] * 8, 8)                        # the scheduler, between cycles: steps 2
    w.forward_batch_generation(Obj(prefill=True, reqs=[1]))     # a prefill cycle runs with what is set: 2
    w.forward_batch_generation(Batch(2))                        # back to 3 at the cycle's start
    rt.flush()
    recs = records(logs)
    assert [r["spec"] for r in recs] == [
        {"steps": 3, "topk": 1, "draft_tokens": 4},
        {"steps": 1, "topk": 1, "draft_tokens": 2},
        {"steps": 2, "topk": 1, "draft_tokens": 3},
        {"steps": 3, "topk": 1, "draft_tokens": 4},
    ]
    assert all(set(r) - {"accepts"} == RECORD_KEYS | {"spec"} for r in recs)
    assert [r["mode"] for r in recs] == ["decode", "decode", "prefill", "decode"]


def test_the_same_worker_without_the_adaptive_flag_has_no_spec(rt, logs):
    w = v2_worker_0_5_23(rt, adaptive=False)
    w.forward_batch_generation(Batch(2))
    w.forward_batch_generation(Batch(8))
    rt.flush()
    assert [set(r) - {"accepts"} for r in records(logs)] == [RECORD_KEYS, RECORD_KEYS]


@pytest.mark.parametrize("adaptive, expected", [
    (False, None),
    (True, {"steps": 5, "topk": 4, "draft_tokens": 8}),          # 0.5.16 has adaptive speculation too
])
def test_a_0_5_16_worker(rt, logs, adaptive, expected):
    v2_worker_0_5_16(rt, adaptive).forward_batch_generation(Batch(2))
    rt.flush()
    rec = records(logs)[0]
    assert rec.get("spec") == expected
    assert set(rec) == RECORD_KEYS | ({"spec"} if expected else set())


def test_a_worker_that_cannot_adapt_has_no_spec(rt, logs):
    w = v2_worker_0_5_10(rt)
    w.adaptive_controller = object()                            # even a look-alike attribute: no protocol, no spec
    w.forward_batch_generation(Batch(2))
    rt.flush()
    assert set(records(logs)[0]) == RECORD_KEYS


@pytest.mark.parametrize("bad", ["3", 3.0, True, None, FakeTensor([3])])
def test_spec_only_from_plain_ints(rt, logs, bad):
    """Never a tensor read (or anything but a plain int): no spec rather than a guess."""
    w = v2_worker_0_5_23(rt, adaptive=True)
    w.speculative_num_draft_tokens = bad
    w.forward_batch_generation(Batch(2))
    rt.flush()
    rec = records(logs)[0]
    assert "spec" not in rec and rt._stats()["errors"] == 0


def test_a_property_that_raises_gives_no_spec_and_no_error(rt, logs):
    w = v2_worker_0_5_23(rt, adaptive=True)

    def boom(self):
        raise RuntimeError("not ready")

    type(w).topk = property(boom)
    w.forward_batch_generation(Batch(2))
    rt.flush()
    assert "spec" not in records(logs)[0] and rt._stats()["errors"] == 0


def test_spec_in_events_mode_is_the_cycles_own(load, logs, fake_torch):
    """events: the record is written later (by the writer), but the settings are read at the cycle's end."""
    rt = load(mode="events")
    fake_torch.cuda.done = False
    w = v2_worker_0_5_23(rt, adaptive=True)
    w.forward_batch_generation(Batch(2))
    w.forward_batch_generation(Batch(9))
    fake_torch.cuda.done = True
    rt.flush()
    assert [r["spec"]["steps"] for r in records(logs)] == [3, 1]
    assert all(r["timer"] == "events" for r in records(logs))


# --- against the real worker files -----------------------------------------------------------------------------
RELEASES = ["0.5.6", "0.5.10", "0.5.12", "0.5.16", "0.5.21", "0.5.23"]


def _self_assigns(func):
    return set(t.attr for n in ast.walk(func) if isinstance(n, ast.Assign) for t in n.targets
               if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self")


@pytest.mark.real
@pytest.mark.parametrize("version", RELEASES)
def test_the_attributes_read_are_the_real_workers(sglang_release, version):
    """In each pinned release's eagle_worker_v2.py: EAGLEWorkerV2 defines apply_runtime_state exactly when the
    release has adaptive speculation; then __init__ sets the four attributes the runtime reads, and
    apply_runtime_state sets the steps and draft tokens."""
    site = sglang_release(version)
    spec_dir = site / "sglang" / "srt" / "speculative"
    tree = ast.parse((spec_dir / "eagle_worker_v2.py").read_text(encoding="utf-8"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "EAGLEWorkerV2")
    methods = dict((n.name, n) for n in cls.body if isinstance(n, ast.FunctionDef))
    has_adaptive = (spec_dir / "adaptive_runtime_state.py").exists()
    assert ("apply_runtime_state" in methods) == has_adaptive
    assert {"topk", "speculative_num_steps", "speculative_num_draft_tokens"} <= _self_assigns(methods["__init__"])
    if has_adaptive:
        assert "adaptive_controller" in _self_assigns(methods["__init__"])
        assert {"speculative_num_steps", "speculative_num_draft_tokens"} <= _self_assigns(
            methods["apply_runtime_state"])
