"""Multi-node servers among the TARGETs of one command (``--nnodes N --node-rank R --dist-init-addr ADDR``).

Stopping one node of such a server takes the whole server down: the other nodes hang at the rendezvous or die. So
before a command restarts anything, the TARGETs it names meet here (``Meeting``: each one's servers, read with its
facts, before anything changes) and ``check`` refuses a restart of a multi-node server whose node ranks are not
all named (a usage error: nothing changed, the missing ranks and how to add them said).

With every node named, the TARGETs that run the nodes of one server act as one (``NodeGroup``, from
``Meeting.group``): each TARGET's thread does its own node's part, and they meet between the steps (``meet``), so
that every node agrees before the next step: nothing changes until every node has passed its checks; the files of
every node are patched, or none (``apply`` puts back the nodes it patched when another node's patch failed); every
node is stopped before any starts (a node started while node rank 0 of the old server still listens at
``--dist-init-addr`` could join the old one); node rank 0 is waited for by its health endpoint, the other nodes
(which may serve no HTTP) by their processes, and one that dies ends every wait at once (``verdict``); when the
server does not come up, every node rolls back the same way, stopped before any starts again
(``restart_together``, ``RollbackTogether``). What runs on each host stays one request per step, as for a server
of one node, with the host's state (backups, manifest, lock) per node, and every node's launch in its install's
manifest before any node stops (``together._record_together``: stopping one node takes the others down): a kill at
any step leaves every node as it was or recorded (patched or not), and ``status``/``revert`` of every node (or
``restart``) put them back.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

from eaglepatch.errors import Conflict, EaglepatchError, ExitCode, Unsupported, UsageError
from eaglepatch.failpoints import failpoint
from eaglepatch.hosts.spec import TargetSpec

if TYPE_CHECKING:  # the server package is imported when a server is acted on, not by every command
    from eaglepatch.server.process import LaunchSpec, Nodes, ServerProcess
    from eaglepatch.server.restart import NodeWait, RestartOptions, RestartResult

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


def complete(servers: Iterable[Any], named: Iterable[Any]) -> bool:
    """Whether ``servers`` hold a node of a multi-node server and every node rank of each such server is named (the
    nodes then act together: ``Meeting.group``); a command with a rank missing goes its usual way, and ``check``
    refuses it where it would restart anything."""
    ranks = named_ranks(named)
    multi = [s.nodes for s in servers if s.nodes is not None]
    return bool(multi) and all(set(range(n.count)) <= ranks.get(n.key, set()) for n in multi)


def _where(nodes: Nodes) -> str:
    addr = f"--dist-init-addr {nodes.dist_init_addr}" if nodes.dist_init_addr else "no --dist-init-addr"
    return f"node rank {nodes.rank} of a {nodes.count}-node server ({addr})"


def check(restarting: Sequence[Any], named: Iterable[Any], verb: str, name: str, several: bool = True,
          fix: str | None = None) -> None:
    """Refuse, before anything changes, a restart of any server in ``restarting`` that is one side of a prefill/decode
    pair whose other side ``named`` lacks (``UsageError``, exit 2; a one-TARGET command always: it cannot name both),
    or one node of a multi-node server whose node ranks ``named`` (every TARGET's servers, ``Recorded`` ones too)
    does not all hold (``UsageError``, exit 2, naming the missing ranks). Returns when every node is named (the
    nodes then restart together: ``NodeGroup``) and for single-node servers. ``several``: the command takes several
    TARGETs (the message says to name the missing nodes; sweep --live takes one, so it never restarts a
    multi-node server). ``fix``: what the message for a missing node says to do instead (a restart sweep: name every
    node in it)."""
    named = list(named)
    ranks = named_ranks(named)
    sides = {s.disaggregation for s in named}
    for srv in restarting:
        side = srv.disaggregation
        if side is not None:
            other = "decode" if side == "prefill" else "prefill"
            if other not in sides or not several:
                pair = (f"name the {other} server's host in the same command (eaglepatch {verb} PREFILL DECODE), "
                        "or pass --no-restart") if several else f"{verb} takes one TARGET, so it cannot act on one yet"
                raise UsageError(
                    f"{name}: the server on :{srv.port} (pid {srv.pid}) is the {side} side of a prefill/decode pair "
                    f"(--disaggregation-mode {side}): {verb} would restart it without its {other} side, and requests "
                    f"through the pair would fail meanwhile; nothing was changed: {pair}")
        nodes = srv.nodes
        if nodes is None:
            continue
        missing = sorted(set(range(nodes.count)) - ranks.get(nodes.key, set()))
        head = f"{name}: the server on :{srv.port} (pid {srv.pid}) is {_where(nodes)}"
        if not several:
            missing = missing or [r for r in range(nodes.count) if r != nodes.rank]
        if missing:
            which = ", ".join(str(r) for r in missing)
            todo = fix or (("name every node's host in the same command (eaglepatch " + verb + " NODE0 NODE1 ...), "
                            "or pass --no-restart") if several else (
                f"{verb} takes one TARGET, so it cannot restart a multi-node server: patch it with 'eaglepatch apply "
                "NODE0 NODE1 ...' (every node) and measure it with 'eaglepatch bench'"))
            raise UsageError(
                f"{head}: {verb} would restart it without node rank{'s' if len(missing) > 1 else ''} {which}, which "
                f"would take the whole server down; nothing was changed: {todo}")


@dataclasses.dataclass(frozen=True)
class Recorded:
    """A server that ``apply`` recorded (in the host's manifest) and that no longer runs (a kill between a stop and
    a start, or it died): a node of it counts as named, and restarting together starts it from its record."""

    pid: int | None
    start: int | None
    port: int
    launch: LaunchSpec
    nodes: Nodes | None
    disaggregation: str | None = None
    unit: str | None = None

    @classmethod
    def of(cls, rec: dict[str, Any]) -> "Recorded | None":
        """A manifest entry (``lifecycle.manifest_record``) with a launch spec, as Recorded; None without one."""
        from eaglepatch.hostside.launchers import launcher_args_index
        from eaglepatch.server.process import LaunchSpec, nodes_of

        if not isinstance(rec.get("launch"), dict):
            return None
        spec = LaunchSpec.from_json(rec["launch"])
        idx = launcher_args_index(list(spec.argv))
        return cls(rec.get("pid"), rec.get("start"), spec.port, spec, nodes_of(spec.argv[max(idx, 0):]))


class Meeting:
    """The TARGETs of one command, met once each has read its servers: ``arrive`` (a TARGET's servers; returns
    every TARGET's once all have arrived or ended), ``group`` (the other nodes of a multi-node server it runs a
    node of) and ``leave`` (a TARGET ended, arrived or not; idempotent)."""

    def __init__(self, targets: Sequence[str]):
        self._cond = threading.Condition()
        self._left = set(targets)  # the TARGETs as given (a TARGET named twice names the same servers)
        self._servers: list[Any] = []
        self._by_target: dict[str, list[Any]] = {}
        self._gone: set[str] = set()
        self._groups: dict[tuple[str | None, int], NodeGroup | str] = {}  # str: why refused

    def arrive(self, spec: TargetSpec, servers: Sequence[Any]) -> list[Any]:
        """Add ``servers`` (the ones this TARGET would act on: ``ServerProcess``, or ``Recorded`` for one it would
        start from the manifest), then wait for every other TARGET; raises Conflict when one has neither arrived nor
        ended within MEET_TIMEOUT_S."""
        deadline = time.monotonic() + MEET_TIMEOUT_S
        with self._cond:
            self._servers.extend(servers)
            self._by_target[spec.text] = list(servers)
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
            self._gone.add(target)
            groups = [g for g in self._groups.values() if isinstance(g, NodeGroup)]
            self._cond.notify_all()
        for g in groups:
            g.leave(target)

    def group(self, spec: TargetSpec, servers: Sequence[Any]) -> "NodeGroup | None":
        """The nodes of the multi-node server this TARGET runs a node of among ``servers`` (after ``arrive`` and
        ``check``), as one ``NodeGroup`` shared by every TARGET that runs one of its nodes; None when ``servers``
        holds no node of a multi-node server. Raises Unsupported, nothing changed, for a TARGET whose servers are a
        node and something else (or two nodes): each TARGET restarts one node; and then for every TARGET of that
        server too, as when the TARGETs that run one node each do not hold its node ranks 0..N-1 once each (none
        restarts its node while another node stays up)."""
        multi = [s for s in servers if s.nodes is not None]
        if not multi:
            return None
        if len(servers) > 1:
            raise Unsupported(f"{spec.name}: {len(servers)} servers of this install would restart, one of them "
                              f"{_where(multi[0].nodes)}: eaglepatch restarts the nodes of a multi-node server "
                              "together only where each TARGET runs one node of it and nothing else; nothing was "
                              "changed: name the node's server with --server-port PORT")
        key, count = multi[0].nodes.key, multi[0].nodes.count
        with self._cond:
            g = self._groups.get(key)
            if g is None:
                members = {text: srvs[0] for text, srvs in self._by_target.items()
                           if len(srvs) == 1 and srvs[0].nodes is not None and srvs[0].nodes.key == key}
                # every TARGET reads the same servers, so all refuse together: none restarts a node with one left out
                left_out = sorted(text for text, srvs in self._by_target.items() if text not in members
                                  and any(s.nodes is not None and s.nodes.key == key for s in srvs))
                whole = sorted(s.nodes.rank for s in members.values()) == list(range(count))
                g = self._groups[key] = NodeGroup(members, self._gone & set(members)) if whole and not left_out else (
                    f"{', '.join(left_out)} also run{'s' if len(left_out) == 1 else ''} another server"
                    if left_out else "its node ranks are not each run by one TARGET")
            if isinstance(g, str):
                raise Unsupported(f"{spec.name}: {_where(multi[0].nodes)}: its nodes restart together only where "
                                  f"each TARGET runs one node of it and nothing else, and {g}; nothing was changed: "
                                  "name each node's server with --server-port PORT")
            return g


def alone(spec: TargetSpec) -> Meeting:
    """A meeting of one TARGET (a command that names one)."""
    return Meeting([spec.text])


# A manifest that holds nothing but the launches of the nodes of a multi-node server, written on every node of an
# unpatched install before any node stops (``together._record_together``) and removed once they are all up again.
RECORD = "restart_record"

GONE = "gone"  # what ``meet`` gives for a member that ended without reaching the step


class NodeFailed(EaglepatchError):
    """Another node of the server failed a step, so this one did not go on; its exit code is that node's."""

    def __init__(self, message: str, code: ExitCode = ExitCode.INTERNAL):
        super().__init__(message)
        self.exit_code = code


class NodeGroup:
    """The TARGETs of one command that run the nodes of one multi-node server (``members``: TARGET -> its node's
    server), each on its own thread: ``meet`` (a step every member reaches, with what it has to say; returns what
    each said, ``GONE`` for one that ended first), and per phase a ``verdict`` on the whole server (None while it
    comes up, True once node rank 0 is ready, False once it cannot: ``decide``), which ends every node's wait."""

    def __init__(self, members: dict[str, Any], gone: Iterable[str] = ()):
        self.members = dict(members)
        self._cond = threading.Condition()
        self._posts: dict[str, dict[str, Any]] = {}
        self._gone = set(gone)
        self._verdicts: dict[str, bool] = {}

    def rank(self, me: str) -> int:
        return self.members[me].nodes.rank

    def post(self, step: str, me: str, value: Any) -> None:
        """Say ``value`` at ``step`` without waiting for the others (a member about to raise)."""
        with self._cond:
            self._posts.setdefault(step, {})[me] = value
            self._cond.notify_all()

    def meet(self, step: str, me: str, value: Any) -> dict[str, Any]:
        """Say ``value`` at ``step`` and wait until every member has said something there or ended."""
        self.post(step, me, value)
        with self._cond:
            said = self._posts[step]
            while any(m not in said and m not in self._gone for m in self.members):
                self._cond.wait(timeout=1.0)
            return {m: said.get(m, GONE) for m in self.members}

    def leave(self, me: str) -> None:
        with self._cond:
            self._gone.add(me)
            self._cond.notify_all()

    def decide(self, phase: str, ok: bool) -> None:
        """The server's verdict for ``phase``: False wins over True (a node that died after node rank 0 was ready)."""
        with self._cond:
            if not ok or phase not in self._verdicts:
                self._verdicts[phase] = ok
            self._cond.notify_all()

    def verdict(self, phase: str) -> bool | None:
        with self._cond:
            return self._verdicts.get(phase)

    def pause(self, phase: str, seconds: float) -> bool:
        """Wait up to ``seconds`` for the verdict of ``phase`` to change; True when it did."""
        with self._cond:
            before = self._verdicts.get(phase)
            return self._cond.wait_for(lambda: self._verdicts.get(phase) != before, timeout=max(0.0, seconds))

    def node_wait(self, me: str, phase: str) -> NodeWait:
        from eaglepatch.server.restart import NodeWait

        return NodeWait(http=self.rank(me) == 0, verdict=lambda: self.verdict(phase),
                        pause=lambda s: self.pause(phase, s))

    def trouble(self, said: dict[str, Any], me: str) -> NodeFailed | None:
        """The first other member that failed at a step (said an error, or ended before it), as the error this
        member raises; None when none did."""
        for m, v in said.items():
            if m == me:
                continue
            where = f"node rank {self.rank(m)} ({m})"
            if v == GONE:
                return NodeFailed(f"{where} ended before this step")
            if isinstance(v, BaseException):
                code = v.exit_code if isinstance(v, EaglepatchError) else ExitCode.INTERNAL
                return NodeFailed(f"{where} failed: {v}", code)
        return None


def checked(group: NodeGroup, me: str, name: str, step: str, check: Callable[[], Any]) -> dict[str, Any]:
    """Run ``check`` (what this node verifies before ``step``), then meet the others there: what each said (``check``'s
    value). Raises its own error after telling the others, or NodeFailed (nothing was changed here) when another
    node failed it."""
    try:
        value = check()
    except BaseException as exc:
        group.post(step, me, exc)
        raise
    said = group.meet(step, me, value)
    bad = group.trouble(said, me)
    if bad is not None:
        raise NodeFailed(f"{name}: nothing was changed on this node: {bad}", bad.exit_code)
    return said


def _launch_of(server: Any) -> LaunchSpec:
    return server.launch if isinstance(server, Recorded) else server.launch_spec()


def restart_together(group: NodeGroup, me: str, host: Any, python: str, ropts: RestartOptions,
                     say: Callable[[str], None], phase: str = "restart", name: str = "",
                     start: Callable[[LaunchSpec, NodeWait], RestartResult] | None = None,
                     ) -> tuple[RestartResult | None, str | None]:
    """This TARGET's node restarted with every other node of ``group``: stopped, then (once every node is stopped)
    started as it was launched (``start``: how, given its launch spec and how it is waited for; by default a start
    request and the wait: revert puts its files back in the same request); node rank 0 waited for by its health
    endpoint, the others by their processes until the verdict. Returns this node's RestartResult (None when it was
    never started) and why the server did not come up (None when it did)."""
    from eaglepatch.server.control import stop_server
    from eaglepatch.server.process import ServerProcess
    from eaglepatch.server.restart import restart

    srv = group.members[me]
    rank = group.rank(me)
    try:
        err = None
        if isinstance(srv, ServerProcess):
            say(f"{name or me}: stopping node rank {rank} (pid {srv.pid}) on :{srv.port}: every node stops before "
                "any starts")
            stop = stop_server(host, srv, grace=ropts.grace, port_timeout=ropts.port_timeout, python=python)
            err = None if stop.ok else stop.describe()
        said = group.meet(f"{phase}:stopped", me, err)
        failpoint("nodes:after-stop")
        others = [f"node rank {group.rank(m)} ({m}): " + ("it ended" if v == GONE else str(v))
                  for m, v in said.items() if m != me and v is not None]
        if err is not None or others:
            group.decide(phase, False)
            return None, (f"node rank {rank}: {err}" if err else others[0]) + "; nothing was started"
        say(f"{name or me}: starting node rank {rank} on :{srv.port}" + ("" if rank == 0 else
                                                           " (it joins node rank 0 at --dist-init-addr)"))
        if start is not None:
            res = start(_launch_of(srv), group.node_wait(me, phase))
        else:
            res = restart(host, launch=_launch_of(srv), options=dataclasses.replace(ropts, stop_on_failure=False),
                          progress=say, python=python, node=group.node_wait(me, phase))
    except BaseException:
        group.decide(phase, False)
        raise
    if rank == 0 or not res.ready:
        group.decide(phase, res.ready)
    said = group.meet(f"{phase}:started", me, res)
    bad = [(m, v) for m, v in said.items() if v == GONE or not v.ready]
    # the node that failed first says why, not the ones that stopped waiting because of it
    bad.sort(key=lambda mv: mv[1] != GONE and "stopped waiting" in mv[1].message)
    if not bad:
        return res, None
    m, v = bad[0]
    return res, f"node rank {group.rank(m)} ({m}): " + ("it ended" if v == GONE else v.message)


class RollbackTogether:
    """The hooks ``lifecycle.rollback`` takes for one node of a server whose nodes roll back together: ``prepare``
    (stop what runs on this node's port, then meet every node there: none starts the original before all are
    stopped), ``wait`` (how this node is waited for), ``settled`` (node rank 0's outcome is the server's)."""

    def __init__(self, group: NodeGroup, me: str, host: Any, python: str, ropts: RestartOptions,
                 servers: Callable[[], Sequence[Any]], say: Callable[[str], None], name: str = ""):
        self.group, self.me, self.host, self.python, self.ropts = group, me, host, python, ropts
        self.servers, self.say, self.name = servers, say, name or me
        self.wait = group.node_wait(me, "rollback")

    def prepare(self) -> None:
        from eaglepatch.server.control import stop_server

        port = self.group.members[self.me].port
        try:
            for srv in [s for s in self.servers() if s.port == port]:
                self.say(f"{self.name}: stopping pid {srv.pid} on :{port}: every node stops before the originals "
                         "start")
                stop_server(self.host, srv, grace=self.ropts.grace, port_timeout=self.ropts.port_timeout,
                            python=self.python)
        finally:
            self.group.meet("rollback:stopped", self.me, None)

    def settled(self, res: RestartResult) -> None:
        if self.group.rank(self.me) == 0 or not res.ready:
            self.group.decide("rollback", res.ready)

    def failed(self) -> None:
        self.group.decide("rollback", False)


def lifecycle() -> Any:
    """``eaglepatch.ops.lifecycle``, imported when a server is acted on (it imports the server package)."""
    from eaglepatch.ops import lifecycle as lc

    return lc


def is_record(manifest: dict[str, Any] | None) -> bool:
    return bool(manifest) and bool(manifest.get(RECORD))
