"""Test-side helpers for the stand-in sglang server: a private copy of the stub tree, free ports, launching it the
way a user would, waiting for it, and killing everything it left behind.

Load it by path (it is not a package on the tests' path, on purpose: ``import sglang`` in the test process must
not find the stub)::

    spec = importlib.util.spec_from_file_location("standin_harness", STUBS / "stand_in_sglang" / "standin_harness.py")

Standard library only.
"""

from __future__ import annotations

import json
import os
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


def launcher_pids(port: int) -> list[int]:
    """Stand-in (or any sglang) launchers on this machine whose command line says ``--port PORT``."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv = f.read().rstrip(b"\0").split(b"\0")
        except OSError:
            continue
        if b"sglang.launch_server" in argv and any(
            a == b"--port" and i + 1 < len(argv) and argv[i + 1] == str(port).encode() for i, a in enumerate(argv)
        ):
            if alive(int(name)):
                out.append(int(name))
    return out


def _kill_tree(pid: int) -> None:
    """SIGKILL ``pid``, its process group when it leads one (never a group it does not lead: that may be
    pytest's own), and its descendants."""
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    text = f.read().decode("ascii", "replace")
            except OSError:
                continue
            fields = text[text.rfind(")") + 2 :].split()
            kids.setdefault(int(fields[1]), []).append(int(name))
    todo, tree = [pid], []
    while todo:
        p = todo.pop()
        tree.append(p)
        todo.extend(kids.get(p, ()))
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    for p in tree:
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass


class StandIns:
    """Launches stand-ins for one test and, at ``cleanup``, kills every launcher on the ports it handed out
    (the servers eaglepatch relaunched included), with their children."""

    def __init__(self, python: str = sys.executable):
        self.python = python
        self.ports: set[int] = set()
        self.procs: list[subprocess.Popen] = []
        self.orphans: list[int] = []  # other pids a test made, killed at cleanup

    def port(self) -> int:
        port = free_port()
        self.ports.add(port)
        return port

    def env(self, tree: Path, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("PYTHONHOME", None)
        env["PYTHONPATH"] = str(tree)
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env.update(extra)
        return env

    def argv(self, port: int, *args: str) -> list[str]:
        return [self.python, "-m", "sglang.launch_server", "--port", str(port), *args]

    def launch(self, tree: Path, cwd: Path, port: int, *args: str, log: Path | None = None, **env: str):
        """Start a stand-in the way a user would from a shell: its own process group, output to ``log``."""
        self.ports.add(port)
        cwd.mkdir(parents=True, exist_ok=True)
        out = open(log or (cwd / f"stand-in-{port}.log"), "ab")
        proc = subprocess.Popen(
            self.argv(port, *args),
            cwd=cwd,
            env=self.env(tree, **env),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        out.close()
        self.procs.append(proc)
        # reap it as soon as it exits, as a shell would: a zombie child of pytest still "exists" for kill -0
        threading.Thread(target=proc.wait, daemon=True).start()
        return proc

    def cleanup(self) -> None:
        for pid in self.orphans:
            if alive(pid):
                _kill_tree(pid)
        for port in self.ports:
            for pid in launcher_pids(port):
                _kill_tree(pid)
        for proc in self.procs:
            if proc.poll() is None:
                _kill_tree(proc.pid)
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
