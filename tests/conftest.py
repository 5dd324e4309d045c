"""Fixtures shared by every test layer.

- ``recipe``: the built-in recipe (``patches/*.toml``), loaded once.
- ``sglang_release``: a function ``(version) -> Path`` giving the cached site of a pinned sglang release
  (``tests/sglang_releases.py``); a release that cannot be downloaded FAILS the test with pip's message.

``tests/`` is put on ``sys.path`` so that test modules in any layer can ``import sglang_releases``. The recipe is
imported in its fixture, not here: the runtime's tests (tests/unit/test_runtime*.py, with tests/unit/conftest.py)
need nothing but the standard library and pytest, and run so on a GPU machine that has neither libcst nor
eaglepatch's other dependencies.

Each suite has its own conftest.py beside its tests (tests/unit: the runtime's fixtures; tests/e2e: the real sshd);
a test module never imports another: what tests share is in a helper module (tests/unit/runtime_helpers.py,
tests/e2e/sshd_server.py, tests/e2e/cli_helpers.py, tests/real/patched_harness.py, ...).

With ``EAGLEPATCH_NO_SKIPS=1`` (``.ci/run``), a skip outside tests/cuda_only_skips.txt fails the session
(tests/skip_guard.py).
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import pytest

_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

import sglang_releases  # noqa: E402
from skip_guard import pytest_runtest_logreport, pytest_sessionfinish  # noqa: E402,F401  (CI's no-skip rule)

if TYPE_CHECKING:
    from eaglepatch.transform.recipe import Recipe


def _compile_eaglepatch() -> None:
    """With ``PYTHONDONTWRITEBYTECODE`` set, no import writes eaglepatch's ``.pyc`` files, so every CLI process the
    tests start compiled the whole package from source again (~0.2 s of CPU each, thousands of them); compiled once
    here instead, where Python would have cached them (git-ignored ``__pycache__``), before xdist's workers start.
    A tree that cannot be written is left as it is."""
    import compileall
    import os

    if not sys.dont_write_bytecode or "PYTEST_XDIST_WORKER" in os.environ:
        return
    try:
        compileall.compile_dir(str(Path(_TESTS).parent / "eaglepatch"), quiet=2)
    except OSError:
        pass


_compile_eaglepatch()


@pytest.hookimpl(hookwrapper=True)
def pytest_collection():
    """Bytecode written while collecting only (the test modules as pytest rewrites them, their helpers): each xdist
    worker otherwise rewrote every test module again (~9 s of CPU each). Not while the tests run: a test that
    imports from a folder of its own leaves no ``__pycache__`` there."""
    was = sys.dont_write_bytecode
    sys.dont_write_bytecode = False
    try:
        yield
    finally:
        sys.dont_write_bytecode = was



@pytest.fixture(scope="session", autouse=True)
def _client_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The client's cache (``$XDG_CACHE_HOME``: fetched logs, sweeps, the transform's results) in a folder of this
    test session, never the user's ``~/.cache``; a test that needs its own sets its own."""
    import os

    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("client-cache"))


@pytest.fixture(scope="session", autouse=True)
def eaglepatch_state_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """eaglepatch's folder on the host (``EAGLEPATCH_STATE_DIR``: a relaunched server's log, its start script, the
    port's relaunch lock) in a folder of this test session, never the shared /tmp/eaglepatch: set here for the CLI
    and the host side run locally, and by the e2e sshd (``SetEnv``) for its logins."""
    import os

    folder = str(tmp_path_factory.mktemp("eaglepatch-state"))
    os.chmod(folder, 0o700)
    os.environ["EAGLEPATCH_STATE_DIR"] = folder
    return folder


@pytest.fixture(scope="session")
def recipe() -> Recipe:
    """The built-in recipe."""
    from eaglepatch.transform.recipe import builtin_recipe

    return builtin_recipe()


@pytest.fixture(scope="session")
def sglang_release() -> Callable[[str], Path]:
    """``(version) -> site folder`` of a pinned release, downloaded into the test cache on first use."""
    return sglang_releases.release_site_or_fail


@pytest.fixture(autouse=True)
def _sigint_not_ignored() -> None:
    """An ignored SIGINT stays ignored across exec: every CLI a test starts would then ignore the Ctrl-C that the
    interrupt tests send it (their failpoints' SIGINT), as no user's terminal does. This process may have been
    started so (a background job of a non-interactive shell), or code run in it may have left it so; a handler of
    this process's own is reset to the default in each child at exec."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
