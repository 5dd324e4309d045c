"""Every message the transform gives, word for word: refusals (file, line, class and why, one line), the reasons
of what it does not instrument, its warnings, and its internal errors.

These are what a person reads in ``show``, ``apply`` and ``diff``: each must say where (a line of the file as
given, counted as Python counts lines) and why, and must not change by accident. The cases are the small sources
of transform_cases.py (the golden V1 case, the V2 module) with one thing changed.
"""

from __future__ import annotations

import ast

import libcst as cst
import pytest

from eaglepatch.transform import engine, finder
from eaglepatch.transform.engine import analyze, instrument
from eaglepatch.transform.marks import split_lines
from eaglepatch.transform.results import Instrumented, NotApplicable, Refused
from transform_cases import V1_AFTER, V1_BEFORE, V2_DECODE, v2

PATH = "w.py"
DRAFT = "            spec_info = self.draft(batch)\n"

REFUSALS = {
    'syntax-error': (V1_BEFORE.replace("(self, batch):", "(self, batch)"),
        "w.py:8: does not parse (expected ':')"),
    'null-byte': (V1_BEFORE + "x = '\x00'\n",
        'w.py: does not parse (source code string cannot contain null bytes)'),
    'both-entries': (V1_BEFORE + "\n    def forward_batch_speculative_generation(self, batch):\n        return None\n",
        'w.py:20 (EAGLEWorker): both forward_batch_generation and forward_batch_speculative_generation are defined: which is the entry?'),
    'async-entry': (V1_BEFORE.replace("    def forward_batch_generation", "    async def forward_batch_generation"),
        'w.py:8 (EAGLEWorker): forward_batch_generation is async: not a shape eaglepatch knows'),
    'missing-phase': (V1_BEFORE.replace("self.verify(batch, spec_info)", "self.check(batch, spec_info)"),
        "w.py:8 (EAGLEWorker): phase 'verify' (self.verify(...)) not found in forward_batch_generation: unknown layout, nothing instrumented"),
    'missing-phase-with-helpers': (v2(V2_DECODE.replace("self.verify(batch)", "self.check(batch)"), extra="def _forward_prefill_batch(self, batch):\n    return None\n\n"
                                 "def _forward_dp_spec_prefill_coordination(self, batch):\n    return None\n"),
        "w.py:5 (EAGLEWorkerV2): phase 'verify' (self.verify(...)) not found in forward_batch_generation or _forward_prefill_batch, _forward_dp_spec_prefill_coordination: unknown layout, nothing instrumented"),
    'phase-twice': (V1_BEFORE.replace(DRAFT, DRAFT + DRAFT),
        "w.py:15 (EAGLEWorker): phase 'draft' (self.draft(...) or self.forward_draft_decode(...)) appears twice in forward_batch_generation (lines 14 and 15): ambiguous, nothing instrumented"),
    'in-a-header': (V1_BEFORE.replace(DRAFT, "            if self.draft(batch):\n                pass\n"),
        "w.py:14 (EAGLEWorker): phase call self.draft(...) sits in a compound statement's header: no line can be added around it"),
    'in-a-one-line-suite': (V1_BEFORE.replace("            if batch.spec_info.verified_id is not None:\n                self.forward_draft_extend_after_decode(batch)\n", "            if batch.spec_info.verified_id is not None: self.forward_draft_extend_after_decode(batch)\n"),
        'w.py:16 (EAGLEWorker): phase call self.forward_draft_extend_after_decode(...) sits in a one-line compound statement: no line can be added around it'),
    'several-phase-calls': (V1_BEFORE.replace(DRAFT + "            logits_output, verify_output, _ = self.verify(batch, spec_info)\n", "            logits_output, verify_output, _ = self.verify(batch, self.draft(batch))\n"),
        'w.py:14 (EAGLEWorker): one statement holds several phase calls (self.verify, self.draft): ambiguous'),
    'no-final-newline': (V1_BEFORE.replace("                self.forward_draft_extend_after_decode(batch)\n", "                pass\n").replace("            return logits_output, verify_output.verified_id\n", "            self.forward_draft_extend_after_decode(batch)"),
        'w.py:18 (EAGLEWorker): a phase statement ends the file without a newline'),
    'conditional-expression': (V1_BEFORE.replace(DRAFT, "            spec_info = self.draft(batch) if batch else None\n"),
        'w.py:14 (EAGLEWorker): phase call self.draft(...) sits in a conditional expression (a if c else b): it may not run'),
    'right-of-or': (V1_BEFORE.replace(DRAFT, "            spec_info = batch.s or self.draft(batch)\n"),
        "w.py:14 (EAGLEWorker): phase call self.draft(...) sits on the right of 'and'/'or': it may not run"),
    'chained-comparison': (V1_BEFORE.replace(DRAFT, "            spec_info = 0 < batch < self.draft(batch)\n"),
        'w.py:14 (EAGLEWorker): phase call self.draft(...) sits in a chained comparison after its first comparison: it may not run'),
    'lambda': (V1_BEFORE.replace(DRAFT, "            spec_info = (lambda: self.draft(batch))()\n"),
        'w.py:14 (EAGLEWorker): phase call self.draft(...) sits inside a lambda: it runs when the lambda is called, if ever, not where the lambda is written'),
    'comprehension': (V1_BEFORE.replace(DRAFT, "            spec_info = [self.draft(b) for b in [batch]][0]\n"),
        'w.py:14 (EAGLEWorker): phase call self.draft(...) sits inside a comprehension or generator expression: it runs once per item, or later (lazily)'),
    'nested-function': (V1_BEFORE.replace(DRAFT, "            def f():\n                return self.draft(batch)\n            spec_info = f()\n"),
        'w.py:15 (EAGLEWorker): phase call self.draft(...) sits inside a function or class defined in the method: it runs when that is called, not here'),
    'default-argument': (V1_BEFORE.replace(DRAFT, "            def f(s=self.draft(batch)):\n                return s\n            spec_info = f()\n"),
        'w.py:14 (EAGLEWorker): phase call self.draft(...) sits in a default argument'),
    'annotation': (V1_BEFORE.replace(DRAFT, "            spec_info: self.draft(batch) = None\n" + DRAFT),
        'w.py:14 (EAGLEWorker): phase call self.draft(...) sits in an annotation (never evaluated inside a function)'),
    'f-string': (V1_BEFORE.replace(DRAFT, "            spec_info = f'{self.draft(batch)}'\n"),
        'w.py:14 (EAGLEWorker): phase call self.draft(...) sits inside an f-string: not a place eaglepatch brackets (in doubt, it refuses)'),
    'reference': (V1_BEFORE.replace(DRAFT, "            step = self.draft\n" + DRAFT),
        'w.py:14 (EAGLEWorker): phase callee self.draft is named without being called here (stored or passed on): when it runs is not known'),
    'reference-in-lambda': (V1_BEFORE.replace(DRAFT, "            step = lambda: self.draft\n" + DRAFT),
        'w.py:14 (EAGLEWorker): phase callee self.draft is named inside a lambda: it runs when the lambda is called, if ever, not where the lambda is written'),
    'yield': (V1_BEFORE.replace(DRAFT, "            spec_info = yield self.draft(batch)\n"),
        'w.py:14 (EAGLEWorker): phase call self.draft(...) shares its statement with a yield or an await: the method may pause inside the phase'),
    'assert': (V1_BEFORE.replace(DRAFT, "            assert self.draft(batch)\n"),
        'w.py:14 (EAGLEWorker): phase call self.draft(...) sits in an assert: python -O skips it'),
    'raise': (V1_BEFORE.replace(DRAFT, "            raise ValueError(self.draft(batch))\n"),
        'w.py:14 (EAGLEWorker): phase call self.draft(...) sits in a raise statement: the end line would never run'),
    'then-break': (V1_BEFORE.replace(DRAFT, "            for _ in [1]:\n                spec_info = self.draft(batch); break\n"),
        "w.py:15 (EAGLEWorker): phase call self.draft(...) is followed on its line by 'break': the end line would never run"),
    'then-continue': (V1_BEFORE.replace(DRAFT, "            for _ in [1]:\n                spec_info = self.draft(batch); continue\n"),
        "w.py:15 (EAGLEWorker): phase call self.draft(...) is followed on its line by 'continue': the end line would never run"),
    'then-return': (V1_BEFORE.replace(DRAFT, "            spec_info = self.draft(batch); return spec_info\n"),
        "w.py:14 (EAGLEWorker): phase call self.draft(...) is followed on its line by 'return': the end line would never run"),
    'then-raise': (V1_BEFORE.replace(DRAFT, "            spec_info = self.draft(batch); raise StopIteration\n"),
        "w.py:14 (EAGLEWorker): phase call self.draft(...) is followed on its line by 'raise': the end line would never run"),
    'return-in-helper': (v2(V2_DECODE, prefill="        return self._forward_prefill_batch(batch)\n", extra="def _forward_prefill_batch(self, batch):\n    out = self.target_worker.forward_batch_generation(batch)\n    return self.draft_worker._draft_extend_for_prefill(batch, out)\n"),
        'w.py:16 (EAGLEWorkerV2): phase call self.draft_worker._draft_extend_for_prefill(...) sits in a return statement of _forward_prefill_batch, not of the entry method forward_batch_generation: no end line can follow it, and the phase would stay open while forward_batch_generation goes on'),
    'users-marked-line': (V1_BEFORE + "x = 1  # [eaglepatch]\n",
        "w.py:19: this line ends with '# [eaglepatch]', the comment eaglepatch puts on the lines it adds, but it is not a line eaglepatch writes: eaglepatch could not tell its own lines from it; change that comment"),
    'marked-lines-without-import': (V1_BEFORE.replace(DRAFT, '            _eaglepatch.end("draft")  # [eaglepatch]\n' + DRAFT),
        "w.py:14: this file has lines marked '# [eaglepatch]' but not eaglepatch's import line (from . import _eaglepatch_runtime as _eaglepatch): not a file eaglepatch patched; remove the marked lines"),
    'refusal-in-a-patched-file': (V1_AFTER.replace("self.verify(batch, spec_info)", "self.check(batch, spec_info)"),
        "w.py:10 (EAGLEWorker): phase 'verify' (self.verify(...)) not found in forward_batch_generation: unknown layout, nothing instrumented"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_each_refusal_word_for_word(recipe, case):
    """The exact one-line message (``Refused.message()``: file, line, class, reason) of each refusal; the same from
    ``analyze`` (what ``show`` prints) as from ``instrument``, except where analyze reads a patched file as it is."""
    src, expected = REFUSALS[case]
    res = instrument(src, PATH, recipe)
    assert isinstance(res, Refused), res
    assert res.message() == expected
    assert "\n" not in res.message()
    if case != "refusal-in-a-patched-file":
        assert analyze(src, PATH, recipe) == res


def test_message_without_line_or_class():
    """A refusal with neither line nor class is the path and the reason."""
    assert Refused("a/b.py", "why").message() == "a/b.py: why"
    assert Refused("a/b.py", "why", "C").message() == "a/b.py (C): why"
    assert Refused("a/b.py", "why", None, 3).message() == "a/b.py:3: why"


# ---------------------------------------------------------------------------------------------------------------
# libcst's own refusal (the file parses for Python, the method not for libcst: no such source is known, so the
# parser is made to fail)


def test_a_method_libcst_cannot_parse_is_refused_at_the_files_line(recipe, monkeypatch):
    """libcst reports "error at LINE:COL" in the text it was given (the method's lines, under a stand-in class
    line when the method is not the first statement of its class); the refusal names the file's line instead,
    and the column in words."""
    real = cst.parse_module

    def failing(text):
        if "def forward_batch_generation" in text:
            raise cst.ParserSyntaxError("error at 3:7: expected one of )", lines=text.splitlines(True),
                                        raw_line=3, raw_column=7)
        return real(text)

    monkeypatch.setattr(finder.cst, "parse_module", failing)
    res = instrument(V1_BEFORE, PATH, recipe)
    assert isinstance(res, Refused)
    # The method is the first statement of its class: the text starts at the class line (line 7), so its line 3
    # is the file's line 9.
    assert res.message() == "w.py:9: does not parse: error at column 7: expected one of )"
    second = V1_BEFORE.replace("class EAGLEWorker(TpModelWorker):\n", "class EAGLEWorker(TpModelWorker):\n    x = 1\n")
    res = instrument(second, PATH, recipe)
    # After "x = 1" (line 8): a stand-in class line, then the file from line 9 (the def); its line 3 is line 10.
    assert res.message() == "w.py:10: does not parse: error at column 7: expected one of )"


def test_a_libcst_error_without_a_position_keeps_its_message(recipe, monkeypatch):
    """A message without "error at L:C" is kept whole, at libcst's raw line mapped to the file."""
    def failing(text):
        raise cst.ParserSyntaxError("tokenizer error", lines=text.splitlines(True), raw_line=2, raw_column=0)

    monkeypatch.setattr(finder.cst, "parse_module", failing)
    res = instrument(V1_BEFORE, PATH, recipe)
    assert res.message() == "w.py:8: does not parse: tokenizer error"


def test_a_method_nested_too_deeply_for_libcst(recipe, monkeypatch):
    def failing(text):
        raise RecursionError()

    monkeypatch.setattr(finder.cst, "parse_module", failing)
    res = instrument(V1_BEFORE, PATH, recipe)
    assert res.message() == "w.py:8: does not parse: nested too deeply"


# ---------------------------------------------------------------------------------------------------------------
# What is not instrumented, and warnings


def test_reasons_of_classes_not_instrumented(recipe):
    """A subclass no family names (timed through its base), a class of a family without its own entry method, a
    known unsupported class, an unknown class with an entry method: each with its reason, word for word."""
    src = ("class StandaloneWorker(EAGLEWorker):\n    pass\n\n\n"
           "class MultiLayerEagleWorker(EAGLEWorker):\n    pass\n\n\n"
           "class DFlashWorker:\n    def forward_batch_generation(self, batch):\n        return None\n\n\n"
           "class MyWorker:\n    def forward_batch_generation(self, batch):\n        return None\n\n\n"
           "class NotAWorker(object):\n    pass\n")
    res = instrument(src, PATH, recipe)
    assert isinstance(res, NotApplicable)
    assert [(w.cls, w.status, w.family, w.timer, w.method, w.method_start, w.reason) for w in res.workers] == [
        ("StandaloneWorker", "inherits", "eagle-v1", "sync", None, None,
         "inherits its entry method: timed through the base class"),
        ("MultiLayerEagleWorker", "inherits", "eagle-v1", "sync", None, None, "no entry method of its own"),
        ("DFlashWorker", "unsupported", None, None, "forward_batch_generation", 10,
         "DFlash inlines its draft and verify in the entry method (no draft()/verify() call to time)"),
        ("MyWorker", "unsupported", None, None, "forward_batch_generation", 15,
         "no recipe for this class (add one with --recipe)"),
    ]
    assert res.reason == (
        "StandaloneWorker: inherits its entry method: timed through the base class; "
        "MultiLayerEagleWorker: no entry method of its own; "
        "DFlashWorker: DFlash inlines its draft and verify in the entry method (no draft()/verify() call to time); "
        "MyWorker: no recipe for this class (add one with --recipe)")
    none = instrument("import os\n", PATH, recipe)
    assert isinstance(none, NotApplicable)
    assert none.reason == "no speculative worker class of the recipe in this file" and none.workers == ()


def test_an_unsupported_class_with_a_decorated_entry_method_names_the_decorators_line(recipe):
    """``method_start`` of an unsupported class is the line of its entry method's first decorator."""
    src = "class MyWorker:\n    @staticmethod\n    @other\n    def forward_batch_generation(batch):\n        return 1\n"
    (w,) = instrument(src, PATH, recipe).workers
    assert (w.method_start, w.method) == (2, "forward_batch_generation")


def test_a_base_named_by_attribute_counts(recipe):
    """``class X(module.EAGLEWorker)``: the base's last name decides the family; other bases are skipped."""
    src = "class X(object, workers.EAGLEWorker, make()):\n    pass\n"
    (w,) = instrument(src, PATH, recipe).workers
    assert (w.cls, w.status, w.family, w.timer) == ("X", "inherits", "eagle-v1", "sync")


def test_warnings_word_for_word(recipe):
    """No accepted-tokens value found (a return-form verify binds nothing): a warning naming file and class; a
    V1 worker without forward_target_extend: the optional prefill target listed as missing."""
    src = V1_BEFORE.replace("            logits_output, verify_output, _ = self.verify(batch, spec_info)\n",
                            "            return self.verify(batch, spec_info)\n")
    res = instrument(src, PATH, recipe)
    assert isinstance(res, Instrumented), res
    assert res.warnings == ("w.py: EAGLEWorker: accepted tokens not found; records will carry accepted=null",)
    old = V1_BEFORE.replace("self.forward_target_extend(batch)", "self.target_worker.forward_batch_generation(batch)")
    res = instrument(old, PATH, recipe)
    assert isinstance(res, Instrumented), res
    assert res.warnings == ("w.py: prefill target: not found in EAGLEWorker.forward_batch_generation of this "
                            "release: prefill records carry no target phase",)
    assert res.workers[0].missing == ("prefill target",)


# ---------------------------------------------------------------------------------------------------------------
# Internal errors: the self-checks, each made to fail


def test_internal_error_output_does_not_compile(recipe, monkeypatch):
    monkeypatch.setattr(engine, "_render", lambda lines, inserts: "def f(:\n    pass\n")
    res = instrument(V1_BEFORE, PATH, recipe)
    assert res.message() == "w.py:1: internal error: the instrumented file does not compile (invalid syntax)"


def test_internal_error_output_too_deep_to_compile(recipe, monkeypatch):
    """An output Python cannot compile for a reason other than its syntax (here an expression nested too deep:
    RecursionError) is refused with Python's own words."""
    deep = "x = " + "1+" * 200000 + "1\n"
    try:
        compile(ast.parse(deep, PATH), PATH, "exec", dont_inherit=True)
    except (ValueError, RecursionError, MemoryError) as exc:
        why = str(exc)
    monkeypatch.setattr(engine, "_render", lambda lines, inserts: deep)
    res = instrument(V1_BEFORE, PATH, recipe)
    assert res.message() == "w.py: internal error: the instrumented file does not compile (%s)" % why


def test_internal_error_output_does_not_strip_back(recipe, monkeypatch):
    monkeypatch.setattr(engine, "strip_lines", lambda text: text + "# more\n")
    res = instrument(V1_BEFORE, PATH, recipe)
    assert res.message() == "w.py: internal error: removing the added lines would not give back the original"


def test_internal_error_from_the_ast_check_names_the_input_line(recipe, monkeypatch):
    """A fault the ast check finds on a line of the output is reported at the input's line: for an added line,
    the original line after it (line 20 of V1_AFTER is the draft begin, above the draft statement, line 14)."""
    monkeypatch.setattr(engine, "check_output", lambda tree, new, workers: ("what is wrong", "EAGLEWorker", 20))
    assert split_lines(V1_AFTER)[19].strip().startswith('_eaglepatch.begin("draft"')
    res = instrument(V1_BEFORE, PATH, recipe)
    assert res.message() == "w.py:14 (EAGLEWorker): internal error: what is wrong; nothing instrumented"
    monkeypatch.setattr(engine, "check_output", lambda tree, new, workers: ("what is wrong", None, None))
    assert instrument(V1_BEFORE, PATH, recipe).message() == "w.py: internal error: what is wrong; nothing instrumented"
    # In a patched file, the line is the patched file's own: the draft statement is its line 21.
    monkeypatch.setattr(engine, "check_output", lambda tree, new, workers: ("what is wrong", None, 20))
    assert instrument(V1_AFTER, PATH, recipe).message() == "w.py:21: internal error: what is wrong; nothing instrumented"


def test_a_patched_file_that_no_longer_parses_is_reported_in_its_own_lines(recipe):
    """A patched file someone broke: the refusal is Python's message about the file as given, its line and the
    line the message names being lines of that file (not of the text with eaglepatch's lines taken out)."""
    res = instrument(V1_AFTER + "if True:\n", PATH, recipe)
    assert res.message() == ("w.py:32: does not parse (expected an indented block after 'if' statement on line 32)")


def test_a_patched_file_that_parses_only_with_eaglepatchs_lines(recipe):
    """A block left holding only an added line: the file parses, the text without eaglepatch's lines does not;
    the refusal says so, at the line after the block in the file given."""
    src = V1_AFTER.replace("                self.forward_draft_extend_after_decode(batch)\n"
                           '                _eaglepatch.end("draft_extend")  # [eaglepatch]\n', "")
    res = instrument(src, PATH, recipe)
    assert res.message() == (
        "w.py:29: once eaglepatch's lines are taken out, the file does not parse (expected an indented block after "
        "'if' statement on line 16) (the line it names is one of that text)")
