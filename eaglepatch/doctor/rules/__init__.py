"""The doctor's rules: one small function per finding id, each deciding from ``ServerFacts`` alone; ``diagnose``.

A rule returns a ``Finding`` (id, severity, title, evidence, the next step as a command) or None. It decides only
from evidence it was given: a fact that was not read (no log, no config, no timing records) makes it say nothing,
never guess. Each rule's docstring states its condition and thresholds (docs/doctor.md lists the same); the
thresholds are the named constants of ``thresholds``. The rules live by kind of finding: ``draft`` (the draft and
the algorithm), ``steps`` (whether speculation and its step count pay), ``pace`` (where decode time goes),
``measurement`` (the measurement itself, and what could not be looked for). ``diagnose`` runs them all and orders
the findings by severity (high, medium, low, info), then by the order of ``RULES``.
"""

from __future__ import annotations

from eaglepatch.doctor.facts import ServerFacts
from eaglepatch.doctor.finding import SEVERITIES, Finding, Rule
from eaglepatch.doctor.rules.draft import accept_length_low, draft_context_short, draft_mismatch, eagle3_draft_as_eagle
from eaglepatch.doctor.rules.measurement import load_unlike_traffic, no_timing_records, not_patched, sync_on_overlap
from eaglepatch.doctor.rules.pace import cuda_graph_off, host_bound, rank_skew, tp_communication
from eaglepatch.doctor.rules.steps import speculation_slower, speculation_unproven, too_few_steps, too_many_steps


# The rules in the order their findings are listed within one severity.
RULES: tuple[tuple[str, Rule], ...] = (
    ("eagle3-draft-as-eagle", eagle3_draft_as_eagle),
    ("draft-mismatch", draft_mismatch),
    ("accept-length-low", accept_length_low),
    ("speculation-slower", speculation_slower),
    ("speculation-unproven", speculation_unproven),
    ("cuda-graph-off", cuda_graph_off),
    ("draft-context-short", draft_context_short),
    ("too-many-steps", too_many_steps),
    ("too-few-steps", too_few_steps),
    ("host-bound", host_bound),
    ("rank-skew", rank_skew),
    ("sync-on-overlap", sync_on_overlap),
    ("load-unlike-traffic", load_unlike_traffic),
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


__all__ = [
    "RULES",
    "accept_length_low",
    "cuda_graph_off",
    "diagnose",
    "draft_context_short",
    "draft_mismatch",
    "eagle3_draft_as_eagle",
    "host_bound",
    "load_unlike_traffic",
    "no_timing_records",
    "not_patched",
    "rank_skew",
    "speculation_slower",
    "speculation_unproven",
    "sync_on_overlap",
    "too_few_steps",
    "too_many_steps",
    "tp_communication",
]
