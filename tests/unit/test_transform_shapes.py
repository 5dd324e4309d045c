"""More shapes the transform meets, each pinned by what it must produce: phase calls in every kind of block (try,
except, else, finally, match, loops with else), the facts read after verify (tuple, starred and annotated
targets, ``$``, ``after_call``), line endings (CR only, mixed), where the import goes, and the output check's own
walk over those blocks. Written where mutation testing (docs/mutation-transform.md) showed a behaviour no test
pinned down.
"""

from __future__ import annotations

import ast
import textwrap

import pytest

from eaglepatch.transform import check, engine
from eaglepatch.transform.check import check_output
from eaglepatch.transform.engine import analyze, instrument, strip
from eaglepatch.transform.marks import BOM, IMPORT_CODE, MARKER, is_instrumented, split_lines, strip_lines
from eaglepatch.transform.recipe import load_recipe_text
from eaglepatch.transform.results import FactSite, Instrumented, NotApplicable, Refused, WorkerInfo
from transform_cases import GOLDEN, V1_AFTER, V1_BEFORE, V2_DECODE, read_case, v2

PATH = "w.py"
DRAFT = "            spec_info = self.draft(batch)\n"
VERIFY = "            logits_output, verify_output, _ = self.verify(batch, spec_info)\n"


def _ok(src: str, recipe) -> Instrumented:
    res = instrument(src, PATH, recipe)
    assert isinstance(res, Instrumented), res
    assert strip(res.source) == src
    return res


def _after_begin(res: Instrumented, phase: str) -> list[str]:
    """The stripped lines right after each begin of ``phase``."""
    lines = [ln.strip() for ln in split_lines(res.source)]
    return [lines[i + 1] for i, ln in enumerate(lines) if ln.startswith(f'_eaglepatch.begin("{phase}"')]


# ---------------------------------------------------------------------------------------------------------------
# Phase calls in every kind of block


def _decode(block: str) -> str:
    """V1_BEFORE with its decode branch's draft statement replaced by ``block`` (written at 12 spaces)."""
    return V1_BEFORE.replace(DRAFT, textwrap.indent(textwrap.dedent(block), " " * 12))


@pytest.mark.parametrize("block", [
    "try:\n    spec_info = self.draft(batch)\nexcept ValueError:\n    raise\n",
    "try:\n    pass\nexcept ValueError:\n    spec_info = self.draft(batch)\n",
    "try:\n    pass\nexcept ValueError:\n    pass\nelse:\n    spec_info = self.draft(batch)\n",
    "try:\n    pass\nfinally:\n    spec_info = self.draft(batch)\n",
    "for _ in [1]:\n    pass\nelse:\n    spec_info = self.draft(batch)\n",
    "while False:\n    pass\nelse:\n    spec_info = self.draft(batch)\n",
    "match batch:\n    case 1 if batch:\n        spec_info = self.draft(batch)\n",
    "if batch:\n    pass\nelif batch.x:\n    pass\nelse:\n    spec_info = self.draft(batch)\n",
], ids=["try-body", "except-body", "try-else", "finally", "for-else", "while-else", "match-case", "else"])
def test_a_phase_in_any_block_is_bracketed_inside_it(recipe, block):
    """Whatever block holds the phase statement, begin and end go around it inside that block (found by the
    walk over every suite of a compound statement), and the ast check finds them there."""
    res = _ok(_decode(block), recipe)
    assert _after_begin(res, "draft") == ["spec_info = self.draft(batch)"]
    lines = split_lines(res.source)
    at = next(i for i, ln in enumerate(lines) if "spec_info = self.draft(batch)" in ln)
    indent = lines[at][: len(lines[at]) - len(lines[at].lstrip())]
    assert lines[at - 1] == f'{indent}_eaglepatch.begin("draft", "decode")  # [eaglepatch]\n'
    assert lines[at + 1] == f'{indent}_eaglepatch.end("draft")  # [eaglepatch]\n'


@pytest.mark.parametrize("block,line", [
    ("match self.draft(batch):\n    case _:\n        pass\n", 14),
    ("match batch:\n    case 1 if self.draft(batch):\n        pass\n", 15),
    ("try:\n    pass\nexcept self.draft(batch):\n    pass\n", 16),
    ("for s in self.draft(batch):\n    pass\n", 14),
    ("with self.draft(batch):\n    pass\n", 14),
], ids=["match-subject", "case-guard", "except-type", "for-iterable", "with-item"])
def test_a_phase_in_a_header_of_any_block_is_refused(recipe, block, line):
    """A header (match subject, case guard, except type, for iterable, with item) has no line before or after
    it inside the block: refused on its line, whatever the block."""
    res = instrument(_decode(block), PATH, recipe)
    assert isinstance(res, Refused), res
    assert res.message() == (f"w.py:{line} (EAGLEWorker): phase call self.draft(...) sits in a compound "
                             "statement's header: no line can be added around it")


def test_a_nested_definition_without_phase_calls_is_skipped_and_the_scan_goes_on(recipe):
    """A helper function defined inside the method, holding no phase call, is nothing the transform times; the
    statements after it are still scanned (the draft after it is found and bracketed)."""
    res = _ok(_decode("def helper(x):\n    return x\nspec_info = self.draft(batch)\n"), recipe)
    assert _after_begin(res, "draft") == ["spec_info = self.draft(batch)"]


def test_a_reference_to_a_dotted_callee_of_three_parts_is_refused(recipe):
    """``step = self.draft_worker.draft``: the callee's last part ("draft") is how a reference is spotted; a
    three-part callee is spotted too (its last part, not what follows its first dot)."""
    src = v2(V2_DECODE.replace("verify_input: EagleVerifyInput = self.draft_worker.draft(batch)\n",
                               "step = self.draft_worker.draft\nverify_input: EagleVerifyInput = step(batch)\n"))
    res = instrument(src, PATH, recipe)
    assert isinstance(res, Refused), res
    assert res.message() == ("w.py:11 (EAGLEWorkerV2): phase callee self.draft_worker.draft is named without being "
                             "called here (stored or passed on): when it runs is not known")


# ---------------------------------------------------------------------------------------------------------------
# Facts: the accepted tokens


def test_the_fact_site_says_what_and_where(recipe):
    """FactSite: the fact's name, the method, the name read, its attributes, the bonus and the line."""
    res = _ok(V1_BEFORE, recipe)
    (fact,) = res.workers[0].facts
    assert fact == FactSite("accepted", "forward_batch_generation", "verify_output",
                                   ("accept_length_per_req_cpu", "num_correct_drafts_per_req_cpu"), 1, 15)


@pytest.mark.parametrize("target,read", [
    ("*rest, verify_output = self.verify(batch, spec_info)", "verify_output"),
    ("logits_output, *verify_output = self.verify(batch, spec_info)", "verify_output"),
    ("[logits_output, verify_output, _] = self.verify(batch, spec_info)", "verify_output"),
    ("logits_output, (verify_output, _) = self.verify(batch, spec_info)", "verify_output"),
    ("verify_output: VerifyOutput = self.verify(batch, spec_info)", "verify_output"),
    ("logits_output = verify_output = self.verify(batch, spec_info)", "verify_output"),
    ("self.out = self.verify(batch, spec_info)", None),
    ("logits_output, verify_output, _ = self.verify(batch, spec_info); n = 1", "verify_output"),
], ids=["starred", "starred-name", "list", "nested-tuple", "annotated", "chained", "attribute", "semicolon"])
def test_the_names_verify_binds(recipe, target, read):
    """The name the recipe reads after verify (V1: verify_output) is found among every name the statement
    binds: in a starred, list, nested or chained target, an annotated one, or the first of ';' statements; an
    attribute target binds no name (no accepted line, a warning)."""
    res = _ok(V1_BEFORE.replace(VERIFY, f"            {target}\n"), recipe)
    assert [f.expr for f in res.workers[0].facts] == ([read] if read else [])
    assert bool(res.warnings) == (read is None)


@pytest.mark.parametrize("stmt,read", [
    ("batch_output = self.verify(batch)", "batch_output"),
    ("batch_output: GenerationBatchResult = self.verify(batch)", "batch_output"),
    ("out = batch_output = self.verify(batch)", None),
    ("self.batch_output = self.verify(batch)", None),
    ("(a, b) = self.verify(batch)", None),
    ("batch_output = self.verify(batch); other = 1", None),
], ids=["assign", "annotated", "two-targets", "attribute", "tuple", "semicolon"])
def test_the_single_target_of_dollar(recipe, stmt, read):
    """V2 reads ``$``: the one name a statement assigns (Assign or AnnAssign with a value). Two targets, an
    attribute, a tuple or a ';' line have no single name: no accepted line."""
    res = _ok(v2(V2_DECODE.replace("batch_output = self.verify(batch)\n", stmt + "\n")
                 .replace("(batch, batch_output)", "(batch, None)").replace("return batch_output\n", "return None\n", 1)),
              recipe)
    assert [f.expr for f in res.workers[0].facts] == ([read] if read else [])


# A recipe whose accepted count is read after a call that is no phase (NGRAM up to 0.5.13), shared with the
# golden cases fact-after-a-call*.py.
NGRAM_RECIPE = (GOLDEN / "recipes" / "after_call.toml").read_text(encoding="utf-8")


@pytest.mark.parametrize("accept,read", [
    ("num_accepted = verify_input.verify(batch, out)", "num_accepted"),
    ("num_accepted = (lambda: verify_input.verify(batch, out))()", None),
    ("if ok: num_accepted = verify_input.verify(batch, out)", None),
    ("num_accepted = other.verify(batch, out)", None),
], ids=["plain", "in-a-lambda", "one-line-suite", "other-callee"])
def test_a_fact_read_after_another_call(accept, read):
    """``after_call``: the accepted count is read after the statement calling that callee (NGRAM up to 0.5.13),
    bracketed nowhere; a call inside a lambda, in a one-line suite or of another callee is not it."""
    r = load_recipe_text(NGRAM_RECIPE, "n.toml")
    src = ("class W:\n    def forward_batch_generation(self, batch):\n        out = self.target(batch)\n"
           f"        {accept}\n        return out\n")
    res = instrument(src, PATH, r)
    assert isinstance(res, Instrumented), res
    facts = res.workers[0].facts
    assert [(f.expr, f.method, f.line, f.bonus_per_req, f.attrs) for f in facts] == (
        [(read, "forward_batch_generation", 4, 1, ())] if read else [])
    if read:  # the golden case fact-after-a-call.py: the accepted line right after the statement
        assert res.source == read_case("fact-after-a-call").after


def test_a_required_fact_that_is_missing_is_refused():
    """``required = true`` on a fact: a class where it is not found is refused, naming the class and method."""
    r = load_recipe_text(NGRAM_RECIPE + "required = true\n", "n.toml")
    src = ("class W:\n    def forward_batch_generation(self, batch):\n        out = self.target(batch)\n"
           "        return out\n")
    res = instrument(src, PATH, r)
    assert isinstance(res, Refused)
    assert res.message() == "w.py:2 (W): the accepted-tokens value the recipe requires is not found"
    found = instrument(src.replace("        return out\n", "        num_accepted = verify_input.verify(out)\n"
                                   "        return out\n"), PATH, r)
    assert isinstance(found, Instrumented)
    dollar = load_recipe_text(NGRAM_RECIPE.replace('from = ["num_accepted"]', 'from = ["$"]') + "required = true\n",
                              "n.toml")
    assert isinstance(instrument(src.replace("        return out\n", "        n = verify_input.verify(out)\n"
                                             "        return out\n"), PATH, dollar), Instrumented)


def test_a_fact_at_the_end_of_a_file_without_newline_is_refused():
    """The accepted line goes after the statement: a statement that ends the file without a newline has no
    place after it (refused, naming the class), as a phase statement there is."""
    r = load_recipe_text(NGRAM_RECIPE, "n.toml")
    src = ("class W:\n    def forward_batch_generation(self, batch):\n        out = self.target(batch)\n"
           "        num_accepted = verify_input.verify(batch, out)")
    res = instrument(src, PATH, r)
    assert res.message() == "w.py:4 (W): a phase statement ends the file without a newline"


# ---------------------------------------------------------------------------------------------------------------
# Line endings and the import


def test_a_cr_only_file(recipe):
    """Old Mac line ends (a lone \\r ends a line in Python): every added line ends with \\r too, and strip and the
    tokenizer-based check see Python's lines."""
    src = V1_BEFORE.replace("\n", "\r")
    res = _ok(src, recipe)
    assert res.source == V1_AFTER.replace("\n", "\r")
    assert strip_lines(res.source) == src


def test_mixed_line_endings_each_added_line_copies_its_neighbour(recipe):
    """A file whose first lines end in CRLF and the rest in LF: each added line takes the line end of the line it
    is anchored to (the import the last import's, the others their statement's), not the file's first."""
    head, rest = V1_BEFORE.split("class EAGLEWorker", 1)
    src = head.replace("\n", "\r\n") + "class EAGLEWorker" + rest
    res = _ok(src, recipe)
    out_head, out_rest = V1_AFTER.split("class EAGLEWorker", 1)
    assert res.source == out_head.replace("\n", "\r\n") + "class EAGLEWorker" + out_rest


def test_the_import_copies_the_line_end_of_the_last_import(recipe):
    """The import line takes the line end of the import it follows (here the only CRLF line), not the first
    line's."""
    last = "from sglang.srt.managers.tp_worker import TpModelWorker\n"
    src = V1_BEFORE.replace(last, last.replace("\n", "\r\n"))
    res = _ok(src, recipe)
    ours = f"{IMPORT_CODE}  {MARKER}\n"
    assert res.source == V1_AFTER.replace(last + ours, (last + ours).replace("\n", "\r\n"))


def test_the_import_goes_first_when_no_import_or_docstring_comes_before_the_class(recipe):
    """``x = 1`` first, then the class: the import is the file's first line (a statement that is not an import
    or the docstring does not move it), in the first line's line end."""
    src = "x = 1\r\n\n" + V1_BEFORE[V1_BEFORE.index("class EAGLEWorker"):]
    res = _ok(src, recipe)
    assert res.source == f"{IMPORT_CODE}  {MARKER}\r\nx = 1\r\n\n" + V1_AFTER[V1_AFTER.index("class EAGLEWorker"):]


def test_is_instrumented_sees_an_import_right_after_a_bom():
    """A BOM file with nothing above the class has the import as its first line, right after the BOM."""
    assert is_instrumented(BOM + "from . import _eaglepatch_runtime as _eaglepatch  # [eaglepatch]\nx = 1\n")
    assert is_instrumented("from . import _eaglepatch_runtime as _eaglepatch  # [eaglepatch]\nx = 1\n")
    assert not is_instrumented(BOM + "x = 1  # [eaglepatch]\n")


# ---------------------------------------------------------------------------------------------------------------
# What the results carry


def test_results_carry_their_path_warnings_and_flags(recipe):
    """Every result names the path it was given; analyze returns the source as given, its warnings, and whether
    it was patched; a file with no worker is NotApplicable with that path."""
    for res in (instrument(V1_BEFORE, PATH, recipe), analyze(V1_BEFORE, PATH, recipe),
                instrument("import os\n", PATH, recipe), instrument("class EAGLEWorker:\n    pass\n", PATH, recipe)):
        assert res.path == PATH
    a = analyze(V1_AFTER, PATH, recipe)
    assert isinstance(a, Instrumented)
    assert (a.source, a.changed, a.was_patched, a.warnings) == (V1_AFTER, False, True, ())
    warned = analyze(V1_BEFORE.replace(VERIFY, "            self.verify(batch, spec_info)\n"), PATH, recipe)
    assert warned.warnings == ("w.py: EAGLEWorker: accepted tokens not found; records will carry accepted=null",)
    assert isinstance(instrument("class EAGLEWorker:\n    pass\n", PATH, recipe), NotApplicable)


@pytest.mark.parametrize("line,kept,expected", [
    (None, [0, 2], None),
    (3, None, 3),
    (0, [0, 2], 0),
    (1, [0, 2, 5], 1),
    (1, [2, 5], 3),
    (3, [0, 2, 5], 6),
    (4, [0, 2, 5], 7),
    (6, [0, 2, 5], 9),
])
def test_source_line_maps_a_stripped_line_to_the_patched_file(line, kept, expected):
    """A refusal's line in the stripped text, as a line of the patched file given (``kept[i]`` is the 0-based
    patched line of stripped line i); a line past the stripped end is as far past the last line kept."""
    assert engine._source_line(line, kept) == expected


# ---------------------------------------------------------------------------------------------------------------
# The output check's own walk


def _check(before: str, after: str, recipe):
    res = instrument(before, PATH, recipe)
    assert isinstance(res, Instrumented)
    return check_output(ast.parse(before), after, res.workers)


def test_check_output_walks_every_block(recipe):
    """Phases inside try/except/else/finally and match cases: the right output passes; moving the begin of the
    one in each block above the statement before it is found (the check visits each block's statements)."""
    block = ("try:\n    x = 1\n    spec_info = self.draft(batch)\nexcept ValueError:\n    raise\n"
             "finally:\n    y = 1\n    n = 0\n")
    src = _decode(block).replace("                self.forward_draft_extend_after_decode(batch)\n",
                                 "                match batch:\n                    case _:\n"
                                 "                        z = 1\n"
                                 "                        self.forward_draft_extend_after_decode(batch)\n")
    res = _ok(src, recipe)
    assert check_output(ast.parse(src), res.source, res.workers) is None
    for begin in ('_eaglepatch.begin("draft", "decode")', '_eaglepatch.begin("draft_extend", "decode")'):
        lines = split_lines(res.source)
        at = next(i for i, ln in enumerate(lines) if begin in ln)
        moved = lines[: at - 1] + [lines[at], lines[at - 1]] + lines[at + 1:]
        problem = check_output(ast.parse(src), "".join(moved), res.workers)
        assert problem is not None and "not followed by the statement holding its phase call" in problem[0]


def test_check_output_return_form_then_more_phases(recipe):
    """A begin before ``return self.verify(...)`` needs no end; the check then goes on to the phases after it
    in the same block (a misplaced one there is still found)."""
    src = v2("verify_input: EagleVerifyInput = self.draft_worker.draft(batch)\n"
             "self.draft_worker._draft_extend_for_decode(batch, None)\nreturn self.verify(batch)\n")
    res = _ok(src, recipe)
    assert check_output(ast.parse(src), res.source, res.workers) is None
    bad = res.source.replace('            _eaglepatch.end("draft_extend")  # [eaglepatch]\n', "")
    bad = bad.replace('            _eaglepatch.begin("draft", "decode")  # [eaglepatch]\n'
                      "            verify_input: EagleVerifyInput = self.draft_worker.draft(batch)\n",
                      "            verify_input: EagleVerifyInput = self.draft_worker.draft(batch)\n"
                      '            _eaglepatch.begin("draft", "decode")  # [eaglepatch]\n')
    problem = check_output(ast.parse(src), bad, res.workers)
    assert problem is not None


def test_check_output_a_begin_last_in_its_block(recipe):
    """A begin whose phase statement is the last of its block has no end to find there: reported, not a crash
    (the end was taken out)."""
    src = V1_BEFORE
    bad = V1_AFTER.replace('                _eaglepatch.end("draft_extend")  # [eaglepatch]\n', "")
    problem = _check(src, bad, recipe)
    assert problem == ("the phase statement after begin('draft_extend') is not followed by its end", None, 29)


def test_check_output_accepted_right_after_the_statement(recipe):
    """accepted follows verify's end, or (a fact after a call) the statement itself: both pass; the statement
    before it (skipping ends) must bind the name."""
    assert _check(V1_BEFORE, V1_AFTER, recipe) is None
    first = V1_AFTER.replace(
        '            _eaglepatch.accepted(verify_output, ("accept_length_per_req_cpu", '
        '"num_correct_drafts_per_req_cpu",), 1)  # [eaglepatch]\n', "")
    first = first.replace("class EAGLEWorker(TpModelWorker):\n", "class EAGLEWorker(TpModelWorker):\n"
                          "    _eaglepatch.accepted(x, (), 1)  # [eaglepatch]\n")
    problem = _check(V1_BEFORE, first, recipe)
    assert problem is not None and "accepted(x) does not follow the statement binding it" == problem[0]


@pytest.mark.parametrize("edit,expected", [
    (lambda t: t.replace("    @_eaglepatch.entry  # [eaglepatch]\n", "    @other\n    @_eaglepatch.entry  # [eaglepatch]\n"),
     "the entry decorator is not the first decorator of a method"),
    (lambda t: t + "\n\nclass Other:\n    @_eaglepatch.entry  # [eaglepatch]\n    def forward_batch_generation(self):\n"
                   "        pass\n",
     "the entry decorator sits on Other.forward_batch_generation, not an entry method"),
    (lambda t: t.replace("    @_eaglepatch.entry  # [eaglepatch]\n", "").replace(
        "class EAGLEWorker(", "@_eaglepatch.entry  # [eaglepatch]\nclass EAGLEWorker("),
     "the entry decorator is not the first decorator of a method"),
    (lambda t: t + "\n\n@_eaglepatch.entry  # [eaglepatch]\ndef f():\n    pass\n",
     "the entry decorator is not on EAGLEWorker.forward_batch_generation alone"),
    (lambda t: t.replace("    def forward_batch_generation(self, batch):\n",
                         "    def forward_batch_generation(self, batch):\n        pass\n\n"
                         "    @_eaglepatch.entry  # [eaglepatch]\n    def forward_batch_generation(self, batch):\n", 1)
                .replace("    @_eaglepatch.entry  # [eaglepatch]\n    def forward_batch_generation(self, batch):\n"
                         "        pass\n", "    def forward_batch_generation(self, batch):\n        pass\n", 1),
     "once the added lines are taken out, the module is not the input's"),
    (lambda t: t.replace("from . import _eaglepatch_runtime as _eaglepatch  # [eaglepatch]\n", "")
                + "from . import _eaglepatch_runtime as _eaglepatch  # [eaglepatch]\n",
     "the runtime import is not once at the top level before the first decorator"),
    (lambda t: t.replace("    @_eaglepatch.entry  # [eaglepatch]\n",
                         "    from . import _eaglepatch_runtime as _eaglepatch  # [eaglepatch]\n"
                         "    @_eaglepatch.entry  # [eaglepatch]\n"),
     "once the added lines are taken out, the module is not the input's"),
], ids=["not-first", "other-class", "on-the-class", "a-function", "shadowed-def", "import-last",
        "second-import"])
def test_check_output_decorator_and_import_faults(recipe, edit, expected):
    """Each fault of the decorator or the import, with its own reason."""
    problem = _check(V1_BEFORE, edit(V1_AFTER), recipe)
    assert problem is not None and problem[0] == expected, problem


def test_check_output_counts(recipe):
    """An extra end, begin or accepted line of the right shape somewhere else is a count that does not match."""
    extra_end = V1_AFTER.replace('            _eaglepatch.end("verify")  # [eaglepatch]\n',
                                 '            _eaglepatch.end("verify")  # [eaglepatch]\n'
                                 '            _eaglepatch.end("verify")  # [eaglepatch]\n')
    assert _check(V1_BEFORE, extra_end, recipe)[0] == "an end('verify',) that closes no begin"
    res = instrument(V1_BEFORE, PATH, recipe)
    fewer = [WorkerInfo(**{**vars(w), "facts": ()}) for w in res.workers]
    assert check_output(ast.parse(V1_BEFORE), V1_AFTER, fewer) == (
        "the accepted lines do not match the facts found", None, None)
    more = [WorkerInfo(**{**vars(w), "phases": w.phases + w.phases[:1]}) for w in res.workers]
    assert check_output(ast.parse(V1_BEFORE), V1_AFTER, more) == (
        "the begin lines do not match the phase calls found", None, None)
    returning = [WorkerInfo(**{**vars(w), "phases": tuple(dataclasses_replace(p, form="return")
                                                                 for p in w.phases)}) for w in res.workers]
    assert check_output(ast.parse(V1_BEFORE), V1_AFTER, returning) == (
        "the end lines do not match the phase statements found", None, None)


def dataclasses_replace(obj, **changes):
    import dataclasses

    return dataclasses.replace(obj, **changes)


def test_check_output_output_that_does_not_parse(recipe):
    res = instrument(V1_BEFORE, PATH, recipe)
    problem = check_output(ast.parse(V1_BEFORE), "def f(:\n", res.workers)
    with pytest.raises(SyntaxError) as python:
        ast.parse("def f(:\n")
    assert problem == (f"the instrumented file does not parse ({python.value})", None, None)


@pytest.mark.parametrize("a,b,same", [
    ("x = 1\n", "x = 1\n", True),
    ("x = 1\n", "x  =  1  # c\n", True),
    ("x = 1\n", "x = 2\n", False),
    ("x = 1\n", "y = 1\n", False),
    ("f(a)\n", "f(a, b)\n", False),
    ("f(a, b)\n", "f(a)\n", False),
    ("x = 1\n", "x = 1.0\n", False),
    ("if a:\n    pass\n", "while a:\n    pass\n", False),
])
def test_same_tree_is_ast_dump_equality(a, b, same):
    """``check._same_tree`` says what ``ast.dump`` equality says: node types, field values, list lengths; positions and
    comments do not count."""
    assert check._same_tree(ast.parse(a), ast.parse(b)) is same
    assert (ast.dump(ast.parse(a)) == ast.dump(ast.parse(b))) is same


def test_check_output_names_the_class_whose_decorator_is_missing(recipe):
    """The fault names the class (for the refusal's class) as well as the method."""
    problem = _check(V1_BEFORE, V1_AFTER.replace("    @_eaglepatch.entry  # [eaglepatch]\n", ""), recipe)
    assert problem == ("the entry decorator is not on EAGLEWorker.forward_batch_generation alone", "EAGLEWorker", None)


def test_check_output_an_end_of_another_phase(recipe):
    """The line after the draft statement is an end, but of verify: not the draft's end."""
    bad = V1_AFTER.replace('            _eaglepatch.end("draft")  # [eaglepatch]\n',
                           '            _eaglepatch.end("verify")  # [eaglepatch]\n')
    assert _check(V1_BEFORE, bad, recipe) == (
        "the phase statement after begin('draft') is not followed by its end", None, 21)


def test_check_output_accepted_without_arguments(recipe):
    """``accepted()`` with nothing to read: not one eaglepatch writes, reported."""
    bad = V1_AFTER.replace(
        '            _eaglepatch.accepted(verify_output, ("accept_length_per_req_cpu", '
        '"num_correct_drafts_per_req_cpu",), 1)  # [eaglepatch]\n', "            _eaglepatch.accepted()\n")
    assert _check(V1_BEFORE, bad, recipe) == ("accepted() does not follow the statement binding it", None, 26)


def test_check_output_goes_on_after_a_return_form_phase(recipe):
    """A return-form begin (no end) followed, in the same block, by more phases (code after the return never
    runs, but it is instrumented like any other): the check accounts for all of them and passes."""
    src = v2("verify_input: EagleVerifyInput = self.draft_worker.draft(batch)\nreturn self.verify(batch)\n"
             "self.draft_worker._draft_extend_for_decode(batch, None)\n")
    res = _ok(src, recipe)
    assert [p.form for p in res.workers[0].phases if p.mode == "decode"] == ["statement", "return", "statement"]
    assert check_output(ast.parse(src), res.source, res.workers) is None


def test_a_known_unsupported_class_without_an_entry_method(recipe):
    """DFlashWorker named by the recipe as unsupported but defining no entry method itself: listed as
    unsupported with the recipe's reason, at its class line, with no method."""
    src = "x = 1\n\n\nclass DFlashWorker(Base):\n    pass\n"
    (w,) = instrument(src, PATH, recipe).workers
    assert (w.cls, w.status, w.method, w.method_start, w.timer) == ("DFlashWorker", "unsupported", None, 4, None)
    assert w.reason == "DFlash inlines its draft and verify in the entry method (no draft()/verify() call to time)"


def test_a_patched_file_whose_marked_line_alone_fills_the_last_block(recipe):
    """The file ends with a block holding only an eaglepatch line: the file parses, the text without it does
    not; the refusal says so, at the block's line in the file given."""
    src = V1_AFTER + 'if ready:\n    _eaglepatch.end("draft")  # [eaglepatch]\n'
    res = instrument(src, PATH, recipe)
    assert isinstance(res, Refused), res
    assert split_lines(src)[res.line - 1] == "if ready:\n"
    assert res.message() == ("w.py:32: once eaglepatch's lines are taken out, the file does not parse (expected an "
                             "indented block after 'if' statement on line 19) (the line it names is one of that text)")


def test_a_file_too_deep_for_pythons_parser(recipe):
    """A file Python's parser gives up on (its recursion limit) is refused like one that does not parse."""
    src = "x = " + "+".join(["1"] * 200000) + "\n"
    res = instrument(src, PATH, recipe)
    assert res.message() == ("w.py: does not parse with this Python (maximum recursion depth exceeded during ast "
                             "construction)")


def test_check_output_accepted_after_a_statement_that_binds_nothing(recipe):
    """accepted right after a plain call (no assignment): reported, whatever names the call mentions."""
    moved = V1_AFTER.replace(
        '            _eaglepatch.accepted(verify_output, ("accept_length_per_req_cpu", '
        '"num_correct_drafts_per_req_cpu",), 1)  # [eaglepatch]\n', "")
    moved = moved.replace(
        '            _eaglepatch.end("draft_extend")  # [eaglepatch]\n            return logits_output, next_token_ids\n',
        '            _eaglepatch.end("draft_extend")  # [eaglepatch]\n'
        '            _eaglepatch.accepted(verify_output, (), 1)  # [eaglepatch]\n'
        "            return logits_output, next_token_ids\n")
    problem = _check(V1_BEFORE, moved, recipe)
    assert problem == ("accepted(verify_output) does not follow the statement binding it", None, 18)
