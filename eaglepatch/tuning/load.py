"""A fixed, seeded synthetic load against a running sglang server's ``/generate`` (what ``eaglepatch bench`` sends).

Standard library only (urllib, a thread pool). Each request is ``input_len`` token ids drawn from a seeded
generator (the same seed gives the same prompts, so two runs see the same work) and asks for exactly
``max_new_tokens`` tokens (``ignore_eos``, greedy), streamed (``"stream": true``) so that the time to the first
token is seen. A server that does not stream (a plain JSON answer) still counts; its TTFT is then null.

Measured per request: latency (send to last byte), TTFT (send to the first streamed chunk that carries output),
``completion_tokens`` and ``spec_accept_length`` / ``spec_verify_ct`` from ``meta_info``. Overall: output tokens
per second = all completion tokens / the wall time from the first request sent to the last answer read.
``warmup`` requests go first (same shape, other prompts) and count for nothing.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import http.client
import json
import math
import random
import socket
import threading
import time
import urllib.parse
from typing import Any, Callable, Sequence

from eaglepatch.errors import Unsupported, UsageError

# token ids drawn for prompts: low ids exist in every vocabulary, and 0-9 (often special tokens) are avoided
_TOKEN_LO, _TOKEN_HI = 10, 1000
_MAX_ERRORS_KEPT = 5
# A load shorter than this measures a start-up transient as much as the server: bench and sweep say so.
SHORT_LOAD_S = 5.0


def short_load_note(seconds: float) -> str:
    return (f"the load ran for only {seconds:.1f} s: too short to measure a server steadily (a start-up transient "
            f"or one pause weighs heavily); raise --requests or --max-new-tokens so that it runs "
            f"{SHORT_LOAD_S:.0f} s or more")


# The unmeasured requests after each launch of a sweep, unless --warmup says otherwise: a fresh server's first
# requests ran slower (on the H200 the first launch of each step count spent more time between cycles in its first 8
# to 24 requests at 4 at a time, likely kernels compiled or first used), and a warm-up of 2 left that in the
# measured load (docs/real-gpu.md, "The restart sweep with a warm-up of 32 requests after each launch").
LAUNCH_WARMUP = 32
# A load on a server younger than this, warmed by fewer requests than LAUNCH_WARMUP, gets a note (fresh_server_note).
FRESH_S = 300.0


def fresh_server_note(age_s: float, warmup: int) -> str | None:
    """What to say of a load that began ``age_s`` seconds after its server started, after ``warmup`` requests."""
    if age_s >= FRESH_S or warmup >= LAUNCH_WARMUP:
        return None
    return (f"the server started {max(age_s, 0):.0f} s before the load and only {warmup} request(s) warmed it: a "
            f"fresh launch's first requests run slower (on the H200 up to 9%); give --warmup {LAUNCH_WARMUP}")


class LoadFailed(Unsupported):
    """Every request of the load failed: the server does not serve ``/generate`` as sglang does."""


@dataclasses.dataclass(frozen=True)
class LoadSpec:
    """The load: ``requests`` measured requests, ``concurrency`` at a time, each ``input_len`` prompt tokens and
    ``max_new_tokens`` output tokens, after ``warmup`` unmeasured ones. Raises UsageError for values out of range."""

    requests: int = 32
    concurrency: int = 4
    input_len: int = 128
    max_new_tokens: int = 128
    warmup: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        for name, low in (("requests", 1), ("concurrency", 1), ("input_len", 1), ("max_new_tokens", 1),
                          ("warmup", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise UsageError(f"--{name.replace('_', '-')} must be a whole number >= {low}, not {value!r}")

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def prompts(self, n: int, offset: int = 0) -> list[list[int]]:
        """``n`` prompts of ``input_len`` token ids; prompt ``i`` depends only on the seed and ``offset + i``."""
        out = []
        for i in range(offset, offset + n):
            rng = random.Random(f"eaglepatch-load:{self.seed}:{i}")
            out.append([rng.randrange(_TOKEN_LO, _TOKEN_HI) for _ in range(self.input_len)])
        return out


@dataclasses.dataclass(frozen=True)
class RequestResult:
    """One request: ``ok`` or ``error``; times in seconds (``ttft`` None without streaming)."""

    ok: bool
    start: float
    latency: float
    ttft: float | None = None
    completion_tokens: int = 0
    accept_len: float | None = None
    verify_ct: int | None = None
    error: str | None = None
    streamed: bool = False
    server_ttft: float | None = None  # the server's own view of the first token (its meta_info.e2e_latency)
    # the server's own count of verify steps by drafts accepted (meta_info.spec_correct_drafts_histogram: index =
    # correct drafts, bonus token not counted)
    draft_hist: tuple[int, ...] | None = None


def _dist(values: Sequence[float]) -> dict[str, float] | None:
    """``{"mean","p50","p90","p99","max"}`` in milliseconds of seconds ``values``; None when empty."""
    if not values:
        return None
    s = sorted(values)

    def pct(q: float) -> float:
        k = (len(s) - 1) * q / 100.0
        f = math.floor(k)
        c = min(f + 1, len(s) - 1)
        return s[f] + (s[c] - s[f]) * (k - f)

    return {"mean": round(sum(s) / len(s) * 1000, 3), "p50": round(pct(50) * 1000, 3),
            "p90": round(pct(90) * 1000, 3), "p99": round(pct(99) * 1000, 3), "max": round(s[-1] * 1000, 3)}


@dataclasses.dataclass(frozen=True)
class LoadResult:
    """What a load measured, client side. ``start``/``end``: wall-clock (``time.time``) bounds of the measured
    requests (warm-up excluded): the window whose timing-log records belong to this load. ``elapsed``: the same
    span by the monotonic clock (what tokens per second divides by)."""

    spec: LoadSpec
    start: float
    end: float
    results: tuple[RequestResult, ...]
    streamed: bool
    elapsed: float | None = None

    @property
    def ok(self) -> tuple[RequestResult, ...]:
        return tuple(r for r in self.results if r.ok)

    @property
    def failed(self) -> int:
        return len(self.results) - len(self.ok)

    @property
    def seconds(self) -> float:
        return max(0.0, self.elapsed if self.elapsed is not None else self.end - self.start)

    @property
    def output_tokens(self) -> int:
        return sum(r.completion_tokens for r in self.ok)

    @property
    def tokens_per_s(self) -> float | None:
        return self.output_tokens / self.seconds if self.ok and self.seconds > 0 else None

    @property
    def accept_len(self) -> float | None:
        """The server's accept length over the load: all tokens / all verify steps when the server gives
        ``spec_verify_ct``, else the token-weighted mean of ``spec_accept_length``; None when it gives neither."""
        with_ct = [r for r in self.ok if r.verify_ct]
        if with_ct and len(with_ct) == len(self.ok):
            return sum(r.completion_tokens for r in with_ct) / sum(r.verify_ct or 0 for r in with_ct)
        with_len = [r for r in self.ok if r.accept_len is not None and r.completion_tokens > 0]
        if not with_len:
            return None
        return sum(r.accept_len * r.completion_tokens for r in with_len) / sum(r.completion_tokens for r in with_len)  # type: ignore[operator]

    @property
    def server_acceptance(self) -> dict[str, Any] | None:
        """The server's own acceptance profile over the load, from the requests' ``spec_correct_drafts_histogram``
        summed (a verify step that accepted ``d`` drafts produced ``d + 1`` tokens): ``{"samples", "at_least"}``
        as ``report`` shows its own; None when the server gives no histogram."""
        total: list[int] = []
        for r in self.ok:
            for d, n in enumerate(r.draft_hist or ()):
                if d >= len(total):
                    total.extend([0] * (d + 1 - len(total)))
                total[d] += n
        samples = sum(total)
        if not samples:
            return None
        at_least, left = [], samples
        for n in total:
            at_least.append(round(left / samples, 4))
            left -= n
        return {"samples": samples, "at_least": at_least}

    def tpots(self) -> list[float]:
        """Each streamed request's time per output token after the first (seconds): (latency - TTFT) / (tokens -
        1), for the requests of two tokens or more."""
        return [(r.latency - r.ttft) / (r.completion_tokens - 1) for r in self.ok
                if r.ttft is not None and r.completion_tokens > 1]

    def errors(self) -> list[str]:
        seen: list[str] = []
        for r in self.results:
            if r.error and r.error not in seen:
                seen.append(r.error)
        return seen[:_MAX_ERRORS_KEPT]

    def to_json(self) -> dict[str, Any]:
        ok = self.ok
        ttfts = [r.ttft for r in ok if r.ttft is not None]
        acc = self.accept_len
        tps = self.tokens_per_s
        return {
            "requests": len(self.results),
            "failed": self.failed,
            "output_tokens": self.output_tokens,
            "seconds": round(self.seconds, 4),
            "tokens_per_s": None if tps is None else round(tps, 3),
            "ttft_ms": _dist(ttfts) if self.streamed else None,
            "server_ttft_ms": _dist([r.server_ttft for r in ok if r.server_ttft is not None]),
            "latency_ms": _dist([r.latency for r in ok]),
            "tpot_ms": _dist(self.tpots()) if self.streamed else None,
            "accept_len": None if acc is None else round(acc, 4),
            "server_acceptance": self.server_acceptance,
            "streamed": self.streamed,
            "errors": self.errors(),
        }


class _Client:
    """POSTs to one server, one persistent HTTP/1.1 connection per thread (a concurrency slot): through an SSH
    forward, a new connection is a new SSH channel (a round trip), so each slot opens its connection once, before
    its clock starts, and every request is timed from the moment it is written on an open connection. A server
    that closes the connection after an answer gets a new one, opened again before the next request's clock.

    Each request goes out in one write on a TCP_NODELAY socket: http.client writes a request's head and body
    separately, and through a forward Nagle's algorithm and a delayed ACK then hold the body back by up to 40 ms
    (measured: TTFT 86 ms through loopback SSH against 42 ms locally, one request at a time). No proxies (the
    target is a loopback address or a tunnel)."""

    def __init__(self, base_url: str, api_key: str | None, timeout: float):
        parts = urllib.parse.urlsplit(base_url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.path = (parts.path.rstrip("/") or "") + "/generate"
        self.url = base_url.rstrip("/") + "/generate"
        netloc = f"[{self.host}]" if ":" in self.host else self.host
        self.head = (f"POST {self.path} HTTP/1.1\r\nHost: {netloc}:{self.port}\r\n"
                     "Content-Type: application/json\r\nConnection: keep-alive\r\n"
                     + (f"Authorization: Bearer {api_key}\r\n" if api_key else ""))
        self.timeout = timeout
        self._local = threading.local()
        self._lock = threading.Lock()
        self._all: list[socket.socket] = []
        self.connects = 0  # connections opened

    def _sock(self) -> socket.socket:
        sock = getattr(self._local, "sock", None)
        if sock is None:
            sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._local.sock = sock
            with self._lock:
                self._all.append(sock)
                self.connects += 1
        return sock

    def _drop(self) -> None:
        sock = getattr(self._local, "sock", None)
        self._local.sock = None
        if sock is not None:
            sock.close()

    def close(self) -> None:
        with self._lock:
            socks, self._all = self._all, []
        for s in socks:
            s.close()

    def generate(self, ids: list[int], max_new_tokens: int, stream: bool, clock: Callable[[], float],
                 rid: str | None = None) -> RequestResult:
        """One request (``rid``: its request id, sglang's ``"rid"``; the server makes one when None)."""
        doc: dict[str, Any] = {
            "input_ids": ids,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True},
            "stream": stream,
        }
        if rid is not None:
            doc["rid"] = rid
        body = json.dumps(doc).encode()
        request = (self.head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body
        try:
            sock = self._sock()  # opened (when it must be) before the clock starts
        except OSError as exc:
            return RequestResult(False, clock(), 0.0, error=f"{type(exc).__name__}: {exc}")
        t0 = clock()
        try:
            sock.sendall(request)
            resp = http.client.HTTPResponse(sock, method="POST")
            try:
                resp.begin()
                if resp.status >= 400:
                    detail = resp.read()[:200].decode("utf-8", "replace").strip()
                    result = RequestResult(False, t0, clock() - t0,
                                           error=f"HTTP {resp.status}: {detail or resp.reason}")
                elif stream and "event-stream" in (resp.getheader("Content-Type") or ""):
                    result = self._read_stream(resp, t0, clock)
                else:
                    data = resp.read()
                    latency = clock() - t0
                    doc = json.loads(data)
                    if isinstance(doc, list):
                        doc = doc[0] if doc else {}
                    result = _finish(doc, t0, latency, None, streamed=False)
                resp.read()  # the rest of the answer: the connection is reused only once it is read whole
                if resp.will_close:
                    self._drop()
            finally:
                resp.close()
            return result
        except (OSError, ValueError, http.client.HTTPException) as exc:
            self._drop()
            return RequestResult(False, t0, clock() - t0, error=f"{type(exc).__name__}: {exc}")

    def _read_stream(self, resp: Any, t0: float, clock: Callable[[], float]) -> RequestResult:
        """sglang's streamed ``/generate``: ``data: {json}`` lines (cumulative text and meta_info), then
        ``data: [DONE]``. TTFT: the first chunk whose ``completion_tokens`` is above 0 (or that has text)."""
        ttft = server_ttft = None
        last: dict[str, Any] = {}
        while True:
            line = resp.readline()
            now = clock()  # the chunk's arrival, before it is parsed
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                break
            doc = json.loads(payload)
            if isinstance(doc, list):
                doc = doc[0] if doc else {}
            if not isinstance(doc, dict):
                continue
            if doc.get("error"):
                return RequestResult(False, t0, clock() - t0, error=f"server error: {str(doc['error'])[:200]}")
            meta = doc.get("meta_info") or {}
            if ttft is None and ((meta.get("completion_tokens") or 0) > 0 or doc.get("text")):
                ttft = now - t0
                e2e = meta.get("e2e_latency")
                server_ttft = float(e2e) if isinstance(e2e, (int, float)) and not isinstance(e2e, bool) else None
            last = doc
        latency = clock() - t0
        if not last:
            return RequestResult(False, t0, latency, error="the stream ended without a result")
        return dataclasses.replace(_finish(last, t0, latency, ttft, streamed=True), server_ttft=server_ttft)


def _finish(doc: Any, t0: float, latency: float, ttft: float | None, streamed: bool) -> RequestResult:
    meta = (doc.get("meta_info") or {}) if isinstance(doc, dict) else {}
    tokens = meta.get("completion_tokens")
    if not isinstance(tokens, int):
        return RequestResult(False, t0, latency, error="no meta_info.completion_tokens in the answer", streamed=streamed)
    acc = meta.get("spec_accept_length")
    ct = meta.get("spec_verify_ct")
    hist = meta.get("spec_correct_drafts_histogram", meta.get("spec_accept_histogram"))  # the older name: an alias
    ok_hist = isinstance(hist, list) and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in hist)
    return RequestResult(
        True, t0, latency, ttft=ttft, completion_tokens=tokens,
        accept_len=float(acc) if isinstance(acc, (int, float)) and not isinstance(acc, bool) and acc > 0 else None,
        verify_ct=int(ct) if isinstance(ct, int) and not isinstance(ct, bool) and ct > 0 else None,
        streamed=streamed, draft_hist=tuple(hist) if ok_hist and hist else None,
    )


def run_load(
    base_url: str,
    spec: LoadSpec,
    *,
    api_key: str | None = None,
    stream: bool = True,
    timeout: float = 600.0,
    progress: Callable[[str], None] | None = None,
    pause: float = 0.0,
    clock: Callable[[], float] = time.perf_counter,
    wall: Callable[[], float] = time.time,
) -> LoadResult:
    """Send ``spec``'s load to the sglang server at ``base_url`` (``http://127.0.0.1:PORT``) and measure it.

    ``pause``: seconds to wait between the warm-up and the measured requests.
    Never raises for a failed request (it is counted, with its error); raises ``LoadFailed`` (exit 4) when every
    warm-up or every measured request failed (the message carries the first error).
    """
    client = _Client(base_url, api_key, timeout)
    say = progress or (lambda _l: None)
    streamed = threading.Event()
    # one pool for the warm-up and the load: its threads, and their open connections, carry over
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=spec.concurrency)

    def batch(prompts: list[list[int]]) -> list[RequestResult]:
        results = list(pool.map(lambda ids: client.generate(ids, spec.max_new_tokens, stream, clock), prompts))
        if any(r.streamed for r in results):
            streamed.set()
        return results

    try:
        return _load(spec, batch, base_url, say, pause, clock, wall, streamed)
    finally:
        pool.shutdown(wait=True)
        client.close()


def _load(spec: LoadSpec, batch: Callable[[list[list[int]]], list[RequestResult]], base_url: str,
          say: Callable[[str], None], pause: float, clock: Callable[[], float], wall: Callable[[], float],
          streamed: threading.Event) -> LoadResult:
    if spec.warmup:
        say(f"warm-up: {spec.warmup} request(s)")
        warm = batch(spec.prompts(spec.warmup, offset=1_000_000))
        if not any(r.ok for r in warm):
            raise LoadFailed(f"{base_url}/generate: every warm-up request failed: {warm[0].error}")
        if pause > 0:
            time.sleep(pause)
    say(f"load: {spec.requests} request(s), {spec.concurrency} at a time, {spec.input_len} tokens in, "
        f"{spec.max_new_tokens} out")
    start, t0 = wall(), clock()
    results = batch(spec.prompts(spec.requests))
    end, elapsed = wall(), clock() - t0
    if not any(r.ok for r in results):
        raise LoadFailed(f"{base_url}/generate: every request failed: {results[0].error}")
    return LoadResult(spec=spec, start=start, end=end, results=tuple(results), streamed=streamed.is_set(),
                      elapsed=elapsed)


def run_window(
    base_url: str,
    spec: LoadSpec,
    seconds: float,
    rid_prefix: str,
    *,
    offset: int = 0,
    api_key: str | None = None,
    stream: bool = True,
    timeout: float = 600.0,
    clock: Callable[[], float] = time.perf_counter,
    wall: Callable[[], float] = time.time,
) -> LoadResult:
    """A window of load lasting ``seconds``: ``spec.concurrency`` slots each send ``spec``'s requests (the ``i``-th
    request of the window gets prompt ``offset + i``: a window of its own ``offset`` sends prompts no other window
    sent, so that no window finds another's in the server's prefix cache) back to back until the time is up; those
    under way then finish, and count. Request ``i``'s id is ``rid_prefix + str(i)``.

    Never raises for a failed request; raises ``LoadFailed`` when every request failed."""
    client = _Client(base_url, api_key, timeout)
    streamed = threading.Event()
    lock = threading.Lock()
    counter = iter(range(1 << 62))
    results: list[RequestResult] = []
    t0 = clock()

    def slot() -> None:
        while clock() - t0 < seconds:
            with lock:
                i = next(counter)
            r = client.generate(spec.prompts(1, offset=offset + i)[0], spec.max_new_tokens, stream, clock,
                                f"{rid_prefix}{i}")
            if r.streamed:
                streamed.set()
            with lock:
                results.append(r)

    start = wall()
    threads = [threading.Thread(target=slot, name=f"eaglepatch-window-{k}", daemon=True)
               for k in range(spec.concurrency)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        client.close()
    end, elapsed = wall(), clock() - t0
    if not any(r.ok for r in results):
        raise LoadFailed(f"{base_url}/generate: every request failed: "
                         f"{results[0].error if results else 'no request was sent'}")
    return LoadResult(spec=spec, start=start, end=end, results=tuple(sorted(results, key=lambda r: r.start)),
                      streamed=streamed.is_set(), elapsed=elapsed)
