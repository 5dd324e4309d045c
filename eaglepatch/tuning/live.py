"""The pure parts of ``eaglepatch sweep --live``: the grid (step counts only), the adaptive launch's command line,
the plan of interleaved windows, the request ids that pin a window's step count, a window's figures from its
timing records, and the summary (the ``sweep --json`` object with ``"live": true``, ``"launches"`` and per point
``"windows"`` and the spread over them).

Nothing here touches a host; ``eaglepatch.tuning.drive_live`` carries a live sweep out. How the step count is pinned
inside the server: the runtime's module docstring and docs/design.md ("Live sweeps").
"""

from __future__ import annotations

import hashlib
import json
import random
import statistics
from typing import Any, Iterable, Mapping, Sequence

from eaglepatch.errors import UsageError
from eaglepatch.report.labels import CLIENT
from eaglepatch.tuning import cmdline, sweep_summary
from eaglepatch.tuning import sweep as sw

STEPS_FLAG = "speculative-num-steps"
MAX_STEPS = 64  # what the runtime accepts in a lease (and two digits in a request id)


def live_steps(grid: Sequence[str]) -> tuple[int, ...]:
    """The step counts of ``--grid speculative-num-steps=0,1,3,7`` (in the order given); raises UsageError for any
    other grid: a live sweep moves between sglang's adaptive runtime states, which differ in their steps alone."""
    axes = sw.parse_grid(grid, flags=sw.ANY)
    if len(axes) != 1 or sw.canonical_flag(axes[0].name) != STEPS_FLAG:
        raise UsageError(f"--live sweeps one axis, --grid {STEPS_FLAG}=v1,v2,... (sglang's adaptive runtime states "
                         "differ in their step counts alone): sweep other flags without --live")
    steps = []
    for v in axes[0].values:
        if not v.isdigit() or int(v) > MAX_STEPS:
            raise UsageError(f"--grid {STEPS_FLAG}: {v!r} is not a step count (a whole number, 0 to {MAX_STEPS})")
        steps.append(int(v))
    if len(set(steps)) < 2:
        raise UsageError(f"--live needs two step counts or more to compare (--grid {STEPS_FLAG}=1,3)")
    return tuple(steps)


def points_of(steps: Sequence[int]) -> list[sw.Point]:
    """One sweep point per step count (labels and keys as ``sweep``'s: ``speculative-num-steps=3``)."""
    return [sw.Point(flags=((STEPS_FLAG, str(s)),)) for s in steps]


def live_id(target: str, steps: Sequence[int], rounds: int, window_s: float, load: Mapping[str, Any]) -> str:
    """The identity of a live sweep (its state file): the target, the step counts, the rounds, the window, the
    load (with its concurrency ladder, when there is one). Never equal to a restart sweep's."""
    doc = {"target": target, "live": list(steps), "rounds": rounds, "window": window_s, "load": dict(load)}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def plan_windows(n_points: int, rounds: int, seed: str, n_loads: int = 1) -> list[tuple[int, int, int]]:
    """(round, load index, point index) of every window: each round measures every point once at every
    concurrency of the ladder (``n_loads`` of them; one without a ladder), the (load, point) pairs in an order
    shuffled per round from ``seed`` (the same sweep always has the same order)."""
    if rounds < 1:
        raise UsageError(f"--rounds must be 1 or more, not {rounds}")
    out = []
    for r in range(rounds):
        if n_loads == 1:  # the order before ladders existed: a sweep saved then resumes as planned
            order = list(range(n_points))
            random.Random(f"{seed}:{r}").shuffle(order)
            out += [(r, 0, i) for i in order]
            continue
        pairs = [(j, i) for j in range(n_loads) for i in range(n_points)]
        random.Random(f"{seed}:{r}").shuffle(pairs)
        out += [(r, j, i) for j, i in pairs]
    return out


def window_number(rnd: int, load: int, point: int, n_loads: int, n_points: int) -> int:
    """A window's number (its request ids and its prompts' offset): unique over the sweep's windows, and, without
    a ladder, what it was before ladders existed (round x points + point)."""
    return (rnd * n_loads + load) * n_points + point


def live_argv(argv: Sequence[str], args_index: int, steps: Sequence[int], config_path: str,
              flags: Any = sw.HAND) -> list[str]:
    """The original launch with adaptive speculation on: ``--speculative-adaptive``, ``--speculative-adaptive-config
    config_path`` (every candidate in one tier), the largest step count as ``--speculative-num-steps`` (sglang 0.5.16
    crashes building a state for more steps than the launch's) with its draft tokens (steps + 1), and top-k 1."""
    head, args = list(argv[:args_index]), list(argv[args_index:])
    top = max(steps)
    args = cmdline.set_flag(args, "speculative-adaptive", "on", flags)
    args = cmdline.set_flag(args, "speculative-adaptive-config", config_path, flags)
    args = cmdline.set_flag(args, STEPS_FLAG, str(top), flags)
    args = cmdline.set_flag(args, "speculative-num-draft-tokens", str(top + 1), flags)
    args = cmdline.set_flag(args, "speculative-eagle-topk", "1", flags)
    return head + args


def rid_prefix(token: str, steps: int, window: int) -> str:
    """The request-id prefix of one window: the runtime pins ``steps`` for every batch holding such a request
    (it reads ``eaglepatch-<token>-s<steps>-``); the window number keeps the ids unique."""
    return f"eaglepatch-{token}-s{steps}-w{window}-"


def spec_of(record: Mapping[str, Any]) -> tuple[int | None, bool]:
    """(steps, pinned) of a timing record's ``spec`` ((None, False) without one)."""
    spec = record.get("spec")
    if not isinstance(spec, dict):
        return None, False
    steps = spec.get("steps")
    return (steps if isinstance(steps, int) and not isinstance(steps, bool) else None), spec.get("pinned") is True


def count_cycles(records: Iterable[Mapping[str, Any]], steps: int) -> dict[str, int]:
    """How a window's decode cycles ran: ``pinned`` (at ``steps``, pinned by the sweep) and ``other`` (anything
    else: the policy's choice, another step count, no spec)."""
    out = {"pinned": 0, "other": 0}
    for r in records:
        if r.get("mode") != "decode":
            continue
        s, pinned = spec_of(r)
        out["pinned" if pinned and s == steps else "other"] += 1
    return out


def pinned_group(groups: Sequence[Mapping[str, Any]], steps: int, by_bs: bool = False) -> list[Mapping[str, Any]]:
    """The decode groups of a window's ``report --json`` that hold its pinned cycles: those whose key names the
    pinned spec of ``steps``, or (the spec then did not vary inside the window) those without a spec."""
    want = f"steps={steps},"
    out = []
    for g in groups:
        if g.get("mode") != "decode":
            continue
        spec = (g.get("key") or {}).get("spec")
        if spec is None or (spec.startswith(want) and "pinned=true" in spec):
            out.append(g)
    return out if by_bs else out[-1:]


def window_figures(client: Mapping[str, Any], timings: Mapping[str, Any] | None, cycles: Mapping[str, int] | None,
                   steps: int) -> dict[str, Any]:
    """What the summary needs of one window: the client's tok/s and accept length, and from the timing records
    (when the target is patched) the p50 of its pinned decode cycles' phases, their own accept length
    (``accept_len_log``: accepted tokens per request-cycle, without the prefill token the client's counts) and how
    its cycles ran."""
    fig = sweep_summary.run_figures({"client": client, "timings": None})
    fig["accept_len_log"] = None
    if timings:
        for g in pinned_group(timings.get("groups") or [], steps):
            fig = sweep_summary.run_figures({"client": client, "timings": dict(timings, groups=[g])})
            fig["accept_len_log"] = g.get("accept_len")
    if cycles is not None:
        fig["cycles"] = dict(cycles)
    return fig


def bs_figures(timings: Mapping[str, Any] | None, steps: int, min_cycles: int = 10) -> dict[int, float]:
    """The server's tokens per second of one window's pinned decode cycles per batch size (``report --by bs``:
    wall tokens per second, cycles and the time between them; a batch size with fewer than ``min_cycles`` cycles
    left out)."""
    out: dict[int, float] = {}
    for g in pinned_group((timings or {}).get("groups") or [], steps, by_bs=True):
        bs = (g.get("key") or {}).get("bs")
        tps = g.get("wall_tokens_per_s") or g.get("tokens_per_s")
        if isinstance(bs, int) and tps and g.get("n", 0) >= min_cycles:
            out[bs] = tps
    return out


def bs_predictions(groups: Sequence[Mapping[str, Any]], steps: int, min_cycles: int = 10) -> dict[int, dict[int, list]]:
    """The acceptance model's figures from one window's pinned decode cycles per batch size (``report --by bs
    --predict --json`` groups): ``{bs: {step count: [tokens per second, spread, basis]}}`` for every step count
    above 0 that the prediction holds (0 is left out: the adaptive zero-step state is not the plain decoding that
    the model's no-speculation point estimates). A batch size with fewer than ``min_cycles`` cycles is left out."""
    out: dict[int, dict[int, list]] = {}
    for g in pinned_group(groups, steps, by_bs=True):
        bs = (g.get("key") or {}).get("bs")
        if not isinstance(bs, int) or g.get("n", 0) < min_cycles:
            continue
        figs = {p["steps"]: [p["tokens_per_s"], p["spread"], p["basis"]] for p in g.get("predict") or ()
                if p.get("steps", 0) > 0 and p.get("tokens_per_s")}
        if figs:
            out[bs] = figs
    return out


def summarize(target: str, steps: Sequence[int], runs: Sequence[Mapping[str, Any]], rounds: int, launches: int,
              window_s: float, objective: sweep_summary.Objective = sweep_summary.Objective(),
              ladder: Sequence[int] = ()) -> dict[str, Any]:
    """The ``sweep --live --json`` object: ``sweep``'s summary of the windows (each window a run of its point),
    plus ``live``, ``launches``, ``rounds``, ``window_s``, and per point ``steps``, ``windows`` (how many
    measured it; ``runs`` says the same), ``accept_len_log`` (the median over its windows of the timing log's accept
    length, when patched), ``spread`` ((max - min) / median of its windows' tok/s), ``window_tokens_per_s`` (in the order
    measured) and ``cycles`` (its pinned and other decode cycles, when patched).

    With a ``ladder`` of concurrencies (each window's ``concurrency``), those figures are the ladder's first
    concurrency's, as a restart sweep's are; each point's ``loads`` and ``best_by_load`` hold every concurrency (as
    ``sweep --concurrency`` does), and ``concurrency_ladder`` the ladder."""
    if len(ladder) > 1:
        doc = summarize(target, steps, [r for r in runs if r.get("concurrency") == ladder[0]], rounds, launches,
                        window_s, objective)
        points = points_of(steps)
        by_point: dict[str, list[Mapping[str, Any]]] = {}
        for r in runs:  # each window one run of one load, so that a point's loads spread over its windows
            if r.get("concurrency") in ladder:
                by_point.setdefault(r["point"], []).append({"status": r.get("status"), "loads": [{
                    "concurrency": r["concurrency"], "tokens_per_s": r.get("tokens_per_s"),
                    "accept_len": r.get("accept_len"), "tpot_p50_ms": r.get("tpot_p50_ms"),
                    "tpot_p90_ms": r.get("tpot_p90_ms")}]})
        best = sweep_summary.loads_of(points, by_point, doc["points"], None, objective)
        if best:
            doc["best_by_load"] = best
        doc["concurrency_ladder"] = list(ladder)
        return doc
    points = points_of(steps)
    doc = sweep_summary.summarize(target, points, runs, baseline=False, repeat=rounds, each_a_launch=False,
                                  objective=objective)
    by_point: dict[str, list[Mapping[str, Any]]] = {}
    for r in runs:
        by_point.setdefault(r["point"], []).append(r)
    for p, s, d in zip(points, steps, doc["points"]):
        ok = [r for r in by_point.get(p.key, []) if r.get("status") == "ok" and r.get("tokens_per_s") is not None]
        d["steps"] = s
        d["windows"] = d["runs"]  # (sweep's "runs" stays: here each run is a window)
        tps = [r["tokens_per_s"] for r in sorted(ok, key=lambda r: r.get("t", 0))]
        d["window_tokens_per_s"] = [round(x, 3) for x in tps]
        med = statistics.median(tps) if tps else None
        d["spread"] = round((max(tps) - min(tps)) / med, 4) if med else None
        logged = [r["accept_len_log"] for r in ok if isinstance(r.get("accept_len_log"), (int, float))]
        d["accept_len_log"] = round(statistics.median(logged), 4) if logged else None
        counted = [r["cycles"] for r in ok if isinstance(r.get("cycles"), dict)]
        if counted:
            d["cycles"] = {k: sum(c.get(k, 0) for c in counted) for k in ("pinned", "other")}
    notes = []
    for n in doc["notes"]:
        if n.startswith("one launch per point"):
            continue
        if "measured under" in n:  # sweep's words for its runs: here they are windows, set by --window
            n = n.replace(" run(s) ", " window(s) ").replace("raise --requests or --max-new-tokens",
                                                               "raise --window")
        notes.append(n)
    oks = [d for d in doc["points"] if d["status"] == "ok"]
    if rounds < 2 and len(oks) > 1:
        notes.append("one window per point: a server's speed drifts within a run too; use --rounds 3 or more")
    if 0 in steps:
        notes.append("steps 0 is sglang's adaptive zero-step state, not plain decoding: it still runs the draft "
                     "extend and keeps the speculative launch's batch limit (on an H100 at 64 requests at a time it "
                     f"ran 3,180 {CLIENT} where a launch without speculation ran 7,974): whether to speculate at all, "
                     "only a restart sweep with --baseline measures")
    other = sum((d.get("cycles") or {}).get("other", 0) for d in oks)
    if other:
        notes.append(f"{other} decode cycle(s) inside the windows did not run at their window's pinned step count "
                     "(other traffic on the server, or a lease that ran out): their phases are left out")
    doc.update(live=True, launches=launches, rounds=rounds, window_s=window_s, notes=notes)
    doc.pop("repeat", None)
    return doc
