"""SSHHost against a real OpenSSH server on 127.0.0.1 (see conftest.py): commands, files, config, host keys."""

from __future__ import annotations

import errno
import os
import socket
import stat as statmod
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from eaglepatch.errors import ConnectionFailed, HelperFailed, Unsupported
from eaglepatch.hosts.agent import RemoteScriptError, call
from eaglepatch.hosts.base import Host
from eaglepatch.hosts.local import LocalHost
from eaglepatch.hosts.ssh import SSHHost
from eaglepatch.hosts.ssh_files import sftp_os_error
from eaglepatch.hosts.spec import SSHOptions
from eaglepatch.hosts.target import open_host, parse_target

pytestmark = pytest.mark.e2e

WEIRD = "a b;$(touch x)'\"`echo y`&|<>*?\\"


def _open(target: str, **options) -> SSHHost:
    host = open_host(parse_target(target, SSHOptions(**options)))
    assert isinstance(host, SSHHost)
    return host


@pytest.fixture
def host(sshd, ssh_home):
    h = _open(sshd.target, identity=sshd.client_key)
    yield h
    h.close()


@pytest.fixture
def rdir(tmp_path):
    """A folder the remote side writes into (the same machine, so the test can look at it directly)."""
    d = tmp_path / "remote"
    d.mkdir()
    return d


# ------------------------------------------------------------------------------------------------------ commands


def test_is_a_host_and_names_itself(host, sshd):
    assert isinstance(host, Host)
    assert host.is_local is False
    assert host.name == sshd.target
    assert host.destination == f"{sshd.user}@127.0.0.1:{sshd.port}"


def test_run_output_and_rc(host):
    r = host.run(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (r.rc, r.stdout, r.stderr) == (3, b"out\n", b"err\n")
    assert not r.ok
    assert host.run(["true"]).ok


def test_run_missing_program_is_127(host):
    r = host.run(["/nonexistent/program", "x"])
    assert r.rc == 127


def test_run_stdin_and_large_output_both_ways(host):
    data = os.urandom(1 << 20) + b"\x00tail\n"
    r = host.run(["cat"], stdin=data)
    assert r.rc == 0
    assert r.stdout == data
    # a command that writes a lot to stderr before stdout, while we feed it a lot: no deadlock
    script = "head -c 3000000 /dev/zero >&2; cat; head -c 3000000 /dev/zero"
    r = host.run(["sh", "-c", script], stdin=data, timeout=60)
    assert r.rc == 0
    assert len(r.stderr) == 3_000_000
    assert r.stdout == data + b"\x00" * 3_000_000


def test_run_binary_output_is_raw_bytes(host):
    r = host.run(["printf", "\\377\\000\\r\\n"])
    assert r.stdout == b"\xff\x00\r\n"


def test_run_command_that_ignores_stdin(host):
    r = host.run(["true"], stdin=os.urandom(4 << 20), timeout=30)
    assert r.rc == 0


def test_run_timeout_kills_the_command(host, rdir):
    marker = rdir / "survived"
    t0 = time.monotonic()
    r = host.run(["sh", "-c", f"echo started; sleep 10; touch '{marker}'"], timeout=1.5)
    assert r.rc == 124
    assert b"timed out" in r.stderr
    assert r.stdout == b"started\n"
    assert time.monotonic() - t0 < 10
    # the shell was killed (as LocalHost's subprocess.run does); its sleep may linger but the touch never runs
    time.sleep(0.5)
    ps = host.run(["sh", "-c", f"ps -eo args | grep -F '{marker}' | grep -v grep || true"])
    assert str(marker).encode() not in ps.stdout
    # the connection is still good
    assert host.run(["echo", "ok"]).stdout == b"ok\n"


def test_run_quotes_every_argument(host, rdir):
    monkey = rdir / "pwned"
    weird = f"{WEIRD}$(touch {monkey})"
    args = [weird, "", " ", "~", "$HOME", "*", "--", "-n", "line\nbreak", "é ü"]
    r = host.run(["printf", "[%s]\\n", *args])
    assert r.rc == 0
    assert r.stdout.decode() == "".join(f"[{a}]\n" for a in args)
    assert not monkey.exists()


def test_the_host_side_package_answers_over_ssh(host, rdir):
    """``call``: the bundled host-side package, run by the host's python3 through the agent; a failing op and a
    missing interpreter read as one line each."""
    (rdir / "server.log").write_text("loading\nready ü\n")
    assert call(host, "python3", "tail", log_path=str(rdir / "server.log"), lines=1) == {"lines": ["ready ü"]}
    with pytest.raises(HelperFailed, match="KeyError"):
        call(host, "python3", "execute")
    with pytest.raises(Unsupported, match="cannot run /nonexistent/python3"):
        call(host, "/nonexistent/python3", "tail", log_path="x")


def test_one_connection_reused(host):
    transport = host._transport
    for _ in range(5):
        host.run(["true"])
    host.write_bytes("/tmp/.eaglepatch-reuse-test", b"x")
    host.remove("/tmp/.eaglepatch-reuse-test")
    assert host._transport is transport
    sftp = host._sftp
    host.stat("/tmp")
    assert host._sftp is sftp is not None


def test_concurrent_runs_on_one_host(host):
    results = []

    def work(i):
        results.append(host.run(["sh", "-c", f"sleep 0.2; echo {i}"]).stdout)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == sorted(f"{i}\n".encode() for i in range(6))


def test_close_is_idempotent_and_reconnects(sshd, ssh_home):
    h = _open(sshd.target, identity=sshd.client_key)
    h.close()
    h.close()
    assert not h.connected
    assert h.run(["echo", "again"]).stdout == b"again\n"  # a later call connects again
    h.close()


def test_dropped_connection_mid_command(host):
    def cut():
        time.sleep(0.5)
        host._transport.sock.shutdown(socket.SHUT_RDWR)

    threading.Thread(target=cut).start()
    with pytest.raises(ConnectionFailed, match="lost"):
        host.run(["sleep", "5"], timeout=20)


# ------------------------------------------------------------------------------------------------------ files


def test_write_read_stat_remove(host, rdir):
    path = str(rdir / "f.bin")
    data = os.urandom(1 << 20)
    host.write_bytes(path, data)
    assert Path(path).read_bytes() == data
    assert host.read_bytes(path) == data
    st = host.stat(path)
    assert st is not None and st.size == len(data)
    assert statmod.S_ISREG(st.mode)
    assert statmod.S_IMODE(st.mode) == 0o600  # a new file without mode: 0600, like LocalHost
    assert st.uid == os.getuid() and st.gid == os.getgid()
    assert abs(st.mtime - os.stat(path).st_mtime) < 1.5
    host.remove(path)
    assert host.stat(path) is None
    host.remove(path)  # already gone: no error


def test_write_bytes_mode(host, rdir):
    path = str(rdir / "m.py")
    host.write_bytes(path, b"print(1)\n", mode=0o640)
    assert statmod.S_IMODE(os.stat(path).st_mode) == 0o640
    assert statmod.S_IMODE(host.stat(path).mode) == 0o640
    host.write_bytes(path, b"print(2)\n", mode=0o755)  # existing file: truncated, mode changed
    assert statmod.S_IMODE(os.stat(path).st_mode) == 0o755
    assert Path(path).read_bytes() == b"print(2)\n"
    host.write_bytes(path, b"")  # no mode: existing mode kept
    assert statmod.S_IMODE(os.stat(path).st_mode) == 0o755
    assert host.read_bytes(path) == b""


def test_rename_replaces_existing(host, rdir):
    src, dst = str(rdir / "new"), str(rdir / "old")
    Path(dst).write_bytes(b"old")
    host.write_bytes(src, b"new")
    host.rename(src, dst)
    assert Path(dst).read_bytes() == b"new"
    assert not Path(src).exists()
    with pytest.raises(FileNotFoundError):
        host.rename(src, dst)


def test_listdir(host, rdir):
    for name in ["b", "a", "c d", WEIRD]:
        (rdir / name).write_bytes(b"")
    (rdir / "sub").mkdir()
    assert host.listdir(str(rdir)) == sorted(["a", "b", "c d", WEIRD, "sub"])
    with pytest.raises(FileNotFoundError):
        host.listdir(str(rdir / "missing"))


def test_missing_files(host, rdir):
    missing = str(rdir / "missing")
    assert host.stat(missing) is None
    with pytest.raises(FileNotFoundError) as exc:
        host.read_bytes(missing)
    assert exc.value.filename == missing
    with pytest.raises(FileNotFoundError):
        host.write_bytes(str(rdir / "no-such-dir" / "f"), b"x")


def test_filesystem_error_is_oserror(host, rdir):
    with pytest.raises(OSError) as exc:
        host.read_bytes(str(rdir))  # a directory
    assert not isinstance(exc.value, ConnectionFailed)
    assert host.run(["true"]).ok  # the connection survives filesystem errors


def test_weird_paths_in_files_and_commands(host, rdir):
    d = rdir / WEIRD
    r = host.run(["mkdir", str(d)])
    assert r.rc == 0, r.stderr
    assert d.is_dir()
    f = str(d / f"{WEIRD}.py")
    host.write_bytes(f, b"x = 1\n", mode=0o644)
    assert host.read_bytes(f) == b"x = 1\n"
    assert host.listdir(str(d)) == [f"{WEIRD}.py"]
    assert host.run(["cat", f]).stdout == b"x = 1\n"
    host.rename(f, f + ".2")
    assert host.stat(f) is None and host.stat(f + ".2") is not None
    assert not (rdir / "x").exists() and not Path(os.path.expanduser("~"), "x").exists()


def test_matches_local_host(host, rdir):
    """The same calls give the same results on LocalHost and SSHHost (the machine is the same)."""
    local = LocalHost()
    for h, name in ((local, "l"), (host, "s")):
        p = str(rdir / name)
        h.write_bytes(p, b"abc", mode=0o640)
        h.write_bytes(p + ".tmp", b"def")
        h.rename(p + ".tmp", p)
        assert h.read_bytes(p) == b"def"
        assert statmod.S_IMODE(h.stat(p).mode) == 0o600  # the replacement's mode
    assert local.listdir(str(rdir)) == host.listdir(str(rdir))
    assert local.run(["printf", "%s", WEIRD]) == host.run(["printf", "%s", WEIRD])


# ------------------------------------------------------------------------------------------------------ config


def test_host_alias_from_ssh_config(sshd, ssh_home):
    with _open(sshd.alias) as h:
        assert h.name == "testbox"
        assert h.destination == f"testbox ({sshd.user}@127.0.0.1:{sshd.port})"
        assert h.run(["echo", "hi"]).stdout == b"hi\n"


def test_port_option_overrides_ssh_config(sshd, ssh_home):
    port = _closed_port()
    with pytest.raises(ConnectionFailed, match=f":{port}"):
        _open(sshd.alias, port=port)


def test_identity_option_tried_first(sshd, ssh_home):
    """``-i KEY`` is offered to the server before the alias's ``IdentityFile``, which still works after it (OpenSSH
    semantics: -i is added, tried first). The -i key here is one the server refuses: the login succeeds with the
    alias's key, and the server's log (LogLevel VERBOSE) names the -i key refused first, then the alias's accepted.
    Were -i ignored, or tried after the alias's key, the server would never see it."""
    log = Path(sshd.log)
    start = log.stat().st_size
    with _open(sshd.alias, identity=sshd.other_key) as h:
        assert h.run(["true"]).ok
    deadline = time.monotonic() + 5
    while True:  # sshd's own processes write its log: wait for the accepted key's line
        seen = log.read_bytes()[start:].decode(errors="replace")
        if "Accepted publickey for " in seen:
            break
        assert time.monotonic() < deadline, seen
        time.sleep(0.05)
    offered = []  # ("Failed" or "Accepted", the key's fingerprint), in the server's order
    for line in seen.splitlines():
        words = line.split()
        if "publickey" in words and words.index("publickey") > 0 and words[-1].startswith("SHA256:"):
            offered.append((words[words.index("publickey") - 1], words[-1]))
    assert offered == [("Failed", _fingerprint(sshd.other_key)), ("Accepted", _fingerprint(sshd.client_key))], seen


def _fingerprint(key: str) -> str:
    """``SHA256:...`` of a key file, as sshd logs it."""
    out = subprocess.run(["ssh-keygen", "-l", "-f", key], capture_output=True, text=True, check=True).stdout
    return out.split()[1]


def test_default_identity_in_home(sshd, tmp_path, monkeypatch):
    home = sshd.make_home(tmp_path / "home", config=False)
    (Path(home) / ".ssh" / "id_ed25519").write_bytes(Path(sshd.client_key).read_bytes())
    os.chmod(Path(home) / ".ssh" / "id_ed25519", 0o600)
    monkeypatch.setenv("HOME", home)
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    with _open(sshd.target) as h:
        assert h.run(["true"]).ok


def test_ssh_config_missing_identity_file_and_bad_lines(sshd, tmp_path, monkeypatch):
    home = sshd.make_home(tmp_path / "home")
    config = Path(home, ".ssh", "config")
    config.write_text(
        "Host *\n    IdentityFile ~/.ssh/does-not-exist\n    ServerAliveInterval 30\n\n" + config.read_text()
    )
    monkeypatch.setenv("HOME", home)
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    with _open(sshd.alias) as h:  # the missing file is skipped, as OpenSSH does
        assert h.run(["true"]).ok


def test_ssh_config_match_exec_and_proxycommand(sshd, tmp_path, monkeypatch):
    """``Match exec`` (paramiko runs it with invoke, loaded only then) and ``ProxyCommand`` (a process whose stdin
    and stdout are the connection) from ~/.ssh/config."""
    home = sshd.make_home(tmp_path / "home")
    Path(home, ".ssh", "config").write_text(
        f"Match host viaexec exec \"test -d {tmp_path}\"\n    HostName {sshd.host}\n    Port {sshd.port}\n"
        f"    User {sshd.user}\n    IdentityFile {sshd.client_key}\n\n"
        f"Host viaproxy\n    HostName {sshd.host}\n    Port {sshd.port}\n    User {sshd.user}\n"
        f"    IdentityFile {sshd.client_key}\n"
        f"    ProxyCommand {sys.executable} -c \"import socket,sys,threading;s=socket.create_connection(('%h',%p));"
        f"threading.Thread(target=lambda:[s.sendall(b) for b in iter(lambda:sys.stdin.buffer.read1(65536),b'')],"
        f"daemon=True).start();[sys.stdout.buffer.write(b) or sys.stdout.buffer.flush() "
        f"for b in iter(lambda:s.recv(65536),b'')]\"\n"
        "\n" + Path(home, ".ssh", "config").read_text())
    monkeypatch.setenv("HOME", home)
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    devnull = open(os.devnull)
    monkeypatch.setattr(sys, "stdin", devnull)  # invoke.run would read pytest's captured stdin
    with _open("viaexec") as h:
        assert h.destination == f"viaexec ({sshd.user}@127.0.0.1:{sshd.port})"
        assert h.run(["echo", "matched"]).stdout == b"matched\n"
    with _open("viaproxy") as h:
        assert h.run(["echo", "proxied"]).stdout == b"proxied\n"
    devnull.close()


def test_bad_proxyjump_in_ssh_config(sshd, tmp_path, monkeypatch):
    """A ProxyJump that is not [user@]host[:port][,...] is a usage error that names it. ``a,,b`` is refused by OpenSSH
    too (ssh -G fails: the fallback reads it, and eaglepatch's own parser refuses it); OpenSSH would read
    ``bad host name`` as ``bad``, so that is no test of this."""
    from eaglepatch.errors import UsageError

    home = sshd.make_home(tmp_path / "home")
    Path(home, ".ssh", "config").write_text("Host broken\n    ProxyJump a,,b\n")
    monkeypatch.setenv("HOME", home)
    with pytest.raises(UsageError, match="ProxyJump"):
        _open("broken")


def test_jump_host(sshd, ssh_home):
    with _open(sshd.target, identity=sshd.client_key, jump=f"{sshd.user}@127.0.0.1:{sshd.port}") as h:
        assert len(h._hops) == 1
        assert h.run(["echo", "via jump"]).stdout == b"via jump\n"
        h.write_bytes("/tmp/.eaglepatch-jump-test", b"j")
        assert h.read_bytes("/tmp/.eaglepatch-jump-test") == b"j"
        h.remove("/tmp/.eaglepatch-jump-test")
    assert h._hops == []  # closed with it


def test_two_jump_hosts(sshd, ssh_home):
    hop = f"127.0.0.1:{sshd.port}"
    with _open(sshd.target, identity=sshd.client_key, jump=f"{hop},{hop}") as h:
        assert len(h._hops) == 2
        assert h.run(["true"]).ok


def test_proxyjump_from_ssh_config_and_jump_none(sshd, ssh_home):
    with _open(sshd.jump_alias) as h:
        assert len(h._hops) == 1
        assert h.run(["true"]).ok
    with _open(sshd.jump_alias, jump="none") as h:
        assert h._hops == []
        assert h.run(["true"]).ok


def test_jump_host_that_cannot_reach_target(sshd, ssh_home):
    port = _closed_port()
    with pytest.raises(ConnectionFailed, match="through jump host"):
        _open(f"127.0.0.1:{port}", identity=sshd.client_key, jump=f"127.0.0.1:{sshd.port}")


# ------------------------------------------------------------------------------------------------------ host keys


def test_unknown_host_key_refused_then_accepted(sshd, ssh_home_unknown):
    known = Path(ssh_home_unknown, ".ssh", "known_hosts")
    with pytest.raises(ConnectionFailed, match="is not known: check it, then run again with --accept-new-host-key"):
        _open(sshd.target, identity=sshd.client_key)
    assert not known.exists()

    with _open(sshd.target, identity=sshd.client_key, accept_new_host_key=True) as h:
        assert h.run(["true"]).ok
    assert _known_keys(known, sshd.known_hosts_name) == [sshd.host_pub_key]
    assert _known_keys(known, "127.0.0.1") == []  # non-22 port: stored as [host]:port
    assert Path(ssh_home_unknown, ".ssh").stat().st_mode & 0o777 == 0o700

    with _open(sshd.target, identity=sshd.client_key) as h:  # now known: no flag needed
        assert h.run(["true"]).ok
    with _open(sshd.target, identity=sshd.client_key, accept_new_host_key=True) as h:  # not added twice
        assert h.run(["true"]).ok
    assert len(known.read_text().splitlines()) == 1


def test_accept_new_host_key_creates_ssh_dir(sshd, tmp_path, monkeypatch):
    home = tmp_path / "bare-home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    with _open(sshd.target, identity=sshd.client_key, accept_new_host_key=True) as h:
        assert h.run(["true"]).ok
    assert (home / ".ssh").stat().st_mode & 0o777 == 0o700
    assert _known_keys(home / ".ssh" / "known_hosts", sshd.known_hosts_name) == [sshd.host_pub_key]


def test_accept_new_for_jump_and_target_adds_one_line(sshd, ssh_home_unknown):
    known = Path(ssh_home_unknown, ".ssh", "known_hosts")
    with _open(sshd.target, identity=sshd.client_key, jump=f"127.0.0.1:{sshd.port}", accept_new_host_key=True) as h:
        assert h.run(["true"]).ok
    assert len(known.read_text().splitlines()) == 1


def test_known_hosts_with_bad_lines_still_read(sshd, tmp_path, monkeypatch):
    home = sshd.make_home(tmp_path / "home")
    known = Path(home, ".ssh", "known_hosts")
    good = known.read_text()
    known.write_text(
        "# comment\n\nbroken ssh-ed25519 AAAA!!!notbase64\nonlyonefield\n"
        "@cert-authority *.example ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJ\n"
        "other.example unknown-key-type AAAA\n" + good
    )
    monkeypatch.setenv("HOME", home)
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    with _open(sshd.target, identity=sshd.client_key) as h:
        assert h.run(["true"]).ok


def test_hashed_known_hosts_entry(sshd, tmp_path, monkeypatch):
    home = sshd.make_home(tmp_path / "home")
    known = Path(home, ".ssh", "known_hosts")
    subprocess.run(["ssh-keygen", "-H", "-f", str(known)], check=True, capture_output=True)
    assert sshd.known_hosts_name not in known.read_text()
    monkeypatch.setenv("HOME", home)
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    with _open(sshd.target, identity=sshd.client_key) as h:
        assert h.run(["true"]).ok


def test_changed_host_key_always_refused(sshd, ssh_home_changed):
    known = Path(ssh_home_changed, ".ssh", "known_hosts")
    before = known.read_bytes()
    for accept in (False, True):
        with pytest.raises(ConnectionFailed, match="CHANGED.*will not connect"):
            _open(sshd.target, identity=sshd.client_key, accept_new_host_key=accept)
    with pytest.raises(ConnectionFailed, match="CHANGED"):
        _open(sshd.alias, accept_new_host_key=True)
    assert known.read_bytes() == before


def test_jump_host_key_checked_too(sshd, ssh_home_unknown):
    with pytest.raises(ConnectionFailed, match="host key of jump host .*127.0.0.1.* is not known"):
        _open(sshd.target, identity=sshd.client_key, jump=f"127.0.0.1:{sshd.port}")


def test_changed_jump_host_key_refused(sshd, ssh_home_changed):
    with pytest.raises(ConnectionFailed, match="CHANGED"):
        _open("somewhere:22", identity=sshd.client_key, jump=f"127.0.0.1:{sshd.port}", accept_new_host_key=True)


# ------------------------------------------------------------------------------------------------------ failures


def test_wrong_client_key(sshd, ssh_home):
    with pytest.raises(ConnectionFailed) as exc:
        _open(sshd.target, identity=sshd.other_key)
    msg = str(exc.value)
    assert f"cannot connect to {sshd.user}@127.0.0.1:{sshd.port}" in msg
    assert sshd.other_key in msg and "check -i/--identity or your ssh-agent" in msg
    assert "\n" not in msg


def test_no_key_at_all(sshd, ssh_home):
    with pytest.raises(ConnectionFailed, match="check -i/--identity"):
        _open(sshd.target)


def test_nothing_listening(sshd, ssh_home):
    port = _closed_port()
    with pytest.raises(ConnectionFailed, match=f"cannot connect to .*127.0.0.1:{port}"):
        _open(f"127.0.0.1:{port}", identity=sshd.client_key)


def test_unresolvable_host(sshd, ssh_home):
    with pytest.raises(ConnectionFailed, match="cannot connect to"):
        _open("no-such-host.invalid", identity=sshd.client_key, connect_timeout=5)


def test_connect_timeout(sshd, ssh_home):
    # a listener that never speaks SSH: the banner wait runs into the connect timeout
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        port = srv.getsockname()[1]
        t0 = time.monotonic()
        with pytest.raises(ConnectionFailed, match="cannot connect to"):
            _open(f"127.0.0.1:{port}", identity=sshd.client_key, connect_timeout=1)
        assert time.monotonic() - t0 < 8


def test_lazy_connect_and_failure_on_first_call(sshd, ssh_home):
    h = SSHHost(parse_target(f"127.0.0.1:{_closed_port()}"))
    assert not h.connected
    with pytest.raises(ConnectionFailed):
        h.run(["true"])
    with pytest.raises(ConnectionFailed):
        h.read_bytes("/etc/hostname")
    h.close()


def test_sftp_error_mapping():
    assert isinstance(sftp_os_error(OSError(errno.ENOENT, "No such file"), "read", "/x", "h"), FileNotFoundError)
    err = sftp_os_error(OSError(errno.EACCES, "Permission denied"), "write", "/x", "h")
    assert isinstance(err, PermissionError) and err.filename == "/x"
    err = sftp_os_error(OSError("Failure"), "rename", "/x", "h")
    assert type(err) is OSError and "rename failed on h: Failure" in str(err) and err.filename == "/x"


def _known_keys(known_hosts, name: str) -> list[str]:
    """The keys ssh-keygen finds for ``name`` in a known_hosts file (hashed entries included)."""
    r = subprocess.run(["ssh-keygen", "-F", name, "-f", str(known_hosts)], capture_output=True, text=True)
    return [" ".join(line.split()[1:3]) for line in r.stdout.splitlines() if line and not line.startswith("#")]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------------------------------ agents


def test_agent_over_ssh_serves_many_calls_on_one_channel(host, monkeypatch):
    import paramiko

    opened = []
    real = paramiko.Transport.open_session

    def counting(self, *a, **k):
        opened.append(1)
        return real(self, *a, **k)

    monkeypatch.setattr(paramiko.Transport, "open_session", counting)
    program = "import os\ndef main(p):\n    return [os.getpid(), p]\n"
    answers = [host.agents.call("python3", program, {"n": i}) for i in range(4)]
    assert [a[1] for a in answers] == [{"n": i} for i in range(4)]
    assert len({a[0] for a in answers}) == 1 and len(opened) == 1
    with pytest.raises(RemoteScriptError) as err:
        host.agents.call("python3", "import os\ndef main(p):\n    os._exit(7)\n", {})
    assert err.value.result.rc == 7
    with pytest.raises(RemoteScriptError) as err:  # 127 when there is no such program, as a shell says it
        host.agents.call("/nonexistent/python3", program, {})
    assert err.value.result.rc == 127


def test_agent_over_ssh_times_out_and_kills(host):
    program = "import os, time\ndef main(p):\n    time.sleep(p['s']) if p['s'] else None\n    return os.getpid()\n"
    pid = host.agents.call("python3", program, {"s": 0})
    with pytest.raises(RemoteScriptError) as err:
        host.agents.call("python3", program, {"s": 30}, timeout=1)
    assert err.value.result.rc == 124
    for _ in range(50):
        if not os.path.exists(f"/proc/{pid}"):
            break
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{pid}"), "the timed-out remote process is still there"
    assert host.agents.call("python3", program, {"s": 0}) != pid


def test_dropped_connection_mid_agent_call(host):
    program = "import time\ndef main(p):\n    time.sleep(p['s'])\n    return 1\n"
    assert host.agents.call("python3", program, {"s": 0}) == 1

    def cut():
        time.sleep(0.5)
        host._transport.sock.shutdown(socket.SHUT_RDWR)

    threading.Thread(target=cut).start()
    with pytest.raises(ConnectionFailed, match="lost"):
        host.agents.call("python3", program, {"s": 5}, timeout=20)


def test_apply_and_revert_each_run_on_one_ssh_channel(sshd, ssh_home, tmp_path, monkeypatch):
    """facts (with the lock) and execute (with the unlock) are two requests to one remote interpreter: one SSH
    channel, one login shell, one interpreter start per command (``python3`` here is the binary that facts reports
    as the interpreter to validate with)."""
    import paramiko

    import cli_helpers as h
    from eaglepatch.ops import change
    from eaglepatch.ops.options import FactsOptions, RuntimeOptions
    from eaglepatch.ops.target import Connect, target_spec
    from eaglepatch.transform.recipe import builtin_recipe

    tree = h.make_tree(tmp_path / "host", full=False)
    before = h.snapshot(tree.root)
    opened = []
    real = paramiko.Transport.open_session

    def counting(self, *a, **k):
        opened.append(1)
        return real(self, *a, **k)

    monkeypatch.setattr(paramiko.Transport, "open_session", counting)
    c = Connect(identity=sshd.client_key, facts=FactsOptions(sglang_path=str(tree.root)))
    doc = change.apply(target_spec(sshd.target, c), c, builtin_recipe(), RuntimeOptions(), None, False, lambda m: None)
    assert doc["changed"] and len(doc["files"]) == len(tree.patched_names)
    assert len(opened) == 1
    assert not tree.lock.exists()
    opened.clear()
    doc = change.revert(target_spec(sshd.target, c), c, builtin_recipe(), False, None, lambda m: None)
    assert doc["changed"]
    assert len(opened) == 1
    h.assert_same(h.snapshot(tree.root), before, "revert after apply")


# ------------------------------------------------------------------------------------------------------ tunnels


def test_tunnel_round_trip_and_half_close(host):
    """open_tunnel (eaglepatch/hosts/tunnel.py): bytes go both ways through the SSH connection; the client's EOF
    reaches the far side, which may still answer; the accepted socket has TCP_NODELAY (a streamed answer's small
    chunks are not held back); after close_tunnel nothing listens on the port any more."""
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)

        def echo_upper():
            conn, _ = srv.accept()
            with conn:
                data = b""
                while chunk := conn.recv(65536):
                    data += chunk
                conn.sendall(data.upper())  # after the client's half-close

        t = threading.Thread(target=echo_upper, daemon=True)
        t.start()
        port = host.open_tunnel("127.0.0.1", srv.getsockname()[1])
        (tunnel,) = host._tunnels
        payload = b"abc" * 100_000
        with socket.create_connection(("127.0.0.1", port), timeout=20) as c:
            c.sendall(payload)
            for _ in range(100):
                with tunnel._lock:
                    accepted = list(tunnel._conns)
                if accepted:
                    break
                time.sleep(0.05)
            assert [a.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0 for a in accepted] == [True]
            c.shutdown(socket.SHUT_WR)
            got = b""
            while chunk := c.recv(65536):
                got += chunk
        t.join(10)
        assert got == payload.upper()
        assert tunnel.port == port
        host.close_tunnel(port)
        assert host._tunnels == []
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
