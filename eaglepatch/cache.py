"""Where eaglepatch keeps what it caches on the client: ``$XDG_CACHE_HOME/eaglepatch``, else
``~/.cache/eaglepatch`` (fetched timing logs, sweeps' state, the transform's results)."""

from __future__ import annotations

import os
import pathlib


def cache_root() -> pathlib.Path:
    """The client's cache folder for eaglepatch (not created here)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "eaglepatch"
