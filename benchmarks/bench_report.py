"""Benchmark ``eaglepatch.report.aggregate()`` against the floor: a bare ``json.loads`` of every line.

Generates (seeded) a realistic timing log of ``--records`` records (default 1,000,000) as two files, one per
rank, the way the runtime writes them: a run header line at the top of each file and the run's id in every
record (one run: both ranks of one launch), decode cycles at bs 1/2/4/8 with draft/verify/draft_extend and each
request's tokens (``accepts``), about
2 % prefill cycles (target/draft_extend), gaps of a millisecond or two between cycles and a few idle pauses.
``--legacy`` writes the older format instead (no header line, no ``"run"``: each file is then a run of its own).
Then times, median of ``--repeat`` runs each, the two sides interleaved (``ratio`` is the median of the
per-round ratios, so that a change in the machine's load hits both sides alike):

* ``json_parse_s``: ``for line in open(f): json.loads(line)`` over the same files;
* ``report_s``: ``aggregate(files)`` (statistics included, no rendering);
* ``report_by_bs_s`` (once, for information): ``aggregate(files, by="bs")``;
* ``report_latest_s`` (once, for information): ``aggregate(files, latest=True)`` (what ``report`` does by
  default: the newest run only);
* with ``--cli``, ``cli_s``: the whole ``eaglepatch report FILE FILE`` command as a subprocess (interpreter start,
  imports, aggregation and the rendered table, output discarded), in the same interleaved rounds, and
  ``cli_ratio``, the median of its per-round ratios to ``json_parse_s``.

Peak memory is the peak resident size of a child process that only runs ``aggregate`` minus that of a child
that only imports it (``VmHWM`` from /proc/self/status where there is one, since ``ru_maxrss`` keeps the forking
parent's size across ``execve`` on Linux; ``resource.getrusage(...).ru_maxrss`` elsewhere). Prints one JSON
object: ``{"records", "json_parse_s", "report_s", "ratio", "peak_mb", ...}``.

Targets (not a test, issue 25): ``ratio <= 0.5`` (``target_ratio``; ``target_met`` says whether it holds) and
``peak_mb < 200``. ``parser`` names the parser ``aggregate`` used (``eaglepatch.report.scan.parser_name()``, or
``eaglepatch.report.aggregation.parser_name()`` in older trees; ``"json"``, the standard library, where neither is).
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
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

_CHILD = PEAK_KB + r"""
import sys, json
sys.path.insert(0, sys.argv[1])
from eaglepatch.report import aggregate
files = sys.argv[3:]
if sys.argv[2] == "run":
    r = aggregate(files)
    assert r.records > 0
print(json.dumps({"maxrss_kb": peak_kb()}))
"""


TARGET_RATIO = 0.5  # issue 25: aggregate at most half the time of the standard json parse of the same lines


def parser_name() -> str:
    """The parser ``aggregate`` uses: ``eaglepatch.report.scan.parser_name()`` (``aggregation``'s in older trees)
    where there is one, else ``"json"``."""
    import importlib

    for name in ("eaglepatch.report.scan", "eaglepatch.report.aggregation"):
        try:
            fn = getattr(importlib.import_module(name), "parser_name", None)
        except ImportError:
            continue
        if fn is not None:
            return fn()
    return "json"


RUN_ID = "20251130T105320-gpu1-4242-3f9c"


def generate(folder: str, records: int, seed: int = 1234, legacy: bool = False) -> list[str]:
    """Write ``records`` records split over two rank files in ``folder``; return the paths. Each file starts
    with a run header line and every record carries ``"run"`` (one run), unless ``legacy``."""
    rng = random.Random(seed)
    host = "gpu1"
    paths = []
    per_rank = [records // 2, records - records // 2]
    for rank, count in enumerate(per_rank):
        pid = 4242 + rank
        path = os.path.join(folder, f"{host}-{pid}-rank{rank}.jsonl")
        paths.append(path)
        t = 1764500000.0 + rank * 0.0003
        buf = []
        with open(path, "w", encoding="utf-8") as f:
            if not legacy:
                f.write(json.dumps({
                    "v": 1, "kind": "run", "run": RUN_ID, "t": round(t - 30.0, 6), "host": host, "pid": pid,
                    "rank": rank, "timer": "sync",
                    "flags": {"speculative-algorithm": "EAGLE3", "speculative-num-steps": "3",
                              "speculative-eagle-topk": "1", "speculative-num-draft-tokens": "4"},
                    "argv": ["/opt/venv/bin/python", "-m", "sglang.launch_server", "--speculative-algorithm",
                             "EAGLE3"]}) + "\n")
            for i in range(count):
                if rng.random() < 0.02:
                    bs = rng.choice((1, 2, 4))
                    target = round(rng.gauss(25.0 + 5 * bs, 2.0), 4)
                    dext = round(rng.gauss(1.4, 0.1), 4)
                    cyc = round(target + dext + rng.uniform(0.1, 0.4), 4)
                    rec = {"v": 1, "t": round(t, 6), "host": host, "pid": pid, "rank": rank,
                           "worker": "EAGLEWorker", "mode": "prefill", "bs": bs, "cycle_ms": cyc,
                           "timer": "sync", "phases": {"target": target, "draft_extend": dext},
                           "accepted": bs}
                else:
                    bs = rng.choice((1, 1, 2, 4, 8))
                    draft = round(rng.gauss(3.2, 0.15) + 0.05 * bs, 4)
                    verify = round(rng.gauss(6.4, 0.4) + 0.3 * bs, 4)
                    dext = round(rng.gauss(1.05, 0.05), 4)
                    cyc = round(draft + verify + dext + rng.uniform(0.05, 0.3), 4)
                    accepts = [min(4, 1 + int(rng.expovariate(0.6))) for _ in range(bs)]
                    rec = {"v": 1, "t": round(t, 6), "host": host, "pid": pid, "rank": rank,
                           "worker": "EAGLEWorker", "mode": "decode", "bs": bs, "cycle_ms": cyc,
                           "timer": "sync", "phases": {"draft": draft, "verify": verify, "draft_extend": dext},
                           "accepted": sum(accepts)}
                    if not legacy:
                        rec["accepts"] = accepts  # per request, as the runtime writes them since issue 22
                if not legacy:
                    rec["run"] = RUN_ID
                buf.append(json.dumps(rec))
                gap = rng.uniform(0.0008, 0.0025)
                if rng.random() < 0.0005:
                    gap = rng.uniform(2.0, 8.0)  # idle: no requests
                t += cyc / 1000.0 + gap
                if len(buf) >= 10000:
                    f.write("\n".join(buf) + "\n")
                    buf.clear()
            if buf:
                f.write("\n".join(buf) + "\n")
    return paths


def bare_parse(paths: list[str]) -> int:
    """The floor: json.loads every line; returns the number of lines."""
    loads = json.loads
    n = 0
    for p in paths:
        with open(p, encoding="utf-8") as f:
            for line in f:
                loads(line)
                n += 1
    return n


def timed(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run_cli(paths: list[str]) -> None:
    """The whole ``eaglepatch report`` command (the console script next to this interpreter, else ``-m``)."""
    exe = os.path.join(os.path.dirname(sys.executable), "eaglepatch")
    argv = [exe] if os.path.isfile(exe) else [sys.executable, "-m", "eaglepatch"]
    subprocess.run([*argv, "report", *paths], check=True, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                   cwd=ROOT)


def child_maxrss_kb(mode: str, paths: list[str]) -> int:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, ROOT, mode, *paths], check=True, capture_output=True, text=True
    ).stdout
    return int(json.loads(out.strip().splitlines()[-1])["maxrss_kb"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--cli", action="store_true", help="also time the whole `eaglepatch report` command")
    ap.add_argument("--legacy", action="store_true",
                    help="write the older log format (no run header line, no \"run\" in the records)")
    args = ap.parse_args(argv)

    from eaglepatch.report import aggregate

    with tempfile.TemporaryDirectory(prefix="bench-report-") as tmp:
        t0 = time.perf_counter()
        paths = generate(tmp, args.records, args.seed, args.legacy)
        gen_s = time.perf_counter() - t0
        size = sum(os.path.getsize(p) for p in paths)
        # Warm the page cache once, so neither side pays for the first read.
        bare_parse(paths)
        # Interleaved, so that a change in the machine's load hits both sides alike.
        parse_t: list[float] = []
        report_t: list[float] = []
        cli_t: list[float] = []
        for _ in range(args.repeat):
            parse_t.append(timed(lambda: bare_parse(paths), 1))
            report_t.append(timed(lambda: aggregate(paths), 1))
            if args.cli:
                cli_t.append(timed(lambda: run_cli(paths), 1))
        parse_s = statistics.median(parse_t)
        report_s = statistics.median(report_t)
        ratio = statistics.median([r / p for r, p in zip(report_t, parse_t)])
        by_bs_s = timed(lambda: aggregate(paths, by="bs"), 1)
        latest_s = timed(lambda: aggregate(paths, latest=True), 1)
        result = aggregate(paths)
        base_kb = child_maxrss_kb("import", paths)
        run_kb = child_maxrss_kb("run", paths)
    out = {
        "records": result.records,
        "skipped_lines": result.skipped_lines,
        "groups": len(result.groups),
        "runs": len(result.runs),
        "format": "legacy" if args.legacy else "runs",
        "bytes": size,
        "json_parse_s": round(parse_s, 3),
        "report_s": round(report_s, 3),
        "ratio": round(ratio, 3),
        "target_ratio": TARGET_RATIO,
        "target_met": ratio <= TARGET_RATIO,
        "parser": parser_name(),
        "peak_mb": round((run_kb - base_kb) / 1024.0, 1),
        "report_by_bs_s": round(by_bs_s, 3),
        "report_latest_s": round(latest_s, 3),
        "child_maxrss_mb": round(run_kb / 1024.0, 1),
        "baseline_maxrss_mb": round(base_kb / 1024.0, 1),
        "generate_s": round(gen_s, 1),
        "python": sys.version.split()[0],
    }
    if cli_t:
        out["cli_s"] = round(statistics.median(cli_t), 3)
        out["cli_ratio"] = round(statistics.median([c / p for c, p in zip(cli_t, parse_t)]), 3)
        out["cli_command"] = "eaglepatch report FILE FILE"
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
