"""``sweep`` across the nodes of one multi-node server: ``sweep NODE0 NODE1 ... --grid ...`` names every node.

Each run is a restart of every node together into the point's command line (each node's own, rewritten for the
point: ``cmdline.point_argv``), as ``restart`` naming every node does it (``nodes.restart_together``: every node
stopped before any starts, node rank 0 waited for by its health endpoint, the others by their processes, one that
dies ends every wait), then a bench through node rank 0 (the server's HTTP entry: its timing records, since every
node's ranks run the same batches). The state file (one for the sweep, on this machine) keeps every node's original
launch, the server each started from and every server the sweep launched on any node; the install's lock is held on
every node. At the end (also after Ctrl-C or an error) every node is put back together, the original command lines
(``--keep-best``: the best point's). A kill at any step leaves the sweep resumable: the same command again finds each
node's server (a point's, the original, or none: then it starts it from the state file) and goes on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from typing import Any, Callable, Iterator, Sequence

from eaglepatch import progress
from eaglepatch.errors import Unsupported, UsageError
from eaglepatch.hosts.spec import TargetSpec
from eaglepatch.ops import nodes
from eaglepatch.ops.lifecycle import launch_of
from eaglepatch.ops.session import Session, new_lock_owner
from eaglepatch.ops.target import Connect, Target, target_facts
from eaglepatch.redact import mask_argv, shown_argv
from eaglepatch.report.labels import CLIENT
from eaglepatch.transform.recipe import builtin_recipe
from eaglepatch.tuning.bench import no_server, patched_log_dir
from eaglepatch.tuning.drive import (SweepOptions, _check_shared, _Owned, _pending, _runs, finish, header_of, measure,
                                     point_launches, run_points, server_flags)
from eaglepatch.tuning.target_url import check_side

Say = Callable[[str], None]

# How long the runs' threads get to end after Ctrl-C or an error (the server's verdict set to failed ends every
# node's wait at once; a stop under way ends within its grace).
JOIN_S = 120.0


@dataclasses.dataclass
class _Node:
    """One node of the server, as the sweep acts on it."""

    t: Target
    facts: Any
    server: Any  # the ServerProcess running on its port at the sweep's start (None: none)
    original: Any  # LaunchSpec
    args_index: int
    rank: int
    owned: _Owned | None = None

    @property
    def text(self) -> str:
        return self.t.spec.text

    @property
    def name(self) -> str:
        return self.t.spec.name


def _names(specs: Sequence[TargetSpec]) -> str:
    """The names of the TARGETs of a sweep across nodes, for messages: ``a + b``."""
    return " + ".join(s.name for s in specs)


def _one_server(specs: Sequence[TargetSpec], servers: Sequence[Any]) -> list[int]:
    """Each TARGET's node rank when the TARGETs run the nodes of one multi-node server, each node once; else
    UsageError (nothing changed)."""
    name = _names(specs)
    for spec, srv in zip(specs, servers):
        if srv is None:
            raise no_server(spec.name)
        if srv.nodes is None:
            raise UsageError(f"{spec.name}: the server on :{srv.port} (pid {srv.pid}) runs on one node: sweep takes "
                             "several TARGETs only for the nodes of one multi-node server (--nnodes N); nothing was "
                             "changed: sweep one TARGET at a time")
    for spec, srv in zip(specs, servers):
        if srv.disaggregation is not None:  # a sweep names one server: the other side of its pair would be left alone
            other = "decode" if srv.disaggregation == "prefill" else "prefill"
            raise UsageError(f"{spec.name}: the server on :{srv.port} (pid {srv.pid}) is the {srv.disaggregation} "
                             f"side of a prefill/decode pair (--disaggregation-mode {srv.disaggregation}): sweep "
                             f"would restart it without its {other} side, and requests through the pair would fail "
                             "meanwhile; nothing was changed: sweep takes the nodes of one server only")
    keys = {s.nodes.key for s in servers}
    ranks = sorted(s.nodes.rank for s in servers)
    count = servers[0].nodes.count
    if len(keys) > 1 or ranks != list(range(count)):
        got = ", ".join(f"{sp.name}: node rank {s.nodes.rank} of {s.nodes.count} (--dist-init-addr "
                        f"{s.nodes.dist_init_addr})" for sp, s in zip(specs, servers))
        raise UsageError(f"{name}: sweep takes several TARGETs only for the nodes of one multi-node server, each node "
                         f"rank 0..N-1 once; these run {got}; nothing was changed: name every node of one server")
    return [s.nodes.rank for s in servers]


def sweep_nodes(specs: Sequence[TargetSpec], c: Connect, opts: SweepOptions, say: Say) -> dict[str, Any]:
    """The restart sweep of a multi-node server whose every node ``specs`` names (see the module docstring)."""
    from eaglepatch.hostside.launchers import launcher_args_index
    from eaglepatch.server.process import LaunchSpec
    from eaglepatch.tuning import cmdline, sweep_state
    from eaglepatch.tuning import sweep as sw

    opts.points()  # the syntax, before anything is read
    label = " + ".join(sorted(s.name for s in specs))  # one state file whatever the order the nodes are named in
    with contextlib.ExitStack() as stack:
        targets = [stack.enter_context(Target(s, c)) for s in specs]
        facts = [target_facts(t, builtin_recipe()) for t in targets]
        servers = [launch_of(f, c.facts.server_ports) for f in facts]
        # the id needs the points, the points the flags: read on any node first (each node runs the same sglang)
        flags = server_flags(targets[0].host, facts[0].python, facts[0].package_dir, facts[0].version, say)
        flag_axes, env_axes, points = opts.points(flags)
        ident = sweep_state.sweep_id(label, points, opts.repeat, opts.bench.load_json())
        state = sweep_state.StateFile(sweep_state.state_path(label, ident))
        if opts.fresh and state.header is not None:
            say(f"--fresh: starting over (forgetting {len(state.runs)} saved run(s) in {state.path})")
            state.remove()
        plan = sw.plan_runs(points, opts.repeat, ident)
        head = state.header
        if head is not None and state.restore is not None and not _pending(state, points, plan):
            say(f"{label}: this sweep is complete ({state.path}): nothing was started; --fresh runs it again")
            summary = opts.summarize(head.get("target") or label, points, state.runs)
            summary.update(state_file=state.path, restore=dict(state.restore, restarted=False),
                           nodes=[n.get("name") or n.get("target") for n in head.get("nodes") or ()])
            return summary
        members: list[_Node] = []
        if head is None:
            ranks = _one_server(specs, servers)
            for t, f, srv, rank in zip(targets, facts, servers, ranks):
                original = srv.launch_spec()  # UsageError when it cannot be relaunched from here
                idx = launcher_args_index(list(original.argv))
                if idx < 0 or srv.unit:
                    raise Unsupported(f"{t.spec.name}: the server's command line is not one eaglepatch can restart "
                                      f"with other flags: {shown_argv(original.argv)}")
                members.append(_Node(t, f, srv, original, idx, rank))
        else:
            saved = {n["target"]: n for n in head.get("nodes") or ()}
            for t, f, srv in zip(targets, facts, servers):
                n = saved.get(t.spec.text)
                if n is None:
                    raise UsageError(f"{t.spec.name}: not a node of the sweep saved in {state.path}; nothing was "
                                     "changed: name the same TARGETs, or give --fresh")
                members.append(_Node(t, f, srv, LaunchSpec.from_json(n["original"]), int(n["args_index"]),
                                     int(n["rank"])))
        members.sort(key=lambda n: n.rank)
        zero = members[0]
        name = zero.name
        disagg = zero.server.disaggregation if zero.server is not None else None
        check_side(name, disagg, f"the server on :{zero.original.port}", opts.bench.url, "sweep")
        if head is None and not opts.allow_shared_traffic:
            # before the first restart, on node rank 0 (the one that serves): others' requests are not cut off
            _check_shared(zero.t.host, name, zero.facts.python, zero.facts, zero.server, say)
        cmdline.check_speculation(zero.original.argv[zero.args_index:], flag_axes, flags)
        # per node, per point; what node rank 0's launches call for (notes, points refused) is the sweep's
        launches, notes, refused = point_launches(name, zero.original, zero.args_index, points, flags, opts.baseline)
        launches = [launches] + [point_launches(n.name, n.original, n.args_index, points, flags, False)[0]
                                 for n in members[1:]]
        notes.append(f"every node of the {len(members)}-node server restarted together per point; the load and "
                     f"the timing records through node rank 0 ({name})")
        with _locks(members, state):
            if head is None:
                doc = dict(header_of(name, zero.facts, zero.original, zero.args_index, zero.server),
                           points=[p.key for p in points], repeat=opts.repeat, load=opts.bench.load_json())
                doc["nodes"] = [dict(header_of(n.name, n.facts, n.original, n.args_index, n.server),
                                     target=n.text, name=n.name, rank=n.rank) for n in members]
                state.write_header(doc)
            env_names = [a.name for a in env_axes]
            for k, n in enumerate(members):
                n.owned = _Owned(n.t.host, n.facts.python, n.facts.package_dir, state, launches[k], n.original,
                                 env_names, c.facts.server_ports, head=lambda n=n: _entry(state, n.text))
            for n in members:
                progress.stage(n.text, progress.NOTHING_CHANGED)
            summary = _run(members, state, points, launches, opts, notes, say, env_names=env_names, plan=plan,
                           refused=refused)
            summary["nodes"] = [n.name for n in members]
            return summary


def _entry(state: Any, target: str) -> dict[str, Any]:
    """The node ``target``'s entry in the state file's header: the server it started from, the ones beside it."""
    return next((n for n in (state.header or {}).get("nodes") or () if n.get("target") == target), {})


@contextlib.contextmanager
def _locks(members: Sequence[_Node], state: Any) -> Iterator[None]:
    """The sweep's state file and the install's lock on every node (a sweep's: up to a week) while the block runs;
    Conflict (nothing held) when another run holds any."""
    state.lock()
    owner = new_lock_owner("sweep")
    held: list[Session] = []
    try:
        for n in members:
            s = Session(n.t.host, n.facts.python, n.facts)
            s.lock(owner, ttl=7 * 86400)
            held.append(s)
        yield
    finally:
        for s in held:
            s.unlock()
        state.unlock()


def _group(members: Sequence[_Node], currents: Sequence[Any], launches: Sequence[Any]) -> nodes.NodeGroup:
    """The nodes as one NodeGroup: what runs on each node's port, or (none runs) the launch it starts."""
    from eaglepatch.server.process import nodes_of

    by: dict[str, Any] = {}
    for n, cur, launch in zip(members, currents, launches):
        by[n.text] = cur if cur is not None else nodes.Recorded(
            None, None, launch.port, launch, nodes_of(launch.argv[n.args_index:]))
    return nodes.NodeGroup(by)


def restart_nodes(members: Sequence[_Node], launches: Sequence[Any], ropts: Any, say: Say, phase: str,
                  on_started: Callable[[Any, int], None] | None = None) -> tuple[Any, str | None]:
    """Every node stopped, then started into its launch in ``launches`` (node rank 0's first in the list), waited
    for together (``nodes.restart_together``, one thread a node); returns node rank 0's RestartResult (None when it
    was never started) and why the server did not come up (None when it did). Ctrl-C or an error here: the
    server's verdict set to failed (every node's wait ends), the threads given JOIN_S to end, then raised."""
    from eaglepatch.server.control import lock_wait
    from eaglepatch.server.restart import restart

    currents = []
    for n, launch in zip(members, launches):
        assert n.owned is not None
        # read once no relaunch of the port runs on the host (one a killed client left goes on there)
        currents.append(n.owned.current(launch.port, settle=launch,
                                        settle_wait=lock_wait(ropts.grace, ropts.port_timeout)))
    group = _group(members, currents, launches)
    out: dict[str, Any] = {}

    def one(n: _Node, launch: Any) -> None:
        def start(_spec: Any, wait: Any) -> Any:
            return restart(n.t.host, launch=launch, options=dataclasses.replace(ropts, stop_on_failure=False),
                           progress=lambda line: say("  " + line), python=n.facts.python, node=wait,
                           on_started=None if on_started is None else (lambda st: on_started(st, launch.port)))

        try:
            out[n.text] = nodes.restart_together(group, n.text, n.t.host, n.facts.python, ropts,
                                                 lambda line: say("  " + line), phase, n.name, start=start)
        except BaseException as exc:  # noqa: BLE001 - said by the main thread
            out[n.text] = exc
        finally:
            group.leave(n.text)

    threads = [threading.Thread(target=one, args=(n, lc), daemon=True, name=f"node{n.rank}")
               for n, lc in zip(members, launches)]
    for th in threads:
        th.start()
    try:
        for th in threads:
            while th.is_alive():
                th.join(0.2)
    except BaseException:
        group.decide(phase, False)
        deadline = time.monotonic() + JOIN_S
        for th in threads:
            th.join(max(0.0, deadline - time.monotonic()))
        raise
    errors = [out[n.text] for n in members if isinstance(out.get(n.text), BaseException)]
    if errors:
        raise errors[0]
    res, why = out[members[0].text]
    if why is None:
        why = next((w for n in members[1:] for w in [out[n.text][1]] if w), None)
    return res, why


def _run(members: list[_Node], state: Any, points: list[Any], launches: list[list[Any]], opts: SweepOptions,
         notes: list[str], say: Say, *, env_names: Sequence[str], plan: Sequence[tuple[int, int]],
         refused: dict[str, str]) -> dict[str, Any]:
    """``drive._run_sweep`` for every node together."""
    from eaglepatch.server.restart import RestartOptions

    zero = members[0]
    name = zero.name
    ropts = RestartOptions(timeout=opts.timeout, poll_interval=0.5)
    log_dir = patched_log_dir(zero.facts)
    pending = _pending(state, points, plan)
    if state.done():
        say(f"resuming: {len(plan) - len(pending)} of {len(plan)} run(s) already done ({state.path})")
    else:
        say(f"sweep: {len(points)} point(s) x {opts.repeat} run(s) on {len(members)} nodes, in shuffled order; "
            f"results saved as they complete in {state.path}")
    if log_dir is None:
        say(f"note: node rank 0 is not patched: {CLIENT} and accept length only, no per-phase timings")
    for n in members:
        progress.stage(n.text, "a sweep under way: every node may run a sweep point: run the same sweep again to "
                               "resume and put the original server back")
    record = lambda st, port: state.add_launch(st.pid, st.start, port)  # noqa: E731
    interrupted = run_points(state, points, plan, pending, opts, refused, say, launches[0],
                             lambda base: _one(members, [lc[base["index"]] for lc in launches], ropts, log_dir, opts,
                                               base, say, record))
    summary = opts.summarize(name, points, state.runs)
    target, why = [n.original for n in members], "the original command lines"
    if opts.keep_best and interrupted is None:
        if summary["best"] is not None:
            target, why = [lc[summary["best"]] for lc in launches], f"the best point's (#{summary['best']})"
        else:
            notes.append("--keep-best: no point ran: the original command lines are back")

    def stage(line: str) -> None:
        for n in members:
            progress.stage(n.text, line)

    return finish(name, state, summary, notes, interrupted, say,
                  lambda: _restore(members, target, env_names, ropts, why, say), stage)


def _one(members: list[_Node], launches: list[Any], ropts: Any, log_dir: str | None, opts: SweepOptions,
         base: dict[str, Any], say: Say, record: Callable[[Any, int], None]) -> dict[str, Any]:
    """One run: every node restarted into the point, then the load through node rank 0."""
    zero = members[0]
    res, why = restart_nodes(members, launches, ropts, say, "sweep", on_started=record)
    if why is not None:
        say(f"  failed: {why}")
        return dict(base, status="failed", error=why, log_tail=getattr(res, "log_tail", "") or "",
                    pid=getattr(res, "pid", None))
    assert zero.owned is not None
    server = zero.owned.current(launches[0].port)
    if server is None or server.pid != res.pid:
        return dict(base, status="failed", error=f"node rank 0's server on :{launches[0].port} was ready, then gone",
                    pid=res.pid)
    return measure(zero.t.host, zero.name, zero.facts.python, server, log_dir, opts, base, say, res.seconds)


def _restore(members: list[_Node], target: list[Any], env_names: Sequence[str], ropts: Any, why: str,
             say: Say) -> dict[str, Any]:
    """Leave every node running its launch in ``target``: restart them together unless every node runs it."""
    from eaglepatch.ops.lifecycle import ROLLBACK_TIMEOUT_S, not_back
    from eaglepatch.server.control import lock_wait

    slow = dataclasses.replace(ropts, timeout=max(ropts.timeout, ROLLBACK_TIMEOUT_S), stop_on_failure=False)
    now = []
    for n, launch in zip(members, target):
        assert n.owned is not None
        now.append(n.owned.current(launch.port, settle=launch, settle_wait=lock_wait(slow.grace, slow.port_timeout)))
    argv = [mask_argv(lc.argv) for lc in target]
    if all(cur is not None and _runs(cur, lc, env_names) for cur, lc in zip(now, target)):
        say(f"every node already runs {why}")
        return {"restarted": False, "ready": True, "argv": argv[0], "nodes_argv": argv,
                "message": f"the server runs {why}"}
    say(f"putting every node back: {why}")
    res, fail = restart_nodes(members, target, slow, say, "restore")
    doc = {"restarted": True, "ready": fail is None, "argv": argv[0], "nodes_argv": argv,
           "pid": getattr(res, "pid", None)}
    if fail is None:
        doc["message"] = f"the server runs {why} again on every node (node rank 0: pid {res.pid})"
    else:
        from eaglepatch.server.restart import RestartResult, Strategy

        failed = res if res is not None else RestartResult(Strategy.START, None, False, 0.0, message=fail)
        doc["message"] = f"putting back {why}: {fail}; " + not_back(target[0].port, failed, slow.timeout)
        doc["log_tail"] = getattr(res, "log_tail", "") or ""
    return doc
