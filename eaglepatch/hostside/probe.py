"""Readiness and the server's log (the ``probe`` and ``tail`` ops): one poll of a starting server (is its process
alive, what does its health endpoint say, what did its log say last), and the last lines of its log.
"""

from __future__ import annotations

import re
import socket

from eaglepatch.hostside.discover import top_launchers
from eaglepatch.hostside.launchers import parse_server_args
from eaglepatch.hostside.proc import is_alive, table


# the server's access-log lines for our own polls say nothing about its progress
_PROBE_LINE_RE = re.compile(r'"(GET|HEAD) /(health|health_generate|ready)[ ?]')


def tail_lines(path, offset, n, max_bytes=262144):
    """The last ``n`` lines of the log after ``offset`` (at most ``max_bytes`` read), without our own
    probes' access-log lines; None when it cannot be read."""
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
    """The last lines of the server's log (``log_path``) after ``offset``."""
    return {"lines": tail_lines(payload["log_path"], payload.get("offset", 0), payload.get("lines", 30))}


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
    out["old_alive"] = bool(old) and is_alive(old, payload.get("old_start"))
    pid = payload.get("pid")
    if not pid and payload.get("discover"):
        # started by someone else (a restart command): find its launcher on the port, to notice when it dies
        procs = table()
        for p, (argv, idx) in sorted(top_launchers(procs).items()):
            if p != old and parse_server_args(argv[idx:])["port"] == payload["port"]:
                out["found_pid"], out["found_start"] = p, procs[p]["start"]
                break
    out["alive"] = True if not pid else is_alive(pid, payload.get("start"))
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
        lines = tail_lines(payload["log_path"], payload.get("offset", 0), 1, max_bytes=16384)
        out["last_line"] = lines[-1] if lines else None
    return out
