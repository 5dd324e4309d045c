"""groups.select: the few order statistics a long series' Stats read, picked without ordering every value, must be
exactly those of ``sorted`` (or it declines, and ``ordered`` runs)."""

from __future__ import annotations

import math
import random
from array import array

import pytest

from eaglepatch.report import groups as G
from eaglepatch.report.stats import percentile

N = 70_000  # above groups._COUNT_MIN: the length at which _series_stats tries select


def _series(kind: str, n: int = N) -> array:
    rng = random.Random(kind)
    if kind == "gauss":  # a phase's times, rounded as the runtime rounds them
        return array("f", (round(rng.gauss(5, 0.3), 4) for _ in range(n)))
    if kind == "heavy tail":
        return array("f", (rng.expovariate(1) ** 3 for _ in range(n)))
    if kind == "inf tail":
        return array("f", [rng.random() for _ in range(n - 500)] + [math.inf] * 500)
    if kind == "zeros 30%":
        return array("f", (0.0 if rng.random() < 0.3 else rng.random() for _ in range(n)))
    if kind == "sorted":
        return array("f", (i * 0.001 for i in range(n)))
    if kind == "descending":
        return array("f", (i * 0.001 for i in range(n, 0, -1)))
    if kind == "huge range":
        return array("f", (10 ** rng.uniform(-30, 30) for _ in range(n)))
    if kind == "denormal":
        return array("f", (rng.random() * 1e-40 for _ in range(n)))
    if kind == "constant":
        return array("f", [1.25] * n)
    if kind == "two values":
        return array("f", (rng.choice((1.0, 2.0)) for _ in range(n)))
    if kind == "period":  # a period that the sample's step meets
        return array("f", (float(i % 31) for i in range(n)))
    if kind == "one negative":
        return array("f", [rng.random() for _ in range(n - 1)] + [-1.0])
    if kind == "negative zero":
        return array("f", [rng.random() for _ in range(n - 1)] + [-0.0])
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["gauss", "heavy tail", "inf tail", "zeros 30%", "sorted", "descending",
                                  "huge range", "denormal"])
def test_select_picks_exactly_what_sorted_holds(kind: str) -> None:
    v = _series(kind)
    ps = G._positions(len(v))
    got = G.select(v, ps)
    assert got is not None, "these series are what select is for: it must not decline them"
    ref = sorted(v)
    assert {p: got[p] for p in ps} == {p: ref[p] for p in ps}
    picked = G._Picked(got, len(v))
    for q in (50, 90, 99):
        assert repr(percentile(picked, q)) == repr(percentile(ref, q))


@pytest.mark.parametrize("kind", ["constant", "two values", "period", "one negative", "negative zero"])
def test_select_declines_what_it_cannot_vouch_for(kind: str) -> None:
    # many equal values (counting is quicker), a sample unlike the values, a sign bit (bits that do not order as
    # the floats do, and -0.0 is a key of its own to ordered): None, and the Stats still come out exact
    v = _series(kind)
    assert G.select(v, G._positions(len(v))) is None
    st = G._series_stats(v)
    ref = sorted(v)
    assert st is not None
    assert (st.p50, st.p90, st.p99, st.max) == (percentile(ref, 50), percentile(ref, 90), percentile(ref, 99),
                                                ref[-1])


def test_select_gives_what_a_short_last_chunk_holds() -> None:
    # one value past a whole number of the pass's chunks: the last chunk's guard and thresholds are made again
    n = 8 * G._PASS_CHUNK + 1
    rng = random.Random(7)
    v = array("f", (rng.random() for _ in range(n - 1)))
    v.append(2.0)  # the max sits alone in the last chunk
    got = G.select(v, G._positions(n))
    assert got is not None and got[n - 1] == 2.0
    ref = sorted(v)
    assert all(got[p] == ref[p] for p in G._positions(n))


def test_series_stats_of_a_long_series_equal_the_sorted_ones() -> None:
    v = _series("heavy tail")
    st = G._series_stats(v)
    ref = sorted(v)
    assert st is not None
    assert (st.n, st.p50, st.p90, st.p99, st.max) == (len(v), percentile(ref, 50), percentile(ref, 90),
                                                      percentile(ref, 99), ref[-1])
    assert st.total == math.fsum(v)
