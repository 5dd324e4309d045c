"""The grid of ``eaglepatch sweep``: the flags a sweep may set, the axes given on the command line, the points they
make, and the order the runs go in.

Nothing here touches a host; ``eaglepatch.tuning.drive`` carries a sweep out. Its neighbours: ``cmdline`` (the
server's command line rewritten for a point), ``sweep_state`` (the resumable state file), ``sweep_summary`` (the
summary: JSON of docs/contract.md, table, CSV).

- A grid axis is ``FLAG=v1,v2`` (a launch flag of sglang's server, without or with its leading ``--``) or, from
  ``--env``, ``NAME=a,b`` (an environment variable of the server). The points are every combination of the axes'
  values, in the order given, plus with ``--baseline`` a first point: the original command line without any
  ``--speculative-*`` flag. Only the flags known to matter for speculative decoding (``KNOWN_FLAGS``, and any
  ``speculative-*``) are accepted; ``--allow-flag NAME`` accepts another. ``port``, ``host`` and ``api-key`` are
  never accepted: the sweep finds and loads the server by them.
- Flags that take no value (``BOOL_FLAGS``) take ``on`` or ``off`` (the flag present or absent).
- ``--repeat R`` runs each point R times, each a fresh launch, in an order shuffled from a seed (launches of one
  point differ, by tens of percent on a host-bound server: one launch per point decides little).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import random
import re
from typing import Any, Sequence

from eaglepatch.redact import mask_env
from eaglepatch.errors import UsageError

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
        parts = [f"{k}={v}" for k, v in (*mask_env(dict(self.flags)).items(), *mask_env(dict(self.env)).items())]
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
