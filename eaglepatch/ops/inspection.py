"""show, status and diff: what a target's install looks like (the ``status --json`` / ``show --json`` documents of
docs/contract.md: files, workers, phases, servers, lock) and the diff apply would make; and their renderings.
Nothing here changes the target."""

from __future__ import annotations

import json
import re
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
    """Every server of the install: pid, argv, port, cwd, launcher, how it was launched, its start, ``code``:
    ``current`` when it started after the code on disk last changed, ``stale`` when before (it still runs the
    code from before the last apply or revert: restart it), ``unknown`` when that cannot be told; and
    ``output``: where its output goes, and where a restart by eaglepatch writes it (``ServerProcess.output_json``)."""
    from eaglepatch.server.process import ServerProcess

    out = []
    for item in facts.servers:
        srv = ServerProcess.from_scan(item)
        # what is printed of a command line: its secrets masked (eaglepatch.redact), in the JSON too
        out.append(dict(srv.to_json(), argv=mask_argv(srv.argv), code=code_state(srv.started_at, facts),
                        output=srv.output_json()))
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
            "leftovers": list(facts.stale_temps), **recorded_json(facts, servers)}


def recorded_json(facts: HostFacts, servers: list[dict[str, Any]]) -> dict[str, Any]:
    """What the install's manifest keeps of the nodes of a multi-node server: ``restart_record`` (the manifest is
    a restart's record alone: the install is not patched) and ``recorded_nodes``, each recorded node that does not
    run now (``{"port", "nodes", "argv"}``: a restart or revert naming every node starts it from there)."""
    from eaglepatch.ops.nodes import RECORD, Recorded

    running = {s.get("port") for s in servers}
    gone = [r for r in map(Recorded.of, facts.manifest_servers())
            if r is not None and r.nodes is not None and r.port not in running]
    return {"restart_record": bool(facts.manifest and facts.manifest.get(RECORD)),
            "recorded_nodes": [{"port": r.port, "nodes": r.nodes.to_json(), "argv": mask_argv(list(r.launch.argv))}
                               for r in gone]}


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
        if srv.get("output"):
            out.append("  output: " + _output_words(srv["output"]))
        nodes = srv.get("nodes")
        if nodes:
            out.append(f"  node rank {nodes['rank']} of {nodes['count']} (--dist-init-addr "
                       f"{shown(str(nodes['dist_init_addr']))}): eaglepatch does not restart one node alone (apply and "
                       "revert --no-restart change its files)")
        side = srv.get("disaggregation")
        if side:
            other = "decode" if side == "prefill" else "prefill"
            out.append(f"  the {side} side of a prefill/decode pair (--disaggregation-mode {side}): eaglepatch "
                       f"restarts it only with its {other} side named in the same command")
    for other in doc.get("other_servers") or ():
        out.append(f"other server: pid {other['pid']} on :{other.get('port')} runs another install "
                   f"({shown(other.get('package_dir') or 'unknown')}): left alone")
    for rec in doc.get("recorded_nodes") or ():
        n = rec["nodes"]
        out.append(f"recorded: node rank {n['rank']} of {n['count']} on :{rec['port']} does not run; its launch is "
                   "kept in the install's manifest: 'eaglepatch restart' (or revert) naming every node of the server "
                   "starts it from there")
    if doc.get("restart_record"):
        out.append("restart record: the launches of this install's nodes, written before eaglepatch stopped the "
                   "nodes of a multi-node server; the next restart or revert naming every node removes it once the "
                   "server is up (the install is not patched)")
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


def _output_words(output: dict[str, Any]) -> str:
    """Where a server's output goes (``servers_json``'s ``output``), and where it goes once eaglepatch restarts it."""
    out, err = output.get("stdout"), output.get("stderr")
    if out:
        both = f"{shown(out)}" + (f" (stderr: {shown(err)})" if err and err != out else "")
        return f"{both}: a restart by eaglepatch appends to it, as the server does"
    words = ("not to a file (a terminal, a pipe, a socket or /dev/null, or unknown): a restart by eaglepatch "
             f"writes it to {shown(output.get('log') or '?')}")
    return words + (f" (stderr: {shown(err)}, appended to)" if err else "")


def status(spec: TargetSpec, c: Connect, recipe: Recipe) -> dict[str, Any]:
    """``status`` of one target: the ``status --json`` document, with the timing logs' size and drops."""
    with Target(spec, c) as t:
        facts = target_facts(t, recipe)
        doc = describe(facts, recipe)
        doc["logs"] = logs_json(t.host, facts)
        return doc


# A timing log's name (the runtime's; hostside/logs.py lists the same): <host>-<pid>-rank<r>.jsonl, then the chain's
# <host>-<pid>-rank<r>.<i>.jsonl (--max-log-mb)
_LOG_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*-([0-9]+)-rank([0-9]+)(?:\.([0-9]+))?\.jsonl")
_HEAD_BYTES = 16 << 10  # of each running rank's newest log: its run header and the drops line after it
_TAIL_BYTES = 128 << 10  # ... and its last lines: the drops line of the last ten seconds' losses


def logs_json(host: Any, facts: HostFacts) -> dict[str, Any] | None:
    """The timing logs of the install's runtime, for ``status``, read by the host's ``logs`` op (its rules: the
    configured folder and where the servers' runtime really writes): ``{"log_dir", "files", "bytes", "current":
    {"files", "bytes"} (the running servers' processes'), "max_log_mb", "min_free_mb", "dropped", "reasons"}``;
    ``dropped``/``reasons``: what the running servers' runtime dropped, as the drops lines say that lie at the head
    and in the last lines of each rank's newest file (docs/contract.md, "Bounds inside the server"). None when no
    runtime is installed; ``{"log_dir", "error"}`` when the logs cannot be read."""
    from eaglepatch.errors import EaglepatchError
    from eaglepatch.hosts.agent import call
    from eaglepatch.ops.runtime_file import runtime_config

    if facts.runtime_data is None:
        return None
    cfg = runtime_config(facts.runtime_data)
    log_dir = cfg.get("log_dir") if isinstance(cfg.get("log_dir"), str) else "/tmp/eaglepatch"
    pids = sorted({p for s in facts.servers for p in (s["pid"], *(s.get("children") or ()))})
    out: dict[str, Any] = {"log_dir": log_dir, "max_log_mb": cfg.get("max_log_mb"),
                           "min_free_mb": cfg.get("min_free_mb")}

    def ask(have: dict[str, int], upto: dict[str, int]) -> Any:
        return call(host, facts.python, "logs", log_dir=log_dir, pids=pids, have=have, upto=upto, budget=4 << 20)

    files = _listing(ask)
    if isinstance(files, str):
        return dict(out, error=files)
    current = [f for f in files if f[3] in pids]
    out.update(files=len(files), bytes=sum(f[2] for f in files),
               current={"files": len(current), "bytes": sum(f[2] for f in current)})
    drops: dict[tuple[int, int], dict[str, Any]] = {}
    keys = _newest(current)
    try:
        ends = {k: f[2] for k, f in keys.items()}  # each file's own size (not the last one listed)
        for have, upto in (({k: 0 for k in keys}, {k: min(e, _HEAD_BYTES) for k, e in ends.items()}),
                           ({k: max(0, e - _TAIL_BYTES) for k, e in ends.items()}, ends)):
            if keys:
                _drops_seen(ask(have, upto), drops)
    except EaglepatchError:
        pass  # the sizes stand; the drops are not known
    reasons: dict[str, int] = {}
    for d in drops.values():
        for why, n in d["reasons"].items():
            reasons[why] = reasons.get(why, 0) + n
    out.update(dropped=sum(d["dropped"] for d in drops.values()), reasons=dict(sorted(reasons.items())))
    return out


LogFile = tuple  # (folder, name, size, pid, rank, index) of one timing log on the host


def _listing(ask: Callable[[dict[str, int], dict[str, int]], Any], catch: bool = True) -> list[LogFile] | str:
    """The timing logs the host's ``logs`` op lists (``ask({}, {})``: every file's size, no byte of it), or why
    not (a string: the host's answer, or with ``catch`` a failed request)."""
    from eaglepatch.errors import EaglepatchError

    try:
        listing = ask({}, {})
    except EaglepatchError as exc:
        if not catch:
            raise
        return str(exc)
    if not isinstance(listing, dict) or listing.get("error") or not isinstance(listing.get("names"), dict):
        return str(listing.get("error") if isinstance(listing, dict) else "no answer")[:300]
    files = []
    for folder, names in listing["names"].items():
        sizes = (listing.get("sizes") or {}).get(folder)
        if not isinstance(names, list) or not isinstance(sizes, list) or len(sizes) != len(names):
            continue
        for name, size in zip(names, sizes):
            m = _LOG_NAME.fullmatch(name) if isinstance(name, str) else None
            if m and type(size) is int and size >= 0:
                files.append((str(folder), name, size, int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)))
    return files


def _newest(files: list[LogFile]) -> dict[str, LogFile]:
    """Each process's and rank's newest file (the chain's highest index), by its ``folder/name``."""
    newest: dict[tuple[str, int, int], LogFile] = {}
    for f in files:
        key = (f[0], f[3], f[4])
        if key not in newest or f[5] > newest[key][5]:
            newest[key] = f
    return {f"{f[0]}/{f[1]}": f for f in newest.values()}


def log_tails(host: Any, python: str, log_dir: str, pids: set[int], tail_bytes: int) -> list[bytes] | None:
    """The last ``tail_bytes`` of each rank's timing logs of ``pids`` (its newest file, and the one before it in the
    chain where the newest is shorter: a rotation just made; whole lines: one cut at the start is left out), for
    what the last seconds' records say without fetching the logs whole (up to ``--max-log-mb``); None when the host
    says it has none it may read. A failed request raises (EaglepatchError): whoever decides from the records must
    not take a failure for their absence."""
    from eaglepatch.hosts.agent import call

    def ask(have: dict[str, int], upto: dict[str, int]) -> Any:
        return call(host, python, "logs", log_dir=log_dir, pids=sorted(pids), have=have, upto=upto, budget=32 << 20)

    files = _listing(ask, catch=False)
    if isinstance(files, str):
        return None
    mine = [f for f in files if f[3] in pids]
    keys = _newest(mine)
    if not keys:
        return []
    have = {k: max(0, f[2] - tail_bytes) for k, f in keys.items()}
    for f in list(keys.values()):
        before = [g for g in mine if g[:1] + g[3:5] == f[:1] + f[3:5] and g[5] < f[5]]
        if f[2] < tail_bytes and before:  # the rest of the tail from the file before it
            g = max(before, key=lambda g: g[5])
            keys[f"{g[0]}/{g[1]}"] = g
            have[f"{g[0]}/{g[1]}"] = max(0, g[2] - (tail_bytes - f[2]))
    res = ask(have, {k: f[2] for k, f in keys.items()})
    out = []
    if isinstance(res, dict) and isinstance(res.get("files"), list):
        for entry, blob in zip(res["files"], res.get("__blobs__") or []):
            data = b"".join(p for p in blob if isinstance(p, bytes)) if isinstance(blob, list) else blob
            if isinstance(entry, dict) and isinstance(data, bytes):
                out.append(data.split(b"\n", 1)[-1] if entry.get("offset") else data)
    return out


def _drops_seen(res: Any, drops: dict[tuple[int, int], dict[str, Any]]) -> None:
    """The drops lines in the bytes of a ``logs`` answer (the host's word: each line checked), the one saying the
    most kept per process (pid, rank): their counts only grow."""
    if not isinstance(res, dict) or not isinstance(res.get("files"), list):
        return
    blobs = res.get("__blobs__") or []
    for entry, blob in zip(res["files"], blobs):
        if not isinstance(entry, dict):
            continue
        # an attachment as the agent reads it: a list of pieces (or bytes)
        data = b"".join(p for p in blob if isinstance(p, bytes)) if isinstance(blob, list) else blob
        if not isinstance(data, bytes):
            continue
        lines = data.split(b"\n")
        if entry.get("offset"):
            lines = lines[1:]  # read from inside a line
        for line in lines:
            if b'"drops"' not in line or len(line) > 4096:
                continue
            try:
                d = json.loads(line)
            except ValueError:
                continue
            if not (isinstance(d, dict) and d.get("kind") == "drops" and type(d.get("pid")) is int
                    and type(d.get("rank")) is int and type(d.get("dropped")) is int and d["dropped"] >= 0
                    and isinstance(d.get("reasons"), dict)):
                continue
            why = {str(k)[:32]: v for k, v in d["reasons"].items() if type(v) is int and v >= 0}
            key = (d["pid"], d["rank"])
            if key not in drops or d["dropped"] > drops[key]["dropped"]:
                drops[key] = {"dropped": d["dropped"], "reasons": why}


def _size_words(n: int) -> str:
    for unit, size in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} bytes"


def _logs_line(logs: dict[str, Any]) -> str:
    """``status``'s line on the timing logs: their size, the running servers' share of it, and what was dropped."""
    where = shown(str(logs.get("log_dir")))
    if logs.get("error"):
        return f"timing logs: {where}: {shown(str(logs['error']))}"
    cur = logs.get("current") or {}
    line = (f"timing logs: {_size_words(int(logs.get('bytes') or 0))} in {logs.get('files', 0)} file(s) in {where}"
            f"; the running servers': {_size_words(int(cur.get('bytes') or 0))}")
    if isinstance(logs.get("max_log_mb"), (int, float)):
        line += f" (--max-log-mb {logs['max_log_mb']:g} per launch, --min-free-mb {logs.get('min_free_mb') or 0:g})"
    if logs.get("dropped"):
        why = ", ".join(f"{shown(k)} {v}" for k, v in (logs.get("reasons") or {}).items())
        line += f"; {logs['dropped']} record(s) dropped" + (f" ({why})" if why else "")
    return line


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
    if doc.get("logs"):
        rows.append("  " + _logs_line(doc["logs"]))
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
