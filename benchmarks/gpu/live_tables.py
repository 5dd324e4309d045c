#!/usr/bin/env python3
"""The tables of docs/real-gpu.md's live sweep on the H200, from the live story's JSON (its state file holds every
window) and its timing logs, with this checkout's code: per step count the windows' client tok/s, their spread,
the accept length from the client and from the timing log against the construction, the cycles pinned; per
window and batch size the phases; and what the 5-step windows' records predicted for the other step counts.

    python benchmarks/gpu/live_tables.py docs/gpu/live_story_tiny_p50.json docs/gpu/live_story_tiny_p50_eplogs.tar.xz 0.5
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from eaglepatch import report as rep
from eaglepatch.report.predict import predict
from eaglepatch.tuning import live as lv
from eaglepatch.tuning.drive_live import _records
from tables_lib import state_runs, unpack_logs


def main(story_path: str, logs_tgz: str, p: float) -> None:
    story = json.loads(Path(story_path).read_text())
    runs = state_runs(list(story["state_files"].values())[0])
    files = unpack_logs(logs_tgz)
    by: dict[int, list[dict]] = {}
    for r in runs:
        lo, hi = r["window"]
        recs = list(_records(files, lo, hi))
        cyc = lv.count_cycles(recs, r["steps"])
        one = rep.aggregate(files, t_min=lo, t_max=hi)
        fig = lv.window_figures(r["client"], one.to_json(), cyc, r["steps"])
        dec = one.group("decode")
        by.setdefault(r["steps"], []).append({"tps": r["tokens_per_s"], "acc": r["accept_len"],
                                              "acc_log": fig["accept_len_log"], "cycles": cyc, "res": one,
                                              "wall": dec.wall_tokens_per_s if dec else None, "t": lo})
    print("| steps | windows: client tok/s (in time order) | median | (max-min)/median | accept len: client / "
          "timing log / construction | cycles pinned / not | wall tok/s / client, median |")
    print("|---|---|---|---|---|---|---|")
    for k in sorted(by):
        w = sorted(by[k], key=lambda x: x["t"])
        tps = [x["tps"] for x in w]
        med = statistics.median(tps)
        acc = statistics.mean(x["acc"] for x in w)
        acc_log = statistics.mean(x["acc_log"] for x in w if x["acc_log"] is not None)
        pinned = sum(x["cycles"]["pinned"] for x in w)
        other = sum(x["cycles"]["other"] for x in w)
        ratio = statistics.median(x["wall"] / x["tps"] - 1 for x in w if x["wall"])
        print(f"| {k} | {', '.join(f'{x:.0f}' for x in tps)} | {med:.0f} | {(max(tps) - min(tps)) / med * 100:.0f}% | "
              f"{acc:.3f} / {acc_log:.3f} / {sum(p ** i for i in range(k + 1)):.3f} | {pinned} / {other} | "
              f"{ratio * 100:+.1f}% |")
    print()
    print("| steps | bs 4: cycle p50 ms (GPU / host) | draft | verify | draft extend | between |")
    print("|---|---|---|---|---|---|")
    for k in sorted(by):
        lo = min(x["t"] for x in by[k])  # the step count's first window
        hi = next(r["window"][1] for r in runs if r["window"][0] == lo)
        bs4 = rep.aggregate(files, by="bs", t_min=lo, t_max=hi).group("decode", bs=4)
        if bs4 is None:
            continue

        def ph(name: str) -> str:
            x = bs4.phase(name)
            return "-" if x is None else f"{x.stats.p50:.2f} / {x.host.p50:.2f}"

        print(f"| {k} | {bs4.cycle.p50:.2f} / {bs4.host_cycle.p50:.2f} | {ph('draft')} | {ph('verify')} | "
              f"{ph('draft_extend')} | {bs4.between.p50:.2f} |")
    print()
    print("| from the 5-step window at | its client tok/s | predicted tok/s for 0 / 1 / 2 / 3 steps (basis) |")
    print("|---|---|---|")
    for w in sorted(by.get(5, []), key=lambda x: x["t"]):
        res = w["res"]
        pred = predict(res)[[i for i, g in enumerate(res.groups) if g.mode == "decode"][0]]
        pts = {pt.steps: pt for pt in pred.points}
        print(f"| {w['t'] - runs[0]['window'][0]:.0f} s | {w['tps']:.0f} | " + " / ".join(
            f"{pts[s].tokens_per_s:.0f} ({pts[s].basis})" for s in (0, 1, 2, 3)) + " |")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]))
