"""What a valid timing record is, field by field (docs/contract.md "The timing log"): the checks the scan
applies beyond the plain look-ups of its hot loop, and the ``BadLine`` they raise.

A valid record has ``"v": 1``, a number ``t``, a string ``host``, int ``pid`` and ``rank``, a string ``mode``, a
number ``cycle_ms`` and an object ``phases`` of numbers; ``bs`` and ``accepted`` are numbers or null;
``host_cycle_ms`` / ``host_phases`` are optional. Anything else (bad JSON, trailing garbage, a non-object, a
missing or mistyped field, ``NaN``/``Infinity`` literals, another ``v``) is counted in ``skipped_lines``. Blank
lines are ignored and not counted.
"""

from __future__ import annotations

from array import array
from typing import Any


def hist_counts(hist: Any) -> list[tuple[int, int]]:
    """The (tokens, request-cycles) pairs of a record's ``accept_hist`` object, validated (its keys the decimal
    strings of whole numbers, its counts whole numbers, at least 0). Raises ``BadLine``. (An ``accepts`` list, the
    common case, is validated and counted in the scan's own loop.)"""
    out: list[tuple[int, int]] = []
    if type(hist) is not dict:
        raise BadLine("bad accept_hist")
    for k, v in hist.items():
        if not k.isdigit() or type(v) is not int or v < 0:
            raise BadLine("bad accept_hist")
        out.append((int(k), v))
    return out


class BadLine(ValueError):
    """A record that does not match the timing-log format (counted, never raised out of ``aggregate``)."""


def reject_constant(name: str) -> Any:
    """``json``'s ``parse_constant``: ``NaN``/``Infinity`` literals make the line a bad line (raises ``BadLine``)."""
    raise BadLine(f"non-finite number {name}")


def is_num(x: Any) -> bool:
    """Whether ``x`` is a number the series' arrays take: a float, an int that fits one, or a bool."""
    if type(x) is float:
        return True
    if type(x) is int:
        try:
            float(x)
        except OverflowError:
            return False
        return True
    if isinstance(x, (int, float)):  # bool and subclasses: the arrays take them, so do we
        return True
    return False


def append_phases_slow(pm: dict[str, Any], phases: Any) -> None:
    """Slow path after the fast ``pm[name](ms)`` loop raised: undo what it appended, then append every phase
    (creating arrays for new names) or raise ``BadLine`` having appended nothing."""
    if not isinstance(phases, dict):
        raise BadLine("phases is not an object")
    items = list(phases.items())
    # The fast loop appended exactly the leading items whose name had an array and whose value was a number.
    for name, ms in items:
        if name in pm and is_num(ms):
            pm[name].__self__.pop()
        else:
            break
    for _name, ms in items:
        if not is_num(ms):
            raise BadLine("a phase time is not a number")
    for name, ms in items:
        app = pm.get(name)
        if app is None:
            app = pm[name] = array("f").append
        app(ms)


def pop_phases(pm: dict[str, Any], phases: dict[str, Any]) -> None:
    """Undo one fully appended phases dict."""
    for name in phases:
        pm[name].__self__.pop()


def check_skipped(d: dict[str, Any]) -> None:
    """Validate the parts of a record that ``skip`` would otherwise not look at; raise ``BadLine``."""
    phases = d["phases"]
    if not isinstance(phases, dict) or not all(is_num(v) for v in phases.values()):
        raise BadLine("bad phases")
    for name in ("accepted", "bs", "host_cycle_ms"):
        v = d.get(name)
        if v is not None and not is_num(v):
            raise BadLine(f"bad {name}")
    hp = d.get("host_phases")
    if hp is not None and (not isinstance(hp, dict) or not all(is_num(v) for v in hp.values())):
        raise BadLine("bad host_phases")



# The spec keys in the order the compact string shows them; others follow by name.
_SPEC_ORDER = {"steps": 0, "topk": 1, "draft_tokens": 2}


def spec_label(spec: dict[str, Any]) -> str | None:
    """A record's ``"spec"`` as the compact key string ``"steps=3,topk=1,draft_tokens=4"`` (steps, topk,
    draft_tokens first, other keys by name); ``None`` for an empty object. Raises ``BadLine`` for anything but
    an object of numbers, strings, booleans and nulls."""
    if type(spec) is not dict:
        raise BadLine("spec is not an object")
    parts = []
    for k in sorted(spec, key=lambda k: (_SPEC_ORDER.get(k, 3), k)):
        v = spec[k]
        if v is None or isinstance(v, (str, bool)):
            text = "?" if v is None else str(v).lower() if isinstance(v, bool) else v
        elif is_num(v):
            text = repr(v) if type(v) is float else str(v)
        else:
            raise BadLine("a spec value is not a scalar")
        parts.append(f"{k}={text}")
    return ",".join(parts) or None

