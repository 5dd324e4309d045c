"""The timing runtime and CUDA (eaglepatch/runtime/_eaglepatch_runtime.py), against fake torch modules.

- No hook does anything while the current stream captures a CUDA graph.
- The cpu timer (and a process that never initialised CUDA) calls nothing that could initialise CUDA.
- Mode "auto": the timer per worker class, from `timers` and the class's MRO; EAGLEPATCH_MODE overrides it.
"""
import json
import sys
import time
import types

import pytest

from runtime_helpers import RUNTIME, Batch, Obj, decode_worker, load_module, one_record, records
from torch_fakes import FakeTensor


# --- 5. CUDA graph capture -----------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["sync", "events", "cpu"])
def test_a_cycle_during_graph_capture_is_not_timed(load, logs, fake_torch, mode):
    """While the current stream captures, a synchronise, an event record or an accepted copy would break the
    capture: the cycle runs untimed (no CUDA call at all from the hooks), and leaves no record."""
    rt = load(mode=mode)
    cuda = fake_torch.cuda
    t = FakeTensor([1, 2])
    if mode == "sync":
        t.tolist = lambda: [1, 2]                               # the sync timer reads it on the host
    w = decode_worker(rt, out=Obj(accept_lens=t))
    w.forward_batch_generation(Batch(2))                        # CUDA in use (cpu: adopted for the copy)
    rt.flush()
    before = (cuda.syncs, cuda.events_made, len(cuda.recorded_on), len(fake_torch.pinned))
    cuda.capturing = True
    calls = []

    class Captured(object):
        @rt.entry
        def forward_batch_generation(self, batch):
            calls.append(1)
            rt.begin("draft", "decode")
            rt.end("draft")
            rt.accepted(Obj(accept_lens=FakeTensor([5])), ("accept_lens",), 0)
            return "graph"

    assert Captured().forward_batch_generation(Batch(1)) == "graph"
    batch = Batch(2)
    assert w.forward_batch_generation(batch) == ("result", batch)
    assert calls == [1]
    assert (cuda.syncs, cuda.events_made, len(cuda.recorded_on), len(fake_torch.pinned)) == before
    cuda.capturing = False
    w.forward_batch_generation(Batch(3))
    rt.flush()
    recs = records(logs)
    assert [r["bs"] for r in recs] == [2, 3] and rt._stats()["errors"] == 0


def test_the_cpu_timer_checks_capture_before_its_first_copy(load, logs, fake_torch):
    """cpu mode adopts CUDA at its first CUDA tensor; if that happens mid-capture, no copy is queued."""
    rt = load(mode="cpu")
    cuda = fake_torch.cuda
    cuda.capturing = True
    decode_worker(rt, out=Obj(accept_lens=FakeTensor([1, 2]))).forward_batch_generation(Batch(2))
    assert fake_torch.pinned == [] and cuda.events_made == 0
    rt.flush()
    assert records(logs)[0]["accepted"] is None
    decode_worker(rt).forward_batch_generation(Batch(2))        # now checked at cycle start: untimed
    rt.flush()
    assert len(records(logs)) == 1


def test_torch_without_the_capture_check_still_times(load, logs, fake_torch):
    """torch < 1.10 has no is_current_stream_capturing: the runtime times as before."""
    del type(fake_torch.cuda).is_current_stream_capturing
    try:
        rt = load(mode="events")
        decode_worker(rt).forward_batch_generation(Batch())
        assert one_record(rt, logs)["timer"] == "events"
    finally:
        type(fake_torch.cuda).is_current_stream_capturing = lambda self: self.capturing


def test_the_capture_check_is_made_once_per_cycle(load, logs, fake_torch):
    rt = load(mode="events")
    cuda = fake_torch.cuda
    checks = []
    cuda.is_current_stream_capturing = lambda: checks.append(1) or False
    w = decode_worker(rt, out=Obj(accept_lens=FakeTensor([1])))
    for _ in range(5):
        w.forward_batch_generation(Batch(1))
    assert len(checks) == 5


def test_the_capture_check_calls_torchs_binding_when_torch_has_it(load, logs, fake_torch):
    """torch.cuda.is_current_stream_capturing() is torch._C._cuda_isCurrentStreamCapturing plus a Python call:
    where torch has the binding, the runtime calls it, and the wrapper not at all."""
    rt = load(mode="events")
    checks = []
    fake_torch._C._cuda_isCurrentStreamCapturing = lambda: checks.append(1) or False

    def wrapper():
        raise AssertionError("the Python wrapper was called")

    fake_torch.cuda.is_current_stream_capturing = wrapper
    w = decode_worker(rt)
    for _ in range(3):
        w.forward_batch_generation(Batch())
    rt.flush()
    assert len(checks) == 3 and len(records(logs)) == 3 and rt._stats()["errors"] == 0


# --- 6. cpu mode never initialises CUDA -------------------------------------------------------------------------
class RecordingCuda(object):
    """torch.cuda that records every attribute asked for (any call could initialise CUDA but is_initialized)."""

    def __init__(self, initialized):
        object.__setattr__(self, "asked", [])
        object.__setattr__(self, "initialized", initialized)

    def __getattr__(self, name):
        self.asked.append(name)
        if name == "is_initialized":
            return lambda: self.initialized
        if name == "is_available":
            return lambda: True

        def call(*a, **k):
            raise AssertionError("torch.cuda.%s() called" % name)
        return call


@pytest.fixture
def recording_torch(monkeypatch):
    torch = types.ModuleType("torch")
    torch.cuda = RecordingCuda(initialized=False)
    torch.Tensor = FakeTensor
    monkeypatch.setitem(sys.modules, "torch", torch)
    return torch


def test_cpu_mode_never_touches_torch_cuda(load, logs, recording_torch, monkeypatch):
    monkeypatch.setattr(recording_torch.cuda, "initialized", True)
    rt = load(mode="cpu", flush_records=1)
    w = decode_worker(rt, out=Obj(accept_lens=[1, 2]))
    for _ in range(3):
        w.forward_batch_generation(Batch(2))
    w.forward_batch_generation(Batch(2))
    rt.flush()
    rt._at_exit()
    assert len(records(logs)) == 4 and all(r["timer"] == "cpu" for r in records(logs))
    assert recording_torch.cuda.asked == []                      # not even is_available()


@pytest.mark.parametrize("mode", ["sync", "events", "auto"])
def test_cuda_never_initialised_means_the_cpu_timer(load, logs, recording_torch, mode):
    """A process that never initialised CUDA (a CPU-only server with a GPU in sight): only is_initialized() is
    asked; nothing that would create a context (current_device, Event, synchronize, current_stream)."""
    rt = load(mode=mode)
    w = decode_worker(rt, out=Obj(accept_lens=[3]))
    for _ in range(3):
        w.forward_batch_generation(Batch(1))
    decode_worker(rt, name="EAGLEWorkerV2").forward_batch_generation(Batch(1))   # CUDA is not asked again
    rt.flush()
    rt._at_exit()
    assert [r["timer"] for r in records(logs)] == ["cpu"] * 4
    assert recording_torch.cuda.asked == ["is_initialized"]
    assert rt._stats()["timer"] == "cpu" and rt._stats()["errors"] == 0


def test_no_torch_imported_when_every_class_uses_the_cpu_timer(load, logs, monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    import builtins
    real_import = builtins.__import__

    def no_torch(name, *a, **k):
        if name == "torch":
            raise AssertionError("torch imported")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_torch)
    rt = load(mode="auto", timers={"EAGLEWorker": "cpu"})
    decode_worker(rt).forward_batch_generation(Batch())
    assert one_record(rt, logs)["timer"] == "cpu"


def test_a_cuda_timer_without_torch_is_the_cpu_timer(load, logs, monkeypatch):
    import builtins
    real_import = builtins.__import__
    monkeypatch.delitem(sys.modules, "torch", raising=False)

    tries = []

    def no_torch(name, *a, **k):
        if name == "torch":
            tries.append(name)
            raise ImportError("No module named 'torch'")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_torch)
    rt = load(mode="sync")
    decode_worker(rt).forward_batch_generation(Batch())
    decode_worker(rt, name="EAGLEWorkerV2").forward_batch_generation(Batch())   # another class: not tried again
    rt.flush()
    assert [r["timer"] for r in records(logs)] == ["cpu", "cpu"] and rt._stats()["errors"] == 0
    assert tries == ["torch"]


def test_torch_without_is_initialized_falls_back_to_is_available(load, logs, fake_torch):
    del type(fake_torch.cuda).is_initialized
    try:
        rt = load(mode="sync")
        decode_worker(rt).forward_batch_generation(Batch())
        assert one_record(rt, logs)["timer"] == "sync"
    finally:
        type(fake_torch.cuda).is_initialized = lambda self: self.initialized


def test_a_cuda_query_that_raises_is_an_error_and_the_cpu_timer(load, logs, fake_torch, capsys):
    def boom():
        raise RuntimeError("CUDA driver version is insufficient")

    fake_torch.cuda.is_available = boom
    rt = load(mode="events")
    decode_worker(rt).forward_batch_generation(Batch())
    rec = one_record(rt, logs)
    assert rec["timer"] == "cpu" and rt._stats()["errors"] == 1
    assert "internal error in timer" in capsys.readouterr().err


# --- 7. mode auto: a timer per worker class ----------------------------------------------------------------------
TIMERS = {"EAGLEWorker": "sync", "EAGLEWorkerV2": "events", "NGRAMWorker": "cpu"}


def _classes(rt):
    """EAGLEWorker / EAGLEWorkerV2 / NGRAMWorker, a subclass of each kind, and an unknown worker."""
    def make(name, bases=(object,)):
        def forward_batch_generation(self, batch):
            rt.begin("verify", "decode")
            rt.end("verify")
            return name
        return type(name, bases, {"forward_batch_generation": rt.entry(forward_batch_generation)})

    v1 = make("EAGLEWorker")
    v2 = make("EAGLEWorkerV2")
    ngram = make("NGRAMWorker")
    return {"EAGLEWorker": v1, "EAGLEWorkerV2": v2, "NGRAMWorker": ngram,
            "MultiLayerEagleWorker": make("MultiLayerEagleWorker", (v1,)),        # a subclass of EAGLEWorker
            "StandaloneWorkerV2": make("StandaloneWorkerV2", (v2,)),
            "Other": make("Other")}


def _timers_seen(rt, logs, order):
    classes = _classes(rt)
    for name in order:
        classes[name]().forward_batch_generation(Batch())
    rt.flush()
    return dict((r["worker"], r["timer"]) for r in records(logs))


def test_auto_gives_each_class_its_timer_by_mro(load, logs, fake_torch):
    rt = load(mode="auto", timers=TIMERS)
    seen = _timers_seen(rt, logs, ["MultiLayerEagleWorker", "EAGLEWorkerV2", "EAGLEWorker", "NGRAMWorker",
                                   "StandaloneWorkerV2", "Other"])
    assert seen == {"EAGLEWorker": "sync", "MultiLayerEagleWorker": "sync", "EAGLEWorkerV2": "events",
                    "StandaloneWorkerV2": "events", "NGRAMWorker": "cpu", "Other": "sync"}
    v2 = [r for r in records(logs) if r["timer"] == "events"]
    assert all("host_cycle_ms" in r for r in v2)
    assert all("host_cycle_ms" not in r for r in records(logs) if r["timer"] != "events")


def test_auto_a_subclass_named_in_timers_wins_over_its_base(load, logs, fake_torch):
    rt = load(mode="auto", timers={"EAGLEWorker": "sync", "MultiLayerEagleWorker": "events"})
    seen = _timers_seen(rt, logs, ["MultiLayerEagleWorker", "EAGLEWorker"])
    assert seen == {"MultiLayerEagleWorker": "events", "EAGLEWorker": "sync"}


def test_auto_with_no_timers_is_sync_for_all(load, logs, fake_torch):
    rt = load(mode="auto")
    assert set(_timers_seen(rt, logs, ["EAGLEWorkerV2", "Other"]).values()) == {"sync"}


@pytest.mark.parametrize("forced", ["sync", "events", "cpu"])
def test_a_fixed_mode_ignores_the_timers(load, logs, fake_torch, forced):
    rt = load(mode=forced, timers=TIMERS)
    assert set(_timers_seen(rt, logs, ["EAGLEWorker", "EAGLEWorkerV2", "NGRAMWorker"]).values()) == {forced}


@pytest.mark.parametrize("env", ["sync", "events", "cpu"])
def test_eaglepatch_mode_overrides_the_config_line(tmp_path, clean_env, monkeypatch, fake_torch, env):
    """What `apply` writes (mode auto with a timers table) yields to EAGLEPATCH_MODE in the server."""
    config = {"mode": "auto", "timers": TIMERS, "every": 1, "log_dir": str(tmp_path / "logs"), "summary_every": 0}
    src = RUNTIME.read_text().splitlines(True)
    src = [("_CONFIG = %s  # eaglepatch:config\n" % json.dumps(config)) if "eaglepatch:config" in l else l
           for l in src]
    path = tmp_path / "_eaglepatch_runtime.py"
    path.write_text("".join(src))
    monkeypatch.setenv("EAGLEPATCH_MODE", env)
    rt = load_module(path)
    try:
        assert rt._stats()["config"]["mode"] == env and rt._stats()["config"]["timers"] == TIMERS
        assert set(_timers_seen(rt, tmp_path / "logs", ["EAGLEWorker", "EAGLEWorkerV2", "NGRAMWorker"]).values()) \
            == {env}
    finally:
        rt._stop_writer()


def test_eaglepatch_mode_auto_is_accepted(clean_env, monkeypatch):
    monkeypatch.setenv("EAGLEPATCH_MODE", "AUTO")
    assert load_module()._stats()["config"]["mode"] == "auto"


def test_bad_timers_are_ignored(load):
    rt = load(mode="auto", timers={"EAGLEWorker": "gpu", "EAGLEWorkerV2": "events", 3: "cpu"})
    assert rt._stats()["config"]["timers"] == {"EAGLEWorkerV2": "events", "3": "cpu"}
    assert load(mode="auto", timers=["EAGLEWorker"])._stats()["config"]["timers"] == {}
    assert load(mode="turbo")._stats()["config"]["mode"] == "auto"


def test_the_timer_is_resolved_once_per_class(load, logs, fake_torch, monkeypatch):
    rt = load(mode="auto", timers=TIMERS)
    resolved = []
    real = rt._class_info
    monkeypatch.setattr(rt, "_class_info", lambda cls: (resolved.append(cls.__name__), real(cls))[1])
    classes = _classes(rt)
    for _ in range(3):
        for name in ("EAGLEWorker", "EAGLEWorkerV2"):
            classes[name]().forward_batch_generation(Batch())
    assert resolved == ["EAGLEWorker", "EAGLEWorkerV2"]
    assert fake_torch.cuda.syncs == 3 * 4                        # EAGLEWorker's: cycle start/end, verify begin/end


# --- real CUDA (skipped without it) -----------------------------------------------------------------------------
def _cuda_torch():
    try:
        import torch
    except ImportError:
        pytest.skip("torch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA")
    return torch


@pytest.mark.gpu
def test_gpu_a_cycle_inside_a_graph_capture_is_untimed_and_the_capture_works(load, logs):
    torch = _cuda_torch()
    rt = load(mode="events")
    a = torch.randn(512, 512, device="cuda")
    out = Obj(accept_lens=torch.tensor([1, 2], dtype=torch.int32, device="cuda"))

    class EAGLEWorkerV2(object):
        @rt.entry
        def forward_batch_generation(self, batch):
            rt.begin("verify", "decode")
            x = a @ a
            rt.end("verify")
            rt.accepted(out, ("accept_lens",), 0)
            return x

    w = EAGLEWorkerV2()
    w.forward_batch_generation(Batch(2))                        # timed: CUDA in use, a record
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):                                   # the default, "global" capture mode
        y = w.forward_batch_generation(Batch(2))                # inside the capture: no event, no copy, no sync
    g.replay()
    torch.cuda.synchronize()
    assert torch.allclose(y, a @ a)
    w.forward_batch_generation(Batch(2))
    rt.flush()
    recs = records(logs)
    assert len(recs) == 2 and all(r["accepted"] == 3 and r["timer"] == "events" for r in recs)
    assert rt._stats()["errors"] == 0


@pytest.mark.gpu
def test_gpu_the_writer_does_not_break_a_capture_on_another_thread(load, logs):
    """The writer queries the events of cycles still running on the GPU while the worker thread captures a CUDA
    graph (global mode, as sglang's runners do): the capture must survive."""
    torch = _cuda_torch()
    rt = load(mode="events")
    a = torch.randn(256, 256, device="cuda")
    (a @ a).sum().item()                                        # cuBLAS set up outside the capture

    class EAGLEWorkerV2(object):
        @rt.entry
        def forward_batch_generation(self, batch):
            rt.begin("verify", "decode")
            torch.cuda._sleep(int(4e8))                         # ~0.2 s of GPU time: the events stay pending
            rt.end("verify")

    EAGLEWorkerV2().forward_batch_generation(Batch(1))
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        g.capture_begin(capture_error_mode="global")
        try:
            time.sleep(0.1)                                     # the writer polls the pending cycle meanwhile
            b = a @ a
        finally:
            g.capture_end()
    g.replay()
    torch.cuda.synchronize()
    assert torch.allclose(b, a @ a)
    rt.flush()
    assert len(records(logs)) == 1 and rt._stats()["errors"] == 0
    assert rt._stats()["capture_relaxed"] is True


_CUDA_STATE_SCRIPT = """
import importlib.util, sys, torch
spec = importlib.util.spec_from_file_location("_eaglepatch_runtime", %r)
rt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rt)
rt.configure(mode=%r, log_dir=%r)

class Batch(object):
    reqs = [1, 2]

class EAGLEWorker(object):
    @rt.entry
    def forward_batch_generation(self, batch):
        rt.begin("verify", "decode")
        rt.end("verify")
        rt.accepted(torch.tensor([2, 3]), (), 1)

for _ in range(5):
    EAGLEWorker().forward_batch_generation(Batch())
rt.flush()
print(rt._stats()["timer"], torch.cuda.is_initialized())
"""


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["cpu", "sync", "events", "auto"])
def test_gpu_a_process_that_never_used_cuda_still_has_not(tmp_path, mode):
    """On a GPU machine, a process that has not initialised CUDA (torch imported, CPU tensors only): the runtime
    does not initialise it either, whatever the mode (the CUDA timers fall back to cpu)."""
    _cuda_torch()
    import subprocess
    proc = subprocess.run([sys.executable, "-c", _CUDA_STATE_SCRIPT % (str(RUNTIME), mode, str(tmp_path / "l"))],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["cpu", "False"], proc.stdout
    assert len(records(tmp_path / "l")) == 5


@pytest.mark.gpu
def test_gpu_a_process_whose_gpu_is_busy_for_a_minute_exits_within_exit_seconds(tmp_path):
    """The last cycles wait behind a minute of GPU work (as behind a collective whose peer died): exit gives up on
    them after exit_seconds instead of synchronising."""
    _cuda_torch()
    import subprocess
    script = """
import importlib.util, sys, time, torch
spec = importlib.util.spec_from_file_location("_eaglepatch_runtime", %r)
rt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rt)
rt.configure(mode="events", log_dir=%r, exit_seconds=1.0)
torch.zeros(1, device="cuda").sum().item()

class Batch(object):
    reqs = [1]

class EAGLEWorkerV2(object):
    @rt.entry
    def forward_batch_generation(self, batch, stuck):
        rt.begin("verify", "decode")
        if stuck:
            torch.cuda._sleep(int(1.2e11))                      # about a minute at 2 GHz
        rt.end("verify")

EAGLEWorkerV2().forward_batch_generation(Batch(), False)
torch.cuda.synchronize()
EAGLEWorkerV2().forward_batch_generation(Batch(), True)
EAGLEWorkerV2().forward_batch_generation(Batch(), False)
print(time.time(), flush=True)
""" % (str(RUNTIME), str(tmp_path / "l"))
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=300)
    end = time.time()
    assert proc.returncode == 0, proc.stderr
    exit_took = end - float(proc.stdout.strip())
    assert exit_took < 15, exit_took                            # 1 s of waiting, plus the CUDA teardown
    assert "[eaglepatch] 2 timing record(s) dropped" in proc.stderr, proc.stderr
    assert len(records(tmp_path / "l")) == 1
    print("exit took %.1f s (whole process %.1f s)" % (exit_took, end - t0))


def test_the_writer_sets_its_capture_mode_thread_local_once(load, logs, fake_torch, monkeypatch):
    """Before its first event query, the writer thread asks the CUDA driver (only if already loaded: RTLD_NOLOAD)
    for the thread-local stream-capture mode, so that its queries cannot invalidate another thread's capture."""
    import ctypes
    import os as os_mod
    calls = []

    class FakeDriver(object):
        def __init__(self, name, mode=0):
            calls.append(("open", name, mode))

        def cuThreadExchangeStreamCaptureMode(self, ref):
            calls.append(("mode", ref._obj.value, __import__("threading").current_thread().name))
            ref._obj.value = 0                                  # the previous mode comes back in it
            return 0

    monkeypatch.setattr(ctypes, "CDLL", FakeDriver)
    rt = load(mode="events")
    cuda = fake_torch.cuda
    for _ in range(2):
        cuda.done = False
        decode_worker(rt).forward_batch_generation(Batch())
        cuda.done = True
        rt.flush()
    assert len(records(logs)) == 2
    nolazy = os_mod.RTLD_NOLOAD | os_mod.RTLD_LAZY
    assert calls == [("open", "libcuda.so.1", nolazy), ("mode", 1, "eaglepatch-writer")]
    assert rt._stats()["capture_relaxed"] is True


def test_no_driver_loaded_means_no_capture_mode_change(load, logs, fake_torch, monkeypatch):
    import ctypes

    def not_loaded(name, mode=0):
        raise OSError("libcuda.so.1: cannot open shared object file")

    monkeypatch.setattr(ctypes, "CDLL", not_loaded)
    rt = load(mode="events")
    fake_torch.cuda.done = False
    decode_worker(rt).forward_batch_generation(Batch())
    fake_torch.cuda.done = True
    rt.flush()
    assert len(records(logs)) == 1 and rt._stats()["capture_relaxed"] is False and rt._stats()["errors"] == 0


def test_the_capture_mode_is_not_tried_before_a_cycle_waits(load, logs, fake_torch):
    """_stats' capture_relaxed: None until the writer first resolves waiting cycles (no thread asked the driver);
    cycles that never wait (the sync timer) never ask."""
    rt = load(mode="sync")
    assert rt._stats()["capture_relaxed"] is None
    decode_worker(rt).forward_batch_generation(Batch())
    rt.flush()
    assert len(records(logs)) == 1 and rt._stats()["capture_relaxed"] is None
