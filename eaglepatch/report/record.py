"""What a valid timing record is, field by field (docs/contract.md "The timing log"): the checks the scan
applies beyond the plain look-ups of its hot loop, and the ``BadLine`` they raise.

A valid record has ``"v": 1``, a number ``t``, a string ``host``, int ``pid`` and ``rank``, a string ``mode``, a
number ``cycle_ms`` and an object ``phases`` of numbers; ``bs`` and ``accepted`` are numbers or null;
``host_cycle_ms`` / ``host_phases`` are optional; so are ``dp`` and ``node`` (ints, like ``rank``), and ``every``
(written by apply --every N: the cycles the record stands for, itself and the untimed ones after it), a whole
number from 1 to ``MAX_EVERY``. Anything
else (bad JSON, trailing garbage, a non-object, a missing or mistyped field, ``NaN``/``Infinity`` literals,
another ``v``) is counted in ``skipped_lines``. Blank lines are ignored and not counted.

Every value is bounded before it costs memory or time (docs/safety.md, "Hostile logs"), and a record with one out
of bounds is counted in ``skipped_lines`` like any other: ``t`` at least 0 and at most ``MAX_T``; a duration
(``cycle_ms``, ``host_cycle_ms``, each phase) at least 0 and at most ``MAX_MS`` (an hour); ``bs``, ``accepted``,
``pid``, ``rank``, ``dp``, ``node`` and an ``accept_hist`` count at least 0 and at most ``MAX_COUNT``; an
``accepts`` list at most ``MAX_ACCEPTS`` entries and no longer than ``bs``, each entry (and each ``accept_hist``
key) at most the record's ``spec`` draft tokens plus one, and at most ``MAX_TOKENS``; the requests an ``accept_hist`` counts at most ``bs``.
A line longer than ``LINE_CAP`` bytes is skipped unread (``eaglepatch.report.reader``).
"""

from __future__ import annotations

import sys
from array import array
from typing import Any


MAX_T = 1e10  # a record's t (seconds since the epoch) at most: the year 2286
MAX_MS = 3_600_000  # a duration (ms) at most: a cycle or phase of more than an hour is no measurement
MAX_COUNT = 10**12  # bs, accepted, pid, rank and an accept_hist count at most
MAX_TOKENS = 64  # tokens one request produces in a cycle at most (an accepts entry, an accept_hist key)
MAX_ACCEPTS = 4096  # entries of an accepts list at most (the runtime writes 256 at most, then accept_hist)
MAX_EVERY = 1_000_000  # the cycles one record stands for at most ("every": apply --every N)
LINE_CAP = 1 << 20  # bytes of a line at most (the runtime's records are a few KB): a longer one is skipped unread


def accept_cap(spec: Any) -> int:
    """The most tokens one request can produce in a cycle of a record with this ``"spec"``: its draft tokens plus
    one, where it names them, at most ``MAX_TOKENS``."""
    dt = spec.get("draft_tokens") if type(spec) is dict else None
    return dt + 1 if type(dt) is int and 0 < dt < MAX_TOKENS else MAX_TOKENS


def check_accepts(acs: Any, bs: Any, cap: int) -> None:
    """A record's ``accepts`` list, validated: whole numbers, at least 0 and at most ``cap``, no more of them than
    ``bs`` (where it is a number) and ``MAX_ACCEPTS``. Raises ``BadLine``. (The scan's own loop does the same
    inline for the records it counts.)"""
    if type(acs) is not list or len(acs) > MAX_ACCEPTS or (bs is not None and len(acs) > bs):
        raise BadLine("bad accepts")
    for x in acs:
        if type(x) is not int or not 0 <= x <= cap:
            raise BadLine("bad accepts")


def hist_counts(hist: Any, cap: int = MAX_TOKENS, bs: Any = None) -> list[tuple[int, int]]:
    """The (tokens, request-cycles) pairs of a record's ``accept_hist`` object, validated (its keys the ASCII
    decimal strings of whole numbers at most ``cap``, its counts whole numbers, at least 0 and at most
    ``MAX_COUNT``, their sum at most ``bs`` where it is a number). Raises ``BadLine``. (An ``accepts`` list, the
    common case, is validated and counted in the scan's own loop.)"""
    out: list[tuple[int, int]] = []
    if type(hist) is not dict:
        raise BadLine("bad accept_hist")
    total = 0
    for k, v in hist.items():
        # at most 4 digits before int() reads them (the tokens are few); ASCII digits only (int() refuses "²")
        if not (k.isascii() and k.isdigit() and len(k) <= 4) or type(v) is not int or not 0 <= v <= MAX_COUNT:
            raise BadLine("bad accept_hist")
        t = int(k)
        if t > cap:
            raise BadLine("bad accept_hist")
        total += v
        out.append((t, v))
    if bs is not None and total > bs:
        raise BadLine("bad accept_hist")
    return out


class BadLine(ValueError):
    """A record that does not match the timing-log format (counted, never raised out of ``aggregate``)."""


def reject_constant(name: str) -> Any:
    """``json``'s ``parse_constant``: ``NaN``/``Infinity`` literals make the line a bad line (raises ``BadLine``)."""
    raise BadLine(f"non-finite number {name}")


def is_ms(x: Any) -> bool:
    """Whether ``x`` is a duration the series take: a number (``is_num``), at least 0 and at most ``MAX_MS``."""
    try:
        return 0 <= x <= MAX_MS  # TypeError for what is no number (JSON's other values); False for NaN
    except TypeError:
        return False


def is_count(x: Any) -> bool:
    """Whether ``x`` is a ``bs`` or ``accepted``: a number at least 0 and at most ``MAX_COUNT``."""
    try:
        return 0 <= x <= MAX_COUNT
    except TypeError:
        return False


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
    # The fast loop appended exactly the leading items whose name had an array and whose value was a duration.
    for name, ms in items:
        if name in pm and is_ms(ms):
            pm[name].__self__.pop()
        else:
            break
    for _name, ms in items:
        if not is_ms(ms):
            raise BadLine("a phase time is not a duration")
    for name, ms in items:
        app = pm.get(name)
        if app is None:
            # a name of each record's: one string per phase name, not per group (many groups)
            app = pm[sys.intern(name) if type(name) is str else name] = array("f").append
        app(ms)


def pop_phases(pm: dict[str, Any], phases: dict[str, Any]) -> None:
    """Undo one fully appended phases dict."""
    for name in phases:
        pm[name].__self__.pop()


def check_skipped(d: dict[str, Any], cap: int) -> None:
    """Validate the parts of a record that ``skip`` would otherwise not look at (``cap``: its ``accept_cap``);
    raise ``BadLine``."""
    phases = d["phases"]
    if not isinstance(phases, dict) or not all(is_ms(v) for v in phases.values()):
        raise BadLine("bad phases")
    for name in ("accepted", "bs"):
        v = d.get(name)
        if v is not None and not is_count(v):
            raise BadLine(f"bad {name}")
    v = d.get("host_cycle_ms")
    if v is not None and not is_ms(v):
        raise BadLine("bad host_cycle_ms")
    hp = d.get("host_phases")
    if hp is not None and (not isinstance(hp, dict) or not all(is_ms(v) for v in hp.values())):
        raise BadLine("bad host_phases")
    acs = d.get("accepts")
    if acs is not None:
        check_accepts(acs, d.get("bs"), cap)
    elif d.get("accept_hist") is not None:
        hist_counts(d["accept_hist"], cap, d.get("bs"))



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

