"""``Agents`` / ``PythonAgent`` and ``call`` (hosts/agent.py) on this machine's LocalHost: one interpreter per host
and binary for all the calls of a command, and what its failures read as."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from eaglepatch.hosts.agent import RemoteScriptError
from eaglepatch.hosts.local import LocalHost

PY = os.path.realpath(sys.executable)

PROGRAM = r'''
import os, subprocess, sys, time

def main(p):
    op = p["op"]
    if op == "pid":
        return {"pid": os.getpid(), "exe": sys.executable}
    if op == "raise":
        raise ValueError("the op failed: " + p.get("why", ""))
    if op == "die":
        sys.stderr.write("dying now\n"); sys.stderr.flush()
        os._exit(p["rc"])
    if op == "sleep":
        time.sleep(p["s"]); return "slept"
    if op == "noisy":
        print("this goes to stderr, not into the answer")
        child = subprocess.run(["cat"], stdout=subprocess.PIPE, timeout=10)  # reads the agent's stdin: /dev/null
        return {"child": child.stdout.decode(), "big": "x" * p["n"]}
    if op == "exit":
        raise SystemExit(p["code"])
    if op == "blobs":  # a batch of bytes, as the logs op answers: raw frames after the JSON
        k = p.get("k", 0)
        ROUNDS.append((k, time.monotonic()))
        if p.get("slow"):
            time.sleep(p["slow"])
        return {"k": k, "more": k + 1 < p["n"], "__blobs__": [bytes([k]) * p["size"], b"", b"tail %d" % k]}
    if op == "rounds":
        return ROUNDS
    if op == "bad blob":  # an attachment that cannot be sent: an error, never half an answer
        return {"__blobs__": [b"fine", object()]}
    return p

ROUNDS = []
'''


@pytest.fixture
def host():
    h = LocalHost()
    yield h
    h.close()


def _pid(host, python=PY, timeout=30):
    return host.agents.call(python, PROGRAM, {"op": "pid"}, timeout=timeout)["pid"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie of ours is gone too
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_every_call_is_answered_by_one_process(host):
    first = _pid(host)
    assert first != os.getpid()
    assert [_pid(host) for _ in range(3)] == [first] * 3
    assert host.agents.call(PY, PROGRAM, {"op": "echo", "ü": [1, None]}) == {"op": "echo", "ü": [1, None]}


def test_another_name_of_the_same_binary_is_the_same_process(host, tmp_path: Path):
    """facts runs with ``python3``; the server's interpreter it reports is the same binary under another name: the
    execute that follows (validated with the server's interpreter) goes to the same process."""
    link = tmp_path / "python-link"
    link.symlink_to(PY)
    first = _pid(host, str(link))
    assert _pid(host, PY) == first
    info = host.agents.call(str(link), PROGRAM, {"op": "pid"})
    assert info["pid"] == first


def _other_python() -> str | None:
    """A Python binary (not a pyenv shim) other than this one, if the machine has one."""
    import glob

    cands = ["/usr/bin/python3.11", "/usr/bin/python3"]
    cands += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[0-9]*/bin/python3")))
    for c in cands:
        if c and os.path.isfile(c) and os.access(c, os.X_OK) and os.path.realpath(c) != PY:
            return os.path.realpath(c)
    return None


def test_another_interpreter_gets_a_process_of_its_own(host, tmp_path: Path):
    other = _other_python()
    if other is None:
        pytest.skip("no second Python binary on this machine")
    a = _pid(host, other)
    b = _pid(host, PY)
    assert a != b
    assert _pid(host, other) == a and _pid(host, PY) == b


def test_a_wrapper_that_runs_the_same_binary_shares_its_process(host, tmp_path: Path):
    """What decides is the binary the interpreter runs (``sys.executable`` as it reports it), not its name."""
    wrapper = tmp_path / "python-wrapper"
    wrapper.write_text(f"#!/bin/sh\nexec {PY} \"$@\"\n")
    wrapper.chmod(0o755)
    a = _pid(host, str(wrapper))
    assert _pid(host, PY) == a


def test_an_error_in_the_program_reads_as_a_failed_run_and_the_process_goes_on(host):
    first = _pid(host)
    with pytest.raises(RemoteScriptError) as err:
        host.agents.call(PY, PROGRAM, {"op": "raise", "why": "on purpose"})
    assert err.value.result.rc == 1
    assert "ValueError: the op failed: on purpose" in str(err.value)
    assert _pid(host) == first


def test_a_process_that_dies_gives_its_status_and_the_next_call_starts_afresh(host):
    first = _pid(host)
    with pytest.raises(RemoteScriptError) as err:
        host.agents.call(PY, PROGRAM, {"op": "die", "rc": 99})
    assert err.value.result.rc == 99
    assert b"dying now" in err.value.result.stderr
    assert not _alive(first)
    assert _pid(host) != first


def test_system_exit_ends_the_process_with_its_code(host):
    first = _pid(host)
    with pytest.raises(RemoteScriptError) as err:
        host.agents.call(PY, PROGRAM, {"op": "exit", "code": 4})
    assert err.value.result.rc == 4
    assert _pid(host) != first


def test_a_timeout_kills_the_process_and_reads_as_124(host):
    first = _pid(host)
    with pytest.raises(RemoteScriptError) as err:
        host.agents.call(PY, PROGRAM, {"op": "sleep", "s": 30}, timeout=0.5)
    assert err.value.result.rc == 124 and b"timed out" in err.value.result.stderr
    assert not _alive(first)
    assert _pid(host) != first


def test_prints_and_children_never_reach_the_answers(host):
    """The program's stdout is stderr, and a child it starts reads /dev/null, not the requests."""
    out = host.agents.call(PY, PROGRAM, {"op": "noisy", "n": 300000})
    assert out == {"child": "", "big": "x" * 300000}
    assert host.agents.call(PY, PROGRAM, {"op": "echo"}) == {"op": "echo"}


def test_a_missing_interpreter_is_127(host):
    with pytest.raises(RemoteScriptError) as err:
        host.agents.call("/nonexistent/python3", PROGRAM, {"op": "pid"})
    assert err.value.result.rc == 127


def test_close_ends_the_process(host):
    pid = _pid(host)
    host.close()
    for _ in range(100):
        if not _alive(pid):
            break
        import time
        time.sleep(0.05)
    assert not _alive(pid)
    assert _pid(host) != pid  # a later call starts a new one


def test_big_requests_and_answers_travel_compressed_and_intact(host, monkeypatch):
    """Frames over 4 kB are zlib-compressed both ways; what arrives is what was sent."""
    import base64

    import eaglepatch.hosts.agent as agent

    sent = []
    real = agent._frame
    monkeypatch.setattr(agent, "_frame", lambda data: sent.append(real(data)) or sent[-1])
    blob = base64.b64encode(os.urandom(200000)).decode() + "ü" * 1000
    assert host.agents.call(PY, PROGRAM, {"op": "echo", "blob": blob}) == {"op": "echo", "blob": blob}
    assert sent[0] == b"%d\n" % len(PROGRAM.encode()) + PROGRAM.encode()  # the program: small, as it is
    assert sent[1].startswith(b"z")  # the request: compressed
    assert host.agents.call(PY, PROGRAM, {"op": "echo"}) == {"op": "echo"}
    assert not sent[-1].startswith(b"z")  # a small one as it is


def test_what_a_login_shell_prints_before_the_interpreter_is_skipped():
    """A banner on stdout before the program starts (a chatty ~/.bashrc, a ForceCommand's echo), digits and
    newlines included, must not be read as a frame or as the answer: the agent skips to eaglepatch's marker."""
    from eaglepatch.hosts.agent import MARKER

    class Chatty(LocalHost):
        def spawn(self, argv):
            return super().spawn(["sh", "-c", 'echo "welcome to gpu1"; echo 42; echo "{not json"; exec "$0" "$@"',
                                  *argv])

    host = Chatty()
    agents = host.agents
    assert agents.call(PY, PROGRAM, {"op": "echo", "x": 1}) == {"op": "echo", "x": 1}
    assert agents.call(PY, PROGRAM, {"op": "echo", "x": 2}) == {"op": "echo", "x": 2}
    agents.close()

    # a process that prints only a banner (digits included) and ends never had its answer read from that banner
    class Impostor(LocalHost):
        def spawn(self, argv):
            return super().spawn(["sh", "-c", 'echo "welcome to gpu1"; echo 42; echo "{}"'])

    impostor = Impostor()
    with pytest.raises(RemoteScriptError) as failed:
        impostor.agents.call(PY, PROGRAM, {"op": "pid"})
    impostor.close()
    assert not failed.value.started and MARKER not in failed.value.result.stdout


def test_the_agent_command_line_is_one_line_that_every_shell_passes_through():
    """csh/tcsh refuse a newline inside quotes and expand ``!`` and ``$`` in places sh does not: the agent's code on
    the command line is one line of letters, digits and a few punctuation marks, and it still runs the source."""
    import re

    from eaglepatch.hosts.agent import AGENT

    assert re.fullmatch(r'[A-Za-z0-9+/=.,;()_" ]+', AGENT), AGENT[:200]
    host = LocalHost()
    assert host.agents.call(PY, PROGRAM, {"op": "pid"})["exe"]
    host.close()


def test_a_failure_after_the_interpreter_started_is_not_a_missing_interpreter(tmp_path):
    """"No such file" in a failed call's stderr means "cannot run python" only when the interpreter never ran
    eaglepatch's code: a login shell's complaint (kept in the agent's stderr) or a FileNotFoundError's traceback
    after that is the program's failure, reported as such (exit 1), not as a wrong --python (exit 4)."""
    from eaglepatch.errors import Unsupported
    from eaglepatch.hosts.agent import call_error
    from eaglepatch.hosts.base import CommandResult

    class Grumpy(LocalHost):
        def spawn(self, argv):
            return super().spawn(["sh", "-c", 'echo "sh: /etc/gpu.rc: No such file or directory" >&2; exec "$0" "$@"',
                                  *argv])

    host = Grumpy()
    with pytest.raises(RemoteScriptError) as died:
        host.agents.call(PY, PROGRAM, {"op": "die", "rc": 3})
    host.close()
    assert died.value.started and b"No such file" in died.value.result.stderr
    err = call_error("gpu1", PY, died.value)
    assert not isinstance(err, Unsupported) and err.exit_code == 1 and "exited 3" in str(err)

    missing = LocalHost()
    with pytest.raises(RemoteScriptError) as nopy:
        missing.agents.call(str(tmp_path / "no-python"), PROGRAM, {"op": "pid"})
    missing.close()
    assert not nopy.value.started
    assert isinstance(call_error("gpu1", "py", nopy.value), Unsupported)
    assert isinstance(call_error("gpu1", "py", RemoteScriptError("py", CommandResult(2, b"", b"py: No such file"))),
                      Unsupported)


def test_a_program_made_by_a_function_is_made_once_the_process_is_started(host):
    """``call`` gives the agents ``bundle.program`` itself: the program is made while the interpreter starts on the
    host, once per process, and a second call on the same process does not make it again."""
    made = []

    def program() -> str:
        made.append(host.agents._agents[0].proc is not None)  # is the process started already?
        return PROGRAM

    assert host.agents.call(PY, program, {"op": "echo"}) == {"op": "echo"}
    assert host.agents.call(PY, program, {"op": "echo", "n": 2}) == {"op": "echo", "n": 2}
    assert made == [True]


def test_call_runs_the_host_side_package_and_says_what_a_failure_means(tmp_path):
    """``call``: the bundled package's op answers; an interpreter that does not exist is exit 4 with the hint; an
    op that fails on the host is one line naming the host and the interpreter (exit 1)."""
    from eaglepatch.errors import HelperFailed, Unsupported
    from eaglepatch.hosts.agent import call

    host = LocalHost("gpu1")
    try:
        (tmp_path / "log").write_text("x\ny\n")
        assert call(host, PY, "tail", log_path=str(tmp_path / "log"), lines=2) == {"lines": ["x", "y"]}
        with pytest.raises(HelperFailed) as failed:
            call(host, PY, "execute", timeout=30)  # no plan: KeyError on the host
        assert str(failed.value).startswith(f"gpu1: {PY} exited 1:") and "KeyError" in str(failed.value)
        assert failed.value.exit_code == 1
        with pytest.raises(Unsupported, match="gpu1: cannot run /nonexistent/python3: give the interpreter"):
            call(host, "/nonexistent/python3", "tail", log_path="x")
    finally:
        host.close()


def test_attachments_travel_as_raw_frames_after_the_answer(host):
    """An answer's ``__blobs__`` come back byte for byte, big ones compressed, empty ones too, each as pieces of at
    most ``PIECE`` bytes (a big one is never one block of memory); the rest of the answer is its JSON."""
    from eaglepatch.hosts.agent import PIECE

    res = host.agents.call(PY, PROGRAM, {"op": "blobs", "n": 1, "size": 5 << 20}, timeout=30)
    assert res["k"] == 0 and res["more"] is False
    assert [b"".join(b) for b in res["__blobs__"]] == [bytes([0]) * (5 << 20), b"", b"tail 0"]
    assert all(0 < len(p) <= PIECE for b in res["__blobs__"] for p in b) and len(res["__blobs__"][0]) >= 5


def test_rounds_are_pipelined_the_next_asked_before_the_last_is_handled(host):
    """call_each: each next request goes out once the answer's JSON is read, before its attachments are handled:
    the host starts round k + 1 while this side still handles round k (its start comes before round k's handling
    ends); every result comes in order, with its attachments; the agent serves the next call afterwards."""
    import time

    handled: list[tuple[int, float, float]] = []

    def on_result(res):
        t0 = time.monotonic()
        blobs = [b"".join(b) for b in res["__blobs__"]]
        assert blobs[0] == bytes([res["k"]]) * 1000 and blobs[2] == b"tail %d" % res["k"]
        time.sleep(0.3)  # slow handling: the host's next round must not wait for it
        handled.append((res["k"], t0, time.monotonic()))

    def follow(res):
        return {"op": "blobs", "k": res["k"] + 1, "n": 4, "size": 1000} if res["more"] else None

    host.agents.call_each(PY, PROGRAM, {"op": "blobs", "k": 0, "n": 4, "size": 1000}, follow, on_result, 30)
    assert [k for k, _, _ in handled] == [0, 1, 2, 3]
    started = dict(host.agents.call(PY, PROGRAM, {"op": "rounds"}, timeout=30))
    for k in (0, 1, 2):
        assert started[k + 1] < handled[k][2], (k, started, handled)  # round k + 1 began while k was handled


def test_a_failure_while_a_round_is_on_its_way_lets_the_process_go(host):
    """on_result raises after the next request went out: its answer is never read (nor taken for another call's):
    the process is let go and the next call on the host starts a new one."""
    from eaglepatch import progress

    first = _pid(host)

    def on_result(res):
        raise RuntimeError("the cache folder is full")

    def follow(res):
        return {"op": "blobs", "k": 1, "n": 2, "size": 10}

    try:
        with pytest.raises(RuntimeError, match="full"):
            host.agents.call_each(PY, PROGRAM, {"op": "blobs", "k": 0, "n": 2, "size": 10}, follow, on_result, 30)
        # a read-only request: the host is not marked cut short (that would keep a later unlock from being sent)
        assert not progress.was_cut(host.name)
        assert _pid(host) != first
    finally:
        progress.reset()


def test_attachments_past_their_bound_are_refused(host, monkeypatch):
    """The attachments of one answer are bounded in all (MAX_ANSWER inflated), like an answer: past it the
    process is killed and the answer refused in one line."""
    from eaglepatch.hosts import agent as agent_mod

    monkeypatch.setattr(agent_mod, "MAX_ANSWER", 1 << 20)
    with pytest.raises(agent_mod.AnswerRefused, match="inflates to more than 1 MiB"):
        host.agents.call(PY, PROGRAM, {"op": "blobs", "n": 1, "size": 2 << 20, "k": 0}, timeout=30)
    assert host.agents.call(PY, PROGRAM, {"op": "blobs", "n": 1, "size": 600 << 10, "k": 0}, timeout=30)["k"] == 0
    with pytest.raises(agent_mod.AnswerRefused, match="inflates to more than"):
        # two frames under the bound each, over it together
        host.agents.call(PY, PROGRAM.replace("b\"tail %d\" % k", "bytes(700 << 10)"),
                         {"op": "blobs", "n": 1, "size": 600 << 10, "k": 0}, timeout=30)


def test_an_answer_whose_attachment_cannot_be_sent_is_an_error_and_the_process_goes_on(host):
    """Every frame of an answer is made before any is written: an attachment that cannot be framed makes the answer
    an error (with its traceback), never a header followed by an error frame; the next call is answered right."""
    first = _pid(host)
    with pytest.raises(RemoteScriptError, match="TypeError"):
        host.agents.call(PY, PROGRAM, {"op": "bad blob"}, timeout=30)
    assert _pid(host) == first
    assert host.agents.call(PY, PROGRAM, {"op": "blobs", "n": 1, "size": 3}, timeout=30)["__blobs__"][0] == [b"\0" * 3]


def test_an_attachment_inflated_in_pieces_is_inflate_s_bytes_within_the_same_bounds():
    """``inflate_pieces``: the pieces joined are ``inflate``'s bytes (compressible or not, empty, bytes after the
    stream's end left alone); a stream that inflates past the bound, or is cut short, is refused as ``inflate``
    refuses it, having made at most one piece more than the bound."""
    import zlib

    from eaglepatch.hosts.agent import PIECE, inflate, inflate_pieces

    for raw in (b"", b"x", os.urandom(3 << 20), b"".join(b"%d," % i for i in range(1 << 20))):
        data = zlib.compress(raw, 1)
        got = inflate_pieces(data)
        assert b"".join(got) == inflate(data) == raw and all(0 < len(p) <= PIECE for p in got)
        assert b"".join(inflate_pieces(data + b"trailing")) == inflate(data + b"trailing") == raw
    bomb = zlib.compress(bytes(20 << 20), 9)
    for f in (inflate, inflate_pieces):
        with pytest.raises(ValueError, match="inflates to more than 8 MiB"):
            f(bomb, 8 << 20)
        with pytest.raises(zlib.error, match="truncated"):
            f(bomb[: len(bomb) // 2])
        with pytest.raises(zlib.error):
            f(b"not zlib at all")


def test_rounds_in_a_row_hold_one_answers_attachments_at_a_time(host):
    """call_each lets each answer's bytes go once they are handled, before the next answer's are read: however many
    rounds, this side holds one batch (a batch of logs is 8 MB), not two."""
    import tracemalloc

    size = 4 << 20
    handled = []

    def on_result(res):
        handled.append(sum(len(p) for b in res["__blobs__"] for p in b))

    def follow(res):
        return {"op": "blobs", "k": res["k"] + 1, "n": 5, "size": size} if res["more"] else None

    host.agents.call(PY, PROGRAM, {"op": "pid"}, timeout=30)  # started: its program is not counted
    tracemalloc.start()
    try:
        host.agents.call_each(PY, PROGRAM, {"op": "blobs", "k": 0, "n": 5, "size": size}, follow, on_result, 30)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert handled == [size + 6] * 5
    assert size < peak < size * 3 // 2, peak
