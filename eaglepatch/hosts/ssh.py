"""``SSHHost``: the ``Host`` interface over one SSH connection (paramiko): connecting, commands, agents, files.

The module of eaglepatch that imports paramiko (``ssh_config``'s fallback uses its ``SSHConfig`` too, after this
module has imported it). Its neighbours: ``ssh_config`` says what to connect to and how (``ssh -G``, else paramiko's
``SSHConfig``: see there), ``tunnel`` forwards ports, ``spec`` holds the parsed TARGET.

- Connecting: ``ssh_config.resolve`` gives the chain of hops (jump hosts, then the target); each is one paramiko
  client, the next one reached over a ``direct-tcpip`` channel of the one before (or through the first hop's
  ``ProxyCommand``). Each waits its own timeout (``--connect-timeout``, else its ``ConnectTimeout``, else 10 s) for
  the TCP connection and the SSH handshake.
- Authentication: the hop's identity files (``-i`` first, then ``IdentityFile``, else OpenSSH's default
  ``~/.ssh/id_*``; those that exist), then the ssh-agent unless ``IdentitiesOnly``. Never a password, never a
  prompt (a server that asks for a second factor is refused, not prompted for).
- Host keys: checked against the hop's known-hosts files, as its ``ssh_config.HostKeyPolicy`` says: an unknown key
  is refused (``StrictHostKeyChecking yes``/``ask``), or accepted and saved to the first ``UserKnownHostsFile``
  (``accept-new``, or ``--accept-new-host-key``), or accepted and not saved (``no``); a changed key is always
  refused. The same for every jump host.
- One connection per ``SSHHost``, reused for every call; one SFTP session, opened on first use.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import importlib.util
import logging
import os
import select
import shlex
import socket
import sys
import threading
import time
import types
from typing import Any, Callable, Sequence, TypeVar


class _LazyInvoke(types.ModuleType):
    """Stands in for the ``invoke`` package until an attribute of it is needed, then imports it for real (and
    leaves the real one in ``sys.modules``)."""

    def __getattr__(self, name: str) -> Any:
        if sys.modules.get("invoke") is self:
            del sys.modules["invoke"]
        return getattr(importlib.import_module("invoke"), name)


def _lazy_invoke() -> None:
    """paramiko.config imports invoke at import time, only to run the ``Match exec`` lines of an SSH config; that
    import is a third of paramiko's import time. Until paramiko asks it for something (a config with ``Match exec``)
    a stand-in takes its place."""
    if "invoke" in sys.modules:
        return
    try:
        spec = importlib.util.find_spec("invoke")
    except (ImportError, ValueError):
        return
    if spec is None:
        return  # not installed: paramiko says so itself when a config needs it
    stub = _LazyInvoke("invoke")
    stub.__spec__ = spec
    sys.modules["invoke"] = stub


_lazy_invoke()

import paramiko  # noqa: E402  (after _lazy_invoke)
from paramiko.ssh_exception import (  # noqa: E402
    AuthenticationException,
    BadHostKeyException,
    ChannelException,
    NoValidConnectionsError,
    SSHException,
)

from eaglepatch import console  # noqa: E402
from eaglepatch.errors import ConnectionFailed  # noqa: E402
from eaglepatch.hosts.agent import Agents  # noqa: E402
from eaglepatch.hosts.base import MAX_STDERR, CommandResult, FileStat, OutputLimit  # noqa: E402
from eaglepatch.hosts.spec import DEFAULT_CONNECT_TIMEOUT, TargetSpec, format_destination  # noqa: E402
from eaglepatch.hosts.ssh_config import (  # noqa: E402
    CHECK_ACCEPT_NEW,
    CHECK_YES,
    HostKeyPolicy,
    ResolvedHop,
    describe,
    resolve,
)
from eaglepatch.hosts.tunnel import Tunnel  # noqa: E402

T = TypeVar("T")

# paramiko logs a failed handshake from its transport thread with a traceback ("Exception (client): Error reading
# SSH protocol banner"); with no handler configured, Python's last-resort handler prints it on stderr before
# eaglepatch's own one-line error. The error reaches the user as a ConnectionFailed; the log only with
# EAGLEPATCH_DEBUG.
if not os.environ.get("EAGLEPATCH_DEBUG"):
    logging.getLogger("paramiko").addHandler(logging.NullHandler())
    logging.getLogger("paramiko").propagate = False

_CHUNK = 1 << 15
_PID_MARKER = b"@eaglepatch-pid:"


# --------------------------------------------------------------------------------------------------------------
# host keys


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's ``SHA256:...`` fingerprint of a key."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


class _UnknownHostKey(Exception):
    def __init__(self, hostname: str, key: paramiko.PKey):
        super().__init__(hostname)
        self.hostname = hostname
        self.key = key


class _KnownHostsPolicy(paramiko.MissingHostKeyPolicy):
    """A ``HostKeyPolicy`` applied: paramiko asks it about a key that no loaded known-hosts file has for the host.

    ``check`` "yes": refused; "accept-new": accepted, appended to ``save_to``; "no": accepted for this connection
    only. paramiko calls this only for a host that has no key at all in the loaded files; a key that differs from a
    known one raises ``BadHostKeyException`` before any policy is asked, so a changed key is never accepted.
    """

    def __init__(self, policy: HostKeyPolicy):
        self.policy = policy

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        policy = self.policy
        if policy.check == CHECK_YES:
            raise _UnknownHostKey(hostname, key)
        if policy.check == CHECK_ACCEPT_NEW and policy.save_to:
            # with HostKeyAlias the key is saved under the alias alone, as OpenSSH saves it
            append_known_host(policy.save_to, policy.alias or hostname, key, hashed=policy.hash_names)
        client.get_host_keys().add(hostname, key.get_name(), key)


def _load_known_hosts(client: paramiko.SSHClient, path: str, alias: str | None = None,
                      address: str | None = None) -> None:
    """Add the entries of a known_hosts file to ``client``, skipping lines paramiko cannot read (as OpenSSH does,
    where paramiko's own loader would give up on the whole file). ``@cert-authority``/``@revoked`` lines are
    skipped too (paramiko has no use for them). With ``alias`` (HostKeyAlias), only the keys known under the alias
    are taken, as the keys of ``address`` (the name paramiko looks up): OpenSSH then looks up the alias alone."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return
    keys = client.get_host_keys()
    if alias is not None and address is not None:
        known = paramiko.HostKeys()
        _read_known_lines(known, lines)
        for keytype, key in (known.lookup(alias) or {}).items():  # lookup matches hashed names too
            keys.add(address, keytype, key)
        return
    _read_known_lines(keys, lines)


def _read_known_lines(keys: paramiko.HostKeys, lines: list[str]) -> None:
    for lineno, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith(("#", "@")):
            continue
        try:
            entry = paramiko.hostkeys.HostKeyEntry.from_line(line, lineno)
        except Exception:
            continue
        if entry is None:
            continue
        for name in entry.hostnames:
            keys.add(name, entry.key.get_name(), entry.key)


def append_known_host(path: str, hostname: str, key: paramiko.PKey, hashed: bool = False) -> None:
    """Append ``hostname keytype base64`` to a known_hosts file (``[host]:port`` names as given), creating its
    directory with mode 0700 and the file with 0600 when missing."""
    directory = os.path.dirname(path)
    if directory and not os.path.isdir(directory):
        os.makedirs(directory, mode=0o700, exist_ok=True)
    name = paramiko.HostKeys.hash_host(hostname) if hashed else hostname
    line = f"{name} {key.get_name()} {key.get_base64()}\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a") as f:
        if f.tell() > 0:
            with open(path, "rb") as r:  # keep one entry per line if the file lacks a final newline
                r.seek(-1, os.SEEK_END)
                if r.read(1) != b"\n":
                    f.write("\n")
        f.write(line)


class _NoPromptTransport(paramiko.Transport):
    """A transport that never reads a password from the terminal (paramiko would, for a second factor)."""

    def auth_interactive_dumb(self, username, handler=None, submethods=""):  # noqa: D401
        raise AuthenticationException(
            "the server asks for a password or keyboard-interactive second factor; eaglepatch does not prompt"
        )


# --------------------------------------------------------------------------------------------------------------
# one hop


class _Hop:
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
        # Host keys: our policy, our known-hosts files (loaded in SSHHost._open); never paramiko's AutoAddPolicy.
        self.client.set_missing_host_key_policy(_KnownHostsPolicy(resolved.host_keys))
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


# --------------------------------------------------------------------------------------------------------------
# the host


class SSHHost:
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
        self._conn: _Hop | None = None
        self._hops: list[_Hop] = []
        self._transport: paramiko.Transport | None = None
        self._sftp: paramiko.SFTPClient | None = None
        self._timeout = DEFAULT_CONNECT_TIMEOUT
        self._tunnels: list[Tunnel] = []
        #: The hops of the last connection, as ``ssh_config.resolve`` gave them (jump hosts, then the target).
        self.resolved: list[ResolvedHop] = []
        self.agents = Agents(self)

    def __repr__(self) -> str:
        return f"SSHHost({self.name!r})"

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
        chain = [_Hop(r) for r in resolve(self.spec)]
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
            self._open(conn, role)
            if i + 1 < len(chain):
                nxt = chain[i + 1]
                try:
                    sock = conn.transport.open_channel(
                        "direct-tcpip", (nxt.host, int(nxt.port)), ("", 0), timeout=nxt.connect_timeout
                    )
                except (ChannelException, SSHException, EOFError, OSError) as exc:
                    reason = getattr(exc, "text", None) or str(exc) or type(exc).__name__
                    raise ConnectionFailed(
                        f"cannot connect to {_label(nxt)} through jump host {_label(conn)}: {reason}"
                    ) from exc
        self._transport = main.transport
        self._transport.set_keepalive(30)
        self.destination = _label(main)

    def _open(self, conn: _Hop, role: str) -> None:
        label = _label(conn)
        where = f"{role} {label}" if role != "target" else label
        # Known hosts are read now, not when the _Hop was made: a jump host's key accepted a moment ago
        # counts for the next hop.
        alias = conn.resolved.host_keys.alias
        for path in conn.resolved.host_keys.known_hosts:
            _load_known_hosts(conn.client, path, alias, conn.resolved.address_name)
        try:
            conn.open()
        except _UnknownHostKey as exc:
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

    # ---------------------------------------------------------------------------------------------- commands

    def run(
        self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float | None = None,
        max_output: int | None = None,
    ) -> CommandResult:
        """Run ``argv`` through the remote login shell (quoted with ``shlex.join``; POSIX shells).

        Like ``LocalHost.run``: rc 127 when the program does not exist; rc 124 on timeout (the process is killed
        with SIGKILL, as ``subprocess.run`` does); rc -1 when it died from a signal (SSH reports no status then).
        Never raises on rc != 0; raises ``OutputLimit`` (the process killed) past ``max_output`` bytes of output.
        """
        if isinstance(argv, (str, bytes)):
            raise TypeError("argv must be a sequence of arguments, not a string")
        argv = [a if isinstance(a, str) else os.fspath(a) for a in argv]
        if not argv:
            raise ValueError("argv is empty")
        # The shell prints its pid (which `exec` hands to the program) so that a timeout can kill the program.
        command = f"echo {_PID_MARKER.decode()}$$; exec {shlex.join(argv)}"
        deadline = None if timeout is None else time.monotonic() + timeout
        rc, out, err, timed_out = self._exec(command, stdin, deadline, max_output)
        over = max_output is not None and len(out) + len(err) > max_output
        timed_out = timed_out or over
        pid = None
        at = out.find(_PID_MARKER)
        if at >= 0:
            end = out.find(b"\n", at)
            if end >= 0:
                pid = out[at + len(_PID_MARKER) : end]
                del out[at : end + 1]
            elif timed_out:
                pid = out[at + len(_PID_MARKER) :]
                del out[at:]
        if timed_out:
            if pid and pid.isdigit():
                try:
                    self._exec(f"kill -KILL {int(pid)} 2>/dev/null; true", None, time.monotonic() + 10)
                except ConnectionFailed:
                    pass
            if over:
                raise OutputLimit(max_output or 0)
            return CommandResult(124, bytes(out), bytes(err) + b"\ntimed out")
        return CommandResult(rc, bytes(out), bytes(err))

    def _open_session(self) -> tuple[Any, Any]:
        """(transport, a new session channel on it); a lost connection or a refused channel as ConnectionFailed."""
        transport = self._live_transport()
        try:
            return transport, transport.open_session(timeout=self._timeout)
        except (SSHException, EOFError, OSError) as exc:
            if not transport.is_active():
                raise self._lost(exc) from exc
            raise ConnectionFailed(f"cannot open a session on {self.name}: {exc}") from exc

    def spawn(self, argv: Sequence[str]) -> "_SSHProcess":
        """Start ``argv`` through the remote login shell on a channel of its own, stdin/stdout open to talk to it
        (``Agents``); a program that does not exist shows as exit status 127 when it is read."""
        argv = [a if isinstance(a, str) else os.fspath(a) for a in argv]
        if not argv:
            raise ValueError("argv is empty")
        transport, chan = self._open_session()
        try:
            chan.exec_command(f"exec {shlex.join(argv)}")
        except (SSHException, EOFError, OSError) as exc:
            chan.close()
            if not transport.is_active():
                raise self._lost(exc) from exc
            raise ConnectionFailed(f"cannot run a command on {self.name}: {exc}") from exc
        return _SSHProcess(self, chan, transport)

    def _exec(
        self, command: str, stdin: bytes | None, deadline: float | None, limit: int | None = None
    ) -> tuple[int, bytearray, bytearray, bool]:
        """One session channel: run ``command`` (a shell command line), feed ``stdin``, collect both outputs;
        returns (rc, stdout, stderr, timed_out). Past ``limit`` bytes of output it stops reading, as at a
        timeout (the caller tells the two apart by the size)."""
        transport, chan = self._open_session()
        try:
            return self._exec_channel(chan, transport, command, stdin, deadline, limit)
        finally:
            try:
                chan.close()
            except Exception:
                pass

    def _exec_channel(
        self,
        chan: paramiko.Channel,
        transport: paramiko.Transport,
        command: str,
        stdin: bytes | None,
        deadline: float | None,
        limit: int | None = None,
    ) -> tuple[int, bytearray, bytearray, bool]:
        try:
            chan.exec_command(command)
        except (SSHException, EOFError, OSError) as exc:
            if not transport.is_active():
                raise self._lost(exc) from exc
            raise ConnectionFailed(f"cannot run a command on {self.name}: {exc}") from exc

        # stdin goes from its own thread, so that a command that writes much before it reads all its input
        # cannot deadlock against us; stdout and stderr are read here, both at once (they share one window).
        if stdin:
            data = bytes(stdin)

            def feed() -> None:
                try:
                    view = memoryview(data)
                    for i in range(0, len(view), _CHUNK):
                        chan.sendall(view[i : i + _CHUNK])
                    chan.shutdown_write()
                except Exception:  # the command exited (or we closed the channel) before reading it all
                    pass

            writer = threading.Thread(target=feed, name=f"eaglepatch-stdin-{self.name}", daemon=True)
            writer.start()
        else:
            chan.shutdown_write()

        out, err = bytearray(), bytearray()
        chan.fileno()  # turns on the pipe that select() watches (readable on stdout, stderr or EOF)

        def drain() -> None:
            while chan.recv_ready():
                out.extend(chan.recv(1 << 16))
            while chan.recv_stderr_ready():
                err.extend(chan.recv_stderr(1 << 16))

        timed_out = False
        while True:
            done = chan.eof_received or chan.closed
            drain()
            if limit is not None and len(out) + len(err) > limit:
                return 124, out, err, True  # the host says too much: stop reading (run() kills and raises)
            if done:
                break
            if not transport.is_active():
                raise self._lost()
            wait = 1.0
            if deadline is not None:
                wait = min(wait, deadline - time.monotonic())
                if wait <= 0:
                    timed_out = True
                    break
            select.select([chan], [], [], wait)

        if not timed_out:
            while not chan.exit_status_ready():
                wait = 1.0 if deadline is None else min(1.0, deadline - time.monotonic())
                if wait <= 0:
                    timed_out = True
                    break
                chan.status_event.wait(wait)
                if not chan.exit_status_ready() and not transport.is_active():
                    raise self._lost()
        drain()
        if timed_out:
            return 124, out, err, True
        status = chan.recv_exit_status()
        if status == -1 and not transport.is_active():
            raise self._lost()
        return status, out, err, False

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

    # ---------------------------------------------------------------------------------------------- files

    def _sftp_call(self, op: str, path: str, fn: Callable[[paramiko.SFTPClient], T]) -> T:
        with self._lock:
            transport = self._live_transport()
            try:
                if self._sftp is None:
                    self._sftp = transport.open_sftp_client()
                    if self._sftp is None:
                        raise SSHException("the server refused the sftp subsystem")
                return fn(self._sftp)
            except (EOFError, SSHException, paramiko.SFTPError) as exc:
                if not transport.is_active():
                    raise self._lost(exc) from exc
                if isinstance(exc, paramiko.SFTPError) or self._sftp is None:
                    raise ConnectionFailed(f"SFTP on {self.name} failed ({op} {path}): {exc}") from exc
                raise self._lost(exc) from exc
            except OSError as exc:
                if isinstance(exc, (ConnectionError, socket.timeout)) or not transport.is_active():
                    raise self._lost(exc) from exc
                raise _os_error(exc, op, path, self.name) from None

    def read_bytes(self, path: str) -> bytes:
        def read(sftp: paramiko.SFTPClient) -> bytes:
            with sftp.open(path, "rb") as f:
                size = f.stat().st_size or 0
                if size > _CHUNK:
                    f.prefetch(size)
                return f.read()

        return self._sftp_call("read", path, read)

    def write_bytes(self, path: str, data: bytes, mode: int | None = None) -> None:
        perm = 0o600 if mode is None else (mode & 0o7777)

        def write(sftp: paramiko.SFTPClient) -> None:
            f = _sftp_create(sftp, path, perm)
            with f:
                f.set_pipelined(True)
                f.write(bytes(data))
                f.flush()
                _sftp_fsync(sftp, f)
            if mode is not None:
                sftp.chmod(path, mode & 0o7777)

        self._sftp_call("write", path, write)

    def stat(self, path: str) -> FileStat | None:
        def stat(sftp: paramiko.SFTPClient) -> FileStat | None:
            try:
                st = sftp.stat(path)
            except FileNotFoundError:
                return None
            return FileStat(
                mode=st.st_mode or 0,
                uid=st.st_uid or 0,
                gid=st.st_gid or 0,
                size=st.st_size or 0,
                mtime=float(st.st_mtime or 0),
            )

        return self._sftp_call("stat", path, stat)

    def rename(self, src: str, dst: str) -> None:
        def rename(sftp: paramiko.SFTPClient) -> bool:
            try:
                sftp.posix_rename(src, dst)
                return True
            except OSError as exc:
                if exc.errno is None and "unsupported" in str(exc).lower():
                    return False  # no posix-rename@openssh.com: fall back to mv below
                raise

        if not self._sftp_call("rename", src, rename):
            result = self.run(["mv", "-f", "--", src, dst])
            if not result.ok:
                text = result.stderr.decode("utf-8", "replace").strip()
                if "No such file" in text:
                    raise FileNotFoundError(errno.ENOENT, "No such file or directory", src)
                raise OSError(errno.EIO, f"rename failed on {self.name}: {text}", src)

    def remove(self, path: str) -> None:
        def remove(sftp: paramiko.SFTPClient) -> None:
            try:
                sftp.remove(path)
            except FileNotFoundError:
                pass

        self._sftp_call("remove", path, remove)

    def listdir(self, path: str) -> list[str]:
        return self._sftp_call("listdir", path, lambda sftp: sorted(sftp.listdir(path)))


class _SSHProcess:
    """``SSHHost.spawn``: one session channel running a command; stdout read on demand, stderr kept."""

    def __init__(self, host: SSHHost, chan: paramiko.Channel, transport: paramiko.Transport):
        self.host, self.chan, self.transport = host, chan, transport
        self.err = bytearray()
        chan.fileno()  # turns on the pipe that select() watches (readable on stdout, stderr or EOF)

    def _check(self, exc: BaseException | None = None) -> None:
        if not self.transport.is_active():
            raise self.host._lost(exc)

    def send(self, data: bytes, deadline: float | None) -> bool:
        view = memoryview(data)
        try:
            for i in range(0, len(view), _CHUNK):
                wait = None if deadline is None else max(0.01, deadline - time.monotonic())
                self.chan.settimeout(wait)
                self.chan.sendall(view[i : i + _CHUNK])
            return True
        except socket.timeout:
            return False
        except (SSHException, EOFError, OSError) as exc:
            self._check(exc)
            return False  # the command ended: its status says why
        finally:
            self.chan.settimeout(None)

    def _take_err(self) -> None:
        while self.chan.recv_stderr_ready():
            self.err.extend(self.chan.recv_stderr(1 << 16))
            if len(self.err) > MAX_STDERR:  # only its tail is ever shown: a helper may print without end
                del self.err[: len(self.err) - MAX_STDERR]

    def read(self, deadline: float | None) -> bytes | None:
        chan = self.chan
        while True:
            self._take_err()
            if chan.recv_ready():
                return chan.recv(1 << 16)
            if chan.eof_received or chan.closed:
                if chan.recv_ready():
                    continue
                return b""
            self._check()
            wait = 1.0
            if deadline is not None:
                wait = min(wait, deadline - time.monotonic())
                if wait <= 0:
                    return None
            select.select([chan], [], [], wait)

    def wait(self, deadline: float | None) -> tuple[int, bytes]:
        chan = self.chan
        while not chan.exit_status_ready():
            wait = 1.0 if deadline is None else min(1.0, deadline - time.monotonic())
            if wait <= 0:
                return 124, bytes(self.err)
            chan.status_event.wait(wait)
            if not chan.exit_status_ready():
                self._check()
        self._take_err()
        status = chan.recv_exit_status()
        if status == -1:
            self._check()
        return status, bytes(self.err)

    def kill(self, pid: int | None) -> None:
        if pid is not None:
            try:
                self.host._exec(f"kill -KILL {int(pid)} 2>/dev/null; true", None, time.monotonic() + 10)
            except ConnectionFailed:
                pass
        else:
            self.close()  # no pid to kill: closing the channel is all there is

    def close(self) -> None:
        try:
            self.chan.shutdown_write()
        except Exception:
            pass
        try:
            self.chan.close()
        except Exception:
            pass

    def abandon(self) -> None:
        self.close()  # closing the channel waits for nothing; the helper's own signals decide the rest


# --------------------------------------------------------------------------------------------------------------
# helpers


def _label(conn: _Hop) -> str:
    """``user@host:port`` of a hop, plus the alias it came from when that differs."""
    text = format_destination(conn.host, conn.user, int(conn.port))
    if conn.original_host and conn.original_host != conn.host:
        text = f"{conn.original_host} ({text})"
    return text


def _auth_message(conn: _Hop, where: str, exc: BaseException | None) -> str:
    keys = conn.resolved.identity_files
    tried = f"keys {', '.join(keys)}" if len(keys) > 1 else f"key {keys[0]}" if keys else "no key file"
    if conn.resolved.identities_only:
        agent = "not the ssh-agent: IdentitiesOnly"
    else:
        agent = "the ssh-agent" if os.environ.get("SSH_AUTH_SOCK") else "no ssh-agent"
    detail = (str(exc).strip().rstrip(".") if exc is not None else "") or "Authentication failed"
    return f"cannot connect to {where}: {detail} (tried {tried}; {agent}): check -i/--identity or your ssh-agent"


def _timeout_text(conn: _Hop) -> str:
    text = f"{conn.connect_timeout:g} s"
    if conn.resolved.timeout_from == "ConnectTimeout":
        text += " (ConnectTimeout in the SSH config)"
    return text


def _known_hosts_name(conn: _Hop) -> str:
    return conn.resolved.known_hosts_name


def _os_error(exc: OSError, op: str, path: str, host: str) -> OSError:
    if exc.errno == errno.ENOENT or isinstance(exc, FileNotFoundError):
        return FileNotFoundError(errno.ENOENT, "No such file or directory", path)
    if exc.errno in (errno.EACCES, errno.EPERM) or isinstance(exc, PermissionError):
        return PermissionError(errno.EACCES, "Permission denied", path)
    text = exc.strerror or str(exc) or type(exc).__name__
    return OSError(exc.errno or errno.EIO, f"{op} failed on {host}: {text}", path)


def _sftp_create(sftp: paramiko.SFTPClient, path: str, perm: int) -> paramiko.SFTPFile:
    """Open ``path`` for writing (create, truncate) with ``perm`` as the creation mode, like os.open(..., perm);
    paramiko's ``open`` sends no mode, so a new file would get the server's default 0666 & umask."""
    from paramiko import sftp as proto
    from paramiko.sftp_attr import SFTPAttributes
    from paramiko.sftp_file import SFTPFile

    try:
        attrs = SFTPAttributes()
        attrs.st_mode = perm
        flags = proto.SFTP_FLAG_WRITE | proto.SFTP_FLAG_CREATE | proto.SFTP_FLAG_TRUNC
        t, msg = sftp._request(proto.CMD_OPEN, sftp._adjust_cwd(path), flags, attrs)
        if t != proto.CMD_HANDLE:
            raise proto.SFTPError("Expected handle")
        return SFTPFile(sftp, msg.get_binary(), "wb", -1)
    except AttributeError:  # paramiko moved its internals: fall back to the public call
        return sftp.open(path, "wb")


def _sftp_fsync(sftp: paramiko.SFTPClient, f: paramiko.SFTPFile) -> None:
    """OpenSSH's ``fsync@openssh.com`` on an open file, when the server has it; silently nothing otherwise."""
    from paramiko import sftp as proto

    try:
        sftp._request(proto.CMD_EXTENDED, "fsync@openssh.com", f.handle)
    except (IOError, proto.SFTPError, AttributeError):
        pass
