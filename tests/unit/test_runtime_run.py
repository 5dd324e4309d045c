"""Which launch a record belongs to (the runtime's "run" and its header line), from a process tree in /proc.

sglang starts one scheduler process per rank with multiprocessing's spawn method (and a data-parallel controller
the same way): every rank must name the same launcher, a new launch another one, and a long-lived parent (a
shell, tmux, systemd, a Python supervisor) must never be taken for the launcher, or runs would blend again.
"""
import json
import os

import pytest

from test_runtime import Batch, clean_env, decode_worker, headers, load, logs, records, rt  # noqa: F401

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
    from test_runtime import load_module
    rt = load_module()
    assert rt._flags_of(LAUNCH) == {"speculative-algorithm": "EAGLE3", "speculative-num-steps": "3",
                                    "speculative-eagle-topk": "1", "speculative-draft-model-path": "/d"}
    assert rt._flags_of(["x", "--speculative-adaptive", "--speculative-num-steps", "-1"]) == {
        "speculative-adaptive": True, "speculative-num-steps": "-1"}
    assert rt._flags_of(["x", "--speculative-adaptive"]) == {"speculative-adaptive": True}


def test_secrets_are_masked_in_the_argv_written():
    from test_runtime import load_module
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
