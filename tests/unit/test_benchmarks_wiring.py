"""The benchmarks reuse the end-to-end tests' sshd (tests/e2e/sshd_server.py) outside pytest: what they call of it
exists (a rename in the tests broke `make bench` once, with every test green)."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _bench_ssh():
    spec = importlib.util.spec_from_file_location("_bench_ssh_under_test", ROOT / "benchmarks" / "bench_ssh.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    try:
        spec.loader.exec_module(mod)
    finally:
        del sys.modules[spec.name]
    return mod


def test_the_benchmarks_find_every_sshd_helper_they_call():
    helpers = _bench_ssh().sshd_helpers()
    used = set()
    for script in sorted((ROOT / "benchmarks").glob("bench_*.py")):
        for node in ast.walk(ast.parse(script.read_text(encoding="utf-8"))):
            # c.X and self.c.X: the helpers module, as bench_ssh.Loopback names it
            if isinstance(node, ast.Attribute) and (
                    (isinstance(node.value, ast.Name) and node.value.id == "c")
                    or (isinstance(node.value, ast.Attribute) and node.value.attr == "c")):
                used.add(node.attr)
    called = {n for n in used if n not in ("returncode", "stderr", "stdout", "loader")}
    assert called and all(hasattr(helpers, n) for n in called), sorted(n for n in called if not hasattr(helpers, n))
