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
                return d
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


def op_facts(payload):
    """Everything eaglepatch needs to decide: server, interpreter, package, worker files, manifest, lock."""
    out = {"hostname": socket.gethostname(), "self_python": sys.executable, "servers": [],
           "user": _user_name(os.geteuid()), "euid": os.geteuid()}
    try:
        # every server with the sglang package its own interpreter imports, as it was launched
        servers = op_scan({"identify": True})["servers"]  # noqa: F821 (from eaglepatch/server/_remote.py)
    except Exception as exc:  # a /proc we cannot read is not fatal for patching
        servers = []
        out["scan_error"] = str(exc)
    pkg = None
    if payload.get("sglang_path"):
        pkg = _package_from_hint(payload["sglang_path"])
        if pkg is None:
            out["error"] = "no sglang package at %s" % payload["sglang_path"]
            return out
    elif payload.get("python"):
        pkg = _package_of_python(payload["python"])
        if pkg is None:
            out["error"] = "cannot run %s on the host" % payload["python"]
            return out
    else:
        serving = sorted({srv["package_dir"] for srv in servers if srv.get("package_dir")})
        if len(serving) > 1:
            # several installs serve here: guessing one could stop the wrong server
            out["ambiguous"] = [{"package_dir": p, "servers": [{"pid": srv["pid"], "port": _port_of(srv)}
                                                             for srv in servers if srv.get("package_dir") == p]}
                                for p in serving]
            return out
        pkg = serving[0] if serving else _package_of_python(sys.executable)
    # Only a server that runs this very package is ours to report and restart.
    mine = [srv for srv in servers if pkg and srv.get("package_dir") == pkg]
    out["servers"] = mine
    out["other_servers"] = [{"pid": srv["pid"], "port": _port_of(srv), "package_dir": srv.get("package_dir")}
                            for srv in servers if srv not in mine]
    out["python"] = payload.get("python") or (mine[0].get("interpreter") if mine else None) or sys.executable
    out["package_dir"] = pkg or None
    if not pkg:
        return out
    out["version"] = _version(pkg)
    spec = os.path.join(pkg, "srt", "speculative")
    out["spec_dir"] = spec
    if payload.get("lock") and os.path.isdir(spec):
        # apply and revert take the install's lock here, before reading the files, to save a round trip.
        lock = payload["lock"]
        out["lock_result"] = op_lock({"lock_path": os.path.join(spec, LOCK_NAME), "owner": lock["owner"],
                                      "ttl": lock.get("ttl", 7200), "dead_pids": []})
    files = []
    entry_re = re.compile(payload.get("pattern", r"def (forward_batch_generation|forward_batch_speculative_generation)\b"))
    if os.path.isdir(spec):
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
    out["files"] = files
    backup_dir = os.path.join(spec, BACKUP_DIRNAME)
    manifest_path = os.path.join(backup_dir, "manifest.json")
    out["backup_dir"] = backup_dir
    out["manifest_path"] = manifest_path
    try:
        out["manifest"] = json.loads(_read(manifest_path).decode())
    except (OSError, ValueError):
        out["manifest"] = None
    backups = {}
    if out["manifest"]:
        for f in out["manifest"].get("files", []):
            b = f.get("backup")
            try:
                backups[b] = _sha(_read(b))
            except (OSError, TypeError):
                backups[b] = None
    out["backups"] = backups
    runtime = os.path.join(spec, RUNTIME_NAME)
    try:
        out["runtime_sha256"] = _sha(_read(runtime))
        out["runtime_mtime"] = os.stat(runtime).st_mtime
    except OSError:
        out["runtime_sha256"] = None
    out["runtime_path"] = runtime
    out["lock_path"] = os.path.join(spec, LOCK_NAME)
    out["lock"] = _lock_info(out["lock_path"])
    out["writable"] = os.access(spec, os.W_OK) if os.path.isdir(spec) else False
    try:
        out["owner"] = _user_name(os.stat(spec).st_uid)
    except OSError:
        out["owner"] = None
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
        with os.fdopen(fd, "w") as f:
            json.dump(dict(me, time=time.time()), f)
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


def _tmp_name(path, token):
    d, name = os.path.split(path)
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
    os.replace(src_tmp, dst)


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


def _execute(payload):
    """Carry out a plan: check, write temps, compile, back up, swap in. All or nothing: when a step fails,
    every file this run replaced, created or removed (worker files, runtime, backups, manifest) is put back.

    payload: token, writes [{path, expect_sha256 (null: must not exist), data | null (= remove), backup?,
    compile: bool}], manifest {path, data | null}.
    """
    token = payload["token"]
    held = _lock_info(payload["lock_path"]) or {}
    if held.get("token") != token:
        return {"ok": False, "kind": "conflict", "error": "lost the lock %s" % payload["lock_path"]}
    writes = payload["writes"]
    man = payload.get("manifest") or {}
    dirs = [os.path.dirname(payload["lock_path"])] + [os.path.dirname(w["path"]) for w in writes]
    dirs += [os.path.dirname(w["backup"]) for w in writes if w.get("backup")]
    if man.get("path"):
        dirs.append(os.path.dirname(man["path"]))
    stale = _drop_stale_temps(dirs)
    # 1. Nothing changed since it was read; keep what each path holds now, to put it back on failure.
    prev = {}  # path -> (bytes | None, stat | None)

    def remember(path):
        if path not in prev:
            try:
                prev[path] = (_read(path), os.stat(path))
            except FileNotFoundError:
                prev[path] = (None, None)

    for w in writes:
        try:
            cur = _read(w["path"])
        except FileNotFoundError:
            cur = None
        except OSError as exc:
            return {"ok": False, "kind": "io", "path": w["path"], "error": exc.strerror}
        prev[w["path"]] = (cur, os.stat(w["path"]) if cur is not None else None)
        cur = _sha(cur) if cur is not None else None
        if cur != w["expect_sha256"]:
            return {"ok": False, "kind": "conflict", "path": w["path"],
                    "error": "changed since it was read (expected %s, found %s)" % (
                        (w["expect_sha256"] or "no file")[:12], (cur or "no file")[:12])}
    temps = []
    touched = []  # paths changed so far, in order
    made_dirs = []

    def cleanup():
        for t in temps:
            try:
                os.remove(t)
            except OSError:
                pass

    def undo():
        """Put back every touched path as it was; return the paths that could not be."""
        failed = []
        for path in reversed(touched):
            data, st = prev[path]
            try:
                if data is None:
                    if os.path.lexists(path):
                        os.remove(path)
                else:
                    rtmp = _tmp_name(path, token + "r")
                    temps.append(rtmp)
                    _write_new(rtmp, data, st)
                    _replace(rtmp, path)
            except OSError:
                failed.append(path)
        for d in reversed(made_dirs):
            try:
                os.rmdir(d)
            except OSError:
                pass
        cleanup()
        return failed

    def fail(exc, path=None):
        unrestored = undo()
        out = {"ok": False, "kind": "io", "path": path,
               "error": "%s%s" % ("" if path else (getattr(exc, "filename", None) or "") + ": ",
                                  exc.strerror or exc)}
        if unrestored:
            out["unrestored"] = unrestored
        return out

    def makedirs(d):
        missing = []
        while d and not os.path.isdir(d):
            missing.append(d)
            d = os.path.dirname(d)
        for m in reversed(missing):
            os.mkdir(m, 0o700)
            made_dirs.append(m)

    try:
        # 2. Temp files beside their destinations, validated with this (the server's) interpreter.
        staged = []
        for w in writes:
            if w.get("data") is None:
                staged.append((w, None))
                continue
            data = _unb64(w["data"])
            tmp = _tmp_name(w["path"], token)
            like = prev[w["path"]][1]
            temps.append(tmp)
            _write_new(tmp, data, like, mode=w.get("mode", 0o644))
            if w.get("compile"):
                try:
                    compile(data, w["path"], "exec", dont_inherit=True)
                except SyntaxError as exc:
                    cleanup()
                    return {"ok": False, "kind": "compile", "path": w["path"],
                            "error": "%s (line %s)" % (exc.msg, exc.lineno), "python": sys.executable}
            staged.append((w, tmp))
        _fault(payload, "execute:after-upload")
        # 3. Backups of the originals, then the manifest: before anything is replaced.
        for w in writes:
            b = w.get("backup")
            if b and w["expect_sha256"] is not None:
                makedirs(os.path.dirname(b))
                try:
                    same = _sha(_read(b)) == w["expect_sha256"]
                except OSError:
                    same = False
                if not same:
                    remember(b)
                    btmp = _tmp_name(b, token)
                    temps.append(btmp)
                    _write_new(btmp, prev[w["path"]][0], prev[w["path"]][1])
                    _replace(btmp, b)
                    touched.append(b)
        if man.get("data") is not None:
            makedirs(os.path.dirname(man["path"]))
            remember(man["path"])
            mtmp = _tmp_name(man["path"], token)
            temps.append(mtmp)
            _write_new(mtmp, json.dumps(man["data"], indent=1, sort_keys=True).encode(), None, 0o600)
            _replace(mtmp, man["path"])
            touched.append(man["path"])
        _fault(payload, "execute:after-backup")
    except OSError as exc:
        return fail(exc)
    # 4. Swap in (and remove what the plan removes, the manifest last). A failure puts everything back.
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
            return fail(exc, w["path"])
        touched.append(w["path"])
    if man.get("path") and man.get("data") is None and os.path.exists(man["path"]):
        remember(man["path"])
        try:
            os.remove(man["path"])
        except OSError as exc:
            return fail(exc, man["path"])
        touched.append(man["path"])
        try:
            os.rmdir(os.path.dirname(man["path"]))  # only when empty: a kept drifted copy stays
        except OSError:
            pass
    cleanup()
    removed = []
    for w in writes:
        if w["path"].endswith(".py"):
            removed += _drop_bytecode(w["path"])
    return {"ok": True, "bytecode_removed": removed, "stale_temps_removed": stale}


def op_logs(payload):
    """New bytes of the timing logs: for each *.jsonl, what follows the size the client already has."""
    d = payload["log_dir"]
    have = payload.get("have") or {}
    if not os.path.isdir(d):
        return {"error": "no timing logs at %s: apply first (or give --log-dir), then put load on the server" % d}
    files = []
    for name in sorted(os.listdir(d)):
        if not name.endswith(".jsonl"):
            continue
        path = os.path.join(d, name)
        try:
            size = os.path.getsize(path)
        except OSError:
            continue
        off = int(have.get(name, 0))
        if off > size:
            off = 0  # the file was replaced: fetch it whole
        if off == size:
            continue
        with open(path, "rb") as f:
            f.seek(off)
            data = f.read(size - off)
        # Only whole lines: a record being written now is fetched next time.
        cut = data.rfind(b"\n") + 1
        if cut == 0:
            continue
        files.append({"name": name, "offset": off, "data": _b64(data[:cut])})
    return {"files": files}


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


OPS.update({"read": op_read, "logs": op_logs, "facts": op_facts, "lock": op_lock, "unlock": op_unlock, "execute": op_execute})  # noqa: F821
