"""Small pure helpers shared by the report modules: exact percentiles, phase order, rounding.

Nothing here does I/O. Percentiles are computed exactly from all values (no sketches), with the linear
interpolation numpy uses by default (``numpy.percentile(..., method="linear")``).
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

#: The phase names of docs/contract.md in the order tables, CSV and traces show them; any other phase name follows,
#: sorted alphabetically.
CANONICAL_PHASES: tuple[str, ...] = ("target", "draft", "verify", "draft_extend")

_CANON_RANK = {name: i for i, name in enumerate(CANONICAL_PHASES)}


def phase_sort_key(name: str) -> tuple[int, str]:
    """Sort key that puts the canonical phases first (in ``CANONICAL_PHASES`` order), then the rest by name."""
    return (_CANON_RANK.get(name, len(CANONICAL_PHASES)), name)


def phase_order(names: Iterable[str]) -> list[str]:
    """Return ``names`` (deduplicated) in canonical phase order: target, draft, verify, draft_extend, then others
    alphabetically."""
    return sorted(set(names), key=phase_sort_key)


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """Return the ``q``-th percentile (``q`` in 0..100) of ``sorted_values``, which must be sorted ascending.

    Linear interpolation between the two nearest ranks, exactly as numpy's default method: the virtual index is
    ``(n - 1) * q / 100``. Returns ``None`` for an empty sequence. E.g. ``percentile([1, 2, 3, 4], 90) == 3.7``.
    """
    n = len(sorted_values)
    if n == 0:
        return None
    virtual = (n - 1) * (q / 100.0)
    lo = math.floor(virtual)
    if lo < 0:
        lo = 0
    if lo >= n - 1:
        return float(sorted_values[n - 1])
    t = virtual - lo
    a = float(sorted_values[lo])
    b = float(sorted_values[lo + 1])
    diff = b - a
    # numpy's _lerp: the form that is exact at both ends.
    if t >= 0.5:
        return b - diff * (1.0 - t)
    return a + diff * t


def round_json(value: Any, ndigits: int = 4) -> Any:
    """Round a float to ``ndigits`` decimals for JSON; non-finite floats become ``None`` (JSON has no NaN);
    ``None``, ints and other values pass through unchanged."""
    if type(value) is float:
        if not math.isfinite(value):
            return None
        return round(value, ndigits)
    return value


def key_sort_value(value: Any) -> tuple[int, Any]:
    """Sort key for a group key value: numbers ascending, then strings, then anything else, ``None`` last."""
    if value is None:
        return (3, "")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, value)
    if isinstance(value, str):
        return (1, value)
    return (2, repr(value))


def mode_sort_value(mode: str) -> tuple[int, str]:
    """Sort key for a mode: ``decode`` first, then ``prefill``, then any other mode alphabetically."""
    return ({"decode": 0, "prefill": 1}.get(mode, 2), mode)
