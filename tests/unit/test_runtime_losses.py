"""Records the timing runtime loses, and how it counts them (eaglepatch/runtime/_eaglepatch_runtime.py).

A record is dropped, never waited for, when the buffer is full, when too many cycles wait for their CUDA events, when
its events cannot be read, or when its write fails. Every loss is counted: the next record written carries the
count of those lost before it ("dropped"), also when the record that carried them is lost in turn, and exit says
the total in one stderr line (the summary line's count: test_runtime_summary.py).

Several of these tests were written to kill mutants of the runtime (docs/mutation-runtime.md).
"""
import errno
import os
import tempfile
import threading

from runtime_helpers import Batch, decode_worker, records, stand_in_writer, wait_until


# --- carried by the next record ------------------------------------------------------------------------------
def test_losses_before_a_record_add_up(load, logs, monkeypatch, capsys):
    """Two failed batches in a row, then a good one: its first record carries both losses, and so does the
    summary line."""
    rt = load(summary_every=6)
    rt._FREE_CHECK_SECONDS = 0.0                                 # a failed write is tried again at once
    w = decode_worker(rt)
    real = os.write
    fail = {"n": 2}

    def enospc(fd, data):
        if fail["n"] and threading.current_thread().name == "eaglepatch-writer":
            fail["n"] -= 1
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data)

    monkeypatch.setattr(os, "write", enospc)
    for batch in (2, 3):
        for _ in range(batch):
            w.forward_batch_generation(Batch(1))
        rt.flush()
    w.forward_batch_generation(Batch(4))
    rt.flush()
    assert [(r["bs"], r["dropped"]) for r in records(logs)] == [(4, 5)]
    assert rt._stats()["dropped"] == 5
    err = capsys.readouterr().err
    assert "[eaglepatch] rank0 dropped 5 record(s) since the last summary" in err, err


def test_records_lost_in_a_failed_write_pass_on_the_losses_they_carried(load, logs, monkeypatch):
    """A record carries the count of those lost before it ("dropped"); when it is lost itself, the next record
    written reports both."""
    rt = load(flush_records=100)
    rt._FREE_CHECK_SECONDS = 0.0                                 # a failed write is tried again at once
    w = decode_worker(rt)
    w.forward_batch_generation(Batch(1))
    rt.flush()                                                   # the file is open, its header written
    for bs in (2, 3, 4):
        w.forward_batch_generation(Batch(bs))
    with rt._lock:
        t, tail, lost = rt._buf[1]
        rt._buf[1] = (t, tail, 7)                                # bs 3 carries 7 earlier losses
    real = os.write

    def enospc_in_the_second_line(fd, data):
        data = bytes(data)
        real(fd, data[:data.index(b"\n") + 5])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", enospc_in_the_second_line)
    rt.flush()
    monkeypatch.undo()
    w.forward_batch_generation(Batch(5))
    rt.flush()
    recs = records(logs)
    assert [r["bs"] for r in recs] == [1, 2, 5]
    assert recs[-1]["dropped"] == 2 + 7 and rt._stats()["dropped"] == 2


def test_records_that_cannot_be_written_anywhere_are_counted_lost(load, tmp_path, monkeypatch, capsys):
    """The log dir unusable and no fallback dir either: the batch is dropped and counted, the error said."""
    (tmp_path / "file").write_text("x")

    def no_tmp(*a, **kw):
        raise OSError(errno.EACCES, "Permission denied")         # (ENOSPC: a full disk, test_runtime_bounds.py)

    monkeypatch.setattr(tempfile, "mkdtemp", no_tmp)
    rt = load(log_dir=str(tmp_path / "file"), flush_records=100)
    w = decode_worker(rt)
    for bs in (1, 2):
        w.forward_batch_generation(Batch(bs))
    with rt._lock:
        t, tail, lost = rt._buf[1]
        rt._buf[1] = (t, tail, 4)
    rt.flush()
    stats = rt._stats()
    assert stats["dropped"] == 2 and stats["errors"] == 1 and stats["buffered"] == 0
    assert rt._lost == 2 + 4
    assert "[eaglepatch] internal error in flush " in capsys.readouterr().err


def test_a_record_dropped_on_a_full_buffer_passes_on_the_losses_it_carried(load, logs, fake_torch):
    """Cycles dropped while waiting for their events are carried by the next cycle; when that one is dropped too
    (the buffer is full), the next record written carries them all, and itself."""
    rt = load(mode="events", buffer_records=1)
    rt._WRITER_THREAD = False
    rt._MAX_PENDING = 1
    cuda = fake_torch.cuda
    w = decode_worker(rt)
    cuda.done = False
    w.forward_batch_generation(Batch())             # A: waits for its events
    w.forward_batch_generation(Batch())             # B: dropped (one waits already); C carries it
    cuda.done = True
    w.forward_batch_generation(Batch())             # C: dropped too; A is resolved and fills the buffer
    w.forward_batch_generation(Batch())             # D: carries B and C; dropped (the buffer is full)
    rt.flush()                                      # A written
    w.forward_batch_generation(Batch())             # E: carries B, C and D
    rt.flush()
    assert [r.get("dropped", 0) for r in records(logs)] == [0, 3]
    assert rt._stats()["dropped"] == 3


# --- cycles waiting for their CUDA events --------------------------------------------------------------------
def test_outstanding_cycles_are_bounded(load, logs, fake_torch):
    """A GPU hundreds of cycles behind (here: never done) does not grow memory without bound, and is never waited
    for on the worker thread: cycles beyond the bound are dropped and counted; the next record written says so."""
    rt = load(mode="events")
    rt._MAX_PENDING = 3
    cuda = fake_torch.cuda
    w = decode_worker(rt)
    cuda.done = False
    for _ in range(3):
        w.forward_batch_generation(Batch())
    assert rt._stats()["pending"] == 3
    w.forward_batch_generation(Batch())                         # the 4th: dropped, nothing waited for
    w.forward_batch_generation(Batch(2))                        # the 5th too
    assert rt._stats()["pending"] == 3 and rt._stats()["dropped"] == 2 and cuda.syncs == 0
    cuda.done = True
    wait_until(lambda: rt._stats()["pending"] == 0, what="the writer to resolve the three")
    w.forward_batch_generation(Batch(3))
    rt.flush()
    recs = records(logs)
    assert [r.get("dropped") for r in recs] == [None, None, None, 2]
    assert [r["bs"] for r in recs] == [4, 4, 4, 3] and rt._stats()["errors"] == 0


def test_at_most_1024_cycles_wait_for_their_events_by_default(load, logs, fake_torch):
    """docs/design.md's bound, as shipped: a GPU that never catches up holds 1024 cycles; the 1025th is dropped
    and counted, nothing waited for."""
    rt = load(mode="events")
    rt._WRITER_THREAD = False
    fake_torch.cuda.done = False
    w = decode_worker(rt)
    for _ in range(1024):
        w.forward_batch_generation(Batch())
    assert rt._stats()["pending"] == 1024 and rt._stats()["dropped"] == 0
    w.forward_batch_generation(Batch())
    assert rt._stats()["pending"] == 1024 and rt._stats()["dropped"] == 1 and fake_torch.cuda.syncs == 0


def test_cycles_dropped_while_pending_are_counted_on_the_next_record(load, logs, fake_torch):
    rt = load(mode="events")
    rt._MAX_PENDING = 1
    cuda = fake_torch.cuda
    cuda.done = False
    w = decode_worker(rt)
    w.forward_batch_generation(Batch(1))
    w.forward_batch_generation(Batch(2))                         # dropped
    cuda.done = True
    wait_until(lambda: rt._stats()["pending"] == 0, what="the first cycle resolved")
    w.forward_batch_generation(Batch(3))
    rt.flush()
    assert [(r["bs"], r.get("dropped")) for r in records(logs)] == [(1, None), (3, 1)]


def test_cycles_that_cannot_be_read_are_dropped_once_and_counted(load, logs, fake_torch, monkeypatch, capsys):
    """A waiting cycle whose events cannot be read is dropped (one record lost, carried by the next record) and
    said as an events error, never retried; two in a row are both carried."""
    rt = load(mode="events")
    rt._WRITER_THREAD = False
    real = rt._resolve

    def broken(c):
        raise RuntimeError("event destroyed")

    monkeypatch.setattr(rt, "_resolve", broken)
    w = decode_worker(rt)
    w.forward_batch_generation(Batch())
    assert rt._stats()["pending"] == 0 and rt._stats()["dropped"] == 1
    w.forward_batch_generation(Batch())
    assert rt._stats()["pending"] == 0 and rt._stats()["dropped"] == 2
    monkeypatch.setattr(rt, "_resolve", real)
    w.forward_batch_generation(Batch())
    rt.flush()
    assert [r.get("dropped", 0) for r in records(logs)] == [2]
    err = capsys.readouterr().err
    assert err.startswith("[eaglepatch] internal error in events (the server goes on;") and "event destroyed" in err


# --- said at exit --------------------------------------------------------------------------------------------
def _dropped_line(n, why, stuck=False):
    return ("[eaglepatch] %d timing record(s) dropped in pid %d (%s%s)\n"
            % (n, os.getpid(), why, "; the writer was still stuck at exit" if stuck else ""))


def test_exit_says_how_many_records_were_dropped(load, logs, capsys):
    """At exit, the records dropped (here on a full buffer) are said in one stderr line, compared whole."""
    rt = load(mode="cpu", buffer_records=1)
    rt._WRITER_THREAD = False
    w = decode_worker(rt)
    w.forward_batch_generation(Batch())
    w.forward_batch_generation(Batch())             # dropped: the buffer holds one
    rt._at_exit()
    assert capsys.readouterr().err == _dropped_line(1, "the log writer fell behind") and len(records(logs)) == 1


def test_exit_with_a_stuck_writer_counts_what_it_holds_as_dropped(load, logs, fake_torch, capsys):
    """The writer is stuck (a hung disk): exit gives up after exit_seconds; the records buffered and the cycles
    still waiting are lost, counted and said, with the reason."""
    rt = load(mode="events", exit_seconds=0.3)
    rt._WRITER_THREAD = False
    w = decode_worker(rt)
    w.forward_batch_generation(Batch())
    w.forward_batch_generation(Batch())             # two records buffered
    fake_torch.cuda.done = False
    w.forward_batch_generation(Batch())             # one cycle waits for its events
    rt._writer = stand_in_writer(3.0)
    rt._at_exit()
    rt._writer = None
    assert capsys.readouterr().err == _dropped_line(3, "not written by exit", stuck=True)
    assert records(logs) == [] and rt._stats()["dropped"] == 3
