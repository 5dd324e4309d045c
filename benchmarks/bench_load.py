#!/usr/bin/env python3
"""``eaglepatch bench``'s time to first token through an SSH forward against the same bench run locally, and against
the server's own figure: a client clock that is the server's.

Starts its own OpenSSH server on 127.0.0.1 (bench_ssh.py's ``Loopback``) and a stand-in sglang server
(tests/stubs/stand_in_sglang) whose prefill takes a fixed ``--prefill-ms`` (so its TTFT is known), then runs
``--rounds`` interleaved rounds of ``eaglepatch bench --json`` twice: on the local target (the stand-in's package
path: no tunnel) and over SSH (``user@127.0.0.1:PORT --sglang-path ...``: every request goes through the SSH
forward). Each bench keeps one HTTP connection per concurrency slot open through the forward and times each
request from the moment it is written on it; the stand-in reports its own first-token time
(``meta_info.e2e_latency`` of its first chunk, ``server_ttft_ms``). Per round: the TTFT p50 of each run.

Prints one JSON object on stdout. ``python benchmarks/bench_load.py [--rounds 3] [--prefill-ms 40]``
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_ssh import EAGLEPATCH, Loopback  # noqa: E402

_spec = importlib.util.spec_from_file_location(
    "standin_harness", ROOT / "tests" / "stubs" / "stand_in_sglang" / "standin_harness.py")
H = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(H)  # type: ignore[union-attr]

TARGET_MS = 2.0


def bench(argv: list[str], env: dict) -> dict:
    p = subprocess.run([*EAGLEPATCH, "bench", *argv], capture_output=True, text=True, env=env, timeout=300,
                       stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        raise SystemExit(f"eaglepatch bench failed ({p.returncode}):\n{p.stderr[-2000:]}")
    return json.loads(p.stdout)["client"]


def measure(rounds: int, prefill_ms: float, requests: int, concurrency: int) -> dict:
    load = ["--requests", str(requests), "--concurrency", str(concurrency), "--input-len", "16",
            "--max-new-tokens", "16", "--warmup", str(concurrency), "--log-wait", "0", "--json"]
    with tempfile.TemporaryDirectory(prefix="eaglepatch-bench-load-") as tmp:
        root = Path(tmp)
        standins = H.StandIns(sys.executable)
        try:
            with Loopback(root / "sshd") as lb:
                tree = H.make_tree(root / "site")
                port = standins.port()
                standins.launch(tree, root / "work", port, "--sim-prefill-ms", str(prefill_ms), "--tp", "0")
                H.wait_http(port, timeout=30)
                pkg = str(tree / "sglang")
                ssh = [lb.server.target, "-i", lb.server.client_key, "--sglang-path", pkg]
                rows = []
                for _ in range(rounds):
                    local = bench([pkg, *load], lb.env)
                    remote = bench([*ssh, *load], lb.env)
                    rows.append({
                        "local_ttft_p50_ms": local["ttft_ms"]["p50"],
                        "ssh_ttft_p50_ms": remote["ttft_ms"]["p50"],
                        "server_ttft_p50_ms": statistics.median(
                            [d["server_ttft_ms"]["p50"] for d in (local, remote)]),
                        "local_latency_p50_ms": local["latency_ms"]["p50"],
                        "ssh_latency_p50_ms": remote["latency_ms"]["p50"],
                        "local_tokens_per_s": local["tokens_per_s"], "ssh_tokens_per_s": remote["tokens_per_s"],
                    })
                    print(f"round: {rows[-1]}", file=sys.stderr, flush=True)
        finally:
            standins.cleanup()
    med = {k: round(statistics.median(r[k] for r in rows), 3) for k in rows[0]}
    gaps = {
        "ssh_minus_local_ms": round(med["ssh_ttft_p50_ms"] - med["local_ttft_p50_ms"], 3),
        "local_minus_server_ms": round(med["local_ttft_p50_ms"] - med["server_ttft_p50_ms"], 3),
        "ssh_minus_server_ms": round(med["ssh_ttft_p50_ms"] - med["server_ttft_p50_ms"], 3),
    }
    return {"rounds": rounds, "prefill_ms": prefill_ms, "requests": requests, "concurrency": concurrency,
            "medians": med, "gaps": gaps, "target_ms": TARGET_MS,
            "met": all(abs(v) <= TARGET_MS for v in gaps.values()), "per_round": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prefill-ms", type=float, default=40.0)
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--concurrency", type=int, default=4)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    doc = measure(args.rounds, args.prefill_ms, args.requests, args.concurrency)
    doc["seconds"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
