"""What a command prints and how it ends: messages to stderr (``say``: quiet, a live status line on a terminal),
each target run to an ``Outcome`` (``for_each_target``), data to stdout and the exit code (``finish``, ``guard``);
a document written piece by piece reaches stdout whole or not at all (``whole_or_nothing``).

With eaglepatch.cli, the only place that turns errors into exit codes (``exit_code``); nothing below calls
``sys.exit``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from typing import Any, Callable, Iterator, Sequence

import typer

from eaglepatch import console, progress
from eaglepatch.errors import EaglepatchError, ExitCode, Interrupted
from eaglepatch.hosts.spec import TargetSpec
from eaglepatch.ops.target import Connect, check_targets, target_spec
from eaglepatch.redact import shown


class Out:
    """Where messages go (stderr): ``--quiet`` keeps only warnings and errors; on a terminal, the progress lines
    of a restart ("waiting for sglang ...") and a sweep ("run k/N ...") share one live status line (rich), elsewhere
    they are plain lines."""

    # without a terminal, a restart's "waiting for sglang" lines (one per poll) at most this often
    PLAIN_EVERY_S = 15.0

    def __init__(self) -> None:
        self.quiet = False
        self.status: Any = None
        self.head = ""
        self.last_wait = 0.0

    def live(self) -> bool:
        return not self.quiet and sys.stderr.isatty() and not os.environ.get("EAGLEPATCH_PLAIN")

    def __call__(self, msg: str) -> None:
        # host-supplied text reaches the terminal with its control characters escaped (the lines stay lines)
        msg = terminal_text(msg)
        text = msg.strip()
        transient = text.startswith(("waiting for sglang on", "run ")) or text.startswith("waiting up to")
        if self.quiet and not text.startswith(("note:", "warning:", "eaglepatch:")):
            return
        if transient and self.live():
            if text.startswith("run "):
                self.head = text
            line = f"{self.head}  {text}" if self.head and not text.startswith("run ") else text
            if self.status is None:
                from rich.console import Console

                self.status = Console(stderr=True).status(line[:200])
                self.status.start()
            else:
                self.status.update(line[:200])
            return
        if text.startswith("waiting for sglang on"):
            now = time.monotonic()
            if now - self.last_wait < self.PLAIN_EVERY_S:
                return
            self.last_wait = now
        self.stop()
        console.line(msg)

    def stop(self) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None


def terminal_text(text: str) -> str:
    """What eaglepatch writes for people (messages, tables): every control character escaped but the newlines
    and tabs that lay it out (eaglepatch.redact.shown); the fields that come from a host are escaped whole where
    they are rendered, so that a newline in one cannot forge a line."""
    return shown(text, keep="\n\t")


say = Out()


# a document written piece by piece is held in memory up to this size, beyond it in a temporary file
SPOOL_BYTES = 1 << 20
COPY_BYTES = 1 << 16  # characters copied to stdout at a time


@contextlib.contextmanager
def whole_or_nothing() -> Iterator[Callable[[str], Any]]:
    """A ``write`` for data made piece by piece (``report --json``), spooled (``SPOOL_BYTES`` in memory, the rest in
    a temporary file) and copied to stdout when the block ends without an error: a consumer reads the whole
    document or nothing, never a partial one; the text is never held whole in memory."""
    with tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES, mode="w+", encoding="utf-8", newline="",
                                       prefix="eaglepatch-out-") as spool:
        yield spool.write
        spool.seek(0)
        shutil.copyfileobj(spool, sys.stdout, COPY_BYTES)
        sys.stdout.flush()


# ----------------------------------------------------------------------------------------------------------------
# Messages and exit codes


def exit_code(exc: BaseException) -> ExitCode:
    """The exit code of docs/contract.md for an error."""
    if isinstance(exc, EaglepatchError):
        return exc.exit_code
    if isinstance(exc, (typer.BadParameter, typer.Abort)):
        return ExitCode.USAGE
    return ExitCode.INTERNAL


def message(exc: BaseException) -> str:
    """The one line that says an error (an unexpected one with its type; its traceback with EAGLEPATCH_DEBUG)."""
    if isinstance(exc, EaglepatchError):
        return str(exc)
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    if os.environ.get("EAGLEPATCH_DEBUG"):
        traceback.print_exception(type(exc), exc, exc.__traceback__)
    first = str(exc).strip().splitlines()
    return f"internal error: {type(exc).__name__}: {first[0] if first else ''} (EAGLEPATCH_DEBUG=1 shows more)"


@dataclasses.dataclass
class Outcome:
    """What one TARGET's command ended with: its value, or the error (and so the exit code)."""

    target: str
    value: Any = None
    error: BaseException | None = None

    @property
    def code(self) -> ExitCode:
        return ExitCode.OK if self.error is None else exit_code(self.error)


def for_each_target(targets: Sequence[str], c: Connect, fn: Callable[[TargetSpec], Any], *,
                    check: bool = True, after: Callable[[str], None] | None = None) -> list[Outcome]:
    """Parse each TARGET once and run ``fn`` on its spec, concurrently when several; one Outcome each, in the order
    given. ``check``: every TARGET is parsed first (a bad one is a usage error, raised here, before any target is
    touched); without it (show, diff), each is parsed as its turn comes and its error is that target's outcome.
    ``after(TARGET)`` runs once each TARGET's ``fn`` has ended, however it ended (``eaglepatch.ops.nodes.Meeting``:
    the others stop waiting for it)."""
    specs = check_targets(targets, c) if check else None

    for t in targets:  # every target has a state from the start: Ctrl-C may come before its thread runs
        progress.stage(t, progress.NOTHING_CHANGED)

    def one(i: int) -> Outcome:
        t = targets[i]
        try:
            return Outcome(t, fn(specs[i] if specs is not None else target_spec(t, c)))
        except BaseException as exc:  # noqa: BLE001 - every error becomes an outcome with its exit code
            if isinstance(exc, (SystemExit, Interrupted)):
                raise  # Ctrl-C: eaglepatch.entry says what each target looks like and exits 130
            return Outcome(t, error=exc)
        finally:
            if after is not None:
                after(t)

    if len(targets) == 1:
        return [one(0)]
    import concurrent.futures  # here: its import (logging with it) costs every command 9 ms, and one target needs none

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=min(16, len(targets)))
    try:
        outcomes = list(pool.map(one, range(len(targets))))
    except BaseException:
        # Ctrl-C: the other targets are not waited for (each is left as a killed client leaves it; the host
        # finishes what it was asked): no shutdown(wait=True) here
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    return outcomes


def finish(outcomes: list[Outcome], emit_json: bool, render: Callable[[Any], str] | None, raw: bool = False,
           flat: bool = False) -> None:
    """Print each outcome (data to stdout, errors to stderr) and exit with the worst code. ``raw``: the rendered
    text is data to pass on byte for byte (a diff for patch(1)), not text for a terminal; ``flat``: an outcome
    that is a list (one object per server) joins the JSON list of several TARGETs item by item."""
    say.stop()
    values = []
    for o in outcomes:
        if o.error is not None:
            prefix = f"{o.target}: " if len(outcomes) > 1 or not str(o.error).startswith(o.target) else ""
            say(f"eaglepatch: {prefix}{message(o.error)}")
            if emit_json:
                values.append({"target": o.target, "error": message(o.error), "exit_code": int(o.code)})
            continue
        if emit_json and flat and len(outcomes) > 1 and isinstance(o.value, list):
            values.extend(o.value)
        elif emit_json:
            values.append(o.value)
        elif render is not None:
            text = render(o.value)
            if text and not raw:
                text = terminal_text(text)
            if text:
                sys.stdout.write(text if text.endswith("\n") else text + "\n")
    if emit_json:
        doc = values[0] if len(values) == 1 and len(outcomes) == 1 else values
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
    sys.stdout.flush()
    raise typer.Exit(max((int(o.code) for o in outcomes), default=0))


def guard(fn: Callable[[], None]) -> None:
    """Errors raised before any target is touched (bad options): one line, their exit code."""
    try:
        fn()
    except (typer.Exit, Interrupted):
        raise
    except BaseException as exc:  # noqa: BLE001
        say(f"eaglepatch: {message(exc)}")
        raise typer.Exit(int(exit_code(exc)))
