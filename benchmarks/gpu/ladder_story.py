#!/usr/bin/env python3
"""Production concurrency on the GPU-bound server (sglang 0.5.16, the shape of Llama-3-8B, a draft of known
acceptance P_BIG): one launch per phase, each loaded by ``eaglepatch bench --concurrency LADDER`` (every concurrency
in turn, in the one launch), as a user measures a server over a ladder of loads.

Run by benchmarks/gpu/ladder_story.sh on the GPU machine. Phases (``PHASES``, in order), each its own launch with
CUDA graphs up to MAX_BS:

* ``s5`` (``s<K>``): EAGLE3 at K draft steps, top-k 1, patched (``apply --no-restart`` before the launch, ``revert
  --no-restart`` after): its timing records span every batch size of the ladder; ``report --predict --json`` of
  them (every batch size's best step count from this one run) is kept;
* ``b0``: no speculation, unpatched: the baseline at each concurrency;
* ``d5`` (``d<K>``): the user's path through eaglepatch alone (``run_doctor``): a sweep with ``--baseline`` over the
  ladder, the put-back server loaded over it, then doctor and ``report --predict`` with that sweep;
* ``l0-3-5`` (``l<K>-<K>...``): the server launched adaptive with those candidates (patched), ``eaglepatch sweep
  --live`` over the ladder with ``--emit-adaptive-config`` (no launch: it runs adaptive already), then the emitted
  config launched as a user deploys it (patched: the records say which step count each cycle ran) and benched over
  the ladder (``run_live``).

Everything goes to ``$OUT/ladder_story.json`` (each bench document, the report). ``benchmarks/gpu/ladder_tables.py``
puts the phases of one or more calls together: the prediction from the K-step run with the baseline's ladder
against what the other launches measured. Env: OUT, T0, BUDGET, PHASES (s5,b0), P_BIG (0.7), LADDER (1,8,32,64),
MAX_BS (64), REQ (32), MAX_NEW (128), WARMUP (8).
"""

from __future__ import annotations

import json
import os
import sys

import story_lib as S  # noqa: E402

PHASES = [p for p in os.environ.get("PHASES", "s5,b0").split(",") if p]
P_BIG = float(os.environ.get("P_BIG", "0.7"))
LADDER = os.environ.get("LADDER", "1,8,32,64")
MAX_BS = int(os.environ.get("MAX_BS", "64"))
REQ = int(os.environ.get("REQ", "32"))
MAX_NEW = int(os.environ.get("MAX_NEW", "128"))
WARMUP = int(os.environ.get("WARMUP", "8"))
ROUNDS = os.environ.get("ROUNDS", "2")
WINDOW = os.environ.get("WINDOW", "8")
MDIR = "/tmp/known_big"
NEED = 150  # seconds a launch and its ladder take at least


def make() -> None:
    made = S.make_known(MDIR, P_BIG, "llama8b")
    if made is not None:
        S.story["model"] = made


def server(phase: str, steps: int, patched: bool) -> S.Server:
    """The launch of a phase at ``steps`` draft steps (0: none), CUDA graphs up to MAX_BS, the install patched
    first (``apply --no-restart``) when ``patched``; not started yet."""
    if patched:
        rc, _, _ = S.ep("apply", S.TARGET, "--no-restart", "--log-dir", S.LOG_DIR, "--json")
        if rc:
            raise SystemExit("apply failed")
    argv = [S.PY, "-m", "sglang.launch_server", "--model-path", f"{MDIR}/target", *S.spec_flags(MDIR, steps),
            *S.COMMON, "--cuda-graph-max-bs", str(MAX_BS)]
    srv = S.Server(phase, argv)
    srv.rec.update(steps=steps, patched=patched)
    return srv


def run_doctor(phase: str) -> None:
    """``d<K>``: the user's path, all through eaglepatch: the K-step server patched and launched; ``eaglepatch sweep
    --grid speculative-num-steps=K --baseline --concurrency LADDER`` (a launch without speculation and one at K,
    each loaded at every concurrency; the original put back); the put-back server loaded over the same ladder;
    then ``doctor --json`` and ``report --predict --json`` with that sweep kept on the machine."""
    steps = int(phase[1:])
    srv = server(phase, steps, patched=True)
    try:
        if not srv.up(max(60.0, S.left() - 60)):
            return
        load = ["--concurrency", LADDER, "--requests", str(REQ), "--max-new-tokens", str(MAX_NEW), "--input-len",
                "64", "--warmup", str(WARMUP)]
        for name, args in (("sweep", ["sweep", S.TARGET, "--grid", f"speculative-num-steps={steps}", "--baseline",
                                      *load, "--timeout", "300", "--json"]),
                           ("bench", ["bench", S.TARGET, *load, "--log-wait", "3", "--json"]),
                           ("doctor", ["doctor", S.TARGET, "--json"]),
                           ("report", ["report", S.TARGET, "--predict", "--json"])):
            if S.left() < 15:
                break
            rc, out, _ = S.ep(*args, timeout=max(15.0, S.left() - 10))
            if rc == 0:
                srv.rec[name] = json.loads(out)
    finally:
        srv.down()
        S.ep("revert", S.TARGET, "--no-restart", "--json")


def bench_ladder(srv: S.Server, phase: str) -> None:
    rc, out, _ = S.ep("bench", S.TARGET, "--concurrency", LADDER, "--requests", str(REQ), "--max-new-tokens",
                      str(MAX_NEW), "--input-len", "64", "--warmup", str(WARMUP), "--log-wait", "3", "--json",
                      timeout=max(30.0, S.left() - 20))
    if rc == 0:
        doc = json.loads(out)
        srv.rec["loads"] = doc.get("loads") or [doc]
        for d in srv.rec["loads"]:
            S.log(f"{phase} at {d['load']['concurrency']}: client {d['client']['tokens_per_s']} tok/s, accept "
                  f"{d['client'].get('accept_len')}")


def run_live(phase: str) -> None:
    """``l<K>-<K>...``: the adaptive server, the live sweep over the ladder with the emitted config, then that
    config deployed and benched over the ladder (both launches patched; reverted after)."""
    steps = [int(x) for x in phase[1:].split("-")]
    rc, _, _ = S.ep("apply", S.TARGET, "--no-restart", "--log-dir", S.LOG_DIR, "--json")
    if rc:
        raise SystemExit("apply failed")
    cfg = S.OUT / "live_candidates.json"
    cfg.write_text(json.dumps({"1": {"candidate_steps": steps}}))
    emit = S.OUT / "adaptive.json"
    head = [S.PY, "-m", "sglang.launch_server", "--model-path", f"{MDIR}/target"]
    tail = [*S.COMMON, "--cuda-graph-max-bs", str(MAX_BS)]
    srv = S.Server(phase, [*head, *S.spec_flags(MDIR, max(steps)), "--speculative-adaptive",
                           "--speculative-adaptive-config", str(cfg), *tail])
    srv.rec.update(steps=steps, patched=True, adaptive=True)
    try:
        if not srv.up(max(60.0, S.left() - 60)):
            return
        rc, out, err = S.ep("sweep", S.TARGET, "--live", "--grid", "speculative-num-steps=" + ",".join(map(str, steps)),
                            "--concurrency", LADDER, "--rounds", ROUNDS, "--window", WINDOW, "--requests", str(REQ),
                            "--max-new-tokens", str(MAX_NEW), "--input-len", "64", "--warmup", str(WARMUP),
                            "--log-wait", "3", "--emit-adaptive-config", str(emit), "--timeout", "300", "--json",
                            timeout=max(30.0, S.left() - 100))
        if rc == 0:
            srv.rec["sweep"] = json.loads(out)
        srv.rec["sweep_rc"], srv.rec["sweep_err"] = rc, err[-3000:]
    finally:
        srv.down()
    adaptive = (srv.rec.get("sweep") or {}).get("adaptive_config")
    if not adaptive or S.left() < 100:
        S.ep("revert", S.TARGET, "--no-restart", "--json")
        return
    deployed = S.OUT / "deployed_adaptive.json"  # the emitted file, as a user copies it to the host
    deployed.write_text(emit.read_text())
    flags = [str(deployed) if f == str(emit) else f for f in adaptive["launch_flags"]]
    dep = S.Server("a_" + phase[1:], [*head, "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path",
                                       f"{MDIR}/draft", *flags, *tail])
    dep.rec.update(tiers=adaptive["tiers"], tier_basis=adaptive.get("tier_basis"), patched=True, adaptive=True)
    try:
        if dep.up(max(60.0, S.left() - 40)):
            bench_ladder(dep, dep.name)
    finally:
        dep.down()
        S.ep("revert", S.TARGET, "--no-restart", "--json")


def run_phase(phase: str) -> None:
    if S.left() < NEED:
        S.log(f"{phase}: SKIPPED, {S.left():.0f} s left")
        S.story["launches"].append({"name": phase, "status": "skipped"})
        return
    if phase.startswith("d"):
        return run_doctor(phase)
    if phase.startswith("l"):
        return run_live(phase)
    steps = int(phase[1:])
    patched = phase.startswith("s")
    srv = server(phase, steps, patched)
    try:
        if not srv.up(max(60.0, S.left() - 60)):
            return
        bench_ladder(srv, phase)
        if patched and S.left() > 20:
            rc, out, _ = S.ep("report", S.LOG_DIR, "--predict", "--json", timeout=max(20.0, S.left() - 10))
            if rc == 0:
                srv.rec["report"] = json.loads(out)
    finally:
        srv.down()
        if patched:
            S.ep("revert", S.TARGET, "--no-restart", "--json")


def main() -> int:
    S.OUT.mkdir(parents=True, exist_ok=True)
    S.story.update(phases=PHASES, ladder=LADDER, p=P_BIG, max_bs=MAX_BS, req=REQ, max_new=MAX_NEW)
    make()
    for phase in PHASES:
        run_phase(phase)
        S.save("ladder_story")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:
        S.save("ladder_story")
