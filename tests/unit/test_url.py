"""``--url`` of bench and sweep (eaglepatch/tuning/target_url.py): the URL checked before anything is sent, what may
be printed of it, the refusal of one side of a prefill/decode pair without it, the route the load takes (a forward
opened on the target host for a URL, as for the server's own port), and the load's requests as the URL names them
(prefix, query, Host, credentials) against a small in-process HTTP server reached through another port, as through
a forward. End to end against the stand-in sglang: tests/e2e/test_url_pd.py."""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from eaglepatch.errors import Unsupported, UsageError
from eaglepatch.tuning.bench import BenchOptions
from eaglepatch.tuning.load import LoadSpec, endpoints, run_load
from eaglepatch.tuning.load_http import _Client
from eaglepatch.tuning.target_url import check_side, load_route, masked_url, parse_url

# ----------------------------------------------------------------------------------------------------------------
# parse_url


@pytest.mark.parametrize("text, scheme, host, port, prefix, query", [
    ("http://router:8000", "http", "router", 8000, "", ""),
    ("http://router:8000/", "http", "router", 8000, "", ""),
    ("https://lb.example.com", "https", "lb.example.com", 443, "", ""),
    ("http://lb.example.com/sglang/", "http", "lb.example.com", 80, "/sglang", ""),
    ("HTTP://10.0.0.5:30000/a/b?token=x&v=1", "http", "10.0.0.5", 30000, "/a/b", "token=x&v=1"),
    ("http://[::1]:9000/lb", "http", "::1", 9000, "/lb", ""),
])
def test_a_url_is_read_into_its_parts(text, scheme, host, port, prefix, query):
    """The scheme (either case), the host, the port (the scheme's own when none is given), the path prefix the
    endpoints hang under (no trailing slash), the query sent with every request."""
    u = parse_url(text)
    assert (u.scheme, u.host, u.port, u.prefix, u.query, u.text) == (scheme, host, port, prefix, query, text)
    assert u.tls == (scheme == "https")


def test_credentials_in_a_url_are_kept_decoded_and_never_shown():
    """``user:password@``: kept (percent-decoded) for HTTP Basic; ``shown`` masks the password and a secret query
    parameter; a user name alone (a token, as often as a name) is masked too."""
    u = parse_url("https://me:p%40ss@lb.example/x?token=abc&n=1")
    assert (u.username, u.password) == ("me", "p@ss")
    assert u.shown == "https://me:***@lb.example/x?token=***&n=1"
    assert parse_url("https://ghp_secret@lb.example/").shown == "https://***@lb.example/"
    assert parse_url("http://router:8000").shown == "http://router:8000"
    assert masked_url("http://u:pw@h:1/?api_key=k") == "http://u:***@h:1/?api_key=***"


@pytest.mark.parametrize("text, why", [
    ("", "empty"),
    ("router:8000", "the scheme must be http or https"),
    ("ftp://router/", "the scheme must be http or https"),
    ("//router:8000", "the scheme must be http or https"),
    ("http://", "no host"),
    ("http://:8000/", "no host"),
    ("http://router:0", "the port must be a number from 1 to 65535"),
    ("http://router:99999", "the port must be a number from 1 to 65535"),
    ("http://router:80a", "the port must be a number from 1 to 65535"),
    ("http://router/#frag", "a #fragment is never sent"),
    ("http://router/a b", "a blank, a control or a non-ASCII character"),
    ("http://router/\r\nX-Injected: 1", "a blank, a control or a non-ASCII character"),
    ("http://röuter/", "a blank, a control or a non-ASCII character"),
])
def test_a_bad_url_is_one_line_saying_what_to_give(text, why):
    """Exit 2 (UsageError) before anything is sent: one line, why, and the form to give; a newline in the URL (which
    would forge a header line of every request) is refused, and shown escaped."""
    with pytest.raises(UsageError) as e:
        parse_url(text)
    msg = str(e.value)
    assert why in msg and "give the router's or load balancer's address as http://HOST[:PORT][/PREFIX]" in msg
    assert "\n" not in msg and "\r" not in msg


def test_a_bad_url_with_credentials_is_refused_masked():
    with pytest.raises(UsageError) as e:
        parse_url("ftp://me:hunter2@router/?token=abc")
    assert "hunter2" not in str(e.value) and "abc" not in str(e.value) and "me:***@router" in str(e.value)


def test_the_sweep_identity_carries_the_url_masked():
    """Another way in is another load (a sweep through a router is not resumed as one without): ``load_json`` names
    the URL, masked (the state file is printed); without --url it is what it always was."""
    plain = BenchOptions(load=LoadSpec(prompt_source="random-ids"))
    assert "url" not in plain.load_json()
    via = BenchOptions(load=plain.load, url=parse_url("http://u:pw@router:8000/?token=t"))
    assert via.load_json() == dict(plain.load_json(), url="http://u:***@router:8000/?token=***")


# ----------------------------------------------------------------------------------------------------------------
# one side of a prefill/decode pair


@pytest.mark.parametrize("side, words", [("decode", "which serves no request alone"),
                                         ("prefill", "which decodes no request")])
def test_one_side_of_a_pair_is_refused_without_url(side, words):
    with pytest.raises(UsageError) as e:
        check_side("gpu1", side, "the server on :30000 (pid 42)", None, "bench")
    assert str(e.value) == (
        f"gpu1: the server on :30000 (pid 42) is the {side} side of a prefill/decode pair (--disaggregation-mode "
        f"{side}), {words}: give --url with the router or load balancer in front of the pair; bench sent nothing "
        "and changed nothing")


def test_with_url_or_without_a_side_nothing_is_refused():
    check_side("gpu1", "decode", "the server", parse_url("http://router:8000"), "sweep")
    check_side("gpu1", None, "the server", None, "sweep")


# ----------------------------------------------------------------------------------------------------------------
# the route


class _Host:
    """A host as the SSH one looks to the load: probes and forwards, recorded; ``down``: what answers nothing."""

    is_local = False

    def __init__(self, down: tuple[str, int] | None = None):
        self.calls: list[tuple] = []
        self.down = down

    def probe_tunnel(self, addr, port):
        self.calls.append(("probe", addr, port))
        return f"nothing answers on {addr}:{port}" if (addr, port) == self.down else None

    def open_tunnel(self, addr, port):
        self.calls.append(("open", addr, port))
        return 45000 + len(self.calls)

    def close_tunnel(self, port):
        self.calls.append(("close", port))


SERVER = SimpleNamespace(probe_host="127.0.0.1", port=30000, pid=42)


def test_without_url_the_load_goes_through_a_forward_to_the_servers_port():
    host = _Host()
    with load_route(host, "gpu1", SERVER, None) as route:
        assert (route.base_url, route.connect) == ("http://127.0.0.1:45002", None)
    assert host.calls == [("probe", "127.0.0.1", 30000), ("open", "127.0.0.1", 30000), ("close", 45002)]


def test_over_ssh_the_url_is_reached_from_the_target_host_through_a_forward():
    """The server is probed (the load is meant for it), then the URL's host and port are forwarded as the target host
    sees them; the requests name the URL, their connections go to the forward's local end."""
    host = _Host()
    url = parse_url("http://u:pw@router.internal:8000/lb?token=t")
    with load_route(host, "gpu1", SERVER, url) as route:
        assert route.base_url == url.text and route.connect == ("127.0.0.1", 45003)
        assert route.shown == "http://u:***@router.internal:8000/lb?token=***"
    assert host.calls == [("probe", "127.0.0.1", 30000), ("probe", "router.internal", 8000),
                          ("open", "router.internal", 8000), ("close", 45003)]


def test_a_url_nothing_answers_at_from_the_target_host_is_said_masked():
    host = _Host(down=("router.internal", 8000))
    with pytest.raises(Unsupported) as e:
        with load_route(host, "gpu1", SERVER, parse_url("http://u:pw@router.internal:8000/")):
            pass
    assert "nothing answers on router.internal:8000" in str(e.value) and "u:***@" in str(e.value)
    assert ":pw@" not in str(e.value) and ("open", "router.internal", 8000) not in host.calls


def test_on_a_local_target_the_url_is_reached_from_here():
    host = SimpleNamespace(is_local=True)
    url = parse_url("https://lb.example/x")
    with load_route(host, "local", SERVER, url) as route:
        assert (route.base_url, route.connect, route.shown) == ("https://lb.example/x", None, "https://lb.example/x")


# ----------------------------------------------------------------------------------------------------------------
# the requests


def test_the_requests_name_the_url():
    """Each request's head: the prefix and the query around the endpoint, the URL's host in ``Host`` (its port only
    when given), the URL's credentials as HTTP Basic instead of the server's --api-key; TLS for https, checked
    against the URL's host whatever port the connection goes through."""
    c = _Client("https://me:p%40ss@lb.example/lb/?token=abc", "server-key", 10, connect=("127.0.0.1", 45001))
    head = c.heads["/generate"]
    assert head.startswith("POST /lb/generate?token=abc HTTP/1.1\r\nHost: lb.example\r\n")
    assert f"Authorization: Basic {base64.b64encode(b'me:p@ss').decode()}\r\n" in head
    assert "server-key" not in head
    assert c.heads["/v1/chat/completions"].startswith("POST /lb/v1/chat/completions?token=abc HTTP/1.1")
    assert (c.tls, c.hostname, c.port, c.host, c.connect_port) == (True, "lb.example", 443, "127.0.0.1", 45001)
    plain = _Client("http://router:8000", "server-key", 10)
    assert plain.heads["/generate"].startswith("POST /generate HTTP/1.1\r\nHost: router:8000\r\n")
    assert "Authorization: Bearer server-key\r\n" in plain.heads["/generate"]
    assert (plain.tls, plain.host, plain.connect_port) == (False, "router", 8000)


class _Recorder:
    """``/lb/generate`` and ``/lb/v1/models``: records each request's path and headers; answers one JSON result."""

    def __init__(self):
        self.seen: list[tuple[str, str, dict]] = []
        outer = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _answer(self, doc):
                data = json.dumps(doc).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                outer.seen.append(("GET", self.path, dict(self.headers)))
                self._answer({"data": [{"id": "m"}]})

            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                outer.seen.append(("POST", self.path, dict(self.headers)))
                self._answer({"text": "x", "meta_info": {"completion_tokens": 4}})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def recorder():
    r = _Recorder()
    yield r
    r.close()


def test_the_load_goes_where_the_url_says_through_the_port_it_is_given(recorder):
    """A URL whose host this machine cannot even resolve, reached through another port (as through a forward): every
    request, the model's name asked too, carries the URL's prefix, query, host and credentials."""
    spec = LoadSpec(requests=3, concurrency=1, max_new_tokens=4, warmup=1, prompt_source="chat")
    res = run_load("http://me:pw@router.invalid:8000/lb?token=abc", spec, api_key="server-key",
                   connect=("127.0.0.1", recorder.port))
    assert res.failed == 0
    basic = "Basic " + base64.b64encode(b"me:pw").decode()
    assert recorder.seen[0][:2] == ("GET", "/lb/v1/models?token=abc")
    assert {(m, p) for m, p, _h in recorder.seen[1:]} == {("POST", "/lb/v1/chat/completions?token=abc")}
    assert len(recorder.seen) == 1 + 1 + 3
    assert all(h["Host"] == "router.invalid:8000" and h["Authorization"] == basic for _m, _p, h in recorder.seen)


def test_the_loads_errors_name_the_endpoint_masked():
    spec = LoadSpec(prompt_source="random-ids")
    assert endpoints("http://me:pw@router:8000/lb?token=abc", spec) == "http://me:***@router:8000/lb/generate?token=***"
    assert endpoints("http://127.0.0.1:4000", spec) == "http://127.0.0.1:4000/generate"
