"""The timing logs (the ``logs`` op), read by the runtime's own rules wherever the runtime really wrote them: real
folders and regular files of this user or the servers' users, no link followed, nothing others may write; new
bytes only, whole lines, at most ``LOG_BATCH`` a request.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat

from eaglepatch.hostside.files import read_or_none
from eaglepatch.hostside.proc import ids_of, user_name


# A timing log's name, as the runtime makes it: <host>-<pid>-rank<r>.jsonl, and the files of its chain once that
# is full (--max-log-mb), <host>-<pid>-rank<r>.<i>.jsonl
LOG_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*-[0-9]+-rank[0-9]+(?:[.][0-9]+)?[.]jsonl$")
# The private folders the runtime falls back to (tempfile.mkdtemp(prefix="eaglepatch-")) in a temp folder
_FALLBACK_NAME = re.compile(r"^eaglepatch-[A-Za-z0-9_]+$")
# Bytes of log data in one answer at most; the client asks again for the rest (its memory stays bounded).
LOG_BATCH = 8 << 20  # a fetch holds some three batches on either side (the read, its frame, the next); 8 MB fetched
# a 256 MB log over loopback SSH 6% faster than 4 MB (fewer rounds), with room to spare under 200 MB
# Bytes read at a time when looking for the end of a line longer than a batch (never more than the batch itself).
_SCAN = 1 << 20
# Files with bytes in one answer at most (each is an attachment: the client takes at most 1,024 of them, its
# ``hosts.agent.MAX_BLOBS``; a folder of many small logs comes in several answers).
MAX_LOG_FILES = 1000
# The fetches of this process that may continue (``continue``): fetch id -> the request, with what was sent so far.
_FETCHES = {}
_MAX_FETCHES = 8


class _Refused(Exception):
    """A log folder or file that the runtime's rules do not let eaglepatch read; str() says why."""


def _owner_name(uid):
    name = user_name(uid)
    return "uid %d" % uid if name == str(uid) else "uid %d (%s)" % (uid, name)


def _log_owners(pids):
    """Who may own a log folder eaglepatch reads: this user, and the (effective) user of each server process
    (the runtime writes only to a folder of its own user's)."""
    owners = {os.geteuid()}
    for pid in pids:
        ids = ids_of(pid)
        if ids is not None:
            owners.add(ids[0])
    return owners


def _open_log_dir(path, owners):
    """A descriptor of the folder ``path`` when the runtime's rules hold for it (a real folder, not a link; owned by
    one of ``owners``; not writable by group or others): (fd, its stat). Raises _Refused."""
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise _Refused("a link or not a folder")
        if exc.errno == errno.ENOENT:
            raise _Refused("no such folder")
        raise _Refused("cannot open it: %s" % (exc.strerror or exc))
    st = os.fstat(fd)
    why = None
    if not stat.S_ISDIR(st.st_mode):
        why = "not a folder"
    elif st.st_uid not in owners:
        why = "owned by %s, not by %s" % (_owner_name(st.st_uid), " or ".join(_owner_name(u) for u in sorted(owners)))
    elif st.st_mode & 0o022:
        why = "writable by group or others (mode %o)" % stat.S_IMODE(st.st_mode)
    if why is not None:
        os.close(fd)
        raise _Refused(why)
    return fd, st


def _open_log_file(dfd, name, owners):
    """A descriptor for reading the log ``name`` in the folder ``dfd``: never through a link, never a FIFO or a
    device, only a regular file of one of ``owners``. Raises _Refused."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(name, flags, dir_fd=dfd)
    except OSError as exc:
        raise _Refused("a link" if exc.errno == errno.ELOOP else (exc.strerror or str(exc)))
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid not in owners:
        os.close(fd)
        raise _Refused("not a regular file of the folder's user")
    return fd, st


def _dirs_in_use(pids):
    """The folders of the timing logs that ``pids`` (the servers' processes) have open now: where the runtime
    really writes, whatever folder it was configured with."""
    found = []
    for pid in pids:
        base = "/proc/%d/fd" % pid
        try:
            fds = os.listdir(base)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(os.path.join(base, fd))
            except OSError:
                continue
            if target.startswith("/") and LOG_NAME.match(os.path.basename(target)):
                found.append(os.path.dirname(target))
    return sorted(set(found))


def _temp_dirs(pids):
    """Where the runtime of ``pids`` makes its private folder: tempfile's folder as each process sees it (its
    TMPDIR, TEMP or TMP when it has one), this helper's, and /tmp."""
    import tempfile

    found = [tempfile.gettempdir(), "/tmp"]
    for pid in pids:
        raw = read_or_none("/proc/%d/environ" % pid)
        if not raw:
            continue
        env = dict(item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
        for name in (b"TMPDIR", b"TEMP", b"TMP"):
            value = env.get(name, b"").decode("utf-8", "surrogateescape")
            if value.startswith("/"):
                found.append(value)
                break
    return found


def _log_files(dfd, names, owners):
    """(name, open file, its stat) of each log in ``names`` that ``_open_log_file`` lets eaglepatch read; each file
    is closed once the next is asked for."""
    for name in names:
        try:
            fd, st = _open_log_file(dfd, name, owners)
        except _Refused:
            continue
        with os.fdopen(fd, "rb") as f:
            yield name, f, st


def _fell_back_from(dfd, names, log_dir, owners):
    """Whether a log in the folder ``dfd`` starts with the runtime's header saying it fell back from ``log_dir``:
    a private folder of this install's runtime (another install's, configured with another folder, is not read)."""
    for _name, f, _st in _log_files(dfd, names, owners):
        first = f.readline(65536)
        try:
            head = json.loads(first.decode("utf-8", "replace"))
        except ValueError:
            continue
        origin = head.get("fallback_from") if isinstance(head, dict) and head.get("kind") == "run" else None
        if isinstance(origin, str) and os.path.normpath(origin) == log_dir:
            return True
    return False


def _fallback_dirs(owners, temps):
    """The private folders the runtime falls back to, ``eaglepatch-*`` in the temp folders ``temps``, that one of
    ``owners`` made (real folders, 0700 as mkdtemp makes them)."""
    found = []
    for tmp in sorted(set(os.path.normpath(t) for t in temps)):
        try:
            names = os.listdir(tmp)
        except OSError:
            continue
        for n in sorted(names):
            if not _FALLBACK_NAME.match(n):
                continue
            path = os.path.join(tmp, n)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode) and st.st_uid in owners and not st.st_mode & 0o077:
                found.append(path)
    return found


def _line_end(f, start, size, piece):
    """Where the line that goes on at ``start`` of ``f`` ends (just past its newline), looked for up to ``size`` in
    pieces of at most ``piece`` bytes (the line itself is never held); None when it has no newline before ``size``
    (the runtime is still writing it)."""
    f.seek(start)
    pos = start
    while pos < size:
        chunk = f.read(min(piece, size - pos))
        if not chunk:
            return None
        at = chunk.find(b"\n")
        if at >= 0:
            return pos + at + 1
        pos += len(chunk)
    return None


def _candidates(log_dir, pids, owners):
    """The folders the runtime may have written the logs of ``pids`` to, each with how it was found: the configured
    one, those the processes have a log open in, the private ones it falls back to (read only when their logs say
    they fell back from ``log_dir``)."""
    return ([(log_dir, "configured")] + [(d, "open") for d in _dirs_in_use(pids)]
            + [(d, "fallback") for d in _fallback_dirs(owners, _temp_dirs(pids))])


_CHAIN = re.compile(r"-([0-9]+)-rank([0-9]+)(?:[.][0-9]+)?[.]jsonl$")


def op_log_times(payload):
    """When each rank of the processes ``pids`` last wrote its timing log (the newest modification time, host
    clock, over its chain's files), in every folder ``op_logs`` would read: ``{"ranks": [{"pid", "rank",
    "mtime"}]}``. No byte of a log is read."""
    pids = set(int(p) for p in payload.get("pids") or ())
    owners = _log_owners(sorted(pids))
    log_dir = os.path.normpath(payload["log_dir"])
    newest, seen = {}, set()
    for path, kind in _candidates(log_dir, sorted(pids), owners):
        if path in seen:
            continue
        seen.add(path)
        try:
            dfd, _st = _open_log_dir(path, owners)
        except _Refused:
            continue
        try:
            listed = sorted(n for n in os.listdir(dfd) if LOG_NAME.match(n))
            if kind != "configured" and not _fell_back_from(dfd, listed, log_dir, owners):
                continue
            for name in listed:
                m = _CHAIN.search(name)
                if not m or int(m.group(1)) not in pids:
                    continue
                try:
                    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    key = (int(m.group(1)), int(m.group(2)))
                    newest[key] = max(newest.get(key, 0.0), st.st_mtime)
        finally:
            os.close(dfd)
    return {"ranks": [{"pid": k[0], "rank": k[1], "mtime": v} for k, v in sorted(newest.items())]}


def op_logs(payload):
    """New bytes of the timing logs, read by the runtime's own rules (real folders and regular files of this user
    or the servers' users, no links followed, nothing others may write), from every folder the runtime writes to:
    the configured one (``log_dir``), the folders that the servers' processes (``pids``) have a log open in, and
    the private folders the runtime falls back to (``eaglepatch-*`` in the temp folder). For each file, what
    follows the size the client already has (``have``: "folder/name" -> size), whole lines only, at most
    LOG_BATCH bytes in all (``more``: ask again). A folder other than ``log_dir`` is read only when its logs start
    with the runtime's header saying it fell back from ``log_dir`` (``fallback_from``). ``dirs`` lists each folder
    read, and each refused with why; ``sizes`` the size of each file of ``names``. The bytes come as the answer's
    attachments (``__blobs__``: the agent sends them as raw frames after the JSON), one per entry of ``files``
    (``size`` says how many bytes), the files in the order of ``names``.

    A line longer than a whole batch (no newline in ``budget`` bytes: no answer could ever hold it) is skipped, not
    sent: its entry has no bytes (``size`` 0) and says ``skipped``, ``{"offset": where the line begins, "length":
    its bytes, newline included}``, and the file goes on after it (the client counts it as a line that did not
    parse, as the report of a local file does). Its end is looked for in bounded pieces, never holding the line;
    one with no newline yet (still being written) waits for it, as any last line without one.

    ``fetch`` (an id) keeps what this answer sent, so that the next request may be ``{"continue": id}`` alone:
    the same request from where this one ended, sent by the client before it has handled this answer. A fetch
    brings each file up to the size it had when the fetch began (the first answer's ``sizes``): what the runtime
    appends meanwhile, and a file it makes meanwhile (listed, not read), come with the next fetch. So the client
    knows from the first answer what the whole fetch will bring, a file the answers have gone past gets nothing
    more, and a fetch ends however fast the server writes."""
    fid = payload.get("continue")
    if fid is not None:
        if fid not in _FETCHES:
            return {"error": "no fetch %r to continue on this host's helper" % str(fid)[:40], "dirs": []}
        payload = _FETCHES[fid]
    upto = payload.get("upto")  # a fetch going on: "folder/name" -> the size the file had when it began
    began = {}
    pids = [int(p) for p in payload.get("pids") or ()]
    have = dict(payload.get("have") or {})
    owners = _log_owners(pids)
    budget = limit = int(payload.get("budget") or LOG_BATCH)
    log_dir = os.path.normpath(payload["log_dir"])
    dirs, files, blobs, names, sizes, seen, more = [], [], [], {}, {}, set(), False
    for path, kind in _candidates(log_dir, pids, owners):
        if path in seen:
            continue
        seen.add(path)
        try:
            dfd, _st = _open_log_dir(path, owners)
        except _Refused as exc:
            dirs.append({"path": path, "kind": kind, "refused": str(exc)})
            continue
        try:
            listed = sorted(n for n in os.listdir(dfd) if LOG_NAME.match(n))
            if kind != "configured" and not _fell_back_from(dfd, listed, log_dir, owners):
                continue  # a runtime's private folder for another log dir (another install's, or not asked for)
            dirs.append({"path": path, "kind": kind})
            names[path], sizes[path] = [], []
            for name, f, st in _log_files(dfd, listed, owners):
                key = path + "/" + name
                size = began[key] = st.st_size
                names[path].append(name)
                sizes[path].append(size)
                if upto is not None:
                    size = min(size, upto.get(key, 0))
                off = int(have.get(key, 0))
                if off > size:
                    off = 0  # the file was replaced: fetch it whole
                if off == size:
                    continue
                if budget <= 0 or len(files) >= MAX_LOG_FILES:
                    more = True
                    continue
                f.seek(off)
                data = f.read(min(size - off, budget))
                # Only whole lines: a record being written now is fetched next time.
                cut = data.rfind(b"\n") + 1
                if cut == 0 and len(data) >= limit and len(data) < size - off:
                    # A whole batch without a newline, and more bytes follow: a line no answer can hold. Skipped to
                    # its end (else the file's offset never moves again), once the runtime has written its newline.
                    data = None
                    end = _line_end(f, off + limit, size, min(_SCAN, limit))
                    if end is None:
                        continue  # still being written: looked for again by the next fetch
                    files.append({"dir": path, "name": name, "offset": off, "size": 0,
                                  "skipped": {"offset": off, "length": end - off}})
                    blobs.append(b"")
                    have[key] = end
                    if end < size:
                        more = True  # the records after it come with the next answer
                    continue
                if len(data) < size - off:
                    more = True  # the budget ended inside this file
                if cut == 0:
                    continue
                budget -= cut
                files.append({"dir": path, "name": name, "offset": off, "size": cut})
                blobs.append(data if cut == len(data) else memoryview(data)[:cut])  # no copy of the batch
                have[key] = off + cut
        finally:
            os.close(dfd)
    if not names:
        why = "; ".join("%s: %s" % (d["path"], d["refused"]) for d in dirs if d.get("refused"))
        return {"error": "no timing logs eaglepatch may read (%s): apply first (or give --log-dir), then put load "
                         "on the server" % why, "dirs": dirs}
    fid = payload.get("fetch")
    if fid is not None:
        if len(_FETCHES) >= _MAX_FETCHES and fid not in _FETCHES:
            _FETCHES.pop(next(iter(_FETCHES)))
        _FETCHES[fid] = dict(payload, have=have, upto=began if upto is None else upto)
    return {"dirs": dirs, "files": files, "names": names, "sizes": sizes, "more": more, "__blobs__": blobs}
