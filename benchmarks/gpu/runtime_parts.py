#!/usr/bin/env python3
"""Where the `events` timer's host time goes, per cycle, on real CUDA (needs a GPU; no sglang).

A cycle shaped like an EAGLE decode cycle (draft: 3 kernels; verify: 1 kernel and the accepted-count copy of a
(bs,) tensor; draft extend: 1 kernel), with kernels so small that the loop is bound by the host: the wall time of
a cycle is then the host's time, and the runtime's host cost per cycle is the wall time with the hooks less the
wall time without (interleaved blocks, shuffled per round, so the host's drift hits every variant alike):

- ``bare``: the same kernels, no hooks;
- ``events``: the runtime as the patch calls it (entry, begin/end per phase, accepted);
- ``events_no_accepted``: the same without the accepted-count call.

Then one pass with every internal step of the runtime wrapped in a perf_counter pair (inclusive times: the
wrappers' own cost is in them, so read them as shares): the cycle's start and end, event records, the resolving
of finished cycles on the worker thread, the serialising of records, the accepted copy.

    python3 benchmarks/gpu/runtime_parts.py --out parts.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import random
import statistics
import tempfile
import time
import types

import torch

HERE = pathlib.Path(__file__).resolve()
RUNTIME = HERE.parent.parent.parent / "eaglepatch" / "runtime" / "_eaglepatch_runtime.py"
PARTS = ("_start", "_finish", "_poll", "_resolve", "_emit", "_record", "_event", "accepted", "begin", "end")


def load_runtime(log_dir: str, name: str):
    os.environ["EAGLEPATCH_MODE"] = "events"
    os.environ["EAGLEPATCH_LOG_DIR"] = log_dir
    spec = importlib.util.spec_from_file_location(name, RUNTIME)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def make_worker(rt, bs: int, with_accepted: bool):
    x = torch.zeros(256, device="cuda")
    out = types.SimpleNamespace(accept_lens=torch.full((bs,), 2, dtype=torch.int32, device="cuda"))
    batch = types.SimpleNamespace(reqs=[None] * bs)

    def bare(self, b):
        for _ in range(3):
            x.add_(1)
        x.mul_(1.0)
        x.add_(1)
        return out

    def hooked(self, b):
        rt.begin("draft")
        for _ in range(3):
            x.add_(1)
        rt.end("draft")
        rt.begin("verify")
        x.mul_(1.0)
        if with_accepted:
            rt.accepted(out, ("accept_lens",), 1)
        rt.end("verify")
        rt.begin("draft_extend")
        x.add_(1)
        rt.end("draft_extend")
        return out

    class W:
        pass

    W.forward_batch_generation = rt.entry(hooked) if rt is not None else bare
    return W(), batch


def block(worker, batch, cycles: int) -> float:
    """Wall microseconds per cycle over `cycles` back-to-back cycles (GPU drained before and after)."""
    f = worker.forward_batch_generation
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(cycles):
        f(batch)
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / cycles * 1e6


def parts(rt, worker, batch, cycles: int) -> dict:
    """Inclusive host time per cycle of each internal step (perf_counter pairs around each)."""
    acc = {name: [0.0, 0] for name in PARTS}
    saved = {}
    for name in PARTS:
        fn = getattr(rt, name)
        saved[name] = fn

        def timed(*a, _fn=fn, _slot=acc[name], **kw):
            t = time.perf_counter()
            try:
                return _fn(*a, **kw)
            finally:
                _slot[0] += time.perf_counter() - t
                _slot[1] += 1
        setattr(rt, name, timed)
    try:
        us = block(worker, batch, cycles)
    finally:
        for name, fn in saved.items():
            setattr(rt, name, fn)
    return {"wall_us_per_cycle": round(us, 2),
            "us_per_cycle": {k: round(v[0] / cycles * 1e6, 2) for k, v in acc.items()},
            "calls_per_cycle": {k: round(v[1] / cycles, 2) for k, v in acc.items()}}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--bs", type=int, default=1)
    ap.add_argument("--cycles", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=12)
    args = ap.parse_args()
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    log_dir = tempfile.mkdtemp(prefix="ep_parts_")
    rt = load_runtime(log_dir, "_ep_rt_parts")
    workers = {"bare": make_worker(None, args.bs, False), "events": make_worker(rt, args.bs, True),
               "events_no_accepted": make_worker(rt, args.bs, False)}
    for w, b in workers.values():               # warm-up: the writer started, the pools filled
        block(w, b, 200)
    got = {k: [] for k in workers}
    order = list(workers)
    rng = random.Random(7)
    for _ in range(args.rounds):
        rng.shuffle(order)
        for k in order:
            got[k].append(block(*workers[k], args.cycles))
    med = {k: statistics.median(v) for k, v in got.items()}
    res = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "bs": args.bs,
           "cycles_per_block": args.cycles, "rounds": args.rounds,
           "command": "python3 benchmarks/gpu/runtime_parts.py --bs %d --out FILE" % args.bs,
           "wall_us_per_cycle_median": {k: round(v, 2) for k, v in med.items()},
           "wall_us_per_cycle_all": {k: [round(x, 2) for x in v] for k, v in got.items()},
           "runtime_us_per_cycle": {k: round(v - med["bare"], 2) for k, v in med.items() if k != "bare"},
           "parts": parts(rt, *workers["events"], args.cycles * 2),
           "stats": rt._stats()}
    rt.flush()
    print(json.dumps({k: res[k] for k in ("wall_us_per_cycle_median", "runtime_us_per_cycle", "parts")}, indent=1))
    pathlib.Path(args.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
