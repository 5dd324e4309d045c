"""eaglepatch.server.flags on the server arguments of every pinned sglang release (downloaded into the cache).

For each release: the parse finds the flags a sweep cares about (the speculative ones, ``--port``, ``--tp-size`` and
its ``--tensor-parallel-size`` spelling, ``--disable-cuda-graph`` without a value) and not a misspelt one; and it
equals, option for option, the parser sglang itself builds: ``ServerArgs.add_cli_args`` run on a real
``argparse.ArgumentParser`` in a child process, from the release's own server_args.py and arg_groups/, every other
import (torch, sglang's other modules) replaced by a stub. 0.5.21+ build ``ServerArgs`` with msgspec, which the test
environment lacks: there that comparison is skipped; it was run by hand with msgspec installed (all equal).

And the release cache: a site extracted with an older layout (without server_args.py) is extracted again.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import sglang_releases
from eaglepatch import releases
from eaglepatch.server.flags import ServerFlags, resolve_server_flags

pytestmark = pytest.mark.real

SPECULATIVE = ("speculative-algorithm", "speculative-num-steps", "speculative-eagle-topk",
               "speculative-num-draft-tokens", "speculative-draft-model-path")
# Checked by hand: 0.4.6 has 124 add_argument calls, 4 of them with a second spelling (tp, dp, ep sizes and
# --nccl-init-addr): 128 options. 0.5.16's ServerArgs has 440 A[...] fields (dcp_size is annotated twice), 7 of them
# no_cli, 13 alias strings, 3 BooleanOptionalAction (--no-x forms) and 27 explicit add_argument calls: 476 options.
LOWER_BOUND_OLD = 90  # every release (0.4.1.post4, the oldest pinned, has 91)
LOWER_BOUND_NEW = 450  # 0.5.16 on (the dataclass releases)


def _parse(site: Path) -> ServerFlags:
    def read(rel: str) -> str | None:
        path = site / rel
        return path.read_text(encoding="utf-8") if path.is_file() else None

    flags = resolve_server_flags(read)
    assert flags is not None, f"{site}: no ServerArgs parsed"
    assert flags.complete, f"{site}: modules not in the site: {flags.missing}"
    return flags


def _is_new(version: str) -> bool:
    return tuple(int(x) for x in version.split(".")[:3]) >= (0, 5, 16)


@pytest.mark.parametrize("version", sglang_releases.PINNED)
def test_parse_finds_the_flags_a_sweep_uses(sglang_release, version):
    """The speculative flags, --port, --tp-size (with --tensor-parallel-size naming the same option),
    --disable-cuda-graph taking no value; not --speculative-num-stepz; and a plausible count."""
    flags = _parse(sglang_release(version))
    print(f"sglang {version}: {len(flags)} option strings ({flags.style}), {len(flags.no_value)} without a value, "
          f"{len(flags.aliases)} aliases")
    for name in SPECULATIVE + ("port", "tp-size", "disable-cuda-graph"):
        assert name in flags, f"{version}: --{name} not found"
    assert flags.canonical("tp-size") == flags.canonical("tensor-parallel-size")
    if not version.startswith("0.4."):  # the short spelling came in 0.5
        assert flags.canonical("speculative-draft-model") == "speculative-draft-model-path"
    assert not flags.takes_value("disable-cuda-graph")
    for name in ("port", "speculative-num-steps", "speculative-eagle-topk", "tp-size"):
        assert flags.takes_value(name), name
    assert "speculative-num-stepz" not in flags
    assert flags.suggest("speculative-num-stepz") == "speculative-num-steps"
    assert not flags.unread, f"{version}: option strings the parse could not read: {flags.unread}"
    assert len(flags) >= LOWER_BOUND_OLD
    if _is_new(version):
        assert flags.style in ("dataclass", "namespaces")
        assert len(flags) >= LOWER_BOUND_NEW


# The child process: import the release's server_args.py for real (and arg_groups/), every module the site lacks
# and the environment cannot import replaced by a stub whose attributes are MagicMocks, then print what argparse
# knows: option string -> [nargs, primary option string].
_ARGPARSE_PROBE = r'''
import argparse, importlib.abc, importlib.machinery, json, sys, types
from unittest import mock

site = sys.argv[1]
REAL = ("sglang.srt.server_args", "sglang.srt.arg_groups")


class Stub(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = mock.MagicMock(name=f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname in ("sglang", "sglang.srt"):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        if fullname.startswith(REAL):
            return None
        top = fullname.split(".")[0]
        if top in sys.stdlib_module_names:
            return None
        if top != "sglang" and importlib.machinery.PathFinder.find_spec(top) is not None:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        module = Stub(spec.name)
        module.__path__ = [site + "/" + spec.name.replace(".", "/")] if spec.name in ("sglang", "sglang.srt") else []
        return module

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, Finder())
import sglang.srt.server_args as server_args

parser = argparse.ArgumentParser()
server_args.ServerArgs.add_cli_args(parser)
print(json.dumps({o: [a.nargs, a.option_strings[0]] for a in parser._actions for o in a.option_strings}))
'''


@pytest.mark.parametrize("version", sglang_releases.PINNED)
def test_parse_equals_sglangs_own_argparse(sglang_release, version):
    """Names, value-less options and aliases are exactly what the release's add_cli_args gives argparse."""
    site = sglang_release(version)
    source = (site / "sglang" / "srt" / "server_args.py").read_text(encoding="utf-8")
    if "import msgspec" in source and importlib.util.find_spec("msgspec") is None:
        pytest.skip(f"sglang {version} builds ServerArgs with msgspec, not installed here (compared by hand)")
    proc = subprocess.run([sys.executable, "-c", _ARGPARSE_PROBE, str(site)], capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    actions = {k[2:]: (nargs, primary[2:]) for k, (nargs, primary) in json.loads(proc.stdout).items()
               if k.startswith("--") and k != "--help"}
    flags = _parse(site)
    assert flags.names == set(actions)
    assert flags.no_value == {k for k, (nargs, _) in actions.items() if nargs == 0}
    aliases = {k: p for k, (_, p) in actions.items() if k != p and flags.negations.get(k) != p}
    assert dict(flags.aliases) == aliases
    assert set(flags.negations) == {k for k, (_, p) in actions.items() if k == f"no-{p}"}


def test_an_old_layout_site_is_extracted_again(tmp_path, monkeypatch, sglang_release):
    """A site finished by an older layout (its marker without this layout's line, no server_args.py) is extracted
    again from the cached wheel when asked for; a current one is reused as it is."""
    version = sglang_releases.PINNED[0]
    sglang_release(version)
    wheel = sglang_releases.wheel_path(version)
    cache = tmp_path / "cache"
    (cache / "wheels" / version).mkdir(parents=True)
    shutil.copy(wheel, cache / "wheels" / version / wheel.name)
    monkeypatch.setenv("EAGLEPATCH_TEST_CACHE", str(cache))
    releases.release_site.cache_clear()
    try:
        site = releases.release_site(version)
        marker = site / ".eaglepatch-site-complete"
        assert marker.read_text().splitlines()[-1] == f"layout {releases.SITE_LAYOUT}"
        (site / "sglang" / "srt" / "server_args.py").unlink()
        shutil.rmtree(site / "sglang" / "srt" / "speculative" / "__pycache__", ignore_errors=True)
        marker.write_text(f"{wheel.name}\n12 files\n")  # what layout 1 wrote
        releases.release_site.cache_clear()
        assert releases.release_site(version) == site
        assert (site / "sglang" / "srt" / "server_args.py").is_file()
        assert marker.read_text().splitlines()[-1] == f"layout {releases.SITE_LAYOUT}"
        assert sorted(p.name for p in (cache / "sites").iterdir()) == [version]  # nothing left aside
        before = marker.stat().st_mtime_ns
        releases.release_site.cache_clear()
        assert releases.release_site(version) == site
        assert marker.stat().st_mtime_ns == before
    finally:
        releases.release_site.cache_clear()
