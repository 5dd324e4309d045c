"""Multi-node servers read from their command line, and the refusal to restart one node alone
(eaglepatch.ops.nodes); the CLI end to end is tests/e2e/test_multinode_refusal.py."""

from __future__ import annotations

import threading
import time

import pytest

from eaglepatch.errors import Unsupported, UsageError
from eaglepatch.hosts.spec import SSHOptions
from eaglepatch.hosts.target import parse_target
from eaglepatch.ops import nodes
from eaglepatch.server.process import Nodes, ServerProcess, nodes_of


def server(pid: int, *args: str) -> ServerProcess:
    argv = ["python3", "-m", "sglang.launch_server", "--port", "30000", *args]
    return ServerProcess.from_scan({"pid": pid, "argv": argv, "args_index": 3})


@pytest.mark.parametrize("args, want", [
    ((), None),
    (("--nnodes", "1"), None),
    (("--nnodes", "two"), None),  # sglang refuses it at start: not a multi-node server
    (("--nnodes", "2"), Nodes(2, 0, None)),  # --node-rank defaults to 0, as in sglang
    (("--nnodes", "4", "--node-rank", "3", "--dist-init-addr", "10.0.0.1:5000"), Nodes(4, 3, "10.0.0.1:5000")),
    (("--nnodes=2", "--node-rank=1", "--nccl-init-addr=h:1"), Nodes(2, 1, "h:1")),  # sglang's older alias
])
def test_nodes_read_from_sglang_arguments(args, want):
    assert nodes_of(list(args)) == want


def test_status_json_says_which_node():
    s = server(1, "--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "h:5")
    assert s.to_json()["nodes"] == {"count": 2, "rank": 1, "dist_init_addr": "h:5"}
    assert "nodes" not in server(2).to_json()


def test_a_missing_node_is_a_usage_error_naming_each_missing_rank():
    n0 = server(10, "--nnodes", "4", "--node-rank", "0", "--dist-init-addr", "h:5")
    n2 = server(12, "--nnodes", "4", "--node-rank", "2", "--dist-init-addr", "h:5")
    other1 = server(21, "--nnodes", "4", "--node-rank", "1", "--dist-init-addr", "elsewhere:5")
    with pytest.raises(UsageError) as e:
        nodes.check([n0], [n0, n2, other1], "apply", "gpu1")
    msg = str(e.value)
    assert "node rank 0 of a 4-node server (--dist-init-addr h:5)" in msg
    assert "without node ranks 1, 3," in msg  # rank 1 of another server does not count
    assert "eaglepatch apply NODE0 NODE1" in msg and "--no-restart" in msg


def test_every_node_named_is_not_restarted_yet_and_single_nodes_pass():
    group = [server(10 + r, "--nnodes", "2", "--node-rank", str(r), "--dist-init-addr", "h:5") for r in range(2)]
    with pytest.raises(Unsupported, match="not supported yet"):
        nodes.check(group[1:], group, "restart", "gpu2")
    nodes.check([server(1)], group, "restart", "gpu3")  # a single-node server is never held back
    nodes.check([], group, "restart", "gpu3")


def test_sweep_says_it_takes_one_target():
    n0 = server(10, "--nnodes", "2")
    with pytest.raises(UsageError, match="sweep takes one TARGET"):
        nodes.check([n0], [n0], "sweep", "gpu1", several=False)


def spec(text: str):
    return parse_target(text, SSHOptions())


def test_a_meeting_waits_for_every_target_and_a_target_that_ends_early_releases_it():
    """Each TARGET's servers are seen by all once each has arrived or ended; one that fails before arriving
    (leave) does not hold the others."""
    a, b, c = spec("gpu1"), spec("gpu2"), spec("gpu3")
    meeting = nodes.Meeting(["gpu1", "gpu2", "gpu3"])
    seen: dict[str, list[int]] = {}

    def go(s, servers):
        seen[s.text] = sorted(x.pid for x in meeting.arrive(s, servers))

    ta = threading.Thread(target=go, args=(a, [server(1)]))
    ta.start()
    time.sleep(0.2)
    assert "gpu1" not in seen  # waits for gpu2 and gpu3
    tb = threading.Thread(target=go, args=(b, [server(2)]))
    tb.start()
    time.sleep(0.2)
    assert not seen
    meeting.leave("gpu3")  # gpu3 ended without arriving (its connection failed)
    ta.join(5)
    tb.join(5)
    assert seen == {"gpu1": [1, 2], "gpu2": [1, 2]}
    meeting.leave("gpu1")  # a second end of an arrived TARGET changes nothing
    assert nodes.alone(c).arrive(c, [server(3)])[0].pid == 3


def test_one_side_of_a_prefill_decode_pair_is_never_restarted_alone():
    """--disaggregation-mode prefill|decode: status says which side; a restart of one side exits 2 naming the other
    unless the command names a server of the other side too; a one-TARGET command (sweep) always refuses; sglang's
    'null' mode is no pair."""
    from eaglepatch.server.process import disaggregation_of

    assert [disaggregation_of(a) for a in ((), ("--disaggregation-mode", "null"), ("--disaggregation-mode=decode",),
                                            ("--disaggregation-mode", "prefill"))] == [None, None, "decode", "prefill"]
    pre = server(10, "--disaggregation-mode", "prefill")
    dec = server(20, "--disaggregation-mode", "decode")
    assert pre.to_json()["disaggregation"] == "prefill" and "disaggregation" not in server(30).to_json()
    with pytest.raises(UsageError) as e:
        nodes.check([dec], [dec], "apply", "gpu2")
    assert str(e.value) == (
        "gpu2: the server on :30000 (pid 20) is the decode side of a prefill/decode pair (--disaggregation-mode "
        "decode): apply would restart it without its prefill side, and requests through the pair would fail "
        "meanwhile; nothing was changed: name the prefill server's host in the same command (eaglepatch apply "
        "PREFILL DECODE), or pass --no-restart")
    nodes.check([dec], [pre, dec], "apply", "gpu2")  # both named: on
    nodes.check([pre], [pre, dec], "revert", "gpu1")
    with pytest.raises(UsageError, match="sweep takes one TARGET"):
        nodes.check([pre], [pre, dec], "sweep", "gpu1", several=False)
    nodes.check([server(30)], [server(30)], "sweep", "gpu1", several=False)  # no pair: nothing to refuse
