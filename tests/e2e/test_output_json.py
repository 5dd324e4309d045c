"""``apply --json``, ``revert --json`` and ``restart --json`` say where the restarted server writes its output (issue
42), named as ``status --json`` names a server's: per server restarted, ``output`` is ``{"stdout", "stderr",
"log"}``, the files its streams go to and, when eaglepatch chose the file (the server wrote to no file of its own),
that log. Started like ``nohup ... > server.log 2>&1``: both streams in server.log, ``log`` null; started with its
output to /dev/null: both in eaglepatch's log, which ``log`` names."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from safety import H, make_install, servers, up_nohup

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


def _one_server(doc: dict, port: int) -> dict:
    """The one server a change document says it restarted, checked against the running launcher."""
    assert doc["restarted"] is True, doc
    [srv] = doc["servers"]
    [pid] = H.launcher_pids(port)
    assert (srv["pid"], srv["port"]) == (pid, port), srv
    return srv


def test_apply_revert_and_restart_json_name_the_servers_own_output_file(standins, tmp_path, local_cli):
    """The server's own file kept: stdout and stderr are it, ``log`` null, and status afterwards agrees."""
    cli = local_cli  # conftest.py
    install = make_install(standins, tmp_path / "install", "venv-by-path")
    port = standins.port()
    log = tmp_path / "w" / "server.log"
    up_nohup(install, standins, tmp_path / "w", port, log)
    kept = {"stdout": str(log), "stderr": str(log), "log": None}
    doc = cli.run("apply", install.pkg, "--log-dir", str(tmp_path / "timing logs"), "--timeout", "60",
                  "--json").expect(0).json()
    assert _one_server(doc, port)["output"] == kept
    [srv] = servers(cli, install.pkg)
    assert {k: srv["output"][k] for k in ("stdout", "stderr")} == {"stdout": str(log), "stderr": str(log)}
    doc = cli.run("restart", install.pkg, "--timeout", "60", "--json").expect(0).json()
    assert doc["output"] == kept and [s["output"] for s in doc["servers"]] == [kept], doc
    doc = cli.run("revert", install.pkg, "--timeout", "60", "--json").expect(0).json()
    assert _one_server(doc, port)["output"] == kept


def test_apply_and_revert_json_name_the_log_eaglepatch_chose(standins, tmp_path, local_cli):
    """Output to /dev/null: the restarted server writes both streams to eaglepatch's log, and ``log`` names it (the
    file its stdout really points to); revert appends there, and says so the same way."""
    cli = local_cli  # conftest.py
    install = make_install(standins, tmp_path / "install", "venv-by-path")
    port = standins.port()
    up_nohup(install, standins, tmp_path / "w", port, Path("/dev/null"))
    doc = cli.run("apply", install.pkg, "--log-dir", str(tmp_path / "timing logs"), "--timeout", "60",
                  "--json").expect(0).json()
    out = _one_server(doc, port)["output"]
    [pid] = H.launcher_pids(port)
    where = os.readlink(f"/proc/{pid}/fd/1")
    assert where.endswith(f"/server-{port}.log") and where != "/dev/null", where
    assert out == {"stdout": where, "stderr": where, "log": where}, out
    # restarted, that log is the server's own output file: revert appends to it, eaglepatch chose nothing new
    doc = cli.run("revert", install.pkg, "--timeout", "60", "--json").expect(0).json()
    assert _one_server(doc, port)["output"] == {"stdout": where, "stderr": where, "log": None}


def test_no_restart_lists_no_server(standins, tmp_path, local_cli):
    """``--no-restart``: nothing restarted, ``servers`` empty (the key is always there)."""
    cli = local_cli  # conftest.py
    install = make_install(standins, tmp_path / "install", "venv-by-path")
    port = standins.port()
    up_nohup(install, standins, tmp_path / "w", port, Path("/dev/null"))
    doc = cli.run("apply", install.pkg, "--no-restart", "--json").expect(0).json()
    assert (doc["restarted"], doc["servers"]) == (False, [])
    cli.run("revert", install.pkg, "--no-restart").expect(0)
