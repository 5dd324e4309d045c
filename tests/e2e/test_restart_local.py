"""Restarting a real (stand-in) sglang server on this machine through ``LocalHost``.

The stand-in (tests/stubs/stand_in_sglang) runs as ``python -m sglang.launch_server --port N ...``: it has TP-like
child processes, answers 503 while "loading", imports its worker module (a broken one crashes it at startup), and
stops on SIGTERM. Each test copies the stub tree to a temporary directory (whose path has a space), uses fresh
ports, and kills whatever it started when it ends.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eaglepatch.hosts.local import LocalHost
from eaglepatch.server import (
    LaunchSpec,
    ReadyState,
    RestartOptions,
    ServerProcess,
    Strategy,
    find_servers,
    restart,
    select_server,
    stop_server,
    wait_until_ready,
)
from safety import H as harness  # the fixture standins: conftest.py

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

PY = sys.executable  # the helper programs' interpreter on the "host" (here: this one)
FAST = dict(poll_interval=0.2, grace=5.0, port_timeout=10.0)
ENV_VAR = "EAGLEPATCH_TEST_VAR"
ENV_VALUE = "a value with spaces"
MODEL = "models/draft model"  # an argument with a space


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return harness.make_tree(tmp_path / "stub tree")


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    d = tmp_path / "work dir"
    d.mkdir()
    return d


def the_server(port: int, children: int = 0, timeout: float = 10.0):
    """The server on ``port`` as find_servers sees it, once it has ``children`` child processes."""
    deadline = time.monotonic() + timeout
    while True:
        server = select_server(find_servers(LocalHost(), PY), port=port)
        if server is not None and len(server.children) >= children:
            return server
        if time.monotonic() > deadline:
            raise AssertionError(f"no server with {children} children on :{port}: {server}")
        time.sleep(0.05)


def test_find_servers_sees_argv_cwd_env_children_and_the_port(standins, tree, workdir):
    port = standins.port()
    proc = standins.launch(tree, workdir, port, "--tp", "2", "--model-path", MODEL, **{ENV_VAR: ENV_VALUE})
    server = the_server(port, children=2)
    assert server.pid == proc.pid
    assert server.argv == [PY, "-m", "sglang.launch_server", "--port", str(port), "--tp", "2", "--model-path", MODEL]
    assert server.cwd == str(workdir)
    assert server.env[ENV_VAR] == ENV_VALUE
    assert server.env["PYTHONPATH"] == str(tree)
    assert server.port == port and server.host == "127.0.0.1"
    assert len(server.children) == 2 and all(harness.alive(c) for c in server.children)
    assert server.pgid == server.pid  # launched in its own group, as from an interactive shell
    assert server.exe and Path(server.exe).name.startswith("python")
    doc = server.to_json()
    assert (doc["pid"], doc["argv"], doc["port"], doc["cwd"]) == (server.pid, server.argv, port, str(workdir))
    assert doc["launcher"] == PY  # argv[0] as launched, not /proc/PID/exe's resolved binary
    assert server.package_dir == str((tree / "sglang").resolve())
    assert "sglang from PYTHONPATH" in doc["launched"]
    # the TP children are not servers of their own, and the helper program that scans is not either
    assert [s.pid for s in find_servers(LocalHost(), PY) if s.port == port] == [proc.pid]


def test_relaunch_gives_a_new_process_with_the_same_argv_cwd_and_env(standins, tree, workdir):
    port = standins.port()
    standins.launch(tree, workdir, port, "--tp", "2", "--model-path", MODEL, "--startup-delay", "1.5",
                    **{ENV_VAR: ENV_VALUE})
    harness.wait_http(port)
    old = the_server(port, children=2)
    lines: list[str] = []
    t0 = time.monotonic()
    result = restart(LocalHost(), current=old, options=RestartOptions(timeout=30, **FAST), progress=lines.append,
                     python=PY)
    took = time.monotonic() - t0

    assert result.ready, result
    assert (result.strategy, result.stopped_pid, result.port, result.state) == (
        Strategy.RELAUNCH, old.pid, port, ReadyState.READY)
    assert result.pid is not None and result.pid != old.pid
    assert took >= 1.5  # it waited for the loading delay, not for the port to open
    assert not harness.alive(old.pid)
    assert not any(harness.alive(c) for c in old.children)

    new = the_server(port, children=2)
    assert new.pid == result.pid
    assert new.argv == old.argv
    assert new.cwd == old.cwd == str(workdir)
    assert new.env[ENV_VAR] == ENV_VALUE and new.env == old.env
    assert new.sid == new.pid  # detached: a session of its own
    assert harness.http_get(port, "/get_server_info")[1]["argv"][-2:] == ["--startup-delay", "1.5"]

    assert any(line.startswith("stopping sglang (pid %d)" % old.pid) for line in lines)
    waiting = [line for line in lines if line.startswith(f"waiting for sglang on :{port} (")]
    assert waiting, lines
    assert any("last log:" in line for line in waiting)
    log = Path(result.log_path).read_text()
    assert "The server is fired up and ready to roll!" in log


def test_not_ready_within_the_timeout_returns_the_log_tail_and_leaves_it_loading(standins, tree, workdir):
    """A server that is only slow is left to finish loading (stopping it would leave the host without one);
    stop_on_failure stops it, for the callers that need the port back."""
    port = standins.port()
    spec = LaunchSpec(
        argv=standins.argv(port, "--startup-delay", "60", "--tp", "1"),
        cwd=str(workdir),
        env=standins.env(tree),
        port=port,
        log_path=str(workdir / "server log.txt"),
    )
    t0 = time.monotonic()
    result = restart(LocalHost(), current=None, launch=spec, options=RestartOptions(timeout=2, **FAST), python=PY)
    assert time.monotonic() - t0 < 15
    assert (result.ready, result.state, result.strategy) == (False, ReadyState.TIMEOUT, Strategy.START)
    assert "loading weights" in result.log_tail
    assert "GET /health" not in result.log_tail  # our own polls are not news
    assert "not ready after 2 s" in result.message
    assert not result.stopped_failed and harness.alive(result.pid)
    other = standins.port()
    stopped = restart(LocalHost(), current=None,
                      launch=dataclasses.replace(spec, port=other, argv=standins.argv(other, "--startup-delay", "60")),
                      options=RestartOptions(timeout=2, stop_on_failure=True, **FAST), python=PY)
    assert stopped.stopped_failed and not harness.alive(stopped.pid)
    assert harness.launcher_pids(other) == [] and harness.launcher_pids(port) == [result.pid]


def test_a_broken_worker_crashes_the_server_it_returns_early_then_the_original_starts_again(standins, tree, workdir):
    """The apply rollback story: patched worker does not import -> not ready fast; put it back -> start again."""
    port = standins.port()
    standins.launch(tree, workdir, port, "--tp", "2", **{ENV_VAR: ENV_VALUE})
    harness.wait_http(port)
    old = the_server(port, children=2)
    spec = old.launch_spec()  # what apply keeps in its manifest

    harness.set_worker(tree, harness.BROKEN_WORKER)
    t0 = time.monotonic()
    result = restart(LocalHost(), current=old, options=RestartOptions(timeout=60, **FAST), python=PY)
    assert time.monotonic() - t0 < 15  # well before the timeout
    assert (result.ready, result.state) == (False, ReadyState.DIED)
    assert "Traceback (most recent call last)" in result.log_tail
    assert "RuntimeError: broken patch" in result.log_tail
    assert "exited during startup" in result.message
    assert not harness.alive(old.pid) and harness.launcher_pids(port) == []

    harness.set_worker(tree, harness.TRIVIAL_WORKER)
    again = restart(LocalHost(), current=None, launch=LaunchSpec.from_json(spec.to_json()),
                    options=RestartOptions(timeout=30, **FAST), python=PY)
    assert again.ready and again.strategy is Strategy.START, again
    back = the_server(port, children=2)
    assert (back.pid, back.argv, back.cwd, back.env[ENV_VAR]) == (again.pid, old.argv, old.cwd, ENV_VALUE)


def test_custom_restart_command_runs_as_given_and_readiness_is_awaited(standins, tree, workdir):
    port = standins.port()
    standins.launch(tree, workdir, port)
    harness.wait_http(port)
    old = the_server(port)
    cmd = (
        f"kill {old.pid}; while kill -0 {old.pid} 2>/dev/null; do sleep 0.1; done; cd {shlex.quote(str(workdir))} && "
        f"PYTHONPATH={shlex.quote(str(tree))} nohup {shlex.quote(PY)} -m sglang.launch_server --port {port} "
        f"--startup-delay 1 --model-path {shlex.quote(MODEL)} &"
    )
    lines: list[str] = []
    result = restart(LocalHost(), current=old, options=RestartOptions(restart_cmd=cmd, timeout=30, **FAST),
                     progress=lines.append, python=PY)
    assert result.ready, result
    assert result.strategy is Strategy.RESTART_CMD
    new = the_server(port)
    assert result.pid == new.pid != old.pid
    assert new.argv[-2:] == ["--model-path", MODEL] and new.cwd == str(workdir)
    assert not harness.alive(old.pid)
    # the command's output, the background server's included, went to the log on the host
    assert "fired up" in Path(result.log_path).read_text()
    assert any(line.startswith("running the restart command") for line in lines)


def test_a_server_started_by_the_restart_command_that_crashes_ends_the_wait_early(standins, tree, workdir):
    """No pid is known after a restart command; the launcher found on the port is watched instead."""
    port = standins.port()
    # like a real server, it runs a while (loading) before it reaches the broken import
    harness.set_worker(tree, "import time\ntime.sleep(1.5)\n" + harness.BROKEN_WORKER)
    cmd = (
        f"cd {shlex.quote(str(workdir))} && export PYTHONPATH={shlex.quote(str(tree))} && "
        f"nohup {shlex.quote(PY)} -m sglang.launch_server --port {port} &"
    )
    spec = LaunchSpec(argv=standins.argv(port), cwd=str(workdir), env={}, port=port,
                      log_path=str(workdir / "restart.log"))
    t0 = time.monotonic()
    result = restart(LocalHost(), current=None, launch=spec,
                     options=RestartOptions(restart_cmd=cmd, timeout=60, **FAST), python=PY)
    assert time.monotonic() - t0 < 20
    assert (result.ready, result.state) == (False, ReadyState.DIED), result
    assert "RuntimeError: broken patch" in result.log_tail


def test_a_server_that_ignores_sigterm_is_killed_after_the_grace_period(standins, tree, workdir):
    port = standins.port()
    standins.launch(tree, workdir, port, "--ignore-sigterm", "--tp", "2")
    harness.wait_http(port)
    server = the_server(port, children=2)
    stopped = stop_server(LocalHost(), server, grace=1.0, port_timeout=10, python=PY)
    assert stopped.ok, stopped
    assert server.pid in stopped.killed
    assert 1.0 <= stopped.seconds < 10
    assert not harness.alive(server.pid) and not any(harness.alive(c) for c in server.children)


def test_stopping_a_crashed_launcher_stops_the_orphans_of_its_group(standins, workdir):
    """A launcher that died first leaves its children re-parented but still in the group it led."""
    spawn = (
        "import subprocess, sys; d = subprocess.DEVNULL; "
        "print(subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
        " stdin=d, stdout=d, stderr=d).pid)"
    )
    proc = subprocess.run([PY, "-c", spawn], capture_output=True, text=True, start_new_session=True, check=True)
    orphan = int(proc.stdout)
    standins.orphans.append(orphan)
    assert harness.alive(orphan)
    # the launcher (the process that ran `spawn`) is gone; its pid led the group
    launcher = os.getpgid(orphan)
    gone = ServerProcess(pid=launcher, argv=[PY], cwd=None, env=None, exe=None, port=standins.port(),
                         pgid=launcher, sid=launcher)
    stopped = stop_server(LocalHost(), gone, grace=2, port_timeout=1, python=PY)
    assert stopped.already_gone and orphan in stopped.stopped and stopped.ok
    assert not harness.alive(orphan)


def test_ready_endpoint_is_used_where_health_generate_does_not_exist(standins, tree, workdir):
    port = standins.port()
    proc = standins.launch(tree, workdir, port, "--ready-endpoint", "--startup-delay", "0.5")
    assert wait_until_ready(LocalHost(), port, "0.0.0.0", 20, None, pid=proc.pid, python=PY,
                            poll_interval=0.1).ready


def test_starting_on_a_busy_port_is_refused(standins, tree, workdir):
    port = standins.port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        spec = LaunchSpec(argv=standins.argv(port), cwd=str(workdir), env=standins.env(tree), port=port)
        result = restart(LocalHost(), current=None, launch=spec, options=RestartOptions(timeout=5, **FAST), python=PY)
    assert not result.ready and "already in use" in result.message
    assert harness.launcher_pids(port) == []
