"""What a command may tell ops: how the runtime times (``RuntimeOptions``, the timer modes and why each worker
gets its timer), what discovery may be told (``FactsOptions``), the recipe, and how to restart."""

from __future__ import annotations

import dataclasses
from typing import Any

from eaglepatch.errors import UsageError
from eaglepatch.transform.recipe import Recipe, builtin_recipe, load_recipe_file


@dataclasses.dataclass(frozen=True)
class RuntimeOptions:
    """How the runtime inside the server times and logs: ``apply --mode/--every/--log-dir/--max-log-mb/--min-free-mb``.

    ``auto`` (the default) gives each worker its family's timer (the recipe's ``timer``): ``sync`` where the worker
    runs without the overlap scheduler, ``events`` where it runs under it; ``sync``/``events`` force one for all.
    ``max_log_mb``: what the timing logs of one server launch (all ranks) may hold; ``min_free_mb``: the free space
    under which the runtime stops writing (docs/contract.md, "Bounds inside the server")."""

    mode: str = "auto"
    every: int = 1
    log_dir: str = "/tmp/eaglepatch"
    max_log_mb: int = 2048
    min_free_mb: int = 1024

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise UsageError(f"--mode must be auto, sync or events, not {self.mode!r}")
        if self.every < 1:
            raise UsageError("--every must be 1 or more")
        if not self.log_dir.startswith("/"):
            raise UsageError(f"--log-dir must be an absolute path on the target, not {self.log_dir!r}")
        if self.max_log_mb < 1:
            raise UsageError("--max-log-mb must be 1 or more")
        if self.min_free_mb < 0:
            raise UsageError("--min-free-mb must be 0 or more")


@dataclasses.dataclass(frozen=True)
class FactsOptions:
    """What discovery may be told: ``--python`` and ``--sglang-path``."""

    python: str | None = None
    sglang_path: str | None = None
    server_ports: tuple[int, ...] = ()  # --server-port: act on these servers of the install only


MODES = ("auto", "sync", "events", "cpu")
# Why a worker gets its timer, for show and apply.
TIMER_WHY = {
    "sync": "no overlap scheduler: verify waits for the GPU anyway, so synchronize + perf_counter costs little",
    "events": "overlap scheduler: a synchronize would stall it, CUDA events time the GPU without waiting",
}


def worker_timer(mode: str, family_timer: str | None) -> tuple[str, str]:
    """(timer, why) a worker gets under ``--mode``: its family's with ``auto``, else the one asked for."""
    if mode == "auto":
        timer = family_timer or "sync"
        return timer, TIMER_WHY[timer]
    if mode == "sync" and family_timer == "events":
        return mode, ("--mode sync on an overlap-scheduler worker: each synchronize stalls the overlap (it cost "
                      "23-44% of throughput on an H200, docs/benchmarks.md); --mode auto gives it events")
    return mode, f"--mode {mode}"


def load_recipe(path: str | None) -> Recipe:
    """The recipe: the built-in one, or the file given with ``--recipe``."""
    return builtin_recipe() if path is None else load_recipe_file(path)


def restart_options(restart_cmd: str | None, systemd_unit: str | None, timeout: float) -> Any:
    """``RestartOptions`` from the command line's restart options (UsageError for bad ones)."""
    from eaglepatch.server.restart import RestartOptions

    return RestartOptions(restart_cmd=restart_cmd, systemd_unit=systemd_unit, timeout=timeout)
