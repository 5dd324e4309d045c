"""Costs that follow the work: each phase of a decode cycle priced by the tokens its forward processes (pure).

A decode cycle of ``bs`` requests at ``j`` draft steps (top-k 1: ``j + 1`` draft tokens) runs:

* the draft: ``j`` guesses for each request, ``bs * j`` tokens, in ``j`` forwards of ``bs`` tokens each: it is
  priced as ``j`` times one forward's curve at ``bs`` tokens (a forward's fixed cost is paid per step: in the tests'
  batching stand-in, pricing the draft's ``bs * j`` tokens on one curve put a 1-step draft at 5.5 ms where it took
  1.05);
* verify: the target over every draft token of every request, ``bs * (j + 1)`` tokens;
* the draft extend: the draft over the same, ``bs * (j + 1)`` tokens;
* the rest: everything else from one cycle's start to the next on the host clock (the cycle's untimed parts and the
  scheduler's time between cycles), per request, ``bs``.

Each is fitted, by least squares weighted by the cycles each decode group holds, over every batch size and step count
the records ran (``fit``), as a roofline: ``max(floor_ms, fixed_ms + per_token_ms * tokens)``. A forward on a GPU
costs about the same for few tokens (it reads the weights whatever the batch: memory-bound, or bound by its
launches) and grows with the tokens once their work outweighs that; the knee (``knee_tokens``, where the two meet)
is the one that leaves the least residual (``roofline``; at the first measured count it is a straight line over the
whole range). A straight line alone misprices a forward measured on both sides of its knee:
in the tests' CPU world it put verify's cost at 2 draft steps and 32 requests 15% too low and named no speculation
best where 2 steps was. Below the measured tokens the price stays at the floor; above them the line goes on, which
under-prices a forward that bends upward again (a point outside the measured tokens is ``extrapolated``, with a
wider spread). The ``rest`` is what the cadence holds beyond the timed phases, so the curves add up to the cadence
the records measured (``GroupStats.cadence_ms``, a client's view), not to the GPU's time alone; it is the
scheduler's work per request, no forward, and is fitted as a straight line (a knee there fitted the noise of a few
ramp-down cycles in the tests' batching stand-in: 8 ms a request past 15 requests).

``Curve.price(tokens)`` is the time; ``Curve.inside(tokens)`` says whether the token count lies in the measured
range; ``CostModel.cycle_ms(bs, j)`` the wall time per cycle and ``CostModel.basis(bs, j)`` ``fitted`` or
``extrapolated``. ``to_json`` is the ``cost_model`` object of docs/contract.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from eaglepatch.report.model import GroupStats
from eaglepatch.report.stats import round_json

PHASES = ("draft", "verify", "draft_extend", "rest")


def tokens_of(phase: str, bs: int, steps: int) -> int:
    """The tokens one forward of ``phase`` processes in a cycle of ``bs`` requests at ``steps`` draft steps (top-k
    1): the draft's each of its ``steps`` forwards (``forwards_of``), the others their one."""
    if phase in ("verify", "draft_extend"):
        return bs * (steps + 1)
    return bs


def forwards_of(phase: str, steps: int) -> int:
    """How many forwards of ``phase`` a cycle at ``steps`` draft steps runs: the draft one per step, the others
    one."""
    return steps if phase == "draft" else 1


@dataclass(frozen=True)
class Curve:
    """One forward's time as ``max(floor_ms, fixed_ms + per_token_ms * tokens)``, the two meeting at
    ``knee_tokens`` (the draft's per step: its time per cycle over its steps); ``lo``/``hi`` the token counts
    measured, ``rms_ms`` the weighted residual, ``points`` how many decode groups it was fitted on."""

    fixed_ms: float
    per_token_ms: float
    floor_ms: float
    knee_tokens: float
    lo: int
    hi: int
    rms_ms: float
    points: int

    def price(self, tokens: float) -> float:
        """The time per cycle at ``tokens`` (never below 0)."""
        rising = self.fixed_ms + self.per_token_ms * tokens
        return max(rising if tokens > self.knee_tokens else self.floor_ms, 0.0)

    def inside(self, tokens: float) -> bool:
        return self.lo <= tokens <= self.hi

    def reach(self, tokens: float) -> float:
        """How far outside the measured range ``tokens`` lies, as a factor (0 inside: ``log2`` of the ratio to the
        nearer end otherwise)."""
        if self.inside(tokens) or tokens <= 0:
            return 0.0
        edge = self.hi if tokens > self.hi else self.lo
        return abs(math.log2(tokens / edge)) if edge > 0 else 1.0

    def to_json(self) -> dict[str, Any]:
        return {"fixed_ms": round_json(self.fixed_ms), "per_token_ms": round_json(self.per_token_ms, 6),
                "floor_ms": round_json(self.floor_ms), "knee_tokens": round_json(self.knee_tokens, 1), "tokens": [self.lo, self.hi],
                "rms_ms": round_json(self.rms_ms), "groups": self.points}


def roofline(obs: Sequence[tuple[float, float, float]], knee: bool = True) -> tuple[float, float, float, float]:
    """The roofline through ``(x, y, weight)``: ``y = c + b * max(0, x - x0)`` for the knee ``x0`` that leaves the
    least weighted residual, looked for from the smallest x up to the second largest (so that the rising part rests
    on two token counts at least), at the xs and 16 log-spaced points between each two; ``(x0, c, b, rms)``. One
    token count: flat at its weighted mean. ``knee=False``: a straight line (the knee at the smallest x)."""
    xs = sorted({o[0] for o in obs})
    knees = [xs[0]]
    if knee and len(xs) > 2:  # the measured counts below the largest two, and 16 steps (log-spaced) between each two of them
        for a, b in zip(xs[: len(xs) - 2], xs[1: len(xs) - 1]):
            knees += [a * (b / a) ** (i / 16) for i in range(1, 17)] if a > 0 else [b]
    best: tuple[float, float, float, float] | None = None
    for x0 in knees:
        c, b, rms = weighted_line([(max(0.0, x - x0), y, w) for x, y, w in obs])
        if best is None or rms < best[3] - 1e-12:
            best = (x0, c, b, rms)
    assert best is not None
    return best


def weighted_line(obs: Sequence[tuple[float, float, float]]) -> tuple[float, float, float]:
    """Least squares ``y = a + b x`` over ``(x, y, weight)``: ``(a, b, weighted rms residual)``; ``b = 0`` when the
    xs do not vary (the weighted mean then stands for every x)."""
    w = sum(o[2] for o in obs)
    mx = sum(x * wt for x, _, wt in obs) / w
    my = sum(y * wt for _, y, wt in obs) / w
    sxx = sum(wt * (x - mx) ** 2 for x, _, wt in obs)
    b = sum(wt * (x - mx) * (y - my) for x, y, wt in obs) / sxx if sxx > 0 else 0.0
    a = my - b * mx
    rms = math.sqrt(sum(wt * (y - a - b * x) ** 2 for x, y, wt in obs) / w)
    return a, b, rms


@dataclass(frozen=True)
class Observed:
    """One decode group's figures for the fit: its batch size, step count, cycles, and time per cycle of each
    phase (``rest``: the cadence less the timed phases)."""

    bs: int
    steps: int
    cycles: int
    per_cycle: dict[str, float]


def observe(g: GroupStats, bs: int, steps: int) -> Observed | None:
    """A decode group's figures, or None when it has no cadence (no accepted tokens) or no cycles."""
    if g.mode != "decode" or not g.record_count or g.cadence_ms is None:
        return None
    per: dict[str, float] = {}
    for name in ("draft", "verify", "draft_extend"):
        p = g.phase(name)
        per[name] = p.stats.total / g.record_count if p is not None and p.stats is not None else 0.0
    per["rest"] = max(g.cadence_ms - sum(per.values()), 0.0)
    return Observed(bs, steps, g.record_count, per)


@dataclass(frozen=True)
class CostModel:
    """A curve per phase (``PHASES``)."""

    curves: dict[str, Curve]

    def phase_ms(self, phase: str, bs: int, steps: int) -> float:
        if steps == 0 and phase in ("draft", "draft_extend"):
            return 0.0
        return forwards_of(phase, steps) * self.curves[phase].price(tokens_of(phase, bs, steps))

    def cycle_ms(self, bs: int, steps: int) -> float:
        """The wall time from one cycle's start to the next at ``bs`` requests and ``steps`` draft steps."""
        return sum(self.phase_ms(p, bs, steps) for p in PHASES)

    def reach(self, bs: int, steps: int) -> float:
        """How far outside the measured tokens the farthest phase's price lies (0: every phase inside)."""
        return max(self.curves[p].reach(tokens_of(p, bs, steps)) for p in PHASES
                   if not (steps == 0 and p in ("draft", "draft_extend")))

    def basis(self, bs: int, steps: int) -> str:
        return "fitted" if self.reach(bs, steps) == 0 else "extrapolated"

    def error(self, bs: int, steps: int) -> float:
        """The relative uncertainty of ``cycle_ms``: the curves' residuals over the cycle, and beyond the measured
        tokens that times one plus how far (in doublings) the price reaches out."""
        cyc = self.cycle_ms(bs, steps)
        if cyc <= 0:
            return 0.0
        rms = math.sqrt(sum(self.curves[p].rms_ms ** 2 for p in PHASES))
        return rms / cyc * (1.0 + self.reach(bs, steps))

    def to_json(self) -> dict[str, Any]:
        return {p: self.curves[p].to_json() for p in PHASES}


def fit(observed: Iterable[Observed]) -> CostModel | None:
    """The curves fitted on ``observed`` (weighted by their cycles); None without any."""
    obs = tuple(observed)
    if not obs:
        return None
    curves = {}
    for phase in PHASES:
        pts = [(float(tokens_of(phase, o.bs, o.steps)), o.per_cycle[phase] / forwards_of(phase, o.steps),
                float(o.cycles)) for o in obs]
        x0, c, b, rms = roofline(pts, knee=phase != "rest")
        xs = [int(x) for x, _, _ in pts]
        curves[phase] = Curve(c - b * x0, b, c, x0, min(xs), max(xs), rms, len(pts))
    return CostModel(curves)
