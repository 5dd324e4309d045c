"""The load against the server's own traffic (issues 39, 40): the runtime's marking of batches that hold requests
not eaglepatch's (``"others"``, ``"others_at"``), the load's request ids, the split of the records into the load's
and the traffic's acceptance (``tuning.traffic``) and the comparison beyond their spreads, the sweep's per-point
figures, and doctor's ``load-unlike-traffic``."""
from __future__ import annotations

import json

import pytest

from runtime_helpers import Obj, decode_worker, records

from eaglepatch.doctor.facts import ServerFacts
from eaglepatch.doctor.rules import diagnose
from eaglepatch.tuning import traffic
from eaglepatch.tuning.load_http import LOAD_RID, Request, _Client


class Req(object):
    def __init__(self, rid):
        self.rid = rid


def batch(*rids):
    return Obj(reqs=[Req(r) for r in rids])


# ---------------------------------------------------------------------------------------------------------------
# the runtime


def test_a_batch_of_eaglepatchs_requests_alone_says_nothing(rt, logs):
    w = decode_worker(rt, out=Obj(accept_lens=[2, 3]))
    w.forward_batch_generation(batch("eaglepatch-0a1b2c3d-0", "eaglepatch-0123456789abcdef-s3-w0-1"))
    rt.flush()
    [r] = records(logs)
    assert "others" not in r and "others_at" not in r and r["accepts"] == [2, 3]


def test_others_requests_are_counted_and_placed_in_a_mixed_batch(rt, logs):
    w = decode_worker(rt, out=Obj(accept_lens=[1, 2, 3, 4]))
    w.forward_batch_generation(batch("user-1", "eaglepatch-ab-0", "9f2e", "eaglepatch-ab-1"))
    w.forward_batch_generation(batch("user-1", "user-2"))
    rt.flush()
    mixed, alone = records(logs)
    assert mixed["others"] == 2 and mixed["others_at"] == [0, 2]
    assert alone["others"] == 2 and "others_at" not in alone      # all of the batch: no places needed
    assert rt._stats()["errors"] == 0


def test_requests_without_a_string_id_count_on_neither_side(rt, logs):
    w = decode_worker(rt, out=Obj(accept_lens=[1, 1, 1]))
    w.forward_batch_generation(Obj(reqs=[object(), Req("user"), Req(None)]))
    w.forward_batch_generation(Obj(reqs=[object(), object()]))     # no ids at all (the stand-in's V1 batches)
    rt.flush()
    one, two = records(logs)
    assert one["others"] == 1 and one["others_at"] == [1]
    assert "others" not in two and rt._stats()["errors"] == 0


def test_the_batch_is_looked_into_again_only_when_its_membership_changed(rt, logs):
    reqs = [Req("user-0"), Req("eaglepatch-x-0")]
    b = Obj(reqs=reqs)
    w = decode_worker(rt, out=Obj(accept_lens=[1, 1]))
    w.forward_batch_generation(b)
    seen = []

    class Counting(Req):
        def __getattribute__(self, name):
            if name == "rid":
                seen.append(1)
            return object.__getattribute__(self, name)

    # the same list, the same requests: no rid is read again
    for r in reqs:
        r.__class__ = Counting
    w.forward_batch_generation(b)
    assert seen == []
    reqs.append(Counting("user-2"))                     # a merge appends: looked into again
    w.forward_batch_generation(b)
    assert len(seen) == 3
    rt.flush()
    assert [r.get("others") for r in records(logs)] == [1, 1, 2]


def test_over_256_requests_a_mixed_batch_has_the_count_alone(rt, logs):
    rids = ["user-%d" % i if i % 2 else "eaglepatch-x-%d" % i for i in range(300)]
    w = decode_worker(rt, out=Obj(accept_lens=[1] * 300))
    w.forward_batch_generation(batch(*rids))
    rt.flush()
    [r] = records(logs)
    assert r["others"] == 150 and "others_at" not in r and "accept_hist" in r


def test_the_load_marks_every_request_it_sends():
    c = _Client("http://127.0.0.1:9", None, 1.0)
    body = Request(4, text="hi").body(False, f"{c.rid_tag}0", "m")
    assert body["rid"].startswith(LOAD_RID) and LOAD_RID == "eaglepatch-"
    # ids made by the client: unique, and never a live sweep's (eaglepatch-<token>-s<steps>-)
    ids = {f"{c.rid_tag}{next(c._numbers)}" for _ in range(100)}
    assert len(ids) == 100 and all(i.startswith(LOAD_RID) and "-s" not in i[len(LOAD_RID):] for i in ids)


def test_a_client_request_without_rid_gets_one_of_eaglepatchs(monkeypatch):
    c = _Client("http://127.0.0.1:9", None, 1.0)
    bodies = []

    def no_socket():
        raise OSError("no server")

    monkeypatch.setattr(c, "_sock", no_socket)
    monkeypatch.setattr(Request, "body", lambda self, stream, rid, model: bodies.append(rid) or {"rid": rid})
    c.send(Request(4, text="hi"), True, lambda: 0.0)
    c.send(Request(4, text="hi"), True, lambda: 0.0, "eaglepatch-0123456789abcdef-s3-w0-5")
    assert bodies[0].startswith(LOAD_RID) and bodies[1] == "eaglepatch-0123456789abcdef-s3-w0-5"


# ---------------------------------------------------------------------------------------------------------------
# the split and the comparison


def rec(accepts, others=None, at=None, t=100.0, rank=0, pid=1):
    r = {"v": 1, "t": t, "host": "h", "pid": pid, "rank": rank, "mode": "decode", "bs": len(accepts),
         "cycle_ms": 1.0, "phases": {}, "accepted": sum(accepts), "accepts": list(accepts), "run": "r"}
    if others:
        r["others"] = others
    if at is not None:
        r["others_at"] = at
    return r


def test_the_split_puts_each_request_cycle_on_its_side():
    doc = traffic.split([rec([3, 3]), rec([1, 4, 1], others=2, at=[0, 2]), rec([2, 2], others=2)])
    assert doc["cycles"] == 2 and doc["decode_cycles"] == 3
    assert doc["load"]["samples"] == 3 and doc["load"]["accept_len"] == pytest.approx(10 / 3, abs=1e-4)
    assert doc["traffic"]["samples"] == 4 and doc["traffic"]["accept_len"] == 1.5
    assert doc["traffic"]["acceptance"] == {"samples": 4, "at_least": [1.0, 0.5]}


def test_tp_ranks_of_one_batch_count_once():
    one = [rec([3, 1], others=1, at=[1], rank=k) for k in (0, 1)]
    doc = traffic.split(one)
    assert doc["cycles"] == 1 and doc["traffic"]["samples"] == 1 and doc["load"]["samples"] == 1


def test_a_mixed_batch_without_places_counts_as_a_cycle_with_traffic_on_neither_side():
    r = rec([1, 2, 3], others=1)
    del r["accepts"]
    r["accept_hist"] = {"1": 1, "2": 1, "3": 1}
    doc = traffic.split([r])
    assert doc["cycles"] == 1 and doc["load"]["samples"] == 0 and doc["traffic"]["samples"] == 0


def sides(load_len, traffic_len, n):
    """n request-cycles a side, tokens alternating around each mean (1 apart)."""
    def side(mean, others):
        lo, hi = int(mean), int(mean) + 1
        share = mean - lo
        return [rec([hi if (i * share) % 1 + share >= 1 else lo], others=others) for i in range(n)]
    return traffic.split(side(load_len, None) + side(traffic_len, 1))


def test_acceptances_that_differ_beyond_their_spreads_are_said():
    doc = sides(3.1, 2.4, 400)
    said = traffic.compare(doc)
    assert said is not None and "3.1" in said and "2.4" in said and "--prompts" in said


@pytest.mark.parametrize("load_len, traffic_len, n", [
    (3.1, 3.05, 400),         # within the spreads and under 5%
    (3.1, 2.4, 20),           # too few request-cycles to tell
])
def test_acceptances_alike_or_too_few_are_not_said(load_len, traffic_len, n):
    assert traffic.compare(sides(load_len, traffic_len, n)) is None


def test_a_gap_inside_wide_spreads_is_not_said():
    # both sides spread over 1..5 tokens: two standard errors of 60 request-cycles cover a gap of 0.3
    load = [rec([1 + (i % 5)]) for i in range(60)]
    mine = [rec([1 + ((i + 2) % 5) if i % 7 else 1], others=1) for i in range(60)]
    doc = traffic.split(load + mine)
    assert abs(doc["load"]["accept_len"] - doc["traffic"]["accept_len"]) > 0.15
    assert traffic.compare(doc) is None


def test_records_without_others_in_the_window_are_not_parsed(tmp_path):
    f = tmp_path / "h-1-rank0.jsonl"
    lines = [rec([3, 3], t=10.0), rec([1, 1], others=2, t=50.0), rec([3, 2], t=60.0)]
    f.write_text("".join(json.dumps(x) + "\n" for x in lines) + "not json\n")
    assert traffic.of_files([str(f)], (0.0, 20.0)) is None                # others' cycles outside the window
    doc = traffic.of_files([str(f)], (0.0, 100.0))
    assert doc["cycles"] == 1 and doc["load"]["samples"] == 4
    assert traffic.others_since([str(f)], 40.0) == 1 and traffic.others_since([str(f)], 55.0) == 0


@pytest.mark.timeout(20)
def test_a_hostile_log_folder_is_read_as_the_report_reads_it(tmp_path):
    """A line over the report's cap is skipped without being held whole, and a FIFO named like a log is skipped
    unopened (opening it would wait for a writer): the records beside them count."""
    import os
    import tracemalloc

    big = dict(rec([4, 4], others=2, t=30.0), pad="x" * (3 << 20))  # would count, were it read
    lines = [rec([3, 3], t=10.0), rec([1, 1], others=2, t=20.0), big, rec([2, 1], others=1, at=[1], t=40.0)]
    (tmp_path / "a-1-rank0.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    os.mkfifo(tmp_path / "b-2-rank0.jsonl")
    (tmp_path / "c-3-rank0.jsonl").write_text(json.dumps(dict(rec([2, 2], t=50.0, pid=3), run="r3")) + "\n")
    files = sorted(str(p) for p in tmp_path.glob("*.jsonl"))
    tracemalloc.start()
    try:
        doc = traffic.of_files(files, None)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert doc["cycles"] == 2 and doc["decode_cycles"] == 4
    assert doc["load"]["samples"] == 3 + 2 and doc["traffic"]["samples"] == 2 + 1
    assert peak < 2 << 20, peak  # the 3 MB line never held whole
    assert traffic.others_since(files, 15.0) == 2


def test_the_refusal_is_one_line_naming_the_option():
    line = traffic.refusal("host", 12, "of its last 60 s")
    assert "\n" not in line and "--allow-shared-traffic" in line and "12" in line


# ---------------------------------------------------------------------------------------------------------------
# the sweep's points and doctor


def test_a_sweep_point_carries_its_runs_traffic_and_categories():
    from eaglepatch.tuning import sweep_summary
    from eaglepatch.tuning.sweep import Point

    bench = {"client": {"tokens_per_s": 100.0, "accept_len": 3.0}, "timings": None,
             "categories": {"code": {"accept_len": 3.2, "tokens_per_s": 50.0},
                            "chat": {"accept_len": 2.5, "tokens_per_s": 50.0}},
             "traffic": {"cycles": 40, "accept_len": 2.4, "load": {"accept_len": 3.1}, "differs": True}}
    fig = sweep_summary.run_figures(bench)
    assert fig["traffic"] == {"cycles": 40, "accept_len": 2.4, "load_accept_len": 3.1, "differs": True}
    p = Point(flags=(("speculative-num-steps", "3"),))
    doc = sweep_summary.summarize("t", [p], [dict(fig, point=p.key, status="ok", rep=0)], False, 1)
    assert doc["points"][0]["traffic"]["cycles"] == 40
    assert doc["points"][0]["categories"]["code"]["accept_len"] == 3.2
    assert any("3.10" in n and "2.40" in n and "--prompts" in n for n in doc["notes"])
    alike = dict(bench, traffic=dict(bench["traffic"], differs=False))
    doc = sweep_summary.summarize("t", [p], [dict(sweep_summary.run_figures(alike), point=p.key, status="ok",
                                                  rep=0)], False, 1)
    assert not any("--prompts" in n for n in doc["notes"])


def test_doctor_says_the_load_is_unlike_the_traffic_only_when_it_is():
    unlike = ServerFacts(target="t", traffic=sides(3.1, 2.4, 400))
    [f] = [x for x in diagnose(unlike) if x.id == "load-unlike-traffic"]
    assert f.severity == "low" and not f.predicted and "--prompts" in f.next
    assert not [x for x in diagnose(ServerFacts(target="t", traffic=sides(3.1, 3.08, 400)))
                if x.id == "load-unlike-traffic"]
    assert not [x for x in diagnose(ServerFacts(target="t")) if x.id == "load-unlike-traffic"]


def test_a_new_batch_of_one_is_never_read_as_the_one_before(rt, logs):
    """Batches of one request each, made and dropped in turn, eaglepatch's and another client's alternately: a
    freed list and request may come back at the same addresses, and must not be taken for the batch before."""
    w = decode_worker(rt, out=Obj(accept_lens=[2]))
    for i in range(40):
        w.forward_batch_generation(batch("user-%d" % i if i % 2 else "eaglepatch-x-%d" % i))
    rt.flush()
    assert [r.get("others") for r in records(logs)] == [None, 1] * 20
