"""Restart strategies, options and readiness as data: what is run on the host, in which order, and what comes back.

A strict fake host answers only the helper operations (``eaglepatch.hostside`` ops) and commands a test declares, and fails
on anything else; the clock is fake, so the timeouts are exact and instant. The same flows against real
processes are in tests/e2e/test_restart_local.py.
"""

from __future__ import annotations

import dataclasses

import json
from typing import Any, Callable

import pytest

from eaglepatch.errors import ExitCode, RestartFailed, Unsupported, UsageError
from eaglepatch.hosts.agent import RemoteScriptError
from eaglepatch.hosts.base import CommandResult, FileStat
from eaglepatch.server import (
    LaunchSpec,
    NoServerRunning,
    ReadyState,
    RestartOptions,
    ServerProcess,
    Strategy,
    restart,
    wait_until_ready,
)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        assert s >= 0
        self.slept.append(s)
        self.t += s


class FakeAgents:
    """``host.agents`` of a FakeHost: each request answered by the host's declared ops; an answer that is a
    ``CommandResult`` with rc != 0 is a failed request (127: no such interpreter), as the real agent raises it."""

    def __init__(self, host: "FakeHost") -> None:
        self.host = host

    def call(self, python, program, payload, timeout=None):
        out = self.host.helper(json.loads(json.dumps(payload)))
        if isinstance(out, CommandResult):
            if out.rc != 0:
                raise RemoteScriptError(python, out, started=out.rc != 127)
            return json.loads(out.stdout)
        return json.loads(json.dumps(out))

    def close(self):
        pass


class FakeHost:
    """Answers helper ops from ``ops`` (op name -> callable(payload) -> JSON) and commands from ``commands``
    (argv[0] -> callable(argv) -> CommandResult); anything undeclared fails the test."""

    name = "fake"
    is_local = False

    def __init__(self, ops: dict[str, Callable[[dict], Any]] | None = None, commands=None, files=None):
        self.ops = ops or {}
        self.commands = commands or {}
        self.files: dict[str, FileStat] = files or {}
        self.calls: list[tuple[str, Any]] = []
        self.agents = FakeAgents(self)

    def helper(self, payload):
        op = payload["op"]
        if op == "relaunch" and "relaunch" not in self.ops:
            return self._relaunch(payload)
        self.calls.append((op, payload))
        assert op in self.ops, f"undeclared helper op {op!r}"
        return self.ops[op](payload)

    def run(self, argv, *, stdin=None, timeout=None, max_output=None):
        argv = list(argv)
        self.calls.append(("cmd", argv))
        assert argv[0] in self.commands, f"undeclared command {argv!r}"
        return self.commands[argv[0]](argv)

    def _relaunch(self, payload):
        """``op_relaunch`` in terms of the declared stop, port and start ops (each recorded as a call):
        stop, then (when asked) the port check, then start; nothing starts after a failed stop or on a busy
        port."""
        out = {}
        for name, sub in (("stop", payload.get("stop")), ("port", payload if payload.get("check_port") else None),
                          ("start", payload["start"])):
            if sub is None:
                continue
            sub = dict(sub, op=name)
            self.calls.append((name, sub))
            assert name in self.ops, f"undeclared helper op {name!r}"
            res = self.ops[name](sub)
            if name == "stop":
                out["stop"] = res
                if res.get("remaining") or not res.get("port_free", True):
                    return out
            elif name == "port":
                if res["listening"]:
                    out["busy"] = True
                    return out
            else:
                out["start"] = res
        return out

    def stat(self, path):
        self.calls.append(("stat", path))
        return self.files.get(path)

    def close(self):
        pass

    def ops_called(self) -> list[str]:
        return [c[0] for c in self.calls]


def probes(*answers: dict, clock: Clock | None = None, step: float = 0.0):
    """A probe handler answering in turn (the last one repeats); each answer may advance the fake clock."""
    seq = list(answers)

    def handler(payload):
        if clock is not None:
            clock.t += step
        return seq.pop(0) if len(seq) > 1 else seq[0]

    return handler


STARTING = {"alive": True, "old_alive": False, "status": 503, "error": None, "endpoint": "/health_generate",
            "last_line": "Load weight begin"}
REFUSED = dict(STARTING, status=None, error="connection refused", last_line=None)
READY = dict(STARTING, status=200, last_line="The server is fired up and ready to roll!")
DEAD = dict(STARTING, alive=False, status=None, last_line="RuntimeError: broken patch")

CURRENT = ServerProcess(
    pid=100, argv=["python3", "-m", "sglang.launch_server", "--port", "30001"], cwd="/srv", env={"A": "1"},
    exe="/usr/bin/python3", port=30001, children=(101, 102), pgid=100, sid=100, start=77,
)
STOPPED = {"already_gone": False, "stopped": [100, 101, 102], "killed": [], "remaining": [], "errors": [],
           "port_free": True, "seconds": 0.4}


# -- options ------------------------------------------------------------------------------------------------------


def test_default_options_wait_long_enough_for_a_big_model():
    opts = RestartOptions()
    assert (opts.restart_cmd, opts.systemd_unit, opts.timeout, opts.grace) == (None, None, 900.0, 30.0)
    assert not opts.stop_on_failure  # a slow server is left loading; a rollback stops it in its own request


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(restart_cmd="x", systemd_unit="sglang"), "exclude each other"),
        (dict(restart_cmd="  "), "empty"),
        (dict(systemd_unit="--now"), "not a unit"),
        (dict(systemd_unit="sglang server"), "not a unit"),
        (dict(systemd_unit=""), "not a unit"),
        (dict(timeout=0), "timeout"),
        (dict(timeout=-5), "timeout"),
        (dict(grace=-1), "negative"),
        (dict(poll_interval=0), "poll interval"),
    ],
)
def test_bad_option_combinations_are_usage_errors(kwargs, match):
    with pytest.raises(UsageError, match=match) as info:
        RestartOptions(**kwargs)
    assert info.value.exit_code == ExitCode.USAGE


def test_nothing_running_and_nothing_to_start_says_how_to_start_one():
    host = FakeHost()  # no op declared: nothing may run
    with pytest.raises(NoServerRunning, match="sglang.launch_server") as info:
        restart(host, current=None, launch=None, options=RestartOptions())
    assert isinstance(info.value, RestartFailed)
    assert host.calls == []


def test_a_server_that_cannot_be_relaunched_is_refused_before_anything_is_stopped():
    host = FakeHost()
    with pytest.raises(UsageError):
        restart(host, current=ServerProcess(pid=5, argv=["python3"], cwd=None, env=None, exe=None))
    assert host.calls == []


# -- readiness ----------------------------------------------------------------------------------------------------


def test_ready_after_503s_with_one_progress_line_per_poll():
    clock = Clock()
    host = FakeHost({"probe": probes(REFUSED, STARTING, STARTING, READY)})
    lines: list[str] = []
    r = wait_until_ready(host, 30000, "0.0.0.0", 60, lines.append, log_path="/l", pid=7,
                         poll_interval=2.0, clock=clock, sleep=clock.sleep)
    assert r.ready and r.state is ReadyState.READY and r.status == 200
    assert len(lines) == 3
    assert lines[0] == "waiting for sglang on :30000 (0 s) connection refused"
    assert lines[1] == "waiting for sglang on :30000 (0 s) last log: Load weight begin"  # 0.125 s later
    payload = host.calls[0][1]
    assert (payload["host"], payload["port"], payload["pid"], payload["log_path"]) == ("127.0.0.1", 30000, 7, "/l")


def test_a_dead_server_ends_the_wait_at_once():
    clock = Clock()
    host = FakeHost({"probe": probes(STARTING, DEAD)})
    r = wait_until_ready(host, 30000, timeout=900, pid=7, clock=clock, sleep=clock.sleep)
    assert r.state is ReadyState.DIED and not r.ready
    assert r.seconds < 5
    assert r.last_line == "RuntimeError: broken patch"


def test_timeout_never_sleeps_past_the_deadline():
    clock = Clock()
    host = FakeHost({"probe": probes(STARTING)})
    r = wait_until_ready(host, 30000, timeout=5, poll_interval=2.0, clock=clock, sleep=clock.sleep)
    assert r.state is ReadyState.TIMEOUT
    # quick polls first, doubling up to the interval, and the last one cut at the deadline
    assert clock.slept == [0.125, 0.25, 0.5, 1.0, 2.0, 1.125]
    assert r.seconds == 5.0


def test_the_old_servers_answer_does_not_count():
    """Right after a restart command returns, the server being replaced may still answer 200."""
    clock = Clock()
    old_still_up = dict(READY, old_alive=True)
    host = FakeHost({"probe": probes(old_still_up, old_still_up, STARTING, READY)})
    lines: list[str] = []
    r = wait_until_ready(host, 30000, timeout=60, progress=lines.append, old_pid=100, clock=clock, sleep=clock.sleep)
    assert r.ready and len(lines) == 3
    assert "the old server (pid 100) is still running" in lines[0]


def test_a_failing_poll_counts_as_not_ready_yet_but_a_missing_interpreter_is_an_error():
    clock = Clock()
    answers = [CommandResult(1, b"", b"Traceback: something transient"), READY]
    host = FakeHost({"probe": lambda p: answers.pop(0)})
    assert wait_until_ready(host, 30000, timeout=60, clock=clock, sleep=clock.sleep).ready

    host = FakeHost({"probe": lambda p: CommandResult(127, b"", b"python9: not found")})
    with pytest.raises(Unsupported, match="cannot run python9"):
        wait_until_ready(host, 30000, timeout=60, python="python9", clock=clock, sleep=clock.sleep)


# -- relaunch -----------------------------------------------------------------------------------------------------


def relaunch_host(*probe_answers, stop=STOPPED, start=None, tail=("line 1", "line 2"), clock=None):
    return FakeHost(
        {
            "stop": lambda p: stop,
            # the host resolves the default log (null) in its own state folder and says which it opened
            "start": lambda p: start or {"pid": 200, "start": 88, "offset": 1234,
                                         "log_path": p["log_path"] or f"/srv/state/server-{p['port']}.log"},
            "probe": probes(*probe_answers, clock=clock, step=1.0),
            "tail": lambda p: {"lines": list(tail)},
            "port": lambda p: {"listening": False},
        }
    )


def test_relaunch_stops_then_starts_the_same_command_and_waits():
    clock = Clock()
    host = relaunch_host(STARTING, READY, clock=clock)
    lines: list[str] = []
    r = restart(host, current=CURRENT, options=RestartOptions(poll_interval=1), progress=lines.append,
                clock=clock, sleep=clock.sleep)
    assert (r.strategy, r.ready, r.pid, r.stopped_pid, r.port) == (Strategy.RELAUNCH, True, 200, 100, 30001)
    assert host.ops_called() == ["stop", "start", "probe", "probe"]
    stop, start, probe = host.calls[0][1], host.calls[1][1], host.calls[2][1]
    assert (stop["pid"], stop["start"], stop["children"]) == (100, 77, [101, 102])
    assert (stop["grace"], stop["port"]) == (30.0, 30001)
    assert (start["argv"], start["cwd"], start["env"]) == (CURRENT.argv, "/srv", {"A": "1"})
    assert start["log_path"] is None  # the default log: the host's, in its EAGLEPATCH_STATE_DIR
    assert r.log_path == "/srv/state/server-30001.log"  # where the host said it is
    assert "started sglang (pid 200) on :30001; its log: /srv/state/server-30001.log" in lines
    assert (probe["pid"], probe["start"], probe["offset"], probe["port"]) == (200, 88, 1234, 30001)
    assert any(line.startswith("stopping sglang (pid 100)") for line in lines)
    assert any(line.startswith("waiting for sglang on :30001") for line in lines)


def test_the_log_said_is_the_one_the_host_opened_and_the_command_line_is_masked():
    """/tmp/eaglepatch is not this user's alone: the host opens the log in its private folder and says which;
    the progress names that one (before: the default path, not the one used), and the command line said before
    the start has its API key masked."""
    clock = Clock()
    argv = ["python3", "-m", "sglang.launch_server", "--port", "30001", "--api-key", "sk-1"]
    current = dataclasses.replace(CURRENT, argv=argv)
    host = relaunch_host(READY, clock=clock, start={"pid": 200, "start": 88, "offset": 0,
                                                    "log_path": "/tmp/eaglepatch-0/server-30001.log"})
    lines: list[str] = []
    r = restart(host, current=current, options=RestartOptions(poll_interval=1), progress=lines.append, clock=clock,
                sleep=clock.sleep)
    assert r.ready and r.log_path == "/tmp/eaglepatch-0/server-30001.log"
    assert "started sglang (pid 200) on :30001; its log: /tmp/eaglepatch-0/server-30001.log" in lines
    assert not any("/tmp/eaglepatch/server-30001.log" in line or "sk-1" in line for line in lines), lines
    assert any("--api-key ***" in line for line in lines), lines


def test_a_launch_spec_replaces_what_is_started_but_the_current_server_is_what_stops():
    """A sweep point (or a manifest's spec): stop what runs, start the given command line."""
    clock = Clock()
    host = relaunch_host(READY, clock=clock)
    spec = LaunchSpec(argv=["python3", "-m", "sglang.launch_server", "--port", "30001", "--tp", "2"], cwd="/x",
                      env={}, port=30001)
    r = restart(host, current=CURRENT, launch=spec, clock=clock, sleep=clock.sleep)
    assert r.ready
    assert host.calls[1][1]["argv"] == spec.argv


def test_start_only_when_nothing_runs_and_the_port_is_free():
    clock = Clock()
    host = relaunch_host(READY, clock=clock)
    spec = CURRENT.launch_spec()
    r = restart(host, current=None, launch=spec, clock=clock, sleep=clock.sleep)
    assert (r.strategy, r.ready, r.stopped_pid) == (Strategy.START, True, None)
    assert host.ops_called() == ["port", "start", "probe"]


def test_start_refuses_a_busy_port_rather_than_mistake_another_server_for_ready():
    host = relaunch_host(READY)
    host.ops["port"] = lambda p: {"listening": True}
    r = restart(host, current=None, launch=CURRENT.launch_spec())
    assert not r.ready and "already in use" in r.message
    assert "start" not in host.ops_called()


def test_a_server_that_will_not_stop_is_not_started_again():
    host = relaunch_host(READY, stop=dict(STOPPED, remaining=[101], errors=[]))
    r = restart(host, current=CURRENT)
    assert not r.ready and "101" in r.message and "nothing was started" in r.message
    assert host.ops_called() == ["stop"]


def test_a_crash_at_startup_returns_early_with_the_log_tail_and_stops_what_it_left():
    """The launcher is gone; its TP ranks may not be (they hold GPU memory): its own group is stopped."""
    clock = Clock()
    tail = ("Traceback (most recent call last):", "RuntimeError: broken")
    host = relaunch_host(STARTING, DEAD, tail=tail, clock=clock)
    r = restart(host, current=CURRENT, options=RestartOptions(timeout=600), clock=clock, sleep=clock.sleep)
    assert (r.ready, r.state, r.pid) == (False, ReadyState.DIED, 200)
    assert r.seconds < 60
    assert r.log_tail.endswith("RuntimeError: broken")
    tail = next(c[1] for c in host.calls if c[0] == "tail")
    assert tail["offset"] == 1234
    stops = [c[1] for c in host.calls if c[0] == "stop"]
    assert [(s["pid"], s["leader"]) for s in stops] == [(100, True), (200, True)]
    assert "exited during startup" in r.message


def test_a_timeout_stops_the_server_it_started_when_asked():
    clock = Clock()
    host = relaunch_host(STARTING, clock=clock)
    r = restart(host, current=CURRENT, options=RestartOptions(timeout=10, poll_interval=2, stop_on_failure=True),
                clock=clock, sleep=clock.sleep)
    assert (r.ready, r.state, r.stopped_failed) == (False, ReadyState.TIMEOUT, True)
    assert r.log_tail == "line 1\nline 2"
    stops = [c[1] for c in host.calls if c[0] == "stop"]
    assert [s["pid"] for s in stops] == [100, 200]
    assert "stopped it" in r.message


def test_a_timeout_leaves_the_server_running_by_default():
    clock = Clock()
    host = relaunch_host(STARTING, clock=clock)
    r = restart(host, current=CURRENT, options=RestartOptions(timeout=10), clock=clock, sleep=clock.sleep)
    assert not r.ready and not r.stopped_failed
    assert host.ops_called().count("stop") == 1


def test_a_start_that_fails_at_once_is_reported():
    host = relaunch_host(READY, start={"error": "could not start the server: the directory /srv does not exist",
                                       "offset": 0})
    r = restart(host, current=CURRENT)
    assert not r.ready and "does not exist" in r.message
    assert "probe" not in host.ops_called()


# -- restart command and systemd ----------------------------------------------------------------------------------


def test_restart_command_runs_as_given_with_its_output_to_the_log_then_waits():
    clock = Clock()
    scan = {"servers": [dict(pid=300, argv=CURRENT.argv, args_index=3, cwd="/srv", env={}, exe=None, children=[],
                             pgid=300, sid=300, start=9, same_mount_ns=True)]}
    host = FakeHost(
        {"probe": probes(READY), "scan": lambda p: scan},
        commands={"sh": lambda argv: CommandResult(0, b"", b"")},
        files={"/tmp/eaglepatch/server-30001.log": FileStat(0o100644, 0, 0, 555, 0.0)},
    )
    cmd = "docker restart 'sglang server' && echo done"
    r = restart(host, current=CURRENT, options=RestartOptions(restart_cmd=cmd), clock=clock, sleep=clock.sleep)
    assert (r.strategy, r.ready, r.pid, r.port) == (Strategy.RESTART_CMD, True, 300, 30001)
    sh = next(c[1] for c in host.calls if c[0] == "cmd")
    assert sh[:2] == ["sh", "-c"] and sh[-1] == cmd
    assert sh[-2] == "/tmp/eaglepatch/server-30001.log"
    probe = next(c[1] for c in host.calls if c[0] == "probe")
    assert (probe["old_pid"], probe["old_start"], probe["offset"]) == (100, 77, 555)


def test_a_failing_restart_command_is_not_ready_with_its_output():
    host = FakeHost(
        {"tail": lambda p: {"lines": ["docker: no such container"]}},
        commands={"sh": lambda argv: CommandResult(1, b"", b"")},
    )
    r = restart(host, current=CURRENT, options=RestartOptions(restart_cmd="docker restart x"))
    assert not r.ready and "exited 1" in r.message and r.log_tail == "docker: no such container"


def test_systemd_restarts_the_unit_and_watches_its_main_pid():
    clock = Clock()

    def systemctl(argv):
        if argv[1] == "restart":
            return CommandResult(0, b"", b"")
        assert argv[1:] == ["show", "-p", "MainPID", "sglang"]
        return CommandResult(0, b"MainPID=4321\n", b"")

    host = FakeHost({"probe": probes(STARTING, DEAD, clock=clock, step=1.0)},
                    commands={"systemctl": systemctl, "journalctl": lambda a: CommandResult(0, b"boom\n", b"")})
    r = restart(host, current=CURRENT, options=RestartOptions(systemd_unit="sglang"), clock=clock, sleep=clock.sleep)
    assert (r.strategy, r.ready, r.pid, r.state) == (Strategy.SYSTEMD, False, 4321, ReadyState.DIED)
    assert ["systemctl", "restart", "sglang"] in [c[1] for c in host.calls if c[0] == "cmd"]
    assert r.log_tail == "boom"
    assert next(c[1] for c in host.calls if c[0] == "probe")["pid"] == 4321


def test_a_node_of_rank_above_0_waits_for_node_rank_0s_verdict_past_its_own_timeout(monkeypatch):
    """A node of rank > 0 serves no health endpoint: it waits for the server's verdict, which node rank 0 gives at its
    own timeout, started later on its own host's clock. Node rank 0 ready 5 s past this node's timeout: this node
    counts as ready, not timed out (its TIMEOUT would roll back a server about to come up); no verdict at all: it
    gives up once the grace is over too."""
    import importlib

    R = importlib.import_module("eaglepatch.server.restart")

    clock = Clock()
    t0 = clock.t
    monkeypatch.setattr(R, "call", lambda *a, **k: {"alive": True, "last_line": "joined"})

    def run(ready_at: float | None) -> Any:
        clock.t = t0
        verdict = (lambda: None) if ready_at is None else (lambda: True if clock.t - t0 >= ready_at else None)

        def pause(s: float) -> bool:
            clock.sleep(s)
            return False

        node = R.NodeWait(http=False, verdict=verdict, pause=pause)
        r = R._Run(object(), RestartOptions(poll_interval=1.0), None, "python3", clock, clock.sleep, node=node)
        return r.watch_node(30001, 30.0, 4242, 1, None, 0)

    assert run(35.0).state == ReadyState.READY
    late = run(None)
    assert late.state == ReadyState.TIMEOUT and late.seconds >= 30.0 + R.VERDICT_GRACE_S
