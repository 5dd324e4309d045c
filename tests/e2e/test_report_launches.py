"""Several server launches into one log folder, written by the real runtime (cpu timer) in real processes: each
launch is a launcher process that starts two rank processes with multiprocessing's spawn method, as sglang starts
its schedulers. ``eaglepatch report`` keeps the launches apart (one table each, headed by the launcher's
speculative flags and timer), ``--merge-runs`` blends them and says so, ``--run`` and ``--since`` pick, and
``--by rank`` splits one launch by rank."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

RUNTIME_DIR = Path(__file__).resolve().parents[2] / "eaglepatch" / "runtime"

LAUNCHER = textwrap.dedent('''
    """A stand-in launch: ranks started by spawn, each timing CYCLES decode cycles of ACCEPTED tokens each."""
    import multiprocessing as mp
    import sys
    import time

    def rank(r, runtime_dir, cycles, accepted):
        sys.path.insert(0, runtime_dir)
        import _eaglepatch_runtime as rt

        class Dist(object):                     # torch.distributed as an initialised two-rank group
            def is_available(self):
                return True

            def is_initialized(self):
                return True

            def get_rank(self):
                return r

        rt._DIST = Dist()

        class Out(object):
            accept_lens = [accepted]

        class EAGLEWorker(object):
            @rt.entry
            def forward_batch_generation(self, batch):
                rt.begin("draft")
                time.sleep(0.0005)
                rt.end("draft")
                rt.begin("verify")
                time.sleep(0.001)
                rt.end("verify")
                rt.accepted(Out(), ("accept_lens",))
                return None

        class Batch(object):
            reqs = [None]                       # one request: accept length = accepted per cycle

        w = EAGLEWorker()
        for _ in range(cycles):
            w.forward_batch_generation(Batch())
        rt.flush()

    if __name__ == "__main__":
        mp.set_start_method("spawn")
        runtime_dir, cycles, accepted = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
        procs = [mp.Process(target=rank, args=(r, runtime_dir, cycles, accepted)) for r in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        sys.exit(max(p.exitcode for p in procs))
''')


def launch(script: Path, logs: Path, steps: int, accepted: int, cycles: int, mode: str) -> None:
    env = {**os.environ, "EAGLEPATCH_MODE": mode, "EAGLEPATCH_LOG_DIR": str(logs), "EAGLEPATCH_SUMMARY_EVERY": "0"}
    r = subprocess.run([sys.executable, str(script), str(RUNTIME_DIR), str(cycles), str(accepted),
                        "--speculative-algorithm", "EAGLE3", f"--speculative-num-steps={steps}"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def report(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eaglepatch", "report", *args], capture_output=True, text=True,
                          timeout=120)


def test_three_launches_with_two_ranks_each_are_three_runs(tmp_path):
    script = tmp_path / "launch_sglang_like.py"
    script.write_text(LAUNCHER)
    logs = tmp_path / "logs"
    plan = [(5, 6, 20, "cpu"), (2, 1, 30, "cpu"), (5, 6, 40, "auto")]     # steps, accepted per cycle, cycles, mode
    starts = []
    for steps, acc, cycles, mode in plan:
        starts.append(time.time())
        launch(script, logs, steps, acc, cycles, mode)
        time.sleep(0.05)
    assert len(list(logs.glob("*-rank0.jsonl"))) == 3 and len(list(logs.glob("*-rank1.jsonl"))) == 3

    doc = json.loads(report("--json", str(logs)).stdout)
    decode = [g for g in doc["groups"] if g["mode"] == "decode"]
    assert [g["n"] for g in decode] == [2 * c for _, _, c, _ in plan]            # both ranks, one launch each
    assert [g["accept_len"] for g in decode] == [float(a) for _, a, _, _ in plan]
    runs = doc["runs"]
    assert [r["flags"] for r in runs] == [{"speculative-algorithm": "EAGLE3", "speculative-num-steps": str(s)}
                                         for s, _, _, _ in plan]
    assert [r["timer"] for r in runs] == ["cpu", "cpu", "cpu"]                  # auto without CUDA: cpu
    assert [g["key"]["run"] for g in decode] == [r["id"] for r in runs]
    assert len({r["id"] for r in runs}) == 3

    text = report(str(logs)).stdout
    assert text.count("EAGLE3 steps=5") == 2 and text.count("EAGLE3 steps=2") == 1

    merged = report("--merge-runs", str(logs))
    assert "merged 3 runs" in merged.stdout
    second = runs[1]["id"]
    only = json.loads(report("--json", "--run", second, str(logs)).stdout)
    assert [g["n"] for g in only["groups"]] == [60]
    since = json.loads(report("--json", "--since", str(starts[2]), str(logs)).stdout)
    assert [r["id"] for r in since["runs"]] == [runs[2]["id"]]
    by_rank = json.loads(report("--json", "--by", "rank", "--run", second, str(logs)).stdout)
    assert sorted((g["key"]["rank"], g["n"]) for g in by_rank["groups"]) == [(0, 30), (1, 30)]
