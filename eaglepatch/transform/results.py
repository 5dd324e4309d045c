"""What the transform returns: the result values and the sites they carry (no libcst, no I/O).

``instrument`` returns ``Instrumented`` (new text plus what it found), ``NotApplicable`` (no class of the recipe in
the file) or ``Refused`` (the reason, with file, class and line). Each found class is a ``WorkerInfo`` holding its
``PhaseSite``s and ``FactSite``s. Standard library only: callers name these types (type hints, ``isinstance``)
without importing libcst, which only the transform itself (``engine``) pulls in.
"""

from __future__ import annotations

import dataclasses
from typing import Union

__all__ = ["FactSite", "Instrumented", "NotApplicable", "PhaseSite", "Refused", "TransformResult", "WorkerInfo"]


@dataclasses.dataclass(frozen=True)
class PhaseSite:
    """A phase call found in the source: 1-based lines of the statement holding it (original file)."""

    phase: str
    mode: str
    method: str
    call: str
    line: int
    end_line: int
    form: str  # "statement" (begin before, end after) or "return" (begin before; closed at cycle end)


@dataclasses.dataclass(frozen=True)
class FactSite:
    """A per-cycle fact read after a statement: ``expr`` is the local name read, at 1-based ``line``."""

    name: str
    method: str
    expr: str
    attrs: tuple[str, ...]
    bonus_per_req: int
    line: int


@dataclasses.dataclass(frozen=True)
class WorkerInfo:
    """One worker class of the file and what the transform makes of it.

    ``status`` is ``supported`` (entry method and phases found), ``inherits`` (no entry method of its own: the
    base class's instrumented method times it), or ``unsupported`` (with ``reason``). ``timer`` is the family's
    timer (``sync`` or ``events``: what ``--mode auto`` gives it), None when unsupported. ``missing`` lists the
    optional phases of the recipe found nowhere in the class (``"prefill target"``): its records carry none.
    """

    cls: str
    family: str | None
    status: str
    method: str | None = None
    method_start: int | None = None
    method_end: int | None = None
    phases: tuple[PhaseSite, ...] = ()
    facts: tuple[FactSite, ...] = ()
    reason: str | None = None
    timer: str | None = None
    missing: tuple[str, ...] = ()

    @property
    def phase_names(self) -> list[str]:
        """Distinct phase names in source order."""
        seen: list[str] = []
        for p in self.phases:
            if p.phase not in seen:
                seen.append(p.phase)
        return seen


@dataclasses.dataclass(frozen=True)
class Instrumented:
    """Success: ``source`` is the instrumented text; ``changed`` is False when the input already was exactly it."""

    path: str
    source: str
    workers: tuple[WorkerInfo, ...]
    warnings: tuple[str, ...]
    changed: bool
    was_patched: bool


@dataclasses.dataclass(frozen=True)
class NotApplicable:
    """The file holds no class the recipe instruments (it may list unsupported ones)."""

    path: str
    reason: str
    workers: tuple[WorkerInfo, ...] = ()


@dataclasses.dataclass(frozen=True)
class Refused:
    """The transform will not guess: ``message()`` is one line naming file, class and line."""

    path: str
    reason: str
    cls: str | None = None
    line: int | None = None

    def message(self) -> str:
        where = self.path + (f":{self.line}" if self.line else "")
        who = f" ({self.cls})" if self.cls else ""
        return f"{where}{who}: {self.reason}"


TransformResult = Union[Instrumented, NotApplicable, Refused]
