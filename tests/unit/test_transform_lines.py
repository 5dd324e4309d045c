"""Lines as Python counts them, and the output check that does not trust how lines were counted.

``str.splitlines()`` also breaks at form feed, vertical tab, ``\\x1c``-``\\x1e``, ``\\x85``, U+2028 and U+2029;
Python's tokenizer ends a line at ``\\n``, ``\\r\\n`` and ``\\r`` only. Counting lines the first way shifts every
later line by one after such a character, and the output of such a shift can still compile and strip back
exactly. So the transform, strip and the marks count lines as the tokenizer does (``split_lines``), and
``instrument`` checks its output with ``ast`` alone (``check_output``). The same cases on real release files are in
test_transform_real.py.
"""

from __future__ import annotations

import ast
import io
import tokenize

import pytest

from eaglepatch.transform import engine, finder
from eaglepatch.transform.check import check_output
from eaglepatch.transform.engine import instrument, strip
from eaglepatch.transform.marks import is_instrumented, split_lines, strip_lines
from eaglepatch.transform.results import Instrumented, Refused
from transform_cases import V1_AFTER, V1_BEFORE, read_case

PATH = "sglang/srt/speculative/w.py"
# Every character str.splitlines() breaks at that Python's tokenizer keeps inside a line.
NOT_PYTHON_BREAKS = ["\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]

# A worker whose phase statements each follow a statement at their own indentation, with a form feed in a comment
# inside the entry method: a transform counting lines with str.splitlines() puts every begin/end one statement
# early (around "a = N"), and the result still compiles and strips back byte for byte. The golden case holds what
# instrument makes of it.
SHIFTABLE_CASE = read_case("form-feed-in-a-comment-shifts-nothing")
SHIFTABLE = SHIFTABLE_CASE.before

# What a transform counting lines with str.splitlines() made of SHIFTABLE (written out by hand from that run):
# every begin/end brackets the "a = N" line before its phase statement; accepted reads batch_output before verify
# binds it. It compiles, and removing the marked lines gives back SHIFTABLE exactly.
SHIFTED = '''\
import torch
from . import _eaglepatch_runtime as _eaglepatch  # [eaglepatch]


class EAGLEWorkerV2(BaseSpecWorker):
    @_eaglepatch.entry  # [eaglepatch]
    def forward_batch_generation(self, batch, on_publish=None):
        # page\x0c
        if batch.forward_mode.is_extend():
            _eaglepatch.begin("target", "prefill")  # [eaglepatch]
            a = 1
            _eaglepatch.end("target")  # [eaglepatch]
            batch_output = self.target_worker.forward_batch_generation(batch)
            _eaglepatch.begin("draft_extend", "prefill")  # [eaglepatch]
            a = 2
            _eaglepatch.end("draft_extend")  # [eaglepatch]
            batch_output.next_draft_input = self.draft_worker._draft_extend_for_prefill(batch, batch_output)
            return batch_output
        _eaglepatch.begin("draft", "decode")  # [eaglepatch]
        a = 3
        _eaglepatch.end("draft")  # [eaglepatch]
        verify_input = self.draft_worker.draft(batch)
        _eaglepatch.begin("verify", "decode")  # [eaglepatch]
        a = 4
        _eaglepatch.end("verify")  # [eaglepatch]
        _eaglepatch.accepted(batch_output, ("accept_lens",), 0)  # [eaglepatch]
        batch_output = self.verify(batch)
        _eaglepatch.begin("draft_extend", "decode")  # [eaglepatch]
        a = 5
        _eaglepatch.end("draft_extend")  # [eaglepatch]
        self.draft_worker._draft_extend_for_decode(batch, batch_output)
        return batch_output
'''


def _python_lines(source: str) -> int:
    """How many lines Python's tokenizer sees (the last token's line)."""
    toks = list(tokenize.generate_tokens(io.StringIO(source).readline))
    return toks[-1].start[0] - (1 if toks[-1].type == tokenize.ENDMARKER and source.endswith("\n") else 0)


# ---------------------------------------------------------------------------------------------------------------
# split_lines


@pytest.mark.parametrize("ch", NOT_PYTHON_BREAKS, ids=[f"U+{ord(c):04X}" for c in NOT_PYTHON_BREAKS])
def test_split_lines_keeps_what_python_keeps_in_a_line(ch):
    """Each of these characters is a line break for str.splitlines() but not for Python: split_lines keeps it
    inside its line, so the line count is Python's (ast's line numbers agree), and joining gives back the text."""
    src = f"x = 1  # a{ch}b\ny = '{ch}'\nz = 3\n"
    assert len(src.splitlines()) > 3  # the trap
    lines = split_lines(src)
    assert lines == [f"x = 1  # a{ch}b\n", f"y = '{ch}'\n", "z = 3\n"]
    assert "".join(lines) == src
    assert [n.lineno for n in ast.parse(src).body] == [1, 2, 3]
    assert _python_lines(src) == 3


@pytest.mark.parametrize("text,expected", [
    ("", []),
    ("a", ["a"]),
    ("a\n", ["a\n"]),
    ("a\r\nb\rc\nd", ["a\r\n", "b\r", "c\n", "d"]),
    ("\n\n", ["\n", "\n"]),
    ("a\r\r\nb", ["a\r", "\r\n", "b"]),
])
def test_split_lines_breaks_at_lf_crlf_and_cr_only(text, expected):
    """\\r\\n is one line end, a lone \\r is one (as in Python), the last line may lack one, nothing is lost."""
    assert split_lines(text) == expected
    assert "".join(split_lines(text)) == text


# ---------------------------------------------------------------------------------------------------------------
# The transform, strip and the marks count Python's lines


@pytest.mark.parametrize("ch", NOT_PYTHON_BREAKS, ids=[f"U+{ord(c):04X}" for c in NOT_PYTHON_BREAKS])
def test_a_break_character_in_a_comment_inside_the_method_shifts_nothing(recipe, ch):
    """SHIFTABLE with each character in its comment: the output is the golden case's with that character (every
    begin directly above its phase statement, never above the "a = N" before it; accepted after verify), the sites
    are Python's lines, and strip gives back the bytes."""
    src = SHIFTABLE.replace("\x0c", ch)
    res = instrument(src, PATH, recipe)
    assert isinstance(res, Instrumented), res
    assert res.source == SHIFTABLE_CASE.after.replace("\x0c", ch)
    assert strip(res.source) == src and strip_lines(res.source) == src
    assert [(p.phase, p.line) for p in res.workers[0].phases] == [
        ("target", 9), ("draft_extend", 11), ("draft", 14), ("verify", 16), ("draft_extend", 18)]


def test_strip_and_marks_count_python_lines(recipe):
    """A patched file with U+2028 in a string and \\x85 in a comment: strip, strip_lines and is_instrumented see
    the marked lines as Python does and give back the original."""
    src = V1_BEFORE.replace('import torch\n', 'import torch\nS = "a\u2028b"  # c\x85d\n')
    res = instrument(src, PATH, recipe)
    assert isinstance(res, Instrumented)
    assert is_instrumented(res.source) and not is_instrumented(src)
    assert strip(res.source) == src and strip_lines(res.source) == src


def test_a_refusal_line_counts_python_lines(recipe):
    """The line of a refusal is the file's line as Python (and an editor) counts it, after a form feed too."""
    src = V1_BEFORE.replace("import torch\n", "import torch  # \x0c\n").replace(
        "            spec_info = self.draft(batch)\n", "            spec_info = self.draft(batch) if batch else None\n")
    res = instrument(src, PATH, recipe)
    assert isinstance(res, Refused), res
    assert split_lines(src)[res.line - 1].strip() == "spec_info = self.draft(batch) if batch else None"
    assert res.message() == (f"{PATH}:14 (EAGLEWorker): phase call self.draft(...) sits in a conditional expression "
                             "(a if c else b): it may not run")


# ---------------------------------------------------------------------------------------------------------------
# The output check


def test_check_output_accepts_the_right_output(recipe):
    """The real output of SHIFTABLE passes the check (it is what instrument returned)."""
    res = instrument(SHIFTABLE, PATH, recipe)
    assert isinstance(res, Instrumented)
    assert check_output(ast.parse(SHIFTABLE), res.source, res.workers) is None


def test_check_output_refuses_a_shifted_output_that_compiles_and_strips_back(recipe):
    """SHIFTED compiles and strips back to SHIFTABLE exactly, so the first two self-checks pass; ast sees that the
    begin before "a = 3" is not followed by a draft call."""
    compile(SHIFTED, PATH, "exec")
    assert strip_lines(SHIFTED) == SHIFTABLE and strip(SHIFTED) == SHIFTABLE
    res = instrument(SHIFTABLE, PATH, recipe)
    problem = check_output(ast.parse(SHIFTABLE), SHIFTED, res.workers)
    assert problem == ("begin('draft') is not followed by the statement holding its phase call", None, 19)


def test_a_shift_bug_in_the_transform_is_a_refusal_not_a_patched_file(recipe, monkeypatch):
    """The old bug put back (the finder's lines split with str.splitlines): instrument returns a Refused naming an
    internal error, not SHIFTED, though SHIFTED compiles and strips back."""

    class OldLines(finder.Finder):
        def __init__(self, *args):
            super().__init__(*args)
            self.lines = self.source.splitlines(keepends=True)

    monkeypatch.setattr(engine, "Finder", OldLines)
    res = instrument(SHIFTABLE, PATH, recipe)
    assert isinstance(res, Refused), res
    assert res.message() == (f"{PATH}:13: internal error: begin('draft') is not followed by the statement holding "
                             "its phase call; nothing instrumented")
    # The line is the input's: the statement the misplaced begin stood above ("a = 3", before the draft call).
    assert split_lines(SHIFTABLE)[res.line - 1].strip() == "a = 3"


def _swap(text: str, a: str, b: str) -> str:
    """``text`` with the whole lines ``a`` and ``b`` (adjacent, ``a`` first) exchanged."""
    assert a + b in text
    return text.replace(a + b, b + a, 1)


BEGIN_DRAFT = '            _eaglepatch.begin("draft", "decode")  # [eaglepatch]\n'
DRAFT = "            spec_info = self.draft(batch)\n"
END_DRAFT = '            _eaglepatch.end("draft")  # [eaglepatch]\n'
ACCEPTED = ('            _eaglepatch.accepted(verify_output, ("accept_length_per_req_cpu", '
            '"num_correct_drafts_per_req_cpu",), 1)  # [eaglepatch]\n')
END_VERIFY = '            _eaglepatch.end("verify")  # [eaglepatch]\n'
ENTRY = "    @_eaglepatch.entry  # [eaglepatch]\n"


@pytest.mark.parametrize("edit,what", [
    (lambda t: _swap(t, BEGIN_DRAFT, DRAFT), "not followed by the statement holding its phase call"),
    (lambda t: _swap(t, DRAFT, END_DRAFT), "not followed by the statement holding its phase call"),
    (lambda t: t.replace(END_DRAFT, "", 1), "not followed by its end"),
    (lambda t: t.replace(BEGIN_DRAFT, "", 1), "closes no begin"),
    (lambda t: t.replace(END_VERIFY + ACCEPTED, ACCEPTED + END_VERIFY), "not followed by its end"),
    (lambda t: t.replace(ENTRY, "").replace("class EAGLEWorker(", ENTRY.strip() + "\nclass EAGLEWorker("),
     "entry decorator"),
    (lambda t: t.replace(ENTRY, ""), "entry decorator"),
    (lambda t: t.replace("from . import _eaglepatch_runtime as _eaglepatch  # [eaglepatch]\n", ""), "import"),
    (lambda t: t.replace("            return logits_output, next_token_ids\n",
                         "            return logits_output, next_token_ids, 1\n"), "not the input's"),
    (lambda t: t.replace(BEGIN_DRAFT, BEGIN_DRAFT.replace('"decode"', '"prefill"')), "for no phase found"),
    (lambda t: t.replace(ACCEPTED, ACCEPTED.replace("accepted(verify_output", "accepted(spec_info")),
     "does not follow the statement binding it"),
], ids=["begin-after-call", "end-before-call", "no-end", "no-begin", "accepted-before-end", "decorator-on-class",
        "no-decorator", "no-import", "code-changed", "wrong-mode", "accepted-wrong-name"])
def test_check_output_refuses_each_misplaced_line(recipe, edit, what):
    """Each hand-made fault of V1_AFTER is found by the ast check alone, with a reason saying what is wrong."""
    res = instrument(V1_BEFORE, PATH, recipe)
    assert isinstance(res, Instrumented) and res.source == V1_AFTER
    assert check_output(ast.parse(V1_BEFORE), V1_AFTER, res.workers) is None
    bad = edit(V1_AFTER)
    assert bad != V1_AFTER
    problem = check_output(ast.parse(V1_BEFORE), bad, res.workers)
    assert problem is not None and what in problem[0], problem
