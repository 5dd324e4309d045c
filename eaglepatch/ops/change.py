"""apply, revert and restart on one target, end to end: facts, the plan, the plan carried out under the install's
lock, the servers restarted (``eaglepatch.ops.lifecycle``); and their renderings. The TARGETs that run the nodes of
one multi-node server do each of these together (``eaglepatch.ops.together``, with ``eaglepatch.ops.nodes``). Every failure is a typed error (``eaglepatch.errors``) and leaves the target as it
was, or as it was before the command."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from eaglepatch import progress
from eaglepatch.errors import RestartFailed, UsageError
from eaglepatch.failpoints import failpoint
from eaglepatch.hosts.agent import call
from eaglepatch.hosts.base import Host
from eaglepatch.hosts.spec import TargetSpec
from eaglepatch.ops import nodes
from eaglepatch.ops.facts import HostFacts
from eaglepatch.ops.options import RuntimeOptions, worker_timer
from eaglepatch.ops.plan import change_doc, plan_apply, plan_revert
from eaglepatch.ops.session import Session, new_lock_owner
from eaglepatch.ops.nodes import lifecycle
from eaglepatch.ops.target import Connect, Target, target_facts
from eaglepatch.redact import shown
from eaglepatch.transform.recipe import Recipe, builtin_recipe

Say = Callable[[str], None]


def render_change(doc: dict[str, Any]) -> str:
    """apply's or revert's one line: what changed, in which files, and whether the server restarted (``--dry-run``: the
    diff)."""
    if doc.get("dry_run"):
        return doc.get("diff", "")
    verb = doc.get("action", "apply")
    what = "changed" if doc["changed"] else "nothing to change"
    files = ", ".join(f["path"] for f in doc["files"]) or "no files"
    tail = "; server restarted and ready" if doc["restarted"] else ""
    return f"{doc['target']}: {verb}: {what} ({files}){tail}"


def apply(spec: TargetSpec, c: Connect, recipe: Recipe, ropts: RuntimeOptions, restart: Any, dry_run: bool,
          say: Say, meeting: nodes.Meeting | None = None) -> dict[str, Any]:
    """``apply`` on one target: the worker files instrumented under the install's lock, then (``restart``) its servers
    restarted, rolled back if one does not come up; returns the ``apply --json`` document. ``meeting``: the other
    TARGETs of the command, met before anything changes (``eaglepatch.ops.nodes``)."""
    lc = lifecycle()
    with Target(spec, c) as t:
        owner = None if dry_run else new_lock_owner("apply")
        facts = target_facts(t, recipe, owner)  # takes the lock in the same round trip (not for --dry-run)
        session = Session(t.host, facts.python, facts)
        denied = facts.cannot_write()
        if owner is not None and not denied:
            session.lock(owner)
        try:
            if owner is not None and not denied:
                failpoint("apply:after-lock")
            everyone = lc.servers_of(facts)
            servers = lc.chosen(facts, c.facts.server_ports)
            down = _recorded_nodes(facts, c.facts.server_ports) if restart is not None and not dry_run else []
            if down:  # a node left down by a revert or restart that did not come up: started first, then patched
                where = f"--dist-init-addr {shown(str(down[0].nodes.dist_init_addr))}"
                raise UsageError(f"{t.spec.name}: node rank {down[0].nodes.rank} of a multi-node server ({where}) on "
                                 f":{down[0].port} is recorded in this install's manifest but does not run; nothing "
                                 "was changed: start every node "
                                 "first ('eaglepatch restart' naming every node starts it from its record), then "
                                 "apply, or pass --no-restart")
            named = (meeting or nodes.alone(spec)).arrive(spec, servers)
            plan = plan_apply(facts, recipe, ropts, servers=[*lc.manifest_record(everyone), *_kept_record(facts)])
            for n in plan.notes:
                say(f"note: {n}")
            if not dry_run and restart is not None and nodes.complete(servers, named):
                nodes.check(servers, named, "apply", t.spec.name)  # a prefill/decode half alone: exit 2 here
                group = (meeting or nodes.alone(spec)).group(spec, servers)
                if group is not None:
                    from eaglepatch.ops.together import apply_together

                    return apply_together(t, recipe, session, plan, group, restart, servers, everyone, denied, say,
                                           ropts.mode)
            if dry_run:
                steps = [f"write {w.rel} ({'new' if w.before is None else 'replace'}, {len(w.data or b'')} bytes)"
                         for w in plan.writes]
                for s in steps or ["nothing to do: already patched"]:
                    say(f"plan: {s}")
                if plan.changed:
                    what = "no restart" if restart is None else (
                        "restart " + (", ".join(f"the server on :{s.port} (pid {s.pid})" for s in servers)
                                      or "nothing (no server of this install runs)"))
                    say(f"plan: back up originals to {facts.backup_dir}, then {what}")
                return change_doc(t.spec.name, plan, False, False, dry_run=True, diff=plan.diff(), action="apply")
            if not plan.changed:
                say(f"{t.spec.name}: already patched: nothing to change")
                behind = lc.stale(servers, facts) if restart is not None else []
                restarted: list[Any] = []
                if behind and denied:
                    # a patched server that fails would need the files reverted, which this user cannot do
                    say(f"note: {denied.split(': ', 1)[1]}: the server(s) that still run the original code were not "
                        "restarted")
                elif behind:
                    # an apply cut off before its restart, or --no-restart: the servers still run the original code
                    say(f"{t.spec.name}: " + ", ".join(f"the server on :{s.port} (pid {s.pid})" for s in behind)
                        + " started before the files were patched: restarting it")
                    nodes.check(behind, named, "apply", t.spec.name)
                    lc.check_relaunchable(behind, restart)
                    restarted = _restart_after_apply(t, recipe, session, behind, restart, say)
                    progress.stage(t.spec.text, "files patched, server restarted and ready")
                return change_doc(t.spec.name, plan, False, restarted, action="apply")
            if denied:
                raise UsageError(denied)
            if restart is not None:  # before anything changes
                nodes.check(servers, named, "apply", t.spec.name)
                lc.check_relaunchable(servers, restart)
            for cls, family_timer in plan.timers:
                timer, why = worker_timer(ropts.mode, family_timer)
                say(f"timer: {cls}: {timer} ({why})")
            progress.stage(t.spec.text, "files being patched (the host finishes it, or puts every byte back)")
            # Without a restart, the lock is released by the same round trip that carries out the plan.
            session.execute(plan, release=restart is None)
            progress.stage(t.spec.text, "files patched, server not restarted (it runs the original code)")
            failpoint("apply:after-execute")
            if plan.worker_writes:
                say(f"{t.spec.name}: patched {plan.worker_writes} file(s); originals in {facts.backup_dir}")
            else:
                say(f"{t.spec.name}: the runtime's configuration changed; the worker files were already patched")
            restarted = []
            if restart is not None:
                restarted = _restart_after_apply(t, recipe, session, servers, restart, say)
                progress.stage(t.spec.text, "files patched" + (", server restarted and ready" if restarted else ""))
                for n in lc.left_alone_notes(everyone, servers, "apply"):
                    say(f"note: {n}")
            elif everyone:
                say("note: not restarted (--no-restart): the running server(s) run the original code until they "
                    "restart")
            return change_doc(t.spec.name, plan, True, restarted, action="apply")
        finally:
            session.unlock()


def _no_server_note(say: Say, name: str, verb: str) -> None:
    say(f"{name}: {verb}; no sglang server of this install is running, so nothing was restarted: start it "
        "(python -m sglang.launch_server ...) and the patch takes effect")


def _restart_after_apply(t: Target, recipe: Recipe, session: Session, servers: Sequence[Any], ropts: Any,
                         say: Say) -> list[Any]:
    """The servers restarted on the patched files: their RestartResults (empty when none runs). Raises the
    rollback's RestartFailed when one does not come up."""
    from eaglepatch.server.restart import restart

    lc = lifecycle()
    facts = session.facts
    rolling_back = "the patched server did not come up: rolling back (the original files and server being put back)"
    if lc.custom(ropts):
        # the user's command or unit restarts what it restarts: run it once, watch the first server
        progress.stage(t.spec.text, "files patched, server restarting")
        res = restart(t.host, current=servers[0] if servers else None, options=ropts, progress=say,
                      python=facts.python)
        if res.ready:
            return [res]
        progress.stage(t.spec.text, rolling_back)
        raise lc.rollback(t, lambda: target_facts(t, recipe), recipe, session, ropts, list(servers[:1]), res, say)
    if not servers:
        _no_server_note(say, t.spec.name, "patched")
        return []
    progress.stage(t.spec.text, "files patched, server restarting")
    done, failed = lc.restart_each(t.host, servers, ropts, facts.python, say)
    if failed is None:
        return [res for _srv, res in done]
    progress.stage(t.spec.text, rolling_back)
    raise lc.rollback(t, lambda: target_facts(t, recipe), recipe, session, ropts,
                      [srv for srv, _ in done] + [failed[0]], failed[1], say)


def revert(spec: TargetSpec, c: Connect, recipe: Recipe, force: bool, restart: Any, say: Say,
           meeting: nodes.Meeting | None = None) -> dict[str, Any]:
    """``revert`` on one target: the original bytes back under the install's lock, then (``restart``) its servers
    restarted in the same request; returns the ``revert --json`` document. ``meeting`` as for ``apply``."""
    lc = lifecycle()
    with Target(spec, c) as t:
        owner = new_lock_owner("revert")
        # takes the lock in the same round trip; revert parses a file only when the manifest cannot vouch for it
        facts = target_facts(t, recipe, owner, transform=False)
        session = Session(t.host, facts.python, facts)
        denied = facts.cannot_write()
        if not denied:
            session.lock(owner)
        try:
            plan = plan_revert(facts, recipe, force=force)
            everyone = lc.servers_of(facts)
            chosen = lc.chosen(facts, c.facts.server_ports)
            # With code to put back, every chosen server restarts; without, only those still running the code from
            # before the last change (a revert cut off before its restart, or --no-restart).
            servers = chosen if plan.files else lc.stale(chosen, facts)
            gone = (_recorded_nodes(facts, c.facts.server_ports)
                    if (plan.files or _is_record(facts.manifest)) and restart is not None else [])
            named = (meeting or nodes.alone(spec)).arrive(spec, [*chosen, *gone])
            if restart is not None and nodes.complete([*chosen, *gone], named):
                nodes.check([*chosen, *gone], named, "revert", t.spec.name)  # a prefill/decode half alone: exit 2
                group = (meeting or nodes.alone(spec)).group(spec, [*chosen, *gone])
                if group is not None:
                    from eaglepatch.ops.together import revert_together

                    return revert_together(t, session, plan, group, restart, denied, say)
            if not plan.changed:
                say(f"{t.spec.name}: not patched: nothing to revert")
                if restart is None or not servers:
                    return change_doc(t.spec.name, plan, False, False, action="revert")
                say(f"{t.spec.name}: " + ", ".join(f"the server on :{s.port} (pid {s.pid})" for s in servers)
                    + " started before the files last changed: restarting it")
            elif denied:
                raise UsageError(denied)
            wants = restart is not None and (bool(plan.files) or bool(servers))
            if wants:
                nodes.check(servers, named, "revert", t.spec.name)  # before anything changes
            pairs, units = _revert_relaunches(t, facts, servers, c.facts.server_ports, restart, say,
                                              recorded=bool(plan.files)) if wants else ([], [])
            from eaglepatch.server.control import relaunch_payload, relaunch_timeout

            then = {"batch": [relaunch_payload(cur, spec, restart.grace, restart.port_timeout)
                              for cur, spec in pairs]} if pairs else None
            if plan.changed:
                progress.stage(t.spec.text, "files being reverted (the host finishes it, or puts every byte back)"
                               + (", then the server restarted, in the same request" if then else ""))
                res = session.execute(plan, release=not wants, then=then,
                                      then_timeout=relaunch_timeout(restart.grace, restart.port_timeout, len(pairs))
                                      if pairs else 0.0)
                progress.stage(t.spec.text, "files reverted" + (", server restarting" if wants else ""))
                failpoint("revert:after-execute")
                for n in plan.notes:
                    say(f"note: {n}")
                say(f"{t.spec.name}: reverted {len(plan.files)} file(s)")
            else:  # nothing to write: the relaunches alone, in one request
                progress.stage(t.spec.text, "server restarting")
                res = {"then": call_relaunch(t.host, facts.python, then, restart)} if then else {}
            restarted: list[Any] = []
            if wants:
                restarted = _restart_after_revert(t, facts, restart, pairs, units, res, say)
                progress.stage(t.spec.text, ("files reverted" if plan.changed else "not patched")
                               + (", server restarted and ready" if restarted else ""))
                for n in lc.left_alone_notes(everyone, chosen, "revert"):
                    say(f"note: {n}")
            return change_doc(t.spec.name, plan, plan.changed, restarted, action="revert")
        finally:
            session.unlock()


def call_relaunch(host: Host, python: str, then: dict[str, Any], ropts: Any) -> Any:
    """A batch of relaunches in one request on the host (nothing to write with them)."""
    from eaglepatch.server.control import relaunch_timeout

    n = len(then.get("batch") or ())
    return call(host, python, "relaunch", timeout=relaunch_timeout(ropts.grace, ropts.port_timeout, n), **then)


def _revert_relaunches(t: Target, facts: HostFacts, servers: Sequence[Any], ports: Sequence[int], ropts: Any,
                       say: Say, recorded: bool) -> tuple[list[tuple[Any, Any]], list[tuple[Any, Any]]]:
    """What revert restarts: ``(current, launch spec)`` pairs that the host relaunches in the same request as
    the revert (with ``recorded``, a server apply recorded that is gone now is started from its recorded spec),
    and ``(current, options)`` for the servers that systemd runs. Raises UsageError, before anything changes, for
    a server that cannot be restarted."""
    lc = lifecycle()
    if lc.custom(ropts):
        return [], []
    lc.check_relaunchable(servers, ropts)
    pairs = [(srv, srv.launch_spec()) for srv in servers if not srv.unit]
    units = [(srv, ropts) for srv in servers if srv.unit]
    for spec, opts in lc.recorded_gone(facts, ports, ropts, say, t.spec.name) if recorded else ():
        if spec is not None:
            pairs.append((None, spec))
        else:
            units.append((None, opts))
    return pairs, units


def _restart_after_revert(t: Target, facts: HostFacts, ropts: Any, pairs: Sequence[tuple[Any, Any]],
                          units: Sequence[tuple[Any, Any]], res: dict[str, Any], say: Say) -> list[Any]:
    """Wait for the servers revert restarted; their RestartResults (empty when none was). Raises RestartFailed when
    one is not ready."""
    from eaglepatch.server.restart import after_relaunch, restart

    lc = lifecycle()
    results = []
    if lc.custom(ropts):
        servers = lc.servers_of(facts)
        results.append(restart(t.host, current=servers[0] if servers else None, options=ropts, progress=say,
                               python=facts.python, package_dir=facts.package_dir))
    answers = (res.get("then") or {}).get("batch") or []
    for (cur, spec), answer in zip(pairs, answers):
        results.append(after_relaunch(t.host, cur, spec, answer, options=ropts, progress=say, python=facts.python))
    for cur, opts in units:
        results.append(restart(t.host, current=cur, options=opts, progress=say, python=facts.python,
                               package_dir=facts.package_dir))
    if not results:
        _no_server_note(say, t.spec.name, "reverted")
        return []
    bad = [r for r in results if not r.ready]
    if bad:
        raise RestartFailed(f"{t.spec.name}: files reverted, but the server was not ready within "
                            f"{ropts.timeout:.0f} s: {bad[0].message}\n{bad[0].log_tail}".rstrip())
    return results


def restart_target(spec: TargetSpec, c: Connect, ropts: Any, say: Say,
                   meeting: nodes.Meeting | None = None) -> dict[str, Any]:
    """``restart`` on one target: its servers (those apply recorded, when none runs) restarted one by one under the
    install's lock; returns the ``restart --json`` document. ``meeting`` as for ``apply``."""
    from eaglepatch.server.restart import NoServerRunning, restart

    lc = lifecycle()
    with Target(spec, c) as t:
        owner = new_lock_owner("restart")
        facts = target_facts(t, builtin_recipe(), owner, transform=False)
        session = Session(t.host, facts.python, facts)
        if not facts.cannot_write():
            session.lock(owner)  # no apply, revert or sweep of this install restarts its servers meanwhile
        try:
            servers = lc.chosen(facts, c.facts.server_ports)
            gone = _recorded_nodes(facts, c.facts.server_ports) if not servers else []
            acting = [*servers, *gone]
            nodes.check(acting, (meeting or nodes.alone(spec)).arrive(spec, acting), "restart", t.spec.name)
            group = (meeting or nodes.alone(spec)).group(spec, acting)
            if group is not None:
                from eaglepatch.ops.together import restart_together

                return restart_together(t, session, group, ropts, say)
            lc.check_relaunchable(servers, ropts)
            jobs: list[tuple[Any, Any, Any]] = [(srv, None, ropts) for srv in servers]
            if not servers and not lc.custom(ropts):
                # none runs: the ones apply recorded (a crash, or a run killed between a stop and a start)
                jobs = [(None, spec, opts) for spec, opts in
                        lc.recorded_gone(facts, c.facts.server_ports, ropts, say, t.spec.name)]
                if not jobs:
                    raise NoServerRunning(t.spec.name)
            if lc.custom(ropts):
                jobs = jobs[:1] or [(None, None, ropts)]
            results = []
            for cur, launch, opts in jobs:
                progress.stage(t.spec.text, "server restarting")
                res = restart(t.host, current=cur, launch=launch, options=opts, progress=say, python=facts.python,
                              package_dir=facts.package_dir)
                progress.stage(t.spec.text, "server restarted and ready" if res.ready else "server not ready")
                if not res.ready:
                    raise RestartFailed(f"{t.spec.name}: not ready within {opts.timeout:.0f} s: {res.message}\n"
                                        f"{res.log_tail}".rstrip())
                results.append(res.to_json())
            doc = dict(results[0])
            doc["target"] = t.spec.name
            doc["servers"] = results
            return doc
        finally:
            session.unlock()


def render_restart(doc: dict[str, Any]) -> str:
    """One line per restarted server: how, its pid and port, how long it took to be ready."""
    return "\n".join(f"{doc['target']}: restarted ({r['strategy']}), pid {r['pid']} on :{r['port']}, ready in "
                     f"{r['seconds']:.1f} s" for r in doc.get("servers") or [doc])


# -- the nodes of a multi-node server, together (eaglepatch.ops.nodes) ------------------------------------------------

def _recorded_nodes(facts: HostFacts, ports: Sequence[int]) -> list[nodes.Recorded]:
    """The nodes of multi-node servers that apply recorded and that no server of the install replaces now."""
    running = {s.port for s in lifecycle().servers_of(facts)}
    out = []
    for rec in facts.manifest_servers():
        r = nodes.Recorded.of(rec)
        if r is not None and r.nodes is not None and r.port not in running and (not ports or r.port in ports):
            out.append(r)
    return out


RECORD = nodes.RECORD
_is_record = nodes.is_record


def _kept_record(facts: HostFacts) -> list[dict[str, Any]]:
    """The launches a restart record keeps of servers that do not run now (an apply made while the nodes of a
    killed restart are down keeps them in its manifest: restart and revert start them from there)."""
    running = {s.port for s in lifecycle().servers_of(facts)}
    return [r for r in facts.manifest_servers() if r.get("port") not in running] if _is_record(facts.manifest) else []
