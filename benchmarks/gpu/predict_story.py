#!/usr/bin/env python3
"""The acceptance profile and the prediction on real SGLang 0.5.16 EAGLE3 servers with drafts of known acceptance
(H200): are eaglepatch's accept length, profile and wall tok/s right, and does one run predict the others?

Run by benchmarks/gpu/predict_story.sh on the GPU machine. The models come from make_known_models.py (a target
whose next token is a fixed function of the current one, an EAGLE-3 draft that agrees on a share ``p`` of
tokens): ``tiny`` (hidden 2048, 8 layers: bound by the host's launches, like the testbed's first model) and
``big`` (the shape of Llama-3-8B: 32 layers of 4096, bf16, 16 GB of weights generated on the GPU: bound by the
GPU). ``eaglepatch apply --no-restart --mode events`` first, then per phase (``PHASES``, in order) one launch
of the server as a user would, two loads through ``eaglepatch bench --json`` (one request at a time, then
``CONC`` at a time), and the launch stopped:

* ``tiny_k<K>``, ``tiny_base``, ``big_k<K>``, ``big_base``: the tiny or big models at K draft steps (top-k 1),
  or without speculation (``base``).

Per bench the story keeps the client's figures (tok/s, the server's accept length and acceptance histogram), the
timing report of the same window with ``report --predict``'s points, and the truth: the exact walk of the bench's
prompts through ``f`` and ``S`` (known_truth.walk) and the formula 1 + p + ... + p^K. At the end it compares each
measured launch with what the other launches' records predicted for it. Everything goes to
``$OUT/predict_story.json``. Env: OUT, T0, BUDGET (seconds from T0), PHASES, P_TINY (0.5), P_BIG (0.8),
REQ1 (12), REQC (24), CONC (4), MAX_NEW (256).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, "/tmp/ep")  # eaglepatch as installed: the load's prompts
from eaglepatch.tuning.load import LoadSpec  # noqa: E402

import known_truth  # noqa: E402
import story_lib as S  # noqa: E402

HERE = Path(__file__).resolve().parent
PHASES = [p for p in os.environ.get("PHASES", "tiny_k5,tiny_k2,tiny_base,big_k3").split(",") if p]
P = {"tiny": float(os.environ.get("P_TINY", "0.5")), "big": float(os.environ.get("P_BIG", "0.8"))}
MODELS = {"tiny": "/tmp/known_tiny", "big": "/tmp/known_big"}
REQ1 = int(os.environ.get("REQ1", "12"))
REQC = int(os.environ.get("REQC", "24"))
CONC = int(os.environ.get("CONC", "4"))
MAX_NEW = int(os.environ.get("MAX_NEW", "256"))
NEED = {"tiny": 100, "big": 170}  # seconds a launch and its two benches take at least


def make(kind: str) -> None:
    mdir = MODELS[kind]
    if os.path.exists(f"{mdir}/known.json"):
        return
    t = time.time()
    args = [S.PY, str(HERE / "make_known_models.py"), "--out", mdir, "--p", str(P[kind]), "--check",
            "--shape", "tiny" if kind == "tiny" else "llama8b"]
    r = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       env=dict(os.environ, PYTHONPATH=str(S.SITE)))
    print(r.stdout[-2000:], flush=True)
    S.story.setdefault("models", {})[kind] = {"seconds": round(time.time() - t, 1), "rc": r.returncode,
                                              "out_tail": r.stdout[-800:]}
    if r.returncode:
        raise SystemExit(f"make_known_models {kind} failed")


def truth(kind: str, steps: int, requests: int, conc: int) -> dict:
    f, member, p = known_truth.load(f"{MODELS[kind]}/known.json")
    spec = LoadSpec(requests=requests, concurrency=conc, input_len=64, max_new_tokens=MAX_NEW, warmup=2)
    ends = [pr[-1] for pr in spec.prompts(requests)]
    w = known_truth.walk(ends, f, member, steps, MAX_NEW) if steps else None
    return {"p": p, "formula": known_truth.formula(p, steps), "walk": w}


def summary(b: dict | None) -> dict | None:
    if b is None:
        return None
    g = S.decode_group(b) or {}
    return {"client": b["client"], "notes": b.get("notes"), "window": b.get("window"),
            "decode": {k: g.get(k) for k in ("n", "accept_len", "tokens_per_s", "wall_tokens_per_s", "between_ms",
                                             "cycle_ms", "host_cycle_ms", "acceptance", "predict", "predict_best",
                                             "predict_notes", "predict_note")},
            "phases_p50": {k: v.get("p50") for k, v in (g.get("phases") or {}).items()}}


def run_phase(name: str) -> None:
    kind, _, what = name.partition("_")
    steps = 0 if what == "base" else int(what[1:])
    if S.left() < NEED[kind]:
        S.log(f"{name}: SKIPPED, {S.left():.0f} s left")
        S.story["launches"].append({"name": name, "status": "skipped"})
        return
    make(kind)
    mdir = MODELS[kind]
    argv = [S.PY, "-m", "sglang.launch_server", "--model-path", f"{mdir}/target", *S.spec_flags(mdir, steps),
            *S.COMMON, "--cuda-graph-max-bs", "8"]
    srv = S.Server(name, argv)
    srv.rec.update(kind=kind, steps=steps)
    try:
        if not srv.up(max(60.0, S.left() - 40)):
            return
        for label, req, conc in (("c1", REQ1, 1), (f"c{CONC}", REQC, CONC)):
            if S.left() < 25:
                break
            srv.rec[label] = summary(S.bench(req, conc, MAX_NEW))
            srv.rec[label + "_truth"] = truth(kind, steps, req, conc)
            d = (srv.rec[label] or {}).get("decode") or {}
            c = (srv.rec[label] or {}).get("client") or {}
            S.log(f"{name} {label}: client {c.get('tokens_per_s')} tok/s, wall {d.get('wall_tokens_per_s')}, "
                  f"accept eaglepatch {d.get('accept_len')} server {c.get('accept_len')} truth "
                  f"{(srv.rec[label + '_truth'].get('walk') or {}).get('accept_len')}")
        srv.rec["decode_lines"] = [ln for ln in S.tail(srv.logpath, 300) if "Decode batch" in ln][-4:]
    finally:
        srv.down()


def compare() -> list[dict]:
    """Each measured bench against the prediction for its step count made from every other launch of the same
    models and load: (predicted tok/s, its spread and basis) against the client's and the records' tok/s."""
    out = []
    done = [r for r in S.story["launches"] if r.get("status") == "ok"]
    for m in done:
        for label in ("c1", f"c{CONC}"):
            got = m.get(label)
            if not got:
                continue
            for src in done:
                if src is m or src.get("kind") != m.get("kind") or not src.get(label):
                    continue
                pts = (src[label]["decode"] or {}).get("predict") or []
                pt = next((p for p in pts if p["steps"] == m["steps"]), None)
                if pt is None:
                    continue
                meas = (got["decode"] or {}).get("wall_tokens_per_s") if m["steps"] else got["client"]["tokens_per_s"]
                out.append({"measured": m["name"], "from": src["name"], "load": label, "steps": m["steps"],
                            "predicted": pt["tokens_per_s"], "spread": pt["spread"], "basis": pt["basis"],
                            "measured_wall": meas, "measured_client": got["client"]["tokens_per_s"],
                            "error": round(pt["tokens_per_s"] / meas - 1, 4) if meas else None})
    return out


def main() -> int:
    S.OUT.mkdir(parents=True, exist_ok=True)
    S.story["phases"] = PHASES
    rc, _, _ = S.ep("apply", S.TARGET, "--no-restart", "--mode", "events", "--log-dir", S.LOG_DIR, "--json")
    S.story["apply_rc"] = rc
    for name in PHASES:
        run_phase(name)
        S.save("predict_story")
    S.story["compare"] = compare()
    for c in S.story["compare"]:
        S.log(f"{c['measured']} {c['load']} from {c['from']}: predicted {c['predicted']} ({c['basis']}, "
              f"+-{c['spread']}) measured {c['measured_wall']} (client {c['measured_client']}): {c['error']}")
    rc, _, _ = S.ep("revert", S.TARGET, "--no-restart", "--json")
    S.story["revert_rc"] = rc
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:
        S.save("predict_story")
