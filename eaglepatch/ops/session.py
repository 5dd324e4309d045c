"""Carrying a plan out on one target: ``Session`` (its host, facts and the install's lock while held: ``lock``,
``unlock``, ``execute``), and who takes a lock (``new_lock_owner``).

``execute`` ships the plan to the host in one round trip, where it is checked, validated with the server's
interpreter, backed up and swapped in, all or nothing.
"""

from __future__ import annotations

import dataclasses
import getpass
import os
import secrets
import socket
import time
from typing import Any

from eaglepatch import __version__, progress
from eaglepatch.errors import Conflict, ConnectionFailed, EaglepatchError, ValidationFailed
from eaglepatch.failpoints import remote_fault
from eaglepatch.hosts.base import Host
from eaglepatch.ops.facts import HostFacts
from eaglepatch.hosts.agent import call
from eaglepatch.ops.plan import Plan, Write


def new_lock_owner(what: str = "") -> dict[str, Any]:
    """Who takes a lock: a fresh token, this machine, this process (so a lock left by a dead run is known stale),
    and what it does (``apply``, ``revert``, ``sweep``: status names it)."""
    return {"token": secrets.token_hex(8), "client_host": socket.gethostname(), "client_pid": os.getpid(),
            "user": getpass.getuser(), "eaglepatch": __version__, "what": what}


@dataclasses.dataclass
class Session:
    """One target during one command: its host, facts, and the lock while held."""

    host: Host
    python: str
    facts: HostFacts
    token: str | None = None

    def lock(self, owner: dict[str, Any] | None = None, ttl: float = 7200) -> None:
        """Hold the install's lock: the one ``gather`` took for ``owner``, or take it now; raises ``Conflict``
        when another run holds it (a lock left by a dead process of this machine is taken over)."""
        taken = self.facts.lock_result
        if owner is not None and taken is not None and taken.get("ok"):
            self.token = owner["token"]
            return
        owner = owner or new_lock_owner()
        held = (taken or {}).get("held") or self.facts.lock
        res = call(self.host, self.python, "lock", lock_path=self.facts.lock_path, owner=owner, ttl=ttl,
                   dead_pids=_dead_local_pids(held))
        if not res.get("ok"):
            if res.get("error"):
                raise EaglepatchError(f"{self.host.name}: {res['error']}")
            held = res.get("held") or {}
            since = time.strftime("%H:%M:%S", time.localtime(float(held.get("time", 0) or 0)))
            raise Conflict(f"{self.host.name}: another eaglepatch run holds the lock (user {held.get('user')}, "
                           f"from {held.get('client_host')} pid {held.get('client_pid')}, since {since}): "
                           f"wait for it, or remove {res.get('path')} if no run is active")
        self.token = owner["token"]

    def unlock(self) -> None:
        """Release the lock when this session holds it. Not after a request to the host was cut short (Ctrl-C):
        the host may still be carrying it out under that lock; it stays, named by status, and the next apply or
        revert from this machine takes it over (its client is gone)."""
        if self.token is None or progress.was_cut(self.host.name):
            return
        try:
            call(self.host, self.python, "unlock", lock_path=self.facts.lock_path, token=self.token)
        except (EaglepatchError, ConnectionFailed):
            pass
        self.token = None

    def execute(self, plan: Plan, release: bool = False, then: dict[str, Any] | None = None,
                then_timeout: float = 0.0) -> dict[str, Any]:
        """Carry out ``plan`` on the host in one round trip (releasing the lock in it when ``release``); raises
        typed errors, the target unchanged. ``then``: a relaunch (``server.control.relaunch_payload``, or a
        ``{"batch": [...]}`` of them) that the host runs right after the plan succeeds, in the same request; its
        answer is the result's ``then``; ``then_timeout``: how long those may take (the client waits that much
        longer, never killing the helper between a stop and a start)."""
        payload = {
            "release": release,
            "token": self.token,
            "lock_path": self.facts.lock_path,
            "writes": [self._payload(w) for w in plan.writes],
            "manifest": {"path": self.facts.manifest_path, "data": plan.manifest, "last": plan.manifest_last},
            "fault": remote_fault(),
            "then": then,
        }
        res = call(self.host, self.python, "execute", timeout=300 + then_timeout, **payload)
        if release:
            self.token = None
        if res.get("ok"):
            return res
        where = res.get("path") or ""
        kind = res.get("kind")
        msg = f"{self.host.name}: {where + ': ' if where else ''}{res.get('error')}"
        if kind == "conflict":
            raise Conflict(msg + ": nothing changed; run again to read it afresh")
        if kind == "compile":
            raise ValidationFailed(f"{msg}: the patched file does not compile with {res.get('python')}; "
                                   "nothing changed")
        if res.get("unrestored"):
            raise EaglepatchError(f"{msg}: could NOT put back {', '.join(res['unrestored'])}: check them now")
        raise EaglepatchError(msg + ": nothing changed")

    def _payload(self, w: Write) -> dict[str, Any]:
        p = w.payload()
        if w.path == self.facts.runtime_path:
            p["expect_sha256"] = self.facts.runtime_sha256  # what was read, whether or not its bytes came along
        return p


def _dead_local_pids(lock: dict[str, Any] | None) -> list[int]:
    """A lock taken from this machine by a process that is gone is stale."""
    if not lock or lock.get("client_host") != socket.gethostname():
        return []
    pid = lock.get("client_pid")
    if not isinstance(pid, int):
        return []
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return [pid]
    except PermissionError:
        return []
    return []
