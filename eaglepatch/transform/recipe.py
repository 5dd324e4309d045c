"""Recipes: what to instrument, as data (the built-in ones live in the top-level ``patches/`` folder).

A recipe names worker families: their classes, the entry method timed as a whole, helper methods that also hold
phase calls, the phase calls themselves (by the dotted name of the callee and, where needed, keywords that must
or must not be present), and the per-cycle facts (accepted tokens) read after a phase. See patches/README.md.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from importlib import resources
from pathlib import Path
from typing import Any

from eaglepatch.errors import UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

PHASES = ("target", "draft_extend", "draft", "verify")
MODES = ("prefill", "decode")
TIMERS = ("sync", "events")
# The names a recipe puts into the lines eaglepatch writes (phases, locals, attributes) and the callees it matches.
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_FROM = re.compile(r"(?:\$|[A-Za-z_][A-Za-z0-9_]*)\Z")
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*\Z")


@dataclasses.dataclass(frozen=True)
class PhaseCall:
    """One call shape that is a phase: ``calls`` are the callee's dotted names, e.g. ``self.draft_worker.draft``
    (more than one when releases name the same step differently; any one of them is this phase).

    ``required``: a class of the family without this call is refused. When False, a class without it is still
    instrumented; if no other entry of the same phase and mode was found either, the result lists the phase as
    missing (a warning: records of that mode carry no such phase)."""

    name: str
    mode: str
    calls: tuple[str, ...]
    with_kwargs: tuple[str, ...] = ()
    without_kwargs: tuple[str, ...] = ()
    required: bool = True


@dataclasses.dataclass(frozen=True)
class Fact:
    """A per-cycle value read right after a phase (``after``) or another call (``after_call``).

    ``from_`` lists candidate local names bound by that statement (``$`` = its single assignment target);
    ``attrs`` the attributes to read from it in order of preference (empty: the value itself).
    """

    name: str
    from_: tuple[str, ...]
    attrs: tuple[str, ...]
    bonus_per_req: int = 0
    after: str | None = None
    after_call: str | None = None
    required: bool = False


@dataclasses.dataclass(frozen=True)
class Family:
    """A worker family: classes of one shape, instrumented the same way."""

    name: str
    classes: tuple[str, ...]
    entry: tuple[str, ...]
    helpers: tuple[str, ...] = ()
    phases: tuple[PhaseCall, ...] = ()
    facts: tuple[Fact, ...] = ()
    timer: str = "sync"  # what ``--mode auto`` times this family with: "sync" or "events"


@dataclasses.dataclass(frozen=True)
class Unsupported:
    """Classes known and deliberately left alone, with the reason ``show`` gives."""

    classes: tuple[str, ...]
    reason: str


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A whole recipe: families plus known-unsupported classes; ``source`` says where it came from."""

    families: tuple[Family, ...]
    unsupported: tuple[Unsupported, ...] = ()
    source: str = "built-in"

    def family_of(self, class_name: str) -> Family | None:
        for fam in self.families:
            if class_name in fam.classes:
                return fam
        return None

    def unsupported_reason(self, class_name: str) -> str | None:
        for u in self.unsupported:
            if class_name in u.classes:
                return u.reason
        return None

    @property
    def entry_names(self) -> frozenset[str]:
        return frozenset(n for fam in self.families for n in fam.entry)


_SEE = "see patches/README.md"


def _strs(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise UsageError(f"recipe {where}: expected a string or a list of strings, got {value!r}: {_SEE}")


def _tables(data: dict[str, Any], key: str, where: str, header: str) -> list[dict[str, Any]]:
    """``data[key]`` as a list of tables (TOML ``[[header]]``); absent is empty; anything else a UsageError."""
    value = data.get(key, [])
    if isinstance(value, list) and all(isinstance(v, dict) for v in value):
        return value
    if isinstance(value, dict):
        raise UsageError(f"{where}: [{header}] is a single table; write [[{header}]] (an array of tables): {_SEE}")
    raise UsageError(f"{where}: '{key}' must be an array of tables ([[{header}]]), not {value!r}: {_SEE}")


def _str(data: dict[str, Any], key: str, where: str) -> str | None:
    """``data[key]`` as a string (None when absent); a value of another type is a UsageError."""
    value = data.get(key)
    if value is None or isinstance(value, str):
        return value
    raise UsageError(f"{where}: '{key}' must be a string, not {value!r}: {_SEE}")


def _bool(data: dict[str, Any], key: str, where: str, default: bool) -> bool:
    value = data.get(key, default)
    if isinstance(value, bool):
        return value
    raise UsageError(f"{where}: '{key}' must be true or false, not {value!r}: {_SEE}")


def _names(values: tuple[str, ...], where: str, pattern: re.Pattern[str], what: str) -> tuple[str, ...]:
    """``values``, each checked against ``pattern`` (they are written into the worker file or matched as code)."""
    for v in values:
        if not pattern.match(v):
            raise UsageError(f"{where}: {v!r} is not {what}: {_SEE}")
    return values


def _int(data: dict[str, Any], key: str, where: str, default: int) -> int:
    value = data.get(key, default)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise UsageError(f"{where}: '{key}' must be a whole number, not {value!r}: {_SEE}")


def parse_recipe(data: dict[str, Any], source: str) -> Recipe:
    """Build a ``Recipe`` from parsed TOML; raises ``UsageError`` naming the bad field."""
    families = []
    for i, fam in enumerate(_tables(data, "family", source, "family")):
        where = f"{source}: family #{i + 1}"
        for key in ("name", "classes", "entry"):
            if key not in fam:
                raise UsageError(f"{where}: missing field {key!r}: {_SEE}")
        name = fam["name"]
        if not isinstance(name, str):
            raise UsageError(f"{where}: 'name' must be a string, not {name!r}: {_SEE}")
        classes = _strs(fam["classes"], f"{where} classes")
        entry = _strs(fam["entry"], f"{where} entry")
        timer = fam.get("timer", "sync")
        if timer not in TIMERS:
            raise UsageError(f"{where}: timer must be one of {', '.join(TIMERS)}, not {timer!r}: {_SEE}")
        phases = []
        for j, ph in enumerate(_tables(fam, "phase", where, "family.phase")):
            pw = f"{where} phase #{j + 1}"
            call = ph.get("call")
            if not isinstance(ph.get("name"), str) or not (
                isinstance(call, str) or (isinstance(call, list) and call and all(isinstance(c, str) for c in call))
            ):
                raise UsageError(f"{pw}: needs a string field 'name' and 'call' (a string or a list of strings): "
                                 f"{_SEE}")
            _names((ph["name"],), pw, _IDENT, "a phase name (letters, digits, _)")
            mode = ph.get("mode", "decode")
            if mode not in MODES:
                raise UsageError(f"{pw}: mode must be one of {', '.join(MODES)}, not {mode!r}: {_SEE}")
            phases.append(
                PhaseCall(
                    name=ph["name"],
                    mode=mode,
                    calls=_names((call,) if isinstance(call, str) else tuple(call), pw, _DOTTED,
                                 "a dotted name (self.draft)"),
                    with_kwargs=_strs(ph.get("with_kwargs"), f"{pw} with_kwargs"),
                    without_kwargs=_strs(ph.get("without_kwargs"), f"{pw} without_kwargs"),
                    required=_bool(ph, "required", pw, True),
                )
            )
        facts = []
        for j, fa in enumerate(_tables(fam, "fact", where, "family.fact")):
            fw = f"{where} fact #{j + 1}"
            if fa.get("name") != "accepted":
                raise UsageError(f"{fw}: the only fact eaglepatch records is 'accepted': {_SEE}")
            after, after_call = _str(fa, "after", fw), _str(fa, "after_call", fw)
            if (after is None) == (after_call is None):
                raise UsageError(f"{fw}: give exactly one of 'after' (a phase) or 'after_call' (a callee): {_SEE}")
            if after_call is not None:
                _names((after_call,), fw, _DOTTED, "a dotted name (verify_input.verify)")
            facts.append(
                Fact(
                    name="accepted",
                    from_=_names(_strs(fa.get("from"), f"{fw} from"), fw, _FROM, "a local name or '$'") or ("$",),
                    attrs=_names(_strs(fa.get("attrs"), f"{fw} attrs"), fw, _IDENT, "an attribute name"),
                    bonus_per_req=_int(fa, "bonus_per_req", fw, 0),
                    after=after,
                    after_call=after_call,
                    required=_bool(fa, "required", fw, False),
                )
            )
        families.append(
            Family(
                name=name,
                classes=classes,
                entry=entry,
                helpers=_strs(fam.get("helpers"), f"{where} helpers"),
                phases=tuple(phases),
                facts=tuple(facts),
                timer=timer,
            )
        )
    unsupported = tuple(
        Unsupported(
            classes=_strs(u.get("classes"), f"{source}: unsupported #{k + 1} classes"),
            reason=_str(u, "reason", f"{source}: unsupported #{k + 1}") or "",
        )
        for k, u in enumerate(_tables(data, "unsupported", source, "unsupported"))
    )
    if not families:
        raise UsageError(f"{source}: the recipe names no [[family]]: {_SEE}")
    return Recipe(families=tuple(families), unsupported=unsupported, source=source)


def load_recipe_text(text: str, source: str) -> Recipe:
    """Parse recipe TOML text; raises ``UsageError`` with the position of a syntax error."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{source}: not valid TOML ({exc})") from None
    return parse_recipe(data, source)


def load_recipe_file(path: str) -> Recipe:
    """Load a user's recipe (``--recipe FILE``); raises ``UsageError`` when missing or malformed."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise UsageError(f"cannot read recipe {path}: {exc.strerror}") from None
    return load_recipe_text(text, path)


def builtin_recipe() -> Recipe:
    """The recipe shipped in ``eaglepatch.patches`` (every ``*.toml`` there, merged in name order)."""
    families: list[Family] = []
    unsupported: list[Unsupported] = []
    try:
        folder: Any = resources.files("eaglepatch.patches")
    except ModuleNotFoundError:
        # Imported from a source checkout that is not installed (``python -m eaglepatch`` run from the checkout's
        # root puts its eaglepatch/ first on sys.path): the recipes are the top-level patches/ folder beside it.
        folder = Path(__file__).resolve().parents[2] / "patches"
        if not folder.is_dir():
            raise UsageError("the built-in recipes are missing: reinstall eaglepatch") from None
    files = sorted((p for p in folder.iterdir() if p.name.endswith(".toml")), key=lambda p: p.name)
    for p in files:
        r = load_recipe_text(p.read_text(encoding="utf-8"), f"patches/{p.name}")
        families.extend(r.families)
        unsupported.extend(r.unsupported)
    return Recipe(families=tuple(families), unsupported=tuple(unsupported), source="built-in")
