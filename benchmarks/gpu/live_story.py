#!/usr/bin/env python3
"""``eaglepatch sweep --live`` against the restart sweep on a real SGLang 0.5.16 EAGLE3 server (H200), with a draft
of known acceptance: one JSON with everything.

Run by benchmarks/gpu/live_story.sh on the GPU machine (the testbed of ../shared/gpu-sglang unpacked in /tmp/site,
eaglepatch installed in /tmp/ep). A launch of the real server takes 65-145 s there, and the restart sweep with
``--repeat 3`` is about 13 launches, more than one 9-minute device call: the story is done in stages, one per call,
each resuming from the previous call's JSON (``PREV``: its ``live_story.json``, which embeds the sweeps' state
files). Run the same command again with the last JSON as ``PREV`` until it says ``"done": true``:

1. ``live``: the server launched as a user would (``START=adaptive``, the default: already with
   ``--speculative-adaptive`` and every grid step count as a candidate, so the live sweep launches nothing;
   ``START=static``: ``--speculative-num-steps 3`` without it, so the live sweep makes its one launch and puts the
   static server back: two more launches, about 2.5 minutes more); then ``eaglepatch sweep --live --grid
   speculative-num-steps=0,1,3,5 --rounds ROUNDS --window WINDOW --emit-adaptive-config``, timed, its launches
   counted.
2. ``restart`` (as many calls as it takes): the same steps by ``eaglepatch sweep --grid
   speculative-num-steps=1,3,5 --baseline --repeat 3`` (a static launch cannot run 0 steps: the baseline, no
   speculation, stands beside the live sweep's zero-step state), killed at the call's deadline and resumed by
   the next call from its state file; its wall time summed over the calls.
3. ``deploy``: the emitted adaptive config launched and benched, then the best static point of the restart sweep
   launched and benched with the same load.
4. The comparison (every call, on what exists): per point the live tok/s inside the restart sweep's range, the
   spread over windows against the spread over launches (the issue asks for at least 3x narrower), the accept
   length per point against the construction (1 + p + ... + p^k, within 2%: no selection bias), wall times and
   launches; the adaptive config's tok/s against the best static point's.

The draft of known acceptance: ``LIVE_MODELS`` (a folder with ``target/`` and ``draft/``, default
``/tmp/known_p70``) and ``LIVE_P`` (the share of tokens the draft agrees on, default 0.7); when the folder lacks
``draft/config.json``, the story makes it with ``LIVE_MAKE`` (a shell command), else with the testbed's
``make_known_models.py --out LIVE_MODELS --p LIVE_P --check --shape LIVE_SHAPE`` (``tiny``, the default, or
``llama8b``).

``REHEARSAL=1`` runs the same story on this machine with the stand-in server of tests/stubs (no GPU; its adaptive
EAGLEWorkerV2 yields min(K + 1, 3.2) tokens a cycle, so the "construction" is that): it checks the script, not
sglang.

Usage: ``python3 live_story.py [STAGE]`` (STAGE: auto (default), live, restart, deploy). Env: STAGES (the stages
this call may run, in order: default live,restart,deploy; e.g. live,deploy leaves the restart sweep out), OUT, T0, BUDGET
(seconds from T0, default 520), PREV, LIVE_MODELS, LIVE_P, LIVE_MAKE, LIVE_SHAPE, START, GRID (0,1,3,5), ROUNDS (3), WINDOW
(12), RESTART_GRID (the restart sweep's step counts: GRID's but 0), CONC (4), MAX_NEW (128), REQUESTS (48: the
restart sweep's and the deploy benches' requests, about as long as a window), RESTART_WARMUP (2: the restart
sweep's unmeasured requests after each launch), REPEAT (3), BASELINE (1: the restart sweep's --baseline; 0 leaves its three launches out),
KEEP_BEST (1: the restart sweep's --keep-best, so that no launch puts its start back and deploy benches the best
point as the sweep left it, when that happens in the same call), LAUNCH_S (150: seconds a launch and its bench take
at worst, to decide whether a stage can begin), REHEARSAL.
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
STAGE = sys.argv[1] if len(sys.argv) > 1 else "auto"
OUT = Path(os.environ.get("OUT", "/tmp/eagle_out"))
T0 = float(os.environ.get("T0", time.time()))
BUDGET = float(os.environ.get("BUDGET", "520"))
PREV = os.environ.get("PREV", "")
START = os.environ.get("START", "adaptive")
STEPS = [int(s) for s in os.environ.get("GRID", "0,1,3,5").split(",")]
ROUNDS = os.environ.get("ROUNDS", "3")
WINDOW = os.environ.get("WINDOW", "12")
CONC = os.environ.get("CONC", "4")
MAX_NEW = os.environ.get("MAX_NEW", "128")
REQUESTS = os.environ.get("REQUESTS", "48")
REPEAT = os.environ.get("REPEAT", "3")
BASELINE = os.environ.get("BASELINE", "1") == "1"  # the restart sweep's --baseline (three launches more)
KEEP_BEST = os.environ.get("KEEP_BEST", "1") == "1"  # --keep-best: no launch to put the start back; deploy benches it
PY = sys.executable
LOG_DIR = "/tmp/eplogs"
LIVE_STEPS = ",".join(str(s) for s in STEPS)
STATIC_STEPS = os.environ.get("RESTART_GRID") or ",".join(str(s) for s in STEPS if s > 0)  # the restart sweep's
RESTART_WARMUP = os.environ.get("RESTART_WARMUP", "2")  # the restart sweep's unmeasured requests per launch
LOAD, RESTART_LOAD = (["--concurrency", CONC, "--max-new-tokens", MAX_NEW, "--warmup", w, "--log-wait", "4"]
                      for w in ("2", RESTART_WARMUP))
LAUNCH_S = float(os.environ.get("LAUNCH_S", "150"))  # a launch with its bench, at worst (cold caches: 145 s)

if REHEARSAL:
    _spec = importlib.util.spec_from_file_location(
        "standin_harness", ROOT / "tests" / "stubs" / "stand_in_sglang" / "standin_harness.py")
    harness = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(harness)
    BASE = Path(os.environ.get("REHEARSAL_DIR", "/tmp/live_rehearsal"))
    SITE = BASE / "site"
    PORT = 0  # chosen below: the previous call's (the sweeps' state files name it)
    MODELS = Path(os.environ.get("LIVE_MODELS", str(BASE / "models")))
    EP_ENV = dict(os.environ, XDG_CACHE_HOME=str(BASE / "cache"))
    EP_ENV.pop("PYTHONPATH", None)
    EP_CWD = str(BASE)  # not /tmp: its eaglepatch/ folder (server logs) would shadow the editable install
    LOG_DIR = str(BASE / "eplogs")
    LAUNCH_S = 10
else:
    G = Path(os.environ.get("GPU_DIR", ROOT / ".gpu"))
    sys.path.insert(0, str(G))
    import orchestrate  # noqa: E402  (the testbed's launch flags and models)

    BASE = Path("/tmp")
    SITE = Path("/tmp/site")
    PORT = orchestrate.PORT
    MODELS = Path(os.environ.get("LIVE_MODELS", "/tmp/known_p70"))
    EP_ENV = dict(os.environ, PYTHONPATH="/tmp/ep", XDG_CACHE_HOME="/tmp/epcache")
    EP_CWD = "/tmp"  # the installed eaglepatch, not the checkout's source tree (python -m puts cwd first)
P = float(os.environ.get("LIVE_P", "0.7"))
TARGET = str(SITE / "sglang")
SWEEPS = Path(EP_ENV["XDG_CACHE_HOME"]) / "eaglepatch" / "sweeps"

story: dict = json.loads(Path(PREV).read_text()) if PREV and Path(PREV).is_file() else {
    "rehearsal": REHEARSAL, "calls": [], "state_files": {}, "live": {}, "restart": {"seconds": 0.0, "calls": 0},
    "deploy": {}, "done": False}
if REHEARSAL:
    PORT = story.setdefault("port", harness.free_port())
call: dict = {"stage": STAGE, "t0": T0, "steps": []}
story["calls"].append(call)
story["config"] = {"models": str(MODELS), "p": P, "start": START, "grid": STEPS, "rounds": int(ROUNDS),
                   "window_s": float(WINDOW), "concurrency": int(CONC), "max_new_tokens": int(MAX_NEW),
                   "requests": int(REQUESTS), "repeat": int(REPEAT),
                   "restart_grid": [int(x) for x in STATIC_STEPS.split(",")], "baseline": BASELINE,
                   "restart_warmup": int(RESTART_WARMUP)}


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def left() -> float:
    return T0 + BUDGET - time.time()


def ep(*args: str, timeout: float = 300) -> tuple[int, str, str]:
    t = time.time()
    try:
        p = subprocess.run([PY, "-m", "eaglepatch", *args], env=EP_ENV, cwd=EP_CWD, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, timeout=timeout)
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as exc:
        rc, out, err = -1, exc.stdout or "", (exc.stderr or "") + "\n(timed out)"
        out, err = (out.decode() if isinstance(out, bytes) else out), (err.decode() if isinstance(err, bytes) else err)
    log(f"$ eaglepatch {' '.join(args)}: exit {rc} in {time.time() - t:.1f}s")
    for line in err.strip().splitlines()[-6:]:
        print("  | " + line, flush=True)
    call["steps"].append({"cmd": "eaglepatch " + " ".join(args), "rc": rc, "seconds": round(time.time() - t, 1),
                          "stderr_tail": err[-1500:]})
    return rc, out, err


def jload(text: str) -> dict | None:
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


# ----------------------------------------------------------------------------------------------------------------
# the install, the models, the server


def prepare() -> None:
    """The install (rehearsal: a stand-in tree with the adaptive V2 worker) and the models; the patch applied
    before any server runs (every launch then writes timing records)."""
    if REHEARSAL:
        shutil.rmtree(SITE, ignore_errors=True)
        harness.make_tree(SITE, None)
        harness.add_adaptive(SITE / "sglang")
        for sub in ("target", "draft"):
            (MODELS / sub).mkdir(parents=True, exist_ok=True)
            (MODELS / sub / "config.json").write_text("{}")
    elif not (MODELS / "draft" / "config.json").exists():
        make = os.environ.get("LIVE_MAKE") or " ".join([
            PY, str(ROOT / "benchmarks" / "gpu" / "make_known_models.py"), "--out", str(MODELS), "--p", str(P),
            "--check", "--shape", os.environ.get("LIVE_SHAPE", "tiny")])
        t = time.time()
        r = subprocess.run(make, shell=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env=dict(os.environ, PYTHONPATH=str(SITE)))  # torch and safetensors of the testbed
        call["make_models"] = {"cmd": make, "rc": r.returncode, "tail": r.stdout[-1500:],
                               "seconds": round(time.time() - t, 1)}
        if r.returncode:
            raise SystemExit(f"making the models failed (exit {r.returncode}): {make}")
    rc, _, _ = ep("apply", TARGET, "--no-restart", "--mode", "events", "--log-dir", LOG_DIR, "--json")
    if rc != 0:
        raise SystemExit("eaglepatch apply failed")


def construction(k: int) -> float:
    """The accept length at k steps by construction: 1 + p + ... + p^k (the rehearsal's stand-in: min(k+1, 3.2))."""
    if REHEARSAL:
        return min(k + 1.0, 3.2)
    return sum(P ** i for i in range(k + 1))


def server_argv(steps: int | None, extra: list[str] = ()) -> list[str]:
    """The server as a user launches it: EAGLE3 at ``steps`` (None: no speculation), plus ``extra``."""
    if REHEARSAL:
        spec = [] if steps is None else ["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", str(steps),
                                         "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens",
                                         str(steps + 1)]
        return [PY, "-m", "sglang.launch_server", "--port", str(PORT), "--model-path", str(MODELS / "target"), *spec,
                "--startup-delay", "1", *extra]
    spec = [] if steps is None else ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path",
                                     str(MODELS / "draft"), "--speculative-num-steps", str(steps),
                                     "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", str(steps + 1)]
    return [PY, "-m", "sglang.launch_server", "--model-path", str(MODELS / "target"), *spec, *orchestrate.COMMON,
            *extra]


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


def launch(name: str, argv: list[str]) -> tuple[subprocess.Popen | None, dict]:
    """Start a server detached (its own session, output to server_<name>.log) and wait until it answers."""
    rec: dict = {"name": name, "argv": argv}
    logpath = OUT / f"server_{name}.log"
    logf = open(logpath, "a")
    log(f"{name}: launching {' '.join(argv[3:])}")
    t = time.time()
    p = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, env=server_env(), cwd=str(BASE),
                         start_new_session=True)
    while time.time() - t < max(60.0, left() - 30):
        if p.poll() is not None:
            rec.update(status="died", log_tail=logpath.read_text(errors="replace").splitlines()[-40:])
            log(f"{name}: the server died at start (exit {p.returncode})")
            return None, rec
        if health():
            rec.update(status="ok", ready_s=round(time.time() - t, 1))
            log(f"{name}: ready after {rec['ready_s']}s")
            return p, rec
        time.sleep(1 if REHEARSAL else 2)
    rec.update(status="timeout", log_tail=logpath.read_text(errors="replace").splitlines()[-40:])
    stop(p)
    return None, rec


def port_launchers() -> list[int]:
    """The sglang launchers whose command line says ``--port PORT`` (read from /proc)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            argv = Path(f"/proc/{d}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [a.decode(errors="replace") for a in argv]
        if "sglang.launch_server" in words and any(a == "--port" and b == str(PORT) for a, b in zip(words, words[1:])):
            out.append(int(d))
    return out


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not: a child of this story is reaped here)."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    except ChildProcessError:
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:][:1] not in ("Z", "X")


def stop(p: subprocess.Popen | None = None) -> None:
    """Stop the server this story started (its session's process group), or whatever eaglepatch left running on
    the port (a sweep's restored server: found by the port, in the rehearsal by the harness)."""
    pids = [p.pid] if p is not None else port_launchers()
    for pid in pids:
        for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            try:
                os.killpg(os.getpgid(pid), sig)
            except (ProcessLookupError, PermissionError):
                break
            end = time.time() + wait
            while time.time() < end and alive(pid):
                time.sleep(0.2)
            if not alive(pid):
                break
    for _ in range(60):
        if not health():
            break
        time.sleep(0.5)
    time.sleep(1)


# ----------------------------------------------------------------------------------------------------------------
# the sweeps' state, carried in the story from call to call


def restore_state() -> None:
    SWEEPS.mkdir(parents=True, exist_ok=True)
    for name, text in story["state_files"].items():
        (SWEEPS / name).write_text(text)
        os.chmod(SWEEPS / name, 0o600)


def keep_state() -> None:
    for f in sorted(SWEEPS.glob("*.jsonl")):
        story["state_files"][f.name] = f.read_text()


def run_until_deadline(args: list[str], name: str, margin: float) -> tuple[int | None, str, float]:
    """Run eaglepatch with ``args``; SIGKILL it ``margin`` seconds before the call's deadline (its saved windows or
    runs stay: the next call resumes). Returns (exit code or None when killed, stdout, seconds)."""
    cmd = [PY, "-m", "eaglepatch", *args]
    log(f"$ eaglepatch {' '.join(args)}")
    out, err = OUT / f"{name}.json", OUT / f"{name}.log"
    t = time.time()
    p = subprocess.Popen(cmd, env=EP_ENV, cwd=EP_CWD, stdout=open(out, "w"), stderr=open(err, "w"),
                         start_new_session=True)
    rc = None
    while p.poll() is None:
        if left() < margin:
            log(f"deadline: stopping {name} (SIGKILL: what it saved stays; the next call resumes)")
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            break
        time.sleep(1)
    else:
        rc = p.returncode
    seconds = time.time() - t
    tail = err.read_text(errors="replace").splitlines()
    call["steps"].append({"cmd": "eaglepatch " + " ".join(args), "rc": rc, "seconds": round(seconds, 1),
                          "stderr_tail": tail[-60:]})
    log(f"{name}: exit {rc} after {seconds:.0f}s")
    return rc, out.read_text(), seconds


# ----------------------------------------------------------------------------------------------------------------
# the stages


def stage_live() -> None:
    live = story["live"]
    top = max(STEPS)
    if START == "adaptive":
        cfg = BASE / "live_candidates.json"
        cfg.write_text(json.dumps({"1": {"candidate_steps": sorted(STEPS)}}))
        extra = ["--speculative-adaptive", "--speculative-adaptive-config", str(cfg)]
        p, rec = launch("live_start", server_argv(top, extra))
    else:
        p, rec = launch("live_start", server_argv(3))
    live["start"] = rec
    if p is None:
        return
    args = ["sweep", TARGET, "--live", "--grid", f"speculative-num-steps={LIVE_STEPS}", "--rounds", ROUNDS,
            "--window", WINDOW, *LOAD, "--timeout", "400", "--json", "--chart", str(OUT / "live_sweep.svg"),
            "--emit-adaptive-config", str(OUT / "adaptive.json")]
    live["cmd"] = "eaglepatch " + " ".join(args)
    rc, out, seconds = run_until_deadline(args, "live_sweep", margin=20)
    live["seconds"] = round(live.get("seconds", 0.0) + seconds, 1)
    live["rc"] = rc
    doc = jload(out) if rc == 0 else None
    if doc is not None:
        live["doc"] = doc
        live["launches"] = doc.get("launches")
        # the one launch, and putting the static server back after it (restarts a restart sweep counts too)
        live["restarts"] = (doc.get("launches") or 0) + int(bool((doc.get("restore") or {}).get("restarted")))
        if (OUT / "adaptive.json").exists():
            live["adaptive_json"] = json.loads((OUT / "adaptive.json").read_text())
    stop()


def stage_restart() -> None:
    rs = story["restart"]
    args = ["sweep", TARGET, "--grid", f"speculative-num-steps={STATIC_STEPS}", *(["--baseline"] if BASELINE else []),
            *(["--keep-best"] if KEEP_BEST else []), "--repeat", REPEAT, "--requests", REQUESTS, *RESTART_LOAD,
            "--timeout", "400", "--json", "--chart", str(OUT / "restart_sweep.svg")]
    rs["cmd"] = "eaglepatch " + " ".join(args)
    if "doc" not in rs and not story["state_files"].get(rs.get("state", "")):
        # the first call: a server to sweep (the static one, as the live sweep's START=static puts back)
        p, rec = launch("restart_start", server_argv(3))
        rs["start"] = rec
        if p is None:
            return
    rc, out, seconds = run_until_deadline(args, "restart_sweep", margin=15)
    rs["seconds"] = round(rs.get("seconds", 0.0) + seconds, 1)
    rs["calls"] = rs.get("calls", 0) + 1
    rs["rc"] = rc
    doc = jload(out) if rc == 0 else None
    if doc is not None:
        rs["doc"] = doc
        rs["state"] = os.path.basename(doc.get("state_file", ""))
        rs["launches"] = sum(1 for line in Path(doc["state_file"]).read_text().splitlines()
                             if '"kind":"launch"' in line) + int(bool((doc.get("restore") or {}).get("restarted")))
        if KEEP_BEST and health():
            return  # the best point runs (--keep-best): deploy benches it as it is, no launch
    else:
        files = sorted(SWEEPS.glob("*.jsonl"), key=lambda f: f.stat().st_mtime)
        restart_files = [f for f in files if "-live-" not in f.name]
        if restart_files:
            rs["state"] = restart_files[-1].name
    stop()


def bench() -> dict | None:
    rc, out, _ = ep("bench", TARGET, "--requests", REQUESTS, "--concurrency", CONC, "--max-new-tokens", MAX_NEW,
                    "--warmup", "2", "--log-wait", "4", "--json")
    doc = jload(out) if rc == 0 else None
    if doc is None:
        return None
    decode = [g for g in (doc.get("timings") or {}).get("groups") or [] if g.get("mode") == "decode"]
    return {"client": doc["client"], "notes": doc["notes"], "decode_groups": decode}


def stage_deploy() -> None:
    dep = story["deploy"]
    rdoc = story["restart"].get("doc")
    if KEEP_BEST and rdoc and rdoc.get("best") is not None and "best_static" not in dep and health():
        best = rdoc["points"][rdoc["best"]]  # left running by the restart sweep's --keep-best, in this call
        dep["best_static"] = {"launch": {"name": "kept by sweep --keep-best", "status": "ok"}, "label": best["label"],
                              "bench": bench()}
    stop()
    adaptive = story["live"].get("doc", {}).get("adaptive_config")
    if adaptive and "adaptive" not in dep and left() > LAUNCH_S:
        cfg = BASE / "emitted_adaptive.json"  # the emitted file, as a user copies it to the host
        cfg.write_text(json.dumps(adaptive["config"]))
        flags = adaptive["launch_flags"]
        top = int(flags[flags.index("--speculative-num-steps") + 1])
        # server_argv(top) holds the steps, top-k 1 and draft tokens of launch_flags; the adaptive pair is added
        p, rec = launch("deploy_adaptive", server_argv(top, ["--speculative-adaptive",
                                                             "--speculative-adaptive-config", str(cfg)]))
        dep["adaptive"] = {"launch": rec, "tiers": adaptive["tiers"], "flags": flags}
        if p is not None:
            dep["adaptive"]["bench"] = bench()
            stop(p)
    if rdoc and rdoc.get("best") is not None and "best_static" not in dep and left() > LAUNCH_S:
        best = rdoc["points"][rdoc["best"]]
        steps = best["flags"].get("speculative-num-steps")
        p, rec = launch("deploy_best_static", server_argv(int(steps) if steps else None))
        dep["best_static"] = {"launch": rec, "label": best["label"]}
        if p is not None:
            dep["best_static"]["bench"] = bench()
            stop(p)


# ----------------------------------------------------------------------------------------------------------------
# the comparison


def compare() -> dict:
    """What the issue asks of the live sweep, on what has been measured so far."""
    out: dict = {"points": []}
    ldoc, rdoc = story["live"].get("doc"), story["restart"].get("doc")
    if ldoc:
        by_steps = {}
        if rdoc:
            for p in rdoc["points"]:
                k = p["flags"].get("speculative-num-steps")
                by_steps["baseline" if k is None else int(k)] = p
        for p in ldoc["points"]:
            k = p["steps"]
            row: dict = {"steps": k, "live": p.get("tokens_per_s"), "live_spread": p.get("spread"),
                         "live_windows": p.get("windows"), "accept_len_client": p.get("accept_len"),
                         "construction": round(construction(k), 4), "cycles": p.get("cycles")}
            row["accept_len_log"] = p.get("accept_len_log")  # per request-cycle, from the timing log
            for key in ("accept_len_client", "accept_len_log"):
                if row[key] is not None:
                    row[key + "_within_2pct"] = abs(row[key] / row["construction"] - 1) <= 0.02
            r = by_steps.get(k if k > 0 else "baseline")
            if r is not None and r.get("status") == "ok" and p.get("tokens_per_s"):
                rt = r["tokens_per_s"]
                row["restart"] = rt
                row["restart_point"] = r["label"]
                row["restart_spread"] = round((rt["max"] - rt["min"]) / rt["median"], 4)
                if k > 0:
                    row["live_within_restart_range"] = rt["min"] <= p["tokens_per_s"]["median"] <= rt["max"]
                    if p.get("spread"):
                        row["spread_ratio"] = round(row["restart_spread"] / p["spread"], 2)
                        row["spread_3x_narrower"] = row["spread_ratio"] >= 3
            out["points"].append(row)
        out["live_best"] = ldoc["points"][ldoc["best"]]["label"] if ldoc.get("best") is not None else None
    if rdoc:
        out["restart_best"] = rdoc["points"][rdoc["best"]]["label"] if rdoc.get("best") is not None else None
    out["wall_s"] = {"live": story["live"].get("seconds"), "restart": story["restart"].get("seconds")}
    out["launches"] = {"live": story["live"].get("launches"), "restart": story["restart"].get("launches")}
    out["restarts"] = {"live": story["live"].get("restarts"), "restart": story["restart"].get("launches")}
    dep = story["deploy"]
    a = ((dep.get("adaptive") or {}).get("bench") or {}).get("client", {}).get("tokens_per_s")
    b = ((dep.get("best_static") or {}).get("bench") or {}).get("client", {}).get("tokens_per_s")
    if a and b:
        out["adaptive_vs_best_static"] = {"adaptive": a, "best_static": b, "ratio": round(a / b, 4)}
    return out


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    restore_state()
    prepare()
    run = {"live": stage_live, "restart": stage_restart, "deploy": stage_deploy}
    finished = {"live": lambda: "doc" in story["live"], "restart": lambda: "doc" in story["restart"],
                "deploy": lambda: {"adaptive", "best_static"} <= set(story["deploy"])}
    need = {"live": 0, "restart": 3 * LAUNCH_S, "deploy": 2 * LAUNCH_S}  # to begin it after another stage
    order = [s for s in os.environ.get("STAGES", "live,restart,deploy").split(",") if s in run]
    if not order:
        raise SystemExit(f"STAGES={os.environ.get('STAGES')!r} names no stage (live, restart, deploy)")
    first = STAGE if STAGE in run else next((s for s in order if not finished[s]()), None)
    todo = [] if first is None else order[order.index(first):] if first in order else [first]
    call["ran"] = []
    for stage in todo:
        if call["ran"] and left() < need[stage]:
            break
        log(f"stage {stage} ({left():.0f}s left)")
        call["ran"].append(stage)
        run[stage]()
        if not finished[stage]():
            break  # the next call goes on from here
    keep_state()
    story["done"] = all(finished[s]() for s in order)  # the stages asked for (STAGES)
    if story["done"]:
        ep("revert", TARGET, "--no-restart", "--json")
    return 0


if __name__ == "__main__":
    code = 3
    try:
        code = main()
    finally:
        story["comparison"] = compare()
        call["exit"] = code
        call["seconds"] = round(time.time() - T0, 1)
        (OUT / "live_story.json").write_text(json.dumps(story, indent=1))
        log(f"story written: {OUT / 'live_story.json'} (done: {story['done']})")
        if REHEARSAL:  # on a GPU machine the call's end stops everything; here, stop the stand-in
            stop()
    sys.exit(code)
