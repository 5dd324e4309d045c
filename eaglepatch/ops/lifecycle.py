"""The servers of a target's install around apply, revert and restart: which ones, restarting them one by one,
and rolling back when a patched one does not come up.

The servers of a target are those whose own interpreter imports the target's sglang package (the facts hold
them, found on the host); nothing here ever stops or starts another process. With several, every command acts on
all of them unless ``--server-port`` names some. What could leave a host without its server if the client died
halfway runs on the host as one request: each relaunch (stop, then start), and a rollback (the original files
back, then every server stopped and started on them). A node of a multi-node server rolls back with the other
nodes (``eaglepatch.ops.nodes``: ``rollback``'s ``together``), stopped before any original starts.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

from eaglepatch.errors import RestartFailed, UsageError
from eaglepatch.failpoints import failpoint
from eaglepatch.ops.facts import HostFacts, code_state
from eaglepatch.ops.plan import plan_revert
from eaglepatch.ops.session import Session
from eaglepatch.server.control import relaunch_payload, relaunch_timeout
from eaglepatch.server.process import LaunchSpec, ServerProcess, select_server, select_servers
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


def launch_of(facts: HostFacts, ports: Sequence[int] = ()) -> ServerProcess | None:
    """The one server of the install to load or sweep (``--server-port`` picks among several), or None; raises
    UsageError when several run and no port says which."""
    return select_server(chosen(facts, ports))


def stale(servers: Sequence[ServerProcess], facts: HostFacts) -> list[ServerProcess]:
    """The servers that started before the code on disk last changed (they run what was there before: an
    apply or revert that was cut off before its restart, a --no-restart, --server-port leaving one out)."""
    return [s for s in servers if code_state(s.started_at, facts) == "stale"]


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


def recorded_gone(facts: HostFacts, ports: Sequence[int], ropts: RestartOptions, say: Say,
                  name: str) -> list[tuple[LaunchSpec | None, RestartOptions]]:
    """The servers apply recorded that no server of the install replaces now (it crashed, or was stopped):
    ``(launch spec, options)`` to start each (a systemd server: no spec, its unit in the options)."""
    running = {s.port for s in servers_of(facts)}
    out: list[tuple[LaunchSpec | None, RestartOptions]] = []
    for rec in facts.manifest_servers():
        port = rec.get("port")
        if port in running or (ports and port not in ports) or not (rec.get("launch") or rec.get("systemd_unit")):
            continue
        say(f"{name}: no server of this install runs on :{port}; starting the one recorded at apply time")
        if rec.get("launch"):
            out.append((LaunchSpec.from_json(rec["launch"]), ropts))
        else:
            out.append((None, dataclasses.replace(ropts, systemd_unit=rec["systemd_unit"])))
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
             servers: Sequence[ServerProcess], failed: RestartResult, say: Say, together: Any = None) -> RestartFailed:
    """The patched server did not come up: put the original files back and start the original servers
    (``servers``: those apply restarted, the failed one last) on them, in one request on the host; wait for them
    with a generous timeout, never stopping one that is only slow. With ``--restart-cmd``/``--systemd-unit``,
    the files go back and the same command runs again. Returns the RestartFailed to raise, whose message says what
    came back (and, for a server that did not, how to start it by hand). ``together``: this server is one node of a
    multi-node server whose nodes roll back together (``nodes.RollbackTogether``: every node stopped before any
    original starts, node rank 0's readiness the server's)."""
    name = t.spec.name
    say(f"{name}: the patched server is not ready ({failed.message}); rolling back")
    if failed.log_tail:
        say(failed.log_tail)
    failpoint("rollback:before")
    try:
        return _rollback(t, refetch, recipe, session, ropts, servers, failed, say, together)
    except BaseException:
        if together is not None:
            together.failed()  # the other nodes stop waiting for this one
        raise


def _rollback(t: Any, refetch: Callable[[], HostFacts], recipe: Recipe, session: Session, ropts: RestartOptions,
              servers: Sequence[ServerProcess], failed: RestartResult, say: Say, together: Any) -> RestartFailed:
    name = t.spec.name
    if together is not None:
        together.prepare()
    fresh = refetch()
    session.facts = fresh
    plan = plan_revert(fresh, recipe, force=True)
    running = {s.port: s for s in servers_of(fresh)}
    slow = dataclasses.replace(ropts, timeout=max(ropts.timeout, ROLLBACK_TIMEOUT_S), stop_on_failure=False)
    pairs = []  # (what runs on the port now, the original's launch spec): relaunched with the revert
    by_command = []  # (port, what runs there now, the options that restart it): after the revert
    if custom(ropts):
        by_command = [(s.port, running.get(s.port), slow) for s in servers[:1]] or [(None, None, slow)]
    else:
        for srv in servers:
            if srv.unit:
                by_command.append((srv.port, running.get(srv.port), dataclasses.replace(slow, systemd_unit=srv.unit)))
            else:
                pairs.append((running.get(srv.port), srv.launch_spec()))
    batch = [relaunch_payload(cur, spec, slow.grace, slow.port_timeout) for cur, spec in pairs]
    res = session.execute(plan, then={"batch": batch} if batch else None,
                          then_timeout=relaunch_timeout(slow.grace, slow.port_timeout, len(batch)))
    failpoint("rollback:after-relaunch")
    outcomes: list[tuple[int | None, RestartResult]] = []
    for (cur, spec), answer in zip(pairs, (res.get("then") or {}).get("batch") or []):
        r = after_relaunch(t.host, cur, spec, answer, options=slow, progress=say, python=fresh.python,
                           node=together.wait if together is not None else None)
        if together is not None:
            together.settled(r)
        outcomes.append((spec.port, r))
    if together is not None and not pairs:
        together.failed()  # nothing of this node was started: the server cannot come up
    for port, cur, opts in by_command:
        outcomes.append((port, restart(t.host, current=cur, options=opts, progress=say, python=fresh.python,
                                       package_dir=fresh.package_dir)))
    if together is not None:  # one node of a multi-node server: say which node failed, and how
        head = f"{name}: the patched multi-node server did not come up ({failed.message}); original files restored; "
    elif failed.untouched:  # the server was never stopped: no patched server ran
        head = f"{name}: the server could not be restarted ({failed.message}); original files restored; "
    else:
        head = f"{name}: the patched server was not ready within {ropts.timeout:.0f} s; original files restored; "
    down = [(port, r) for port, r in outcomes if not r.ready and not r.untouched]
    kept = [(port, r) for port, r in outcomes if r.untouched]
    if not outcomes:
        return RestartFailed(head + "no server was running to start again")
    clauses = [f"the original server on :{port} (pid {r.pid}) was never stopped and runs on" for port, r in kept]
    if not down and len(kept) < len(outcomes):
        up = len(outcomes) - len(kept)
        clauses.insert(0, "the original server is up again" if up == 1 else f"the {up} original servers are up again")
    clauses += [not_back(port, r, slow.timeout) for port, r in down]
    return RestartFailed(head + "; ".join(clauses))


def not_back(port: int | None, r: RestartResult, timeout: float) -> str:
    """One clause for a server that did not come back: still loading (wait for it), or down (how to start it)."""
    where = f"the original server on :{port}" if port else "the original server"
    by_hand = f"start it yourself with: sh {r.script}" if r.script else "start it yourself"
    if r.state is not None and r.state.value == "timeout" and r.pid is not None:
        return (f"{where} is still starting after {timeout:.0f} s (pid {r.pid}, log {r.log_path}): wait for it; if "
                f"it stops, {by_hand}")
    return f"{where} did NOT come back up ({r.message}); {by_hand}"
