"""Stopping and starting a server on a host, each one request (``hostside.control``'s ``op_stop`` / ``op_start``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from eaglepatch.hosts.agent import call
from eaglepatch.hosts.base import Host
from eaglepatch.redact import mask_argv
from eaglepatch.server.process import LaunchSpec, ServerProcess


@dataclasses.dataclass(frozen=True)
class StopResult:
    """What stopping did. ``ok``: every process is gone and the port is free."""

    pid: int
    already_gone: bool
    stopped: tuple[int, ...]  # every process signalled
    killed: tuple[int, ...]  # those that needed SIGKILL after the grace period
    remaining: tuple[int, ...]  # still alive at the end
    port_free: bool
    errors: tuple[str, ...]
    seconds: float

    @property
    def ok(self) -> bool:
        return not self.remaining and self.port_free

    def describe(self) -> str:
        """One line for a person when not ``ok``."""
        parts = []
        if self.errors:
            parts.append("; ".join(self.errors))
        if self.remaining:
            parts.append(f"still running after SIGKILL: {', '.join(map(str, self.remaining))}")
        if not self.port_free:
            parts.append("the port is still in use")
        return f"could not stop the sglang server (pid {self.pid}): " + ("; ".join(parts) or "unknown reason")


def stop_server(
    host: Host,
    server: ServerProcess,
    *,
    grace: float = 30.0,
    port_timeout: float = 60.0,
    python: str = "python3",
) -> StopResult:
    """SIGTERM the server with its process group and descendants, SIGKILL after ``grace`` s, wait for the port.

    Never raises for a process that is already gone (that is success; orphans of a group it led are stopped);
    a permission error is reported in the result, with the server left running.
    """
    out = call(host, python, "stop", timeout=grace + port_timeout + 60, **stop_payload(server, grace, port_timeout))
    return stop_result(server.pid, out)


def stop_payload(server: ServerProcess, grace: float, port_timeout: float) -> dict[str, Any]:
    """What ``op_stop`` takes to stop ``server`` (and only it: its pid with its start time)."""
    return {
        "pid": server.pid,
        "start": server.start,
        "children": list(server.children),
        "grace": grace,
        "port": server.port,
        "port_timeout": port_timeout,
        # it started its own group/session (as eaglepatch starts servers): leftovers of it may be stopped
        "leader": server.pgid == server.pid or server.sid == server.pid,
    }


def stop_result(pid: int, out: dict[str, Any]) -> StopResult:
    """``op_stop``'s answer as a StopResult."""
    return StopResult(
        pid=pid,
        already_gone=bool(out.get("already_gone")),
        stopped=tuple(out.get("stopped") or ()),
        killed=tuple(out.get("killed") or ()),
        remaining=tuple(out.get("remaining") or ()),
        port_free=bool(out.get("port_free", True)),
        errors=tuple(out.get("errors") or ()),
        seconds=float(out.get("seconds") or 0.0),
    )


@dataclasses.dataclass(frozen=True)
class Started:
    """A server process just started: its pid (None with ``error``), start time, and where its log output begins."""

    pid: int | None
    start: int | None
    log_offset: int
    error: str | None = None
    log_path: str | None = None  # where its stderr goes (the server's own file, or the log in a private folder)
    script: str | None = None  # a shell script that starts it by hand, exactly so
    stdout: str | None = None  # where its stdout goes
    kept: tuple[str, ...] = ()  # the streams appended to the original's own files ("stdout", "stderr")
    notes: tuple[str, ...] = ()  # why a stream of the original's own files was not (the file replaced, ...)


def start_payload(spec: LaunchSpec) -> dict[str, Any]:
    """What ``op_start`` takes to start ``spec``: ``output``, the original's own output files to append to;
    ``log_path``, the log otherwise (null: the host's default, in its EAGLEPATCH_STATE_DIR; its answer says which);
    ``shown_argv``, the command line its log's marker line shows (secrets masked: the file may be the user's)."""
    return {"argv": list(spec.argv), "cwd": spec.cwd, "env": dict(spec.env), "log_path": spec.log_path or None,
            "launcher": spec.launcher, "sig_ign": spec.sig_ign, "port": spec.port,
            "output": None if spec.output is None else {k: v and dict(v) for k, v in spec.output.items()},
            "shown_argv": mask_argv(spec.argv)}


def started_result(out: dict[str, Any]) -> Started:
    """``op_start``'s answer as a Started."""
    where = out.get("output") if isinstance(out.get("output"), dict) else {}
    return Started(
        pid=out.get("pid"), start=out.get("start"), log_offset=int(out.get("offset") or 0), error=out.get("error"),
        log_path=out.get("log_path"), script=out.get("script"), stdout=where.get("stdout") or out.get("log_path"),
        kept=tuple(str(k) for k in out.get("kept") or ()), notes=tuple(str(n) for n in out.get("notes") or ()),
    )


def relaunch_payload(current: ServerProcess | None, spec: LaunchSpec, grace: float = 30.0,
                     port_timeout: float = 60.0) -> dict[str, Any]:
    """What ``op_relaunch`` takes to stop ``current`` (if any) and start ``spec`` in one request."""
    return {"stop": stop_payload(current, grace, port_timeout) if current is not None else None,
            "start": start_payload(spec), "port": spec.port,
            "check_port": current is None or current.port != spec.port,
            "lock_wait": lock_wait(grace, port_timeout)}


def lock_wait(grace: float, port_timeout: float) -> float:
    """How long a relaunch waits on the host for another relaunch of its port to end (one whose client was
    interrupted goes on there): that one's stop and start."""
    return grace + port_timeout + 60


def relaunch_timeout(grace: float, port_timeout: float, n: int = 1) -> float:
    """How long ``n`` relaunches may take on the host (each: the stop's grace and port wait, the start), after
    waiting for one relaunch of the same port that was already running there."""
    return n * (grace + port_timeout + 120) + lock_wait(grace, port_timeout)


def read_log_tail(host: Host, log_path: str, *, offset: int = 0, lines: int = 30, python: str = "python3") -> str:
    """The last ``lines`` non-empty lines of the log written after ``offset``; "" when there is no log."""
    out = call(host, python, "tail", timeout=60, log_path=log_path, offset=offset, lines=lines)
    return "\n".join(out.get("lines") or [])
