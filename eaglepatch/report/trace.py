"""Write timing records as a Chrome trace-event JSON file (``{"traceEvents": [...]}``) that Perfetto and
chrome://tracing open.

Layout: one process track per host (``pid`` = a small integer per host, 1, 2, ... in order of first appearance,
named by a ``process_name`` metadata event), one thread per (rank, server pid) of that host (``tid`` 1, 2, ...,
named ``"rank0 pid4242"`` by a ``thread_name`` event and sorted by rank). Each cycle is one complete (``"X"``)
slice named ``"cycle <mode> bs=<bs>"`` (``bs=?`` when unknown) with ``accepted``, ``bs`` and ``cycle_ms`` in its
args; each phase is a child slice.

Approximations, because the log holds durations, not start offsets:

* Phases are laid out one after the other from the cycle's start, in canonical order (target, draft, verify,
  draft_extend, then others by name), each clamped to end within its cycle. The real order and the gaps
  between phases are not recorded.
* With the ``events`` timer the host-clock times (``host_cycle_ms``, ``host_phases``) give the slice lengths,
  so that slices line up with the host clock ``t``; the GPU times are in the args (``gpu_ms``).
* ``ts``/``dur`` are whole microseconds, ``ts`` counted from ``otherData.ts_base_unix_s`` (midnight UTC of the
  day before the first record, so that every timestamp stays positive and exact in a double). A cycle that
  would start before the previous cycle of the same thread ended is moved to that end (and shortened), so
  that slices of one thread never overlap.
"""

from __future__ import annotations

import json
import math
from typing import Any, TextIO

from eaglepatch.errors import UsageError
from eaglepatch.report.stats import phase_sort_key


def _num(x: Any) -> str:
    """A JSON number (or null) for a value read from a record."""
    if x is None:
        return "null"
    if x is True:
        return "true"
    if x is False:
        return "false"
    if type(x) is int:
        return str(x)
    if isinstance(x, (int, float)):
        xf = float(x)
        return repr(xf) if math.isfinite(xf) else "null"
    return json.dumps(str(x))


def _us(ms: Any) -> int:
    """Milliseconds (number) to whole microseconds, never negative; non-numbers give 0."""
    try:
        v = round(float(ms) * 1000.0)
    except (TypeError, ValueError, OverflowError):
        return 0
    return v if v > 0 else 0


class TraceWriter:
    """Streams trace events to a file; ``add`` one record at a time, then ``close`` (writes the closing brackets).

    Raises ``UsageError`` from the constructor when the file cannot be created.
    """

    _FLUSH_EVERY = 4096

    def __init__(self, path: str):
        self.path = path
        try:
            self._f: TextIO | None = open(path, "w", encoding="utf-8")
        except OSError as exc:
            raise UsageError(
                f"cannot write the trace file {path}: {exc.strerror}; pass a writable path to --trace"
            ) from None
        self._f.write('{"traceEvents":[\n')
        self._first = True
        self._buf: list[str] = []
        self._hosts: dict[str, int] = {}
        self._threads: dict[tuple[str, int, int], tuple[int, int]] = {}
        self._next_tid: dict[int, int] = {}
        self._last_end: dict[tuple[int, int], int] = {}
        self._base: int | None = None
        self._order_cache: dict[tuple[str, ...], list[str]] = {}
        self._name_cache: dict[str, str] = {}
        self.events = 0

    def _q(self, s: str) -> str:
        q = self._name_cache.get(s)
        if q is None:
            q = self._name_cache[s] = json.dumps(s)
        return q

    def _emit(self, ev: str) -> None:
        self._buf.append(ev)
        self.events += 1
        if len(self._buf) >= self._FLUSH_EVERY:
            self._flush()

    def _flush(self) -> None:
        if not self._buf or self._f is None:
            return
        text = ",\n".join(self._buf)
        if self._first:
            self._first = False
        else:
            text = ",\n" + text
        try:
            self._f.write(text)
        except OSError as exc:
            raise UsageError(f"cannot write the trace file {self.path}: {exc.strerror}") from None
        self._buf.clear()

    def _thread(self, host: str, pid: int, rank: int) -> tuple[int, int]:
        key = (host, pid, rank)
        got = self._threads.get(key)
        if got is not None:
            return got
        tp = self._hosts.get(host)
        if tp is None:
            tp = self._hosts[host] = len(self._hosts) + 1
            self._next_tid[tp] = 1
            self._emit(
                f'{{"name":"process_name","ph":"M","pid":{tp},"tid":0,"args":{{"name":{self._q(host)}}}}}'
            )
        tid = self._next_tid[tp]
        self._next_tid[tp] = tid + 1
        self._threads[key] = (tp, tid)
        label = json.dumps(f"rank{rank} pid{pid}")
        self._emit(f'{{"name":"thread_name","ph":"M","pid":{tp},"tid":{tid},"args":{{"name":{label}}}}}')
        self._emit(
            f'{{"name":"thread_sort_index","ph":"M","pid":{tp},"tid":{tid},"args":{{"sort_index":{_num(rank)}}}}}'
        )
        return tp, tid

    def add(self, d: dict[str, Any], host: str, pid: int, rank: int, mode: str, t: float, skipped: bool) -> None:
        """Add one valid record ``d`` (its process fields and ``t`` already read by the caller)."""
        tp, tid = self._thread(host, pid, rank)
        if self._base is None:
            self._base = int(math.floor(t / 86400.0)) * 86400 - 86400
        start = round((t - self._base) * 1e6)
        hcyc = d.get("host_cycle_ms")
        phases = d.get("phases") or {}
        hphases = d.get("host_phases") if hcyc is not None else None
        dur = _us(hcyc if hcyc is not None else d.get("cycle_ms"))
        tkey = (tp, tid)
        last = self._last_end.get(tkey)
        if last is not None and start < last:
            dur = max(0, dur - (last - start))
            start = last
        end = start + dur
        self._last_end[tkey] = end
        bs = d.get("bs")
        acc = d.get("accepted")
        name = self._q(f"cycle {mode} bs={'?' if bs is None else bs}")
        extra = ',"skipped":true' if skipped else ""
        hc = f',"host_cycle_ms":{_num(hcyc)}' if hcyc is not None else ""
        self._emit(
            f'{{"name":{name},"cat":"cycle","ph":"X","ts":{start},"dur":{dur},"pid":{tp},"tid":{tid},'
            f'"args":{{"accepted":{_num(acc)},"bs":{_num(bs)},"cycle_ms":{_num(d.get("cycle_ms"))}{hc}{extra}}}}}'
        )
        keys = tuple(phases)
        order = self._order_cache.get(keys)
        if order is None:
            order = self._order_cache[keys] = sorted(keys, key=phase_sort_key)
        cursor = start
        for ph in order:
            ms = phases[ph]
            if hphases is not None and ph in hphases:
                pdur = _us(hphases[ph])
                args = f'{{"gpu_ms":{_num(ms)},"host_ms":{_num(hphases[ph])}}}'
            else:
                pdur = _us(ms)
                args = f'{{"ms":{_num(ms)}}}'
            if cursor + pdur > end:
                pdur = max(0, end - cursor)
            self._emit(
                f'{{"name":{self._q(ph)},"cat":"phase","ph":"X","ts":{cursor},"dur":{pdur},'
                f'"pid":{tp},"tid":{tid},"args":{args}}}'
            )
            cursor += pdur

    def close(self) -> None:
        """Write the remaining events and the closing brackets; the file is then valid JSON. Idempotent."""
        if self._f is None:
            return
        try:
            self._flush()
            other = {"ts_base_unix_s": self._base, "generator": "eaglepatch report"}
            self._f.write('\n],\n"displayTimeUnit":"ms",\n"otherData":' + json.dumps(other) + "}\n")
        except OSError as exc:
            raise UsageError(f"cannot write the trace file {self.path}: {exc.strerror}") from None
        finally:
            f, self._f = self._f, None
            f.close()
