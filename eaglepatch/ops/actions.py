"""What each command does to one target, end to end, built on facts, plans and the host interface.

Each function connects, reads facts, plans, carries the plan out, and returns a value the CLI prints; every failure
is a typed error (``eaglepatch.errors``) and leaves the target as it was, or as it was before the command.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Any, Callable, Sequence

from eaglepatch.errors import RestartFailed, Unsupported, UsageError
from eaglepatch.hosts.base import Host
from eaglepatch.hosts.local import LocalHost
from eaglepatch.hosts.target import SSHOptions, TargetSpec, is_local_target, open_host, parse_target
from eaglepatch.ops.core import (
    FactsOptions,
    HostFacts,
    Plan,
    RuntimeOptions,
    Session,
    analyze_all,
    call,
    describe,
    new_lock_owner,
    gather,
    plan_apply,
    plan_revert,
    preload_transform,
    source_slices,
)
from eaglepatch.transform.recipe import Recipe, builtin_recipe, load_recipe_file

Say = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class Connect:
    """How to reach targets: the SSH options plus what discovery may be told."""

    identity: str | None = None
    port: int | None = None
    jump: str | None = None
    connect_timeout: float | None = 10.0
    accept_new_host_key: bool = False
    facts: FactsOptions = FactsOptions()

    def ssh(self) -> SSHOptions:
        return SSHOptions(identity=self.identity, port=self.port, jump=self.jump,
                          connect_timeout=self.connect_timeout, accept_new_host_key=self.accept_new_host_key)


def load_recipe(path: str | None) -> Recipe:
    return builtin_recipe() if path is None else load_recipe_file(path)


def restart_options(restart_cmd: str | None, systemd_unit: str | None, timeout: float) -> Any:
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
    out = [f"{doc['target']}: sglang {doc['sglang_version'] or '?'} at {doc['package_dir']}"]
    srv = doc.get("server")
    out.append(f"server: pid {srv['pid']}: {' '.join(srv['argv'])}" if srv else "server: none running")
    for f in doc["files"]:
        out.append(f"\n{f['path']}  [{f['state']}]")
        if f.get("refused"):
            out.append(f"  refused: {f['refused']}")
        for w in f["workers"]:
            if w.get("status"):
                out.append(f"  {w['class']}: {w['status']}: {w['reason']}")
                continue
            lines = w.get("lines") or [None, None]
            out.append(f"  {w['class']}.{w['method']} (lines {lines[0]}-{lines[1]}): phases {', '.join(w['phases'])}")
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
            out.append(f"{row['line']:>6}  {row['text']}{'  ' + tag + where if tag else ''}")
    return "\n".join(out)


def status(text: str, c: Connect, recipe: Recipe) -> dict[str, Any]:
    with _Target(text, c) as t:
        return describe(_facts(t, recipe), recipe)


def render_status(doc: dict[str, Any]) -> str:
    srv = doc.get("server")
    head = f"{doc['target']}: sglang {doc['sglang_version'] or '?'}; server " + (
        f"pid {srv['pid']}" if srv else "not running")
    rows = [head]
    for f in doc["files"]:
        phases = sorted({p for w in f["workers"] for p in w.get("phases", [])})
        rows.append(f"  {f['state']:<9} {f['path']}  ({', '.join(phases) or 'no phases'})")
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


def _launch_of(facts: HostFacts) -> Any:
    if not facts.server:
        return None
    from eaglepatch.server.process import ServerProcess

    return ServerProcess.from_scan(facts.server)


def apply(text: str, c: Connect, recipe: Recipe, ropts: RuntimeOptions, restart: Any, dry_run: bool,
          say: Say) -> dict[str, Any]:
    with _Target(text, c) as t:
        owner = None if dry_run else new_lock_owner()
        facts = _facts(t, recipe, owner)  # takes the lock in the same round trip (not for --dry-run)
        session = Session(t.host, facts.python, facts)
        if owner is not None:
            session.lock(owner)
        try:
            server = _launch_of(facts)
            launch = server.launch_spec().to_json() if server is not None else None
            plan = plan_apply(facts, recipe, ropts, launch=launch)
            for n in plan.notes:
                say(f"note: {n}")
            if dry_run:
                steps = [f"write {w.rel} ({'new' if w.before is None else 'replace'}, {len(w.data or b'')} bytes)"
                         for w in plan.writes]
                for s in steps or ["nothing to do: already patched"]:
                    say(f"plan: {s}")
                if plan.changed:
                    say(f"plan: back up originals to {facts.backup_dir}, then " +
                        ("restart the server" if restart is not None else "no restart"))
                return _change_doc(t.spec.name, plan, False, False, dry_run=True, diff=plan.diff(), action="apply")
            if not plan.changed:
                say(f"{t.spec.name}: already patched: nothing to change")
                return _change_doc(t.spec.name, plan, False, False, action="apply")
            # Without a restart, the lock is released by the same round trip that carries out the plan.
            session.execute(plan, release=restart is None)
            say(f"{t.spec.name}: patched {len(plan.files)} file(s); originals in {facts.backup_dir}")
            restarted = False
            if restart is not None:
                restarted = _restart_after_apply(t, facts, recipe, session, server, restart, say)
            return _change_doc(t.spec.name, plan, True, restarted, action="apply")
        finally:
            session.unlock()


def _no_server_note(say: Say, name: str, verb: str) -> None:
    say(f"{name}: {verb}; no sglang server is running, so nothing was restarted: start it "
        "(python -m sglang.launch_server ...) and the patch takes effect")


def _restart_after_apply(t: _Target, facts: HostFacts, recipe: Recipe, session: Session, server: Any,
                         ropts: Any, say: Say) -> bool:
    from eaglepatch.server.restart import restart

    if server is None and ropts.restart_cmd is None and ropts.systemd_unit is None:
        _no_server_note(say, t.spec.name, "patched")
        return False
    res = restart(t.host, current=server, options=ropts, progress=say, python=facts.python)
    if res.ready:
        return True
    # The patched server did not come up: put the originals back and bring the original server back.
    say(f"{t.spec.name}: the patched server is not ready ({res.message}); rolling back")
    if res.log_tail:
        say(res.log_tail)
    fresh = _facts(t, recipe)
    session.facts = fresh
    session.execute(plan_revert(fresh, recipe, force=True))
    launch = server.launch_spec() if server is not None else None
    back = restart(t.host, current=None, launch=launch, options=ropts, progress=say, python=fresh.python) \
        if (launch is not None or ropts.restart_cmd or ropts.systemd_unit) else None
    up = back is not None and back.ready
    raise RestartFailed(
        f"{t.spec.name}: the patched server was not ready within {ropts.timeout:.0f} s; original files restored; "
        + ("the original server is up again" if up else "the original server did NOT come back up: check it now"))


def revert(text: str, c: Connect, recipe: Recipe, force: bool, restart: Any, say: Say) -> dict[str, Any]:
    with _Target(text, c) as t:
        owner = new_lock_owner()
        # takes the lock in the same round trip; revert parses a file only when the manifest cannot vouch for it
        facts = _facts(t, recipe, owner, transform=False)
        session = Session(t.host, facts.python, facts)
        session.lock(owner)
        try:
            plan = plan_revert(facts, recipe, force=force)
            if not plan.changed:
                say(f"{t.spec.name}: not patched: nothing to revert")
                return _change_doc(t.spec.name, plan, False, False, action="revert")
            session.execute(plan, release=restart is None or not plan.files)
            for n in plan.notes:
                say(f"note: {n}")
            say(f"{t.spec.name}: reverted {len(plan.files)} file(s)")
            restarted = False
            if restart is not None and plan.files:
                restarted = _restart_after_revert(t, facts, restart, say)
            return _change_doc(t.spec.name, plan, True, restarted, action="revert")
        finally:
            session.unlock()


def _restart_after_revert(t: _Target, facts: HostFacts, ropts: Any, say: Say) -> bool:
    from eaglepatch.server.process import LaunchSpec
    from eaglepatch.server.restart import restart

    server = _launch_of(facts)
    launch = None
    if server is None and facts.manifest and facts.manifest.get("server"):
        launch = LaunchSpec.from_json(facts.manifest["server"])  # it crashed: start what apply recorded
        say(f"{t.spec.name}: no server running; starting the one recorded at apply time")
    if server is None and launch is None and ropts.restart_cmd is None and ropts.systemd_unit is None:
        _no_server_note(say, t.spec.name, "reverted")
        return False
    res = restart(t.host, current=server, launch=launch, options=ropts, progress=say, python=facts.python)
    if not res.ready:
        raise RestartFailed(f"{t.spec.name}: files reverted, but the server was not ready within "
                            f"{ropts.timeout:.0f} s: {res.message}\n{res.log_tail}".rstrip())
    return True


def restart_target(text: str, c: Connect, ropts: Any, say: Say) -> dict[str, Any]:
    from eaglepatch.server.process import find_servers, select_server
    from eaglepatch.server.restart import restart

    with _Target(text, c) as t:
        python = c.facts.python or "python3"
        server = select_server(find_servers(t.host, python))
        res = restart(t.host, current=server, options=ropts, progress=say,
                      python=server.exe if server is not None and server.exe else python)
        if not res.ready:
            raise RestartFailed(f"{t.spec.name}: not ready within {ropts.timeout:.0f} s: {res.message}\n"
                                f"{res.log_tail}".rstrip())
        doc = res.to_json()
        doc["target"] = t.spec.name
        return doc


def render_restart(doc: dict[str, Any]) -> str:
    return f"{doc['target']}: restarted ({doc['strategy']}), pid {doc['pid']}, ready in {doc['seconds']:.1f} s"


# ----------------------------------------------------------------------------------------------------------------
# report


def _cache_root() -> pathlib.Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "eaglepatch" / "logs"


def fetch_logs(text: str, c: Connect, log_dir: str | None, say: Say) -> str:
    """Copy a target's timing logs into the local cache, fetching only bytes not fetched before; return the
    local folder."""
    with _Target(text, c) as t:
        python = c.facts.python or "python3"
        if log_dir is None:
            try:
                facts = _facts(t, builtin_recipe(), transform=False)
                log_dir = ((facts.manifest or {}).get("runtime") or {}).get("log_dir")
                python = facts.python
            except Unsupported:
                pass
        log_dir = log_dir or "/tmp/eaglepatch"
        return fetch_logs_from(t.host, t.spec.name, python, log_dir, say)


def fetch_logs_from(host: Host, name: str, python: str, log_dir: str, say: Say) -> str:
    """``fetch_logs`` on an open host: copy the new bytes of ``log_dir``'s timing logs into the local cache
    folder of the target ``name``; return that folder."""
    safe = "".join(ch if ch.isalnum() or ch in "-_.@" else "_" for ch in name)
    dest = _cache_root() / safe
    dest.mkdir(parents=True, exist_ok=True, mode=0o700)
    have = {p.name: p.stat().st_size for p in dest.glob("*.jsonl")}
    res = call(host, python, "logs", log_dir=log_dir, have=have)
    if res.get("error"):
        raise UsageError(f"{name}: {res['error']}")
    fetched = 0
    import base64

    for f in res["files"]:
        p = dest / f["name"]
        data = base64.b64decode(f["data"])
        if f["offset"] == 0:
            p.write_bytes(data)
        else:
            with open(p, "ab") as fh:
                fh.write(data)
        fetched += len(data)
    say(f"{name}: {len(res['files'])} log file(s) from {log_dir}, {fetched} new bytes -> {dest}")
    return str(dest)


def report(sources: Sequence[str], c: Connect, *, by: str | None, skip: int, trace: str | None, compare: bool,
           log_dir: str | None, fmt: str, say: Say) -> str:
    from eaglepatch import report as rep

    local: list[str] = []
    for s in sources:
        if os.path.exists(s) or is_local_target(s):
            local.append(s)
        else:
            local.append(fetch_logs(s, c, log_dir, say))
    if compare:
        results = [rep.aggregate(rep.iter_log_files([p]), by=by, skip=skip) for p in local]
        cmp = rep.compare(results, list(sources))
        if fmt == "json":
            return json.dumps(cmp.to_json(), indent=1) + "\n"
        if fmt == "csv":
            return rep.render_compare_csv(cmp)
        return rep.render_compare_table(cmp) + "\n"
    files = rep.iter_log_files(local)
    if not files:
        raise UsageError(f"no timing logs (*.jsonl) in {', '.join(sources)}: apply first, then put load on the "
                         "server")
    result = rep.aggregate(files, by=by, skip=skip, trace_path=trace)
    if trace:
        say(f"trace written to {trace}: open it in https://ui.perfetto.dev")
    if fmt == "json":
        doc = result.to_json()
        doc["sources"] = list(sources)
        return json.dumps(doc, indent=1) + "\n"
    if fmt == "csv":
        return rep.render_csv(result)
    return rep.render_table(result) + "\n"
