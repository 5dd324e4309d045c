"""Parsing TARGET: a local path, or an SSH destination plus the SSH options of docs/contract.md "Targets".

``parse_target(text, options)`` turns what the user typed into a frozen ``TargetSpec``, once per TARGET;
``open_host(spec)`` turns that spec into a ``Host`` (``LocalHost`` or ``SSHHost``): the one way to build either. Nothing
here touches the network until ``open_host``; the SSH config is read then, by ``eaglepatch.hosts.ssh_config`` (so a
``Host`` alias needs no special form here). The data types (``TargetSpec``, ``SSHOptions``, ``Hop``) and the
``[user@]host[:port]`` syntax live in ``eaglepatch.hosts.spec``. This module imports ``ssh`` (paramiko) and ``local``
only inside ``open_host``, and neither imports it: no import cycle.

Forms:

- local: anything that exists on this machine, or starts with ``/``, ``./``, ``../``, ``~`` or ``file:``
  (``file:`` and ``file://`` are stripped; ``~`` is expanded; the path is made absolute).
- SSH: ``[user@]host[:port]``, ``[user@][v6addr]:port``, a bare IPv6 address, a ``Host`` alias of the SSH
  config, or explicitly ``ssh://[user@]host[:port]`` (for a name that also exists as a local file).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from eaglepatch.errors import UsageError
from eaglepatch.hosts.spec import SSHOptions, TargetSpec, _check_port, parse_hop, parse_jump

if TYPE_CHECKING:  # pragma: no cover
    from eaglepatch.hosts.base import Host

_LOCAL_PREFIXES = ("/", "./", "../", "~", "file:")


def is_local_target(text: str) -> bool:
    """docs/contract.md: local when it exists on this machine or starts with ``/``, ``./``, ``../``, ``~`` or ``file:``."""
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


def open_host(spec: TargetSpec) -> Host:
    """Return a connected ``Host`` for a parsed TARGET: a ``LocalHost`` named as the target, or an ``SSHHost``
    (connects now, so connection, authentication and host-key failures raise ``ConnectionFailed`` here)."""
    if spec.is_local:
        from eaglepatch.hosts.local import LocalHost

        return LocalHost(spec.name)
    from eaglepatch.hosts import head_start

    return head_start.claim(spec) or connect_ssh(spec)


def connect_ssh(spec: TargetSpec) -> Host:
    """A connected ``SSHHost`` for an SSH ``spec`` (``open_host``'s, and the head start's)."""
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
