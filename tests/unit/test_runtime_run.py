"""Which launch a record belongs to (the runtime's "run" and its header line), from a process tree in /proc.

sglang starts one scheduler process per rank with multiprocessing's spawn method (and a data-parallel controller
the same way): every rank must name the same launcher, a new launch another one, and a long-lived parent (a
shell, tmux, systemd, a Python supervisor) must never be taken for the launcher, or runs would blend again. The
run id names the launcher, its start and a digest of the timer configuration; the header line, the first of each
log file, carries the launch's speculative flags and its argv with secrets masked.

Several of these tests were written to kill mutants of the runtime (docs/mutation-runtime.md).
"""
import json
import os
import socket

import pytest

from runtime_helpers import Batch, decode_worker, headers, load_module, log_name, records

SPAWN = ["/opt/venv/bin/python", "-c", "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, "
         "pipe_handle=7)", "--multiprocessing-fork"]
FORKSERVER = ["/opt/venv/bin/python", "-c", "from multiprocessing.forkserver import main; main(8, 9, ['__main__'])"]
LAUNCH = ["/opt/venv/bin/python", "-m", "sglang.launch_server", "--model-path", "m", "--speculative-algorithm",
          "EAGLE3", "--speculative-num-steps=3", "--speculative-eagle-topk", "1", "--enable-foo",
          "--speculative-draft-model-path", "/d", "--api-key", "sk-123", "--tp-size", "2"]


class Proc(object):
    """A /proc tree written to a folder: add(pid, ppid, argv, start ticks)."""

    def __init__(self, root):
        self.root = root

    def use(self, rt):
        rt._PROC = str(self.root)
        return rt

    def add(self, pid, ppid, argv, ticks=1000, comm="python3", raw_argv=None):
        """`raw_argv`: the cmdline file's bytes as they are; `ppid` None: no stat file (a process half gone)."""
        d = self.root / str(pid)
        d.mkdir()
        (d / "cmdline").write_bytes(raw_argv if raw_argv is not None else b"".join(a.encode() + b"\0" for a in argv))
        if ppid is not None:
            rest = ["S", str(ppid)] + ["0"] * 17 + [str(ticks)] + ["0"] * 30
            (d / "stat").write_text("%d (%s) %s\n" % (pid, comm, " ".join(rest)))


@pytest.fixture
def proc(tmp_path):
    """A /proc of our own; `proc.use(rt)` points a loaded runtime at it."""
    root = tmp_path / "proc"
    root.mkdir()
    p = Proc(root)
    p.add(1, 0, ["/sbin/init"])
    return p


def test_every_rank_of_a_launch_names_its_launcher_and_not_the_shell_above(rt, proc):
    proc.use(rt)
    proc.add(50, 1, ["tmux", "new", "-s", "sglang"])                  # long-lived, "sglang" in its command line
    proc.add(60, 50, ["bash"])
    proc.add(100, 60, LAUNCH, ticks=5000)
    proc.add(101, 100, SPAWN)                                          # rank 0's scheduler
    proc.add(102, 100, SPAWN)                                          # rank 1's scheduler
    proc.add(103, 100, SPAWN)                                          # the data-parallel controller ...
    proc.add(104, 103, SPAWN)                                          # ... and a rank under it
    proc.add(105, 100, FORKSERVER)
    proc.add(106, 105, FORKSERVER)                                     # forked by the forkserver
    for pid in (100, 101, 102, 104, 106):
        assert rt._launcher(pid) == (100, 5000, LAUNCH), pid


def test_ranks_that_sglang_renamed_name_their_launcher(rt, proc):
    """sglang's schedulers and data-parallel controller call setproctitle: /proc shows "sglang::scheduler_TP1"
    (the rest of the old command line overwritten with NULs), not the spawn command line."""
    proc.use(rt)
    proc.add(60, 1, ["bash"])
    proc.add(100, 60, LAUNCH, ticks=5000)
    proc.add(101, 100, ["sglang::scheduler_TP0"] + [""] * 5)
    proc.add(102, 100, ["sglang::data_parallel_controller"])
    proc.add(103, 102, ["sglang::scheduler_DP1_TP1"])
    for pid in (101, 103):
        assert rt._launcher(pid) == (100, 5000, LAUNCH), pid
    assert rt._launcher(60)[0] == 60 and rt._launcher(100)[0] == 100


def test_a_fork_of_the_launcher_names_the_launcher_and_a_python_parent_is_not_taken(rt, proc):
    proc.use(rt)
    sup = ["/opt/venv/bin/python", "/opt/supervisor.py", "--serve", "sglang"]   # same interpreter, not the launch
    proc.add(40, 1, sup)
    proc.add(100, 40, LAUNCH, ticks=7)
    proc.add(101, 100, LAUNCH, ticks=9)                                # os.fork(): same command line
    assert rt._launcher(101) == (100, 7, LAUNCH)
    assert rt._launcher(40) == (40, 1000, sup)


def test_a_launch_reusing_a_pid_is_another_launch(rt, proc):
    proc.use(rt)
    proc.add(100, 1, LAUNCH, ticks=5000)
    first = rt._launcher(100)
    (proc.root / "100" / "stat").write_text("100 (py) S 1 " + " ".join(["0"] * 17 + ["9000"]) + "\n")
    assert first[:2] == (100, 5000) and rt._launcher(100)[:2] == (100, 9000)


def test_without_proc_the_process_is_its_own_launcher(rt, proc):
    proc.use(rt)
    import sys
    assert rt._launcher(4242) == (4242, 0, list(sys.argv))


def test_a_name_with_spaces_and_parentheses_in_stat(rt, proc):
    proc.use(rt)
    proc.add(100, 1, LAUNCH, ticks=77, comm="sglang::sch (r) 0")
    proc.add(101, 100, SPAWN, comm="a ) b")
    assert rt._launcher(101)[:2] == (100, 77)


def test_flags_are_the_speculative_options_of_the_launch():
    rt = load_module()
    assert rt._flags_of(LAUNCH) == {"speculative-algorithm": "EAGLE3", "speculative-num-steps": "3",
                                    "speculative-eagle-topk": "1", "speculative-draft-model-path": "/d"}
    assert rt._flags_of(["x", "--speculative-adaptive", "--speculative-num-steps", "-1"]) == {
        "speculative-adaptive": True, "speculative-num-steps": "-1"}
    assert rt._flags_of(["x", "--speculative-adaptive"]) == {"speculative-adaptive": True}


def test_flags_keep_the_batch_limits_too():
    """What report --predict prices the batch sizes up to: --cuda-graph-max-bs and --max-running-requests, in
    either spelling; other options are not kept."""
    rt = load_module()
    assert rt._flags_of(["x", "--cuda-graph-max-bs", "64", "--max-running-requests=128", "--tp", "8",
                         "--cuda-graph-max-bs-decode", "32"]) == {"cuda-graph-max-bs": "64",
                                                                  "max-running-requests": "128"}


def test_secrets_are_masked_in_the_argv_written():
    rt = load_module()
    out = rt._redacted(LAUNCH + ["--hf-token=abc", "--admin-password", "--x", "--ssl-keyfile", "/k",
                                 "--speculative-num-draft-tokens", "4"])
    assert "sk-123" not in out and "abc" not in " ".join(out)
    assert out[-4:] == ["--ssl-keyfile", "/k", "--speculative-num-draft-tokens", "4"]   # a path and a count
    assert out[out.index("--api-key") + 1] == "***" and "--hf-token=***" in out
    assert out[out.index("--admin-password") + 1] == "--x"            # a flag without a value hides nothing
    assert out[:out.index("--api-key")] == LAUNCH[:LAUNCH.index("--api-key")]


def test_records_and_header_carry_the_run_of_the_launch(load, logs, proc, monkeypatch):
    rt = proc.use(load())
    proc.add(100, 1, LAUNCH, ticks=5000)
    proc.add(os.getpid(), 100, SPAWN)
    w = decode_worker(rt)
    for _ in range(3):
        w.forward_batch_generation(Batch(2))
    rt.flush()
    recs, (head,) = records(logs), headers(logs)
    rid = head["run"]
    assert rid.startswith("%s-100-5000-" % rt._host) and len(rid.rsplit("-", 1)[1]) == 8
    assert [r["run"] for r in recs] == [rid] * 3
    assert head["flags"]["speculative-num-steps"] == "3" and head["launcher"] == 100 and head["timer"] == "cpu"
    assert "sk-123" not in json.dumps(head)


def test_another_configuration_is_another_run_and_the_same_one_the_same(load, tmp_path, proc):
    proc.add(100, 1, LAUNCH, ticks=5000)
    proc.add(os.getpid(), 100, SPAWN)
    ids = []
    for i, kw in enumerate([{}, {}, {"every": 2}, {"mode": "sync"}, {"mode": "auto", "timers": {"W": "events"}}]):
        rt = proc.use(load(log_dir=str(tmp_path / ("l%d" % i)), **kw))
        decode_worker(rt).forward_batch_generation(Batch(1))
        rt.flush()
        ids.append(headers(tmp_path / ("l%d" % i))[0]["run"])
    assert ids[0] == ids[1] and len(set(ids)) == 4


def test_a_log_file_deleted_under_the_server_gets_a_new_header(rt, logs, proc):
    w = decode_worker(rt)
    w.forward_batch_generation(Batch(1))
    rt.flush()
    for f in logs.iterdir():
        f.unlink()
    w.forward_batch_generation(Batch(2))
    rt.flush()
    assert len(headers(logs)) == 1 and [r["bs"] for r in records(logs)] == [2]


# --- the launcher: climbing /proc ----------------------------------------------------------------------------
ONE_FLAG_LAUNCH = ["/opt/venv/bin/python", "-m", "sglang.launch_server", "--model-path", "m",
                   "--speculative-num-steps", "3"]


def test_a_command_line_that_is_not_utf8_is_read_with_replacement_characters(rt, proc):
    """A /proc/<pid>/cmdline that is not UTF-8 is read with replacement characters, not refused."""
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
    proc.add(2, 1, ONE_FLAG_LAUNCH, ticks=7)
    proc.add(3, 2, SPAWN)
    assert rt._launcher(3) == (2, 7, ONE_FLAG_LAUNCH)


@pytest.mark.parametrize("parent", ["empty cmdline", "no stat"])
def test_a_parent_that_cannot_be_read_ends_the_climb(rt, proc, parent):
    """A parent whose command line is empty (a zombie, a kernel thread) or whose stat is gone: the child is the
    launcher."""
    proc.use(rt)
    if parent == "empty cmdline":
        proc.add(100, 1, [], ticks=5)
    else:
        proc.add(100, None, ONE_FLAG_LAUNCH)
    proc.add(101, 100, SPAWN, ticks=66)
    assert rt._launcher(101) == (101, 66, SPAWN)


def test_the_climb_stops_after_64_parents(rt, proc):
    """A bound on the walk up (a /proc that changes under it must not keep it going): 64 steps at most."""
    proc.use(rt)
    proc.add(100, 1, ONE_FLAG_LAUNCH)
    for pid in range(101, 171):                                       # 70 spawned levels
        proc.add(pid, pid - 1, SPAWN, ticks=pid)
    assert rt._launcher(170)[:2] == (170 - 64, 170 - 64)


@pytest.mark.parametrize("missing", ["cmdline", "stat"])
def test_a_process_whose_proc_entry_is_half_there_is_its_own_launcher(rt, proc, missing):
    """Its command line (empty: a process on its way out) or its stat cannot be read: as without /proc, this
    process, start 0, this interpreter's argv."""
    import sys
    proc.use(rt)
    if missing == "cmdline":
        proc.add(100, 1, [], ticks=5)
    else:
        proc.add(100, None, ONE_FLAG_LAUNCH)
    assert rt._launcher(100) == (100, 0, list(sys.argv))


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


# --- secrets in the argv written -----------------------------------------------------------------------------
def test_a_secret_hides_only_the_one_value_after_it():
    """A secret option hides the one value after it; the words after that are written as they are."""
    rt = load_module()
    argv = ["python", "--api-key", "sk", "positional", "--x"]
    assert rt._redacted(argv) == ["python", "--api-key", "***", "positional", "--x"]


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


@pytest.mark.parametrize("name", ["--kt-max-deferred-experts-per-token", "--bucket-time-to-first-token",
                                  "BUCKET_TIME_TO_FIRST_TOKEN", "MAX_EXPERTS_PER_TOKEN"])
def test_a_measure_per_token_is_no_secret(rt, name):
    """Names ending in "-per-token" or "-first-token" (sglang options; `_` read as `-` in a variable) hide nothing:
    eaglepatch/redact.py's rule, which the real releases' options hold the two to (tests/real)."""
    assert rt._secret_name(name) is False
    assert rt._redacted(["python", name, "4", name + "=4"]) == ["python", name, "4", name + "=4"]


# --- the run id and the header line --------------------------------------------------------------------------
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
    proc.add(100, 1, ONE_FLAG_LAUNCH, ticks=5000)
    proc.add(os.getpid(), 100, SPAWN)
    rt = proc.use(load(**kw))
    decode_worker(rt).forward_batch_generation(Batch())
    rt.flush()
    assert headers(logs)[0]["run"] == "%s-100-5000-%s" % (rt._host, _fnv(cfg))


def test_the_header_line_has_exactly_its_fields(rt, logs, proc, monkeypatch):
    """The run header, the log file's first line: exactly its fields (t to 6 places, the launcher, its argv and
    speculative flags, the log dir, the runtime's path), one JSON object on one line."""
    proc.add(100, 1, ONE_FLAG_LAUNCH, ticks=5000)
    proc.add(os.getpid(), 100, SPAWN)
    proc.use(rt)
    monkeypatch.setattr(rt, "_wall", lambda: 1234.567890123)
    decode_worker(rt).forward_batch_generation(Batch())
    rt.flush()
    with open(str(logs / log_name())) as f:
        first = f.readline()
    assert json.loads(first) == {
        "v": 1, "kind": "run", "run": first and json.loads(first)["run"], "t": 1234.56789, "host": rt._host,
        "pid": os.getpid(), "rank": 0, "timer": "cpu", "flags": {"speculative-num-steps": "3"}, "launcher": 100,
        "argv": ONE_FLAG_LAUNCH, "log_dir": str(logs), "runtime": os.path.realpath(rt.__file__)}
    assert first.endswith("}\n")


def test_a_percent_sign_in_the_host_name_is_written_as_is(rt, logs):
    """The host and run id are put into a %-format: a "%" in them must not be read as a conversion."""
    rt._host = "gpu%d-%s%%"
    decode_worker(rt).forward_batch_generation(Batch())
    rt.flush()
    (rec,) = records(logs)
    (head,) = headers(logs)
    assert rec["host"] == head["host"] == "gpu%d-%s%%"
    assert rec["run"] == head["run"] and rec["run"].startswith("gpu%d-%s%%-")
