"""What marks a line as eaglepatch's own, by text alone (no libcst): recognising a patched file and removing the
marked lines are cheap, so ``revert`` and ``status`` of a file the manifest vouches for never parse it."""

from __future__ import annotations

import re

MARKER = "# [eaglepatch]"
RUNTIME_MODULE = "_eaglepatch_runtime"
# A line that eaglepatch added: code, two spaces, the marker, end of line. Used to recognise, never to find shapes.
MARKED_LINE = re.compile(r"^[ \t]*\S.*  " + re.escape(MARKER) + r"[ \t]*(\r\n|\n|\r)?$")


def strip_lines(source: str) -> str:
    """Remove every line eaglepatch marks as its own, by text alone (for files that no longer parse)."""
    return "".join(line for line in source.splitlines(keepends=True) if not MARKED_LINE.match(line))


def is_instrumented(source: str) -> bool:
    """True when the source carries any line eaglepatch added."""
    return MARKER in source and any(MARKED_LINE.match(l) for l in source.splitlines(keepends=True))
