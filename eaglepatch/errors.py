"""Typed errors, each with a message for a person and the exit code docs/contract.md gives it.

Only the CLI turns these into exit codes (``eaglepatch.cli``); nothing below it calls ``sys.exit``.
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """The exit codes of docs/contract.md."""

    OK = 0
    INTERNAL = 1
    USAGE = 2
    CONNECTION = 3
    UNSUPPORTED = 4
    CONFLICT = 5
    VALIDATION = 6
    RESTART = 7
    INTERRUPTED = 130  # Ctrl-C (SIGINT): 128 + the signal's number, as shells report it


class EaglepatchError(Exception):
    """Base of every error eaglepatch reports to a person; ``str()`` is the one-line message."""

    exit_code: ExitCode = ExitCode.INTERNAL


class UsageError(EaglepatchError):
    """Bad arguments or options; the target was not touched."""

    exit_code = ExitCode.USAGE


class ConnectionFailed(EaglepatchError):
    """SSH connection, authentication or host-key failure; the target was not touched."""

    exit_code = ExitCode.CONNECTION


class Unsupported(EaglepatchError):
    """No sglang, no recognisable worker, or an ambiguous call site; nothing was changed."""

    exit_code = ExitCode.UNSUPPORTED


class Conflict(EaglepatchError):
    """A file changed since it was read or patched (drift), or another run holds the lock."""

    exit_code = ExitCode.CONFLICT


class ValidationFailed(EaglepatchError):
    """The patched file does not compile with the server's interpreter; nothing was changed."""

    exit_code = ExitCode.VALIDATION


class RestartFailed(EaglepatchError):
    """The server was not ready within the timeout; the message says what the rollback achieved."""

    exit_code = ExitCode.RESTART


class BadAnswer(EaglepatchError):
    """A host answered what eaglepatch refuses to act on (a log file name that is a path, an offset it never asked
    for, more than the bounds); nothing of it was written or acted on."""

    exit_code = ExitCode.INTERNAL


class HelperFailed(EaglepatchError):
    """eaglepatch's program on the host failed a request: it raised (its traceback's last lines say where), its process
    died or ran out of time (killed), or its answer was refused past a bound; ``str()`` names the host and the
    interpreter."""

    exit_code = ExitCode.INTERNAL


class Interrupted(BaseException):
    """Ctrl-C (SIGINT), raised in the main thread by the handler ``eaglepatch.entry`` installs before anything is
    imported. A ``BaseException``, not an ``EaglepatchError`` (nor a ``KeyboardInterrupt``, which click turns into
    exit 1): it passes every ``except Exception`` on its way out; ``eaglepatch.entry`` says what state each target
    is in (``eaglepatch.progress``) and exits 130."""

    exit_code = ExitCode.INTERRUPTED
