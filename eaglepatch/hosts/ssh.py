"""``SSHHost``: the ``Host`` interface over one SSH connection (paramiko), and that connection's life.

The module of eaglepatch that ``open_host`` imports for an SSH target; with it come its parts: ``ssh_hop`` (one
hop of the connection: its client, authentication, the errors of connecting), ``known_hosts`` (host keys),
``ssh_commands`` and ``ssh_process`` (commands on session channels), ``ssh_files`` (SFTP), ``paramiko_import``
(paramiko itself). Its neighbours: ``ssh_config`` says what to connect to and how (``ssh -G``, else paramiko's
``SSHConfig``: see there), ``tunnel`` forwards ports, ``spec`` holds the parsed TARGET.

- One connection per ``SSHHost`` (through its jump hosts), reused for every call; one SFTP session, opened on first
  use; the port forwards of ``open_tunnel``. ``close()`` ends them all; a later call connects again.
"""

from __future__ import annotations

import os
import threading

from eaglepatch.hosts.paramiko_import import paramiko
from paramiko.ssh_exception import ChannelException, SSHException

from eaglepatch import console
from eaglepatch.errors import ConnectionFailed
from eaglepatch.hosts.agent import Agents
from eaglepatch.hosts.spec import DEFAULT_CONNECT_TIMEOUT, TargetSpec
from eaglepatch.hosts.ssh_commands import SSHCommands
from eaglepatch.hosts.ssh_config import ResolvedHop, describe, resolve
from eaglepatch.hosts.ssh_files import SSHFiles
from eaglepatch.hosts.ssh_hop import SSHHop, hop_label, open_hop
from eaglepatch.hosts.tunnel import Tunnel


class SSHHost(SSHCommands, SSHFiles):
    """A remote machine over SSH. Same semantics as ``LocalHost``; see ``eaglepatch.hosts.base.Host``.

    ``SSHHost(spec)`` does not connect; the first call does (``connect()`` to do it now, as ``open_host`` does).
    After ``close()`` a later call connects again (and resolves the destination again).
    """

    is_local = False

    def __init__(self, spec: TargetSpec):
        if spec.is_local or not spec.host:
            raise ValueError(f"SSHHost needs an SSH target, not {spec.text!r}")
        self.spec = spec
        self.name = spec.name
        #: ``user@host:port`` after the SSH config, known once connected.
        self.destination: str = spec.destination
        self._lock = threading.RLock()  # connect/close, and one SFTP request at a time
        self._conn: SSHHop | None = None
        self._hops: list[SSHHop] = []
        self._transport: paramiko.Transport | None = None
        self._sftp: paramiko.SFTPClient | None = None
        self._timeout = DEFAULT_CONNECT_TIMEOUT
        self._tunnels: list[Tunnel] = []
        #: The hops of the last connection, as ``ssh_config.resolve`` gave them (jump hosts, then the target).
        self.resolved: list[ResolvedHop] = []
        self.agents = Agents(self)

    def __repr__(self) -> str:
        return f"SSHHost({self.name!r})"

    @property
    def interpreter_key(self) -> str | None:
        """Who this host is, for what the client keeps about it (``hosts.interpreters``): every hop of the
        connection as it was made, ``user@host:port``; None before one is made."""
        if self._conn is None:
            return None
        return "ssh " + " > ".join(hop_label(h) for h in [*self._hops, self._conn])

    def __enter__(self) -> "SSHHost":
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------------------------------------- connecting

    @property
    def connected(self) -> bool:
        return self._transport is not None and self._transport.is_active()

    def connect(self) -> None:
        """Open the connection (through the jump hosts, if any) now; raises ``ConnectionFailed``."""
        if self.connected:
            return
        with self._lock:
            if self.connected:
                return
            if self._conn is not None:  # a dead connection: drop it, then open a fresh one
                self._close_locked()
            try:
                self._connect_locked()
            except BaseException:
                self._close_locked()
                raise

    def _connect_locked(self) -> None:
        # UsageError for a config eaglepatch cannot use, ConnectionFailed for an ssh -G that hangs
        chain = [SSHHop(r) for r in resolve(self.spec)]
        self.resolved = [c.resolved for c in chain]
        if os.environ.get("EAGLEPATCH_DEBUG"):
            for line in describe(self.resolved).splitlines():
                console.line(f"eaglepatch: {self.name}: {line}")
        hops, main = chain[:-1], chain[-1]
        self._timeout = main.connect_timeout
        self._hops = hops
        self._conn = main
        sock = None
        for i, conn in enumerate(chain):
            role = "jump host" if i < len(hops) else "target"
            if sock is not None:
                conn.connect_kwargs["sock"] = sock
            open_hop(conn, role)
            if i + 1 < len(chain):
                nxt = chain[i + 1]
                try:
                    sock = conn.transport.open_channel(
                        "direct-tcpip", (nxt.host, int(nxt.port)), ("", 0), timeout=nxt.connect_timeout
                    )
                except (ChannelException, SSHException, EOFError, OSError) as exc:
                    reason = getattr(exc, "text", None) or str(exc) or type(exc).__name__
                    raise ConnectionFailed(
                        f"cannot connect to {hop_label(nxt)} through jump host {hop_label(conn)}: {reason}"
                    ) from exc
        self._transport = main.transport
        self._transport.set_keepalive(30)
        self.destination = hop_label(main)

    def close(self) -> None:
        """Close the SFTP session, the connection and the jump hosts' connections; idempotent."""
        with self._lock:
            self._close_locked()

    def _close_locked(self) -> None:
        self.agents.close()
        tunnels, self._tunnels = self._tunnels, []
        for tunnel in tunnels:
            tunnel.close()
        sftp, self._sftp = self._sftp, None
        conn, self._conn = self._conn, None
        hops, self._hops = self._hops, []
        self._transport = None
        for thing in [sftp, conn, *reversed(hops)]:
            if thing is None:
                continue
            try:
                thing.close()
            except Exception:
                pass

    def _live_transport(self) -> paramiko.Transport:
        self.connect()
        transport = self._transport
        assert transport is not None
        return transport

    def _lost(self, exc: BaseException | None = None) -> ConnectionFailed:
        detail = f" ({exc})" if exc is not None and str(exc) else ""
        with self._lock:
            self._close_locked()
        return ConnectionFailed(f"connection to {self.name} was lost{detail}")

    # ---------------------------------------------------------------------------------------------- forwarding

    def open_tunnel(self, remote_host: str, remote_port: int) -> int:
        """Forward a local port to ``remote_host:remote_port`` as seen from the host (``ssh -L``); return the
        local port (on 127.0.0.1). Each connection to it becomes one ``direct-tcpip`` channel of this SSH
        connection. The tunnel lives until ``close_tunnel(port)`` or ``close()``. Raises ``ConnectionFailed``
        when the connection is gone; a refused forward (``AllowTcpForwarding no``, nothing listening) shows
        as a connection that the local side sees closed at once, and ``probe_tunnel`` tells why."""
        transport = self._live_transport()
        tunnel = Tunnel(transport, remote_host, int(remote_port), self.name, self._timeout)
        with self._lock:
            self._tunnels.append(tunnel)
        return tunnel.port

    def close_tunnel(self, port: int) -> None:
        """Stop forwarding the local ``port`` opened by ``open_tunnel``; idempotent."""
        with self._lock:
            keep = []
            for tunnel in self._tunnels:
                if tunnel.port == port:
                    tunnel.close()
                else:
                    keep.append(tunnel)
            self._tunnels = keep

    def probe_tunnel(self, remote_host: str, remote_port: int) -> str | None:
        """Try one ``direct-tcpip`` channel to ``remote_host:remote_port``: None when it opens, else why nothing
        answers there. Raises ``ConnectionFailed`` when the SSH server refuses port forwarding altogether
        (``AllowTcpForwarding no``) or the connection is gone."""
        transport = self._live_transport()
        try:
            chan = transport.open_channel(
                "direct-tcpip", (remote_host, int(remote_port)), ("127.0.0.1", 0), timeout=self._timeout
            )
        except ChannelException as exc:
            if exc.code == 1:  # SSH_OPEN_ADMINISTRATIVELY_PROHIBITED
                raise ConnectionFailed(
                    f"{self.name}: the SSH server refuses port forwarding ({exc.text or 'prohibited'}): "
                    "sshd's AllowTcpForwarding must allow it"
                ) from None
            return f"nothing answers on {remote_host}:{remote_port} as {self.name} sees it ({exc.text or exc})"
        except (SSHException, EOFError, OSError) as exc:
            if not transport.is_active():
                raise self._lost(exc) from exc
            return f"cannot reach {remote_host}:{remote_port} from {self.name}: {exc}"
        chan.close()
        return None
