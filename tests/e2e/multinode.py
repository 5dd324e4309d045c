"""Two SSH "hosts" on this machine for the multi-node end-to-end tests (issue 40), and a 2-node stand-in sglang
server on them (``TwoNodes``), used by test_multinode_restart.py and test_multinode_read.py.

- Host 0 is conftest.py's session sshd, reached by its ``testbox`` alias.
- Host 1 (the ``host1`` fixture, one per test module) is a second OpenSSH sshd on a port of its own on 127.0.0.1,
  from the same set-up (its keys, its config), reached by the alias ``testbox1``, with a folder of its own
  (``Host1.root``): its sglang tree (``Host1.site``, rebuilt by each ``TwoNodes``) and its eaglepatch state folder
  (``EAGLEPATCH_STATE_DIR``, so relaunch locks and start scripts are its own, as on another machine). Its logins
  get ``TESTHOST_SGLANG_SITE=<Host1.site>`` (sshd's ``SetEnv``), the host's "own environment"; the session's sshd
  sets no such variable. No network namespaces (CI may not allow ``unshare``): both hosts see every process of
  this machine, so neither could pick its install from the servers it sees (two installs serve here: exit 2), and
  both are given the same ``--python``.
- ``--python`` (``TwoNodes.python``) is one absolute path on both hosts, as ``/opt/venv/bin/python`` is on a
  cluster, that sees each host's own install: a wrapper of this interpreter whose PYTHONPATH is the host's
  ``TESTHOST_SGLANG_SITE``, node 0's tree where the login sets none. So the CLI names two SSH TARGETs, ``testbox``
  and ``testbox1``, with nothing per target (``--sglang-path`` would name one folder for both).
- ``Host1.home``: a client HOME whose ``~/.ssh/config`` has both aliases and whose known_hosts knows both ports.

``TwoNodes(..., node1="local")`` names node 1 by its local path instead (a local and an SSH TARGET in one command).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli_helpers import EAGLEPATCH
from logdir import with_log_dir
from safety import H, Result, digest, identity
from sshd_server import SSHD, SSHServer, env_for, free_port, stop_sshd, wait_for_banner

ALIAS1 = "testbox1"
SITE_VAR = "TESTHOST_SGLANG_SITE"  # host 1's own environment (sshd SetEnv): where its python finds sglang


@dataclasses.dataclass(frozen=True)
class Host1:
    port: int
    alias: str  # "testbox1"
    root: Path  # the host's folder
    site: Path  # its sglang tree (a PYTHONPATH root): root / "node1 site"
    state: Path  # its EAGLEPATCH_STATE_DIR
    home: str  # a client HOME with the aliases testbox and testbox1, knowing both hosts' keys
    log: Path  # its sshd's log

    def env(self, sshd: SSHServer) -> dict[str, str]:
        """The CLI's environment: HOME = ``home``, no ssh-agent."""
        return env_for(sshd, self.home)


@pytest.fixture(scope="module")
def host1(sshd: SSHServer, tmp_path_factory: pytest.TempPathFactory):
    """A second sshd (host 1) for this test module; stopped at its end."""
    root = tmp_path_factory.mktemp("host1")
    os.chmod(root, 0o755)
    state = root / "state"
    state.mkdir(mode=0o700)
    site = root / "node1 site"
    cfg = (Path(sshd.root) / "sshd_config").read_text()
    cfg = re.sub(r"^PidFile .*$", f"PidFile {root / 'sshd.pid'}", cfg, flags=re.M)
    # sshd takes the first SetEnv line alone: this host's replaces the session's
    cfg = re.sub(r"^SetEnv .*$", f'SetEnv EAGLEPATCH_STATE_DIR="{state}" {SITE_VAR}="{site}"', cfg, flags=re.M)
    log = root / "sshd.log"
    proc = None
    for _attempt in range(5):
        port = free_port()
        (root / "sshd_config").write_text(re.sub(r"^Port \d+$", f"Port {port}", cfg, flags=re.M))
        with open(log, "ab") as logf:
            proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(root / "sshd_config")], stdin=subprocess.DEVNULL,
                                    stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
        if wait_for_banner(proc, port, time.monotonic() + 15):
            break
        stop_sshd(proc)
        proc = None
        if "Address already in use" not in log.read_text(errors="replace"):
            break
    if proc is None:
        pytest.fail(f"the second sshd did not start:\n{log.read_text(errors='replace')[-3000:]}", pytrace=False)
    home = sshd.make_home(root / "client home", known="ok")
    with open(Path(home) / ".ssh" / "config", "a") as f:
        f.write(f"\nHost {ALIAS1}\n    HostName {sshd.host}\n    Port {port}\n    User {sshd.user}\n"
                f"    IdentityFile {sshd.client_key}\n")
    with open(Path(home) / ".ssh" / "known_hosts", "a") as f:
        f.write(f"[{sshd.host}]:{port} {sshd.host_pub_key}\n")
    try:
        yield Host1(port=port, alias=ALIAS1, root=root, site=site, state=state, home=home, log=log)
    finally:
        stop_sshd(proc)


def python_for_hosts(tree0: Path, workdir: Path) -> str:
    """The ``--python`` of both hosts: this interpreter with PYTHONPATH the login's ``TESTHOST_SGLANG_SITE``, else
    ``tree0`` (and PYTHONSAFEPATH, which keeps the working directory off sys.path and marks eaglepatch's programs on
    the hosts: ``TwoNodes.helpers``)."""
    b = workdir / "bin"
    b.mkdir(exist_ok=True)
    w = b / "python3"
    w.write_text("#!/bin/sh\n"
                 f"site={shlex.quote(str(tree0))}\n"
                 f'if [ -n "${{{SITE_VAR}:-}}" ]; then site=${SITE_VAR}; fi\n'
                 f'PYTHONSAFEPATH=1 PYTHONPATH="$site" exec {shlex.quote(sys.executable)} "$@"\n')
    w.chmod(0o755)
    return str(w)


class TwoNodes:
    """A 2-node stand-in server (``--nnodes 2 --node-rank R --dist-init-addr ADDR``, with ``--standin-rendezvous``
    unless ``rendezvous`` is False: then every node serves HTTP and runs the cycles of what it is sent), node 0 on
    host 0 (``testbox``), node 1 on host 1 (``testbox1``; ``node1="local"``: its tree by its local path), each from
    a tree of its own, and the CLI naming both. ``node0``: node 0's own extra flags; ``extra``: both nodes'."""

    def __init__(self, standins, tmp_path: Path, sshd: SSHServer, host1: Host1, worker1: str = H.V1_WORKER,
                 node0: tuple[str, ...] = (), node1: str = "ssh", rendezvous: bool = True,
                 extra: tuple[str, ...] = ()):
        assert node1 in ("ssh", "local")
        self.standins, self.tmp, self.node0, self.extra, self.rendezvous = standins, tmp_path, node0, extra, rendezvous
        self.addr = f"127.0.0.1:{standins.port()}"
        if node1 == "ssh":
            shutil.rmtree(host1.site, ignore_errors=True)  # the tree of the module's previous test
            site1 = host1.site
        else:
            site1 = tmp_path / "node1 site"
        self.trees = [H.make_tree(tmp_path / "node0 site", H.V1_WORKER), H.make_tree(site1, worker1)]
        self.ports = [standins.port(), standins.port()]
        self.env = host1.env(sshd)
        self.targets = [sshd.alias, host1.alias if node1 == "ssh" else str(self.trees[1] / "sglang")]
        self.python = python_for_hosts(self.trees[0], tmp_path)
        self.procs = [self.launch(r) for r in (1, 0)][::-1]  # node 1 first: it waits for node 0, whatever the order
        self.wait_ready()
        self.first = [identity(p.pid) for p in self.procs]
        self.pristine = self.digests()

    def launch(self, rank: int) -> subprocess.Popen:
        return self.standins.launch(self.trees[rank], self.tmp / f"node{rank} work", self.ports[rank],
                                    "--nnodes", "2", "--node-rank", str(rank), "--dist-init-addr", self.addr,
                                    *(("--standin-rendezvous",) if self.rendezvous else ()), *self.extra,
                                    *(self.node0 if rank == 0 else ()))

    def wait_ready(self) -> None:
        """Rank 0 ready (with the rendezvous: node 1 joined it); without it, every node ready."""
        for port in self.ports if not self.rendezvous else self.ports[:1]:
            H.wait_http(port, timeout=30)

    def run(self, cmd: str, *args: str, env: dict[str, str] | None = None) -> Result:
        argv = [*EAGLEPATCH, cmd, *with_log_dir(cmd, args), "--python", self.python, *self.targets]
        p = subprocess.run(argv, capture_output=True, text=True, timeout=240, env=dict(self.env, **(env or {})),
                           stdin=subprocess.DEVNULL, cwd=self.tmp)
        return Result(argv, p.returncode, p.stdout, p.stderr)

    def digests(self) -> list[dict[str, str]]:
        return [digest(t) for t in self.trees]

    def pids(self) -> list[list[int]]:
        return [self.standins.launcher_pids(p) for p in self.ports]

    def worker(self, rank: int) -> bytes:
        return H.worker_file(self.trees[rank]).read_bytes()

    def joined(self) -> int:
        """How many times node 0's server has seen node 1 join (its log, appended to by each relaunch)."""
        log = self.tmp / "node0 work" / f"stand-in-{self.ports[0]}.log"
        return log.read_text(errors="replace").count("all 2 nodes joined")

    def helpers(self) -> list[int]:
        """eaglepatch's programs on the hosts still running for this test's command (run by ``self.python``,
        which puts PYTHONSAFEPATH=1 and the host's tree in their environment; the servers have no
        PYTHONSAFEPATH)."""
        marks = {f"PYTHONPATH={t}".encode() for t in self.trees}
        out = []
        for d in Path("/proc").iterdir():
            try:
                env = (d / "environ").read_bytes().split(b"\0") if d.name.isdigit() else []
            except OSError:
                continue
            if b"PYTHONSAFEPATH=1" in env and marks.intersection(env):
                out.append(int(d.name))
        return out

    def settle(self) -> None:
        """Wait until the programs eaglepatch left on the hosts have ended: each finishes its request, then sees its
        client gone (the end of its input) and exits."""
        deadline = time.monotonic() + 60
        while self.helpers():
            assert time.monotonic() < deadline, f"eaglepatch's programs still run: {self.helpers()}"
            time.sleep(0.1)

    def up(self) -> list[int]:
        """Both nodes running, one launcher each, rank 0 ready (so node 1 joined it); their pids."""
        self.wait_ready()
        pids = self.pids()
        assert all(len(p) == 1 for p in pids), f"not one server per node: {pids}"
        assert all(H.alive(p[0]) for p in pids)
        return [p[0] for p in pids]
