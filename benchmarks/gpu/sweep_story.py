#!/usr/bin/env python3
"""``eaglepatch sweep`` on real SGLang EAGLE3 servers: draft steps 1, 2, 3, 5 and the baseline, for the random and
the agreeing draft, one server per GPU of a 2-GPU machine, both sweeps at once.

Run by benchmarks/gpu/sweep_story.sh on the GPU machine (the testbed of ../shared/gpu-sglang unpacked in
/tmp/site, eaglepatch installed in /tmp/ep). One launch of the real server takes about 65 s (more when the
compile caches are cold), so ten launches per draft do not fit one device call: the sweep is run in two
stages, and the second resumes the first (the sweep's own resume: its state file, carried between the calls):

- stage 1: each draft gets its own copy of the sglang package (``/tmp/sw_<v>/sglang``, so the two patches and
  the two host locks are independent) and ``eaglepatch apply --no-restart --mode events``; its server is
  launched as a user would (GPU ``i``, port ``3000i``); then ``eaglepatch sweep`` runs until ``DEADLINE``
  seconds after the start of the call, when it is killed; the state files come back in $OUT.
- stage 2 (a fresh machine): the same set-up and the same ``apply``; no server is launched (the state file
  holds the original command line); the state files are put back in the sweep's cache folder and the same
  ``eaglepatch sweep`` command resumes, finishes, puts the original server back and prints its table, JSON and
  chart; then ``eaglepatch revert --no-restart`` and a sha256 check of every file of both package copies.

``REHEARSAL=1`` runs the same story on this machine with the stand-in server of tests/stubs (no GPU): it checks
the script, not sglang.

Usage: ``python3 sweep_story.py 1|2`` (env: OUT, T0, DEADLINE, STATE_IN, GRID, REPEAT, REQUESTS, MAX_NEW, REHEARSAL,
TWO_RANKS).
"""

from __future__ import annotations

import glob
import hashlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
REHEARSAL = os.environ.get("REHEARSAL") == "1"
STAGE = int(sys.argv[1])
OUT = Path(os.environ.get("OUT", "/tmp/eagle_out"))
WORK = OUT / "more"
T0 = float(os.environ.get("T0", time.time()))
DEADLINE = float(os.environ.get("DEADLINE", "540"))
STATE_IN = os.environ.get("STATE_IN", "")
PY = sys.executable
CACHE = Path(os.environ.get("SWEEP_CACHE", "/tmp/epcache"))  # XDG_CACHE_HOME of eaglepatch: the sweeps' state
GRID = os.environ.get("GRID", "speculative-num-steps=1,2,3,5")
REPEAT = os.environ.get("REPEAT", "1")
# The load of the recorded run (docs/real-gpu.md). It proved too short for this fast server (0.6-2.6 s windows):
# REQUESTS=64 MAX_NEW=256 gives about 10 s.
LOAD = ["--requests", os.environ.get("REQUESTS", "16"), "--concurrency", "4",
        "--max-new-tokens", os.environ.get("MAX_NEW", "128"), "--warmup", "2", "--log-wait", "3"]
story: dict = {"stage": STAGE, "rehearsal": REHEARSAL, "steps": []}

if REHEARSAL:
    _spec = importlib.util.spec_from_file_location(
        "standin_harness", ROOT / "tests" / "stubs" / "stand_in_sglang" / "standin_harness.py")
    harness = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(harness)
    BASE = Path(os.environ.get("REHEARSAL_DIR", "/tmp/sweep_rehearsal"))
    VARIANTS = {"rand": {"gpu": "0", "port": harness.free_port()}, "agree": {"gpu": "1", "port": harness.free_port()}}
    EP_ENV = dict(os.environ, XDG_CACHE_HOME=str(CACHE))
    EP_ENV.pop("PYTHONPATH", None)
    EP_CWD = str(BASE)  # not /tmp: its eaglepatch/ folder (server logs) would shadow the editable install
else:
    G = Path(os.environ.get("GPU_DIR", ROOT / ".gpu"))
    sys.path.insert(0, str(G))
    import orchestrate  # noqa: E402  (the testbed's launch flags)

    BASE = Path("/tmp")
    VARIANTS = {"rand": {"gpu": "0", "port": 30000, "models": "/tmp/models", "agree": False},
                "agree": {"gpu": "1", "port": 30001, "models": "/tmp/models_agree", "agree": True}}
    EP_ENV = dict(os.environ, PYTHONPATH="/tmp/ep:/tmp/site", XDG_CACHE_HOME=str(CACHE))
    EP_CWD = "/tmp"  # run the installed eaglepatch, not the checkout's source tree (python -m puts cwd first)


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def left() -> float:
    return T0 + DEADLINE - time.time()


def site(v: str) -> Path:
    return BASE / f"sw_{v}"


def target(v: str) -> str:
    return str(site(v) / "sglang")


def tree_sha(root: Path) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def ep(*args: str, timeout: float = 120, out: Path | None = None) -> tuple[int, str, str]:
    cmd = [PY, "-m", "eaglepatch", *args]
    t = time.time()
    p = subprocess.run(cmd, env=EP_ENV, cwd=EP_CWD, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=timeout)
    log(f"$ eaglepatch {' '.join(args)}: exit {p.returncode} in {time.time() - t:.1f}s")
    for line in p.stderr.strip().splitlines()[-6:]:
        print("  | " + line, flush=True)
    story["steps"].append({"cmd": "eaglepatch " + " ".join(args), "rc": p.returncode,
                           "seconds": round(time.time() - t, 1), "stderr_tail": p.stderr[-1200:]})
    if out is not None:
        out.write_text(p.stdout)
    return p.returncode, p.stdout, p.stderr


def prepare(v: str) -> None:
    """The variant's own copy of the sglang package, and its models."""
    dest = site(v)
    shutil.rmtree(dest, ignore_errors=True)
    if REHEARSAL:
        harness.make_tree(dest, harness.V1_WORKER)
    else:
        dest.mkdir(parents=True)
        shutil.copytree("/tmp/site/sglang", dest / "sglang", ignore=shutil.ignore_patterns("__pycache__"))
        cfg = VARIANTS[v]
        orchestrate.ensure_models(cfg["models"], ["--agree"] if cfg["agree"] else [])


def server_argv(v: str) -> list[str]:
    cfg = VARIANTS[v]
    if REHEARSAL:
        return [PY, "-m", "sglang.launch_server", "--port", str(cfg["port"]), "--speculative-algorithm", "EAGLE3",
                "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                "--speculative-num-draft-tokens", "4", "--startup-delay", "2"]
    common = list(orchestrate.COMMON)
    common[common.index("--port") + 1] = str(cfg["port"])
    return [PY, "-m", "sglang.launch_server", "--model-path", f"{cfg['models']}/target",
            *orchestrate.spec_args(cfg["models"]), *common]


def server_env(v: str) -> dict[str, str]:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=VARIANTS[v]["gpu"])
    for k in ("XDG_CACHE_HOME", "PYTHONPATH"):
        env.pop(k, None)
    if REHEARSAL:
        env["PYTHONPATH"] = str(site(v))
    else:
        env["PYTHONPATH"] = f"{site(v)}:/tmp/site"
        env["SGLANG_ENABLE_JIT_DEEPGEMM"] = "0"
    return env


def health(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health_generate", timeout=10) as r:
            return r.status == 200
    except Exception:
        return False


def launch(v: str) -> subprocess.Popen:
    logf = open(WORK / f"server_{v}_original.log", "a")
    log(f"launching the {v} server as a user would (GPU {VARIANTS[v]['gpu']}, port {VARIANTS[v]['port']})")
    return subprocess.Popen(server_argv(v), stdout=logf, stderr=subprocess.STDOUT, env=server_env(v), cwd="/tmp",
                            start_new_session=True)


def wait_ready(procs: dict[str, subprocess.Popen], limit: float = 400) -> None:
    t = time.time()
    pending = set(procs)
    while pending and time.time() - t < limit:
        for v in sorted(pending):
            if procs[v].poll() is not None:
                raise SystemExit(f"the {v} server died at start: see server_{v}_original.log")
            if health(VARIANTS[v]["port"]):
                log(f"{v} server ready after {time.time() - t:.0f}s")
                story[f"ready_{v}_s"] = round(time.time() - t, 1)
                pending.discard(v)
        time.sleep(1)
    if pending:
        raise SystemExit(f"not ready in {limit:.0f}s: {sorted(pending)}")


def sweep_cmd(v: str) -> list[str]:
    return [PY, "-m", "eaglepatch", "sweep", target(v), "--grid", GRID, "--baseline", "--repeat", REPEAT, *LOAD,
            "--timeout", "400", "--json", "--chart", str(WORK / f"sweep_{v}.png")]


def run_sweeps() -> dict[str, int | None]:
    procs = {}
    for v in VARIANTS:
        cmd = sweep_cmd(v)
        story[f"sweep_cmd_{v}"] = "eaglepatch " + " ".join(cmd[3:])
        log(f"$ eaglepatch {' '.join(cmd[3:])}")
        procs[v] = subprocess.Popen(cmd, env=EP_ENV, cwd=EP_CWD, stdout=open(WORK / f"sweep_{v}.json", "w"),
                                    stderr=open(WORK / f"sweep_{v}.log", "w"), start_new_session=True)
    rcs: dict[str, int | None] = {}
    while len(rcs) < len(procs):
        for v, p in procs.items():
            if v not in rcs and p.poll() is not None:
                rcs[v] = p.returncode
                log(f"sweep {v}: exit {p.returncode}")
        if left() <= 0:
            for v, p in procs.items():
                if v not in rcs:
                    log(f"deadline: stopping the {v} sweep (SIGKILL: the saved runs stay; the next stage resumes)")
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
                    rcs[v] = None
            break
        time.sleep(2)
    for v in procs:
        tail = (WORK / f"sweep_{v}.log").read_text(errors="replace").splitlines()
        story[f"sweep_{v}_log_tail"] = tail[-40:]
    return rcs


def two_ranks() -> None:
    """benchmarks/gpu/two_ranks.py under torchrun, while the servers start (their first 40 s are imports)."""
    t = time.time()
    env = dict(EP_ENV, PYTHONPATH="/tmp/ep")
    p = subprocess.run([PY, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                        str(ROOT / "benchmarks" / "gpu" / "two_ranks.py"), "--out", str(OUT / "two_ranks.json")],
                       env=env, cwd=EP_CWD, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240)
    (WORK / "two_ranks.log").write_text(p.stdout)
    log(f"two_ranks: exit {p.returncode} in {time.time() - t:.1f}s")
    story["two_ranks_rc"] = p.returncode


def main() -> int:
    WORK.mkdir(parents=True, exist_ok=True)
    CACHE.mkdir(parents=True, exist_ok=True)
    threads = [threading.Thread(target=prepare, args=(v,)) for v in VARIANTS]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    pristine = {v: tree_sha(site(v) / "sglang") for v in VARIANTS}
    log(f"prepared {', '.join(f'{v}: {len(pristine[v])} files' for v in VARIANTS)}")
    for v in VARIANTS:
        rc, _, _ = ep("apply", "--no-restart", "--mode", "events", "--log-dir", f"/tmp/eplogs/{v}", target(v))
        if rc != 0:
            return 10
    if STAGE == 1:
        procs = {v: launch(v) for v in VARIANTS}
        if os.environ.get("TWO_RANKS") == "1":
            two_ranks()
        wait_ready(procs)
    else:
        dest = CACHE / "eaglepatch" / "sweeps"
        dest.mkdir(parents=True, exist_ok=True)
        for f in glob.glob(os.path.join(STATE_IN, "*.jsonl")):
            shutil.copy(f, dest)
            log(f"resuming from {os.path.basename(f)}")
    story["rcs"] = run_sweeps()
    for f in glob.glob(str(CACHE / "eaglepatch" / "sweeps" / "*.jsonl")):
        shutil.copy(f, WORK)
    if STAGE == 2:
        for v in VARIANTS:
            ep("status", "--json", target(v), out=WORK / f"status_{v}.json")
            rc, _, _ = ep("revert", "--no-restart", "--json", target(v), out=WORK / f"revert_{v}.json")
            after = tree_sha(site(v) / "sglang")
            story[f"byte_identical_{v}"] = after == pristine[v]
            log(f"{v}: every file byte-identical after revert: {after == pristine[v]} ({len(after)} files)")
            story[f"server_answering_{v}"] = health(VARIANTS[v]["port"])
    return 0


if __name__ == "__main__":
    code = 3
    try:
        code = main()
    finally:
        story["exit"] = code
        story["seconds"] = round(time.time() - T0, 1)
        (OUT / f"sweep_story_{STAGE}.json").write_text(json.dumps(story, indent=1))
        if REHEARSAL:  # on a GPU machine the call's end stops everything; here, stop the stand-ins
            for cfg in VARIANTS.values():
                for pid in harness.launcher_pids(cfg["port"]):
                    harness._kill_tree(pid)
    sys.exit(code)
