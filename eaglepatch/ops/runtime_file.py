"""The runtime module as ``apply`` ships it: its source with the config line set to the options, and what
differs between two of them."""

from __future__ import annotations

import functools
import json
import pathlib
import re
from typing import Any

from eaglepatch.errors import EaglepatchError
from eaglepatch.ops.options import RuntimeOptions
from eaglepatch.transform.marks import RUNTIME_MODULE

RUNTIME_FILE = RUNTIME_MODULE + ".py"

_CONFIG_LINE = re.compile(r"^_CONFIG = .*# eaglepatch:config$", re.M)


@functools.lru_cache(maxsize=1)
def runtime_template() -> str:
    """The runtime module's source as eaglepatch ships it (read once)."""
    return (pathlib.Path(__file__).parent.parent / "runtime" / RUNTIME_FILE).read_text(encoding="utf-8")


def render_runtime(opts: RuntimeOptions, timers: dict[str, str] | None = None) -> str:
    """The runtime module's source with its config line set to ``opts``; ``timers``: worker class -> its timer,
    for ``auto`` (the runtime picks by the class of the worker it times)."""
    config = {"mode": opts.mode, "timers": dict(sorted((timers or {}).items())), "every": opts.every,
              "log_dir": opts.log_dir, "summary_every": 2000, "flush_records": 256, "flush_seconds": 2.0,
              "max_log_mb": opts.max_log_mb, "min_free_mb": opts.min_free_mb}
    line = f"_CONFIG = {json.dumps(config)}  # eaglepatch:config"
    src, n = _CONFIG_LINE.subn(lambda _m: line, runtime_template(), count=1)
    if n != 1:
        raise EaglepatchError("the runtime module lost its config line: reinstall eaglepatch")
    return src


def runtime_config(data: bytes) -> dict[str, Any]:
    """The config line of a runtime module's bytes (``{}`` when it has none that reads)."""
    m = _CONFIG_LINE.search(data.decode("utf-8", "replace"))
    try:
        config = json.loads(m.group(0).split("=", 1)[1].rsplit("#", 1)[0]) if m else {}
    except ValueError:
        return {}
    return config if isinstance(config, dict) else {}


def config_change(old: bytes, new: bytes) -> str:
    """What differs between two runtime modules' configs, for a person: ``mode sync -> auto, every 1 -> 4``."""
    a, b = runtime_config(old), runtime_config(new)
    return ", ".join(f"{k} {a.get(k)} -> {b.get(k)}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k))
