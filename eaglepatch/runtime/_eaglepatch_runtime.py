"""eaglepatch timing runtime: imported by a patched sglang speculative worker.

`eaglepatch apply` copies this file next to the worker file it patches (as `_eaglepatch_runtime.py`) and
rewrites the `_CONFIG` line below (the one line carrying the config marker comment) with the options of
`apply`. The patched worker imports it as `from . import _eaglepatch_runtime as _eaglepatch` and calls:

- `entry(fn)`: decorator for the entry method; times the whole call (the cycle) and emits one record.
- `begin(phase, mode=None)` / `end(phase)`: phase boundaries inside the current timed cycle.
- `accepted(obj, attrs, bonus_per_req=0)`: the tokens this cycle produced.
- `flush()`: write buffered records now (also done at exit).

Records are JSON lines in `<log_dir>/<host>-<pid>-rank<r>.jsonl` (CONTRACT.md, "The timing log").

Timers (the record's "timer" says which one ran): "sync" synchronises the device and reads perf_counter at
every boundary; "events" records CUDA events on the current stream (read on a later cycle, once done, or at
flush/exit) and adds the host clock's view as "host_phases"/"host_cycle_ms"; "cpu" reads perf_counter only,
and is what runs whenever torch or CUDA is missing. Only "sync" ever waits for the device: a CUDA tensor given
to accepted() is otherwise copied asynchronously and its record waits until the copy is done.

Rules this module keeps, because it runs inside somebody's inference server:
- Standard library and torch only, Python 3.8+, and it works without torch.
- It never raises into the server: every hook body is wrapped; internal errors are counted and the first one
  of each kind is printed once to stderr. The decorated function is called exactly once, and its result or
  exception comes back unchanged, whatever state the runtime is in.
- The hot path is lean: no logging calls, one small object per timed cycle, records serialised to strings
  at cycle end and written in batches (never one write per cycle): when flush_records are buffered or the
  oldest is flush_seconds old (checked at cycle end, and by a small daemon thread while the server is idle),
  and at exit. A process killed without exit handlers loses at most its last flush_seconds of records.

Environment variables override `_CONFIG` at import (and at `configure()`): EAGLEPATCH_MODE (sync|events|cpu),
EAGLEPATCH_LOG_DIR, EAGLEPATCH_EVERY, EAGLEPATCH_SUMMARY_EVERY.
"""
_CONFIG = {"mode": "sync", "every": 1, "log_dir": "/tmp/eaglepatch", "summary_every": 2000, "flush_records": 256, "flush_seconds": 2.0}  # eaglepatch:config

import atexit
import functools
import json
import os
import socket
import sys
import threading
import time
import traceback
from collections import deque

__all__ = ["entry", "begin", "end", "accepted", "flush", "configure"]

# The defaults, in case the installer writes a `_CONFIG` line with fewer keys.
_DEFAULTS = {"mode": "sync", "every": 1, "log_dir": "/tmp/eaglepatch", "summary_every": 2000,
             "flush_records": 256, "flush_seconds": 2.0}
_MODES = ("sync", "events", "cpu")

# Timer kinds, resolved at the first timed cycle (CUDA is surely initialised by then).
_CPU, _SYNC, _EVENTS = 0, 1, 2
_TIMER_NAMES = ("cpu", "sync", "events")

# A cycle waiting on its CUDA events (or accepted copy) is forced (synchronised) once this many are
# outstanding: only reachable when the GPU is hundreds of cycles behind the host, which sglang never is.
_MAX_PENDING = 256
_MAX_POOL = 512

_perf = time.perf_counter
_wall = time.time

# Injection point for tests: an object with torch.distributed's is_available/is_initialized/get_rank.
# None means "torch.distributed, when torch is already imported by the process".
_DIST = None

# A daemon thread writes records older than flush_seconds when no cycle comes to do it (an idle server).
_IDLE_FLUSH = True


class _Local(threading.local):
    # The cycle being timed on this thread: None outside the entry method, False inside an untimed
    # (sampled-out or failed-to-start) call, else a _Cycle. Class attribute = per-thread default.
    cur = None


class _Cycle(object):
    __slots__ = ("t", "t0", "worker", "bs", "prefill", "acc", "open", "accepted", "acc_dev", "kind",
                 "ev0", "ev_end", "evs", "iv", "h_end")


_tls = _Local()

# --- state (reset by configure) ------------------------------------------------------------------------
_cfg = dict(_DEFAULTS)
_mode = "sync"
_every = 1
_summary_every = 2000
_flush_records = 256
_flush_seconds = 2.0
_log_dir = "/tmp/eaglepatch"

_skip_left = 0          # untimed calls left before the next timed one (every=N)
_kind = None            # resolved timer kind, None until the first timed cycle
_timer_name = "cpu"
_torch = None           # the torch module, when CUDA is available
_dev = None             # CUDA device index seen at the first timed cycle
_raw_stream = None      # torch._C._cuda_getCurrentRawStream, when torch has it
_streams = {}           # raw cudaStream_t -> torch.cuda.Stream (current_stream() costs ~4 us; this ~0.3)

_buf = []               # (wall start time, serialised record tail) not yet written
_buf_since = None       # perf_counter time when _buf became non-empty
_pending = deque()      # events mode: finished cycles whose events are not yet read
_pool = []              # events mode: reusable torch.cuda.Event objects
_pinned = {}            # (shape, dtype) -> reusable pinned host tensors for accepted counts
_lock = threading.Lock()      # _buf swap/append
_wlock = threading.Lock()     # file writes, so batches keep their order
_plock = threading.RLock()    # resolving _pending

_pid = os.getpid()
try:
    _host = socket.gethostname()
except Exception:  # pragma: no cover - gethostname does not fail on Linux
    _host = "unknown"
_rank = None            # fixed at the first write (the file name carries it)
_path = None

_errors = 0
_reported = set()
_records = 0            # records emitted since configure (for tests and the exit line)

_win = {}               # summary window: (worker, mode) -> aggregates
_win_n = 0

_flusher = None
_flusher_stop = None

_QUOTED = {}
_MISSING = object()


# --- errors -------------------------------------------------------------------------------------------
def _error(where):
    """Count an internal error; print the first one of each kind once, with a short traceback."""
    global _errors
    _errors += 1
    try:
        if where in _reported:
            return
        _reported.add(where)
        tb = traceback.format_exc(limit=-6)
        sys.stderr.write("[eaglepatch] internal error in %s (the server goes on; further errors of this kind "
                         "are counted, not printed):\n%s" % (where, tb if tb.endswith("\n") else tb + "\n"))
        sys.stderr.flush()
    except Exception:
        pass


# --- configuration ------------------------------------------------------------------------------------
def _int_env(env, name, minimum):
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = int(raw)
        if value < minimum:
            raise ValueError(raw)
        return value
    except ValueError:
        sys.stderr.write("[eaglepatch] ignoring %s=%r: not an integer >= %d\n" % (name, raw, minimum))
        return None


def _load_config(kw):
    cfg = dict(_DEFAULTS)
    if isinstance(_CONFIG, dict):
        cfg.update(_CONFIG)
    env = os.environ
    mode = env.get("EAGLEPATCH_MODE", "").strip().lower()
    if mode:
        if mode in _MODES:
            cfg["mode"] = mode
        else:
            sys.stderr.write("[eaglepatch] ignoring EAGLEPATCH_MODE=%r: not one of sync, events, cpu\n" % mode)
    log_dir = env.get("EAGLEPATCH_LOG_DIR", "").strip()
    if log_dir:
        cfg["log_dir"] = log_dir
    every = _int_env(env, "EAGLEPATCH_EVERY", 1)
    if every is not None:
        cfg["every"] = every
    summary = _int_env(env, "EAGLEPATCH_SUMMARY_EVERY", 0)
    if summary is not None:
        cfg["summary_every"] = summary
    cfg.update(kw)
    if cfg["mode"] not in _MODES:
        cfg["mode"] = "sync"
    cfg["every"] = max(1, int(cfg["every"]))
    cfg["summary_every"] = max(0, int(cfg["summary_every"]))
    cfg["flush_records"] = max(1, int(cfg["flush_records"]))
    cfg["flush_seconds"] = max(0.0, float(cfg["flush_seconds"]))
    cfg["log_dir"] = os.path.expanduser(str(cfg["log_dir"]))
    return cfg


def configure(**kw):
    """Reset all state and set the configuration: `_CONFIG`, then the environment, then `kw`.

    Keys: mode, every, log_dir, summary_every, flush_records, flush_seconds. Records not yet written are
    discarded. Meant for tests and tools; raises TypeError on an unknown key.
    """
    global _cfg, _mode, _every, _summary_every, _flush_records, _flush_seconds, _log_dir
    global _skip_left, _kind, _timer_name, _torch, _dev, _raw_stream, _streams, _buf, _buf_since, _pending
    global _pool, _pinned
    global _pid, _rank, _path, _errors, _reported, _records, _win, _win_n
    unknown = sorted(set(kw) - set(_DEFAULTS))
    if unknown:
        raise TypeError("configure() got unknown keys: %s" % ", ".join(unknown))
    _stop_flusher()
    cfg = _load_config(kw)
    _cfg = cfg
    _mode = cfg["mode"]
    _every = cfg["every"]
    _summary_every = cfg["summary_every"]
    _flush_records = cfg["flush_records"]
    _flush_seconds = cfg["flush_seconds"]
    _log_dir = cfg["log_dir"]
    _skip_left = 0
    _kind = None
    _timer_name = "cpu"
    _torch = None
    _dev = None
    _raw_stream = None
    _streams = {}
    _buf = []
    _buf_since = None
    _pending = deque()
    _pool = []
    _pinned = {}
    _pid = os.getpid()
    _rank = None
    _path = None
    _errors = 0
    _reported = set()
    _records = 0
    _win = {}
    _win_n = 0
    _tls.cur = None


def _resolve_timer():
    """Pick the timer for this process: CUDA ones only when torch is importable and CUDA is available.

    In cpu mode torch is not imported, but when the process has it and CUDA works, it is kept at hand for
    reading a CUDA `accepted` tensor without a host sync.
    """
    global _kind, _timer_name, _torch, _dev, _raw_stream
    kind = _CPU
    torch = sys.modules.get("torch")
    if _mode != "cpu" and torch is None:
        try:
            import torch
        except Exception:
            torch = None
    try:
        if torch is not None and torch.cuda.is_available():
            _torch = torch
            _dev = torch.cuda.current_device()
            _raw_stream = getattr(getattr(torch, "_C", None), "_cuda_getCurrentRawStream", None)
            if _mode != "cpu":
                kind = _SYNC if _mode == "sync" else _EVENTS
    except Exception:
        kind = _CPU
        _error("timer")
    _timer_name = _TIMER_NAMES[kind]
    _kind = kind
    return kind


# --- the hooks ----------------------------------------------------------------------------------------
def _batch_size(args, kwargs):
    """bs: len(batch.reqs), else batch.seq_lens.shape[0] (or len), else batch.batch_size(), else None."""
    if len(args) > 1:
        b = args[1]
    else:
        b = kwargs.get("batch")
        if b is None:
            b = kwargs.get("model_worker_batch")
    if b is None:
        return None
    r = getattr(b, "reqs", None)
    if isinstance(r, (list, tuple)):
        return len(r)
    s = getattr(b, "seq_lens", None)
    if s is not None:
        try:
            shape = getattr(s, "shape", None)
            if shape is not None and len(shape):
                return int(shape[0])
            return len(s)
        except Exception:
            pass
    f = getattr(b, "batch_size", None)
    if callable(f):
        try:
            return int(f())
        except Exception:
            return None
    return None


def _event():
    try:
        return _pool.pop()
    except IndexError:
        return _torch.cuda.Event(enable_timing=True)


def _record(ev):
    """ev.record() on the current stream; Event.record() alone looks the stream up the slow way."""
    raw = _raw_stream
    if raw is None:
        ev.record()
        return
    key = raw(_dev)
    stream = _streams.get(key)
    if stream is None:
        stream = _torch.cuda.current_stream()
        if len(_streams) < 64:
            _streams[key] = stream
    ev.record(stream)


def _start(args, kwargs):
    """A new timed cycle, its start boundary taken last (so the set-up is not billed to the cycle)."""
    kind = _kind
    if kind is None:
        kind = _resolve_timer()
    c = _Cycle()
    c.worker = type(args[0]).__name__ if args else "?"
    c.bs = _batch_size(args, kwargs)
    c.prefill = False
    c.acc = {}
    c.open = {}
    c.accepted = None
    c.acc_dev = None
    c.kind = kind
    c.t = _wall()
    if kind == _CPU:
        c.t0 = _perf()
    elif kind == _SYNC:
        _torch.cuda.synchronize()
        c.t0 = _perf()
    else:
        ev = _event()
        c.evs = [ev]
        c.iv = []
        c.ev0 = ev
        _record(ev)
        c.t0 = _perf()
    return c


def entry(fn):
    """Decorator for the entry method: one timed cycle (one record) per outermost call."""
    def wrapper(*args, **kwargs):
        global _skip_left
        tls = _tls
        if tls.cur is not None:         # nested (a subclass calling super()): the outer call times it
            return fn(*args, **kwargs)
        c = None
        try:
            if _skip_left:
                _skip_left -= 1
            else:
                _skip_left = _every - 1
                c = _start(args, kwargs)
        except Exception:
            c = None
            _error("entry")
        if c is None:
            tls.cur = False
            try:
                return fn(*args, **kwargs)
            finally:
                tls.cur = None
        tls.cur = c
        try:
            result = fn(*args, **kwargs)
        except BaseException:
            tls.cur = None
            _abort(c)
            raise
        tls.cur = None
        try:
            _finish(c)
        except Exception:
            _error("entry")
        return result

    try:
        wrapper = functools.wraps(fn)(wrapper)
        wrapper._eaglepatch_entry = True
    except Exception:
        pass
    return wrapper


def begin(phase, mode=None):
    """Start `phase` in the current timed cycle; `mode="prefill"` marks the cycle as prefill."""
    c = _tls.cur
    if not c:
        return
    try:
        if mode == "prefill":
            c.prefill = True
        op = c.open
        if phase in op:             # already open: the first begin stands
            return
        acc = c.acc
        if phase not in acc:
            acc[phase] = 0.0        # phases are listed in the order they first began
        kind = c.kind
        if kind == _CPU:
            op[phase] = _perf()
        elif kind == _SYNC:
            _torch.cuda.synchronize()
            op[phase] = _perf()
        else:
            ev = _event()
            c.evs.append(ev)
            _record(ev)
            op[phase] = (ev, _perf())
    except Exception:
        _error("begin")


def end(phase):
    """End `phase` in the current timed cycle; a phase that is not open is ignored."""
    c = _tls.cur
    if not c:
        return
    try:
        t0 = c.open.pop(phase, None)
        if t0 is None:
            return
        kind = c.kind
        if kind == _CPU:
            c.acc[phase] += _perf() - t0
        elif kind == _SYNC:
            _torch.cuda.synchronize()
            c.acc[phase] += _perf() - t0
        else:
            ev = _event()
            c.evs.append(ev)
            _record(ev)
            c.iv.append((phase, t0[0], ev, t0[1], _perf()))
    except Exception:
        _error("end")


def accepted(obj, attrs, bonus_per_req=0):
    """Set this cycle's accepted tokens from the first attribute of `attrs` that `obj` has (not None), or from
    `obj` itself when `attrs` is empty (a recipe fact with `attrs = []`: NGRAM's count or accept_lens).

    A list/tuple/1-d tensor holds per-request counts: accepted = sum + bonus_per_req * len. An int or a 0-d
    tensor is a total: accepted = value + bonus_per_req * bs (unknown when bs is unknown and bonus != 0).
    The last call in a cycle wins. A CUDA tensor is read with a host sync only by the sync timer; otherwise
    it is copied asynchronously into pinned memory and read once the copy is done (a later cycle, or flush).
    """
    c = _tls.cur
    if not c:
        return
    try:
        if isinstance(attrs, str):
            attrs = (attrs,)
        if not attrs:
            v = obj                 # no attribute named: the value itself
        else:
            v = None
            for a in attrs:
                v = getattr(obj, a, None)
                if v is not None:
                    break
        if v is None:
            return
        c.acc_dev = None
        if isinstance(v, (list, tuple)):
            c.accepted = int(sum(v)) + bonus_per_req * len(v)
            return
        if isinstance(v, int):
            v = int(v)              # a bool is an int too; the record wants a number
            if bonus_per_req:
                c.accepted = None if c.bs is None else v + bonus_per_req * c.bs
            else:
                c.accepted = v
            return
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(v, torch.Tensor):
            dim = v.dim()
            if dim:
                bonus = bonus_per_req * int(v.shape[0])
            elif bonus_per_req:
                if c.bs is None:
                    c.accepted = None
                    return
                bonus = bonus_per_req * c.bs
            else:
                bonus = 0
            c.accepted = None
            if v.is_cuda and c.kind != _SYNC and _torch is not None:
                # No host sync on the hot path: a copy of the whole (small) tensor into pinned memory is
                # queued on the current stream, an event marks it done, and it is summed when resolved.
                # The tensor itself is held until then (it may live on another stream's allocations).
                key = (v.shape, v.dtype)
                free = _pinned.get(key)
                host = free.pop() if free else torch.empty(v.shape, dtype=v.dtype, pin_memory=True)
                host.copy_(v, non_blocking=True)
                ev = _event()
                _record(ev)
                c.acc_dev = (host, ev, bonus, v, key)
            elif dim <= 1:
                x = v.tolist()      # one device-to-host copy; cheaper than a sum kernel plus .item()
                c.accepted = int(sum(x) if dim else x) + bonus
            else:
                c.accepted = int(v.sum().item()) + bonus
            return
        # Anything else with a length and a sum (a numpy array).
        c.accepted = int(v.sum()) + bonus_per_req * len(v)
    except Exception:
        c.accepted = None
        c.acc_dev = None
        _error("accepted")


def flush():
    """Write buffered records now (events mode: waits for the outstanding cycles' events first)."""
    try:
        if _pending:
            _poll(True)
    except Exception:
        _error("flush")
    try:
        _write()
    except Exception:
        _error("flush")


# --- cycle end, records, summaries ---------------------------------------------------------------------
def _abort(c):
    """The wrapped call raised: no record; give the events (and a pinned buffer) back."""
    try:
        if c.kind == _EVENTS:
            _give_back(c.evs)
        if c.acc_dev is not None:
            _give_back_acc(c.acc_dev)
    except Exception:
        _error("entry")


def _give_back(evs):
    if len(_pool) < _MAX_POOL:
        _pool.extend(evs)


def _give_back_acc(dev):
    """An accepted copy's event and pinned buffer, for reuse: only once the copy is known done, or the
    buffer is dropped (a pending copy into a reused buffer would be a race)."""
    host, ev, _, _, key = dev
    if ev.query():
        if len(_pool) < _MAX_POOL:
            _pool.append(ev)
        free = _pinned.get(key)
        if free is None:
            if len(_pinned) >= 256:
                return
            free = _pinned[key] = []
        if len(free) < 8:
            free.append(host)


def _finish(c):
    kind = c.kind
    if kind == _EVENTS:
        ev = _event()
        c.evs.append(ev)
        _record(ev)
        now = c.h_end = _perf()
        c.ev_end = ev
        if c.open:
            for name, (bev, hb) in c.open.items():
                c.iv.append((name, bev, ev, hb, now))
        _pending.append(c)
        _poll(False)
    else:
        if kind == _SYNC:
            _torch.cuda.synchronize()
        now = c.h_end = _perf()
        acc = c.acc
        if c.open:
            for name, t0 in c.open.items():
                acc[name] += now - t0
        if c.acc_dev is None and not _pending:
            _emit(c, now - c.t0, acc, None, None)
        else:                   # waiting for an accepted copy, or behind one that is (records stay in order)
            _pending.append(c)
            _poll(False)
    if _flusher is None and _IDLE_FLUSH:
        _start_flusher()
    since = _buf_since
    if since is not None and (len(_buf) >= _flush_records or now - since >= _flush_seconds):
        try:
            _write()
        except Exception:
            _error("flush")


def _poll(wait_all):
    """Resolve finished cycles, oldest first: CUDA events done (events timer) and accepted copies done.
    With `wait_all`, wait for every outstanding one; without, wait only while more than _MAX_PENDING are
    outstanding (keeps memory bounded)."""
    with _plock:
        pending = _pending
        while pending:
            c = pending[0]
            dev = c.acc_dev
            events = c.kind == _EVENTS
            if wait_all or len(pending) > _MAX_PENDING:
                if events or dev is not None:
                    with _torch.cuda.device(_dev):      # this thread's device may not be the worker's
                        if events:
                            c.ev_end.synchronize()
                        if dev is not None:
                            dev[1].synchronize()
            elif (events and not c.ev_end.query()) or (dev is not None and not dev[1].query()):
                return
            pending.popleft()
            try:
                _resolve(c)
            except Exception:
                _error("events")


def _resolve(c):
    dev = c.acc_dev
    if dev is not None:
        try:
            host = dev[0]
            if host.dim() <= 1:
                x = host.tolist()
                total = sum(x) if host.dim() else x
            else:
                total = host.sum().item()
            c.accepted = int(total) + dev[2]
            _give_back_acc(dev)
        except Exception:
            c.accepted = None       # the record still goes out, without its count
            _error("accepted")
    if c.kind != _EVENTS:
        _emit(c, c.h_end - c.t0, c.acc, None, None)
        return
    try:
        gpu = {}
        host_ph = {}
        for name in c.acc:
            gpu[name] = 0.0
            host_ph[name] = 0.0
        for name, bev, eev, hb, he in c.iv:
            gpu[name] += bev.elapsed_time(eev) / 1000.0
            host_ph[name] += he - hb
        cycle_s = c.ev0.elapsed_time(c.ev_end) / 1000.0
    finally:
        _give_back(c.evs)
    _emit(c, cycle_s, gpu, c.h_end - c.t0, host_ph)


def _q(name):
    q = _QUOTED.get(name)
    if q is None:
        q = _QUOTED[name] = json.dumps(str(name))
    return q


def _emit(c, cycle_s, phases, host_cycle_s, host_phases):
    """Serialise one record (all but v/t/host/pid/rank, which the writer adds) and buffer it."""
    global _buf_since, _records
    cycle_ms = round(cycle_s * 1000.0, 4)
    parts = []
    for name, s in phases.items():
        parts.append("%s: %r" % (_q(name), round(s * 1000.0, 4)))
    mode = "prefill" if c.prefill else "decode"
    bs = c.bs
    acc = c.accepted
    tail = '"worker": %s, "mode": "%s", "bs": %s, "cycle_ms": %r, "timer": "%s", "phases": {%s}, "accepted": %s' % (
        _q(c.worker), mode, "null" if bs is None else bs, cycle_ms, _timer_name, ", ".join(parts),
        "null" if acc is None else acc)
    if host_phases is not None:
        hparts = []
        for name, s in host_phases.items():
            hparts.append("%s: %r" % (_q(name), round(s * 1000.0, 4)))
        tail += ', "host_phases": {%s}, "host_cycle_ms": %r' % (", ".join(hparts), round(host_cycle_s * 1000.0, 4))
    tail += "}\n"
    with _lock:
        if not _buf:
            _buf_since = _perf()
        _buf.append((c.t, tail))
        _records += 1
    if _summary_every:
        _summarise(c.worker, mode, bs, cycle_ms, phases, acc)


def _summarise(worker, mode, bs, cycle_ms, phases, acc):
    global _win_n
    key = (worker, mode)
    g = _win.get(key)
    if g is None:
        # n, cycle ms, accepted, cycle ms of records with accepted, accepted with bs, bs, {phase: s}
        g = _win[key] = [0, 0.0, 0, 0.0, 0, 0, {}]
    g[0] += 1
    g[1] += cycle_ms
    if acc is not None:
        g[2] += acc
        g[3] += cycle_ms
        if bs:
            g[4] += acc
            g[5] += bs
    ph = g[6]
    for name, s in phases.items():
        ph[name] = ph.get(name, 0.0) + s
    _win_n += 1
    if _win_n >= _summary_every:
        _print_summary()


def _summary_lines():
    rank = _rank if _rank is not None else _detect_rank()
    lines = []
    for (worker, mode), g in _win.items():
        n, cyc, acc, acc_cyc, acc_b, bs, ph = g
        line = "[eaglepatch] rank%d %s %s n=%d cycle %.2f ms" % (rank, worker, mode, n, cyc / n)
        if ph:
            items = []
            for name, s in ph.items():
                ms = s * 1000.0
                items.append("%s %.2f (%.0f%%)" % (name, ms / n, 100.0 * ms / cyc if cyc > 0 else 0.0))
            line += " | " + " ".join(items)
        if bs:
            line += " | accept len %.2f" % (float(acc_b) / bs)
        if acc_cyc > 0:
            line += " | %.1f tok/s" % (acc / acc_cyc * 1000.0)
        lines.append(line)
    return lines


def _print_summary():
    global _win, _win_n
    try:
        lines = _summary_lines()
    finally:
        _win = {}
        _win_n = 0
    if lines:
        sys.stderr.write("\n".join(lines) + "\n")
        sys.stderr.flush()


# --- writing ------------------------------------------------------------------------------------------
def _dist():
    if _DIST is not None:
        return _DIST
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    return getattr(torch, "distributed", None)


def _detect_rank():
    """torch.distributed's rank when it is initialised, else 0."""
    try:
        d = _dist()
        if d is not None and d.is_available() and d.is_initialized():
            return int(d.get_rank())
    except Exception:
        pass
    return 0


def _ensure_dir(path):
    if os.path.isdir(path):
        return
    try:
        os.makedirs(path, 0o700)
    except FileExistsError:
        return                  # made by another rank meanwhile, or not a directory (the open says so)
    os.chmod(path, 0o700)       # only when we made it; makedirs' mode is subject to the umask


def _write():
    """Write the buffered records in one append. On failure the batch is dropped (memory stays bounded)."""
    global _buf, _buf_since, _rank, _path
    pid = os.getpid()
    if pid != _pid:
        _after_fork_child()     # the buffer is the parent's: it writes it itself
        return
    with _lock:
        lines = _buf
        if not lines:
            return
        _buf = []
        _buf_since = None
    with _wlock:
        if _rank is None:
            _rank = _detect_rank()
        if _path is None:
            _path = os.path.join(_log_dir, "%s-%d-rank%d.jsonl" % (_host, pid, _rank))
        head = '{"v": 1, "t": '
        mid = ', "host": %s, "pid": %d, "rank": %d, ' % (_q(_host), pid, _rank)
        data = "".join([head + ("%.6f" % t) + mid + tail for t, tail in lines]).encode("utf-8")
        _ensure_dir(_log_dir)
        fd = os.open(_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
        finally:
            os.close(fd)


def _flusher_main(stop):
    """Idle flush: writes records older than flush_seconds when no cycle comes to do it. No CUDA calls here
    (a thread of its own has no device set; events are read on the worker's thread or at exit)."""
    # Waking four times per flush_seconds bounds how late a quiet server's last records reach the disk at
    # 1.25 x flush_seconds (bench waits for them), at the cost of a wake-up every half second.
    while not stop.wait(max(0.05, min(_flush_seconds / 4.0, 1.0))):
        try:
            since = _buf_since
            if since is not None and _perf() - since >= _flush_seconds:
                _write()
        except Exception:
            _error("flush")


def _start_flusher():
    global _flusher, _flusher_stop
    stop = threading.Event()
    t = threading.Thread(target=_flusher_main, args=(stop,), name="eaglepatch-flush")
    t.daemon = True
    _flusher_stop = stop
    _flusher = t
    t.start()


def _stop_flusher():
    global _flusher, _flusher_stop
    stop, t = _flusher_stop, _flusher
    _flusher = None
    _flusher_stop = None
    if stop is not None:
        stop.set()
    if t is not None and t is not threading.current_thread():
        t.join(1.0)


def _after_fork_child():
    """In a forked child: forget the parent's buffer, file, rank, events, locks and flusher thread."""
    global _pid, _buf, _buf_since, _pending, _pool, _pinned, _streams, _rank, _path, _lock, _wlock, _plock
    global _flusher, _flusher_stop, _win, _win_n
    _pid = os.getpid()
    _buf = []
    _buf_since = None
    _pending = deque()
    _pool = []
    _pinned = {}
    _streams = {}
    _rank = None
    _path = None
    _lock = threading.Lock()
    _wlock = threading.Lock()
    _plock = threading.RLock()
    _flusher = None
    _flusher_stop = None
    _win = {}
    _win_n = 0


def _at_exit():
    flush()
    if _errors:
        try:
            sys.stderr.write("[eaglepatch] %d internal error(s) in pid %d; timing records may be missing\n"
                             % (_errors, os.getpid()))
        except Exception:
            pass


def _stats():
    """For tests and tools: what the runtime holds now."""
    return {"errors": _errors, "buffered": len(_buf), "pending": len(_pending), "records": _records,
            "timer": _timer_name if _kind is not None else None, "path": _path, "config": dict(_cfg)}


try:
    configure()
except Exception:  # a bad _CONFIG line must not break the server's import
    _error("configure")
try:
    atexit.register(_at_exit)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_after_fork_child)
except Exception:
    _error("configure")
