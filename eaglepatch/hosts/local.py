"""``LocalHost``: the ``Host`` interface on this machine's own filesystem and processes."""

from __future__ import annotations

import os
import subprocess
from typing import Sequence

from eaglepatch.hosts.base import CommandResult, FileStat


class LocalHost:
    """This machine. Same semantics as ``SSHHost``, minus the network."""

    is_local = True

    def __init__(self, name: str = "local"):
        self.name = name

    def run(
        self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float | None = None
    ) -> CommandResult:
        try:
            proc = subprocess.run(
                list(argv),
                input=stdin if stdin is not None else b"",
                capture_output=True,
                timeout=timeout,
            )
        except FileNotFoundError as exc:
            return CommandResult(127, b"", str(exc).encode())
        except subprocess.TimeoutExpired as exc:
            return CommandResult(124, exc.stdout or b"", (exc.stderr or b"") + b"\ntimed out")
        return CommandResult(proc.returncode, proc.stdout, proc.stderr)

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

    def close(self) -> None:
        pass
