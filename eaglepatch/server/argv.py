"""A server's command line read as sglang's flags: ``parse_flags`` of the arguments ``server_args_of`` a launcher's
argv gives (``{"speculative-num-steps": "3", "disable-cuda-graph": True, ...}``), other spellings folded into one
name, and ``quote_flag`` to write one back. Pure; doctor reads a server's settings with it, tuning the step count
of the records' launch."""

from __future__ import annotations

from typing import Any, Sequence


# Other spellings sglang accepts for the same option (the canonical name is the one sglang documents).
FLAG_ALIASES = {
    "model": "model-path",
    "tp": "tp-size",
    "tensor-parallel-size": "tp-size",
    "speculative-draft-model": "speculative-draft-model-path",
    "cuda-graph-max-bs-decode": "cuda-graph-max-bs",
    "nccl-init-addr": "dist-init-addr",
}
# Options without a value (a value-less flag followed by a token that is not a flag must not swallow it).
BOOL_FLAGS = frozenset({
    "disable-cuda-graph", "disable-decode-cuda-graph", "disable-overlap-schedule", "disable-custom-all-reduce",
    "enable-nccl-nvls", "trust-remote-code", "disable-radix-cache", "enable-torch-compile", "enable-dp-attention",
    "skip-server-warmup", "enable-mixed-chunk", "disable-cuda-graph-padding", "enable-metrics",
})


def parse_flags(args: Sequence[str]) -> dict[str, Any]:
    """sglang's arguments (what follows ``-m sglang.launch_server`` or ``sglang serve``) as ``{name: value}``:
    ``--x V`` and ``--x=V`` give ``"V"``, a flag without a value gives ``True``; the last one wins; other spellings
    are folded into one name (``FLAG_ALIASES``). A first positional argument (``sglang serve MODEL``) is
    ``model-path`` unless ``--model-path`` is given."""
    out: dict[str, Any] = {}
    positional: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith("--") and len(a) > 2:
            name, eq, value = a[2:].partition("=")
            name = FLAG_ALIASES.get(name, name)
            if eq:
                out[name] = value
            elif name not in BOOL_FLAGS and i + 1 < len(args) and not args[i + 1].startswith("--"):
                out[name] = args[i + 1]
                i += 1
            else:
                out[name] = True
        else:
            positional.append(a)
        i += 1
    if positional and "model-path" not in out:
        out["model-path"] = positional[0]
    return out


def server_args_of(argv: Sequence[str]) -> list[str]:
    """The sglang arguments of a launcher's argv (after ``-m sglang.launch_server``, ``launch_server.py`` or
    ``sglang serve``); the whole argv after argv[0] when it is not one eaglepatch recognises."""
    from eaglepatch.hostside.launchers import launcher_args_index

    idx = launcher_args_index(list(argv))
    return list(argv[idx:]) if idx >= 0 else list(argv[1:])


def quote_flag(name: str, value: Any) -> str:
    """How a flag reads on a command line: ``--x V``, or ``--x`` for a flag without a value."""
    return f"--{name}" if value is True else f"--{name} {value}"
