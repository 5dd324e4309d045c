"""A sweep never stops a server it did not record or start, never starts a second model server, checks its flags
against the target's own sglang before anything starts, and does not launch what sglang would refuse; over the
real sshd, against stand-in servers (whose stub package carries a server_args.py in sglang 0.5.16's form).
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from safety import CLI, H, identity, make_install, up

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

SPEC = ("--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1")
LOAD = ["--requests", "2", "--concurrency", "1", "--input-len", "8", "--max-new-tokens", "8", "--warmup", "0",
        "--log-wait", "0", "--timeout", "60"]


def stop(pid: int) -> None:
    """SIGTERM a stand-in (as a user stopping their server would) and wait until it is gone."""
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while H.alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not H.alive(pid)


@pytest.fixture
def cli(ssh_cli) -> CLI:
    """conftest.py's ``ssh_cli``: the CLI over the real sshd, with a client cache of this test's own."""
    return ssh_cli


def test_a_misspelt_flag_is_refused_before_anything_starts(cli, standins, tmp_path):
    """--grid speculative-num-stepz: the target's sglang has no such flag (its server_args.py says which it has);
    exit 2 with the flag it probably meant, and the server is the same process as before."""
    install = make_install(standins, tmp_path / "i", "venv-by-path")
    port, proc = up(install, standins, tmp_path / "w", *SPEC)
    r = cli.run("sweep", install.pkg, "--grid", "speculative-num-stepz=1,2", *LOAD)
    assert r.rc == 2, r
    assert "has no --speculative-num-stepz" in r.err and "did you mean --speculative-num-steps?" in r.err, r
    assert standins.launcher_pids(port) == [proc.pid]
    # a flag the server does have, though not one eaglepatch's own list knows, is accepted
    r = cli.run("sweep", install.pkg, "--grid", "max-running-requests=8", *LOAD, "--json").expect(0)
    assert [p["status"] for p in r.json()["points"]] == ["ok"]


def test_points_sglang_would_refuse_are_not_launched(cli, standins, tmp_path):
    """With top-k 2 and 2 steps the draft tree has 2 + 1*2*2 = 6 candidates: 8 draft tokens cannot be proposed,
    so that point is recorded as failed without a launch while the valid one runs; a grid of nothing but such
    points is refused (exit 2) before anything starts."""
    install = make_install(standins, tmp_path / "i", "venv-by-path")
    port, proc = up(install, standins, tmp_path / "w", *SPEC)
    grid = ["--grid", "speculative-eagle-topk=2", "--grid", "speculative-num-steps=2",
            "--grid", "speculative-num-draft-tokens=4,8"]
    r = cli.run("sweep", install.pkg, *grid, *LOAD, "--json").expect(0)
    doc = r.json()
    ok, bad = doc["points"]
    assert ok["status"] == "ok" and bad["status"] == "failed", doc
    assert bad["error"].startswith("not launched:") and "at most 1 + 6 = 7 draft tokens" in bad["error"]
    assert r.err.count("starting sglang on") == 2  # the valid point, then the original back
    before = standins.launcher_pids(port)
    r = cli.run("sweep", install.pkg, "--grid", "speculative-eagle-topk=2", "--grid", "speculative-num-steps=2",
                "--grid", "speculative-num-draft-tokens=8,9", *LOAD)
    assert r.rc == 2 and "sglang would refuse every point of this grid" in r.err, r
    assert standins.launcher_pids(port) == before


def test_a_finished_sweep_run_again_starts_nothing_even_after_the_server_moved(cli, standins, tmp_path):
    """The sweep finished and put the server back; the user then restarted their server on another port. The same
    sweep again prints its table and starts nothing (before, it started the recorded server: two model servers)."""
    install = make_install(standins, tmp_path / "i", "venv-by-path")
    port, proc = up(install, standins, tmp_path / "w", *SPEC)
    args = ["--grid", "speculative-num-steps=1,2", *LOAD]
    first = cli.run("sweep", install.pkg, *args, "--json").expect(0).json()
    [back] = standins.launcher_pids(port)
    stop(back)
    moved, moved_proc = up(install, standins, tmp_path / "w2", *SPEC)
    r = cli.run("sweep", install.pkg, *args, "--json").expect(0)
    assert "this sweep is complete" in r.err and "starting sglang" not in r.err, r
    assert [p["tokens_per_s"] for p in r.json()["points"]] == [p["tokens_per_s"] for p in first["points"]]
    assert standins.launcher_pids(port) == [] and standins.launcher_pids(moved) == [moved_proc.pid]


ARGS = ["--grid", "speculative-num-steps=1,2", *LOAD]


def killed_after_first_run(cli, standins, tmp_path):
    """A sweep of a fresh server, killed after its first run (its point's server running), then that server
    stopped by the user: (install, port, the sweep's arguments)."""
    install = make_install(standins, tmp_path / "i", "venv-by-path")
    port, _proc = up(install, standins, tmp_path / "w", *SPEC)
    r = cli.run("sweep", install.pkg, *ARGS, env={"EAGLEPATCH_FAILPOINT": "sweep:after-run"})
    assert r.rc == -9, r
    [point_server] = standins.launcher_pids(port)
    stop(point_server)
    return install, port, ARGS


def test_a_resumed_sweep_does_not_start_a_second_server_beside_the_users(cli, standins, tmp_path):
    """A sweep killed after its first run; the user stops the point's server and starts theirs on another port.
    Resuming would launch the next point on the sweep's port beside it: the sweep refuses (exit 5), starts and
    stops nothing, and says how to sweep the server that runs now."""
    install, port, args = killed_after_first_run(cli, standins, tmp_path)
    other, other_proc = up(install, standins, tmp_path / "w2", *SPEC)
    mine = identity(other_proc.pid)
    r = cli.run("sweep", install.pkg, *args)
    assert r.rc == 5, r
    assert f"runs on :{other}" in r.err and "second model server" in r.err and "--fresh" in r.err, r
    assert standins.launcher_pids(port) == [] and standins.launcher_pids(other) == [other_proc.pid]
    assert identity(other_proc.pid) == mine
    # as told: a fresh sweep of the server that runs now
    r = cli.run("sweep", install.pkg, *args, "--fresh", "--server-port", str(other), "--json").expect(0)
    assert [p["status"] for p in r.json()["points"]] == ["ok", "ok"]
    [now] = standins.launcher_pids(other)
    assert identity(now)["argv"] == mine["argv"]


def test_a_sweep_does_not_stop_a_server_it_did_not_start(cli, standins, tmp_path):
    """A sweep killed after its first run; the user replaced the point's server on the same port with their own
    command line. The resumed sweep finds a server it did not record or start there: exit 5, that server keeps
    running untouched."""
    install, port, args = killed_after_first_run(cli, standins, tmp_path)
    _p, theirs = up(install, standins, tmp_path / "w3", *SPEC, "--max-running-requests", "4", port=port)
    r = cli.run("sweep", install.pkg, *args)
    assert r.rc == 5 and "is not the one this sweep recorded or started" in r.err, r
    assert standins.launcher_pids(port) == [theirs.pid]
    state = [json.loads(line) for line in next((tmp_path / "client cache").rglob("*.jsonl")).read_text().splitlines()]
    assert [s["kind"] for s in state][:3] == ["sweep", "launch", "run"]
