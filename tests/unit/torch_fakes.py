"""A fake torch for the timing runtime's tests: CUDA events whose completion the test controls, a device tensor
whose host read would be a sync (forbidden), pinned host buffers, torch.distributed's rank.

The ``fake_torch`` fixture (conftest.py) puts ``fake_torch_module()`` in ``sys.modules`` for one test, so that the CUDA
timers' logic is tested on any machine.
"""
import contextlib
import time
import types


class FakeCuda(object):
    """Enough of torch.cuda for the runtime: events whose completion the test controls."""

    def __init__(self, gpu_factor=2.0):
        self.done = True
        self.initialized = True
        self.capturing = False
        self.syncs = 0
        self.events_made = 0
        self.device_ctx = []
        self.gpu_factor = gpu_factor
        self.stream_id = 7
        self.stream_lookups = 0
        self.recorded_on = []
        self.events = []
        cuda = self

        class Event(object):
            def __init__(self, enable_timing=False):
                assert enable_timing
                cuda.events_made += 1
                cuda.events.append(self)
                self.t = None
                self.completed = False

            def record(self, stream=None):
                if stream is None:
                    stream = cuda.current_stream()
                assert stream == ("stream", cuda.stream_id), "recorded on a stream that is not current"
                cuda.recorded_on.append(stream)
                self.t = time.perf_counter()
                self.completed = cuda.done

            def is_done(self):
                # cuda.done: the GPU has caught up with everything recorded so far.
                return self.completed or cuda.done

            def query(self):
                return self.is_done()

            def synchronize(self):
                # An unbounded wait (a GPU stuck in a collective never gets there): the runtime never calls it.
                raise AssertionError("Event.synchronize() called: an unbounded wait")

            def elapsed_time(self, other):
                assert self.is_done() and other.is_done(), "elapsed_time on an event not done"
                return (other.t - self.t) * 1000.0 * cuda.gpu_factor

        self.Event = Event

    def is_available(self):
        return True

    def is_initialized(self):
        return self.initialized

    def is_current_stream_capturing(self):
        return self.capturing

    def current_device(self):
        return 0

    def current_stream(self):
        self.stream_lookups += 1
        return ("stream", self.stream_id)

    def raw_stream(self, device):
        assert device == 0
        return 1000 + self.stream_id

    def synchronize(self):
        self.syncs += 1
        self.done = True

    @contextlib.contextmanager
    def device(self, index):
        assert index == 0
        self.device_ctx.append(index)
        try:
            yield
        finally:
            self.device_ctx.pop()


class FakeTensor(object):
    """A CUDA tensor of per-request counts; reading it on the host (tolist, item) would be a sync: forbidden."""
    dtype = "int32"

    def __init__(self, values, is_cuda=True):
        self.values = list(values)
        self.is_cuda = is_cuda
        self.shape = (len(self.values),)

    def dim(self):
        return 1

    def tolist(self):
        assert not self.is_cuda, "host sync: .tolist() on a device tensor on the hot path"
        return list(self.values)

    def sum(self):
        raise AssertionError("a sum kernel is not needed: the whole tensor is copied")


class FakeTensorCpu(FakeTensor):
    def __init__(self, values):
        FakeTensor.__init__(self, values, is_cuda=False)


class FakeHost(object):
    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(shape), dtype
        self.values = None

    def copy_(self, src, non_blocking=False):
        assert non_blocking, "the copy must be asynchronous"
        assert src.shape == self.shape and src.dtype == self.dtype
        self.values = list(src.values)

    def dim(self):
        return len(self.shape)

    def tolist(self):
        if not self.shape:                          # 0-d: the number itself, as torch gives it
            return self.values[0]
        if len(self.shape) == 2:                    # nested, as torch gives it
            n = self.shape[1]
            return [list(self.values[i:i + n]) for i in range(0, len(self.values), n)]
        return list(self.values)

    def sum(self):
        total = sum(self.values)
        return types.SimpleNamespace(item=lambda: total)


class FakeDist(object):
    def __init__(self, rank, initialized=True, available=True):
        self.rank, self.initialized, self.available = rank, initialized, available

    def is_available(self):
        return self.available

    def is_initialized(self):
        return self.initialized

    def get_rank(self):
        if isinstance(self.rank, Exception):
            raise self.rank
        return self.rank


def fake_torch_module():
    """A module to stand for `torch`: torch.cuda is a FakeCuda, the rank (torch.distributed) is 1."""
    torch = types.ModuleType("torch")
    torch.cuda = FakeCuda()
    torch._C = types.SimpleNamespace(_cuda_getCurrentRawStream=torch.cuda.raw_stream)
    torch.Tensor = FakeTensor
    torch.distributed = FakeDist(1)
    pinned = []

    def empty(shape, dtype=None, pin_memory=False):
        assert pin_memory, "the host copy must go to pinned memory"
        host = FakeHost(shape, dtype)
        pinned.append(host)
        return host

    torch.empty = empty
    torch.pinned = pinned
    return torch
