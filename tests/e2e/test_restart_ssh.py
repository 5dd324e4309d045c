"""Restarting the stand-in sglang server over a real SSH connection (the sshd of conftest.py, on 127.0.0.1).

The server runs on "the host" (this machine, reached through sshd); eaglepatch's helpers run there through the
SSH session. The relaunched server must outlive that session: it is checked after the connection is closed.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from eaglepatch.hosts.local import LocalHost
from eaglepatch.hosts.spec import SSHOptions
from eaglepatch.hosts.target import open_host, parse_target
from eaglepatch.server import LaunchSpec, ReadyState, RestartOptions, Strategy, find_servers, restart, select_server
from safety import H as harness  # the fixture standins: conftest.py

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

PY = sys.executable
FAST = dict(poll_interval=0.2, grace=5.0, port_timeout=10.0)
ENV_VAR = "EAGLEPATCH_TEST_VAR"
ENV_VALUE = "a value with spaces"
MODEL = "models/draft model"


@pytest.fixture
def ssh_host(sshd, ssh_home):
    host = open_host(parse_target(sshd.target, SSHOptions(identity=sshd.client_key)))
    try:
        yield host
    finally:
        host.close()


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return harness.make_tree(tmp_path / "stub tree")


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    d = tmp_path / "work dir"
    d.mkdir()
    return d


def server_on(host, port: int, children: int = 0, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while True:
        server = select_server(find_servers(host, PY), port=port)
        if server is not None and len(server.children) >= children:
            return server
        if time.monotonic() > deadline:
            raise AssertionError(f"no server with {children} children on :{port}: {server}")
        time.sleep(0.05)


def test_relaunch_over_ssh_and_the_new_server_outlives_the_connection(standins, tree, workdir, ssh_host):
    port = standins.port()
    standins.launch(tree, workdir, port, "--tp", "2", "--model-path", MODEL, "--startup-delay", "1",
                    **{ENV_VAR: ENV_VALUE})
    harness.wait_http(port)
    old = server_on(ssh_host, port, children=2)
    assert (old.cwd, old.env[ENV_VAR], old.argv[-2:]) == (str(workdir), ENV_VALUE, ["--startup-delay", "1"])

    lines: list[str] = []
    result = restart(ssh_host, current=old, options=RestartOptions(timeout=30, **FAST), progress=lines.append,
                     python=PY)
    assert result.ready, result
    assert result.strategy is Strategy.RELAUNCH and result.pid != old.pid
    assert any(line.startswith(f"waiting for sglang on :{port} (") for line in lines)
    assert not harness.alive(old.pid) and not any(harness.alive(c) for c in old.children)

    new = server_on(ssh_host, port, children=2)
    assert (new.pid, new.argv, new.cwd, new.env[ENV_VAR]) == (result.pid, old.argv, old.cwd, ENV_VALUE)

    ssh_host.close()  # the SSH session that started it ends
    time.sleep(1.0)
    assert harness.alive(result.pid)
    assert harness.http_get(port, "/health_generate")[0] == 200
    after = select_server(find_servers(LocalHost(), PY), port=port)
    assert after is not None and after.pid == result.pid and len(after.children) == 2
    assert after.sid == after.pid  # a session of its own, not the SSH session's


def test_a_broken_worker_over_ssh_is_not_ready_fast_and_the_original_comes_back(standins, tree, workdir, ssh_host):
    port = standins.port()
    standins.launch(tree, workdir, port, "--tp", "2", **{ENV_VAR: ENV_VALUE})
    harness.wait_http(port)
    old = server_on(ssh_host, port, children=2)
    manifest_entry = old.launch_spec().to_json()

    harness.set_worker(tree, harness.BROKEN_WORKER)
    t0 = time.monotonic()
    broken = restart(ssh_host, current=old, options=RestartOptions(timeout=60, **FAST), python=PY)
    assert time.monotonic() - t0 < 20
    assert (broken.ready, broken.state) == (False, ReadyState.DIED)
    assert "RuntimeError: broken patch" in broken.log_tail

    harness.set_worker(tree, harness.TRIVIAL_WORKER)
    back = restart(ssh_host, current=None, launch=LaunchSpec.from_json(manifest_entry),
                   options=RestartOptions(timeout=30, **FAST), python=PY)
    assert back.ready and back.strategy is Strategy.START, back
    again = server_on(ssh_host, port, children=2)
    assert (again.pid, again.argv, again.cwd, again.env[ENV_VAR]) == (back.pid, old.argv, old.cwd, ENV_VALUE)
