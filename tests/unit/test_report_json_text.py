"""``report --json`` written piece by piece (eaglepatch/report/jsontext.py, issue 41): the same bytes as
``json.dumps(doc, indent=1)`` of the whole document, whose groups and runs are made one at a time as they are
written, never all at once."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from eaglepatch import cli, cli_output
from eaglepatch.errors import ConnectionFailed
from eaglepatch.ops import reporting
from eaglepatch.report import RunInfo, aggregate
from eaglepatch.report.jsontext import Items, indented, write_indented

DOCS = [
    {},
    {"groups": []},
    {"a": [], "b": {}, "c": None, "d": 0.1 + 0.2, "e": "x\ny\u2028\u00e9\"\\"},
    {"sources": ["a b"], "records": 3, "groups": [{"key": {"bs": 1}, "n": 2, "phases": {}, "x": [1.5, math.inf]},
                                                 {}], "runs": [[], [1, [2, {"k": [None]}]]], "merged": True},
    {"groups": [{"predict": [{"steps": 0}], "acceptance": {"at_least": [1.0, 0.5]}}], "cost_model": {"v": {}}},
]


@pytest.mark.parametrize("doc", DOCS)
def test_indented_is_json_dumps_indent_1(doc):
    want = json.dumps(doc, indent=1) + "\n"
    assert indented(doc) == want
    lazy = {k: Items(iter(v)) if isinstance(v, list) else v for k, v in doc.items()}
    assert indented(lazy) == want
    pieces: list[str] = []
    lazy = {k: Items(iter(v)) if isinstance(v, list) else v for k, v in doc.items()}
    write_indented(lazy, pieces.append)
    assert "".join(pieces) == want


def test_items_are_made_as_they_are_written():
    """Each group is made when its turn comes, after the ones before it were written: never all of them first."""
    made: list[int] = []
    written: list[str] = []

    def groups():
        for i in range(3):
            made.append(i)
            assert len(written) >= 2 + i  # "{", the "groups" key, and one piece per group before it
            yield {"i": i}

    write_indented({"groups": Items(groups())}, written.append)
    assert made == [0, 1, 2]
    assert len(written) == 1 + 1 + 3 + 1 + 1  # {, key, 3 groups, ], }


def _log(tmp_path):
    """Three runs of a few records each, with prefill, host times and accepts: every key of a group."""
    lines = []
    t = 1764500000.0
    for r in range(3):
        rid = f"gpu1-{100 + r}-{5000 + r}-{r:08x}"
        lines.append(json.dumps({"v": 1, "kind": "run", "run": rid, "t": t, "host": "gpu1", "pid": 100 + r,
                                 "rank": 0, "timer": "events", "flags": {"speculative-num-steps": "3"}}))
        for i in range(60):
            mode = "prefill" if i % 10 == 3 else "decode"
            rec = {"v": 1, "t": round(t, 6), "host": "gpu1", "pid": 100 + r, "rank": 0, "run": rid, "mode": mode,
                   "bs": 1 + i % 4, "cycle_ms": 10.0 + (i * 7 % 13) / 10, "timer": "events",
                   "phases": {"draft": 3.0 + i % 3 / 10, "verify": 6.0}, "accepted": 1 + i % 4 if mode == "decode"
                   else None, "host_cycle_ms": 9.0, "host_phases": {"draft": 1.0, "verify": 2.0},
                   "spec": {"steps": 3, "topk": 1, "draft_tokens": 4}}
            if mode == "decode":
                rec["accepts"] = [1 + (i + j) % 4 for j in range(rec["bs"])]
            lines.append(json.dumps(rec))
            t += 0.012
        t += 10
    path = tmp_path / "runs.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.mark.parametrize("extra", [[], ["--predict"], ["--by", "bs"], ["--merge-runs"]])
def test_report_json_is_the_whole_document_dumped(tmp_path, extra):
    """The CLI's ``report --json`` (written piece by piece) is byte for byte ``json.dumps(doc, indent=1)`` of the
    document made whole, as it was made before (``to_json``, the sources, the predictions, the prices by batch
    size attached)."""
    path = _log(tmp_path)
    res = CliRunner().invoke(cli.app, ["report", path, "--json", *extra])
    assert res.exit_code == 0, res.output
    by = "bs" if "--by" in extra else None
    result = aggregate([path], by=by, merge_runs="--merge-runs" in extra)
    doc = result.to_json()
    doc["sources"] = [path]
    if "--predict" in extra:
        from eaglepatch.report.predict import MIN_CYCLES, predict
        from eaglepatch.report.predict_bs import for_runs

        for gd, pred in zip(doc["groups"], predict(result, min_cycles=MIN_CYCLES)):
            if pred is not None:
                gd.update(pred.to_json())
        reporting.attach_by_bs(doc, for_runs(aggregate([path], by="bs"), min_cycles=MIN_CYCLES))
        assert any("predict" in g for g in doc["groups"])
    assert res.stdout == json.dumps(doc, indent=1) + "\n"


def test_report_json_handed_to_write(tmp_path):
    """With ``write``, ``report`` hands the JSON over piece by piece (a piece per group, not one text) and
    returns nothing: the same text."""
    path = _log(tmp_path)
    kw = dict(by=None, skip=0, trace=None, compare=False, log_dir=None, fmt="json", say=lambda m: None,
              runs=reporting.RunSelection(all=True))
    whole = reporting.report([path], None, **kw)  # type: ignore[arg-type]
    pieces: list[str] = []
    assert reporting.report([path], None, write=pieces.append, **kw) == ""  # type: ignore[arg-type]
    assert "".join(pieces) == whole
    assert len(pieces) > len(json.loads(whole)["groups"])


@pytest.mark.parametrize("error, code", [(RuntimeError("boom"), 1), (ConnectionFailed("gpu1: connection lost"), 3)])
def test_report_json_failing_part_way_leaves_stdout_empty(tmp_path, monkeypatch, error, code):
    """An error after the JSON began (here: the second run's object) leaves stdout empty, not a partial document:
    the one-line error on stderr, the exit code of docs/contract.md for that error."""
    path = _log(tmp_path)
    made = []
    to_json = RunInfo.to_json

    def second_fails(self):
        made.append(self.id)
        if len(made) > 1:
            raise error
        return to_json(self)

    monkeypatch.setattr(RunInfo, "to_json", second_fails)
    res = CliRunner().invoke(cli.app, ["report", path, "--json", "--all-runs"])
    assert len(made) == 2  # the first run was written before the error
    assert res.exit_code == code
    assert res.stdout == ""
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("eaglepatch: ")


def test_whole_or_nothing_past_the_spool_in_memory(monkeypatch, capsys):
    """Past ``SPOOL_BYTES`` the pieces go to a temporary file: stdout gets them all once the block ends, and
    nothing where it raises."""
    monkeypatch.setattr(cli_output, "SPOOL_BYTES", 100)
    pieces = [f'"{i}\u00e9",\n' for i in range(1000)]
    with cli_output.whole_or_nothing() as write:
        for p in pieces:
            write(p)
    assert capsys.readouterr().out == "".join(pieces)
    with pytest.raises(RuntimeError):
        with cli_output.whole_or_nothing() as write:
            for p in pieces:
                write(p)
            raise RuntimeError("part-way")
    assert capsys.readouterr().out == ""


def test_several_targets_json_is_one_flat_list_where_a_target_runs_several_servers(capsys):
    """doctor --json naming several TARGETs, one of which runs two servers (a list of its own): one list of every
    server's object in order, never a list inside the list; status (not flat) keeps one value per TARGET."""
    import json

    import typer

    from eaglepatch.cli_output import Outcome, finish

    outs = [Outcome("gpu1", {"server": 1}), Outcome("gpu2", [{"server": 2}, {"server": 3}])]
    with pytest.raises(typer.Exit):
        finish(outs, True, None, flat=True)
    assert json.loads(capsys.readouterr().out) == [{"server": 1}, {"server": 2}, {"server": 3}]
    with pytest.raises(typer.Exit):
        finish([Outcome("gpu2", [{"server": 2}, {"server": 3}])], True, None, flat=True)
    assert json.loads(capsys.readouterr().out) == [{"server": 2}, {"server": 3}]  # one TARGET: as before
    with pytest.raises(typer.Exit):
        finish(outs, True, None)
    assert json.loads(capsys.readouterr().out) == [{"server": 1}, [{"server": 2}, {"server": 3}]]
