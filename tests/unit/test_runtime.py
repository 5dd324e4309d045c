"""Unit tests of the timing runtime (eaglepatch/runtime/_eaglepatch_runtime.py).

The runtime is loaded fresh from its file for every test (it is a standalone module copied into sglang, not a
part of the eaglepatch package), with its log dir under tmp_path. CUDA timers are exercised against a small
fake `torch` (events that complete when told to, a device tensor whose host read would be a sync) so that
their logic is tested on any machine; the real-torch tests skip cleanly when torch is not installed.
"""
import ast
import atexit
import contextlib
import glob
import itertools
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import types
from pathlib import Path

import pytest

RUNTIME = Path(__file__).resolve().parents[2] / "eaglepatch" / "runtime" / "_eaglepatch_runtime.py"
RECORD_KEYS = {"v", "t", "host", "pid", "rank", "run", "worker", "mode", "bs", "cycle_ms", "timer", "phases", "accepted"}
_names = itertools.count()


# --- helpers -------------------------------------------------------------------------------------------
def load_module(path=RUNTIME):
    """A fresh copy of the runtime module, its exit hook unregistered (the test flushes explicitly)."""
    import importlib.util

    name = "_eaglepatch_runtime_test_%d" % next(_names)
    spec = importlib.util.spec_from_file_location(name, str(path))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    atexit.unregister(mod._at_exit)
    return mod


@pytest.fixture
def clean_env(monkeypatch):
    for key in list(os.environ):
        if key.startswith("EAGLEPATCH_"):
            monkeypatch.delenv(key)


@pytest.fixture
def load(tmp_path, clean_env):
    """load(**configure_kw) -> a fresh runtime writing to tmp_path/logs; cpu timer, no summaries, no time-based
    flush unless asked for."""
    loaded = []

    def _load(**kw):
        mod = load_module()
        kw.setdefault("mode", "cpu")               # the same on any machine; CUDA timers are asked for by name
        kw.setdefault("log_dir", str(tmp_path / "logs"))
        kw.setdefault("summary_every", 0)
        kw.setdefault("flush_seconds", 600.0)
        mod.configure(**kw)
        loaded.append(mod)
        return mod

    yield _load
    for mod in loaded:
        mod._stop_flusher()


@pytest.fixture
def rt(load):
    return load()


@pytest.fixture
def logs(tmp_path):
    return tmp_path / "logs"


def lines(log_dir):
    out = []
    for path in sorted(glob.glob(os.path.join(str(log_dir), "*.jsonl"))):
        with open(path) as f:
            out.extend(json.loads(line) for line in f)
    return out


def records(log_dir):
    """The timing records of every log in `log_dir` (run header lines left out)."""
    return [d for d in lines(log_dir) if d.get("kind") != "run"]


def headers(log_dir):
    """The run header lines of every log in `log_dir`."""
    return [d for d in lines(log_dir) if d.get("kind") == "run"]


def log_files(log_dir):
    return sorted(os.path.basename(p) for p in glob.glob(os.path.join(str(log_dir), "*.jsonl")))


class Batch(object):
    def __init__(self, n=4):
        self.reqs = [object() for _ in range(n)]


class Obj(object):
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


def one_record(rt, logs):
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


# --- the record -----------------------------------------------------------------------------------------
def test_record_matches_the_contract_schema(rt, logs):
    """One cycle gives exactly the CONTRACT keys, with their types, in <host>-<pid>-rank0.jsonl."""
    before = time.time()
    w = decode_worker(rt, out=Obj(accept_lens=[1, 2, 3, 4]), bonus=1)
    batch = Batch(4)
    assert w.forward_batch_generation(batch) == ("result", batch)
    rec = one_record(rt, logs)
    assert set(rec) == RECORD_KEYS | {"accepts"}  # per-request counts: the acceptance profile
    assert log_files(logs) == ["%s-%d-rank0.jsonl" % (socket.gethostname(), os.getpid())]
    assert rec["v"] == 1 and type(rec["v"]) is int
    assert type(rec["t"]) is float and before - 1 <= rec["t"] <= time.time() + 1
    assert rec["host"] == socket.gethostname()
    assert rec["pid"] == os.getpid() and rec["rank"] == 0
    assert rec["worker"] == "EAGLEWorker"
    assert rec["mode"] == "decode"
    assert rec["bs"] == 4 and type(rec["bs"]) is int
    assert type(rec["cycle_ms"]) is float and rec["cycle_ms"] >= 0
    assert rec["timer"] == "cpu"
    assert list(rec["phases"]) == ["draft", "verify", "draft_extend"]
    assert all(type(v) is float and v >= 0 for v in rec["phases"].values())
    assert rec["accepted"] == 14 and type(rec["accepted"]) is int
    assert rec["accepts"] == [2, 3, 4, 5]  # each request's drafts plus its bonus token, in batch order
    (head,) = headers(logs)
    assert head["run"] == rec["run"] and head["pid"] == os.getpid() and head["rank"] == 0
    assert head["timer"] == "cpu" and type(head["flags"]) is dict and type(head["argv"]) is list
    assert lines(logs)[0] == head         # the header comes first


def test_milliseconds_are_rounded_to_four_decimals(rt, logs):
    decode_worker(rt, sleeps=(0.001, 0.001, 0.001)).forward_batch_generation(Batch())
    rec = one_record(rt, logs)
    for value in [rec["cycle_ms"]] + list(rec["phases"].values()):
        assert round(value, 4) == value


def test_phase_durations_follow_the_work_done(rt, logs):
    """Phases sleeping 4, 12 and 2 ms read at least that long, in that order of size, within the cycle."""
    decode_worker(rt, sleeps=(0.004, 0.012, 0.002)).forward_batch_generation(Batch())
    rec = one_record(rt, logs)
    ph = rec["phases"]
    assert ph["draft"] >= 4.0 and ph["verify"] >= 12.0 and ph["draft_extend"] >= 2.0
    assert ph["verify"] > ph["draft"] > ph["draft_extend"]
    assert rec["cycle_ms"] >= sum(ph.values())
    assert rec["cycle_ms"] < 5000  # sanity only


def test_cycle_time_includes_work_outside_phases(rt, logs):
    class W(object):
        @rt.entry
        def forward_batch_generation(self, batch):
            time.sleep(0.005)
            rt.begin("verify", "decode")
            rt.end("verify")

    W().forward_batch_generation(Batch())
    rec = one_record(rt, logs)
    assert rec["cycle_ms"] >= 5.0
    assert rec["phases"]["verify"] < rec["cycle_ms"]


def test_only_phases_that_ran_are_recorded(rt, logs):
    """A cycle with just the target phase lists just it; an end() without begin() adds nothing."""
    class W(object):
        @rt.entry
        def forward_batch_generation(self, batch):
            rt.end("draft")
            rt.begin("target", "prefill")
            rt.end("target")
            return 1

    W().forward_batch_generation(Batch())
    assert one_record(rt, logs)["phases"].keys() == {"target"}
    assert rt._stats()["errors"] == 0


def test_cycle_with_no_phases_has_empty_phases(rt, logs):
    class W(object):
        @rt.entry
        def forward_batch_generation(self, batch):
            return 1

    W().forward_batch_generation(Batch())
    rec = one_record(rt, logs)
    assert rec["phases"] == {} and rec["mode"] == "decode" and rec["accepted"] is None


def test_prefill_mode_when_any_phase_begins_as_prefill(rt, logs):
    class W(object):
        @rt.entry
        def forward_batch_generation(self, batch, prefill):
            if prefill:
                rt.begin("target", "prefill")
                rt.end("target")
                rt.begin("draft_extend")            # no mode given: does not undo prefill
                rt.end("draft_extend")
            else:
                rt.begin("draft")
                rt.end("draft")
                rt.begin("verify", "decode")
                rt.end("verify")

    W().forward_batch_generation(Batch(), True)
    W().forward_batch_generation(Batch(), False)
    rt.flush()
    recs = records(logs)
    assert [r["mode"] for r in recs] == ["prefill", "decode"]
    assert list(recs[0]["phases"]) == ["target", "draft_extend"]
    assert list(recs[1]["phases"]) == ["draft", "verify"]


def test_mixed_modes_in_one_cycle_make_it_prefill(rt, logs):
    class W(object):
        @rt.entry
        def forward_batch_generation(self, batch):
            rt.begin("draft", "decode")
            rt.end("draft")
            rt.begin("draft_extend", "prefill")
            rt.end("draft_extend")

    W().forward_batch_generation(Batch())
    assert one_record(rt, logs)["mode"] == "prefill"


def test_nested_entry_calls_count_once_at_the_outermost(rt, logs):
    """A subclass entry calling super()'s entry gives one record, named after the subclass, with both phases."""
    class Base(object):
        @rt.entry
        def forward_batch_generation(self, batch):
            rt.begin("verify", "decode")
            time.sleep(0.002)
            rt.end("verify")
            return "base"

    class Sub(Base):
        @rt.entry
        def forward_batch_generation(self, batch):
            rt.begin("draft", "decode")
            rt.end("draft")
            return super(Sub, self).forward_batch_generation(batch) + "+sub"

    assert Sub().forward_batch_generation(Batch(3)) == "base+sub"
    rec = one_record(rt, logs)
    assert rec["worker"] == "Sub" and rec["bs"] == 3
    assert set(rec["phases"]) == {"draft", "verify"}
    assert rec["phases"]["verify"] >= 2.0


def test_repeated_phase_accumulates(rt, logs):
    class W(object):
        @rt.entry
        def forward_batch_generation(self, batch):
            for _ in range(2):
                rt.begin("draft", "decode")
                time.sleep(0.003)
                rt.end("draft")
                time.sleep(0.003)               # between the two: not draft time

    W().forward_batch_generation(Batch())
    rec = one_record(rt, logs)
    assert 6.0 <= rec["phases"]["draft"] < rec["cycle_ms"]
    assert rec["cycle_ms"] >= 12.0


def test_begin_of_an_open_phase_keeps_the_first_start(rt, logs):
    class W(object):
        @rt.entry
        def forward_batch_generation(self, batch):
            rt.begin("draft")
            time.sleep(0.004)
            rt.begin("draft")
            rt.end("draft")

    W().forward_batch_generation(Batch())
    assert one_record(rt, logs)["phases"]["draft"] >= 4.0


def test_open_phase_is_closed_at_cycle_end(rt, logs):
    """A phase never ended (an early return) runs to the cycle's end."""
    class W(object):
        @rt.entry
        def forward_batch_generation(self, batch):
            rt.begin("verify", "decode")
            rt.end("verify")
            rt.begin("draft_extend", "decode")
            time.sleep(0.004)
            return "early"

    assert W().forward_batch_generation(Batch()) == "early"
    rec = one_record(rt, logs)
    assert 4.0 <= rec["phases"]["draft_extend"] <= rec["cycle_ms"]


def test_hooks_outside_a_cycle_do_nothing(rt, logs):
    rt.begin("draft", "prefill")
    rt.end("draft")
    rt.accepted(Obj(accept_lens=[1]), ("accept_lens",), 1)
    rt.flush()
    assert records(logs) == [] and rt._stats()["errors"] == 0
    decode_worker(rt).forward_batch_generation(Batch())
    rec = one_record(rt, logs)
    assert rec["mode"] == "decode" and rec["accepted"] is None


def test_entry_keeps_the_wrapped_function_identity(rt):
    def forward_batch_generation(self, batch, on_publish=None):
        """doc"""
        return on_publish

    wrapped = rt.entry(forward_batch_generation)
    assert wrapped._eaglepatch_entry is True                    # what `status` and the tests look for
    assert wrapped.__name__ == "forward_batch_generation" and wrapped.__doc__ == "doc"
    assert wrapped.__wrapped__ is forward_batch_generation
    assert wrapped(Obj(), Batch(), on_publish=7) == 7


# --- accepted -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("value, bonus, bs, expected", [
    ([1, 2, 3], 1, 3, 9),             # per-request drafts + one bonus each (V1 accept_length_per_req_cpu)
    ((2, 2), 0, 2, 4),                # tuple, bonus already included
    ([], 1, 0, 0),
    (7, 0, 4, 7),                     # an int is a total
    (7, 1, 4, 11),                    # ... plus bonus_per_req * bs
    (True, 0, 1, 1),
])
def test_accepted_sums_counts_and_adds_the_bonus(rt, logs, value, bonus, bs, expected):
    decode_worker(rt, out=Obj(accept_lens=value), bonus=bonus).forward_batch_generation(Batch(bs))
    assert one_record(rt, logs)["accepted"] == expected


def test_accepted_int_with_bonus_and_unknown_bs_is_null(rt, logs):
    decode_worker(rt, out=Obj(accept_lens=7), bonus=1).forward_batch_generation(Obj())
    rec = one_record(rt, logs)
    assert rec["bs"] is None and rec["accepted"] is None


def test_accepted_uses_the_first_attribute_present(rt, logs):
    out = Obj(num_correct_drafts_per_req_cpu=[1, 1], accept_length_per_req_cpu=None)
    attrs = ("accept_length_per_req_cpu", "missing", "num_correct_drafts_per_req_cpu")
    decode_worker(rt, out=out, attrs=attrs, bonus=1).forward_batch_generation(Batch(2))
    assert one_record(rt, logs)["accepted"] == 4


def test_accepted_null_when_no_attribute_or_never_called(rt, logs):
    decode_worker(rt, out=Obj(other=[1])).forward_batch_generation(Batch())
    decode_worker(rt).forward_batch_generation(Batch())
    rt.flush()
    assert [r["accepted"] for r in records(logs)] == [None, None]
    assert rt._stats()["errors"] == 0


def test_accepted_accepts_a_single_attribute_name(rt, logs):
    decode_worker(rt, out=Obj(accept_lens=[2, 2]), attrs="accept_lens").forward_batch_generation(Batch(2))
    assert one_record(rt, logs)["accepted"] == 4


@pytest.mark.parametrize("value, bonus, expected", [
    (5, 1, 9),                        # NGRAM up to 0.5.13: num_accepted_tokens (drafts only) + 1 bonus x bs 4
    ([3, 4, 0, 0], 0, 7),             # NGRAM 0.5.14+: eagle_sample's accept_lens, bonus included
    (None, 1, None),                  # nothing to read: null, not an error
])
@pytest.mark.parametrize("attrs", [(), []], ids=["tuple", "list"])
def test_accepted_with_no_attrs_reads_the_value_itself(rt, logs, value, bonus, expected, attrs):
    """A recipe fact with ``attrs = []`` makes the patch call ``accepted(value, (), bonus)``: the value itself
    is the count (patches/README.md), never looked up as an attribute."""
    class W(object):
        @rt.entry
        def forward_batch_generation(self, batch):
            rt.accepted(value, attrs, bonus)

    W().forward_batch_generation(Batch(4))
    assert one_record(rt, logs)["accepted"] == expected
    assert rt._stats()["errors"] == 0


def test_accepted_last_call_in_a_cycle_wins(rt, logs):
    """Nested entry methods may both report the same verify output: it must not count twice."""
    class W(object):
        @rt.entry
        def forward_batch_generation(self, batch):
            rt.accepted(Obj(a=[5, 5]), ("a",), 0)
            rt.accepted(Obj(a=[3, 3]), ("a",), 0)

    W().forward_batch_generation(Batch(2))
    assert one_record(rt, logs)["accepted"] == 6


def test_accepted_of_an_unusable_value_is_an_error_not_a_crash(rt, logs, capsys):
    decode_worker(rt, out=Obj(accept_lens=object())).forward_batch_generation(Batch())
    rec = one_record(rt, logs)
    assert rec["accepted"] is None
    assert rt._stats()["errors"] == 1
    assert "internal error in accepted" in capsys.readouterr().err


def test_accepted_from_a_real_torch_cpu_tensor(rt, logs):
    torch = pytest.importorskip("torch")
    out = Obj(accept_lens=torch.tensor([2, 3, 4], dtype=torch.int32))
    decode_worker(rt, out=out, bonus=1).forward_batch_generation(Batch(3))
    out0 = Obj(accept_lens=torch.tensor(5))          # 0-d: a total
    decode_worker(rt, out=out0, bonus=1).forward_batch_generation(Batch(3))
    rt.flush()
    assert [r["accepted"] for r in records(logs)] == [12, 8]


# --- batch size -----------------------------------------------------------------------------------------
class _Shape(object):
    def __init__(self, *dims):
        self.shape = tuple(dims)


class _BatchSizeOnly(object):
    def batch_size(self):
        return 6


@pytest.mark.parametrize("args, kwargs, expected", [
    ((Batch(5),), {}, 5),                                          # len(batch.reqs)
    ((Obj(reqs=None, seq_lens=_Shape(7)),), {}, 7),                # seq_lens.shape[0]
    ((Obj(seq_lens=[1, 2]),), {}, 2),                              # len(seq_lens)
    ((_BatchSizeOnly(),), {}, 6),                                  # batch.batch_size()
    ((), {"batch": Batch(2)}, 2),
    ((), {"model_worker_batch": Obj(seq_lens=_Shape(3, 9))}, 3),
    ((Obj(),), {}, None),
    ((), {}, None),
    ((None,), {}, None),
])
def test_batch_size_detection(rt, logs, args, kwargs, expected):
    class W(object):
        @rt.entry
        def forward_batch_generation(self, *a, **kw):
            return a, kw

    assert W().forward_batch_generation(*args, **kwargs) == (args, kwargs)
    assert one_record(rt, logs)["bs"] == expected


def test_batch_size_that_raises_gives_null(rt, logs):
    class Bad(object):
        def batch_size(self):
            raise RuntimeError("no")

    decode_worker(rt).forward_batch_generation(Bad())
    assert one_record(rt, logs)["bs"] is None


# --- sampling, buffering, flushing ----------------------------------------------------------------------
def test_every_n_times_one_call_in_n(load, logs):
    rt = load(every=3)
    calls = []

    class W(object):
        @rt.entry
        def forward_batch_generation(self, batch, i):
            calls.append(i)
            rt.begin("draft", "prefill" if i % 2 else "decode")
            rt.end("draft")
            rt.accepted(Obj(a=[i]), ("a",), 0)
            return i

    assert [W().forward_batch_generation(Batch(), i) for i in range(7)] == list(range(7))
    assert calls == list(range(7))
    rt.flush()
    recs = records(logs)
    assert [r["accepted"] for r in recs] == [0, 3, 6]          # calls 1, 4, 7 are timed
    assert [r["mode"] for r in recs] == ["decode", "prefill", "decode"]
    assert rt._stats()["errors"] == 0


def test_no_write_before_flush_records_then_one_batch(load, logs):
    rt = load(flush_records=5, flush_seconds=600.0)
    w = decode_worker(rt)
    for _ in range(4):
        w.forward_batch_generation(Batch())
    assert log_files(logs) == []
    assert rt._stats()["buffered"] == 4
    w.forward_batch_generation(Batch())                         # the 5th: the writer writes the batch
    wait_until(lambda: len(records(logs)) == 5, what="the batch of 5")
    assert rt._stats()["buffered"] == 0
    for _ in range(2):
        w.forward_batch_generation(Batch())
    time.sleep(0.05)
    assert len(records(logs)) == 5
    rt.flush()
    assert len(records(logs)) == 7
    assert len(log_files(logs)) == 1                            # appended to the same file


def test_records_flush_seconds_old_are_written_then(load, logs):
    """The writer writes when the oldest buffered record is flush_seconds old, not before."""
    rt = load(flush_records=1000, flush_seconds=0.3)
    w = decode_worker(rt)
    t0 = time.time()
    w.forward_batch_generation(Batch())
    w.forward_batch_generation(Batch())
    time.sleep(0.1)
    assert log_files(logs) == []
    wait_until(lambda: len(records(logs)) == 2, what="the two records")
    assert time.time() - t0 >= 0.28


def test_idle_flush_writes_old_records_without_a_new_cycle(load, logs):
    """The server goes quiet after a run: its last records reach the file within about flush_seconds."""
    rt = load(flush_records=1000, flush_seconds=0.1)
    decode_worker(rt).forward_batch_generation(Batch())
    deadline = time.time() + 5.0
    # wait for the record itself, not the file: the file exists a moment before the write reaches it
    while time.time() < deadline:
        try:
            if records(logs):
                break
        except ValueError:  # caught mid-write
            pass
        time.sleep(0.02)
    assert len(records(logs)) == 1


def test_flush_with_nothing_buffered_writes_nothing(rt, logs):
    rt.flush()
    assert not logs.exists()


def test_log_dir_is_created_private(load, tmp_path):
    log_dir = tmp_path / "a" / "b"
    rt = load(log_dir=str(log_dir))
    decode_worker(rt).forward_batch_generation(Batch())
    rt.flush()
    assert stat.S_IMODE(os.stat(str(log_dir)).st_mode) == 0o700
    assert len(records(log_dir)) == 1


def test_existing_log_dir_keeps_its_mode(load, tmp_path):
    log_dir = tmp_path / "shared"
    log_dir.mkdir()
    os.chmod(str(log_dir), 0o755)
    rt = load(log_dir=str(log_dir))
    decode_worker(rt).forward_batch_generation(Batch())
    rt.flush()
    assert stat.S_IMODE(os.stat(str(log_dir)).st_mode) == 0o755
    assert len(records(log_dir)) == 1


def _script(body):
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


def _run(python, script, env_extra, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("EAGLEPATCH_")}
    env.update(env_extra)
    path = tmp_path / "script.py"
    path.write_text(script)
    return subprocess.run([python, str(path)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=120)


def test_records_are_flushed_at_normal_exit(tmp_path):
    log_dir = tmp_path / "exit-logs"
    proc = _run(sys.executable, _script("""
        w = EAGLEWorker()
        for _ in range(5):
            w.forward_batch_generation(Batch())
        print(os.getpid())
        """), {"EAGLEPATCH_LOG_DIR": str(log_dir)}, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "[eaglepatch]" not in proc.stderr
    pid = int(proc.stdout.strip())
    assert log_files(log_dir) == ["%s-%d-rank0.jsonl" % (socket.gethostname(), pid)]
    recs = records(log_dir)
    assert len(recs) == 5
    assert all(r["pid"] == pid and r["accepted"] == 7 and r["bs"] == 2 for r in recs)


def test_environment_overrides_the_config_line_in_the_server(tmp_path):
    log_dir = tmp_path / "env-logs"
    proc = _run(sys.executable, _script("""
        w = EAGLEWorker()
        for _ in range(5):
            w.forward_batch_generation(Batch())
        """), {"EAGLEPATCH_LOG_DIR": str(log_dir), "EAGLEPATCH_EVERY": "2", "EAGLEPATCH_MODE": "events",
               "EAGLEPATCH_SUMMARY_EVERY": "2"}, tmp_path)
    assert proc.returncode == 0, proc.stderr
    recs = records(log_dir)
    assert len(recs) == 3                                       # calls 1, 3, 5
    # events asked for, but this process never initialised CUDA (nor has torch, maybe), and the runtime does not
    # initialise it: the record says what was used.
    assert all(r["timer"] == "cpu" for r in recs)
    assert len([l for l in proc.stderr.splitlines() if l.startswith("[eaglepatch] rank0 EAGLEWorker")]) == 1


def _python38():
    candidates = [shutil.which("python3.8")]
    candidates += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.8*/bin/python3.8")))
    for c in candidates:
        if not c:
            continue
        try:
            out = subprocess.run([c, "-c", "import sys; print(sys.version_info[:2])"], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, universal_newlines=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            continue
        if out.returncode == 0 and out.stdout.strip() == "(3, 8)":
            return c
    return None


def test_runs_under_python_3_8(tmp_path):
    """The oldest interpreter a server may run: import, time cycles, summary, flush at exit."""
    python = _python38()
    if python is None:
        pytest.skip("no python3.8 interpreter found")
    log_dir = tmp_path / "py38-logs"
    proc = _run(python, _script("""
        w = EAGLEWorker()
        for _ in range(4):
            w.forward_batch_generation(Batch())
        rt.flush()
        for _ in range(2):
            w.forward_batch_generation(Batch())
        """), {"EAGLEPATCH_LOG_DIR": str(log_dir), "EAGLEPATCH_SUMMARY_EVERY": "3"}, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "internal error" not in proc.stderr
    assert len([l for l in proc.stderr.splitlines() if l.startswith("[eaglepatch] rank0")]) == 2
    recs = records(log_dir)
    assert len(recs) == 6 and all(set(r) - {"accepts"} == RECORD_KEYS for r in recs)


def test_source_parses_as_python_3_8():
    src = RUNTIME.read_text()
    ast.parse(src, filename=str(RUNTIME), feature_version=(3, 8))
    # What feature_version does not catch: 3.9+ str methods. (PEP 604/585 annotations would need
    # `from __future__ import annotations`; the module has no annotations. The python3.8 run covers the rest.)
    tree = ast.parse(src)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            assert node.attr not in ("removeprefix", "removesuffix"), node.lineno
        if isinstance(node, (ast.FunctionDef, ast.arg)):
            assert getattr(node, "returns", None) is None and getattr(node, "annotation", None) is None


def test_only_stdlib_and_torch_are_imported():
    tree = ast.parse(RUNTIME.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0
            names.add(node.module.split(".")[0])
    stdlib = {"atexit", "functools", "json", "os", "socket", "sys", "threading", "time", "traceback",
              "collections", "errno", "stat", "tempfile", "ctypes", "re"}
    assert names - stdlib <= {"torch"}, names - stdlib


# --- the config line ------------------------------------------------------------------------------------
CONFIG_RE = re.compile(r"^_CONFIG = (\{.*\})  # eaglepatch:config$")


def test_config_line_is_one_line_with_the_defaults():
    lines = RUNTIME.read_text().splitlines()
    hits = [i for i, line in enumerate(lines) if "eaglepatch:config" in line]
    assert len(hits) == 1
    m = CONFIG_RE.match(lines[hits[0]])
    assert m, lines[hits[0]]
    assert ast.literal_eval(m.group(1)) == {"mode": "auto", "timers": {}, "every": 1, "log_dir": "/tmp/eaglepatch",
                                            "summary_every": 2000, "flush_records": 256, "flush_seconds": 2.0,
                                            "buffer_records": 8192, "exit_seconds": 2.0}
    # the first statement of the module (after the docstring), so an installer finds it at the top
    body = ast.parse(RUNTIME.read_text()).body
    assert isinstance(body[1], ast.Assign) and body[1].targets[0].id == "_CONFIG"


def test_a_rewritten_config_line_is_used(tmp_path, clean_env):
    """What the installer does: replace the dict literal on the marked line."""
    new = {"mode": "cpu", "timers": {"EAGLEWorker": "sync"}, "every": 4, "log_dir": str(tmp_path / "x"),
           "summary_every": 0, "flush_records": 9, "flush_seconds": 1.5, "buffer_records": 77, "exit_seconds": 0.5}
    src = RUNTIME.read_text().splitlines(True)
    src = [("_CONFIG = %r  # eaglepatch:config\n" % new) if "eaglepatch:config" in l else l for l in src]
    path = tmp_path / "_eaglepatch_runtime.py"
    path.write_text("".join(src))
    mod = load_module(path)
    assert mod._stats()["config"] == new
    # What `apply` writes (eaglepatch/ops/runtime_file.py render_runtime): no buffer_records/exit_seconds: defaults.
    apply_line = {"mode": "auto", "timers": {"EAGLEWorkerV2": "events"}, "every": 1, "log_dir": str(tmp_path / "y"),
                  "summary_every": 2000, "flush_records": 256, "flush_seconds": 2.0}
    src = [("_CONFIG = %s  # eaglepatch:config\n" % json.dumps(apply_line)) if "eaglepatch:config" in l else l
           for l in src]
    path.write_text("".join(src))
    assert load_module(path)._stats()["config"] == dict(apply_line, buffer_records=8192, exit_seconds=2.0)


def test_environment_overrides_and_bad_values_are_ignored(monkeypatch, clean_env, tmp_path, capsys):
    monkeypatch.setenv("EAGLEPATCH_MODE", "Events")
    monkeypatch.setenv("EAGLEPATCH_LOG_DIR", str(tmp_path / "envdir"))
    monkeypatch.setenv("EAGLEPATCH_EVERY", "3")
    monkeypatch.setenv("EAGLEPATCH_SUMMARY_EVERY", "0")
    cfg = load_module()._stats()["config"]
    assert (cfg["mode"], cfg["log_dir"], cfg["every"], cfg["summary_every"]) == (
        "events", str(tmp_path / "envdir"), 3, 0)
    monkeypatch.setenv("EAGLEPATCH_MODE", "gpu")
    monkeypatch.setenv("EAGLEPATCH_EVERY", "0")
    monkeypatch.setenv("EAGLEPATCH_SUMMARY_EVERY", "many")
    capsys.readouterr()
    cfg = load_module()._stats()["config"]
    assert (cfg["mode"], cfg["every"], cfg["summary_every"]) == ("auto", 1, 2000)
    assert capsys.readouterr().err.splitlines() == [
        "[eaglepatch] ignoring EAGLEPATCH_MODE='gpu': not one of sync, events, cpu, auto",
        "[eaglepatch] ignoring EAGLEPATCH_EVERY='0': not an integer >= 1",
        "[eaglepatch] ignoring EAGLEPATCH_SUMMARY_EVERY='many': not an integer >= 0"]
    monkeypatch.setenv("EAGLEPATCH_EVERY", "1")             # the least allowed
    assert load_module()._stats()["config"]["every"] == 1
    assert "EAGLEPATCH_EVERY" not in capsys.readouterr().err
    for name in ("EAGLEPATCH_MODE", "EAGLEPATCH_LOG_DIR", "EAGLEPATCH_EVERY", "EAGLEPATCH_SUMMARY_EVERY"):
        monkeypatch.setenv(name, "  ")                  # set but blank: as if unset, and nothing to say
    cfg = load_module()._stats()["config"]
    assert (cfg["mode"], cfg["log_dir"], cfg["every"], cfg["summary_every"]) == ("auto", "/tmp/eaglepatch", 1, 2000)
    assert capsys.readouterr().err == ""


def test_configure_rejects_unknown_keys_and_resets_state(rt, logs):
    with pytest.raises(TypeError, match=r"^configure\(\) got unknown keys: colour, size$"):
        rt.configure(size=3, colour="blue", every=2)
    assert rt._stats()["config"]["every"] == 1                  # nothing of a rejected call is applied
    fresh = rt._stats()
    assert (fresh["timer"], fresh["path"], fresh["log_dir"], fresh["dropped"]) == (None, None, None, 0)
    decode_worker(rt).forward_batch_generation(Batch())
    rt.flush()
    decode_worker(rt).forward_batch_generation(Batch())
    stats = rt._stats()
    assert stats["buffered"] == 1 and stats["timer"] == "cpu" and stats["path"].startswith(str(logs))
    rt.configure(log_dir=str(logs), summary_every=0)
    stats = rt._stats()
    assert (stats["buffered"], stats["records"], stats["timer"], stats["path"], stats["log_dir"]) == (
        0, 0, None, None, None)


# --- never raise into the server ------------------------------------------------------------------------
def test_unusable_log_dir_falls_back_to_a_private_one_and_says_so_once(load, tmp_path, capsys, monkeypatch):
    """A log dir that is a file: the records go to a private directory the runtime makes, said once."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    rt = load(log_dir=str(not_a_dir), flush_records=2)
    w = decode_worker(rt)
    for _ in range(5):
        assert w.forward_batch_generation(Batch())[0] == "result"
    rt.flush()
    rt.flush()
    err = capsys.readouterr().err
    assert err.count("[eaglepatch]") == 1 and str(not_a_dir) in err
    stats = rt._stats()
    fallback = stats["log_dir"]
    assert fallback != str(not_a_dir) and os.path.basename(fallback).startswith("eaglepatch-")
    assert fallback in err and os.path.dirname(fallback) == str(tmp_path)
    assert stat.S_IMODE(os.stat(fallback).st_mode) == 0o700
    assert len(records(fallback)) == 5 and stats["errors"] == 0 and stats["dropped"] == 0
    assert not_a_dir.read_text() == "x"


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes anywhere")
def test_read_only_log_dir_never_raises(load, tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    os.chmod(str(ro), 0o500)
    try:
        rt = load(log_dir=str(ro))
        assert decode_worker(rt).forward_batch_generation(Batch())[0] == "result"
        rt.flush()
        err = capsys.readouterr().err
        assert err.count("[eaglepatch]") == 1 and "instead" in err
    finally:
        os.chmod(str(ro), 0o700)


@pytest.mark.parametrize("broken", ["_perf", "_wall", "_emit", "_batch_size", "_start"])
def test_a_broken_runtime_still_calls_the_function_once(rt, logs, monkeypatch, capsys, broken):
    def boom(*a, **k):
        raise RuntimeError("broken " + broken)

    monkeypatch.setattr(rt, broken, boom)
    calls = []

    class W(object):
        @rt.entry
        def forward_batch_generation(self, batch):
            calls.append(1)
            rt.begin("draft", "decode")
            rt.end("draft")
            rt.accepted(Obj(a=[1]), ("a",), 0)
            return "value"

    w = W()
    assert w.forward_batch_generation(Batch()) == "value"
    assert w.forward_batch_generation(Batch()) == "value"
    assert calls == [1, 1]
    rt.flush()                              # errors are printed by the writer thread, not the worker's
    err = capsys.readouterr().err
    assert err.count("[eaglepatch] internal error in entry") == 1 and ("broken " + broken) in err
    assert err.count("[eaglepatch]") == 1
    assert rt._stats()["errors"] == 2                           # one per call, nothing more


def test_a_failing_hook_does_not_stop_the_cycle(rt, logs, capsys):
    class W(object):
        @rt.entry
        def forward_batch_generation(self, batch):
            rt.begin(["unhashable"], "decode")
            rt.begin("verify", "decode")
            rt.end(["unhashable"])
            rt.end("verify")
            return 3

    assert W().forward_batch_generation(Batch()) == 3
    rec = one_record(rt, logs)
    assert list(rec["phases"]) == ["verify"]
    err = capsys.readouterr().err
    assert "internal error in begin" in err and "internal error in end" in err


def test_an_exception_propagates_unchanged_and_leaves_no_record(rt, logs):
    err = ValueError("boom")

    class W(object):
        @rt.entry
        def forward_batch_generation(self, batch, fail):
            rt.begin("draft", "decode")
            if fail:
                raise err
            rt.end("draft")
            return "ok"

    w = W()
    with pytest.raises(ValueError) as info:
        w.forward_batch_generation(Batch(), True)
    assert info.value is err
    rt.begin("verify")                      # the failed cycle is over: hooks are no-ops again
    assert w.forward_batch_generation(Batch(), False) == "ok"
    rt.flush()
    recs = records(logs)
    assert len(recs) == 1 and list(recs[0]["phases"]) == ["draft"]
    assert rt._stats()["errors"] == 0


def test_base_exceptions_propagate_too(rt, logs):
    class W(object):
        @rt.entry
        def forward_batch_generation(self, batch):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        W().forward_batch_generation(Batch())
    rt.flush()
    assert records(logs) == []


# --- rank -----------------------------------------------------------------------------------------------
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


def test_rank_falls_back_to_zero(rt, logs):
    """No torch.distributed in the process (or one not initialised): rank 0."""
    decode_worker(rt).forward_batch_generation(Batch())
    assert one_record(rt, logs)["rank"] == 0
    assert log_files(logs)[0].endswith("-rank0.jsonl")


@pytest.mark.parametrize("dist, expected", [
    (FakeDist(3), 3),
    (FakeDist(3, initialized=False), 0),
    (FakeDist(3, available=False), 0),
    (FakeDist(RuntimeError("no group")), 0),
])
def test_rank_from_torch_distributed(rt, logs, dist, expected):
    decode_worker(rt).forward_batch_generation(Batch())
    rt._DIST = dist                             # after the cycle: the rank is read at the first write
    rec = one_record(rt, logs)
    assert rec["rank"] == expected
    assert log_files(logs) == ["%s-%d-rank%d.jsonl" % (socket.gethostname(), os.getpid(), expected)]


def test_rank_is_fixed_at_the_first_write(rt, logs):
    rt._DIST = FakeDist(2)
    w = decode_worker(rt)
    w.forward_batch_generation(Batch())
    rt.flush()
    rt._DIST = FakeDist(5)
    w.forward_batch_generation(Batch())
    rt.flush()
    assert [r["rank"] for r in records(logs)] == [2, 2] and len(log_files(logs)) == 1


# --- summaries ------------------------------------------------------------------------------------------
SUMMARY_RE = re.compile(
    r"^\[eaglepatch\] rank(\d+) (\w+) (decode|prefill) n=(\d+) cycle ([0-9.]+) ms"
    r"(?: \| ((?:\w+ [0-9.]+ \(\d+%\) ?)+))?(?: \| accept len ([0-9.]+))?(?: \| ([0-9.]+) tok/s)?$")


def test_summary_line_every_k_records(load, capsys):
    rt = load(summary_every=3)
    w = decode_worker(rt, sleeps=(0.001, 0.002, 0.0), out=Obj(accept_lens=[3, 3, 3, 3]), name="EAGLEWorkerV2")
    for i in range(7):
        w.forward_batch_generation(Batch(4))
        if i == 1:
            rt.flush()
            assert capsys.readouterr().err == ""
    rt.flush()
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2, lines
    for line in lines:
        m = SUMMARY_RE.match(line)
        assert m, line
        rank, worker, mode, n, cycle, phases, accept_len, tps = m.groups()
        assert (rank, worker, mode, n) == ("0", "EAGLEWorkerV2", "decode", "3")
        assert [p.split()[0] for p in re.findall(r"\w+ [0-9.]+ \(", phases)] == ["draft", "verify", "draft_extend"]
        assert float(accept_len) == 3.0
        assert float(tps) > 0 and float(cycle) >= 3.0
        # tok/s = sum(accepted) / sum(cycle_ms) * 1000 (loosely: the cycle is printed rounded)
        assert abs(float(tps) - 12 / float(cycle) * 1000) / float(tps) < 0.05


def test_summary_has_one_line_per_worker_and_mode(load, capsys):
    rt = load(summary_every=4)

    class W(object):
        @rt.entry
        def forward_batch_generation(self, batch, prefill):
            rt.begin("target" if prefill else "draft", "prefill" if prefill else "decode")
            rt.end("target" if prefill else "draft")

    for prefill in (True, False, False, False):
        W().forward_batch_generation(Batch(), prefill)
    rt.flush()
    lines = capsys.readouterr().err.splitlines()
    assert [SUMMARY_RE.match(l).group(3, 4) for l in lines] == [("prefill", "1"), ("decode", "3")]
    assert all("accept len" not in l and "tok/s" not in l for l in lines)


def test_summary_off_with_zero(load, capsys):
    rt = load(summary_every=0)
    w = decode_worker(rt)
    for _ in range(10):
        w.forward_batch_generation(Batch())
    rt.flush()
    assert capsys.readouterr().err == ""


# --- threads and fork -----------------------------------------------------------------------------------
def test_cycles_on_two_threads_do_not_mix(rt, logs):
    barrier = threading.Barrier(2)

    def make(name, phase, n):
        class W(object):
            @rt.entry
            def forward_batch_generation(self, batch):
                rt.begin(phase, "decode")
                barrier.wait(5)                    # both threads inside their cycles at once
                rt.end(phase)
                rt.accepted(Obj(a=[n]), ("a",), 0)
        W.__name__ = name
        return W()

    wa, wb = make("A", "draft", 1), make("B", "verify", 2)
    ta = threading.Thread(target=lambda: [wa.forward_batch_generation(Batch()) for _ in range(20)])
    tb = threading.Thread(target=lambda: [wb.forward_batch_generation(Batch()) for _ in range(20)])
    ta.start()
    tb.start()
    ta.join(30)
    tb.join(30)
    rt.flush()
    recs = records(logs)
    assert len(recs) == 40
    for r in recs:
        assert (list(r["phases"]), r["accepted"]) == ((["draft"], 1) if r["worker"] == "A" else (["verify"], 2))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_forked_child_writes_its_own_file_and_not_the_parents_buffer(rt, logs):
    w = decode_worker(rt, out=Obj(accept_lens=[1]))
    for _ in range(3):
        w.forward_batch_generation(Batch())
    assert rt._stats()["buffered"] == 3
    pid = os.fork()
    if pid == 0:                                                # the child
        code = 1
        try:
            decode_worker(rt, out=Obj(accept_lens=[9])).forward_batch_generation(Batch())
            rt.flush()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    rt.flush()
    host = socket.gethostname()
    assert log_files(logs) == sorted(["%s-%d-rank0.jsonl" % (host, os.getpid()), "%s-%d-rank0.jsonl" % (host, pid)])
    by_pid = {}
    for r in records(logs):
        by_pid.setdefault(r["pid"], []).append(r["accepted"])
    assert by_pid == {os.getpid(): [1, 1, 1], pid: [9]}


def test_a_buffer_from_another_pid_is_never_written(rt, logs):
    """Belt and braces for forks that skip the at-fork hook: the write checks the pid itself."""
    decode_worker(rt).forward_batch_generation(Batch())
    rt._pid = -1                                            # as if this buffer came from a parent
    rt.flush()
    assert records(logs) == [] and rt._stats()["buffered"] == 0
    decode_worker(rt).forward_batch_generation(Batch())
    rt.flush()
    assert len(records(logs)) == 1


# --- CUDA timers, against a fake torch -------------------------------------------------------------------
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
        if len(self.shape) == 2:                    # nested, as torch gives it
            n = self.shape[1]
            return [list(self.values[i:i + n]) for i in range(0, len(self.values), n)]
        return list(self.values)

    def sum(self):
        total = sum(self.values)
        return types.SimpleNamespace(item=lambda: total)


@pytest.fixture
def fake_torch(monkeypatch):
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
    monkeypatch.setitem(sys.modules, "torch", torch)
    return torch


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
            assert rec["phases"][name] == pytest.approx(2 * host_ms, rel=0.01, abs=0.01)
        assert rec["cycle_ms"] == pytest.approx(2 * rec["host_cycle_ms"], rel=0.01, abs=0.01)
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


def test_cuda_modes_fall_back_to_cpu_without_cuda(load, logs, fake_torch):
    fake_torch.cuda.is_available = lambda: False
    rt = load(mode="events")
    decode_worker(rt).forward_batch_generation(Batch())
    rec = one_record(rt, logs)
    assert rec["timer"] == "cpu" and "host_phases" not in rec


# --- real CUDA (skipped without it) ---------------------------------------------------------------------
def _cuda_torch():
    try:
        import torch
    except ImportError:
        pytest.skip("torch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA")
    return torch


def _gpu_worker(rt, torch, n_verify=20):
    """Decode phases with real kernels: one matmul in draft, n_verify in verify, accept_lens on the GPU."""
    a = torch.randn(2048, 2048, device="cuda")
    accept = torch.tensor([2, 3, 4, 1], dtype=torch.int32, device="cuda")
    (a @ a).sum().item()                            # warm up: cuBLAS set-up is not a phase
    torch.cuda.synchronize()

    class EAGLEWorkerV2(object):
        @rt.entry
        def forward_batch_generation(self, model_worker_batch):
            rt.begin("draft", "decode")
            x = a @ a
            rt.end("draft")
            rt.begin("verify", "decode")
            for _ in range(n_verify):
                x = a @ a
            rt.end("verify")
            rt.accepted(Obj(accept_lens=accept), ("accept_lens",), 0)
            rt.begin("draft_extend", "decode")
            x = x + 1
            rt.end("draft_extend")
            return x

    return EAGLEWorkerV2()


@pytest.mark.gpu
def test_gpu_events_timer_reads_gpu_time_without_a_host_sync(load, logs):
    torch = _cuda_torch()
    rt = load(mode="events")
    w = _gpu_worker(rt, torch)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")          # any synchronising call in the hooks raises (and counts)
    try:
        for _ in range(6):
            w.forward_batch_generation(Obj(seq_lens=torch.zeros(4, device="cuda")))
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert rt._stats()["errors"] == 0
    rt.flush()
    recs = records(logs)
    assert len(recs) == 6
    for r in recs:
        assert set(r) == RECORD_KEYS | {"host_phases", "host_cycle_ms"}
        assert r["timer"] == "events" and r["bs"] == 4 and r["accepted"] == 10
        ph = r["phases"]
        assert ph["verify"] > 5 * ph["draft"]                    # 20 matmuls against 1
        assert r["cycle_ms"] >= ph["verify"]
    # The host only queues the matmuls; the GPU runs them: GPU verify time far above host's, in steady state.
    assert max(r["phases"]["verify"] / max(r["host_phases"]["verify"], 1e-3) for r in recs[2:]) > 2


@pytest.mark.gpu
def test_gpu_sync_timer(load, logs):
    torch = _cuda_torch()
    rt = load(mode="sync")
    w = _gpu_worker(rt, torch)
    for _ in range(3):
        w.forward_batch_generation(Obj(seq_lens=torch.zeros(4, device="cuda")))
    rt.flush()
    recs = records(logs)
    assert len(recs) == 3 and rt._stats()["errors"] == 0
    for r in recs:
        assert set(r) == RECORD_KEYS and r["timer"] == "sync" and r["accepted"] == 10
        assert r["phases"]["verify"] > 5 * r["phases"]["draft"]


@pytest.mark.gpu
def test_gpu_events_records_are_complete_at_exit(tmp_path):
    _cuda_torch()
    log_dir = tmp_path / "gpu-exit"
    proc = _run(sys.executable, _script("""
        import torch
        a = torch.randn(2048, 2048, device="cuda")
        Out.accept_lens = torch.tensor([2, 3], device="cuda")

        class GpuWorker(object):
            @rt.entry
            def forward_batch_generation(self, batch):
                rt.begin("verify", "decode")
                for _ in range(10):
                    x = a @ a
                rt.end("verify")
                rt.accepted(Out(), ("accept_lens",), 1)
                return x

        w = GpuWorker()
        for _ in range(8):
            w.forward_batch_generation(Batch())
        # no flush, no synchronize: the last cycles' events are still outstanding at exit
        """), {"EAGLEPATCH_LOG_DIR": str(log_dir), "EAGLEPATCH_MODE": "events"}, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "[eaglepatch]" not in proc.stderr, proc.stderr
    recs = records(log_dir)
    assert len(recs) == 8
    assert all(r["timer"] == "events" and r["accepted"] == 7 and "host_cycle_ms" in r for r in recs)


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


def test_exit_line_counts_internal_errors(rt, capsys):
    rt.accepted  # noqa: B018 - the module is loaded
    rt._error("test")
    rt._error("test")
    rt._at_exit()
    err = capsys.readouterr().err
    assert err.count("internal error in test") == 1
    assert "[eaglepatch] 2 internal error(s) in pid %d" % os.getpid() in err


def test_log_dir_mode_does_not_depend_on_the_umask(load, tmp_path):
    """makedirs' mode goes through the umask; a server started with an odd one still gets an 0o700 dir."""
    log_dir = tmp_path / "umask"
    rt = load(log_dir=str(log_dir))
    decode_worker(rt).forward_batch_generation(Batch())
    old = os.umask(0o277)
    try:
        rt.flush()
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(str(log_dir)).st_mode) == 0o700
    assert len(records(log_dir)) == 1


def test_an_empty_config_line_gives_the_documented_defaults(tmp_path, clean_env):
    """The installer may write a line with fewer keys (or none): the defaults fill in."""
    src = RUNTIME.read_text().splitlines(True)
    src = [("_CONFIG = {}  # eaglepatch:config\n") if "eaglepatch:config" in l else l for l in src]
    path = tmp_path / "_eaglepatch_runtime.py"
    path.write_text("".join(src))
    assert load_module(path)._stats()["config"] == {
        "mode": "auto", "timers": {}, "every": 1, "log_dir": "/tmp/eaglepatch", "summary_every": 2000,
        "flush_records": 256, "flush_seconds": 2.0, "buffer_records": 8192, "exit_seconds": 2.0}


def test_eaglepatch_mode_auto_overrides_a_fixed_mode_line(tmp_path, clean_env, monkeypatch):
    src = RUNTIME.read_text().splitlines(True)
    src = [('_CONFIG = {"mode": "sync"}  # eaglepatch:config\n') if "eaglepatch:config" in l else l for l in src]
    path = tmp_path / "_eaglepatch_runtime.py"
    path.write_text("".join(src))
    assert load_module(path)._stats()["config"]["mode"] == "sync"
    monkeypatch.setenv("EAGLEPATCH_MODE", " Auto ")
    assert load_module(path)._stats()["config"]["mode"] == "auto"


def test_bad_values_in_the_config_line_are_said_and_replaced_by_defaults(tmp_path, clean_env, capsys):
    """A bad config line never costs the server its import nor its timings: each bad value is named on stderr
    and its default used; values out of range are clamped."""
    bad = {"mode": "turbo", "every": "many", "flush_seconds": "soon", "timers": ["EAGLEWorker"],
           "summary_every": -5, "flush_records": 0, "buffer_records": None, "exit_seconds": -1.0,
           "log_dir": str(tmp_path / "l")}
    src = RUNTIME.read_text().splitlines(True)
    src = [("_CONFIG = %r  # eaglepatch:config\n" % bad) if "eaglepatch:config" in l else l for l in src]
    path = tmp_path / "_eaglepatch_runtime.py"
    path.write_text("".join(src))
    rt = load_module(path)
    try:
        assert rt._stats()["config"] == {
            "mode": "auto", "timers": {}, "every": 1, "log_dir": str(tmp_path / "l"), "summary_every": 0,
            "flush_records": 1, "flush_seconds": 2.0, "buffer_records": 8192, "exit_seconds": 0.0}
        err = capsys.readouterr().err
        assert err.splitlines() == [
            "[eaglepatch] ignoring mode='turbo' in the configuration: using 'auto'",
            "[eaglepatch] ignoring timers=['EAGLEWorker'] in the configuration: using {}",
            "[eaglepatch] ignoring every='many' in the configuration: using 1",
            "[eaglepatch] ignoring flush_seconds='soon' in the configuration: using 2.0",
            "[eaglepatch] ignoring buffer_records=None in the configuration: using 8192"], err
        rt.configure(exit_seconds=2.0, summary_every=0)
        decode_worker(rt).forward_batch_generation(Batch(3))
        rt.flush()
        assert [r["bs"] for r in records(tmp_path / "l")] == [3] and rt._stats()["errors"] == 0
    finally:
        rt._stop_writer()


def test_an_entry_function_without_self_is_named_unknown(rt, logs):
    assert rt.entry(lambda: 5)() == 5
    assert one_record(rt, logs)["worker"] == "?"


def test_nested_calls_inside_an_untimed_call_stay_untimed(load, logs):
    """every=2: the call not timed (and its nested super() call) leave no record of their own."""
    rt = load(every=2)

    class Base(object):
        @rt.entry
        def forward_batch_generation(self, batch):
            rt.begin("verify", "decode")
            rt.end("verify")

    class Sub(Base):
        @rt.entry
        def forward_batch_generation(self, batch):
            return super(Sub, self).forward_batch_generation(batch)

    for n in range(1, 5):
        Sub().forward_batch_generation(Batch(n))
    rt.flush()
    assert [(r["worker"], r["bs"]) for r in records(logs)] == [("Sub", 1), ("Sub", 3)]
