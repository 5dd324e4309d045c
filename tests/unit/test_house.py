"""The house rules of eaglepatch's code (docs/design.md, "Layers"), read off the source with ``ast``: every module
of one concern and at most 600 lines (the runtime module, copied whole next to the worker, excepted), imports that
only point down the layers, no circle between modules (imports inside functions count), no private name imported
from another package, no name a module uses without defining it (``noqa: F821``), and host-side code that needs
nothing but the standard library. Each test names the module and line that breaks its rule."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "eaglepatch"
RUNTIME = ROOT / "runtime" / "_eaglepatch_runtime.py"
MAX_LINES = 600

# The layers, bottom to top: a module may import from its own layer's packages and the ones below, never above.
LAYERS = [
    {"errors", "failpoints", "redact", "progress", "console", "cache", "collector", "runtime", "hostside", "releases",
     ""},
    {"transform", "report", "hosts"},
    {"server"},
    {"ops"},
    {"tuning", "doctor"},
    {"cli", "cli_options", "cli_output", "entry", "demo", "__main__"},
]


def _name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_name(p): p for p in sorted(ROOT.rglob("*.py"))}
TREES = {name: ast.parse(path.read_text(encoding="utf-8"), str(path)) for name, path in MODULES.items()}


def _package(module: str) -> str:
    """The top package under eaglepatch (``"ops"`` for eaglepatch.ops.facts; ``""`` for eaglepatch itself)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _layer(module: str) -> int:
    pkg = _package(module)
    for i, names in enumerate(LAYERS):
        if pkg in names:
            return i
    raise AssertionError(f"{module}: its package {pkg!r} is in no layer of this test (add it to LAYERS)")


def _resolve(importer: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = importer.split(".")
    is_pkg = MODULES[importer].name == "__init__.py"
    base = base[: len(base) - node.level + (1 if is_pkg else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str) -> list[tuple[str, int, list[str]]]:
    """(imported eaglepatch module, line, names taken from it) for every import in ``module``, nested ones too."""
    out = []
    for node in ast.walk(TREES[module]):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno, []) for a in node.names if a.name.split(".")[0] == "eaglepatch"]
        elif isinstance(node, ast.ImportFrom):
            mod = _resolve(module, node)
            if mod.split(".")[0] != "eaglepatch":
                continue
            for a in node.names:  # "from eaglepatch.x import y": y may be a module of its own
                sub = f"{mod}.{a.name}"
                if sub in MODULES:
                    out.append((sub, node.lineno, []))
                else:
                    out.append((mod, node.lineno, [a.name]))
    return [(m, line, names) for m, line, names in out if m in MODULES]


def test_every_module_is_at_most_600_lines():
    long = {name: n for name, p in MODULES.items() if p != RUNTIME
            and (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert long == {}, f"modules over {MAX_LINES} lines: {long}"


def test_every_module_says_what_it_is_for():
    bare = [name for name, tree in TREES.items() if not ast.get_docstring(tree) and MODULES[name].stat().st_size]
    assert bare == []


def test_imports_point_down_the_layers():
    up = [f"{m} ({_package(m)!r}, layer {_layer(m)}) line {line} imports {target} (layer {_layer(target)})"
          for m in MODULES for target, line, _ in _imports(m) if _layer(target) > _layer(m)]
    assert up == []


def test_no_circle_between_modules():
    graph = {m: {t for t, _, _ in _imports(m) if t != m} for m in MODULES}
    # a package's __init__ is imported with any module below it; its own imports of its modules are not a circle
    for m in graph:
        graph[m] = {t for t in graph[m] if not m.startswith(t + ".")}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    circles: list[list[str]] = []
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10000))

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert circles == []


def test_no_circle_between_packages():
    edges = {(_package(m), _package(t)) for m in MODULES for t, _, _ in _imports(m) if _package(m) != _package(t)}
    both = sorted((a, b) for a, b in edges if (b, a) in edges and a < b)
    assert both == [], f"packages that import each other: {both}"


def test_no_private_name_crosses_a_package():
    bad = []
    for m in MODULES:
        modules_bound: dict[str, str] = {}
        for node in ast.walk(TREES[m]):
            if isinstance(node, ast.ImportFrom) and (mod := _resolve(m, node)).startswith("eaglepatch"):
                for a in node.names:
                    target = f"{mod}.{a.name}" if f"{mod}.{a.name}" in MODULES else mod
                    if target in MODULES and _package(target) != _package(m):
                        if a.name.startswith("_") and not a.name.startswith("__"):
                            bad.append(f"{m} line {node.lineno}: from {mod} import {a.name}")
                        if target != mod:
                            modules_bound[a.asname or a.name] = target
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname and a.name in MODULES and _package(a.name) != _package(m):
                        modules_bound[a.asname] = a.name
        for node in ast.walk(TREES[m]):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in modules_bound and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                bad.append(f"{m} line {node.lineno}: {node.value.id}.{node.attr} ({modules_bound[node.value.id]})")
    assert bad == []


def test_no_module_uses_a_name_it_never_defines():
    marked = [f"{name} line {i}" for name, p in MODULES.items()
              for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if "noqa: F821" in line]
    assert marked == []


def test_host_side_code_needs_only_the_standard_library():
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    bad = []
    for m in (m for m in MODULES if _package(m) == "hostside"):
        for node in ast.walk(TREES[m]):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [_resolve(m, node)] if isinstance(node, ast.ImportFrom) else [])
            bad += [f"{m} line {node.lineno}: {n}" for n in names
                    if not n.startswith("eaglepatch.hostside") and n.split(".")[0] not in stdlib]
    assert bad == []


@pytest.mark.parametrize("rule", ["layers", "circle"])
def test_the_rules_catch_what_they_name(rule, monkeypatch):
    """Each rule fails on a module made to break it (the rules are not vacuous)."""
    if rule == "layers":
        tree = ast.parse("from eaglepatch.cli import app\n")
        monkeypatch.setitem(TREES, "eaglepatch.errors", tree)
        with pytest.raises(AssertionError, match="eaglepatch.errors .* imports eaglepatch.cli"):
            test_imports_point_down_the_layers()
    else:
        monkeypatch.setitem(TREES, "eaglepatch.errors", ast.parse("import eaglepatch.failpoints\n"))
        monkeypatch.setitem(TREES, "eaglepatch.failpoints", ast.parse("import eaglepatch.errors\n"))
        with pytest.raises(AssertionError, match="eaglepatch.errors"):
            test_no_circle_between_modules()


def test_every_package_is_installed():
    """pyproject.toml lists the packages to install one by one: a new folder missing there works from a checkout (an
    editable install) and is absent from a real install (``pipx install .``)."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    listed = set(tomllib.loads((ROOT.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {_name(p) for p in ROOT.rglob("__init__.py")}
    assert folders - listed == set() and listed - folders == {"eaglepatch.patches"}


# What the pure core may not import: it starts no process, waits on no descriptor, handles no signal and opens no
# connection (a child process, as the report's while it fetches, lives in ops/).
EFFECTS = {"subprocess", "select", "selectors", "signal", "socket", "multiprocessing", "threading", "paramiko"}
PURE = {"transform", "report"}


def _effects(module: str) -> list[str]:
    out = []
    for node in ast.walk(TREES[module]):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
        out += [f"{module} line {node.lineno}: {n}" for n in names if n.split(".")[0] in EFFECTS]
    return out


def test_the_pure_core_starts_no_process_and_opens_no_connection(monkeypatch):
    assert [bad for m in MODULES if _package(m) in PURE for bad in _effects(m)] == []
    # and the rule is not vacuous: a report module that starts a process breaks it
    monkeypatch.setitem(TREES, "eaglepatch.report.stats", ast.parse("import subprocess\n"))
    assert _effects("eaglepatch.report.stats") == ["eaglepatch.report.stats line 1: subprocess"]
