"""Fixtures shared by every test layer.

- ``recipe``: the built-in recipe (``patches/*.toml``), loaded once.
- ``sglang_release``: a function ``(version) -> Path`` giving the cached site of a pinned sglang release
  (``tests/sglang_releases.py``); a release that cannot be downloaded FAILS the test with pip's message.

``tests/`` is put on ``sys.path`` so that test modules in any layer can ``import sglang_releases``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

import pytest

_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

import sglang_releases  # noqa: E402

from eaglepatch.transform.recipe import Recipe, builtin_recipe  # noqa: E402


@pytest.fixture(scope="session")
def recipe() -> Recipe:
    """The built-in recipe."""
    return builtin_recipe()


@pytest.fixture(scope="session")
def sglang_release() -> Callable[[str], Path]:
    """``(version) -> site folder`` of a pinned release, downloaded into the test cache on first use."""
    return sglang_releases.release_site_or_fail
