"""The thin command line: parse options, call the ops, print data to stdout and messages to stderr.

This is the only place that turns errors into exit codes (``_exit_code``); nothing below it calls ``sys.exit``.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import sys
import time
import traceback
from typing import Any, Callable, List, Optional

import typer

from eaglepatch.failpoints import failpoint

failpoint("startup:imports")  # the tests' Ctrl-C during start-up: typer is in, the ops are not yet

from eaglepatch import __version__
from eaglepatch import console, progress
from eaglepatch.errors import EaglepatchError, ExitCode, Interrupted, UsageError
from eaglepatch.ops import actions
from eaglepatch.ops.core import FactsOptions, RuntimeOptions
from eaglepatch.redact import shown

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


class _Out:
    """Where messages go (stderr): ``--quiet`` keeps only warnings and errors; on a terminal, the progress lines
    of a restart ("waiting for sglang ...") and a sweep ("run k/N ...") share one live status line (rich), elsewhere
    they are plain lines."""

    # without a terminal, a restart's "waiting for sglang" lines (one per poll) at most this often
    PLAIN_EVERY_S = 15.0

    def __init__(self) -> None:
        self.quiet = False
        self.status: Any = None
        self.head = ""
        self.last_wait = 0.0

    def live(self) -> bool:
        return not self.quiet and sys.stderr.isatty() and not os.environ.get("EAGLEPATCH_PLAIN")

    def __call__(self, msg: str) -> None:
        # host-supplied text reaches the terminal with its control characters escaped (the lines stay lines)
        msg = terminal_text(msg)
        text = msg.strip()
        transient = text.startswith(("waiting for sglang on", "run ")) or text.startswith("waiting up to")
        if self.quiet and not text.startswith(("note:", "warning:", "eaglepatch:")):
            return
        if transient and self.live():
            if text.startswith("run "):
                self.head = text
            line = f"{self.head}  {text}" if self.head and not text.startswith("run ") else text
            if self.status is None:
                from rich.console import Console

                self.status = Console(stderr=True).status(line[:200])
                self.status.start()
            else:
                self.status.update(line[:200])
            return
        if text.startswith("waiting for sglang on"):
            now = time.monotonic()
            if now - self.last_wait < self.PLAIN_EVERY_S:
                return
            self.last_wait = now
        self.stop()
        console.line(msg)

    def stop(self) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None


def terminal_text(text: str) -> str:
    """What eaglepatch writes for people (messages, tables): every control character escaped but the newlines
    and tabs that lay it out (eaglepatch.redact.shown); the fields that come from a host are escaped whole where
    they are rendered, so that a newline in one cannot forge a line."""
    return shown(text, keep="\n\t")


say = _Out()


# ----------------------------------------------------------------------------------------------------------------
# Messages and exit codes


def _exit_code(exc: BaseException) -> ExitCode:
    if isinstance(exc, EaglepatchError):
        return exc.exit_code
    if isinstance(exc, (typer.BadParameter, typer.Abort)):
        return ExitCode.USAGE
    return ExitCode.INTERNAL


def _message(exc: BaseException) -> str:
    if isinstance(exc, EaglepatchError):
        return str(exc)
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    if os.environ.get("EAGLEPATCH_DEBUG"):
        traceback.print_exception(type(exc), exc, exc.__traceback__)
    first = str(exc).strip().splitlines()
    return f"internal error: {type(exc).__name__}: {first[0] if first else ''} (EAGLEPATCH_DEBUG=1 shows more)"


@dataclasses.dataclass
class Outcome:
    target: str
    value: Any = None
    error: BaseException | None = None

    @property
    def code(self) -> ExitCode:
        return ExitCode.OK if self.error is None else _exit_code(self.error)


def for_each_target(targets: List[str], fn: Callable[[str], Any]) -> list[Outcome]:
    """Run ``fn`` per target, concurrently when several; one Outcome each, in the order given."""

    for t in targets:  # every target has a state from the start: Ctrl-C may come before its thread runs
        progress.stage(t, progress.NOTHING_CHANGED)

    def one(t: str) -> Outcome:
        try:
            return Outcome(t, fn(t))
        except BaseException as exc:  # noqa: BLE001 - every error becomes an outcome with its exit code
            if isinstance(exc, (SystemExit, Interrupted)):
                raise  # Ctrl-C: eaglepatch.entry says what each target looks like and exits 130
            return Outcome(t, error=exc)

    if len(targets) == 1:
        return [one(targets[0])]
    import concurrent.futures  # here: its import (logging with it) costs every command 9 ms, and one target needs none

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=min(16, len(targets)))
    try:
        outcomes = list(pool.map(one, targets))
    except BaseException:
        # Ctrl-C: the other targets are not waited for (each is left as a killed client leaves it; the host
        # finishes what it was asked): no shutdown(wait=True) here
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    return outcomes


def finish(outcomes: list[Outcome], emit_json: bool, render: Callable[[Any], str] | None, raw: bool = False) -> None:
    """Print each outcome (data to stdout, errors to stderr) and exit with the worst code. ``raw``: the rendered
    text is data to pass on byte for byte (a diff for patch(1)), not text for a terminal."""
    say.stop()
    values = []
    for o in outcomes:
        if o.error is not None:
            prefix = f"{o.target}: " if len(outcomes) > 1 or not str(o.error).startswith(o.target) else ""
            say(f"eaglepatch: {prefix}{_message(o.error)}")
            if emit_json:
                values.append({"target": o.target, "error": _message(o.error), "exit_code": int(o.code)})
            continue
        if emit_json:
            values.append(o.value)
        elif render is not None:
            text = render(o.value)
            if text and not raw:
                text = terminal_text(text)
            if text:
                sys.stdout.write(text if text.endswith("\n") else text + "\n")
    if emit_json:
        doc = values[0] if len(values) == 1 and len(outcomes) == 1 else values
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
    sys.stdout.flush()
    raise typer.Exit(max((int(o.code) for o in outcomes), default=0))


# ----------------------------------------------------------------------------------------------------------------
# Shared options

JsonOpt = typer.Option(False, "--json", help="JSON on stdout (the shapes of docs/contract.md).")
CsvOpt = typer.Option(False, "--csv", help="CSV on stdout.")
IdentityOpt = typer.Option(None, "-i", "--identity", help="SSH private key file.")
PortOpt = typer.Option(None, "-p", "--port", help="SSH port.")
JumpOpt = typer.Option(None, "-J", "--jump", help="ProxyJump host: [user@]host[:port].")
PythonOpt = typer.Option(None, "--python", help="The remote interpreter (default: the server's, else python3).")
SglangPathOpt = typer.Option(None, "--sglang-path", help="The sglang package directory (skips discovery).")
TimeoutOpt = typer.Option(None, "--connect-timeout",
                          help="SSH connect timeout, seconds (default: ConnectTimeout of the SSH config, else 10).")
AcceptOpt = typer.Option(False, "--accept-new-host-key", help="Accept and save an unknown host key.")
RecipeOpt = typer.Option(None, "--recipe", help="A recipe file replacing the built-in one (see patches/README.md).")
RestartCmdOpt = typer.Option(None, "--restart-cmd", help="Restart with this shell command on the target.")
UnitOpt = typer.Option(None, "--systemd-unit", help="Restart with systemctl restart NAME.")
ReadyTimeoutOpt = typer.Option(900.0, "--timeout", help="Seconds to wait for the server to be ready.")
ServerPortOpt = typer.Option([], "--server-port", help="Act only on the install's server on this port "
                             "(repeatable); default: all of its servers.")


def conn(identity, port, jump, python, sglang_path, connect_timeout, accept,
         server_ports: List[int] | None = None) -> actions.Connect:
    for p in server_ports or ():
        if not 0 < p < 65536:
            raise UsageError(f"--server-port {p}: not a TCP port number")
    return actions.Connect(identity=identity, port=port, jump=jump, connect_timeout=connect_timeout,
                           accept_new_host_key=accept,
                           facts=FactsOptions(python=python, sglang_path=sglang_path,
                                              server_ports=tuple(server_ports or ())))


def _guard(fn: Callable[[], None]) -> None:
    """Errors raised before any target is touched (bad options): one line, their exit code."""
    try:
        fn()
    except (typer.Exit, Interrupted):
        raise
    except BaseException as exc:  # noqa: BLE001
        say(f"eaglepatch: {_message(exc)}")
        raise typer.Exit(int(_exit_code(exc)))


# ----------------------------------------------------------------------------------------------------------------
# Commands


@app.command()
def show(
    target: str = typer.Argument(..., help="SSH destination or local path."),
    json_out: bool = JsonOpt,
    recipe: Optional[str] = RecipeOpt,
    identity: Optional[str] = IdentityOpt, port: Optional[int] = PortOpt, jump: Optional[str] = JumpOpt,
    python: Optional[str] = PythonOpt, sglang_path: Optional[str] = SglangPathOpt,
    connect_timeout: Optional[float] = TimeoutOpt, accept_new_host_key: bool = AcceptOpt,
) -> None:
    """The sglang install, its worker files, entry methods with numbered source, phase call sites, patch state.

    \b
    Examples:
      eaglepatch show root@gpu-host
      eaglepatch show /opt/venv --json
    """
    def go() -> None:
        c = conn(identity, port, jump, python, sglang_path, connect_timeout, accept_new_host_key)
        r = actions.load_recipe(recipe)
        finish(for_each_target([target], lambda t: actions.show(t, c, r)), json_out, actions.render_show)
    _guard(go)


@app.command()
def diff(
    target: str = typer.Argument(..., help="SSH destination or local path."),
    mode: Mode = typer.Option(Mode.auto, "--mode", help="auto (each worker its family's timer), sync or events."),
    recipe: Optional[str] = RecipeOpt,
    identity: Optional[str] = IdentityOpt, port: Optional[int] = PortOpt, jump: Optional[str] = JumpOpt,
    python: Optional[str] = PythonOpt, sglang_path: Optional[str] = SglangPathOpt,
    connect_timeout: Optional[float] = TimeoutOpt, accept_new_host_key: bool = AcceptOpt,
) -> None:
    """The unified diff that apply would make; changes nothing.

    \b
    Examples:
      eaglepatch diff root@gpu-host | less
      eaglepatch diff root@gpu-host --mode events
    """
    def go() -> None:
        c = conn(identity, port, jump, python, sglang_path, connect_timeout, accept_new_host_key)
        r = actions.load_recipe(recipe)
        ropts = RuntimeOptions(mode=mode.value)
        finish(for_each_target([target], lambda t: actions.diff(t, c, r, ropts, say)), False, lambda v: v, raw=True)
    _guard(go)


@app.command()
def apply(
    targets: List[str] = typer.Argument(..., help="SSH destinations or local paths."),
    mode: Mode = typer.Option(Mode.auto, "--mode", help="auto (sync without the overlap scheduler, events under "
                              "it), sync (synchronize + perf_counter) or events (CUDA events)."),
    every: int = typer.Option(1, "--every", help="Time one cycle in N."),
    log_dir: str = typer.Option("/tmp/eaglepatch", "--log-dir", help="Timing log directory on the target."),
    recipe: Optional[str] = RecipeOpt,
    no_restart: bool = typer.Option(False, "--no-restart", help="Patch only; do not restart the server."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan and the diff; change nothing."),
    json_out: bool = JsonOpt,
    restart_cmd: Optional[str] = RestartCmdOpt, systemd_unit: Optional[str] = UnitOpt,
    timeout: float = ReadyTimeoutOpt,
    server_port: List[int] = ServerPortOpt,
    identity: Optional[str] = IdentityOpt, port: Optional[int] = PortOpt, jump: Optional[str] = JumpOpt,
    python: Optional[str] = PythonOpt, sglang_path: Optional[str] = SglangPathOpt,
    connect_timeout: Optional[float] = TimeoutOpt, accept_new_host_key: bool = AcceptOpt,
) -> None:
    """Instrument every supported worker file, back up the originals, restart the server, wait until ready.

    \b
    Examples:
      eaglepatch apply root@gpu-host
      eaglepatch apply root@gpu-host --server-port 30000 --timeout 1800
      eaglepatch apply root@gpu-host --no-restart --dry-run
    """
    def go() -> None:
        c = conn(identity, port, jump, python, sglang_path, connect_timeout, accept_new_host_key, server_port)
        r = actions.load_recipe(recipe)
        ropts = RuntimeOptions(mode=mode.value, every=every, log_dir=log_dir)
        restart = None if no_restart else actions.restart_options(restart_cmd, systemd_unit, timeout)
        actions.check_targets(targets, c)
        outcomes = for_each_target(targets, lambda t: actions.apply(t, c, r, ropts, restart, dry_run, say))
        finish(outcomes, json_out, actions.render_change, raw=dry_run)
    _guard(go)


@app.command()
def revert(
    targets: List[str] = typer.Argument(..., help="SSH destinations or local paths."),
    force: bool = typer.Option(False, "--force", help="Revert a drifted file: keep a copy, remove our lines."),
    no_restart: bool = typer.Option(False, "--no-restart", help="Put the files back only; do not restart."),
    json_out: bool = JsonOpt,
    restart_cmd: Optional[str] = RestartCmdOpt, systemd_unit: Optional[str] = UnitOpt,
    timeout: float = ReadyTimeoutOpt,
    server_port: List[int] = ServerPortOpt,
    identity: Optional[str] = IdentityOpt, port: Optional[int] = PortOpt, jump: Optional[str] = JumpOpt,
    python: Optional[str] = PythonOpt, sglang_path: Optional[str] = SglangPathOpt,
    connect_timeout: Optional[float] = TimeoutOpt, accept_new_host_key: bool = AcceptOpt,
) -> None:
    """Put back the original bytes, remove what apply added, restart.

    \b
    Examples:
      eaglepatch revert root@gpu-host
      eaglepatch revert root@gpu-host --force
    """
    def go() -> None:
        c = conn(identity, port, jump, python, sglang_path, connect_timeout, accept_new_host_key, server_port)
        r = actions.load_recipe(None)
        restart = None if no_restart else actions.restart_options(restart_cmd, systemd_unit, timeout)
        actions.check_targets(targets, c)
        outcomes = for_each_target(targets, lambda t: actions.revert(t, c, r, force, restart, say))
        finish(outcomes, json_out, actions.render_change)
    _guard(go)


@app.command()
def status(
    targets: List[str] = typer.Argument(..., help="SSH destinations or local paths."),
    json_out: bool = JsonOpt,
    identity: Optional[str] = IdentityOpt, port: Optional[int] = PortOpt, jump: Optional[str] = JumpOpt,
    python: Optional[str] = PythonOpt, sglang_path: Optional[str] = SglangPathOpt,
    connect_timeout: Optional[float] = TimeoutOpt, accept_new_host_key: bool = AcceptOpt,
) -> None:
    """Patch state per file (pristine, patched, drifted) and the server process.

    \b
    Examples:
      eaglepatch status root@gpu-host
      eaglepatch status gpu1 gpu2 --json
    """
    def go() -> None:
        c = conn(identity, port, jump, python, sglang_path, connect_timeout, accept_new_host_key)
        r = actions.load_recipe(None)
        actions.check_targets(targets, c)
        finish(for_each_target(targets, lambda t: actions.status(t, c, r)), json_out, actions.render_status)
    _guard(go)


@app.command()
def restart(
    targets: List[str] = typer.Argument(..., help="SSH destinations or local paths."),
    restart_cmd: Optional[str] = RestartCmdOpt, systemd_unit: Optional[str] = UnitOpt,
    timeout: float = ReadyTimeoutOpt,
    json_out: bool = JsonOpt,
    server_port: List[int] = ServerPortOpt,
    identity: Optional[str] = IdentityOpt, port: Optional[int] = PortOpt, jump: Optional[str] = JumpOpt,
    python: Optional[str] = PythonOpt, sglang_path: Optional[str] = SglangPathOpt,
    connect_timeout: Optional[float] = TimeoutOpt, accept_new_host_key: bool = AcceptOpt,
) -> None:
    """Restart the server and wait until it is ready.

    \b
    Examples:
      eaglepatch restart root@gpu-host
      eaglepatch restart root@gpu-host --systemd-unit sglang
    """
    def go() -> None:
        c = conn(identity, port, jump, python, sglang_path, connect_timeout, accept_new_host_key, server_port)
        ropts = actions.restart_options(restart_cmd, systemd_unit, timeout)
        actions.check_targets(targets, c)
        outcomes = for_each_target(targets, lambda t: actions.restart_target(t, c, ropts, say))
        finish(outcomes, json_out, actions.render_restart)
    _guard(go)


@app.command()
def report(
    sources: List[str] = typer.Argument(..., help="Timing logs: local files or folders, or TARGETs to fetch from."),
    json_out: bool = JsonOpt,
    csv_out: bool = CsvOpt,
    by: Optional[By] = typer.Option(None, "--by", help="Group by batch size, rank or host."),
    skip: int = typer.Option(0, "--skip", help="Drop the first N cycles of each process (warm-up)."),
    trace: Optional[str] = typer.Option(None, "--trace", help="Write a Chrome trace (Perfetto) to FILE."),
    compare: bool = typer.Option(False, "--compare", help="Two or more sources side by side, with deltas."),
    chart: Optional[str] = typer.Option(None, "--chart", help="With --compare: a chart of the phases side by side; "
                                        "with --predict: predicted tok/s by step count beside the acceptance "
                                        "profile; to FILE: .svg, or .png with the plot extra."),
    predict: bool = typer.Option(False, "--predict", help="Predict accept length, cycle time and tok/s for other "
                                 "draft step counts (and none) from these records."),
    steps: Optional[str] = typer.Option(None, "--steps", help="With --predict: the step counts, e.g. 0,1,2,3,5 or "
                                        "0-8 (default: 0 and 1..max(8, steps+2))."),
    log_dir: Optional[str] = typer.Option(None, "--log-dir", help="Log directory on a TARGET (default: from its manifest)."),
    merge_runs: bool = typer.Option(False, "--merge-runs", help="All runs together (their figures blend)."),
    run: List[str] = typer.Option([], "--run", help="Only this run (its id, or a prefix of it; repeatable)."),
    since: Optional[str] = typer.Option(None, "--since", help="Only runs started since TIME: an epoch, "
                                        "'2026-12-01 15:40', or an age: 30m, 2h, 1d."),
    all_runs: bool = typer.Option(False, "--all-runs", help="Every run, each apart (a TARGET's default: the runs "
                                  "of the servers that run now)."),
    identity: Optional[str] = IdentityOpt, port: Optional[int] = PortOpt, jump: Optional[str] = JumpOpt,
    python: Optional[str] = PythonOpt, sglang_path: Optional[str] = SglangPathOpt,
    connect_timeout: Optional[float] = TimeoutOpt, accept_new_host_key: bool = AcceptOpt,
) -> None:
    """Aggregate timing logs: per-phase mean and percentiles, share of the cycle, accept length, tokens/s.

    \b
    Examples:
      eaglepatch report root@gpu-host
      eaglepatch report ./logs --all-runs --by rank
      eaglepatch report --compare before/ after/ --chart phases.svg
      eaglepatch report root@gpu-host --predict --chart predict.svg
    """
    def go() -> None:
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
        c = conn(identity, port, jump, python, sglang_path, connect_timeout, accept_new_host_key)
        runs = actions.RunSelection(merge=merge_runs, ids=tuple(run), all=all_runs,
                                    since=None if since is None else actions.parse_since(since))
        text = actions.report(sources, c, by=None if by is None else by.value, skip=skip, trace=trace, compare=compare, log_dir=log_dir,
                              fmt="json" if json_out else "csv" if csv_out else "table", say=say, runs=runs,
                              chart=chart, predict=predict, steps=step_list)
        sys.stdout.write(text if json_out else terminal_text(text))
    _guard(go)


RequestsOpt = typer.Option(32, "--requests", help="Measured requests.")
ConcurrencyOpt = typer.Option(4, "--concurrency", help="Requests in flight at a time.")
InputLenOpt = typer.Option(128, "--input-len", help="Prompt tokens per request (seeded random token ids).")
MaxNewOpt = typer.Option(128, "--max-new-tokens", help="Output tokens per request (ignore_eos).")
WarmupOpt = typer.Option(4, "--warmup", help="Unmeasured requests first.")
SeedOpt = typer.Option(0, "--seed", help="Seed of the prompts.")
LogWaitOpt = typer.Option(4.5, "--log-wait", help="Seconds to wait after the load for the timing records "
                          "(the runtime writes every 2 s); only when the target is patched.")


def _bench_options(requests: int, concurrency: int, input_len: int, max_new_tokens: int, warmup: int, seed: int,
                   log_wait: float) -> Any:
    from eaglepatch.tuning.load import LoadSpec
    from eaglepatch.tuning.drive import BenchOptions

    load = LoadSpec(requests=requests, concurrency=concurrency, input_len=input_len, max_new_tokens=max_new_tokens,
                    warmup=warmup, seed=seed)
    return BenchOptions(load=load, log_wait=log_wait)


@app.command()
def bench(
    target: str = typer.Argument(..., help="SSH destination or local path."),
    requests: int = RequestsOpt, concurrency: int = ConcurrencyOpt, input_len: int = InputLenOpt,
    max_new_tokens: int = MaxNewOpt, warmup: int = WarmupOpt, seed: int = SeedOpt, log_wait: float = LogWaitOpt,
    json_out: bool = JsonOpt,
    server_port: List[int] = ServerPortOpt,
    identity: Optional[str] = IdentityOpt, port: Optional[int] = PortOpt, jump: Optional[str] = JumpOpt,
    python: Optional[str] = PythonOpt, sglang_path: Optional[str] = SglangPathOpt,
    connect_timeout: Optional[float] = TimeoutOpt, accept_new_host_key: bool = AcceptOpt,
) -> None:
    """A fixed, seeded load on the running server (through the SSH connection): client tok/s, TTFT, latency,
    accept length, and the timing report of the same window.

    \b
    Examples:
      eaglepatch bench root@gpu-host --requests 64 --concurrency 8
    """
    def go() -> None:
        from eaglepatch.tuning import drive as tuning

        c = conn(identity, port, jump, python, sglang_path, connect_timeout, accept_new_host_key, server_port)
        opts = _bench_options(requests, concurrency, input_len, max_new_tokens, warmup, seed, log_wait)
        actions.check_targets([target], c)
        finish(for_each_target([target], lambda t: tuning.bench(t, c, opts, say)), json_out, tuning.render_bench)
    _guard(go)


@app.command()
def sweep(
    target: str = typer.Argument(..., help="SSH destination or local path."),
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
    requests: int = RequestsOpt, concurrency: int = ConcurrencyOpt, input_len: int = InputLenOpt,
    max_new_tokens: int = MaxNewOpt, warmup: int = WarmupOpt, seed: int = SeedOpt, log_wait: float = LogWaitOpt,
    server_port: List[int] = ServerPortOpt,
    identity: Optional[str] = IdentityOpt, port: Optional[int] = PortOpt, jump: Optional[str] = JumpOpt,
    python: Optional[str] = PythonOpt, sglang_path: Optional[str] = SglangPathOpt,
    connect_timeout: Optional[float] = TimeoutOpt, accept_new_host_key: bool = AcceptOpt,
) -> None:
    """Restart the server once per point of a grid of launch flags, bench each, one table with the speedup over
    the baseline; resumable; puts the server back at the end. With --live: every step count inside one server.

    \b
    Examples:
      eaglepatch sweep root@gpu-host --grid speculative-num-steps=1,2,3,5 --baseline --repeat 3 --chart s.svg
      eaglepatch sweep root@gpu-host --env NCCL_PROTO=LL,Simple --grid disable-custom-all-reduce=on,off
      eaglepatch sweep root@gpu-host --live --grid speculative-num-steps=0,1,3,7 --emit-adaptive-config a.json
    """
    def go() -> None:
        from eaglepatch.tuning import sweep_summary as sw
        from eaglepatch.tuning import drive as tuning

        if json_out and csv_out:
            raise UsageError("--json and --csv exclude each other: give one")
        c = conn(identity, port, jump, python, sglang_path, connect_timeout, accept_new_host_key, server_port)
        bench_opts = _bench_options(requests, concurrency, input_len, max_new_tokens, warmup, seed, log_wait)
        if live:
            from eaglepatch.tuning import drive_live

            for flag, given in (("--baseline", baseline), ("--keep-best", keep_best), ("--env", bool(env)),
                                ("--repeat", repeat != 1), ("--allow-flag", bool(allow_flag))):
                if given:
                    raise UsageError(f"{flag} does not go with --live (its points are step counts inside one "
                                     "server; --rounds repeats them): sweep without --live for it")
            opts: Any = drive_live.LiveOptions(
                grid=tuple(grid), rounds=3 if rounds is None else rounds, window=20.0 if window is None else window,
                emit=emit_adaptive_config, fresh=fresh, timeout=timeout, bench=bench_opts)
            opts.steps()  # bad input: exit 2 before the target is touched
            run: Callable[[str], Any] = lambda t: drive_live.live_sweep(t, c, opts, say)
        else:
            for flag, given in (("--rounds", rounds is not None), ("--window", window is not None),
                                ("--emit-adaptive-config", emit_adaptive_config is not None)):
                if given:
                    raise UsageError(f"{flag} goes with --live")
            opts = tuning.SweepOptions(
                grid=tuple(grid), env=tuple(env), allow=tuple(allow_flag), baseline=baseline, repeat=repeat,
                keep_best=keep_best, fresh=fresh, timeout=timeout, bench=bench_opts)
            opts.points()  # bad input: exit 2 before the target is touched
            run = lambda t: tuning.sweep(t, c, opts, say)  # noqa: E731
        if chart is not None:
            from eaglepatch.report.chart.draw import check_chart_path

            check_chart_path(chart)  # folder, .svg/.png, matplotlib for .png: exit 2 before the sweep runs
        actions.check_targets([target], c)
        [outcome] = for_each_target([target], run)
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
    _guard(go)


@app.command()
def doctor(
    target: str = typer.Argument(..., help="SSH destination or local path."),
    json_out: bool = JsonOpt,
    log_dir: Optional[str] = typer.Option(None, "--log-dir", help="Timing log directory on the target "
                                          "(default: from its manifest)."),
    server_port: List[int] = ServerPortOpt,
    identity: Optional[str] = IdentityOpt, port: Optional[int] = PortOpt, jump: Optional[str] = JumpOpt,
    python: Optional[str] = PythonOpt, sglang_path: Optional[str] = SglangPathOpt,
    connect_timeout: Optional[float] = TimeoutOpt, accept_new_host_key: bool = AcceptOpt,
) -> None:
    """Name what makes speculative decoding slow on the running server, with the evidence and the next step;
    reads only (docs/doctor.md).

    \b
    Examples:
      eaglepatch doctor root@gpu-host
      eaglepatch doctor root@gpu-host --json
    """
    def go() -> None:
        from eaglepatch.doctor.collect import doctor as run_doctor
        from eaglepatch.doctor.render import render

        c = conn(identity, port, jump, python, sglang_path, connect_timeout, accept_new_host_key, server_port)
        actions.check_targets([target], c)
        finish(for_each_target([target], lambda t: run_doctor(t, c, say, log_dir=log_dir)), json_out, render)
    _guard(go)


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


def main() -> None:
    """Console entry point (kept for scripts that name it): ``eaglepatch.entry.main``."""
    from eaglepatch.entry import main as entry_main

    entry_main()
