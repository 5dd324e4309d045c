"""The console entry point (``eaglepatch``, ``python -m eaglepatch``): Ctrl-C anywhere is exit 130 and one line
per target saying what state it is in, never a traceback.

The SIGINT handler is installed before anything heavy is imported (typer, paramiko, the ops), so a Ctrl-C during
start-up is caught too. It raises ``eaglepatch.errors.Interrupted`` (not ``KeyboardInterrupt``, which click turns
into "Aborted!" and exit 1) in the main thread. With one target the command runs there and unwinds (its connection
closed; the host finishes what it was asked: a plan, a relaunch); with several, each runs on a thread of its own
and is left to the host as a killed client would be (docs/safety.md: nothing on the host waits on the client).
Then the states ``eaglepatch.progress`` holds are said, and the process ends at once with 130, without waiting for
threads or exit handlers.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any, NoReturn

from eaglepatch import console, progress
from eaglepatch.errors import ExitCode, Interrupted


def _on_sigint(_signum: int, _frame: Any) -> None:
    progress.mark_interrupted()
    raise Interrupted()


def interrupted_lines(states: dict[str, str]) -> list[str]:
    """The message of an interrupted run: one line per target that a command had started on, saying what state
    it is in and, unless nothing changed, which command tells more."""
    if not states:
        return [f"eaglepatch: interrupted: {progress.NOTHING_CHANGED}"]
    out = []
    for target, state in states.items():
        line = f"eaglepatch: interrupted: {target}: {state}"
        if state != progress.NOTHING_CHANGED:
            line += f": run `eaglepatch status {target}`"
        out.append(line)
    return out


def _finish_interrupted() -> NoReturn:
    # a second Ctrl-C while the message is written must not turn into a traceback
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from eaglepatch.redact import shown

    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        pass
    text = "".join(shown(line) + "\n" for line in interrupted_lines(progress.states()))
    console.last_lines(text)
    os._exit(int(ExitCode.INTERRUPTED))


def main() -> None:
    """Run the CLI; Ctrl-C (SIGINT) at any moment ends it with exit 130 and the state of each target."""
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:  # started with SIGINT ignored (nohup, &): keep it so
        signal.signal(signal.SIGINT, _on_sigint)
    try:
        from eaglepatch.hosts import head_start, target

        # an SSH TARGET's connection made, and its interpreter starting on the host, while the CLI is imported
        head_start.begin(sys.argv[1:], target.parse_target, target.connect_ssh)
        try:
            from eaglepatch import cli

            cli.run_app()
        finally:
            head_start.end()
    except (Interrupted, KeyboardInterrupt):
        _finish_interrupted()
