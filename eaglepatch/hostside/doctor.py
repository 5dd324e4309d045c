"""What ``eaglepatch doctor`` reads of each server (the ``doctor`` op), changing nothing: the logs its processes
write, its ``/server_info``, the config.json of the models it names, and ``nvidia-smi``.
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import subprocess

from eaglepatch.hostside.files import read_file


def log_sources(pids):
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


def read_log(link, size, pattern, head_bytes, tail_bytes, max_lines):
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


def http_json(url, timeout, api_key):
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


def server_info(host, port, api_key, timeout):
    """What ``/server_info`` (or, before sglang 0.5.6, ``/get_server_info``) answers on this host."""
    base = "http://%s:%d" % ("[%s]" % host if ":" in host else host, port)
    for endpoint in ("/server_info", "/get_server_info"):  # /server_info from 0.5.6; before, only the other
        status, doc, err = http_json(base + endpoint, timeout, api_key)
        if status == 404:
            continue
        return {"endpoint": endpoint, "status": status, "doc": doc if isinstance(doc, dict) else None,
                "error": err}
    return {"endpoint": None, "status": 404, "doc": None, "error": "no /server_info or /get_server_info"}


def requests_in(endpoint, doc):
    """The requests a server holds (running and waiting, all its data-parallel ranks) in what ``endpoint`` answered:
    ``/v1/loads`` (``{"loads": [{"num_running_reqs", "num_waiting_reqs", ...}]}``) or the older ``/get_load``
    (``[{"num_reqs", ...}]``); None when the answer is not of that shape."""
    rows = doc.get("loads") if endpoint.startswith("/v1/loads") and isinstance(doc, dict) else doc
    if not isinstance(rows, list) or not rows:
        return None
    total = 0
    for row in rows:
        if not isinstance(row, dict):
            return None
        keys = ("num_running_reqs", "num_waiting_reqs") if endpoint.startswith("/v1/loads") else ("num_reqs",)
        for key in keys:
            value = row.get(key, 0)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                return None
            total += value
    return total


def op_loads(payload):
    """How many requests the server on ``port`` holds, read ``samples`` times ``interval`` s apart from its own
    ``/v1/loads`` (else, before that endpoint, ``/get_load``): ``{"endpoint", "samples": [n, ...], "error"}``
    (``endpoint`` None and no samples when it answers neither)."""
    import time

    host = payload.get("host") or "127.0.0.1"
    base = "http://%s:%d" % ("[%s]" % host if ":" in host else host, int(payload["port"]))
    timeout, api_key = float(payload.get("http_timeout", 5)), payload.get("api_key")
    samples, interval = max(1, int(payload.get("samples", 3))), float(payload.get("interval", 0.5))
    endpoints, err, got = ["/v1/loads?include=core", "/get_load"], None, []
    while len(got) < samples:
        if got:
            time.sleep(interval)
        status, doc, err = http_json(base + endpoints[0], timeout, api_key)
        if status == 404 and not got and len(endpoints) > 1:
            endpoints.pop(0)  # before /v1/loads: the older endpoint
            continue
        if status == 404 and not got:
            return {"endpoint": None, "samples": [], "error": err or "no /v1/loads or /get_load"}
        n = requests_in(endpoints[0], doc) if status == 200 else None
        if n is None:
            return {"endpoint": endpoints[0], "samples": got, "error": err or "an answer of another shape"}
        got.append(n)
    return {"endpoint": endpoints[0], "samples": got, "error": None}


def hf_snapshot(name, env):
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
            ref = read_file(os.path.join(repo, "refs", "main")).decode().strip()
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


def model_config(name, cwd, env):
    """``{"path", "text"}`` of a model's config.json (a local folder, or a repo id in the hub cache), or
    ``{"error"}``."""
    # a relative name is the server's cwd's; with its cwd unknown, only the hub cache can say which model it is
    path = name if os.path.isabs(name) else (os.path.join(cwd, name) if cwd else None)
    cfg = os.path.join(path, "config.json") if path and os.path.isdir(path) else None
    if cfg is None:
        cfg = hf_snapshot(name, env or {})
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


def nvidia_smi(timeout):
    """The output of ``nvidia-smi -L`` and ``nvidia-smi topo -m`` (``list``, ``topo``), or why not."""
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
        files, other = log_sources([srv["pid"]] + list(srv.get("children") or []))
        one["log_other"] = other
        for link, target, size in files:
            try:
                lines = read_log(link, size, pattern, int(payload.get("head_bytes", 2 << 20)),
                                         int(payload.get("tail_bytes", 32 << 20)), int(payload.get("max_lines", 1500)))
                one["logs"].append({"path": target, "size": size, "lines": lines})
            except OSError as exc:
                one["logs"].append({"path": target, "size": size, "error": exc.strerror or str(exc)})
        if srv.get("port"):
            one["server_info"] = server_info(srv.get("host") or "127.0.0.1", int(srv["port"]),
                                                     srv.get("api_key"), float(payload.get("http_timeout", 10)))
        for name in srv.get("models") or []:
            one["configs"][name] = model_config(name, srv.get("cwd"), srv.get("env") or {})
        out["servers"].append(one)
    if payload.get("gpus", True):
        out["gpus"] = nvidia_smi(float(payload.get("smi_timeout", 20)))
    return out
