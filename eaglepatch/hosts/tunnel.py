"""Port forwarding over an SSH connection (``ssh -L``): ``SSHHost.open_tunnel`` makes a ``Tunnel``.

It needs no paramiko of its own: the transport it is given opens the ``direct-tcpip`` channels, and a channel is
used as a socket (``select``, ``recv``, ``sendall``).
"""

from __future__ import annotations

import select
import socket
import threading
from typing import Any

_CHUNK = 1 << 15


class Tunnel:
    """A local listening socket on 127.0.0.1 whose connections are forwarded over one SSH transport to
    ``remote_host:remote_port`` (as the host sees it): one accept thread, one pump thread per connection."""

    def __init__(self, transport: Any, remote_host: str, remote_port: int, name: str, timeout: float):
        self.transport = transport
        self.remote = (remote_host, remote_port)
        self.name = name
        self.timeout = timeout
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port: int = self.sock.getsockname()[1]
        self.closed = threading.Event()
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name=f"eaglepatch-tunnel-{name}-{self.port}", daemon=True).start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, addr = self.sock.accept()
            except OSError:
                return
            if self.closed.is_set():
                client.close()
                return
            threading.Thread(target=self._serve, args=(client, addr), daemon=True,
                             name=f"eaglepatch-tunnel-conn-{self.port}").start()

    def _serve(self, client: socket.socket, addr: Any) -> None:
        # what arrives from the server (a streamed answer's small chunks) goes out at once: with Nagle's algorithm
        # a chunk written while the last is unacknowledged waits for the client's delayed ACK
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            chan = self.transport.open_channel("direct-tcpip", self.remote, addr, timeout=self.timeout)
        except Exception:  # refused by the server, nothing listening there, or the connection is gone
            client.close()
            return
        with self._lock:
            self._conns.add(client)
        try:
            pump(client, chan, self.closed)
        finally:
            with self._lock:
                self._conns.discard(client)
            for thing in (chan, client):
                try:
                    thing.close()
                except Exception:
                    pass

    def close(self) -> None:
        self.closed.set()
        # shutdown first: close() alone leaves the socket listening while the accept thread is blocked in accept()
        # (the kernel holds it until that call returns), so new connections would still be taken and dropped
        for stop in (lambda: self.sock.shutdown(socket.SHUT_RDWR), self.sock.close):
            try:
                stop()
            except OSError:
                pass
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def pump(client: socket.socket, chan: Any, closed: threading.Event) -> None:
    """Copy bytes both ways between a local socket and an SSH channel until either side closes; a half-close
    (EOF from one side) is passed on to the other, which may still answer."""
    client_open, chan_open = True, True
    while (client_open or chan_open) and not closed.is_set():
        watch = ([client] if client_open else []) + ([chan] if chan_open else [])
        try:
            ready, _, _ = select.select(watch, [], [], 1.0)
        except (OSError, ValueError):
            return
        if client in ready:
            try:
                data = client.recv(_CHUNK)
            except OSError:
                return
            if data:
                try:
                    chan.sendall(data)
                except Exception:
                    return
            else:
                client_open = False
                try:
                    chan.shutdown_write()
                except Exception:
                    return
        if chan in ready:
            try:
                data = chan.recv(_CHUNK)
            except Exception:
                return
            if data:
                try:
                    client.sendall(data)
                except OSError:
                    return
            else:
                chan_open = False
                try:
                    client.shutdown(socket.SHUT_WR)
                except OSError:
                    return
        if not chan_open and (not client_open or chan.closed):
            return
