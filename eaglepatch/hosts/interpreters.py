"""The interpreter a bare name (``python3``) started as on a host, kept on the client, so that the next command
starts that binary itself.

On a host where ``python3`` is a shim (pyenv: a shell script that asks pyenv which version to run), every command
paid for the shim before the agent's interpreter started: 90 ms of a 320 ms facts request over loopback SSH, on a
command whose whole remote work is two requests. The agent says which binary it runs (``sys.executable``); the
client keeps it here, per host and name, and the next agent for that name starts it directly. When it no longer
starts (removed, replaced by something that is not Python 3.8), the agent falls back to the name, once, and the
entry is replaced (``eaglepatch.hosts.agent``).

Only where the answer cannot depend on which interpreter ran: a facts request that would take the agent's own
interpreter's sglang (no ``--sglang-path``, no ``--python``, no server running) is answered ``need_plain`` by a
kept binary, and the agent asks again from the name itself, so that a user who switched interpreters since is
never acted on with the old one's install.

``$XDG_CACHE_HOME/eaglepatch/interpreters.json``: ``{host key: {name: path}}``, the last MAX_HOSTS hosts;
``EAGLEPATCH_INTERPRETER_CACHE=0`` turns it off. Local targets are not kept (their PATH is the shell's of the
moment). Everything in it came from a host: a path is used only when it is absolute, printable and short.
"""

from __future__ import annotations

import json
import os
from typing import Any

from eaglepatch.cache import cache_root, write_json

MAX_HOSTS = 64
MAX_PATH = 4096


def _file() -> str:
    return os.path.join(cache_root(), "interpreters.json")


def enabled() -> bool:
    return os.environ.get("EAGLEPATCH_INTERPRETER_CACHE") != "0"


def usable(path: Any) -> bool:
    """A path as a host gave it, fit to start: absolute, printable, no longer than MAX_PATH."""
    return (isinstance(path, str) and path.startswith("/") and len(path) <= MAX_PATH and path.isprintable())


def _read() -> dict[str, dict[str, str]]:
    try:
        with open(_file(), encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, ValueError):
        return {}
    if not isinstance(doc, dict):
        return {}
    return {k: v for k, v in doc.items() if isinstance(k, str) and isinstance(v, dict)}


def _write(doc: dict[str, dict[str, str]]) -> None:
    try:
        write_json(_file(), dict(list(doc.items())[-MAX_HOSTS:]))
    except OSError:
        return  # a cache that cannot be written is no cache


def lookup(host_key: str | None, name: str) -> str | None:
    """The binary ``name`` started as on the host ``host_key`` last time, if kept and usable."""
    if host_key is None or "/" in name or not enabled():
        return None
    path = _read().get(host_key, {}).get(name)
    return path if usable(path) else None


def remember(host_key: str | None, name: str, path: Any) -> None:
    """Keep that ``name`` started as ``path`` on ``host_key`` (nothing when either is unfit or it is kept)."""
    if host_key is None or "/" in name or not enabled() or not usable(path):
        return
    doc = _read()
    if doc.get(host_key, {}).get(name) == path:
        return
    entry = doc.pop(host_key, {})  # moved to the end: the most recent host is the last to go
    entry[name] = path
    doc[host_key] = entry
    _write(doc)


def forget(host_key: str | None, name: str) -> None:
    """Drop what is kept for ``name`` on ``host_key``."""
    if host_key is None or not enabled():
        return
    doc = _read()
    if name in doc.get(host_key, {}):
        del doc[host_key][name]
        _write(doc)
