"""A long-lived command on its own SSH channel (``SSHHost.spawn``): what ``Agents`` talks to.

stdout is read on demand, stdin written in chunks, stderr kept (its tail); a lost connection is a
``ConnectionFailed``, a deadline passed is ``None``/``False``/status 124, as the ``Host`` protocol says.
"""

from __future__ import annotations

import select
import socket
import time
from typing import Protocol

from eaglepatch.hosts.paramiko_import import paramiko
from paramiko.ssh_exception import SSHException

from eaglepatch.errors import ConnectionFailed
from eaglepatch.hosts.base import MAX_STDERR

_CHUNK = 1 << 15


class SpawnedBy(Protocol):
    """What an ``SSHProcess`` needs of the ``SSHHost`` that started it."""

    def _lost(self, exc: BaseException | None = None) -> ConnectionFailed: ...

    def _exec(
        self, command: str, stdin: bytes | None, deadline: float | None, limit: int | None = None
    ) -> tuple[int, bytearray, bytearray, bool]: ...


class SSHProcess:
    """``SSHHost.spawn``: one session channel running a command; stdout read on demand, stderr kept."""

    def __init__(self, host: SpawnedBy, chan: paramiko.Channel, transport: paramiko.Transport):
        self.host, self.chan, self.transport = host, chan, transport
        self.err = bytearray()
        chan.fileno()  # turns on the pipe that select() watches (readable on stdout, stderr or EOF)

    def _check(self, exc: BaseException | None = None) -> None:
        if not self.transport.is_active():
            raise self.host._lost(exc)

    def send(self, data: bytes, deadline: float | None) -> bool:
        view = memoryview(data)
        try:
            for i in range(0, len(view), _CHUNK):
                wait = None if deadline is None else max(0.01, deadline - time.monotonic())
                self.chan.settimeout(wait)
                self.chan.sendall(view[i : i + _CHUNK])
            return True
        except socket.timeout:
            return False
        except (SSHException, EOFError, OSError) as exc:
            self._check(exc)
            return False  # the command ended: its status says why
        finally:
            self.chan.settimeout(None)

    def _take_err(self) -> None:
        while self.chan.recv_stderr_ready():
            self.err.extend(self.chan.recv_stderr(1 << 16))
            if len(self.err) > MAX_STDERR:  # only its tail is ever shown: a helper may print without end
                del self.err[: len(self.err) - MAX_STDERR]

    def read(self, deadline: float | None) -> bytes | None:
        chan = self.chan
        while True:
            self._take_err()
            if chan.recv_ready():
                return chan.recv(1 << 16)
            if chan.eof_received or chan.closed:
                if chan.recv_ready():
                    continue
                return b""
            self._check()
            wait = 1.0
            if deadline is not None:
                wait = min(wait, deadline - time.monotonic())
                if wait <= 0:
                    return None
            select.select([chan], [], [], wait)

    def wait(self, deadline: float | None) -> tuple[int, bytes]:
        chan = self.chan
        while not chan.exit_status_ready():
            wait = 1.0 if deadline is None else min(1.0, deadline - time.monotonic())
            if wait <= 0:
                return 124, bytes(self.err)
            chan.status_event.wait(wait)
            if not chan.exit_status_ready():
                self._check()
        self._take_err()
        status = chan.recv_exit_status()
        if status == -1:
            self._check()
        return status, bytes(self.err)

    def kill(self, pid: int | None) -> None:
        if pid is not None:
            try:
                self.host._exec(f"kill -KILL {int(pid)} 2>/dev/null; true", None, time.monotonic() + 10)
            except ConnectionFailed:
                pass
        else:
            self.close()  # no pid to kill: closing the channel is all there is

    def close(self) -> None:
        try:
            self.chan.shutdown_write()
        except Exception:
            pass
        try:
            self.chan.close()
        except Exception:
            pass

    def abandon(self) -> None:
        self.close()  # closing the channel waits for nothing; the helper's own signals decide the rest
