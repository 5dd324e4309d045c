"""The pinned sglang releases the tests check the transform against, fetched from PyPI into a local cache.

``release_site(version)`` returns a site-packages-like folder holding only what eaglepatch looks at:
``sglang/__init__.py``, ``sglang/version.py``, ``sglang/_version.py`` (from 0.5.10 ``version.py`` only reads the
version from there or from the installed metadata), ``sglang-<ver>.dist-info/METADATA`` (so ``importlib.metadata``
knows the version when the site is on ``sys.path``), ``sglang/srt/__init__.py`` if the wheel has one (no pinned
release does: ``sglang.srt`` and ``sglang.srt.speculative`` are namespace packages, and the site keeps that layout;
no ``__init__.py`` is invented), ``sglang/srt/speculative/**``, and ``sglang/srt/server_args.py`` with
``sglang/srt/arg_groups/**`` (the launch flags a release accepts: eaglepatch.server.flags). ``worker_files(version)`` lists the speculative worker modules in it.

The cache is ``$EAGLEPATCH_TEST_CACHE`` (``make`` sets ``<repo>/.cache``, git-ignored; else ``~/.cache/eaglepatch``): ``wheels/<ver>/`` holds the wheel
``pip download`` fetched, ``sites/<ver>/`` the extracted files. Both are made once per cache, under a per-release
file lock, and published by renaming a finished temporary folder, so concurrent pytest processes never see half
a site. sglang source is never committed: it only ever lives in the cache.

A release that cannot be fetched raises ``ReleaseUnavailable`` with pip's own words; the fixtures turn that into a
test FAILURE (CI has PyPI access), never a skip.
"""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path

# Oldest first. 0.4.1.post4 is the oldest release on PyPI with an EAGLE worker (0.4.1.post3 and older have no
# sglang/srt/speculative/eagle_worker.py); 0.5.23 is the newest release on PyPI when this list was last extended.
# Between 0.4.1.post4 and 0.4.6 each release where the worker's shape changes is pinned: 0.4.1.post5 (the decode
# draft extend renamed forward_draft_extend_after_decode; verify returns accept_length_cpu), 0.4.2.post2 (one
# self.draft(...) call instead of a loop of forward_draft_decode steps), 0.4.3.post3 (forward_target_extend: the
# first release whose prefill target forward the recipe times; no with blocks and no idle path yet).
PINNED = ["0.4.1.post4", "0.4.1.post5", "0.4.2.post2", "0.4.3.post3", "0.4.6", "0.4.10.post2", "0.5.3", "0.5.6",
          "0.5.10", "0.5.12", "0.5.16", "0.5.21", "0.5.23"]

REPO = Path(__file__).resolve().parent.parent
ENTRY_NAMES = ("forward_batch_generation", "forward_batch_speculative_generation")

# The download and the cache live in the package (make demo uses them too); the tests add what only they need.
from eaglepatch.releases import (  # noqa: E402, F401 (re-exported: tests use sglang_releases.<name>)
    ReleaseUnavailable,
    cache_dir,
    release_site,
    wheel_path,
)


def release_site_or_fail(version: str) -> Path:
    """``release_site(version)`` for a test: a download failure FAILS the calling test with pip's words."""
    try:
        return release_site(version)
    except ReleaseUnavailable as exc:
        import pytest

        pytest.fail(str(exc), pytrace=False)


def speculative_dir(version: str) -> Path:
    """``<site>/sglang/srt/speculative`` of ``version``."""
    return release_site(version) / "sglang" / "srt" / "speculative"


def _classes(path: Path) -> list[tuple[str, list[str], set[str]]]:
    """(class name, base names (last dotted part), method names) of the module's top-level classes."""
    tree = ast.parse(path.read_bytes(), filename=str(path))
    out = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            bases = []
            for b in node.bases:
                if isinstance(b, ast.Name):
                    bases.append(b.id)
                elif isinstance(b, ast.Attribute):
                    bases.append(b.attr)
            methods = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
            out.append((node.name, bases, methods))
    return out


@functools.lru_cache(maxsize=None)
def _worker_files(version: str) -> tuple[Path, ...]:
    spec = speculative_dir(version)
    files = sorted(p for p in spec.rglob("*.py") if p.is_file())
    info = {p: _classes(p) for p in files}
    workers: set[str] = set()  # class names that define or inherit an entry method
    chosen: set[Path] = set()
    for p, classes in info.items():
        for name, _bases, methods in classes:
            if methods & set(ENTRY_NAMES):
                workers.add(name)
                chosen.add(p)
    changed = True
    while changed:  # inheritance across files, to a fixed point (StandaloneWorker(EAGLEWorker), ...)
        changed = False
        for p, classes in info.items():
            for name, bases, _methods in classes:
                if name not in workers and workers.intersection(bases):
                    workers.add(name)
                    chosen.add(p)
                    changed = True
    return tuple(sorted(chosen))


def worker_files(version: str) -> list[Path]:
    """The .py files under the release's ``speculative/`` (recursively) that define a class with an entry method
    (``forward_batch_generation`` / ``forward_batch_speculative_generation``) or a class inheriting one."""
    return list(_worker_files(version))


def relpath(version: str, path: Path) -> str:
    """``path`` relative to the release's speculative folder, with ``/`` (e.g. ``dspark_components/x.py``)."""
    return path.relative_to(speculative_dir(version)).as_posix()


if __name__ == "__main__":  # fetch every pinned release (e.g. to warm a CI cache) and list its worker files
    for v in sys.argv[1:] or PINNED:
        print(v, release_site(v))
        for f in worker_files(v):
            print("   ", relpath(v, f))
