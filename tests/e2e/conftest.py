"""A real OpenSSH server on 127.0.0.1 for the end-to-end tests (session-scoped), and client HOMEs that trust it.

Fixtures:

- ``sshd``: an ``SSHServer`` (host, port, user, client_key, other_key, host_pub_key, home, ...); its logins get
  ``EAGLEPATCH_STATE_DIR``, the session's folder (``SetEnv``; tests/conftest.py). ``sshd.home`` is a
  HOME whose ``.ssh/known_hosts`` knows the server's key for ``[127.0.0.1]:PORT`` and whose ``.ssh/config`` has
  ``Host testbox`` (HostName 127.0.0.1, Port, User, IdentityFile) and ``Host testbox-jump`` (the same, reached
  with ``ProxyJump testbox``). Treat it as read-only; ``sshd.make_home(dir, known=...)`` builds a private one.
- ``ssh_home``: sets HOME to ``sshd.home`` and removes SSH_AUTH_SOCK for the test (monkeypatch); returns the HOME.
- ``ssh_home_unknown`` / ``ssh_home_changed``: the same with a fresh HOME whose known_hosts lacks the server's key /
  holds a different ed25519 key for ``[127.0.0.1]:PORT``.
- ``ssh_env``: ``env_for(sshd)``, the environment for a subprocess (the CLI) with that HOME and no ssh-agent.
- ``standins``: the stand-in sglang servers this test starts (safety.py's ``H.StandIns``), stopped at its end.
- ``local`` / ``ssh``: ``safety.Via``, ``python -m eaglepatch`` on a stand-in's tree by its path / over ``sshd``;
  ``local_cli`` / ``ssh_cli``: ``safety.CLI``, the installed CLI on an install the same two ways. Each with
  ``safety.cli_env`` (this test's client cache, no EAGLEPATCH_DEBUG or EAGLEPATCH_FAILPOINT).

The plain helpers (``SSHServer``, ``env_for``, starting another sshd for a test: ``start_sshd``) are in
sshd_server.py; the CLI's are in cli_helpers.py.

The server never gets skipped: when sshd is missing or cannot start, every test that uses it FAILS with the reason
(``make test`` installs Debian's openssh-server and tcsh; CI runs as root).
"""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sshd_server import SSHD, SSHServer, env_for, free_port, keygen, stop_sshd, wait_for_banner


# ``make test`` runs the tests side by side with ``-n 4 --dist loadscope --no-loadscope-reorder`` (pytest-xdist): a
# file is one unit of work (its module fixtures set up once, as with --dist loadfile), a test class one of its own
# (test_crash_safety.py's faults come in three), and the units go to the workers in the order of the collection,
# each worker taking the next when it runs dry. SLOW_FIRST: the files that take longest (``pytest --durations``),
# longest first, moved ahead of everything else (the rest keep their order): a long unit started last would run
# alone at the end while the other workers sit idle (test_newcomer_path.py's one test of ~3 min did).
SLOW_FIRST = (
    "test_newcomer_path.py",
    "test_crash_safety.py",
    "test_multinode_refusal.py",
    "test_multinode_restart.py",
    "test_known_models.py",
    "test_server_identity.py",
    "test_hostile_host.py",
    "test_live_sweep.py",
    "test_bench_sweep.py",
    "test_sweep_safety.py",
    "test_prompts_e2e.py",
    "test_login_shells.py",
    "test_doctor.py",
    "test_first_minutes.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a pytest-xdist worker (whose collection order is the order the units are handed out in): SLOW_FIRST's files
    first. A run without xdist keeps the plain order."""
    if not hasattr(config, "workerinput"):
        return
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file's tests in their order


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory, eaglepatch_state_dir: str):
    if not os.access(SSHD, os.X_OK):
        pytest.fail(
            f"{SSHD} not found: the e2e tests need Debian's openssh-server (run 'make sshd' or "
            "'apt-get install openssh-server' as root)",
            pytrace=False,
        )
    root = tmp_path_factory.mktemp("sshd")
    os.chmod(root, 0o755)
    host_pub = keygen(root / "ssh_host_ed25519_key", "eaglepatch-test-host")
    wrong_pub = keygen(root / "wrong_host_ed25519_key", "eaglepatch-test-wrong-host")
    client_pub = keygen(root / "client_key", "eaglepatch-test-client")
    keygen(root / "other_key", "eaglepatch-test-other")
    (root / "authorized_keys").write_text(client_pub + "\n")
    os.chmod(root / "authorized_keys", 0o600)
    user = pwd.getpwuid(os.geteuid()).pw_name
    if os.geteuid() == 0:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # privilege separation directory

    log = root / "sshd.log"
    proc = None
    port = 0
    for _attempt in range(5):
        port = free_port()
        cfg = root / "sshd_config"
        cfg.write_text(
            f"ListenAddress 127.0.0.1\n"
            f"Port {port}\n"
            f"HostKey {root / 'ssh_host_ed25519_key'}\n"
            f"PidFile {root / 'sshd.pid'}\n"
            f"AuthorizedKeysFile {root / 'authorized_keys'}\n"
            "PermitRootLogin yes\n"
            "PubkeyAuthentication yes\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "UsePAM no\n"
            "StrictModes no\n"
            "Subsystem sftp internal-sftp\n"
            "AllowTcpForwarding yes\n"
            "X11Forwarding no\n"
            "PrintMotd no\n"
            "PrintLastLog no\n"
            "UseDNS no\n"
            "MaxStartups 100\n"
            "MaxSessions 100\n"
            "LogLevel VERBOSE\n"
            # eaglepatch's own files on this "host" (a relaunched server's log, start script, relaunch lock): the
            # session's folder (tests/conftest.py), never the shared /tmp/eaglepatch
            f'SetEnv EAGLEPATCH_STATE_DIR="{eaglepatch_state_dir}"\n'
        )
        with open(log, "ab") as logf:
            proc = subprocess.Popen(
                [SSHD, "-D", "-e", "-f", str(cfg)],
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, apart from pytest's
            )
        if wait_for_banner(proc, port, time.monotonic() + 15):
            break
        stop_sshd(proc)
        text = log.read_text(errors="replace")
        proc = None
        if "Address already in use" not in text:
            break
    if proc is None:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        pytest.fail(f"sshd did not start on 127.0.0.1 ({SSHD} -D -e -f {root / 'sshd_config'}):\n{tail}", pytrace=False)

    server = SSHServer(
        host="127.0.0.1",
        port=port,
        user=user,
        client_key=str(root / "client_key"),
        other_key=str(root / "other_key"),
        host_pub_key=" ".join(host_pub.split()[:2]),
        wrong_host_pub_key=" ".join(wrong_pub.split()[:2]),
        home=str(root / "home"),
        root=str(root),
        log=str(log),
    )
    server.make_home(server.home, known="ok")
    try:
        yield server
    finally:
        stop_sshd(proc)


@pytest.fixture
def ssh_home(sshd: SSHServer, monkeypatch: pytest.MonkeyPatch) -> str:
    """HOME = the trusting home of ``sshd``, no ssh-agent, for this test."""
    monkeypatch.setenv("HOME", sshd.home)
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return sshd.home


@pytest.fixture
def ssh_home_unknown(sshd: SSHServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """HOME with the testbox aliases but no known_hosts, for this test."""
    home = sshd.make_home(tmp_path / "home-unknown", known="none")
    monkeypatch.setenv("HOME", home)
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return home


@pytest.fixture
def ssh_home_changed(sshd: SSHServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """HOME whose known_hosts holds a different ed25519 key for ``[127.0.0.1]:PORT``, for this test."""
    home = sshd.make_home(tmp_path / "home-changed", known="changed")
    monkeypatch.setenv("HOME", home)
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return home


@pytest.fixture
def ssh_env(sshd: SSHServer) -> dict[str, str]:
    """Environment for a subprocess (the CLI): HOME = ``sshd.home``, no ssh-agent."""
    return env_for(sshd)


@pytest.fixture(scope="session", autouse=True)
def private_timing_logs(tmp_path_factory: pytest.TempPathFactory):
    """The session's timing log folder for every apply that names none (logdir.py): never the shared
    /tmp/eaglepatch."""
    import logdir

    folder = tmp_path_factory.mktemp("timing-logs")
    os.chmod(folder, 0o700)
    os.environ[logdir.ENV] = str(folder)
    try:
        yield str(folder)
    finally:
        os.environ.pop(logdir.ENV, None)


@pytest.fixture
def standins():
    """Stand-in sglang servers (tests/stubs/stand_in_sglang) that this test starts; cleanup stops only those (by
    the harness's owner token)."""
    from safety import H

    s = H.StandIns(sys.executable)
    try:
        yield s
    finally:
        s.cleanup()


@pytest.fixture
def local(tmp_path: Path):
    """``safety.Via``: the CLI on a stand-in's tree by its local path, with this test's client cache."""
    from safety import Via, cli_env

    return Via(cli_env(tmp_path))


@pytest.fixture
def ssh(sshd: SSHServer, tmp_path: Path):
    """``safety.Via``: the CLI on a stand-in's tree over ``sshd`` (``--sglang-path``, ``--python``), with this test's
    client cache."""
    from safety import Via, cli_env

    return Via(cli_env(tmp_path, sshd.env()), ssh=[sshd.target, "-i", sshd.client_key])


@pytest.fixture
def local_cli(tmp_path: Path):
    """``safety.CLI`` on an install by its local path, with this test's client cache."""
    from safety import CLI, cli_env

    return CLI("local", cli_env(tmp_path))


@pytest.fixture
def ssh_cli(sshd: SSHServer, tmp_path: Path):
    """``safety.CLI`` on an install over ``sshd`` (``--sglang-path``), with this test's client cache."""
    from safety import CLI, cli_env

    return CLI("ssh", cli_env(tmp_path, sshd.env()), ssh=[sshd.target, "-i", sshd.client_key])
