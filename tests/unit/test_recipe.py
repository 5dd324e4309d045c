"""Recipes: the built-in one loads and says what the issue asks; bad user recipes are a UsageError with a helpful
one-line message; a user recipe can time a call of its own choosing."""

from __future__ import annotations

import pytest

from eaglepatch.errors import ExitCode, UsageError
from eaglepatch.transform.engine import instrument, strip
from eaglepatch.transform.recipe import Recipe, builtin_recipe, load_recipe_file, load_recipe_text
from eaglepatch.transform.results import Instrumented

MINIMAL = """\
[[family]]
name = "mine"
classes = ["MyWorker"]
entry = ["forward_batch_generation"]
"""


def _usage_error(text: str) -> str:
    with pytest.raises(UsageError) as exc:
        load_recipe_text(text, "my-recipe.toml")
    msg = str(exc.value)
    assert "\n" not in msg, "one line"
    assert "my-recipe.toml" in msg, "names the file"
    assert exc.value.exit_code == ExitCode.USAGE
    return msg


# ---------------------------------------------------------------------------------------------------------------
# The built-in recipe


def test_builtin_recipe_loads_with_every_family_the_issue_names():
    """EAGLEWorker (both entry names), EAGLEWorkerV2, MultiLayer and FrozenKV V1/V2, NGRAM; DFlash, DSpark and Uno
    known as unsupported with a reason; the V2 prefill helpers listed."""
    r = builtin_recipe()
    assert isinstance(r, Recipe) and r.source == "built-in"
    for cls in ["EAGLEWorker", "MultiLayerEagleWorker", "FrozenKVMTPWorker", "EAGLEWorkerV2",
                "MultiLayerEagleWorkerV2", "FrozenKVMTPWorkerV2", "NGRAMWorker"]:
        assert r.family_of(cls) is not None, cls
    assert set(r.family_of("EAGLEWorker").entry) == {"forward_batch_generation", "forward_batch_speculative_generation"}
    assert {"_forward_prefill_batch", "_forward_dp_spec_prefill_coordination"} <= set(r.family_of("EAGLEWorkerV2").helpers)
    for cls in ["DFlashWorker", "DFlashWorkerV2", "DSparkWorkerV2", "UnoWorkerV2"]:
        assert r.family_of(cls) is None and r.unsupported_reason(cls), cls
    assert r.family_of("StandaloneWorker") is None  # inherits: found by its base class, not listed


def test_builtin_phases_per_family():
    """Prefill: target, draft_extend; decode: draft, verify, draft_extend (NGRAM: no draft extend); every family
    reads accepted tokens (V1 drafts only, + 1 bonus per request; V2 bonus included)."""
    r = builtin_recipe()
    for fam in r.families:
        by_mode = {(p.name, p.mode) for p in fam.phases}
        if fam.name == "ngram":
            assert by_mode == {("draft", "decode"), ("verify", "decode"), ("target", "prefill")}
        else:
            assert by_mode == {("target", "prefill"), ("draft_extend", "prefill"), ("draft", "decode"),
                               ("verify", "decode"), ("draft_extend", "decode")}
        assert fam.facts and all(f.name == "accepted" for f in fam.facts)
    assert {f.bonus_per_req for f in r.family_of("EAGLEWorker").facts} == {1}
    assert {f.bonus_per_req for f in r.family_of("EAGLEWorkerV2").facts} == {0}
    tail = [p for p in r.family_of("EAGLEWorkerV2").phases if "with_topology" in p.with_kwargs]
    assert len(tail) == 1 and tail[0].name == "draft" and tail[0].required is False


def test_minimal_user_recipe_loads():
    """name, classes and entry are all a family needs."""
    r = load_recipe_text(MINIMAL, "my-recipe.toml")
    assert r.source == "my-recipe.toml"
    assert r.family_of("MyWorker").entry == ("forward_batch_generation",)


def test_recipe_file_is_read_from_disk(tmp_path):
    p = tmp_path / "r.toml"
    p.write_text(MINIMAL)
    assert load_recipe_file(str(p)).source == str(p)


# ---------------------------------------------------------------------------------------------------------------
# Bad user recipes


def test_missing_file():
    with pytest.raises(UsageError, match="cannot read recipe /no/such/recipe.toml"):
        load_recipe_file("/no/such/recipe.toml")


def test_bad_toml_names_the_position():
    """A syntax error: the message says where (tomllib's line and column)."""
    msg = _usage_error('[[family]\nname = "x"\n')
    assert "not valid TOML" in msg and "line 1" in msg


@pytest.mark.parametrize("field", ["name", "classes", "entry"])
def test_missing_family_field(field):
    """Each required family field, when missing, is named in the message, with a pointer to the format."""
    text = "\n".join(line for line in MINIMAL.splitlines() if not line.startswith(field)) + "\n"
    msg = _usage_error(text)
    assert f"missing field '{field}'" in msg and "family #1" in msg and "patches/README.md" in msg


def test_phase_without_call():
    msg = _usage_error(MINIMAL + '[[family.phase]]\nname = "draft"\n')
    assert "phase #1" in msg and "'call'" in msg


def test_bad_mode():
    """mode is prefill or decode; anything else says which values are allowed."""
    msg = _usage_error(MINIMAL + '[[family.phase]]\nname = "draft"\ncall = "self.draft"\nmode = "both"\n')
    assert "mode must be one of prefill, decode" in msg and "'both'" in msg


def test_fact_with_both_after_and_after_call():
    """A fact is read after a phase or after a call, not both."""
    msg = _usage_error(MINIMAL + '[[family.fact]]\nname = "accepted"\nafter = "verify"\nafter_call = "eagle_sample"\n')
    assert "exactly one of 'after'" in msg


def test_fact_with_neither_after_nor_after_call():
    msg = _usage_error(MINIMAL + '[[family.fact]]\nname = "accepted"\nattrs = ["accept_lens"]\n')
    assert "exactly one of 'after'" in msg


def test_unknown_fact():
    msg = _usage_error(MINIMAL + '[[family.fact]]\nname = "latency"\nafter = "verify"\n')
    assert "'accepted'" in msg


def test_classes_must_be_strings():
    msg = _usage_error(MINIMAL.replace('classes = ["MyWorker"]', "classes = [1, 2]"))
    assert "classes" in msg and "list of strings" in msg


def test_recipe_without_families():
    msg = _usage_error('[[unsupported]]\nclasses = ["X"]\nreason = "no"\n')
    assert "no [[family]]" in msg


@pytest.mark.parametrize(
    "text",
    [
        '[family]\nname = "x"\nclasses = ["A"]\nentry = ["f"]\n',
        MINIMAL + 'phase = ["draft"]\n',
        MINIMAL + '[[family.fact]]\nname = "accepted"\nafter = "verify"\nbonus_per_req = "one"\n',
    ],
    ids=["single-bracket-family", "phase-not-a-table", "bonus-not-an-int"],
)
def test_wrongly_typed_recipe_is_a_usage_error(text):
    """Any malformed recipe, including the easy slip of ``[family]`` for ``[[family]]``, is a UsageError."""
    _usage_error(text)


# ---------------------------------------------------------------------------------------------------------------
# A user recipe timing another call


USER_RECIPE = """\
[[family]]
name = "mine"
classes = ["EAGLEWorker"]
entry = ["forward_batch_generation"]

[[family.phase]]
name = "my_phase"
call = "self.foo"
"""

WORKER = """\
import torch


class EAGLEWorker(TpModelWorker):
    def forward_batch_generation(self, batch):
        spec_info = self.draft(batch)
        out = self.foo(batch, spec_info)
        return out
"""


def test_user_recipe_times_its_own_call():
    """``my_phase`` on ``self.foo``: that call is wrapped (mode decode by default) and the entry method decorated;
    the built-in phases are not (the user recipe replaces the built-in one)."""
    r = load_recipe_text(USER_RECIPE, "mine.toml")
    res = instrument(WORKER, "w.py", r)
    assert isinstance(res, Instrumented), res
    assert res.source == """\
import torch
from . import _eaglepatch_runtime as _eaglepatch  # [eaglepatch]


class EAGLEWorker(TpModelWorker):
    @_eaglepatch.entry  # [eaglepatch]
    def forward_batch_generation(self, batch):
        spec_info = self.draft(batch)
        _eaglepatch.begin("my_phase", "decode")  # [eaglepatch]
        out = self.foo(batch, spec_info)
        _eaglepatch.end("my_phase")  # [eaglepatch]
        return out
"""
    assert strip(res.source) == WORKER
    assert [(p.phase, p.call, p.line) for p in res.workers[0].phases] == [("my_phase", "self.foo", 7)]


def test_user_recipe_phase_missing_is_refused():
    """The user's phase is required by default: a worker without that call is refused, naming the phase."""
    r = load_recipe_text(USER_RECIPE, "mine.toml")
    res = instrument(WORKER.replace("self.foo(", "self.bar("), "w.py", r)
    assert type(res).__name__ == "Refused"
    assert "'my_phase'" in res.message() and "(EAGLEWorker)" in res.message()


def test_builtin_recipe_from_an_uninstalled_source_checkout():
    """Regression (found on the H200): ``python -m eaglepatch`` run from a checkout's root imports the source tree,
    where the recipes are not the ``eaglepatch.patches`` package but the top-level ``patches/`` folder."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "from eaglepatch.transform.recipe import builtin_recipe;"
        "r = builtin_recipe(); print(sorted(f.name for f in r.families))"
    )
    # -S: no site-packages, so no installed or editable eaglepatch, only the source tree
    out = subprocess.run([sys.executable, "-S", "-c", code, str(repo)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "eagle-v1" in out.stdout and "eagle-v2" in out.stdout and "ngram" in out.stdout


# ---------------------------------------------------------------------------------------------------------------
# The family's timer (what --mode auto gives it), call lists, optional phases, and the names a recipe may use


def test_builtin_timers_per_family():
    """--mode auto times each family as its recipe says: V1 and NGRAM run without the overlap scheduler (verify
    waits for the GPU anyway: sync), V2 runs under it (a synchronize would stall the overlap: events)."""
    r = builtin_recipe()
    assert {f.name: f.timer for f in r.families} == {"eagle-v1": "sync", "eagle-v2": "events", "ngram": "sync"}


def test_timer_defaults_to_sync_and_is_validated():
    """A family without ``timer`` is timed with sync (the default); only sync and events are timers a family can
    have (cpu is a --mode for tests, not a family's), and the message says which values are allowed."""
    assert load_recipe_text(MINIMAL, "my-recipe.toml").families[0].timer == "sync"
    assert load_recipe_text(MINIMAL + 'timer = "events"\n', "my-recipe.toml").families[0].timer == "events"
    for bad in ['"cpu"', '"auto"', "1", '["sync"]']:
        msg = _usage_error(MINIMAL + f"timer = {bad}\n")
        assert "timer must be one of sync, events" in msg and "family #1" in msg


def test_worker_info_carries_the_family_timer():
    """``WorkerInfo.timer`` is the family's timer for a supported class and for one that inherits its entry
    method (the base class's family times it), None for a class no family names."""
    r = builtin_recipe()
    src = WORKER.replace("class EAGLEWorker(TpModelWorker)", "class EAGLEWorkerV2(TpModelWorker)").replace(
        "spec_info = self.draft(batch)\n        out = self.foo(batch, spec_info)",
        "verify_input = self.draft_worker.draft(batch)\n        out = self.verify(batch)\n"
        "        self.draft_worker._draft_extend_for_decode(batch, out)\n"
        "        if batch.forward_mode.is_extend():\n"
        "            out = self.target_worker.forward_batch_generation(batch)\n"
        "            out.x = self.draft_worker._draft_extend_for_prefill(batch, out)",
    ) + ("\n\nclass StandaloneWorkerV2(EAGLEWorkerV2):\n    pass\n\n\nclass DFlashWorkerV2:\n"
         "    def forward_batch_generation(self, batch):\n        return None\n")
    res = instrument(src, "w.py", r)
    assert isinstance(res, Instrumented), res
    assert {w.cls: (w.status, w.family, w.timer) for w in res.workers} == {
        "EAGLEWorkerV2": ("supported", "eagle-v2", "events"),
        "StandaloneWorkerV2": ("inherits", "eagle-v2", "events"),
        "DFlashWorkerV2": ("unsupported", None, None),
    }
    from transform_cases import V1_BEFORE

    res = instrument(V1_BEFORE, "w.py", r)
    assert [(w.family, w.timer) for w in res.workers] == [("eagle-v1", "sync")]


def test_call_may_be_a_list_of_callees():
    """``call = ["self.foo", "self.bar"]``: either callee is the phase (releases that spell one step differently);
    the site records the callee actually found, and a message names them all."""
    text = USER_RECIPE.replace('call = "self.foo"', 'call = ["self.bar", "self.foo"]')
    r = load_recipe_text(text, "mine.toml")
    assert r.families[0].phases[0].calls == ("self.bar", "self.foo")
    res = instrument(WORKER, "w.py", r)
    assert isinstance(res, Instrumented), res
    assert [(p.phase, p.call) for p in res.workers[0].phases] == [("my_phase", "self.foo")]
    missing = instrument(WORKER.replace("self.foo(", "self.baz("), "w.py", r)
    assert type(missing).__name__ == "Refused"
    assert "self.bar(...) or self.foo(...)" in missing.reason


def test_both_callees_of_one_entry_in_one_method_are_ambiguous():
    """Two calls of one phase entry in one method (whichever of its callees) cannot both be that phase."""
    r = load_recipe_text(USER_RECIPE.replace('call = "self.foo"', 'call = ["self.bar", "self.foo"]'), "mine.toml")
    src = WORKER.replace("        return out\n", "        self.bar(out)\n        return out\n")
    res = instrument(src, "w.py", r)
    assert type(res).__name__ == "Refused" and "appears twice" in res.reason


OPTIONAL = USER_RECIPE + """
[[family.phase]]
name = "extra"
mode = "prefill"
call = "self.extra"
required = false
"""


def test_an_optional_phase_that_is_missing_is_a_warning_not_a_refusal():
    """``required = false``: the class is instrumented with what is found, and the result names the missing
    phase (``WorkerInfo.missing`` and a warning saying which records carry no such phase)."""
    r = load_recipe_text(OPTIONAL, "mine.toml")
    res = instrument(WORKER, "w.py", r)
    assert isinstance(res, Instrumented), res
    (w,) = res.workers
    assert w.missing == ("prefill extra",)
    assert [p.phase for p in w.phases] == ["my_phase"]
    assert res.warnings == ("w.py: prefill extra: not found in EAGLEWorker.forward_batch_generation of this release: "
                            "prefill records carry no extra phase",)


def test_an_optional_phase_that_is_found_is_timed_and_not_reported():
    """The same optional phase present: it is bracketed like any phase, and nothing is reported missing."""
    r = load_recipe_text(OPTIONAL, "mine.toml")
    res = instrument(WORKER.replace("        return out\n", "        self.extra(out)\n        return out\n"), "w.py", r)
    assert isinstance(res, Instrumented), res
    (w,) = res.workers
    assert w.missing == () and res.warnings == ()
    assert [(p.phase, p.mode) for p in w.phases] == [("my_phase", "decode"), ("extra", "prefill")]
    assert '_eaglepatch.begin("extra", "prefill")  # [eaglepatch]\n        self.extra(out)\n' in res.source


def test_an_optional_entry_is_not_missing_when_its_phase_is_found_another_way():
    """V2's tail draft (with_topology=True) is optional beside the plain draft: a release without it has its
    draft timed by the plain call, so nothing is reported missing (``missing`` is about phases, not entries)."""
    r = load_recipe_text(USER_RECIPE + """
[[family.phase]]
name = "my_phase"
call = "self.foo"
with_kwargs = ["tail"]
required = false
""".replace('name = "my_phase"\ncall = "self.foo"\n', 'name = "my_phase"\ncall = "self.foo"\nwithout_kwargs = ["tail"]\n', 1),
        "mine.toml")
    res = instrument(WORKER, "w.py", r)
    assert isinstance(res, Instrumented), res
    assert res.workers[0].missing == () and res.warnings == ()


def test_a_required_entry_is_not_satisfied_by_another_entry_of_the_same_callee():
    """The plain draft is required, the tail draft (same callee, with_topology) optional: a method with only the
    tail draft is refused; the optional entry's site does not stand in for the required one."""
    r = builtin_recipe()
    src = """\
class EAGLEWorkerV2:
    def forward_batch_generation(self, batch):
        if batch.is_extend():
            out = self.target_worker.forward_batch_generation(batch)
            out.x = self.draft_worker._draft_extend_for_prefill(batch, out)
            return out
        v = self.draft_worker.draft(batch, with_topology=True)
        out = self.verify(batch)
        self.draft_worker._draft_extend_for_decode(batch, out)
        return out
"""
    res = instrument(src, "w.py", r)
    assert type(res).__name__ == "Refused"
    assert "'draft'" in res.reason and "not found" in res.reason
    ok = instrument(src.replace("(batch, with_topology=True)", "(batch)"), "w.py", r)
    assert isinstance(ok, Instrumented), ok


@pytest.mark.parametrize(
    "field,value,what",
    [
        ("name", '"my phase"', "phase name"),
        ("name", '"dra\\"ft"', "phase name"),
        ("call", '"self.foo()"', "dotted name"),
        ("call", '"self..foo"', "dotted name"),
        ("call", "[]", "'call'"),
        ("call", '["self.foo", 3]', "'call'"),
    ],
)
def test_names_written_into_the_worker_file_are_checked(field, value, what):
    """A phase name is written into ``begin("name", ...)``, a callee matched as code: a name that would break the
    added line (a quote, a space) or could never match (``self.foo()``) is a UsageError naming the field."""
    phase = {"name": '"my_phase"', "call": '"self.foo"', field: value}
    text = MINIMAL + "[[family.phase]]\n" + "".join(f"{k} = {v}\n" for k, v in phase.items())
    msg = _usage_error(text)
    assert what in msg and "phase #1" in msg


def test_fact_names_are_checked():
    """``from`` names a local (or ``$``), ``attrs`` attributes, ``after_call`` a dotted callee: they are written
    into the ``accepted(...)`` line or matched as code, so anything else is a UsageError."""
    base = MINIMAL + '[[family.fact]]\nname = "accepted"\nafter = "verify"\n'
    load_recipe_text(base + 'from = ["$", "out"]\nattrs = ["accept_lens"]\n', "my-recipe.toml")
    assert "local name" in _usage_error(base + 'from = ["out.x"]\n')
    assert "attribute name" in _usage_error(base + 'attrs = ["a b"]\n')
    assert "dotted name" in _usage_error(MINIMAL + '[[family.fact]]\nname = "accepted"\nafter_call = "f("\n')


# ---------------------------------------------------------------------------------------------------------------
# Every message of a bad recipe, word for word (they are what a user sees: each names the file, the table and the
# field, says what was expected, and points at the format)

M = MINIMAL
BAD_RECIPES = {
    "bad-toml": '[[family]\nname = "x"\n',
    "no-name": M.replace('name = "mine"\n', ''),
    "name-int": M.replace('name = "mine"', 'name = 3'),
    "classes-int": M.replace('classes = ["MyWorker"]', 'classes = [1]'),
    "entry-int": M.replace('entry = ["forward_batch_generation"]', 'entry = 3'),
    "helpers-int": M + 'helpers = [1]\n',
    "timer": M + 'timer = "cpu"\n',
    "single-family": '[family]\nname = "x"\nclasses = ["A"]\nentry = ["f"]\n',
    "family-not-table": 'family = 3\n',
    "phase-not-table": M + 'phase = ["draft"]\n',
    "phase-no-call": M + '[[family.phase]]\nname = "draft"\n',
    "phase-no-name": M + '[[family.phase]]\ncall = "self.draft"\n',
    "phase-bad-name": M + '[[family.phase]]\nname = "a b"\ncall = "self.draft"\n',
    "phase-bad-call": M + '[[family.phase]]\nname = "draft"\ncall = "self.draft()"\n',
    "phase-mode": M + '[[family.phase]]\nname = "draft"\ncall = "self.draft"\nmode = "both"\n',
    "phase-required": M + '[[family.phase]]\nname = "draft"\ncall = "self.draft"\nrequired = "yes"\n',
    "phase-with": M + '[[family.phase]]\nname = "draft"\ncall = "self.draft"\nwith_kwargs = [1]\n',
    "phase-without": M + '[[family.phase]]\nname = "draft"\ncall = "self.draft"\nwithout_kwargs = 2\n',
    "fact-name": M + '[[family.fact]]\nname = "latency"\nafter = "verify"\n',
    "fact-both": M + '[[family.fact]]\nname = "accepted"\nafter = "verify"\nafter_call = "f"\n',
    "fact-neither": M + '[[family.fact]]\nname = "accepted"\n',
    "fact-after-int": M + '[[family.fact]]\nname = "accepted"\nafter = 3\n',
    "fact-after-call": M + '[[family.fact]]\nname = "accepted"\nafter_call = "f("\n',
    "fact-from": M + '[[family.fact]]\nname = "accepted"\nafter = "v"\nfrom = ["a.b"]\n',
    "fact-attrs": M + '[[family.fact]]\nname = "accepted"\nafter = "v"\nattrs = ["a b"]\n',
    "fact-bonus": M + '[[family.fact]]\nname = "accepted"\nafter = "v"\nbonus_per_req = "one"\n',
    "fact-bonus-bool": M + '[[family.fact]]\nname = "accepted"\nafter = "v"\nbonus_per_req = true\n',
    "fact-required": M + '[[family.fact]]\nname = "accepted"\nafter = "v"\nrequired = 1\n',
    "unsupported-classes": M + '[[unsupported]]\nclasses = 3\n',
    "unsupported-reason": M + '[[unsupported]]\nclasses = ["X"]\nreason = 3\n',
    "no-families": '[[unsupported]]\nclasses = ["X"]\nreason = "no"\n',
    "fact-not-table": M + 'fact = 3\n',
    "fact-single-table": M + '[family.fact]\nname = "accepted"\n',
    "unsupported-not-table": 'unsupported = 3\n' + M,
    "unsupported-single-table": M + '[unsupported]\nclasses = ["X"]\n',
    "fact-after-call-int": M + '[[family.fact]]\nname = "accepted"\nafter_call = 3\n',
    "fact-from-int": M + '[[family.fact]]\nname = "accepted"\nafter = "v"\nfrom = 3\n',
    "fact-attrs-int": M + '[[family.fact]]\nname = "accepted"\nafter = "v"\nattrs = [3]\n',
}
BAD_RECIPE_MESSAGES = {
    'bad-toml': "r.toml: not valid TOML (Expected ']]' at the end of an array declaration (at line 1, column 9))",
    'no-name': "r.toml: family #1: missing field 'name': see patches/README.md",
    'name-int': "r.toml: family #1: 'name' must be a string, not 3: see patches/README.md",
    'classes-int': 'recipe r.toml: family #1 classes: expected a string or a list of strings, got [1]: see patches/README.md',
    'entry-int': 'recipe r.toml: family #1 entry: expected a string or a list of strings, got 3: see patches/README.md',
    'helpers-int': 'recipe r.toml: family #1 helpers: expected a string or a list of strings, got [1]: see patches/README.md',
    'timer': "r.toml: family #1: timer must be one of sync, events, not 'cpu': see patches/README.md",
    'single-family': 'r.toml: [family] is a single table; write [[family]] (an array of tables): see patches/README.md',
    'family-not-table': "r.toml: 'family' must be an array of tables ([[family]]), not 3: see patches/README.md",
    'phase-not-table': "r.toml: family #1: 'phase' must be an array of tables ([[family.phase]]), not ['draft']: see patches/README.md",
    'phase-no-call': "r.toml: family #1 phase #1: needs a string field 'name' and 'call' (a string or a list of strings): see patches/README.md",
    'phase-no-name': "r.toml: family #1 phase #1: needs a string field 'name' and 'call' (a string or a list of strings): see patches/README.md",
    'phase-bad-name': "r.toml: family #1 phase #1: 'a b' is not a phase name (letters, digits, _): see patches/README.md",
    'phase-bad-call': "r.toml: family #1 phase #1: 'self.draft()' is not a dotted name (self.draft): see patches/README.md",
    'phase-mode': "r.toml: family #1 phase #1: mode must be one of prefill, decode, not 'both': see patches/README.md",
    'phase-required': "r.toml: family #1 phase #1: 'required' must be true or false, not 'yes': see patches/README.md",
    'phase-with': 'recipe r.toml: family #1 phase #1 with_kwargs: expected a string or a list of strings, got [1]: see patches/README.md',
    'phase-without': 'recipe r.toml: family #1 phase #1 without_kwargs: expected a string or a list of strings, got 2: see patches/README.md',
    'fact-name': "r.toml: family #1 fact #1: the only fact eaglepatch records is 'accepted': see patches/README.md",
    'fact-both': "r.toml: family #1 fact #1: give exactly one of 'after' (a phase) or 'after_call' (a callee): see patches/README.md",
    'fact-neither': "r.toml: family #1 fact #1: give exactly one of 'after' (a phase) or 'after_call' (a callee): see patches/README.md",
    'fact-after-int': "r.toml: family #1 fact #1: 'after' must be a string, not 3: see patches/README.md",
    'fact-after-call': "r.toml: family #1 fact #1: 'f(' is not a dotted name (verify_input.verify): see patches/README.md",
    'fact-from': "r.toml: family #1 fact #1: 'a.b' is not a local name or '$': see patches/README.md",
    'fact-attrs': "r.toml: family #1 fact #1: 'a b' is not an attribute name: see patches/README.md",
    'fact-bonus': "r.toml: family #1 fact #1: 'bonus_per_req' must be a whole number, not 'one': see patches/README.md",
    'fact-bonus-bool': "r.toml: family #1 fact #1: 'bonus_per_req' must be a whole number, not True: see patches/README.md",
    'fact-required': "r.toml: family #1 fact #1: 'required' must be true or false, not 1: see patches/README.md",
    'unsupported-classes': 'recipe r.toml: unsupported #1 classes: expected a string or a list of strings, got 3: see patches/README.md',
    'unsupported-reason': "r.toml: unsupported #1: 'reason' must be a string, not 3: see patches/README.md",
    'no-families': 'r.toml: the recipe names no [[family]]: see patches/README.md',
    'fact-not-table': "r.toml: family #1: 'fact' must be an array of tables ([[family.fact]]), not 3: see patches/README.md",
    'fact-single-table': 'r.toml: family #1: [family.fact] is a single table; write [[family.fact]] (an array of tables): see patches/README.md',
    'unsupported-single-table': 'r.toml: [unsupported] is a single table; write [[unsupported]] (an array of tables): see patches/README.md',
    'fact-after-call-int': "r.toml: family #1 fact #1: 'after_call' must be a string, not 3: see patches/README.md",
    'fact-from-int': 'recipe r.toml: family #1 fact #1 from: expected a string or a list of strings, got 3: see patches/README.md',
    'fact-attrs-int': 'recipe r.toml: family #1 fact #1 attrs: expected a string or a list of strings, got [3]: see patches/README.md',
    'unsupported-not-table': "r.toml: 'unsupported' must be an array of tables ([[unsupported]]), not 3: see patches/README.md",
}


@pytest.mark.parametrize("case", sorted(BAD_RECIPES))
def test_each_bad_recipe_message_word_for_word(case):
    """The exact one-line message for each way a recipe can be wrong."""
    with pytest.raises(UsageError) as exc:
        load_recipe_text(BAD_RECIPES[case], "r.toml")
    assert str(exc.value) == BAD_RECIPE_MESSAGES[case]
    assert exc.value.exit_code == ExitCode.USAGE


# ---------------------------------------------------------------------------------------------------------------
# Where the built-in recipe comes from


def test_builtin_recipe_merges_every_toml_in_name_order(tmp_path, monkeypatch):
    """Every ``*.toml`` of the package folder, merged in name order (whatever order the folder lists them in);
    other files are ignored; the result says it is the built-in one."""
    from eaglepatch.transform import recipe as recipe_module

    (tmp_path / "b.toml").write_text(MINIMAL.replace('"mine"', '"second"').replace("MyWorker", "B"))
    (tmp_path / "a.toml").write_text(MINIMAL.replace('"mine"', '"first"').replace("MyWorker", "A")
                                     + '[[unsupported]]\nclasses = ["U"]\nreason = "u"\n')
    (tmp_path / "notes.txt").write_text("not a recipe")

    class Folder:
        def iterdir(self):
            return iter([tmp_path / "b.toml", tmp_path / "notes.txt", tmp_path / "a.toml"])

    monkeypatch.setattr(recipe_module.resources, "files", lambda name: Folder())
    r = builtin_recipe()
    assert [f.name for f in r.families] == ["first", "second"]
    assert r.unsupported_reason("U") == "u" and r.source == "built-in"


def test_a_broken_builtin_recipe_names_its_file(tmp_path, monkeypatch):
    """A built-in recipe that does not load says which file (patches/NAME.toml) is wrong."""
    from eaglepatch.transform import recipe as recipe_module

    (tmp_path / "eagle.toml").write_text('[[family]]\nname = "x"\n')
    monkeypatch.setattr(recipe_module.resources, "files", lambda name: tmp_path)
    with pytest.raises(UsageError) as exc:
        builtin_recipe()
    assert str(exc.value) == "patches/eagle.toml: family #1: missing field 'classes': see patches/README.md"


def test_builtin_recipe_from_the_source_tree_when_the_package_is_not_installed(monkeypatch):
    """Without the ``eaglepatch.patches`` package (a source checkout run as ``python -m eaglepatch``), the
    recipes are the top-level patches/ folder beside eaglepatch/: the same recipe (in-process twin of the
    subprocess test above, which mutation testing cannot run)."""
    from eaglepatch.transform import recipe as recipe_module

    expected = builtin_recipe()

    def missing(name):
        assert name == "eaglepatch.patches"
        raise ModuleNotFoundError(name)

    monkeypatch.setattr(recipe_module.resources, "files", missing)
    assert builtin_recipe() == expected


def test_builtin_recipe_missing_everywhere(monkeypatch, tmp_path):
    """Neither the package nor the folder: a UsageError telling to reinstall."""
    from eaglepatch.transform import recipe as recipe_module

    def missing(name):
        raise ModuleNotFoundError(name)

    monkeypatch.setattr(recipe_module.resources, "files", missing)
    monkeypatch.setattr(recipe_module, "__file__", str(tmp_path / "a" / "b" / "recipe.py"))
    with pytest.raises(UsageError) as exc:
        builtin_recipe()
    assert str(exc.value) == "the built-in recipes are missing: reinstall eaglepatch"


def test_fact_and_unsupported_defaults():
    """A fact without ``from`` reads the statement's single target (``$``), without ``bonus_per_req`` adds
    nothing, without ``required`` is optional; an unsupported entry without ``reason`` has an empty one."""
    r = load_recipe_text(MINIMAL + '[[family.fact]]\nname = "accepted"\nafter = "verify"\n'
                         '[[unsupported]]\nclasses = ["X"]\n', "r.toml")
    (fact,) = r.families[0].facts
    assert (fact.from_, fact.attrs, fact.bonus_per_req, fact.required, fact.after, fact.after_call) == (
        ("$",), (), 0, False, "verify", None)
    assert r.unsupported_reason("X") == ""


def test_recipes_are_read_as_utf8_whatever_the_locale(tmp_path, monkeypatch):
    """A recipe is UTF-8 text: a user recipe and a built-in one with a non-ASCII reason load under a C (ASCII)
    locale too, where Python's default file encoding is ASCII (a child process: the locale is fixed at start;
    it imports eaglepatch from where this test does)."""
    import os
    import subprocess
    import sys

    text = MINIMAL + '[[unsupported]]\nclasses = ["X"]\nreason = "n\u00e4her"\n'
    (tmp_path / "r.toml").write_text(text, encoding="utf-8")
    (tmp_path / "builtin").mkdir()
    (tmp_path / "builtin" / "b.toml").write_text(text, encoding="utf-8")
    code = ("import sys, locale, pathlib\n"
            "from eaglepatch.transform import recipe as R\n"
            "print(locale.getpreferredencoding(False))\n"
            "print(R.load_recipe_file(sys.argv[1]).unsupported_reason('X').encode('unicode_escape').decode())\n"
            "R.resources.files = lambda name: pathlib.Path(sys.argv[2])\n"
            "print(R.builtin_recipe().unsupported_reason('X').encode('unicode_escape').decode())\n")
    # The same calls here first (mutation testing picks the tests to run by the functions they call in-process).
    assert load_recipe_file(str(tmp_path / "r.toml")).unsupported_reason("X") == "n\u00e4her"
    from eaglepatch.transform import recipe as recipe_module

    with monkeypatch.context() as m:
        m.setattr(recipe_module.resources, "files", lambda name: tmp_path / "builtin")
        assert builtin_recipe().unsupported_reason("X") == "n\u00e4her"
    env = dict(os.environ, PYTHONUTF8="0", PYTHONCOERCECLOCALE="0", LC_ALL="C", LANG="C",
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "r.toml"), str(tmp_path / "builtin")],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["ANSI_X3.4-1968", "n\\xe4her", "n\\xe4her"]


def test_builtin_recipe_falls_back_to_the_folder_beside_the_package(tmp_path, monkeypatch):
    """The fallback folder is ``patches/`` two levels above recipe.py (the checkout's root), not elsewhere."""
    from eaglepatch.transform import recipe as recipe_module

    root = tmp_path / "checkout"
    (root / "patches").mkdir(parents=True)
    (root / "patches" / "x.toml").write_text(MINIMAL)

    def missing(name):
        raise ModuleNotFoundError(name)

    monkeypatch.setattr(recipe_module.resources, "files", missing)
    monkeypatch.setattr(recipe_module, "__file__", str(root / "eaglepatch" / "transform" / "recipe.py"))
    assert [f.name for f in builtin_recipe().families] == ["mine"]
