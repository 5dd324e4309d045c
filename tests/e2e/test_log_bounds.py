"""The timing logs' bounds, by the real runtime in real processes (docs/contract.md, "Bounds inside the server"): a
launch of two ranks (spawned as sglang spawns its schedulers) under ``--max-log-mb 1`` keeps its logs under 1 MB,
each rank in its half, rotating and removing its own oldest files, and ``eaglepatch report`` reads what is left;
under ``--min-free-mb`` above the disk's free space, nothing is written and the losses are said, once per rank and
at exit, with the free space found. (The runtime's own unit tests: tests/unit/test_runtime_bounds.py.)"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

RUNTIME_DIR = Path(__file__).resolve().parents[2] / "eaglepatch" / "runtime"
MB = 1 << 20

LAUNCHER = textwrap.dedent('''
    """A stand-in launch: two ranks started by spawn, each timing CYCLES decode cycles as fast as it can."""
    import multiprocessing as mp
    import sys

    def rank(r, runtime_dir, cycles):
        sys.path.insert(0, runtime_dir)
        import _eaglepatch_runtime as rt

        class Dist(object):                     # torch.distributed as an initialised two-rank group
            def is_available(self):
                return True

            def is_initialized(self):
                return True

            def get_rank(self):
                return r

            def get_world_size(self):
                return 2

        rt._DIST = Dist()

        class Out(object):
            n = 0

        class EAGLEWorker(object):
            @rt.entry
            def forward_batch_generation(self, batch):
                rt.begin("draft")
                rt.end("draft")
                rt.begin("verify")
                rt.end("verify")
                rt.accepted(Out, ("n",))
                return None

        class Batch(object):
            reqs = [None]

        w = EAGLEWorker()
        for i in range(cycles):
            Out.n = i                           # the record says which cycle it is
            w.forward_batch_generation(Batch())

    if __name__ == "__main__":
        mp.set_start_method("spawn")
        runtime_dir, cycles = sys.argv[1], int(sys.argv[2])
        procs = [mp.Process(target=rank, args=(r, runtime_dir, cycles)) for r in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        sys.exit(max(p.exitcode for p in procs))
''')


def launch(tmp_path: Path, logs: Path, cycles: int, **env: str) -> subprocess.CompletedProcess:
    script = tmp_path / "launch_sglang_like.py"
    script.write_text(LAUNCHER)
    run_env = {k: v for k, v in os.environ.items() if not k.startswith("EAGLEPATCH_")}
    run_env.update(EAGLEPATCH_MODE="cpu", EAGLEPATCH_LOG_DIR=str(logs), EAGLEPATCH_SUMMARY_EVERY="0", **env)
    r = subprocess.run([sys.executable, str(script), str(RUNTIME_DIR), str(cycles)], env=run_env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r


def test_a_launch_stays_under_max_log_mb_and_the_report_reads_what_is_left(tmp_path):
    logs = tmp_path / "logs"
    r = launch(tmp_path, logs, 12000, EAGLEPATCH_MAX_LOG_MB="1")     # some 3 MB of records per rank
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr and "dropped" not in r.stderr, r.stderr
    names = sorted(os.listdir(logs))
    by_rank: dict[int, list[tuple[int, str]]] = {0: [], 1: []}
    for n in names:
        m = re.fullmatch(r".+-\d+-rank(\d)(?:\.(\d{6}))?\.jsonl", n)
        assert m, n
        by_rank[int(m.group(1))].append((int(m.group(2) or 0), n))
    total = 0
    kept = 0
    for rank, files in by_rank.items():
        files.sort()
        assert files[0][0] > 0 and len(files) >= 3              # the first file removed, then others
        sizes = [(logs / n).stat().st_size for _, n in files]
        assert sum(sizes) <= MB // 2 + 1024                     # the rank's half, and a record
        total += sum(sizes)
        accepted = []
        for _, n in files:
            docs = [json.loads(line) for line in (logs / n).read_text().splitlines()]
            assert docs[0]["kind"] == "run" and docs[0]["rank"] == rank
            accepted += [d["accepted"] for d in docs if "kind" not in d]
        assert accepted == list(range(12000 - len(accepted), 12000))     # the newest, in order, none lost
        kept += len(accepted)
    assert total <= MB + 2048
    res = subprocess.run([sys.executable, "-m", "eaglepatch", "report", "--json", str(logs)], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["records"] == kept and doc["skipped_lines"] == 0
    assert sum(g["n"] for g in doc["groups"]) == kept


def test_under_min_free_mb_nothing_is_written_and_the_losses_are_said(tmp_path):
    logs = tmp_path / "logs"
    r = launch(tmp_path, logs, 3000, EAGLEPATCH_MIN_FREE_MB=str(10**9))      # a petabyte: more than this disk has
    assert not list(logs.glob("*.jsonl")) if logs.exists() else True
    said = [line for line in r.stderr.splitlines() if "the timing log's filesystem has" in line]
    assert len(said) == 2, r.stderr                            # once per rank
    assert all(re.fullmatch(r"\[eaglepatch\] the timing log's filesystem has \d+ MB free at %s, under "
                            r"--min-free-mb %d: not writing until \d+ MB are free \(--min-free-mb %d \+ 64\); "
                            r"records dropped are counted" % (re.escape(str(logs)), 10**9, 10**9), line)
               for line in said), said
    exits = [line for line in r.stderr.splitlines() if "timing record(s) dropped" in line]
    assert len(exits) == 2 and all(re.fullmatch(r"\[eaglepatch\] 3000 timing record\(s\) dropped in pid \d+ \(the "
                                                 r"log's filesystem was under --min-free-mb\)", line) for line in exits)
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr
