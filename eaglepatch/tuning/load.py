"""A fixed, seeded load against a running sglang server (what ``eaglepatch bench`` sends).

Standard library only (urllib, a thread pool). The prompts (``LoadSpec.prompt_source``, ``--prompts``): a set of text
prompts and chat messages (``eaglepatch.tuning.prompts``: a built-in set or the user's own file), drawn in a seeded
order, text to ``/generate`` as ``text`` and messages to the OpenAI-compatible ``/v1/chat/completions`` (so that the
model's chat template applies), each asking for its own ``max_tokens`` or ``max_new_tokens``, the model's end of
sequence honoured unless ``ignore_eos``; or ``random-ids``: ``input_len`` token ids drawn from a seeded generator,
exactly ``max_new_tokens`` out (``ignore_eos``). The same seed gives the same requests, so two runs see the same
work. Sampling: ``temperature`` and ``top_p`` (greedy by default). Every request is streamed (``"stream": true``) so
that the time to the first token is seen. A server that does not stream (a plain JSON answer) still counts; its
TTFT is then null.

Measured per request: latency (send to last byte), TTFT (send to the first streamed chunk that carries output),
the inter-token latencies (the gaps between successive streamed chunks that carry new output: with speculative
decoding one chunk may carry several tokens, and the gap is still one, as sglang's and vLLM's ``bench_serving``
count it), ``completion_tokens`` and ``spec_accept_length`` / ``spec_verify_ct`` from ``meta_info``. Overall:
output tokens per second = all completion tokens / the wall time from the first request sent to the last answer
read. ``warmup`` requests go first (same shape, other prompts) and count for nothing.

Closed loop (the default): ``concurrency`` requests in flight, each slot sending its next as soon as its last is
answered. Open loop (``request_rate``): the measured requests arrive as a Poisson process at that many requests per
second (seeded exponential gaps: the same seed gives the same schedule), each sent at its arrival unless
``concurrency`` are in flight already; it then waits for a slot (those waits are counted and reported). The warm-up
stays a closed loop.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import random
import threading
import time
from typing import Any, Callable, Sequence

from eaglepatch.errors import Unsupported, UsageError
from eaglepatch.tuning.load_http import Request, RequestResult, _Client
from eaglepatch.tuning.load_loops import closed_until, open_loop
from eaglepatch.tuning.prompts import RANDOM_IDS, PromptSet, load_prompts
from eaglepatch.tuning.target_url import masked_url

# token ids drawn for prompts: low ids exist in every vocabulary, and 0-9 (often special tokens) are avoided
_TOKEN_LO, _TOKEN_HI = 10, 1000
_MAX_ERRORS_KEPT = 5
# A load shorter than this measures a start-up transient as much as the server: bench and sweep say so.
SHORT_LOAD_S = 5.0
# bench without --requests runs its load this long at least (sized_by_duration): twice what short_load_note asks for,
# so that no server, however fast, gets that note on the README's path
SIZED_LOAD_S = 2 * SHORT_LOAD_S


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
    """The load: ``requests`` measured requests, ``concurrency`` at a time, each ``max_new_tokens`` output tokens
    (or its prompt's own ``max_tokens``), after ``warmup`` unmeasured ones. ``request_rate``: an open loop, Poisson
    arrivals at that many requests per second (``concurrency`` then caps what is in flight); None: a closed loop.
    ``prompt_source``: ``--prompts`` (``random-ids``: ``input_len`` random token ids each; else a set read at once
    into ``prompt_set``), ``temperature`` and ``top_p`` the sampling sent, ``ignore_eos`` None for the source's default
    (``eos_ignored``). ``min_seconds``: a load sized by duration (``sized_by_duration``): a closed loop then sends
    ``requests`` at least and goes on until it has run that long. Raises UsageError for values out of range and for a
    bad ``--prompts``."""

    requests: int = 32
    concurrency: int = 4
    input_len: int = 128
    max_new_tokens: int = 128
    warmup: int = 4
    seed: int = 0
    request_rate: float | None = None
    prompt_source: str = RANDOM_IDS
    temperature: float = 0.0
    top_p: float = 1.0
    ignore_eos: bool | None = None
    prompt_set: PromptSet | None = dataclasses.field(default=None, compare=False, repr=False)
    min_seconds: float | None = None

    def __post_init__(self) -> None:
        for name, low in (("requests", 1), ("concurrency", 1), ("input_len", 1), ("max_new_tokens", 1),
                          ("warmup", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise UsageError(f"--{name.replace('_', '-')} must be a whole number >= {low}, not {value!r}")
        rate = self.request_rate
        if rate is not None and (not isinstance(rate, (int, float)) or isinstance(rate, bool)
                                 or not math.isfinite(rate) or rate <= 0):
            raise UsageError(f"--request-rate must be a positive number of requests per second, not {rate!r}")
        t, top = self.temperature, self.top_p
        if not isinstance(t, (int, float)) or isinstance(t, bool) or not math.isfinite(t) or t < 0:
            raise UsageError(f"--temperature must be a number from 0 (greedy), not {t!r}")
        if not isinstance(top, (int, float)) or isinstance(top, bool) or not math.isfinite(top) or not 0 < top <= 1:
            raise UsageError(f"--top-p must be a number above 0 and at most 1, not {top!r}")
        low_s = self.min_seconds
        if low_s is not None and (not isinstance(low_s, (int, float)) or isinstance(low_s, bool)
                                  or not math.isfinite(low_s) or low_s <= 0):
            raise UsageError(f"a load's duration must be a positive number of seconds, not {low_s!r}")
        if not isinstance(self.prompt_source, str):
            raise UsageError(f"--prompts must name a file or a built-in set, not {self.prompt_source!r}")
        if self.prompt_set is None or self.prompt_set.source != self.prompt_source:
            object.__setattr__(self, "prompt_set", load_prompts(self.prompt_source))

    @property
    def eos_ignored(self) -> bool:
        """``ignore_eos`` as sent: as given, else ignored for ``random-ids`` and honoured for text prompts."""
        return self.ignore_eos if self.ignore_eos is not None else self.prompt_set is None

    @property
    def token_soup(self) -> bool:
        """The load before --prompts existed: random token ids, greedy, ``ignore_eos``."""
        return (self.prompt_set is None and self.temperature == 0 and self.top_p == 1
                and self.eos_ignored)

    def sampling_json(self) -> dict[str, Any]:
        """``{"prompts", "temperature", "top_p", "ignore_eos"}`` (and ``"prompts_digest"`` for a set: what its
        prompts are), as bench's ``load`` carries them."""
        doc: dict[str, Any] = {"prompts": self.prompt_source, "temperature": self.temperature, "top_p": self.top_p,
                               "ignore_eos": self.eos_ignored}
        if self.prompt_set is not None:
            doc["prompts_digest"] = self.prompt_set.digest
        return doc

    def to_json(self) -> dict[str, Any]:
        """The load's fields (what a sweep's identity, and its saved state file, are keyed on). ``request_rate``
        only when set, and the prompts and sampling only when they are not the random token ids, greedy, of the
        load before they existed: such a load's is what it always was. ``input_len`` only for random token ids."""
        doc: dict[str, Any] = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                               if f.name not in ("prompt_source", "temperature", "top_p", "ignore_eos", "prompt_set")}
        if self.request_rate is None:
            del doc["request_rate"]
        if self.min_seconds is None:
            del doc["min_seconds"]
        if not self.token_soup:
            doc.update(self.sampling_json())
        if self.prompt_set is not None:
            del doc["input_len"]
        return doc

    def describe(self) -> str:
        """What each request is, for progress lines: ``128 tokens in, 128 out`` or ``prompts mixed, up to 128 out``."""
        if self.prompt_set is None:
            return f"{self.input_len} tokens in, {self.max_new_tokens} out"
        return f"prompts {self.prompt_source}, up to {self.max_new_tokens} out"

    def draw(self, n: int, offset: int = 0) -> list[Request]:
        """The requests ``offset`` to ``offset + n - 1``: request ``i`` depends only on the seed and ``i`` (random
        token ids, ``prompts``, or the set's ``i``-th prompt in its seeded order)."""
        sampling = dict(temperature=float(self.temperature), top_p=float(self.top_p), ignore_eos=self.eos_ignored)
        if self.prompt_set is None:
            return [Request(self.max_new_tokens, ids=ids, category=RANDOM_IDS, **sampling)  # type: ignore[arg-type]
                    for ids in self.prompts(n, offset)]
        return [Request(p.max_tokens or self.max_new_tokens, text=p.text, messages=p.messages, category=p.category,
                        **sampling)  # type: ignore[arg-type]
                for p in self.prompt_set.draw(self.seed, n, offset)]

    def arrivals(self, n: int) -> list[float]:
        """The open loop's schedule: ``n`` arrival times in seconds after the first (which is at 0), the gaps drawn
        from an exponential distribution of mean ``1 / request_rate`` (a Poisson process) by a generator seeded
        with ``seed`` alone: the same seed gives the same schedule, and another rate the same one scaled."""
        if self.request_rate is None:
            raise ValueError("a closed loop has no arrival schedule")
        rng = random.Random(f"eaglepatch-rate:{self.seed}")
        out, t = [], 0.0
        for i in range(n):
            if i:
                t += rng.expovariate(self.request_rate)
            out.append(t)
        return out

    def arrivals_within(self, seconds: float) -> int:
        """How many of the open loop's arrivals (``arrivals``) come before ``seconds``, and one more: the first
        arrival at or past it (so that the load's last arrival is ``seconds`` after its first, or later)."""
        if self.request_rate is None:
            raise ValueError("a closed loop has no arrival schedule")
        rng = random.Random(f"eaglepatch-rate:{self.seed}")  # the generator and draws of ``arrivals``
        n, t = 1, 0.0
        while t < seconds:
            t += rng.expovariate(self.request_rate)
            n += 1
        return n

    def prompts(self, n: int, offset: int = 0) -> list[list[int]]:
        """``n`` prompts of ``input_len`` token ids; prompt ``i`` depends only on the seed and ``offset + i``."""
        out = []
        for i in range(offset, offset + n):
            rng = random.Random(f"eaglepatch-load:{self.seed}:{i}")
            out.append([rng.randrange(_TOKEN_LO, _TOKEN_HI) for _ in range(self.input_len)])
        return out


def sized_by_duration(spec: LoadSpec, seconds: float = SIZED_LOAD_S) -> LoadSpec:
    """``spec`` sized to run ``seconds`` at least (bench without ``--requests``): a closed loop goes on sending past
    ``spec.requests`` until ``seconds`` have passed (``closed_until``); an open loop sends the seed's arrivals of the
    first ``seconds`` (``arrivals_within``), ``spec.requests`` at least. Either way the requests are those of a load
    of that many requests: request ``i`` is the same."""
    if spec.request_rate is None:
        return dataclasses.replace(spec, min_seconds=seconds)
    return dataclasses.replace(spec, min_seconds=seconds, requests=max(spec.requests, spec.arrivals_within(seconds)))


def sizing_words(spec: LoadSpec) -> str:
    """How a load sized by duration was sized, in the words of a progress line."""
    if spec.request_rate is None:
        return (f"until {spec.min_seconds:g} s have passed, {spec.requests} at least (sized by duration: --requests N "
                "sends exactly N)")
    return (f"the seed's arrivals of {spec.min_seconds:g} s (sized by duration: --requests N sends exactly N)")


def _dist(values: Sequence[float], scale: float = 1000.0, digits: int = 3) -> dict[str, float] | None:
    """``{"mean","p50","p90","p99","max"}`` of ``values`` times ``scale`` (seconds to milliseconds by default);
    None when empty."""
    if not values:
        return None
    s = sorted(values)

    def pct(q: float) -> float:
        k = (len(s) - 1) * q / 100.0
        f = math.floor(k)
        c = min(f + 1, len(s) - 1)
        return s[f] + (s[c] - s[f]) * (k - f)

    return {"mean": round(sum(s) / len(s) * scale, digits), "p50": round(pct(50) * scale, digits),
            "p90": round(pct(90) * scale, digits), "p99": round(pct(99) * scale, digits),
            "max": round(s[-1] * scale, digits)}


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
        """The server's accept length over the load (``accept_len_of``)."""
        return accept_len_of(self.ok)

    @property
    def server_acceptance(self) -> dict[str, Any] | None:
        """The server's own acceptance profile over the load (``acceptance_of``)."""
        return acceptance_of(self.ok)

    def categories(self) -> dict[str, dict[str, Any]]:
        """Per prompt category (``--prompts``; random token ids are ``random-ids``): ``{"requests", "failed",
        "output_tokens", "tokens_per_s", "accept_len", "acceptance"}``, where ``tokens_per_s`` is the category's
        completion tokens over the whole load's seconds (its share of the load's tok/s)."""
        by: dict[str, list[RequestResult]] = {}
        for r in self.results:
            by.setdefault(r.category or RANDOM_IDS, []).append(r)
        out = {}
        for name in sorted(by):
            ok = [r for r in by[name] if r.ok]
            tokens = sum(r.completion_tokens for r in ok)
            acc = accept_len_of(ok)
            out[name] = {"requests": len(by[name]), "failed": len(by[name]) - len(ok), "output_tokens": tokens,
                         "tokens_per_s": round(tokens / self.seconds, 3) if ok and self.seconds > 0 else None,
                         "accept_len": None if acc is None else round(acc, 4), "acceptance": acceptance_of(ok)}
        return out

    def output_lens(self) -> dict[str, float] | None:
        """The output lengths (completion tokens) of the requests that succeeded: ``{"mean", "min", "p50", "p90",
        "p99", "max"}`` (with the end of sequence honoured they vary; with ``ignore_eos`` they are the lengths
        asked); None when none succeeded."""
        d = _dist([r.completion_tokens for r in self.ok], scale=1.0, digits=2)
        return None if d is None else {"min": min(r.completion_tokens for r in self.ok), **d}

    def itls(self) -> list[float]:
        """Every streamed request's inter-token latencies (seconds): the gaps between the successive chunks that
        carried new output, all requests together. A chunk that carries several tokens (speculative decoding
        accepted drafts) is one gap, as sglang's and vLLM's bench_serving count it."""
        return [g for r in self.ok for g in r.itls]

    def waits(self) -> dict[str, Any] | None:
        """An open loop's waits for a slot: ``{"requests"}`` that arrived while ``concurrency`` were in flight and
        waited, ``"seconds"`` they waited in all, ``"max_ms"`` the longest; None for a closed loop."""
        if self.spec.request_rate is None:
            return None
        q = [r.queued for r in self.results if r.queued > 0]
        return {"requests": len(q), "seconds": round(sum(q), 4), "max_ms": round(max(q) * 1000, 3) if q else 0.0}

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
        doc: dict[str, Any] = {
            "requests": len(self.results),
            "failed": self.failed,
            "output_tokens": self.output_tokens,
            "seconds": round(self.seconds, 4),
            "tokens_per_s": None if tps is None else round(tps, 3),
            "ttft_ms": _dist(ttfts) if self.streamed else None,
            "server_ttft_ms": _dist([r.server_ttft for r in ok if r.server_ttft is not None]),
            "latency_ms": _dist([r.latency for r in ok]),
            "tpot_ms": _dist(self.tpots()) if self.streamed else None,
            "itl_ms": _dist(self.itls()) if self.streamed else None,
            "accept_len": None if acc is None else round(acc, 4),
            "server_acceptance": self.server_acceptance,
            "output_len": self.output_lens(),
            "streamed": self.streamed,
            "errors": self.errors(),
        }
        if self.spec.request_rate is not None:
            doc["request_rate"] = self.spec.request_rate
            doc["waited"] = self.waits()
        return doc


def accept_len_of(ok: Sequence[RequestResult]) -> float | None:
    """The server's accept length over the requests ``ok``: all tokens / all verify steps when the server gives
    ``spec_verify_ct`` for every one, else the token-weighted mean of ``spec_accept_length``; None when it gives
    neither."""
    with_ct = [r for r in ok if r.verify_ct]
    if with_ct and len(with_ct) == len(ok):
        return sum(r.completion_tokens for r in with_ct) / sum(r.verify_ct or 0 for r in with_ct)
    with_len = [r for r in ok if r.accept_len is not None and r.completion_tokens > 0]
    if not with_len:
        return None
    return sum(r.accept_len * r.completion_tokens for r in with_len) / sum(r.completion_tokens for r in with_len)  # type: ignore[operator]


def acceptance_of(ok: Sequence[RequestResult]) -> dict[str, Any] | None:
    """The server's own acceptance profile over the requests ``ok``, from their ``spec_correct_drafts_histogram``
    summed (a verify step that accepted ``d`` drafts produced ``d + 1`` tokens): ``{"samples", "at_least"}`` as
    ``report`` shows its own; None when the server gives no histogram."""
    total: list[int] = []
    for r in ok:
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


def run_load(
    base_url: str,
    spec: LoadSpec,
    *,
    api_key: str | None = None,
    stream: bool = True,
    timeout: float = 600.0,
    progress: Callable[[str], None] | None = None,
    pause: float = 0.0,
    connect: tuple[str, int] | None = None,
    clock: Callable[[], float] = time.perf_counter,
    wall: Callable[[], float] = time.time,
) -> LoadResult:
    """Send ``spec``'s load to the sglang server at ``base_url`` (``http://127.0.0.1:PORT``) and measure it: a closed
    loop, or with ``spec.request_rate`` an open one (``open_loop``).

    ``pause``: seconds to wait between the warm-up and the measured requests. ``connect``: the (host, port) the
    load's connections open instead of ``base_url``'s (a port forwarded to it; ``target_url.load_route``).
    Never raises for a failed request (it is counted, with its error); raises ``LoadFailed`` (exit 4) when every
    warm-up or every measured request failed (the message carries the first error).
    """
    client = _Client(base_url, api_key, timeout, connect)
    say = progress or (lambda _l: None)
    streamed = threading.Event()
    # one pool for the warm-up and the load: its threads, and their open connections, carry over
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=spec.concurrency)

    def batch(reqs: list[Request]) -> list[RequestResult]:
        results = list(pool.map(lambda req: client.send(req, stream, clock), reqs))
        if any(r.streamed for r in results):
            streamed.set()
        return results

    def measured(reqs: list[Request]) -> list[RequestResult]:
        if spec.request_rate is None and spec.min_seconds is not None:
            results = closed_until(pool, spec, lambda req: client.send(req, stream, clock), clock)
            if any(r.streamed for r in results):
                streamed.set()
            return results
        if spec.request_rate is None:
            return batch(reqs)
        results = open_loop(pool, spec, reqs, lambda req: client.send(req, stream, clock), clock)
        if any(r.streamed for r in results):
            streamed.set()
        return results

    try:
        if spec.prompt_set is not None and spec.prompt_set.has_chat:
            client.find_model()
        return _load(spec, batch, measured, base_url, say, pause, clock, wall, streamed)
    finally:
        pool.shutdown(wait=True)
        client.close()


def endpoints(base_url: str, spec: LoadSpec) -> str:
    """The endpoints the load sends to, for its errors: ``http://...:PORT/generate`` (credentials in ``--url``
    masked)."""
    base, _, query = masked_url(base_url).partition("?")
    base, query = base.rstrip("/"), f"?{query}" if query else ""
    ps = spec.prompt_set
    if ps is None or not ps.has_chat:
        return f"{base}/generate{query}"
    if not ps.has_text:
        return f"{base}/v1/chat/completions{query}"
    return f"{base}{query} (/generate, /v1/chat/completions)"


def _load(spec: LoadSpec, batch: Callable[[list[Request]], list[RequestResult]],
          measured: Callable[[list[Request]], list[RequestResult]], base_url: str,
          say: Callable[[str], None], pause: float, clock: Callable[[], float], wall: Callable[[], float],
          streamed: threading.Event) -> LoadResult:
    if spec.warmup:
        say(f"warm-up: {spec.warmup} request(s)")
        warm = batch(spec.draw(spec.warmup, offset=1_000_000))
        if not any(r.ok for r in warm):
            raise LoadFailed(f"{endpoints(base_url, spec)}: every warm-up request failed: {warm[0].error}")
        if pause > 0:
            time.sleep(pause)
    if spec.request_rate is None and spec.min_seconds is not None:
        say(f"load: {spec.concurrency} at a time, {spec.describe()}, {sizing_words(spec)}")
    elif spec.request_rate is None:
        say(f"load: {spec.requests} request(s), {spec.concurrency} at a time, {spec.describe()}")
    elif spec.min_seconds is not None:
        say(f"load: {spec.requests} request(s) arriving at {spec.request_rate:g} per second (Poisson), at most "
            f"{spec.concurrency} in flight, {spec.describe()}: {sizing_words(spec)}")
    else:
        say(f"load: {spec.requests} request(s) arriving at {spec.request_rate:g} per second (Poisson), at most "
            f"{spec.concurrency} in flight, {spec.describe()}")
    start, t0 = wall(), clock()  # a closed loop's first send; an open loop's first arrival
    results = measured(spec.draw(spec.requests))  # a load sized by duration draws its own as it goes
    end, elapsed = wall(), clock() - t0
    if not any(r.ok for r in results):
        raise LoadFailed(f"{endpoints(base_url, spec)}: every request failed: {results[0].error}")
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
    connect: tuple[str, int] | None = None,
    clock: Callable[[], float] = time.perf_counter,
    wall: Callable[[], float] = time.time,
) -> LoadResult:
    """A window of load lasting ``seconds``: ``spec.concurrency`` slots each send ``spec``'s requests (the ``i``-th
    request of the window gets prompt ``offset + i``: a window of its own ``offset`` sends prompts no other window
    sent, so that no window finds another's in the server's prefix cache) back to back until the time is up; those
    under way then finish, and count. Request ``i``'s id is ``rid_prefix + str(i)``. ``connect``: as ``run_load``'s.

    Never raises for a failed request; raises ``LoadFailed`` when every request failed."""
    client = _Client(base_url, api_key, timeout, connect)
    if spec.prompt_set is not None and spec.prompt_set.has_chat:
        client.find_model()
    streamed = threading.Event()
    lock = threading.Lock()
    counter = iter(range(1 << 62))
    results: list[RequestResult] = []
    t0 = clock()

    def slot() -> None:
        while clock() - t0 < seconds:
            with lock:
                i = next(counter)
            r = client.send(spec.draw(1, offset=offset + i)[0], stream, clock, f"{rid_prefix}{i}")
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
        raise LoadFailed(f"{endpoints(base_url, spec)}: every request failed: "
                         f"{results[0].error if results else 'no request was sent'}")
    return LoadResult(spec=spec, start=start, end=end, results=tuple(sorted(results, key=lambda r: r.start)),
                      streamed=streamed.is_set(), elapsed=elapsed)
