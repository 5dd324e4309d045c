"""apply, revert and restart on one target, end to end: facts, the plan, the plan carried out under the install's
lock, the servers restarted (``eaglepatch.ops.lifecycle``); and their renderings. The TARGETs that run the nodes of
one multi-node server do each of these together (``_apply_together``, ``_revert_together``, ``_restart_together``
with ``eaglepatch.ops.nodes``). Every failure is a typed error (``eaglepatch.errors``) and leaves the target as it
was, or as it was before the command."""

from __future__ import annotations

import dataclasses
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
from eaglepatch.ops.plan import Plan, plan_apply, plan_revert
from eaglepatch.ops.session import Session, new_lock_owner
from eaglepatch.ops.target import Connect, Target, target_facts
from eaglepatch.transform.recipe import Recipe, builtin_recipe

Say = Callable[[str], None]


def _change_doc(target: str, plan: Plan, changed: bool, restarted: Sequence[Any] | bool,
                **extra: Any) -> dict[str, Any]:
    """apply's and revert's JSON document. ``restarted``: the RestartResults of the servers restarted (or False):
    ``servers`` gives each one's pid, port and ``output``, where it writes its output now (as ``status`` names it)."""
    files = [{"path": f["path"], "before_sha256": f["before_sha256"], "after_sha256": f["after_sha256"],
              "backup": f.get("backup")} for f in plan.files]
    results = list(restarted) if not isinstance(restarted, bool) else []
    doc = {"target": target, "changed": changed, "files": files, "restarted": bool(restarted),
           "servers": [{"pid": r.pid, "port": r.port, "output": r.output} for r in results]}
    doc.update(extra)
    return doc


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


def lifecycle() -> Any:
    """``eaglepatch.ops.lifecycle``, imported when a server is acted on (it imports the server package)."""
    from eaglepatch.ops import lifecycle as lc

    return lc


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
            named = (meeting or nodes.alone(spec)).arrive(spec, servers)
            plan = plan_apply(facts, recipe, ropts, servers=[*lc.manifest_record(everyone), *_kept_record(facts)])
            for n in plan.notes:
                say(f"note: {n}")
            if not dry_run and restart is not None and nodes.complete(servers, named):
                nodes.check(servers, named, "apply", t.spec.name)  # a prefill/decode half alone: exit 2 here
                group = (meeting or nodes.alone(spec)).group(spec, servers)
                if group is not None:
                    return _apply_together(t, recipe, session, plan, group, restart, servers, everyone, denied, say,
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
                return _change_doc(t.spec.name, plan, False, False, dry_run=True, diff=plan.diff(), action="apply")
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
                return _change_doc(t.spec.name, plan, False, restarted, action="apply")
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
            return _change_doc(t.spec.name, plan, True, restarted, action="apply")
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
                    return _revert_together(t, session, plan, group, restart, denied, say)
            if not plan.changed:
                say(f"{t.spec.name}: not patched: nothing to revert")
                if restart is None or not servers:
                    return _change_doc(t.spec.name, plan, False, False, action="revert")
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
            return _change_doc(t.spec.name, plan, plan.changed, restarted, action="revert")
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
                return _restart_together(t, session, group, ropts, say)
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


# A manifest that holds nothing but the launches of the nodes of a multi-node server, written on every node of an
# unpatched install before any node stops (``_record_together``) and removed once they are all up again.
RECORD = "restart_record"


def _is_record(manifest: dict[str, Any] | None) -> bool:
    return bool(manifest) and bool(manifest.get(RECORD))


def _kept_record(facts: HostFacts) -> list[dict[str, Any]]:
    """The launches a restart record keeps of servers that do not run now (an apply made while the nodes of a
    killed restart are down keeps them in its manifest: restart and revert start them from there)."""
    running = {s.port for s in lifecycle().servers_of(facts)}
    return [r for r in facts.manifest_servers() if r.get("port") not in running] if _is_record(facts.manifest) else []


def _record_together(t: Target, session: Session, group: nodes.NodeGroup, verb: str) -> None:
    """Before any node of a multi-node server is stopped, on every node: its launch in its install's manifest (a
    patched install's entry for its port brought up to date; an unpatched one gets a manifest of that alone,
    ``RECORD``), every node meeting once it is written. A kill after any node stopped then leaves each node its
    record, and ``restart`` and ``revert`` start the nodes from it (``_recorded_nodes``), as apply's manifest does.
    An install this user cannot write gets no record: refused then, nothing stopped."""
    me = t.spec.text

    def record() -> None:
        srv, facts = group.members[me], session.facts
        if isinstance(srv, nodes.Recorded):
            return  # not running: it is started from the record it has
        denied = facts.cannot_write()
        if denied:
            raise UsageError(f"{denied} (each node's launch is recorded there before any node of a multi-node "
                             "server stops, so that a kill meanwhile cannot leave the server down for good)")
        entry = lifecycle().manifest_record([srv])[0]
        servers = facts.manifest_servers()
        at = next((i for i, s in enumerate(servers) if s.get("port") == srv.port), len(servers))
        if at < len(servers) and servers[at].get("launch") == entry["launch"] and entry["launch"]:
            return  # recorded already (apply's manifest)
        manifest = dict(facts.manifest or {RECORD: True}, servers=[*servers[:at], entry, *servers[at + 1:]])
        session.execute(Plan((), manifest))
        session.facts = dataclasses.replace(facts, manifest=manifest)

    nodes.checked(group, me, t.spec.name, f"{verb}:recorded", record)
    failpoint("nodes:after-record")


def _drop_record(session: Session) -> None:
    """A restart record removed once every node is up again (a patched install's manifest stays)."""
    if session.token is not None and _is_record(session.facts.manifest):
        session.execute(Plan((), None))
        session.facts = dataclasses.replace(session.facts, manifest=None)


def _together_check(t: Target, servers: Sequence[Any], ropts: Any) -> None:
    """What restarting a node together needs, checked before anything changes: eaglepatch relaunches it itself."""
    lc = lifecycle()
    if lc.custom(ropts) or any(getattr(s, "unit", None) for s in servers):
        raise UsageError(f"{t.spec.name}: the nodes of a multi-node server are restarted together only by "
                         "relaunching each as it was launched, not by --restart-cmd, --systemd-unit or a systemd unit; "
                         "nothing was changed: leave those out, or pass --no-restart and restart the server yourself")
    lc.check_relaunchable([s for s in servers if not isinstance(s, nodes.Recorded)], ropts)


def _apply_together(t: Target, recipe: Recipe, session: Session, plan: Plan, group: nodes.NodeGroup, ropts: Any,
                    servers: Sequence[Any], everyone: Sequence[Any], denied: str | None, say: Say,
                    mode: Any) -> dict[str, Any]:
    """``apply`` of one node of a multi-node server whose nodes are all named: every node's files patched or none,
    then every node restarted together, every node rolled back when the server does not come up."""
    lc = lifecycle()
    me, name, facts = t.spec.text, t.spec.name, session.facts

    def check() -> bool:
        behind = plan.changed or bool(lc.stale(servers, facts))
        if behind and denied:  # as for one node: a patched server that fails would need the files reverted
            raise UsageError(denied)
        _together_check(t, servers, ropts)
        return behind

    said = nodes.checked(group, me, name, "apply:checked", check)
    if not any(v is True for v in said.values()):
        say(f"{name}: already patched: nothing to change")
        return _change_doc(name, plan, False, [], action="apply")
    for cls, family_timer in plan.timers:
        timer, why = worker_timer(mode, family_timer)
        say(f"timer: {cls}: {timer} ({why})")
    if plan.changed:
        progress.stage(me, "files being patched (the host finishes it, or puts every byte back)")
        try:
            session.execute(plan)
        except BaseException as exc:
            group.post("apply:patched", me, exc)
            raise
    bad = group.trouble(group.meet("apply:patched", me, plan.changed), me)
    if bad is not None:
        if plan.changed:  # all or none: this node's files back as they were
            fresh = target_facts(t, recipe)
            session.facts = fresh
            session.execute(plan_revert(fresh, recipe, force=True))
            progress.stage(me, progress.NOTHING_CHANGED)
        raise nodes.NodeFailed(f"{name}: {bad}; " + ("the files patched here were put back: nothing was changed"
                                                     if plan.changed else "nothing was changed here"), bad.exit_code)
    progress.stage(me, "files patched, server not restarted (it runs the original code)")
    failpoint("apply:after-execute")
    if plan.worker_writes:
        say(f"{name}: patched {plan.worker_writes} file(s); originals in {facts.backup_dir}")
    progress.stage(me, "files patched, every node of the server restarting")
    res, why = nodes.restart_together(group, me, t.host, facts.python, ropts, say, "apply", name)
    if why is None:
        progress.stage(me, "files patched, server restarted and ready")
        for n in lc.left_alone_notes(everyone, servers, "apply"):
            say(f"note: {n}")
        return _change_doc(name, plan, plan.changed, [res], action="apply")
    progress.stage(me, "the patched server did not come up: rolling back every node (the original files and "
                       "servers being put back)")
    from eaglepatch.server.restart import RestartResult, Strategy

    failed = (dataclasses.replace(res, message=why) if res is not None
              else RestartResult(Strategy.START, None, False, 0.0, message=why))
    together = nodes.RollbackTogether(group, me, t.host, facts.python, ropts,
                                      lambda: lc.servers_of(target_facts(t, recipe, transform=False)), say, name)
    raise lc.rollback(t, lambda: target_facts(t, recipe), recipe, session, ropts, list(servers), failed, say,
                      together=together)


def _revert_together(t: Target, session: Session, plan: Plan, group: nodes.NodeGroup, ropts: Any,
                     denied: str | None, say: Say) -> dict[str, Any]:
    """``revert`` of one node of a multi-node server whose nodes are all named: every node stopped, then each one's
    files reverted and its server started in one request (a node recorded at apply time and gone now is started
    from its record)."""
    me, name, facts = t.spec.text, t.spec.name, session.facts
    mine = group.members[me]

    def check() -> bool:
        if plan.changed and denied:
            raise UsageError(denied)
        _together_check(t, [mine], ropts)
        stale = not isinstance(mine, nodes.Recorded) and bool(lifecycle().stale([mine], facts))
        return plan.changed or stale or isinstance(mine, nodes.Recorded)

    said = nodes.checked(group, me, name, "revert:checked", check)
    if not any(v is True for v in said.values()):
        say(f"{name}: not patched: nothing to revert")
        _drop_record(session)  # a restart killed before any node stopped
        return _change_doc(name, plan, False, False, action="revert")
    _record_together(t, session, group, "revert")

    def start(launch: Any, wait: Any) -> Any:
        """Once every node is stopped: this node's original files back and its server started, in one request on
        the host (a kill leaves it patched, recorded and stopped, or reverted and started)."""
        from eaglepatch.server.control import relaunch_payload, relaunch_timeout
        from eaglepatch.server.restart import after_relaunch

        opts = dataclasses.replace(ropts, stop_on_failure=False)
        if not plan.changed:
            from eaglepatch.server.restart import restart

            return restart(t.host, launch=launch, options=opts, progress=say, python=facts.python, node=wait)
        progress.stage(me, "files being reverted, then the server started, in one request (every node stopped)")
        res = session.execute(plan, then={"batch": [relaunch_payload(None, launch, ropts.grace, ropts.port_timeout)]},
                              then_timeout=relaunch_timeout(ropts.grace, ropts.port_timeout, 1))
        progress.stage(me, "files reverted, server restarting")
        failpoint("revert:after-execute")
        for n in plan.notes:
            say(f"note: {n}")
        say(f"{name}: reverted {len(plan.files)} file(s)")
        answer = ((res.get("then") or {}).get("batch") or [{}])[0]
        return after_relaunch(t.host, None, launch, answer, options=opts, progress=say, python=facts.python, node=wait)

    progress.stage(me, "every node of the server stopping" + (", then the files reverted" if plan.changed else ""))
    res, why = nodes.restart_together(group, me, t.host, facts.python, ropts, say, "revert", name, start=start)
    if why is not None:
        tail = f"\n{res.log_tail}" if res is not None and res.log_tail else ""
        raise RestartFailed(f"{name}: the server did not come up within {ropts.timeout:.0f} s: {why}; "
                            + ("files reverted here" if res is not None and plan.changed else
                               "nothing was reverted here: run the same revert again" if plan.changed else
                               "no file needed reverting here") + tail)
    if not plan.changed:
        _drop_record(session)  # (a revert's plan removes the manifest itself)
    progress.stage(me, ("files reverted" if plan.changed else "not patched") + ", server restarted and ready")
    return _change_doc(name, plan, plan.changed, [res], action="revert")


def _restart_together(t: Target, session: Session, group: nodes.NodeGroup, ropts: Any, say: Say) -> dict[str, Any]:
    """``restart`` of one node of a multi-node server whose nodes are all named: every node's launch recorded, then
    every node restarted together; the record (of an unpatched install) removed once the server is up."""
    me, name = t.spec.text, t.spec.name
    nodes.checked(group, me, name, "restart:checked", lambda: _together_check(t, [group.members[me]], ropts))
    _record_together(t, session, group, "restart")
    progress.stage(me, "every node of the server restarting")
    res, why = nodes.restart_together(group, me, t.host, session.facts.python, ropts, say, "restart", name)
    if why is not None or res is None:  # the record stays: restart or revert starts the nodes from it
        tail = f"\n{res.log_tail}" if res is not None and res.log_tail else ""
        raise RestartFailed(f"{name}: the server did not come up within {ropts.timeout:.0f} s: {why}{tail}")
    _drop_record(session)
    progress.stage(me, "server restarted and ready")
    doc = dict(res.to_json())
    doc["target"] = name
    doc["servers"] = [res.to_json()]
    return doc
