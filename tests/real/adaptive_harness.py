"""A release's own adaptive speculative code, run here: ``adaptive_spec_params.py`` (the config loader and the
policy) and ``adaptive_runtime_state.py`` (the controller) of a pinned sglang release, imported from its cached
site under their real names, the few sglang modules they import replaced by small stand-ins (logging on rank 0,
the resolved server-args views, the platform worker lookup). Neither file touches a GPU.

``real_adaptive(site)`` is a context manager giving ``(params_module, state_module)``; ``sys.modules`` is as it
was afterwards. ``controller(state_module, params_module, worker, cfg_path)`` builds the release's
``AdaptiveController`` whichever way its constructor takes the config (0.5.12/0.5.16: a path; 0.5.21+: a policy).
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import sys
import types
from pathlib import Path
from typing import Any, Iterator


def _module(name: str, **attrs: Any) -> types.ModuleType:
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    return m


def _package(name: str, path: Path) -> types.ModuleType:
    m = types.ModuleType(name)
    m.__path__ = [str(path)]
    return m


class _Algorithm:
    def __init__(self, name: str):
        self.name = name

    @classmethod
    def from_string(cls, name: str) -> "_Algorithm":
        return cls(name)

    def get_platform_worker_cls(self) -> None:
        return None  # CUDA: the built-in worker


@contextlib.contextmanager
def real_adaptive(site: Path) -> Iterator[tuple[types.ModuleType, types.ModuleType]]:
    saved = {k: v for k, v in sys.modules.items() if k == "sglang" or k.startswith("sglang.")}
    for k in saved:
        del sys.modules[k]
    srt = site / "sglang" / "srt"
    stand_ins = {
        "sglang": _package("sglang", site / "sglang"),
        "sglang.srt": _package("sglang.srt", srt),
        "sglang.srt.speculative": _package("sglang.srt.speculative", srt / "speculative"),
        "sglang.srt.arg_groups": _package("sglang.srt.arg_groups", srt / "arg_groups"),
        "sglang.srt.utils": _module("sglang.srt.utils", log_info_on_rank0=lambda logger, msg: None),
        "sglang.srt.arg_groups.overrides": _module("sglang.srt.arg_groups.overrides", resolved_view=lambda a: a,
                                                   resolving_view=lambda a: a),
        "sglang.srt.runtime_context": _module("sglang.srt.runtime_context",
                                              attn_dp_enabled_of=lambda a: bool(getattr(a, "enable_dp_attention",
                                                                                        False))),
        "sglang.srt.speculative.spec_info": _module("sglang.srt.speculative.spec_info",
                                                    SpeculativeAlgorithm=_Algorithm),
    }
    sys.modules.update(stand_ins)
    try:
        mods = []
        for name in ("adaptive_spec_params", "adaptive_runtime_state"):
            full = f"sglang.srt.speculative.{name}"
            spec = importlib.util.spec_from_file_location(full, srt / "speculative" / f"{name}.py")
            mod = importlib.util.module_from_spec(spec)
            sys.modules[full] = mod
            spec.loader.exec_module(mod)  # type: ignore[union-attr]
            mods.append(mod)
        yield mods[0], mods[1]
    finally:
        for k in [k for k in sys.modules if k == "sglang" or k.startswith("sglang.")]:
            del sys.modules[k]
        sys.modules.update(saved)


def controller(state_mod: types.ModuleType, params_mod: types.ModuleType, worker: Any, cfg_path: str | None) -> Any:
    """The release's AdaptiveController for ``worker`` with the config file ``cfg_path``."""
    ctl = state_mod.AdaptiveController
    if "policy" in inspect.signature(ctl.__init__).parameters:  # 0.5.21+: the worker builds the policy
        return ctl(worker, params_mod.AdaptiveSpeculativeParams(initial_steps=worker.speculative_num_steps,
                                                                 cfg_path=cfg_path))
    return ctl(worker, config_path=cfg_path)


def init_states(ctl: Any) -> None:
    """``init_states`` without CUDA graphs (0.5.16+ take the graph batch sizes)."""
    if "cuda_graph_bs" in inspect.signature(ctl.init_states).parameters:
        ctl.init_states(cuda_graph_bs=None)
    else:
        ctl.init_states()


def feed(ctl: Any, drafts: list[int]) -> None:
    """What the scheduler does after each verify: ``on_verify_complete`` (0.5.16+ also with the batch size)."""
    if "batch_size" in inspect.signature(ctl.on_verify_complete).parameters:
        ctl.on_verify_complete(drafts, batch_size=len(drafts))
    else:
        ctl.on_verify_complete(drafts)


# The module-level names a release's apply_runtime_state uses, and what stands in for them here: its log line on
# rank 0, the module's logger, and (0.5.21+) the process-wide server-args context it syncs last.
APPLY_GLOBALS = ("log_info_on_rank0", "logger", "get_context", "SpecRuntimeState")


def real_apply(site: Path, filename: str, cls: str, stand_ins: dict[str, Any]) -> Any:
    """``cls.apply_runtime_state`` of the release's ``sglang/srt/speculative/<filename>``, its own code (compiled
    from the file, with the file's name and line numbers) without importing the module (it needs torch and CUDA):
    the module-level names it uses are ``stand_ins``. A name it uses that is not one of APPLY_GLOBALS raises
    KeyError, so a release that does something new is seen, not half run."""
    import ast
    import builtins

    path = site / "sglang" / "srt" / "speculative" / filename
    tree = ast.parse(path.read_text(), filename=str(path))
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    func = next(n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "apply_runtime_state")
    local = {a.arg for a in func.args.args} | {n.id for n in ast.walk(func)
                                               if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    used = {n.id for n in ast.walk(func) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    free = sorted(used - local - set(dir(builtins)))
    unknown = [n for n in free if n not in APPLY_GLOBALS]
    if unknown:
        raise KeyError(f"{filename} {cls}.apply_runtime_state uses {unknown}: no stand-in for them")
    namespace: dict[str, Any] = {"__name__": f"sglang.srt.speculative.{filename[:-3]}"}
    namespace.update({n: stand_ins[n] for n in free})
    namespace.setdefault("SpecRuntimeState", stand_ins.get("SpecRuntimeState"))  # its annotation
    module = ast.Module(body=[func], type_ignores=[])
    exec(compile(module, str(path), "exec"), namespace)
    return namespace["apply_runtime_state"]


def apply_classes(site: Path) -> list[tuple[str, str]]:
    """(file name, class name) of every class of the release's speculative package with an apply_runtime_state."""
    import ast

    out = []
    for path in sorted((site / "sglang" / "srt" / "speculative").glob("*.py")):
        if path.name == "adaptive_runtime_state.py":  # the protocol's declaration, not a worker
            continue
        for n in ast.parse(path.read_text(), filename=str(path)).body:
            if isinstance(n, ast.ClassDef) and any(isinstance(f, ast.FunctionDef) and f.name == "apply_runtime_state"
                                                   for f in n.body):
                out.append((path.name, n.name))
    return out
