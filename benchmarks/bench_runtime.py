#!/usr/bin/env python3
"""Host overhead of the eaglepatch timing runtime, per cycle.

What it measures: a fake worker whose entry method does nothing but the hooks a patched EAGLE worker calls
in a decode cycle (the `@entry` decorator, three `begin`/`end` pairs, one `accepted` call), run `--cycles`
times, against the same method without any hooks. Both loops are timed with `time.perf_counter`; the
overhead is (hooked - bare) / cycles, the median over `--repeats` interleaved repeats. Record buffering and
the stderr summary (output discarded) are included, and so is the runtime's writer thread (which resolves
events, writes the batches to a temporary log dir and prints) as far as it competes for the GIL with the loop:
a server pays that too. Records the writer could not keep up with are dropped by the runtime, not waited for:
`records_dropped` says how many (a real server leaves the GIL far more often than this tight loop does).
It also reports the cost of an untimed call under `every=N` sampling.

`--rids none|ours|others|mixed` gives the batch's requests sglang ids (none: no `rid`, as before the runtime read
whose each request is; mixed: every fourth another client's, so that records carry `"others"` and `"others_at"`),
and `--churn` hands each cycle a new list of them (the runtime then looks into every request again: the worst case,
a membership change every cycle), the bare loop making the same list.

`--per-call 1,8,64` measures instead the runtime's cost per entry call, every call counted, under `apply --every N`
for each N given (one timed call in N, each of its records saying `"every": N`): the hooked loop at each N and the
bare loop, interleaved repeat by repeat, (hooked - bare) / calls, median over repeats. Output: {"timer",
"per_call_us": {"1": ..., "8": ..., "64": ...}, "records_written": {...}, ...}.

`--timer`:
- `cpu` (default): perf_counter only. This is the number the runtime is held to (under 20 us per cycle).
- `sync` (needs CUDA): every boundary synchronises. The bare loop does the same 8 `torch.cuda.synchronize()`
  calls per cycle (cycle start/end, three phases begin/end), so the figure is the runtime's own host cost
  over and above the synchronises it asks for; `accepted` reads a CUDA tensor (`.sum().item()`).
- `events` (needs CUDA): CUDA events plus an asynchronous copy of a CUDA `accept_lens` tensor; the bare
  loop has no CUDA calls at all, so the figure includes the event records, queries and the copy launch.

With no kernels between the boundaries, the GPU is idle: this is the host cost only, not the cost of the
serialisation a synchronise forces on a busy server (which only a real server shows).

`--runtime PATH` measures another copy of the runtime module (e.g. the one before a change:
`git show HEAD~1:eaglepatch/runtime/_eaglepatch_runtime.py > /tmp/before.py`), for before/after figures.

Output: one JSON line on stdout ({"timer", "overhead_us_per_cycle", "cycles", ...}) and one human line (on
stdout, or on stderr with `--json`). Runs from anywhere, e.g. `python benchmarks/bench_runtime.py --json`.
"""
import argparse
import contextlib
import importlib.util
import io
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

RUNTIME = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "eaglepatch", "runtime",
                       "_eaglepatch_runtime.py")


def load_runtime(path=None):
    """The runtime module, loaded from its file (no eaglepatch install needed), under a private name."""
    spec = importlib.util.spec_from_file_location("_eaglepatch_runtime_bench", os.path.normpath(path or RUNTIME))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Req(object):
    def __init__(self, rid):
        self.rid = rid


class Batch(object):
    """`n` requests: without ids (`rids` "none", as before the runtime read them), all eaglepatch's ("ours"), all
    another client's ("others"), or every fourth another client's ("mixed": the runtime then writes their places)."""

    def __init__(self, n, rids="none"):
        if rids == "none":
            self.reqs = [object() for _ in range(n)]
        else:
            self.reqs = [Req("%s-%d" % ("user" if rids == "others" or (rids == "mixed" and i % 4 == 0)
                                        else "eaglepatch-0a1b2c3d", i)) for i in range(n)]


class Output(object):
    def __init__(self, accept_lens):
        self.accept_lens = accept_lens


def make_workers(rt, out, sync):
    """(hooked worker, bare worker): the same method with and without the hooks a patch adds."""

    class HookedWorker(object):
        @rt.entry
        def forward_batch_generation(self, batch):
            rt.begin("draft", "decode")
            rt.end("draft")
            rt.begin("verify", "decode")
            rt.end("verify")
            rt.accepted(out, ("accept_lens",), 0)
            rt.begin("draft_extend", "decode")
            rt.end("draft_extend")
            return out

    class BareWorker(object):
        def forward_batch_generation(self, batch):
            return out

    class BareSyncWorker(object):
        # The synchronises the sync timer does, without the runtime: start, 3 x (begin, end), end.
        def forward_batch_generation(self, batch):
            sync()
            sync()
            sync()
            sync()
            sync()
            sync()
            sync()
            sync()
            return out

    return HookedWorker(), (BareSyncWorker() if sync is not None else BareWorker())


def time_loop(worker, batch, cycles, churn=False):
    """`cycles` calls on `batch`; with `churn`, each call on a new list of the same requests (sglang's scheduler
    filters into a new list when a request finishes: the runtime looks into the batch again), made in the bare
    loop alike."""
    f = worker.forward_batch_generation
    if churn:
        reqs = batch.reqs
        t0 = time.perf_counter()
        for _ in range(cycles):
            batch.reqs = reqs[:]
            f(batch)
        return time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(cycles):
        f(batch)
    return time.perf_counter() - t0


def measure(timer, cycles, repeats, bs, every, runtime=None, rids="none", churn=False):
    sync = None
    accept_lens = [3] * bs
    if timer != "cpu":
        try:
            import torch
        except ImportError:
            raise SystemExit("--timer %s needs torch with CUDA; torch is not installed" % timer)
        if not torch.cuda.is_available():
            raise SystemExit("--timer %s needs CUDA (torch.cuda.is_available() is False)" % timer)
        accept_lens = torch.full((bs,), 3, dtype=torch.int32, device="cuda")
        if timer == "sync":
            sync = torch.cuda.synchronize
    rt = load_runtime(runtime)
    log_dir = tempfile.mkdtemp(prefix="ep-runtime-bench-")  # not /tmp/eaglepatch*: other tools clean those
    try:
        rt.configure(mode=timer, log_dir=log_dir, summary_every=2000, flush_records=256, flush_seconds=2.0,
                     every=1)
        out = Output(accept_lens)
        batch = Batch(bs, rids)
        hooked, bare = make_workers(rt, out, sync)

        hooked_s, bare_s, untimed_s = [], [], []
        with contextlib.redirect_stderr(io.StringIO()):
            time_loop(hooked, batch, min(cycles, 2000), churn)      # warm-up (event pool, caches)
            time_loop(bare, batch, min(cycles, 2000), churn)
            for _ in range(repeats):
                bare_s.append(time_loop(bare, batch, cycles, churn))
                hooked_s.append(time_loop(hooked, batch, cycles, churn))
            rt.flush()
            stats = rt._stats()
            if stats["timer"] != timer:
                raise SystemExit("the runtime used timer %r, not %r" % (stats["timer"], timer))
            # Untimed calls under every=N sampling: what the other N-1 calls cost.
            rt.configure(mode=timer, log_dir=log_dir, summary_every=2000, every=every)
            for _ in range(repeats):
                untimed_s.append(time_loop(hooked, batch, cycles, churn))
            rt.flush()
        errors = stats["errors"]
        dropped = stats.get("dropped", 0)           # (a runtime before the writer thread has no such count)
        records = 0
        for name in os.listdir(log_dir):
            with open(os.path.join(log_dir, name)) as f:
                records += sum(1 for _ in f)
    finally:
        stop = getattr(rt, "_stop_writer", None) or rt._stop_flusher
        stop()
        shutil.rmtree(log_dir, ignore_errors=True)

    per = lambda xs: statistics.median(xs) / cycles * 1e6  # noqa: E731 - us per cycle
    hooked_us, bare_us, sampled_us = per(hooked_s), per(bare_s), per(untimed_s)
    untimed_us = (sampled_us * every - (hooked_us - bare_us) - bare_us * every) / max(1, every - 1) \
        if every > 1 else None
    return {
        "timer": timer,
        "overhead_us_per_cycle": round(hooked_us - bare_us, 3),
        "cycles": cycles,
        "repeats": repeats,
        "bs": bs,
        "rids": rids,
        "churn": churn,
        "hooked_us_per_cycle": round(hooked_us, 3),
        "bare_us_per_cycle": round(bare_us, 3),
        "every": every,
        "overhead_us_per_untimed_cycle": None if untimed_us is None else round(max(0.0, untimed_us), 3),
        "records_written": records,
        "records_dropped": dropped,
        "runtime_errors": errors,
        "runtime": os.path.normpath(runtime or RUNTIME),
        "python": platform.python_version(),
    }


def measure_per_call(timer, cycles, repeats, bs, ns, runtime=None):
    """The runtime's cost per entry call (every call, timed or not) at each `every` N of `ns`, `cpu` timer."""
    if timer != "cpu":
        raise SystemExit("--per-call measures the cpu timer only")
    rt = load_runtime(runtime)
    log_dir = tempfile.mkdtemp(prefix="ep-runtime-bench-")  # not /tmp/eaglepatch*: other tools clean those
    out = Output([3] * bs)
    batch = Batch(bs)
    hooked, bare = make_workers(rt, out, None)
    per = {n: [] for n in ns}
    bare_s = []
    written = {}
    errors = 0
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            for i in range(repeats + 1):                    # the first round warms up (caches, the writer)
                b = time_loop(bare, batch, cycles)
                for n in ns:
                    sub = os.path.join(log_dir, str(n))
                    rt.configure(mode=timer, log_dir=sub, summary_every=2000, flush_records=256, flush_seconds=2.0,
                                 every=n)
                    took = time_loop(hooked, batch, cycles)
                    rt.flush()
                    errors += rt._stats()["errors"]
                    if i:
                        per[n].append(took)
                if i:
                    bare_s.append(b)
        for n in ns:
            sub = os.path.join(log_dir, str(n))
            lines = 0
            for name in os.listdir(sub):
                with open(os.path.join(sub, name)) as f:
                    lines += sum(1 for line in f if '"kind"' not in line)
            written[str(n)] = lines
    finally:
        stop = getattr(rt, "_stop_writer", None) or rt._stop_flusher
        stop()
        shutil.rmtree(log_dir, ignore_errors=True)
    bare_us = statistics.median(bare_s) / cycles * 1e6
    return {
        "timer": timer,
        "per_call_us": {str(n): round(statistics.median(per[n]) / cycles * 1e6 - bare_us, 3) for n in ns},
        "bare_us_per_call": round(bare_us, 3),
        "cycles": cycles,
        "repeats": repeats,
        "bs": bs,
        "records_written": written,
        "load_average": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
        "runtime_errors": errors,
        "runtime": os.path.normpath(runtime or RUNTIME),
        "python": platform.python_version(),
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--timer", choices=("cpu", "sync", "events"), default="cpu")
    ap.add_argument("--cycles", type=int, default=None, help="cycles per repeat (default 200000 cpu, 20000 GPU)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--bs", type=int, default=4, help="requests per batch (len of accept_lens)")
    ap.add_argument("--every", type=int, default=10, help="N for the sampled-out (untimed) measurement")
    ap.add_argument("--per-call", default=None, metavar="N,N,...",
                    help="instead: the cost per entry call (timed or not) under every=N for each N, e.g. 1,8,64")
    ap.add_argument("--rids", choices=("none", "ours", "others", "mixed"), default="none",
                    help="the requests' ids: none (no rid), all eaglepatch's, all another client's, or mixed (every "
                         "fourth another client's: the records carry their places)")
    ap.add_argument("--churn", action="store_true", help="a new reqs list every cycle (membership changed: the "
                    "runtime looks into every request again), the bare loop alike")
    ap.add_argument("--json", action="store_true", help="only the JSON line on stdout (human line on stderr)")
    ap.add_argument("--runtime", default=None, help="the runtime module file to measure (default: this checkout's)")
    args = ap.parse_args(argv)
    cycles = args.cycles or (200000 if args.timer == "cpu" else 20000)
    if args.per_call is not None:
        ns = [max(1, int(x)) for x in args.per_call.split(",") if x.strip()]
        res = measure_per_call(args.timer, cycles, max(1, args.repeats), max(1, args.bs), ns, args.runtime)
        print(json.dumps(res))
        human = "eaglepatch runtime, timer %s, per entry call: %s (bare call %.3f us, median of %d x %d calls)" % (
            res["timer"], ", ".join("%.2f us at every=%s" % (v, k) for k, v in res["per_call_us"].items()),
            res["bare_us_per_call"], res["repeats"], res["cycles"])
        print(human, file=sys.stderr if args.json else sys.stdout)
        return 0
    res = measure(args.timer, cycles, max(1, args.repeats), max(1, args.bs), max(1, args.every), args.runtime,
                  args.rids, args.churn)
    print(json.dumps(res))
    human = ("eaglepatch runtime, timer %s: %.2f us per timed cycle (entry + 3 phases + accepted; %.2f vs %.2f "
             "us, median of %d x %d cycles)" % (res["timer"], res["overhead_us_per_cycle"],
                                                res["hooked_us_per_cycle"], res["bare_us_per_cycle"],
                                                res["repeats"], res["cycles"]))
    if res["overhead_us_per_untimed_cycle"] is not None:
        human += "; %.2f us per untimed call with every=%d" % (res["overhead_us_per_untimed_cycle"], res["every"])
    if res["records_dropped"]:
        human += "; %d records dropped by the runtime (its writer fell behind)" % res["records_dropped"]
    print(human, file=sys.stderr if args.json else sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
