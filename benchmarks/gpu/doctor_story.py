#!/usr/bin/env python3
"""``eaglepatch doctor`` on real SGLang 0.5.16 servers (H200): does it name the real mistakes, and only those?

Run by benchmarks/gpu/doctor_story.sh on the GPU machine (the testbed of ../shared/gpu-sglang unpacked in /tmp/site,
eaglepatch installed in /tmp/ep). One device call (9 minutes): a server launch takes 65-145 s there, so three
launches, each loaded briefly:

0. ``eaglepatch apply --no-restart --mode events --log-dir /tmp/eplogs /tmp/site/sglang`` before any server runs
   (every launch then writes timing records);
1. ``rand``: EAGLE3, the random draft (accept length about 1), ``--cuda-graph-max-bs 16``, a load of 4 at a time:
   expects ``accept-length-low`` with its evidence (the log's ``accept len`` lines, ``avg_spec_accept_length``,
   the records), and neither ``eagle3-draft-as-eagle`` nor ``cuda-graph-off``;
2. ``agree``: EAGLE3, the agreeing draft (accept length 4), the same: expects none of the three (the healthy
   counterpart);
3. ``eagle_small_bs``: the random EAGLE-3 draft launched with ``--speculative-algorithm EAGLE`` and
   ``--cuda-graph-max-bs 2``, a load of 8 at a time: expects ``eagle3-draft-as-eagle`` (the draft's config.json
   says LlamaForCausalLMEagle3) and ``cuda-graph-off`` (decode lines ``cuda graph: False``, batches of 8 > 2).
   ``SPLIT=1`` makes it two launches (``eagle``: EAGLE, max bs 16; ``small_bs``: EAGLE3, max bs 2) when the budget
   allows; a launch that does not come up is recorded with its log tail, and when ``eagle_small_bs`` fails to
   start the ``small_bs`` launch is tried instead.

Each server is launched as a user would (detached, its output appended to ``$OUT/server_<name>.log``, which
doctor finds through /proc/PID/fd/1), loaded with ``eaglepatch bench``, examined with ``eaglepatch doctor --json``
and stopped. At the end ``eaglepatch revert --no-restart``. Everything goes to ``$OUT/doctor_story.json``: per
launch its command line, time to ready, the bench's figures, the doctor document, the ids expected present and
absent, and whether they were.

``REHEARSAL=1`` runs the same story on this machine with the stand-in server of tests/stubs (no GPU; its
``--sim-sglang-log`` prints sglang's decode lines, ``--accept-length 1.0`` stands for the random draft): it checks
the script, not sglang. Env: OUT, T0, BUDGET (seconds from T0, default 500), SPLIT, REQUESTS (16), MAX_NEW (128).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
REHEARSAL = os.environ.get("REHEARSAL") == "1"
OUT = Path(os.environ.get("OUT", "/tmp/eagle_out"))
T0 = float(os.environ.get("T0", time.time()))
BUDGET = float(os.environ.get("BUDGET", "500"))
SPLIT = os.environ.get("SPLIT") == "1"
REQUESTS = os.environ.get("REQUESTS", "16")
MAX_NEW = os.environ.get("MAX_NEW", "128")
PY = sys.executable
LOG_DIR = "/tmp/eplogs"
story: dict = {"rehearsal": REHEARSAL, "split": SPLIT, "steps": [], "launches": []}

if REHEARSAL:
    _spec = importlib.util.spec_from_file_location(
        "standin_harness", ROOT / "tests" / "stubs" / "stand_in_sglang" / "standin_harness.py")
    harness = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(harness)
    BASE = Path(os.environ.get("REHEARSAL_DIR", "/tmp/doctor_rehearsal"))
    SITE = BASE / "site"
    PORT = harness.free_port()
    EP_ENV = dict(os.environ, XDG_CACHE_HOME=str(BASE / "cache"))
    EP_ENV.pop("PYTHONPATH", None)
    EP_CWD = str(BASE)  # not /tmp: its eaglepatch/ folder (server logs) would shadow the editable install
    MODELS = {"rand": BASE / "models", "agree": BASE / "models_agree"}
else:
    G = Path(os.environ.get("GPU_DIR", ROOT / ".gpu"))
    sys.path.insert(0, str(G))
    import orchestrate  # noqa: E402  (the testbed's launch flags and models)

    BASE = Path("/tmp")
    SITE = Path("/tmp/site")
    PORT = orchestrate.PORT
    EP_ENV = dict(os.environ, PYTHONPATH="/tmp/ep", XDG_CACHE_HOME="/tmp/epcache")
    EP_CWD = "/tmp"  # the installed eaglepatch, not the checkout's source tree (python -m puts cwd first)
    MODELS = {"rand": Path("/tmp/models"), "agree": Path("/tmp/models_agree")}
TARGET = str(SITE / "sglang")

# name -> (models, --speculative-algorithm, --cuda-graph-max-bs, concurrency, ids present, ids absent)
LAUNCHES = {
    "rand": ("rand", "EAGLE3", 16, 4, ["accept-length-low"], ["eagle3-draft-as-eagle", "cuda-graph-off"]),
    "agree": ("agree", "EAGLE3", 16, 4, [], ["accept-length-low", "eagle3-draft-as-eagle", "cuda-graph-off"]),
    "eagle_small_bs": ("rand", "EAGLE", 2, 8, ["eagle3-draft-as-eagle", "cuda-graph-off"], []),
    "eagle": ("rand", "EAGLE", 16, 4, ["eagle3-draft-as-eagle"], ["cuda-graph-off"]),
    "small_bs": ("rand", "EAGLE3", 2, 8, ["cuda-graph-off"], ["eagle3-draft-as-eagle"]),
}
FIRST_LAUNCH_S = 200  # a cold first launch (145 s) + load + doctor
LAUNCH_S = 130        # a warm one (65-75 s) + load + doctor


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def left() -> float:
    return T0 + BUDGET - time.time()


def ep(*args: str, timeout: float = 180) -> tuple[int, str, str]:
    t = time.time()
    p = subprocess.run([PY, "-m", "eaglepatch", *args], env=EP_ENV, cwd=EP_CWD, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=timeout)
    log(f"$ eaglepatch {' '.join(args)}: exit {p.returncode} in {time.time() - t:.1f}s")
    for line in p.stderr.strip().splitlines()[-6:]:
        print("  | " + line, flush=True)
    story["steps"].append({"cmd": "eaglepatch " + " ".join(args), "rc": p.returncode,
                           "seconds": round(time.time() - t, 1), "stderr_tail": p.stderr[-1500:]})
    return p.returncode, p.stdout, p.stderr


def prepare() -> None:
    """The install (rehearsal: a stand-in tree with a V1-shaped worker) and both sets of models."""
    if REHEARSAL:
        shutil.rmtree(BASE, ignore_errors=True)
        BASE.mkdir(parents=True)
        harness.make_tree(SITE, harness.V1_WORKER)
        for name, mdir in MODELS.items():
            for sub, cfg in (("target", {"architectures": ["LlamaForCausalLM"], "hidden_size": 1024,
                                         "vocab_size": 32000, "max_position_embeddings": 4096}),
                             ("draft", {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 1024,
                                        "vocab_size": 32000, "draft_vocab_size": 8000,
                                        "max_position_embeddings": 4096})):
                (mdir / sub).mkdir(parents=True, exist_ok=True)
                (mdir / sub / "config.json").write_text(json.dumps(cfg))
        return
    t = time.time()
    orchestrate.ensure_models(str(MODELS["rand"]), [])
    orchestrate.ensure_models(str(MODELS["agree"]), ["--agree"])
    story["models_s"] = round(time.time() - t, 1)
    for name, mdir in MODELS.items():
        story[f"draft_config_{name}"] = json.loads((mdir / "draft" / "config.json").read_text())


def server_argv(name: str) -> list[str]:
    models, algorithm, max_bs, _c, _p, _a = LAUNCHES[name]
    mdir = MODELS[models]
    spec = ["--model-path", f"{mdir}/target", "--speculative-algorithm", algorithm,
            "--speculative-draft-model-path", f"{mdir}/draft", "--speculative-num-steps", "3",
            "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]
    if REHEARSAL:
        extra = ["--port", str(PORT), "--cuda-graph-max-bs", str(max_bs), "--sim-sglang-log", "--startup-delay", "1"]
        if models == "rand":
            extra += ["--accept-length", "1.0"]
        return [PY, "-m", "sglang.launch_server", *spec, *extra]
    common = list(orchestrate.COMMON)
    common[common.index("--cuda-graph-max-bs") + 1] = str(max_bs)
    return [PY, "-m", "sglang.launch_server", *spec, *common]


def server_env() -> dict[str, str]:
    env = dict(os.environ)
    for k in ("XDG_CACHE_HOME", "PYTHONPATH"):
        env.pop(k, None)
    env["PYTHONPATH"] = str(SITE)
    if not REHEARSAL:
        env["SGLANG_ENABLE_JIT_DEEPGEMM"] = "0"
    return env


def health() -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health_generate", timeout=10) as r:
            return r.status == 200
    except Exception:
        return False


def stop(p: subprocess.Popen) -> None:
    """Stop the server this story started: its own session's process group (start_new_session), then wait for
    the port."""
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            break
        try:
            p.wait(wait)
            break
        except subprocess.TimeoutExpired:
            continue
    for _ in range(60):
        if not health():
            break
        time.sleep(0.5)
    time.sleep(2)


def tail(path: Path, n: int = 40) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-n:]
    except OSError:
        return []


def run_launch(name: str) -> dict:
    models, algorithm, max_bs, conc, present, absent = LAUNCHES[name]
    argv = server_argv(name)
    rec: dict = {"name": name, "argv": argv, "expect_present": present, "expect_absent": absent}
    story["launches"].append(rec)
    logpath = OUT / f"server_{name}.log"
    logf = open(logpath, "a")
    log(f"{name}: launching ({algorithm}, {models} draft, --cuda-graph-max-bs {max_bs})")
    t = time.time()
    p = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, env=server_env(), cwd="/tmp",
                         start_new_session=True)
    try:
        while time.time() - t < max(60.0, left() - 40):
            if p.poll() is not None:
                rec.update(status="died", log_tail=tail(logpath))
                log(f"{name}: the server died at start (exit {p.returncode})")
                return rec
            if health():
                break
            time.sleep(2)
        else:
            rec.update(status="timeout", log_tail=tail(logpath))
            log(f"{name}: not ready in time")
            return rec
        rec["ready_s"] = round(time.time() - t, 1)
        log(f"{name}: ready after {rec['ready_s']}s")
        rc, out, _ = ep("bench", TARGET, "--requests", REQUESTS, "--concurrency", str(conc), "--max-new-tokens",
                        MAX_NEW, "--warmup", "2", "--log-wait", "4", "--json")
        if rc == 0:
            b = json.loads(out)
            decode = next((g for g in (b.get("timings") or {}).get("groups") or [] if g["mode"] == "decode"), None)
            rec["bench"] = {"client": b["client"], "notes": b["notes"], "decode": decode}
        rc, out, _ = ep("doctor", TARGET, "--json")
        rec["doctor_rc"] = rc
        if rc == 0:
            doc = json.loads(out)
            rec["doctor"] = doc
            ids = [f["id"] for f in doc["findings"]]
            rec["ids"] = ids
            rec["missing"] = [i for i in present if i not in ids]
            rec["unexpected"] = [i for i in absent if i in ids]
            rec["pass"] = not rec["missing"] and not rec["unexpected"]
            log(f"{name}: findings {ids}; expected {present}, not {absent}: {'PASS' if rec['pass'] else 'FAIL'}")
        rc, out, _ = ep("doctor", TARGET)
        rec["doctor_text"] = out
        print(out, flush=True)
        rec["decode_lines"] = [ln for ln in tail(logpath, 400) if "Decode batch" in ln][-6:]
        rec["status"] = "ok"
        return rec
    finally:
        stop(p)
        logf.close()


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    prepare()
    log(f"prepared ({left():.0f}s left)")
    rc, _, _ = ep("apply", TARGET, "--no-restart", "--mode", "events", "--log-dir", LOG_DIR, "--json")
    story["apply_rc"] = rc
    plan = ["rand", "agree"] + (["eagle", "small_bs"] if SPLIT else ["eagle_small_bs"])
    for i, name in enumerate(plan):
        need = FIRST_LAUNCH_S if i == 0 else LAUNCH_S
        if left() < need:
            log(f"{name}: SKIPPED, {left():.0f}s left (< {need})")
            story["launches"].append({"name": name, "status": "skipped"})
            continue
        rec = run_launch(name)
        if name == "eagle_small_bs" and rec.get("status") != "ok" and left() >= LAUNCH_S:
            run_launch("small_bs")  # the EAGLE launch did not come up: prove the CUDA-graph finding alone
    rc, _, _ = ep("revert", TARGET, "--no-restart", "--json")
    story["revert_rc"] = rc
    done = [r for r in story["launches"] if "pass" in r]
    story["pass"] = bool(done) and all(r["pass"] for r in done)
    story["elapsed_s"] = round(time.time() - T0, 1)
    log(f"done: {len(done)} launch(es) examined, all as expected: {story['pass']}")
    return 0 if story["pass"] else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:
        (OUT / "doctor_story.json").write_text(json.dumps(story, indent=1))
