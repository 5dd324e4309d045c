"""The batch path's arithmetic (``eaglepatch.report.batch``): what the records of one part (one process, run and
spec) add to each of their groups, computed a column at a time (``plan``: it can refuse the part, and changes
nothing), then added (``apply``: it cannot fail). Each sum is added in record order, starting from the group's
own, as the line loop (``eaglepatch.report.lines``) adds it record by record, so the floats come out the same.
"""

from __future__ import annotations

import struct
import sys
from array import array
from functools import lru_cache, reduce
from itertools import compress
from operator import add, gt, iconcat, itemgetter
from typing import Any

from eaglepatch.report.groups import Acc
from eaglepatch.report.record import MAX_TOKENS, BadLine, hist_counts

_BYTES = [bytes((i,)) for i in range(256)]
_pack = struct.pack


def plan(st: Any, recs: list[Any], hcs: list[Any] | None, prevs: list[float], carry: float,
         names: tuple[str, ...], cap: int = MAX_TOKENS) -> Any:
    """What the records that count (after ``skip``) add to each group: ([(group key, mode, by value, columns)],
    the carry after them), or None when a check refuses them. ``prevs``: the end of the cycle before each; ``cap``:
    the most tokens a request produces in a cycle of the part's spec (``record.accept_cap``)."""
    m = len(recs)
    idle = st.idle
    nidle = -idle
    # the gap before each cycle in ms: 0 for a small negative one, -1 where it is left out (idle, or the
    # records out of order)
    gv = [x * 1000.0 if 0.0 < (x := r.t - p) <= idle else (0.0 if nidle <= x <= 0.0 else -1.0)
          for r, p in zip(recs, prevs)]
    out = gv.count(-1.0)
    cycs = [r.cycle_ms for r in recs]
    wcs = cycs if hcs is None else hcs
    accs = [r.accepted for r in recs]

    # The carry: a record with accepted is charged the wall time of the cycles without it (and their gaps)
    # since the process's previous one; adj holds what each is charged (nothing is charged 0.0 plus).
    adj: dict[int, float] = {}
    pos = 0
    c = carry
    i = _index(accs, None, 0)
    while i >= 0:
        if i > pos:
            adj[pos] = c
            c = 0.0
        x = gv[i]
        if x >= 0.0:
            c += wcs[i] + x
        else:
            c = wcs[i]  # after an idle gap only this cycle itself
        pos = i + 1
        i = _index(accs, None, pos)
    if pos < m:
        adj[pos] = c
        c = 0.0
    wadj = wcs
    if adj:
        wadj = list(wcs)
        for i, x in adj.items():
            wadj[i] = wcs[i] + x
    walls = list(map(add, wadj, gv))
    if out:
        i = gv.index(-1.0)
        while i >= 0:
            walls[i] = wadj[i]
            i = _index(gv, -1.0, i + 1)

    # accept_hist: read where a record has no accepts
    acs = [r.accepts for r in recs]
    pairs: dict[int, list[tuple[int, int]]] = {}
    i = _index(acs, None, 0)
    while i >= 0:
        h = recs[i].accept_hist
        if h is not None:
            try:
                pairs[i] = hist_counts(h, cap, recs[i].bs)
            except BadLine:
                return None
        i = _index(acs, None, i + 1)
    if not fit(recs, acs):
        return None  # an accepts list longer than its record's bs

    # The groups, in the order of their first records.
    bycode = st.bycode
    modes = [r.mode for r in recs]
    if bycode == 1:
        keys: list[Any] = list(zip(modes, [r.bs for r in recs]))
    else:
        keys = modes
        kv = None if bycode == 0 else recs[0].rank if bycode == 2 else recs[0].host
    cols = (recs, cycs, hcs, gv, out, accs, wadj, walls, acs, pairs, names)
    if keys.count(keys[0]) == m:
        found: Any = (keys[0],)
        idxs: list[Any] = [None]
    else:
        found = dict.fromkeys(keys)
        idxs = _split(keys, found, m)
    plans = []
    for gk, idx in zip(found, idxs):
        if bycode == 0:
            key, mode = gk, gk
        elif bycode == 1:
            key, mode, kv = gk, gk[0], gk[1]
        else:
            key, mode = (gk, kv), gk
        columns = _columns(idx, *cols)
        hist = columns[5]
        if cap < MAX_TOKENS and hist and max(hist) > cap:
            return None  # a request that produced more tokens than the spec's draft tokens + 1 (accepts)
        plans.append((key, mode, kv, columns))
    return plans, c


def fit(recs: list[Any], acs: list[Any]) -> bool:
    """Whether no record's ``accepts`` list (``acs``, None where it has none) is longer than its ``bs`` (where that
    is a number): a C loop at a time, the common case (a count per request of the batch) a comparison of lists."""
    lists = list(filter(None, acs))
    if not lists:
        return True
    bss = list(compress([r.bs for r in recs], acs))  # the bs of each record with a non-empty list
    lens = list(map(len, lists))
    if lens == bss:
        return True
    try:
        return not any(map(gt, lens, bss))
    except TypeError:  # a bs that is null
        return all(b is None or n <= b for n, b in zip(lens, bss))


def _index(seq: list[Any], value: Any, start: int) -> int:
    try:
        return seq.index(value, start)
    except ValueError:
        return -1


def _split(keys: list[Any], found: dict[Any, None], m: int) -> list[list[int]]:
    """The indexes of each found key's records: for two keys, one of them rare (prefill among decode cycles), the
    rare one's found by ``list.index`` and the other's by a mask; else by one pass over them all."""
    counts = {k: keys.count(k) for k in found} if len(found) == 2 else {}
    if not counts or min(counts.values()) * 16 > m:
        idx: dict[Any, list[int]] = {k: [] for k in found}
        for i, k in enumerate(keys):
            idx[k].append(i)
        return list(idx.values())
    most = max(counts, key=counts.__getitem__)
    mask = bytearray(b"\x01") * m
    out: dict[Any, list[int]] = {}
    for k in found:
        if k is most:
            continue
        found_at = out[k] = []
        i = keys.index(k)
        while i >= 0:
            found_at.append(i)
            mask[i] = 0
            i = _index(keys, k, i + 1)
    out[most] = list(compress(range(m), mask))
    return [out[k] for k in found]


@lru_cache(maxsize=None)
def _phase_getter(k: int) -> Any:
    """A function from phase structs to one list per field (``p0``...), its values in order (None: absent).
    Written out as list comprehensions (``exec``): twice as quick as ``map(attrgetter(...))``."""
    ns: dict[str, Any] = {}
    exec("def columns(objs):\n    return (" + "".join(f"[o.p{i} for o in objs], " for i in range(k)) + ")\n", ns)
    return ns["columns"]


def _f32(values: Any) -> bytes:
    """The values as 32-bit floats (the bytes of ``array("f", values)``): ``struct`` converts them three times
    quicker than ``array``, with the same rounding, but refuses what ``array`` makes infinite."""
    try:
        return _pack(f"{len(values)}f", *values)
    except OverflowError:
        return array("f", values).tobytes()


def _phase_columns(objs: Any, names: tuple[str, ...]) -> list[tuple[str, bytes]]:
    """(name, times as ``_f32`` bytes) of each phase that the phase structs ``objs`` hold, their times in order."""
    out = []
    for name, col in zip(names, _phase_getter(len(names))(objs)):
        if col[0] is None and col.count(None) == len(col):
            continue  # no record has this phase
        try:
            times = _f32(col)
        except struct.error:  # a record without this phase (None)
            col = [x for x in col if x is not None]
            if not col:
                continue
            times = _f32(col)
        out.append((name, times))
    return out


def _columns(idx: list[int] | None, recs: list[Any], cycs: list[Any], hcs: list[Any] | None, gv: list[float],
             out: int, accs: list[Any], wadj: list[Any], walls: list[Any], acs: list[Any],
             pairs: dict[int, list[tuple[int, int]]], names: tuple[str, ...]) -> Any:
    """What the records ``idx`` (all when ``None``) add to their group (the arguments of ``_apply``)."""
    if idx is None:
        grecs, gcyc, ggv, gaccs, gwadj, gwalls, gacs = recs, cycs, gv, accs, wadj, walls, acs
        ghcs = hcs
    elif len(idx) > 1:
        take = itemgetter(*idx)
        grecs, gcyc, ggv, gaccs, gwadj, gwalls, gacs = (take(recs), take(cycs), take(gv), take(accs), take(wadj),
                                                        take(walls), take(acs))
        ghcs = None if hcs is None else take(hcs)
    else:
        i = idx[0]
        grecs, gcyc, ggv, gaccs, gwadj, gwalls, gacs = (recs[i],), (cycs[i],), (gv[i],), (accs[i],), (wadj[i],), \
            (walls[i],), (acs[i],)
        ghcs = None if hcs is None else (hcs[i],)
    phases = _phase_columns([r.phases for r in grecs], names)
    host = None
    if ghcs is not None:
        hps = [r.host_phases for r in grecs]
        host = (ghcs, _phase_columns([p for p in hps if p is not None], names) if hps.count(None) < len(hps)
                else [])
    btw = [x for x in ggv if x >= 0.0] if out and ggv.count(-1.0) else ggv

    acc = None
    nnone = gaccs.count(None)
    if nnone < len(gaccs):
        if nnone:  # the records with accepted
            sel = [a is not None for a in gaccs]
            arecs = list(compress(grecs, sel))
            agv = list(compress(ggv, sel))
            acc = (list(compress(gaccs, sel)), list(compress(gcyc, sel)), list(compress(gwadj, sel)),
                   [x for x in agv if x >= 0.0], list(compress(gwalls, sel)))
        else:
            arecs = grecs
            acc = (gaccs, gcyc, gwadj, btw, gwalls)
        bss = [r.bs for r in arecs]
        if bss.count(None):
            ab = [(a, b) for a, b in zip(acc[0], bss) if b is not None]
            acc += ([a for a, _b in ab], [b for _a, b in ab])
        else:
            acc += (acc[0], bss)

    # the acceptance profile: each request's tokens (accepts), or a histogram (accept_hist)
    hist: dict[int, int] = {}
    flat = reduce(iconcat, filter(None, gacs), [])
    if flat:
        try:
            b = bytes(flat)  # the counts below 256, one byte each
        except ValueError:
            for x in flat:
                hist[x] = hist.get(x, 0) + 1
        else:
            left = len(b)
            for x in range(256):
                c = b.count(_BYTES[x])
                if c:
                    hist[x] = c
                    left -= c
                    if not left:
                        break
    if pairs:
        for i in (range(len(recs)) if idx is None else idx):
            for t, c in pairs.get(i, ()):
                hist[t] = hist.get(t, 0) + c
    return gcyc, phases, host, btw, acc, hist


def _app(pm: dict[str, Any], name: str) -> array:
    app = pm.get(name)
    if app is None:
        app = pm[name] = array("f").append
    return app.__self__


# ``sum`` of floats adds them one at a time, in order, up to Python 3.11 (and is quicker than ``reduce``); from
# 3.12 on it compensates the rounding, and would not give the line loop's sums.
_seq_sum: Any = sum if sys.version_info < (3, 12) else (lambda values, start: reduce(add, values, start))


def _sum(values: Any, start: Any) -> Any:
    """``start`` plus the values one at a time, in order (``sum`` where that is exact: whole numbers)."""
    s = sum(values, start)
    return s if type(s) is int else _seq_sum(values, start)


def apply(g: Acc, cyc: Any, phases: Any, host: Any, btw: Any, acc: Any, hist: dict[int, int], rank: Any) -> None:
    """Add a plan's columns (``_columns``) to the group ``g``, as the line loop adds them record by record; the
    acceptance counts to rank ``rank``'s histogram (``groups._one_rank``)."""
    g.cyc.frombytes(_f32(cyc))
    for name, times in phases:
        _app(g.ph, name).frombytes(times)
    if host is not None:
        hcyc, hphases = host
        g.hcyc.frombytes(_f32(hcyc))
        for name, times in hphases:
            _app(g.hph, name).frombytes(times)
    if btw:
        g.btw.frombytes(_f32(btw))
    if acc is not None:
        accs, cycs, wadj, gaps, walls, accab, bsab = acc
        g.acc = _sum(accs, g.acc)
        g.cyc_acc = _seq_sum(cycs, g.cyc_acc)
        g.wcyc_acc = _seq_sum(wadj, g.wcyc_acc)
        g.btw_acc = _seq_sum(gaps, g.btw_acc)
        g.accs.frombytes(_f32(accs))
        g.walls.frombytes(_f32(walls))
        if accab:
            g.acc_ab = _sum(accab, g.acc_ab)
            g.bs_ab = _sum(bsab, g.bs_ab)
    ah = g.hists.get(rank)
    if ah is None:
        ah = g.hists[rank] = {}
    for x, c in hist.items():
        ah[x] = ah.get(x, 0) + c
