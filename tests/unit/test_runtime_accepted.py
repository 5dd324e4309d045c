"""accepted() on tensors of every shape, against a fake torch (no torch needed), and the cycle's end around it
(eaglepatch/runtime/_eaglepatch_runtime.py)."""
import threading
import time

import pytest

from runtime_helpers import Batch, Obj, decode_worker, one_record, records, wait_until
from torch_fakes import FakeTensor, FakeTensorCpu


class Tensor0d(FakeTensor):
    """A 0-d tensor: a total, on the host (tolist() gives a number)."""

    def __init__(self, value):
        FakeTensor.__init__(self, [value], is_cuda=False)
        self.shape = ()

    def dim(self):
        return 0

    def tolist(self):
        return self.values[0]


class Tensor2d(FakeTensor):
    """A 2-d tensor of counts on the host: summed with a kernel, then .item()."""

    def __init__(self, rows):
        FakeTensor.__init__(self, [sum(r) for r in rows], is_cuda=False)
        self.rows = [list(r) for r in rows]
        self.shape = (len(rows), len(rows[0]))

    def dim(self):
        return 2

    def tolist(self):
        return [list(r) for r in self.rows]  # nested, as torch gives it: summing it as a 1-d list would fail

    def sum(self):
        total = sum(self.values)
        return Obj(item=lambda: total)


class ArrayLike(object):
    """Not a tensor: anything with a len and a sum (a numpy array)."""

    def __init__(self, values):
        self.values = values

    def __len__(self):
        return len(self.values)

    def sum(self):
        return sum(self.values)


def _accept(rt, value, bonus=None, bs=4, attrs=()):
    class W(object):
        @rt.entry
        def forward_batch_generation(self, batch):
            if bonus is None:
                rt.accepted(value, attrs)                       # the default: no bonus
            else:
                rt.accepted(value, attrs, bonus)

    W().forward_batch_generation(Batch(bs) if bs is not None else Obj())


@pytest.mark.parametrize("value, bonus, bs, expected", [
    (Tensor0d(5), 1, 4, 9),                     # a 0-d tensor is a total: + bonus x bs
    (Tensor0d(5), 0, 4, 5),
    (Tensor0d(5), None, 4, 5),
    (Tensor0d(5), 1, None, None),               # bs unknown: the bonus cannot be added
    (Tensor0d(5), 0, None, 5),
    (Tensor2d([[1, 2], [3, 4]]), 1, 4, 12),     # 2-d: summed, + bonus x rows (2)
    (Tensor2d([[1, 2], [3, 4]]), 0, 4, 10),
    (FakeTensorCpu([2, 3]), 1, 4, 7),           # 1-d on the host: read directly, + bonus x len
    (FakeTensorCpu([2, 3]), None, 4, 5),
    (ArrayLike([3, 4, 5]), 2, 4, 18),           # not a tensor: sum + bonus x len
    (ArrayLike([3, 4, 5]), None, 4, 12),
    ([1, 1], None, 4, 2),                       # accepted(obj, attrs) adds no bonus
    (7, None, 4, 7),
])
def test_accepted_values_with_a_torch_in_the_process(load, logs, fake_torch, value, bonus, bs, expected):
    rt = load(mode="cpu")
    _accept(rt, value, bonus, bs)
    assert one_record(rt, logs)["accepted"] == expected
    assert rt._stats()["errors"] == 0


def test_the_first_attribute_present_wins_over_later_ones(rt, logs):
    out = Obj(accept_length_per_req_cpu=[2, 2], later=[9, 9, 9])
    _accept(rt, out, 0, 2, attrs=("missing", "accept_length_per_req_cpu", "later", "absent"))
    assert one_record(rt, logs)["accepted"] == 4


def test_pinned_buffers_are_kept_per_shape_and_reused(load, logs, fake_torch):
    """Copies of CUDA tensors of two shapes, several outstanding at once: each shape gets buffers of its own
    shape, all are given back once read, and the next cycles reuse them (no new pinned allocation)."""
    rt = load(mode="events")
    rt._WRITER_THREAD = False
    cuda = fake_torch.cuda
    cuda.done = False
    for n in (2, 3, 2, 3):
        decode_worker(rt, out=Obj(accept_lens=FakeTensor([1] * n))).forward_batch_generation(Batch(n))
    assert len(fake_torch.pinned) == 4
    cuda.done = True
    rt.flush()
    cuda.done = False
    # Not the order they were given back in (3, 2, 3, 2 from the top of one shared list would fit by chance).
    for n in (2, 2, 3, 3):
        decode_worker(rt, out=Obj(accept_lens=FakeTensor([1] * n))).forward_batch_generation(Batch(n))
    cuda.done = True
    rt.flush()
    assert len(fake_torch.pinned) == 4                          # all reused, each into its own shape
    assert [r["accepted"] for r in records(logs)] == [2, 3, 2, 3, 2, 2, 3, 3]
    assert rt._stats()["errors"] == 0


def test_a_phase_left_open_adds_to_what_it_had(rt, logs):
    class W(object):
        @rt.entry
        def forward_batch_generation(self, batch):
            rt.begin("draft", "decode")
            time.sleep(0.003)
            rt.end("draft")
            rt.begin("draft", "decode")                         # again, and left open until the cycle's end
            time.sleep(0.003)

    W().forward_batch_generation(Batch())
    assert one_record(rt, logs)["phases"]["draft"] >= 6.0


def test_the_worker_never_waits_for_the_writers_lock(load, logs, fake_torch):
    """While the writer resolves (holding the lock, querying the GPU), a cycle ends without waiting for it."""
    rt = load(mode="events")
    w = decode_worker(rt)
    w.forward_batch_generation(Batch())
    held = threading.Event()
    release = threading.Event()

    def writer_busy():
        with rt._plock:
            held.set()
            release.wait(60)

    t = threading.Thread(target=writer_busy)
    t.start()
    held.wait(5)
    done = threading.Event()
    cycle = threading.Thread(target=lambda: (w.forward_batch_generation(Batch()), done.set()))
    try:
        cycle.start()
        # the cycle ends while the lock is still held: a worker that waited for it would end only after the release
        # (no time limit to meet: 30 s is there only so that such a worker fails rather than hangs)
        assert done.wait(30), "the cycle waited for the writer's lock"
        assert t.is_alive() and not release.is_set()
    finally:
        release.set()
        t.join(5)
        cycle.join(5)
    rt.flush()
    assert len(records(logs)) == 2


def test_a_cpu_timer_quiet_server_gets_its_cuda_counted_records_written(load, logs, fake_torch):
    """cpu timer, accepted from a CUDA tensor (copied asynchronously): the last records wait for their copies
    and reach the disk once those are done, without another cycle or a flush."""
    rt = load(mode="cpu", flush_seconds=0.1, flush_records=1000)
    cuda = fake_torch.cuda
    cuda.done = False
    decode_worker(rt, out=Obj(accept_lens=FakeTensor([2, 2])), bonus=1).forward_batch_generation(Batch(2))
    cuda.done = True
    wait_until(lambda: len(records(logs)) == 1, what="the record")
    rec = records(logs)[0]
    assert rec["accepted"] == 6 and rec["timer"] == "cpu" and rt._stats()["errors"] == 0


def test_cycles_dropped_while_pending_are_in_the_summary(load, logs, fake_torch, capsys):
    rt = load(mode="events", summary_every=4)
    rt._MAX_PENDING = 1
    cuda = fake_torch.cuda
    cuda.done = False
    w = decode_worker(rt)
    for n in range(3):
        w.forward_batch_generation(Batch(1))                    # the 2nd and 3rd are dropped
    cuda.done = True
    wait_until(lambda: rt._stats()["pending"] == 0, what="the first cycle resolved")
    for n in range(3):
        w.forward_batch_generation(Batch(1))
    rt.flush()
    err = capsys.readouterr().err
    assert "[eaglepatch] rank1 dropped 2 record(s) since the last summary" in err, err


def test_a_failing_flush_is_said_at_once_and_does_not_raise(rt, logs, monkeypatch, capsys):
    def boom(final):
        raise RuntimeError("flush broke")

    monkeypatch.setattr(rt, "_flush", boom)
    rt.flush()
    err = capsys.readouterr().err
    assert err.startswith("[eaglepatch] internal error in flush ") and "RuntimeError: flush broke" in err


def test_an_error_giving_events_back_is_counted_and_the_exception_still_propagates(load, logs, fake_torch,
                                                                                     monkeypatch, capsys):
    rt = load(mode="events")

    def boom(evs):
        raise RuntimeError("pool broke")

    monkeypatch.setattr(rt, "_give_back", boom)

    class W(object):
        @rt.entry
        def forward_batch_generation(self, batch):
            raise KeyError("the server's own")

    with pytest.raises(KeyError):
        W().forward_batch_generation(Batch())
    rt.flush()
    assert "internal error in entry" in capsys.readouterr().err and rt._stats()["errors"] == 1


class _CudaTensor2d(FakeTensor):
    """A 2-d CUDA tensor of counts (rows of per-request counts)."""

    def __init__(self, rows):
        FakeTensor.__init__(self, [v for r in rows for v in r])
        self.shape = (len(rows), len(rows[0]))

    def dim(self):
        return 2


def test_a_2d_cuda_tensor_of_counts_is_copied_and_summed_once_done(load, logs, fake_torch):
    """Copied whole into pinned memory, summed once the copy is done (a sum kernel's .item(), not a nested
    list), plus the bonus per row."""
    rt = load(mode="events")
    rt._WRITER_THREAD = False
    fake_torch.cuda.done = False
    out = Obj(accept_lens=_CudaTensor2d([[1, 2], [3, 4]]))
    decode_worker(rt, out=out, bonus=1).forward_batch_generation(Batch(2))
    fake_torch.cuda.done = True
    rec = one_record(rt, logs)
    assert rec["accepted"] == 12 and rt._stats()["errors"] == 0


class _CudaTensor0d(FakeTensor):
    def __init__(self, value):
        FakeTensor.__init__(self, [value])
        self.shape = ()

    def dim(self):
        return 0


@pytest.mark.parametrize("mode", ["events", "cpu"])
def test_a_0d_cuda_tensor_of_a_total_is_copied_and_read_once_done(load, logs, fake_torch, mode):
    """A cycle's total as a 0-d CUDA tensor: copied, read as the number once done, plus the bonus per request; a
    total gives no per-request accepts."""
    rt = load(mode=mode)
    rt._WRITER_THREAD = False
    fake_torch.cuda.done = False
    decode_worker(rt, out=Obj(accept_lens=_CudaTensor0d(9)), bonus=1).forward_batch_generation(Batch(3))
    fake_torch.cuda.done = True
    rec = one_record(rt, logs)
    assert rec["accepted"] == 12 and "accepts" not in rec and rt._stats()["errors"] == 0


def test_an_accepted_copy_that_cannot_be_read_leaves_the_record_without_its_count(load, logs, fake_torch,
                                                                                  monkeypatch, capsys):
    """A CUDA copy of the accepted counts that cannot be read: the record is written without its count
    (accepted null), and the failure is said as an `accepted` internal error."""
    rt = load(mode="events")
    rt._WRITER_THREAD = False
    fake_torch.cuda.done = False
    decode_worker(rt, out=Obj(accept_lens=FakeTensor([2, 3]))).forward_batch_generation(Batch(2))
    host = fake_torch.pinned[0]

    def unreadable():
        raise RuntimeError("copy failed")

    monkeypatch.setattr(host, "tolist", unreadable)
    fake_torch.cuda.done = True
    rec = one_record(rt, logs)
    assert rec["accepted"] is None
    err = capsys.readouterr().err
    assert err.startswith("[eaglepatch] internal error in accepted (the server goes on;") and "copy failed" in err


# --- accepts: the tokens each request produced (the acceptance profile) ------------------------------------------

@pytest.mark.parametrize("value, bonus, expected", [
    ([1, 0, 3], 1, [2, 1, 4]),                  # V1's drafts per request: + the bonus token each
    ((2, 2), None, [2, 2]),                     # a tuple, no bonus
    (FakeTensorCpu([3, 1]), 0, [3, 1]),         # 1-d on the host (V2's accept_lens, bonus included)
    (FakeTensorCpu([0, 2]), 1, [1, 3]),
])
def test_accepts_are_the_per_request_counts_bonus_included(load, logs, fake_torch, value, bonus, expected):
    rt = load(mode="cpu")
    _accept(rt, value, bonus, len(expected))
    rec = one_record(rt, logs)
    assert rec["accepts"] == expected and rec["accepted"] == sum(expected)


@pytest.mark.parametrize("value", [Tensor0d(5), Tensor2d([[1, 2], [3, 4]]), ArrayLike([3, 4]), 7])
def test_a_total_has_no_accepts(load, logs, fake_torch, value):
    """A 0-d tensor, an int, a 2-d tensor or an array-like give the cycle's total only: no per-request list."""
    rt = load(mode="cpu")
    _accept(rt, value, 0, 4)
    rec = one_record(rt, logs)
    assert "accepts" not in rec and "accept_hist" not in rec and rec["accepted"] is not None


@pytest.mark.parametrize("mode", ["events", "cpu"])
def test_accepts_of_a_cuda_tensor_come_from_its_asynchronous_copy(load, logs, fake_torch, mode):
    """A CUDA tensor (V2's accept_lens) is never read on the worker's thread: the per-request counts are read
    from the same pinned copy as the total, once its event is done (FakeTensor.tolist() would fail otherwise)."""
    rt = load(mode=mode)
    fake_torch.cuda.done = False
    decode_worker(rt, out=Obj(accept_lens=FakeTensor([1, 3, 2])), bonus=1).forward_batch_generation(Batch(3))
    assert records(logs) == []
    fake_torch.cuda.done = True
    rec = one_record(rt, logs)
    assert rec["accepts"] == [2, 4, 3] and rec["accepted"] == 9 and fake_torch.cuda.syncs == 0


def test_accepts_of_a_cuda_tensor_under_the_sync_timer(load, logs, fake_torch):
    """The sync timer has synchronised anyway: one tolist() of the (host) tensor gives both."""
    rt = load(mode="sync")
    decode_worker(rt, out=Obj(accept_lens=FakeTensorCpu([4, 1])), bonus=0).forward_batch_generation(Batch(2))
    rec = one_record(rt, logs)
    assert rec["accepts"] == [4, 1] and rec["accepted"] == 5


def test_above_256_requests_a_histogram_stands_for_the_list(rt, logs):
    counts = [1] * 200 + [2] * 41 + [4] * 16
    _accept(rt, counts, 0, len(counts))
    rec = one_record(rt, logs)
    assert "accepts" not in rec and rec["accept_hist"] == {"1": 200, "2": 41, "4": 16}
    assert rec["accepted"] == 200 + 82 + 64


def test_256_requests_are_still_a_list(rt, logs):
    _accept(rt, [2] * 256, 0, 256)
    assert one_record(rt, logs)["accepts"] == [2] * 256


def test_counts_that_cannot_be_written_as_whole_numbers_give_no_accepts(rt):
    """The list is written with "%d" (whole numbers; floats of whole values as such); what cannot be (NaN, text)
    gives no "accepts" at all, never a record that does not parse: its total is in "accepted"."""
    assert rt._accepts_json([1.0, 2.0]) == ', "accepts": [1, 2]'
    assert rt._accepts_json([float("nan")]) == ""
    assert rt._accepts_json(["x"]) == ""
    assert rt._accepts_json([1] * 300 + ["x"]) == ""
