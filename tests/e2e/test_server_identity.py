"""The right server, found however it was launched, restarted as it was, and no other touched (issue: safe on a
real GPU host).

Stand-in sglang servers (tests/stubs/stand_in_sglang) launched the ways people launch sglang on GPU hosts: a
checkout on PYTHONPATH, a venv's interpreter by path without activating it (what systemd units and container
entrypoints do: /proc/PID/exe is then the base interpreter, which does not see the venv), an activated venv, the
``sglang serve`` console script, an editable install (a finder in a .pth: the checkout is not on sys.path). Each is
checked by pid, argv[0], argv, cwd and environment before and after, through the installed CLI, locally and over
the real sshd of conftest.py. Every server here carries this test's owner token, and the product only ever acts
on servers of the install it is pointed at, so nothing another checkout runs on this machine is touched.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from safety import (CLI, PY, REJECTS_PATCH, WORKER, H, cli_env, cli_for_user, digest, identity, make_install,
                    servers, up)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

KINDS = ["pythonpath", "venv-by-path", "activated-venv", "console-script", "editable"]
DESCRIBED = {  # what status says of each way
    "pythonpath": "sglang from PYTHONPATH",
    "venv-by-path": "not activated",
    "activated-venv": "activated",
    "console-script": "console script",
    "editable": "editable install",
}


def _cli(request, via: str) -> CLI:
    """conftest.py's ``local_cli`` or ``ssh_cli``."""
    return request.getfixturevalue(f"{via}_cli")


@pytest.fixture
def cli(ssh_cli) -> CLI:
    """Over the real sshd (a local target runs the same code minus SSH: the launch ways are checked on both)."""
    return ssh_cli


@pytest.mark.parametrize("via,kind", [("ssh", k) for k in KINDS] + [("local", "venv-by-path"), ("local", "editable")])
def test_each_way_of_launching_is_found_and_restarted_exactly_as_it_was(request, standins, tmp_path, via, kind):
    """status lists the server (pid, port, how it was launched); apply and revert each start a new process with
    the same argv (argv[0] included), cwd and environment, so the server keeps its venv; revert puts every byte
    back."""
    cli = _cli(request, via)
    install = make_install(standins, tmp_path / "install", kind)
    port, proc = up(install, standins, tmp_path / "work dir")
    before = digest(install.pkg)
    first = identity(proc.pid)

    [srv] = servers(cli, install.pkg)
    assert (srv["pid"], srv["port"], srv["code"]) == (proc.pid, port, "current")
    assert srv["argv"] == first["argv"] and srv["cwd"] == first["cwd"]
    assert DESCRIBED[kind] in srv["launched"], srv["launched"]

    r = cli.run("apply", install.pkg, "--timeout", "60").expect(0)
    [patched] = servers(cli, install.pkg)
    assert patched["pid"] != proc.pid and not H.alive(proc.pid)
    assert identity(patched["pid"]) == first, "the relaunched server differs from the original"
    assert patched["code"] == "current"
    assert "[eaglepatch]" in install.worker.read_text()
    assert H.http_get(port, "/health_generate")[0] == 200, r

    cli.run("revert", install.pkg, "--timeout", "60").expect(0)
    [back] = servers(cli, install.pkg)
    assert back["pid"] not in (proc.pid, patched["pid"])
    assert identity(back["pid"]) == first
    assert digest(install.pkg) == before


def test_two_servers_of_one_install_are_both_restarted_and_server_port_narrows(cli, standins, tmp_path):
    """Two ports, one install: status lists both; apply restarts both (one after the other); revert
    --server-port restarts only that one and says the other still runs the patched code, which status shows as
    stale until it is restarted."""
    install = make_install(standins, tmp_path / "install", "venv-by-path")
    pa, a = up(install, standins, tmp_path / "a")
    pb, b = up(install, standins, tmp_path / "b")
    listed = {s["port"]: s["pid"] for s in servers(cli, install.pkg)}
    assert listed == {pa: a.pid, pb: b.pid}

    cli.run("apply", install.pkg, "--timeout", "60").expect(0)
    after = {s["port"]: s for s in servers(cli, install.pkg)}
    assert set(after) == {pa, pb} and after[pa]["pid"] != a.pid and after[pb]["pid"] != b.pid
    assert {s["code"] for s in after.values()} == {"current"}

    r = cli.run("revert", install.pkg, "--timeout", "60", "--server-port", str(pa)).expect(0)
    assert f"the server on :{pb} (pid {after[pb]['pid']}) was not restarted (--server-port)" in r.err, r
    now = {s["port"]: s for s in servers(cli, install.pkg)}
    assert now[pa]["pid"] != after[pa]["pid"] and now[pa]["code"] == "current"
    assert now[pb]["pid"] == after[pb]["pid"] and now[pb]["code"] == "stale"
    text = cli.run("status", install.pkg).expect(0).out
    assert "STARTED BEFORE THE FILES LAST CHANGED" in text, text

    cli.run("restart", install.pkg, "--timeout", "60", "--server-port", str(pb)).expect(0)
    assert {s["code"] for s in servers(cli, install.pkg)} == {"current"}
    r = cli.run("restart", install.pkg, "--server-port", "1").expect(2)
    assert "no server of this sglang install listens there" in r.err


def test_only_the_install_servers_are_stopped_or_started(cli, standins, tmp_path):
    """Another install's server on the same host is listed as another's and never touched: not by restart, not
    by apply or revert of this install; restart of an install whose server does not run starts nothing."""
    mine = make_install(standins, tmp_path / "mine", "venv-by-path")
    other = make_install(standins, tmp_path / "other", "pythonpath")
    po, other_proc = up(other, standins, tmp_path / "other work")

    doc = cli.run("status", mine.pkg, "--json").expect(0).json()
    assert doc["servers"] == [] and any(s["pid"] == other_proc.pid for s in doc["other_servers"])
    r = cli.run("restart", mine.pkg, "--timeout", "30")
    assert r.rc == 7 and "no sglang server is running" in r.err, r
    pm, mine_proc = up(mine, standins, tmp_path / "mine work")
    cli.run("restart", mine.pkg, "--timeout", "60").expect(0)
    cli.run("apply", mine.pkg, "--timeout", "60").expect(0)
    cli.run("revert", mine.pkg, "--timeout", "60").expect(0)
    assert not H.alive(mine_proc.pid)
    assert H.alive(other_proc.pid) and standins.launcher_pids(po) == [other_proc.pid]
    assert "[eaglepatch]" not in other.worker.read_text()


def test_without_a_named_install_several_serving_installs_are_a_usage_error(sshd, standins, tmp_path):
    """Over SSH without --sglang-path or --python, eaglepatch would have to guess which install is meant when
    servers of several run: it names them and stops (exit 2), changing nothing."""
    a = make_install(standins, tmp_path / "a", "venv-by-path")
    b = make_install(standins, tmp_path / "b", "pythonpath")
    up(a, standins, tmp_path / "wa")
    up(b, standins, tmp_path / "wb")
    r = subprocess.run([PY, "-m", "eaglepatch", "apply", sshd.target, "-i", sshd.client_key], capture_output=True,
                       text=True, env=cli_env(tmp_path, sshd.env()), timeout=120)
    assert r.returncode == 2, r
    assert "servers of several sglang installs run here" in r.stderr and str(a.pkg.resolve()) in r.stderr
    assert "[eaglepatch]" not in a.worker.read_text() and "[eaglepatch]" not in b.worker.read_text()


def test_a_too_short_timeout_rolls_back_without_losing_the_original_server(cli, standins, tmp_path):
    """apply --timeout 2 on a server that needs 6 s to start: the patched server is not ready in time, so apply
    rolls back; the rollback waits for the original with its own (long) timeout instead of stopping it, and the
    host ends with the original files and the original server, exit 7."""
    install = make_install(standins, tmp_path / "install", "venv-by-path")
    port = standins.port()
    proc = install.launch(tmp_path / "work", port, "--startup-delay", "6", "--tp", "1")
    H.wait_http(port, timeout=30)
    first, before = identity(proc.pid), digest(install.pkg)
    t0 = time.monotonic()
    r = cli.run("apply", install.pkg, "--timeout", "2")
    assert r.rc == 7, r
    assert "original files restored" in r.err and "the original server is up again" in r.err, r
    assert time.monotonic() - t0 > 6  # it waited for the original to load, past the 2 s
    assert digest(install.pkg) == before
    [srv] = servers(cli, install.pkg)
    assert identity(srv["pid"]) == first and srv["code"] == "current"
    assert H.http_get(port, "/health_generate")[0] == 200


def test_an_original_that_cannot_come_back_is_named_with_how_to_start_it(cli, standins, tmp_path):
    """The patched server crashes, and the original cannot start again either (here: it exits at start once a
    file exists): apply exits 7 and names a script on the host that starts it by hand exactly as it was (its
    folder, whole environment, command line); run once the block is gone, that script brings back the original
    server, the same process description as before."""
    install = make_install(standins, tmp_path / "install", "venv-by-path", worker=WORKER + REJECTS_PATCH)
    block = tmp_path / "cannot start again"
    port, proc = up(install, standins, tmp_path / "work dir", "--fail-if-exists", str(block))
    first = identity(proc.pid)
    block.write_text("")
    r = cli.run("apply", install.pkg, "--timeout", "30")
    assert r.rc == 7, r
    line = r.err.strip().splitlines()[-1]
    assert "original files restored" in line and "did NOT come back up" in line, r
    script = line.rsplit("start it yourself with: sh ", 1)[1].strip()
    text = Path(script).read_text()
    assert f"cd '{tmp_path / 'work dir'}'" in text and str(block) in text and "EAGLEPATCH_TEST_OWNER=" in text
    assert standins.launcher_pids(port) == []
    block.unlink()
    subprocess.Popen(["sh", script], start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL)
    H.wait_http(port, timeout=30)
    [pid] = standins.launcher_pids(port)
    assert identity(pid) == first


def test_a_restart_that_cannot_start_stops_nothing(cli, standins, tmp_path):
    """The server's folder was deleted since it started (a deploy replaced it): starting it again would fail, so
    eaglepatch finds that out before stopping it: apply rolls back its files and the original server runs on,
    never stopped (same pid)."""
    install = make_install(standins, tmp_path / "install", "venv-by-path")
    work = tmp_path / "release-1"
    port, proc = up(install, standins, work)
    before = digest(install.pkg)
    shutil.rmtree(work)
    r = cli.run("apply", install.pkg, "--timeout", "30")
    assert r.rc == 7, r
    assert "does not exist" in r.err and "never stopped" in r.err, r
    assert standins.launcher_pids(port) == [proc.pid] and digest(install.pkg) == before


def test_a_server_started_under_nohup_keeps_ignoring_sighup(cli, standins, tmp_path):
    """nohup makes a server ignore SIGHUP; restarted, it must still (and still take SIGINT): the signal
    dispositions are part of how it was launched. eaglepatch itself ignores SIGINT/SIGHUP/SIGTERM while it
    relaunches; none of that leaks into the server."""
    install = make_install(standins, tmp_path / "install", "venv-by-path")
    venv = install.pkg.parents[3]
    port = standins.port()
    argv = ["nohup", str(venv / "bin" / "python"), "-m", "sglang.launch_server", "--port", str(port), "--tp", "1"]
    proc = standins.spawn(argv, tmp_path / "w", standins.venv_env(venv), port=port)
    H.wait_http(port, timeout=30)
    first = identity(proc.pid)
    assert int(first["sig_ign"], 16) & (1 << 0)  # SIGHUP (1) ignored
    cli.run("apply", install.pkg, "--timeout", "60").expect(0)
    [pid] = standins.launcher_pids(port)
    assert pid != proc.pid and identity(pid) == first
    cli.run("revert", install.pkg, "--timeout", "60").expect(0)
    [pid] = standins.launcher_pids(port)
    assert identity(pid) == first


def _tree_nobody_can_read(prefix: str) -> tuple[Path, Path]:
    """A fresh /tmp folder holding a worker tree, every folder 755 and file 644 (nobody may read it, only root
    write it): (the folder, the tree). The caller removes the folder."""
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    root.chmod(0o755)
    tree = H.make_tree(root / "site", WORKER)
    for p in [root, *root.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return root, tree


def test_another_users_server_is_listed_but_not_restarted(cli, standins, tmp_path):
    """A server of the install run by another user (nobody) while eaglepatch runs as root: its interpreter is
    asked where sglang comes from as that user (never as root), it is listed, and restarting it is refused: run
    as root it would not be the same server. Exit 2, nothing changed."""
    assert os.geteuid() == 0, "this test runs a server as nobody: run it as root (CI does)"
    root, tree = _tree_nobody_can_read("eaglepatch-other-user-")
    try:
        port = standins.port()
        drop = [shutil.which("setpriv"), "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
        # the system's interpreter: nobody may not reach the one of this venv (under /root)
        argv = ["/usr/bin/python3", "-m", "sglang.launch_server", "--port", str(port), "--tp", "1"]
        proc = standins.spawn([*drop, *argv], root, standins.env(tree, HOME=str(root)), port=port)
        H.wait_http(port, timeout=30)
        pkg = tree / "sglang"
        [srv] = servers(cli, pkg)
        assert srv["pid"] == proc.pid
        before = digest(tree)
        r = cli.run("apply", pkg, "--timeout", "30")
        assert r.rc == 2 and "runs as another user" in r.err, r
        assert digest(tree) == before and standins.launcher_pids(port) == [proc.pid]
    finally:
        standins.cleanup()
        shutil.rmtree(root, ignore_errors=True)


def test_a_server_loading_on_the_port_blocks_a_second_start(cli, standins, tmp_path):
    """Another install's server is loading on the port (its launcher runs; it has not bound the port yet):
    restarting this install's server there would put two servers on one port and its GPUs, so nothing is
    stopped or started, and the message names the other launcher."""
    mine = make_install(standins, tmp_path / "mine", "venv-by-path")
    port, proc = up(mine, standins, tmp_path / "w")
    other = make_install(standins, tmp_path / "other", "pythonpath")
    # a launcher for the same port that has not bound it yet (a model still loading before the HTTP server)
    (other.pkg / "launch_server.py").write_text("import time\ntime.sleep(120)\n")
    loading = other.launch(tmp_path / "ow", port)
    for _ in range(100):
        if loading.pid in H.launcher_pids(port):
            break
        time.sleep(0.05)
    r = cli.run("restart", mine.pkg, "--timeout", "30")
    assert r.rc == 7 and f"pid {loading.pid}" in r.err and "starting or running on" in r.err, r
    assert proc.poll() is None and H.alive(proc.pid)


def test_permission_problems_are_one_line_and_change_nothing(sshd, tmp_path):
    """An install owned by root, eaglepatch run as nobody (locally with setpriv, over SSH through a ForceCommand
    that drops to nobody): apply exits 2 with one line naming the owner and what to do; revert of an unpatched
    install says there is nothing to revert (no write access needed); nothing changes."""
    from sshd_server import start_sshd, stop_sshd

    setpriv = shutil.which("setpriv")
    assert setpriv, "setpriv (util-linux) is missing"
    assert os.geteuid() == 0, "this test drops from root to nobody: run it as root (CI does)"
    root, tree = _tree_nobody_can_read("eaglepatch-perm-")
    try:
        pkg, before = tree / "sglang", digest(tree)
        home = root / "nobody home"
        home.mkdir()
        os.chown(home, 65534, 65534)
        drop = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
        # what nobody runs is copied where nobody may read it: the checkout may sit anywhere (under /root, in a
        # 0700 mktemp -d), and the CLI must not depend on it
        as_nobody = cli_for_user(root / "cli", 65534, 65534)
        local = CLI("local", dict(cli_env(tmp_path), HOME=str(home), XDG_CACHE_HOME=str(home / "cache")))
        r = local.run("apply", pkg, "--no-restart", prefix=drop, cli=as_nobody)
        assert r.rc == 2 and len(r.err.strip().splitlines()) == 1, r
        assert "user nobody cannot write" in r.err and "run eaglepatch as root" in r.err, r
        r = local.run("revert", pkg, "--no-restart", prefix=drop, cli=as_nobody).expect(0)
        assert "nothing to revert" in r.err

        proc, srv = start_sshd(sshd, 'ForceCommand exec setpriv --reuid=65534 --regid=65534 --clear-groups '
                                 '/bin/sh -c "$SSH_ORIGINAL_COMMAND"', tmp_path)
        try:
            ssh = CLI("ssh", cli_env(tmp_path, srv.env()), ssh=[srv.target, "-i", srv.client_key])
            r = ssh.run("apply", pkg, "--no-restart")
            assert r.rc == 2 and len(r.err.strip().splitlines()) == 1, r
            assert "user nobody cannot write" in r.err, r
            ssh.run("revert", pkg, "--no-restart").expect(0)
        finally:
            stop_sshd(proc)
        assert digest(tree) == before
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_port_that_is_not_ssh_is_one_line_without_traceback(tmp_path):
    """A listener that answers something other than SSH: exit 3, one line on stderr, no paramiko traceback."""
    import socket
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(5)
    port = srv.getsockname()[1]

    def answer() -> None:
        for _ in range(3):
            try:
                conn, _addr = srv.accept()
            except OSError:
                return
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
            conn.close()

    threading.Thread(target=answer, daemon=True).start()
    try:
        r = subprocess.run([PY, "-m", "eaglepatch", "status", f"root@127.0.0.1:{port}", "--connect-timeout", "5"],
                           capture_output=True, text=True, env=cli_env(tmp_path), timeout=60)
    finally:
        srv.close()
    assert r.returncode == 3, r
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr and "Exception" not in r.stderr, r.stderr


def test_show_lists_every_server_with_how_it_was_launched(cli, standins, tmp_path):
    """The text of show and status: one line per server with its pid and port, how it was launched, and that
    another install's server is left alone."""
    install = make_install(standins, tmp_path / "install", "activated-venv")
    other = make_install(standins, tmp_path / "other", "pythonpath")
    p1, s1 = up(install, standins, tmp_path / "w1")
    p2, s2 = up(install, standins, tmp_path / "w2")
    po, so = up(other, standins, tmp_path / "wo")
    text = cli.run("show", install.pkg).expect(0).out
    assert f"server: pid {s1.pid} on :{p1}" in text and f"server: pid {s2.pid} on :{p2}" in text, text
    assert "(venv " in text and "activated)" in text
    assert f"other server: pid {so.pid} on :{po} runs another install" in text
    doc = json.loads(cli.run("show", install.pkg, "--json").expect(0).out)
    assert doc["server"]["pid"] == doc["servers"][0]["pid"]  # the contract's single server: the first
