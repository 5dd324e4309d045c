"""The scan's batch path: a file read in pieces of whole lines, each piece decoded at once by msgspec into typed
records, and the records added to the accumulators a column at a time (``eaglepatch.report.columns``), so that
the per-record work is done by C loops (list comprehensions, ``struct.pack``, ``sum``) rather than by Python
statements: about twice as quick as the line loop.

It gives exactly what the line-by-line loop (``eaglepatch.report.lines``) gives, and leaves to that loop whatever
it cannot vouch for:

* Records decode into ``Record`` structs whose types are the record rules of ``eaglepatch.report.record`` made
  stricter: ``v`` the integer 1; numbers ints or finite floats within their bounds (``record``: ``t``, durations,
  counts), never booleans; ``pid``/``rank`` ints; ``mode`` ``decode`` or ``prefill``; ``run`` a non-empty string;
  ``accepts`` whole numbers from 0 to ``MAX_TOKENS``, at most ``MAX_ACCEPTS`` of them (checked against ``bs`` and
  the spec, as ``accept_hist`` objects are, before anything is added: ``columns.plan``); phases
  of the names the decoder knows (``CANONICAL_PHASES``, and the names the line loop found in a recipe of one's
  own); no ``kind``. A record that decodes is thus one the line loop takes, with the same values (msgspec and
  json read the same numbers, and the later of two equal keys wins in both); a line that does not decode goes to
  the line loop (msgspec names the record or byte where a piece failed; the lines around it are decoded again).
  Run header lines (``"kind"``) are such lines, and so are records with ``"every"`` (apply --every N: a log N times
  shorter, read line by line; ``cut`` hands them over, the decoders made for a process refuse them).
* A piece is decoded as the JSON array its lines make when each newline becomes a comma: anything but one JSON
  value per line (two records on a line, a record over two lines, a blank line) does not decode. A piece with a
  ``\\r`` (a line break to Python's universal newlines, whitespace to JSON) goes to the line loop whole.
* While the records of one process and run come, they are decoded by a decoder made for that process, run and
  timer (``Literal`` fields): a record of another one fails to decode, so the records of one decoder need no
  check that they belong together, and their strings cost nothing to decode. Otherwise (a ``spec`` that varies,
  several processes in a file) a generic decoder's records are cut where the process, ``run`` or ``spec`` changes;
  where that leaves parts of a few records (a spec of its own every record or two), the line loop is as quick and
  reads the next pieces.
* Records are added a part at a time (one process, run and spec: the line loop's state changes only between
  parts). Everything that can refuse a part (its spec, accept_hist objects, the accepts lists, records with and
  without ``host_cycle_ms`` mixed) is checked before anything is added; a refused part goes to the line loop.
* The sums (cycle time of the records with accepted, wall time, gaps, tokens) are added in record order, one at a
  time, as the line loop adds them: ``sum`` up to Python 3.11, ``functools.reduce`` from 3.12 on (where ``sum``
  of floats compensates the rounding).
"""

from __future__ import annotations

import math
import re
from itertools import chain
from typing import Any, Optional, Union

from eaglepatch.report.columns import apply, plan
from eaglepatch.report.groups import Acc
from eaglepatch.report.reader import blocks
from eaglepatch.report.record import (
    MAX_ACCEPTS,
    MAX_COUNT,
    MAX_MS,
    MAX_T,
    MAX_TOKENS,
    BadLine,
    accept_cap,
    check_accepts,
    hist_counts,
)
from eaglepatch.report.stats import CANONICAL_PHASES

try:
    import msgspec as _msgspec
except ImportError:  # pragma: no cover - msgspec is a dependency; the line loop stands in without it
    _msgspec = None  # type: ignore[assignment]
    _UNSET: Any = object()
else:
    _UNSET = _msgspec.UNSET

PIECE = 1 << 16  # bytes read and decoded at a time (larger buffers cost more to allocate than they save)
BATCH = 2048  # records added together (more: the garbage collector walks the waiting records' lists more often)
_SHORT = 16  # records a part holds on average, at least, for the generic decoder's records to be batched
_SKIP = 16  # pieces then left to the line loop before the batch path tries again
_TRIES = 4  # lines of a piece that may fail to decode before the rest of the piece goes to the line loop
_MAX_PHASES = 32  # phase names a decoder knows at most
_MAX_DECODERS = 64  # decoders made for a process, run and timer that are kept
_AT_RECORD = re.compile(r"at `\$\[(\d+)\]")
_AT_BYTE = re.compile(r"\(byte (\d+)\)")


def _record_type(phases: tuple[str, ...], key: tuple[Any, ...] | None) -> Any:
    """The ``Record`` struct type: phases (and host phases) of the names ``phases``; for ``key`` (host, pid,
    rank, run, timer, dp, node) only records of that process, run, timer, data-parallel group and node, and no
    spec."""
    from typing import Annotated, Literal

    from msgspec import UNSET, Meta, UnsetType, defstruct

    def bounded(most: float) -> Any:  # a number from 0 to most (record.py's bounds), as an int or a float
        return Union[Annotated[int, Meta(ge=0, le=int(most))], Annotated[float, Meta(ge=0.0, le=float(most))]]

    ms = bounded(MAX_MS)
    count = bounded(MAX_COUNT)
    whole = Annotated[int, Meta(ge=0, le=MAX_COUNT)]
    # a phase the record does not have is None (a phase that is null does not decode)
    ph = defstruct("Phases", [(f"p{i}", ms, None) for i in range(len(phases))],
                   rename={f"p{i}": name for i, name in enumerate(phases)}, forbid_unknown_fields=True, gc=False)
    if key is None:
        who: list[Any] = [("host", str), ("pid", whole), ("rank", whole), ("dp", Optional[whole], None),
                          ("node", Optional[whole], None)]
        rest: list[Any] = [("run", Optional[Annotated[str, Meta(min_length=1)]], None), ("spec", Any, None),
                           ("timer", Any, None), ("every", Any, UNSET)]
    else:
        host, pid, rank, run, timer, dp, node = key
        who = [("host", Literal[host]), ("pid", Literal[pid]), ("rank", Literal[rank]),
               ("dp", None, None) if dp is None else ("dp", Literal[dp]),
               ("node", None, None) if node is None else ("node", Literal[node])]
        rest = [("run", None, None) if run is None else ("run", Literal[run]), ("spec", None, None),
                ("timer", None, None) if timer is None else ("timer", Literal[timer]), ("every", UnsetType, UNSET)]
    run_field, spec_field, timer_field, every_field = rest
    # The fields in the order the runtime writes them: msgspec looks a key up from the field after the one found
    # last, so a record decodes quicker (keyword-only fields: the required ones need not come first).
    fields = [
        ("v", Literal[1]),
        ("t", bounded(MAX_T)),
        *who,
        run_field,
        ("mode", Literal["decode", "prefill"]),
        ("bs", Optional[count], None),
        ("cycle_ms", ms),
        timer_field,
        ("phases", ph),
        ("accepted", Optional[count], None),
        # entries at most MAX_TOKENS here; at most the spec's accept_cap, no more of them than bs: ``columns.plan``
        ("accepts", Optional[Annotated[list[Annotated[int, Meta(ge=0, le=MAX_TOKENS)]], Meta(max_length=MAX_ACCEPTS)]],
         None),
        ("host_phases", Optional[ph], None),
        ("host_cycle_ms", Optional[ms], None),
        spec_field,
        ("accept_hist", Any, None),
        every_field,  # any "every" (the generic decoder's, checked by ``cut``): the line loop reads the record
        ("kind", UnsetType, UNSET),  # any "kind": a run header (or no record), for the line loop
    ]
    return defstruct("Record", fields, kw_only=True, gc=False)


def _skipped_fit(recs: list[Any], cap: int) -> bool:
    """Whether the accepts lists and accept_hist objects of records that ``skip`` drops are ones the line loop takes
    (``record.check_skipped``; ``columns.plan`` checks those of the records that count)."""
    try:
        for r in recs:
            if r.accepts is not None:
                check_accepts(r.accepts, r.bs, cap)
            elif r.accept_hist is not None:
                hist_counts(r.accept_hist, cap, r.bs)
    except BadLine:
        return False
    return True


def _key(r: Any) -> tuple[Any, ...] | None:
    """The (host, pid, rank, run, timer, dp, node) a decoder can be made for from record ``r``, or None (a spec, a
    timer that is not a string, an ``every``)."""
    timer = r.timer
    if r.spec is not None or not (timer is None or type(timer) is str) or r.every is not _UNSET:
        return None
    return (r.host, r.pid, r.rank, r.run, timer, r.dp, r.node)


class Batches:
    """Reads files for a ``Scan`` (``eaglepatch.report.scan``): ``read(f)`` for a file opened in binary mode.

    Decoded records wait, in segments (the records of one piece, their decoder's key and the piece's lines),
    until ``BATCH`` of them are there or the line loop is to read a line (the records before it go first).
    """

    def __init__(self, st: Any):
        self.st = st
        self.errors = (_msgspec.MsgspecError, ValueError, RecursionError)
        self.failed = 0  # pieces that did not decode since the phase names were last looked at
        self.segs: list[tuple[Any, list[Any], bytes, int]] = []  # (key, records, data, end): lines data[:end]
        self.waiting = 0
        self.skip = 0  # pieces still to leave to the line loop (parts too short to batch)
        self.set_phases(CANONICAL_PHASES)

    def set_phases(self, names: tuple[str, ...]) -> None:
        self.flush()  # the records waiting hold the old decoder's phases
        self.phases = names
        self.decoders: dict[Any, Any] = {None: _msgspec.json.Decoder(list[_record_type(names, None)]).decode}
        self.use(None)

    def use(self, key: Any) -> None:
        """Decode the next pieces with the decoder made for ``key`` (the generic one for ``None``)."""
        dec = self.decoders.get(key)
        if dec is None:
            if len(self.decoders) > _MAX_DECODERS:
                self.decoders = {None: self.decoders[None]}
            dec = self.decoders[key] = _msgspec.json.Decoder(list[_record_type(self.phases, key)]).decode
        self.key = key
        self.dec = dec

    def read(self, f: Any) -> None:
        """Read the binary file ``f`` in pieces of whole lines (``eaglepatch.report.reader.blocks``: a line over
        the cap is skipped unread, and counted)."""
        for data, end in blocks(f, PIECE):
            if data is None:
                self.st.bad += 1  # a count: the records waiting before it need not go first
            else:
                self.piece(data, end)
        self.flush()

    def piece(self, data: bytes, end: int, tries: int = _TRIES) -> None:
        """Decode the whole lines ``data[:end]`` (each ending with a newline, but for a file's last line)."""
        if self.skip:
            self.skip -= 1
            self.text(data[:end])
            return
        if data.find(b"\r", 0, end) >= 0:
            self.text(data[:end])
            return
        body = end - 1 if data[end - 1] == 10 else end  # the last line's newline left out
        try:
            recs = self.dec(b"".join((b"[", memoryview(data.replace(b"\n", b","))[:body], b"]")))
        except self.errors as exc:
            err: BaseException | None = exc
        else:
            err = None
        if err is not None:
            self.refused(data[:end] if end < len(data) else data, str(err), tries)
        elif recs:
            self.segs.append((self.key, recs, data, end))
            self.waiting += len(recs)
            if self.waiting >= BATCH or self.key is None:
                self.flush()  # the generic decoder's records at once: cut short, the next pieces go to the line loop

    def refused(self, data: bytes, msg: str, tries: int) -> None:
        """``data`` did not decode: the line that msgspec's message names (by its record or a byte) to ``line``, the
        lines before and after it decoded again; when it names neither, the two halves decoded again."""
        self.failed += 1
        at = -1
        m = _AT_RECORD.search(msg)
        if m is not None:
            at = int(m.group(1))
        else:
            m = _AT_BYTE.search(msg)
            if m is not None:
                at = data.count(b"\n", 0, max(0, int(m.group(1)) - 1))
        lines = data.split(b"\n")
        if data.endswith(b"\n"):
            lines.pop()
        if tries <= 0 or (not 0 <= at < len(lines) and len(lines) < 2):
            self.text(data)
            return
        if not 0 <= at < len(lines):
            half = len(lines) // 2
            self.lines(lines[:half], tries - 1)
            self.lines(lines[half:], tries - 1)
            return
        if at:
            self.lines(lines[:at], tries - 1)
        self.line(lines[at] + b"\n")
        if at + 1 < len(lines):
            self.lines(lines[at + 1:], tries - 1)
        if self.failed >= 4:
            self.learn()

    def lines(self, lines: list[bytes], tries: int) -> None:
        data = b"\n".join(lines) + b"\n"
        self.piece(data, len(data), tries)

    def line(self, data: bytes) -> None:
        """One line that the current decoder refused: a record of another process or run (decode the next pieces
        with a decoder made for it), or a line for the line loop."""
        try:
            recs = self.decoders[None](b"".join((b"[", data[:-1], b"]")))
        except self.errors:
            recs = None
        if recs is None:
            self.text(data)
        elif recs:
            key = _key(recs[0])
            self.use(key)
            self.segs.append((key, recs, data, len(data)))
            self.waiting += 1

    def text(self, data: bytes) -> None:
        """The line loop reads ``data`` (after the records waiting)."""
        self.flush()
        self.st.text(data)

    def learn(self) -> None:
        """Learn the phase names that the line loop found and the decoder does not know (a recipe of one's own),
        so that the next pieces decode."""
        self.failed = 0
        if len(self.phases) >= _MAX_PHASES:
            return
        seen = dict.fromkeys(self.phases)
        for ctx in (*self.st.ctxs.values(), self.st.out.scratch):
            for g in ctx.values():
                seen.update(dict.fromkeys(g.ph))
                seen.update(dict.fromkeys(g.hph))
        names = tuple(n for n in seen if type(n) is str)[:_MAX_PHASES]
        if names != self.phases:
            self.set_phases(names)

    def flush(self) -> None:
        """Add the records waiting, a part at a time; the line loop reads the lines of a part refused."""
        segs = self.segs
        if not segs:
            return
        self.segs = []
        self.waiting = 0
        st = self.st
        i = 0
        while i < len(segs):
            key, recs, data, end = segs[i]
            j = i + 1
            if key is None:
                done = self.cut(recs)
                if done < len(recs):
                    st.text(b"\n".join(data[:end].split(b"\n")[done:]))
                elif j == len(segs):
                    k = _key(recs[-1])
                    if k is not None and self.key is None:
                        self.use(k)  # the generic decoder's records turn out to be one process's
            else:
                while j < len(segs) and segs[j][0] == key:
                    j += 1
                if j > i + 1:
                    recs = list(chain.from_iterable(seg[1] for seg in segs[i:j]))
                if st.windowed:
                    recs = self.window(recs)
                if recs and not self.part(recs):
                    for _key_, _recs, data, end in segs[i:j]:
                        st.text(data[:end])
            i = j

    def window(self, recs: list[Any]) -> list[Any]:
        lo, hi = self.st.lo, self.st.hi
        return [r for r in recs if lo <= r.t <= hi]

    def cut(self, recs: list[Any]) -> int:
        """Add the generic decoder's records (in the time window), a part where the process, run or spec
        changes; return how many were added (the line loop reads the rest)."""
        kept = recs
        if self.st.windowed:
            lo, hi = self.st.lo, self.st.hi
            keep = [i for i, r in enumerate(recs) if lo <= r.t <= hi]
            if len(keep) < len(recs):
                kept = [recs[i] for i in keep]
        n = len(kept)
        if not n:
            return len(recs)
        if [r.every for r in kept].count(_UNSET) < n:
            self.skip = _SKIP  # records that stand for several cycles (apply --every N): the line loop's, as the
            return 0  # next pieces are (a log at N > 1 is N times shorter: its records are few)
        keys = [(r.host, r.pid, r.rank, r.dp, r.node, r.run, r.spec) for r in kept]
        cuts = [i for i in range(1, n) if keys[i] != keys[i - 1]]
        cuts.append(n)
        if len(cuts) * _SHORT > n:
            self.skip = _SKIP  # parts this short: the line loop is as quick, for the next pieces too
            return 0
        a = 0
        for b in cuts:
            if b - a < 8 or not self.part(kept[a:b]):
                break  # a short part: the line loop is as quick
            a = b
        if a == n:
            return len(recs)
        return a if kept is recs else keep[a]

    def part(self, recs: list[Any]) -> bool:
        """Add records of one process (and data-parallel group and node), run and spec; ``False`` (nothing added)
        when the checks refuse them."""
        st = self.st
        n = len(recs)
        r0 = recs[0]
        host, pid, rank, rraw, sraw, dp, node = r0.host, r0.pid, r0.rank, r0.run, r0.spec, r0.dp, r0.node
        proc = host == st.c_host and pid == st.c_pid and rank == st.c_rank
        same = proc and dp == st.c_dp and node == st.c_node
        if proc:
            cnt, last_end, carry = st.cnt, st.last_end, st.carry
        else:
            cnt, last_end, carry = st.procs.get((host, pid, rank), (0, -math.inf, 0.0))
        new_run = not same or rraw != st.c_rraw or sraw != st.c_sraw
        if new_run and sraw is not None:
            try:
                st.spec_of(sraw)
            except BadLine:
                return False
        hcs = [r.host_cycle_ms for r in recs]
        nh = hcs.count(None)
        if nh and nh < n:
            return False  # records with host_cycle_ms and without
        events = not nh
        if events:
            ends = [r.t + r.host_cycle_ms * 0.001 + r.cycle_ms * 0.0 for r in recs]
        else:
            ends = [r.t + r.cycle_ms * 0.001 for r in recs]
        k = min(n, max(0, st.skip - cnt))  # the first k records are dropped by skip
        cap = accept_cap(sraw)
        if k and not _skipped_fit(recs[:k], cap):
            return False
        plans = plan(st, recs[k:] if k else recs, hcs[k:] if events else None,
                     ends[k - 1:n - 1] if k else [last_end, *ends[:-1]], carry, self.phases,
                     cap) if k < n else ([], carry)
        if plans is None:
            return False

        # Nothing below can fail.
        if not same:
            st.switch_process(host, pid, rank, dp, node)
        if new_run:
            st.switch_run(rraw, sraw, r0.t, r0.timer)
        st.forget_group()  # the line loop looks its group up again
        st.records += n
        st.cnt = cnt + n
        st.last_end = ends[-1]
        if k:
            st.R.skipped += k
            st.R.skipped_cycles += k  # records without "every" (the line loop reads those)
        groups, st.carry = plans
        for gk, mode, kv, cols in groups:
            if dp is not None:  # the line loop's key: the data-parallel group last
                gk = (gk, dp) if st.bycode == 0 else (*gk, dp)
            g = st.groups.get(gk)
            if g is None:
                g = st.groups[gk] = Acc(mode, kv, st.c_rid, st.c_spec, dp, node)
            if rank not in g.ranks:
                g.ranks += (rank,)
            apply(g, *cols, rank)
        return True
