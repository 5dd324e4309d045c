"""A live sweep's files in the timing log folder (the ``live`` op): the leases and adaptive configs it writes, the
runtime's answers it reads, and the adaptive config a running server names.
"""

from __future__ import annotations

import json
import os
import re
import stat
import time

from eaglepatch.hostside.files import replace_file, tmp_name, write_new


# The names a live sweep writes or reads in the log directory (the runtime reads the lease and writes the answers).
_LIVE_NAME = re.compile(r"^(live-[0-9]+\.json|adaptive-[0-9a-f]{16}\.json)$")
_LIVE_ACK = re.compile(r"^live-([0-9]+)-([0-9]+)\.ack$")
_LIVE_MAX = 64 * 1024


def _live_dir(d):
    """Make the log directory (0700) when missing; an error message when it is not one the runtime would use (a
    link, not a directory, another user's, writable by group or others), else None."""
    if not os.path.lexists(d):
        try:
            os.makedirs(d, 0o700)
            os.chmod(d, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            return "cannot make %s: %s" % (d, exc.strerror)
    st = os.lstat(d)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        return ("%s is not a directory of this user that only it can write: the server's runtime would not "
                "follow a live sweep there" % d)
    return None


def _live_read(path, limit):
    """Text of a regular file opened without following a link, at most ``limit`` bytes; raises OSError/ValueError."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a regular file")
        if st.st_size > limit:
            raise ValueError("larger than %d bytes" % limit)
        return os.read(fd, limit + 1).decode("utf-8", "replace")
    finally:
        os.close(fd)


def op_live(payload):
    """A live sweep's files in the timing log directory ``log_dir``, by ``action``:

    - ``write``: each of ``names`` (leases ``live-<pid>.json``, or a config ``adaptive-<id>.json``) gets ``data``
      (text), or for a lease ``{"v": 1, "token", "steps", "deadline": now + lease_s}`` by this host's clock;
      written to a temp file (0600) and renamed, so the runtime never reads half of one.
    - ``remove``: each of ``names`` is removed.
    - ``answers``: the runtime's answers to the leases of ``launchers`` (``live-<launcher>-<pid>.ack``): pid,
      token, rank, and whether that process still runs.
    - ``read_config``: the text of the adaptive config file ``path`` a running server names (relative to ``cwd``).
    """
    action = payload["action"]
    if action == "read_config":
        path = os.path.join(payload.get("cwd") or "/", payload["path"])
        try:
            return {"text": _live_read(path, _LIVE_MAX), "path": path}
        except (OSError, ValueError) as exc:
            return {"error": "cannot read %s: %s" % (path, getattr(exc, "strerror", None) or exc), "path": path}
    d = payload["log_dir"]
    why = _live_dir(d)
    if why is not None:
        return {"error": why}
    if action == "answers":
        launchers = set(int(x) for x in payload["launchers"])
        out = []
        for n in sorted(os.listdir(d)):
            m = _LIVE_ACK.match(n)
            if not m or int(m.group(1)) not in launchers:
                continue
            try:
                doc = json.loads(_live_read(os.path.join(d, n), 4096))
            except (OSError, ValueError):
                continue
            if not isinstance(doc, dict):
                continue
            pid = int(m.group(2))
            out.append({"pid": pid, "token": doc.get("token"), "rank": doc.get("rank"),
                        "alive": os.path.exists("/proc/%d" % pid)})
        return {"answers": out, "now": time.time()}
    names = payload["names"]
    bad = [n for n in names if not _LIVE_NAME.match(n)]
    if bad:
        return {"error": "not a live sweep's file name: %r" % bad[0]}
    for name in names:
        path = os.path.join(d, name)
        if action == "remove":
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
            continue
        if "lease_s" in payload:
            doc = {"v": 1, "token": payload["token"], "steps": payload["steps"],
                   "deadline": time.time() + float(payload["lease_s"])}
            if payload.get("shared"):  # --allow-shared-traffic: batches with others' requests are pinned too
                doc["shared"] = True
            data = json.dumps(doc)
        else:
            data = payload["data"]
        tmp = tmp_name(path, "%d" % os.getpid())
        write_new(tmp, data.encode("utf-8"), mode=0o600)
        replace_file(tmp, path)
    return {"ok": True, "now": time.time()}
