"""The load against the server's own traffic end to end (issues 39, 40): a stand-in that batches (``--sim-batch``:
one scheduler, every running request in one decode batch, each request's id the client's ``rid``) serves another
client's requests (plain ``/generate``, no rid) while eaglepatch's load runs. The stand-in's acceptance is drawn
per prompt: a prompt passes its guesses at 0.8 or at 0.5 by its hash, so the load here (prompts of 0.8) accepts
far more tokens a cycle than the other client's (prompts of 0.5).

- bench says so (``"traffic"`` in its JSON and the note) with the other client, and not without it;
- a restart sweep refuses (exit 2, one line naming --allow-shared-traffic, the server untouched) with the other
  client, and runs without it;
- a live sweep on the adaptive stand-in says how many of its windows' cycles carried others' requests.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from safety import ADAPTIVE, make_install, ok_json, patched_standin, run_cli, up

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

ARGS = ("--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "4", "--sim-batch", "--sim-base-ms", "2", "--cuda-graph-max-bs", "32",
        "--tp", "1")
LOAD = ("--requests", "24", "--concurrency", "4", "--max-new-tokens", "48", "--warmup", "1", "--log-wait", "2.5")


def prompt_key(item: object) -> str:
    """The stand-in's key of a prompt (launch_server.prompt_key): its parity picks the pass rate, 0.8 or 0.5."""
    return hashlib.sha256(json.dumps(item, sort_keys=True).encode()).hexdigest()[:16]


def prompts(rate_index: int, n: int, word: str) -> list[str]:
    out, i = [], 0
    while len(out) < n:
        text = f"{word} prompt number {i}"
        if int(prompt_key(text), 16) % 2 == rate_index:
            out.append(text)
        i += 1
    return out


class OtherClient:
    """Another client of the server: ``slots`` threads each sending plain /generate requests (no rid) of prompts
    that pass at 0.5, back to back, until stopped."""

    def __init__(self, port: int, slots: int = 3, new_tokens: int = 64):
        self.port, self.stop, self.sent = port, threading.Event(), 0
        self.texts = prompts(1, 16, "traffic")
        self.threads = [threading.Thread(target=self._slot, args=(k, new_tokens), daemon=True) for k in range(slots)]

    def _slot(self, k: int, new_tokens: int) -> None:
        i = k
        while not self.stop.is_set():
            body = json.dumps({"text": self.texts[i % len(self.texts)],
                               "sampling_params": {"max_new_tokens": new_tokens, "ignore_eos": True}}).encode()
            req = urllib.request.Request(f"http://127.0.0.1:{self.port}/generate", data=body,
                                         headers={"Content-Type": "application/json"})
            try:
                urllib.request.urlopen(req, timeout=30).read()
                self.sent += 1
            except OSError:
                time.sleep(0.05)
            i += len(self.threads)

    def __enter__(self) -> "OtherClient":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=40)


def cli(env: dict[str, str], *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return run_cli(env, *args, timeout=timeout)


ok = ok_json


def wait_for_others(logs: Path, timeout: float = 20.0) -> None:
    """Until the server's timing records hold a decode cycle of the other client's (the runtime writes every 2 s)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for f in logs.glob("*.jsonl"):
            if '"others"' in f.read_text(errors="replace"):
                return
        time.sleep(0.3)
    raise AssertionError(f"no record with others' requests in {logs}")


@pytest.fixture
def batching(standins, tmp_path):
    """A patched stand-in that batches: (target, port, env, logs, the load's --prompts file)."""
    target, port, env, logs = patched_standin(standins, tmp_path, *ARGS)
    mine = tmp_path / "load.jsonl"
    mine.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in prompts(0, 16, "load")))
    return target, port, env, logs, mine


def test_bench_says_its_load_accepts_unlike_the_servers_own_traffic_only_with_it(batching):
    target, port, env, logs, mine = batching
    with OtherClient(port) as other:
        wait_for_others(logs)
        doc = ok(cli(env, "bench", target, "--prompts", str(mine), *LOAD, "--json"))
        text = cli(env, "bench", target, "--prompts", str(mine), *LOAD)
    assert other.sent > 0
    tr = doc["traffic"]
    assert tr["cycles"] > 0 and {"cycles", "accept_len", "acceptance"} <= set(tr)
    assert tr["acceptance"]["samples"] > 0 and tr["acceptance"]["at_least"][0] == 1.0
    assert tr["load"]["accept_len"] > tr["accept_len"] + 0.3, tr  # 0.8 against 0.5 a guess
    assert tr["differs"] is True
    said = [n for n in doc["notes"] if "the server's own traffic" in n]
    assert len(said) == 1 and "--prompts" in said[0], doc["notes"]
    assert text.returncode == 0 and "the server's own traffic" in text.stdout, text.stdout

    time.sleep(3)  # the other client's last cycles before the next window
    alone = ok(cli(env, "bench", target, "--prompts", str(mine), *LOAD, "--json"))
    assert "traffic" not in alone
    assert not [n for n in alone["notes"] if "own traffic" in n], alone["notes"]


def test_a_restart_sweep_refuses_a_server_with_others_traffic_unless_allowed(batching, standins):
    target, port, env, logs, mine = batching
    [pid] = standins.launcher_pids(port)
    grid = ("--grid", "speculative-num-steps=2", "--timeout", "60", "--requests", "8", "--concurrency", "2",
            "--max-new-tokens", "16", "--warmup", "0", "--log-wait", "1", "--prompts", str(mine))
    with OtherClient(port, slots=2):
        wait_for_others(logs)
        r = cli(env, "sweep", target, *grid, "--json")
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert "--allow-shared-traffic" in lines[-1] and "nothing was changed" in lines[-1], r.stderr
    assert json.loads(r.stdout)["exit_code"] == 2  # --json: the error as a document
    assert standins.launcher_pids(port) == [pid]  # not restarted

    # allowed: the same sweep runs, and puts the server back
    r = cli(env, "sweep", target, *grid, "--allow-shared-traffic", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["points"][0]["status"] == "ok" and doc["restore"]["ready"]


def test_a_restart_sweep_on_a_server_of_its_own_runs(batching):
    target, port, env, logs, mine = batching
    r = cli(env, "sweep", target, "--grid", "speculative-num-steps=2", "--timeout", "60", "--requests", "8",
            "--concurrency", "2", "--max-new-tokens", "16", "--warmup", "0", "--log-wait", "1", "--prompts",
            str(mine), "--json")
    assert r.returncode == 0, r.stderr
    assert "--allow-shared-traffic" not in r.stderr


def _live_sweep(standins, tmp_path, *, beside_others: bool) -> dict:
    """A live sweep of 1 and 3 steps on a patched adaptive stand-in, with another client's requests beside it or
    not: its JSON."""
    install = make_install(standins, tmp_path / "install", "venv-by-path", worker=ADAPTIVE)
    port, _proc = up(install, standins, tmp_path / "work dir", "--speculative-algorithm", "EAGLE3",
                     "--speculative-num-steps", "3", "--speculative-eagle-topk", "1")
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "client cache"))
    env.pop("EAGLEPATCH_DEBUG", None)
    logs = tmp_path / "timing logs"
    ok(cli(env, "apply", str(install.pkg), "--log-dir", str(logs), "--timeout", "60", "--json"))
    args = ("--live", "--grid", "speculative-num-steps=1,3", "--rounds", "1", "--window", "1", "--concurrency", "2",
            "--input-len", "16", "--max-new-tokens", "32", "--warmup", "2", "--log-wait", "2.5", "--timeout", "60",
            "--prompts", "random-ids", "--json")
    if not beside_others:
        return ok(cli(env, "sweep", str(install.pkg), *args))
    with OtherClient(port, slots=2, new_tokens=32):
        return ok(cli(env, "sweep", str(install.pkg), *args))


def test_a_live_sweep_says_how_many_of_its_cycles_carried_others_requests(standins, tmp_path):
    doc = _live_sweep(standins, tmp_path, beside_others=True)
    assert doc["shared_cycles"] > 0
    said = [n for n in doc["notes"] if "not the sweep's" in n]
    assert len(said) == 1 and "--allow-shared-traffic" in said[0], doc["notes"]


def test_a_live_sweep_of_its_own_says_nothing_of_others(standins, tmp_path):
    doc = _live_sweep(standins, tmp_path, beside_others=False)
    assert "shared_cycles" not in doc
    assert not [n for n in doc["notes"] if "not the sweep's" in n], doc["notes"]


@pytest.mark.parametrize("loads,endpoint", [("both", "/v1/loads"), ("legacy", "/get_load")])
def test_a_restart_sweep_refuses_an_unpatched_server_that_holds_others_requests(standins, tmp_path, loads, endpoint):
    """An unpatched server has no timing records: the server's own count of the requests it holds (sglang's
    /v1/loads, else /get_load) says it serves others; the sweep refuses before anything changes. Before: nothing
    was refused, and the restart cut the other client's requests off."""
    install = make_install(standins, tmp_path / "install", "venv-by-path")
    port, _proc = up(install, standins, tmp_path / "work", *ARGS, "--standin-loads", loads)
    [pid] = standins.launcher_pids(port)
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "client cache"))
    env.pop("EAGLEPATCH_DEBUG", None)
    grid = ("--grid", "speculative-num-steps=2", "--timeout", "60", "--requests", "8", "--concurrency", "2",
            "--max-new-tokens", "16", "--warmup", "0", "--log-wait", "0", "--prompts", "random-ids")
    with OtherClient(port, slots=2, new_tokens=400) as other:
        deadline = time.monotonic() + 20
        while other.sent == 0 and time.monotonic() < deadline:  # the other client's requests under way
            time.sleep(0.1)
        r = cli(env, "sweep", str(install.pkg), *grid)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert "request(s) now that are not this sweep's" in lines[-1] and endpoint in lines[-1], r.stderr
    assert "--allow-shared-traffic" in lines[-1] and "nothing was changed" in lines[-1], r.stderr
    assert standins.launcher_pids(port) == [pid]  # not restarted
