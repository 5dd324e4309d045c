"""``eaglepatch sweep --live`` end to end: the installed CLI over the real sshd (and on a local path) against
stand-in sglang servers whose install has the stand-in's adaptive EAGLEWorkerV2 (sglang 0.5.16's shape: an
AdaptiveController whose policy moves the step count by a moving average, a state per candidate, the start-up
crash for a candidate above the launch's steps), patched by eaglepatch's real transform.

The stand-in's speed per request at K steps (launch_server.py, make_v2): a cycle of 2K + 6 + 1 ms yields
min(K + 1, 3.2) tokens: K=0 143 tok/s, K=1 222, K=3 246 (the best of 0, 1, 3, 7), K=7 152.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from safety import ADAPTIVE, EAGLEPATCH, WORKER, digest, identity, make_install, up  # local_cli, ssh_cli: conftest.py

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

SPEC = ("--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1")
GRID = ["--grid", "speculative-num-steps=0,1,3,7"]
LOAD = ["--concurrency", "2", "--input-len", "16", "--max-new-tokens", "32", "--warmup", "2", "--log-wait", "2.5",
        "--timeout", "60"]
N = 32  # tokens per request: 1 from prefill, the rest from decode cycles
CONTRACT_POINT_KEYS = {"flags", "env", "status", "runs", "tokens_per_s", "accept_len", "phases_p50", "speedup",
                       "windows"}


def accept_by_construction(k: int, n: int = N) -> float:
    """The stand-in's accept length for one request at ``k`` steps, as the client reads it (all tokens over the
    decode cycles): the same fractional accumulation as its verify."""
    frac, done, cycles = 0.0, 1, 0
    while done < n:
        frac += min(k + 1.0, 3.2)
        t = max(1, int(frac))
        frac -= t
        done += min(t, n - done)
        cycles += 1
    return n / cycles


def records(log_dir: Path) -> list[dict]:
    out = []
    for f in glob.glob(str(log_dir / "*.jsonl")):
        for line in Path(f).read_text().splitlines():
            d = json.loads(line)
            if d.get("kind") != "run":
                out.append(d)
    return out


def adaptive_server(standins, tmp_path: Path, *extra: str, kind: str = "venv-by-path"):
    install = make_install(standins, tmp_path / "install", kind, worker=ADAPTIVE)
    port, proc = up(install, standins, tmp_path / "work dir", *SPEC, *extra)
    return install, port, proc


def test_a_live_sweep_measures_every_step_count_in_one_launch_and_puts_the_server_back(ssh_cli, standins, tmp_path):
    """Over SSH: one adaptive launch (the largest candidate as its steps), two rounds of windows, every decode
    cycle of each window pinned at its point's step count, the known best found, each point's accept length
    within 2% of the construction (no selection bias: sglang's policy is held off), the original command line
    back, no lease left; then the emitted adaptive config launched and benched."""
    install, port, proc = adaptive_server(standins, tmp_path)
    logs = tmp_path / "timing logs"
    ssh_cli.run("apply", install.pkg, "--log-dir", str(logs), "--timeout", "60").expect(0)
    [patched] = standins.launcher_pids(port)
    before = identity(patched)
    chart, emit = tmp_path / "live chart.svg", tmp_path / "adaptive.json"
    r = ssh_cli.run("sweep", install.pkg, "--live", *GRID, "--rounds", "2", "--window", "1", *LOAD, "--json",
                    "--chart", str(chart), "--emit-adaptive-config", str(emit)).expect(0)
    doc = r.json()
    assert (doc["live"], doc["launches"], doc["rounds"], doc["window_s"], doc["baseline"]) == (True, 1, 2, 1.0, None)
    assert [p["steps"] for p in doc["points"]] == [0, 1, 3, 7] and doc["best"] == 2
    for p in doc["points"]:
        k = p["steps"]
        assert p["status"] == "ok" and p["windows"] == 2 and len(p["window_tokens_per_s"]) == 2, p
        assert p["tokens_per_s"]["min"] <= p["tokens_per_s"]["median"] <= p["tokens_per_s"]["max"]
        assert p["cycles"]["pinned"] > 0 and p["cycles"]["other"] == 0, p
        assert CONTRACT_POINT_KEYS <= set(p), p
        assert p["accept_len"] == pytest.approx(accept_by_construction(k), rel=0.02), p
        assert p["accept_len_log"] == pytest.approx(min(k + 1, 3.2), rel=0.02), p  # per cycle, as built
        assert ("draft" in p["phases_p50"]) == (k > 0), p
        if k:
            assert p["phases_p50"]["draft"] == pytest.approx(2.0 * k, rel=0.3), p
    # one launch for the whole sweep, then the original command line again
    launches = [line for line in r.err.splitlines() if "starting sglang on" in line]
    assert len(launches) == 2 and "--speculative-adaptive" in launches[0] and "--speculative-num-steps 7" in launches[0]
    assert "--speculative-adaptive" not in launches[1]
    [now] = standins.launcher_pids(port)
    assert identity(now) == before and now != patched
    assert not list(logs.glob("live-*")), "a lease or an answer was left behind"
    state = [json.loads(x) for x in Path(doc["state_file"]).read_text().splitlines()]
    # a timings entry per window, then the cost curve over them all (--emit-adaptive-config prices the batch sizes
    # above the measured ones with it)
    assert [s["kind"] for s in state] == ["sweep", "launch"] + ["run"] * 8 + ["timings"] * 9 + ["restore"]
    # the records of the windows say the state each cycle ran in, pinned
    pinned = [x for x in records(logs) if (x.get("spec") or {}).get("pinned")]
    assert {x["spec"]["steps"] for x in pinned} == {0, 1, 3, 7}
    # before the first window, every point's state ran pinned (the warm-up), outside every window
    first = min(s["window"][0] for s in state if s["kind"] == "run")
    assert {x["spec"]["steps"] for x in pinned if x["t"] < first} == {0, 1, 3, 7}
    assert "warm-up of each state: 1 s" in r.err
    assert "<svg" in chart.read_text() and "windows of 1 s inside one server" in chart.read_text()
    # the emitted config: the release's format, the launch flags that deploy it, and a server launched with them
    # 3 steps measured best of the grid (3.2 tokens in a 13 ms cycle); the acceptance model of the 7-step windows
    # adds 2 steps, which the grid skipped and which is the stand-in's true best (3 tokens in 11 ms)
    # Above the batch size measured (the stand-in batches one by one), the cost curve prices each batch size from
    # 2 up to 256 (its flags do not say its largest batch), so the measured tier is not stretched over them: every
    # tier above 1 is the curve's, its candidates the grid's step counts (or [0]), its basis said, in the sidecar
    # too; by the largest batches no step count beats the no-speculation estimate's spread (70%): [0]
    emitted = doc["adaptive_config"]
    config = json.loads(emit.read_text())
    # under a loaded CPU the windows' spreads widen until 1 step, and 4 steps from the acceptance model, reach the
    # best's figure (seen: [1, 2, 3] and [1, 2, 3, 4], in 4 of 7 full runs of make test): candidates then, as a tier
    # keeps every step count within the spreads of its best; 0 and 7 (the grid's far ends) never are
    got = set(config["1"]["candidate_steps"])
    assert config == emitted["config"] and {2, 3} <= got and not got & {0, 7}, config
    assert emitted["tier_basis"]["1"] == "measured"
    upper = [k for k in config if k != "1"]
    assert upper and min(int(k) for k in upper) == 2, config
    for k in upper:
        assert set(config[k]["candidate_steps"]) <= {0, 1, 3, 7}, config
        assert "curve" in emitted["tier_basis"][k], emitted["tier_basis"]
    assert config[max(upper, key=int)] == {"candidate_steps": [0]}, config
    assert any(n.startswith("--emit-adaptive-config: a tier of [0] runs sglang's zero-step state") for n in
               doc["notes"]), doc["notes"]
    side = json.loads(Path(emitted["basis_path"]).read_text())
    assert {k: v["candidate_steps"] for k, v in side["tiers"].items()} == {k: v["candidate_steps"]
                                                                          for k, v in config.items()}
    assert side["tiers"]["1"]["basis"] == "measured"
    assert side["curve"]["max_bs"] == 256 and side["curve"]["predict_by_bs"][0]["bs"] == 1
    basis = {m["steps"]: m["basis"] for m in emitted["measures"] if m["bs"] == 1}  # the stand-in batches one by one
    assert basis == {0: "measured", 1: "measured", 2: "profile", 3: "measured", 4: "profile", 5: "profile",
                     6: "profile", 7: "measured"}
    fig = {m["steps"]: m["tokens_per_s"] for m in emitted["measures"] if m["bs"] == 1}
    assert fig[2] > fig[3] > fig[4] > fig[5] > fig[6] > fig[7]  # the truth: 3 / 11, 3.2 / 13, 3.2 / 15 ... ms
    assert any(n.startswith("--emit-adaptive-config: candidates from the acceptance model, not measured: 2 steps")
               for n in doc["notes"]), doc["notes"]
    flags = [str(tmp_path / "deployed.json") if f == str(emit) else f for f in emitted["launch_flags"]]
    (tmp_path / "deployed.json").write_text(emit.read_text())
    dport, _dproc = up(install, standins, tmp_path / "deployed", "--speculative-algorithm", "EAGLE3", *flags)
    b = ssh_cli.run("bench", install.pkg, "--server-port", str(dport), "--requests", "4", "--concurrency", "2",
                    "--max-new-tokens", "32", "--log-wait", "0", "--json").expect(0).json()
    assert b["client"]["failed"] == 0
    assert accept_by_construction(2) * 0.98 <= b["client"]["accept_len"] <= accept_by_construction(3) * 1.02


def test_a_server_already_adaptive_with_the_candidates_is_measured_without_a_launch(local_cli, standins, tmp_path):
    """launches 0: the server runs --speculative-adaptive with every grid step in the tier the load reaches; it is
    the same process at the end, and sglang's own policy has it again (a later cycle is not pinned)."""
    cfg = tmp_path / "mine.json"
    cfg.write_text(json.dumps({"1": {"candidate_steps": [1, 3, 7]}, "64": {"candidate_steps": [1]}}))
    install, port, _proc = adaptive_server(standins, tmp_path, "--speculative-adaptive",
                                           "--speculative-adaptive-config", str(cfg), "--speculative-num-steps",
                                           "7")
    logs = tmp_path / "logs"
    local_cli.run("apply", install.pkg, "--log-dir", str(logs), "--timeout", "60").expect(0)
    [pid] = standins.launcher_pids(port)
    r = local_cli.run("sweep", install.pkg, "--live", "--grid", "speculative-num-steps=1,3", "--rounds", "1",
                      "--window", "1", *LOAD, "--json").expect(0)
    doc = r.json()
    assert doc["launches"] == 0 and "starting sglang" not in r.err and doc["best"] == 1
    assert doc["restore"]["restarted"] is False and "already ran adaptively" in doc["restore"]["message"]
    assert standins.launcher_pids(port) == [pid]
    t = time.time()
    local_cli.run("bench", install.pkg, "--requests", "2", "--concurrency", "1", "--max-new-tokens", "16",
                  "--log-wait", "3", "--warmup", "0").expect(0)
    after = [x for x in records(logs) if x["t"] >= t]
    assert after and not any((x.get("spec") or {}).get("pinned") for x in after)
    # the same command again: its table (CSV this time), nothing started
    again = local_cli.run("sweep", install.pkg, "--live", "--grid", "speculative-num-steps=1,3", "--rounds", "1",
                          "--window", "1", *LOAD, "--csv").expect(0)
    assert "this live sweep is complete" in again.err and standins.launcher_pids(port) == [pid]
    rows = again.out.splitlines()
    assert rows[0].startswith("index,label,status,runs") and rows[2].split(",")[:4] == [
        "1", "speculative-num-steps=3", "ok", "1"]


def test_a_live_sweep_over_a_concurrency_ladder_measures_every_pair_in_one_launch(local_cli, standins, tmp_path):
    """--concurrency 1,3 with two step counts: one launch, every (concurrency, step count) pair a window of its own
    in each round, every cycle of each window pinned; the top-level figures are the first concurrency's, each
    point's loads hold both, best_by_load names a point per concurrency; an interrupted sweep resumes with the
    windows it had (the state file keys each by point, round and concurrency)."""
    install, port, _proc = adaptive_server(standins, tmp_path)
    logs = tmp_path / "logs"
    local_cli.run("apply", install.pkg, "--log-dir", str(logs), "--timeout", "60").expect(0)
    ladder = ["1,3" if k and LOAD[k - 1] == "--concurrency" else a for k, a in enumerate(LOAD)]
    args = ("sweep", install.pkg, "--live", "--grid", "speculative-num-steps=1,3", "--rounds", "2", "--window", "1",
            *ladder, "--json")
    r = local_cli.run(*args).expect(0)
    doc = r.json()
    assert doc["launches"] == 1 and doc["concurrency_ladder"] == [1, 3] and doc["best"] == 1
    assert "at each of 2 concurrencies (1, 3 requests at a time)" in r.err
    state = [json.loads(x) for x in Path(doc["state_file"]).read_text().splitlines()]
    windows = [s for s in state if s["kind"] == "run"]
    assert sorted((w["steps"], w["concurrency"], w["rep"]) for w in windows) == [
        (k, c, rep) for k in (1, 3) for c in (1, 3) for rep in (0, 1)]
    # each round holds every (concurrency, step count) pair once; the order, shuffled per round from the sweep's
    # identity (tests/unit/test_live_plan.py), is the plan's
    for rep in (0, 1):
        assert sorted((w["concurrency"], w["steps"]) for w in windows if w["rep"] == rep) == [
            (1, 1), (1, 3), (3, 1), (3, 3)]
    for p in doc["points"]:
        assert p["windows"] == 2 and p["cycles"]["other"] == 0, p  # the first concurrency's windows
        assert [ld["concurrency"] for ld in p["loads"]] == [1, 3] and all(ld["runs"] == 2 for ld in p["loads"])
        at1 = sorted(w["tokens_per_s"] for w in windows if w["steps"] == p["steps"] and w["concurrency"] == 1)
        assert p["tokens_per_s"]["median"] == pytest.approx(sum(at1) / 2, rel=1e-3), p
        # the stand-in runs each request on its own clock: 3 at a time carry about three times the tokens of 1
        lds = {ld["concurrency"]: ld["tokens_per_s"]["median"] for ld in p["loads"]}
        assert lds[3] == pytest.approx(3 * lds[1], rel=0.35), lds
    assert [b["concurrency"] for b in doc["best_by_load"]] == [1, 3] and all(b["best"] == 1
                                                                           for b in doc["best_by_load"])
    # the windows at 3 at a time ran 3 requests at once: their request ids name their step count, all pinned
    pinned = [x for x in records(logs) if (x.get("spec") or {}).get("pinned")]
    for w in windows:
        inside = [x for x in pinned if w["window"][0] <= x["t"] <= w["window"][1]]
        assert inside and {x["spec"]["steps"] for x in inside} == {w["steps"]}, w
    # the same command again: complete, nothing started; the table per concurrency
    again = local_cli.run(*args[:-1]).expect(0)
    assert "this live sweep is complete" in again.err
    assert "at 1 request(s) at a time" in again.out and "at 3 request(s) at a time" in again.out, again.out


def test_a_grid_beyond_a_running_servers_candidates_gets_the_one_launch(local_cli, standins, tmp_path):
    """Adaptive already, but 0 is no candidate of the tier its batches reach: one launch after all."""
    install, port, _proc = adaptive_server(standins, tmp_path, "--speculative-adaptive", "--speculative-num-steps", "7")
    local_cli.run("apply", install.pkg, "--timeout", "60").expect(0)
    r = local_cli.run("sweep", install.pkg, "--live", "--grid", "speculative-num-steps=0,7", "--rounds", "1",
                      "--window", "0.5", *LOAD, "--json").expect(0)
    assert r.json()["launches"] == 1


REFUSED = [
    ("not patched", WORKER, (), False, "needs the patch"),
    ("no adaptive mode", WORKER, (), True, "no adaptive speculative decoding"),
    ("top-k 4", ADAPTIVE, ("--speculative-eagle-topk", "4"), True, "top-k 1 only"),
    ("dp attention", ADAPTIVE, ("--enable-dp-attention",), True, "adaptive tier decisions are not synchronized"),
    ("two-batch overlap", ADAPTIVE, ("--enable-two-batch-overlap",), True, "--enable-two-batch-overlap"),
]


@pytest.mark.parametrize("what, worker, extra, patched, words", REFUSED, ids=[r[0] for r in REFUSED])
def test_what_adaptive_mode_cannot_run_is_refused_with_the_reason(local_cli, standins, tmp_path, what, worker,
                                                                  extra, patched, words):
    """Exit 4, one line naming the reason and what to do, nothing started or stopped, not a byte changed."""
    install = make_install(standins, tmp_path / "install", "venv-by-path", worker=worker)
    spec = SPEC[:4] if "--speculative-eagle-topk" in extra else SPEC  # the shape's own top-k instead of 1
    port, _proc = up(install, standins, tmp_path / "work", *spec, *extra)
    if patched:
        local_cli.run("apply", install.pkg, "--timeout", "60").expect(0)
    [pid] = standins.launcher_pids(port)
    files = digest(install.pkg)
    r = local_cli.run("sweep", install.pkg, "--live", *GRID, "--rounds", "1", "--window", "1", *LOAD)
    assert r.rc == 4, r
    assert words in r.err and len(r.err.strip().splitlines()) == 1 and r.err.startswith("eaglepatch: "), r
    assert standins.launcher_pids(port) == [pid] and digest(install.pkg) == files


@pytest.mark.parametrize("args, words", [
    (["--live", "--grid", "speculative-eagle-topk=1,2"], "one axis"),
    (["--live", *GRID, "--baseline"], "--baseline does not go with --live"),
    (["--live", *GRID, "--repeat", "3"], "--repeat does not go with --live"),
    (["--live", *GRID, "--env", "X=1,2"], "--env does not go with --live"),
    (["--live", *GRID, "--keep-best"], "--keep-best does not go with --live"),
    (["--live", "--grid", "speculative-num-steps=3"], "two step counts or more"),
    (["--live", *GRID, "--window", "0"], "--window must be a positive"),
    (["--live", *GRID, "--rounds", "0"], "--rounds must be 1 or more"),
    ([*GRID, "--rounds", "2"], "--rounds goes with --live"),
    ([*GRID, "--emit-adaptive-config", "x.json"], "--emit-adaptive-config goes with --live"),
    (["--live", *GRID, "--emit-adaptive-config", "/no/such/folder/x.json"], "no folder"),
])
def test_bad_live_input_exits_2_before_anything_is_touched(local_cli, standins, tmp_path, args, words):
    install, port, _proc = adaptive_server(standins, tmp_path)
    [pid] = standins.launcher_pids(port)
    r = local_cli.run("sweep", install.pkg, *args, *LOAD)
    assert r.rc == 2 and words in r.err, r
    assert standins.launcher_pids(port) == [pid]


def test_the_0_5_16_crash_is_why_the_launch_takes_the_largest_step_count(standins, tmp_path):
    """The stand-in, as sglang 0.5.16, does not start when a candidate is above --speculative-num-steps: the
    launch a live sweep makes names the largest (the test above sees it start)."""
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"1": {"candidate_steps": [1, 3, 7]}}))
    install = make_install(standins, tmp_path / "install", "venv-by-path", worker=ADAPTIVE)
    port = standins.port()
    proc = install.launch(tmp_path / "w", port, "--speculative-algorithm", "EAGLE3", "--speculative-adaptive",
                          "--speculative-adaptive-config", str(cfg), "--speculative-num-steps", "3")
    assert proc.wait(30) == 1
    log = (tmp_path / "w" / f"stand-in-{port}.log").read_text()
    assert "shared logits buffer holds 192 rows but caller needs 448" in log


def test_a_client_killed_inside_a_window_leaves_the_server_to_sglangs_policy(local_cli, standins, tmp_path):
    """SIGKILL of eaglepatch while a window's pinned requests run: their connections close, the stand-in ends
    them, and the next requests' cycles are sglang's own (not pinned) although the lease is still there; status
    names the adaptive launch and the lock; the same sweep run again measures in that launch (no second one) and
    puts the original server back."""
    install, port, _proc = adaptive_server(standins, tmp_path)
    logs = tmp_path / "logs"
    local_cli.run("apply", install.pkg, "--log-dir", str(logs), "--timeout", "60").expect(0)
    [patched] = standins.launcher_pids(port)
    original = identity(patched)
    args = ["sweep", str(install.pkg), "--live", *GRID, "--rounds", "1", "--window", "3", *LOAD]
    p = subprocess.Popen([*EAGLEPATCH, *args], env=local_cli.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not any((x.get("spec") or {}).get("pinned") for x in records(logs)):
            assert p.poll() is None, p.communicate()
            assert time.monotonic() < deadline, "no pinned cycle was ever written"
            time.sleep(0.1)
        p.send_signal(signal.SIGKILL)
    finally:
        p.wait(10)
    assert list(logs.glob("live-*.json")), "the killed sweep's lease is still there (it runs out by itself)"
    time.sleep(0.5)  # the stand-in notices the closed connections at its next streamed chunk
    t = time.time()
    local_cli.run("bench", install.pkg, "--requests", "2", "--concurrency", "1", "--max-new-tokens", "16",
                  "--log-wait", "3", "--warmup", "0").expect(0)
    after = [x for x in records(logs) if x["t"] >= t]
    assert after and not any((x.get("spec") or {}).get("pinned") for x in after), after[:3]
    status = local_cli.run("status", install.pkg, "--json").expect(0).json()
    assert status["lock"]["what"] == "sweep" and "--speculative-adaptive" in status["servers"][0]["argv"]
    r = local_cli.run("sweep", *args[1:]).expect(0)
    # the adaptive server running is the killed sweep's own launch: measured in, not launched again
    assert "one launch, adaptive" not in r.err and r.err.count("starting sglang on") == 1, r
    [back] = standins.launcher_pids(port)
    assert identity(back) == original and not list(logs.glob("live-*"))


def test_no_marked_request_goes_out_before_every_rank_has_answered(local_cli, standins, tmp_path):
    """A server of 2 TP ranks whose second rank never answers the lease (the stand-in's TP children run no worker):
    the sweep waits for both, then stops (exit 4, naming 1 of 2 ranks) without sending a window's request (ranks
    holding different step counts in one cycle would break the server's collectives), and puts the original
    server back."""
    install, port, _proc = adaptive_server(standins, tmp_path, "--tp", "2")
    logs = tmp_path / "logs"
    local_cli.run("apply", install.pkg, "--log-dir", str(logs), "--timeout", "60").expect(0)
    [patched] = standins.launcher_pids(port)
    before = identity(patched)
    r = local_cli.run("sweep", install.pkg, "--live", *GRID, "--rounds", "1", "--window", "1", *LOAD)
    assert r.rc == 4 and "answers from 1 of 2 rank(s)" in r.err, r
    assert "putting the server back: the original command line" in r.err
    assert not any((x.get("spec") or {}).get("pinned") for x in records(logs))
    [back] = standins.launcher_pids(port)
    assert identity(back) == before and not list(logs.glob("live-*.json"))
