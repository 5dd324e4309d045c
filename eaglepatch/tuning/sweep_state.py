"""The resumable state of a sweep: one JSON-lines file per sweep on this machine, one line per completed run
(written as each completes), so that a sweep run again goes on where it stopped.

The file lives under ``$XDG_CACHE_HOME/eaglepatch/sweeps`` (``cache_dir``), named by the target and the sweep's
identity (``sweep_id``: the points, the repeat count, the load). Besides the runs it records the header (what the
sweep is, the original launch), every server the sweep started, how the server was put back, and a live sweep's
timings. A line cut short by a crash is skipped when read.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Any, Mapping, Sequence

from eaglepatch.cache import cache_root
from eaglepatch.errors import Conflict
from eaglepatch.tuning.sweep import Point


def cache_dir() -> str:
    return str(cache_root() / "sweeps")


def sweep_id(target: str, points: Sequence[Point], repeat: int, load: Mapping[str, Any]) -> str:
    doc = {"target": target, "points": [p.key for p in points], "repeat": repeat, "load": dict(load)}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def state_path(target: str, ident: str) -> str:
    safe = "".join(ch if ch.isalnum() or ch in "-_.@" else "_" for ch in target)[:80]
    return os.path.join(cache_dir(), f"{safe}-{ident}.jsonl")


class StateFile:
    """``header`` (the first line: what the sweep is, and the original launch) and ``runs`` (one line each)."""

    def __init__(self, path: str):
        self.path = path
        self.header: dict[str, Any] | None = None
        self.runs: list[dict[str, Any]] = []
        self.launches: list[dict[str, Any]] = []  # every server the sweep started: pid and start time
        self.restore: dict[str, Any] | None = None  # how the server was put back, once it was
        self.timings: list[dict[str, Any]] = []  # a live sweep's window figures from the timing logs, read at its end
        self._lock_fd: int | None = None
        if os.path.exists(path):
            self._read()

    def _read(self) -> None:
        with open(self.path, encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    doc = json.loads(line)
                except ValueError:
                    continue  # a line cut short by a crash: that run did not complete
                if not isinstance(doc, dict):
                    continue
                if doc.get("kind") == "sweep" and self.header is None:
                    self.header = doc
                elif doc.get("kind") == "run":
                    self.runs.append(doc)
                elif doc.get("kind") == "launch":
                    self.launches.append(doc)
                elif doc.get("kind") == "restore":
                    self.restore = doc
                elif doc.get("kind") == "timings":
                    self.timings.append(doc)

    def lock(self) -> None:
        """Hold an exclusive lock on the file while this sweep runs; Conflict when another sweep holds it."""
        import fcntl

        os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise Conflict(f"another eaglepatch sweep runs the same sweep now (it holds {self.path})") from None
        self._lock_fd = fd

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _append(self, doc: Mapping[str, Any]) -> None:
        os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
        data = (json.dumps(doc, separators=(",", ":")) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            # a line cut short by an earlier crash must not swallow this one
            if os.fstat(fd).st_size:
                with open(self.path, "rb") as r:
                    r.seek(-1, os.SEEK_END)
                    if r.read(1) != b"\n":
                        data = b"\n" + data
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)

    def write_header(self, header: Mapping[str, Any]) -> None:
        doc = dict(header, kind="sweep")
        self._append(doc)
        self.header = doc

    def add_run(self, run: Mapping[str, Any]) -> None:
        doc = dict(run, kind="run")
        self._append(doc)
        self.runs.append(doc)

    def add_launch(self, pid: int, start: int | None, port: int) -> None:
        """Record a server the sweep started (before waiting for it: a sweep killed meanwhile knows it as its own)."""
        doc = {"kind": "launch", "pid": pid, "start": start, "port": port, "t": round(time.time(), 3)}
        self._append(doc)
        self.launches.append(doc)

    def launched(self) -> set[tuple[int, int | None]]:
        """(pid, start time) of every server the sweep started."""
        return {(int(d["pid"]), d.get("start")) for d in self.launches if isinstance(d.get("pid"), int)}

    def add_restore(self, doc: Mapping[str, Any]) -> None:
        """Record that the server was put back at the end: a finished sweep run again touches nothing."""
        rec = dict(doc, kind="restore")
        self._append(rec)
        self.restore = rec

    def add_timings(self, doc: Mapping[str, Any]) -> None:
        """Record a live sweep window's figures from the timing logs (read once, after its windows)."""
        rec = dict(doc, kind="timings")
        self._append(rec)
        self.timings.append(rec)

    def done(self) -> set[tuple[str, int]]:
        return {(r["point"], int(r["rep"])) for r in self.runs if "point" in r and "rep" in r}

    def failed_points(self) -> set[str]:
        return {r["point"] for r in self.runs if r.get("status") == "failed"}

    def remove(self) -> None:
        try:
            os.remove(self.path)
        except FileNotFoundError:
            pass
        self.header, self.runs, self.launches, self.restore, self.timings = None, [], [], None, []


def now_iso() -> str:
    """Now in UTC, as the header's ``created`` says it (``2026-12-02T10:00:00Z``)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
