"""What a report is made of: the result types ``aggregate`` returns (``ReportResult``, its ``GroupStats`` and
``RunInfo``) with their JSON forms, and the labels people read them by (``key_label``, ``compact_flags``,
``local_time``).

Pure values: the renderers (``render``, ``comparison``, ``predict``) import what they show from here, never from
the scan or the aggregation that fills them (the charts read the JSON forms).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Sequence

from eaglepatch.report.stats import round_json

#: The values ``aggregate(by=...)`` groups records by, besides mode and run.
BY_CHOICES: tuple[str, ...] = ("bs", "rank", "host")


@dataclass(frozen=True, slots=True)
class Stats:
    """Summary of one series of milliseconds: count, mean, p50/p90/p99 (numpy-linear), max and the total."""

    n: int
    mean: float
    p50: float
    p90: float
    p99: float
    max: float
    total: float

    def to_json(self) -> dict[str, Any]:
        """Return ``{"mean", "p50", "p90", "p99", "max"}`` rounded to 4 decimals (the docs/contract.md shape)."""
        return {
            "mean": round_json(self.mean),
            "p50": round_json(self.p50),
            "p90": round_json(self.p90),
            "p99": round_json(self.p99),
            "max": round_json(self.max),
        }


@dataclass(frozen=True, slots=True)
class PhaseStats:
    """One phase of a group: stats over the cycles in which it ran, and its share of the group's cycle time.

    ``host``/``host_share`` are the same over the host clock (``events`` timer); ``None`` without host times.
    """

    name: str
    stats: Stats
    share: float
    host: Stats | None = None
    host_share: float | None = None

    def to_json(self) -> dict[str, Any]:
        """Return ``{"mean","p50","p90","p99","max","share"}`` plus the extra keys ``"n"`` and ``"host"``
        (``{"n","mean","p50","p90","p99","max","share"}`` or ``None``)."""
        out = self.stats.to_json()
        out["share"] = round_json(self.share)
        out["n"] = self.stats.n
        if self.host is not None:
            host = self.host.to_json()
            host["share"] = round_json(self.host_share)
            host["n"] = self.host.n
            out["host"] = host
        else:
            out["host"] = None
        return out


@dataclass(frozen=True, slots=True)
class BetweenStats:
    """Gaps between one cycle's end and the next cycle's start in the same process, in milliseconds."""

    n: int
    mean: float
    p50: float
    p90: float
    total: float

    def to_json(self) -> dict[str, Any]:
        """Return ``{"mean","p50","p90"}`` (docs/contract.md) plus the extra key ``"n"``."""
        return {
            "mean": round_json(self.mean),
            "p50": round_json(self.p50),
            "p90": round_json(self.p90),
            "n": self.n,
        }


@dataclass(frozen=True, slots=True)
class Acceptance:
    """A decode group's acceptance profile, from the records' per-request counts (``accepts``/``accept_hist``):
    ``hist`` holds ``(tokens, request-cycles)`` pairs, tokens ascending (a request-cycle is one request in one
    cycle; its tokens include the bonus token), ``samples`` their total."""

    samples: int
    hist: tuple[tuple[int, int], ...]

    @property
    def at_least(self) -> tuple[float, ...]:
        """``at_least[i]``: the share of request-cycles that produced at least ``i + 1`` tokens (so their sum is the
        mean tokens per request-cycle); up to the largest count seen."""
        if not self.samples or not self.hist:
            return ()
        top = self.hist[-1][0]
        more = [0] * (top + 2)  # more[t]: request-cycles with exactly t tokens, then summed from the top
        for t, n in self.hist:
            more[t] += n
        for t in range(top - 1, -1, -1):
            more[t] += more[t + 1]
        return tuple(more[i + 1] / self.samples for i in range(top))

    @property
    def rates(self) -> tuple[float | None, ...]:
        """The per-position rates ``at_least[i] / at_least[i - 1]`` for ``i >= 1`` (the share of request-cycles
        that got past position ``i`` among those that reached it; ``None`` where none reached it)."""
        al = self.at_least
        return tuple(al[i] / al[i - 1] if al[i - 1] else None for i in range(1, len(al)))

    def mean_tokens(self, cap: int | None = None) -> float:
        """The mean tokens per request-cycle, each count capped at ``cap`` tokens (``None``: not capped): what a
        run with ``cap - 1`` draft steps would have produced from the same draft guesses."""
        if not self.samples:
            return 0.0
        return sum(min(t, cap) * n if cap is not None else t * n for t, n in self.hist) / self.samples

    def to_json(self) -> dict[str, Any]:
        """``{"samples", "at_least"}`` (docs/contract.md) plus the extra key ``"rates"``."""
        return {"samples": self.samples, "at_least": [round_json(x) for x in self.at_least],
                "rates": [round_json(x) for x in self.rates]}

    @staticmethod
    def from_json(d: dict[str, Any]) -> "Acceptance":
        """The inverse of ``to_json`` (counts rebuilt from the rounded shares)."""
        n = int(d.get("samples") or 0)
        al = list(d.get("at_least") or ()) + [0.0]
        hist = []
        for i in range(len(al) - 1):
            c = round(n * (al[i] - al[i + 1]))
            if c > 0:
                hist.append((i + 1, c))
        return Acceptance(samples=n, hist=tuple(hist))


def key_label(key: Sequence[tuple[str, Any]]) -> str:
    """A group key for people, without its ``run``: ``""``, ``"bs=1"``, ``"bs=? spec=steps=3,topk=1,..."``."""
    return " ".join(f"{k}={'?' if v is None else v}" for k, v in key if k != "run")


def local_time(epoch: float | None) -> str:
    """``epoch`` as local time, ``"2026-12-01 15:46:44"``; ``"?"`` when unknown."""
    if epoch is None:
        return "?"
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))
    except (OverflowError, OSError, ValueError):
        return "?"


# Speculative flags shown first in a run's compact flags, with their short names.
_FLAG_SHORT: tuple[tuple[str, str], ...] = (
    ("speculative-algorithm", ""),
    ("speculative-draft-model-path", "draft"),
    ("speculative-num-steps", "steps"),
    ("speculative-eagle-topk", "topk"),
    ("speculative-num-draft-tokens", "draft_tokens"),
)


def compact_flags(flags: Sequence[tuple[str, Any]] | dict[str, Any]) -> str:
    """A run's speculative flags in one short string: ``"EAGLE3 draft=llama-eagle3 steps=3 topk=1
    draft_tokens=4"``.

    Only the ``speculative-*`` flags show (the JSON's ``flags`` keep them all). The algorithm's value stands
    alone; the draft model path shows by its last component; the others lose their ``speculative-`` prefix
    (``name=value``; after the well-known ones, by name). A flag whose value is ``true`` shows by its name alone,
    ``false``/``null`` ones are left out."""
    items = dict(flags)
    out: list[str] = []

    def one(name: str, short: str, v: Any) -> None:
        if v is None or v is False:
            return
        if v is True:
            out.append(short or name)
            return
        text = str(v)
        if name == "speculative-draft-model-path":
            text = text.rstrip("/").rsplit("/", 1)[-1] or text
        out.append(text if not short else f"{short}={text}")

    for name, short in _FLAG_SHORT:
        if name in items:
            one(name, short, items.pop(name))
    for name in sorted(items):
        if name.startswith("speculative-"):
            one(name, name[len("speculative-"):], items[name])
    return " ".join(out)


@dataclass(frozen=True, slots=True)
class RunInfo:
    """One run (a server launch with one patch configuration): ``id`` (a record's ``"run"``, or
    ``"file:<basename>"`` for records without one), ``start`` (epoch seconds: the earliest ``t`` of its header
    lines and records; ``None`` when unknown), ``timer`` (``"sync"``, ``"events"``, ``"cpu"``, ``"auto"``,
    several joined with ``"+"``, or ``None``), ``flags`` (from its header lines, as ``(name, value)`` pairs in
    the header's order) and ``records`` (its valid records, those ``skip`` dropped included)."""

    id: str
    start: float | None
    timer: str | None = None
    flags: tuple[tuple[str, Any], ...] = ()
    records: int = 0
    runtime: str | None = None  # its header's "runtime": the runtime module that wrote it, inside its install
    sources: tuple[str, ...] = ()  # the SOURCEs its lines came from, when the report reads several

    def flags_dict(self) -> dict[str, Any]:
        """The flags as a dict."""
        return dict(self.flags)

    def start_label(self) -> str:
        """The start as local time, ``"2026-12-01 15:46:44"`` (``"?"`` when unknown)."""
        return local_time(self.start)

    def title(self) -> str:
        """The run's header line: ``"run 2026-12-01 15:46:44  EAGLE3 steps=3 topk=1 draft_tokens=4  timer=events
        (id ...)"`` (no flags part without header flags, ``timer=?`` when unknown)."""
        parts = [f"run {self.start_label()}"]
        flags = compact_flags(self.flags)
        if flags:
            parts.append(flags)
        parts.append(f"timer={self.timer or '?'}")
        parts.append(f"(id {self.id})")
        if self.sources:
            parts.append(f"from {', '.join(self.sources)}")
        return "  ".join(parts)

    def short(self) -> str:
        """One line for lists: ``"ID (2026-12-01 15:46:44, timer=sync, EAGLE3 steps=3)"``."""
        flags = compact_flags(self.flags)
        return f"{self.id} ({self.start_label()}, timer={self.timer or '?'}{', ' + flags if flags else ''})"

    def to_json(self) -> dict[str, Any]:
        """``{"id", "start", "timer", "flags", "records"}`` (``records`` is an extra key), and ``"sources"`` when
        the report read several."""
        doc = {"id": self.id, "start": self.start, "timer": self.timer, "flags": self.flags_dict(),
               "records": self.records}
        if self.sources:
            doc["sources"] = list(self.sources)
        return doc

    @staticmethod
    def from_json(d: dict[str, Any]) -> "RunInfo":
        """The inverse of ``to_json``."""
        return RunInfo(id=d["id"], start=d.get("start"), timer=d.get("timer"),
                       flags=tuple((d.get("flags") or {}).items()), records=d.get("records", 0),
                       sources=tuple(d.get("sources") or ()))


@dataclass(frozen=True, slots=True)
class GroupStats:
    """The statistics of one group, keyed by ``mode`` and ``key``.

    ``key`` is ``()`` without ``--by``, else ``(("bs", 4),)`` and the like (a tuple so the value stays hashable;
    ``key_dict()`` gives the JSON form); then ``("spec", "steps=3,topk=1,draft_tokens=4")`` where the spec varies
    within the group (``None`` for its records without a spec), then ``("run", ID)`` where the result holds
    several runs (not merged). ``phases`` is in canonical order. ``accept_len``, ``tokens_per_s`` and
    ``wall_tokens_per_s`` are ``None`` when no record of the group has ``accepted``; ``between`` is ``None``
    when no gap was measured. ``tokens`` is the sum of ``accepted``. ``run`` is the id of the group's run,
    also when the key leaves it out (one run); ``None`` when runs were merged or it is not known.

    ``n`` counts the group's cycles: a record that stands for ``every`` cycles (apply --every N) counts as that
    many. ``records`` counts its records (the samples every statistic is computed from; ``None``: as many as
    ``n``, the logs of every cycle); ``record_count`` gives it either way.
    """

    mode: str
    key: tuple[tuple[str, Any], ...]
    n: int
    cycle: Stats
    phases: tuple[PhaseStats, ...]
    accept_len: float | None
    tokens_per_s: float | None
    between: BetweenStats | None
    wall_tokens_per_s: float | None
    tokens: float
    host_cycle: Stats | None = None
    run: str | None = None
    acceptance: Acceptance | None = None
    # the wall time per cycle over the records with accepted (host clock: the cycle plus the gap before it), how
    # many such records, and the wall tok/s of up to 10 successive windows of them (the spread over the run)
    cadence_ms: float | None = None
    accepted_cycles: int = 0
    window_tokens_per_s: tuple[float, ...] = ()
    spec: str | None = None  # the records' speculative settings under adaptive speculation, also when not in key
    ranks: int = 1  # the ranks whose records the group holds (TP: each rank times every cycle)
    tp: int = 1  # the most ranks of one data-parallel group (the TP size: ranks that record the same batches)
    dp: int = 1  # the data-parallel groups (records' "dp"; one without): their tok/s add
    records: int | None = None  # the records the group holds, where fewer than its cycles (None: n)

    @property
    def record_count(self) -> int:
        """The records the group holds: the samples of its statistics (``n`` less the untimed cycles of apply
        --every N)."""
        return self.n if self.records is None else self.records

    def ranks_label(self) -> str:
        """``"4 ranks (TP 2 x DP 2)"``; ``""`` for one rank."""
        if self.ranks <= 1:
            return ""
        return f"{self.ranks} ranks (TP {self.tp} x DP {self.dp})"

    def key_dict(self) -> dict[str, Any]:
        """Return the key as a dict: ``{}`` or e.g. ``{"bs": 1}`` (``{"bs": 1, "run": "..."}`` with runs)."""
        return dict(self.key)

    def key_label(self) -> str:
        """Return the key for people, the run left out (run header lines and the CSV ``run`` column show it):
        ``""`` or e.g. ``"bs=1"``, ``"bs=1 spec=steps=3,topk=1,draft_tokens=4"``."""
        return key_label(self.key)

    def phase(self, name: str) -> PhaseStats | None:
        """Return the named phase's stats, or ``None`` when that phase never ran in this group."""
        for p in self.phases:
            if p.name == name:
                return p
        return None

    @property
    def has_host(self) -> bool:
        """Whether host-clock times (``events`` timer) exist for this group."""
        return self.host_cycle is not None

    def to_json(self) -> dict[str, Any]:
        """Return the docs/contract.md group object; extra keys: ``"host_cycle_ms"`` (stats or ``None``) and per phase
        ``"n"`` and ``"host"``; ``between_ms`` has an extra ``"n"`` (those ``n`` count records); ``"records"`` after
        ``"n"`` where the group holds fewer records than cycles (apply --every N)."""
        return {
            "mode": self.mode,
            "key": self.key_dict(),
            "n": self.n,
            **({"records": self.records} if self.records is not None and self.records != self.n else {}),
            "cycle_ms": self.cycle.to_json(),
            "phases": {p.name: p.to_json() for p in self.phases},
            "accept_len": round_json(self.accept_len),
            "tokens_per_s": round_json(self.tokens_per_s),
            "between_ms": self.between.to_json() if self.between is not None else None,
            "wall_tokens_per_s": round_json(self.wall_tokens_per_s),
            "host_cycle_ms": self.host_cycle.to_json() if self.host_cycle is not None else None,
            **({"acceptance": self.acceptance.to_json()} if self.acceptance is not None else {}),
        }


@dataclass(frozen=True)
class ReportResult:
    """What ``aggregate`` returns.

    ``records`` counts every valid record of the selected runs read, *including* the ones ``skip`` dropped (so
    ``records`` minus the sum of the groups' ``record_count`` is the number skipped); ``skipped_lines`` counts the lines
    that did not parse (in all files, whatever the selection). ``groups`` is ordered by run (oldest first), then
    decode first, then prefill, then other modes; within a mode by key (numbers ascending, then strings, null
    last). ``runs`` are the selected runs, oldest first; ``merged`` is true when ``merge_runs`` put several of
    them into the same groups; ``other_runs`` are the runs of the logs that the selection left out; ``unread``
    the notes on the files given that were not read (no regular file: a FIFO, a device, a loop of links).
    """

    sources: tuple[str, ...]
    records: int
    skipped_lines: int
    groups: tuple[GroupStats, ...]
    by: str | None = None
    skip: int = 0
    runs: tuple[RunInfo, ...] = ()
    merged: bool = False
    other_runs: tuple[RunInfo, ...] = ()
    unread: tuple[str, ...] = ()
    skipped_cycles: int = 0  # the cycles that ``skip`` dropped (a record of "every": N stands for N)

    @property
    def has_host(self) -> bool:
        """Whether any group carries host-clock times."""
        return any(g.has_host for g in self.groups)

    def group(self, mode: str, **key: Any) -> GroupStats | None:
        """Return the group with this mode and key (e.g. ``group("decode", bs=4)``,
        ``group("decode", run="abc")`` with several runs), or ``None``."""
        for g in self.groups:
            if g.mode == mode and dict(g.key) == key:
                return g
        return None

    def run_groups(self, run: str | None) -> tuple[GroupStats, ...]:
        """The groups of one run (by id), in order. The groups are put by run once (a report of many runs asks for
        each run's: linear in the groups, not their number times the runs')."""
        by_run = self.__dict__.get("_by_run")
        if by_run is None:
            by_run = {}
            for g in self.groups:
                by_run.setdefault(g.run, []).append(g)
            by_run = {r: tuple(gs) for r, gs in by_run.items()}
            object.__setattr__(self, "_by_run", by_run)  # a cache, no field: not in repr, ==, or to_json
        return by_run.get(run, ())

    def merge_warning(self) -> str | None:
        """``"merged 3 runs: ...; their figures blend"`` when ``merged``, else ``None``."""
        if not self.merged:
            return None
        timers = {r.timer for r in self.runs}
        flags = {repr(r.flags) for r in self.runs if r.flags}  # a run without header flags: unknown
        what = []
        if len(timers) > 1:
            what.append(f"{len(timers)} timers")
        if len(flags) > 1:
            what.append(f"{len(flags)} flag sets")
        differ = f" ({' and '.join(what)})" if what else ""
        return (f"merged {len(self.runs)} runs{differ}: " + ", ".join(r.short() for r in self.runs)
                + "; their figures blend")

    def to_json(self, lazy: bool = False) -> dict[str, Any]:
        """Return exactly the docs/contract.md ``report --json`` object (plus the extra keys documented on
        ``GroupStats.to_json``); floats rounded to 4 decimals. Then ``"runs"`` (``RunInfo.to_json``, oldest
        first), and, only when several runs were merged, ``"merged": true`` and ``"warnings": [text]``.
        ``lazy``: ``groups`` and ``runs`` are ``jsontext.Items``, each item made as it is written (``indented``)."""
        if lazy:
            from eaglepatch.report.jsontext import Items

            groups: Any = Items(g.to_json() for g in self.groups)
            runs: Any = Items(r.to_json() for r in self.runs)
        else:
            groups = [g.to_json() for g in self.groups]
            runs = [r.to_json() for r in self.runs]
        out: dict[str, Any] = {
            "sources": list(self.sources),
            "records": self.records,
            "skipped_lines": self.skipped_lines,
            "groups": groups,
            "runs": runs,
        }
        warning = self.merge_warning()
        if warning is not None:
            out["merged"] = True
            out["warnings"] = [warning]
        return out

    @staticmethod
    def from_json(doc: dict[str, Any]) -> "ReportResult":
        """A ``ReportResult`` rebuilt from ``to_json``'s dict (e.g. ``bench``'s stored timings), for the
        renderers: the JSON's rounding stays, a stat's ``total`` is ``mean * n``, ``tokens`` is 0; documents
        without ``"runs"`` (older ones) give no runs."""

        def stats(d: dict[str, Any] | None, n: int) -> Stats | None:
            if not d:
                return None
            k = d.get("n", n)
            return Stats(n=k, mean=d["mean"], p50=d["p50"], p90=d["p90"], p99=d["p99"], max=d["max"],
                         total=(d["mean"] or 0.0) * k)

        runs = tuple(RunInfo.from_json(r) for r in doc.get("runs") or ())
        merged = bool(doc.get("merged"))
        only = runs[0].id if len(runs) == 1 else None
        groups = []
        for g in doc["groups"]:
            nrec = g.get("records", g["n"])
            cyc = stats(g["cycle_ms"], nrec)
            phases = []
            for name, p in g["phases"].items():
                host = p.get("host")
                phases.append(PhaseStats(name=name, stats=stats(p, p.get("n", nrec)),  # type: ignore[arg-type]
                                         share=p["share"], host=stats(host, nrec) if host else None,
                                         host_share=host.get("share") if host else None))
            b = g.get("between_ms")
            between = (BetweenStats(n=b.get("n", 0), mean=b["mean"], p50=b["p50"], p90=b["p90"],
                                    total=(b["mean"] or 0.0) * b.get("n", 0)) if b else None)
            key = tuple(g["key"].items())
            run = None if merged else g["key"].get("run", only)
            acceptance = Acceptance.from_json(g["acceptance"]) if g.get("acceptance") else None
            groups.append(GroupStats(mode=g["mode"], key=key, n=g["n"], records=g.get("records"),
                                     cycle=cyc,  # type: ignore[arg-type]
                                     phases=tuple(phases), accept_len=g["accept_len"],
                                     tokens_per_s=g["tokens_per_s"], between=between,
                                     wall_tokens_per_s=g["wall_tokens_per_s"], tokens=0.0,
                                     host_cycle=stats(g.get("host_cycle_ms"), nrec), run=run,
                                     acceptance=acceptance))
        return ReportResult(sources=tuple(doc.get("sources") or ()), records=doc["records"],
                            skipped_lines=doc["skipped_lines"], groups=tuple(groups), runs=runs, merged=merged)

