"""A restart sweep across the nodes of a multi-node server (issue 40: "sweep ... work[s] across the nodes").

Two nodes of one 2-node stand-in server (multinode.py: node rank 0 on the ``testbox`` sshd, node rank 1 on a second
sshd, ``--standin-rendezvous``: node 0 is ready only once node 1 has joined it, and a node whose peer is lost exits),
patched by one apply naming both. ``sweep NODE0 NODE1 --grid`` restarts both nodes together into each point (each
with the point's flags), benches through node rank 0, and puts both back; a kill of eaglepatch after a run, and with
every node stopped, leaves a sweep that the same command resumes, both nodes back as they were launched.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from multinode import TwoNodes, host1  # noqa: F401 - host1: the fixture
from safety import H, identity

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

SPEC = ("--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "4")
SWEEP = ("sweep", "--grid", "speculative-num-steps=1,2", "--requests", "4", "--concurrency", "2",
         "--max-new-tokens", "8", "--warmup", "0", "--timeout", "60", "--json")


def launched_steps(two: TwoNodes, rank: int) -> list[int]:
    """The --speculative-num-steps of every launch of node ``rank``'s server, in order (its log, appended to by
    each relaunch)."""
    log = two.tmp / f"node{rank} work" / f"stand-in-{two.ports[rank]}.log"
    out = []
    for m in re.finditer(r"starting pid=\d+ .* argv=(\[.*\])$", log.read_text(errors="replace"), re.M):
        argv = eval(m.group(1), {})  # noqa: S307 - the stand-in's own repr of its sys.argv
        out.append(int(argv[argv.index("--speculative-num-steps") + 1]))
    return out


def state_lines(doc: dict) -> list[dict]:
    return [json.loads(line) for line in Path(doc["state_file"]).read_text().splitlines() if line.strip()]


def test_a_sweep_restarts_every_node_together_per_point_and_puts_both_back(standins, tmp_path, sshd, host1):
    two = TwoNodes(standins, tmp_path, sshd, host1, extra=SPEC)
    two.run("apply", "--timeout", "60").expect(0)
    before = two.up()
    patched = two.digests()
    steps0 = [launched_steps(two, r) for r in (0, 1)]
    assert steps0 == [[3, 3], [3, 3]], steps0  # the launch, then apply's restart

    r = two.run(*SWEEP).expect(0)
    doc = r.json()
    assert doc["target"] == two.targets[0] and doc["nodes"] == two.targets, doc
    assert [(p["flags"], p["status"]) for p in doc["points"]] == [
        ({"speculative-num-steps": "1"}, "ok"), ({"speculative-num-steps": "2"}, "ok")], doc["points"]
    # node rank 0 is patched: the load's records come back with accept lengths and phase times
    assert all(p["accept_len"] is not None and "cycle" in p["phases_p50"] for p in doc["points"]), doc["points"]
    assert doc["restore"]["ready"] is True and doc["restore"]["restarted"] is True, doc["restore"]
    # each node ran each point (its own flags changed), then its original command line
    for rank in (0, 1):
        ran = launched_steps(two, rank)[2:]
        assert sorted(ran[:2]) == [1, 2] and ran[2:] == [3], (rank, ran)
    assert two.joined() == 2 + 2 + 1, "node 1 did not join node 0 at every launch"
    after = two.up()
    assert set(after).isdisjoint(before) and not any(H.alive(p) for p in before)
    assert [identity(p)["argv"] for p in after] == [f["argv"] for f in two.first]
    assert two.digests() == patched, "the sweep changed a file"
    lines = state_lines(doc)
    assert lines[0]["kind"] == "sweep" and [n["rank"] for n in lines[0]["nodes"]] == [0, 1], lines[0]
    launches = [ln for ln in lines if ln["kind"] == "launch"]
    assert sorted(ln["port"] for ln in launches) == sorted(two.ports * 2), launches
    assert not any((H.worker_file(t).parent / ".eaglepatch.lock").exists() for t in two.trees)

    # the same sweep again, the nodes named the other way round: complete, nothing started
    two.targets.reverse()
    again = two.run(*SWEEP).expect(0)
    two.targets.reverse()
    assert "this sweep is complete" in again.err and two.up() == after, again
    assert again.json()["nodes"] == two.targets  # in node-rank order, as saved

    # sweep --live does not run across nodes yet: refused before anything is read
    live = two.run("sweep", "--live", "--grid", "speculative-num-steps=0,1").expect(2)
    assert "sweep --live takes one TARGET" in live.err, live
    assert two.up() == after


@pytest.mark.parametrize("where", ["sweep:after-run", "nodes:after-stop"])
def test_a_killed_sweep_across_nodes_resumes_and_puts_both_back(standins, tmp_path, sshd, host1, where):
    """SIGKILL after the first run (both nodes run a point's command line), or with every node stopped for a run
    (none runs): the same sweep again resumes, measures what is left, and puts both nodes back as launched."""
    two = TwoNodes(standins, tmp_path, sshd, host1, extra=SPEC)
    killed = two.run(*SWEEP, "--fresh", env={"EAGLEPATCH_FAILPOINT": where})  # the state of an earlier test gone
    assert killed.rc == -9, killed
    two.settle()
    pids = two.pids()
    if where == "nodes:after-stop":
        assert pids == [[], []], f"a node runs with the other stopped: {pids}"
    else:
        assert all(len(p) == 1 for p in pids), pids
    r = two.run(*SWEEP).expect(0)
    doc = r.json()
    assert "resuming" in r.err or where == "nodes:after-stop", r.err
    assert [p["status"] for p in doc["points"]] == ["ok", "ok"], doc["points"]
    assert doc["restore"]["ready"] is True, doc["restore"]
    final = two.up()
    assert [identity(p)["argv"] for p in final] == [f["argv"] for f in two.first], shlex.join(
        identity(final[0])["argv"])
    assert two.digests() == two.pristine


def test_a_point_that_does_not_come_up_is_failed_and_no_node_of_it_is_left_running(standins, tmp_path, sshd, host1):
    """17 steps: the stand-in refuses them at start (exit 1, as sglang does a bad flag), on every node. The point is
    saved as failed with the node that said so, the sweep goes on (the next launch starts every node from nothing
    running), and at the end both nodes run their original command lines, one server each, node 1 joined to node
    0."""
    two = TwoNodes(standins, tmp_path, sshd, host1, extra=SPEC)
    r = two.run("sweep", "--grid", "speculative-num-steps=2,17", "--requests", "4", "--concurrency", "2",
                "--max-new-tokens", "8", "--warmup", "0", "--timeout", "30", "--json", "--fresh").expect(0)
    doc = r.json()
    by = {p["flags"]["speculative-num-steps"]: p for p in doc["points"]}
    assert by["2"]["status"] == "ok" and by["17"]["status"] == "failed", doc["points"]
    assert "node rank" in by["17"]["error"], by["17"]
    assert doc["restore"]["ready"] is True, doc["restore"]
    final = two.up()  # one launcher per node, node 1 joined node 0
    assert [identity(p)["argv"] for p in final] == [f["argv"] for f in two.first]
    assert sorted(launched_steps(two, 1)[1:]) == [2, 3, 17], launched_steps(two, 1)
    assert two.digests() == two.pristine
