"""The pure core: a worker module's source text in, a result value out. No files, no SSH, no printing.

``instrument(source, path, recipe)`` finds each recipe class's entry method and phase calls by their shape (libcst)
and returns ``Instrumented`` (new text plus what it found), ``NotApplicable`` (no class of the recipe in this file)
or ``Refused`` (the reason, with file, class and line). ``strip(source)`` removes what ``instrument`` added.

What the patch adds is only whole lines, each ending with ``MARKER``: the runtime import, a decorator on the entry
method, ``begin``/``end`` lines around each phase statement and an ``accepted`` line after the verify statement.
So removing the marked lines gives back the original bytes, and ``git diff`` of a patched file shows only ``+``.
Lines are counted as Python counts them (``marks.split_lines``), never with ``str.splitlines``.

What to add is found by ``finder.Finder`` (reading each method's tree with ``tree``); rendering, stripping and the
line bookkeeping between the file as given and the stripped text are here. Before returning, ``instrument`` checks
its own output three ways: it compiles; stripping it gives back the input; and ``check.check_output`` reads it with
``ast`` alone. The result types live in ``results`` (no libcst; re-exported here for callers that hold only this
module). Importing this module pulls in libcst (through ``finder``): ops imports it on first use, on a thread of its
own, and ``revert`` of files the manifest vouches for never does.
"""

from __future__ import annotations

import ast
import tokenize
from typing import Sequence

from eaglepatch.transform.check import check_output
from eaglepatch.transform.finder import Finder, Insert, Refusal
from eaglepatch.transform.marks import BOM, IMPORT_CODE, MARKED_LINE, MARKER, OUR_LINE, split_lines, strip_lines
from eaglepatch.transform.recipe import Recipe
from eaglepatch.transform.results import Instrumented, NotApplicable, Refused, TransformResult

__all__ = ["Instrumented", "NotApplicable", "Refused", "TransformResult", "analyze", "instrument", "strip"]


# ----------------------------------------------------------------------------------------------------------------
# Rendering and stripping


def _newline_of(line: str) -> str:
    """The line end of ``line``. (Every line an added line copies ends with one: the ``def`` line, the first line
    of a statement checked by ``_statement_lines``, an import that a class follows.)"""
    return "\r\n" if line.endswith("\r\n") else "\r" if line.endswith("\r") else "\n"


def _render(lines: Sequence[str], inserts: list[Insert]) -> str:
    by_pos: dict[int, list[Insert]] = {}
    for ins in inserts:
        by_pos.setdefault(ins.after_line, []).append(ins)
    out: list[str] = []

    def emit(pos: int) -> None:
        for ins in by_pos.get(pos, ()):
            anchor = lines[ins.anchor_line]
            indent = anchor[: len(anchor) - len(anchor.lstrip(" \t"))] if ins.indented else ""
            out.append(f"{indent}{ins.code}  {MARKER}{_newline_of(anchor)}")

    emit(-1)
    for i, line in enumerate(lines):
        out.append(line)
        emit(i)
    return "".join(out)


def strip(source: str) -> str:
    """Remove what ``instrument`` added and return the rest byte for byte (a leading BOM stays first).

    A line is removed when it has exactly the shape of a line eaglepatch writes (``marks.OUR_LINE``) and Python's
    tokenizer agrees that it is a statement or decorator of its own ending with the marker comment: a marker
    inside a string, or a look-alike line inside brackets or after a backslash, stays. A user's line that merely
    ends with the marker is never removed. When the tokenizer cannot read the file, the shape alone decides.
    """
    bom = BOM if source.startswith(BOM) else ""
    return bom + _strip(source[len(bom):])[0]


def _strip(source: str) -> tuple[str, list[int]]:
    """``strip(source)`` (no BOM), and for each line of it (0-based) the 0-based line of ``source`` it comes from."""
    lines = split_lines(source)
    drop = _ours(lines)
    kept = [i for i in range(len(lines)) if i not in drop]
    return "".join(lines[i] for i in kept), kept


def _ours(lines: list[str]) -> set[int]:
    """The 0-based lines (Python's lines, ``split_lines``) that eaglepatch added: see ``strip``."""
    by_shape = {i for i, line in enumerate(lines) if MARKER in line and OUR_LINE.match(line)}
    if not by_shape:
        return by_shape
    real = _marker_statements(lines)
    return by_shape if real is None else by_shape & real


def _marker_statements(lines: list[str]) -> set[int] | None:
    """0-based lines that hold a whole logical line ending in a comment (``x = 1  # c``, not a line inside brackets
    or after a backslash, not text inside a string); None when the tokenizer cannot read the text. (``_ours``
    keeps those of eaglepatch's shape, whose comment is then the marker.) Lines are given to the tokenizer ending
    in ``\n``: a lone ``\r`` ends a line in Python, but the tokenize module of 3.11 reads it as an error token;
    columns and line numbers stay the same."""
    norm = iter([line[:-1] + "\n" if line.endswith("\r") else line for line in lines])
    out: set[int] = set()
    starts: set[int] = set()  # lines where a logical line starts
    at_start = True  # the next significant token starts a logical line
    comment = 0  # the line of the last comment
    try:
        for tok in tokenize.generate_tokens(lambda: next(norm, "")):
            kind, line = tok.type, tok.start[0]
            if kind == tokenize.NEWLINE:  # a logical line ends: with a comment on its own last line?
                if comment == line and line in starts:
                    out.add(line - 1)
                at_start = True
            elif kind == tokenize.COMMENT:
                comment = line
            elif kind not in (tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
                if at_start:
                    starts.add(line)
                at_start = False
    except Exception:  # tokenize.TokenError, SyntaxError (3.12+), IndentationError: the shape alone decides
        return None
    return out


def _foreign(lines: list[str], ours: set[int]) -> int | None:
    """The first 0-based line that ends with the marker comment but is not one eaglepatch added, else None."""
    for i, line in enumerate(lines):
        if i not in ours and MARKER in line and MARKED_LINE.search(line):
            return i
    return None


# ----------------------------------------------------------------------------------------------------------------
# Instrumenting


def analyze(source: str, path: str, recipe: Recipe) -> TransformResult:
    """What ``instrument`` would find, with lines of ``source`` as given (patched or not)."""
    return _instrument(source, path, recipe, render=False)


def instrument(source: str, path: str, recipe: Recipe) -> TransformResult:
    """Instrument every recipe class in ``source``; see the module docstring for the result values.

    An already instrumented file is first stripped, so instrumenting twice equals instrumenting once, and a file
    patched by an older recipe is brought up to date. A file holding a line that ends with the marker comment
    but is not one eaglepatch writes, or with marked lines but without eaglepatch's import line, is refused:
    eaglepatch could not tell its own lines from the user's.
    """
    return _instrument(source, path, recipe, render=True)


def _source_line(line: int | None, kept: list[int] | None) -> int | None:
    """A 1-based line of the stripped text as the 1-based line of the file given (``kept`` from ``_strip``). A
    line past the stripped text's end (a parse error at its end) is as far past the last line kept."""
    if line is None or kept is None or line < 1:
        return line
    if line <= len(kept):
        return kept[line - 1] + 1
    return kept[-1] + 1 + line - len(kept)


def _input_line(new: str, line: int | None, kept: list[int] | None) -> int | None:
    """A 1-based line of the instrumented text ``new`` as a line of the file given: the original line it is, or
    the next one when it is a line eaglepatch added."""
    if line is None:
        return None
    added = _ours(split_lines(new))
    original = sum(1 for i in range(line - 1) if i not in added) + 1
    return _source_line(original, kept)


def _instrument(source: str, path: str, recipe: Recipe, render: bool) -> TransformResult:
    bom = BOM if source.startswith(BOM) else ""  # kept first; the rest is worked on without it
    text = source[len(bom):]
    lines = split_lines(text)
    ours = _ours(lines)
    alien = _foreign(lines, ours)
    if alien is not None:
        return Refused(path, f"this line ends with {MARKER!r}, the comment eaglepatch puts on the lines it adds, "
                       "but it is not a line eaglepatch writes: eaglepatch could not tell its own lines from it; "
                       "change that comment", None, alien + 1)
    if ours and not any(lines[i].startswith(IMPORT_CODE) for i in ours):
        return Refused(path, f"this file has lines marked {MARKER!r} but not eaglepatch's import line "
                       f"({IMPORT_CODE}): not a file eaglepatch patched; remove the marked lines", None,
                       min(ours) + 1)
    was_patched = bool(ours)
    kept: list[int] | None = None  # stripped line -> line of ``text`` (0-based), when stripped
    original = text
    if render:  # instrument works on the original: a patched file is stripped first
        original, kept = _strip(text)
    try:
        finder = Finder(original, path, recipe)
        workers = finder.run()
    except Refusal as r:
        if was_patched and r.reason.startswith("does not parse ("):
            try:  # Python's own words about the file as given ("... on line N" are its lines)
                ast.parse(text)
            except SyntaxError as exc:
                return Refused(path, f"does not parse ({exc.msg})", None, exc.lineno)
            return Refused(path, f"once eaglepatch's lines are taken out, the file {r.reason} (the line it names is "
                           "one of that text)", None, _source_line(r.line, kept))
        return Refused(path, r.reason, r.cls, _source_line(r.line, kept))
    supported = [w for w in workers if w.status == "supported"]
    if not supported:
        if workers:
            reasons = "; ".join(f"{w.cls}: {w.reason}" for w in workers)
            return NotApplicable(path, reasons, tuple(workers))
        return NotApplicable(path, "no speculative worker class of the recipe in this file", ())
    if not render:
        return Instrumented(path, source, tuple(workers), tuple(finder.warnings), False, was_patched)
    inserts = finder.inserts + [finder.import_insert()]
    new = _render(finder.lines, inserts)
    # Check our own output before anyone writes it (Black's habit): it compiles, it strips back to the input, and
    # what ast reads in it is the input with exactly the statements we meant, where we meant them.
    try:  # parsed once: compiled from its tree (the compiler's own checks), then that tree is checked
        new_tree = ast.parse(new, path)
        compile(new_tree, path, "exec", dont_inherit=True)
    except SyntaxError as exc:
        return Refused(path, f"internal error: the instrumented file does not compile ({exc.msg})", None, exc.lineno)
    except (ValueError, RecursionError, MemoryError) as exc:
        return Refused(path, f"internal error: the instrumented file does not compile ({exc})")
    if strip_lines(new) != original:
        return Refused(path, "internal error: removing the added lines would not give back the original")
    problem = check_output(finder.tree, new_tree, workers)
    if problem is not None:
        return Refused(path, f"internal error: {problem[0]}; nothing instrumented", problem[1],
                       _input_line(new, problem[2], kept))
    return Instrumented(path, bom + new, tuple(workers), tuple(finder.warnings), bom + new != source, was_patched)


