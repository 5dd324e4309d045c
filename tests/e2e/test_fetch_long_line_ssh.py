"""``eaglepatch report TARGET`` over the real sshd on a timing log with a line longer than a fetch's batch (9 MB,
over LOG_BATCH): before, the fetch of that file stopped at it for good, silently; now every record after it is
reported and the line is counted as skipped, as the report of the same file here counts a line that does not parse."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e


def _record(i: int) -> str:
    phases = {"draft": 1.0, "verify": 2.0, "draft_extend": 0.5}
    return json.dumps({"v": 1, "t": 100 + i * 0.01, "host": "gpu1", "pid": 10, "rank": 0, "worker": "EAGLEWorkerV2",
                       "mode": "decode", "bs": 1 + i % 2, "cycle_ms": 3.6, "timer": "sync", "phases": phases,
                       "accepted": 3, "run": "gpu1-10-500-cfg1"}) + "\n"


def _bare_install(root: Path) -> str:
    """An sglang package with no server, for --sglang-path (no other checkout's server is this report's)."""
    pkg = root / "bare install" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("__version__ = '0.0.0'\n")
    return str(pkg)


def _run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eaglepatch", *args], capture_output=True, text=True, env=env,
                          timeout=180)


def test_report_over_ssh_goes_past_a_line_longer_than_a_batch_and_counts_it_skipped(sshd, ssh_env, tmp_path):
    remote = tmp_path / "remote logs"
    remote.mkdir()
    log = remote / "gpu1-10-rank0.jsonl"
    with open(log, "w") as f:
        f.writelines(_record(i) for i in range(40))
        f.write("x" * (9 << 20) + "\n")  # over LOG_BATCH (8 MB), no JSON
        f.writelines(_record(i) for i in range(40, 100))
    env = dict(ssh_env, XDG_CACHE_HOME=str(tmp_path / "cache"))
    args = ["report", "--json", "--log-dir", str(remote), "-i", sshd.client_key, sshd.target, "--sglang-path",
            _bare_install(tmp_path)]
    r = _run(*args, env=env)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["records"] == 100 and doc["skipped_lines"] == 1, (doc["records"], doc["skipped_lines"], r.stderr)
    assert "skipped line" in r.stderr
    here = json.loads(_run("report", "--json", str(remote), env=env).stdout)
    assert (here["records"], here["skipped_lines"]) == (100, 1)  # the same as the report of the file itself
    # the table says it too, in the report's words for a line that does not parse
    r = _run(*args[:1], *args[2:], env=env)
    assert r.returncode == 0, r.stderr
    assert "1 lines did not parse and were skipped" in r.stdout + r.stderr
    # records written after the fetch come with the next one; the long line is not fetched or counted again
    with open(log, "a") as f:
        f.writelines(_record(i) for i in range(100, 110))
    r = _run(*args, env=env)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["records"] == 110 and doc["skipped_lines"] == 1
    assert "skipped line" not in r.stderr
    cached = list((tmp_path / "cache").rglob("gpu1-10-rank0.jsonl"))
    assert len(cached) == 1 and cached[0].stat().st_size == log.stat().st_size
