"""A newcomer's first minutes (issue 42): README.md's ``eaglepatch apply T`` then ``eaglepatch bench T``, exactly as
written, against the stand-in sglang (tests/stubs/stand_in_sglang, a server of the V1 family with speculation, that
the patch times), prints no note of a load too short or a server warmed too little: bench without ``--requests``
sizes its load by duration (load.SIZED_LOAD_S, twice what the short-load note asks for) and says so in one line,
and warms the server that apply just restarted by itself. ``--requests`` given is kept as given, and a tiny one is
still told it is too short.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from eaglepatch.tuning.load import SHORT_LOAD_S, SIZED_LOAD_S
from safety import H  # the fixture standins: conftest.py

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

PY = sys.executable
REPO = Path(__file__).resolve().parents[2]
SPEC_ARGS = ("--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
             "--startup-delay", "0.2", "--tp", "1")
SHORT, FRESH = "the load ran for only", "request(s) warmed it"


class Newcomer:
    """The stand-in's install and server, and the CLI run on it as the README writes it (the install's path as T)."""

    def __init__(self, standins, tmp_path: Path):
        self.tree = H.make_tree(tmp_path / "site dir", H.V1_WORKER)
        self.port = standins.port()
        standins.launch(self.tree, tmp_path / "work dir", self.port, *SPEC_ARGS)
        H.wait_http(self.port, timeout=30)
        self.env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "client cache"))
        self.env.pop("EAGLEPATCH_DEBUG", None)
        self.logs = tmp_path / "timing logs"

    def run(self, cmd: str, *args: str) -> subprocess.CompletedProcess:
        r = subprocess.run([PY, "-m", "eaglepatch", cmd, str(self.tree / "sglang"), *args], capture_output=True,
                           text=True, timeout=240, env=self.env, cwd=REPO)
        assert r.returncode == 0, (cmd, args, r.stderr[-3000:])
        return r


def readme_commands() -> list[list[str]]:
    """README.md's "Five minutes on a real host": each command's words (``root@gpu-host`` the target)."""
    text = (REPO / "README.md").read_text().split("## Five minutes on a real host", 1)[1].split("```")[1]
    return [line.split("#")[0].split() for line in text.splitlines() if line.startswith("eaglepatch ")]


def test_the_readme_apply_then_bench_prints_no_note_of_a_short_load_or_a_fresh_server(standins, tmp_path):
    """apply, then bench with no option: the load sized by duration (one line says how), at least SIZED_LOAD_S
    long, the freshly restarted server warmed first; neither note, in the text or the JSON."""
    cmds = readme_commands()
    apply_words = next(w for w in cmds if w[1] == "apply")
    bench_words = next(w for w in cmds if w[1] == "bench")
    assert apply_words[3:] == [] and bench_words[3:] == [], (apply_words, bench_words)  # as written: no option
    srv = Newcomer(standins, tmp_path)
    srv.run("apply", "--log-dir", str(srv.logs))  # the shared machine's /tmp/eaglepatch is every user's
    r = srv.run("bench")
    for note in (SHORT, FRESH):
        assert note not in r.stdout + r.stderr, (note, r.stdout, r.stderr)
    sizing = [line for line in r.stderr.splitlines() if "sized by duration" in line]
    assert len(sizing) == 1 and f"until {SIZED_LOAD_S:g} s have passed, 32 at least" in sizing[0], r.stderr
    assert "32 warm-up requests first" in r.stderr, r.stderr
    head = r.stdout.splitlines()[0]
    assert f"sized to run {SIZED_LOAD_S:g} s or more" in head, head
    assert "timing log of the same window" in r.stdout  # the patched server's phases came with it
    doc = json.loads(srv.run("bench", "--json").stdout)
    assert not [n for n in doc["notes"] if SHORT in n or FRESH in n], doc["notes"]
    assert doc["window"]["seconds"] >= SIZED_LOAD_S > SHORT_LOAD_S
    load, cl = doc["load"], doc["client"]
    assert load["min_seconds"] == SIZED_LOAD_S and load["requests"] == cl["requests"] >= 32, (load, cl)
    assert cl["failed"] == 0 and sum(c["requests"] for c in doc["categories"].values()) == cl["requests"]


def test_an_explicit_requests_is_kept_and_a_tiny_one_is_told_it_is_short(standins, tmp_path):
    """``--requests 2``: exactly 2 requests, no sizing (no ``min_seconds``, no sizing line), and the short-load
    note as before."""
    srv = Newcomer(standins, tmp_path)
    r = srv.run("bench", "--requests", "2", "--max-new-tokens", "16", "--log-wait", "0", "--json")
    doc = json.loads(r.stdout)
    assert doc["client"]["requests"] == doc["load"]["requests"] == 2 and "min_seconds" not in doc["load"], doc
    assert "sized by duration" not in r.stderr
    assert any(n.startswith(SHORT) for n in doc["notes"]), doc["notes"]
