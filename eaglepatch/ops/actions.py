"""What each command does to one target, end to end, built on facts, plans and the host interface.

Each function connects, reads facts, plans, carries the plan out, and returns a value the CLI prints; every failure
is a typed error (``eaglepatch.errors``) and leaves the target as it was, or as it was before the command.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import re
import time
from typing import Any, Callable, Collection, Sequence

from eaglepatch import progress
from eaglepatch.errors import BadAnswer, RestartFailed, Unsupported, UsageError
from eaglepatch.failpoints import failpoint
from eaglepatch.hosts.agent import call
from eaglepatch.hosts.base import Host
from eaglepatch.hosts.local import LocalHost
from eaglepatch.hosts.target import SSHOptions, TargetSpec, is_local_target, open_host, parse_target
from eaglepatch.redact import shown, shown_argv
from eaglepatch.ops.core import (
    AmbiguousInstall,
    FactsOptions,
    HostFacts,
    Plan,
    RuntimeOptions,
    Session,
    analyze_all,
    describe,
    new_lock_owner,
    gather,
    plan_apply,
    plan_revert,
    preload_transform,
    source_slices,
    worker_timer,
)
from eaglepatch.transform.recipe import Recipe, builtin_recipe, load_recipe_file

Say = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class Connect:
    """How to reach targets: the SSH options plus what discovery may be told."""

    identity: str | None = None
    port: int | None = None
    jump: str | None = None
    connect_timeout: float | None = None  # None: the SSH config's ConnectTimeout, else 10 s
    accept_new_host_key: bool = False
    facts: FactsOptions = FactsOptions()

    def ssh(self) -> SSHOptions:
        return SSHOptions(identity=self.identity, port=self.port, jump=self.jump,
                          connect_timeout=self.connect_timeout, accept_new_host_key=self.accept_new_host_key)


def load_recipe(path: str | None) -> Recipe:
    return builtin_recipe() if path is None else load_recipe_file(path)


def restart_options(restart_cmd: str | None, systemd_unit: str | None, timeout: float) -> Any:
    """``RestartOptions`` from the command line's restart options (UsageError for bad ones)."""
    from eaglepatch.server.restart import RestartOptions

    return RestartOptions(restart_cmd=restart_cmd, systemd_unit=systemd_unit, timeout=timeout)


def check_targets(texts: Sequence[str], c: Connect) -> None:
    """Usage errors of any TARGET (bad form, an SSH option with a local path, a local path that does not exist)
    before any target is touched: with several TARGETs, one bad one must not leave the others half done."""
    for text in texts:
        _check_target(parse_target(text, c.ssh()), text, c)


def _check_target(spec: TargetSpec, text: str, c: Connect) -> None:
    if spec.is_local and c.facts.sglang_path is None and not os.path.exists(spec.path or ""):
        raise UsageError(f"{text}: no such file or directory")


class _Target:
    """An open connection to one target, closed on exit."""

    def __init__(self, text: str, c: Connect):
        self.spec: TargetSpec = parse_target(text, c.ssh())
        facts_opts = c.facts
        _check_target(self.spec, text, c)
        if self.spec.is_local and facts_opts.sglang_path is None:
            facts_opts = dataclasses.replace(facts_opts, sglang_path=self.spec.path)
        self.facts_opts = facts_opts
        self.host: Host = LocalHost(self.spec.name) if self.spec.is_local else open_host(self.spec)

    def __enter__(self) -> "_Target":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.host.close()


def _facts(t: _Target, recipe: Recipe, lock_owner: dict[str, Any] | None = None,
           transform: bool = True) -> HostFacts:
    """The target's facts; with ``transform`` (the command goes on to analyse or instrument the files), the
    transform's import runs meanwhile, while the round trip waits on the host."""
    if transform:
        preload_transform()
    return gather(t.host, t.facts_opts, sorted(recipe.entry_names), lock_owner=lock_owner)


# ----------------------------------------------------------------------------------------------------------------
# show / status / diff


def show(text: str, c: Connect, recipe: Recipe) -> dict[str, Any]:
    with _Target(text, c) as t:
        facts = _facts(t, recipe)
        analyses = analyze_all(facts, recipe)
        doc = describe(facts, recipe, analyses)
        doc["slices"] = source_slices(facts, analyses)
        return doc


def render_show(doc: dict[str, Any]) -> str:
    out = [f"{doc['target']}: sglang {shown(doc['sglang_version'] or '?')} at {shown(doc['package_dir'])}"]
    out.extend(_server_lines(doc))
    for f in doc["files"]:
        out.append(f"\n{shown(f['path'])}  [{f['state']}]")
        if f.get("refused"):
            out.append(f"  refused: {f['refused']}")
        for w in f["workers"]:
            if w.get("status"):
                out.append(f"  {w['class']}: {w['status']}: {w['reason']}")
                continue
            lines = w.get("lines") or [None, None]
            out.append(f"  {w['class']}.{w['method']} (lines {lines[0]}-{lines[1]}): phases {', '.join(w['phases'])}")
            if w.get("timer"):
                timer, why = worker_timer("auto", w["timer"])
                out.append(f"    timer         {timer} with --mode auto ({why})")
            for site in w.get("call_sites", []):
                out.append(f"    {site['phase']:<13} {site['mode']:<8} line {site['line']} in {site['method']}")
            for a in w.get("accepted", []):
                out.append(f"    accepted      from {a['from']} after line {a['line']}")
            if not w.get("accepted"):
                out.append("    accepted      unknown (records carry accepted=null)")
    for sl in doc.get("slices", []):
        out.append(f"\n--- {sl['path']}: {sl['class']}.{sl['method']}")
        for row in sl["source"]:
            tag = f"<- {row['phase']}" if row.get("phase") else ""
            where = f" [{row['method']}]" if row.get("method") else ""
            out.append(f"{row['line']:>6}  {shown(row['text'], keep=chr(9))}{'  ' + tag + where if tag else ''}")
    return "\n".join(out)


_CODE = {"current": "runs the files on disk",
         "stale": "STARTED BEFORE THE FILES LAST CHANGED: it runs the code from before; restart it",
         "unknown": "whether it runs the files on disk is unknown"}


def _server_lines(doc: dict[str, Any]) -> list[str]:
    """One line per server of the install (pid, port, how it was launched, whether it runs the files on disk),
    the servers of other installs, and a lock an interrupted run left."""
    servers = doc.get("servers")
    if servers is None:  # a document without the list: its one server
        servers = [doc["server"]] if doc.get("server") else []
    out = []
    if not servers:
        out.append("server: none running (of this install)")
    for srv in servers:
        head = f"server: pid {srv['pid']}" + (f" on :{srv['port']}" if srv.get("port") else "")
        out.append(f"{head}: {shown_argv(srv['argv'])}")
        if srv.get("launched"):
            out.append(f"  launched: {shown(srv['launched'])}" + (f"; in {shown(srv['cwd'])}" if srv.get("cwd") else ""))
        if srv.get("code"):
            out.append(f"  {_CODE.get(srv['code'], shown(srv['code']))}")
    for other in doc.get("other_servers") or ():
        out.append(f"other server: pid {other['pid']} on :{other.get('port')} runs another install "
                   f"({shown(other.get('package_dir') or 'unknown')}): left alone")
    for path in doc.get("leftovers") or ():
        out.append(f"leftover: {shown(path)}: a temp file an apply or revert wrote; unless one runs now (the lock "
                   "says), it was killed before renaming it into place, and the next apply or revert removes it")
    lock = doc.get("lock")
    if lock:
        try:
            since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(lock.get("time") or 0)))
        except (TypeError, ValueError, OverflowError, OSError):  # the lock file is the host's: any value at all
            since = "an unknown time"
        out.append(f"lock: an eaglepatch {shown(lock.get('what') or 'run')} of {shown(lock.get('user'))} from "
                   f"{shown(lock.get('client_host'))} (pid {shown(lock.get('client_pid'))}) holds it since {since}; "
                   "if that run was killed, the next apply or revert from that machine takes it over")
    return out


def status(text: str, c: Connect, recipe: Recipe) -> dict[str, Any]:
    with _Target(text, c) as t:
        return describe(_facts(t, recipe), recipe)


def render_status(doc: dict[str, Any]) -> str:
    rows = [f"{doc['target']}: sglang {shown(doc['sglang_version'] or '?')} at {shown(doc['package_dir'])}"]
    for f in doc["files"]:
        phases = sorted({p for w in f["workers"] for p in w.get("phases", [])})
        rows.append(f"  {f['state']:<9} {shown(f['path'])}  ({', '.join(phases) or 'no phases'})")
    runtime = doc.get("runtime") or {}
    if runtime and not runtime.get("present") and any(f["state"] == "patched" for f in doc["files"]):
        rows.append(f"  MISSING   {runtime['path']}: a patched file imports it, so a server started now fails; "
                    "run eaglepatch revert (or apply again)")
    rows.extend("  " + line for line in _server_lines(doc))
    return "\n".join(rows)


def diff(text: str, c: Connect, recipe: Recipe, ropts: RuntimeOptions, say: Say) -> str:
    with _Target(text, c) as t:
        facts = _facts(t, recipe)
        plan = plan_apply(facts, recipe, ropts)
        for n in plan.notes:
            say(f"note: {n}")
        if not plan.changed:
            say(f"{t.spec.name}: already patched: nothing to change")
        return plan.diff()


# ----------------------------------------------------------------------------------------------------------------
# apply / revert


def _change_doc(target: str, plan: Plan, changed: bool, restarted: bool, **extra: Any) -> dict[str, Any]:
    files = [{"path": f["path"], "before_sha256": f["before_sha256"], "after_sha256": f["after_sha256"],
              "backup": f.get("backup")} for f in plan.files]
    doc = {"target": target, "changed": changed, "files": files, "restarted": restarted}
    doc.update(extra)
    return doc


def render_change(doc: dict[str, Any]) -> str:
    if doc.get("dry_run"):
        return doc.get("diff", "")
    verb = doc.get("action", "apply")
    what = "changed" if doc["changed"] else "nothing to change"
    files = ", ".join(f["path"] for f in doc["files"]) or "no files"
    tail = "; server restarted and ready" if doc["restarted"] else ""
    return f"{doc['target']}: {verb}: {what} ({files}){tail}"


def _launch_of(facts: HostFacts, ports: Sequence[int] = ()) -> Any:
    """The one server of the install to load or sweep (``--server-port`` picks among several), or None; raises
    UsageError when several run and no port says which."""
    from eaglepatch.server.process import select_server

    servers = lifecycle().chosen(facts, ports)
    return select_server(servers)


def lifecycle() -> Any:
    """``eaglepatch.ops.lifecycle``, imported when a server is acted on (it imports the server package)."""
    from eaglepatch.ops import lifecycle as lc

    return lc


def apply(text: str, c: Connect, recipe: Recipe, ropts: RuntimeOptions, restart: Any, dry_run: bool,
          say: Say) -> dict[str, Any]:
    lc = lifecycle()
    with _Target(text, c) as t:
        owner = None if dry_run else new_lock_owner("apply")
        facts = _facts(t, recipe, owner)  # takes the lock in the same round trip (not for --dry-run)
        session = Session(t.host, facts.python, facts)
        denied = facts.cannot_write()
        if owner is not None and not denied:
            session.lock(owner)
        try:
            everyone = lc.servers_of(facts)
            servers = lc.chosen(facts, c.facts.server_ports)
            plan = plan_apply(facts, recipe, ropts, servers=lc.manifest_record(everyone))
            for n in plan.notes:
                say(f"note: {n}")
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
                restarted = False
                if behind and denied:
                    # a patched server that fails would need the files reverted, which this user cannot do
                    say(f"note: {denied.split(': ', 1)[1]}: the server(s) that still run the original code were not "
                        "restarted")
                elif behind:
                    # an apply cut off before its restart, or --no-restart: the servers still run the original code
                    say(f"{t.spec.name}: " + ", ".join(f"the server on :{s.port} (pid {s.pid})" for s in behind)
                        + " started before the files were patched: restarting it")
                    lc.check_relaunchable(behind, restart)
                    restarted = _restart_after_apply(t, recipe, session, behind, restart, say)
                    progress.stage(t.spec.text, "files patched, server restarted and ready")
                return _change_doc(t.spec.name, plan, False, restarted, action="apply")
            if denied:
                raise UsageError(denied)
            if restart is not None:
                lc.check_relaunchable(servers, restart)  # before anything changes
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
            restarted = False
            if restart is not None:
                restarted = _restart_after_apply(t, recipe, session, servers, restart, say)
                progress.stage(t.spec.text, "files patched" + (", server restarted and ready" if restarted else ""))
                for n in lc.left_alone_notes(everyone, servers, "apply"):
                    say(f"note: {n}")
            elif everyone:
                say(f"note: not restarted (--no-restart): the running server(s) run the original code until they "
                    "restart")
            return _change_doc(t.spec.name, plan, True, restarted, action="apply")
        finally:
            session.unlock()


def _no_server_note(say: Say, name: str, verb: str) -> None:
    say(f"{name}: {verb}; no sglang server of this install is running, so nothing was restarted: start it "
        "(python -m sglang.launch_server ...) and the patch takes effect")


def _restart_after_apply(t: _Target, recipe: Recipe, session: Session, servers: Sequence[Any], ropts: Any,
                         say: Say) -> bool:
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
            return True
        progress.stage(t.spec.text, rolling_back)
        raise lc.rollback(t, lambda: _facts(t, recipe), recipe, session, ropts, list(servers[:1]), res, say)
    if not servers:
        _no_server_note(say, t.spec.name, "patched")
        return False
    progress.stage(t.spec.text, "files patched, server restarting")
    done, failed = lc.restart_each(t.host, servers, ropts, facts.python, say)
    if failed is None:
        return True
    progress.stage(t.spec.text, rolling_back)
    raise lc.rollback(t, lambda: _facts(t, recipe), recipe, session, ropts,
                      [srv for srv, _ in done] + [failed[0]], failed[1], say)


def revert(text: str, c: Connect, recipe: Recipe, force: bool, restart: Any, say: Say) -> dict[str, Any]:
    lc = lifecycle()
    with _Target(text, c) as t:
        owner = new_lock_owner("revert")
        # takes the lock in the same round trip; revert parses a file only when the manifest cannot vouch for it
        facts = _facts(t, recipe, owner, transform=False)
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
            if not plan.changed:
                say(f"{t.spec.name}: not patched: nothing to revert")
                if restart is None or not servers:
                    return _change_doc(t.spec.name, plan, False, False, action="revert")
                say(f"{t.spec.name}: " + ", ".join(f"the server on :{s.port} (pid {s.pid})" for s in servers)
                    + " started before the files last changed: restarting it")
            elif denied:
                raise UsageError(denied)
            wants = restart is not None and (bool(plan.files) or bool(servers))
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
            restarted = False
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


def _revert_relaunches(t: _Target, facts: HostFacts, servers: Sequence[Any], ports: Sequence[int], ropts: Any,
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


def _restart_after_revert(t: _Target, facts: HostFacts, ropts: Any, pairs: Sequence[tuple[Any, Any]],
                          units: Sequence[tuple[Any, Any]], res: dict[str, Any], say: Say) -> bool:
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
        return False
    bad = [r for r in results if not r.ready]
    if bad:
        raise RestartFailed(f"{t.spec.name}: files reverted, but the server was not ready within "
                            f"{ropts.timeout:.0f} s: {bad[0].message}\n{bad[0].log_tail}".rstrip())
    return True


def restart_target(text: str, c: Connect, ropts: Any, say: Say) -> dict[str, Any]:
    from eaglepatch.server.restart import NoServerRunning, restart

    lc = lifecycle()
    with _Target(text, c) as t:
        owner = new_lock_owner("restart")
        facts = _facts(t, builtin_recipe(), owner, transform=False)
        session = Session(t.host, facts.python, facts)
        if not facts.cannot_write():
            session.lock(owner)  # no apply, revert or sweep of this install restarts its servers meanwhile
        try:
            servers = lc.chosen(facts, c.facts.server_ports)
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
    return "\n".join(f"{doc['target']}: restarted ({r['strategy']}), pid {r['pid']} on :{r['port']}, ready in "
                     f"{r['seconds']:.1f} s" for r in doc.get("servers") or [doc])


# ----------------------------------------------------------------------------------------------------------------
# report


def _cache_root() -> pathlib.Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "eaglepatch" / "logs"


@dataclasses.dataclass(frozen=True)
class FetchedLogs:
    """A target's timing logs copied into the local cache: the ``folder``, and the processes of the servers of
    the install that run now (launchers and their children: every rank), whose logs are the current run's."""

    folder: str
    current: frozenset[int] = frozenset()
    launches: frozenset[tuple[int, int]] = frozenset()  # (pid, start ticks) of those servers: their runs' ids
    package: str | None = None  # the install's sglang package: its runs' headers name a runtime inside it
    servers: tuple[tuple[int, int | None], ...] = ()  # (pid, port) of the servers that run now
    name: str = ""  # the target's name (as sweeps and the cache know it)


def fetch_logs(text: str, c: Connect, log_dir: str | None, say: Say) -> FetchedLogs:
    """Copy a target's timing logs into the local cache, fetching only bytes not fetched before."""
    with _Target(text, c) as t:
        python = c.facts.python or "python3"
        current: frozenset[int] = frozenset()
        launches: frozenset[tuple[int, int]] = frozenset()
        package: str | None = None
        servers: tuple[tuple[int, int | None], ...] = ()
        try:
            facts = _facts(t, builtin_recipe(), transform=False)
            log_dir = log_dir or ((facts.manifest or {}).get("runtime") or {}).get("log_dir")
            python = facts.python
            package = facts.package_dir
            current = frozenset(p for s in facts.servers for p in (s["pid"], *(s.get("children") or ())))
            launches = frozenset((s["pid"], s["start"]) for s in facts.servers if s.get("start") is not None)
            servers = tuple((s["pid"], _port_of_scan(s)) for s in facts.servers)
        except (Unsupported, AmbiguousInstall):
            pass  # the logs can still be read (--log-dir, or the default folder); which run is current is unknown
        folder = fetch_logs_from(t.host, t.spec.name, python, log_dir or "/tmp/eaglepatch", say, pids=current)
        return FetchedLogs(folder, current, launches, package, servers, t.spec.name)


def _port_of_scan(item: dict[str, Any]) -> int | None:
    from eaglepatch.server.process import ServerProcess

    try:
        return ServerProcess.from_scan(item).port
    except (KeyError, TypeError, ValueError):
        return None


# A timing log's name, as the runtime makes it (the host's hostside/logs.py checks the same): <host>-<pid>-rank<r>.jsonl
_LOG_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*-[0-9]+-rank[0-9]+\.jsonl")
_DIR_FILE = ".host-folder"  # in each cache subfolder: the host folder it copies
_MAX_ROUNDS = 4096  # log batches fetched in one command at most (LOG_BATCH each)


def _cache_folder(root: pathlib.Path, host_dir: str) -> pathlib.Path:
    """The cache subfolder for one folder of the host: named by a digest of its path (the path itself is the
    host's word, never a path here)."""
    return root / hashlib.sha256(host_dir.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def _refuse(name: str, why: str) -> BadAnswer:
    return BadAnswer(f"{name}: the host's answer to the log request is refused: {why}: nothing of it was written "
                     "(is the host's python the real one? see docs/safety.md, trust boundaries)")


def fetch_logs_from(host: Host, name: str, python: str, log_dir: str, say: Say,
                    pids: Collection[int] = ()) -> str:
    """``fetch_logs`` on an open host: copy the new bytes of the timing logs into the local cache folder of the
    target ``name`` and ``log_dir`` (another ``--log-dir`` has a folder of its own), dropping the cached copies of
    files that are no longer on the host; return that folder. The host reads by the runtime's own rules, from
    ``log_dir`` and from wherever the runtime of ``pids`` (the servers' processes) really writes (its private
    fallback folder); each host folder has a subfolder of its own here.

    Everything in the answer is the host's word (docs/safety.md): a file name is a plain basename of the log
    pattern, an offset is 0 or the size of the copy here, the data is base64 of whole lines; anything else raises
    ``BadAnswer`` before a byte is written. Raises ``UsageError`` when the host has no log it may read."""
    safe = "".join(ch if ch.isalnum() or ch in "-_.@" else "_" for ch in name)
    dest = _cache_root() / safe / hashlib.sha256(log_dir.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    dest.mkdir(parents=True, exist_ok=True, mode=0o700)
    for old in dest.glob("*.jsonl"):  # the flat layout of earlier versions: fetched again into subfolders
        old.unlink(missing_ok=True)
    said: set[str] = set()
    fetched = files_with_data = 0
    listed: dict[str, list[str]] = {}
    for _round in range(_MAX_ROUNDS):
        known = _cached(dest)
        have = {f"{d}/{n}": size for d, (_sub, sizes) in known.items() for n, size in sizes.items()}
        res = call(host, python, "logs", log_dir=log_dir, have=have, pids=sorted(pids))
        if not isinstance(res, dict):
            raise _refuse(name, "not an object")
        accepted = _check_dirs(name, res.get("dirs"))
        if res.get("error"):
            raise UsageError(f"{name}: {shown(res['error'])}")  # it names each folder refused, and why
        for d in accepted.values():
            if d.get("refused") and d["path"] not in said and d["kind"] in ("configured", "open"):
                said.add(d["path"])
                say(f"note: {name}: not reading {shown(d['path'])}: {shown(d['refused'])}")
        listed = _check_names(name, res.get("names"), accepted)
        writes = _check_files(name, res.get("files"), accepted, known)
        for host_dir in listed:
            sub = _cache_folder(dest, host_dir)
            sub.mkdir(exist_ok=True, mode=0o700)
            (sub / _DIR_FILE).write_text(host_dir, encoding="utf-8", errors="surrogateescape")
            if host_dir != os.path.normpath(log_dir) and host_dir not in said and listed[host_dir]:
                said.add(host_dir)
                say(f"{name}: reading the timing logs in {shown(host_dir)} too (where the runtime writes them)")
        for host_dir, file_name, offset, data in writes:
            _write_log(_cache_folder(dest, host_dir) / file_name, offset, data)
            fetched += len(data)
            files_with_data += 1
        if not res.get("more") or not writes:
            break
    # what is no longer on the host is never reported again
    for host_dir, (sub, sizes) in _cached(dest).items():
        keep = set(listed.get(host_dir, ()))
        for gone in set(sizes) - keep:
            (sub / gone).unlink(missing_ok=True)
    n = sum(len(v) for v in listed.values())
    where = ", ".join(shown(d) for d in listed) or shown(log_dir)
    say(f"{name}: {n} log file(s) in {where}, {fetched} new bytes from {files_with_data} of them -> {dest}")
    return str(dest)


def _cached(dest: pathlib.Path) -> dict[str, tuple[pathlib.Path, dict[str, int]]]:
    """host folder -> (its cache subfolder, {log name: size here})."""
    out: dict[str, tuple[pathlib.Path, dict[str, int]]] = {}
    for sub in dest.iterdir():
        marker = sub / _DIR_FILE
        if not sub.is_dir() or sub.is_symlink() or not marker.is_file():
            continue
        host_dir = marker.read_text(encoding="utf-8", errors="surrogateescape")
        out[host_dir] = (sub, {p.name: p.stat().st_size for p in sub.glob("*.jsonl") if p.is_file()})
    return out


def _check_dirs(name: str, dirs: Any) -> dict[str, dict[str, Any]]:
    if not isinstance(dirs, list):
        raise _refuse(name, "no list of folders")
    out = {}
    for d in dirs:
        if not (isinstance(d, dict) and isinstance(d.get("path"), str) and d["path"].startswith("/")
                and "\0" not in d["path"] and d.get("kind") in ("configured", "open", "fallback")
                and (d.get("refused") is None or isinstance(d["refused"], str))):
            raise _refuse(name, f"a folder entry that is not one ({shown(str(d)[:200])})")
        out[d["path"]] = d
    return out


def _check_name(name: str, file_name: Any) -> str:
    if not (isinstance(file_name, str) and _LOG_NAME.fullmatch(file_name) and ".." not in file_name):
        raise _refuse(name, f"a log file name that is not a plain <host>-<pid>-rank<r>.jsonl "
                            f"({shown(repr(file_name)[:200])})")
    return file_name


def _check_names(name: str, names: Any, dirs: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
    if not isinstance(names, dict):
        raise _refuse(name, "no list of log files")
    out = {}
    for host_dir, files in names.items():
        if host_dir not in dirs or dirs[host_dir].get("refused") or not isinstance(files, list):
            raise _refuse(name, f"log files of a folder it did not read ({shown(repr(host_dir)[:200])})")
        out[host_dir] = [_check_name(name, f) for f in files]
    return out


def _check_files(name: str, files: Any, dirs: dict[str, dict[str, Any]],
                 known: dict[str, tuple[pathlib.Path, dict[str, int]]]) -> list[tuple[str, str, int, bytes]]:
    """(host folder, name, offset, bytes) of each file in the answer, every one checked first."""
    import base64
    import binascii

    if not isinstance(files, list):
        raise _refuse(name, "no list of files")
    out = []
    for f in files:
        if not isinstance(f, dict) or f.get("dir") not in dirs or dirs[f["dir"]].get("refused"):
            raise _refuse(name, "bytes of a folder it did not read")
        file_name = _check_name(name, f.get("name"))
        offset = f.get("offset")
        here = known.get(f["dir"], (None, {}))[1].get(file_name, 0)
        if not isinstance(offset, int) or isinstance(offset, bool) or offset not in (0, here):
            raise _refuse(name, f"bytes of {file_name} at offset {shown(repr(offset)[:40])}, where the copy here "
                                f"has {here} (only 0 or {here} are asked for)")
        try:
            data = base64.b64decode(f.get("data") or "", validate=True)
        except (binascii.Error, TypeError, ValueError):
            raise _refuse(name, f"bytes of {file_name} that are not base64") from None
        out.append((f["dir"], file_name, offset, data))
    return out


def _write_log(path: pathlib.Path, offset: int, data: bytes) -> None:
    """Write one batch into the cache: the whole file at offset 0, else appended; never through a link."""
    flags = os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | (os.O_TRUNC if offset == 0 else os.O_APPEND)
    fd = os.open(path, flags, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


@dataclasses.dataclass(frozen=True)
class RunSelection:
    """``report``'s choice of runs: ``merge`` (all together, said so), ``ids`` (these, by id or prefix), ``since``
    (runs that started at or after an epoch), ``all`` (every run apart). None of them: a TARGET's current runs
    (those of the servers that run now, else its newest), every run of local files."""

    merge: bool = False
    ids: tuple[str, ...] = ()
    since: float | None = None
    all: bool = False

    def __post_init__(self) -> None:
        if sum((self.merge, bool(self.ids), self.since is not None, self.all)) > 1:
            raise UsageError("--merge-runs, --run, --since and --all-runs exclude each other: give one")

    @property
    def explicit(self) -> bool:
        return self.merge or bool(self.ids) or self.since is not None or self.all


def parse_since(text: str, now: float | None = None) -> float:
    """``--since``: an epoch (``1764500000``), a local date and time (``2026-12-01 15:40``, ``2026-12-01T15:40:00``)
    or an age (``30m``, ``2h``, ``1d``, ``90s``). Raises UsageError."""
    import datetime

    now = time.time() if now is None else now
    t = text.strip()
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if t[-1:] in units and t[:-1].replace(".", "", 1).isdigit():
        return now - float(t[:-1]) * units[t[-1]]
    try:
        return float(t)
    except ValueError:
        pass
    try:
        return datetime.datetime.fromisoformat(t.replace(" ", "T", 1)).timestamp()
    except ValueError:
        raise UsageError(f"--since {text!r}: give an epoch, a date and time (2026-12-01 15:40) or an age "
                         "(30m, 2h, 1d)") from None


def _is_log_source(path: str) -> bool:
    """A local SOURCE that is timing logs itself (a .jsonl file, or a folder with some), not an install."""
    from eaglepatch import report as rep

    if os.path.isfile(path):
        return True
    try:
        return bool(rep.iter_log_files([path]))
    except UsageError:  # a folder without logs: an install, or nothing
        return False


def _target_sweep(name: str) -> dict[str, Any] | None:
    """The newest sweep of the target ``name`` kept on this machine that has a baseline which ran (its
    ``sweep --json`` summary), else None: the measured no-speculation point of ``report --predict``."""
    from eaglepatch.doctor.collect import find_sweep

    found = find_sweep(name, None)
    return found if found and found.get("baseline") is not None else None


def report(sources: Sequence[str], c: Connect, *, by: str | None, skip: int, trace: str | None, compare: bool,
           log_dir: str | None, fmt: str, say: Say, runs: RunSelection = RunSelection(),
           chart: str | None = None, predict: bool = False, steps: Sequence[int] | None = None) -> str:
    from eaglepatch import report as rep

    per_source: list[list[str]] = []  # the log files of each source
    own: list[dict[str, Any]] = []  # each source's own selection: a TARGET's current run by default
    sweep: dict[str, Any] | None = None  # a TARGET's sweep with a baseline, for --predict
    for s in sources:
        if (os.path.exists(s) or is_local_target(s)) and _is_log_source(s):
            per_source.append(rep.iter_log_files([s]))
            own.append({})
            continue
        # a TARGET: a remote one, or a local install (package, venv, checkout): the same code path
        fetched = fetch_logs(s, c, log_dir, say)
        files = rep.iter_log_files([fetched.folder])
        sel: dict[str, Any] = {}
        if not runs.explicit:
            # by default the current run: the runs of the servers that run now (every rank), read from their
            # processes' files; never an earlier launch that had the same pid
            mine = logs_of(files, fetched.current)
            if mine:
                files, sel = mine, {"launches": fetched.launches}
            elif fetched.current:
                # the server runs and has timed nothing: another server's numbers in its place would mislead
                raise UsageError(f"{s}: {_no_records(fetched)}")
            else:
                # no server of the install runs: its newest run, never one that another install's runtime wrote
                sel = {"latest": True, "install": fetched.package}
                say(f"note: {s}: no server of this install runs: its newest run is shown (--all-runs for every "
                    "run)")
        per_source.append(files)
        own.append(sel)
        if predict and sweep is None:
            sweep = _target_sweep(fetched.name)
    select: dict[str, Any] = {"merge_runs": runs.merge, "run_ids": list(runs.ids) or None, "since": runs.since}
    if compare:
        results, traces = rep.aggregate_each(per_source, list(sources), trace_path=trace, by=by, skip=skip,
                                             each=own, **select)
        for path in traces:
            say(f"trace written to {path}: open it in https://ui.perfetto.dev")
        cmp = rep.compare(results, list(sources))
        if chart is not None:
            from eaglepatch.tuning.chart import write_compare_chart

            write_compare_chart(cmp.to_json(), chart)
            say(f"chart written to {chart}")
        if fmt == "json":
            return json.dumps(cmp.to_json(), indent=1) + "\n"
        if fmt == "csv":
            return rep.render_compare_csv(cmp)
        return rep.render_compare_table(cmp) + "\n"
    files = [f for fs in per_source for f in fs]
    if not files:
        raise UsageError(f"no timing logs (*.jsonl) in {', '.join(sources)}: apply first, then put load on the "
                         "server")
    if any(own) and len(sources) > 1:
        # several sources in one table: each source's own selection picks its run ids first (a TARGET's current
        # run must not cut the runs of the files given beside it), then one aggregation of those runs
        picked: list[str] = []
        for fs, sel in zip(per_source, own):
            if fs:
                picked += [r.id for r in rep.aggregate(fs, by=None, skip=skip, **select, **sel).runs]
        select = {**select, "run_ids": picked or None, "since": None}
        own = [{}]
        if not picked:
            files = []
    # several sources in one report: each run's table says which SOURCE it came from
    origins = [src for fs, src in zip(per_source, sources) for _f in fs] if len(sources) > 1 else None
    result = rep.aggregate(files, by=by, skip=skip, trace_path=trace, origins=origins, **select, **own[0]) \
        if files else rep.aggregate([], by=by, skip=skip)
    if trace:
        say(f"trace written to {trace}: open it in https://ui.perfetto.dev")
    preds = None
    if predict:
        from eaglepatch.report.predict import predict as predict_groups

        preds = predict_groups(result, steps=steps, sweep=sweep)
    if fmt == "json" or (predict and chart is not None):
        doc = result.to_json()
        doc["sources"] = list(sources)
        for gd, pred in zip(doc["groups"], preds or ()):
            if pred is not None:
                gd.update(pred.to_json())
        if predict and chart is not None:
            from eaglepatch.tuning.predict_chart import write_predict_chart

            write_predict_chart(doc, chart, sweep)
            say(f"chart written to {chart}")
        if fmt == "json":
            return json.dumps(doc, indent=1) + "\n"
    if fmt == "csv":
        return rep.render_csv(result)
    return rep.render_table(result, predictions=preds) + "\n"


def _no_records(fetched: FetchedLogs) -> str:
    """Why ``report TARGET`` shows nothing: the servers that run now have written no timing record."""
    which = ", ".join(f"pid {pid}" + (f" on :{port}" if port else "") for pid, port in fetched.servers)
    return (f"the server that runs now ({which or 'pid ' + ', '.join(map(str, sorted(fetched.current)))}) has "
            "written no timing record yet: it is not patched, or has had no load since it started (eaglepatch "
            "status says which; eaglepatch bench puts load on it); --all-runs shows the earlier runs")


# a timing log's name: <host>-<pid>-rank<r>.jsonl
_LOG_PID = re.compile(r"-(\d+)-rank\d+\.jsonl$")


def logs_of(files: Sequence[str], pids: Collection[int]) -> list[str]:
    """The timing logs among ``files`` that the processes ``pids`` wrote (a server's launcher and children: every
    rank), by the pid in their names."""
    return [f for f in files if (m := _LOG_PID.search(os.path.basename(f))) and int(m.group(1)) in pids]
