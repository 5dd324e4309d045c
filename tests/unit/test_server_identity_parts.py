"""Which interpreter a server runs and how it was launched, read the way the scan on the host reads it.

Pure parts of ``eaglepatch/hostside/discover.py`` (the module the host runs, imported here), on small
hand-made files and texts: argv[0] resolved as the server's shell resolved it, the interpreter and its options to
ask where ``import sglang`` comes from, the systemd unit from /proc/PID/cgroup. The same against real processes
launched each way people launch sglang is in tests/e2e/test_server_identity.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from eaglepatch.hostside.discover import (
    import_source,
    interpreter_of,
    package_of,
    parse_cgroup_unit,
    resolve_launcher,
)
from eaglepatch.hostside.launchers import launcher_args_index


def _exe(path: Path, text: str = "#!/bin/sh\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def test_argv0_with_a_slash_is_relative_to_the_process_cwd_and_keeps_the_venv_link(tmp_path):
    """A venv's bin/python is a symlink to the base interpreter: the link's own path is what finds the venv, so
    the resolved launcher is the link, not its target."""
    base = _exe(tmp_path / "base" / "python3.11")
    venv_python = tmp_path / "venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.symlink_to(base)
    assert resolve_launcher("venv/bin/python", str(tmp_path), {}) == str(venv_python)
    assert resolve_launcher(str(venv_python), "/", {}) == str(venv_python)
    assert resolve_launcher("./venv/bin/python", str(tmp_path), {}) == str(venv_python)
    assert resolve_launcher("nope/bin/python", str(tmp_path), {}) is None


def test_a_bare_argv0_is_looked_up_on_the_process_own_path(tmp_path):
    """``python`` in an activated venv is the first ``python`` on that process's PATH (not ours); a relative PATH
    entry counts from its cwd."""
    first = _exe(tmp_path / "venv" / "bin" / "python")
    _exe(tmp_path / "usr" / "bin" / "python")
    env = {"PATH": f"{tmp_path / 'nothing'}:{tmp_path / 'venv' / 'bin'}:{tmp_path / 'usr' / 'bin'}"}
    assert resolve_launcher("python", "/", env) == str(first)
    assert resolve_launcher("python", str(tmp_path), {"PATH": "usr/bin"}) == str(tmp_path / "usr" / "bin" / "python")
    (tmp_path / "plain").write_text("not executable")
    assert resolve_launcher("plain", "/", {"PATH": str(tmp_path)}) is None


@pytest.mark.parametrize(
    "argv,want_opts,want_script",
    [
        (["/venv/bin/python", "-m", "sglang.launch_server", "--port", "1"], [], ""),
        (["python3", "-u", "-X", "importtime", "-s", "-m", "sglang.launch_server"], ["-s"], ""),
        (["python3", "-Ium", "sglang.launch_server"], ["-I"], ""),
        (["python3", "-E", "-W", "ignore", "/opt/venv/bin/sglang", "serve"], ["-E"], "/opt/venv/bin"),
        (["python", "src/sglang/launch_server.py", "--port", "4"], [], "/work/src/sglang"),
    ],
)
def test_the_interpreter_is_asked_with_the_options_that_change_imports(argv, want_opts, want_script):
    """Only the options that change sys.path are kept (-I -E -s -S -P); -X and -W values are skipped, not taken
    for a script; a script's folder is sys.path[0] for it, relative to the cwd."""
    interp, opts, script = interpreter_of(argv, launcher_args_index(argv), "/resolved/python", "/usr/bin/python3",
                                        "/work")
    assert (interp, opts, script) == ("/resolved/python", want_opts, want_script)


def test_a_console_script_started_directly_is_asked_through_its_shebang(tmp_path):
    """``sglang serve`` as argv[0] (exec -a, a wrapper): the interpreter is the script's #! line, the script's
    folder its sys.path[0]; an ``env`` shebang falls back to /proc/PID/exe."""
    script = _exe(tmp_path / "venv" / "bin" / "sglang", "#!/opt/venv/bin/python3.11\nimport sys\n")
    argv = ["sglang", "serve", "--port", "3"]
    assert interpreter_of(argv, 2, str(script), "/usr/bin/python3", "/") == (
        "/opt/venv/bin/python3.11", [], str(script.parent))
    env_script = _exe(tmp_path / "other" / "sglang", "#!/usr/bin/env python3\n")
    assert interpreter_of(argv, 2, str(env_script), "/usr/bin/python3", "/")[0] == "/usr/bin/python3"


@pytest.mark.parametrize(
    "text,want",
    [
        ("0::/system.slice/sglang.service\n", {"unit": "sglang.service", "user": False}),
        ("12:pids:/system.slice/x.service\n1:name=systemd:/system.slice/sglang@0.service\n0::/\n",
         {"unit": "sglang@0.service", "user": False}),
        ("0::/user.slice/user-1000.slice/user@1000.service/app.slice/llm.service\n",
         {"unit": "llm.service", "user": True}),
        ("0::/user.slice/user-1000.slice/session-4.scope\n", None),  # a login session: not a service
        ("0::/user.slice/user-1000.slice/user@1000.service/init.scope\n", None),  # the user manager itself
        ("0::/\n", None),
        ("", None),
    ],
)
def test_the_service_unit_comes_from_the_systemd_hierarchy(text, want):
    assert parse_cgroup_unit(text) == want


def test_where_import_sglang_comes_from(tmp_path):
    """The package's parent on PYTHONPATH, in the cwd, in site-packages, or not on sys.path at all (a finder
    that an editable install registered)."""
    pkg = tmp_path / "checkout" / "python" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    parent = str(pkg.parent)
    answer = {"origin": str(pkg / "__init__.py"), "path": ["", "/usr/lib/python3.11", parent]}
    assert package_of(answer, None) == str(pkg)
    assert import_source(str(pkg), answer, {"PYTHONPATH": parent}, "/") == "PYTHONPATH"
    assert import_source(str(pkg), answer, {}, parent) == "cwd"
    assert import_source(str(pkg), {"path": ["/usr/lib/python3.11"]}, {}, "/") == "editable"
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    (site / "sglang").mkdir(parents=True)
    (site / "sglang" / "__init__.py").write_text("")
    assert import_source(str(site / "sglang"), {"path": [str(site)]}, {}, "/") == "site-packages"
    assert package_of({"origin": None, "locations": [str(tmp_path)]}, None) is None  # a namespace, no package
    assert package_of(None, None) is None


def test_launcher_links_are_not_resolved_to_the_base_interpreter(tmp_path):
    """The same file by two names: the scan keeps the name the server used (what os.path.realpath would lose)."""
    base = _exe(tmp_path / "python3.11")
    link = tmp_path / "venv" / "bin" / "python3"
    link.parent.mkdir(parents=True)
    link.symlink_to(base)
    got = resolve_launcher(str(link), "/", {})
    assert got == str(link) and os.path.realpath(got) == str(base)
