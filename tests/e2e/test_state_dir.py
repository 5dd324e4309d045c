"""eaglepatch's own files on the host (a relaunched server's log ``server-PORT.log``, its start script
``start-PORT.sh``, the port's relaunch lock ``relaunch-PORT.lock``) go to the folder ``EAGLEPATCH_STATE_DIR`` of the
host-side process names, resolved on the host: over SSH, the login's environment (the session's sshd sets it with
``SetEnv``: tests/conftest.py's folder), whatever the client's own says; for a local target, the CLI's own. Nothing
of the test's port is written to the shared /tmp/eaglepatch (issue 41)."""

from __future__ import annotations

import fcntl
import os
import sys
import time
from pathlib import Path

import pytest

from eaglepatch.errors import Conflict
from eaglepatch.hosts.local import LocalHost
from eaglepatch.hosts.spec import SSHOptions
from eaglepatch.hosts.target import open_host, parse_target
from eaglepatch.server import RestartOptions, Strategy, find_servers, restart, select_server
from safety import H as harness  # the fixture standins: conftest.py

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

PY = sys.executable
FAST = dict(timeout=30, poll_interval=0.2, grace=5.0, port_timeout=10.0)
SHARED = ("/tmp/eaglepatch", f"/tmp/eaglepatch-{os.getuid()}")


def _names(port: int) -> tuple[str, ...]:
    return (f"server-{port}.log", f"start-{port}.sh", f"relaunch-{port}.lock")


def _shared_files(port: int) -> dict[str, tuple[int, int] | None]:
    """The port's files in the shared folders (other users' and runs' files are there too: only this port's
    names are looked at), each by its inode and mtime, or None when absent."""
    out: dict[str, tuple[int, int] | None] = {}
    for folder in SHARED:
        for name in _names(port):
            try:
                st = os.lstat(os.path.join(folder, name))
                out[os.path.join(folder, name)] = (st.st_ino, st.st_mtime_ns)
            except FileNotFoundError:
                out[os.path.join(folder, name)] = None
    return out


def _server_on(host, port: int, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while True:
        server = select_server(find_servers(host, PY), port=port)
        if server is not None:
            return server
        if time.monotonic() > deadline:
            raise AssertionError(f"no server on :{port}")
        time.sleep(0.05)


def _relaunch_into(host, standins, tmp_path: Path, state: Path) -> None:
    """Start a stand-in whose output goes to no file, relaunch it through ``host``, and check that its log,
    start script and lock are in ``state`` and that nothing of its port was written to the shared folders."""
    tree = harness.make_tree(tmp_path / "stub tree")
    port = standins.port()
    standins.launch(tree, tmp_path / "work", port, log=Path("/dev/null"))  # no file: a relaunch writes the log
    harness.wait_http(port)
    before = _shared_files(port)
    old = _server_on(host, port)
    assert old.launch_spec().log_path == ""  # the client names no log: the host's default

    lines: list[str] = []
    r = restart(host, current=old, options=RestartOptions(**FAST), progress=lines.append, python=PY)
    assert r.ready and r.strategy is Strategy.RELAUNCH, r
    assert r.log_path == str(state / f"server-{port}.log") and r.script == str(state / f"start-{port}.sh"), r
    assert any(f"its log: {state}/server-{port}.log" in line for line in lines), lines
    assert f"starting pid={r.pid} " in (state / f"server-{port}.log").read_text()
    assert (state / f"relaunch-{port}.lock").is_file()
    assert _shared_files(port) == before, "the relaunch wrote into the shared /tmp/eaglepatch"

    # a scan that settles waits on the same lock: the host resolves the default there too
    held = os.open(state / f"relaunch-{port}.lock", os.O_RDWR)
    fcntl.flock(held, fcntl.LOCK_EX)
    try:
        with pytest.raises(Conflict, match=f"a relaunch of the server on :{port} still runs"):
            find_servers(host, PY, settle=old.launch_spec(), settle_wait=0.2)
    finally:
        os.close(held)
    assert _shared_files(port) == before


def test_a_restart_over_ssh_keeps_its_files_in_the_logins_state_dir(
        sshd, ssh_home, standins, tmp_path, eaglepatch_state_dir, monkeypatch):
    """The login's EAGLEPATCH_STATE_DIR (sshd's SetEnv) rules, not the client's: the client's own is unset."""
    monkeypatch.delenv("EAGLEPATCH_STATE_DIR")
    host = open_host(parse_target(sshd.target, SSHOptions(identity=sshd.client_key)))
    try:
        _relaunch_into(host, standins, tmp_path, Path(eaglepatch_state_dir))
    finally:
        host.close()


def test_a_local_restart_keeps_its_files_in_the_clis_state_dir(standins, tmp_path, monkeypatch):
    """A local target's host side is the CLI's own environment."""
    state = tmp_path / "local state"
    monkeypatch.setenv("EAGLEPATCH_STATE_DIR", str(state))
    _relaunch_into(LocalHost(), standins, tmp_path, state)
    assert os.stat(state).st_mode & 0o777 == 0o700  # made private, as /tmp/eaglepatch is
