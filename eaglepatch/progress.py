"""What each target's command has done so far, for the one line an interrupted run ends with (Ctrl-C: exit 130).

The commands say where they are (``stage(target, state)``) before each step that changes the target or waits on
it; ``eaglepatch.entry`` reads the states when Ctrl-C comes. ``cut_short(target)`` records that a request to the
target's host was cut short mid-way (its answer never read: the host may still be carrying it out), so that
nothing else is asked of that host afterwards (the lock it holds stays: the next apply or revert from this machine
takes it over, as after a crash). State only; no I/O.
"""

from __future__ import annotations

import threading

NOTHING_CHANGED = "nothing was changed"

_lock = threading.Lock()
_states: dict[str, str] = {}
_cut: set[str] = set()
_interrupted = threading.Event()


def stage(target: str, state: str) -> None:
    """Record what ``target`` looks like from now on, in a few words ("files patched, server restarting")."""
    with _lock:
        _states[target] = state


def states() -> dict[str, str]:
    """Every target a command has started on, with its last state, in the order they started."""
    with _lock:
        return dict(_states)


def mark_interrupted() -> None:
    """Ctrl-C came (the signal handler calls this before it raises)."""
    _interrupted.set()


def interrupted() -> bool:
    """Whether Ctrl-C came."""
    return _interrupted.is_set()


def cut_short(host: str) -> None:
    """A request to ``host`` was cut short: its answer was never read."""
    with _lock:
        _cut.add(host)


def was_cut(host: str) -> bool:
    """Whether a request to ``host`` was cut short (then nothing more is asked of it)."""
    with _lock:
        return host in _cut


def reset() -> None:
    """Forget everything (tests)."""
    with _lock:
        _states.clear()
        _cut.clear()
    _interrupted.clear()
