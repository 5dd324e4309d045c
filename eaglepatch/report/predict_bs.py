"""The best step count for every batch size the server can run, from one run's records (pure).

``predict_by_bs(groups, ...)`` takes the decode groups of one run split by batch size (``report --by bs``'s groups)
and composes three models:

* **Acceptance** (``eaglepatch.report.predict``'s profile): the run's request-cycles pooled over its batch sizes at
  the largest step count it ran (acceptance depends on the text, not on how many requests share a cycle), read
  at fewer steps and continued geometrically beyond.
* **Cost** (``eaglepatch.report.costs``): each phase priced by the tokens its forward processes, fitted over every
  batch size and step count the run measured; the wall time of a cycle at ``(bs, j)`` is their sum.
* **No speculation**: a throughput measured without speculation at the same load (a sweep's ``--baseline``
  point, put on the records' scale by its ratio to the sweep's own point at the records' step count), at the batch
  sizes it was measured at (basis ``measured``, interpolated between them); elsewhere an estimate, the cycle of the
  target's forward at one token per request (the verify curve at ``bs`` tokens) plus the rest, whose spread is
  what such estimates have missed by at that batch size (``estimate_spread``), and a step count named best over it
  carries the note that only a baseline launch decides.

A point is ``measured`` where the run has a decode group at that batch size and step count (its own figures),
``fitted`` where every phase's token count lies in the measured range, ``extrapolated`` otherwise (its spread
grows with how far out it reaches). tok/s are the records' wall rate (the cadence on the host clock): ``bs`` times
the accept length over the cycle.

``crossover_bs`` is the smallest batch size from which no step count beats no speculation beyond the spreads
(``tok/s * (1 - spread)`` of a step count above ``tok/s * (1 + spread)`` of none), at it and every larger size;
None when some step count beats it at the largest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from eaglepatch.report import costs
from eaglepatch.report.labels import CLIENT, UNSCALED, WALL
from eaglepatch.report.model import Acceptance, GroupStats, ReportResult
from eaglepatch.report.predict import (LAUNCH_SPREAD, Point, _profile, as_int, _window_spread, baseline_from_sweep,
                                       default_steps, shape_of)

# What the no-speculation estimate has missed by (relative, its tok/s under the measured one), by batch size:
# 21-27% at 1-4 requests (H200, seven comparisons), 46% at 32 and 67% at 64 requests (H100, a Llama-3-8B-shaped
# target); between them interpolated on log2(bs), beyond 64 the last. Those were the estimate of the fixed-cost
# model (verify at the run's own draft tokens); the curve's estimate has not been measured against a GPU yet, so
# the same misses stand as its spread.
ESTIMATE_MISSES = ((1, 0.3), (8, 0.3), (32, 0.5), (64, 0.7))
# How far to price when the server's flags do not say its largest batch: the batch sizes production servers run
# (32 to 256 requests at a time); an adaptive config must not stretch its top measured tier over them unpriced
UNKNOWN_MAX_BS = 256
# A decode group of fewer cycles is not a batch size's own measurement (it still counts in the fit, by its weight)
MIN_GROUP_CYCLES = 20


def estimate_spread(bs: int) -> float:
    """The no-speculation estimate's spread at ``bs`` requests (``ESTIMATE_MISSES``)."""
    pts = ESTIMATE_MISSES
    if bs <= pts[0][0]:
        return pts[0][1]
    for (b0, s0), (b1, s1) in zip(pts, pts[1:]):
        if bs <= b1:
            f = (math.log2(bs) - math.log2(b0)) / (math.log2(b1) - math.log2(b0))
            return s0 + f * (s1 - s0)
    return pts[-1][1]


@dataclass(frozen=True)
class BaselinePoint:
    """No speculation measured at ``bs`` requests at a time: tok/s on the records' scale, its relative spread.
    With ``ratio`` (no speculation over the same sweep's point at the records' step count, both by the client),
    ``tokens_per_s`` is not used: the records' own tok/s at ``bs`` times ``ratio`` stands for it, so that a
    client's figure and the records' need not be on one scale."""

    bs: int
    tokens_per_s: float
    spread: float
    ratio: float | None = None


@dataclass(frozen=True)
class BsRow:
    """The points at one batch size, the best's index, and a note (a best named over an estimate)."""

    bs: int
    points: tuple[Point, ...]
    best: int
    note: str | None = None

    def to_json(self) -> dict[str, Any]:
        doc = {"bs": self.bs, "best": self.best, "points": [p.to_json() for p in self.points]}
        if self.note:
            doc["note"] = self.note
        return doc


@dataclass(frozen=True)
class ByBs:
    """One run's ``cost_model``, ``predict_by_bs`` and ``crossover_bs`` (or ``why`` none), with notes."""

    model: costs.CostModel | None = None
    rows: tuple[BsRow, ...] = ()
    crossover_bs: int | None = None
    max_bs: int | None = None
    notes: tuple[str, ...] = ()
    why: str | None = None

    def to_json(self) -> dict[str, Any]:
        if self.why is not None:
            return {"cost_model": None, "predict_by_bs": None, "crossover_bs": None, "predict_by_bs_note": self.why}
        return {"cost_model": self.model.to_json() if self.model else None,
                "predict_by_bs": [r.to_json() for r in self.rows], "crossover_bs": self.crossover_bs,
                "max_bs": self.max_bs, "predict_by_bs_notes": list(self.notes)}


def ladder(measured: Sequence[int], max_bs: int) -> list[int]:
    """The batch sizes to price: every measured one (a decode group of at least ``MIN_GROUP_CYCLES`` cycles), the
    powers of two up to ``max_bs``, and ``max_bs``."""
    out = set(b for b in measured if b >= 1)
    p = 1
    while p <= max_bs:
        out.add(p)
        p *= 2
    out.add(max_bs)
    return sorted(out)


def pooled(groups: Sequence[tuple[int, int, GroupStats]], k: int) -> tuple[Acceptance | None, float | None]:
    """The acceptance of the groups at ``k`` steps pooled over their batch sizes, and their accept length."""
    hist: dict[int, int] = {}
    tokens = weight = 0.0
    for bs, steps, g in groups:
        if steps != k:
            continue
        if g.acceptance is not None:
            for t, n in g.acceptance.hist:
                hist[t] = hist.get(t, 0) + n
        if g.accept_len is not None:
            tokens += g.accept_len * g.record_count * bs
            weight += g.record_count * bs
    acc = Acceptance(sum(hist.values()), tuple(sorted(hist.items()))) if hist else None
    return acc, (tokens / weight if weight else None)


def _baseline_at(bs: int, base: Sequence[BaselinePoint]) -> BaselinePoint | None:
    """No speculation at ``bs`` from the measured points: exact, or interpolated (time per request linear in bs)
    between the two around it; None outside their range."""
    pts = sorted(base, key=lambda b: b.bs)
    for b in pts:
        if b.bs == bs:
            return b
    for lo, hi in zip(pts, pts[1:]):
        if lo.bs < bs < hi.bs and lo.tokens_per_s > 0 and hi.tokens_per_s > 0:
            f = (bs - lo.bs) / (hi.bs - lo.bs)
            t = lo.bs / lo.tokens_per_s + f * (hi.bs / hi.tokens_per_s - lo.bs / lo.tokens_per_s)  # s per cycle
            return BaselinePoint(bs, bs / t, lo.spread + f * (hi.spread - lo.spread))
    return None


def _beats(p: Point, zero: Point) -> bool:
    return p.tokens_per_s * (1 - p.spread) > zero.tokens_per_s * (1 + zero.spread)


def crossover(rows: Sequence[BsRow]) -> int | None:
    """The smallest batch size from which, at it and every larger one, no step count beats no speculation beyond
    the spreads; None when one does at the largest (or there is no row)."""
    out = None
    for row in reversed(rows):
        zero = next((p for p in row.points if p.steps == 0), None)
        if zero is None or any(_beats(p, zero) for p in row.points if p.steps > 0):
            break
        out = row.bs
    return out


def predict_by_bs(groups: Sequence[tuple[int, int, GroupStats]], *, max_bs: int | None,
                  steps: Sequence[int] | None = None, baseline: Sequence[BaselinePoint] = ()) -> ByBs:
    """See the module docstring. ``groups``: ``(bs, steps, group)`` for every decode group of one run (top-k 1);
    ``max_bs``: the largest batch the server runs (``--max-running-requests`` / ``--cuda-graph-max-bs``), None:
    ``UNKNOWN_MAX_BS`` or the largest measured rounded up to a power of two, whichever is larger; ``baseline``: no
    speculation measured at the same load."""
    obs = [o for bs, k, g in groups if (o := costs.observe(g, bs, k)) is not None]
    if not obs:
        return ByBs(why="no decode cycles with accepted tokens: no cost to fit")
    model = costs.fit(obs)
    assert model is not None
    k = max(o.steps for o in obs)
    acc, mean = pooled(groups, k)
    prof = _profile(acc, mean, k)
    if prof is None:
        return ByBs(why="no accept length in these records: nothing to predict from")
    measured = sorted({o.bs for o in obs})
    notes = []
    if max_bs is None:
        max_bs = max(UNKNOWN_MAX_BS, 1 << max(0, math.ceil(math.log2(max(measured)))))
        notes.append(f"the server's largest batch was not read from its flags (--max-running-requests, "
                     f"--cuda-graph-max-bs): priced up to {max_bs}")
    own = {(bs, kk): g for bs, kk, g in groups if g.record_count >= MIN_GROUP_CYCLES and g.cadence_ms and g.accept_len}

    def at(bs: int, j: int) -> Point:
        g = own.get((bs, j))
        if g is not None:  # the run's own cycles: as uncertain as another launch would read them, at least
            cad = g.cadence_ms or 0.0
            tps = bs * (g.accept_len or 0.0) / cad * 1000.0
            return Point(j, j + 1, g.accept_len or 0.0, cad, 0.0, tps, max(_window_spread(g), LAUNCH_SPREAD),
                         "measured")
        a_j = prof.accept_len(j)
        cad = model.cycle_ms(bs, j)
        tps = bs * a_j / cad * 1000.0 if cad > 0 else 0.0
        spread = math.hypot(prof.stderr(j) / a_j if a_j > 0 else 0.0, model.error(bs, j))
        return Point(j, j + 1, a_j, cad, 0.0, tps, spread, model.basis(bs, j))

    unscaled = [b.bs for b in baseline if b.ratio is None]  # for the note: figures left on the client's scale
    baseline = [b if b.ratio is None else BaselinePoint(b.bs, b.ratio * at(b.bs, k).tokens_per_s, b.spread)
                for b in baseline]
    rows = []
    for bs in ladder(sorted({b for b, _ in own}), max_bs):
        pts: list[Point] = []
        for j in (list(steps) if steps is not None else default_steps(k)):
            pts.append(_zero(model, bs, baseline) if j == 0 else at(bs, j))
        best = max(range(len(pts)), key=lambda i: pts[i].tokens_per_s)
        zero = next((p for p in pts if p.steps == 0), None)
        note = None
        if zero is not None and zero.basis == "estimate" and pts[best].steps > 0:
            note = (f"no speculation is estimated at {bs} request(s), not measured: only a launch without "
                    f"speculation at this load decides (eaglepatch sweep TARGET --baseline at {bs} request(s) at "
                    "a time)")
        rows.append(BsRow(bs, tuple(pts), best, note))
    notes.append(f"cost: each phase fitted on the tokens its forward processes over {len(obs)} decode group(s) "
                 f"(batch sizes {', '.join(map(str, measured))})")
    if not baseline:
        notes.append("no speculation: estimated at every batch size (the verify curve at one token per request "
                     "plus the rest); a sweep with --baseline at the same load measures it")
    else:
        notes.append(f"no speculation: measured at {', '.join(str(b.bs) for b in baseline)} request(s) by a launch "
                     f"without speculation (a sweep's --baseline), its {CLIENT} put on the records' scale ({WALL}) "
                     f"by its ratio to the sweep's own point at {k} steps at the same load"
                     + (f"; at {', '.join(map(str, unscaled))} request(s) the sweep ran no such point: there it is "
                        f"its {CLIENT} as measured, {UNSCALED}" if unscaled else ""))
    return ByBs(model, tuple(rows), crossover(rows), max_bs, tuple(notes))


def _zero(model: costs.CostModel, bs: int, baseline: Sequence[BaselinePoint]) -> Point:
    """No speculation at ``bs``: measured (or interpolated between measured batch sizes), else the estimate."""
    b = _baseline_at(bs, baseline)
    if b is not None and b.tokens_per_s > 0:
        return Point(0, 1, 1.0, bs / b.tokens_per_s * 1000.0, 0.0, b.tokens_per_s, b.spread, "measured")
    cad = model.curves["verify"].price(bs) + model.curves["rest"].price(bs)
    tps = bs / cad * 1000.0 if cad > 0 else 0.0
    return Point(0, 1, 1.0, cad, 0.0, tps, estimate_spread(bs), "estimate")


def server_max_bs(flags: dict[str, Any]) -> int | None:
    """The largest batch the server runs: ``--max-running-requests``, else ``--cuda-graph-max-bs``; None when
    neither is given."""
    for name in ("max-running-requests", "cuda-graph-max-bs"):
        v = as_int(flags.get(name))
        if v is not None and v >= 1:
            return v
    return None


def for_runs(result: ReportResult, *, steps: Sequence[int] | None = None, sweep: dict[str, Any] | None = None,
             flags: dict[str, Any] | None = None, min_cycles: int = 0) -> dict[str | None, ByBs]:
    """``predict_by_bs`` for each run of ``result`` (aggregated ``by="bs"``), keyed by run id: its top-k 1 decode
    groups, its launch flags for the largest batch (the run header's, with ``flags`` beside them: the server's
    own, e.g. the ``max-running-requests`` sglang derived, which a header does not hold; ``flags`` alone give the
    step count of runs whose header has none), and a sweep's baseline (``sweep``) at its concurrencies. A run of
    fewer than ``min_cycles`` decode cycles per rank (all its batch sizes together) gets why none, unpriced: no fit
    is made from so little, and a folder of thousands of such runs costs no more than reading them."""
    runs = {r.id: r.flags_dict() for r in result.runs}
    by_run: dict[str | None, list[tuple[int, int, GroupStats]]] = {}
    for g in result.groups:
        bs = as_int(dict(g.key).get("bs"))
        sh = shape_of(g, runs.get(g.run) or flags or {})
        if g.mode != "decode" or bs is None or not sh.steps or sh.topk not in (None, 1):
            continue
        by_run.setdefault(g.run, []).append((bs, sh.steps, g))
    out: dict[str | None, ByBs] = {}
    for run, groups in by_run.items():
        cycles = sum(g.record_count // max(1, g.ranks) for _, _, g in groups)
        if cycles < min_cycles:
            out[run] = too_few(cycles, min_cycles)
            continue
        fl = {**(flags or {}), **runs.get(run, {})}  # the header's flags, beside what the caller knows of the server
        k = max(s for _, s, _ in groups)
        out[run] = predict_by_bs(groups, max_bs=server_max_bs(fl), steps=steps, baseline=baselines_of(sweep, k))
    return out


def too_few(cycles: int, min_cycles: int) -> ByBs:
    """Why a run of ``cycles`` decode cycles per rank (fewer than ``min_cycles``) is not priced by batch size."""
    return ByBs(why=f"only {cycles} decode cycle(s) recorded per rank, too few to price every batch size from (at "
                    f"least {min_cycles}): load the server first (eaglepatch bench)")


def decode_bounds(result: ReportResult, flags: dict[str, Any] | None = None) -> dict[str | None, tuple[int, bool]]:
    """Per run of ``result`` (aggregated ``by=None``, runs not merged), in the order of its groups: the records of
    its decode groups that ``for_runs`` prices (top-k 1, a step count), and whether they are one rank's alone.
    Their count bounds the run's decode cycles per rank by batch size from above, and is that number where they
    are one rank's and every such record has a ``bs``."""
    runs = {r.id: r.flags_dict() for r in result.runs}
    out: dict[str | None, tuple[int, bool]] = {}
    for g in result.groups:
        if g.mode != "decode":
            continue
        sh = shape_of(g, runs.get(g.run) or flags or {})
        if not sh.steps or sh.topk not in (None, 1):
            continue
        n, one = out.get(g.run, (0, True))
        out[g.run] = (n + g.record_count, one and g.ranks <= 1)
    return out


def baselines_of(sweep: dict[str, Any] | None, steps: int) -> list[BaselinePoint]:
    """No speculation as a sweep with ``--baseline`` measured it: at each concurrency of its ladder (its points'
    ``loads``), else at its one concurrency; each with its ratio to the sweep's own point at ``steps`` draft steps
    at the same concurrency where the sweep ran one (the prediction then scales the records' figures by it)."""
    bl = baseline_from_sweep(sweep, steps)
    if sweep is None or bl is None:
        return []
    pts = sweep.get("points") or []
    base = pts[sweep["baseline"]]
    at_k = next((p for p in pts if p.get("status") == "ok" and str((p.get("flags") or {}).get(
        "speculative-num-steps")) == str(steps)), None)
    if (sweep.get("load") or {}).get("request_rate") is not None:
        return []  # an open loop: its --concurrency is a cap, not the batch size its figures were measured at
    out = []
    for ld in base.get("loads") or ():
        if ld.get("request_rate") is not None:
            continue
        t = ld.get("tokens_per_s") or {}
        med = t.get("median")
        if not med:
            continue
        spread = max(((t.get("max") or med) - (t.get("min") or med)) / 2 / med, LAUNCH_SPREAD)
        mine = next((x for x in (at_k or {}).get("loads") or () if x["concurrency"] == ld["concurrency"]), None)
        ratio = med / mine["tokens_per_s"]["median"] if mine and (mine.get("tokens_per_s") or {}).get("median") \
            else None
        out.append(BaselinePoint(int(ld["concurrency"]), med, spread, ratio))
    if out:
        return out
    conc = as_int((sweep.get("load") or {}).get("concurrency"))
    return [BaselinePoint(conc, bl.tokens_per_s, bl.spread, bl.ratio)] if conc else []
