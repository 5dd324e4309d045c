"""The timing runtime's log directory and log files (eaglepatch/runtime/_eaglepatch_runtime.py): where records go,
what is refused, and how the file is written.

- The log dir is made private (0700, whatever the umask). One that is a link, not a directory, writable by group or
  others, owned by another user, or that cannot be made is refused: the records go to a private directory of the
  runtime's own, said once on stderr with the reason, and the run header names both.
- The log file is opened without following a link, without blocking, close-on-exec, for appending, 0600; anything
  else there (a link, a FIFO, a directory), even one planted between the check and the open, is refused.
- Only whole lines reach the file: a short write is continued, a failed one cut back; the records lost are counted.

Several of these tests were written to kill mutants of the runtime (docs/mutation-runtime.md).
"""
import errno
import json
import os
import stat
import tempfile
import threading
import time

import pytest

from runtime_helpers import Batch, decode_worker, log_name, open_calls, records


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """tempfile's directory (where a fallback log dir is made) under tmp_path."""
    d = tmp_path / "tmp"
    d.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(d))
    return d


def _fallback_line(rt, log_dir, why):
    return "[eaglepatch] not writing timing records to %s (%s): writing them to %s instead\n" % (
        log_dir, why, rt._stats()["log_dir"])


# --- the log directory ---------------------------------------------------------------------------------------
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


def test_log_dir_and_file_are_private(load, logs):
    rt = load()
    decode_worker(rt).forward_batch_generation(Batch())
    rt.flush()
    assert stat.S_IMODE(os.stat(str(logs)).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(str(logs / log_name())).st_mode) == 0o600
    assert rt._stats()["log_dir"] == str(logs)


def test_a_world_writable_log_dir_is_not_used_and_said_once(load, logs, private_tmp, capsys):
    logs.mkdir()
    os.chmod(str(logs), 0o777)
    rt = load(flush_records=1)
    w = decode_worker(rt)
    for _ in range(3):
        w.forward_batch_generation(Batch())
        rt.flush()                                               # three separate writes
    assert os.listdir(str(logs)) == []
    fallback = rt._stats()["log_dir"]
    assert os.path.dirname(fallback) == str(private_tmp) and os.path.basename(fallback).startswith("eaglepatch-")
    assert stat.S_IMODE(os.stat(fallback).st_mode) == 0o700
    assert len(records(fallback)) == 3
    err = capsys.readouterr().err
    assert err.count("[eaglepatch]") == 1 and err.count(fallback) == 1 and "777" in err and str(logs) in err


@pytest.mark.parametrize("mode", [0o770, 0o720, 0o702])
def test_a_group_or_world_writable_log_dir_is_refused(load, logs, private_tmp, mode):
    logs.mkdir()
    os.chmod(str(logs), mode)
    rt = load()
    decode_worker(rt).forward_batch_generation(Batch())
    rt.flush()
    assert os.listdir(str(logs)) == [] and len(records(rt._stats()["log_dir"])) == 1


def test_a_world_writable_log_dir_is_refused_with_its_mode(load, logs, private_tmp, capsys):
    """A log dir that others may write is refused; the stderr line, whole, names its mode (757)."""
    logs.mkdir()
    os.chmod(str(logs), 0o757)
    rt = load()
    decode_worker(rt).forward_batch_generation(Batch())
    rt.flush()
    assert capsys.readouterr().err == _fallback_line(rt, logs, "writable by group or others (mode 757)")


def test_a_log_dir_owned_by_another_user_is_refused(load, logs, private_tmp, capsys):
    """Tests run as root: the user the runtime compares against is injected."""
    logs.mkdir(mode=0o700)
    rt = load()
    rt._EUID = os.geteuid() + 1
    decode_worker(rt).forward_batch_generation(Batch())
    rt.flush()
    assert os.listdir(str(logs)) == []
    err = capsys.readouterr().err
    assert "owned by uid %d, not %d" % (os.geteuid(), os.geteuid() + 1) in err
    rt2 = load()                                                 # the same dir, our own: used
    decode_worker(rt2).forward_batch_generation(Batch())
    rt2.flush()
    assert len(records(logs)) == 1


def test_a_log_dir_owned_by_another_user_is_refused_with_both_uids(load, logs, private_tmp, capsys):
    """A log dir of another user is refused; the stderr line, whole, names its owner's uid and ours."""
    logs.mkdir(mode=0o700)
    rt = load()
    rt._EUID = os.geteuid() + 1
    decode_worker(rt).forward_batch_generation(Batch())
    rt.flush()
    why = "owned by uid %d, not %d" % (os.geteuid(), os.geteuid() + 1)
    # (the fallback dir, ours, is then refused too: the injected uid is not ours; that error follows)
    assert capsys.readouterr().err.startswith(_fallback_line(rt, logs, why))


def test_a_log_dir_that_is_a_link_is_refused(load, tmp_path, private_tmp):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    os.symlink(str(real), str(link))
    rt = load(log_dir=str(link))
    decode_worker(rt).forward_batch_generation(Batch())
    rt.flush()
    assert os.listdir(str(real)) == [] and len(records(rt._stats()["log_dir"])) == 1


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


def test_a_log_dir_that_cannot_be_made_is_said_with_the_system_reason(load, tmp_path, private_tmp, capsys):
    """An OSError (not a refusal) is said by its strerror alone."""
    (tmp_path / "file").write_text("x")
    bad = tmp_path / "file" / "sub"
    rt = load(log_dir=str(bad))
    decode_worker(rt).forward_batch_generation(Batch())
    rt.flush()
    assert capsys.readouterr().err == _fallback_line(rt, bad, os.strerror(errno.ENOTDIR))
    assert len(records(rt._stats()["log_dir"])) == 1


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
    with open(os.path.join(private, log_name())) as f:
        head = json.loads(f.readline())
    assert (head["log_dir"], head["fallback_from"]) == (private, str(logs))
    capsys.readouterr()


# --- the log file --------------------------------------------------------------------------------------------
def test_the_log_dir_and_file_are_opened_with_exactly_the_safe_flags(load, logs):
    """Every fd the runtime opens is close-on-exec and does not follow a link; the directory is opened as one
    (O_DIRECTORY), the file for appending only, created 0600, without blocking (a FIFO planted meanwhile)."""
    rt = load()
    decode_worker(rt).forward_batch_generation(Batch())
    calls = open_calls(rt.flush)
    common = os.O_NOFOLLOW | os.O_CLOEXEC
    assert calls == [
        (str(logs), os.O_RDONLY | os.O_DIRECTORY | common),
        (log_name(), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | common, 0o600, "dir_fd"),
    ]
    import fcntl
    assert fcntl.fcntl(rt._fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
    assert stat.S_IMODE(os.stat(str(logs / log_name())).st_mode) == 0o600 and len(records(logs)) == 1


def test_a_link_planted_at_the_log_file_is_not_followed(load, logs, tmp_path, private_tmp, capsys):
    logs.mkdir(mode=0o700)
    target = tmp_path / "victim.txt"
    target.write_text("precious\n")
    os.symlink(str(target), str(logs / log_name()))
    rt = load()
    decode_worker(rt).forward_batch_generation(Batch())
    rt.flush()
    assert target.read_text() == "precious\n"
    assert os.path.islink(str(logs / log_name()))
    fallback = rt._stats()["log_dir"]
    assert os.path.dirname(fallback) == str(private_tmp) and len(records(fallback)) == 1
    err = capsys.readouterr().err
    assert err.count("[eaglepatch]") == 1 and fallback in err and "link" in err


def test_a_fifo_at_the_log_file_is_not_opened(load, logs, private_tmp, capsys):
    logs.mkdir(mode=0o700)
    os.mkfifo(str(logs / log_name()))
    rt = load(exit_seconds=5.0)
    decode_worker(rt).forward_batch_generation(Batch())
    t0 = time.time()
    rt.flush()
    assert time.time() - t0 < 4.0                               # an open for writing would block on the FIFO
    assert len(records(rt._stats()["log_dir"])) == 1 and rt._stats()["log_dir"] != str(logs)
    assert "regular file" in capsys.readouterr().err


@pytest.mark.parametrize("plant", ["link", "loop", "dir", "fifo"])
def test_something_not_a_regular_file_at_the_log_file_is_refused_before_the_open(load, logs, tmp_path, private_tmp,
                                                                                 capsys, plant):
    """The lstat refuses a link (even one that loops or dangles), a directory, a FIFO: one reason for all."""
    logs.mkdir(mode=0o700)
    path = str(logs / log_name())
    if plant == "link":
        os.symlink(str(tmp_path / "nowhere"), path)
    elif plant == "loop":
        os.symlink(log_name(), path)
    elif plant == "dir":
        os.mkdir(path)
    else:
        os.mkfifo(path)
    rt = load()
    decode_worker(rt).forward_batch_generation(Batch())
    rt.flush()
    assert capsys.readouterr().err == _fallback_line(rt, logs, "%s is a link or not a regular file" % log_name())
    assert len(records(rt._stats()["log_dir"])) == 1 and not os.path.exists(str(tmp_path / "nowhere"))


@pytest.mark.parametrize("plant", ["link", "fifo", "fifo with a reader"])
def test_something_planted_between_the_check_and_the_open_is_refused(load, logs, tmp_path, private_tmp, capsys,
                                                                     monkeypatch, plant):
    """The file is checked (lstat), then opened: what is planted in between is refused by the open's flags
    (O_NOFOLLOW: ELOOP, O_NONBLOCK: ENXIO) or by the fstat after it."""
    logs.mkdir(mode=0o700)
    path = str(logs / log_name())
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
    assert capsys.readouterr().err == _fallback_line(rt, logs, why % log_name())
    assert len(records(rt._stats()["log_dir"])) == 1
    if plant == "link":
        assert (tmp_path / "victim").read_text() == "precious\n"


def test_a_deleted_log_file_is_opened_again(load, logs):
    """The file stays open between batches; a cleaned-up log dir (file deleted) gets a new one."""
    rt = load()
    w = decode_worker(rt)
    w.forward_batch_generation(Batch(1))
    rt.flush()
    os.unlink(str(logs / log_name()))
    os.rmdir(str(logs))
    w.forward_batch_generation(Batch(2))
    rt.flush()
    assert [r["bs"] for r in records(logs)] == [2]
    assert stat.S_IMODE(os.stat(str(logs)).st_mode) == 0o700


def test_configure_closes_the_log_file(load, logs):
    rt = load()
    decode_worker(rt).forward_batch_generation(Batch(1))
    rt.flush()
    fd = rt._fd
    ino = os.fstat(fd).st_ino
    rt.configure(log_dir=str(logs), summary_every=0)
    assert rt._fd is None
    try:
        assert os.fstat(fd).st_ino != ino                       # the number may have been reused meanwhile
    except OSError:
        pass


# --- writing: whole lines only -------------------------------------------------------------------------------
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


def test_a_write_returning_zero_does_not_loop_forever(load, logs, monkeypatch):
    rt = load()
    w = decode_worker(rt)
    monkeypatch.setattr(os, "write", lambda fd, data: 0)
    w.forward_batch_generation(Batch())
    rt.flush()
    assert rt._stats()["dropped"] == 1 and rt._stats()["paused"] == "error"      # said, no internal error
    assert rt._stats()["errors"] == 0


def test_a_write_returning_zero_is_reported_as_such(load, logs, monkeypatch, capsys):
    """os.write returning 0 (no progress, no error) is a failed write saying so, not a loop."""
    rt = load()
    monkeypatch.setattr(os, "write", lambda fd, data: 0)
    decode_worker(rt).forward_batch_generation(Batch())
    rt.flush()
    monkeypatch.undo()
    rt.flush()
    assert "failed ([Errno %d] write returned 0)" % errno.EIO in capsys.readouterr().err


def test_enospc_mid_line_leaves_only_whole_lines_and_counts_the_loss(load, logs, monkeypatch, capsys):
    rt = load()
    clock = [0.0]
    rt._clock = lambda: clock[0]                                 # the look at free space: once a second
    w = decode_worker(rt)
    w.forward_batch_generation(Batch(1))
    rt.flush()                                                   # one good line first
    real = os.write
    state = {"failed": False}

    def half_then_enospc(fd, data):
        # The disk fills up in the middle of the batch's second line.
        if not state["failed"] and threading.current_thread().name == "eaglepatch-writer":
            state["failed"] = True
            data = bytes(data)
            real(fd, data[:data.index(b"\n") + 1 + 10])
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data)

    monkeypatch.setattr(os, "write", half_then_enospc)
    for _ in range(4):
        w.forward_batch_generation(Batch(2))
    rt.flush()
    assert state["failed"]
    text = (logs / log_name()).read_text()
    assert text.endswith("\n")
    recs = [json.loads(line) for line in text.splitlines()]     # only whole JSON lines
    recs = [r for r in recs if r.get("kind") != "run"]
    kept = len(recs) - 1
    assert [r["bs"] for r in recs] == [1, 2] and kept == 1
    assert rt._stats()["dropped"] == 4 - kept
    clock[0] += 1.0                                              # the disk has room again, looked at a second on
    w.forward_batch_generation(Batch(3))
    rt.flush()
    recs = records(logs)
    assert recs[-1]["bs"] == 3 and recs[-1]["dropped"] == 4 - kept
    err = capsys.readouterr().err
    assert "the timing log's filesystem is full" in err and "internal error" not in err


def failing_disk(monkeypatch, cuts):
    """os.write as a failing disk: write k (for k < len(cuts)) puts cuts[k] bytes in the file and fails (EIO); the
    later ones work. ftruncate fails (EPERM) until the function returned is called."""
    real_write, real_trunc = os.write, os.ftruncate
    state = {"n": 0}

    def flaky(fd, data):
        k = state["n"]
        state["n"] += 1
        if k < len(cuts):
            real_write(fd, bytes(data[:cuts[k]]))
            raise OSError(errno.EIO, "I/O error")
        return real_write(fd, data)

    def no_truncate(fd, size):
        raise OSError(errno.EPERM, "no")

    monkeypatch.setattr(os, "write", flaky)
    monkeypatch.setattr(os, "ftruncate", no_truncate)
    return lambda: monkeypatch.setattr(os, "ftruncate", real_trunc)


def test_a_failed_cut_back_starts_the_next_batch_on_a_new_line(load, logs, monkeypatch):
    rt = load()
    rt._FREE_CHECK_SECONDS = 0.0                                 # a failed write is tried again at once
    w = decode_worker(rt)
    truncate_works = failing_disk(monkeypatch, [10])
    w.forward_batch_generation(Batch(1))
    rt.flush()
    truncate_works()
    w.forward_batch_generation(Batch(2))
    rt.flush()
    lines = (logs / log_name()).read_text().splitlines()
    # the torn fragment, then (the file opened again) a run header, the drops so far, then the record on a line
    # of its own
    assert len(lines) == 4 and json.loads(lines[1])["kind"] == "run"
    assert json.loads(lines[2])["kind"] == "drops" and json.loads(lines[2])["reasons"] == {"error": 1}
    assert json.loads(lines[3])["bs"] == 2 and json.loads(lines[3])["dropped"] == 1


def test_a_cut_back_that_ends_on_a_whole_line_clears_the_torn_state(load, logs, monkeypatch):
    """A torn file (a failed write whose cut-back failed too); the next batch's write fails just after its leading
    newline and this cut-back works, so the file ends on a whole line again: the batch after starts right there,
    with no empty line (found by mutation testing: the torn state used to stay set)."""
    rt = load()
    rt._FREE_CHECK_SECONDS = 0.0                                 # a failed write is tried again at once
    w = decode_worker(rt)
    # a fragment of the first batch, then the leading newline of the second, each time the disk failing after
    truncate_works = failing_disk(monkeypatch, [10, 1])
    w.forward_batch_generation(Batch(1))
    rt.flush()
    truncate_works()
    w.forward_batch_generation(Batch(2))
    rt.flush()
    w.forward_batch_generation(Batch(3))
    rt.flush()
    text = (logs / log_name()).read_text()
    assert "\n\n" not in text
    lines = text.splitlines()
    assert len(lines[0]) == 10 and json.loads(lines[-1])["bs"] == 3     # the fragment ... the third batch's record


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
    before = (logs / log_name()).read_bytes()
    assert len(before) == 10 and rt._torn
    monkeypatch.setattr(os, "ftruncate", real_trunc)
    w.forward_batch_generation(Batch(2))
    rt.flush()                                                   # nothing written at all
    monkeypatch.undo()
    assert (logs / log_name()).read_bytes() == before and rt._stats()["dropped"] == 2
