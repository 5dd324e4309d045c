"""The helper program shipped to the host: it must run on the host's own interpreter (3.8+), stdlib only."""

from __future__ import annotations

import ast
import sys

from eaglepatch.hosts.local import LocalHost
from eaglepatch.server import _remote
from eaglepatch.server.process import call_remote, remote_program


def test_the_helper_program_parses_as_python_3_8_and_imports_only_the_standard_library():
    tree = ast.parse(remote_program(), feature_version=(3, 8))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported - set(sys.stdlib_module_names)


def test_log_tail_reads_only_after_the_offset_splits_progress_bars_and_drops_our_own_polls(tmp_path):
    log = tmp_path / "server.log"
    old = b"old run line\n"
    log.write_bytes(
        old
        + b"Loading safetensors 10%\rLoading safetensors 50%\r"
        + b'INFO:     127.0.0.1:5555 - "GET /health_generate HTTP/1.1" 503 Service Unavailable\n'
        + b"\n"
        + b"Capture cuda graph bs [1, 2]\n"
        + b'INFO:     127.0.0.1:5555 - "GET /health HTTP/1.1" 503\n'
    )
    assert _remote._tail_lines(str(log), len(old), 30) == [
        "Loading safetensors 10%",
        "Loading safetensors 50%",
        "Capture cuda graph bs [1, 2]",
    ]
    assert _remote._tail_lines(str(log), len(old), 1) == ["Capture cuda graph bs [1, 2]"]
    assert _remote._tail_lines(str(log), 10_000, 2) == ["Loading safetensors 50%", "Capture cuda graph bs [1, 2]"]
    assert _remote._tail_lines(str(tmp_path / "missing.log"), 0, 5) is None


def test_the_helper_runs_through_run_python_on_this_machine(tmp_path):
    """One real round trip: the shipped source is what runs, with PAYLOAD from stdin."""
    (tmp_path / "log").write_text("a\nb\n")
    out = call_remote(LocalHost(), sys.executable, "tail", {"log_path": str(tmp_path / "log"), "lines": 1})
    assert out == {"lines": ["b"]}


def _top_level_names(source: str) -> set[str]:
    names = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def test_the_facts_program_built_on_this_one_overrides_none_of_its_names():
    """ops/_remote.py is appended to this file (eaglepatch.ops.hostcall.remote_program): a helper it defines under a
    name used here would silently replace ours (a shared ``_read`` that raises would break the /proc scan)."""
    from pathlib import Path

    ops = Path(_remote.__file__).parents[1] / "ops" / "_remote.py"
    if not ops.exists():
        return
    shared = _top_level_names(remote_program()) & _top_level_names(ops.read_text(encoding="utf-8"))
    assert shared == set(), f"defined in both server/_remote.py and ops/_remote.py: {sorted(shared)}"
    assert {"op_scan", "OPS", "main"} <= _top_level_names(remote_program())
