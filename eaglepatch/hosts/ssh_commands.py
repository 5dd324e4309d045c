"""Commands over SSH: each one a session channel of ``SSHHost``'s connection, run through the remote login shell.

``run`` collects a command's output (rc 127, 124, -1 as ``LocalHost.run`` gives them; a timeout kills the program by
the pid its shell prints first); ``spawn`` leaves the channel open to talk to (``ssh_process.SSHProcess``).
``SSHCommands`` is mixed into ``SSHHost``, which gives it the connection.
"""

from __future__ import annotations

import os
import select
import shlex
import threading
import time
from typing import Any, Callable, Sequence

from eaglepatch.hosts.paramiko_import import paramiko
from paramiko.ssh_exception import SSHException

from eaglepatch.errors import ConnectionFailed
from eaglepatch.hosts.base import CommandResult, OutputLimit
from eaglepatch.hosts.ssh_process import SSHProcess

_CHUNK = 1 << 15
_PID_MARKER = b"@eaglepatch-pid:"


class SSHCommands:
    """The commands of ``SSHHost`` (see ``eaglepatch.hosts.base.Host``); ``SSHHost`` gives them what is declared
    here."""

    name: str
    _timeout: float
    _live_transport: Callable[[], paramiko.Transport]
    _lost: Callable[..., ConnectionFailed]

    def run(
        self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float | None = None,
        max_output: int | None = None,
    ) -> CommandResult:
        """Run ``argv`` through the remote login shell (quoted with ``shlex.join``; POSIX shells).

        Like ``LocalHost.run``: rc 127 when the program does not exist; rc 124 on timeout (the process is killed
        with SIGKILL, as ``subprocess.run`` does); rc -1 when it died from a signal (SSH reports no status then).
        Never raises on rc != 0; raises ``OutputLimit`` (the process killed) past ``max_output`` bytes of output.
        """
        if isinstance(argv, (str, bytes)):
            raise TypeError("argv must be a sequence of arguments, not a string")
        argv = [a if isinstance(a, str) else os.fspath(a) for a in argv]
        if not argv:
            raise ValueError("argv is empty")
        # The shell prints its pid (which `exec` hands to the program) so that a timeout can kill the program.
        command = f"echo {_PID_MARKER.decode()}$$; exec {shlex.join(argv)}"
        deadline = None if timeout is None else time.monotonic() + timeout
        rc, out, err, timed_out = self._exec(command, stdin, deadline, max_output)
        over = max_output is not None and len(out) + len(err) > max_output
        timed_out = timed_out or over
        pid = None
        at = out.find(_PID_MARKER)
        if at >= 0:
            end = out.find(b"\n", at)
            if end >= 0:
                pid = out[at + len(_PID_MARKER) : end]
                del out[at : end + 1]
            elif timed_out:
                pid = out[at + len(_PID_MARKER) :]
                del out[at:]
        if timed_out:
            if pid and pid.isdigit():
                try:
                    self._exec(f"kill -KILL {int(pid)} 2>/dev/null; true", None, time.monotonic() + 10)
                except ConnectionFailed:
                    pass
            if over:
                raise OutputLimit(max_output or 0)
            return CommandResult(124, bytes(out), bytes(err) + b"\ntimed out")
        return CommandResult(rc, bytes(out), bytes(err))

    def _open_session(self) -> tuple[Any, Any]:
        """(transport, a new session channel on it); a lost connection or a refused channel as ConnectionFailed."""
        transport = self._live_transport()
        try:
            return transport, transport.open_session(timeout=self._timeout)
        except (SSHException, EOFError, OSError) as exc:
            if not transport.is_active():
                raise self._lost(exc) from exc
            raise ConnectionFailed(f"cannot open a session on {self.name}: {exc}") from exc

    def spawn(self, argv: Sequence[str]) -> SSHProcess:
        """Start ``argv`` through the remote login shell on a channel of its own, stdin/stdout open to talk to it
        (``Agents``); a program that does not exist shows as exit status 127 when it is read."""
        argv = [a if isinstance(a, str) else os.fspath(a) for a in argv]
        if not argv:
            raise ValueError("argv is empty")
        transport, chan = self._open_session()
        try:
            chan.exec_command(f"exec {shlex.join(argv)}")
        except (SSHException, EOFError, OSError) as exc:
            chan.close()
            if not transport.is_active():
                raise self._lost(exc) from exc
            raise ConnectionFailed(f"cannot run a command on {self.name}: {exc}") from exc
        return SSHProcess(self, chan, transport)

    def _exec(
        self, command: str, stdin: bytes | None, deadline: float | None, limit: int | None = None
    ) -> tuple[int, bytearray, bytearray, bool]:
        """One session channel: run ``command`` (a shell command line), feed ``stdin``, collect both outputs;
        returns (rc, stdout, stderr, timed_out). Past ``limit`` bytes of output it stops reading, as at a
        timeout (the caller tells the two apart by the size)."""
        transport, chan = self._open_session()
        try:
            return self._exec_channel(chan, transport, command, stdin, deadline, limit)
        finally:
            try:
                chan.close()
            except Exception:
                pass

    def _exec_channel(
        self,
        chan: paramiko.Channel,
        transport: paramiko.Transport,
        command: str,
        stdin: bytes | None,
        deadline: float | None,
        limit: int | None = None,
    ) -> tuple[int, bytearray, bytearray, bool]:
        try:
            chan.exec_command(command)
        except (SSHException, EOFError, OSError) as exc:
            if not transport.is_active():
                raise self._lost(exc) from exc
            raise ConnectionFailed(f"cannot run a command on {self.name}: {exc}") from exc

        # stdin goes from its own thread, so that a command that writes much before it reads all its input
        # cannot deadlock against us; stdout and stderr are read here, both at once (they share one window).
        if stdin:
            data = bytes(stdin)

            def feed() -> None:
                try:
                    view = memoryview(data)
                    for i in range(0, len(view), _CHUNK):
                        chan.sendall(view[i : i + _CHUNK])
                    chan.shutdown_write()
                except Exception:  # the command exited (or we closed the channel) before reading it all
                    pass

            writer = threading.Thread(target=feed, name=f"eaglepatch-stdin-{self.name}", daemon=True)
            writer.start()
        else:
            chan.shutdown_write()

        out, err = bytearray(), bytearray()
        chan.fileno()  # turns on the pipe that select() watches (readable on stdout, stderr or EOF)

        def drain() -> None:
            while chan.recv_ready():
                out.extend(chan.recv(1 << 16))
            while chan.recv_stderr_ready():
                err.extend(chan.recv_stderr(1 << 16))

        timed_out = False
        while True:
            done = chan.eof_received or chan.closed
            drain()
            if limit is not None and len(out) + len(err) > limit:
                return 124, out, err, True  # the host says too much: stop reading (run() kills and raises)
            if done:
                break
            if not transport.is_active():
                raise self._lost()
            wait = 1.0
            if deadline is not None:
                wait = min(wait, deadline - time.monotonic())
                if wait <= 0:
                    timed_out = True
                    break
            select.select([chan], [], [], wait)

        if not timed_out:
            while not chan.exit_status_ready():
                wait = 1.0 if deadline is None else min(1.0, deadline - time.monotonic())
                if wait <= 0:
                    timed_out = True
                    break
                chan.status_event.wait(wait)
                if not chan.exit_status_ready() and not transport.is_active():
                    raise self._lost()
        drain()
        if timed_out:
            return 124, out, err, True
        status = chan.recv_exit_status()
        if status == -1 and not transport.is_active():
            raise self._lost()
        return status, out, err, False
