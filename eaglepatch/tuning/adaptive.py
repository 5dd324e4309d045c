"""sglang's adaptive speculative decoding (``--speculative-adaptive``) as a release's own files describe it, and the
configurations eaglepatch writes for it: the launch of a live sweep, and ``--emit-adaptive-config``.

Pure: source text and values in, values out; nothing here reads a file or touches a host.

What sglang does (docs/design.md, "Adaptive speculative decoding, per release", says where each fact comes from):

- A server started with ``--speculative-adaptive`` builds one runtime state (attention backends, CUDA graphs) per
  candidate step count at start-up and switches between them while it runs (``adaptive_runtime_state.py``:
  ``AdaptiveController``; ``eagle_worker_v2.py``: ``EAGLEWorkerV2.apply_runtime_state``). Candidate 0 is speculation
  off (from 0.5.16: the worker's ``speculative_num_steps == 0`` path).
- ``--speculative-adaptive-config FILE`` names the candidates. 0.5.12 reads one flat object
  (``load_adaptive_config``: ``{"candidate_steps": [1, 3, 7], "ema_alpha": ..., ...}``; at least two distinct
  values); from 0.5.16 an object of batch-size tiers (``_load_adaptive_config``: ``{"1": {"candidate_steps": [...],
  ...}, "8": {...}}``: keys of digits, each tier a non-empty list of non-negative ints; a batch goes to the largest
  tier key not above its size, padded to a CUDA-graph batch size), and a state for a step count gets CUDA graphs
  only for the batch sizes whose tier holds it (``cuda_graph_bs_for_step``).
- ``adaptive_unsupported_reason`` turns adaptive mode off (a warning, then static speculation) for algorithms other
  than EAGLE/EAGLE3 (NEXTN is EAGLE by then), a top-k other than 1, DP attention, multi-layer EAGLE, two-batch
  overlap and PD multiplexing.
- From 0.5.16 the launch's ``--speculative-num-steps`` must be a candidate, and the state for a step count above it
  crashes at start-up ("shared logits buffer holds 64 rows but caller needs 128", seen with 0.5.16): eaglepatch
  launches with the largest candidate.
"""

from __future__ import annotations

import ast
import bisect
import dataclasses
import enum
import json
import statistics
from typing import Any, Mapping, Sequence

from eaglepatch.errors import Unsupported, UsageError

PARAMS_PATH = "sglang/srt/speculative/adaptive_spec_params.py"
STATE_PATH = "sglang/srt/speculative/adaptive_runtime_state.py"
WORKER_PATH = "sglang/srt/speculative/eagle_worker_v2.py"
SOURCES = (PARAMS_PATH, STATE_PATH, WORKER_PATH)

# The launch flags of the shapes adaptive_unsupported_reason refuses, by the server_args attribute it reads, and
# why (its own words).
LIMITS = {
    "enable_dp_attention": ("enable-dp-attention",
                            "adaptive tier decisions are not synchronized across DP ranks"),
    "attn_dp_enabled_of": ("enable-dp-attention", "attention DP is not supported"),
    "enable_multi_layer_eagle": ("enable-multi-layer-eagle",
                                 "MultiLayerEagleWorkerV2 does not implement adaptive"),
    "enable_two_batch_overlap": ("enable-two-batch-overlap",
                                 "adaptive state swap would discard the TboAttnBackend wrapper"),
    "enable_pdmux": ("enable-pdmux", "adaptive state swap does not update decode_attn_backend_group"),
}
ALGORITHMS = ("EAGLE", "EAGLE3")
ALIASES = {"NEXTN": "EAGLE"}  # sglang resolves it before it looks at adaptive mode (speculative_hook.py)
# 0.5.12's default candidates when no config file is given (AdaptiveSpeculativeParams: cfg.get(..., [1, 3, 7])).
FLAT_DEFAULT = (1, 3, 7)


class ConfigFormat(str, enum.Enum):
    """What ``--speculative-adaptive-config`` holds in a release."""

    TIERS = "tiers"  # 0.5.16+: {"<batch size>": {"candidate_steps": [...]}, ...}
    FLAT = "flat"  # 0.5.12: {"candidate_steps": [...]}


@dataclasses.dataclass(frozen=True)
class AdaptiveRelease:
    """A release's adaptive mode, as read from its files.

    ``format``: its config file's shape. ``zero_steps``: a candidate of 0 (speculation off) runs.
    ``min_candidates``: how many distinct candidates it needs. ``algorithms``: the algorithms it adapts.
    ``limits``: the attribute names of ``LIMITS`` its ``adaptive_unsupported_reason`` checks (a check a later
    release drops is not refused here). ``default``: its candidates per tier without a config file.
    ``bs_switch``: the worker switches at each decode cycle's start (``activate_step_by_batch``, 0.5.16+), else only
    when the policy's moving average moves (0.5.12).
    """

    version: str | None
    format: ConfigFormat
    zero_steps: bool
    min_candidates: int
    algorithms: tuple[str, ...]
    limits: tuple[str, ...]
    default: Mapping[int, tuple[int, ...]]
    bs_switch: bool

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "format": self.format.value, "zero_steps": self.zero_steps,
                "min_candidates": self.min_candidates, "algorithms": list(self.algorithms),
                "limits": [LIMITS[n][0] for n in self.limits],
                "default": {str(k): list(v) for k, v in self.default.items()}, "bs_switch": self.bs_switch}


def _function(tree: ast.Module, name: str) -> ast.FunctionDef | None:
    return next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _class(tree: ast.Module, name: str) -> ast.ClassDef | None:
    return next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)


def _names_in(node: ast.AST) -> set[str]:
    out: set[str] = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Attribute):
            out.add(n.attr)
        elif isinstance(n, ast.Name):
            out.add(n.id)
    return out


def _algorithms(func: ast.FunctionDef) -> tuple[str, ...]:
    """The string tuple of ``speculative_algorithm not in (...)`` in the function, else ``ALGORITHMS``."""
    for n in ast.walk(func):
        if (isinstance(n, ast.Compare) and isinstance(n.left, ast.Attribute) and n.left.attr == "speculative_algorithm"
                and len(n.ops) == 1 and isinstance(n.ops[0], ast.NotIn) and isinstance(n.comparators[0], ast.Tuple)):
            vals = [e.value for e in n.comparators[0].elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            if vals:
                return tuple(vals)
    return ALGORITHMS


def _default_tiers(tree: ast.Module) -> dict[int, tuple[int, ...]] | None:
    """``DEFAULT_ADAPTIVE_CONFIG``'s candidates per tier (0.5.16+), when it is a literal."""
    for n in tree.body:
        target = n.target if isinstance(n, ast.AnnAssign) else (n.targets[0] if isinstance(n, ast.Assign) else None)
        if isinstance(target, ast.Name) and target.id == "DEFAULT_ADAPTIVE_CONFIG" and n.value is not None:
            try:
                return tiers_of(ast.literal_eval(n.value), ConfigFormat.TIERS)
            except (ValueError, TypeError, UsageError):
                return None
    return None


def read_release(files: Mapping[str, str | None], version: str | None = None) -> AdaptiveRelease | None:
    """The adaptive mode of the release whose ``SOURCES`` texts are ``files`` (a missing one: None); None when the
    release has none (no adaptive_spec_params.py, or its EAGLEWorkerV2 has no apply_runtime_state)."""
    params_src, worker_src = files.get(PARAMS_PATH), files.get(WORKER_PATH)
    if not params_src or not worker_src or not files.get(STATE_PATH):
        return None
    try:
        params, worker = ast.parse(params_src), ast.parse(worker_src)
    except SyntaxError:
        return None
    v2 = _class(worker, "EAGLEWorkerV2")
    methods = {n.name: n for n in (v2.body if v2 else []) if isinstance(n, ast.FunctionDef)}
    if "apply_runtime_state" not in methods:
        return None
    tiers = _function(params, "_load_adaptive_config") is not None
    reason = _function(params, "adaptive_unsupported_reason")
    names = _names_in(reason) if reason else set()
    limits = tuple(n for n in LIMITS if n in names)
    forward = methods.get("forward_batch_generation")
    zero = any(isinstance(n, ast.Compare) and isinstance(n.left, ast.Attribute)
               and n.left.attr == "speculative_num_steps" and isinstance(n.ops[0], ast.Eq)
               and isinstance(n.comparators[0], ast.Constant) and n.comparators[0].value == 0
               for n in ast.walk(worker))
    default = _default_tiers(params) if tiers else None
    return AdaptiveRelease(
        version=version, format=ConfigFormat.TIERS if tiers else ConfigFormat.FLAT, zero_steps=zero,
        min_candidates=1 if tiers else 2, algorithms=_algorithms(reason) if reason else ALGORITHMS, limits=limits,
        default=default if default is not None else {1: FLAT_DEFAULT},
        bs_switch=forward is not None and "activate_step_by_batch" in _names_in(forward))


# ----------------------------------------------------------------------------------------------------------------
# Config files


def tiers_of(doc: Any, fmt: ConfigFormat, initial_steps: int | None = None) -> dict[int, tuple[int, ...]]:
    """The candidates per batch-size tier of a config document, validated as the release's own loader does;
    raises UsageError with sglang's reason. A flat (0.5.12) config is one tier, ``1``; there sglang adds the
    launch's ``initial_steps`` to the candidates."""
    if not isinstance(doc, dict):
        raise UsageError(f"an adaptive config must be a JSON object, not {type(doc).__name__}")
    if fmt is ConfigFormat.FLAT:
        steps = doc.get("candidate_steps", list(FLAT_DEFAULT))
        if not isinstance(steps, list) or not all(isinstance(s, int) and not isinstance(s, bool) for s in steps):
            raise UsageError(f"candidate_steps must be a list of ints, got {steps!r}")
        found = set(steps) | ({initial_steps} if initial_steps is not None else set())
        if len(found) < 2:
            raise UsageError("candidate_steps must have at least 2 distinct values")
        return {1: tuple(sorted(found))}
    out: dict[int, tuple[int, ...]] = {}
    for key, entry in doc.items():
        if not isinstance(key, str) or not key.isdigit():
            continue
        steps = entry.get("candidate_steps") if isinstance(entry, dict) else None
        if (not isinstance(steps, list) or not steps
                or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in steps)):
            raise UsageError(f"BS {key}: candidate_steps must be a list of non-negative ints, got {steps!r}")
        out[int(key)] = tuple(sorted(set(steps)))
    if not out:
        raise UsageError("an adaptive config must hold at least one batch-size tier, e.g. "
                         '{"1": {"candidate_steps": [1, 3, 7]}}')
    return dict(sorted(out.items()))


def tier_for(tiers: Mapping[int, Sequence[int]], bs: int) -> int:
    """The tier key a batch of ``bs`` requests goes to (the largest key not above it; the smallest key below all)."""
    keys = sorted(tiers)
    return keys[max(0, bisect.bisect_right(keys, bs) - 1)]


def config_document(release: AdaptiveRelease, tiers: Mapping[int, Sequence[int]]) -> dict[str, Any]:
    """The JSON object ``--speculative-adaptive-config`` reads in ``release``: one object per tier (0.5.16+), or for
    0.5.12, which has no tiers, the flat object of every tier's candidates together. Raises Unsupported for
    candidates the release cannot run."""
    if release.format is ConfigFormat.FLAT:
        steps = sorted({s for v in tiers.values() for s in v})
        _check_steps(release, steps, "candidate_steps")
        return {"candidate_steps": steps}
    for key, steps in tiers.items():
        _check_steps(release, steps, f"tier {key}")
    return {str(k): {"candidate_steps": sorted(set(v))} for k, v in sorted(tiers.items())}


def _check_steps(release: AdaptiveRelease, steps: Sequence[int], what: str) -> None:
    if any(not isinstance(s, int) or s < 0 for s in steps):
        raise UsageError(f"{what}: step counts are whole numbers 0 or more, not {list(steps)}")
    if 0 in steps and not release.zero_steps:
        raise Unsupported(f"sglang {release.version or '?'}'s adaptive mode has no zero-step state (speculation off "
                          "as a candidate: 0.5.16 and later): leave 0 out of the grid")
    if len(set(steps)) < release.min_candidates:
        raise Unsupported(f"sglang {release.version or '?'}'s adaptive mode needs at least {release.min_candidates} "
                          f"distinct step counts ({what}: {sorted(set(steps))})")


def launch_steps(tiers: Mapping[int, Sequence[int]]) -> int:
    """The ``--speculative-num-steps`` to launch a config with: its largest candidate (sglang 0.5.16 needs a
    candidate there, and crashes building a state for more steps than the launch's)."""
    return max(max(v) for v in tiers.values())


def live_tiers(steps: Sequence[int]) -> dict[int, tuple[int, ...]]:
    """A live sweep's launch: every candidate in one tier for every batch size, so that every state gets CUDA graphs
    for every batch size (a state only has them for the batch sizes whose tier holds it)."""
    return {1: tuple(sorted(set(steps)))}


def covers(tiers: Mapping[int, Sequence[int]], steps: Sequence[int], max_bs: int) -> bool:
    """Whether a server running with ``tiers`` can run every one of ``steps`` with its CUDA graphs for batches of
    1..``max_bs`` requests: every tier such a batch can reach (padding to a CUDA-graph size may reach up to twice
    its size) holds them all."""
    reach = {tier_for(tiers, b) for b in range(1, 2 * max(1, max_bs) + 1)}
    return all(set(steps) <= set(tiers[k]) for k in reach)


# ----------------------------------------------------------------------------------------------------------------
# Launch command lines


def unsupported_reason(release: AdaptiveRelease, values: Mapping[str, str]) -> str | None:
    """Why ``release``'s adaptive mode would not run with the launch flags ``values`` (``cmdline.flag_values``, every
    flag with its last value; a bare flag "on"), in one line; None when it would."""
    algo = values.get("speculative-algorithm")
    if algo in (None, "", "None", "none"):
        return "the server runs no speculation (no --speculative-algorithm)"
    if ALIASES.get(algo.upper(), algo.upper()) not in release.algorithms:
        return (f"--speculative-algorithm {algo}: sglang's adaptive mode runs {' and '.join(release.algorithms)} only")
    topk = values.get("speculative-eagle-topk")
    if topk is not None and topk.strip() != "1":
        return f"--speculative-eagle-topk {topk}: sglang's adaptive mode runs top-k 1 only"
    for name in release.limits:
        flag, why = LIMITS[name]
        if values.get(flag) not in (None, "off", "false", "False", "0"):
            return f"--{flag}: sglang's adaptive mode does not run with it ({why})"
    return None


def check_live_grid(release: AdaptiveRelease | None, steps: Sequence[int]) -> AdaptiveRelease:
    """``release``, when it can run ``steps`` as adaptive states; raises Unsupported when it cannot, or has no
    adaptive mode (None)."""
    if release is None:
        raise Unsupported("this sglang has no adaptive speculative decoding (--speculative-adaptive, sglang 0.5.12 "
                          "and later): sweep without --live (one launch per point)")
    _check_steps(release, steps, "--grid speculative-num-steps")
    return release


# ----------------------------------------------------------------------------------------------------------------
# The emitted config: candidates per tier from per-point measurements


@dataclasses.dataclass(frozen=True)
class StepMeasure:
    """What is known of one step count at one batch size: tokens per second (``low``..``high``: the range of the
    windows that measured it, or of a prediction's spread; None for a single figure). ``basis``: "measured" (a live
    sweep's windows), or the acceptance model's (``report --predict``): "profile" (fewer steps than the records
    ran: the accept length read from their acceptance profile) or "extrapolated" (more)."""

    steps: int
    bs: int
    tokens_per_s: float
    low: float | None = None
    high: float | None = None
    basis: str = "measured"


def choose_tiers(measures: Sequence[StepMeasure], tolerance: float = 0.03) -> dict[int, tuple[int, ...]]:
    """The candidate steps per batch-size tier: at each batch size measured, the best measured step count and every
    other measured one whose range reaches the best's (or that is within ``tolerance`` of its tokens per second),
    so that sglang's own policy can move among the step counts that may be as good; a step count only predicted
    (by the acceptance model) joins when its predicted figure itself reaches that floor, its spread not counted (a
    prediction does not make a candidate by being uncertain). Neighbouring batch sizes with the same candidates are
    one tier, and the smallest tier starts at 1. Raises UsageError when nothing was measured."""
    by_bs: dict[int, list[StepMeasure]] = {}
    for m in measures:
        if m.tokens_per_s is not None and m.tokens_per_s > 0:
            by_bs.setdefault(m.bs, []).append(m)
    if not any(m.basis == "measured" for ms in by_bs.values() for m in ms):
        raise UsageError("no measured point to choose adaptive candidates from")
    tiers: dict[int, tuple[int, ...]] = {}
    for bs in sorted(by_bs):
        ms = by_bs[bs]
        measured = [m for m in ms if m.basis == "measured"]
        if not measured:
            continue
        best = max(measured, key=lambda m: m.tokens_per_s)
        floor = min(best.tokens_per_s * (1 - tolerance), best.low if best.low is not None else best.tokens_per_s)

        def reach(m: StepMeasure) -> float:
            return m.high if m.high is not None and m.basis == "measured" else m.tokens_per_s

        chosen = sorted({m.steps for m in ms if reach(m) >= floor})
        if not tiers or tiers[max(tiers)] != tuple(chosen):
            tiers[bs] = tuple(chosen)
    first = min(tiers)
    if first != 1:
        tiers[1] = tiers.pop(first)
    return dict(sorted(tiers.items()))


def curve_tiers(tiers: Mapping[int, Sequence[int]], rows: Sequence[Mapping[str, Any]], top: int,
                allowed: Sequence[int], tolerance: float = 0.03) -> tuple[dict[int, tuple[int, ...]], dict[int, str]]:
    """``tiers`` (chosen from measurements up to batch size ``top``) extended over the larger batch sizes by the
    cost curve's predictions (``rows``: ``report --predict``'s ``predict_by_bs``, the step counts in ``allowed``
    only), so that the top measured tier is never stretched over batch sizes nobody measured: at each priced batch
    size above ``top`` (the first one ``top + 1``), ``(0,)`` where no step count beats no speculation beyond the
    spreads, else every step count whose predicted tok/s reaches the best's less ``tolerance`` (its spread not
    counted). Neighbours with the same candidates are one tier. Returns the tiers and, per tier key, its basis:
    ``measured``, or the curve's (``fitted``, ``extrapolated``; ``, no speculation estimated`` where it was)."""
    out = {k: tuple(v) for k, v in sorted(tiers.items())}
    basis = {k: "measured" for k in out}
    ok = set(allowed) | {0}
    above = [r for r in sorted(rows, key=lambda r: r["bs"]) if r["bs"] > top]
    if above and above[0]["bs"] > top + 1:
        above.insert(0, dict(above[0], bs=top + 1))  # its figures stand for the batch sizes up to it
    for r in above:
        pts = [p for p in r["points"] if p["steps"] in ok and p.get("tokens_per_s")]
        zero = next((p for p in pts if p["steps"] == 0), None)
        spec = [p for p in pts if p["steps"] > 0]
        if not spec:
            continue
        beats = [p for p in spec if zero is None or
                 p["tokens_per_s"] * (1 - p["spread"]) > zero["tokens_per_s"] * (1 + zero["spread"])]
        if not beats:
            chosen = (0,)
            why = [zero] if zero is not None else []
        else:
            floor = max(p["tokens_per_s"] for p in pts) * (1 - tolerance)
            picked = [p for p in pts if p["tokens_per_s"] >= floor]
            chosen = tuple(sorted(p["steps"] for p in picked))
            why = picked
        if out and out[max(out)] == chosen:
            continue
        out[r["bs"]] = chosen
        kinds = {p["basis"] for p in why if p["steps"] > 0} or {"fitted"}
        word = "extrapolated" if "extrapolated" in kinds else "fitted" if "fitted" in kinds else sorted(kinds)[0]
        est = zero is not None and zero["basis"] == "estimate"
        basis[r["bs"]] = f"{word} curve" + (", no speculation estimated" if est else "")
    return out, basis


def measures_of(points: Sequence[Mapping[str, Any]], by_bs: Mapping[int, Mapping[int, Sequence[float]]],
                concurrency: int,
                predicted: Mapping[int, Mapping[int, Sequence[Sequence[Any]]]] | None = None) -> list[StepMeasure]:
    """StepMeasures from a live sweep: per (steps, batch size) the server's tokens per second of its windows
    (``by_bs[steps][bs]``: one figure per window) where there are some, else the client's per point at the load's
    concurrency. ``predicted[bs][steps]``: the acceptance model's figures at that batch size (``[tokens per second,
    spread, basis]``, one per window of the largest step count) for the step counts up to the largest of the grid;
    they stand for the (steps, batch size) pairs no window measured, the grid's own and those between."""
    out: list[StepMeasure] = []
    for p in points:
        steps = p.get("steps")
        if p.get("status") != "ok" or not isinstance(steps, int):
            continue
        per_bs = by_bs.get(steps) or {}
        if per_bs:
            for bs, figs in sorted(per_bs.items()):
                if figs:
                    out.append(StepMeasure(steps, bs, statistics.median(figs), min(figs), max(figs)))
            continue
        tps = p.get("tokens_per_s") or {}
        if tps.get("median") is not None:
            out.append(StepMeasure(steps, concurrency, tps["median"], tps.get("min"), tps.get("max")))
    steps_all = {m.steps for m in out}
    if predicted and out:
        top = max(steps_all)
        have = {(m.steps, m.bs) for m in out}
        for bs, per_steps in sorted(predicted.items()):
            if not any(m.bs == bs for m in out):
                continue  # a batch size no window measured: nothing to hold the predictions against
            for steps, figs in sorted(per_steps.items()):
                if not 0 < steps <= top or (steps, bs) in have or not figs:
                    continue
                tps = statistics.median(f[0] for f in figs)
                spread = statistics.median(f[1] for f in figs)
                basis = "profile" if all(f[2] in ("profile", "measured") for f in figs) else "extrapolated"
                out.append(StepMeasure(steps, bs, tps, tps * (1 - spread), tps * (1 + spread), basis))
    # a batch size only where every step count of the grid is known at it (else the choice compares unlike loads)
    full = {bs for bs in {m.bs for m in out} if steps_all <= {m.steps for m in out if m.bs == bs}}
    return sorted((m for m in out if m.bs in full), key=lambda m: (m.bs, m.steps))


def emitted(release: AdaptiveRelease, tiers: Mapping[int, Sequence[int]], path: str) -> dict[str, Any]:
    """What ``--emit-adaptive-config`` reports: the file's document, the flags that launch it, and how to check it."""
    doc = config_document(release, tiers)
    steps = launch_steps(tiers)
    flags = ["--speculative-adaptive", "--speculative-adaptive-config", path, "--speculative-num-steps", str(steps),
             "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", str(steps + 1)]
    out = {"path": path, "format": release.format.value, "config": doc,
           "tiers": {str(k): list(v) for k, v in tiers.items()}, "launch_flags": flags,
           "check": "launch the server with these flags, then eaglepatch bench TARGET (the same load) against a "
                    "bench of the best static point"}
    single = {tuple(v) for v in tiers.values()}
    if len(single) == 1 and len(next(iter(single))) == 1:
        # one candidate at every batch size: nothing for the adaptive controller to choose, and on the H200 the
        # adaptive launch of one candidate read 9% under the static one (one launch each, inside launch drift)
        k = next(iter(single))[0]
        out["static_flags"] = ([] if k == 0 else
                               ["--speculative-num-steps", str(k), "--speculative-eagle-topk", "1",
                                "--speculative-num-draft-tokens", str(k + 1)])
        out["check"] = (("every batch size's best is no speculation: launch without the --speculative-* flags"
                         if k == 0 else
                         f"every batch size's best is {k} step{'s' if k > 1 else ''}: a static launch with "
                         "static_flags (no "
                         "--speculative-adaptive) runs it without the adaptive controller's work")
                        + "; bench it with eaglepatch bench TARGET (the same load); the adaptive launch_flags run "
                          "the same candidate adaptively")
    return out


def dumps(doc: Mapping[str, Any]) -> str:
    return json.dumps(doc, indent=1, sort_keys=False) + "\n"
