"""The stand-in sglang server launched the ways people launch sglang on GPU hosts, and the test harness's ownership
of what it launches (tests/stubs/stand_in_sglang/standin_harness.py).

Each launch mode is checked from the outside, as eaglepatch sees a server: /proc/PID/cmdline, cwd, environ, exe,
and what the server's own interpreter imports as ``sglang`` when run with the server's environment and cwd. The
ownership tests check that a harness's cleanup kills what it started (a relaunched copy included) and nothing of
another harness's, even on the same port number: other checkouts run these tests on the same machine.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from safety import H  # the fixture standins: conftest.py

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

FIND_SGLANG = "import importlib.util; s = importlib.util.find_spec('sglang'); print(s and s.origin)"


def origin_with(python: str, ident: dict) -> str:
    """Where ``python``, run with the server's environment and cwd (a bare name is looked up on that PATH), finds
    ``sglang`` ("None": nowhere)."""
    r = subprocess.run([python, "-c", FIND_SGLANG], env=ident["env"], cwd=ident["cwd"], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def inside(path: str | None, root: Path) -> bool:
    return path is not None and Path(path).is_relative_to(root)


def children(pid: int) -> list[int]:
    return [p for p, (ppid, _pgid) in H._processes().items() if ppid == pid]


def wait_children(pid: int, n: int, timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while len(kids := children(pid)) < n:
        assert time.monotonic() < deadline, f"pid {pid} has {kids}, not {n} children"
        time.sleep(0.05)
    return kids


def wait_gone(pids, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while [p for p in pids if H.alive(p)]:
        assert time.monotonic() < deadline, f"still alive: {[p for p in pids if H.alive(p)]}"
        time.sleep(0.05)


def up(standins, proc: subprocess.Popen, port: int) -> dict:
    """Wait for the stand-in, check it is the launched process itself and listed as this harness's launcher, and
    return its identity."""
    H.wait_http(port, timeout=30)
    assert H.http_get(port, "/get_server_info")[1]["pid"] == proc.pid
    assert standins.launcher_pids(port) == [proc.pid]
    ident = H.proc_identity(proc.pid)
    assert ident["env"][H.OWNER_VAR] == standins.token
    assert ident["env"]["PYTHONDONTWRITEBYTECODE"] == "1" and "PYTHONHOME" not in ident["env"]
    return ident


# -- launch modes ------------------------------------------------------------------------------------------------


def test_a_checkout_on_pythonpath(standins, tmp_path):
    """``<python> -m sglang.launch_server`` with PYTHONPATH at the tree: the interpreter that runs it finds the
    stub through PYTHONPATH, which the server's environment carries."""
    tree = H.make_tree(tmp_path / "tree")
    cwd = tmp_path / "work"
    port = standins.port()
    proc = standins.launch(tree, cwd, port, "--tp", "1")
    ident = up(standins, proc, port)
    assert ident["argv"] == [sys.executable, "-m", "sglang.launch_server", "--port", str(port), "--tp", "1"]
    assert ident["cwd"] == str(cwd)
    assert ident["env"]["PYTHONPATH"] == str(tree)
    assert origin_with(ident["argv"][0], ident) == str(tree / "sglang" / "__init__.py")


def test_a_venv_by_path_without_activation(standins, tmp_path):
    """``<venv>/bin/python -m sglang.launch_server`` with no VIRTUAL_ENV, no PYTHONPATH, the venv's bin off PATH:
    the venv is found only because argv[0] is the venv's python (Python reads pyvenv.cfg beside the path it was
    started as). /proc/PID/exe resolves the symlink to the base interpreter, which with the same environment does
    not see the venv's site-packages."""
    venv = H.make_venv(tmp_path / "venv")
    site = H.site_packages(venv)
    cwd = tmp_path / "work"
    port = standins.port()
    proc = standins.launch_venv_by_path(venv, cwd, port, "--model-path", "m")
    ident = up(standins, proc, port)
    python = str(venv / "bin" / "python")
    assert ident["argv"] == [python, "-m", "sglang.launch_server", "--port", str(port), "--model-path", "m"]
    assert ident["cwd"] == str(cwd)
    env = ident["env"]
    assert "VIRTUAL_ENV" not in env and "PYTHONPATH" not in env
    assert str(venv / "bin") not in env["PATH"].split(os.pathsep)
    assert (venv / "bin" / "python").is_symlink()
    assert not inside(ident["exe"], venv) and Path(ident["exe"]) == (venv / "bin" / "python").resolve()
    assert not (Path(ident["exe"]).parent.parent / "pyvenv.cfg").exists()  # a real interpreter, not another venv
    assert origin_with(ident["argv"][0], ident) == str(site / "sglang" / "__init__.py")
    assert not inside(origin_with(ident["exe"], ident), venv)
    # the installed version, as a product reads it from the venv's metadata
    r = subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('sglang'))"],
                       capture_output=True, text=True, env=env, timeout=30)
    assert r.stdout.strip() == "0.0.0-standin", r.stderr


def test_an_activated_venv(standins, tmp_path):
    """After ``source venv/bin/activate``, ``python -m sglang.launch_server``: argv[0] is the bare word
    ``python``; only PATH (starting with the venv's bin) says which python that is, and VIRTUAL_ENV is set."""
    venv = H.make_venv(tmp_path / "venv")
    cwd = tmp_path / "work"
    port = standins.port()
    proc = standins.launch_activated_venv(venv, cwd, port)
    ident = up(standins, proc, port)
    assert ident["argv"] == ["python", "-m", "sglang.launch_server", "--port", str(port)]
    assert ident["cwd"] == str(cwd)
    env = ident["env"]
    assert env["VIRTUAL_ENV"] == str(venv) and "PYTHONPATH" not in env
    assert env["PATH"].split(os.pathsep)[0] == str(venv / "bin")
    assert not inside(ident["exe"], venv)
    assert origin_with("python", ident) == str(H.site_packages(venv) / "sglang" / "__init__.py")


@pytest.mark.parametrize("name", ["venv", "venv dir"])
def test_the_console_script(standins, tmp_path, name):
    """``<venv>/bin/sglang serve --port N``: pip's console script starts with ``#!<venv>/bin/python`` (or, for a
    path with a space, a /bin/sh trampoline that execs that python with the script), so the kernel (or sh) runs
    the venv's python with the script's path as its first argument: that is what /proc/PID/cmdline shows, in the
    same process (the server runs in the script's process, as ``sglang serve`` does)."""
    venv = H.make_venv(tmp_path / name)
    script = venv / "bin" / "sglang"
    first = script.read_text().splitlines()[0]
    assert first == (f"#!{venv}/bin/python" if " " not in name else "#!/bin/sh")
    cwd = tmp_path / "work"
    port = standins.port()
    proc = standins.launch_console_script(venv, cwd, port, "--tp", "2")
    ident = up(standins, proc, port)
    python = str(venv / "bin" / "python")
    assert ident["argv"] == [python, str(script), "serve", "--port", str(port), "--tp", "2"]
    assert ident["cwd"] == str(cwd)
    assert "VIRTUAL_ENV" not in ident["env"] and "PYTHONPATH" not in ident["env"]
    assert H.http_get(port, "/get_server_info")[1]["tp_size"] == 2  # the flags reached the server
    assert len(wait_children(proc.pid, 2)) == 2
    assert origin_with(python, ident) == str(H.site_packages(venv) / "sglang" / "__init__.py")


def test_an_editable_install_of_a_checkout(standins, tmp_path):
    """``pip install -e python/`` into a venv, then ``<venv>/bin/python -m sglang.launch_server``: the checkout is
    on no path (not sys.path, not PYTHONPATH) but the venv's editable finder maps ``sglang`` to it, so the
    server's own python imports the checkout, and the base interpreter (/proc/PID/exe) does not."""
    venv, checkout = H.make_editable(tmp_path / "install")
    pkg = checkout / "python" / "sglang"
    cwd = tmp_path / "work"
    port = standins.port()
    proc = standins.launch_editable(venv, cwd, port)
    ident = up(standins, proc, port)
    python = str(venv / "bin" / "python")
    assert ident["argv"] == [python, "-m", "sglang.launch_server", "--port", str(port)]
    assert ident["cwd"] == str(cwd)
    assert "VIRTUAL_ENV" not in ident["env"] and "PYTHONPATH" not in ident["env"]
    r = subprocess.run([python, "-c", "import sys; print('\\n'.join(sys.path))"], env=ident["env"],
                       cwd=ident["cwd"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stdout.strip(), r.stderr
    assert not any(inside(p, checkout) for p in r.stdout.splitlines()), r.stdout
    assert origin_with(python, ident) == str(pkg / "__init__.py")
    assert not inside(origin_with(ident["exe"], ident), checkout)
    site = H.site_packages(venv)
    assert (site / "__editable__.sglang-0.0.0.pth").is_file()
    assert '"editable": true' in (site / "sglang-0.0.0.dist-info" / "direct_url.json").read_text()
    assert not (site / "sglang").exists()


def test_the_worker_of_a_venv_is_the_one_the_server_imports(standins, tmp_path):
    """``worker_source`` goes to the venv's ``srt/speculative/eagle_worker.py``, which the stand-in imports at
    start: a broken one makes it exit 1 with the traceback, and ``set_worker`` on the site-packages fixes it."""
    venv = H.make_venv(tmp_path / "venv", worker_source=H.BROKEN_WORKER)
    cwd = tmp_path / "work"
    port = standins.port()
    proc = standins.launch_venv_by_path(venv, cwd, port)
    assert proc.wait(30) == 1
    assert "RuntimeError: broken patch" in (cwd / f"stand-in-{port}.log").read_text()
    H.set_worker(H.site_packages(venv), H.TRIVIAL_WORKER)
    proc = standins.launch_venv_by_path(venv, cwd, port)
    up(standins, proc, port)


# -- ownership ---------------------------------------------------------------------------------------------------


def test_another_harness_server_on_the_same_port_number_survives_cleanup(tmp_path):
    """A second harness (another checkout's test, another token) reuses a port number after the first harness's
    server on it exited, and has a server on another port: the first harness's cleanup leaves both alone, with
    their children, because neither carries its token; the second's cleanup kills them."""
    first, second = H.StandIns(), H.StandIns()
    assert first.token != second.token
    try:
        tree = H.make_tree(tmp_path / "tree")
        port = first.port()
        mine = first.launch(tree, tmp_path / "first", port)
        H.wait_http(port)
        mine.terminate()
        assert mine.wait(10) == 0

        theirs = second.launch(tree, tmp_path / "second", port, "--tp", "2")
        other = second.port()
        theirs2 = second.launch(tree, tmp_path / "second", other)
        H.wait_http(port)
        H.wait_http(other)
        kids = wait_children(theirs.pid, 2)
        assert first.launcher_pids(port) == [] and second.launcher_pids(port) == [theirs.pid]
        assert theirs.pid in H.launcher_pids(port)  # by port number alone it would be the first's target
        assert port in first.ports

        first.cleanup()
        time.sleep(0.3)
        assert all(H.alive(p) for p in (theirs.pid, theirs2.pid, *kids))
        assert H.http_get(port, "/health_generate")[0] == 200 and H.http_get(other, "/health_generate")[0] == 200

        second.cleanup()
        wait_gone([theirs.pid, theirs2.pid, *kids])
    finally:
        first.cleanup()
        second.cleanup()


def test_cleanup_kills_a_relaunched_copy_found_by_its_token(standins, tmp_path):
    """eaglepatch relaunches a server with the argv, cwd and environment read from /proc, in a new session, as a
    process the harness did not start: the token in that environment makes it (and its children) the harness's,
    and cleanup kills them."""
    tree = H.make_tree(tmp_path / "tree")
    port = standins.port()
    proc = standins.launch(tree, tmp_path / "work", port, "--tp", "2")
    H.wait_http(port)
    ident = H.proc_identity(proc.pid)
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(10) == 0

    again = subprocess.Popen(ident["argv"], cwd=ident["cwd"], env=ident["env"], stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    threading.Thread(target=again.wait, daemon=True).start()
    try:
        H.wait_http(port)
        kids = wait_children(again.pid, 2)
        assert standins.launcher_pids(port) == [again.pid]
        assert H.proc_identity(again.pid)["env"] == ident["env"]
        standins.cleanup()
        wait_gone([again.pid, *kids])
    finally:
        if again.poll() is None:
            again.kill()


def test_a_launcher_without_a_token_is_killed_only_when_it_runs_in_the_harness_folders(standins, tmp_path):
    """A restart command run from the test process starts a server without any token: cleanup kills it when it
    is on a port the harness handed out AND runs in a folder the harness launched in (a private temporary one);
    one on the same kind of port in a folder of its own (another checkout running an older harness) survives."""
    tree = H.make_tree(tmp_path / "tree")
    work = tmp_path / "work"
    port = standins.port()
    first = standins.launch(tree, work, port)
    H.wait_http(port)
    first.terminate()
    first.wait(10)

    env = {k: v for k, v in os.environ.items() if k != H.OWNER_VAR}
    env["PYTHONPATH"] = str(tree)
    argv = [sys.executable, "-m", "sglang.launch_server", "--port"]
    foreign_dir = tmp_path / "elsewhere"
    foreign_dir.mkdir()
    other_port = standins.port()
    ours = subprocess.Popen([*argv, str(port)], cwd=work, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    foreign = subprocess.Popen([*argv, str(other_port)], cwd=foreign_dir,
                               env={**env, "PYTHONPATH": str(H.make_tree(tmp_path / "other tree"))},
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    for p in (ours, foreign):
        threading.Thread(target=p.wait, daemon=True).start()
    try:
        H.wait_http(port)
        H.wait_http(other_port)
        assert standins.launcher_pids(port) == []  # no token: not "owned" in that sense
        standins.cleanup()
        wait_gone([ours.pid])
        assert H.alive(foreign.pid)
    finally:
        for p in (ours, foreign):
            if p.poll() is None:
                p.kill()
