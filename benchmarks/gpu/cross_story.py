#!/usr/bin/env python3
"""eaglepatch's bench beside sglang's own serving benchmark, the slow log disk with repeats, and the timer check, on
the H200 testbed (run by benchmarks/gpu/cross_story.sh; helpers and the slow-disk switch from runs_story.py):

1. launch the agreeing-draft EAGLE3 server, unpatched (as runs_story.py does, /tmp/slowfs first on its path);
2. twice, alternating: ``eaglepatch bench`` (128 requests, 4 at a time, 128 tokens in and out) and
   ``python -m sglang.bench_serving`` (random token ids, the same shape and count);
3. ``eaglepatch apply`` (default mode: auto, so events on this V2 worker); then twice, alternating, the same bench
   with the log disk normal and slowed (every write to /tmp/eplogs takes 1.5 s more);
4. ``revert --no-restart``, the server stopped, and benchmarks/gpu/timer_check.py (the runtime against CUDA-event
   ground truth, and its cost) when the budget allows.

Everything goes to ``$OUT/cross_story.json``. Env: OUT, T0, BUDGET (default 540).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import runs_story as rs  # noqa: E402

LOAD = ["--requests", "128", "--concurrency", "4", "--input-len", "128", "--max-new-tokens", "128"]
story = rs.story
story["load"] = LOAD



def bench(label: str) -> dict | None:
    return rs.bench(label, LOAD)


def main() -> int:
    os.makedirs(rs.OUT, exist_ok=True)
    before = rs.digest(rs.TARGET)
    rs.launch()
    story["pairs"] = []
    for i in range(2):
        if rs.left() < 200:
            break
        story["pairs"].append({"eaglepatch_bench": bench(f"unpatched-{i}"),
                               "bench_serving": rs.bench_serving(prompts=128, label=f"-{i}")})
    story["slow_disk"] = []
    if rs.left() > 150:
        story["apply"] = rs.ep_json("apply", "--log-dir", rs.LOGS, "--timeout", "240", rs.TARGET, timeout=300)
        for i in range(2):
            if rs.left() < 40:
                break
            pair = {"normal": bench(f"patched-{i}")}
            open(rs.SLOW_FLAG, "w").close()
            try:
                pair["slow"] = bench(f"patched-slow-disk-{i}")
            finally:
                os.unlink(rs.SLOW_FLAG)
            story["slow_disk"].append(pair)
    story["revert"] = rs.ep_json("revert", "--no-restart", rs.TARGET)
    story["byte_identical"] = rs.digest(rs.TARGET) == before
    rs.stop_all()
    if rs.left() > 75:
        time.sleep(3)
        t = time.time()
        p = subprocess.run([rs.PY, "benchmarks/gpu/timer_check.py", "--out", f"{rs.OUT}/timer_check.json"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=max(30, rs.left()))
        story["timer_check"] = {"rc": p.returncode, "seconds": round(time.time() - t, 1), "tail": p.stdout[-2500:]}
        rs.log(f"timer_check: exit {p.returncode} in {time.time() - t:.0f}s")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:
        with open(f"{rs.OUT}/cross_story.json", "w") as f:
            json.dump(story, f, indent=1)
        rs.stop_all()
