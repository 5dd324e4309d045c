"""The scan's line-by-line loop (``read_lines``): each line of a timing log decoded by itself (by msgspec, or by
the standard library's scanner where msgspec is not there or refuses the line), validated and added to its group,
the run header lines read. It reads whole files where msgspec is not installed (or ``EAGLEPATCH_JSON_PARSER=json``)
or a trace is written, and otherwise the lines that the batch path (``eaglepatch.report.batch``) leaves to it.
The rules it follows are stated in ``eaglepatch.report.scan``; what a valid record is: ``eaglepatch.report.record``.
"""

from __future__ import annotations

import json
import math
from typing import Any, Iterable

from eaglepatch.report.groups import Acc
from eaglepatch.report.record import (
    MAX_ACCEPTS,
    MAX_COUNT,
    MAX_EVERY,
    MAX_MS,
    MAX_T,
    BadLine,
    accept_cap,
    append_phases_slow,
    check_skipped,
    hist_counts,
    is_num,
    pop_phases,
    reject_constant,
)

NO = object()  # "no current process/run" sentinel; compares unequal to anything a record holds

BAD_ERRORS = (
    ValueError,  # includes json.JSONDecodeError and BadLine
    KeyError,
    TypeError,
    AttributeError,
    StopIteration,  # the C scanner's "nothing parses at this index"
    OverflowError,
    IndexError,
    RecursionError,
)


def header(line: str) -> dict[str, Any] | None:
    """The run header of this line (``{"v": 1, "kind": "run", "run": ID, ...}``), else ``None``."""
    if '"kind"' not in line:
        return None
    try:
        h = json.loads(line, parse_constant=reject_constant)
    except (ValueError, RecursionError):
        return None
    if type(h) is not dict or h.get("kind") != "run" or h.get("v") != 1:
        return None
    rid = h.get("run")
    if type(rid) is not str or not rid:
        return None
    return h


def drops(line: str) -> dict[str, Any] | None:
    """The runtime's drops line (``{"v": 1, "kind": "drops", "pid", "rank", "dropped", "reasons"}``: what it could
    not write, running totals), else ``None``."""
    if '"drops"' not in line:
        return None
    try:
        d = json.loads(line, parse_constant=reject_constant)
    except (ValueError, RecursionError):
        return None
    if (type(d) is not dict or d.get("kind") != "drops" or d.get("v") != 1 or type(d.get("pid")) is not int
            or type(d.get("rank")) is not int or type(d.get("dropped")) is not int
            or not 0 <= d["dropped"] <= 10**12 or type(d.get("reasons")) is not dict):
        return None
    return d


_EVERY_MEAN = 16  # records the moving mean of a process's cycle time follows (per_cycle)


def per_cycle(means: dict[Any, tuple[int, float]], proc: Any, gap_s: float, wc: float, n: int,
              idle: float) -> tuple[float | None, float]:
    """A record that stands for ``n`` > 1 cycles (``"every": n``, apply --every N): the between (ms) and the cycle
    time (ms) each cycle of its stretch is charged, from ``gap_s``, the seconds since the process's previous
    record ended, and ``wc``, this record's own cycle (host clock, ms). The between is None (left out) where the
    gap is idle per cycle (``gap_s / n`` over ``idle``) or not positive (no room for the untimed cycles); the
    cycle is then ``wc`` alone, as after an idle gap at N = 1. ``means``: per process ``proc``, the moving mean of
    its records' cycle times (every mode), updated here.

    The gap holds the ``n - 1`` untimed cycles of the stretch and ``n`` betweens. The untimed cycles are taken at
    the process's recent mean cycle (the records are a sample of every ``n``-th cycle, prefill ones among them):
    this record's own time would put the prefill cycles of the stretch into its between. Per cycle, the wall
    time is (gap + wc) / n, exactly as the stretch took; the between is that less the estimated mean cycle, and
    may come out below 0 where the stretch's cycles ran quicker than the mean: it is not clamped, so that the
    mean between and the wall time stay right (a percentile of these per-cycle figures is of stretch means,
    never of single gaps: docs/contract.md, "The timing log")."""
    k, u = means.get(proc, (0, wc))
    if k < _EVERY_MEAN:
        k += 1
    means[proc] = (k, u + (wc - u) / k)
    if not 0.0 < gap_s <= idle * n:
        return None, wc
    between = (gap_s * 1000.0 - (n - 1) * u) / n
    return between, (gap_s * 1000.0 + wc) / n - between


def read_lines(st: Any, source: Iterable[str]) -> None:
    """The line-by-line loop over ``source``'s lines (text, as a file opened in text mode gives them), for the
    scan's state ``st`` (``eaglepatch.report.scan.Scan``).

    Speed matters here: the C scanner's ``scan_once`` is called directly, the current process's, run's and
    group's running state live in local variables and are written back only when the process, the run (or
    spec) or the group changes (and at the end), and a record is validated before anything is mutated (the
    phase appends, the one step that can fail half-way, are rolled back by the slow path). A record costs two
    dict look-ups for its run (``"run"``, ``"spec"``) and one comparison of each with the previous record's.
    """
    scan = json.JSONDecoder(parse_constant=reject_constant).scan_once
    fast = st.fast
    fast_errors = st.fast_errors
    bycode = st.bycode
    skip = st.skip
    tracer = st.tracer
    records = st.records
    bad = st.bad
    ninf = -math.inf
    max_t = MAX_T
    max_ms = MAX_MS
    max_count = MAX_COUNT
    max_accepts = MAX_ACCEPTS
    max_every = MAX_EVERY
    acap = st.c_acap  # the current spec's accept_cap
    idle = st.idle
    nidle = -idle
    windowed = st.windowed
    lo = st.lo
    hi = st.hi
    bad_errors = BAD_ERRORS
    slow = append_phases_slow
    spec_cache = st.spec_cache
    spec_of = st.spec_of
    runs = st.runs
    new_run = st.new_run
    ctxs = st.ctxs
    only = st.out.only
    file_run = st.file_run
    file_index = st.file_index
    c_host = st.c_host
    c_pid = st.c_pid
    c_rank = st.c_rank
    c_dp = st.c_dp
    c_node = st.c_node
    cnt = st.cnt
    last_end = st.last_end
    carry = st.carry
    c_rraw = st.c_rraw
    c_sraw = st.c_sraw
    R = st.R
    c_rid = st.c_rid
    c_spec = st.c_spec
    groups = st.groups
    cur_gk = st.cur_gk
    g = st.g
    procs = st.procs
    pm: Any = None
    cyc_app: Any = None
    btw_app: Any = None
    ah: Any = None  # the current group's acceptance histogram of the current rank
    s_acc = s_acc_ab = s_bs_ab = 0
    s_cyc_acc = s_btw_acc = 0.0
    if g is not None:
        s_acc = g.acc
        s_acc_ab = g.acc_ab
        s_bs_ab = g.bs_ab
        s_cyc_acc = g.cyc_acc
        s_btw_acc = g.btw_acc
        pm = g.ph
        cyc_app = g.cyc_app
        btw_app = g.btw_app
        ah = g.hists.get(c_rank)
        if ah is None:
            ah = g.hists[c_rank] = {}
    for line in source:
        try:
            d = NO
            if fast is not None:
                try:
                    d = fast(line)
                except fast_errors:
                    d = NO  # refused: the standard parser decides, as it would alone
            if d is NO:
                try:
                    d, end = scan(line, 0)
                except StopIteration:
                    line = line.strip()
                    if not line:
                        continue
                    d, end = scan(line, 0)
                if end != len(line) - 1 and line[end:].strip():
                    raise BadLine("trailing data")
            if d["v"] != 1:
                raise BadLine("unknown version")
            t = d["t"]
            if not 0.0 <= t <= max_t:  # TypeError on a non-number: a bad line
                raise BadLine("bad t")
            if windowed and not lo <= t <= hi:
                if "kind" in d:
                    raise BadLine("a header, or no record")  # the handler below reads headers
                continue
            cyc = d["cycle_ms"]  # KeyError on a run header line: read by the handler below
            phases = d["phases"]
            mode = d["mode"]
            host = d["host"]
            pid = d["pid"]
            rank = d["rank"]
            try:
                acc = d["accepted"]
            except KeyError:
                acc = None
            try:
                bs = d["bs"]
            except KeyError:
                bs = None
            hcyc = d["host_cycle_ms"] if "host_cycle_ms" in d else None
            acs = d.get("accepts")
            ahs = d.get("accept_hist") if acs is None else None
            rraw = d.get("run")
            sraw = d.get("spec")
            ev = d.get("every", NO)  # apply --every N: the cycles this record stands for (NO: itself alone)
            if ev is not NO and (type(ev) is not int or not 0 < ev <= max_every):
                raise BadLine("bad every")
            dp = d.get("dp")  # the data-parallel group (None: not said, one group)
            node = d.get("node")  # the node rank of a multi-node server

            if host != c_host or pid != c_pid or rank != c_rank or dp != c_dp or node != c_node:
                if (type(host) is not str or type(pid) is not int or type(rank) is not int
                        or not 0 <= pid <= max_count or not 0 <= rank <= max_count
                        or not (dp is None or type(dp) is int and 0 <= dp <= max_count)
                        or not (node is None or type(node) is int and 0 <= node <= max_count)):
                    raise BadLine("bad process fields")
                if c_host is not NO:
                    procs[(c_host, c_pid, c_rank)] = (cnt, last_end, carry)
                c_host = host
                c_pid = pid
                c_rank = rank
                c_dp = dp
                c_node = node
                cnt, last_end, carry = procs.get((host, pid, rank), (0, ninf, 0.0))
                c_rraw = NO  # a run's start is looked for where the process changes, too

            # Validates the durations (TypeError on non-numbers) before anything is mutated.
            if not 0.0 <= cyc <= max_ms:
                raise BadLine("bad cycle_ms")
            if hcyc is None:
                e = t + cyc * 0.001
            else:
                if not 0.0 <= hcyc <= max_ms:
                    raise BadLine("bad host_cycle_ms")
                e = t + hcyc * 0.001

            if rraw != c_rraw or sraw != c_sraw:
                # Another run or spec (or file, or process): validate them, find their groups. This record's t
                # and timer count for the run's start and timer (Scan.switch_run, written out here for speed).
                if rraw is None:
                    rid = file_run
                elif type(rraw) is str and rraw:
                    rid = rraw
                else:
                    raise BadLine("bad run")
                if sraw is None:
                    spec = None
                else:
                    try:
                        spec = spec_cache[tuple(sraw.items())]
                    except (KeyError, TypeError, AttributeError):
                        spec = spec_of(sraw)
                acap = accept_cap(sraw)
                R = runs.get(rid) or new_run(rid)
                if file_index not in R.files:
                    R.files += (file_index,)
                if t < R.start:
                    R.start = float(t)
                timer = d.get("timer")
                if type(timer) is str and timer:
                    if timer not in R.timers:
                        R.timers += (timer,)
                groups = ctxs.get((rid, spec))
                if groups is None:
                    if only is not None and rid not in only:
                        groups = st.out.scratch
                    else:
                        groups = ctxs[(rid, spec)] = {}
                c_rid = rid
                c_spec = spec
                c_rraw = rraw
                c_sraw = sraw
                cur_gk = NO

            if cnt < skip:  # skip counts cycles: a record of "every": N stands for N of them
                check_skipped(d, acap)
                if type(mode) is not str:
                    raise BadLine("bad mode")
                cnt += 1 if ev is NO else ev
                last_end = e
                records += 1
                R.skipped += 1
                R.skipped_cycles += 1 if ev is NO else ev
                if tracer is not None and R.traced:
                    tracer.add(d, host, pid, rank, mode, t, True)
                continue

            if bycode == 0:
                gk = mode if c_dp is None else (mode, c_dp)
            elif bycode == 1:
                gk = (mode, bs) if c_dp is None else (mode, bs, c_dp)
            elif bycode == 2:
                gk = (mode, rank) if c_dp is None else (mode, rank, c_dp)
            else:
                gk = (mode, host) if c_dp is None else (mode, host, c_dp)
            if gk != cur_gk:
                try:
                    ng = groups[gk]
                except KeyError:
                    if type(mode) is not str:
                        raise BadLine("bad mode") from None
                    kv = None if bycode == 0 else gk[1]
                    if bycode == 1 and kv is not None and not is_num(kv):
                        raise BadLine("bad bs") from None
                    ng = groups[gk] = Acc(mode, kv, c_rid, c_spec, c_dp, c_node)
                if c_rank not in ng.ranks:
                    ng.ranks += (c_rank,)  # looked up again at every change of process (its run switch resets cur_gk)
                ah = ng.hists.get(c_rank)
                if ah is None:
                    ah = ng.hists[c_rank] = {}
                if g is not None:
                    g.acc = s_acc
                    g.acc_ab = s_acc_ab
                    g.bs_ab = s_bs_ab
                    g.cyc_acc = s_cyc_acc
                    g.btw_acc = s_btw_acc
                g = ng
                cur_gk = gk
                s_acc = g.acc
                s_acc_ab = g.acc_ab
                s_bs_ab = g.bs_ab
                s_cyc_acc = g.cyc_acc
                s_btw_acc = g.btw_acc
                pm = g.ph
                cyc_app = g.cyc_app
                btw_app = g.btw_app

            if bs is not None and not 0 <= bs <= max_count:  # TypeError on a non-number
                raise BadLine("bad bs")
            if acc is not None:
                if not 0 <= acc <= max_count:
                    raise BadLine("bad accepted")
                x_acc = s_acc + acc
                if bs is not None:
                    x_accab = s_acc_ab + acc
                    x_bsab = s_bs_ab + bs
            wc = cyc if hcyc is None else hcyc
            if acs is not None:
                # the common case, validated here without a call (record.check_accepts): a list of whole numbers,
                # at least 0 and at most the spec's accept_cap, no more of them than bs and MAX_ACCEPTS
                if type(acs) is not list or len(acs) > max_accepts or (bs is not None and len(acs) > bs):
                    raise BadLine("bad accepts")
                for x in acs:
                    if type(x) is not int or not 0 <= x <= acap:
                        raise BadLine("bad accepts")
            elif ahs is not None:
                pairs = hist_counts(ahs, acap, bs)

            try:
                for name, ms in phases.items():
                    if 0.0 <= ms <= max_ms:
                        pm[name](ms)
                    else:
                        raise BadLine("bad phase")  # the slow path undoes the appends and says so
            except Exception:
                slow(pm, phases)

            if hcyc is not None:
                hp = d.get("host_phases")
                if hp is not None:
                    hpm = g.hph
                    try:
                        try:
                            for name, ms in hp.items():
                                if 0.0 <= ms <= max_ms:
                                    hpm[name](ms)
                                else:
                                    raise BadLine("bad phase")
                        except Exception:
                            slow(hpm, hp)
                    except BadLine:
                        pop_phases(pm, phases)
                        raise
                g.hcyc_app(hcyc)

            # Nothing below can fail.
            cyc_app(cyc)
            gap = t - last_end
            if ev is NO or ev == 1:
                if nidle <= gap <= idle:
                    gap = gap * 1000.0 if gap > 0.0 else 0.0
                    btw_app(gap)
                else:
                    gap = None
            else:  # a record of ev cycles: this one's share of the stretch before it, per cycle (per_cycle)
                gap, wc = per_cycle(st.every_u, (c_host, c_pid, c_rank), gap, wc, ev, idle)
                if gap is not None:
                    btw_app(gap)
                g.untimed += ev - 1  # the group's n counts cycles
            if acc is not None:
                s_acc = x_acc
                s_cyc_acc += cyc
                # the wall time a client waits for these tokens: this cycle (host clock), the gap before
                # it, and the prefill cycles (and their gaps) since the process's last counted cycle
                wc += carry
                carry = 0.0
                g.wcyc_acc += wc
                if gap is not None:
                    s_btw_acc += gap
                    wc += gap
                g.accs.append(acc)
                g.walls.append(wc)
                if bs is not None:
                    s_acc_ab = x_accab
                    s_bs_ab = x_bsab
            elif gap is not None:
                carry += wc + gap
            else:
                carry = wc  # after an idle gap only this cycle itself
            if acs is not None:
                for x in acs:
                    ah[x] = ah.get(x, 0) + 1
            elif ahs is not None:
                for k, v in pairs:
                    ah[k] = ah.get(k, 0) + v
            cnt += 1 if ev is NO else ev
            last_end = e
            records += 1
            if tracer is not None and R.traced:
                tracer.add(d, host, pid, rank, mode, t, False)
        except bad_errors:
            h = header(line)
            if h is not None:
                st.add_header(h)
            elif (dl := drops(line)) is not None:
                st.out.add_drops(dl)
            else:
                bad += 1
    if g is not None:
        g.acc = s_acc
        g.acc_ab = s_acc_ab
        g.bs_ab = s_bs_ab
        g.cyc_acc = s_cyc_acc
        g.btw_acc = s_btw_acc
    st.records = records
    st.bad = bad
    st.c_host = c_host
    st.c_pid = c_pid
    st.c_rank = c_rank
    st.c_dp = c_dp
    st.c_node = c_node
    st.cnt = cnt
    st.last_end = last_end
    st.carry = carry
    st.c_rraw = c_rraw
    st.c_sraw = c_sraw
    st.c_acap = acap
    st.R = R
    st.c_rid = c_rid
    st.c_spec = c_spec
    st.groups = groups
    st.cur_gk = cur_gk
    st.g = g
