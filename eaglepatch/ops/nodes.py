"""Multi-node servers among the TARGETs of one command (``--nnodes N --node-rank R --dist-init-addr ADDR``).

Stopping one node of such a server takes the whole server down: the other nodes hang at the rendezvous or die. So
before a command restarts anything, the TARGETs it names meet here (``Meeting``: each one's servers, read with its
facts, before anything changes) and ``check`` refuses a restart of a multi-node server whose node ranks are not
all named (a usage error: nothing changed, the missing ranks and how to add them said). Restarting every node of
one server together is not built yet: a restart of a multi-node server whose nodes are all named is refused too
(``Unsupported``), with the way to patch it without a restart.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Iterable, Sequence

from eaglepatch.errors import Conflict, Unsupported, UsageError
from eaglepatch.hosts.spec import TargetSpec

if TYPE_CHECKING:  # the server package is imported when a server is acted on, not by every command
    from eaglepatch.server.process import Nodes, ServerProcess

# How long a TARGET waits for the others to have read their servers (each either reads them or fails within its
# connect and facts timeouts; this only keeps a stuck one from holding the rest for ever).
MEET_TIMEOUT_S = 600.0


def named_ranks(servers: Iterable[ServerProcess]) -> dict[tuple[str | None, int], set[int]]:
    """The node ranks named, per multi-node server (``Nodes.key``)."""
    out: dict[tuple[str | None, int], set[int]] = {}
    for s in servers:
        if s.nodes is not None:
            out.setdefault(s.nodes.key, set()).add(s.nodes.rank)
    return out


def _where(nodes: Nodes) -> str:
    addr = f"--dist-init-addr {nodes.dist_init_addr}" if nodes.dist_init_addr else "no --dist-init-addr"
    return f"node rank {nodes.rank} of a {nodes.count}-node server ({addr})"


def check(restarting: Sequence[ServerProcess], named: Iterable[ServerProcess], verb: str, name: str,
          several: bool = True) -> None:
    """Refuse, before anything changes, a restart of any server in ``restarting`` that is one side of a prefill/decode
    pair whose other side ``named`` lacks (``UsageError``, exit 2; a one-TARGET command always: it cannot name both),
    or one node of a multi-node server: ``UsageError`` (exit 2) naming the node ranks that ``named`` (every TARGET's
    servers) lacks,
    ``Unsupported`` (exit 4) when every node is named. Returns for single-node servers. ``several``: the command
    takes several TARGETs (the message says to name the missing nodes; sweep takes one)."""
    named = list(named)
    ranks = named_ranks(named)
    sides = {s.disaggregation for s in named}
    for srv in restarting:
        side = srv.disaggregation
        if side is not None:
            other = "decode" if side == "prefill" else "prefill"
            if other not in sides or not several:
                fix = (f"name the {other} server's host in the same command (eaglepatch {verb} PREFILL DECODE), or "
                       "pass --no-restart") if several else f"{verb} takes one TARGET, so it cannot act on one yet"
                raise UsageError(
                    f"{name}: the server on :{srv.port} (pid {srv.pid}) is the {side} side of a prefill/decode pair "
                    f"(--disaggregation-mode {side}): {verb} would restart it without its {other} side, and requests "
                    f"through the pair would fail meanwhile; nothing was changed: {fix}")
        nodes = srv.nodes
        if nodes is None:
            continue
        missing = sorted(set(range(nodes.count)) - ranks.get(nodes.key, set()))
        head = f"{name}: the server on :{srv.port} (pid {srv.pid}) is {_where(nodes)}"
        if missing:
            which = ", ".join(str(r) for r in missing)
            fix = ("name every node's host in the same command (eaglepatch " + verb + " NODE0 NODE1 ...), or pass "
                   "--no-restart") if several else f"{verb} takes one TARGET, so it cannot act on a multi-node server yet"
            raise UsageError(
                f"{head}: {verb} would restart it without node rank{'s' if len(missing) > 1 else ''} {which}, which "
                f"would take the whole server down; nothing was changed: {fix}")
        fix = (f"run '{verb} --no-restart' on every node, then restart the server as you launched it" if several
               else f"{verb} cannot act on a multi-node server yet")
        raise Unsupported(f"{head}: restarting the nodes of a multi-node server together is not supported yet; "
                          f"nothing was changed: {fix}")


class Meeting:
    """The TARGETs of one command, met once each has read its servers: ``arrive`` (a TARGET's servers; returns
    every TARGET's once all have arrived or ended) and ``leave`` (a TARGET ended, arrived or not; idempotent)."""

    def __init__(self, targets: Sequence[str]):
        self._cond = threading.Condition()
        self._left = set(targets)  # the TARGETs as given (a TARGET named twice names the same servers)
        self._servers: list[ServerProcess] = []

    def arrive(self, spec: TargetSpec, servers: Sequence[ServerProcess]) -> list[ServerProcess]:
        """Add ``servers`` (the ones this TARGET would act on), then wait for every other TARGET; raises Conflict when
        one has neither arrived nor ended within MEET_TIMEOUT_S."""
        deadline = time.monotonic() + MEET_TIMEOUT_S
        with self._cond:
            self._servers.extend(servers)
            self._left.discard(spec.text)
            self._cond.notify_all()
            while self._left:
                if time.monotonic() > deadline:
                    raise Conflict(f"{spec.name}: the other TARGETs did not read their servers within "
                                   f"{MEET_TIMEOUT_S:.0f} s: nothing was changed")
                self._cond.wait(timeout=1.0)
            return list(self._servers)

    def leave(self, target: str) -> None:
        with self._cond:
            self._left.discard(target)
            self._cond.notify_all()


def alone(spec: TargetSpec) -> Meeting:
    """A meeting of one TARGET (a command that names one)."""
    return Meeting([spec.text])
