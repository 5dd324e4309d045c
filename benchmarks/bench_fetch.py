#!/usr/bin/env python3
"""`eaglepatch report` of a big timing log over loopback SSH against the local `eaglepatch report` of the same files.

Writes ``--size-mb`` of timing log (bench_report.py's ``generate``: two rank files, one run) into a folder, starts
its own OpenSSH server on 127.0.0.1 the way bench_ssh.py does (``Loopback``), then times whole commands, each a
subprocess:

* ``local``: ``eaglepatch report --json --all-runs DIR`` (the files read where they are);
* ``ssh_cold``: ``eaglepatch report --json --all-runs USER@127.0.0.1:PORT -i KEY --log-dir DIR`` with an empty cache (every
  byte fetched, then the same aggregation);
* ``ssh_warm``: the same again, the cache full (nothing new to fetch).

``--rounds`` (3) rounds of ``local`` then ``ssh_cold`` (each into an empty cache, removed after it), then one
``ssh_warm``: the ratio is the median of the rounds' ratios, the round shown the median's (memory: the highest).

Peak memory: the client's is the highest sum, at one poll, of the peaks so far (``VmHWM``, the kernel's own
high-water mark, so a poll every 20 ms loses nothing but what grows in the last 20 ms) of the client's process and
every process below it alive then (the report over SSH aggregates in a child of its own while it fetches: both
count, as if both peaked at once), and at least ``ru_maxrss`` of ``os.wait4`` on its pid. The host side's is the highest ``VmHWM`` of every process below the
sshd, read from /proc while the command runs. Both reports must give the same ``records``.

Prints one JSON object on stdout. ``python benchmarks/bench_fetch.py [--size-mb 1024] [--rounds 3] [--quick]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_report import generate  # noqa: E402
from bench_ssh import EAGLEPATCH, Loopback  # noqa: E402

TARGET_RATIO = 1.5
TARGET_MB = 200


def _children(root: int, parent: dict[int, list[int]] | None = None) -> list[int]:
    """Every process below ``root``, by the parent of each in /proc (``_parents()``, read again unless given)."""
    parent = _parents() if parent is None else parent
    out, todo = [], [root]
    while todo:
        for c in parent.get(todo.pop(), ()):
            out.append(c)
            todo.append(c)
    return out


def _parents() -> dict[int, list[int]]:
    """pid -> its children, from /proc."""
    parent: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parent.setdefault(ppid, []).append(int(d))
    return parent


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def _hwm_kb(pid: int, field: str = "VmHWM:") -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def run_measured(argv: list[str], env: dict, sshd_pid: int | None) -> dict:
    """Wall seconds, the client's peak RSS (MB: its processes' peaks added up) and, with ``sshd_pid``, the host
    side's highest peak (MB)."""
    host_peak = {"kb": 0, "pid": None}
    client_kb: dict[int, int] = {}  # the peak of each process of the client, as last read
    client_sum = {"kb": 0, "rss": 0}  # the highest sum of the peaks (and of the RSS) of its processes at one poll
    stop = threading.Event()
    out = tempfile.TemporaryFile()
    err = tempfile.TemporaryFile()
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL)

    def poll() -> None:
        while not stop.is_set():
            parents = _parents()
            for pid in _children(sshd_pid, parents) if sshd_pid else ():
                kb = _hwm_kb(pid)
                if kb > host_peak["kb"]:
                    host_peak.update(kb=kb, pid=pid)
            own = _cmdline(proc.pid)
            alive = rss = 0
            for pid in [proc.pid, *_children(proc.pid, parents)]:
                # a child not yet exec'd (the client's subprocesses start as vfork: the client's own pages) is no
                # memory of its own; after its exec, VmHWM is its new program's
                if pid == proc.pid or _cmdline(pid) != own:
                    kb = _hwm_kb(pid)
                    client_kb[pid] = kb or client_kb.get(pid, 0)
                    alive += kb
                    rss += _hwm_kb(pid, "VmRSS:")
            client_sum["kb"] = max(client_sum["kb"], alive)
            client_sum["rss"] = max(client_sum["rss"], rss)
            stop.wait(0.02)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    _pid, status, ru = os.wait4(proc.pid, 0)
    dt = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    stop.set()
    poller.join()
    out.seek(0)
    err.seek(0)
    stdout, stderr = out.read().decode(), err.read().decode(errors="replace")
    if proc.returncode != 0:
        raise SystemExit(f"benchmark command failed (exit {proc.returncode}): {' '.join(argv)}\n{stderr[-2000:]}")
    client = max(client_sum["kb"], ru.ru_maxrss)
    res = {"wall_s": round(dt, 3), "client_peak_mb": round(client / 1024, 1),
           "client_processes_mb": sorted((round(kb / 1024, 1) for kb in client_kb.values() if kb), reverse=True),
           # what its processes held at once, sampled every 20 ms (client_peak_mb is the bound: each one's peak)
           "client_rss_together_mb": round(client_sum["rss"] / 1024, 1),
           "records": json.loads(stdout)["records"], "stderr": stderr.strip().splitlines()[-1:]}
    if sshd_pid:
        res["host_peak_mb"] = round(host_peak["kb"] / 1024, 1)
    return res


def measure(size_mb: int, rounds: int = 3) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="ep-bench-fetch-"))  # not /tmp/eaglepatch*: other tools clean those up
    try:
        logs = tmp / "host" / "logs"
        logs.mkdir(parents=True, mode=0o700)
        sample = tmp / "sample"
        sample.mkdir()
        per_record = sum(os.path.getsize(p) for p in generate(str(sample), 2000)) / 2000
        t0 = time.perf_counter()
        paths = generate(str(logs), max(2, int(size_mb * 2 ** 20 / per_record)))
        gen_s = time.perf_counter() - t0
        size = sum(os.path.getsize(p) for p in paths)
        with Loopback(tmp / "sshd") as lb:
            srv = lb.server
            # --all-runs: every record of the log, whatever server runs on this machine (another checkout's or
            # test's sglang server would otherwise be taken for the host's current one, whose records these are not)
            remote = [*EAGLEPATCH, "report", "--json", "--all-runs", srv.target, "-i", srv.client_key, "--log-dir",
                      str(logs)]
            # rounds of (local, cold) in turn, each cold one into an empty cache removed after it: the ratio is the
            # median of the rounds' ratios (one round's varied by 0.1x on this machine: how quickly the kernel
            # takes a new GB into its page cache differs from run to run)
            locals_, colds = [], []
            for rnd in range(rounds):
                cache = tmp / "cache"
                env = dict(lb.env, XDG_CACHE_HOME=str(cache))
                locals_.append(run_measured([*EAGLEPATCH, "report", "--json", "--all-runs", str(logs)], env, None))
                colds.append(run_measured(remote, env, lb.proc.pid))
                if rnd < rounds - 1:
                    shutil.rmtree(cache)
            warm = run_measured(remote, env, lb.proc.pid)
        if len({r["records"] for r in [*locals_, *colds, warm]}) != 1:
            raise SystemExit(f"the reports differ: {[r['records'] for r in [*locals_, *colds, warm]]} records")
        ratios = [c["wall_s"] / lo["wall_s"] for lo, c in zip(locals_, colds)]
        ratio = statistics.median(ratios)
        mid = ratios.index(sorted(ratios)[(len(ratios) - 1) // 2])  # the round shown (the median's, or below it)
        local, cold = locals_[mid], dict(colds[mid])
        cold["client_peak_mb"] = max(c["client_peak_mb"] for c in colds)  # memory: the highest of the rounds
        cold["host_peak_mb"] = max(c["host_peak_mb"] for c in colds)
        peaks = (cold["client_peak_mb"], cold["host_peak_mb"], warm["client_peak_mb"], warm["host_peak_mb"])
        return {
            "log_bytes": size, "log_mb": round(size / 2 ** 20, 1), "records": local["records"],
            "generate_s": round(gen_s, 1), "local": local, "ssh_cold": cold, "ssh_warm": warm,
            "rounds": rounds, "ratios_cold": [round(r, 3) for r in ratios],
            "local_s": [lo["wall_s"] for lo in locals_], "ssh_cold_s": [c["wall_s"] for c in colds],
            "ratio_cold": round(ratio, 3), "ratio_warm": round(warm["wall_s"] / local["wall_s"], 3),
            "target_ratio": TARGET_RATIO, "target_mb": TARGET_MB,
            "ratio_met": ratio <= TARGET_RATIO, "memory_met": max(peaks) <= TARGET_MB,
            "commands": {
                "local": "eaglepatch report --json --all-runs DIR",
                "ssh": "eaglepatch report --json --all-runs USER@127.0.0.1:PORT -i KEY --log-dir DIR (cold: empty "
                       "cache)",
            },
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3, help="rounds of (local, cold SSH) reports; the median ratio")
    ap.add_argument("--quick", action="store_true", help="a 32 MB log, to check the script")
    args = ap.parse_args(argv)
    res = measure(32 if args.quick else max(1, args.size_mb), max(1, args.rounds))
    print(json.dumps(res))
    c = res["ssh_cold"]
    print(f"{res['log_mb']} MB: report over SSH {c['wall_s']:.1f} s (cold), local {res['local']['wall_s']:.1f} s: "
          f"{res['ratio_cold']:.2f}x, the median of {res['rounds']} rounds {res['ratios_cold']} (target <= {TARGET_RATIO}x: {'met' if res['ratio_met'] else 'MISSED'}); "
          f"peak client {c['client_peak_mb']} MB, host {c['host_peak_mb']} MB (target <= {TARGET_MB} MB: "
          f"{'met' if res['memory_met'] else 'MISSED'})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
