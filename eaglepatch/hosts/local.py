"""``LocalHost``: the ``Host`` interface on this machine's own filesystem and processes."""

from __future__ import annotations

import os
import select
import subprocess
import threading
import time
from typing import Sequence

from eaglepatch.hosts.agent import Agents
from eaglepatch.hosts.base import MAX_STDERR, CommandResult, FileStat, OutputLimit


class LocalHost:
    """This machine. Same semantics as ``SSHHost``, minus the network."""

    is_local = True

    def __init__(self, name: str = "local"):
        self.name = name
        self.agents = Agents(self)

    def run(
        self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float | None = None,
        max_output: int | None = None,
    ) -> CommandResult:
        try:
            # its own session: a Ctrl-C in the terminal, or a signal to eaglepatch's process group (timeout(1),
            # a cancelled CI job), must not stop a helper halfway through its request (a relaunch, a plan)
            proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, start_new_session=True)
        except FileNotFoundError as exc:
            return CommandResult(127, b"", str(exc).encode())
        try:
            return _communicate(proc, stdin or b"", timeout, max_output)
        except BaseException:
            # Ctrl-C mid-request: the helper (in its own session) finishes it, a relaunch included; never killed
            # (a kill between a stop and a start would leave no server), never waited for
            for f in (proc.stdout, proc.stderr):
                try:
                    f.close()  # type: ignore[union-attr]
                except OSError:
                    pass
            raise

    def read_bytes(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def write_bytes(self, path: str, data: bytes, mode: int | None = None) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        fd = os.open(path, flags, 0o600 if mode is None else mode)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            raise
        if mode is not None:
            os.chmod(path, mode)

    def stat(self, path: str) -> FileStat | None:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        return FileStat(st.st_mode, st.st_uid, st.st_gid, st.st_size, st.st_mtime)

    def rename(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def remove(self, path: str) -> None:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass

    def listdir(self, path: str) -> list[str]:
        return sorted(os.listdir(path))

    def open_tunnel(self, remote_host: str, remote_port: int) -> int:
        """The port to connect to for ``remote_host:remote_port``: on this machine, the port itself (no tunnel)."""
        return int(remote_port)

    def close_tunnel(self, port: int) -> None:
        pass

    def spawn(self, argv: Sequence[str]) -> "_LocalProcess":
        return _LocalProcess(list(argv))

    def close(self) -> None:
        self.agents.close()


def _communicate(proc: subprocess.Popen, data: bytes, timeout: float | None,
                 limit: int | None) -> CommandResult:
    """``Popen.communicate`` with a bound: stdin fed from a thread, stdout and stderr read as they come; rc 124
    (killed) at the timeout; ``OutputLimit`` (killed) past ``limit`` bytes of output."""
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    stdin = proc.stdin

    def feed() -> None:
        try:
            stdin.write(data)
        except (BrokenPipeError, OSError, ValueError):
            pass  # it exited (or closed its stdin) before reading it all
        finally:
            try:
                stdin.close()
            except OSError:
                pass

    writer = threading.Thread(target=feed, daemon=True, name="eaglepatch-local-stdin")
    writer.start()
    deadline = None if timeout is None else time.monotonic() + timeout
    bufs = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    out, err = bufs[proc.stdout.fileno()], bufs[proc.stderr.fileno()]
    open_fds = list(bufs)
    why = ""
    while open_fds:
        wait = None if deadline is None else deadline - time.monotonic()
        if wait is not None and wait <= 0:
            why = "timeout"
            break
        ready, _, _ = select.select(open_fds, [], [], wait)
        for fd in ready:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                open_fds.remove(fd)
            bufs[fd].extend(chunk)
        if limit is not None and len(out) + len(err) > limit:
            why = "limit"
            break
    if why:
        proc.kill()
    rc = proc.wait()
    writer.join(5)
    if why == "limit":
        raise OutputLimit(limit or 0)
    if why == "timeout":
        return CommandResult(124, bytes(out), bytes(err) + b"\ntimed out")
    return CommandResult(rc, bytes(out), bytes(err))


class _LocalProcess:
    """``LocalHost.spawn``: a child with three pipes; its stderr is collected by a thread."""

    def __init__(self, argv: list[str]):
        # its own session, as LocalHost.run's helpers: a signal to eaglepatch's group does not cut a request short
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     start_new_session=True)
        self.err = bytearray()
        self._err_thread = threading.Thread(target=self._drain_err, daemon=True, name="eaglepatch-agent-stderr")
        self._err_thread.start()

    def _drain_err(self) -> None:
        assert self.proc.stderr is not None
        for chunk in iter(lambda: self.proc.stderr.read1(1 << 16), b""):  # type: ignore[union-attr]
            self.err.extend(chunk)
            if len(self.err) > MAX_STDERR:  # only its tail is ever shown: a helper may print without end
                del self.err[: len(self.err) - MAX_STDERR]

    def send(self, data: bytes, deadline: float | None) -> bool:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
            return True
        except (BrokenPipeError, OSError, ValueError):
            return False

    def read(self, deadline: float | None) -> bytes | None:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, _, _ = select.select([fd], [], [], wait)
        if not ready:
            return None
        return os.read(fd, 1 << 16)

    def wait(self, deadline: float | None) -> tuple[int, bytes]:
        try:
            rc = self.proc.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return 124, bytes(self.err)
        self._err_thread.join(5)
        return rc, bytes(self.err)

    def kill(self, pid: int | None) -> None:
        try:
            self.proc.kill()
        except OSError:
            pass

    def abandon(self) -> None:
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass

    def close(self) -> None:
        self.abandon()
        try:
            self.proc.wait(5)  # it ends at the end of its input
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
