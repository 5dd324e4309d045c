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
import stat
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


def resolve_launcher(argv0, cwd, env):
    """The file ``argv0`` named when the process started: a path with a "/" (relative to ``cwd``), or a bare name
    looked up on the process's own PATH, as its shell did; None when nothing executable is found there.

    Not ``realpath``: a virtual environment's ``bin/python`` is a symlink to the base interpreter, and only the
    link's own path makes Python find the venv (its ``pyvenv.cfg``). /proc/PID/exe is the resolved base binary.
    """
    if not argv0:
        return None
    if "/" in argv0:
        cands = [argv0 if os.path.isabs(argv0) else os.path.join(cwd or "/", argv0)]
    else:
        path = (env or {}).get("PATH", os.defpath)
        cands = [os.path.join(d if os.path.isabs(d) else os.path.join(cwd or "/", d), argv0)
                 for d in path.split(os.pathsep)]
    for cand in cands:
        if os.path.isfile(cand) and os.access(cand, os.X_OK):
            return os.path.normpath(cand)
    return None


def _shebang(path):
    """The interpreter (and its one argument) of a script's ``#!`` line, or None."""
    raw = _proc_bytes(path)
    if not raw or not raw.startswith(b"#!"):
        return None
    words = raw[2:].split(b"\n", 1)[0].decode("utf-8", "replace").split()
    return words or None


# what asks an interpreter, as the server ran it, where `import sglang` comes from (without importing it)
_PACKAGE_QUERY = (
    "import sys,json\n"
    "d=sys.argv[1] if len(sys.argv)>1 else ''\n"
    "if d and sys.path and sys.path[0]=='':sys.path[0]=d\n"
    "try:\n"
    " import importlib.util as u;s=u.find_spec('sglang')\n"
    "except Exception:\n"
    " s=None\n"
    "print(json.dumps({'origin':getattr(s,'origin',None),"
    "'locations':list(getattr(s,'submodule_search_locations',None) or []),"
    "'path':sys.path,'prefix':sys.prefix,'base_prefix':sys.base_prefix}))\n"
)
# CPython options that change where imports come from: kept when the interpreter is asked
_PATH_OPTS = set("IEsSP")


def _interpreter(argv, idx, launcher, exe, cwd):
    """How to ask the server's interpreter: ``(interpreter, options, script_dir)``.

    ``python [opts] -m sglang.launch_server``: argv[0] as launched, its import-relevant options, no script.
    ``python [opts] /venv/bin/sglang serve`` and ``.../sglang/launch_server.py``: the same, with the script's folder
    (sys.path[0] of a script). ``sglang serve`` started directly: the interpreter of its ``#!`` line.
    """
    if os.path.basename(argv[0]) == "sglang":
        words = _shebang(launcher) if launcher else None
        if words and os.path.basename(words[0]) != "env":
            return words[0], [], os.path.dirname(launcher)
        return exe, [], os.path.dirname(launcher) if launcher else ""
    opts, script = [], ""
    i = 1
    while i < idx:
        arg = argv[i]
        if arg in _OPTS_WITH_VALUE:
            i += 2
            continue
        if arg.startswith(("-W", "-X")):  # -Wignore, -Xfrozen_modules=off: a value, not option letters
            i += 1
            continue
        if arg.startswith("-") and not arg.startswith("--"):
            module = _MODULE_OPT_RE.match(arg)
            keep = "".join(ch for ch in (arg[1:arg.index("m")] if module else arg[1:]) if ch in _PATH_OPTS)
            if keep:
                opts.append("-" + keep)
            if module:
                break
        elif not arg.startswith("-"):
            script = os.path.dirname(os.path.join(cwd or "/", arg))
            break
        i += 1
    return launcher or exe, opts, script


def _query_start(interp, opts, script_dir, env, cwd, drop=None):
    """Start asking ``interp`` where ``import sglang`` comes from; ``drop``: (uid, gid, groups) to run it as."""

    def as_user():
        os.setgroups(drop[2])
        os.setgid(drop[1])
        os.setuid(drop[0])

    try:
        return subprocess.Popen(
            [interp] + opts + ["-c", _PACKAGE_QUERY, script_dir or ""],
            env=env,
            cwd=cwd if cwd and os.path.isdir(cwd) else None,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            preexec_fn=as_user if drop else None,
        )
    except Exception:
        return None


def _query_wait(proc, deadline):
    if proc is None:
        return None
    try:
        out, _ = proc.communicate(timeout=max(0.1, deadline - time.time()))
        return json.loads(out.decode()) if proc.returncode == 0 else None
    except Exception:
        try:
            proc.kill()
            proc.wait()
        except Exception:
            pass
        return None


def package_of(answer, cwd):
    """The realpath of the ``sglang`` package directory a ``_PACKAGE_QUERY`` answer found, or None."""
    if not answer:
        return None
    origin = answer.get("origin")
    if origin and os.path.basename(origin) == "__init__.py":
        return os.path.realpath(os.path.dirname(origin))
    for loc in answer.get("locations") or ():
        if os.path.isfile(os.path.join(loc, "__init__.py")):
            return os.path.realpath(loc)
    return None


def _venv_of(interp):
    """The virtual environment whose ``bin/`` holds ``interp`` (it has a ``pyvenv.cfg``), or None."""
    if not interp:
        return None
    root = os.path.dirname(os.path.dirname(interp))
    return root if os.path.isfile(os.path.join(root, "pyvenv.cfg")) else None


def _import_source(pkg, answer, env, cwd):
    """Where the interpreter's ``import sglang`` comes from, in a word: PYTHONPATH, cwd, site-packages, editable
    (an import hook or a .pth line), or None."""
    if not pkg or not answer:
        return None
    parent = os.path.dirname(pkg)
    real = lambda p: os.path.realpath(os.path.join(cwd or "/", p or "."))  # noqa: E731
    for entry in ((env or {}).get("PYTHONPATH") or "").split(os.pathsep):
        if entry and real(entry) == parent:
            return "PYTHONPATH"
    paths = [real(p) for p in answer.get("path") or ()]
    if parent not in paths:
        return "editable"  # a finder that an editable install put in a .pth
    if cwd and os.path.realpath(cwd) == parent:
        return "cwd"
    base = os.path.basename(parent)
    return "site-packages" if base in ("site-packages", "dist-packages") else "editable"


def _systemd_unit(pid, env, procs):
    """``{"unit", "user"}`` when systemd started this process as (part of) a service, else None.

    A service's processes carry ``INVOCATION_ID`` (a login session's do not: sshd and login build their
    environment anew) and sit in the unit's cgroup; ``SYSTEMD_EXEC_PID``, where systemd sets it, is the process
    that ExecStart ran: this one or an ancestor (a wrapper script).
    """
    if not env or "INVOCATION_ID" not in env:
        return None
    unit = parse_cgroup_unit((_proc_bytes("/proc/%d/cgroup" % pid) or b"").decode("utf-8", "replace"))
    if unit is None:
        return None
    # Is it the unit's own process (what ExecStart runs), or something started inside the unit (a shell of a
    # Jupyter service, a job of a CI runner)? Only the former may be restarted with the unit: restarting
    # jupyter.service to restart a server started from its terminal would stop everything else it runs.
    exec_pid = env.get("SYSTEMD_EXEC_PID")
    main = _unit_main_pid(unit)
    unit["main"] = pid == main if main else (exec_pid == str(pid))
    return unit


def _unit_main_pid(unit):
    """The unit's MainPID as systemctl reports it, or None (no systemctl, no answer)."""
    argv = ["systemctl"] + (["--user"] if unit.get("user") else []) + ["show", "-p", "MainPID", unit["unit"]]
    try:
        out = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             timeout=10).stdout.decode("ascii", "replace")
        value = int(out.strip().partition("=")[2])
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
    return value or None


def parse_cgroup_unit(text):
    """The service unit of a /proc/PID/cgroup text (the systemd hierarchy: v2 ``0::``, v1 ``name=systemd``):
    ``{"unit": "sglang.service", "user": False}``; ``user`` True inside a user manager (``user@UID.service``);
    None when the process is in no service (a session scope, the root)."""
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3 or parts[1] not in ("", "name=systemd"):
            continue
        names = [n for n in parts[2].strip().split("/") if n]
        services = [n for n in names if n.endswith(".service")]
        if not services:
            continue
        unit = services[-1]
        if unit.startswith("user@"):
            return None  # the user manager itself, not a unit of it
        return {"unit": unit, "user": any(n.startswith("user@") for n in services[:-1])}
    return None


def _boot_time():
    """This machine's boot, on the wall clock (float seconds), from /proc/uptime read now."""
    raw = _proc_bytes("/proc/uptime")
    try:
        return time.time() - float(raw.split()[0])
    except (AttributeError, IndexError, ValueError):
        return None


def op_scan(payload):
    """The top launcher processes of running sglang servers, with what relaunching one needs.

    With ``identify``, each server also gets ``package_dir``: the sglang package its interpreter imports, asked
    of that interpreter as it was launched (argv[0] resolved against the process's cwd and PATH, its
    import-relevant options, its environment and working directory), one interpreter per distinct set-up, all
    at once; and ``launch``: how it was launched (interpreter, venv, import source, systemd unit). With
    ``package_dir`` too, only the servers of that package are returned.
    """
    procs = _table()
    own_mnt = _readlink("/proc/self/ns/mnt")
    boot = _boot_time()
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    servers = []
    for pid, (argv, idx) in sorted(_launchers(procs).items()):
        st = procs[pid]
        mnt = _readlink("/proc/%d/ns/mnt" % pid)
        cwd = _readlink("/proc/%d/cwd" % pid)
        env = _environ(pid)
        servers.append(
            {
                "pid": pid,
                "argv": argv,
                "args_index": idx,
                "cwd": cwd,
                "env": env,
                "exe": _readlink("/proc/%d/exe" % pid),
                "launcher": resolve_launcher(argv[0], cwd, env),
                "children": _descendants(pid, procs),
                "pgid": st["pgid"],
                "sid": st["sid"],
                "start": st["start"],
                "started_at": None if boot is None else round(boot + st["start"] / float(hz), 3),
                "uid": _uid(pid),
                "same_user": _uid(pid) == os.geteuid(),
                "sig_ign": _ignored_signals(pid),
                # a server inside a container shows in the host's /proc but cannot be relaunched from outside it
                "same_mount_ns": None if mnt is None or own_mnt is None else mnt == own_mnt,
                "systemd": _systemd_unit(pid, env, procs),
            }
        )
    if payload.get("identify"):
        identify(servers)
        want = payload.get("package_dir")
        if want:
            servers = [s for s in servers if s.get("package_dir") == want]
    return {"servers": servers}


def _uid(pid):
    try:
        return os.stat("/proc/%d" % pid).st_uid
    except OSError:
        return None


# Signals whose disposition a relaunch reproduces (ignored, as under nohup, or default): the ones a person or a
# supervisor sends to a server.
_KEPT_SIGNALS = ("SIGHUP", "SIGINT", "SIGQUIT", "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGPIPE")


def _ignored_signals(pid):
    """The names of the signals of ``_KEPT_SIGNALS`` that the process ignores (its SigIgn mask), or None."""
    raw = _proc_bytes("/proc/%d/status" % pid)
    if raw is None:
        return None
    for line in raw.decode("ascii", "replace").splitlines():
        if line.startswith("SigIgn:"):
            mask = int(line.split()[1], 16)
            return [name for name in _KEPT_SIGNALS
                    if hasattr(signal, name) and mask & (1 << (int(getattr(signal, name)) - 1))]
    return None


def _ids(pid):
    """(uid, gid, supplementary gids) of a process, from /proc/PID/status; None when unreadable."""
    raw = _proc_bytes("/proc/%d/status" % pid)
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


def identify(servers, timeout=30.0):
    """Fill in ``package_dir`` and ``launch`` of each server (see ``op_scan``), asking every distinct
    interpreter set-up at once."""
    keys, asked = [], {}
    for srv in servers:
        env = srv.get("env")
        interp, opts, script_dir = _interpreter(srv["argv"], srv["args_index"], srv.get("launcher"), srv.get("exe"),
                                                srv.get("cwd"))
        srv["interpreter"] = interp
        env_key = tuple((k, (env or {}).get(k)) for k in _IMPORT_ENV)
        key = (interp, tuple(opts), script_dir, srv.get("cwd"), env_key, srv.get("uid"))
        keys.append(key)
        if key not in asked:
            asked[key] = None
            if interp and env is not None:
                # Another user's interpreter, environment (.pth files, sitecustomize) and folder run as that user,
                # never as ours (root's): it is their code. Unreadable (not root): not asked, not ours to act on.
                drop = None if srv.get("same_user") else _ids(srv["pid"])
                if srv.get("same_user") or (os.geteuid() == 0 and drop is not None):
                    asked[key] = _query_start(interp, opts, script_dir, env, srv.get("cwd"), drop)
    deadline = time.time() + timeout
    answers = {}
    for srv, key in zip(servers, keys):
        if key not in answers:
            answers[key] = _query_wait(asked[key], deadline)
        answer = answers[key]
        pkg = package_of(answer, srv.get("cwd"))
        srv["package_dir"] = pkg
        venv = _venv_of(srv.get("interpreter"))
        env = srv.get("env") or {}
        srv["launch"] = {
            "interpreter": srv.get("interpreter"),
            "venv": venv,
            "activated": bool(venv) and os.path.realpath(env.get("VIRTUAL_ENV") or "/nonexistent") == os.path.realpath(venv),
            "imports": _import_source(pkg, answer, env, srv.get("cwd")),
            "console_script": os.path.basename(srv["argv"][0]) == "sglang"
            or (srv["args_index"] >= 2 and os.path.basename(srv["argv"][srv["args_index"] - 2]) == "sglang"),
        }
    return servers


# environment variables that change where an interpreter imports from
_IMPORT_ENV = ("PYTHONPATH", "PYTHONHOME", "PYTHONNOUSERSITE", "PYTHONUSERBASE", "PYTHONSAFEPATH", "HOME",
               "VIRTUAL_ENV")


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


def _safe_dir(path):
    """``path`` if it is (or can be made, 0700) a folder of this user that nobody else may write; else a private
    folder of this user's beside it (``<path>-<uid>``), made the same way; raises OSError when neither can be."""
    for cand in (path, "%s-%d" % (path, os.geteuid())):
        try:
            os.makedirs(cand, mode=0o700, exist_ok=True)
            st = os.lstat(cand)
        except OSError:
            continue
        if os.path.isdir(cand) and not os.path.islink(cand) and st.st_uid == os.geteuid() and not st.st_mode & 0o022:
            return cand
    raise OSError(errno.EACCES, "neither %s nor %s-%d is a folder of this user's only" % (path, path, os.geteuid()))


def _open_private(path, flags, mode=0o600):
    """Open ``path`` without following a symlink, and only if it is a regular file."""
    fd = os.open(path, flags | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), mode)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", path)
    return fd


def _start_script(argv, cwd, env):
    """A shell script that starts the server by hand exactly as eaglepatch does: its folder, its whole
    environment, its command line."""
    lines = ["#!/bin/sh", "# The sglang server as eaglepatch starts it: its folder, environment and command line.",
             "cd %s || exit 1" % shlex.quote(cwd),
             "exec env -i " + " ".join(shlex.quote("%s=%s" % kv) for kv in sorted(env.items())) + " \\",
             "    " + " ".join(shlex.quote(a) for a in argv), ""]
    return "\n".join(lines).encode("utf-8", "surrogateescape")


def _prepare_start(payload):
    """Everything a start needs that can fail, done before anything is stopped: argv[0] still names the same
    file, the folder exists, the log and the start script can be written (in a folder only this user can write,
    without following a symlink). Returns ``{"error": ...}`` or what ``_spawn`` takes."""
    argv, cwd, env, log_path = payload["argv"], payload["cwd"], payload["env"], payload["log_path"]
    if not os.path.isdir(cwd):
        return {"error": "its folder %s does not exist (any more)" % cwd}
    want = payload.get("launcher")
    got = resolve_launcher(argv[0], cwd, env)
    if want and got != want:
        return {"error": "%s now names %s, not %s as when the server was read" % (argv[0], got or "no executable file",
                                                                                 want)}
    if got is None:
        return {"error": "%s names no executable file (from %s, along its PATH)" % (argv[0], cwd)}
    try:
        folder = _safe_dir(os.path.dirname(log_path) or ".")
        log_path = os.path.join(folder, os.path.basename(log_path))
        log_fd = _open_private(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    except OSError as exc:
        return {"error": "cannot open the log %s: %s" % (log_path, exc.strerror or exc)}
    script = os.path.join(folder, "start-%s.sh" % payload.get("port", "server"))
    try:
        tmp = script + ".tmp%d" % os.getpid()
        fd = _open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o700)
        with os.fdopen(fd, "wb") as f:
            f.write(_start_script(argv, cwd, env))
        os.replace(tmp, script)
    except OSError:
        script = None
    return {"log_fd": log_fd, "log_path": log_path, "script": script}


def _restore_signals(ignored):
    """A child's preexec: the dispositions the original server had (ignored, as under nohup, or default),
    whatever this helper ignores itself while it relaunches."""
    ignored = set(ignored or ())

    def apply():
        for name in _KEPT_SIGNALS:
            if hasattr(signal, name):
                signal.signal(getattr(signal, name), signal.SIG_IGN if name in ignored else signal.SIG_DFL)

    return apply


def _spawn(payload, prep):
    """Start argv in cwd with exactly env, in a new session, stdin /dev/null, output appended to the log."""
    argv, cwd, env = payload["argv"], payload["cwd"], payload["env"]
    out = {"log_path": prep["log_path"], "script": prep["script"]}
    with os.fdopen(prep["log_fd"], "ab") as log:
        log.write(
            (
                "\n=== eaglepatch %s: starting in %s: %s ===\n"
                % (time.strftime("%Y-%m-%d %H:%M:%S"), cwd, " ".join(shlex.quote(a) for a in argv))
            ).encode("utf-8", "surrogateescape")
        )
        log.flush()
        out["offset"] = log.tell()
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
                preexec_fn=_restore_signals(payload.get("sig_ign")),
            )
        except OSError as exc:
            what = "%s: %s" % (argv[0], exc.strerror or str(exc))
            log.write(("eaglepatch: could not start: %s\n" % what).encode("utf-8", "surrogateescape"))
            out["error"] = "could not start the server: %s" % what
            return out
    st = _stat(proc.pid)
    out.update(pid=proc.pid, start=st["start"] if st else None)
    return out


def op_start(payload):
    """Start argv in cwd with exactly env (and the original's signal dispositions), in a new session, stdin
    /dev/null, output appended to the log: ``_prepare_start``, then ``_spawn``.

    The new session (setsid) and the redirected descriptors let it outlive this program and the SSH session that
    ran it: nothing ties it to the connection's terminal or pipes. Returns its pid, start time, the log (its path:
    the one asked for, or this user's private one) and the offset where its output begins, and the start script.
    """
    prep = _prepare_start(payload)
    if "error" in prep:
        return {"error": "nothing was started: " + prep["error"]}
    return _spawn(payload, prep)


def _other_launchers(port, keep):
    """Launchers of a server on ``port`` (by their command line) other than ``keep``: one still loading has not
    bound its port yet, so the port alone does not show it."""
    procs = _table()
    return [p for p, (argv, idx) in sorted(_launchers(procs).items())
            if p != keep and parse_server_args(argv[idx:])["port"] == port]


def op_relaunch(payload):
    """Stop a server (``stop``: op_stop's payload, or None) and start one (``start``: op_start's payload) in one
    request, so that nothing between the two depends on the client: a client killed or cut off meanwhile leaves
    the host with the new server starting, never with none. Whatever can make the start fail is checked before
    the stop (``_prepare_start``): then nothing is stopped. Nothing starts while another launcher for the port
    runs (loading, or listening) besides the one stopped, or (``check_port``) something else listens there. A
    list ``batch`` of such requests runs one after the other (answers in order).

    SIGINT, SIGHUP and SIGTERM are ignored meanwhile (the new server gets the original's dispositions back): a
    Ctrl-C in the client's terminal or a hang-up must not stop the host halfway.
    """
    if "batch" in payload:
        return {"batch": [op_relaunch(p) for p in payload["batch"]]}
    saved = [(sig, signal.signal(sig, signal.SIG_IGN)) for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM)]
    try:
        start, stop = payload["start"], payload.get("stop")
        prep = _prepare_start(start)
        if "error" in prep:
            return {"start": {"error": "nothing was stopped or started: " + prep["error"]}, "not_stopped": True}
        others = _other_launchers(payload["port"], stop["pid"] if stop else None)
        if others:
            os.close(prep["log_fd"])
            return {"busy": True, "busy_pids": others, "not_stopped": True}
        out = {}
        if stop:
            out["stop"] = op_stop(stop)
            res = out["stop"]
            if res.get("remaining") or not res.get("port_free", True):
                os.close(prep["log_fd"])
                return out  # not stopped: starting another beside it would make two
        if payload.get("check_port") and _listening(payload["port"]):
            os.close(prep["log_fd"])
            out["busy"] = True
            return out
        out["start"] = _spawn(start, prep)
        return out
    finally:
        for sig, old in saved:
            signal.signal(sig, old)


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


OPS = {"scan": op_scan, "stop": op_stop, "start": op_start, "tail": op_tail, "probe": op_probe,
       "relaunch": op_relaunch}


def main(payload):
    return OPS[payload["op"]](payload)


if __name__ == "__main__" and "PAYLOAD" in globals():
    print(json.dumps(main(PAYLOAD)))  # noqa: F821 (PAYLOAD is given by run_python's wrapper)
