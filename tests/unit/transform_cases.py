"""The transform tests' shared sources and their one helper: golden before/after cases (not a test module).

A golden case is a file ``tests/data/transform/<name>.py`` (Black's case files, LibCST's ``assertCodemod``):

    # Why the expectation holds (comment lines, as many as needed).
    # recipe: after_call.toml          (optional: a recipe of tests/data/transform/recipes/; else the built-in one)
    # ---- before ----
    <the input, byte for byte>
    # ---- after ----
    <what instrument must return for it, byte for byte>

``assert_codemod`` checks the whole output and the properties every output must have: it compiles, stripping it
gives back the input, and instrumenting it again changes nothing (the already-applied case). The files are read
as bytes (no newline translation), so a form feed or a tab in them is the input's. With
``EAGLEPATCH_REGEN_GOLDEN=1``, test_transform_cases.py writes what instrument returns as each file's after part
instead of comparing (then read the diff: every change must be one the case's comment explains).

Also here: the V1 and V2 sources the other transform tests change one thing in (``V1_BEFORE``/``V1_AFTER`` are the
golden case ``v1-statement-forms``).
"""

from __future__ import annotations

import dataclasses
import os
import textwrap
from pathlib import Path

from eaglepatch.transform.engine import instrument, strip
from eaglepatch.transform.recipe import Recipe, load_recipe_file
from eaglepatch.transform.results import Instrumented, Refused

GOLDEN = Path(__file__).resolve().parent.parent / "data" / "transform"
PATH = "sglang/srt/speculative/w.py"
BEFORE = "# ---- before ----\n"
AFTER = "# ---- after ----\n"
REGEN = os.environ.get("EAGLEPATCH_REGEN_GOLDEN") == "1"


@dataclasses.dataclass(frozen=True)
class Case:
    """One golden case: ``why`` its comment, ``recipe`` a file of ``GOLDEN/recipes`` (None: the built-in one)."""

    name: str
    why: str
    recipe: str | None
    before: str
    after: str

    @property
    def path(self) -> Path:
        return GOLDEN / f"{self.name}.py"


def case_names() -> list[str]:
    return sorted(p.stem for p in GOLDEN.glob("*.py"))


def read_case(name: str) -> Case:
    """The case file ``name``; AssertionError when it lacks its comment or a separator."""
    text = (GOLDEN / f"{name}.py").read_bytes().decode("utf-8")
    assert text.count(BEFORE) == 1 and text.count(AFTER) == 1, f"{name}: one {BEFORE!r} and one {AFTER!r}"
    head, rest = text.split(BEFORE)
    before, after = rest.split(AFTER)
    assert head.startswith("#") and all(line.startswith("#") for line in head.splitlines()), name
    notes = [line[2:] if line.startswith("# ") else line[1:] for line in head.splitlines()]
    recipe = next((n[len("recipe: "):] for n in notes if n.startswith("recipe: ")), None)
    why = "\n".join(n for n in notes if not n.startswith("recipe: ")).strip()
    assert why, f"{name}: say why the expectation holds"
    return Case(name, why, recipe, before, after)


def recipe_of(case: Case, builtin: Recipe) -> Recipe:
    return builtin if case.recipe is None else load_recipe_file(GOLDEN / "recipes" / case.recipe)


def write_after(case: Case, after: str) -> None:
    """Regenerate: the case file with ``after`` as its after part (its comment and input unchanged)."""
    text = case.path.read_bytes().decode("utf-8")
    case.path.write_bytes((text[: text.index(AFTER) + len(AFTER)] + after).encode("utf-8"))


def ok(source: str, recipe: Recipe, path: str = PATH) -> Instrumented:
    """``instrument(source)``, which must succeed."""
    res = instrument(source, path, recipe)
    assert isinstance(res, Instrumented), res.message() if isinstance(res, Refused) else res
    return res


def assert_codemod(before: str, after: str, recipe: Recipe) -> Instrumented:
    """``instrument(before)`` is exactly ``after``; ``after`` compiles, strips back to ``before`` and is stable."""
    res = ok(before, recipe)
    assert res.source == after
    assert res.changed is True and res.was_patched is False
    compile(after, PATH, "exec", dont_inherit=True)
    assert strip(after) == before
    again = ok(after, recipe)
    assert again.source == after and again.changed is False and again.was_patched is True
    return res


def _in(block: str, indent: int) -> str:
    return textwrap.indent(textwrap.dedent(block), " " * indent)


V1 = read_case("v1-statement-forms")
V1_BEFORE = V1.before
V1_AFTER = V1.after


def v2(decode: str, prefill: str | None = None, extra: str = "") -> str:
    """An EAGLEWorkerV2 module whose entry method runs ``prefill`` / ``decode`` (8-space bodies given dedented)."""
    prefill = prefill if prefill is not None else """\
        batch_output = self.target_worker.forward_batch_generation(batch)
        batch_output.next_draft_input = self.draft_worker._draft_extend_for_prefill(batch, batch_output)
        return batch_output
        """
    return (
        "import torch\n"
        "\n"
        "\n"
        "class EAGLEWorkerV2(BaseSpecWorker):\n"
        "    def forward_batch_generation(self, batch, on_publish=None):\n"
        "        if batch.forward_mode.is_extend():\n"
        + _in(prefill, 12)
        + "        else:\n"
        + _in(decode, 12)
        + (("\n" + _in(extra, 4)) if extra else "")
    )


V2_DECODE = """\
verify_input: EagleVerifyInput = self.draft_worker.draft(batch)
batch_output = self.verify(batch)
self.draft_worker._draft_extend_for_decode(batch, batch_output)
return batch_output
"""
