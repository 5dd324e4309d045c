"""Predict accept length, cycle time and tok/s for other draft step counts from one run's records (pure).

``predict(result)`` turns the decode groups of a ``ReportResult`` into a ``Prediction`` each: for every step count
(0 = no speculation, then 1..max(8, k + 2) by default), the accept length, the wall time a cycle takes and the
tokens per second a client would see, each with its basis and a relative uncertainty. docs/tuning.md explains
the model for users; the parts, stated once:

* **Acceptance.** With top-k 1 the draft guesses a chain, and the first ``j`` guesses are the same whatever the
  step count (the draft model sees the same tokens). So a run at ``k`` steps tells what ``j < k`` steps would have
  accepted: each request-cycle's tokens capped at ``j + 1`` (basis ``profile``). Beyond ``k`` the profile ends;
  the share that got through all ``k`` positions continues at the last position's rate, geometrically (basis
  ``extrapolated``; the rate estimated as ``(passed + 1/2) / (reached + 1)``, so that a position every
  request-cycle passed does not promise that all later ones will). Records without per-request counts (``accepts``) give only the mean: a geometric profile
  fitted to it stands in, and the basis says so.
* **Cost.** Each phase's time per cycle (its total over the group's cycles) as a function of the step count: the
  draft proportional to the steps, or, where the GPU sets the pace (see Cadence), its GPU time to its forwards,
  ``steps - 1`` (sglang's ``draft_forward`` takes the first guess from the draft extend before it: on the H200's
  GPU-bound testbed the draft's GPU time read 0.02, 0.44 and 0.84 ms at 1, 3 and 5 steps; a host-bound GPU clock
  reads the host's launches, which do not follow the forwards), verify and draft extend as measured, everything
  else in the cycle as measured;
  when the result holds decode groups at two or more step counts of the same kind (a sweep's runs, an adaptive
  server's spec groups), each phase is fitted by least squares on the step count instead. The GPU clock and the
  host clock (``events`` timer) are modelled apart.
* **Cadence.** What a client sees follows the start-to-start time of cycles on the host (``GroupStats.cadence_ms``):
  host-bound, it moves with the host's time for the phases; GPU-bound, with the GPU's. With ``C`` the measured
  cadence, ``G``/``H`` the GPU/host cycle at ``k`` and ``G(j)``/``H(j)`` the modelled ones, the cadence at ``j``
  is ``max(C + H(j) - H, G(j) * min(1, C / G))``: exactly ``C`` at ``k``, and never below the GPU's own time.
  When the GPU sets the pace (``events`` timer, ``G >= 1.25 H`` and ``C >= G``, measured at more than one step) the
  host waits out the GPU between cycles, so a host change inside the cycle does not move the cadence: it is
  ``C - G + max(G(j), H(j))``, the gap beyond the GPU's time kept (on the H200's GPU-bound testbed the host-clock
  rule read a 1-step cadence of 7.07 ms from a 5-step run where 6.51 was measured; this one 6.58).
* **No speculation** (``steps: 0``): one token per request per cycle, and a cycle between two bounds: the
  target's forward alone (the verify phase at one token per request, the longer of its GPU and host time: the
  scheduler's own work hidden as the overlap scheduler hides it) and that forward plus all else the speculative
  cycle and the scheduler cost as measured (no draft, no draft extend). The estimate is the first (on the H200
  testbed plain decoding ran within -21% to +27% of it, and 37% to 57% faster than the second: a speculative
  cycle's other costs are not a plain one's); its spread is half the way to the second, in tok/s, and at least
  30%, what the estimate has missed by there (basis ``estimate``, said as such). A no-speculation throughput
  measured on the same server (a sweep's baseline) replaces it (basis ``measured``).
* **Uncertainty** (``spread``, relative, of ``tokens_per_s``): the spread of the measured tok/s over windows of the
  run, combined (root of the sum of squares) with the standard error of the accept length at that step count,
  the uncertainty of the tail rate for extrapolated points, and a quarter of the modelled change in cadence
  (the cost model's own error, unknown, taken as that) where one step count was measured; the fit's residuals
  where several were.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Sequence

from eaglepatch.errors import UsageError
from eaglepatch.report.labels import CLIENT, UNSCALED
from eaglepatch.report.model import Acceptance, GroupStats, ReportResult
from eaglepatch.report.stats import round_json

BASES = ("measured", "profile", "extrapolated", "estimate")
DRAFT_PHASES = ("draft",)  # cost grows with the steps
# The GPU sets the pace when a cycle's GPU time is this much longer than the host's time in it: the host launched
# everything and waits (on the H200 testbeds G/H read 1.65-3.2 on the GPU-bound server, 1.00-1.01 on the
# host-bound one, where the GPU clock reads the host's launches)
_GPU_BOUND = 1.25
_MODEL_ERROR = 0.25  # the share of a modelled change in cadence taken as its uncertainty (one step count measured)
# The no-speculation estimate's spread is never below this: on the H200 testbed plain decoding ran from 21% slower
# to 27% faster than it (seven comparisons: a host-bound and a GPU-bound model, one and four requests at a time;
# the three GPU-bound ones 16-27% faster: verify does more than a plain forward).
_ESTIMATE_SPREAD = 0.3
# A baseline measured by one launch (a range of 0) still carries what launches of one setting differ by: 2-5% on
# a GPU-bound server (H200: every restart sweep kept in docs/gpu/), more on a host-bound one; the floor is the least
LAUNCH_SPREAD = 0.02
# A group of fewer decode cycles predicts nothing where a user reads it (report, bench, doctor): on the H200 a
# server that had answered only its health checks (5-17 cycles, the first of them a second of warm-up) read "no
# speculation would be 122-352% faster".
MIN_CYCLES = 50


@dataclass(frozen=True)
class Shape:
    """A group's speculative settings: draft ``steps``, ``topk`` and ``draft_tokens`` (``None``: not known)."""

    steps: int | None
    topk: int | None
    draft_tokens: int | None
    adaptive: bool = False


@dataclass(frozen=True)
class Baseline:
    """A no-speculation throughput measured on the same server (a sweep's baseline point): client tok/s and its
    relative spread, where it came from, and ``ratio``, the baseline over the sweep's own point at the step count
    the records ran at (when the sweep has one: the prediction then scales the records' tok/s by it, so that the
    sweep's load and the records' need not be the same)."""

    tokens_per_s: float
    spread: float
    source: str
    ratio: float | None = None


def baseline_from_sweep(sweep: dict[str, Any] | None, steps: int | None) -> Baseline | None:
    """The baseline of a ``sweep --json`` summary (a point that ran, with its median and min-max), with its ratio
    to the summary's point at ``steps`` draft steps; ``None`` without one."""
    if not sweep or sweep.get("baseline") is None:
        return None
    pts = sweep.get("points") or []
    b = sweep["baseline"]
    if not 0 <= b < len(pts) or pts[b].get("status") != "ok" or not (pts[b].get("tokens_per_s") or {}).get("median"):
        return None
    tps = pts[b]["tokens_per_s"]
    med = float(tps["median"])
    spread = max((float(tps.get("max") or med) - float(tps.get("min") or med)) / 2 / med, LAUNCH_SPREAD)
    ratio = None
    for p in pts:
        t = p.get("tokens_per_s") or {}
        if p.get("status") == "ok" and t.get("median") and str((p.get("flags") or {}).get(
                "speculative-num-steps")) == str(steps):
            ratio = med / float(t["median"])
            break
    return Baseline(med, spread, f"the sweep {sweep.get('path') or ''}".rstrip(), ratio)


@dataclass(frozen=True)
class Point:
    """One predicted step count. ``cycle_ms`` is the wall time of a cycle less ``between_ms`` (the scheduler's
    time before the next), so ``tokens_per_s`` = tokens per cycle / (``cycle_ms`` + ``between_ms``)."""

    steps: int
    draft_tokens: int
    accept_len: float
    cycle_ms: float
    between_ms: float
    tokens_per_s: float
    spread: float
    basis: str

    def to_json(self) -> dict[str, Any]:
        """The docs/contract.md ``predict`` element."""
        return {"steps": self.steps, "draft_tokens": self.draft_tokens, "accept_len": round_json(self.accept_len),
                "cycle_ms": round_json(self.cycle_ms), "between_ms": round_json(self.between_ms),
                "tokens_per_s": round_json(self.tokens_per_s, 1), "spread": round_json(self.spread, 3),
                "basis": self.basis}


@dataclass(frozen=True)
class Prediction:
    """A group's predictions (``points``, ``best`` an index into them), or ``why`` none is made; ``notes`` say
    what each basis rests on here; ``measured_steps`` is the step count the records ran at."""

    points: tuple[Point, ...] = ()
    best: int | None = None
    why: str | None = None
    notes: tuple[str, ...] = ()
    measured_steps: int | None = None

    @property
    def best_point(self) -> Point | None:
        return self.points[self.best] if self.best is not None else None

    def point(self, steps: int) -> Point | None:
        """The point for ``steps``, or ``None``."""
        for p in self.points:
            if p.steps == steps:
                return p
        return None

    def to_json(self) -> dict[str, Any]:
        """``{"predict": [...], "predict_best": i, "predict_notes": [...]}``, or ``{"predict": null,
        "predict_note": why}``."""
        if self.why is not None:
            return {"predict": None, "predict_note": self.why}
        return {"predict": [p.to_json() for p in self.points], "predict_best": self.best,
                "predict_notes": list(self.notes)}


# --------------------------------------------------------------------------------------------------------------
# The settings of a group


def as_int(v: Any) -> int | None:
    """A whole number from a record or a flag (an int, or a string of digits), else None (a bool is not one)."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, str) and v.strip().isdigit():
        return int(v)
    return None


def shape_of(g: GroupStats, flags: dict[str, Any]) -> Shape:
    """The settings the group's cycles ran with: its records' ``spec`` (adaptive speculation) first, else the run
    header's launch flags."""
    adaptive = bool(flags.get("speculative-adaptive"))
    if g.spec:
        parts = dict(p.partition("=")[::2] for p in g.spec.split(","))
        return Shape(as_int(parts.get("steps")), as_int(parts.get("topk")), as_int(parts.get("draft_tokens")), adaptive)
    steps = as_int(flags.get("speculative-num-steps"))
    topk = as_int(flags.get("speculative-eagle-topk"))
    tokens = as_int(flags.get("speculative-num-draft-tokens"))
    if topk is None and steps is not None and tokens == steps + 1:
        topk = 1  # a chain: the only shape where draft tokens = steps + 1
    return Shape(steps, topk, tokens, adaptive)


# --------------------------------------------------------------------------------------------------------------
# Acceptance


def _geometric(accept_len: float, k: int) -> tuple[float, ...]:
    """``at_least`` of a profile whose every position passes at one rate ``p``, fitted so that the mean tokens per
    request-cycle at ``k`` steps (1 + p + ... + p^k) is ``accept_len`` (bisection)."""
    target = min(max(accept_len, 1.0), k + 1.0)
    lo, hi = 0.0, 1.0
    for _ in range(60):
        p = (lo + hi) / 2
        if sum(p ** i for i in range(k + 1)) < target:
            lo = p
        else:
            hi = p
    p = (lo + hi) / 2
    return tuple(p ** i for i in range(k + 1))


@dataclass(frozen=True)
class _Profile:
    at_least: tuple[float, ...]  # k + 1 entries: the share of request-cycles reaching each position
    samples: int
    hist: tuple[tuple[int, int], ...]  # empty for a fitted geometric profile
    k: int

    def _tail_counts(self) -> tuple[float, float]:
        """(request-cycles that reached position ``k``, those of them that passed it)."""
        a = self.at_least
        if self.k < 1 or not a[self.k - 1]:
            return 0.0, 0.0
        if not self.samples:  # a fitted profile: its rate, as if from 100 request-cycles
            return 100.0, 100.0 * a[self.k] / a[self.k - 1]
        return self.samples * a[self.k - 1], self.samples * a[self.k]

    @property
    def tail_rate(self) -> float:
        """The rate at which the last measured position passes, estimated as ``(passed + 1/2) / (reached + 1)``
        (the mean of a Jeffreys prior's posterior): never exactly 0 or 1 from a finite count."""
        reached, passed = self._tail_counts()
        return (passed + 0.5) / (reached + 1.0) if reached else 0.0

    @property
    def tail_error(self) -> float:
        """The standard deviation of that posterior."""
        reached, _ = self._tail_counts()
        r = self.tail_rate
        return math.sqrt(r * (1 - r) / (reached + 2.0)) if reached else 0.0

    def accept_len(self, j: int) -> float:
        """Mean tokens per request-cycle at ``j`` steps (``j`` may exceed ``k``: geometric continuation)."""
        a = self.at_least
        if j <= self.k:
            return sum(a[: j + 1])
        r = self.tail_rate
        return sum(a) + a[self.k] * sum(r ** m for m in range(1, j - self.k + 1))

    def stderr(self, j: int) -> float:
        """The standard error of ``accept_len(j)`` (request-cycles taken as independent), and for ``j > k`` the
        tail rate's error carried through."""
        if not self.samples:
            if j <= self.k:
                return 0.0
            a, r = self.at_least, self.tail_rate
            return a[self.k] * sum(m_ * r ** (m_ - 1) for m_ in range(1, j - self.k + 1)) * self.tail_error
        cap = min(j, self.k) + 1
        if self.hist:
            m = sum(min(t, cap) * n for t, n in self.hist) / self.samples
            var = sum((min(t, cap) - m) ** 2 * n for t, n in self.hist) / self.samples
        else:
            a = self.at_least
            m = sum(a[:cap])
            var = sum((2 * i + 1) * a[i] for i in range(cap)) - m * m  # E[X^2] - E[X]^2 from the tail sums
        err = math.sqrt(max(var, 0.0) / self.samples)
        if j > self.k:
            a, r = self.at_least, self.tail_rate
            d = a[self.k] * sum(m_ * r ** (m_ - 1) for m_ in range(1, j - self.k + 1))
            err = math.hypot(err, d * self.tail_error)
        return err


def _profile(acc: Acceptance | None, accept_len: float | None, k: int) -> _Profile | None:
    if acc is not None and acc.samples:
        al = list(acc.at_least[: k + 1])
        al += [0.0] * (k + 1 - len(al))
        hist = tuple((min(t, k + 1), n) for t, n in acc.hist)
        return _Profile(tuple(al), acc.samples, hist, k)
    if accept_len is None:
        return None
    return _Profile(_geometric(accept_len, k), 0, (), k)


# --------------------------------------------------------------------------------------------------------------
# Cost


def _per_cycle(g: GroupStats, host: bool) -> dict[str, float] | None:
    """Each phase's time per cycle of the group (its total over the group's cycles; a phase that ran in some
    cycles only counts 0 in the others), and ``""`` for the rest of the cycle; on the host clock with ``host``."""
    cyc = g.host_cycle if host else g.cycle
    n = g.record_count  # the records the totals are over (apply --every N: fewer than the cycles)
    if cyc is None or not n:
        return None
    out: dict[str, float] = {}
    for p in g.phases:
        st = p.host if host else p.stats
        if st is not None:
            out[p.name] = st.total / n
    out[""] = max(cyc.total / n - sum(out.values()), 0.0)
    return out


def _fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float, float]:
    """Least squares ``y = a + b x``: ``(a, b, rms residual)``; ``b = 0`` when the xs do not vary."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    a = my - b * mx
    rms = math.sqrt(sum((y - a - b * x) ** 2 for x, y in zip(xs, ys)) / n)
    return a, b, rms


@dataclass(frozen=True)
class _Cost:
    """Per phase (``""``: the rest of the cycle) the time per cycle at ``j`` steps, on one clock."""

    at_k: dict[str, float]
    k: int
    lines: dict[str, tuple[float, float]] | None = None  # fitted a + b j, from several step counts
    rms: float = 0.0  # the fit's residual, summed over phases (ms)
    forwards: bool = False  # the draft scaled by its forwards (steps - 1), not its steps: see ``phase``

    def phase(self, name: str, j: int) -> float:
        """The time per cycle of ``name`` at ``j`` steps: none for the draft and its extend without speculation,
        the fitted line where there is one, else the draft proportional to its steps (to its forwards, ``j - 1``,
        with ``forwards``: see below) and the rest as at ``k``."""
        if j == 0 and name in (*DRAFT_PHASES, "draft_extend"):
            return 0.0
        if self.lines is not None and name in self.lines:
            a, b = self.lines[name]
            return max(a + b * j, 0.0)
        v = self.at_k[name]
        if name not in DRAFT_PHASES:
            return v
        # sglang's draft_forward runs steps - 1 forwards of the draft (the first guess comes from the draft
        # extend of the cycle before): their GPU time scales so where the GPU sets the pace (``forwards``); a
        # host-bound GPU clock reads the host's launches, which do not (one CUDA graph replay, or a launch each)
        return v * (j - 1) / (self.k - 1) if self.forwards else v * j / self.k

    def cycle(self, j: int) -> float:
        """The cycle's time at ``j`` steps: the sum of its phases and the rest."""
        return sum(self.phase(name, j) for name in self.at_k)


def _costs(g: GroupStats, k: int, host: bool, family: Sequence[tuple[int, GroupStats]]) -> _Cost | None:
    at_k = _per_cycle(g, host)
    if at_k is None:
        return None
    points = [(j, pc) for j, o in family if (pc := _per_cycle(o, host)) is not None]
    if len({j for j, _ in points}) < 2:
        return _Cost(at_k, k)
    lines: dict[str, tuple[float, float]] = {}
    rms = 0.0
    for name in at_k:
        xs = [float(j) for j, pc in points if name in pc]
        ys = [pc[name] for j, pc in points if name in pc]
        if len(set(xs)) >= 2:
            a, b, r = _fit(xs, ys)
            lines[name] = (a, b)
            rms += r
    return _Cost(at_k, k, lines, rms)


# --------------------------------------------------------------------------------------------------------------
# The model


def default_steps(k: int) -> list[int]:
    """0 (no speculation) and 1..max(8, k + 2)."""
    return [0, *range(1, max(8, k + 2) + 1)]


def parse_steps(text: str) -> list[int]:
    """``--steps``: ``"0,1,2,3,5"`` or ranges ``"0-8"``; whole numbers 0..64. Raises UsageError."""
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        lo, dash, hi = part.partition("-")
        try:
            rng = range(int(lo), int(hi) + 1) if dash else range(int(part), int(part) + 1)
        except ValueError:
            raise UsageError(f"--steps {text!r}: give step counts like 0,1,2,3,5 or 0-8") from None
        if not rng or rng.start < 0 or rng.stop > 65:
            raise UsageError(f"--steps {text!r}: step counts run from 0 to 64")
        out.update(rng)
    return sorted(out)


def _window_spread(g: GroupStats) -> float:
    w = g.window_tokens_per_s
    if len(w) < 2:
        return 0.0
    m = sum(w) / len(w)
    sd = math.sqrt(sum((x - m) ** 2 for x in w) / (len(w) - 1))
    return sd / m if m > 0 else 0.0


def _per_rank(g: GroupStats) -> int:
    """The group's decode records per rank (under TP every rank records every cycle; apply --every N: one record
    in N cycles)."""
    return g.record_count // max(1, g.ranks)


def predict_group(g: GroupStats, shape: Shape, *, steps: Sequence[int] | None = None,
                  family: Sequence[tuple[int, GroupStats]] = (), baseline: Baseline | None = None,
                  min_cycles: int = 0) -> Prediction:
    """The prediction for one decode group that ran with ``shape``. ``family``: the decode groups of the same kind
    at other step counts, ``(steps, group)``, for the cost fit; ``baseline``: a measured no-speculation point;
    ``min_cycles``: the decode cycles per rank it needs (fewer: none, and why)."""
    if g.mode != "decode":
        return Prediction(why="only decode cycles are predicted")
    k = shape.steps
    if k == 0:
        return Prediction(why="these cycles ran with 0 draft steps (sglang's adaptive zero-step state): no acceptance "
                              "profile to predict from", measured_steps=0)
    if k is None or k < 1:
        return Prediction(why="the step count this run used is not known (no --speculative-num-steps in the run "
                              "header, no spec in the records): no prediction")
    if shape.topk is not None and shape.topk != 1:
        return Prediction(why=f"top-k {shape.topk}: the draft guesses a tree, and a chain's acceptance profile does "
                              "not predict a tree's; only top-k 1 is modelled", measured_steps=k)
    if _per_rank(g) < min_cycles:
        return Prediction(why=f"only {_per_rank(g)} decode cycle(s) recorded{' per rank' if g.ranks > 1 else ''}, "
                              f"too few to predict from (at least {min_cycles}): load the server first (eaglepatch "
                              "bench)", measured_steps=k)
    if not g.tokens_per_s or g.cadence_ms is None or not g.accepted_cycles:
        return Prediction(why="no accepted tokens in these records: nothing to predict from", measured_steps=k)
    prof = _profile(g.acceptance, g.accept_len, k)
    if prof is None:
        return Prediction(why="no accept length in these records: nothing to predict from", measured_steps=k)
    events = g.host_cycle is not None
    gcost = _costs(g, k, False, family)
    hcost = _costs(g, k, True, family) if events else gcost
    if gcost is None or hcost is None:
        return Prediction(why="no phase times in these records", measured_steps=k)

    C = g.cadence_ms
    G = gcost.cycle(k)
    H = hcost.cycle(k)
    r = min(1.0, C / G) if G > 0 else 1.0
    # the GPU sets the pace: the host waits out the GPU between cycles, so a change of the host's time inside the
    # cycle does not move the cadence, and the draft's GPU time follows its forwards (a 1-step run measured none)
    gpu_bound = events and k > 1 and G >= _GPU_BOUND * H and C >= G
    if gpu_bound:
        gcost = replace(gcost, forwards=True)
    between = g.between.mean if g.between is not None else 0.0
    a_k = prof.accept_len(k)
    tokens_k = (g.wall_tokens_per_s or 0.0) * C / 1000.0  # tokens per cycle, measured
    per_req = tokens_k / a_k if a_k > 0 else 0.0  # requests per cycle
    s_w = _window_spread(g)
    fitted = gcost.lines is not None

    def cadence(j: int) -> float:
        if gpu_bound:  # the gap beyond the GPU's time stays
            return C - G + max(gcost.cycle(j), hcost.cycle(j))
        return max(C + hcost.cycle(j) - H, gcost.cycle(j) * r)

    notes = [f"measured: {g.accepted_cycles} decode cycles at {k} steps"]
    if g.acceptance is not None:
        notes.append(f"profile: accept length at fewer steps read from {prof.samples} request-cycles' tokens")
    else:
        notes.append("profile: no per-request counts in these records: a geometric profile fitted to the accept "
                     f"length {a_k:.2f} stands in")
    notes.append(f"extrapolated: beyond {k} steps each position passes at the last measured rate "
                 f"{prof.tail_rate:.2f}")
    if fitted:
        notes.append(f"cost: each phase fitted on the step counts of {len(family)} groups")
    else:
        notes.append("cost: the draft proportional to its steps (its GPU time to its forwards, steps - 1, where "
                     "the GPU sets the pace), verify, draft extend and the rest as measured")
    if events:
        notes.append("cadence: the host clock between cycle starts; host-bound phases move it by their host time, "
                     "GPU-bound by their GPU time")

    points: list[Point] = []
    for j in (list(steps) if steps is not None else default_steps(k)):
        cad = cadence(j)
        err_cost = (gcost.rms / cad if fitted else _MODEL_ERROR * abs(cad - C) / cad) if cad > 0 else 0.0
        if j == 0:
            if baseline is not None:
                tps = baseline.tokens_per_s if baseline.ratio is None else baseline.ratio * (g.wall_tokens_per_s
                                                                                            or 0.0)
                cad = per_req / tps * 1000.0 if tps > 0 else cad
                points.append(Point(0, 1, 1.0, max(cad - between, 0.0), between, tps, baseline.spread, "measured"))
                continue
            fast = max(gcost.phase("verify", 0) if "verify" in gcost.at_k else 0.0,
                       hcost.phase("verify", 0) if "verify" in hcost.at_k else 0.0)
            if not 0 < fast < cad:
                fast = cad
            tps = per_req / fast * 1000.0
            # half the way to the slow bound, in tok/s, and no less than the estimate has missed by on real servers
            spread = max(math.hypot(s_w, (1 - fast / cad) / 2), _ESTIMATE_SPREAD)
            points.append(Point(0, 1, 1.0, max(fast - between, 0.0), between, tps, spread, "estimate"))
            continue
        a_j = prof.accept_len(j)
        tps = per_req * a_j / cad * 1000.0 if cad > 0 else 0.0
        err_acc = prof.stderr(j) / a_j if a_j > 0 else 0.0
        basis = "measured" if j == k else "profile" if j < k else "extrapolated"
        spread = s_w if j == k else math.sqrt(s_w ** 2 + err_acc ** 2 + err_cost ** 2)
        points.append(Point(j, j + 1, a_j, max(cad - between, 0.0), between, tps, spread, basis))
    if baseline is None and any(p.steps == 0 for p in points):
        notes.append("estimate: no speculation's cycle taken as the target's forward alone (verify at one token "
                     "per request), the spread half the way to that plus the rest of the cycle and the scheduler's "
                     "time as measured, and at least 30% (what it has missed by on real servers); not measured: a "
                     "sweep with --baseline measures it (a live sweep's steps 0 still runs the draft extend)")
        if gpu_bound:
            notes.append("estimate: the GPU sets this server's pace, and on such servers the estimate has read "
                         "14-21% under plain decoding (H200, three comparisons: verify's mode of the forward costs "
                         "more than a plain decode's, whatever the tokens it checks)")
    elif baseline is not None:
        notes.append(f"no speculation: measured by {baseline.source}, " + (
            f"its {CLIENT} put on the records' scale by its ratio to the sweep's own point at {k} steps"
            if baseline.ratio is not None else
            f"its {CLIENT} as the sweep measured it, {UNSCALED} (the sweep has no point at {k} steps to scale it "
            "by)"))
    best = max(range(len(points)), key=lambda i: points[i].tokens_per_s) if points else None
    return Prediction(points=tuple(points), best=best, notes=tuple(notes), measured_steps=k)


def _family_key(g: GroupStats) -> tuple[Any, ...]:
    return (g.mode, tuple((k, v) for k, v in g.key if k not in ("run", "spec")))


def predict(result: ReportResult, *, steps: Sequence[int] | None = None, sweep: dict[str, Any] | None = None,
            flags: dict[str, Any] | None = None, min_cycles: int = 0) -> list[Prediction | None]:
    """A prediction for each group of ``result`` (``None`` for groups that are not decode), in order; ``sweep``: a
    ``sweep --json`` summary of the same server, whose baseline (when it ran) is the no-speculation point;
    ``flags``: the server's launch flags, for runs whose header lines carry none; a group of fewer than
    ``min_cycles`` decode cycles per rank gets none, with the reason (``report``, ``bench`` and ``doctor`` ask for
    ``MIN_CYCLES``), and is left out of the others' cost fit."""
    runs = {r.id: r.flags_dict() for r in result.runs}
    only = result.runs[0].flags_dict() if len(result.runs) == 1 else {}

    def flags_of(g: GroupStats) -> dict[str, Any]:
        own = runs.get(g.run, only) if g.run else only
        return own if own or not flags else flags

    shapes = [shape_of(g, flags_of(g)) for g in result.groups]
    families: dict[tuple[Any, ...], list[tuple[int, GroupStats]]] = {}
    for g, sh in zip(result.groups, shapes):
        if g.mode == "decode" and sh.steps and (sh.topk in (None, 1)) and g.n and _per_rank(g) >= min_cycles:
            families.setdefault(_family_key(g), []).append((sh.steps, g))
    out: list[Prediction | None] = []
    for g, sh in zip(result.groups, shapes):
        if g.mode != "decode":
            out.append(None)
            continue
        fam = families.get(_family_key(g), [])
        out.append(predict_group(g, sh, steps=steps, family=fam, baseline=baseline_from_sweep(sweep, sh.steps),
                                 min_cycles=min_cycles))
    return out
