"""Fetching a target's timing logs into this machine's cache (``fetch_logs``, ``fetch_logs_from``: new bytes only,
in bounded rounds, every answer of the host checked before a byte is written), and picking a server's logs among
files (``logs_of``). ``report``, ``doctor``, ``bench`` and ``sweep`` read the records from there."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pathlib
import re
import secrets
from typing import Any, Callable, Collection, Protocol, Sequence

from eaglepatch.cache import cache_root
from eaglepatch.errors import BadAnswer, Unsupported, UsageError
from eaglepatch.hosts.base import Host
from eaglepatch.hosts.spec import TargetSpec
from eaglepatch.ops.facts import AmbiguousInstall
from eaglepatch.hosts.agent import call_each
from eaglepatch.ops.target import Connect, Target, target_facts
from eaglepatch.redact import shown
from eaglepatch.report.files import log_order
from eaglepatch.transform.recipe import builtin_recipe

Say = Callable[[str], None]


def _cache_root() -> pathlib.Path:
    return cache_root() / "logs"


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


class LogWatch(Protocol):
    """What follows a fetch as it goes (``report`` reads the logs while they arrive: ``eaglepatch.ops.follow``).
    It is told only of checked bytes, once they are in the cache."""

    def begin(self, files: list[str], sizes: dict[str, int]) -> None:
        """The files that the whole fetch will leave in the cache folder, as ``iter_log_files`` lists them (the
        host's word on their sizes: the list is a forecast), and the bytes that each has there now; called once,
        when the first answer has been checked, before its bytes are written."""

    def wrote(self, path: str, size: int, replaced: bool) -> None:
        """``path`` now holds ``size`` bytes; ``replaced``: written again from 0, over the bytes it had."""

    def complete(self, path: str) -> None:
        """``path`` gets no more bytes in this fetch (the host's word: a fetch brings each file up to the size it had
        when the fetch began, the files in the order the host lists them)."""


def fetch_logs(spec: TargetSpec, c: Connect, log_dir: str | None, say: Say,
               watch: Callable[[FetchedLogs], LogWatch | None] | None = None) -> FetchedLogs:
    """Copy a target's timing logs into the local cache, fetching only bytes not fetched before. ``watch``, told
    what the fetch is for (the facts, the cache folder) before it starts, may give a ``LogWatch`` to follow it."""
    with Target(spec, c) as t:
        python = c.facts.python or "python3"
        current: frozenset[int] = frozenset()
        launches: frozenset[tuple[int, int]] = frozenset()
        package: str | None = None
        servers: tuple[tuple[int, int | None], ...] = ()
        try:
            facts = target_facts(t, builtin_recipe(), transform=False)
            log_dir = log_dir or ((facts.manifest or {}).get("runtime") or {}).get("log_dir")
            python = facts.python
            package = facts.package_dir
            current = frozenset(p for s in facts.servers for p in (s["pid"], *(s.get("children") or ())))
            launches = frozenset((s["pid"], s["start"]) for s in facts.servers if s.get("start") is not None)
            servers = tuple((s["pid"], _port_of_scan(s)) for s in facts.servers)
        except (Unsupported, AmbiguousInstall):
            pass  # the logs can still be read (--log-dir, or the default folder); which run is current is unknown
        log_dir = log_dir or "/tmp/eaglepatch"
        logs = FetchedLogs(str(_cache_dest(t.spec.name, log_dir)), current, launches, package, servers, t.spec.name)
        watcher = watch(logs) if watch is not None else None
        fetch_logs_from(t.host, t.spec.name, python, log_dir, say, pids=current, watch=watcher)
        return logs


def _port_of_scan(item: dict[str, Any]) -> int | None:
    from eaglepatch.server.process import ServerProcess

    try:
        return ServerProcess.from_scan(item).port
    except (KeyError, TypeError, ValueError):
        return None


# A timing log's name, as the runtime makes it (the host's hostside/logs.py checks the same): <host>-<pid>-rank<r>.jsonl,
# then the files of its chain past --max-log-mb, <host>-<pid>-rank<r>.<i>.jsonl
_LOG_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*-[0-9]+-rank[0-9]+(?:\.[0-9]+)?\.jsonl")
_DIR_FILE = ".host-folder"  # in each cache subfolder: the host folder it copies
_MAX_ROUNDS = 4096  # log batches fetched in one command at most (LOG_BATCH each)


def _cache_folder(root: pathlib.Path, host_dir: str) -> pathlib.Path:
    """The cache subfolder for one folder of the host: named by a digest of its path (the path itself is the
    host's word, never a path here)."""
    return root / hashlib.sha256(host_dir.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def _cache_dest(name: str, log_dir: str) -> pathlib.Path:
    """The cache folder of the target ``name`` and its ``log_dir``."""
    safe = "".join(ch if ch.isalnum() or ch in "-_.@" else "_" for ch in name)
    return _cache_root() / safe / hashlib.sha256(log_dir.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def _refuse(name: str, why: str) -> BadAnswer:
    return BadAnswer(f"{name}: the host's answer to the log request is refused: {why}: nothing of it was written "
                     "(is the host's python the real one? see docs/safety.md, trust boundaries)")


def fetch_logs_from(host: Host, name: str, python: str, log_dir: str, say: Say,
                    pids: Collection[int] = (), watch: LogWatch | None = None) -> str:
    """``fetch_logs`` on an open host: copy the new bytes of the timing logs into the local cache folder of the
    target ``name`` and ``log_dir`` (another ``--log-dir`` has a folder of its own), dropping the cached copies of
    files that are no longer on the host; return that folder. The host reads by the runtime's own rules, from
    ``log_dir`` and from wherever the runtime of ``pids`` (the servers' processes) really writes (its private
    fallback folder); each host folder has a subfolder of its own here.

    The batches come pipelined (``hosts.agent.call_each``): the next is asked for, from where the host's last
    answer ended (``continue``), as soon as an answer's JSON is read, so the host reads and compresses it while this
    side writes the one before; each batch's bytes are raw frames after its JSON (no base64). Everything in an
    answer is the host's word (docs/safety.md): a file name is a plain basename of the log pattern, an offset is 0 or
    the size of the copy here, the bytes are the attachment of their entry, as many as it says; anything else raises
    ``BadAnswer`` before a byte of that answer is written. A line the host skipped (longer than a batch: no answer
    can hold it) gets a line of as many bytes here that does not parse (``_write_skipped``: the copy keeps the
    host's offsets), which the report counts among its skipped lines, as it counts such a line of a local file.
    Raises ``UsageError`` when the host has no log it may read. ``watch`` is told which files the fetch will bring,
    then of each batch written and of each file that will get no more."""
    dest = _cache_dest(name, log_dir)
    dest.mkdir(parents=True, exist_ok=True, mode=0o700)
    for old in dest.glob("*.jsonl"):  # the flat layout of earlier versions: fetched again into subfolders
        old.unlink(missing_ok=True)
    said: set[str] = set()
    known = _cached(dest)
    have = {f"{d}/{n}": size for d, (_sub, sizes) in known.items() for n, size in sizes.items()}
    state = {"fetched": 0, "files": 0, "rounds": 0, "listed": {}}
    upto: dict[tuple[str, str], int] = {}  # (host folder, name) -> the size the whole fetch brings it to
    complete: set[tuple[str, str]] = set()  # the files the watch was told get no more

    def follow(res: Any) -> dict[str, Any] | None:
        # decided on the answer's JSON alone, before its bytes are read: the host gets to work on the next batch
        state["rounds"] += 1
        if not isinstance(res, dict) or not res.get("more") or not res.get("files") or state["rounds"] >= _MAX_ROUNDS:
            return None
        return {"continue": fetch_id}

    def handle(res: Any) -> None:
        if not isinstance(res, dict):
            raise _refuse(name, "not an object")
        accepted = _check_dirs(name, res.get("dirs"))
        if res.get("error"):
            raise UsageError(f"{name}: {shown(res['error'])}")  # it names each folder refused, and why
        for d in accepted.values():
            if d.get("refused") and d["path"] not in said and d["kind"] in ("configured", "open"):
                said.add(d["path"])
                say(f"note: {name}: not reading {shown(d['path'])}: {shown(d['refused'])}")
        listed = state["listed"] = _check_names(name, res.get("names"), accepted)
        hosted = _check_sizes(name, res.get("sizes"), listed)
        writes = _check_files(name, res.get("files"), res.get("__blobs__"), listed, known, hosted)
        for host_dir in listed:
            sub = _cache_folder(dest, host_dir)
            if host_dir not in known:
                sub.mkdir(exist_ok=True, mode=0o700)
                (sub / _DIR_FILE).write_text(host_dir, encoding="utf-8", errors="surrogateescape")
                known[host_dir] = (sub, {})
            if host_dir != os.path.normpath(log_dir) and host_dir not in said and listed[host_dir]:
                said.add(host_dir)
                say(f"{name}: reading the timing logs in {shown(host_dir)} too (where the runtime writes them)")
        if watch is not None and state["rounds"] == 1:
            files, now = _forecast(dest, listed, hosted, known)
            watch.begin(files, now)
            # what the whole fetch brings each file to (the sizes the host began with, where it says them)
            upto.update({(d, n): size for d, each in hosted.items() for n, size in zip(listed[d], each)})
            for host_dir, file_name in upto:
                if known[host_dir][1].get(file_name, 0) == upto[host_dir, file_name]:
                    complete.add((host_dir, file_name))
                    watch.complete(str(_cache_folder(dest, host_dir) / file_name))
        # a file the answers have gone past gets no more (the host sends them in the order it lists them), nor one
        # brought to the size it had when the fetch began
        order = [(d, n) for d, each in listed.items() for n in each] if watch is not None else []
        at = {key: i for i, key in enumerate(order)}
        gone_past = [0]  # the files of ``order`` said already

        def passed(before: int) -> None:
            for key in order[gone_past[0] : before]:
                if key not in complete:
                    complete.add(key)
                    if watch is not None:
                        watch.complete(str(_cache_folder(dest, key[0]) / key[1]))
            gone_past[0] = max(gone_past[0], before)

        for j, (host_dir, file_name, offset, data, size, skipped) in enumerate(writes):
            passed(at.get((host_dir, file_name), 0))
            path = _cache_folder(dest, host_dir) / file_name
            _write_log(path, offset, data)
            end = offset + size
            if skipped:
                # a line longer than a batch, which the host did not send: a line here of as many bytes (the cache
                # keeps the host's offsets) that does not parse, so that the report counts it as a skipped line
                _write_skipped(path, end, skipped)
                say(f"note: {name}: a line of {skipped} bytes at byte {end} of {shown(host_dir)}/{file_name} is "
                    "longer than a fetch's batch: not fetched, counted as a skipped line")
                end += skipped
            sizes = known[host_dir][1]
            before = sizes.get(file_name, 0)
            sizes[file_name] = end
            state["fetched"] += size
            state["files"] += 1 if size else 0
            if watch is not None:
                watch.wrote(str(path), end, offset == 0 and before > 0)
                if j + 1 < len(writes) or upto.get((host_dir, file_name)) == end:
                    passed(at.get((host_dir, file_name), -1) + 1)

    fetch_id = secrets.token_hex(8)
    call_each(host, python, "logs", follow=follow, on_result=handle, log_dir=log_dir, have=have,
              pids=sorted(pids), fetch=fetch_id)
    listed = state["listed"]
    # what is no longer on the host is never reported again
    for host_dir, (sub, sizes) in _cached(dest).items():
        keep = set(listed.get(host_dir, ()))
        for gone in set(sizes) - keep:
            (sub / gone).unlink(missing_ok=True)
    n = sum(len(v) for v in listed.values())
    where = ", ".join(shown(d) for d in listed) or shown(log_dir)
    say(f"{name}: {n} log file(s) in {where}, {state['fetched']} new bytes from {state['files']} of them -> {dest}")
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
        raise _refuse(name, f"a log file name that is not a plain <host>-<pid>-rank<r>[.<i>].jsonl "
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


def _check_sizes(name: str, sizes: Any, listed: dict[str, list[str]]) -> dict[str, list[int]]:
    """The host's size of each listed file (an answer may leave them out: then nothing is known)."""
    if sizes is None:
        return {}
    if not isinstance(sizes, dict):
        raise _refuse(name, "sizes that are not a list per folder")
    for host_dir, each in sizes.items():
        if (host_dir not in listed or not isinstance(each, list) or len(each) != len(listed[host_dir])
                or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in each)):
            raise _refuse(name, f"sizes that are not one whole number per log file listed "
                                f"({shown(repr(host_dir)[:200])})")
    return sizes


def _forecast(dest: pathlib.Path, listed: dict[str, list[str]], hosted: dict[str, list[int]],
              known: dict[str, tuple[pathlib.Path, dict[str, int]]]) -> tuple[list[str], dict[str, int]]:
    """The files a fetch will leave in ``dest`` (those the host lists that are here or have bytes there: the
    others are dropped at its end), sorted as ``iter_log_files`` lists them, and the bytes each has here now."""
    files, now = [], {}
    for host_dir, names in listed.items():
        sub = _cache_folder(dest, host_dir)
        here = known.get(host_dir, (None, {}))[1]
        sizes = hosted.get(host_dir)
        for i, file_name in enumerate(names):
            if file_name in here or sizes is None or sizes[i] > 0:
                path = str(sub / file_name)
                files.append(path)
                now[path] = here.get(file_name, 0)
    files.sort(key=log_order)
    return files, now


def _check_files(name: str, files: Any, blobs: Any, listed: dict[str, list[str]],
                 known: dict[str, tuple[pathlib.Path, dict[str, int]]], hosted: dict[str, list[int]] | None = None
                 ) -> list[tuple[str, str, int, list[bytes], int, int]]:
    """(host folder, name, offset, its bytes as pieces, how many, the bytes of the line skipped after them or 0) of
    each file in the answer, every one checked first: a file the answer lists in a folder it read (``listed``),
    once, its offset 0 or the size of the copy here, its bytes the attachment of the same place in the answer
    (``size`` of them; an attachment is a list of pieces, as the agent reads it, or bytes); a line it skipped
    (``skipped``: longer than a batch) right after those bytes, within the file's size that the answer says
    (``hosted``)."""
    if not isinstance(files, list):
        raise _refuse(name, "no list of files")
    blobs = [] if blobs is None else blobs
    if not isinstance(blobs, list) or len(blobs) != len(files):
        raise _refuse(name, f"{len(files)} file(s) with {len(blobs) if isinstance(blobs, list) else 'no'} "
                            "attachment(s)")
    out = []
    seen: set[tuple[str, str]] = set()
    for f, data in zip(files, blobs):
        if not isinstance(f, dict) or f.get("dir") not in listed:
            raise _refuse(name, "bytes of a folder it did not read")
        file_name = _check_name(name, f.get("name"))
        if file_name not in listed[f["dir"]] or (f["dir"], file_name) in seen:
            raise _refuse(name, f"bytes of {file_name}, which it does not list once in that folder")
        seen.add((f["dir"], file_name))
        offset = f.get("offset")
        here = known.get(f["dir"], (None, {}))[1].get(file_name, 0)
        if not isinstance(offset, int) or isinstance(offset, bool) or offset not in (0, here):
            raise _refuse(name, f"bytes of {file_name} at offset {shown(repr(offset)[:40])}, where the copy here "
                                f"has {here} (only 0 or {here} are asked for)")
        pieces = [data] if isinstance(data, bytes) else data
        if not (isinstance(pieces, list) and all(isinstance(p, bytes) for p in pieces)) or (
                f.get("size") != sum(map(len, pieces))):
            raise _refuse(name, f"bytes of {file_name} that are not the {shown(repr(f.get('size'))[:40])} it says")
        skipped = 0
        if f.get("skipped") is not None:
            s = f["skipped"]
            at, length = (s.get("offset"), s.get("length")) if isinstance(s, dict) else (None, None)
            whole = isinstance(at, int) and not isinstance(at, bool) and isinstance(length, int) and not isinstance(
                length, bool)
            hosted_size = None
            if whole and hosted and f["dir"] in hosted:
                hosted_size = hosted[f["dir"]][listed[f["dir"]].index(file_name)]
            if not whole or at != offset + f["size"] or length < 1 or (
                    hosted_size is not None and at + length > hosted_size):
                raise _refuse(name, f"a skipped line of {file_name} that is not one right after its bytes "
                                    f"({shown(repr(s)[:200])})")
            skipped = length
        out.append((f["dir"], file_name, offset, pieces, f["size"], skipped))
    return out


def _write_log(path: pathlib.Path, offset: int, pieces: list[bytes]) -> None:
    """Write one batch into the cache: the whole file at offset 0, else appended; never through a link."""
    flags = os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | (os.O_TRUNC if offset == 0 else os.O_APPEND)
    fd = os.open(path, flags, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.writelines(pieces)


def _write_skipped(path: pathlib.Path, at: int, length: int) -> None:
    """Put in the cache, at ``at`` (where the copy ends), a line of ``length`` bytes (newline included) standing
    for one the host skipped: a note that is no JSON, then a hole (no disk used where the file system makes holes,
    read as NUL bytes), then the newline; the report counts it as one line that did not parse."""
    note = (b"eaglepatch fetch: a line of %d bytes at byte %d of the host's file, longer than a fetch's batch, was "
            b"not fetched" % (length, at))[: length - 1]
    fd = os.open(path, os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        os.pwrite(fd, note, at)
        os.ftruncate(fd, at + length - 1)
        os.pwrite(fd, b"\n", at + length - 1)
    finally:
        os.close(fd)


# a timing log's name: <host>-<pid>-rank<r>.jsonl
_LOG_PID = re.compile(r"-(\d+)-rank\d+(?:\.\d+)?\.jsonl$")


def logs_of(files: Sequence[str], pids: Collection[int]) -> list[str]:
    """The timing logs among ``files`` that the processes ``pids`` wrote (a server's launcher and children: every
    rank), by the pid in their names."""
    return [f for f in files if (m := _LOG_PID.search(os.path.basename(f))) and int(m.group(1)) in pids]
