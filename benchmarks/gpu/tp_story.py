#!/usr/bin/env python3
"""A tensor-parallel SGLang EAGLE3 server (``--tp-size TP``) through eaglepatch's real commands, on the H200 testbed.

Run by benchmarks/gpu/tp_story.sh on a machine with TP GPUs (the testbed's bundle unpacked in /tmp/site,
eaglepatch installed in /tmp/ep). ``TP=1`` rehearses the same story on one GPU. Stage 1 (one device call):

1. launch the agreeing-draft EAGLE3 server with ``--tp-size TP`` as a user would (detached); list its rank
   processes (sglang renames them ``sglang::scheduler_TP<r>``) and their parent;
2. ``eaglepatch status --json`` and ``show --json`` (the server, its children, the timer each worker gets);
3. ``eaglepatch bench`` twice on the unpatched server (the reference for the cost);
4. ``eaglepatch apply`` (default ``auto``: events on the V2 worker), ``bench`` twice, ``report --by rank --json``
   of the run (one log per rank, all under the launch's one run id; the slowest rank's phases against the
   others'), ``doctor --json``;
5. ``eaglepatch apply --mode sync``, ``bench`` twice, ``report --by rank --json`` (sync's cost per rank);
6. ``revert --no-restart``; the package's bytes compared; the server stopped.

Stage 2 (``STAGE=2``, the next call, TP >= 2): ``eaglepatch sweep`` over the communication settings and draft
steps (``--env NCCL_PROTO=LL,LL128,Simple --grid disable-custom-all-reduce=on,off --repeat 2`` then
``--grid speculative-num-steps=1,2,3 --baseline --repeat 2``), each killed at ``DEADLINE`` and resumed by running
the story again with the sweep's state carried back (``STATE_IN``), as benchmarks/gpu/sweep_story.py does.

Everything goes to ``$OUT/tp_story.json``. Env: OUT, T0, BUDGET (default 540), TP (default 2), STAGE (1), DEADLINE.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import runs_story as rs  # noqa: E402  (the testbed's launch, the eaglepatch runner, digests)

TP = int(os.environ.get("TP", "2"))
STAGE = int(os.environ.get("STAGE", "1"))
LOAD = ["--requests", "64", "--concurrency", "8", "--input-len", "128", "--max-new-tokens", "128"]
SWEEPS = [["--env", "NCCL_PROTO=LL,LL128,Simple", "--grid", "disable-custom-all-reduce=on,off", "--repeat", "2"],
          ["--grid", "speculative-num-steps=1,2,3", "--baseline", "--repeat", "2"]]
story = rs.story
story.update({"tp": TP, "stage": STAGE, "load": LOAD})


def ranks() -> list[dict]:
    """The processes sglang renamed as schedulers, with their parent (the launcher)."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv0 = f.read().split(b"\0")[0].decode(errors="replace")
            with open(f"/proc/{name}/stat", "rb") as f:
                raw = f.read()
            ppid = int(raw[raw.rindex(b")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if argv0.startswith("sglang::scheduler"):
            out.append({"pid": int(name), "title": argv0.strip(), "ppid": ppid})
    return sorted(out, key=lambda r: r["title"])



def bench(label: str) -> dict | None:
    return rs.bench(label, LOAD)


def by_rank(label: str) -> dict | None:
    time.sleep(2.5)  # the runtime writes every 2 s
    doc = rs.ep_json("report", "--by", "rank", rs.TARGET)
    if doc is not None:
        for g in doc.get("groups", []):
            if g["mode"] == "decode":
                ph = {k: v["p50"] for k, v in g["phases"].items()}
                rs.log(f"{label} rank {g['key'].get('rank')}: n {g['n']}, cycle p50 {g['cycle_ms']['p50']} ms, {ph}")
    return doc


def stage1() -> None:
    before = rs.digest(rs.TARGET)
    rs.orchestrate.COMMON += ["--tp-size", str(TP)]
    rs.launch()
    story["ranks"] = ranks()
    rs.log(f"{len(story['ranks'])} scheduler process(es): {story['ranks']}")
    story["status"] = rs.ep_json("status", rs.TARGET)
    story["show"] = rs.ep_json("show", rs.TARGET)
    story["unpatched"] = [bench(f"unpatched-{i}") for i in range(2)]
    for mode in ("auto", "sync"):
        if rs.left() < 150:
            rs.log(f"skipping --mode {mode}: {rs.left():.0f}s left")
            continue
        args = ["apply", "--log-dir", rs.LOGS, "--timeout", "300"] + ([] if mode == "auto" else ["--mode", mode])
        story[f"apply_{mode}"] = rs.ep_json(*args, rs.TARGET, timeout=360)
        story[f"ranks_{mode}"] = ranks()
        story[f"bench_{mode}"] = [bench(f"{mode}-{i}") for i in range(2)]
        story[f"by_rank_{mode}"] = by_rank(mode)
        if mode == "auto":
            story["doctor"] = rs.ep_json("doctor", rs.TARGET, timeout=120)
    story["revert"] = rs.ep_json("revert", "--no-restart", rs.TARGET)
    story["byte_identical"] = rs.digest(rs.TARGET) == before
    rs.log(f"byte identical after revert: {story['byte_identical']}")


def stage2() -> None:
    """The sweeps, each resumed from its state when the story is run again (STATE_IN: a folder of state files)."""
    cache = "/tmp/epcache/eaglepatch/sweeps"
    state_in = os.environ.get("STATE_IN", "")
    if state_in and os.path.isdir(state_in):
        os.makedirs(cache, exist_ok=True)
        subprocess.run(f"cp {state_in}/*.jsonl {cache}/", shell=True)
    rs.orchestrate.COMMON += ["--tp-size", str(TP)]
    rs.launch()
    rs.ep_json("apply", "--no-restart", "--log-dir", rs.LOGS, rs.TARGET)
    deadline = rs.T0 + float(os.environ.get("DEADLINE", "540"))
    story["sweeps"] = []
    for grid in SWEEPS:
        left = deadline - time.time()
        if left < 120:
            break
        argv = [rs.PY, "-m", "eaglepatch", "sweep", rs.TARGET, *grid, *LOAD, "--timeout", "400", "--json"]
        p = subprocess.Popen(argv, env=rs.EP_ENV, cwd="/tmp", stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        try:
            out, err = p.communicate(timeout=left)
        except subprocess.TimeoutExpired:
            p.terminate()  # the sweep puts the server back and keeps its state: the next call resumes it
            out, err = p.communicate(timeout=300)
        story["sweeps"].append({"grid": grid, "rc": p.returncode, "stderr_tail": err[-3000:],
                                "result": json.loads(out) if p.returncode == 0 and out.strip() else None})
        rs.log(f"sweep {' '.join(grid)}: exit {p.returncode}")
        if p.returncode != 0:
            break
    os.makedirs(f"{rs.OUT}/state", exist_ok=True)
    subprocess.run(f"cp {cache}/*.jsonl {rs.OUT}/state/ 2>/dev/null", shell=True)


if __name__ == "__main__":
    os.makedirs(rs.OUT, exist_ok=True)
    try:
        stage1() if STAGE == 1 else stage2()
    finally:
        with open(f"{rs.OUT}/tp_story.json", "w") as f:
            json.dump(story, f, indent=1)
        rs.stop_all()
