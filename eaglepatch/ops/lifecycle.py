"""The servers of a target's install around apply, revert and restart: which ones, restarting them one by one,
and rolling back when a patched one does not come up.

The servers of a target are those whose own interpreter imports the target's sglang package (the facts hold
them, found on the host); nothing here ever stops or starts another process. With several, every command acts on
all of them unless ``--server-port`` names some. What could leave a host without its server if the client died
halfway runs on the host as one request: each relaunch (stop, then start), and a rollback (the original files
back, then every server stopped and started on them).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

from eaglepatch.errors import RestartFailed, UsageError
from eaglepatch.failpoints import failpoint
from eaglepatch.ops.core import HostFacts, Session, plan_revert
from eaglepatch.server.control import relaunch_payload
from eaglepatch.server.process import LaunchSpec, ServerProcess, select_servers
from eaglepatch.server.restart import RestartOptions, RestartResult, after_relaunch, restart
from eaglepatch.transform.recipe import Recipe

Say = Callable[[str], None]

# A rollback waits at least this long for the original server (a big model loads for minutes), whatever
# --timeout the patched one was given: a too-short --timeout must not cost the host its original server.
ROLLBACK_TIMEOUT_S = 900.0


def servers_of(facts: HostFacts) -> list[ServerProcess]:
    """The running servers of the facts' install."""
    return [ServerProcess.from_scan(item) for item in facts.servers]


def chosen(facts: HostFacts, ports: Sequence[int]) -> list[ServerProcess]:
    """The servers to act on (``--server-port``); raises UsageError for a port without one."""
    return select_servers(servers_of(facts), ports)


def stale(servers: Sequence[ServerProcess], facts: HostFacts) -> list[ServerProcess]:
    """The servers that started before the code on disk last changed (they run what was there before: an
    apply or revert that was cut off before its restart, a --no-restart, --server-port leaving one out)."""
    from eaglepatch.ops.core import CLOCK_SLACK_S

    mtime = facts.code_mtime
    if mtime is None:
        return []
    return [s for s in servers if s.started_at is not None and s.started_at < mtime - CLOCK_SLACK_S]


def custom(ropts: RestartOptions) -> bool:
    """The user said how to restart (``--restart-cmd`` / ``--systemd-unit``)."""
    return ropts.restart_cmd is not None or ropts.systemd_unit is not None


def check_relaunchable(servers: Sequence[ServerProcess], ropts: RestartOptions) -> None:
    """Raise UsageError, before anything changes, for a server that eaglepatch cannot restart by itself."""
    if custom(ropts):
        return
    for srv in servers:
        if not srv.unit:
            srv.launch_spec()  # UsageError: another user's, in a container, a systemd user unit


def manifest_record(servers: Sequence[ServerProcess]) -> list[dict[str, Any]]:
    """What the manifest keeps of each server, so that revert can start one that is gone."""
    out = []
    for srv in servers:
        try:
            launch = srv.launch_spec().to_json() if not srv.systemd else None
        except UsageError:
            launch = None
        out.append({"pid": srv.pid, "start": srv.start, "port": srv.port, "launch": launch,
                    "systemd_unit": srv.unit})
    return out


def left_alone_notes(all_servers: Sequence[ServerProcess], acted: Sequence[ServerProcess], verb: str) -> list[str]:
    """A note for each server of the install that ``--server-port`` left out: it runs the other code now."""
    done = {s.pid for s in acted}
    return [f"the server on :{s.port} (pid {s.pid}) was not restarted (--server-port): it still runs the code "
            f"from before this {verb} until it restarts" for s in all_servers if s.pid not in done]


def restart_each(host: Any, servers: Sequence[ServerProcess], ropts: RestartOptions, python: str,
                 say: Say) -> tuple[list[tuple[ServerProcess, RestartResult]], tuple[ServerProcess, RestartResult] | None]:
    """Restart ``servers`` one after the other (a rolling restart: the next one only once the last is ready);
    return the ones that came up and the first that did not (None when all did). A server that is not ready in
    time is left running (a rollback stops it), one that died is cleaned up."""
    done: list[tuple[ServerProcess, RestartResult]] = []
    for srv in servers:
        if len(servers) > 1:
            say(f"restarting the server on :{srv.port} (pid {srv.pid})")
        res = restart(host, current=srv, options=dataclasses.replace(ropts, stop_on_failure=False), progress=say,
                      python=python)
        if not res.ready:
            return done, (srv, res)
        done.append((srv, res))
    return done, None


def rollback(t: Any, refetch: Callable[[], HostFacts], recipe: Recipe, session: Session, ropts: RestartOptions,
             servers: Sequence[ServerProcess], failed: RestartResult, say: Say) -> RestartFailed:
    """The patched server did not come up: put the original files back and start the original servers
    (``servers``: those apply restarted, the failed one last) on them, in one request on the host; wait for them
    with a generous timeout. Returns the RestartFailed to raise, whose message says what came back (and, for a
    server that did not, the exact command line and folder to start it)."""
    name = t.spec.name
    say(f"{name}: the patched server is not ready ({failed.message}); rolling back")
    if failed.log_tail:
        say(failed.log_tail)
    failpoint("rollback:before")
    fresh = refetch()
    session.facts = fresh
    plan = plan_revert(fresh, recipe, force=True)
    running = {s.port: s for s in servers_of(fresh)}
    slow = dataclasses.replace(ropts, timeout=max(ropts.timeout, ROLLBACK_TIMEOUT_S), stop_on_failure=False)
    pairs = []  # (what runs on the port now, the original's launch spec)
    by_unit = []
    for srv in servers:
        if srv.unit:
            by_unit.append(srv)
        else:
            pairs.append((running.get(srv.port), srv.launch_spec()))
    then = {"batch": [relaunch_payload(cur, spec, slow.grace, slow.port_timeout) for cur, spec in pairs]}
    res = session.execute(plan, then=then if pairs else None)
    failpoint("rollback:after-relaunch")
    answers = (res.get("then") or {}).get("batch") or []
    outcomes: list[tuple[int, LaunchSpec | None, RestartResult]] = []
    for (cur, spec), answer in zip(pairs, answers):
        outcomes.append((spec.port, spec, after_relaunch(t.host, cur, spec, answer, options=slow, progress=say,
                                                         python=fresh.python)))
    for srv in by_unit:
        outcomes.append((srv.port, None, restart(t.host, current=running.get(srv.port), options=slow,
                                                 progress=say, python=fresh.python)))
    down = [(port, spec, r) for port, spec, r in outcomes if not r.ready]
    head = f"{name}: the patched server was not ready within {ropts.timeout:.0f} s; original files restored; "
    if not down:
        return RestartFailed(head + ("the original server is up again" if len(outcomes) == 1
                                     else f"the {len(outcomes)} original servers are up again"))
    parts = []
    for port, spec, r in down:
        how = f"to start it yourself: {spec.command_line()}" if spec is not None else "check its unit"
        parts.append(f"the original server on :{port} did NOT come back up within {slow.timeout:.0f} s "
                     f"({r.message}); {how}")
    return RestartFailed(head + "; ".join(parts))
