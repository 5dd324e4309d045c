"""A real OpenSSH server on 127.0.0.1 for the end-to-end tests: what a test knows of one (``SSHServer``), the
environment of a client that trusts it, and starting and stopping sshd: the session's (conftest.py's ``sshd``
fixture) and, for a test that needs other settings (a ``ForceCommand``, a log level), another one from the same
set-up (``start_sshd``; the test stops it with ``stop_sshd``).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

SSHD = "/usr/sbin/sshd"
ALIAS = "testbox"
JUMP_ALIAS = "testbox-jump"


@dataclasses.dataclass(frozen=True)
class SSHServer:
    host: str  # "127.0.0.1"
    port: int
    user: str  # the user running the tests (sshd logs in as the same user)
    client_key: str  # private key the server accepts
    other_key: str  # a valid private key the server does not accept
    host_pub_key: str  # "ssh-ed25519 AAAA... " line of the server's host key
    wrong_host_pub_key: str  # a different ed25519 public key, for the "changed host key" case
    home: str  # a HOME that trusts the server and has the testbox aliases; read-only
    root: str  # the temporary folder with keys, config, log
    log: str  # sshd's log (-e)
    alias: str = ALIAS
    jump_alias: str = JUMP_ALIAS

    @property
    def known_hosts_name(self) -> str:
        return f"[{self.host}]:{self.port}"

    @property
    def target(self) -> str:
        """``user@127.0.0.1:PORT``"""
        return f"{self.user}@{self.host}:{self.port}"

    def known_hosts_line(self, pub: str | None = None) -> str:
        return f"{self.known_hosts_name} {pub or self.host_pub_key}\n"

    def make_home(self, path: str | os.PathLike, known: str = "ok", config: bool = True) -> str:
        """Create a HOME at ``path``: ``known`` is ``"ok"`` (the server's key), ``"none"`` (no known_hosts) or
        ``"changed"`` (a different key for the same entry); ``config`` writes the testbox aliases."""
        home = Path(path)
        ssh_dir = home / ".ssh"
        ssh_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(ssh_dir, 0o700)
        if known == "ok":
            (ssh_dir / "known_hosts").write_text(self.known_hosts_line())
        elif known == "changed":
            (ssh_dir / "known_hosts").write_text(self.known_hosts_line(self.wrong_host_pub_key))
        elif known != "none":
            raise ValueError(f"known must be ok, none or changed, not {known!r}")
        if config:
            (ssh_dir / "config").write_text(
                f"Host {self.alias}\n"
                f"    HostName {self.host}\n"
                f"    Port {self.port}\n"
                f"    User {self.user}\n"
                f"    IdentityFile {self.client_key}\n"
                f"\n"
                f"Host {self.jump_alias}\n"
                f"    HostName {self.host}\n"
                f"    Port {self.port}\n"
                f"    User {self.user}\n"
                f"    IdentityFile {self.client_key}\n"
                f"    ProxyJump {self.alias}\n"
            )
            os.chmod(ssh_dir / "config", 0o600)
        return str(home)

    def env(self, home: str | None = None) -> dict[str, str]:
        return env_for(self, home)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(Path(self.log).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def env_for(sshd: SSHServer, home: str | None = None) -> dict[str, str]:
    """os.environ with HOME set to ``home`` (default ``sshd.home``) and no ssh-agent (SSH_AUTH_SOCK removed)."""
    env = dict(os.environ)
    env["HOME"] = home or sshd.home
    env.pop("SSH_AUTH_SOCK", None)
    return env


def keygen(path: Path, comment: str) -> str:
    """A new ed25519 key pair at ``path`` (no passphrase); its public line. Fails the test without ssh-keygen."""
    program = shutil.which("ssh-keygen") or "/usr/bin/ssh-keygen"
    try:
        subprocess.run(
            [program, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
            check=True,
            capture_output=True,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.fail(f"ssh-keygen failed ({exc}): install openssh-client/openssh-server (make sshd)", pytrace=False)
    os.chmod(path, 0o600)
    return Path(str(path) + ".pub").read_text().strip()


def free_port() -> int:
    """A TCP port of 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_banner(proc: subprocess.Popen, port: int, deadline: float) -> bool:
    """True once sshd ``proc`` answers on ``port`` with its SSH banner; False if it exits or ``deadline`` passes."""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.settimeout(2)
                if s.recv(64).startswith(b"SSH-2.0-"):
                    return True
        except OSError:
            pass
        time.sleep(0.05)
    return False


def stop_sshd(proc: subprocess.Popen) -> None:
    """Stop an sshd this module started (its process group: TERM, then KILL after 5 s)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)  # the group we created (connection children end with their clients)
        except ProcessLookupError:
            pass
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def start_sshd(
    sshd: SSHServer, force: str, tmp: Path, loglevel: str | None = None
) -> tuple[subprocess.Popen, SSHServer]:
    """Another sshd from the set-up of ``sshd`` (its keys, its config) on a port of its own, with ``force`` (a
    ``ForceCommand`` line, or "") appended and ``loglevel`` in place of its own; its config, pid file, log
    (``tmp/sshd.log``) and a trusting HOME in ``tmp``; its logins get the session's ``EAGLEPATCH_STATE_DIR`` as
    the session's sshd's do (its ``SetEnv``, kept with the rest of its config). Returns the process (for
    ``stop_sshd``) and its ``SSHServer``."""
    port = free_port()
    cfg = (Path(sshd.root) / "sshd_config").read_text()
    cfg = re.sub(r"^Port \d+$", f"Port {port}", cfg, flags=re.M)
    if loglevel:  # sshd takes a keyword's first value: replace it, do not append
        cfg = re.sub(r"^LogLevel .*$", f"LogLevel {loglevel}", cfg, flags=re.M)
    cfg = re.sub(r"^PidFile .*$", f"PidFile {tmp}/sshd.pid", cfg, flags=re.M)
    (tmp / "sshd_config").write_text(cfg + force + "\n")
    log = open(tmp / "sshd.log", "ab")
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(tmp / "sshd_config")], stdin=subprocess.DEVNULL,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    assert wait_for_banner(proc, port, time.monotonic() + 15), (tmp / "sshd.log").read_text()
    srv = dataclasses.replace(sshd, port=port, home=str(tmp / "home"))
    srv.make_home(srv.home, known="ok")
    return proc, srv
