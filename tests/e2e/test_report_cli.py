"""``eaglepatch report`` through the installed CLI: local logs, and a TARGET whose logs are fetched over the real
sshd incrementally (only bytes not fetched before, whole lines only) into a local cache."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e


def record(t: float, pid: int = 10, rank: int = 0, mode: str = "decode", bs: int = 1, draft: float = 1.0,
           verify: float = 2.0, extend: float = 0.5, accepted: int | None = 3) -> str:
    phases = {"draft": draft, "verify": verify, "draft_extend": extend} if mode == "decode" else {
        "target": verify, "draft_extend": extend}
    cycle = sum(phases.values()) + 0.1
    return json.dumps({"v": 1, "t": t, "host": "gpu1", "pid": pid, "rank": rank, "worker": "EAGLEWorkerV2",
                       "mode": mode, "bs": bs, "cycle_ms": round(cycle, 4), "timer": "sync", "phases": phases,
                       "accepted": accepted}) + "\n"


def write_log(folder: Path, name: str, lines: list[str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / name
    with open(p, "a") as f:
        f.writelines(lines)
    return p


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eaglepatch", *args], capture_output=True, text=True, env=env,
                          timeout=120)


def test_local_folder_json_table_csv_and_bad_lines(tmp_path):
    """Two ranks merge; a garbage line is counted, never fatal; the numbers are the hand-computed ones."""
    logs = tmp_path / "logs"
    write_log(logs, "gpu1-10-rank0.jsonl", [record(100 + i * 0.01) for i in range(10)] + ["not json\n"])
    write_log(logs, "gpu1-11-rank1.jsonl", [record(100 + i * 0.01, pid=11, rank=1, draft=3.0) for i in range(10)])
    r = run("report", "--json", str(logs))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["records"] == 20 and doc["skipped_lines"] == 1
    (g,) = doc["groups"]
    assert g["mode"] == "decode" and g["n"] == 20 and g["key"] == {}
    assert g["phases"]["draft"]["mean"] == pytest.approx(2.0)  # ten 1.0 and ten 3.0
    assert g["accept_len"] == pytest.approx(3.0)
    # tokens/s: 60 tokens over 10*3.6 + 10*5.6 ms = 92 ms
    assert g["tokens_per_s"] == pytest.approx(60 / 92 * 1000, rel=1e-3)

    r = run("report", "--by", "rank", str(logs))
    assert r.returncode == 0 and "rank" in r.stdout and "draft" in r.stdout
    r = run("report", "--csv", str(logs))
    assert r.returncode == 0 and r.stdout.splitlines()[0].startswith("mode,")


def test_compare_and_trace(tmp_path):
    """--compare puts two sources side by side with the change in percent; --trace writes a Chrome trace."""
    before, after = tmp_path / "before", tmp_path / "after"
    write_log(before, "a-1-rank0.jsonl", [record(100 + i * 0.01, draft=2.0) for i in range(5)])
    write_log(after, "a-2-rank0.jsonl", [record(200 + i * 0.01, draft=1.0) for i in range(5)])
    r = run("report", "--compare", "--json", str(before), str(after))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    rows = {row["metric"]: row for row in doc["groups"][0]["rows"]}
    assert rows["draft p50 ms"]["values"] == [2.0, 1.0]
    assert rows["draft p50 ms"]["delta_pct"][1] == pytest.approx(-50.0)
    trace = tmp_path / "t.json"
    r = run("report", "--trace", str(trace), str(before))
    assert r.returncode == 0, r.stderr
    events = json.loads(trace.read_text())["traceEvents"]
    assert sum(1 for e in events if e.get("ph") == "X" and e["name"] == "draft") == 5


def test_usage_errors(tmp_path):
    """Bad options exit 2 with a one-line message."""
    assert run("report", "--compare", str(tmp_path)).returncode == 2
    assert run("report", "--by", "gpu", str(tmp_path)).returncode == 2
    r = run("report", str(tmp_path / "missing"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1


def test_target_logs_are_fetched_incrementally_over_ssh(sshd, ssh_env, tmp_path):
    """report TARGET fetches the logs over SSH into a local cache; a second report fetches only what is new, and
    a line still being written (no newline yet) waits for the next report."""
    remote = tmp_path / "remote logs"
    f0 = write_log(remote, "gpu1-10-rank0.jsonl", [record(100 + i * 0.01) for i in range(50)])
    env = dict(ssh_env, XDG_CACHE_HOME=str(tmp_path / "cache"))
    args = ["report", "--json", "--log-dir", str(remote), "-i", sshd.client_key, sshd.target]
    r = run(*args, env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["records"] == 50
    first_bytes = f0.stat().st_size
    assert f"{first_bytes} new bytes" in r.stderr

    with open(f0, "a") as f:
        f.writelines(record(101 + i * 0.01) for i in range(5))
        f.write(record(102)[:-20])  # half a line: the runtime is writing it right now
    write_log(remote, "gpu1-11-rank1.jsonl", [record(100 + i * 0.01, pid=11, rank=1) for i in range(7)])
    r = run(*args, env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["records"] == 62 and json.loads(r.stdout)["skipped_lines"] == 0
    new = (f0.stat().st_size - first_bytes - len(record(102)[:-20])) + (remote / "gpu1-11-rank1.jsonl").stat().st_size
    assert f"{new} new bytes" in r.stderr

    cached = list((tmp_path / "cache" / "eaglepatch" / "logs").rglob("gpu1-10-rank0.jsonl"))
    assert len(cached) == 1
    assert f0.read_bytes().startswith(cached[0].read_bytes())
    with open(f0, "a") as f:
        f.write(record(102)[-20:])  # the line is complete now
    r = run(*args, env=env)
    assert json.loads(r.stdout)["records"] == 63
    assert cached[0].read_bytes() == f0.read_bytes()


def test_target_without_logs_is_a_one_line_error(sshd, ssh_env, tmp_path):
    env = dict(ssh_env, XDG_CACHE_HOME=str(tmp_path / "cache"))
    r = run("report", "--log-dir", str(tmp_path / "none"), "-i", sshd.client_key, sshd.target, env=env)
    assert r.returncode == 2
    assert "no timing logs" in r.stderr and len(r.stderr.strip().splitlines()) == 1
