"""Calling the host-side program: its source (``remote_program``), one op of it on the host (``call``), and what
a failed call means (``call_error``). Every host call of ops, doctor and tuning goes through ``call``."""

from __future__ import annotations

import functools
import pathlib
from typing import Any

from eaglepatch.errors import EaglepatchError, Unsupported
from eaglepatch.failpoints import failpoint
from eaglepatch.hosts.base import Host, RemoteScriptError, run_python


@functools.lru_cache(maxsize=1)
def remote_program() -> str:
    """server/_remote.py (its /proc scan) and ops/_remote.py, as one program."""
    here = pathlib.Path(__file__).parent
    server = (here.parent / "server" / "_remote.py").read_text(encoding="utf-8")
    head, sep, _tail = server.rpartition('\nif __name__ == "__main__"')
    if not sep:
        raise EaglepatchError("server/_remote.py lost its main block")
    ops = (here / "_remote.py").read_text(encoding="utf-8")
    return head + "\n\n" + ops + '\n\nif "PAYLOAD" in globals():\n    print(json.dumps(main(PAYLOAD)))\n'


def call(host: Host, interp: str, op: str, timeout: float | None = 120, **payload: Any) -> Any:
    """Run one op of the remote program with ``interp``; a failure to run it becomes a one-line error.

    The ops of one command share one process on the host per interpreter (``host.agents``): the first call starts
    it and sends the program, later calls (lock, execute, unlock) are requests on it. A call for the interpreter
    that the first one turned out to be (``facts`` run with ``python3`` finds the server runs that very binary)
    goes to the same process."""
    agents = getattr(host, "agents", None)
    try:
        if agents is None:
            return run_python(host, interp, remote_program(), dict(payload, op=op), timeout=timeout)
        return agents.call(interp, remote_program(), dict(payload, op=op), timeout=timeout)
    except RemoteScriptError as exc:
        if payload.get("fault"):
            failpoint(payload["fault"])  # the host's helper died at the armed failpoint: so does the client
        raise call_error(host.name, interp, exc) from None


def call_error(name: str, interp: str, exc: RemoteScriptError) -> EaglepatchError:
    """What a failed remote call means: the interpreter could not be run (exit 4, say so), or the program failed.
    "No such file" counts only before the interpreter ran eaglepatch's code: after that it is the program's own
    error (a FileNotFoundError's traceback), or a login shell's complaint kept in the process's stderr."""
    if exc.result.rc == 127 or (not exc.started and b"No such file" in exc.result.stderr[:500]):
        return Unsupported(f"{name}: cannot run {interp}: give the interpreter with --python")
    return EaglepatchError(f"{name}: {exc}")
