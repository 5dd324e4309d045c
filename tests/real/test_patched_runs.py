"""The patched entry method really runs the timing, on the real worker files of the pinned releases.

Each supported class is instrumented, written into ``<tmp>/sglang/srt/speculative/`` next to the real runtime
(``_eaglepatch_runtime.py``, CPU timer, log in tmp), imported with its heavy imports stubbed (``patched_harness``),
and its entry method is called on a stub ``self`` for one prefill cycle and one decode cycle. The phase calls are
fakes that record the order they ran in and which phases the runtime had open at that moment, and pause 2 ms so
each phase has a measurable duration. The JSONL records the runtime writes must then say: the worker, the mode,
bs = 2, the phases in the order they ran, each at least as long as the fake's pause, and the accepted tokens
(V1: per-request drafts [2, 3] + 1 bonus each = 7; V2: accept_lens [3, 4], bonus included = 7; NGRAM: 5 drafts + 2
bonus, or accept_lens [3, 4] from eagle_sample = 7).

The fakes return stand-ins of the right shape (a tuple as long as the statement unpacks); everything else the entry
method touches is a permissive stub, with the few values it compares or branches on set explicitly.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import json
import sys
import types
from pathlib import Path
from typing import Any, Callable

import pytest

from eaglepatch.transform.engine import instrument
from eaglepatch.transform.results import Instrumented
from patched_harness import Lens, Mode, Permissive, Recorder, _StubBase, load_patched, tensor

pytestmark = pytest.mark.real

RUNTIME_SOURCE = (Path(__file__).resolve().parents[2] / "eaglepatch" / "runtime" / "_eaglepatch_runtime.py").read_text(
    encoding="utf-8"
)
PAUSE_MS = 2.0


@dataclasses.dataclass(frozen=True)
class Case:
    version: str
    rel: str
    cls: str
    family: str  # "v1", "v2", "ngram"

    @property
    def id(self) -> str:
        return f"{self.version}-{self.cls}"


def _cases() -> list[Case]:
    v1 = {"EAGLEWorker": "eagle_worker.py", "MultiLayerEagleWorker": "multi_layer_eagle_worker.py",
          "FrozenKVMTPWorker": "frozen_kv_mtp_worker.py"}
    v2 = {"EAGLEWorkerV2": "eagle_worker_v2.py", "MultiLayerEagleWorkerV2": "multi_layer_eagle_worker_v2.py",
          "FrozenKVMTPWorkerV2": "frozen_kv_mtp_worker_v2.py"}
    table = {
        "0.4.6": ["EAGLEWorker"],
        "0.4.10.post2": ["EAGLEWorker"],
        "0.5.3": ["EAGLEWorker", "NGRAMWorker"],
        "0.5.6": ["EAGLEWorker", "EAGLEWorkerV2", "NGRAMWorker"],
        "0.5.10": ["EAGLEWorker", "EAGLEWorkerV2", "MultiLayerEagleWorker", "MultiLayerEagleWorkerV2", "NGRAMWorker"],
        "0.5.12": ["EAGLEWorker", "EAGLEWorkerV2", "FrozenKVMTPWorker", "MultiLayerEagleWorker",
                   "MultiLayerEagleWorkerV2", "NGRAMWorker"],
        "0.5.16": ["EAGLEWorkerV2", "FrozenKVMTPWorkerV2", "MultiLayerEagleWorkerV2", "NGRAMWorker"],
        "0.5.21": ["EAGLEWorkerV2", "FrozenKVMTPWorkerV2", "MultiLayerEagleWorkerV2", "NGRAMWorker"],
        "0.5.23": ["EAGLEWorkerV2", "FrozenKVMTPWorkerV2", "MultiLayerEagleWorkerV2", "NGRAMWorker"],
    }
    out = []
    for version, classes in table.items():
        for cls in classes:
            if cls in v1:
                out.append(Case(version, v1[cls], cls, "v1"))
            elif cls in v2:
                out.append(Case(version, v2[cls], cls, "v2"))
            else:
                out.append(Case(version, "ngram_worker.py", cls, "ngram"))
    return out


CASES = _cases()


# ---------------------------------------------------------------------------------------------------------------
# Stand-ins


# What the V2 fakes return as accept_lens: a list-like Lens, or (test_v2_device_accept_lens_...) a CUDA tensor.
ACCEPT_LENS: list[Any] = [lambda: Lens([3, 4])]


def _result() -> Permissive:
    """What verify (and every other faked call) returns: the accepted-token fields of every release."""
    r = Permissive(name="result")
    r.accept_length_per_req_cpu = [2, 3]  # V1: drafts only
    r.num_correct_drafts_per_req_cpu = [2, 3]  # V1 0.5.12
    r.accept_lens = ACCEPT_LENS[0]()  # V2: bonus included
    r.verified_id = tensor(2)
    r.draft_extend_input.input_ids = tensor(2)
    r.new_seq_lens = tensor(2)
    return r


def _batch(case: Case, prefill: bool) -> Permissive:
    b = Permissive(name="batch")
    b.forward_mode = Mode("is_extend") if prefill else Mode("is_decode")
    b.is_extend_in_batch = False
    b.reqs = [Permissive(name="req0"), Permissive(name="req1")]
    b.seq_lens = tensor(2)
    b.spec_info.verified_id = tensor(2)
    b.spec_info.is_verify_input = lambda: False  # 0.5.21+: a pre-built verify input skips the draft
    b.get_model_worker_batch.return_value = b  # the ModelWorkerBatch is the batch itself here
    b.has_grammar = False
    b.return_logprob = False
    return b


def _self(module: types.ModuleType, case: Case, rec: Recorder) -> Any:
    """A stub worker: a subclass of the real class (same name) whose phase collaborators are recording fakes and
    whose other attributes are permissive stubs."""
    cls = getattr(module, case.cls)
    o: dict[str, Any] = {"__getattr__": _StubBase.__getattr__}
    o["server_args"] = types.SimpleNamespace(enable_dp_attention=False)
    o.update(speculative_num_steps=3, topk=1, speculative_num_draft_tokens=4, page_size=1, device="cpu",
             enable_dp_spec_prefill_coordination=False, plan_stream=None, adaptive_controller=None)
    if case.family == "v1":
        o["forward_target_extend"] = staticmethod(rec.fake("target"))
        o["forward_draft_extend"] = staticmethod(rec.fake("draft_extend"))
        o["draft"] = staticmethod(rec.fake("draft"))
        o["verify"] = staticmethod(rec.fake("verify", _result()))
        o["forward_draft_extend_after_decode"] = staticmethod(rec.fake("draft_extend"))
    elif case.family == "v2":
        target = Permissive(name="target_worker")
        target.forward_batch_generation = rec.fake("target", _result())
        draft = Permissive(name="draft_worker")
        draft.draft = rec.fake("draft")
        draft._draft_extend_for_prefill = rec.fake("draft_extend")
        draft._draft_extend_for_decode = rec.fake("draft_extend")
        draft._draft_extend_plan_for_decode = rec.fake("plan (look-alike, not a phase)", pause=False)
        o.update(target_worker=target, _target_worker=target, draft_worker=draft, _draft_worker=draft)
        o["verify"] = staticmethod(rec.fake("verify", _result()))
    else:
        def lookup_done(batch: Any, *args: Any, **kwargs: Any) -> None:
            # Like the real lookup: a decode batch leaves it as a TARGET_VERIFY batch (extend returns at once).
            if batch.forward_mode.is_decode():
                batch.forward_mode = Mode("is_target_verify")

        o["_prepare_for_speculative_decoding"] = staticmethod(rec.fake("draft", effect=lookup_done))
        target = Permissive(name="target_worker")
        target.forward_batch_generation = rec.fake("target", _result(), by_kwarg={"is_verify": "verify"})
        o.update(target_worker=target, _target_worker=target)
        # The n-gram store's bookkeeping after verify (not a phase; it slices the requests' token lists).
        o["_update_ngram_cache"] = o["_update_ngram_corpus"] = staticmethod(lambda *a, **k: None)
    sub = type(cls.__name__, (cls,), o)
    return object.__new__(sub)


def _module_overrides(module: types.ModuleType, case: Case, rec: Recorder) -> None:
    """Module-level names the entry method compares or branches on."""
    if hasattr(module, "get_parallel"):  # 0.5.21+: the pipeline-parallel tail draft runs only when pp_size > 1
        module.get_parallel = lambda: types.SimpleNamespace(pp_size=1, attn_dp_rank=0)
    if hasattr(module, "get_global_tracing_enabled"):
        module.get_global_tracing_enabled = lambda: False
    if case.family == "ngram":
        # The accept step after verify: 5 drafts accepted in all (up to 0.5.13), or accept_lens (0.5.14+).
        module.eagle_sample = rec.fake("accept (not a phase)", (Permissive(), Lens([3, 4]), Permissive()),
                                       pause=False)


def _run_cycles(tmp_path: Path, sglang_release, recipe, case: Case,
                setup: Callable[[Any], None] | None = None) -> tuple[list[dict], list[list], Instrumented]:
    """Instrument, load, run one prefill and one decode cycle; returns (records, calls per cycle, result).
    ``setup(runtime)`` runs once the patched module and its runtime are loaded."""
    site = sglang_release(case.version)
    src = (site / "sglang" / "srt" / "speculative" / case.rel).read_bytes().decode("utf-8")
    res = instrument(src, case.rel, recipe)
    assert isinstance(res, Instrumented), res
    calls_per_cycle = []
    with load_patched(tmp_path, case.rel, res.source, RUNTIME_SOURCE) as (module, runtime):
        if setup is not None:
            setup(runtime)
        rec = Recorder(runtime, PAUSE_MS / 1000.0)
        rec.learn_arity(module)
        _module_overrides(module, case, rec)
        worker = _self(module, case, rec)
        entry_name = next(w.method for w in res.workers if w.cls == case.cls)
        entry = getattr(worker, entry_name)
        assert getattr(entry, "_eaglepatch_entry", False), "the entry method is not decorated"
        params = inspect.signature(getattr(type(worker), entry_name)).parameters
        for prefill in (True, False):
            batch = _batch(case, prefill)
            if case.family == "ngram":  # up to 0.5.13 the accept step is verify_input.verify(...)
                batch.spec_info.verify = rec.fake("accept (not a phase)", (Permissive(), Permissive(), 5),
                                                  pause=False)
            kwargs = {}
            if "on_publish" in params:
                kwargs["on_publish"] = rec.fake("on_publish (not a phase)", pause=False)
            rec.calls.clear()
            entry(batch, **kwargs)
            calls_per_cycle.append(list(rec.calls))
        runtime.flush()
        stats = runtime._stats()
        assert stats["errors"] == 0, stats
        logs = sorted((tmp_path / "log").glob("*.jsonl"))
        assert len(logs) == 1, logs
        records = [d for d in map(json.loads, logs[0].read_text().splitlines()) if d.get("kind") != "run"]
    return records, calls_per_cycle, res


def _phase_calls(calls: list) -> list[str]:
    """The fakes' labels that are phases, in call order; non-phase calls must run with no phase open, phase calls
    with exactly their own phase open."""
    phases = []
    for label, open_now in calls:
        if "(" in label:  # "plan (look-alike, not a phase)", "on_publish (not a phase)", ...
            assert open_now == (), f"{label} ran inside phase(s) {open_now}"
        else:
            assert open_now == (label,), f"the {label} call ran with phases {open_now} open"
            phases.append(label)
    return phases


EXPECTED_PREFILL = {"v1": ["target", "draft_extend"], "v2": ["target", "draft_extend"],
                    # NGRAM calls its trie lookup on every cycle (it returns at once on an extend batch), so a
                    # prefill record carries a short "draft" phase before the target forward.
                    "ngram": ["draft", "target"]}
EXPECTED_DECODE = {"v1": ["draft", "verify", "draft_extend"], "v2": ["draft", "verify", "draft_extend"],
                   "ngram": ["draft", "verify"]}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_patched_entry_method_times_prefill_and_decode(tmp_path, sglang_release, recipe, case):
    """One prefill and one decode cycle through the patched entry method give two records with the phases in the
    order they ran, each phase call inside its own begin/end, bs and (for decode) the accepted tokens."""
    records, calls, _res = _run_cycles(tmp_path, sglang_release, recipe, case)
    assert _phase_calls(calls[0]) == EXPECTED_PREFILL[case.family]
    assert _phase_calls(calls[1]) == EXPECTED_DECODE[case.family]
    assert len(records) == 2
    prefill, decode = records
    for rec, mode, phases in ((prefill, "prefill", EXPECTED_PREFILL), (decode, "decode", EXPECTED_DECODE)):
        assert rec["v"] == 1
        assert rec["worker"] == case.cls
        assert rec["mode"] == mode
        assert rec["bs"] == 2
        assert rec["timer"] == "cpu"
        assert list(rec["phases"]) == phases[case.family]
        for name, ms in rec["phases"].items():
            assert ms >= PAUSE_MS * 0.9, f"{name}: {ms} ms, the fake paused {PAUSE_MS} ms"
        assert rec["cycle_ms"] >= sum(rec["phases"].values()) - 0.001
    assert prefill["accepted"] is None
    if case.family != "ngram":  # NGRAM: see test_ngram_accepted_tokens_reach_the_record
        assert decode["accepted"] == 7
        # per request, bonus included, in batch order: V1's drafts [2, 3] + 1 each, V2's accept_lens [3, 4]
        assert decode["accepts"] == [3, 4]
    assert "accepts" not in prefill


@pytest.mark.parametrize(
    "case", [c for c in CASES if c.family == "ngram"], ids=[c.id for c in CASES if c.family == "ngram"]
)
def test_ngram_accepted_tokens_reach_the_record(tmp_path, sglang_release, recipe, case):
    """NGRAM's decode record carries the accepted tokens: 5 drafts + 1 bonus per request (up to 0.5.13), or
    eagle_sample's accept_lens [3, 4], bonus included (0.5.14+): 7 either way. Only the per-request counts give
    the record's ``accepts``; a total (5 drafts for the batch) gives none."""
    records, _calls, res = _run_cycles(tmp_path, sglang_release, recipe, case)
    assert [w.facts for w in res.workers if w.cls == case.cls][0], "the transform found the fact"
    assert records[1]["accepted"] == 7
    per_request = tuple(int(x) for x in case.version.split(".")[:3]) >= (0, 5, 14)
    assert records[1].get("accepts") == ([3, 4] if per_request else None)


@pytest.mark.parametrize("version", ["0.5.21", "0.5.23"])
def test_v2_tail_draft_and_dp_prefill_coordination(tmp_path, sglang_release, recipe, version):
    """0.5.21+ EAGLEWorkerV2: with pipeline parallelism the tail draft (with_topology=True) runs after the draft
    extend and accumulates into the same "draft" phase; a heterogeneous DP rank's prefill runs an idle draft, then
    the target and draft extend in _forward_prefill_batch, and is a prefill record."""
    case = Case(version, "eagle_worker_v2.py", "EAGLEWorkerV2", "v2")
    site = sglang_release(version)
    src = (site / "sglang" / "srt" / "speculative" / case.rel).read_bytes().decode("utf-8")
    res = instrument(src, case.rel, recipe)
    assert isinstance(res, Instrumented)
    with load_patched(tmp_path, case.rel, res.source, RUNTIME_SOURCE) as (module, runtime):
        rec = Recorder(runtime, PAUSE_MS / 1000.0)
        rec.learn_arity(module)
        _module_overrides(module, case, rec)
        module.get_parallel = lambda: types.SimpleNamespace(pp_size=2, attn_dp_rank=0)
        worker = _self(module, case, rec)
        worker.draft_worker.draft = rec.fake("draft", by_kwarg={"with_topology": "tail draft"})
        # The tail draft returns (verify input, parent list, top scores index).
        tail = (Permissive(), Permissive(), Permissive())
        real_draft = worker.draft_worker.draft

        def draft(*args: Any, **kwargs: Any) -> Any:
            out = real_draft(*args, **kwargs)
            return tail if kwargs.get("with_topology") else out

        worker.draft_worker.draft = draft
        batch = _batch(case, prefill=False)
        worker.forward_batch_generation(batch)
        decode_calls = list(rec.calls)

        rec.calls.clear()
        type(worker).enable_dp_spec_prefill_coordination = True
        batch = _batch(case, prefill=True)
        batch.is_extend_in_batch = True
        batch.draft_global_num_tokens = None
        batch.global_num_tokens = [3, 5]
        module.DPSpecPrefillCoordinationPlan = lambda *a, **k: types.SimpleNamespace(
            heterogeneous=True, apply=lambda *a, **k: None
        )
        result = _result()
        result.extra_keep_alive_refs = None
        worker.target_worker.forward_batch_generation = rec.fake("target", result)
        worker.forward_batch_generation(batch)
        dp_calls = list(rec.calls)
        runtime.flush()
        records = [d for p in (tmp_path / "log").glob("*.jsonl") for d in map(json.loads, p.read_text().splitlines())
                   if d.get("kind") != "run"]
    assert [c[0] for c in decode_calls] == ["draft", "verify", "draft_extend", "tail draft"]
    assert decode_calls[3][1] == ("draft",), "the tail draft runs inside the draft phase"
    assert _phase_calls(dp_calls) == ["draft", "target", "draft_extend"]
    decode, dp_prefill = records
    assert list(decode["phases"]) == ["draft", "verify", "draft_extend"]
    assert decode["phases"]["draft"] >= 2 * PAUSE_MS * 0.9, "two draft calls accumulate"
    assert decode["accepted"] == 7
    assert dp_prefill["mode"] == "prefill"
    assert list(dp_prefill["phases"]) == ["draft", "target", "draft_extend"]


def _runtime_fakes() -> types.ModuleType:
    """tests/unit/torch_fakes.py, the runtime tests' fake CUDA torch (events the test completes, pinned host copies)."""
    spec = importlib.util.spec_from_file_location(
        "_runtime_fakes", Path(__file__).resolve().parents[1] / "unit" / "torch_fakes.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("case", [c for c in CASES if c.family == "v2"], ids=lambda c: c.id)
def test_v2_device_accept_lens_are_copied_to_pinned_memory(tmp_path, sglang_release, recipe, case, monkeypatch):
    """The release's real V2 entry method under the events timer with accept_lens a CUDA tensor: the runtime never
    reads it on the host (a .tolist() or .sum() would assert), copies it asynchronously into pinned memory, and the
    decode record carries the 7 tokens once the copy's event is done."""
    f = _runtime_fakes()
    torch = types.ModuleType("torch")
    torch.cuda = f.FakeCuda()
    torch._C = types.SimpleNamespace(_cuda_getCurrentRawStream=torch.cuda.raw_stream)
    torch.Tensor = f.FakeTensor
    pinned: list[Any] = []

    def empty(shape: Any, dtype: Any = None, pin_memory: bool = False) -> Any:
        assert pin_memory, "the host copy must go to pinned memory"
        host = f.FakeHost(shape, dtype)
        pinned.append(host)
        return host

    torch.empty = empty

    class DeviceLens(f.FakeTensor):
        """accept_lens on the GPU: also the arithmetic the worker applies to it (unread, like Lens's)."""

        def __init__(self) -> None:
            f.FakeTensor.__init__(self, [3, 4], is_cuda=True)

        def _any(self, *args: Any, **kwargs: Any) -> Permissive:
            return Permissive(name="lens-op")

        __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _any

        def __getattr__(self, name: str) -> Permissive:
            return Permissive(name=f"lens.{name}")

    def setup(runtime: Any) -> None:
        # The worker module imported the harness's stub torch; the runtime looks torch up when it needs it.
        # (Not monkeypatch.setitem: its undo would put the harness's stub back after load_patched has restored
        # sys.modules; load_patched itself removes this entry.)
        sys.modules["torch"] = torch
        runtime.configure(mode="events", log_dir=str(tmp_path / "log"), summary_every=0)

    monkeypatch.setattr(sys.modules[__name__], "ACCEPT_LENS", [DeviceLens])
    records, _calls, _res = _run_cycles(tmp_path, sglang_release, recipe, case, setup)
    prefill, decode = records
    assert decode["timer"] == "events" and prefill["timer"] == "events"
    assert decode["accepted"] == 7 and decode["bs"] == 2
    assert decode["accepts"] == [3, 4], "the per-request counts come from the same pinned copy"
    assert pinned and all(h.values == [3, 4] for h in pinned), "accept_lens not copied into pinned memory"
    assert sys.modules.get("torch") is not torch, "the fake torch outlived the test"
