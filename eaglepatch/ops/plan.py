"""Plans: what a command would do to the target, as data (``Plan``: the ``Write``s, the manifest to leave, notes).

``plan_apply`` and ``plan_revert`` are pure: facts in, a plan out; nothing runs (``Session.execute`` carries a plan
out). That is why ``diff`` and ``apply --dry-run`` change nothing, and why tests/data/plans/*.json can test them as
facts-to-plan fixtures.
"""

from __future__ import annotations

import base64
import dataclasses
import difflib
import hashlib
import time
from typing import Any, Sequence

from eaglepatch import __version__
from eaglepatch.collector import few_collections
from eaglepatch.errors import Conflict, Unsupported
from eaglepatch.ops import lazy_engine, transform_cache
from eaglepatch.ops.facts import HostFacts, WorkerFile, file_state, short_path
from eaglepatch.ops.options import RuntimeOptions
from eaglepatch.ops.runtime_file import RUNTIME_FILE, config_change, render_runtime
from eaglepatch.transform.marks import is_instrumented, strip_lines
from eaglepatch.transform.recipe import Recipe
from eaglepatch.transform.results import NotApplicable, Refused


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


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
    manifest_last: bool = False  # the manifest written after the files are swapped in, not before (a restart's record)

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
    # the results are read from the client's cache where it holds them: libcst only for a miss, or a strip below
    with few_collections():
        results = [(f, transform_cache.instrument(f.text, f.path, recipe)) for f in facts.files]
    for f, res in results:
        if isinstance(res, Refused):
            refused.append(res.message())
            continue
        if isinstance(res, NotApplicable):
            for w in res.workers:
                if w.status == "unsupported":
                    notes.append(f"{short_path(f.path)}: {w.cls} not supported: {w.reason}")
            continue
        notes.extend(res.warnings)
        for w in res.workers:
            if w.status == "supported":
                timers[w.cls] = w.timer or "sync"
        entry = facts.manifest_entry(f.path)
        if entry is not None and f.sha256 == entry.get("after_sha256"):
            original_sha = entry["before_sha256"]  # the manifest knows it: no second parse to strip the file
        else:
            original_sha = _sha(lazy_engine.engine().strip(f.text).encode("utf-8") if res.was_patched else f.data)
        new = res.source.encode("utf-8")
        backup = _backup_path(facts, f)
        files.append({"path": short_path(f.path), "before_sha256": original_sha, "after_sha256": _sha(new),
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
                raise Conflict(f"{short_path(f.path)} changed since eaglepatch patched it: revert --force keeps a copy "
                               "of it and removes only eaglepatch's lines")
            keep = facts.backup_dir + "/" + f.path.rsplit("/", 1)[-1] + f".drifted-{int(now or time.time())}"
            writes.append(Write(keep, _rel(facts, keep), None, f.data, compile=False))
            new = lazy_engine.engine().strip(f.text).encode("utf-8")
            notes.append(f"{short_path(f.path)} had changed: a copy is in {keep}; removed only eaglepatch's lines")
        elif backup_ok:
            # Removing the marked lines is exact, and the backup's checksum proves it: no parse needed.
            new = strip_lines(f.text).encode("utf-8")
            if _sha(new) != entry.get("before_sha256"):
                new = lazy_engine.engine().strip(f.text).encode("utf-8")
            if _sha(new) != entry.get("before_sha256"):
                raise Conflict(f"{short_path(f.path)}: removing eaglepatch's lines does not give the backed-up "
                               "original")
        else:
            new = lazy_engine.engine().strip(f.text).encode("utf-8")
            notes.append(f"{short_path(f.path)}: no backup found: reverted by removing eaglepatch's lines")
        files.append({"path": short_path(f.path), "before_sha256": f.sha256, "after_sha256": _sha(new),
                      "backup": backup})
        writes.append(Write(f.abs, f.path, f.data, new))
    if facts.runtime_sha256 is not None:
        writes.append(Write(facts.runtime_path, _rel(facts, facts.runtime_path), None, None, compile=False))
    if writes or facts.manifest:
        # What apply left besides the files: the backups (the originals are back) and, below, the manifest.
        for b, sha in sorted(facts.backups.items()):
            if sha is not None:
                writes.append(Write(b, _rel(facts, b), None, None, compile=False, expect_sha256=sha))
    return Plan(tuple(writes), None, tuple(notes), tuple(files))


def change_doc(target: str, plan: Plan, changed: bool, restarted: Sequence[Any] | bool,
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
