"""The CUDA timers of the timing runtime (eaglepatch/runtime/_eaglepatch_runtime.py), against a fake torch
(torch_fakes.py): what they measure, and how their events are recorded, pooled and resolved.

- sync: a synchronize at every phase boundary, the time read on the host.
- events: CUDA events recorded on the current stream, read later (query only, never a host sync), with the host's
  own times beside the GPU's; events and pinned buffers reused from bounded pools, streams looked up once.
- Without CUDA both fall back to the cpu timer. Graph capture and mode "auto": test_runtime_cuda.py; the cycles
  that wait for their events: test_runtime_losses.py and test_runtime_schedule.py.

Several of these tests were written to kill mutants of the runtime (docs/mutation-runtime.md).
"""
import threading
import time

import pytest

from runtime_helpers import (
    RECORD_KEYS, STEPS, Batch, Obj, decode_worker, one_record, records, scripted_worker, wait_until,
)
from torch_fakes import FakeTensor, FakeTensorCpu


# --- what the timers measure ---------------------------------------------------------------------------------
def test_sync_timer_synchronizes_at_every_boundary(load, logs, fake_torch):
    rt = load(mode="sync")
    decode_worker(rt, sleeps=(0.001, 0.001, 0.001), out=Obj(accept_lens=[2, 2])).forward_batch_generation(Batch(2))
    assert fake_torch.cuda.syncs == 8                          # cycle start/end + 3 x (begin, end)
    rec = one_record(rt, logs)
    assert rec["timer"] == "sync" and set(rec) == RECORD_KEYS | {"accepts"}
    assert rec["accepts"] == [2, 2]
    assert rec["rank"] == 1                                     # torch.distributed says so
    assert rec["phases"]["draft"] >= 1.0
    assert sum(rec["phases"].values()) <= rec["cycle_ms"] < 1000


@pytest.mark.parametrize("mode", ["sync", "events"])
def test_a_repeated_phase_accumulates(load, logs, fake_torch, mode):
    rt = load(mode=mode)

    class W(object):
        @rt.entry
        def forward_batch_generation(self, batch):
            for _ in range(2):
                rt.begin("draft", "decode")
                time.sleep(0.003)
                rt.end("draft")
                time.sleep(0.003)

    W().forward_batch_generation(Batch())
    rec = one_record(rt, logs)
    assert 6.0 <= rec["phases"]["draft"] < rec["cycle_ms"] and rec["cycle_ms"] >= 12.0
    if mode == "events":    # both intervals, on the GPU (the fake's time is the host's x gpu_factor) and the host
        assert rec["phases"]["draft"] >= 2 * 3.0 * fake_torch.cuda.gpu_factor
        assert rec["host_phases"]["draft"] >= 6.0


def test_events_timer_resolves_later_without_host_sync(load, logs, fake_torch):
    rt = load(mode="events")
    cuda = fake_torch.cuda
    cuda.done = False                                           # the GPU is behind
    w = decode_worker(rt, sleeps=(0.002, 0.004, 0.001), out=Obj(accept_lens=FakeTensor([3, 3, 3])), bonus=0)
    w.forward_batch_generation(Batch(3))
    assert cuda.syncs == 0
    stats = rt._stats()
    assert stats["pending"] == 1 and stats["buffered"] == 0 and stats["timer"] == "events"
    cuda.done = True                                            # it caught up: the writer reads both
    w.forward_batch_generation(Batch(3))
    wait_until(lambda: rt._stats()["pending"] == 0, what="the writer to resolve both cycles")
    rt.flush()
    recs = records(logs)
    assert len(recs) == 2 and cuda.syncs == 0
    for rec in recs:
        assert set(rec) == RECORD_KEYS | {"host_phases", "host_cycle_ms", "accepts"}
        assert rec["timer"] == "events" and rec["accepted"] == 9 and rec["accepts"] == [3, 3, 3]
        assert list(rec["phases"]) == list(rec["host_phases"]) == ["draft", "verify", "draft_extend"]
        # the fake GPU clock runs twice as slow as the host's: GPU columns are about 2x the host ones
        for name, host_ms in rec["host_phases"].items():
            # within 10%: the host's clock is read beside the events, not at them (8.56 against 8.32 ms under a
            # loaded CPU); a host timer would give 1x
            assert rec["phases"][name] == pytest.approx(2 * host_ms, rel=0.1, abs=0.01)
        assert rec["cycle_ms"] == pytest.approx(2 * rec["host_cycle_ms"], rel=0.1, abs=0.01)
        assert rec["host_phases"]["verify"] >= 4.0 and rec["host_cycle_ms"] >= 7.0
    assert 1 <= len(fake_torch.pinned) <= 2                     # reused once the writer read the first copy


def test_events_flush_waits_for_outstanding_events_by_query_within_a_bound(load, logs, fake_torch):
    """flush() waits for the GPU by polling event.query() (never synchronize()), at most exit_seconds; cycles not
    done by then stay pending (only the exit drops them) and are written by a later flush."""
    rt = load(mode="events", exit_seconds=0.3)
    cuda = fake_torch.cuda
    cuda.done = False
    w = decode_worker(rt, out=Obj(accept_lens=FakeTensor([1, 2])), bonus=1)
    for _ in range(3):
        w.forward_batch_generation(Batch(2))
    assert rt._stats()["pending"] == 3
    t0 = time.time()
    rt.flush()
    assert 0.2 <= time.time() - t0 < 1.0
    assert records(logs) == [] and rt._stats()["pending"] == 3 and rt._stats()["dropped"] == 0
    threading.Timer(0.1, lambda: setattr(cuda, "done", True)).start()    # the GPU gets there during the flush
    rt.flush()
    recs = records(logs)
    assert [r["accepted"] for r in recs] == [5, 5, 5]
    assert rt._stats()["pending"] == 0 and cuda.device_ctx == []


def test_events_open_phase_and_exception_paths(load, logs, fake_torch):
    rt = load(mode="events")

    class W(object):
        @rt.entry
        def forward_batch_generation(self, batch, fail):
            rt.begin("draft_extend", "prefill")
            time.sleep(0.002)
            if fail:
                raise ValueError("x")

    with pytest.raises(ValueError):
        W().forward_batch_generation(Batch(), True)
    W().forward_batch_generation(Batch(), False)
    rt.flush()
    recs = records(logs)
    assert len(recs) == 1 and recs[0]["mode"] == "prefill"
    assert recs[0]["host_phases"]["draft_extend"] >= 2.0
    assert recs[0]["host_phases"]["draft_extend"] <= recs[0]["host_cycle_ms"]
    assert rt._stats()["errors"] == 0


def test_cpu_tensor_in_events_mode_is_read_directly(load, logs, fake_torch):
    rt = load(mode="events")
    decode_worker(rt, out=Obj(accept_lens=FakeTensorCpu([2, 2]))).forward_batch_generation(Batch(2))
    rt.flush()
    assert records(logs)[0]["accepted"] == 4 and fake_torch.pinned == []


def test_cpu_mode_ignores_cuda(load, logs, fake_torch):
    rt = load(mode="cpu")
    decode_worker(rt).forward_batch_generation(Batch())
    assert one_record(rt, logs)["timer"] == "cpu" and fake_torch.cuda.syncs == 0
    assert fake_torch.cuda.events_made == 0


def test_cpu_mode_reads_a_cuda_accepted_tensor_without_a_sync(load, logs, fake_torch):
    """The host-clock timer on a GPU server must not add a sync either: the count is copied asynchronously
    and the record waits for it, in order."""
    rt = load(mode="cpu")
    cuda = fake_torch.cuda
    cuda.done = False
    w = decode_worker(rt, out=Obj(accept_lens=FakeTensor([1, 2, 3])), bonus=1)
    w.forward_batch_generation(Batch(3))
    decode_worker(rt).forward_batch_generation(Batch(2))       # no accepted: still queued behind the first
    assert rt._stats()["pending"] == 2 and rt._stats()["buffered"] == 0
    cuda.done = True
    w.forward_batch_generation(Batch(3))
    rt.flush()
    recs = records(logs)
    assert [(r["bs"], r["accepted"], r["timer"]) for r in recs] == [(3, 9, "cpu"), (2, None, "cpu"), (3, 9, "cpu")]
    assert all("host_phases" not in r for r in recs) and cuda.syncs == 0


def test_sync_mode_reads_a_cuda_tensor_on_the_host(load, logs, fake_torch):
    rt = load(mode="sync")
    t = FakeTensor([2, 2])
    t.tolist = lambda: [2, 2]                                   # the sync timer may sync: allowed here
    decode_worker(rt, out=Obj(accept_lens=t)).forward_batch_generation(Batch(2))
    assert one_record(rt, logs)["accepted"] == 4 and fake_torch.pinned == []


def test_cuda_modes_fall_back_to_cpu_without_cuda(load, logs, fake_torch):
    fake_torch.cuda.is_available = lambda: False
    rt = load(mode="events")
    decode_worker(rt).forward_batch_generation(Batch())
    rec = one_record(rt, logs)
    assert rec["timer"] == "cpu" and "host_phases" not in rec


def test_events_records_carry_the_host_times_in_milliseconds_rounded_to_four_places(load, logs, fake_torch,
                                                                                     monkeypatch):
    """The events timer: the host's own view of each phase and of the cycle, beside the GPU's, in the same unit."""
    rt = load(mode="events")
    clock = [50.0]
    monkeypatch.setattr(rt, "_perf", lambda: clock[0])
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])     # the fake GPU's events read it too
    scripted_worker(rt, clock, STEPS).forward_batch_generation(Batch(2))
    rec = one_record(rt, logs)
    assert rec["timer"] == "events" and fake_torch.cuda.gpu_factor == 2.0
    assert rec["phases"] == {"draft": 24.6914, "verify": 4.0001} and rec["cycle_ms"] == 28.9384
    assert rec["host_phases"] == {"draft": 12.3457, "verify": 2.0}
    assert rec["host_cycle_ms"] == round((clock[0] - 50.0) * 1000.0, 4) == 14.4692


def test_a_cpu_cycle_waiting_for_its_accepted_copy_keeps_its_own_time(load, logs, fake_torch, monkeypatch):
    """The cpu timer meeting a CUDA tensor of accepted counts: the cycle waits for the copy, and its record has
    the cycle's own time, to the 4th place, once resolved."""
    rt = load(mode="cpu")
    rt._WRITER_THREAD = False
    clock = [7.0]
    monkeypatch.setattr(rt, "_perf", lambda: clock[0])
    fake_torch.cuda.done = False
    scripted_worker(rt, clock, STEPS, after=0.0, out=Obj(accept_lens=FakeTensor([2, 3]))).forward_batch_generation(Batch(2))
    assert rt._stats()["pending"] == 1
    fake_torch.cuda.done = True
    rec = one_record(rt, logs)
    assert rec["cycle_ms"] == 14.3457 and rec["phases"] == {"draft": 12.3457, "verify": 2.0}
    assert rec["accepted"] == 5


# --- streams and pools ---------------------------------------------------------------------------------------
def test_events_look_up_the_current_stream_once_per_stream(load, logs, fake_torch):
    rt = load(mode="events")
    cuda = fake_torch.cuda
    w = decode_worker(rt, out=Obj(accept_lens=FakeTensor([1])))
    for _ in range(5):
        w.forward_batch_generation(Batch(1))
    assert cuda.stream_lookups == 1 and len(cuda.recorded_on) == 5 * 9
    cuda.stream_id = 8                                          # another stream becomes current
    w.forward_batch_generation(Batch(1))
    assert cuda.stream_lookups == 2 and cuda.recorded_on[-1] == ("stream", 8)
    rt.flush()
    assert len(records(logs)) == 6


def test_the_stream_cache_is_bounded_at_64(load, logs, fake_torch):
    """Events are recorded on the current stream, looked up once per stream and cached; at most 64 streams are
    kept (one looked up past that is not cached, and is looked up again each time)."""
    rt = load(mode="events")
    cuda = fake_torch.cuda
    w = decode_worker(rt)
    for sid in range(70):
        cuda.stream_id = sid
        w.forward_batch_generation(Batch())
    assert len(rt._streams) == 64
    before = cuda.stream_lookups
    w.forward_batch_generation(Batch())             # stream 69: not cached, looked up at each event
    assert cuda.stream_lookups - before == 8        # cycle start, 3 x (begin, end), cycle end
    cuda.stream_id = 3
    before = cuda.stream_lookups
    w.forward_batch_generation(Batch())             # a cached one: no lookup
    assert cuda.stream_lookups == before
    rt.flush()
    assert len(records(logs)) == 72 and rt._stats()["errors"] == 0


def test_events_are_reused_from_a_pool(load, logs, fake_torch):
    rt = load(mode="events")
    rt._WRITER_THREAD = False                                   # the writer's rounds, run here, in step
    w = decode_worker(rt, out=Obj(accept_lens=FakeTensor([1])))
    for _ in range(50):
        w.forward_batch_generation(Batch(1))
        rt._service()
    # 9 events a cycle (start, 3 x 2 phases, accepted, end), all back in the pool after each resolve
    assert fake_torch.cuda.events_made <= 18
    assert len(fake_torch.pinned) <= 2                          # and the pinned buffers too
    rt.flush()
    assert len(records(logs)) == 50


def test_events_and_pinned_buffers_kept_for_reuse_are_bounded(load, monkeypatch):
    """Events given back go to a pool of at most _MAX_POOL (a cycle's are added while it is below); pinned
    buffers are kept for at most 64 shapes, 64 per shape; beyond, they are let go."""
    rt = load(mode="cpu")
    monkeypatch.setattr(rt, "_MAX_POOL", 10)
    rt._pool[:] = ["ev"] * 9
    rt._give_back(["a", "b"])                       # below the bound: the cycle's events all go in
    assert len(rt._pool) == 11
    rt._give_back(["c"])                            # over it: none
    assert len(rt._pool) == 11
    rt._pool[:] = ["ev"] * 10
    rt._give_back(["d"])                            # at it: none
    assert len(rt._pool) == 10
    rt._pool[:] = ["ev"] * 10
    rt._give_back_acc(("host", "ev2", 0, None, "k"))
    assert len(rt._pool) == 10 and rt._pinned["k"] == ["host"]
    rt._pool[:] = []
    rt._give_back_acc(("host2", "ev3", 0, None, "k"))
    assert rt._pool == ["ev3"] and rt._pinned["k"] == ["host", "host2"]
    rt._pinned.clear()
    for i in range(64):
        rt._give_back_acc(("h", "e", 0, None, i))
    rt._give_back_acc(("h", "e", 0, None, "shape 65"))
    assert len(rt._pinned) == 64 and "shape 65" not in rt._pinned
    rt._pinned[0] = ["h"] * 63
    rt._give_back_acc(("h64", "e", 0, None, 0))
    rt._give_back_acc(("h65", "e", 0, None, 0))
    assert len(rt._pinned[0]) == 64 and rt._pinned[0][-1] == "h64"


def test_at_most_4096_events_are_kept_for_reuse_by_default(load):
    """docs/design.md's bound on the event pool, as shipped."""
    rt = load(mode="cpu")
    rt._give_back(["ev"] * 4095)
    rt._give_back(["a", "b"])                       # below the bound: the cycle's events all go in
    assert len(rt._pool) == 4097
    rt._pool[:] = ["ev"] * 4096
    rt._give_back(["c"])
    assert len(rt._pool) == 4096


# --- resolving the waiting cycles ----------------------------------------------------------------------------
def test_a_failure_resolving_on_the_worker_thread_is_said_as_an_events_error(load, logs, fake_torch, monkeypatch,
                                                                             capsys):
    """At a cycle's end the worker resolves the waiting cycles that are done; an exception there is counted and
    said (by the writer) as an internal error "in events", and the cycle's end goes on."""
    rt = load(mode="events")
    rt._WRITER_THREAD = False

    def broken(deadline):
        raise RuntimeError("no such event")

    real = rt._resolve_loop
    monkeypatch.setattr(rt, "_resolve_loop", broken)
    decode_worker(rt).forward_batch_generation(Batch())
    assert rt._stats()["errors"] == 1 and rt._stats()["pending"] == 1
    monkeypatch.setattr(rt, "_resolve_loop", real)
    rt.flush()
    err = capsys.readouterr().err
    assert err.startswith("[eaglepatch] internal error in events (the server goes on;") and "no such event" in err
    assert len(records(logs)) == 1
