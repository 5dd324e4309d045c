"""CI's no-skip rule (tests/skip_guard.py): a pytest session of its own, in a subprocess, on a file of tests that
skip, with and without the rule, and with the allow-list naming one of them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import skip_guard

TESTS = Path(__file__).resolve().parents[1]

SKIPPING = '''
import pytest

def test_runs():
    pass

def test_gpu_thing():
    pytest.skip("no CUDA")

def test_needs_torch():
    pytest.skip("torch is not installed")
'''


def _session(tmp_path: Path, env: dict[str, str], allow: str | None = None) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(TESTS)!r})\n"
        "from skip_guard import pytest_runtest_logreport, pytest_sessionfinish  # noqa: F401\n")
    (tmp_path / "test_some.py").write_text(SKIPPING)
    full = {k: v for k, v in os.environ.items() if not k.startswith(skip_guard.ENV)}
    full.update(env)
    if allow is not None:
        (tmp_path / "allow.txt").write_text(allow)
        full[skip_guard.ENV + "_ALLOW"] = str(tmp_path / "allow.txt")
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           str(tmp_path)], cwd=tmp_path, env=full, capture_output=True, text=True, timeout=120)


def test_without_the_rule_skips_pass(tmp_path: Path) -> None:
    r = _session(tmp_path, {})
    assert r.returncode == 0, r.stdout + r.stderr


def test_with_the_rule_a_skip_outside_the_list_fails_the_session_and_is_named(tmp_path: Path) -> None:
    r = _session(tmp_path, {skip_guard.ENV: "1"}, allow="# only the GPU one\ntest_some.py::test_gpu_*\n")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "1 test(s) skipped outside" in r.stdout, r.stdout
    assert "test_needs_torch: " in r.stdout and "torch is not installed" in r.stdout
    assert "test_gpu_thing:" not in r.stdout


def test_a_listed_test_may_skip_only_for_want_of_cuda(tmp_path: Path) -> None:
    listed = "test_some.py::test_gpu_*\ntest_some.py::test_needs_torch\n"
    r = _session(tmp_path, {skip_guard.ENV: "1"}, allow=listed)
    assert r.returncode == 1 and "test_needs_torch: " in r.stdout, r.stdout  # listed, but not skipped for CUDA


def test_unexpected_reads_node_ids_and_reasons() -> None:
    skipped = [("tests/unit/test_runtime.py::test_gpu_sync_timer", "no CUDA"),
               ("tests/unit/test_runtime.py::test_gpu_sync_timer2", "torch is not installed"),
               ("tests/unit/test_host_steps.py::test_x", "root may write")]
    assert skip_guard.unexpected(skipped, skip_guard.allowed_patterns()) == skipped[1:]


def test_the_written_list_names_only_tests_that_exist() -> None:
    for pattern in skip_guard.allowed_patterns():
        path, _, name = pattern.partition("::")
        text = (TESTS.parent / path).read_text()
        assert "def " + name.rstrip("*") in text, pattern
