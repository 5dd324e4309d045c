"""The host's processes and ports, as /proc shows them: the process table, a process's command line,
environment, ids, ignored signals and start time, and whether a port is listened on.

Reads only; nothing here starts, stops or signals a process.
"""

from __future__ import annotations

import os
import signal
import socket
import time

from eaglepatch.hostside.files import read_or_none


def proc_stat(pid):
    """``{"state", "ppid", "pgid", "sid", "start"}`` from /proc/PID/stat, or None when the process is gone."""
    raw = read_or_none("/proc/%d/stat" % pid)
    if raw is None:
        return None
    text = raw.decode("ascii", "replace")
    # the command name (field 2) is in parentheses and may itself contain spaces and parentheses
    fields = text[text.rfind(")") + 2 :].split()
    try:
        return {
            "state": fields[0],
            "ppid": int(fields[1]),
            "pgid": int(fields[2]),
            "sid": int(fields[3]),
            "start": int(fields[19]),
        }
    except (IndexError, ValueError):
        return None


def is_alive(pid, start=None):
    """True when ``pid`` runs (a zombie is dead) and, when ``start`` is given, is still the same process."""
    st = proc_stat(pid)
    if st is None or st["state"] in ("Z", "X", "x"):
        return False
    return start is None or st["start"] == start


def cmdline(pid):
    """The command line of ``pid``, or None (gone, or a kernel thread)."""
    raw = read_or_none("/proc/%d/cmdline" % pid)
    if not raw:
        return None  # gone, or a kernel thread
    return [os.fsdecode(a) for a in raw.rstrip(b"\0").split(b"\0")]


def environ(pid):
    """The environment of ``pid``, or None (another user's process)."""
    raw = read_or_none("/proc/%d/environ" % pid)
    if raw is None:
        return None  # another user's process: no permission
    env = {}
    for item in raw.split(b"\0"):
        if b"=" in item:
            k, v = item.split(b"=", 1)
            env[os.fsdecode(k)] = os.fsdecode(v)
    return env


def readlink(path):
    """Where the link ``path`` points, or None."""
    try:
        return os.readlink(path)
    except OSError:
        return None


def table():
    """Every live process: ``{pid: stat}``."""
    procs = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = proc_stat(int(name))
            if st is not None and st["state"] not in ("Z", "X", "x"):
                procs[int(name)] = st
    return procs


def descendants(pid, procs):
    """Every descendant of ``pid`` in ``procs`` (``table``'s), sorted."""
    kids = {}
    for p, st in procs.items():
        kids.setdefault(st["ppid"], []).append(p)
    out, todo = [], list(kids.get(pid, ()))
    while todo:
        p = todo.pop()
        if p in out or p == pid:
            continue
        out.append(p)
        todo.extend(kids.get(p, ()))
    return sorted(out)


def boot_time():
    """This machine's boot, on the wall clock (float seconds), from /proc/uptime read now."""
    raw = read_or_none("/proc/uptime")
    try:
        return time.time() - float(raw.split()[0])
    except (AttributeError, IndexError, ValueError):
        return None


def uid_of(pid):
    """The owner of ``pid`` (its /proc folder's uid), or None when it is gone."""
    try:
        return os.stat("/proc/%d" % pid).st_uid
    except OSError:
        return None


# Signals whose disposition a relaunch reproduces (ignored, as under nohup, or default): the ones a person or a
# supervisor sends to a server.
KEPT_SIGNALS = ("SIGHUP", "SIGINT", "SIGQUIT", "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGPIPE")


def ignored_signals(pid):
    """The names of the signals of ``KEPT_SIGNALS`` that the process ignores (its SigIgn mask), or None."""
    raw = read_or_none("/proc/%d/status" % pid)
    if raw is None:
        return None
    for line in raw.decode("ascii", "replace").splitlines():
        if line.startswith("SigIgn:"):
            mask = int(line.split()[1], 16)
            return [name for name in KEPT_SIGNALS
                    if hasattr(signal, name) and mask & (1 << (int(getattr(signal, name)) - 1))]
    return None


def ids_of(pid):
    """(uid, gid, supplementary gids) of a process, from /proc/PID/status; None when unreadable."""
    raw = read_or_none("/proc/%d/status" % pid)
    if raw is None:
        return None
    fields = {}
    for line in raw.decode("ascii", "replace").splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.split()
    try:
        return int(fields["Uid"][1]), int(fields["Gid"][1]), [int(g) for g in fields.get("Groups", [])]
    except (KeyError, IndexError, ValueError):
        return None


def user_name(uid):
    """The user name of ``uid``, or the number itself when it has none."""
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return str(uid)


# ---------------------------------------------------------------------------------------------------------------
# ports

def parse_proc_net(text, port):
    """True when a /proc/net/tcp{,6} table has a socket LISTENing (state 0A) on ``port``, any address."""
    for line in text.splitlines()[1:]:
        parts = line.split()
        if len(parts) > 3 and parts[3] == "0A":
            try:
                if int(parts[1].rsplit(":", 1)[1], 16) == port:
                    return True
            except (IndexError, ValueError):
                continue
    return False


def listening(port):
    """True when something listens on ``port`` on this host (any address)."""
    tables = [read_or_none("/proc/net/tcp"), read_or_none("/proc/net/tcp6")]
    if any(t is not None for t in tables):
        return any(parse_proc_net(t.decode("ascii", "replace"), port) for t in tables if t is not None)
    s = socket.socket()
    s.settimeout(1.0)
    try:
        return s.connect_ex(("127.0.0.1", port)) == 0
    finally:
        s.close()
