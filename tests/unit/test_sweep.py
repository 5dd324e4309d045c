"""The pure parts of ``eaglepatch sweep``: the grid and its validation, the points and the shuffled plan
(eaglepatch/tuning/sweep.py), rewriting the launch command (cmdline.py), the state file (sweep_state.py), the summary
(the CONTRACT.md ``sweep --json`` shape), the table and CSV (sweep_summary.py). Its chart: tests/unit/test_chart.py."""

from __future__ import annotations

import json

import pytest

from eaglepatch.tuning import cmdline, sweep_state, sweep_summary
from eaglepatch.tuning import sweep as sw
from eaglepatch.errors import Conflict, UsageError

HEAD = ["/venv/bin/python3", "-m", "sglang.launch_server"]
ARGS = ["--model-path", "m", "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "d",
        "--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4",
        "--port", "30000", "--cuda-graph-bs", "1", "2", "4", "--disable-radix-cache"]


# ----------------------------------------------------------------------------------------------------------------
# the grid


def test_grid_parses_flags_with_or_without_dashes_in_order():
    axes = sw.parse_grid(["speculative-num-steps=1,2,3,5", "--speculative-eagle-topk=1,4", "cuda-graph-max-bs=8"])
    assert [(a.name, a.values, a.kind) for a in axes] == [
        ("speculative-num-steps", ("1", "2", "3", "5"), "flag"),
        ("speculative-eagle-topk", ("1", "4"), "flag"),
        ("cuda-graph-max-bs", ("8",), "flag"),
    ]


@pytest.mark.parametrize("item, words", [
    ("not-a-flag=1,2", "not a flag eaglepatch knows"),
    ("Speculative-num-steps=1", "not a flag name"),
    ("1abc=1", "not a flag name"),
    ("speculative_num_steps=1", "not a flag name"),
    ("port=30001,30002", "cannot be swept"),
    ("host=0.0.0.0", "cannot be swept"),
    ("speculative-num-steps", "expected NAME=v1,v2"),
    ("speculative-num-steps=", "a value is empty"),
    ("speculative-num-steps=1,,2", "a value is empty"),
    ("speculative-num-steps=1,1", "given twice"),
    ("disable-cuda-graph=maybe", "on/off"),
    ("=1,2", "expected NAME=v1,v2"),
])
def test_bad_grid_input_is_a_usage_error(item, words):
    with pytest.raises(UsageError, match=words):
        sw.parse_grid([item])


def test_the_same_flag_twice_or_under_two_spellings_is_refused():
    with pytest.raises(UsageError, match="given twice"):
        sw.parse_grid(["speculative-num-steps=1", "speculative-num-steps=2"])
    with pytest.raises(UsageError, match="two spellings"):
        sw.parse_grid(["tp-size=1,2", "tp=4"])


def test_allow_flag_extends_the_known_list():
    with pytest.raises(UsageError, match="--allow-flag my-flag"):
        sw.parse_grid(["my-flag=1,2"])
    assert sw.parse_grid(["my-flag=1,2"], allow=["my-flag"])[0].values == ("1", "2")
    assert sw.parse_grid(["my-flag=1"], allow=["--my-flag"])[0].name == "my-flag"
    with pytest.raises(UsageError, match="not a flag name"):
        sw.parse_grid([], allow=["Bad Flag"])


def test_boolean_flags_take_on_off():
    [axis] = sw.parse_grid(["disable-cuda-graph=true,off"])
    assert axis.values == ("on", "off")


def test_env_grid():
    [a, b] = sw.parse_env_grid(["NCCL_ALGO=Ring,Tree", "X_1=a b"])
    assert (a.name, a.values, a.kind) == ("NCCL_ALGO", ("Ring", "Tree"), "env")
    assert b.values == ("a b",)
    for bad in ("1X=a", "A-B=1", "A=", "A=1,1"):
        with pytest.raises(UsageError):
            sw.parse_env_grid([bad])
    with pytest.raises(UsageError, match="given twice"):
        sw.parse_env_grid(["A=1", "A=2"])


def test_points_are_the_product_with_the_baseline_first():
    flags = sw.parse_grid(["speculative-num-steps=1,2", "speculative-eagle-topk=1,4"])
    env = sw.parse_env_grid(["NCCL_ALGO=Ring"])
    pts = sw.make_points(flags, env, baseline=True)
    assert pts[0].baseline and pts[0].to_json() == {"flags": {}, "env": {}}
    assert [p.to_json() for p in pts[1:]] == [
        {"flags": {"speculative-num-steps": s, "speculative-eagle-topk": k}, "env": {"NCCL_ALGO": "Ring"}}
        for s in ("1", "2") for k in ("1", "4")
    ]
    assert len({p.key for p in pts}) == len(pts)
    assert pts[1].label == "speculative-num-steps=1 speculative-eagle-topk=1 NCCL_ALGO=Ring"
    assert [p.to_json() for p in sw.make_points((), (), True)] == [{"flags": {}, "env": {}}] * 2  # baseline, as launched
    with pytest.raises(UsageError, match="nothing to sweep"):
        sw.make_points((), (), False)


def test_plan_runs_each_point_r_times_shuffled_and_reproducible():
    pts = sw.make_points(sw.parse_grid(["speculative-num-steps=1,2,3,5"]), (), True)
    plan = sw.plan_runs(pts, 3, "seed-a")
    assert sorted(plan) == [(i, r) for i in range(5) for r in range(3)]
    assert plan == sw.plan_runs(pts, 3, "seed-a")
    assert plan != sorted(plan) and plan != sw.plan_runs(pts, 3, "seed-b")
    with pytest.raises(UsageError):
        sw.plan_runs(pts, 0, "x")


# ----------------------------------------------------------------------------------------------------------------
# command lines


def test_set_flag_replaces_in_place_every_spelling_and_values():
    args = ["--tp", "2", "--x", "1", "--tp-size=4", "--cuda-graph-bs", "1", "2", "4", "--y"]
    assert cmdline.set_flag(args, "tp-size", "8") == ["--tp-size", "8", "--x", "1", "--cuda-graph-bs", "1", "2", "4",
                                                      "--y"]
    assert cmdline.set_flag(args, "cuda-graph-bs", "16") == ["--tp", "2", "--x", "1", "--tp-size=4", "--cuda-graph-bs",
                                                        "16", "--y"]
    assert cmdline.set_flag(args, "mem-fraction-static", "0.8")[-2:] == ["--mem-fraction-static", "0.8"]
    assert cmdline.set_flag(args, "x", None) == ["--tp", "2", "--tp-size=4", "--cuda-graph-bs", "1", "2", "4", "--y"]


def test_boolean_flags_are_added_and_removed():
    args = ["--disable-cuda-graph", "--port", "1"]
    assert cmdline.set_flag(args, "disable-cuda-graph", "off") == ["--port", "1"]
    assert cmdline.set_flag(["--port", "1"], "disable-cuda-graph", "on") == ["--port", "1", "--disable-cuda-graph"]
    assert cmdline.flag_value(args, "disable-cuda-graph") == "on"


def test_flag_value():
    assert cmdline.flag_value(ARGS, "speculative-num-steps") == "3"
    assert cmdline.flag_value(ARGS, "cuda-graph-bs") == "1 2 4"
    assert cmdline.flag_value(["--tp=2"], "tp-size") == "2"
    assert cmdline.flag_value(ARGS, "nope") is None


def test_baseline_removes_every_speculative_flag_only():
    argv, notes = cmdline.point_argv(HEAD + ARGS, 3, sw.Point(baseline=True))
    assert argv == HEAD + ["--model-path", "m", "--port", "30000", "--cuda-graph-bs", "1", "2", "4",
                           "--disable-radix-cache"]
    assert notes == []
    assert not cmdline.runs_speculation(argv[3:]) and cmdline.runs_speculation(ARGS)


def test_point_argv_sets_flags_and_derives_draft_tokens_for_topk_1():
    p = sw.Point(flags=(("speculative-num-steps", "5"),))
    argv, notes = cmdline.point_argv(HEAD + ARGS, 3, p)
    assert argv[:3] == HEAD
    assert cmdline.flag_value(argv[3:], "speculative-num-steps") == "5"
    assert cmdline.flag_value(argv[3:], "speculative-num-draft-tokens") == "6"
    assert notes and "steps + 1" in notes[0]
    assert argv.index("--speculative-num-steps") == (HEAD + ARGS).index("--speculative-num-steps")  # in place
    # given explicitly: kept as given
    p = sw.Point(flags=(("speculative-num-steps", "5"), ("speculative-num-draft-tokens", "9")))
    assert cmdline.flag_value(cmdline.point_argv(HEAD + ARGS, 3, p)[0][3:], "speculative-num-draft-tokens") == "9"
    # top-k above 1: the command line's own value stays
    p = sw.Point(flags=(("speculative-num-steps", "5"), ("speculative-eagle-topk", "4")))
    assert cmdline.flag_value(cmdline.point_argv(HEAD + ARGS, 3, p)[0][3:], "speculative-num-draft-tokens") == "4"


def test_point_env_overrides_the_original():
    p = sw.Point(env=(("NCCL_ALGO", "Tree"),))
    assert cmdline.point_env({"NCCL_ALGO": "Ring", "PATH": "/bin"}, p) == {"NCCL_ALGO": "Tree", "PATH": "/bin"}


def test_a_server_without_speculation_refuses_speculative_axes():
    plain = ["--model-path", "m"]
    with pytest.raises(UsageError, match="runs no speculation"):
        cmdline.check_speculation(plain, sw.parse_grid(["speculative-num-steps=1,2"]))
    cmdline.check_speculation(plain, sw.parse_grid(["cuda-graph-max-bs=8,16"]))
    cmdline.check_speculation(plain, sw.parse_grid(["speculative-algorithm=EAGLE3", "speculative-num-steps=1,2"]))
    cmdline.check_speculation(ARGS, sw.parse_grid(["speculative-num-steps=1,2"]))


# ----------------------------------------------------------------------------------------------------------------
# the state file


def test_state_file_round_trip_and_a_line_cut_short(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    pts = sw.make_points(sw.parse_grid(["speculative-num-steps=1,2"]), (), False)
    ident = sweep_state.sweep_id("root@gpu1", pts, 2, {"requests": 8})
    assert ident == sweep_state.sweep_id("root@gpu1", pts, 2, {"requests": 8})
    assert ident != sweep_state.sweep_id("root@gpu1", pts, 3, {"requests": 8})
    assert ident != sweep_state.sweep_id("root@gpu2", pts, 2, {"requests": 8})
    path = sweep_state.state_path("root@gpu1", ident)
    assert path.startswith(str(tmp_path / "cache" / "eaglepatch" / "sweeps"))
    st = sweep_state.StateFile(path)
    assert st.header is None and st.runs == []
    st.write_header({"original": {"argv": ["x"]}})
    st.add_run({"point": pts[0].key, "rep": 0, "status": "ok"})
    with open(path, "a") as f:
        f.write('{"kind": "run", "point": "cut sh')  # a crash in the middle of a write
    st2 = sweep_state.StateFile(path)
    assert st2.header["original"] == {"argv": ["x"]}
    assert st2.done() == {(pts[0].key, 0)}
    st2.add_run({"point": pts[1].key, "rep": 1, "status": "failed"})
    st3 = sweep_state.StateFile(path)
    assert st3.done() == {(pts[0].key, 0), (pts[1].key, 1)}
    assert st3.failed_points() == {pts[1].key}


def test_state_file_lock_is_exclusive(tmp_path):
    a = sweep_state.StateFile(str(tmp_path / "s.jsonl"))
    b = sweep_state.StateFile(str(tmp_path / "s.jsonl"))
    a.lock()
    try:
        with pytest.raises(Conflict, match="another eaglepatch sweep"):
            b.lock()
    finally:
        a.unlock()
    b.lock()
    b.unlock()


# ----------------------------------------------------------------------------------------------------------------
# the summary


def _run(p, rep, tps, acc=None, phases=None, status="ok", **kw):
    return dict({"point": p.key, "rep": rep, "status": status, "tokens_per_s": tps, "accept_len": acc,
                 "phases_p50": phases or {}}, **kw)


def _points():
    return sw.make_points(sw.parse_grid(["speculative-num-steps=1,2,3"]), (), True)


def test_summary_has_the_contract_shape_medians_speedup_and_best():
    pts = _points()
    ph = {"draft": 3.0, "verify": 8.0, "draft_extend": 1.0, "cycle": 12.0}
    runs = [
        _run(pts[0], 0, 90.0), _run(pts[0], 1, 88.0), _run(pts[0], 2, 91.0),
        _run(pts[1], 0, 80.0, 2.0, ph), _run(pts[1], 1, 82.0, 2.0, ph), _run(pts[1], 2, 81.0, 2.0, ph),
        _run(pts[2], 0, 94.0, 2.9, ph), _run(pts[2], 1, 92.5, 3.1, dict(ph, draft=3.2)), _run(pts[2], 2, 95.1, 2.8, ph),
        _run(pts[3], 0, 89.0, 3.2, ph), _run(pts[3], 1, 93.0, 3.2, ph), _run(pts[3], 2, 85.0, 3.2, ph),
    ]
    doc = sweep_summary.summarize("root@gpu1", pts, runs, baseline=True, repeat=3)
    assert set(doc) >= {"target", "baseline", "points", "best"}
    assert (doc["target"], doc["baseline"], doc["best"]) == ("root@gpu1", 0, 2)
    contract_keys = {"flags", "env", "status", "runs", "tokens_per_s", "accept_len", "phases_p50", "speedup"}
    for p in doc["points"]:
        assert contract_keys <= set(p)
    base, one, two, three = doc["points"]
    assert base == dict(base, flags={}, env={}, status="ok", runs=3, accept_len=None, phases_p50={}, speedup=1.0,
                        tokens_per_s={"median": 90.0, "min": 88.0, "max": 91.0})
    assert two["flags"] == {"speculative-num-steps": "2"} and two["env"] == {}
    assert two["tokens_per_s"] == {"median": 94.0, "min": 92.5, "max": 95.1}
    assert two["accept_len"] == 2.9
    assert two["phases_p50"] == {"draft": 3.0, "verify": 8.0, "draft_extend": 1.0, "cycle": 12.0}
    assert two["speedup"] == round(94.0 / 90.0, 3)
    assert one["speedup"] == round(81.0 / 90.0, 3)
    # noise: the range of steps=3 (85-93) overlaps the best's (92.5-95.1); steps=1 (80-82) does not
    assert (two["within_noise"], three["within_noise"], one["within_noise"]) == (True, True, False)
    assert any("within noise of the best" in n and "speculative-num-steps=3" in n for n in doc["notes"])
    json.dumps(doc)


def test_summary_failed_pending_and_no_baseline():
    pts = sw.make_points(sw.parse_grid(["speculative-num-steps=2,99,3"]), (), False)
    runs = [_run(pts[0], 0, 50.0, 3.0),
            _run(pts[1], 0, None, status="failed", error="sglang exited during startup", log_tail="boom")]
    doc = sweep_summary.summarize("t", pts, runs, baseline=False, repeat=1)
    assert doc["baseline"] is None and doc["best"] == 0
    ok, bad, pending = doc["points"]
    assert ok["speedup"] is None  # no baseline: no speedups
    assert bad == dict(bad, status="failed", runs=0, tokens_per_s=None, accept_len=None, phases_p50={},
                       error="sglang exited during startup", log_tail="boom", speedup=None)
    assert pending["status"] == "pending"
    assert any("not patched" in n for n in doc["notes"])
    table = sweep_summary.render_table(doc)
    assert "failed: speculative-num-steps=99: sglang exited during startup" in table
    assert "*0" in table


def test_summary_with_a_failed_baseline_has_no_speedups_and_no_best_when_nothing_ran():
    pts = _points()
    runs = [_run(pts[0], 0, None, status="failed", error="x"), _run(pts[1], 0, 10.0)]
    doc = sweep_summary.summarize("t", pts, runs, baseline=True, repeat=1)
    assert all(p["speedup"] is None for p in doc["points"])
    assert any("baseline did not run" in n for n in doc["notes"])
    assert sweep_summary.summarize("t", pts, [], baseline=True, repeat=1)["best"] is None


def test_summary_says_when_a_run_measured_too_short_a_load():
    pts = _points()
    runs = [_run(pts[0], 0, 3000.0, client={"seconds": 0.84}), _run(pts[1], 0, 1200.0, client={"seconds": 12.0}),
            _run(pts[2], 0, 1500.0, client={"seconds": 3.1}),
            _run(pts[3], 0, None, status="failed", error="x", client={"seconds": 0.1})]
    notes = sweep_summary.summarize("t", pts, runs, baseline=True, repeat=1)["notes"]
    short = [n for n in notes if "of load" in n]
    assert short == [short[0]] and short[0].startswith("2 of 3 run(s) measured under 5 s of load (the shortest 0.8 s)")
    long_only = [_run(pts[0], 0, 90.0, client={"seconds": 5.0}), _run(pts[1], 0, 95.0)]
    notes = sweep_summary.summarize("t", pts, long_only, baseline=True, repeat=1)["notes"]
    assert not any("of load" in n for n in notes)


def test_summary_says_when_a_points_launches_ran_at_different_speeds():
    # the host-bound H200 run of docs/real-gpu.md (2026-12-05): three launches at 3 steps, two in a slow spell
    pts = _points()
    cyc = lambda ms: {"cycle": ms, "verify": 1.0}  # noqa: E731
    runs = [_run(pts[3], 0, 1581.651, 1.8665, cyc(2.6246)), _run(pts[3], 1, 1373.848, 1.8665, cyc(3.2534)),
            _run(pts[3], 2, 2076.275, 1.8665, cyc(2.0407)),
            _run(pts[1], 0, 1824.0, 1.4995, cyc(1.90)), _run(pts[1], 1, 1910.7, 1.4995, cyc(1.58))]
    notes = sweep_summary.summarize("t", pts, runs, baseline=True, repeat=3)["notes"]
    drift = [n for n in notes if "decode cycles" in n]
    assert drift == [
        "launches of one point ran their decode cycles (p50) at different speeds: speculative-num-steps=1: 1.58 to "
        "1.90 ms (1.2x) at one accept length (1.50), 1911 against 1824 client tok/s; speculative-num-steps=3: 2.04 "
        "to 3.25 ms (1.6x) at one accept length (1.87), 2076 against 1374 client tok/s. The setting was the same in "
        "each, so the "
        "machine's speed moved between launches and the point's median mixes them: compare points by launches of "
        "like cycle times, or run the sweep again when the machine is steady"]
    # after the note about noise
    assert notes.index(drift[0]) > max(i for i, n in enumerate(notes) if "within noise" in n)


@pytest.mark.parametrize("cycles, accs, expect", [
    ((2.0, 2.199), (1.9, 1.9), None),  # under 1.1x: launches that agree
    ((2.0, 2.2), (1.9, 1.9), "2.00 to 2.20 ms (1.1x) at one accept length (1.90), 1000 against 1001"),  # 1.1x
    ((2.0, 2.4), (1.9, 1.9), "2.00 to 2.40 ms (1.2x) at one accept length (1.90), 1000 against 1001"),
    ((2.4, 2.0), (1.9, 1.9), "2.00 to 2.40 ms (1.2x) at one accept length (1.90), 1001 against 1000"),  # any order
    ((2.0, 2.4), (1.9, 1.8), "2.00 to 2.40 ms (1.2x), 1000 against 1001"),  # accept lengths 3% or more apart
    ((2.0, 2.4), (1.9, 1.845), "(1.2x) at one accept length (1.87), "),  # within 3% of their median
    ((2.0, 2.4), (1.9, 1.843), "(1.2x), "),  # just over it
    ((2.0, 2.4), (1.9, None), "(1.2x), "),  # a launch without an accept length: no claim about it
    ((2.0,), (1.9,), None),  # one launch: nothing to compare
    ((2.0, 0.0, 1.0), (1.9, 1.9, 1.9), "1.00 to 2.00 ms (2.0x) at one accept length (1.90), 1002 against 1000"),
])
def test_cycle_drift_bounds(cycles, accs, expect):
    pts = _points()
    runs = [_run(pts[1], i, 1000.0 + i, a, {"cycle": c}) for i, (c, a) in enumerate(zip(cycles, accs))]
    runs.append(_run(pts[1], 9, 900.0, 1.9))  # a launch without timings counts for tok/s, not for the cycles
    drift = [n for n in sweep_summary.summarize("t", pts, runs, baseline=False, repeat=3)["notes"]
             if "decode cycles" in n]
    if expect is None:
        assert drift == []
    else:
        assert len(drift) == 1 and drift[0].count(" ms (") == 1
        assert "speculative-num-steps=1: " in drift[0] and expect in drift[0]


def test_a_live_sweeps_windows_are_not_launches():
    pts = _points()
    runs = [_run(pts[1], 0, 1000.0, 1.9, {"cycle": 2.0}), _run(pts[1], 1, 1500.0, 1.9, {"cycle": 3.0})]
    notes = sweep_summary.summarize("t", pts, runs, baseline=False, repeat=3, each_a_launch=False)["notes"]
    assert not any("decode cycles" in n for n in notes)
    assert any("decode cycles" in n for n in sweep_summary.summarize("t", pts, runs, False, 3)["notes"])


def test_table_and_csv():
    pts = _points()
    ph = {"draft": 3.1, "verify": 7.9, "draft_extend": 1.0, "cycle": 12.2}
    runs = [_run(pts[0], 0, 90.2), _run(pts[1], 0, 94.0, 2.9, ph), _run(pts[2], 0, 70.0, 3.3, ph),
            _run(pts[3], 0, None, status="failed", error="no")]
    doc = sweep_summary.summarize("root@gpu1", pts, runs, baseline=True, repeat=1)
    table = sweep_summary.render_table(doc)
    for words in ("baseline (no speculation)", "speculative-num-steps=1", "94.0", "1.042x", "7.90", "12.20",
                  "one launch per point"):
        assert words in table
    lines = sweep_summary.render_csv(doc).splitlines()
    assert lines[0].split(",") == sweep_summary.CSV_COLUMNS
    assert len(lines) == 5
    row = dict(zip(sweep_summary.CSV_COLUMNS, lines[2].split(",", len(sweep_summary.CSV_COLUMNS) - 1)))
    assert (row["label"], row["tokens_per_s_median"], row["best"], row["speedup"]) == (
        "speculative-num-steps=1", "94.0", "1", "1.042")


def test_run_figures_from_a_bench_document():
    bench = {"client": {"tokens_per_s": 100.0, "accept_len": None},
             "timings": {"records": 10, "groups": [
                 {"mode": "prefill", "phases": {"target": {"p50": 5.0}}, "cycle_ms": {"p50": 5.0}},
                 {"mode": "decode", "phases": {"draft": {"p50": 1.0}, "verify": {"p50": 2.0},
                                               "draft_extend": {"p50": 0.5}},
                  "cycle_ms": {"p50": 3.6}, "accept_len": 2.5}]}}
    assert sweep_summary.run_figures(bench) == {"tokens_per_s": 100.0, "accept_len": 2.5, "records": 10,
                                     "phases_p50": {"draft": 1.0, "verify": 2.0, "draft_extend": 0.5, "cycle": 3.6},
                                     "tpot_p50_ms": None, "tpot_p90_ms": None}
    streamed = {"client": {"tokens_per_s": 5.0, "accept_len": 3.0, "tpot_ms": {"p50": 7.5, "p90": 9.0}},
                "timings": None}
    assert sweep_summary.run_figures(streamed) == {
        "tokens_per_s": 5.0, "accept_len": 3.0, "phases_p50": {}, "records": None, "tpot_p50_ms": 7.5,
        "tpot_p90_ms": 9.0}


def test_a_point_prints_its_secrets_masked_and_keeps_them_to_launch():
    """A grid over a secret variable or flag (--env HF_TOKEN=a,b): the table's label and the JSON mask it, the
    point's key (the state file's) and its launch keep the value."""
    p = sw.Point(flags=(("api-key", "sk-1"), ("speculative-num-draft-tokens", "4")), env=(("HF_TOKEN", "hf_x"),))
    assert p.label == "api-key=*** speculative-num-draft-tokens=4 HF_TOKEN=***"
    assert p.to_json() == {"flags": {"api-key": "***", "speculative-num-draft-tokens": "4"}, "env": {"HF_TOKEN": "***"}}
    assert "sk-1" in p.key and "hf_x" in p.key
    assert cmdline.point_env({}, p) == {"HF_TOKEN": "hf_x"}


# ----------------------------------------------------------------------------------------------------------------
# a ladder of concurrencies


def _loads(*figs):
    return [{"concurrency": c, "tokens_per_s": t, "accept_len": a, "phases_p50": {}} for c, t, a in figs]


def test_a_ladder_of_concurrencies_is_summarised_per_concurrency():
    """Each launch measured 8 and 64 requests at a time: per point and concurrency the median and range over its
    launches, speedups over the baseline at the same concurrency, and the best per concurrency (1 step at 8, no
    speculation at 64: issue 38's turn); the first concurrency's figures stay the point's own."""
    pts = sw.make_points(sw.parse_grid(["speculative-num-steps=1,5"]), (), True)
    runs = [_run(pts[0], r, t8, loads=_loads((8, t8, None), (64, t64, None)))
            for r, (t8, t64) in enumerate(((900.0, 7400.0), (940.0, 7600.0)))]
    runs += [_run(pts[1], r, t8, 2.0, loads=_loads((8, t8, 2.0), (64, t64, 2.0)))
             for r, (t8, t64) in enumerate(((1200.0, 4300.0), (1220.0, 4460.0)))]
    runs += [_run(pts[2], r, t8, 3.5, loads=_loads((8, t8, 3.5), (64, t64, 3.5)))
             for r, (t8, t64) in enumerate(((1100.0, 5200.0), (1150.0, 5300.0)))]
    doc = sweep_summary.summarize("gpu1", pts, runs, baseline=True, repeat=2)
    assert doc["best_by_load"] == [{"concurrency": 8, "best": 1}, {"concurrency": 64, "best": 0}]
    base, one, five = doc["points"]
    assert one["tokens_per_s"] == {"median": 1210.0, "min": 1200.0, "max": 1220.0}  # the first concurrency's
    assert one["loads"] == [
        {"concurrency": 8, "runs": 2, "tokens_per_s": {"median": 1210.0, "min": 1200.0, "max": 1220.0},
         "accept_len": 2.0, "speedup": round(1210 / 920, 3), "tpot_ms": None},
        {"concurrency": 64, "runs": 2, "tokens_per_s": {"median": 4380.0, "min": 4300.0, "max": 4460.0},
         "accept_len": 2.0, "speedup": round(4380 / 7500, 3), "tpot_ms": None}]
    assert base["loads"][1]["speedup"] == 1.0 and five["loads"][1]["speedup"] == round(5250 / 7500, 3)
    text = sweep_summary.render_table(doc)
    assert "at 64 request(s) at a time (client tok/s; * the best at this concurrency):" in text
    at64 = text.split("at 64 request(s) at a time")[1].splitlines()
    assert any(line.startswith("*0") and "7500.0" in line for line in at64)
    json.dumps(doc)


def test_a_sweep_without_a_ladder_has_no_per_load_figures():
    pts = _points()
    doc = sweep_summary.summarize("gpu1", pts, [_run(p, 0, 100.0 + i) for i, p in enumerate(pts)], True, 1)
    assert "best_by_load" not in doc and all("loads" not in p for p in doc["points"])


@pytest.mark.parametrize("text, ladder", [("4", (4,)), ("64,1,8,32", (1, 8, 32, 64)), ("8,8", (8,))])
def test_parse_concurrency(text, ladder):
    from eaglepatch.tuning.bench import parse_concurrency

    assert parse_concurrency(text) == ladder


@pytest.mark.parametrize("text", ["", "0", "4,x", "-1", "1.5"])
def test_parse_concurrency_refuses(text):
    from eaglepatch.tuning.bench import parse_concurrency

    with pytest.raises(UsageError, match="--concurrency"):
        parse_concurrency(text)


def test_max_tpot_ms_and_the_latency_objective_decide_the_best():
    """Three points: 2 steps the most tok/s but p90 time per output token 30 ms; 1 step 25 ms; no speculation 12
    ms. --max-tpot-ms 20: 2 and 1 steps are never best (said), no speculation is; --objective latency: the least
    p50 TPOT; a point that did not stream (no TPOT) may still be best; the same rule per concurrency."""
    pts = sw.make_points(sw.parse_grid(["speculative-num-steps=1,2"]), (), True)

    def run(p, tps, p50, p90):
        return _run(p, 0, tps, tpot_p50_ms=p50, tpot_p90_ms=p90,
                    loads=[{"concurrency": 8, "tokens_per_s": tps, "accept_len": None, "tpot_p50_ms": p50,
                            "tpot_p90_ms": p90}, {"concurrency": 16, "tokens_per_s": tps, "accept_len": None,
                                                  "tpot_p50_ms": p50, "tpot_p90_ms": p90}])
    runs = [run(pts[0], 900.0, 10.0, 12.0), run(pts[1], 1000.0, 20.0, 25.0), run(pts[2], 1100.0, 22.0, 30.0)]
    assert sweep_summary.summarize("t", pts, runs, True, 1)["best"] == 2
    capped = sweep_summary.summarize("t", pts, runs, True, 1, objective=sweep_summary.Objective(max_tpot_ms=20))
    assert capped["best"] == 0 and capped["points"][2]["tpot_ms"] == {"p50": 22.0, "p90": 30.0}
    assert any("over --max-tpot-ms 20" in n and "speculative-num-steps=1" in n and "speculative-num-steps=2" in n
               for n in capped["notes"])
    assert [b["best"] for b in capped["best_by_load"]] == [0, 0]
    lat = sweep_summary.summarize("t", pts, runs, True, 1, objective=sweep_summary.Objective("latency"))
    assert lat["best"] == 0
    unknown = [_run(pts[0], 0, 900.0), _run(pts[1], 0, 1000.0), _run(pts[2], 0, 1100.0)]
    assert sweep_summary.summarize("t", pts, unknown, True, 1,
                                   objective=sweep_summary.Objective(max_tpot_ms=20))["best"] == 2
    with pytest.raises(UsageError, match="--objective"):
        sweep_summary.Objective("fastest")
    with pytest.raises(UsageError, match="--max-tpot-ms"):
        sweep_summary.Objective(max_tpot_ms=0)
