"""The command line as a person meets it: choices, completion, help on every option, examples, exit codes, quiet
and verbose. Run in-process (typer's CliRunner); nothing here reaches a target."""

from __future__ import annotations

import os
import subprocess
import sys

import typer.main
from typer.testing import CliRunner

from eaglepatch.cli import app

runner = CliRunner()
COMMAND = typer.main.get_command(app)


def test_every_option_of_every_command_has_help_and_every_command_has_examples():
    """A person reading --help learns what each option does, and sees the command written out."""
    for name, cmd in COMMAND.commands.items():
        missing = [p.opts for p in cmd.params if p.param_type_name == "option" and not (p.help or "").strip()]
        assert not missing, f"{name}: options without help: {missing}"
        assert "Examples:" in (cmd.help or "") and f"eaglepatch {name} " in cmd.help, name


def test_the_top_level_help_lists_the_exit_codes_and_prints_brackets_as_written():
    """Exit codes are what scripts branch on; "[user@]host[:port]" must not lose its brackets to markup."""
    r = runner.invoke(app, ["--help"])
    assert r.exit_code == 0
    for code in ("0 done", "2 usage error", "3 connection", "7 restart failed"):
        assert code in r.output
    r = runner.invoke(app, ["apply", "--help"])
    assert "[user@]host[:port]" in r.output


def test_mode_and_by_are_choices():
    """A value outside the choices is a usage error (exit 2) naming the choices, before any target is read."""
    r = runner.invoke(app, ["apply", "--mode", "fast", "/nonexistent"])
    assert r.exit_code == 2 and "auto" in r.output and "events" in r.output
    r = runner.invoke(app, ["report", "--by", "gpu", "/nonexistent"])
    assert r.exit_code == 2 and "rank" in r.output


def test_shell_completion_is_on():
    """--show-completion prints the completion script of the installed command."""
    env = dict(os.environ, SHELL="/bin/bash", _TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION="1")
    r = subprocess.run([sys.executable, "-m", "eaglepatch", "--show-completion", "bash"], capture_output=True,
                       text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "complete" in r.stdout and "COMPLETE" in r.stdout


def test_quiet_keeps_errors_and_drops_progress(tmp_path):
    """-q: the one-line error still comes (exit 2), progress lines do not; -q and -v together are refused."""
    r = subprocess.run([sys.executable, "-m", "eaglepatch", "-q", "status", str(tmp_path / "missing")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.startswith("eaglepatch: ") and len(r.stderr.strip().splitlines()) == 1
    r = runner.invoke(app, ["-q", "-v", "status", "/x"])
    assert r.exit_code == 2
