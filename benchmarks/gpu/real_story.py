#!/usr/bin/env python3
"""The whole user story on a real SGLang 0.5.16 EAGLE3 server (the H200 testbed of ../shared/gpu-sglang).

Run on the GPU machine by benchmarks/gpu/real_story.sh, after the testbed's bundle is unpacked in /tmp/site and
eaglepatch is installed in /tmp/ep. For one model variant (``spec``: random draft; ``agree``: agreeing draft;
``base``: no speculation, unpatched reference only), with the real commands:

1. launch the server as a user would (detached, its own session), bench it unpatched;
2. ``eaglepatch show`` and ``diff``;
3. ``eaglepatch apply --mode sync``: eaglepatch finds the server, stops its process tree, relaunches it, waits;
   bench, then ``eaglepatch report`` of that window;
4. ``eaglepatch apply --mode events`` (only the runtime's config changes; restart again); bench, report;
5. ``eaglepatch revert``: restart, the worker file byte-identical (sha256), the server answering (bench);
and records everything in $OUT/story_<variant>.json.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

G = os.environ.get("GPU_DIR", os.path.join(os.getcwd(), ".gpu"))
sys.path.insert(0, G)
import orchestrate  # noqa: E402  (the testbed's launch flags)

OUT = os.environ.get("OUT", "/tmp/eagle_out")
PY = sys.executable
SITE = "/tmp/site"
WORKER = f"{SITE}/sglang/srt/speculative/eagle_worker_v2.py"
EP_ENV = dict(os.environ, PYTHONPATH=f"/tmp/ep:{SITE}")
T0 = time.time()
N = os.environ.get("N", "20")
MAX_NEW = os.environ.get("MAX_NEW", "128")
story: dict = {"steps": []}


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def sha(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def ep(*args: str, timeout: float = 400) -> tuple[int, str, str]:
    cmd = [PY, "-m", "eaglepatch", *args]
    log("$ eaglepatch " + " ".join(args))
    t = time.time()
    # cwd /tmp: run the installed eaglepatch, not the source tree of the checkout (python -m puts cwd first)
    p = subprocess.run(cmd, env=EP_ENV, cwd="/tmp", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=timeout)
    log(f"  exit {p.returncode} in {time.time() - t:.1f}s")
    for line in p.stderr.strip().splitlines()[-12:]:
        print("  | " + line, flush=True)
    story["steps"].append({"cmd": "eaglepatch " + " ".join(args), "rc": p.returncode,
                           "seconds": round(time.time() - t, 1), "stderr_tail": p.stderr[-1500:]})
    return p.returncode, p.stdout, p.stderr


def health() -> bool:
    try:
        with urllib.request.urlopen(orchestrate.URL + "/health_generate", timeout=10) as r:
            return r.status == 200
    except Exception:
        return False


def launch(variant: str) -> subprocess.Popen:
    mdir = "/tmp/models_agree" if variant == "agree" else "/tmp/models"
    orchestrate.ensure_models(mdir, ["--agree"] if variant == "agree" else [])
    cmd = [PY, "-m", "sglang.launch_server", "--model-path", f"{mdir}/target"]
    if variant != "base":
        cmd += orchestrate.spec_args(mdir)
    cmd += orchestrate.COMMON
    env = dict(os.environ, PYTHONPATH=SITE)
    logf = open(f"{OUT}/server_{variant}.log", "a")
    log(f"launching the {variant} server as a user would: {' '.join(cmd[1:6])} ...")
    p = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env, cwd="/tmp", start_new_session=True)
    t = time.time()
    while time.time() - t < 300:
        if p.poll() is not None:
            raise SystemExit(f"server died: see server_{variant}.log")
        if health():
            log(f"ready after {time.time() - t:.0f}s")
            return p
        time.sleep(2)
    raise SystemExit("server not ready in 300 s")


def bench(label: str, n: str = N) -> dict:
    r = subprocess.run([PY, f"{G}/bench.py", "--n", n, "--max-new", MAX_NEW, "--label", label,
                        "--out", f"{OUT}/bench.jsonl"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=300)
    res = {}
    for line in r.stdout.splitlines():
        if line.startswith("BENCH "):
            res = json.loads(line[6:])
    # ground truth for accept length: completion tokens over verify steps, over all requests
    rows = []
    try:
        with open(f"{OUT}/bench.jsonl") as f:
            for line in f:
                d = json.loads(line)
                if d.get("label") == label:
                    rows = d.get("rows", [])
    except OSError:
        pass
    toks = sum(r["completion_tokens"] or 0 for r in rows)
    verify = sum(r["spec_verify_ct"] or 0 for r in rows)
    res["accept_len_tokens_over_verify"] = round(toks / verify, 4) if verify else None
    log(f"bench {label}: {res.get('seq_tok_per_s')} tok/s sequential, {res.get('conc_tok_per_s')} tok/s conc 8, "
        f"accept {res.get('mean_spec_accept_length')}")
    return res


def report(log_dir: str, label: str) -> dict:
    time.sleep(3)  # the runtime flushes every 2 s
    rc, out, _ = ep("report", "--skip", "5", log_dir)
    with open(f"{OUT}/report_{label}.txt", "w") as f:
        f.write(out)
    print(out, flush=True)
    rc, out, _ = ep("report", "--json", "--skip", "5", log_dir)
    rc2, by_bs, _ = ep("report", "--json", "--by", "bs", "--skip", "5", log_dir)
    return {"report": json.loads(out) if rc == 0 else None, "by_bs": json.loads(by_bs) if rc2 == 0 else None}


def accept_lines(variant_log: str) -> list[str]:
    lines = []
    for path in (variant_log, "/tmp/eaglepatch/server-30000.log"):
        try:
            with open(path, errors="replace") as f:
                lines += [ln.strip() for ln in f if "accept len" in ln]
        except OSError:
            pass
    return lines[-6:]


def stop_all() -> None:
    import psutil

    for p in psutil.process_iter(["cmdline"]):
        if "sglang.launch_server" in " ".join(p.info["cmdline"] or []):
            try:
                os.killpg(os.getpgid(p.pid), signal.SIGKILL)
            except Exception:
                pass
    time.sleep(3)


def main() -> int:
    variant = sys.argv[1]
    story["variant"] = variant
    os.makedirs(OUT, exist_ok=True)
    original = sha(WORKER)
    story["worker_sha256_before"] = original
    launch(variant)
    story["unpatched"] = bench(f"{variant}-unpatched")
    if variant == "base":
        stop_all()
        json.dump(story, open(f"{OUT}/story_{variant}.json", "w"), indent=1)
        return 0
    rc, out, _ = ep("show", "--json", f"{SITE}/sglang")
    story["show"] = json.loads(out) if rc == 0 else None
    rc, out, _ = ep("diff", f"{SITE}/sglang")
    with open(f"{OUT}/diff_{variant}.txt", "w") as f:
        f.write(out)
    for mode in ("sync", "events"):
        rc, out, _ = ep("apply", "--json", "--mode", mode, "--log-dir", f"/tmp/eplogs/{variant}_{mode}",
                        "--timeout", "300", f"{SITE}/sglang")
        story[f"apply_{mode}"] = {"rc": rc, "result": json.loads(out) if rc == 0 else None}
        if rc != 0:
            log(f"apply --mode {mode} failed: rc {rc}")
            break
        story[f"patched_{mode}"] = bench(f"{variant}-{mode}")
        story[f"patched_{mode}"].update(report(f"/tmp/eplogs/{variant}_{mode}", f"{variant}_{mode}"))
        story[f"accept_lines_{mode}"] = accept_lines(f"{OUT}/server_{variant}.log")
        rc, out, _ = ep("status", "--json", f"{SITE}/sglang")
        story[f"status_{mode}"] = json.loads(out) if rc == 0 else None
    rc, out, _ = ep("revert", "--json", "--timeout", "300", f"{SITE}/sglang")
    story["revert"] = {"rc": rc, "result": json.loads(out) if rc == 0 else None}
    story["worker_sha256_after"] = sha(WORKER)
    story["byte_identical"] = story["worker_sha256_after"] == original
    story["after_revert"] = bench(f"{variant}-reverted", n="5") if health() else {"error": "server not answering"}
    log(f"byte identical after revert: {story['byte_identical']}")
    stop_all()
    json.dump(story, open(f"{OUT}/story_{variant}.json", "w"), indent=1)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:
        if not os.path.exists(f"{OUT}/story_{sys.argv[1]}.json"):
            json.dump(story, open(f"{OUT}/story_{sys.argv[1]}.json", "w"), indent=1)
        stop_all()
