"""Tests added from mutation testing of the runtime (docs/mutation-runtime.md): each pins a behaviour that a
surviving mutant of `eaglepatch/runtime/_eaglepatch_runtime.py` changed without any other test noticing."""
import errno
import json
import os
import socket
import stat
import sys
import tempfile
import threading
import time
import types

import pytest

from test_runtime import (  # noqa: F401 - fixtures are used by name
    Batch, FakeTensor, Obj, clean_env, decode_worker, fake_torch, headers, load, logs, one_record, records, rt,
    wait_until,
)
from test_runtime_run import SPAWN, proc  # noqa: F401 (proc: a fixture)
from test_runtime_writer import private_tmp  # noqa: F401 (a fixture)


def _log_name():
    return "%s-%d-rank0.jsonl" % (socket.gethostname(), os.getpid())


def _fallback_line(rt, log_dir, why):
    return "[eaglepatch] not writing timing records to %s (%s): writing them to %s instead\n" % (
        log_dir, why, rt._stats()["log_dir"])


# --- _open_in / _open_log -----------------------------------------------------------------------------------
def test_a_log_dir_that_is_a_file_is_refused_by_the_directory_open(load, tmp_path, private_tmp, capsys):
    """The directory is opened with O_DIRECTORY: a file there fails the open itself (ENOTDIR)."""
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    rt = load(log_dir=str(not_a_dir))
    decode_worker(rt).forward_batch_generation(Batch())
    rt.flush()
    assert capsys.readouterr().err == _fallback_line(rt, not_a_dir, "a link or not a directory")
    assert len(records(rt._stats()["log_dir"])) == 1 and not_a_dir.read_text() == "x"


def test_a_fifo_at_the_log_dir_is_not_opened(load, tmp_path, private_tmp, capsys):
    """Without O_DIRECTORY, opening a FIFO for reading would block until a writer comes."""
    fifo = tmp_path / "fifo"
    os.mkfifo(str(fifo))
    rt = load(log_dir=str(fifo), exit_seconds=1.0)
    try:
        decode_worker(rt).forward_batch_generation(Batch())
        t0 = time.time()
        rt.flush()
        assert time.time() - t0 < 0.9
        assert capsys.readouterr().err == _fallback_line(rt, fifo, "a link or not a directory")
        assert len(records(rt._stats()["log_dir"])) == 1
    finally:
        try:                                    # release a reader stuck in the open, if any
            os.close(os.open(str(fifo), os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass


def test_the_log_dir_and_file_are_opened_with_exactly_the_safe_flags(load, logs, monkeypatch):
    """Every fd the runtime opens is close-on-exec and does not follow a link; the directory is opened as one
    (O_DIRECTORY), the file for appending only, created 0600, without blocking (a FIFO planted meanwhile)."""
    rt = load()
    decode_worker(rt).forward_batch_generation(Batch())
    real = os.open
    calls = []

    def spy(path, flags, *a, **kw):
        calls.append((path, flags) + a + tuple(sorted(kw)))
        return real(path, flags, *a, **kw)

    monkeypatch.setattr(os, "open", spy)
    rt.flush()
    monkeypatch.undo()
    common = os.O_NOFOLLOW | os.O_CLOEXEC
    assert calls == [
        (str(logs), os.O_RDONLY | os.O_DIRECTORY | common),
        (_log_name(), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | common, 0o600, "dir_fd"),
    ]
    import fcntl
    assert fcntl.fcntl(rt._fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
    assert stat.S_IMODE(os.stat(str(logs / _log_name())).st_mode) == 0o600 and len(records(logs)) == 1


def test_a_world_writable_log_dir_is_refused_with_its_mode(load, logs, private_tmp, capsys):
    logs.mkdir()
    os.chmod(str(logs), 0o757)
    rt = load()
    decode_worker(rt).forward_batch_generation(Batch())
    rt.flush()
    assert capsys.readouterr().err == _fallback_line(rt, logs, "writable by group or others (mode 757)")


def test_a_log_dir_that_cannot_be_made_is_said_with_the_system_reason(load, tmp_path, private_tmp, capsys):
    """An OSError (not a refusal) is said by its strerror alone."""
    (tmp_path / "file").write_text("x")
    bad = tmp_path / "file" / "sub"
    rt = load(log_dir=str(bad))
    decode_worker(rt).forward_batch_generation(Batch())
    rt.flush()
    assert capsys.readouterr().err == _fallback_line(rt, bad, os.strerror(errno.ENOTDIR))
    assert len(records(rt._stats()["log_dir"])) == 1


@pytest.mark.parametrize("plant", ["link", "loop", "dir", "fifo"])
def test_something_not_a_regular_file_at_the_log_file_is_refused_before_the_open(load, logs, tmp_path, private_tmp,
                                                                                 capsys, plant):
    """The lstat refuses a link (even one that loops or dangles), a directory, a FIFO: one reason for all."""
    logs.mkdir(mode=0o700)
    path = str(logs / _log_name())
    if plant == "link":
        os.symlink(str(tmp_path / "nowhere"), path)
    elif plant == "loop":
        os.symlink(_log_name(), path)
    elif plant == "dir":
        os.mkdir(path)
    else:
        os.mkfifo(path)
    rt = load()
    decode_worker(rt).forward_batch_generation(Batch())
    rt.flush()
    assert capsys.readouterr().err == _fallback_line(rt, logs, "%s is a link or not a regular file" % _log_name())
    assert len(records(rt._stats()["log_dir"])) == 1 and not os.path.exists(str(tmp_path / "nowhere"))


@pytest.mark.parametrize("plant", ["link", "fifo", "fifo with a reader"])
def test_something_planted_between_the_check_and_the_open_is_refused(load, logs, tmp_path, private_tmp, capsys,
                                                                     monkeypatch, plant):
    """The file is checked (lstat), then opened: what is planted in between is refused by the open's flags
    (O_NOFOLLOW: ELOOP, O_NONBLOCK: ENXIO) or by the fstat after it."""
    logs.mkdir(mode=0o700)
    path = str(logs / _log_name())
    reader = None
    if plant == "link":
        target = tmp_path / "victim"
        target.write_text("precious\n")
        os.symlink(str(target), path)
    else:
        os.mkfifo(path)
        if plant == "fifo with a reader":
            reader = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    real_stat = os.stat

    def not_there_yet(p, *a, **kw):
        if kw.get("dir_fd") is not None:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory")
        return real_stat(p, *a, **kw)

    rt = load()
    decode_worker(rt).forward_batch_generation(Batch())
    monkeypatch.setattr(os, "stat", not_there_yet)
    try:
        rt.flush()
    finally:
        monkeypatch.undo()
        if reader is not None:
            os.close(reader)
    why = "%s is not a regular file" if reader is not None else "%s is a link or not a regular file"
    assert capsys.readouterr().err == _fallback_line(rt, logs, why % _log_name())
    assert len(records(rt._stats()["log_dir"])) == 1
    if plant == "link":
        assert (tmp_path / "victim").read_text() == "precious\n"


# --- _append / _write_buffered ------------------------------------------------------------------------------
def test_short_writes_are_continued_where_they_stopped(load, logs, monkeypatch):
    """os.write may write less than asked (one byte, a few): the rest follows, nothing twice, nothing lost."""
    rt = load()
    w = decode_worker(rt)
    w.forward_batch_generation(Batch(1))
    rt.flush()
    real = os.write
    calls = {"n": 0}

    def short(fd, data):
        calls["n"] += 1
        data = bytes(data)
        return real(fd, data[:1] if calls["n"] <= 5 else data[:50])

    monkeypatch.setattr(os, "write", short)
    for bs in (2, 3, 4):
        w.forward_batch_generation(Batch(bs))
    rt.flush()
    monkeypatch.undo()
    assert calls["n"] > 6
    assert [r["bs"] for r in records(logs)] == [1, 2, 3, 4]
    assert rt._stats()["errors"] == 0 and rt._stats()["dropped"] == 0


def test_a_write_returning_zero_is_reported_as_such(load, logs, monkeypatch, capsys):
    rt = load()
    monkeypatch.setattr(os, "write", lambda fd, data: 0)
    decode_worker(rt).forward_batch_generation(Batch())
    rt.flush()
    monkeypatch.undo()
    rt.flush()
    assert "OSError: [Errno %d] write returned 0" % errno.EIO in capsys.readouterr().err


def test_a_percent_sign_in_the_host_name_is_written_as_is(rt, logs):
    """The host and run id are put into a %-format: a "%" in them must not be read as a conversion."""
    rt._host = "gpu%d-%s%%"
    decode_worker(rt).forward_batch_generation(Batch())
    rt.flush()
    (rec,) = records(logs)
    (head,) = headers(logs)
    assert rec["host"] == head["host"] == "gpu%d-%s%%"
    assert rec["run"] == head["run"] and rec["run"].startswith("gpu%d-%s%%-")


def test_records_lost_in_a_failed_write_pass_on_the_losses_they_carried(load, logs, monkeypatch):
    """A record carries the count of those lost before it ("dropped"); when it is lost itself, the next record
    written reports both."""
    rt = load(flush_records=100)
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
        raise OSError(errno.ENOSPC, "No space left on device")

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


def test_a_log_dir_owned_by_another_user_is_refused_with_both_uids(load, logs, private_tmp, capsys):
    logs.mkdir(mode=0o700)
    rt = load()
    rt._EUID = os.geteuid() + 1
    decode_worker(rt).forward_batch_generation(Batch())
    rt.flush()
    why = "owned by uid %d, not %d" % (os.geteuid(), os.geteuid() + 1)
    # (the fallback dir, ours, is then refused too: the injected uid is not ours; that error follows)
    assert capsys.readouterr().err.startswith(_fallback_line(rt, logs, why))


# --- the run: _proc_cmdline, _proc_stat, _launcher, _flags_of, _redacted, _run_of, _header_line ---------------
LAUNCH = ["/opt/venv/bin/python", "-m", "sglang.launch_server", "--model-path", "m", "--speculative-num-steps", "3"]


def test_a_command_line_that_is_not_utf8_is_read_with_replacement_characters(rt, proc):
    proc.use(rt)
    proc.add(100, 1, None, raw_argv=b"python\0--name=\xff\xfe\0")
    assert rt._proc_cmdline(100) == ["python", "--name=\ufffd\ufffd"]


def test_an_orphaned_spawned_process_is_its_own_launcher(rt, proc):
    """A multiprocessing child whose parent died is reparented to init (pid 1): init is never the launcher."""
    proc.use(rt)
    proc.add(101, 1, SPAWN, ticks=55)
    assert rt._launcher(101) == (101, 55, SPAWN)


def test_a_launch_that_is_pid_2_is_the_launcher(rt, proc):
    """In a container the launch command may well be pid 2 (under an init such as tini)."""
    proc.use(rt)
    proc.add(2, 1, LAUNCH, ticks=7)
    proc.add(3, 2, SPAWN)
    assert rt._launcher(3) == (2, 7, LAUNCH)


@pytest.mark.parametrize("parent", ["empty cmdline", "no stat"])
def test_a_parent_that_cannot_be_read_ends_the_climb(rt, proc, parent):
    """A parent whose command line is empty (a zombie, a kernel thread) or whose stat is gone: the child is the
    launcher."""
    proc.use(rt)
    if parent == "empty cmdline":
        proc.add(100, 1, [], ticks=5)
    else:
        proc.add(100, None, LAUNCH)
    proc.add(101, 100, SPAWN, ticks=66)
    assert rt._launcher(101) == (101, 66, SPAWN)


def test_the_climb_stops_after_64_parents(rt, proc):
    """A bound on the walk up (a /proc that changes under it must not keep it going): 64 steps at most."""
    proc.use(rt)
    proc.add(100, 1, LAUNCH)
    for pid in range(101, 171):                                       # 70 spawned levels
        proc.add(pid, pid - 1, SPAWN, ticks=pid)
    assert rt._launcher(170)[:2] == (170 - 64, 170 - 64)


def test_a_secret_hides_only_the_one_value_after_it():
    from test_runtime import load_module
    rt = load_module()
    argv = ["python", "--api-key", "sk", "positional", "--x"]
    assert rt._redacted(argv) == ["python", "--api-key", "***", "positional", "--x"]


def _fnv(text):
    h = 0
    for ch in text.encode("utf-8"):
        h = ((h ^ ch) * 0x01000193) & 0xFFFFFFFF
    return "%08x" % h


@pytest.mark.parametrize("kw, cfg", [
    ({}, '["cpu", [], 1]'),
    ({"every": 3}, '["cpu", [], 3]'),
    ({"mode": "auto", "timers": {"A": "cpu"}}, '["auto", [["A", "cpu"]], 1]'),
    ({"mode": "auto", "timers": {"A": "sync"}}, '["auto", [["A", "sync"]], 1]'),
])
def test_the_run_id_ends_in_the_fnv1a_digest_of_the_configuration(load, logs, proc, kw, cfg):
    """<host>-<launcher pid>-<start ticks>-<32-bit FNV-1a (basis 0) of [mode, sorted timers, every] as JSON>: the
    same digest in every process (str hash() is salted), another for each timer choice."""
    proc.add(100, 1, LAUNCH, ticks=5000)
    proc.add(os.getpid(), 100, SPAWN)
    rt = proc.use(load(**kw))
    decode_worker(rt).forward_batch_generation(Batch())
    rt.flush()
    assert headers(logs)[0]["run"] == "%s-100-5000-%s" % (rt._host, _fnv(cfg))


def test_the_header_line_has_exactly_its_fields(rt, logs, proc, monkeypatch):
    proc.add(100, 1, LAUNCH, ticks=5000)
    proc.add(os.getpid(), 100, SPAWN)
    proc.use(rt)
    monkeypatch.setattr(rt, "_wall", lambda: 1234.567890123)
    decode_worker(rt).forward_batch_generation(Batch())
    rt.flush()
    with open(str(logs / _log_name())) as f:
        first = f.readline()
    assert json.loads(first) == {
        "v": 1, "kind": "run", "run": first and json.loads(first)["run"], "t": 1234.56789, "host": rt._host,
        "pid": os.getpid(), "rank": 0, "timer": "cpu", "flags": {"speculative-num-steps": "3"}, "launcher": 100,
        "argv": LAUNCH, "log_dir": str(logs), "runtime": os.path.realpath(rt.__file__)}
    assert first.endswith("}\n")


def test_the_header_of_a_fallback_names_the_private_dir_and_the_one_refused(load, logs, private_tmp, capsys):
    """Where the records really go is in the header: the private directory the runtime made, and the configured
    one it did not use (a folder that others may write)."""
    logs.mkdir()
    os.chmod(str(logs), 0o757)
    rt = load()
    decode_worker(rt).forward_batch_generation(Batch())
    rt.flush()
    private = rt._stats()["log_dir"]
    assert private != str(logs) and os.path.dirname(private) == str(private_tmp)
    with open(os.path.join(private, _log_name())) as f:
        head = json.loads(f.readline())
    assert (head["log_dir"], head["fallback_from"]) == (private, str(logs))
    capsys.readouterr()


def test_a_failed_write_that_wrote_nothing_leaves_a_torn_file_as_it_was(load, logs, monkeypatch):
    """After a cut-back that failed (the file ends in a torn line, the next batch starts with a newline), a write
    that fails before writing anything must not change the file (no cut-back past its end)."""
    rt = load()
    w = decode_worker(rt)
    real_write, real_trunc = os.write, os.ftruncate
    state = {"n": 0}

    def flaky(fd, data):
        state["n"] += 1
        if state["n"] == 1:
            real_write(fd, bytes(data[:10]))
        raise OSError(errno.EIO, "I/O error")

    def no_truncate(fd, size):
        raise OSError(errno.EPERM, "no")

    monkeypatch.setattr(os, "write", flaky)
    monkeypatch.setattr(os, "ftruncate", no_truncate)
    w.forward_batch_generation(Batch(1))
    rt.flush()                                                   # 10 bytes written, not cut back: torn
    before = (logs / _log_name()).read_bytes()
    assert len(before) == 10 and rt._torn
    monkeypatch.setattr(os, "ftruncate", real_trunc)
    w.forward_batch_generation(Batch(2))
    rt.flush()                                                   # nothing written at all
    monkeypatch.undo()
    assert (logs / _log_name()).read_bytes() == before and rt._stats()["dropped"] == 2


@pytest.mark.parametrize("missing", ["cmdline", "stat"])
def test_a_process_whose_proc_entry_is_half_there_is_its_own_launcher(rt, proc, missing):
    """Its command line (empty: a process on its way out) or its stat cannot be read: as without /proc, this
    process, start 0, this interpreter's argv."""
    import sys
    proc.use(rt)
    if missing == "cmdline":
        proc.add(100, 1, [], ticks=5)
    else:
        proc.add(100, None, LAUNCH)
    assert rt._launcher(100) == (100, 0, list(sys.argv))


# --- the hooks and _emit: entry, begin, end, accepted --------------------------------------------------------
def _scripted(rt, clock, steps, after=0.000123456789, out=None):
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


def test_times_are_milliseconds_rounded_to_four_places(load, logs, monkeypatch):
    """Phases and the cycle: seconds x 1000, rounded to 4 places (12.3456789 ms is 12.3457; 2.00004 is 2.0)."""
    rt = load(mode="cpu")
    clock = [100.0]
    monkeypatch.setattr(rt, "_perf", lambda: clock[0])
    _scripted(rt, clock, STEPS).forward_batch_generation(Batch(2))
    rec = one_record(rt, logs)
    assert rec["phases"] == {"draft": 12.3457, "verify": 2.0}
    assert rec["cycle_ms"] == round((clock[0] - 100.0) * 1000.0, 4) == 14.4692
    assert "host_phases" not in rec and "host_cycle_ms" not in rec


def test_events_records_carry_the_host_times_in_milliseconds_rounded_to_four_places(load, logs, fake_torch,
                                                                                     monkeypatch):
    """The events timer: the host's own view of each phase and of the cycle, beside the GPU's, in the same unit."""
    rt = load(mode="events")
    clock = [50.0]
    monkeypatch.setattr(rt, "_perf", lambda: clock[0])
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])     # the fake GPU's events read it too
    _scripted(rt, clock, STEPS).forward_batch_generation(Batch(2))
    rec = one_record(rt, logs)
    assert rec["timer"] == "events" and fake_torch.cuda.gpu_factor == 2.0
    assert rec["phases"] == {"draft": 24.6914, "verify": 4.0001} and rec["cycle_ms"] == 28.9384
    assert rec["host_phases"] == {"draft": 12.3457, "verify": 2.0}
    assert rec["host_cycle_ms"] == round((clock[0] - 50.0) * 1000.0, 4) == 14.4692


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


def test_the_summary_line_is_exact(load, capsys, monkeypatch):
    """Per phase the mean ms and its share of the cycle, the accept length (accepted / batch size), tok/s
    (accepted / cycle time): from the window's sums, which start at zero."""
    rt = load(mode="cpu", summary_every=2)
    rt._WRITER_THREAD = False
    clock = [10.0]
    monkeypatch.setattr(rt, "_perf", lambda: clock[0])

    class EAGLEWorker(object):
        @rt.entry
        def forward_batch_generation(self, batch):
            rt.begin("draft", "decode")
            clock[0] += 0.010
            rt.end("draft")
            rt.begin("verify", "decode")
            clock[0] += 0.0025
            rt.end("verify")
            rt.accepted(Obj(accept_lens=[2, 3]), ("accept_lens",))
            clock[0] += 0.0005

    for _ in range(2):
        EAGLEWorker().forward_batch_generation(Batch(2))
    rt.flush()
    assert capsys.readouterr().err == ("[eaglepatch] rank0 EAGLEWorker decode n=2 cycle 13.00 ms | draft 10.00 (77%) "
                                       "verify 2.50 (19%) | accept len 2.50 | 384.6 tok/s\n")


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


# --- the writer thread: _writer_main, _flush, _drain, _at_exit ----------------------------------------------
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

    def write():
        writers.append(threading.current_thread())
        return real()

    monkeypatch.setattr(rt, "_write_buffered", write)
    assert rt._writer is None
    assert rt._flush(False) is True
    assert len(records(logs)) == 1 and writers and threading.current_thread() not in writers
    assert rt._writer is not None


def test_flush_drains_itself_when_no_writer_can_be_started(load, logs, monkeypatch):
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


def _buffered_behind(load, writer_alive_s, **kw):
    """A runtime with one record buffered and, as its writer, a thread that never answers a flush request,
    alive for ``writer_alive_s`` seconds."""
    rt = load(mode="cpu", **kw)
    rt._WRITER_THREAD = False
    decode_worker(rt).forward_batch_generation(Batch())
    rt._writer = _stand_in_writer(writer_alive_s)
    return rt


def _stand_in_writer(seconds):
    """A thread standing in for the writer: alive for ``seconds``, never answering a flush request."""
    t = threading.Thread(target=time.sleep, args=(seconds,), daemon=True)
    t.start()
    return t


def test_flush_returns_true_once_the_writer_has_answered(load, logs):
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


def _dropped_line(n, stuck=False):
    return ("[eaglepatch] %d timing record(s) dropped in pid %d (the log writer fell behind, a write failed, or "
            "events were not done at exit%s)\n" % (n, os.getpid(), "; the writer was still stuck at exit" if stuck
                                                     else ""))


def test_exit_says_how_many_records_were_dropped(load, logs, capsys):
    rt = load(mode="cpu", buffer_records=1)
    rt._WRITER_THREAD = False
    w = decode_worker(rt)
    w.forward_batch_generation(Batch())
    w.forward_batch_generation(Batch())             # dropped: the buffer holds one
    rt._at_exit()
    assert capsys.readouterr().err == _dropped_line(1) and len(records(logs)) == 1


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
    rt._writer = _stand_in_writer(3.0)
    rt._at_exit()
    rt._writer = None
    assert capsys.readouterr().err == _dropped_line(3, stuck=True)
    assert records(logs) == [] and rt._stats()["dropped"] == 3


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


# --- the CUDA timers and event resolution: _start, _record, _finish, _resolve* -------------------------------
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


def test_a_cpu_cycle_waiting_for_its_accepted_copy_keeps_its_own_time(load, logs, fake_torch, monkeypatch):
    """The cpu timer meeting a CUDA tensor of accepted counts: the cycle waits for the copy, and its record has
    the cycle's own time, to the 4th place, once resolved."""
    rt = load(mode="cpu")
    rt._WRITER_THREAD = False
    clock = [7.0]
    monkeypatch.setattr(rt, "_perf", lambda: clock[0])
    fake_torch.cuda.done = False
    _scripted(rt, clock, STEPS, after=0.0, out=Obj(accept_lens=FakeTensor([2, 3]))).forward_batch_generation(Batch(2))
    assert rt._stats()["pending"] == 1
    fake_torch.cuda.done = True
    rec = one_record(rt, logs)
    assert rec["cycle_ms"] == 14.3457 and rec["phases"] == {"draft": 12.3457, "verify": 2.0}
    assert rec["accepted"] == 5


def test_an_accepted_copy_that_cannot_be_read_leaves_the_record_without_its_count(load, logs, fake_torch,
                                                                                  monkeypatch, capsys):
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


# --- the rest of the runtime (fourth round): bounds, losses, errors ---------------------------------------------
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


def test_at_most_4096_events_are_kept_for_reuse_by_default(load):
    """docs/design.md's bound on the event pool, as shipped."""
    rt = load(mode="cpu")
    rt._give_back(["ev"] * 4095)
    rt._give_back(["a", "b"])                       # below the bound: the cycle's events all go in
    assert len(rt._pool) == 4097
    rt._pool[:] = ["ev"] * 4096
    rt._give_back(["c"])
    assert len(rt._pool) == 4096


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


def test_the_capture_mode_is_not_tried_before_a_cycle_waits(load, logs, fake_torch):
    """_stats' capture_relaxed: None until the writer first resolves waiting cycles (no thread asked the driver);
    cycles that never wait (the sync timer) never ask."""
    rt = load(mode="sync")
    assert rt._stats()["capture_relaxed"] is None
    decode_worker(rt).forward_batch_generation(Batch())
    rt.flush()
    assert len(records(logs)) == 1 and rt._stats()["capture_relaxed"] is None


# --- the summary line (fourth round) ------------------------------------------------------------------------------
@pytest.mark.parametrize("steps, after, line", [
    ([("draft", 0.0001), ("verify", 0.0002)], 0.0001,
     "cycle 0.40 ms | draft 0.10 (25%) verify 0.20 (50%) | accept len 2.00 | 10000.0 tok/s"),
    ([("draft", 0.0), ("verify", 0.0)], 0.0,
     "cycle 0.00 ms | draft 0.00 (0%) verify 0.00 (0%) | accept len 2.00"),
], ids=["sub-millisecond cycles", "cycles that took no time"])
def test_a_summary_of_short_cycles_keeps_its_shares_and_rate(load, monkeypatch, capsys, steps, after, line):
    """Two cycles on a scripted clock, 4 tokens accepted in each: cycles of 0.4 ms (under 1 ms in all) still get
    each phase's share and tok/s; cycles that took no time get 0 % and no tok/s, and nothing raises."""
    rt = load(mode="cpu", summary_every=2)
    rt._WRITER_THREAD = False
    clock = [10.0]
    monkeypatch.setattr(rt, "_perf", lambda: clock[0])
    w = _scripted(rt, clock, steps, after=after, out=Obj(accept_lens=[2, 2]))
    for _ in range(2):
        w.forward_batch_generation(Batch(2))
    rt.flush()
    assert capsys.readouterr().err == "[eaglepatch] rank0 W decode n=2 " + line + "\n"
    assert rt._stats()["errors"] == 0


def test_each_summary_counts_the_drops_of_its_own_window(load, capsys):
    """The buffer full (1 record, nothing written until the flush): the second record of each window is dropped;
    each summary says its own one drop."""
    rt = load(mode="cpu", summary_every=2, buffer_records=1)
    rt._WRITER_THREAD = False
    w = decode_worker(rt)
    for _ in range(2):
        w.forward_batch_generation(Batch())
        w.forward_batch_generation(Batch())
        rt.flush()
    dropped = [line for line in capsys.readouterr().err.splitlines() if "dropped" in line]
    assert dropped == ["[eaglepatch] rank0 dropped 1 record(s) since the last summary (the log writer fell "
                       "behind)"] * 2
    assert rt._stats()["errors"] == 0 and rt._stats()["dropped"] == 2


def test_a_summary_that_cannot_be_printed_is_said_as_a_summary_error(load, monkeypatch, capsys):
    rt = load(mode="cpu", summary_every=1)
    rt._WRITER_THREAD = False

    def broken(win, dropped):
        raise RuntimeError("no summary today")

    monkeypatch.setattr(rt, "_summary_lines", broken)
    decode_worker(rt).forward_batch_generation(Batch())
    rt.flush()
    err = capsys.readouterr().err
    assert err.startswith("[eaglepatch] internal error in summary (the server goes on;") and "no summary today" in err


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


def test_the_run_is_read_from_the_real_proc(load, logs):
    """With the system's /proc (no test tree): this test process launched itself, and its start time (field 22
    of /proc/self/stat) is in the run id."""
    rt = load(mode="cpu")
    decode_worker(rt).forward_batch_generation(Batch())
    rt.flush()
    with open("/proc/self/stat") as f:
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    pid = os.getpid()
    head, = headers(logs)
    assert head["launcher"] == pid, "the test's parent has the same command line (a fork): %r" % head
    assert head["run"] == "%s-%d-%d-%s" % (socket.gethostname(), pid, ticks, head["run"].rsplit("-", 1)[1])


@pytest.mark.parametrize("word", ["key", "token", "secret", "password", "passwd", "credential", "credentials"])
def test_every_secret_word_hides_its_options_value(rt, word):
    """A name that ends in the word, in any case, `_` read as `-`, with the value apart or after `=`; the same name
    with more after the word (a count, a path) hides nothing."""
    for name in ("--my-%s" % word.upper(), "--my_%s" % word):
        assert rt._redacted(["python", name, "v1", name + "=v2", "--other", "v3"]) == [
            "python", name, "***", name + "=***", "--other", "v3"]
    shown = "--my-%ss-file" % word
    assert rt._redacted(["python", shown, "v1", shown + "=v2"]) == ["python", shown, "v1", shown + "=v2"]
    env = "MY_%s" % word.upper()
    assert rt._redacted(["env", env + "=v", env + "_COUNT=v"]) == ["env", env + "=***", env + "_COUNT=v"]


def test_a_batch_is_due_at_flush_seconds_to_the_tick(load, monkeypatch):
    rt = load(mode="cpu", flush_seconds=600.0, flush_records=1000)
    rt._WRITER_THREAD = False
    decode_worker(rt).forward_batch_generation(Batch())
    monkeypatch.setattr(rt, "_mono", lambda: 1000.0)
    rt._buf_since = 400.5
    assert not rt._due()
    rt._buf_since = 400.0
    assert rt._due()


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


# --- starting and stopping the writer (fourth round) --------------------------------------------------------------
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


def test_stopping_a_stuck_writer_waits_one_second_for_it(rt):
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
