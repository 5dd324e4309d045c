"""Benchmark ``eaglepatch report`` over a log of many runs: its peak memory and wall time as a whole command.

Generates (seeded) one timing-log file holding ``--runs`` runs (default 20,000) of ``--per-run`` records each
(default 5), the way a log folder looks after many short launches (a test harness, a sweep's restarts): each run
a header line and its records (decode cycles at bs 1/2/4/8 with draft/verify/draft_extend and each request's
tokens, a prefill cycle in ten), every record carrying its run's id. Each run is one decode group (and a prefill
group where it has a prefill record), so the report holds tens of thousands of groups: what costs memory here is
the groups and the document written, not the records.

Then runs the whole command, ``eaglepatch report --all-runs FILE`` plain, with ``--json`` and with
``--predict --json`` (and with ``--modes json_streamed,predict_json_streamed``, the JSON handed to stdout piece by
piece: ``reporting.report(..., write=sys.stdout.write)``), each as a child process (``python -c``: the same entry point as the console script, run
from ``--tree``, default this checkout), output discarded, and reads its peak resident size (``VmHWM`` from
/proc/self/status at exit, where there is one; ``ru_maxrss`` elsewhere) and wall time; median time and highest
peak over ``--repeat`` rounds. Prints one JSON object: ``{"runs", "records", "bytes", "plain": {"peak_mb",
"wall_s"}, "json": {...}, "predict_json": {...}}``.

Target (issue 41, not a test): every peak under 200 MB at 20,000 runs.

``python benchmarks/bench_report_runs.py [--runs 20000] [--per-run 5] [--repeat 1] [--tree DIR] [--keep FILE]``
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

from peak import PEAK_KB

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TARGET_MB = 200.0

# The child: the CLI's entry point from the tree given, its peak resident size written to a file at exit.
_CHILD = PEAK_KB + r"""
import atexit, sys
tree, out, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
sys.path.insert(0, tree)

def peak():
    with open(out, "w") as f:
        f.write(str(peak_kb()))

atexit.register(peak)
if argv[0] == "--stream":  # the JSON handed to stdout piece by piece (reporting.report's write=)
    argv = argv[1:]
    import functools
    from eaglepatch.ops import reporting
    _report = reporting.report

    @functools.wraps(_report)
    def report(*a, **k):
        if k.get("fmt") == "json":
            k["write"] = sys.stdout.write
        return _report(*a, **k)

    reporting.report = report
sys.argv = ["eaglepatch", *argv]
from eaglepatch.entry import main
main()
"""

MODES = {"plain": [], "json": ["--json"], "predict_json": ["--predict", "--json"]}
# the same commands with the JSON written piece by piece to stdout as it is made (``reporting.report(...,
# write=sys.stdout.write)``, what the CLI does where it passes ``write``); only for trees whose report takes it
STREAMED = {"json_streamed": ["--json"], "predict_json_streamed": ["--predict", "--json"]}


def generate(path: str, runs: int, per_run: int, seed: int = 41) -> int:
    """Write ``runs`` runs of ``per_run`` records each into the file ``path``; return the records written."""
    rng = random.Random(seed)
    host = "gpu1"
    t = 1764500000.0
    n = 0
    flags = {"speculative-algorithm": "EAGLE3", "speculative-num-steps": "3", "speculative-eagle-topk": "1",
             "speculative-num-draft-tokens": "4"}
    with open(path, "w", encoding="utf-8") as f:
        buf: list[str] = []
        for r in range(runs):
            pid = 1000 + r % 50000
            rid = f"{host}-{pid}-{100000 + r}-{r:08x}"
            buf.append(json.dumps({"v": 1, "kind": "run", "run": rid, "t": round(t, 6), "host": host, "pid": pid,
                                   "rank": 0, "timer": "sync", "flags": flags}))
            for i in range(per_run):
                if i == 1 and rng.random() < 0.1:
                    bs = rng.choice((1, 2, 4))
                    target = round(rng.gauss(25.0 + 5 * bs, 2.0), 4)
                    dext = round(rng.gauss(1.4, 0.1), 4)
                    cyc = round(target + dext + rng.uniform(0.1, 0.4), 4)
                    rec = {"v": 1, "t": round(t, 6), "host": host, "pid": pid, "rank": 0, "run": rid,
                           "worker": "EAGLEWorker", "mode": "prefill", "bs": bs, "cycle_ms": cyc, "timer": "sync",
                           "phases": {"target": target, "draft_extend": dext}, "accepted": bs}
                else:
                    bs = rng.choice((1, 1, 2, 4, 8))
                    draft = round(rng.gauss(3.2, 0.15) + 0.05 * bs, 4)
                    verify = round(rng.gauss(6.4, 0.4) + 0.3 * bs, 4)
                    dext = round(rng.gauss(1.05, 0.05), 4)
                    cyc = round(draft + verify + dext + rng.uniform(0.05, 0.3), 4)
                    accepts = [min(4, 1 + int(rng.expovariate(0.6))) for _ in range(bs)]
                    rec = {"v": 1, "t": round(t, 6), "host": host, "pid": pid, "rank": 0, "run": rid,
                           "worker": "EAGLEWorker", "mode": "decode", "bs": bs, "cycle_ms": cyc, "timer": "sync",
                           "phases": {"draft": draft, "verify": verify, "draft_extend": dext},
                           "accepted": sum(accepts), "accepts": accepts,
                           "spec": {"steps": 3, "topk": 1, "draft_tokens": 4}}
                buf.append(json.dumps(rec))
                n += 1
                t += cyc / 1000.0 + rng.uniform(0.0008, 0.0025)
            t += 5.0  # the next launch
            if len(buf) >= 10000:
                f.write("\n".join(buf) + "\n")
                buf.clear()
        if buf:
            f.write("\n".join(buf) + "\n")
    return n


def run_once(tree: str, path: str, extra: list[str], tmp: str, stream: bool = False) -> tuple[float, float]:
    """(peak MB, wall s) of one ``eaglepatch report --all-runs FILE`` command with ``extra`` options."""
    out = os.path.join(tmp, "peak")
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", _CHILD, tree, out, *(["--stream"] if stream else []), "report",
                    "--all-runs", path, *extra], check=True,
                   stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL, cwd=tmp)
    wall = time.perf_counter() - t0
    with open(out) as f:
        kb = int(f.read())
    return kb / 1024.0, wall


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20_000)
    ap.add_argument("--per-run", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--seed", type=int, default=41)
    ap.add_argument("--tree", default=ROOT, help="the folder whose eaglepatch package runs (default: this checkout)")
    ap.add_argument("--modes", default=",".join(MODES), help="which of plain,json,predict_json")
    ap.add_argument("--keep", default=None, help="write the log to this file and keep it")
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="bench-report-runs-") as tmp:
        path = args.keep or os.path.join(tmp, "runs.jsonl")
        t0 = time.perf_counter()
        records = generate(path, args.runs, args.per_run, args.seed)
        gen_s = time.perf_counter() - t0
        out: dict = {"runs": args.runs, "per_run": args.per_run, "records": records, "bytes": os.path.getsize(path),
                     "generate_s": round(gen_s, 1), "tree": args.tree, "python": sys.version.split()[0],
                     "target_mb": TARGET_MB}
        for mode in args.modes.split(","):
            peaks, walls = [], []
            for _ in range(args.repeat):
                mb, wall = run_once(args.tree, path, {**MODES, **STREAMED}[mode], tmp, mode in STREAMED)
                peaks.append(mb)
                walls.append(wall)
            out[mode] = {"command": " ".join(["eaglepatch report --all-runs FILE", *{**MODES, **STREAMED}[mode]])
                         + (" (JSON written as made)" if mode in STREAMED else ""),
                         "peak_mb": round(max(peaks), 1), "wall_s": round(statistics.median(walls), 2),
                         "target_met": max(peaks) < TARGET_MB}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
