"""What marks a line as eaglepatch's own, by text alone (no libcst): recognising a patched file and removing the
marked lines are cheap, so ``revert`` and ``status`` of a file the manifest vouches for never parse it.

Lines are counted as Python's tokenizer counts them: a line ends at ``\\n``, ``\\r\\n`` or ``\\r`` only.
``str.splitlines()`` also breaks at form feed, vertical tab, ``\\x1c``-``\\x1e``, ``\\x85``, U+2028 and U+2029,
which Python keeps inside a line (in a comment, a string, as whitespace): one of them shifts every later line.

A line is eaglepatch's only when it has exactly one of the shapes eaglepatch writes (``OUR_LINE``): the runtime
import, the entry decorator, ``begin``/``end``/``accepted``, each followed by two spaces and ``MARKER``. A line of
the user's that merely ends with the marker comment is not ours: it is never removed.
"""

from __future__ import annotations

import re

MARKER = "# [eaglepatch]"
RUNTIME_MODULE = "_eaglepatch_runtime"
ALIAS = "_eaglepatch"
IMPORT_CODE = f"from . import {RUNTIME_MODULE} as {ALIAS}"
BOM = "\ufeff"

# One line as Python's tokenizer counts lines: up to and including \r\n, \n or \r; the last may lack one.
_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")
# A name eaglepatch writes into a line: a phase, a local variable, an attribute (the recipe checks its names).
NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_SHAPES = (
    re.escape(IMPORT_CODE),  # at the top level, never indented
    rf"[ \t]*@{ALIAS}\.entry",
    rf'[ \t]*{ALIAS}\.begin\("{NAME}", "(?:prefill|decode)"\)',
    rf'[ \t]*{ALIAS}\.end\("{NAME}"\)',
    rf'[ \t]*{ALIAS}\.accepted\({NAME}, \((?:(?:"{NAME}", )*"{NAME}",)?\), -?[0-9]+\)',
)
# A line eaglepatch added: one of its shapes, two spaces, the marker, the line's end.
OUR_LINE = re.compile(r"(?:" + "|".join(_SHAPES) + r")  " + re.escape(MARKER) + r"(?:\r\n|\r|\n)?\Z")
# Any line that ends with the marker comment (ours or not).
MARKED_LINE = re.compile(re.escape(MARKER) + r"[ \t]*(?:\r\n|\r|\n)?\Z")


def split_lines(source: str) -> list[str]:
    """``source`` cut into lines as Python counts them (``\\n``, ``\\r\\n``, ``\\r``), each with its line end;
    ``"".join(split_lines(s)) == s``."""
    return _LINE.findall(source)


def strip_lines(source: str) -> str:
    """Remove every line that has the shape of a line eaglepatch adds, by text alone (for files that no longer
    parse, and for ``revert`` when the backup's checksum proves the result). A leading BOM stays first."""
    bom = BOM if source.startswith(BOM) else ""
    return bom + "".join(line for line in split_lines(source[len(bom):]) if not OUR_LINE.match(line))


def is_instrumented(source: str) -> bool:
    """True when the source carries any line with the shape of a line eaglepatch adds."""
    if MARKER not in source:
        return False
    return any(OUR_LINE.match(line) for line in split_lines(source[1:] if source.startswith(BOM) else source))
