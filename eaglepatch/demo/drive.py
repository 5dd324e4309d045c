"""A stand-in for the sglang scheduler: drives a patched worker's entry method with stub collaborators.

Run as ``python -m eaglepatch.demo.drive SITE --cycles N`` where SITE holds a patched sglang release. Every module
of sglang except the worker file (and the runtime beside it) is replaced by a permissive stub, so the real,
patched ``EAGLEWorkerV2.forward_batch_generation`` runs on a machine without a GPU: its prefill and decode paths,
its ``with`` blocks and early returns, and the lines eaglepatch added. The phase calls it makes land on fakes that
do real CPU work for a realistic share of the cycle (draft ~25%, verify ~60%, draft extend ~15%), and report
accepted tokens drawn from a seeded distribution, so the timing log and ``eaglepatch report`` have something true
to measure. Timer: ``cpu`` (no CUDA here).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import random
import sys
import time
import types
from typing import Any

WORKER_MODULE = "sglang.srt.speculative.eagle_worker_v2"
REAL_MODULES = (WORKER_MODULE, "sglang.srt.speculative._eaglepatch_runtime")


class StubMeta(type):
    """Class-level attribute access on a stub class (``CaptureHiddenMode.FULL``) gives a stub too."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return Stub()


class Stub(metaclass=StubMeta):
    """Anything: callable, subclassable, a context manager, falsy; passes a decorated function through."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs and callable(args[0]) and hasattr(args[0], "__code__"):
            return args[0]  # used as a decorator
        return Stub()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return Stub()

    def __enter__(self) -> "Stub":
        return self

    def __exit__(self, *exc: Any) -> bool:
        return False

    def __bool__(self) -> bool:
        return False

    def __iter__(self):
        return iter(())

    def __mro_entries__(self, bases: tuple) -> tuple:
        return (Stub,)

    def __getitem__(self, key: Any) -> Any:
        return Stub()

    def __or__(self, other: Any) -> Any:
        return Stub()

    __ror__ = __or__


class StubModule(types.ModuleType):
    def __init__(self, name: str):
        super().__init__(name)
        self.__path__: list[str] = []  # a package, so submodules import

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (Stub,), {})


class StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Stubs sglang (but the real worker and runtime) and, when missing, torch and friends."""

    def __init__(self, prefixes: tuple[str, ...]):
        self.prefixes = prefixes

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname in REAL_MODULES or fullname in ("sglang", "sglang.srt", "sglang.srt.speculative"):
            return None
        if any(fullname == p or fullname.startswith(p + ".") for p in self.prefixes):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        return StubModule(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        if module.__name__ == "torch":
            module.cuda = types.SimpleNamespace(is_available=lambda: False)  # type: ignore[attr-defined]
            module.distributed = types.SimpleNamespace(is_available=lambda: False,  # type: ignore[attr-defined]
                                                       is_initialized=lambda: False)


def install_stubs() -> None:
    prefixes = ["sglang"]
    for heavy in ("torch", "triton", "numpy", "msgspec", "zmq"):
        if importlib.util.find_spec(heavy) is None:
            prefixes.append(heavy)
    sys.meta_path.insert(0, StubFinder(tuple(prefixes)))


# ----------------------------------------------------------------------------------------------------------------
# The fakes the entry method calls


def spin(ms: float) -> None:
    """Real CPU work for ``ms`` milliseconds."""
    end = time.perf_counter() + ms / 1000.0
    x = 0
    while time.perf_counter() < end:
        x += 1


class Mode:
    def __init__(self, extend: bool):
        self.extend = extend

    def is_extend(self) -> bool:
        return self.extend

    def is_decode(self) -> bool:
        return not self.extend

    def is_idle(self) -> bool:
        return False

    def is_target_verify(self) -> bool:
        return False


class SeqLens(list):
    @property
    def shape(self) -> tuple[int]:
        return (len(self),)


class Batch:
    def __init__(self, bs: int, extend: bool):
        self.forward_mode = Mode(extend)
        self.is_extend_in_batch = False
        self.seq_lens = SeqLens([100] * bs)
        self.reqs = [object()] * bs
        self.spec_info = Stub()
        self.spec_info_is_none = False


class VerifyInput:
    def is_verify_input(self) -> bool:
        return True


class Output:
    def __init__(self, accept_lens: list[int] | None = None):
        self.accept_lens = accept_lens
        self.logits_output = Stub()
        self.next_token_ids = Stub()
        self.new_seq_lens = None


class Scale:
    """Phase costs in milliseconds, growing a little with batch size, as they do on a GPU."""

    def __init__(self, rng: random.Random):
        self.rng = rng

    def ms(self, base: float, bs: int) -> float:
        return base * (1.0 + 0.08 * (bs - 1)) * self.rng.uniform(0.9, 1.1)


def make_worker(cls: type, rng: random.Random, steps: int) -> Any:
    scale = Scale(rng)
    w = object.__new__(cls)
    state: dict[str, Any] = {}

    class DraftWorker:
        draft_runner = Stub()

        def draft_tp_context(self, *a: Any) -> Any:
            return contextlib.nullcontext()

        def draft(self, batch: Batch) -> VerifyInput:
            spin(scale.ms(0.55, len(batch.reqs)))
            return VerifyInput()

        def _draft_extend_for_decode(self, batch: Batch, out: Output, **kw: Any) -> None:
            spin(scale.ms(0.30, len(batch.reqs)))

        def _draft_extend_for_prefill(self, batch: Batch, *a: Any, **kw: Any) -> Any:
            spin(scale.ms(0.9, len(batch.reqs)))
            return Stub()

    class TargetWorker:
        def forward_batch_generation(self, batch: Batch, **kw: Any) -> Output:
            spin(scale.ms(3.0, len(batch.reqs)))
            return Output()

    def verify(batch: Batch, *a: Any, **kw: Any) -> Output:
        spin(scale.ms(1.3, len(batch.reqs)))
        # accept length per request (bonus token included): 1 + accepted drafts, up to steps + 1
        lens = [1 + min(steps, int(rng.expovariate(0.55))) for _ in batch.reqs]
        state["last"] = lens
        return Output(lens)

    w.draft_worker = DraftWorker()
    w._draft_worker = w.draft_worker
    w.target_worker = TargetWorker()
    w._target_worker = w.target_worker
    w.verify = verify
    w.speculative_num_steps = steps
    w.speculative_algorithm = types.SimpleNamespace(is_standalone=lambda: False)
    w.activate_step_by_batch = lambda bs: None
    w.device = "cpu"
    w.topk = 1
    w.enable_dp_spec_prefill_coordination = False
    return w


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("site", help="folder holding the patched sglang package")
    ap.add_argument("--cycles", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--steps", type=int, default=None, help="draft steps (default: --speculative-num-steps, else 3)")
    # sglang's own flags, as a server's command line carries them: the runtime reads the launch's --speculative-*
    # options (and the batch limits) from this process's command line into the run's header, so that the report
    # knows the step count (report --predict) and the largest batch
    for flag in ("--speculative-algorithm", "--speculative-eagle-topk", "--speculative-num-draft-tokens",
                 "--cuda-graph-max-bs"):
        ap.add_argument(flag)
    ap.add_argument("--speculative-num-steps", type=int, default=None)
    args = ap.parse_args(argv)
    if args.steps is None:
        args.steps = args.speculative_num_steps if args.speculative_num_steps is not None else 3
    sys.path.insert(0, os.path.abspath(args.site))
    install_stubs()
    mod = importlib.import_module(WORKER_MODULE)
    runtime = importlib.import_module("sglang.srt.speculative._eaglepatch_runtime")
    rng = random.Random(args.seed)
    worker = make_worker(mod.EAGLEWorkerV2, rng, args.steps)
    t0 = time.perf_counter()
    prefills = decodes = 0
    for i in range(args.cycles):
        bs = rng.choice((1, 1, 2, 4, 8))
        extend = i % 25 == 0  # a new request arrives now and then
        worker.forward_batch_generation(Batch(bs, extend))
        prefills += extend
        decodes += not extend
        if rng.random() < 0.02:
            time.sleep(0.0005)  # the scheduler's own work between cycles
    runtime.flush()
    took = time.perf_counter() - t0
    print(json.dumps({"cycles": args.cycles, "prefill": prefills, "decode": decodes, "seconds": round(took, 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
