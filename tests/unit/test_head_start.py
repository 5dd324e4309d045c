"""The head start (eaglepatch/hosts/head_start.py): the command line read before the CLI is imported, and the
connection it made handed to the command only for the very TARGET the command parses. Over a real sshd:
tests/e2e/test_head_start_ssh.py."""

from __future__ import annotations

import pytest
import typer

from eaglepatch import cli
from eaglepatch.errors import ConnectionFailed
from eaglepatch.hosts import head_start
from eaglepatch.hosts.spec import SSHOptions
from eaglepatch.hosts.target import connect_ssh, parse_target


def test_the_option_tables_are_the_clis():
    """A new option of a command must enter the table (else a command line using it gets no head start; one
    taking a value read as a flag would make its value the TARGET)."""
    app = typer.main.get_command(cli.app)
    valued, flags = set(), set()
    for name, command in app.commands.items():
        params = command.params
        assert params[0].param_type_name == "argument", f"{name}: its first parameter is no TARGET"
        for p in params:
            if p.param_type_name == "option":
                (flags if p.is_flag or p.count else valued).update(p.opts + p.secondary_opts)
    assert set(app.commands) == head_start.COMMANDS
    assert valued == head_start.VALUED and flags == head_start.FLAGS


@pytest.mark.parametrize("argv, expected", [
    (["apply", "root@gpu"], ("root@gpu", {})),
    (["apply", "--no-restart", "root@gpu", "-i", "/k", "--sglang-path", "/x"], ("root@gpu", {"identity": "/k"})),
    (["status", "--python", "/opt/py", "-p", "2222", "h", "h2"], ("h", {"python": "/opt/py", "port": "2222"})),
    (["revert", "--identity=/a", "-J", "jump", "h", "--identity", "/b"], ("h", {"identity": "/b", "jump": "jump"})),
    (["sweep", "--grid", "speculative-num-steps=1,3", "--connect-timeout=3", "h"], ("h", {"connect_timeout": "3"})),
    (["report", "--run", "h", "h2"], ("h2", {})),  # --run takes a value: "h" is it
    (["apply", "h", "--help"], None),
    (["apply", "--version"], None),
    (["apply", "h", "-i/k"], None),  # a form the guess does not read
    (["apply", "h", "-p=22"], None),
    (["apply", "h", "--accept-new-host-key"], None),  # no host key saved for a command that may not run
    (["apply", "h", "--bogus"], None),
    (["apply", "--", "h"], None),
    (["apply", "h", "-i"], None),  # its value missing
    (["apply", "--json"], None),  # no TARGET
    (["frobnicate", "h"], None),
    ([], None),
])
def test_guess(argv, expected):
    assert head_start.guess(argv) == expected


class _Host:
    def __init__(self):
        self.closed = 0

    def close(self):
        self.closed += 1


@pytest.fixture
def made(monkeypatch):
    """A head start made without a network: ``run`` gives it the host (or the error) the test asks for."""
    monkeypatch.setattr(head_start, "_current", None)
    got = {}

    def fake_run(self):
        self.host, self.error = got.get("host"), got.get("error")
        got["ran"] = self

    monkeypatch.setattr(head_start._HeadStart, "run", fake_run)
    monkeypatch.delenv("EAGLEPATCH_HEAD_START", raising=False)
    return got


def test_the_connection_goes_to_the_same_target_only_and_once(made):
    made["host"] = host = _Host()
    head_start.begin(["apply", "-i", __file__, "root@gpu:2222"], parse_target, connect_ssh)
    assert made["ran"].python == "python3"
    assert head_start.claim(parse_target("root@gpu:2222")) is None  # not the key given: another spec
    assert head_start.claim(parse_target("root@other:2222", SSHOptions(identity=__file__))) is None
    mine = parse_target("root@gpu:2222", SSHOptions(identity=__file__))
    assert head_start.claim(mine) is host
    assert head_start.claim(mine) is None  # claimed: a second connection is the command's own
    head_start.end()
    assert host.closed == 0  # the command's now: it closes it


def test_one_nobody_claimed_is_closed_at_the_end(made):
    made["host"] = host = _Host()
    head_start.begin(["status", "--python", "/opt/py/bin/python", "h"], parse_target, connect_ssh)
    assert made["ran"].python == "/opt/py/bin/python"
    head_start.end()
    assert host.closed == 1
    assert head_start.claim(parse_target("h")) is None  # ended: nothing left to claim


def test_its_error_is_the_commands_for_the_same_target(made):
    made["error"] = ConnectionFailed("host key of h is unknown")
    head_start.begin(["apply", "h"], parse_target, connect_ssh)
    with pytest.raises(ConnectionFailed, match="host key of h is unknown"):
        head_start.claim(parse_target("h"))


@pytest.mark.parametrize("argv, env", [
    (["apply", "h"], "0"),  # turned off
    (["apply", "./local-tree"], None),  # a local TARGET
    (["apply", "h", "-p", "notaport"], None),  # the CLI says what is wrong
    (["apply", "h", "-i", "/no/such/key"], None),
])
def test_nothing_is_started(made, monkeypatch, argv, env):
    if env is not None:
        monkeypatch.setenv("EAGLEPATCH_HEAD_START", env)
    head_start.begin(argv, parse_target, connect_ssh)
    assert "ran" not in made and head_start._current is None
