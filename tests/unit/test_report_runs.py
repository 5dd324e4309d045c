"""Runs in the report: records of different server launches (``"run"``) are never blended unless asked.

The issue: three ``apply`` runs into one ``--log-dir`` (a sync run with an agreeing draft, an events run with a
random draft, an events run with the agreeing draft) gave one decode group with accept length 3.93, a blend of
5.93 and 1.00 over two timers, with no word that it was a blend.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest

from eaglepatch.errors import UsageError
from eaglepatch.report import (
    CSV_COLUMNS,
    ReportResult,
    aggregate,
    aggregate_each,
    compact_flags,
    compare,
    iter_log_files,
    local_time,
    numbered_paths,
    render_compare_csv,
    render_compare_table,
    render_csv,
    render_table,
)
from eaglepatch.report import aggregation as agg_mod


pytestmark = pytest.mark.usefixtures("both_parsers")  # every test with both parsers (conftest.py)

T0 = 1764500000.0
approx = pytest.approx

AGREE = {"speculative-algorithm": "EAGLE3", "speculative-draft-model-path": "/models/agree-eagle3/",
         "speculative-num-steps": "5", "speculative-eagle-topk": "1", "speculative-num-draft-tokens": "6"}
RANDOM = dict(AGREE, **{"speculative-draft-model-path": "/models/random-eagle3"})


def rec(**kw: Any) -> dict[str, Any]:
    """A valid decode record; keyword arguments override fields."""
    r: dict[str, Any] = {"v": 1, "t": T0, "host": "gpu1", "pid": 4242, "rank": 0, "worker": "EAGLEWorker",
                         "mode": "decode", "bs": 1, "cycle_ms": 10.0, "timer": "sync",
                         "phases": {"draft": 3.0, "verify": 6.0, "draft_extend": 1.0}, "accepted": 3}
    r.update(kw)
    return r


def header(run: str, t: float, timer: str = "sync", flags: dict[str, Any] | None = None, **kw: Any) -> dict:
    """A run header line as the runtime writes it when it opens a file."""
    h = {"v": 1, "kind": "run", "run": run, "t": t, "host": "gpu1", "pid": 4242, "rank": 0, "timer": timer,
         "flags": flags if flags is not None else {}, "argv": ["python", "-m", "sglang.launch_server"]}
    h.update(kw)
    return h


def write(path: Path, items: list[Any]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(it if isinstance(it, str) else json.dumps(it) for it in items) + "\n")
    return str(path)


def cycles(n: int, t0: float, accepted: list[int] | int = 3, step: float = 0.012, **kw: Any) -> list[dict]:
    """``n`` records 12 ms apart from ``t0`` (10 ms cycles, 2 ms gaps)."""
    acc = accepted if isinstance(accepted, list) else [accepted] * n
    return [rec(t=t0 + i * step, accepted=acc[i], **kw) for i in range(n)]


def events(**kw: Any) -> dict[str, Any]:
    """The fields an ``events``-timer record adds."""
    return dict(timer="events", host_cycle_ms=4.0, host_phases={"draft": 1.0, "verify": 2.0, "draft_extend": 0.5},
                **kw)


ACC_593 = [6] * 93 + [5] * 7  # 593 tokens in 100 cycles at bs 1: accept length 5.93


def blend_folder(tmp_path: Path) -> Path:
    """The issue's folder: three launches, one log file each (a new pid each time)."""
    d = tmp_path / "logs"
    write(d / "gpu1-101-rank0.jsonl",
          [header("run-sync-agree", T0 - 10, "sync", AGREE, pid=101)]
          + cycles(100, T0, ACC_593, pid=101, run="run-sync-agree"))
    write(d / "gpu1-202-rank0.jsonl",
          [header("run-events-random", T0 + 590, "events", RANDOM, pid=202)]
          + cycles(100, T0 + 600, 1, pid=202, run="run-events-random", **events()))
    # the third launch wrote no header line: its timer comes from its records
    write(d / "gpu1-303-rank0.jsonl", cycles(100, T0 + 1200, ACC_593, pid=303, run="run-events-agree", **events()))
    return d


# --------------------------------------------------------------------------------------------------------------
# the issue
# --------------------------------------------------------------------------------------------------------------


def test_three_runs_in_one_folder_stay_apart(tmp_path: Path) -> None:
    """The blend of the issue cannot happen: three launches give three decode groups, accept lengths 5.93, 1.00
    and 5.93 (not one group at 4.29), each group keyed by its run, the runs listed oldest first with their
    timers and flags."""
    res = aggregate(iter_log_files([str(blend_folder(tmp_path))]))
    assert [(g.mode, g.run, g.n) for g in res.groups] == [
        ("decode", "run-sync-agree", 100), ("decode", "run-events-random", 100), ("decode", "run-events-agree", 100)]
    assert [g.accept_len for g in res.groups] == [approx(5.93), approx(1.0), approx(5.93)]
    assert [g.key_dict() for g in res.groups] == [{"run": "run-sync-agree"}, {"run": "run-events-random"},
                                                  {"run": "run-events-agree"}]
    assert [(r.id, r.timer, r.records) for r in res.runs] == [
        ("run-sync-agree", "sync", 100), ("run-events-random", "events", 100), ("run-events-agree", "events", 100)]
    assert res.runs[0].start == T0 - 10  # the header line is earlier than the first record
    assert res.runs[2].start == T0 + 1200 and res.runs[2].flags == ()
    assert res.runs[1].flags_dict() == RANDOM
    assert not res.merged and res.other_runs == ()
    assert not res.groups[0].has_host and res.groups[1].has_host  # one timer per group
    assert res.group("decode", run="run-events-random").accept_len == approx(1.0)  # type: ignore[union-attr]
    doc = res.to_json()
    assert [g["accept_len"] for g in doc["groups"]] == [5.93, 1.0, 5.93]
    assert [r["id"] for r in doc["runs"]] == ["run-sync-agree", "run-events-random", "run-events-agree"]
    assert set(doc["runs"][0]) >= {"id", "start", "timer", "flags"}
    assert "merged" not in doc and "warnings" not in doc


def test_merge_runs_gives_the_blend_and_says_so(tmp_path: Path) -> None:
    """merge_runs puts everything together as before (the issue's blended figure) but the result, the table and
    the JSON say that several runs, timers and flag sets were merged."""
    res = aggregate(iter_log_files([str(blend_folder(tmp_path))]), merge_runs=True)
    (g,) = res.groups
    assert (g.n, g.key, g.run) == (300, (), None)
    assert g.accept_len == approx((593 + 100 + 593) / 300)  # 4.29: neither 5.93 nor 1.00
    assert res.merged and len(res.runs) == 3
    warning = res.merge_warning()
    assert warning is not None and warning.startswith("merged 3 runs (2 timers and 2 flag sets)")
    assert warning.endswith("their figures blend")
    text = render_table(res)
    assert text.splitlines()[0].startswith("warning: merged 3 runs")
    assert "run-events-random" in text.splitlines()[0]
    doc = res.to_json()
    assert doc["merged"] is True and doc["warnings"] == [warning]
    assert doc["groups"][0]["key"] == {}
    rows = list(csv.DictReader(io.StringIO(render_csv(res))))
    assert {r["run"] for r in rows} == {"run-sync-agree+run-events-random+run-events-agree"}


def test_merge_runs_of_one_run_is_no_merge(tmp_path: Path) -> None:
    """merge_runs over a single run changes nothing and warns of nothing (there is nothing blended)."""
    f = write(tmp_path / "a.jsonl", cycles(3, T0, run="only"))
    res = aggregate([f], merge_runs=True)
    assert not res.merged and res.merge_warning() is None
    assert res.groups[0].run == "only" and "warning" not in render_table(res)


# --------------------------------------------------------------------------------------------------------------
# records without run, header lines, bad run fields
# --------------------------------------------------------------------------------------------------------------


def test_records_without_run_form_one_run_per_file(tmp_path: Path) -> None:
    """Older logs have no "run": each file is its own run (file:<basename>), so two files are never averaged
    together; two files of the same basename in different folders keep apart too (file:<path>)."""
    a = write(tmp_path / "gpu1-1-rank0.jsonl", cycles(2, T0, 2, pid=1))
    b = write(tmp_path / "gpu1-2-rank0.jsonl", cycles(3, T0 + 60, 4, pid=2))
    res = aggregate([a, b])
    assert [r.id for r in res.runs] == ["file:gpu1-1-rank0.jsonl", "file:gpu1-2-rank0.jsonl"]
    assert [(g.run, g.n, g.accept_len) for g in res.groups] == [
        ("file:gpu1-1-rank0.jsonl", 2, 2.0), ("file:gpu1-2-rank0.jsonl", 3, 4.0)]
    assert [r.timer for r in res.runs] == ["sync", "sync"]
    x = write(tmp_path / "x" / "same.jsonl", cycles(1, T0, pid=7))
    y = write(tmp_path / "y" / "same.jsonl", cycles(1, T0 + 5, pid=8))
    assert [r.id for r in aggregate([x, y]).runs] == [f"file:{x}", f"file:{y}"]
    # a null run is no run
    n = write(tmp_path / "n.jsonl", cycles(2, T0, run=None))
    assert [r.id for r in aggregate([n]).runs] == ["file:n.jsonl"]


def test_header_lines_are_metadata_not_skipped_lines(tmp_path: Path) -> None:
    """A run header is neither a record nor a skipped line: skipped_lines stays 0, records count the records;
    its t sets the run's start, its flags the run's flags (first header wins), wherever it lies in the file.
    A "kind": "run" line without a run id is a bad line."""
    f = write(tmp_path / "a.jsonl", [
        header("r1", T0 - 100, "sync", {"speculative-num-steps": "3"}),
        *cycles(2, T0, run="r1"),
        header("r1", T0 - 50, "sync", {"speculative-num-steps": "9", "tp-size": "2"}, rank=1),
        *cycles(1, T0 + 1, run="r1"),
    ])
    res = aggregate([f])
    assert (res.records, res.skipped_lines) == (3, 0)
    (run,) = res.runs
    assert (run.id, run.start, run.timer, run.records) == ("r1", T0 - 100, "sync", 3)
    assert run.flags_dict() == {"speculative-num-steps": "3", "tp-size": "2"}
    bad = write(tmp_path / "bad.jsonl", [json.dumps({"v": 1, "kind": "run", "t": T0}),
                                          json.dumps(header("r2", T0, v=2)), *cycles(1, T0, run="r2")])
    assert aggregate([bad]).skipped_lines == 2


def test_header_alone_is_a_run_without_records(tmp_path: Path) -> None:
    """A server restarted that has timed nothing yet: its header makes it a run (the newest); latest shows it
    with "no timing records of this run yet" instead of showing the previous launch's numbers."""
    old = write(tmp_path / "gpu1-1-rank0.jsonl", [header("old", T0, pid=1)] + cycles(3, T0 + 1, pid=1, run="old"))
    new = write(tmp_path / "gpu1-2-rank0.jsonl", [header("new", T0 + 500, "events", pid=2)])
    res = aggregate([old, new], latest=True)
    assert [r.id for r in res.runs] == ["new"] and res.groups == () and res.records == 0
    assert [r.id for r in res.other_runs] == ["old"]
    text = render_table(res)
    assert "no timing records of this run yet" in text and "(id new)" in text
    assert "1 other run in these logs not shown: old" in text
    every = aggregate([old, new])
    assert [(r.id, r.records) for r in every.runs] == [("old", 3), ("new", 0)]


def test_bad_run_and_spec_values_are_skipped_lines(tmp_path: Path) -> None:
    """A run that is not a string, or a spec that is not an object of scalars, makes the line a bad line
    (counted, never fatal) and leaves no run behind."""
    f = write(tmp_path / "a.jsonl", [rec(t=T0, run=5), rec(t=T0 + 1, run=["x"]), rec(t=T0 + 2, spec=[3]),
                                     rec(t=T0 + 3, spec={"steps": [1]}), rec(t=T0 + 4, run="ok")])
    res = aggregate([f])
    assert res.skipped_lines == 4 and res.records == 1
    assert [r.id for r in res.runs] == ["ok"]


def test_run_timer_is_joined_and_auto_resolved(tmp_path: Path) -> None:
    """A run's timer: its header's, "auto" replaced by what its records say they used, several joined with
    "+" (here rank 0 timed with sync, rank 1 with events)."""
    a = write(tmp_path / "gpu1-1-rank0.jsonl", [header("r", T0, "auto", pid=1)] + cycles(2, T0 + 1, pid=1, run="r"))
    b = write(tmp_path / "gpu1-2-rank1.jsonl", cycles(2, T0 + 1, pid=2, rank=1, run="r", **events()))
    res = aggregate([a, b])
    assert [r.timer for r in res.runs] == ["events+sync"]
    assert [g.n for g in res.groups] == [4]  # one run: the ranks together
    c = write(tmp_path / "c.jsonl", [header("h", T0, "auto")])
    assert aggregate([c]).runs[0].timer == "auto"


# --------------------------------------------------------------------------------------------------------------
# selection
# --------------------------------------------------------------------------------------------------------------


def test_select_by_run_id_and_prefix(tmp_path: Path) -> None:
    """run_ids takes whole ids or unambiguous prefixes; an unknown id is a usage error that names the runs that
    exist, an ambiguous prefix one that names the runs it fits."""
    files = iter_log_files([str(blend_folder(tmp_path))])
    res = aggregate(files, run_ids=["run-events-r"])
    assert [r.id for r in res.runs] == ["run-events-random"] and res.records == 100
    assert [g.key for g in res.groups] == [()]  # one run selected: the key as without runs
    assert [r.id for r in res.other_runs] == ["run-sync-agree", "run-events-agree"]
    two = aggregate(files, run_ids=["run-sync-agree", "run-events-a"])
    assert [r.id for r in two.runs] == ["run-sync-agree", "run-events-agree"]
    assert [g.key_dict()["run"] for g in two.groups] == ["run-sync-agree", "run-events-agree"]
    with pytest.raises(UsageError) as exc:
        aggregate(files, run_ids=["nope"])
    assert "nope" in str(exc.value)
    assert all(rid in str(exc.value) for rid in ("run-sync-agree", "run-events-random", "run-events-agree"))
    with pytest.raises(UsageError, match="ambiguous") as exc:
        aggregate(files, run_ids=["run-events"])
    assert "run-events-random" in str(exc.value) and "run-sync-agree" not in str(exc.value)


def test_select_since_and_latest(tmp_path: Path) -> None:
    """since keeps the runs that started at or after a time; latest keeps the newest (of what is left)."""
    files = iter_log_files([str(blend_folder(tmp_path))])
    since = aggregate(files, since=T0 + 590)  # exactly the second run's header time: included
    assert [r.id for r in since.runs] == ["run-events-random", "run-events-agree"]
    assert aggregate(files, since=T0 + 591).runs[0].id == "run-events-agree"
    nothing = aggregate(files, since=T0 + 10_000)
    assert nothing.runs == () and nothing.groups == () and len(nothing.other_runs) == 3
    assert "no timing records" in render_table(nothing)
    latest = aggregate(files, latest=True)
    assert [r.id for r in latest.runs] == ["run-events-agree"]
    assert latest.records == 100 and latest.groups[0].accept_len == approx(5.93)
    both = aggregate(files, run_ids=["run-sync", "run-events-random"], latest=True)
    assert [r.id for r in both.runs] == ["run-events-random"]
    with pytest.raises(UsageError, match="since"):
        aggregate(files, since="yesterday")  # type: ignore[arg-type]


def test_window_keeps_runs_apart_and_reads_headers_outside_it(tmp_path: Path) -> None:
    """bench's t_min/t_max window over a restart: two groups, not one; a header line outside the window still
    gives its run's flags; a run with no record in the window is not listed."""
    files = iter_log_files([str(blend_folder(tmp_path))])
    # records are 12 ms apart: the window keeps records 42..99 of the first run, all of the second, and
    # records 0..41 of the third
    res = aggregate(files, t_min=T0 + 0.5, t_max=T0 + 1200.5)
    assert [(r.id, r.records) for r in res.runs] == [("run-sync-agree", 58), ("run-events-random", 100),
                                                    ("run-events-agree", 42)]
    assert res.runs[0].start == T0 - 10 and res.runs[0].flags_dict() == AGREE
    assert [g.accept_len for g in res.groups] == [approx((51 * 6 + 7 * 5) / 58), approx(1.0), approx(6.0)]
    only = aggregate(files, t_min=T0 + 600, t_max=T0 + 601)
    assert [r.id for r in only.runs] == ["run-events-random"] and only.groups[0].key == ()


# --------------------------------------------------------------------------------------------------------------
# spec (adaptive speculation)
# --------------------------------------------------------------------------------------------------------------


def test_spec_varying_within_a_run_splits_the_group(tmp_path: Path) -> None:
    """Cycles of different step counts are never averaged: a varying spec adds "spec" to the key (compact
    string), per mode and by-value; where it is constant, or absent, the group is not split."""
    s3 = {"steps": 3, "topk": 1, "draft_tokens": 4}
    s5 = {"draft_tokens": 6, "topk": 1, "steps": 5}  # key order of the record does not matter
    recs = [rec(t=T0 + i * 0.012, cycle_ms=10.0 if i % 2 else 20.0, spec=s3 if i % 2 else s5, run="r")
            for i in range(6)]
    recs.append(rec(t=T0 + 1, mode="prefill", phases={"target": 5.0}, spec=s3, run="r"))
    f = write(tmp_path / "a.jsonl", recs)
    res = aggregate([f])
    assert [(g.mode, g.key, g.n, g.cycle.mean) for g in res.groups] == [
        ("decode", (("spec", "steps=3,topk=1,draft_tokens=4"),), 3, 10.0),
        ("decode", (("spec", "steps=5,topk=1,draft_tokens=6"),), 3, 20.0),
        ("prefill", (), 1, 10.0),  # one spec in the prefill group: not split
    ]
    assert "decode spec=steps=3,topk=1,draft_tokens=4  n=3" in render_table(res)
    rows = list(csv.DictReader(io.StringIO(render_csv(res))))
    assert rows[0]["key"] == "spec=steps=3,topk=1,draft_tokens=4" and rows[0]["run"] == "r"
    by_bs = aggregate([f], by="bs")
    assert by_bs.groups[0].key_dict() == {"bs": 1, "spec": "steps=3,topk=1,draft_tokens=4"}

    constant = write(tmp_path / "c.jsonl", [rec(t=T0 + i, spec=s3, run="c") for i in range(4)])
    (g,) = aggregate([constant]).groups
    assert (g.key, g.n) == ((), 4)


def test_spec_missing_in_part_of_a_group_is_its_own_group(tmp_path: Path) -> None:
    """Records without a spec next to records with one: that varies too, the spec-less ones keyed spec=None."""
    f = write(tmp_path / "a.jsonl", [rec(t=T0, run="r"), rec(t=T0 + 1, run="r", spec={"steps": 2})])
    res = aggregate([f])
    assert [g.key_dict() for g in res.groups] == [{"spec": "steps=2"}, {"spec": None}]
    assert [g.key_label() for g in res.groups] == ["spec=steps=2", "spec=?"]


# --------------------------------------------------------------------------------------------------------------
# shapes: JSON, CSV, table
# --------------------------------------------------------------------------------------------------------------


def test_one_run_shapes_are_as_before(tmp_path: Path) -> None:
    """With one run the JSON keeps its shape (no "run" in keys; "runs" added last), the CSV's old columns keep
    their places (``run`` appended, holding the run id), the table gains only the run's header line."""
    f = write(tmp_path / "a.jsonl", [header("abc123", T0 - 1, "sync", AGREE)] + cycles(3, T0, run="abc123"))
    res = aggregate([f], by="bs")
    doc = res.to_json()
    assert list(doc) == ["sources", "records", "skipped_lines", "groups", "runs"]
    assert doc["groups"][0]["key"] == {"bs": 1}
    assert doc["runs"] == [{"id": "abc123", "start": T0 - 1, "timer": "sync", "flags": AGREE, "records": 3}]
    rows = list(csv.reader(io.StringIO(render_csv(res))))
    assert CSV_COLUMNS[-1] == "run" and tuple(rows[0]) == CSV_COLUMNS
    assert rows[0][:15] == ["mode", "key", "phase", "n", "mean", "p50", "p90", "p99", "max", "share", "accept_len",
                            "tokens_per_s", "wall_tokens_per_s", "host_mean", "host_p50"]
    assert {r[1] for r in rows[1:]} == {"bs=1"} and {r[-1] for r in rows[1:]} == {"abc123"}
    assert all(len(r) == len(CSV_COLUMNS) for r in rows)
    lines = render_table(res).splitlines()
    assert lines[0] == (f"run {local_time(T0 - 1)}  EAGLE3 draft=agree-eagle3 steps=5 topk=1 draft_tokens=6  "
                        "timer=sync  (id abc123)")
    assert lines[1].startswith("decode bs=1  n=3  accept len 3.000")


def test_several_runs_shapes(tmp_path: Path) -> None:
    """Several runs: every group key holds "run", "runs" lists them oldest first, the CSV's run column tells
    the rows apart, and the table has a header line per run before its groups, newest last."""
    res = aggregate(iter_log_files([str(blend_folder(tmp_path))]))
    doc = res.to_json()
    assert [g["key"]["run"] for g in doc["groups"]] == [r["id"] for r in doc["runs"]]
    assert [r["start"] for r in doc["runs"]] == sorted(r["start"] for r in doc["runs"])
    rows = list(csv.DictReader(io.StringIO(render_csv(res))))
    cyc = [(r["run"], r["key"], r["accept_len"]) for r in rows if r["phase"] == "cycle"]
    assert cyc == [("run-sync-agree", "", "5.93"), ("run-events-random", "", "1.0"), ("run-events-agree", "", "5.93")]
    lines = render_table(res).splitlines()
    heads = [i for i, ln in enumerate(lines) if ln.startswith("run ")]
    assert len(heads) == 3
    assert lines[heads[0]].endswith("timer=sync  (id run-sync-agree)")
    assert "draft=random-eagle3" in lines[heads[1]] and lines[heads[1]].endswith("timer=events  (id run-events-random)")
    assert lines[heads[2]] == f"run {local_time(T0 + 1200)}  timer=events  (id run-events-agree)"
    assert [lines[i + 1].split("  ")[0] for i in heads] == ["decode"] * 3
    assert lines[heads[1] + 1].startswith("decode  n=100  accept len 1.000")


def test_from_json_round_trip_renders_the_same(tmp_path: Path) -> None:
    """ReportResult.from_json (for bench's stored timings) keeps the runs: the table made from the JSON has the
    same run header lines and group titles as the original."""
    res = aggregate(iter_log_files([str(blend_folder(tmp_path))]))
    back = ReportResult.from_json(json.loads(json.dumps(res.to_json())))
    assert [g.run for g in back.groups] == [g.run for g in res.groups]
    assert render_table(back) == render_table(res)
    merged = aggregate(iter_log_files([str(blend_folder(tmp_path))]), merge_runs=True)
    assert render_table(ReportResult.from_json(merged.to_json())).splitlines()[0].startswith("warning: merged 3")
    legacy = {k: v for k, v in res.to_json().items() if k != "runs"}  # an older document: no runs
    assert ReportResult.from_json(legacy).runs == ()


def test_compact_flags() -> None:
    """The header line's speculative flags: algorithm alone, short names, draft model by its last path
    component, boolean flags by name, other speculative flags after by name; no other server flag."""
    flags = dict(AGREE, **{"speculative-adaptive": True, "tp-size": "2", "speculative-other": None,
                           "speculative-accept-threshold-single": "0.9"})
    assert compact_flags(flags) == ("EAGLE3 draft=agree-eagle3 steps=5 topk=1 draft_tokens=6 "
                                    "accept-threshold-single=0.9 adaptive")
    assert compact_flags({}) == ""


def test_skip_that_drops_a_whole_run(tmp_path: Path) -> None:
    """A run whose every cycle --skip dropped is still listed (with its records) and the table says why it shows
    no numbers."""
    a = write(tmp_path / "gpu1-1-rank0.jsonl", cycles(2, T0, pid=1, run="short"))
    b = write(tmp_path / "gpu1-2-rank0.jsonl", cycles(5, T0 + 100, pid=2, run="long"))
    res = aggregate([a, b], skip=2)
    assert [(r.id, r.records) for r in res.runs] == [("short", 2), ("long", 5)]
    assert [(g.run, g.n) for g in res.groups] == [("long", 3)]
    assert "every cycle left out by --skip" in render_table(res)


# --------------------------------------------------------------------------------------------------------------
# compare and traces
# --------------------------------------------------------------------------------------------------------------


def test_compare_with_runs_puts_each_run_in_its_own_column(tmp_path: Path) -> None:
    """A source holding several runs is split into a column per run (label#1, #2, oldest first), matched with
    the other sources by mode and key; a single source with several runs can be compared with itself; one
    source with one run cannot."""
    folder = blend_folder(tmp_path)
    before = aggregate(iter_log_files([str(folder)]))
    after = aggregate([write(tmp_path / "after" / "x.jsonl", cycles(4, T0 + 5000, 2, run="after-run"))])
    cmp = compare([before, after], ["dir", "after"])
    assert cmp.sources == ("dir#1", "dir#2", "dir#3", "after")
    (g,) = cmp.groups
    assert (g.mode, g.key) == ("decode", ())
    acc = g.row("accept_len")
    assert acc is not None and acc.values == (approx(5.93), approx(1.0), approx(5.93), approx(2.0))
    assert acc.delta_pct[1] == approx((1.0 - 5.93) / 5.93 * 100)
    doc = cmp.to_json()
    assert [c["runs"][0]["id"] for c in doc["columns"]] == ["run-sync-agree", "run-events-random",
                                                           "run-events-agree", "after-run"]
    assert [c["source"] for c in doc["columns"]] == ["dir", "dir", "dir", "after"]
    table = render_compare_table(cmp)
    assert table.splitlines()[0].startswith("dir#1: run ") and "(id run-sync-agree)" in table.splitlines()[0]
    assert "Δ% dir#2" in table and "Δ% after" in table
    assert render_compare_csv(cmp).splitlines()[0] == (
        "mode,key,metric,dir#1,dir#2,dir#3,after,delta_pct_dir#2,delta_pct_dir#3,delta_pct_after")
    itself = compare([before], ["dir"])
    assert itself.sources == ("dir#1", "dir#2", "dir#3")
    with pytest.raises(UsageError, match="two or more"):
        compare([after], ["after"])
    merged = compare([aggregate(iter_log_files([str(folder)]), merge_runs=True), after], ["dir", "after"])
    assert merged.sources == ("dir", "after")
    assert "3 runs merged, their figures blend" in render_compare_table(merged)


def test_aggregate_each_writes_one_trace_per_source(tmp_path: Path) -> None:
    """--compare --trace FILE: one trace per source, FILE with .1, .2 before the extension, each holding only
    its own source's cycles; the selection applies per source (latest: each source's newest run)."""
    folder = blend_folder(tmp_path)
    other = write(tmp_path / "other" / "o.jsonl", cycles(7, T0, run="o"))
    out = tmp_path / "trace.json"
    results, paths = aggregate_each([iter_log_files([str(folder)]), [other]], ["dir", "other"],
                                    trace_path=str(out), latest=True)
    assert paths == [str(tmp_path / "trace.1.json"), str(tmp_path / "trace.2.json")]
    assert [[r.id for r in res.runs] for res in results] == [["run-events-agree"], ["o"]]
    assert results[0].sources == ("dir",)
    counts = []
    for p in paths:
        ev = json.loads(Path(p).read_text())["traceEvents"]
        counts.append(sum(1 for e in ev if e.get("cat") == "cycle"))
    assert counts == [100, 7]  # the first: the newest run of the folder alone
    assert not out.exists()
    none, no_paths = aggregate_each([[other]])
    assert no_paths == [] and none[0].records == 7
    with pytest.raises(UsageError, match="^other: no run"):
        aggregate_each([[other]], ["other"], run_ids=["zzz"])


def test_numbered_paths() -> None:
    """.1, .2 go before the extension; a path without one gets them at the end; dots in folders stay."""
    assert numbered_paths("t.json", 2) == ["t.1.json", "t.2.json"]
    assert numbered_paths("/a.b/trace", 2) == ["/a.b/trace.1", "/a.b/trace.2"]
    assert numbered_paths("x.trace.json", 1) == ["x.trace.1.json"]


def test_trace_of_a_selection_holds_the_selected_runs_only(tmp_path: Path, monkeypatch) -> None:
    """With a trace and a selection that leaves runs out, the trace holds the selected run's cycles alone (a
    second read of the files); when the selection keeps everything the files are read once."""
    files = iter_log_files([str(blend_folder(tmp_path))])
    calls = []
    real = agg_mod.scan_files
    monkeypatch.setattr(agg_mod, "scan_files", lambda *a, **k: calls.append(1) or real(*a, **k))
    out = tmp_path / "t.json"
    res = aggregate(files, trace_path=str(out), run_ids=["run-events-random"], skip=1)
    ev = json.loads(out.read_text())["traceEvents"]
    cyc = [e for e in ev if e.get("cat") == "cycle"]
    assert len(cyc) == 100 and sum(1 for e in cyc if e["args"].get("skipped")) == 1
    assert {e["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"} == {"thread_name"}
    assert [e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"] == ["rank0 pid202"]
    assert res.groups[0].n == 99 and len(calls) == 2
    calls.clear()
    one = write(tmp_path / "one.jsonl", cycles(3, T0, run="only"))
    aggregate([one], trace_path=str(out), latest=True)
    assert len(calls) == 1
    assert sum(1 for e in json.loads(out.read_text())["traceEvents"] if e.get("cat") == "cycle") == 3


def test_run_start_is_the_earliest_record_across_processes_of_one_file(tmp_path: Path) -> None:
    """A file holding two processes of one run (a concatenated log), the later-starting one first: the run's
    start is still the earliest t of all its records (the start is looked for where the process changes too)."""
    f = write(tmp_path / "cat.jsonl", cycles(3, T0 + 50, pid=1, run="r") + cycles(3, T0, pid=2, run="r"))
    assert aggregate([f]).runs[0].start == T0
    legacy = write(tmp_path / "old.jsonl", cycles(2, T0 + 50, pid=1) + cycles(2, T0 + 7, pid=2))
    assert aggregate([legacy]).runs[0].start == T0 + 7


# --- a server's launch: the runs of (launcher pid, start ticks) -------------------------------------------------
def test_launch_of_reads_the_runtime_ids_only() -> None:
    assert agg_mod.launch_of("gpu-1-2-7-1234-99887-0a1b2c3d") == (1234, 99887)
    for rid in ("file:gpu1-7-rank0.jsonl", "r1", "gpu1-12-34-zzzzzzzz", "gpu1-12-34-abc", "gpu1-x-34-0a1b2c3d"):
        assert agg_mod.launch_of(rid) is None, rid


def test_a_pid_used_again_is_another_launch_and_only_the_current_one_is_read(tmp_path: Path) -> None:
    """A container starts its server as the same pid every time, so two launches append to one file: the current
    launch (pid 7, started at tick 900) is read alone; logs of an older runtime (no run ids) still count."""
    old, cur = "gpu1-7-500-0a0a0a0a", "gpu1-7-900-0b0b0b0b"
    f = write(tmp_path / "gpu1-7-rank0.jsonl", [header(old, T0, "sync", pid=7)] + cycles(4, T0 + 1, accepted=1, run=old)
              + [header(cur, T0 + 100, "events", pid=7)] + cycles(6, T0 + 101, accepted=4, run=cur, **events()))
    res = aggregate([f], launches={(7, 900)})
    assert [r.id for r in res.runs] == [cur] and [r.id for r in res.other_runs] == [old]
    (g,) = [g for g in res.groups if g.mode == "decode"]
    assert (g.n, g.accept_len) == (6, 4.0)
    assert aggregate([f], launches={(7, 500)}).runs[0].id == old
    assert aggregate([f], launches={(8, 900)}).groups == ()
    legacy = write(tmp_path / "gpu1-9-rank0.jsonl", cycles(3, T0))           # no "run": one run per file
    assert [r.id for r in aggregate([legacy], launches={(9, 1)}).runs] == ["file:gpu1-9-rank0.jsonl"]


def test_doctor_reads_only_the_current_launch_of_a_reused_pid(tmp_path: Path) -> None:
    from eaglepatch.doctor.collect import load_records

    old, cur = "gpu1-7-500-0a0a0a0a", "gpu1-7-900-0b0b0b0b"
    write(tmp_path / "gpu1-7-rank0.jsonl", [header(old, T0, "sync", pid=7)] + cycles(4, T0 + 1, accepted=1, run=old)
          + [header(cur, T0 + 100, "events", pid=7)] + cycles(6, T0 + 101, accepted=4, run=cur, **events()))
    got = load_records(str(tmp_path), {7}, {(7, 900)})
    assert (got["records"], got["timer"], got["decode"]["accept_len"]) == (6, "events", 4.0)
    blended = load_records(str(tmp_path), {7})                                # no launch known: every run of pid 7
    assert blended["records"] == 10
