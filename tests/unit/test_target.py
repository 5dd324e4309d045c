"""Parsing TARGET and the SSH options (eaglepatch.hosts.target): every form, every conflict."""

from __future__ import annotations

import dataclasses
import os

import pytest

from eaglepatch.errors import ExitCode, UsageError
from eaglepatch.hosts.local import LocalHost
from eaglepatch.hosts.spec import (
    DEFAULT_CONNECT_TIMEOUT,
    Hop,
    SSHOptions,
    TargetSpec,
    format_destination,
    parse_hop,
    parse_jump,
)
from eaglepatch.hosts.target import is_local_target, open_host, parse_target


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    """Run in an empty folder with a private HOME, so that no name exists locally by accident."""
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return work


# ------------------------------------------------------------------------------------------------------ local


@pytest.mark.parametrize(
    "text, expected",
    [
        ("/opt/sglang", "/opt/sglang"),
        ("/opt/x/../sglang/", "/opt/sglang"),
        ("./python/sglang", "{cwd}/python/sglang"),
        ("../elsewhere", "{parent}/elsewhere"),
        ("~", "{home}"),
        ("~/venv/lib", "{home}/venv/lib"),
        ("file:/srv/sglang", "/srv/sglang"),
        ("file:///srv/sglang", "/srv/sglang"),
        ("file:relative/dir", "{cwd}/relative/dir"),
        ("file:~/x", "{home}/x"),
        (".", "{cwd}"),
        ("..", "{parent}"),
    ],
)
def test_local_forms(text, expected, _isolated):
    cwd = str(_isolated)
    spec = parse_target(text)
    assert spec.kind == "local" and spec.is_local
    assert spec.path == expected.format(cwd=cwd, parent=os.path.dirname(cwd), home=os.environ["HOME"])
    assert spec.text == text
    assert spec.host is None and spec.user is None and spec.port is None


def test_existing_relative_name_is_local(_isolated):
    (_isolated / "gpu1").mkdir()
    spec = parse_target("gpu1")
    assert spec.is_local and spec.path == str(_isolated / "gpu1")
    assert is_local_target("gpu1")
    # ssh:// forces SSH for a name that also exists here
    spec = parse_target("ssh://gpu1")
    assert spec.kind == "ssh" and spec.host == "gpu1"


def test_existing_file_with_colon_is_local(_isolated):
    (_isolated / "a:b").write_text("")
    assert parse_target("a:b").is_local


def test_local_name_drops_file_prefix():
    assert parse_target("file:/srv/x").name == "/srv/x"
    assert parse_target("/srv/x").name == "/srv/x"
    assert parse_target("/srv/x").destination == "/srv/x"


@pytest.mark.parametrize(
    "options, flag",
    [
        (SSHOptions(port=22), "-p/--port"),
        (SSHOptions(jump="bastion"), "-J/--jump"),
    ],
)
def test_ssh_options_on_a_local_target(options, flag):
    with pytest.raises(UsageError, match=flag):
        parse_target("/opt/sglang", options)


def test_identity_on_a_local_target(tmp_path):
    key = tmp_path / "key"
    key.write_text("k")
    with pytest.raises(UsageError, match="-i/--identity applies to SSH targets"):
        parse_target("./x", SSHOptions(identity=str(key)))


def test_local_name_that_exists_suggests_ssh_url(_isolated):
    (_isolated / "gpu1").mkdir()
    with pytest.raises(UsageError, match="ssh://gpu1"):
        parse_target("gpu1", SSHOptions(port=2222))


def test_local_target_keeps_timeout_and_flag():
    spec = parse_target("/x", SSHOptions(connect_timeout=3, accept_new_host_key=True))
    assert spec.connect_timeout == 3.0 and spec.accept_new_host_key


def test_empty_file_target():
    with pytest.raises(UsageError, match="names no path"):
        parse_target("file:")


# ------------------------------------------------------------------------------------------------------ ssh


@pytest.mark.parametrize(
    "text, user, host, port",
    [
        ("gpu1", None, "gpu1", None),
        ("root@gpu1", "root", "gpu1", None),
        ("root@gpu1:2222", "root", "gpu1", 2222),
        ("gpu1:2222", None, "gpu1", 2222),
        ("gpu-1.example.com", None, "gpu-1.example.com", None),
        ("10.0.0.7:22", None, "10.0.0.7", 22),
        ("ubuntu@10.0.0.7", "ubuntu", "10.0.0.7", None),
        ("first.last@host", "first.last", "host", None),
        ("me@corp@host", "me@corp", "host", None),  # the last '@' separates the host, as ssh does
        ("[::1]:2222", None, "::1", 2222),
        ("root@[::1]:2222", "root", "::1", 2222),
        ("[fe80::1%eth0]:22", None, "fe80::1%eth0", 22),
        ("[::1]", None, "::1", None),
        ("::1", None, "::1", None),
        ("root@2001:db8::7", "root", "2001:db8::7", None),
        ("testbox", None, "testbox", None),  # a ~/.ssh/config alias is just a host here
        ("ssh://root@gpu1:2200", "root", "gpu1", 2200),
        ("ssh://gpu1/", None, "gpu1", None),
        ("ssh://[::1]:2", None, "::1", 2),
    ],
)
def test_ssh_forms(text, user, host, port):
    spec = parse_target(text)
    assert spec.kind == "ssh" and not spec.is_local
    assert (spec.user, spec.host, spec.port) == (user, host, port)
    assert spec.text == text and spec.name == text
    assert spec.path is None
    assert spec.identity is None and spec.jump is None
    assert spec.connect_timeout is None  # not given: the SSH config's ConnectTimeout, else DEFAULT_CONNECT_TIMEOUT
    assert spec.accept_new_host_key is False


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "empty TARGET"),
        ("   ", "empty TARGET"),
        (" gpu1", "leading or trailing spaces"),
        ("gpu1:", "port '' is not a number"),
        ("gpu1:ssh", "port 'ssh' is not a number"),
        ("gpu1:0", "out of range"),
        ("gpu1:65536", "out of range"),
        ("gpu1:-1", "not a number"),
        ("@gpu1", "bad user name"),
        ("root@", "no host name"),
        (":22", "no host name"),
        ("a b", "neither an existing local path nor an SSH destination"),
        ("foo/bar", "neither an existing local path nor an SSH destination"),
        ("gpu1;rm", "neither an existing local path nor an SSH destination"),
        ("[::1", "missing ']'"),
        ("[::1]x", "unexpected 'x'"),
        ("[]:22", "empty address"),
        ("[::1]:http", "not a number"),
        ("ro ot@gpu1", "bad user name"),
        ("a;touch /tmp/x@gpu1", "bad user name"),  # a ProxyCommand's %r goes to a shell: as OpenSSH refuses it
        ("$(id)@gpu1", "bad user name"),
        ("-oProxyCommand=x@gpu1", "bad user name"),
        ("ssh://", "has no host name|is empty"),
        ("gg::zz", "not a host name or address"),
    ],
)
def test_bad_ssh_forms(text, message):
    with pytest.raises(UsageError, match=message) as exc:
        parse_target(text)
    assert "\n" not in str(exc.value)
    assert exc.value.exit_code == ExitCode.USAGE


def test_port_option():
    assert parse_target("gpu1", SSHOptions(port=2222)).port == 2222
    assert parse_target("gpu1:2222", SSHOptions(port=2222)).port == 2222  # the same port twice: no conflict


def test_port_option_conflicts_with_target_port():
    with pytest.raises(UsageError, match="says port 2222 but -p/--port says 22"):
        parse_target("gpu1:2222", SSHOptions(port=22))
    with pytest.raises(UsageError, match="give the port once"):
        parse_target("[::1]:2222", SSHOptions(port=2200))


@pytest.mark.parametrize("port", [0, 65536, -5, True, "22"])
def test_bad_port_option(port):
    with pytest.raises(UsageError, match="-p/--port"):
        parse_target("gpu1", SSHOptions(port=port))


def test_identity_option(tmp_path, monkeypatch):
    key = tmp_path / "home" / ".ssh" / "id_gpu"
    key.parent.mkdir(parents=True)
    key.write_text("k")
    spec = parse_target("gpu1", SSHOptions(identity="~/.ssh/id_gpu"))
    assert spec.identity == str(key)
    monkeypatch.chdir(key.parent)
    assert parse_target("gpu1", SSHOptions(identity="id_gpu")).identity == str(key)  # made absolute


def test_identity_missing():
    with pytest.raises(UsageError, match="identity file /no/such/key does not exist"):
        parse_target("gpu1", SSHOptions(identity="/no/such/key"))
    with pytest.raises(UsageError, match="-i/--identity is empty"):
        parse_target("gpu1", SSHOptions(identity=""))


def test_jump_option():
    spec = parse_target("gpu1", SSHOptions(jump="admin@bastion:2200"))
    assert spec.jump == (Hop("bastion", "admin", 2200),)
    spec = parse_target("gpu1", SSHOptions(jump="b1, ssh://b2:22,[::1]:2"))
    assert spec.jump == (Hop("b1"), Hop("b2", None, 22), Hop("::1", None, 2))
    assert parse_target("gpu1", SSHOptions(jump="none")).jump == ()
    assert parse_target("gpu1", SSHOptions(jump="NONE")).jump == ()
    assert parse_target("gpu1").jump is None  # None: whatever ~/.ssh/config's ProxyJump says


@pytest.mark.parametrize("jump", ["", "a,,b", "u@", "bastion:x", "a b", "bastion:99999"])
def test_bad_jump_option(jump):
    with pytest.raises(UsageError, match="-J/--jump"):
        parse_target("gpu1", SSHOptions(jump=jump))


def test_parse_jump_and_hop_directly():
    assert parse_jump("a@b:1,c") == (Hop("b", "a", 1), Hop("c"))
    assert parse_hop("x@[::1]:5") == Hop("::1", "x", 5)
    assert str(Hop("::1", "x", 5)) == "x@[::1]:5"
    assert str(Hop("h")) == "h"


@pytest.mark.parametrize("timeout, expected", [(3, 3.0), (0.5, 0.5), ("7", 7.0), (None, None)])
def test_connect_timeout(timeout, expected):
    assert parse_target("gpu1", SSHOptions(connect_timeout=timeout)).connect_timeout == expected


def test_connect_timeout_not_given_is_none():
    """Not given means "the SSH config's ConnectTimeout, else DEFAULT_CONNECT_TIMEOUT" (decided when connecting), so
    neither the options nor the spec carry a default that would override the config."""
    assert SSHOptions().connect_timeout is None
    assert parse_target("gpu1").connect_timeout is None
    assert DEFAULT_CONNECT_TIMEOUT == 10.0


@pytest.mark.parametrize("timeout", [0, -1, "abc", float("nan"), float("inf")])
def test_bad_connect_timeout(timeout):
    with pytest.raises(UsageError, match="--connect-timeout"):
        parse_target("gpu1", SSHOptions(connect_timeout=timeout))


def test_accept_new_host_key():
    assert parse_target("gpu1", SSHOptions(accept_new_host_key=True)).accept_new_host_key is True
    assert parse_target("gpu1").accept_new_host_key is False


def test_destination_and_format():
    assert parse_target("root@gpu1:2222").destination == "root@gpu1:2222"
    assert parse_target("gpu1", SSHOptions(port=2)).destination == "gpu1:2"
    assert parse_target("root@[::1]:2222").destination == "root@[::1]:2222"
    assert parse_target("::1").destination == "::1"
    assert format_destination("::1", None, 22) == "[::1]:22"
    assert format_destination("h", "u") == "u@h"


def test_frozen():
    spec = parse_target("gpu1")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.host = "other"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        SSHOptions().port = 1  # type: ignore[misc]
    assert isinstance(spec, TargetSpec)
    assert parse_target("gpu1") == parse_target("gpu1")  # value equality, hashable
    assert len({parse_target("gpu1"), parse_target("gpu1")}) == 1


def test_open_host_local():
    """The one way to build a local host: named as the target, so that messages name it as typed."""
    host = open_host(parse_target("/tmp"))
    assert isinstance(host, LocalHost) and host.is_local and host.name == "/tmp"
    assert open_host(parse_target("file:/tmp")).name == "/tmp"
    host.close()
