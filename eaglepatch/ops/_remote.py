"""The programs that run ON the target for show/diff/apply/revert/status: read facts, lock, carry out a plan.

Shipped as source to the host's interpreter by ``eaglepatch.hosts.base.run_python`` together with
``eaglepatch/server/_remote.py`` (whose ``op_scan`` finds the running server), one round trip per call, with
``PAYLOAD = {"op": ...}``; prints one JSON document. Standard library only, Python 3.8+, never imports sglang.
"""

import base64
import errno
import hashlib
import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time

BACKUP_DIRNAME = ".eaglepatch"
LOCK_NAME = ".eaglepatch.lock"
RUNTIME_NAME = "_eaglepatch_runtime.py"
TMP_TAG = ".eaglepatch-tmp-"


def _sha(data):
    return hashlib.sha256(data).hexdigest()


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def _b64(data):
    return base64.b64encode(data).decode("ascii")


def _unb64(text):
    return base64.b64decode(text.encode("ascii"))


# ---------------------------------------------------------------------------------------------------------------
# facts


def _package_of_python(python):
    """The sglang package that ``python`` (run plainly, with this environment) imports, or "" when it has none;
    None when it cannot run at all."""
    answer = _query_wait(_query_start(python, [], "", None, None), time.time() + 60)  # noqa: F821 (server/_remote.py)
    if answer is None:
        return None
    return package_of(answer, None) or ""  # noqa: F821


def _package_from_hint(hint):
    """--sglang-path: the package dir, a dir above it, a checkout root (python/sglang), or a worker file."""
    hint = os.path.abspath(os.path.expanduser(hint))
    if os.path.isfile(hint):
        d = os.path.dirname(hint)
        while d != os.path.dirname(d):
            if os.path.basename(d) == "sglang" and os.path.isfile(os.path.join(d, "__init__.py")):
                return os.path.realpath(d)
            d = os.path.dirname(d)
        return None
    if os.path.basename(hint) == "sglang" and os.path.isfile(os.path.join(hint, "__init__.py")):
        return os.path.realpath(hint)
    for sub in ("sglang", "python/sglang"):
        cand = os.path.join(hint, sub)
        if os.path.isfile(os.path.join(cand, "__init__.py")):
            return os.path.realpath(cand)
    # a venv or prefix: lib/python3.X/site-packages/sglang
    for root in ("lib", "lib64"):
        base = os.path.join(hint, root)
        if os.path.isdir(base):
            for name in sorted(os.listdir(base)):
                cand = os.path.join(base, name, "site-packages", "sglang")
                if os.path.isfile(os.path.join(cand, "__init__.py")):
                    return os.path.realpath(cand)
    return None


def _version(pkg):
    """The installed version, read without importing sglang: _version.py (setuptools-scm), the dist-info
    METADATA beside the package, or a literal in version.py / __init__.py."""
    try:
        text = _read(os.path.join(pkg, "_version.py")).decode("utf-8", "replace")
        m = re.search(r"""(?:__version__|version)\s*=\s*(?:version\s*=\s*)?["']([^"']+)["']""", text)
        if m:
            return m.group(1)
    except OSError:
        pass
    parent = os.path.dirname(pkg)
    try:
        for name in sorted(os.listdir(parent)):
            if name.startswith("sglang-") and name.endswith(".dist-info"):
                for line in _read(os.path.join(parent, name, "METADATA")).decode("utf-8", "replace").splitlines():
                    if line.startswith("Version:"):
                        return line.split(":", 1)[1].strip()
    except OSError:
        pass
    for name in ("version.py", "__init__.py"):
        try:
            text = _read(os.path.join(pkg, name)).decode("utf-8", "replace")
        except OSError:
            continue
        m = re.search(r"""^__version__\s*=\s*["']([^"']+)["']""", text, re.M)
        if m:
            return m.group(1)
    return None


def _port_of(srv):
    return parse_server_args(srv["argv"][srv["args_index"]:])["port"]  # noqa: F821 (server/_remote.py)


def _user_name(uid):
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return str(uid)


def _lock_info(path):
    try:
        return json.loads(_read(path).decode())
    except (OSError, ValueError):
        return None


# The steps of op_facts, each a function of its own (tests/unit/test_host_steps.py runs them on a temp folder).

ENTRY_PATTERN = r"def (forward_batch_generation|forward_batch_speculative_generation)\b"


def facts_scan_servers():
    """Every sglang server on this host, each with the package its own interpreter imports (``op_scan`` of
    server/_remote.py). Returns (servers, error): a /proc that cannot be read is not fatal for patching, so its
    error comes back as a string (the answer's ``scan_error``) with no servers."""
    try:
        # every server with the sglang package its own interpreter imports, as it was launched
        return op_scan({"identify": True})["servers"], None  # noqa: F821 (from eaglepatch/server/_remote.py)
    except Exception as exc:  # a /proc we cannot read is not fatal for patching
        return [], str(exc)


def facts_find_package(payload, servers):
    """The sglang package to act on. Returns (package, stop): ``stop`` (a dict to answer as it is, with nothing
    read) is ``{"error"}`` when ``--sglang-path`` names no package or ``--python`` cannot run, or
    ``{"ambiguous"}`` when servers of several installs run and nothing named one (guessing could stop the wrong
    server). Otherwise the package is ``--sglang-path``'s, ``--python``'s, the one the running servers import, or
    this interpreter's; "" or None when there is none."""
    if payload.get("sglang_path"):
        pkg = _package_from_hint(payload["sglang_path"])
        if pkg is None:
            return None, {"error": "no sglang package at %s" % payload["sglang_path"]}
        return pkg, None
    if payload.get("python"):
        pkg = _package_of_python(payload["python"])
        if pkg is None:
            return None, {"error": "cannot run %s on the host" % payload["python"]}
        return pkg, None
    serving = sorted({srv["package_dir"] for srv in servers if srv.get("package_dir")})
    if len(serving) > 1:
        # several installs serve here: guessing one could stop the wrong server
        return None, {"ambiguous": [{"package_dir": p, "servers": [{"pid": srv["pid"], "port": _port_of(srv)}
                                                                   for srv in servers if srv.get("package_dir") == p]}
                                    for p in serving]}
    return (serving[0] if serving else _package_of_python(sys.executable)), None


def facts_servers_of(servers, pkg):
    """(mine, others): only a server that runs this very package is ours to report and restart; the others are
    listed by pid, port and package."""
    mine = [srv for srv in servers if pkg and srv.get("package_dir") == pkg]
    others = [{"pid": srv["pid"], "port": _port_of(srv), "package_dir": srv.get("package_dir")}
              for srv in servers if srv not in mine]
    return mine, others


def facts_take_lock(spec, lock):
    """apply and revert take the install's lock in the facts request, before the files are read (a round trip
    saved): ``op_lock``'s answer, or None when no lock was asked for or there is no speculative folder."""
    if not lock or not os.path.isdir(spec):
        return None
    return op_lock({"lock_path": os.path.join(spec, LOCK_NAME), "owner": lock["owner"],
                    "ttl": lock.get("ttl", 7200), "dead_pids": []})


def facts_worker_files(pkg, spec, pattern):
    """The worker files under ``spec``: each ``*.py`` whose text matches ``pattern`` (an entry method or a class),
    in sorted order, folders too; never the runtime module, a temp file, ``__pycache__`` or the backups. Each
    with its bytes (base64), sha256, mode, owner and mtime; ``path`` relative to the package's parent
    (sglang/srt/...). A file that cannot be read is left out."""
    files = []
    entry_re = re.compile(pattern)
    if not os.path.isdir(spec):
        return files
    for root, dirs, names in os.walk(spec):
        dirs[:] = sorted(d for d in dirs if d not in ("__pycache__", BACKUP_DIRNAME))
        for name in sorted(names):
            if not name.endswith(".py") or name == RUNTIME_NAME or TMP_TAG in name:
                continue
            path = os.path.join(root, name)
            try:
                data = _read(path)
            except OSError:
                continue
            if not entry_re.search(data.decode("utf-8", "replace")):
                continue
            st = os.stat(path)
            files.append(
                {
                    "path": os.path.relpath(path, os.path.dirname(pkg)),
                    "abs": path,
                    "data": _b64(data),
                    "sha256": _sha(data),
                    "mode": st.st_mode,
                    "uid": st.st_uid,
                    "gid": st.st_gid,
                    "mtime": st.st_mtime,
                }
            )
    return files


def facts_stale_temps(spec):
    """The temp files of an apply or revert that was killed between writing and renaming them (``.NAME`` +
    TMP_TAG + token), anywhere under the speculative folder and its backups: status names them; the next apply or
    revert removes them."""
    found = []
    if not os.path.isdir(spec):
        return found
    for root, dirs, names in os.walk(spec):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        found += [os.path.join(root, n) for n in sorted(names) if _STALE_TMP.match(n)]
    return found


def facts_manifest(manifest_path):
    """The manifest ``apply`` left, or None when there is none (or it cannot be read or parsed)."""
    try:
        return json.loads(_read(manifest_path).decode())
    except (OSError, ValueError):
        return None


def facts_backups(manifest):
    """backup path -> sha256 of its bytes (None: missing or unreadable), for every file the manifest names."""
    backups = {}
    if manifest:
        for f in manifest.get("files", []):
            b = f.get("backup")
            try:
                backups[b] = _sha(_read(b))
            except (OSError, TypeError):
                backups[b] = None
    return backups


def facts_runtime(runtime_path):
    """What is at the runtime module's path: ``runtime_sha256`` (None: no file), its bytes (``runtime_data``,
    base64: for the diff of a config change, --mode or --every) and ``runtime_mtime``."""
    out = {}
    try:
        data = _read(runtime_path)
        out["runtime_sha256"] = _sha(data)
        out["runtime_data"] = _b64(data)  # for the diff of a config change (--mode, --every)
        out["runtime_mtime"] = os.stat(runtime_path).st_mtime
    except OSError:
        out["runtime_sha256"] = None
    return out


def facts_writable(spec):
    """Whether this user may write the speculative folder (``writable``), and who owns it (``owner``: for the
    message that says whom to run as)."""
    out = {"writable": os.access(spec, os.W_OK) if os.path.isdir(spec) else False}
    try:
        out["owner"] = _user_name(os.stat(spec).st_uid)
    except OSError:
        out["owner"] = None
    return out


def op_facts(payload):
    """Everything eaglepatch needs to decide: server, interpreter, package, worker files, manifest, lock."""
    out = {"hostname": socket.gethostname(), "self_python": sys.executable, "servers": [],
           "user": _user_name(os.geteuid()), "euid": os.geteuid()}
    servers, scan_error = facts_scan_servers()
    if scan_error is not None:
        out["scan_error"] = scan_error
    pkg, stop = facts_find_package(payload, servers)
    if stop is not None:
        out.update(stop)
        return out
    mine, others = facts_servers_of(servers, pkg)
    out["servers"] = mine
    out["other_servers"] = others
    out["python"] = payload.get("python") or (mine[0].get("interpreter") if mine else None) or sys.executable
    out["package_dir"] = pkg or None
    if not pkg:
        return out
    out["version"] = _version(pkg)
    spec = os.path.join(pkg, "srt", "speculative")
    out["spec_dir"] = spec
    taken = facts_take_lock(spec, payload.get("lock"))
    if taken is not None:
        out["lock_result"] = taken
    out["files"] = facts_worker_files(pkg, spec, payload.get("pattern", ENTRY_PATTERN))
    backup_dir = os.path.join(spec, BACKUP_DIRNAME)
    manifest_path = os.path.join(backup_dir, "manifest.json")
    out["backup_dir"] = backup_dir
    out["manifest_path"] = manifest_path
    out["manifest"] = facts_manifest(manifest_path)
    out["backups"] = facts_backups(out["manifest"])
    runtime = os.path.join(spec, RUNTIME_NAME)
    out.update(facts_runtime(runtime))
    out["runtime_path"] = runtime
    out["lock_path"] = os.path.join(spec, LOCK_NAME)
    out["lock"] = _lock_info(out["lock_path"])
    out["stale_temps"] = facts_stale_temps(spec)
    out.update(facts_writable(spec))
    return out


# ---------------------------------------------------------------------------------------------------------------
# lock


def op_lock(payload):
    """Take the install's lock (O_EXCL); a stale lock (its client is gone, or too old) is taken over."""
    path = payload["lock_path"]
    me = payload["owner"]
    for _ in range(2):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            held = _lock_info(path)
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
    return {"ok": False, "held": _lock_info(path) or {}, "path": path}


def op_unlock(payload):
    held = _lock_info(payload["lock_path"]) or {}
    if held.get("token") == payload["token"]:
        try:
            os.remove(payload["lock_path"])
        except OSError:
            pass
    return {"ok": True}


# ---------------------------------------------------------------------------------------------------------------
# carrying out a plan


def _real(path):
    """Where the bytes of ``path`` live: a symlink's target (its links resolved), else the path itself. A worker
    file that is a symlink is patched through it: the link stays a link (docs/safety.md)."""
    return os.path.realpath(path) if os.path.islink(path) else path


def _tmp_name(path, token):
    """The temp file for ``path``: beside the file its bytes go to (a symlink's target), so that the rename stays
    on one file system."""
    d, name = os.path.split(_real(path))
    return os.path.join(d, "." + name + TMP_TAG + token)


def _write_new(path, data, like_stat=None, mode=0o644):
    """Write ``data`` to ``path`` (a new temp file), fsync'd, with the mode and owner of ``like_stat``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    if like_stat is not None:
        os.chmod(path, like_stat.st_mode & 0o7777)
        try:
            os.chown(path, like_stat.st_uid, like_stat.st_gid)
        except OSError:
            pass  # not root: the file is ours, as the original was writable by us
    else:
        os.chmod(path, mode)


def _replace(src_tmp, dst):
    """Put the bytes of the temp file ``src_tmp`` at ``dst``, keeping what ``dst`` is: a rename over it (atomic);
    through a symlink, a rename over its target (the link untouched); into a file with other hard links, a write
    into its own inode (every name keeps seeing the same file), after which the temp file goes."""
    real = _real(dst)
    try:
        st = os.lstat(real)
    except FileNotFoundError:
        st = None
    if st is not None and stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
        _write_into(real, _read(src_tmp))
        os.remove(src_tmp)
        return
    os.replace(src_tmp, real)


def _write_into(path, data):
    """Overwrite the regular file ``path`` in place with ``data`` (one write from its start, then cut to length,
    then fsync): its inode, links, mode and owner stay. Not atomic as a rename is (see docs/safety.md)."""
    fd = os.open(path, os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        done = 0
        view = memoryview(data)
        while done < len(data):
            done += os.pwrite(fd, view[done:], done)
        os.ftruncate(fd, len(data))
        os.fsync(fd)
    finally:
        os.close(fd)


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


_STALE_TMP = re.compile(r"^\..+" + re.escape(TMP_TAG) + r"[0-9a-f]+r?$")


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
            if _STALE_TMP.match(n):
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
            out["then"] = op_relaunch(payload["then"])  # noqa: F821 (server/_remote.py)
        return out
    finally:
        if payload.get("release"):
            op_unlock({"lock_path": payload["lock_path"], "token": payload["token"]})
        for sig, old in saved:
            signal.signal(sig, old)


# The steps of _execute, each a function of its own (tests/unit/test_host_steps.py runs them on a temp folder).
# They share an ``ExecRun``: what the run has done so far, so that any later step can undo all of it.


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
    held = _lock_info(payload["lock_path"]) or {}
    if held.get("token") != token:
        return {"ok": False, "kind": "conflict", "error": "lost the lock %s" % payload["lock_path"]}
    return None


def exec_dirs(payload):
    """The folders a plan writes in (the lock's, each write's, each backup's, the manifest's): where a run that
    was killed may have left temp files."""
    man = payload.get("manifest") or {}
    dirs = [os.path.dirname(payload["lock_path"])] + [os.path.dirname(w["path"]) for w in payload["writes"]]
    dirs += [os.path.dirname(_real(w["path"])) for w in payload["writes"]]  # a symlink's temp is beside its target
    dirs += [os.path.dirname(w["backup"]) for w in payload["writes"] if w.get("backup")]
    if man.get("path"):
        dirs.append(os.path.dirname(man["path"]))
    return dirs


def exec_remember(run, path):
    """Keep what ``path`` holds now (its bytes and stat; (None, None): nothing), once, to put it back on failure."""
    if path not in run.prev:
        try:
            run.prev[path] = (_read(path), os.stat(path))
        except FileNotFoundError:
            run.prev[path] = (None, None)


def exec_check_unchanged(run, writes):
    """Step 1: nothing changed since it was read. None when every path holds what the plan was made from
    (``expect_sha256``; None: no file there), keeping what each holds in ``run.prev``; else the answer that
    refuses the plan (a conflict, or the error reading a path), with nothing written."""
    for w in writes:
        try:
            cur = _read(w["path"])
        except FileNotFoundError:
            cur = None
        except OSError as exc:
            return {"ok": False, "kind": "io", "path": w["path"], "error": exc.strerror}
        run.prev[w["path"]] = (cur, os.stat(w["path"]) if cur is not None else None)
        cur = _sha(cur) if cur is not None else None
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
                rtmp = _tmp_name(path, run.token + "r")
                run.temps.append(rtmp)
                _write_new(rtmp, data, st)
                _replace(rtmp, path)
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
        data = _unb64(w["data"])
        tmp = _tmp_name(w["path"], run.token)
        like = run.prev[w["path"]][1]
        run.temps.append(tmp)
        _write_new(tmp, data, like, mode=w.get("mode", 0o644))
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
                same = _sha(_read(b)) == w["expect_sha256"]
            except OSError:
                same = False
            if not same:
                exec_remember(run, b)
                btmp = _tmp_name(b, run.token)
                run.temps.append(btmp)
                _write_new(btmp, run.prev[w["path"]][0], run.prev[w["path"]][1])
                _replace(btmp, b)
                run.touched.append(b)


def exec_write_manifest(run, man):
    """Step 3 (after the backups, before any replacement): the manifest the plan leaves, when it leaves one
    (``man["data"]`` None: it is removed last, by ``exec_remove_manifest``), 0600, sorted keys. An OSError
    propagates (the caller undoes)."""
    if man.get("data") is not None:
        exec_makedirs(run, os.path.dirname(man["path"]))
        exec_remember(run, man["path"])
        mtmp = _tmp_name(man["path"], run.token)
        run.temps.append(mtmp)
        _write_new(mtmp, json.dumps(man["data"], indent=1, sort_keys=True).encode(), None, 0o600)
        _replace(mtmp, man["path"])
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
                _replace(tmp, w["path"])
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
        exec_write_manifest(run, man)
        _fault(payload, "execute:after-backup")
    except OSError as exc:
        return exec_fail(run, exc)
    # 4. Swap in (and remove what the plan removes, the manifest last). A failure puts everything back.
    failed = exec_swap_in(run, staged, payload)
    if failed is None:
        failed = exec_remove_manifest(run, man)
    if failed is not None:
        return failed
    exec_cleanup(run)
    return {"ok": True, "bytecode_removed": exec_drop_bytecode(writes), "stale_temps_removed": stale}


# ---------------------------------------------------------------------------------------------------------------
# timing logs: read with the runtime's own rules, wherever the runtime really wrote them

# A timing log's name, as the runtime makes it: <host>-<pid>-rank<r>.jsonl
LOG_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*-[0-9]+-rank[0-9]+[.]jsonl$")
# The private folders the runtime falls back to (tempfile.mkdtemp(prefix="eaglepatch-")) in a temp folder
_FALLBACK_NAME = re.compile(r"^eaglepatch-[A-Za-z0-9_]+$")
# Bytes of log data in one answer at most; the client asks again for the rest (its memory stays bounded).
LOG_BATCH = 4 << 20  # a few MB: the memory of a fetch on either side is some 8x one batch (base64, JSON, zlib)


class _Refused(Exception):
    """A log folder or file that the runtime's rules do not let eaglepatch read; str() says why."""


def _owner_name(uid):
    name = _user_name(uid)
    return "uid %d" % uid if name == str(uid) else "uid %d (%s)" % (uid, name)


def _log_owners(pids):
    """Who may own a log folder eaglepatch reads: this user, and the (effective) user of each server process
    (the runtime writes only to a folder of its own user's)."""
    owners = {os.geteuid()}
    for pid in pids:
        ids = _ids(pid)  # noqa: F821 (server/_remote.py)
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
        raw = _proc_bytes("/proc/%d/environ" % pid)  # noqa: F821 (server/_remote.py)
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


def op_logs(payload):
    """New bytes of the timing logs, read by the runtime's own rules (real folders and regular files of this user
    or the servers' users, no links followed, nothing others may write), from every folder the runtime writes to:
    the configured one (``log_dir``), the folders that the servers' processes (``pids``) have a log open in, and
    the private folders the runtime falls back to (``eaglepatch-*`` in the temp folder). For each file, what
    follows the size the client already has (``have``: "folder/name" -> size), whole lines only, at most
    LOG_BATCH bytes in all (``more``: ask again). A folder other than ``log_dir`` is read only when its logs start
    with the runtime's header saying it fell back from ``log_dir`` (``fallback_from``). ``dirs`` lists each folder
    read, and each refused with why."""
    pids = [int(p) for p in payload.get("pids") or ()]
    have = payload.get("have") or {}
    owners = _log_owners(pids)
    budget = int(payload.get("budget") or LOG_BATCH)
    log_dir = os.path.normpath(payload["log_dir"])
    candidates = [(log_dir, "configured")]
    candidates += [(d, "open") for d in _dirs_in_use(pids)]
    candidates += [(d, "fallback") for d in _fallback_dirs(owners, _temp_dirs(pids))]
    dirs, files, names, seen, more = [], [], {}, set(), False
    for path, kind in candidates:
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
            names[path] = []
            for name, f, st in _log_files(dfd, listed, owners):
                names[path].append(name)
                size = st.st_size
                off = int(have.get(path + "/" + name, 0))
                if off > size:
                    off = 0  # the file was replaced: fetch it whole
                if off == size:
                    continue
                if budget <= 0:
                    more = True
                    continue
                f.seek(off)
                data = f.read(min(size - off, budget))
                # Only whole lines: a record being written now is fetched next time.
                cut = data.rfind(b"\n") + 1
                if len(data) < size - off:
                    more = True  # the budget ended inside this file
                if cut == 0:
                    continue
                budget -= cut
                files.append({"dir": path, "name": name, "offset": off, "data": _b64(data[:cut])})
        finally:
            os.close(dfd)
    if not names:
        why = "; ".join("%s: %s" % (d["path"], d["refused"]) for d in dirs if d.get("refused"))
        return {"error": "no timing logs eaglepatch may read (%s): apply first (or give --log-dir), then put load "
                         "on the server" % why, "dirs": dirs}
    return {"dirs": dirs, "files": files, "names": names, "more": more}


def op_read(payload):
    """Text of files inside the sglang package's parent (``paths`` relative to it: ``sglang/srt/server_args.py``);
    None for one that is absent. Nothing outside that folder is read."""
    root = os.path.realpath(os.path.dirname(payload["package_dir"]))
    out = {}
    for rel in payload["paths"]:
        path = os.path.realpath(os.path.join(root, rel))
        if not path.startswith(root + os.sep):
            out[rel] = None
            continue
        try:
            out[rel] = _read(path).decode("utf-8", "replace")
        except OSError:
            out[rel] = None
    return {"files": out}



# ---------------------------------------------------------------------------------------------------------------
# sweep --live: the lease and the adaptive config, files of the timing log directory

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
            data = json.dumps({"v": 1, "token": payload["token"], "steps": payload["steps"],
                               "deadline": time.time() + float(payload["lease_s"])})
        else:
            data = payload["data"]
        tmp = _tmp_name(path, "%d" % os.getpid())
        _write_new(tmp, data.encode("utf-8"), mode=0o600)
        _replace(tmp, path)
    return {"ok": True, "now": time.time()}


# ---------------------------------------------------------------------------------------------------------------
# doctor: what a server's process, log, HTTP API and model configs say; reads only


def _doctor_log_sources(pids):
    """The regular files that the stdout and stderr of ``pids`` write to (each once), and what the others are."""
    import stat as _st

    files, other, seen = [], [], set()
    for pid in pids:
        for fd in (1, 2):
            link = "/proc/%d/fd/%d" % (pid, fd)
            try:
                target = os.readlink(link)
                st = os.stat(link)
            except OSError:
                continue
            if not _st.S_ISREG(st.st_mode):
                other.append(target)  # a pipe, a socket (journald), a terminal, /dev/null: nothing to read here
                continue
            key = (st.st_dev, st.st_ino)
            if key not in seen:
                seen.add(key)
                files.append((link, target, st.st_size))
    return files, sorted(set(other))


def _doctor_read_log(link, size, pattern, head_bytes, tail_bytes, max_lines):
    """The lines of a log that match ``pattern``, from its start (``head_bytes``) and its end (``tail_bytes``),
    from the last ``server_args=`` line on (the current launch), at most ``max_lines`` (the last ones)."""
    regions = [(0, size)] if size <= head_bytes + tail_bytes else [(0, head_bytes), (size - tail_bytes, size)]
    kept = []
    with open(link, "rb") as f:
        for begin, end in regions:
            f.seek(begin)
            data = f.read(end - begin)
            lines = re.split(r"\r\n|\r|\n", data.decode("utf-8", "replace"))
            if begin > 0 and lines:
                lines = lines[1:]  # cut in the middle of a line
            if end < size and lines:
                lines = lines[:-1]  # likewise
            kept.extend(ln.rstrip() for ln in lines if pattern.search(ln))
    start = 0
    for i, ln in enumerate(kept):
        if "server_args=ServerArgs(" in ln:
            start = i
    kept = kept[start:]
    if len(kept) > max_lines:
        head = [kept[0]] if "server_args=ServerArgs(" in kept[0] else []
        kept = head + kept[-(max_lines - len(head)):]
    return kept


def _doctor_http_json(url, timeout, api_key):
    """(status, parsed JSON or None, error) of a GET on this host, without proxies."""
    import urllib.error
    import urllib.request

    headers = {"Authorization": "Bearer " + api_key} if api_key else {}
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(urllib.request.Request(url, headers=headers), timeout=timeout) as resp:
            body = resp.read(8 << 20)
            status = resp.status
    except urllib.error.HTTPError as exc:
        return exc.code, None, "HTTP %d" % exc.code
    except (urllib.error.URLError, socket.timeout, OSError) as exc:
        return None, None, str(getattr(exc, "reason", exc))
    try:
        return status, json.loads(body.decode("utf-8", "replace")), None
    except ValueError:
        return status, None, "not JSON"


def _doctor_server_info(host, port, api_key, timeout):
    base = "http://%s:%d" % ("[%s]" % host if ":" in host else host, port)
    for endpoint in ("/server_info", "/get_server_info"):  # /server_info from 0.5.6; before, only the other
        status, doc, err = _doctor_http_json(base + endpoint, timeout, api_key)
        if status == 404:
            continue
        return {"endpoint": endpoint, "status": status, "doc": doc if isinstance(doc, dict) else None,
                "error": err}
    return {"endpoint": None, "status": 404, "doc": None, "error": "no /server_info or /get_server_info"}


def _doctor_hf_snapshot(name, env):
    """config.json of a Hugging Face repo id in the server's hub cache (HF_HUB_CACHE, HF_HOME/hub,
    ~/.cache/huggingface/hub), or None."""
    if not re.match(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$", name):
        return None
    hubs = []
    if env.get("HF_HUB_CACHE"):
        hubs.append(env["HF_HUB_CACHE"])
    if env.get("HF_HOME"):
        hubs.append(os.path.join(env["HF_HOME"], "hub"))
    if env.get("HOME"):
        hubs.append(os.path.join(env["HOME"], ".cache", "huggingface", "hub"))
    for hub in hubs:
        repo = os.path.join(hub, "models--" + name.replace("/", "--"))
        snaps = os.path.join(repo, "snapshots")
        try:
            ref = _read(os.path.join(repo, "refs", "main")).decode().strip()
        except OSError:
            ref = None
        cands = [ref] if ref else []
        try:
            cands += sorted(os.listdir(snaps), key=lambda d: -os.path.getmtime(os.path.join(snaps, d)))
        except OSError:
            continue
        for c in cands:
            p = os.path.join(snaps, c, "config.json")
            if os.path.isfile(p):
                return p
    return None


def _doctor_model_config(name, cwd, env):
    """``{"path", "text"}`` of a model's config.json (a local folder, or a repo id in the hub cache), or
    ``{"error"}``."""
    # a relative name is the server's cwd's; with its cwd unknown, only the hub cache can say which model it is
    path = name if os.path.isabs(name) else (os.path.join(cwd, name) if cwd else None)
    cfg = os.path.join(path, "config.json") if path and os.path.isdir(path) else None
    if cfg is None:
        cfg = _doctor_hf_snapshot(name, env or {})
        if cfg is None:
            return {"error": "not a local folder, and not in the server's Hugging Face cache"}
    try:
        # O_NONBLOCK: a FIFO named config.json must not block the read; only a regular file is read
        fd = os.open(cfg, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return {"path": cfg, "error": "config.json is not a regular file"}
            if st.st_size > (4 << 20):
                return {"path": cfg, "error": "config.json is over 4 MB"}
            with os.fdopen(os.dup(fd), "rb") as f:
                return {"path": cfg, "text": f.read(4 << 20).decode("utf-8", "replace")}
        finally:
            os.close(fd)
    except OSError as exc:
        return {"path": cfg, "error": exc.strerror or str(exc)}


def _doctor_nvidia_smi(timeout):
    import shutil

    exe = shutil.which("nvidia-smi") or ("/usr/bin/nvidia-smi" if os.path.exists("/usr/bin/nvidia-smi") else None)
    if exe is None:
        return {"error": "no nvidia-smi on this host"}
    out = {}
    for key, argv in (("list", [exe, "-L"]), ("topo", [exe, "topo", "-m"])):
        try:
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except OSError as exc:
            out[key + "_error"] = str(exc)
            continue
        try:
            stdout, stderr = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            # a hung driver can keep nvidia-smi in an uninterruptible wait: kill it, wait a little, leave it
            p.kill()
            try:
                p.wait(2)
            except subprocess.TimeoutExpired:
                pass
            out[key + "_error"] = "nvidia-smi did not answer in %g s" % timeout
            break   # the next call would hang the same way
        out[key] = stdout[:65536].decode("utf-8", "replace")
        if p.returncode:
            out[key + "_error"] = "exit %d: %s" % (p.returncode, stderr[:300].decode("utf-8", "replace"))
    return out


def op_doctor(payload):
    """What ``eaglepatch doctor`` reads of each server, changing nothing: the logs its processes write (their
    stdout and stderr, when they are files; only the lines matching ``filter``), its ``/server_info``, the
    config.json of the models it names, and (once) ``nvidia-smi -L`` and ``nvidia-smi topo -m``."""
    pattern = re.compile(payload.get("filter") or "Decode batch")
    out = {"servers": []}
    for srv in payload.get("servers") or []:
        one = {"pid": srv["pid"], "logs": [], "configs": {}}
        files, other = _doctor_log_sources([srv["pid"]] + list(srv.get("children") or []))
        one["log_other"] = other
        for link, target, size in files:
            try:
                lines = _doctor_read_log(link, size, pattern, int(payload.get("head_bytes", 2 << 20)),
                                         int(payload.get("tail_bytes", 32 << 20)), int(payload.get("max_lines", 1500)))
                one["logs"].append({"path": target, "size": size, "lines": lines})
            except OSError as exc:
                one["logs"].append({"path": target, "size": size, "error": exc.strerror or str(exc)})
        if srv.get("port"):
            one["server_info"] = _doctor_server_info(srv.get("host") or "127.0.0.1", int(srv["port"]),
                                                     srv.get("api_key"), float(payload.get("http_timeout", 10)))
        for name in srv.get("models") or []:
            one["configs"][name] = _doctor_model_config(name, srv.get("cwd"), srv.get("env") or {})
        out["servers"].append(one)
    if payload.get("gpus", True):
        out["gpus"] = _doctor_nvidia_smi(float(payload.get("smi_timeout", 20)))
    return out


OPS.update({"read": op_read, "logs": op_logs, "facts": op_facts, "lock": op_lock, "unlock": op_unlock, "execute": op_execute,
             "doctor": op_doctor, "live": op_live})  # noqa: F821
