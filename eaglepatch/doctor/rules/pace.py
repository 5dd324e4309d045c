"""Findings about where decode time goes: batches run without CUDA graphs, a host that sets the pace, one rank
slower than the others, a slow path for TP's all-reduce.
"""

from __future__ import annotations

from typing import Any, Mapping

from eaglepatch.doctor.facts import ServerFacts, evidence
from eaglepatch.doctor.finding import Finding, records_ev
from eaglepatch.doctor.rules.steps import adaptive, steps_next
from eaglepatch.doctor.rules.thresholds import (
    BETWEEN_SHARE,
    GRAPH_OFF_HIGH_SHARE,
    HOST_GPU_RATIO,
    RANK_SKEW,
    VERIFY_SHARE,
)


def _p50(stats: Any) -> float | None:
    v = stats.get("p50") if isinstance(stats, Mapping) else None
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _phase_p50(group: Mapping[str, Any] | None, name: str) -> float | None:
    return _p50(((group or {}).get("phases") or {}).get(name))


def _ms(x: float) -> str:
    return f"{x:.2f} ms"



def cuda_graph_off(f: ServerFacts) -> Finding | None:
    """``cuda-graph-off`` (high, or medium): decode steps run without CUDA graphs, so every draft step pays its
    kernel launches on the host. Any of: ``--disable-cuda-graph`` (or ``--disable-decode-cuda-graph``) is set
    (high); the log's ``Decode batch`` lines say ``cuda graph: False`` (high when at least
    ``GRAPH_OFF_HIGH_SHARE`` (half) of the current launch's decode lines do, else medium; prefill lines do not
    count); decode batches larger than the largest batch captured in a graph (``--cuda-graph-max-bs`` as sglang
    resolved it, or the log's capture lines): in the timing records or in the log's ``#running-req`` (medium)."""
    ev: list[dict[str, Any]] = []
    sev = None
    nxt = ""
    for key, flag in (("disable_cuda_graph", "disable-cuda-graph"),
                      ("disable_decode_cuda_graph", "disable-decode-cuda-graph")):
        on, on_ev = f.flag_on(key, flag)
        if on:
            ev.append(on_ev)
            sev = "high"
            nxt = f"relaunch without --{flag}"
    lines = [d for d in (f.log.decode if f.log else ()) if d.graph is not None]
    off = [d for d in lines if d.graph is False]
    max_bs, mb_ev = f.max_bs()
    if off:
        share = len(off) / len(lines)
        ev.append(evidence("server-log", f"{len(off)} of {len(lines)} decode batch line(s) ran without CUDA graphs; "
                                         "the last:", line=off[-1].line))
        if sev is None:
            sev = "high" if share >= GRAPH_OFF_HIGH_SHARE else "medium"
    largest = None
    over_log = [d for d in lines if max_bs is not None and d.running is not None and d.running > max_bs]
    if over_log:
        largest = max(d.running for d in over_log)
        ev.append(evidence("server-log", f"{len(over_log)} decode batch line(s) with more running requests than "
                                         f"the largest captured batch ({max_bs}); the largest: {largest}",
                           line=max(over_log, key=lambda d: d.running).line))
    over_rec = []
    for g in f.by_bs:
        bs = (g.get("key") or {}).get("bs")
        if max_bs is not None and isinstance(bs, int) and bs > max_bs:
            over_rec.append((bs, g.get("n") or 0))
    if over_rec:
        largest = max([largest or 0] + [bs for bs, _ in over_rec])
        ev.append(records_ev(f, f"{sum(n for _, n in over_rec)} decode cycle(s) at batch sizes "
                                 f"{', '.join(str(bs) for bs, _ in sorted(over_rec))} > {max_bs}"))
    if (over_log or over_rec) and sev is None:
        sev = "medium"
    if sev is None:
        return None
    if mb_ev is not None and (off or over_log or over_rec):
        ev.append(mb_ev)
    if not nxt:
        want = largest or max((d.running or 0) for d in (off or lines)) or None
        if want and max_bs is not None and want > max_bs:
            nxt = (f"relaunch with --cuda-graph-max-bs {want} (or more: the largest batch seen), or measure it: "
                   f"eaglepatch sweep {f.target} --grid cuda-graph-max-bs={max_bs},{want} --repeat 3")
        else:
            nxt = ("find why sglang ran these batches without CUDA graphs (the capture lines at the start of its "
                   "log), and raise --cuda-graph-max-bs above the largest batch")
    return Finding("cuda-graph-off", sev, "decode batches run without CUDA graphs", ev, nxt)


def host_bound(f: ServerFacts) -> Finding | None:
    """``host-bound`` (medium): the host, not the GPU, sets the pace of decode. Either the scheduler's own work
    between cycles (``between_ms`` p50) is at least ``BETWEEN_SHARE`` (0.4) of the decode cycle's p50, or, with the
    events timer, the cycle's host-clock time is at least ``HOST_GPU_RATIO`` (0.9) of its GPU time (the GPU waits
    for launches). With the events timer the time between cycles counts without the GPU's time beyond the host's
    (``cycle - host cycle``): under the overlap scheduler the host waits that out between cycles (on the H200's
    GPU-bound testbed: GPU 6.7 ms, host 2.7 ms, 4 ms between, all of it the wait). Needs timing records of decode
    cycles."""
    d = f.decode or {}
    cyc = _p50(d.get("cycle_ms"))
    if not cyc:
        return None
    between = _p50(d.get("between_ms"))
    host = _p50(d.get("host_cycle_ms"))
    wait = max(0.0, cyc - host) if host is not None else 0.0  # the host waiting out the GPU between cycles
    ev = []
    if between is not None and between - wait >= BETWEEN_SHARE * cyc:
        waited = f" ({_ms(wait)} of it waiting for the GPU beyond the host's {_ms(host)})" if wait else ""
        ev.append(records_ev(f, f"between cycles (the scheduler's own work) p50 {_ms(between)}{waited} against a "
                                 f"decode cycle p50 of {_ms(cyc)} ({(between - wait) / cyc:.0%})"))
    if host is not None and host >= HOST_GPU_RATIO * cyc:
        parts = []
        for name, st in (d.get("phases") or {}).items():
            hp, gp = _p50((st or {}).get("host")), _p50(st)
            if hp is not None and gp is not None:
                parts.append(f"{name} GPU {_ms(gp)} host {_ms(hp)}")
        ev.append(records_ev(f, f"decode cycle p50: GPU {_ms(cyc)}, host {_ms(host)} (host/GPU {host / cyc:.2f}): "
                                 "the GPU waits for the host's launches" + (f"; {'; '.join(parts)}" if parts else "")))
    if not ev:
        return None
    dis_overlap, ov_ev = f.flag_on("disable_overlap_schedule")
    graphs_off, g_ev = f.flag_on("disable_cuda_graph")
    steps, _ = f.int_setting("speculative_num_steps")
    if dis_overlap:
        ev.append(ov_ev)
        nxt = "relaunch without --disable-overlap-schedule: the overlap scheduler does its work while the GPU runs"
    elif graphs_off:
        ev.append(g_ev)
        nxt = "relaunch without --disable-cuda-graph (see cuda-graph-off)"
    elif steps and adaptive(f):
        grid = [n for n in sorted({0, 1, 2, steps // 2, steps}) if 0 <= n <= steps]
        nxt = "fewer launches per token: " + steps_next(f, grid)
    elif steps:
        grid = ",".join(str(n) for n in sorted({1, 2, steps // 2, steps}) if 1 <= n <= steps)
        nxt = (f"fewer launches per token: eaglepatch sweep {f.target} --grid speculative-num-steps={grid} --baseline "
               "--repeat 3; beyond that the host's CPU speed (single-thread) sets this server's pace")
    else:
        nxt = "the host's CPU speed (single-thread) sets this server's pace: fewer launches per token help"
    return Finding("host-bound", "medium", "decode waits on the host (the scheduler, kernel launches), not the GPU",
                   ev, nxt)


def _gpu_of_rank(f: ServerFacts, rank: int) -> str:
    """The GPU a TP rank runs on (``base_gpu_id + rank * gpu_id_step`` among ``CUDA_VISIBLE_DEVICES``)."""
    base, _ = f.int_setting("base_gpu_id")
    stepv, _ = f.int_setting("gpu_id_step")
    idx = (base or 0) + rank * (stepv or 1)
    vis = [x.strip() for x in (f.env.get("CUDA_VISIBLE_DEVICES") or "").split(",") if x.strip()]
    return vis[idx] if idx < len(vis) else str(idx)


def rank_skew(f: ServerFacts) -> Finding | None:
    """``rank-skew`` (medium): at TP > 1 one rank's verify is slower than the others': the slowest rank's verify
    p50 is at least ``RANK_SKEW`` (1.15) times the fastest rank's (the cycle p50 when there is no verify phase).
    Every rank waits for the slowest in the collectives, so it sets the cycle. Needs timing records of two or
    more ranks."""
    tp, _ = f.int_setting("tp_size")
    if tp is not None and tp < 2:
        return None
    # Ranks compared with ranks, never spec groups with spec groups: under adaptive speculation each rank's
    # records split by step count, and those differ by design.
    by_spec: dict[Any, list[tuple[int, float, str, Any]]] = {}
    for g in f.by_rank:
        key = g.get("key") or {}
        rank = key.get("rank")
        v = _phase_p50(g, "verify")
        what = "verify"
        if v is None:
            v, what = _p50(g.get("cycle_ms")), "cycle"
        if isinstance(rank, int) and v:
            by_spec.setdefault(key.get("spec"), []).append((rank, v, what, g.get("n")))
    worst = None
    for rows in by_spec.values():
        if len({r[0] for r in rows}) < 2:
            continue
        slow = max(rows, key=lambda r: r[1])
        fast = min(rows, key=lambda r: r[1])
        if worst is None or slow[1] / fast[1] > worst[1][1] / worst[2][1]:
            worst = (rows, slow, fast)
    if worst is None:
        return None
    rows, slow, fast = worst
    if slow[1] < RANK_SKEW * fast[1]:
        return None
    ev = [records_ev(f, f"rank {r} (GPU {_gpu_of_rank(f, r)}): {what} p50 {_ms(v)} over {n} decode cycles")
          for r, v, what, n in sorted(rows)]
    g = _gpu_of_rank(f, slow[0])
    return Finding("rank-skew", "medium",
                   f"rank {slow[0]}'s {slow[2]} is {slow[1] / fast[1]:.2f}x the fastest rank's: it sets every cycle",
                   ev,
                   f"look at GPU {g}: nvidia-smi -q -d PERFORMANCE,CLOCK -i {g} (throttling), nvidia-smi (another "
                   "process on it), nvidia-smi topo -m (its links to the others)")


_NCCL_SLOW = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_NVLS_ENABLE": "0"}


def tp_communication(f: ServerFacts) -> Finding | None:
    """``tp-communication`` (low; medium when the timing records show verify at least ``VERIFY_SHARE`` (half) of
    the decode cycle): at TP > 1 a setting makes the all-reduce inside verify slower than it needs to be:
    ``--disable-custom-all-reduce``, ``NCCL_P2P_DISABLE=1``, ``NCCL_SHM_DISABLE=1`` or ``NCCL_ALGO``/
    ``NCCL_PROTO`` forced in the server's environment, or GPUs of the server linked without NVLink (``nvidia-smi
    topo -m``: PIX, PXB, PHB, NODE, SYS). Needs the TP size and one of those."""
    tp, tp_ev = f.int_setting("tp_size", "tp-size")
    if tp is None or tp < 2:
        return None
    ev = []
    lever = []
    on, car_ev = f.flag_on("disable_custom_all_reduce")
    if on:
        ev.append(car_ev)
        lever.append(f"eaglepatch sweep {f.target} --grid disable-custom-all-reduce=off,on --repeat 3")
    for name, bad in _NCCL_SLOW.items():
        if f.env.get(name) == bad:
            ev.append(evidence("environment", f"{name}={bad}"))
            lever.append(f"eaglepatch sweep {f.target} --env {name}={'0' if bad == '1' else '1'},{bad} --repeat 3")
    for name in ("NCCL_ALGO", "NCCL_PROTO"):
        if f.env.get(name):
            ev.append(evidence("environment", f"{name}={f.env[name]} (forced)"))
    gpus = []
    for r in range(tp):
        try:
            gpus.append(int(_gpu_of_rank(f, r)))
        except ValueError:
            gpus = []
            break
    slow_links = sorted({(min(i, j), max(i, j), f.topo[(i, j)]) for i in gpus for j in gpus
                         if i != j and (i, j) in f.topo and not f.topo[(i, j)].startswith("NV")})
    if slow_links:
        ev.append(evidence("nvidia-smi", "links without NVLink between the server's GPUs: "
                           + ", ".join(f"GPU{i}-GPU{j} {link}" for i, j, link in slow_links)))
    if not ev:
        return None
    d = f.decode or {}
    share = (((d.get("phases") or {}).get("verify") or {}).get("share"))
    sev = "medium" if isinstance(share, (int, float)) and share >= VERIFY_SHARE else "low"
    if isinstance(share, (int, float)):
        ev.append(records_ev(f, f"verify is {share:.0%} of the decode cycle"))
    ev.append(tp_ev)
    nxt = lever[0] if lever else ("place the server on GPUs linked by NVLink (CUDA_VISIBLE_DEVICES), or leave "
                                  "NCCL to choose (unset NCCL_ALGO/NCCL_PROTO)")
    return Finding("tp-communication", sev, f"TP {tp}: the all-reduce in verify runs on a slower path than it could",
                   ev, nxt)
