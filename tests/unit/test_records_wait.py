"""bench's wait for the server's timing records after the load (``tuning.bench.wait_for_records``): it ends once
every rank's log was written RECORDS_MARGIN_S past the window's end, and at ``--log-wait`` at the latest. The host
side (``op_log_times``) is read as the host runs it, on real files.

Each test can fail: a wait that ends while one rank has not written since the load (its last cycles not on disk
yet), one that never ends early, one that outlasts --log-wait when the host cannot tell, a rank of another process
counted.
"""

from __future__ import annotations

import os

import pytest

from eaglepatch.hostside import logs as host_logs
from eaglepatch.tuning import bench


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.t += s


def _wait(monkeypatch, answers, end=100.0, limit=4.5):
    """wait_for_records with a fake clock, the host's answers taken in turn (the last repeated); (seconds, polls)."""
    clock, polls = Clock(), []

    def call(_host, _python, op, **kw):
        assert op == "log_times" and kw["pids"] == [7, 8]
        polls.append(clock.t)
        a = answers[min(len(polls), len(answers)) - 1]
        if isinstance(a, Exception):
            raise a
        return a

    monkeypatch.setattr("eaglepatch.hosts.agent.call", call)
    took = bench.wait_for_records(None, "python3", "/logs", {8, 7}, end, limit, clock=clock, sleep=clock.sleep)
    return took, polls


def test_it_ends_once_every_rank_wrote_past_the_window(monkeypatch):
    m = bench.RECORDS_MARGIN_S
    before = {"ranks": [{"pid": 7, "rank": 0, "mtime": 100.0 + m}, {"pid": 8, "rank": 1, "mtime": 99.0}]}
    after = {"ranks": [{"pid": 7, "rank": 0, "mtime": 100.0 + m}, {"pid": 8, "rank": 1, "mtime": 101.9}]}
    took, polls = _wait(monkeypatch, [before, before, before, after])
    assert len(polls) == 4 and took == pytest.approx(4 * bench.RECORDS_POLL_S)


def test_a_rank_that_writes_nothing_more_or_a_host_that_cannot_tell_waits_the_limit(monkeypatch):
    from eaglepatch.errors import HelperFailed

    stale = {"ranks": [{"pid": 7, "rank": 0, "mtime": 100.1}]}  # inside the margin: its last cycles may be to come
    for answers in ([stale], [HelperFailed("no such op")], [{"ranks": []}], [{"ranks": [{"pid": 7}]}]):
        took, polls = _wait(monkeypatch, answers, limit=2.0)
        assert took == pytest.approx(2.0) and len(polls) == 8, answers


def test_no_wait_at_all_asks_nothing(monkeypatch):
    took, polls = _wait(monkeypatch, [{"ranks": []}], limit=0.0)
    assert took == 0.0 and polls == []


def test_the_host_gives_each_rank_its_newest_write_over_its_chain_and_only_of_the_pids(tmp_path):
    d = tmp_path / "logs"
    d.mkdir(mode=0o700)
    times = {"gpu-7-rank0.jsonl": 50.0, "gpu-7-rank0.000001.jsonl": 60.0, "gpu-7-rank1.jsonl": 40.0,
             "gpu-9-rank0.jsonl": 99.0, "notes.txt": 98.0}
    for name, t in times.items():
        (d / name).write_text("{}\n")
        os.utime(d / name, (t, t))
    os.symlink(d / "gpu-9-rank0.jsonl", d / "gpu-7-rank2.jsonl")  # a link is no log of the runtime's
    got = host_logs.op_log_times({"log_dir": str(d), "pids": [7]})
    assert got == {"ranks": [{"pid": 7, "rank": 0, "mtime": 60.0}, {"pid": 7, "rank": 1, "mtime": 40.0}]}
