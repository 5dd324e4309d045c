"""The thin command line: the commands and their options; each calls the ops and prints what they return (data to
stdout, messages to stderr: eaglepatch.cli_output). The options several commands share are declared once
(eaglepatch.cli_options).

This, with eaglepatch.cli_output, is the only place that turns errors into exit codes; nothing below it calls
``sys.exit``.
"""

from __future__ import annotations

import enum
import json
import os
import sys
from typing import Any, Callable, List, Optional

import typer

from eaglepatch.failpoints import failpoint

failpoint("startup:imports")  # the tests' Ctrl-C during start-up: typer is in, the ops are not yet

from eaglepatch import __version__
from eaglepatch.cli_options import (
    ConcurrencyOpt, CsvOpt, IgnoreEosOpt, InputLenOpt, JsonOpt, LogWaitOpt, MaxNewOpt, PromptsOpt, ReadyTimeoutOpt,
    RecipeOpt, RequestRateOpt, RequestsOpt, RestartCmdOpt, SeedOpt, SharedTrafficOpt, TemperatureOpt, TopPOpt, UnitOpt,
    WarmupOpt,
    connected,
)
from eaglepatch.cli_output import finish, for_each_target, say, terminal_text, whole_or_nothing
from eaglepatch.errors import ExitCode, UsageError
from eaglepatch.ops import change, inspection, nodes, reporting
from eaglepatch.ops.options import RuntimeOptions, load_recipe, restart_options
from eaglepatch.ops.target import Connect

EXIT_CODES = (
    "Exit codes: 0 done (or nothing to do); 1 internal error; 2 usage error (also: an install this user cannot "
    "write); 3 connection or authentication failure, host key not trusted; 4 not supported (no sglang, no "
    "recognisable worker); 5 conflict (a file changed since it was read, a lock held by another run); 6 the "
    "patched file does not compile on the host; 7 restart failed (rolled back; the message says whether that "
    "worked); 130 interrupted (Ctrl-C: one line per target says what state it is in)."
)

app = typer.Typer(
    no_args_is_help=True,
    rich_markup_mode=None,  # help texts are plain: "[user@]host[:port]" must print as written
    context_settings={"help_option_names": ["-h", "--help"]},
    help="Time the draft, verify and draft-extend phases of SGLang speculative decoding on a live server, "
    "and put every byte back afterwards. TARGET is an SSH destination ([user@]host[:port] or a Host of "
    "~/.ssh/config) or a local path (an sglang install). Docs: README.md and docs/ in the repository.",
    epilog=EXIT_CODES,
)


class Mode(str, enum.Enum):
    """--mode: the timer each worker gets."""

    auto = "auto"
    sync = "sync"
    events = "events"


class By(str, enum.Enum):
    """report --by."""

    bs = "bs"
    rank = "rank"
    host = "host"


# ----------------------------------------------------------------------------------------------------------------
# Commands


@app.command()
@connected()
def show(
    targets: List[str] = typer.Argument(..., help="SSH destinations or local paths (each node of a multi-node "
                                        "server: one document each)."),
    json_out: bool = JsonOpt,
    recipe: Optional[str] = RecipeOpt,
    *, c: Connect,
) -> None:
    """The sglang install, its worker files, entry methods with numbered source, phase call sites, patch state.

    \b
    Examples:
      eaglepatch show root@gpu-host
      eaglepatch show /opt/venv --json
    """
    r = load_recipe(recipe)
    finish(for_each_target(targets, c, lambda t: inspection.show(t, c, r), check=False), json_out,
           inspection.render_show)


@app.command()
@connected()
def diff(
    target: str = typer.Argument(..., help="SSH destination or local path."),
    mode: Mode = typer.Option(Mode.auto, "--mode", help="auto (each worker its family's timer), sync or events."),
    recipe: Optional[str] = RecipeOpt,
    *, c: Connect,
) -> None:
    """The unified diff that apply would make; changes nothing.

    \b
    Examples:
      eaglepatch diff root@gpu-host | less
      eaglepatch diff root@gpu-host --mode events
    """
    r = load_recipe(recipe)
    ropts = RuntimeOptions(mode=mode.value)
    finish(for_each_target([target], c, lambda t: inspection.diff(t, c, r, ropts, say), check=False), False,
           lambda v: v, raw=True)


@app.command()
@connected(server_port=True)
def apply(
    targets: List[str] = typer.Argument(..., help="SSH destinations or local paths."),
    mode: Mode = typer.Option(Mode.auto, "--mode", help="auto (sync without the overlap scheduler, events under "
                              "it), sync (synchronize + perf_counter) or events (CUDA events)."),
    every: int = typer.Option(1, "--every", help="Time one cycle in N."),
    log_dir: str = typer.Option("/tmp/eaglepatch", "--log-dir", help="Timing log directory on the target."),
    max_log_mb: int = typer.Option(2048, "--max-log-mb", help="The timing logs of one server launch (all ranks) "
                                   "stop growing at N MB: each rank rotates its file and removes its own oldest."),
    min_free_mb: int = typer.Option(1024, "--min-free-mb", help="Stop writing timing logs while their filesystem "
                                    "has less than M MB free (the records dropped are counted)."),
    recipe: Optional[str] = RecipeOpt,
    no_restart: bool = typer.Option(False, "--no-restart", help="Patch only; do not restart the server."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan and the diff; change nothing."),
    json_out: bool = JsonOpt,
    restart_cmd: Optional[str] = RestartCmdOpt, systemd_unit: Optional[str] = UnitOpt,
    timeout: float = ReadyTimeoutOpt,
    *, c: Connect,
) -> None:
    """Instrument every supported worker file, back up the originals, restart the server, wait until ready.

    \b
    Examples:
      eaglepatch apply root@gpu-host
      eaglepatch apply root@gpu-host --server-port 30000 --timeout 1800
      eaglepatch apply root@gpu-host --no-restart --dry-run
    """
    r = load_recipe(recipe)
    ropts = RuntimeOptions(mode=mode.value, every=every, log_dir=log_dir, max_log_mb=max_log_mb,
                           min_free_mb=min_free_mb)
    restart = None if no_restart else restart_options(restart_cmd, systemd_unit, timeout)
    meeting = nodes.Meeting(targets)
    outcomes = for_each_target(targets, c, lambda t: change.apply(t, c, r, ropts, restart, dry_run, say, meeting),
                               after=meeting.leave)
    finish(outcomes, json_out, change.render_change, raw=dry_run)


@app.command()
@connected(server_port=True)
def revert(
    targets: List[str] = typer.Argument(..., help="SSH destinations or local paths."),
    force: bool = typer.Option(False, "--force", help="Revert a drifted file: keep a copy, remove our lines."),
    no_restart: bool = typer.Option(False, "--no-restart", help="Put the files back only; do not restart."),
    json_out: bool = JsonOpt,
    restart_cmd: Optional[str] = RestartCmdOpt, systemd_unit: Optional[str] = UnitOpt,
    timeout: float = ReadyTimeoutOpt,
    *, c: Connect,
) -> None:
    """Put back the original bytes, remove what apply added, restart.

    \b
    Examples:
      eaglepatch revert root@gpu-host
      eaglepatch revert root@gpu-host --force
    """
    r = load_recipe(None)
    restart = None if no_restart else restart_options(restart_cmd, systemd_unit, timeout)
    meeting = nodes.Meeting(targets)
    outcomes = for_each_target(targets, c, lambda t: change.revert(t, c, r, force, restart, say, meeting),
                               after=meeting.leave)
    finish(outcomes, json_out, change.render_change)


@app.command()
@connected()
def status(
    targets: List[str] = typer.Argument(..., help="SSH destinations or local paths."),
    json_out: bool = JsonOpt,
    *, c: Connect,
) -> None:
    """Patch state per file (pristine, patched, drifted) and the server process.

    \b
    Examples:
      eaglepatch status root@gpu-host
      eaglepatch status gpu1 gpu2 --json
    """
    r = load_recipe(None)
    finish(for_each_target(targets, c, lambda t: inspection.status(t, c, r)), json_out, inspection.render_status)


@app.command()
@connected(server_port=True)
def restart(
    targets: List[str] = typer.Argument(..., help="SSH destinations or local paths."),
    restart_cmd: Optional[str] = RestartCmdOpt, systemd_unit: Optional[str] = UnitOpt,
    timeout: float = ReadyTimeoutOpt,
    json_out: bool = JsonOpt,
    *, c: Connect,
) -> None:
    """Restart the server and wait until it is ready.

    \b
    Examples:
      eaglepatch restart root@gpu-host
      eaglepatch restart root@gpu-host --systemd-unit sglang
    """
    ropts = restart_options(restart_cmd, systemd_unit, timeout)
    meeting = nodes.Meeting(targets)
    outcomes = for_each_target(targets, c, lambda t: change.restart_target(t, c, ropts, say, meeting),
                               after=meeting.leave)
    finish(outcomes, json_out, change.render_restart)


@app.command()
@connected()
def report(
    sources: List[str] = typer.Argument(..., help="Timing logs: local files or folders, or TARGETs to fetch from."),
    json_out: bool = JsonOpt,
    csv_out: bool = CsvOpt,
    by: Optional[By] = typer.Option(None, "--by", help="Group by batch size, rank or host."),
    skip: int = typer.Option(0, "--skip", help="Drop the first N cycles of each process (warm-up); a record of apply --every M counts as M cycles."),
    trace: Optional[str] = typer.Option(None, "--trace", help="Write a Chrome trace (Perfetto) to FILE."),
    compare: bool = typer.Option(False, "--compare", help="Two or more sources side by side, with deltas."),
    chart: Optional[str] = typer.Option(None, "--chart", help="With --compare: a chart of the phases side by side; "
                                        "with --predict: predicted records' wall tok/s by step count beside the "
                                        "acceptance profile; to FILE: .svg, or .png with the plot extra."),
    predict: bool = typer.Option(False, "--predict", help="Predict accept length, cycle time and records' wall "
                                 "tok/s (the records' tokens over cycle plus between time) for other draft step "
                                 "counts (and none) from these records."),
    steps: Optional[str] = typer.Option(None, "--steps", help="With --predict: the step counts, e.g. 0,1,2,3,5 or "
                                        "0-8 (default: 0 and 1..max(8, steps+2))."),
    log_dir: Optional[str] = typer.Option(None, "--log-dir", help="Log directory on a TARGET (default: from its manifest)."),
    merge_runs: bool = typer.Option(False, "--merge-runs", help="All runs together (their figures blend)."),
    run: List[str] = typer.Option([], "--run", help="Only this run (its id, or a prefix of it; repeatable)."),
    since: Optional[str] = typer.Option(None, "--since", help="Only runs started since TIME: an epoch, "
                                        "'2026-12-01 15:40', or an age: 30m, 2h, 1d."),
    all_runs: bool = typer.Option(False, "--all-runs", help="Every run, each apart (a TARGET's default: the runs "
                                  "of the servers that run now)."),
    *, c: Connect,
) -> None:
    """Aggregate timing logs: per-phase mean and percentiles, share of the cycle, accept length, in-cycle and
    records' wall tok/s.

    \b
    Examples:
      eaglepatch report root@gpu-host
      eaglepatch report ./logs --all-runs --by rank
      eaglepatch report --compare before/ after/ --chart phases.svg
      eaglepatch report root@gpu-host --predict --chart predict.svg
    """
    if json_out and csv_out:
        raise UsageError("--json and --csv exclude each other: give one")
    if skip < 0:
        raise UsageError("--skip must be 0 or more")
    if compare and len(sources) < 2:
        raise UsageError("--compare needs two or more sources")
    if predict and (compare or csv_out):
        raise UsageError("--predict prints a table or --json, of one report: leave out --compare and --csv")
    if steps is not None and not predict:
        raise UsageError("--steps goes with --predict")
    step_list = None
    if steps is not None:
        from eaglepatch.report.predict import parse_steps

        step_list = parse_steps(steps)
    if chart is not None:
        if not compare and not predict:
            raise UsageError("--chart goes with --compare or --predict (a sweep draws its own: eaglepatch sweep "
                             "--chart)")
        from eaglepatch.report.chart.draw import check_chart_path

        check_chart_path(chart)
    runs = reporting.RunSelection(merge=merge_runs, ids=tuple(run), all=all_runs,
                                  since=None if since is None else reporting.parse_since(since))
    sweep_of = None
    if predict:  # a TARGET's sweep kept here, with a baseline that ran: the measured no-speculation point
        from eaglepatch.tuning.saved import sweep_with_baseline as sweep_of

    def text(write: Callable[[str], Any] | None = None) -> str:
        return reporting.report(sources, c, by=None if by is None else by.value, skip=skip, trace=trace,
                                compare=compare, log_dir=log_dir, fmt="json" if json_out else "csv" if csv_out
                                else "table", say=say, runs=runs, chart=chart, predict=predict, steps=step_list,
                                sweep_of=sweep_of, write=write)

    if json_out:  # written as made, to stdout only once whole: an error part-way leaves stdout empty
        with whole_or_nothing() as write:
            write(text(write))
        return
    sys.stdout.write(terminal_text(text()))


# bench's and sweep's --url: where the load goes instead of the server's own port
URL_HELP = ("Send the load to URL (http or https://HOST[:PORT][/PREFIX]): the router or load balancer in front of "
            "the server (required for one side of a prefill/decode pair). Over SSH, URL's host is reached from the "
            "target host, through a forwarded port (localhost is the target host); for a local target, from here. "
            "The server's own facts are still read from the server.")


def _bench_options(requests: int | None, concurrency: str, input_len: int, max_new_tokens: int, warmup: int | None,
                   seed: int, log_wait: float, request_rate: str | None = None, prompts: str = "mixed",
                   temperature: float = 0.0, top_p: float = 1.0, ignore_eos: bool | None = None,
                   url: str | None = None) -> Any:
    """bench's and sweep's load; ``requests`` None: bench's, sized by duration (at least RequestsOpt's default).
    Raises UsageError (a bad --prompts file too: it is read here, before the target is touched; a bad --url
    likewise)."""
    from eaglepatch.tuning.load import LoadSpec
    from eaglepatch.tuning.bench import BenchOptions, parse_concurrency, parse_request_rate
    from eaglepatch.tuning.target_url import parse_url

    ladder = parse_concurrency(concurrency)
    rates = parse_request_rate(request_rate) if request_rate is not None else ()
    load = LoadSpec(requests=RequestsOpt.default if requests is None else requests, concurrency=ladder[0],
                    input_len=input_len, max_new_tokens=max_new_tokens,
                    warmup=WarmupOpt.default if warmup is None else warmup, seed=seed,
                    request_rate=rates[0] if rates else None, prompt_source=prompts, temperature=temperature,
                    top_p=top_p, ignore_eos=ignore_eos)
    return BenchOptions(load=load, log_wait=log_wait, ladder=ladder if len(ladder) > 1 else (),
                        rates=rates if len(rates) > 1 else (), auto_warmup=warmup is None,
                        url=parse_url(url) if url is not None else None, sized=requests is None)


@app.command()
@connected(server_port=True)
def bench(
    target: str = typer.Argument(..., help="SSH destination or local path."),
    requests: Optional[int] = typer.Option(None, "--requests", help="Measured requests, exactly N (default: sized "
                                           "by duration: as many as run 10 s or more, at least 32)."),
    concurrency: str = ConcurrencyOpt, input_len: int = InputLenOpt,
    max_new_tokens: int = MaxNewOpt,
    warmup: Optional[int] = typer.Option(None, "--warmup", help="Unmeasured requests first (default 4; 32 on a "
                                         "server younger than 5 minutes, whose first requests run slower)."),
    seed: int = SeedOpt, log_wait: float = LogWaitOpt,
    request_rate: Optional[str] = RequestRateOpt,
    prompts: str = PromptsOpt, temperature: float = TemperatureOpt, top_p: float = TopPOpt,
    ignore_eos: Optional[bool] = IgnoreEosOpt,
    url: Optional[str] = typer.Option(None, "--url", metavar="URL", help=URL_HELP),
    json_out: bool = JsonOpt,
    *, c: Connect,
) -> None:
    """A fixed, seeded load on the running server (through the SSH connection): client tok/s, TTFT, time per output
    token, inter-token latency, latency, accept length, and the timing report of the same window.

    \b
    Examples:
      eaglepatch bench root@gpu-host --requests 64 --concurrency 8
      eaglepatch bench root@gpu-host --requests 256 --concurrency 1,8,32,64
      eaglepatch bench root@gpu-host --requests 256 --request-rate 2,8,32 --concurrency 64
      eaglepatch bench root@gpu-host --prompts my-traffic.jsonl --temperature 0.7 --top-p 0.9
      eaglepatch bench root@decode-host --url http://router-host:8000
    """
    from eaglepatch.tuning import bench as tuning_bench

    opts = _bench_options(requests, concurrency, input_len, max_new_tokens, warmup, seed, log_wait, request_rate,
                          prompts, temperature, top_p, ignore_eos, url)
    finish(for_each_target([target], c, lambda t: tuning_bench.bench(t, c, opts, say)), json_out,
           tuning_bench.render_bench)


@app.command()
@connected(server_port=True)
def sweep(
    targets: List[str] = typer.Argument(..., help="SSH destination or local path (several: every node of one "
                                        "multi-node server, restarted together per point)."),
    grid: List[str] = typer.Option([], "--grid", help="FLAG=v1,v2: a launch flag and its values (repeatable)."),
    env: List[str] = typer.Option([], "--env", help="NAME=a,b: an environment variable of the server and its "
                                  "values (repeatable)."),
    baseline: bool = typer.Option(False, "--baseline", help="Add the server without any --speculative-* flag."),
    repeat: int = typer.Option(1, "--repeat", help="Launches per point, in shuffled order."),
    keep_best: bool = typer.Option(False, "--keep-best", help="Leave the best point's server running."),
    allow_flag: List[str] = typer.Option([], "--allow-flag", help="Accept this launch flag in --grid too."),
    fresh: bool = typer.Option(False, "--fresh", help="Forget the saved runs of this sweep and start over."),
    json_out: bool = JsonOpt,
    csv_out: bool = CsvOpt,
    chart: Optional[str] = typer.Option(None, "--chart", help="Write a chart to FILE: .svg, or .png with the plot extra "
                                         "(pip install 'eaglepatch[plot]')."),
    timeout: float = typer.Option(900.0, "--timeout", help="Seconds for each launch to be ready."),
    live: bool = typer.Option(False, "--live", help="Measure every step count inside one running server through "
                              "sglang's adaptive runtime states (at most one restart, to start it adaptive), in "
                              "interleaved windows; --grid speculative-num-steps=... only."),
    rounds: Optional[int] = typer.Option(None, "--rounds", help="With --live: rounds of windows, each point once "
                                         "per round in shuffled order (default 3)."),
    window: Optional[float] = typer.Option(None, "--window", help="With --live: seconds of load per window "
                                           "(default 20)."),
    emit_adaptive_config: Optional[str] = typer.Option(None, "--emit-adaptive-config", help="With --live: write "
                                                       "the candidate steps per batch-size tier to FILE, in the JSON "
                                                       "the target's --speculative-adaptive-config reads."),
    requests: int = RequestsOpt, concurrency: str = ConcurrencyOpt, input_len: int = InputLenOpt,
    max_new_tokens: int = MaxNewOpt,
    warmup: Optional[int] = typer.Option(None, "--warmup", help="Unmeasured requests first: after each launch "
                                         "(default 32: a fresh server's first requests run slower); with --live, "
                                         "before the windows (default 4)."),
    seed: int = SeedOpt, log_wait: float = LogWaitOpt,
    request_rate: Optional[str] = RequestRateOpt,
    prompts: str = PromptsOpt, temperature: float = TemperatureOpt, top_p: float = TopPOpt,
    ignore_eos: Optional[bool] = IgnoreEosOpt,
    objective: str = typer.Option("throughput", "--objective", help="What best means: throughput (the most client "
                                  "tok/s) or latency (the least time per output token, p50)."),
    max_tpot_ms: Optional[float] = typer.Option(None, "--max-tpot-ms", help="A point whose p90 time per output "
                                                "token exceeds MS is never best."),
    url: Optional[str] = typer.Option(None, "--url", metavar="URL", help=URL_HELP),
    allow_shared_traffic: bool = SharedTrafficOpt,
    *, c: Connect,
) -> None:
    """Restart the server once per point of a grid of launch flags, bench each, one table with the speedup over
    the baseline; resumable; puts the server back at the end. With --live: every step count inside one server.

    \b
    Examples:
      eaglepatch sweep root@gpu-host --grid speculative-num-steps=1,2,3,5 --baseline --repeat 3 --chart s.svg
      eaglepatch sweep root@gpu-host --env NCCL_PROTO=LL,Simple --grid disable-custom-all-reduce=on,off
      eaglepatch sweep root@gpu-host --live --grid speculative-num-steps=0,1,3,7 --emit-adaptive-config a.json
    """
    from eaglepatch.tuning import sweep_summary as sw
    from eaglepatch.tuning import drive as tuning

    if json_out and csv_out:
        raise UsageError("--json and --csv exclude each other: give one")
    if warmup is None:
        from eaglepatch.tuning.load import LAUNCH_WARMUP

        warmup = WarmupOpt.default if live else LAUNCH_WARMUP
    bench_opts = _bench_options(requests, concurrency, input_len, max_new_tokens, warmup, seed, log_wait,
                                request_rate, prompts, temperature, top_p, ignore_eos, url)
    goal = sw.Objective(objective, max_tpot_ms)  # bad input: exit 2 before the target is touched
    if live and len(targets) > 1:
        raise UsageError("sweep --live takes one TARGET: it does not yet run across the nodes of a multi-node "
                         "server; sweep without --live (every node restarted together per point)")
    if live:
        from eaglepatch.tuning import drive_live

        if request_rate is not None:
            raise UsageError("--request-rate does not go with --live (its windows are closed loops, each slot sending "
                             "its next request as its last ends, for --window seconds): sweep without --live for an "
                             "open loop")
        for flag, given in (("--baseline", baseline), ("--keep-best", keep_best), ("--env", bool(env)),
                            ("--repeat", repeat != 1), ("--allow-flag", bool(allow_flag))):
            if given:
                raise UsageError(f"{flag} does not go with --live (its points are step counts inside one "
                                 "server; --rounds repeats them): sweep without --live for it")
        opts: Any = drive_live.LiveOptions(
            grid=tuple(grid), rounds=3 if rounds is None else rounds, window=20.0 if window is None else window,
            emit=emit_adaptive_config, fresh=fresh, timeout=timeout, bench=bench_opts, objective=goal,
            allow_shared_traffic=allow_shared_traffic)
        opts.steps()  # bad input: exit 2 before the target is touched
        run: Callable[[Any], Any] = lambda t: drive_live.live_sweep(t, c, opts, say)
    else:
        for flag, given in (("--rounds", rounds is not None), ("--window", window is not None),
                            ("--emit-adaptive-config", emit_adaptive_config is not None)):
            if given:
                raise UsageError(f"{flag} goes with --live")
        opts = tuning.SweepOptions(
            grid=tuple(grid), env=tuple(env), allow=tuple(allow_flag), baseline=baseline, repeat=repeat,
            keep_best=keep_best, fresh=fresh, timeout=timeout, bench=bench_opts, objective=goal,
            allow_shared_traffic=allow_shared_traffic)
        opts.points()  # bad input: exit 2 before the target is touched
        run = lambda t: tuning.sweep(t, c, opts, say)  # noqa: E731
        if len(targets) > 1:  # the nodes of one multi-node server
            from eaglepatch.ops.target import check_targets
            from eaglepatch.tuning import drive_nodes

            specs = check_targets(targets, c)  # a bad TARGET: exit 2 before any is touched
            run = lambda _t: drive_nodes.sweep_nodes(specs, c, opts, say)  # noqa: E731
    if chart is not None:
        from eaglepatch.report.chart.draw import check_chart_path

        check_chart_path(chart)  # folder, .svg/.png, matplotlib for .png: exit 2 before the sweep runs
    target = targets[0] if len(targets) == 1 else " + ".join(targets)
    [outcome] = for_each_target(targets[:1], c, run)
    if outcome.error is not None:
        finish([outcome], json_out, None)
    doc = outcome.value
    if chart is not None:
        from eaglepatch.tuning.sweep_chart import write_chart

        write_chart(doc, chart)
        say(f"chart written to {chart}")
    if csv_out:
        text = sw.render_csv(doc)
    elif json_out:
        text = json.dumps(doc, indent=1) + "\n"
    else:
        text = terminal_text(sw.render_table(doc)) + "\n"
    sys.stdout.write(text)
    sys.stdout.flush()
    restore = doc.get("restore") or {}
    if not restore.get("ready", True):
        # the results stand; the server is not back as it was: say so, exit 7
        say(f"eaglepatch: {target}: {restore.get('message')}")
        if restore.get("log_tail"):
            say(restore["log_tail"])
        raise typer.Exit(int(ExitCode.RESTART))
    raise typer.Exit(0)


@app.command()
@connected(server_port=True)
def doctor(
    targets: List[str] = typer.Argument(..., help="SSH destinations or local paths (each node of a multi-node "
                                        "server: its own findings from its own records)."),
    json_out: bool = JsonOpt,
    log_dir: Optional[str] = typer.Option(None, "--log-dir", help="Timing log directory on the target "
                                          "(default: from its manifest)."),
    *, c: Connect,
) -> None:
    """Name what makes speculative decoding slow on the running server, with the evidence and the next step;
    reads only (docs/doctor.md).

    \b
    Examples:
      eaglepatch doctor root@gpu-host
      eaglepatch doctor root@gpu-host --json
    """
    from eaglepatch.doctor.collect import doctor as run_doctor
    from eaglepatch.doctor.render import render

    finish(for_each_target(targets, c, lambda t: run_doctor(t, c, say, log_dir=log_dir)), json_out, render,
           flat=True)


def version_callback(value: bool) -> None:
    if value:
        print(f"eaglepatch {__version__}")
        raise typer.Exit(0)


@app.callback()
def _main(
    version: bool = typer.Option(False, "--version", callback=version_callback, is_eager=True,
                                 help="Print the version and exit."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="Only warnings and errors on stderr (data still goes "
                               "to stdout)."),
    verbose: bool = typer.Option(False, "-v", "--verbose", help="More on stderr: tracebacks of internal errors, "
                                 "the SSH library's own log."),
) -> None:
    if quiet and verbose:
        raise typer.BadParameter("-q and -v exclude each other")
    say.quiet = quiet
    if verbose:
        os.environ["EAGLEPATCH_DEBUG"] = "1"


def run_app() -> None:
    """The Typer app (``eaglepatch.entry.main`` runs it, with Ctrl-C handled). Usage errors from Click exit 2, as
    docs/contract.md says."""
    app(standalone_mode=True)
