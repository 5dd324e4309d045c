"""Ctrl-C (SIGINT), end to end: exit 130 (docs/contract.md), no traceback, and one line per target saying what
state it is in, checked against what ``status`` then finds. The interrupts come at exact steps (the failpoints'
``NAME:sigint`` form: a real SIGINT to eaglepatch, handled as any Ctrl-C) and once as a terminal sends it, to the
whole process group while apply waits for the restarted server.

Before issue 24: exit 1 ("internal error"), a raw KeyboardInterrupt traceback during start-up, and no word on the
state of the target.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from logdir import with_log_dir
from safety import CLI, EAGLEPATCH, H, cli_env, digest, make_install, servers, up

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def interrupted(r, target: str, state: str) -> None:
    """Exit 130, no traceback, and the last stderr line naming the target, its state, and what to run."""
    assert r.rc == 130, r
    assert "Traceback" not in r.err and "KeyboardInterrupt" not in r.err, r.err
    want = f"eaglepatch: interrupted: {target}: {state}: run `eaglepatch status {target}`"
    assert r.err.rstrip().splitlines()[-1] == want, r.err


def test_ctrl_c_during_start_up(tmp_path):
    """Ctrl-C while the command line's modules are being imported: one line, exit 130 (before: a traceback)."""
    tree = H.make_tree(tmp_path / "site", H.V1_WORKER)
    env = dict(cli_env(tmp_path), EAGLEPATCH_FAILPOINT="startup:imports:sigint")
    p = subprocess.run([*EAGLEPATCH, "status", str(tree / "sglang")], env=env, capture_output=True, text=True,
                       timeout=60, stdin=subprocess.DEVNULL)
    assert (p.returncode, p.stdout, p.stderr) == (130, "", "eaglepatch: interrupted: nothing was changed\n")


def test_ctrl_c_while_apply_holds_the_lock_releases_it(tmp_path):
    """Ctrl-C right after apply took the install's lock, before anything changed: exit 130, nothing changed, and
    the lock released (the interrupt comes inside the block that unlocks)."""
    tree = H.make_tree(tmp_path / "site", H.V1_WORKER)
    pkg = tree / "sglang"
    before = digest(tree)
    env = dict(cli_env(tmp_path), EAGLEPATCH_FAILPOINT="apply:after-lock:sigint")
    p = subprocess.run([*EAGLEPATCH, "apply", *with_log_dir("apply", ["--no-restart"]), str(pkg)], env=env,
                       capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert p.returncode == 130 and "Traceback" not in p.stderr, p.stderr
    assert not list(tree.rglob(".eaglepatch.lock")) and digest(tree) == before, p.stderr
    doc = CLI("local", cli_env(tmp_path)).run("status", pkg, "--json").expect(0).json()
    assert doc["lock"] is None and {f["state"] for f in doc["files"]} == {"pristine"}, doc


def test_ctrl_c_after_patching_before_the_restart(ssh_cli, standins, tmp_path):
    """Ctrl-C right after the files were patched, before the restart: "files patched, server not restarted"; status
    agrees (patched, the server stale, the lock released); revert puts every byte and the server back."""
    install = make_install(standins, tmp_path / "install", "venv-by-path")
    port, proc = up(install, standins, tmp_path / "work")
    before = digest(install.pkg)
    r = ssh_cli.run("apply", install.pkg, "--timeout", "60",
                    env={"EAGLEPATCH_FAILPOINT": "apply:after-execute:sigint"})
    target = ssh_cli.ssh[0]
    interrupted(r, target, "files patched, server not restarted (it runs the original code)")
    doc = ssh_cli.run("status", install.pkg, "--json").expect(0).json()
    assert {f["state"] for f in doc["files"]} == {"patched"} and doc["lock"] is None, doc
    assert [(s["pid"], s["code"]) for s in doc["servers"]] == [(proc.pid, "stale")]
    ssh_cli.run("revert", install.pkg, "--timeout", "60").expect(0)
    assert digest(install.pkg) == before


def test_ctrl_c_while_the_server_restarts(ssh_cli, standins, tmp_path):
    """Ctrl-C right after the host stopped the server and started it on the patched files: "files patched, server
    restarting"; the host finished the relaunch (the new server comes up on the patched code)."""
    install = make_install(standins, tmp_path / "install", "venv-by-path")
    port, proc = up(install, standins, tmp_path / "work")
    before = digest(install.pkg)
    r = ssh_cli.run("apply", install.pkg, "--timeout", "60",
                env={"EAGLEPATCH_FAILPOINT": "restart:after-relaunch:sigint"})
    interrupted(r, ssh_cli.ssh[0], "files patched, server restarting")
    the_host_finished_the_relaunch(ssh_cli, install, port, proc, before)


def the_host_finished_the_relaunch(ssh_cli: CLI, install, port: int, proc, before: dict[str, str]) -> None:
    """The relaunch the host was asked for went on without eaglepatch: the new server comes up on the patched
    files; then revert puts every byte and the original server back."""
    H.wait_http(port, timeout=60)
    [srv] = servers(ssh_cli, install.pkg)
    assert srv["pid"] != proc.pid and srv["code"] == "current"
    ssh_cli.run("revert", install.pkg, "--timeout", "120").expect(0)
    assert digest(install.pkg) == before


def test_ctrl_c_from_the_terminal_while_waiting_for_the_server(ssh_cli, standins, tmp_path):
    """A Ctrl-C as a terminal sends it (SIGINT to eaglepatch's whole process group) while apply waits for the
    restarted server to load: exit 130 and the state in one line; the server, started by the host in a session of
    its own, loads on; revert then puts everything back."""
    install = make_install(standins, tmp_path / "install", "venv-by-path")
    port, proc = up(install, standins, tmp_path / "work", "--startup-delay", "6")
    before = digest(install.pkg)
    argv = [*EAGLEPATCH, "apply", *ssh_cli.target(install.pkg), *with_log_dir("apply", ["--timeout", "120"])]
    p = subprocess.Popen(argv, env=dict(ssh_cli.env, EAGLEPATCH_PLAIN="1"), stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        err = []
        for line in p.stderr:  # type: ignore[union-attr]
            err.append(line)
            if line.startswith("started sglang"):
                os.killpg(p.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
                break
        rest_out, rest_err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
    assert any(x.startswith("started sglang") for x in err), "".join(err)
    r = type("R", (), {"rc": p.returncode, "err": "".join(err) + rest_err, "out": rest_out})()
    interrupted(r, ssh_cli.ssh[0], "files patched, server restarting")
    the_host_finished_the_relaunch(ssh_cli, install, port, proc, before)


def test_ctrl_c_with_several_targets_says_each(tmp_path):
    """Two local installs in one apply, Ctrl-C when the first of them is patched: one line per target (the other
    one patched, being patched or untouched: whatever it is, the line and status agree), exit 130, and revert of
    both puts every byte back."""
    trees = [H.make_tree(tmp_path / name, H.V1_WORKER) for name in ("a", "b")]
    pkgs = [str(t / "sglang") for t in trees]
    before = [digest(t) for t in trees]
    env = dict(cli_env(tmp_path), EAGLEPATCH_FAILPOINT="apply:after-execute:sigint")
    p = subprocess.run([*EAGLEPATCH, "apply", *with_log_dir("apply", ["--no-restart"]), *pkgs], env=env, capture_output=True, text=True,
                       timeout=120, stdin=subprocess.DEVNULL)
    assert p.returncode == 130 and "Traceback" not in p.stderr, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("eaglepatch: interrupted: ")]
    assert [ln.split(": ")[2] for ln in lines] == pkgs, p.stderr
    assert any("files patched, server not restarted" in ln for ln in lines), p.stderr
    local = CLI("local", cli_env(tmp_path))
    for pkg, line in zip(pkgs, lines):
        states = {f["state"] for f in local.run("status", Path(pkg), "--json").expect(0).json()["files"]}
        if "files patched" in line:
            assert states == {"patched"}, (line, states)
        elif "nothing was changed" in line:
            assert states == {"pristine"}, (line, states)
    for pkg in pkgs:
        local.run("revert", Path(pkg), "--no-restart").expect(0)
    assert [digest(t) for t in trees] == before
