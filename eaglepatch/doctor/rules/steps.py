"""Findings about whether speculation pays, and at which step count: slower than no speculation (measured by a
sweep, else predicted from the timing records), too many or too few draft steps (predicted).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from eaglepatch.doctor.facts import ServerFacts, evidence
from eaglepatch.doctor.finding import Finding
from eaglepatch.doctor.rules.thresholds import ACCEPT_LOW, STEPS_GAIN
from eaglepatch.report.labels import CLIENT, UNSCALED, WALL


def speculation_slower_predicted(f: ServerFacts) -> Finding | None:
    """``speculation-slower`` (predicted): no sweep of this server measured a baseline, but the model of its
    timing records predicts more tok/s without speculation than at every step count 1..max(8, k + 2), by at
    least ``STEPS_GAIN``: high when the two stay apart by more than their uncertainties, else medium."""
    zb = _zero_and_best(f)
    if zb is None:
        return None
    k, pts, here, zero, best = zb
    if zero["tokens_per_s"] < STEPS_GAIN * best["tokens_per_s"]:
        return None
    apart = zero["tokens_per_s"] * (1 - zero.get("spread", 0)) > best["tokens_per_s"] * (1 + best.get("spread", 0))
    ev = _zero_ev(f, pts, k, best)
    nxt = "measure it before relaunching: " + baseline_next(f, [best["steps"], k])
    return Finding("speculation-slower", "high" if apart else "medium",
                   f"predicted: no speculation would be about {(zero['tokens_per_s'] / here['tokens_per_s'] - 1) * 100:.0f}% "
                   f"faster than {k} steps, and faster than any step count", ev, nxt, predicted=True)


def speculation_slower(f: ServerFacts) -> Finding | None:
    """``speculation-slower`` (high): a sweep of this server with ``--baseline`` (kept on this machine, at the load
    this server's records ran: ``collect.sweep_load_mismatch``) measured less client tok/s with this very command
    line than without speculation: the point that ran it has a median below the baseline's. A sweep whose points
    did not run the server's own setting says nothing of it (its other points being slower is no evidence for this
    one): the prediction from the timing records decides then, with the sweep's baseline as its no-speculation
    point, as it does without a sweep (``speculation_slower_predicted``), and so do the batch sizes the records did
    not run (``speculation_slower_by_bs``)."""
    sw = f.sweep or {}
    pts = sw.get("points") or []
    b = _measured_baseline(f)
    cur = sw.get("current")
    if b is None or cur is None or cur == b or pts[cur].get("status") != "ok":
        return speculation_slower_predicted(f) or speculation_slower_by_bs(f)
    base = pts[b]["tokens_per_s"]["median"]
    slow = [cur] if pts[cur]["tokens_per_s"]["median"] < base else []
    if not slow:
        return speculation_slower_by_bs(f)

    def point(i: int) -> dict[str, Any]:
        t = pts[i]["tokens_per_s"]
        return evidence("sweep", f"{pts[i].get('label', '#' + str(i))}: {t['median']:.1f} {CLIENT} (min "
                                 f"{t['min']:.1f}, max {t['max']:.1f}, {pts[i].get('runs')} run(s))"
                        + (f", accept length {pts[i]['accept_len']:.2f}" if pts[i].get("accept_len") else ""),
                        path=sw.get("path"))

    ev = [point(b)] + [point(i) for i in slow]
    best = sw.get("best")
    if best is not None and best != b and pts[best]["tokens_per_s"]["median"] > base:
        nxt = (f"relaunch with the sweep's best point ({pts[best].get('label')}), or run the same sweep again "
               "with --keep-best --fresh")
    else:
        low = [p["accept_len"] for p in pts if p.get("accept_len")]
        why = (" until the accept length is fixed (accept-length-low)" if low and max(low) <= ACCEPT_LOW else
               ": every speculative point measured at this load was slower")
        nxt = f"run the server without speculation (drop the --speculative-* flags){why}"
    return Finding("speculation-slower", "high", "this command line is slower with speculation than without", ev,
                   nxt)


def _ranges(bss: Sequence[int]) -> str:
    """Batch sizes as ranges of the ladder: ``1-8, 32``."""
    return ", ".join(str(b) for b in bss) if len(bss) < 3 else f"{bss[0]}-{bss[-1]}"


def speculation_slower_by_bs(f: ServerFacts) -> Finding | None:
    """``speculation-slower`` (predicted, medium) for a range of batch sizes: the model of the timing records by
    batch size (costs priced by the tokens each forward processes, ``report --predict``'s best step count per
    batch size) finds a batch size from which no step count beats no speculation beyond the spreads
    (``crossover_bs``), with no speculation measured there (a sweep's baseline at that load); an estimate never
    makes this finding (``speculation-unproven``'s). The range it names starts at the first batch size past the
    crossover from which no step count is even predicted ahead: inside the spreads is no evidence for a launch
    without speculation."""
    bb = (f.model or {}).get("by_bs") or {}
    cross = bb.get("crossover_bs")
    rows = bb.get("predict_by_bs") or []
    if cross is None or not rows:
        return None
    # "no step count beats no speculation beyond the spreads" is no finding where a step count is still predicted
    # ahead, inside them (the CPU world's 5-step run, spreads widened by a loaded host: 3 steps +25% at one
    # request, crossover 1): the range starts where no speculation is the best prediction at it and above
    start = None
    for r in reversed(rows):
        if r["bs"] < cross or _spec_ahead(r):
            break
        start = r["bs"]
    if start is None:
        return None
    cross = start
    past = [r for r in rows if r["bs"] >= cross]
    zeros = [next((p for p in r["points"] if p["steps"] == 0), None) for r in past]
    if not past or any(z is None or z["basis"] != "measured" for z in zeros):
        return None
    r = past[0]
    zero = next(p for p in r["points"] if p["steps"] == 0)
    best = max((p for p in r["points"] if p["steps"] > 0), key=lambda p: p["tokens_per_s"])
    # no speculation is a sweep's client figure, put on the records' scale where the sweep ran the records' steps
    scale = CLIENT if any(UNSCALED in n for n in bb.get("predict_by_bs_notes") or ()) else WALL
    ev = [evidence("model", f"at {r['bs']} requests a cycle: no speculation {zero['tokens_per_s']:.0f} {scale} "
                            f"(\u00b1{zero['spread'] * 100:.0f}%, measured), the best step count {best['steps']} "
                            f"{best['tokens_per_s']:.0f} {WALL} (\u00b1{best['spread'] * 100:.0f}%, {best['basis']})")]
    ev += [evidence("model", n) for n in bb.get("predict_by_bs_notes") or ()]
    return Finding("speculation-slower", "medium",
                   f"predicted: from {cross} requests a cycle (up to {bb.get('max_bs')}) no step count beats no "
                   "speculation", ev,
                   # an adaptive config's [0] tier is no way out: sglang's zero-step state is not plain decoding
                   # (docs/real-gpu.md: 3,180 client tok/s against 7,974 without speculation at 64 on the H100)
                   f"from {cross} requests a cycle only a launch without speculation delivers that: where the "
                   "server's batches sit mostly there, relaunch it without the --speculative-* flags; where they "
                   "span both sides, serve the large batches from such a launch (behind a router) and keep "
                   "speculation for the rest. Not an adaptive config's [0] tier: sglang's zero-step state still "
                   "runs the draft extend, under the speculative launch's max_running_requests (on an H100 it "
                   "measured 60% under a launch without speculation)", predicted=True)


def _spec_ahead(row: dict[str, Any]) -> bool:
    """Whether a step count's point prediction is above no speculation's in one row of ``predict_by_bs``."""
    zero = next((p for p in row["points"] if p["steps"] == 0), None)
    return zero is not None and any(p["tokens_per_s"] > zero["tokens_per_s"] for p in row["points"] if p["steps"])


def speculation_unproven(f: ServerFacts) -> Finding | None:
    """``speculation-unproven`` (predicted, medium): no sweep of this server measured a baseline, the model puts
    the best step count above the no-speculation estimate or less than ``STEPS_GAIN`` under it (further under:
    ``speculation-slower``), and the estimate's band reaches it: from these records the tool cannot tell whether
    speculation pays.
    On the H200's GPU-bound testbed the estimate read 14-21% under plain decoding, and at an acceptance of 0.2
    speculation lost by 10% where the estimate had it winning by 9%: only the baseline's launch decides."""
    zb = None if _measured_baseline(f) is not None else _zero_and_best(f)  # measured: speculation-slower's
    if zb is None:
        return None
    k, pts, _, zero, best = zb
    if zero.get("basis") != "estimate" or zero["tokens_per_s"] >= STEPS_GAIN * best["tokens_per_s"]:
        return None  # speculation-slower (predicted)
    if zero["tokens_per_s"] * (1 + zero.get("spread", 0)) < best["tokens_per_s"]:
        return None
    gain = (best["tokens_per_s"] / zero["tokens_per_s"] - 1) * 100
    ev = _zero_ev(f, pts, k, best)
    nxt = "measure the baseline: " + baseline_next(f, [best["steps"], k])
    return Finding("speculation-unproven", "medium",
                   f"predicted: speculation may not pay here: the best step count, {best['steps']}, "
                   f"{gain:+.0f}% against no speculation, whose estimate is uncertain by "
                   f"\u00b1{zero.get('spread', 0) * 100:.0f}%",
                   ev, nxt, predicted=True)


def adaptive(f: ServerFacts) -> bool:
    """Whether the server runs sglang's adaptive speculation (``--speculative-adaptive``): it picks the step
    count itself, among candidates, so a flag for the steps is not what to change."""
    on, _ = f.flag_on("speculative_adaptive")
    return bool(on)


def _model(f: ServerFacts) -> tuple[int, list[dict[str, Any]], dict[str, Any]] | None:
    """``(k, points, the point at k)`` of the prediction from the timing records (``f.model``), when there is
    one with a point at the measured step count."""
    m = f.model or {}
    pts = m.get("predict") or []
    k = m.get("steps")
    here = next((p for p in pts if p.get("steps") == k), None)
    if not pts or here is None or not here.get("tokens_per_s"):
        return None
    return k, pts, here


def _measured_baseline(f: ServerFacts) -> int | None:
    """The index of the baseline point of this server's kept sweep, when it ran at this server's load; else
    None."""
    if f.sweep_other_load:
        return None
    sw = f.sweep or {}
    b = sw.get("baseline")
    pts = sw.get("points") or []
    return b if b is not None and b < len(pts) and pts[b].get("status") == "ok" else None


def _zero_and_best(f: ServerFacts) -> tuple[int, list[dict[str, Any]], dict[str, Any], dict[str, Any],
                                            dict[str, Any]] | None:
    """``(k, points, the point at k, no speculation's point, the best step count's point)`` of the model."""
    m = _model(f)
    if m is None:
        return None
    k, pts, here = m
    zero = next((p for p in pts if p["steps"] == 0), None)
    spec = [p for p in pts if p["steps"] >= 1]
    if zero is None or not spec:
        return None
    return k, pts, here, zero, max(spec, key=lambda p: p["tokens_per_s"])


def _zero_ev(f: ServerFacts, pts: Sequence[dict[str, Any]], k: int, best: dict[str, Any]) -> list[dict[str, Any]]:
    """The model's figures for no speculation, ``k`` and the best step count, and what the estimate rests on."""
    return [_model_ev(f, pts, [0, k, best["steps"]])] + [
        evidence("model", n) for n in (f.model or {}).get("predict_notes") or ()
        if n.startswith(("estimate", "no speculation"))]


def _model_ev(f: ServerFacts, pts: Sequence[dict[str, Any]], shown: Sequence[int]) -> dict[str, Any]:
    """The model's figures for the step counts ``shown``, as evidence."""
    by = {p["steps"]: p for p in pts}
    # a sweep's baseline that could not be put on the records' scale is the client's figure (the notes say so)
    unscaled = any(UNSCALED in n for n in (f.model or {}).get("predict_notes") or ())

    def label(s: int) -> str:
        return CLIENT if s == 0 and unscaled and by[s].get("basis") == "measured" else WALL

    parts = [f"{'no speculation' if s == 0 else f'{s} steps'} {by[s]['tokens_per_s']:.0f} {label(s)} "
             f"(\u00b1{by[s].get('spread', 0) * 100:.0f}%, {by[s]['basis']}, accept length {by[s]['accept_len']:.2f})"
             for s in sorted(set(shown)) if s in by]
    return evidence("model", "predicted from the timing records (report --predict): " + "; ".join(parts))


def baseline_next(f: ServerFacts, grid: Sequence[int]) -> str:
    """The sweep that measures no speculation beside step counts ``grid``: a restart sweep with ``--baseline`` (a
    launch without speculation; a live sweep's steps 0 still runs the draft extend). On an adaptive server the
    step count is the adaptive mode's: the server as launched against the baseline, no steps flag."""
    if adaptive(f):
        return (f"eaglepatch sweep {f.target} --baseline --repeat 3 (the server as launched, adaptive, against a "
                "launch without speculation)")
    g = ",".join(str(n) for n in sorted(set(grid)))
    return (f"eaglepatch sweep {f.target} --baseline --repeat 3 --grid speculative-num-steps={g} (the baseline is a "
            "launch without speculation; a live sweep's steps 0 still runs the draft extend)")


def steps_next(f: ServerFacts, grid: Sequence[int]) -> str:
    """The measurement that confirms a step count: a live sweep of these candidates (one launch at most); on an
    adaptive server, with the adaptive config to deploy."""
    g = ",".join(str(n) for n in sorted(set(grid)))
    if adaptive(f):
        return (f"eaglepatch sweep {f.target} --live --grid speculative-num-steps={g} --emit-adaptive-config "
                "adaptive.json (the adaptive mode picks the steps itself: tune its candidates, then launch with "
                "--speculative-adaptive-config adaptive.json)")
    return (f"confirm it: eaglepatch sweep {f.target} --live --grid speculative-num-steps={g} (one launch), or "
            f"eaglepatch sweep {f.target} --grid speculative-num-steps={g} --baseline --repeat 3")


def _steps_finding(f: ServerFacts, fewer: bool) -> Finding | None:
    m = _model(f)
    topk, _ = f.int_setting("speculative_eagle_topk")
    if m is None or (topk is not None and topk > 1):
        return None
    k, pts, here = m
    if here["accept_len"] <= ACCEPT_LOW:
        return None  # accept-length-low's: nothing a step count fixes
    spec = [p for p in pts if p["steps"] >= 1]
    best = max(spec, key=lambda p: (p["tokens_per_s"], -p["steps"]))
    wanted = best["steps"] < k if fewer else best["steps"] > k
    if not wanted or best["tokens_per_s"] < STEPS_GAIN * here["tokens_per_s"]:
        return None
    gain = best["tokens_per_s"] / here["tokens_per_s"] - 1
    k_ev = f.int_setting("speculative_num_steps")[1]
    ev = [k_ev, _model_ev(f, pts, [0, best["steps"], k, (best["steps"] + k) // 2])]
    ev += [evidence("model", n) for n in (f.model or {}).get("predict_notes") or () if n.startswith(("profile", "extrapolated", "cost"))]
    if fewer:
        title = (f"{k} draft step{'s' if k > 1 else ''} cost{'' if k > 1 else 's'} more than "
                 f"{'they buy' if k > 1 else 'it buys'}: {best['steps']} would be about {gain * 100:.0f}% faster")
    else:
        title = (f"{k} draft step{'s leave' if k > 1 else ' leaves'} accepted tokens unbought: {best['steps']} would "
                 f"be about {gain * 100:.0f}% faster")
    return Finding("too-few-steps" if not fewer else "too-many-steps", "medium", title, ev,
                   steps_next(f, [best["steps"], (best["steps"] + k) // 2, k]), predicted=True)


def too_many_steps(f: ServerFacts) -> Finding | None:
    """``too-many-steps`` (medium, predicted): the model of the timing records (``report --predict``: acceptance
    profile, phase costs, the cadence of cycles) favours fewer draft steps than ``--speculative-num-steps k``, by
    at least ``STEPS_GAIN`` (5%) in tok/s, among 1..max(``STEPS_MAX``, k + 2). Top-k 1 only; left to
    ``accept-length-low`` when the accept length is at most ``ACCEPT_LOW``. The same per range of batch sizes
    (``_by_bs_ranges``): at the records' own batch size, or, when that does not find it, over the batch sizes the
    server can run."""
    return _with_ranges(f, _steps_finding(f, fewer=True), fewer=True)


def too_few_steps(f: ServerFacts) -> Finding | None:
    """``too-few-steps`` (medium, predicted): the same model favours more draft steps than ``k`` by at least
    ``STEPS_GAIN``: the draft's guesses are accepted often enough that longer chains would pay (the points beyond
    ``k`` are extrapolated from the last position's rate, and said so); per range of batch sizes as
    ``too-many-steps``."""
    return _with_ranges(f, _steps_finding(f, fewer=False), fewer=False)


def _by_bs_ranges(f: ServerFacts, fewer: bool) -> tuple[int, list[tuple[int, int, list[int], float]]] | None:
    """``(k, ranges)``: the runs of consecutive batch sizes of the model by batch size (``report --predict``'s
    ``predict_by_bs``: every phase priced by the tokens its forward processes) where a step count fewer (more)
    than the server's ``k`` beats ``k`` by ``STEPS_GAIN`` or more, each ``(first, last, the best step counts
    there, the largest gain)``; batch sizes where no speculation is best are left to ``speculation-slower``.
    None without the model, on an adaptive server (its steps are the controller's) or at top-k above 1."""
    bb = (f.model or {}).get("by_bs") or {}
    k, _ = f.int_setting("speculative_num_steps")
    topk, _ = f.int_setting("speculative_eagle_topk")
    rows = bb.get("predict_by_bs") or []
    if not rows or k is None or adaptive(f) or (topk is not None and topk > 1):
        return None
    ranges: list[tuple[int, int, list[int], float]] = []
    open_ = False
    for r in rows:
        by = {p["steps"]: p for p in r.get("points") or ()}
        here = by.get(k)
        spec = [p for s, p in by.items() if s >= 1 and p.get("tokens_per_s")]
        hit = False
        low = here is not None and (here.get("accept_len") or 2.0) <= ACCEPT_LOW  # accept-length-low's
        if here and here.get("tokens_per_s") and spec and r.get("best") != 0 and not low:
            best = max(spec, key=lambda p: (p["tokens_per_s"], -p["steps"]))
            wanted = best["steps"] < k if fewer else best["steps"] > k
            gain = best["tokens_per_s"] / here["tokens_per_s"] - 1
            hit = wanted and best["tokens_per_s"] >= STEPS_GAIN * here["tokens_per_s"]
            if hit and open_:
                lo, _, steps, g = ranges[-1]
                ranges[-1] = (lo, r["bs"], sorted({*steps, best["steps"]}), max(g, gain))
            elif hit:
                ranges.append((r["bs"], r["bs"], [best["steps"]], gain))
        open_ = hit
    return k, ranges


def _range_text(lo: int, hi: int, steps: Sequence[int], gain: float, k: int) -> str:
    where = f"at {lo} requests a cycle" if lo == hi else f"from {lo} to {hi} requests a cycle"
    counts = " or ".join(str(s) for s in steps)
    return f"{where}, {counts} step{'s' if steps != [1] else ''} up to {gain * 100:.0f}% faster than {k}"


def _with_ranges(f: ServerFacts, found: Finding | None, fewer: bool) -> Finding | None:
    """``found`` (the finding at the records' own batch size) with the ranges of batch sizes that say the same as
    evidence; without it, a finding of its own when a range does (the server's load may not be the records')."""
    got = _by_bs_ranges(f, fewer)
    if got is None or not got[1]:
        return found
    k, ranges = got
    texts = [_range_text(lo, hi, steps, gain, k) for lo, hi, steps, gain in ranges]
    ev = [evidence("model", "by batch size (report --predict, costs priced by the tokens each forward "
                            "processes): " + "; ".join(texts))]
    if found is not None:
        return dataclasses.replace(found, evidence=[*found.evidence, *ev])
    bb = (f.model or {}).get("by_bs") or {}
    ev += [evidence("model", n) for n in bb.get("predict_by_bs_notes") or ()]
    steps = sorted({s for _, _, ss, _ in ranges for s in ss})
    edges = sorted({ranges[0][0], ranges[-1][1]})
    title = (f"predicted: {texts[0]}" + (f" (and {len(texts) - 1} more range{'s' if len(texts) > 2 else ''})"
                                         if len(texts) > 1 else ""))
    g = ",".join(str(n) for n in sorted({*steps, k}))
    nxt = (f"confirm it where it holds: eaglepatch sweep {f.target} --live --grid speculative-num-steps={g} "
           f"--concurrency {','.join(map(str, edges))} --emit-adaptive-config adaptive.json (one launch; the "
           "adaptive config runs each batch size's best)")
    return Finding("too-many-steps" if fewer else "too-few-steps", "medium", title, ev, nxt, predicted=True)
