"""``apply`` and ``revert`` with their restart, end to end through the installed CLI, on a stand-in sglang server.

The stand-in (tests/stubs/stand_in_sglang) is a real process tree started as a user would (``python -m
sglang.launch_server --port N``, its own session, TP-like children), whose start imports the worker module of the
tree it runs from: a patched worker that fails to import makes it crash at start, as a real server would.
The worker here has the shape of sglang's V1 EAGLEWorker, so the built-in recipe instruments it.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from logdir import with_log_dir
from safety import H  # the fixture standins: conftest.py

pytestmark = pytest.mark.e2e

WORKER = H.V1_WORKER
# Appended to make a worker that imports fine as shipped but not once eaglepatch has patched it.
REJECTS_PATCH = '''

if "_eaglepatch" in globals():
    raise RuntimeError("this server cannot run the patched worker")
'''


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): sha(p) for p in sorted(root.rglob("*")) if p.is_file()}


def eaglepatch(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eaglepatch", args[0], *with_log_dir(args[0], args[1:])],
                          capture_output=True, text=True, timeout=timeout)


def start(standins, tmp_path: Path, worker: str, *args: str):
    tree = H.make_tree(tmp_path / "site dir", WORKER if worker is None else worker)
    port = standins.port()
    cwd = tmp_path / "work dir"
    proc = standins.launch(tree, cwd, port, "--startup-delay", "1", "--tp", "2", *args)
    H.wait_http(port, timeout=30)
    return tree, port, proc


def server_of(tree: Path) -> dict:
    r = eaglepatch("status", "--json", str(tree / "sglang"))
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["server"]


def test_apply_restarts_the_server_and_revert_brings_back_every_byte(standins, tmp_path):
    """apply finds the running server, stops its process tree, starts the same command line again and waits until
    it answers; revert does the same with the original bytes back."""
    tree, port, proc = start(standins, tmp_path, WORKER)
    before = tree_digest(tree)
    old = server_of(tree)
    assert old["pid"] == proc.pid

    r = eaglepatch("apply", "--json", "--timeout", "60", str(tree / "sglang"))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["changed"] is True and doc["restarted"] is True
    new = server_of(tree)
    assert new["pid"] != old["pid"] and new["argv"] == old["argv"]
    assert not H.alive(old["pid"])
    assert H.http_get(port, "/health_generate")[0] == 200
    assert "[eaglepatch]" in H.worker_file(tree).read_text()

    r = eaglepatch("revert", "--json", "--timeout", "60", str(tree / "sglang"))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["restarted"] is True
    assert tree_digest(tree) == before
    assert H.http_get(port, "/health_generate")[0] == 200
    assert server_of(tree)["pid"] not in (old["pid"], new["pid"])


def test_a_patched_server_that_does_not_come_up_is_rolled_back(standins, tmp_path):
    """The patched worker makes the server crash at start: apply puts the original file back, starts the original
    server again, waits for it, and exits 7 saying the original server is up."""
    tree, port, proc = start(standins, tmp_path, WORKER + REJECTS_PATCH)
    before = tree_digest(tree)

    r = eaglepatch("apply", "--timeout", "60", str(tree / "sglang"))
    assert r.returncode == 7, r.stderr
    assert "original files restored" in r.stderr and "original server is up again" in r.stderr
    assert "this server cannot run the patched worker" in r.stderr  # the server log's tail is shown
    assert tree_digest(tree) == before
    assert H.http_get(port, "/health_generate")[0] == 200
    assert server_of(tree)["pid"] != proc.pid


def test_no_server_running_patches_and_says_nothing_was_restarted(tmp_path):
    """Without a server, apply patches, exits 0 and says how the patch takes effect."""
    tree = H.make_tree(tmp_path / "site", WORKER)
    r = eaglepatch("apply", "--json", str(tree / "sglang"))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["restarted"] is False
    assert "nothing was restarted" in r.stderr
    r = eaglepatch("revert", str(tree / "sglang"))
    assert r.returncode == 0, r.stderr


def test_an_unrelated_server_is_neither_reported_nor_restarted(standins, tmp_path):
    """A server running another sglang install on the same host is not the target's: status does not report it
    and apply does not touch it."""
    other_tree, port, proc = start(standins, tmp_path / "other", WORKER)
    tree = H.make_tree(tmp_path / "mine", WORKER)
    assert server_of(tree) is None
    r = eaglepatch("apply", "--json", "--timeout", "30", str(tree / "sglang"))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["restarted"] is False
    assert H.alive(proc.pid)
    assert "[eaglepatch]" not in H.worker_file(other_tree).read_text()


def test_with_several_installs_serving_each_target_sees_only_its_own_server(standins, tmp_path):
    """Three servers of three installs on one host (their interpreters are asked for sys.path all at once): each
    install's status reports its own server and no other."""
    started = [start(standins, tmp_path / f"install{i}", WORKER) for i in range(3)]
    for tree, _port, proc in started:
        srv = server_of(tree)
        assert srv is not None and srv["pid"] == proc.pid, (tree, srv)
