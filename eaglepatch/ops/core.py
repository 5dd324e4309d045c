"""Facts, plans, and carrying them out: what show, diff, apply, revert and status do to one target.

pyinfra's split: ``gather`` reads facts from the host in one round trip; ``plan_apply`` / ``plan_revert`` are pure
(facts in, a ``Plan`` of writes out: nothing runs); ``execute`` ships the plan to the host in one round trip, where
it is checked, validated with the server's interpreter, backed up and swapped in, all or nothing.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import difflib
import functools
import gc
import getpass
import hashlib
import json
import os
import pathlib
import re
import secrets
import socket
import time
import sys
import threading
from typing import TYPE_CHECKING, Any, Iterator, Sequence

from eaglepatch import __version__, progress
from eaglepatch.errors import Conflict, ConnectionFailed, EaglepatchError, Unsupported, UsageError, ValidationFailed
from eaglepatch.failpoints import remote_fault
from eaglepatch.hosts.agent import call
from eaglepatch.hosts.base import Host
from eaglepatch.redact import mask_argv
from eaglepatch.transform.marks import RUNTIME_MODULE, is_instrumented, strip_lines
from eaglepatch.transform.recipe import Recipe

if TYPE_CHECKING:
    from eaglepatch.transform.engine import TransformResult, WorkerInfo

RUNTIME_FILE = RUNTIME_MODULE + ".py"
_ENGINE = "eaglepatch.transform.engine"


def _engine() -> Any:
    """The transform (libcst), imported on first use: ``revert`` of files the manifest vouches for never needs it."""
    from eaglepatch.transform import engine

    return engine


def preload_transform() -> None:
    """Start importing the transform (libcst: the largest import) on a thread of its own, so that it runs while
    the facts round trip waits on the host; the first use of it then waits for that import (Python's import lock),
    never imports twice."""
    if _ENGINE in sys.modules:
        return

    def load() -> None:
        try:
            _engine()
        except BaseException:  # the first use imports it again and meets the error itself
            return
        # What is loaded now (libcst, typer, paramiko: modules, classes, functions) lives as long as the command;
        # the collector stops walking it on each full collection. The transform allocates trees by the ten
        # thousand, and those walks cost it about a fifth of its time (the worker files of sglang 0.5.16 in a fresh
        # process, 2026-12-01: 306-339 ms with them, 235-266 ms without).
        gc.freeze()

    threading.Thread(target=load, name="eaglepatch-import-transform").start()


# The young generation's threshold while the transform runs (Python's default: 700 allocations). libcst allocates
# trees by the ten thousand, nearly all freed by reference counting, and each young collection walks them again:
# measured on the worker files of sglang 0.5.16 in a fresh process after gc.freeze (2026-12-02), the first
# plan_apply took 0.30-0.37 s with the default and 0.20 s with this one; in the CLI's own flow (bench_ssh's
# breakdown) the transform's time went from 0.20 s to 0.19 s, within that benchmark's noise. Cycles are still
# collected, only less often.
_TRANSFORM_GC_THRESHOLD = 50_000


_GC_LOCK = threading.Lock()
_GC_STATE: list[Any] = [0, None]  # blocks inside _few_collections (several targets plan at once), saved threshold


@contextlib.contextmanager
def _few_collections() -> Iterator[None]:
    """Raise the young generation's collection threshold for the block; the last block to end (targets plan on
    threads of their own) puts the old one back."""
    with _GC_LOCK:
        if _GC_STATE[0] == 0:
            _GC_STATE[1] = gc.get_threshold()
            gc.set_threshold(max(_GC_STATE[1][0], _TRANSFORM_GC_THRESHOLD), *_GC_STATE[1][1:])
        _GC_STATE[0] += 1
    try:
        yield
    finally:
        with _GC_LOCK:
            _GC_STATE[0] -= 1
            if _GC_STATE[0] == 0:
                gc.set_threshold(*_GC_STATE[1])


_CONFIG_LINE = re.compile(r"^_CONFIG = .*# eaglepatch:config$", re.M)


# ----------------------------------------------------------------------------------------------------------------
# Options


@dataclasses.dataclass(frozen=True)
class RuntimeOptions:
    """How the runtime inside the server times: ``apply --mode/--every/--log-dir``.

    ``auto`` (the default) gives each worker its family's timer (the recipe's ``timer``): ``sync`` where the worker
    runs without the overlap scheduler, ``events`` where it runs under it; ``sync``/``events`` force one for all."""

    mode: str = "auto"
    every: int = 1
    log_dir: str = "/tmp/eaglepatch"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise UsageError(f"--mode must be auto, sync or events, not {self.mode!r}")
        if self.every < 1:
            raise UsageError("--every must be 1 or more")
        if not self.log_dir.startswith("/"):
            raise UsageError(f"--log-dir must be an absolute path on the target, not {self.log_dir!r}")


@dataclasses.dataclass(frozen=True)
class FactsOptions:
    """What discovery may be told: ``--python`` and ``--sglang-path``."""

    python: str | None = None
    sglang_path: str | None = None
    server_ports: tuple[int, ...] = ()  # --server-port: act on these servers of the install only


MODES = ("auto", "sync", "events", "cpu")
# Why a worker gets its timer, for show and apply.
TIMER_WHY = {
    "sync": "no overlap scheduler: verify waits for the GPU anyway, so synchronize + perf_counter costs little",
    "events": "overlap scheduler: a synchronize would stall it, CUDA events time the GPU without waiting",
}


def worker_timer(mode: str, family_timer: str | None) -> tuple[str, str]:
    """(timer, why) a worker gets under ``--mode``: its family's with ``auto``, else the one asked for."""
    if mode == "auto":
        timer = family_timer or "sync"
        return timer, TIMER_WHY[timer]
    if mode == "sync" and family_timer == "events":
        return mode, ("--mode sync on an overlap-scheduler worker: each synchronize stalls the overlap (it cost "
                      "23-44% of throughput on an H200, docs/benchmarks.md); --mode auto gives it events")
    return mode, f"--mode {mode}"


@functools.lru_cache(maxsize=1)
def runtime_template() -> str:
    return (pathlib.Path(__file__).parent.parent / "runtime" / RUNTIME_FILE).read_text(encoding="utf-8")


def render_runtime(opts: RuntimeOptions, timers: dict[str, str] | None = None) -> str:
    """The runtime module's source with its config line set to ``opts``; ``timers``: worker class -> its timer,
    for ``auto`` (the runtime picks by the class of the worker it times)."""
    config = {"mode": opts.mode, "timers": dict(sorted((timers or {}).items())), "every": opts.every,
              "log_dir": opts.log_dir, "summary_every": 2000, "flush_records": 256, "flush_seconds": 2.0}
    line = f"_CONFIG = {json.dumps(config)}  # eaglepatch:config"
    src, n = _CONFIG_LINE.subn(lambda _m: line, runtime_template(), count=1)
    if n != 1:
        raise EaglepatchError("the runtime module lost its config line: reinstall eaglepatch")
    return src


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ----------------------------------------------------------------------------------------------------------------
# Facts


@dataclasses.dataclass(frozen=True)
class WorkerFile:
    """A worker file read from the target: ``path`` is relative to the package's parent (sglang/srt/...)."""

    path: str
    abs: str
    data: bytes
    sha256: str
    mode: int
    mtime: float = 0.0

    @property
    def text(self) -> str:
        return self.data.decode("utf-8")


@dataclasses.dataclass(frozen=True)
class HostFacts:
    """What one round trip read from the target."""

    target: str
    hostname: str
    python: str
    package_dir: str
    version: str | None
    spec_dir: str
    files: tuple[WorkerFile, ...]
    manifest: dict[str, Any] | None
    manifest_path: str
    backup_dir: str
    backups: dict[str, str | None]
    runtime_path: str
    runtime_sha256: str | None
    lock_path: str
    lock: dict[str, Any] | None
    lock_result: dict[str, Any] | None
    servers: tuple[dict[str, Any], ...]
    other_servers: tuple[dict[str, Any], ...] = ()
    user: str | None = None
    owner: str | None = None
    writable: bool = True
    runtime_mtime: float | None = None
    runtime_data: bytes | None = None
    stale_temps: tuple[str, ...] = ()  # temp files a killed apply or revert left (the next one removes them)

    @property
    def code_mtime(self) -> float | None:
        """When the code a server imports last changed on disk: the newest of the worker files and the runtime
        module (apply and revert replace them). A server started before that runs older code."""
        times = [f.mtime for f in self.files if f.mtime] + ([self.runtime_mtime] if self.runtime_mtime else [])
        return max(times) if times else None

    def manifest_servers(self) -> list[dict[str, Any]]:
        """The servers ``apply`` recorded (``servers``: one entry each, with its launch spec; an older
        manifest's single ``server`` spec reads as one entry)."""
        m = self.manifest or {}
        if isinstance(m.get("servers"), list):
            return [s for s in m["servers"] if isinstance(s, dict)]
        if isinstance(m.get("server"), dict):
            return [{"port": m["server"].get("port"), "launch": m["server"]}]
        return []

    def cannot_write(self) -> str | None:
        """Why this user cannot change the install (one line with what to do), or None when it can."""
        result = self.lock_result or {}
        if self.writable and not result.get("denied"):
            return None
        reason = str(result.get("error") or "").rpartition(": ")[2] or "Permission denied"
        if self.owner and self.user and self.owner != self.user:
            todo = (f"run eaglepatch as {self.owner}" + ("" if self.owner == "root" else " or root")
                    + " (the install's owner), or give --python of an install you own")
        else:
            todo = "make it writable (a read-only file system or an immutable folder?), or use an install you can write"
        return f"{self.target}: user {self.user or '?'} cannot write {self.spec_dir}: {reason}: {todo}"

    def manifest_entry(self, path: str) -> dict[str, Any] | None:
        """The manifest's record of a worker file (``path`` as read, sglang/srt/...), if any."""
        short = _short(path)
        for f in (self.manifest or {}).get("files", []):
            if f.get("path") == short:
                return f
        return None


class AmbiguousInstall(UsageError):
    """Servers of several sglang installs run on the host, and nothing named the one meant."""


def new_lock_owner(what: str = "") -> dict[str, Any]:
    """Who takes a lock: a fresh token, this machine, this process (so a lock left by a dead run is known stale),
    and what it does (``apply``, ``revert``, ``sweep``: status names it)."""
    return {"token": secrets.token_hex(8), "client_host": socket.gethostname(), "client_pid": os.getpid(),
            "user": getpass.getuser(), "eaglepatch": __version__, "what": what}


def gather(host: Host, opts: FactsOptions, entry_names: Sequence[str],
           lock_owner: dict[str, Any] | None = None, ttl: float = 7200) -> HostFacts:
    """Read the target's facts in one round trip, taking the install's lock in it when ``lock_owner`` is given
    (``Session.lock`` then checks the outcome); raises ``Unsupported`` when there is no sglang."""
    pattern = r"def (" + "|".join(re.escape(n) for n in sorted(entry_names)) + r")\b|^class \w+\("
    lock = {"owner": lock_owner, "ttl": ttl} if lock_owner else None
    raw = call(host, opts.python or "python3", "facts", python=opts.python, sglang_path=opts.sglang_path,
               pattern=pattern, lock=lock)
    if raw.get("ambiguous"):  # AmbiguousInstall: a UsageError
        listing = "; ".join(f"{a['package_dir']} (" + ", ".join(f"pid {s['pid']} on :{s['port']}"
                                                                  for s in a["servers"]) + ")"
                            for a in raw["ambiguous"])
        raise AmbiguousInstall(f"{host.name}: servers of several sglang installs run here: {listing}: name the one "
                               "to act on with --sglang-path DIR (or --python)")
    if raw.get("error"):
        hint = " (give --python or --sglang-path)" if not opts.sglang_path else ""
        raise Unsupported(f"{host.name}: {raw['error']}{hint}")
    if not raw.get("package_dir"):
        raise Unsupported(
            f"{host.name}: no sglang package found for {raw.get('python')}: "
            "point at it with --sglang-path DIR (or --python for the server's interpreter)")
    files = tuple(
        WorkerFile(f["path"], f["abs"], base64.b64decode(f["data"]), f["sha256"], f["mode"], f.get("mtime") or 0.0)
        for f in raw.get("files", [])
    )
    return HostFacts(
        target=host.name,
        hostname=raw["hostname"],
        python=raw["python"],
        package_dir=raw["package_dir"],
        version=raw.get("version"),
        spec_dir=raw["spec_dir"],
        files=files,
        manifest=raw.get("manifest"),
        manifest_path=raw["manifest_path"],
        backup_dir=raw["backup_dir"],
        backups=raw.get("backups") or {},
        runtime_path=raw["runtime_path"],
        runtime_sha256=raw.get("runtime_sha256"),
        lock_path=raw["lock_path"],
        lock=raw.get("lock"),
        lock_result=raw.get("lock_result"),
        servers=tuple(raw.get("servers") or ()),
        other_servers=tuple(raw.get("other_servers") or ()),
        user=raw.get("user"),
        owner=raw.get("owner"),
        writable=bool(raw.get("writable", True)),
        runtime_mtime=raw.get("runtime_mtime"),
        stale_temps=tuple(t for t in raw.get("stale_temps") or () if isinstance(t, str)),
        runtime_data=base64.b64decode(raw["runtime_data"]) if raw.get("runtime_data") else None,
    )


# ----------------------------------------------------------------------------------------------------------------
# What each file is


def file_state(facts: HostFacts, f: WorkerFile, recipe: Recipe) -> str:
    """``pristine``, ``patched`` or ``drifted`` (changed since eaglepatch patched it, or half-patched)."""
    entry = facts.manifest_entry(f.path)
    if entry is not None:
        if f.sha256 == entry.get("after_sha256"):
            return "patched"
        if f.sha256 == entry.get("before_sha256"):
            return "pristine"
        return "drifted"
    if not is_instrumented(f.text):
        return "pristine"
    engine = _engine()
    again = engine.instrument(f.text, f.path, recipe)
    return "patched" if isinstance(again, engine.Instrumented) and not again.changed else "drifted"


def worker_json(w: WorkerInfo) -> dict[str, Any]:
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


def code_state(started_at: float | None, facts: HostFacts) -> str:
    """``current`` when a server that started at ``started_at`` runs the code on disk, ``stale`` when it started
    before that code last changed, ``unknown`` when one of the two times is not known."""
    mtime = facts.code_mtime
    if started_at is None or mtime is None:
        return "unknown"
    return "current" if started_at >= mtime - CLOCK_SLACK_S else "stale"


# /proc's start time has 10 ms ticks and the boot time read with it 10 ms more: a server eaglepatch restarts
# starts hundreds of milliseconds after its files changed
CLOCK_SLACK_S = 0.05


def interrupted_json(facts: HostFacts) -> dict[str, Any] | None:
    """The lock an eaglepatch run holds (or left when it was killed), for status: who, from where, since when."""
    lock = facts.lock
    if not lock:
        return None
    return {k: lock.get(k) for k in ("user", "client_host", "client_pid", "time", "what") if k in lock}


def analyze_all(facts: HostFacts, recipe: Recipe) -> dict[str, TransformResult]:
    """What the transform finds in each worker file, by path: one analysis that ``describe`` and
    ``source_slices`` share."""
    analyze = _engine().analyze
    with _few_collections():
        return {f.path: analyze(f.text, f.path, recipe) for f in facts.files}


def describe(facts: HostFacts, recipe: Recipe,
             analyses: dict[str, TransformResult] | None = None) -> dict[str, Any]:
    """The ``status --json`` / ``show --json`` object of docs/contract.md (show adds slices on top)."""
    analyses = analyses if analyses is not None else analyze_all(facts, recipe)
    Refused = _engine().Refused
    files = []
    for f in facts.files:
        res = analyses[f.path]
        workers = [] if isinstance(res, Refused) else [worker_json(w) for w in res.workers]
        if not workers and not isinstance(res, Refused):
            continue
        entry: dict[str, Any] = {"path": _short(f.path), "state": file_state(facts, f, recipe), "workers": workers}
        if isinstance(res, Refused):
            entry["refused"] = res.message()
        files.append(entry)
    servers = servers_json(facts)
    return {"target": facts.target, "sglang_version": facts.version, "package_dir": facts.package_dir,
            "files": files, "runtime": {"path": facts.runtime_path, "present": facts.runtime_sha256 is not None},
            "server": servers[0] if servers else None, "servers": servers,
            "other_servers": [dict(s) for s in facts.other_servers], "lock": interrupted_json(facts),
            "leftovers": list(facts.stale_temps)}


def _short(path: str) -> str:
    """Contract paths are relative to the package: srt/speculative/eagle_worker.py."""
    return path.split("/", 1)[1] if path.startswith("sglang/") else path


def source_slices(facts: HostFacts, analyses: dict[str, TransformResult]) -> list[dict[str, Any]]:
    """The numbered source of each supported entry method (and its helpers' phase lines), for ``show``."""
    out = []
    Instrumented = _engine().Instrumented
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
            out.append({"path": _short(f.path), "class": w.cls, "method": w.method, "source": body})
    return out


# ----------------------------------------------------------------------------------------------------------------
# Plans


@dataclasses.dataclass(frozen=True)
class Write:
    """One file to put in place on the target (``data`` None: remove it)."""

    path: str  # absolute on the target
    rel: str  # for people: sglang/srt/...
    before: bytes | None
    data: bytes | None
    backup: str | None = None
    compile: bool = True
    expect_sha256: str | None = None  # when ``before`` is not at hand (removing a backup)

    def payload(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "expect_sha256": self.expect_sha256 if self.before is None else _sha(self.before),
            "data": None if self.data is None else base64.b64encode(self.data).decode(),
            "backup": self.backup,
            "compile": self.compile and self.data is not None and self.path.endswith(".py"),
        }


@dataclasses.dataclass(frozen=True)
class Plan:
    """What a command would do: the writes, the manifest to leave, and notes for people. Pure data."""

    writes: tuple[Write, ...]
    manifest: dict[str, Any] | None  # None: remove it
    notes: tuple[str, ...] = ()
    files: tuple[dict[str, Any], ...] = ()  # per worker file: path, before_sha256, after_sha256, backup
    timers: tuple[tuple[str, str], ...] = ()  # (worker class, its family's timer), for apply's messages

    @property
    def worker_writes(self) -> int:
        """How many worker files an apply plan writes (its other write is the runtime module)."""
        return sum(1 for w in self.writes if not w.path.endswith("/" + RUNTIME_FILE))

    @property
    def changed(self) -> bool:
        return bool(self.writes)

    def diff(self) -> str:
        """The unified diff of the plan, paths relative to the package's parent."""
        chunks = []
        for w in self.writes:
            a = (w.before or b"").decode("utf-8").splitlines(keepends=True)
            b = (w.data or b"").decode("utf-8").splitlines(keepends=True)
            chunks.extend(difflib.unified_diff(a, b, w.rel if w.before is not None else "/dev/null",
                                               w.rel if w.data is not None else "/dev/null"))
        text = "".join(chunks)
        return text if not text or text.endswith("\n") else text + "\n"


def _backup_path(facts: HostFacts, f: WorkerFile) -> str:
    return facts.backup_dir + "/" + f.path.rsplit("/", 1)[-1] + ".orig"


def plan_apply(facts: HostFacts, recipe: Recipe, opts: RuntimeOptions, *,
               servers: Sequence[dict[str, Any]] | None = None, now: float | None = None) -> Plan:
    """Instrument every supported worker file; raises ``Unsupported`` (with file, class, line) when any file
    of a supported family is refused, or when no file is supported at all. ``servers``: the install's servers
    for the manifest (``{"pid", "start", "port", "launch", "systemd_unit"}`` each), so that ``revert`` can start
    one that is gone; None keeps what the manifest had."""
    writes: list[Write] = []
    notes: list[str] = []
    files: list[dict[str, Any]] = []
    refused: list[str] = []
    timers: dict[str, str] = {}
    engine = _engine()
    instrument, strip, Refused, NotApplicable = engine.instrument, engine.strip, engine.Refused, engine.NotApplicable
    with _few_collections():
        results = [(f, instrument(f.text, f.path, recipe)) for f in facts.files]
    for f, res in results:
        if isinstance(res, Refused):
            refused.append(res.message())
            continue
        if isinstance(res, NotApplicable):
            for w in res.workers:
                if w.status == "unsupported":
                    notes.append(f"{_short(f.path)}: {w.cls} not supported: {w.reason}")
            continue
        notes.extend(res.warnings)
        for w in res.workers:
            if w.status == "supported":
                timers[w.cls] = w.timer or "sync"
        entry = facts.manifest_entry(f.path)
        if entry is not None and f.sha256 == entry.get("after_sha256"):
            original_sha = entry["before_sha256"]  # the manifest knows it: no second parse to strip the file
        else:
            original_sha = _sha(strip(f.text).encode("utf-8") if res.was_patched else f.data)
        new = res.source.encode("utf-8")
        backup = _backup_path(facts, f)
        files.append({"path": _short(f.path), "before_sha256": original_sha, "after_sha256": _sha(new),
                      "backup": backup})
        if res.changed:
            writes.append(Write(f.abs, f.path, f.data, new, backup=backup if not res.was_patched else None))
    if refused:
        raise Unsupported(refused[0] + (f" (and {len(refused) - 1} more)" if len(refused) > 1 else ""))
    if not files:
        raise Unsupported(f"{facts.target}: no recognisable speculative worker in {facts.spec_dir}")
    runtime = render_runtime(opts, timers).encode("utf-8")
    if facts.runtime_sha256 != _sha(runtime):
        # the runtime as it is on the target: a change of --mode or --every is a one-line diff of its config
        writes.append(Write(facts.runtime_path, _rel(facts, facts.runtime_path), facts.runtime_data, runtime))
        if facts.runtime_data is not None and not any(w.path != facts.runtime_path for w in writes):
            notes.append("the worker files are already patched: only the runtime's configuration changes ("
                         + (config_change(facts.runtime_data, runtime) or "its code") + ")")
    timer_list = tuple(sorted(timers.items()))
    if not writes:
        return Plan((), facts.manifest, tuple(notes), tuple(files), timer_list)
    old = facts.manifest or {}
    manifest = {
        "eaglepatch": __version__,
        "created": old.get("created") or _iso(now),
        "updated": _iso(now),
        "target": facts.target,
        "hostname": facts.hostname,
        "python": facts.python,
        "sglang_version": facts.version,
        "package_dir": facts.package_dir,
        "runtime": {"path": facts.runtime_path, "sha256": _sha(runtime), "mode": opts.mode, "every": opts.every,
                    "log_dir": opts.log_dir, "timers": dict(sorted(timers.items()))},
        "files": files,
        "servers": list(servers) if servers is not None else facts.manifest_servers(),
    }
    return Plan(tuple(writes), manifest, tuple(notes), tuple(files), timer_list)


def config_change(old: bytes, new: bytes) -> str:
    """What differs between two runtime modules' configs, for a person: ``mode sync -> auto, every 1 -> 4``."""
    def config(data: bytes) -> dict[str, Any]:
        m = _CONFIG_LINE.search(data.decode("utf-8", "replace"))
        try:
            return json.loads(m.group(0).split("=", 1)[1].rsplit("#", 1)[0]) if m else {}
        except ValueError:
            return {}

    a, b = config(old), config(new)
    return ", ".join(f"{k} {a.get(k)} -> {b.get(k)}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k))


def _rel(facts: HostFacts, path: str) -> str:
    parent = facts.package_dir.rsplit("/", 1)[0]
    return path[len(parent) + 1:] if path.startswith(parent + "/") else path


def _iso(now: float | None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if now is None else now))


def plan_revert(facts: HostFacts, recipe: Recipe, *, force: bool, now: float | None = None) -> Plan:
    """Put back the original bytes. Raises ``Conflict`` on a drifted file unless ``force``, which keeps a copy of
    the drifted file and removes only eaglepatch's marked lines."""
    writes: list[Write] = []
    notes: list[str] = []
    files: list[dict[str, Any]] = []
    for f in facts.files:
        entry = facts.manifest_entry(f.path)
        marked = is_instrumented(f.text)
        if entry is None and not marked:
            continue
        state = file_state(facts, f, recipe)
        if state == "pristine":
            continue
        backup = entry.get("backup") if entry else None
        backup_ok = backup is not None and facts.backups.get(backup) == entry.get("before_sha256")
        if state == "drifted":
            if not force:
                raise Conflict(f"{_short(f.path)} changed since eaglepatch patched it: revert --force keeps a copy "
                               "of it and removes only eaglepatch's lines")
            keep = facts.backup_dir + "/" + f.path.rsplit("/", 1)[-1] + f".drifted-{int(now or time.time())}"
            writes.append(Write(keep, _rel(facts, keep), None, f.data, compile=False))
            new = _engine().strip(f.text).encode("utf-8")
            notes.append(f"{_short(f.path)} had changed: a copy is in {keep}; removed only eaglepatch's lines")
        elif backup_ok:
            # Removing the marked lines is exact, and the backup's checksum proves it: no parse needed.
            new = strip_lines(f.text).encode("utf-8")
            if _sha(new) != entry.get("before_sha256"):
                new = _engine().strip(f.text).encode("utf-8")
            if _sha(new) != entry.get("before_sha256"):
                raise Conflict(f"{_short(f.path)}: removing eaglepatch's lines does not give the backed-up original")
        else:
            new = _engine().strip(f.text).encode("utf-8")
            notes.append(f"{_short(f.path)}: no backup found: reverted by removing eaglepatch's lines")
        files.append({"path": _short(f.path), "before_sha256": f.sha256, "after_sha256": _sha(new), "backup": backup})
        writes.append(Write(f.abs, f.path, f.data, new))
    if facts.runtime_sha256 is not None:
        writes.append(Write(facts.runtime_path, _rel(facts, facts.runtime_path), None, None, compile=False))
    if writes or facts.manifest:
        # What apply left besides the files: the backups (the originals are back) and, below, the manifest.
        for b, sha in sorted(facts.backups.items()):
            if sha is not None:
                writes.append(Write(b, _rel(facts, b), None, None, compile=False, expect_sha256=sha))
    return Plan(tuple(writes), None, tuple(notes), tuple(files))


# ----------------------------------------------------------------------------------------------------------------
# Carrying out


@dataclasses.dataclass
class Session:
    """One target during one command: its host, facts, and the lock while held."""

    host: Host
    python: str
    facts: HostFacts
    token: str | None = None

    def lock(self, owner: dict[str, Any] | None = None, ttl: float = 7200) -> None:
        """Hold the install's lock: the one ``gather`` took for ``owner``, or take it now; raises ``Conflict``
        when another run holds it (a lock left by a dead process of this machine is taken over)."""
        taken = self.facts.lock_result
        if owner is not None and taken is not None and taken.get("ok"):
            self.token = owner["token"]
            return
        owner = owner or new_lock_owner()
        held = (taken or {}).get("held") or self.facts.lock
        res = call(self.host, self.python, "lock", lock_path=self.facts.lock_path, owner=owner, ttl=ttl,
                   dead_pids=_dead_local_pids(held))
        if not res.get("ok"):
            if res.get("error"):
                raise EaglepatchError(f"{self.host.name}: {res['error']}")
            held = res.get("held") or {}
            since = time.strftime("%H:%M:%S", time.localtime(float(held.get("time", 0) or 0)))
            raise Conflict(f"{self.host.name}: another eaglepatch run holds the lock (user {held.get('user')}, "
                           f"from {held.get('client_host')} pid {held.get('client_pid')}, since {since}): "
                           f"wait for it, or remove {res.get('path')} if no run is active")
        self.token = owner["token"]

    def unlock(self) -> None:
        """Release the lock when this session holds it. Not after a request to the host was cut short (Ctrl-C):
        the host may still be carrying it out under that lock; it stays, named by status, and the next apply or
        revert from this machine takes it over (its client is gone)."""
        if self.token is None or progress.was_cut(self.host.name):
            return
        try:
            call(self.host, self.python, "unlock", lock_path=self.facts.lock_path, token=self.token)
        except (EaglepatchError, ConnectionFailed):
            pass
        self.token = None

    def execute(self, plan: Plan, release: bool = False, then: dict[str, Any] | None = None,
                then_timeout: float = 0.0) -> dict[str, Any]:
        """Carry out ``plan`` on the host in one round trip (releasing the lock in it when ``release``); raises
        typed errors, the target unchanged. ``then``: a relaunch (``server.control.relaunch_payload``, or a
        ``{"batch": [...]}`` of them) that the host runs right after the plan succeeds, in the same request; its
        answer is the result's ``then``; ``then_timeout``: how long those may take (the client waits that much
        longer, never killing the helper between a stop and a start)."""
        payload = {
            "release": release,
            "token": self.token,
            "lock_path": self.facts.lock_path,
            "writes": [self._payload(w) for w in plan.writes],
            "manifest": {"path": self.facts.manifest_path, "data": plan.manifest},
            "fault": remote_fault(),
            "then": then,
        }
        res = call(self.host, self.python, "execute", timeout=300 + then_timeout, **payload)
        if release:
            self.token = None
        if res.get("ok"):
            return res
        where = res.get("path") or ""
        kind = res.get("kind")
        msg = f"{self.host.name}: {where + ': ' if where else ''}{res.get('error')}"
        if kind == "conflict":
            raise Conflict(msg + ": nothing changed; run again to read it afresh")
        if kind == "compile":
            raise ValidationFailed(f"{msg}: the patched file does not compile with {res.get('python')}; "
                                   "nothing changed")
        if res.get("unrestored"):
            raise EaglepatchError(f"{msg}: could NOT put back {', '.join(res['unrestored'])}: check them now")
        raise EaglepatchError(msg + ": nothing changed")

    def _payload(self, w: Write) -> dict[str, Any]:
        p = w.payload()
        if w.path == self.facts.runtime_path:
            p["expect_sha256"] = self.facts.runtime_sha256  # what was read, whether or not its bytes came along
        return p


def _dead_local_pids(lock: dict[str, Any] | None) -> list[int]:
    """A lock taken from this machine by a process that is gone is stale."""
    if not lock or lock.get("client_host") != socket.gethostname():
        return []
    pid = lock.get("client_pid")
    if not isinstance(pid, int):
        return []
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return [pid]
    except PermissionError:
        return []
    return []
