"""Multi-node servers read from their command line, the refusal to restart one node alone, and the nodes of one
server acting as one (eaglepatch.ops.nodes: groups, steps every node reaches, the server's verdict); the CLI end to
end is tests/e2e/test_multinode_refusal.py and tests/e2e/test_multinode_restart.py."""

from __future__ import annotations

import dataclasses
import threading
import time
import types

import pytest

from eaglepatch.errors import Unsupported, UsageError
from eaglepatch.hosts.spec import SSHOptions
from eaglepatch.hosts.target import parse_target
from eaglepatch.ops import nodes
from eaglepatch.ops.facts import HostFacts
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


def test_every_node_named_passes_the_check_and_single_nodes_are_never_held_back():
    group = [server(10 + r, "--nnodes", "2", "--node-rank", str(r), "--dist-init-addr", "h:5") for r in range(2)]
    nodes.check(group[1:], group, "restart", "gpu2")  # every node named: they restart together (NodeGroup)
    nodes.check([server(1)], group, "restart", "gpu3")  # a single-node server is never held back
    nodes.check([], group, "restart", "gpu3")


def test_a_recorded_node_that_no_longer_runs_counts_as_named():
    """A node apply recorded (the manifest's launch spec) whose server is gone (a kill between a stop and a start)
    is named by its TARGET: revert and restart start it with the others."""
    n0 = server(10, "--nnodes", "2", "--node-rank", "0", "--dist-init-addr", "h:5")
    launch = {"argv": ["python3", "-m", "sglang.launch_server", "--port", "30001", "--nnodes", "2", "--node-rank",
                       "1", "--dist-init-addr", "h:5"], "cwd": "/", "env": {}, "port": 30001}
    rec = nodes.Recorded.of({"pid": 11, "start": 5, "port": 30001, "launch": launch})
    assert rec is not None and rec.nodes == Nodes(2, 1, "h:5") and rec.port == 30001
    assert nodes.Recorded.of({"pid": 12, "port": 1, "launch": None}) is None  # a systemd unit: no spec
    nodes.check([n0], [n0, rec], "revert", "gpu1")
    with pytest.raises(UsageError, match="without node rank 1,"):
        nodes.check([n0], [n0], "revert", "gpu1")


def two_nodes(addr: str = "h:5") -> list[ServerProcess]:
    return [server(10 + r, "--nnodes", "2", "--node-rank", str(r), "--dist-init-addr", addr) for r in range(2)]


def met(targets: list[str], servers: dict[str, list[ServerProcess]]) -> nodes.Meeting:
    """A meeting every TARGET of ``servers`` has arrived at (on threads, as the command runs them)."""
    meeting = nodes.Meeting(targets)
    threads = [threading.Thread(target=meeting.arrive, args=(spec(t), s)) for t, s in servers.items()]
    for th in threads:
        th.start()
    for th in threads:
        th.join(5)
    return meeting


def test_the_targets_that_run_the_nodes_of_one_server_form_one_group():
    n0, n1 = two_nodes()
    m0, m1 = two_nodes("elsewhere:5")
    meeting = met(["gpu1", "gpu2", "gpu3", "gpu4", "gpu5"],
                  {"gpu1": [n0], "gpu2": [n1], "gpu3": [m0], "gpu4": [m1], "gpu5": [server(30)]})
    g = meeting.group(spec("gpu2"), [n1])
    assert g is meeting.group(spec("gpu1"), [n0])  # one group, shared
    assert g.members == {"gpu1": n0, "gpu2": n1} and [g.rank("gpu1"), g.rank("gpu2")] == [0, 1]
    assert meeting.group(spec("gpu3"), [m0]).members == {"gpu3": m0, "gpu4": m1}  # another server, another group
    assert meeting.group(spec("gpu5"), [server(30)]) is None  # a server of one node acts alone, as before
    with pytest.raises(Unsupported, match="--server-port PORT"):  # a node and another server in one TARGET
        meeting.group(spec("gpu1"), [n0, server(31)])


def on_threads(fns: dict[str, object]) -> dict[str, object]:
    """Run each member's part on its own thread (as each TARGET runs); what each returned or raised."""
    out: dict[str, object] = {}

    def run(name, fn):
        try:
            out[name] = fn()
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            out[name] = exc

    threads = [threading.Thread(target=run, args=item) for item in fns.items()]
    for th in threads:
        th.start()
    for th in threads:
        th.join(10)
    assert not any(th.is_alive() for th in threads), "a member is still waiting"
    return out


def test_no_node_goes_on_when_another_fails_its_checks():
    """All or none: a node whose check fails (a usage error, exit 2) stops every node at that step, each with the
    failing node's exit code and 'nothing was changed'; when every check passes, each sees what the others said."""
    n0, n1 = two_nodes()
    g = nodes.NodeGroup({"gpu1": n0, "gpu2": n1})
    steps: list[str] = []

    def bad():
        raise UsageError("gpu2: cannot write the worker files")

    def part(check):
        def go():
            said = nodes.checked(g, "gpu1" if check is None else "gpu2", "x", "apply:checked", check or (lambda: True))
            steps.append("patched")
            return said
        return go

    out = on_threads({"gpu1": part(None), "gpu2": part(bad)})
    assert isinstance(out["gpu2"], UsageError)
    assert isinstance(out["gpu1"], nodes.NodeFailed) and out["gpu1"].exit_code == 2
    assert "nothing was changed" in str(out["gpu1"]) and "node rank 1 (gpu2) failed: gpu2: cannot write" in str(
        out["gpu1"])
    assert steps == []  # neither went on to change anything

    g = nodes.NodeGroup({"gpu1": n0, "gpu2": n1})
    out = on_threads({"gpu1": lambda: nodes.checked(g, "gpu1", "x", "s", lambda: True),
                      "gpu2": lambda: nodes.checked(g, "gpu2", "x", "s", lambda: False)})
    assert out["gpu1"] == out["gpu2"] == {"gpu1": True, "gpu2": False}


def test_a_member_that_ended_is_gone_at_every_later_step():
    """A TARGET whose thread ended (Meeting.leave, however it ended) does not hold the others: it is GONE there, and
    that is trouble (the others do not go on)."""
    n0, n1 = two_nodes()
    meeting = met(["gpu1", "gpu2"], {"gpu1": [n0], "gpu2": [n1]})
    g = meeting.group(spec("gpu1"), [n0])
    meeting.leave("gpu2")
    said = g.meet("apply:patched", "gpu1", True)
    assert said == {"gpu1": True, "gpu2": nodes.GONE}
    assert "ended before this step" in str(g.trouble(said, "gpu1"))
    assert g.trouble({"gpu1": True, "gpu2": False}, "gpu1") is None


def test_the_verdict_ends_every_wait_at_once_and_a_failure_wins():
    """Node rank 0 ready makes the verdict True; a node that died makes it False, even after True (the server is
    down); a wait on the verdict returns as soon as it changes, whatever is left of its time."""
    n0, n1 = two_nodes()
    g = nodes.NodeGroup({"gpu1": n0, "gpu2": n1})
    w0, w1 = g.node_wait("gpu1", "apply"), g.node_wait("gpu2", "apply")
    assert w0.http and not w1.http  # node rank 0 by its health endpoint, the others by their processes
    assert w1.verdict() is None
    changed: list[bool] = []
    th = threading.Thread(target=lambda: changed.append(w1.pause(60)))
    th.start()
    g.decide("apply", True)
    th.join(10)
    assert changed == [True] and w1.verdict() is True
    g.decide("apply", False)
    assert w0.verdict() is False
    g.decide("apply", True)
    assert w0.verdict() is False  # a failure is never undone
    assert g.verdict("rollback") is None  # each phase has its own


def test_a_live_sweep_says_it_takes_one_target_and_a_restart_sweep_says_to_name_every_node():
    n0 = server(10, "--nnodes", "2")
    with pytest.raises(UsageError, match="sweep --live takes one TARGET"):
        nodes.check([n0], [n0], "sweep --live", "gpu1", several=False)
    with pytest.raises(UsageError, match=r"without node rank 1,.*nothing was changed: name every node, then"):
        nodes.check([n0], [n0], "sweep", "gpu1", several=False, fix="name every node, then")


def test_a_sweep_across_targets_takes_the_nodes_of_one_server_each_rank_once():
    from eaglepatch.tuning.drive_nodes import _one_server

    a, b = spec("gpu1"), spec("gpu2")
    n0 = server(10, "--nnodes", "2", "--dist-init-addr", "h:5")
    n1 = server(11, "--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "h:5")
    assert _one_server([b, a], [n1, n0]) == [1, 0]
    other = server(12, "--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "h:6")
    single = server(13)
    for servers, want in (([n0, other], "each node rank 0..N-1 once"), ([n0, n0], "each node rank 0..N-1 once"),
                          ([n0, single], "runs on one node"), ([n0, None], "no sglang server is running"),
                          ([n0, server(14, "--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "h:5",
                                       "--disaggregation-mode", "prefill")], "without its decode side")):
        with pytest.raises((UsageError, Unsupported), match=want):
            _one_server([a, b], servers)


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


@dataclasses.dataclass
class RecordFacts:
    """What ``together._record_together`` reads of a node's facts: its manifest, whether the install is writable."""

    manifest: dict | None
    denied: str | None = None
    servers: tuple = ()
    python: str = "python3"
    backup_dir: str = "/b"

    def manifest_servers(self):
        return HostFacts.manifest_servers(self)  # type: ignore[arg-type]

    def cannot_write(self):
        return self.denied


class RecordSession:
    """A node's Session: what it carried out on its host (each plan's manifest)."""

    def __init__(self, facts: RecordFacts):
        self.facts, self.token, self.manifests = facts, "t", []

    def execute(self, plan):
        assert plan.writes == ()
        self.manifests.append(plan.manifest)
        return {"ok": True}


def launched(rank: int) -> ServerProcess:
    argv = ["python3", "-m", "sglang.launch_server", "--port", str(30000 + rank), "--nnodes", "2", "--node-rank",
            str(rank), "--dist-init-addr", "h:5"]
    return ServerProcess.from_scan({"pid": 10 + rank, "argv": argv, "args_index": 3, "cwd": "/srv", "env": {"A": "1"}})


def test_every_node_records_its_launch_in_its_install_before_any_node_stops():
    """restart of a server that is not patched: each node's launch goes into a manifest of its own (marked as a
    restart's record) on its host, every node meeting once written, so that a kill after any node stopped leaves
    each node its record (``_recorded_nodes`` reads it back as that node); removed once the server is up again. A
    patched install's manifest that holds the launch already is left as it is; a node whose install cannot be
    written refuses, and no node goes on to stop."""
    from eaglepatch.ops import change, together

    n0, n1 = launched(0), launched(1)
    g = nodes.NodeGroup({"gpu1": n0, "gpu2": n1})
    sessions = {"gpu1": RecordSession(RecordFacts(None)), "gpu2": RecordSession(RecordFacts(None))}
    targets = {m: types.SimpleNamespace(spec=spec(m)) for m in sessions}
    out = on_threads({m: (lambda m=m: together._record_together(targets[m], sessions[m], g, "restart"))
                      for m in sessions})
    assert out == {"gpu1": None, "gpu2": None}, out
    for rank, m in enumerate(sessions):
        [manifest] = sessions[m].manifests
        assert manifest[change.RECORD] is True and sessions[m].facts.manifest == manifest
        rec = nodes.Recorded.of(manifest["servers"][0])
        assert rec is not None and rec.nodes == Nodes(2, rank, "h:5") and rec.launch.argv == launched(rank).argv
        assert rec.launch.cwd == "/srv" and dict(rec.launch.env) == {"A": "1"}
        together._drop_record(sessions[m])
        assert sessions[m].manifests[-1] is None and sessions[m].facts.manifest is None

    patched = {"files": [], "servers": change.lifecycle().manifest_record([n0])}
    same = RecordSession(RecordFacts(dict(patched)))
    alone = nodes.NodeGroup({"gpu1": n0})
    together._record_together(types.SimpleNamespace(spec=spec("gpu1")), same, alone, "restart")
    together._drop_record(same)
    assert same.manifests == [] and same.facts.manifest == patched  # apply's record holds it already; it stays

    g = nodes.NodeGroup({"gpu1": n0, "gpu2": n1})
    sessions = {"gpu1": RecordSession(RecordFacts(None)),
                "gpu2": RecordSession(RecordFacts(None, denied="gpu2: user u cannot write /x: Permission denied"))}
    out = on_threads({m: (lambda m=m: together._record_together(targets[m], sessions[m], g, "restart"))
                      for m in sessions})
    assert isinstance(out["gpu2"], UsageError) and "before any node of a multi-node server stops" in str(out["gpu2"])
    assert isinstance(out["gpu1"], nodes.NodeFailed) and out["gpu1"].exit_code == out["gpu2"].exit_code
    assert sessions["gpu2"].manifests == []


def test_no_node_restarts_when_a_target_runs_a_node_and_more_or_a_rank_is_not_held_once():
    """A TARGET that runs a node of the server and another server (or two of its nodes) refuses (it restarts one
    node or none); every other TARGET of that server refuses with it, nothing changed, rather than restart its node
    while that node stays up (the whole server would go down). Likewise when the members' node ranks are not
    0..N-1 each once (two names for one host)."""
    n0, n1 = two_nodes()
    meeting = met(["gpu1", "gpu2"], {"gpu1": [n0], "gpu2": [n1, server(31)]})
    with pytest.raises(Unsupported, match="gpu2 also runs another server; nothing was changed"):
        meeting.group(spec("gpu1"), [n0])
    with pytest.raises(Unsupported, match="--server-port PORT"):
        meeting.group(spec("gpu2"), [n1, server(31)])
    with pytest.raises(Unsupported, match="gpu2 also runs"):  # asked again: the same answer
        meeting.group(spec("gpu1"), [n0])
    meeting.leave("gpu1")  # a refused group holds no one

    three = [server(10 + r, "--nnodes", "3", "--node-rank", str(r), "--dist-init-addr", "h:5") for r in range(3)]
    meeting = met(["gpu1", "gpu2"], {"gpu1": three[:1], "gpu2": three[1:]})  # two nodes in one TARGET
    with pytest.raises(Unsupported, match="gpu2 also runs"):
        meeting.group(spec("gpu1"), three[:1])

    meeting = met(["gpu1", "gpu1.local"], {"gpu1": [n0], "gpu1.local": [n0]})  # rank 0 twice, rank 1 never
    with pytest.raises(Unsupported, match="node ranks are not each run by one TARGET"):
        meeting.group(spec("gpu1"), [n0])


def test_a_node_that_cannot_write_refuses_to_restart_stale_servers_onto_patched_code(monkeypatch):
    """apply of a patched install whose node still runs the original code (stale), by a user who cannot write it:
    as for a server of one node, it is not restarted (a patched server that fails would need the files reverted,
    which this user cannot do); no node restarts, nothing changed."""
    from eaglepatch.ops import change, together

    n0, n1 = launched(0), launched(1)
    g = nodes.NodeGroup({"gpu1": n0, "gpu2": n1})
    monkeypatch.setattr(change.lifecycle(), "stale", lambda servers, facts: list(servers))
    monkeypatch.setattr(together, "_together_check", lambda t, servers, ropts: None)
    restarted: list[str] = []

    def restart_together(group, me, *args, **kwargs):
        restarted.append(me)
        raise AssertionError("restarted")

    monkeypatch.setattr(nodes, "restart_together", restart_together)
    plan = types.SimpleNamespace(changed=False, timers=[], worker_writes=0)
    denied = {"gpu1": "gpu1: user u cannot write /x: Permission denied", "gpu2": None}

    def part(m, srv, manifest=None):
        t = types.SimpleNamespace(spec=spec(m), host=None)
        session = RecordSession(RecordFacts(manifest, denied=denied[m]))
        return lambda: together.apply_together(t, None, session, plan, g, None, [srv], [srv], denied[m],
                                              lambda s: None, None)

    out = on_threads({"gpu1": part("gpu1", n0), "gpu2": part("gpu2", n1)})
    assert isinstance(out["gpu1"], UsageError) and "cannot write /x" in str(out["gpu1"]), out
    assert isinstance(out["gpu2"], nodes.NodeFailed) and "nothing was changed" in str(out["gpu2"]), out
    assert restarted == []

    # gpu1 up to date (not stale), gpu2 stale: gpu1 restarts with gpu2, so it cannot go on unless its manifest
    # holds its launch already (a kill after the stop would leave it no record, and it cannot write one)
    monkeypatch.setattr(change.lifecycle(), "stale", lambda servers, facts: [s for s in servers if s is n1])
    out = on_threads({"gpu1": part("gpu1", n0), "gpu2": part("gpu2", n1)})
    assert isinstance(out["gpu1"], UsageError) and "before any node of a multi-node server stops" in str(out["gpu1"])
    assert isinstance(out["gpu2"], UsageError) and "node rank 0 (gpu1) would restart with this one" in str(
        out["gpu2"]) and "nothing was changed" in str(out["gpu2"]), out
    assert restarted == []
    # recorded already, but it still could not roll back (its files put back) if the server did not come up
    patched = {"files": [], "servers": change.lifecycle().manifest_record([n0])}
    out = on_threads({"gpu1": part("gpu1", n0, patched), "gpu2": part("gpu2", n1)})
    assert isinstance(out["gpu1"], UsageError) and "cannot write /x" in str(out["gpu1"]), out
    assert isinstance(out["gpu2"], UsageError) and "nothing was changed" in str(out["gpu2"]), out
    assert restarted == []
    denied["gpu1"] = None  # writable: recorded already, both go on to restart together
    out = on_threads({"gpu1": part("gpu1", n0, patched), "gpu2": part("gpu2", n1)})
    assert sorted(restarted) == ["gpu1", "gpu2"], out


def test_a_record_is_dropped_when_another_node_fails_to_write_its_own():
    """Every node records its launch before any stops; when one fails at that step (its write fails), no node stops
    and the records the others wrote are removed: the installs are as they were."""
    from eaglepatch.errors import HelperFailed
    from eaglepatch.ops import change, together

    class Failing(RecordSession):
        def execute(self, plan):
            raise HelperFailed("gpu2: the manifest could not be written: No space left on device")

    n0, n1 = launched(0), launched(1)
    g = nodes.NodeGroup({"gpu1": n0, "gpu2": n1})
    sessions = {"gpu1": RecordSession(RecordFacts(None)), "gpu2": Failing(RecordFacts(None))}
    targets = {m: types.SimpleNamespace(spec=spec(m)) for m in sessions}
    out = on_threads({m: (lambda m=m: together._record_together(targets[m], sessions[m], g, "restart"))
                      for m in sessions})
    assert isinstance(out["gpu2"], HelperFailed) and isinstance(out["gpu1"], nodes.NodeFailed), out
    [record, dropped] = sessions["gpu1"].manifests
    assert record[change.RECORD] is True and dropped is None and sessions["gpu1"].facts.manifest is None


def test_status_shows_a_restart_record_and_the_recorded_nodes_that_do_not_run():
    """An install whose manifest is a restart's record (a restart of the nodes killed after they stopped): status
    says so, and names each recorded node that does not run (rank, port, its launch, secrets masked), in JSON and
    text; a node that runs again is not listed."""
    from eaglepatch.ops import change
    from eaglepatch.ops.inspection import _server_lines, recorded_json

    n1 = ServerProcess.from_scan({"pid": 11, "argv": [*launched(1).argv, "--api-key", "sk-9"], "args_index": 3,
                                  "cwd": "/srv", "env": {}})
    facts = RecordFacts({change.RECORD: True, "servers": change.lifecycle().manifest_record([n1])})
    doc = recorded_json(facts, [])
    assert doc["restart_record"] is True
    [rec] = doc["recorded_nodes"]
    assert rec["port"] == 30001 and rec["nodes"] == {"count": 2, "rank": 1, "dist_init_addr": "h:5"}
    assert rec["argv"][-2:] == ["--api-key", "***"]
    text = "\n".join(_server_lines(dict(doc, servers=[], other_servers=[])))
    assert "recorded: node rank 1 of 2 on :30001 does not run" in text and "restart record:" in text
    assert recorded_json(facts, [{"port": 30001}])["recorded_nodes"] == []
    assert recorded_json(RecordFacts(None), []) == {"restart_record": False, "recorded_nodes": []}


def test_a_revert_whose_server_does_not_come_up_keeps_each_nodes_launch(monkeypatch):
    """revert of both nodes: the files go back in the start request, but each node's manifest keeps its launch (a
    restart's record) until the server is up; when it does not come up (node rank 1 dies), the record stays on every
    node and the error says how to start the server from it; once it is up, the record goes."""
    import importlib

    from eaglepatch.errors import RestartFailed
    from eaglepatch.ops import change, together
    from eaglepatch.ops.plan import Plan, Write
    from eaglepatch.server.restart import RestartOptions, RestartResult, Strategy

    R = importlib.import_module("eaglepatch.server.restart")
    n0, n1 = launched(0), launched(1)
    monkeypatch.setattr(change.lifecycle(), "stale", lambda servers, facts: [])
    monkeypatch.setattr(together, "_together_check", lambda t, servers, ropts: None)

    class Reverting(RecordSession):
        def execute(self, plan, then=None, then_timeout=None):
            self.manifests.append(plan.manifest)
            return {"ok": True, "then": {"batch": [{}]}}

    def run(fail: bool) -> tuple[dict, dict]:
        monkeypatch.setattr(R, "after_relaunch", lambda *a, node=None, **k: RestartResult(
            Strategy.RELAUNCH, None, not fail, 1.0, message="it died" if fail else ""))

        def restart_together(group, me, host, python, ropts, say, phase, name, start):
            res = start(group.members[me].launch_spec(), None)
            return res, ("node rank 1 (gpu2): it died" if fail else None)

        monkeypatch.setattr(nodes, "restart_together", restart_together)
        g = nodes.NodeGroup({"gpu1": n0, "gpu2": n1})
        sessions = {}
        for m, n in (("gpu1", n0), ("gpu2", n1)):
            patched = {"files": [], "servers": change.lifecycle().manifest_record([n])}
            sessions[m] = Reverting(RecordFacts(patched))
        plan = Plan((Write("/s/eagle_worker.py", "sglang/eagle_worker.py", b"patched", b"original"),), None)

        def part(m):
            t = types.SimpleNamespace(spec=spec(m), host=None)
            return lambda: together.revert_together(t, sessions[m], plan, g, RestartOptions(timeout=30), None,
                                                   lambda s: None)

        return on_threads({m: part(m) for m in sessions}), sessions

    out, sessions = run(fail=True)
    for rank, m in enumerate(("gpu1", "gpu2")):
        assert isinstance(out[m], RestartFailed) and "its launch kept: 'eaglepatch restart'" in str(out[m]), out
        [reverted] = sessions[m].manifests  # the revert's request, and nothing removed after it
        rec = nodes.Recorded.of(reverted["servers"][0])
        assert reverted[change.RECORD] is True and rec.nodes.rank == rank and rec.launch.argv == launched(rank).argv
    out, sessions = run(fail=False)
    for m in ("gpu1", "gpu2"):
        assert out[m]["changed"] is True, out
        assert sessions[m].manifests[0][change.RECORD] is True and sessions[m].manifests[-1] is None
