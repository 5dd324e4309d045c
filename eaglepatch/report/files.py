"""Finding the timing logs: local files and folders in, the list of ``*.jsonl`` files to read out; and opening one
(``open_log``). Only regular files are read (docs/safety.md, "Hostile logs"): a FIFO, a device or a socket named
like a log would hang the report or never end, and a loop of symbolic links cannot be read; each is skipped with
a note naming it, and the files beside it are read."""

from __future__ import annotations

import errno
import os
import re
import stat
from typing import BinaryIO, Sequence

from eaglepatch.errors import UsageError
from eaglepatch.redact import shown

_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "no regular file")


def not_regular(path: str) -> str | None:
    """Why ``path`` is no log to open: ``"a FIFO (named pipe)"``, ``"a character device"``, ..., ``"a loop of
    symbolic links"``; ``None`` for a regular file (or a symbolic link to one). Raises ``OSError`` where ``stat``
    fails otherwise (no such file, no permission)."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "a loop of symbolic links"
        raise
    return None if stat.S_ISREG(mode) else _kind(mode)


def skip_note(path: str, why: str) -> str:
    """The note that says a log file was skipped, and why."""
    return f"note: skipped {shown(path)}: {why}, not a log file to read"


def open_log(path: str) -> tuple[BinaryIO | None, str]:
    """``(file, "")``: ``path`` opened for reading in binary mode (by ``open``, which ``eaglepatch.ops.follow``
    replaces in its child); or ``(None, why)`` where it is no regular file (``not_regular``), looked at before it is
    opened (opening a FIFO waits for a writer; opening a device can do something) and, where it has a descriptor,
    after (what was put in its place meanwhile). A path that does not exist yet is opened all the same (a file a
    fetch is still to bring, in ``ops.follow``; elsewhere ``open`` raises). Raises ``OSError`` otherwise."""
    try:
        why = not_regular(path)
    except FileNotFoundError:
        why = None
    if why is not None:
        return None, why
    f = open(path, "rb")
    try:
        mode = os.fstat(f.fileno()).st_mode
    except (OSError, ValueError):  # no descriptor (io.UnsupportedOperation is both)
        return f, ""
    if not stat.S_ISREG(mode):
        f.close()
        return None, _kind(mode)
    return f, ""


_FIRST_OF_CHAIN = re.compile(r"(-rank[0-9]+)\.jsonl$")


def log_order(path: str) -> str:
    """The sort key of a log file: its path, with a chain's first file (``<host>-<pid>-rank<r>.jsonl``) before the
    files the runtime went on to past ``--max-log-mb`` (``...-rank<r>.000001.jsonl``, ...), as it wrote them."""
    return _FIRST_OF_CHAIN.sub(r"\1.000000.jsonl", path)


def iter_log_files(paths: Sequence[str], notes: list[str] | None = None) -> list[str]:
    """Expand local files and folders into the list of log files to read.

    A file is taken as given (any name). A folder contributes every ``*.jsonl`` file below it (recursively),
    sorted by path (a chain's files in the order written: ``log_order``). Duplicates (the same file reached twice) are kept once, at their first place. What is no
    regular file (a FIFO, a device, a socket, a loop of symbolic links, a link to nothing in a folder) is left
    out, with a note for each in ``notes`` where given.

    Returns the list of paths. Raises ``UsageError`` when a path does not exist, or when a folder holds no
    ``*.jsonl`` file.
    """
    out: list[str] = []
    seen: set[str] = set()

    def add(p: str) -> None:
        try:
            why = not_regular(p)
        except OSError as exc:  # a link to nothing (in a folder: a path given that is none fails above)
            why = exc.strerror or "cannot be read"
        if why is not None:
            if notes is not None:
                notes.append(skip_note(p, why))
            return
        real = os.path.realpath(p)
        if real not in seen:
            seen.add(real)
            out.append(p)

    for path in paths:
        if os.path.isdir(path):
            found: list[str] = []
            for root, dirs, names in os.walk(path):
                dirs.sort()
                for name in names:
                    if name.endswith(".jsonl"):
                        found.append(os.path.join(root, name))
            if not found:
                raise UsageError(
                    f"no *.jsonl timing logs in {path}: apply the patch, send the server some requests, "
                    "then report on its log dir (default /tmp/eaglepatch)"
                )
            for p in sorted(found, key=log_order):
                add(p)
        elif os.path.lexists(path) and (os.path.exists(path) or _loops(path)):
            add(path)
        else:
            raise UsageError(
                f"no such file or folder: {path}; give timing log files (*.jsonl), folders holding them, or a TARGET"
            )
    return out


def _loops(path: str) -> bool:
    """Whether ``path`` is a loop of symbolic links (``os.path.exists`` says False for one)."""
    try:
        os.stat(path)
    except OSError as exc:
        return exc.errno == errno.ELOOP
    return False
