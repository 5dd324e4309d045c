"""The parsed TARGET and the command line's SSH options, as data; ``[user@]host[:port]`` parsing and formatting.

The bottom of ``eaglepatch.hosts``: it imports nothing of it, and every other module of it may import it
(``target`` parses TARGET into a ``TargetSpec``, ``ssh_config`` resolves one, ``ssh`` connects).
"""

from __future__ import annotations

import dataclasses
import re

from eaglepatch.errors import UsageError

#: Seconds to wait for the TCP connection and the SSH handshake when neither --connect-timeout nor the
#: ``ConnectTimeout`` of the SSH config says otherwise (OpenSSH itself has none: it waits for the kernel's).
DEFAULT_CONNECT_TIMEOUT = 10.0

# A DNS name, an IPv4 address or an ssh_config alias: no whitespace, no '/', '@', '[', ']' or shell-ish characters.
_HOST_RE = re.compile(r"^[A-Za-z0-9_.%+-]+$")
# A user name: what OpenSSH itself accepts in a %r expansion (its valid_ruser: no shell metacharacters, no leading
# '-'), since a ProxyCommand of the SSH config may carry it to a shell.
_USER_RE = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_.+@\\-]*$")
_V6_RE = re.compile(r"^[0-9A-Fa-f:.]+(%[A-Za-z0-9_.-]+)?$")


@dataclasses.dataclass(frozen=True)
class SSHOptions:
    """The SSH options of the command line (``-i``, ``-p``, ``-J``, ``--connect-timeout``, ``--accept-new-host-key``).

    Each one given overrides the SSH config; one not given (None, False) leaves the config's value in force.
    ``connect_timeout`` None means: ``ConnectTimeout`` from the SSH config, else ``DEFAULT_CONNECT_TIMEOUT``.
    ``jump`` is OpenSSH's ProxyJump syntax: ``[user@]host[:port]``, comma-separated hops, or ``none``.
    """

    identity: str | None = None
    port: int | None = None
    jump: str | None = None
    connect_timeout: float | None = None
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
    connect_timeout: float | None = None  # ssh: None = the SSH config's ConnectTimeout, else DEFAULT_CONNECT_TIMEOUT
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


def _parse_port(text: str, whole: str, what: str) -> int:
    if not text.isdigit():
        raise UsageError(f"{what} {whole!r}: port {text!r} is not a number: write host:port, e.g. gpu1:2222")
    port = int(text)
    _check_port(port, f"{what} {whole!r}")
    return port


def _check_port(port: object, what: str) -> None:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise UsageError(f"{what}: port {port!r} is out of range: give a number from 1 to 65535")
