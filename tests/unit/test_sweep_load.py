"""The load that ``bench`` sends (eaglepatch/tuning/load.py), against small in-process HTTP servers, and the time-window
filter of ``eaglepatch.report.aggregate`` that gives bench the timing records of the load's minutes."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from eaglepatch.errors import UsageError
from eaglepatch.hosts.local import LocalHost
from eaglepatch.tuning.load import FRESH_S, LAUNCH_WARMUP, LoadFailed, LoadSpec, fresh_server_note, run_load
from eaglepatch.report import aggregate


class _Server:
    """``/generate``: streams and closes the connection (``mode`` "stream"), streams in HTTP/1.1 chunks and keeps
    it ("chunked", as uvicorn serves sglang), answers JSON ("json"), fails ("fail"), or fails every other
    request ("flaky"). Each step takes ``step`` seconds; 4 steps of ``max_new_tokens / 4`` tokens.
    ``connections`` counts the TCP connections it accepted."""

    def __init__(self, mode: str, step: float = 0.005):
        self.mode, self.step = mode, step
        self.bodies: list[dict] = []
        self.headers: list[dict] = []
        self.n = 0
        self.connections = 0
        self.lock = threading.Lock()
        outer = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def setup(self):
                super().setup()
                with outer.lock:
                    outer.connections += 1

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer.lock:
                    outer.bodies.append(body)
                    outer.headers.append(dict(self.headers))
                    outer.n += 1
                    n = outer.n
                m = body["sampling_params"]["max_new_tokens"]
                if outer.mode == "fail" or (outer.mode == "flaky" and n % 2 == 0):
                    data = b'{"error": "nope"}'
                    self.send_response(500)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                meta = lambda k: {"completion_tokens": k, "spec_accept_length": 2.5, "spec_verify_ct": max(1, k // 2)}  # noqa: E731
                if outer.mode == "chunked":
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for i in range(1, 5):
                        time.sleep(outer.step)
                        data = b"data: " + json.dumps({"text": "x" * i, "meta_info": dict(
                            meta(m * i // 4), e2e_latency=outer.step * i)}).encode() + b"\n\n"
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                        self.wfile.flush()
                    self.wfile.write(b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")
                    return
                if outer.mode == "stream":
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Connection", "close")
                    self.end_headers()
                    self.close_connection = True
                    for i in range(1, 5):
                        time.sleep(outer.step)
                        self.wfile.write(b"data: " + json.dumps({"text": "x" * i, "meta_info": meta(m * i // 4)}).encode()
                                         + b"\n\n")
                        self.wfile.flush()
                    self.wfile.write(b"data: [DONE]\n\n")
                    return
                time.sleep(outer.step * 4)
                data = json.dumps({"text": "x", "meta_info": {"completion_tokens": m}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server(request):
    s = _Server(request.param)
    yield s
    s.close()


def test_load_spec_checks_its_values_and_its_prompts_are_seeded():
    for bad in (dict(requests=0), dict(concurrency=0), dict(input_len=0), dict(max_new_tokens=0), dict(warmup=-1)):
        with pytest.raises(UsageError):
            LoadSpec(**bad)
    a = LoadSpec(input_len=7, seed=1)
    assert a.prompts(3) == LoadSpec(input_len=7, seed=1).prompts(3)
    assert a.prompts(3) != LoadSpec(input_len=7, seed=2).prompts(3)
    assert a.prompts(2, offset=1) == a.prompts(3)[1:]
    assert all(len(p) == 7 and all(10 <= t < 1000 for t in p) for p in a.prompts(3))


@pytest.mark.parametrize("server", ["stream"], indirect=True)
def test_streamed_load_measures_tokens_ttft_latency_and_accept_length(server):
    spec = LoadSpec(requests=6, concurrency=3, input_len=5, max_new_tokens=8, warmup=2)
    res = run_load(server.url, spec, api_key="k")
    assert server.n == 8  # warm-up included
    assert all(b["stream"] is True and b["sampling_params"]["ignore_eos"] is True and len(b["input_ids"]) == 5
               for b in server.bodies)
    assert all(h.get("Authorization") == "Bearer k" for h in server.headers)
    doc = res.to_json()
    assert (doc["requests"], doc["failed"], doc["output_tokens"], doc["streamed"]) == (6, 0, 48, True)
    # 2 rounds of 3 requests, each about 4 steps of 5 ms: 48 tokens in about 40 ms
    assert 48 / 1.0 < doc["tokens_per_s"] < 48 / 0.035
    assert doc["ttft_ms"]["p50"] < doc["latency_ms"]["p50"]
    assert 4 <= doc["ttft_ms"]["p50"] and 18 <= doc["latency_ms"]["p50"]
    assert doc["accept_len"] == 2.0  # 8 tokens / 4 verify steps: spec_verify_ct wins over spec_accept_length
    assert res.start <= res.end and set(doc["ttft_ms"]) == {"mean", "p50", "p90", "p99", "max"}
    # time per output token: each request's (latency - TTFT) / 7 tokens after the first
    assert res.tpots() == [pytest.approx((r.latency - r.ttft) / 7) for r in res.ok]
    assert 0 < doc["tpot_ms"]["p50"] <= doc["tpot_ms"]["p90"] <= doc["tpot_ms"]["max"]
    # 4 chunks of 2 tokens each, 5 ms apart: 3 inter-token latencies a request, one per chunk
    assert all(len(r.itls) == 3 for r in res.ok) and 3 <= doc["itl_ms"]["p50"] <= doc["itl_ms"]["max"]


@pytest.mark.parametrize("server", ["chunked"], indirect=True)
def test_one_connection_per_slot_is_kept_open_across_warmup_and_load(server):
    """A server that keeps its connections (HTTP/1.1 chunked streams, as uvicorn serves sglang): each of the 2
    slots opens one connection and sends all its requests on it, warm-up included; through an SSH forward that
    is one channel per slot instead of one per request. The server's own first-token time comes back too."""
    res = run_load(server.url, LoadSpec(requests=6, concurrency=2, input_len=3, max_new_tokens=8, warmup=2))
    doc = res.to_json()
    assert (server.n, server.connections) == (8, 2)
    assert (doc["failed"], doc["output_tokens"]) == (0, 48)
    assert doc["server_ttft_ms"]["p50"] == pytest.approx(server.step * 1000)
    assert doc["ttft_ms"]["p50"] >= doc["server_ttft_ms"]["p50"]


@pytest.mark.parametrize("server", ["stream"], indirect=True)
def test_a_server_that_closes_each_connection_gets_a_new_one_per_request(server):
    """A server that closes after each answer: the next request opens a new connection (before its clock), and
    nothing fails."""
    doc = run_load(server.url, LoadSpec(requests=4, concurrency=2, input_len=3, max_new_tokens=8, warmup=0)).to_json()
    assert (server.n, server.connections, doc["failed"]) == (4, 4, 0)


@pytest.mark.parametrize("server", ["json"], indirect=True)
def test_a_server_that_does_not_stream_has_no_ttft(server):
    res = run_load(server.url, LoadSpec(requests=3, concurrency=1, input_len=2, max_new_tokens=4, warmup=0))
    doc = res.to_json()
    assert (doc["output_tokens"], doc["streamed"], doc["ttft_ms"], doc["accept_len"]) == (12, False, None, None)
    assert doc["tpot_ms"] is None  # no first token seen apart: no time per output token after it
    assert doc["itl_ms"] is None and all(r.itls == () for r in res.results)  # no chunks: no gaps between them


@pytest.mark.parametrize("server", ["flaky"], indirect=True)
def test_failed_requests_are_counted_with_their_error(server):
    doc = run_load(server.url, LoadSpec(requests=4, concurrency=1, input_len=2, max_new_tokens=4, warmup=0)).to_json()
    assert (doc["requests"], doc["failed"], doc["output_tokens"]) == (4, 2, 8)
    assert doc["errors"] and doc["errors"][0].startswith("HTTP 500")


@pytest.mark.parametrize("server", ["fail"], indirect=True)
def test_a_load_where_every_request_fails_raises(server):
    with pytest.raises(LoadFailed, match="every warm-up request failed: HTTP 500"):
        run_load(server.url, LoadSpec(requests=2, concurrency=1, input_len=2, max_new_tokens=4, warmup=1))
    with pytest.raises(LoadFailed, match="every request failed"):
        run_load(server.url, LoadSpec(requests=2, concurrency=1, input_len=2, max_new_tokens=4, warmup=0))


def test_nothing_listening_is_a_load_failure():
    with pytest.raises(LoadFailed, match="every request failed"):
        run_load("http://127.0.0.1:9", LoadSpec(requests=1, concurrency=1, input_len=1, max_new_tokens=1, warmup=0),
                 timeout=5)


def test_local_host_tunnel_is_the_port_itself():
    assert LocalHost().open_tunnel("127.0.0.1", 30000) == 30000
    LocalHost().close_tunnel(30000)


# ----------------------------------------------------------------------------------------------------------------
# the time window of aggregate


def _rec(t, pid=1, acc=2, cyc=10.0, mode="decode"):
    return json.dumps({"v": 1, "t": t, "host": "h", "pid": pid, "rank": 0, "worker": "W", "mode": mode, "bs": 1,
                       "cycle_ms": cyc, "timer": "cpu", "phases": {"draft": cyc / 2}, "accepted": acc})


def test_aggregate_keeps_only_records_inside_the_window(tmp_path):
    f = tmp_path / "h-1-rank0.jsonl"
    lines = [_rec(100.0 + i * 0.1, cyc=float(i + 1)) for i in range(20)]  # t = 100.0 .. 101.9
    lines.insert(5, '{"v": 1, "t": "late"}')  # a bad line anywhere still counts as bad
    f.write_text("\n".join(lines) + "\n")
    whole = aggregate([str(f)])
    assert (whole.records, whole.skipped_lines) == (20, 1)
    win = aggregate([str(f)], t_min=100.5, t_max=101.0)
    assert (win.records, win.skipped_lines) == (6, 1)  # t = 100.5 .. 101.0, both ends included
    g = win.group("decode")
    assert g.n == 6 and g.cycle.max == 11.0 and g.cycle.p50 == 8.5
    # the gap before the window's first record is not measured from a record outside it
    assert g.between is not None and g.between.n == 5
    # skip counts within the window
    assert aggregate([str(f)], t_min=100.5, t_max=101.0, skip=2).group("decode").n == 4
    assert aggregate([str(f)], t_min=100.5).records == 15
    assert aggregate([str(f)], t_max=100.05).records == 1
    assert aggregate([str(f)], t_min=200.0).groups == ()
    with pytest.raises(UsageError, match="window is empty"):
        aggregate([str(f)], t_min=2.0, t_max=1.0)


def test_the_servers_own_acceptance_histogram():
    """sglang's meta_info.spec_correct_drafts_histogram (verify steps by drafts accepted, bonus not counted; the
    older name spec_accept_histogram is read too) summed over the requests: the server's own profile, in the
    shape report prints (at least 1, 2, ... tokens)."""
    from eaglepatch.tuning.load import LoadResult
    from eaglepatch.tuning.load_http import _finish

    a = _finish({"meta_info": {"completion_tokens": 10, "spec_correct_drafts_histogram": [1, 2, 1]}}, 0.0, 1.0, None,
                streamed=False)
    b = _finish({"meta_info": {"completion_tokens": 4, "spec_accept_histogram": [2, 0, 0, 1]}}, 0.0, 1.0, None,
                streamed=False)
    c = _finish({"meta_info": {"completion_tokens": 4, "spec_correct_drafts_histogram": ["x"]}}, 0.0, 1.0, None,
                streamed=False)
    assert a.draft_hist == (1, 2, 1) and b.draft_hist == (2, 0, 0, 1) and c.draft_hist is None
    lr = LoadResult(LoadSpec(), 0.0, 1.0, (a, b, c), streamed=False)
    # 3 steps with 0 drafts, 2 with 1, 1 with 2, 1 with 3: 7 request-cycles
    assert lr.server_acceptance == {"samples": 7, "at_least": [1.0, round(4 / 7, 4), round(2 / 7, 4), round(1 / 7, 4)]}
    assert lr.to_json()["server_acceptance"] == lr.server_acceptance
    assert LoadResult(LoadSpec(), 0.0, 1.0, (c,), streamed=False).server_acceptance is None


@pytest.mark.parametrize("age, warmup, said", [
    (0.0, 4, True), (FRESH_S - 1, LAUNCH_WARMUP - 1, True), (-0.4, 0, True),  # a clock a little behind: 0 s
    (FRESH_S, 4, False), (10.0, LAUNCH_WARMUP, False), (10.0, 100, False),
])
def test_a_load_on_a_fresh_server_with_a_short_warm_up_is_noted(age: float, warmup: int, said: bool) -> None:
    note = fresh_server_note(age, warmup)
    assert (note is not None) == said
    if said:
        assert f"started {max(age, 0):.0f} s before the load" in note and f"only {warmup} request(s)" in note
        assert note.endswith(f"give --warmup {LAUNCH_WARMUP}")
