"""The host-side package (``eaglepatch.hostside``) as one program for the agent to run on a host.

The agent's first frame is a program that defines ``main(payload)`` (``eaglepatch.hosts.agent``). ``program()`` makes
that program of the package without joining module texts: it carries the source of every module (a dict) and
installs an import finder for them on ``sys.meta_path``, ahead of every other, then imports
``eaglepatch.hostside.main`` and takes its ``main``. So the modules import each other on the host as they do here,
each compiled under its own file name (``eaglepatch/hostside/execute.py``: a traceback names the real file and line,
its source shown), and an eaglepatch installed on the host, or none, makes no difference.

Before it bundles a module, the bundler reads it (``ast``): Python 3.8, and imports of the standard library and the
package itself only, so that nothing can make the host need eaglepatch, sglang or any other package installed, or
a newer Python (``BundleError``).
"""

from __future__ import annotations

import ast
import functools
import importlib
import pathlib
import sys
from typing import Iterator

PACKAGE = "eaglepatch.hostside"
ENTRY = "eaglepatch.hostside.main"

# What runs on the host before anything else of eaglepatch's: Python 3.8+, standard library only. The first ``%s``
# is the modules: {module name: (is a package, source)}, the packages above the bundled one included (empty); the
# second, the module whose ``main`` the program defines. (The sources go as they are: the agent compresses the
# program's frame, and compressing them here as well would cost the client more than it saves on the wire.)
_LOADER = '''\
import importlib.abc, importlib.util, sys
_SOURCES = %s
_PACKAGES = {n for n, s in _SOURCES.items() if s[0]}


class _Bundled(importlib.abc.MetaPathFinder, importlib.abc.InspectLoader):
    """eaglepatch's host-side modules, from the sources this program carries."""

    def find_spec(self, name, path=None, target=None):
        if name not in _SOURCES:
            return None
        return importlib.util.spec_from_loader(name, self, origin=self._file(name), is_package=name in _PACKAGES)

    def _file(self, name):
        return name.replace(".", "/") + ("/__init__.py" if name in _PACKAGES else ".py")

    def get_source(self, name):
        return _SOURCES[name][1]

    def is_package(self, name):
        return name in _PACKAGES

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module.__file__ = self._file(module.__name__)
        exec(compile(self.get_source(module.__name__), module.__file__, "exec", dont_inherit=True), module.__dict__)


sys.meta_path.insert(0, _Bundled())
from %s import main
'''


class BundleError(Exception):
    """A module of the host-side package that the host could not run as it is: it imports what the host may not
    have, or needs a Python newer than 3.8; ``str()`` names the file, the line and why."""


def check_module(source: str, filename: str, package: str = PACKAGE) -> None:
    """Raise ``BundleError`` when the module in ``source`` is not Python 3.8, or imports anything but the standard
    library and ``package``'s own modules (a relative import stays inside it; an absolute one must name it or a
    module of the standard library). Imports inside functions count as well."""
    try:
        tree = ast.parse(source, filename, feature_version=(3, 8))
    except SyntaxError as exc:
        raise BundleError(f"{filename}:{exc.lineno}: not Python 3.8: {exc.msg}") from None
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    for node in _imports(tree.body):
        if isinstance(node, ast.Import):
            wanted = [a.name for a in node.names]
        elif not node.level:
            wanted = [node.module or ""]
        else:
            continue
        for mod in wanted:
            if mod != package and not mod.startswith(package + ".") and mod.split(".")[0] not in stdlib:
                raise BundleError(f"{filename}:{node.lineno}: imports {mod}, which is neither the standard library "
                                  f"nor {package}: the host-side code must run where only Python is installed")


def _imports(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements in ``body`` and in every block nested in it (functions, classes, if, try, with...).
    Statements only: an import is never an expression, and not walking the expressions halves the check's time."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            inner = getattr(node, field, None)
            if isinstance(inner, list):
                yield from _imports(inner)


def _file(name: str, is_package: bool) -> str:
    return name.replace(".", "/") + ("/__init__.py" if is_package else ".py")


def sources(package: str = PACKAGE) -> dict[str, tuple[bool, str]]:
    """Every module of ``package`` (its folder and subfolders): module name -> (is a package, source), sorted by
    name, each checked by ``check_module``; raises ``BundleError``."""
    root = pathlib.Path(importlib.import_module(package).__file__ or "").parent
    found: dict[str, tuple[bool, str]] = {}
    for path in sorted(root.rglob("*.py")):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        is_package = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if is_package else parts)
        text = path.read_text(encoding="utf-8")
        check_module(text, _file(name, is_package), package)
        found[name] = (is_package, text)
    return dict(sorted(found.items()))


@functools.lru_cache(maxsize=None)
def program(package: str = PACKAGE, entry: str = ENTRY) -> str:
    """The host-side package as one program that defines ``main(payload)`` (the entry module's ``main``): the same
    text for the same sources, made once per process; raises ``BundleError``."""
    modules = sources(package)
    parts = package.split(".")
    for i in range(1, len(parts)):  # the packages above it, empty: never the ones installed on the host, if any
        modules.setdefault(".".join(parts[:i]), (True, ""))
    return _LOADER % (repr(dict(sorted(modules.items()))), entry)
