"""The install's lock (the ``lock`` and ``unlock`` ops): a file made with O_EXCL in the speculative folder, naming
its owner; a stale one (its client gone, or too old) is taken over.
"""

from __future__ import annotations

import errno
import json
import os
import time

from eaglepatch.hostside.files import read_json


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
