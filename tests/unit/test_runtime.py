"""The timing runtime's hooks and the record they make (eaglepatch/runtime/_eaglepatch_runtime.py): one record per
cycle of an entry method, its phases, mode, batch size and accepted tokens; sampling and buffering; the config line
and the environment; never raising into the server; the rank; threads and fork; real CUDA (skipped without it).

The runtime is loaded fresh from its file for every test (it is a standalone module copied into sglang, not a
part of the eaglepatch package), with its log dir under tmp_path (conftest.py: ``load``, ``rt``, ``logs``). The
other behaviours have their own module:

- test_runtime_accepted.py: accepted() on tensors of every shape, and the per-request counts ("accepts");
- test_runtime_cuda.py: CUDA graph capture, the cpu timer never initialising CUDA, mode "auto";
- test_runtime_events.py: the CUDA timers (sync, events) against a fake torch, their streams and pools;
- test_runtime_flush.py: flush(), exit and stopping the writer;
- test_runtime_live.py: the runtime's part of ``eaglepatch sweep --live``;
- test_runtime_logfiles.py: the log directory and files, what is refused, whole lines only;
- test_runtime_losses.py: records dropped, and how they are counted;
- test_runtime_run.py: which launch a record belongs to (the run id, the header line);
- test_runtime_schedule.py: when the writer thread wakes, sleeps and looks at waiting cycles;
- test_runtime_spec.py: the speculative settings of adaptive workers ("spec");
- test_runtime_summary.py: the summary line on stderr;
- test_runtime_writer.py: the writer thread keeps the worker's thread free of I/O; bounded exit; quiet servers.
"""
import ast
import glob
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from runtime_helpers import (
    RECORD_KEYS, RUNTIME, STEPS, Batch, Obj, decode_worker, headers, lines, load_module, log_files, one_record,
    records, run_script, scripted_worker, wait_until, worker_script,
)
from torch_fakes import FakeDist
from unprivileged import as_unprivileged, give, user_folder


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
    """Phases sleeping 4, 12 and 2 ms read at least that long, within the cycle. (How much longer depends on the
    machine's load: a busy CI machine read a 2 ms sleep as 5.8 ms, so nothing here compares phases with each other;
    the exact times are pinned on a scripted clock: test_times_are_milliseconds_rounded_to_four_places.)"""
    decode_worker(rt, sleeps=(0.004, 0.012, 0.002)).forward_batch_generation(Batch())
    rec = one_record(rt, logs)
    ph = rec["phases"]
    assert list(ph) == ["draft", "verify", "draft_extend"]
    assert ph["draft"] >= 4.0 and ph["verify"] >= 12.0 and ph["draft_extend"] >= 2.0
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


def test_times_are_milliseconds_rounded_to_four_places(load, logs, monkeypatch):
    """Phases and the cycle: seconds x 1000, rounded to 4 places (12.3456789 ms is 12.3457; 2.00004 is 2.0)."""
    rt = load(mode="cpu")
    clock = [100.0]
    monkeypatch.setattr(rt, "_perf", lambda: clock[0])
    scripted_worker(rt, clock, STEPS).forward_batch_generation(Batch(2))
    rec = one_record(rt, logs)
    assert rec["phases"] == {"draft": 12.3457, "verify": 2.0}
    assert rec["cycle_ms"] == round((clock[0] - 100.0) * 1000.0, 4) == 14.4692
    assert "host_phases" not in rec and "host_cycle_ms" not in rec


def test_names_are_quoted_once_per_process(load, logs, monkeypatch):
    """A worker's and its phases' names are JSON-quoted at their first record; later records reuse the quotes."""
    rt = load(mode="cpu")
    w = decode_worker(rt)
    w.forward_batch_generation(Batch())
    quoted = []
    real = json.dumps
    monkeypatch.setattr(json, "dumps", lambda *a, **kw: quoted.append(a[0]) or real(*a, **kw))
    w.forward_batch_generation(Batch())
    monkeypatch.setattr(json, "dumps", real)
    assert quoted == []
    rt.flush()
    assert len(records(logs)) == 2


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


def test_records_are_flushed_at_normal_exit(tmp_path):
    log_dir = tmp_path / "exit-logs"
    proc = run_script(sys.executable, worker_script("""
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
    proc = run_script(sys.executable, worker_script("""
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
    proc = run_script(python, worker_script("""
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
              "collections", "errno", "stat", "tempfile", "ctypes", "re", "types", "weakref"}
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
                                            "buffer_records": 8192, "exit_seconds": 2.0, "max_log_mb": 2048,
                                            "min_free_mb": 1024}
    # the first statement of the module (after the docstring), so an installer finds it at the top
    body = ast.parse(RUNTIME.read_text()).body
    assert isinstance(body[1], ast.Assign) and body[1].targets[0].id == "_CONFIG"


def test_a_rewritten_config_line_is_used(tmp_path, clean_env):
    """What the installer does: replace the dict literal on the marked line."""
    new = {"mode": "cpu", "timers": {"EAGLEWorker": "sync"}, "every": 4, "log_dir": str(tmp_path / "x"),
           "summary_every": 0, "flush_records": 9, "flush_seconds": 1.5, "buffer_records": 77, "exit_seconds": 0.5,
           "max_log_mb": 3, "min_free_mb": 0.5}
    src = RUNTIME.read_text().splitlines(True)
    src = [("_CONFIG = %r  # eaglepatch:config\n" % new) if "eaglepatch:config" in l else l for l in src]
    path = tmp_path / "_eaglepatch_runtime.py"
    path.write_text("".join(src))
    mod = load_module(path)
    assert mod._stats()["config"] == new
    # What `apply` writes (eaglepatch/ops/runtime_file.py render_runtime): no buffer_records/exit_seconds: defaults.
    apply_line = {"mode": "auto", "timers": {"EAGLEWorkerV2": "events"}, "every": 1, "log_dir": str(tmp_path / "y"),
                  "summary_every": 2000, "flush_records": 256, "flush_seconds": 2.0, "max_log_mb": 512,
                  "min_free_mb": 256}
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


def test_read_only_log_dir_never_raises(load):
    """A log folder the server's user may not write: the cycle runs, one line says where the log goes instead. As
    root (CI) the runtime runs as ``nobody`` in a child: root writes anywhere."""
    def cycle(ro, fallback_in):
        import io

        tempfile.tempdir = fallback_in  # the private folder it falls back to: in the test's own folder
        sys.stderr = err = io.StringIO()
        rt = load(log_dir=ro)
        try:
            result = decode_worker(rt).forward_batch_generation(Batch())[0]
            rt.flush()
        finally:
            rt._stop_flusher()
        return result, err.getvalue()

    with user_folder() as base:
        ro = base / "ro"
        ro.mkdir()
        give(ro)
        os.chmod(str(ro), 0o500)
        saved = sys.stderr
        try:
            result, err = as_unprivileged(cycle, str(ro), str(base))
        finally:
            sys.stderr = saved
            tempfile.tempdir = None
    assert result == "result"
    assert err.count("[eaglepatch]") == 1 and "instead" in err, err


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
    proc = run_script(sys.executable, worker_script("""
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


def test_exit_line_counts_internal_errors(rt, capsys):
    rt.accepted  # noqa: B018 - the module is loaded
    rt._error("test")
    rt._error("test")
    rt._at_exit()
    err = capsys.readouterr().err
    assert err.count("internal error in test") == 1
    assert "[eaglepatch] 2 internal error(s) in pid %d" % os.getpid() in err


def test_an_empty_config_line_gives_the_documented_defaults(tmp_path, clean_env):
    """The installer may write a line with fewer keys (or none): the defaults fill in."""
    src = RUNTIME.read_text().splitlines(True)
    src = [("_CONFIG = {}  # eaglepatch:config\n") if "eaglepatch:config" in l else l for l in src]
    path = tmp_path / "_eaglepatch_runtime.py"
    path.write_text("".join(src))
    assert load_module(path)._stats()["config"] == {
        "mode": "auto", "timers": {}, "every": 1, "log_dir": "/tmp/eaglepatch", "summary_every": 2000,
        "flush_records": 256, "flush_seconds": 2.0, "buffer_records": 8192, "exit_seconds": 2.0,
        "max_log_mb": 2048, "min_free_mb": 1024}


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
           "log_dir": str(tmp_path / "l"), "max_log_mb": 0, "min_free_mb": -1}
    src = RUNTIME.read_text().splitlines(True)
    src = [("_CONFIG = %r  # eaglepatch:config\n" % bad) if "eaglepatch:config" in l else l for l in src]
    path = tmp_path / "_eaglepatch_runtime.py"
    path.write_text("".join(src))
    rt = load_module(path)
    try:
        assert rt._stats()["config"] == {
            "mode": "auto", "timers": {}, "every": 1, "log_dir": str(tmp_path / "l"), "summary_every": 0,
            "flush_records": 1, "flush_seconds": 2.0, "buffer_records": 8192, "exit_seconds": 0.0,
            "max_log_mb": 2048, "min_free_mb": 1024}
        err = capsys.readouterr().err
        assert err.splitlines() == [
            "[eaglepatch] ignoring mode='turbo' in the configuration: using 'auto'",
            "[eaglepatch] ignoring timers=['EAGLEWorker'] in the configuration: using {}",
            "[eaglepatch] ignoring every='many' in the configuration: using 1",
            "[eaglepatch] ignoring flush_seconds='soon' in the configuration: using 2.0",
            "[eaglepatch] ignoring buffer_records=None in the configuration: using 8192",
            "[eaglepatch] ignoring max_log_mb=0 in the configuration: using 2048",
            "[eaglepatch] ignoring min_free_mb=-1 in the configuration: using 1024"], err
        rt.configure(exit_seconds=2.0, summary_every=0, min_free_mb=0)
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


def test_the_batch_looked_into_is_not_kept_alive(rt, logs):
    """Whose each request is (``others``) is looked into once per batch membership and kept for the next cycle of
    the same batch, without holding the batch, its reqs list or its requests: they are freed once sglang drops them."""
    import gc
    import weakref

    reads = []

    class Req(object):
        def __init__(self, rid):
            self._rid = rid

        @property
        def rid(self):
            reads.append(self._rid)
            return self._rid

    w = decode_worker(rt, out=Obj(accept_lens=[1, 2, 3]))
    reqs = [Req("user-1"), Req("eaglepatch-ab-0"), Req("user-2")]
    batch = Obj(reqs=reqs)
    w.forward_batch_generation(batch)
    n = len(reads)
    w.forward_batch_generation(batch)                   # the same batch: its requests not read again
    assert len(reads) == n
    reqs.append(Req("eaglepatch-ab-1"))                 # merged in place: read again
    w.forward_batch_generation(batch)
    assert len(reads) > n
    rt.flush()
    one, two, three = records(logs)
    assert one["others"] == two["others"] == three["others"] == 2
    assert one["others_at"] == two["others_at"] == three["others_at"] == [0, 2]
    refs = [weakref.ref(batch)] + [weakref.ref(r) for r in reqs]
    del batch, reqs
    gc.collect()
    assert [r() for r in refs] == [None] * len(refs)
    w.forward_batch_generation(Obj(reqs=[Req("user-3")]))   # a new batch after them: looked into afresh
    rt.flush()
    assert records(logs)[-1]["others"] == 1 and rt._stats()["errors"] == 0

    class Slotted(object):                              # takes no weak reference: held, as the cache needs
        __slots__ = ("_rid",)

        def __init__(self, rid):
            self._rid = rid

        @property
        def rid(self):
            reads.append(self._rid)
            return self._rid

    batch = Obj(reqs=[Slotted("user-4"), Slotted("eaglepatch-ab-2")])
    w.forward_batch_generation(batch)
    n = len(reads)
    w.forward_batch_generation(batch)
    assert len(reads) == n
    rt.flush()
    assert [r.get("others_at") for r in records(logs)[-2:]] == [[0], [0]] and rt._stats()["errors"] == 0
