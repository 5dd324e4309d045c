"""Findings about the measurement itself: a timer that slows what it measures, and what doctor could not look for
(no timing patch in force, no timing record yet).
"""

from __future__ import annotations

from eaglepatch.doctor.facts import ServerFacts, evidence
from eaglepatch.doctor.finding import Finding, records_ev


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
                   [records_ev(f, f"{f.records} records written by the sync timer"), ov_ev],
                   f"eaglepatch apply {f.target} --mode auto (CUDA events for the overlap scheduler's workers)")


def load_unlike_traffic(f: ServerFacts) -> Finding | None:
    """``load-unlike-traffic`` (low; medium when a sweep of this server is kept: its best step count was chosen on
    that load): the timing records hold decode cycles of eaglepatch's load (bench, sweep: their requests' ids start
    ``eaglepatch-``) and of the server's own traffic (the records' ``"others"``), and the two accept lengths differ
    beyond their spreads (``tuning.traffic.compare``: each side 50 request-cycles or more, the gap over both spreads
    of two standard errors and at least 5% of the larger). Measured, not predicted. Needs timing records of a
    runtime that marks the requests."""
    from eaglepatch.tuning import traffic

    doc = f.traffic
    if not doc:
        return None
    said = traffic.compare(doc)
    if said is None:
        return None
    load, mine = doc["load"], doc["traffic"]
    ev = records_ev(f, f"eaglepatch's load: accept length {load['accept_len']:.2f} over {load['samples']} "
                       f"request-cycles (+/- {load['spread'] or 0:.2f}); the server's own traffic: "
                       f"{mine['accept_len']:.2f} over {mine['samples']} (+/- {mine['spread'] or 0:.2f}), in "
                       f"{doc['cycles']} of {doc['decode_cycles']} decode cycles")
    return Finding("load-unlike-traffic", "medium" if f.sweep else "low",
                   "eaglepatch's load accepts differently from the server's own traffic: its best step count may "
                   "not be the traffic's", [ev],
                   f"eaglepatch bench {f.target} --prompts FILE (a JSONL sample of the server's own requests), then "
                   "sweep with the same --prompts")


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
