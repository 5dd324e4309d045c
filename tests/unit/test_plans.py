"""The pure planner (``plan_apply``, ``plan_revert``) on facts-to-plan fixtures, in pyinfra's style.

Each ``tests/data/plans/*.json`` is one case: the facts ``gather`` would have read from a host, the command with its
options, and the plan expected from them. ``test_the_plan_is_the_fixture_s`` runs the planner on every fixture
and compares the whole plan: each ``Write`` (path, what it writes or that it removes, the sha256 of the bytes it
writes and of those it was planned from, the backup it asks for, its compile flag), the manifest left behind, the
notes, the per-file records and the timers; or the error the planner raises (type and message).

The facts are a strict fake, like pyinfra's fake host: a ``HostFacts`` field (or a worker file's) that the fixture
does not declare is not given its default but a marker, and reading it fails the case (``UndeclaredFact``); a
field the fixture names that ``HostFacts`` lacks fails the load. A fixture cannot lean on a default silently.

Fixture format (one JSON object):

- ``why``: one line: what the case shows and why the plan must be this one.
- ``command``: ``apply`` or ``revert``; ``options``: ``{"mode", "every", "log_dir"}`` (apply: ``RuntimeOptions``,
  all three) or ``{"force"}`` (revert); ``now``: the clock the plan reads (manifest times, a drifted copy's name);
  ``servers`` (apply only, optional): the ``servers=`` argument (absent: None, the manifest's are kept).
- ``sources``: name -> bytes, reused below as ``{"source": NAME}``.
- ``facts``: ``HostFacts`` fields. Bytes are ``{"lines": [...]}`` (each line gets "\\n"), ``{"text": "..."}``,
  ``{"base64": "..."}``, ``{"source": NAME}``, or ``{"runtime": {"mode", "timers", "every", "log_dir"}}`` (the
  runtime module of this eaglepatch rendered with that config). ``files``: ``[{"path", "data", "mode"?,
  "mtime"?}]``; each file's ``abs`` (under the package's parent) and ``sha256`` are derived as ``gather`` gets
  them. ``runtime_data`` is bytes or null. Anywhere in the facts and the expectation, ``{"$sha256": BYTES}``
  stands for that sha256 and ``{"$eaglepatch_version": {}}`` for this eaglepatch's version, so that a fixture
  names what it means and outlives a change of the runtime module's code or of the version.
- ``expect``: ``{"writes": [...], "manifest": ..., "notes": [...], "files": [...], "timers": [...]}`` or
  ``{"error": {"type", "message"}}``.

(Re)generate a fixture's expectation from the current code, to review it (the tests never do this)::

    .venv/bin/python tests/unit/test_plans.py tests/data/plans/apply_v1_pristine.json     # print it
    .venv/bin/python tests/unit/test_plans.py --write tests/data/plans/*.json             # rewrite "expect"
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import difflib
import hashlib
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from eaglepatch import __version__
from eaglepatch.errors import EaglepatchError
from eaglepatch.ops.facts import HostFacts, WorkerFile
from eaglepatch.ops.options import RuntimeOptions
from eaglepatch.ops.plan import Plan, plan_apply, plan_revert
from eaglepatch.ops.runtime_file import render_runtime
from eaglepatch.ops.session import Session
from eaglepatch.transform.recipe import builtin_recipe

PLANS = Path(__file__).resolve().parents[1] / "data" / "plans"
FIXTURES = sorted(PLANS.glob("*.json"))

#: The cases the planner must answer (the issue's list); each is a fixture of this name.
REQUIRED = {
    "apply_v1_pristine", "apply_v2_pristine", "apply_again_patched", "apply_other_mode",
    "revert_patched_with_backups", "revert_drifted_refused", "revert_drifted_force", "revert_without_backups",
    "revert_half_applied", "revert_nothing_patched",
}

_TOP_KEYS = {"why", "command", "options", "now", "servers", "sources", "facts", "expect"}
_OPTION_KEYS = {"apply": {"mode", "every", "log_dir"}, "revert": {"force"}}
_FILE_KEYS = {"path", "data", "mode", "mtime"}
_RUNTIME_KEYS = {"mode", "timers", "every", "log_dir"}
_CONFIG_LINE = re.compile(r"^_CONFIG = (.*)  # eaglepatch:config$", re.M)


class FixtureError(ValueError):
    """A fixture that does not follow the format (an unknown field, a missing one, bytes given two ways)."""


class UndeclaredFact(AssertionError):
    """The planner read a fact that the fixture does not declare."""


class _Undeclared:
    def __repr__(self) -> str:
        return "<undeclared>"


UNDECLARED: Any = _Undeclared()


class _Strict:
    """Reading a field whose value is ``UNDECLARED`` raises ``UndeclaredFact`` (the pyinfra fake host's rule)."""

    def __getattribute__(self, name: str) -> Any:
        value = object.__getattribute__(self, name)
        if value is UNDECLARED:
            raise UndeclaredFact(f"the planner read {type(self).__name__[6:]}.{name}, which the fixture does not "
                                 "declare: declare it in the fixture's facts (null if it is None on the host)")
        return value

    def __repr__(self) -> str:
        fields = ", ".join(f"{f.name}={object.__getattribute__(self, f.name)!r}" for f in dataclasses.fields(self))
        return f"{type(self).__name__}({fields})"


class StrictHostFacts(_Strict, HostFacts):
    pass


class StrictWorkerFile(_Strict, WorkerFile):
    pass


# ----------------------------------------------------------------------------------------------------------------
# Loading


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def runtime_bytes(config: dict[str, Any]) -> bytes:
    """The runtime module this eaglepatch writes for ``config`` (mode, timers, every, log_dir)."""
    if set(config) != _RUNTIME_KEYS:
        raise FixtureError(f"a runtime is {sorted(_RUNTIME_KEYS)}, not {sorted(config)}")
    opts = RuntimeOptions(mode=config["mode"], every=config["every"], log_dir=config["log_dir"])
    return render_runtime(opts, config["timers"]).encode("utf-8")


def runtime_config(data: bytes) -> dict[str, Any] | None:
    """The config ``data`` was rendered with, when ``data`` is exactly this eaglepatch's runtime module rendered
    with it; else None."""
    m = _CONFIG_LINE.search(data.decode("utf-8", "replace"))
    if not m:
        return None
    try:
        full = json.loads(m.group(1))
        config = {k: full[k] for k in ("mode", "timers", "every", "log_dir")}
        return config if runtime_bytes(config) == data else None
    except (ValueError, KeyError, TypeError, EaglepatchError):
        return None


def bytes_of(spec: Any, sources: dict[str, Any]) -> bytes:
    """The bytes a fixture's bytes spec stands for."""
    if not isinstance(spec, dict) or len(spec) != 1:
        raise FixtureError(f"bytes are one of lines/text/base64/source/runtime, not {spec!r}")
    ((kind, value),) = spec.items()
    if kind == "lines":
        return "".join(line + "\n" for line in value).encode("utf-8")
    if kind == "text":
        return value.encode("utf-8")
    if kind == "base64":
        return base64.b64decode(value, validate=True)
    if kind == "source":
        if value not in sources:
            raise FixtureError(f"no source named {value!r}")
        return bytes_of(sources[value], {})
    if kind == "runtime":
        return runtime_bytes(value)
    raise FixtureError(f"unknown bytes kind {kind!r}")


def resolve(obj: Any, sources: dict[str, Any]) -> Any:
    """``obj`` with its ``{"$sha256": BYTES}`` and ``{"$eaglepatch_version": {}}`` replaced by what they stand for."""
    if isinstance(obj, dict):
        if len(obj) == 1 and "$sha256" in obj:
            return _sha(bytes_of(obj["$sha256"], sources))
        if len(obj) == 1 and "$eaglepatch_version" in obj:
            return __version__
        return {k: resolve(v, sources) for k, v in obj.items()}
    if isinstance(obj, list):
        return [resolve(v, sources) for v in obj]
    return obj


def load(path: Path) -> dict[str, Any]:
    """A fixture, its format checked (``FixtureError`` names what is wrong)."""
    fx = json.loads(path.read_text(encoding="utf-8"))
    unknown = set(fx) - _TOP_KEYS
    if unknown:
        raise FixtureError(f"{path.name}: unknown key(s) {sorted(unknown)}")
    for key in ("why", "command", "options", "now", "facts"):
        if key not in fx:
            raise FixtureError(f"{path.name}: no {key!r}")
    if not isinstance(fx["why"], str) or not fx["why"].strip() or "\n" in fx["why"]:
        raise FixtureError(f"{path.name}: 'why' is one line saying what the case shows")
    if fx["command"] not in _OPTION_KEYS:
        raise FixtureError(f"{path.name}: command is apply or revert, not {fx['command']!r}")
    if set(fx["options"]) != _OPTION_KEYS[fx["command"]]:
        raise FixtureError(f"{path.name}: {fx['command']}'s options are {sorted(_OPTION_KEYS[fx['command']])}")
    if "servers" in fx and fx["command"] != "apply":
        raise FixtureError(f"{path.name}: only apply takes servers")
    return fx


def _worker_file(raw: dict[str, Any], package_dir: str, sources: dict[str, Any]) -> WorkerFile:
    unknown = set(raw) - _FILE_KEYS
    if unknown:
        raise FixtureError(f"worker file: unknown field(s) {sorted(unknown)} (abs and sha256 are derived)")
    if "path" not in raw or "data" not in raw:
        raise FixtureError("a worker file has a path and data")
    data = bytes_of(raw["data"], sources)
    return StrictWorkerFile(
        path=raw["path"], abs=package_dir.rsplit("/", 1)[0] + "/" + raw["path"], data=data, sha256=_sha(data),
        mode=raw.get("mode", UNDECLARED), mtime=raw.get("mtime", UNDECLARED))


def build_facts(fx: dict[str, Any]) -> HostFacts:
    """The fixture's facts as the strict fake: every declared field as ``gather`` would give it, every other one
    ``UNDECLARED`` (reading it fails)."""
    sources = fx.get("sources") or {}
    raw = fx["facts"]
    names = {f.name for f in dataclasses.fields(HostFacts)}
    unknown = set(raw) - names
    if unknown:
        raise FixtureError(f"unknown fact field(s) {sorted(unknown)}: HostFacts has {sorted(names)}")
    kw: dict[str, Any] = dict.fromkeys(names, UNDECLARED)
    for name, value in raw.items():
        if name == "files":
            if "package_dir" not in raw:
                raise FixtureError("worker files need the package_dir they lie under")
            kw[name] = tuple(_worker_file(f, raw["package_dir"], sources) for f in value)
        elif name == "runtime_data":
            kw[name] = None if value is None else bytes_of(value, sources)
        elif name in ("servers", "other_servers"):
            kw[name] = tuple(resolve(value, sources))
        else:
            kw[name] = resolve(value, sources)
    if kw["runtime_data"] not in (None, UNDECLARED) and kw["runtime_sha256"] is not UNDECLARED:
        if kw["runtime_sha256"] != _sha(kw["runtime_data"]):
            raise FixtureError("runtime_sha256 is not the sha256 of runtime_data (gather reads both from one read)")
    return StrictHostFacts(**kw)


# ----------------------------------------------------------------------------------------------------------------
# Planning, and the plan as data


def make_plan(fx: dict[str, Any], facts: HostFacts) -> Plan:
    """The plan of the fixture's command on ``facts`` (its facts, built by ``build_facts``)."""
    opts = fx["options"]
    if fx["command"] == "apply":
        return plan_apply(facts, builtin_recipe(), RuntimeOptions(**opts), servers=fx.get("servers"),
                          now=fx["now"])
    return plan_revert(facts, builtin_recipe(), force=opts["force"], now=fx["now"])


def plan_doc(plan: Plan, facts: HostFacts) -> dict[str, Any]:
    """Everything a plan says, as JSON data (hashes of bytes, never the bytes). Per write: ``data_sha256`` (what it
    writes; null: it removes), ``before_sha256`` (the bytes the plan was made from, which its diff shows) and
    ``expect_sha256``: what the host is told it must find there before anything is done (``Session``'s payload of
    the write: null means no file)."""
    session = Session(host=None, python=facts.python, facts=facts)  # type: ignore[arg-type]  # no host is used
    return {
        "writes": [
            {"path": w.path, "rel": w.rel, "action": "remove" if w.data is None else "write",
             "data_sha256": None if w.data is None else _sha(w.data),
             "before_sha256": None if w.before is None else _sha(w.before),
             "expect_sha256": session._payload(w)["expect_sha256"], "backup": w.backup, "compile": w.compile}
            for w in plan.writes
        ],
        "manifest": copy.deepcopy(plan.manifest),
        "notes": list(plan.notes),
        "files": [dict(f) for f in plan.files],
        "timers": [list(t) for t in plan.timers],
    }


def _known_hashes(fx: dict[str, Any], plan: Plan) -> dict[str, Any]:
    """sha256 -> the macro that names it: the fixture's sources, the bytes its facts spell out, the runtime
    modules the plan writes."""
    sources = fx.get("sources") or {}
    known: dict[str, Any] = {}
    specs = [w.data for w in plan.writes if w.data is not None]
    for data in specs:
        config = runtime_config(data)
        if config is not None:
            known.setdefault(_sha(data), {"$sha256": {"runtime": config}})
    facts = fx["facts"]
    spelled = [f["data"] for f in facts.get("files", []) if "source" not in f["data"]]
    if facts.get("runtime_data"):
        spelled.append(facts["runtime_data"])
    for spec in spelled:
        known.setdefault(_sha(bytes_of(spec, sources)), {"$sha256": spec})
    for name in sources:
        known[_sha(bytes_of(sources[name], {}))] = {"$sha256": {"source": name}}
    return known


def _name(obj: Any, known: dict[str, Any]) -> Any:
    if isinstance(obj, dict):
        return {k: _name(v, known) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_name(v, known) for v in obj]
    if isinstance(obj, str) and obj in known:
        return copy.deepcopy(known[obj])
    return obj


def outcome(fx: dict[str, Any]) -> dict[str, Any]:
    """What the planner makes of a fixture, in the fixture's own terms: the plan (its hashes named after the
    sources and runtimes they are the hashes of, the version as ``$eaglepatch_version``) or the error."""
    facts = build_facts(fx)
    try:
        plan = make_plan(fx, facts)
    except EaglepatchError as exc:
        return {"error": {"type": type(exc).__name__, "message": str(exc)}}
    doc = _name(plan_doc(plan, facts), _known_hashes(fx, plan))
    if plan.manifest is not None and plan.manifest is not facts.manifest:  # written by this eaglepatch
        doc["manifest"]["eaglepatch"] = {"$eaglepatch_version": {}}
    return doc


def _dump(obj: Any, indent: str = "") -> str:
    """JSON for people: a value that fits on one line (110 columns) stays on it, others open one level."""
    flat = json.dumps(obj, ensure_ascii=False)
    if len(indent) + len(flat) <= 110 or not isinstance(obj, (dict, list)) or not obj:
        return flat
    inner = indent + " "
    if isinstance(obj, list):
        items = [inner + _dump(v, inner) for v in obj]
        return "[\n" + ",\n".join(items) + "\n" + indent + "]"
    items = [inner + json.dumps(k, ensure_ascii=False) + ": " + _dump(v, inner) for k, v in obj.items()]
    return "{\n" + ",\n".join(items) + "\n" + indent + "}"


# ----------------------------------------------------------------------------------------------------------------
# Tests


@pytest.mark.parametrize("path", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_the_plan_is_the_fixture_s(path: Path) -> None:
    """The planner is pure: the same facts and options give the same plan. Each fixture's ``why`` says why its
    plan is the right one; the comparison is on hashes, so the bytes written are the bytes expected."""
    fx = load(path)
    assert "expect" in fx, f"{path.name}: no expect: write it with this file's --write, then review it"
    got = outcome(fx)
    sources = fx.get("sources") or {}
    if resolve(got, sources) != resolve(fx["expect"], sources):
        diff = "\n".join(difflib.unified_diff(_dump(fx["expect"]).splitlines(), _dump(got).splitlines(),
                                              "expected", "planned", lineterm=""))
        pytest.fail(f"{path.name}: {fx['why']}\n{diff}", pytrace=False)


def test_every_case_the_planner_must_answer_has_a_fixture() -> None:
    """The issue's list of cases, each a fixture: deleting or renaming one would silently drop its check."""
    assert REQUIRED <= {p.stem for p in FIXTURES}, sorted(REQUIRED - {p.stem for p in FIXTURES})


def _fixture(name: str) -> dict[str, Any]:
    return load(PLANS / f"{name}.json")


def test_a_fact_the_planner_reads_but_the_fixture_does_not_declare_fails_the_case() -> None:
    """``plan_apply`` puts the runtime module's current bytes in its Write (the diff of a --mode change): a fixture
    that left ``runtime_data`` out would get HostFacts' default None and a plan that looks right. The strict fake
    refuses instead, naming the field."""
    fx = _fixture("apply_other_mode")
    del fx["facts"]["runtime_data"]
    with pytest.raises(UndeclaredFact, match=r"HostFacts\.runtime_data"):
        outcome(fx)


def test_a_worker_file_field_the_planner_reads_must_be_declared_too() -> None:
    """A worker file's fields are strict as well: ``mtime`` undeclared reads as a failure (``code_mtime`` reads it),
    not as 0.0."""
    fx = _fixture("apply_v1_pristine")
    facts = build_facts(fx)
    assert "mtime" not in fx["facts"]["files"][0]
    with pytest.raises(UndeclaredFact, match=r"WorkerFile\.mtime"):
        _ = facts.code_mtime


def test_a_fact_field_that_hostfacts_lacks_is_refused() -> None:
    """A misspelt field (``runtime_sha``) would otherwise be ignored, and the real one silently undeclared."""
    fx = _fixture("apply_v1_pristine")
    fx["facts"]["runtime_sha"] = None
    with pytest.raises(FixtureError, match="runtime_sha"):
        build_facts(fx)


def test_runtime_bytes_and_their_hash_must_agree() -> None:
    """``gather`` reads ``runtime_sha256`` and ``runtime_data`` from one read of the file: a fixture where they
    differ describes no host, and the loader says so."""
    fx = _fixture("apply_other_mode")
    fx["facts"]["runtime_sha256"] = "0" * 64
    with pytest.raises(FixtureError, match="runtime_sha256"):
        build_facts(fx)


def test_another_mode_rewrites_only_the_runtime_s_config_line() -> None:
    """apply with another --mode/--every on a patched install: the plan's diff (what ``diff`` prints) takes out one
    line and puts in one, the runtime's config line; the worker files and the runtime's code stay as they are."""
    fx = _fixture("apply_other_mode")
    plan = make_plan(fx, build_facts(fx))
    changed = [ln for ln in plan.diff().splitlines() if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]
    assert len(changed) == 2 and all(ln.endswith("# eaglepatch:config") for ln in changed), changed
    assert [w.rel for w in plan.writes] == ["sglang/srt/speculative/_eaglepatch_runtime.py"]


def test_a_changed_expectation_fails() -> None:
    """The comparison sees a single flag: the fixture's worker Write with its compile flag flipped no longer
    matches the plan."""
    fx = _fixture("apply_v1_pristine")
    sources = fx.get("sources") or {}
    fx["expect"]["writes"][0]["compile"] = not fx["expect"]["writes"][0]["compile"]
    assert resolve(outcome(fx), sources) != resolve(fx["expect"], sources)


# ----------------------------------------------------------------------------------------------------------------
# The regeneration tool (for review; never run by the tests)


def main(argv: list[str]) -> int:
    write = "--write" in argv
    paths = [Path(a) for a in argv if a != "--write"]
    if not paths:
        print(__doc__.split("(Re)generate", 1)[1].split("\n", 1)[1], file=sys.stderr)
        return 2
    for path in paths:
        fx = load(path)
        got = outcome(fx)
        if write:
            fx["expect"] = got
            path.write_text(_dump(fx) + "\n", encoding="utf-8")
            print(f"{path}: expect rewritten", file=sys.stderr)
        else:
            print(f"# {path}: {fx['why']}")
            print(_dump(got))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
