"""The timing logs' bounds inside the server (eaglepatch/runtime/_eaglepatch_runtime.py; docs/contract.md, "Bounds
inside the server").

- ``max_log_mb`` (apply --max-log-mb): each rank's records go to a chain of files, ``<host>-<pid>-rank<r>.jsonl``
  then ``<host>-<pid>-rank<r>.<i>.jsonl``, each starting with the run header; the chain stays under the rank's
  share of the cap (its own oldest files removed, nobody else's), and the report reads what is left.
- ``min_free_mb`` (apply --min-free-mb): under that much free space, nothing is written and the records are
  counted dropped; writing resumes above it plus 64 MB. Free space is looked at most once a second.
- A full disk (ENOSPC on write) is said once, in one line, with the free space found; the worker thread never
  touches the disk, never blocks, never raises; writing resumes once space returns.
- The queue between the worker and the writer (the buffer, the messages) is bounded; what does not fit is dropped
  and counted. Drops are said in "drops" lines of the log, by reason.
"""
import errno
import json
import os
import re
import socket
import threading

import pytest

from runtime_helpers import Batch, Obj, decode_worker, load_module, records

MB = 1 << 20
HOST = socket.gethostname()


class Disk(object):
    """os.statvfs as a filesystem with ``free`` bytes free (counting the calls), and os.write failing with ENOSPC on
    the writer's thread while ``full``."""

    def __init__(self, monkeypatch, free):
        self.free = free
        self.full = False
        self.looks = 0
        self.real_write = os.write
        self.main = threading.current_thread()
        monkeypatch.setattr(os, "statvfs", self.statvfs)
        monkeypatch.setattr(os, "write", self.write)

    def statvfs(self, path):
        self.looks += 1
        return os.statvfs_result((4096, 4096, 1 << 30, self.free // 4096, self.free // 4096, 0, 0, 0, 0, 255))

    def write(self, fd, data):
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        return self.real_write(fd, data)


class Spy(object):
    """The disk calls made on the worker (main) thread while ``active``."""

    NAMES = ("open", "write", "fstat", "stat", "statvfs", "unlink", "ftruncate", "close", "listdir", "makedirs")

    def __init__(self, monkeypatch):
        self.main = threading.current_thread()
        self.active = False
        self.seen = []
        for name in self.NAMES:
            monkeypatch.setattr(os, name, self.spy(name, getattr(os, name)))

    def spy(self, name, real):
        def call(*a, **kw):
            if self.active and threading.current_thread() is self.main:
                self.seen.append(name)
            return real(*a, **kw)
        return call


def chain(logs, pid=None):
    """This process's (or ``pid``'s) rank-0 log files, in the order written: the first, then .000001, ..."""
    pid = os.getpid() if pid is None else pid
    pat = re.compile(r"^%s-%d-rank0(?:\.(\d{6}))?\.jsonl$" % (re.escape(HOST), pid))
    found = [(int(m.group(1) or 0), n) for n in os.listdir(str(logs)) for m in [pat.match(n)] if m]
    return [n for _, n in sorted(found)]


def parsed(path):
    with open(str(path)) as f:
        return [json.loads(line) for line in f]


def counting_worker(rt):
    """A worker whose i-th cycle accepts i tokens (a total, no per-request list: so a record says which cycle it
    is, and the report reads it)."""
    out = Obj(n=0)
    w = decode_worker(rt, out=out, attrs=("n",))

    def cycle(i):
        out.n = i
        w.forward_batch_generation(Batch(1))
    return cycle


# --- max_log_mb: rotation, the chain under its share ----------------------------------------------------------
def test_the_chain_rotates_and_stays_under_the_cap_removing_only_its_own_oldest_files(load, logs):
    logs.mkdir(mode=0o700)
    foreign = {  # another launch's files, another rank's, another host's: never touched
        "%s-%d-rank0.jsonl" % (HOST, os.getpid() + 1): "x" * 5000 + "\n",
        "%s-%d-rank0.000001.jsonl" % (HOST, os.getpid() + 1): "y\n",
        "%s-%d-rank1.000001.jsonl" % (HOST, os.getpid()): "z\n",
        "other-%d-rank0.jsonl" % os.getpid(): "w\n",
    }
    for name, text in foreign.items():
        (logs / name).write_text(text)
    rt = load(max_log_mb=0.25)                                  # 256 KB: files of 64 KB (the least)
    rt._WRITER_THREAD = False
    cycle = counting_worker(rt)
    n = 6000                                                    # some 2 MB of records
    for i in range(n):
        cycle(i)
        if i % 97 == 0:
            rt.flush()
    rt.flush()
    files = chain(logs)
    assert files[0] != "%s-%d-rank0.jsonl" % (HOST, os.getpid())    # the first file was removed, and others
    assert len(files) >= 3 and rt._stats()["removed"][0] >= 10
    sizes = [(logs / f).stat().st_size for f in files]
    line = max(len(l) for f in files for l in (logs / f).read_text().splitlines(True))
    assert sum(sizes) <= 0.25 * MB + line and rt._stats()["log_bytes"] == sum(sizes)
    assert all(s <= 64 * 1024 + line for s in sizes)
    # each file starts with the run header; the records left are the newest, in order, none lost
    accepted = []
    for f in files:
        docs = parsed(logs / f)
        assert docs[0]["kind"] == "run" and docs[0]["pid"] == os.getpid()
        accepted += [d["accepted"] for d in docs if "kind" not in d]
    assert accepted == list(range(n - len(accepted), n)) and len(accepted) > 500
    assert rt._stats()["dropped"] == 0
    for name, text in foreign.items():
        assert (logs / name).read_text() == text
    # the report reads what is left: every record of the chain (the foreign files are not logs it can read)
    from eaglepatch.report import aggregate, iter_log_files

    res = aggregate(iter_log_files([str(logs / f) for f in files]))
    assert res.records == len(accepted)
    assert sum(g.n for g in res.groups) == len(accepted)


def test_a_rank_s_share_is_the_cap_over_the_launch_s_ranks(load, logs):
    class Dist(object):
        def is_available(self):
            return True

        def is_initialized(self):
            return True

        def get_rank(self):
            return 3

        def get_world_size(self):
            return 4

    rt = load(max_log_mb=64)
    rt._DIST = Dist()
    rt._run = ("r", {"argv": ["python", "-m", "sglang.launch_server", "--tp", "4"]})
    assert rt._rank_share() == 16 * MB
    rt._run = ("r", {"argv": ["python", "-m", "sglang.launch_server", "--tp", "4", "--dp-size", "2"]})
    assert rt._rank_share() == 8 * MB                          # each replica a world of its own
    rt._run = ("r", {"argv": ["sglang", "--tp=4", "--dp=2", "--enable-dp-attention"]})
    assert rt._rank_share() == 16 * MB                         # the replicas inside the one world
    rt._run = None
    rt._DIST = None
    decode_worker(rt).forward_batch_generation(Batch())
    rt.flush()
    assert rt._stats()["share"] == 64 * MB and rt._stats()["files"] == ["%s-%d-rank0.jsonl" % (HOST, os.getpid())]


def test_files_are_named_to_sort_in_the_order_written_and_fit_the_log_patterns(load, logs):
    from eaglepatch.hostside.logs import LOG_NAME

    rt = load(max_log_mb=2)
    rt._WRITER_THREAD = False
    cycle = counting_worker(rt)
    for i in range(4000):
        cycle(i)
        if i % 50 == 0:
            rt.flush()
    rt.flush()
    files = rt._stats()["files"]
    assert files[0] == "%s-%d-rank0.jsonl" % (HOST, os.getpid())
    assert files[1:] == ["%s-%d-rank0.%06d.jsonl" % (HOST, os.getpid(), i) for i in range(1, len(files))]
    assert len(files) >= 3 and files[1:] == sorted(files[1:])
    assert all(LOG_NAME.match(f) for f in files)               # the host's fetch lists them


# --- the worker thread and a full disk ------------------------------------------------------------------------
def test_a_full_disk_is_said_once_counted_and_waited_out_off_the_worker_thread(load, logs, monkeypatch, capsys):
    rt = load(min_free_mb=0, flush_records=8, buffer_records=64)
    clock = [0.0]
    rt._clock = lambda: clock[0]
    disk = Disk(monkeypatch, free=10 * 1024 * MB)
    cycle = counting_worker(rt)
    for i in range(8):
        cycle(i)
    rt.flush()
    assert len(records(logs)) == 8
    spy = Spy(monkeypatch)
    disk.full, disk.free = True, 7 * MB                        # the filesystem fills up
    clock[0] += 1.0
    looks = disk.looks
    spy.active = True
    for i in range(8, 2008):                                    # the writer meets ENOSPC, then waits it out
        cycle(i)
    spy.active = False
    assert spy.seen == []                                       # no disk call on the worker thread, so no block
    rt.flush()
    for _ in range(5):
        rt.flush()                                              # no second look within the second
    assert disk.looks - looks <= 2                              # (the look at the failure, the one of its second)
    stats = rt._stats()
    assert stats["paused"] == "full" and stats["errors"] == 0
    assert stats["dropped"] == 2000 and set(stats["drops"]) <= {"full", "queue"} and stats["drops"]["full"] > 0
    assert stats["buffered"] == 0
    err = capsys.readouterr().err
    said = [l for l in err.splitlines() if "filesystem is full" in l]
    assert said == ["[eaglepatch] the timing log's filesystem is full (7 MB free at %s): not writing until 64 MB "
                    "are free (--min-free-mb 0 + 64); records dropped are counted" % logs]
    assert "Traceback" not in err and "internal error" not in err and "fell behind" not in err
    # space returns: no write before the next look, a second on; then the records go out again, the losses said
    disk.full, disk.free = False, 50 * 1024 * MB
    cycle(2008)
    rt.flush()
    assert rt._stats()["paused"] == "full" and len(records(logs)) == 8     # not looked at yet
    clock[0] += 1.0
    cycle(2009)
    rt.flush()
    recs = records(logs)
    assert [r["accepted"] for r in recs] == list(range(8)) + [2009] and recs[-1]["dropped"] == 2001
    drops = [d for d in parsed(logs / chain(logs)[-1]) if d.get("kind") == "drops"]
    assert len(drops) == 1 and drops[0]["dropped"] == 2001 and sum(drops[0]["reasons"].values()) == 2001
    err = capsys.readouterr().err
    m = re.fullmatch(r"\[eaglepatch\] writing the timing log again \(5119\d MB free at %s\); (\d+) record\(s\) "
                     r"were dropped meanwhile\n" % re.escape(str(logs)), err)
    assert m and stats["drops"]["full"] <= int(m.group(1)) <= 2001, err     # (since the pause: not the queue's before)


def test_enospc_making_the_next_file_is_a_full_disk_too(load, logs, monkeypatch, capsys):
    """No room for the chain's next file: the same pause, no private folder elsewhere (it would be in /tmp)."""
    rt = load()
    rt._WRITER_THREAD = False
    real = os.open

    def no_room(path, flags, *a, **kw):
        if flags & os.O_CREAT:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, flags, *a, **kw)

    monkeypatch.setattr(os, "open", no_room)
    decode_worker(rt).forward_batch_generation(Batch())
    rt.flush()
    stats = rt._stats()
    assert stats["paused"] == "full" and stats["drops"] == {"full": 1} and stats["log_dir"] is None
    err = capsys.readouterr().err
    assert err.startswith("[eaglepatch] the timing log's filesystem is full (") and err.count("\n") == 1


def test_a_failed_write_that_is_not_enospc_is_said_once_too(load, logs, monkeypatch, capsys):
    rt = load()
    rt._WRITER_THREAD = False
    clock = [0.0]
    rt._clock = lambda: clock[0]
    real = os.write

    def eio(fd, data):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "write", eio)
    w = decode_worker(rt)
    for _ in range(5):                                          # tried once a second, failing each time
        w.forward_batch_generation(Batch())
        rt.flush()
        clock[0] += 1.0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "failed ([Errno 5] Input/output error): not writing for now" in err
    assert rt._stats()["drops"] == {"error": 5} and rt._stats()["errors"] == 0
    monkeypatch.setattr(os, "write", real)
    w.forward_batch_generation(Batch())
    rt.flush()
    assert records(logs)[-1]["dropped"] == 5
    assert "writing the timing log again" in capsys.readouterr().err


# --- min_free_mb ------------------------------------------------------------------------------------------------
def test_under_min_free_nothing_is_written_until_it_is_back_above_it_plus_64_mb(load, logs, monkeypatch, capsys):
    rt = load(min_free_mb=100)
    rt._WRITER_THREAD = False
    clock = [0.0]
    rt._clock = lambda: clock[0]
    disk = Disk(monkeypatch, free=150 * MB)
    cycle = counting_worker(rt)

    def step(i, free=None):
        if free is not None:
            disk.free = free * MB
            clock[0] += 1.0                                     # looked at: a second on
        cycle(i)
        rt.flush()
        return [r["accepted"] for r in records(logs)]

    assert step(0) == [0]
    assert step(1, free=90) == [0]                              # under the floor: dropped
    assert step(2, free=120) == [0]                             # over it, not over it + 64 MB
    assert step(3) == [0]
    assert rt._stats()["drops"] == {"min-free": 3} and rt._stats()["paused"] == "min-free"
    assert step(4, free=170) == [0, 4]                          # writing again
    err = capsys.readouterr().err.splitlines()
    assert err == ["[eaglepatch] the timing log's filesystem has 90 MB free at %s, under --min-free-mb 100: not "
                   "writing until 164 MB are free (--min-free-mb 100 + 64); records dropped are counted" % logs,
                   "[eaglepatch] writing the timing log again (169 MB free at %s); 3 record(s) were dropped "
                   "meanwhile" % logs]                          # (170 MB, less what that batch took)
    assert records(logs)[-1]["dropped"] == 3


def test_between_looks_what_was_written_counts_against_the_floor(load, logs, monkeypatch):
    """Free space is looked at once a second; in between, the bytes written are taken off the last look's, so a
    busy writer stops at the floor without a look per batch."""
    rt = load(min_free_mb=100)
    rt._WRITER_THREAD = False
    rt._clock = lambda: 5.0                                     # time stands still: one look only
    disk = Disk(monkeypatch, free=100 * MB + 40 * 1024)
    cycle = counting_worker(rt)
    for i in range(2000):
        cycle(i)
        if i % 50 == 49:
            rt.flush()
    kept = len(records(logs))
    assert disk.looks == 1 and 0 < kept < 2000 and rt._stats()["paused"] == "min-free"
    written = sum((logs / f).stat().st_size for f in chain(logs))
    assert written <= 40 * 1024 and rt._stats()["drops"] == {"min-free": 2000 - kept}


# --- the queue ------------------------------------------------------------------------------------------------
def test_the_queue_to_the_writer_is_bounded_and_its_drops_counted_and_logged(load, logs, monkeypatch):
    rt = load(buffer_records=100, flush_records=10, summary_every=1)
    gate = threading.Event()
    stuck = threading.Event()
    real = os.write

    def slow(fd, data):
        if threading.current_thread().name == "eaglepatch-writer":
            stuck.set()
            gate.wait(30)
        return real(fd, data)

    monkeypatch.setattr(os, "write", slow)
    cycle = counting_worker(rt)
    for i in range(10):
        cycle(i)
    assert stuck.wait(5)
    for i in range(10, 3010):
        cycle(i)
    stats = rt._stats()
    assert stats["buffered"] == 100 and stats["drops"] == {"queue": 3000 - 100}
    assert stats["messages"] <= rt._MAX_MSGS and stats["messages_lost"] > 0
    gate.set()
    rt.flush()
    rt._stop_writer()
    rt._at_exit()
    kept = records(logs)
    assert len(kept) == 110
    drops = [d for f in chain(logs) for d in parsed(logs / f) if d.get("kind") == "drops"]
    assert drops and drops[-1]["reasons"] == {"queue": 2900} and drops[-1]["dropped"] == 2900


def test_a_drops_line_goes_out_with_the_next_batch_at_most_every_10_s(load, logs):
    rt = load(buffer_records=1)
    rt._WRITER_THREAD = False
    clock = [100.0]
    rt._clock = lambda: clock[0]
    w = decode_worker(rt)

    def lose_one():
        w.forward_batch_generation(Batch())
        w.forward_batch_generation(Batch())                     # dropped: the buffer holds one

    def drops_lines():
        return [d for f in chain(logs) for d in parsed(logs / f) if d.get("kind") == "drops"]

    lose_one()
    rt._write_buffered()                                        # a batch: the first loss said with it
    assert [d["dropped"] for d in drops_lines()] == [1]
    lose_one()
    rt._write_buffered()                                        # within 10 s: not yet
    assert [d["dropped"] for d in drops_lines()] == [1]
    clock[0] += 10.0
    lose_one()
    rt._write_buffered()
    assert [d["dropped"] for d in drops_lines()] == [1, 3]
    lose_one()
    rt.flush()                                                  # a flush (and exit) says it at once
    assert [d["dropped"] for d in drops_lines()] == [1, 3, 4]
    rt.flush()                                                  # unchanged: not again
    assert len(drops_lines()) == 3
    d = drops_lines()[-1]
    assert set(d) == {"v", "kind", "t", "host", "pid", "rank", "run", "dropped", "reasons", "log_bytes",
                      "log_files", "removed_files", "removed_bytes", "share_bytes"}
    assert d["reasons"] == {"queue": 4} and d["log_files"] == 1 and d["share_bytes"] == 2048 * MB


# --- the config -------------------------------------------------------------------------------------------------
def test_apply_s_options_reach_the_config_line(tmp_path, clean_env):
    from eaglepatch.errors import UsageError
    from eaglepatch.ops.options import RuntimeOptions
    from eaglepatch.ops.runtime_file import config_change, render_runtime, runtime_config

    src = render_runtime(RuntimeOptions(max_log_mb=300, min_free_mb=50))
    cfg = runtime_config(src.encode())
    assert (cfg["max_log_mb"], cfg["min_free_mb"]) == (300, 50)
    default = runtime_config(render_runtime(RuntimeOptions()).encode())
    assert (default["max_log_mb"], default["min_free_mb"]) == (2048, 1024)
    assert config_change(render_runtime(RuntimeOptions()).encode(), src.encode()) == (
        "max_log_mb 2048 -> 300, min_free_mb 1024 -> 50")
    path = tmp_path / "_eaglepatch_runtime.py"
    path.write_text(src)
    rt = load_module(path)
    assert (rt._stats()["config"]["max_log_mb"], rt._max_log_bytes, rt._min_free_bytes) == (300, 300 * MB, 50 * MB)
    for bad in (dict(max_log_mb=0), dict(min_free_mb=-1)):
        with pytest.raises(UsageError):
            RuntimeOptions(**bad)


def test_the_environment_may_set_the_bounds(monkeypatch, clean_env):
    monkeypatch.setenv("EAGLEPATCH_MAX_LOG_MB", "10")
    monkeypatch.setenv("EAGLEPATCH_MIN_FREE_MB", "0")
    cfg = load_module()._stats()["config"]
    assert (cfg["max_log_mb"], cfg["min_free_mb"]) == (10, 0)


# --- status ---------------------------------------------------------------------------------------------------
def test_status_says_the_logs_size_and_the_drops_of_the_running_servers(load, logs, monkeypatch, tmp_path):
    """status reads the logs by the host's own logs op (here run in this process): every file's size without a byte
    of it, then the head and the last lines of each running rank's newest file for its drops lines."""
    import types

    from eaglepatch.hostside.main import main
    from eaglepatch.ops.inspection import logs_json, render_status
    from eaglepatch.ops.options import RuntimeOptions
    from eaglepatch.ops.runtime_file import render_runtime

    rt = load(max_log_mb=0.25, buffer_records=1)
    rt._WRITER_THREAD = False
    cycle = counting_worker(rt)
    for i in range(3000):
        cycle(i)
        if i % 3 == 0:
            rt.flush()                                          # one of three dropped (the buffer holds one)
    rt.flush()
    (logs / "old-1-rank0.jsonl").write_text("{}\n" * 100)      # another launch's
    calls = []

    class Agents(object):
        def call(self, python, program, payload, timeout=None):
            calls.append(payload)
            return main(payload)

    host = types.SimpleNamespace(name="here", agents=Agents())
    opts = RuntimeOptions(log_dir=str(logs), max_log_mb=300, min_free_mb=20)
    facts = types.SimpleNamespace(runtime_data=render_runtime(opts).encode(), python="python3",
                                  servers=[{"pid": 7, "children": [os.getpid()]}])
    doc = logs_json(host, facts)
    ours = sum((logs / f).stat().st_size for f in chain(logs))
    assert doc["files"] == len(chain(logs)) + 1 and doc["bytes"] == ours + 300
    assert doc["current"] == {"files": len(chain(logs)), "bytes": ours}
    assert (doc["log_dir"], doc["max_log_mb"], doc["min_free_mb"]) == (str(logs), 300, 20)
    assert doc["dropped"] == rt._stats()["dropped"] > 0                   # (the last flush said them all)
    assert doc["reasons"] == {"queue": doc["dropped"]}
    assert len(calls) == 3 and calls[0]["upto"] == {}
    text = render_status({"target": "here", "sglang_version": "0", "package_dir": "/x", "files": [], "servers": [],
                          "logs": doc})
    assert ("  timing logs: %.1f KB in %d file(s) in %s; the running servers': %.1f KB (--max-log-mb 300 per launch, "
            "--min-free-mb 20); %d record(s) dropped (queue %d)" % (
                (ours + 300) / 1024, doc["files"], logs, ours / 1024, doc["dropped"], doc["dropped"])) in text
    facts.runtime_data = None
    assert logs_json(host, facts) is None
