"""The sweeps kept on this machine (``eaglepatch sweep``'s state files): the newest of a target's server
(``find_sweep``: doctor's evidence), and the newest of a target whose baseline ran (``sweep_with_baseline``: the
measured no-speculation point of ``report --predict``)."""

from __future__ import annotations

import glob
import json
import os
from typing import Any


def _point_of(key: str) -> Any:
    from eaglepatch.tuning import sweep as sw

    d = json.loads(key)
    return sw.Point(flags=tuple(tuple(x) for x in d.get("flags") or ()),
                    env=tuple(tuple(x) for x in d.get("env") or ()), baseline=bool(d.get("baseline")))


def find_sweep(name: str, srv: Any, cache: str | None = None) -> dict[str, Any] | None:
    """The newest sweep of this server kept on this machine (a state file of ``eaglepatch sweep`` whose target is
    ``name`` and whose server listened on the same port; ``srv`` None: any server of the target), preferring one
    with a baseline that ran: its ``sweep --json`` summary, plus ``path``, ``load`` and ``current`` (the point
    whose runs had this very command line, or None)."""
    from eaglepatch.tuning import sweep_state, sweep_summary

    found = []
    for path in glob.glob(os.path.join(cache or sweep_state.cache_dir(), "*.jsonl")):
        try:
            state = sweep_state.StateFile(path)
        except OSError:
            continue
        head = state.header or {}
        if head.get("target") != name or (srv is not None and (head.get("original") or {}).get("port") != srv.port):
            continue
        try:
            points = [_point_of(k) for k in head.get("points") or ()]
        except (ValueError, TypeError):
            continue
        if not points or not state.runs:
            continue
        summary = sweep_summary.summarize(name, points, state.runs, any(p.baseline for p in points),
                                          int(head.get("repeat", 1)))
        summary["path"] = path
        summary["load"] = head.get("load") or {}
        summary["current"] = None
        for i, p in enumerate(points):
            if srv is not None and any(r.get("point") == p.key and r.get("status") == "ok"
                                       and list(r.get("argv") or ()) == list(srv.argv) for r in state.runs):
                summary["current"] = i
                break
        b = summary.get("baseline")
        base_ok = b is not None and summary["points"][b].get("status") == "ok"
        found.append((base_ok, os.path.getmtime(path), summary))
    if not found:
        return None
    return max(found, key=lambda x: (x[0], x[1]))[2]


def sweep_with_baseline(name: str) -> dict[str, Any] | None:
    """The newest sweep of the target ``name`` kept on this machine that has a baseline which ran (its
    ``sweep --json`` summary), else None: the measured no-speculation point of ``report --predict``."""
    found = find_sweep(name, None)
    return found if found and found.get("baseline") is not None else None
