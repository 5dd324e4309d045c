"""Stopping and starting a server on the host (the ``stop``, ``start`` and ``relaunch`` ops).

A relaunch is one request: whatever can make the start fail is checked before the stop, and nothing between the
stop and the start depends on the client (docs/safety.md).
"""

from __future__ import annotations

import errno
import fcntl
import os
import shlex
import signal
import stat
import subprocess
import time

from eaglepatch.hostside.discover import resolve_launcher, top_launchers
from eaglepatch.hostside.files import open_private, private_dir
from eaglepatch.hostside.lock import relaunch_lock
from eaglepatch.hostside.launchers import parse_server_args
from eaglepatch.hostside.proc import KEPT_SIGNALS, descendants, is_alive, listening, proc_stat, table
from eaglepatch.hostside.state import log_path_of


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
    st = proc_stat(pid)
    procs = table()
    targets = set()
    if st is None or st["state"] in ("Z", "X", "x"):
        out["already_gone"] = True
        if payload.get("leader"):
            targets = {p for p, pst in procs.items() if pst["pgid"] == pid or pst["sid"] == pid}
    elif payload.get("start") is not None and st["start"] != payload["start"]:
        out["already_gone"] = True  # the pid now belongs to another process: nothing of ours to stop
    else:
        targets = {pid}
        targets.update(descendants(pid, procs))
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
            out["remaining"] = sorted(p for p in targets if is_alive(p))
            out["stopped"] = []
            out["seconds"] = time.monotonic() - t0
            return out

        def still():
            alive = {p for p in targets if is_alive(p)}
            if alive:
                procs_now = table()
                for p in list(alive):
                    alive.update(descendants(p, procs_now))
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
                alive = {p for p in alive if is_alive(p)}
        out["remaining"] = sorted(alive)
    if port is not None:
        deadline = time.monotonic() + payload.get("port_timeout", 60.0)
        while listening(port) and time.monotonic() < deadline:
            time.sleep(0.2)
        out["port_free"] = not listening(port)
    out["stopped"] = sorted(targets)
    out["seconds"] = time.monotonic() - t0
    return out


# ---------------------------------------------------------------------------------------------------------------
# start

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
    file, the folder exists, the output can be written (``_open_output``: the server's own files, else the log in
    a folder only this user can write, without following a symlink), the start script is written there. The log:
    ``payload["log_path"]``, or (null, empty or absent) ``server-PORT.log`` in the state folder (``state``).
    Returns ``{"error": ...}`` or what ``_spawn`` takes."""
    argv, cwd, env, log_path = payload["argv"], payload["cwd"], payload["env"], log_path_of(payload)
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
        folder = private_dir(os.path.dirname(log_path) or ".")
        log_path = os.path.join(folder, os.path.basename(log_path))
        prep = _open_output(payload.get("output"), log_path)
    except OSError as exc:
        return {"error": "cannot open the log %s: %s" % (log_path, exc.strerror or exc)}
    script = os.path.join(folder, "start-%s.sh" % payload.get("port", "server"))
    try:
        tmp = script + ".tmp%d" % os.getpid()
        fd = open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o700)
        with os.fdopen(fd, "wb") as f:
            f.write(_start_script(argv, cwd, env))
        os.replace(tmp, script)
    except OSError:
        script = None
    prep["script"] = script
    return prep


_REPLACED = "%s is another file now (not the one the server wrote to when it was read)"


def _open_kept(entry):
    """Open a file the server's own output went to (``entry``: ``{"path", "dev", "ino"}``, as the scan saw it)
    to append to, as the server did: never created, no symlink followed in its last component, a regular file,
    the very file the scan saw (same device and inode: not one put in its place since), that this user may
    write. Returns ``(fd, None)``, or ``(None, why not)``."""
    path = entry.get("path") if isinstance(entry, dict) else None
    if not isinstance(path, str) or not os.path.isabs(path) or "\0" in path:
        return None, "no file was recorded"
    seen = (entry.get("dev"), entry.get("ino"))
    try:
        st = os.lstat(path)
    except OSError as exc:
        return None, "%s: %s" % (path, "it is gone" if exc.errno == errno.ENOENT else (exc.strerror or exc))
    if stat.S_ISLNK(st.st_mode):
        return None, "%s is a symlink now" % path
    if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != seen:
        return None, _REPLACED % path
    # O_NONBLOCK: a FIFO put there meanwhile must not block the open; O_NOCTTY: nor a terminal become ours
    flags = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return None, "%s is a symlink now" % path
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return None, "%s: this user may not write it" % path
        return None, "%s: %s" % (path, exc.strerror or exc)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != seen:
        os.close(fd)
        return None, _REPLACED % path
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    return fd, None


def _same_file(a, b):
    return bool(a and b) and (a.get("dev"), a.get("ino")) == (b.get("dev"), b.get("ino"))


def _open_output(output, private):
    """Where the started server's output goes, opened: each stream to the server's own file where it was a
    regular file (``output``: the scan's ``{"stdout", "stderr"}``; appended to, ``_open_kept``), else to the log
    ``private`` (this user's private folder). stderr goes with stdout when it was the same file or no file. A
    file that fails a check is not written: its stream goes to ``private``, and ``notes`` says why. Returns
    ``{"fds": {path: fd}, "out": path, "err": path, "kept": [stream, ...], "notes": [...]}``; raises OSError when
    ``private`` is needed and cannot be opened."""
    output = output if isinstance(output, dict) else {}
    fds, kept, notes = {}, [], []

    def dest(name):
        entry = output.get(name)
        fd, why = _open_kept(entry)
        if fd is None:
            notes.append("%s: %s" % (name, why))
            return private
        path = entry["path"]
        if path in fds:
            os.close(fd)
        else:
            fds[path] = fd
        kept.append(name)
        return path

    try:
        out = dest("stdout") if output.get("stdout") else private
        if not output.get("stderr") or _same_file(output.get("stdout"), output.get("stderr")):
            err = out
            if output.get("stderr") and out != private:
                kept.append("stderr")  # the same file as stdout (2>&1): still both there
        else:
            err = dest("stderr")
        if private in (out, err):
            fds[private] = open_private(private, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    except OSError:
        for fd in fds.values():
            os.close(fd)
        raise
    return {"fds": fds, "out": out, "err": err, "kept": kept, "notes": notes}


def _close_prep(prep):
    for fd in prep["fds"].values():
        os.close(fd)


def _restore_signals(ignored):
    """A child's preexec: the dispositions the original server had (ignored, as under nohup, or default),
    whatever this helper ignores itself while it relaunches."""
    ignored = set(ignored or ())

    def apply():
        for name in KEPT_SIGNALS:
            if hasattr(signal, name):
                signal.signal(getattr(signal, name), signal.SIG_IGN if name in ignored else signal.SIG_DFL)

    return apply


def _spawn(payload, prep):
    """Start argv in cwd with exactly env, in a new session, stdin /dev/null, its output appended where
    ``_open_output`` opened it, after a marker line in each file (``shown_argv``: the command line as the client
    prints it, its secrets masked). ``log_path`` and ``offset``: where its stderr goes and where its output there
    begins (the log the readiness check and a failed start's tail read)."""
    argv, cwd, env = payload["argv"], payload["cwd"], payload["env"]
    fds, log_path = prep["fds"], prep["err"]
    out = {"log_path": log_path, "script": prep["script"], "output": {"stdout": prep["out"], "stderr": log_path},
           "kept": prep["kept"], "notes": prep["notes"]}
    shown = " ".join(shlex.quote(a) for a in payload.get("shown_argv") or argv)
    marker = ("\n=== eaglepatch %s: starting in %s: %s ===\n" % (time.strftime("%Y-%m-%d %H:%M:%S"), cwd, shown)
              ).encode("utf-8", "surrogateescape")
    try:
        for fd in fds.values():
            try:
                os.write(fd, marker)
            except OSError:
                pass  # a full disk: the server starts all the same, as it would have
        out["offset"] = os.lseek(fds[log_path], 0, os.SEEK_END)
        try:
            proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=fds[prep["out"]],
                stderr=subprocess.STDOUT if log_path == prep["out"] else fds[log_path],
                close_fds=True,
                start_new_session=True,
                preexec_fn=_restore_signals(payload.get("sig_ign")),
            )
        except OSError as exc:
            what = "%s: %s" % (argv[0], exc.strerror or str(exc))
            try:
                os.write(fds[log_path], ("eaglepatch: could not start: %s\n" % what).encode("utf-8", "surrogateescape"))
            except OSError:
                pass
            out["error"] = "could not start the server: %s" % what
            return out
    finally:
        _close_prep(prep)
    st = proc_stat(proc.pid)
    out.update(pid=proc.pid, start=st["start"] if st else None)
    return out


def op_start(payload):
    """Start argv in cwd with exactly env (and the original's signal dispositions), in a new session, stdin
    /dev/null, output appended to the server's own files (``output``) or the log: ``_prepare_start``, then
    ``_spawn``.

    The new session (setsid) and the redirected descriptors let it outlive this program and the SSH session that
    ran it: nothing ties it to the connection's terminal or pipes. Returns its pid, start time, the log (its path:
    the one asked for, this user's private one, or the server's own file its stderr went to) and the offset where
    its output begins, where each stream went (``output``, ``kept``: those appended to the server's own files;
    ``notes``: why one was not), and the start script.
    """
    prep = _prepare_start(payload)
    if "error" in prep:
        return {"error": "nothing was started: " + prep["error"]}
    return _spawn(payload, prep)


def _other_launchers(port, keep):
    """Launchers of a server on ``port`` (by their command line) other than ``keep``: one still loading has not
    bound its port yet, so the port alone does not show it."""
    procs = table()
    return [p for p, (argv, idx) in sorted(top_launchers(procs).items())
            if p != keep and parse_server_args(argv[idx:])["port"] == port]


def op_relaunch(payload):
    """Stop a server (``stop``: op_stop's payload, or None) and start one (``start``: op_start's payload) in one
    request, so that nothing between the two depends on the client: a client killed or cut off meanwhile leaves
    the host with the new server starting, never with none. Whatever can make the start fail is checked before
    the stop (``_prepare_start``): then nothing is stopped. Nothing starts while another launcher for the port
    runs (loading, or listening) besides the one stopped, or (``check_port``) something else listens there. A
    list ``batch`` of such requests runs one after the other (answers in order). Relaunches of one port run one
    at a time (``lock.relaunch_lock``: a relaunch that waited ``lock_wait`` s for another refuses, nothing done).

    SIGINT, SIGHUP and SIGTERM are ignored meanwhile (the new server gets the original's dispositions back): a
    Ctrl-C in the client's terminal or a hang-up must not stop the host halfway.
    """
    if "batch" in payload:
        return {"batch": [op_relaunch(p) for p in payload["batch"]]}
    saved = [(sig, signal.signal(sig, signal.SIG_IGN)) for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM)]
    try:
        start, stop = payload["start"], payload.get("stop")
        # the port's lock first (before anything is read or written), so that a scan that settles after this
        # request was sent waits for it
        lock = relaunch_lock(log_path_of(start), payload["port"], payload.get("lock_wait", 150.0))
        if lock is None:
            return {"start": {"error": "nothing was stopped or started: another relaunch on :%s did not finish"
                                       % payload["port"]}, "not_stopped": True}
        try:
            prep = _prepare_start(start)
            if "error" in prep:
                return {"start": {"error": "nothing was stopped or started: " + prep["error"]}, "not_stopped": True}
            return _relaunch_locked(payload, start, stop, prep)
        finally:
            if lock >= 0:
                os.close(lock)
    finally:
        for sig, old in saved:
            signal.signal(sig, old)


def _relaunch_locked(payload, start, stop, prep):
    """``op_relaunch`` once it holds the port's lock."""
    others = _other_launchers(payload["port"], stop["pid"] if stop else None)
    if others:
        _close_prep(prep)
        return {"busy": True, "busy_pids": others, "not_stopped": True}
    out = {}
    if stop:
        out["stop"] = op_stop(stop)
        res = out["stop"]
        if res.get("remaining") or not res.get("port_free", True):
            _close_prep(prep)
            return out  # not stopped: starting another beside it would make two
    if payload.get("check_port") and listening(payload["port"]):
        _close_prep(prep)
        out["busy"] = True
        return out
    out["start"] = _spawn(start, prep)
    return out
