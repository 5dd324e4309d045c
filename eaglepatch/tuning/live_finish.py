"""The end of ``eaglepatch sweep --live``: the summary of the saved windows (``live.summarize``) and, with
``--emit-adaptive-config``, the candidates per batch-size tier written (measured tiers, then the cost curve's above
them). Pure but for writing the emitted files; ``eaglepatch.tuning.drive_live`` carries the sweep out.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

from eaglepatch.errors import Unsupported, UsageError
from eaglepatch.tuning import adaptive as ad
from eaglepatch.tuning import live as lv

Say = Callable[[str], None]


def window_key(doc: Any) -> tuple[Any, Any, Any]:
    """A window's identity in the state file: its point, its round and (with a ladder) its concurrency."""
    return doc.get("point"), doc.get("rep"), doc.get("concurrency")


CURVE = "curve"  # the state's timings entry that holds the cost curve's best step counts per batch size


SERVER = "server"  # the state's timings entry that holds the server's own max_running_requests


def max_running_requests(url: str, api_key: str | None, timeout: float = 10.0) -> int | None:
    """The largest batch the server runs as sglang derived it (``/server_info``'s ``max_running_requests``, or
    ``/get_server_info`` before 0.4.x): a speculative launch gets fewer than its flags say (48 on the H100 testbed
    launched with ``--cuda-graph-max-bs 64``). None when the server does not say."""
    import json as _json
    import urllib.request

    for path in ("/server_info", "/get_server_info"):
        req = urllib.request.Request(url.rstrip("/") + path,
                                     headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
        try:
            with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=timeout) as resp:
                doc = _json.loads(resp.read(1 << 22))
        except (OSError, ValueError):
            continue
        v = doc.get("max_running_requests") if isinstance(doc, dict) else None
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def curve_of(files: Sequence[str], max_running: int | None = None) -> dict[str, Any] | None:
    """``report --predict``'s best step counts per batch size (``predict_by_bs`` and its notes) over every decode
    cycle of the live sweep's launch (each pinned step count a point of the cost fit), up to ``max_running`` (the
    server's own limit) when known, else its flags'; None without records."""
    from eaglepatch import report as rep
    from eaglepatch.report.predict_bs import for_runs

    if not files:
        return None
    res = rep.aggregate(files, by="bs")
    per = for_runs(res, flags={"max-running-requests": str(max_running)} if max_running else None)
    if not per:
        return None
    newest = res.runs[-1].id if res.runs else None
    return (per.get(newest) or next(iter(per.values()))).to_json()


def _emit_tiers(measures: Sequence[Any], curve: dict[str, Any] | None, steps: Sequence[int],
                notes: list[str]) -> tuple[dict[int, tuple[int, ...]], dict[int, str]]:
    """The candidates per tier from the measurements, extended over the batch sizes above the largest measured by
    the cost curve (``ad.curve_tiers``); without a curve, ``[0]`` above it, said in ``notes``: the top measured
    tier is never stretched over batch sizes nobody measured."""
    tiers = ad.choose_tiers(measures)
    top = max(m.bs for m in measures if m.basis == "measured")
    rows = (curve or {}).get("predict_by_bs") or []
    if rows:
        return ad.curve_tiers(tiers, rows, top, steps)
    notes.append(f"--emit-adaptive-config: no timing records to price batch sizes above {top} (the largest "
                 f"measured): no speculation from {top + 1}")
    basis = {k: "measured" for k in tiers}
    if tiers[max(tiers)] != (0,):
        tiers[top + 1] = (0,)
        basis[top + 1] = "not measured: no speculation"
    return tiers, basis


def _merged_runs(state: Any) -> list[dict[str, Any]]:
    """The saved windows, each with its figures from the timing logs when read."""
    extra = {window_key(d): d for d in state.timings}
    out = []
    for r in state.runs:
        d = dict(r)
        tpot = (r.get("client") or {}).get("tpot_ms") or {}
        d.setdefault("tpot_p50_ms", tpot.get("p50"))
        d.setdefault("tpot_p90_ms", tpot.get("p90"))
        t = extra.get(window_key(r))
        if t is not None:
            d["phases_p50"] = t.get("phases_p50") or {}
            d["cycles"] = t.get("cycles")
            d["accept_len_log"] = t.get("accept_len_log")
            if d.get("accept_len") is None:
                d["accept_len"] = t.get("accept_len_log")
        out.append(d)
    return out


def shared_note(doc: dict[str, Any], state: Any, opts: Any) -> None:
    """``"shared_cycles"`` and a note, when the windows' decode cycles carried requests that are not the sweep's
    (the server's own traffic): without --allow-shared-traffic the runtime pinned none of those cycles."""
    wins = [t for t in state.timings if isinstance(t.get("cycles"), dict)]
    shared = sum(int(t.get("shared_cycles") or 0) for t in wins)
    if not shared:
        return
    total = sum(int(t["cycles"].get("pinned", 0)) + int(t["cycles"].get("other", 0)) for t in wins)
    doc["shared_cycles"] = shared
    if getattr(opts, "allow_shared_traffic", False):
        how = ("they were pinned too (--allow-shared-traffic): the server's own requests ran at the windows' step "
               "counts meanwhile")
    else:
        how = ("those cycles were not pinned (a pin would change the step count of the server's own requests; "
               "sglang's policy chose theirs), so each window's figures mix in others: give --allow-shared-traffic "
               "to pin them too, or sweep a server that serves the sweep alone")
    doc["notes"].append(f"{shared} of the windows' {total} decode cycles carried requests that are not the sweep's "
                        f"(the server's own traffic): {how}")


def summary(name: str, release: ad.AdaptiveRelease, steps: Sequence[int], state: Any, opts: Any,
            restore: dict[str, Any], say: Say) -> dict[str, Any]:
    """The summary; with ``--emit-adaptive-config`` the config file written and described."""
    doc = lv.summarize(name, steps, _merged_runs(state), opts.rounds, len(state.launched()), opts.window,
                       **({"objective": opts.objective} if opts.objective is not None else {}),
                       ladder=opts.bench.ladder)
    doc.update(state_file=state.path, restore=restore, release=release.to_json())
    shared_note(doc, state, opts)
    if opts.emit is not None:
        by_bs: dict[int, dict[int, list[float]]] = {}
        for t in state.timings:
            for bs, tps in (t.get("by_bs") or {}).items():
                by_bs.setdefault(int(t["steps"]), {}).setdefault(int(bs), []).append(tps)
        predicted: dict[int, dict[int, list[list[Any]]]] = {}
        for t in state.timings:
            for bs, figs in (t.get("predicted_by_bs") or {}).items():
                for j, fig in figs.items():
                    predicted.setdefault(int(bs), {}).setdefault(int(j), []).append(fig)
        measures = ad.measures_of(doc["points"], by_bs, opts.bench.load.concurrency, predicted)
        curves = [t["curve"] for t in state.timings if t.get("point") == CURVE and t.get("curve")]
        try:
            tiers, basis = _emit_tiers(measures, curves[-1] if curves else None, steps, doc["notes"])
            emitted = ad.emitted(release, tiers, opts.emit)
        except (UsageError, Unsupported) as exc:  # nothing measured, or candidates the release cannot run
            doc["notes"].append(f"--emit-adaptive-config: {exc}: nothing written")
            return doc
        with open(opts.emit, "w", encoding="utf-8") as f:
            f.write(ad.dumps(emitted["config"]))
        emitted["tier_basis"] = {str(k): v for k, v in sorted(basis.items())}
        emitted["basis_path"] = opts.emit + ".basis.json"
        with open(emitted["basis_path"], "w", encoding="utf-8") as f:
            f.write(ad.dumps({"tiers": {str(k): {"candidate_steps": list(v), "basis": basis.get(k, "measured")}
                                        for k, v in sorted(tiers.items())},
                              "curve": curves[-1] if curves else None}))
        emitted["basis"] = sorted({m.basis for m in measures})
        emitted["measures"] = [dataclasses.asdict(m) for m in measures]
        chosen_predicted = [(m.bs, m.steps) for m in measures
                            if m.basis != "measured" and m.steps in tiers[ad.tier_for(tiers, m.bs)]]
        if chosen_predicted:
            doc["notes"].append("--emit-adaptive-config: candidates from the acceptance model, not measured: "
                                + ", ".join(f"{s} steps at batch size {b}" for b, s in chosen_predicted)
                                + " (the largest step count's records predicted them)")
        if any(tuple(v) == (0,) for v in tiers.values()):
            doc["notes"].append("--emit-adaptive-config: a tier of [0] runs sglang's zero-step state (the draft "
                                "extend still runs, the batch limit stays the speculative launch's), not plain "
                                "decoding: where no speculation is best at your load, a launch without speculation "
                                "runs it faster (eaglepatch sweep TARGET --grid speculative-num-steps=K --baseline "
                                "--concurrency ... measures both)")
        doc["adaptive_config"] = emitted
        if "static_flags" in emitted:  # one candidate everywhere: the static launch does it
            say(f"adaptive config written to {opts.emit} (tiers {emitted['tiers']}), but it holds one candidate: "
                + (f"launch with {' '.join(emitted['static_flags'])} instead (no --speculative-adaptive)"
                   if emitted["static_flags"] else "launch without speculation instead") + "; check it with "
                "eaglepatch bench TARGET")
        else:
            say(f"adaptive config written to {opts.emit} (tiers {emitted['tiers']}); deploy it with "
                f"{' '.join(emitted['launch_flags'])}; check it with eaglepatch bench TARGET against the best "
                "static point")
    return doc
