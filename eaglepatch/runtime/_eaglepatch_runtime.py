"""eaglepatch timing runtime: imported by a patched sglang speculative worker.

`eaglepatch apply` copies this file next to the worker file it patches (as `_eaglepatch_runtime.py`) and
rewrites the `_CONFIG` line below (the one line carrying the config marker comment) with the options of
`apply`. The patched worker imports it as `from . import _eaglepatch_runtime as _eaglepatch` and calls:

- `entry(fn)`: decorator for the entry method; times the whole call (the cycle) and emits one record.
- `begin(phase, mode=None)` / `end(phase)`: phase boundaries inside the current timed cycle.
- `accepted(obj, attrs, bonus_per_req=0)`: the tokens this cycle produced.
- `flush()`: write buffered records now (also done at exit).

Records are JSON lines in `<log_dir>/<host>-<pid>-rank<r>.jsonl`, then (once that is full) in the next files of
its chain, `<host>-<pid>-rank<r>.<i>.jsonl` (docs/design.md, "The runtime API", "Bounded logs"). Each
carries "run", which names the launch: every rank of one server launch with one configuration writes the same id
(the launcher is the nearest ancestor that multiprocessing did not start, nor sglang rename). Whenever the file is opened, a run
header line goes first: {"v": 1, "kind": "run", "run", "t", "host", "pid", "rank", "timer", "flags" (the
launcher's --speculative-* options), "launcher", "argv" (secrets masked)}.

Timers (the record's "timer" says which one ran): "sync" synchronises the device and reads perf_counter at
every boundary; "events" records CUDA events on the current stream (read later, once done) and adds the host
clock's view as "host_phases"/"host_cycle_ms"; "cpu" reads perf_counter only, and is what runs whenever torch
is missing or CUDA is unavailable or was never initialised in the process. Mode "auto" (the default) gives each
worker class the timer `_CONFIG["timers"]` names for it (the first class of its MRO found there; "sync" when none
is). Only "sync" ever waits for the device: a CUDA tensor given to accepted() is otherwise copied asynchronously
and its record waits until the copy is done. A cycle reached while the current stream captures a CUDA graph is
not timed at all (a synchronise or an event query would break the capture).

Rules this module keeps, because it runs inside somebody's inference server:
- Standard library and torch only, Python 3.8+, and it works without torch. The cpu timer never calls anything
  that could initialise CUDA.
- It never raises into the server: every hook body is wrapped; internal errors are counted and the first one
  of each kind is printed once to stderr. The decorated function is called exactly once, and its result or
  exception comes back unchanged, whatever state the runtime is in.
- It never blocks the thread calling the hooks (the worker): that thread serialises its record and appends it
  to a bounded buffer under a lock that is never held across I/O or a CUDA call; it never writes a file or
  stderr, never synchronises outside the sync timer, and never waits for the log or for another thread (at a
  cycle's end it reads the earlier cycles whose CUDA events are done, by query, unless the writer is at it).
  One background thread ("eaglepatch-writer") writes the buffer in batches (when flush_records are buffered or
  the oldest is flush_seconds old), prints summaries and errors, and resolves the cycles still waiting for
  their events once the worker is quiet (query only), so a quiet server's last records reach the disk. When
  the writer falls behind (a stuck disk), records beyond buffer_records are dropped and counted: the next record
  written carries "dropped": N, a "drops" line of the log says the totals by reason, and the summary and exit
  lines say so.
- The logs are bounded: one launch's files hold max_log_mb at most (each rank its share; a rank removes the oldest
  files of its own chain, never another's), and nothing is written while the log's filesystem has less than
  min_free_mb free (looked at at most once a second, by the writer); a full disk (ENOSPC) is said once, in one
  line, and waited out. What is not written is dropped and counted.
- Exit (and flush()) waits at most exit_seconds: events not done by then are not waited for (never an unbounded
  synchronise), and a writer stuck in a write is left behind; what that loses is counted.
- The log directory is created 0700; an existing one must be a real directory owned by this user and not group-
  or world-writable, and log files are opened without following links and must be regular files; otherwise the
  runtime logs to a private directory of its own (tempfile.mkdtemp) and says so once.

Environment variables override `_CONFIG` at import (and at `configure()`): EAGLEPATCH_MODE (sync|events|cpu|auto),
EAGLEPATCH_LOG_DIR, EAGLEPATCH_EVERY, EAGLEPATCH_SUMMARY_EVERY, EAGLEPATCH_MAX_LOG_MB, EAGLEPATCH_MIN_FREE_MB.
"""
_CONFIG = {"mode": "auto", "timers": {}, "every": 1, "log_dir": "/tmp/eaglepatch", "summary_every": 2000, "flush_records": 256, "flush_seconds": 2.0, "buffer_records": 8192, "exit_seconds": 2.0, "max_log_mb": 2048, "min_free_mb": 1024}  # eaglepatch:config

import atexit
import errno
import functools
import json
import os
import re
import socket
import stat
import sys
import tempfile
import threading
import time
import traceback
import types
import weakref
from collections import Counter as _Counter, deque

__all__ = ["entry", "begin", "end", "accepted", "flush", "configure"]

# The defaults, in case the installer writes a `_CONFIG` line with fewer keys.
_DEFAULTS = {"mode": "auto", "timers": {}, "every": 1, "log_dir": "/tmp/eaglepatch", "summary_every": 2000,
             "flush_records": 256, "flush_seconds": 2.0, "buffer_records": 8192, "exit_seconds": 2.0,
             "max_log_mb": 2048, "min_free_mb": 1024}
_MODES = ("sync", "events", "cpu", "auto")
_TIMERS = ("sync", "events", "cpu")

# Timer kinds, resolved per worker class at its first timed cycle (CUDA is surely initialised by then).
_CPU, _SYNC, _EVENTS = 0, 1, 2
_TIMER_NAMES = ("cpu", "sync", "events")

# At most this many finished cycles wait for their CUDA events (or accepted copy); a cycle beyond is dropped and
# counted (only reachable when the GPU is hundreds of cycles behind the host, or hung).
_MAX_PENDING = 1024
_MAX_POOL = 4096
# The writer resolves waiting cycles once the worker has finished none for _QUIET_SECONDS, looking again every
# _POLL_SECONDS while they are not done; it keeps looking on a timer for _LINGER_SECONDS after the last one.
_QUIET_SECONDS = 0.05
_POLL_SECONDS = 0.005
_LINGER_SECONDS = 0.25

# The logs' bounds (docs/contract.md, "Bounds inside the server"). max_log_mb is the launch's, all ranks together:
# each rank's share is max_log_mb over the ranks (_rank_share). Its records go to a chain of files, the first
# `<host>-<pid>-rank<r>.jsonl`, then `<host>-<pid>-rank<r>.<i>.jsonl` (i = 000001, 000002, ...: names that sort
# in the order written), each a share / _FILES_PER_SHARE long at most and starting with a copy of the run header;
# the chain's oldest files are removed to keep it under the share. The log's filesystem is looked at (statvfs) at
# most every _FREE_CHECK_SECONDS: under min_free_mb free, nothing is written (the records are dropped and counted)
# until min_free_mb + _FREE_HYSTERESIS are free. A "drops" line says the losses so far, at most every
# _DROPS_LINE_SECONDS (and at the head of each new file, and at exit).
_MB = 1 << 20
_FILES_PER_SHARE = 8
_MIN_FILE_BYTES = 64 << 10
_FREE_CHECK_SECONDS = 1.0
_FREE_HYSTERESIS = 64 * _MB
_DROPS_LINE_SECONDS = 10.0
# Messages waiting for the writer (summaries, errors) at most: a stuck writer must not grow them without bound.
_MAX_MSGS = 256
# Why records are dropped (the "reasons" of a drops line), as the summary and exit lines say it.
_DROP_WHY = (("queue", "the log writer fell behind"),
             ("pending", "too many cycles waited for their CUDA events"),
             ("min-free", "the log's filesystem was under --min-free-mb"),
             ("full", "the log's filesystem was full"),
             ("error", "a write failed"),
             ("exit", "not written by exit"))

_perf = time.perf_counter     # the hot path's clock
_wall = time.time
_mono = time.perf_counter     # the same clock, for the writer and flush (a test may break the hot path's alone)
_clock = time.monotonic       # the writer's look at free space and its drops lines (a test may move it alone)

# Injection points for tests. _DIST: an object with torch.distributed's is_available/is_initialized/get_rank
# (None: torch.distributed, when torch is already imported by the process). _EUID: the user a log directory must
# belong to (None: os.geteuid()). _WRITER_THREAD: False runs no background thread; flush() and _service() then do
# its work on the calling thread.
_DIST = None
_EUID = None
_WRITER_THREAD = True


class _Local(threading.local):
    # The cycle being timed on this thread: None outside the entry method, False inside an untimed
    # (sampled-out, capturing, or failed-to-start) call, else a _Cycle. Class attribute = per-thread default.
    cur = None


class _Cycle(object):
    __slots__ = ("t", "t0", "worker", "bs", "prefill", "acc", "open", "accepted", "accepts", "acc_dev", "kind",
                 "ev0", "ev_end", "evs", "iv", "h_end", "obj", "spec", "lost", "others")


class _Unsafe(Exception):
    """The log directory or file may not be written (a link, not ours, writable by others, not a regular file)."""


_tls = _Local()
_QUOTED = {}
try:
    _host = socket.gethostname()
except Exception:  # pragma: no cover - gethostname does not fail on Linux
    _host = "unknown"
# The configuration (set by _set_config) and the state (set by _reset) are module globals, both set at import,
# before anything else runs (see the end of the module).


# --- errors and messages ------------------------------------------------------------------------------------
def _stderr(text):
    try:
        sys.stderr.write(text)
        sys.stderr.flush()
    except Exception:
        pass


def _error(where, direct=False):
    """Count an internal error; the first one of each kind is printed once, with a short traceback, by the
    writer thread (the worker thread never writes to stderr) or at once with `direct`."""
    global _errors
    _errors += 1
    try:
        if where in _reported:
            return
        _reported.add(where)
        etype, exc, tb = sys.exc_info()
        # The last frames as (file, line, function): no source line is read here (linecache reads and stats
        # files), the writer looks them up when it prints.
        stack = []
        while tb is not None:
            code = tb.tb_frame.f_code
            stack.append((code.co_filename, tb.tb_lineno, code.co_name, None))
            tb = tb.tb_next
        stack = stack[-6:]
        only = traceback.format_exception_only(etype, exc) if etype is not None else []
        del exc
        if direct:
            _stderr(_error_text(where, stack, only))
        elif len(_msgs) < _MAX_MSGS:
            _msgs.append(("error", where, stack, only))
            _wake.set()
            if _writer is None and _WRITER_THREAD:
                _start_writer()
    except Exception:
        pass


def _error_text(where, stack, only):
    frames = traceback.StackSummary.from_list(stack).format()      # source lines are read here, by the writer
    return ("[eaglepatch] internal error in %s (the server goes on; further errors of this kind are counted, not "
            "printed):\nTraceback (most recent call last):\n%s" % (where, "".join(frames + only)))


def _lose(n, carried=0, why="error"):
    """Count `n` records that will never be written, dropped for `why` (a reason of _DROP_WHY); `carried`: the
    losses they were to report ("dropped"), counted already, now to be reported by the next record instead."""
    global _lost
    with _lock:
        _lost += n + carried
        _count_drop(why, n)


def _count_drop(why, n):
    """Count `n` records dropped for `why` (the caller holds _lock)."""
    global _dropped, _dropped_win
    if n <= 0:
        return
    _dropped += n
    _dropped_win += n
    _drop_by[why] = _drop_by.get(why, 0) + n
    _drop_win_by[why] = _drop_win_by.get(why, 0) + n


def _why_text(counts):
    """'the log writer fell behind' (one reason), or 'the log writer fell behind: 3; a write failed: 1'."""
    items = [(text, counts[key]) for key, text in _DROP_WHY if counts.get(key)]
    if len(items) == 1:
        return items[0][0]
    return "; ".join("%s: %d" % item for item in items)


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
    """`_CONFIG`, then the environment, then `kw`, over the defaults; a value that does not fit is said on stderr
    and its default is used (a bad config line must not cost the server its timings, nor raise)."""
    cfg = dict(_DEFAULTS)
    if isinstance(_CONFIG, dict):
        cfg.update(_CONFIG)
    env = os.environ
    mode = env.get("EAGLEPATCH_MODE", "").strip().lower()
    if mode:
        if mode in _MODES:
            cfg["mode"] = mode
        else:
            sys.stderr.write("[eaglepatch] ignoring EAGLEPATCH_MODE=%r: not one of sync, events, cpu, auto\n" % mode)
    log_dir = env.get("EAGLEPATCH_LOG_DIR", "").strip()
    if log_dir:
        cfg["log_dir"] = log_dir
    every = _int_env(env, "EAGLEPATCH_EVERY", 1)
    if every is not None:
        cfg["every"] = every
    summary = _int_env(env, "EAGLEPATCH_SUMMARY_EVERY", 0)
    if summary is not None:
        cfg["summary_every"] = summary
    cap = _int_env(env, "EAGLEPATCH_MAX_LOG_MB", 1)
    if cap is not None:
        cfg["max_log_mb"] = cap
    floor = _int_env(env, "EAGLEPATCH_MIN_FREE_MB", 0)
    if floor is not None:
        cfg["min_free_mb"] = floor
    cfg.update(kw)
    out = {}
    for key, default in _DEFAULTS.items():
        value = cfg[key]
        try:
            if key == "mode":
                if value not in _MODES:
                    raise ValueError(value)
            elif key == "timers":
                value = dict((str(k), v) for k, v in value.items() if v in _TIMERS)
            elif key == "log_dir":
                value = os.path.expanduser(str(value))
            elif key in ("max_log_mb", "min_free_mb"):
                # megabytes (a fraction allowed); the cap above 0, the floor at least 0 (0: no floor)
                if type(value) is bool or not isinstance(value, (int, float)):
                    raise ValueError(value)
                if not (value > 0 if key == "max_log_mb" else value >= 0):
                    raise ValueError(value)
            elif isinstance(default, float):
                value = max(0.0, float(value))      # seconds
            elif key == "summary_every":
                value = max(0, int(value))          # 0: no summaries
            else:
                value = max(1, int(value))          # counts
        except Exception:
            sys.stderr.write("[eaglepatch] ignoring %s=%r in the configuration: using %r\n" % (key, value, default))
            value = default
        out[key] = value
    return out


def configure(**kw):
    """Reset all state and set the configuration: `_CONFIG`, then the environment, then `kw`.

    Keys: mode (sync|events|cpu|auto), timers ({worker class name: sync|events|cpu}, for auto), every, log_dir,
    summary_every, flush_records, flush_seconds, buffer_records, exit_seconds, max_log_mb, min_free_mb. Records
    not yet written are discarded. Meant for tests and tools; raises TypeError on an unknown key.
    """
    unknown = sorted(set(kw) - set(_DEFAULTS))
    if unknown:
        raise TypeError("configure() got unknown keys: %s" % ", ".join(unknown))
    stuck = _stop_writer()
    if not stuck:
        _close_log()            # (a writer still stuck in a write keeps its fd: closing it could hand its number
                                # to another file while it writes)
    _set_config(_load_config(kw))
    _reset()
    _tls.cur = None


def _set_config(cfg):
    global _cfg, _mode, _timers, _every, _summary_every, _flush_records, _flush_seconds, _buffer_records
    global _exit_seconds, _log_dir, _max_log_bytes, _min_free_bytes
    _cfg = cfg
    _mode = cfg["mode"]
    _timers = cfg["timers"]
    _every = cfg["every"]
    _summary_every = cfg["summary_every"]
    _flush_records = cfg["flush_records"]
    _flush_seconds = cfg["flush_seconds"]
    _buffer_records = cfg["buffer_records"]
    _exit_seconds = cfg["exit_seconds"]
    _log_dir = cfg["log_dir"]
    _max_log_bytes = cfg["max_log_mb"] * _MB       # the launch's, all ranks together (inf: no cap)
    _min_free_bytes = cfg["min_free_mb"] * _MB


def _reset():
    """Fresh state, for a new configuration or a forked child (locks too: a child may inherit a held one)."""
    global _skip_left, _classes, _timer_name, _cuda, _torch, _dev, _raw_stream, _streams, _capturing
    global _buf, _buf_since, _lost, _lost_q, _dropped, _dropped_win, _pending, _pool, _pinned, _msgs
    global _lock, _cv, _plock, _wlock, _wake, _pid, _rank, _path, _dir_in_use, _fallback, _torn, _fd, _run
    global _errors, _reported, _records, _win, _win_n, _writer, _writer_idle, _flush_req, _flush_ack, _flush_until
    global _flush_final, _last_end, _live, _live_shared, _live_watch, _live_next, _pins
    global _chain, _chain_bytes, _next_index, _want_new, _share, _file_bytes, _removed, _paused
    global _pause_wrote, _pause_from, _next_free_check, _free_left, _drop_by, _drop_win_by, _drops_said, _drops_next
    global _msgs_lost, _where
    _skip_left = 0          # untimed calls left before the next timed one (every=N)
    _classes = {}           # worker class -> (timer kind, worker name, can change its speculative settings)
    _timer_name = None      # the timer of the class resolved last (for _stats)
    _cuda = None            # None: not looked at yet; else whether the CUDA timers may run
    _torch = None           # the torch module, once CUDA is known to be initialised
    _dev = None             # CUDA device index seen then
    _raw_stream = None      # torch._C._cuda_getCurrentRawStream, when torch has it
    _streams = {}           # raw cudaStream_t -> torch.cuda.Stream (current_stream() costs ~4 us; this ~0.3)
    _capturing = None       # torch.cuda.is_current_stream_capturing once CUDA is in use, when torch has it

    _buf = []               # (wall start time, serialised record tail, records lost just before it) not yet written
    _buf_since = None       # perf_counter time when _buf became non-empty
    _lost = 0               # records lost since the last one buffered (the next one buffered carries the count)
    _lost_q = 0             # cycles dropped since the last one queued or emitted (too many pending; that one
                            # carries it)
    _dropped = 0            # records lost since configure (buffer full, write failed, too many pending, exit)
    _dropped_win = 0        # ... since the last summary
    _pending = deque()      # finished cycles waiting for their CUDA events or accepted copy, oldest first
    _pool = []              # reusable torch.cuda.Event objects
    _pinned = {}            # (shape, dtype) -> reusable pinned host tensors for accepted counts
    _msgs = deque()         # what the writer prints on stderr: ("error", ...), ("summary", ...)
    _lock = threading.Lock()        # _buf, _lost/_dropped, the summary window, flush requests; never held for I/O
    _cv = threading.Condition(_lock)    # flush() waits on it for the writer
    _plock = threading.Lock()       # resolving _pending; the worker only ever tries it (acquire(False))
    _wlock = threading.Lock()       # file writes, so batches keep their order
    _wake = threading.Event()       # wakes the writer

    _pid = os.getpid()
    _rank = None            # fixed at the first write (the file name carries it)
    _where = None           # the records' '"dp": D, "node": N, ' part (_parallel_fields), fixed with the rank
    _path = None
    _dir_in_use = None      # the log directory actually written to (the configured one, or the private fallback)
    _fallback = None        # the private fallback directory, once made
    _torn = False           # a failed write could not be cut back: the next batch starts with a newline
    _fd = None              # the log file, open for appending (one still open is the caller's to close)
    _run = None             # (run id, header fields) of this process's launch, found at the first write
    _chain = []             # [folder, name, bytes] of each log file of this process, oldest first; the last is
                            # the one written to (_fd, when open)
    _chain_bytes = 0
    _next_index = 0         # of the next file of the chain (0: the first, `<host>-<pid>-rank<r>.jsonl`)
    _want_new = False       # the next batch opens the chain's next file (the last one is full)
    _share = None           # bytes this rank's logs may hold (fixed at the first write); _file_bytes: a file's
    _file_bytes = None
    _removed = [0, 0]       # files, bytes of the chain removed to stay under the share
    _paused = None          # why nothing is written now ("min-free", "full", "error"), else None
    _pause_wrote = True     # a batch was written since the last pause ended (else a new pause is not said again)
    _pause_from = 0         # _dropped when the pause began (the resume line says how many since)
    _next_free_check = 0.0  # _clock time of the next look at the free space
    _free_left = None       # bytes free at the last look, less what was written since (None: unknown)
    _drop_by = {}           # reason -> records dropped since configure (see _DROP_WHY)
    _drop_win_by = {}       # ... since the last summary
    _drops_said = 0         # _dropped as the last drops line said it
    _drops_next = 0.0       # _clock time from which the next drops line may go out
    _msgs_lost = 0          # summaries not queued for the writer (too many queued already)

    _errors = 0
    _reported = set()
    _records = 0            # records emitted since configure (for tests and the exit line)
    _win = {}               # summary window: (worker, mode) -> aggregates
    _win_n = 0

    _writer = None          # the writer thread
    _writer_idle = False    # it sleeps with nothing due: new work must wake it
    _last_end = 0.0         # perf_counter time of the last cycle's end (the writer leaves the events to a busy
                            # worker)
    _flush_req = 0          # flush requests made / handled by the writer
    _flush_ack = 0
    _flush_until = 0.0      # perf_counter deadline of the latest request
    _flush_final = False    # the latest request is the exit's: cycles still waiting after it are dropped

    _live = None            # the live sweep's lease, as the writer last read it (see _live_start)
    _live_shared = False    # whether it says "shared": true (pin batches that hold others' requests too)
    _live_watch = False     # an adaptive worker has run: the writer looks for a lease
    _live_next = 0.0        # perf_counter time of the writer's next look
    _pins = {}              # id(controller) -> controller whose policy a live sweep holds off now (or handed back
                            # on a call that was not a decode batch: its state is still owed, see _live_start)


def _resolve_cuda():
    """Whether the CUDA timers may run: torch importable, CUDA already initialised by the process (never
    initialised here) and available. Looked at once, at the first timed cycle of a class with a CUDA timer."""
    global _cuda
    _cuda = False
    torch = sys.modules.get("torch")
    if torch is None:
        try:
            import torch
        except Exception:
            return False
    try:
        cuda = torch.cuda
        initialised = getattr(cuda, "is_initialized", None)
        if initialised is not None and not initialised():
            return False
        if not cuda.is_available():
            return False
        _adopt_cuda(torch)
        _cuda = True
    except Exception:
        _error("timer")
    return _cuda


def _adopt_cuda(torch):
    """Keep torch at hand for CUDA calls; only once CUDA is initialised (current_device() would initialise it)."""
    global _torch, _dev, _raw_stream, _capturing
    dev = torch.cuda.current_device()
    _raw_stream = getattr(getattr(torch, "_C", None), "_cuda_getCurrentRawStream", None)
    # torch.cuda.is_current_stream_capturing() is this binding plus a Python call; torch < 1.10 has neither.
    _capturing = (getattr(getattr(torch, "_C", None), "_cuda_isCurrentStreamCapturing", None)
                  or getattr(torch.cuda, "is_current_stream_capturing", None))
    _dev = dev
    _torch = torch


def _class_info(cls):
    """(timer kind, worker name, whether it can change its speculative settings at run time) of a worker class."""
    global _timer_name
    name = cls.__name__ if cls is not None else "?"
    mro = getattr(cls, "__mro__", ())
    timer = _mode
    if timer == "auto":
        timer = "sync"
        for k in mro:
            t = _timers.get(k.__name__)
            if t is not None:
                timer = t
                break
    kind = _CPU
    if timer != "cpu":
        cuda = _cuda
        if cuda is None:
            cuda = _resolve_cuda()
        if cuda:
            kind = _SYNC if timer == "sync" else _EVENTS
    # Adaptive speculative decoding (sglang 0.5.12+, sglang/srt/speculative/adaptive_runtime_state.py): a worker
    # implementing the AdaptiveSpecWorker protocol has apply_runtime_state(), which sets speculative_num_steps and
    # speculative_num_draft_tokens at run time (eagle_worker_v2.py, EAGLEWorkerV2.apply_runtime_state, 0.5.23).
    adaptive = any("apply_runtime_state" in getattr(k, "__dict__", ()) for k in mro)
    info = (kind, name, adaptive)
    if len(_classes) < 64:
        _classes[cls] = info
    _timer_name = _TIMER_NAMES[kind]
    return info


def _spec_of(w):
    """'"spec": {...}' for a worker whose adaptive controller is on, read from plain int attributes, else None.

    sglang 0.5.23 eagle_worker_v2.py: EAGLEWorkerV2.__init__ sets self.topk, self.speculative_num_steps and
    self.speculative_num_draft_tokens, and self.adaptive_controller (None unless --speculative-adaptive);
    apply_runtime_state() changes the steps and draft tokens when the controller switches: from
    activate_step_by_batch() at the start of a decode cycle (inside the entry method) and from
    on_verify_complete_cpu() (the scheduler, between cycles). So they are read at the cycle's end: the values
    the cycle ran with.
    """
    global _live_watch
    try:
        ctl = getattr(w, "adaptive_controller", None)
        if ctl is None:
            return None
        if not _live_watch:
            _live_watch = True  # an adaptive server: the writer looks for a live sweep's lease from now on
        steps = getattr(w, "speculative_num_steps", None)
        topk = getattr(w, "topk", None)
        draft = getattr(w, "speculative_num_draft_tokens", None)
        pinned = type(getattr(ctl, "params", None)) is _Pinned
    except Exception:           # a property that raises: no spec, the record goes out
        return None
    if type(steps) is int and type(topk) is int and type(draft) is int:
        return '"spec": {"steps": %d, "topk": %d, "draft_tokens": %d%s}' % (
            steps, topk, draft, ', "pinned": true' if pinned else "")
    return None


# --- live sweeps: a step count pinned by eaglepatch -------------------------------------------------------
# `eaglepatch sweep --live` measures each candidate step count inside one server started with sglang's
# --speculative-adaptive (sglang/srt/speculative/adaptive_runtime_state.py: the AdaptiveController holds a built
# runtime state per step count in `_states` and its policy in `params`; the worker switches with its own
# apply_runtime_state(state)). The protocol, all of it on the host:
# - The client writes a lease, `<log_dir>/live-<launcher pid>.json`: {"v": 1, "token": hex, "steps": [candidate
#   step counts], "deadline": epoch seconds}, and renews it while it runs.
# - The writer thread, once an adaptive worker has run (_live_watch), reads it every _LIVE_POLL_SECONDS,
#   validated like the log directory (a regular file of this user, not writable by others, not a link, small),
#   keeps it in `_live` and answers with `live-<launcher pid>-<pid>.ack` ({"v", "token", "pid", "rank"}); once
#   it is gone, invalid or past its deadline, it forgets it and removes the answer.
# - While a lease is held, a cycle whose batch holds a request whose id starts "eaglepatch-<token>-s<steps>-"
#   runs at that step count (unless the batch also holds requests not eaglepatch's, _others, and the lease does
#   not say "shared": true, sweep --live --allow-shared-traffic): at the cycle's start, on the worker thread, the controller's policy is replaced by
#   _Pinned (the same interface: it answers those steps and learns nothing) and the worker's
#   apply_runtime_state() is called with the controller's state for them. The first cycle without such a
#   request, past the deadline, or once the lease is gone, puts sglang's policy back and the state it chooses.
# - The state switches on decode batches only, as sglang's own controller does (its entry method's guard, read
#   the same way: _decode_batch): a prefill/extend call runs in whatever state the worker is in (one whose requests
#   name no held steps, or others, gives sglang its policy back, so its record is not "pinned", and the state waits
#   for the next decode batch); a batch whose mode cannot be read switches nothing and is counted. A switch is all or nothing (_switch): when it raises part way,
#   every attribute it touched is put back, the policy too, and the cycle runs in the previous state.
# The request ids decide, not the lease alone: every TP rank sees the same batch at the same cycle, so all ranks
# switch together, where a lease read at slightly different moments would have them run different step counts
# (the client waits for every rank's answer before it sends such requests). A killed client's requests end with
# its connections, and the deadline bounds the rest: the runtime never leaves a server pinned.
_LIVE_POLL_SECONDS = 0.5
_LIVE_MAX_BYTES = 4096
_LIVE_MAX_STEPS = 64


class _Pinned(object):
    """sglang's adaptive policy (the controller's `params`: AdaptiveSpeculativeParams) held off by a live sweep:
    `steps` for every batch, and nothing learnt (its moving average stays as it was, for when it is put back).
    Everything else is the policy's own."""

    def __init__(self, policy, steps):
        self.policy = policy
        self.steps = steps

    def __getattr__(self, name):        # candidate_steps, set_cuda_graph_bs, cuda_graph_bs_for_step, ...
        return getattr(self.__dict__["policy"], name)

    @property
    def current_steps(self):            # 0.5.12: the controller activates params.current_steps
        return self.steps

    def get_steps_for_batch(self, batch_size):          # 0.5.16+: activate_step_by_batch()
        return self.steps

    def on_verify_complete(self, num_correct_drafts_per_req, batch_size=0):     # 0.5.16+: no switch
        return None

    def update(self, num_correct_drafts_per_req):       # 0.5.12: no switch
        return False


def _marked_steps(batch, prefix):
    """The step count named by the first request of `batch` whose id starts with `prefix`, else None."""
    reqs = getattr(batch, "reqs", None)
    if not isinstance(reqs, (list, tuple)):
        return None
    n = len(prefix)
    for r in reqs:
        rid = getattr(r, "rid", None)
        if type(rid) is str and rid.startswith(prefix):
            end = rid.find("-", n)
            digits = rid[n:end] if end >= 0 else rid[n:]
            return int(digits) if digits.isdigit() and len(digits) <= 2 else None
    return None


def _live_start(args, kwargs):
    """At the start of an outermost entry call while a lease is held, a policy is held off or a hand-back owes its
    state: pin the step count the batch's marked requests name, or put sglang's policy back. The worker's state is
    switched on a decode batch only (_decode_batch), all or nothing (_switch). Never raises."""
    w = args[0] if args else None
    try:
        ctl = getattr(w, "adaptive_controller", None)
        if ctl is None:
            return
        key = id(ctl)
        pol = ctl.params
        lease = _live
        steps = None
        if lease is not None and _wall() < lease[2]:
            b = _batch_of(args, kwargs)
            steps = _marked_steps(b, lease[0])
            # a batch that also holds requests not eaglepatch's (_others) is never pinned unless the lease says
            # "shared": a pin would change the step count of the server's own requests
            if steps not in lease[1] or (not _live_shared and _others(b) is not None):
                steps = None
        held = type(pol) is _Pinned
        if steps is None and not held and key not in _pins:
            return                      # sglang's own, nothing owed
        if steps is not None and held and pol.steps == steps and w.speculative_num_steps == steps:
            return                      # pinned there already: nothing to switch
        decode = _decode_batch(args, kwargs)
        if decode and steps is not None:
            _switch(w, ctl, steps, args, kwargs)
            return
        if held and pol.steps != steps:
            # No request of the batch names the held steps: sglang's policy back at once, whatever the batch
            # (sglang asks it on decode batches only, and this cycle's record must not say pinned). Its state waits
            # for a decode batch: ctl stays in _pins, its params sglang's own, until one comes (or pins again).
            ctl.params = pol.policy
        if decode and key in _pins:
            del _pins[key]
            _switch(w, ctl, None, args, kwargs)
    except Exception:
        _error("live")


def _decode_batch(args, kwargs):
    """Whether the entry call's batch is a decode batch, read as sglang's own entry method reads it before its
    controller may switch (eagle_worker.py and eagle_worker_v2.py of every release with the adaptive mode, 0.5.12
    to 0.5.23: `if batch.forward_mode.is_extend() or batch.is_extend_in_batch:` is the prefill path; 0.5.16+ call
    activate_step_by_batch in the other one, 0.5.12 on_verify_complete after its verify). The argument is a
    ScheduleBatch (0.5.12's V2: a ModelWorkerBatch), both carrying the two. False for a prefill/extend batch; None
    when it cannot be read (counted as a "live mode" error, said once): nothing is switched then."""
    try:
        b = _batch_of(args, kwargs)
        extend = b.forward_mode.is_extend()
        if type(extend) is not bool:
            raise TypeError("forward_mode.is_extend() gave %s, not a bool" % type(extend).__name__)
        if extend:
            return False
        mixed = b.is_extend_in_batch
        if type(mixed) is not bool:
            raise TypeError("is_extend_in_batch is %s, not a bool" % type(mixed).__name__)
        return not mixed
    except Exception:
        _error("live mode")
        return None


def _switch(w, ctl, steps, args, kwargs):
    """On a decode batch: pin `steps` (hold sglang's policy off and apply the controller's state for them), or with
    `steps` None apply the state sglang's policy (handed back already) chooses for this batch. All or nothing: when
    anything raises part way (no state built for `steps`, the worker's apply_runtime_state after some of its
    attributes were set), every attribute touched since is put back (_snapshot, _restore), the controller's policy
    with them, and the error is counted and said once as the live sweep's; the cycle runs in the previous state."""
    snap = _snapshot(w)
    try:
        if steps is None:
            want = _policy_steps(ctl.params, args, kwargs)
            state = ctl._states.get(want) if type(want) is int else None
        else:
            want = steps
            state = ctl._states[steps]  # KeyError: no state was built for it (not a candidate of this launch)
            pol = ctl.params
            if type(pol) is _Pinned:
                pol.steps = steps
            else:
                ctl.params = _Pinned(pol, steps)
        if state is not None and w.speculative_num_steps != want:
            w.apply_runtime_state(state)
    except BaseException as exc:        # KeyboardInterrupt too: put back, then let it go on
        if isinstance(exc, Exception):
            _error("live")
        _restore(snap)
        if not isinstance(exc, Exception):
            raise
        return
    if steps is not None:
        _pins[id(ctl)] = ctl


def _policy_steps(policy, args, kwargs):
    """The step count sglang's policy chooses for this batch: 0.5.16+ by its size (activate_step_by_batch would
    switch at a decode cycle's start anyway), 0.5.12 its current_steps (it switches only once its moving average
    moves); None when it chooses none."""
    get = getattr(policy, "get_steps_for_batch", None)
    if get is not None:
        bs = _batch_size(args, kwargs)
        return get(bs) if bs else None
    return getattr(policy, "current_steps", None)


# What a switch may touch, snapshotted before it starts: the worker and every object one or two attribute steps from
# it (sglang's apply_runtime_state, every release: the worker's own attributes, its draft worker's, and those of
# the draft runner and the target's model runner one step further, its server_args; the controller and its policy
# are one and two steps from it). Values of these types hold no attributes of their own and are not looked into.
_SNAP_DEPTH = 2
_ATOMS = (type(None), bool, int, float, complex, str, bytes, tuple, list, dict, set, frozenset)
_ABSENT = object()


def _snapshot(w):
    """[(object, copy of its __dict__)] for `w` and each object within _SNAP_DEPTH attribute steps of it that keeps
    its attributes in a plain dict, each once (no classes, no modules, nothing with __slots__ only)."""
    out = []
    seen = set()
    level = [w]
    for depth in range(_SNAP_DEPTH + 1):
        below = []
        for o in level:
            if type(o) in _ATOMS or isinstance(o, (type, types.ModuleType)) or id(o) in seen:
                continue
            seen.add(id(o))
            try:
                d = object.__getattribute__(o, "__dict__")
            except Exception:
                continue
            if type(d) is not dict:
                continue
            out.append((o, d.copy()))
            if depth < _SNAP_DEPTH:
                below.extend(d.values())
        level = below
    return out


def _restore(snap):
    """Put each snapshotted object's attributes back as they were: a value set since is set back (by identity), one
    added is removed, one removed comes back. Written into __dict__ itself (a setter that raised once is not asked
    again); what a switch changes inside a value (a tensor filled in place, a dict it adds to) is not undone."""
    for o, before in snap:
        try:
            d = object.__getattribute__(o, "__dict__")
            for k in [k for k in d if k not in before]:
                del d[k]
            for k, v in before.items():
                if d.get(k, _ABSENT) is not v:
                    d[k] = v
        except Exception:
            _error("live restore")


def _live_wait(timeout, now):
    """The writer's wait, shortened to its next look for a lease."""
    left = max(0.0, _live_next - now)
    return left if timeout is None else min(timeout, left)


def _live_names():
    """(lease file name, this process's answer file name)."""
    lpid = _run_of()[1]["launcher"]
    return "live-%d.json" % lpid, "live-%d-%d.ack" % (lpid, os.getpid())


def _lease_of(doc):
    """(request id prefix, candidate steps, deadline, token) of a lease document, or None when it is not one that
    holds now."""
    if type(doc) is not dict or doc.get("v") != 1:
        return None
    token, steps, deadline = doc.get("token"), doc.get("steps"), doc.get("deadline")
    if type(token) is not str or not 8 <= len(token) <= 64 or token.strip("0123456789abcdef"):
        return None
    if type(steps) is not list or not 0 < len(steps) <= _LIVE_MAX_STEPS or not all(
            type(x) is int and 0 <= x <= _LIVE_MAX_STEPS for x in steps):
        return None
    if type(deadline) not in (int, float) or deadline <= _wall():
        return None
    return ("eaglepatch-%s-s" % token, frozenset(steps), float(deadline), token)


def _read_lease(name):
    """The lease document in the log directory, or None when there is none. Raises _Unsafe (a link, not a
    regular file, not ours, writable by others, too big), OSError, ValueError (not JSON)."""
    dfd = _open_dir(_log_dir)
    try:
        flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)
        try:
            fd = os.open(name, flags, dir_fd=dfd)
        except OSError as e:
            if e.errno == errno.ENOENT:
                return None
            if e.errno in (errno.ELOOP, errno.ENXIO):
                raise _Unsafe("%s is a link or not a regular file" % name)
            raise
        try:
            st = os.fstat(fd)
            uid = os.geteuid() if _EUID is None else _EUID
            if not stat.S_ISREG(st.st_mode) or st.st_uid != uid or st.st_mode & 0o022 or st.st_size > _LIVE_MAX_BYTES:
                raise _Unsafe("%s is not a small regular file of uid %d, writable by it alone" % (name, uid))
            data = os.read(fd, _LIVE_MAX_BYTES + 1)
        finally:
            os.close(fd)
    finally:
        os.close(dfd)
    return json.loads(data.decode("utf-8"))


def _live_answer(name, lease):
    """Write (lease) or remove (None) this process's answer file in the log directory."""
    dfd = _open_dir(_log_dir)
    try:
        if lease is None:
            try:
                os.unlink(name, dir_fd=dfd)
            except FileNotFoundError:
                pass
            return
        rank = _rank if _rank is not None else _detect_rank()
        data = json.dumps({"v": 1, "token": lease[3], "pid": os.getpid(), "rank": rank}).encode("utf-8")
        flags = (os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
                 | getattr(os, "O_NONBLOCK", 0))
        fd = os.open(name, flags, 0o600, dir_fd=dfd)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise _Unsafe("%s is not a regular file" % name)
            os.write(fd, data)
        finally:
            os.close(fd)
    finally:
        os.close(dfd)


def _live_poll():
    """The writer's look for a lease, at most every _LIVE_POLL_SECONDS: keep a valid one (answering a new one),
    forget one that is gone, invalid or past its deadline (removing the answer)."""
    global _live, _live_next, _live_shared
    now = _mono()
    if now < _live_next:
        return
    _live_next = now + _LIVE_POLL_SECONDS
    lease = None
    try:
        name, answer = _live_names()
        try:
            doc = _read_lease(name)
            lease = _lease_of(doc)
            # "shared": true (sweep --live --allow-shared-traffic): batches that also hold others' requests are
            # pinned too
            _live_shared = lease is not None and doc.get("shared") is True
        except (OSError, ValueError, _Unsafe) as e:
            lease = None
            if "live lease" not in _reported:
                _reported.add("live lease")
                _stderr("[eaglepatch] not following the live sweep lease %s in %s (%s): sglang's own adaptive "
                        "policy stays in charge\n" % (name, _log_dir, e))
        held = _live
        if lease is None:
            if held is not None:
                _live = None
                _live_answer(answer, None)
            return
        _live = lease
        if held is None or held[3] != lease[3]:
            _live_answer(answer, lease)
    except Exception:
        _error("live")


# --- the hooks ----------------------------------------------------------------------------------------
def _batch_of(args, kwargs):
    """The entry method's batch: the first positional argument after self, else keyword batch or
    model_worker_batch; None when there is none."""
    if len(args) > 1:
        return args[1]
    b = kwargs.get("batch")
    if b is None:
        b = kwargs.get("model_worker_batch")
    return b


def _batch_size(args, kwargs):
    """bs: len(batch.reqs), else batch.seq_lens.shape[0] (or len), else batch.batch_size(), else None."""
    b = _batch_of(args, kwargs)
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


# --- whose requests a batch holds ------------------------------------------------------------------------
# Every request eaglepatch's load sends (bench, sweep, sweep --live) has an sglang rid starting with _OURS; any
# other request with a string rid is the server's own traffic. A record says so when its batch holds some:
# '"others": N' (requests not eaglepatch's) and, in a batch of both kinds of at most 256 requests, '"others_at":
# [i, ...]' (their places in batch order, as "accepts" lists them). Cheap on the hot path: the batch is looked
# into again only when its membership may have changed (another reqs list, another length, or other first or last
# request: sglang's scheduler filters into a new list and merges by appending), and then the ids are joined and the
# prefix counted in C; the places are found one by one only in a batch of both kinds.
_OURS = "eaglepatch-"
_NL_OURS = "\n" + _OURS
# (id of its reqs list, len, first, last) of the batch last looked into, the first and last request by weak
# reference (_ref): held, they (and the list) would keep the last batch's requests alive past their time, an idle
# server's for good. A list takes no weak reference: its id stands for it, guarded by the two requests being alive and
# the same (sglang filters a batch into a new list, order kept, and merges by appending: a list at a freed one's
# address with the same length and ends then holds the same requests).
_own_key = None
_own_val = None             # its (others, record text) or None


def _ref(obj):
    """A weak reference to `obj`; where it takes none (object(), a class with __slots__), a callable that holds it:
    an id alone could be a freed object's."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda: obj


def _others(batch):
    """(requests of `batch` whose rid is a string not starting with _OURS, the record's text for it), else None
    (none, no reqs list, or no request with a string rid)."""
    global _own_key, _own_val
    reqs = getattr(batch, "reqs", None)
    if type(reqs) is not list and type(reqs) is not tuple:
        return None
    n = len(reqs)
    if not n:
        return None
    first, last = reqs[0], reqs[-1]
    key = _own_key
    if key is not None and key[0] == id(reqs) and key[1] == n and key[2]() is first and key[3]() is last:
        return _own_val
    key = (id(reqs), n, _ref(first), _ref(last))
    try:
        ours = None
        try:
            rids = [r.rid for r in reqs]
            # the ids joined and the prefix counted in C: eaglepatch's requests, at the start of a line
            mine = "\n".join(rids).count(_NL_OURS) + rids[0].startswith(_OURS)
            others = n - mine
        except (AttributeError, TypeError):     # some request has no string rid: those count on neither side
            ours = [r.startswith(_OURS) if type(r) is str else None for r in [getattr(q, "rid", None) for q in reqs]]
            others = ours.count(False)
        if not others:
            val = None
        elif (others == n and ours is None) or n > 256:
            val = (others, ', "others": %d' % others)
        else:
            if ours is None:
                at = [i for i, r in enumerate(rids) if not r.startswith(_OURS)]
            else:
                at = [i for i, o in enumerate(ours) if o is False]
            val = (others, ', "others": %d, "others_at": %r' % (others, at))
    except Exception:
        val = None
        _error("others")
    _own_key, _own_val = key, val
    return val


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
    """A new timed cycle, its start boundary taken last (so the set-up is not billed to the cycle); None when
    the current stream is capturing a CUDA graph (the cycle runs untimed)."""
    cls = type(args[0]) if args else None
    info = _classes.get(cls)
    if info is None:
        info = _class_info(cls)
    cap = _capturing
    if cap is not None and cap():
        return None
    kind = info[0]
    c = _Cycle()
    c.worker = info[1]
    c.obj = args[0] if info[2] else None
    c.spec = None
    c.bs = _batch_size(args, kwargs)
    c.others = _others(_batch_of(args, kwargs))
    c.prefill = False
    c.acc = {}
    c.open = {}
    c.accepted = None
    c.accepts = None
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
        if _live is not None or _pins:  # a live sweep: this cycle's state, before sglang's own choice
            _live_start(args, kwargs)
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
    it is copied asynchronously into pinned memory and read once the copy is done (by the writer thread).
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
            for a in attrs:             # (not empty: v is set)
                v = getattr(obj, a, None)
                if v is not None:
                    break
        if v is None:
            return
        c.acc_dev = None
        c.accepts = None
        if isinstance(v, (list, tuple)):
            c.accepted = int(sum(v)) + bonus_per_req * len(v)
            # per request, bonus included: the acceptance profile (the worker's own list, read once the cycle
            # ends, before the worker's next verify makes a new one)
            c.accepts = [x + bonus_per_req for x in v] if bonus_per_req else v if type(v) is list else list(v)
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
            if v.is_cuda and c.kind != _SYNC:
                if _torch is None:
                    # The cpu timer meets a CUDA tensor: CUDA is initialised (the tensor lives there), so torch
                    # may be used now, for the copy below and for the capture check of later cycles.
                    _adopt_cuda(torch)
                    if _capturing is not None and _capturing():
                        return
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
                if dim:
                    c.accepted = int(sum(x)) + bonus
                    c.accepts = [i + bonus_per_req for i in x] if bonus_per_req else x
                else:
                    c.accepted = int(x) + bonus
            else:
                c.accepted = int(v.sum().item()) + bonus
            return
        # Anything else with a length and a sum (a numpy array).
        c.accepted = int(v.sum()) + bonus_per_req * len(v)
    except Exception:
        c.accepted = None
        c.accepts = None
        c.acc_dev = None
        _error("accepted")


def flush():
    """Write buffered records now: the writer thread resolves the cycles whose events are done (waiting for the
    others at most exit_seconds, by query), writes and prints; this waits for it at most exit_seconds."""
    try:
        _flush(False)
    except Exception:
        _error("flush", direct=True)


# --- cycle end, records, summaries ---------------------------------------------------------------------
def _abort(c):
    """The wrapped call raised: no record; give the events (and a pinned buffer) back."""
    try:
        if c.kind == _EVENTS:
            _give_back(c.evs)
    except Exception:
        _error("entry")


def _give_back(evs):
    if len(_pool) < _MAX_POOL:
        _pool.extend(evs)


def _give_back_acc(dev):
    """An accepted copy's event and pinned buffer, for reuse: only once the copy is known done (a pending copy
    into a reused buffer would be a race)."""
    host, ev, _, _, key = dev
    if len(_pool) < _MAX_POOL:
        _pool.append(ev)
    # As many per shape as cycles may be outstanding between two looks of the writer (a fast loop: dozens),
    # within a bound on pinned memory (a few bytes each, but a page at least): 64 shapes x 64.
    free = _pinned.get(key)
    if free is None:
        if len(_pinned) >= 64:
            return
        free = _pinned[key] = []
    if len(free) < 64:
        free.append(host)


def _finish(c):
    global _lost_q, _last_end
    if _writer is None and _WRITER_THREAD:
        _start_writer()
    c.lost = _lost_q
    if c.lost:
        _lost_q = 0
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
        if c.obj is not None:
            c.spec = _spec_of(c.obj)
            c.obj = None
        _last_end = now
        _enqueue(c)
        _poll()
    else:
        if kind == _SYNC:
            _torch.cuda.synchronize()
        now = c.h_end = _perf()
        acc = c.acc
        if c.open:
            for name, t0 in c.open.items():
                acc[name] += now - t0
        if c.obj is not None:
            c.spec = _spec_of(c.obj)
            c.obj = None
        _last_end = now
        if c.acc_dev is None and not _pending:
            _emit(c, now - c.t0, acc, None, None)
        else:                   # waiting for an accepted copy, or behind one that is (records stay in order)
            _enqueue(c)
            _poll()


def _poll():
    """On the worker thread, at a cycle's end: resolve the waiting cycles that are done, oldest first (query
    only, never a wait: a cycle not done yet stays for the next cycle, or for the writer once the worker is
    quiet). Skipped when the writer is resolving (the lock is never waited for)."""
    if not _plock.acquire(False):
        return
    try:
        _resolve_loop(None)
    except Exception:
        _error("events")
    finally:
        _plock.release()


def _enqueue(c):
    """A finished cycle waits to be resolved; dropped (and counted) when too many already wait."""
    global _lost_q
    p = _pending
    if len(p) >= _MAX_PENDING:
        with _lock:
            _count_drop("pending", 1)
        _lost_q += c.lost + 1           # the next cycle to get through carries the count
        return
    p.append(c)
    if _writer_idle:
        _wake.set()


def _ready(c):
    if c.kind == _EVENTS and not c.ev_end.query():
        return False
    dev = c.acc_dev
    return dev is None or dev[1].query()


def _resolve_pending(deadline, final):
    """Resolve finished cycles, oldest first, on the writer's (or a flushing) thread: CUDA events done and
    accepted copies done, by query only. With a `deadline`, wait (polling) until all are done or it passes;
    with `final`, the ones still not done then are dropped and counted."""
    with _plock:
        if _torch is not None and _pending:
            _relax_capture_mode()
            with _torch.cuda.device(_dev):      # this thread's device may not be the worker's
                _resolve_loop(deadline)
        else:
            _resolve_loop(deadline)
        if final and _pending:
            n = len(_pending)
            carried = sum(c.lost for c in _pending)
            _pending.clear()
            _lose(n, carried, "exit")


def _resolve_loop(deadline):
    pending = _pending
    while pending:
        c = pending[0]
        try:
            if not _ready(c):
                if deadline is None or _mono() >= deadline:
                    return
                time.sleep(0.002)
                continue
            _resolve(c)
        except Exception:
            _lose(1, c.lost, "error")           # a cycle that cannot be read is dropped, not retried forever
            _error("events")
        pending.popleft()                       # only now: a cycle ending meanwhile queues behind this one


_relaxed = threading.local()
_capture_relaxed = None     # whether the last thread that tried could relax its capture mode (for _stats)


def _relax_capture_mode():
    """Let this (non-worker) thread query CUDA events while another thread captures a CUDA graph: under the
    default "global" capture mode, an event query from any thread invalidates the capture; a thread in
    "thread local" mode is not held to other threads' captures (PyTorch's NCCL watchdog does the same, PR 148594).
    torch has no binding for it: the driver's cuThreadExchangeStreamCaptureMode, only if the driver is loaded."""
    global _capture_relaxed
    if getattr(_relaxed, "done", False):
        return
    _relaxed.done = True
    ok = False
    try:
        import ctypes
        lib = ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        mode = ctypes.c_int(1)                  # CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        ok = lib.cuThreadExchangeStreamCaptureMode(ctypes.byref(mode)) == 0
    except Exception:
        pass                                    # not Unix (no RTLD_NOLOAD), no driver loaded: nothing to relax
    _capture_relaxed = ok


def _resolve(c):
    dev = c.acc_dev
    if dev is not None:
        try:
            host = dev[0]
            if host.dim() == 1:
                x = host.tolist()
                total = sum(x)
                each = dev[2] // len(x) if x else 0     # the bonus per request (the total is per request x len)
                c.accepts = [i + each for i in x] if each else x
            elif host.dim() == 0:
                total = host.tolist()
            else:
                total = host.sum().item()
            c.accepted = int(total) + dev[2]
            _give_back_acc(dev)
        except Exception:
            c.accepted = None       # the record still goes out, without its count
            c.accepts = None
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
    """Serialise one record (all but v/t/host/pid/rank/dropped, which the writer adds) and buffer it, or drop it
    (counted) when the buffer is full. Called on the worker thread (sync/cpu) or the writer (events)."""
    global _buf_since, _records, _lost, _win_n
    cycle_ms = round(cycle_s * 1000.0, 4)
    parts = []
    for name, s in phases.items():
        parts.append("%s: %r" % (_q(name), round(s * 1000.0, 4)))
    mode = "prefill" if c.prefill else "decode"
    bs = c.bs
    acc = c.accepted
    tail = '"worker": %s, "mode": "%s", "bs": %s, "cycle_ms": %r, "timer": "%s", "phases": {%s}, "accepted": %s' % (
        _q(c.worker), mode, "null" if bs is None else bs, cycle_ms, _TIMER_NAMES[c.kind], ", ".join(parts),
        "null" if acc is None else acc)
    if c.accepts is not None:
        tail += _accepts_json(c.accepts)
    if host_phases is not None:
        hparts = []
        for name, s in host_phases.items():
            hparts.append("%s: %r" % (_q(name), round(s * 1000.0, 4)))
        tail += ', "host_phases": {%s}, "host_cycle_ms": %r' % (", ".join(hparts), round(host_cycle_s * 1000.0, 4))
    if c.spec is not None:
        tail += ", " + c.spec
    if c.others is not None:
        tail += c.others[1]
    if _every > 1:              # the entry calls this record stands for: itself and the untimed ones after it
        tail += ', "every": %d' % _every
    tail += "}\n"
    wake = False
    with _lock:
        buf = _buf
        n = len(buf)
        if n >= _buffer_records:            # the writer is behind (a stuck disk): drop, count
            _lost += 1 + c.lost
            _count_drop("queue", 1)
        else:
            if not n:
                _buf_since = _perf()
            buf.append((c.t, tail, _lost + c.lost))
            _lost = 0
            n += 1
            wake = n == _flush_records or (n == 1 and _writer_idle)
        _records += 1
        if _summary_every:
            key = (c.worker, mode)
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
                _take_summary()
                wake = True
    if wake:
        _wake.set()


def _accepts_json(accs):
    """', "accepts": [3, 1, 4]' (tokens per request, bonus included, in batch order), or above 256 requests the
    histogram ', "accept_hist": {"1": 200, "2": 41}' (tokens: requests); '' when they are not whole numbers (the
    record goes out without them: its sum is in "accepted")."""
    try:
        if len(accs) <= 256:
            for x in accs:
                if type(x) is not int:
                    break
            else:
                return ', "accepts": ' + repr(accs)     # a list of ints: its repr is JSON
            return ', "accepts": [%s]' % ", ".join(["%d" % x for x in accs])
        hist = {}
        for x, n in _Counter(accs).items():  # counted in C, then only the distinct values in Python
            x = int(x)
            hist[x] = hist.get(x, 0) + n
        return ', "accept_hist": {%s}' % ", ".join(['"%d": %d' % kv for kv in sorted(hist.items())])
    except Exception:
        return ""


def _take_summary():
    """Hand the summary window to the writer (caller holds _lock); dropped (counted) when _MAX_MSGS messages wait
    already (a stuck writer)."""
    global _win, _win_n, _dropped_win, _drop_win_by, _msgs_lost
    if len(_msgs) < _MAX_MSGS:
        _msgs.append(("summary", _win, _dropped_win, _drop_win_by))
        _dropped_win = 0
        _drop_win_by = {}
    else:
        _msgs_lost += 1             # its drops stay in the window: the next summary printed says them
    _win = {}
    _win_n = 0


def _summary_lines(win, dropped, why=None):
    rank = _rank if _rank is not None else _detect_rank()
    lines = []
    for (worker, mode), g in win.items():
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
            line += " | %.1f in-cycle tok/s" % (acc / acc_cyc * 1000.0)  # time inside the entry method only
        lines.append(line)
    if dropped:
        lines.append("[eaglepatch] rank%d dropped %d record(s) since the last summary (%s)"
                     % (rank, dropped, _why_text(why) if why else "the log writer fell behind"))
    return lines


def _print_msgs():
    """Print what the hooks queued for stderr (writer thread, or flush without one)."""
    msgs = _msgs
    while msgs:
        try:
            m = msgs.popleft()
        except IndexError:
            return
        try:
            if m[0] == "error":
                _stderr(_error_text(m[1], m[2], m[3]))
            elif m[0] == "summary":
                lines = _summary_lines(m[1], m[2], m[3])
                if lines:
                    _stderr("\n".join(lines) + "\n")
        except Exception:
            _error("summary", direct=True)


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


# --- which launch this process belongs to ----------------------------------------------------------------
_PROC = "/proc"     # tests point it elsewhere
try:
    _MODULE_PATH = os.path.realpath(__file__)   # the install this runtime belongs to, named in the run header
except NameError:                               # exec'd without a file (tests)
    _MODULE_PATH = None
# Options (and NAME=value words) of the launcher's command line whose values are never written to a log (an API
# key in a header line): names ending in one of these, lower-cased, "_" read as "-". eaglepatch/redact.py holds
# the same rule for what eaglepatch prints; tests/real/test_secret_names.py holds the two equal.
_SECRET_SUFFIXES = ("key", "token", "secret", "password", "passwd", "credential", "credentials")
_NOT_SECRET_SUFFIXES = ("-per-token", "-first-token")     # a measure per token is no secret
_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=")    # NAME=value as one word (env's form)


def _proc_cmdline(pid):
    """The argv of process `pid` from /proc, or None."""
    try:
        with open("%s/%d/cmdline" % (_PROC, pid), "rb") as f:
            raw = f.read()
    except (OSError, ValueError):
        return None
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0")[:-1]] if raw else None


def _proc_stat(pid):
    """(parent pid, start time in clock ticks since boot) of process `pid` from /proc, or None."""
    try:
        with open("%s/%d/stat" % (_PROC, pid), "rb") as f:
            raw = f.read()
        fields = raw[raw.rindex(b")") + 2:].split()     # the name in parentheses may hold spaces and ")"
        return int(fields[1]), int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def _is_mp_child(argv):
    """Whether this command line is a process that Python's multiprocessing started (spawn or forkserver), or one
    that sglang renamed: sglang starts its schedulers (one per rank) and its data-parallel controller with spawn,
    and each then renames itself with setproctitle ("sglang::scheduler_TP0", "sglang::data_parallel_controller",
    sglang/srt/managers/scheduler.py), which overwrites the command line that /proc shows."""
    return bool(argv) and (argv[0].startswith("sglang::") or any("multiprocessing" in a for a in argv))


def _launcher(pid):
    """(pid, start ticks, argv) of the launch process `pid` belongs to: the nearest of itself and its ancestors
    that multiprocessing did not start, sglang did not rename, and that is not a fork of its parent (same command
    line). Every rank of
    one server launch, however deep, finds the same process; another launch (a new process, or the same pid
    reused later) has another pid or start time. Without /proc: this process, start 0, argv unknown."""
    argv = _proc_cmdline(pid)
    st = _proc_stat(pid)
    if argv is None or st is None:
        return pid, 0, list(sys.argv)
    for _ in range(64):
        ppid = st[0]
        if ppid <= 1:
            break
        pargv = _proc_cmdline(ppid)
        pst = _proc_stat(ppid)
        if pargv is None or pst is None or not (_is_mp_child(argv) or argv == pargv):
            break
        pid, argv, st = ppid, pargv, pst
    return pid, st[1], argv


# The launch options a run's header keeps beside the speculative ones: the largest batch the server runs (what
# `report --predict` prices the step counts up to)
_BATCH_FLAGS = ("--cuda-graph-max-bs", "--max-running-requests")


def _flags_of(argv):
    """The `--speculative-*` options of a launch command line and its batch limits (`_BATCH_FLAGS`), `{name:
    value}` (a bare flag: true)."""
    flags = {}
    i = 0
    while i < len(argv):
        a = argv[i]
        i += 1
        if not a.startswith("--speculative-") and a.partition("=")[0] not in _BATCH_FLAGS:
            continue
        name, eq, value = a[2:].partition("=")
        if eq:
            flags[name] = value
        elif i < len(argv) and not argv[i].startswith("--"):
            flags[name] = argv[i]
            i += 1
        else:
            flags[name] = True
    return flags


def _secret_name(name):
    """Whether an option (`--api-key`) or variable (`HF_TOKEN`) holds a secret: its name, without leading dashes,
    lower-cased, `_` read as `-`, ends in one of `_SECRET_SUFFIXES` (`--speculative-num-draft-tokens` does not)."""
    norm = name.lstrip("-").lower().replace("_", "-")
    return bool(norm) and norm.endswith(_SECRET_SUFFIXES) and not norm.endswith(_NOT_SECRET_SUFFIXES)


def _redacted(argv):
    """`argv` with the value of every secret option (`--api-key V`, `--api-key=V`) and secret `NAME=V` word
    replaced by "***"."""
    out = []
    hide = False
    for a in argv:
        if hide and not a.startswith("--"):
            out.append("***")
            hide = False
            continue
        hide = False
        if a.startswith("--"):
            name, eq, _ = a.partition("=")
            if _secret_name(name):
                if eq:
                    a = name + "=***"
                else:
                    hide = True
        else:
            m = _ASSIGNMENT.match(a)
            if m and _secret_name(m.group(1)):
                a = m.group(0) + "***"
        out.append(a)
    return out


def _run_of():
    """(run id, header fields) of this process: the id is `<host>-<launcher pid>-<launcher start ticks>-<8 hex
    digits of the configuration>`, the same in every rank of one launch with one configuration."""
    global _run
    if _run is None:
        lpid, ticks, argv = _launcher(os.getpid())
        cfg = json.dumps([_cfg.get("mode"), sorted(_cfg.get("timers", {}).items()), _cfg.get("every")])
        digest = 0
        for ch in cfg.encode("utf-8"):          # FNV-1a: stable across processes (str hash() is salted)
            digest = ((digest ^ ch) * 0x01000193) & 0xFFFFFFFF
        rid = "%s-%d-%d-%08x" % (_host, lpid, ticks, digest)
        _run = (rid, {"timer": _mode, "flags": _flags_of(argv), "launcher": lpid, "argv": _redacted(argv)})
    return _run


def _header_line(pid, rank):
    """The run header written first whenever this process opens its log file: the run and its fields, where the
    records go ("log_dir": the configured directory, or the private one it fell back to, with "fallback_from"
    then) and which install wrote them ("runtime": this module's real path, inside the sglang package)."""
    rid, fields = _run_of()
    h = {"v": 1, "kind": "run", "run": rid, "t": round(_wall(), 6), "host": _host, "pid": pid, "rank": rank}
    h.update(fields)
    h["log_dir"] = _dir_in_use
    if _fallback is not None and _dir_in_use == _fallback:
        h["fallback_from"] = _log_dir
    h["runtime"] = _MODULE_PATH
    return json.dumps(h) + "\n"


def _open_dir(path):
    """An fd of directory `path` (the caller closes it). Raises _Unsafe when it is a link, not a directory, not
    ours or writable by group/others; OSError when it cannot be opened."""
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        dfd = os.open(path, flags)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise _Unsafe("a link or not a directory")
        raise
    try:
        st = os.fstat(dfd)
        uid = os.geteuid() if _EUID is None else _EUID
        if not stat.S_ISDIR(st.st_mode):
            raise _Unsafe("not a directory")
        if st.st_uid != uid:
            raise _Unsafe("owned by uid %d, not %d" % (st.st_uid, uid))
        if st.st_mode & 0o022:
            raise _Unsafe("writable by group or others (mode %o)" % stat.S_IMODE(st.st_mode))
    except BaseException:
        os.close(dfd)
        raise
    return dfd


def _open_in(path, name):
    """An fd appending to `name` in directory `path`, made (0700) when missing. Raises _Unsafe when the directory
    is a link, not a directory, not ours or writable by group/others, or the file is a link or not a regular
    file; OSError when it cannot be made or opened."""
    if not os.path.lexists(path):
        try:
            os.makedirs(path, 0o700)
            os.chmod(path, 0o700)       # only when we made it; makedirs' mode is subject to the umask
        except FileExistsError:
            pass                        # made by another rank meanwhile: checked below like any other
    dfd = _open_dir(path)
    try:
        try:
            lst = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            lst = None
        if lst is not None and not stat.S_ISREG(lst.st_mode):
            raise _Unsafe("%s is a link or not a regular file" % name)
        # O_NONBLOCK: a FIFO planted between the check and the open must not block the open.
        fflags = (os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
                  | getattr(os, "O_NONBLOCK", 0))
        try:
            fd = os.open(name, fflags, 0o600, dir_fd=dfd)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENXIO):
                raise _Unsafe("%s is a link or not a regular file" % name)
            raise
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise _Unsafe("%s is not a regular file" % name)
        except BaseException:
            os.close(fd)
            raise
        return fd
    finally:
        os.close(dfd)


def _open_log(name):
    """An fd appending to this process's log file: in the configured directory, else (once it is found unsafe
    or unusable) in a private directory made for the purpose, said once on stderr."""
    global _dir_in_use, _fallback
    if _fallback is None:
        try:
            fd = _open_in(_log_dir, name)
            _dir_in_use = _log_dir
            return fd
        except (OSError, _Unsafe) as e:
            if isinstance(e, OSError) and e.errno in _FULL_ERRNOS:
                raise                   # a full filesystem is waited out, not fled (the private dir is in /tmp)
            why = str(e) if isinstance(e, _Unsafe) else (e.strerror or str(e))
            _fallback = tempfile.mkdtemp(prefix="eaglepatch-")
            _stderr("[eaglepatch] not writing timing records to %s (%s): writing them to %s instead\n"
                    % (_log_dir, why, _fallback))
    _dir_in_use = _fallback
    return _open_in(_fallback, name)


def _append(fd, data, size):
    """Write `data` (whole lines) at the end of the file, `size` bytes long. Returns (lines lost, the OSError, the
    bytes of `data` left in the file): (0, None, len(data)) when all was written; on a failed or short write, once
    the file is cut back to its last whole line, the lines lost and the error."""
    global _torn
    done = 0
    try:
        view = memoryview(data)
        while done < len(data):
            n = os.write(fd, view[done:])
            if n <= 0:
                raise OSError(errno.EIO, "write returned %r" % (n,))
            done += n
        return 0, None, done
    except OSError as e:
        try:
            done = os.fstat(fd).st_size - size      # what reached the file, whatever the failed call reported
        except OSError:
            pass
        keep = data.rfind(b"\n", 0, max(0, done)) + 1
        try:
            os.ftruncate(fd, size + keep)
        except OSError:
            _torn = keep != done            # the next batch starts on a new line
            keep = max(0, done)
        else:
            if keep:
                _torn = False               # the file ends with a whole line of this batch (its newline included)
        # (one line too many when the batch began with a newline: see _torn)
        return data.count(b"\n", data.rfind(b"\n", 0, max(0, keep)) + 1), e, keep


# errno values of a write that found no room: the filesystem full, or the user's quota spent
_FULL_ERRNOS = frozenset(getattr(errno, n) for n in ("ENOSPC", "EDQUOT") if hasattr(errno, n))


def _write_buffered(status=False):
    """Write all buffered records (writer thread, or flush without one), by _write_lines. `status`: a drops line
    goes out even without a record when the losses changed since the last one (flush, exit)."""
    global _buf, _buf_since, _rank, _share, _file_bytes, _where
    pid = os.getpid()
    if pid != _pid:
        _after_fork_child()     # the buffer is the parent's: it writes it itself
        return
    with _lock:
        lines = _buf
        if not lines and not (status and _dropped != _drops_said and _paused is None):
            return
        _buf = []
        _buf_since = None
    with _wlock:
        try:
            if _rank is None:
                _rank = _detect_rank()
            if _where is None:
                _where = _parallel_fields(_rank)
            if _share is None:
                _share = _rank_share()
                _file_bytes = min(_share, max(_MIN_FILE_BYTES, _share / _FILES_PER_SHARE))
            rid = _run_of()[0]
            mid = (', "host": %s, "pid": %d, "rank": %d, %s"run": %s, ' % (_q(_host), pid, _rank, _where, _q(rid))
                   ).replace("%", "%%")
            fmt = '{"v": 1, "t": %.6f' + mid + "%s"
            fmt_lost = '{"v": 1, "t": %.6f' + mid + '"dropped": %d, %s'
            parts = [((fmt_lost % (t, lost, tail)) if lost else (fmt % (t, tail))).encode("utf-8")
                     for t, tail, lost in lines]
        except Exception:
            _close_log()
            _lose(len(lines), sum(x[2] for x in lines))
            _error("flush")
            return
        _write_lines(parts, lines, pid, rid, status)


def _write_lines(parts, lines, pid, rid, status):
    """Append the serialised records `parts` (of `lines`, the buffer's entries) to this process's chain of log
    files, bounded (see _MB): a file holds _file_bytes at most (a record that would not fit goes to the chain's
    next file, opened with a copy of the run header; a file holds one record at least), the chain this rank's
    share (its oldest files removed first, never the one written to), and the filesystem keeps min_free_mb free
    (_room_on_disk). What cannot be written is dropped and counted; a failed write (ENOSPC, any OSError) cuts the
    file back to its last whole line and pauses writing (_pause), said once, no traceback."""
    global _want_new, _chain_bytes, _free_left, _drops_said, _drops_next, _pause_wrote, _torn
    i, n = 0, len(parts)
    drops = (status and _dropped != _drops_said) or _drops_line_due()
    turns = 0
    while i < n or drops:
        turns += 1
        if turns > 2 * n + 64:                  # (never: each turn writes, or opens the chain's next file)
            _lose(n - i, sum(x[2] for x in lines[i:]))
            _error("rotate")
            return
        if not _room_on_disk(0):
            break                               # paused: the rest is dropped (below)
        try:
            fd, size, pre, entry = _current_file(pid)
        except OSError as e:
            if e.errno in _FULL_ERRNOS:         # no room to make the chain's next file
                _pause("full", e)
                break
            _close_log()
            _lose(n - i, sum(x[2] for x in lines[i:]))
            _error("flush")
            return
        except Exception:
            _close_log()
            _lose(n - i, sum(x[2] for x in lines[i:]))
            _error("flush")
            return
        if pre and _dropped:
            drops = True                        # a new file: its head says the losses so far
        if _torn:
            pre = b"\n" + pre
        said = None
        if drops:
            line, said = _drops_line(pid, rid)
            pre += line
        room = _file_bytes - size - len(pre)
        j, take = i, 0
        while j < n and (take + len(parts[j]) <= room or (j == i and size == 0)):
            take += len(parts[j])
            j += 1
        if j == i < n:
            _want_new = True                    # this file is full: the chain's next one
            continue
        data = pre + b"".join(parts[i:j])
        if not _fit_share(len(data), size):
            _want_new = True                    # the file written to is in the way itself: the next one
            continue
        if not _room_on_disk(len(data)):
            break
        lost, exc, kept = _append(fd, data, size)
        entry[2] += kept                        # (its own: configure() may have replaced the chain meanwhile)
        _chain_bytes += kept
        if _free_left is not None:
            _free_left -= kept
        if exc is not None:
            _close_log()
            lost = min(lost, j - i)
            _pause("full" if exc.errno in _FULL_ERRNOS else "error", exc)
            _lose(lost + n - j, sum(x[2] for x in lines[j - lost:]), _paused)
            return
        _torn = False
        if said is not None:
            _drops_said = said
            _drops_next = _clock() + _DROPS_LINE_SECONDS
        drops = False
        if not _pause_wrote:
            _pause_wrote = True
            free = "?" if _free_left is None else "%d" % (_free_left // _MB)
            _stderr("[eaglepatch] writing the timing log again (%s MB free at %s); %d record(s) were dropped "
                    "meanwhile\n" % (free, _dir_in_use, _dropped - _pause_from))
        i = j
    if i < n:
        _lose(n - i, sum(x[2] for x in lines[i:]), _paused or "min-free")


def _current_file(pid):
    """(fd, its size, what goes first in it, its entry in the chain): the chain's last file, open for appending;
    the chain's next file when the last one is full (_want_new) or there is none. A file opened here (the next, or
    the last one again after a failed write or once removed by someone else) starts with the run header."""
    global _fd, _path, _want_new, _next_index, _chain_bytes, _torn
    fd = _fd
    if fd is not None and not _want_new:
        st = os.fstat(fd)
        if st.st_nlink and _chain:
            return fd, st.st_size, b"", _chain[-1]
    _close_log()                                # the chain's next, or removed under us (a cleaned-up log dir)
    new = _want_new or not _chain
    if new:
        i = _next_index
        name = ("%s-%d-rank%d.jsonl" % (_host, pid, _rank) if i == 0 else
                "%s-%d-rank%d.%06d.jsonl" % (_host, pid, _rank, i))
    else:
        name = _chain[-1][1]
    fd = _open_log(name)
    try:
        size = os.fstat(fd).st_size
    except BaseException:
        os.close(fd)
        raise
    _fd = fd
    _path = os.path.join(_dir_in_use, name)
    if new or _chain[-1][0] != _dir_in_use:
        _chain.append([_dir_in_use, name, size])
        _chain_bytes += size
        if new:
            _next_index += 1
            _want_new = False
    else:
        _chain_bytes += size - _chain[-1][2]
        _chain[-1][2] = size
    if size == 0:
        _torn = False
    return fd, size, _header_line(pid, _rank).encode("utf-8"), _chain[-1]


def _fit_share(nbytes, size):
    """Remove the chain's oldest files (never the last, written to) until `nbytes` more fit in this rank's share.
    False when they still do not and the last file holds bytes already (the chain's next file is needed)."""
    while _chain_bytes + nbytes > _share and len(_chain) > 1:
        _remove_oldest()
    return _chain_bytes + nbytes <= _share or size == 0


def _remove_oldest():
    """Remove the chain's oldest file: one this process made, in a folder checked as when it was opened."""
    global _chain_bytes
    folder, name, size = _chain.pop(0)
    _chain_bytes -= size
    try:
        dfd = _open_dir(folder)
        try:
            os.unlink(name, dir_fd=dfd)
        finally:
            os.close(dfd)
    except FileNotFoundError:
        pass                                    # removed by someone else
    except (OSError, _Unsafe):
        _error("rotate")
        return
    _removed[0] += 1
    _removed[1] += size


_DP_TITLE = re.compile(r"^sglang::\S*_DP(\d+)")   # sglang's process title of a scheduler: "..._DP1_TP0"


def _parallel_fields(rank):
    """'"dp": D, "node": N, ' for the records of this process (either left out where it is not known; "" for
    neither): docs/contract.md, "The timing log".

    "dp", the data-parallel group whose requests this rank serves (ranks of one "dp" record the same batches; those
    of different ones, different requests): the DP rank sglang names this scheduler by ("sglang::scheduler_DP1_TP0",
    its process title: a replica of --dp-size without --enable-dp-attention, each a torch.distributed world of its
    own), else, under --enable-dp-attention with --dp-size D > 1, the attention DP group of this rank (sglang's
    compute_dp_attention_world_info: the TP rank over tp-size / D; the world's rank is pp rank x tp-size + TP
    rank). "node": --node-rank of a server of --nnodes N > 1 (the launcher's command line)."""
    out = ""
    try:
        argv = _run_of()[1]["argv"]
    except Exception:
        argv = []
    dp = None
    try:
        title = _proc_cmdline(os.getpid())
        m = _DP_TITLE.match(title[0]) if title else None
        if m is not None:
            dp = int(m.group(1))
        elif "--enable-dp-attention" in argv:
            size = _option(argv, ("--dp-size", "--dp"))
            tp = _option(argv, ("--tp-size", "--tp"))
            if size is not None and size.isdigit() and int(size) > 1:
                tp = int(tp) if tp is not None and tp.isdigit() and int(tp) > 0 else 1
                dp = (rank % tp) // max(1, tp // int(size))
    except Exception:
        dp = None
    if dp is not None:
        out += '"dp": %d, ' % dp
    try:
        nodes = _option(argv, ("--nnodes",))
        node = _option(argv, ("--node-rank",))
        if nodes is not None and nodes.isdigit() and int(nodes) > 1 and node is not None and node.isdigit():
            out += '"node": %d, ' % int(node)
    except Exception:
        pass
    return out


def _rank_share():
    """The bytes this rank's logs may hold: max_log_mb over the launch's ranks, those of this process's
    torch.distributed world (1 without one), times the data-parallel replicas where each is a world of its own
    (sglang's --dp-size without --enable-dp-attention, read from the launcher's command line)."""
    ranks = 1
    try:
        d = _dist()
        if d is not None and d.is_available() and d.is_initialized():
            ranks = max(1, int(d.get_world_size()))
    except Exception:
        pass
    try:
        argv = _run_of()[1]["argv"]
        dp = _option(argv, ("--dp-size", "--dp"))
        if dp is not None and dp.isdigit() and int(dp) > 1 and "--enable-dp-attention" not in argv:
            ranks *= int(dp)
    except Exception:
        pass
    return max(1.0, _max_log_bytes / ranks)


def _option(argv, names):
    """The value of the last of the options `names` in `argv` (`--name value` or `--name=value`), else None."""
    value = None
    for i, a in enumerate(argv):
        name, eq, v = a.partition("=")
        if name in names:
            value = v if eq else (argv[i + 1] if i + 1 < len(argv) else None)
    return value


def _free_bytes():
    """Bytes free to this user on the log's filesystem (statvfs; the nearest folder above the log's that exists,
    before it is made), or None when that cannot be told."""
    path = _dir_in_use or _log_dir
    for _ in range(64):
        try:
            st = os.statvfs(path)
            return st.f_bavail * st.f_frsize
        except FileNotFoundError:
            up = os.path.dirname(path)
            if not up or up == path:
                return None
            path = up
        except (OSError, AttributeError, ValueError):
            return None
    return None


def _room_on_disk(nbytes):
    """Whether `nbytes` more may be written now: never while writing is paused, nor when they would leave less
    than min_free_mb free (writing pauses then). The free space is looked at at most every _FREE_CHECK_SECONDS
    (in between, what was written since is taken off the last look's); a look that finds min_free_mb +
    _FREE_HYSTERESIS free (or cannot tell) ends a pause."""
    global _next_free_check, _free_left, _paused, _drops_next
    now = _clock()
    if now >= _next_free_check:
        _next_free_check = now + _FREE_CHECK_SECONDS
        _free_left = _free_bytes()
        if _paused is not None and (_free_left is None or _free_left >= _min_free_bytes + _FREE_HYSTERESIS):
            _paused = None
            _drops_next = 0.0                   # the first batch written says what was dropped meanwhile
    if _paused is not None:
        return False
    if _free_left is not None and _free_left - nbytes < _min_free_bytes:
        _pause("min-free")
        return False
    return True


def _pause(why, exc=None):
    """Stop writing for `why` ("min-free", "full": a write found no room, "error": another failed write) until
    _room_on_disk finds room again, no sooner than _FREE_CHECK_SECONDS from now. Said in one stderr line, once:
    a pause that follows another with no batch written between is not said again."""
    global _paused, _pause_from, _pause_wrote, _next_free_check, _free_left
    _paused = why
    _pause_from = _dropped
    _next_free_check = _clock() + _FREE_CHECK_SECONDS
    if not _pause_wrote:
        return
    _pause_wrote = False
    where = _dir_in_use or _log_dir
    if why == "full":
        _free_left = _free_bytes()              # (counts as the look of this second)
    free = "?" if _free_left is None else "%d" % (max(0, _free_left) // _MB)
    until = "%s MB are free (--min-free-mb %s + %d)" % (_mb((_min_free_bytes + _FREE_HYSTERESIS) / _MB),
                                                        _mb(_min_free_bytes / _MB), _FREE_HYSTERESIS // _MB)
    if why == "full":
        text = ("the timing log's filesystem is full (%s MB free at %s): not writing until %s; records dropped "
                "are counted" % (free, where, until))
    elif why == "min-free":
        text = ("the timing log's filesystem has %s MB free at %s, under --min-free-mb %s: not writing until %s; "
                "records dropped are counted" % (free, where, _mb(_min_free_bytes / _MB), until))
    else:
        text = ("writing the timing log %s failed (%s): not writing for now, trying again every %g s; records "
                "dropped are counted" % (_path or where, exc, _FREE_CHECK_SECONDS))
    _stderr("[eaglepatch] " + text + "\n")


def _mb(x):
    """A number of megabytes as a person writes it: 1088, 0.25."""
    return "%d" % x if float(x).is_integer() else "%.4g" % x


def _drops_line_due():
    return _dropped != _drops_said and _clock() >= _drops_next


def _drops_line(pid, rid):
    """(the drops line, the count it says): the records this process dropped since it started, by reason, and
    its logs' bytes now (a metadata line like the run header: docs/contract.md, "Bounds inside the server")."""
    with _lock:
        total = _dropped
        by = dict(_drop_by)
    share = None if _share is None or _share == float("inf") else int(_share)
    doc = {"v": 1, "kind": "drops", "t": round(_wall(), 6), "host": _host, "pid": pid, "rank": _rank, "run": rid,
           "dropped": total, "reasons": dict(sorted(by.items())), "log_bytes": _chain_bytes,
           "log_files": len(_chain), "removed_files": _removed[0], "removed_bytes": _removed[1],
           "share_bytes": share}
    return (json.dumps(doc) + "\n").encode("utf-8"), total


def _close_log():
    global _fd
    fd = _fd
    _fd = None
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass


def _due():
    n = len(_buf)
    if not n:
        return False
    since = _buf_since
    return n >= _flush_records or (since is not None and _mono() - since >= _flush_seconds)


def _service():
    """One round of the writer's work: resolve the waiting cycles that are done (query only) once the worker is
    quiet, write the buffer when it is due, print what is queued for stderr."""
    if _pending and _mono() - _last_end >= _QUIET_SECONDS:
        _resolve_pending(None, False)
    if _due():
        _write_buffered()
    if _live_watch:
        _live_poll()
    if _msgs:
        _print_msgs()


def _drain(deadline, final):
    """Everything now: wait (by query, until `deadline`) for the waiting cycles, write all, print all."""
    if _pending:
        _resolve_pending(deadline, final)
    if _buf or _dropped != _drops_said:
        _write_buffered(status=True)        # (with the losses since the last drops line, when they changed)
    if _msgs:
        _print_msgs()


def _writer_main(me):
    """The background writer. It writes the buffer when due, prints what is queued, and resolves the cycles still
    waiting for their events once the worker has been quiet for _QUIET_SECONDS (a busy worker resolves its own:
    event queries from this thread would cost it a GIL hand-over each). While cycles wait (and _LINGER_SECONDS
    after) it looks at them on a timer; otherwise it sleeps until the next batch falls due or, with nothing to
    do, until woken (a record buffered, a cycle queued, flush_records reached, a message, a flush request). It
    never busy-polls, and a busy worker does not wake it cycle after cycle."""
    global _flush_ack, _writer_idle
    me = me[0]
    handled = _flush_ack
    busy = -_LINGER_SECONDS
    while _writer is me:
        now = _mono()
        timeout = None
        if _msgs or _flush_req != handled or len(_buf) >= _flush_records:
            timeout = 0
        elif _pending:
            busy = now
            timeout = max(_POLL_SECONDS, _last_end + _QUIET_SECONDS - now)
        elif now - busy < _LINGER_SECONDS:
            timeout = _QUIET_SECONDS    # more cycles are likely: keep looking rather than be woken for each
        if _buf and timeout != 0:
            since = _buf_since
            if since is not None:
                left = max(0.0, since + _flush_seconds - now)
                timeout = left if timeout is None else min(timeout, left)
        if _live_watch:
            timeout = _live_wait(timeout, now)
        if timeout is not None and (timeout == 0 or _pending or now - busy < _LINGER_SECONDS):
            if timeout > 0:
                _wake.wait(timeout)     # looking at the waiting cycles on a timer: a worker need not wake us
        else:
            _writer_idle = True         # first say so, then look again: work queued meanwhile wakes us
            if not (_pending or _msgs or _flush_req != handled or len(_buf) >= _flush_records
                    or (_buf and timeout is None)):
                _wake.wait(timeout)
            _writer_idle = False
        _wake.clear()
        if _writer is not me:
            return
        try:
            req = _flush_req
            if req != handled:
                handled = req
                until, final = _flush_until, _flush_final
                try:
                    # Leave part of the time for the write itself: the caller stops waiting at `until`.
                    _drain(until - min(0.5, max(0.0, until - _mono()) / 4.0), final)
                finally:
                    cv = _cv
                    with cv:
                        if _writer is me and req > _flush_ack:
                            _flush_ack = req
                        cv.notify_all()
            else:
                _service()
        except Exception:
            _error("writer", direct=True)
            time.sleep(0.01)    # a persistent failure must not spin


def _start_writer():
    global _writer
    box = []                    # the thread's own object is its identity (configure and fork replace it)
    t = threading.Thread(target=_writer_main, args=(box,), name="eaglepatch-writer")
    t.daemon = True
    box.append(t)
    _writer = t
    try:
        t.start()
    except Exception:           # no thread at interpreter shutdown: flush() works inline
        _writer = None
        raise


def _stop_writer():
    """Let the writer thread go (it ends at its next wake-up) without writing; waits for it at most 1 s.
    Returns whether it is still running (stuck)."""
    global _writer
    t = _writer
    _writer = None
    _wake.set()
    if t is not None and t is not threading.current_thread() and t.is_alive():
        t.join(1.0)
        return t.is_alive()
    return False


_stop_flusher = _stop_writer    # the name tests and tools used before the writer thread existed


def _flush(final):
    """Have the writer drain everything, waiting for it at most exit_seconds (by then, with `final`, cycles
    whose events are still not done are dropped); without a writer thread, drain on this thread."""
    global _flush_req, _flush_until, _flush_final
    deadline = _mono() + _exit_seconds
    t = _writer
    if t is None and _WRITER_THREAD and (_buf or _pending or _msgs):
        try:
            _start_writer()
            t = _writer
        except Exception:
            t = None
    if t is None or not t.is_alive() or t is threading.current_thread():
        _drain(deadline, final)
        return True
    cv = _cv
    with cv:
        _flush_req += 1
        req = _flush_req
        _flush_until = deadline
        _flush_final = final
    _wake.set()
    with cv:
        while _flush_ack < req and _writer is t:
            left = deadline - _mono()
            if left <= 0 or not t.is_alive():
                break
            cv.wait(min(left, 0.05))
        done = _flush_ack >= req
    if not done and not t.is_alive() and _writer is t:
        _drain(deadline, final)             # the writer died: do it here
        return True
    return done


def _after_fork_child():
    """In a forked child: forget the parent's buffer, file, rank, events, locks and writer thread."""
    global _pid
    cfg_pid = os.getpid()
    _close_log()            # the parent's file: no writer thread survives a fork, so no one is writing to it
    _reset()
    _pid = cfg_pid


def _at_exit():
    done = True
    try:
        done = _flush(True)
    except Exception:
        _error("flush", direct=True)
    if not done:
        # The writer is stuck (a hung disk): what it still holds is lost.
        _lose(len(_buf) + len(_pending), 0, "exit")
    try:
        if _dropped:
            with _lock:
                by = dict(_drop_by)
            _stderr("[eaglepatch] %d timing record(s) dropped in pid %d (%s%s)\n"
                    % (_dropped, os.getpid(), _why_text(by), "" if done else "; the writer was still stuck at exit"))
        if _errors:
            _stderr("[eaglepatch] %d internal error(s) in pid %d; timing records may be missing\n"
                    % (_errors, os.getpid()))
    except Exception:
        pass


def _stats():
    """For tests and tools: what the runtime holds now."""
    return {"errors": _errors, "buffered": len(_buf), "pending": len(_pending), "records": _records,
            "dropped": _dropped, "timer": _timer_name, "path": _path, "log_dir": _dir_in_use,
            "capture_relaxed": _capture_relaxed, "config": dict(_cfg),
            "live": None if _live is None else _live[3], "pinned": len(_pins),
            "drops": dict(_drop_by), "paused": _paused, "files": [e[1] for e in _chain], "log_bytes": _chain_bytes,
            "share": _share, "removed": tuple(_removed), "messages": len(_msgs), "messages_lost": _msgs_lost}


_reset()
try:
    _set_config(_load_config({}))
except Exception:  # pragma: no cover - _load_config does not raise; belt and braces for a server's import
    _set_config(dict(_DEFAULTS))
    _error("configure", direct=True)
try:
    atexit.register(_at_exit)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_after_fork_child)
except Exception:
    _error("configure", direct=True)
