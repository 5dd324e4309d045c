#!/usr/bin/env python3
"""The proof tables of ladder_story: the best step count per batch size predicted from one run against what the
other launches measured, at each concurrency of the ladder.

    python3 benchmarks/gpu/ladder_tables.py --story a.json [--story b.json] --logs EPLOGS_DIR [--steps 5]
                                            [--json out.json]

The model reads the timing records of the ``s<steps>`` launch (``--logs``: its timing logs, as the story's
``eplogs.tgz`` holds them) by batch size, with no speculation as the ``b0`` launch measured it at each concurrency
(``baselines_of``: the client's figure there, over the ``s<steps>`` launch's client figure at the same
concurrency, times the records' own figure: so the two clients' scale carries over). Its points are on the
records' scale; each is put on the client's scale by the ``s<steps>`` launch's own client-to-records ratio at that
concurrency, then set beside the launches at other step counts, which it never saw.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from eaglepatch import report as rep  # noqa: E402
from eaglepatch.report.predict_bs import for_runs  # noqa: E402


def loads_of(stories: list[dict]) -> dict[int, dict[int, dict]]:
    """steps (0: none) -> concurrency -> that launch's bench document."""
    out: dict[int, dict[int, dict]] = {}
    for st in stories:
        for rec in st.get("launches") or []:
            for d in rec.get("loads") or []:
                out.setdefault(int(rec["steps"]), {})[int(d["load"]["concurrency"])] = d
    return out


def sweep_doc(loads: dict[int, dict[int, dict]], steps: int) -> dict:
    """The baseline and the ``steps`` launch as a sweep with a ladder reads (``predict_bs.baselines_of``)."""
    def point(k: int) -> dict:
        lds = [{"concurrency": c, "tokens_per_s": {"median": d["client"]["tokens_per_s"],
                                                   "min": d["client"]["tokens_per_s"],
                                                   "max": d["client"]["tokens_per_s"]}}
               for c, d in sorted(loads[k].items()) if d["client"].get("tokens_per_s")]
        return {"flags": {} if k == 0 else {"speculative-num-steps": str(k)}, "status": "ok",
                "tokens_per_s": lds[0]["tokens_per_s"], "loads": lds}
    return {"baseline": 0, "load": {"concurrency": min(loads[0])}, "points": [point(0), point(steps)]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--story", action="append", required=True)
    ap.add_argument("--logs", required=True)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--json")
    a = ap.parse_args()
    stories = [json.loads(Path(p).read_text()) for p in a.story]
    loads = loads_of(stories)
    files = sorted(glob.glob(os.path.join(a.logs, "**", "*.jsonl"), recursive=True))
    res = rep.aggregate(files, by="bs")
    runs = for_runs(res, sweep=sweep_doc(loads, a.steps))
    by_k = {r.id: dict(r.flags).get("speculative-num-steps") for r in res.runs}
    run = next(b for rid, b in runs.items() if by_k.get(rid) == str(a.steps))
    rows = {r.bs: r for r in run.rows}
    out = {"cost_model": run.model.to_json() if run.model else None, "crossover_bs": run.crossover_bs,
           "max_bs": run.max_bs, "notes": list(run.notes), "by_concurrency": []}
    print(f"cost model: {json.dumps(out['cost_model'])}")
    print(f"predicted crossover: {run.crossover_bs}")
    head = ["c", "steps", "measured client tok/s", "predicted (client scale)", "miss", "basis"]
    print(" | ".join(head))
    for c in sorted(loads[a.steps]):
        row = rows.get(c)
        own = loads[a.steps][c]["client"]["tokens_per_s"]
        if row is None or not own:
            continue
        pts = {p.steps: p for p in row.points}
        scale = own / pts[a.steps].tokens_per_s  # the launch's client over its records at this concurrency
        line = {"concurrency": c, "points": [], "predicted_best": row.points[row.best].steps}
        measured = {k: loads[k][c]["client"]["tokens_per_s"] for k in loads if c in loads[k]}
        line["measured_best"] = max(measured, key=measured.get)
        for k in sorted(measured):
            p = pts.get(k)
            pred = p.tokens_per_s * scale if p is not None else None
            miss = pred / measured[k] - 1 if pred else None
            line["points"].append({"steps": k, "measured": measured[k], "predicted": pred, "miss": miss,
                                   "spread": p.spread if p else None, "basis": p.basis if p else None})
            print(f"{c} | {k} | {measured[k]:.1f} | {pred:.1f} | {miss * 100:+.1f}% | {p.basis} +-{p.spread * 100:.0f}%"
                  if pred else f"{c} | {k} | {measured[k]:.1f} | - | - | -")
        print(f"{c}: best measured {line['measured_best']}, predicted {line['predicted_best']}")
        out["by_concurrency"].append(line)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
