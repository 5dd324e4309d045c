"""``inspection.log_tails``: the last bytes of each rank's newest timing log, read through the host's ``logs`` op
(its real code, eaglepatch.hostside.logs.op_logs, on a folder of this test's), never the logs whole; a restart
sweep's shared-traffic check (tuning/drive.py) reads the last minute's records from there."""

from __future__ import annotations

import json
import os

from eaglepatch.ops import inspection
from eaglepatch.tuning import traffic


def record(t: float, others: int) -> bytes:
    rec = {"v": 1, "t": t, "host": "h", "pid": os.getpid(), "rank": 0, "mode": "decode", "bs": 4, "cycle_ms": 10.0,
           "phases": {"verify": 5.0}, "accepted": 8, "pad": "x" * 200}
    if others:
        rec["others"] = others
    return json.dumps(rec).encode() + b"\n"


def test_only_the_tail_of_each_ranks_newest_log_is_read(tmp_path, monkeypatch):
    from eaglepatch.hostside.logs import op_logs

    logs = tmp_path / "logs"
    logs.mkdir(mode=0o755)
    pid = os.getpid()
    asked: list[dict] = []

    def call(host, python, op, **payload):
        assert op == "logs"
        asked.append(payload)
        res = op_logs(json.loads(json.dumps(payload)))
        blobs = [bytes(b) for b in res.pop("__blobs__", [])]  # as the agent's frames bring them
        return dict(json.loads(json.dumps(res)), __blobs__=blobs)

    monkeypatch.setattr("eaglepatch.hosts.agent.call", call)
    old = b"".join(record(1000.0 + i, 3 if i == 0 else 0) for i in range(20000))  # others' requests long ago
    (logs / f"h-{pid}-rank0.jsonl").write_bytes(old)
    (logs / f"h-{pid}-rank1.jsonl").write_bytes(b"".join(record(2000.0 + i, 0) for i in range(10)))  # short
    tails = inspection.log_tails(None, "python3", str(logs), {pid}, 64 << 10)
    assert tails is not None and len(tails) == 2
    big = max(tails, key=len)
    assert 60 << 10 < len(big) <= 64 << 10 and big.endswith(b"\n")
    for t in tails:  # whole lines only: each parses
        assert all(json.loads(line)["pid"] == pid for line in t.splitlines())
    assert min(len(t) for t in tails) == 10 * len(record(2000.0, 0))  # the short file: whole

    def others_in(data: list[bytes], since: float) -> int:
        files = []
        for i, d in enumerate(data):
            files.append(str(tmp_path / f"tail{i}.jsonl"))
            with open(files[-1], "wb") as f:
                f.write(d)
        return traffic.others_since(files, since)

    assert others_in(tails, 0.0) == 0  # the first record, with others, lies before the tail
    with open(logs / f"h-{pid}-rank0.jsonl", "ab") as f:
        f.write(record(30000.0, 2))  # now: a cycle that carried others' requests
    assert others_in(inspection.log_tails(None, "python3", str(logs), {pid}, 64 << 10), 29000.0) == 1
    assert inspection.log_tails(None, "python3", str(logs), {pid + 10 ** 6}, 64 << 10) == []  # not its pids

    # rotated a moment ago (--max-log-mb): the newest file holds one record, the last minute's others' requests
    # lie in the file before it, and the tail goes on into it; older files of the chain are not read
    (logs / f"h-{pid}-rank1.jsonl").unlink()
    (logs / f"h-{pid}-rank0.jsonl").write_bytes(old)
    (logs / f"h-{pid}-rank0.1.jsonl").write_bytes(b"".join(record(40000.0 + i, 1 if i == 9 else 0) for i in range(10)))
    (logs / f"h-{pid}-rank0.2.jsonl").write_bytes(record(40010.0, 0))
    tails = inspection.log_tails(None, "python3", str(logs), {pid}, 64 << 10)
    assert sum(map(len, tails)) == sum((logs / f"h-{pid}-rank0.{i}.jsonl").stat().st_size for i in (1, 2))
    assert others_in(tails, 39000.0) == 1


def test_a_failed_request_is_not_taken_for_no_logs(monkeypatch):
    """The shared-traffic check must not take a broken connection for a server without records (it would stop a
    server carrying others' requests): the error goes up; the host's own answer that it has no logs is None."""
    import pytest

    from eaglepatch.errors import ConnectionFailed

    def broken(host, python, op, **payload):
        raise ConnectionFailed("gpu1: the connection was lost")

    monkeypatch.setattr("eaglepatch.hosts.agent.call", broken)
    with pytest.raises(ConnectionFailed):
        inspection.log_tails(None, "python3", "/x", {1}, 1 << 20)
    monkeypatch.setattr("eaglepatch.hosts.agent.call", lambda *a, **k: {"error": "no such folder", "dirs": []})
    assert inspection.log_tails(None, "python3", "/x", {1}, 1 << 20) is None
