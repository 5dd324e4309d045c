"""The facts of an sglang install (the ``facts`` op): which package, its version and servers, its worker files with
their bytes, the manifest and backups ``apply`` left, the runtime module, the lock, and whether this user may write
there; and the text of files of the package (the ``read`` op).

``op_facts`` is a short sequence of named steps (``facts_*``), each tested on its own in tests/unit/test_host_steps.py.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import time

from eaglepatch.hostside.discover import op_scan, package_of, query_start, query_wait
from eaglepatch.hostside.files import STALE_TMP, TMP_TAG, b64, read_file, read_json, sha256_of
from eaglepatch.hostside.launchers import parse_server_args
from eaglepatch.hostside.lock import LOCK_NAME, lock_info, op_lock
from eaglepatch.hostside.proc import user_name


BACKUP_DIRNAME = ".eaglepatch"
RUNTIME_NAME = "_eaglepatch_runtime.py"


def _package_of_python(python):
    """The sglang package that ``python`` (run plainly, with this environment) imports, or "" when it has none;
    None when it cannot run at all."""
    answer = query_wait(query_start(python, [], "", None, None), time.time() + 60)
    if answer is None:
        return None
    return package_of(answer, None) or ""


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
        text = read_file(os.path.join(pkg, "_version.py")).decode("utf-8", "replace")
        m = re.search(r"""(?:__version__|version)\s*=\s*(?:version\s*=\s*)?["']([^"']+)["']""", text)
        if m:
            return m.group(1)
    except OSError:
        pass
    parent = os.path.dirname(pkg)
    try:
        for name in sorted(os.listdir(parent)):
            if name.startswith("sglang-") and name.endswith(".dist-info"):
                for line in read_file(os.path.join(parent, name, "METADATA")).decode("utf-8", "replace").splitlines():
                    if line.startswith("Version:"):
                        return line.split(":", 1)[1].strip()
    except OSError:
        pass
    for name in ("version.py", "__init__.py"):
        try:
            text = read_file(os.path.join(pkg, name)).decode("utf-8", "replace")
        except OSError:
            continue
        m = re.search(r"""^__version__\s*=\s*["']([^"']+)["']""", text, re.M)
        if m:
            return m.group(1)
    return None


def _port_of(srv):
    return parse_server_args(srv["argv"][srv["args_index"]:])["port"]


ENTRY_NAMES = ("forward_batch_generation", "forward_batch_speculative_generation")


def worker_text(entries):
    """Whether a file's text is a worker file's: it defines one of the methods ``entries`` (``def NAME``, a word
    after it), or it begins with a class definition. The definition is one search whose pattern begins with a
    literal ("def "), which the re module scans for quickly: with the class test inside the same pattern, as an
    alternation, the search took 20-26 ms of the facts request over 0.5.16's 53 speculative files, 1-2 ms so."""
    defs = re.compile(r"def (%s)\b" % "|".join(re.escape(n) for n in sorted(entries)))
    cls = re.compile(r"class \w+\(")
    return lambda text: defs.search(text) is not None or cls.match(text) is not None


def facts_scan_servers():
    """Every sglang server on this host, each with the package its own interpreter imports (``op_scan``,
    ``discover``). Returns (servers, error): a /proc that cannot be read is not fatal for patching, so its
    error comes back as a string (the answer's ``scan_error``) with no servers."""
    try:
        # every server with the sglang package its own interpreter imports, as it was launched
        return op_scan({"identify": True})["servers"], None
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
    if not serving and payload.get("self_ok") is False:
        # this interpreter was started by the path the client kept for "python3" (hosts.interpreters), which may
        # no longer be what the name runs: the client asks again from the name itself
        return None, {"need_plain": True}
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


def facts_worker_files(pkg, spec, entries):
    """The worker files under ``spec``: each ``*.py`` whose text defines one of the methods ``entries``
    (``worker_text``), in sorted order, folders too; never the runtime module, a temp file, ``__pycache__`` or the
    backups. Each with its bytes (base64), sha256, mode, owner and mtime; ``path`` relative to the package's parent
    (sglang/srt/...). A file that cannot be read is left out."""
    files = []
    is_worker = worker_text(entries)
    if not os.path.isdir(spec):
        return files
    for root, dirs, names in os.walk(spec):
        dirs[:] = sorted(d for d in dirs if d not in ("__pycache__", BACKUP_DIRNAME))
        for name in sorted(names):
            if not name.endswith(".py") or name == RUNTIME_NAME or TMP_TAG in name:
                continue
            path = os.path.join(root, name)
            try:
                data = read_file(path)
            except OSError:
                continue
            if not is_worker(data.decode("utf-8", "replace")):
                continue
            st = os.stat(path)
            files.append(
                {
                    "path": os.path.relpath(path, os.path.dirname(pkg)),
                    "abs": path,
                    "data": b64(data),
                    "sha256": sha256_of(data),
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
        found += [os.path.join(root, n) for n in sorted(names) if STALE_TMP.match(n)]
    return found


def facts_manifest(manifest_path):
    """The manifest ``apply`` left, or None when there is none (or it cannot be read or parsed)."""
    return read_json(manifest_path)


def facts_backups(manifest):
    """backup path -> sha256 of its bytes (None: missing or unreadable), for every file the manifest names."""
    backups = {}
    if manifest:
        for f in manifest.get("files", []):
            b = f.get("backup")
            try:
                backups[b] = sha256_of(read_file(b))
            except (OSError, TypeError):
                backups[b] = None
    return backups


def facts_runtime(runtime_path):
    """What is at the runtime module's path: ``runtime_sha256`` (None: no file), its bytes (``runtime_data``,
    base64: for the diff of a config change, --mode or --every) and ``runtime_mtime``."""
    out = {}
    try:
        data = read_file(runtime_path)
        out["runtime_sha256"] = sha256_of(data)
        out["runtime_data"] = b64(data)  # for the diff of a config change (--mode, --every)
        out["runtime_mtime"] = os.stat(runtime_path).st_mtime
    except OSError:
        out["runtime_sha256"] = None
    return out


def facts_writable(spec):
    """Whether this user may write the speculative folder (``writable``), and who owns it (``owner``: for the
    message that says whom to run as)."""
    out = {"writable": os.access(spec, os.W_OK) if os.path.isdir(spec) else False}
    try:
        out["owner"] = user_name(os.stat(spec).st_uid)
    except OSError:
        out["owner"] = None
    return out


def op_facts(payload):
    """Everything eaglepatch needs to decide: server, interpreter, package, worker files, manifest, lock."""
    out = {"hostname": socket.gethostname(), "self_python": sys.executable, "servers": [],
           "user": user_name(os.geteuid()), "euid": os.geteuid()}
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
    out["files"] = facts_worker_files(pkg, spec, payload.get("entries") or ENTRY_NAMES)
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
    out["lock"] = lock_info(out["lock_path"])
    out["stale_temps"] = facts_stale_temps(spec)
    out.update(facts_writable(spec))
    return out


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
            out[rel] = read_file(path).decode("utf-8", "replace")
        except OSError:
            out[rel] = None
    return {"files": out}
