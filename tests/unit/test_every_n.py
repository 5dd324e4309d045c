"""``apply --every N`` (issue 41): the runtime times one entry call in N, and each record it writes then says how
many calls it stands for (``"every": N``); the report (eaglepatch/report/lines.py, batch.py) reads the gap before
such a record as N - 1 untimed cycles and N gaps between cycles, so ``between_ms``, ``wall_tokens_per_s``, the
cadence and the predictions built on them come out as they do from every cycle.

One synthetic cycle stream (seeded) is written as the runtime writes it at N = 1 and subsampled at N = 8 and 64,
and the figures of each report are held to the N = 1 figures within their spreads."""

from __future__ import annotations

import json
import math
import random
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from eaglepatch import cli
from eaglepatch.report import aggregate

from runtime_helpers import Batch, Obj, records

T0 = 1764500000.0
SPEC = {"steps": 3, "topk": 1, "draft_tokens": 4}
FLAGS = {"speculative-algorithm": "EAGLE3", "speculative-num-steps": "3", "speculative-eagle-topk": "1",
         "speculative-num-draft-tokens": "4"}
CYCLES = 64 * 500  # 500 records at N = 64
PASS = (0.85, 0.65, 0.45)  # the chance that draft position i is accepted, given the ones before it were
PREFILL = 0.04  # the share of cycles that are prefill cycles, placed at random
# the standard deviation of one gap between cycles, at most: 0.8 ms, plus up to 0.64 ms by batch, plus an exponential
# of mean 0.6 ms (an upper bound for the tolerance of a mean over records that each stand for N gaps)
BETWEEN_SD = math.hypot(0.6, 0.25)


def _stream(seed: int = 41) -> list[dict[str, Any]]:
    """Every cycle of one process, as the runtime writes it at N = 1: decode cycles in stretches of one batch
    size (4, 8, 12 or 16, the way a load's batch grows and shrinks), prefill cycles among them at random, the cycle
    time and its phases growing with the batch, the time between cycles varying around 1 ms plus a little per
    request, and one idle pause of two minutes (left out of between at every N)."""
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    t = T0
    bs, left = 4, 0
    for i in range(CYCLES):
        if left == 0:
            bs, left = rng.choice((4, 8, 12, 16)), rng.randint(100, 400)
        left -= 1
        r: dict[str, Any] = {"v": 1, "t": round(t, 6), "host": "gpu1", "pid": 7, "rank": 0, "run": "r1",
                             "worker": "EAGLEWorker"}
        if rng.random() < PREFILL:
            target = rng.uniform(15.0, 45.0)
            extend = rng.uniform(0.8, 1.5)
            cyc = target + extend + 0.1
            r.update({"mode": "prefill", "bs": rng.randint(1, 4), "cycle_ms": round(cyc, 4), "timer": "sync",
                      "phases": {"target": round(target, 4), "draft_extend": round(extend, 4)}, "accepted": None})
        else:
            draft = 3 * (0.3 + 0.005 * bs) * rng.uniform(0.9, 1.15)
            verify = (5.0 + 0.2 * bs) * rng.uniform(0.9, 1.2)
            extend = (0.3 + 0.01 * bs) * rng.uniform(0.9, 1.1)
            cyc = draft + verify + extend + rng.uniform(0.05, 0.3)
            accepts = []
            for _ in range(bs):
                n = 1
                for p in PASS:
                    if rng.random() >= p:
                        break
                    n += 1
                accepts.append(n)
            r.update({"mode": "decode", "bs": bs, "cycle_ms": round(cyc, 4), "timer": "sync",
                      "phases": {"draft": round(draft, 4), "verify": round(verify, 4),
                                 "draft_extend": round(extend, 4)},
                      "accepted": sum(accepts), "accepts": accepts})
        r["spec"] = SPEC
        out.append(r)
        between = 0.8 + 0.04 * bs + rng.expovariate(1 / 0.6)
        if i == CYCLES // 3:
            between = 120_000.0  # idle: over a second per cycle at N = 64 too
        t += (r["cycle_ms"] + between) / 1000.0
    return out


@lru_cache(maxsize=1)
def _cycles() -> tuple[str, ...]:
    return tuple(json.dumps(r) for r in _stream())


def _write(path: Path, every: int) -> str:
    """The stream as the runtime writes it at ``every``: the first call of each N timed, its record carrying
    ``"every": N`` (none at N = 1)."""
    header = {"v": 1, "kind": "run", "run": "r1", "t": T0, "host": "gpu1", "pid": 7, "rank": 0, "timer": "sync",
              "flags": FLAGS}
    lines = [json.dumps(header)]
    for line in _cycles()[::every]:
        lines.append(line if every == 1 else line[:-1] + f', "every": {every}}}')
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def streams(tmp_path_factory):
    d = tmp_path_factory.mktemp("every")
    return {n: _write(d / f"every{n}.jsonl", n) for n in (1, 8, 64)}


def _decode(result: Any) -> Any:
    (g,) = [g for g in result.groups if g.mode == "decode"]
    return g


def _cli_json(path: str, *extra: str) -> dict[str, Any]:
    res = CliRunner().invoke(cli.app, ["report", path, "--json", *extra])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def _decode_json(doc: dict[str, Any]) -> dict[str, Any]:
    (g,) = [g for g in doc["groups"] if g["mode"] == "decode"]
    return g


# ----------------------------------------------------------------------------------------------------------------
# The runtime


def test_records_carry_every_only_when_n_is_over_one(load, logs):
    """At N = 3 each record says it stands for 3 calls; at N = 1 the records are as before (no field)."""
    for n, want in ((3, [3, 3, 3]), (1, [None] * 7)):
        rt = load(every=n)

        class W(object):
            @rt.entry
            def forward_batch_generation(self, batch, i):
                rt.begin("draft")
                rt.end("draft")
                rt.accepted(Obj(a=[1]), ("a",), 0)
                return i

        for i in range(7):
            W().forward_batch_generation(Batch(), i)
        rt.flush()
        recs = records(logs)
        assert [r.get("every") for r in recs] == want
        assert all(("every" in r) == (n > 1) for r in recs)
        for f in logs.iterdir():
            f.unlink()


# ----------------------------------------------------------------------------------------------------------------
# The report at N = 1, 8 and 64


@pytest.mark.parametrize("n", [8, 64])
def test_between_wall_and_accept_length_as_at_n_1(streams, n):
    """between_ms mean, the cadence, wall tok/s and the accept length of the decode group at N agree with every
    cycle's within their spreads: between and the cadence within 3 standard errors (``_between_se``,
    ``_cadence_se``), wall tok/s within 3 standard errors of the tokens of the cycles read, the accept length
    within 4 of the request-cycles read. (Before records said how many cycles they stand for, N = 64 read a
    between of 740 ms against 1.8 ms, and wall tok/s of 35 against 2200.)"""
    full = _decode(aggregate([streams[1]]))
    part = _decode(aggregate([streams[n]]))
    assert abs(part.record_count - full.n / n) < 0.1 * full.n / n  # a sample of every N-th cycle
    assert abs(part.n - full.n) < 0.1 * full.n  # n counts the cycles the records stand for

    assert abs(part.between.mean - full.between.mean) <= 3 * _between_se(n, part.between.n), (part.between.mean,
                                                                                               full.between.mean)
    assert abs(part.cadence_ms - full.cadence_ms) <= 3 * _cadence_se(part.accepted_cycles), (part.cadence_ms,
                                                                                             full.cadence_ms)
    # a decode cycle's tokens vary by about half their mean (the batch from 4 to 16 requests)
    rel = 3 * 0.5 / math.sqrt(part.accepted_cycles)
    assert part.wall_tokens_per_s == pytest.approx(full.wall_tokens_per_s, rel=rel)
    # the rate inside the cycles does not depend on N either
    assert part.tokens_per_s == pytest.approx(full.tokens_per_s, rel=0.03)
    # a request's tokens (1 to 4 by PASS) vary by less than 1
    assert abs(part.accept_len - full.accept_len) <= 4 * 1.0 / math.sqrt(part.acceptance.samples)


def _between_se(n: int, records: int) -> float:
    """The standard error of the mean between read from ``records`` records at N = ``n``: each is the mean of ``n``
    gaps, less the mean of the ``n - 1`` untimed cycles of its stretch as the records' cycles estimate it. That
    estimate is a sample of every N-th cycle of every mode, prefill ones (rare and long) among them, so its error
    dominates: the standard deviation of one cycle over the records (all modes: about as many as ``records``)."""
    return math.hypot(BETWEEN_SD / math.sqrt(records * n), (n - 1) / n * _cycle_sd() / math.sqrt(records))


@lru_cache(maxsize=1)
def _cycle_sd() -> float:
    cycles = [r["cycle_ms"] for r in _stream()]
    m = sum(cycles) / len(cycles)
    return math.sqrt(sum((x - m) ** 2 for x in cycles) / (len(cycles) - 1))


def _cadence_se(records: int) -> float:
    """The standard error of the cadence read from ``records`` decode records: a cycle's own time varies with the
    batch (a few ms), and a prefill cycle (one in 25) adds 15 to 45 ms to the wall time of the decode cycle after
    it."""
    return math.sqrt(4.0 ** 2 + PREFILL * 30.0 ** 2) / math.sqrt(records)


@pytest.mark.parametrize("n", [8, 64])
def test_report_json_and_predict_through_the_cli(streams, n):
    """``eaglepatch report FILE --json --predict`` at N gives the N = 1 figures within the spreads it states: wall
    tok/s within the measured point's spread, between_ms mean as above, the accept length, and the best step
    count (the same one, or one whose predicted tok/s is within the spreads of the best's)."""
    full = _decode_json(_cli_json(streams[1], "--predict"))
    part = _decode_json(_cli_json(streams[n], "--predict"))
    best_full = full["predict"][full["predict_best"]]
    measured = [p for p in part["predict"] if p["basis"] == "measured" and p["steps"] == 3]
    assert measured, part["predict"]
    spread = max(measured[0]["spread"], 0.01)
    assert part["wall_tokens_per_s"] == pytest.approx(full["wall_tokens_per_s"], rel=2 * spread)
    assert part["between_ms"]["mean"] == pytest.approx(full["between_ms"]["mean"],
                                                       abs=3 * _between_se(n, part["between_ms"]["n"]))
    assert part["accept_len"] == pytest.approx(full["accept_len"], abs=0.05)

    best_part = part["predict"][part["predict_best"]]
    if best_part["steps"] != best_full["steps"]:
        (same,) = [p for p in part["predict"] if p["steps"] == best_full["steps"]]
        rel = math.hypot(same["spread"], best_part["spread"])
        assert same["tokens_per_s"] >= best_part["tokens_per_s"] * (1 - rel), (best_full, best_part, same)
    for p, q in zip(full["predict"], part["predict"]):
        assert p["steps"] == q["steps"]
        assert q["tokens_per_s"] == pytest.approx(p["tokens_per_s"], rel=2 * math.hypot(p["spread"], q["spread"],
                                                                                          0.01))


# ----------------------------------------------------------------------------------------------------------------
# A bad "every" is a bad line


@pytest.mark.parametrize("bad", [0, -1, 1e9, "x", 2 ** 70, None, True, 1.0, 1_000_001, [8]])
@pytest.mark.parametrize("parser", ["msgspec", "json"])
def test_a_bad_every_is_a_skipped_line(tmp_path, monkeypatch, bad, parser):
    """A record whose "every" is no whole number from 1 to 1,000,000 is counted in skipped_lines, whichever
    parser reads it, among good records (the batch path's pieces) or alone; never an error."""
    if parser == "json":
        monkeypatch.setenv("EAGLEPATCH_JSON_PARSER", "json")
    lines = list(_cycles()[:600:8])
    good = [line[:-1] + ', "every": 8}' for line in lines]
    bad_line = lines[0][:-1] + f', "every": {json.dumps(bad)}}}'
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(good[:40] + [bad_line] + good[40:]) + "\n")
    res = aggregate([str(path)])
    assert res.skipped_lines == 1
    assert res.records == len(good)
    alone = tmp_path / "alone.jsonl"
    alone.write_text(bad_line + "\n")
    res = aggregate([str(alone)])
    assert (res.skipped_lines, res.records) == (1, 0)


def test_every_1_is_every_record_as_before(tmp_path):
    """``"every": 1`` (a record that stands for itself) reads as a record without the field."""
    plain = tmp_path / "plain.jsonl"
    ones = tmp_path / "ones.jsonl"
    lines = _cycles()[:3000]
    plain.write_text("\n".join(lines) + "\n")
    ones.write_text("\n".join(line[:-1] + ', "every": 1}' for line in lines) + "\n")
    a, b = _decode(aggregate([str(plain)])), _decode(aggregate([str(ones)]))
    assert (a.n, a.between.mean, a.wall_tokens_per_s, a.cadence_ms) == (b.n, b.between.mean, b.wall_tokens_per_s,
                                                                       b.cadence_ms)


def test_parsers_agree_at_n_8(streams, monkeypatch):
    """The batch path (msgspec) and the standard library's line loop give the same figures for a log at N = 8."""
    a = _decode(aggregate([streams[8]]))
    monkeypatch.setenv("EAGLEPATCH_JSON_PARSER", "json")
    b = _decode(aggregate([streams[8]]))
    assert (a.n, a.between.mean, a.between.p90, a.wall_tokens_per_s, a.cadence_ms) == (
        b.n, b.between.mean, b.between.p90, b.wall_tokens_per_s, b.cadence_ms)


# ----------------------------------------------------------------------------------------------------------------
# n and --skip count cycles


def test_n_counts_cycles_not_records(streams):
    """A group's ``n`` counts cycles: at N = 8 each record stands for 8, so the groups of the same stream add up to
    the same cycles as at N = 1 (32,000: N divides them), the records kept apart (``records`` in the JSON, only
    where they are fewer than the cycles). Before, n counted records: 4,000 at N = 8 against 32,000."""
    full, part = aggregate([streams[1]]), aggregate([streams[8]])
    assert sum(g.n for g in full.groups) == CYCLES
    assert sum(g.n for g in part.groups) == CYCLES
    assert sum(g.record_count for g in part.groups) == part.records == CYCLES // 8
    assert all(g.n == 8 * g.record_count for g in part.groups)
    # the decode group's cycles as at N = 1, within the sampling of which cycles are decode ones
    assert abs(_decode(part).n - _decode(full).n) < 0.05 * _decode(full).n
    # the statistics are of the records still: the cycle time's mean and p50 as at N = 1
    assert _decode(part).cycle.mean == pytest.approx(_decode(full).cycle.mean, rel=0.03)
    doc = _cli_json(streams[8])
    assert sum(g["n"] for g in doc["groups"]) == CYCLES
    assert sum(g["records"] for g in doc["groups"]) == doc["records"] == CYCLES // 8
    assert all("records" not in g for g in _cli_json(streams[1])["groups"])


@pytest.mark.parametrize("parser", ["msgspec", "json"])
@pytest.mark.parametrize("skip", [80, 81])
def test_skip_counts_cycles(streams, monkeypatch, parser, skip):
    """``--skip N`` drops the first N cycles at every N: at N = 8 the records that begin within them (80 cycles: 10
    records; 81: 11 records, 88 cycles, never fewer than asked), where it dropped N records (640 cycles) before."""
    if parser == "json":
        monkeypatch.setenv("EAGLEPATCH_JSON_PARSER", "json")
    full = aggregate([streams[1]], skip=skip)
    part = aggregate([streams[8]], skip=skip)
    assert sum(g.n for g in full.groups) == CYCLES - skip
    dropped = -(-skip // 8)  # records
    assert part.records - sum(g.record_count for g in part.groups) == dropped
    assert part.skipped_cycles == 8 * dropped
    assert sum(g.n for g in part.groups) == CYCLES - 8 * dropped
    res = CliRunner().invoke(cli.app, ["report", streams[8], "--skip", str(skip)])
    assert res.exit_code == 0, res.output
    assert f"--skip {skip} left out the first {8 * dropped} cycles" in res.stdout
