"""One hop of an SSH connection (a jump host on the way, or the target): its paramiko client, and opening it.

- Connecting: ``SSHHost`` opens the chain of hops that ``ssh_config.resolve`` gives (jump hosts, then the target);
  each is one ``SSHHop``, the next one reached over a ``direct-tcpip`` channel of the one before (or through the
  first hop's ``ProxyCommand``). Each waits its own timeout (``--connect-timeout``, else its ``ConnectTimeout``, else
  10 s) for the TCP connection and the SSH handshake.
- Authentication: the hop's identity files (``-i`` first, then ``IdentityFile``, else OpenSSH's default
  ``~/.ssh/id_*``; those that exist), then the ssh-agent unless ``IdentitiesOnly``. Never a password, never a
  prompt (a server that asks for a second factor is refused, not prompted for).
- ``open_hop`` turns every way a connection fails into a ``ConnectionFailed`` that names the hop and what to do.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from eaglepatch.hosts.paramiko_import import paramiko
from paramiko.ssh_exception import (
    AuthenticationException,
    BadHostKeyException,
    NoValidConnectionsError,
    SSHException,
)

from eaglepatch.errors import ConnectionFailed
from eaglepatch.hosts.known_hosts import KnownHostsPolicy, UnknownHostKey, fingerprint, load_known_hosts
from eaglepatch.hosts.spec import format_destination
from eaglepatch.hosts.ssh_config import ResolvedHop


class _NoPromptTransport(paramiko.Transport):
    """A transport that never reads a password from the terminal (paramiko would, for a second factor)."""

    def auth_interactive_dumb(self, username, handler=None, submethods=""):  # noqa: D401
        raise AuthenticationException(
            "the server asks for a password or keyboard-interactive second factor; eaglepatch does not prompt"
        )


class SSHHop:
    """One SSH connection (the target, or a jump host on the way): a ``ResolvedHop`` and its paramiko client.
    ``connect_kwargs`` go to ``SSHClient.connect`` (a ``sock`` is added for a hop reached through another)."""

    def __init__(self, resolved: ResolvedHop):
        self.resolved = resolved
        self.original_host = resolved.name
        self.host = resolved.hostname
        self.user = resolved.user
        self.port = resolved.port
        self.gateway = resolved.proxy_command
        self.connect_timeout = resolved.timeout
        timeout = resolved.timeout
        kwargs: dict[str, Any] = {
            "allow_agent": not resolved.identities_only,
            "look_for_keys": False,  # the default keys are in identity_files when they are in force
            "banner_timeout": timeout,
            "auth_timeout": max(timeout, 15.0),
            "channel_timeout": timeout,
            "transport_factory": _NoPromptTransport,
        }
        if resolved.identity_files:
            kwargs["key_filename"] = list(resolved.identity_files)
        self.connect_kwargs = kwargs
        self.client = paramiko.SSHClient()
        # Host keys: our policy, our known-hosts files (loaded in open_hop); never paramiko's AutoAddPolicy.
        self.client.set_missing_host_key_policy(KnownHostsPolicy(resolved.host_keys))
        self.transport: paramiko.Transport | None = None

    def open(self) -> None:
        kwargs = dict(self.connect_kwargs, username=self.user, hostname=self.host, port=self.port,
                      timeout=self.connect_timeout)
        if self.gateway and "sock" not in kwargs:
            kwargs["sock"] = paramiko.ProxyCommand(self.gateway)
        self.client.connect(**kwargs)
        self.transport = self.client.get_transport()

    def close(self) -> None:
        self.client.close()
        self.transport = None


def open_hop(conn: SSHHop, role: str) -> None:
    """Connect ``conn`` (``role``: "target" or "jump host"), its known-hosts files loaded first; every failure a
    ``ConnectionFailed`` that says what to do."""
    label = hop_label(conn)
    where = f"{role} {label}" if role != "target" else label
    # Known hosts are read now, not when the SSHHop was made: a jump host's key accepted a moment ago
    # counts for the next hop.
    alias = conn.resolved.host_keys.alias
    for path in conn.resolved.host_keys.known_hosts:
        load_known_hosts(conn.client, path, alias, conn.resolved.address_name)
    try:
        conn.open()
    except UnknownHostKey as exc:
        raise ConnectionFailed(
            f"host key of {where} ({exc.key.get_name()} {fingerprint(exc.key)}) is not known: "
            "check it, then run again with --accept-new-host-key"
        ) from None
    except BadHostKeyException as exc:
        raise ConnectionFailed(
            f"host key of {where} has CHANGED (known {fingerprint(exc.expected_key)}, offered "
            f"{exc.key.get_name()} {fingerprint(exc.key)}): eaglepatch will not connect; if the change is "
            f"genuine, remove the old key (ssh-keygen -R '{_known_hosts_name(conn)}') and run again with "
            "--accept-new-host-key"
        ) from None
    except AuthenticationException as exc:
        raise ConnectionFailed(_auth_message(conn, where, exc)) from None
    except NoValidConnectionsError as exc:
        reasons = {e.strerror or str(e) for e in exc.errors.values()} or {"connection refused"}
        raise ConnectionFailed(
            f"cannot connect to {where}: {'; '.join(sorted(reasons))}: is sshd running and the port right?"
        ) from None
    except socket.gaierror as exc:
        raise ConnectionFailed(
            f"cannot connect to {where}: cannot resolve host name {conn.host!r} ({exc.strerror}): check the name"
        ) from None
    except (socket.timeout, TimeoutError) as exc:
        raise ConnectionFailed(
            f"cannot connect to {where}: timed out after {_timeout_text(conn)}: check the host, or raise "
            "--connect-timeout"
        ) from exc
    except SSHException as exc:
        text = str(exc).strip()
        if "no authentication methods" in text.lower():  # paramiko: not a single key to offer
            raise ConnectionFailed(_auth_message(conn, where, None)) from None
        if text in ("No existing session", "Error reading SSH protocol banner") or "timed out" in text.lower():
            # paramiko's words for a handshake that did not finish within the timeout
            raise ConnectionFailed(
                f"cannot connect to {where}: no SSH handshake within {_timeout_text(conn)} ({text}): "
                "is it an SSH server? raise --connect-timeout if it is just slow"
            ) from None
        raise ConnectionFailed(f"cannot connect to {where}: {str(exc).strip() or type(exc).__name__}") from None
    except EOFError:
        raise ConnectionFailed(f"cannot connect to {where}: the server closed the connection") from None
    except OSError as exc:
        raise ConnectionFailed(f"cannot connect to {where}: {exc.strerror or exc}") from None
    except ValueError as exc:  # paramiko's own argument checks
        raise ConnectionFailed(f"cannot connect to {where}: {exc}") from None


def hop_label(conn: SSHHop) -> str:
    """``user@host:port`` of a hop, plus the alias it came from when that differs."""
    text = format_destination(conn.host, conn.user, int(conn.port))
    if conn.original_host and conn.original_host != conn.host:
        text = f"{conn.original_host} ({text})"
    return text


def _auth_message(conn: SSHHop, where: str, exc: BaseException | None) -> str:
    keys = conn.resolved.identity_files
    tried = f"keys {', '.join(keys)}" if len(keys) > 1 else f"key {keys[0]}" if keys else "no key file"
    if conn.resolved.identities_only:
        agent = "not the ssh-agent: IdentitiesOnly"
    else:
        agent = "the ssh-agent" if os.environ.get("SSH_AUTH_SOCK") else "no ssh-agent"
    detail = (str(exc).strip().rstrip(".") if exc is not None else "") or "Authentication failed"
    return f"cannot connect to {where}: {detail} (tried {tried}; {agent}): check -i/--identity or your ssh-agent"


def _timeout_text(conn: SSHHop) -> str:
    text = f"{conn.connect_timeout:g} s"
    if conn.resolved.timeout_from == "ConnectTimeout":
        text += " (ConnectTimeout in the SSH config)"
    return text


def _known_hosts_name(conn: SSHHop) -> str:
    return conn.resolved.known_hosts_name
