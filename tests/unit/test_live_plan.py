"""The pure parts of ``sweep --live`` (eaglepatch.tuning.live): the grid, the plan of windows, the adaptive launch's
command line, the request ids the runtime reads, a window's figures, the summary; and a window of load
(eaglepatch.tuning.load.run_window) against a small HTTP server."""

from __future__ import annotations

import importlib.util
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from eaglepatch.errors import UsageError
from eaglepatch.tuning import live as lv
from eaglepatch.tuning.load import LoadSpec, run_window

RUNTIME = Path(__file__).resolve().parents[2] / "eaglepatch" / "runtime" / "_eaglepatch_runtime.py"


@pytest.mark.parametrize("grid, steps", [
    (["speculative-num-steps=0,1,3,7"], (0, 1, 3, 7)),
    (["--speculative-num-steps=7,3"], (7, 3)),
])
def test_the_grid_of_a_live_sweep_is_step_counts(grid, steps):
    assert lv.live_steps(grid) == steps


@pytest.mark.parametrize("grid, words", [
    (["speculative-eagle-topk=1,2"], "one axis"),
    (["speculative-num-steps=1,3", "cuda-graph-max-bs=8,16"], "one axis"),
    ([], "one axis"),
    (["speculative-num-steps=1,x"], "not a step count"),
    (["speculative-num-steps=1,65"], "not a step count"),
    (["speculative-num-steps=-1,2"], "not a step count"),
    (["speculative-num-steps=3"], "two step counts or more"),
    (["speculative-num-steps=3,03"], "two step counts or more"),
])
def test_other_grids_are_usage_errors(grid, words):
    with pytest.raises(UsageError, match=words):
        lv.live_steps(grid)


def test_each_round_measures_every_point_once_in_its_own_seeded_order():
    plan = lv.plan_windows(4, 3, "seed")
    assert plan == lv.plan_windows(4, 3, "seed")
    rounds = [[i for r, j, i in plan if r == k] for k in range(3)]
    assert all(sorted(x) == [0, 1, 2, 3] for x in rounds)
    assert [r for r, _, _ in plan] == [0] * 4 + [1] * 4 + [2] * 4 and {j for _, j, _ in plan} == {0}
    orders = {tuple(i for r, _, i in lv.plan_windows(6, 8, "seed") if r == k) for k in range(8)}
    assert len(orders) > 1  # shuffled per round, not once (the seed fixes which orders)
    with pytest.raises(UsageError, match="--rounds"):
        lv.plan_windows(4, 0, "seed")


def test_the_adaptive_launch_sets_its_flags_where_they_stood():
    argv = ["/v/bin/python", "-m", "sglang.launch_server", "--model", "m", "--speculative-algorithm", "EAGLE3",
            "--speculative-num-steps", "3", "--speculative-num-draft-tokens", "4", "--port", "30000"]
    assert lv.live_argv(argv, 3, (0, 1, 7, 3), "/tmp/ep/adaptive-x.json") == [
        "/v/bin/python", "-m", "sglang.launch_server", "--model", "m", "--speculative-algorithm", "EAGLE3",
        "--speculative-num-steps", "7", "--speculative-num-draft-tokens", "8", "--port", "30000",
        "--speculative-adaptive", "--speculative-adaptive-config", "/tmp/ep/adaptive-x.json",
        "--speculative-eagle-topk", "1"]
    again = lv.live_argv(lv.live_argv(argv, 3, (1, 3), "/c.json"), 3, (1, 3), "/c.json")
    assert again == lv.live_argv(argv, 3, (1, 3), "/c.json") and again.count("--speculative-adaptive") == 1


def _runtime():
    spec = importlib.util.spec_from_file_location("_eaglepatch_runtime_live_plan", str(RUNTIME))
    rt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rt)  # type: ignore[union-attr]
    import atexit

    atexit.unregister(rt._at_exit)
    return rt


def test_the_request_ids_name_the_step_count_the_way_the_runtime_reads_it():
    rt = _runtime()
    token = "0123456789abcdef"
    prefix = rt._lease_of({"v": 1, "token": token, "steps": [0, 7], "deadline": 4e9})[0]

    class Req:
        def __init__(self, rid):
            self.rid = rid

    class B:
        def __init__(self, rid):
            self.reqs = [Req(rid)]

    for steps in (0, 7, 12, 64):
        for window in (0, 31):
            assert rt._marked_steps(B(lv.rid_prefix(token, steps, window) + "5"), prefix) == steps


def rec(mode="decode", spec=None):
    d = {"mode": mode}
    if spec is not None:
        d["spec"] = spec
    return d


def test_a_windows_cycles_are_counted_as_pinned_or_not():
    pinned = {"steps": 3, "topk": 1, "draft_tokens": 4, "pinned": True}
    records = [rec(spec=pinned), rec(spec=pinned), rec(spec=dict(pinned, steps=1)), rec(spec=dict(pinned, pinned=False)),
               rec(spec={"steps": 3, "topk": 1, "draft_tokens": 4}), rec(), rec("prefill", spec=pinned)]
    assert lv.count_cycles(records, 3) == {"pinned": 2, "other": 4}


def test_the_pinned_group_of_a_window():
    groups = [{"mode": "prefill", "key": {}},
              {"mode": "decode", "key": {"spec": "steps=3,topk=1,draft_tokens=4"}, "n": 5},
              {"mode": "decode", "key": {"spec": "steps=3,topk=1,draft_tokens=4,pinned=true"}, "n": 50},
              {"mode": "decode", "key": {"spec": "steps=31,topk=1,draft_tokens=32,pinned=true"}, "n": 9}]
    assert [g["n"] for g in lv.pinned_group(groups, 3)] == [50]
    assert lv.pinned_group([{"mode": "decode", "key": {}, "n": 7}], 3) == [{"mode": "decode", "key": {}, "n": 7}]
    by_bs = [{"mode": "decode", "key": {"bs": 1}, "n": 40, "wall_tokens_per_s": 100.0},
             {"mode": "decode", "key": {"bs": 2}, "n": 3, "wall_tokens_per_s": 150.0},
             {"mode": "decode", "key": {"bs": 4, "spec": "steps=1,topk=1,draft_tokens=2,pinned=true"}, "n": 40,
              "wall_tokens_per_s": 300.0}]
    assert lv.bs_figures({"groups": by_bs}, 3) == {1: 100.0}


def run(point, rep, tps, t, cycles=None):
    d = {"point": point, "rep": rep, "status": "ok", "tokens_per_s": tps, "accept_len": 2.0, "t": t,
         "phases_p50": {"cycle": 9.0}, "client": {"seconds": 20.0}}
    if cycles:
        d["cycles"] = cycles
    return d


def test_the_summary_per_point_windows_spread_and_notes():
    steps = (1, 3)
    k1, k3 = (p.key for p in lv.points_of(steps))
    runs = [run(k1, 0, 100.0, 1, {"pinned": 10, "other": 0}), run(k3, 0, 120.0, 2, {"pinned": 9, "other": 1}),
            run(k3, 1, 110.0, 3, {"pinned": 9, "other": 0}), run(k1, 1, 90.0, 4, {"pinned": 9, "other": 0})]
    doc = lv.summarize("t", steps, runs, rounds=2, launches=1, window_s=20.0)
    assert (doc["live"], doc["launches"], doc["rounds"], doc["window_s"], doc["best"], doc["baseline"]) == (
        True, 1, 2, 20.0, 1, None)
    a, b = doc["points"]
    assert (a["steps"], a["windows"], a["window_tokens_per_s"], a["tokens_per_s"]) == (
        1, 2, [100.0, 90.0], {"median": 95.0, "min": 90.0, "max": 100.0})
    assert a["spread"] == round(10 / 95, 4) and b["spread"] == round(10 / 115, 4)
    assert b["cycles"] == {"pinned": 18, "other": 1} and a["runs"] == 2 and "repeat" not in doc
    assert any("1 decode cycle(s) inside the windows did not run" in n for n in doc["notes"])
    one = lv.summarize("t", steps, runs[:2], rounds=1, launches=0, window_s=2.0)
    assert any(n.startswith("one window per point") for n in one["notes"])
    assert not any("launch" in n for n in one["notes"])


class _Gen(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    bodies: list = []
    lock = threading.Lock()

    def log_message(self, *a):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.lock:
            self.bodies.append(body)
        data = json.dumps({"text": "x", "meta_info": {"completion_tokens": body["sampling_params"]["max_new_tokens"],
                                                      "spec_verify_ct": 2}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def test_a_window_sends_requests_until_its_time_is_up_each_with_its_own_id():
    _Gen.bodies = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Gen)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        spec = LoadSpec(requests=1, concurrency=2, input_len=3, max_new_tokens=4, warmup=0)
        res = run_window(f"http://127.0.0.1:{httpd.server_address[1]}", spec, 0.3, "eaglepatch-t-s3-w1-",
                         offset=500, stream=False)
    finally:
        httpd.shutdown()
        httpd.server_close()
    rids = [b["rid"] for b in _Gen.bodies]
    n = len(rids)
    assert n == len(res.results) and n >= 2 and res.failed == 0
    assert sorted(rids) == sorted(f"eaglepatch-t-s3-w1-{i}" for i in range(n))
    by_rid = {b["rid"]: b["input_ids"] for b in _Gen.bodies}
    assert by_rid["eaglepatch-t-s3-w1-1"] == spec.prompts(1, offset=501)[0]
    assert res.to_json()["output_tokens"] == 4 * n and res.accept_len == 2.0


def test_the_models_figures_per_batch_size_from_a_windows_pinned_groups():
    """report --by bs --predict of a window pinned at 5 steps: per batch size, each step count above 0 the model
    holds ([tok/s, spread, basis]); the zero-step estimate (plain decoding, not the adaptive zero-step state), other
    spec groups and batch sizes of few cycles are left out."""
    def pred(*pts):
        return [{"steps": s, "tokens_per_s": t, "spread": 0.1, "basis": b} for s, t, b in pts]

    pinned = "steps=5,topk=1,draft_tokens=6,pinned=true"
    groups = [
        {"mode": "decode", "key": {"bs": 1, "spec": pinned}, "n": 50,
         "predict": pred((0, 300.0, "estimate"), (1, 200.0, "profile"), (5, 250.0, "measured"))},
        {"mode": "decode", "key": {"bs": 2, "spec": pinned}, "n": 5, "predict": pred((1, 400.0, "profile"))},
        {"mode": "decode", "key": {"bs": 4, "spec": "steps=3,topk=1,draft_tokens=4"}, "n": 90,
         "predict": pred((1, 1.0, "profile"))},
        {"mode": "prefill", "key": {"bs": 1}, "n": 50},
    ]
    assert lv.bs_predictions(groups, 5) == {1: {1: [200.0, 0.1, "profile"], 5: [250.0, 0.1, "measured"]}}


@pytest.mark.parametrize("window, seconds", [(0.5, 0.5), (1, 1), (4, 2), (8, 2), (20, 5), (60, 15)])
def test_each_state_is_warmed_up_a_quarter_window_at_least_2_s_at_most_the_window(window, seconds):
    from eaglepatch.tuning.drive_live import warm_seconds

    assert warm_seconds(window) == seconds


# --- what a mutation run of eaglepatch.tuning.live found unsaid (docs/mutation-runtime.md, last section) -----

def test_64_steps_is_the_largest_step_count():
    assert lv.live_steps(["speculative-num-steps=1,64"]) == (1, 64)


@pytest.mark.parametrize("call, message", [
    (lambda: lv.live_steps(["speculative-eagle-topk=1,2"]),
     "--live sweeps one axis, --grid speculative-num-steps=v1,v2,... (sglang's adaptive runtime states differ in "
     "their step counts alone): sweep other flags without --live"),
    (lambda: lv.live_steps(["speculative-num-steps=1,x"]),
     "--grid speculative-num-steps: 'x' is not a step count (a whole number, 0 to 64)"),
    (lambda: lv.live_steps(["speculative-num-steps=3"]),
     "--live needs two step counts or more to compare (--grid speculative-num-steps=1,3)"),
    (lambda: lv.plan_windows(4, 0, "seed"), "--rounds must be 1 or more, not 0"),
])
def test_each_usage_error_is_one_whole_line_saying_what_to_do(call, message):
    with pytest.raises(UsageError) as e:
        call()
    assert str(e.value) == message


def test_one_round_is_a_plan():
    assert sorted(lv.plan_windows(3, 1, "seed")) == [(0, 0, 0), (0, 0, 1), (0, 0, 2)]


def test_a_ladder_measures_every_load_and_point_pair_once_a_round_interleaved():
    """--concurrency 1,8,64 with three step counts: each round holds all nine (load, point) pairs once, shuffled
    together (a load is not measured in one block, where drift would read as the load's effect); without a ladder
    the plan, and every window's number, is what it was before ladders (a saved sweep resumes as planned)."""
    plan = lv.plan_windows(3, 2, "seed", n_loads=3)
    assert plan == lv.plan_windows(3, 2, "seed", n_loads=3)
    for k in range(2):
        assert sorted((j, i) for r, j, i in plan if r == k) == [(j, i) for j in range(3) for i in range(3)]
    loads_in_order = [j for r, j, _ in plan if r == 0]
    assert loads_in_order != sorted(loads_in_order)
    numbers = {lv.window_number(r, j, i, 3, 3) for r, j, i in plan}
    assert len(numbers) == len(plan) == 18 and numbers == set(range(18))
    assert [lv.window_number(r, 0, i, 1, 4) for r, _, i in lv.plan_windows(4, 2, "s")] == \
        [r * 4 + i for r, _, i in lv.plan_windows(4, 2, "s")]


def test_a_live_sweeps_identity_is_each_of_its_parts_and_no_order_of_the_loads_fields():
    base = ("t", (1, 3), 3, 20.0, {"requests": 4, "concurrency": 2})
    ident = lv.live_id(*base)
    assert len(ident) == 16 and int(ident, 16) >= 0
    assert lv.live_id("t", (1, 3), 3, 20.0, {"concurrency": 2, "requests": 4}) == ident
    for i, other in enumerate(("u", (1, 5), 2, 10.0, {"requests": 8, "concurrency": 2})):
        changed = list(base)
        changed[i] = other
        assert lv.live_id(*changed) != ident, i


def test_a_records_spec_names_its_steps_and_whether_they_were_pinned():
    assert lv.spec_of({}) == (None, False)
    assert lv.spec_of({"spec": {"steps": 3}}) == (3, False)
    assert lv.spec_of({"spec": {"steps": 3, "pinned": True}}) == (3, True)
    assert lv.spec_of({"spec": {"steps": True, "pinned": True}}) == (None, True)


def test_cycles_after_a_prefill_are_counted():
    pinned = {"steps": 3, "topk": 1, "draft_tokens": 4, "pinned": True}
    assert lv.count_cycles([rec("prefill", spec=pinned), rec(spec=pinned)], 3) == {"pinned": 1, "other": 0}


def test_a_windows_pinned_group_is_its_newest_unless_asked_per_batch_size():
    groups = [{"mode": "decode", "key": {"spec": "steps=3,topk=1,draft_tokens=4,pinned=true"}, "n": n}
              for n in (1, 2, 3)]
    assert [g["n"] for g in lv.pinned_group(groups, 3)] == [3]
    assert [g["n"] for g in lv.pinned_group(groups, 3, by_bs=True)] == [1, 2, 3]


def test_a_windows_figures_come_from_its_pinned_group():
    client = {"tokens_per_s": 120.0, "accept_len": 2.5}
    group = {"mode": "decode", "key": {"spec": "steps=3,topk=1,draft_tokens=4,pinned=true"}, "n": 40,
             "accept_len": 2.4, "cycle_ms": {"p50": 7.5}, "phases": {"verify": {"p50": 3.0}}}
    other = {"mode": "decode", "key": {"spec": "steps=1,topk=1,draft_tokens=2,pinned=true"}, "n": 9,
             "accept_len": 1.6, "cycle_ms": {"p50": 5.0}}
    fig = lv.window_figures(client, {"groups": [group, other], "records": 49}, {"pinned": 40, "other": 9}, 3)
    assert fig == {"tokens_per_s": 120.0, "accept_len": 2.5, "phases_p50": {"verify": 3.0, "cycle": 7.5},
                   "records": 49, "accept_len_log": 2.4, "cycles": {"pinned": 40, "other": 9},
                   "tpot_p50_ms": None, "tpot_p90_ms": None}
    assert lv.window_figures(client, None, None, 3) == {"tokens_per_s": 120.0, "accept_len": 2.5, "phases_p50": {},
                                                       "records": None, "accept_len_log": None,
                                                       "tpot_p50_ms": None, "tpot_p90_ms": None}


def test_a_batch_size_of_10_cycles_counts_and_the_servers_own_tok_s_stands_in_for_the_wall():
    pinned = "steps=5,topk=1,draft_tokens=6,pinned=true"
    groups = [{"mode": "decode", "key": {"bs": 1, "spec": pinned}, "n": 9, "wall_tokens_per_s": 90.0,
               "predict": [{"steps": 1, "tokens_per_s": 50.0, "spread": 0.1, "basis": "profile"}]},
              {"mode": "decode", "key": {"bs": 2, "spec": pinned}, "n": 10, "tokens_per_s": 100.0,
               "predict": [{"steps": 1, "tokens_per_s": 60.0, "spread": 0.1, "basis": "profile"}]}]
    assert lv.bs_figures({"groups": groups}, 5) == {2: 100.0}
    assert lv.bs_predictions(groups, 5) == {2: {1: [60.0, 0.1, "profile"]}}


def test_the_summary_reads_ok_windows_in_time_order_and_says_what_they_measured():
    steps = (1, 3)
    k1, k3 = (p.key for p in lv.points_of(steps))
    runs = [dict(run(k1, 1, 90.12345, 4, {"pinned": 9}), accept_len_log=1.5),
            dict(run(k1, 0, 100.0, 1, {"pinned": 10, "other": 1}), accept_len_log=1.7),
            dict(run(k1, 2, 95.0, 6), accept_len_log="n/a"),
            dict(run(k1, 3, None, 7)),
            dict(run(k1, 4, 500.0, 8), status="failed"),
            dict(run(k3, 0, 120.0, 2), client={"seconds": 2.0}),
            run(k3, 1, 110.0, 3)]
    doc = lv.summarize("t", steps, runs, rounds=2, launches=0, window_s=20.0)
    a, b = doc["points"]
    assert a["window_tokens_per_s"] == [100.0, 90.123, 95.0]
    assert a["accept_len_log"] == 1.6 and b["accept_len_log"] is None
    assert a["cycles"] == {"pinned": 19, "other": 1} and "cycles" not in b
    assert any(n.startswith("1 of 5 window(s) measured under ") and n.endswith("raise --window") for n in doc["notes"])
    assert not any(n.startswith("one window per point") for n in doc["notes"])
    one = lv.summarize("t", steps, runs[-2:], rounds=1, launches=0, window_s=20.0)
    assert not any(n.startswith("one window per point") for n in one["notes"])
    assert not any("did not run at their window's pinned step count" in n for n in one["notes"])


def test_one_round_keeps_sweeps_other_notes_and_says_the_windows_own():
    steps = (1, 3)
    k1, k3 = (p.key for p in lv.points_of(steps))
    runs = [dict(run(k1, 0, 100.0, 1, {"pinned": 9, "other": 2}), accept_len_log=1.23456, client={"seconds": 2.0}),
            run(k3, 0, 120.0, 2)]
    doc = lv.summarize("t", steps, runs, rounds=1, launches=0, window_s=2.0)
    assert doc["points"][0]["accept_len_log"] == 1.2346
    assert [n.split(" ")[:4] for n in doc["notes"]] == [
        ["1", "of", "2", "window(s)"], ["one", "window", "per", "point:"], ["2", "decode", "cycle(s)", "inside"]]
    assert doc["notes"][2] == ("2 decode cycle(s) inside the windows did not run at their window's pinned step count "
                               "(other traffic on the server, or a lease that ran out): their phases are left out")


def test_windows_that_ran_their_cycles_at_different_speeds_are_not_said_to_be_launches():
    """A restart sweep's note on launches of one point at different cycle speeds (sweep_summary) is not a live
    sweep's: its windows ran in one launch, and their spread is in the table."""
    k1, k3 = (p.key for p in lv.points_of((1, 3)))
    runs = [run(k1, 0, 100.0, 1), dict(run(k1, 1, 60.0, 2), phases_p50={"cycle": 15.0}), run(k3, 0, 120.0, 3)]
    doc = lv.summarize("t", (1, 3), runs, rounds=2, launches=0, window_s=20.0)
    assert doc["points"][0]["window_tokens_per_s"] == [100.0, 60.0]
    assert not any("decode cycles" in n for n in doc["notes"]), doc["notes"]


def test_a_grid_with_steps_0_says_the_zero_state_is_not_no_speculation():
    """The H100 live sweep: its steps 0 ran 3,180 tok/s at 64 requests a time where a launch without speculation
    ran 7,974: the summary says so whenever 0 is in the grid, and not otherwise."""
    runs = [{"point": lv.points_of((0, 3))[i].key, "index": i, "rep": 0, "steps": s, "status": "ok",
             "tokens_per_s": t, "t": i} for i, (s, t) in enumerate(((0, 3180.0), (3, 6354.0)))]
    doc = lv.summarize("gpu1", (0, 3), runs, 1, 0, 8.0)
    assert any(n.startswith("steps 0 is sglang's adaptive zero-step state, not plain decoding") for n in doc["notes"])
    runs3 = [dict(r, point=lv.points_of((1, 3))[i].key, steps=(1, 3)[i]) for i, r in enumerate(runs)]
    assert not any("zero-step" in n for n in lv.summarize("gpu1", (1, 3), runs3, 1, 0, 8.0)["notes"])
