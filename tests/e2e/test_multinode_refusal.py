"""One node of a multi-node server (``--nnodes 2 --node-rank R --dist-init-addr ADDR``) is never restarted alone.

Stopping one node takes the whole server down (the others hang at the rendezvous or die), so every command that
would restart such a server refuses, before anything changes, unless every node is named: exit 2 naming the
missing node rank, the worker files' bytes and the server's pid as they were. ``--no-restart`` still patches and
reverts the files. With every node named, the nodes restart together: tests/e2e/test_multinode_restart.py.

Over the real sshd of conftest.py; the stand-in sglang (tests/stubs/stand_in_sglang) accepts the multi-node flags
as it accepts any flag it does not know.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from safety import H  # the stand-in's harness, loaded once for the e2e suite

from cli_helpers import LocalVia, SSHVia

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


ADDR = "127.0.0.1:29731"


def digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


def node(standins, tmp_path: Path, rank: int, *extra: str):
    """A stand-in launched as node ``rank`` of a 2-node server, in a tree of its own; (tree, port, process)."""
    tree = H.make_tree(tmp_path / f"node{rank} site", H.V1_WORKER)
    H.add_adaptive(tree / "sglang")  # sglang 0.5.16's adaptive files: what a live sweep needs
    port = standins.port()
    proc = standins.launch(tree, tmp_path / f"node{rank} work", port, "--nnodes", "2", "--node-rank", str(rank),
                           "--dist-init-addr", ADDR, *extra)
    H.wait_http(port, timeout=30)
    return tree, port, proc


@pytest.fixture
def ssh(sshd, ssh_home, tmp_path: Path) -> SSHVia:
    return SSHVia(sshd, tmp_path)


def test_one_node_named_alone_is_never_restarted(standins, tmp_path, ssh):
    """apply, restart, sweep and sweep --live on node rank 0 alone (and revert once there is something to revert):
    exit 2, one line naming node rank 1 and how to add it; no byte and no process changed. status --json says
    which node it is. (A revert with nothing to revert restarts nothing, so it has nothing to refuse.)"""
    tree, port, proc = node(standins, tmp_path, 0)
    before = digest(tree)

    doc = ssh.run("status", "--json", target=tree).expect(0).json()
    assert doc["server"]["pid"] == proc.pid
    assert doc["server"]["nodes"] == {"count": 2, "rank": 0, "dist_init_addr": ADDR}
    text = ssh.run("status", target=tree).expect(0).out
    assert f"node rank 0 of 2 (--dist-init-addr {ADDR})" in text

    for cmd, args in (("apply", ("--timeout", "30")), ("restart", ("--timeout", "30")),
                      ("apply", ("--restart-cmd", "true")),
                      ("sweep", ("--grid", "speculative-num-steps=1,2"))):
        r = ssh.run(cmd, *args, target=tree).expect(2)
        line = r.error_line()
        assert "node rank 0 of a 2-node server" in line and "without node rank 1," in line, r
        assert "nothing was changed" in line, r
        if cmd != "sweep":
            assert f"eaglepatch {cmd} NODE0 NODE1" in line and "--no-restart" in line, r
        assert digest(tree) == before, f"{cmd} changed the tree"
        assert H.alive(proc.pid), f"{cmd} stopped the server"
        assert ssh.run("status", "--json", target=tree).expect(0).json()["server"]["pid"] == proc.pid

    # the files alone: patched and reverted, the server untouched
    doc = ssh.run("apply", "--no-restart", "--json", target=tree).expect(0).json()
    assert doc["changed"] is True and doc["restarted"] is False
    patched = digest(tree)
    # a live sweep (it needs the patch) and a revert with its restart: refused, the tree still patched
    for cmd, args in (("sweep", ("--live", "--grid", "speculative-num-steps=0,1")), ("revert", ())):
        r = ssh.run(cmd, *args, target=tree).expect(2)
        assert "without node rank 1," in r.error_line(), r
        assert digest(tree) == patched and H.alive(proc.pid)
    ssh.run("revert", "--no-restart", target=tree).expect(0)
    assert digest(tree) == before and H.alive(proc.pid)


def test_nodes_of_two_servers_are_not_one_server(standins, tmp_path):
    """A node 1 named beside another 2-node server's node 0 (another --dist-init-addr; two installs, as two local
    TARGETs: the same code path as SSH, whose options would apply to every TARGET): each misses a node, exit 2, no
    byte and no process changed."""
    tree1, _, proc1 = node(standins, tmp_path, 1)
    before1 = digest(tree1)
    local = LocalVia(tmp_path)
    # node 1 named with another 2-node server's node 0 (another --dist-init-addr): rank 1 of that one is missing
    other = H.make_tree(tmp_path / "other site", H.V1_WORKER)
    oport = standins.port()
    standins.launch(other, tmp_path / "other work", oport, "--nnodes", "2", "--node-rank", "0",
                    "--dist-init-addr", "127.0.0.1:29732")
    H.wait_http(oport, timeout=30)
    r = local.run("restart", "--timeout", "30", str(other / "sglang"), str(tree1 / "sglang"), target=None)
    assert r.rc == 2, r
    assert "without node rank 1," in r.err and "without node rank 0," in r.err, r
    assert H.alive(proc1.pid) and digest(tree1) == before1


def test_a_single_node_server_restarts_as_before(standins, tmp_path):
    """--nnodes 1 is one node: apply restarts it (the refusal reads the flags, not their presence)."""
    tree = H.make_tree(tmp_path / "site", H.V1_WORKER)
    port = standins.port()
    proc = standins.launch(tree, tmp_path / "work", port, "--nnodes", "1", "--node-rank", "0")
    H.wait_http(port, timeout=30)
    local = LocalVia(tmp_path)
    doc = local.run("apply", "--json", "--timeout", "60", target=tree / "sglang").expect(0).json()
    assert doc["restarted"] is True
    assert json.loads(local.run("status", "--json", target=tree / "sglang").expect(0).out)["server"]["pid"] != proc.pid
    local.run("revert", "--timeout", "60", target=tree / "sglang").expect(0)
