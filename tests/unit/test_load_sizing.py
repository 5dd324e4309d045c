"""bench without ``--requests`` sizes its load by duration (issue 42): ``sized_by_duration`` and the closed loop that
goes on until the time is up (``closed_until``), on a fake clock and a fake server; the open loop's count from the
seed's arrival schedule. The requests are those of a load of a fixed count (request ``i`` the same), and a load
given its count is what it always was."""

from __future__ import annotations

import concurrent.futures
import threading

import pytest

from eaglepatch.errors import UsageError
from eaglepatch.tuning.load import (
    SHORT_LOAD_S, SIZED_LOAD_S, LoadSpec, closed_until, sized_by_duration, sizing_words,
)
from eaglepatch.tuning.load_http import RequestResult


class FakeServer:
    """Answers each request after ``seconds`` of a shared fake clock (one tick per request answered, under a lock),
    recording the prompts it was sent; ``fail_from``: the request count from which every answer fails."""

    def __init__(self, seconds: float, fail_from: int | None = None):
        self.now, self.seconds, self.fail_from = 0.0, seconds, fail_from
        self.lock = threading.Lock()
        self.sent: list[object] = []

    def clock(self) -> float:
        with self.lock:
            return self.now

    def send(self, req) -> RequestResult:
        with self.lock:
            self.sent.append(req.ids)
            self.now += self.seconds
            ok = self.fail_from is None or len(self.sent) <= self.fail_from
        return RequestResult(ok=ok, start=0.0, latency=self.seconds, completion_tokens=4 if ok else 0,
                             error=None if ok else "HTTP 500")


def run(spec: LoadSpec, srv: FakeServer) -> list[RequestResult]:
    with concurrent.futures.ThreadPoolExecutor(max_workers=spec.concurrency) as pool:
        return closed_until(pool, spec, srv.send, srv.clock)


def test_the_sized_duration_is_past_what_the_short_load_note_asks_for():
    """The README's bench never gets the short-load note: the duration it sizes to is beyond the note's."""
    assert SIZED_LOAD_S >= 2 * SHORT_LOAD_S


def test_a_fast_server_gets_requests_until_the_time_is_up():
    """0.1 s a request: 32 would take 3.2 s; sized, the loop goes on to 10 s (100 requests, and those under way at
    that moment), and sends the prompts a fixed-count load of that size sends, in the same order."""
    spec = sized_by_duration(LoadSpec(requests=32, concurrency=4, input_len=8, max_new_tokens=4))
    srv = FakeServer(0.1)
    results = run(spec, srv)
    assert spec.min_seconds == SIZED_LOAD_S and spec.requests == 32
    assert 100 <= len(results) <= 100 + spec.concurrency
    assert sorted(srv.sent) == sorted(spec.prompts(len(results)))


def test_a_slow_server_still_gets_the_minimum_count():
    """2 s a request: the 10 s pass before 32 are sent; 32 are sent all the same (never fewer than a fixed load)."""
    spec = sized_by_duration(LoadSpec(requests=32, concurrency=4, input_len=8, max_new_tokens=4))
    assert len(run(spec, FakeServer(2.0))) == 32


def test_no_request_is_added_past_the_minimum_once_one_failed():
    """A server that starts failing is not hammered for the whole duration: past the minimum, nothing more."""
    spec = sized_by_duration(LoadSpec(requests=8, concurrency=1, input_len=8, max_new_tokens=4))
    results = run(spec, FakeServer(0.01, fail_from=3))
    assert len(results) == 8 and sum(not r.ok for r in results) == 5


def test_an_open_loop_is_sized_by_the_seeds_arrivals():
    """At 2 requests/s: the seed's schedule up to its first arrival at or past 10 s (at least the count given);
    the same seed, the same count."""
    spec = LoadSpec(requests=4, concurrency=8, request_rate=2.0, input_len=8, max_new_tokens=4)
    sized = sized_by_duration(spec)
    times = sized.arrivals(sized.requests)
    assert times[-1] >= SIZED_LOAD_S > times[-2]
    assert sized.requests == sized_by_duration(spec).requests and sized.min_seconds == SIZED_LOAD_S
    assert sized_by_duration(LoadSpec(requests=500, request_rate=2.0)).requests == 500
    assert "arrivals of 10 s" in sizing_words(sized) and "--requests N" in sizing_words(sized)


def test_the_load_json_says_a_load_was_sized_and_a_given_count_is_unchanged():
    """``min_seconds`` in the load's JSON only when sized: a sweep's identity (the load's JSON) is what it was."""
    given = LoadSpec(requests=6, concurrency=2)
    assert "min_seconds" not in given.to_json()
    assert sized_by_duration(given).to_json()["min_seconds"] == SIZED_LOAD_S
    with pytest.raises(UsageError):
        LoadSpec(min_seconds=0)
