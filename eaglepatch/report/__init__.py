"""The pure report: timing records in, groups/tables/JSON/CSV/trace out.

Typical use (what ``eaglepatch report`` does)::

    files = iter_log_files(["/tmp/eaglepatch"])
    result = aggregate(files, by="bs", skip=10, trace_path="trace.json")
    print(render_table(result))          # or json.dumps(result.to_json()), render_csv(result)
    print(render_compare_table(compare([r1, r2], ["before", "after"])))
"""

from eaglepatch.report.aggregation import (
    BY_CHOICES,
    BetweenStats,
    GroupStats,
    PhaseStats,
    ReportResult,
    Stats,
    aggregate,
    iter_log_files,
)
from eaglepatch.report.comparison import (
    CompareGroup,
    CompareResult,
    CompareRow,
    compare,
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
    "CompareGroup",
    "CompareResult",
    "CompareRow",
    "GroupStats",
    "PhaseStats",
    "ReportResult",
    "Stats",
    "TraceWriter",
    "aggregate",
    "compare",
    "iter_log_files",
    "percentile",
    "phase_order",
    "render_compare_csv",
    "render_compare_table",
    "render_csv",
    "render_group_table",
    "render_table",
]
