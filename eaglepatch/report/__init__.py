"""The pure report: timing records in, groups/tables/JSON/CSV/trace out.

Typical use (what ``eaglepatch report`` does)::

    files = iter_log_files(["/tmp/eaglepatch"])
    result = aggregate(files, by="bs", skip=10, trace_path="trace.json", latest=True)
    print(render_table(result))          # or json.dumps(result.to_json()), render_csv(result)

    # --compare: each source on its own, one trace per source (trace.1.json, trace.2.json)
    results, traces = aggregate_each([iter_log_files([s]) for s in sources], sources, trace_path="trace.json",
                                     latest=True)
    print(render_compare_table(compare(results, sources)))

Runs (one server launch each) are never merged unless ``merge_runs=True``; ``run_ids``, ``since`` and
``latest`` select some (see ``aggregate``).
"""

from eaglepatch.report.aggregation import (
    BY_CHOICES,
    BetweenStats,
    GroupStats,
    PhaseStats,
    ReportResult,
    RunInfo,
    Stats,
    aggregate,
    compact_flags,
    iter_log_files,
)
from eaglepatch.report.comparison import (
    CompareColumn,
    CompareGroup,
    CompareResult,
    CompareRow,
    aggregate_each,
    compare,
    numbered_paths,
    render_compare_csv,
    render_compare_table,
)
from eaglepatch.report.render import CSV_COLUMNS, render_csv, render_group_table, render_table
from eaglepatch.report.stats import CANONICAL_PHASES, percentile, phase_order
from eaglepatch.report.trace import TraceWriter

__all__ = [
    "BY_CHOICES",
    "BetweenStats",
    "CANONICAL_PHASES",
    "CSV_COLUMNS",
    "CompareColumn",
    "CompareGroup",
    "CompareResult",
    "CompareRow",
    "GroupStats",
    "PhaseStats",
    "ReportResult",
    "RunInfo",
    "Stats",
    "TraceWriter",
    "aggregate",
    "aggregate_each",
    "compact_flags",
    "compare",
    "iter_log_files",
    "numbered_paths",
    "percentile",
    "phase_order",
    "render_compare_csv",
    "render_compare_table",
    "render_csv",
    "render_group_table",
    "render_table",
]
