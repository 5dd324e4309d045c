"""``make demo``: the whole job on this machine, with no GPU and no remote host.

Downloads a pinned sglang release (its wheel, from PyPI) into a local sandbox, then runs the real commands against
it as a local target: ``show``, ``diff``, ``apply --no-restart``; drives a few thousand prefill and decode cycles
through the patched ``EAGLEWorkerV2.forward_batch_generation`` with stub collaborators that do real CPU work
(eaglepatch.demo.drive) with the command line of a server launched at 3 draft steps; prints ``eaglepatch report``
of the timing log and ``report --predict`` (the other step counts, the best per batch size); ``revert``; and proves
with sha256 that every byte of the sandbox is back. ``make demo-server`` goes on from there with a server.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import pathlib
import shutil
import subprocess
import sys

from eaglepatch.releases import cache_dir, release_site

RELEASE = "0.5.16"  # the release of the H200 testbed (docs/real-gpu.md)
SPEC = ["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "4", "--cuda-graph-max-bs", "8"]


def step(text: str) -> None:
    print(f"\n\033[1m==> {text}\033[0m", flush=True)


def run(args: list[str], *, env: dict[str, str] | None = None, head: int | None = None) -> str:
    shown = " ".join(a if " " not in a else repr(a) for a in args)
    print(f"$ {shown}", flush=True)
    proc = subprocess.run(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = proc.stdout.splitlines()
    for line in lines[:head] if head else lines:
        print(line)
    if head and len(lines) > head:
        print(f"... ({len(lines) - head} more lines)")
    if proc.returncode != 0:
        raise SystemExit(f"demo: the command above exited {proc.returncode}")
    return proc.stdout


def checksums(root: pathlib.Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def main() -> int:
    ap = argparse.ArgumentParser(description="eaglepatch's walkthrough on a local sandbox")
    ap.add_argument("--release", default=RELEASE)
    ap.add_argument("--cycles", type=int, default=3000)
    ap.add_argument("--sandbox", default=None, help="folder to work in (default: <cache>/demo)")
    args = ap.parse_args()
    eaglepatch = [sys.executable, "-m", "eaglepatch"]

    step(f"Fetch sglang {args.release} from PyPI (its wheel, cached) and lay out a sandbox install")
    site = release_site(args.release)
    sandbox = pathlib.Path(args.sandbox or cache_dir() / "demo").resolve()
    shutil.rmtree(sandbox, ignore_errors=True)
    target = sandbox / "site-packages"
    shutil.copytree(site, target)
    logs = sandbox / "logs"
    before = checksums(target)
    print(f"sandbox: {target} ({len(before)} files)")

    step("show: the workers, their entry methods and the phase call sites eaglepatch found")
    run(eaglepatch + ["show", str(target)], head=60)

    step("diff: exactly what apply would change (only added lines, each marked # [eaglepatch])")
    run(eaglepatch + ["diff", str(target)], head=70)

    step("apply --no-restart: patch, back up the originals, write the runtime module beside the worker")
    run(eaglepatch + ["apply", "--no-restart", "--log-dir", str(logs), str(target)])
    run(eaglepatch + ["status", str(target)])

    step(f"Drive {args.cycles} prefill and decode cycles through the patched worker (timer: cpu, no GPU here)")
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", EAGLEPATCH_MODE="cpu", EAGLEPATCH_LOG_DIR=str(logs), EAGLEPATCH_SUMMARY_EVERY="1000")
    # the flags a server launched at 3 draft steps carries: the run's header keeps them (report knows the steps)
    run([sys.executable, "-m", "eaglepatch.demo.drive", str(target), "--cycles", str(args.cycles), *SPEC], env=env)

    step("report: where a decode cycle goes, and what it costs in tokens per second")
    run(eaglepatch + ["report", "--skip", "20", str(logs)])

    step("report --predict: the other step counts from this one run, and the best step count per batch size")
    run(eaglepatch + ["report", "--skip", "20", "--predict", str(logs)], head=None)

    step("revert: put back every byte")
    run(eaglepatch + ["revert", "--no-restart", str(target)])
    after = checksums(target)
    if after != before:
        changed = sorted(set(before) ^ set(after) | {k for k in before if after.get(k) != before[k]})
        raise SystemExit(f"demo: the sandbox differs after revert: {', '.join(changed[:5])}")
    print(f"sha256 of all {len(after)} files in the sandbox: identical to before apply")
    step("Done. Next, with a server: make demo-server starts the tests' stand-in sglang here (no GPU) and prints "
         "the commands to try against it (bench, report --predict, doctor, sweep --baseline); on a GPU host: "
         "eaglepatch doctor root@gpu-host, then the commands it names")
    return 0


if __name__ == "__main__":
    sys.exit(main())
