#!/usr/bin/env python3
"""Does the timing runtime measure GPU time correctly, and what does it cost? (Needs CUDA; no sglang.)

Drives the real runtime (eaglepatch/runtime/_eaglepatch_runtime.py) around phases of known GPU work, launched
asynchronously as sglang does: a "draft" of several small matmuls, a "verify" of one large batched matmul and a
"draft extend" of a medium one. Ground truth: CUDA events around each phase with the GPU otherwise idle (a
synchronize before each phase). Compared against it, per phase (medians over cycles):
- the runtime's `sync` timer and its `events` timer;
- a naive perf_counter around each phase without a synchronize (what you get without eaglepatch's care);
and what each timer costs: wall time per cycle with the timer against the same cycles with no hooks,
interleaved in blocks so drift of the host's speed hits both alike.
Then, paired: more cycles in which each phase is also bracketed by CUDA events of its own inside the runtime's
begin/end, so every record is compared with the GPU time of that very execution (the idle ground truth above is
measured first, on a cooler GPU: a GPU that slows under sustained load would pass for a timer error). And the
floor of a synchronize + perf_counter pair: one tiny kernel timed both ways.

    python3 benchmarks/gpu/timer_check.py --out result.json
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

import torch

HERE = pathlib.Path(__file__).resolve()
RUNTIME = HERE.parent.parent.parent / "eaglepatch" / "runtime" / "_eaglepatch_runtime.py"


def load_runtime(mode: str, log_dir: str):
    os.environ["EAGLEPATCH_MODE"] = mode
    os.environ["EAGLEPATCH_LOG_DIR"] = log_dir
    os.environ["EAGLEPATCH_SUMMARY_EVERY"] = "0"
    spec = importlib.util.spec_from_file_location(f"_eaglepatch_runtime_{mode}", RUNTIME)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Work:
    """The phases' GPU work, sized for roughly 2.5 / 6 / 1.6 ms on an H200 (bf16)."""

    def __init__(self, scale: float = 1.0):
        dev = "cuda"
        n = int(4096 * scale)
        self.small = [torch.randn(n, n, device=dev, dtype=torch.bfloat16) for _ in range(2)]
        self.big_a = torch.randn(32, 4096, 4096, device=dev, dtype=torch.bfloat16)
        self.big_b = torch.randn(32, 4096, 4096, device=dev, dtype=torch.bfloat16)
        self.med_a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
        self.med_b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)

    def draft(self):
        x = self.small[0]
        for _ in range(12):  # several small, dependent kernels, like a draft loop
            x = torch.matmul(x, self.small[1])
            x = x * 0.01
        return x

    def verify(self):
        return torch.bmm(self.big_a, self.big_b)

    def draft_extend(self):
        return torch.matmul(self.med_a, self.med_b)


PHASES = ("draft", "verify", "draft_extend")


def ground_truth(work: Work, cycles: int) -> dict[str, float]:
    """CUDA events around each phase, GPU idle before each (synchronize)."""
    out = {p: [] for p in PHASES}
    for _ in range(cycles):
        for p in PHASES:
            torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            getattr(work, p)()
            b.record()
            b.synchronize()
            out[p].append(a.elapsed_time(b))
    return {p: statistics.median(v) for p, v in out.items()}


def naive(work: Work, cycles: int) -> dict[str, float]:
    """perf_counter around each phase, no synchronize: measures kernel launches, not GPU time."""
    out = {p: [] for p in PHASES}
    for _ in range(cycles):
        torch.cuda.synchronize()
        for p in PHASES:
            t = time.perf_counter()
            getattr(work, p)()
            out[p].append((time.perf_counter() - t) * 1000)
    torch.cuda.synchronize()
    return {p: statistics.median(v) for p, v in out.items()}


def sync_floor(cycles: int = 200) -> dict[str, float]:
    """What a synchronize + perf_counter pair adds to any phase: one tiny kernel timed both ways, the GPU idle
    before each. The difference is the host's launch latency plus the synchronize's return, which the `sync`
    timer counts (it measures wall time) and CUDA events do not."""
    x = torch.zeros(1, device="cuda")
    wall, gpu = [], []
    for _ in range(cycles):
        torch.cuda.synchronize()
        t = time.perf_counter()
        x.add_(1)
        torch.cuda.synchronize()
        wall.append((time.perf_counter() - t) * 1000)
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        x.add_(1)
        b.record()
        b.synchronize()
        gpu.append(a.elapsed_time(b))
    w, g = statistics.median(wall), statistics.median(gpu)
    return {"wall_ms": w, "gpu_ms": g, "floor_us": 1000.0 * (w - g)}


def make_worker(rt, work: Work, paired: list | None = None):
    """A worker whose entry method runs the three phases under the runtime's hooks. With ``paired`` (a list),
    each phase is also bracketed by CUDA events of its own, inside the runtime's begin/end: the GPU time of that
    very execution, appended per cycle as {phase: (start event, end event)}."""

    def phase(name: str, fn, cyc: dict | None):
        rt.begin(name, "decode")
        if cyc is None:
            out = fn()
        else:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            out = fn()
            b.record()
            cyc[name] = (a, b)
        rt.end(name)
        return out

    class Worker:
        @rt.entry
        def forward_batch_generation(self, batch):
            cyc = {} if paired is not None else None
            phase("draft", work.draft, cyc)
            out = phase("verify", work.verify, cyc)
            rt.accepted(batch, ("accept_lens",), 0)
            phase("draft_extend", work.draft_extend, cyc)
            if cyc is not None:
                paired.append(cyc)
            return out

    return Worker()


class Batch:
    def __init__(self):
        self.reqs = [0, 1, 2, 3]
        self.accept_lens = torch.tensor([2, 3, 1, 4], device="cuda", dtype=torch.int32)


def bare(work: Work):
    work.draft()
    work.verify()
    work.draft_extend()


def records(log_dir: str) -> list[dict]:
    rows = []
    for p in sorted(glob.glob(os.path.join(log_dir, "*.jsonl"))):
        with open(p) as f:
            rows += [d for d in (json.loads(line) for line in f if line.strip()) if d.get("kind") != "run"]
    return rows


def run_timer(mode: str, work: Work, cycles: int, blocks: int) -> dict:
    log_dir = tempfile.mkdtemp(prefix=f"ep-{mode}-")
    rt = load_runtime(mode, log_dir)
    w = make_worker(rt, work)
    b = Batch()
    # warm-up
    for _ in range(5):
        w.forward_batch_generation(b)
        bare(work)
    torch.cuda.synchronize()
    rt.flush()
    for p in glob.glob(os.path.join(log_dir, "*.jsonl")):
        os.remove(p)
    timed, plain = [], []
    for _ in range(blocks):  # interleave: timed block, bare block
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(cycles):
            w.forward_batch_generation(b)
        torch.cuda.synchronize()
        timed.append((time.perf_counter() - t) / cycles * 1000)
        t = time.perf_counter()
        for _ in range(cycles):
            bare(work)
        torch.cuda.synchronize()
        plain.append((time.perf_counter() - t) / cycles * 1000)
    rt.flush()
    recs = records(log_dir)
    per_phase = {p: statistics.median([r["phases"][p] for r in recs if p in r.get("phases", {})]) for p in PHASES}
    out = {
        "timer": recs[0]["timer"] if recs else None,
        "records": len(recs),
        "phases_p50_ms": per_phase,
        "cycle_p50_ms": statistics.median(r["cycle_ms"] for r in recs),
        "accepted_values": sorted({r.get("accepted") for r in recs}),
        "wall_ms_per_cycle_timed": statistics.median(timed),
        "wall_ms_per_cycle_bare": statistics.median(plain),
    }
    out["cost_pct"] = 100.0 * (out["wall_ms_per_cycle_timed"] / out["wall_ms_per_cycle_bare"] - 1.0)
    if recs and "host_phases" in recs[0]:
        out["host_phases_p50_ms"] = {
            p: statistics.median([r["host_phases"][p] for r in recs if p in r.get("host_phases", {})]) for p in PHASES
        }
    # Paired: the same cycles timed by the runtime and by CUDA events around each phase's own execution, so GPU
    # speed drifting over the run (clocks, heat) cannot pass for a timer error.
    for p in glob.glob(os.path.join(log_dir, "*.jsonl")):
        os.remove(p)
    pairs: list = []
    wp = make_worker(rt, work, pairs)
    for _ in range(cycles * blocks):
        wp.forward_batch_generation(b)
    torch.cuda.synchronize()
    rt.flush()
    recs = records(log_dir)
    if len(recs) == len(pairs):
        err = {ph: [] for ph in PHASES}
        gpu = {ph: [] for ph in PHASES}
        for r, cyc in zip(recs, pairs):
            for ph in PHASES:
                g = cyc[ph][0].elapsed_time(cyc[ph][1])
                gpu[ph].append(g)
                err[ph].append(100.0 * (r["phases"][ph] / g - 1.0))
        out["paired"] = {
            "cycles": len(pairs),
            "gpu_p50_ms": {ph: statistics.median(v) for ph, v in gpu.items()},
            "timer_p50_ms": {ph: statistics.median([r["phases"][ph] for r in recs]) for ph in PHASES},
            "error_pct_p50": {ph: statistics.median(v) for ph, v in err.items()},
            "error_pct_p90_abs": {ph: sorted(abs(x) for x in v)[int(0.9 * (len(v) - 1))] for ph, v in err.items()},
        }
    else:
        out["paired"] = {"error": f"{len(recs)} records for {len(pairs)} cycles"}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=50)
    ap.add_argument("--blocks", type=int, default=6)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    work = Work()
    for _ in range(10):
        bare(work)
    torch.cuda.synchronize()
    truth = ground_truth(work, args.cycles)
    res = {
        "date": time.strftime("%Y-%m-%d"),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "command": "python3 benchmarks/gpu/timer_check.py " + " ".join(sys.argv[1:]),
        "ground_truth_p50_ms": truth,
        "naive_p50_ms": naive(work, args.cycles),
    }
    for mode in ("sync", "events"):
        res[mode] = run_timer(mode, work, args.cycles, args.blocks)
        res[mode]["error_pct"] = {
            p: 100.0 * (res[mode]["phases_p50_ms"][p] / truth[p] - 1.0) for p in PHASES
        }
    res["naive_error_pct"] = {p: 100.0 * (res["naive_p50_ms"][p] / truth[p] - 1.0) for p in PHASES}
    # the sync timer's excess over the GPU time, per phase, next to the floor any sync-timed phase pays
    res["sync_floor"] = sync_floor()
    res["sync"]["excess_us"] = {p: 1000.0 * (res["sync"]["phases_p50_ms"][p] - truth[p]) for p in PHASES}
    text = json.dumps(res, indent=1)
    print(text)
    if args.out:
        pathlib.Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
