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

The names above are the package's face; its modules, each of one concern, bottom up:

* ``stats``: percentiles, phase and key order, JSON rounding;
* ``model``: the result types (``ReportResult``, ``GroupStats``, ``RunInfo``, ...) and the labels people read
  them by (``key_label``, ``compact_flags``, ``local_time``);
* ``files``: which files to read (``iter_log_files``);
* ``record``: what a valid timing record is, field by field;
* ``groups``: a group's accumulator, finished into its ``GroupStats``;
* ``scan``: the hot loop over the lines (msgspec, else the standard library's json);
* ``aggregation``: ``aggregate``: the scan, run selection, the groups put in order;
* ``trace``: the Chrome trace file; ``render``: the table and the CSV; ``jsontext``: the JSON text, written a
  group at a time; ``comparison``: ``--compare``;
  ``predict``: ``--predict``, other step counts from one run's records;
* ``chart/``: the SVG/PNG charts: ``draw`` (the scene, its writers, text metrics, axes), ``compare`` and
  ``predict`` (the ``--compare`` and ``--predict`` charts).
"""

from eaglepatch.report.aggregation import aggregate
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
from eaglepatch.report.files import iter_log_files
from eaglepatch.report.model import (
    BY_CHOICES,
    Acceptance,
    BetweenStats,
    GroupStats,
    PhaseStats,
    ReportResult,
    RunInfo,
    Stats,
    compact_flags,
    key_label,
    local_time,
)
from eaglepatch.report.render import CSV_COLUMNS, render_csv, render_group_table, render_table
from eaglepatch.report.stats import CANONICAL_PHASES, percentile, phase_order
from eaglepatch.report.trace import TraceWriter

__all__ = [
    "BY_CHOICES",
    "Acceptance",
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
    "key_label",
    "local_time",
    "numbered_paths",
    "percentile",
    "phase_order",
    "render_compare_csv",
    "render_compare_table",
    "render_csv",
    "render_group_table",
    "render_table",
]
