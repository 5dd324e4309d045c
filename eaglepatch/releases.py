"""Fetch a released sglang wheel from PyPI into a local cache and lay out the part eaglepatch reads.

``release_site(version)`` returns a site-packages-like folder holding ``sglang/__init__.py``, ``version.py``,
``_version.py``, the dist-info ``METADATA``, ``sglang/srt/speculative/**``, ``sglang/srt/server_args.py`` and
``sglang/srt/arg_groups/**`` (where the release has it) of that release: what ``make demo`` patches in its sandbox,
what the tests check the transform against, and where ``eaglepatch.server.flags`` reads the server's launch flags.
sglang's source only ever lives in the cache (``$EAGLEPATCH_TEST_CACHE``, else ``~/.cache/eaglepatch``); made once,
under a per-release file lock, published by renaming a finished temporary folder, so concurrent processes never see
half a site.

A site records the layout it was extracted with (``SITE_LAYOUT``, a line of its completion marker): a site of an
older layout (one extracted before the site kept server_args.py, say) is extracted again from the cached wheel, never
used with files missing.
"""

from __future__ import annotations

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

# What a site keeps from a wheel (paths inside the wheel).
_KEEP_FILES = (
    "sglang/__init__.py", "sglang/version.py", "sglang/_version.py", "sglang/srt/__init__.py",
    "sglang/srt/server_args.py",
)
_KEEP_TREES = ("sglang/srt/speculative/", "sglang/srt/arg_groups/")
# The files a site holds, as a number: raise it whenever _KEEP_FILES or _KEEP_TREES change, so that sites extracted
# before are extracted again. 1: __init__/version files, METADATA, speculative/**; 2: + server_args.py, arg_groups/**.
SITE_LAYOUT = 2
_COMPLETE = ".eaglepatch-site-complete"  # written last: the wheel's name, the count of files, "layout N"


def cache_dir() -> Path:
    """``$EAGLEPATCH_TEST_CACHE`` (``make`` sets it to the checkout's .cache), else ``~/.cache/eaglepatch``."""
    env = os.environ.get("EAGLEPATCH_TEST_CACHE")
    return Path(env).resolve() if env else Path.home() / ".cache" / "eaglepatch"


class ReleaseUnavailable(RuntimeError):
    """A pinned release could not be downloaded or its wheel is not what it should be."""


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


def _complete(site: Path) -> bool:
    """Whether ``site`` was finished with this ``SITE_LAYOUT`` (its marker's last line says ``layout N``)."""
    try:
        lines = (site / _COMPLETE).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return False
    return bool(lines) and lines[-1].strip() == f"layout {SITE_LAYOUT}"


@functools.lru_cache(maxsize=None)
def release_site(version: str) -> Path:
    """``<cache>/sites/<version>``, a site-packages-like folder with the release's speculative package and its
    server arguments (``server_args.py``, ``arg_groups/``).

    Idempotent and safe under concurrent processes; a site of an older ``SITE_LAYOUT`` is extracted again from the
    cached wheel. Raises ``ReleaseUnavailable`` when the wheel cannot be fetched or does not hold
    ``sglang/srt/speculative/`` and ``sglang/srt/server_args.py``.
    """
    site = cache_dir() / "sites" / version
    if _complete(site):
        return site
    whl = wheel_path(version)
    with _locked(f"site-{version}"):
        if _complete(site):
            return site
        site.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{version}-", dir=site.parent))
        old: Path | None = None
        try:
            with zipfile.ZipFile(whl) as z:
                kept = 0
                for info in z.infolist():
                    name = info.filename
                    if info.is_dir() or not _safe_member(name):
                        continue
                    if (
                        name in _KEEP_FILES
                        or any(name.startswith(tree) and len(name) > len(tree) for tree in _KEEP_TREES)
                        or re.fullmatch(r"sglang-[^/]+\.dist-info/METADATA", name)
                    ):
                        dest = tmp.joinpath(*name.split("/"))
                        dest.parent.mkdir(parents=True, exist_ok=True)
                        with z.open(info) as src, open(dest, "wb") as out:
                            shutil.copyfileobj(src, out)
                        kept += 1
            if not (tmp / "sglang" / "srt" / "speculative").is_dir():
                raise ReleaseUnavailable(f"sglang=={version}: {whl.name} holds no sglang/srt/speculative/")
            if not (tmp / "sglang" / "srt" / "server_args.py").is_file():
                raise ReleaseUnavailable(f"sglang=={version}: {whl.name} holds no sglang/srt/server_args.py")
            got = _wheel_version(tmp)
            if got != version:
                raise ReleaseUnavailable(f"sglang=={version}: {whl.name} says it is version {got!r}")
            (tmp / _COMPLETE).write_text(f"{whl.name}\n{kept} files\nlayout {SITE_LAYOUT}\n")
            # A site without this layout's marker (half made by a killed run, or of an older layout): move it aside
            # by renaming, publish the new one by renaming, then delete the old one.
            if site.exists():
                old = Path(tempfile.mkdtemp(prefix=f".old-{version}-", dir=site.parent))
                os.rename(site, old / "site")
            os.rename(tmp, site)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
    return site
