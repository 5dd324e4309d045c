"""``report --predict`` over many runs: the pass by batch size keeps the groups of the runs that may be priced
alone (``reporting._priced_by_bs``), and gives what the pass over every run gives, the counts of the "too few
cycles" notes included."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from eaglepatch.ops import reporting
from eaglepatch.report import aggregate
from eaglepatch.report.predict import MIN_CYCLES
from eaglepatch.report.predict_bs import for_runs

pytestmark = pytest.mark.usefixtures("both_parsers")  # every test with both parsers (conftest.py)

T0 = 1764500000.0
FLAGS = {"speculative-algorithm": "EAGLE3", "speculative-num-steps": "3", "speculative-eagle-topk": "1",
         "speculative-num-draft-tokens": "4"}


def _run(lines: list[dict[str, Any]], rid: str, t: float, n: int, *, ranks: int = 1, pid: int = 100,
         no_bs: bool = False) -> float:
    """A run header and ``n`` decode cycles (bs 1, 2, 4 in turn; a prefill cycle first) of ``ranks`` ranks."""
    for rank in range(ranks):
        lines.append({"v": 1, "kind": "run", "run": rid, "t": t, "host": "gpu1", "pid": pid, "rank": rank,
                      "timer": "sync", "flags": FLAGS})
    for i in range(n + 1):
        bs = (1, 2, 4)[i % 3]
        for rank in range(ranks):
            if rank and i % 4 == 3:
                continue  # rank 1 misses a cycle now and then: its counts per batch size differ from rank 0's
            d = {"v": 1, "t": t, "host": "gpu1", "pid": pid, "rank": rank, "run": rid, "worker": "EAGLEWorker",
                 "mode": "prefill" if i == 0 else "decode", "bs": bs, "cycle_ms": 10.0 + bs, "timer": "sync",
                 "phases": {"draft": 3.0, "verify": 6.0 + bs, "draft_extend": 1.0}, "accepted": 2 * bs}
            if no_bs and i == 2:
                del d["bs"]
            lines.append(d)
        t += 0.012
    return t + 5.0


def _log(tmp_path: Path, name: str, runs: list[tuple[int, dict[str, Any]]]) -> str:
    lines: list[dict[str, Any]] = []
    t = T0
    for i, (n, kw) in enumerate(runs):
        t = _run(lines, f"gpu1-{100 + i}-{1000 + i}-{i:08x}", t, n, pid=100 + i, **kw)
    p = tmp_path / name
    p.write_text("".join(json.dumps(d) + "\n" for d in lines))
    return str(p)


def _every_run(path: str) -> dict[Any, Any]:
    """What the report priced before: the pass by batch size over every run."""
    return for_runs(aggregate([path], by="bs"), min_cycles=MIN_CYCLES)


@pytest.mark.parametrize("runs, passes", [
    ([(5, {}), (70, {}), (12, {}), (49, {}), (50, {})], "some"),  # the long ones alone in the second pass
    ([(5, {}), (7, {}), (2, {})], "none"),  # none to price: a pass that keeps no group
    ([(5, {}), (30, {"ranks": 2}), (70, {})], "some"),  # two ranks: counted per rank by the second pass
    ([(60, {}), (70, {})], "every"),  # every run priced: the pass of every run
])
def test_priced_by_bs_is_the_pass_over_every_run(tmp_path: Path, runs: list, passes: str) -> None:
    path = _log(tmp_path, "runs.jsonl", runs)
    result = aggregate([path])
    calls: list[dict[str, Any]] = []

    class Rep:
        @staticmethod
        def aggregate(files: Any, **kw: Any) -> Any:
            calls.append(kw)
            return aggregate(files, **kw)

    got = reporting._priced_by_bs(Rep, result, [path], {"by": None, "skip": 0}, steps=None, sweep=None,
                                  min_cycles=MIN_CYCLES)
    want = _every_run(path)
    assert got is not None
    assert list(got) == list(want)
    assert {k: v.to_json() for k, v in got.items()} == {k: v.to_json() for k, v in want.items()}
    assert any("too few" in (v.why or "") for v in want.values()) or passes == "every"
    assert len(calls) == 1
    kept = calls[0].get("only_runs")
    if passes == "every":
        assert kept is None
    elif passes == "none":
        assert list(kept) == []
    else:
        assert 0 < len(kept) < len(result.runs)


def test_a_decode_record_without_bs_among_the_others_falls_back(tmp_path: Path) -> None:
    """A short run's decode record without a batch size: its count is not its records; the caller's pass of every
    run decides (None), and the report's text is the same as that pass gives."""
    path = _log(tmp_path, "nobs.jsonl", [(6, {"no_bs": True}), (70, {})])
    result = aggregate([path])
    assert reporting._priced_by_bs(reporting_rep(), result, [path], {"by": None, "skip": 0}, steps=None,
                                   sweep=None, min_cycles=MIN_CYCLES) is None
    text = reporting.report([path], None, by=None, skip=0, trace=None, compare=False, log_dir=None, fmt="json",
                            say=lambda s: None, runs=reporting.RunSelection(all=True), predict=True)
    assert "only 5 decode cycle(s) recorded per rank" in text  # 6 decode records, one without bs


def reporting_rep() -> Any:
    from eaglepatch import report as rep

    return rep


def test_aggregate_only_runs_keeps_their_groups(tmp_path: Path) -> None:
    path = _log(tmp_path, "only.jsonl", [(5, {}), (70, {}), (8, {})])
    full = aggregate([path], by="bs")
    keep = [full.runs[1].id]
    over: list[tuple[str, Any]] = []
    part = aggregate([path], by="bs", run_ids=keep, only_runs=keep, passed_over=over)
    assert [r.id for r in part.runs] == keep
    # the same groups; the key names the run only where the result holds several
    strip = [dict(g.to_json(), key={**g.key_dict(), "run": None}) for g in part.groups]
    assert strip == [dict(g.to_json(), key={**g.key_dict(), "run": None}) for g in full.groups if g.run == keep[0]]
    assert part.records == full.runs[1].records
    assert sorted(over, key=str) == [("decode", 1), ("decode", 2), ("decode", 4), ("prefill", 1)]
