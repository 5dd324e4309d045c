"""Shared by the e2e tests that drive stand-in sglang servers (tests/stubs/stand_in_sglang): ``H``, the stand-ins'
harness (standin_harness.py), loaded here once for the whole suite (``from safety import H``); the installed CLI
over the real sshd of conftest.py (or on a local path): ``CLI`` on an install, ``Via`` on a stand-in's tree,
``cli_env`` the environment of either; stand-in sglang servers launched the ways people launch them, and what a
host looks like before and after (every byte of the install, every server of it with its pid, argv[0], argv, cwd
and environment). The fixtures built on them (``standins``, ``local``, ``ssh``, ``local_cli``, ``ssh_cli``) are in
conftest.py.

``FaultTable`` collects one row per fault the crash tests inject: what was done, what eaglepatch did, the state
after. With ``EAGLEPATCH_SAFETY_TABLE=FILE`` set, the rows are written there as JSON at the end of the session, and
``python tests/e2e/safety.py FILE docs/safety.md`` renders them (``make safety-table`` does both).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

from logdir import with_log_dir

_spec = importlib.util.spec_from_file_location(
    "standin_harness", Path(__file__).resolve().parents[1] / "stubs" / "stand_in_sglang" / "standin_harness.py"
)
H = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(H)  # type: ignore[union-attr]

PY = sys.executable
_BIN = Path(PY).with_name("eaglepatch")
EAGLEPATCH = [str(_BIN)] if _BIN.is_file() else [PY, "-m", "eaglepatch"]
WORKER = H.V1_WORKER
# make_install's worker for an install in sglang 0.5.16's shape with adaptive speculation (the stand-in's
# eagle_worker_v2.py and adaptive modules, no eagle_worker.py): what sweep --live needs.
ADAPTIVE = "<adaptive>"
# Appended to make a worker that imports fine as shipped but not once eaglepatch has patched it.
REJECTS_PATCH = '''

if "_eaglepatch" in globals():
    raise RuntimeError("this server cannot run the patched worker")
'''


@dataclasses.dataclass
class Result:
    argv: list[str]
    rc: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)

    def expect(self, rc: int) -> "Result":
        assert self.rc == rc, f"expected exit {rc}:\n{self}"
        return self

    def __str__(self) -> str:
        return f"$ {' '.join(self.argv)}\nexit {self.rc}\n--- stdout\n{self.out[-3000:]}\n--- stderr\n{self.err[-3000:]}"


class CLI:
    """The installed CLI, reaching an install either as a local path or over SSH (``--sglang-path``)."""

    def __init__(self, kind: str, env: dict[str, str], ssh: list[str] | None = None):
        self.kind, self.env, self.ssh = kind, env, ssh

    def target(self, pkg: Path) -> list[str]:
        return [str(pkg)] if self.ssh is None else [*self.ssh, "--sglang-path", str(pkg)]

    def run(self, cmd: str, pkg: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 200,
            prefix: list[str] | None = None, cli: list[str] | None = None) -> Result:
        """Run ``eaglepatch CMD TARGET ARGS`` (``cli``: another command line for eaglepatch, e.g. ``cli_for_user``'s;
        ``prefix``: what runs it, e.g. setpriv)."""
        argv = [*(prefix or []), *(cli or EAGLEPATCH), cmd, *self.target(pkg), *with_log_dir(cmd, args)]
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=dict(self.env, **(env or {})),
                           stdin=subprocess.DEVNULL)
        return Result(argv, p.returncode, p.stdout, p.stderr)


class Via:
    """``python -m eaglepatch`` on a stand-in's tree (``H.make_tree``): its local path, or over sshd (``ssh``: the
    target and its options; ``--sglang-path`` into the tree, ``--python`` this interpreter). Returns the
    ``CompletedProcess`` (``popen``: the ``Popen``). ``tree``: the tree's folder, or a test's server object that has
    one (``.tree``). The conftest fixtures ``local`` and ``ssh`` give one with ``cli_env``."""

    def __init__(self, env: dict[str, str], ssh: list[str] | None = None):
        self.env, self.ssh = env, ssh

    def target(self, tree: Any) -> list[str]:
        pkg = str(Path(getattr(tree, "tree", tree)) / "sglang")
        return [pkg] if self.ssh is None else [*self.ssh, "--sglang-path", pkg, "--python", PY]

    def run(self, cmd: str, tree: Any, *args: str, timeout: float = 200) -> subprocess.CompletedProcess:
        return subprocess.run([PY, "-m", "eaglepatch", cmd, *self.target(tree), *args], capture_output=True,
                              text=True, timeout=timeout, env=self.env)

    def popen(self, cmd: str, tree: Any, *args: str) -> subprocess.Popen:
        return subprocess.Popen([PY, "-m", "eaglepatch", cmd, *self.target(tree), *args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=self.env)


def cli_for_user(dest: Path, uid: int, gid: int) -> list[str]:
    """The CLI as another user can run it, wherever this checkout sits (under /root, inside a 0700 ``mktemp -d``):
    the eaglepatch package and the installed distributions it needs copied to ``dest`` (made readable by all), run
    by an interpreter of this one's Python version that ``uid`` can run (the system's, or this one's base when that
    user may reach it). Returns the command line (``python -m eaglepatch``, with its PYTHONPATH on it); the test
    FAILS, naming what is missing, when no such interpreter exists."""
    import importlib.metadata as md
    import shutil

    from packaging.requirements import Requirement

    site = dest / "site"
    site.mkdir(parents=True)
    repo = Path(__file__).resolve().parents[2]
    shutil.copytree(repo / "eaglepatch", site / "eaglepatch", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(repo / "patches", site / "eaglepatch" / "patches", ignore=shutil.ignore_patterns("__pycache__"))
    todo, seen = ["eaglepatch"], set()
    while todo:
        name = todo.pop().lower().replace("_", "-")
        if name in seen:
            continue
        seen.add(name)
        dist = md.distribution(name)
        for text in dist.requires or ():
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):  # no extras, this Python's markers
                todo.append(req.name)
        if name == "eaglepatch":
            continue  # copied from the checkout above (an editable install's files are its finder)
        for f in dist.files or ():
            if ".." in f.parts or "__pycache__" in f.parts:
                continue
            src = Path(dist.locate_file(f))
            if src.is_file():
                (site / f).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, site / f)
    for p in [dest, *dest.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    drop = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--"]
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    base = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    for cand in (f"/usr/bin/python{version}", f"/usr/local/bin/python{version}", base):
        probe = [*drop, cand, "-c", "import json, select, ssl, zlib, sys; print('%d.%d' % sys.version_info[:2])"]
        try:
            r = subprocess.run(probe, capture_output=True, text=True, timeout=30, cwd=dest,
                               stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if r.returncode == 0 and r.stdout.strip() == version:
            return ["env", f"PYTHONPATH={site}", cand, "-s", "-m", "eaglepatch"]
    import pytest

    pytest.fail(f"no Python {version} that uid {uid} may run (tried /usr/bin/python{version}, "
                f"/usr/local/bin/python{version}, {base}): install python{version} (Debian: python3)", pytrace=False)


def cli_env(tmp_path: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """The CLI's environment for one test: ``base`` (default this process's), its client cache (sweep state, fetched
    logs) in the test's folder, no EAGLEPATCH_DEBUG or EAGLEPATCH_FAILPOINT."""
    env = dict(base or os.environ)
    env["XDG_CACHE_HOME"] = str(tmp_path / "client cache")  # sweep state and fetched logs of this test only
    for name in ("EAGLEPATCH_DEBUG", "EAGLEPATCH_FAILPOINT"):
        env.pop(name, None)
    return env


def digest(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root`` (bytecode caches aside)."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


def identity(pid: int) -> dict[str, Any]:
    """What must survive a relaunch: argv (argv[0] included), cwd, environment, user, and the signals it
    ignores (a server started under nohup ignores SIGHUP)."""
    ident = H.proc_identity(pid)
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return {"argv": ident["argv"], "cwd": ident["cwd"], "env": ident["env"], "uid": status["Uid"].split()[1],
            "sig_ign": status["SigIgn"].strip()}


@dataclasses.dataclass
class Install:
    """One sglang install on the "host" and how its servers are launched."""

    kind: str  # pythonpath, venv-by-path, activated-venv, console-script, editable
    pkg: Path  # the sglang package directory
    launch: Callable[..., subprocess.Popen]  # (cwd, port, *args) -> Popen
    worker_name: str = "eagle_worker.py"

    @property
    def worker(self) -> Path:
        return self.pkg / "srt" / "speculative" / self.worker_name


def make_install(standins: Any, root: Path, kind: str, worker: str = WORKER) -> Install:
    """An install of the stand-in sglang under ``root``, launched the ``kind`` way; ``worker`` ADAPTIVE: the
    adaptive V2 files instead of an eagle_worker.py."""
    source = None if worker == ADAPTIVE else worker
    if kind == "pythonpath":
        tree = H.make_tree(root / "checkout", source)
        inst = Install(kind, tree / "sglang", lambda cwd, port, *a, **e: standins.launch(tree, cwd, port, *a, **e))
    elif kind == "editable":
        venv, checkout = H.make_editable(root, source)
        inst = Install(kind, checkout / "python" / "sglang",
                       lambda cwd, port, *a, **e: standins.launch_editable(venv, cwd, port, *a, **e))
    else:
        venv = H.make_venv(root / "venv", source)
        launch = {"venv-by-path": standins.launch_venv_by_path, "activated-venv": standins.launch_activated_venv,
                  "console-script": standins.launch_console_script}[kind]
        inst = Install(kind, H.site_packages(venv) / "sglang",
                       lambda cwd, port, *a, **e: launch(venv, cwd, port, *a, **e))
    if worker == ADAPTIVE:
        H.add_adaptive(inst.pkg)
        inst.worker_name = "eagle_worker_v2.py"
    return inst


def run_cli(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """The CLI as a user runs it (``python -m eaglepatch``), with ``env``."""
    return subprocess.run([sys.executable, "-m", "eaglepatch", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def ok_json(r: subprocess.CompletedProcess) -> Any:
    """A command's JSON, once it exited 0."""
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def patched_standin(standins: Any, tmp_path: Path, *args: str, **env: str) -> tuple[str, int, dict[str, str], Path]:
    """A stand-in sglang launched with ``args`` (and ``env``) in a tree of its own and patched by ``apply``, its
    timing logs in a folder of the test's: (target, port, the CLI's environment, the log folder)."""
    tree = H.make_tree(tmp_path / "site", H.V1_WORKER)
    port = standins.port()
    standins.launch(tree, tmp_path / "work", port, *args, **env)
    H.wait_http(port, timeout=30)
    cli_env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "client cache"))
    cli_env.pop("EAGLEPATCH_DEBUG", None)
    target, logs = str(tree / "sglang"), tmp_path / "timing logs"
    ok_json(run_cli(cli_env, "apply", target, "--log-dir", str(logs), "--timeout", "60", "--json"))
    return target, port, cli_env, logs


def up(install: Install, standins: Any, cwd: Path, *args: str, port: int | None = None, **env: str):
    """Launch a server of ``install`` and wait until it answers; returns (port, Popen)."""
    port = port or standins.port()
    proc = install.launch(cwd, port, "--startup-delay", "0.3", "--tp", "1", *args, **env)
    H.wait_http(port, timeout=30)
    return port, proc


def up_nohup(install: Install, standins: Any, cwd: Path, port: int, log: Path):
    """``nohup <venv>/bin/python -m sglang.launch_server --port PORT ... > log 2>&1`` from a shell, ready."""
    venv = install.pkg.parents[3]
    argv = ["nohup", str(venv / "bin" / "python"), "-m", "sglang.launch_server", "--port", str(port), "--tp", "1",
            "--startup-delay", "0.3"]
    proc = standins.spawn(argv, cwd, standins.venv_env(venv), port=port, log=log)
    H.wait_http(port, timeout=30)
    return proc


def servers(cli: CLI, pkg: Path) -> list[dict[str, Any]]:
    """``status --json``'s servers of the install."""
    return cli.run("status", pkg, "--json").expect(0).json()["servers"]


# ------------------------------------------------------------------------------------------------------------
# The fault table


class FaultTable:
    """Rows of docs/safety.md, as the crash tests observed them."""

    def __init__(self) -> None:
        self.rows: list[dict[str, str]] = []

    def add(self, **row: str) -> None:
        self.rows.append(row)

    def write(self, path: str) -> None:
        Path(path).write_text(json.dumps(sorted(self.rows, key=lambda r: r["order"]), indent=1) + "\n")


def render(rows: list[dict[str, str]]) -> str:
    head = ("| # | command | killed (SIGKILL) | what eaglepatch had done | state right after (`status`) | "
            "then | state after that |\n|---|---|---|---|---|---|---|\n")
    body = "".join(f"| {i} | `{r['command']}` | {r['fault']} | {r['did']} | {r['after']} | `{r['then']}` | "
                   f"{r['final']} |\n" for i, r in enumerate(rows, 1))
    return head + body


if __name__ == "__main__":  # python tests/e2e/safety.py ROWS.json docs/safety.md
    rows = json.loads(Path(sys.argv[1]).read_text())
    doc = Path(sys.argv[2])
    text = doc.read_text()
    start, end = "<!-- fault-table:start -->\n", "<!-- fault-table:end -->"
    a, b = text.index(start) + len(start), text.index(end)
    doc.write_text(text[:a] + render(rows) + text[b:])
    print(f"{len(rows)} rows written to {doc}")
