"""Test-side helpers for the stand-in sglang server: a private copy of the stub tree (or a virtual environment, or
an editable install of a checkout), free ports, launching it the ways people launch sglang on GPU hosts, waiting
for it, reading a process's identity from /proc, and killing what the test left behind (and nothing else).

Load it by path (it is not a package on the tests' path, on purpose: ``import sglang`` in the test process must
not find the stub)::

    spec = importlib.util.spec_from_file_location("standin_harness", STUBS / "stand_in_sglang" / "standin_harness.py")

Every process a ``StandIns`` starts carries ``EAGLEPATCH_TEST_OWNER=<its token>`` in its environment, and its
``cleanup`` kills only processes that prove to be its own that way: other checkouts of the project run the same
tests on the same machine, with servers on the same port numbers. See README.md.

Standard library only.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

STUB_ROOT = Path(__file__).resolve().parent
OWNER_VAR = "EAGLEPATCH_TEST_OWNER"  # every process a StandIns starts carries OWNER_VAR=<its token>
VERSION = "0.0.0"  # the version in the file names of the installs (dist-info, editable finder)
METADATA_VERSION = "0.0.0-standin"  # what their METADATA says
TRIVIAL_WORKER = "class EAGLEWorker:\n    def forward_batch_generation(self, batch):\n        return batch\n"
BROKEN_WORKER = "raise RuntimeError('broken patch: eagle_worker does not import')\n"
# A worker with the shape of sglang's V1 EAGLEWorker, so the built-in recipe instruments it (apply, bench, sweep).
V1_WORKER = """\
class EAGLEWorker:
    def forward_batch_generation(self, batch):
        if batch.forward_mode.is_extend():
            logits_output, next_token_ids, bid = self.forward_target_extend(batch)
            self.forward_draft_extend(batch, logits_output, next_token_ids)
            return logits_output
        spec_info = self.draft(batch)
        logits_output, verify_output, model_worker_batch = self.verify(batch, spec_info)
        self.forward_draft_extend_after_decode(batch)
        return logits_output
"""


def make_tree(dest: Path, worker_source: str | None = TRIVIAL_WORKER) -> Path:
    """Copy the stub ``sglang`` package under ``dest`` (a PYTHONPATH root) with ``srt/speculative/eagle_worker.py``."""
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copytree(STUB_ROOT / "sglang", dest / "sglang", ignore=shutil.ignore_patterns("__pycache__"))
    if worker_source is not None:
        set_worker(dest, worker_source)
    return dest


ADAPTIVE_DIR = STUB_ROOT / "adaptive"  # eagle_worker_v2.py and the adaptive modules, in sglang 0.5.16's shape


def add_adaptive(pkg: Path) -> Path:
    """Put the stand-in's adaptive speculative files (``ADAPTIVE_DIR``: ``eagle_worker_v2.py``,
    ``adaptive_runtime_state.py``, ``adaptive_spec_params.py``) into the package ``pkg``'s ``srt/speculative/``;
    returns the worker file's path."""
    spec = pkg / "srt" / "speculative"
    spec.mkdir(parents=True, exist_ok=True)
    for f in sorted(ADAPTIVE_DIR.glob("*.py")):
        shutil.copyfile(f, spec / f.name)
    shutil.rmtree(spec / "__pycache__", ignore_errors=True)
    return spec / "eagle_worker_v2.py"


def worker_file(tree: Path) -> Path:
    return tree / "sglang" / "srt" / "speculative" / "eagle_worker.py"


def set_worker(tree: Path, source: str) -> None:
    path = worker_file(tree)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    shutil.rmtree(path.parent / "__pycache__", ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def alive(pid: int) -> bool:
    """True when ``pid`` runs on this machine (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode("ascii", "replace")
    except OSError:
        return False
    return text[text.rfind(")") + 2 :].split()[0] not in ("Z", "X")


def http_get(port: int, path: str, timeout: float = 2.0) -> tuple[int | None, object]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"http://127.0.0.1:{port}{path}", timeout=timeout) as resp:
            body = resp.read()
            return resp.status, json.loads(body) if body else None
    except urllib.error.HTTPError as exc:
        return exc.code, None
    except OSError:
        return None, None


def wait_http(port: int, path: str = "/health_generate", timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if http_get(port, path)[0] == 200:
            return
        time.sleep(0.05)
    raise AssertionError(f"the stand-in on :{port} did not answer 200 on {path} within {timeout} s")




# ---- installs: a virtual environment with the stub, an editable install of a checkout ----------------------------


def base_python() -> str:
    """The real interpreter behind the one running the tests: ``sys.executable`` itself unless that is a virtual
    environment's, whose base interpreter is returned then (a new venv made from it links to a real interpreter,
    not to another venv's link)."""
    if sys.prefix == sys.base_prefix:
        return sys.executable
    base = getattr(sys, "_base_executable", None)
    if base and os.path.isfile(base) and not Path(base).absolute().is_relative_to(Path(sys.prefix).absolute()):
        return base
    for name in (f"python{sys.version_info[0]}.{sys.version_info[1]}", f"python{sys.version_info[0]}", "python"):
        cand = Path(getattr(sys, "base_prefix")) / "bin" / name
        if cand.is_file():
            return str(cand)
    raise RuntimeError(f"cannot find the base interpreter of {sys.executable} (base_prefix {sys.base_prefix})")


def site_packages(venv: Path) -> Path:
    """``<venv>/lib/pythonX.Y/site-packages``."""
    found = sorted((venv / "lib").glob("python*/site-packages"))
    if not found:
        raise FileNotFoundError(f"no lib/python*/site-packages in {venv}")
    return found[0]


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _new_venv(dest: Path) -> Path:
    """``<base python> -m venv --without-pip dest`` (bin/python is a symlink to the base interpreter)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([base_python(), "-m", "venv", "--without-pip", str(dest)], env=_clean_env(), check=True,
                   stdin=subprocess.DEVNULL, capture_output=True)
    return dest


def _console_script(venv: Path) -> Path:
    """``<venv>/bin/sglang`` as pip writes a console script: ``#!<venv>/bin/python`` and the entry point's call
    (or, as pip does when that path has a space or is too long for a ``#!`` line, a ``/bin/sh`` trampoline that
    execs the same python with the script: the running command line reads the same)."""
    python = venv / "bin" / "python"
    if " " in str(python) or len(str(python)) > 127:
        head = f"#!/bin/sh\n'''exec' \"{python}\" \"$0\" \"$@\"\n' '''\n"
    else:
        head = f"#!{python}\n"
    body = (
        "# -*- coding: utf-8 -*-\n"
        "import re\n"
        "import sys\n"
        "from sglang.cli.main import main\n"
        "if __name__ == '__main__':\n"
        "    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n"
        "    sys.exit(main())\n"
    )
    path = venv / "bin" / "sglang"
    path.write_text(head + body)
    path.chmod(0o755)
    return path


def _record_line(site: Path, path: Path) -> str:
    data = path.read_bytes()
    b64 = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{os.path.relpath(path, site)},sha256={b64},{len(data)}"


def _dist_info(site: Path, venv: Path, installed: list[Path], direct_url: dict | None = None) -> Path:
    """``sglang-0.0.0.dist-info`` as pip leaves it (METADATA, INSTALLER, RECORD, ...), with the console script."""
    info = site / f"sglang-{VERSION}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: sglang\nVersion: {METADATA_VERSION}\n"
        "Summary: stand-in sglang for eaglepatch's tests\n"
    )
    (info / "INSTALLER").write_text("pip\n")
    (info / "REQUESTED").write_text("")
    (info / "WHEEL").write_text("Wheel-Version: 1.0\nGenerator: standin_harness\nRoot-Is-Purelib: true\n"
                                "Tag: py3-none-any\n")
    (info / "entry_points.txt").write_text("[console_scripts]\nsglang = sglang.cli.main:main\n")
    (info / "top_level.txt").write_text("sglang\n")
    if direct_url is not None:
        (info / "direct_url.json").write_text(json.dumps(direct_url))
    script = _console_script(venv)
    files = [*installed, *sorted(p for p in info.iterdir()), script]
    lines = [_record_line(site, p) for p in files]
    lines.append(f"{info.name}/RECORD,,")
    (info / "RECORD").write_text("\n".join(lines) + "\n")
    return info


def make_venv(dest: Path, worker_source: str | None = TRIVIAL_WORKER) -> Path:
    """A virtual environment at ``dest`` (``python -m venv --without-pip`` from the base interpreter) with the stub
    package in its site-packages, like ``pip install sglang`` leaves it: ``sglang/`` (with
    ``srt/speculative/eagle_worker.py`` = ``worker_source``), ``sglang-0.0.0.dist-info`` (METADATA says
    ``Version: 0.0.0-standin``) and the console script ``<venv>/bin/sglang``. Returns ``dest``.
    ``set_worker(site_packages(venv), source)`` swaps the worker."""
    venv = _new_venv(dest)
    site = site_packages(venv)
    shutil.copytree(STUB_ROOT / "sglang", site / "sglang", ignore=shutil.ignore_patterns("__pycache__"))
    if worker_source is not None:
        set_worker(site, worker_source)
    _dist_info(site, venv, sorted(p for p in (site / "sglang").rglob("*") if p.is_file()))
    return venv


# What setuptools' PEP 660 editable install (``pip install -e``, a project without a src layout, like sglang's
# python/) writes into site-packages: a .pth that installs a MetaPathFinder mapping the top-level package to the
# checkout. The checkout is not on sys.path; ``import sglang`` finds it through the finder.
_FINDER = '''\
from __future__ import annotations
import sys
from importlib.machinery import ModuleSpec, PathFinder
from importlib.machinery import all_suffixes as module_suffixes
from importlib.util import spec_from_file_location
from itertools import chain
from pathlib import Path

MAPPING: dict[str, str] = {mapping!r}
NAMESPACES: dict[str, list[str]] = {{}}
PATH_PLACEHOLDER = {placeholder!r} + ".__path_hook__"


class _EditableFinder:  # MetaPathFinder
    @classmethod
    def find_spec(cls, fullname: str, path=None, target=None) -> ModuleSpec | None:  # type: ignore
        if fullname in MAPPING:
            return cls._find_spec(fullname, Path(MAPPING[fullname]))
        parent, _, child = fullname.rpartition(".")
        if parent and parent in MAPPING:
            return PathFinder.find_spec(fullname, path=[MAPPING[parent]])
        return None

    @classmethod
    def _find_spec(cls, fullname: str, candidate_path: Path) -> ModuleSpec | None:
        init = candidate_path / "__init__.py"
        candidates = (candidate_path.with_suffix(x) for x in module_suffixes())
        for candidate in chain([init], candidates):
            if candidate.exists():
                return spec_from_file_location(fullname, candidate)
        return None


def install():
    if not any(finder == _EditableFinder for finder in sys.meta_path):
        sys.meta_path.append(_EditableFinder)
'''

_PYPROJECT = """\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "sglang"
version = "{version}"
description = "stand-in sglang for eaglepatch's tests"
requires-python = ">=3.10"

[project.scripts]
sglang = "sglang.cli.main:main"

[tool.setuptools.packages.find]
include = ["sglang*"]
"""


def make_editable(dest: Path, worker_source: str | None = TRIVIAL_WORKER) -> tuple[Path, Path]:
    """A checkout ``<dest>/checkout`` (the package at ``checkout/python/sglang``, with a ``python/pyproject.toml``)
    installed in editable mode into a fresh venv ``<dest>/venv``, with the files ``pip install -e python/``
    (setuptools' PEP 660 editable wheel) leaves in site-packages: ``__editable__.sglang-0.0.0.pth``,
    ``__editable___sglang_0_0_0_finder.py`` (a MetaPathFinder mapping ``sglang`` to the checkout),
    ``sglang-0.0.0.dist-info`` (with ``direct_url.json``: editable) and ``<venv>/bin/sglang``. The checkout is not
    on the venv's sys.path, yet its python imports ``sglang`` from there. Returns ``(venv, checkout)``;
    ``set_worker(checkout / "python", source)`` swaps the worker.

    Written by hand, not by pip: offline, the interpreters' bundled setuptools (65.5 with Python 3.11) cannot build
    an editable wheel without the ``wheel`` package, and a venv with pip takes ~4 s to make."""
    checkout = dest / "checkout"
    root = checkout / "python"
    root.mkdir(parents=True, exist_ok=True)
    shutil.copytree(STUB_ROOT / "sglang", root / "sglang", ignore=shutil.ignore_patterns("__pycache__"))
    if worker_source is not None:
        set_worker(root, worker_source)
    (root / "pyproject.toml").write_text(_PYPROJECT.format(version=VERSION))
    venv = _new_venv(dest / "venv")
    site = site_packages(venv)
    tag = f"sglang_{VERSION.replace('.', '_')}"
    finder = site / f"__editable___{tag}_finder.py"
    finder.write_text(_FINDER.format(mapping={"sglang": str(root / "sglang")},
                                     placeholder=f"__editable__.sglang-{VERSION}.finder"))
    pth = site / f"__editable__.sglang-{VERSION}.pth"
    pth.write_text(f"import __editable___{tag}_finder; __editable___{tag}_finder.install()")
    _dist_info(site, venv, [pth, finder], direct_url={"dir_info": {"editable": True}, "url": root.as_uri()})
    return venv, checkout


# ---- processes: what runs, whose it is, its identity --------------------------------------------------------------


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def _stat(pid: int) -> list[str] | None:
    """``/proc/PID/stat`` fields after the command name: state, ppid, pgrp, session, ..."""
    raw = _read(f"/proc/{pid}/stat")
    if raw is None:
        return None
    text = raw.decode("ascii", "replace")
    return text[text.rfind(")") + 2 :].split()


def _processes() -> dict[int, tuple[int, int]]:
    """Every live process on this machine: pid -> (ppid, pgid)."""
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = _stat(int(name))
            if fields is not None and fields[0] not in ("Z", "X"):
                out[int(name)] = (int(fields[1]), int(fields[2]))
    return out


def proc_argv(pid: int) -> list[str] | None:
    raw = _read(f"/proc/{pid}/cmdline")
    if raw is None:
        return None
    return [a.decode("utf-8", "surrogateescape") for a in raw.rstrip(b"\0").split(b"\0")] if raw else []


def proc_env(pid: int) -> dict[str, str] | None:
    raw = _read(f"/proc/{pid}/environ")
    if raw is None:
        return None
    env = {}
    for item in raw.split(b"\0"):
        if b"=" in item:
            k, _, v = item.partition(b"=")
            env[k.decode("utf-8", "surrogateescape")] = v.decode("utf-8", "surrogateescape")
    return env


def _readlink(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


def proc_identity(pid: int) -> dict:
    """What /proc says a process is: ``{"pid", "argv" (cmdline), "cwd", "env" (environ), "exe"}`` (None where it
    cannot be read). For comparing a server before and after a restart."""
    return {
        "pid": pid,
        "argv": proc_argv(pid),
        "cwd": _readlink(f"/proc/{pid}/cwd"),
        "env": proc_env(pid),
        "exe": _readlink(f"/proc/{pid}/exe"),
    }


def proc_start_time(pid: int) -> float:
    """When ``pid`` started, on the wall clock (its start in clock ticks since boot, and the boot time from
    /proc/uptime)."""
    fields = _stat(pid)
    assert fields is not None, f"no process {pid}"
    with open("/proc/uptime") as f:
        boot = time.time() - float(f.read().split()[0])
    return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")


def owner_of(pid: int) -> str | None:
    """The ``EAGLEPATCH_TEST_OWNER`` token in the environment of ``pid`` (None: it has none, or it is gone)."""
    env = proc_env(pid)
    return None if env is None else env.get(OWNER_VAR)


def _is_launcher(argv: list[bytes]) -> bool:
    """``... -m sglang.launch_server ...`` or a console script's ``... .../sglang serve ...``."""
    if b"sglang.launch_server" in argv:
        return True
    return any(os.path.basename(a) == b"sglang" and argv[i + 1 : i + 2] == [b"serve"] for i, a in enumerate(argv))


def _port_of(argv: list[bytes]) -> int | None:
    for i, a in enumerate(argv):
        value = argv[i + 1] if a == b"--port" and i + 1 < len(argv) else a[7:] if a.startswith(b"--port=") else None
        if value is not None:
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _launchers() -> dict[int, int | None]:
    """Live sglang launchers on this machine (``python -m sglang.launch_server``, ``sglang serve``): pid -> port."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        raw = _read(f"/proc/{name}/cmdline")
        if not raw:
            continue
        argv = raw.rstrip(b"\0").split(b"\0")
        if _is_launcher(argv) and alive(int(name)):
            out[int(name)] = _port_of(argv)
    return out


def launcher_pids(port: int, owner: str | None = None) -> list[int]:
    """Stand-in (or any sglang) launchers on this machine whose command line says ``--port PORT``; with ``owner``,
    only those whose environment carries ``EAGLEPATCH_TEST_OWNER=<owner>``. Without it, other checkouts' servers
    on the same port number are listed too: read it, never kill by it."""
    return sorted(pid for pid, p in _launchers().items() if p == port and (owner is None or owner_of(pid) == owner))


def _tree(root: int, procs: dict[int, tuple[int, int]]) -> list[int]:
    """``root`` and its descendants."""
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _pgid) in procs.items():
        kids.setdefault(ppid, []).append(pid)
    todo, out = [root], []
    while todo:
        p = todo.pop()
        if p not in out:
            out.append(p)
            todo.extend(kids.get(p, ()))
    return out


def _kill(pids) -> None:
    for p in pids:
        if p in (os.getpid(), os.getppid(), 1):
            continue
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass


class StandIns:
    """Launches stand-ins for one test and, at ``cleanup``, kills what is provably its own: every launcher whose
    environment carries this instance's ``EAGLEPATCH_TEST_OWNER`` token (a server eaglepatch relaunched keeps the
    environment, so it is found too, on whatever port), with its process tree; the processes it launched; the
    pids a test put in ``orphans``. Never by port or command line alone."""

    def __init__(self, python: str = sys.executable):
        self.python = python
        self.token = secrets.token_hex(12)
        self.ports: set[int] = set()
        self.procs: list[subprocess.Popen] = []
        self.orphans: list[int] = []  # other pids a test made, killed at cleanup
        self.dirs: set[str] = set()  # cwds and trees it launched with (private temporary folders)

    make_venv = staticmethod(make_venv)
    make_editable = staticmethod(make_editable)

    def port(self) -> int:
        port = free_port()
        self.ports.add(port)
        return port

    # -- environments ----------------------------------------------------------------------------------------

    def base_env(self, **extra: str) -> dict[str, str]:
        """This process's environment without PYTHONHOME, with ``PYTHONDONTWRITEBYTECODE=1`` and the owner token."""
        env = dict(os.environ)
        env.pop("PYTHONHOME", None)
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env[OWNER_VAR] = self.token
        env.update(extra)
        return env

    def env(self, tree: Path, **extra: str) -> dict[str, str]:
        """The environment of ``launch``: ``base_env`` with ``PYTHONPATH=<tree>``."""
        self.dirs.add(str(tree))
        env = self.base_env()
        env["PYTHONPATH"] = str(tree)
        env.update(extra)
        return env

    def venv_env(self, venv: Path, activated: bool = False, **extra: str) -> dict[str, str]:
        """``base_env`` without PYTHONPATH and VIRTUAL_ENV and with ``<venv>/bin`` off PATH (a systemd unit, a
        container entrypoint); ``activated``: ``VIRTUAL_ENV=<venv>`` and PATH starting with ``<venv>/bin``, as
        after ``source <venv>/bin/activate``."""
        env = self.base_env()
        env.pop("PYTHONPATH", None)
        env.pop("VIRTUAL_ENV", None)
        bindir = str(venv / "bin")
        path = [p for p in env.get("PATH", os.defpath).split(os.pathsep) if p and os.path.normpath(p) != bindir]
        if activated:
            env["VIRTUAL_ENV"] = str(venv)
            path.insert(0, bindir)
        env["PATH"] = os.pathsep.join(path)
        env.update(extra)
        return env

    def argv(self, port: int, *args: str) -> list[str]:
        return [self.python, "-m", "sglang.launch_server", "--port", str(port), *args]

    # -- launching -------------------------------------------------------------------------------------------

    def spawn(self, argv: list[str], cwd: Path, env: dict[str, str], port: int | None = None,
              log: Path | None = None) -> subprocess.Popen:
        """Start ``argv`` the way a user would from a shell: its own session and process group, output to ``log``
        (default ``<cwd>/stand-in-<port>.log``), reaped by a thread as soon as it exits. ``env`` should carry the
        owner token (``base_env`` and the others do): what does not, cleanup kills only as ``procs``."""
        if port is not None:
            self.ports.add(port)
        cwd.mkdir(parents=True, exist_ok=True)
        self.dirs.add(str(cwd))
        out = open(log or (cwd / f"stand-in-{port}.log"), "ab")
        try:
            proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            out.close()
        self.procs.append(proc)
        # reap it as soon as it exits, as a shell would: a zombie child of pytest still "exists" for kill -0
        threading.Thread(target=proc.wait, daemon=True).start()
        return proc

    def launch(self, tree: Path, cwd: Path, port: int, *args: str, log: Path | None = None, **env: str):
        """``<python> -m sglang.launch_server --port PORT ARGS`` with ``PYTHONPATH=<tree>`` (a checkout on
        PYTHONPATH)."""
        return self.spawn(self.argv(port, *args), cwd, self.env(tree, **env), port, log)

    def launch_venv_by_path(self, venv: Path, cwd: Path, port: int, *args: str, log: Path | None = None,
                            **env: str):
        """``<venv>/bin/python -m sglang.launch_server --port PORT ARGS``, not activated: no VIRTUAL_ENV, no
        ``<venv>/bin`` on PATH, no PYTHONPATH (a systemd unit, a container entrypoint). Its /proc/PID/exe is the
        base interpreter, which alone does not see the venv."""
        argv = [str(venv / "bin" / "python"), "-m", "sglang.launch_server", "--port", str(port), *args]
        return self.spawn(argv, cwd, self.venv_env(venv, **env), port, log)

    def launch_activated_venv(self, venv: Path, cwd: Path, port: int, *args: str, log: Path | None = None,
                              **env: str):
        """``python -m sglang.launch_server --port PORT ARGS`` after ``source <venv>/bin/activate``: argv[0] is the
        bare word ``python`` (found on PATH, which starts with ``<venv>/bin``), ``VIRTUAL_ENV=<venv>``, no
        PYTHONPATH."""
        argv = ["python", "-m", "sglang.launch_server", "--port", str(port), *args]
        return self.spawn(argv, cwd, self.venv_env(venv, activated=True, **env), port, log)

    def launch_console_script(self, venv: Path, cwd: Path, port: int, *args: str, log: Path | None = None,
                              **env: str):
        """``<venv>/bin/sglang serve --port PORT ARGS`` (not activated, environment as ``launch_venv_by_path``).
        The kernel runs the ``#!`` line: /proc/PID/cmdline reads ``<venv>/bin/python <venv>/bin/sglang serve
        --port PORT ARGS``."""
        argv = [str(venv / "bin" / "sglang"), "serve", "--port", str(port), *args]
        return self.spawn(argv, cwd, self.venv_env(venv, **env), port, log)

    def launch_editable(self, venv: Path, cwd: Path, port: int, *args: str, log: Path | None = None, **env: str):
        """``<venv>/bin/python -m sglang.launch_server --port PORT ARGS`` with the venv of ``make_editable``, not
        activated: ``sglang`` is imported from the checkout, which is on no path variable."""
        return self.launch_venv_by_path(venv, cwd, port, *args, log=log, **env)

    # -- ownership and cleanup -------------------------------------------------------------------------------

    def launcher_pids(self, port: int, owned: bool = True) -> list[int]:
        """Launchers whose command line says ``--port PORT``: only this instance's (``owned``) or anyone's."""
        return launcher_pids(port, self.token if owned else None)

    def owns(self, pid: int) -> bool:
        """Whether ``pid``'s environment carries this instance's token."""
        return owner_of(pid) == self.token

    def _tokenless_own(self, pid: int, port: int | None) -> bool:
        """A launcher without any owner token, on a port this instance handed out, running in (or with
        PYTHONPATH at) a folder this instance launched with: one a test's restart command started from the test
        process's environment. Those folders are private temporary ones, so this is never another checkout's."""
        if port not in self.ports:
            return False
        env = proc_env(pid)
        if env is None or OWNER_VAR in env:
            return False
        return _readlink(f"/proc/{pid}/cwd") in self.dirs or env.get("PYTHONPATH") in self.dirs

    def _targets(self) -> set[int]:
        procs = _processes()
        roots = {pid for pid in self.orphans if pid in procs}
        roots |= {p.pid for p in self.procs if p.returncode is None and p.pid in procs}
        for pid, port in _launchers().items():
            if self.owns(pid) or self._tokenless_own(pid, port):
                roots.add(pid)
        # what a launcher that died first left in its group: members that carry the token (never the whole
        # group, which may hold processes that are not ours)
        leaders = roots | {p.pid for p in self.procs}
        mine = os.getpgrp()
        for pid, (_ppid, pgid) in procs.items():
            if pgid in leaders and pgid != mine and self.owns(pid):
                roots.add(pid)
        targets: set[int] = set()
        for root in roots:
            targets.update(_tree(root, procs))
        targets.discard(os.getpid())
        return targets

    def cleanup(self) -> None:
        """SIGKILL what is this instance's (see the class): a few rounds, until nothing of it is left."""
        for _ in range(5):
            targets = self._targets()
            if not targets:
                break
            _kill(targets)
            time.sleep(0.05)
        for proc in self.procs:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        # The output and start script of the servers eaglepatch relaunched on this instance's ports (its log dir
        # on the host, /tmp/eaglepatch, or /tmp/eaglepatch-<uid>): a port is bound by one server at a time, so
        # these names are this test's.
        for folder in ("/tmp/eaglepatch", f"/tmp/eaglepatch-{os.getuid()}"):
            for port in self.ports:
                for name in (f"server-{port}.log", f"start-{port}.sh"):
                    path = os.path.join(folder, name)
                    try:
                        if os.lstat(path).st_uid == os.getuid():
                            os.unlink(path)
                    except OSError:
                        pass
