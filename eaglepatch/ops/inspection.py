"""show, status and diff: what a target's install looks like (the ``status --json`` / ``show --json`` documents of
docs/contract.md: files, workers, phases, servers, lock) and the diff apply would make; and their renderings.
Nothing here changes the target."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable

from eaglepatch.collector import few_collections
from eaglepatch.hosts.spec import TargetSpec
from eaglepatch.ops import lazy_engine
from eaglepatch.ops.facts import HostFacts, code_state, file_state, short_path
from eaglepatch.ops.options import RuntimeOptions, worker_timer
from eaglepatch.ops.plan import plan_apply
from eaglepatch.ops.target import Connect, Target, target_facts
from eaglepatch.redact import mask_argv, shown, shown_argv
from eaglepatch.transform.recipe import Recipe

if TYPE_CHECKING:
    from eaglepatch.transform.engine import TransformResult, WorkerInfo

Say = Callable[[str], None]


def worker_json(w: WorkerInfo) -> dict[str, Any]:
    """One worker class of a file, as ``show --json`` and ``status --json`` give it."""
    out: dict[str, Any] = {"class": w.cls, "method": w.method, "phases": w.phase_names}
    if w.status == "supported":
        out["timer"] = w.timer or "sync"  # the family's: what --mode auto gives it
    if w.status != "supported":
        out["status"] = w.status
        out["reason"] = w.reason
    else:
        out["lines"] = [w.method_start, w.method_end]
        out["call_sites"] = [{"phase": p.phase, "mode": p.mode, "method": p.method, "line": p.line} for p in w.phases]
        out["accepted"] = [{"method": x.method, "line": x.line, "from": x.expr} for x in w.facts]
    return out


def servers_json(facts: HostFacts) -> list[dict[str, Any]]:
    """Every server of the install: pid, argv, port, cwd, launcher, how it was launched, its start, and ``code``:
    ``current`` when it started after the code on disk last changed, ``stale`` when before (it still runs the
    code from before the last apply or revert: restart it), ``unknown`` when that cannot be told."""
    from eaglepatch.server.process import ServerProcess

    out = []
    for item in facts.servers:
        srv = ServerProcess.from_scan(item)
        # what is printed of a command line: its secrets masked (eaglepatch.redact), in the JSON too
        out.append(dict(srv.to_json(), argv=mask_argv(srv.argv), code=code_state(srv.started_at, facts)))
    return out


def interrupted_json(facts: HostFacts) -> dict[str, Any] | None:
    """The lock an eaglepatch run holds (or left when it was killed), for status: who, from where, since when."""
    lock = facts.lock
    if not lock:
        return None
    return {k: lock.get(k) for k in ("user", "client_host", "client_pid", "time", "what") if k in lock}


def analyze_all(facts: HostFacts, recipe: Recipe) -> dict[str, TransformResult]:
    """What the transform finds in each worker file, by path: one analysis that ``describe`` and
    ``source_slices`` share."""
    analyze = lazy_engine.engine().analyze
    with few_collections():
        return {f.path: analyze(f.text, f.path, recipe) for f in facts.files}


def describe(facts: HostFacts, recipe: Recipe,
             analyses: dict[str, TransformResult] | None = None) -> dict[str, Any]:
    """The ``status --json`` / ``show --json`` object of docs/contract.md (show adds slices on top)."""
    analyses = analyses if analyses is not None else analyze_all(facts, recipe)
    Refused = lazy_engine.engine().Refused
    files = []
    for f in facts.files:
        res = analyses[f.path]
        workers = [] if isinstance(res, Refused) else [worker_json(w) for w in res.workers]
        if not workers and not isinstance(res, Refused):
            continue
        entry: dict[str, Any] = {"path": short_path(f.path), "state": file_state(facts, f, recipe), "workers": workers}
        if isinstance(res, Refused):
            entry["refused"] = res.message()
        files.append(entry)
    servers = servers_json(facts)
    return {"target": facts.target, "sglang_version": facts.version, "package_dir": facts.package_dir,
            "files": files, "runtime": {"path": facts.runtime_path, "present": facts.runtime_sha256 is not None},
            "server": servers[0] if servers else None, "servers": servers,
            "other_servers": [dict(s) for s in facts.other_servers], "lock": interrupted_json(facts),
            "leftovers": list(facts.stale_temps)}


def source_slices(facts: HostFacts, analyses: dict[str, TransformResult]) -> list[dict[str, Any]]:
    """The numbered source of each supported entry method (and its helpers' phase lines), for ``show``."""
    out = []
    Instrumented = lazy_engine.engine().Instrumented
    for f in facts.files:
        res = analyses[f.path]
        if not isinstance(res, Instrumented):
            continue
        lines = f.text.splitlines()
        for w in res.workers:
            if w.status != "supported" or w.method_start is None or w.method_end is None:
                continue
            marks = {p.line: p.phase for p in w.phases}
            body = []
            for n in range(w.method_start, w.method_end + 1):
                body.append({"line": n, "text": lines[n - 1], "phase": marks.get(n)})
            extra = [p for p in w.phases if not (w.method_start <= p.line <= w.method_end)]
            for p in extra:
                body.append({"line": p.line, "text": lines[p.line - 1], "phase": p.phase, "method": p.method})
            out.append({"path": short_path(f.path), "class": w.cls, "method": w.method, "source": body})
    return out


def show(spec: TargetSpec, c: Connect, recipe: Recipe) -> dict[str, Any]:
    """``show`` of one target: the ``show --json`` document (``describe`` plus the numbered source slices)."""
    with Target(spec, c) as t:
        facts = target_facts(t, recipe)
        analyses = analyze_all(facts, recipe)
        doc = describe(facts, recipe, analyses)
        doc["slices"] = source_slices(facts, analyses)
        return doc


def render_show(doc: dict[str, Any]) -> str:
    """``show``'s text: the install, its servers, each file's workers, phases and call sites, the source slices."""
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
        nodes = srv.get("nodes")
        if nodes:
            out.append(f"  node rank {nodes['rank']} of {nodes['count']} (--dist-init-addr "
                       f"{shown(str(nodes['dist_init_addr']))}): eaglepatch does not restart one node alone (apply and "
                       "revert --no-restart change its files)")
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


def status(spec: TargetSpec, c: Connect, recipe: Recipe) -> dict[str, Any]:
    """``status`` of one target: the ``status --json`` document."""
    with Target(spec, c) as t:
        return describe(target_facts(t, recipe), recipe)


def render_status(doc: dict[str, Any]) -> str:
    """``status``'s text: one line per worker file, a missing runtime, the servers and a lock."""
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


def diff(spec: TargetSpec, c: Connect, recipe: Recipe, ropts: RuntimeOptions, say: Say) -> str:
    """``diff`` of one target: the unified diff apply would make (notes said through ``say``); changes nothing."""
    with Target(spec, c) as t:
        facts = target_facts(t, recipe)
        plan = plan_apply(facts, recipe, ropts)
        for n in plan.notes:
            say(f"note: {n}")
        if not plan.changed:
            say(f"{t.spec.name}: already patched: nothing to change")
        return plan.diff()
