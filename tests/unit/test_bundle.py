"""The bundler (eaglepatch/hosts/bundle.py): the host-side package as one program that runs where only Python is
installed, its modules importing each other for real, and nothing else let in."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from eaglepatch.hosts import bundle
from eaglepatch.hosts.bundle import BundleError, check_module

HOSTSIDE = Path(bundle.__file__).parents[1] / "hostside"


def run_bare(program: str, tail: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``program`` then ``tail`` in a fresh interpreter that has no eaglepatch: isolated (-I), without site-packages
    (-S: eaglepatch is installed in this venv), from an empty folder, with an empty environment."""
    code = "import importlib.util\nassert importlib.util.find_spec('eaglepatch') is None\n" + program + tail
    return subprocess.run([sys.executable, "-I", "-S", "-c", code], cwd=cwd, env={"PYTHONPATH": ""},
                          capture_output=True, text=True, timeout=60)


def test_the_bundle_answers_an_op_where_eaglepatch_is_not_installed(tmp_path):
    (tmp_path / "log").write_text("one\ntwo\n")
    ask = {"op": "tail", "log_path": str(tmp_path / "log"), "lines": 1}
    tail = f"import json\nprint(json.dumps(main({ask!r})))\n"
    out = run_bare(bundle.program(), tail, tmp_path)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"lines": ["two"]}


def test_every_module_of_the_package_is_in_the_bundle_and_imported_from_it(tmp_path):
    """Each file of eaglepatch/hostside/ is a module of the bundle; the ops of the dispatch table import them all,
    each under its own file name, from the bundle, not from a file on disk."""
    files = sorted(p.stem for p in HOSTSIDE.glob("*.py") if p.stem != "__init__")
    assert set(bundle.sources()) == {"eaglepatch.hostside"} | {"eaglepatch.hostside." + f for f in files}
    tail = ("import json, sys\nfrom eaglepatch.hostside.main import OPS, op\nfor name in OPS:\n    op(name)\n"
            "print(json.dumps({n: getattr(m, '__file__', None) for n, m in sys.modules.items() "
            "if n.startswith('eaglepatch')}))\n")
    out = run_bare(bundle.program(), tail, tmp_path)
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout)
    want = {"eaglepatch": "eaglepatch/__init__.py", "eaglepatch.hostside": "eaglepatch/hostside/__init__.py"}
    want.update({"eaglepatch.hostside." + f: f"eaglepatch/hostside/{f}.py" for f in files})
    assert loaded == want


def test_a_traceback_on_the_host_names_the_real_file_and_shows_its_line(tmp_path):
    tail = "import traceback\ntry:\n    main({'op': 'execute'})\nexcept KeyError:\n    print(traceback.format_exc())\n"
    out = run_bare(bundle.program(), tail, tmp_path)
    assert out.returncode == 0, out.stderr
    assert 'File "eaglepatch/hostside/execute.py", line' in out.stdout
    assert 'token = payload["token"]' in out.stdout  # the source line, from the bundle


def test_the_bundled_modules_win_over_an_eaglepatch_installed_on_the_host(tmp_path):
    """The client's own interpreter has eaglepatch installed (this venv): the program still runs the modules it
    carries, never those on disk (a host with an older eaglepatch installed must not mix the two)."""
    tail = "import sys\nprint(sys.modules['eaglepatch.hostside.main'].__file__, sys.modules['eaglepatch'].__file__)\n"
    out = subprocess.run([sys.executable, "-c", bundle.program() + tail], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["eaglepatch/hostside/main.py", "eaglepatch/__init__.py"]


def test_the_program_is_made_once_and_the_same_every_time():
    first = bundle.program()
    assert bundle.program() is first  # cached for the process
    bundle.program.cache_clear()
    try:
        assert bundle.program() == first  # deterministic: the same sources make the same text
    finally:
        bundle.program.cache_clear()
    # the sources travel as they are (the agent's frame compresses them): about the size of the package
    size = sum(len(p.read_text(encoding="utf-8")) for p in HOSTSIDE.glob("*.py"))
    assert size < len(first) < size * 1.3


def _package(root: Path, name: str, modules: dict[str, str]) -> str:
    pkg = root / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text('"""A package to bundle."""\n')
    for mod, text in modules.items():
        (pkg / f"{mod}.py").write_text(textwrap.dedent(text))
    return name


@pytest.fixture
def importable(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [n for n in sys.modules if n.startswith("bundled_")]:
        del sys.modules[name]


@pytest.mark.parametrize("line", [
    "import eaglepatch.errors",
    "from eaglepatch import progress",
    "from eaglepatch.hosts.base import Host",
    "import sglang",
    "import yaml, json",
])
def test_a_module_that_imports_what_the_host_may_not_have_is_refused(importable, line):
    """Anything but the standard library and the package itself: refused with the file and line, even an import
    inside a function (run only on some request, it would fail only on a host)."""
    name = _package(importable, "bundled_bad", {
        "main": "import os\n\ndef main(payload):\n    return helper.x(payload)\n",
        "helper": f"import json\n\n\ndef x(payload):\n    {line}\n    return payload\n",
    })
    with pytest.raises(BundleError) as refused:
        bundle.sources(name)
    assert "bundled_bad/helper.py:5: imports" in str(refused.value)
    assert "neither the standard library nor bundled_bad" in str(refused.value)


def test_an_import_deep_in_blocks_is_found():
    """Inside a class, a method, an if, a loop's else, a try's handler or its finally: each import is read."""
    text = textwrap.dedent("""\
        import os


        class C:
            def f(self):
                if os.name:
                    for _ in ():
                        pass
                    else:
                        try:
                            pass
                        except Exception:
                            with open(os.devnull):
                                while False:
                                    pass
                        finally:
                            import {}
        """)
    check_module(text.format("json"), "deep.py")
    with pytest.raises(BundleError, match="deep.py:17: imports requests"):
        check_module(text.format("requests"), "deep.py")


def test_the_check_is_made_once_for_a_set_of_sources_and_again_when_one_changes(importable, monkeypatch):
    """The verdict is kept beside the package's bytecode: the next process reads the same sources without parsing them
    again; a module changed since (a new import) is read again, and refused."""
    name = _package(importable, "bundled_kept", {"main": "import json\n\n\ndef main(payload):\n    return payload\n"})
    real, checked = bundle.check_module, []
    monkeypatch.setattr(bundle, "check_module", lambda text, filename, package: checked.append(filename) or real(
        text, filename, package))
    bundle.sources(name)
    assert sorted(checked) == ["bundled_kept/__init__.py", "bundled_kept/main.py"]
    assert [p.name.startswith("eaglepatch-bundle-checked-") for p in (importable / name / "__pycache__").iterdir()] \
        == [True]
    checked.clear()
    assert bundle.sources(name)["bundled_kept.main"][1].startswith("import json")
    assert checked == []
    (importable / name / "main.py").write_text("import json\n\n\ndef main(payload):\n    import requests\n")
    with pytest.raises(BundleError, match="bundled_kept/main.py:5: imports requests"):
        bundle.sources(name)


def test_a_module_newer_than_python_3_8_is_refused():
    with pytest.raises(BundleError, match=r"demo.py:\d+: not Python 3.8: Pattern matching"):
        check_module("match x:\n    case 1:\n        pass\n", "demo.py")
    with pytest.raises(BundleError, match="not Python 3.8"):
        check_module("with (open('a') as a, open('b') as b):\n    pass\n", "demo.py")


def test_the_package_may_import_itself_relatively_or_by_name_and_any_standard_module(importable, tmp_path):
    name = _package(importable, "bundled_good", {
        "main": """\
            from __future__ import annotations

            import importlib.util
            import os.path

            from bundled_good import helper
            from . import other
            from .other import twice


            def main(payload):
                import zlib
                return {"x": helper.x(payload["n"]), "y": twice(other.y()), "z": zlib.crc32(b"")}
            """,
        "helper": "def x(n):\n    return n + 1\n",
        "other": "def y():\n    return 2\n\n\ndef twice(v):\n    return 2 * v\n",
    })
    program = bundle.program(name, name + ".main")
    elsewhere = tmp_path / "elsewhere"  # not where the package's files are: it runs from the program alone
    elsewhere.mkdir()
    out = run_bare(program, "import sys\nprint(main({'n': 1}), sys.modules['bundled_good.helper'].__file__)\n",
                   elsewhere)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "{'x': 2, 'y': 4, 'z': 0} bundled_good/helper.py"


def test_a_relative_import_that_leaves_the_package_is_refused():
    """``from ..errors import X`` in eaglepatch/hostside/logs.py names eaglepatch.errors, which the host does not
    have: refused with its line, as an absolute import of it would be; one inside the package passes."""
    check_module("from . import proc\nfrom .proc import table\n", "eaglepatch/hostside/logs.py")
    check_module("from .proc import table\n", "eaglepatch/hostside/__init__.py")
    with pytest.raises(BundleError, match=r"logs.py:2: imports \.\.errors, which leaves eaglepatch.hostside"):
        check_module("import os\nfrom ..errors import UsageError\n", "eaglepatch/hostside/logs.py")
    with pytest.raises(BundleError, match="leaves eaglepatch.hostside"):
        check_module("from .. import errors\n", "eaglepatch/hostside/__init__.py")
