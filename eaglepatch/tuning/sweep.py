"""The pure parts of ``eaglepatch sweep``: the grid, its points, the run plan, rewriting the server's command
line for a point, the resumable state file, and the summary (JSON of docs/contract.md, table, CSV).

Nothing here touches a host; ``eaglepatch.tuning.drive`` carries a sweep out.

- A grid axis is ``FLAG=v1,v2`` (a launch flag of sglang's server, without or with its leading ``--``) or, from
  ``--env``, ``NAME=a,b`` (an environment variable of the server). The points are every combination of the axes'
  values, in the order given, plus with ``--baseline`` a first point: the original command line without any
  ``--speculative-*`` flag. Only the flags known to matter for speculative decoding (``KNOWN_FLAGS``, and any
  ``speculative-*``) are accepted; ``--allow-flag NAME`` accepts another. ``port``, ``host`` and ``api-key`` are
  never accepted: the sweep finds and loads the server by them.
- Flags that take no value (``BOOL_FLAGS``) take ``on`` or ``off`` (the flag present or absent).
- When a point sets ``speculative-num-steps`` or ``speculative-eagle-topk`` but not
  ``speculative-num-draft-tokens``, and the top-k is 1, the draft tokens follow (steps + 1), as sglang requires;
  with a larger top-k the command line's own value stays (give it in the grid to vary it).
- ``--repeat R`` runs each point R times, each a fresh launch, in an order shuffled from a seed (drift between
  launches is tens of percent: one launch per point decides nothing).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import itertools
import json
import os
import random
import re
import statistics
import time
from typing import Any, Iterable, Mapping, Sequence

from eaglepatch.redact import MASK, is_secret_name, mask_env
from eaglepatch.errors import Conflict, UsageError
from eaglepatch.tuning.load import SHORT_LOAD_S

# Launch flags of sglang's server that a tuning sweep may set (besides every speculative-*). Others need
# --allow-flag NAME.
KNOWN_FLAGS = frozenset({
    "attention-backend", "prefill-attention-backend", "decode-attention-backend", "sampling-backend",
    "cuda-graph-max-bs", "cuda-graph-bs", "disable-cuda-graph", "disable-cuda-graph-padding",
    "enable-torch-compile", "torch-compile-max-bs",
    "tp-size", "tp", "tensor-parallel-size", "dp-size", "dp", "data-parallel-size", "ep-size",
    "enable-dp-attention", "disable-custom-all-reduce", "enable-nccl-nvls", "enable-two-batch-overlap",
    "mem-fraction-static", "max-running-requests", "max-total-tokens", "max-prefill-tokens",
    "chunked-prefill-size", "page-size", "kv-cache-dtype", "dtype", "quantization",
    "schedule-policy", "schedule-conservativeness", "disable-overlap-schedule", "disable-radix-cache",
    "enable-mixed-chunk", "num-continuous-decode-steps", "stream-interval", "triton-attention-num-kv-splits",
    "moe-runner-backend", "grammar-backend",
})
# Flags without a value: the grid gives on/off.
BOOL_FLAGS = frozenset({
    "speculative-adaptive",
    "disable-cuda-graph", "disable-cuda-graph-padding", "enable-torch-compile", "enable-dp-attention",
    "disable-custom-all-reduce", "enable-nccl-nvls", "enable-two-batch-overlap", "disable-overlap-schedule",
    "disable-radix-cache", "enable-mixed-chunk",
})
# Never swept: the sweep reaches the server by them.
FORBIDDEN_FLAGS = frozenset({"port", "host", "api-key"})
# Other spellings of one option: setting one replaces every spelling on the command line.
ALIASES = {
    "tp": "tp-size", "tensor-parallel-size": "tp-size",
    "dp": "dp-size", "data-parallel-size": "dp-size",
    "model": "model-path",
}
SPEC_PREFIX = "speculative-"
_FLAG_RE = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")
_ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ON = ("on", "true", "yes", "1")
_OFF = ("off", "false", "no", "0")
PHASES = ("draft", "verify", "draft_extend", "cycle")


# ----------------------------------------------------------------------------------------------------------------
# The grid


@dataclasses.dataclass(frozen=True)
class Axis:
    """One axis of the grid: a flag (``kind`` "flag") or an environment variable ("env") and its values."""

    name: str
    values: tuple[str, ...]
    kind: str = "flag"


def _split(item: str, what: str) -> tuple[str, list[str]]:
    name, eq, rest = item.partition("=")
    if not eq or not name.strip():
        raise UsageError(f"{what} {item!r}: expected NAME=v1,v2,...")
    values = [v.strip() for v in rest.split(",")]
    if not values or any(v == "" for v in values):
        raise UsageError(f"{what} {item!r}: a value is empty (values are separated by commas)")
    if len(set(values)) != len(values):
        raise UsageError(f"{what} {item!r}: a value is given twice")
    return name.strip(), values


def canonical_flag(name: str) -> str:
    return ALIASES.get(name, name)


class HandFlags:
    """The flag knowledge eaglepatch carries itself (``KNOWN_FLAGS``, ``BOOL_FLAGS``, ``ALIASES``), for a target
    whose own ``server_args.py`` cannot be read; the same methods as ``server.flags.ServerFlags``, which a sweep
    uses instead when it can (every flag that release's server takes, no other)."""

    source = "eaglepatch's list of flags"

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name.startswith(SPEC_PREFIX) or name in KNOWN_FLAGS)

    def canonical(self, name: str) -> str:
        return canonical_flag(name)

    def takes_value(self, name: str) -> bool:
        return name not in BOOL_FLAGS

    def suggest(self, name: str) -> str | None:
        import difflib

        close = difflib.get_close_matches(name, sorted(KNOWN_FLAGS), n=1, cutoff=0.8)
        return close[0] if close else None


class AnyFlags(HandFlags):
    """Every name counts as a flag: the syntax check of ``--grid`` before the target's own flags are read."""

    def __contains__(self, name: object) -> bool:
        return True


HAND = HandFlags()
ANY = AnyFlags()


def parse_grid(items: Sequence[str], allow: Sequence[str] = (), flags: Any = HAND) -> tuple[Axis, ...]:
    """``--grid FLAG=v1,v2`` options into axes; raises UsageError naming what is wrong.

    ``flags``: what the server accepts (``server.flags.ServerFlags`` read from the target's own sglang; ``HAND``,
    eaglepatch's list, when it could not be read; ``ANY`` for the syntax alone). ``--allow-flag NAME`` accepts a
    name it does not know. A flag that takes no value takes on/off (present or absent).
    """
    allowed = set()
    for a in allow:
        a = a[2:] if a.startswith("--") else a
        if not _FLAG_RE.match(a):
            raise UsageError(f"--allow-flag {a!r}: not a flag name (lower case words joined by '-')")
        allowed.add(a)
    axes: list[Axis] = []
    seen: set[str] = set()
    for item in items:
        name, values = _split(item, "--grid")
        if name.startswith("--"):
            name = name[2:]
        if not _FLAG_RE.match(name):
            raise UsageError(f"--grid {item!r}: {name!r} is not a flag name: lower case words joined by '-', "
                             "starting with a letter (e.g. speculative-num-steps=1,2,3)")
        if name in FORBIDDEN_FLAGS:
            raise UsageError(f"--grid {item!r}: --{name} cannot be swept: the sweep reaches the server by it")
        if name not in flags and name not in allowed:
            hint = flags.suggest(name)
            if isinstance(flags, HandFlags):
                raise UsageError(f"--grid {item!r}: --{name} is not a flag eaglepatch knows to sweep "
                                 f"(speculative-*, {', '.join(sorted(KNOWN_FLAGS)[:6])}, ...: see docs/tuning.md)"
                                 + (f"; did you mean --{hint}?" if hint else "")
                                 + f"; if the server takes it, say so with --allow-flag {name}")
            raise UsageError(f"--grid {item!r}: the target's sglang ({getattr(flags, 'source', 'its server_args.py')})"
                             f" has no --{name}" + (f": did you mean --{hint}?" if hint else "")
                             + f" (--allow-flag {name} if it is built in a way eaglepatch cannot read)")
        key = flags.canonical(name)
        if key in seen:
            raise UsageError(f"--grid: --{name} is given twice (or under two spellings): give one --grid per flag")
        seen.add(key)
        if not flags.takes_value(name):
            bad = [v for v in values if v.lower() not in _ON + _OFF]
            if bad:
                raise UsageError(f"--grid {item!r}: --{name} takes no value: its values are on/off, not {bad[0]!r}")
            values = ["on" if v.lower() in _ON else "off" for v in values]
            if len(set(values)) != len(values):
                raise UsageError(f"--grid {item!r}: a value is given twice")
        axes.append(Axis(name, tuple(values), "flag"))
    return tuple(axes)


def parse_env_grid(items: Sequence[str]) -> tuple[Axis, ...]:
    """``--env NAME=a,b`` options into axes; raises UsageError."""
    axes: list[Axis] = []
    for item in items:
        name, values = _split(item, "--env")
        if not _ENV_RE.match(name):
            raise UsageError(f"--env {item!r}: {name!r} is not an environment variable name")
        if any(a.name == name for a in axes):
            raise UsageError(f"--env: {name} is given twice: give one --env per variable")
        axes.append(Axis(name, tuple(values), "env"))
    return tuple(axes)


@dataclasses.dataclass(frozen=True)
class Point:
    """One configuration: ``flags`` and ``env`` set on top of the original launch (in grid order); ``baseline``:
    the original without speculative flags."""

    flags: tuple[tuple[str, str], ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    baseline: bool = False

    @property
    def key(self) -> str:
        """A stable identity (the state file records runs by it)."""
        return json.dumps({"flags": list(map(list, self.flags)), "env": list(map(list, self.env)),
                           "baseline": self.baseline}, separators=(",", ":"))

    @property
    def label(self) -> str:
        if self.baseline:
            return "baseline (no speculation)"
        # what is printed of a command line or an environment: its secrets masked (eaglepatch.redact)
        parts = [f"{k}={MASK if is_secret_name(k) else v}" for k, v in (*self.flags, *self.env)]
        return " ".join(parts) or "as launched"

    def to_json(self) -> dict[str, Any]:
        """The point as ``sweep --json`` prints it: its flags and environment, secrets masked (eaglepatch.redact)."""
        return {"flags": mask_env(dict(self.flags)), "env": mask_env(dict(self.env))}


def make_points(flag_axes: Sequence[Axis], env_axes: Sequence[Axis], baseline: bool) -> list[Point]:
    """The baseline first (when asked), then every combination of the axes' values; the original launch alone
    when there is no axis. Raises UsageError when there is nothing to sweep."""
    axes = list(flag_axes) + list(env_axes)
    if not axes and not baseline:
        raise UsageError("nothing to sweep: give --grid FLAG=v1,v2 (and/or --env NAME=a,b, --baseline)")
    points = [Point(baseline=True)] if baseline else []
    combos = itertools.product(*[a.values for a in axes]) if axes else [()]
    for combo in combos:
        flags = tuple((a.name, v) for a, v in zip(axes, combo) if a.kind == "flag")
        env = tuple((a.name, v) for a, v in zip(axes, combo) if a.kind == "env")
        points.append(Point(flags, env))
    return points


def plan_runs(points: Sequence[Point], repeat: int, seed: str) -> list[tuple[int, int]]:
    """Every (point index, repetition) once, shuffled by ``seed`` (the same sweep always has the same order)."""
    if repeat < 1:
        raise UsageError(f"--repeat must be 1 or more, not {repeat}")
    runs = [(i, r) for r in range(repeat) for i in range(len(points))]
    random.Random(seed).shuffle(runs)
    return runs


# ----------------------------------------------------------------------------------------------------------------
# Command lines


def _is_flag(tok: str) -> bool:
    return tok.startswith("--") and len(tok) > 2


def _name_of(tok: str) -> str:
    return tok[2:].partition("=")[0]


def _spans(args: list[str], flags: Any = HAND) -> list[tuple[int, int, str]]:
    """``(start, end, name)`` per flag of sglang's arguments: the flag and its values (every token up to the next
    ``--flag``; none for a flag that takes no value or is written ``--x=v``)."""
    out = []
    i = 0
    while i < len(args):
        tok = args[i]
        if not _is_flag(tok):
            i += 1
            continue
        name = _name_of(tok)
        j = i + 1
        if "=" not in tok and flags.takes_value(name):
            while j < len(args) and not _is_flag(args[j]):
                j += 1
        out.append((i, j, name))
        i = j
    return out


def flag_value(args: Sequence[str], name: str, flags: Any = HAND) -> str | None:
    """The last value of ``--name`` (any spelling) in sglang's arguments; "on" for a bare flag; None if absent."""
    want = flags.canonical(name)
    args = list(args)
    value = None
    for start, end, n in _spans(args, flags):
        if flags.canonical(n) != want:
            continue
        tok = args[start]
        if "=" in tok:
            value = tok.partition("=")[2]
        elif end > start + 1:
            value = " ".join(args[start + 1:end])
        else:
            value = "on"
    return value


def flag_values(args: Sequence[str], flags: Any = HAND) -> dict[str, str]:
    """Every flag of sglang's arguments with its last value (by the spelling written last)."""
    return {n: v for n in {n for _s, _e, n in _spans(list(args), flags)}
            if (v := flag_value(args, n, flags)) is not None}


def set_flag(args: Sequence[str], name: str, value: str | None, flags: Any = HAND) -> list[str]:
    """sglang's arguments with ``--name`` (every spelling) set to ``value`` where it first stood (appended when
    absent); ``None``, or "off" for a flag that takes no value, removes it."""
    want = flags.canonical(name)
    args = list(args)
    spans = [(s, e) for s, e, n in _spans(args, flags) if flags.canonical(n) == want]
    if not flags.takes_value(name):
        new = [f"--{name}"] if value == "on" else []
    else:
        new = [] if value is None else [f"--{name}", value]
    if not spans:
        return args + new
    out = args[:spans[0][0]] + new
    prev = spans[0][1]
    for s, e in spans[1:]:
        out += args[prev:s]
        prev = e
    return out + args[prev:]


def strip_speculative(args: Sequence[str], flags: Any = HAND) -> list[str]:
    """sglang's arguments without any ``--speculative-*`` flag (and its values)."""
    args = list(args)
    out: list[str] = []
    prev = 0
    for s, e, n in _spans(args, flags):
        if n.startswith(SPEC_PREFIX):
            out += args[prev:s]
            prev = e
    return out + args[prev:]


def runs_speculation(args: Sequence[str], flags: Any = HAND) -> bool:
    return flag_value(args, "speculative-algorithm", flags) not in (None, "", "None", "none")


def point_argv(argv: Sequence[str], args_index: int, point: Point,
               flags: Any = HAND) -> tuple[list[str], list[str]]:
    """The launch argv for ``point`` (the interpreter and module part kept), and notes on derived flags."""
    head, args = list(argv[:args_index]), list(argv[args_index:])
    notes: list[str] = []
    if point.baseline:
        return head + strip_speculative(args, flags), notes
    for name, value in point.flags:
        args = set_flag(args, name, value, flags)
    given = {flags.canonical(n) for n, _ in point.flags}
    steps_name, topk_name = flags.canonical("speculative-num-steps"), flags.canonical("speculative-eagle-topk")
    if ({steps_name, topk_name} & given) and flags.canonical("speculative-num-draft-tokens") not in given:
        steps = flag_value(args, "speculative-num-steps", flags)
        topk = flag_value(args, "speculative-eagle-topk", flags)
        if steps is not None and steps.isdigit() and (topk is None or topk == "1"):
            draft = str(int(steps) + 1)
            if flag_value(args, "speculative-num-draft-tokens", flags) not in (None, draft):
                notes.append(f"{point.label}: --speculative-num-draft-tokens {draft} (steps + 1, as top-k is 1)")
                args = set_flag(args, "speculative-num-draft-tokens", draft, flags)
    return head + args, notes


def point_env(env: Mapping[str, str], point: Point) -> dict[str, str]:
    out = dict(env)
    out.update(dict(point.env))
    return out


def check_speculation(args: Sequence[str], flag_axes: Sequence[Axis], flags: Any = HAND) -> None:
    """A server that runs no speculation cannot be tuned by speculative flags alone: raise UsageError."""
    if runs_speculation(args, flags):
        return
    names = [a.name for a in flag_axes]
    spec = [n for n in names if n.startswith(SPEC_PREFIX)]
    if spec and "speculative-algorithm" not in names:
        raise UsageError(
            f"the server runs no speculation (no --speculative-algorithm on its command line), so --grid "
            f"{spec[0]} would change nothing: start it with speculative decoding, or add "
            "--grid speculative-algorithm=EAGLE3 (with --grid speculative-draft-model-path=...)")


# ----------------------------------------------------------------------------------------------------------------
# The state file: one JSON line per completed run, written as each completes


def cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "eaglepatch", "sweeps")


def sweep_id(target: str, points: Sequence[Point], repeat: int, load: Mapping[str, Any]) -> str:
    doc = {"target": target, "points": [p.key for p in points], "repeat": repeat, "load": dict(load)}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def state_path(target: str, ident: str) -> str:
    safe = "".join(ch if ch.isalnum() or ch in "-_.@" else "_" for ch in target)[:80]
    return os.path.join(cache_dir(), f"{safe}-{ident}.jsonl")


class StateFile:
    """``header`` (the first line: what the sweep is, and the original launch) and ``runs`` (one line each)."""

    def __init__(self, path: str):
        self.path = path
        self.header: dict[str, Any] | None = None
        self.runs: list[dict[str, Any]] = []
        self.launches: list[dict[str, Any]] = []  # every server the sweep started: pid and start time
        self.restore: dict[str, Any] | None = None  # how the server was put back, once it was
        self.timings: list[dict[str, Any]] = []  # a live sweep's window figures from the timing logs, read at its end
        self._lock_fd: int | None = None
        if os.path.exists(path):
            self._read()

    def _read(self) -> None:
        with open(self.path, encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    doc = json.loads(line)
                except ValueError:
                    continue  # a line cut short by a crash: that run did not complete
                if not isinstance(doc, dict):
                    continue
                if doc.get("kind") == "sweep" and self.header is None:
                    self.header = doc
                elif doc.get("kind") == "run":
                    self.runs.append(doc)
                elif doc.get("kind") == "launch":
                    self.launches.append(doc)
                elif doc.get("kind") == "restore":
                    self.restore = doc
                elif doc.get("kind") == "timings":
                    self.timings.append(doc)

    def lock(self) -> None:
        """Hold an exclusive lock on the file while this sweep runs; Conflict when another sweep holds it."""
        import fcntl

        os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise Conflict(f"another eaglepatch sweep runs the same sweep now (it holds {self.path})") from None
        self._lock_fd = fd

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _append(self, doc: Mapping[str, Any]) -> None:
        os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
        data = (json.dumps(doc, separators=(",", ":")) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            # a line cut short by an earlier crash must not swallow this one
            if os.fstat(fd).st_size:
                with open(self.path, "rb") as r:
                    r.seek(-1, os.SEEK_END)
                    if r.read(1) != b"\n":
                        data = b"\n" + data
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)

    def write_header(self, header: Mapping[str, Any]) -> None:
        doc = dict(header, kind="sweep")
        self._append(doc)
        self.header = doc

    def add_run(self, run: Mapping[str, Any]) -> None:
        doc = dict(run, kind="run")
        self._append(doc)
        self.runs.append(doc)

    def add_launch(self, pid: int, start: int | None, port: int) -> None:
        """Record a server the sweep started (before waiting for it: a sweep killed meanwhile knows it as its own)."""
        doc = {"kind": "launch", "pid": pid, "start": start, "port": port, "t": round(time.time(), 3)}
        self._append(doc)
        self.launches.append(doc)

    def launched(self) -> set[tuple[int, int | None]]:
        """(pid, start time) of every server the sweep started."""
        return {(int(d["pid"]), d.get("start")) for d in self.launches if isinstance(d.get("pid"), int)}

    def add_restore(self, doc: Mapping[str, Any]) -> None:
        """Record that the server was put back at the end: a finished sweep run again touches nothing."""
        rec = dict(doc, kind="restore")
        self._append(rec)
        self.restore = rec

    def add_timings(self, doc: Mapping[str, Any]) -> None:
        """Record a live sweep window's figures from the timing logs (read once, after its windows)."""
        rec = dict(doc, kind="timings")
        self._append(rec)
        self.timings.append(rec)

    def done(self) -> set[tuple[str, int]]:
        return {(r["point"], int(r["rep"])) for r in self.runs if "point" in r and "rep" in r}

    def failed_points(self) -> set[str]:
        return {r["point"] for r in self.runs if r.get("status") == "failed"}

    def remove(self) -> None:
        try:
            os.remove(self.path)
        except FileNotFoundError:
            pass
        self.header, self.runs, self.launches, self.restore, self.timings = None, [], [], None, []


# ----------------------------------------------------------------------------------------------------------------
# A run's figures, from a bench


def run_figures(bench: Mapping[str, Any]) -> dict[str, Any]:
    """What the summary needs of one bench (``eaglepatch.tuning.drive.bench_doc``): client tok/s, accept length
    (the server's own, from the responses, else the timing log's), p50 of the decode phases and cycle."""
    client = bench.get("client") or {}
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
    return {"tokens_per_s": client.get("tokens_per_s"), "accept_len": acc, "phases_p50": phases,
            "records": (timings or {}).get("records")}


# ----------------------------------------------------------------------------------------------------------------
# The summary


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(x, nd)


def summarize(target: str, points: Sequence[Point], runs: Iterable[Mapping[str, Any]], baseline: bool,
              repeat: int) -> dict[str, Any]:
    """The ``sweep --json`` object of docs/contract.md, plus per point ``label``, ``within_noise`` (its tok/s range
    overlaps the best point's: it may be as good), ``failed_runs``, and for a failed point ``log_tail``; and
    top-level ``repeat`` and ``notes``."""
    by_point: dict[str, list[Mapping[str, Any]]] = {}
    for r in runs:
        by_point.setdefault(r["point"], []).append(r)
    docs = []
    windows: list[float] = []  # seconds of load of every run that counted
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
            })
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
    best = max(oks, key=lambda i: docs[i]["tokens_per_s"]["median"]) if oks else None
    notes: list[str] = []
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
            notes.append(f"within noise of the best ({docs[best]['label']}): {', '.join(ties)}: their tok/s ranges "
                         "overlap; more --repeat may separate them")
    if repeat < 2 and len(oks) > 1:
        notes.append("one launch per point: a host's speed drifts by tens of percent between launches, so "
                     "differences of that size decide nothing; use --repeat 3 or more")
    short = [w for w in windows if w < SHORT_LOAD_S]
    if short:
        notes.append(f"{len(short)} of {len(windows)} run(s) measured under {SHORT_LOAD_S:.0f} s of load (the shortest "
                     f"{min(short):.1f} s): a start-up transient weighs heavily in so short a window; raise --requests "
                     "or --max-new-tokens")
    if oks and not any(docs[i]["phases_p50"] for i in oks):
        notes.append("no per-phase timings: the target is not patched (eaglepatch apply TARGET first); tok/s and "
                     "accept length are the client's")
    if base is not None and docs[base]["status"] != "ok":
        notes.append("the baseline did not run: no speedups")
    return {"target": target, "baseline": base, "points": docs, "best": best, "repeat": repeat, "notes": notes}


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
    head = ["#", "point", unit + "s", "accept", "draft", "verify", "d.extend", "cycle", "tok/s", "range"]
    head += (["spread"] if live else []) + ["speedup"]
    if live:
        title = (f"live sweep of {doc['target']}: {len(doc['points'])} points x {doc.get('rounds', 1)} rounds of "
                 f"{doc.get('window_s', 0):g} s windows in one server ({doc.get('launches', 0)} launch"
                 f"{'es' if doc.get('launches', 0) != 1 else ''}; p50 ms per phase; tok/s as the client saw it; "
                 "spread: (max - min) / median over the windows; * best, ~ within noise of it)")
    else:
        title = (f"sweep of {doc['target']}: {len(doc['points'])} points x {doc.get('repeat', 1)} (p50 ms per phase; "
                 "tok/s as the client saw it; * best, ~ within noise of it)")
    out = [title, tabulate(rows, headers=head, tablefmt="simple", disable_numparse=True)]
    for p in doc["points"]:
        if p["status"] == "failed":
            out.append(f"failed: {p['label']}: {p.get('error')}")
    for n in doc.get("notes") or []:
        out.append(f"note: {n}")
    return "\n".join(out)


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


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
