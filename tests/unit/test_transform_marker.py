"""The marker comment cannot collide with the user's code, and a BOM stays where it is.

eaglepatch recognises its lines by their shape (the import, ``@_eaglepatch.entry``, ``begin``/``end``/``accepted``,
two spaces, ``# [eaglepatch]``), each a statement of its own. A line of the user's that merely ends with the marker
comment is never removed by strip, revert or a re-instrument; a file holding one is refused, since eaglepatch
could not tell its lines apart from it later. The same cases on real release files are in test_transform_real.py.
"""

from __future__ import annotations

import pytest

from eaglepatch.transform.engine import analyze, instrument, strip
from eaglepatch.transform.marks import OUR_LINE, is_instrumented, split_lines, strip_lines
from eaglepatch.transform.results import Instrumented, Refused
from transform_cases import V1_AFTER, V1_BEFORE

PATH = "sglang/srt/speculative/w.py"
BOM = "\ufeff"
USER_LINE = "x = compute()  # [eaglepatch]\n"
NOT_OURS = ("this line ends with '# [eaglepatch]', the comment eaglepatch puts on the lines it adds, but it is not a "
            "line eaglepatch writes: eaglepatch could not tell its own lines from it; change that comment")


# ---------------------------------------------------------------------------------------------------------------
# The shapes eaglepatch writes


@pytest.mark.parametrize("line", [
    "from . import _eaglepatch_runtime as _eaglepatch  # [eaglepatch]\n",
    "    @_eaglepatch.entry  # [eaglepatch]\n",
    '\t\t_eaglepatch.begin("draft", "decode")  # [eaglepatch]\r\n',
    '        _eaglepatch.begin("target", "prefill")  # [eaglepatch]\r',
    '        _eaglepatch.end("draft_extend")  # [eaglepatch]',
    '        _eaglepatch.accepted(verify_output, ("accept_length_per_req_cpu", "num_correct_drafts_per_req_cpu",), 1)'
    "  # [eaglepatch]\n",
    '        _eaglepatch.accepted(batch_output, ("accept_lens",), 0)  # [eaglepatch]\n',
    "        _eaglepatch.accepted(accept_lens, (), 0)  # [eaglepatch]\n",
])
def test_every_shape_eaglepatch_writes_is_ours(line):
    """The lines instrument writes (any indentation and line end) match OUR_LINE: strip removes them."""
    assert OUR_LINE.match(line)


@pytest.mark.parametrize("line", [
    USER_LINE,
    "    # [eaglepatch]\n",
    "import torch  # [eaglepatch]\n",
    "    from . import _eaglepatch_runtime as _eaglepatch  # [eaglepatch]\n",  # the import is never indented
    '        _eaglepatch.begin("draft", "both")  # [eaglepatch]\n',
    '        _eaglepatch.begin("draft")  # [eaglepatch]\n',
    '        _eaglepatch.end("draft") # [eaglepatch]\n',  # one space: eaglepatch writes two
    '        _eaglepatch.end("dra ft")  # [eaglepatch]\n',
    '        _eaglepatch.accepted(x, ("a", ), 1)  # [eaglepatch]\n',
    '        _eaglepatch.accepted(x.y, (), 1)  # [eaglepatch]\n',
    '        _eaglepatch.end("draft")  # [eaglepatch] and more\n',
    '        y = 1; _eaglepatch.end("draft")  # [eaglepatch]\n',
])
def test_a_line_of_another_shape_is_not_ours(line):
    """Anything eaglepatch does not write, even ending with the marker, is not ours: strip keeps it."""
    assert not OUR_LINE.match(line)


# ---------------------------------------------------------------------------------------------------------------
# A user's line ending with the marker


def test_strip_keeps_a_users_line_that_ends_with_the_marker():
    """Before, every line ending with the marker was deleted: the user's ``x = compute()  # [eaglepatch]`` went
    with it. strip, strip_lines (revert) and is_instrumented only know eaglepatch's shapes."""
    src = V1_BEFORE + USER_LINE
    assert strip(src) == src
    assert strip_lines(src) == src
    assert not is_instrumented(src)
    patched = V1_AFTER + USER_LINE
    assert strip(patched) == src and strip_lines(patched) == src


@pytest.mark.parametrize("where", ["top", "method", "end"])
def test_instrument_refuses_a_file_with_a_users_marked_line(recipe, where):
    """A user's marked line anywhere: refused with the line and a reason; never patched (strip could not later
    tell the user's line from ours if its shape were ours, and a look-alike must not be mistaken either way)."""
    if where == "top":
        src = V1_BEFORE.replace("import torch\n", "import torch  # [eaglepatch]\n")
        line = 2
    elif where == "method":
        src = V1_BEFORE.replace("            return logits_output, next_token_ids\n",
                                "            return logits_output, next_token_ids  # [eaglepatch]\n")
        line = 12
    else:
        src = V1_BEFORE + USER_LINE
        line = len(split_lines(src))
    for fn in (instrument, analyze):
        res = fn(src, PATH, recipe)
        assert isinstance(res, Refused), res
        assert res.message() == f"{PATH}:{line}: {NOT_OURS}"


def test_instrument_refuses_a_patched_file_with_a_users_marked_line(recipe):
    """The same line in a file eaglepatch did patch: still refused (apply again would keep the user's line, but
    revert by text could not be told it is the user's)."""
    res = instrument(V1_AFTER.replace("import torch\n", "import torch  # [eaglepatch]\n"), PATH, recipe)
    assert isinstance(res, Refused) and res.message() == f"{PATH}:2: {NOT_OURS}"


def test_instrument_refuses_our_shapes_without_our_import(recipe):
    """Lines of our shape but no eaglepatch import line: not a file eaglepatch patched (someone copied the lines,
    or wrote them). Refused at the first such line, instead of being stripped as if ours."""
    src = V1_BEFORE.replace("            spec_info = self.draft(batch)\n",
                            '            _eaglepatch.end("draft")  # [eaglepatch]\n'
                            "            spec_info = self.draft(batch)\n")
    res = instrument(src, PATH, recipe)
    assert isinstance(res, Refused), res
    assert res.message() == (f"{PATH}:14: this file has lines marked '# [eaglepatch]' but not eaglepatch's import "
                             "line (from . import _eaglepatch_runtime as _eaglepatch): not a file eaglepatch "
                             "patched; remove the marked lines")


def test_a_marker_inside_a_string_is_kept_by_strip_and_refused_by_instrument(recipe):
    """A line of our very shape inside a triple-quoted string is text, not a statement: the tokenizer says so, and
    strip keeps it. instrument refuses the file (a text-only revert would take that line out of the string)."""
    src = V1_BEFORE + 'DOC = """\n_eaglepatch.end("draft")  # [eaglepatch]\n"""\n'
    assert strip(src) == src
    assert strip(V1_AFTER + src[len(V1_BEFORE):]) == src
    res = instrument(src, PATH, recipe)
    assert isinstance(res, Refused) and res.line == len(split_lines(V1_BEFORE)) + 2
    assert res.message() == f"{PATH}:20: {NOT_OURS}"


@pytest.mark.parametrize("tail", [
    'x = (\n    _eaglepatch.end("draft")  # [eaglepatch]\n)\n',
    'x = 1 + \\\n_eaglepatch.end("draft")  # [eaglepatch]\n',
], ids=["in-brackets", "after-backslash"])
def test_a_lookalike_inside_a_statement_is_not_stripped(tail):
    """Our shape on a line that continues someone's statement (inside brackets, after a backslash) is part of that
    statement: removing it would break the code, so strip keeps it."""
    src = V1_BEFORE + tail
    assert strip(src) == src
    assert strip(V1_AFTER + tail) == src


def test_strip_falls_back_to_the_shape_when_the_tokenizer_cannot_read_the_file():
    """An unterminated triple-quoted string at the end: the tokenizer gives up, and the shape alone decides (the
    file no longer parses anyway); our lines go, the rest stays."""
    tail = '"""never closed\n'
    assert strip(V1_AFTER + tail) == V1_BEFORE + tail


# ---------------------------------------------------------------------------------------------------------------
# BOM


def test_a_bom_file_is_instrumented_and_stripped_byte_for_byte(recipe):
    """A file starting with a UTF-8 BOM (read as text: U+FEFF first) was refused as unparsable. Now the BOM stays
    the first character, the rest is instrumented exactly as without it, and strip gives the bytes back."""
    src = BOM + V1_BEFORE
    res = instrument(src, PATH, recipe)
    assert isinstance(res, Instrumented), res
    assert res.source == BOM + V1_AFTER
    assert strip(res.source) == src
    assert strip(res.source).encode("utf-8") == src.encode("utf-8")
    assert strip_lines(res.source) == src and is_instrumented(res.source)
    again = instrument(res.source, PATH, recipe)
    assert isinstance(again, Instrumented) and again.source == res.source and not again.changed
    assert [p.line for p in res.workers[0].phases] == [p.line for p in instrument(V1_BEFORE, PATH, recipe)
                                                       .workers[0].phases]


def test_a_bom_file_without_imports_gets_the_import_after_the_bom(recipe):
    """With nothing above the class, the import line is the file's first line: it goes after the BOM, which stays
    the very first character (before it, Python would not parse the file)."""
    body = V1_BEFORE[V1_BEFORE.index("class EAGLEWorker"):]
    src = BOM + body
    res = instrument(src, PATH, recipe)
    assert isinstance(res, Instrumented), res
    assert res.source == (BOM + "from . import _eaglepatch_runtime as _eaglepatch  # [eaglepatch]\n"
                          + V1_AFTER[V1_AFTER.index("class EAGLEWorker"):])
    compile(res.source[1:], PATH, "exec")
    assert strip(res.source) == src and strip_lines(res.source) == src


def test_a_bom_file_refusal_has_its_line(recipe):
    """A refusal in a BOM file names the same line as without the BOM."""
    src = BOM + V1_BEFORE.replace("self.verify(batch, spec_info)", "self.check(batch, spec_info)")
    res = instrument(src, PATH, recipe)
    assert isinstance(res, Refused)
    assert res.message() == (f"{PATH}:8 (EAGLEWorker): phase 'verify' (self.verify(...)) not found in "
                             "forward_batch_generation: unknown layout, nothing instrumented")


@pytest.mark.parametrize("newline", ["\n", "\r"], ids=["lf", "cr"])
def test_a_marker_inside_a_string_at_the_end_of_the_file(newline):
    """A string closing on the file's last line, with no final line end, holding a line of our shape: the
    tokenizer reads the file whole (the last line as it is, a lone \r as a line end) and keeps that line."""
    tail = 'DOC = """\n_eaglepatch.end("draft")  # [eaglepatch]\n"""'.replace("\n", newline)
    src = V1_BEFORE.replace("\n", newline) + tail
    patched = V1_AFTER.replace("\n", newline) + tail
    assert strip(src) == src
    assert strip(patched) == src
