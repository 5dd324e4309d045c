"""flush(), exit and stopping the writer in the timing runtime (eaglepatch/runtime/_eaglepatch_runtime.py): bounded,
and never file I/O on the caller's thread while a writer can do it.

flush() starts the writer and lets it write; it drains on its own thread only when no thread can be started (at
interpreter shutdown) or the writer died; a writer alive but stuck is given up on after exit_seconds. Exit says
what failed. Stopping a stuck writer waits one second; configure() closes the log unless a stuck writer holds it.
How the timers resolve waiting cycles at exit: test_runtime_writer.py; the drops said at exit: test_runtime_losses.py.

These tests were written to kill mutants of the runtime (docs/mutation-runtime.md).
"""
import errno
import os
import threading
import time
import types

from runtime_helpers import Batch, decode_worker, records, stand_in_writer


# --- flush ---------------------------------------------------------------------------------------------------
def test_flush_writes_on_the_writer_thread_it_starts(load, logs, monkeypatch):
    """flush() with records buffered and no writer running starts the writer, which writes them: the caller (maybe
    the worker's own thread) does no file I/O. Without a thread to start, flush writes them itself and says so
    (True: drained)."""
    rt = load(mode="cpu")
    rt._WRITER_THREAD = False
    decode_worker(rt).forward_batch_generation(Batch())
    rt._WRITER_THREAD = True                        # a writer may be started now; none runs
    writers = []
    real = rt._write_buffered

    def write(*a, **kw):
        writers.append(threading.current_thread())
        return real(*a, **kw)

    monkeypatch.setattr(rt, "_write_buffered", write)
    assert rt._writer is None
    assert rt._flush(False) is True
    assert len(records(logs)) == 1 and writers and threading.current_thread() not in writers
    assert rt._writer is not None


def test_flush_drains_itself_when_no_writer_can_be_started(load, logs, monkeypatch):
    """flush() with no writer running and none that can be started writes the records on its own thread (True)."""
    rt = load(mode="cpu")
    rt._WRITER_THREAD = False
    decode_worker(rt).forward_batch_generation(Batch())
    rt._WRITER_THREAD = True

    def cannot():
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(rt, "_start_writer", cannot)
    assert rt._flush(False) is True and len(records(logs)) == 1
    rt._WRITER_THREAD = False
    decode_worker(rt).forward_batch_generation(Batch())
    assert rt._flush(False) is True and len(records(logs)) == 2


def test_flushes_drain_inline_while_no_thread_can_be_started(load, logs, monkeypatch):
    """At interpreter shutdown a thread cannot be started: each flush writes on its own thread, and the failed
    start leaves no writer behind for the next one to wait on."""
    rt = load(mode="cpu")

    class NoStart(threading.Thread):
        def start(self):
            raise RuntimeError("can't start new thread")

    fake = types.SimpleNamespace(**vars(threading))
    fake.Thread = NoStart
    monkeypatch.setattr(rt, "threading", fake)
    for n in (1, 2):
        rt._WRITER_THREAD = False
        decode_worker(rt).forward_batch_generation(Batch())
        rt._WRITER_THREAD = True
        rt.flush()
        assert rt._writer is None and len(records(logs)) == n
    assert rt._stats()["errors"] == 0


def _buffered_behind(load, writer_alive_s, **kw):
    """A runtime with one record buffered and, as its writer, a thread that never answers a flush request,
    alive for ``writer_alive_s`` seconds."""
    rt = load(mode="cpu", **kw)
    rt._WRITER_THREAD = False
    decode_worker(rt).forward_batch_generation(Batch())
    rt._writer = stand_in_writer(writer_alive_s)
    return rt


def test_flush_returns_true_once_the_writer_has_answered(load, logs):
    """flush() with a writer running: True once the writer has answered, the records written."""
    rt = load(mode="cpu")
    decode_worker(rt).forward_batch_generation(Batch())
    assert rt._writer is not None and rt._writer.is_alive()
    assert rt._flush(False) is True and len(records(logs)) == 1


def test_flush_takes_over_at_once_when_the_writer_dies(load, logs):
    """The requester looks at the writer every 50 ms: one that died without answering is noticed within that,
    and the requester drains the rest itself (True: drained)."""
    rt = _buffered_behind(load, 0.1, exit_seconds=5.0)
    t0 = time.time()
    assert rt._flush(False) is True
    assert time.time() - t0 < 0.6 and len(records(logs)) == 1


def test_flush_gives_up_on_a_stuck_writer_and_does_not_write_itself(load, logs):
    """A writer alive but stuck (a hung disk): the requester waits exit_seconds, then returns False (the caller
    counts what is lost); it does not write on its own thread, which the same disk would hang too."""
    rt = _buffered_behind(load, 3.0, exit_seconds=0.3)
    t0 = time.time()
    assert rt._flush(False) is False
    assert 0.25 < time.time() - t0 < 1.5
    assert records(logs) == [] and rt._stats()["buffered"] == 1
    rt._writer = None


# --- exit, and stopping the writer ---------------------------------------------------------------------------
def test_exit_survives_a_failing_flush_and_says_so(load, logs, monkeypatch, capsys):
    """A flush that raises at exit: printed at once (there is no later), counted, and what is buffered is not
    counted as dropped (the flush may have written it)."""
    rt = load(mode="cpu")
    rt._WRITER_THREAD = False
    decode_worker(rt).forward_batch_generation(Batch())

    def broken(final):
        raise OSError("disk on fire")

    monkeypatch.setattr(rt, "_flush", broken)
    rt._at_exit()
    err = capsys.readouterr().err
    assert err.startswith("[eaglepatch] internal error in flush (the server goes on;") and "disk on fire" in err
    assert err.endswith("\n[eaglepatch] 1 internal error(s) in pid %d; timing records may be missing\n" % os.getpid())
    assert "dropped" not in err and rt._stats()["dropped"] == 0


def test_stopping_a_stuck_writer_waits_one_second_for_it(rt):
    """Stopping a writer that does not end waits one second for it, then lets it go (no writer left)."""
    joins = []

    class Stuck(object):
        def is_alive(self):
            return True

        def join(self, timeout=None):
            joins.append(timeout)

    rt._writer = Stuck()
    assert rt._stop_writer() is True and joins == [1.0] and rt._writer is None


def test_configure_closes_the_log_when_no_writer_runs(load, logs):
    """Nothing to stop (no writer thread, or none left): configure closes the log file; only a stuck writer's is
    left open."""
    rt = load(mode="cpu")
    rt._WRITER_THREAD = False
    decode_worker(rt).forward_batch_generation(Batch())
    rt.flush()
    fd = rt._fd
    ino = os.fstat(fd).st_ino
    assert rt._stop_writer() is False
    rt.configure(mode="cpu", log_dir=str(logs), summary_every=0)
    try:
        assert os.fstat(fd).st_ino != ino           # the number went to another file
    except OSError as e:
        assert e.errno == errno.EBADF
