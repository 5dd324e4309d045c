"""Tensor-parallel ranks count a batch's acceptance once; data-parallel groups add their tokens (docs/contract.md,
"Topologies", issue 40).

Under TP every rank of a server records the same batch (the same ``bs``, ``accepted`` and ``accepts`` at the same
cycle): the acceptance histogram is one rank's, and tok/s (tokens and time both multiplied by the TP size) is the
ratio as over one rank. Ranks of different data-parallel groups (a record's ``"dp"``: --enable-dp-attention, or the
replicas of --dp-size) serve different requests: their histograms add and the server's tok/s is the sum of theirs.
Each case runs through ``aggregate`` and through ``eaglepatch report --json``, with msgspec's batch path and with
the standard library's parser alone.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from eaglepatch import cli
from eaglepatch.report import aggregate, render_table
from eaglepatch.report import scan as scan_mod

from runtime_helpers import Batch, Obj, decode_worker, records

T0 = 1764500000.0
approx = pytest.approx


pytestmark = pytest.mark.usefixtures("both_parsers")  # every test with both parsers (conftest.py)


def stream(seed: int, n: int = 300, cycle_ms: float = 10.0, gap_ms: float = 2.0, bs: int = 4) -> list[dict[str, Any]]:
    """``n`` decode cycles of ``bs`` requests from ``T0`` on, each request's tokens drawn with ``seed``: what every
    TP rank of one DP group records alike."""
    rng = random.Random(seed)
    out = []
    t = T0
    for _ in range(n):
        accepts = [rng.choice((1, 1, 2, 2, 3, 4)) for _ in range(bs)]
        out.append({"v": 1, "t": round(t, 6), "run": "r1", "worker": "EAGLEWorker", "mode": "decode", "bs": bs,
                    "cycle_ms": cycle_ms, "timer": "sync",
                    "phases": {"draft": cycle_ms * 0.3, "verify": cycle_ms * 0.6, "draft_extend": cycle_ms * 0.1},
                    "accepted": sum(accepts), "accepts": accepts})
        t += (cycle_ms + gap_ms) / 1000.0
    return out


def write(folder: Path, recs: list[dict[str, Any]], rank: int, pid: int, dp: int | None = None,
          node: int | None = None, host: str = "gpu1") -> str:
    """One rank's log, ``<host>-<pid>-rank<r>.jsonl``: the records with this rank's fields (in the runtime's
    order: host, pid, rank, dp, node first)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{host}-{pid}-rank{rank}.jsonl"
    who: dict[str, Any] = {"host": host, "pid": pid, "rank": rank}
    if dp is not None:
        who["dp"] = dp
    if node is not None:
        who["node"] = node
    lines = []
    for r in recs:
        d = {"v": r["v"], "t": r["t"], **who, **{k: v for k, v in r.items() if k not in ("v", "t")}}
        lines.append(json.dumps(d))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def decode(files: list[str], **kw: Any) -> Any:
    (g,) = [g for g in aggregate(files, **kw).groups if g.mode == "decode"]
    return g


def cli_decode(files: list[str], *extra: str) -> dict[str, Any]:
    res = CliRunner().invoke(cli.app, ["report", *files, "--json", *extra])
    assert res.exit_code == 0, res.output
    (g,) = [g for g in json.loads(res.stdout)["groups"] if g["mode"] == "decode"]
    return g


def test_two_tp_ranks_count_the_batch_once(tmp_path: Path) -> None:
    """Two TP ranks record the same 300 cycles of 4 requests: 1,200 request-cycles, not 2,400; the accept length and
    both tok/s are those of one rank."""
    recs = stream(1)
    one = write(tmp_path / "one", recs, rank=0, pid=100)
    both = [write(tmp_path / "tp", recs, rank=r, pid=100 + r) for r in (0, 1)]
    alone, g = decode([one]), decode(both)
    assert alone.acceptance.samples == 1200
    assert g.acceptance.samples == 1200  # today's code: 2400
    assert g.acceptance.hist == alone.acceptance.hist
    assert g.accept_len == approx(alone.accept_len)
    assert g.tokens_per_s == approx(alone.tokens_per_s)
    assert g.wall_tokens_per_s == approx(alone.wall_tokens_per_s)
    assert (g.ranks, g.tp, g.dp) == (2, 2, 1)
    j = cli_decode(both)
    assert j["acceptance"]["samples"] == 1200
    assert j["acceptance"]["at_least"] == cli_decode([one])["acceptance"]["at_least"]
    assert j["tokens_per_s"] == approx(alone.tokens_per_s, rel=1e-4)
    assert j["wall_tokens_per_s"] == approx(alone.wall_tokens_per_s, rel=1e-4)


def test_two_dp_ranks_add_their_requests_and_tokens(tmp_path: Path) -> None:
    """Two DP groups of one rank each (--enable-dp-attention, TP 2 DP 2) serve different requests over the same
    time span, at different speeds: their request-cycles add (1,200 + 1,200) and the server's tok/s is the sum of
    each alone, not their average."""
    a, b = stream(1), stream(2, cycle_ms=14.0, gap_ms=1.0, n=257)
    fa = write(tmp_path / "dp", a, rank=0, pid=100, dp=0)
    fb = write(tmp_path / "dp", b, rank=1, pid=101, dp=1)
    ga, gb, g = decode([fa]), decode([fb]), decode([fa, fb])
    assert g.acceptance.samples == ga.acceptance.samples + gb.acceptance.samples == 1200 + 1028
    assert g.tokens_per_s == approx(ga.tokens_per_s + gb.tokens_per_s)  # today's code: their blend
    assert g.wall_tokens_per_s == approx(ga.wall_tokens_per_s + gb.wall_tokens_per_s)
    tokens = sum(r["accepted"] for r in a + b)
    assert g.accept_len == approx(tokens / (4 * (300 + 257)))
    assert (g.ranks, g.tp, g.dp) == (2, 1, 2)
    j = cli_decode([fa, fb])
    assert j["acceptance"]["samples"] == 2228
    assert j["tokens_per_s"] == approx(ga.tokens_per_s + gb.tokens_per_s, rel=1e-4)
    assert j["wall_tokens_per_s"] == approx(ga.wall_tokens_per_s + gb.wall_tokens_per_s, rel=1e-4)


def test_replicas_of_dp_size_rank_0_each_add_too(tmp_path: Path) -> None:
    """--dp-size 2 without DP attention: two replicas, each a world of its own, so both write rank 0 (other pids);
    their "dp" tells them apart."""
    a, b = stream(3), stream(4, cycle_ms=8.0)
    fa = write(tmp_path / "rep", a, rank=0, pid=100, dp=0)
    fb = write(tmp_path / "rep", b, rank=0, pid=200, dp=1)
    ga, gb, g = decode([fa]), decode([fb]), decode([fa, fb])
    assert g.acceptance.samples == 2400
    assert g.tokens_per_s == approx(ga.tokens_per_s + gb.tokens_per_s)
    assert (g.ranks, g.tp, g.dp) == (2, 1, 2)


def tp2_dp2(folder: Path) -> tuple[list[str], list[str], list[str]]:
    """TP 2 x DP 2: ranks 0 and 1 record DP group 0's cycles, ranks 2 and 3 DP group 1's (other requests, slower)."""
    a, b = stream(5), stream(6, cycle_ms=13.0, n=280)
    fa = [write(folder, a, rank=r, pid=100 + r, dp=0) for r in (0, 1)]
    fb = [write(folder, b, rank=r, pid=100 + r, dp=1) for r in (2, 3)]
    return fa, fb, fa + fb


def test_tp2_by_dp2_counts_once_per_dp_group_and_adds_the_groups(tmp_path: Path) -> None:
    """Four ranks: each DP group's acceptance from one of its two TP ranks, the two groups' added (1,200 + 1,120);
    tok/s the sum of each DP group's (each as over one rank); the text says 4 ranks (TP 2 x DP 2)."""
    fa, fb, every = tp2_dp2(tmp_path / "tpdp")
    ga, gb, g = decode(fa[:1]), decode(fb[:1]), decode(every)
    assert g.acceptance.samples == ga.acceptance.samples + gb.acceptance.samples == 1200 + 1120  # today: 4640
    assert g.tokens_per_s == approx(ga.tokens_per_s + gb.tokens_per_s)
    assert g.wall_tokens_per_s == approx(ga.wall_tokens_per_s + gb.wall_tokens_per_s)
    assert (g.ranks, g.tp, g.dp) == (4, 2, 2)
    j = cli_decode(every)
    assert j["acceptance"]["samples"] == 2320
    assert j["tokens_per_s"] == approx(ga.tokens_per_s + gb.tokens_per_s, rel=1e-4)
    res = CliRunner().invoke(cli.app, ["report", *every])
    assert res.exit_code == 0, res.output
    assert "4 ranks (TP 2 x DP 2)" in res.stdout
    assert "acceptance (2320 request-cycles)" in res.stdout


def test_by_bs_and_merged_runs_count_tp_once(tmp_path: Path) -> None:
    """--by bs: each batch size's group counts its request-cycles once. Two launches (runs) of TP 2 merged: each
    run's histogram once, the two runs' added."""
    fa, fb, every = tp2_dp2(tmp_path / "tpdp")
    (g,) = [g for g in aggregate(every, by="bs").groups if g.mode == "decode"]
    assert g.acceptance.samples == 2320
    first = [write(tmp_path / "r1", stream(7), rank=r, pid=100 + r) for r in (0, 1)]
    later = [dict(x, run="r2", t=x["t"] + 100.0) for x in stream(8, n=100)]
    second = [write(tmp_path / "r2", later, rank=r, pid=300 + r) for r in (0, 1)]
    res = aggregate(first + second, merge_runs=True)
    (g,) = res.groups
    assert res.merged and g.acceptance.samples == 1200 + 400
    j = cli_decode(first + second, "--merge-runs")
    assert j["acceptance"]["samples"] == 1600


def test_the_rank_with_the_most_counts_stands_for_its_tp_group(tmp_path: Path) -> None:
    """A TP rank whose log lost its first 100 records (rotated away): the other rank's full histogram is read."""
    recs = stream(9)
    files = [write(tmp_path / "lost", recs[100:], rank=0, pid=100), write(tmp_path / "lost", recs, rank=1, pid=101)]
    assert decode(files).acceptance.samples == 1200


def test_by_rank_shows_node_and_rank(tmp_path: Path) -> None:
    """A two-node server (TP 4 over 2 nodes): records carry "node"; --by rank keys each group by node and rank."""
    recs = stream(10, n=60)
    files = [write(tmp_path / f"n{node}", [dict(r, run=f"r{node}") for r in recs], rank=rank, pid=100 + rank,
                   node=node, host=f"gpu{node}")
             for node, rank in ((0, 0), (0, 1), (1, 2), (1, 3))]
    res = aggregate(files, by="rank", merge_runs=True)
    keys = [g.key for g in res.groups]
    assert keys == [(("node", 0), ("rank", 0)), (("node", 0), ("rank", 1)), (("node", 1), ("rank", 2)),
                    (("node", 1), ("rank", 3))]
    assert "node=1 rank=2" in render_table(res)
    doc = json.loads(CliRunner().invoke(cli.app, ["report", *files, "--json", "--by", "rank", "--merge-runs"]).stdout)
    assert [g["key"] for g in doc["groups"]][2] == {"node": 1, "rank": 2}
    # without --by: the four ranks of one batch (no "dp": one DP group) count it once
    assert decode(files, merge_runs=True).acceptance.samples == 240


@pytest.mark.parametrize("kw", [{}, {"by": "bs"}, {"by": "rank"}, {"skip": 7}, {"merge_runs": True}])
def test_the_batch_path_gives_the_line_loops_result(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   kw: dict[str, Any]) -> None:
    """Records with "dp" and "node" through msgspec's batch path and the line loop: the same result."""
    _fa, _fb, every = tp2_dp2(tmp_path / "tpdp")
    extra = write(tmp_path / "node", stream(11, n=50), rank=4, pid=104, dp=1, node=1)
    files = every + [extra]
    want = repr(aggregate(files, **kw))
    with monkeypatch.context() as m:
        m.setattr(scan_mod, "Batches", lambda st: None)
        assert repr(aggregate(files, **kw)) == want


@pytest.mark.parametrize("value", ["-1", "1.5", "true", '"0"', "1e400"])
def test_a_bad_dp_or_node_is_a_skipped_line(tmp_path: Path, value: str) -> None:
    recs = stream(12, n=20)
    f = write(tmp_path / "bad", recs, rank=0, pid=100, dp=0)
    lines = Path(f).read_text().splitlines()
    lines[5] = lines[5].replace('"dp": 0', f'"dp": {value}')
    lines[9] = lines[9].replace('"dp": 0', f'"dp": 0, "node": {value}')
    Path(f).write_text("\n".join(lines) + "\n")
    res = aggregate([f])
    assert res.skipped_lines == 2 and res.groups[0].n == 18


# ----------------------------------------------------------------------------------------------------------------
# The runtime: "dp" and "node" in the records


def _proc(tmp_path: Path, title: str) -> str:
    root = tmp_path / "proc"
    d = root / str(os.getpid())
    d.mkdir(parents=True)
    (d / "cmdline").write_bytes(title.encode() + b"\0")
    return str(root)


LAUNCH = ["python3", "-m", "sglang.launch_server", "--model-path", "m", "--tp-size", "4"]


@pytest.mark.parametrize("title, argv, rank, want", [
    ("sglang::scheduler_DP1_TP0", LAUNCH + ["--dp-size", "2"], 0, '"dp": 1, '),
    ("sglang::scheduler_TP3", LAUNCH + ["--dp-size", "2", "--enable-dp-attention"], 3, '"dp": 1, '),
    ("sglang::scheduler_TP1", LAUNCH + ["--dp", "2", "--enable-dp-attention"], 5, '"dp": 0, '),  # PP rank 1
    ("sglang::scheduler_TP1", LAUNCH, 1, ""),
    ("sglang::scheduler_TP1", LAUNCH + ["--nnodes", "2", "--node-rank", "1"], 1, '"node": 1, '),
    ("sglang::scheduler_DP0_TP1", LAUNCH + ["--nnodes=2", "--node-rank=0", "--dp-size=2"], 1, '"dp": 0, "node": 0, '),
])
def test_the_runtime_knows_its_dp_group_and_node(load, tmp_path: Path, title: str, argv: list[str], rank: int,
                                                 want: str) -> None:
    """sglang's process title names a replica's DP rank; under --enable-dp-attention the attention DP group is the
    TP rank over tp-size / dp-size; the node rank comes from --node-rank of a server of several nodes."""
    rt = load()
    rt._PROC = _proc(tmp_path, title)
    rt._run = ("r", {"argv": argv})
    assert rt._parallel_fields(rank) == want


def test_records_carry_dp_and_the_report_reads_it(load, tmp_path: Path) -> None:
    rt = load()
    rt._PROC = _proc(tmp_path, "sglang::scheduler_DP1_TP0")
    rt._run = ("r-1-2-00000000", {"argv": LAUNCH + ["--dp-size", "2"], "timer": "cpu", "flags": {}})
    w = decode_worker(rt, out=Obj(accept_lens=[2, 3]))
    for _ in range(3):
        w.forward_batch_generation(Batch(2))
    rt.flush()
    recs = records(tmp_path / "logs")
    assert [r.get("dp") for r in recs] == [1, 1, 1] and "node" not in recs[0]
    g = decode(sorted(str(p) for p in (tmp_path / "logs").glob("*.jsonl")))
    assert g.acceptance.samples == 6 and (g.ranks, g.dp) == (1, 1)
