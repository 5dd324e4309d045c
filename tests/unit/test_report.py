"""The pure report core: hand-written logs in, hand-computed numbers out."""

from __future__ import annotations

import csv
import io
import json
import random
from array import array
from pathlib import Path
from typing import Any

import pytest

from eaglepatch.errors import UsageError
from eaglepatch.report import (
    CSV_COLUMNS,
    aggregate,
    compare,
    iter_log_files,
    percentile,
    phase_order,
    render_compare_csv,
    render_compare_table,
    render_csv,
    render_table,
)
from eaglepatch.report.groups import ordered


pytestmark = pytest.mark.usefixtures("both_parsers")  # every test with both parsers (conftest.py)

T0 = 1764500000.0
approx = pytest.approx


def rec(**kw: Any) -> dict[str, Any]:
    """A valid decode record; keyword arguments override fields (``None`` values are kept as JSON null)."""
    r: dict[str, Any] = {
        "v": 1,
        "t": T0,
        "host": "gpu1",
        "pid": 4242,
        "rank": 0,
        "worker": "EAGLEWorker",
        "mode": "decode",
        "bs": 1,
        "cycle_ms": 10.0,
        "timer": "sync",
        "phases": {"draft": 3.0, "verify": 6.0, "draft_extend": 1.0},
        "accepted": 3,
    }
    r.update(kw)
    return r


def write(path: Path, items: list[Any]) -> str:
    """Write records (dicts, one JSON line each) and raw strings (written as given, plus a newline)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [it if isinstance(it, str) else json.dumps(it) for it in items]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def seq(n_ms: list[float], gaps_ms: list[float], **kw: Any) -> list[dict[str, Any]]:
    """Records with the given cycle times, each starting gaps_ms[i-1] after the previous one ended."""
    out = []
    t = kw.pop("t", T0)
    for i, c in enumerate(n_ms):
        if i:
            t += (n_ms[i - 1] + gaps_ms[i - 1]) / 1000.0
        out.append(rec(t=t, cycle_ms=c, **kw))
    return out


# --------------------------------------------------------------------------------------------------------------
# percentiles and ordering helpers
# --------------------------------------------------------------------------------------------------------------


def test_percentile_matches_hand_computation() -> None:
    v = [1.0, 2.0, 3.0, 4.0]
    assert percentile(v, 90) == approx(3.7)
    assert percentile(v, 50) == approx(2.5)
    assert percentile(v, 99) == approx(3.97)
    assert percentile(v, 0) == 1.0
    assert percentile(v, 100) == 4.0
    assert percentile([5.0], 90) == 5.0
    assert percentile([], 50) is None
    # [2, 2, 4]: virtual index 1.8 -> 2 + 0.8 * (4 - 2)
    assert percentile([2.0, 2.0, 4.0], 90) == approx(3.6)


def test_counted_order_statistics_equal_sorted() -> None:
    rng = random.Random(7)
    for values in (
        array("d", (round(rng.gauss(5, 0.3), 2) for _ in range(70_000))),  # few distinct: counted
        array("f", (round(rng.gauss(5, 0.3), 3) for _ in range(70_000))),  # the scan's arrays: counted
        array("f", (rng.choice((-0.0, 0.0, -1.5, 2.25)) for _ in range(70_000))),  # 0.0 and -0.0 one value
        array("d", (rng.random() for _ in range(70_000))),  # all distinct: sorted
    ):
        got = ordered(values)
        want = sorted(values)
        for q in (0, 1, 50, 90, 99, 99.9, 100):
            assert percentile(got, q) == percentile(want, q)
        assert got[len(values) - 1] == want[-1]
        assert [got[i] for i in range(0, len(values), 997)] == want[::997]


def test_phase_order_is_canonical_then_alphabetical() -> None:
    assert phase_order(["zeta", "verify", "alpha", "draft_extend", "draft", "target"]) == [
        "target",
        "draft",
        "verify",
        "draft_extend",
        "alpha",
        "zeta",
    ]


# --------------------------------------------------------------------------------------------------------------
# aggregate: one group, hand-computed
# --------------------------------------------------------------------------------------------------------------


def four_cycles() -> list[dict[str, Any]]:
    # cycles 10, 20, 30, 40 ms; gaps 2, 2, 4 ms; draft_extend runs in two cycles only.
    recs = seq([10.0, 20.0, 30.0, 40.0], [2.0, 2.0, 4.0])
    phases = [
        {"draft": 2.0, "verify": 6.0, "draft_extend": 1.0},
        {"draft": 4.0, "verify": 12.0},
        {"draft": 6.0, "verify": 18.0, "draft_extend": 3.0},
        {"draft": 8.0, "verify": 24.0},
    ]
    for r, p, acc, bs in zip(recs, phases, [3, 5, 2, 6], [1, 2, 1, 2]):
        r["phases"] = p
        r["accepted"] = acc
        r["bs"] = bs
    return recs


def test_one_group_hand_computed(tmp_path: Path) -> None:
    f = write(tmp_path / "gpu1-4242-rank0.jsonl", four_cycles())
    res = aggregate([f])
    assert res.records == 4 and res.skipped_lines == 0
    assert len(res.groups) == 1
    g = res.groups[0]
    assert (g.mode, g.key, g.n) == ("decode", (), 4)
    assert g.cycle.mean == approx(25.0)
    assert g.cycle.p50 == approx(25.0)
    assert g.cycle.p90 == approx(37.0)
    assert g.cycle.p99 == approx(39.7)
    assert g.cycle.max == 40.0
    draft = g.phase("draft")
    assert draft is not None
    assert (draft.stats.n, draft.stats.mean, draft.stats.p90) == (4, approx(5.0), approx(7.4))
    assert draft.share == approx(20.0 / 100.0)
    verify = g.phase("verify")
    assert verify is not None and verify.share == approx(0.6)
    dext = g.phase("draft_extend")
    assert dext is not None
    # stats over the cycles where it ran (1 and 3), share over all cycle time
    assert (dext.stats.n, dext.stats.mean, dext.stats.p50, dext.stats.max) == (2, approx(2.0), approx(2.0), 3.0)
    assert dext.share == approx(4.0 / 100.0)
    assert [p.name for p in g.phases] == ["draft", "verify", "draft_extend"]
    assert g.accept_len == approx(16 / 6)
    assert g.tokens_per_s == approx(160.0)
    assert g.between is not None
    assert g.between.n == 3
    assert g.between.mean == approx(8 / 3, abs=1e-4)
    assert g.between.p50 == approx(2.0, abs=1e-4)
    assert g.between.p90 == approx(3.6, abs=1e-4)
    assert g.wall_tokens_per_s == approx(16 / 108 * 1000, rel=1e-5)
    assert not g.has_host and g.host_cycle is None


def test_json_shape_is_the_contract(tmp_path: Path) -> None:
    f = write(tmp_path / "a.jsonl", four_cycles())
    doc = aggregate([f], sources=["gpu1"]).to_json()
    json.dumps(doc)  # serialisable
    # one run: the contract's keys as before, then "runs" (its synthetic id: the file has no "run")
    assert list(doc) == ["sources", "records", "skipped_lines", "groups", "runs"]
    assert [r["id"] for r in doc["runs"]] == ["file:a.jsonl"]
    assert doc["sources"] == ["gpu1"]
    (g,) = doc["groups"]
    required = {"mode", "key", "n", "cycle_ms", "phases", "accept_len", "tokens_per_s", "between_ms",
                "wall_tokens_per_s"}
    assert required <= set(g)
    assert g["key"] == {}
    assert set(g["cycle_ms"]) == {"mean", "p50", "p90", "p99", "max"}
    assert {"mean", "p50", "p90", "p99", "max", "share"} <= set(g["phases"]["draft"])
    assert {"mean", "p50", "p90"} <= set(g["between_ms"])
    assert list(g["phases"]) == ["draft", "verify", "draft_extend"]
    assert g["accept_len"] == 2.6667  # rounded to 4 decimals
    assert g["tokens_per_s"] == 160.0
    assert g["cycle_ms"]["p99"] == 39.7
    assert g["phases"]["verify"]["share"] == 0.6
    assert g["host_cycle_ms"] is None and g["phases"]["draft"]["host"] is None
    assert aggregate([f]).to_json()["sources"] == [f]


def test_accepted_null_gives_null_rates(tmp_path: Path) -> None:
    f = write(tmp_path / "a.jsonl", seq([10.0, 10.0], [1.0], accepted=None, bs=None))
    g = aggregate([f]).to_json()["groups"][0]
    assert g["accept_len"] is None and g["tokens_per_s"] is None and g["wall_tokens_per_s"] is None
    assert g["n"] == 2


def test_accept_len_needs_bs_tokens_do_not(tmp_path: Path) -> None:
    recs = [rec(t=T0, accepted=4, bs=2), rec(t=T0 + 1.5, accepted=6, bs=None)]
    f = write(tmp_path / "a.jsonl", recs)
    g = aggregate([f]).groups[0]
    assert g.accept_len == approx(2.0)  # 4 / 2: the record without bs is left out
    assert g.tokens_per_s == approx(10 / 20 * 1000)
    assert g.between is None  # the only gap is idle
    assert g.wall_tokens_per_s == approx(g.tokens_per_s)


# --------------------------------------------------------------------------------------------------------------
# merging, --by, --skip
# --------------------------------------------------------------------------------------------------------------


def test_merges_files_ranks_and_hosts(tmp_path: Path) -> None:
    """The files, ranks and hosts of one run (one "run" id) form one group per mode."""
    a = write(tmp_path / "gpu1-1-rank0.jsonl", seq([10.0, 20.0], [1.0], host="gpu1", pid=1, rank=0, run="r1"))
    b = write(tmp_path / "gpu1-1-rank1.jsonl", seq([30.0, 40.0], [3.0], host="gpu1", pid=1, rank=1, run="r1"))
    c = write(
        tmp_path / "gpu2-7-rank0.jsonl",
        seq([50.0], [], host="gpu2", pid=7, rank=0, run="r1")
        + [rec(t=T0 + 0.5, host="gpu2", pid=7, rank=0, mode="prefill", cycle_ms=100.0,
               phases={"target": 90.0, "draft_extend": 8.0}, accepted=2, bs=2, run="r1")],
    )
    res = aggregate([a, b, c])
    assert [r.id for r in res.runs] == ["r1"]
    assert res.records == 6
    assert [(g.mode, g.n) for g in res.groups] == [("decode", 5), ("prefill", 1)]
    dec = res.groups[0]
    assert dec.cycle.mean == approx(30.0)
    # one gap per process that has two cycles in a row; gpu2's prefill starts 450 ms after its decode cycle ends
    assert dec.between is not None and dec.between.n == 2
    assert dec.between.mean == approx(2.0, abs=1e-4)
    pre = res.groups[1]
    assert [p.name for p in pre.phases] == ["target", "draft_extend"]
    assert pre.between is not None and pre.between.mean == approx(450.0, abs=1e-3)

    by_rank = aggregate([a, b, c], by="rank")
    assert [(g.mode, g.key, g.n) for g in by_rank.groups] == [
        ("decode", (("rank", 0),), 3),
        ("decode", (("rank", 1),), 2),
        ("prefill", (("rank", 0),), 1),
    ]
    assert by_rank.to_json()["groups"][1]["key"] == {"rank": 1}

    by_host = aggregate([a, b, c], by="host")
    assert [(g.mode, g.key_dict(), g.n) for g in by_host.groups] == [
        ("decode", {"host": "gpu1"}, 4),
        ("decode", {"host": "gpu2"}, 1),
        ("prefill", {"host": "gpu2"}, 1),
    ]


def test_by_bs_sorts_numerically(tmp_path: Path) -> None:
    recs = [rec(t=T0 + i, bs=bs, cycle_ms=float(bs or 0)) for i, bs in enumerate([10, 2, 1, 10, 2, None])]
    f = write(tmp_path / "a.jsonl", recs)
    res = aggregate([f], by="bs")
    assert [(g.key_dict()["bs"], g.n) for g in res.groups] == [(1, 1), (2, 2), (10, 2), (None, 1)]
    assert res.group("decode", bs=10).cycle.mean == 10.0  # type: ignore[union-attr]
    assert res.groups[-1].accept_len is None  # bs unknown


def test_skip_is_per_process_across_files(tmp_path: Path) -> None:
    # process A: 3 cycles split over two files; process B: 3 cycles in one file
    # (one run: without "run", each file would be a run of its own)
    a_recs = seq([10.0, 20.0, 30.0], [1.0, 1.0], host="h", pid=1, run="r")
    a1 = write(tmp_path / "h-1-rank0.jsonl", a_recs[:1])
    a2 = write(tmp_path / "h-1-rank0.later.jsonl", a_recs[1:])
    b = write(tmp_path / "h-2-rank0.jsonl", seq([100.0, 200.0, 300.0], [5.0, 7.0], host="h", pid=2, run="r"))
    res = aggregate([a1, a2, b], skip=2)
    assert res.records == 6  # all valid records, those skipped included
    g = res.groups[0]
    assert g.n == 2
    assert g.cycle.mean == approx((30.0 + 300.0) / 2)
    # the gap before each kept cycle still counts (measured from the skipped cycle before it)
    assert g.between is not None and g.between.n == 2
    assert g.between.mean == approx(4.0, abs=1e-4)
    assert "first 4 cycles" in render_table(res)
    assert aggregate([a1, a2, b], skip=3).groups == ()
    assert aggregate([a1, a2, b], skip=0).groups[0].n == 6


def test_bad_arguments_raise_usage_error(tmp_path: Path) -> None:
    f = write(tmp_path / "a.jsonl", [rec()])
    with pytest.raises(UsageError, match="--by"):
        aggregate([f], by="worker")
    with pytest.raises(UsageError, match="--skip"):
        aggregate([f], skip=-1)
    with pytest.raises(UsageError):
        aggregate([str(tmp_path / "gone.jsonl")])


# --------------------------------------------------------------------------------------------------------------
# lines that do not parse
# --------------------------------------------------------------------------------------------------------------


def test_bad_lines_are_counted_never_fatal(tmp_path: Path) -> None:
    good = seq([10.0, 20.0, 30.0], [1.0, 1.0])
    no_cycle = rec(t=T0 + 5)
    del no_cycle["cycle_ms"]
    items: list[Any] = [
        good[0],
        "this is not json",
        "[1, 2, 3]",
        '"a string"',
        "42",
        json.dumps(no_cycle),
        json.dumps(rec(t=T0 + 6, v=2)),
        json.dumps(rec(t=T0 + 7))[:-1] + ', "cycle_ms": NaN}',
        json.dumps(rec(t=T0 + 8, phases={"draft": 1.0, "newphase": 2.0, "verify": "slow"})),
        json.dumps(rec(t=T0 + 9, phases=[1, 2])),
        json.dumps(rec(t=T0 + 10, accepted="three")),
        json.dumps(rec(t=T0 + 11, pid="4242")),
        json.dumps(rec(t=T0 + 12, mode=None)),
        json.dumps(rec(t=T0 + 13)) + " trailing",
        "",  # blank lines are not counted
        "   ",
        good[1],
        "  " + json.dumps(good[2]),  # leading whitespace is fine
    ]
    path = tmp_path / "a.jsonl"
    write(path, items)
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(rec(t=T0 + 20))[:40])  # truncated last line, no newline
    res = aggregate([str(path)])
    assert res.skipped_lines == 14
    assert res.records == 3
    g = res.groups[0]
    assert g.n == 3
    # the rejected record with a new phase name and a bad value left nothing behind
    assert [(p.name, p.stats.n) for p in g.phases] == [("draft", 3), ("verify", 3), ("draft_extend", 3)]
    assert g.between is not None and g.between.n == 2
    assert "14 lines did not parse" in render_table(res)


def test_rejected_first_record_of_a_group_leaves_no_group(tmp_path: Path) -> None:
    items: list[Any] = [rec(t=T0), rec(t=T0 + 2, bs=16, phases={"draft": "x"}),
                        rec(t=T0 + 4, mode="prefill", phases={"target": 1.0}, host_cycle_ms=2.0,
                            host_phases={"target": None})]
    f = write(tmp_path / "a.jsonl", items)
    res = aggregate([f], by="bs")
    assert res.skipped_lines == 2
    assert [(g.mode, g.key_dict()) for g in res.groups] == [("decode", {"bs": 1})]


def test_bad_line_in_skipped_region_does_not_use_up_skip(tmp_path: Path) -> None:
    items: list[Any] = [json.dumps(rec(t=T0, phases={"draft": None})), rec(t=T0 + 2, cycle_ms=5.0),
                        rec(t=T0 + 4, cycle_ms=7.0)]
    f = write(tmp_path / "a.jsonl", items)
    res = aggregate([f], skip=1)
    assert (res.skipped_lines, res.records, res.groups[0].n, res.groups[0].cycle.mean) == (1, 2, 1, 7.0)


# --------------------------------------------------------------------------------------------------------------
# between
# --------------------------------------------------------------------------------------------------------------


def test_between_leaves_out_idle_gaps_and_clamps_negative(tmp_path: Path) -> None:
    # gaps: 3 ms, 5 s (idle), -0.5 ms (overlap -> 0), 1 ms
    recs = seq([10.0, 10.0, 10.0, 10.0, 10.0], [3.0, 5000.0, -0.5, 1.0])
    f = write(tmp_path / "a.jsonl", recs)
    g = aggregate([f]).groups[0]
    assert g.between is not None
    assert g.between.n == 3
    assert g.between.mean == approx(4.0 / 3.0, abs=1e-4)
    assert g.between.p50 == approx(1.0, abs=1e-4)
    # wall: tokens 15 over 50 ms of cycles plus 4 ms of gaps
    assert g.wall_tokens_per_s == approx(15 / 54 * 1000, rel=1e-4)
    g2 = aggregate([f], idle_gap_s=10.0).groups[0]
    assert g2.between is not None and g2.between.n == 4


# --------------------------------------------------------------------------------------------------------------
# events timer: host columns
# --------------------------------------------------------------------------------------------------------------


def events_records() -> list[dict[str, Any]]:
    recs = []
    t = T0
    for gpu, host in [((3.0, 6.0), (1.0, 2.0)), ((5.0, 8.0), (2.0, 4.0))]:
        recs.append(rec(t=t, timer="events", cycle_ms=10.0, phases={"draft": gpu[0], "verify": gpu[1]},
                        host_cycle_ms=4.0, host_phases={"draft": host[0], "verify": host[1]}))
        t += (4.0 + 2.0) / 1000.0  # host clock: a 4 ms cycle, then a 2 ms gap
    return recs


def test_events_host_stats_and_between_on_host_clock(tmp_path: Path) -> None:
    f = write(tmp_path / "a.jsonl", events_records())
    res = aggregate([f])
    g = res.groups[0]
    assert g.has_host and res.has_host
    assert g.host_cycle is not None and g.host_cycle.mean == 4.0
    draft = g.phase("draft")
    assert draft is not None and draft.host is not None
    assert (draft.stats.mean, draft.host.mean, draft.host.p50) == (4.0, 1.5, 1.5)
    assert draft.host_share == approx(3.0 / 8.0)
    assert g.between is not None and g.between.mean == approx(2.0, abs=1e-4)
    doc = res.to_json()["groups"][0]
    assert doc["host_cycle_ms"]["mean"] == 4.0
    assert doc["phases"]["verify"]["host"]["p50"] == 3.0
    text = render_table(res)
    assert "host mean" in text and "host p50" in text
    verify_row = next(line for line in text.splitlines() if line.startswith("verify"))
    assert verify_row.split()[-2:] == ["3.000", "3.000"]
    rows = list(csv.DictReader(io.StringIO(render_csv(res))))
    assert next(r for r in rows if r["phase"] == "draft")["host_mean"] == "1.5"


def test_bad_host_phases_roll_back_the_record(tmp_path: Path) -> None:
    recs = events_records()
    recs[1]["host_phases"] = {"draft": 1.0, "verify": "x"}
    f = write(tmp_path / "a.jsonl", recs)
    res = aggregate([f])
    assert res.skipped_lines == 1
    g = res.groups[0]
    assert [(p.name, p.stats.n, p.host.n if p.host else None) for p in g.phases] == [("draft", 1, 1),
                                                                                     ("verify", 1, 1)]


# --------------------------------------------------------------------------------------------------------------
# rendering
# --------------------------------------------------------------------------------------------------------------


def test_render_table_shows_the_numbers(tmp_path: Path) -> None:
    recs = four_cycles() + [rec(t=T0 + 10, mode="prefill", cycle_ms=50.0, phases={"target": 40.0, "zeta": 5.0},
                                accepted=1, bs=1)]
    f = write(tmp_path / "a.jsonl", recs)
    text = render_table(aggregate([f]))
    lines = text.splitlines()
    assert lines[0].startswith("run ") and lines[0].endswith("timer=sync  (id file:a.jsonl)")  # the run's header
    assert lines[1].startswith("decode  n=4  accept len 2.667  in-cycle tok/s 160.0  records' wall tok/s 148.1")
    assert not text.endswith("\n")
    body = [ln.split()[0] for ln in lines if ln and ln.split()[0] in
            {"target", "draft", "verify", "draft_extend", "zeta", "cycle", "between"}]
    assert body == ["draft", "verify", "draft_extend", "cycle", "between", "target", "zeta", "cycle"]
    cycle = next(ln for ln in lines if ln.startswith("cycle")).split()
    assert cycle == ["cycle", "4", "25.000", "25.000", "37.000", "39.700", "40.000", "100.0%"]
    verify = next(ln for ln in lines if ln.startswith("verify")).split()
    assert verify[-1] == "60.0%"
    assert "host mean" not in text
    assert any(ln.startswith("prefill") for ln in lines)
    by = render_table(aggregate([f], by="bs"))
    assert "decode bs=1  n=2" in by and "decode bs=2  n=2" in by


def test_render_table_empty(tmp_path: Path) -> None:
    f = write(tmp_path / "a.jsonl", ["garbage"])
    text = render_table(aggregate([f]))
    assert "no timing records" in text and "1 lines did not parse" in text


def test_csv_header_and_rows(tmp_path: Path) -> None:
    f = write(tmp_path / "a.jsonl", four_cycles())
    text = render_csv(aggregate([f], by="bs"))
    rows = list(csv.reader(io.StringIO(text)))
    assert tuple(rows[0]) == CSV_COLUMNS
    assert rows[0][:12] == ["mode", "key", "phase", "n", "mean", "p50", "p90", "p99", "max", "share",
                            "accept_len", "tokens_per_s"]
    data = [dict(zip(rows[0], r)) for r in rows[1:]]
    # bs=1 group: cycles 10 and 30 (gaps before them: none for the first, 2 ms for the third)
    assert [(d["key"], d["phase"]) for d in data] == [
        ("bs=1", "draft"), ("bs=1", "verify"), ("bs=1", "draft_extend"), ("bs=1", "cycle"), ("bs=1", "between"),
        ("bs=2", "draft"), ("bs=2", "verify"), ("bs=2", "cycle"), ("bs=2", "between"),
    ]
    c1 = data[3]
    assert (c1["n"], c1["mean"], c1["max"], c1["share"], c1["accept_len"], c1["tokens_per_s"]) == (
        "2", "20.0", "30.0", "1.0", "2.5", "125.0")
    assert data[2]["share"] == "0.1"  # 4 ms of draft_extend over 40 ms
    assert data[4]["p99"] == "" and data[4]["host_mean"] == ""


# --------------------------------------------------------------------------------------------------------------
# trace
# --------------------------------------------------------------------------------------------------------------


def test_trace_file_structure(tmp_path: Path) -> None:
    a = write(tmp_path / "gpu1-1-rank0.jsonl", seq([10.0, 20.0], [1.0], host="gpu1", pid=1, rank=0))
    b = write(tmp_path / "gpu1-1-rank1.jsonl", seq([30.0], [], host="gpu1", pid=1, rank=1))
    c = write(tmp_path / "gpu2-7-rank0.jsonl",
              [rec(host="gpu2", pid=7, mode="prefill", bs=2, accepted=2, cycle_ms=5.0,
                   phases={"draft_extend": 1.0, "target": 3.0})])
    out = tmp_path / "trace.json"
    res = aggregate([a, b, c], trace_path=str(out), skip=1)
    doc = json.loads(out.read_text())
    assert doc["displayTimeUnit"] == "ms"
    ev = doc["traceEvents"]
    meta = [e for e in ev if e["ph"] == "M"]
    procs = {e["args"]["name"]: e["pid"] for e in meta if e["name"] == "process_name"}
    assert procs == {"gpu1": 1, "gpu2": 2}
    threads = {(e["pid"], e["args"]["name"]) for e in meta if e["name"] == "thread_name"}
    assert threads == {(1, "rank0 pid1"), (1, "rank1 pid1"), (2, "rank0 pid7")}
    cycles = [e for e in ev if e["ph"] == "X" and e["cat"] == "cycle"]
    phases = [e for e in ev if e["ph"] == "X" and e["cat"] == "phase"]
    assert len(cycles) == 4  # every valid record, the skipped ones too
    assert len(phases) == 3 * 3 + 2
    assert sum(1 for e in cycles if e["args"].get("skipped")) == 3
    assert res.groups[0].n == 1
    for e in cycles + phases:
        assert isinstance(e["ts"], int) and isinstance(e["dur"], int) and e["ts"] >= 0
    first = min((e for e in cycles if e["pid"] == 1), key=lambda e: e["ts"])
    assert first["name"] == "cycle decode bs=1" and first["dur"] == 10_000
    assert first["args"] == {"accepted": 3, "bs": 1, "cycle_ms": 10.0, "skipped": True}
    inside = sorted((e for e in phases if e["pid"] == 1 and e["tid"] == first["tid"]
                     and first["ts"] <= e["ts"] < first["ts"] + first["dur"]), key=lambda e: e["ts"])
    assert [(e["name"], e["ts"] - first["ts"], e["dur"]) for e in inside] == [
        ("draft", 0, 3000), ("verify", 3000, 6000), ("draft_extend", 9000, 1000)]
    second = max((e for e in cycles if e["pid"] == 1 and e["tid"] == first["tid"]), key=lambda e: e["ts"])
    assert second["ts"] - first["ts"] == 11_000  # 10 ms cycle + 1 ms gap, in microseconds
    pre = next(e for e in cycles if e["pid"] == 2)
    assert pre["name"] == "cycle prefill bs=2"
    pre_phases = sorted((e for e in phases if e["pid"] == 2), key=lambda e: e["ts"])
    assert [e["name"] for e in pre_phases] == ["target", "draft_extend"]


def test_trace_clamps_phases_and_overlaps(tmp_path: Path) -> None:
    recs = [rec(t=T0, cycle_ms=5.0, phases={"draft": 4.0, "verify": 4.0}),
            rec(t=T0 + 0.004, cycle_ms=5.0, phases={"draft": 1.0})]  # starts 1 ms before the first ends
    f = write(tmp_path / "a.jsonl", recs)
    out = tmp_path / "t.json"
    aggregate([f], trace_path=str(out))
    ev = [e for e in json.loads(out.read_text())["traceEvents"] if e["ph"] == "X"]
    c1, d1, v1, c2, d2 = ev
    assert (d1["dur"], v1["ts"] - c1["ts"], v1["dur"]) == (4000, 4000, 1000)  # verify clamped to the cycle
    assert c2["ts"] == c1["ts"] + c1["dur"] and c2["dur"] == 4000


def test_trace_unwritable_path(tmp_path: Path) -> None:
    f = write(tmp_path / "a.jsonl", [rec()])
    with pytest.raises(UsageError, match="--trace"):
        aggregate([f], trace_path=str(tmp_path / "no" / "such" / "dir" / "t.json"))


# --------------------------------------------------------------------------------------------------------------
# compare
# --------------------------------------------------------------------------------------------------------------


def test_compare_deltas(tmp_path: Path) -> None:
    before = write(tmp_path / "before" / "a.jsonl",
                   seq([10.0, 10.0], [2.0], phases={"draft": 4.0, "verify": 5.0}, accepted=2))
    after = write(tmp_path / "after" / "a.jsonl",
                  seq([8.0, 8.0], [2.0], phases={"draft": 3.0, "verify": 4.0}, accepted=2)
                  + [rec(t=T0 + 10, mode="prefill", cycle_ms=30.0, phases={"target": 30.0})])
    r1, r2 = aggregate([before]), aggregate([after])
    cmp = compare([r1, r2], ["before", "after"])
    doc = cmp.to_json()
    assert doc["sources"] == ["before", "after"]
    assert [(g["mode"], g["key"]) for g in doc["groups"]] == [("decode", {}), ("prefill", {})]
    rows = {r["metric"]: r for r in doc["groups"][0]["rows"]}
    assert rows["draft p50 ms"] == {"metric": "draft p50 ms", "values": [4.0, 3.0], "delta_pct": [None, -25.0]}
    assert rows["cycle mean ms"]["delta_pct"] == [None, -20.0]
    assert rows["tokens_per_s"]["values"] == [200.0, 250.0] and rows["tokens_per_s"]["delta_pct"] == [None, 25.0]
    assert rows["accept_len"]["delta_pct"] == [None, 0.0]
    # t is a double near 1.76e9 s (a quarter-microsecond apart), so gaps carry ~0.0002 ms of noise
    assert rows["wall_tokens_per_s"]["values"] == [approx(4 / 22 * 1000, abs=0.01), approx(4 / 18 * 1000, abs=0.01)]
    assert "between p50 ms" in rows and "n" in rows
    assert [r["metric"] for r in doc["groups"][0]["rows"]][:5] == [
        "n", "draft p50 ms", "draft mean ms", "verify p50 ms", "verify mean ms"]
    pre = {r["metric"]: r for r in doc["groups"][1]["rows"]}
    assert pre["target p50 ms"]["values"] == [None, 30.0] and pre["target p50 ms"]["delta_pct"] == [None, None]

    table = render_compare_table(cmp)
    line = next(ln for ln in table.splitlines() if ln.startswith("draft p50 ms"))
    assert line.split()[-3:] == ["4.000", "3.000", "-25.0%"]
    assert "Δ% after" in table

    rows_csv = list(csv.reader(io.StringIO(render_compare_csv(cmp))))
    assert rows_csv[0] == ["mode", "key", "metric", "before", "after", "delta_pct_after"]
    assert ["decode", "", "draft p50 ms", "4.0", "3.0", "-25.0"] in rows_csv

    with pytest.raises(UsageError):
        compare([r1], ["only"])
    with pytest.raises(UsageError):
        compare([r1, r2], ["one"])


# --------------------------------------------------------------------------------------------------------------
# iter_log_files
# --------------------------------------------------------------------------------------------------------------


def test_iter_log_files(tmp_path: Path) -> None:
    d = tmp_path / "logs"
    b = write(d / "b-1-rank0.jsonl", [rec()])
    a = write(d / "a-1-rank0.jsonl", [rec()])
    sub = write(d / "sub" / "c-1-rank0.jsonl", [rec()])
    (d / "notes.txt").write_text("x")
    other = write(tmp_path / "other.log", [rec()])
    assert iter_log_files([str(d)]) == [a, b, sub]
    assert iter_log_files([other, str(d), a]) == [other, a, b, sub]  # duplicates kept once
    with pytest.raises(UsageError, match="no such file"):
        iter_log_files([str(tmp_path / "missing")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match=r"no \*\.jsonl"):
        iter_log_files([str(tmp_path / "empty")])


def test_both_parsers_give_the_same_result_on_hostile_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Lines that msgspec refuses and json accepts (NaN, 1e400, lone surrogates, huge ints, duplicate keys) go to
    the standard parser, so the records, skipped lines and JSON are the same with either parser."""
    from eaglepatch.report.scan import parser_name

    good = seq([10.0, 20.0, 30.0], [1.0, 1.0])
    base = json.dumps(rec(t=T0 + 7))[:-1]
    items: list[Any] = [
        good[0],
        base + ', "cycle_ms": NaN}',
        base + ', "cycle_ms": 1e400}',
        base + ', "accepted": -Infinity}',
        base + ', "host": "\\ud800"}',
        base + ', "pid": 123456789012345678901234567890}',
        base + ', "cycle_ms": 5.0, "cycle_ms": 6.0}',
        base.replace('"v": 1', '"v": 1.0') + "}",
        "{" * 100000,
        good[1],
        json.dumps(good[2]) + "   ",
    ]
    path = tmp_path / "a.jsonl"
    write(path, items)
    docs = []
    for forced in ("", "json"):
        monkeypatch.setenv("EAGLEPATCH_JSON_PARSER", forced)
        docs.append((parser_name(), aggregate([str(path)]).to_json()))
    assert docs[1][0] == "json"
    assert docs[0][1] == docs[1][1]
