"""Resolving SSH destinations (eaglepatch.hosts.ssh_config) without a server: what is asked of ``ssh -G`` (a stand-in
``ssh`` on PATH records its arguments and prints a canned configuration), how its answer becomes hops, tokens,
Include expansion and the fallback's defaults; and the shape of eaglepatch.hosts after the split (no import cycle,
no paramiko where it is not needed)."""

from __future__ import annotations

import ast
import hashlib
import os
import pwd
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from eaglepatch.errors import UsageError
from eaglepatch.hosts import ssh_config
from eaglepatch.hosts.spec import DEFAULT_CONNECT_TIMEOUT, Hop, SSHOptions
from eaglepatch.hosts.target import parse_target

HOSTS = Path(__file__).resolve().parents[2] / "eaglepatch" / "hosts"

FAKE_SSH = """#!/bin/sh
# a stand-in for OpenSSH's ssh -G: records its arguments, prints out.HOST (else out), exits $FAKE_SSH_RC
d="$FAKE_SSH_DIR"
for last; do :; done
printf '%s\\n' "$@" > "$d/argv.$$"
if [ -n "$FAKE_SSH_F" ]; then for a; do case "$prev" in -F) cat "$a" > "$d/config.$$";; esac; prev="$a"; done; fi
if [ -f "$d/out.$last" ]; then cat "$d/out.$last"; else cat "$d/out"; fi
exit "${FAKE_SSH_RC:-0}"
"""


@pytest.fixture
def home(tmp_path, monkeypatch):
    h = tmp_path / "home"
    (h / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(h))
    return h


@pytest.fixture
def fake_ssh(tmp_path, monkeypatch, home):
    """PATH = a folder whose ``ssh`` is FAKE_SSH; returns that folder (write ``out``/``out.HOST`` there)."""
    d = tmp_path / "fake"
    d.mkdir()
    (d / "ssh").write_text(FAKE_SSH)
    os.chmod(d / "ssh", 0o755)
    (d / "out").write_text("hostname h\nuser u\nport 22\n")
    monkeypatch.setenv("PATH", f"{d}{os.pathsep}/usr/bin{os.pathsep}/bin")
    monkeypatch.setenv("FAKE_SSH_DIR", str(d))
    return d


def _calls(d: Path) -> list[list[str]]:
    """The argument lists the stand-in ssh was called with, in the order the processes started (by pid)."""
    files = sorted(d.glob("argv.*"), key=lambda p: int(p.suffix[1:]))
    return [p.read_text().splitlines() for p in files]


def _resolve(text: str, **options):
    return ssh_config.resolve(parse_target(text, SSHOptions(**options)))


# ------------------------------------------------------------------------------------------------------ the layout


def _hosts_imports() -> dict[str, set[str]]:
    """Module -> the eaglepatch.hosts modules it imports anywhere (top level, in functions, under TYPE_CHECKING)."""
    graph: dict[str, set[str]] = {}
    for path in HOSTS.glob("*.py"):
        name = path.stem
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                if node.module.startswith("eaglepatch.hosts."):
                    deps.add(node.module.split(".")[2])
                elif node.module == "eaglepatch.hosts":
                    deps.update(a.name for a in node.names)
            elif isinstance(node, ast.Import):
                deps.update(a.name.split(".")[2] for a in node.names if a.name.startswith("eaglepatch.hosts."))
        graph[name] = deps - {name}
    return graph


def test_no_import_cycle_between_hosts_modules():
    """Not even through a lazy import or a TYPE_CHECKING one: target imports ssh (in open_host), so nothing that ssh
    imports may import target. Before the split, ssh.py and target.py imported each other."""
    graph = _hosts_imports()
    assert {"spec", "ssh_config", "ssh", "tunnel", "target", "base", "local"} <= set(graph)

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for dep in graph.get(todo.pop(), ()):
                if dep not in seen:
                    seen.add(dep)
                    todo.append(dep)
        return seen

    cycles = [m for m in graph if m in reach(m)]
    assert not cycles, f"import cycles through {cycles}: {graph}"
    assert graph["spec"] == set() and "target" not in reach("ssh")


def _fresh(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_resolution_needs_no_paramiko_and_ssh_keeps_invoke_lazy():
    """ssh_config (ssh -G) imports no paramiko; target imports neither; importing ssh leaves invoke a stand-in (a
    third of paramiko's import time, docs/benchmarks.md section 2)."""
    out = _fresh("import sys, eaglepatch.hosts.target as t, eaglepatch.hosts.ssh_config as c; "
                 "print('paramiko' in sys.modules, 'eaglepatch.hosts.ssh' in sys.modules)")
    assert out == "False False"
    out = _fresh("import sys, importlib.util as u, eaglepatch.hosts.ssh; "
                 "print(u.find_spec('invoke') is None or type(sys.modules['invoke']).__name__)")
    assert out in ("True", "_LazyInvoke")


def test_public_names_still_importable():
    from eaglepatch.hosts import spec, target
    from eaglepatch.hosts.known_hosts import append_known_host, fingerprint  # noqa: F401
    from eaglepatch.hosts.ssh import SSHHost  # noqa: F401
    from eaglepatch.hosts.ssh_files import sftp_os_error  # noqa: F401
    from eaglepatch.hosts.ssh_process import SSHProcess  # noqa: F401
    from eaglepatch.hosts.tunnel import Tunnel, pump  # noqa: F401

    for name in ("DEFAULT_CONNECT_TIMEOUT", "Hop", "SSHOptions", "TargetSpec", "format_destination", "parse_hop",
                 "parse_jump"):
        assert hasattr(spec, name)
    assert callable(target.open_host) and callable(target.parse_target) and callable(target.is_local_target)


# ------------------------------------------------------------------------------------------------------ ssh -G


def test_command_line_options_go_to_ssh_g(fake_ssh, tmp_path):
    """user@, port, -i, -J and --connect-timeout reach ssh as its own options (rounded up: ssh takes whole seconds),
    the host after ``--``. The target is resolved with -J; the later hop with ``-J none`` (it is reached through
    the first), the first by its own config (no -J)."""
    key = tmp_path / "key"
    key.write_text("k")
    hops = _resolve("alice@gpu1:2222", identity=str(key), jump="b1,carol@b2:22", connect_timeout=2.5)
    assert [h.name for h in hops] == ["b1", "b2", "gpu1"]
    calls = {c[-1]: c for c in _calls(fake_ssh)}
    assert set(calls) == {"gpu1", "b1", "b2"}
    for host, argv in calls.items():
        assert argv[0] == "-G" and argv[-2:] == ["--", host]
        assert ["-i", str(key)] == argv[argv.index("-i"):argv.index("-i") + 2]
        assert "ConnectTimeout=3" in argv
    assert calls["gpu1"][calls["gpu1"].index("-l"):][:4] == ["-l", "alice", "-p", "2222"]
    assert calls["gpu1"][calls["gpu1"].index("-J") + 1] == "b1,carol@b2:22"
    assert calls["b2"][calls["b2"].index("-J") + 1] == "none" and "carol" in calls["b2"]
    assert "-J" not in calls["b1"] and "-l" not in calls["b1"] and "-p" not in calls["b1"]


def test_nothing_given_nothing_passed(fake_ssh):
    """Options the user did not give are not options: ssh -G sees only -G, -F (HOME is not the passwd home here,
    see below) and the host."""
    _resolve("gpu1")
    (argv,) = _calls(fake_ssh)
    assert argv[:2] == ["-G", "-F"] and argv[3:] == ["--", "gpu1"]


def test_home_config_when_home_is_not_the_passwd_home(fake_ssh, home, monkeypatch):
    """HOME elsewhere (as in these tests): ssh gets ``-F`` a config that includes $HOME's then the system's, removed
    afterwards; with HOME = the passwd home, no -F at all (ssh reads its own files)."""
    monkeypatch.setenv("FAKE_SSH_F", "1")
    _resolve("gpu1")
    (argv,) = _calls(fake_ssh)
    path = argv[argv.index("-F") + 1]
    assert not os.path.exists(path)
    (copy,) = fake_ssh.glob("config.*")
    lines = [ln for ln in copy.read_text().splitlines() if not ln.startswith("#")]
    assert lines == [f'Include "{home}/.ssh/config"', "Include /etc/ssh/ssh_config"]

    for p in fake_ssh.glob("argv.*"):
        p.unlink()
    monkeypatch.setenv("HOME", pwd.getpwuid(os.getuid()).pw_dir)
    _resolve("gpu1")
    (argv,) = _calls(fake_ssh)
    assert "-F" not in argv


def test_ssh_g_output_becomes_a_hop(fake_ssh, home, monkeypatch):
    """Every value eaglepatch uses, as ssh -G prints it (identity files unexpanded, as OpenSSH 9.2 prints them;
    known-hosts files expanded with the passwd home, rebased onto $HOME)."""
    pw_home = pwd.getpwuid(os.getuid()).pw_dir
    (home / ".ssh" / "id_bob_real.example").write_text("k")
    (home / "k2").write_text("k")
    (home / ".ssh" / "id_ed25519").write_text("k")
    monkeypatch.setenv("KEYDIR", str(home))
    monkeypatch.setenv("SHELL", "/bin/sh")
    (fake_ssh / "out").write_text(
        "host alias\nuser bob\nhostname real.example\nport 2222\nidentitiesonly yes\nconnecttimeout 7\n"
        "identityfile ~/.ssh/id_%r_%h\nidentityfile %d/k2\nidentityfile ${KEYDIR}/k2\nidentityfile ~/missing\n"
        "identityfile ~/.ssh/id_ed25519\n"
        "proxycommand nc %h %p %r %n %%\nstricthostkeychecking accept-new\nhashknownhosts yes\n"
        f"userknownhostsfile {pw_home}/.ssh/known_hosts /srv/kh\nglobalknownhostsfile /etc/ssh/ssh_known_hosts\n")
    (hop,) = _resolve("alias")
    assert (hop.name, hop.hostname, hop.user, hop.port, hop.source) == ("alias", "real.example", "bob", 2222, "ssh -G")
    assert hop.identity_files == (f"{home}/.ssh/id_bob_real.example", f"{home}/k2", f"{home}/.ssh/id_ed25519")
    assert hop.identities_only is True
    assert (hop.timeout, hop.timeout_from) == (7.0, "ConnectTimeout")
    assert shlex.split(hop.proxy_command) == ["/bin/sh", "-c", "exec nc real.example 2222 bob alias %"]
    assert hop.host_keys == ssh_config.HostKeyPolicy(
        check="accept-new", known_hosts=(f"{home}/.ssh/known_hosts", "/srv/kh", "/etc/ssh/ssh_known_hosts"),
        save_to=f"{home}/.ssh/known_hosts", hash_names=True)
    assert hop.known_hosts_name == "[real.example]:2222"


@pytest.mark.parametrize("printed, check", [("true", "yes"), ("ask", "yes"), ("false", "no"), ("accept-new",
                                                                                                  "accept-new")])
@pytest.mark.parametrize("flag", [False, True])
def test_strict_host_key_checking_values(fake_ssh, printed, check, flag):
    """ssh -G prints yes/no as true/false; ask is yes (no prompt); --accept-new-host-key makes any of them
    accept-new."""
    (fake_ssh / "out").write_text(f"hostname h\nstricthostkeychecking {printed}\n")
    (hop,) = _resolve("h", accept_new_host_key=flag)
    assert hop.host_keys.check == ("accept-new" if flag else check)


def test_known_hosts_none(fake_ssh):
    (fake_ssh / "out").write_text("hostname h\nuserknownhostsfile none\nglobalknownhostsfile /g\n")
    (hop,) = _resolve("h")
    assert hop.host_keys.known_hosts == ("/g",) and hop.host_keys.save_to is None


@pytest.mark.parametrize("printed, given, expected", [
    ("none", None, (DEFAULT_CONNECT_TIMEOUT, "default")),
    ("3", None, (3.0, "ConnectTimeout")),
    ("3", 0.5, (0.5, "--connect-timeout")),
    ("none", 12, (12.0, "--connect-timeout")),
])
def test_connect_timeout(fake_ssh, printed, given, expected):
    (fake_ssh / "out").write_text(f"hostname h\nconnecttimeout {printed}\n")
    (hop,) = _resolve("h", connect_timeout=given)
    assert (hop.timeout, hop.timeout_from) == expected


def test_proxyjump_from_the_config_and_self_reference(fake_ssh):
    """The config's ProxyJump builds the chain; a hop named after the host it leads to is dropped (a wildcard
    ``Host *`` ProxyJump applied to the jump host itself); the target's ProxyCommand gives way to the jump."""
    (fake_ssh / "out.t").write_text("hostname t.example\nproxyjump j,t\nproxycommand nc %h %p\n")
    (fake_ssh / "out.j").write_text("hostname j.example\nproxyjump j\n")
    hops = _resolve("t")
    assert [(h.name, h.hostname, h.proxy_command) for h in hops] == [("j", "j.example", None),
                                                                    ("t", "t.example", None)]


def test_proxyjump_by_address_to_another_port_is_a_hop(fake_ssh):
    """``ProxyJump root@[127.0.0.1]:2222`` (how ssh -G prints a jump given by address) for a target on
    127.0.0.1:22: another port of the same machine is another sshd, a real hop (it used to be dropped as the
    target itself, so eaglepatch connected straight to the target); the very same address, port and user is not."""
    (fake_ssh / "out.t").write_text("hostname 127.0.0.1\nuser root\nport 22\nproxyjump root@[127.0.0.1]:2222\n")
    (fake_ssh / "out.127.0.0.1").write_text("hostname 127.0.0.1\nuser root\nport 2222\n")
    hops = _resolve("t")
    assert [(h.hostname, h.port, h.user) for h in hops] == [("127.0.0.1", 2222, "root"), ("127.0.0.1", 22, "root")]
    (fake_ssh / "out.t").write_text("hostname 127.0.0.1\nuser root\nport 2222\nproxyjump root@[127.0.0.1]:2222\n")
    assert [(h.hostname, h.port) for h in _resolve("t")] == [("127.0.0.1", 2222)]
    (fake_ssh / "out.t").write_text("hostname 127.0.0.1\nuser root\nport 2222\nproxyjump admin@[127.0.0.1]:2222\n")
    assert [(h.hostname, h.port, h.user) for h in _resolve("t")][0] == ("127.0.0.1", 2222, "admin")


def test_host_key_alias(fake_ssh):
    """``HostKeyAlias`` (ssh -G prints it): the name the key is looked up and saved under, without a port."""
    (fake_ssh / "out.t").write_text("hostname 10.0.0.7\nport 2200\nhostkeyalias gpu-box\n")
    [hop] = _resolve("t")
    assert (hop.host_keys.alias, hop.known_hosts_name, hop.address_name) == ("gpu-box", "gpu-box", "[10.0.0.7]:2200")
    (fake_ssh / "out.t").write_text("hostname 10.0.0.7\nport 2200\n")
    [hop] = _resolve("t")
    assert (hop.host_keys.alias, hop.known_hosts_name) == (None, "[10.0.0.7]:2200")


def test_ssh_g_failure_falls_back(fake_ssh, home, monkeypatch):
    """ssh -G exits 255 (a config it refuses, no -G): paramiko's SSHConfig reads the same files instead."""
    monkeypatch.setenv("FAKE_SSH_RC", "255")
    (home / ".ssh" / "config").write_text("Host fb\n    HostName fb.example\n    Port 2200\n")
    (hop,) = _resolve("fb")
    assert (hop.source, hop.hostname, hop.port) == ("paramiko", "fb.example", 2200)


def test_ssh_g_timeout_is_an_error(fake_ssh, monkeypatch):
    from eaglepatch.errors import ConnectionFailed

    (fake_ssh / "ssh").write_text("#!/bin/sh\nexec sleep 30\n")
    monkeypatch.setattr(ssh_config, "SSH_G_TIMEOUT", 0.3)
    with pytest.raises(ConnectionFailed, match="'ssh -G slow' did not finish within 0.3 s"):
        _resolve("slow")


# ------------------------------------------------------------------------------------------------------ fallback


@pytest.fixture
def no_ssh(tmp_path, monkeypatch, home):
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    assert ssh_config.find_ssh() is None


def test_fallback_defaults(no_ssh, home):
    """No config at all: OpenSSH's defaults (local user, port 22, ~/.ssh/id_* that exist, known_hosts files,
    StrictHostKeyChecking ask = yes, no ConnectTimeout)."""
    (home / ".ssh" / "id_ed25519").write_text("k")
    (hop,) = _resolve("plain")
    assert (hop.source, hop.hostname, hop.port, hop.user) == ("paramiko", "plain", 22, ssh_config.local_user())
    assert hop.identity_files == (f"{home}/.ssh/id_ed25519",)
    assert hop.host_keys.save_to == f"{home}/.ssh/known_hosts" and hop.host_keys.check == "yes"
    assert (hop.timeout, hop.timeout_from, hop.identities_only) == (DEFAULT_CONNECT_TIMEOUT, "default", False)


def test_fallback_identity_option_replaces_defaults(no_ssh, home, tmp_path):
    """-i given: it is tried first, then the config's keys, and the default ~/.ssh/id_* are not added (as ssh)."""
    (home / ".ssh" / "id_ed25519").write_text("k")
    key = tmp_path / "given"
    key.write_text("k")
    (home / ".ssh" / "config").write_text("Host k\n    IdentityFile ~/.ssh/cfgkey\n")
    (home / ".ssh" / "cfgkey").write_text("k")
    (hop,) = _resolve("k", identity=str(key))
    assert hop.identity_files == (str(key), f"{home}/.ssh/cfgkey")


def test_fallback_jump_and_proxycommand(no_ssh, home):
    """Both ProxyJump and ProxyCommand for one host (paramiko's lookup cannot tell which came first): the jump;
    with -J none, the ProxyCommand (paramiko has expanded its tokens)."""
    (home / ".ssh" / "config").write_text("Host pj\n    ProxyJump bastion:2\n    ProxyCommand nc %h %p\n")
    hops = _resolve("pj")
    assert [(h.name, h.port) for h in hops] == [("bastion", 2), ("pj", 22)]
    (hop,) = _resolve("pj", jump="none")
    assert shlex.split(hop.proxy_command)[-1] == "exec nc pj 22"


def test_fallback_bad_port(no_ssh, home):
    (home / ".ssh" / "config").write_text("Host bp\n    Port abc\n")
    with pytest.raises(UsageError, match="bad SSH config for bp: Port 'abc'"):
        _resolve("bp")


def test_expand_includes(tmp_path, monkeypatch):
    """Include, inlined: globs sorted, relative to the base folder, ``~`` = $HOME, ``Include=`` too, a pattern that
    matches nothing is no error; after an included file the header of the Include's block comes again (``Host *``
    at the top level), so what follows stays in it."""
    base = tmp_path / "ssh"
    (base / "d").mkdir(parents=True)
    (base / "d" / "b.conf").write_text("Host b\n    Port 2\n")
    (base / "d" / "a.conf").write_text("Host a\n    Port 1\n")
    (base / "x").write_text("    User fromx\n")
    monkeypatch.setenv("HOME", str(tmp_path / "h"))
    (tmp_path / "h").mkdir()
    (tmp_path / "h" / "inc").write_text("Host fromhome\n")
    main = base / "config"
    main.write_text("Include d/*.conf ~/inc\nHost top\n    Include x\n    Port 3\n    Include=/nonexistent/*\n")
    text = ssh_config.expand_includes(str(main), str(base))
    assert text.splitlines() == ["Host a", "    Port 1", "Host b", "    Port 2", "Host fromhome", "Host *",
                                 "Host top", "    User fromx", "Host top", "    Port 3", "Host top"]


def test_fallback_top_level_after_include(no_ssh, home):
    """A top-level line after an Include applies to every host (OpenSSH restores the including file's state), not
    just to the last block of the included file: the included ``Host other`` must not swallow ``Port 2222``."""
    (home / ".ssh" / "other").write_text("Host other\n    User o\n")
    (home / ".ssh" / "config").write_text("Include other\nPort 2222\n")
    assert _resolve("anything")[-1].port == 2222
    assert (_resolve("other")[-1].user, _resolve("other")[-1].port) == ("o", 2222)


def test_include_loop_is_refused(tmp_path):
    loop = tmp_path / "loop"
    loop.write_text(f"Include {loop}\n")
    with pytest.raises(UsageError, match="nest deeper than 16"):
        ssh_config.expand_includes(str(loop), str(tmp_path))


# ------------------------------------------------------------------------------------------------------ helpers


def test_tokens():
    t = ssh_config._Tokens("alias", "real", 2222, "bob", "/home/x", "j1,u@[::1]:23", None)
    this = socket.gethostname()
    assert t.expand("%d/%h-%p-%r-%n-%%-%j-%k-%z") == "/home/x/real-2222-bob-alias-%-::1-alias-%z"
    assert t.expand("%l %L %u %i") == f"{this} {this.split('.')[0]} {ssh_config.local_user()} {os.getuid()}"
    assert t.expand("%C") == hashlib.sha1(f"{this}real2222bob::1".encode()).hexdigest()
    os.environ["EP_TOKEN_TEST"] = "v"
    try:
        assert t.expand("${EP_TOKEN_TEST}/${NOT_SET_EP}", env=True) == "v/${NOT_SET_EP}"
        assert t.expand("${EP_TOKEN_TEST}") == "${EP_TOKEN_TEST}"  # only where ssh expands them
    finally:
        del os.environ["EP_TOKEN_TEST"]


def test_parse_ssh_g():
    assert ssh_config._parse_ssh_g("Host x\nidentityfile a b\nidentityfile c\n\nport 22\n") == {
        "host": ["x"], "identityfile": ["a b", "c"], "port": ["22"]}


def test_last_jump_host():
    assert [ssh_config.parse_last_jump_host(j) for j in ("a", "a,b:2", "u@c", "ssh://u@[::1]:2/", "::1")] == [
        "a", "b", "c", "::1", "::1"]
    assert Hop("b") == parse_target("x", SSHOptions(jump="a,b")).jump[-1]
