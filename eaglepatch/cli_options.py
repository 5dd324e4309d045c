"""The options that several commands share, declared once: the connection options (SSH and discovery), which a
command gets as one ``Connect`` (``connected``); the output, recipe, restart and load options."""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, List, Optional, TypeVar

import typer

from eaglepatch.cli_output import guard
from eaglepatch.errors import UsageError
from eaglepatch.ops.options import FactsOptions
from eaglepatch.ops.target import Connect

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


RequestsOpt = typer.Option(32, "--requests", help="Measured requests.")
ConcurrencyOpt = typer.Option("4", "--concurrency", help="Requests in flight at a time, or a list measured in turn "
                              "(1,8,32,64): bench one load each, a sweep each of them after each launch, a live "
                              "sweep each of them at each step count in its one launch.")
RequestRateOpt = typer.Option(None, "--request-rate", help="An open loop: requests arrive at R per second "
                              "(Poisson, seeded), --concurrency then caps what is in flight; or a list measured in "
                              "turn (2,8,32), as a --concurrency list is. Default: a closed loop.")
InputLenOpt = typer.Option(128, "--input-len", help="Prompt tokens per request, with --prompts random-ids only "
                           "(seeded random token ids).")
MaxNewOpt = typer.Option(128, "--max-new-tokens", help="Output tokens per request: exactly that many with "
                         "random-ids; at most that many for text, unless a prompt gives its own max_tokens.")
PromptsOpt = typer.Option("mixed", "--prompts", help="The prompts: a built-in set (mixed, chat, code, summarize, "
                          "reasoning), random-ids (seeded random token ids), or a file: JSONL of {\"prompt\": ...} "
                          "or {\"messages\": [...]} lines (optional max_tokens, category), or ShareGPT JSON. Text "
                          "goes to /generate, messages to /v1/chat/completions (the model's chat template).")
TemperatureOpt = typer.Option(0.0, "--temperature", help="Sampling temperature sent (0: greedy).")
TopPOpt = typer.Option(1.0, "--top-p", help="Nucleus sampling top_p sent.")
IgnoreEosOpt = typer.Option(None, "--ignore-eos/--no-ignore-eos", help="Generate past the end of sequence "
                            "(default: yes for random-ids, no for text prompts).")
WarmupOpt = typer.Option(4, "--warmup", help="Unmeasured requests first.")
SeedOpt = typer.Option(0, "--seed", help="Seed of the prompts.")
SharedTrafficOpt = typer.Option(False, "--allow-shared-traffic", help="Sweep a server that also serves requests "
                                "that are not the sweep's: a restart sweep stops them, a live sweep pins their step "
                                "count too while they share a batch with its own (without it a restart sweep refuses, "
                                "a live sweep pins only batches of its own requests).")
LogWaitOpt = typer.Option(4.5, "--log-wait", help="Seconds at most to wait after the load for the timing "
                          "records: the wait ends once every rank's log was written after the load (the runtime "
                          "writes every 2 s); only when the target is patched.")


# The connection options, as --help lists them: after a command's own (and --server-port).
_CONNECTION: tuple[tuple[str, Any, Any], ...] = (
    ("identity", Optional[str], IdentityOpt), ("port", Optional[int], PortOpt), ("jump", Optional[str], JumpOpt),
    ("python", Optional[str], PythonOpt), ("sglang_path", Optional[str], SglangPathOpt),
    ("connect_timeout", Optional[float], TimeoutOpt), ("accept_new_host_key", bool, AcceptOpt),
)


def connect(identity: str | None = None, port: int | None = None, jump: str | None = None, python: str | None = None,
            sglang_path: str | None = None, connect_timeout: float | None = None, accept_new_host_key: bool = False,
            server_port: List[int] | None = None) -> Connect:
    """The ``Connect`` of the command line's connection options; raises UsageError for a bad --server-port."""
    for p in server_port or ():
        if not 0 < p < 65536:
            raise UsageError(f"--server-port {p}: not a TCP port number")
    return Connect(identity=identity, port=port, jump=jump, connect_timeout=connect_timeout,
                   accept_new_host_key=accept_new_host_key,
                   facts=FactsOptions(python=python, sglang_path=sglang_path, server_ports=tuple(server_port or ())))


Command = TypeVar("Command", bound=Callable[..., None])


def connected(*, server_port: bool = False) -> Callable[[Command], Command]:
    """A command that reaches targets. Typer reads a command's options from its signature: the decorated command's
    gains the connection options (and, with ``server_port``, ``--server-port``) after its own, and the command gets
    them as one ``Connect``, its keyword-only parameter ``c``. It runs under ``guard``: an error raised before any
    target is touched (a bad option) is one line and its exit code."""
    added = ((("server_port", List[int], ServerPortOpt),) if server_port else ()) + _CONNECTION

    def decorate(fn: Command) -> Command:
        signature = inspect.signature(fn, eval_str=True)
        params = [p for name, p in signature.parameters.items() if name != "c"]
        params += [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=option, annotation=kind)
                   for name, kind, option in added]

        @functools.wraps(fn)
        def command(**kw: Any) -> None:
            given = {name: kw.pop(name) for name, _kind, _option in added}
            guard(lambda: fn(**kw, c=connect(**given)))

        command.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command  # type: ignore[return-value]

    return decorate
