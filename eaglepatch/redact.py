"""What may be shown of text that came from a host: secrets masked, control characters escaped.

One rule for every command that prints a server's command line or environment (status, show, apply, restart,
sweep, doctor) and for the runtime's run header (the runtime keeps its own copy of ``is_secret_name``, since it
runs inside the server without eaglepatch; tests/real/test_secret_names.py holds the two equal on the option
names of every pinned sglang release):

- an option or environment variable is a secret when its name, lower-cased with ``_`` read as ``-``, ends in
  ``key``, ``token``, ``secret``, ``password``, ``passwd``, ``credential`` or ``credentials`` (``--api-key``,
  ``--admin-api-key``, ``--hf-token``, ``HF_TOKEN``, ``OPENAI_API_KEY``), unless it ends in ``-per-token`` or
  ``-first-token`` (a measure per token); a count such as ``--speculative-num-draft-tokens`` or
  ``--max-total-tokens`` ends in ``tokens`` and is shown;
- its value is replaced by ``***``: ``--api-key sk-1`` and ``--api-key=sk-1`` in a command line, ``HF_TOKEN=x``
  as a command-line word (``env HF_TOKEN=x python ...``) and in an environment.

Everything a host sends is data from a stranger (docs/safety.md): ``shown`` escapes the control characters of such
text before it reaches a terminal, so a newline or an escape sequence in a process's argv, a path or a log line
cannot forge a line of eaglepatch's output or drive the terminal.
"""

from __future__ import annotations

import re
from typing import Mapping, Sequence

MASK = "***"
SECRET_SUFFIXES = ("key", "token", "secret", "password", "passwd", "credential", "credentials")
# ...but not a measure per token: sglang's --kt-max-deferred-experts-per-token (a count) and
# --bucket-time-to-first-token (histogram buckets) end in "token" and hold no secret
NOT_SECRET_SUFFIXES = ("-per-token", "-first-token")
# NAME=value as one command-line word (env(1)'s form), NAME an environment variable's name
_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=")
# C0 controls, DEL, C1 controls, and the Unicode controls that reorder or hide text on a terminal
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2066-\u2069\ufeff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\x1b": "\\e"}


def is_secret_name(name: str) -> bool:
    """Whether an option (``--api-key``) or environment variable (``HF_TOKEN``) holds a secret: its name, without
    leading dashes, lower-cased and with ``_`` read as ``-``, ends in one of ``SECRET_SUFFIXES``."""
    norm = name.lstrip("-").lower().replace("_", "-")
    return bool(norm) and norm.endswith(SECRET_SUFFIXES) and not norm.endswith(NOT_SECRET_SUFFIXES)


def mask_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` with the value of every secret option (``--api-key V``, ``--api-key=V``) and of every secret
    ``NAME=V`` word replaced by ``***``; returns a new list, ``argv`` is left as it is."""
    out: list[str] = []
    hide = False
    for a in argv:
        if hide and not a.startswith("--"):
            out.append(MASK)
            hide = False
            continue
        hide = False
        if a.startswith("--"):
            name, eq, _value = a.partition("=")
            if is_secret_name(name):
                if eq:
                    a = name + "=" + MASK
                else:
                    hide = True  # its value is the next word
        else:
            m = _ASSIGNMENT.match(a)
            if m and is_secret_name(m.group(1)):
                a = m.group(0) + MASK
        out.append(a)
    return out


def mask_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with the value of every secret variable replaced by ``***``; returns a new dict."""
    return {k: (MASK if is_secret_name(k) else v) for k, v in env.items()}


def _escape(m: re.Match[str]) -> str:
    c = m.group(0)
    named = _NAMED.get(c)
    if named is not None:
        return named
    code = ord(c)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def shown(text: object, keep: str = "") -> str:
    """``text`` (``str()`` of it) with its control characters escaped (``\\n``, ``\\e``, ``\\x07``, ``\\u202e``),
    but those in ``keep`` (e.g. ``"\\n\\t"`` for a block of lines); backslashes are left as they are."""
    s = text if isinstance(text, str) else str(text)
    if not _CONTROL.search(s):
        return s
    if keep:
        return "".join(c if c in keep else _CONTROL.sub(_escape, c) for c in s)
    return _CONTROL.sub(_escape, s)


def shown_argv(argv: Sequence[str]) -> str:
    """A command line for people: secrets masked, each word's control characters escaped, words joined by
    spaces."""
    return " ".join(shown(a) for a in mask_argv(argv))
