"""Parsing TARGET: a local path, or an SSH destination plus the SSH options of CONTRACT.md "Targets".

``parse_target(text, options)`` turns what the user typed into a frozen ``TargetSpec``; ``open_host(spec)`` turns that
into a ``Host`` (``LocalHost`` or ``SSHHost``). Nothing here touches the network; ``~/.ssh/config`` is read later, by
``eaglepatch.hosts.ssh``, when the connection is made (so a ``Host`` alias needs no special form here).

Forms:

- local: anything that exists on this machine, or starts with ``/``, ``./``, ``../``, ``~`` or ``file:``
  (``file:`` and ``file://`` are stripped; ``~`` is expanded; the path is made absolute).
- SSH: ``[user@]host[:port]``, ``[user@][v6addr]:port``, a bare IPv6 address, a ``Host`` alias of
  ``~/.ssh/config``, or explicitly ``ssh://[user@]host[:port]`` (for a name that also exists as a local file).
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import TYPE_CHECKING

from eaglepatch.errors import UsageError

if TYPE_CHECKING:  # pragma: no cover
    from eaglepatch.hosts.base import Host

#: Seconds to wait for the TCP connection and the SSH handshake when neither --connect-timeout nor the
#: ``ConnectTimeout`` of ~/.ssh/config says otherwise.
DEFAULT_CONNECT_TIMEOUT = 10.0

_LOCAL_PREFIXES = ("/", "./", "../", "~", "file:")
# A DNS name, an IPv4 address or an ssh_config alias: no whitespace, no '/', '@', '[', ']' or shell-ish characters.
_HOST_RE = re.compile(r"^[A-Za-z0-9_.%+-]+$")
_USER_RE = re.compile(r"^[^\s/:\[\]]+$")
_V6_RE = re.compile(r"^[0-9A-Fa-f:.]+(%[A-Za-z0-9_.-]+)?$")


@dataclasses.dataclass(frozen=True)
class SSHOptions:
    """The SSH options of the command line (``-i``, ``-p``, ``-J``, ``--connect-timeout``, ``--accept-new-host-key``).

    ``connect_timeout`` None means: ``ConnectTimeout`` from ~/.ssh/config, else ``DEFAULT_CONNECT_TIMEOUT``.
    ``jump`` is OpenSSH's ProxyJump syntax: ``[user@]host[:port]``, comma-separated hops, or ``none``.
    """

    identity: str | None = None
    port: int | None = None
    jump: str | None = None
    connect_timeout: float | None = DEFAULT_CONNECT_TIMEOUT
    accept_new_host_key: bool = False


@dataclasses.dataclass(frozen=True)
class Hop:
    """One parsed ``[user@]host[:port]`` (a destination or a jump hop); ``host`` has no brackets."""

    host: str
    user: str | None = None
    port: int | None = None

    def __str__(self) -> str:
        return format_destination(self.host, self.user, self.port)


@dataclasses.dataclass(frozen=True)
class TargetSpec:
    """A parsed TARGET. ``kind`` is ``"local"`` (``path`` set) or ``"ssh"`` (``host`` set, options folded in)."""

    text: str  # what the user typed; messages and JSON name the target by it
    kind: str  # "local" | "ssh"
    path: str | None = None  # local: absolute, ~ expanded
    user: str | None = None  # ssh: None = from ~/.ssh/config, else the local user name
    host: str | None = None  # ssh: a name, an address (IPv6 without brackets) or a ~/.ssh/config alias
    port: int | None = None  # ssh: None = from ~/.ssh/config, else 22
    identity: str | None = None  # ssh: absolute path of -i FILE
    jump: tuple[Hop, ...] | None = None  # ssh: None = ~/.ssh/config's ProxyJump; () = no jump (-J none)
    connect_timeout: float | None = DEFAULT_CONNECT_TIMEOUT
    accept_new_host_key: bool = False

    @property
    def is_local(self) -> bool:
        return self.kind == "local"

    @property
    def name(self) -> str:
        """How messages name the target: the text as typed (``file:`` prefix dropped for local paths)."""
        return self.path if self.is_local and self.text.startswith("file:") else self.text

    @property
    def destination(self) -> str:
        """``[user@]host[:port]`` as parsed (before ~/.ssh/config); the path for a local target."""
        if self.is_local:
            return self.path or ""
        return format_destination(self.host or "", self.user, self.port)


def format_destination(host: str, user: str | None = None, port: int | None = None) -> str:
    """``user@host:port`` with brackets around an IPv6 address when a port follows."""
    text = f"[{host}]" if (port is not None and ":" in host) else host
    if user:
        text = f"{user}@{text}"
    if port is not None:
        text = f"{text}:{port}"
    return text


def is_local_target(text: str) -> bool:
    """CONTRACT.md: local when it exists on this machine or starts with ``/``, ``./``, ``../``, ``~`` or ``file:``."""
    if text.startswith(_LOCAL_PREFIXES) or text in (".", ".."):
        return True
    return os.path.exists(text)


def parse_target(text: str, options: SSHOptions | None = None) -> TargetSpec:
    """Parse a TARGET with the command line's SSH options; raises ``UsageError`` with a one-line hint."""
    options = options or SSHOptions()
    if not isinstance(text, str) or not text.strip():
        raise UsageError("empty TARGET: give an SSH destination ([user@]host[:port]) or a local path")
    if text != text.strip():
        raise UsageError(f"TARGET {text!r} has leading or trailing spaces: remove them")
    timeout = _check_timeout(options.connect_timeout)

    if text.startswith("ssh://"):
        return _ssh_spec(text, text[len("ssh://") :].rstrip("/"), options, timeout)
    if is_local_target(text):
        path = text
        if path.startswith("file://"):
            path = path[len("file://") :]
        elif path.startswith("file:"):
            path = path[len("file:") :]
        if not path:
            raise UsageError(f"TARGET {text!r} names no path: write file:/path/to/dir")
        path = os.path.abspath(os.path.expanduser(path))
        for flag, value in (("-i/--identity", options.identity), ("-p/--port", options.port), ("-J/--jump", options.jump)):
            if value is not None:
                hint = f"ssh://{text}" if not text.startswith(_LOCAL_PREFIXES) else "an SSH destination"
                raise UsageError(
                    f"{flag} applies to SSH targets, but TARGET {text!r} is a local path ({path}): "
                    f"drop {flag.split('/')[0]} or write {hint}"
                )
        return TargetSpec(text=text, kind="local", path=path, connect_timeout=timeout,
                          accept_new_host_key=options.accept_new_host_key)
    return _ssh_spec(text, text, options, timeout)


def parse_hop(text: str, what: str = "TARGET") -> Hop:
    """Parse ``[user@]host[:port]`` (brackets for IPv6 with a port; a bare IPv6 address also works)."""
    if not text:
        raise UsageError(f"{what} is empty: give [user@]host[:port]")
    user: str | None = None
    rest = text
    if "@" in text:
        user, _, rest = text.rpartition("@")
        if not user or not _USER_RE.match(user):
            raise UsageError(f"{what} {text!r}: bad user name before '@': write user@host[:port]")
    port: int | None = None
    if rest.startswith("["):
        end = rest.find("]")
        if end < 0:
            raise UsageError(f"{what} {text!r}: missing ']': write [v6addr]:port, e.g. [::1]:2222")
        host, tail = rest[1:end], rest[end + 1 :]
        if not host:
            raise UsageError(f"{what} {text!r}: empty address in brackets")
        if tail:
            if not tail.startswith(":"):
                raise UsageError(f"{what} {text!r}: unexpected {tail!r} after ']': write [v6addr]:port")
            port = _parse_port(tail[1:], text, what)
        if not (_V6_RE.match(host) or _HOST_RE.match(host)):
            raise UsageError(f"{what} {text!r}: {host!r} is not a host name or IPv6 address")
        return Hop(host=host, user=user, port=port)
    if rest.count(":") >= 2:  # a bare IPv6 address: no port possible without brackets
        if not _V6_RE.match(rest):
            raise UsageError(f"{what} {text!r}: not a host name or address: write [v6addr]:port for IPv6")
        return Hop(host=rest, user=user, port=None)
    host, sep, port_text = rest.partition(":")
    if sep:
        port = _parse_port(port_text, text, what)
    if not host:
        raise UsageError(f"{what} {text!r} has no host name: write [user@]host[:port]")
    if not _HOST_RE.match(host):
        raise UsageError(
            f"{what} {text!r} is neither an existing local path nor an SSH destination: "
            "write [user@]host[:port], or ./path for a local path"
        )
    return Hop(host=host, user=user, port=port)


def parse_jump(text: str) -> tuple[Hop, ...]:
    """OpenSSH's ProxyJump value: comma-separated ``[user@]host[:port]`` hops (``ssh://`` allowed), or ``none``."""
    text = text.strip()
    if text.lower() == "none":
        return ()
    hops = []
    for part in text.split(","):
        part = part.strip()
        if part.startswith("ssh://"):
            part = part[len("ssh://") :].rstrip("/")
        hops.append(parse_hop(part, what="-J/--jump host"))
    return tuple(hops)


def open_host(spec: TargetSpec | str, options: SSHOptions | None = None) -> Host:
    """Return a connected ``Host`` for ``spec``: a ``LocalHost``, or an ``SSHHost`` (connects now, so connection,
    authentication and host-key failures raise ``ConnectionFailed`` here). ``options``, when given, re-parse
    ``spec`` with them (a string ``spec`` is parsed with them)."""
    if isinstance(spec, str):
        spec = parse_target(spec, options)
    elif options is not None:
        spec = parse_target(spec.text, options)
    if spec.is_local:
        from eaglepatch.hosts.local import LocalHost

        return LocalHost()
    from eaglepatch.hosts.ssh import SSHHost  # imports paramiko: only when an SSH target is used

    host = SSHHost(spec)
    try:
        host.connect()
    except BaseException:
        host.close()
        raise
    return host


def _ssh_spec(text: str, dest: str, options: SSHOptions, timeout: float | None) -> TargetSpec:
    hop = parse_hop(dest)
    port = hop.port
    if options.port is not None:
        _check_port(options.port, "-p/--port")
        if port is not None and port != options.port:
            raise UsageError(
                f"TARGET {text!r} says port {port} but -p/--port says {options.port}: give the port once"
            )
        port = options.port
    identity = None
    if options.identity is not None:
        if not options.identity:
            raise UsageError("-i/--identity is empty: give the private key file")
        identity = os.path.abspath(os.path.expanduser(options.identity))
        if not os.path.isfile(identity):
            raise UsageError(f"identity file {options.identity} does not exist: check -i/--identity")
    jump = parse_jump(options.jump) if options.jump is not None else None
    return TargetSpec(
        text=text,
        kind="ssh",
        user=hop.user,
        host=hop.host,
        port=port,
        identity=identity,
        jump=jump,
        connect_timeout=timeout,
        accept_new_host_key=bool(options.accept_new_host_key),
    )


def _parse_port(text: str, whole: str, what: str) -> int:
    if not text.isdigit():
        raise UsageError(f"{what} {whole!r}: port {text!r} is not a number: write host:port, e.g. gpu1:2222")
    port = int(text)
    _check_port(port, f"{what} {whole!r}")
    return port


def _check_port(port: object, what: str) -> None:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise UsageError(f"{what}: port {port!r} is out of range: give a number from 1 to 65535")


def _check_timeout(value: float | None) -> float | None:
    if value is None:
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"--connect-timeout {value!r} is not a number of seconds") from None
    if not value > 0 or value != value or value == float("inf"):
        raise UsageError(f"--connect-timeout {value!r} must be a positive number of seconds")
    return value
