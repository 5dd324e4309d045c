"""The nodes of a multi-node server acted on as one by ``apply``, ``revert`` and ``restart`` (their TARGETs name every
node): each node's launch recorded in its install before any node stops, files patched on all nodes or none, every
node stopped before any starts, rolled back together (docs/contract.md, "Topologies")."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

from eaglepatch import progress
from eaglepatch.errors import EaglepatchError, RestartFailed, UsageError
from eaglepatch.failpoints import failpoint
from eaglepatch.ops import nodes
from eaglepatch.ops.facts import HostFacts
from eaglepatch.ops.options import worker_timer
from eaglepatch.ops.nodes import RECORD, is_record, lifecycle
from eaglepatch.ops.plan import Plan, change_doc, plan_revert
from eaglepatch.ops.session import Session
from eaglepatch.ops.target import Target, target_facts
from eaglepatch.transform.recipe import Recipe

Say = Callable[[str], None]


def _record_entry(srv: Any, facts: HostFacts) -> tuple[dict[str, Any] | None, list[dict[str, Any]], int]:
    """What ``_record_together`` writes for ``srv`` on its install (None: nothing, its manifest holds that launch
    already, or it does not run), the manifest's servers and where the entry goes among them."""
    servers = facts.manifest_servers()
    if isinstance(srv, nodes.Recorded):
        return None, servers, 0  # not running: it is started from the record it has
    entry = lifecycle().manifest_record([srv])[0]
    at = next((i for i, s in enumerate(servers) if s.get("port") == srv.port), len(servers))
    if at < len(servers) and servers[at].get("launch") == entry["launch"] and entry["launch"]:
        return None, servers, at  # recorded already (apply's manifest)
    return entry, servers, at


def _record_denied(srv: Any, facts: HostFacts) -> str | None:
    """Why a node's launch cannot be recorded before the nodes stop (its install cannot be written and holds no
    record of it yet); None when it can, or need not be."""
    if _record_entry(srv, facts)[0] is None:
        return None
    denied = facts.cannot_write()
    return (f"{denied} (each node's launch is recorded there before any node of a multi-node server stops, so "
            "that a kill meanwhile cannot leave the server down for good)") if denied else None


def _refuse_unrecorded(name: str, me: str, group: nodes.NodeGroup, said: dict[str, Any]) -> None:
    """Every node refuses (nothing changed) when one that restarts with the others cannot record its launch first:
    ``said``, each node's ``(needs the restart, why it cannot record)`` from the check step."""
    cannot = [(m, v[1]) for m, v in said.items() if v[1]]
    if cannot:
        m, why = cannot[0]
        raise UsageError(why if m == me else f"{name}: nothing was changed: node rank {group.rank(m)} ({m}) would "
                         f"restart with this one and cannot record its launch first: {why}")


def _record_together(t: Target, session: Session, group: nodes.NodeGroup, verb: str) -> None:
    """Before any node of a multi-node server is stopped, on every node: its launch in its install's manifest (a
    patched install's entry for its port brought up to date; an unpatched one gets a manifest of that alone,
    ``RECORD``), every node meeting once it is written. A kill after any node stopped then leaves each node its
    record, and ``restart`` and ``revert`` start the nodes from it (``_recorded_nodes``), as apply's manifest does.
    An install this user cannot write gets no record: refused then, nothing stopped."""
    me = t.spec.text
    wrote: list[dict[str, Any] | None] = []  # the manifest this node had, once it wrote a record of its own

    def record() -> None:
        srv, facts = group.members[me], session.facts
        entry, servers, at = _record_entry(srv, facts)
        if entry is None:
            return
        denied = _record_denied(srv, facts)
        if denied:
            raise UsageError(denied)
        manifest = dict(facts.manifest or {RECORD: True}, servers=[*servers[:at], entry, *servers[at + 1:]])
        session.execute(Plan((), manifest))
        wrote.append(facts.manifest)
        session.facts = dataclasses.replace(facts, manifest=manifest)

    try:
        nodes.checked(group, me, t.spec.name, f"{verb}:recorded", record)
    except nodes.NodeFailed:
        if wrote and wrote[0] is None:  # another node could not record: no node stops, and this one's record goes
            _drop_record(session)
        raise
    failpoint("nodes:after-record")


def _drop_record(session: Session, say: Say | None = None) -> None:
    """A restart record removed once every node is up again (a patched install's manifest stays). ``say``: the
    server is up, so a failure to remove it is a note (status shows the record left), not the command's error."""
    if session.token is not None and is_record(session.facts.manifest):
        try:
            session.execute(Plan((), None))
        except EaglepatchError as exc:
            if say is None:
                raise
            say(f"note: the server is up, but its restart record could not be removed ({exc}): the next restart or "
                "revert naming every node removes it")
            return
        session.facts = dataclasses.replace(session.facts, manifest=None)


def _together_check(t: Target, servers: Sequence[Any], ropts: Any) -> None:
    """What restarting a node together needs, checked before anything changes: eaglepatch relaunches it itself."""
    lc = lifecycle()
    if lc.custom(ropts) or any(getattr(s, "unit", None) for s in servers):
        raise UsageError(f"{t.spec.name}: the nodes of a multi-node server are restarted together only by "
                         "relaunching each as it was launched, not by --restart-cmd, --systemd-unit or a systemd unit; "
                         "nothing was changed: leave those out, or pass --no-restart and restart the server yourself")
    lc.check_relaunchable([s for s in servers if not isinstance(s, nodes.Recorded)], ropts)


def apply_together(t: Target, recipe: Recipe, session: Session, plan: Plan, group: nodes.NodeGroup, ropts: Any,
                    servers: Sequence[Any], everyone: Sequence[Any], denied: str | None, say: Say,
                    mode: Any) -> dict[str, Any]:
    """``apply`` of one node of a multi-node server whose nodes are all named: every node's files patched or none,
    then every node restarted together, every node rolled back when the server does not come up."""
    lc = lifecycle()
    me, name, facts = t.spec.text, t.spec.name, session.facts

    def check() -> tuple[bool, str | None]:
        behind = plan.changed or bool(lc.stale(servers, facts))
        if behind and denied:  # as for one node: a patched server that fails would need the files reverted
            raise UsageError(denied)
        _together_check(t, servers, ropts)
        # a node that restarts with the others must be able to record its launch, and to roll back (its files put
        # back, its original started) when the server does not come up: one that cannot write refuses them all
        return behind, _record_denied(group.members[me], facts) or denied

    said = nodes.checked(group, me, name, "apply:checked", check)
    if not any(v[0] for v in said.values()):
        say(f"{name}: already patched: nothing to change")
        return change_doc(name, plan, False, [], action="apply")
    # another node is behind, so this one restarts with it, up to date or not: its launch must be recorded first
    _refuse_unrecorded(name, me, group, said)
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
    if plan.changed:
        session.facts = facts = dataclasses.replace(facts, manifest=plan.manifest)  # what the host holds now
    try:  # a node patched before, whose manifest does not hold its launch as it runs now, records it too
        _record_together(t, session, group, "apply")
    except EaglepatchError as exc:
        raise nodes.NodeFailed(f"{exc}; the files of every node are patched, no server was restarted (they run the "
                               "original code): run 'eaglepatch restart' naming every node", exc.exit_code) from exc
    progress.stage(me, "files patched, every node of the server restarting")
    res, why = nodes.restart_together(group, me, t.host, facts.python, ropts, say, "apply", name)
    if why is None:
        progress.stage(me, "files patched, server restarted and ready")
        for n in lc.left_alone_notes(everyone, servers, "apply"):
            say(f"note: {n}")
        return change_doc(name, plan, plan.changed, [res], action="apply")
    progress.stage(me, "the patched server did not come up: rolling back every node (the original files and "
                       "servers being put back)")
    from eaglepatch.server.restart import RestartResult, Strategy

    failed = (dataclasses.replace(res, message=why) if res is not None
              else RestartResult(Strategy.START, None, False, 0.0, message=why))
    together = nodes.RollbackTogether(group, me, t.host, facts.python, ropts,
                                      lambda: lc.servers_of(target_facts(t, recipe, transform=False)), say, name)
    raise lc.rollback(t, lambda: target_facts(t, recipe), recipe, session, ropts, list(servers), failed, say,
                      together=together)


def revert_together(t: Target, session: Session, plan: Plan, group: nodes.NodeGroup, ropts: Any,
                     denied: str | None, say: Say) -> dict[str, Any]:
    """``revert`` of one node of a multi-node server whose nodes are all named: every node stopped, then each one's
    files reverted and its server started in one request (a node recorded at apply time and gone now is started
    from its record)."""
    me, name, facts = t.spec.text, t.spec.name, session.facts
    mine = group.members[me]

    def check() -> tuple[bool, str | None]:
        if plan.changed and denied:
            raise UsageError(denied)
        _together_check(t, [mine], ropts)
        stale = not isinstance(mine, nodes.Recorded) and bool(lifecycle().stale([mine], facts))
        return plan.changed or stale or isinstance(mine, nodes.Recorded), _record_denied(mine, facts)

    said = nodes.checked(group, me, name, "revert:checked", check)
    if not any(v[0] for v in said.values()):
        say(f"{name}: not patched: nothing to revert")
        _drop_record(session)  # a restart killed before any node stopped
        return change_doc(name, plan, False, False, action="revert")
    _refuse_unrecorded(name, me, group, said)
    _record_together(t, session, group, "revert")
    # the files go back in the start request, and this node's launch stays recorded until the server is up: a
    # server that does not come up is started again from the records ('eaglepatch restart' naming every node)
    kept = [r for r in session.facts.manifest_servers() if r.get("port") == mine.port]
    if plan.changed:
        plan = dataclasses.replace(plan, manifest={RECORD: True, "servers": kept} if kept else None,
                                   manifest_last=True)  # the patched manifest stands until the files are back

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
        session.facts = dataclasses.replace(session.facts, manifest=plan.manifest)
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
                            + ("files reverted here, its launch kept: 'eaglepatch restart' naming every node starts "
                               "the server from the records" if res is not None and plan.changed else
                               "nothing was reverted here: run the same revert again" if plan.changed else
                               "no file needed reverting here") + tail)
    _drop_record(session, say)
    progress.stage(me, ("files reverted" if plan.changed else "not patched") + ", server restarted and ready")
    return change_doc(name, plan, plan.changed, [res], action="revert")


def restart_together(t: Target, session: Session, group: nodes.NodeGroup, ropts: Any, say: Say) -> dict[str, Any]:
    """``restart`` of one node of a multi-node server whose nodes are all named: every node's launch recorded, then
    every node restarted together; the record (of an unpatched install) removed once the server is up."""
    me, name = t.spec.text, t.spec.name

    def check() -> None:
        _together_check(t, [group.members[me]], ropts)
        denied = _record_denied(group.members[me], session.facts)
        if denied:
            raise UsageError(denied)

    nodes.checked(group, me, name, "restart:checked", check)
    _record_together(t, session, group, "restart")
    progress.stage(me, "every node of the server restarting")
    res, why = nodes.restart_together(group, me, t.host, session.facts.python, ropts, say, "restart", name)
    if why is not None or res is None:  # the record stays: restart or revert starts the nodes from it
        tail = f"\n{res.log_tail}" if res is not None and res.log_tail else ""
        raise RestartFailed(f"{name}: the server did not come up within {ropts.timeout:.0f} s: {why}{tail}")
    _drop_record(session, say)
    progress.stage(me, "server restarted and ready")
    doc = dict(res.to_json())
    doc["target"] = name
    doc["servers"] = [res.to_json()]
    return doc
