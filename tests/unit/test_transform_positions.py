"""Where a phase call sits inside its statement: timed exactly, or refused.

begin/end lines bracket a whole statement. That times the phase only when the call runs exactly once when the
statement runs, and right then: a call in a conditional position (``a if c else b``, ``a or b``) may not run, one in
a lazy position (a lambda, a generator, a nested function) runs later or never, and an end line after ``; break``
never runs. Bracketing those would give a wrong number; each is a refusal naming file, class, line and why. The
positions that always run (the test of ``a if c else b``, the left of ``or``, the first comparison) are timed.
The same cases on real release files are in test_transform_real.py.
"""

from __future__ import annotations

import pytest

from eaglepatch.transform.engine import instrument, strip
from eaglepatch.transform.marks import split_lines
from eaglepatch.transform.results import Instrumented, Refused
from transform_cases import V1_AFTER, V1_BEFORE, v2

PATH = "sglang/srt/speculative/w.py"
DRAFT = "            spec_info = self.draft(batch)\n"


@pytest.fixture(autouse=True)
def fresh_field_lists(monkeypatch):
    """The walk's per-type field lists (``tree._FIELDS``) are computed afresh in each test here, so that what
    decides them is exercised by these cases and not taken from a cache an earlier test filled."""
    from eaglepatch.transform import tree

    monkeypatch.setattr(tree, "_FIELDS", {})


def _with_draft(replacement: str) -> str:
    """V1_BEFORE with its draft statement (line 14) replaced by ``replacement`` (12-space indented lines)."""
    assert DRAFT in V1_BEFORE
    return V1_BEFORE.replace(DRAFT, replacement)


def _refused(src: str, recipe) -> Refused:
    res = instrument(src, PATH, recipe)
    assert isinstance(res, Refused), f"expected a refusal, got {type(res).__name__}"
    assert res.message().startswith(f"{PATH}:{res.line} (EAGLEWorker): "), res.message()
    return res


CALL = "phase call self.draft(...) "
CALLEE = "phase callee self.draft is named "
COND = CALL + "sits in a conditional expression (a if c else b): it may not run"
LAMBDA = CALL + "sits inside a lambda: it runs when the lambda is called, if ever, not where the lambda is written"
COMP = CALL + "sits inside a comprehension or generator expression: it runs once per item, or later (lazily)"
NESTED = CALL + "sits inside a function or class defined in the method: it runs when that is called, not here"
HEADER = CALL + "sits in a compound statement's header: no line can be added around it"
UNCALLED = CALLEE + "without being called here (stored or passed on): when it runs is not known"

REFUSED = {
    # (the draft statement replaced by, the 1-based line refused, the reason: the whole message is
    # "<path>:<line> (EAGLEWorker): <reason>")
    "ifexp-body": ("            spec_info = self.draft(batch) if batch else None\n", 14, COND),
    "ifexp-else": ("            spec_info = None if batch else self.draft(batch)\n", 14, COND),
    "or": ("            spec_info = batch.spec_info or self.draft(batch)\n", 14,
           CALL + "sits on the right of 'and'/'or': it may not run"),
    "and": ("            spec_info = batch.ready and self.draft(batch)\n", 14,
            CALL + "sits on the right of 'and'/'or': it may not run"),
    "chained-comparison": ("            spec_info = 0 < batch.n < self.draft(batch)\n", 14,
                           CALL + "sits in a chained comparison after its first comparison: it may not run"),
    "lambda": ("            spec_info = self.draft(batch)\n            later = lambda: self.draft(batch)\n", 15,
               LAMBDA),
    "generator": ("            spec_info = list(self.draft(b) for b in [batch])\n", 14, COMP),
    "list-comprehension": ("            spec_info = [self.draft(b) for b in [batch]][0]\n", 14, COMP),
    "dict-comprehension": ("            spec_info = {b: self.draft(b) for b in [batch]}\n", 14, COMP),
    "comprehension-iterable": ("            spec_info = [s for s in self.draft(batch)]\n", 14, COMP),
    "f-string": ("            spec_info = f'{self.draft(batch)}'\n", 14,
                 CALL + "sits inside an f-string: not a place eaglepatch brackets (in doubt, it refuses)"),
    "default-argument": ("            def later(s=self.draft(batch)):\n                return s\n"
                         "            spec_info = later()\n", 14, CALL + "sits in a default argument"),
    "lambda-default": ("            later = lambda s=self.draft(batch): s\n            spec_info = later()\n", 14,
                       CALL + "sits in a default argument"),
    "nested-function": ("            def later():\n                return self.draft(batch)\n"
                        "            spec_info = later()\n", 15, NESTED),
    "nested-class": ("            class Later:\n                s = self.draft(batch)\n"
                     "            spec_info = Later.s\n", 15, NESTED),
    "annotation": ("            spec_info: self.draft(batch) = None\n            spec_info = self.draft(batch)\n", 14,
                   CALL + "sits in an annotation (never evaluated inside a function)"),
    "assert": ("            assert self.draft(batch)\n", 14, CALL + "sits in an assert: python -O skips it"),
    "raise": ("            raise RuntimeError(self.draft(batch))\n", 14,
              CALL + "sits in a raise statement: the end line would never run"),
    "yield": ("            spec_info = yield self.draft(batch)\n", 14,
              CALL + "shares its statement with a yield or an await: the method may pause inside the phase"),
    "semicolon-break": ("            for _ in range(1):\n                spec_info = self.draft(batch); break\n", 15,
                        CALL + "is followed on its line by 'break': the end line would never run"),
    "semicolon-continue": ("            for _ in range(1):\n                spec_info = self.draft(batch); continue\n",
                           15, CALL + "is followed on its line by 'continue': the end line would never run"),
    "semicolon-return": ("            spec_info = self.draft(batch); return spec_info\n", 14,
                         CALL + "is followed on its line by 'return': the end line would never run"),
    "semicolon-raise": ("            spec_info = self.draft(batch); raise StopIteration\n", 14,
                        CALL + "is followed on its line by 'raise': the end line would never run"),
    "while-test": ("            while self.draft(batch):\n                break\n", 14, HEADER),
    "if-test": ("            if self.draft(batch) is None:\n                pass\n", 14, HEADER),
    "stored-reference": ("            step = self.draft\n            spec_info = step(batch)\n", 14, UNCALLED),
    "passed-reference": ("            spec_info = run_later(self.draft, batch)\n", 14, UNCALLED),
    "attribute-of-reference": ("            name = self.draft.__name__\n" + DRAFT, 14, UNCALLED),
    "compared-reference": ("            ok = self.draft is not None\n" + DRAFT, 14, UNCALLED),
    "compared-reference-right": ("            ok = None is self.draft\n" + DRAFT, 14, UNCALLED),
    "comparison-in-a-branch": ("            spec_info = None if batch else self.draft(batch) == 1\n", 14, COND),
    "comparator-in-a-branch": ("            spec_info = None if batch else 1 == self.draft(batch)\n", 14, COND),
    "lambda-default-in-a-branch": ("            spec_info = None if batch else (lambda s=self.draft(batch): s)()\n",
                                   14, COND),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_phase_call_that_may_not_run_once_here_is_refused(recipe, case):
    """Each position where the statement's begin/end would not bracket exactly one run of the call: refused on
    the call's line, with the reason; nothing is patched."""
    replacement, line, reason = REFUSED[case]
    src = _with_draft(replacement)
    r = _refused(src, recipe)
    assert r.message() == f"{PATH}:{line} (EAGLEWorker): {reason}"


TIMED = {
    # (the draft statement replaced by, the statement after the begin line): the call runs once, when the
    # statement runs, so bracketing the statement times it
    "ifexp-test": ("            spec_info = batch if self.draft(batch) else None\n",
                   "spec_info = batch if self.draft(batch) else None"),
    "left-of-or": ("            spec_info = self.draft(batch) or None\n", "spec_info = self.draft(batch) or None"),
    "first-comparison": ("            ok = 0 < self.draft(batch) < 9\n            spec_info = batch\n",
                         "ok = 0 < self.draft(batch) < 9"),
    "walrus": ("            (spec_info := self.draft(batch))\n", "(spec_info := self.draft(batch))"),
    "argument": ("            spec_info = wrap(self.draft(batch), key=1)\n",
                 "spec_info = wrap(self.draft(batch), key=1)"),
    "semicolon-then-plain": ("            spec_info = self.draft(batch); n = 1\n", "spec_info = self.draft(batch); n = 1"),
    "in-a-loop": ("            for _ in range(2):\n                spec_info = self.draft(batch)\n",
                  "spec_info = self.draft(batch)"),
}


@pytest.mark.parametrize("case", sorted(TIMED))
def test_a_phase_call_that_runs_once_with_its_statement_is_timed(recipe, case):
    """The positions that always run when the statement runs: begin right above the statement, end right below
    it (so a loop's body accumulates one bracket per run), and the output strips back."""
    replacement, stmt = TIMED[case]
    src = _with_draft(replacement)
    res = instrument(src, PATH, recipe)
    assert isinstance(res, Instrumented), res
    lines = [ln.strip() for ln in split_lines(res.source)]
    at = lines.index('_eaglepatch.begin("draft", "decode")  # [eaglepatch]')
    assert lines[at + 1] == stmt
    assert lines[at + 2] == '_eaglepatch.end("draft")  # [eaglepatch]'
    assert strip(res.source) == src


def test_a_return_in_a_helper_is_refused(recipe):
    """0.5.21+ keeps the V2 prefill path in helper methods. A phase call inside ``return`` there gets no end line,
    and the runtime would keep the phase open while the entry method goes on after the helper returns: refused,
    naming the helper. (In the entry method itself a return ends the cycle, which closes the phase: timed.)"""
    src = v2(
        """\
        verify_input: EagleVerifyInput = self.draft_worker.draft(batch)
        batch_output = self.verify(batch)
        self.draft_worker._draft_extend_for_decode(batch, batch_output)
        return batch_output
        """,
        prefill="""\
        batch_output = self._forward_prefill_batch(batch)
        batch_output.next_draft_input = self.draft_worker._draft_extend_for_prefill(batch, batch_output)
        return batch_output
        """,
        extra="""\
        def _forward_prefill_batch(self, batch):
            batch.prepare()
            return self.target_worker.forward_batch_generation(batch)
        """,
    )
    res = instrument(src, PATH, recipe)
    assert isinstance(res, Refused), res
    assert res.message() == (f"{PATH}:18 (EAGLEWorkerV2): phase call self.target_worker.forward_batch_generation(...) "
                             "sits in a return statement of _forward_prefill_batch, not of the entry method "
                             "forward_batch_generation: no end line can follow it, and the phase would stay open "
                             "while forward_batch_generation goes on")
    assert split_lines(src)[res.line - 1].strip() == "return self.target_worker.forward_batch_generation(batch)"
    fixed = src.replace("        return self.target_worker.forward_batch_generation(batch)\n",
                        "        out = self.target_worker.forward_batch_generation(batch)\n        return out\n")
    assert fixed != src
    ok = instrument(fixed, PATH, recipe)
    assert isinstance(ok, Instrumented), ok
    assert [p.method for p in ok.workers[0].phases if p.phase == "target"] == ["_forward_prefill_batch"]


def test_a_reference_to_a_phase_callee_elsewhere_in_the_method_is_refused(recipe):
    """A phase callee passed on in a compound statement's header (``with timed(self.verify):``) may run anywhere
    inside; refused even though the phase's own call statement is plain."""
    src = V1_BEFORE.replace(
        "        if batch.forward_mode.is_extend():\n",
        "        with timed(self.verify):\n            pass\n        if batch.forward_mode.is_extend():\n")
    r = _refused(src, recipe)
    assert r.message() == (f"{PATH}:9 (EAGLEWorker): phase callee self.verify is named without being called here "
                           "(stored or passed on): when it runs is not known")


def test_a_lookalike_call_in_a_lazy_position_is_not_refused(recipe):
    """Only phase callees count: ``lambda: self.other(batch)`` or ``[f(b) for b in x]`` in the method are the
    worker's business, and the phases around them are timed as usual: the output is the V1 golden output with the
    two lines above the draft's begin (nothing added around them), and each site is the V1 one, two lines down
    from the draft on."""
    lookalikes = "            cb = lambda: self.other(batch)\n            xs = [f(b) for b in [batch]]\n"
    src = _with_draft(lookalikes + DRAFT)
    res = instrument(src, PATH, recipe)
    assert isinstance(res, Instrumented), res
    begin_draft = '            _eaglepatch.begin("draft", "decode")  # [eaglepatch]\n'
    assert res.source == V1_AFTER.replace(begin_draft, lookalikes + begin_draft)
    v1 = instrument(V1_BEFORE, PATH, recipe)
    assert [(p.phase, p.line) for p in res.workers[0].phases] == [
        (p.phase, p.line + (2 if p.line >= 14 else 0)) for p in v1.workers[0].phases]
    assert [f.line for f in res.workers[0].facts] == [17] and res.warnings == ()


def test_a_plain_name_callee_is_not_confused_with_an_attribute_of_that_name():
    """A user recipe whose phase is a plain function ``sample(...)``: ``self.sample(...)``, ``x.sample`` and a
    keyword ``sample=`` are not it (a name after a dot, a keyword's name are no reference to ``sample``), so
    only the plain call is timed."""
    from eaglepatch.transform.recipe import load_recipe_text

    r = load_recipe_text('[[family]]\nname = "mine"\nclasses = ["W"]\nentry = ["forward_batch_generation"]\n'
                         '[[family.phase]]\nname = "sampling"\ncall = "sample"\n', "mine.toml")
    src = ("class W:\n    def forward_batch_generation(self, batch):\n        a = self.sample(batch)\n"
           "        b = batch.sample\n        c = sample(batch)\n        d = other(sample=1)\n        return c\n")
    res = instrument(src, PATH, r)
    assert isinstance(res, Instrumented), res
    assert [(p.call, p.line) for p in res.workers[0].phases] == [("sample", 5)]
    bare = instrument(src.replace("b = batch.sample", "b = sample"), PATH, r)
    assert isinstance(bare, Refused)
    assert bare.message() == (f"{PATH}:4 (W): phase callee sample is named without being called here (stored or "
                              "passed on): when it runs is not known")
