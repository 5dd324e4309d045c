"""The runtime's bounded logs as the report reads them (docs/contract.md, "Bounds inside the server"): the files of
a rank's chain in the order written, and the drops line counted as what the runtime could not write, never as a
line that did not parse."""

from __future__ import annotations

import json
from pathlib import Path

from eaglepatch.report import aggregate
from eaglepatch.report.files import iter_log_files, log_order


def rec(t: float, pid: int = 7) -> dict:
    return {"v": 1, "t": t, "host": "h", "pid": pid, "rank": 0, "mode": "decode", "cycle_ms": 2.0,
            "phases": {"draft": 0.5, "verify": 1.0, "draft_extend": 0.4}, "accepted": 2, "bs": 1}


def write(path: Path, items: list[dict]) -> None:
    path.write_text("".join(json.dumps(x) + "\n" for x in items))


def test_a_chains_first_file_comes_before_the_files_after_it(tmp_path):
    names = ["h-7-rank0.000002.jsonl", "h-7-rank0.jsonl", "h-7-rank0.000001.jsonl", "h-7-rank1.jsonl",
             "h-10-rank0.jsonl"]
    for n in names:
        write(tmp_path / n, [rec(1.0)])
    got = [Path(p).name for p in iter_log_files([str(tmp_path)])]
    assert got == ["h-10-rank0.jsonl", "h-7-rank0.jsonl", "h-7-rank0.000001.jsonl", "h-7-rank0.000002.jsonl",
                   "h-7-rank1.jsonl"]
    assert log_order("/x/h-7-rank0.jsonl") < log_order("/x/h-7-rank0.000001.jsonl")
    assert log_order("/x/other.jsonl") == "/x/other.jsonl"


def test_the_drops_line_says_what_was_dropped_and_is_no_skipped_line(tmp_path):
    """Two drops lines of one process (running totals: the larger stands), one of another; a line that only looks
    like one (no pid) is a skipped line as before."""
    f = tmp_path / "h-7-rank0.jsonl"
    drops = {"v": 1, "kind": "drops", "host": "h", "pid": 7, "rank": 0, "dropped": 5, "reasons": {"min-free": 5}}
    write(f, [rec(1.0), drops, rec(1.01), dict(drops, dropped=12, reasons={"min-free": 9, "full": 3}),
              dict(drops, pid=8, dropped=1, reasons={"queue": 1}), {"v": 1, "kind": "drops", "dropped": 4}])
    res = aggregate([str(f)])
    assert res.records == 2 and res.skipped_lines == 1
    assert [n for n in res.unread if "dropped" in n] == [
        "note: the runtime dropped 13 record(s) it could not write (full 3, min-free 9, queue 1): the figures above "
        "lack them (apply --max-log-mb and --min-free-mb bound the logs; docs/contract.md, \"Bounds inside the "
        "server\")"]
    write(f, [rec(1.0), rec(1.01)])
    assert not [n for n in aggregate([str(f)]).unread if "dropped" in n]
