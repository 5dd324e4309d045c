"""A group's accumulator and its statistics: ``Acc`` holds one compact ``array('f')`` per series (cycle, each
phase, between, and the host-clock series of the ``events`` timer) and a few running sums while the scan fills
it; ``finish_group`` turns it into a ``GroupStats`` (exact percentiles), ``merge_into`` joins two (``merge_runs``,
and the data-parallel groups of one group).

Tensor and data parallelism (docs/contract.md, "Topologies"): the scan fills one ``Acc`` per data-parallel group
(a record's ``"dp"``; records without it are one), whose ranks are the tensor-parallel ranks of one batch: every
one of them records the same cycles, the same ``bs``, ``accepted`` and ``accepts``. So a group's tok/s is a ratio
over all its ranks' records (tokens and time both multiplied by the TP size), while its acceptance histogram is
counted per rank and read from one rank (``_one_rank``). ``merge_into`` keeps the sums of another DP group apart
(``DPSums``): the DP groups serve different requests, and the group's tok/s is the sum of theirs.
"""

from __future__ import annotations

import math
import struct
import sys
from array import array
from bisect import bisect_left, bisect_right
from collections import Counter
from itertools import accumulate, count
from operator import add, itemgetter
from typing import Any, Sequence

from eaglepatch.report.model import Acceptance, BetweenStats, GroupStats, PhaseStats, Stats
from eaglepatch.report.stats import percentile, phase_order


class Acc:
    """Per-group accumulator used by the hot loop (mutable; filled by the scan, never leaves the report package)."""

    __slots__ = (
        "mode",
        "keyval",
        "cyc",
        "cyc_app",
        "ph",
        "btw",
        "btw_app",
        "hcyc",
        "hcyc_app",
        "hph",
        "acc",
        "cyc_acc",
        "btw_acc",
        "acc_ab",
        "bs_ab",
        "wcyc_acc",
        "ahist",
        "accs",
        "walls",
        "run",
        "spec",
        "ranks",
        "hists",
        "dp",
        "node",
        "others",
        "untimed",
    )

    def __init__(self, mode: str, keyval: Any, run: str = "", spec: str | None = None, dp: Any = None,
                 node: Any = None):
        self.mode = sys.intern(mode) if type(mode) is str else mode  # a string of each record: one per mode
        self.keyval = keyval
        self.run = run
        self.spec = spec
        self.cyc = array("f")
        self.cyc_app = self.cyc.append
        self.ph: dict[str, Any] = {}  # phase name -> bound append of its array('f')
        self.btw = array("f")
        self.btw_app = self.btw.append
        self.hcyc = array("f")
        self.hcyc_app = self.hcyc.append
        self.hph: dict[str, Any] = {}
        self.acc = 0
        self.cyc_acc = 0.0
        self.btw_acc = 0.0
        self.acc_ab = 0
        self.bs_ab = 0
        self.wcyc_acc = 0.0  # the host clock's cycle time of the records with accepted (cycle_ms without it)
        # per rank: tokens a request produced in a cycle -> request-cycles ("accepts"); one rank's counts the group's
        self.hists: dict[Any, dict[int, int]] = {}
        # per record with accepted, in order: its tokens and its wall time (host cycle + the gap before it), for
        # the spread of tok/s over windows of the run
        self.accs = array("f")
        self.walls = array("f")
        # the ranks of the processes whose records came in (added per process), a tuple: a set costs 216 bytes, and
        # a log of many short runs makes tens of thousands of groups
        self.ranks: tuple[Any, ...] = ()
        self.dp = dp  # the data-parallel group of the records the scan added (a record's "dp"; None: none said)
        self.node = node  # the node rank of the records' processes (a record's "node"), for --by rank
        self.others: dict[Any, DPSums] = {}  # the sums of other DP groups merged in (merge_into), by dp
        self.untimed = 0  # the cycles its records stand for beyond themselves ("every": N, N - 1 each)


class DPSums:
    """The running sums, histograms and ranks of one data-parallel group, merged into the ``Acc`` of another
    (``merge_into``): the same names as ``Acc``'s."""

    __slots__ = ("acc", "cyc_acc", "btw_acc", "acc_ab", "bs_ab", "wcyc_acc", "hists", "ranks")

    def __init__(self) -> None:
        self.acc = 0
        self.cyc_acc = 0.0
        self.btw_acc = 0.0
        self.acc_ab = 0
        self.bs_ab = 0
        self.wcyc_acc = 0.0
        self.hists: dict[Any, dict[int, int]] = {}
        self.ranks: tuple[Any, ...] = ()


def _one_rank(hists: dict[Any, dict[int, int]]) -> tuple[Any, dict[int, int]]:
    """The (rank, histogram) a TP group's acceptance is read from: the rank with the most request-cycles, the
    lowest on a tie; ``(None, {})`` for none.

    Under tensor parallelism every rank records the same batch, so each rank's histogram is the group's and their
    sum would count every request-cycle TP times. One rank's is taken, not the sum divided by the TP size: it needs
    no second pass and no agreement between the ranks (a division is exact only where every rank's counts are the
    same, and a rank whose log lost records would make it wrong), and a per-rank histogram is a few counters. The
    rank with the most counts is the one whose log is the most complete (the runtime may drop records, or remove
    the oldest files of a rank's chain)."""
    best: tuple[Any, dict[int, int]] = (None, {})
    most = -1
    for rank in sorted(hists):
        n = sum(hists[rank].values())
        if n > most:
            best, most = (rank, hists[rank]), n
    return best


class _Counted:
    """A sorted sequence given as distinct values and cumulative counts; indexable like the sorted list."""

    __slots__ = ("keys", "cum", "n")

    def __init__(self, keys: list[float], cum: list[int]):
        self.keys = keys
        self.cum = cum
        self.n = cum[-1] if cum else 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> float:
        if i < 0:
            i += self.n
        if not 0 <= i < self.n:
            raise IndexError(i)
        return self.keys[bisect_right(self.cum, i)]


_UINT = {array(c).itemsize: c for c in "QLI"}  # an unsigned typecode of each size (the smallest name last wins)
_SIGN = {c: 1 << (8 * array(c).itemsize - 1) for c in "QLI"}  # the sign bit of a float of that size
_COUNT_MIN = 1 << 16  # below this many values a plain sort is quick enough
_COUNT_CHUNK = 1 << 16


def ordered(values: array) -> Sequence[float]:
    """The values in ascending order, as something ``percentile`` can index.

    The runtime rounds times to 0.1 us, so a long series has far fewer distinct values than values; counting
    them (C-speed ``Counter``) and sorting the distinct ones is then quicker than sorting everything. When the
    values turn out mostly distinct, fall back to ``sorted``. Both give exactly the same order statistics.
    The values are counted by their bits (an int hashes quicker than a float), then the distinct ones read back
    as floats (0.0 and -0.0, two patterns of bits, one key as before: the first one met).
    """
    n = len(values)
    if n >= _COUNT_MIN:
        code = _UINT.get(values.itemsize) if isinstance(values, array) and values.typecode in "fd" else None
        if code is not None:
            keyed: Any = array(code)
            keyed.frombytes(values.tobytes())
        else:
            keyed = values
        counts: Counter[Any] = Counter()
        for i in range(0, n, _COUNT_CHUNK):
            counts.update(keyed[i : i + _COUNT_CHUNK])
            if len(counts) * 2 > min(n, i + _COUNT_CHUNK):
                break  # mostly distinct: counting does not pay
        else:
            del keyed
            if code is not None:
                bits = sorted(counts)
                if bits[-1] < _SIGN[code]:
                    # no sign bit set: the bits of non-negative floats sort as the floats do
                    floats = array(values.typecode)
                    floats.frombytes(array(code, bits).tobytes())
                    return _Counted(floats.tolist(), list(accumulate([counts[b] for b in bits])))
                floats = array(values.typecode)
                floats.frombytes(array(code, counts).tobytes())
                by_value: dict[float, int] = {}
                for k, c in zip(floats, counts.values()):
                    by_value[k] = by_value.get(k, 0) + c
                counts = by_value  # type: ignore[assignment]
            keys = sorted(counts)
            cum = list(accumulate([counts[k] for k in keys]))
            return _Counted(keys, cum)
        del counts
    return sorted(values)


class _Picked:
    """Some positions of a sorted sequence (``select``), indexable like it at those positions."""

    __slots__ = ("values", "n")

    def __init__(self, values: dict[int, float], n: int):
        self.values = values
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> float:
        return self.values[i]


_QS = (50, 90, 99)  # the percentiles of a series' Stats (p50, p90, p99)
_SAMPLE = 1 << 15  # values in select's sample, about: every (n // _SAMPLE)-th value, but every 5th to 32nd
_SIGMAS = 4.5  # select's margin around a position's estimate, in standard deviations of the sample's rank
_TOP = 0.985  # positions this high share the max's window (open above)
_PASS_CHUNK = 1 << 13  # values select compares at a time: their ints stay in the processor's cache
_pack_f32 = struct.Struct("=f").pack
_unpack_u32 = struct.Struct("=I").unpack


class _Reads:
    """A sorted sequence of length ``n`` that only notes which positions are read (``_positions``)."""

    def __init__(self, n: int):
        self.n = n
        self.read = {n - 1}  # the max's

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> float:
        self.read.add(i)
        return 0.0


def _positions(n: int) -> list[int]:
    """The positions of a sorted series of ``n`` values that ``percentile`` reads for ``_QS``, and the max's: asked of
    ``percentile`` itself, so that its arithmetic is written once."""
    r = _Reads(n)
    for q in _QS:
        percentile(r, q)  # type: ignore[arg-type]
    return sorted(r.read)


def select(values: array, positions: list[int]) -> dict[int, float] | None:
    """The values at ``positions`` (ascending) of ``sorted(values)``, an ``array('f')``, exactly as ``ordered``
    gives them; None where this way cannot vouch for them (a negative value, a sample far off): then ``ordered``.

    Only a few order statistics are needed (the percentiles' and the max), so instead of counting or ordering a
    million values: a sorted sample (about ``_SAMPLE`` values, evenly spaced) says about where each position's
    value lies; one pass over the values counts, exactly, those below a window of values around each estimate
    and marks those inside (a few percent of all), and only these are sorted. A position that its window turns
    out not to hold gives None. The pass compares thousands of values at a time, as one big int: the bits of a
    float32 that is not negative, read as an unsigned int, order as the float does; with its sign bit (clear)
    set as a guard, a value's 32-bit field minus ``t`` keeps the guard exactly where the value's bits are at
    least ``t``, and no borrow crosses into the next field.
    """
    n = len(values)
    if values.typecode != "f" or values.itemsize != 4 or sys.byteorder != "little":
        return None
    sample = sorted(values[:: min(32, max(5, n // _SAMPLE))])
    s = len(sample)
    wins: list[list[Any]] = []  # [low value, high value, positions]: disjoint, ascending
    for p in positions:
        q = p / n
        w = int(_SIGMAS * math.sqrt(s * q * (1.0 - q))) + 8
        lo, hi = p * s // n - w, s if p >= _TOP * n else (p + 1) * s // n + w
        low = sample[lo] if lo > 0 else 0.0
        high = sample[hi] if hi < s else math.inf  # the max's window: up to inf
        if wins and low <= wins[-1][1]:  # windows that overlap, or meet at a value, are one
            wins[-1][1] = max(wins[-1][1], high)
            wins[-1][2].append(p)
        else:
            wins.append([low, high, [p]])
    if not all(w[0] <= w[1] for w in wins) or not all(a[1] < b[0] for a, b in zip(wins, wins[1:])):
        return None  # a NaN in the sample (no log holds one: JSON has none); one in the values fails the checks below
    if sum(bisect_right(sample, hi) - bisect_left(sample, lo) for lo, hi, _ps in wins) * 8 > s:
        return None  # windows of many equal values: counting them (ordered) is quicker than sorting them
    # each window as float32 bits: at least its low value's, below its high value's plus one
    cuts = [(_unpack_u32(_pack_f32(lo))[0], _unpack_u32(_pack_f32(hi))[0] + 1) for lo, hi, _ps in wins]
    below = [0] * len(wins)  # values below each window
    marks: list[bytes] = []  # a byte per value: 0x80 inside a window
    data = memoryview(values).cast("B")
    size = 0
    for start in range(0, 4 * n, 4 * _PASS_CHUNK):
        part = data[start : start + 4 * _PASS_CHUNK]
        if len(part) != size:  # the first chunk, and a shorter last one
            size = len(part)
            m = size >> 2
            guard = int.from_bytes(b"\0\0\0\x80" * m, "little")  # the sign bit of each value
            ones = guard >> 31
            ts = [(lo * ones, hi * ones) for lo, hi in cuts]  # each threshold in every field
        x = int.from_bytes(part, "little")
        if x & guard:
            return None  # a negative value (or -0.0): its bits do not order as the floats do
        x |= guard
        inside = 0
        for i, (lo, hi) in enumerate(ts):
            ge = (x - lo) & guard  # the guard bits left: values at least the window's low value
            below[i] += m - ge.bit_count()
            inside ^= ge ^ ((x - hi) & guard)  # at least the low value but not above the high one (disjoint)
        marks.append(inside.to_bytes(size, "little")[3::4])
    # the k-th value inside a window is at k plus the number of values outside before it
    gaps = b"".join(marks).split(b"\x80")
    gaps.pop()
    where = list(map(add, accumulate(map(len, gaps)), count()))
    if not 1 < len(where) <= n // 8:
        return None  # a sample unlike the values (a period of the data that the step meets): counting is quicker
    kept = sorted(itemgetter(*where)(values))
    out: dict[int, float] = {}
    total = 0
    for (lo, hi, ps), b in zip(wins, below):
        first = bisect_left(kept, lo)
        k = bisect_right(kept, hi) - first
        total += k
        for p in ps:
            if not 0 <= p - b < k:
                return None  # the sample was off by more than the margin: the position is outside its window
            out[p] = kept[first + p - b]
    return out if total == len(kept) else None


def _series_stats(values: array) -> Stats | None:
    """Stats of one series; ``None`` when empty."""
    n = len(values)
    if n == 0:
        return None
    total = math.fsum(values)
    # a long series: only the positions that the percentiles and the max read (select), else all in order
    picked = select(values, _positions(n)) if n >= _COUNT_MIN and isinstance(values, array) else None
    s = ordered(values) if picked is None else _Picked(picked, n)
    p50, p90, p99 = (percentile(s, q) for q in _QS)  # type: ignore[arg-type]
    return Stats(n=n, mean=total / n, p50=p50, p90=p90, p99=p99, max=float(s[n - 1]),  # type: ignore[arg-type]
                 total=total)


def finish_group(g: Acc, key: tuple[tuple[str, Any], ...], run: str | None) -> GroupStats:
    cycle = _series_stats(g.cyc)
    assert cycle is not None
    g.cyc = array("f")
    g.cyc_app = None
    cyc_total = cycle.total
    host_cycle = _series_stats(g.hcyc)
    g.hcyc = array("f")
    g.hcyc_app = None
    phases: list[PhaseStats] = []
    for name in phase_order(set(g.ph) | set(g.hph)):
        app = g.ph.pop(name, None)
        st = _series_stats(app.__self__) if app is not None else None
        del app
        happ = g.hph.pop(name, None)
        hst = _series_stats(happ.__self__) if happ is not None else None
        del happ
        if st is None:
            continue  # a host time without a GPU time: not a phase of this group
        share = st.total / cyc_total if cyc_total else 0.0
        hshare = None
        if hst is not None and host_cycle is not None:
            hshare = hst.total / host_cycle.total if host_cycle.total else 0.0
        phases.append(PhaseStats(name=name, stats=st, share=share, host=hst, host_share=hshare))

    between: BetweenStats | None = None
    bst = _series_stats(g.btw)
    g.btw = array("f")
    g.btw_app = None
    if bst is not None:
        between = BetweenStats(n=bst.n, mean=bst.mean, p50=bst.p50, p90=bst.p90, total=bst.total)

    # No record with accepted (and bs) leaves these sums at 0: the values are then null; so does a quotient too large
    # for a float (a few tokens over cycles of a denormal number of ms: every value is bounded, not their ratios).
    # The data-parallel groups serve different requests: the server's tok/s is the sum of theirs, each a ratio over
    # its own TP ranks' records; one DP group (pure TP, or no "dp" in the records) gives its ratio unchanged.
    parts: list[Any] = [g, *g.others.values()]
    acc_ab = sum(p.acc_ab for p in parts)
    bs_ab = sum(p.bs_ab for p in parts)
    accept_len = _finite(acc_ab / bs_ab) if bs_ab > 0 else None
    rates = [p.acc / p.cyc_acc * 1000.0 for p in parts if p.cyc_acc > 0]
    tokens_per_s = _finite(math.fsum(rates)) if rates else None
    # What a client sees follows the cadence of cycle starts on the host: each cycle's host-clock time plus the gap
    # before it. Under the overlap scheduler the GPU's cycle (cycle_ms of the events timer) overlaps the
    # scheduler's work between cycles, so cycle_ms + between would count that time twice.
    walls = [p.acc / (p.wcyc_acc + p.btw_acc) * 1000.0 for p in parts if p.cyc_acc > 0 and p.wcyc_acc + p.btw_acc > 0]
    wall = _finite(math.fsum(walls)) if walls else None
    wall_den = math.fsum(p.wcyc_acc + p.btw_acc for p in parts) if len(parts) > 1 else g.wcyc_acc + g.btw_acc
    n_acc = len(g.walls)
    cadence = wall_den / n_acc if n_acc and wall_den > 0 else None
    windows = _window_rates(g.accs, g.walls)
    g.accs = array("f")
    g.walls = array("f")
    # each DP group's acceptance read from one of its TP ranks (_one_rank), the DP groups' added
    counts: dict[int, int] = {}
    for p in parts:
        for t, n in _one_rank(p.hists)[1].items():
            counts[t] = counts.get(t, 0) + n
    hist = tuple(sorted(counts.items()))
    acceptance = Acceptance(samples=sum(n for _t, n in hist), hist=hist) if hist else None
    tp = max(1, *(len(p.ranks) for p in parts))
    return GroupStats(
        mode=g.mode,
        key=key,
        n=cycle.n + g.untimed,  # cycles: a record of "every": N stands for N
        records=cycle.n if g.untimed else None,
        cycle=cycle,
        phases=tuple(phases),
        accept_len=accept_len,
        tokens_per_s=tokens_per_s,
        between=between,
        wall_tokens_per_s=wall,
        tokens=g.acc,
        host_cycle=host_cycle,
        run=run,
        acceptance=acceptance,
        cadence_ms=cadence,
        accepted_cycles=n_acc,
        window_tokens_per_s=windows,
        spec=g.spec,
        ranks=max(1, sum(len(p.ranks) for p in parts)),
        tp=tp,
        dp=len(parts),
    )


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


_WINDOWS = 10  # windows of a group's records for the spread of its tok/s
_WINDOW_MIN = 50  # records a window holds at least


def _window_rates(accs: array, walls: array) -> tuple[float, ...]:
    """Wall tok/s of up to ``_WINDOWS`` successive, equal windows of the records (tokens over their wall time), at
    least ``_WINDOW_MIN`` records each; ``()`` when there are too few records for two windows."""
    n = len(accs)
    w = min(_WINDOWS, n // _WINDOW_MIN)
    if w < 2:
        return ()
    out = []
    for i in range(w):
        lo, hi = i * n // w, (i + 1) * n // w
        den = math.fsum(walls[lo:hi])
        rate = math.fsum(accs[lo:hi]) / den * 1000.0 if den > 0 else math.inf
        if math.isfinite(rate):
            out.append(rate)
    return tuple(out)


def merge_into(a: Acc, b: Acc) -> None:
    """Append ``b``'s series to ``a``'s and add its sums: those of ``a``'s DP group to ``a``'s, another DP group's
    kept apart (``a.others``); ``b`` is left empty. For ``merge_runs`` and the DP groups of one group."""
    a.cyc.extend(b.cyc)
    a.untimed += b.untimed
    b.untimed = 0
    a.btw.extend(b.btw)
    a.hcyc.extend(b.hcyc)
    for mine, theirs in ((a.ph, b.ph), (a.hph, b.hph)):
        for name, app in theirs.items():
            have = mine.get(name)
            if have is None:
                mine[name] = app
            else:
                have.__self__.extend(app.__self__)
        theirs.clear()
    b.cyc = array("f")
    b.btw = array("f")
    b.hcyc = array("f")
    a.accs.extend(b.accs)
    a.walls.extend(b.walls)
    b.accs = array("f")
    b.walls = array("f")
    # the sums of each DP group apart (their tok/s add), those of one DP group together (another run's: a blend)
    for dp, part in [(b.dp, b), *b.others.items()]:
        dst: Any = a if dp == a.dp else a.others.get(dp)
        if dst is None:
            dst = a.others[dp] = DPSums()
        _add_sums(dst, part)
    b.others = {}
    b.hists = {}
    b.ranks = ()


def _add_sums(a: Any, b: Any) -> None:
    """Add the running sums, histograms and ranks of ``b`` (an ``Acc`` or ``DPSums``) to ``a``'s, of the same DP
    group; the histograms rank by rank. Ranks are numbered across a server's nodes (torch.distributed's world), so
    the nodes of one multi-node server (a run each) keep apart ranks of one batch, read once; another launch's
    records (other requests) add to the ranks of the same number."""
    a.acc += b.acc
    a.cyc_acc += b.cyc_acc
    a.btw_acc += b.btw_acc
    a.acc_ab += b.acc_ab
    a.bs_ab += b.bs_ab
    a.wcyc_acc += b.wcyc_acc
    for rank, theirs in b.hists.items():
        mine = a.hists.get(rank)
        if mine is None:
            a.hists[rank] = theirs
        else:
            for t, n in theirs.items():
                mine[t] = mine.get(t, 0) + n
    a.ranks += tuple(r for r in b.ranks if r not in a.ranks)
