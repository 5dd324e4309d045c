"""Each rule of ``eaglepatch doctor`` (eaglepatch/doctor/rules/) on facts, with its healthy counterpart: the
finding when its condition holds, none when it does not (no false alarm), none when the evidence it needs is
missing. Timing records are written as JSONL and read through the real aggregation (``collect.load_records``);
sweeps through real state files (``tuning.saved.find_sweep``); log lines come from the real corpus.

Every test can fail: a threshold moved, a condition inverted, a rule that guesses without evidence, a healthy
server flagged.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from eaglepatch.tuning import sweep_state
from eaglepatch.tuning import sweep as sw
from eaglepatch.doctor import rules as R
from eaglepatch.doctor.finding import SEVERITIES
from eaglepatch.doctor.collect import load_records
from eaglepatch.tuning.saved import find_sweep
from eaglepatch.doctor.facts import ModelConfig, ServerFacts, parse_log, parse_topo

LOGS = Path(__file__).resolve().parents[1] / "data" / "sglang_logs" / "0.5.16"
TARGET = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "vocab_size": 128256,
          "max_position_embeddings": 8192}
EAGLE3 = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 4096, "vocab_size": 128256,
          "draft_vocab_size": 32000, "max_position_embeddings": 8192}
ARGV = ["/v/bin/python", "-m", "sglang.launch_server", "--model-path", "/m/target", "--speculative-algorithm",
        "EAGLE3", "--speculative-draft-model-path", "/m/draft", "--speculative-num-steps", "3",
        "--speculative-eagle-topk", "1", "--port", "30000"]


def facts(algorithm: str | None = "EAGLE3", target: dict | None = None, draft: dict | None = None,
          **kw) -> ServerFacts:
    flags = {"model-path": "/m/target", "port": "30000"}
    if algorithm:
        flags.update({"speculative-algorithm": algorithm, "speculative-draft-model-path": "/m/draft",
                      "speculative-num-steps": "3", "speculative-eagle-topk": "1"})
    flags.update(kw.pop("flags", {}))
    return ServerFacts(target="gpu1", version="0.5.16", pid=4242, port=30000, argv=list(ARGV), flags=flags,
                       patch=kw.pop("patch", "patched"), log_dir="/tmp/eaglepatch",
                       target_config=ModelConfig("/m/target", "/m/target/config.json", target) if target else None,
                       draft_config=ModelConfig("/m/draft", "/m/draft/config.json", draft) if draft else None, **kw)


def log(name: str):
    return parse_log((LOGS / name).read_text().splitlines(), str(LOGS / name))


def ids(f: ServerFacts) -> list[str]:
    return [x.id for x in R.diagnose(f)]


def write_records(folder: Path, pid: int, *, rank: int = 0, n: int = 60, cycle: float = 2.0,
                  phases: dict | None = None, host: tuple[float, dict] | None = None, gap: float = 0.3,
                  accept: float = 1.0, bs: int = 1, timer: str = "events", t0: float = 1.7e9) -> None:
    """``n`` decode records of one process, ``gap`` ms apart (the scheduler's time between cycles)."""
    folder.mkdir(parents=True, exist_ok=True)
    t = t0
    with open(folder / f"gpu1-{pid}-rank{rank}.jsonl", "a") as out:
        for _ in range(n):
            rec = {"v": 1, "t": round(t, 6), "host": "gpu1", "pid": pid, "rank": rank, "worker": "EAGLEWorkerV2",
                   "mode": "decode", "bs": bs, "cycle_ms": cycle, "timer": timer,
                   "phases": phases or {"draft": 0.5, "verify": 1.0, "draft_extend": 0.5}, "accepted": accept * bs}
            if host:
                rec["host_cycle_ms"], rec["host_phases"] = host
            out.write(json.dumps(rec) + "\n")
            t += ((host[0] if host else cycle) + gap) / 1000


def with_records(f: ServerFacts, tmp_path: Path, pids=(4242,), **kw) -> ServerFacts:
    for pid in pids:
        write_records(tmp_path, pid, **kw)
    return loaded(f, tmp_path, set(pids))


def loaded(f: ServerFacts, folder: Path, pids: set[int]) -> ServerFacts:
    """``f`` with the records of ``pids`` in ``folder``, read as doctor reads them."""
    return dataclasses.replace(f, **load_records(str(folder), pids, sweep=f.sweep, flags=f.flags))


# ----------------------------------------------------------------------------------------------------------------
# eagle3-draft-as-eagle


def test_eagle3_draft_as_eagle_and_its_healthy_counterparts():
    """EAGLE (or NEXTN, which sglang 0.5.16 resolves to EAGLE) with an EAGLE-3 draft: high, with the flag and the
    config's architectures as evidence. EAGLE3 with it, EAGLE with an EAGLE(-2) draft, or no draft config read:
    nothing."""
    f = facts("EAGLE", TARGET, EAGLE3)
    [found] = [x for x in R.diagnose(f) if x.id == "eagle3-draft-as-eagle"]
    assert found.severity == "high" and "EAGLE3" in found.next
    assert {e["source"] for e in found.evidence} == {"command-line", "config"}
    assert "under --speculative-algorithm NEXTN" in R.eagle3_draft_as_eagle(facts("NEXTN", TARGET, EAGLE3)).title
    assert R.eagle3_draft_as_eagle(facts("EAGLE3", TARGET, EAGLE3)) is None
    assert R.eagle3_draft_as_eagle(facts("EAGLE", TARGET, dict(EAGLE3, architectures=["LlamaForCausalLMEagle"]))) is None
    assert R.eagle3_draft_as_eagle(facts("EAGLE", TARGET, None)) is None


# ----------------------------------------------------------------------------------------------------------------
# draft-mismatch


@pytest.mark.parametrize("draft,what", [
    (dict(EAGLE3, vocab_size=32000), "vocabulary"),
    (dict(EAGLE3, hidden_size=5120), "hidden size"),
    (dict(EAGLE3, hidden_size=5120, vocab_size=152064), "vocabulary and hidden size"),
    (dict(EAGLE3, hidden_size=2048, target_hidden_size=5120), "hidden size"),
])
def test_draft_mismatch(draft, what):
    """A draft whose vocab_size or hidden size (target_hidden_size when it gives one) differs from the target's."""
    found = R.draft_mismatch(facts("EAGLE3", TARGET, draft))
    assert found is not None and found.severity == "high" and what in found.title


def test_draft_mismatch_healthy_counterparts():
    """Same sizes; an EAGLE-3 draft with a small hidden size but target_hidden_size matching; a STANDALONE draft
    (a small model of its own, with its own sizes); a config not read: nothing."""
    assert R.draft_mismatch(facts("EAGLE3", TARGET, EAGLE3)) is None
    assert R.draft_mismatch(facts("EAGLE3", TARGET, dict(EAGLE3, hidden_size=2048, target_hidden_size=4096))) is None
    assert R.draft_mismatch(facts("STANDALONE", TARGET, dict(TARGET, hidden_size=1024))) is None
    assert R.draft_mismatch(facts("EAGLE3", TARGET, None)) is None


# ----------------------------------------------------------------------------------------------------------------
# draft-context-short


def test_draft_context_short():
    """Draft trained for 2048, server takes the target's 8192 (sglang allowed it with the override variable,
    and logged the override): medium, with those as evidence."""
    f = facts("EAGLE3", TARGET, dict(EAGLE3, max_position_embeddings=2048),
              env={"SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1"},
              log=parse_log(["[2026-01-01 00:00:00] Overriding the draft model's max_position_embeddings to 8192."]))
    found = R.draft_context_short(f)
    assert found.severity == "medium" and "2048" in found.title and "8192" in found.title
    assert {e["source"] for e in found.evidence} == {"config", "server-log", "environment"}
    assert "--context-length 2048" in found.next


def test_draft_context_short_healthy_counterparts():
    """Equal contexts; a draft with rope scaling that covers the target; a server capped with --context-length at
    the draft's; no draft config: nothing."""
    assert R.draft_context_short(facts("EAGLE3", TARGET, EAGLE3)) is None
    scaled = dict(EAGLE3, max_position_embeddings=2048, rope_scaling={"factor": 4.0})
    assert R.draft_context_short(facts("EAGLE3", TARGET, scaled)) is None
    capped = facts("EAGLE3", TARGET, dict(EAGLE3, max_position_embeddings=2048), flags={"context-length": "2048"})
    assert R.draft_context_short(capped) is None
    assert R.draft_context_short(facts("EAGLE3", TARGET, None)) is None


# ----------------------------------------------------------------------------------------------------------------
# accept-length-low


def test_accept_length_low_from_the_real_random_draft_log():
    """The real random-draft decode lines (accept len 1.00) and the server's own average: high; the next step
    names the EAGLE-3-as-EAGLE cause when that finding holds too."""
    f = facts("EAGLE3", log=log("eagle3_random_draft_decode.log"),
              server_info={"internal_states": [{"avg_spec_accept_length": 1.0}]})
    found = R.accept_length_low(f)
    assert found.severity == "high" and found.title.startswith("accept length 1.00")
    assert [e["source"] for e in found.evidence][:2] == ["server-log", "server-info"]
    assert "accept len: 1.00" in found.evidence[0]["line"]
    caused = R.accept_length_low(facts("EAGLE", TARGET, EAGLE3, log=log("eagle3_random_draft_decode.log")))
    assert "eagle3-draft-as-eagle" in caused.next


def test_accept_length_low_healthy_counterparts(tmp_path):
    """The real agreeing-draft lines (4.00); one source at 1.0 but another at 3.0 (the evidence seen disagrees:
    no finding); no speculation; nothing measured (a server_info average of 0 before any decode): nothing."""
    assert R.accept_length_low(facts("EAGLE3", log=log("eagle3_agree_draft_decode.log"))) is None
    mixed = with_records(facts("EAGLE3", log=log("eagle3_random_draft_decode.log")), tmp_path, accept=3.0)
    assert R.accept_length_low(mixed) is None
    assert R.accept_length_low(facts(None, log=log("eagle3_random_draft_decode.log"))) is None
    assert R.accept_length_low(facts("EAGLE3", server_info={"internal_states": [{"avg_spec_accept_length": 0.0}]})) is None
    assert R.accept_length_low(facts("EAGLE3", log=parse_log([]))) is None


def test_accept_length_from_records_alone(tmp_path):
    """1.1 tokens per cycle in the timing records alone is enough (at most 1.2); 1.3 is not."""
    assert R.accept_length_low(with_records(facts("EAGLE3"), tmp_path / "a", accept=1.1)) is not None
    assert R.accept_length_low(with_records(facts("EAGLE3"), tmp_path / "b", accept=1.3)) is None


# ----------------------------------------------------------------------------------------------------------------
# speculation-slower (sweep state files, as eaglepatch sweep writes them)


def state_file(cache: Path, results: dict, port: int = 30000, argv_of=None, target: str = "gpu1",
               concurrency: int = 4) -> None:
    """A finished sweep of ``target`` with ``--baseline``: ``results`` maps a steps value (None: the baseline) to
    its tok/s."""
    points = [sw.Point(baseline=True)] + [sw.Point(flags=(("speculative-num-steps", str(k)),))
                                          for k in results if k is not None]
    st = sweep_state.StateFile(str(cache / f"{target}-{len(results)}.jsonl"))
    st.write_header({"version": 1, "target": target, "original": {"argv": ARGV, "port": port},
                     "points": [p.key for p in points], "repeat": 1,
                     "load": {"requests": 32, "concurrency": concurrency}})
    for i, p in enumerate(points):
        k = None if p.baseline else int(p.flags[0][1])
        argv = (argv_of or (lambda k: ARGV if k == 3 else ARGV[:-2] + [f"--x{k}", "1"]))(k)
        st.add_run({"point": p.key, "index": i, "rep": 0, "argv": argv, "status": "ok",
                    "tokens_per_s": results[k], "accept_len": None if k is None else 2.5, "phases_p50": {}})


def test_speculation_slower_for_this_command_line(tmp_path):
    """This very command line (steps 3) ran at 150 tok/s, no speculation at 200: high; steps 2 at 260 is the
    sweep's best, so the next step is to relaunch with it."""
    state_file(tmp_path, {None: 200.0, 3: 150.0, 2: 260.0})
    f = facts("EAGLE3", sweep=find_sweep("gpu1", SimpleNamespace(port=30000, argv=ARGV), cache=str(tmp_path)))
    assert f.sweep["current"] is not None
    found = R.speculation_slower(f)
    assert found.severity == "high" and "this command line" in found.title
    assert "speculative-num-steps=2" in found.next
    assert [e["text"].split(":")[0] for e in found.evidence] == ["baseline (no speculation)", "speculative-num-steps=3"]


def test_a_sweep_that_did_not_run_this_command_line_says_nothing_of_it(tmp_path):
    """No point ran this command line, and every speculative point the sweep ran was slower than no speculation
    (issue 38: a 1-step sweep at 32 requests lost to no speculation while the running 5-step server measured 11%
    over it): the other points are no evidence for this one, so no measured finding; without timing records to
    predict from, nothing."""
    state_file(tmp_path, {None: 200.0, 1: 150.0, 5: 120.0}, argv_of=lambda k: ARGV[:-2] + ["--y", str(k)])
    f = facts("EAGLE3", sweep=find_sweep("gpu1", SimpleNamespace(port=30000, argv=ARGV), cache=str(tmp_path)))
    assert f.sweep["current"] is None
    assert R.speculation_slower(f) is None


def test_the_next_step_names_the_accept_length_only_when_it_is_low(tmp_path):
    """This command line slower than no speculation, no faster point: run without speculation; "until the accept
    length is fixed" only where the sweep measured it at most ACCEPT_LOW (here 2.5: not the cause)."""
    state_file(tmp_path, {None: 200.0, 3: 150.0})
    f = facts("EAGLE3", sweep=find_sweep("gpu1", SimpleNamespace(port=30000, argv=ARGV), cache=str(tmp_path)))
    found = R.speculation_slower(f)
    assert found.severity == "high" and "without speculation" in found.next
    assert "accept length" not in found.next


def test_speculation_slower_healthy_counterparts(tmp_path):
    """This command line faster than the baseline; one speculative point faster when this one did not run; a
    sweep of another target or another port; no sweep at all: nothing."""
    state_file(tmp_path / "a", {None: 200.0, 3: 260.0})
    srv = SimpleNamespace(port=30000, argv=ARGV)
    assert R.speculation_slower(facts(sweep=find_sweep("gpu1", srv, cache=str(tmp_path / "a")))) is None
    state_file(tmp_path / "b", {None: 200.0, 1: 150.0, 5: 220.0}, argv_of=lambda k: ARGV[:-2] + ["--y", str(k)])
    assert R.speculation_slower(facts(sweep=find_sweep("gpu1", srv, cache=str(tmp_path / "b")))) is None
    state_file(tmp_path / "c", {None: 200.0, 3: 150.0}, port=30001)
    assert find_sweep("gpu1", srv, cache=str(tmp_path / "c")) is None
    assert find_sweep("gpu2", srv, cache=str(tmp_path / "a")) is None
    assert R.speculation_slower(facts(sweep=None)) is None


# ----------------------------------------------------------------------------------------------------------------
# cuda-graph-off


def test_cuda_graph_disabled_by_flag_or_server_info():
    """--disable-cuda-graph (or /server_info saying so): high, and the next step drops the flag."""
    found = R.cuda_graph_off(facts(flags={"disable-cuda-graph": True}))
    assert found.severity == "high" and "without --disable-cuda-graph" in found.next
    assert R.cuda_graph_off(facts(server_info={"disable_cuda_graph": True})).severity == "high"


def test_cuda_graph_off_from_decode_lines():
    """Decode lines that say cuda graph: False with more running requests than the largest captured batch: high
    when most lines do (with the flag to raise to the largest batch seen), medium when few do."""
    off = ("[2026-01-01 00:00:00] Decode batch, #running-req: 24, #token: 900, token usage: 0.01, accept len: 2.50, "
           "accept rate: 0.50, cuda graph: False, gen throughput (token/s): 900.00, #queue-req: 0")
    on = off.replace("#running-req: 24", "#running-req: 8").replace("cuda graph: False", "cuda graph: True")
    f = facts(flags={"cuda-graph-max-bs": "16"}, log=parse_log([on, off, off]))
    found = R.cuda_graph_off(f)
    assert found.severity == "high" and "--cuda-graph-max-bs 24" in found.next
    assert "2 of 3 decode batch line(s)" in found.evidence[0]["text"]
    assert R.cuda_graph_off(facts(flags={"cuda-graph-max-bs": "16"}, log=parse_log([on, on, on, off]))).severity == "medium"


def test_cuda_graph_off_from_batch_sizes_in_the_records(tmp_path):
    """Decode cycles at batch size 24 with graphs captured up to 16 (no log read): medium."""
    write_records(tmp_path, 4242, bs=8, n=30)
    write_records(tmp_path, 4242, bs=24, n=30, t0=1.7e9 + 10)
    f = loaded(facts(flags={"cuda-graph-max-bs": "16"}), tmp_path, {4242})
    found = R.cuda_graph_off(f)
    assert found.severity == "medium" and "30 decode cycle(s) at batch sizes 24 > 16" in found.evidence[0]["text"]


def test_cuda_graph_healthy_counterparts(tmp_path):
    """The real 0.5.16 log (graphs on, 4 requests, captured to 16), whose prefill lines say cuda graph: False;
    records within the captured batch sizes; nothing read: nothing."""
    assert R.cuda_graph_off(facts(log=log("eagle3_random_draft_two_launches.log"))) is None
    text = (LOGS / "eagle3_random_draft_two_launches.log").read_text().splitlines()
    first = text[:[i for i, ln in enumerate(text) if "server_args=" in ln][1]]
    assert any("Prefill batch" in ln and "cuda graph: False" in ln for ln in first)
    assert R.cuda_graph_off(facts(log=parse_log(first))) is None
    assert R.cuda_graph_off(with_records(facts(flags={"cuda-graph-max-bs": "16"}), tmp_path, bs=16)) is None
    assert R.cuda_graph_off(facts()) is None


# ----------------------------------------------------------------------------------------------------------------
# too-many-steps


def test_too_many_steps(tmp_path):
    """5 steps, accept length 3.2, 2 ms per draft step, verify 6 ms, extend 1 ms, 0.2 ms between cycles: the
    model (report --predict) favours 2 steps (2 * 2 + 7.2 ms a cycle for 2.28 tokens: about 10% more tok/s); the
    finding is marked predicted, names the no-speculation estimate, and the next step is the sweep that confirms
    it (live, one launch; or by restarts)."""
    f = with_records(facts(flags={"speculative-num-steps": "5"}), tmp_path, cycle=17.0,
                     phases={"draft": 10.0, "verify": 6.0, "draft_extend": 1.0}, accept=3.2, gap=0.2)
    found = R.too_many_steps(f)
    assert found.severity == "medium" and found.title == "5 draft steps cost more than they buy: 2 would be about 10% faster"
    assert found.predicted and found.to_json()["predicted"] is True
    assert "--live --grid speculative-num-steps=2,3,5" in found.next and "--baseline --repeat 3" in found.next
    model = next(e["text"] for e in found.evidence if e["source"] == "model")
    assert ("2 steps 204 records' wall tok/s" in model and "5 steps 186 records' wall tok/s" in model
            and "no speculation 167 records' wall tok/s" in model)
    assert R.too_few_steps(f) is None


def test_too_many_steps_healthy_counterparts(tmp_path):
    """Every draft token accepted at 3 steps (more steps would pay); top-k 2 (a tree: the chain model does not
    apply); accept length 1.0 (accept-length-low's); no records: nothing."""
    ph = {"draft": 3.0, "verify": 6.0, "draft_extend": 1.0}
    assert R.too_many_steps(with_records(facts(), tmp_path / "a", cycle=10.0, phases=ph, accept=4.0)) is None
    tree = facts(flags={"speculative-eagle-topk": "2"})
    assert R.too_many_steps(with_records(tree, tmp_path / "b", cycle=10.0, phases=ph, accept=2.0)) is None
    assert R.too_many_steps(with_records(facts(), tmp_path / "c", cycle=10.0, phases=ph, accept=1.0)) is None
    assert R.too_many_steps(facts()) is None


def test_too_few_steps(tmp_path):
    """2 steps accepting every draft (3 tokens a cycle), a cheap draft (0.5 ms a step) and 10 ms of verify: the
    records carry no per-request counts, so a chain of one rate fitted to the accept length stands in (about 1,
    taken as from 100 request-cycles: (100 + 1/2) / 101 onwards), and more steps pay; marked predicted, said
    extrapolated, the live sweep to confirm it; not too-many-steps."""
    f = facts(flags={"speculative-num-steps": "2"})
    write_records(tmp_path, 4242, cycle=12.0, phases={"draft": 1.0, "verify": 10.0, "draft_extend": 1.0}, accept=3.0,
                  gap=0.2)
    f = loaded(f, tmp_path, {4242})
    found = R.too_few_steps(f)
    assert found is not None and found.predicted and found.severity == "medium"
    assert found.title.startswith("2 draft steps leave accepted tokens unbought: ")
    one = with_records(facts(flags={"speculative-num-steps": "1"}), tmp_path / "one", cycle=11.0,
                       phases={"draft": 0.0, "verify": 10.0, "draft_extend": 1.0}, accept=2.0, gap=0.2)
    assert R.too_few_steps(one).title.startswith("1 draft step leaves accepted tokens unbought: ")
    assert "--live --grid speculative-num-steps=" in found.next
    assert any("extrapolated" in e["text"] for e in found.evidence)
    assert R.too_many_steps(f) is None


def test_no_step_finding_on_an_adaptive_server_suggests_a_flag(tmp_path):
    """On a server started with --speculative-adaptive the step count is the adaptive mode's: the next step is
    the live sweep of its candidates with --emit-adaptive-config, never a --speculative-num-steps grid."""
    f = with_records(facts(flags={"speculative-num-steps": "5", "speculative-adaptive": True}), tmp_path, cycle=17.0,
                     phases={"draft": 10.0, "verify": 6.0, "draft_extend": 1.0}, accept=3.2, gap=0.2)
    found = R.too_many_steps(f)
    assert "--emit-adaptive-config" in found.next and "--baseline" not in found.next
    host = R.host_bound(with_records(facts(flags={"speculative-adaptive": True}), tmp_path / "h", cycle=2.14,
                                     gap=1.03, timer="sync"))
    assert "--emit-adaptive-config" in host.next and "--baseline" not in host.next


def test_speculation_slower_predicted(tmp_path):
    """No sweep: the accept length 1.05 at 3 steps, a 3 ms draft and 1 ms extend around a 2 ms verify: the model
    predicts more tok/s without speculation than at any step count; marked predicted, with the restart sweep
    whose baseline measures it as the next step (a live sweep's steps 0 still runs the draft extend)."""
    f = with_records(facts(), tmp_path, cycle=6.2, phases={"draft": 3.0, "verify": 2.0, "draft_extend": 1.0},
                     accept=1.05, gap=0.5)
    found = R.speculation_slower(f)
    assert found is not None and found.predicted and found.to_json()["predicted"] is True
    assert found.title.startswith("predicted: no speculation would be about ")
    assert "--baseline --repeat 3 --grid speculative-num-steps=" in found.next and "--live" not in found.next
    model = next(e["text"] for e in found.evidence if e["source"] == "model")
    assert "no speculation" in model and "estimate" in model


def test_no_prediction_from_a_few_cycles(tmp_path):
    """The records of speculation_slower_predicted's server, but 5 decode cycles (a server that answered its health
    checks, not a load: on the H200 such a server's first cycle took 1.1 s and the model said no speculation would
    be 122% faster): no prediction, a note that says why and what to do, and no model finding; 50 cycles predict."""
    kw = dict(cycle=6.2, phases={"draft": 3.0, "verify": 2.0, "draft_extend": 1.0}, accept=1.05, gap=0.5)
    few = with_records(facts(), tmp_path / "few", n=5, **kw)
    assert few.model["predict"] is None and few.model["predict_note"].startswith("only 5 decode cycle(s) recorded")
    assert "eaglepatch bench" in few.model["predict_note"]
    assert R.speculation_slower(few) is None and R.speculation_unproven(few) is None and R.too_many_steps(few) is None
    assert R.speculation_slower(with_records(facts(), tmp_path / "enough", n=50, **kw)) is not None


def test_speculation_slower_predicted_healthy_counterpart(tmp_path):
    """Accept length 3.5 at 3 steps around the same costs: speculation pays, nothing is predicted."""
    f = with_records(facts(), tmp_path, cycle=6.2, phases={"draft": 3.0, "verify": 2.0, "draft_extend": 1.0},
                     accept=3.5, gap=0.5)
    assert R.speculation_slower(f) is None


def test_speculation_unproven(tmp_path):
    """The GPU-bound testbed's shape at an acceptance of about 0.25 (verify 6 ms of a 6.7 ms cycle, accept length
    1.25 at 3 steps): the model puts 2 steps 12% above its no-speculation estimate, inside the estimate's 30%: the
    records cannot tell whether speculation pays (on the H200 it lost by 10% at 0.2); medium, predicted, and the
    restart sweep with --baseline as the next step. Not speculation-slower (the estimate is below)."""
    f = with_records(facts(), tmp_path, cycle=6.7, phases={"draft": 0.4, "verify": 6.0, "draft_extend": 0.3},
                     accept=1.25, gap=0.1)
    found = R.speculation_unproven(f)
    assert found is not None and found.severity == "medium" and found.predicted
    assert found.title == ("predicted: speculation may not pay here: the best step count, 2, +12% against no "
                           "speculation, whose estimate is uncertain by \u00b130%")
    assert "--baseline --repeat 3 --grid speculative-num-steps=2,3" in found.next and "--live" not in found.next
    model = next(e["text"] for e in found.evidence if e["source"] == "model")
    assert ("no speculation 167 records' wall tok/s (\u00b130%, estimate" in model
            and "2 steps 186 records' wall tok/s" in model)
    assert R.speculation_slower(f) is None
    assert "speculation-unproven" in ids(f)
    one = with_records(facts(), tmp_path / "one", cycle=6.7, phases={"draft": 0.4, "verify": 6.0, "draft_extend": 0.3},
                       accept=1.1, gap=0.1)
    assert R.speculation_unproven(one).title.startswith("predicted: speculation may not pay here: the best step "
                                                        "count, 1, +0% against")


def test_no_speculation_finding_on_an_adaptive_server_suggests_no_steps_flag(tmp_path):
    """On a server started with --speculative-adaptive the step count is the adaptive mode's: speculation-unproven
    and the predicted speculation-slower measure the server as launched against the baseline, no steps grid."""
    flags = {"speculative-adaptive": True}
    f = with_records(facts(flags=flags), tmp_path / "u", cycle=6.7,
                     phases={"draft": 0.4, "verify": 6.0, "draft_extend": 0.3}, accept=1.25, gap=0.1)
    found = R.speculation_unproven(f)
    assert found.next == ("measure the baseline: eaglepatch sweep gpu1 --baseline --repeat 3 (the server as launched, "
                          "adaptive, against a launch without speculation)")
    slow = with_records(facts(flags=flags), tmp_path / "s", cycle=6.2,
                        phases={"draft": 3.0, "verify": 2.0, "draft_extend": 1.0}, accept=1.05, gap=0.5)
    nxt = R.speculation_slower(slow).next
    assert "--baseline --repeat 3 (the server as launched" in nxt and "--grid" not in nxt


def test_speculation_unproven_healthy_counterparts(tmp_path):
    """Accept length 2.0 around the same costs (the best point beyond the estimate's band); the estimate above
    every step count (speculation-slower's); a sweep of this server that measured the baseline: nothing."""
    ph = {"draft": 0.4, "verify": 6.0, "draft_extend": 0.3}
    assert R.speculation_unproven(with_records(facts(), tmp_path / "a", cycle=6.7, phases=ph, accept=2.0, gap=0.1)) is None
    slow = with_records(facts(), tmp_path / "b", cycle=6.2, phases={"draft": 3.0, "verify": 2.0, "draft_extend": 1.0},
                        accept=1.05, gap=0.5)
    assert R.speculation_unproven(slow) is None and R.speculation_slower(slow) is not None
    state_file(tmp_path / "s", {None: 200.0, 3: 260.0}, concurrency=1)  # the records' load: one request a cycle
    swept = facts(sweep=find_sweep("gpu1", SimpleNamespace(port=30000, argv=ARGV), cache=str(tmp_path / "s")))
    assert R.speculation_unproven(with_records(swept, tmp_path / "c", cycle=6.7, phases=ph, accept=1.25, gap=0.1)) is None


def test_a_sweep_at_another_load_is_not_evidence(tmp_path):
    """A sweep at 32 requests a time read against records of 64-request cycles (issue 38: doctor at 64 requests
    took a 32-request sweep as its evidence): not used, and why is said; the same sweep against 32-request cycles
    (and 40: within 1.5x) is used, and the measured finding comes from it."""
    state_file(tmp_path / "s", {None: 200.0, 3: 150.0}, concurrency=32)
    swept = facts(sweep=find_sweep("gpu1", SimpleNamespace(port=30000, argv=ARGV), cache=str(tmp_path / "s")))
    ph = {"draft": 0.4, "verify": 6.0, "draft_extend": 0.3}
    at64 = with_records(swept, tmp_path / "a", cycle=6.7, phases=ph, accept=2.0, bs=64, gap=0.1)
    assert at64.sweep_other_load == ("it measured 32 request(s) at a time, and this server's decode cycles ran 64 at "
                                     "a time (the median): a sweep counts only for its own load")
    assert R.speculation_slower(at64) is None or R.speculation_slower(at64).predicted
    for bs in (32, 40):
        matched = with_records(swept, tmp_path / f"b{bs}", cycle=6.7, phases=ph, accept=2.0, bs=bs, gap=0.1)
        assert matched.sweep_other_load is None
        found = R.speculation_slower(matched)
        assert found.severity == "high" and not found.predicted


def test_an_open_loop_sweep_is_not_evidence_for_any_load():
    """A sweep of --request-rate keeps no batch size: its --concurrency is a cap, so it never counts as measured
    at the records' load, whatever their batch sizes, and why is said."""
    from eaglepatch.doctor.collect import sweep_load_mismatch

    groups = [{"key": {"bs": 64}, "n": 100}]
    assert sweep_load_mismatch({"load": {"concurrency": 64}}, groups) is None
    why = sweep_load_mismatch({"load": {"concurrency": 64, "request_rate": 8.0}}, groups)
    assert why == ("it ran an open loop (8 requests/s, at most 64 in flight), whose batch sizes it does not keep: a "
                   "sweep with --concurrency at this server's load counts")


# ----------------------------------------------------------------------------------------------------------------
# host-bound


def test_host_bound_by_the_time_between_cycles(tmp_path):
    """The real testbed's figures (cycle 2.14 ms, between 1.03 ms: 48%): host-bound."""
    found = R.host_bound(with_records(facts(), tmp_path, cycle=2.14, gap=1.03, timer="sync"))
    assert found is not None and "1.03 ms against a decode cycle p50 of 2.14 ms (48%)" in found.evidence[0]["text"]
    assert "speculative-num-steps=1,2,3" in found.next


def test_host_bound_by_the_events_timer(tmp_path):
    """Events timer: host time 0.95 of the GPU time, little time between cycles: host-bound, with the per-phase
    host and GPU times as evidence."""
    host = (1.9, {"draft": 0.46, "verify": 0.86, "draft_extend": 0.58})
    found = R.host_bound(with_records(facts(), tmp_path, cycle=2.0, gap=0.1, host=host))
    assert found is not None and "host/GPU 0.95" in found.evidence[0]["text"]
    assert "draft GPU 0.50 ms host 0.46 ms" in found.evidence[0]["text"]


def test_host_bound_healthy_counterpart(tmp_path):
    """A GPU-bound server: host time half the GPU's, 10% between cycles: nothing; no records: nothing."""
    host = (1.0, {"draft": 0.2, "verify": 0.6, "draft_extend": 0.2})
    assert R.host_bound(with_records(facts(), tmp_path, cycle=2.0, gap=0.2, host=host)) is None
    assert R.host_bound(facts()) is None


def test_host_bound_not_where_the_gpu_sets_the_pace(tmp_path):
    """The H200's GPU-bound testbed (Llama-3-8B shape, events timer, overlap scheduler): a 6.7 ms GPU cycle that
    the host launches in 2.7 ms, then 4 ms waiting for the GPU between cycles (60% of the cycle): not host-bound.
    The same host with 10 ms between cycles (6 ms of the scheduler's own beyond the wait: 90%): host-bound, the wait
    said. The same 4 ms gap where the host's time is the GPU's (the host-bound testbed's shape): host-bound."""
    host = (2.7, {"draft": 0.62, "verify": 1.11, "draft_extend": 0.79})
    assert R.host_bound(with_records(facts(), tmp_path / "g", cycle=6.7, gap=4.0, host=host)) is None
    busy = R.host_bound(with_records(facts(), tmp_path / "b", cycle=6.7, gap=10.0, host=host))
    assert busy is not None and busy.evidence[0]["text"].startswith(
        "between cycles (the scheduler's own work) p50 10.00 ms (4.00 ms of it waiting for the GPU beyond the "
        "host's 2.70 ms) against a decode cycle p50 of 6.70 ms (90%)")
    slow = (6.5, {"draft": 1.5, "verify": 3.5, "draft_extend": 1.5})
    found = R.host_bound(with_records(facts(), tmp_path / "h", cycle=6.7, gap=4.0, host=slow))
    assert found is not None and "against a decode cycle p50 of 6.70 ms" in found.evidence[0]["text"]


def test_host_bound_names_the_overlap_scheduler_when_it_is_off(tmp_path):
    f = with_records(facts(flags={"disable-overlap-schedule": True}), tmp_path, cycle=2.0, gap=1.5)
    assert "without --disable-overlap-schedule" in R.host_bound(f).next


# ----------------------------------------------------------------------------------------------------------------
# rank-skew


def test_rank_skew(tmp_path):
    """TP 2: rank 1's verify 7.2 ms against rank 0's 6.0 ms (1.2x): the slow rank and its GPU are named (rank 1
    on CUDA_VISIBLE_DEVICES=2,3 is GPU 3)."""
    write_records(tmp_path, 100, rank=0, phases={"draft": 1.0, "verify": 6.0, "draft_extend": 1.0}, cycle=8.0)
    write_records(tmp_path, 101, rank=1, phases={"draft": 1.0, "verify": 7.2, "draft_extend": 1.0}, cycle=9.2)
    f = loaded(facts(flags={"tp-size": "2"}, env={"CUDA_VISIBLE_DEVICES": "2,3"}), tmp_path, {100, 101})
    found = R.rank_skew(f)
    assert found.title.startswith("rank 1's verify is 1.20x") and "-i 3" in found.next
    assert [e["text"].split(":")[0] for e in found.evidence] == ["rank 0 (GPU 2)", "rank 1 (GPU 3)"]


def test_rank_skew_never_compares_spec_groups(tmp_path):
    """One GPU, an adaptive server: its records split by step count (verify 6 ms at 1 step, 8.2 ms at 3: 1.37x);
    one rank is no skew, and on TP 2 ranks are compared only within each step count (here equal)."""
    for pid, rank in ((100, 0), (101, 1)):
        path = tmp_path / f"gpu1-{pid}-rank{rank}.jsonl"
        write_records(tmp_path, pid, rank=rank, phases={"draft": 1.0, "verify": 6.0, "draft_extend": 1.0})
        lines = path.read_text().splitlines()
        spec = [dict(json.loads(x), spec={"steps": 1, "topk": 1, "draft_tokens": 2}) for x in lines[:30]]
        spec += [dict(json.loads(x), spec={"steps": 3, "topk": 1, "draft_tokens": 4},
                      phases={"draft": 3.0, "verify": 8.2, "draft_extend": 1.0}) for x in lines[30:]]
        path.write_text("".join(json.dumps(r) + "\n" for r in spec))
    one = loaded(facts(flags={"speculative-adaptive": True}), tmp_path, {100})
    assert len(one.by_rank) == 2 and R.rank_skew(one) is None
    assert R.rank_skew(loaded(facts(flags={"tp-size": "1"}), tmp_path, {100, 101})) is None
    assert R.rank_skew(loaded(facts(flags={"tp-size": "2"}), tmp_path, {100, 101})) is None


def test_an_adaptive_servers_zero_step_state_is_not_its_acceptance(tmp_path):
    """An adaptive server that ran 100 cycles in sglang's zero-step state (no draft: 1 token a request) and 60 at 3
    steps accepting 2.5 (a live sweep held steps 0 longest, as on the H200): the records' decode group and the
    model are the 3-step ones, so accept-length-low does not read 1.00; with only zero-step cycles, those."""
    path = tmp_path / "gpu1-4242-rank0.jsonl"
    write_records(tmp_path, 4242, n=160, accept=2.5, phases={"draft": 1.5, "verify": 6.0, "draft_extend": 1.0},
                  cycle=8.5)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    zero = [dict(r, spec={"steps": 0, "topk": 1, "draft_tokens": 1}, accepted=1,
                 phases={"verify": 5.8, "draft_extend": 1.0}) for r in lines[:100]]
    three = [dict(r, spec={"steps": 3, "topk": 1, "draft_tokens": 4}) for r in lines[100:]]
    path.write_text("".join(json.dumps(r) + "\n" for r in zero + three))
    f = loaded(facts(flags={"speculative-adaptive": True}), tmp_path, {4242})
    assert f.decode["n"] == 60 and f.decode["accept_len"] == 2.5 and f.model["steps"] == 3
    assert R.accept_length_low(f) is None
    path.write_text("".join(json.dumps(r) + "\n" for r in zero))
    only = loaded(facts(flags={"speculative-adaptive": True}), tmp_path, {4242})
    assert only.decode["n"] == 100 and only.decode["accept_len"] == 1.0


def test_rank_skew_healthy_counterparts(tmp_path):
    """5% apart; one rank only: nothing."""
    write_records(tmp_path, 100, rank=0, phases={"draft": 1.0, "verify": 6.0, "draft_extend": 1.0})
    write_records(tmp_path, 101, rank=1, phases={"draft": 1.0, "verify": 6.3, "draft_extend": 1.0})
    assert R.rank_skew(loaded(facts(flags={"tp-size": "2"}), tmp_path, {100, 101})) is None
    assert R.rank_skew(loaded(facts(flags={"tp-size": "2"}), tmp_path, {100})) is None


# ----------------------------------------------------------------------------------------------------------------
# tp-communication


def test_tp_communication(tmp_path):
    """TP 2 with the custom all-reduce disabled: low; medium once the records show verify at half the cycle or
    more; NCCL_P2P_DISABLE=1 and GPUs linked over SYS count too."""
    low = R.tp_communication(facts(flags={"tp-size": "2", "disable-custom-all-reduce": True}))
    assert low.severity == "low" and "--grid disable-custom-all-reduce=off,on" in low.next
    f = with_records(facts(flags={"tp-size": "2", "disable-custom-all-reduce": True}), tmp_path, cycle=8.0,
                     phases={"draft": 1.0, "verify": 6.0, "draft_extend": 1.0})
    assert R.tp_communication(f).severity == "medium"
    env = R.tp_communication(facts(flags={"tp-size": "2"}, env={"NCCL_P2P_DISABLE": "1"}))
    assert "--env NCCL_P2P_DISABLE=0,1" in env.next
    topo = parse_topo("\tGPU0\tGPU1\nGPU0\t X \tSYS\nGPU1\tSYS\t X \n")
    assert "GPU0-GPU1 SYS" in R.tp_communication(facts(flags={"tp-size": "2"}, topo=topo)).evidence[0]["text"]


def test_tp_communication_healthy_counterparts():
    """TP 1 with the flag; TP 2 with NVLink and nothing disabled: nothing."""
    assert R.tp_communication(facts(flags={"disable-custom-all-reduce": True})) is None
    topo = parse_topo("\tGPU0\tGPU1\nGPU0\t X \tNV18\nGPU1\tNV18\t X \n")
    assert R.tp_communication(facts(flags={"tp-size": "2"}, topo=topo)) is None


# ----------------------------------------------------------------------------------------------------------------
# sync-on-overlap


def test_sync_on_overlap(tmp_path):
    """Sync-timer records on a server that runs the overlap scheduler (as /server_info says, or from the command
    line and an install with the V2 workers): medium, next: apply --mode auto."""
    f = with_records(facts(server_info={"disable_overlap_schedule": False}), tmp_path / "a", timer="sync")
    found = R.sync_on_overlap(f)
    assert found.severity == "medium" and "--mode auto" in found.next
    g = with_records(facts(overlap_workers=True), tmp_path / "b", timer="sync")
    assert R.sync_on_overlap(g) is not None


def test_sync_on_overlap_healthy_counterparts(tmp_path):
    """Events records; sync records with the overlap scheduler off (flag or server_info); an install without V2
    workers and nothing else said: nothing."""
    assert R.sync_on_overlap(with_records(facts(overlap_workers=True), tmp_path / "a", timer="events")) is None
    off = facts(overlap_workers=True, flags={"disable-overlap-schedule": True})
    assert R.sync_on_overlap(with_records(off, tmp_path / "b", timer="sync")) is None
    si = facts(server_info={"disable_overlap_schedule": True})
    assert R.sync_on_overlap(with_records(si, tmp_path / "c", timer="sync")) is None
    assert R.sync_on_overlap(with_records(facts(), tmp_path / "d", timer="sync")) is None


# ----------------------------------------------------------------------------------------------------------------
# not-patched, no-timing-records, the order


def test_not_patched_and_no_records():
    """Not patched: info, naming the findings that need records; stale: restart; patched without records:
    no-timing-records; patched with records: neither."""
    np = R.not_patched(facts(patch="not-patched"))
    assert np.severity == "info" and "eaglepatch apply gpu1" in np.next and "host-bound" in np.next
    assert "eaglepatch restart gpu1" in R.not_patched(facts(patch="stale")).next
    assert R.not_patched(facts(patch="patched")) is None
    assert R.no_timing_records(facts(patch="patched")).id == "no-timing-records"
    assert R.no_timing_records(facts(patch="patched", records=5)) is None
    assert R.no_timing_records(facts(patch="not-patched")) is None


def test_findings_are_ordered_by_severity_and_shaped_as_the_contract_says(tmp_path):
    """High first, then medium, low, info; each {id, severity, title, evidence [{source, text}], next}."""
    f = facts("EAGLE", TARGET, dict(EAGLE3, max_position_embeddings=2048),
              flags={"tp-size": "2", "disable-custom-all-reduce": True}, patch="not-patched",
              log=log("eagle3_random_draft_decode.log"))
    found = R.diagnose(f)
    assert [x.id for x in found] == ["eagle3-draft-as-eagle", "accept-length-low", "draft-context-short",
                                     "tp-communication", "not-patched"]
    sev = [SEVERITIES.index(x.severity) for x in found]
    assert sev == sorted(sev)
    for x in found:
        doc = x.to_json()
        assert set(doc) == {"id", "severity", "title", "evidence", "next"} and doc["evidence"]
        assert all({"source", "text"} <= set(e) for e in doc["evidence"])


def test_a_healthy_patched_server_has_no_finding(tmp_path):
    """EAGLE3 with its own draft, accept length 2.4 at 3 steps (the step count the model favours too: 3 and 4
    within 2%), GPU-bound cycles, graphs on, the real agreeing log: nothing. (At 2.8 the model would favour 5 or
    6 steps: too-few-steps.)"""
    f = facts("EAGLE3", TARGET, EAGLE3, log=log("eagle3_agree_draft_decode.log"), flags={"cuda-graph-max-bs": "16"},
              server_info={"disable_overlap_schedule": False})
    host = (5.0, {"draft": 1.0, "verify": 3.0, "draft_extend": 1.0})
    f = with_records(f, tmp_path, cycle=10.0, phases={"draft": 2.0, "verify": 7.0, "draft_extend": 1.0}, accept=2.4,
                     host=host, gap=0.5, bs=8)
    assert ids(f) == []


def test_every_rule_has_a_docstring_with_its_id():
    """docs/doctor.md is written from these: each rule states its id and condition."""
    for name, rule in R.RULES:
        assert rule.__doc__ and f"``{name}``" in rule.__doc__, name


def test_doctor_masks_secret_option_values_in_the_server_argv() -> None:
    from eaglepatch.doctor.collect import document
    from eaglepatch.server.process import ServerProcess

    argv = ["python", "-m", "sglang.launch_server", "--api-key", "sk-1", "--hf-token=abc", "--admin-password",
            "--port", "30000", "--ssl-keyfile", "/k.pem", "--speculative-num-draft-tokens", "4"]
    srv = ServerProcess(pid=1, argv=argv, cwd="/", env={}, exe=None, port=30000)
    doc = document("gpu1", "0.5.16", srv, [], {})
    # a key file's path is no secret, a count of draft tokens neither (the one rule: eaglepatch.redact)
    assert doc["server"]["argv"] == ["python", "-m", "sglang.launch_server", "--api-key", "***", "--hf-token=***",
                                     "--admin-password", "--port", "30000", "--ssl-keyfile", "/k.pem",
                                     "--speculative-num-draft-tokens", "4"]


def _by_bs_model(zero_basis: str) -> dict:
    def row(bs: int, zero: float, spec: float) -> dict:
        return {"bs": bs, "best": 0 if zero > spec else 1, "points": [
            {"steps": 0, "tokens_per_s": zero, "spread": 0.02, "basis": zero_basis, "accept_len": 1.0},
            {"steps": 2, "tokens_per_s": spec, "spread": 0.03, "basis": "fitted", "accept_len": 2.1}]}
    return {"predict": [], "by_bs": {"predict_by_bs": [row(8, 1000, 1500), row(32, 3000, 3300), row(64, 6000, 4800)],
                                     "crossover_bs": 64, "max_bs": 64, "predict_by_bs_notes": ["cost: ..."]}}


def test_speculation_slower_from_a_batch_size_on_needs_no_speculation_measured_there():
    """The model by batch size: from 64 requests a cycle no step count beats no speculation, measured there: a
    predicted medium finding naming 64 and, as the next step, a launch without speculation from there: never an
    adaptive config's [0] tier, which is not plain decoding (measured on the H100, docs/real-gpu.md); the same with
    no speculation estimated: nothing (an estimate never makes it)."""
    found = R.speculation_slower(dataclasses.replace(facts("EAGLE3"), model=_by_bs_model("measured")))
    assert found.severity == "medium" and found.predicted
    assert "from 64 requests a cycle (up to 64) no step count beats no speculation" in found.title
    assert "from 64 requests a cycle only a launch without speculation delivers that" in found.next
    assert "without the --speculative-* flags" in found.next and "Not an adaptive config's [0] tier" in found.next
    assert "--emit-adaptive-config" not in found.next and "speculative-num-steps=0" not in found.next
    assert ("no speculation 6000 records' wall tok/s (±2%, measured), the best step count 2 4800 records' wall "
            "tok/s") in found.evidence[0]["text"]
    assert R.speculation_slower(dataclasses.replace(facts("EAGLE3"), model=_by_bs_model("estimate"))) is None
    # a crossover inside the spreads where a step count is still predicted ahead: the range starts past it
    wide = _by_bs_model("measured")
    wide["by_bs"]["crossover_bs"] = 8
    for r in wide["by_bs"]["predict_by_bs"]:
        for p in r["points"]:
            p["spread"] = 0.3
    found = R.speculation_slower(dataclasses.replace(facts("EAGLE3"), model=wide))
    assert "from 64 requests a cycle (up to 64)" in found.title
    # ... and nothing where a step count is predicted ahead at the largest
    wide["by_bs"]["predict_by_bs"][-1]["points"][1]["tokens_per_s"] = 6100
    assert R.speculation_slower(dataclasses.replace(facts("EAGLE3"), model=wide)) is None


def _steps_by_bs(rows: dict[int, dict[int, float]], best0: tuple[int, ...] = ()) -> dict:
    """A model by batch size: ``rows[bs][steps]`` tok/s (0: no speculation), no speculation best at ``best0``."""
    def row(bs: int, tps: dict[int, float]) -> dict:
        spec = max((s for s in tps if s), key=lambda s: tps[s])
        return {"bs": bs, "best": 0 if bs in best0 else spec, "points": [
            {"steps": s, "tokens_per_s": v, "spread": 0.05, "basis": "measured" if s == 0 else "fitted",
             "accept_len": 1.0 + 0.6 * s} for s, v in sorted(tps.items())]}
    return {"predict": [], "by_bs": {"predict_by_bs": [row(bs, t) for bs, t in sorted(rows.items())],
                                     "crossover_bs": min(best0) if best0 else None, "max_bs": max(rows),
                                     "predict_by_bs_notes": ["cost: verify fitted over 4 batch sizes"]}}


def test_too_many_steps_per_range_of_batch_sizes():
    """The server runs 5 steps; by batch size, 5 is best up to 8, 3 steps beat it by 10-20% from 16 to 32, and
    from 64 no speculation wins (speculation-slower's, not this finding's): too-many-steps names 16 to 32 and 3
    steps, and the live sweep over that ladder with the adaptive config; a model where 5 stays best (or wins by
    under 5%) finds nothing; on an adaptive server, nothing (the controller picks the steps)."""
    f5 = facts("EAGLE3", flags={"speculative-num-steps": "5"})
    model = _steps_by_bs({1: {0: 100, 3: 180, 5: 200}, 8: {0: 800, 3: 1400, 5: 1500},
                          16: {0: 1500, 3: 2200, 5: 2000}, 32: {0: 3000, 3: 3600, 5: 3000},
                          64: {0: 6000, 3: 5000, 5: 4000}}, best0=(64,))
    found = R.too_many_steps(dataclasses.replace(f5, model=model))
    assert found is not None and found.predicted and found.severity == "medium"
    assert found.title == "predicted: from 16 to 32 requests a cycle, 3 steps up to 20% faster than 5"
    assert "--grid speculative-num-steps=3,5 --concurrency 16,32 --emit-adaptive-config" in found.next
    assert any("cost: verify fitted" in e["text"] for e in found.evidence)
    assert R.too_few_steps(dataclasses.replace(f5, model=model)) is None
    flat = _steps_by_bs({8: {0: 800, 3: 1400, 5: 1500}, 32: {0: 3000, 3: 3100, 5: 3000}})
    assert R.too_many_steps(dataclasses.replace(f5, model=flat)) is None  # +3.3%: under the 5% it takes
    adaptive_server = facts("EAGLE3", flags={"speculative-num-steps": "5", "speculative-adaptive": True})
    assert R.too_many_steps(dataclasses.replace(adaptive_server, model=model)) is None
    # two ranges apart, and too few steps at small batches on a 1-step server
    f1 = facts("EAGLE3", flags={"speculative-num-steps": "1"})
    small = _steps_by_bs({1: {1: 150, 3: 200}, 2: {1: 300, 3: 390}, 8: {1: 1000, 3: 1010}, 16: {1: 2000, 3: 2300}})
    few = R.too_few_steps(dataclasses.replace(f1, model=small))
    assert few.title == "predicted: from 1 to 2 requests a cycle, 3 steps up to 33% faster than 1 (and 1 more range)"
    assert "at 16 requests a cycle, 3 steps up to 15% faster than 1" in " ".join(e["text"] for e in few.evidence)


def test_doctor_prices_up_to_the_batch_limit_the_server_derived(tmp_path, monkeypatch):
    """sglang lowers --max-running-requests for a speculative launch (48 on the H100 testbed launched with
    --cuda-graph-max-bs 64): the server's /server_info says so, and doctor's model by batch size prices up to that
    limit, not the command line's 64; without it in /server_info, up to the flag's 64."""
    from eaglepatch.doctor.collect import server_facts

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # no sweep kept
    for bs in (1, 4, 16):
        write_records(tmp_path / "logs", 4242, bs=bs, accept=2.0, t0=1.7e9 + bs, phases={
            "draft": 0.5 + 0.01 * bs, "verify": 2.0 + 0.05 * bs, "draft_extend": 0.4})
    argv = [*ARGV, "--cuda-graph-max-bs", "64"]
    srv = SimpleNamespace(pid=4242, port=30000, argv=argv, env={}, children=(), start=None)

    def model(server_info: dict | None) -> dict:
        got = {"server_info": {"doc": server_info, "endpoint": "/server_info"} if server_info else {}}
        f, _ = server_facts("gpu1", "0.5.16", srv, got, {"error": "none"}, "patched", "/tmp/eaglepatch",
                            str(tmp_path / "logs"), None, True)
        return f.model["by_bs"]

    assert model({"max_running_requests": 48})["max_bs"] == 48
    assert model({"max_running_requests": 48})["predict_by_bs"][-1]["bs"] == 48
    assert model(None)["max_bs"] == 64
