#!/usr/bin/env python3
"""What the timing runtime costs a GPU-bound server (H200, sglang 0.5.16, the shape of Llama-3-8B).

Run by benchmarks/gpu/cost_story.sh on the GPU machine. The big model of known acceptance (make_known_models.py,
``--shape llama8b``, p = P_BIG) at STEPS draft steps (top-k 1), launched once per phase (``PHASES``, in order):

* ``u``: unpatched (sglang as installed);
* ``e``: patched by ``eaglepatch apply --no-restart --mode events`` (reverted after the launch).

Each launch is loaded WINDOWS times by the same client (``eaglepatch bench --json``: REQ requests one at a time,
64 tokens in, MAX_NEW out); a patched launch then once more with C4 requests four at a time (records at a batch
size above one, for ``report --predict``; not part of the cost). The cost is the patched launches' median client tok/s against the unpatched ones'.
Everything goes to ``$OUT/cost_story.json``. Env: OUT, T0, BUDGET, PHASES (u,e,u), STEPS (3), P_BIG (0.8),
REQ (16), MAX_NEW (256), WINDOWS (3), C4 (24; 0: none).
"""

from __future__ import annotations

import os
import statistics
import sys

import story_lib as S  # noqa: E402

PHASES = [p for p in os.environ.get("PHASES", "u,e,u").split(",") if p]
STEPS = int(os.environ.get("STEPS", "3"))
P_BIG = float(os.environ.get("P_BIG", "0.8"))
REQ = int(os.environ.get("REQ", "16"))
MAX_NEW = int(os.environ.get("MAX_NEW", "256"))
WINDOWS = int(os.environ.get("WINDOWS", "3"))
C4 = int(os.environ.get("C4", "24"))  # one window of C4 requests, 4 at a time, after a patched launch's windows
MDIR = "/tmp/known_big"
NEED = 100  # seconds a warm launch and its windows take at least


def make() -> None:
    made = S.make_known(MDIR, P_BIG, "llama8b")
    if made is not None:
        S.story["model"] = made


def window(b: dict | None) -> dict | None:
    if b is None:
        return None
    g = S.decode_group(b) or {}
    return {"client": {k: b["client"].get(k) for k in ("tokens_per_s", "seconds", "output_tokens", "accept_len",
                                                      "failed")},
            "decode": {k: g.get(k) for k in ("n", "accept_len", "tokens_per_s", "wall_tokens_per_s", "between_ms",
                                             "cycle_ms", "host_cycle_ms", "acceptance", "predict", "predict_best",
                                             "predict_notes")} if g else None,
            "notes": b.get("notes")}


def run_phase(i: int, kind: str) -> None:
    name = f"{i}_{kind}"
    if S.left() < NEED:
        S.log(f"{name}: SKIPPED, {S.left():.0f} s left")
        S.story["launches"].append({"name": name, "status": "skipped"})
        return
    if kind == "e":
        rc, _, _ = S.ep("apply", S.TARGET, "--no-restart", "--mode", "events", "--log-dir", S.LOG_DIR, "--json")
        if rc:
            raise SystemExit("apply failed")
    argv = [S.PY, "-m", "sglang.launch_server", "--model-path", f"{MDIR}/target", *S.spec_flags(MDIR, STEPS),
            *S.COMMON, "--cuda-graph-max-bs", "8"]
    srv = S.Server(name, argv)
    srv.rec.update(kind=kind, steps=STEPS, windows=[])
    try:
        if not srv.up(max(60.0, S.left() - 40)):
            return
        for w in range(WINDOWS):
            if S.left() < 25:
                break
            got = window(S.bench(REQ, 1, MAX_NEW, warmup=2 if w == 0 else 1))
            srv.rec["windows"].append(got)
            c = (got or {}).get("client") or {}
            d = (got or {}).get("decode") or {}
            S.log(f"{name} window {w}: client {c.get('tokens_per_s')} tok/s, wall {d.get('wall_tokens_per_s')}")
        if kind == "e" and C4 and S.left() > 30:    # records at several requests a time, for the prediction
            srv.rec["c4"] = window(S.bench(C4, 4, MAX_NEW, warmup=1))
    finally:
        srv.down()
        if kind == "e":
            S.ep("revert", S.TARGET, "--no-restart", "--json")


def summary() -> dict:
    by = {"u": [], "e": []}
    for r in S.story["launches"]:
        tps = [w["client"]["tokens_per_s"] for w in r.get("windows") or [] if w and w["client"]["tokens_per_s"]]
        if tps:
            r["median_tokens_per_s"] = statistics.median(tps)
            by[r["kind"]].append(r["median_tokens_per_s"])
    out = {"launch_medians": by}
    if by["u"] and by["e"]:
        u, e = statistics.mean(by["u"]), statistics.mean(by["e"])
        out.update(unpatched=round(u, 2), patched=round(e, 2), cost_pct=round((1 - e / u) * 100, 2),
                   unpatched_spread_pct=round((max(by["u"]) - min(by["u"])) / u * 100, 2))
    return out


def main() -> int:
    S.OUT.mkdir(parents=True, exist_ok=True)
    S.story["phases"] = PHASES
    make()
    for i, kind in enumerate(PHASES):
        run_phase(i, kind)
        S.save("cost_story")
    S.story["summary"] = summary()
    S.log(f"summary: {S.story['summary']}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:
        S.save("cost_story")
