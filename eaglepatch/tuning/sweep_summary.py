"""The summary of a sweep: each run's figures, then per point the median tok/s, its range, the accept length, the
p50 of each phase, the speedup over the baseline and which points are within noise of the best (the ``sweep
--json`` object of docs/contract.md), as a table and as CSV for people.
"""

from __future__ import annotations

import dataclasses
import io
import json
import statistics
from typing import Any, Iterable, Mapping, Optional, Sequence

from eaglepatch.report.labels import CLIENT
from eaglepatch.tuning.load import SHORT_LOAD_S
from eaglepatch.tuning.sweep import Point

PHASES = ("draft", "verify", "draft_extend", "cycle")
# Launches of one point whose decode cycles (p50) differ by this factor ran on a machine whose speed moved. On the
# H200 (docs/real-gpu.md) a GPU-bound server's launches of one step count agreed within 2.1% in every sweep; a
# host-bound server's differed by up to 1.10x and 1.19x one day, and by 1.6x to 2.3x across a slow spell.
CYCLE_DRIFT = 1.1


def run_figures(bench: Mapping[str, Any]) -> dict[str, Any]:
    """What the summary needs of one bench (``eaglepatch.tuning.bench.bench_on``): client tok/s, accept length
    (the server's own, from the responses, else the timing log's), p50 of the decode phases and cycle, and the
    client's time per output token (p50 and p90, ms; None when the server did not stream); and the load's
    ``request_rate`` when it was an open loop."""
    client = bench.get("client") or {}
    tpot = client.get("tpot_ms") or {}
    timings = bench.get("timings") or {}
    # the newest run's decode group (a window that spans a restart has one per run, oldest first)
    decode = ([g for g in timings.get("groups") or [] if g.get("mode") == "decode"] or [None])[-1]
    phases: dict[str, float] = {}
    acc = client.get("accept_len")
    if decode is not None:
        for name, st in (decode.get("phases") or {}).items():
            if name in PHASES and st.get("p50") is not None:
                phases[name] = st["p50"]
        if (decode.get("cycle_ms") or {}).get("p50") is not None:
            phases["cycle"] = decode["cycle_ms"]["p50"]
        if acc is None:
            acc = decode.get("accept_len")
    fig = {"tokens_per_s": client.get("tokens_per_s"), "accept_len": acc, "phases_p50": phases,
           "records": (timings or {}).get("records"), "tpot_p50_ms": tpot.get("p50"), "tpot_p90_ms": tpot.get("p90")}
    rate = (bench.get("load") or {}).get("request_rate")
    if rate is not None:
        fig["request_rate"] = rate
    tr = bench.get("traffic")
    if tr:  # decode cycles of the window carried requests not the load's (the server's own traffic)
        fig["traffic"] = {"cycles": tr.get("cycles"), "accept_len": tr.get("accept_len"),
                          "load_accept_len": (tr.get("load") or {}).get("accept_len"), "differs": bool(tr.get("differs"))}
    cats = bench.get("categories") or {}
    if len(cats) > 1:  # per prompt category: its accept length and client tok/s
        fig["categories"] = {k: {"accept_len": c.get("accept_len"), "tokens_per_s": c.get("tokens_per_s")}
                             for k, c in cats.items()}
    return fig


def _traffic(ok: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """A point's runs' traffic beside the load: decode cycles with others' requests (all runs), the medians of the
    two accept lengths, and whether any run found them differing beyond their spreads."""
    trs = [r["traffic"] for r in ok if r.get("traffic")]
    if not trs:
        return None
    med = lambda k: (lambda xs: _r(statistics.median(xs), 4) if xs else None)(  # noqa: E731
        [t[k] for t in trs if t.get(k) is not None])
    return {"cycles": sum(int(t.get("cycles") or 0) for t in trs), "accept_len": med("accept_len"),
            "load_accept_len": med("load_accept_len"), "differs": any(t.get("differs") for t in trs)}


def _categories(ok: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """A point's per-category medians over its runs (accept length, client tok/s)."""
    names: list[str] = []
    for r in ok:
        names += [k for k in (r.get("categories") or {}) if k not in names]
    if not names:
        return None
    out = {}
    for k in names:
        vals = [(r.get("categories") or {}).get(k) or {} for r in ok]
        acc = [v["accept_len"] for v in vals if v.get("accept_len") is not None]
        tps = [v["tokens_per_s"] for v in vals if v.get("tokens_per_s") is not None]
        out[k] = {"accept_len": _r(statistics.median(acc), 4) if acc else None,
                  "tokens_per_s": _r(statistics.median(tps)) if tps else None}
    return out


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(x, nd)


@dataclasses.dataclass(frozen=True)
class Objective:
    """What "best" means (``--objective``, ``--max-tpot-ms``): the most tok/s (``throughput``) or the least time per
    output token at p50 (``latency``); a point whose p90 time per output token exceeds ``max_tpot_ms`` is never
    best."""

    kind: str = "throughput"
    max_tpot_ms: float | None = None

    def __post_init__(self) -> None:
        from eaglepatch.errors import UsageError

        if self.kind not in ("throughput", "latency"):
            raise UsageError(f"--objective must be throughput or latency, not {self.kind!r}")
        if self.max_tpot_ms is not None and not self.max_tpot_ms > 0:
            raise UsageError("--max-tpot-ms must be a positive number of milliseconds")

    def allowed(self, fig: Mapping[str, Any]) -> bool:
        """Whether a point (its ``tpot_ms`` figures) may be best; one without a TPOT (no streaming) may, unknown."""
        p90 = (fig.get("tpot_ms") or {}).get("p90")
        return self.max_tpot_ms is None or p90 is None or p90 <= self.max_tpot_ms

    def best(self, figs: Mapping[int, Mapping[str, Any]]) -> int | None:
        """The best of ``figs`` (index -> a point's or a load's figures) by this objective, or None."""
        ok = {i: f for i, f in figs.items() if self.allowed(f)}
        if not ok:
            return None
        if self.kind == "latency":
            with_t = {i: f for i, f in ok.items() if (f.get("tpot_ms") or {}).get("p50") is not None}
            if with_t:
                return min(with_t, key=lambda i: with_t[i]["tpot_ms"]["p50"])
        return max(ok, key=lambda i: ok[i]["tokens_per_s"]["median"])


def _tpot(rs: Sequence[Mapping[str, Any]]) -> dict[str, float] | None:
    """The median over runs of their client TPOT p50 and p90 (ms), or None when none streamed."""
    p50 = [r["tpot_p50_ms"] for r in rs if r.get("tpot_p50_ms") is not None]
    p90 = [r["tpot_p90_ms"] for r in rs if r.get("tpot_p90_ms") is not None]
    if not p50 or not p90:
        return None
    return {"p50": _r(statistics.median(p50)), "p90": _r(statistics.median(p90))}


def summarize(target: str, points: Sequence[Point], runs: Iterable[Mapping[str, Any]], baseline: bool,
              repeat: int, each_a_launch: bool = True, objective: Objective = Objective()) -> dict[str, Any]:
    """The ``sweep --json`` object of docs/contract.md, plus per point ``label``, ``within_noise`` (its tok/s range
    overlaps the best point's: it may be as good), ``failed_runs``, ``tpot_ms`` (the client's time per output token,
    p50 and p90), and for a failed point ``log_tail``; and top-level ``repeat`` and ``notes``. ``each_a_launch``:
    each run is a launch of its own (a restart sweep), so runs of one point whose decode cycles differ say the
    machine's speed moved between launches (a note). ``objective``: what best means."""
    by_point: dict[str, list[Mapping[str, Any]]] = {}
    for r in runs:
        by_point.setdefault(r["point"], []).append(r)
    docs = []
    drift: list[str] = []  # each part of the note on points whose launches ran at different speeds
    windows: list[float] = []  # seconds of load of every run that counted
    traffic_notes: list[str] = []  # points whose load and the server's own traffic accept differently
    for p in points:
        rs = by_point.get(p.key, [])
        ok = [r for r in rs if r.get("status") == "ok" and r.get("tokens_per_s") is not None]
        windows += [w for w in ((r.get("client") or {}).get("seconds") for r in ok) if isinstance(w, (int, float))]
        bad = [r for r in rs if r.get("status") == "failed"]
        doc: dict[str, Any] = p.to_json()
        doc["label"] = p.label
        if ok:
            tps = [r["tokens_per_s"] for r in ok]
            accs = [r["accept_len"] for r in ok if r.get("accept_len") is not None]
            names = [n for n in PHASES if any(n in (r.get("phases_p50") or {}) for r in ok)]
            doc.update({
                "status": "ok", "runs": len(ok),
                "tokens_per_s": {"median": _r(statistics.median(tps)), "min": _r(min(tps)), "max": _r(max(tps))},
                "accept_len": _r(statistics.median(accs), 4) if accs else None,
                "phases_p50": {n: _r(statistics.median([r["phases_p50"][n] for r in ok
                                                        if n in (r.get("phases_p50") or {})]), 4) for n in names},
                "tpot_ms": _tpot(ok),
            })
            shared = _traffic(ok)
            if shared is not None:
                doc["traffic"] = shared
                if shared["differs"] and shared["accept_len"] is not None and shared["load_accept_len"] is not None:
                    traffic_notes.append(
                        f"{p.label}: this load accepts {shared['load_accept_len']:.2f} tokens a cycle per request, the "
                        f"server's own traffic {shared['accept_len']:.2f} ({shared['cycles']} decode cycles with "
                        "requests not the sweep's): the best step count for the load may not be yours; give --prompts "
                        "a sample of your traffic")
            cats = _categories(ok)
            if cats is not None:
                doc["categories"] = cats
            if each_a_launch:
                drift += _cycle_drift(p.label, ok)
        else:
            doc.update({"status": "failed" if bad else "pending", "runs": 0, "tokens_per_s": None,
                        "accept_len": None, "phases_p50": {}})
        if bad:
            doc["failed_runs"] = len(bad)
            if not ok:
                doc["error"] = bad[-1].get("error") or "failed"
                doc["log_tail"] = bad[-1].get("log_tail") or ""
        doc["speedup"] = None
        docs.append(doc)

    base = 0 if baseline else None
    base_tps = None
    if base is not None and docs[base]["status"] == "ok":
        base_tps = docs[base]["tokens_per_s"]["median"]
    for d in docs:
        if base_tps and d["status"] == "ok":
            d["speedup"] = _r(d["tokens_per_s"]["median"] / base_tps)
    oks = [i for i, d in enumerate(docs) if d["status"] == "ok"]
    best = objective.best({i: docs[i] for i in oks})
    notes: list[str] = []
    over = [docs[i]["label"] for i in oks if not objective.allowed(docs[i])]
    if over:
        notes.append(f"over --max-tpot-ms {objective.max_tpot_ms:g} (p90 time per output token), never best: "
                     + ", ".join(over))
    if objective.kind == "latency":
        notes.append("--objective latency: the best point has the least time per output token (p50)")
    for i, d in enumerate(docs):
        if d["status"] != "ok":
            continue
        if best is None:
            d["within_noise"] = False
            continue
        b = docs[best]["tokens_per_s"]
        d["within_noise"] = i == best or d["tokens_per_s"]["max"] >= b["min"]
    if best is not None:
        ties = [docs[i]["label"] for i in oks if i != best and docs[i]["within_noise"]]
        if ties:
            notes.append(f"within noise of the best ({docs[best]['label']}): {', '.join(ties)}: their {CLIENT} "
                         "ranges overlap; more --repeat may separate them")
    if repeat < 2 and len(oks) > 1:
        notes.append("one launch per point: launches of one point differ (by 2-5% on a GPU-bound server, by tens of "
                     "percent on a host-bound one), so differences of that size decide nothing; use --repeat 3 or "
                     "more")
    if drift:
        notes.append("launches of one point ran their decode cycles (p50) at different speeds: " + "; ".join(drift)
                     + ". The setting was the same in each, so the machine's speed moved between launches and the "
                     "point's median mixes them: compare points by launches of like cycle times, or run the sweep "
                     "again when the machine is steady")
    short = [w for w in windows if w < SHORT_LOAD_S]
    if short:
        notes.append(f"{len(short)} of {len(windows)} run(s) measured under {SHORT_LOAD_S:.0f} s of load (the shortest "
                     f"{min(short):.1f} s): a start-up transient weighs heavily in so short a window; raise --requests "
                     "or --max-new-tokens")
    if oks and not any(docs[i]["phases_p50"] for i in oks):
        notes.append(f"no per-phase timings: the target is not patched (eaglepatch apply TARGET first); {CLIENT} "
                     "and the client's accept length only")
    if base is not None and docs[base]["status"] != "ok":
        notes.append("the baseline did not run: no speedups")
    notes += traffic_notes
    out = {"target": target, "baseline": base, "points": docs, "best": best, "repeat": repeat, "notes": notes}
    by_load = loads_of(points, by_point, docs, base, objective)
    if by_load:
        out["best_by_load"] = by_load
    return out


# a load of a ladder: its concurrency, and its request rate (None: a closed loop)
LoadKey = tuple[int, Optional[float]]


def loads_of(points: Sequence[Point], by_point: Mapping[str, Sequence[Mapping[str, Any]]],
             docs: Sequence[dict[str, Any]], base: int | None, objective: Objective) -> list[dict[str, Any]]:
    """With a ladder of concurrencies (runs with ``loads``): each point's ``loads`` (per concurrency its tok/s
    median and range over the runs, accept length and speedup over the baseline at the same concurrency), and the
    best point per concurrency, ``[{"concurrency", "best"}]``; empty without a ladder. A ladder of request rates
    (loads with ``request_rate``: open loops, ``concurrency`` their cap on what was in flight) the same way, per
    rate: ``{"concurrency", "request_rate", ...}`` and ``[{"concurrency", "request_rate", "best"}]``."""
    per: list[dict[LoadKey, list[Mapping[str, Any]]]] = []
    for p in points:
        got: dict[LoadKey, list[Mapping[str, Any]]] = {}
        for r in by_point.get(p.key, []):
            if r.get("status") == "ok":
                for ld in r.get("loads") or ():
                    if ld.get("tokens_per_s") is not None:
                        got.setdefault(load_key(ld), []).append(ld)
        per.append(got)
    ladder = sorted({c for got in per for c in got}, key=lambda k: (k[0], k[1] or 0.0))
    if not ladder:
        return []
    for d, got in zip(docs, per):
        d["loads"] = []
        for c in ladder:
            lds = got.get(c) or []
            if not lds:
                continue
            tps = [ld["tokens_per_s"] for ld in lds]
            accs = [ld["accept_len"] for ld in lds if ld.get("accept_len") is not None]
            d["loads"].append({**_key_json(c), "runs": len(lds),
                               "tokens_per_s": {"median": _r(statistics.median(tps)), "min": _r(min(tps)),
                                                "max": _r(max(tps))},
                               "accept_len": _r(statistics.median(accs), 4) if accs else None, "speedup": None,
                               "tpot_ms": _tpot(lds)})
    best = []
    for c in ladder:
        at = {i: ld for i, d in enumerate(docs) for ld in d.get("loads") or () if load_key(ld) == c}
        b = at.get(base) if base is not None else None
        for ld in at.values():
            if b and b["tokens_per_s"]["median"]:
                ld["speedup"] = _r(ld["tokens_per_s"]["median"] / b["tokens_per_s"]["median"])
        if at:
            best.append({**_key_json(c), "best": objective.best(at)})
    return best


def load_key(ld: Mapping[str, Any]) -> LoadKey:
    """What tells a load of a ladder from the others: its concurrency, and its request rate (an open loop; None: a
    closed loop)."""
    rate = ld.get("request_rate")
    return int(ld["concurrency"]), None if rate is None else float(rate)


def _key_json(key: LoadKey) -> dict[str, Any]:
    """A summary load's identity: ``{"concurrency"}``, and ``"request_rate"`` for an open loop."""
    return {"concurrency": key[0]} if key[1] is None else {"concurrency": key[0], "request_rate": key[1]}


def _cycle_drift(label: str, ok: Sequence[Mapping[str, Any]]) -> list[str]:
    """The point's part of the drift note, when its launches ran their decode cycles at speeds CYCLE_DRIFT apart or
    more: the setting is the same in each, so the machine (or what else ran on it) was faster in one launch than
    in another."""
    timed = [r for r in ok if isinstance((r.get("phases_p50") or {}).get("cycle"), (int, float))
             and r["phases_p50"]["cycle"] > 0]
    if len(timed) < 2:
        return []
    fast = min(timed, key=lambda r: r["phases_p50"]["cycle"])
    slow = max(timed, key=lambda r: r["phases_p50"]["cycle"])
    lo, hi = fast["phases_p50"]["cycle"], slow["phases_p50"]["cycle"]
    if hi < CYCLE_DRIFT * lo:
        return []
    accs = [r["accept_len"] for r in timed if isinstance(r.get("accept_len"), (int, float))]
    acc = statistics.median(accs) if len(accs) == len(timed) else None
    same = f" at one accept length ({acc:.2f})" if acc is not None and max(accs) - min(accs) <= 0.03 * acc else ""
    return [f"{label}: {lo:.2f} to {hi:.2f} ms ({hi / lo:.1f}x){same}, {fast['tokens_per_s']:.0f} against "
            f"{slow['tokens_per_s']:.0f} {CLIENT}"]


def _fmt(x: Any, nd: int = 1) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def render_table(doc: Mapping[str, Any]) -> str:
    """One table: the point, accept length, p50 of draft, verify, draft extend and cycle (ms), tok/s (median and
    range), speedup over the baseline; ``*`` marks the best point and ``~`` those within noise of it."""
    from tabulate import tabulate

    live = bool(doc.get("live"))
    unit = "window" if live else "run"
    rows = []
    for i, p in enumerate(doc["points"]):
        ph = p.get("phases_p50") or {}
        tps = p.get("tokens_per_s") or {}
        mark = "*" if i == doc.get("best") else ("~" if p.get("within_noise") else "")
        count = _count(p)
        status = p["status"] if p["status"] != "ok" else f"{count} {unit}{'s' if count != 1 else ''}"
        row = [
            f"{mark}{i}", p.get("label", ""), status, _fmt(p.get("accept_len"), 2),
            _fmt(ph.get("draft"), 2), _fmt(ph.get("verify"), 2), _fmt(ph.get("draft_extend"), 2),
            _fmt(ph.get("cycle"), 2), _fmt(tps.get("median")),
            f"{_fmt(tps.get('min'))}-{_fmt(tps.get('max'))}" if tps else "-",
        ]
        if live:
            row.append(f"{p['spread'] * 100:.1f}%" if p.get("spread") is not None else "-")
        rows.append(row + [f"{p['speedup']:.3f}x" if p.get("speedup") is not None else "-"])
    head = ["#", "point", unit + "s", "accept", "draft", "verify", "d.extend", "cycle", CLIENT, "range"]
    head += (["spread"] if live else []) + ["speedup"]
    if live:
        title = (f"live sweep of {doc['target']}: {len(doc['points'])} points x {doc.get('rounds', 1)} rounds of "
                 f"{doc.get('window_s', 0):g} s windows in one server ({doc.get('launches', 0)} launch"
                 f"{'es' if doc.get('launches', 0) != 1 else ''}; p50 ms per phase; {CLIENT}: what the load's client "
                 "received; "
                 "spread: (max - min) / median over the windows; * best, ~ within noise of it)")
    else:
        title = (f"sweep of {doc['target']}: {len(doc['points'])} points x {doc.get('repeat', 1)} (p50 ms per phase; "
                 f"{CLIENT}: what the load's client received; * best, ~ within noise of it)")
    out = [title, tabulate(rows, headers=head, tablefmt="simple", disable_numparse=True)]
    out += _load_tables(doc)
    for p in doc["points"]:
        if p["status"] == "failed":
            out.append(f"failed: {p['label']}: {p.get('error')}")
    for n in doc.get("notes") or []:
        out.append(f"note: {n}")
    return "\n".join(out)


def _load_tables(doc: Mapping[str, Any]) -> list[str]:
    """With a ladder of concurrencies: a table per concurrency (each point's tok/s, range, accept length and
    speedup there; ``*`` the best at that concurrency). The table above is the ladder's first concurrency."""
    from tabulate import tabulate

    out = []
    for bl in doc.get("best_by_load") or ():
        c = load_key(bl)
        rows = []
        for i, p in enumerate(doc["points"]):
            ld = next((x for x in p.get("loads") or () if load_key(x) == c), None)
            if ld is None:
                continue
            t = ld["tokens_per_s"]
            rows.append([f"{'*' if i == bl['best'] else ''}{i}", p.get("label", ""), _fmt(ld.get("accept_len"), 2),
                         _fmt(t["median"]), f"{_fmt(t['min'])}-{_fmt(t['max'])}",
                         f"{ld['speedup']:.3f}x" if ld.get("speedup") is not None else "-"])
        at = (f"at {c[0]} request(s) at a time ({CLIENT}; * the best at this concurrency):" if c[1] is None
              else f"at {c[1]:g} request(s) per second (Poisson arrivals, at most {c[0]} in flight; {CLIENT}; * the "
              "best at this load):")
        out += ["", at,
                tabulate(rows, headers=["#", "point", "accept", CLIENT, "range", "speedup"], tablefmt="simple",
                         disable_numparse=True)]
    return out


def _count(point: Mapping[str, Any]) -> int:
    """How many runs (a live sweep: windows) measured a point."""
    return point["windows"] if "windows" in point else point["runs"]


CSV_COLUMNS = ["index", "label", "status", "runs", "accept_len", "draft_p50_ms", "verify_p50_ms",
               "draft_extend_p50_ms", "cycle_p50_ms", "tokens_per_s_median", "tokens_per_s_min",
               "tokens_per_s_max", "speedup", "best", "baseline", "within_noise", "flags", "env", "error"]


def render_csv(doc: Mapping[str, Any]) -> str:
    import csv

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for i, p in enumerate(doc["points"]):
        ph = p.get("phases_p50") or {}
        tps = p.get("tokens_per_s") or {}

        def c(x: Any) -> Any:
            return "" if x is None else x

        w.writerow([i, p.get("label", ""), p["status"], _count(p), c(p.get("accept_len")), c(ph.get("draft")),
                    c(ph.get("verify")), c(ph.get("draft_extend")), c(ph.get("cycle")), c(tps.get("median")),
                    c(tps.get("min")), c(tps.get("max")), c(p.get("speedup")), int(i == doc.get("best")),
                    int(i == doc.get("baseline")), int(bool(p.get("within_noise"))),
                    json.dumps(p["flags"], sort_keys=True), json.dumps(p["env"], sort_keys=True),
                    c(p.get("error"))])
    return buf.getvalue()
