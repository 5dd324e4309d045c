#!/usr/bin/env python3
"""The tables of docs/real-gpu.md's "What one run predicts" from a predict story's raw results, with the report
code of this checkout: per bench window the client's tok/s beside the report's wall tok/s, the accept lengths
(eaglepatch, the server, the walk of the construction), and each launch's prediction for every other launch.

    python benchmarks/gpu/predict_tables.py docs/gpu/predict_story_tiny.json docs/gpu/predict_story_tiny_eplogs.tar.xz
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from eaglepatch.report import aggregate
from eaglepatch.report.predict import predict
from tables_lib import unpack_logs


def main(story_path: str, logs_tgz: str) -> None:
    story = json.loads(Path(story_path).read_text())
    files = unpack_logs(logs_tgz)
    done = [L for L in story["launches"] if L.get("status") == "ok"]
    preds: dict[tuple[str, str], dict[int, dict]] = {}
    print("| launch | load | client tok/s | report wall tok/s | wall/client | accept len: eaglepatch / server / "
          "construction (walk) |")
    print("|---|---|---|---|---|---|")
    for L in done:
        for lab in ("c1", "c4"):
            b = L.get(lab)
            if not b:
                continue
            w, c = b["window"], b["client"]
            res = aggregate(files, t_min=w["start"], t_max=w["end"], merge_runs=True)
            g = res.group("decode")
            walk = (L.get(lab + "_truth") or {}).get("walk") or {}
            if g is None:
                print(f"| {L['name']} | {lab} | {c['tokens_per_s']:.1f} | - | - | - |")
                continue
            p = predict(res, flags={"speculative-num-steps": str(L["steps"]), "speculative-eagle-topk": "1",
                                    "speculative-num-draft-tokens": str(L["steps"] + 1)})[
                [i for i, x in enumerate(res.groups) if x.mode == "decode"][0]]
            preds[(L["name"], lab)] = {pt.steps: pt for pt in p.points}
            print(f"| {L['name']} | {lab} | {c['tokens_per_s']:.1f} | {g.wall_tokens_per_s:.1f} | "
                  f"{(g.wall_tokens_per_s / c['tokens_per_s'] - 1) * 100:+.1f}% | {g.accept_len:.3f} / "
                  f"{c['accept_len']:.3f} / {walk.get('accept_len', 0):.3f} |")
    print()
    print("| measured launch | load | measured client tok/s | predicted from | basis | predicted tok/s (spread) | "
          "error |")
    print("|---|---|---|---|---|---|---|")
    for m in done:
        for lab in ("c1", "c4"):
            if not m.get(lab):
                continue
            meas = m[lab]["client"]["tokens_per_s"]
            for (src, slab), pts in preds.items():
                if slab != lab or src == m["name"] or m["steps"] not in pts:
                    continue
                pt = pts[m["steps"]]
                print(f"| {m['name']} | {lab} | {meas:.1f} | {src} | {pt.basis} | {pt.tokens_per_s:.1f} "
                      f"(\u00b1{pt.spread * 100:.0f}%) | {(pt.tokens_per_s / meas - 1) * 100:+.1f}% |")


if __name__ == "__main__":
    main(*sys.argv[1:3])
