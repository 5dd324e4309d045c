"""What the timing runtime's tests share (eaglepatch/runtime/_eaglepatch_runtime.py): the runtime loaded fresh,
its logs read back, a fake worker to time, and a child interpreter to run one in.

The runtime is a standalone module copied into sglang, not a part of the eaglepatch package: every test loads it from
its file under a fresh name (``load_module``; the ``load``/``rt`` fixtures of conftest.py do so with the log dir
under tmp_path). A fake torch for the CUDA timers is in torch_fakes.py.
"""
import atexit
import glob
import itertools
import json
import os
import socket
import subprocess
import textwrap
import threading
import time
from pathlib import Path

RUNTIME = Path(__file__).resolve().parents[2] / "eaglepatch" / "runtime" / "_eaglepatch_runtime.py"
RECORD_KEYS = {"v", "t", "host", "pid", "rank", "run", "worker", "mode", "bs", "cycle_ms", "timer", "phases", "accepted"}
_names = itertools.count()


# --- the runtime, loaded fresh ----------------------------------------------------------------------------
def load_module(path=RUNTIME):
    """A fresh copy of the runtime module, its exit hook unregistered (the test flushes explicitly)."""
    import importlib.util

    name = "_eaglepatch_runtime_test_%d" % next(_names)
    spec = importlib.util.spec_from_file_location(name, str(path))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    atexit.unregister(mod._at_exit)
    return mod


# --- its logs, read back ----------------------------------------------------------------------------------
def lines(log_dir):
    """Every line (records and run headers) of every log in `log_dir`, parsed."""
    out = []
    for path in sorted(glob.glob(os.path.join(str(log_dir), "*.jsonl"))):
        with open(path) as f:
            out.extend(json.loads(line) for line in f)
    return out


def records(log_dir):
    """The timing records of every log in `log_dir` (run header and drops lines left out)."""
    return [d for d in lines(log_dir) if "kind" not in d]


def headers(log_dir):
    """The run header lines of every log in `log_dir`."""
    return [d for d in lines(log_dir) if d.get("kind") == "run"]


def log_files(log_dir):
    """The names of the logs in `log_dir`, sorted."""
    return sorted(os.path.basename(p) for p in glob.glob(os.path.join(str(log_dir), "*.jsonl")))


def log_name():
    """The name of this process's rank-0 log file: ``<host>-<pid>-rank0.jsonl``."""
    return "%s-%d-rank0.jsonl" % (socket.gethostname(), os.getpid())


def one_record(rt, logs):
    """Flush, then the one record in `logs` (fails unless there is exactly one)."""
    rt.flush()
    recs = records(logs)
    assert len(recs) == 1, recs
    return recs[0]


def wait_until(cond, timeout=5.0, what="the condition"):
    """Poll `cond()` (the writer thread works asynchronously) until it is true; fail after `timeout` s."""
    deadline = time.time() + timeout
    while True:
        try:
            if cond():
                return
        except ValueError:      # a JSON line caught mid-write
            pass
        if time.time() > deadline:
            raise AssertionError("timed out waiting for " + what)
        time.sleep(0.005)


# --- a worker to time ---------------------------------------------------------------------------------------
class Batch(object):
    """A batch of `n` requests (what the runtime reads the batch size from)."""

    def __init__(self, n=4):
        self.reqs = [object() for _ in range(n)]


class Obj(object):
    """An object with the given attributes (a worker's output, a batch without requests, ...)."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


def decode_worker(rt, sleeps=(0.0, 0.0, 0.0), out=None, attrs=("accept_lens",), bonus=0, name="EAGLEWorker"):
    """A fake worker whose entry method runs the three decode phases (sleeping `sleeps` seconds in each)."""

    def forward_batch_generation(self, batch):
        rt.begin("draft", "decode")
        if sleeps[0]:
            time.sleep(sleeps[0])
        rt.end("draft")
        rt.begin("verify", "decode")
        if sleeps[1]:
            time.sleep(sleeps[1])
        rt.end("verify")
        if out is not None:
            rt.accepted(out, attrs, bonus)
        rt.begin("draft_extend", "decode")
        if sleeps[2]:
            time.sleep(sleeps[2])
        rt.end("draft_extend")
        return ("result", batch)

    cls = type(name, (object,), {"forward_batch_generation": rt.entry(forward_batch_generation)})
    return cls()


def scripted_worker(rt, clock, steps, after=0.000123456789, out=None):
    """A worker whose phases take exactly the given seconds on the scripted clock ``clock`` (the hot path's); its
    accepted tokens from ``out.accept_lens`` when given."""
    class W(object):
        @rt.entry
        def forward_batch_generation(self, batch):
            for phase, dt in steps:
                rt.begin(phase, "decode")
                clock[0] += dt
                rt.end(phase)
            if out is not None:
                rt.accepted(out, ("accept_lens",))
            clock[0] += after               # in the cycle, in no phase

    return W()


STEPS = [("draft", 0.0123456789), ("verify", 0.00200004)]


# --- the writer thread ------------------------------------------------------------------------------------
def stand_in_writer(seconds):
    """A thread standing in for the writer: alive for ``seconds``, never answering a flush request."""
    t = threading.Thread(target=time.sleep, args=(seconds,), daemon=True)
    t.start()
    return t


# --- the runtime in a child interpreter -------------------------------------------------------------------
def worker_script(body):
    """A script that loads the runtime and defines a worker (EAGLEWorker, Batch, Out), then runs `body`."""
    return textwrap.dedent("""
        import importlib.util, os, sys, time
        spec = importlib.util.spec_from_file_location("_eaglepatch_runtime", %r)
        rt = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(rt)

        class Batch(object):
            reqs = [1, 2]

        class Out(object):
            accept_lens = [2, 3]

        class EAGLEWorker(object):
            @rt.entry
            def forward_batch_generation(self, batch):
                rt.begin("draft", "decode")
                rt.end("draft")
                rt.begin("verify", "decode")
                rt.end("verify")
                rt.accepted(Out(), ("accept_lens",), 1)
                return 1
        """ % str(RUNTIME)) + textwrap.dedent(body)


def run_script(python, script, env_extra, tmp_path):
    """Run `script` with `python`, no EAGLEPATCH_ variables but `env_extra`; the CompletedProcess."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EAGLEPATCH_")}
    env.update(env_extra)
    path = tmp_path / "script.py"
    path.write_text(script)
    return subprocess.run([python, str(path)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=120)


def open_calls(action):
    """The ``os.open`` calls that ``action()`` makes, each as (path, flags, its other positional arguments...,
    the names of its keyword arguments)."""
    real = os.open
    calls = []

    def spy(path, flags, *a, **kw):
        calls.append((path, flags) + a + tuple(sorted(kw)))
        return real(path, flags, *a, **kw)

    os.open = spy
    try:
        action()
    finally:
        os.open = real
    return calls
