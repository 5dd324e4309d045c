"""Fixtures of the unit tests of the timing runtime (eaglepatch/runtime/_eaglepatch_runtime.py, test_runtime*.py).

- ``clean_env``: no EAGLEPATCH_ variable in the environment for the test.
- ``load``: ``load(**configure_kw)`` -> a fresh runtime writing to ``tmp_path/logs``: the cpu timer, no summaries,
  no time-based flush, no free-space floor (``min_free_mb`` 0) unless asked for; its writer thread stopped after
  the test.
- ``rt``: ``load()``.
- ``logs``: ``tmp_path/logs``, where ``load``'s runtimes write (made by the runtime, not by the fixture).
- ``fake_torch``: a fake ``torch`` (torch_fakes.py) in ``sys.modules`` for the test; CUDA events complete when the
  test says so (``fake_torch.cuda.done``).

Plain helpers (loading the runtime, reading its logs back, fake workers) are in runtime_helpers.py; the fixtures
that one behaviour's tests alone use stay in their module. The fixtures shared by every test layer (``recipe``,
``sglang_release``) are in tests/conftest.py.
"""
import os
import sys

import pytest

from runtime_helpers import load_module
from torch_fakes import fake_torch_module


@pytest.fixture
def clean_env(monkeypatch):
    for key in list(os.environ):
        if key.startswith("EAGLEPATCH_"):
            monkeypatch.delenv(key)


@pytest.fixture
def load(tmp_path, clean_env):
    """load(**configure_kw) -> a fresh runtime writing to tmp_path/logs; cpu timer, no summaries, no time-based
    flush unless asked for."""
    loaded = []

    def _load(**kw):
        mod = load_module()
        kw.setdefault("mode", "cpu")               # the same on any machine; CUDA timers are asked for by name
        kw.setdefault("log_dir", str(tmp_path / "logs"))
        kw.setdefault("summary_every", 0)
        kw.setdefault("flush_seconds", 600.0)
        kw.setdefault("min_free_mb", 0)            # whatever this machine's disk holds (test_runtime_bounds.py)
        mod.configure(**kw)
        loaded.append(mod)
        return mod

    yield _load
    for mod in loaded:
        mod._stop_flusher()


@pytest.fixture
def rt(load):
    return load()


@pytest.fixture
def logs(tmp_path):
    return tmp_path / "logs"


@pytest.fixture
def fake_torch(monkeypatch):
    torch = fake_torch_module()
    monkeypatch.setitem(sys.modules, "torch", torch)
    return torch


@pytest.fixture(params=["msgspec", "json"])
def both_parsers(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The test runs with both of the report's parsers (msgspec's fast path, and the standard library's line loop
    alone): the records, the skipped lines and the result must not depend on which one ran. A module takes it for
    every test with ``pytestmark = pytest.mark.usefixtures("both_parsers")``."""
    if request.param == "json":
        monkeypatch.setenv("EAGLEPATCH_JSON_PARSER", "json")
    else:
        pytest.importorskip("msgspec")
        monkeypatch.delenv("EAGLEPATCH_JSON_PARSER", raising=False)
    return request.param
