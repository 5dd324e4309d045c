"""A channel's ``fileno()`` pipe and a close that races the transport thread (``hosts.paramiko_import._LockedPipe``).

The CI run of 2026-12-04 lost a whole SSH connection ("Bad file descriptor (9)" in paramiko's transport thread) when
the client refused a host's 100 MB flood and closed its channel while data for it was still arriving: paramiko's
``PosixPipe.set`` checks ``_closed`` and then writes, with no lock against ``close``.
"""

from __future__ import annotations

import os
import threading

import pytest

from eaglepatch.hosts.paramiko_import import paramiko

pytestmark = pytest.mark.skipif(os.name != "posix", reason="the pipe of a POSIX client")


def test_a_channels_pipe_is_the_locked_one():
    chan = paramiko.Channel(1)
    try:
        fd = chan.fileno()
        os.fstat(fd)
        pipe = chan._pipe
        assert type(pipe).__name__ == "_LockedPipe"
    finally:
        chan.close()
    assert pipe._closed
    pipe.set()  # the transport's data, after the close: nothing, no error
    pipe.clear()


def test_a_set_while_the_pipe_closes_waits_and_then_does_nothing(monkeypatch):
    """The interleaving that killed the transport, made certain: the transport thread's ``set`` runs while ``close``
    is between its first and second ``os.close``. paramiko's own pipe writes to the closed read end's partner (or a
    closed descriptor) and raises in that thread; the locked one waits for the close and then does nothing."""
    chan = paramiko.Channel(1)
    chan.fileno()
    pipe = chan._pipe
    errors: list[BaseException] = []
    setter: list[threading.Thread] = []
    real_close = os.close

    def transport_feeds() -> None:
        try:
            pipe.set()
        except BaseException as exc:  # noqa: BLE001 - what the transport thread would die of
            errors.append(exc)

    def close_midway(fd: int) -> None:
        real_close(fd)
        if not setter:  # after the first of the two closes: the transport's data arrives now
            t = threading.Thread(target=transport_feeds)
            setter.append(t)
            t.start()
            t.join(0.5)

    monkeypatch.setattr(os, "close", close_midway)
    chan.close()
    monkeypatch.setattr(os, "close", real_close)
    setter[0].join(5)
    assert not setter[0].is_alive()
    assert errors == [], errors
    assert pipe._closed and not pipe._set
