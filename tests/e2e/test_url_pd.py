"""``bench`` and ``sweep`` with ``--url`` (the router or load balancer in front of the server), and one side of a
prefill/decode pair refused without it (issue 40), end to end through the installed CLI against the stand-in sglang
(tests/stubs/stand_in_sglang), locally and over the real sshd of conftest.py.

Each stand-in records what it is sent (``--record-requests``); one started with ``--disaggregation-mode decode``
refuses every request as the decode side of a pair does alone. The "router" is a second stand-in (the load lands
there, none on the target), or a small recording proxy on 127.0.0.1 in front of the target that serves it under a
path prefix (the requests carry the URL's prefix, query, host and credentials, none of which is printed).
"""

from __future__ import annotations

import base64
import http.client
import json
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from safety import H  # the fixtures local, ssh, standins: conftest.py

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

SPEC_ARGS = ("--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
             "--startup-delay", "0.2", "--tp", "1")
LOAD = ["--prompts", "random-ids", "--requests", "4", "--concurrency", "2", "--input-len", "16", "--max-new-tokens",
        "16", "--warmup", "1", "--log-wait", "0"]
PD_REFUSAL = ("is the decode side of a prefill/decode pair (--disaggregation-mode decode), which serves no request "
              "alone: give --url with the router or load balancer in front of the pair")


class Server:
    """A stand-in of its own install (its own tree: a TARGET names it alone) that records what it is sent."""

    def __init__(self, standins, tmp_path: Path, name: str, *extra: str):
        self.tree = H.make_tree(tmp_path / f"{name} site", H.V1_WORKER)
        self.record = tmp_path / f"{name} sent.jsonl"
        self.port = standins.port()
        self.proc = standins.launch(self.tree, tmp_path / f"{name} work", self.port, *SPEC_ARGS,
                                    "--record-requests", str(self.record), *extra)
        H.wait_http(self.port, timeout=30)

    def sent(self) -> list[str]:
        """The path of every request it was sent."""
        if not self.record.exists():
            return []
        return [json.loads(line)["path"] for line in self.record.read_text().splitlines()]

    def pids(self) -> list[int]:
        return H.launcher_pids(self.port)


class Proxy:
    """A load balancer on 127.0.0.1 that serves ``upstream`` under ``/lb``: records each request's method, path (with
    its query), ``Host`` and ``Authorization``, then forwards it without the prefix and answers with the upstream's
    answer whole."""

    def __init__(self, upstream: int):
        self.seen: list[tuple[str, str, str, str]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _forward(self, method: str) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.seen.append((method, self.path, self.headers.get("Host", ""),
                                   self.headers.get("Authorization", "")))
                path = self.path[len("/lb"):] if self.path.startswith("/lb/") else self.path
                conn = http.client.HTTPConnection("127.0.0.1", upstream, timeout=60)
                try:
                    conn.request(method, path, body=body or None,
                                 headers={"Content-Type": self.headers.get("Content-Type", "application/json")})
                    resp = conn.getresponse()
                    data = resp.read()
                    kind = resp.getheader("Content-Type", "application/json")
                finally:
                    conn.close()
                self.send_response(resp.status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._forward("GET")

            def do_POST(self):
                self._forward("POST")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def one_line(r: subprocess.CompletedProcess) -> str:
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    return lines[0]


# ----------------------------------------------------------------------------------------------------------------
# bench


def test_bench_refuses_the_decode_side_alone_then_loads_it_through_the_router(standins, tmp_path, local):
    """The decode side without --url: exit 2, one line, nothing sent (the stand-in records no request). With --url
    the load goes to the router (a stand-in of its own here), and the decode side is sent nothing still."""
    decode = Server(standins, tmp_path, "decode", "--disaggregation-mode", "decode")
    router = Server(standins, tmp_path, "router")
    r = local.run("bench", decode, *LOAD)
    assert r.returncode == 2 and r.stdout == ""
    line = one_line(r)
    assert f"the server on :{decode.port} (pid {decode.proc.pid}) {PD_REFUSAL}" in line, line
    assert decode.sent() == [] and router.sent() == []

    r = local.run("bench", decode, *LOAD, "--url", f"http://127.0.0.1:{router.port}", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["server"]["pid"] == decode.proc.pid  # the target is the decode side; its load went to the router
    assert doc["load"]["url"] == f"http://127.0.0.1:{router.port}"
    assert (doc["client"]["requests"], doc["client"]["failed"], doc["client"]["output_tokens"]) == (4, 0, 64)
    assert router.sent() == ["/generate"] * 5  # the warm-up and the load
    assert decode.sent() == []
    assert f"the load goes through http://127.0.0.1:{router.port}" in r.stderr
    assert any(n.startswith(f"the load went through http://127.0.0.1:{router.port}") for n in doc["notes"])


def test_bench_through_a_load_balancer_under_a_prefix_with_credentials(standins, tmp_path, local):
    """A URL with a path prefix, a query and user:password: every request carries them (HTTP Basic instead of the
    server's key, the URL's host in Host); the target gets the load through the balancer; neither the password nor
    the token is printed, in JSON or on stderr."""
    srv = Server(standins, tmp_path, "replica")
    proxy = Proxy(srv.port)
    try:
        url = f"http://me:s3cret-pw@127.0.0.1:{proxy.port}/lb/?token=tok-123"
        r = local.run("bench", srv, *LOAD[:1], "chat", *LOAD[2:], "--url", url, "--json")
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        shown = f"http://me:***@127.0.0.1:{proxy.port}/lb/?token=***"
        assert doc["load"]["url"] == shown and doc["client"]["failed"] == 0
        for secret in ("s3cret-pw", "tok-123"):
            assert secret not in r.stdout and secret not in r.stderr
        basic = "Basic " + base64.b64encode(b"me:s3cret-pw").decode()
        assert proxy.seen[0][:2] == ("GET", "/lb/v1/models?token=tok-123")
        assert [s[:2] for s in proxy.seen[1:]] == [("POST", "/lb/v1/chat/completions?token=tok-123")] * 5
        assert all(host == f"127.0.0.1:{proxy.port}" and auth == basic for _m, _p, host, auth in proxy.seen)
        assert srv.sent() == ["/v1/chat/completions"] * 5
    finally:
        proxy.close()


@pytest.mark.parametrize("url, why", [
    ("ftp://127.0.0.1:1/", "the scheme must be http or https, not 'ftp'"),
    ("http://127.0.0.1:70000/", "the port must be a number from 1 to 65535"),
    ("127.0.0.1:8000", "the scheme must be http or https"),
    ("http:///generate", "no host"),
])
def test_a_bad_url_exits_2_before_anything_is_sent(standins, tmp_path, local, url, why):
    srv = Server(standins, tmp_path, "replica")
    for cmd, extra in (("bench", ()), ("sweep", ("--grid", "speculative-num-steps=1,2"))):
        r = local.run(cmd, srv, *LOAD, *extra, "--url", url)
        assert r.returncode == 2 and r.stdout == ""
        line = one_line(r)
        assert why in line and "give the router's or load balancer's address as http://HOST[:PORT][/PREFIX]" in line
    assert srv.sent() == [] and srv.pids() == [srv.proc.pid]


def test_bench_over_ssh_reaches_the_url_from_the_target_host(standins, tmp_path, ssh):
    """Over SSH the URL is reached as the target host sees it, through a forwarded port: the router's address on
    that host (127.0.0.1 there)."""
    decode = Server(standins, tmp_path, "decode", "--disaggregation-mode", "decode")
    router = Server(standins, tmp_path, "router")
    r = ssh.run("bench", decode, *LOAD)
    assert r.returncode == 2 and PD_REFUSAL in one_line(r)
    r = ssh.run("bench", decode, *LOAD, "--url", f"http://localhost:{router.port}", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["client"]["failed"] == 0
    assert router.sent() == ["/generate"] * 5 and decode.sent() == []


# ----------------------------------------------------------------------------------------------------------------
# sweep


def test_sweep_refuses_the_decode_side_alone_and_changes_nothing(standins, tmp_path, local):
    """Without --url: exit 2, one line, nothing sent, the server not restarted. With --url the sweep goes on to the
    rule of pairs: it would restart one side without the other, which a sweep of one TARGET never does (exit 2)."""
    decode = Server(standins, tmp_path, "decode", "--disaggregation-mode", "decode")
    grid = ("--grid", "speculative-num-steps=1,2", "--timeout", "30")
    r = local.run("sweep", decode, *LOAD, *grid)
    assert r.returncode == 2 and r.stdout == ""
    assert PD_REFUSAL in one_line(r)
    assert decode.sent() == [] and decode.pids() == [decode.proc.pid]
    r = local.run("sweep", decode, *LOAD, *grid, "--url", "http://127.0.0.1:1/")
    assert r.returncode == 2 and "without its prefill side" in one_line(r)
    assert decode.sent() == [] and decode.pids() == [decode.proc.pid]


def test_sweep_sends_each_points_load_to_the_url(standins, tmp_path, local):
    """A restart sweep of a replica with --url: each launch is the target's (readiness read from it), each load goes
    to the URL (a stand-in of its own here: the target is sent nothing); the server is put back."""
    replica = Server(standins, tmp_path, "replica")
    router = Server(standins, tmp_path, "router")
    r = local.run("sweep", replica, *LOAD, "--grid", "speculative-num-steps=2", "--timeout", "30",
                  "--url", f"http://127.0.0.1:{router.port}", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [p["status"] for p in doc["points"]] == ["ok"] and doc["restore"]["ready"] is True
    assert router.sent() == ["/generate"] * 5 and replica.sent() == []
    assert r.stderr.count("starting sglang on") == 2  # the point's launch, and the original's put back
