"""Render a ``ReportResult`` for people (``render_table``) and spreadsheets (``render_csv``). Pure: text out."""

from __future__ import annotations

import csv
import io
from typing import Any

from tabulate import tabulate

from eaglepatch.report.aggregation import GroupStats, ReportResult, Stats

#: The CSV columns of ``render_csv``, in order.
CSV_COLUMNS: tuple[str, ...] = (
    "mode",
    "key",
    "phase",
    "n",
    "mean",
    "p50",
    "p90",
    "p99",
    "max",
    "share",
    "accept_len",
    "tokens_per_s",
    "wall_tokens_per_s",
    "host_mean",
    "host_p50",
)


def _ms(v: float | None) -> str:
    return "" if v is None else f"{v:.3f}"


def _pct(v: float | None) -> str:
    return "" if v is None else f"{v * 100:.1f}%"


def _opt(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def group_title(g: GroupStats) -> str:
    """The header line of one group: mode, key, n, accept length, tok/s and wall tok/s."""
    parts = [g.mode]
    if g.key:
        parts.append(g.key_label())
    head = " ".join(parts)
    return (
        f"{head}  n={g.n}  accept len {_opt(g.accept_len, '.3f')}  "
        f"tok/s {_opt(g.tokens_per_s, '.1f')}  wall tok/s {_opt(g.wall_tokens_per_s, '.1f')}"
    )


def _stat_row(label: str, st: Stats, share: str, host: Stats | None, with_host: bool) -> list[str]:
    row = [label, str(st.n), _ms(st.mean), _ms(st.p50), _ms(st.p90), _ms(st.p99), _ms(st.max), share]
    if with_host:
        row += [_ms(host.mean) if host else "", _ms(host.p50) if host else ""]
    return row


def render_group_table(g: GroupStats, *, tablefmt: str = "simple") -> str:
    """The table of one group (without its title): a row per phase in canonical order, then ``cycle``, then
    ``between``; columns n, mean, p50, p90, p99, max (milliseconds), share (percent of cycle time), and
    ``host mean``/``host p50`` when the group has host-clock times."""
    with_host = g.has_host
    headers = ["phase", "n", "mean ms", "p50", "p90", "p99", "max", "share"]
    if with_host:
        headers += ["host mean", "host p50"]
    rows = [_stat_row(p.name, p.stats, _pct(p.share), p.host, with_host) for p in g.phases]
    rows.append(_stat_row("cycle", g.cycle, _pct(1.0), g.host_cycle, with_host))
    if g.between is not None:
        b = g.between
        row = ["between", str(b.n), _ms(b.mean), _ms(b.p50), _ms(b.p90), "", "", ""]
        if with_host:
            row += ["", ""]
        rows.append(row)
    colalign = ("left",) + ("right",) * (len(headers) - 1)
    return tabulate(rows, headers=headers, tablefmt=tablefmt, disable_numparse=True, colalign=colalign)


def render_table(result: ReportResult, *, tablefmt: str = "simple") -> str:
    """Return the human report: per group a title line and its table, separated by blank lines, then notes
    (lines that did not parse, cycles dropped by ``--skip``); no trailing newline. Never raises for an empty
    result: it says so."""
    out: list[str] = []
    if not result.groups:
        out.append("no timing records found in " + (", ".join(result.sources) or "(no files)"))
    for g in result.groups:
        out.append(group_title(g))
        out.append(render_group_table(g, tablefmt=tablefmt))
        out.append("")
    while out and out[-1] == "":
        out.pop()
    notes = []
    dropped = result.records - sum(g.n for g in result.groups)
    if result.skip and dropped:
        notes.append(f"note: --skip {result.skip} left out the first {dropped} cycles (first {result.skip} per process)")
    if result.skipped_lines:
        notes.append(f"note: {result.skipped_lines} lines did not parse and were skipped")
    if notes:
        out.append("")
        out.extend(notes)
    return "\n".join(out)


def _csv_num(v: Any, ndigits: int = 4) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return repr(round(v, ndigits))
    return str(v)


def render_csv(result: ReportResult) -> str:
    """Return CSV text (header ``CSV_COLUMNS``): one row per group and phase, then the group's ``cycle`` row and
    its ``between`` row (when gaps were measured; p99/max/share empty). ``key`` is ``""`` or ``bs=1`` etc.;
    ``share`` is a fraction (0..1); ``accept_len``, ``tokens_per_s`` and ``wall_tokens_per_s`` repeat the group's
    values on every row; ``host_mean``/``host_p50`` are empty without host-clock times."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for g in result.groups:
        tail = [_csv_num(g.accept_len), _csv_num(g.tokens_per_s), _csv_num(g.wall_tokens_per_s)]
        key = g.key_label()

        def row(phase: str, st: Stats, share: float | None, host: Stats | None) -> list[str]:
            return [
                g.mode,
                key,
                phase,
                str(st.n),
                _csv_num(st.mean),
                _csv_num(st.p50),
                _csv_num(st.p90),
                _csv_num(st.p99),
                _csv_num(st.max),
                _csv_num(share),
                *tail,
                _csv_num(host.mean) if host else "",
                _csv_num(host.p50) if host else "",
            ]

        for p in g.phases:
            w.writerow(row(p.name, p.stats, p.share, p.host))
        w.writerow(row("cycle", g.cycle, 1.0, g.host_cycle))
        if g.between is not None:
            b = g.between
            w.writerow(
                [g.mode, key, "between", str(b.n), _csv_num(b.mean), _csv_num(b.p50), _csv_num(b.p90),
                 "", "", "", *tail, "", ""]
            )
    return buf.getvalue()
