"""Whose tok/s a printed figure is: the few words every text, table and chart axis of eaglepatch puts beside a
tokens-per-second figure, stated once (issue 42). Three figures that count different things go by one unit:

* ``CLIENT``: what the load's client (``bench``, ``sweep``) received, all requests, over the load's wall time;
  the ``client.tokens_per_s`` of ``bench --json`` and each point's ``tokens_per_s`` of ``sweep --json``.
* ``WALL``: the timing records' tokens over cycle plus between time, per process (``wall_tokens_per_s``); the
  scale of every prediction (``report --predict``, bench's "predicted best", doctor's model).
* ``CYCLE``: the timing records' tokens over the time inside the entry method only (``tokens_per_s`` of a
  report group).

The JSON keys keep their names (docs/contract.md); only the words people read change.
"""

from __future__ import annotations

CLIENT = "client tok/s"
WALL = "records' wall tok/s"
CYCLE = "in-cycle tok/s"

#: Every label, for a check that no tok/s goes without one.
ALL: tuple[str, ...] = (CLIENT, WALL, CYCLE)

#: What each label counts, in one line (legends, notes, docs).
MEANING: dict[str, str] = {
    CLIENT: "the output tokens the load's client received, all requests, over the load's wall time",
    WALL: "the timing records' tokens over cycle plus between time, per process",
    CYCLE: "the timing records' tokens over the time inside the entry method only",
}

#: The words of a prediction's note when its no-speculation point is a sweep's client figure left as it is (the
#: sweep has no point at the records' step count to scale it by): a reader of the notes (doctor) labels that
#: point ``CLIENT``, not ``WALL``.
UNSCALED = "not on the records' scale"


def predicted(label: str = WALL) -> str:
    """``predicted <label>``: a prediction's figure on the scale of ``label`` (the records' wall rate)."""
    return f"predicted {label}"


def legend(*labels: str) -> str:
    """``label: what it counts`` for each of ``labels``, joined by ``; ``."""
    return "; ".join(f"{lab}: {MEANING[lab]}" for lab in labels)
