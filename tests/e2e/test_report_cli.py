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
           verify: float = 2.0, extend: float = 0.5, accepted: int | None = 3, run: str | None = "gpu1-9-500-cfg1",
           timer: str = "sync") -> str:
    """One record; ``run``: the launch it belongs to (every rank of one launch shares it)."""
    phases = {"draft": draft, "verify": verify, "draft_extend": extend} if mode == "decode" else {
        "target": verify, "draft_extend": extend}
    cycle = sum(phases.values()) + 0.1
    doc = {"v": 1, "t": t, "host": "gpu1", "pid": pid, "rank": rank, "worker": "EAGLEWorkerV2", "mode": mode,
           "bs": bs, "cycle_ms": round(cycle, 4), "timer": timer, "phases": phases, "accepted": accepted}
    if run is not None:
        doc["run"] = run
    return json.dumps(doc) + "\n"


def header(run: str, t: float, pid: int, rank: int, timer: str, steps: str) -> str:
    """The line the runtime writes when it opens a log: which launch, with which flags and timer."""
    return json.dumps({"v": 1, "kind": "run", "run": run, "t": t, "host": "gpu1", "pid": pid, "rank": rank,
                       "timer": timer, "flags": {"speculative-algorithm": "EAGLE3",
                                                 "speculative-num-steps": steps}}) + "\n"


def write_log(folder: Path, name: str, lines: list[str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / name
    with open(p, "a") as f:
        f.writelines(lines)
    return p


def bare_install(root: Path) -> str:
    """An sglang package with no server, for --sglang-path: a TARGET names its install, so that the servers of
    other installs that happen to run on this machine (other checkouts' tests) are not the report's "current"."""
    pkg = root / "bare install" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("__version__ = '0.0.0'\n")
    return str(pkg)


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eaglepatch", *args], capture_output=True, text=True, env=env,
                          timeout=120)


def test_local_folder_json_table_csv_and_bad_lines(tmp_path):
    """Two ranks of one launch (one run) merge; a garbage line is counted, never fatal; the numbers are the
    hand-computed ones."""
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


def test_runs_are_never_blended(tmp_path):
    """Three launches logged into one folder (the H200 case: an agreeing draft with the sync timer, a random
    draft with events, the agreeing draft with events): three groups, each headed by its launch, accept lengths
    5.93, 1.00 and 5.93 kept apart; --merge-runs blends them and says so; --run and --since pick."""
    logs = tmp_path / "logs"
    runs = [("gpu1-100-1000-aaaa", 1000.0, "sync", 593), ("gpu1-200-2000-bbbb", 2000.0, "events", 100),
            ("gpu1-300-3000-cccc", 3000.0, "events", 593)]
    for i, (rid, t0, timer, acc) in enumerate(runs):
        pid = 100 * (i + 1)
        write_log(logs, f"gpu1-{pid}-rank0.jsonl", [header(rid, t0, pid, 0, timer, "5")] + [
            record(t0 + 1 + k * 0.01, pid=pid, bs=100, accepted=acc, run=rid, timer=timer) for k in range(10)])
    doc = json.loads(run("report", "--json", str(logs)).stdout)
    decode = [g for g in doc["groups"] if g["mode"] == "decode"]
    assert [g["accept_len"] for g in decode] == [5.93, 1.0, 5.93]
    assert [g["key"]["run"] for g in decode] == [r[0] for r in runs]
    assert [(r["id"], r["timer"]) for r in doc["runs"]] == [(r[0], r[2]) for r in runs]
    text = run("report", str(logs)).stdout
    assert text.count("\nrun ") + text.startswith("run ") == 3 and "timer=events" in text
    r = run("report", "--json", "--merge-runs", str(logs))
    merged = [g for g in json.loads(r.stdout)["groups"] if g["mode"] == "decode"]
    assert len(merged) == 1 and merged[0]["accept_len"] == pytest.approx((593 + 100 + 593) / 300, abs=0.01)
    assert "merged 3 runs" in run("report", "--merge-runs", str(logs)).stdout
    only = json.loads(run("report", "--json", "--run", "gpu1-200", str(logs)).stdout)
    assert [g["accept_len"] for g in only["groups"]] == [1.0]
    since = json.loads(run("report", "--json", "--since", "2500", str(logs)).stdout)
    assert [r["id"] for r in since["runs"]] == ["gpu1-300-3000-cccc"]
    bad = run("report", "--run", "nope", str(logs))
    assert bad.returncode == 2 and "gpu1-100-1000-aaaa" in bad.stderr
    assert run("report", "--merge-runs", "--all-runs", str(logs)).returncode == 2


def test_compare_writes_one_trace_per_source(tmp_path):
    """--trace with --compare: a trace for each source (t.1.json, t.2.json), never silently none."""
    before, after = tmp_path / "before", tmp_path / "after"
    write_log(before, "a-1-rank0.jsonl", [record(100 + i * 0.01, draft=2.0, run="a-1-1-x") for i in range(5)])
    write_log(after, "a-2-rank0.jsonl", [record(200 + i * 0.01, draft=1.0, run="a-2-2-x") for i in range(5)])
    trace = tmp_path / "t.json"
    r = run("report", "--compare", "--trace", str(trace), str(before), str(after))
    assert r.returncode == 0, r.stderr
    for n in (1, 2):
        events = json.loads((tmp_path / f"t.{n}.json").read_text())["traceEvents"]
        assert sum(1 for e in events if e.get("ph") == "X" and e["name"] == "draft") == 5
    assert not trace.exists()
    chart = tmp_path / "phases.svg"
    r = run("report", "--compare", "--chart", str(chart), str(before), str(after))
    assert r.returncode == 0 and chart.read_text().lstrip().startswith("<"), r.stderr
    assert run("report", "--chart", str(chart), str(before)).returncode == 2  # a chart needs --compare


def test_usage_errors(tmp_path):
    """Bad options exit 2 with a one-line message."""
    assert run("report", "--compare", str(tmp_path)).returncode == 2
    assert run("report", "--by", "gpu", str(tmp_path)).returncode == 2
    r = run("report", str(tmp_path / "missing"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1


def test_predict_through_the_cli(tmp_path):
    """report --predict: the table gains the acceptance profile and the prediction per decode group, --json the
    contract's "acceptance", "predict" and "predict_best", --steps picks the step counts, and --chart draws them
    (the chart written, its path said on stderr). A group of fewer than 50 decode cycles predicts nothing and says
    why."""
    logs = tmp_path / "logs"
    lines = [header("gpu1-9-500-cfg1", 99.0, 10, 0, "sync", "3")]
    for i in range(60):
        acs = [1 + i % 4, 1 + (i + 1) % 4]
        lines.append(record(100 + i * 0.01, bs=2, accepted=sum(acs)).replace('"accepted"', f'"accepts": {acs}, '
                                                                                          '"accepted"'))
    write_log(logs, "gpu1-10-rank0.jsonl", lines)
    r = run("report", str(logs), "--predict", "--steps", "0-4", "--chart", str(tmp_path / "p.svg"))
    assert r.returncode == 0, r.stderr
    assert "acceptance (120 request-cycles): at least 1: 1.00  2: 0.75  3: 0.50  4: 0.25" in r.stdout
    assert "per draft step count" in r.stdout and "extrapolated" in r.stdout
    assert f"chart written to {tmp_path / 'p.svg'}" in r.stderr and (tmp_path / "p.svg").read_text().startswith("<?xml")
    doc = json.loads(run("report", str(logs), "--predict", "--json").stdout)
    (g,) = doc["groups"]
    assert g["acceptance"]["samples"] == 120 and g["acceptance"]["at_least"] == [1.0, 0.75, 0.5, 0.25]
    assert [p["steps"] for p in g["predict"]] == list(range(9))
    assert {p["basis"] for p in g["predict"]} == {"estimate", "profile", "measured", "extrapolated"}
    assert g["predict"][3]["basis"] == "measured" and g["predict"][3]["accept_len"] == 2.5
    assert isinstance(g["predict_best"], int)
    few = tmp_path / "few"
    write_log(few, "gpu1-10-rank0.jsonl", lines[:41])
    r = run("report", str(few), "--predict")
    assert r.returncode == 0 and ("prediction: none: only 40 decode cycle(s) recorded, too few to predict from (at "
                                  "least 50): load the server first (eaglepatch bench)") in r.stdout


@pytest.mark.parametrize("args, message", [
    (["--steps", "1,2"], "--steps goes with --predict"),
    (["--predict", "--csv"], "--predict prints a table or --json"),
    (["--predict", "--steps", "x"], "--steps 'x': give step counts"),
    (["--chart", "c.svg"], "--chart goes with --compare or --predict"),
])
def test_predict_usage_errors(tmp_path, args, message):
    logs = tmp_path / "logs"
    write_log(logs, "gpu1-10-rank0.jsonl", [record(100.0)])
    r = run("report", str(logs), *args)
    assert r.returncode == 2 and message in r.stderr and r.stdout == ""


def test_target_logs_are_fetched_incrementally_over_ssh(sshd, ssh_env, tmp_path):
    """report TARGET fetches the logs over SSH into a local cache; a second report fetches only what is new, and
    a line still being written (no newline yet) waits for the next report."""
    remote = tmp_path / "remote logs"
    f0 = write_log(remote, "gpu1-10-rank0.jsonl", [record(100 + i * 0.01) for i in range(50)])
    env = dict(ssh_env, XDG_CACHE_HOME=str(tmp_path / "cache"))
    args = ["report", "--json", "--log-dir", str(remote), "-i", sshd.client_key, sshd.target,
            "--sglang-path", bare_install(tmp_path)]
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


def test_a_cold_report_over_ssh_aggregates_while_it_fetches_with_the_local_reports_numbers(sshd, ssh_env, tmp_path):
    """A log of several batches (more than LOG_BATCH), fetched into an empty cache: aggregated while it arrives
    (ops.follow, said with EAGLEPATCH_DEBUG), with the very numbers of the report of the same files here, and of
    a report that aggregates after the fetch (EAGLEPATCH_FOLLOW=0)."""
    remote = tmp_path / "remote logs"
    for rank in range(2):
        write_log(remote, f"gpu1-10-rank{rank}.jsonl",
                  [header("gpu1-10-500-aaaaaaaa", 99, 10, rank, "sync", "3")]
                  + [record(100 + i * 0.01, rank=rank, bs=1 + i % 4, draft=1 + i % 5 * 0.1, accepted=i % 4,
                            run="gpu1-10-500-aaaaaaaa") for i in range(20000)])
    assert sum(p.stat().st_size for p in remote.iterdir()) > (8 << 20)
    args = ["report", "--json", "--by", "bs", "--log-dir", str(remote), "-i", sshd.client_key, sshd.target,
            "--sglang-path", bare_install(tmp_path)]
    docs = []
    for follow in ("1", "0"):
        env = dict(ssh_env, XDG_CACHE_HOME=str(tmp_path / f"cache{follow}"), EAGLEPATCH_DEBUG="1",
                   EAGLEPATCH_FOLLOW=follow)
        r = run(*args, env=env)
        assert r.returncode == 0, r.stderr
        assert ("aggregated while fetching" in r.stderr) == (follow == "1"), r.stderr
        docs.append(json.loads(r.stdout))
    here = json.loads(run("report", "--json", "--by", "bs", str(remote)).stdout)
    assert docs[0]["records"] == 40000
    for doc in (*docs, here):
        doc.pop("sources")
    assert docs[0] == docs[1] == here


def test_the_cache_is_per_log_dir_and_forgets_deleted_files(sshd, ssh_env, tmp_path):
    """report TARGET --log-dir A, then --log-dir B: B's records only (the cache is keyed by target and log dir);
    a log deleted on the host does not come back from the cache."""
    a, b = tmp_path / "a", tmp_path / "b"
    fa = write_log(a, "gpu1-10-rank0.jsonl", [record(100 + i * 0.01) for i in range(4)])
    write_log(b, "gpu1-10-rank0.jsonl", [record(200 + i * 0.01) for i in range(9)])
    env = dict(ssh_env, XDG_CACHE_HOME=str(tmp_path / "cache"))
    common = ["report", "--json", "--all-runs", "-i", sshd.client_key, sshd.target, "--sglang-path",
              bare_install(tmp_path), "--log-dir"]
    assert json.loads(run(*common, str(a), env=env).stdout)["records"] == 4
    assert json.loads(run(*common, str(b), env=env).stdout)["records"] == 9
    write_log(a, "gpu1-11-rank1.jsonl", [record(100 + i * 0.01, pid=11, rank=1) for i in range(3)])
    assert json.loads(run(*common, str(a), env=env).stdout)["records"] == 7
    fa.unlink()
    assert json.loads(run(*common, str(a), env=env).stdout)["records"] == 3


def test_a_local_install_is_a_source_like_a_remote_target(tmp_path):
    """report PATH of an sglang install (not a folder of logs) reads its timing logs as `report TARGET` does:
    --log-dir, else the folder its manifest names."""
    harness = _harness()
    tree = harness.make_tree(tmp_path / "site", harness.V1_WORKER)
    logs = tmp_path / "logs"
    write_log(logs, "gpu1-10-rank0.jsonl", [record(100 + i * 0.01) for i in range(6)])
    env = dict(__import__("os").environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    r = run("report", "--json", "--log-dir", str(logs), str(tree / "sglang"), env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["records"] == 6
    r = run("apply", "--no-restart", "--log-dir", str(logs), str(tree / "sglang"), env=env)
    assert r.returncode == 0, r.stderr
    r = run("report", "--json", str(tree), env=env)  # the manifest says where the logs are
    assert r.returncode == 0 and json.loads(r.stdout)["records"] == 6, r.stderr
    # beside a folder of logs: the install (no server runs) shows its newest run, the folder every run of its own
    write_log(logs, "gpu1-11-rank0.jsonl", [record(200 + i * 0.01, pid=11, run="gpu1-11-600-cfg2") for i in range(4)])
    other = tmp_path / "other"
    write_log(other, "gpu2-5-rank0.jsonl", [record(50 + i * 0.01, pid=5, run="gpu2-5-1-aaaa") for i in range(3)]
              + [record(60 + i * 0.01, pid=5, run="gpu2-5-2-bbbb") for i in range(2)])
    r = run("report", "--json", str(other), str(tree), env=env)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert sorted(x["id"] for x in doc["runs"]) == ["gpu1-11-600-cfg2", "gpu2-5-1-aaaa", "gpu2-5-2-bbbb"]
    assert doc["records"] == 4 + 3 + 2


def test_target_without_logs_is_a_one_line_error(sshd, ssh_env, tmp_path):
    env = dict(ssh_env, XDG_CACHE_HOME=str(tmp_path / "cache"))
    r = run("report", "--log-dir", str(tmp_path / "none"), "-i", sshd.client_key, sshd.target, "--sglang-path",
            bare_install(tmp_path), env=env)
    assert r.returncode == 2
    assert "no timing logs" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def runtime_header(run: str, t: float, pid: int, runtime: str) -> str:
    """A run header as the runtime writes it since issue 24: it names the runtime module (inside its install)."""
    return json.dumps({"v": 1, "kind": "run", "run": run, "t": t, "host": "gpu1", "pid": pid, "rank": 0,
                       "timer": "sync", "flags": {}, "runtime": runtime}) + "\n"


def test_the_server_that_runs_now_without_records_is_said_not_another_servers_run(sshd, ssh_env, standins, tmp_path):
    """A server of the install runs and has timed nothing; the log folder holds another server's run: report says
    so in one line (exit 2) and shows nothing. Before: "the newest run is shown", another server's numbers as if
    they were this one's."""
    harness = _harness()
    tree = harness.make_tree(tmp_path / "site", harness.V1_WORKER)
    port = standins.port()
    standins.launch(tree, tmp_path / "work", port, "--startup-delay", "0.2", "--tp", "1")
    harness.wait_http(port, timeout=30)
    logs = tmp_path / "logs"
    write_log(logs, "gpu1-777-rank0.jsonl", [record(100 + i * 0.01, pid=777, run="gpu1-777-1-other")
                                             for i in range(5)])
    env = dict(ssh_env, XDG_CACHE_HOME=str(tmp_path / "cache"))
    r = run("report", "--log-dir", str(logs), "-i", sshd.client_key, sshd.target, "--sglang-path",
            str(tree / "sglang"), env=env)
    assert r.returncode == 2 and r.stdout == "", r
    last = r.stderr.strip().splitlines()[-1]
    assert "the server that runs now (pid" in last and f"on :{port}" in last and "no timing record" in last, last
    assert "--all-runs" in last and "Traceback" not in r.stderr
    doc = json.loads(run("report", "--json", "--all-runs", "--log-dir", str(logs), "-i", sshd.client_key, sshd.target,
                         "--sglang-path", str(tree / "sglang"), env=env).stdout)
    assert [x["id"] for x in doc["runs"]] == ["gpu1-777-1-other"]  # still there when asked for


def test_with_no_server_the_newest_run_is_this_installs(tmp_path):
    """No server of the install runs: its newest run is shown, never a newer one whose header names another
    install's runtime (two installs' servers share the default log folder)."""
    harness = _harness()
    tree = harness.make_tree(tmp_path / "site", harness.V1_WORKER)
    pkg = (tree / "sglang").resolve()
    mine = str(pkg / "srt" / "speculative" / "_eaglepatch_runtime.py")
    theirs = str(tmp_path / "other" / "sglang" / "srt" / "speculative" / "_eaglepatch_runtime.py")
    logs = tmp_path / "logs"
    write_log(logs, "gpu1-10-rank0.jsonl", [runtime_header("gpu1-10-1-mine", 100, 10, mine)]
              + [record(100 + i * 0.01, pid=10, run="gpu1-10-1-mine") for i in range(4)])
    write_log(logs, "gpu1-20-rank0.jsonl", [runtime_header("gpu1-20-1-theirs", 200, 20, theirs)]
              + [record(200 + i * 0.01, pid=20, run="gpu1-20-1-theirs", draft=900.0) for i in range(6)])
    env = dict(__import__("os").environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    r = run("report", "--json", "--log-dir", str(logs), str(pkg), env=env)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [x["id"] for x in doc["runs"]] == ["gpu1-10-1-mine"] and doc["records"] == 4, doc["runs"]


def test_several_sources_say_whose_each_run_is(tmp_path):
    """Two folders in one report: each run's table says which SOURCE it came from, and so does its JSON."""
    a, b = tmp_path / "host a", tmp_path / "host b"
    write_log(a, "gpu1-1-rank0.jsonl", [record(100 + i * 0.01, pid=1, run="gpu1-1-1-x") for i in range(3)])
    write_log(b, "gpu2-2-rank0.jsonl", [record(200 + i * 0.01, pid=2, run="gpu2-2-2-y") for i in range(3)])
    r = run("report", str(a), str(b))
    assert r.returncode == 0, r.stderr
    titles = [ln for ln in r.stdout.splitlines() if ln.startswith("run ")]
    assert len(titles) == 2 and titles[0].endswith(f"from {a}") and titles[1].endswith(f"from {b}"), titles
    doc = json.loads(run("report", "--json", str(a), str(b)).stdout)
    assert [x["sources"] for x in doc["runs"]] == [[str(a)], [str(b)]]


def _harness():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "standin_harness", Path(__file__).resolve().parents[1] / "stubs" / "stand_in_sglang" / "standin_harness.py")
    harness = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(harness)
    return harness


def test_a_remote_target_and_a_local_folder_each_label_their_runs(sshd, ssh_env, tmp_path):
    """report TARGET FOLDER: the target's logs come over SSH, the folder's are read here; each run's table and its
    JSON say whose it is (the TARGET as given, the folder's path), and the text of one never labels the other's."""
    remote, here = tmp_path / "remote logs", tmp_path / "local logs"
    write_log(remote, "gpu1-10-rank0.jsonl", [record(100 + i * 0.01, pid=10, run="gpu1-10-1-x") for i in range(4)])
    write_log(here, "gpu2-20-rank0.jsonl", [record(200 + i * 0.01, pid=20, run="gpu2-20-2-y") for i in range(6)])
    env = dict(ssh_env, XDG_CACHE_HOME=str(tmp_path / "cache"))
    common = ["--all-runs", "--log-dir", str(remote), "-i", sshd.client_key, "--sglang-path", bare_install(tmp_path),
              sshd.target, str(here)]
    r = run("report", *common, env=env)
    assert r.returncode == 0, r.stderr
    titles = [ln for ln in r.stdout.splitlines() if ln.startswith("run ")]
    assert len(titles) == 2, r.stdout
    assert titles[0].endswith(f"from {sshd.target}") and titles[1].endswith(f"from {here}"), titles
    doc = json.loads(run("report", "--json", *common, env=env).stdout)
    by_run = {x["id"]: x["sources"] for x in doc["runs"]}
    assert by_run == {"gpu1-10-1-x": [sshd.target], "gpu2-20-2-y": [str(here)]}
    assert doc["records"] == 10
