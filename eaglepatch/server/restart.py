"""Restarting the sglang server so a patch takes effect, and waiting until it serves again.

Strategies, in order of preference: the user's ``--restart-cmd`` (run as given), ``--systemd-unit`` (``systemctl
restart``), and by default relaunching what was running (stop it, start the same argv in the same directory with
the same environment, detached, output to a log on the host). ``restart`` returns a ``RestartResult`` whether or
not the server came up, so that ``apply`` can decide to roll back; it raises only for what no caller can act on
by retrying (bad options, nothing running and nothing known to start).
"""

from __future__ import annotations

import dataclasses
import enum
import posixpath
import time
from typing import Any, Callable

from eaglepatch.errors import HelperFailed, RestartFailed, UsageError
from eaglepatch.hosts.agent import call
from eaglepatch.hosts.base import Host
from eaglepatch.redact import mask_command, mask_text, shown, shown_argv
from eaglepatch.server.control import (
    Started,
    read_log_tail,
    relaunch_payload,
    relaunch_timeout,
    started_result,
    stop_result,
    stop_server,
)
from eaglepatch.failpoints import failpoint
from eaglepatch.server.process import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    LaunchSpec,
    ServerProcess,
    default_log_path,
    find_servers,
)
from eaglepatch.server.ready import Progress, Readiness, ReadyState, wait_until_ready

LOG_TAIL_LINES = 30


class Strategy(enum.Enum):
    """How the server was (re)started."""

    RESTART_CMD = "restart-cmd"  # the user's command, run as given
    SYSTEMD = "systemd"  # systemctl restart UNIT
    RELAUNCH = "relaunch"  # stop what ran, start the same argv/cwd/env
    START = "start"  # nothing ran: start a known launch spec


VERDICT_GRACE_S = 60.0  # a node of rank > 0 waits this long past its own timeout for node rank 0's verdict


@dataclasses.dataclass(frozen=True)
class NodeWait:
    """How one node of a multi-node server is waited for (``eaglepatch.ops.nodes``): node rank 0 (``http``) by its
    health endpoint; another rank, which may serve no HTTP, by its process. ``verdict()``, the server's: None while
    it comes up, True once node rank 0 is ready (a live node of another rank is then ready), False once it cannot
    (a node died or refused to start): every wait ends then."""

    http: bool
    verdict: Callable[[], bool | None]
    pause: Callable[[float], bool]  # sleep up to the seconds given, or until the verdict changes; True when it did


class _VerdictFalse(Exception):
    """The server's verdict turned False while node rank 0 was waited for."""


class NoServerRunning(RestartFailed):
    """Nothing to restart: no server runs and no way to start one is known."""

    def __init__(self, where: str):
        super().__init__(
            f"no sglang server is running on {where}, and eaglepatch does not know how to start one: start it "
            "yourself (python -m sglang.launch_server --model-path ... [--port N]), or pass --restart-cmd CMD "
            "or --systemd-unit NAME"
        )


@dataclasses.dataclass(frozen=True)
class RestartOptions:
    """How to restart and how long to wait.

    ``timeout``: seconds for the server to become ready (big models load for minutes). ``grace``: seconds between
    SIGTERM and SIGKILL when stopping. ``port_timeout``: how long a stopped server's port may stay busy.
    ``stop_on_failure``: a server eaglepatch started that is still not ready at the timeout is stopped (off by
    default: a slow server is left to finish loading, and a rollback stops it itself, in the same request that
    starts the original). Raises UsageError for contradictory or out-of-range values.
    """

    restart_cmd: str | None = None
    systemd_unit: str | None = None
    timeout: float = 900.0
    grace: float = 30.0
    poll_interval: float = 1.0
    port_timeout: float = 60.0
    stop_on_failure: bool = False

    def __post_init__(self) -> None:
        if self.restart_cmd is not None and self.systemd_unit is not None:
            raise UsageError("--restart-cmd and --systemd-unit exclude each other: give one")
        if self.restart_cmd is not None and not self.restart_cmd.strip():
            raise UsageError("--restart-cmd: the command is empty")
        if self.systemd_unit is not None:
            unit = self.systemd_unit
            if not unit or unit.startswith("-") or any(c.isspace() for c in unit) or "/" in unit:
                raise UsageError(f"--systemd-unit: {unit!r} is not a unit name")
        if not self.timeout > 0:
            raise UsageError(f"--timeout must be a positive number of seconds, not {self.timeout}")
        if self.grace < 0 or self.port_timeout < 0:
            raise UsageError("the grace period and port timeout cannot be negative")
        if not self.poll_interval > 0:
            raise UsageError(f"the poll interval must be positive, not {self.poll_interval}")


@dataclasses.dataclass(frozen=True)
class RestartResult:
    """How a restart went.

    ``pid``: the new server's launcher when known (for a failed start: the one that failed). ``ready``: it
    answered its health endpoint within the timeout. ``log_tail``: the last lines of its log when not ready.
    ``message``: one line for a person. ``state``: how waiting ended (None when it never got that far).
    ``stopped_pid``: the old server stopped on the way. ``stopped_failed``: the not-ready server was stopped again.
    """

    strategy: Strategy
    pid: int | None
    ready: bool
    seconds: float
    log_tail: str = ""
    message: str = ""
    port: int = DEFAULT_PORT
    log_path: str | None = None
    state: ReadyState | None = None
    stopped_pid: int | None = None
    stopped_failed: bool = False
    start: int | None = None  # the kernel's start time of ``pid`` (with it, the process's identity)
    script: str | None = None  # on the host: a shell script that starts the server by hand exactly as it was
    untouched: bool = False  # refused before anything was stopped: the server that ran runs on, as it was
    # where the started server writes its output (``output_of``); None when eaglepatch did not start it itself
    output: dict[str, str | None] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy.value,
            "pid": self.pid,
            "ready": self.ready,
            "seconds": round(self.seconds, 3),
            "port": self.port,
            "message": self.message,
            "log_path": self.log_path,
            "log_tail": self.log_tail,
            "output": self.output,
        }


def restart(
    host: Host,
    *,
    current: ServerProcess | None = None,
    launch: LaunchSpec | None = None,
    options: RestartOptions = RestartOptions(),
    progress: Progress | None = None,
    python: str = "python3",
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    on_started: Callable[[Started], None] | None = None,
    package_dir: str | None = None,
    node: NodeWait | None = None,
) -> RestartResult:
    """Restart the server on ``host`` and wait until it is ready; see the module docstring for the strategies.

    ``on_started`` is told of the new process (pid, start time) before the wait (a sweep records it as its own);
    ``package_dir``: the install whose server a restart command or unit starts (only its servers are watched);
    ``node``: how a node of a multi-node server is waited for (``NodeWait``; None: as a server of one node).

    ``current`` is the running server (what is stopped, and what the default strategy starts again);
    ``launch`` is what to start instead of ``current``'s own command line (a manifest's spec after a crash, or a
    sweep's changed flags). ``python`` is the interpreter on the host for eaglepatch's helper programs.
    Returns a RestartResult, ready or not. Raises NoServerRunning when neither ``current`` nor ``launch`` is
    given and no restart command or unit is; UsageError when ``current`` cannot be relaunched from here;
    ConnectionFailed when the connection breaks.
    """
    run = _Run(host, options, progress, python, clock, sleep, on_started, package_dir, node)
    if options.restart_cmd is not None:
        return run.by_command(options.restart_cmd, current, launch)
    if options.systemd_unit is not None:
        return run.by_systemd(options.systemd_unit, current, launch)
    if launch is None and current is not None and current.unit:
        return run.by_systemd(current.unit, current, None)  # systemd runs it: restarting by hand would race it
    if current is None and launch is None:
        raise NoServerRunning(host.name)
    spec = launch if launch is not None else current.launch_spec()  # type: ignore[union-attr]
    return run.relaunch(current, spec)


def after_relaunch(
    host: Host,
    current: ServerProcess | None,
    spec: LaunchSpec,
    answer: dict[str, Any],
    *,
    options: RestartOptions = RestartOptions(),
    progress: Progress | None = None,
    python: str = "python3",
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    node: NodeWait | None = None,
) -> RestartResult:
    """Wait for a server whose stop and start already ran on the host (``op_relaunch``'s ``answer``, as
    part of another request: a rollback's), as ``restart`` would have; same result."""
    run = _Run(host, options, progress, python, clock, sleep, node=node)
    return run.finish(current, spec, answer)


def output_of(started: Started) -> dict[str, str | None]:
    """Where a relaunched server writes its output, named as ``status --json`` names a server's ``output``:
    ``stdout`` and ``stderr``, the files each stream goes to; ``log``, the log eaglepatch chose (its private folder)
    when a stream does not go to the original's own file, else null (both kept, appended to as before)."""
    log = started.log_path
    out = started.stdout or log
    kept = set(started.kept)
    # stderr with stdout in the one file kept counts as kept (the host lists it only when that file is not its own log)
    chosen = out if "stdout" not in kept else log if "stderr" not in kept and log != out else None
    return {"stdout": out, "stderr": log, "log": chosen}


def output_words(port: int, started: Started) -> tuple[str, str | None]:
    """Where a relaunched server's output goes, in words: ``its log: /srv/server.log (its own output file,
    appended to as before)``, or ``its log: /tmp/eaglepatch/server-30000.log``; and a note when a stream does not go
    to the original's own file (it had none: a terminal, a pipe, /dev/null; or that file failed a check, and why)."""
    log = started.log_path or ""
    out = started.stdout or log
    kept = set(started.kept)
    if out == log:
        where = f"its log: {shown(log)}" + (" (its own output file, appended to as before)" if "stdout" in kept else "")
    else:
        where = (f"its log: {shown(log)} (its stderr{', appended to as before' if 'stderr' in kept else ''}; its "
                 f"stdout {'appended to' if 'stdout' in kept else 'to'} {shown(out)})")
    if started.notes:
        private = out if "stdout" not in kept else log
        why = "; ".join(shown(n) for n in started.notes)
        return where, (f"the server on :{port} writes its output to {shown(private)}, not to the file it wrote "
                       f"to before: {why}")
    if "stdout" not in kept:
        return where, (f"the server on :{port} wrote its output to no file eaglepatch can append to (a terminal, a "
                       f"pipe, a socket or /dev/null): restarted, it writes it to {shown(out)}")
    return where, None


class _Run:
    """One restart: the shared pieces of the strategies."""

    def __init__(
        self,
        host: Host,
        options: RestartOptions,
        progress: Progress | None,
        python: str,
        clock: Callable[[], float],
        sleep: Callable[[float], None],
        on_started: Callable[[Started], None] | None = None,
        package_dir: str | None = None,
        node: NodeWait | None = None,
    ):
        self.node = node
        self.host, self.options, self.python = host, options, python
        self.say: Progress = progress or (lambda _line: None)
        self.clock, self.sleep = clock, sleep
        self.on_started, self.package_dir = on_started, package_dir
        self.t0 = clock()

    def elapsed(self) -> float:
        return self.clock() - self.t0

    def wait(self, port: int, addr: str, timeout: float, **kwargs: Any) -> Readiness:
        node = self.node
        if node is not None and not node.http:
            return self.watch_node(port, timeout, kwargs.get("pid"), kwargs.get("start"), kwargs.get("log_path"),
                                   kwargs.get("log_offset", 0))
        self.say(f"waiting up to {timeout:.0f} s for sglang on :{port} to be ready")

        def node_sleep(seconds: float) -> None:  # node rank 0: stop at once when another node fails
            if node.verdict() is False or (node.pause(seconds) and node.verdict() is False):
                raise _VerdictFalse

        sleep = self.sleep if node is None else node_sleep
        t0 = self.clock()
        try:
            return wait_until_ready(self.host, port, addr, timeout, self.say, python=self.python,
                                    poll_interval=self.options.poll_interval, clock=self.clock, sleep=sleep, **kwargs)
        except _VerdictFalse:
            return Readiness(ReadyState.TIMEOUT, self.clock() - t0, pid=kwargs.get("pid"),
                             error="another node of this server did not come up")

    def watch_node(self, port: int, timeout: float, pid: int | None, start: int | None, log_path: str | None,
                   log_offset: int) -> Readiness:
        """A node of rank > 0 (it may serve no HTTP): its process watched until the server's verdict (``NodeWait``);
        READY when node rank 0 is ready and this one still runs, DIED when it exits, TIMEOUT when the verdict is
        False, or none came in ``timeout`` + ``VERDICT_GRACE_S`` s (node rank 0's own timeout may end later)."""
        node = self.node
        assert node is not None
        self.say(f"waiting up to {timeout:.0f} s (and {VERDICT_GRACE_S:.0f} s more for node rank 0's own verdict) for "
                 f"node rank 0 of this server to be ready (this node, pid {pid}, serves no health endpoint: its "
                 "process is watched)")
        t0, limit, last = self.clock(), timeout + VERDICT_GRACE_S, {}
        while True:
            try:
                last = call(self.host, self.python, "probe", timeout=60, host="127.0.0.1", port=port, pid=pid,
                            start=start, log_path=log_path, offset=log_offset, http_timeout=1.0)
            except HelperFailed as exc:
                last = {"error": str(exc)}
            elapsed = self.clock() - t0
            verdict = node.verdict()
            if last.get("alive") is False:
                return Readiness(ReadyState.DIED, elapsed, pid=pid, last_line=last.get("last_line"))
            if verdict is True:
                return Readiness(ReadyState.READY, elapsed, pid=pid, last_line=last.get("last_line"))
            if verdict is False or elapsed >= limit:
                return Readiness(ReadyState.TIMEOUT, elapsed, pid=pid, last_line=last.get("last_line"),
                                 error="the server did not come up" if verdict is False else None)
            node.pause(min(self.options.poll_interval, max(0.0, limit - elapsed)))

    def tail(self, log_path: str | None, offset: int = 0) -> str:
        """The server's log tail as every command prints it (the result's ``log_tail``, text and JSON): secrets
        masked (sglang's ``server_args=ServerArgs(... api_key='***')`` line included: eaglepatch.redact)."""
        if not log_path:
            return ""
        return mask_text(read_log_tail(self.host, log_path, offset=offset, lines=LOG_TAIL_LINES, python=self.python))

    # -- default: relaunch what ran (or start a known spec) --------------------------------------------------------

    def relaunch(self, current: ServerProcess | None, spec: LaunchSpec) -> RestartResult:
        if current is not None:
            self.say(
                f"stopping sglang (pid {current.pid}) on :{current.port}: SIGTERM, SIGKILL after "
                f"{self.options.grace:.0f} s; then starting it again"
            )
        self.say(f"starting sglang on :{spec.port}: {shown_argv(spec.argv)} (in {shown(spec.cwd)})")
        # The stop and the start are one request: nothing between them waits on this client.
        answer = call(self.host, self.python, "relaunch",
                      timeout=relaunch_timeout(self.options.grace, self.options.port_timeout),
                      **relaunch_payload(current, spec, self.options.grace, self.options.port_timeout))
        failpoint("restart:after-relaunch")
        return self.finish(current, spec, answer)

    def finish(self, current: ServerProcess | None, spec: LaunchSpec, answer: dict[str, Any]) -> RestartResult:
        """Read a relaunch's answer and wait for the new server; see ``relaunch``."""
        strategy = Strategy.RELAUNCH if current is not None else Strategy.START
        started = started_result(answer.get("start") or {})
        log_path = started.log_path or spec.log_path or None  # the host says where (its default is its own)
        base = dict(strategy=strategy, port=spec.port, log_path=log_path, script=started.script)
        if started.pid is not None and not started.error:
            base["output"] = output_of(started)
        if answer.get("not_stopped"):
            # refused before anything was stopped: the server (if any) runs on as it was
            why = started.error or (f"another sglang server is starting or running on :{spec.port} (pid "
                                    f"{', '.join(map(str, answer.get('busy_pids') or []))})")
            return RestartResult(pid=current.pid if current is not None else None, ready=False,
                                 seconds=self.elapsed(), message=why, untouched=current is not None, **base)
        stopped_pid = None
        if current is not None:
            stop = stop_result(current.pid, answer.get("stop") or {})
            if not stop.ok:
                return RestartResult(
                    pid=None if stop.already_gone else current.pid,
                    ready=False,
                    seconds=self.elapsed(),
                    message=stop.describe() + "; nothing was started",
                    **base,
                )
            stopped_pid = current.pid
            if stop.killed:
                self.say(f"stopped (SIGKILL needed for pid {', '.join(map(str, stop.killed))})")
            else:
                self.say(f"stopped in {stop.seconds:.1f} s")
        if answer.get("busy"):
            return RestartResult(
                pid=None,
                ready=False,
                seconds=self.elapsed(),
                message=f"port {spec.port} is already in use on {self.host.name}: nothing was started",
                stopped_pid=stopped_pid,
                **base,
            )
        if started.error or started.pid is None:
            return RestartResult(
                pid=None,
                ready=False,
                seconds=self.elapsed(),
                message=started.error or "the server did not start",
                log_tail=self.tail(log_path, started.log_offset),
                stopped_pid=stopped_pid,
                **base,
            )
        if self.on_started is not None:
            self.on_started(started)
        # where the host really sent its output: the original's own files, or the log in a private folder
        where, note = output_words(spec.port, started)
        self.say(f"started sglang (pid {started.pid}) on :{spec.port}; {where}")
        if note:
            self.say(f"note: {note}")
        readiness = self.wait(
            spec.port,
            spec.host,
            self.options.timeout,
            log_path=log_path,
            log_offset=started.log_offset,
            pid=started.pid,
            start=started.start,
            api_key=spec.api_key,
        )
        if readiness.ready:
            return RestartResult(
                pid=started.pid,
                ready=True,
                seconds=self.elapsed(),
                message=f"sglang is ready on :{spec.port} (pid {started.pid}) after {readiness.seconds:.0f} s",
                state=readiness.state,
                stopped_pid=stopped_pid,
                start=started.start,
                **base,
            )
        log_tail = self.tail(log_path, started.log_offset)
        # What eaglepatch started and is not ready: after a crash, its orphaned children (TP ranks holding GPU
        # memory) are stopped; after a timeout it is left loading unless told otherwise (a rollback stops it in
        # the same request that starts the original).
        failed = ServerProcess(
            pid=started.pid, argv=list(spec.argv), cwd=spec.cwd, env=None, exe=None, port=spec.port,
            host=spec.host, pgid=started.pid, sid=started.pid, start=started.start,
        )
        stopped_failed = False
        if readiness.state is ReadyState.DIED:
            message = f"sglang (pid {started.pid}) exited during startup after {readiness.seconds:.0f} s"
            stop = stop_server(self.host, failed, grace=self.options.grace, port_timeout=self.options.port_timeout,
                               python=self.python)
            if stop.stopped:
                message += f"; stopped what it left running (pids {', '.join(map(str, stop.stopped))})"
        elif readiness.error and self.node is not None and self.node.verdict() is False:
            message = f"stopped waiting for sglang on :{spec.port} (pid {started.pid}): {readiness.error}"
        else:
            message = (f"sglang on :{spec.port} (pid {started.pid}) was not ready after {readiness.seconds:.0f} s "
                       "(still starting, or hung)")
            if self.options.stop_on_failure:
                self.say(f"stopping the server that did not become ready (pid {started.pid})")
                stop = stop_server(
                    self.host, failed, grace=self.options.grace, port_timeout=self.options.port_timeout,
                    python=self.python,
                )
                stopped_failed = stop.ok
                message += "; stopped it" if stop.ok else "; " + stop.describe()
        return RestartResult(
            pid=started.pid,
            ready=False,
            seconds=self.elapsed(),
            log_tail=log_tail,
            message=message + f" (log: {log_path})",
            state=readiness.state,
            stopped_pid=stopped_pid,
            stopped_failed=stopped_failed,
            start=started.start,
            **base,
        )

    # -- the user's command -------------------------------------------------------------------------------------

    def by_command(self, cmd: str, current: ServerProcess | None, launch: LaunchSpec | None) -> RestartResult:
        known = current or launch
        port = known.port if known is not None else None
        log_path = (launch.log_path if launch is not None else "") or default_log_path(port or DEFAULT_PORT)
        st = self.host.stat(log_path)
        offset = st.size if st is not None else 0
        self.say(f"running the restart command: {mask_command(cmd)} (output to {log_path})")
        # Run as given, with sh. Its output goes to the log, not to this connection: a server it starts in the
        # background must not hold our pipes open (which would keep the command from returning).
        script = 'mkdir -p "$1" && exec >>"$2" 2>&1 </dev/null; exec sh -c "$3"'
        result = self.host.run(
            ["sh", "-c", script, "eaglepatch-restart", posixpath.dirname(log_path), log_path, cmd],
            timeout=self.options.timeout,
        )
        base = dict(strategy=Strategy.RESTART_CMD, log_path=log_path)
        if result.rc != 0:
            why = "timed out" if result.rc == 124 else f"exited {result.rc}"
            err = result.stderr.decode("utf-8", "replace").strip()
            return RestartResult(
                pid=None,
                ready=False,
                seconds=self.elapsed(),
                port=port or DEFAULT_PORT,
                message=f"the restart command {why}" + (f": {mask_text(err.splitlines()[-1])}" if err else ""),
                log_tail=self.tail(log_path, offset),
                **base,
            )
        return self._after_external_restart(base, port, known, current, log_path=log_path, log_offset=offset)

    # -- systemd -----------------------------------------------------------------------------------------------

    def by_systemd(self, unit: str, current: ServerProcess | None, launch: LaunchSpec | None) -> RestartResult:
        known = current or launch
        port = known.port if known is not None else None
        self.say(f"systemctl restart {unit}")
        result = self.host.run(["systemctl", "restart", unit], timeout=self.options.timeout)
        base = dict(strategy=Strategy.SYSTEMD, log_path=None)
        if result.rc != 0:
            err = (result.stderr or result.stdout).decode("utf-8", "replace").strip()
            return RestartResult(
                pid=None,
                ready=False,
                seconds=self.elapsed(),
                port=port or DEFAULT_PORT,
                message=f"systemctl restart {unit} exited {result.rc}"
                + (f": {mask_text(err.splitlines()[-1])}" if err else ""),
                log_tail=self._journal(unit),
                **base,
            )
        main_pid = self._main_pid(unit)
        res = self._after_external_restart(base, port, known, current, pid=main_pid)
        if not res.ready:
            res = dataclasses.replace(res, log_tail=self._journal(unit))
        return res

    def _main_pid(self, unit: str) -> int | None:
        out = self.host.run(["systemctl", "show", "-p", "MainPID", unit], timeout=60)
        text = out.stdout.decode("utf-8", "replace").strip()
        try:
            pid = int(text.partition("=")[2])
        except ValueError:
            return None
        return pid or None

    def _journal(self, unit: str) -> str:
        out = self.host.run(
            ["journalctl", "-u", unit, "-n", str(LOG_TAIL_LINES), "--no-pager", "-o", "cat"], timeout=60
        )
        return mask_text(out.stdout.decode("utf-8", "replace").strip()) if out.ok else ""  # as ``tail``

    # -- shared by the command and systemd ------------------------------------------------------------------------

    def _after_external_restart(
        self,
        base: dict[str, Any],
        port: int | None,
        known: ServerProcess | LaunchSpec | None,
        current: ServerProcess | None,
        *,
        pid: int | None = None,
        log_path: str | None = None,
        log_offset: int = 0,
    ) -> RestartResult:
        addr = known.host if known is not None else DEFAULT_HOST
        api_key = known.api_key if known is not None else None
        if port is None:
            # nothing was known beforehand: look at what the restart started
            found = [s for s in find_servers(self.host, self.python, package_dir=self.package_dir)
                     if pid is None or s.pid == pid]
            if len(found) == 1:
                port, addr, api_key, pid = found[0].port, found[0].host, found[0].api_key, found[0].pid
            else:
                port = DEFAULT_PORT
        remaining = max(1.0, self.options.timeout - self.elapsed())
        readiness = self.wait(
            port,
            addr,
            remaining,
            pid=pid,
            log_path=log_path,
            log_offset=log_offset,
            api_key=api_key,
            old_pid=current.pid if current is not None else None,
            old_start=current.start if current is not None else None,
            discover=pid is None,
        )
        pid = pid or readiness.pid
        if pid is None and readiness.ready:
            pid = next((s.pid for s in find_servers(self.host, self.python, package_dir=self.package_dir)
                        if s.port == port), None)
        if readiness.ready:
            message = f"sglang is ready on :{port}" + (f" (pid {pid})" if pid else "")
        elif readiness.state is ReadyState.OLD_RUNNING:
            old = current.pid if current is not None else "?"
            message = f"the old server (pid {old}) is still running: the restart did not stop it"
        elif readiness.state is ReadyState.DIED:
            message = f"sglang (pid {pid}) exited during startup"
        else:
            message = f"sglang on :{port} was not ready after {readiness.seconds:.0f} s"
        return RestartResult(
            pid=pid,
            ready=readiness.ready,
            seconds=self.elapsed(),
            port=port,
            message=message,
            log_tail="" if readiness.ready else self.tail(log_path, log_offset),
            state=readiness.state,
            stopped_pid=current.pid if current is not None and readiness.state is not ReadyState.OLD_RUNNING else None,
            **base,
        )
