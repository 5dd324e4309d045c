"""The head start over the real sshd (eaglepatch/hosts/head_start.py): the connection made before the CLI is
imported is the command's own (one login per command, as without it), a command line the CLI refuses changes
nothing and leaves no session behind, ``--help`` connects to nothing, and a failure to connect is the same error
as without a head start, met once."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from safety import CLI, cli_env, digest, make_install

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

ACCEPTED = "Accepted publickey for "
CONNECTION = re.compile(r"Connection from 127\.0\.0\.1 port \d+ on")
CLOSED = re.compile(r"Disconnected from user|Received disconnect from|Connection closed by|Connection reset by")


class Log:
    """What sshd logged (LogLevel VERBOSE) since ``mark()``."""

    def __init__(self, path: str):
        self.path = Path(path)
        self.at = 0

    def mark(self) -> None:
        self.at = self.path.stat().st_size

    def since(self, settle: float = 0.0) -> str:
        time.sleep(settle)
        with self.path.open("rb") as f:
            f.seek(self.at)
            return f.read().decode(errors="replace")


@pytest.fixture
def setup(sshd, standins, tmp_path):
    env = cli_env(tmp_path, sshd.env())
    install = make_install(standins, tmp_path / "install", "pythonpath")
    return CLI("ssh", env, ssh=[sshd.target, "-i", sshd.client_key]), install, Log(sshd.log)


@pytest.mark.parametrize("head_start", ["1", "0"])
def test_one_login_per_command_with_or_without_it(setup, head_start):
    cli, install, log = setup
    env = {"EAGLEPATCH_HEAD_START": head_start}
    for cmd in ("apply", "status", "revert"):
        log.mark()
        r = cli.run(cmd, install.pkg, *(["--no-restart"] if cmd != "status" else []), env=env).expect(0)
        seen = log.since()
        assert seen.count(ACCEPTED) == 1, f"{r}\n--- sshd log\n{seen}"


def test_a_refused_command_line_changes_nothing_and_leaves_no_session(setup):
    cli, install, log = setup
    before = digest(install.pkg)
    log.mark()
    r = cli.run("apply", install.pkg, "--no-restart", "--every", "zero").expect(2)
    assert "--every" in r.err
    assert digest(install.pkg) == before
    deadline = time.monotonic() + 10
    seen = log.since()
    while not CLOSED.search(seen.split(ACCEPTED, 1)[-1]) and time.monotonic() < deadline:
        seen = log.since(0.2)
    assert seen.count(ACCEPTED) == 1, seen  # the head start's, made before the command line was refused
    assert CLOSED.search(seen.split(ACCEPTED, 1)[-1]), f"the session was not closed:\n{seen}"


def test_help_connects_to_nothing(setup):
    cli, install, log = setup
    log.mark()
    r = cli.run("apply", install.pkg, "--help").expect(0)
    assert "Usage" in r.out
    assert not CONNECTION.search(log.since(0.5))


def test_an_unknown_host_key_is_the_same_error_met_once(setup, sshd, tmp_path):
    cli, install, log = setup
    home = sshd.make_home(tmp_path / "stranger", known="none", config=False)
    results = {}
    for head_start in ("1", "0"):
        log.mark()
        results[head_start] = r = cli.run("status", install.pkg, env={"HOME": home,
                                                                    "EAGLEPATCH_HEAD_START": head_start})
        assert r.rc != 0 and len(CONNECTION.findall(log.since(0.5))) == 1, r
    assert (results["1"].rc, results["1"].err) == (results["0"].rc, results["0"].err)
    assert "host key" in results["1"].err.lower()
