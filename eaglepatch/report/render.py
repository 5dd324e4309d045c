"""Render a ``ReportResult`` for people (``render_table``) and spreadsheets (``render_csv``). Pure: text out.

Runs: the table shows, before each run's groups, the run's header line (``RunInfo.title()``: its start as local
time, its speculative flags in short, its timer and its id), also when the result holds one run; a run without
groups (a header line alone: the server has timed nothing yet; or every cycle dropped by ``--skip``) says so.
When ``merge_runs`` merged several runs, a ``warning: merged N runs: ...; their figures blend`` line comes first
instead. Runs that the selection left out are named in a note at the end. A result without runs (rebuilt from
an older JSON document) shows its groups as before.

CSV: the columns of before, then ``run`` (appended last, so that readers of the older columns by position keep
working): the id of the group's run on every row, whether the result holds one run or several; the ids joined
with ``+`` when the runs were merged; empty when the run is not known (a result without runs). The ``key``
column never holds the run (it holds ``spec=...`` where the spec varies within a group).
"""

from __future__ import annotations

import csv
import io
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from tabulate import tabulate

from eaglepatch.redact import shown as escaped
from eaglepatch.report.labels import CYCLE, WALL
from eaglepatch.report.model import Acceptance, GroupStats, ReportResult, Stats

if TYPE_CHECKING:
    from eaglepatch.report.predict import Prediction
    from eaglepatch.report.predict_bs import ByBs

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
    "run",
)


def _ms(v: float | None) -> str:
    return "" if v is None else f"{v:.3f}"


def _pct(v: float | None) -> str:
    return "" if v is None else f"{v * 100:.1f}%"


def _opt(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def group_title(g: GroupStats) -> str:
    """The header line of one group: mode, key, its ranks where several (``"[4 ranks (TP 2 x DP 2)]"``), n, accept
    length, in-cycle tok/s (``tokens_per_s``) and records'
    wall tok/s (``wall_tokens_per_s``), each by its label (``eaglepatch.report.labels``)."""
    parts = [g.mode]
    label = g.key_label()
    if label:
        parts.append(label)
    ranks = g.ranks_label()
    if ranks:
        parts.append(f"[{ranks}]")
    head = " ".join(parts)
    return (
        f"{head}  n={g.n}  accept len {_opt(g.accept_len, '.3f')}  "
        f"{CYCLE} {_opt(g.tokens_per_s, '.1f')}  {WALL} {_opt(g.wall_tokens_per_s, '.1f')}"
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


def acceptance_line(a: Acceptance) -> str:
    """The acceptance profile in one line: the share of request-cycles that produced at least 1, 2, ... tokens,
    then the per-position rates (each share over the one before)."""
    shares = "  ".join(f"{i + 1}: {x:.2f}" for i, x in enumerate(a.at_least))
    rates = " ".join("-" if r is None else f"{r:.2f}" for r in a.rates)
    return (f"acceptance ({a.samples} request-cycles): at least {shares}"
            + (f"; per position {rates}" if rates else ""))


def render_prediction(p: "Prediction", *, tablefmt: str = "simple") -> str:
    """The prediction of one group: a table of step counts (records' wall tok/s, the scale of the group's own
    figure beside it, with its uncertainty and basis), the best point, and what each basis rests on; or the one
    line that says why there is none."""
    if p.why is not None:
        return f"prediction: none: {p.why}"
    rows = []
    for i, pt in enumerate(p.points):
        rows.append([f"{pt.steps}{' *' if i == p.best else ''}", str(pt.draft_tokens), f"{pt.accept_len:.3f}",
                     f"{pt.cycle_ms:.3f}", f"{pt.between_ms:.3f}", f"{pt.tokens_per_s:.1f}",
                     f"\u00b1{pt.spread * 100:.0f}%", pt.basis])
    headers = ["steps", "draft tokens", "accept len", "cycle ms", "between ms", WALL, "spread", "basis"]
    colalign = ("left",) + ("right",) * 6 + ("left",)
    out = [f"predicted {WALL}, per draft step count (* the best; steps 0: no speculation):",
           tabulate(rows, headers=headers, tablefmt=tablefmt, disable_numparse=True, colalign=colalign)]
    best, here = p.best_point, p.point(p.measured_steps) if p.measured_steps is not None else None
    zero = p.point(0)

    def steps(k: int) -> str:
        return "no speculation" if k == 0 else f"{k} step{'s' if k > 1 else ''}"

    if best is not None and here is not None and best.steps != here.steps:
        gain = best.tokens_per_s / here.tokens_per_s - 1 if here.tokens_per_s else 0.0
        grid = ",".join(str(s) for s in sorted({best.steps, here.steps} - {0}))
        # a live sweep's steps 0 is sglang's zero-step state (it still runs the draft extend): no speculation is
        # measured by a launch without it, the restart sweep's --baseline
        confirm = (f"eaglepatch sweep TARGET --baseline --repeat 3 --grid speculative-num-steps={grid}"
                   if best.steps == 0 else
                   f"eaglepatch sweep TARGET --live --grid speculative-num-steps={grid}")
        out.append(f"best: {steps(best.steps)}, {best.tokens_per_s:.1f} {WALL}, {gain * 100:+.0f}% over the "
                   f"{here.tokens_per_s:.1f} at the {steps(here.steps)} measured ({best.basis}; confirm with "
                   f"{confirm})")
    elif best is not None:
        out.append(f"best: the {steps(best.steps)} measured ({best.tokens_per_s:.1f} {WALL})")
    if (best is not None and best.steps > 0 and zero is not None and zero.basis == "estimate"
            and zero.tokens_per_s * (1 + zero.spread) >= best.tokens_per_s):
        grid = ",".join(str(s) for s in sorted({best.steps, p.measured_steps or best.steps}))
        out.append(f"no speculation: estimated {zero.tokens_per_s:.1f} {WALL} (\u00b1{zero.spread * 100:.0f}%), within "
                   f"reach of the best: only a launch without speculation tells whether speculation pays here "
                   f"(eaglepatch sweep TARGET --baseline --repeat 3 --grid speculative-num-steps={grid})")
    out.extend(f"basis: {n}" for n in p.notes)
    return "\n".join(out)


def _groups_text(groups: tuple[GroupStats, ...] | list[GroupStats], tablefmt: str,
                 predictions: dict[int, "Prediction | None"] | None = None) -> list[str]:
    out: list[str] = []
    for g in groups:
        out.append(group_title(g))
        out.append(render_group_table(g, tablefmt=tablefmt))
        if g.acceptance is not None:
            out.append(acceptance_line(g.acceptance))
        pred = predictions.get(id(g)) if predictions is not None else None
        if pred is not None:
            out.append(render_prediction(pred, tablefmt=tablefmt))
        out.append("")
    return out


def render_by_bs(b: "ByBs", *, tablefmt: str = "simple") -> str:
    """A run's best step count per batch size: a row per batch size (the best, its records' wall tok/s, no
    speculation's, the gain), the batch size from which speculation stops paying, the notes; or the line that
    says why there is none."""
    if b.why is not None:
        return f"best step count per batch size: none: {b.why}"
    rows = []
    estimated = []
    for r in b.rows:
        best = r.points[r.best]
        zero = next((p for p in r.points if p.steps == 0), None)
        gain = f"{best.tokens_per_s / zero.tokens_per_s - 1:+.0%}" if zero and zero.tokens_per_s and best.steps else ""
        rows.append([str(r.bs), "none" if best.steps == 0 else str(best.steps),
                     f"{best.tokens_per_s:.1f} \u00b1{best.spread * 100:.0f}% {best.basis}",
                     f"{zero.tokens_per_s:.1f} \u00b1{zero.spread * 100:.0f}% {zero.basis}" if zero else "", gain])
        if r.note:
            estimated.append(r.bs)
    out = [f"best step count per batch size (predicted {WALL} at that many requests a cycle):",
           tabulate(rows, headers=["bs", "best steps", WALL, "no speculation", "gain"], tablefmt=tablefmt,
                    disable_numparse=True, colalign=("right", "right", "right", "right", "right"))]
    if b.crossover_bs is None:
        out.append(f"speculation beats no speculation beyond the spreads up to {b.max_bs} requests a cycle")
    elif any(p.steps == 0 and p.basis == "estimate" for r in b.rows if r.bs >= b.crossover_bs for p in r.points):
        out.append(f"from {b.crossover_bs} requests a cycle no step count beats the no-speculation estimate beyond "
                   "its spread: whether speculation pays there, only a launch without speculation tells")
    else:
        out.append(f"speculation stops paying from {b.crossover_bs} requests a cycle (no step count beats no "
                   "speculation beyond the spreads there or above)")
    if estimated:
        out.append(f"no speculation is estimated, not measured, at {', '.join(map(str, estimated))} request(s) a cycle, "
                   "where a step count is named best: only a launch without speculation at that load decides "
                   "(eaglepatch sweep TARGET --baseline)")
    out.extend(f"basis: {n}" for n in b.notes)
    return "\n".join(out)


def render_table(result: ReportResult, *, tablefmt: str = "simple",
                 predictions: Sequence["Prediction | None"] | None = None,
                 by_bs: "Mapping[str | None, ByBs] | None" = None) -> str:
    """Return the human report: per run its header line, then per group of the run a title line and its table
    (and its acceptance profile, and with ``predictions``, one per group of ``result.groups``, its prediction),
    separated by blank lines (a merge warning first instead when runs were merged), with ``by_bs`` each run's best
    step count per batch size under its groups, then notes (lines that did not parse, cycles dropped by
    ``--skip``, runs left out); no trailing newline. Never raises for an empty result: it says so."""
    preds = None if predictions is None else {id(g): p for g, p in zip(result.groups, predictions)}
    by_bs = dict(by_bs or {})
    out: list[str] = []
    warning = result.merge_warning()
    if warning is not None:
        out.append("warning: " + warning)
        out.append("")
    if not result.groups and not (result.runs and not result.merged):
        out.append("no timing records found in " + (", ".join(result.sources) or "(no files)"))
    if result.runs and not result.merged:
        shown: set[str] = set()
        for run in result.runs:
            shown.add(run.id)
            out.append(escaped(run.title()))  # its flags are the host's word: one line, escaped
            mine = result.run_groups(run.id)
            if not mine:
                out.append("no timing records of this run" + (" (every cycle left out by --skip)" if run.records
                                                                else " yet"))
                out.append("")
            out.extend(_groups_text(mine, tablefmt, preds))
            if run.id in by_bs:
                out.extend([render_by_bs(by_bs.pop(run.id), tablefmt=tablefmt), ""])
        out.extend(_groups_text([g for g in result.groups if g.run not in shown], tablefmt, preds))
    else:
        out.extend(_groups_text(result.groups, tablefmt, preds))
    for b in by_bs.values():  # runs not listed (older logs without run ids, merged runs)
        out.extend([render_by_bs(b, tablefmt=tablefmt), ""])
    while out and out[-1] == "":
        out.pop()
    notes = []
    dropped = result.skipped_cycles
    if result.skip and dropped:
        notes.append(f"note: --skip {result.skip} left out the first {dropped} cycles (first {result.skip} per process)")
    if result.skipped_lines:
        notes.append(f"note: {result.skipped_lines} lines did not parse and were skipped")
    notes.extend(result.unread)
    if result.other_runs:
        n = len(result.other_runs)
        notes.append(f"note: {n} other run{'s' if n > 1 else ''} in these logs not shown: "
                     + "; ".join(r.short() for r in result.other_runs))
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
    values on every row; ``host_mean``/``host_p50`` are empty without host-clock times; ``run`` as the module
    docstring says."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    merged_ids = "+".join(r.id for r in result.runs) if result.merged else ""
    for g in result.groups:
        tail = [_csv_num(g.accept_len), _csv_num(g.tokens_per_s), _csv_num(g.wall_tokens_per_s)]
        key = g.key_label()
        run = g.run if g.run is not None else merged_ids

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
                run,
            ]

        for p in g.phases:
            w.writerow(row(p.name, p.stats, p.share, p.host))
        w.writerow(row("cycle", g.cycle, 1.0, g.host_cycle))
        if g.between is not None:
            b = g.between
            w.writerow(
                [g.mode, key, "between", str(b.n), _csv_num(b.mean), _csv_num(b.p50), _csv_num(b.p90),
                 "", "", "", *tail, "", "", run]
            )
    return buf.getvalue()
