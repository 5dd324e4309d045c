"""When the timing runtime's writer thread wakes, sleeps and looks at waiting cycles
(eaglepatch/runtime/_eaglepatch_runtime.py).

The worker's thread only buffers; one writer thread writes. It is woken only when a batch or a summary falls due
(not per record), sleeps until then (idle, no timeout, when nothing is due), handles what is due before any wait,
looks at cycles waiting for their CUDA events once the worker is quiet and lingers a while after them, and never
goes round without waiting (a busy poll). Most tests run the writer's loop on the test's thread, round by round
(``_writer_rounds``), each wait recorded: the policy, state by state.

These tests were written to kill mutants of the runtime (docs/mutation-runtime.md).
"""
import sys
import threading
import time

import pytest

from runtime_helpers import Batch, decode_worker, records, wait_until


# --- what wakes the writer -----------------------------------------------------------------------------------
class _CountingEvent(threading.Event):
    """The writer's wake-up event, counting each set()."""

    def __init__(self):
        threading.Event.__init__(self)
        self.sets = 0

    def set(self):
        self.sets += 1
        threading.Event.set(self)


def test_a_record_wakes_the_writer_only_when_its_batch_is_due(load, logs):
    """A busy worker does not wake the writer cycle after cycle: a record buffered wakes it when the buffer reaches
    flush_records (or when it is the first one and the writer sleeps with nothing to do: not the case here); a
    record dropped on a full buffer does not wake it either (it is behind, busy writing)."""
    rt = load(mode="cpu", flush_records=3, buffer_records=4)
    rt._WRITER_THREAD = False                       # no writer: none is idle, nothing drains the buffer
    rt._wake = wake = _CountingEvent()
    w = decode_worker(rt)
    seen = []
    for _ in range(6):
        w.forward_batch_generation(Batch())
        seen.append(wake.sets)
    assert seen == [0, 0, 1, 1, 1, 1]               # the 5th and 6th are dropped
    rt.flush()
    assert len(records(logs)) == 4 and rt._stats()["dropped"] == 2
    assert rt._stats()["records"] == 6                 # every record made counts, dropped or not


def test_a_summary_falling_due_wakes_the_writer(load, capsys):
    """The summary line is printed when its window fills, by the writer woken for it, not at the next batch."""
    rt = load(mode="cpu", summary_every=2, flush_records=1000, flush_seconds=600.0)
    w = decode_worker(rt)
    w.forward_batch_generation(Batch())                 # wakes the idle writer (its first record), which sleeps again

    def asleep():
        if not (rt._writer_idle and not rt._wake.is_set()):
            return False
        time.sleep(0.2)                                 # still so a while later: not on its way round
        return rt._writer_idle and not rt._wake.is_set()

    wait_until(asleep, what="the writer asleep with nothing due")
    w.forward_batch_generation(Batch())                 # the window is full
    err = []

    def printed():
        err.append(capsys.readouterr().err)
        return "n=2 cycle" in "".join(err)

    wait_until(printed, timeout=5.0, what="the summary line")
    assert len(records(rt._stats()["log_dir"])) == 0    # the records themselves wait for their batch


def test_an_internal_error_starts_the_writer_that_prints_it(load, capsys):
    """No writer running yet (nothing timed so far): the error's message is printed without a flush, by the
    writer thread the error starts."""
    rt = load(mode="cpu")
    assert rt._writer is None
    try:
        raise ValueError("early trouble")
    except ValueError:
        rt._error("test")
    assert rt._writer is not None
    printed = []
    wait_until(lambda: printed.append(capsys.readouterr().err) or "ValueError: early trouble" in "".join(printed),
               what="the writer to print the error")
    assert "".join(printed).startswith("[eaglepatch] internal error in test (the server goes on;")


def test_a_writer_started_on_a_buffer_not_due_waits_for_its_batch(load, logs):
    """A writer (re)started (after configure or a fork) has no flush request to answer: the records it finds
    wait for their batch (flush_records, flush_seconds) or a flush."""
    rt = load(mode="cpu", flush_records=1000, flush_seconds=600.0)
    rt._WRITER_THREAD = False
    decode_worker(rt).forward_batch_generation(Batch())
    rt._WRITER_THREAD = True
    rt._start_writer()
    time.sleep(0.3)
    assert records(logs) == [] and rt._stats()["buffered"] == 1
    rt.flush()
    assert len(records(logs)) == 1


# --- the writer's loop, round by round -----------------------------------------------------------------------
def _writer_rounds(rt, rounds=1, on_wait=None):
    """Run the writer's loop (``_writer_main``) on a thread of the test until it has waited ``rounds`` times, each
    wait recorded as (timeout, records buffered, messages queued, whether it said it was idle) and returning at
    once: the policy the writer follows, state by state. Fails when the loop goes round for 2 s without waiting:
    a busy poll."""
    waits = []
    me = threading.Thread(target=lambda: None)      # stands for the writer thread: its identity only

    class Wake(threading.Event):
        def wait(self, timeout=None):
            waits.append((timeout, len(rt._buf), len(rt._msgs), rt._writer_idle))
            if on_wait is not None:
                on_wait(len(waits))
            if len(waits) >= rounds:
                rt._writer = None                   # the loop ends after this round
            return False

    rt._wake = Wake()
    rt._writer = me
    t = threading.Thread(target=rt._writer_main, args=([me],), daemon=True)
    t.start()
    t.join(2.0)
    spinning = t.is_alive()
    rt._writer = None
    t.join(2.0)
    assert not spinning, "the writer loop went round without waiting (a busy poll): %r" % waits
    return waits


@pytest.fixture
def quiet(load):
    """A runtime with no writer thread of its own (the test runs the writer's loop itself)."""
    def _quiet(**kw):
        kw.setdefault("flush_records", 1000)
        rt = load(**kw)
        rt._WRITER_THREAD = False
        return rt
    return _quiet


def test_the_writer_with_nothing_to_do_sleeps_until_woken(quiet):
    """Nothing buffered, nothing waiting: the writer sleeps with no timeout, idle, until woken."""
    rt = quiet(mode="cpu")
    assert _writer_rounds(rt) == [(None, 0, 0, True)]


def test_the_writer_sleeps_until_the_buffer_falls_due_and_no_longer(quiet, logs):
    """A buffer not due: the writer sleeps (idle) until flush_seconds after its first record, to the millisecond
    (half a second here: not rounded up to a second, never a busy poll), then writes it."""
    rt = quiet(mode="cpu", flush_seconds=600.0)
    decode_worker(rt).forward_batch_generation(Batch())
    rt._buf_since = rt._mono() - 599.5
    (timeout, buffered, msgs, idle), = _writer_rounds(rt)
    assert 0.3 < timeout <= 0.5 and buffered == 1 and idle
    rt._buf_since = rt._mono() - 600.0               # now due: written in the next round, then nothing to do
    assert _writer_rounds(rt) == [(None, 0, 0, True)]
    assert len(records(logs)) == 1


def test_an_adaptive_servers_writer_sleeps_no_longer_than_its_next_look_for_a_lease(quiet):
    """Once an adaptive worker has run, the writer looks for a live sweep's lease on its own: with nothing to do it
    sleeps until its next look, not until woken; with a batch not due, until whichever comes first."""
    rt = quiet(mode="cpu")
    rt._live_watch = True
    rt._live_next = rt._mono() + 0.4
    (timeout, buffered, msgs, idle), = _writer_rounds(rt)
    assert 0.2 < timeout <= 0.4 and buffered == 0 and idle
    decode_worker(rt).forward_batch_generation(Batch())
    rt._live_next = rt._mono() + 0.4
    (timeout, buffered, msgs, idle), = _writer_rounds(rt)
    assert 0.2 < timeout <= 0.4 and buffered == 1


def test_a_batch_is_due_at_flush_seconds_to_the_tick(load, monkeypatch):
    """A batch falls due flush_seconds after its first record, to the tick (a scripted clock): not before."""
    rt = load(mode="cpu", flush_seconds=600.0, flush_records=1000)
    rt._WRITER_THREAD = False
    decode_worker(rt).forward_batch_generation(Batch())
    monkeypatch.setattr(rt, "_mono", lambda: 1000.0)
    rt._buf_since = 400.5
    assert not rt._due()
    rt._buf_since = 400.0
    assert rt._due()


@pytest.mark.parametrize("what", ["a due batch", "a message"])
def test_a_due_batch_or_a_message_is_handled_before_any_wait(quiet, logs, fake_torch, capsys, what):
    """flush_records buffered, or a message queued: written or printed at once, even while cycles wait for their
    events (which the writer would otherwise look at on a timer first)."""
    rt = quiet(mode="events", flush_records=2)
    w = decode_worker(rt)
    w.forward_batch_generation(Batch())
    if what == "a due batch":
        w.forward_batch_generation(Batch())         # two records buffered: a batch is due
    else:
        try:
            raise ValueError("boom")
        except ValueError:
            rt._error("test")                       # a message queued
    fake_torch.cuda.done = False
    w.forward_batch_generation(Batch())             # one cycle waits for its events
    rt._last_end = rt._mono() - 1.0
    (timeout, buffered, msgs, idle), = _writer_rounds(rt)
    assert timeout == rt._POLL_SECONDS and not idle
    if what == "a due batch":
        assert (buffered, msgs) == (0, 0) and len(records(logs)) == 2
    else:
        assert (buffered, msgs) == (1, 0) and "ValueError: boom" in capsys.readouterr().err


def test_a_flush_request_is_answered_once_with_time_left_for_the_write(quiet, monkeypatch):
    """The writer drains for the requester until its deadline less a quarter of the time left, at most 0.5 s
    (the write itself needs some), answers the request once, then sleeps."""
    rt = quiet(mode="cpu")
    deadlines = []
    monkeypatch.setattr(rt, "_drain", lambda deadline, final: deadlines.append((deadline, final)))
    for left, kept in ((8.0, 0.5), (1.6, 0.4)):
        deadlines[:] = []
        until = rt._mono() + left
        rt._flush_until, rt._flush_final = until, True
        rt._flush_req += 1
        assert _writer_rounds(rt) == [(None, 0, 0, True)]
        assert len(deadlines) == 1 and deadlines[0][1] is True
        assert abs((until - deadlines[0][0]) - kept) < 0.02, (left, until - deadlines[0][0])
        assert rt._flush_ack == rt._flush_req


def test_a_failing_writer_round_is_said_at_once_and_retried_soon(quiet, monkeypatch, capsys):
    """An exception in the writer's work is counted and printed at once (the writer prints its own error: queued,
    it would wait behind the failing work), and the loop pauses 10 ms before the next round, not longer."""
    rt = quiet(mode="cpu")

    def broken():
        raise OSError("disk on fire")

    monkeypatch.setattr(rt, "_service", broken)
    t0 = time.time()
    waits = _writer_rounds(rt, rounds=2)
    assert time.time() - t0 < 0.5 and len(waits) == 2
    err = capsys.readouterr().err
    assert err.startswith("[eaglepatch] internal error in writer (the server goes on;") and "disk on fire" in err
    assert rt._stats()["errors"] == 1 and not rt._msgs


# --- cycles waiting for their CUDA events --------------------------------------------------------------------
def test_waiting_cycles_are_looked_at_once_the_worker_is_quiet(quiet, fake_torch):
    """Cycles waiting for their events: the writer (not idle: a cycle queued need not wake it) looks at them
    _QUIET_SECONDS after the worker's last cycle ended, then every _POLL_SECONDS."""
    rt = quiet(mode="events")
    fake_torch.cuda.done = False
    decode_worker(rt).forward_batch_generation(Batch())
    rt._last_end = rt._mono() + 1.0                 # the worker's last cycle "ends" a second from now
    (timeout, buffered, msgs, idle), = _writer_rounds(rt)
    assert 1.0 < timeout <= 1.0 + rt._QUIET_SECONDS and not idle
    rt._last_end = rt._mono() - 1.0
    (timeout, buffered, msgs, idle), = _writer_rounds(rt)
    assert timeout == rt._POLL_SECONDS and not idle


def test_the_writer_leaves_waiting_cycles_to_a_busy_worker(quiet, fake_torch, monkeypatch):
    """A writer round resolves the waiting cycles only once the worker's last cycle ended _QUIET_SECONDS ago (to
    the tick): before, the worker is busy and resolves its own at its next cycle's end."""
    rt = quiet(mode="events")
    cuda = fake_torch.cuda
    cuda.done = False
    decode_worker(rt).forward_batch_generation(Batch())
    cuda.done = True                                # done, but not looked at yet
    clock = [10.04]
    monkeypatch.setattr(rt, "_mono", lambda: clock[0])
    rt._last_end = 10.0
    rt._service()
    assert rt._stats()["pending"] == 1
    rt._last_end, clock[0] = 0.0, 0.0499
    rt._service()
    assert rt._stats()["pending"] == 1
    clock[0] = rt._QUIET_SECONDS
    rt._service()
    assert rt._stats()["pending"] == 0 and rt._stats()["buffered"] == 1


def test_after_the_last_waiting_cycle_the_writer_keeps_looking_on_a_timer(quiet, fake_torch, logs):
    """Once the cycles that waited are resolved, more are likely: for _LINGER_SECONDS the writer looks every
    _QUIET_SECONDS (not idle, so the worker need not wake it for each cycle), then sleeps until woken."""
    rt = quiet(mode="events")
    cuda = fake_torch.cuda
    cuda.done = False
    decode_worker(rt).forward_batch_generation(Batch())
    rt._last_end = rt._mono() - 1.0

    def on_wait(n):
        if n == 1:
            cuda.done = True                        # the GPU catches up
        elif n == 2:
            time.sleep(rt._LINGER_SECONDS)          # and no cycle comes for a while

    waits = _writer_rounds(rt, rounds=3, on_wait=on_wait)
    assert waits[0][0] == rt._POLL_SECONDS          # round 1: the cycle waits for its events
    assert waits[1] == (rt._QUIET_SECONDS, 1, 0, False)     # round 2: resolved (buffered), lingering
    assert waits[2][1:] == (1, 0, True) and waits[2][0] > 500   # round 3: idle until the batch is due


def test_the_writer_lingers_a_quarter_of_a_second_after_the_last_waiting_cycle(quiet, fake_torch, monkeypatch):
    """On the writer's clock: still looking on a timer 0.24 s after it last saw a waiting cycle, asleep until
    woken (idle) at 0.26 s."""
    rt = quiet(mode="events", flush_seconds=600.0)
    clock = [rt._mono()]
    monkeypatch.setattr(rt, "_mono", lambda: clock[0])
    cuda = fake_torch.cuda
    cuda.done = False
    decode_worker(rt).forward_batch_generation(Batch())
    rt._last_end = clock[0] - 1.0

    def on_wait(n):
        if n == 1:
            cuda.done = True                        # resolved in the next round
        elif n == 2:
            clock[0] += 0.24
        elif n == 3:
            clock[0] += 0.02

    waits = _writer_rounds(rt, rounds=4, on_wait=on_wait)
    assert waits[0][0] == rt._POLL_SECONDS
    assert waits[1] == waits[2] == (rt._QUIET_SECONDS, 1, 0, False)
    assert waits[3][1:] == (1, 0, True)


def test_the_writer_is_not_idle_once_it_has_work(quiet, fake_torch):
    """Woken from its idle sleep, the writer clears its idle flag: while cycles wait, the worker need not wake it."""
    rt = quiet(mode="events")
    cuda = fake_torch.cuda
    w = decode_worker(rt)

    def on_wait(n):
        cuda.done = False
        w.forward_batch_generation(Batch())         # a cycle now waits
        rt._last_end = rt._mono() - 1.0

    waits = _writer_rounds(rt, rounds=2, on_wait=on_wait)
    assert waits[0] == (None, 0, 0, True) and not waits[1][3]


# --- work queued as the writer goes idle ---------------------------------------------------------------------
def _at_idle_line(rt, action):
    """A trace for the writer's thread: ``action()`` runs once, just before the writer says it is idle (after its
    first look at the work, before its second): work that another thread queues in that window."""
    target = "_writer_idle = True         # first say so"
    lineno = next(i for i, line in enumerate(open(rt.__file__).read().splitlines(), 1) if target in line)
    done = []

    def trace(frame, event, arg):
        if frame.f_code.co_name != "_writer_main":
            return None
        if event == "line" and frame.f_lineno == lineno and not done:
            done.append(1)
            action()
        return trace

    return trace


def _traced_rounds(rt, trace, **kw):
    """``_writer_rounds`` with ``trace`` set on the writer's thread (``sys.settrace`` there)."""
    main = rt._writer_main

    def traced(box):
        sys.settrace(trace)
        try:
            main(box)
        finally:
            sys.settrace(None)

    rt._writer_main = traced
    try:
        return _writer_rounds(rt, **kw)
    finally:
        rt._writer_main = main


@pytest.mark.parametrize("what", ["a message", "a flush request", "a waiting cycle", "the batch"])
def test_work_queued_as_the_writer_goes_idle_is_seen_before_it_sleeps(quiet, logs, fake_torch, what):
    """The writer first says it is idle, then looks again: what another thread queues in between (no wake-up
    needed, the writer was not idle yet) is handled, not slept on."""
    rt = quiet(mode="events", flush_records=2, flush_seconds=600.0)
    w = decode_worker(rt)
    w.forward_batch_generation(Batch())             # one record buffered, not due: the writer would sleep
    cuda = fake_torch.cuda

    def queue():
        if what == "a message":
            rt._msgs.append(("summary", {}, 1))
        elif what == "a flush request":
            rt._flush_until = rt._mono() + 5.0
            rt._flush_req += 1
        elif what == "a waiting cycle":
            cuda.done = False
            w.forward_batch_generation(Batch())
            rt._last_end = rt._mono() - 1.0
        else:
            w.forward_batch_generation(Batch())     # the second record: flush_records reached

    waits = _traced_rounds(rt, _at_idle_line(rt, queue))
    (timeout, buffered, msgs, idle), = waits        # the first sleep comes after the work was handled
    if what == "a message":
        assert msgs == 0, waits
    elif what == "a flush request":
        assert buffered == 0 and len(records(logs)) == 1 and rt._flush_ack == rt._flush_req, waits
    elif what == "a waiting cycle":
        assert timeout == rt._POLL_SECONDS and not idle, waits
    else:
        assert buffered == 0 and len(records(logs)) == 2, waits
