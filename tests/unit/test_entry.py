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
    from eaglepatch.ops.core import Session

    class NoCalls:
        name = "root@a"

        def __getattr__(self, item):
            raise AssertionError(f"asked the host for {item} after its request was cut short")

    session = Session(NoCalls(), "python3", facts=None, token="t0k")  # type: ignore[arg-type]
    progress.cut_short("root@a")
    session.unlock()
    assert session.token == "t0k"
