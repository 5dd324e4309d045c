"""The one narrow interface to the outside world: run a command, read, write, stat, rename, remove.

Two implementations: ``LocalHost`` (this machine's filesystem and processes) and ``SSHHost`` (fabric/paramiko;
the only module that imports fabric). Everything above this layer (discovery, plans, restart, report fetching)
talks to a ``Host`` and never knows which one it has, so a local target runs the same code path as a remote one.

Batched work: steps that must happen on the host in one round trip are small Python programs shipped on stdin to
the host's interpreter (``Host.run_python``), see ``eaglepatch.hosts.remote``.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Protocol, Sequence, runtime_checkable


@dataclasses.dataclass(frozen=True)
class CommandResult:
    """What a command returned: exit status and raw output bytes."""

    rc: int
    stdout: bytes
    stderr: bytes

    @property
    def ok(self) -> bool:
        return self.rc == 0


@dataclasses.dataclass(frozen=True)
class FileStat:
    """The parts of ``stat`` that eaglepatch keeps when it replaces a file."""

    mode: int  # full st_mode
    uid: int
    gid: int
    size: int
    mtime: float


@runtime_checkable
class Host(Protocol):
    """A machine eaglepatch acts on. Paths are absolute POSIX paths on that machine.

    Every method raises ``eaglepatch.errors.ConnectionFailed`` when the connection breaks, and ``OSError``
    (``FileNotFoundError``, ``PermissionError``...) for filesystem failures on the host.
    """

    name: str  # how messages name it: "root@gpu1", "local"
    is_local: bool

    def run(
        self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float | None = None
    ) -> CommandResult:
        """Run ``argv`` (no shell; quoting is the implementation's job) and return its result; never raises on rc != 0."""
        ...

    def read_bytes(self, path: str) -> bytes:
        """Return the file's bytes; raises FileNotFoundError."""
        ...

    def write_bytes(self, path: str, data: bytes, mode: int | None = None) -> None:
        """Create or truncate ``path`` with ``data``; ``mode`` (permission bits) when given."""
        ...

    def stat(self, path: str) -> FileStat | None:
        """Return the file's stat, or None when it does not exist."""
        ...

    def rename(self, src: str, dst: str) -> None:
        """Atomically replace ``dst`` with ``src`` (POSIX rename within one filesystem)."""
        ...

    def remove(self, path: str) -> None:
        """Remove a file; no error when it is already gone."""
        ...

    def listdir(self, path: str) -> list[str]:
        """Names in a directory; raises FileNotFoundError."""
        ...

    def close(self) -> None:
        """Release the connection; idempotent."""
        ...


def run_python(host: Host, python: str, program: str, payload: Any = None, timeout: float | None = None) -> Any:
    """Run ``program`` (Python source) with ``python`` on ``host``, payload as JSON on stdin; return its JSON stdout.

    The program reads ``json.load(sys.stdin)`` and prints exactly one JSON document. Raises ``RemoteScriptError``
    when it exits non-zero or prints something that is not JSON.
    """
    # The program text travels as the first line of stdin's JSON, so no quoting of source code on a command line.
    wrapper = (
        "import json,sys;_d=json.loads(sys.stdin.read());"
        "sys.argv=['eaglepatch-remote'];_g={'__name__':'__main__','PAYLOAD':_d['payload']};"
        "exec(compile(_d['program'],'<eaglepatch-remote>','exec'),_g)"
    )
    data = json.dumps({"program": program, "payload": payload}).encode()
    result = host.run([python, "-c", wrapper], stdin=data, timeout=timeout)
    if result.rc != 0:
        raise RemoteScriptError(python, result)
    try:
        return json.loads(result.stdout.decode("utf-8", "replace"))
    except ValueError as exc:
        raise RemoteScriptError(python, result) from exc


class RemoteScriptError(Exception):
    """A remote helper program failed; carries its result for the message."""

    def __init__(self, python: str, result: CommandResult):
        tail = (result.stderr or result.stdout).decode("utf-8", "replace").strip().splitlines()[-3:]
        super().__init__(f"{python} exited {result.rc}: {' | '.join(tail) or 'no output'}")
        self.result = result
