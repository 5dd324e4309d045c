"""``bench`` on one target: a seeded load (``eaglepatch.tuning.load``) on the running server through a forwarded port
(``Host.open_tunnel``; a local target is loaded directly), then the timing records of the server's processes whose
``t`` lies in the load's window (measured on the host's clock), aggregated as ``report`` does, with the prediction
of the other step counts (``report --predict``). The patch's runtime writes its records in batches (every 2 s at
the latest), so bench waits ``log_wait`` seconds after the load before it fetches them.
"""

from __future__ import annotations

import dataclasses
import glob
import math
import os
import time
from typing import Any, Callable, Sequence

from eaglepatch.errors import Unsupported, UsageError
from eaglepatch.hosts.base import Host
from eaglepatch.hosts.spec import TargetSpec
from eaglepatch.redact import mask_argv
from eaglepatch.report.labels import CLIENT, CYCLE, MEANING, WALL
from eaglepatch.tuning.load import (
    FRESH_S, LAUNCH_WARMUP, SHORT_LOAD_S, LoadSpec, fresh_server_note, run_load, short_load_note, sized_by_duration,
)
from eaglepatch.ops.lifecycle import launch_of
from eaglepatch.ops.logs import fetch_logs_from, logs_of
from eaglepatch.ops.target import Connect, Target, target_facts
from eaglepatch.tuning import traffic as tr
from eaglepatch.tuning.target_url import LoadURL, check_side, load_route
from eaglepatch.transform.recipe import builtin_recipe

Say = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class BenchOptions:
    """The load, and how long to wait after it for the server's timing records (``--log-wait``); ``ladder``: the
    concurrencies measured in turn (``--concurrency 1,8,32,64``), the load's own first; empty: the load's alone.
    ``rates``: the request rates measured in turn (``--request-rate 2,8,32``: open loops), the load's own first;
    one ladder or the other, never both."""

    load: LoadSpec = LoadSpec()
    log_wait: float = 4.5
    request_timeout: float = 600.0
    ladder: tuple[int, ...] = ()
    rates: tuple[float, ...] = ()
    # --warmup not given: a server younger than FRESH_S gets LAUNCH_WARMUP requests first (its first requests run
    # slower), any other the load's own warm-up
    auto_warmup: bool = False
    # --url: the router or load balancer the load goes through (None: the target server's own address)
    url: LoadURL | None = None
    # --requests not given: each load runs SIZED_LOAD_S at least, its requests as many as fit (load.sized_by_duration)
    sized: bool = False

    def __post_init__(self) -> None:
        if self.log_wait < 0:
            raise UsageError("--log-wait cannot be negative")
        if len(self.ladder) > 1 and len(self.rates) > 1:
            raise UsageError("--concurrency and --request-rate are both lists: measure one axis at a time (a list "
                             "of concurrencies at one request rate, or a list of request rates at one concurrency)")

    def each(self) -> list["BenchOptions"]:
        """One BenchOptions per concurrency of the ladder, or per request rate of ``rates`` (the load's alone
        without either). Each concurrency sends at least twice its concurrency in requests, so that its batch fills
        up (``--requests 32`` at 64 at a time would never have 64 in flight); each rate sends ``--requests``
        arrivals."""
        if len(self.rates) > 1:
            return [dataclasses.replace(self, load=dataclasses.replace(self.load, request_rate=r), rates=())
                    for r in self.rates]
        return [dataclasses.replace(self, load=dataclasses.replace(
            self.load, concurrency=c, requests=max(self.load.requests, 2 * c)), ladder=())
            for c in self.ladder] if len(self.ladder) > 1 else [self]

    def load_json(self) -> dict[str, Any]:
        """The load as a sweep keeps it (what makes two sweeps' figures comparable): ``LoadSpec.to_json``, and the
        ladder (of concurrencies, or of request rates) when there is one."""
        doc = self.load.to_json()
        if len(self.ladder) > 1:
            doc["concurrency_ladder"] = list(self.ladder)
        if len(self.rates) > 1:
            doc["request_rate_ladder"] = list(self.rates)
        if self.url is not None:  # another way in is another load; kept masked (the state file is printed)
            doc["url"] = self.url.shown
        return doc


def parse_concurrency(text: str) -> tuple[int, ...]:
    """``--concurrency``: ``8``, or a ladder ``1,8,32,64`` (whole numbers from 1, each once, in increasing order
    as measured). Raises UsageError."""
    try:
        values = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or any(v < 1 for v in values):
        raise UsageError(f"--concurrency {text!r}: give requests in flight as a whole number from 1, or a list "
                         "like 1,8,32,64")
    return tuple(sorted(set(values)))


def parse_request_rate(text: str) -> tuple[float, ...]:
    """``--request-rate``: ``8`` (requests per second, Poisson arrivals), or a ladder ``2,8,32`` (positive finite
    numbers, each once, in increasing order as measured). Raises UsageError."""
    values = []
    for x in str(text).split(","):
        try:
            v = float(x)
        except ValueError:
            v = math.nan
        if not math.isfinite(v) or v <= 0:
            raise UsageError(f"--request-rate must be a positive number of requests per second, not {x.strip()!r}"
                             + (f" (in {text!r})" if "," in str(text) else ""))
        values.append(v)
    return tuple(sorted(set(values)))


def no_server(name: str) -> Unsupported:
    return Unsupported(f"{name}: no sglang server is running (for this sglang install): start it "
                       "(python -m sglang.launch_server ...), then run this again")


# ----------------------------------------------------------------------------------------------------------------
# bench


def patched_log_dir(facts: Any) -> str | None:
    """The timing log folder when the target is patched (its manifest says where), else None."""
    if not facts.manifest or facts.runtime_sha256 is None:
        return None
    return ((facts.manifest.get("runtime") or {}).get("log_dir")) or "/tmp/eaglepatch"


def clock_offset(host: Host, python: str, samples: int = 3) -> tuple[float, float]:
    """(the host's wall clock minus ours, its uncertainty), in seconds; (0, 0) on this machine.

    The host's clock is read in the middle of our round trip (``date``, else the interpreter); of a few tries the
    one with the shortest round trip counts, and half of that round trip is the uncertainty."""
    if host.is_local:
        return 0.0, 0.0
    best: tuple[float, float] | None = None
    for argv in (["date", "+%s.%N"], [python, "-c", "import time; print(repr(time.time()))"]):
        for _ in range(samples):
            before = time.time()
            res = host.run(argv, timeout=60)
            after = time.time()
            try:
                remote = float(res.stdout.decode().strip().splitlines()[-1])
            except (ValueError, IndexError):
                break  # no GNU date there: try the interpreter
            rtt = after - before
            if best is None or rtt / 2 < best[1]:
                best = (remote - (before + after) / 2, rtt / 2)
        if best is not None:
            return best
    return 0.0, 0.0


def bench_on(host: Host, name: str, python: str, server: Any, log_dir: str | None, opts: BenchOptions,
             say: Say) -> dict[str, Any]:
    """Load ``server`` (a ServerProcess) on ``host`` and collect the timing records of the load's window."""
    offset, unc = clock_offset(host, python)
    # the load's requests go to --url when given (the router or load balancer in front of the server), else to the
    # server's own port; what is read of the server itself (its start, its timing records) comes from the target
    with load_route(host, name, server, opts.url) as route:
        if opts.auto_warmup and server.started_at is not None and opts.load.warmup < LAUNCH_WARMUP:
            age = time.time() + offset - server.started_at
            if age < FRESH_S:
                say(f"the server started {max(age, 0):.0f} s ago: {LAUNCH_WARMUP} warm-up requests first (a fresh "
                    "launch's first requests run slower; --warmup N sets it)")
                opts = dataclasses.replace(opts, load=dataclasses.replace(opts.load, warmup=LAUNCH_WARMUP))
        if opts.sized:
            opts = dataclasses.replace(opts, load=sized_by_duration(opts.load))
        if opts.url is not None:
            say(f"the load goes through {route.shown}")
        # the pause after the warm-up keeps its cycles out of the window, widened by the clock's uncertainty
        lr = run_load(route.base_url, opts.load, api_key=server.api_key, progress=say, connect=route.connect,
                      timeout=opts.request_timeout, pause=2 * unc + 0.05 if opts.load.warmup else 0.0)
    window = (lr.start + offset - unc, lr.end + offset + unc)
    notes: list[str] = []
    if opts.url is not None:
        notes.append(f"the load went through {route.shown}: the client's figures are of every server behind it, "
                     "the timing records of the target's server alone")
    timings = None
    extra: dict[str, Any] = {}
    if log_dir is None:
        notes.append("the target is not patched: no per-phase timings (eaglepatch apply TARGET first)")
    else:
        timings = collect_timings(host, name, python, log_dir, {server.pid, *server.children}, window,
                                  opts.log_wait, say, notes, argv=server.argv, extra=extra)
    if lr.seconds < SHORT_LOAD_S:
        notes.append(short_load_note(lr.seconds))
    # the load's start on the host's clock against the server's start there
    fresh = (fresh_server_note(lr.start + offset - server.started_at, opts.load.warmup)
             if server.started_at is not None else None)
    if fresh:
        notes.append(fresh)
    if not lr.streamed:
        notes.append("the server did not stream: time to first token is unknown (null)")
    if lr.failed:
        notes.append(f"{lr.failed} of {len(lr.results)} requests failed: {'; '.join(lr.errors())}")
    waited = lr.waits()
    if waited and waited["requests"]:
        notes.append(f"{waited['requests']} of {len(lr.results)} arrivals found {opts.load.concurrency} requests in "
                     f"flight and waited for a slot ({waited['seconds']:.2f} s in all): at "
                     f"{opts.load.request_rate:g} requests/s the cap --concurrency {opts.load.concurrency} held them "
                     "back, and the load was that much less an open loop (raise --concurrency to send each at its "
                     "arrival)")
    shared = extra.get("traffic")
    if shared is not None:  # decode cycles of the window carried requests not the load's (the server's own traffic)
        differ = tr.compare(shared)
        if differ:  # said only when the two differ beyond their spreads ("traffic" in the JSON either way)
            notes.append(differ)
    doc = {
        "target": name,
        "server": {"pid": server.pid, "argv": mask_argv(server.argv)},  # printed: secrets masked (redact)
        # request_rate: null for a closed loop, and the prompts and sampling always (LoadSpec.to_json leaves them
        # out then, for sweeps' identities)
        # sized by duration: "min_seconds", and the requests it sent
        "load": dict(opts.load.to_json(), request_rate=opts.load.request_rate, **opts.load.sampling_json(),
                     **({"url": opts.url.shown} if opts.url is not None else {}),
                     **({"requests": len(lr.results)} if opts.sized else {})),
        "categories": lr.categories(),
        "window": {"start": round(window[0], 4), "end": round(window[1], 4), "seconds": round(lr.seconds, 4),
                   "clock_offset_s": round(offset, 4), "clock_uncertainty_s": round(unc, 4)},
        "client": lr.to_json(),
        "timings": timings,
        "notes": notes,
    }
    if shared is not None:
        doc["traffic"] = tr.traffic_json(shared)
    return doc


# After the load, each rank's timing log is written again once its buffer falls due (the runtime writes every
# flush_seconds, 2 s, at the latest, and resolves a cycle waiting for its CUDA events after 0.05 s of quiet, before it
# writes): a write RECORDS_MARGIN_S past the window's end (host clock, its uncertainty included) holds every cycle of
# the window. How often bench looks, within --log-wait:
RECORDS_MARGIN_S = 0.25
RECORDS_POLL_S = 0.25


def wait_for_records(host: Host, python: str, log_dir: str, pids: set[int], end: float, limit: float,
                     clock: Callable[[], float] = time.monotonic,
                     sleep: Callable[[float], None] = time.sleep) -> float:
    """Wait until every rank of ``pids`` with a timing log has written it RECORDS_MARGIN_S past ``end`` (the
    load's window's end, host clock), ``limit`` seconds at most (``--log-wait``: also when a rank writes nothing
    more, or its log's time cannot be read); the seconds waited."""
    from eaglepatch.errors import HelperFailed
    from eaglepatch.hosts.agent import call

    t0 = clock()
    while True:
        left = limit - (clock() - t0)
        if left <= 0:
            return clock() - t0
        sleep(min(RECORDS_POLL_S, left))
        try:
            ranks = call(host, python, "log_times", timeout=60, log_dir=log_dir, pids=sorted(pids))["ranks"]
            done = bool(ranks) and all(float(r["mtime"]) >= end + RECORDS_MARGIN_S for r in ranks)
        except (HelperFailed, KeyError, TypeError, ValueError):
            done = False  # looked at again, until the limit
        if done:
            return clock() - t0


def collect_timings(host: Host, name: str, python: str, log_dir: str, pids: set[int],
                    window: tuple[float, float], wait: float, say: Say, notes: list[str],
                    argv: Sequence[str] = (), extra: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The ``report --predict --json`` object of the records of ``pids`` whose ``t`` lies in ``window`` (the server's
    command line ``argv`` gives the step count where the records' run header does not); None (and a note) when
    there are none. ``extra["traffic"]``: ``traffic.of_files`` of the same records, where some decode cycles
    carried requests not the load's."""
    from eaglepatch import report as rep
    from eaglepatch.server.argv import parse_flags, server_args_of
    from eaglepatch.report.predict import MIN_CYCLES, predict

    if wait > 0:
        said = wait_for_records(host, python, log_dir, pids, window[1], wait)
        say(f"waited {said:.1f} s for the server to write its timing records")
    try:
        folder = fetch_logs_from(host, name, python, log_dir, lambda _m: None, pids=pids)
    except UsageError as exc:
        notes.append(f"no timing logs: {exc}")
        return None
    # every host folder the logs came from has a subfolder of the cache (the runtime's private one too)
    files = logs_of(sorted(glob.glob(os.path.join(folder, "**", "*.jsonl"), recursive=True)), pids)
    if not files:
        notes.append(f"no timing log of the server's processes in {log_dir}: is the running server the patched "
                     "one (restarted after apply)?")
        return None
    res = rep.aggregate(files, t_min=window[0], t_max=window[1], sources=[f"{name}:{log_dir}"])
    if res.records == 0:
        notes.append("no timing records inside the load's window (the server timed no cycle then)")
        return None
    if extra is not None:
        shared = tr.of_files(files, window)
        if shared is not None:
            extra["traffic"] = shared
    doc = res.to_json()
    flags = parse_flags(server_args_of(argv)) if argv else None
    for gd, pred in zip(doc["groups"], predict(res, flags=flags, min_cycles=MIN_CYCLES)):
        if pred is not None:
            gd.update(pred.to_json())
    return doc


def bench(spec: TargetSpec, c: Connect, opts: BenchOptions, say: Say) -> dict[str, Any]:
    with Target(spec, c) as t:
        facts = target_facts(t, builtin_recipe())
        server = launch_of(facts, c.facts.server_ports)
        if server is None:
            raise no_server(t.spec.name)
        check_side(t.spec.name, server.disaggregation, f"the server on :{server.port} (pid {server.pid})", opts.url,
                   "bench")
        docs = []
        for one in opts.each():
            if len(opts.ladder) > 1:
                say(f"{t.spec.name}: {one.load.concurrency} request(s) at a time")
            elif len(opts.rates) > 1:
                say(f"{t.spec.name}: {one.load.request_rate:g} request(s) per second")
            docs.append(bench_on(t.host, t.spec.name, facts.python, server, patched_log_dir(facts), one, say))
        return docs[0] if len(docs) == 1 else {"target": t.spec.name, "loads": docs}


def _ms(d: dict[str, Any] | None, key: str = "p50") -> str:
    return "-" if not d or d.get(key) is None else f"{d[key]:.1f}"


def render_bench(doc: dict[str, Any]) -> str:
    """bench's text: the client's figures, the timing report of the same window and its prediction; one after the
    other for a ladder of concurrencies (or of request rates), then a line per concurrency (per rate)."""
    if "loads" in doc:
        parts = [render_bench(d) for d in doc["loads"]]
        by_rate = len({d["load"].get("request_rate") for d in doc["loads"]}) > 1
        if by_rate:
            rows = [f"  {d['load']['request_rate']:>6g} requests/s: {d['client']['tokens_per_s']} {CLIENT}, "
                    f"time per output token p50 {_ms(d['client'].get('tpot_ms'))} ms"
                    for d in doc["loads"]]
        else:
            rows = [f"  {d['load']['concurrency']:>4} at a time: {d['client']['tokens_per_s']} {CLIENT}"
                    for d in doc["loads"]]
        return ("\n\n".join(parts) + f"\n\n{doc['target']}: by {'request rate' if by_rate else 'concurrency'}\n"
                + "\n".join(rows))
    from eaglepatch import report as rep

    cl = doc["client"]
    load = doc["load"]
    rate = load.get("request_rate")
    how = (f"arriving at {rate:g}/s (Poisson), at most {load['concurrency']} in flight" if rate is not None
           else f"{load['concurrency']} at a time")
    if load.get("min_seconds"):
        how += f", sized to run {load['min_seconds']:g} s or more"
    if load.get("prompts", "random-ids") == "random-ids":
        what = f"{load['input_len']} random token ids in, {load['max_new_tokens']} out"
    else:
        what = f"prompts {load['prompts']}, up to {load['max_new_tokens']} out"
    if load.get("temperature", 0) or load.get("top_p", 1) != 1:
        what += f", temperature {load['temperature']:g}, top-p {load['top_p']:g}"
    out = [
        f"{doc['target']}: {cl['requests']} requests ({how}, {what}) in {cl['seconds']:.2f} s; {cl['failed']} failed",
        f"  {CLIENT}: {cl['tokens_per_s'] if cl['tokens_per_s'] is not None else '-'} ({MEANING[CLIENT]})",
        f"  TTFT ms:    p50 {_ms(cl['ttft_ms'])}  p90 {_ms(cl['ttft_ms'], 'p90')}  p99 {_ms(cl['ttft_ms'], 'p99')}  "
        f"max {_ms(cl['ttft_ms'], 'max')}",
        f"  latency ms: p50 {_ms(cl['latency_ms'])}  p90 {_ms(cl['latency_ms'], 'p90')}  "
        f"max {_ms(cl['latency_ms'], 'max')}",
        f"  time per output token ms: p50 {_ms(cl.get('tpot_ms'))}  p90 {_ms(cl.get('tpot_ms'), 'p90')}  "
        f"p99 {_ms(cl.get('tpot_ms'), 'p99')}",
        f"  inter-token latency ms (between streamed chunks): p50 {_ms(cl.get('itl_ms'))}  "
        f"p90 {_ms(cl.get('itl_ms'), 'p90')}  p99 {_ms(cl.get('itl_ms'), 'p99')}",
        f"  accept length (server): {cl['accept_len'] if cl['accept_len'] is not None else '-'}",
    ]
    lens = cl.get("output_len")
    if lens:
        eos = {True: " (end of sequence ignored)", False: " (end of sequence honoured)"}.get(load.get("ignore_eos"), "")
        out.append(f"  output tokens per request: p50 {lens['p50']:g}  p90 {lens['p90']:g}  min {lens['min']}  "
                   f"max {lens['max']:g}{eos}")
    out += _render_categories(doc.get("categories") or {})
    waited = cl.get("waited")
    if waited is not None:
        out.append(f"  waited for a slot: {waited['requests']} of {cl['requests']} arrivals, {waited['seconds']:.2f} s "
                   f"in all (longest {waited['max_ms']:.1f} ms)")
    sa = cl.get("server_acceptance")
    if sa:
        shares = "  ".join(f"{i + 1}: {x:.2f}" for i, x in enumerate(sa["at_least"]))
        out.append(f"  acceptance (server's histogram, {sa['samples']} request-cycles): at least {shares}")
    t = doc.get("timings")
    if t:
        out.append(f"\ntiming log of the same window ({t['records']} cycles; {WALL}: {MEANING[WALL]}; {CYCLE}: "
                   f"{MEANING[CYCLE]}):")
        out.append(rep.render_table(rep.ReportResult.from_json(t)))
        for g in t.get("groups") or []:
            pts, best = g.get("predict") or [], g.get("predict_best")
            here = next((p for p in pts if p["basis"] == "measured" and p["steps"]), None)
            if best is not None and here is not None:
                b = pts[best]
                what = "no speculation" if b["steps"] == 0 else f"{b['steps']} steps"
                out.append(f"predicted best: {what}, {b['tokens_per_s']:.1f} {WALL} ({b['basis']}) against "
                           f"{here['tokens_per_s']:.1f} {WALL} at the {here['steps']} steps measured (report "
                           "--predict for every step count)")
    for n in doc.get("notes") or []:
        out.append(f"note: {n}")
    return "\n".join(out)


def _render_categories(cats: dict[str, Any]) -> list[str]:
    """A line per prompt category, when the load had more than one."""
    if len(cats) < 2:
        return []
    out = ["  by prompt category:"]
    for name, c in cats.items():
        acc = "-" if c.get("accept_len") is None else f"{c['accept_len']:.2f}"
        tps = "-" if c.get("tokens_per_s") is None else f"{c['tokens_per_s']:.1f}"
        line = f"    {name:<14} {c['requests']:>4} requests  {tps:>8} {CLIENT}  accept length {acc}"
        sa = c.get("acceptance")
        if sa:
            line += "  acceptance, at least " + "  ".join(f"{i + 1}: {x:.2f}" for i, x in enumerate(sa["at_least"])
                                                          if i)
        out.append(line)
    return out
