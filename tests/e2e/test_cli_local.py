"""The installed ``eaglepatch`` command against LOCAL targets (a fake host tree holding a real sglang release,
named by its path): the same scenarios as test_cli_ssh.py, from cli_helpers.py, without SSH."""

from __future__ import annotations

from pathlib import Path

import pytest

import cli_helpers as h

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


@pytest.fixture
def via(tmp_path: Path) -> h.LocalVia:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    return h.LocalVia(cwd)


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


def test_path_with_spaces_and_shell_characters(via, tmp_path):
    h.scenario_weird_path(via, tmp_path)


def test_several_targets(via, tmp_path):
    h.scenario_many_targets(via, tmp_path)


@pytest.mark.parametrize("version", h.RELEASES)
def test_show(via, tmp_path, version):
    tree = h.make_tree(tmp_path / "host", version)
    h.scenario_show(via, tree, target=tree.pkg)  # the package folder itself as TARGET
