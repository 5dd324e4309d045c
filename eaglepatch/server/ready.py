"""Readiness: poll the server's health endpoint from the host itself until it answers 200, dies, or time runs out.

The port is usually not reachable from where eaglepatch runs, so each poll is one small program run on the host
over the existing connection (``hostside.probe.op_probe``): it checks the process is alive, asks ``GET /health_generate``
(``/ready`` where that is what exists), and reads the last line of the server log for the progress display.
"""

from __future__ import annotations

import dataclasses
import enum
import time
from typing import Callable

from eaglepatch.errors import HelperFailed
from eaglepatch.hosts.agent import call
from eaglepatch.hosts.base import Host
from eaglepatch.server.process import probe_address

Progress = Callable[[str], None]

# a single /health_generate runs a 1-token generation: on a busy server it may take a while
HTTP_TIMEOUT = 20.0
# the first pause between polls; each later one doubles, up to the poll interval
FIRST_POLL_S = 0.125


class ReadyState(enum.Enum):
    READY = "ready"
    TIMEOUT = "timeout"  # still starting (or hung) when the time ran out
    DIED = "died"  # the server process exited
    OLD_RUNNING = "old-running"  # the server being replaced never went away


@dataclasses.dataclass(frozen=True)
class Readiness:
    """How waiting ended: the state, after how long, the last HTTP answer, and the last log line seen."""

    state: ReadyState
    seconds: float
    pid: int | None = None  # the server process watched (given, or found on the port with ``discover``)
    status: int | None = None
    error: str | None = None
    last_line: str | None = None

    @property
    def ready(self) -> bool:
        return self.state is ReadyState.READY


def wait_until_ready(
    host: Host,
    port: int,
    hostaddr: str = "127.0.0.1",
    timeout: float = 900.0,
    progress: Progress | None = None,
    log_path: str | None = None,
    pid: int | None = None,
    *,
    python: str = "python3",
    poll_interval: float = 1.0,
    log_offset: int = 0,
    api_key: str | None = None,
    start: int | None = None,
    old_pid: int | None = None,
    old_start: int | None = None,
    discover: bool = False,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Readiness:
    """Poll until the server on ``hostaddr:port`` (as seen from the host) is ready; return how that ended.

    Polls come after 0.125 s, then 0.25, 0.5, ... up to ``poll_interval`` apart.
    Ready: ``GET /health_generate`` answers 200 (or ``/ready`` answers 200 when ``/health_generate`` is 404).
    503, a refused connection or a slow answer mean still starting. When ``pid`` is given and that process is
    gone, waiting stops at once (DIED). While ``old_pid`` (the server being replaced) still runs, its answers do
    not count. With ``discover`` and no ``pid``, the launcher found listening for ``port`` (by its command line) is
    watched from then on, so its death ends the wait too. ``progress`` gets one line per poll. Raises
    ``Unsupported`` only when ``python`` cannot run on the host at all (and ``ConnectionFailed`` when the
    connection breaks); a poll that fails otherwise (``HelperFailed``) counts as "not ready yet".
    """
    t0 = clock()
    deadline = t0 + timeout
    addr = probe_address(hostaddr)
    last: dict = {}
    polls = 0
    while True:
        now = clock()
        http_timeout = max(1.0, min(HTTP_TIMEOUT, deadline - now))
        payload = {
            "host": addr,
            "port": port,
            "pid": pid,
            "start": start,
            "old_pid": old_pid,
            "old_start": old_start,
            "log_path": log_path,
            "offset": log_offset,
            "api_key": api_key,
            "http_timeout": http_timeout,
            "discover": discover and not pid,
        }
        try:
            last = call(host, python, "probe", timeout=http_timeout * 2 + 30, **payload)
        except HelperFailed as exc:  # not Unsupported: the interpreter itself is missing, no point in polling on
            last = dict(last, error=str(exc), status=None)
        if not pid and last.get("found_pid"):
            pid, start = last["found_pid"], last.get("found_start")
        elapsed = clock() - t0
        if last.get("alive") is False:
            return _done(ReadyState.DIED, elapsed, last, pid)
        if last.get("status") == 200 and not last.get("old_alive"):
            return _done(ReadyState.READY, elapsed, last, pid)
        if progress is not None:
            progress(_progress_line(port, elapsed, last, old_pid))
        if clock() >= deadline:
            state = ReadyState.OLD_RUNNING if last.get("old_alive") else ReadyState.TIMEOUT
            return _done(state, elapsed, last, pid)
        # Quick polls first (a server that restarts in a second is not kept waiting for a 2 s tick), then
        # doubling up to poll_interval: a model that loads for minutes is asked every poll_interval.
        sleep(max(0.0, min(FIRST_POLL_S * 2 ** polls, poll_interval, deadline - clock())))
        polls += 1


def _done(state: ReadyState, elapsed: float, last: dict, pid: int | None) -> Readiness:
    return Readiness(
        state=state,
        seconds=elapsed,
        pid=pid,
        status=last.get("status"),
        error=last.get("error"),
        last_line=last.get("last_line"),
    )


def _progress_line(port: int, elapsed: float, last: dict, old_pid: int | None) -> str:
    """``waiting for sglang on :30000 (42 s) last log: <line>``; the HTTP answer instead when there is no log."""
    line = f"waiting for sglang on :{port} ({elapsed:.0f} s)"
    if last.get("old_alive"):
        line += f" the old server (pid {old_pid}) is still running;"
    if last.get("last_line"):
        return line + f" last log: {_clip(last['last_line'])}"
    if last.get("status") is not None:
        return line + f" {last.get('endpoint') or '/health_generate'}: {last['status']}"
    if last.get("error"):
        return line + f" {last['error']}"
    return line


def _clip(text: str, width: int = 160) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."
