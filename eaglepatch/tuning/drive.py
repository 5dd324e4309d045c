"""``sweep`` on one target: restart the server once per point of a grid of launch flags and bench each.

See ``sweep`` for the grid and ``sweep_state`` for the state file. Each run is: rewrite the original launch command
for the point, ``restart(current=<what runs>, launch=<the point>)``, wait until ready, bench (``tuning.bench``),
save the run's figures to the state file. A point whose server does not come up is saved as failed with the log's
tail and the sweep goes on. At the end (also after Ctrl-C or an error) the server is started again with the original
command (with ``keep_best``: the best point's); the patch state is never touched.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any, Callable, Iterator, Sequence

from eaglepatch import progress
from eaglepatch.errors import EaglepatchError, Interrupted, Unsupported, UsageError
from eaglepatch.hosts.base import Host
from eaglepatch.hosts.spec import TargetSpec
from eaglepatch.redact import mask_argv, shown_argv
from eaglepatch.report.labels import CLIENT
from eaglepatch.tuning.load import LoadFailed
from eaglepatch.failpoints import failpoint
from eaglepatch.ops import nodes
from eaglepatch.ops.lifecycle import launch_of
from eaglepatch.ops.session import Session, new_lock_owner
from eaglepatch.ops.target import Connect, Target, target_facts
from eaglepatch.server.eagle_limits import check_speculative_point
from eaglepatch.transform.recipe import builtin_recipe

from eaglepatch.tuning.bench import BenchOptions, bench_on, no_server, patched_log_dir
from eaglepatch.tuning.target_url import check_side

Say = Callable[[str], None]


# ----------------------------------------------------------------------------------------------------------------
# sweep


@dataclasses.dataclass(frozen=True)
class SweepOptions:
    grid: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    allow: tuple[str, ...] = ()
    baseline: bool = False
    repeat: int = 1
    keep_best: bool = False
    fresh: bool = False
    timeout: float = 900.0
    bench: BenchOptions = BenchOptions()
    objective: Any = None  # sweep_summary.Objective: what best means (None: the most tok/s)
    # --allow-shared-traffic: sweep a server that serves requests other than the sweep's (else refused, exit 2)
    allow_shared_traffic: bool = False

    def summarize(self, name: str, points: Any, runs: Any) -> dict[str, Any]:
        """``sweep_summary.summarize`` of these runs with this sweep's baseline, repeat and objective."""
        from eaglepatch.tuning import sweep_summary

        return sweep_summary.summarize(name, points, runs, self.baseline, self.repeat,
                                       **({"objective": self.objective} if self.objective is not None else {}))

    def points(self, flags: Any = None) -> tuple[Any, Any, list[Any]]:
        """(flag axes, env axes, points), the flag names checked against ``flags`` (what the target's sglang
        accepts: ``server_flags``); without it, the syntax alone, before any target is touched. Raises
        UsageError for bad input."""
        from eaglepatch.tuning import sweep as sw

        if self.repeat < 1:
            raise UsageError(f"--repeat must be 1 or more, not {self.repeat}")
        if not self.timeout > 0:
            raise UsageError("--timeout must be a positive number of seconds")
        flag_axes = sw.parse_grid(self.grid, self.allow, sw.ANY if flags is None else flags)
        env_axes = sw.parse_env_grid(self.env)
        return flag_axes, env_axes, sw.make_points(flag_axes, env_axes, self.baseline)


def server_flags(host: Host, python: str, package_dir: str, version: str | None, say: Say) -> Any:
    """The launch flags the target's own sglang accepts (``server.flags.ServerFlags``, read from its
    ``server_args.py`` and the modules that builds its parser from), or eaglepatch's own list (``sweep.HAND``)
    with a note when they cannot be read."""
    from eaglepatch.tuning import sweep as sw
    from eaglepatch.hosts.agent import call
    from eaglepatch.server import flags as fl

    modules: dict[str, str] = {}
    source = call(host, python, "read", package_dir=package_dir, paths=[fl.SERVER_ARGS_PATH])["files"].get(
        fl.SERVER_ARGS_PATH)
    parsed = fl.parse_server_flags(source, modules) if source else None
    for _ in range(5):
        if parsed is None or parsed.complete:
            break
        wanted = [fl.module_path(m) for m in parsed.missing if m not in modules]
        got = call(host, python, "read", package_dir=package_dir, paths=wanted)["files"] if wanted else {}
        new = {m: got[fl.module_path(m)] for m in parsed.missing if got.get(fl.module_path(m)) is not None}
        if not new:
            break
        modules.update(new)
        parsed = fl.parse_server_flags(source, modules)
    if parsed is None or not parsed.complete:
        say(f"note: cannot read the launch flags of sglang {version or '?'} at {package_dir} (its "
            f"{fl.SERVER_ARGS_PATH}): checking --grid against eaglepatch's own list")
        return sw.HAND
    return _Named(parsed, f"{version or '?'} at {package_dir}")


class _Named:
    """A ServerFlags that says where it was read (for messages)."""

    def __init__(self, flags: Any, where: str):
        self._flags, self.source = flags, f"sglang {where}"

    def __contains__(self, name: object) -> bool:
        return name in self._flags

    def __getattr__(self, name: str) -> Any:
        return getattr(self._flags, name)


def _eta(took: Sequence[float], runs_left: int) -> str:
    """What ``runs_left`` more runs take at the median pace of those done, for a person: ``12 min``."""
    import statistics

    seconds = statistics.median(took) * runs_left
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def _runs(srv: Any, spec: Any, env_names: Sequence[str]) -> bool:
    """``srv`` runs ``spec``'s command line, with its values of the swept environment variables."""
    return list(srv.argv) == list(spec.argv) and all((srv.env or {}).get(n) == spec.env.get(n) for n in env_names)


class _Owned:
    """Which servers of the install a sweep may stop: the one it recorded at its start (pid and start time), the
    ones it launched itself (recorded as it launched them, or recognised by a point's exact command line), and
    none else. Other servers of the install that ran beside it at the start may go on running; a new one means
    the user started their own server meanwhile, and the sweep stops rather than stop it or start a second."""

    def __init__(self, host: Host, python: str, package_dir: str, state: Any, launches: Sequence[Any],
                 original: Any, env_names: Sequence[str], ports: Sequence[int],
                 head: Callable[[], dict[str, Any]] | None = None):
        self.host, self.python, self.package_dir, self.state = host, python, package_dir, state
        self.launches, self.original, self.env_names, self.ports = list(launches), original, env_names, ports
        # where the state file says which server the sweep started from and which ran beside it: its header, or
        # (a sweep across the nodes of a server: drive_nodes) this node's entry in it
        self._head = head or (lambda: self.state.header or {})

    def _ours(self, srv: Any) -> bool:
        head = self._head()
        first = head.get("server") or {}
        if srv.pid == first.get("pid") and srv.start == first.get("start"):
            return True
        if (srv.pid, srv.start) in self.state.launched():
            return True
        return any(_runs(srv, spec, self.env_names) for spec in [self.original, *self.launches])

    def _beside(self, srv: Any) -> bool:
        return any(srv.pid == o.get("pid") and srv.start == o.get("start")
                   for o in self._head().get("beside") or ())

    def current(self, port: int, settle: Any = None, settle_wait: float = 0.0) -> Any:
        """The server of the install on ``port`` that the sweep may stop (None when none runs); raises
        Conflict when one runs there that the sweep did not record or start, or when a new server of the install
        runs elsewhere (starting one here would put a second model server on the host). ``settle`` (a launch
        spec): read once no relaunch of its port runs on the host (``find_servers``)."""
        from eaglepatch.errors import Conflict
        from eaglepatch.server.process import find_servers

        servers = find_servers(self.host, self.python, package_dir=self.package_dir, settle=settle,
                               settle_wait=settle_wait)
        here = [s for s in servers if s.port == port]
        for srv in here:
            if not self._ours(srv):
                raise Conflict(f"the server on :{port} (pid {srv.pid}: {shown_argv(srv.argv)}) is not the one this "
                               "sweep recorded or started: it was not stopped; to sweep the server that runs now, "
                               "run the sweep again with --fresh")
        for srv in servers:
            if srv.port != port and not self._ours(srv) and not self._beside(srv) and (
                    not self.ports or srv.port in self.ports):
                raise Conflict(f"a server of this install that this sweep did not start runs on :{srv.port} "
                               f"(pid {srv.pid}); starting one on :{port} would put a second model server on "
                               "the host: nothing was started; stop it, or run the sweep again with --fresh "
                               f"--server-port {srv.port} to sweep it")
        return here[0] if here else None


def sweep(spec: TargetSpec, c: Connect, opts: SweepOptions, say: Say) -> dict[str, Any]:
    from eaglepatch.tuning import cmdline, sweep_state
    from eaglepatch.tuning import sweep as sw
    from eaglepatch.hostside.launchers import launcher_args_index
    from eaglepatch.server.process import LaunchSpec, disaggregation_of

    opts.points()  # the syntax, before anything is read
    with Target(spec, c) as t:
        name = t.spec.name
        facts = target_facts(t, builtin_recipe())
        python = facts.python
        host = t.host
        flags = server_flags(host, python, facts.package_dir, facts.version, say)
        flag_axes, env_axes, points = opts.points(flags)
        ident = sweep_state.sweep_id(name, points, opts.repeat, opts.bench.load_json())
        state = sweep_state.StateFile(sweep_state.state_path(name, ident))
        if opts.fresh and state.header is not None:
            say(f"--fresh: starting over (forgetting {len(state.runs)} saved run(s) in {state.path})")
            state.remove()
        plan = sw.plan_runs(points, opts.repeat, ident)
        if state.header is not None and state.restore is not None and not _pending(state, points, plan):
            # finished, and the server was put back: the table again, and nothing on the host is touched
            say(f"{name}: this sweep is complete ({state.path}): nothing was started; --fresh runs it again")
            summary = opts.summarize(name, points, state.runs)
            summary.update(state_file=state.path, restore=dict(state.restore, restarted=False))
            return summary
        server = launch_of(facts, c.facts.server_ports)
        if server is not None:  # before anything changes: one side of a PD pair is loaded through --url only
            check_side(name, server.disaggregation, f"the server on :{server.port} (pid {server.pid})",
                       opts.bench.url, "sweep")
        if server is not None:  # before anything changes: one node of a multi-node server is never restarted alone
            nodes.check([server], [server], "sweep", name, several=False,
                        fix="name every node's host in the same sweep (eaglepatch sweep NODE0 NODE1 ... --grid "
                            "...): every node is restarted together per point")
        if server is not None and state.header is None and not opts.allow_shared_traffic:
            # before the first restart: a server serving others' requests is not stopped without the option
            _check_shared(host, name, python, facts, server, say)
        if state.header is not None:
            original = LaunchSpec.from_json(state.header["original"])
            args_index = int(state.header["args_index"])
            if server is None:  # resumed while no server runs: the launch it puts back says which side it is
                check_side(name, disaggregation_of(original.argv[args_index:]),
                           f"the server it launches on :{original.port}", opts.bench.url, "sweep")
        else:
            if server is None:
                raise no_server(name)
            original = server.launch_spec()  # UsageError when it cannot be relaunched from here
            args_index = launcher_args_index(list(original.argv))
            if args_index < 0:
                raise Unsupported(f"{name}: the server's command line is not one eaglepatch can rewrite: "
                                  f"{shown_argv(original.argv)}")
        cmdline.check_speculation(original.argv[args_index:], flag_axes, flags)
        launches, notes, refused = point_launches(name, original, args_index, points, flags, opts.baseline)

        with sweep_locks(host, python, facts, state):
            if state.header is None:
                state.write_header(dict(header_of(name, facts, original, args_index, server),
                                        points=[p.key for p in points], repeat=opts.repeat,
                                        load=opts.bench.load_json()))
            env_names = [a.name for a in env_axes]
            owned = _Owned(host, python, facts.package_dir, state, launches, original, env_names,
                           c.facts.server_ports)
            return _run_sweep(host, name, python, facts, state, points, launches, original, opts, notes, say,
                              env_names=env_names, plan=plan, owned=owned, refused=refused)


def point_launches(name: str, original: Any, args_index: int, points: Sequence[Any], flags: Any,
                   baseline: bool) -> tuple[list[Any], list[str], dict[str, str]]:
    """Each point's launch (``original`` with the point's flags and environment), the notes they call for, and the
    points sglang would refuse at start (point key -> why: saved as failed, never launched); UsageError when it
    would refuse every point but the baseline."""
    from eaglepatch.tuning import cmdline

    launches = []
    notes: list[str] = []
    refused: dict[str, str] = {}
    for p in points:
        argv, derived = cmdline.point_argv(original.argv, args_index, p, flags)
        notes.extend(derived)
        launches.append(dataclasses.replace(original, argv=argv, env=cmdline.point_env(original.env, p)))
        why = None if p.baseline else check_speculative_point(cmdline.flag_values(argv[args_index:], flags))
        if why:
            refused[p.key] = why
    if refused and len(refused) == sum(1 for p in points if not p.baseline):
        raise UsageError(f"{name}: sglang would refuse every point of this grid at start: "
                         + "; ".join(f"{p.label}: {refused[p.key]}" for p in points if p.key in refused))
    notes.extend(f"not launched: {p.label}: {refused[p.key]}" for p in points if p.key in refused)
    if not cmdline.runs_speculation(original.argv[args_index:], flags) and baseline:
        notes.append("the server runs no speculation: the baseline is its own command line")
    return launches, notes, refused


# How far back a restart sweep looks in the server's timing records for requests that are not eaglepatch's.
SHARED_LOOKBACK_S = 60.0
SHARED_TAIL_BYTES = 2 << 20  # of each rank's newest log: some 5,000 records, a busy rank's last minute and more


def _check_shared(host: Host, name: str, python: str, facts: Any, server: Any, say: Say) -> None:
    """Raise UsageError (exit 2, nothing changed) when the server's timing records of the last SHARED_LOOKBACK_S
    seconds hold decode cycles with requests that are not eaglepatch's (the records' ``"others"``), else when the
    server holds requests now by its own count (``_check_busy``: patched or not; records without request ids, as
    0.5.12's V2 batch writes, tell nothing)."""
    _check_records(host, name, python, facts, server)
    _check_busy(host, name, python, server, say)


def _check_records(host: Host, name: str, python: str, facts: Any, server: Any) -> None:
    """``_check_shared``'s look at the timing records (none on an unpatched server: nothing refused then)."""
    import os
    import tempfile

    from eaglepatch.ops.inspection import log_tails
    from eaglepatch.tuning import traffic
    from eaglepatch.tuning.bench import clock_offset

    log_dir = patched_log_dir(facts)
    if log_dir is None:
        return
    pids = {server.pid, *server.children}
    offset, unc = clock_offset(host, python)
    tails = log_tails(host, python, log_dir, pids, SHARED_TAIL_BYTES)  # not the logs whole: up to --max-log-mb
    if not tails:
        return
    with tempfile.TemporaryDirectory(prefix="eaglepatch-shared-") as tmp:
        files = []
        for i, data in enumerate(tails):
            files.append(os.path.join(tmp, f"{i}.jsonl"))
            with open(files[-1], "wb") as f:
                f.write(data)
        cycles = traffic.others_since(files, time.time() + offset - unc - SHARED_LOOKBACK_S, pids)
    if cycles:
        raise UsageError(traffic.refusal(name, cycles, f"of its last {SHARED_LOOKBACK_S:.0f} s"))


# How a restart sweep reads the server's own load before its first restart: LOAD_SAMPLES answers, LOAD_INTERVAL_S
# apart (requests of steady traffic are in flight at any moment; a lull of a second between bursts is not seen).
LOAD_SAMPLES = 3
LOAD_INTERVAL_S = 0.5


def _check_busy(host: Host, name: str, python: str, server: Any, say: Say) -> None:
    """Raise UsageError (exit 2, nothing changed) when the server holds requests now, by its own count (sglang's
    ``/v1/loads``, else ``/get_load``): before the first restart the sweep has sent none, so they are others'. Patched
    or not, and whatever its records carry. A server that answers neither gets a note: nothing can be told then."""
    from eaglepatch.errors import HelperFailed
    from eaglepatch.hosts.agent import call

    try:
        ans = call(host, python, "loads", timeout=60, host=server.probe_host, port=server.port,
                   api_key=server.api_key, samples=LOAD_SAMPLES, interval=LOAD_INTERVAL_S, http_timeout=5)
    except HelperFailed as exc:
        ans = {"endpoint": None, "samples": [], "error": str(exc)}
    samples = ans.get("samples") or []
    if ans.get("error") or not samples:
        say(f"note: {name}: cannot tell whether the server on :{server.port} serves others' requests now "
            f"({ans.get('endpoint') or '/v1/loads, /get_load'}: {ans.get('error') or 'no answer'})")
        return
    busy = max(samples)
    if busy > 0:
        endpoint = ans["endpoint"].split("?", 1)[0]
        raise UsageError(f"{name}: the server on :{server.port} (pid {server.pid}) holds {busy} request(s) now that "
                         f"are not this sweep's (its {endpoint}, read {len(samples)} times over "
                         f"{LOAD_INTERVAL_S * (len(samples) - 1):.0f} s: {', '.join(map(str, samples))}): a restart "
                         "would cut them off; nothing was changed: sweep it while it serves no one else (take it "
                         "out of its router first), or give --allow-shared-traffic")


@contextlib.contextmanager
def sweep_locks(host: Host, python: str, facts: Any, state: Any) -> Iterator[None]:
    """Hold the sweep's state file and the install's lock (a sweep's: up to a week) while the block runs; raises
    Conflict when another run holds either."""
    state.lock()
    session = Session(host, python, facts)
    try:
        session.lock(new_lock_owner("sweep"), ttl=7 * 86400)
    except BaseException:
        state.unlock()
        raise
    try:
        yield
    finally:
        session.unlock()
        state.unlock()


def header_of(name: str, facts: Any, original: Any, args_index: int, server: Any) -> dict[str, Any]:
    """The first line of a sweep's state file, as far as every sweep has it: the original launch, the server it
    starts from, and the install's other servers beside it (never stopped, never a conflict)."""
    from eaglepatch.ops.lifecycle import servers_of
    from eaglepatch.tuning import sweep_state

    beside = [s for s in servers_of(facts) if s.pid != server.pid]
    return {"version": 1, "target": name, "created": sweep_state.now_iso(), "original": original.to_json(),
            "args_index": args_index, "server": {"pid": server.pid, "start": server.start, "port": server.port},
            "beside": [{"pid": s.pid, "start": s.start, "port": s.port} for s in beside]}


def _pending(state: Any, points: Sequence[Any], plan: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The planned runs not done yet (a point that failed once is not launched again)."""
    done, failed = state.done(), state.failed_points()
    return [(i, r) for i, r in plan if (points[i].key, r) not in done and points[i].key not in failed]


def _run_sweep(host: Host, name: str, python: str, facts: Any, state: Any, points: list[Any],
               launches: list[Any], original: Any, opts: SweepOptions, notes: list[str], say: Say, *,
               env_names: Sequence[str], plan: Sequence[tuple[int, int]], owned: _Owned,
               refused: dict[str, str]) -> dict[str, Any]:
    from eaglepatch.server.restart import RestartOptions

    ropts = RestartOptions(timeout=opts.timeout, poll_interval=0.5)
    log_dir = patched_log_dir(facts)
    pending = _pending(state, points, plan)
    if state.done():
        say(f"resuming: {len(plan) - len(pending)} of {len(plan)} run(s) already done ({state.path})")
    else:
        say(f"sweep: {len(points)} point(s) x {opts.repeat} run(s), in shuffled order; results saved as they "
            f"complete in {state.path}")
    if log_dir is None:
        say(f"note: the target is not patched: {CLIENT} and accept length only, no per-phase timings")
    progress.stage(name, "a sweep under way: its server may run a sweep point: run the same sweep again to resume "
                         "and put the original server back")
    interrupted = run_points(state, points, plan, pending, opts, refused, say, launches,
                             lambda base: _one_run(host, name, python, launches[base["index"]], ropts, log_dir, opts,
                                                   base, say, owned))
    summary = opts.summarize(name, points, state.runs)
    target_launch, why = original, "the original command line"
    if opts.keep_best and interrupted is None:
        if summary["best"] is not None:
            target_launch, why = launches[summary["best"]], f"the best point's (#{summary['best']})"
        else:
            notes.append("--keep-best: no point ran: the original command line is back")
    return finish(name, state, summary, notes, interrupted, say,
                  lambda: _restore(host, python, target_launch, env_names, ropts, why, say, owned),
                  lambda line: progress.stage(name, line))


def finish(name: str, state: Any, summary: dict[str, Any], notes: list[str], interrupted: BaseException | None,
           say: Say, restore: Callable[[], dict[str, Any]], stage: Callable[[str], None]) -> dict[str, Any]:
    """The end of a restart sweep (``_run_sweep``, ``drive_nodes``): the server put back (``restore``, also after
    Ctrl-C or an error, which is then raised again with what was put back and how to resume), the summary
    completed. ``stage``: says the target's state (``progress.stage``) of every TARGET."""
    try:
        if interrupted is not None:
            stage("a sweep interrupted: its original server being put back (run the same sweep again to resume)")
        restore_doc = restore()
        if restore_doc.get("ready"):
            stage("the sweep's server put back and ready")
        if interrupted is None and restore_doc.get("ready"):
            state.add_restore(restore_doc)
    except BaseException as exc:  # noqa: BLE001
        if interrupted is None:
            raise
        restore_doc = {"ready": False, "message": f"could not put the server back: {exc}"}
    if interrupted is not None:
        hint = (f"{restore_doc.get('message', '')}; {len(state.runs)} run(s) are saved: run the same command again "
                "to resume")
        if isinstance(interrupted, (KeyboardInterrupt, Interrupted)):
            say(f"{name}: interrupted; {hint}")
            raise interrupted
        if isinstance(interrupted, EaglepatchError):
            err = EaglepatchError(f"{interrupted}; {hint}")
            err.exit_code = interrupted.exit_code
            raise err from None
        say(f"{name}: {hint}")
        raise interrupted
    summary["notes"] = notes + summary["notes"]
    summary["state_file"] = state.path
    summary["restore"] = restore_doc
    return summary


def run_points(state: Any, points: Sequence[Any], plan: Sequence[tuple[int, int]], pending: Sequence[tuple[int, int]],
               opts: SweepOptions, refused: dict[str, str], say: Say, launches: Sequence[Any],
               one: Callable[[dict[str, Any]], dict[str, Any]]) -> BaseException | None:
    """The pending runs of a restart sweep, each saved as it ends: ``one(base)`` makes a run's record from its
    ``base`` (point, index, repetition, the launch's argv (``launches[i]``: node rank 0's across nodes), env, time);
    a point that failed before is not launched again, one sglang would refuse is saved as failed. Returns what ended
    the loop early (Ctrl-C, a lost connection, a bug: the caller puts the server back, then raises it), else None."""
    took: list[float] = []  # seconds of each run of this invocation: the estimate of what is left
    try:
        for n, (i, rep) in enumerate(pending, 1):
            p = points[i]
            if p.key in state.failed_points():
                continue  # it did not come up before: no more launches of it
            base = {"point": p.key, "index": i, "rep": rep, "argv": list(launches[i].argv), "env": dict(p.env),
                    "t": round(time.time(), 3)}
            if p.key in refused:
                state.add_run(dict(base, status="failed",
                                   error=f"not launched: sglang would refuse it at start: {refused[p.key]}"))
                continue
            left = f", about {_eta(took, len(pending) - n + 1)} left" if took else ""
            say(f"run {len(plan) - len(pending) + n}/{len(plan)}: point #{i} ({p.label}), "
                f"repetition {rep + 1}/{opts.repeat}{left}")
            t_run = time.monotonic()
            state.add_run(one(base))
            took.append(time.monotonic() - t_run)
            failpoint("sweep:after-run")
    except BaseException as exc:  # noqa: BLE001 - handed to the caller, which puts the server back first
        return exc
    return None


def _one_run(host: Host, name: str, python: str, launch: Any, ropts: Any, log_dir: str | None,
             opts: SweepOptions, base: dict[str, Any], say: Say, owned: _Owned) -> dict[str, Any]:
    from eaglepatch.server.restart import restart
    from eaglepatch.server.control import lock_wait

    # read once no relaunch of the port runs on the host: one whose client was killed goes on there (a sweep
    # resumed after a crash met the server that its predecessor's last relaunch was starting)
    current = owned.current(launch.port, settle=launch, settle_wait=lock_wait(ropts.grace, ropts.port_timeout))
    # recorded as it starts, before the wait: a sweep killed meanwhile knows that server as its own
    res = restart(host, current=current, launch=launch, options=ropts, progress=lambda line: say('  ' + line), python=python,
                  on_started=lambda st: owned.state.add_launch(st.pid, st.start, launch.port))
    if not res.ready:
        say(f"  failed: {res.message}")
        return dict(base, status="failed", error=res.message, log_tail=res.log_tail, pid=res.pid)
    server = owned.current(launch.port)
    if server is None or server.pid != res.pid:
        return dict(base, status="failed", error=f"the server on :{launch.port} was ready, then gone", pid=res.pid)
    return measure(host, name, python, server, log_dir, opts, base, say, res.seconds)


def measure(host: Host, name: str, python: str, server: Any, log_dir: str | None, opts: SweepOptions,
            base: dict[str, Any], say: Say, ready_s: float) -> dict[str, Any]:
    """The loads of one run on the launch ``server`` that came up in ``ready_s``: the run's saved figures."""
    from eaglepatch.tuning import sweep_summary

    loads = []
    for one in opts.bench.each():  # a ladder of concurrencies: each in turn, in this one launch
        ladder = len(opts.bench.ladder) > 1
        try:
            doc = bench_on(host, name, python, server, log_dir, one, lambda m: say("  " + m))
        except LoadFailed as exc:
            say(f"  failed: {exc}")
            return dict(base, status="failed", error=str(exc), pid=server.pid, log_tail="")
        fig = sweep_summary.run_figures(doc)
        acc = fig["accept_len"]
        say(f"  {fig['tokens_per_s']:.1f} {CLIENT}" + (f" at {one.load.concurrency} at a time" if ladder else "")
            + (f", accept length {acc:.2f}" if acc is not None else "")
            + (f", cycle p50 {fig['phases_p50']['cycle']:.2f} ms" if "cycle" in fig["phases_p50"] else ""))
        # the load's window on the host's clock, as a live window keeps it: what its timing records are read within
        window = [doc["window"]["start"], doc["window"]["end"]]
        loads.append(dict(fig, concurrency=one.load.concurrency, client=doc["client"], window=window,
                          notes=doc["notes"]))
    first = dict(loads[0])
    first.pop("concurrency")
    run = dict(base, status="ok", pid=server.pid, ready_s=round(ready_s, 2), **first)
    if len(loads) > 1:
        run["loads"] = loads
    return run


# How many times putting the server back reads the host again after what ran on the port changed under it.
RESTORE_ATTEMPTS = 3


def _changed(now: Any, before: Any) -> bool:
    """Another process than ``before`` (or than none) runs on the port ``now``."""
    key = lambda srv: None if srv is None else (srv.pid, srv.start)  # noqa: E731
    return key(now) != key(before)


def _restore(host: Host, python: str, launch: Any, env_names: Sequence[str], ropts: Any, why: str,
             say: Say, owned: _Owned) -> dict[str, Any]:
    """Leave ``launch`` running: restart into it unless what runs is already it."""
    from eaglepatch.server.restart import restart

    from eaglepatch.errors import Conflict
    from eaglepatch.ops.lifecycle import ROLLBACK_TIMEOUT_S, not_back
    from eaglepatch.server.control import lock_wait

    # as a rollback: its own generous timeout, whatever --timeout the points had, and a slow one is left loading
    slow = dataclasses.replace(ropts, timeout=max(ropts.timeout, ROLLBACK_TIMEOUT_S), stop_on_failure=False)
    for _ in range(RESTORE_ATTEMPTS):
        # after a relaunch that an interrupt cut short has ended on the host (it goes on there): what it left
        current = owned.current(launch.port, settle=launch, settle_wait=lock_wait(slow.grace, slow.port_timeout))
        if current is not None and _runs(current, launch, env_names):
            say(f"the server already runs {why}")
            return {"restarted": False, "ready": True, "argv": mask_argv(launch.argv),
                    "message": f"the server runs {why}"}
        say(f"putting the server back: {why}")
        res = restart(host, current=current, launch=launch, options=slow, progress=lambda line: say('  ' + line),
                      python=python)
        if res.ready or res.stopped_pid is not None or not (res.pid is None or res.untouched):
            break  # ready, or something was stopped or started: that is the answer
        try:
            now = owned.current(launch.port)
        except Conflict:
            break  # not the sweep's to stop: the answer stands
        if not _changed(now, current):
            break
        # nothing was stopped or started, and another server took the port meanwhile: the one a relaunch that
        # Ctrl-C cut short started on the host (it runs to its end there); read the host again and stop that one
        say(f"  the server on :{launch.port} changed meanwhile (a relaunch cut short finished on the host); "
            "reading it again")
    # sweep --json's "restore" (and the state file's): what is printed of a command line, secrets masked
    doc = {"restarted": True, "ready": res.ready, "argv": mask_argv(launch.argv), "pid": res.pid}
    if res.ready:
        doc["message"] = f"the server runs {why} again (pid {res.pid})"
    else:
        doc["message"] = f"putting back {why}: " + not_back(launch.port, res, slow.timeout)
        doc["log_tail"] = res.log_tail
    return doc
