"""The load's two loops besides a plain closed batch (eaglepatch/tuning/load.py's ``run_load`` picks one): the open
loop of ``--request-rate`` (``open_loop``) and the closed loop sized by duration (``closed_until``, bench without
``--requests``). Each sends through a callable and reads a clock it is given, so the tests drive them on a fake
clock and a fake server."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import threading
import time
from typing import Any, Callable, Sequence

from eaglepatch.tuning.load_http import Request, RequestResult

LoadSpec = Any  # eaglepatch.tuning.load.LoadSpec (which imports this module): its concurrency, arrivals, draw


def open_loop(pool: concurrent.futures.Executor, spec: LoadSpec, prompts: Sequence[Any],
              send: Callable[[Any], RequestResult], clock: Callable[[], float],
              sleep: Callable[[float], None] = time.sleep) -> list[RequestResult]:
    """``prompts`` sent at ``spec.arrivals`` (an open loop, its first arrival now), through ``pool`` (at least
    ``spec.concurrency`` workers): a request that arrives while ``spec.concurrency`` are in flight waits for one to
    end, and its result carries that wait (``queued``, seconds); its latency and TTFT count from its send, the wait
    apart, as sglang's bench_serving counts them under ``--max-concurrency``. The results in the prompts' order."""
    slots = threading.Semaphore(spec.concurrency)

    def one(ids: Any, waited: float) -> RequestResult:
        try:
            r = send(ids)
        finally:
            slots.release()
        return dataclasses.replace(r, queued=waited) if waited > 0 else r

    futures = []
    held_until = -math.inf  # when the dispatcher last came out of a wait for a slot
    t0 = clock()
    for ids, due in zip(prompts, spec.arrivals(len(prompts))):
        arrival = t0 + due
        left = arrival - clock()
        if left > 0:
            sleep(left)
        blocked = not slots.acquire(blocking=False)
        if blocked:
            slots.acquire()
        now = clock()
        # it waited when it found every slot taken, or when it arrived while the dispatcher waited for an earlier
        # arrival's slot (every slot was taken then too)
        waited = max(now - arrival, 1e-9) if blocked or arrival < held_until else 0.0
        if blocked:
            held_until = now
        futures.append(pool.submit(one, ids, waited))
    return [f.result() for f in futures]


def closed_until(pool: concurrent.futures.Executor, spec: LoadSpec, send: Callable[[Request], RequestResult],
                 clock: Callable[[], float]) -> list[RequestResult]:
    """A closed loop sized by duration: ``spec.concurrency`` slots (``pool`` has that many workers) each send the
    load's next request as soon as their last is answered (request ``i`` is ``spec.draw``'s ``i``-th, as in a load of
    a fixed count) while fewer than ``spec.requests`` were sent or less than ``spec.min_seconds`` has passed since
    the first; those under way then finish, and count. Past ``spec.requests``, no request is added once one has
    failed (a failing server is not hammered for the whole duration). The results in the requests' order."""
    lock = threading.Lock()
    results: dict[int, RequestResult] = {}
    sent, failed = [0], [False]
    t0 = clock()

    def slot() -> None:
        while True:
            with lock:
                i = sent[0]
                if i >= spec.requests and (failed[0] or clock() - t0 >= (spec.min_seconds or 0.0)):
                    return
                sent[0] = i + 1
            r = send(spec.draw(1, offset=i)[0])
            with lock:
                results[i] = r
                failed[0] = failed[0] or not r.ok

    for f in [pool.submit(slot) for _ in range(spec.concurrency)]:
        f.result()
    return [results[i] for i in sorted(results)]
