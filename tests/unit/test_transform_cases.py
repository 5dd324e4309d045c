"""Small hand-written cases for the transform (LibCST codemod-test style).

The cases that instrument are golden files, tests/data/transform/<name>.py (input, then the whole expected
output; see transform_cases.py), run by ``test_golden_case``: each is one shape from
shared/reference/sglang-workers.md ("Shapes that break a naive transform") or a file property, and its comment
says why the expectation holds. The tests below check what a golden file cannot: the sites and facts found,
variants of a golden file (line ends, indentation, an edited or already instrumented file), strip, and the
refusals, each word for word (a refusal has no output).
"""

from __future__ import annotations

import ast
import sys

import pytest

from eaglepatch.transform.engine import analyze, instrument, strip
from eaglepatch.transform.marks import MARKER, is_instrumented
from eaglepatch.transform.results import Instrumented, NotApplicable, Refused
from transform_cases import (
    PATH,
    REGEN,
    V1_AFTER,
    V1_BEFORE,
    assert_codemod,
    case_names,
    ok,
    read_case,
    recipe_of,
    write_after,
)


def _refused(source: str, recipe) -> Refused:
    res = instrument(source, PATH, recipe)
    assert isinstance(res, Refused), f"expected a refusal, got {type(res).__name__}"
    return res


def _lines_of(res: Instrumented, cls: str) -> list[tuple[str, str, int, str]]:
    w = next(w for w in res.workers if w.cls == cls)
    return [(p.phase, p.mode, p.line, p.form) for p in w.phases]


# ---------------------------------------------------------------------------------------------------------------
# The golden cases


@pytest.mark.parametrize("name", case_names())
def test_golden_case(recipe, name):
    """tests/data/transform/<name>.py: ``instrument(before)`` is exactly its after part, which compiles, strips
    back to the before part byte for byte, and is instrumented again unchanged. (EAGLEPATCH_REGEN_GOLDEN=1 writes
    the output as the after part first.)"""
    case = read_case(name)
    r = recipe_of(case, recipe)
    if REGEN:
        write_after(case, ok(case.before, r).source)
        case = read_case(name)
    assert_codemod(case.before, case.after, r)


def test_the_golden_cases_are_read_byte_for_byte():
    """A case file keeps what it holds (a form feed, tabs): nothing is translated on reading, and the comment
    is no part of the input."""
    feed = read_case("form-feed-in-a-comment-shifts-nothing")
    assert "# page\x0c\n" in feed.before and feed.why.startswith("A form feed in a comment")
    assert "\tx = 1\n" in read_case("tab-indented-class-after-a-statement").before
    assert read_case("fact-after-a-call").recipe == "after_call.toml"
    assert V1_BEFORE.startswith('"""A V1 worker') and V1_AFTER.startswith('"""A V1 worker')


# ---------------------------------------------------------------------------------------------------------------
# What the golden cases find


def test_v1_sites_and_the_fact_read_after_verify(recipe):
    """The V1 golden case's sites: each phase statement's line and form, and accepted read after verify (line 15)
    from verify_output, with the bonus token; no warning."""
    res = ok(V1_BEFORE, recipe)
    assert _lines_of(res, "EAGLEWorker") == [
        ("target", "prefill", 10, "statement"),
        ("draft_extend", "prefill", 11, "statement"),
        ("draft", "decode", 14, "statement"),
        ("verify", "decode", 15, "statement"),
        ("draft_extend", "decode", 17, "statement"),
    ]
    (fact,) = res.workers[0].facts
    assert (fact.expr, fact.line, fact.bonus_per_req) == ("verify_output", 15, 1)
    assert res.warnings == ()


def test_a_statement_over_several_lines_is_one_site(recipe):
    """``a, b, c = (\\n self.verify(...)\\n)``: the verify site spans the statement's three lines."""
    res = ok(read_case("tuple-unpack-parenthesised-on-the-right").before, recipe)
    site = next(p for p in res.workers[0].phases if p.phase == "verify")
    assert (site.line, site.end_line) == (15, 17)


def test_a_call_inside_return_is_a_return_site_without_a_fact(recipe):
    """``return self.verify(batch)``: a site of the return form, no accepted read, and a warning saying so."""
    res = ok(read_case("call-inside-return-gets-begin-only").before, recipe)
    assert ("verify", "decode", 13, "return") in _lines_of(res, "EAGLEWorkerV2")
    assert res.workers[0].facts == ()
    assert res.warnings == (f"{PATH}: EAGLEWorkerV2: accepted tokens not found; records will carry accepted=null",)


def test_the_phases_of_a_helper_are_sites_of_the_helper(recipe):
    """The prefill phases found in the recipe's helper are sites of that method (the entry method holds none)."""
    res = ok(read_case("prefill-helpers-hold-the-phases").before, recipe)
    assert [(p.phase, p.mode, p.method) for p in res.workers[0].phases] == [
        ("draft", "decode", "forward_batch_generation"), ("verify", "decode", "forward_batch_generation"),
        ("draft_extend", "decode", "forward_batch_generation"), ("target", "prefill", "_forward_prefill_batch"),
        ("draft_extend", "prefill", "_forward_prefill_batch")]


# ---------------------------------------------------------------------------------------------------------------
# Variants of the V1 case: line endings, indentation, edited files


def test_crlf_line_endings(recipe):
    """A CRLF file: every added line ends with CRLF too (each copies the line ending of the line it sits by),
    nothing else changes, and strip gives the CRLF bytes back."""
    assert_codemod(V1_BEFORE.replace("\n", "\r\n"), V1_AFTER.replace("\n", "\r\n"), recipe)


@pytest.mark.parametrize("indent", ["\t", "  "], ids=["tabs", "two-spaces"])
def test_tab_and_two_space_indentation(recipe, indent):
    """A file indented with tabs (or two spaces): the added lines copy the indentation of the statement they wrap,
    so the output is the 4-space output with that indentation."""
    def reindent(text: str) -> str:
        out = []
        for line in text.splitlines(keepends=True):
            n = len(line) - len(line.lstrip(" "))
            out.append(indent * (n // 4) + line[n:])
        return "".join(out)

    assert_codemod(reindent(V1_BEFORE), reindent(V1_AFTER), recipe)


def test_patched_file_edited_by_hand_is_patched_again(recipe):
    """A patched file that someone then edited (one of our end lines deleted, a line of their own added): strip
    keeps their line and drops ours; instrumenting again gives exactly what instrumenting their edited original
    gives, and reports a change."""
    patched = V1_AFTER.replace('            _eaglepatch.end("draft")  # [eaglepatch]\n', "")
    patched = patched.replace(
        "            return logits_output, verify_output.verified_id\n",
        "            stats.decode_cycles += 1\n            return logits_output, verify_output.verified_id\n",
    )
    their_original = V1_BEFORE.replace(
        "            return logits_output, verify_output.verified_id\n",
        "            stats.decode_cycles += 1\n            return logits_output, verify_output.verified_id\n",
    )
    assert strip(patched) == their_original
    res = ok(patched, recipe)
    assert res.was_patched is True and res.changed is True
    assert res.source == ok(their_original, recipe).source


def test_already_instrumented_input_changes_nothing(recipe):
    """Instrumenting an instrumented file is a no-op: same text, changed False, was_patched True (the patch is
    recognised by its marked lines and re-derived from the stripped original, which gives the same lines)."""
    res = ok(V1_AFTER, recipe)
    assert res.source == V1_AFTER
    assert res.changed is False and res.was_patched is True
    assert is_instrumented(V1_AFTER) and not is_instrumented(V1_BEFORE)


def test_strip_of_an_untouched_file_is_the_identity(recipe):
    """strip only removes lines that end with the marker; a file without it comes back as it is."""
    assert strip(V1_BEFORE) == V1_BEFORE
    assert MARKER not in V1_BEFORE


def test_strip_works_on_a_patched_file_that_no_longer_parses(recipe):
    """If someone broke the patched file's syntax, strip still removes exactly our lines (by their shape)."""
    broken = V1_AFTER.replace("    def forward_batch_generation(self, batch):\n", "    def forward_batch_generation(self, batch)\n")
    expected = V1_BEFORE.replace("    def forward_batch_generation(self, batch):\n", "    def forward_batch_generation(self, batch)\n")
    assert strip(broken) == expected


def test_analyze_reports_without_changing(recipe):
    """analyze finds what instrument would, with the lines of the source as given, and returns it unchanged."""
    res = analyze(V1_BEFORE, PATH, recipe)
    assert isinstance(res, Instrumented)
    assert res.source == V1_BEFORE and res.changed is False
    assert _lines_of(res, "EAGLEWorker") == _lines_of(ok(V1_BEFORE, recipe), "EAGLEWorker")


# ---------------------------------------------------------------------------------------------------------------
# Not ours


def test_subclass_without_entry_method_inherits(recipe):
    """StandaloneWorker(EAGLEWorker) defines no entry method: the base class's instrumented method times it, so the
    file is not applicable (nothing to patch), and show can say why."""
    src = "from sglang.srt.speculative.eagle_worker import EAGLEWorker\n\n\nclass StandaloneWorker(EAGLEWorker):\n    pass\n"
    res = instrument(src, PATH, recipe)
    assert isinstance(res, NotApplicable)
    (w,) = res.workers
    assert (w.cls, w.status) == ("StandaloneWorker", "inherits")
    assert res.reason == "StandaloneWorker: inherits its entry method: timed through the base class"


def test_known_unsupported_class_is_listed_with_its_reason(recipe):
    """DFlashWorker has no draft()/verify() call to time: not applicable, with the recipe's reason, never a
    refusal (it must not make apply fail for the other files)."""
    src = "class DFlashWorker(TpModelWorker):\n    def forward_batch_generation(self, batch):\n        return self.x(batch)\n"
    res = instrument(src, PATH, recipe)
    assert isinstance(res, NotApplicable)
    (w,) = res.workers
    assert w.status == "unsupported"
    assert w.reason == "DFlash inlines its draft and verify in the entry method (no draft()/verify() call to time)"


def test_file_without_workers_is_not_applicable(recipe):
    """A module with no recipe class and no entry method is simply not ours."""
    res = instrument("import os\n\n\nclass Foo:\n    pass\n", PATH, recipe)
    assert isinstance(res, NotApplicable) and res.workers == ()
    assert res.reason == "no speculative worker class of the recipe in this file"


# ---------------------------------------------------------------------------------------------------------------
# Refusals: one line, naming the file, the class and the line


def test_refuses_a_missing_phase(recipe):
    """No verify call where the recipe requires one: an unknown layout. Nothing is instrumented; the message
    names the class and the entry method's line."""
    src = V1_BEFORE.replace(
        "            logits_output, verify_output, _ = self.verify(batch, spec_info)\n",
        "            logits_output, verify_output, _ = self.check(batch, spec_info)\n",
    )
    r = _refused(src, recipe)
    assert (r.cls, r.line) == ("EAGLEWorker", 8)
    assert r.message() == (f"{PATH}:8 (EAGLEWorker): phase 'verify' (self.verify(...)) not found in "
                           "forward_batch_generation: unknown layout, nothing instrumented")


def test_refuses_a_phase_present_twice(recipe):
    """Two draft calls in one method where the recipe expects one: which to time is ambiguous. The message names
    both lines."""
    src = V1_BEFORE.replace(
        "            spec_info = self.draft(batch)\n",
        "            spec_info = self.draft(batch)\n            spec_info = self.draft(batch)\n",
    )
    r = _refused(src, recipe)
    assert (r.cls, r.line) == ("EAGLEWorker", 15)
    assert r.message() == (f"{PATH}:15 (EAGLEWorker): phase 'draft' (self.draft(...) or "
                           "self.forward_draft_decode(...)) appears twice in forward_batch_generation (lines 14 and "
                           "15): ambiguous, nothing instrumented")


def test_refuses_a_phase_call_in_an_if_header(recipe):
    """``if self.draft(batch):``: no line can be put around a call in a compound statement's header."""
    src = V1_BEFORE.replace(
        "            spec_info = self.draft(batch)\n", "            if self.draft(batch):\n                pass\n"
    )
    r = _refused(src, recipe)
    assert (r.cls, r.line) == ("EAGLEWorker", 14)
    assert r.message() == (f"{PATH}:14 (EAGLEWorker): phase call self.draft(...) sits in a compound statement's "
                           "header: no line can be added around it")


def test_refuses_a_phase_call_in_an_elif_header(recipe):
    """``elif self.draft(batch):`` is a header like ``if``: refused, not ignored."""
    src = V1_BEFORE.replace(
        "        else:\n            spec_info = self.draft(batch)\n",
        "        elif self.draft(batch):\n            pass\n        else:\n            spec_info = self.draft(batch)\n",
    )
    r = _refused(src, recipe)
    assert (r.cls, r.line) == ("EAGLEWorker", 13)
    assert r.message() == (f"{PATH}:13 (EAGLEWorker): phase call self.draft(...) sits in a compound statement's "
                           "header: no line can be added around it")


def test_refuses_a_phase_call_in_a_one_line_suite(recipe):
    """``if x: self.forward_draft_extend_after_decode(batch)`` on one line: begin/end cannot be added inside it."""
    src = V1_BEFORE.replace(
        "            if batch.spec_info.verified_id is not None:\n                self.forward_draft_extend_after_decode(batch)\n",
        "            if batch.spec_info.verified_id is not None: self.forward_draft_extend_after_decode(batch)\n",
    )
    r = _refused(src, recipe)
    assert (r.cls, r.line) == ("EAGLEWorker", 16)
    assert r.message() == (f"{PATH}:16 (EAGLEWorker): phase call self.forward_draft_extend_after_decode(...) sits in "
                           "a one-line compound statement: no line can be added around it")


def test_refuses_two_phase_calls_in_one_statement(recipe):
    """``self.verify(batch, self.draft(batch))``: two phases in one statement cannot be timed apart."""
    src = V1_BEFORE.replace(
        "            spec_info = self.draft(batch)\n            logits_output, verify_output, _ = self.verify(batch, spec_info)\n",
        "            logits_output, verify_output, _ = self.verify(batch, self.draft(batch))\n",
    )
    r = _refused(src, recipe)
    assert (r.cls, r.line) == ("EAGLEWorker", 14)
    assert r.message() == (f"{PATH}:14 (EAGLEWorker): one statement holds several phase calls (self.verify, "
                           "self.draft): ambiguous")


def _python_says(source: str) -> str:
    """The refusal of a file Python will not parse, in Python's own words (its message and line)."""
    try:
        ast.parse(source)
    except SyntaxError as exc:
        return f"{PATH}{f':{exc.lineno}' if exc.lineno else ''}: does not parse ({exc.msg})"
    except (ValueError, RecursionError, MemoryError) as exc:
        return f"{PATH}: does not parse with this Python ({exc})"
    raise AssertionError("the source parses")


def test_refuses_a_file_that_does_not_parse(recipe):
    """A syntax error: refused with the file, Python's line and Python's words, nothing else attempted."""
    src = V1_BEFORE.replace("    def forward_batch_generation(self, batch):\n", "    def forward_batch_generation(self, batch)\n")
    r = _refused(src, recipe)
    assert r.line == 8 and r.message() == _python_says(src)


@pytest.mark.parametrize(
    "tail",
    ["x = '\x00'\n"] + (["type Alias = int\n"] if sys.version_info < (3, 12) else []),
    ids=["nul-byte"] + (["pep695-on-old-python"] if sys.version_info < (3, 12) else []),
)
def test_refuses_source_this_python_cannot_parse(recipe, tail):
    """Whatever the parser that rejects it, a file that does not parse is a refusal (a value), never an
    exception out of the pure core, in that parser's words."""
    r = _refused(V1_BEFORE + tail, recipe)
    assert r.message() == _python_says(V1_BEFORE + tail)


def test_refuses_both_entry_names(recipe):
    """A class defining both forward_batch_generation and forward_batch_speculative_generation: which one the
    scheduler calls depends on the release, so which to time is ambiguous."""
    src = V1_BEFORE + "\n    def forward_batch_speculative_generation(self, batch):\n        return None\n"
    r = _refused(src, recipe)
    assert r.cls == "EAGLEWorker" and r.line == 20
    assert r.message() == (f"{PATH}:20 (EAGLEWorker): both forward_batch_generation and "
                           "forward_batch_speculative_generation are defined: which is the entry?")


def test_refuses_an_async_entry_method(recipe):
    """An ``async def`` entry method is not a shape the runtime's decorator can time."""
    r = _refused(V1_BEFORE.replace("    def forward_batch_generation", "    async def forward_batch_generation"), recipe)
    assert (r.cls, r.line) == ("EAGLEWorker", 8)
    assert r.message() == f"{PATH}:8 (EAGLEWorker): forward_batch_generation is async: not a shape eaglepatch knows"


def test_refusal_line_is_a_line_of_the_file_given(recipe):
    """A patched file someone edited so that verify is gone: the refusal's line points at the entry method in
    the file as it is (the patched one: its decorator, line 10), so a person can go there."""
    edited = V1_AFTER.replace(
        "            logits_output, verify_output, _ = self.verify(batch, spec_info)\n",
        "            logits_output, verify_output, _ = self.check(batch, spec_info)\n",
    )
    r = _refused(edited, recipe)
    assert edited.splitlines()[r.line - 1].strip() == "def forward_batch_generation(self, batch):"
    assert r.message() == (f"{PATH}:10 (EAGLEWorker): phase 'verify' (self.verify(...)) not found in "
                           "forward_batch_generation: unknown layout, nothing instrumented")


def test_strip_leaves_a_marker_inside_a_string_alone():
    """A line that looks like one of ours but sits inside a string literal is the user's text: strip finds what to
    remove with the tokenizer (statements and decorators carrying the marker comment), so only the real added line
    goes."""
    src = 'x = 1\ns = """\ny = 2  # [eaglepatch]\n"""\n_eaglepatch.begin("draft", "decode")  # [eaglepatch]\n'
    assert strip(src) == 'x = 1\ns = """\ny = 2  # [eaglepatch]\n"""\n'


# ---------------------------------------------------------------------------------------------------------------
# libcst parses only the methods it scans (the entry method and the family's helpers), each with the lines around
# it that the file has: what stands before the method in its class must not change what is found or where.

_V1_METHOD = V1_BEFORE[V1_BEFORE.index("    def forward_batch_generation"):]
_V1_HEAD = V1_BEFORE[: V1_BEFORE.index("class EAGLEWorker")]

_LAYOUTS = {
    # the method first in its class, under a class header of several lines with comments in it and after it
    "first-under-a-long-header": _V1_HEAD + "@some.decorator(\n    1)\nclass EAGLEWorker(  # a comment\n"
    "    TpModelWorker,\n    metaclass=type,\n):\n    # a comment before the method\n\n" + _V1_METHOD,
    # after a docstring, an attribute of several lines, blank lines, comments, a method with a decorator
    "after-other-statements": _V1_HEAD + 'class EAGLEWorker(TpModelWorker):\n    """Doc."""\n\n    table = {\n'
    '        "a": 1,\n    }  # trailing\n\n    @staticmethod\n    def helper(x):\n        return x\n\n'
    "    # about the entry method\n" + _V1_METHOD,
    # a decorator whose expression is in parentheses on lines of its own (ast puts its line below the "@")
    "parenthesised-decorator": _V1_HEAD + "class EAGLEWorker(TpModelWorker):\n    @(\n        lambda f: f\n    )\n"
    + _V1_METHOD,
    # the entry method last in the file, without a final newline
    "no-final-newline": V1_BEFORE.rstrip("\n"),
    # a method after it, and a second definition of a helper name before it
    "methods-after": V1_BEFORE + "\n    def other(self):\n        return self.draft(None)\n",
}


@pytest.mark.parametrize("layout", sorted(_LAYOUTS))
def test_what_stands_around_the_entry_method_changes_nothing_found(recipe, layout):
    """The same entry method in other surroundings: the same lines are added, each at the same statement, the
    decorator above the method's first decorator, and the output strips back to the input."""
    src = _LAYOUTS[layout]
    res = ok(src, recipe)
    marked = [line.strip() for line in res.source.splitlines() if MARKER in line]
    assert marked == [line.strip() for line in V1_AFTER.splitlines() if MARKER in line]
    assert strip(res.source) == src
    compile(res.source, PATH, "exec", dont_inherit=True)
    out = res.source.splitlines()
    src_lines = src.splitlines()
    w = next(w for w in res.workers if w.cls == "EAGLEWorker")
    assert src_lines[w.method_start - 1].lstrip().startswith("def forward_batch_generation")
    assert src_lines[w.method_end - 1].strip() == "return logits_output, verify_output.verified_id"
    for p in w.phases:  # each phase line of the input holds its call
        assert f"self.{p.call.split('.')[-1]}(" in src_lines[p.line - 1], (p, src_lines[p.line - 1])
    for i, line in enumerate(out):  # each begin line sits right above its call, at its indentation
        if "_eaglepatch.begin(" in line:
            nxt = out[i + 1]
            assert MARKER not in nxt and nxt[: len(nxt) - len(nxt.lstrip())] == line[: len(line) - len(line.lstrip())]
    entry = out.index("    @_eaglepatch.entry  # [eaglepatch]")
    assert out[entry + 1].lstrip().startswith(("def forward_batch_generation", "@"))


def test_calls_are_found_in_source_order_as_a_visitor_finds_them(monkeypatch):
    """``tree.call_positions`` walks the nodes' fields itself: the same calls as a CSTVisitor, in the same (source) order,
    including those inside lambdas, comprehensions, nested defs and classes, each with why it may not run once
    with its statement; ``a if b else c`` in that order though its fields say b, a, c."""
    import libcst as cst

    from eaglepatch.transform import tree

    monkeypatch.setattr(tree, "_FIELDS", {})  # the fields of each node type, computed afresh for this test

    class Visitor(cst.CSTVisitor):
        def __init__(self):
            super().__init__()
            self.found = []

        def visit_Call(self, n):
            self.found.append(n)

    src = ("x = a(b(c), k=d()) if e(f) else g[h()]((lambda: i()), *j(), **k())\n"
           "y: T[m()] = [n(o) for p in q() if r()] + {s(): t() for u in v()}\n"
           "z = f'{w()!r:{x()}}' and (yield aa()) or not bb(cc := dd())\n"
           "del ee()[ff()]; assert gg(), hh()\n"
           "with ii() as jj, kk(): pass\n"
           "@dec(xx())\ndef ll(a=yy(), /, p=mm(), *q, r=zz()) -> ww():\n    return nn()\n"
           "class oo(pp()):\n    qq = rr()\n")
    module = cst.parse_module(src)
    found = []
    for stmt in module.body:
        v = Visitor()
        stmt.visit(v)
        ours = tree.call_positions(stmt, frozenset(), frozenset()).calls
        assert [id(c) for c, _why in ours] == [id(c) for c in v.found]
        found += [(module.code_for_node(c.func), why) for c, why in ours]
    names = [n for n, _why in found]
    assert names[:5] == ["a", "b", "d", "e", "g[h()]"]
    why = dict(found)
    assert why["e"] is None and why["b"] and "conditional" in why["b"] and "conditional" in why["i"]
    assert "lambda" not in why["i"]  # the outermost reason wins: the lambda sits in the else branch
    assert "annotation" in why["m"] and "comprehension" in why["n"] and "comprehension" in why["q"]
    assert "f-string" in why["w"] and why["bb"] and "'and'/'or'" in why["bb"]
    assert why["ee"] is None and why["ii"] is None
    assert "default argument" in why["mm"] and "defined in the method" in why["nn"]
    assert "defined in the method" in why["pp"] and "defined in the method" in why["rr"]
