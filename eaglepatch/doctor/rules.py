"""The findings: one small function per finding id, each deciding from ``ServerFacts`` alone.

A rule returns a ``Finding`` (id, severity, title, evidence, the next step as a command) or None. It decides only
from evidence it was given: a fact that was not read (no log, no config, no timing records) makes it say nothing,
never guess. Each rule's docstring states its condition and thresholds (docs/doctor.md lists the same); the
thresholds are the named constants below. ``diagnose`` runs them all and orders the findings by severity (high,
medium, low, info), then by the order of ``RULES``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

from eaglepatch.doctor.facts import ServerFacts, evidence, quote_flag

SEVERITIES = ("high", "medium", "low", "info")

# Thresholds (docs/doctor.md)
ACCEPT_LOW = 1.2            # accept-length-low: every measure of the accept length at most this
GRAPH_OFF_HIGH_SHARE = 0.5  # cuda-graph-off is high when at least this share of decode lines ran without graphs
BETWEEN_SHARE = 0.4         # host-bound: the scheduler's time between cycles at least this share of the cycle
HOST_GPU_RATIO = 0.9        # host-bound: the events timer's host time at least this share of its GPU time
RANK_SKEW = 1.15            # rank-skew: the slowest rank's verify p50 at least this times the fastest one's
STEPS_GAIN = 1.05           # too-many-steps: the favoured step count at least 5% faster per token (modelled)
STEPS_MAX = 8               # too-many-steps: step counts considered: 1 .. max(this, the current + 2)
VERIFY_SHARE = 0.5          # tp-communication is medium (not low) when verify is at least this share of the cycle
SPEC_ALGOS_HIDDEN = ("EAGLE", "EAGLE3", "NEXTN")  # drafts that run on the target's hidden states


@dataclasses.dataclass(frozen=True)
class Finding:
    """One finding of ``doctor --json``: ``{"id", "severity", "title", "evidence": [...], "next"}``."""

    id: str
    severity: str
    title: str
    evidence: tuple[dict[str, Any], ...]
    next: str
    predicted: bool = False  # drawn from the model of the timing records, not measured: "predicted": true

    def __post_init__(self) -> None:
        object.__setattr__(self, "evidence", tuple(e for e in self.evidence if e))

    def to_json(self) -> dict[str, Any]:
        out = {"id": self.id, "severity": self.severity, "title": self.title, "evidence": list(self.evidence),
               "next": self.next}
        if self.predicted:
            out["predicted"] = True
        return out


Rule = Callable[[ServerFacts], "Finding | None"]


def _p50(stats: Any) -> float | None:
    v = stats.get("p50") if isinstance(stats, Mapping) else None
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _phase_p50(group: Mapping[str, Any] | None, name: str) -> float | None:
    return _p50(((group or {}).get("phases") or {}).get(name))


def _ms(x: float) -> str:
    return f"{x:.2f} ms"


def _records_ev(f: ServerFacts, text: str) -> dict[str, Any]:
    return evidence("timing-log", text + (f" ({f.log_dir}, timer {f.timer})" if f.log_dir else ""))


# ----------------------------------------------------------------------------------------------------------------
# The draft and the algorithm


def eagle3_draft_as_eagle(f: ServerFacts) -> Finding | None:
    """``eagle3-draft-as-eagle`` (high): the server runs ``--speculative-algorithm EAGLE`` (or ``NEXTN``, which
    sglang runs as EAGLE) and the draft's config.json names an EAGLE-3 architecture (a name containing ``Eagle3``,
    e.g. ``LlamaForCausalLMEagle3``).
    sglang then feeds the draft the target's last hidden state instead of the three it was trained on, raises no
    error, and the draft's tokens are (almost) never accepted. Needs the draft's config.json."""
    alg, alg_ev = f.algorithm()
    d = f.draft_config
    if alg not in ("EAGLE", "NEXTN") or d is None or d.data is None:
        return None
    archs = [a for a in d.architectures if "eagle3" in a.lower()]
    if not archs:
        return None
    ev = [alg_ev, evidence("config", f"the draft's architectures: {d.architectures} (an EAGLE-3 draft)",
                           path=d.path)]
    ev += [e for _, e in f.accept_lengths()]
    return Finding("eagle3-draft-as-eagle", "high",
                   f"an EAGLE-3 draft ({archs[0]}) runs under --speculative-algorithm {alg}", ev,
                   f"relaunch the server with --speculative-algorithm EAGLE3 instead of {alg} (to measure it first: "
                   f"eaglepatch sweep {f.target} --grid speculative-algorithm=EAGLE3 --baseline --repeat 3)")


def draft_mismatch(f: ServerFacts) -> Finding | None:
    """``draft-mismatch`` (high): for a draft that runs on the target's hidden states (EAGLE, EAGLE3, NEXTN), the
    draft's ``vocab_size`` differs from the target's, or its hidden size (``target_hidden_size`` when its config
    gives one, else ``hidden_size``) differs from the target's ``hidden_size`` (a multimodal config's
    ``text_config`` counts). Needs both config.json files."""
    alg, alg_ev = f.algorithm()
    t, d = f.target_config, f.draft_config
    if alg not in SPEC_ALGOS_HIDDEN or t is None or d is None or t.data is None or d.data is None:
        return None
    ev = []
    what = []
    if t.vocab_size is not None and d.vocab_size is not None and t.vocab_size != d.vocab_size:
        what.append("vocabulary")
        ev.append(evidence("config", f"vocab_size: target {t.vocab_size}, draft {d.vocab_size}", path=d.path))
    d_hidden = d.get("target_hidden_size")
    key = "target_hidden_size"
    if not isinstance(d_hidden, int):
        d_hidden, key = d.hidden_size, "hidden_size"
    if t.hidden_size is not None and isinstance(d_hidden, int) and t.hidden_size != d_hidden:
        what.append("hidden size")
        ev.append(evidence("config", f"hidden size: target hidden_size {t.hidden_size}, draft {key} {d_hidden}",
                           path=d.path))
    if not what:
        return None
    ev.append(evidence("config", f"target: {t.path or t.name}; draft: {d.path or d.name}"))
    ev.append(alg_ev)
    return Finding("draft-mismatch", "high",
                   f"the draft's {' and '.join(what)} do not match the target's", ev,
                   f"use the draft trained for this target ({t.name}): its config.json should say "
                   + ", ".join(x for x in (f"vocab_size {t.vocab_size}" if t.vocab_size else "",
                                           f"hidden_size {t.hidden_size}" if t.hidden_size else "") if x)
                   + "; check --speculative-draft-model-path")


def draft_context_short(f: ServerFacts) -> Finding | None:
    """``draft-context-short`` (medium): the draft's context length (sglang's derivation from its config.json:
    ``max_position_embeddings`` and the like, times a rope-scaling factor) is shorter than the context the server
    accepts (``--context-length`` as resolved, else the target's own context length). sglang refuses that at start
    unless ``SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1``, and then runs the draft past what it was trained on
    (its log says "Overriding the draft model's max_position_embeddings"): prompts longer than the draft's
    context get drafts that are rarely accepted. Needs the draft's config.json and the server's context."""
    alg, _ = f.algorithm()
    d = f.draft_config
    if alg is None or d is None or d.data is None:
        return None
    d_ctx, d_key = d.context_length()
    if d_ctx is None:
        return None
    ctx, ctx_ev = f.int_setting("context_length")
    if ctx is None and f.target_config is not None and f.target_config.data is not None:
        t_ctx, t_key = f.target_config.context_length()
        if t_ctx is not None:
            ctx, ctx_ev = t_ctx, evidence("config", f"the target's context length {t_ctx} ({t_key})",
                                          path=f.target_config.path)
    if ctx is None or d_ctx >= ctx:
        return None
    ev = [evidence("config", f"the draft's context length {d_ctx} ({d_key})", path=d.path), ctx_ev]
    if f.log and f.log.ctx_override_line:
        ev.append(evidence("server-log", "sglang stretched the draft's context", line=f.log.ctx_override_line))
    if f.env.get("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"):
        ev.append(evidence("environment", "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN="
                           + f.env["SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"]
                           + ": sglang's refusal of a longer context was overridden"))
    return Finding("draft-context-short", "medium",
                   f"the draft was trained for {d_ctx} tokens of context, the server takes up to {ctx}",
                   ev,
                   f"relaunch with --context-length {d_ctx} (longer requests are then refused), or use a draft "
                   f"trained for {ctx} tokens")


def accept_length_low(f: ServerFacts) -> Finding | None:
    """``accept-length-low`` (high): speculation is on and every measure of the accept length that was read
    (timing records, the log's ``accept len``, ``/server_info``'s ``avg_spec_accept_length``, the sweep's run of
    this command line) is at most ``ACCEPT_LOW`` (1.2) tokens per verify: each cycle pays for a draft and a
    verify and yields about the one token the target alone would have. Causes doctor names on their own:
    ``eagle3-draft-as-eagle``, ``draft-mismatch``, ``draft-context-short``; otherwise a draft not trained for
    this target, or a release whose acceptance regressed (the evidence names the release)."""
    alg, alg_ev = f.algorithm()
    if alg is None:
        return None
    found = f.accept_lengths()
    if not found or max(a for a, _ in found) > ACCEPT_LOW:
        return None
    best = max(a for a, _ in found)
    ev = [e for _, e in found] + [alg_ev]
    if f.version:
        ev.append(evidence("install", f"sglang {f.version}"))
    causes = [name for name, rule in (("eagle3-draft-as-eagle", eagle3_draft_as_eagle),
                                      ("draft-mismatch", draft_mismatch),
                                      ("draft-context-short", draft_context_short)) if rule(f)]
    steps, _ = f.int_setting("speculative_num_steps")
    if causes:
        nxt = f"fix {', '.join(causes)} first (see that finding), then run eaglepatch doctor {f.target} again"
    else:
        nxt = ("check that the draft was trained for this very target model (same checkpoint and tokenizer) "
               f"and whether the same draft accepts more under another sglang release; meanwhile compare with no "
               f"speculation: eaglepatch sweep {f.target} --grid speculative-num-steps={steps or 1} --baseline "
               "--repeat 3")
    return Finding("accept-length-low", "high",
                   f"accept length {best:.2f}: the draft's tokens are (almost) never accepted",
                   ev, nxt)


# ----------------------------------------------------------------------------------------------------------------
# What speculation costs


def speculation_slower_predicted(f: ServerFacts) -> Finding | None:
    """``speculation-slower`` (predicted): no sweep of this server measured a baseline, but the model of its
    timing records predicts more tok/s without speculation than at every step count 1..max(8, k + 2), by at
    least ``STEPS_GAIN``: high when the two stay apart by more than their uncertainties, else medium."""
    m = _model(f)
    if m is None:
        return None
    k, pts, here = m
    zero = next((p for p in pts if p["steps"] == 0), None)
    spec = [p for p in pts if p["steps"] >= 1]
    if zero is None or not spec:
        return None
    best = max(spec, key=lambda p: p["tokens_per_s"])
    if zero["tokens_per_s"] < STEPS_GAIN * best["tokens_per_s"]:
        return None
    apart = zero["tokens_per_s"] * (1 - zero.get("spread", 0)) > best["tokens_per_s"] * (1 + best.get("spread", 0))
    ev = [_model_ev(f, pts, [0, k, best["steps"]])]
    ev += [evidence("model", n) for n in (f.model or {}).get("predict_notes") or () if n.startswith("estimate")]
    # a live sweep's steps 0 is sglang's zero-step state, which still runs the draft extend: not plain decoding
    nxt = (f"measure it before relaunching: eaglepatch sweep {f.target} --baseline --repeat 3 --grid "
           f"speculative-num-steps={','.join(str(s) for s in sorted({best['steps'], k}))} (the baseline is a launch "
           "without speculation)")
    return Finding("speculation-slower", "high" if apart else "medium",
                   f"predicted: no speculation would be about {(zero['tokens_per_s'] / here['tokens_per_s'] - 1) * 100:.0f}% "
                   f"faster than {k} steps, and faster than any step count", ev, nxt, predicted=True)


def speculation_slower(f: ServerFacts) -> Finding | None:
    """``speculation-slower`` (high): a sweep of this server with ``--baseline`` (kept on this machine) measured
    less client tok/s with speculation than without: the point that ran this very command line has a median
    below the baseline's median, or, when no point ran it, every speculative point that ran has. Needs a sweep
    with ``--baseline`` whose baseline ran; without one, the prediction from the timing records decides
    (``speculation_slower_predicted``)."""
    sw = f.sweep or {}
    pts = sw.get("points") or []
    b = sw.get("baseline")
    if b is None or b >= len(pts) or pts[b].get("status") != "ok":
        return speculation_slower_predicted(f)
    base = pts[b]["tokens_per_s"]["median"]
    spec = [i for i, p in enumerate(pts) if i != b and p.get("status") == "ok"]
    if not spec:
        return None
    cur = sw.get("current")
    if cur is not None and cur in spec:
        slow = [cur] if pts[cur]["tokens_per_s"]["median"] < base else []
    else:
        slow = spec if all(pts[i]["tokens_per_s"]["median"] < base for i in spec) else []
    if not slow:
        return None

    def point(i: int) -> dict[str, Any]:
        t = pts[i]["tokens_per_s"]
        return evidence("sweep", f"{pts[i].get('label', '#' + str(i))}: {t['median']:.1f} tok/s (min {t['min']:.1f}, "
                                 f"max {t['max']:.1f}, {pts[i].get('runs')} run(s))"
                        + (f", accept length {pts[i]['accept_len']:.2f}" if pts[i].get("accept_len") else ""),
                        path=sw.get("path"))

    ev = [point(b)] + [point(i) for i in slow]
    best = sw.get("best")
    if best is not None and best != b and pts[best]["tokens_per_s"]["median"] > base:
        nxt = (f"relaunch with the sweep's best point ({pts[best].get('label')}), or run the same sweep again "
               "with --keep-best --fresh")
    else:
        nxt = ("run the server without speculation (drop the --speculative-* flags) until the accept length is "
               f"fixed: every speculative point measured was slower (eaglepatch doctor {f.target} names causes)")
    title = ("this command line is slower with speculation than without" if cur is not None and cur in slow
             else "every speculative point the sweep ran was slower than no speculation")
    return Finding("speculation-slower", "high", title, ev, nxt)


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
        ev.append(_records_ev(f, f"{sum(n for _, n in over_rec)} decode cycle(s) at batch sizes "
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


def _adaptive(f: ServerFacts) -> bool:
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


def _model_ev(f: ServerFacts, pts: Sequence[dict[str, Any]], shown: Sequence[int]) -> dict[str, Any]:
    """The model's figures for the step counts ``shown``, as evidence."""
    by = {p["steps"]: p for p in pts}
    parts = [f"{'no speculation' if s == 0 else f'{s} steps'} {by[s]['tokens_per_s']:.0f} tok/s "
             f"(\u00b1{by[s].get('spread', 0) * 100:.0f}%, {by[s]['basis']}, accept length {by[s]['accept_len']:.2f})"
             for s in sorted(set(shown)) if s in by]
    return evidence("model", "predicted from the timing records (report --predict): " + "; ".join(parts))


def _steps_next(f: ServerFacts, grid: Sequence[int]) -> str:
    """The measurement that confirms a step count: a live sweep of these candidates (one launch at most); on an
    adaptive server, with the adaptive config to deploy."""
    g = ",".join(str(n) for n in sorted(set(grid)))
    if _adaptive(f):
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
        title = f"{k} draft steps cost more than they buy: {best['steps']} would be about {gain * 100:.0f}% faster"
    else:
        title = f"{k} draft steps leave accepted tokens unbought: {best['steps']} would be about {gain * 100:.0f}% faster"
    return Finding("too-few-steps" if not fewer else "too-many-steps", "medium", title, ev,
                   _steps_next(f, [best["steps"], (best["steps"] + k) // 2, k]), predicted=True)


def too_many_steps(f: ServerFacts) -> Finding | None:
    """``too-many-steps`` (medium, predicted): the model of the timing records (``report --predict``: acceptance
    profile, phase costs, the cadence of cycles) favours fewer draft steps than ``--speculative-num-steps k``, by
    at least ``STEPS_GAIN`` (5%) in tok/s, among 1..max(``STEPS_MAX``, k + 2). Top-k 1 only; left to
    ``accept-length-low`` when the accept length is at most ``ACCEPT_LOW``."""
    return _steps_finding(f, fewer=True)


def too_few_steps(f: ServerFacts) -> Finding | None:
    """``too-few-steps`` (medium, predicted): the same model favours more draft steps than ``k`` by at least
    ``STEPS_GAIN``: the draft's guesses are accepted often enough that longer chains would pay (the points beyond
    ``k`` are extrapolated from the last position's rate, and said so)."""
    return _steps_finding(f, fewer=False)


# ----------------------------------------------------------------------------------------------------------------
# Where the time goes


def host_bound(f: ServerFacts) -> Finding | None:
    """``host-bound`` (medium): the host, not the GPU, sets the pace of decode. Either the scheduler's own work
    between cycles (``between_ms`` p50) is at least ``BETWEEN_SHARE`` (0.4) of the decode cycle's p50, or, with the
    events timer, the cycle's host-clock time is at least ``HOST_GPU_RATIO`` (0.9) of its GPU time (the GPU waits
    for launches). Needs timing records of decode cycles."""
    d = f.decode or {}
    cyc = _p50(d.get("cycle_ms"))
    if not cyc:
        return None
    between = _p50(d.get("between_ms"))
    host = _p50(d.get("host_cycle_ms"))
    ev = []
    if between is not None and between >= BETWEEN_SHARE * cyc:
        ev.append(_records_ev(f, f"between cycles (the scheduler's own work) p50 {_ms(between)} against a decode "
                                 f"cycle p50 of {_ms(cyc)} ({between / cyc:.0%})"))
    if host is not None and host >= HOST_GPU_RATIO * cyc:
        parts = []
        for name, st in (d.get("phases") or {}).items():
            hp, gp = _p50((st or {}).get("host")), _p50(st)
            if hp is not None and gp is not None:
                parts.append(f"{name} GPU {_ms(gp)} host {_ms(hp)}")
        ev.append(_records_ev(f, f"decode cycle p50: GPU {_ms(cyc)}, host {_ms(host)} (host/GPU {host / cyc:.2f}): "
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
    elif steps and _adaptive(f):
        grid = [n for n in sorted({0, 1, 2, steps // 2, steps}) if 0 <= n <= steps]
        nxt = "fewer launches per token: " + _steps_next(f, grid)
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
    ev = [_records_ev(f, f"rank {r} (GPU {_gpu_of_rank(f, r)}): {what} p50 {_ms(v)} over {n} decode cycles")
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
        ev.append(_records_ev(f, f"verify is {share:.0%} of the decode cycle"))
    ev.append(tp_ev)
    nxt = lever[0] if lever else ("place the server on GPUs linked by NVLink (CUDA_VISIBLE_DEVICES), or leave "
                                  "NCCL to choose (unset NCCL_ALGO/NCCL_PROTO)")
    return Finding("tp-communication", sev, f"TP {tp}: the all-reduce in verify runs on a slower path than it could",
                   ev, nxt)


# ----------------------------------------------------------------------------------------------------------------
# The measurement itself


def sync_on_overlap(f: ServerFacts) -> Finding | None:
    """``sync-on-overlap`` (medium): the timing records were written by the ``sync`` timer while the server runs
    the overlap scheduler (``disable_overlap_schedule`` false as sglang resolved it; from the command line alone:
    no ``--disable-overlap-schedule`` and the install has the overlap scheduler's workers). Each synchronize
    stalls the overlap: the measurement itself is the slowdown (23-44% of throughput on an H200), and its phases
    read long. Needs timing records."""
    if not f.timer or "sync" not in f.timer.split("+") or not f.records:
        return None
    alg, _ = f.algorithm()
    if alg is None:
        return None
    v, ov_ev = f.setting("disable_overlap_schedule")
    if v is None:
        if "disable-overlap-schedule" in f.flags or not f.overlap_workers:
            return None
        overlap = True
        ov_ev = evidence("command-line", "no --disable-overlap-schedule, and the install's workers run under the "
                                         "overlap scheduler (EAGLEWorkerV2 & co)")
    else:
        overlap = v is False or (isinstance(v, str) and v.lower() == "false")
    if not overlap:
        return None
    return Finding("sync-on-overlap", "medium", "the sync timer measures an overlap-scheduler server: measuring slows it",
                   [_records_ev(f, f"{f.records} records written by the sync timer"), ov_ev],
                   f"eaglepatch apply {f.target} --mode auto (CUDA events for the overlap scheduler's workers)")


# ----------------------------------------------------------------------------------------------------------------
# What doctor could not see

NEEDS_RECORDS = ("host-bound", "rank-skew", "too-many-steps", "too-few-steps", "sync-on-overlap")


def not_patched(f: ServerFacts) -> Finding | None:
    """``not-patched`` (info): the server runs no timing patch (the install is not patched, or the server started
    before it was: ``stale``), so there are no timing records and the findings that need them (host-bound,
    rank-skew, too-many-steps, sync-on-overlap; cuda-graph-off's batch sizes) could not be looked for."""
    if f.patch not in ("not-patched", "stale"):
        return None
    if f.patch == "stale":
        return Finding("not-patched", "info", "the server started before the install was patched: it runs no timing",
                       [evidence("install", "the worker files are patched; the server started before they changed")],
                       f"eaglepatch restart {f.target}, put load on it (eaglepatch bench {f.target}), then run "
                       f"doctor again for {', '.join(NEEDS_RECORDS)}")
    return Finding("not-patched", "info", "no timing records: the install is not patched",
                   [evidence("install", "no eaglepatch runtime in the install (eaglepatch status shows it)")],
                   f"eaglepatch apply {f.target}, put load on it (eaglepatch bench {f.target}), then run doctor "
                   f"again for {', '.join(NEEDS_RECORDS)}")


def no_timing_records(f: ServerFacts) -> Finding | None:
    """``no-timing-records`` (info): the server runs the patched files, but none of its processes has written a
    timing record yet (no decode since it started), so the findings that need them could not be looked for."""
    if f.patch != "patched" or f.records:
        return None
    return Finding("no-timing-records", "info", "the patched server has timed no cycle yet",
                   [evidence("timing-log", f"no record of the server's processes in {f.log_dir}")],
                   f"put load on it (eaglepatch bench {f.target}), then run doctor again for "
                   f"{', '.join(NEEDS_RECORDS)}")


# The rules in the order their findings are listed within one severity.
RULES: tuple[tuple[str, Rule], ...] = (
    ("eagle3-draft-as-eagle", eagle3_draft_as_eagle),
    ("draft-mismatch", draft_mismatch),
    ("accept-length-low", accept_length_low),
    ("speculation-slower", speculation_slower),
    ("cuda-graph-off", cuda_graph_off),
    ("draft-context-short", draft_context_short),
    ("too-many-steps", too_many_steps),
    ("too-few-steps", too_few_steps),
    ("host-bound", host_bound),
    ("rank-skew", rank_skew),
    ("sync-on-overlap", sync_on_overlap),
    ("tp-communication", tp_communication),
    ("not-patched", not_patched),
    ("no-timing-records", no_timing_records),
)


def diagnose(f: ServerFacts) -> list[Finding]:
    """Every rule's finding for ``f``, ordered by severity (high first), then by ``RULES``."""
    out = []
    for i, (_name, rule) in enumerate(RULES):
        found = rule(f)
        if found is not None:
            out.append((SEVERITIES.index(found.severity), i, found))
    return [x for _, _, x in sorted(out, key=lambda t: (t[0], t[1]))]
