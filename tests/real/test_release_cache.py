"""The release cache itself: a failed download fails (never skips), concurrent processes build one site safely,
and a built site is reused."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import sglang_releases

pytestmark = pytest.mark.real

TESTS = Path(__file__).resolve().parents[1]


def test_download_failure_fails_the_test_with_pips_words(tmp_path, monkeypatch):
    """A release pip cannot fetch raises ReleaseUnavailable naming the version and the command, and the fixture
    turns it into a test failure, not a skip."""
    monkeypatch.setenv("EAGLEPATCH_TEST_CACHE", str(tmp_path / "cache"))
    with pytest.raises(sglang_releases.ReleaseUnavailable, match=r"sglang==0\.0\.0\.dev424242: pip download failed"):
        sglang_releases.release_site("0.0.0.dev424242")
    with pytest.raises(pytest.fail.Exception, match="pip download failed"):
        sglang_releases.release_site_or_fail("0.0.0.dev424243")
    assert not (tmp_path / "cache" / "sites" / "0.0.0.dev424242").exists()


def test_concurrent_processes_build_one_complete_site(tmp_path, sglang_release):
    """Four processes asking for the same release at once on a fresh cache (its wheel already there) all get the
    same complete site; no temporary folder is left behind."""
    version = sglang_releases.PINNED[0]
    sglang_release(version)
    wheel = sglang_releases.wheel_path(version)
    cache = tmp_path / "cache"
    (cache / "wheels" / version).mkdir(parents=True)
    shutil.copy(wheel, cache / "wheels" / version / wheel.name)
    code = (
        f"import sys; sys.path.insert(0, {str(TESTS)!r}); import sglang_releases as s; "
        f"p = s.release_site({version!r}); print(p, len(s.worker_files({version!r})))"
    )
    env = {"EAGLEPATCH_TEST_CACHE": str(cache), "PATH": "/usr/bin:/bin"}
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for _ in range(4)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1] for o in outs]
    assert len({o[0] for o in outs}) == 1
    site = cache / "sites" / version
    assert outs[0][0].split()[0] == str(site)
    assert (site / "sglang" / "srt" / "speculative" / "eagle_worker.py").is_file()
    assert [p.name for p in (cache / "sites").iterdir()] == [version]


def test_a_built_site_is_reused(sglang_release):
    """The second call finds the completed site and extracts nothing (its files keep their modification time)."""
    version = sglang_releases.PINNED[-1]
    site = sglang_release(version)
    marker = next(site.glob("sglang/srt/speculative/*.py"))
    before = marker.stat().st_mtime_ns
    sglang_releases.release_site.cache_clear()
    assert sglang_releases.release_site(version) == site
    assert marker.stat().st_mtime_ns == before
