"""Whole lines on stderr: each message is one write of its text and its newline, under one lock.

Several targets run on threads of their own, and Ctrl-C's message is written by the main thread while they may be
printing: ``print`` writes a text and its newline in two calls, so a line cut between them ran into the next one
("...originals in X" + "eaglepatch: interrupted: ..."). Every message of eaglepatch's goes through ``line``.
"""

from __future__ import annotations

import sys
import threading

_lock = threading.Lock()


def line(text: str) -> None:
    """Write ``text`` and a newline to stderr in one write, and flush."""
    data = text if text.endswith("\n") else text + "\n"
    with _lock:
        sys.stderr.write(data)
        sys.stderr.flush()


def last_lines(text: str, wait_s: float = 1.0) -> None:
    """Write ``text`` (whole lines) when no other line is being written, waiting at most ``wait_s`` for one that
    is (a thread stuck in a write to a full pipe must not keep an interrupted run from ending); errors writing are
    ignored: the process ends right after."""
    got = _lock.acquire(timeout=wait_s)
    try:
        sys.stderr.write(text)
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    finally:
        if got:
            _lock.release()
