"""eaglepatch killed (SIGKILL) at each step of apply, revert and sweep, over the real sshd: the next ``status`` tells
the truth, and ``revert`` (or the sweep run again) leaves every byte as it was and the original server running,
exactly as it was launched.

Each kill is a failpoint (``EAGLEPATCH_FAILPOINT``, eaglepatch/failpoints.py): the client SIGKILLs itself there,
and for the steps that happen on the host (inside a plan's execution) the helper program there dies too, so nothing
of eaglepatch's own clean-up runs. The rows of docs/safety.md are these cases, as observed here (``make
safety-table`` writes them).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from safety import (
    ADAPTIVE,
    CLI,
    PY,
    REJECTS_PATCH,
    WORKER,
    FaultTable,
    H,
    cli_env,
    digest,
    identity,
    make_install,
    up,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

TABLE = FaultTable()
BROKEN = WORKER + REJECTS_PATCH
GRID = ["--grid", "speculative-num-steps=1,2", "--requests", "2", "--concurrency", "1", "--input-len", "8",
        "--max-new-tokens", "8", "--warmup", "0", "--log-wait", "0", "--timeout", "60"]
SPEC = ("--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1")
LIVE = ["--live", "--grid", "speculative-num-steps=1,3", "--rounds", "1", "--window", "0.5", "--concurrency", "1",
        "--input-len", "8", "--max-new-tokens", "8", "--warmup", "1", "--log-wait", "0", "--timeout", "60"]

# (command, failpoint, worker, what eaglepatch had done when it was killed)
FAULTS = [
    ("apply", "execute:after-backup", WORKER,
     "backed up the originals and wrote the manifest on the host; replaced nothing"),
    ("apply", "execute:between-renames", WORKER, "replaced the worker file, not yet the runtime module"),
    ("apply", "apply:after-execute", WORKER, "patched the files; had not restarted the server"),
    ("apply", "restart:after-relaunch", WORKER,
     "stopped the server and started it on the patched files, in one request on the host; had not waited"),
    ("apply (patched server crashes)", "rollback:before", BROKEN,
     "saw the patched server crash; had not rolled back"),
    ("apply (patched server crashes)", "rollback:after-relaunch", BROKEN,
     "put the originals back and started the original server, in one request on the host; had not waited"),
    ("revert", "execute:between-renames", WORKER, "put back the worker file, not yet removed the runtime module"),
    ("revert", "revert:after-execute", WORKER,
     "put the originals back and started the server on them, in one request on the host; had not waited"),
    ("sweep", "restart:after-relaunch", WORKER,
     "stopped the server and started the first point's, in one request on the host"),
    ("sweep", "sweep:after-run", WORKER, "measured and saved the first point; its server still running"),
    ("sweep --live", "restart:after-relaunch", ADAPTIVE,
     "stopped the server and started it adaptive (the one launch), in one request on the host"),
    ("sweep --live", "live:after-launch", ADAPTIVE, "launched the server adaptive; no lease yet"),
    ("sweep --live", "live:after-lease", ADAPTIVE,
     "wrote the lease and had every rank's answer; no window measured"),
    ("sweep --live", "live:after-window", ADAPTIVE, "measured and saved the first window; the lease in place"),
]


@pytest.fixture(scope="module", autouse=True)
def _table():
    yield
    out = os.environ.get("EAGLEPATCH_SAFETY_TABLE")
    if out:
        TABLE.write(out)


def _settle(port: int, expect_up: bool) -> None:
    """Let what the host was doing finish (a server started by a request that outlived the client)."""
    if expect_up:
        H.wait_http(port, timeout=30)
    else:
        time.sleep(0.5)


def describe(doc: dict[str, Any], original_argv: list[str]) -> str:
    """One cell of the table from ``status --json``: files, servers, lock."""
    states = sorted({f["state"] for f in doc["files"]})
    parts = [f"files {'/'.join(states)}"]
    parts.append("runtime module present" if doc["runtime"]["present"] else "no runtime module")
    for s in doc["servers"]:
        what = ("the original command line" if s["argv"] == original_argv
                else "the live sweep's adaptive command line" if "--speculative-adaptive" in s["argv"]
                else "a sweep point's command line")
        code = {"current": "runs the files on disk", "stale": "started before the files changed (status: stale)"}
        parts.append(f"the server runs {what}, {code.get(s['code'], s['code'])}")
    if not doc["servers"]:
        parts.append("no server running")
    if doc.get("lock"):
        parts.append(f"lock left by the killed {doc['lock'].get('what')} (status names it)")
    return "; ".join(parts)


def faults(*commands: str):
    """The parametrisation over the faults of ``commands`` (numbered in FAULTS' order: the table's rows)."""
    cases = [(n, f) for n, f in enumerate(FAULTS, 1) if f[0].split(" (")[0] in commands]
    return pytest.mark.parametrize("order,fault", cases,
                                   ids=[f"{c.split(' (')[0].replace(' --', '-')}-{p}" for _n, (c, p, _w, _d) in cases])


# Every fault of FAULTS, in three classes: under make test (pytest-xdist, --dist loadscope) each class is one unit of
# work, so the faults run on three workers side by side rather than one after the other on one.
class TestApply:
    @faults("apply")
    def test_killed_at_each_step_status_tells_the_truth_and_revert_restores(self, sshd, standins, tmp_path, order,
                                                                            fault):
        killed_at_a_step(sshd, standins, tmp_path, order, fault)


class TestRevertAndSweep:
    @faults("revert", "sweep")
    def test_killed_at_each_step_status_tells_the_truth_and_revert_restores(self, sshd, standins, tmp_path, order,
                                                                            fault):
        killed_at_a_step(sshd, standins, tmp_path, order, fault)


class TestLiveSweep:
    @faults("sweep --live")
    def test_killed_at_each_step_status_tells_the_truth_and_revert_restores(self, sshd, standins, tmp_path, order,
                                                                            fault):
        killed_at_a_step(sshd, standins, tmp_path, order, fault)


def test_the_three_classes_have_every_fault():
    assert sorted(n for cls in (TestApply, TestRevertAndSweep, TestLiveSweep) for mark in
                  cls.test_killed_at_each_step_status_tells_the_truth_and_revert_restores.pytestmark
                  for n, _f in mark.args[1]) == list(range(1, len(FAULTS) + 1))


def killed_at_a_step(sshd, standins, tmp_path, order, fault):
    command, point, worker, did = fault
    cli = CLI("ssh", cli_env(tmp_path, sshd.env()), ssh=[sshd.target, "-i", sshd.client_key])
    install = make_install(standins, tmp_path / "install", "venv-by-path", worker=worker)
    port, proc = up(install, standins, tmp_path / "work dir", *SPEC)
    first, pristine = identity(proc.pid), digest(install.pkg)
    original = install.worker.read_bytes()
    kill = {"EAGLEPATCH_FAILPOINT": point}

    sweep_args = LIVE if command == "sweep --live" else GRID
    if command.startswith(("revert", "sweep")):
        cli.run("apply", install.pkg, "--timeout", "60").expect(0)
    if command.startswith("apply"):
        r = cli.run("apply", install.pkg, "--timeout", "30", env=kill)
    elif command == "revert":
        r = cli.run("revert", install.pkg, "--timeout", "60", env=kill)
    else:
        r = cli.run("sweep", install.pkg, *sweep_args, env=kill)
    assert r.rc == -9, f"eaglepatch was not killed at {point}:\n{r}"
    _settle(port, expect_up=point != "rollback:before")  # only a crashed patched server leaves none

    doc = cli.run("status", install.pkg, "--json").expect(0).json()
    # the truth, read independently of eaglepatch: the worker's bytes, the processes on the port
    now = install.worker.read_bytes()
    truth = "pristine" if now == original else "patched" if b"# [eaglepatch]" in now else "other"
    assert truth != "other", "the worker file is neither the original nor a patched one"
    worker_state = next(f["state"] for f in doc["files"] if f["path"].endswith(install.worker.name))
    assert worker_state == truth, doc
    running = standins.launcher_pids(port)
    assert sorted(s["pid"] for s in doc["servers"]) == sorted(running), doc
    assert len(running) <= 1, f"two servers on :{port}: {running}"
    for s in doc["servers"]:
        started_after = os.stat(install.worker).st_mtime <= H.proc_start_time(s["pid"]) + 0.05
        assert s["code"] == ("current" if started_after else "stale"), (s, doc)
    assert doc["lock"] and doc["lock"]["what"] == command.split()[0], doc["lock"]
    assert doc["runtime"]["present"] == (install.pkg / "srt" / "speculative" / "_eaglepatch_runtime.py").exists()
    if truth == "patched" and not doc["runtime"]["present"]:  # a restart now would crash the server: said so
        assert "MISSING" in cli.run("status", install.pkg).expect(0).out
    after = describe(doc, first["argv"])

    then = "eaglepatch revert"
    if command.startswith("sweep"):
        then = f"eaglepatch {command} (the same command again), then eaglepatch revert"
        r = cli.run("sweep", install.pkg, *sweep_args)
        assert r.rc == 0, r
        assert ("resuming" in r.err) == (point in ("sweep:after-run", "live:after-window")), r
    cli.run("revert", install.pkg, "--timeout", "60").expect(0)
    assert digest(install.pkg) == pristine, "revert did not restore every byte"
    [pid] = standins.launcher_pids(port)
    assert identity(pid) == first, "the server running at the end is not the original, as launched"
    H.wait_http(port, timeout=30)
    final_doc = cli.run("status", install.pkg, "--json").expect(0).json()
    assert final_doc["lock"] is None and [s["code"] for s in final_doc["servers"]] == ["current"]
    final = "every byte as before; the original server (same argv[0], argv, cwd, environment) runs the files; " \
            "no lock"
    TABLE.add(order=f"{order:02d}", command=f"eaglepatch {command}", fault=f"`{point}`", did=did, after=after,
              then=then, final=final)
