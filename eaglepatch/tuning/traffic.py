"""The load against the server's own traffic (issues 39, 40): every request eaglepatch's load sends carries an sglang
``rid`` starting ``eaglepatch-`` (``load_http.LOAD_RID``), and the patch's runtime writes, in a decode record whose
batch held requests that are not eaglepatch's, ``"others": N`` and, when the batch held both kinds (at most 256
requests), ``"others_at": [i, ...]``: their places in batch order, as ``accepts`` lists the tokens each request
produced. From those records:

- ``split``: the decode cycles that carried others' requests, and the acceptance of each side (the load's
  request-cycles against the traffic's), counted on one rank per data-parallel group (tensor-parallel ranks of one
  batch hold the same requests);
- ``compare``: whether the two accept lengths differ beyond their spreads, and the sentence that says so;
- ``others_since``: whether the server's records of the last minute hold others' requests (a restart sweep refuses
  to stop such a server without ``--allow-shared-traffic``).

Pure (files in, dicts out). Records are read as the report reads them (docs/safety.md, "Hostile logs"): regular
files only (``report.files.open_log``: a FIFO or a device is skipped), in bounded pieces (``report.reader.blocks``: a
line over the report's ``LINE_CAP`` is skipped unread); a window without a single line that names ``"others"`` is
decided without parsing the rest.
"""

from __future__ import annotations

import json
import math
from typing import Any, Iterable, Iterator, Sequence

from eaglepatch.report.files import open_log
from eaglepatch.report.reader import PIECE, blocks

OTHERS = b'"others"'
DECODE = b'"decode"'
MIN_SAMPLES = 50  # request-cycles each side needs before their acceptance is compared
MIN_GAP = 0.05  # and a relative gap at least this large (request-cycles of one request are not independent)


def _int(x: Any) -> bool:
    return type(x) is int and x >= 0


class _Side:
    """Request-cycles of one side: their count, tokens, sum of squares and histogram (tokens -> request-cycles)."""

    def __init__(self) -> None:
        self.samples, self.tokens, self.squares = 0, 0, 0
        self.hist: dict[int, int] = {}

    def add(self, tokens: int, n: int = 1) -> None:
        self.samples += n
        self.tokens += tokens * n
        self.squares += tokens * tokens * n
        self.hist[tokens] = self.hist.get(tokens, 0) + n

    def accept_len(self) -> float | None:
        return round(self.tokens / self.samples, 4) if self.samples else None

    def spread(self) -> float | None:
        """Twice the standard error of the mean accept length (the request-cycles taken as independent)."""
        if self.samples < 2:
            return None
        mean = self.tokens / self.samples
        var = max(0.0, (self.squares - self.samples * mean * mean) / (self.samples - 1))
        return 2 * math.sqrt(var / self.samples)

    def acceptance(self) -> dict[str, Any] | None:
        """``{"samples", "at_least"}``: the share of request-cycles that produced at least i + 1 tokens."""
        if not self.samples:
            return None
        top = max(self.hist)
        at_least, left = [], self.samples
        for k in range(1, top + 1):
            at_least.append(round(left / self.samples, 4))
            left -= self.hist.get(k, 0)
        return {"samples": self.samples, "at_least": at_least}


def _lines(files: Sequence[str], needle: bytes) -> Iterator[bytes]:
    """The lines of ``files`` that hold ``needle``: regular files only, in bounded pieces, a line over the cap
    skipped unread; a file that cannot be read is skipped."""
    for path in files:
        try:
            f, _why = open_log(path)
            if f is None:
                continue
            with f:
                for data, end in blocks(f, PIECE):
                    if data is None:
                        continue
                    if end < len(data):
                        data = data[:end]
                    if needle in data:  # a block of whole lines without it: none split
                        for line in data.split(b"\n"):
                            if needle in line:
                                yield line
        except OSError:
            continue


def _decode_lines(files: Sequence[str], window: tuple[float, float] | None, pids: set[int] | None,
                  need_others: bool) -> list[dict[str, Any]] | None:
    """The decode records of ``files`` inside ``window`` (and of ``pids``); None when ``need_others`` and no line of
    the window names ``"others"`` (the usual case: decided by a byte search, nothing parsed)."""
    if need_others:
        for line in _lines(files, OTHERS):
            rec = _parse(line)
            if rec is not None and _inside(rec, window, pids) and rec.get("others"):
                break
        else:
            return None
    out = []
    for line in _lines(files, DECODE):
        rec = _parse(line)
        if rec is not None and _inside(rec, window, pids):
            out.append(rec)
    return out


def _parse(line: bytes) -> dict[str, Any] | None:
    try:
        rec = json.loads(line)
    except ValueError:
        return None
    if type(rec) is not dict or rec.get("v") != 1 or rec.get("mode") != "decode" or "kind" in rec:
        return None
    return rec


def _inside(rec: dict[str, Any], window: tuple[float, float] | None, pids: set[int] | None) -> bool:
    t = rec.get("t")
    if type(t) not in (int, float):
        return False
    if window is not None and not window[0] <= t <= window[1]:
        return False
    return pids is None or rec.get("pid") in pids


def split(records: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The decode cycles of ``records`` that carried requests not eaglepatch's, and each side's acceptance:
    ``{"cycles", "decode_cycles", "load": {"accept_len", "acceptance", "spread"}, "traffic": {...}}``. One rank per
    (run, node, dp) group counts (the one with the most decode records): TP ranks of one batch see the same
    requests. A batch of both kinds without ``others_at`` (above 256 requests) or without ``accepts`` counts as a
    cycle with traffic, its tokens on neither side."""
    by_rank: dict[tuple[Any, ...], dict[Any, list[dict[str, Any]]]] = {}
    for r in records:
        key = (r.get("run"), r.get("host"), r.get("node"), r.get("dp"))
        by_rank.setdefault(key, {}).setdefault((r.get("pid"), r.get("rank")), []).append(r)
    load, traffic = _Side(), _Side()
    cycles = decode = 0
    for ranks in by_rank.values():
        for r in max(ranks.values(), key=len):
            decode += 1
            bs = r.get("bs")
            others = r.get("others")
            others = others if _int(others) else 0
            accs = r.get("accepts")
            accs = accs if type(accs) is list and all(_int(x) for x in accs) else None
            hist = r.get("accept_hist") if type(r.get("accept_hist")) is dict else None
            if others:
                cycles += 1
            if others and bs is not None and others < bs:  # both kinds in the batch
                at = r.get("others_at")
                if accs is None or type(at) is not list or len(accs) != bs:
                    continue
                theirs = {i for i in at if _int(i)}
                for i, x in enumerate(accs):
                    (traffic if i in theirs else load).add(x)
                continue
            side = traffic if others else load
            if accs is not None:
                for x in accs:
                    side.add(x)
            elif hist is not None:
                for k, n in hist.items():
                    if str(k).isdigit() and _int(n):
                        side.add(int(k), n)
            elif _int(r.get("accepted")) and _int(bs) and bs:
                # no per-request counts: the cycle's mean, each of its request-cycles at it (no spread from these)
                side.samples += bs
                side.tokens += r["accepted"]
                side.squares += r["accepted"] ** 2 / bs
    return {"cycles": cycles, "decode_cycles": decode, "load": _side_json(load), "traffic": _side_json(traffic)}


def _side_json(s: _Side) -> dict[str, Any]:
    sp = s.spread()
    return {"samples": s.samples, "accept_len": s.accept_len(), "acceptance": s.acceptance() if s.hist else None,
            "spread": None if sp is None else round(sp, 4)}


def of_files(files: Sequence[str], window: tuple[float, float] | None, pids: set[int] | None = None
             ) -> dict[str, Any] | None:
    """``split`` of the decode records of ``files`` inside ``window``; None when none carried others' requests."""
    recs = _decode_lines(files, window, pids, need_others=True)
    if recs is None:
        return None
    doc = split(recs)
    return doc if doc["cycles"] else None


def compare(doc: dict[str, Any]) -> str | None:
    """The sentence that says the load's and the traffic's acceptance differ beyond their spreads (both with
    ``MIN_SAMPLES`` request-cycles or more, the gap over both spreads and at least ``MIN_GAP`` of the larger), else
    None."""
    a, b = doc.get("load") or {}, doc.get("traffic") or {}
    la, ta = a.get("accept_len"), b.get("accept_len")
    if la is None or ta is None or a.get("samples", 0) < MIN_SAMPLES or b.get("samples", 0) < MIN_SAMPLES:
        return None
    gap = abs(la - ta)
    if gap <= (a.get("spread") or 0.0) + (b.get("spread") or 0.0) or gap < MIN_GAP * max(la, ta):
        return None
    return (f"this load accepts {la:.2f} tokens a cycle per request, the server's own traffic {ta:.2f} (its "
            f"{doc['cycles']} decode cycles with requests not eaglepatch's): the best step count for the load may "
            "not be yours; give --prompts a sample of your traffic")


def shared_note(doc: dict[str, Any]) -> str:
    """The note of a window whose traffic's acceptance is that of the load (or too little to tell)."""
    t = doc["traffic"]
    acc = "" if t["accept_len"] is None else f", accept length {t['accept_len']:.2f} against the load's " + (
        "-" if doc["load"]["accept_len"] is None else f"{doc['load']['accept_len']:.2f}")
    return (f"{doc['cycles']} of the window's {doc['decode_cycles']} decode cycles carried requests that are not "
            f"this load's (the server's own traffic{acc}): the figures of the window are of both")


def traffic_json(doc: dict[str, Any]) -> dict[str, Any]:
    """bench --json's ``"traffic"``: ``{"cycles", "accept_len", "acceptance"}`` (and the load's side of the same
    records, ``"load"``, and whether they differ beyond their spreads, ``"differs"``)."""
    t = doc["traffic"]
    return {"cycles": doc["cycles"], "decode_cycles": doc["decode_cycles"], "accept_len": t["accept_len"],
            "acceptance": t["acceptance"], "spread": t["spread"],
            "load": {k: doc["load"][k] for k in ("accept_len", "acceptance", "spread")},
            "differs": compare(doc) is not None}


def others_since(files: Sequence[str], since: float, pids: set[int] | None = None) -> int:
    """Decode cycles since ``since`` (host clock) whose batch held requests not eaglepatch's."""
    doc = of_files(files, (since, float("inf")), pids)
    return 0 if doc is None else doc["cycles"]


def refusal(name: str, cycles: int, where: str) -> str:
    """The one line a restart sweep exits 2 with on a server with others' traffic."""
    return (f"{name}: the server is serving requests that are not this sweep's ({cycles} decode cycle(s) {where} "
            "carried them): a restart sweep would stop them; nothing was changed; give --allow-shared-traffic to "
            "sweep it anyway")
