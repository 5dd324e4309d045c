#!/usr/bin/env python3
"""The tables of docs/real-gpu.md's live sweep against the restart sweep (issue 23) and of one run's prediction
against both (issue 22), from a live story's JSON (its state files hold every live window and every restart run)
and its timing logs, with this checkout's code:

* per step count: the live windows' client tok/s and the restart sweep's launches' (each in time order), medians,
  spreads ((max - min) / median) and their ratio;
* per 5-step run (each restart launch at the largest step count, and each live window at it): what its records at
  batch size 4 (the load's steady state) predict for the other step counts, against the tok/s measured there:
  the restart launches' batch-size-4 wall tok/s and client tok/s, and the live windows' client tok/s;
* where the time between decode cycles goes, per step count: the live windows' records (the state they were
  pinned to) and each restart launch's: the tokens a request gets per batch-size-4 cycle (the acceptance of the
  prompts that source sent), the GPU decode cycle at batch size 4 (median), the time from one such cycle to the
  next (median, and mean over gaps under 1 s, with the part of it in gaps over 20 ms: prefills and stalls), and
  the prefill's GPU time (median). A restart launch whose run kept its load's window (sweeps since 2026-12-04)
  shows its records before the load (sglang's own warm-up and the bench's) apart from those of the load, and its
  wall tok/s and predictions are read from the load's records alone (as bench reads them); an older launch's from
  all its records.

    python benchmarks/gpu/restart_tables.py docs/gpu/live_story_big_p70.json docs/gpu/live_story_big_p70_eplogs.tar.xz
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from eaglepatch import report as rep
from eaglepatch.report.predict import predict
from tables_lib import state_runs, unpack_logs

BS = 4


def spread(xs: list[float]) -> float:
    return (max(xs) - min(xs)) / statistics.median(xs)


def steps_of(point: str) -> int | None:
    flags = dict(json.loads(point)["flags"])
    k = flags.get("speculative-num-steps")
    return None if k is None else int(k)


def header_steps(path: str) -> tuple[int | None, float]:
    """The step count a launch's timing log says in its run header, and the time of its first line."""
    with open(path, encoding="utf-8") as fh:
        first = json.loads(fh.readline())
    k = (first.get("flags") or {}).get("speculative-num-steps")
    return (None if k is None else int(k)), first["t"]


def bs_group(res: rep.ReportResult):  # type: ignore[no-untyped-def]
    for i, g in enumerate(res.groups):
        if g.mode == "decode" and g.key_dict().get("bs") == BS:
            return i, g
    return None, None


def prediction(res: rep.ReportResult) -> dict[int, object]:
    i, _ = bs_group(res)
    pred = predict(res)[i] if i is not None else None
    return {pt.steps: pt for pt in pred.points} if pred else {}


def cadence(records: list[dict]) -> dict[str, float] | None:
    """Where the time between batch-size-4 decode cycles goes, in ms (see the module's text); None without two
    such cycles."""
    dec = sorted((r for r in records if r.get("mode") == "decode" and r.get("bs") == BS), key=lambda r: r["t"])
    if len(dec) < 2:
        return None
    gaps = [(b["t"] - a["t"]) * 1000 for a, b in zip(dec, dec[1:]) if b["t"] - a["t"] < 1.0]
    pre = [r["cycle_ms"] for r in records if r.get("mode") == "prefill"]
    return {"gpu": statistics.median(r["cycle_ms"] for r in dec), "gap_p50": statistics.median(gaps),
            "accepted": statistics.fmean(r["accepted"] for r in dec) / BS,
            "gap_mean": statistics.fmean(gaps), "over20": sum(g for g in gaps if g > 20) / len(gaps),
            "prefill": statistics.median(pre) if pre else float("nan"), "n_prefill": len(pre)}


def records_of(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()][1:]


def main(story_path: str, logs_tgz: str) -> None:
    story = json.loads(Path(story_path).read_text())
    states = story["state_files"]
    live_runs = state_runs(next((t for n, t in states.items() if "-live-" in n), ""))  # none: a restart story
    restart_runs = state_runs(next(t for n, t in states.items() if "-live-" not in n))
    files = unpack_logs(logs_tgz)

    live: dict[int, list[dict]] = {}
    for r in sorted(live_runs, key=lambda r: r["window"][0]):
        live.setdefault(steps_of(r["point"]), []).append(r)
    # each restart launch wrote one file (its server's pid); its header names its step count
    launches: dict[int | None, list[dict]] = {}
    for f in files:
        k, t0 = header_steps(f)
        res = rep.aggregate([f], by="bs")
        _, g = bs_group(res)
        if g is None or any(lo <= t0 <= hi for r in live_runs for lo, hi in [r["window"]]):
            continue  # the live sweep's adaptive server, or a launch without a load (the sweep's start)
        if live_runs and t0 < min(r["window"][0] for r in live_runs):
            continue
        launches.setdefault(k, []).append({"file": f, "t": t0, "res": res, "wall": g.wall_tokens_per_s})
    # the restart runs' client figures, in time order, matched to the launches in time order per step count
    for k in launches:
        launches[k].sort(key=lambda x: x["t"])
        runs = sorted((r for r in restart_runs if steps_of(r["point"]) == k), key=lambda r: r["t"])
        for L, r in zip(launches[k], runs):
            L["client"] = r["tokens_per_s"]
            L["accept_len"] = r["accept_len"]
            L["window"] = r.get("window")  # kept by sweeps since 2026-12-04: the bench's load, host clock
            if L["window"]:  # its records as bench read them: the load's alone, not the warm-up's
                lo, hi = L["window"]
                res = rep.aggregate([L["file"]], by="bs", t_min=lo, t_max=hi)
                _, g = bs_group(res)
                if g is not None:  # else its whole log, as an older sweep's
                    L["res"], L["wall"] = res, g.wall_tokens_per_s

    baseline = [r["tokens_per_s"] for r in sorted(restart_runs, key=lambda r: r["t"]) if steps_of(r["point"]) is None]
    if not live:  # a restart story: its launches (client tok/s), the baseline's too
        print("| steps | restart launches: client tok/s (time order) | median | spread | accept length |")
        print("|---|---|---|---|---|")
        for k in sorted(launches, key=lambda x: -1 if x is None else x):
            rt = [L["client"] for L in launches[k] if "client" in L]
            acc = ", ".join(f"{L['accept_len']:.3f}" for L in launches[k] if L.get("accept_len"))
            print(f"| {k} | " + ", ".join(f"{x:.0f}" for x in rt) + f" | {statistics.median(rt):.0f} | "
                  f"{spread(rt) * 100:.1f}% | {acc} |")
        if baseline:
            print("| no speculation | " + ", ".join(f"{x:.0f}" for x in baseline) + f" | "
                  f"{statistics.median(baseline):.0f} | {spread(baseline) * 100:.1f}% | 1 |")
        print()
    else:
        print("| steps | live windows: client tok/s (time order) | median | spread | restart launches: client tok/s "
              "(time order) | median | spread | restart spread / live spread |")
        print("|---|---|---|---|---|---|---|---|")
    for k in sorted(live):
        lt = [r["tokens_per_s"] for r in live[k]]
        rt = [L["client"] for L in launches.get(k, []) if "client" in L]
        cells = [", ".join(f"{x:.0f}" for x in lt), f"{statistics.median(lt):.0f}", f"{spread(lt) * 100:.1f}%"]
        if rt:
            cells += [", ".join(f"{x:.0f}" for x in rt), f"{statistics.median(rt):.0f}", f"{spread(rt) * 100:.1f}%",
                      f"{spread(rt) / spread(lt):.1f}x"]
        else:
            cells += ["(a live state only)", "", "", ""]
        print(f"| {k} | " + " | ".join(cells) + " |")
    print()

    measured = {k: {"wall": statistics.median(L["wall"] for L in v),
                    "client": statistics.median(L["client"] for L in v if "client" in L)}
                for k, v in launches.items() if k is not None}
    live_med = {k: statistics.median(r["tokens_per_s"] for r in v) for k, v in live.items()}
    top = max(measured)
    # the other step counts: the restart sweep's, and the live sweep's states (its 0 is not a plain server)
    targets = sorted(k for k in {*measured, *live_med} if k not in (top, 0))

    def head(k: int) -> str:
        vs = ([f"restart bs {BS} wall {measured[k]['wall']:.0f} / client {measured[k]['client']:.0f}"]
              if k in measured else []) + ([f"live {live_med[k]:.0f}"] if k in live_med else [])
        return f"{k} step{'s' if k > 1 else ''} predicted: vs " + " / ".join(vs)

    heads = [head(k) for k in targets]
    if baseline:  # the no-speculation point against the sweep's baseline launches (client tok/s)
        heads.append(f"no speculation predicted (spread): vs the baseline's client {statistics.median(baseline):.0f}")
    print(f"| from one {top}-step run | its bs {BS} wall tok/s | " + " | ".join(heads) + " | predicted best (basis): tok/s ± spread, and at the run's own steps |")
    print("|---|---|" + "---|" * len(heads) + "---|")
    sources = [(f"restart launch {i + 1}", L["res"]) for i, L in enumerate(launches[top])]
    for i, r in enumerate(live.get(top, [])):
        lo, hi = r["window"]
        sources.append((f"live window {i + 1}", rep.aggregate(files, by="bs", t_min=lo, t_max=hi)))
    for name, res in sources:
        pts = prediction(res)
        _, g = bs_group(res)
        if not pts or g is None:
            print(f"| {name} | - | " + " | ".join("-" for _ in heads) + " | - |")
            continue
        cells = []
        for k in targets:
            p = pts[k].tokens_per_s
            vs = ([measured[k]["wall"], measured[k]["client"]] if k in measured else []) + (
                [live_med[k]] if k in live_med else [])
            cells.append(f"{p:.0f} (" + " / ".join(f"{(p / m - 1) * 100:+.1f}%" for m in vs) + ")")
        if baseline:
            b, m = pts[0], statistics.median(baseline)
            cells.append(f"{b.tokens_per_s:.0f} (±{b.spread * 100:.0f}%, {b.basis}): {(b.tokens_per_s / m - 1) * 100:+.1f}%")
        best = max(pts.values(), key=lambda p: p.tokens_per_s)
        at_top = pts[top]
        print(f"| {name} | {g.wall_tokens_per_s:.0f} | " + " | ".join(cells) + f" | {best.steps} ({best.basis}): "
              f"{best.tokens_per_s:.0f} ±{best.spread * 100:.1f}%, {top} steps {at_top.tokens_per_s:.0f} "
              f"±{at_top.spread * 100:.1f}% |")
    print()
    print("| steps | restart launches: bs 4 wall tok/s (time order) | client tok/s | wall / client |")
    print("|---|---|---|---|")
    for k in sorted(x for x in launches if x is not None):
        v = launches[k]
        print(f"| {k} | " + ", ".join(f"{L['wall']:.0f}" for L in v) + " | " + ", ".join(
            f"{L.get('client', 0):.0f}" for L in v) + " | " + ", ".join(
            f"{(L['wall'] / L['client'] - 1) * 100:+.1f}%" for L in v if L.get("client")) + " |")

    if live:
        print()
        print(f"| steps | source | tokens per request per cycle | GPU decode cycle, bs {BS}, p50 (ms) | time between "
              f"bs {BS} cycles: p50 / mean (ms) | of the mean, in gaps over 20 ms | prefill GPU p50 (ms, n) |")
        print("|---|---|---|---|---|---|---|")
        first = min(r["window"][0] for r in live_runs)
        # the adaptive server's log: the last one begun before the first window
        before = [f for f in files if header_steps(f)[1] < first]
        live_recs = records_of(max(before, key=lambda f: header_steps(f)[1]))
        for k in sorted(live):
            wins = [r["window"] for r in live[k]]
            pinned = [r for r in live_recs if (r.get("spec") or {}).get("steps") == k
                      and any(lo <= r["t"] <= hi for lo, hi in wins)]
            rows = [("live windows", cadence(pinned))]
            for i, L in enumerate(launches.get(k, [])):
                recs = records_of(L["file"])
                if not L.get("window"):  # an older sweep: the launch's records, warm-up and all
                    rows.append((f"restart launch {i + 1}", cadence(recs)))
                    continue
                lo, hi = L["window"]
                rows.append((f"restart launch {i + 1}, before the load (warm-up)", cadence(
                    [r for r in recs if r["t"] < lo])))
                rows.append((f"restart launch {i + 1}, the load", cadence([r for r in recs if lo <= r["t"] <= hi])))
            for name, c in rows:
                if c is None:
                    print(f"| {k} | {name} | no two cycles at batch size {BS} | | | | |")
                    continue
                print(f"| {k} | {name} | {c['accepted']:.3f} | {c['gpu']:.2f} | {c['gap_p50']:.2f} / "
                      f"{c['gap_mean']:.2f} | {c['over20']:.2f} | {c['prefill']:.1f} ({c['n_prefill']}) |")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
