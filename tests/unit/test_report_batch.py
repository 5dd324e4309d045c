"""The report's batch path (eaglepatch/report/batch.py, columns.py) against the line loop (lines.py): on logs that
mix good records with every kind of line the report rejects, headers, blank lines, other line ends, processes, runs,
specs and recipes, ``aggregate`` gives exactly the same result (every number, ``repr`` for ``repr``) whether the
files are read in batches (in big pieces, or in small ones that cut records everywhere), line by line with msgspec,
or line by line with the standard library alone."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from eaglepatch.report import aggregate
from eaglepatch.report import batch as batch_mod
from eaglepatch.report import scan as scan_mod

pytest.importorskip("msgspec")

T0 = 1764500000.0

# Lines the report counts in skipped_lines, each for its own reason (none of them a valid record).
REJECTED = {
    "not JSON": "not json",
    "cut short": '{"v": 1, "t": 1764500000.0',
    "not an object": "[1, 2]",
    "empty object": "{}",
    "another version": '{"v": 2, "t": 1764500000.0}',
    "NaN": '{"v": 1, "t": NaN}',
    "two records on a line": '{"v": 1} {"v": 1}',
    "a BOM": "\ufeff{\"v\": 1}",
    "nested deep": "[" * 5000,
    "bad header": '{"v": 1, "kind": "run", "run": ""}',
}
# Record fields made invalid: (field, value), or (field, None) to drop it.
SPOILED = [
    ("pid", "4242"), ("host", 5), ("rank", 0.5), ("mode", 3), ("run", ""), ("run", 7), ("spec", [1]),
    ("spec", {"steps": [1]}), ("accepts", [-1]), ("accepts", [1.5]), ("accepts", "x"), ("accepts", [True]),
    ("phases", None), ("phases", {"draft": "x"}), ("phases", [1]), ("t", "1"), ("cycle_ms", None), ("bs", "2"),
    ("accepted", "3"), ("v", 3), ("accept_hist", {"x": 1}), ("host_cycle_ms", "1"),
]
# Values out of the bounds of docs/safety.md, "Hostile logs" (eaglepatch/report/record.py): skipped like SPOILED
# (a list of their own: log_lines draws from SPOILED and ODD, and their lengths set what it draws).
BOUNDS = [
    ("t", 10 ** 20), ("t", -1.0), ("accepted", 10 ** 17), ("bs", -1), ("pid", 10 ** 13), ("cycle_ms", 1e39),
    ("cycle_ms", -0.5), ("phases", {"draft": -1e39, "verify": 2 ** 53}), ("phases", {"draft": 3600000.5}),
    ("host_cycle_ms", 1e7), ("accepts", [65]), ("accepts", [1] * 4097), ("accept_hist", {"65": 1}),
    ("accept_hist", {"1": 10 ** 13}), ("accept_hist", {"\u00b2": 1}),
]
# Odd records that the report takes: the batch decoders refuse them, the line loop reads them.
ODD = [
    ("v", 1.0), ("v", True), ("bs", True), ("accepted", True), ("t", 0), ("accepted", 10 ** 12),
    ("mode", "verify"), ("accepts", []), ("kind", "x"), ("phases", {"other": 1.0, "draft": 2}),
    ("accept_hist", {"3": 2}), ("cycle_ms", 7), ("spec", {"steps": 3, "topk": True}), ("t", True),
    ("cycle_ms", False), ("host_phases", {"draft": None}), ("worker", None), ("timer", 5), ("dropped", 2),
    ("cycle_ms", 3600000), ("phases", {"draft": 0, "verify": 3.6e6}),  # at the bounds (record.py): taken
]


def record(rng: random.Random, t: float, host: str = "gpu1", pid: int = 4242, rank: int = 0, run: Any = "r1",
           events: bool = False, spec: Any = None) -> dict[str, Any]:
    prefill = rng.random() < 0.1
    cyc = round(rng.uniform(5, 15), 4)
    ph = {"target": round(cyc * 0.8, 4)} if prefill else {"draft": round(rng.uniform(1, 4), 4),
                                                           "verify": round(rng.uniform(3, 8), 4), "draft_extend": 1.0}
    r: dict[str, Any] = {"v": 1, "t": round(t, 6), "host": host, "pid": pid, "rank": rank, "worker": "W",
                         "mode": "prefill" if prefill else "decode", "bs": rng.choice((1, 2, 4, None)),
                         "cycle_ms": cyc, "timer": "events" if events else "sync", "phases": ph,
                         "accepted": None if prefill and rng.random() < 0.5 else rng.randint(1, 9)}
    if not prefill:  # no more requests than bs (the same draws as ever)
        r["accepts"] = [rng.randint(1, 4) for _ in range(rng.choice((1, 2, 3)))][:r["bs"]]
    if events:
        r["host_cycle_ms"] = round(cyc * 0.9, 4)
        r["host_phases"] = {k: round(v * 0.7, 4) for k, v in ph.items()}
    if run is not None:
        r["run"] = run
    if spec is not None:
        r["spec"] = spec
    return r


def log_lines(rng: random.Random, n: int, bad: float, **kw: Any) -> list[str]:
    """n records of one process, with gaps of all kinds, and (at rate ``bad``) rejected, spoiled and odd lines."""
    lines = [json.dumps({"v": 1, "kind": "run", "run": kw.get("run") or "r0", "t": T0 - 10, "timer": "sync",
                         "flags": {"a": "1"}})]
    t = T0 + rng.uniform(0, 1)
    for i in range(n):
        r = record(rng, t, **kw)
        cyc = r["cycle_ms"]
        x = rng.random()
        if x < bad:
            lines.append(rng.choice(list(REJECTED.values())))
        elif x < 2 * bad:
            field, value = rng.choice(SPOILED)
            r[field] = value
        elif x < 3 * bad:
            field, value = rng.choice(ODD)
            r[field] = value
        lines.append(json.dumps(r))
        if rng.random() < 0.005:
            lines.append("")
        if rng.random() < 0.003:
            lines.append(json.dumps({"v": 1, "kind": "run", "run": "r9", "t": t, "timer": "events"}))
        gap = rng.choice((0.001, 0.002, 0.0015, -0.0005, 2.5, -3.0)) if rng.random() < 0.05 else 0.0012
        t += cyc / 1000.0 + gap
    return lines


def results(files: list[str], monkeypatch: pytest.MonkeyPatch, **kw: Any) -> dict[str, str]:
    """``repr(aggregate(files, **kw))`` read in batches (big pieces, small ones), by the line loop with msgspec,
    and by the standard library alone; also how many records the batch path added in big pieces."""
    out: dict[str, str] = {}
    added = []
    real_apply = batch_mod.apply

    def counting_apply(g: Any, cyc: Any, *rest: Any) -> None:
        added.append(len(cyc))
        real_apply(g, cyc, *rest)

    with monkeypatch.context() as m:
        m.setattr(batch_mod, "apply", counting_apply)
        out["batches"] = repr(aggregate(files, **kw))
    with monkeypatch.context() as m:
        m.setattr(batch_mod, "PIECE", 300)
        m.setattr(batch_mod, "BATCH", 5)
        out["small pieces"] = repr(aggregate(files, **kw))
    with monkeypatch.context() as m:
        m.setattr(scan_mod, "Batches", lambda st: None)
        out["line loop"] = repr(aggregate(files, **kw))
    with monkeypatch.context() as m:
        m.setenv("EAGLEPATCH_JSON_PARSER", "json")
        out["json"] = repr(aggregate(files, **kw))
    out["added"] = str(sum(added))
    return out


def assert_same(res: dict[str, str]) -> None:
    want = res["line loop"]
    for name in ("batches", "small pieces", "json"):
        assert res[name] == want, name


def write_lines(path: Path, lines: list[str], end: str = "\n") -> str:
    path.write_text(end.join(lines) + end, encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("kw", [{}, {"by": "bs"}, {"by": "rank"}, {"skip": 5}, {"t_min": T0 + 0.5, "t_max": T0 + 3},
                                {"idle_gap_s": 0.5}, {"merge_runs": True}])
def test_batches_give_the_line_loops_result_on_mixed_logs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          kw: dict[str, Any]) -> None:
    rng = random.Random(25)
    files = [
        write_lines(tmp_path / "a-4242-rank0.jsonl", log_lines(rng, 900, 0.005)),
        write_lines(tmp_path / "a-4243-rank1.jsonl", log_lines(rng, 700, 0.005, pid=4243, rank=1, events=True)),
        write_lines(tmp_path / "b-77-rank0.jsonl", log_lines(rng, 300, 0.0, host="gpu2", pid=77, run=None)),
    ]
    res = results(files, monkeypatch, **kw)
    assert_same(res)
    assert int(res["added"]) > (150 if "t_min" in kw else 1000)  # most records came through the batch path


@pytest.mark.parametrize("name", sorted(REJECTED))
def test_each_rejected_line_is_skipped_alike(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    rng = random.Random(1)
    lines = log_lines(rng, 60, 0.0)
    lines.insert(30, REJECTED[name])
    f = write_lines(tmp_path / "a.jsonl", lines)
    res = results([f], monkeypatch)
    assert_same(res)
    assert "skipped_lines=1," in res["batches"]


@pytest.mark.parametrize("field,value", SPOILED + BOUNDS + ODD)
def test_each_spoiled_or_odd_record_is_read_alike(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, field: str,
                                                   value: Any) -> None:
    rng = random.Random(2)
    lines = log_lines(rng, 60, 0.0)
    r = json.loads(lines[30])
    r[field] = value
    if field == "accept_hist":
        del r["accepts"]  # read where a record has no accepts
    elif field == "bs" and "accepts" in r:
        r["accepts"] = r["accepts"][:1]  # no more requests than bs (True: 1)
    lines[30] = json.dumps(r)
    res = results([write_lines(tmp_path / "a.jsonl", lines)], monkeypatch, by="bs")
    assert_same(res)
    assert ("skipped_lines=1," in res["batches"]) == ((field, value) in SPOILED + BOUNDS)


# Lines as a file may hold them, each with the number of skipped lines it makes.
ODD_LINES = {
    "a record over two lines": (lambda x: x.replace(", ", ",\n", 1), 2),
    "a record cut by a lone CR": (lambda x: x.replace(", ", ",\r", 1), 2),
    "two records split by a lone CR": (lambda x: x + "\r" + x, 0),
    "blanks": (lambda x: "   ", 0),
    "blanks around a record": (lambda x: "  " + x + "  \t", 0),
    "a form feed after a record": (lambda x: x + "\f", 0),
}


@pytest.mark.parametrize("name", sorted(ODD_LINES))
def test_odd_lines_are_read_alike(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    rng = random.Random(3)
    lines = log_lines(rng, 120, 0.0, pid=5)
    change, skipped = ODD_LINES[name]
    lines[60] = change(lines[60])
    res = results([write_lines(tmp_path / "a.jsonl", lines)], monkeypatch)
    assert_same(res)
    assert f"skipped_lines={skipped}," in res["batches"]


def test_line_ends_and_a_last_line_without_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(3)
    crlf = write_lines(tmp_path / "crlf.jsonl", log_lines(rng, 80, 0.0), end="\r\n")
    last = tmp_path / "last.jsonl"
    last.write_text("\n".join(log_lines(rng, 40, 0.0, pid=6)), encoding="utf-8")
    assert_same(results([crlf, str(last)], monkeypatch))


def test_a_record_with_kind_outside_the_window_is_a_skipped_line(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(6)
    lines = log_lines(rng, 200, 0.0)
    r = json.loads(lines[5])
    r["kind"] = "cycle"
    lines[5] = json.dumps(r)
    res = results([write_lines(tmp_path / "a.jsonl", lines)], monkeypatch, t_min=T0 + 1.0)
    assert_same(res)
    assert "skipped_lines=1," in res["batches"]


def test_processes_runs_and_specs_that_change_from_line_to_line(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(4)
    a = log_lines(rng, 400, 0.0)
    b = log_lines(rng, 400, 0.0, pid=4243, run="r2")
    mixed = [x for pair in zip(a, b) for x in pair]  # two processes, line by line
    runs = log_lines(rng, 300, 0.0, run="r3")
    for i in range(100, 300, 7):
        r = json.loads(runs[i])
        r["run"] = "r4"
        runs[i] = json.dumps(r)
    specs = [json.dumps(record(rng, T0 + i * 0.02, pid=9, spec={"steps": 1 + i // 50 % 3, "topk": 1}))
             for i in range(400)]
    every = [json.dumps(record(rng, T0 + i * 0.02, pid=10, spec={"steps": rng.choice((1, 3)), "topk": 1}))
             for i in range(3000)]  # a spec of its own every record or two: left to the line loop
    files = [write_lines(tmp_path / f"{name}.jsonl", lines)
             for name, lines in (("mixed", mixed), ("runs", runs), ("specs", specs), ("every", every))]
    for kw in ({}, {"by": "host"}, {"skip": 3}):
        assert_same(results(files, monkeypatch, **kw))


def test_a_recipe_of_ones_own_is_learnt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Phases of other names: the first pieces go to the line loop, the next ones decode with those names."""
    rng = random.Random(5)
    lines = []
    for line in log_lines(rng, 3000, 0.0):
        if not line:
            continue
        r = json.loads(line)
        if "phases" in r:
            r["phases"] = {"mine": r["phases"].get("draft", 1.0), "yours": 2.5}
        lines.append(json.dumps(r))
    res = results([write_lines(tmp_path / "a.jsonl", lines)], monkeypatch)
    assert_same(res)
    assert int(res["added"]) > 1500
    assert "name='mine'" in res["batches"]


def test_the_collector_is_held_off_while_the_files_are_read_and_put_back(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import gc

    from eaglepatch.errors import UsageError

    rng = random.Random(7)
    f = write_lines(tmp_path / "a.jsonl", log_lines(rng, 50, 0.0))
    before = gc.get_threshold()
    seen = []
    real_read = batch_mod.Batches.read

    def read(self: Any, fh: Any) -> None:
        seen.append(gc.get_threshold()[0])
        real_read(self, fh)

    monkeypatch.setattr(batch_mod.Batches, "read", read)
    aggregate([f])
    assert seen and seen[0] >= 50_000 and gc.get_threshold() == before
    with pytest.raises(UsageError):
        aggregate([f, str(tmp_path / "gone.jsonl")])
    assert gc.get_threshold() == before
