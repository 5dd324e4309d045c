"""Facts: what one round trip reads from the target (``gather`` -> ``HostFacts``: the install, its worker files,
manifest, backups, runtime, lock and servers), and what each worker file is (``file_state``, ``code_state``).

pyinfra's split: facts read state; ``eaglepatch.ops.plan`` decides from them, ``eaglepatch.ops.session`` carries a
plan out.
"""

from __future__ import annotations

import base64
import dataclasses
from typing import Any, Sequence

from eaglepatch.errors import Unsupported, UsageError
from eaglepatch.hosts.base import Host
from eaglepatch.ops import transform_cache
from eaglepatch.hosts.agent import call
from eaglepatch.ops.options import FactsOptions
from eaglepatch.transform.marks import is_instrumented
from eaglepatch.transform.recipe import Recipe
from eaglepatch.transform.results import Instrumented


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
        short = short_path(path)
        for f in (self.manifest or {}).get("files", []):
            if f.get("path") == short:
                return f
        return None


class AmbiguousInstall(UsageError):
    """Servers of several sglang installs run on the host, and nothing named the one meant."""


def gather(host: Host, opts: FactsOptions, entry_names: Sequence[str],
           lock_owner: dict[str, Any] | None = None, ttl: float = 7200) -> HostFacts:
    """Read the target's facts in one round trip, taking the install's lock in it when ``lock_owner`` is given
    (``Session.lock`` then checks the outcome); raises ``Unsupported`` when there is no sglang."""
    lock = {"owner": lock_owner, "ttl": ttl} if lock_owner else None
    raw = call(host, opts.python or "python3", "facts", python=opts.python, sglang_path=opts.sglang_path,
               entries=sorted(entry_names), lock=lock)
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
    again = transform_cache.instrument(f.text, f.path, recipe)
    return "patched" if isinstance(again, Instrumented) and not again.changed else "drifted"


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


def short_path(path: str) -> str:
    """Contract paths are relative to the package: srt/speculative/eagle_worker.py."""
    return path.split("/", 1)[1] if path.startswith("sglang/") else path
