"""Finding the sglang servers on the host (the ``scan`` op): their launcher processes, how each was launched, and the
sglang package its own interpreter imports (asked of that interpreter, as the server ran it, without importing
sglang).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time

from eaglepatch.hostside.files import read_or_none
from eaglepatch.hostside.launchers import MODULE_OPT_RE, OPTS_WITH_VALUE, launcher_args_index
from eaglepatch.hostside.proc import (
    boot_time,
    cmdline,
    descendants,
    environ,
    ids_of,
    ignored_signals,
    readlink,
    table,
    uid_of,
)
from eaglepatch.hostside.state import state_dir


def top_launchers(procs):
    """``{pid: (argv, args_index)}`` of the top launcher processes (a launcher under another belongs to it)."""
    me = os.getpid()
    found = {}
    for pid in procs:
        if pid == me:
            continue
        argv = cmdline(pid)
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


def output_files(pid):
    """Where the server's stdout and stderr go, when each is a regular file: ``{"stdout": {"path", "dev", "ino"},
    "stderr": ...}``, None for a stream that is not (a terminal, a pipe, a socket, /dev/null), that cannot be read
    (another user's process), or whose path no longer names the file it writes to (deleted, or replaced: another
    device and inode there). A relaunch appends to the same files (``control._open_kept``)."""
    out = {}
    for fd, name in ((1, "stdout"), (2, "stderr")):
        link = "/proc/%d/fd/%d" % (pid, fd)
        out[name] = None
        try:
            path = os.readlink(link)
            st = os.stat(link)  # the open file itself
            now = os.lstat(path) if os.path.isabs(path) else None  # what its path names now (a link: not it)
        except OSError:
            continue
        if now is None or not stat.S_ISREG(st.st_mode) or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            continue
        out[name] = {"path": path, "dev": st.st_dev, "ino": st.st_ino}
    return out


def _shebang(path):
    """The interpreter (and its one argument) of a script's ``#!`` line, or None."""
    raw = read_or_none(path)
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


def interpreter_of(argv, idx, launcher, exe, cwd):
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
        if arg in OPTS_WITH_VALUE:
            i += 2
            continue
        if arg.startswith(("-W", "-X")):  # -Wignore, -Xfrozen_modules=off: a value, not option letters
            i += 1
            continue
        if arg.startswith("-") and not arg.startswith("--"):
            module = MODULE_OPT_RE.match(arg)
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


def query_start(interp, opts, script_dir, env, cwd, drop=None):
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


def query_wait(proc, deadline):
    """The answer of ``query_start``'s process (killed at ``deadline``, wall clock), or None."""
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


def import_source(pkg, answer, env, cwd):
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
    unit = parse_cgroup_unit((read_or_none("/proc/%d/cgroup" % pid) or b"").decode("utf-8", "replace"))
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


def op_scan(payload):
    """The top launcher processes of running sglang servers, with what relaunching one needs.

    With ``identify``, each server also gets ``package_dir``: the sglang package its interpreter imports, asked
    of that interpreter as it was launched (argv[0] resolved against the process's cwd and PATH, its
    import-relevant options, its environment and working directory), one interpreter per distinct set-up, all
    at once; and ``launch``: how it was launched (interpreter, venv, import source, systemd unit). With
    ``package_dir`` too, only the servers of that package are returned. With ``settle`` (``lock.settle``'s
    payload), the scan waits for a relaunch of that port that still runs on the host (``unsettled``: it still did
    after the wait).
    """
    settled = True
    if payload.get("settle"):  # a relaunch of that port still running on the host (its client cut off) ends first
        from eaglepatch.hostside.lock import settle

        settled = settle(payload["settle"])
    procs = table()
    own_mnt = readlink("/proc/self/ns/mnt")
    boot = boot_time()
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    servers = []
    state = state_dir()  # where a relaunch writes the log of a server without output files (status says it)
    for pid, (argv, idx) in sorted(top_launchers(procs).items()):
        st = procs[pid]
        mnt = readlink("/proc/%d/ns/mnt" % pid)
        cwd = readlink("/proc/%d/cwd" % pid)
        env = environ(pid)
        servers.append(
            {
                "pid": pid,
                "argv": argv,
                "args_index": idx,
                "cwd": cwd,
                "env": env,
                "exe": readlink("/proc/%d/exe" % pid),
                "launcher": resolve_launcher(argv[0], cwd, env),
                "children": descendants(pid, procs),
                "pgid": st["pgid"],
                "sid": st["sid"],
                "start": st["start"],
                "started_at": None if boot is None else round(boot + st["start"] / float(hz), 3),
                "uid": uid_of(pid),
                "same_user": uid_of(pid) == os.geteuid(),
                "sig_ign": ignored_signals(pid),
                "output": output_files(pid),  # its own output files: a relaunch appends to them
                # a server inside a container shows in the host's /proc but cannot be relaunched from outside it
                "same_mount_ns": None if mnt is None or own_mnt is None else mnt == own_mnt,
                "systemd": _systemd_unit(pid, env, procs),
                "state_dir": state,
            }
        )
    if payload.get("identify"):
        identify(servers)
        want = payload.get("package_dir")
        if want:
            servers = [s for s in servers if s.get("package_dir") == want]
    return {"servers": servers} if settled else {"servers": servers, "unsettled": True}


def identify(servers, timeout=30.0):
    """Fill in ``package_dir`` and ``launch`` of each server (see ``op_scan``), asking every distinct
    interpreter set-up at once."""
    keys, asked = [], {}
    for srv in servers:
        env = srv.get("env")
        interp, opts, script_dir = interpreter_of(srv["argv"], srv["args_index"], srv.get("launcher"),
                                                  srv.get("exe"), srv.get("cwd"))
        srv["interpreter"] = interp
        env_key = tuple((k, (env or {}).get(k)) for k in _IMPORT_ENV)
        key = (interp, tuple(opts), script_dir, srv.get("cwd"), env_key, srv.get("uid"))
        keys.append(key)
        if key not in asked:
            asked[key] = None
            if interp and env is not None:
                # Another user's interpreter, environment (.pth files, sitecustomize) and folder run as that user,
                # never as ours (root's): it is their code. Unreadable (not root): not asked, not ours to act on.
                drop = None if srv.get("same_user") else ids_of(srv["pid"])
                if srv.get("same_user") or (os.geteuid() == 0 and drop is not None):
                    asked[key] = query_start(interp, opts, script_dir, env, srv.get("cwd"), drop)
    deadline = time.time() + timeout
    answers = {}
    for srv, key in zip(servers, keys):
        if key not in answers:
            answers[key] = query_wait(asked[key], deadline)
        answer = answers[key]
        pkg = package_of(answer, srv.get("cwd"))
        srv["package_dir"] = pkg
        venv = _venv_of(srv.get("interpreter"))
        env = srv.get("env") or {}
        srv["launch"] = {
            "interpreter": srv.get("interpreter"),
            "venv": venv,
            "activated": bool(venv) and os.path.realpath(env.get("VIRTUAL_ENV") or "/nonexistent") == os.path.realpath(venv),
            "imports": import_source(pkg, answer, env, srv.get("cwd")),
            "console_script": os.path.basename(srv["argv"][0]) == "sglang"
            or (srv["args_index"] >= 2 and os.path.basename(srv["argv"][srv["args_index"] - 2]) == "sglang"),
        }
    return servers


# environment variables that change where an interpreter imports from
_IMPORT_ENV = ("PYTHONPATH", "PYTHONHOME", "PYTHONNOUSERSITE", "PYTHONUSERBASE", "PYTHONSAFEPATH", "HOME",
               "VIRTUAL_ENV")
