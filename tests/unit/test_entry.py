"""eaglepatch.entry: the one line per target an interrupted run ends with, and what is not asked of a host after a
request to it was cut short."""

from __future__ import annotations

import pytest

from eaglepatch import progress
from eaglepatch.entry import interrupted_lines


@pytest.fixture(autouse=True)
def fresh():
    progress.reset()
    yield
    progress.reset()


def test_nothing_started_nothing_changed():
    assert interrupted_lines({}) == ["eaglepatch: interrupted: nothing was changed"]


def test_one_line_per_target_with_what_to_run_unless_nothing_changed():
    progress.stage("root@a", "files patched, server restarting")
    progress.stage("root@b", progress.NOTHING_CHANGED)
    assert interrupted_lines(progress.states()) == [
        "eaglepatch: interrupted: root@a: files patched, server restarting: run `eaglepatch status root@a`",
        "eaglepatch: interrupted: root@b: nothing was changed"]


def test_a_session_does_not_unlock_a_host_whose_request_was_cut_short():
    """The host may still be carrying the request out under the lock: it stays (status names it)."""
    from eaglepatch.ops.session import Session

    class NoCalls:
        name = "root@a"

        def __getattr__(self, item):
            raise AssertionError(f"asked the host for {item} after its request was cut short")

    session = Session(NoCalls(), "python3", facts=None, token="t0k")  # type: ignore[arg-type]
    progress.cut_short("root@a")
    session.unlock()
    assert session.token == "t0k"


class _SlowStderr:
    """A stderr whose every write lets other threads run in the middle of it (as a pipe's writer may)."""

    def __init__(self):
        self.writes: list[str] = []

    def write(self, text):
        import time

        time.sleep(0.001)
        self.writes.append(text)
        return len(text)

    def flush(self):
        pass


def test_lines_written_from_several_threads_and_the_interrupt_message_stay_whole(monkeypatch):
    """Several targets print on their threads while Ctrl-C's lines are written: no line runs into another (one
    CI run read "...originals in X" + "eaglepatch: interrupted: ..." on one line, print's text and newline being
    two writes)."""
    import sys
    import threading

    from eaglepatch import console

    err = _SlowStderr()
    monkeypatch.setattr(sys, "stderr", err)
    threads = [threading.Thread(target=lambda i=i: [console.line(f"t{i} line {k}") for k in range(20)])
               for i in range(4)]
    for t in threads:
        t.start()
    console.last_lines("eaglepatch: interrupted: a: x\neaglepatch: interrupted: b: y\n")
    for t in threads:
        t.join()
    text = "".join(err.writes)
    lines = text.splitlines()
    assert len(lines) == 82 and text.endswith("\n")
    assert all(ln.startswith(("t", "eaglepatch: interrupted: ")) for ln in lines)
    assert sorted(ln for ln in lines if ln.startswith("t")) == sorted(f"t{i} line {k}" for i in range(4) for k in range(20))
    assert all(w.endswith("\n") for w in err.writes)
