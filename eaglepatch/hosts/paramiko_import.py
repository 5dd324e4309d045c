"""paramiko, imported the way eaglepatch needs it: ``invoke`` deferred until a config asks for it.

Every module of ``eaglepatch.hosts`` that uses paramiko imports it from here (``from eaglepatch.hosts.paramiko_import
import paramiko``), so that the stand-in for ``invoke`` is in place before paramiko's first import, and paramiko's
own log stays quiet (the error reaches the user as a ``ConnectionFailed``; the log only with EAGLEPATCH_DEBUG), and
a channel's ``fileno()`` pipe is one that a close cannot race (``_LockedPipe``).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import threading
import types
from typing import Any


class _LazyInvoke(types.ModuleType):
    """Stands in for the ``invoke`` package until an attribute of it is needed, then imports it for real (and
    leaves the real one in ``sys.modules``)."""

    def __getattr__(self, name: str) -> Any:
        if sys.modules.get("invoke") is self:
            del sys.modules["invoke"]
        return getattr(importlib.import_module("invoke"), name)


def _lazy_invoke() -> None:
    """paramiko.config imports invoke at import time, only to run the ``Match exec`` lines of an SSH config; that
    import is a third of paramiko's import time. Until paramiko asks it for something (a config with ``Match exec``)
    a stand-in takes its place."""
    if "invoke" in sys.modules:
        return
    try:
        spec = importlib.util.find_spec("invoke")
    except (ImportError, ValueError):
        return
    if spec is None:
        return  # not installed: paramiko says so itself when a config needs it
    stub = _LazyInvoke("invoke")
    stub.__spec__ = spec
    sys.modules["invoke"] = stub


_lazy_invoke()

import paramiko  # noqa: E402  (after _lazy_invoke)

# paramiko logs a failed handshake from its transport thread with a traceback ("Exception (client): Error reading
# SSH protocol banner"); with no handler configured, Python's last-resort handler prints it on stderr before
# eaglepatch's own one-line error. The error reaches the user as a ConnectionFailed; the log only with
# EAGLEPATCH_DEBUG.
if not os.environ.get("EAGLEPATCH_DEBUG"):
    logging.getLogger("paramiko").addHandler(logging.NullHandler())
    logging.getLogger("paramiko").propagate = False


class _LockedPipe(paramiko.pipe.PosixPipe):
    """paramiko's ``PosixPipe`` (what ``Channel.fileno()`` makes for ``select``) with ``close``, ``set`` and
    ``clear`` under one lock. paramiko's own checks ``_closed`` and then writes, unlocked (paramiko issues #1700 and
    #2271, open): when the client closes a channel while the transport thread is still feeding it data (a host that
    floods its output, refused past a bound), the transport's ``set`` writes to a descriptor just closed; the
    transport thread dies of "Bad file descriptor" and the whole connection is lost (or, the number reused, a byte
    lands in another file). Here a ``set`` after ``close`` does nothing."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            os.close(self._rfd)
            os.close(self._wfd)

    def set(self) -> None:
        with self._lock:
            if self._set or self._closed:
                return
            self._set = True
            os.write(self._wfd, b"*")

    def clear(self) -> None:
        with self._lock:
            if not self._set or self._forever or self._closed:
                return
            os.read(self._rfd, 1)
            self._set = False


if os.name == "posix":
    paramiko.pipe.make_pipe = _LockedPipe  # paramiko.channel calls pipe.make_pipe() at each fileno(): this one

__all__ = ["paramiko"]
