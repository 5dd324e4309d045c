"""Hosts whose login shell is not bash, or prints on stdout before the command runs.

A second sshd of the session's set-up (its keys, its host tree) runs every command through a ``ForceCommand``:
tcsh (which refuses a newline inside quotes: the agent's command line must be one line), plain sh, and a shell that
prints a banner on stdout first (what a chatty ~/.bashrc does), which eaglepatch must skip, not parse. Each runs
the whole cycle: status, apply, status, revert, with the worker files' bytes checked.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import cli_helpers as h
from sshd_server import start_sshd, stop_sshd

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

TCSH = shutil.which("tcsh") or "/usr/bin/tcsh"


@pytest.mark.parametrize("force", [
    f'ForceCommand exec {TCSH} -c "$SSH_ORIGINAL_COMMAND"',
    'ForceCommand exec /bin/sh -c "$SSH_ORIGINAL_COMMAND"',
    'ForceCommand echo "welcome to gpu1"; echo 42; exec /bin/sh -c "$SSH_ORIGINAL_COMMAND"',
], ids=["tcsh", "sh", "banner-on-stdout"])
def test_the_cycle_through_another_login_shell(sshd, tmp_path, force):
    if "tcsh" in force:
        assert Path(TCSH).is_file(), "tcsh is missing: `make test` installs it (Debian's tcsh)"
    proc, srv = start_sshd(sshd, force, tmp_path)
    try:
        via = h.SSHVia(srv, tmp_path)
        tree = h.make_tree(tmp_path / "host", full=False)
        before = {n: h.file_sha(tree.worker(n)) for n in tree.patched_names}
        r = via.run("status", "--json", target=tree.root)
        assert r.rc == 0, r.err
        assert {f["state"] for f in json.loads(r.out)["files"]} == {"pristine"}
        r = via.run("apply", "--no-restart", target=tree.root)
        assert r.rc == 0, r.err
        assert all(h.file_sha(tree.worker(n)) != before[n] for n in tree.patched_names)
        r = via.run("status", "--json", target=tree.root)
        assert r.rc == 0, r.err
        assert {f["state"] for f in json.loads(r.out)["files"]} == {"patched"}
        r = via.run("revert", "--no-restart", target=tree.root)
        assert r.rc == 0, r.err
        assert {n: h.file_sha(tree.worker(n)) for n in tree.patched_names} == before
    finally:
        stop_sshd(proc)
