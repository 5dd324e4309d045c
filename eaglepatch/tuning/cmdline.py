"""sglang's command line rewritten for a sweep point: flags read, set or removed (every spelling of one at once);
the point's launch argv and environment; whether the server runs speculation at all.

Pure: ``args`` are the server's arguments (after the interpreter and module), ``flags`` what the server accepts
(``server.flags.ServerFlags``, or ``sweep.HAND``).

- When a point sets ``speculative-num-steps`` or ``speculative-eagle-topk`` but not
  ``speculative-num-draft-tokens``, and the top-k is 1, the draft tokens follow (steps + 1), as sglang requires;
  with a larger top-k the command line's own value stays (give it in the grid to vary it).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from eaglepatch.errors import UsageError
from eaglepatch.tuning.sweep import HAND, SPEC_PREFIX, Axis, Point


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
