"""The transform (libcst, the largest import) is imported only by what needs it: not by the CLI itself, not by a
revert whose files the manifest vouches for; apply and the other commands import it on a thread of their own while
the facts round trip waits on the host."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from transform_cases import V1_BEFORE


def _run(code: str, env: dict | None = None) -> dict:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120,
                         env=None if env is None else {**os.environ, **env})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _tree(root: Path) -> Path:
    spec = root / "sglang" / "srt" / "speculative"
    spec.mkdir(parents=True)
    (root / "sglang" / "__init__.py").write_text('__version__ = "0.0.1"\n')
    (spec / "eagle_worker.py").write_text(V1_BEFORE)
    return root / "sglang"


def test_the_cli_itself_does_not_import_libcst():
    assert _run("""
        import json, sys
        import eaglepatch.cli
        print(json.dumps({"libcst": "libcst" in sys.modules}))
    """) == {"libcst": False}


def test_the_transforms_light_modules_do_not_import_libcst():
    """What callers name without running the transform (the result types in type hints, the marks revert strips
    by, the output check, the recipes) is the standard library's; only engine (through finder and tree) pulls
    in libcst."""
    assert _run("""
        import json, sys
        from eaglepatch.transform import check, marks, recipe, results
        light = "libcst" in sys.modules
        from eaglepatch.transform import engine
        print(json.dumps({"light": light, "engine": "libcst" in sys.modules}))
    """) == {"light": False, "engine": True}


def test_apply_imports_it_on_its_own_thread_and_revert_not_at_all(tmp_path):
    """A client whose cache holds no result of this transform: apply imports it on a thread while the facts round
    trip waits; revert never. Then the same release applied again (a tuning loop): every result is in the cache,
    and the transform is neither preloaded nor imported."""
    pkg = _tree(tmp_path)
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    original = (pkg / "srt" / "speculative" / "eagle_worker.py").read_bytes()
    code = """
        import json, sys, threading
        from eaglepatch.ops import change, options, target
        from eaglepatch.transform.recipe import builtin_recipe
        loaders = []
        _start = threading.Thread.start
        def start(self):
            if self.name == "eaglepatch-import-transform":
                loaders.append(self)
            return _start(self)
        threading.Thread.start = start
        c = target.Connect()
        say = lambda m: None
        doc = getattr(change, %r)(target.target_spec(%r, c), c, builtin_recipe(), *%s, say)
        print(json.dumps({"changed": doc["changed"], "libcst": "libcst" in sys.modules, "loaders": len(loaders)}))
    """
    applied = _run(code % ("apply", str(pkg), "[options.RuntimeOptions(), None, False]"), env)
    assert applied == {"changed": True, "libcst": True, "loaders": 1}
    patched = (pkg / "srt" / "speculative" / "eagle_worker.py").read_bytes()
    assert patched != original
    reverted = _run(code % ("revert", str(pkg), "[False, None]"), env)
    assert reverted == {"changed": True, "libcst": False, "loaders": 0}
    assert (pkg / "srt" / "speculative" / "eagle_worker.py").read_bytes() == original
    again = _run(code % ("apply", str(pkg), "[options.RuntimeOptions(), None, False]"), env)
    assert again == {"changed": True, "libcst": False, "loaders": 0}
    assert (pkg / "srt" / "speculative" / "eagle_worker.py").read_bytes() == patched
    assert _run(code % ("revert", str(pkg), "[False, None]"), env)["changed"]
    off = _run(code % ("apply", str(pkg), "[options.RuntimeOptions(), None, False]"),
               {**env, "EAGLEPATCH_TRANSFORM_CACHE": "0"})
    assert off == {"changed": True, "libcst": True, "loaders": 1}  # the cache turned off: no hits to expect


def test_preload_then_use_imports_once():
    doc = _run("""
        import json, sys, threading
        from eaglepatch.ops import lazy_engine
        lazy_engine.preload_transform()
        names = [t.name for t in threading.enumerate()]
        engine = lazy_engine.engine()  # waits for the import in flight, if it is not done
        print(json.dumps({"thread": "eaglepatch-import-transform" in names or "libcst" in sys.modules,
                          "engine": engine.__name__}))
    """)
    assert doc["thread"] and doc["engine"] == "eaglepatch.transform.engine"
