"""CI skips nothing it can run: with ``EAGLEPATCH_NO_SKIPS=1`` (set by ``.ci/run``) a session in which a test skips
fails, unless the test is on the written list of CUDA-only ones (tests/cuda_only_skips.txt, or the file
``EAGLEPATCH_NO_SKIPS_ALLOW`` names) and skipped for want of CUDA. The hooks are imported by tests/conftest.py; with pytest-xdist they count on the controller, which sees every
worker's reports.
"""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path

import pytest

ENV = "EAGLEPATCH_NO_SKIPS"
ALLOW_FILE = Path(__file__).resolve().parent / "cuda_only_skips.txt"
CUDA_REASON = "no CUDA"

_skipped: list[tuple[str, str]] = []


def allowed_patterns(path: Path = ALLOW_FILE) -> list[str]:
    lines = (line.strip() for line in path.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def unexpected(skipped: list[tuple[str, str]], patterns: list[str]) -> list[tuple[str, str]]:
    """The (node id, reason) pairs of ``skipped`` that the allow-list does not cover: a node id no pattern matches,
    or a CUDA-only test skipped for another reason than CUDA's absence."""
    out = []
    for nodeid, reason in skipped:
        listed = any(fnmatch.fnmatchcase(nodeid, p) for p in patterns)
        if not (listed and CUDA_REASON in reason):
            out.append((nodeid, reason))
    return out


def _reason(report: pytest.TestReport) -> str:
    lr = report.longrepr
    if isinstance(lr, tuple) and len(lr) == 3:
        return str(lr[2])
    return str(lr)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        _skipped.append((report.nodeid, _reason(report)))


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if os.environ.get(ENV) != "1" or hasattr(session.config, "workerinput"):
        return  # not asked, or an xdist worker (the controller counts)
    bad = unexpected(_skipped, allowed_patterns(Path(os.environ.get(ENV + "_ALLOW", ALLOW_FILE))))
    if not bad:
        return
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    lines = [f"{len(bad)} test(s) skipped outside {ALLOW_FILE.name} ({ENV}=1): CI runs them all"]
    lines += [f"  {nodeid}: {reason}" for nodeid, reason in bad]
    if tr is not None:
        tr.write_line("\n".join(lines), red=True)
    else:
        print("\n".join(lines))
    if session.exitstatus == 0:
        session.exitstatus = 1
