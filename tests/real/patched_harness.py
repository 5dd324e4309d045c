"""Load a patched sglang worker module with its heavy imports stubbed, and drive its entry method.

``load_patched(tmp, rel, source, runtime_source)`` writes the instrumented file into ``<tmp>/sglang/srt/speculative/``
with the timing runtime next to it as ``_eaglepatch_runtime.py`` (as ``apply`` places it), then imports it as
``sglang.srt.speculative.<name>``. Everything it imports that is not the standard library or those two files
(torch, triton, every other ``sglang.*`` module, ...) comes from ``StubFinder``: permissive stub modules whose
CamelCase attributes are stub classes (usable as base classes, instantiable, subscriptable in annotations) and
whose other attributes are ``Permissive`` mocks (callable, awaitable as context managers, and transparent when used
as a decorator, so ``@torch.compile(...)`` leaves the function alone). ``sys.modules`` and ``sys.meta_path`` are
restored afterwards.

The fakes the tests hand to the entry method record each call with the set of phases the runtime has open at
that moment (``Recorder``), so a test sees both the order of the phase calls and that each ran inside its own
``begin``/``end`` pair.
"""

from __future__ import annotations

import abc
import ast
import contextlib
import importlib
import importlib.abc
import importlib.machinery
import sys
import time
import types
from pathlib import Path
from typing import Any, Callable, Iterator
from unittest import mock

# Top-level packages that are always stubbed, even when something of that name is importable here.
FORCED = ("torch", "triton", "sglang", "sgl_kernel", "flashinfer", "numpy", "transformers", "vllm", "deep_gemm")
PACKAGE = "sglang.srt.speculative"
RUNTIME = "_eaglepatch_runtime"


def _camel(name: str) -> bool:
    return name[:1].isupper() and any(c.islower() for c in name)


class Permissive(mock.MagicMock):
    """A MagicMock that passes a function or class through unchanged when called with it alone (a decorator
    factory's result applied to a def), and whose CamelCase attributes are stub classes (``torch.nn.Module``)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs and isinstance(args[0], (types.FunctionType, type)):
            return args[0]
        return super().__call__(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if _camel(name) and not name.startswith("_"):
            cls = stub_class(name)
            setattr(self, name, cls)
            return cls
        return super().__getattr__(name)


class _StubMeta(abc.ABCMeta):
    """Metaclass of stub classes: missing class attributes are Permissive, ``Cls[...]`` is ``Cls``."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = Permissive(name=f"{cls.__name__}.{name}")
        type.__setattr__(cls, name, value)
        return value

    def __getitem__(cls, item: Any) -> Any:
        return cls


class _StubBase:
    """Instances: keyword arguments become attributes; any other attribute is a Permissive (kept)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        for k, v in kwargs.items():
            object.__setattr__(self, k, v)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = Permissive(name=f"{type(self).__name__}.{name}")
        object.__setattr__(self, name, value)
        return value


def stub_class(name: str) -> type:
    """A fresh stub class called ``name``."""
    return _StubMeta(name, (_StubBase,), {"__module__": "stub"})


class StubModule(types.ModuleType):
    """A module (and package) that has every attribute."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = stub_class(name) if _camel(name) else Permissive(name=f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Stubs every module it is asked for, except ``real`` names. Put first in ``sys.meta_path`` with
    ``only=FORCED`` (always stub those), and last with ``only=None`` (stub whatever nothing else found)."""

    def __init__(self, real: set[str], only: tuple[str, ...] | None):
        self.real, self.only = real, only
        self.made: list[str] = []

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname in self.real:
            return None
        if self.only is not None and fullname.split(".")[0] not in self.only:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: Any) -> types.ModuleType:
        m = StubModule(spec.name)
        m.__path__ = []
        m.__all__ = []
        self.made.append(spec.name)
        return m

    def exec_module(self, module: types.ModuleType) -> None:
        return None


class _NoDist:
    """torch.distributed for the runtime: not initialised, so the log file is rank 0."""

    @staticmethod
    def is_available() -> bool:
        return False

    @staticmethod
    def is_initialized() -> bool:
        return False

    @staticmethod
    def get_rank() -> int:
        return 0


def type_checking_names(source: str) -> list[str]:
    """Names a module imports only under ``if TYPE_CHECKING:``. Some releases use one unquoted in an annotation
    evaluated at import (MultiLayerEagleWorker's ``-> ModelRunner``, fine only with Python 3.14's lazy
    annotations); the harness lends them as builtins while the module is imported."""
    names: list[str] = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for sub in ast.walk(node):
                if isinstance(sub, (ast.Import, ast.ImportFrom)):
                    names.extend((a.asname or a.name).split(".")[0] for a in sub.names)
    return names


@contextlib.contextmanager
def _lent_builtins(names: list[str]) -> Iterator[None]:
    import builtins

    lent = [n for n in names if not hasattr(builtins, n)]
    for n in lent:
        setattr(builtins, n, stub_class(n))
    try:
        yield
    finally:
        for n in lent:
            delattr(builtins, n)


@contextlib.contextmanager
def load_patched(tmp: Path, rel: str, source: str, runtime_source: str) -> Iterator[tuple[types.ModuleType, Any]]:
    """Import the patched worker module ``rel`` (e.g. ``eagle_worker.py``) with stubbed dependencies.

    Yields ``(module, runtime)``; the runtime is the copy next to the worker file, configured for CPU timing and
    rank 0. On exit the import system is as it was.
    """
    spec_dir = tmp / "sglang" / "srt" / "speculative"
    spec_dir.mkdir(parents=True, exist_ok=True)
    (spec_dir / rel).write_text(source, encoding="utf-8", newline="")
    (spec_dir / f"{RUNTIME}.py").write_text(runtime_source, encoding="utf-8", newline="")
    name = f"{PACKAGE}.{Path(rel).stem}"
    real = {name, f"{PACKAGE}.{RUNTIME}", PACKAGE}
    saved_modules = dict(sys.modules)
    saved_path = list(sys.meta_path)
    first, last = StubFinder(real, FORCED), StubFinder(real, None)
    sys.meta_path.insert(0, first)
    sys.meta_path.append(last)
    try:
        for stale in [m for m in sys.modules if m.split(".")[0] in FORCED]:
            del sys.modules[stale]
        # sglang and sglang.srt are stubs; the speculative package is a plain (namespace-like) package over
        # spec_dir, so `from . import _eaglepatch_runtime` finds the real runtime file and nothing is invented.
        pkg = types.ModuleType(PACKAGE)
        pkg.__path__ = [str(spec_dir)]
        pkg.__spec__ = importlib.machinery.ModuleSpec(PACKAGE, None, is_package=True)
        srt = importlib.import_module("sglang.srt")
        sys.modules[PACKAGE] = pkg
        srt.speculative = pkg
        with _lent_builtins(type_checking_names(source)):
            module = importlib.import_module(name)
        runtime = sys.modules[f"{PACKAGE}.{RUNTIME}"]
        runtime._DIST = _NoDist()
        runtime.configure(mode="cpu", log_dir=str(tmp / "log"), summary_every=0)
        try:
            yield module, runtime
        finally:
            runtime._stop_flusher()
    finally:
        sys.meta_path[:] = saved_path
        for m in list(sys.modules):
            if m not in saved_modules:
                del sys.modules[m]
        sys.modules.update(saved_modules)


class Recorder:
    """Records calls made by the fakes, with the phases the runtime had open at each call."""

    def __init__(self, runtime: Any, pause_s: float = 0.002):
        self.runtime, self.pause_s = runtime, pause_s
        self.calls: list[tuple[str, tuple[str, ...]]] = []
        self.arity: dict[tuple[str, int], int] = {}

    def learn_arity(self, module: types.ModuleType) -> None:
        """Map each line of each ``a, b = call(...)`` in the module to the number of names it unpacks, so a fake
        called from there returns a tuple of that length (the arity changes across releases)."""
        path = module.__file__
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                t = node.targets[0]
                n = len(t.elts) if isinstance(t, (ast.Tuple, ast.List)) else 0
                for line in range(node.value.lineno, (node.value.end_lineno or node.value.lineno) + 1):
                    self.arity[(path, line)] = n

    def open_phases(self) -> tuple[str, ...]:
        cur = self.runtime._tls.cur
        return tuple(sorted(cur.open)) if cur else ()

    def fake(self, label: str, result: Any = None, pause: bool = True,
             by_kwarg: dict[str, str] | None = None, effect: Callable[..., None] | None = None) -> Callable[..., Any]:
        """A function that records ``label`` (or ``by_kwarg[k]`` when keyword ``k`` is passed), pauses a little
        (so its phase has a measurable duration), calls ``effect(*args, **kwargs)`` if given, and returns
        ``result`` (a tuple of it when the caller unpacks, ``result`` itself when it is a tuple)."""

        def fake_call(*args: Any, **kwargs: Any) -> Any:
            name = label
            for k, alt in (by_kwarg or {}).items():
                if k in kwargs:
                    name = alt
            self.calls.append((name, self.open_phases()))
            if pause and self.pause_s:
                time.sleep(self.pause_s)
            if effect is not None:
                effect(*args, **kwargs)
            caller = sys._getframe(1)
            if isinstance(result, tuple):
                return result
            n = self.arity.get((caller.f_code.co_filename, caller.f_lineno), 0)
            value = result if result is not None else Permissive(name=f"{name}()")
            return tuple([value] * n) if n else value

        return fake_call

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]


class Mode:
    """A ForwardMode: every ``is_*()`` is False except those given as True."""

    def __init__(self, *true: str):
        self._true = set(true)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("is_"):
            return lambda *a, **k: name in self._true
        raise AttributeError(name)

    def __repr__(self) -> str:
        return f"Mode({', '.join(sorted(self._true))})"


class Lens(list):
    """Per-request counts as a device tensor would hold them: a list (what the runtime sums) that also does the
    tensor arithmetic and methods the worker code applies to it (``accept_lens - 1``, ``.sum()``, ``.cpu()``)."""

    @property
    def shape(self) -> "Shape":
        return Shape((len(self),))

    def _any(self, *args: Any, **kwargs: Any) -> Permissive:
        return Permissive(name="lens-op")

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __getattr__ = _any  # type: ignore[assignment]

    def sum(self) -> int:
        return sum(iter(self))

    def tolist(self) -> list[int]:
        return list(self)

    def cpu(self) -> "Lens":
        return self

    def to(self, *args: Any, **kwargs: Any) -> "Lens":
        return self


class Shape(tuple):
    """A tensor shape."""


def tensor(n: int) -> Permissive:
    """A stand-in for a 1-d tensor of ``n`` elements (``.shape[0] == n``)."""
    t = Permissive(name="tensor")
    t.shape = Shape((n,))
    return t
