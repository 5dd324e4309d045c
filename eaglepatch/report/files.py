"""Finding the timing logs: local files and folders in, the list of ``*.jsonl`` files to read out."""

from __future__ import annotations

import os
from typing import Sequence

from eaglepatch.errors import UsageError


def iter_log_files(paths: Sequence[str]) -> list[str]:
    """Expand local files and folders into the list of log files to read.

    A file is taken as given (any name). A folder contributes every ``*.jsonl`` file below it (recursively),
    sorted by path. Duplicates (the same file reached twice) are kept once, at their first place.

    Returns the list of paths. Raises ``UsageError`` when a path does not exist, or when a folder holds no
    ``*.jsonl`` file.
    """
    out: list[str] = []
    seen: set[str] = set()

    def add(p: str) -> None:
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
            for p in sorted(found):
                add(p)
        elif os.path.exists(path):
            add(path)
        else:
            raise UsageError(
                f"no such file or folder: {path}; give timing log files (*.jsonl), folders holding them, or a TARGET"
            )
    return out
