"""The one narrow interface to the outside world: run a command, read, write, stat, rename, remove.

Two implementations: ``LocalHost`` (this machine's filesystem and processes) and ``SSHHost`` (``hosts.ssh``, on
paramiko; ``hosts.ssh_config`` says where and how to connect). Everything above this layer (discovery, plans, restart, report fetching)
talks to a ``Host`` and never knows which one it has, so a local target runs the same code path as a remote one.

Work on the host itself (read /proc, stop and start a server, read an install's facts, carry out a plan) goes
through the host's agents (``Host.agents``: ``hosts.agent``): one process per interpreter for the whole connection,
running the host-side package (``eaglepatch.hostside``), each call one request on it. The bounds of what a host may
send back are here.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Protocol, Sequence, Union, runtime_checkable


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
    agents: AgentPool  # the processes that run eaglepatch's host-side program here (``hosts.agent.Agents``)

    def run(
        self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float | None = None,
        max_output: int | None = None,
    ) -> CommandResult:
        """Run ``argv`` (no shell; quoting is the implementation's job) and return its result; never raises on rc != 0.
        ``max_output``: the most bytes of stdout and stderr together to take in; past it the command is killed and
        ``OutputLimit`` raised (what a host sends is bounded: docs/safety.md)."""
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

    def spawn(self, argv: Sequence[str]) -> "HostProcess":
        """Start ``argv`` (as ``run`` would) with pipes to talk to it while it runs; raises FileNotFoundError
        when the program does not exist here (on SSH that shows later, as exit status 127)."""
        ...

    def close(self) -> None:
        """Release the connection; idempotent."""
        ...


# What a host's helper may send, at most (everything a host sends is data from a stranger: docs/safety.md, "Trust
# boundaries"). The largest real answers are the facts of an install (every worker file, base64: a few MB) and a
# batch of timing logs (``hostside/logs.py``'s LOG_BATCH, 8 MB, raw frames after its answer); these leave room for both.
MAX_PREAMBLE = 1 << 20  # what a login shell prints before the marker
MAX_FRAME = 64 << 20  # one frame of the agent protocol on the wire, compressed or not
MAX_ANSWER = 64 << 20  # one answer, decompressed
MAX_STDERR = 64 << 10  # the tail of a helper's stderr that is kept (for messages)
MAX_HEADER = 24  # b"z67108864\n" and the like


def mib(n: int) -> str:
    """``n`` bytes for a message: "64 MiB", "24 bytes"."""
    return f"{n / (1 << 20):.0f} MiB" if n >= 1 << 20 else f"{n} bytes"


class OutputLimit(Exception):
    """A command printed more than the ``max_output`` it was given; it was killed."""

    def __init__(self, limit: int):
        super().__init__(f"more than {mib(limit)} of output")
        self.limit = limit


# A program for the agents: its source, or a function that makes it (called only when a process is started).
Program = Union[str, Callable[[], str]]


class AgentPool(Protocol):
    """A host's agents (``hosts.agent.Agents``): one process per interpreter, answering requests."""

    def call(self, python: str, program: Program, payload: Any, timeout: float | None = None) -> Any:
        """``program``'s ``main(payload)``, run by ``python`` on the host; raises ``hosts.agent.RemoteScriptError``."""
        ...

    def call_each(self, python: str, program: Program, payload: Any, follow: Callable[[Any], Any],
                  on_result: Callable[[Any], None], timeout: float | None = None) -> None:
        """``call`` of ``payload``, then of each ``follow(result)`` until that is None, every result to
        ``on_result``; each request sent before the answer to the one before is read whole (read-only ops)."""
        ...

    def close(self) -> None:
        """Let every process go (each ends after its last request); idempotent."""
        ...


class HostProcess(Protocol):
    """A process started by ``Host.spawn``: bytes to its stdin, bytes from its stdout; its stderr is kept."""

    def send(self, data: bytes, deadline: float | None) -> bool:
        """Write ``data`` to its stdin; False when it is gone or the deadline passed (what it said is read next)."""
        ...

    def read(self, deadline: float | None) -> bytes | None:
        """Some bytes of its stdout; ``b""`` at end of file; None when the deadline passed first."""
        ...

    def wait(self, deadline: float | None) -> tuple[int, bytes]:
        """Its exit status (124 when the deadline passed first) and all it wrote on stderr."""
        ...

    def kill(self, pid: int | None) -> None:
        """Kill it (``pid``: its process id on the host, when known); ``wait`` and ``close`` follow."""
        ...

    def close(self) -> None:
        """Close its stdin (it ends by itself then) and let go of it; idempotent."""
        ...

    def abandon(self) -> None:
        """Let go of it at once, never waiting or killing: it finishes what it was asked on its own."""
        ...
