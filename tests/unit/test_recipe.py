"""Recipes: the built-in one loads and says what the issue asks; bad user recipes are a UsageError with a helpful
one-line message; a user recipe can time a call of its own choosing."""

from __future__ import annotations

import pytest

from eaglepatch.errors import ExitCode, UsageError
from eaglepatch.transform.engine import Instrumented, instrument, strip
from eaglepatch.transform.recipe import Recipe, builtin_recipe, load_recipe_file, load_recipe_text

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
