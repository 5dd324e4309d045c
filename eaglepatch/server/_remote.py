"""The programs that run ON the target host: scan /proc, stop, start, probe, read the log.

This file is shipped whole, as source, to the host's interpreter by ``eaglepatch.hosts.base.run_python`` (one
round trip per call), with ``PAYLOAD = {"op": ..., ...}``; it prints one JSON document. So it must stay standard
library only, run on Python 3.8+, and never import sglang (importing it takes seconds and may need a GPU).
Locally it is also an ordinary module, so its pure parts (``launcher_args_index``, ``parse_proc_net``) are unit
tested directly.

``eaglepatch/ops/_remote.py`` is appended to this file (up to its main block) to make the facts program: it uses
``op_scan``, ``OPS`` and ``main`` from here, and defines its own helpers at top level. So keep those three names,
and give new top-level helpers here names that say what they are for (a name defined in both files is the
later one's).
"""

from __future__ import annotations

import errno
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import time

# python, python3, python3.11, python3.13t, pypy3; the interpreter of a `python -m sglang.launch_server` process
_PYTHON_RE = re.compile(r"^(python|pypy)[0-9.]*[a-z]?$")
# a cluster of CPython's argument-less short options ending in -m: -m, -um, -Bum...; -m's value follows
_MODULE_OPT_RE = re.compile(r"^-[bBdEhiIOPqRsSuvVx]*m(.*)$")
# CPython options that take a separate value
_OPTS_WITH_VALUE = ("-X", "-W", "--check-hash-based-pycs")
_LAUNCH_MODULE = "sglang.launch_server"
DEFAULT_PORT = 30000
DEFAULT_HOST = "127.0.0.1"


def launcher_args_index(argv):
    """Return the index in ``argv`` where the server's own arguments begin, or -1 when ``argv`` is not a launcher.

    Launchers: ``<python> [opts] -m sglang.launch_server ...``, ``<python> [opts] .../sglang/launch_server.py ...``,
    ``sglang serve ...`` and ``<python> [opts] .../bin/sglang serve ...`` (how a console script's command line
    reads after the kernel ran its shebang). Anything else, ``sh -c "python -m sglang.launch_server"`` included,
    is not.
    """
    if not argv:
        return -1
    first = os.path.basename(argv[0])
    if first == "sglang":
        return 2 if len(argv) > 1 and argv[1] == "serve" else -1
    if not _PYTHON_RE.match(first):
        return -1
    i = 1
    while i < len(argv):
        arg = argv[i]
        m = _MODULE_OPT_RE.match(arg)
        if m:
            if m.group(1):
                return i + 1 if m.group(1) == _LAUNCH_MODULE else -1
            return i + 2 if i + 1 < len(argv) and argv[i + 1] == _LAUNCH_MODULE else -1
        if arg == "-c" or arg == "-":
            return -1
        if arg in _OPTS_WITH_VALUE:
            i += 2
            continue
        if arg.startswith("-"):
            i += 1
            continue
        # the script
        if os.path.basename(arg) == "sglang":
            return i + 2 if i + 1 < len(argv) and argv[i + 1] == "serve" else -1
        if arg.replace("\\", "/").endswith("sglang/launch_server.py"):
            return i + 1
        return -1
    return -1


def parse_server_args(args):
    """``{"port", "host", "api_key"}`` from sglang's arguments (``--x V`` or ``--x=V``; the last one wins).

    A malformed ``--port`` leaves the default (30000): the server would not have started with it.
    """
    values = {}
    wanted = ("--port", "--host", "--api-key")
    i = 0
    while i < len(args):
        name, eq, value = args[i].partition("=")
        if name in wanted:
            if eq:
                values[name] = value
            elif i + 1 < len(args):
                values[name] = args[i + 1]
                i += 1
        i += 1
    try:
        port = int(values.get("--port", DEFAULT_PORT))
    except ValueError:
        port = DEFAULT_PORT
    return {"port": port, "host": values.get("--host", DEFAULT_HOST), "api_key": values.get("--api-key")}


# ---------------------------------------------------------------------------------------------------------------
# /proc


def _proc_bytes(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def _stat(pid):
    """``{"state", "ppid", "pgid", "sid", "start"}`` from /proc/PID/stat, or None when the process is gone."""
    raw = _proc_bytes("/proc/%d/stat" % pid)
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


def _alive(pid, start=None):
    """True when ``pid`` runs (a zombie is dead) and, when ``start`` is given, is still the same process."""
    st = _stat(pid)
    if st is None or st["state"] in ("Z", "X", "x"):
        return False
    return start is None or st["start"] == start


def _cmdline(pid):
    raw = _proc_bytes("/proc/%d/cmdline" % pid)
    if not raw:
        return None  # gone, or a kernel thread
    return [os.fsdecode(a) for a in raw.rstrip(b"\0").split(b"\0")]


def _environ(pid):
    raw = _proc_bytes("/proc/%d/environ" % pid)
    if raw is None:
        return None  # another user's process: no permission
    env = {}
    for item in raw.split(b"\0"):
        if b"=" in item:
            k, v = item.split(b"=", 1)
            env[os.fsdecode(k)] = os.fsdecode(v)
    return env


def _readlink(path):
    try:
        return os.readlink(path)
    except OSError:
        return None


def _table():
    """Every live process: ``{pid: stat}``."""
    procs = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _stat(int(name))
            if st is not None and st["state"] not in ("Z", "X", "x"):
                procs[int(name)] = st
    return procs


def _descendants(pid, procs):
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


def _launchers(procs):
    """``{pid: (argv, args_index)}`` of the top launcher processes (a launcher under another belongs to it)."""
    me = os.getpid()
    found = {}
    for pid in procs:
        if pid == me:
            continue
        argv = _cmdline(pid)
        if argv:
            idx = launcher_args_index(argv)
            if idx >= 0:
                found[pid] = (argv, idx)
    top = {}
    for pid, item in found.items():
        # a launcher started by another launcher (a fork, `sglang serve` running launch_server) belongs to it
        p, seen, nested = procs[pid]["ppid"], set(), False
        while p in procs and p not in seen:
            if p in found:
                nested = True
                break
            seen.add(p)
            p = procs[p]["ppid"]
        if not nested:
            top[pid] = item
    return top


def op_scan(payload):
    """The top launcher processes of running sglang servers, with what relaunching one needs."""
    procs = _table()
    own_mnt = _readlink("/proc/self/ns/mnt")
    servers = []
    for pid, (argv, idx) in sorted(_launchers(procs).items()):
        st = procs[pid]
        mnt = _readlink("/proc/%d/ns/mnt" % pid)
        servers.append(
            {
                "pid": pid,
                "argv": argv,
                "args_index": idx,
                "cwd": _readlink("/proc/%d/cwd" % pid),
                "env": _environ(pid),
                "exe": _readlink("/proc/%d/exe" % pid),
                "children": _descendants(pid, procs),
                "pgid": st["pgid"],
                "sid": st["sid"],
                "start": st["start"],
                # a server inside a container shows in the host's /proc but cannot be relaunched from outside it
                "same_mount_ns": None if mnt is None or own_mnt is None else mnt == own_mnt,
            }
        )
    return {"servers": servers}


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


def _listening(port):
    tables = [_proc_bytes("/proc/net/tcp"), _proc_bytes("/proc/net/tcp6")]
    if any(t is not None for t in tables):
        return any(parse_proc_net(t.decode("ascii", "replace"), port) for t in tables if t is not None)
    s = socket.socket()
    s.settimeout(1.0)
    try:
        return s.connect_ex(("127.0.0.1", port)) == 0
    finally:
        s.close()


def op_port(payload):
    return {"listening": _listening(payload["port"])}


# ---------------------------------------------------------------------------------------------------------------
# stop


def _signal(pids, sig, errors):
    """Send ``sig`` to each pid; return the pids it was not allowed to signal (also noted in ``errors``)."""
    denied = []
    for p in pids:
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            pass
        except PermissionError:
            denied.append(p)
            errors.append("pid %d: permission denied" % p)
    return denied


def op_stop(payload):
    """SIGTERM the server's processes, SIGKILL what is left after ``grace`` s, then wait for the port to be free.

    The processes: the launcher, every descendant (re-read while waiting), and the members of its process group
    and session when the launcher leads them (it started them all). A group or session it does not lead may hold
    the user's shell, so it is left alone. When the launcher is already gone (it crashed) and it led its group
    (``payload["leader"]``), what is left of its group and session (orphaned TP ranks) is stopped the same way.
    """
    pid, grace, port = payload["pid"], payload["grace"], payload.get("port")
    t0 = time.monotonic()
    out = {"already_gone": False, "killed": [], "remaining": [], "errors": [], "port_free": True}
    st = _stat(pid)
    procs = _table()
    targets = set()
    if st is None or st["state"] in ("Z", "X", "x"):
        out["already_gone"] = True
        if payload.get("leader"):
            targets = {p for p, pst in procs.items() if pst["pgid"] == pid or pst["sid"] == pid}
    elif payload.get("start") is not None and st["start"] != payload["start"]:
        out["already_gone"] = True  # the pid now belongs to another process: nothing of ours to stop
    else:
        targets = {pid}
        targets.update(_descendants(pid, procs))
        for p, pst in procs.items():
            if (st["pgid"] == pid and pst["pgid"] == pid) or (st["sid"] == pid and pst["sid"] == pid):
                targets.add(p)
        # children seen by the scan that have since been re-parented (the launcher died first) still belong to it
        for p in payload.get("children") or ():
            if p in procs and (procs[p]["pgid"] == st["pgid"] or procs[p]["sid"] == st["sid"]):
                targets.add(p)
    targets.discard(os.getpid())
    if targets:
        if pid in _signal(sorted(targets), signal.SIGTERM, out["errors"]):
            out["remaining"] = sorted(p for p in targets if _alive(p))
            out["stopped"] = []
            out["seconds"] = time.monotonic() - t0
            return out

        def still():
            alive = {p for p in targets if _alive(p)}
            if alive:
                procs_now = _table()
                for p in list(alive):
                    alive.update(_descendants(p, procs_now))
                targets.update(alive)
            return alive

        deadline = t0 + grace
        alive = still()
        while alive and time.monotonic() < deadline:
            time.sleep(0.1)
            alive = still()
        if alive:
            out["killed"] = sorted(alive)
            _signal(sorted(alive), signal.SIGKILL, out["errors"])
            deadline = time.monotonic() + 10.0
            while alive and time.monotonic() < deadline:
                time.sleep(0.1)
                alive = {p for p in alive if _alive(p)}
        out["remaining"] = sorted(alive)
    if port is not None:
        deadline = time.monotonic() + payload.get("port_timeout", 60.0)
        while _listening(port) and time.monotonic() < deadline:
            time.sleep(0.2)
        out["port_free"] = not _listening(port)
    out["stopped"] = sorted(targets)
    out["seconds"] = time.monotonic() - t0
    return out


# ---------------------------------------------------------------------------------------------------------------
# start


def op_start(payload):
    """Start argv in cwd with exactly env, in a new session, stdin /dev/null, output appended to the log.

    The new session (setsid) and the redirected descriptors let it outlive this program and the SSH session that
    ran it: nothing ties it to the connection's terminal or pipes. Returns its pid and the log offset where its
    output begins.
    """
    argv, cwd, env, log_path = payload["argv"], payload["cwd"], payload["env"], payload["log_path"]
    log_dir = os.path.dirname(log_path)
    if log_dir:
        try:
            os.makedirs(log_dir, exist_ok=True)
        except OSError as exc:
            return {"error": "cannot create the log directory %s: %s" % (log_dir, exc.strerror or exc)}
    try:
        log = open(log_path, "ab")
    except OSError as exc:
        return {"error": "cannot open the log %s: %s" % (log_path, exc.strerror or exc)}
    with log:
        log.write(
            (
                "\n=== eaglepatch %s: starting in %s: %s ===\n"
                % (time.strftime("%Y-%m-%d %H:%M:%S"), cwd, " ".join(shlex.quote(a) for a in argv))
            ).encode("utf-8", "surrogateescape")
        )
        log.flush()
        offset = log.tell()
        try:
            proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                close_fds=True,
                start_new_session=True,
            )
        except OSError as exc:
            reason = exc.strerror or str(exc)
            if exc.errno == errno.ENOENT and not os.path.isdir(cwd):
                what = "the directory %s does not exist" % cwd
            else:
                what = "%s: %s" % (argv[0], reason)
            log.write(("eaglepatch: could not start: %s\n" % what).encode("utf-8", "surrogateescape"))
            return {"error": "could not start the server: %s" % what, "offset": offset}
    st = _stat(proc.pid)
    return {"pid": proc.pid, "start": st["start"] if st else None, "offset": offset}


# ---------------------------------------------------------------------------------------------------------------
# readiness and the log


# the server's access-log lines for our own polls say nothing about its progress
_PROBE_LINE_RE = re.compile(r'"(GET|HEAD) /(health|health_generate|ready)[ ?]')


def _tail_lines(path, offset, n, max_bytes=262144):
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            begin = max(offset or 0, size - max_bytes)
            if begin > size:  # the log was truncated or replaced since
                begin = max(0, size - max_bytes)
            f.seek(begin)
            data = f.read()
    except OSError:
        return None
    # \r too: progress bars (tqdm, weight loading) redraw a line in place
    lines = [ln.rstrip() for ln in re.split(r"\r\n|\r|\n", data.decode("utf-8", "replace"))]
    lines = [ln for ln in lines if ln.strip() and not _PROBE_LINE_RE.search(ln)]
    return lines[-n:] if n else lines


def op_tail(payload):
    return {"lines": _tail_lines(payload["log_path"], payload.get("offset", 0), payload.get("lines", 30))}


def _http_get(url, timeout, api_key):
    import urllib.error
    import urllib.request

    headers = {"Authorization": "Bearer " + api_key} if api_key else {}
    # no proxies: the server is on this very host, and http_proxy in a login environment must not intercept
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(urllib.request.Request(url, headers=headers), timeout=timeout) as resp:
            return resp.status, None
    except urllib.error.HTTPError as exc:
        return exc.code, None
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, ConnectionRefusedError):
            return None, "connection refused"
        if isinstance(reason, socket.timeout):
            return None, "timed out"
        return None, str(reason)
    except socket.timeout:
        return None, "timed out"
    except (ConnectionError, OSError) as exc:
        return None, exc.__class__.__name__ + (": " + exc.strerror if getattr(exc, "strerror", None) else "")


def op_probe(payload):
    """One readiness poll: is the process alive, what does the health endpoint say, what did the log say last."""
    out = {}
    old = payload.get("old_pid")
    out["old_alive"] = bool(old) and _alive(old, payload.get("old_start"))
    pid = payload.get("pid")
    if not pid and payload.get("discover"):
        # started by someone else (a restart command): find its launcher on the port, to notice when it dies
        procs = _table()
        for p, (argv, idx) in sorted(_launchers(procs).items()):
            if p != old and parse_server_args(argv[idx:])["port"] == payload["port"]:
                out["found_pid"], out["found_start"] = p, procs[p]["start"]
                break
    out["alive"] = True if not pid else _alive(pid, payload.get("start"))
    out["status"], out["error"], out["endpoint"] = None, None, None
    if out["alive"] and not out["old_alive"]:
        host = payload["host"]
        base = "http://%s:%d" % ("[%s]" % host if ":" in host else host, payload["port"])
        timeout = payload.get("http_timeout", 20.0)
        out["endpoint"] = "/health_generate"
        out["status"], out["error"] = _http_get(base + "/health_generate", timeout, payload.get("api_key"))
        if out["status"] == 404:
            out["endpoint"] = "/ready"
            out["status"], out["error"] = _http_get(base + "/ready", timeout, payload.get("api_key"))
    if payload.get("log_path"):
        lines = _tail_lines(payload["log_path"], payload.get("offset", 0), 1, max_bytes=16384)
        out["last_line"] = lines[-1] if lines else None
    return out


OPS = {"scan": op_scan, "port": op_port, "stop": op_stop, "start": op_start, "tail": op_tail, "probe": op_probe}


def main(payload):
    return OPS[payload["op"]](payload)


if __name__ == "__main__" and "PAYLOAD" in globals():
    print(json.dumps(main(PAYLOAD)))  # noqa: F821 (PAYLOAD is given by run_python's wrapper)
