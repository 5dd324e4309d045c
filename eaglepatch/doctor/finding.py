"""What a doctor rule returns: a ``Finding`` (id, severity, title, evidence, the next step), and its severities.

``doctor --json`` prints each as ``{"id", "severity", "title", "evidence": [...], "next"}`` (docs/contract.md).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from eaglepatch.doctor.facts import ServerFacts, evidence

SEVERITIES = ("high", "medium", "low", "info")


@dataclasses.dataclass(frozen=True)
class Finding:
    """One finding of ``doctor --json``: ``{"id", "severity", "title", "evidence": [...], "next"}``."""

    id: str
    severity: str
    title: str
    evidence: tuple[dict[str, Any], ...]
    next: str
    predicted: bool = False  # drawn from the model of the timing records, not measured: "predicted": true

    def __post_init__(self) -> None:
        object.__setattr__(self, "evidence", tuple(e for e in self.evidence if e))

    def to_json(self) -> dict[str, Any]:
        out = {"id": self.id, "severity": self.severity, "title": self.title, "evidence": list(self.evidence),
               "next": self.next}
        if self.predicted:
            out["predicted"] = True
        return out


Rule = Callable[[ServerFacts], "Finding | None"]


def records_ev(f: ServerFacts, text: str) -> dict[str, Any]:
    """Evidence from the timing records: ``text``, with the log folder and timer they came from."""
    return evidence("timing-log", text + (f" ({f.log_dir}, timer {f.timer})" if f.log_dir else ""))
