"""Finding the running sglang server: what runs, with what arguments, where, and how to start it again.

``find_servers`` reads the host's /proc in one round trip; ``ServerProcess`` is what it found, ``LaunchSpec`` what
starting it again takes (and what ``apply`` keeps in its backup manifest, so that ``revert`` can start the server
even after it crashed).
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
from typing import Any, Mapping, Sequence

from eaglepatch.errors import UsageError
from eaglepatch.hosts.base import Host, run_python
from eaglepatch.server import _remote

DEFAULT_PORT = _remote.DEFAULT_PORT
DEFAULT_HOST = _remote.DEFAULT_HOST
LOG_DIR = "/tmp/eaglepatch"

# addresses a server listens on that are not addresses to connect to: probe the loopback instead
_WILDCARDS = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1", "[::]": "::1"}


def default_log_path(port: int) -> str:
    """Where a server that eaglepatch starts writes its output on the host."""
    return f"{LOG_DIR}/server-{port}.log"


def probe_address(host: str) -> str:
    """The address to connect to for a server started with ``--host host`` (a wildcard becomes the loopback)."""
    return _WILDCARDS.get(host, host)


@dataclasses.dataclass(frozen=True)
class ServerArgs:
    """The few sglang server arguments eaglepatch needs: where it listens, and its API key."""

    port: int = DEFAULT_PORT
    host: str = DEFAULT_HOST
    api_key: str | None = None


def parse_server_args(args: Sequence[str]) -> ServerArgs:
    """Read ``--port``, ``--host`` and ``--api-key`` from sglang's arguments (``--x V`` or ``--x=V``; last wins).

    A malformed ``--port`` value leaves the default, as the server itself would have refused to start with it.
    (The same function runs on the host, in ``_remote``.)
    """
    parsed = _remote.parse_server_args(list(args))
    return ServerArgs(port=parsed["port"], host=parsed["host"], api_key=parsed["api_key"])


@dataclasses.dataclass(frozen=True)
class LaunchSpec:
    """How to start a server: the exact argv, working directory and environment, and where its output goes.

    JSON round-trippable (``to_json``/``from_json``) so ``apply`` can keep it in the backup manifest.
    """

    argv: list[str]
    cwd: str
    env: dict[str, str]
    port: int = DEFAULT_PORT
    host: str = DEFAULT_HOST
    log_path: str = ""

    def __post_init__(self) -> None:
        if not self.log_path:
            object.__setattr__(self, "log_path", default_log_path(self.port))

    @property
    def probe_host(self) -> str:
        return probe_address(self.host)

    @property
    def api_key(self) -> str | None:
        return parse_server_args(self.argv).api_key

    def to_json(self) -> dict[str, Any]:
        return {
            "argv": list(self.argv),
            "cwd": self.cwd,
            "env": dict(self.env),
            "port": self.port,
            "host": self.host,
            "log_path": self.log_path,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LaunchSpec:
        """Build from ``to_json``'s dict; raises ValueError naming the field that is missing or of the wrong type."""
        if not isinstance(data, Mapping):
            raise ValueError("launch spec: expected an object")
        argv, env = data.get("argv"), data.get("env")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise ValueError("launch spec: 'argv' must be a non-empty list of strings")
        if not isinstance(data.get("cwd"), str) or not data["cwd"]:
            raise ValueError("launch spec: 'cwd' must be a path")
        if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise ValueError("launch spec: 'env' must be an object of strings")
        port = data.get("port", DEFAULT_PORT)
        if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
            raise ValueError("launch spec: 'port' must be a TCP port number")
        host = data.get("host", DEFAULT_HOST)
        log_path = data.get("log_path") or ""
        if not isinstance(host, str) or not isinstance(log_path, str):
            raise ValueError("launch spec: 'host' and 'log_path' must be strings")
        return cls(argv=list(argv), cwd=data["cwd"], env=dict(env), port=port, host=host, log_path=log_path)


@dataclasses.dataclass(frozen=True)
class ServerProcess:
    """A running sglang server: its launcher process (the top one), as read from /proc on the host.

    ``env`` is None and ``cwd`` None when /proc would not tell (another user's process); ``children`` are all its
    descendants (TP ranks, scheduler, detokenizer). ``host`` is the ``--host`` it was given; ``probe_host`` is
    where to connect to it. ``start`` is the kernel's start time of the process (with the pid, its identity).
    """

    pid: int
    argv: list[str]
    cwd: str | None
    env: dict[str, str] | None
    exe: str | None
    port: int = DEFAULT_PORT
    host: str = DEFAULT_HOST
    children: tuple[int, ...] = ()
    pgid: int = 0
    sid: int = 0
    start: int | None = None
    same_mount_ns: bool | None = True

    @property
    def probe_host(self) -> str:
        return probe_address(self.host)

    @property
    def api_key(self) -> str | None:
        return parse_server_args(self.argv).api_key

    def to_json(self) -> dict[str, Any]:
        """The ``server`` object of ``status --json`` / ``show --json``."""
        return {"pid": self.pid, "argv": list(self.argv)}

    def launch_spec(self, log_path: str | None = None) -> LaunchSpec:
        """What starting this server again takes.

        Raises UsageError when it cannot be relaunched from here: its working directory or environment is not
        readable (another user's process: run as that user or root), or it runs in another mount namespace
        (a container). Either way ``--restart-cmd`` or ``--systemd-unit`` says how to restart it instead.
        """
        how = "pass --restart-cmd CMD or --systemd-unit NAME to say how to restart it"
        if self.cwd is None or self.env is None:
            raise UsageError(
                f"cannot read the working directory or environment of the sglang server (pid {self.pid}): "
                f"run as its user or root, or {how}"
            )
        if self.same_mount_ns is False:
            raise UsageError(
                f"the sglang server (pid {self.pid}) runs in a container (another mount namespace), "
                f"so eaglepatch cannot start it again from the host: {how} (e.g. 'docker restart NAME')"
            )
        return LaunchSpec(
            argv=list(self.argv),
            cwd=self.cwd,
            env=dict(self.env),
            port=self.port,
            host=self.host,
            log_path=log_path or default_log_path(self.port),
        )

    @classmethod
    def from_scan(cls, item: Mapping[str, Any]) -> ServerProcess:
        argv = list(item["argv"])
        args = parse_server_args(argv[int(item.get("args_index", 0)) :])
        return cls(
            pid=int(item["pid"]),
            argv=argv,
            cwd=item.get("cwd"),
            env=item.get("env"),
            exe=item.get("exe"),
            port=args.port,
            host=args.host,
            children=tuple(int(c) for c in item.get("children") or ()),
            pgid=int(item.get("pgid") or 0),
            sid=int(item.get("sid") or 0),
            start=item.get("start"),
            same_mount_ns=item.get("same_mount_ns"),
        )


@functools.lru_cache(maxsize=1)
def remote_program() -> str:
    """The source of ``_remote.py``, shipped to the host's interpreter on every call."""
    return pathlib.Path(__file__).with_name("_remote.py").read_text(encoding="utf-8")


def call_remote(host: Host, python: str, op: str, payload: Mapping[str, Any], timeout: float | None = None) -> Any:
    """Run one operation of ``_remote.py`` on the host; raises RemoteScriptError when the program fails."""
    return run_python(host, python, remote_program(), dict(payload, op=op), timeout=timeout)


def find_servers(host: Host, python: str = "python3") -> list[ServerProcess]:
    """The running sglang servers on ``host`` (launcher processes only), by pid; one round trip.

    Raises ``RemoteScriptError`` when ``python`` cannot run there, ``ConnectionFailed`` when the connection breaks.
    """
    result = call_remote(host, python, "scan", {}, timeout=60)
    return [ServerProcess.from_scan(item) for item in result["servers"]]


def select_server(servers: Sequence[ServerProcess], port: int | None = None) -> ServerProcess | None:
    """The one server to act on: the one on ``port`` when given, else the only one; None when there is none.

    Raises UsageError when several run and ``port`` does not pick one.
    """
    chosen = [s for s in servers if port is None or s.port == port]
    if len(chosen) > 1:
        listing = ", ".join(f"pid {s.pid} on :{s.port}" for s in chosen)
        raise UsageError(f"several sglang servers run ({listing}); say which one")
    return chosen[0] if chosen else None
