"""The cyclic garbage collector held off while a block allocates objects by the ten thousand that reference counting
frees (the transform's syntax trees, the report's decoded records): ``few_collections``."""

from __future__ import annotations

import contextlib
import gc
import threading
from typing import Any, Iterator

# The young generation's threshold inside such blocks (Python's default: 700 allocations): each young collection
# walks every object allocated since the last one, and such blocks keep thousands of them alive for a while.
# Cycles are still collected, only less often. Measured on the worker files of sglang 0.5.16 in a fresh process
# after gc.freeze (2026-12-02): the first plan_apply took 0.30-0.37 s with Python's default and 0.20 s with this
# threshold; in the CLI's own flow (bench_ssh's breakdown) the transform's time went from 0.20 s to 0.19 s, within
# that benchmark's noise.
FEW_COLLECTIONS_THRESHOLD = 50_000

_LOCK = threading.Lock()
_STATE: list[Any] = [0, None]  # blocks inside few_collections (several may run on threads), the saved threshold


@contextlib.contextmanager
def few_collections() -> Iterator[None]:
    """Raise the young generation's collection threshold for the block; the last block to end (blocks may run on
    threads of their own, as targets plan at once) puts the old one back."""
    with _LOCK:
        if _STATE[0] == 0:
            _STATE[1] = gc.get_threshold()
            gc.set_threshold(max(_STATE[1][0], FEW_COLLECTIONS_THRESHOLD), *_STATE[1][1:])
        _STATE[0] += 1
    try:
        yield
    finally:
        with _LOCK:
            _STATE[0] -= 1
            if _STATE[0] == 0:
                gc.set_threshold(*_STATE[1])
