"""The SSH config, resolved as OpenSSH resolves it (``ssh -G``; paramiko's SSHConfig when there is no ssh), end to end
against the real sshd of conftest.py: each test writes a HOME with its own ``.ssh/config`` and connects.

HOME is a temporary folder here, not the passwd entry's home that ssh itself would read: eaglepatch then gives
``ssh -G`` a config that includes ``$HOME/.ssh/config`` (see eaglepatch/hosts/ssh_config.py), so these tests go
through ``ssh -G`` unless they take ssh off PATH; each asserts which way it went.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

import cli_helpers as h
from eaglepatch.errors import ConnectionFailed, UsageError
from eaglepatch.hosts import ssh_config
from eaglepatch.hosts.ssh import SSHHost
from eaglepatch.hosts.spec import SSHOptions
from eaglepatch.hosts.target import open_host, parse_target

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

KEYGEN = shutil.which("ssh-keygen") or "/usr/bin/ssh-keygen"  # looked up now: some tests take ssh off PATH


def _open(target: str, **options) -> SSHHost:
    host = open_host(parse_target(target, SSHOptions(**options)))
    assert isinstance(host, SSHHost)
    return host


def _box(sshd, name: str, *extra: str, port: int | None = None, key: str | None = None) -> str:
    """A ``Host`` block that reaches the test server (or ``port`` on 127.0.0.1), plus ``extra`` lines."""
    lines = [f"Host {name}", f"    HostName {sshd.host}", f"    Port {port or sshd.port}", f"    User {sshd.user}",
             f"    IdentityFile {key or sshd.client_key}", *(f"    {x}" for x in extra)]
    return "\n".join(lines) + "\n\n"


def _home(sshd, tmp_path: Path, monkeypatch, config: str, known: str = "ok", name: str = "home") -> Path:
    """A HOME (known_hosts as ``known`` says) whose .ssh/config is ``config``, in force for this test, no agent."""
    home = Path(sshd.make_home(tmp_path / name, known=known, config=False))
    (home / ".ssh" / "config").write_text(config)
    os.chmod(home / ".ssh" / "config", 0o600)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return home


def _known_keys(known_hosts, name: str) -> list[str]:
    """The keys ssh-keygen finds for ``name`` in a known_hosts file (hashed entries included)."""
    r = subprocess.run([KEYGEN, "-F", name, "-f", str(known_hosts)], capture_output=True, text=True)
    return [" ".join(line.split()[1:3]) for line in r.stdout.splitlines() if line and not line.startswith("#")]


@pytest.fixture
def silent_port():
    """A TCP listener on 127.0.0.1 that accepts connections and never says a word (no SSH banner)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            held.append(conn)

    threading.Thread(target=accept, daemon=True).start()
    yield srv.getsockname()[1]
    stop.set()
    srv.close()
    for c in held:
        c.close()


@pytest.fixture
def no_ssh_on_path(tmp_path, monkeypatch):
    """PATH = one empty folder: no ssh (eaglepatch looks it up on PATH; what else these tests run, they run by
    absolute path)."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    assert ssh_config.find_ssh() is None


# ------------------------------------------------------------------------------------------------------ Include


@pytest.mark.parametrize("include", ["~/.ssh/conf.d/*", "conf.d/*.conf"])
def test_host_from_an_included_file(sshd, tmp_path, monkeypatch, include):
    """A host defined only in a file that ``Include`` names resolves and connects. paramiko's SSHConfig ignores
    Include (what eaglepatch used to read): there ``incbox`` stayed a host name, which does not resolve. A relative
    Include is taken from ~/.ssh, as OpenSSH does."""
    home = _home(sshd, tmp_path, monkeypatch, f"Include {include}\n\nHost *\n    ServerAliveInterval 30\n")
    conf_d = home / ".ssh" / "conf.d"
    conf_d.mkdir()
    (conf_d / "gpu.conf").write_text(_box(sshd, "incbox"))
    with _open("incbox") as host:
        assert [r.source for r in host.resolved] == ["ssh -G"]
        assert host.destination == f"incbox ({sshd.user}@127.0.0.1:{sshd.port})"
        assert host.run(["echo", "included"]).stdout == b"included\n"


def test_proxyjump_hop_resolved_with_ssh_g(sshd, tmp_path, monkeypatch):
    """A ProxyJump hop is itself a config alias (from an included file): it is resolved with ``ssh -G`` too, so its
    HostName, Port, User and key are those of its own block."""
    home = _home(sshd, tmp_path, monkeypatch, "Include conf.d/*\n" + _box(sshd, "viajump", "ProxyJump jumpbox"))
    (home / ".ssh" / "conf.d").mkdir()
    (home / ".ssh" / "conf.d" / "jump").write_text(_box(sshd, "jumpbox"))
    with _open("viajump") as host:
        assert [(r.name, r.hostname, r.port, r.source) for r in host.resolved] == [
            ("jumpbox", "127.0.0.1", sshd.port, "ssh -G"), ("viajump", "127.0.0.1", sshd.port, "ssh -G")]
        assert len(host._hops) == 1
        assert host.run(["echo", "jumped"]).stdout == b"jumped\n"


def test_proxyjump_loop_is_refused(sshd, tmp_path, monkeypatch):
    """``a`` jumps through ``b``, which jumps through ``a``: ssh would start ssh after ssh; eaglepatch says so."""
    _home(sshd, tmp_path, monkeypatch, _box(sshd, "loopa", "ProxyJump loopb") + _box(sshd, "loopb", "ProxyJump loopa"))
    with pytest.raises(UsageError, match=r"loop \(loopa -> loopb -> loopa\)"):
        _open("loopa")


def test_proxyjump_given_by_address_goes_through_that_jump(sshd, tmp_path, monkeypatch):
    """``ProxyJump USER@127.0.0.1:JPORT`` in the config (a jump given by address, the form ``ssh -G`` prints), to a
    second sshd on the same machine: the command goes through it (the jump's own log, at DEBUG1, shows the login and
    the forward to the target's port: sshd's "Transferred" line is written only when the client's close reaches it
    before its socket goes, so it is no evidence); with the jump gone it fails, exit 3, rather than connecting
    straight to the target. Before, the hop was dropped as "the target itself" (same address) and eaglepatch
    connected directly."""
    from sshd_server import start_sshd, stop_sshd

    (tmp_path / "jump").mkdir()
    proc, jump = start_sshd(sshd, "", tmp_path / "jump", loglevel="DEBUG1")
    try:
        config = _box(sshd, "viaaddr", f"ProxyJump {sshd.user}@127.0.0.1:{jump.port}")
        config += f"Host 127.0.0.1\n    IdentityFile {sshd.client_key}\n"
        home = _home(sshd, tmp_path, monkeypatch, config)
        with open(home / ".ssh" / "known_hosts", "a") as f:
            f.write(jump.known_hosts_line())
        log = Path(tmp_path / "jump" / "sshd.log")
        before = log.read_text(errors="replace")
        tree = h.make_tree(tmp_path / "host", full=False)
        r, _ = _cli(sshd, home, "viaaddr", "--sglang-path", str(tree.root), "--json")
        assert r.rc == 0, r
        seen = log.read_text(errors="replace")[len(before):]
        assert f"Accepted publickey for {sshd.user}" in seen, seen
        # the session went through it: the jump forwarded a direct-tcpip channel to the target's port
        assert re.search(rf"direct[-_]tcpip.*target 127\.0\.0\.1 port {sshd.port}\b", seen), seen
    finally:
        stop_sshd(proc)
    r, _ = _cli(sshd, home, "viaaddr", "--sglang-path", str(tree.root))
    assert r.rc == 3, r
    line = r.error_line()
    assert f"127.0.0.1:{jump.port}" in line and "jump host" in line, line


def _alias_home(sshd, tmp_path, monkeypatch, known: str) -> Path:
    """A HOME whose config reaches the server as ``kabox`` with ``HostKeyAlias gpu-alias``, and whose known_hosts is
    ``known``."""
    home = _home(sshd, tmp_path, monkeypatch, _box(sshd, "kabox", "HostKeyAlias gpu-alias"), known="none")
    (home / ".ssh" / "known_hosts").write_text(known)
    return home


def test_host_key_alias_is_the_name_the_key_is_known_under(sshd, tmp_path, monkeypatch):
    """known_hosts holds the key under the alias alone (``gpu-alias ssh-ed25519 ...``, as ssh saves it with
    ``HostKeyAlias``): the command connects. Before, the alias was ignored, the key looked up under
    ``[127.0.0.1]:PORT`` and refused as unknown."""
    home = _alias_home(sshd, tmp_path, monkeypatch, f"gpu-alias {sshd.host_pub_key}\n")
    tree = h.make_tree(tmp_path / "host", full=False)
    r, _ = _cli(sshd, home, "kabox", "--sglang-path", str(tree.root))
    assert r.rc == 0, r
    # OpenSSH looks the alias up alone: the address's own (right) key does not let a wrong alias key through
    (home / ".ssh" / "known_hosts").write_text(f"gpu-alias {sshd.wrong_host_pub_key}\n" + sshd.known_hosts_line())
    with pytest.raises(ConnectionFailed, match=r"CHANGED.*ssh-keygen -R 'gpu-alias'"):
        _open("kabox")


def test_accept_new_host_key_saves_under_the_alias(sshd, tmp_path, monkeypatch):
    """--accept-new-host-key with ``HostKeyAlias``: the key is saved once, under the alias, and not under the
    address (before: a second entry under ``[127.0.0.1]:PORT``, and the alias never known)."""
    home = _alias_home(sshd, tmp_path, monkeypatch, "")
    known = home / ".ssh" / "known_hosts"
    tree = h.make_tree(tmp_path / "host", full=False)
    r, _ = _cli(sshd, home, "kabox", "--sglang-path", str(tree.root), "--accept-new-host-key")
    assert r.rc == 0, r
    assert _known_keys(known, "gpu-alias") == [sshd.host_pub_key]
    assert _known_keys(known, sshd.known_hosts_name) == [] and len(known.read_text().splitlines()) == 1
    r, _ = _cli(sshd, home, "kabox", "--sglang-path", str(tree.root))  # known now: no flag needed, nothing added
    assert r.rc == 0 and len(known.read_text().splitlines()) == 1, r


# ------------------------------------------------------------------------------------------------------ ConnectTimeout


def test_connect_timeout_from_the_config(sshd, tmp_path, monkeypatch, silent_port):
    """``ConnectTimeout 1`` in the config, a listener that never sends the SSH banner, no --connect-timeout: the
    handshake is given up after about a second. Before, the CLI's 10 s default always won (10.5 s here), and the
    library's too (SSHOptions' default was 10.0)."""
    _home(sshd, tmp_path, monkeypatch, _box(sshd, "silent", "ConnectTimeout 1", port=silent_port))
    t0 = time.monotonic()
    with pytest.raises(ConnectionFailed) as exc:
        _open("silent")
    took = time.monotonic() - t0
    assert 0.9 <= took < 4, took
    assert "1 s (ConnectTimeout in the SSH config)" in str(exc.value)


def test_connect_timeout_option_beats_the_config(sshd, tmp_path, monkeypatch, silent_port):
    """--connect-timeout 2 over the config's 1: the wait is 2 s, not 1 (the command line wins, as ``ssh -o``)."""
    _home(sshd, tmp_path, monkeypatch, _box(sshd, "silent", "ConnectTimeout 1", port=silent_port))
    t0 = time.monotonic()
    with pytest.raises(ConnectionFailed) as exc:
        _open("silent", connect_timeout=2)
    took = time.monotonic() - t0
    assert 1.9 <= took < 5, took
    assert "within 2 s" in str(exc.value) and "ConnectTimeout in the SSH config" not in str(exc.value)


def _cli(sshd, home: Path, *args: str, path: str | None = None) -> tuple[h.Result, float]:
    env = sshd.env(str(home))
    env.pop("EAGLEPATCH_DEBUG", None)
    if path is not None:
        env["PATH"] = path
    argv = [*h.EAGLEPATCH, "status", *args]
    t0 = time.monotonic()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    return h.Result(argv, proc.returncode, proc.stdout, proc.stderr), time.monotonic() - t0


def test_cli_connect_timeout_from_the_config(sshd, tmp_path, monkeypatch, silent_port):
    """The command, not just the library: ``eaglepatch status silent`` with ``ConnectTimeout 1`` in the config fails
    with exit 3 and one line in about a second (the CLI's own default must not override the config)."""
    home = _home(sshd, tmp_path, monkeypatch, _box(sshd, "silent", "ConnectTimeout 1", port=silent_port))
    r, took = _cli(sshd, home, "silent", "--sglang-path", str(tmp_path))
    r.expect(3)
    assert "1 s (ConnectTimeout in the SSH config)" in r.error_line(), r
    assert took < 4, f"{took:.1f} s:\n{r}"


def test_cli_connect_timeout_option_beats_the_config(sshd, tmp_path, monkeypatch, silent_port):
    """``--connect-timeout 2`` on the command line over the config's ``ConnectTimeout 1``: exit 3, one line, after
    2 s and not 1."""
    home = _home(sshd, tmp_path, monkeypatch, _box(sshd, "silent", "ConnectTimeout 1", port=silent_port))
    r, took = _cli(sshd, home, "silent", "--connect-timeout", "2", "--sglang-path", str(tmp_path))
    r.expect(3)
    line = r.error_line()
    assert "within 2 s" in line, r
    assert 1.9 <= took < 6, f"{took:.1f} s:\n{r}"


# ------------------------------------------------------------------------------------------------------ keys


@pytest.fixture
def agent(sshd):
    """An ssh-agent holding the key the server accepts; yields its socket."""
    folder = tempfile.mkdtemp(prefix="ep-agent-", dir="/tmp")  # a short path: unix sockets allow ~100 bytes
    sock = os.path.join(folder, "agent.sock")
    proc = subprocess.Popen(["ssh-agent", "-D", "-a", sock], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        for _ in range(100):
            if os.path.exists(sock):
                break
            time.sleep(0.05)
        subprocess.run(["ssh-add", sshd.client_key], env=dict(os.environ, SSH_AUTH_SOCK=sock), check=True,
                       capture_output=True, stdin=subprocess.DEVNULL)
        yield sock
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(folder, ignore_errors=True)


def test_identities_only_keeps_the_agent_out(sshd, tmp_path, monkeypatch, agent):
    """Two keys: the ``IdentityFile`` one, which the server refuses, and the agent's, which it accepts. Without
    ``IdentitiesOnly`` the agent's key gets in (so the agent works); with ``IdentitiesOnly yes`` only the listed key
    is offered and the login fails, as with ssh. Before, eaglepatch always asked the agent."""
    _home(sshd, tmp_path, monkeypatch,
          _box(sshd, "withagent", key=sshd.other_key) + _box(sshd, "fileonly", "IdentitiesOnly yes", key=sshd.other_key))
    monkeypatch.setenv("SSH_AUTH_SOCK", agent)
    with _open("withagent") as host:
        assert host.resolved[-1].identity_files == (sshd.other_key,)
        assert host.run(["true"]).ok
    with pytest.raises(ConnectionFailed) as exc:
        _open("fileonly")
    msg = str(exc.value)
    assert f"tried key {sshd.other_key}" in msg and "IdentitiesOnly" in msg, msg


def test_identity_file_replaces_the_default_keys(sshd, tmp_path, monkeypatch):
    """~/.ssh/id_ed25519 is the good key. A host without ``IdentityFile`` uses it (OpenSSH's default); a host whose
    ``IdentityFile`` is another key does not (ssh adds the defaults only when no key is configured), so that login
    fails. Before, eaglepatch tried ~/.ssh/id_* after any configured key."""
    home = _home(sshd, tmp_path, monkeypatch,
                 _box(sshd, "ownkey", key=sshd.other_key)
                 + f"Host defaultkey\n    HostName {sshd.host}\n    Port {sshd.port}\n    User {sshd.user}\n")
    default = home / ".ssh" / "id_ed25519"
    default.write_bytes(Path(sshd.client_key).read_bytes())
    os.chmod(default, 0o600)
    with _open("defaultkey") as host:
        assert host.resolved[-1].identity_files == (str(default),)
        assert host.run(["true"]).ok
    with pytest.raises(ConnectionFailed, match="Authentication failed"):
        _open("ownkey")


def test_user_at_host_beats_the_config_user(sshd, tmp_path, monkeypatch):
    """``User nobody-here`` in the config, ``USER@alias`` on the command line: the command line's user logs in."""
    _home(sshd, tmp_path, monkeypatch, f"Host otheruser\n    HostName {sshd.host}\n    Port {sshd.port}\n"
                                       f"    User nobody-here\n    IdentityFile {sshd.client_key}\n")
    assert ssh_config.resolve(parse_target("otheruser"))[-1].user == "nobody-here"
    with _open(f"{sshd.user}@otheruser") as host:
        assert host.run(["true"]).ok


# ------------------------------------------------------------------------------------------------------ host keys


@pytest.mark.parametrize("value, connects, saved", [
    ("accept-new", True, True),
    ("no", True, False),
    ("off", True, False),
    ("yes", False, False),
    ("ask", False, False),  # no prompt: as yes
])
def test_strict_host_key_checking_with_an_unknown_key(sshd, tmp_path, monkeypatch, value, connects, saved):
    """An unknown host key under each ``StrictHostKeyChecking``: accept-new accepts and saves it; no/off accept it
    and save nothing (eaglepatch's choice, see HostKeyPolicy); yes and ask refuse it. Before, the config's value
    was not read: every case refused."""
    home = _home(sshd, tmp_path, monkeypatch, _box(sshd, "shk", f"StrictHostKeyChecking {value}"), known="none")
    known = home / ".ssh" / "known_hosts"
    if connects:
        with _open("shk") as host:
            assert host.run(["true"]).ok
    else:
        with pytest.raises(ConnectionFailed, match="is not known: check it, then run again with --accept-new-host"):
            _open("shk")
    assert (_known_keys(known, sshd.known_hosts_name) == [sshd.host_pub_key]) is saved
    if saved:  # known now: a second connection needs nothing, and adds nothing
        lines = known.read_text()
        with _open("shk") as host:
            assert host.run(["true"]).ok
        assert known.read_text() == lines


@pytest.mark.parametrize("value", ["accept-new", "no"])
def test_strict_host_key_checking_still_refuses_a_changed_key(sshd, tmp_path, monkeypatch, value):
    """A key that differs from the known one is refused whatever StrictHostKeyChecking says (OpenSSH with ``no``
    would connect), and known_hosts is left as it was."""
    home = _home(sshd, tmp_path, monkeypatch, _box(sshd, "shk", f"StrictHostKeyChecking {value}"), known="changed")
    known = home / ".ssh" / "known_hosts"
    before = known.read_bytes()
    with pytest.raises(ConnectionFailed, match="CHANGED"):
        _open("shk")
    assert known.read_bytes() == before


def test_accept_new_host_key_option_beats_strict_no(sshd, tmp_path, monkeypatch):
    """``StrictHostKeyChecking no`` saves nothing, but --accept-new-host-key on the command line says to save."""
    home = _home(sshd, tmp_path, monkeypatch, _box(sshd, "shk", "StrictHostKeyChecking no"), known="none")
    with _open("shk", accept_new_host_key=True) as host:
        assert host.run(["true"]).ok
    assert _known_keys(home / ".ssh" / "known_hosts", sshd.known_hosts_name) == [sshd.host_pub_key]


def test_user_known_hosts_file_is_read_and_written(sshd, tmp_path, monkeypatch):
    """``UserKnownHostsFile NEW OLD``: both files are read (the key in the second one lets us in), ~/.ssh/known_hosts
    is not (the key there alone does not: the config replaced it), and a newly accepted key goes to the first file
    and nowhere else."""
    new, old = tmp_path / "kh" / "new", tmp_path / "kh" / "old"
    old.parent.mkdir()
    config = _box(sshd, "khbox", f"UserKnownHostsFile {new} {old}")
    home = _home(sshd, tmp_path, monkeypatch, config, known="ok")  # ~/.ssh/known_hosts knows the key: not read
    assert [r.host_keys.save_to for r in ssh_config.resolve(parse_target("khbox"))] == [str(new)]
    with pytest.raises(ConnectionFailed, match="is not known"):
        _open("khbox")

    old.write_text(sshd.known_hosts_line())  # the second file knows it: read
    with _open("khbox") as host:
        assert host.run(["true"]).ok

    old.unlink()
    with _open("khbox", accept_new_host_key=True) as host:  # accepted: saved to the first file, no other
        assert host.run(["true"]).ok
    assert _known_keys(new, sshd.known_hosts_name) == [sshd.host_pub_key]
    assert not old.exists()
    assert (home / ".ssh" / "known_hosts").read_text() == sshd.known_hosts_line()


# ------------------------------------------------------------------------------------------------------ Match


def test_match_block(sshd, tmp_path, monkeypatch):
    """``Match host 127.0.0.1 user USER`` (after HostName: OpenSSH matches the name it will connect to) gives the
    port and key: ``mt`` connects; ``nobody@mt`` does not match the block and stays on port 22."""
    config = (f"Host mt\n    HostName {sshd.host}\n\n"
              f"Match host {sshd.host} user {sshd.user}\n    Port {sshd.port}\n    IdentityFile {sshd.client_key}\n")
    _home(sshd, tmp_path, monkeypatch, config)
    with _open("mt") as host:
        assert host.resolved[-1].port == sshd.port and host.resolved[-1].source == "ssh -G"
        assert host.run(["echo", "matched"]).stdout == b"matched\n"
    other = ssh_config.resolve(parse_target("nobody@mt"))[-1]
    assert (other.hostname, other.port, other.identity_files) == (sshd.host, 22, ())


# ------------------------------------------------------------------------------------------------------ fallback


def test_fallback_without_ssh_reads_include(sshd, tmp_path, monkeypatch, no_ssh_on_path):
    """No ssh on PATH: paramiko's SSHConfig reads the config, with Include expanded by eaglepatch (both forms), and
    the ConnectTimeout, StrictHostKeyChecking and UserKnownHostsFile of the included block are in force."""
    home = _home(sshd, tmp_path, monkeypatch, "Include ~/.ssh/conf.d/a\nInclude conf.d/b*\n", known="none")
    (home / ".ssh" / "conf.d").mkdir()
    kh = tmp_path / "fallback_known"
    (home / ".ssh" / "conf.d" / "a").write_text(_box(sshd, "fba", "ConnectTimeout 3", "StrictHostKeyChecking accept-new",
                                                     f"UserKnownHostsFile {kh}"))
    (home / ".ssh" / "conf.d" / "b1").write_text(_box(sshd, "fbb"))
    with _open("fba") as host:
        r = host.resolved[-1]
        assert (r.source, r.timeout, r.timeout_from, r.host_keys.check) == ("paramiko", 3.0, "ConnectTimeout",
                                                                             "accept-new")
        assert host.run(["echo", "fallback"]).stdout == b"fallback\n"
    assert _known_keys(kh, sshd.known_hosts_name) == [sshd.host_pub_key]
    assert ssh_config.resolve(parse_target("fbb"))[-1].port == sshd.port


def test_fallback_when_ssh_g_fails(sshd, tmp_path, monkeypatch):
    """An ``ssh`` on PATH that cannot do ``-G`` (exits 255: an OpenSSH older than 6.8, or not OpenSSH): the
    fallback resolves the host, Include included, and it connects."""
    home = _home(sshd, tmp_path, monkeypatch, "Include conf.d/*\n")
    (home / ".ssh" / "conf.d").mkdir()
    (home / ".ssh" / "conf.d" / "x").write_text(_box(sshd, "oldssh"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text("#!/bin/sh\necho 'ssh: illegal option -- G' >&2\nexit 255\n")
    os.chmod(bin_dir / "ssh", 0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    with _open("oldssh") as host:
        assert host.resolved[-1].source == "paramiko"
        assert host.run(["true"]).ok


def test_ssh_g_that_hangs_is_cut_short(sshd, tmp_path, monkeypatch):
    """``Match exec`` with a command that never ends: ``ssh -G`` is given SSH_G_TIMEOUT (1 s here), then it and
    the command are killed and the connection fails with one line (no fallback: it would run the command again)."""
    marker = f"{time.time_ns() % 10**9}.25"
    _home(sshd, tmp_path, monkeypatch, f'Match exec "sleep {marker}"\n    Port 1\n\n' + _box(sshd, "hang"))
    monkeypatch.setattr(ssh_config, "SSH_G_TIMEOUT", 1.0)
    t0 = time.monotonic()
    with pytest.raises(ConnectionFailed, match=r"'ssh -G hang' did not finish within 1 s") as exc:
        _open("hang")
    assert time.monotonic() - t0 < 5
    assert "\n" not in str(exc.value)
    time.sleep(0.2)
    left = [p for p in os.listdir("/proc") if p.isdigit() and marker in _cmdline(p)]
    assert not left, "the Match exec command outlived ssh -G"


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").rstrip("\0")
    except OSError:
        return ""
