"""The transform (libcst, the largest import), imported only by what analyses or instruments files: on first
use, or on a thread of its own while the facts round trip waits on the host (the ops hold the collector off while
it runs: ``eaglepatch.collector.few_collections``). Call ``engine()`` through this module (``lazy_engine.engine()``): the benchmarks time it here."""

from __future__ import annotations

import gc
import sys
import threading
from typing import Any

_ENGINE = "eaglepatch.transform.engine"


def engine() -> Any:
    """The transform (libcst), imported on first use: ``revert`` of files the manifest vouches for never needs it."""
    from eaglepatch.transform import engine

    return engine


def preload_transform() -> None:
    """Start importing the transform (libcst: the largest import) on a thread of its own, so that it runs while
    the facts round trip waits on the host; the first use of it then waits for that import (Python's import lock),
    never imports twice."""
    if _ENGINE in sys.modules:
        return

    def load() -> None:
        try:
            engine()
        except BaseException:  # the first use imports it again and meets the error itself
            return
        # What is loaded now (libcst, typer, paramiko: modules, classes, functions) lives as long as the command;
        # the collector stops walking it on each full collection. The transform allocates trees by the ten
        # thousand, and those walks cost it about a fifth of its time (the worker files of sglang 0.5.16 in a fresh
        # process, 2026-12-01: 306-339 ms with them, 235-266 ms without).
        gc.freeze()

    threading.Thread(target=load, name="eaglepatch-import-transform").start()
