"""``status``, ``report`` and ``doctor`` read every node of a multi-node server named in one command, and its
timing records carry the node rank (issue 40: "status, show, report, doctor read every node (records carry the
node rank)").

A 2-node stand-in server on two SSH hosts (multinode.py: ``testbox`` and ``testbox1``, each with its own tree),
patched by one ``apply`` naming both and loaded on both nodes. The nodes run without ``--standin-rendezvous``: with
it the stand-in's node 1 serves nothing and runs no cycle, where every node of a real server runs every batch;
without it each node serves and times the requests it is sent (``--dist-init-addr`` and ``--nnodes`` still make
them the nodes of one server, for eaglepatch).
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest

from multinode import TwoNodes, host1  # noqa: F401 - host1: the fixture
from safety import H

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

SPEC = ("--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3")
REQUESTS = (3, 5)  # requests sent to node 0, node 1: their records differ in number


def generate(port: int, n: int) -> None:
    for i in range(n):
        body = json.dumps({"text": f"request {i}", "sampling_params": {"max_new_tokens": 12, "ignore_eos": True}})
        req = urllib.request.Request(f"http://127.0.0.1:{port}/generate", data=body.encode(),
                                     headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=30).read()


def records(logs: Path, pid: int) -> list[dict]:
    """The timing records (not the run headers) that process ``pid`` wrote in ``logs``."""
    out = []
    for f in sorted(logs.glob(f"*-{pid}-rank*.jsonl")):
        for line in f.read_text().splitlines():
            doc = json.loads(line)
            if "kind" not in doc:
                out.append(doc)
    return out


def written(logs: Path, pids: list[int]) -> list[list[dict]]:
    """Every node's records once they stop growing (the runtime flushes every 2 s)."""
    deadline, last = time.monotonic() + 30, None
    while True:
        now = [records(logs, p) for p in pids]
        counts = [len(r) for r in now]
        if all(counts) and counts == last:
            return now
        assert time.monotonic() < deadline, f"the nodes' records: {counts}"
        last = counts
        time.sleep(2.5)


def test_status_report_and_doctor_read_every_node_and_records_carry_its_rank(standins, tmp_path, sshd, host1):
    two = TwoNodes(standins, tmp_path, sshd, host1, rendezvous=False, extra=SPEC)
    logs = tmp_path / "timing logs"
    logs.mkdir(mode=0o700)
    doc = two.run("apply", "--json", "--log-dir", str(logs), "--timeout", "60").expect(0).json()
    assert [(d["target"], d["changed"], d["restarted"]) for d in doc] == [(t, True, True) for t in two.targets], doc
    pids = two.up()
    for port, n in zip(two.ports, REQUESTS):
        generate(port, n)
    mine = written(logs, pids)
    # the runtime on each host: every record says its node's rank (--node-rank), and its process
    assert [{(r["node"], r["pid"]) for r in recs} for recs in mine] == [{(0, pids[0])}, {(1, pids[1])}]
    trees = two.digests()

    status = two.run("status", "--json").expect(0).json()
    assert [s["target"] for s in status] == two.targets
    assert [{f["state"] for f in s["files"]} for s in status] == [{"patched"}, {"patched"}], status
    assert [[x["pid"] for x in s["servers"]] for s in status] == [[p] for p in pids], status
    assert [s["servers"][0]["nodes"] for s in status] == [
        {"count": 2, "rank": r, "dist_init_addr": two.addr} for r in (0, 1)], status
    text = two.run("status").expect(0).out
    assert all(t in text for t in two.targets), text

    report = two.run("report", "--json", "--by", "rank").expect(0).json()
    assert report["records"] == sum(len(r) for r in mine), report
    by_source = {tuple(run["sources"]): run for run in report["runs"]}
    assert sorted(by_source) == sorted((t,) for t in two.targets), report["runs"]
    assert [by_source[(t,)]["records"] for t in two.targets] == [len(r) for r in mine], report["runs"]
    nodes = {}
    for g in report["groups"]:
        nodes[g["key"]["node"]] = nodes.get(g["key"]["node"], 0) + g["n"]
    assert nodes == {0: len(mine[0]), 1: len(mine[1])}, report["groups"]
    text = two.run("report", "--by", "rank").expect(0).out
    assert "node=0 rank=0" in text and "node=1 rank=0" in text, text

    # one document per node, as status gives one per TARGET; each counts its node's decode cycles
    doctor = two.run("doctor", "--json").expect(0).json()
    assert isinstance(doctor, list) and [d["target"] for d in doctor] == two.targets, doctor
    assert [d["server"]["pid"] for d in doctor] == pids, doctor
    decode = [sum(1 for r in recs if r["mode"] == "decode") for recs in mine]
    assert [d["sources"]["timing_log"]["records"] for d in doctor] == decode, doctor

    # reading changed nothing: every byte of both trees, the same servers, no lock
    assert two.digests() == trees
    assert two.up() == pids
    assert not any((H.worker_file(t).parent / ".eaglepatch.lock").exists() for t in two.trees)
