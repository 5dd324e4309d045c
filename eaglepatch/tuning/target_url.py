"""Where the load of ``bench`` and ``sweep`` goes: the target server's own address (found from its command line), or
``--url URL``, the router or load balancer in front of it (a prefill/decode pair, replicas).

- ``parse_url``: ``--url`` checked before anything is sent or changed (http or https, a host, an optional port, an
  optional path prefix and query; no fragment, no blanks or control characters, which would end up in a request's
  head); a ``LoadURL``, whose ``shown`` is what may be printed of it (credentials masked, ``eaglepatch.redact``).
- ``check_side``: one side of a prefill/decode pair serves no request alone (the decode side waits for a prefill
  that never comes; the prefill side decodes nothing): without ``--url`` bench and sweep refuse it, exit 2.
- ``load_route``: the load's way there, as the load has always reached the server. Over SSH the load runs on this
  machine and its connections go through a port forwarded over the SSH connection, opened on the target host: the
  URL's host is resolved and reached *as the target host sees it* (``localhost`` is the target host itself). On a
  local target the load connects straight to the URL from this machine. Facts about the target server itself (its
  readiness, its ``/server_info``) are read from the target server, never through the URL.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import urllib.parse
from typing import Any, Iterator

from eaglepatch.errors import ConnectionFailed, Unsupported, UsageError
from eaglepatch.hosts.base import Host
from eaglepatch.redact import MASK, mask_value, shown

SCHEMES = {"http": 80, "https": 443}
# what a URL may hold: printable ASCII without blanks (its host, path and query go into a request's head as they are)
_BAD_CHAR = re.compile(r"[^\x21-\x7e]")
_FORM = "http://HOST[:PORT][/PREFIX] (or https://)"


@dataclasses.dataclass(frozen=True)
class LoadURL:
    """``--url``: the address of the router or load balancer the load goes through. ``prefix``: the path the
    endpoints hang under (``""`` or ``/lb``); ``query``: sent with every request (``token=...``); ``username`` and
    ``password`` (percent-decoded): sent as HTTP Basic credentials instead of the server's ``--api-key``."""

    text: str
    scheme: str
    host: str
    port: int
    prefix: str = ""
    query: str = ""
    username: str | None = None
    password: str | None = None

    @property
    def tls(self) -> bool:
        return self.scheme == "https"

    @property
    def shown(self) -> str:
        """What may be printed of the URL: its credentials masked (a password, a secret query parameter, and a user
        name given alone, which is a token more often than a name)."""
        return masked_url(self.text)


def masked_url(text: str) -> str:
    """``text`` (a URL) as it may be printed: ``redact.mask_value``, and a user name alone (``https://TOKEN@host``)
    masked too."""
    out = mask_value(text)
    scheme, sep, rest = out.partition("://")
    if sep:
        authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
        user, at, _hostport = authority.rpartition("@")
        if at and ":" not in user and user:
            out = f"{scheme}://{MASK}@{rest[len(user) + 1:]}"
    return shown(out)


def parse_url(text: str) -> LoadURL:
    """``--url TEXT`` checked; raises UsageError (one line, the URL masked) saying what to give."""
    given = masked_url(text) if isinstance(text, str) else repr(text)

    def bad(why: str) -> UsageError:
        return UsageError(f"--url {given}: {why}: give the router's or load balancer's address as {_FORM}")

    if not isinstance(text, str) or not text:
        raise bad("empty")
    if _BAD_CHAR.search(text):
        raise bad("it holds a blank, a control or a non-ASCII character (percent-encode them)")
    parts = urllib.parse.urlsplit(text)
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise bad(f"the scheme must be http or https, not {parts.scheme or 'none'!r}")
    if parts.fragment or text.endswith("#"):
        raise bad("a #fragment is never sent to a server")
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        raise bad("the port must be a number from 1 to 65535") from None
    if not host:
        raise bad("no host")
    if port == 0:
        raise bad("the port must be a number from 1 to 65535")
    user = urllib.parse.unquote(parts.username) if parts.username is not None else None
    password = urllib.parse.unquote(parts.password) if parts.password is not None else None
    return LoadURL(text=text, scheme=scheme, host=host, port=port or SCHEMES[scheme],
                   prefix=parts.path.rstrip("/"), query=parts.query, username=user or None,
                   password=password if user else None)


def check_side(name: str, side: str | None, where: str, url: LoadURL | None, verb: str) -> None:
    """Refuse (UsageError, exit 2) to load one side of a prefill/decode pair (``side``: ``prefill`` or ``decode``,
    ``--disaggregation-mode``) without ``--url``: it serves no request alone. ``where``: the server, for the
    message (``the server on :30000 (pid 42)``)."""
    if side not in ("prefill", "decode") or url is not None:
        return
    alone = "serves no request alone" if side == "decode" else "decodes no request"
    raise UsageError(f"{name}: {where} is the {side} side of a prefill/decode pair (--disaggregation-mode {side}), "
                     f"which {alone}: give --url with the router or load balancer in front of the pair; {verb} sent "
                     "nothing and changed nothing")


def server_url(host: Host, addr: str, port: int) -> str:
    """The base URL of a server at ``addr:port`` reached through ``port`` (a forward's local end over SSH; on a
    local target, the server's own port)."""
    where = addr if host.is_local else "127.0.0.1"
    if ":" in where:
        where = f"[{where}]"
    return f"http://{where}:{port}"


@dataclasses.dataclass(frozen=True)
class Route:
    """How the load reaches where it goes: ``base_url``, what its requests name (the server's own address, or
    ``--url``); ``connect``: the (host, port) its connections open instead (a forward's local end), or None to
    connect to ``base_url`` itself; ``shown``: what may be printed of it."""

    base_url: str
    connect: tuple[str, int] | None = None
    shown: str = ""


@contextlib.contextmanager
def forward(host: Host, name: str, addr: str, port: int, what: str) -> Iterator[int]:
    """A port forwarded to ``addr:port`` as the target host sees it, for the block (on a local target, ``port``
    itself); ``what`` names it in errors. Raises Unsupported when nothing answers there, ConnectionFailed when the
    forward cannot be opened."""
    probe: Any = getattr(host, "probe_tunnel", None)
    why = probe(addr, port) if probe is not None else None
    if why:
        raise Unsupported(f"{name}: {why}: {what}")
    try:
        local = host.open_tunnel(addr, port)  # type: ignore[attr-defined]
    except OSError as exc:
        raise ConnectionFailed(f"{name}: cannot forward a local port to {addr}:{port}: {exc}") from None
    try:
        yield local
    finally:
        host.close_tunnel(local)  # type: ignore[attr-defined]


@contextlib.contextmanager
def target_route(host: Host, name: str, server: Any) -> Iterator[Route]:
    """The target server's own address (``server``: a ServerProcess), through a forward over SSH: what the load
    used before ``--url``, and where facts about the server itself are read."""
    with forward(host, name, server.probe_host, server.port,
                 f"is the server (pid {server.pid}) up and listening on :{server.port}?") as local:
        url = server_url(host, server.probe_host, local)
        yield Route(url, None, url)


@contextlib.contextmanager
def load_route(host: Host, name: str, server: Any, url: LoadURL | None) -> Iterator[Route]:
    """Where the load goes: ``url`` (reached as the target host sees it: through a forward over SSH, straight from
    here on a local target) when given, else the target server itself (``target_route``). With a URL the target
    server is still probed first: the load is meant for it, and a server that is down is said as such."""
    if url is None:
        with target_route(host, name, server) as route:
            yield route
        return
    probe: Any = getattr(host, "probe_tunnel", None)
    why = probe(server.probe_host, server.port) if probe is not None else None
    if why:
        raise Unsupported(f"{name}: {why}: is the server (pid {server.pid}) up and listening on :{server.port}?")
    if host.is_local:
        yield Route(url.text, None, url.shown)
        return
    with forward(host, name, url.host, url.port,
                 f"is the router or load balancer of --url {url.shown} up, and reachable from the target host "
                 "under that address?") as local:
        yield Route(url.text, ("127.0.0.1", local), url.shown)
