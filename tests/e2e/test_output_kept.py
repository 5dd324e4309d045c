"""A server's output stays where its user sent it (issue 42): started like ``nohup python -m sglang.launch_server
... > server.log 2>&1``, it writes to the same file after apply and revert (the same path, the same inode, the
restarted server's lines after eaglepatch's marker line), and nothing goes to eaglepatch's server-PORT.log. A
server whose output went to no file (/dev/null) is restarted with its output in eaglepatch's log, and status,
apply and revert say where."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from safety import make_install, servers, up_nohup

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

MARKER = "=== eaglepatch "


def _fd(pid: int, n: int) -> tuple[str, int]:
    """Where fd ``n`` of ``pid`` points: its path and inode."""
    return os.readlink(f"/proc/{pid}/fd/{n}"), os.stat(f"/proc/{pid}/fd/{n}").st_ino


def _private_logs(port: int) -> list[Path]:
    """Where eaglepatch's own log of the port may be: the state folder (the session's, tests/conftest.py), or the
    private one beside it; the shared /tmp/eaglepatch too, which no test may write."""
    state = os.environ["EAGLEPATCH_STATE_DIR"]
    return [Path(d) / f"server-{port}.log" for d in (state, f"{state}-{os.getuid()}", "/tmp/eaglepatch")]


def test_a_server_started_with_its_output_in_a_file_writes_to_that_file_after_apply_and_revert(standins, tmp_path,
                                                                                              local_cli):
    cli = local_cli  # conftest.py
    install = make_install(standins, tmp_path / "install", "venv-by-path")
    port = standins.port()
    log = tmp_path / "w" / "server.log"
    proc = up_nohup(install, standins, tmp_path / "w", port, log)
    first = _fd(proc.pid, 1)
    assert first == (str(log), log.stat().st_ino) == _fd(proc.pid, 2)
    [srv] = servers(cli, install.pkg)
    assert srv["output"] == {"stdout": str(log), "stderr": str(log), "log": None}
    assert f"output: {log}: a restart by eaglepatch appends to it" in cli.run("status", install.pkg).expect(0).out

    pids = [proc.pid]
    for n, (cmd, args) in enumerate([("apply", ["--log-dir", str(tmp_path / "timing logs")]), ("revert", [])], 1):
        size = log.stat().st_size
        r = cli.run(cmd, install.pkg, *args, "--timeout", "60").expect(0)
        [pid] = standins.launcher_pids(port)
        assert pid not in pids
        pids.append(pid)
        assert _fd(pid, 1) == first == _fd(pid, 2), f"{cmd}: the restarted server writes elsewhere"
        assert f"its log: {log} (its own output file, appended to as before)" in r.err, r
        text = log.read_bytes()[size:].decode()
        assert text.count(MARKER) == 1, text  # this relaunch's marker, then the new server's own lines
        assert f"starting pid={pid} " in text.split(MARKER, 1)[1], text
        assert log.read_text().count(MARKER) == n
        for private in _private_logs(port):
            assert not private.exists(), f"{cmd}: {private} was written"
    [srv] = servers(cli, install.pkg)
    assert srv["output"]["stdout"] == str(log)


def test_a_server_whose_output_went_to_no_file_is_told_where_it_goes(standins, tmp_path, local_cli):
    cli = local_cli  # conftest.py
    install = make_install(standins, tmp_path / "install", "venv-by-path")
    port = standins.port()
    proc = up_nohup(install, standins, tmp_path / "w", port, Path("/dev/null"))
    assert _fd(proc.pid, 1)[0] == "/dev/null"
    default = f"{os.environ['EAGLEPATCH_STATE_DIR']}/server-{port}.log"  # the host's state folder, as it says
    [srv] = servers(cli, install.pkg)
    assert srv["output"] == {"stdout": None, "stderr": None, "log": default}
    text = cli.run("status", install.pkg).expect(0).out
    assert "output: not to a file" in text and f"a restart by eaglepatch writes it to {default}" in text, text

    r = cli.run("apply", install.pkg, "--log-dir", str(tmp_path / "timing logs"), "--timeout", "60").expect(0)
    [pid] = standins.launcher_pids(port)
    where, _ino = _fd(pid, 1)
    assert where in map(str, _private_logs(port)), where
    assert f"note: the server on :{port} wrote its output to no file" in r.err and where in r.err, r
    assert f"its log: {where}" in r.err
    assert f"starting pid={pid} " in Path(where).read_text()
    # restarted, its output is that file: status says so, and revert appends there
    [srv] = servers(cli, install.pkg)
    assert srv["output"]["stdout"] == where
    r = cli.run("revert", install.pkg, "--timeout", "60").expect(0)
    [back] = standins.launcher_pids(port)
    assert _fd(back, 1)[0] == where and f"its log: {where} (its own output file, appended to as before)" in r.err, r
