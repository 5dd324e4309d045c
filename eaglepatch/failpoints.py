"""Failpoints: named places where the tests kill eaglepatch, to prove what a crash there leaves behind.

``EAGLEPATCH_FAILPOINT=NAME`` makes the client SIGKILL itself when it reaches ``failpoint(NAME)``: no ``finally``
runs, no lock is released, nothing is cleaned up, exactly as a ``kill -9`` or a lost laptop would leave it.
``EAGLEPATCH_FAILPOINT=NAME:sigint`` sends it SIGINT there instead: a Ctrl-C at exactly that step, handled as any
Ctrl-C is (exit 130, the state of the target said). ``EAGLEPATCH_FAILPOINT=NAME:pause`` holds it there for
``EAGLEPATCH_FAILPOINT_PAUSE`` seconds (default 5), or until the file ``EAGLEPATCH_FAILPOINT_RELEASE`` names
exists when that is set (at most the pause), then goes on: another run meets the state of that step for
sure (a lock held), where a race would meet it only now and then (the client's names only: the host's below take
the plain name alone). Names
that happen on the target (``execute:after-backup``, ``execute:between-renames``, ``execute:after-upload``) are
sent with the request: the helper program on the host dies there (``os._exit``), and the client, seeing that
answer never come, kills itself too. Unset (always, outside the tests) this costs one dictionary lookup.

The names, in the order a command meets them:

- ``apply:after-lock`` (the facts read and the install's lock taken, nothing changed yet),
- ``execute:after-upload``, ``execute:after-backup``, ``execute:between-renames`` (on the host, in a plan's
  execution: apply, revert, a rollback), ``apply:after-execute`` (files patched, no restart yet),
- ``nodes:after-record`` (the nodes of a multi-node server: every node's launch recorded in its install's
  manifest, none stopped yet), ``nodes:after-stop`` (every node stopped, none started yet),
- ``restart:after-relaunch`` (the old server stopped and the new one started, not yet ready),
- ``rollback:before`` (the patched server was not ready; nothing rolled back yet), ``rollback:after-relaunch``
  (files restored and the original server started, not yet ready),
- ``revert:after-execute``, ``sweep:after-run`` (a sweep point measured and saved),
- ``live:after-launch`` (a live sweep's one adaptive launch ready, no lease yet), ``live:after-lease`` (the lease
  written and answered by every rank, no window yet), ``live:after-window`` (a window measured and saved).
- ``startup:imports`` (the command line's modules half imported; with ``:sigint`` only).
"""

from __future__ import annotations

import os
import signal

ENV = "EAGLEPATCH_FAILPOINT"
# Where the host's helper program dies instead (it gets the name in its request).
REMOTE = ("execute:after-upload", "execute:after-backup", "execute:between-renames")


def armed() -> str | None:
    """The failpoint the tests armed, if any."""
    return os.environ.get(ENV) or None


def remote_fault() -> str | None:
    """The armed failpoint when it is one of the host's (to send with a request), else None."""
    name = armed()
    return name if name in REMOTE else None


def failpoint(name: str) -> None:
    """SIGKILL this process when ``name`` is the armed failpoint; SIGINT it when ``name:sigint`` is; sleep there
    when ``name:pause`` is."""
    armed_name = os.environ.get(ENV)
    if armed_name is None:
        return
    if armed_name == name:
        os.kill(os.getpid(), signal.SIGKILL)
    elif armed_name == name + ":sigint":
        os.kill(os.getpid(), signal.SIGINT)  # its handler runs as this call returns: Ctrl-C right here
    elif armed_name == name + ":pause":
        import time

        deadline = time.monotonic() + float(os.environ.get(ENV + "_PAUSE", "5"))
        release = os.environ.get(ENV + "_RELEASE")
        while time.monotonic() < deadline:
            if release and os.path.exists(release):
                return
            time.sleep(0.05 if release else max(0.0, deadline - time.monotonic()))
