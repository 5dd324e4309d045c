"""Where eaglepatch keeps what it caches on the client: ``$XDG_CACHE_HOME/eaglepatch``, else
``~/.cache/eaglepatch`` (fetched timing logs, sweeps' state, the transform's results)."""

from __future__ import annotations

import json
import os
import pathlib
import tempfile
from typing import Any


def cache_root() -> pathlib.Path:
    """The client's cache folder for eaglepatch (not created here)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "eaglepatch"


def write_json(path: str | os.PathLike[str], doc: Any) -> None:
    """``doc`` as JSON at ``path``, whole or not at all: written beside it and renamed into place, its folder made
    (0700) if missing. Raises ``OSError``: a caller whose cache cannot be written goes on without it."""
    folder = os.path.dirname(os.fspath(path))
    os.makedirs(folder, mode=0o700, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(doc, fh)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
