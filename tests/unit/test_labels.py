"""Every tok/s eaglepatch prints says whose it is (issue 42): the client's (what the load received), the records'
wall rate (tokens over cycle plus between time) or the in-cycle rate (time inside the entry method only), in the
words of ``eaglepatch.report.labels``. A report with its prediction and its best step count per batch size, a
bench's text (one load and a ladder), a restart sweep's and a live sweep's tables, and doctor's findings, each
rendered from records, summaries and facts built the way the commands build them; then one regular expression
over the whole text: no ``tok/s`` (nor ``tokens/s``) without a label right before it.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from eaglepatch.doctor import rules as R
from eaglepatch.doctor.collect import document, load_records
from eaglepatch.doctor.facts import ServerFacts
from eaglepatch.doctor.render import render as render_doctor
from eaglepatch.report import aggregate, render_table
from eaglepatch.report import labels
from eaglepatch.report.predict import predict
from eaglepatch.report.predict_bs import for_runs
from eaglepatch.tuning import live as lv
from eaglepatch.tuning import sweep as sw
from eaglepatch.tuning import sweep_state, sweep_summary
from eaglepatch.tuning.bench import render_bench
from eaglepatch.tuning.saved import find_sweep

T0 = 1764500000.0
FLAGS = {"speculative-algorithm": "EAGLE3", "speculative-num-steps": "3", "speculative-eagle-topk": "1",
         "speculative-num-draft-tokens": "4"}
ARGV = ["/v/bin/python", "-m", "sglang.launch_server", "--model-path", "/m/target", "--speculative-algorithm",
        "EAGLE3", "--speculative-draft-model-path", "/m/draft", "--speculative-num-steps", "3",
        "--speculative-eagle-topk", "1", "--port", "30000"]
COUNTS = (1, 2, 2, 3, 3, 4, 4, 4)  # tokens a request produced in a cycle, in turn

# a tok/s, tokens/s or token/s figure's unit
UNIT = re.compile(r"\btok(?:en)?s?/s\b")


def unlabelled(text: str) -> list[str]:
    """Each tok/s of ``text`` that no label of ``eaglepatch.report.labels`` ends at, with what is around it."""
    return [text[max(0, m.start() - 50):m.end() + 10] for m in UNIT.finditer(text)
            if not any(text.endswith(lab, 0, m.end()) for lab in labels.ALL)]


def write(path: Path, items: list[Any]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(it) + "\n" for it in items))
    return str(path)


def records(bs: int, n: int, t0: float, pid: int = 1, cycle: float = 6.5, gap: float = 1.5) -> list[dict]:
    """``n`` decode records of one process at ``bs`` requests a cycle, each request taking ``COUNTS`` in turn."""
    out, t = [], t0
    for c in range(n):
        acs = [COUNTS[(c * bs + j) % len(COUNTS)] for j in range(bs)]
        out.append({"v": 1, "t": round(t, 6), "host": "gpu1", "pid": pid, "rank": 0, "run": "r1",
                    "worker": "EAGLEWorker", "mode": "decode", "bs": bs, "cycle_ms": cycle + bs * 0.2,
                    "timer": "sync", "phases": {"draft": 3.0, "verify": 2.0 + bs * 0.2, "draft_extend": 1.0},
                    "accepted": sum(acs), "accepts": acs})
        t += (cycle + bs * 0.2 + gap) / 1000.0
    return out


def log_file(tmp_path: Path) -> str:
    header = {"v": 1, "kind": "run", "run": "r1", "t": T0, "host": "gpu1", "pid": 1, "rank": 0, "timer": "sync",
              "flags": FLAGS}
    return write(tmp_path / "logs" / "gpu1-1-rank0.jsonl",
                 [header, *records(1, 80, T0), *records(4, 80, T0 + 10), *records(16, 80, T0 + 20)])


def report_text(tmp_path: Path) -> tuple[str, dict]:
    """``report --predict``'s text (one group, and by batch size with the best step count per batch size), and the
    ``report --json`` document with its predictions, as bench keeps it."""
    f = log_file(tmp_path)
    res = aggregate([f])
    preds = predict(res)
    by_bs = aggregate([f], by="bs")
    text = render_table(res, predictions=preds) + "\n" + render_table(by_bs, by_bs=for_runs(by_bs))
    doc = res.to_json()
    for gd, p in zip(doc["groups"], preds):
        if p is not None:
            gd.update(p.to_json())
    return text, doc


def bench_text(timings: dict) -> str:
    """bench's text: one load with two prompt categories and the timing report of its window, then a ladder."""
    ms = {"p50": 10.0, "p90": 12.0, "p99": 14.0, "max": 15.0}
    client = {"requests": 8, "failed": 0, "seconds": 4.0, "tokens_per_s": 922.9, "ttft_ms": ms, "latency_ms": ms,
              "tpot_ms": ms, "itl_ms": ms, "accept_len": 2.9}
    load = {"concurrency": 4, "input_len": 32, "max_new_tokens": 64, "prompts": "mixed"}
    cats = {"chat": {"requests": 4, "tokens_per_s": 450.0, "accept_len": 2.8},
            "code": {"requests": 4, "tokens_per_s": 470.0, "accept_len": 3.1}}
    one = {"target": "gpu1", "load": load, "client": client, "categories": cats, "timings": timings, "notes": []}
    two = dict(one, load=dict(load, concurrency=8), client=dict(client, tokens_per_s=1500.0), timings=None)
    return render_bench(one) + "\n" + render_bench({"target": "gpu1", "loads": [one, two]})


def sweep_text() -> str:
    """A restart sweep's table (a drift note, a tie, a ladder of concurrencies) and a live sweep's."""
    pts = sw.make_points(sw.parse_grid(["speculative-num-steps=1,3"]), (), True)
    cyc = {"cycle": 2.0, "verify": 1.0}

    def run(p: Any, rep: int, tps: float, cycle: float = 2.0) -> dict:
        return {"point": p.key, "rep": rep, "status": "ok", "tokens_per_s": tps, "accept_len": 2.0,
                "phases_p50": dict(cyc, cycle=cycle),
                "loads": [{"concurrency": 1, "tokens_per_s": tps / 4, "accept_len": 2.0},
                          {"concurrency": 4, "tokens_per_s": tps, "accept_len": 2.0}]}

    runs = [run(pts[0], 0, 700.0), run(pts[0], 1, 710.0), run(pts[1], 0, 755.5), run(pts[1], 1, 705.0, 3.0),
            run(pts[2], 0, 740.0), run(pts[2], 1, 745.0)]
    doc = sweep_summary.summarize("gpu1", pts, runs, baseline=True, repeat=2)
    live_runs = [{"point": lv.points_of((0, 3))[i].key, "index": i, "rep": 0, "steps": s, "status": "ok",
                  "tokens_per_s": t, "t": i} for i, (s, t) in enumerate(((0, 3180.0), (3, 6354.0)))]
    live = lv.summarize("gpu1", (0, 3), live_runs, 1, 0, 8.0)
    return sweep_summary.render_table(doc) + "\n" + sweep_summary.render_table(live)


def facts(**kw: Any) -> ServerFacts:
    flags = {"model-path": "/m/target", "port": "30000", **FLAGS}
    flags.update(kw.pop("flags", {}))
    return ServerFacts(target="gpu1", version="0.5.16", pid=4242, port=30000, argv=list(ARGV), flags=flags,
                       patch="patched", log_dir="/tmp/eaglepatch", target_config=None, draft_config=None, **kw)


def doctor_text(tmp_path: Path) -> str:
    """doctor's findings that quote tok/s: a sweep that measured this command line slower than no speculation,
    the model of the timing records favouring fewer steps, and the model by batch size with no speculation
    measured where it wins."""
    # a kept sweep with --baseline: this command line (3 steps) 150 tok/s, no speculation 200, 2 steps 260
    points = [sw.Point(baseline=True)] + [sw.Point(flags=(("speculative-num-steps", str(k)),)) for k in (3, 2)]
    st = sweep_state.StateFile(str(tmp_path / "sweeps" / "gpu1-3.jsonl"))
    st.write_header({"version": 1, "target": "gpu1", "original": {"argv": ARGV, "port": 30000},
                     "points": [p.key for p in points], "repeat": 1, "load": {"requests": 32, "concurrency": 4}})
    for i, (p, tps) in enumerate(zip(points, (200.0, 150.0, 260.0))):
        k = None if p.baseline else int(p.flags[0][1])
        st.add_run({"point": p.key, "index": i, "rep": 0, "argv": ARGV if k == 3 else ARGV[:-2] + [f"--x{k}", "1"],
                    "status": "ok", "tokens_per_s": tps, "accept_len": None if k is None else 2.5,
                    "phases_p50": {}})
    swept = facts(sweep=find_sweep("gpu1", SimpleNamespace(port=30000, argv=ARGV), cache=str(tmp_path / "sweeps")))
    # 5 steps whose draft costs more than it buys (too-many-steps, from the records)
    folder = tmp_path / "doctor-logs"
    five = facts(flags={"speculative-num-steps": "5"})
    recs = [dict(r, pid=4242, cycle_ms=17.0, phases={"draft": 10.0, "verify": 6.0, "draft_extend": 1.0},
                 accepted=3.2, accepts=None) for r in records(1, 60, 1.7e9, pid=4242, cycle=17.0, gap=0.2)]
    write(folder / "gpu1-4242-rank0.jsonl", [{k: v for k, v in r.items() if v is not None} for r in recs])
    five = dataclasses.replace(five, **load_records(str(folder), {4242}, flags=five.flags))
    # by batch size: from 64 requests a cycle no speculation, measured there, beats every step count
    row = lambda bs, zero, spec: {"bs": bs, "best": 0 if zero > spec else 1, "points": [  # noqa: E731
        {"steps": 0, "tokens_per_s": zero, "spread": 0.02, "basis": "measured", "accept_len": 1.0},
        {"steps": 2, "tokens_per_s": spec, "spread": 0.03, "basis": "fitted", "accept_len": 2.1}]}
    by_bs = facts(model={"predict": [], "by_bs": {"predict_by_bs": [row(8, 1000, 1500), row(64, 6000, 4800)],
                                                  "crossover_bs": 64, "max_bs": 64, "predict_by_bs_notes": []}})
    srv = SimpleNamespace(pid=4242, argv=ARGV, port=30000)
    docs = [document("gpu1", "0.5.16", srv, R.diagnose(f), {}, f.model) for f in (swept, five, by_bs)]
    found = {x["id"] for d in docs for x in d["findings"]}
    assert {"speculation-slower", "too-many-steps"} <= found  # the findings that quote tok/s are there
    return render_doctor(docs)


def test_the_check_catches_a_bare_tok_s():
    """The check is not vacuous: a bare figure, an old "output tokens/s" and a "wall tok/s" without whose it is
    are caught; the labels pass."""
    assert len(unlabelled("tok/s 237.0  wall tok/s 235.7  output tokens/s: 922.9  260.1 tok/s")) == 4
    assert unlabelled("in-cycle tok/s 237.0  records' wall tok/s 235.7  client tok/s: 922.9") == []


def test_every_tok_s_printed_says_whose_it_is(tmp_path):
    """Report, bench, sweep and doctor texts: every tok/s carries one of the labels, and each label is used."""
    report, timings = report_text(tmp_path)
    texts = {"report": report, "bench": bench_text(timings), "sweep": sweep_text(), "doctor": doctor_text(tmp_path)}
    for name, text in texts.items():
        assert UNIT.search(text), f"{name}: no tok/s at all: the check would be vacuous"
        assert unlabelled(text) == [], name
    everything = "\n".join(texts.values())
    assert all(lab in everything for lab in labels.ALL)
    # a prediction sits beside the measured figure on its own scale
    assert re.search(rf"predicted best: .* {re.escape(labels.WALL)} \(\w+\) against [0-9.]+ "
                     rf"{re.escape(labels.WALL)}", texts["bench"])
