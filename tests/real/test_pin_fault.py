"""A live sweep's switch that fails half way, against each release's own switch code (issue 41).

The state switch the runtime pins is the release's own ``apply_runtime_state`` (eagle_worker.py /
eagle_worker_v2.py, compiled from the cached file by adaptive_harness.real_apply: its code, its line numbers)
on a worker whose parts are plain stand-ins, driven by the release's real ``AdaptiveController`` (adaptive_harness:
adaptive_runtime_state.py and adaptive_spec_params.py). Every attribute the switch sets on the worker's objects
goes through one ``__setattr__`` that can be armed to raise at its n-th call: a fault at each point of the switch
in turn, from the first attribute to the last. Afterwards the worker's objects, the controller and its policy are
exactly as before (by identity), the cycle ran in the previous state, the error is counted once, and the next
decode cycle switches once the fault is gone. Also read off the files: every object the switch sets attributes on
lies within the two attribute steps the runtime snapshots, and what lies outside (0.5.21+: the process-wide
server-args context) is synced by its last statement only, so a fault before it leaves it untouched.
"""

from __future__ import annotations

import ast
import atexit
import dataclasses
import importlib.util
import itertools
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from adaptive_harness import apply_classes, controller, init_states, real_adaptive, real_apply
from eaglepatch.tuning import adaptive as ad

pytestmark = pytest.mark.real

ADAPTIVE = ["0.5.12", "0.5.16", "0.5.21", "0.5.23"]
RUNTIME = Path(__file__).resolve().parents[2] / "eaglepatch" / "runtime" / "_eaglepatch_runtime.py"
TOKEN = "feedc0ffee123456"
LAUNCH, HELD, TARGET = 7, 1, 3  # the launch's steps, a pin held before the faulted switch, the switch's target
_n = itertools.count()


def _runtime(log_dir: Path) -> Any:
    spec = importlib.util.spec_from_file_location("_eaglepatch_runtime_fault_%d" % next(_n), str(RUNTIME))
    rt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rt)  # type: ignore[union-attr]
    atexit.unregister(rt._at_exit)
    rt.configure(mode="cpu", log_dir=str(log_dir), summary_every=0, flush_seconds=600.0)
    rt._WRITER_THREAD = False
    return rt


class Faults:
    """Counts the attribute sets of armed objects; raises at set ``fail_at`` (1 = the first)."""

    def __init__(self) -> None:
        self.armed, self.sets, self.fail_at, self.fired = False, 0, None, None

    def arm(self, fail_at: int | None) -> None:
        self.armed, self.sets, self.fail_at, self.fired = True, 0, fail_at, None


class Tag:
    """A resource of a built state (an attention backend, a graph runner): only its identity matters."""

    def __init__(self, name: str, steps: int):
        self.name, self.steps = name, steps

    def __repr__(self) -> str:
        return f"<{self.name}@{self.steps}>"


class Mode:
    def __init__(self, extend: bool):
        self.extend = extend

    def is_extend(self) -> bool:
        return self.extend


class Req:
    def __init__(self, rid: str):
        self.rid = rid


class Batch:
    """A ScheduleBatch as the entry method reads it: its requests, its forward mode, is_extend_in_batch."""

    def __init__(self, *rids: str, extend: bool = False):
        self.reqs = [Req(r) for r in rids]
        self.forward_mode, self.is_extend_in_batch = Mode(extend), False
        self.seq_lens = [1] * len(rids)


def marked(steps: int, n: int = 0) -> Batch:
    return Batch(f"eaglepatch-{TOKEN}-s{steps}-{n}-0")


class World:
    """One worker of ``filename``'s ``cls`` with the release's own apply_runtime_state and controller."""

    def __init__(self, rt: Any, site: Path, params: Any, state_mod: Any, rel: ad.AdaptiveRelease, filename: str,
                 cls: str, cfg: Path):
        faults = self.faults = Faults()

        class Armed:
            def __setattr__(self, name: str, value: Any) -> None:
                if faults.armed:
                    faults.sets += 1
                    if faults.sets == faults.fail_at:
                        faults.fired = f"{type(self).__name__}.{name}"
                        raise RuntimeError(f"injected at set {faults.sets}: {faults.fired}")
                object.__setattr__(self, name, value)

        class Runner(Armed):
            pass

        class DraftWorker(Armed):
            topk = 1

            def _rebuild_topk1_chain_buffers(self) -> None:  # 0.5.16+: new chain buffers for the new steps
                self._topk1_parents_prealloc = Tag("parents", self.speculative_num_steps)
                self._topk1_score_indices_prealloc = Tag("scores", self.speculative_num_steps)

        class ServerArgs(Armed):
            def override(self, source: str, **fields: Any) -> None:  # 0.5.16
                for k, v in fields.items():
                    setattr(self, k, v)

        class Context:  # 0.5.21+: get_context(), process-wide, not armed
            def override(self, source: str, **fields: Any) -> None:
                self.__dict__.update(fields)

        self.context = Context()
        fields = [f.name for f in dataclasses.fields(state_mod.SpecRuntimeState)]
        self.states = {s: state_mod.SpecRuntimeState(**{
            f: (s if f == "speculative_num_steps" else s + 1 if f == "speculative_num_draft_tokens" else Tag(f, s))
            for f in fields}) for s in (0, 1, 3, 5, 7)}
        states = self.states
        bs_switch = rel.bs_switch

        def forward(self: Any, batch: Batch) -> int:
            # sglang's guard: the prefill path, else decode (0.5.16+ switch by batch size there)
            if not (batch.forward_mode.is_extend() or batch.is_extend_in_batch) and bs_switch:
                self.adaptive_controller.activate_step_by_batch(len(batch.seq_lens))
            return self.speculative_num_steps

        def build(self: Any, speculative_num_steps: int, speculative_num_draft_tokens: int,
                  cuda_graph_bs: Any = None) -> Any:
            return states[speculative_num_steps]

        apply = real_apply(site, filename, cls, {"log_info_on_rank0": lambda logger, msg: None, "logger": None,
                                                  "get_context": lambda: self.context,
                                                  "SpecRuntimeState": state_mod.SpecRuntimeState})
        worker_cls = type(cls, (Armed,), {
            "apply_runtime_state": apply, "forward_batch_generation": rt.entry(forward),
            "build_adaptive_runtime_state": build,
            "draft_model_runner": property(lambda w: w.model_runner),  # V1: the draft worker's own runner
            "activate_step_by_batch": lambda w, bs: w.adaptive_controller.activate_step_by_batch(bs)})
        w = self.w = worker_cls()
        w.topk, w.speculative_num_steps, w.speculative_num_draft_tokens = 1, -1, 0
        w.server_args, w.model_runner = ServerArgs(), Runner()
        w.target_worker = w._target_worker = Armed()
        w._target_worker.model_runner = Runner()
        w._draft_worker = DraftWorker()
        w._draft_worker.draft_runner = Runner()
        w._draft_worker.speculative_num_steps = -1
        apply(w, states[LAUNCH])  # every attribute as the launch's state has it
        w.adaptive_controller = controller(state_mod, params, w, str(cfg))
        w.adaptive_controller.register(states[LAUNCH])
        init_states(w.adaptive_controller)
        self.objects = [w, w.server_args, w.model_runner, w._target_worker, w._target_worker.model_runner,
                        w._draft_worker, w._draft_worker.draft_runner, w.adaptive_controller]

    def picture(self) -> list[Any]:
        """Every attribute of every object the switch may touch, by identity, the policy's too, and the context."""
        pol = self.w.adaptive_controller.params
        return [sorted((k, id(v)) for k, v in vars(o).items()) for o in self.objects + [pol]] + [
            sorted(vars(self.context).items())]

    def runs_in(self, steps: int) -> bool:
        """Every attribute the release's switch sets holds the state of ``steps``."""
        s, w = self.states[steps], self.w
        return (w.speculative_num_steps == steps and w.speculative_num_draft_tokens == steps + 1
                and w._target_worker.model_runner.attn_backend is s.target_attn_backend)


def _lease(rt: Any, logs: Path, steps: list[int]) -> None:
    name, _answer = rt._live_names()
    (logs / name).write_text(json.dumps({"v": 1, "token": TOKEN, "steps": steps, "deadline": time.time() + 60}))
    os.chmod(str(logs / name), 0o600)
    rt._live_next = 0.0
    rt._live_poll()


def _cases() -> list[tuple[str, str, str]]:
    """(version, file, class) of each class with an apply_runtime_state, read off the files by hand (collecting
    needs no download); test_the_cases_are_every_class_with_a_switch holds it to the files."""
    return [("0.5.12", "eagle_worker.py", "EAGLEWorker")] + [(v, "eagle_worker_v2.py", "EAGLEWorkerV2")
                                                               for v in ADAPTIVE]


def test_the_cases_are_every_class_with_a_switch(sglang_release):
    assert sorted((v, f, c) for v in ADAPTIVE for f, c in apply_classes(sglang_release(v))) == sorted(_cases())


@pytest.mark.parametrize("version,filename,cls", _cases())
@pytest.mark.parametrize("held", [False, True], ids=["from-sglangs-policy", "from-a-pin"])
def test_a_switch_failing_at_any_attribute_leaves_the_previous_state_whole(sglang_release, tmp_path, version,
                                                                           filename, cls, held):
    site = sglang_release(version)
    rel = ad.read_release({p: (site / p).read_text() if (site / p).exists() else None for p in ad.SOURCES}, version)
    steps = [1, 3, 7]
    cfg = tmp_path / "live.json"
    cfg.write_text(ad.dumps(ad.config_document(rel, ad.live_tiers(steps))))
    with real_adaptive(site) as (params, state_mod):
        # how many attributes a clean switch sets: the fault goes at each of them in turn
        logs = tmp_path / "probe"
        logs.mkdir(mode=0o700)
        rt = _runtime(logs)
        world = World(rt, site, params, state_mod, rel, filename, cls, cfg)
        world.w.forward_batch_generation(Batch("user-0"))
        _lease(rt, logs, steps)
        world.faults.arm(None)
        assert world.w.forward_batch_generation(marked(TARGET)) == TARGET
        total = world.faults.sets
        assert total >= 8 and rt._stats()["errors"] == 0 and world.runs_in(TARGET)

        for fail_at in range(1, total + 1):
            logs = tmp_path / f"at-{fail_at}"
            logs.mkdir(mode=0o700)
            rt = _runtime(logs)
            world = World(rt, site, params, state_mod, rel, filename, cls, cfg)
            w = world.w
            w.forward_batch_generation(Batch("user-0"))
            _lease(rt, logs, steps)
            if held:
                assert w.forward_batch_generation(marked(HELD)) == HELD
            before_steps = w.speculative_num_steps
            before = world.picture()
            world.faults.arm(fail_at)
            assert w.forward_batch_generation(marked(TARGET, 1)) == before_steps, fail_at  # ran in the old state
            assert world.faults.fired, fail_at
            assert world.picture() == before, (fail_at, world.faults.fired)
            assert rt._stats()["errors"] == 1 and rt._stats()["pinned"] == int(held), fail_at
            world.faults.armed = False
            assert w.forward_batch_generation(marked(TARGET, 2)) == TARGET, fail_at  # the next decode cycle
            assert world.runs_in(TARGET) and rt._stats()["errors"] == 1, fail_at
            assert type(w.adaptive_controller.params).__name__ == "_Pinned"


def _targets(func: ast.FunctionDef) -> list[tuple[int, str]]:
    """(line, what) for each attribute the function sets or method it calls on something: ``what`` is the object's
    path from ``self`` (local names bound to ``self.<path>`` resolved), e.g. ``self._draft_worker.draft_runner``,
    or ``outside`` for an object not reached from self."""
    alias: dict[str, str] = {}

    def path(node: ast.AST) -> str:
        if isinstance(node, ast.Name):
            return "self" if node.id == "self" else alias.get(node.id, "outside")
        if isinstance(node, ast.Attribute):
            base = path(node.value)
            return "outside" if base == "outside" else f"{base}.{node.attr}"
        return "outside"

    out = []
    for stmt in func.body:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                alias[node.targets[0].id] = path(node.value)
            elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                    if isinstance(t, ast.Attribute):
                        out.append((node.lineno, path(t.value)))
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                out.append((node.lineno, path(node.func.value)))
    return out


@pytest.mark.parametrize("version,filename,cls", _cases())
def test_what_the_real_switch_touches_lies_within_the_runtimes_snapshot(sglang_release, version, filename, cls):
    """The runtime snapshots the worker and the objects two attribute steps from it (_SNAP_DEPTH): each object the
    release's switch sets attributes on (or calls a method of, as _rebuild_topk1_chain_buffers) is one of them;
    the only thing outside (0.5.21+ ``get_context().override(...)``) is its last statement."""
    site = sglang_release(version)
    path = site / "sglang" / "srt" / "speculative" / filename
    tree = ast.parse(path.read_text())
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    func = next(n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "apply_runtime_state")
    touched = _targets(func)
    depth = {p: p.count(".") for _line, p in touched if p != "outside"}
    assert depth and max(depth.values()) <= 2, depth
    outside = [line for line, p in touched if p == "outside"]
    # (log_info_on_rank0(logger, ...) is a plain function call, not one on an object: not listed)
    assert [line for line in outside if line != func.body[-1].lineno] == [], (outside, func.body[-1].lineno)
