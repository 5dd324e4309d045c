"""The host-side package (``eaglepatch.hostside``) as one program for the agent to run on a host.

The agent's first frame is a program that defines ``main(payload)`` (``eaglepatch.hosts.agent``). ``program()`` makes
that program of the package without joining module texts: it carries the source of every module (a dict) and
installs an import finder for them on ``sys.meta_path``, ahead of every other, then imports
``eaglepatch.hostside.main`` and takes its ``main``. So the modules import each other on the host as they do here,
each compiled under its own file name (``eaglepatch/hostside/execute.py``: a traceback names the real file and line,
its source shown), and an eaglepatch installed on the host, or none, makes no difference.

Before it bundles a module, the bundler reads it (``ast``): Python 3.8, and imports of the standard library and the
package itself only, so that nothing can make the host need eaglepatch, sglang or any other package installed, or
a newer Python (``BundleError``); the verdict is kept per set of sources (``_check_once``).
"""

from __future__ import annotations

import ast
import functools
import hashlib
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
import sys
from importlib.machinery import ModuleSpec

_SOURCES = %s


class _Bundled:
    """eaglepatch's host-side modules, from the sources this program carries: the finder on ``sys.meta_path`` and
    their loader (importlib.machinery only: importlib.abc and importlib.util would cost the host some 10 ms)."""

    def find_spec(self, name, path=None, target=None):
        if name not in _SOURCES:
            return None
        return ModuleSpec(name, self, origin=self._file(name), is_package=_SOURCES[name][0])

    def _file(self, name):
        return name.replace(".", "/") + ("/__init__.py" if _SOURCES[name][0] else ".py")

    def get_source(self, name):  # for tracebacks (linecache)
        return _SOURCES[name][1]

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
    here = filename[:-3].replace("/", ".")  # the module's own name (a package's ends in .__init__)
    for node in _imports(tree.body):
        if isinstance(node, ast.Import):
            wanted = [a.name for a in node.names]
        elif not node.level:
            wanted = [node.module or ""]
        else:  # relative: resolved against the module's own package, which it must not leave
            base = here.split(".")[:-node.level]
            mod = ".".join(base + ([node.module] if node.module else []))
            if len(base) < len(package.split(".")) or not (mod == package or mod.startswith(package + ".")):
                raise BundleError(f"{filename}:{node.lineno}: imports {'.' * node.level}{node.module or ''}, "
                                  f"which leaves {package}: the host-side code must run where only Python is "
                                  "installed")
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
    name, each checked by ``check_module`` (``_check_once``); raises ``BundleError``."""
    root = pathlib.Path(importlib.import_module(package).__file__ or "").parent
    found: dict[str, tuple[bool, str]] = {}
    for path in sorted(root.rglob("*.py")):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (is_package, path.read_text(encoding="utf-8"))
    found = dict(sorted(found.items()))
    _check_once(root, package, found)
    return found


def _check_once(root: pathlib.Path, package: str, modules: dict[str, tuple[bool, str]]) -> None:
    """``check_module`` for every module, once for a given set of sources: the verdict is kept as an empty file in the
    package's ``__pycache__`` (where Python keeps its bytecode), named by a digest of the sources, of this file (the
    rules) and of the Python version (its standard library). So a command pays the hashing (well under 1 ms), not the
    parsing (some 15 ms of the client's CPU while the agent starts: 15-20 ms of an ``apply`` over SSH, measured);
    where the folder cannot be written (a read-only install), every process checks again."""
    digest = hashlib.sha256(pathlib.Path(__file__).read_bytes())
    digest.update(repr((sys.version_info[:2], package, modules)).encode("utf-8", "surrogatepass"))
    stamp = root / "__pycache__" / f"eaglepatch-bundle-checked-{digest.hexdigest()[:32]}"
    if stamp.exists():
        return
    for name, (is_package, text) in modules.items():
        check_module(text, _file(name, is_package), package)
    try:
        stamp.parent.mkdir(exist_ok=True)
        for old in stamp.parent.glob("eaglepatch-bundle-checked-*"):
            old.unlink()
        stamp.touch()
    except OSError:
        pass  # not ours to write: checked again next time


@functools.lru_cache(maxsize=None)
def program(package: str = PACKAGE, entry: str = ENTRY) -> str:
    """The host-side package as one program that defines ``main(payload)`` (the entry module's ``main``): the same
    text for the same sources, made once per process; raises ``BundleError``."""
    modules = sources(package)
    parts = package.split(".")
    for i in range(1, len(parts)):  # the packages above it, empty: never the ones installed on the host, if any
        modules.setdefault(".".join(parts[:i]), (True, ""))
    return _LOADER % (repr(dict(sorted(modules.items()))), entry)
