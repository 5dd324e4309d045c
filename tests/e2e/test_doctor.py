"""``eaglepatch doctor`` end to end: the installed CLI over the real sshd of conftest.py (and once on a local
path), against stand-in sglang servers (tests/stubs/stand_in_sglang) whose command lines, model configs (config.json
files written here and passed as --model-path / --speculative-draft-model-path), environment, log lines
(``--sim-sglang-log``: sglang's ``server_args=`` and ``Decode batch`` lines) and timing records reproduce each
finding that a stand-in can show without a GPU, beside a healthy counterpart. The finding ids of ``doctor --json``
are checked exactly, per server: a finding missing, or one too many (a false alarm), fails.

What only a GPU (or several ranks) produces is covered by the unit tests on facts (tests/unit/test_doctor_rules.py):
the sync and events timers' records (sync-on-overlap, host-bound from host/GPU times) and records of two ranks
(rank-skew). benchmarks/gpu/doctor_story.py proves the rest on a real H200.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from safety import CLI, H, digest, make_install

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

TARGET_CFG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 1024, "vocab_size": 32000,
              "max_position_embeddings": 4096}
DRAFT_CFG = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 1024,
             "vocab_size": 32000, "draft_vocab_size": 8000, "max_position_embeddings": 4096}
LOAD = ["--requests", "8", "--concurrency", "4", "--input-len", "16", "--max-new-tokens", "32", "--warmup", "0",
        "--log-wait", "0"]


@pytest.fixture
def cli(ssh_cli) -> CLI:
    """The CLI over the real sshd, with a client cache of this test's own (sweep state, fetched logs): conftest.py's
    ``ssh_cli``."""
    return ssh_cli


def models(root: Path, target: dict | None = None, draft: dict | None = None) -> tuple[str, str]:
    """A target and a draft model folder holding only config.json (what doctor reads of them)."""
    out = []
    for name, cfg in (("target", target or TARGET_CFG), ("draft", draft or DRAFT_CFG)):
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text(json.dumps(cfg))
        out.append(str(d))
    return out[0], out[1]


def spec(target: str, draft: str, algorithm: str = "EAGLE3", steps: int = 3, *extra: str) -> list[str]:
    return ["--model-path", target, "--speculative-algorithm", algorithm, "--speculative-draft-model-path", draft,
            "--speculative-num-steps", str(steps), "--speculative-eagle-topk", "1", "--sim-sglang-log",
            "--decode-log-interval", "5", *extra]


class Install:
    """One stand-in install (a checkout on PYTHONPATH) and the servers launched from it, by port."""

    def __init__(self, standins, root: Path):
        self.standins, self.root = standins, root
        self.inst = make_install(standins, root / "install", "pythonpath")
        self.pkg = self.inst.pkg
        self.procs: dict[int, object] = {}

    def up(self, name: str, *args: str, **env: str) -> int:
        port = self.standins.port()
        self.procs[port] = self.inst.launch(self.root / f"work {name}", port, "--startup-delay", "0.2", "--tp", "1",
                                            *args, **env)
        H.wait_http(port, timeout=30)
        return port


def doctor(cli: CLI, pkg: Path, *args: str) -> dict | list:
    r = cli.run("doctor", pkg, "--json", *args)
    assert r.rc == 0, r
    return r.json()


def by_port(doc) -> dict[int, set[str]]:
    docs = doc if isinstance(doc, list) else [doc]
    return {d["server"]["port"]: {f["id"] for f in d["findings"]} for d in docs}


def load(cli: CLI, pkg: Path, port: int, *extra: str) -> None:
    r = cli.run("bench", pkg, "--server-port", str(port), *LOAD, *extra)
    assert r.rc == 0, r


# ----------------------------------------------------------------------------------------------------------------


def test_an_eagle3_draft_launched_as_eagle(cli, standins, tmp_path):
    """Two servers of one install, the same EAGLE-3 draft (its config.json says LlamaForCausalLMEagle3): launched
    with --speculative-algorithm EAGLE its drafts are never accepted (accept len 1.00 in its log and
    /server_info); launched with EAGLE3, 3.2. doctor lists both servers: the first gets eagle3-draft-as-eagle and
    accept-length-low, the second neither; both get not-patched (no timing records). --server-port picks one (a
    single document); the text names the finding with its evidence lines and next step. doctor changed nothing:
    every byte of the install, the same server processes, no lock."""
    ins = Install(standins, tmp_path)
    target, draft = models(tmp_path / "models")
    bad = ins.up("eagle", *spec(target, draft, "EAGLE"), "--accept-length", "1.0")
    good = ins.up("eagle3", *spec(target, draft, "EAGLE3"))
    load(cli, ins.pkg, bad)
    load(cli, ins.pkg, good)
    before = digest(ins.pkg.parent)
    pids = {p: proc.pid for p, proc in ins.procs.items()}

    doc = doctor(cli, ins.pkg)
    assert isinstance(doc, list) and len(doc) == 2
    assert by_port(doc) == {bad: {"eagle3-draft-as-eagle", "accept-length-low", "not-patched"},
                            good: {"not-patched"}}
    first = next(d for d in doc if d["server"]["port"] == bad)
    assert first["server"]["pid"] == pids[bad] and "--speculative-algorithm" in first["server"]["argv"]
    assert [f["severity"] for f in first["findings"]] == ["high", "high", "info"]
    algo = first["findings"][0]
    assert algo["id"] == "eagle3-draft-as-eagle" and "--speculative-algorithm EAGLE3" in algo["next"]
    assert {"source": "config", "path": f"{draft}/config.json",
            "text": "the draft's architectures: ['LlamaForCausalLMEagle3'] (an EAGLE-3 draft)"} in algo["evidence"]
    low = first["findings"][1]
    lines = [e["line"] for e in low["evidence"] if e.get("line")]
    assert lines and all("accept len: 1.00" in ln for ln in lines)
    assert first["sources"]["server_info"] == "/server_info"
    assert first["sources"]["server_log"]["path"].endswith(f"stand-in-{bad}.log")

    one = doctor(cli, ins.pkg, "--server-port", str(good))
    assert isinstance(one, dict) and by_port(one) == {good: {"not-patched"}}
    text = cli.run("doctor", ins.pkg, "--server-port", str(bad)).expect(0).out
    assert "HIGH   eagle3-draft-as-eagle: an EAGLE-3 draft (LlamaForCausalLMEagle3)" in text
    assert "| [" in text and "accept len: 1.00" in text and "next: relaunch the server with" in text

    assert digest(ins.pkg.parent) == before
    assert {p: pid for p, pid in pids.items() if H.alive(pid)} == pids
    assert sorted(H.launcher_pids(bad) + H.launcher_pids(good)) == sorted(pids.values())
    assert not (ins.pkg / "srt" / "speculative" / ".eaglepatch.lock").exists()


def test_draft_configs_and_tp_settings(cli, standins, tmp_path):
    """Findings from the configs, the command line and the environment alone (no load): a draft whose vocabulary
    differs from the target's (draft-mismatch); a draft trained for 2048 tokens on a target of 8192, with
    SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 (draft-context-short); TP 2 with --disable-custom-all-reduce
    (tp-communication); TP 2 as launched by default (nothing but not-patched)."""
    ins = Install(standins, tmp_path)
    t1, d1 = models(tmp_path / "vocab", draft=dict(DRAFT_CFG, vocab_size=32064))
    t2, d2 = models(tmp_path / "ctx", target=dict(TARGET_CFG, max_position_embeddings=8192),
                    draft=dict(DRAFT_CFG, max_position_embeddings=2048))
    t3, d3 = models(tmp_path / "fine")
    mismatch = ins.up("vocab", *spec(t1, d1))
    short = ins.up("ctx", *spec(t2, d2), SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN="1")
    car = ins.up("car", *spec(t3, d3), "--tp", "2", "--disable-custom-all-reduce")
    tp2 = ins.up("tp2", *spec(t3, d3), "--tp", "2")
    doc = doctor(cli, ins.pkg)
    assert by_port(doc) == {mismatch: {"draft-mismatch", "not-patched"},
                            short: {"draft-context-short", "not-patched"},
                            car: {"tp-communication", "not-patched"},
                            tp2: {"not-patched"}}
    ctx = next(f for d in doc for f in d["findings"] if f["id"] == "draft-context-short")
    assert "2048" in ctx["title"] and "8192" in ctx["title"]
    assert {"source": "environment", "text": "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1: sglang's refusal of a "
            "longer context was overridden"} in ctx["evidence"]
    vocab = next(f for d in doc for f in d["findings"] if f["id"] == "draft-mismatch")
    assert "vocab_size: target 32000, draft 32064" in [e["text"] for e in vocab["evidence"]]


@pytest.mark.parametrize("via", ["ssh", "local"])
def test_cuda_graph_off(request, standins, tmp_path, via):
    """--disable-cuda-graph (no load needed); --cuda-graph-max-bs 2 under a load of 4 requests at a time (the
    decode lines say cuda graph: False with 4 running); --cuda-graph-max-bs 8 under the same load (True):
    cuda-graph-off for the first two only."""
    cli = request.getfixturevalue(f"{via}_cli")  # conftest.py's local_cli or ssh_cli
    ins = Install(standins, tmp_path)
    target, draft = models(tmp_path / "models")
    off = ins.up("off", *spec(target, draft), "--disable-cuda-graph")
    small = ins.up("small", *spec(target, draft), "--cuda-graph-max-bs", "2")
    big = ins.up("big", *spec(target, draft), "--cuda-graph-max-bs", "8")
    load(cli, ins.pkg, small)
    load(cli, ins.pkg, big)
    doc = doctor(cli, ins.pkg)
    assert by_port(doc) == {off: {"cuda-graph-off", "not-patched"}, small: {"cuda-graph-off", "not-patched"},
                            big: {"not-patched"}}
    found = {d["server"]["port"]: next(f for f in d["findings"] if f["id"] == "cuda-graph-off")
             for d in doc if d["server"]["port"] in (off, small)}
    assert found[off]["severity"] == "high" and found[off]["next"] == "relaunch without --disable-cuda-graph"
    assert "--cuda-graph-max-bs 4" in found[small]["next"]
    assert any("cuda graph: False" in (e.get("line") or "") for e in found[small]["evidence"])


@pytest.mark.serial  # its stand-ins' rates decide the findings: alone, not beside the parallel tests
def test_patched_servers_timing_records(cli, standins, tmp_path):
    """After apply (one install, four servers, all restarted on the patched files) and a sequential load: the
    scheduler's work between cycles at 10 ms against a 13 ms cycle (--sim-between-ms 10) is host-bound (3 steps
    accepting 3 or 4 tokens a cycle: neither fewer nor more steps pay), and so slow that no speculation is
    predicted faster (3.5 tokens in 23 ms against one in a 6 ms verify: the stand-in's own truth is one token in
    5 ms); 5 draft steps at accept length about 3.2
    (3 tokens in 4 cycles of 5, 4 in the fifth: positions 4 and 5 buy almost nothing at 4 ms a step) are
    too-many-steps (2 favoured by the model: about 20% more tok/s, so a busy test machine's extra time between
    cycles does not hide it), and speculation-unproven (the model's best, 2 steps, predicted about 16% over the
    no-speculation estimate, inside its 30%: the stand-in at 2 steps gives 3 tokens in 15 ms, no faster than its
    no speculation, one token in 5 ms); 2 steps of 1.5 ms accepting 2 or 3 tokens a cycle (accept length 2.7 in
    10 ms: about 40% over the no-speculation estimate, beyond its 30% band, and 3 steps no faster) give no finding at
    all (with 2-ms steps, 2.7 in 11 ms, the measured +30% sat on the band's edge: 5 runs of 9 were unproven); a
    server that was not loaded has no-timing-records."""
    ins = Install(standins, tmp_path)
    target, draft = models(tmp_path / "models")
    ports = {"host": ins.up("host", *spec(target, draft, "EAGLE3", 3), "--sim-between-ms", "10",
                            "--accept-length", "3.5"),
             "steps": ins.up("steps", *spec(target, draft, "EAGLE3", 5), "--sim-draft-ms", "4"),
             "fine": ins.up("fine", *spec(target, draft, "EAGLE3", 2), "--accept-length", "2.7", "--sim-draft-ms",
                            "1.5"),
             "idle": ins.up("idle", *spec(target, draft, "EAGLE3", 2))}
    cli.run("apply", ins.pkg, "--log-dir", str(tmp_path / "timing logs"), "--timeout", "60").expect(0)
    for name in ("host", "steps", "fine"):
        H.wait_http(ports[name])
        load(cli, ins.pkg, ports[name], "--concurrency", "1", "--requests", "6")
    time.sleep(3)  # the runtime writes a quiet server's records within 2 s
    doc = doctor(cli, ins.pkg)
    assert by_port(doc) == {ports["host"]: {"host-bound", "speculation-slower"}, ports["steps"]: {"too-many-steps", "speculation-unproven"},
                            ports["fine"]: set(), ports["idle"]: {"no-timing-records"}}
    d = {x["server"]["port"]: x for x in doc}
    steps = next(x for x in d[ports["steps"]]["findings"] if x["id"] == "too-many-steps")
    assert steps["title"].startswith("5 draft steps cost more than they buy: 2 ") and steps["predicted"] is True
    assert ",5 --baseline --repeat 3" in steps["next"] and "--grid speculative-num-steps=" in steps["next"]
    assert d[ports["fine"]]["sources"]["timing_log"]["records"] > 0
    # doctor --json's model: report --predict of the server's decode group that ran the most cycles
    model = d[ports["fine"]]["model"]
    assert model["steps"] == 2 and isinstance(model["group"], dict)
    basis = {p["steps"]: p["basis"] for p in model["predict"]}
    assert basis[2] == "measured" and basis[1] == "profile" and basis[3] == "extrapolated" and basis[0] == "estimate"
    assert 0 <= model["predict_best"] < len(model["predict"])
    assert d[ports["idle"]].get("model") is None
    found = {f["id"]: f for f in d[ports["host"]]["findings"]}
    assert "between cycles (the scheduler's own work)" in found["host-bound"]["evidence"][0]["text"]
    assert found["speculation-slower"]["predicted"] is True and "--baseline" in found["speculation-slower"]["next"]


def test_speculation_slower_after_a_sweep_with_baseline(cli, standins, tmp_path):
    """A sweep --baseline kept on this machine: 5 draft steps of 4 ms (a 27 ms cycle for 3.2 tokens) against no
    speculation (5 ms a token) is slower: speculation-slower; 2 steps of 2 ms (11 ms for 3 tokens) is faster:
    nothing. Each sweep is of its own install's server (the state file names the target and port)."""
    slow_ins = Install(standins, tmp_path / "slow")
    fast_ins = Install(standins, tmp_path / "fast")
    target, draft = models(tmp_path / "models")
    slow = slow_ins.up("slow", *spec(target, draft, "EAGLE3", 5), "--sim-draft-ms", "4")
    fast = fast_ins.up("fast", *spec(target, draft, "EAGLE3", 2))
    for ins, steps in ((slow_ins, 5), (fast_ins, 2)):
        r = cli.run("sweep", ins.pkg, "--grid", f"speculative-num-steps={steps}", "--baseline", "--requests", "6",
                    "--concurrency", "2", "--input-len", "16", "--max-new-tokens", "48", "--warmup", "1",
                    "--timeout", "60", "--json")
        assert r.rc == 0, r
    doc = doctor(cli, slow_ins.pkg)
    assert by_port(doc) == {slow: {"speculation-slower", "not-patched"}}
    found = doc["findings"][0]
    assert found["id"] == "speculation-slower" and found["evidence"][0]["text"].startswith("baseline (no speculation)")
    assert by_port(doctor(cli, fast_ins.pkg)) == {fast: {"not-patched"}}


def test_no_server(cli, standins, tmp_path):
    """An install whose server does not run: the one finding no-server, exit 0."""
    ins = Install(standins, tmp_path)
    doc = doctor(cli, ins.pkg)
    assert doc["server"] is None and [f["id"] for f in doc["findings"]] == ["no-server"]
