"""The nodes of a multi-node server named in one command are acted on as one server (issue 40).

Two nodes of one 2-node stand-in server (``--nnodes 2 --node-rank R --dist-init-addr ADDR --standin-rendezvous``),
each in a tree of its own: node rank 0 listens at ADDR and is ready only once node 1 has joined it; node 1 serves no
HTTP and joins node 0 (retrying); a node whose peer is lost exits 1. Each node is on an SSH host of its own
(multinode.py): node 0 over the real sshd of conftest.py (the ``testbox`` alias), node 1 over a second sshd with a
folder of its own (``testbox1``), each host's tree found through the same ``--python``: two SSH TARGETs, one server.
The patch failure is also run with node 1 named by its local path beside the SSH node 0.

- apply patches both, restarts both together (rank 0 ready, so node 1 joined), restart restarts both, revert puts
  every byte back and restarts both;
- a node 1 that cannot start on the patched files: exit 7, every node rolled back (bytes as before), both servers
  running the original files, rank 0 ready again;
- eaglepatch killed (SIGKILL) at each step of a two-node apply, revert or restart: ``status`` of both tells the
  truth, and ``revert`` of both (or, for a restart, ``restart`` of both) puts every byte back with both servers up,
  as they were launched; a restart of the unpatched server killed with every node stopped starts them from the
  launches it recorded on every node before any stopped, and leaves no record behind.
"""

from __future__ import annotations

import pytest

from multinode import TwoNodes, host1  # noqa: F401 - host1: the fixture
from safety import REJECTS_PATCH, H, identity

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def test_apply_restart_revert_act_on_every_node_together(standins, tmp_path, sshd, host1):
    """Node 0 takes a second to let go of its ports when stopped (--stop-delay), still listening at
    --dist-init-addr meanwhile: a node 1 started before every node had stopped would join that old node 0, and die
    with it. Every node is stopped before any starts, so node 1 joins the new node 0, every time."""
    two = TwoNodes(standins, tmp_path, sshd, host1, node0=("--stop-delay", "1"))
    old = two.up()
    assert two.joined() == 1
    doc = two.run("apply", "--json", "--timeout", "60").expect(0).json()
    assert [d["changed"] for d in doc] == [True, True] and [d["restarted"] for d in doc] == [True, True], doc
    assert all(b"# [eaglepatch]" in two.worker(r) for r in (0, 1))
    new = two.up()
    assert set(new).isdisjoint(old) and not any(H.alive(p) for p in old)
    assert two.joined() == 2, "node 1 did not join the restarted node 0"
    assert [d["servers"][0]["pid"] for d in doc] == new
    status = two.run("status", "--json").expect(0).json()
    assert [{f["state"] for f in s["files"]} for s in status] == [{"patched"}, {"patched"}], status
    assert [[x["code"] for x in s["servers"]] for s in status] == [["current"], ["current"]], status
    assert [s["servers"][0]["nodes"]["rank"] for s in status] == [0, 1]

    r = two.run("restart", "--json", "--timeout", "60").expect(0)
    again = two.up()
    assert set(again).isdisjoint(new) and two.joined() == 3, r

    r = two.run("revert", "--timeout", "60").expect(0)
    assert two.digests() == two.pristine, "revert did not put every byte of every node back"
    final = two.up()
    assert set(final).isdisjoint(again) and two.joined() == 4, r
    assert [identity(p)["argv"] for p in final] == [f["argv"] for f in two.first]


def test_a_node_that_cannot_start_patched_rolls_every_node_back(standins, tmp_path, sshd, host1):
    """Node 1's worker refuses the patch at import: the patched node 1 exits at start, node 0 stops waiting for it
    at once, and every node is put back: its original bytes, its original server, rank 0 ready with node 1 joined."""
    two = TwoNodes(standins, tmp_path, sshd, host1, worker1=H.V1_WORKER + REJECTS_PATCH)
    old = two.up()
    r = two.run("apply", "--timeout", "120")
    assert r.rc == 7, r
    assert r.err.count("original files restored") == 2, r
    assert "exited during startup" in r.err, r
    assert two.digests() == two.pristine, "a node's bytes were not put back"
    now = two.up()
    assert set(now).isdisjoint(old) and two.joined() == 2  # the patched node 0 met no one; the originals met
    assert [identity(p) for p in now] == two.first
    status = two.run("status", "--json").expect(0).json()
    assert [{f["state"] for f in s["files"]} for s in status] == [{"pristine"}, {"pristine"}], status
    assert all(s["lock"] is None for s in status)


@pytest.mark.parametrize("node1", ["ssh", "local"])
def test_a_node_whose_patch_fails_leaves_every_node_unpatched(standins, tmp_path, sshd, host1, node1):
    """All or none: node 1's patch fails on its host (a file stands where its backups would go: the host refuses
    the plan, nothing changed there, exit 1), node 0's went through and is put back; no server was stopped. Node 1
    over SSH, and once named by its local path beside the SSH node 0 (a local and an SSH TARGET in one command)."""
    two = TwoNodes(standins, tmp_path, sshd, host1, node1=node1)
    old = two.up()
    (H.worker_file(two.trees[1]).parent / ".eaglepatch").write_text("in the way\n")
    node1 = two.digests()[1]
    r = two.run("apply", "--timeout", "60")
    assert r.rc == 1, r
    assert "node rank 1 (" in r.err and "the files patched here were put back: nothing was changed" in r.err, r
    assert b"# [eaglepatch]" not in two.worker(0), "node 0's patch was not put back"
    assert two.digests() == [two.pristine[0], node1], "a node's bytes changed"
    assert [p[0] for p in two.pids()] == old, "a server was restarted"
    status = two.run("status", "--json").expect(0).json()
    assert all(s["lock"] is None for s in status), status


BROKEN = H.V1_WORKER + REJECTS_PATCH
# (command, failpoint, node 1's worker, the state of the worker files right after the kill: both the same; None:
# either, per node; what puts the server back then)
KILLS = [
    ("apply", "execute:between-renames", H.V1_WORKER, None, "revert"),  # the hosts' helpers die mid-plan
    ("apply", "apply:after-execute", H.V1_WORKER, "patched", "revert"),  # every node patched, none restarted
    ("apply", "nodes:after-stop", H.V1_WORKER, "patched", "revert"),  # every node patched and stopped, none started
    ("apply", "restart:after-relaunch", H.V1_WORKER, "patched", "revert"),  # a node started, the others maybe
    ("apply", "rollback:before", BROKEN, "patched", "revert"),  # node 1 died at start, nothing rolled back yet
    ("apply", "rollback:after-relaunch", BROKEN, None, "revert"),  # a node's files back and original started
    ("revert", "nodes:after-stop", H.V1_WORKER, "patched", "revert"),  # every node stopped, no file reverted yet
    ("revert", "execute:after-backup", H.V1_WORKER, "patched", "revert"),  # a node's helper dies before any swap
    ("revert", "revert:after-execute", H.V1_WORKER, None, "revert"),  # a node's files back and original started
    # a restart of the unpatched server: every node's launch recorded (in its install), none stopped yet
    ("restart", "nodes:after-record", H.V1_WORKER, "pristine", "revert"),
    # every node stopped, none started: each is started from its record, by revert or by restart
    ("restart", "nodes:after-stop", H.V1_WORKER, "pristine", "revert"),
    ("restart", "nodes:after-stop", H.V1_WORKER, "pristine", "restart"),
]


@pytest.mark.parametrize("command,point,worker1,files,then", KILLS,
                         ids=[f"{k[0]}-{k[1]}" + ("" if k[4] == "revert" else f"-then-{k[4]}") for k in KILLS])
def test_killed_at_each_step_of_a_two_node_apply_revert_or_restart(standins, tmp_path, sshd, host1, command,
                                                                   point, worker1, files, then):
    two = TwoNodes(standins, tmp_path, sshd, host1, worker1=worker1)
    originals = [two.worker(0), two.worker(1)]
    two.up()
    if command == "revert":
        two.run("apply", "--timeout", "60").expect(0)
        two.up()
    r = two.run(command, "--timeout", "60", env={"EAGLEPATCH_FAILPOINT": point})
    assert r.rc == -9, f"eaglepatch was not killed at {point}:\n{r}"
    two.settle()  # the hosts finish what they were asked (another node's request may have been under way)

    status = two.run("status", "--json").expect(0).json()
    for rank, s in enumerate(status):
        now = two.worker(rank)
        truth = "pristine" if now == originals[rank] else "patched" if b"# [eaglepatch]" in now else "other"
        assert truth != "other" and (files is None or truth == files), (rank, truth)
        assert {f["state"] for f in s["files"]} == {truth}, s
        assert sorted(x["pid"] for x in s["servers"]) == two.pids()[rank], s
        assert s["lock"] and s["lock"]["what"] == command, s["lock"]
    if point == "nodes:after-stop":  # every node was stopped: none runs
        assert all(s["servers"] == [] for s in status), status
        # each node recorded and down: apply starts nothing and changes nothing, and says how to start them
        def files() -> list[dict[str, str]]:  # the killed run's lock aside: apply takes it over, as it may
            return [{k: v for k, v in d.items() if not k.endswith(".eaglepatch.lock")} for d in two.digests()]

        before = files()
        r = two.run("apply", "--timeout", "60")
        assert r.rc == 2 and "is recorded in this install's manifest but does not run" in r.err, r
        assert files() == before and two.pids() == [[], []]

    r = two.run(then, "--timeout", "60")
    assert r.rc == 0, r
    assert two.digests() == two.pristine, "revert did not put every byte of every node back"
    now = two.up()
    assert [identity(p) for p in now] == two.first, "the servers running are not the originals, as launched"
    status = two.run("status", "--json").expect(0).json()
    assert all(s["lock"] is None and [x["code"] for x in s["servers"]] == ["current"] for s in status), status
