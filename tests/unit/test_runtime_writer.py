"""The timing runtime's writer thread (eaglepatch/runtime/_eaglepatch_runtime.py).

- The worker thread (the one calling the hooks) never blocks on the log and never does file I/O: a stuck write
  leaves its cycles as fast as before, records beyond the buffer are dropped and counted.
- Exit and flush() are bounded: CUDA events are only queried, never synchronised on.
- A quiet server's last records reach the disk without another cycle.

The log directory and files: test_runtime_logfiles.py; the writer's schedule, state by state:
test_runtime_schedule.py; flush() and exit when the writer is stuck or gone: test_runtime_flush.py.
"""
import builtins
import io
import os
import socket
import sys
import threading
import time

import pytest

from runtime_helpers import (
    Batch, Obj, decode_worker, load_module, log_files, records, run_script, wait_until, worker_script,
)
from torch_fakes import FakeTensor


class Gate(object):
    """os.write as a stuck disk: the writer thread's writes block until released; the others pass."""

    def __init__(self, monkeypatch):
        self.real = os.write
        self.open = threading.Event()
        self.blocked = threading.Event()
        self.worker = threading.current_thread()
        monkeypatch.setattr(os, "write", self.write)

    def write(self, fd, data):
        if threading.current_thread() is not self.worker:
            self.blocked.set()
            self.open.wait(30)
        return self.real(fd, data)


# --- 1. the worker thread never blocks and never does I/O ----------------------------------------------------
def test_a_stuck_write_does_not_slow_the_worker_and_drops_are_counted(load, logs, monkeypatch):
    rt = load(buffer_records=256, flush_records=16)
    gate = Gate(monkeypatch)
    w = decode_worker(rt, out=Obj(accept_lens=[1, 1]))
    for _ in range(16):                                     # the first batch: the writer takes it and gets stuck
        w.forward_batch_generation(Batch(2))
    assert gate.blocked.wait(5), "the writer never wrote"
    wait_until(lambda: rt._stats()["buffered"] == 0, what="the writer to take the first batch")
    worst = 0.0
    t0 = time.perf_counter()
    for _ in range(1000):
        t = time.perf_counter()
        w.forward_batch_generation(Batch(2))
        worst = max(worst, time.perf_counter() - t)
    total = time.perf_counter() - t0
    assert worst < 0.05 and total < 2.0, (worst, total)     # the write is stuck; the cycles are not
    stats = rt._stats()
    assert stats["buffered"] == 256 and stats["dropped"] == 1000 - 256
    assert log_files(logs) == [] or records(logs) == []
    w.forward_batch_generation(Batch(3))                    # dropped too: the buffer is still full
    gate.open.set()
    wait_until(lambda: rt._stats()["buffered"] < 256, what="the writer to come back")
    w.forward_batch_generation(Batch(4))                    # the first one kept after the drops
    rt.flush()
    recs = records(logs)
    assert len(recs) == 16 + 256 + 1
    assert [r.get("dropped") for r in recs[:-1]] == [None] * (16 + 256)
    assert recs[-1]["dropped"] == 1000 - 256 + 1 and recs[-1]["bs"] == 4
    assert rt._stats()["dropped"] == 745 and rt._stats()["errors"] == 0


def test_flush_waits_for_a_stuck_writer_at_most_exit_seconds(load, logs, monkeypatch):
    rt = load(exit_seconds=0.3)
    gate = Gate(monkeypatch)
    decode_worker(rt).forward_batch_generation(Batch())
    t0 = time.perf_counter()
    rt.flush()
    assert time.perf_counter() - t0 < 1.0 and gate.blocked.is_set()
    gate.open.set()
    rt.flush()
    assert len(records(logs)) == 1


class IOSpy(object):
    """Records the file-system and stderr calls made on the main (worker) thread while `active`."""

    NAMES = ("open", "write", "read", "close", "fstat", "stat", "lstat", "ftruncate", "makedirs", "mkdir", "chmod",
             "fsync", "listdir", "scandir", "rename", "replace", "unlink", "remove")

    def __init__(self, monkeypatch, gate=None):
        self.main = threading.current_thread()
        self.active = False
        self.seen = []
        self.writer_calls = []
        self.gate = gate
        for name in self.NAMES:
            if hasattr(os, name):
                monkeypatch.setattr(os, name, self.spy("os." + name, getattr(os, name)))
        monkeypatch.setattr(builtins, "open", self.spy("open", builtins.open))
        monkeypatch.setattr(io, "open", self.spy("io.open", io.open))
        spy = self

        class Stderr(object):
            def __init__(self, real):
                self.real = real

            def write(self, text):
                spy.note("sys.stderr.write")
                return self.real.write(text)

            def flush(self):
                spy.note("sys.stderr.flush")
                return self.real.flush()

            def __getattr__(self, name):
                return getattr(self.real, name)

        monkeypatch.setattr(sys, "stderr", Stderr(sys.stderr))

    def note(self, name):
        if threading.current_thread() is self.main:
            if self.active:
                self.seen.append(name)
        else:
            self.writer_calls.append(name)

    def spy(self, name, real):
        def call(*a, **k):
            self.note(name)
            if name == "os.write" and self.gate is not None and threading.current_thread() is not self.main:
                self.gate.wait(30)
            return real(*a, **k)
        return call


def test_the_worker_thread_does_no_file_io(load, logs, monkeypatch, capsys):
    """Hooks, cycle ends, a full buffer (drops), summaries and an internal error: nothing on the worker thread
    opens, writes, stats or prints; the writer thread does it all."""
    gate = threading.Event()
    rt = load(buffer_records=8, flush_records=4, summary_every=3, flush_seconds=0.0)
    spy = IOSpy(monkeypatch, gate)
    w = decode_worker(rt, out=Obj(accept_lens=[2, 2]))
    bad = decode_worker(rt, out=Obj(accept_lens=object()))       # accepted() fails: an internal error
    spy.active = True
    for i in range(60):
        (bad if i == 7 else w).forward_batch_generation(Batch(2))
    rt.begin("draft")                                            # hooks outside a cycle too
    rt.end("draft")
    rt.accepted(Obj(a=[1]), ("a",), 0)
    spy.active = False
    assert spy.seen == [], spy.seen
    assert rt._stats()["dropped"] > 0                            # the buffer did fill
    gate.set()
    rt.flush()
    assert "os.write" in spy.writer_calls and "sys.stderr.write" in spy.writer_calls
    err = capsys.readouterr().err
    assert "internal error in accepted" in err and "dropped" in err and "rank0 EAGLEWorker decode n=3" in err
    recs = records(logs)
    assert len(recs) + rt._stats()["dropped"] == 60
    assert sum(r.get("dropped", 0) for r in recs) <= rt._stats()["dropped"]


def test_dropped_records_are_in_the_summary_line(load, logs, monkeypatch, capsys):
    rt = load(buffer_records=4, flush_records=2, summary_every=20)
    gate = Gate(monkeypatch)
    w = decode_worker(rt)
    for _ in range(2):
        w.forward_batch_generation(Batch())
    assert gate.blocked.wait(5)
    wait_until(lambda: rt._stats()["buffered"] == 0, what="the writer to take the batch")
    for _ in range(18):                                          # 4 kept, 14 dropped, then the summary
        w.forward_batch_generation(Batch())
    gate.open.set()
    rt.flush()
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("[eaglepatch] rank0 EAGLEWorker decode n=20 ")
    assert lines[1] == ("[eaglepatch] rank0 dropped 14 record(s) since the last summary (the log writer fell "
                        "behind)")
    assert len(lines) == 2
    rt._at_exit()
    assert "[eaglepatch] 14 timing record(s) dropped in pid %d" % os.getpid() in capsys.readouterr().err


def test_the_writer_sleeps_when_there_is_nothing_to_do(load, logs, monkeypatch):
    """Woken by an event, never polling: an idle writer makes no rounds at all."""
    rt = load(flush_records=1)
    decode_worker(rt).forward_batch_generation(Batch())
    wait_until(lambda: len(records(logs)) == 1, what="the record")
    rounds = []
    real = rt._service
    monkeypatch.setattr(rt, "_service", lambda: (rounds.append(1), real())[1])
    time.sleep(0.3)
    assert rounds == []
    decode_worker(rt).forward_batch_generation(Batch())          # a record wakes it at once
    wait_until(lambda: len(records(logs)) == 2, what="the second record")
    assert 1 <= len(rounds) <= 3


# --- 2. bounded exit ------------------------------------------------------------------------------------------
class NeverDone(object):
    """A CUDA event of a GPU stuck in a collective: query() is always False; synchronize() would never return."""

    queries = 0

    def __init__(self, enable_timing=False):
        pass

    def record(self, stream=None):
        pass

    def query(self):
        NeverDone.queries += 1
        return False

    def synchronize(self):
        raise AssertionError("synchronize() on a stuck GPU: the process would never exit")

    def elapsed_time(self, other):
        raise AssertionError("elapsed_time() of an event not done")


@pytest.mark.parametrize("writer_thread", [True, False], ids=["writer", "inline"])
def test_exit_gives_up_on_events_that_never_complete(load, logs, fake_torch, capsys, writer_thread):
    fake_torch.cuda.Event = NeverDone
    rt = load(mode="events", exit_seconds=0.4)
    rt._WRITER_THREAD = writer_thread
    w = decode_worker(rt)
    for _ in range(3):
        w.forward_batch_generation(Batch())
    cpu_rt = rt
    t0 = time.perf_counter()
    cpu_rt._at_exit()
    took = time.perf_counter() - t0
    assert 0.2 <= took < 1.0, took
    assert NeverDone.queries > 0 and fake_torch.cuda.syncs == 0
    stats = rt._stats()
    assert stats["pending"] == 0 and stats["dropped"] == 3 and records(logs) == []
    assert "[eaglepatch] 3 timing record(s) dropped in pid %d" % os.getpid() in capsys.readouterr().err


def test_exit_writes_the_events_that_are_done_and_drops_the_others(load, logs, fake_torch):
    rt = load(mode="events", exit_seconds=0.3)
    cuda = fake_torch.cuda
    w = decode_worker(rt)
    cuda.done = False
    w.forward_batch_generation(Batch(1))
    for ev in list(cuda.events):                                # the first cycle's events complete
        ev.completed = True
    w.forward_batch_generation(Batch(2))                        # the second never does
    rt._at_exit()
    recs = records(logs)
    assert [r["bs"] for r in recs] == [1] and rt._stats()["dropped"] == 1


def test_a_process_with_a_stuck_gpu_exits_within_exit_seconds(tmp_path):
    """The real exit path (atexit, a daemon writer thread, interpreter shutdown) with events that never complete."""
    log_dir = tmp_path / "stuck"
    proc_t0 = time.time()
    proc = run_script(sys.executable, """
import sys, time, types
class Ev(object):
    def __init__(self, enable_timing=False): pass
    def record(self, stream=None): pass
    def query(self): return False
    def synchronize(self): time.sleep(3600)
    def elapsed_time(self, other): raise AssertionError
class Dev(object):
    def __enter__(self): return self
    def __exit__(self, *a): return False
torch = types.ModuleType("torch")
torch.Tensor = type("Tensor", (), {})
torch.cuda = types.SimpleNamespace(is_initialized=lambda: True, is_available=lambda: True, current_device=lambda: 0,
                                   Event=Ev, current_stream=lambda: None, synchronize=lambda: time.sleep(3600),
                                   device=lambda i: Dev())
sys.modules["torch"] = torch
""" + worker_script("""
        rt.configure(mode="events", exit_seconds=0.5)
        w = EAGLEWorker()
        for _ in range(4):
            w.forward_batch_generation(Batch())
        print("done")
        """), {"EAGLEPATCH_LOG_DIR": str(log_dir)}, tmp_path)
    took = time.time() - proc_t0
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "done" and took < 20
    assert "[eaglepatch] 4 timing record(s) dropped" in proc.stderr, proc.stderr
    assert records(log_dir) == []


# --- 3. quiet servers -----------------------------------------------------------------------------------------
def test_a_quiet_servers_last_events_records_reach_the_disk(load, logs, fake_torch):
    """events mode: the last cycles' events complete after the last cycle; no further cycle, no flush() call:
    the writer resolves them (query only) and writes them within about flush_seconds."""
    rt = load(mode="events", flush_seconds=0.2, flush_records=1000)
    cuda = fake_torch.cuda
    cuda.done = False
    w = decode_worker(rt, out=Obj(accept_lens=FakeTensor([2, 2])))
    for _ in range(3):
        w.forward_batch_generation(Batch(2))
    time.sleep(0.05)
    assert rt._stats()["pending"] == 3
    t0 = time.time()
    cuda.done = True                                             # the GPU finishes; the server stays quiet
    wait_until(lambda: len(records(logs)) == 3, timeout=5.0, what="the last records")
    assert time.time() - t0 < 0.9             # quiet for 50 ms, looked at every 5 ms, written at flush_seconds
    assert all(r["accepted"] == 4 and r["timer"] == "events" for r in records(logs))
    assert cuda.syncs == 0 and rt._stats()["errors"] == 0


def _spy_queries(cuda, monkeypatch):
    seen = []
    real_query = cuda.Event.query

    def query(ev):
        seen.append((threading.current_thread().name, list(cuda.device_ctx)))
        return real_query(ev)

    monkeypatch.setattr(cuda.Event, "query", query)
    return seen


def test_a_busy_worker_resolves_its_own_cycles(load, logs, fake_torch, monkeypatch):
    """While cycles keep coming, the worker reads the finished ones at each cycle's end (query only; one
    behind, as the GPU is), and the writer makes no CUDA call: it would cost the worker a GIL hand-over each."""
    rt = load(mode="events")
    seen = _spy_queries(fake_torch.cuda, monkeypatch)
    w = decode_worker(rt)
    for _ in range(20):
        w.forward_batch_generation(Batch())
    assert rt._stats()["pending"] == 0 and rt._stats()["buffered"] == 20
    assert seen and set(name for name, _ in seen) == {"MainThread"} and all(ctx == [] for _, ctx in seen)


def test_the_writer_resolves_once_the_worker_is_quiet_inside_its_device(load, logs, fake_torch, monkeypatch):
    """The writer thread has no device of its own: its CUDA calls run inside torch.cuda.device(<worker's>)."""
    rt = load(mode="events", flush_seconds=0.05)
    cuda = fake_torch.cuda
    cuda.done = False
    decode_worker(rt).forward_batch_generation(Batch())
    seen = _spy_queries(cuda, monkeypatch)
    cuda.done = True
    wait_until(lambda: len(records(logs)) == 1, what="the writer to resolve and write the cycle")
    assert seen and all(name == "eaglepatch-writer" and ctx == [0] for name, ctx in seen), seen


# --- internal errors, as printed ---------------------------------------------------------------------------------
def test_an_internal_error_is_printed_once_with_its_last_six_frames(rt, logs, capsys):
    """The worker only notes the frames; the writer prints them, with their source lines, as a traceback."""
    def level0():
        raise RuntimeError("deep down")                         # the source line the writer looks up

    def level1():
        return level0()

    def level2():
        return level1()

    def level3():
        return level2()

    def level4():
        return level3()

    def level5():
        return level4()

    def level6():
        return level5()

    class Deep(object):
        @property
        def accept_lens(self):
            return level6()

    decode_worker(rt, out=Deep()).forward_batch_generation(Batch())
    decode_worker(rt, out=Deep()).forward_batch_generation(Batch())
    rt.flush()
    err = capsys.readouterr().err
    head = ("[eaglepatch] internal error in accepted (the server goes on; further errors of this kind are counted, "
            "not printed):\nTraceback (most recent call last):\n")
    assert err.startswith(head) and err.count("[eaglepatch]") == 1, err
    body = err[len(head):].splitlines()
    assert body[-1] == "RuntimeError: deep down" and err.endswith("deep down\n")
    files = [line.rsplit(" ", 1)[1] for line in body if line.startswith("  File ")]
    assert files == ["level5", "level4", "level3", "level2", "level1", "level0"], body   # accepted, Deep: cut
    assert body[-2].strip() == 'raise RuntimeError("deep down")                         # the source line the ' \
                               'writer looks up'
    assert rt._stats()["errors"] == 2


def test_a_host_without_a_name_is_unknown(clean_env, monkeypatch, tmp_path):
    def no_name():
        raise OSError("no hostname")

    monkeypatch.setattr(socket, "gethostname", no_name)
    rt = load_module()
    try:
        rt.configure(mode="cpu", log_dir=str(tmp_path / "l"), summary_every=0)
        decode_worker(rt).forward_batch_generation(Batch())
        rt.flush()
        assert [r["host"] for r in records(tmp_path / "l")] == ["unknown"]
        assert log_files(tmp_path / "l") == ["unknown-%d-rank0.jsonl" % os.getpid()]
    finally:
        rt._stop_writer()


def test_the_writer_stops_looking_a_while_after_the_last_cycle(load, logs, fake_torch, monkeypatch):
    """events: after the last waiting cycle, the writer keeps looking on a timer for a quarter of a second, then
    sleeps until woken: an idle server costs no wake-ups."""
    rt = load(mode="events")
    decode_worker(rt).forward_batch_generation(Batch())
    rt.flush()
    time.sleep(0.45)
    rounds = []
    real = rt._service
    monkeypatch.setattr(rt, "_service", lambda: (rounds.append(1), real())[1])
    time.sleep(0.3)
    assert rounds == []


def test_configure_leaves_the_file_of_a_stuck_writer_open(load, logs, monkeypatch):
    """A writer stuck in a write keeps its file descriptor: closing it under the writer could give its number to
    another file, which the writer would then write into."""
    rt = load()
    decode_worker(rt).forward_batch_generation(Batch(1))
    rt.flush()                                                  # the file is open now
    fd = rt._fd
    ino = os.fstat(fd).st_ino
    gate = Gate(monkeypatch)
    decode_worker(rt).forward_batch_generation(Batch(2))
    rt.flush()                                                  # returns; the writer stays stuck in its write
    assert gate.blocked.is_set()
    rt.configure(log_dir=str(logs), summary_every=0)            # waits 1 s for the writer, then gives up on it
    assert os.fstat(fd).st_ino == ino
    gate.open.set()
