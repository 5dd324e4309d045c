"""The installed ``eaglepatch`` command against a real OpenSSH server on 127.0.0.1 (conftest.py's ``sshd``), with
``--sglang-path`` pointing into a fake host tree holding a real sglang release: the scenarios of cli_helpers.py
(shared with test_cli_local.py), plus what only SSH has: host keys and client keys."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest

import cli_helpers as h

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


@pytest.fixture
def via(sshd, tmp_path: Path) -> h.SSHVia:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    return h.SSHVia(sshd, cwd)


@pytest.fixture
def tree(tmp_path: Path) -> h.Tree:
    """0.5.16 with its EAGLEWorkerV2 and NGRAMWorker files (the other workers dropped, for speed)."""
    return h.make_tree(tmp_path / "host", full=False)


@pytest.fixture(scope="module")
def refdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("reference")


@pytest.mark.parametrize("version", h.RELEASES)
def test_apply_status_revert_cycle(via, tmp_path, version):
    h.scenario_cycle(via, h.make_tree(tmp_path / "host", version))


def test_diff_is_what_apply_does(via, tmp_path):
    h.scenario_diff(via, h.make_tree(tmp_path / "host"))


def test_apply_dry_run_changes_nothing(via, tree):
    h.scenario_dry_run(via, tree)


def test_drift_refused_then_forced(via, tree):
    h.scenario_drift(via, tree)


def test_revert_without_backup(via, tree):
    h.scenario_lost_backup(via, tree)


def test_no_sglang_exit_4(via, tmp_path):
    h.scenario_no_sglang(via, tmp_path)


def test_symlinked_and_hard_linked_worker_files_stay_links(via, tree, tmp_path):
    h.scenario_links(via, tree, tmp_path)


def test_a_full_disk_leaves_no_lock(via, tree):
    h.scenario_full_disk(via, tree)


def test_patched_file_that_does_not_compile_on_the_host(via, tree):
    h.scenario_compile_fails(via, tree)


def test_cut_between_upload_and_rename(via, tree, refdir):
    h.scenario_cut_connection(via, tree, refdir)


def test_folder_that_refuses_the_write(via, tree):
    h.scenario_refused_dir(via, tree)


def test_file_that_refuses_the_rename_rolls_back(via, tree, refdir):
    h.scenario_refused_file(via, tree, refdir)


def test_two_concurrent_applies(via, tree, refdir):
    h.scenario_concurrent(via, tree, refdir)


def test_path_with_spaces_and_shell_characters(sshd, tmp_path):
    """Through the ~/.ssh/config alias (HostName, Port, User, IdentityFile from the config; no -i)."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    login_home = pwd.getpwnam(sshd.user).pw_dir  # where the remote shell starts
    h.scenario_weird_path(h.SSHVia(sshd, cwd, alias=True), tmp_path, homes=[login_home, sshd.home])


def test_several_targets(via, tmp_path):
    h.scenario_many_targets(via, tmp_path)


def test_show(via, tmp_path):
    h.scenario_show(via, h.make_tree(tmp_path / "host", h.NEW_RELEASE))  # the V1 release: test_cli_local.py


# ------------------------------------------------------------------------------------------------ keys


def _known_hosts(home: str) -> str:
    try:
        return Path(home, ".ssh", "known_hosts").read_text()
    except FileNotFoundError:
        return ""


def test_unknown_host_key_refused_then_accepted_and_saved(via, sshd, tree, tmp_path):
    home = sshd.make_home(tmp_path / "home", known="none")
    v = via.with_home(home)
    before = h.snapshot(tree.root)
    r = v.run("apply", "--no-restart", target=tree.root).expect(3)
    line = r.error_line()
    assert "not known" in line and "--accept-new-host-key" in line, line
    assert h.snapshot(tree.root) == before
    assert sshd.host_pub_key.split()[1] not in _known_hosts(home)

    doc = v.run("status", "--json", "--accept-new-host-key", target=tree.root).expect(0).json()
    assert doc["sglang_version"] == tree.version
    assert sshd.host_pub_key.split()[1] in _known_hosts(home), "the accepted key was not saved"
    # saved: the next run needs no flag
    v.run("apply", "--no-restart", target=tree.root).expect(0)
    h.assert_clean_apply(tree, tmp_path, "apply after accepting the host key")


@pytest.mark.parametrize("flag", [[], ["--accept-new-host-key"]], ids=["plain", "with-accept-flag"])
def test_changed_host_key_refused(via, sshd, tree, tmp_path, flag):
    home = sshd.make_home(tmp_path / "home", known="changed")
    known = _known_hosts(home)
    before = h.snapshot(tree.root)
    r = via.with_home(home).run("apply", "--no-restart", *flag, target=tree.root).expect(3)
    line = r.error_line()
    assert "host key" in line and "changed" in line.lower(), line
    assert h.snapshot(tree.root) == before
    assert _known_hosts(home) == known, "a changed host key was written to known_hosts"


def test_wrong_client_key(via, sshd, tree, tmp_path):
    home = sshd.make_home(tmp_path / "home", known="ok", config=False)
    before = h.snapshot(tree.root)
    r = via.with_home(home, identity=sshd.other_key).run("apply", "--no-restart", target=tree.root).expect(3)
    assert "authentication failed" in r.error_line().lower()
    assert h.snapshot(tree.root) == before
    assert not os.path.exists(tree.runtime)
