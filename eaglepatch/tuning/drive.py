"""``bench`` and ``sweep`` on one target: load the running server through the SSH connection, and restart it once
per point of a grid of launch flags.

bench: a seeded load (``eaglepatch.tuning.load``) through a forwarded port (``Host.open_tunnel``; a local target is
loaded directly), then the timing records of the server's processes whose ``t`` lies in the load's window
(measured on the host's clock), aggregated as ``report`` does. The patch's runtime writes its records in batches
(every 2 s at the latest), so bench waits ``log_wait`` seconds after the load before it fetches them.

sweep: see ``eaglepatch.tuning.sweep`` for the grid and the state file. Each run is: rewrite the original launch command
for the point, ``restart(current=<what runs>, launch=<the point>)``, wait until ready, bench, save the run's
figures to the state file. A point whose server does not come up is saved as failed with the log's tail and the
sweep goes on. At the end (also after Ctrl-C or an error) the server is started again with the original command
(with ``keep_best``: the best point's); the patch state is never touched.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import os
import time
from typing import Any, Callable, Iterator, Sequence

from eaglepatch import progress
from eaglepatch.errors import ConnectionFailed, EaglepatchError, Interrupted, Unsupported, UsageError
from eaglepatch.hosts.base import Host
from eaglepatch.redact import shown_argv
from eaglepatch.tuning.load import SHORT_LOAD_S, LoadFailed, LoadSpec, run_load, short_load_note
from eaglepatch.failpoints import failpoint
from eaglepatch.ops.actions import Connect, _facts, _launch_of, _Target, fetch_logs_from, logs_of
from eaglepatch.ops.core import Session, new_lock_owner
from eaglepatch.server.flags import check_speculative_point
from eaglepatch.transform.recipe import builtin_recipe

Say = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class BenchOptions:
    """The load, and how long to wait after it for the server's timing records (``--log-wait``)."""

    load: LoadSpec = LoadSpec()
    log_wait: float = 4.5
    request_timeout: float = 600.0

    def __post_init__(self) -> None:
        if self.log_wait < 0:
            raise UsageError("--log-wait cannot be negative")


def _no_server(name: str) -> Unsupported:
    return Unsupported(f"{name}: no sglang server is running (for this sglang install): start it "
                       "(python -m sglang.launch_server ...), then run this again")


# ----------------------------------------------------------------------------------------------------------------
# bench


def _patched_log_dir(facts: Any) -> str | None:
    """The timing log folder when the target is patched (its manifest says where), else None."""
    if not facts.manifest or facts.runtime_sha256 is None:
        return None
    return ((facts.manifest.get("runtime") or {}).get("log_dir")) or "/tmp/eaglepatch"


def clock_offset(host: Host, python: str, samples: int = 3) -> tuple[float, float]:
    """(the host's wall clock minus ours, its uncertainty), in seconds; (0, 0) on this machine.

    The host's clock is read in the middle of our round trip (``date``, else the interpreter); of a few tries the
    one with the shortest round trip counts, and half of that round trip is the uncertainty."""
    if host.is_local:
        return 0.0, 0.0
    best: tuple[float, float] | None = None
    for argv in (["date", "+%s.%N"], [python, "-c", "import time; print(repr(time.time()))"]):
        for _ in range(samples):
            before = time.time()
            res = host.run(argv, timeout=60)
            after = time.time()
            try:
                remote = float(res.stdout.decode().strip().splitlines()[-1])
            except (ValueError, IndexError):
                break  # no GNU date there: try the interpreter
            rtt = after - before
            if best is None or rtt / 2 < best[1]:
                best = (remote - (before + after) / 2, rtt / 2)
        if best is not None:
            return best
    return 0.0, 0.0


def _url(host: Host, addr: str, port: int) -> str:
    where = addr if host.is_local else "127.0.0.1"
    if ":" in where:
        where = f"[{where}]"
    return f"http://{where}:{port}"


def bench_on(host: Host, name: str, python: str, server: Any, log_dir: str | None, opts: BenchOptions,
             say: Say) -> dict[str, Any]:
    """Load ``server`` (a ServerProcess) on ``host`` and collect the timing records of the load's window."""
    offset, unc = clock_offset(host, python)
    probe = getattr(host, "probe_tunnel", None)
    why = probe(server.probe_host, server.port) if probe is not None else None
    if why:
        raise Unsupported(f"{name}: {why}: is the server (pid {server.pid}) up and listening on :{server.port}?")
    try:
        port = host.open_tunnel(server.probe_host, server.port)  # type: ignore[attr-defined]
    except OSError as exc:
        raise ConnectionFailed(f"{name}: cannot forward a local port to :{server.port}: {exc}") from None
    try:
        # the pause after the warm-up keeps its cycles out of the window, widened by the clock's uncertainty
        lr = run_load(_url(host, server.probe_host, port), opts.load, api_key=server.api_key, progress=say,
                      timeout=opts.request_timeout, pause=2 * unc + 0.05 if opts.load.warmup else 0.0)
    finally:
        host.close_tunnel(port)  # type: ignore[attr-defined]
    window = (lr.start + offset - unc, lr.end + offset + unc)
    notes: list[str] = []
    timings = None
    if log_dir is None:
        notes.append("the target is not patched: no per-phase timings (eaglepatch apply TARGET first)")
    else:
        timings = collect_timings(host, name, python, log_dir, {server.pid, *server.children}, window,
                                  opts.log_wait, say, notes, argv=server.argv)
    if lr.seconds < SHORT_LOAD_S:
        notes.append(short_load_note(lr.seconds))
    if not lr.streamed:
        notes.append("the server did not stream: time to first token is unknown (null)")
    if lr.failed:
        notes.append(f"{lr.failed} of {len(lr.results)} requests failed: {'; '.join(lr.errors())}")
    return {
        "target": name,
        "server": {"pid": server.pid, "argv": list(server.argv)},
        "load": opts.load.to_json(),
        "window": {"start": round(window[0], 4), "end": round(window[1], 4), "seconds": round(lr.seconds, 4),
                   "clock_offset_s": round(offset, 4), "clock_uncertainty_s": round(unc, 4)},
        "client": lr.to_json(),
        "timings": timings,
        "notes": notes,
    }


def collect_timings(host: Host, name: str, python: str, log_dir: str, pids: set[int],
                    window: tuple[float, float], wait: float, say: Say, notes: list[str],
                    argv: Sequence[str] = ()) -> dict[str, Any] | None:
    """The ``report --predict --json`` object of the records of ``pids`` whose ``t`` lies in ``window`` (the server's
    command line ``argv`` gives the step count where the records' run header does not); None (and a note) when
    there are none."""
    from eaglepatch import report as rep
    from eaglepatch.doctor.facts import parse_flags, server_args_of
    from eaglepatch.report.predict import predict

    if wait > 0:
        say(f"waiting {wait:g} s for the server to write its timing records")
        time.sleep(wait)
    try:
        folder = fetch_logs_from(host, name, python, log_dir, lambda _m: None, pids=pids)
    except UsageError as exc:
        notes.append(f"no timing logs: {exc}")
        return None
    # every host folder the logs came from has a subfolder of the cache (the runtime's private one too)
    files = logs_of(sorted(glob.glob(os.path.join(folder, "**", "*.jsonl"), recursive=True)), pids)
    if not files:
        notes.append(f"no timing log of the server's processes in {log_dir}: is the running server the patched "
                     "one (restarted after apply)?")
        return None
    res = rep.aggregate(files, t_min=window[0], t_max=window[1], sources=[f"{name}:{log_dir}"])
    if res.records == 0:
        notes.append("no timing records inside the load's window (the server timed no cycle then)")
        return None
    doc = res.to_json()
    flags = parse_flags(server_args_of(argv)) if argv else None
    for gd, pred in zip(doc["groups"], predict(res, flags=flags)):
        if pred is not None:
            gd.update(pred.to_json())
    return doc


def bench(text: str, c: Connect, opts: BenchOptions, say: Say) -> dict[str, Any]:
    with _Target(text, c) as t:
        facts = _facts(t, builtin_recipe())
        server = _launch_of(facts, c.facts.server_ports)
        if server is None:
            raise _no_server(t.spec.name)
        return bench_on(t.host, t.spec.name, facts.python, server, _patched_log_dir(facts), opts, say)


def _ms(d: dict[str, Any] | None, key: str = "p50") -> str:
    return "-" if not d or d.get(key) is None else f"{d[key]:.1f}"


def render_bench(doc: dict[str, Any]) -> str:
    from eaglepatch import report as rep

    cl = doc["client"]
    load = doc["load"]
    out = [
        f"{doc['target']}: {cl['requests']} requests ({load['concurrency']} at a time, {load['input_len']} tokens in, "
        f"{load['max_new_tokens']} out) in {cl['seconds']:.2f} s; {cl['failed']} failed",
        f"  output tokens/s: {cl['tokens_per_s'] if cl['tokens_per_s'] is not None else '-'}",
        f"  TTFT ms:    p50 {_ms(cl['ttft_ms'])}  p90 {_ms(cl['ttft_ms'], 'p90')}  max {_ms(cl['ttft_ms'], 'max')}",
        f"  latency ms: p50 {_ms(cl['latency_ms'])}  p90 {_ms(cl['latency_ms'], 'p90')}  "
        f"max {_ms(cl['latency_ms'], 'max')}",
        f"  accept length (server): {cl['accept_len'] if cl['accept_len'] is not None else '-'}",
    ]
    sa = cl.get("server_acceptance")
    if sa:
        shares = "  ".join(f"{i + 1}: {x:.2f}" for i, x in enumerate(sa["at_least"]))
        out.append(f"  acceptance (server's histogram, {sa['samples']} request-cycles): at least {shares}")
    t = doc.get("timings")
    if t:
        out.append(f"\ntiming log of the same window ({t['records']} cycles):")
        out.append(rep.render_table(rep.ReportResult.from_json(t)))
        for g in t.get("groups") or []:
            pts, best = g.get("predict") or [], g.get("predict_best")
            here = next((p for p in pts if p["basis"] == "measured" and p["steps"]), None)
            if best is not None and here is not None:
                b = pts[best]
                what = "no speculation" if b["steps"] == 0 else f"{b['steps']} steps"
                out.append(f"predicted best: {what}, {b['tokens_per_s']:.1f} tok/s ({b['basis']}) against "
                           f"{here['tokens_per_s']:.1f} at the {here['steps']} steps measured (report --predict "
                           "for every step count)")
    for n in doc.get("notes") or []:
        out.append(f"note: {n}")
    return "\n".join(out)


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
                 original: Any, env_names: Sequence[str], ports: Sequence[int]):
        self.host, self.python, self.package_dir, self.state = host, python, package_dir, state
        self.launches, self.original, self.env_names, self.ports = list(launches), original, env_names, ports

    def _ours(self, srv: Any) -> bool:
        head = self.state.header or {}
        first = head.get("server") or {}
        if srv.pid == first.get("pid") and srv.start == first.get("start"):
            return True
        if (srv.pid, srv.start) in self.state.launched():
            return True
        return any(_runs(srv, spec, self.env_names) for spec in [self.original, *self.launches])

    def _beside(self, srv: Any) -> bool:
        return any(srv.pid == o.get("pid") and srv.start == o.get("start")
                   for o in (self.state.header or {}).get("beside") or ())

    def current(self, port: int) -> Any:
        """The server of the install on ``port`` that the sweep may stop (None when none runs); raises
        Conflict when one runs there that the sweep did not record or start, or when a new server of the install
        runs elsewhere (starting one here would put a second model server on the host)."""
        from eaglepatch.errors import Conflict
        from eaglepatch.server.process import find_servers

        servers = find_servers(self.host, self.python, package_dir=self.package_dir)
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


def sweep(text: str, c: Connect, opts: SweepOptions, say: Say) -> dict[str, Any]:
    from eaglepatch.tuning import sweep as sw
    from eaglepatch.hostside.launchers import launcher_args_index
    from eaglepatch.server.process import LaunchSpec

    opts.points()  # the syntax, before anything is read
    with _Target(text, c) as t:
        name = t.spec.name
        facts = _facts(t, builtin_recipe())
        python = facts.python
        host = t.host
        flags = server_flags(host, python, facts.package_dir, facts.version, say)
        flag_axes, env_axes, points = opts.points(flags)
        ident = sw.sweep_id(name, points, opts.repeat, opts.bench.load.to_json())
        state = sw.StateFile(sw.state_path(name, ident))
        if opts.fresh and state.header is not None:
            say(f"--fresh: starting over (forgetting {len(state.runs)} saved run(s) in {state.path})")
            state.remove()
        plan = sw.plan_runs(points, opts.repeat, ident)
        if state.header is not None and state.restore is not None and not _pending(state, points, plan):
            # finished, and the server was put back: the table again, and nothing on the host is touched
            say(f"{name}: this sweep is complete ({state.path}): nothing was started; --fresh runs it again")
            summary = sw.summarize(name, points, state.runs, opts.baseline, opts.repeat)
            summary.update(state_file=state.path, restore=dict(state.restore, restarted=False))
            return summary
        server = _launch_of(facts, c.facts.server_ports)
        if state.header is not None:
            original = LaunchSpec.from_json(state.header["original"])
            args_index = int(state.header["args_index"])
        else:
            if server is None:
                raise _no_server(name)
            original = server.launch_spec()  # UsageError when it cannot be relaunched from here
            args_index = launcher_args_index(list(original.argv))
            if args_index < 0:
                raise Unsupported(f"{name}: the server's command line is not one eaglepatch can rewrite: "
                                  f"{shown_argv(original.argv)}")
        sw.check_speculation(original.argv[args_index:], flag_axes, flags)
        launches = []
        notes: list[str] = []
        refused: dict[str, str] = {}  # point key -> why sglang would not start with it
        for p in points:
            argv, derived = sw.point_argv(original.argv, args_index, p, flags)
            notes.extend(derived)
            launches.append(dataclasses.replace(original, argv=argv, env=sw.point_env(original.env, p)))
            why = None if p.baseline else check_speculative_point(sw.flag_values(argv[args_index:], flags))
            if why:
                refused[p.key] = why
        if refused and len(refused) == sum(1 for p in points if not p.baseline):
            raise UsageError(f"{name}: sglang would refuse every point of this grid at start: "
                             + "; ".join(f"{p.label}: {refused[p.key]}" for p in points if p.key in refused))
        for p in points:
            if p.key in refused:
                notes.append(f"not launched: {p.label}: {refused[p.key]}")
        if not sw.runs_speculation(original.argv[args_index:], flags) and opts.baseline:
            notes.append("the server runs no speculation: the baseline is its own command line")

        with sweep_locks(host, python, facts, state):
            if state.header is None:
                state.write_header(dict(header_of(name, facts, original, args_index, server),
                                        points=[p.key for p in points], repeat=opts.repeat,
                                        load=opts.bench.load.to_json()))
            env_names = [a.name for a in env_axes]
            owned = _Owned(host, python, facts.package_dir, state, launches, original, env_names,
                           c.facts.server_ports)
            return _run_sweep(host, name, python, facts, state, points, launches, original, opts, notes, say,
                              env_names=env_names, plan=plan, owned=owned, refused=refused)


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
    from eaglepatch.tuning import sweep as sw

    beside = [s for s in servers_of(facts) if s.pid != server.pid]
    return {"version": 1, "target": name, "created": sw.now_iso(), "original": original.to_json(),
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
    from eaglepatch.tuning import sweep as sw
    from eaglepatch.server.restart import RestartOptions

    ropts = RestartOptions(timeout=opts.timeout, poll_interval=0.5)
    log_dir = _patched_log_dir(facts)
    pending = _pending(state, points, plan)
    if state.done():
        say(f"resuming: {len(plan) - len(pending)} of {len(plan)} run(s) already done ({state.path})")
    else:
        say(f"sweep: {len(points)} point(s) x {opts.repeat} run(s), in shuffled order; results saved as they "
            f"complete in {state.path}")
    if log_dir is None:
        say("note: the target is not patched: tok/s and accept length only, no per-phase timings")
    restore_doc: dict[str, Any] | None = None
    interrupted: BaseException | None = None
    took: list[float] = []  # seconds of each run of this invocation: the estimate of what is left
    progress.stage(name, "a sweep under way: its server may run a sweep point: run the same sweep again to resume "
                         "and put the original server back")
    try:
        for n, (i, rep) in enumerate(pending, 1):
            p, launch = points[i], launches[i]
            if p.key in state.failed_points():
                continue  # it did not come up before: no more launches of it
            if p.key in refused:
                state.add_run({"point": p.key, "index": i, "rep": rep, "argv": list(launch.argv),
                               "env": dict(p.env), "t": round(time.time(), 3), "status": "failed",
                               "error": f"not launched: sglang would refuse it at start: {refused[p.key]}"})
                continue
            left = f", about {_eta(took, len(pending) - n + 1)} left" if took else ""
            say(f"run {len(plan) - len(pending) + n}/{len(plan)}: point #{i} ({p.label}), "
                f"repetition {rep + 1}/{opts.repeat}{left}")
            t_run = time.monotonic()
            state.add_run(_one_run(host, name, python, launch, ropts, log_dir, opts, i, rep, p, say, owned))
            took.append(time.monotonic() - t_run)
            failpoint("sweep:after-run")
    except BaseException as exc:  # Ctrl-C, a lost connection, a bug: put the server back, then report it
        interrupted = exc
    summary = sw.summarize(name, points, state.runs, opts.baseline, opts.repeat)
    target_launch, why = original, "the original command line"
    if opts.keep_best and interrupted is None:
        if summary["best"] is not None:
            target_launch, why = launches[summary["best"]], f"the best point's (#{summary['best']})"
        else:
            notes.append("--keep-best: no point ran: the original command line is back")
    try:
        if interrupted is not None:
            progress.stage(name, "a sweep interrupted: its original server being put back (run the same sweep "
                                 "again to resume)")
        restore_doc = _restore(host, python, target_launch, env_names, ropts, why, say, owned)
        if restore_doc.get("ready"):
            progress.stage(name, "the sweep's server put back and ready")
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


def _one_run(host: Host, name: str, python: str, launch: Any, ropts: Any, log_dir: str | None,
             opts: SweepOptions, index: int, rep: int, point: Any, say: Say, owned: _Owned) -> dict[str, Any]:
    from eaglepatch.tuning import sweep as sw
    from eaglepatch.server.restart import restart

    base = {"point": point.key, "index": index, "rep": rep, "argv": list(launch.argv),
            "env": dict(point.env), "t": round(time.time(), 3)}
    current = owned.current(launch.port)
    # recorded as it starts, before the wait: a sweep killed meanwhile knows that server as its own
    res = restart(host, current=current, launch=launch, options=ropts, progress=lambda line: say('  ' + line), python=python,
                  on_started=lambda st: owned.state.add_launch(st.pid, st.start, launch.port))
    if not res.ready:
        say(f"  failed: {res.message}")
        return dict(base, status="failed", error=res.message, log_tail=res.log_tail, pid=res.pid)
    server = owned.current(launch.port)
    if server is None or server.pid != res.pid:
        return dict(base, status="failed", error=f"the server on :{launch.port} was ready, then gone", pid=res.pid)
    try:
        doc = bench_on(host, name, python, server, log_dir, opts.bench, lambda m: say("  " + m))
    except LoadFailed as exc:
        say(f"  failed: {exc}")
        return dict(base, status="failed", error=str(exc), pid=server.pid, log_tail="")
    fig = sw.run_figures(doc)
    acc = fig["accept_len"]
    say(f"  {fig['tokens_per_s']:.1f} tok/s" + (f", accept length {acc:.2f}" if acc is not None else "")
        + (f", cycle p50 {fig['phases_p50']['cycle']:.2f} ms" if "cycle" in fig["phases_p50"] else ""))
    return dict(base, status="ok", pid=server.pid, ready_s=round(res.seconds, 2), **fig, client=doc["client"],
                notes=doc["notes"])


def _restore(host: Host, python: str, launch: Any, env_names: Sequence[str], ropts: Any, why: str,
             say: Say, owned: _Owned) -> dict[str, Any]:
    """Leave ``launch`` running: restart into it unless what runs is already it."""
    from eaglepatch.server.restart import restart

    from eaglepatch.ops.lifecycle import ROLLBACK_TIMEOUT_S, not_back

    current = owned.current(launch.port)
    if current is not None and _runs(current, launch, env_names):
        say(f"the server already runs {why}")
        return {"restarted": False, "ready": True, "argv": list(launch.argv),
                "message": f"the server runs {why}"}
    say(f"putting the server back: {why}")
    # as a rollback: its own generous timeout, whatever --timeout the points had, and a slow one is left loading
    slow = dataclasses.replace(ropts, timeout=max(ropts.timeout, ROLLBACK_TIMEOUT_S), stop_on_failure=False)
    res = restart(host, current=current, launch=launch, options=slow, progress=lambda line: say('  ' + line), python=python)
    doc = {"restarted": True, "ready": res.ready, "argv": list(launch.argv), "pid": res.pid}
    if res.ready:
        doc["message"] = f"the server runs {why} again (pid {res.pid})"
    else:
        doc["message"] = f"putting back {why}: " + not_back(launch.port, res, slow.timeout)
        doc["log_tail"] = res.log_tail
    return doc
