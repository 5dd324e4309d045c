"""A timing log's lines in bounded pieces (docs/safety.md, "Hostile logs"): a file is read ``piece`` bytes at a
time, and a line longer than ``LINE_CAP`` bytes (``eaglepatch.report.record``; the runtime's records are a few
KB) is skipped without ever being held whole: once the part of it read so far passes the cap it is dropped, and
the bytes up to its newline are read and dropped too. Such a line counts as a skipped line. Both of the scan's
readers take their lines from here, so that both skip the same lines: the batch path (``eaglepatch.report.batch``)
the blocks of whole lines (``blocks``), the line loop (``eaglepatch.report.lines``) the lines as text
(``text_lines``: what iterating the file opened in text mode, UTF-8 with errors replaced, would give).
"""

from __future__ import annotations

from typing import Any, Iterator

from eaglepatch.report import record

PIECE = 1 << 16  # bytes read at a time by the line loop's reader
# What the line loop reads in place of a line skipped unread: no JSON, no header, no blank; a skipped line.
TOO_LONG = "\0 a line longer than the cap, skipped unread \0"


def blocks(f: Any, piece: int, cap: int | None = None) -> Iterator[tuple[bytes | None, int]]:
    """``(data, end)`` for each block of whole lines of the binary file ``f``: ``data[:end]``, each line ending
    with a newline but for the file's last; and ``(None, 0)`` in the place of each line longer than ``cap`` bytes
    (default ``record.LINE_CAP``; its newline not counted), skipped. Reads ``piece`` bytes at a time (at most
    ``cap``: a line longer than the cap then spans pieces, and is measured where it ends) and holds at most ``cap``
    bytes of a line besides the piece being read."""
    cap = record.LINE_CAP if cap is None else cap
    piece = max(1, min(piece, cap))
    rest: list[bytes] = []  # the start of a line that the pieces read so far do not end
    size = 0  # its bytes
    dropping = False  # within a line over the cap: drop what comes up to its newline
    while True:
        data = f.read(piece)
        if not data:
            break
        start = 0
        if dropping:
            nl = data.find(b"\n")
            if nl < 0:
                continue
            dropping = False
            yield None, 0
            start = nl + 1
        cut = data.rfind(b"\n", start) + 1
        if not cut:
            size += len(data) - start
            if size > cap:
                rest = []
                size = 0
                dropping = True
            else:
                rest.append(data[start:] if start else data)
            continue
        if rest:
            nl = data.find(b"\n", start)
            if size + nl - start > cap:  # the line that the pieces before began ends here, over the cap
                rest = []
                yield None, 0
                start = nl + 1
            else:
                rest.append(data[start:] if start else data)
                data = b"".join(rest)
                cut += size - start
                start = 0
        elif start:
            data = data[start:]
            cut -= start
            start = 0
        if start:  # a long line dropped: the lines after it in this piece
            data = data[start:]
            cut -= start
        rest = [data[cut:]] if cut < len(data) else []
        size = len(data) - cut
        if cut:
            yield data, cut
    if dropping:
        yield None, 0  # the file's last line, over the cap, without a newline
    elif rest:
        data = b"".join(rest)
        yield data, len(data)


def text_lines(f: Any, piece: int = PIECE) -> Iterator[str]:
    """The lines of the binary file ``f`` as text (``blocks``), as iterating it opened in text mode would give them
    (UTF-8, errors replaced, universal newlines: ``\\r``, ``\\n`` and ``\\r\\n`` end a line), without their line
    ends; ``TOO_LONG`` in the place of a line over the cap."""
    for data, end in blocks(f, piece):
        if data is None:
            yield TOO_LONG
            continue
        # a block ends at a newline: no UTF-8 sequence or \r\n is cut in two
        text = (data if end == len(data) else data[:end]).decode("utf-8", "replace")
        if "\r" in text:
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        lines = text.split("\n")
        if not lines[-1]:
            lines.pop()  # the block's last newline
        yield from lines
