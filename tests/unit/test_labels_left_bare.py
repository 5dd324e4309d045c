"""The tok/s left bare after the first pass of issue 42 say whose they are, in the words of
``eaglepatch.report.labels``: ``report --compare``'s text table (its tok/s rows; the CSV keeps the JSON keys), the
help of ``report``, ``bench`` and ``sweep``, and the docs a newcomer reads first about doctor and the report
(docs/doctor.md, docs/walkthrough.md). The runtime's own summary line is tested with the runtime
(tests/unit/test_runtime_summary.py)."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from eaglepatch.cli import app
from eaglepatch.report import aggregate
from eaglepatch.report import labels
from eaglepatch.report.comparison import compare, render_compare_csv, render_compare_table

REPO = Path(__file__).resolve().parents[2]
UNIT = re.compile(r"\btok(?:en)?s?/s\b")  # a tok/s, tokens/s or token/s figure's unit


def unlabelled(text: str) -> list[str]:
    """Each tok/s of ``text`` (its whitespace made single spaces: wrapped help and prose) that no label ends at."""
    text = " ".join(text.split())
    return [text[max(0, m.start() - 50):m.end() + 10] for m in UNIT.finditer(text)
            if not any(text.endswith(lab, 0, m.end()) for lab in labels.ALL)]


def log(path: Path, cycle: float) -> str:
    recs = [{"v": 1, "t": 1764500000.0 + i * 0.01, "host": "gpu1", "pid": 1, "rank": 0, "worker": "EAGLEWorker",
             "mode": "decode", "bs": 2, "cycle_ms": cycle, "timer": "sync",
             "phases": {"draft": 1.0, "verify": cycle - 2.0, "draft_extend": 1.0}, "accepted": 5}
            for i in range(20)]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return str(path)


def test_the_compare_table_names_its_tok_s_rows_by_their_labels(tmp_path):
    """Two runs side by side: the rows of tokens_per_s and wall_tokens_per_s read "in-cycle tok/s" and "records'
    wall tok/s" in the table, with their values and deltas; the CSV (for scripts) keeps the JSON keys."""
    cmp = compare([aggregate([log(tmp_path / "a.jsonl", 10.0)]), aggregate([log(tmp_path / "b.jsonl", 8.0)])],
                  ["before", "after"])
    table = render_compare_table(cmp)
    assert unlabelled(table) == [] and "tokens_per_s" not in table, table
    cycle_row = next(ln for ln in table.splitlines() if ln.startswith(labels.CYCLE))
    assert cycle_row.split()[-3:] == ["500.0", "625.0", "+25.0%"], cycle_row
    assert any(ln.startswith(labels.WALL) for ln in table.splitlines()), table
    rows = list(csv.reader(io.StringIO(render_compare_csv(cmp))))
    assert {r[2] for r in rows[1:]} >= {"tokens_per_s", "wall_tokens_per_s"}


@pytest.mark.parametrize("command", ["report", "bench", "sweep"])
def test_the_help_says_whose_tok_s(command):
    """``--help``: every tok/s of the command's help, options included, carries its label."""
    r = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "100"}, terminal_width=100)
    assert r.exit_code == 0, r.output
    assert UNIT.search(r.output), "no tok/s in the help: the check would be vacuous"
    assert unlabelled(r.output) == [], r.output


@pytest.mark.parametrize("doc", ["docs/doctor.md", "docs/walkthrough.md"])
def test_the_docs_say_whose_tok_s(doc):
    """docs/doctor.md's thresholds and next steps, and the walkthrough's report and its definitions."""
    text = (REPO / doc).read_text()
    assert unlabelled(text) == [], doc


def test_the_walkthrough_quotes_the_report_as_it_prints_now():
    """The walkthrough's report quotes the group line as render_table prints it (labels, not the old "tok/s" and
    "wall tok/s"), and defines each label it quotes."""
    text = (REPO / "docs" / "walkthrough.md").read_text()
    block = text.split("## Reading a report", 1)[1].split("```")[1]
    assert re.search(rf"^decode  n=\d+  accept len [0-9.]+  {re.escape(labels.CYCLE)} [0-9.]+  "
                     rf"{re.escape(labels.WALL)} [0-9.]+$", block, re.M), block
    after = text.split("## Reading a report", 1)[1].split("```")[2]
    assert f"`{labels.CYCLE}`" in after and f"`{labels.WALL}`" in after
