"""Carrying out a plan on the host (the ``execute`` op): check that nothing changed since it was read, stage temp
files and compile them with this (the server's) interpreter, back up the originals and write the manifest, swap
in; all or nothing (any failure undoes the run). With ``then``, the servers are relaunched in the same request.

``_execute`` is a short sequence of named steps (``exec_*``) sharing one ``ExecRun``, each tested on its own in
tests/unit/test_host_steps.py; the failpoints ``execute:after-upload``, ``execute:after-backup`` and
``execute:between-renames`` fire between them.
"""

from __future__ import annotations

import json
import os
import signal
import sys

from eaglepatch.hostside.control import op_relaunch
from eaglepatch.hostside.files import (
    STALE_TMP,
    read_file,
    real_file,
    replace_file,
    sha256_of,
    tmp_name,
    unb64,
    write_new,
)
from eaglepatch.hostside.lock import lock_info, op_unlock


def _drop_bytecode(path):
    d, name = os.path.split(path)
    stem = name[:-3] if name.endswith(".py") else name
    cache = os.path.join(d, "__pycache__")
    removed = []
    if os.path.isdir(cache):
        for n in os.listdir(cache):
            if n.startswith(stem + ".") and n.endswith((".pyc", ".pyo")):
                try:
                    os.remove(os.path.join(cache, n))
                    removed.append(n)
                except OSError:
                    pass
    return removed


def _fault(payload, point):
    """Test hook (``eaglepatch.failpoints``): die right here, as a killed helper would leave things."""
    if payload.get("fault") == point:
        os._exit(99)


def _drop_stale_temps(dirs):
    """Temp files that an earlier run left when it was cut off between writing and renaming them. Called with
    the lock held, so no other run's temp files are in flight."""
    removed = []
    for d in sorted(set(dirs)):
        try:
            names = os.listdir(d)
        except OSError:
            continue
        for n in names:
            if STALE_TMP.match(n):
                try:
                    os.remove(os.path.join(d, n))
                    removed.append(os.path.join(d, n))
                except OSError:
                    pass
    return removed


def op_execute(payload):
    """``_execute``, then release the lock when asked (apply without a restart ends here: one round trip less).

    With ``then`` (``op_relaunch``'s payload), the servers are stopped and started right after a successful
    execution, in the same request: a rollback puts the original files back and starts the original server with
    nothing in between that depends on the client. SIGINT and SIGHUP are ignored until it is done.
    """
    saved = [(sig, signal.signal(sig, signal.SIG_IGN)) for sig in (signal.SIGINT, signal.SIGHUP)]
    try:
        out = _execute(payload)
        if out.get("ok") and payload.get("then"):
            out["then"] = op_relaunch(payload["then"])
        return out
    finally:
        if payload.get("release"):
            op_unlock({"lock_path": payload["lock_path"], "token": payload["token"]})
        for sig, old in saved:
            signal.signal(sig, old)


class ExecRun:
    """One execution of a plan, as far as it got: ``prev`` (path -> (bytes or None, stat or None): what each path
    held before this run changed it), ``temps`` (temp files made, removed at the end whatever happens),
    ``touched`` (paths changed so far, in order: undone in reverse), ``made_dirs`` (folders created)."""

    def __init__(self, token):
        self.token = token
        self.prev = {}
        self.temps = []
        self.touched = []
        self.made_dirs = []


def exec_check_lock(payload):
    """None when the install's lock still holds this run's token; else the conflict answer (the lock expired and
    another run took it over: it may be changing the same files)."""
    token = payload["token"]
    held = lock_info(payload["lock_path"]) or {}
    if held.get("token") != token:
        return {"ok": False, "kind": "conflict", "error": "lost the lock %s" % payload["lock_path"]}
    return None


def exec_dirs(payload):
    """The folders a plan writes in (the lock's, each write's, each backup's, the manifest's): where a run that
    was killed may have left temp files."""
    man = payload.get("manifest") or {}
    dirs = [os.path.dirname(payload["lock_path"])] + [os.path.dirname(w["path"]) for w in payload["writes"]]
    dirs += [os.path.dirname(real_file(w["path"])) for w in payload["writes"]]  # a symlink's temp is beside its target
    dirs += [os.path.dirname(w["backup"]) for w in payload["writes"] if w.get("backup")]
    if man.get("path"):
        dirs.append(os.path.dirname(man["path"]))
    return dirs


def exec_remember(run, path):
    """Keep what ``path`` holds now (its bytes and stat; (None, None): nothing), once, to put it back on failure."""
    if path not in run.prev:
        try:
            run.prev[path] = (read_file(path), os.stat(path))
        except FileNotFoundError:
            run.prev[path] = (None, None)


def exec_check_unchanged(run, writes):
    """Step 1: nothing changed since it was read. None when every path holds what the plan was made from
    (``expect_sha256``; None: no file there), keeping what each holds in ``run.prev``; else the answer that
    refuses the plan (a conflict, or the error reading a path), with nothing written."""
    for w in writes:
        try:
            cur = read_file(w["path"])
        except FileNotFoundError:
            cur = None
        except OSError as exc:
            return {"ok": False, "kind": "io", "path": w["path"], "error": exc.strerror}
        run.prev[w["path"]] = (cur, os.stat(w["path"]) if cur is not None else None)
        cur = sha256_of(cur) if cur is not None else None
        if cur != w["expect_sha256"]:
            return {"ok": False, "kind": "conflict", "path": w["path"],
                    "error": "changed since it was read (expected %s, found %s)" % (
                        (w["expect_sha256"] or "no file")[:12], (cur or "no file")[:12])}
    return None


def exec_cleanup(run):
    """Remove the temp files this run made (those already renamed into place are gone: nothing to do)."""
    for t in run.temps:
        try:
            os.remove(t)
        except OSError:
            pass


def exec_undo(run):
    """Put back every path this run touched as it was (bytes, mode, owner; a path that held nothing is removed),
    newest first, then remove the folders it made and its temp files. Returns the paths that could not be put
    back."""
    failed = []
    for path in reversed(run.touched):
        data, st = run.prev[path]
        try:
            if data is None:
                if os.path.lexists(path):
                    os.remove(path)
            else:
                rtmp = tmp_name(path, run.token + "r")
                run.temps.append(rtmp)
                write_new(rtmp, data, st)
                replace_file(rtmp, path)
        except OSError:
            failed.append(path)
    for d in reversed(run.made_dirs):
        try:
            os.rmdir(d)
        except OSError:
            pass
    exec_cleanup(run)
    return failed


def exec_fail(run, exc, path=None):
    """Undo the run and answer the I/O error ``exc`` (at ``path``), naming what could not be put back."""
    unrestored = exec_undo(run)
    out = {"ok": False, "kind": "io", "path": path,
           "error": "%s%s" % ("" if path else (getattr(exc, "filename", None) or "") + ": ",
                              exc.strerror or exc)}
    if unrestored:
        out["unrestored"] = unrestored
    return out


def exec_makedirs(run, d):
    """Create ``d`` and its missing parents (0700), remembering them so that undoing the run removes them."""
    missing = []
    while d and not os.path.isdir(d):
        missing.append(d)
        d = os.path.dirname(d)
    for m in reversed(missing):
        os.mkdir(m, 0o700)
        run.made_dirs.append(m)


def exec_stage(run, writes):
    """Step 2: a temp file beside each destination, fsync'd, with the mode and owner of the file it replaces, and
    compiled with this (the server's) interpreter when the write asks. Returns (staged, None): staged is (write,
    temp path or None for a removal), in plan order; or (None, answer) when a file does not compile (its temp
    files removed, nothing else touched). An OSError propagates (the caller undoes)."""
    staged = []
    for w in writes:
        if w.get("data") is None:
            staged.append((w, None))
            continue
        data = unb64(w["data"])
        tmp = tmp_name(w["path"], run.token)
        like = run.prev[w["path"]][1]
        run.temps.append(tmp)
        write_new(tmp, data, like, mode=w.get("mode", 0o644))
        if w.get("compile"):
            try:
                compile(data, w["path"], "exec", dont_inherit=True)
            except SyntaxError as exc:
                exec_cleanup(run)
                return None, {"ok": False, "kind": "compile", "path": w["path"],
                              "error": "%s (line %s)" % (exc.msg, exc.lineno), "python": sys.executable}
        staged.append((w, tmp))
    return staged, None


def exec_back_up(run, writes):
    """Step 3: the original of each write that names a backup, copied there (mode and owner kept) before anything
    is replaced; a backup that already holds those bytes is left alone (apply run again after a crash). An
    OSError propagates (the caller undoes)."""
    for w in writes:
        b = w.get("backup")
        if b and w["expect_sha256"] is not None:
            exec_makedirs(run, os.path.dirname(b))
            try:
                same = sha256_of(read_file(b)) == w["expect_sha256"]
            except OSError:
                same = False
            if not same:
                exec_remember(run, b)
                btmp = tmp_name(b, run.token)
                run.temps.append(btmp)
                write_new(btmp, run.prev[w["path"]][0], run.prev[w["path"]][1])
                replace_file(btmp, b)
                run.touched.append(b)


def exec_write_manifest(run, man):
    """Step 3 (after the backups, before any replacement): the manifest the plan leaves, when it leaves one
    (``man["data"]`` None: it is removed last, by ``exec_remove_manifest``), 0600, sorted keys. An OSError
    propagates (the caller undoes)."""
    if man.get("data") is not None:
        exec_makedirs(run, os.path.dirname(man["path"]))
        exec_remember(run, man["path"])
        mtmp = tmp_name(man["path"], run.token)
        run.temps.append(mtmp)
        write_new(mtmp, json.dumps(man["data"], indent=1, sort_keys=True).encode(), None, 0o600)
        replace_file(mtmp, man["path"])
        run.touched.append(man["path"])


def exec_swap_in(run, staged, payload):
    """Step 4: rename each temp file over its destination, or remove the path the plan removes, in plan order
    (the failpoint ``execute:between-renames`` fires before the second). None when all went; else the run is
    undone and the answer names the path that failed."""
    for n, (w, tmp) in enumerate(staged):
        if n == 1:
            _fault(payload, "execute:between-renames")
        try:
            if tmp is None:
                if os.path.lexists(w["path"]):
                    os.remove(w["path"])
            else:
                replace_file(tmp, w["path"])
        except OSError as exc:  # a failed rename or remove leaves its path as it was
            return exec_fail(run, exc, w["path"])
        run.touched.append(w["path"])
    return None


def exec_remove_manifest(run, man):
    """Step 4, last: the manifest removed when the plan leaves none (revert), and its folder when that is then
    empty (a kept copy of a drifted file stays, and so does the folder). None, or the failure's answer (the run
    undone)."""
    if man.get("path") and man.get("data") is None and os.path.exists(man["path"]):
        exec_remember(run, man["path"])
        try:
            os.remove(man["path"])
        except OSError as exc:
            return exec_fail(run, exc, man["path"])
        run.touched.append(man["path"])
        try:
            os.rmdir(os.path.dirname(man["path"]))  # only when empty: a kept drifted copy stays
        except OSError:
            pass
    return None


def exec_drop_bytecode(writes):
    """The cached bytecode of every Python file written or removed, deleted (an old .pyc must not outlive its
    source); the names removed."""
    removed = []
    for w in writes:
        if w["path"].endswith(".py"):
            removed += _drop_bytecode(w["path"])
    return removed


def _execute(payload):
    """Carry out a plan: check, write temps, compile, back up, swap in. All or nothing: when a step fails,
    every file this run replaced, created or removed (worker files, runtime, backups, manifest) is put back.

    payload: token, writes [{path, expect_sha256 (null: must not exist), data | null (= remove), backup?,
    compile: bool}], manifest {path, data | null}.
    """
    refused = exec_check_lock(payload)
    if refused is not None:
        return refused
    writes = payload["writes"]
    man = payload.get("manifest") or {}
    stale = _drop_stale_temps(exec_dirs(payload))
    run = ExecRun(payload["token"])
    # 1. Nothing changed since it was read; keep what each path holds now, to put it back on failure.
    refused = exec_check_unchanged(run, writes)
    if refused is not None:
        return refused
    try:
        # 2. Temp files beside their destinations, validated with this (the server's) interpreter.
        staged, refused = exec_stage(run, writes)
        if refused is not None:
            return refused
        _fault(payload, "execute:after-upload")
        # 3. Backups of the originals, then the manifest: before anything is replaced.
        exec_back_up(run, writes)
        if not man.get("last"):
            exec_write_manifest(run, man)
        _fault(payload, "execute:after-backup")
    except OSError as exc:
        return exec_fail(run, exc)
    # 4. Swap in (and remove what the plan removes, the manifest last; or write it last: ``last``, a record of what
    # runs that must not stand beside the files it does not describe). A failure puts everything back.
    failed = exec_swap_in(run, staged, payload)
    if failed is None and man.get("last"):
        try:
            exec_write_manifest(run, man)
        except OSError as exc:
            return exec_fail(run, exc, man["path"])
    if failed is None:
        failed = exec_remove_manifest(run, man)
    if failed is not None:
        return failed
    exec_cleanup(run)
    return {"ok": True, "bytecode_removed": exec_drop_bytecode(writes), "stale_temps_removed": stale}
