"""The interpreter a bare name started as on a host, kept on the client (eaglepatch/hosts/interpreters.py), and the
agent that starts it (eaglepatch/hosts/agent.py): real processes of a local host that has a key, real interpreters."""

from __future__ import annotations

import json
import shutil
import sys

import pytest

from eaglepatch.hosts import interpreters
from eaglepatch.hosts.agent import PythonAgent
from eaglepatch.hosts.local import LocalHost
from eaglepatch.hostside import install

# a program whose answer says which interpreter ran it, and that answers need_plain as the real facts does (asked
# for its own interpreter's install when it may not be its own)
PROGRAM = '''
import sys
def main(payload):
    if payload.get("self_ok") is False and not payload.get("sglang_path") and not payload.get("python"):
        return {"need_plain": True}
    return {"exe": sys.executable, "payload": payload}
'''


class KeyedHost(LocalHost):
    """A local host that the client keeps interpreters for, as it does for an SSH host."""

    interpreter_key = "ssh test@127.0.0.1:22"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("EAGLEPATCH_INTERPRETER_CACHE", raising=False)
    return tmp_path / "cache" / "eaglepatch" / "interpreters.json"


@pytest.fixture
def python3() -> str:
    """The name the agent starts by (``python3``), which these tests need on PATH."""
    if shutil.which("python3") is None:
        pytest.skip("no python3 on PATH")
    return "python3"


def agent_for(host, name: str = "python3") -> PythonAgent:
    return PythonAgent(host, name, PROGRAM, kept=interpreters.lookup(getattr(host, "interpreter_key", None), name))


def test_kept_per_host_and_bare_name_only_usable_paths(cache, monkeypatch):
    assert interpreters.lookup("h", "python3") is None
    interpreters.remember("h", "python3", "/opt/py/bin/python3")
    assert interpreters.lookup("h", "python3") == "/opt/py/bin/python3"
    assert interpreters.lookup("other", "python3") is None and interpreters.lookup("h", "python") is None
    for bad in ("python3", "rel/python3", "/bin/py\nthon", 3, None, "/" + "x" * 5000):
        interpreters.remember("h", "python", bad)
    assert interpreters.lookup("h", "python") is None
    interpreters.remember("h", "/usr/bin/python3", "/usr/bin/python3.11")  # a path names itself: not kept
    assert interpreters.lookup("h", "/usr/bin/python3") is None
    interpreters.remember(None, "python3", "/x")  # a local target: not kept
    cache.write_text(json.dumps({"h": {"python3": "not absolute"}}))  # what a hand or a host left
    assert interpreters.lookup("h", "python3") is None
    cache.write_text("{not json")
    assert interpreters.lookup("h", "python3") is None
    interpreters.remember("h", "python3", "/a/python3")
    interpreters.forget("h", "python3")
    assert interpreters.lookup("h", "python3") is None
    monkeypatch.setenv("EAGLEPATCH_INTERPRETER_CACHE", "0")
    interpreters.remember("h", "python3", "/a/python3")
    assert interpreters.lookup("h", "python3") is None


def test_at_most_max_hosts_the_least_recent_going_first(cache, monkeypatch):
    monkeypatch.setattr(interpreters, "MAX_HOSTS", 3)
    for i in range(4):
        interpreters.remember(f"h{i}", "python3", f"/p{i}/python3")
    assert [interpreters.lookup(f"h{i}", "python3") for i in range(4)] == [None, "/p1/python3", "/p2/python3",
                                                                          "/p3/python3"]


def test_the_first_start_by_name_is_kept_and_the_next_starts_that_binary(cache, python3):
    host = KeyedHost()
    try:
        first = agent_for(host)
        assert first.kept is None
        answer = first.call({"op": "scan"})
        exe = first.info["exe"]
        assert answer["exe"] == exe and interpreters.lookup(host.interpreter_key, "python3") == exe
        first.close()
        again = agent_for(host)
        assert again.kept == exe
        assert again.call({"op": "scan"})["exe"] == exe
        assert again.info["exe"] == exe and again._from_kept
    finally:
        host.close()


@pytest.mark.parametrize("early", [False, True], ids=["started-by-the-request", "started-early"])
def test_a_kept_binary_that_no_longer_starts_falls_back_to_the_name_once(cache, python3, tmp_path, early):
    """Gone (the spawn fails at once, as on a local host) or no longer Python (it runs and dies before the
    agent's marker, as a replaced binary would over SSH): the same request is answered by the name, and what the
    name runs is kept instead; also when the process was started before the request (``start``: the head start)."""
    host = KeyedHost()
    broken = tmp_path / "python3"
    broken.write_text("#!/bin/sh\necho 'not python' >&2\nexit 3\n")
    broken.chmod(0o755)
    try:
        for kept in ("/nonexistent/bin/python3", str(broken)):
            interpreters.remember(host.interpreter_key, "python3", kept)
            a = agent_for(host)
            assert a.kept == kept
            if early:
                a.start()
                a.start()  # idempotent
            answer = a.call({"op": "scan", "n": 1})
            assert answer["payload"] == {"op": "scan", "n": 1} and answer["exe"] != kept
            assert interpreters.lookup(host.interpreter_key, "python3") == a.info["exe"] == answer["exe"]
            a.close()
    finally:
        host.close()


@pytest.mark.parametrize("early", [False, True], ids=["started-by-the-request", "started-early"])
def test_a_facts_request_that_would_take_the_kept_binarys_own_install_asks_the_name(cache, python3, tmp_path, early):
    """A kept binary may no longer be what ``python3`` runs: a facts request that names no install (the answer
    would be that interpreter's sglang) goes out with self_ok false, and on need_plain the agent asks the name
    itself; other requests, and facts that name the install, are answered by the kept binary."""
    host = KeyedHost()
    other = sys.executable  # a working interpreter by another path than python3 (this venv's)
    try:
        interpreters.remember(host.interpreter_key, "python3", other)
        a = agent_for(host)
        if early:
            a.start()
        named = a.call({"op": "facts", "sglang_path": "/x"})
        assert a._from_kept and named["payload"] == {"op": "facts", "sglang_path": "/x", "self_ok": False}
        a.close()
        a = agent_for(host)
        if early:
            a.start()
        own = a.call({"op": "facts"})
        assert own["payload"] == {"op": "facts"} and not a._from_kept  # asked again, of the name
        assert interpreters.lookup(host.interpreter_key, "python3") == a.info["exe"] == own["exe"]
        a.close()
    finally:
        host.close()


def test_the_host_answers_need_plain_only_when_it_would_take_its_own_interpreters_install():
    servers = [{"pid": 1, "package_dir": "/srv/sglang", "argv": ["python", "-m", "sglang.launch_server"],
                "args_index": 3}]
    assert install.facts_find_package({"self_ok": False}, []) == (None, {"need_plain": True})
    assert install.facts_find_package({"self_ok": False}, servers) == ("/srv/sglang", None)
    pkg, stop = install.facts_find_package({}, [])
    assert stop is None  # the interpreter's own install, as before (None when it has none)
