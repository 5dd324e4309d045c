"""The host-side program (eaglepatch/hostside/): it must run on the host's own interpreter (3.8+), stdlib only, and
answer through the one agent; its log tail."""

from __future__ import annotations

import json
import os
import sys

from eaglepatch.hosts.agent import call
from eaglepatch.hosts.bundle import check_module, sources
from eaglepatch.hosts.local import LocalHost
from eaglepatch.hostside.probe import tail_lines


def test_every_host_side_module_parses_as_python_3_8_and_imports_only_the_standard_library_and_itself():
    found = sources()
    assert "eaglepatch.hostside.main" in found and len(found) > 10
    for name, (is_package, text) in found.items():
        check_module(text, name.replace(".", "/") + ("/__init__.py" if is_package else ".py"))  # or BundleError


def test_log_tail_reads_only_after_the_offset_splits_progress_bars_and_drops_our_own_polls(tmp_path):
    log = tmp_path / "server.log"
    old = b"old run line\n"
    log.write_bytes(
        old
        + b"Loading safetensors 10%\rLoading safetensors 50%\r"
        + b'INFO:     127.0.0.1:5555 - "GET /health_generate HTTP/1.1" 503 Service Unavailable\n'
        + b"\n"
        + b"Capture cuda graph bs [1, 2]\n"
        + b'INFO:     127.0.0.1:5555 - "GET /health HTTP/1.1" 503\n'
    )
    assert tail_lines(str(log), len(old), 30) == [
        "Loading safetensors 10%",
        "Loading safetensors 50%",
        "Capture cuda graph bs [1, 2]",
    ]
    assert tail_lines(str(log), len(old), 1) == ["Capture cuda graph bs [1, 2]"]
    assert tail_lines(str(log), 10_000, 2) == ["Loading safetensors 50%", "Capture cuda graph bs [1, 2]"]
    assert tail_lines(str(tmp_path / "missing.log"), 0, 5) is None


def test_the_helper_runs_through_the_agent_on_this_machine(tmp_path):
    """One real round trip: the bundled package is what runs, one process for every op of the host."""
    (tmp_path / "log").write_text("a\nb\n")
    host = LocalHost()
    try:
        assert call(host, sys.executable, "tail", timeout=60, log_path=str(tmp_path / "log"), lines=1) == {
            "lines": ["b"]}
        assert isinstance(call(host, sys.executable, "scan", timeout=60)["servers"], list)
        assert len(host.agents._agents) == 1  # the server's ops and the install's: one process
    finally:
        host.close()


def test_stop_ends_a_process_with_its_children_and_a_relaunch_starts_one(tmp_path):
    """op_stop and op_relaunch on real processes of this machine: a launcher that ignores SIGTERM is killed after
    the grace period with its child; the relaunch starts the same command line, detached, its log written."""
    import os
    import subprocess
    import time

    from eaglepatch.hostside.control import op_relaunch, op_stop
    from eaglepatch.hostside.proc import is_alive, proc_stat

    script = "import signal, subprocess, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n" \
             "subprocess.Popen(['sleep', '60'])\ntime.sleep(60)\n"
    proc = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    time.sleep(0.5)
    child = [int(c) for c in open(f"/proc/{proc.pid}/task/{proc.pid}/children").read().split()]
    start = proc_stat(proc.pid)["start"]
    out = op_stop({"pid": proc.pid, "start": start, "grace": 0.5, "leader": True})
    proc.wait(5)
    assert out["killed"] and out["remaining"] == [] and set(child) <= set(out["stopped"]), out
    assert not any(is_alive(c) for c in child)
    spec = {"argv": ["sleep", "30"], "cwd": str(tmp_path), "env": {"PATH": os.environ["PATH"]},
            "log_path": str(tmp_path / "logs" / "server.log"), "port": 1}
    res = op_relaunch({"stop": None, "start": spec, "port": 1})
    pid = res["start"]["pid"]
    try:
        assert is_alive(pid, res["start"]["start"]) and os.getsid(pid) == pid
        assert "starting in" in (tmp_path / "logs" / "server.log").read_text()
    finally:
        os.kill(pid, 9)


def test_a_relaunch_waits_for_another_of_its_port_and_settle_says_when_none_runs(tmp_path):
    """Relaunches of one port run one after the other (a lock file in the user's private log folder): while
    another holds it, a relaunch starts nothing and stops nothing after its wait, and ``settle`` says so; once
    it is let go, both go on."""
    import fcntl
    import os

    from eaglepatch.hostside.control import op_relaunch
    from eaglepatch.hostside.lock import settle

    logs = tmp_path / "logs"
    spec = {"argv": ["sleep", "30"], "cwd": str(tmp_path), "env": {"PATH": os.environ["PATH"]},
            "log_path": str(logs / "server.log"), "port": 7}
    assert settle({"port": 7, "log_path": spec["log_path"], "wait": 0})  # none ran: no wait
    held = os.open(str(logs / "relaunch-7.lock"), os.O_RDWR)
    fcntl.flock(held, fcntl.LOCK_EX)
    try:
        res = op_relaunch({"stop": None, "start": spec, "port": 7, "lock_wait": 0.2})
        assert res["not_stopped"] and "another relaunch on :7" in res["start"]["error"], res
        assert not settle({"port": 7, "log_path": spec["log_path"], "wait": 0.2})
        assert settle({"port": 8, "log_path": spec["log_path"], "wait": 0})  # another port's lock
    finally:
        os.close(held)
    assert settle({"port": 7, "log_path": spec["log_path"], "wait": 0})
    res = op_relaunch({"stop": None, "start": spec, "port": 7, "lock_wait": 0.2})
    try:
        assert res["start"]["pid"]
    finally:
        os.kill(res["start"]["pid"], 9)


def test_a_scan_that_settles_says_when_a_relaunch_of_the_port_still_runs(tmp_path):
    """``op_scan`` with ``settle`` waits for the port's relaunch lock; still held after its wait, the answer says
    ``unsettled`` (the client refuses to act on it)."""
    import fcntl
    import os

    from eaglepatch.hostside.discover import op_scan

    log = str(tmp_path / "logs" / "server.log")
    assert "unsettled" not in op_scan({"settle": {"port": 9, "log_path": log, "wait": 0}})
    held = os.open(str(tmp_path / "logs" / "relaunch-9.lock"), os.O_RDWR)
    fcntl.flock(held, fcntl.LOCK_EX)
    try:
        assert op_scan({"settle": {"port": 9, "log_path": log, "wait": 0.2}})["unsettled"] is True
    finally:
        os.close(held)


def test_an_op_module_is_compiled_on_the_host_by_the_first_request_that_needs_it():
    """The program as the host runs it (``python -S``, the bundle's finder): starting it imports no op's module;
    the facts and execute requests of an apply or a revert import theirs and never doctor, live, logs or probe;
    every op named in OPS answers with a function."""
    import subprocess

    from eaglepatch.hosts.bundle import program

    tail = '''
import json
mods = lambda: sorted(m.rsplit(".", 1)[1] for m in sys.modules if m.startswith("eaglepatch.hostside."))
seen = [mods()]
from eaglepatch.hostside.main import OPS, op
op("facts"); op("execute"); seen.append(mods())
assert all(callable(op(name)) for name in OPS)
seen.append(mods())
print(json.dumps(seen))
'''
    out = subprocess.run([sys.executable, "-S", "-c", program() + tail], capture_output=True, text=True, check=True)
    start, apply_revert, every = json.loads(out.stdout)
    assert start == ["main"]
    assert {"install", "execute"} <= set(apply_revert) and not {"doctor", "live", "logs", "probe"} & set(apply_revert)
    assert {"doctor", "live", "logs", "probe", "control"} <= set(every)


def test_the_state_folder_is_eaglepatch_state_dir_else_tmp_eaglepatch(tmp_path, monkeypatch):
    """``EAGLEPATCH_STATE_DIR`` of the host-side process names the folder of its own files (set, it is that
    folder, made absolute; unset, empty or blank, /tmp/eaglepatch); the default log of a port is there."""
    from eaglepatch.hostside.state import log_path_of, server_log_path, state_dir

    assert state_dir({}) == "/tmp/eaglepatch"
    assert state_dir({"EAGLEPATCH_STATE_DIR": ""}) == "/tmp/eaglepatch"
    assert state_dir({"EAGLEPATCH_STATE_DIR": "  "}) == "/tmp/eaglepatch"
    assert state_dir({"EAGLEPATCH_STATE_DIR": "/srv/ep"}) == "/srv/ep"
    assert state_dir({"EAGLEPATCH_STATE_DIR": "/srv/ep/"}) == "/srv/ep"
    assert state_dir({"EAGLEPATCH_STATE_DIR": "~/ep", "HOME": "/home/u"}) == os.path.expanduser("~/ep")
    monkeypatch.chdir(tmp_path)
    assert state_dir({"EAGLEPATCH_STATE_DIR": "ep"}) == str(tmp_path / "ep")  # relative: from its folder
    assert server_log_path(30001, {"EAGLEPATCH_STATE_DIR": "/srv/ep"}) == "/srv/ep/server-30001.log"
    # this process's own environment when none is given
    monkeypatch.setenv("EAGLEPATCH_STATE_DIR", str(tmp_path / "mine"))
    assert server_log_path(7) == str(tmp_path / "mine" / "server-7.log")
    assert log_path_of({"port": 7, "log_path": None}) == log_path_of({"port": 7}) == server_log_path(7)
    assert log_path_of({"port": 7, "log_path": "/srv/x.log"}) == "/srv/x.log"  # a log named is that log
    monkeypatch.delenv("EAGLEPATCH_STATE_DIR")
    assert server_log_path(7) == "/tmp/eaglepatch/server-7.log"


def test_a_relaunch_without_a_log_path_writes_its_log_script_and_lock_in_the_state_folder(tmp_path, monkeypatch):
    """The client sends no log path for the default: the host puts the log, the start script and the port's lock
    in its EAGLEPATCH_STATE_DIR (made 0700), says which log it opened, and ``settle`` waits on the same lock."""
    import fcntl

    from eaglepatch.hostside.control import op_relaunch
    from eaglepatch.hostside.lock import settle

    state = tmp_path / "state"
    monkeypatch.setenv("EAGLEPATCH_STATE_DIR", str(state))
    spec = {"argv": ["sleep", "30"], "cwd": str(tmp_path), "env": {"PATH": os.environ["PATH"]},
            "log_path": None, "port": 7}
    res = op_relaunch({"stop": None, "start": spec, "port": 7, "lock_wait": 0.2})
    try:
        assert res["start"]["log_path"] == str(state / "server-7.log"), res
        assert res["start"]["script"] == str(state / "start-7.sh")
    finally:
        os.kill(res["start"]["pid"], 9)
    assert sorted(p.name for p in state.iterdir()) == ["relaunch-7.lock", "server-7.log", "start-7.sh"]
    assert os.stat(state).st_mode & 0o777 == 0o700
    held = os.open(str(state / "relaunch-7.lock"), os.O_RDWR)
    fcntl.flock(held, fcntl.LOCK_EX)
    try:
        assert not settle({"port": 7, "log_path": None, "wait": 0.1})
        assert not settle({"port": 7, "wait": 0.1})  # an absent log path is the default too
    finally:
        os.close(held)
