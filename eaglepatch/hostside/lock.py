"""The host's locks. The install's (the ``lock`` and ``unlock`` ops): a file made with O_EXCL in the speculative
folder, naming its owner; a stale one (its client gone, or too old) is taken over. A port's relaunches
(``port_lock``, ``settle``): an flock on a file in the user's private log folder, so that they run one at a time.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import time

from eaglepatch.hostside.files import open_private, private_dir, read_json
from eaglepatch.hostside.state import server_log_path


LOCK_NAME = ".eaglepatch.lock"


def lock_info(path):
    """The lock file's JSON (its owner), or None when it is absent or not (yet) written."""
    return read_json(path)


def op_lock(payload):
    """Take the install's lock (O_EXCL); a stale lock (its client is gone, or too old) is taken over."""
    path = payload["lock_path"]
    me = payload["owner"]
    for _ in range(2):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            held = lock_info(path)
            if held is None:
                # Unreadable: most likely its taker created it this instant and has not written it yet, so
                # it is only stale when the file itself is old.
                try:
                    since = os.path.getmtime(path)
                except OSError:
                    continue  # gone meanwhile: try again
                held = {}
            else:
                since = float(held.get("time", 0) or 0)
            if held.get("token") == me["token"]:
                return {"ok": True}
            age = time.time() - since
            stale = age > float(payload.get("ttl", 7200))
            if held.get("client_host") == me.get("client_host") and held.get("client_pid") in payload.get("dead_pids", []):
                stale = True
            if stale:
                try:
                    os.remove(path)
                except OSError:
                    pass
                continue
            return {"ok": False, "held": held, "path": path}
        except OSError as exc:
            return {"ok": False, "error": "cannot create %s: %s" % (path, exc.strerror),
                    "denied": exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS)}
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(dict(me, time=time.time()), f)
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            # created but not written (a full disk): an empty lock would block every apply and revert until it
            # is stale, so it goes at once
            try:
                os.remove(path)
            except OSError:
                pass
            return {"ok": False, "error": "cannot write the lock %s: %s (nothing changed; the lock is removed): "
                                          "free some space there and run again" % (path, exc.strerror or exc)}
        return {"ok": True}
    return {"ok": False, "held": lock_info(path) or {}, "path": path}


def op_unlock(payload):
    """Remove the lock when it holds ``token`` (another run's lock is left alone)."""
    held = lock_info(payload["lock_path"]) or {}
    if held.get("token") == payload["token"]:
        try:
            os.remove(payload["lock_path"])
        except OSError:
            pass
    return {"ok": True}


def port_lock(folder, port, wait):
    """An exclusive lock on the relaunches of ``port`` by this user (a file in their private log folder): its
    descriptor; -1 when no lock file can be had there (the relaunch goes on unlocked, as before there was one);
    None when another relaunch held it for ``wait`` s. A relaunch whose client was interrupted finishes on the
    host: what reads the host after it (``settle``) must read it once that is done."""
    try:
        fd = open_private(os.path.join(folder, "relaunch-%s.lock" % port), os.O_RDWR | os.O_CREAT)
    except OSError:
        return -1
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                os.close(fd)
                return -1
            if time.monotonic() >= deadline:
                os.close(fd)
                return None
            time.sleep(0.05)


def relaunch_lock(log_path, port, wait):
    """``port_lock`` in the private folder of a server's log (``log_path``: the folder the relaunch writes the
    log in; None or "": the default log's, in the state folder, ``state.server_log_path``; -1 when it cannot be
    made, and the relaunch then fails on its log)."""
    log_path = log_path or server_log_path(port)
    try:
        folder = private_dir(os.path.dirname(log_path) or ".")
    except OSError:
        return -1
    return port_lock(folder, port, wait)


def settle(payload):
    """Wait until no relaunch of ``payload["port"]`` (whose server logs to ``payload["log_path"]``; null or absent:
    the default log) runs on the host, at most ``payload["wait"]`` s; True when none does. A scan after it sees what
    such a relaunch left."""
    fd = relaunch_lock(payload.get("log_path"), payload["port"], payload["wait"])
    if fd is None:
        return False
    if fd >= 0:
        os.close(fd)
    return True
