#!/usr/bin/env python3
"""The timing runtime under torch.distributed with 2 ranks: both ranks' logs appear, and merge in `report`.

Run with torchrun on a machine with 2 GPUs (no sglang needed; eaglepatch importable for the report step):

    python3 -m torch.distributed.run --nproc_per_node 2 benchmarks/gpu/two_ranks.py --out result.json

Each rank drives the real runtime (``events`` timer, one shared log folder, as the ranks of a TP server do) around
the phases of benchmarks/gpu/timer_check.py, with an NCCL all-reduce inside "verify" (as tensor parallelism puts
one in the target forward), and measures its own ground truth (CUDA events around each phase, GPU idle before
each). Then rank 0 runs the real ``eaglepatch report --json --by rank`` over the folder and checks that:
- there is one log file per rank, named ``...-rank0.jsonl`` and ``...-rank1.jsonl`` (the rank comes from
  torch.distributed, not from the environment);
- ``report`` counts every cycle of both ranks (``--by rank``: one group per rank; without ``--by``: one merged
  group holding both ranks' cycles);
- each rank's per-phase p50 in the report is within a few percent of that rank's ground truth.
Writes one JSON object (to ``--out`` and stdout on rank 0).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from timer_check import PHASES, Batch, Work, load_runtime  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=200)
    ap.add_argument("--log-dir", default="/tmp/ep-two-ranks")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        os.makedirs(args.log_dir, exist_ok=True)
        for p in glob.glob(os.path.join(args.log_dir, "*.jsonl")):
            os.remove(p)
    dist.barrier()
    torch.manual_seed(rank)
    work = Work()
    reduced = torch.ones(1 << 22, device="cuda", dtype=torch.bfloat16)  # 8 MB, as a TP all-reduce of activations

    def verify():
        out = work.verify()
        dist.all_reduce(reduced)
        return out

    phase_fn = {"draft": work.draft, "verify": verify, "draft_extend": work.draft_extend}
    rt = load_runtime("events", args.log_dir)

    class Worker:
        @rt.entry
        def forward_batch_generation(self, batch):
            rt.begin("draft", "decode")
            work.draft()
            rt.end("draft")
            rt.begin("verify", "decode")
            out = verify()
            rt.end("verify")
            rt.accepted(batch, ("accept_lens",), 0)
            rt.begin("draft_extend", "decode")
            work.draft_extend()
            rt.end("draft_extend")
            return out

    w, b = Worker(), Batch()
    for _ in range(10):  # warm-up, outside the entry method: not logged
        for p in PHASES:
            phase_fn[p]()
    torch.cuda.synchronize()
    dist.barrier()

    # ground truth on this rank: CUDA events around each phase, the GPU idle before each
    truth = {p: [] for p in PHASES}
    for _ in range(50):
        for p in PHASES:
            torch.cuda.synchronize()
            dist.barrier()  # the all-reduce waits for the slower rank: start both together
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            phase_fn[p]()
            e1.record()
            e1.synchronize()
            truth[p].append(e0.elapsed_time(e1))
    truth_p50 = {p: statistics.median(v) for p, v in truth.items()}

    # the same phases back to back as the timed loop runs them (no synchronize, no barrier between phases),
    # CUDA events around each and no runtime: what the GPU takes for each phase under that load
    loaded = {p: [] for p in PHASES}
    dist.barrier()
    for _ in range(50):
        evs = []
        for p in PHASES:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            phase_fn[p]()
            e1.record()
            evs.append((p, e0, e1))
        torch.cuda.synchronize()
        for p, e0, e1 in evs:
            loaded[p].append(e0.elapsed_time(e1))
    loaded_p50 = {p: statistics.median(v) for p, v in loaded.items()}

    dist.barrier()
    t = time.perf_counter()
    for _ in range(args.cycles):
        w.forward_batch_generation(b)
    torch.cuda.synchronize()
    wall = time.perf_counter() - t
    rt.flush()
    dist.barrier()

    mine = {"rank": rank, "truth_p50_ms": truth_p50, "loaded_p50_ms": loaded_p50, "wall_ms_per_cycle": 1000 * wall / args.cycles,
            "files": sorted(os.path.basename(p) for p in glob.glob(os.path.join(args.log_dir, f"*-rank{rank}.jsonl")))}
    gathered: list = [None] * world
    dist.all_gather_object(gathered, mine)
    if rank != 0:
        dist.destroy_process_group()
        return 0

    def report(*extra: str) -> dict:
        p = subprocess.run([sys.executable, "-m", "eaglepatch", "report", "--json", *extra, args.log_dir],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/tmp")
        if p.returncode != 0:
            raise SystemExit(f"eaglepatch report failed ({p.returncode}): {p.stderr.strip()[-800:]}")
        return json.loads(p.stdout)

    by_rank, merged = report("--by", "rank"), report()
    files = sorted(os.path.basename(p) for p in glob.glob(os.path.join(args.log_dir, "*.jsonl")))
    res = {
        "date": time.strftime("%Y-%m-%d"),
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "torch": torch.__version__, "cuda": torch.version.cuda, "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        "command": "python3 -m torch.distributed.run --nproc_per_node 2 benchmarks/gpu/two_ranks.py "
                   + " ".join(sys.argv[1:]),
        "world": world, "cycles_per_rank": args.cycles, "log_files": files, "ranks": gathered,
        "report_by_rank": by_rank, "report_merged": merged,
    }
    checks = {"one_file_per_rank": sorted(f.rsplit("-", 1)[-1] for f in files)
              == [f"rank{r}.jsonl" for r in range(world)]}
    groups = by_rank.get("groups", [])
    res["groups_by_rank"] = [{"mode": g.get("mode"), "key": g.get("key"), "n": g.get("n")} for g in groups]
    checks["report_groups_per_rank"] = sorted((g.get("key") or {}).get("rank", -1) for g in groups) == list(
        range(world)) and all(g.get("n") == args.cycles for g in groups)
    checks["report_merged_cycles"] = [g.get("n") for g in merged.get("groups", [])] == [world * args.cycles]
    # each rank's p50 against its own ground truth
    errors = {}
    for g in groups:
        r = (g.get("key") or {}).get("rank")
        if not isinstance(r, int) or not 0 <= r < world:
            continue
        t = gathered[r]["truth_p50_ms"]
        errors[r] = {p: round(100.0 * (g["phases"][p]["p50"] / t[p] - 1.0), 2)
                     for p in PHASES if p in g.get("phases", {})}
    res["error_pct_by_rank"] = errors
    res["error_pct_vs_loaded_by_rank"] = {
        r: {p: round(100.0 * (g["phases"][p]["p50"] / gathered[r]["loaded_p50_ms"][p] - 1.0), 2) for p in PHASES}
        for r, g in ((int((g.get("key") or {}).get("rank", -1)), g) for g in groups) if 0 <= r < world}
    res["checks"] = checks
    text = json.dumps(res, indent=1, default=str)
    print(text)
    if args.out:
        pathlib.Path(args.out).write_text(text)
    dist.destroy_process_group()
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
