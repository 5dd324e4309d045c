"""The thin command line: parse options, call the ops, print data to stdout and messages to stderr.

This is the only place that turns errors into exit codes (``_exit_code``); nothing below it calls ``sys.exit``.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import sys
import traceback
from typing import Any, Callable, List, Optional

import typer

from eaglepatch import __version__
from eaglepatch.errors import EaglepatchError, ExitCode, UsageError
from eaglepatch.ops import actions
from eaglepatch.ops.core import FactsOptions, RuntimeOptions

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    help="Time the draft, verify and draft-extend phases of SGLang speculative decoding on a live server, "
    "and put every byte back afterwards.",
)


# ----------------------------------------------------------------------------------------------------------------
# Messages and exit codes


def say(msg: str) -> None:
    """A message for the person: stderr, never stdout."""
    print(msg, file=sys.stderr, flush=True)


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

    def one(t: str) -> Outcome:
        try:
            return Outcome(t, fn(t))
        except BaseException as exc:  # noqa: BLE001 - every error becomes an outcome with its exit code
            if isinstance(exc, (SystemExit,)):
                raise
            return Outcome(t, error=exc)

    if len(targets) == 1:
        return [one(targets[0])]
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(16, len(targets))) as pool:
        return list(pool.map(one, targets))


def finish(outcomes: list[Outcome], emit_json: bool, render: Callable[[Any], str] | None) -> None:
    """Print each outcome (data to stdout, errors to stderr) and exit with the worst code."""
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
            if text:
                sys.stdout.write(text if text.endswith("\n") else text + "\n")
    if emit_json:
        doc = values[0] if len(values) == 1 and len(outcomes) == 1 else values
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
    sys.stdout.flush()
    raise typer.Exit(max((int(o.code) for o in outcomes), default=0))


# ----------------------------------------------------------------------------------------------------------------
# Shared options

IdentityOpt = typer.Option(None, "-i", "--identity", help="SSH private key file.")
PortOpt = typer.Option(None, "-p", "--port", help="SSH port.")
JumpOpt = typer.Option(None, "-J", "--jump", help="ProxyJump host: [user@]host[:port].")
PythonOpt = typer.Option(None, "--python", help="The remote interpreter (default: the server's, else python3).")
SglangPathOpt = typer.Option(None, "--sglang-path", help="The sglang package directory (skips discovery).")
TimeoutOpt = typer.Option(10.0, "--connect-timeout", help="SSH connect timeout, seconds.")
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
    except typer.Exit:
        raise
    except BaseException as exc:  # noqa: BLE001
        say(f"eaglepatch: {_message(exc)}")
        raise typer.Exit(int(_exit_code(exc)))


# ----------------------------------------------------------------------------------------------------------------
# Commands


@app.command()
def show(
    target: str = typer.Argument(..., help="SSH destination or local path."),
    json_out: bool = typer.Option(False, "--json", help="JSON (docs/contract.md)."),
    recipe: Optional[str] = RecipeOpt,
    identity: Optional[str] = IdentityOpt, port: Optional[int] = PortOpt, jump: Optional[str] = JumpOpt,
    python: Optional[str] = PythonOpt, sglang_path: Optional[str] = SglangPathOpt,
    connect_timeout: float = TimeoutOpt, accept_new_host_key: bool = AcceptOpt,
) -> None:
    """The sglang install, its worker files, entry methods with numbered source, phase call sites, patch state."""
    def go() -> None:
        c = conn(identity, port, jump, python, sglang_path, connect_timeout, accept_new_host_key)
        r = actions.load_recipe(recipe)
        finish(for_each_target([target], lambda t: actions.show(t, c, r)), json_out, actions.render_show)
    _guard(go)


@app.command()
def diff(
    target: str = typer.Argument(..., help="SSH destination or local path."),
    mode: str = typer.Option("sync", "--mode", help="sync or events."),
    recipe: Optional[str] = RecipeOpt,
    identity: Optional[str] = IdentityOpt, port: Optional[int] = PortOpt, jump: Optional[str] = JumpOpt,
    python: Optional[str] = PythonOpt, sglang_path: Optional[str] = SglangPathOpt,
    connect_timeout: float = TimeoutOpt, accept_new_host_key: bool = AcceptOpt,
) -> None:
    """The unified diff that apply would make; changes nothing."""
    def go() -> None:
        c = conn(identity, port, jump, python, sglang_path, connect_timeout, accept_new_host_key)
        r = actions.load_recipe(recipe)
        ropts = RuntimeOptions(mode=mode)
        finish(for_each_target([target], lambda t: actions.diff(t, c, r, ropts, say)), False, lambda v: v)
    _guard(go)


@app.command()
def apply(
    targets: List[str] = typer.Argument(..., help="SSH destinations or local paths."),
    mode: str = typer.Option("sync", "--mode", help="sync (synchronize + perf_counter) or events (CUDA events)."),
    every: int = typer.Option(1, "--every", help="Time one cycle in N."),
    log_dir: str = typer.Option("/tmp/eaglepatch", "--log-dir", help="Timing log directory on the target."),
    recipe: Optional[str] = RecipeOpt,
    no_restart: bool = typer.Option(False, "--no-restart", help="Patch only; do not restart the server."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan and the diff; change nothing."),
    json_out: bool = typer.Option(False, "--json"),
    restart_cmd: Optional[str] = RestartCmdOpt, systemd_unit: Optional[str] = UnitOpt,
    timeout: float = ReadyTimeoutOpt,
    server_port: List[int] = ServerPortOpt,
    identity: Optional[str] = IdentityOpt, port: Optional[int] = PortOpt, jump: Optional[str] = JumpOpt,
    python: Optional[str] = PythonOpt, sglang_path: Optional[str] = SglangPathOpt,
    connect_timeout: float = TimeoutOpt, accept_new_host_key: bool = AcceptOpt,
) -> None:
    """Instrument every supported worker file, back up the originals, restart the server, wait until ready."""
    def go() -> None:
        c = conn(identity, port, jump, python, sglang_path, connect_timeout, accept_new_host_key, server_port)
        r = actions.load_recipe(recipe)
        ropts = RuntimeOptions(mode=mode, every=every, log_dir=log_dir)
        restart = None if no_restart else actions.restart_options(restart_cmd, systemd_unit, timeout)
        actions.check_targets(targets, c)
        outcomes = for_each_target(targets, lambda t: actions.apply(t, c, r, ropts, restart, dry_run, say))
        finish(outcomes, json_out, actions.render_change)
    _guard(go)


@app.command()
def revert(
    targets: List[str] = typer.Argument(..., help="SSH destinations or local paths."),
    force: bool = typer.Option(False, "--force", help="Revert a drifted file: keep a copy, remove our lines."),
    no_restart: bool = typer.Option(False, "--no-restart"),
    json_out: bool = typer.Option(False, "--json"),
    restart_cmd: Optional[str] = RestartCmdOpt, systemd_unit: Optional[str] = UnitOpt,
    timeout: float = ReadyTimeoutOpt,
    server_port: List[int] = ServerPortOpt,
    identity: Optional[str] = IdentityOpt, port: Optional[int] = PortOpt, jump: Optional[str] = JumpOpt,
    python: Optional[str] = PythonOpt, sglang_path: Optional[str] = SglangPathOpt,
    connect_timeout: float = TimeoutOpt, accept_new_host_key: bool = AcceptOpt,
) -> None:
    """Put back the original bytes, remove what apply added, restart."""
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
    json_out: bool = typer.Option(False, "--json"),
    identity: Optional[str] = IdentityOpt, port: Optional[int] = PortOpt, jump: Optional[str] = JumpOpt,
    python: Optional[str] = PythonOpt, sglang_path: Optional[str] = SglangPathOpt,
    connect_timeout: float = TimeoutOpt, accept_new_host_key: bool = AcceptOpt,
) -> None:
    """Patch state per file (pristine, patched, drifted) and the server process."""
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
    json_out: bool = typer.Option(False, "--json"),
    server_port: List[int] = ServerPortOpt,
    identity: Optional[str] = IdentityOpt, port: Optional[int] = PortOpt, jump: Optional[str] = JumpOpt,
    python: Optional[str] = PythonOpt, sglang_path: Optional[str] = SglangPathOpt,
    connect_timeout: float = TimeoutOpt, accept_new_host_key: bool = AcceptOpt,
) -> None:
    """Restart the server and wait until it is ready."""
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
    json_out: bool = typer.Option(False, "--json"),
    csv_out: bool = typer.Option(False, "--csv"),
    by: Optional[str] = typer.Option(None, "--by", help="Group by bs, rank or host."),
    skip: int = typer.Option(0, "--skip", help="Drop the first N cycles of each process (warm-up)."),
    trace: Optional[str] = typer.Option(None, "--trace", help="Write a Chrome trace (Perfetto) to FILE."),
    compare: bool = typer.Option(False, "--compare", help="Two or more sources side by side, with deltas."),
    log_dir: Optional[str] = typer.Option(None, "--log-dir", help="Log directory on a TARGET (default: from its manifest)."),
    identity: Optional[str] = IdentityOpt, port: Optional[int] = PortOpt, jump: Optional[str] = JumpOpt,
    python: Optional[str] = PythonOpt, sglang_path: Optional[str] = SglangPathOpt,
    connect_timeout: float = TimeoutOpt, accept_new_host_key: bool = AcceptOpt,
) -> None:
    """Aggregate timing logs: per-phase mean and percentiles, share of the cycle, accept length, tokens/s."""
    def go() -> None:
        if json_out and csv_out:
            raise UsageError("--json and --csv exclude each other: give one")
        if by is not None and by not in ("bs", "rank", "host"):
            raise UsageError(f"--by must be bs, rank or host, not {by!r}")
        if skip < 0:
            raise UsageError("--skip must be 0 or more")
        if compare and len(sources) < 2:
            raise UsageError("--compare needs two or more sources")
        c = conn(identity, port, jump, python, sglang_path, connect_timeout, accept_new_host_key)
        text = actions.report(sources, c, by=by, skip=skip, trace=trace, compare=compare, log_dir=log_dir,
                              fmt="json" if json_out else "csv" if csv_out else "table", say=say)
        sys.stdout.write(text)
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
    from eaglepatch.load import LoadSpec
    from eaglepatch.ops.tuning import BenchOptions

    load = LoadSpec(requests=requests, concurrency=concurrency, input_len=input_len, max_new_tokens=max_new_tokens,
                    warmup=warmup, seed=seed)
    return BenchOptions(load=load, log_wait=log_wait)


@app.command()
def bench(
    target: str = typer.Argument(..., help="SSH destination or local path."),
    requests: int = RequestsOpt, concurrency: int = ConcurrencyOpt, input_len: int = InputLenOpt,
    max_new_tokens: int = MaxNewOpt, warmup: int = WarmupOpt, seed: int = SeedOpt, log_wait: float = LogWaitOpt,
    json_out: bool = typer.Option(False, "--json"),
    server_port: List[int] = ServerPortOpt,
    identity: Optional[str] = IdentityOpt, port: Optional[int] = PortOpt, jump: Optional[str] = JumpOpt,
    python: Optional[str] = PythonOpt, sglang_path: Optional[str] = SglangPathOpt,
    connect_timeout: float = TimeoutOpt, accept_new_host_key: bool = AcceptOpt,
) -> None:
    """A fixed, seeded load on the running server (through the SSH connection): client tok/s, TTFT, latency,
    accept length, and the timing report of the same window."""
    def go() -> None:
        from eaglepatch.ops import tuning

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
    json_out: bool = typer.Option(False, "--json"),
    csv_out: bool = typer.Option(False, "--csv"),
    chart: Optional[str] = typer.Option(None, "--chart", help="Write a chart to FILE (SVG for *.svg, else PNG)."),
    timeout: float = typer.Option(900.0, "--timeout", help="Seconds for each launch to be ready."),
    requests: int = RequestsOpt, concurrency: int = ConcurrencyOpt, input_len: int = InputLenOpt,
    max_new_tokens: int = MaxNewOpt, warmup: int = WarmupOpt, seed: int = SeedOpt, log_wait: float = LogWaitOpt,
    server_port: List[int] = ServerPortOpt,
    identity: Optional[str] = IdentityOpt, port: Optional[int] = PortOpt, jump: Optional[str] = JumpOpt,
    python: Optional[str] = PythonOpt, sglang_path: Optional[str] = SglangPathOpt,
    connect_timeout: float = TimeoutOpt, accept_new_host_key: bool = AcceptOpt,
) -> None:
    """Restart the server once per point of a grid of launch flags, bench each, one table with the speedup over
    the baseline; resumable; puts the server back at the end."""
    def go() -> None:
        from eaglepatch import sweep as sw
        from eaglepatch.ops import tuning

        if json_out and csv_out:
            raise UsageError("--json and --csv exclude each other: give one")
        c = conn(identity, port, jump, python, sglang_path, connect_timeout, accept_new_host_key, server_port)
        opts = tuning.SweepOptions(
            grid=tuple(grid), env=tuple(env), allow=tuple(allow_flag), baseline=baseline, repeat=repeat,
            keep_best=keep_best, fresh=fresh, timeout=timeout,
            bench=_bench_options(requests, concurrency, input_len, max_new_tokens, warmup, seed, log_wait))
        opts.points()  # bad input: exit 2 before the target is touched
        if chart is not None and not os.path.isdir(os.path.dirname(os.path.abspath(chart))):
            raise UsageError(f"--chart {chart}: no such folder")
        actions.check_targets([target], c)
        [outcome] = for_each_target([target], lambda t: tuning.sweep(t, c, opts, say))
        if outcome.error is not None:
            finish([outcome], json_out, None)
        doc = outcome.value
        if chart is not None:
            from eaglepatch.chart import write_chart

            write_chart(doc, chart)
            say(f"chart written to {chart}")
        if csv_out:
            text = sw.render_csv(doc)
        elif json_out:
            text = json.dumps(doc, indent=1) + "\n"
        else:
            text = sw.render_table(doc) + "\n"
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


def version_callback(value: bool) -> None:
    if value:
        print(f"eaglepatch {__version__}")
        raise typer.Exit(0)


@app.callback()
def _main(
    version: bool = typer.Option(False, "--version", callback=version_callback, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    pass


def main() -> None:
    """Console entry point. Usage errors from Click exit 2, as CONTRACT.md says."""
    try:
        app(standalone_mode=True)
    except KeyboardInterrupt:
        say("eaglepatch: interrupted")
        sys.exit(130)
