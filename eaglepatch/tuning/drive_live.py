"""``eaglepatch sweep --live`` on one target: every step count measured inside one adaptive server.

1. Facts: the install must be patched (the runtime pins the states), its sglang must have adaptive speculation
   (``eaglepatch.tuning.adaptive.read_release``: refused with the reason otherwise, exit 4), and the server's
   shape must be one adaptive mode runs (top-k 1, EAGLE/EAGLE3, no DP attention, ...).
2. At most one launch: none when the server already runs adaptively with every step count as a candidate for the
   load's batch sizes; else the original command line plus ``--speculative-adaptive``, a config in the timing
   log folder holding every step count in one tier, and the largest as ``--speculative-num-steps`` (sglang 0.5.16
   crashes building a state for more steps than the launch's).
3. The lease (``live-<pid>.json`` in the log folder, for every process of the server; renewed before each window),
   a warm-up, the runtime's answers from every TP rank (a rank without the lease would run another step
   count than its peers), then each point's state warmed up pinned (``warm_seconds``, outside every window).
4. Rounds of windows, each round every point once in a seeded shuffled order; a window is ``--window`` seconds of
   the bench load whose request ids pin its step count (``live.rid_prefix``). Each window is saved as it ends.
5. The lease removed; the timing records of each window read once (phases of its pinned cycles, how its cycles
   ran, the server's tok/s per batch size); the original command line back (as ``sweep`` does); with
   ``--emit-adaptive-config`` the candidates per tier written.

A crash at any step leaves what ``sweep`` leaves (the install's lock, the state file, the adaptive server running),
and the runtime hands the server back to sglang's own policy once the killed client's requests are gone (or the
lease's deadline passes). The same command again resumes and puts the original server back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import os
import secrets
import time
from typing import Any, Sequence

from eaglepatch.errors import EaglepatchError, RestartFailed, Unsupported, UsageError
from eaglepatch.failpoints import failpoint
from eaglepatch.hosts.agent import call
from eaglepatch.hosts.base import Host
from eaglepatch.hosts.spec import TargetSpec
from eaglepatch.redact import mask_argv, shown_argv
from eaglepatch.report.labels import CLIENT
from eaglepatch.ops import nodes
from eaglepatch.ops.lifecycle import launch_of
from eaglepatch.ops.logs import fetch_logs_from, logs_of
from eaglepatch.ops.target import Connect, Target, target_facts
from eaglepatch.transform.recipe import builtin_recipe
from eaglepatch.tuning import adaptive as ad
from eaglepatch.tuning import live as lv
from eaglepatch.tuning import cmdline, sweep_state
from eaglepatch.tuning.bench import BenchOptions, clock_offset, no_server, patched_log_dir
from eaglepatch.tuning.drive import (
    Say,
    _Owned,
    _restore,
    _runs,
    header_of,
    server_flags,
    sweep_locks,
)
from eaglepatch.tuning import traffic
from eaglepatch.tuning.live_finish import CURVE, SERVER, curve_of, max_running_requests, summary, window_key
from eaglepatch.tuning.load import LoadFailed, run_load, run_window
from eaglepatch.tuning.target_url import Route, check_side, load_route, target_route

ANSWER_TIMEOUT_S = 20.0  # for every rank's runtime to answer the lease (it looks every 0.5 s)
MIN_LEASE_S = 60.0


@dataclasses.dataclass(frozen=True)
class LiveOptions:
    """``sweep --live``: the grid (step counts), rounds, window seconds, where to emit the adaptive config, the
    load (``bench``), the launch timeout, ``--fresh``."""

    grid: tuple[str, ...] = ()
    rounds: int = 3
    window: float = 20.0
    emit: str | None = None
    fresh: bool = False
    timeout: float = 900.0
    bench: BenchOptions = BenchOptions()
    objective: Any = None  # sweep_summary.Objective: what best means (None: the most tok/s)
    # --allow-shared-traffic: pin batches that also hold requests not the sweep's (the lease says "shared")
    allow_shared_traffic: bool = False

    def steps(self) -> tuple[int, ...]:
        """The step counts; raises UsageError for bad input (before any target is touched)."""
        if self.rounds < 1:
            raise UsageError(f"--rounds must be 1 or more, not {self.rounds}")
        if not self.window > 0:
            raise UsageError(f"--window must be a positive number of seconds, not {self.window}")
        if not self.timeout > 0:
            raise UsageError("--timeout must be a positive number of seconds")
        if self.emit is not None:
            folder = os.path.dirname(os.path.abspath(self.emit))
            if not os.path.isdir(folder):
                raise UsageError(f"--emit-adaptive-config {self.emit}: no folder {folder}")
        return lv.live_steps(self.grid)

    @property
    def lease_s(self) -> float:
        """How long a lease holds: a window and its slowest requests, with room (renewed before each window)."""
        return max(MIN_LEASE_S, 3 * self.window + 30)


def _read_release(host: Host, python: str, facts: Any) -> ad.AdaptiveRelease | None:
    files = call(host, python, "read", package_dir=facts.package_dir, paths=list(ad.SOURCES))["files"]
    return ad.read_release(files, facts.version)


def _live(host: Host, python: str, name: str, **payload: Any) -> dict[str, Any]:
    """One ``live`` request on the host; its error as an Unsupported (the log folder cannot carry a lease)."""
    res = call(host, python, "live", **payload)
    if res.get("error"):
        raise Unsupported(f"{name}: {res['error']}")
    return res


def _running_tiers(host: Host, python: str, server: Any, values: dict[str, str],
                   release: ad.AdaptiveRelease) -> dict[int, tuple[int, ...]] | None:
    """The candidates per tier of a server that runs adaptively now (its config file, or the release's default),
    or None when it does not (or its config cannot be read)."""
    if values.get("speculative-adaptive") in (None, "off"):
        return None
    path = values.get("speculative-adaptive-config")
    steps = values.get(lv.STEPS_FLAG)
    initial = int(steps) if steps and steps.isdigit() else None
    if not path:
        return dict(release.default)
    res = call(host, python, "live", action="read_config", path=path, cwd=server.cwd or "/")
    if res.get("error"):
        return None
    try:
        return ad.tiers_of(json.loads(res["text"]), release.format, initial)
    except (ValueError, UsageError):
        return None


def _tp(values: dict[str, str]) -> int:
    for n in ("tp-size", "tp", "tensor-parallel-size"):
        v = values.get(n)
        if v and v.isdigit() and int(v) > 0:
            return int(v)
    return 1


def live_sweep(spec: TargetSpec, c: Connect, opts: LiveOptions, say: Say) -> dict[str, Any]:
    """Carry out ``sweep --live`` on ``spec``; returns the summary (``live.summarize``, with ``state_file``,
    ``restore`` and, with ``--emit-adaptive-config``, ``adaptive_config``). Raises Unsupported (the install is not
    patched, no adaptive mode, a shape it does not run), UsageError, Conflict (the install's lock, a server it did
    not start), RestartFailed (the adaptive launch did not come up: the original is put back first)."""
    from eaglepatch.hostside.launchers import launcher_args_index
    from eaglepatch.server.process import LaunchSpec

    steps = opts.steps()
    with Target(spec, c) as t:
        name, host = t.spec.name, t.host
        facts = target_facts(t, builtin_recipe())
        python = facts.python
        log_dir = patched_log_dir(facts)
        if log_dir is None:
            raise Unsupported(f"{name}: sweep --live needs the patch (its runtime pins each step count inside the "
                              "server): eaglepatch apply TARGET first")
        flags = server_flags(host, python, facts.package_dir, facts.version, say)
        release = ad.check_live_grid(_read_release(host, python, facts), steps)
        ladder = _ladder(opts)
        ident = lv.live_id(name, steps, opts.rounds, opts.window, opts.bench.load_json())
        state = sweep_state.StateFile(sweep_state.state_path(name, "live-" + ident))
        if opts.fresh and state.header is not None:
            say(f"--fresh: starting over (forgetting {len(state.runs)} saved window(s) in {state.path})")
            state.remove()
        points = lv.points_of(steps)
        plan = lv.plan_windows(len(points), opts.rounds, ident, len(ladder))
        done = _done(state, ladder)
        if state.header is not None and state.restore is not None and all((points[i].key, r, ladder[j]) in done
                                                                          for r, j, i in plan):
            say(f"{name}: this live sweep is complete ({state.path}): nothing was started; --fresh runs it again")
            return summary(name, release, steps, state, opts, dict(state.restore, restarted=False), say)
        server = launch_of(facts, c.facts.server_ports)
        if server is not None:  # before anything changes: one side of a PD pair is loaded through --url only
            check_side(name, server.disaggregation, f"the server on :{server.port} (pid {server.pid})",
                       opts.bench.url, "sweep --live")
        if server is not None:  # before anything changes: one node of a multi-node server is never restarted alone
            nodes.check([server], [server], "sweep --live", name, several=False)
        if state.header is not None:
            original = LaunchSpec.from_json(state.header["original"])
            args_index = int(state.header["args_index"])
            reuse = bool(state.header.get("reuse"))
        else:
            if server is None:
                raise no_server(name)
            original = server.launch_spec()
            args_index = launcher_args_index(list(original.argv))
            if args_index < 0:
                raise Unsupported(f"{name}: the server's command line is not one eaglepatch can rewrite: "
                                  f"{shown_argv(original.argv)}")
            reuse = False
        values = cmdline.flag_values(original.argv[args_index:], flags)
        why = ad.unsupported_reason(release, values)
        if why:
            raise Unsupported(f"{name}: sweep --live: {why}: sweep without --live (a launch per point)")
        if state.header is None:
            tiers = _running_tiers(host, python, server, values, release)
            reuse = tiers is not None and ad.covers(tiers, steps, max(ladder))
        config_path = os.path.join(log_dir, f"adaptive-{ident}.json")
        live_launch = None if reuse else dataclasses.replace(
            original, argv=lv.live_argv(original.argv, args_index, steps, config_path, flags))

        with sweep_locks(host, python, facts, state):
            if state.header is None:
                state.write_header(dict(header_of(name, facts, original, args_index, server), live=True,
                                        steps=list(steps), rounds=opts.rounds, window=opts.window,
                                        load=opts.bench.load_json(), reuse=reuse, config_path=config_path, tp=_tp(values)))
            owned = _Owned(host, python, facts.package_dir, state, [live_launch] if live_launch else [], original,
                           [], c.facts.server_ports)
            run = _LiveRun(host, name, python, log_dir, state, points, steps, opts, owned, say,
                           int(state.header.get("tp") or 1))
            return run.go(plan, original, live_launch, config_path, release)


class _LiveRun:
    """One invocation of a live sweep on an open host (the state file and the install's lock held)."""

    def __init__(self, host: Host, name: str, python: str, log_dir: str, state: Any, points: list[Any],
                 steps: Sequence[int], opts: LiveOptions, owned: _Owned, say: Say, tp: int):
        self.host, self.name, self.python, self.log_dir, self.state = host, name, python, log_dir, state
        self.points, self.steps, self.opts, self.owned, self.say, self.tp = points, steps, opts, owned, say, tp
        self.token = secrets.token_hex(8)
        self.leases: list[str] = []

    # -- the lease -----------------------------------------------------------------------------------------
    def lease(self) -> None:
        """Write (or renew) the lease for every process of the server: the runtime looks for the one named after
        its launcher, which is one of them."""
        _live(self.host, self.python, self.name, action="write", log_dir=self.log_dir, names=self.leases,
              token=self.token, steps=list(self.steps), lease_s=self.opts.lease_s,
              **({"shared": True} if self.opts.allow_shared_traffic else {}))

    def release(self) -> None:
        """Remove the lease; best effort (a lease left behind runs out by itself)."""
        if self.leases:
            try:
                _live(self.host, self.python, self.name, action="remove", log_dir=self.log_dir, names=self.leases)
            except (EaglepatchError, OSError):
                pass
        self.leases = []

    def answers(self, server: Any) -> None:
        """Wait until every TP rank's runtime answers the lease; raises Unsupported when they do not in time."""
        deadline = time.monotonic() + ANSWER_TIMEOUT_S
        pids = {server.pid, *server.children}
        while True:
            res = _live(self.host, self.python, self.name, action="answers", log_dir=self.log_dir,
                        launchers=sorted(pids))
            got = {a["pid"] for a in res["answers"] if a.get("token") == self.token and a.get("alive")}
            if len(got) >= self.tp:
                return
            if time.monotonic() > deadline:
                raise Unsupported(
                    f"{self.name}: the server's runtime did not take the live sweep's lease within "
                    f"{ANSWER_TIMEOUT_S:.0f} s (answers from {len(got)} of {self.tp} rank(s)): is the server the "
                    "patched one, patched by this eaglepatch (eaglepatch apply TARGET again), and running "
                    "adaptively (its log says why sglang turned adaptive speculation off)?")
            time.sleep(0.25)

    # -- the sweep -----------------------------------------------------------------------------------------
    def go(self, plan: Sequence[tuple[int, int, int]], original: Any, live_launch: Any, config_path: str,
           release: ad.AdaptiveRelease) -> dict[str, Any]:
        from eaglepatch.server.restart import RestartOptions

        ropts = RestartOptions(timeout=self.opts.timeout, poll_interval=0.5)
        ladder = _ladder(self.opts)
        done = _done(self.state, ladder)
        pending = [(r, j, i) for r, j, i in plan if (self.points[i].key, r, ladder[j]) not in done]
        if done:
            self.say(f"resuming: {len(plan) - len(pending)} of {len(plan)} window(s) already done ({self.state.path})")
        else:
            at = (f" at each of {len(ladder)} concurrencies ({', '.join(map(str, ladder))} requests at a time)"
                  if len(ladder) > 1 else "")
            self.say(f"live sweep: {len(self.points)} point(s){at} x {self.opts.rounds} round(s) of "
                     f"{self.opts.window:g} s windows, in one server; results saved as they complete in "
                     f"{self.state.path}")
        interrupted: BaseException | None = None
        try:
            if pending:
                server = self.launch(original, live_launch, config_path, release, ropts)
                self.measure(server, pending, len(plan))
        except BaseException as exc:  # Ctrl-C, a lost connection, a bug: hand back, put the server back, report
            interrupted = exc
        self.release()
        if interrupted is None:
            try:
                self.timings()
            except BaseException as exc:  # noqa: BLE001 - the server goes back whatever happened
                interrupted = exc
        restore = self.put_back(original, live_launch, ropts, interrupted)
        if interrupted is not None:
            hint = (f"{restore.get('message', '')}; {len(self.state.runs)} window(s) are saved: run the same command "
                    "again to resume")
            if isinstance(interrupted, KeyboardInterrupt):
                self.say(f"{self.name}: interrupted; {hint}")
                raise interrupted
            if isinstance(interrupted, EaglepatchError):
                err = EaglepatchError(f"{interrupted}; {hint}")
                err.exit_code = interrupted.exit_code
                raise err from None
            self.say(f"{self.name}: {hint}")
            raise interrupted
        if restore.get("ready"):
            self.state.add_restore(restore)
        return summary(self.name, release, self.steps, self.state, self.opts, restore, self.say)

    def launch(self, original: Any, live_launch: Any, config_path: str, release: ad.AdaptiveRelease,
               ropts: Any) -> Any:
        """The server to measure in: the running one when it already runs adaptively with the candidates (or is
        this sweep's launch, resuming), else the one launch."""
        from eaglepatch.server.restart import restart

        port = original.port
        current = self.owned.current(port)
        if live_launch is not None and (current is None or not _runs(current, live_launch, [])):
            doc = ad.config_document(release, ad.live_tiers(self.steps))
            _live(self.host, self.python, self.name, action="write", log_dir=self.log_dir,
                  names=[os.path.basename(config_path)], data=ad.dumps(doc))
            self.say(f"one launch, adaptive: --speculative-adaptive with every step count as a candidate "
                     f"({config_path}), --speculative-num-steps {max(self.steps)} (the largest: sglang builds no "
                     "state for more steps than the launch's)")
            res = restart(self.host, current=current, launch=live_launch, options=ropts,
                          progress=lambda line: self.say("  " + line), python=self.python,
                          on_started=lambda st: self.state.add_launch(st.pid, st.start, port))
            if not res.ready:
                raise RestartFailed(f"{self.name}: the adaptive launch did not come up: {res.message}"
                                    + (f"\n{res.log_tail}" if res.log_tail else ""))
            failpoint("live:after-launch")
            current = self.owned.current(port)
        if current is None:
            raise Unsupported(f"{self.name}: no sglang server runs on :{port} to sweep")
        if live_launch is None and not _runs(current, original, []):
            raise EaglepatchError(f"{self.name}: the server on :{port} no longer runs the command line this live "
                                  "sweep started from: run it with --fresh")
        return current

    def measure(self, server: Any, pending: Sequence[tuple[int, int, int]], total: int) -> None:
        """The lease, the warm-up, every rank's answer, then each pending window, saved as it ends."""
        offset, unc = clock_offset(self.host, self.python)
        # the server's own address, for what is read of the server itself (its /server_info); the load's requests go
        # to --url when given (the router in front of it: a window pins its step count in this server alone)
        with target_route(self.host, self.name, server) as own, contextlib.ExitStack() as stack:
            route = own if self.opts.bench.url is None else stack.enter_context(
                load_route(self.host, self.name, server, self.opts.bench.url))
            if self.opts.bench.url is not None:
                self.say(f"the load goes through {route.shown}")
            self._measure(server, pending, total, own, route, offset, unc)

    def _measure(self, server: Any, pending: Sequence[tuple[int, int, int]], total: int, own: Route, route: Route,
                 offset: float, unc: float) -> None:
        """``measure`` with the server's own address (``own``) and the load's (``route``) open."""
        load = self.opts.bench.load
        ladder = _ladder(self.opts)
        self.leases = [f"live-{pid}.json" for pid in sorted({server.pid, *server.children})]
        self.lease()
        warm = dataclasses.replace(load, requests=max(1, load.warmup), warmup=0)
        self.say(f"warm-up: {warm.requests} request(s), then every rank's answer to the lease")
        run_load(route.base_url, warm, api_key=server.api_key, timeout=self.opts.bench.request_timeout,
                 connect=route.connect)
        # a fact of the target server itself: read from its own address, never through --url
        limit = max_running_requests(own.base_url, server.api_key)
        if limit is not None:  # the largest batch the server runs, as sglang derived it: the curve's last
            self.state.add_timings({"point": SERVER, "rep": 0, "max_running_requests": limit})
        self.answers(server)
        failpoint("live:after-lease")
        self.warm_states(route, server)
        for n, (r, j, i) in enumerate(pending, 1):
            p, s, c = self.points[i], self.steps[i], ladder[j]
            w = lv.window_number(r, j, i, len(ladder), len(self.points))
            self.say(f"run {total - len(pending) + n}/{total}: window of point #{i} ({p.label})"
                     + (f" at {c} at a time" if len(ladder) > 1 else "") + f", round {r + 1}/{self.opts.rounds}")
            self.lease()
            # the window is widened by the host clock's uncertainty on both sides: a pause of twice that keeps
            # the last cycles of the window before out of it
            time.sleep(2 * unc + 0.05)
            base = {"point": p.key, "index": i, "rep": r, "steps": s, "t": round(time.time(), 3),
                    "pid": server.pid, "pids": sorted({server.pid, *server.children})}
            if len(ladder) > 1:
                base["concurrency"] = c
            try:
                lr = self.pinned(route, server, self.opts.window, s, w, c)
            except LoadFailed as exc:
                self.say(f"  failed: {exc}")
                self.state.add_run(dict(base, status="failed", error=str(exc)))
                if self.owned.current(server.port) is None:
                    raise
                continue
            client = lr.to_json()
            acc = client.get("accept_len")
            self.say(f"  {client['tokens_per_s']:.1f} {CLIENT}" + (f", accept length {acc:.2f}" if acc else ""))
            self.state.add_run(dict(base, status="ok", tokens_per_s=client["tokens_per_s"], accept_len=acc,
                                    phases_p50={}, client=client,
                                    window=[round(lr.start + offset - unc, 4), round(lr.end + offset + unc, 4)]))
            failpoint("live:after-window")

    def warm_states(self, route: Route, server: Any) -> None:
        """Every point's state run, pinned, before the first window: on the H200 without it a state's first window
        read 1-2.5% under its others (the launch's own state, which the warm-up ran, did not); with it the
        points' windows spread 0.3-3.1% in two runs. Not measured: these requests fall outside every window."""
        seconds = warm_seconds(self.opts.window)
        ladder = _ladder(self.opts)
        top = max(ladder)  # the largest batches: every state's kernels for them run before a window needs them
        self.say(f"warm-up of each state: {seconds:g} s of the load pinned at each step count"
                 + (f", {top} at a time" if len(ladder) > 1 else ""))
        base = self.opts.rounds * len(self.points) * len(ladder)  # window numbers past the sweep's own
        for i, s in enumerate(self.steps):
            self.lease()
            self.pinned(route, server, seconds, s, base + i, top)

    def pinned(self, route: Route, server: Any, seconds: float, steps: int, w: int, concurrency: int) -> Any:
        """``seconds`` of the load pinned at ``steps``, as window number ``w``, ``concurrency`` requests at a time:
        request ids that name the step count (``live.rid_prefix``) and prompts of its own (no window finds
        another's in the prefix cache)."""
        load = dataclasses.replace(self.opts.bench.load, concurrency=concurrency)
        return run_window(route.base_url, load, seconds, lv.rid_prefix(self.token, steps, w),
                          offset=10_000_000 * (w + 1), api_key=server.api_key, connect=route.connect,
                          timeout=self.opts.bench.request_timeout)

    def timings(self) -> None:
        """Each window's figures from the timing records, read once (for the windows that lack them)."""
        from eaglepatch import report as rep

        have = {window_key(d) for d in self.state.timings}
        todo = [r for r in self.state.runs if r.get("status") == "ok" and r.get("window") and window_key(r) not in have]
        if not todo:
            return
        wait = self.opts.bench.log_wait
        if wait > 0:  # the whole --log-wait (one wait per sweep): the early end is bench's alone for now
            self.say(f"waiting {wait:g} s for the server to write its timing records")
            time.sleep(wait)
        try:
            folder = fetch_logs_from(self.host, self.name, self.python, self.log_dir, lambda _m: None)
        except UsageError as exc:
            self.say(f"note: no timing logs: {exc}")
            return
        every = sorted(glob.glob(os.path.join(folder, "**", "*.jsonl"), recursive=True))  # a subfolder per host folder
        for r in todo:
            files = logs_of(every, set(r.get("pids") or [r["pid"]]))
            lo, hi = r["window"]
            records = list(_records(files, lo, hi))
            doc: dict[str, Any] = {"point": r["point"], "rep": r["rep"], "steps": r["steps"],
                                   "cycles": lv.count_cycles(records, r["steps"])}
            shared = traffic.split(x for x in records if x.get("mode") == "decode")["cycles"]
            if shared:  # decode cycles of the window whose batch held requests not the sweep's
                doc["shared_cycles"] = shared
            if "concurrency" in r:
                doc["concurrency"] = r["concurrency"]
            if files and records:
                one = rep.aggregate(files, t_min=lo, t_max=hi).to_json()
                per_bs_res = rep.aggregate(files, by="bs", t_min=lo, t_max=hi)
                per_bs = per_bs_res.to_json()
                fig = lv.window_figures(r.get("client") or {}, one, doc["cycles"], r["steps"])
                doc.update(phases_p50=fig["phases_p50"], accept_len_log=fig["accept_len_log"],
                           by_bs={str(k): v for k, v in lv.bs_figures(per_bs, r["steps"]).items()})
                if self.opts.emit is not None and r["steps"] == max(self.steps):
                    # the largest step count's records hold the whole acceptance profile: the model's figures
                    # for the step counts below it at each batch size (--emit-adaptive-config)
                    from eaglepatch.report.predict import predict

                    for gd, pred in zip(per_bs["groups"], predict(per_bs_res)):
                        if pred is not None:
                            gd.update(pred.to_json())
                    doc["predicted_by_bs"] = {str(k): {str(j): v for j, v in figs.items()} for k, figs in
                                              lv.bs_predictions(per_bs["groups"], r["steps"]).items()}
            self.state.add_timings(doc)
        if self.opts.emit is not None:
            pids = {p for r in self.state.runs if r.get("status") == "ok" for p in (r.get("pids") or [r.get("pid")])}
            limits = [t["max_running_requests"] for t in self.state.timings if t.get("point") == SERVER]
            self.state.add_timings({"point": CURVE, "rep": len(self.state.timings),
                                    "curve": curve_of(logs_of(every, {p for p in pids if p}),
                                                      limits[-1] if limits else None)})

    def put_back(self, original: Any, live_launch: Any, ropts: Any, interrupted: BaseException | None) -> dict:
        """Leave the original command line running (a sweep that launched nothing restarts nothing)."""
        try:
            if live_launch is None and not self.state.launched():
                return {"restarted": False, "ready": True, "argv": mask_argv(original.argv),
                        "message": "the server was not restarted: it already ran adaptively with these candidates"}
            return _restore(self.host, self.python, original, [], ropts, "the original command line", self.say,
                            self.owned)
        except BaseException as exc:  # noqa: BLE001
            if interrupted is None:
                raise
            return {"ready": False, "message": f"could not put the server back: {exc}"}


def _ladder(opts: LiveOptions) -> tuple[int, ...]:
    """The concurrencies each point is measured at: ``--concurrency``'s ladder, or the load's own alone."""
    return tuple(opts.bench.ladder) if len(opts.bench.ladder) > 1 else (opts.bench.load.concurrency,)


def _done(state: Any, ladder: Sequence[int]) -> set[tuple[str, int, int]]:
    """The (point, round, concurrency) of every window saved (a window saved without a ladder: the load's own)."""
    return {(r["point"], int(r["rep"]), int(r.get("concurrency", ladder[0]))) for r in state.runs
            if "point" in r and "rep" in r}


def warm_seconds(window: float) -> float:
    """How long each state is warmed up before the first round: a quarter of a window, at least 2 s (or the whole
    window, when shorter)."""
    return max(min(window, 2.0), window / 4)


def _records(files: Sequence[str], lo: float, hi: float) -> Any:
    """The timing records of ``files`` whose ``t`` lies in [lo, hi] (lines that do not parse are passed over)."""
    for f in files:
        with open(f, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if '"kind"' in line:
                    continue
                try:
                    d = json.loads(line)
                except ValueError:
                    continue
                t = d.get("t") if isinstance(d, dict) else None
                if isinstance(t, (int, float)) and lo <= t <= hi:
                    yield d
