"""A newcomer's path replayed: ``make demo-server`` (the tests' stand-in sglang, in the world that batches), then
every command it prints, in order, as printed (``$T`` the install it made). Each exits 0, prints no traceback and
no warning of a load too short or a server too fresh; the story they tell is the world's: doctor names what the
model of the records finds, the sweep measures no speculation slower at 16 requests at a time than at 4, doctor
then has it measured; ``make demo-server-stop`` leaves no process of it.

Two deviations from a user's copy and paste, both for the shared machine: the client's cache and the demo's folder
under this test's own ``XDG_CACHE_HOME``, and ``apply`` given ``--log-dir`` in the test's folder (the default,
/tmp/eaglepatch, is every user's).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "stubs" / "stand_in_sglang" / "demo_server.py"
WARNINGS = ("the load ran for only", "request(s) warmed it", "Traceback")


def run(argv: list[str], env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, cwd=REPO)


def test_the_demo_servers_commands_run_in_order_with_no_warning(tmp_path):
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    env.pop("EAGLEPATCH_DEBUG", None)
    started = run([sys.executable, str(SCRIPT), "start"], env)
    assert started.returncode == 0, started.stderr
    try:
        lines = [line.strip() for line in started.stdout.splitlines()]
        target = next(line[2:] for line in lines if line.startswith("T="))
        commands = [line.split("  #")[0].strip() for line in lines if line.startswith("eaglepatch ")]
        assert [c.split()[1] for c in commands] == ["apply", "bench", "report", "doctor", "sweep", "bench", "doctor",
                                                    "revert"]
        outputs = {}
        for n, command in enumerate(commands):
            words = [target if w == "$T" else w for w in shlex.split(command)]
            if words[1] == "apply":
                words += ["--log-dir", str(tmp_path / "timing logs")]
            r = run([sys.executable, "-m", "eaglepatch", *words[1:]], env)
            assert r.returncode == 0, (command, r.stderr[-3000:])
            for w in WARNINGS:
                assert w not in r.stdout + r.stderr, (command, w, r.stdout[-2000:], r.stderr[-2000:])
            outputs[n] = r.stdout
        # doctor before the sweep: the model of the 5-step records, no speculation not measured
        assert "findings" in outputs[3] or "finding" in outputs[3]
        assert "speculation-unproven" in outputs[3] or "too-many-steps" in outputs[3], outputs[3]
        # the sweep: at 16 requests at a time no speculation measured fastest, at 4 a step count
        sweep = outputs[4]
        at16 = sweep.split("at 16 request(s) at a time")[1]
        best16 = next(line for line in at16.splitlines() if line.startswith("*"))
        assert "baseline (no speculation)" in best16, sweep
        at4 = sweep.split("at 4 request(s) at a time")[1].split("at 16 request(s)")[0]
        best4 = next(line for line in at4.splitlines() if line.startswith("*"))
        assert "speculative-num-steps" in best4, sweep
        # doctor after it: no speculation measured at the server's loads, speculation stops paying
        assert "speculation-slower" in outputs[6], outputs[6]
        assert "measured" in outputs[6]
    finally:
        stopped = run([sys.executable, str(SCRIPT), "stop"], env)
    assert stopped.returncode == 0 and "stopped the demo server" in stopped.stdout, stopped
    # no process whose environment names the demo's install is left (its server, or what eaglepatch restarted);
    # one still exiting gets a few seconds (a relaunch's wrapper ends after the server it waits for, on a loaded host)
    deadline = time.monotonic() + 15
    while True:
        left = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if str(tmp_path).encode() in Path(f"/proc/{pid}/environ").read_bytes():
                    left.append(f"{pid}: {Path(f'/proc/{pid}/cmdline').read_bytes()[:300]!r}")
            except OSError:
                continue
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not left, left
