"""The open loop of ``eaglepatch bench --request-rate`` and the inter-token latency of a streamed load
(eaglepatch/tuning/load.py), against small in-process HTTP servers; the rate ladder of bench's options and of a
sweep's summary (eaglepatch/tuning/bench.py, sweep_summary.py)."""

from __future__ import annotations

import json
import socket
import statistics
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from eaglepatch.errors import UsageError
from eaglepatch.tuning import sweep as sw
from eaglepatch.tuning import sweep_summary
from eaglepatch.tuning.bench import BenchOptions, parse_request_rate, render_bench
from eaglepatch.tuning.load import LoadResult, LoadSpec, RequestResult, run_load


class _Server:
    """``/generate`` streamed as sglang streams it (cumulative ``completion_tokens`` in ``meta_info``, then
    ``data: [DONE]``), on connections kept open. ``chunks``: ``(sleep before it, completion_tokens)`` per chunk;
    ``before``: seconds every request takes before its first chunk. Counts the requests in flight at once, the
    most of them (``peak``) and each request's arrival (``arrived``, by the server's monotonic clock)."""

    def __init__(self, chunks: list[tuple[float, int]], before: float = 0.0):
        self.chunks, self.before = chunks, before
        self.in_flight = self.peak = 0
        self.arrived: list[float] = []
        self.lock = threading.Lock()
        outer = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def setup(self):
                super().setup()
                # as uvicorn serves sglang: each chunk goes out as written (Nagle's algorithm would hold a small
                # chunk back until the client acknowledges the one before, up to its delayed ACK's 40 ms)
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                with outer.lock:
                    outer.arrived.append(time.monotonic())
                    outer.in_flight += 1
                    outer.peak = max(outer.peak, outer.in_flight)
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    time.sleep(outer.before)
                    for wait, tokens in outer.chunks:
                        time.sleep(wait)
                        data = b"data: " + json.dumps({"text": " tok" * tokens, "meta_info": {
                            "completion_tokens": tokens}}).encode() + b"\n\n"
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                        self.wfile.flush()
                finally:
                    # the request leaves the count before its last bytes go: the client's next one may follow them
                    with outer.lock:
                        outer.in_flight -= 1
                self.wfile.write(b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")
                self.wfile.flush()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def make_server():
    made: list[_Server] = []

    def make(*a, **kw) -> _Server:
        made.append(_Server(*a, **kw))
        return made[-1]

    yield make
    for s in made:
        s.close()


# ----------------------------------------------------------------------------------------------------------------
# the schedule


def test_the_poisson_schedule_is_seeded_and_its_gaps_average_one_over_the_rate():
    spec = LoadSpec(request_rate=8.0, seed=3)
    at = spec.arrivals(20000)
    assert at[0] == 0.0 and all(b > a for a, b in zip(at, at[1:]))
    gaps = [b - a for a, b in zip(at, at[1:])]
    assert statistics.mean(gaps) == pytest.approx(1 / 8, rel=0.03)
    # exponential: its standard deviation is its mean (a fixed or uniform spacing would not be)
    assert statistics.pstdev(gaps) == pytest.approx(1 / 8, rel=0.05)
    assert spec.arrivals(50) == LoadSpec(request_rate=8.0, seed=3).arrivals(50) == at[:50]
    assert spec.arrivals(50) != LoadSpec(request_rate=8.0, seed=4).arrivals(50)
    # the same seed at another rate: the same schedule, scaled
    assert LoadSpec(request_rate=2.0, seed=3).arrivals(50) == pytest.approx([4 * t for t in at[:50]])
    with pytest.raises(ValueError):
        LoadSpec().arrivals(3)


@pytest.mark.parametrize("bad", [0, 0.0, -1.0, float("nan"), float("inf"), True, "4"])
def test_a_request_rate_must_be_a_positive_finite_number(bad):
    with pytest.raises(UsageError, match="--request-rate must be a positive number of requests per second, not"):
        LoadSpec(request_rate=bad)


def test_a_closed_loads_json_is_what_it_was_before_request_rates():
    """A sweep's identity, and the name of its saved state file, hash LoadSpec.to_json: a closed loop's must not
    change, so that sweeps saved before resume; an open loop's differs by its rate."""
    assert json.dumps(LoadSpec().to_json(), sort_keys=True) == (
        '{"concurrency": 4, "input_len": 128, "max_new_tokens": 128, "requests": 32, "seed": 0, "warmup": 4}')
    assert LoadSpec(request_rate=2.5).to_json()["request_rate"] == 2.5
    assert LoadSpec(request_rate=2.5).to_json() != LoadSpec(request_rate=5).to_json()


@pytest.mark.parametrize("text, rates", [("4", (4.0,)), ("32,2,8", (2.0, 8.0, 32.0)), ("0.5,0.5", (0.5,))])
def test_parse_request_rate(text, rates):
    assert parse_request_rate(text) == rates


@pytest.mark.parametrize("text", ["", "0", "-2", "x", "4,", "nan", "inf", "2,0"])
def test_parse_request_rate_refuses(text):
    with pytest.raises(UsageError, match="--request-rate must be a positive number of requests per second"):
        parse_request_rate(text)


# ----------------------------------------------------------------------------------------------------------------
# the open loop against a server


def test_an_open_loop_sends_each_request_at_its_arrival(make_server):
    """At 40 requests/s with room for all (no cap reached), the server sees the requests at the seeded schedule's
    times, not back to back as a closed loop sends them."""
    srv = make_server([(0.0, 1), (0.005, 2)])
    spec = LoadSpec(requests=12, concurrency=12, input_len=2, max_new_tokens=2, warmup=0, request_rate=40.0, seed=1)
    res = run_load(srv.url, spec)
    seen = [t - srv.arrived[0] for t in srv.arrived]
    planned = spec.arrivals(12)
    assert len(seen) == 12
    assert max(abs(a - b) for a, b in zip(seen, planned)) < 0.02, (seen, planned)
    assert planned[-1] > 0.1  # the schedule spreads them over more than a closed loop's few ms
    doc = res.to_json()
    assert doc["request_rate"] == 40.0 and doc["waited"] == {"requests": 0, "seconds": 0.0, "max_ms": 0.0}
    # the load's time runs from the first arrival to the last answer
    assert planned[-1] <= res.seconds < planned[-1] + 0.5


def test_concurrency_caps_an_open_loop_and_the_waits_are_counted(make_server):
    """At 1000 requests/s against a server that takes 40 ms a request, with --concurrency 2: the server never has
    more than 2 in flight (counted there), and the arrivals that found 2 in flight waited, and say so."""
    srv = make_server([(0.04, 4)])
    spec = LoadSpec(requests=10, concurrency=2, input_len=2, max_new_tokens=4, warmup=2, request_rate=1000.0)
    res = run_load(srv.url, spec)
    assert len(srv.arrived) == 12 and srv.peak == 2
    doc = res.to_json()
    assert (doc["failed"], doc["output_tokens"]) == (0, 40)
    w = doc["waited"]
    # all arrive within about 10 ms: 2 go at once, the 8 others wait for a slot, the last about 4 x 40 ms
    assert w["requests"] == 8 and 0.4 < w["seconds"] < 3.0 and 100 < w["max_ms"] < 1000
    assert sum(r.queued > 0 for r in res.results) == 8
    # latency counts from the send, not from the arrival: every request took about 40 ms however long it waited
    assert all(0.035 < r.latency < 0.2 for r in res.results)
    assert res.seconds > 4 * 0.04  # 5 rounds of 2


def test_a_closed_loop_keeps_its_shape_and_has_no_waits(make_server):
    srv = make_server([(0.01, 2)])
    res = run_load(srv.url, LoadSpec(requests=4, concurrency=2, input_len=2, max_new_tokens=2, warmup=0))
    doc = res.to_json()
    assert "request_rate" not in doc and "waited" not in doc and res.waits() is None
    assert srv.peak == 2


# ----------------------------------------------------------------------------------------------------------------
# inter-token latency


@pytest.mark.serial  # its gaps are timed on this machine: alone, not beside the parallel tests
def test_inter_token_latency_is_the_gap_between_chunks_that_carry_new_output(make_server):
    """A stream of 1 token, then 3 (two tokens in one chunk, as an accepted draft gives) 30 ms later, a chunk
    that adds nothing 10 ms after that, then 6 tokens 50 ms later: two inter-token latencies, 30 and 60 ms (the
    empty chunk is no token; the 2-token chunk is one gap, as bench_serving counts it)."""
    srv = make_server([(0.0, 1), (0.03, 3), (0.01, 3), (0.05, 6)], before=0.02)
    res = run_load(srv.url, LoadSpec(requests=3, concurrency=1, input_len=2, max_new_tokens=6, warmup=0))
    for r in res.ok:
        assert len(r.itls) == 2
        assert 0.029 <= r.itls[0] < 0.029 + 0.025 and 0.059 <= r.itls[1] < 0.059 + 0.025, r.itls
        assert r.ttft >= 0.02
    doc = res.to_json()
    itl = doc["itl_ms"]
    assert set(itl) == {"mean", "p50", "p90", "p99", "max"}
    assert sorted(res.itls()) == sorted(g for r in res.ok for g in r.itls) and len(res.itls()) == 6
    assert 29 <= itl["p50"] < itl["p90"] <= itl["p99"] <= itl["max"] < 90
    # per token it would be less: TPOT spreads the 110 ms after the first token over its 5 tokens
    assert doc["tpot_ms"]["p50"] < itl["p50"]


def test_render_bench_shows_the_inter_token_latency_and_the_open_loop():
    lr = LoadResult(LoadSpec(request_rate=4.0, concurrency=2, requests=3), 0.0, 1.0, (
        RequestResult(True, 0.0, 0.5, ttft=0.1, completion_tokens=5, streamed=True, itls=(0.1, 0.1, 0.2)),
        RequestResult(True, 0.0, 0.5, ttft=0.1, completion_tokens=5, streamed=True, itls=(0.1,), queued=0.25),
        RequestResult(True, 0.0, 0.5, ttft=0.1, completion_tokens=5, streamed=True, itls=(0.3,), queued=0.5),
    ), streamed=True, elapsed=1.0)
    client = lr.to_json()
    assert client["itl_ms"]["p50"] == 100.0 and client["itl_ms"]["max"] == 300.0
    assert client["waited"] == {"requests": 2, "seconds": 0.75, "max_ms": 500.0}
    one = {"target": "gpu1", "load": dict(lr.spec.to_json()), "client": client, "timings": None, "notes": []}
    text = render_bench(one)
    assert "arriving at 4/s (Poisson), at most 2 in flight" in text
    assert "inter-token latency ms (between streamed chunks): p50 100.0  p90" in text
    assert "waited for a slot: 2 of 3 arrivals, 0.75 s in all (longest 500.0 ms)" in text
    two = dict(one, load=dict(one["load"], request_rate=16.0), client=dict(client, tokens_per_s=99.0))
    ladder = render_bench({"target": "gpu1", "loads": [one, two]})
    assert "gpu1: by request rate" in ladder and "    16 requests/s: 99.0 client tok/s" in ladder


# ----------------------------------------------------------------------------------------------------------------
# a ladder of request rates


def test_a_ladder_of_request_rates_is_measured_rate_by_rate():
    base = LoadSpec(requests=16, concurrency=8, request_rate=2.0)
    opts = BenchOptions(load=base, rates=(2.0, 8.0, 32.0))
    each = opts.each()
    assert [o.load.request_rate for o in each] == [2.0, 8.0, 32.0]
    assert all(o.load.requests == 16 and o.load.concurrency == 8 and o.rates == () for o in each)
    assert opts.load_json()["request_rate_ladder"] == [2.0, 8.0, 32.0]
    assert opts.load_json()["request_rate"] == 2.0
    # one rate: the load alone; a ladder of concurrencies at one rate still works
    assert BenchOptions(load=base).each() == [BenchOptions(load=base)]
    conc = BenchOptions(load=base, ladder=(8, 16)).each()
    assert [(o.load.concurrency, o.load.request_rate) for o in conc] == [(8, 2.0), (16, 2.0)]
    with pytest.raises(UsageError, match="one axis at a time"):
        BenchOptions(load=base, ladder=(1, 8), rates=(2.0, 8.0))


def test_a_sweep_over_request_rates_is_summarised_per_rate():
    """Each launch measured 2 and 8 requests/s (each run's loads carry request_rate, at one concurrency cap): per
    point and rate the median, speedups at the same rate, the best per rate, a table per rate."""
    pts = sw.make_points(sw.parse_grid(["speculative-num-steps=3"]), (), True)

    def run(p, rep, t2, t8):
        loads = [{"concurrency": 16, "request_rate": r, "tokens_per_s": t, "accept_len": None, "phases_p50": {}}
                 for r, t in ((2.0, t2), (8.0, t8))]
        return {"point": p.key, "rep": rep, "status": "ok", "tokens_per_s": t2, "accept_len": None,
                "phases_p50": {}, "request_rate": 2.0, "loads": loads}

    runs = [run(pts[0], 0, 250.0, 1000.0), run(pts[1], 0, 260.0, 900.0)]
    doc = sweep_summary.summarize("gpu1", pts, runs, baseline=True, repeat=1)
    assert doc["best_by_load"] == [{"concurrency": 16, "request_rate": 2.0, "best": 1},
                                   {"concurrency": 16, "request_rate": 8.0, "best": 0}]
    spec = doc["points"][1]
    assert [(ld["request_rate"], ld["tokens_per_s"]["median"], ld["speedup"]) for ld in spec["loads"]] == [
        (2.0, 260.0, 1.04), (8.0, 900.0, 0.9)]
    text = sweep_summary.render_table(doc)
    assert "at 8 request(s) per second (Poisson arrivals, at most 16 in flight" in text
    at8 = text.split("at 8 request(s) per second")[1].splitlines()
    assert any(line.startswith("*0") and "1000.0" in line for line in at8)
    bench = {"load": {"request_rate": 8.0}, "client": {"tokens_per_s": 1.0}}
    assert sweep_summary.run_figures(bench)["request_rate"] == 8.0
    assert "request_rate" not in sweep_summary.run_figures({"load": {"request_rate": None}, "client": {}})
