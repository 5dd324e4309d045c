"""A head start on an SSH TARGET: its connection made and its agent started while the client is still importing.

Before ``eaglepatch apply root@gpu-host`` can parse its command line it imports typer, its commands and, for an SSH
target, paramiko: some 0.2 s of the client's CPU, then the connection, the login shell and the interpreter's start
on the host, one after the other. ``begin``, called by the entry point before the CLI is imported, reads the
command line roughly (``guess``: the commands' options are a table here, which a test holds equal to the CLI's);
when it names an SSH TARGET, it connects to it and starts the host-side agent (``PythonAgent.start``: the
interpreter started and the program sent, no request), and the CLI is then imported while the host runs the login
shell and starts the interpreter. ``open_host`` ``claim``s that connection for a TARGET that parses to the very
same ``TargetSpec``; anything else never uses it, and ``end`` closes what was not claimed (the host's interpreter,
its stdin closed, ends).

What the guess cannot be sure of, it leaves alone: a command line with an option the commands do not declare
(``--help``, ``--version``, a typo, an SSH option written as ``-iKEY``), with ``--accept-new-host-key`` (a host
key is saved only for a command that runs), or with ``--``; and a TARGET that is a local path. A head start that
failed with eaglepatch's own error (a refused connection, an unknown host key) is that error for the command, as
the same code would have raised it a moment later; any other failure is forgotten and the command connects
itself. ``EAGLEPATCH_HEAD_START=0`` turns it off.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Callable, Sequence

if TYPE_CHECKING:  # pragma: no cover
    from eaglepatch.hosts.base import Host
    from eaglepatch.hosts.spec import SSHOptions, TargetSpec

    Parse = Callable[[str, SSHOptions], TargetSpec]
    Connect = Callable[[TargetSpec], Host]

# The commands whose first argument is a TARGET (or, for report, a source that may be one).
COMMANDS = frozenset({"show", "diff", "apply", "revert", "status", "restart", "report", "bench", "sweep", "doctor"})
# Every option of those commands, as the CLI declares them (tests/unit/test_head_start.py holds the two equal):
# those that take a value, and the flags.
VALUED = frozenset({
    "--allow-flag", "--by", "--chart", "--concurrency", "--connect-timeout", "--emit-adaptive-config", "--env",
    "--every", "--grid", "--identity", "--input-len", "--jump", "--log-dir", "--log-wait", "--max-log-mb",
    "--max-new-tokens", "--max-tpot-ms", "--min-free-mb", "--mode", "--objective", "--port", "--prompts", "--python",
    "--recipe", "--repeat",
    "--request-rate", "--requests", "--restart-cmd", "--rounds", "--run",
    "--seed", "--server-port", "--sglang-path", "--since", "--skip", "--steps", "--systemd-unit", "--temperature",
    "--timeout", "--top-p", "--trace", "--url", "--warmup", "--window", "-J", "-i", "-p"})
FLAGS = frozenset({
    "--accept-new-host-key", "--all-runs", "--allow-shared-traffic", "--baseline", "--compare", "--csv", "--dry-run",
    "--force", "--fresh", "--ignore-eos", "--json", "--keep-best", "--live", "--merge-runs", "--no-ignore-eos",
    "--no-restart", "--predict"})
# The options reaching the host depends on, and the name the guess gives each.
_READ = {"-i": "identity", "--identity": "identity", "-p": "port", "--port": "port", "-J": "jump", "--jump": "jump",
         "--connect-timeout": "connect_timeout", "--python": "python"}
# A command line holding any of these is left alone.
_NEVER = frozenset({"--accept-new-host-key"})


def guess(argv: Sequence[str]) -> tuple[str, dict[str, str]] | None:
    """``(TARGET, {option: value})`` as the command line ``argv`` (without the program's name) means them: its
    first argument that is no option nor an option's value, and the options of ``_READ`` (the last of each, as the
    CLI takes it); None when anything in it is not sure (see the module's text)."""
    if not argv or argv[0] not in COMMANDS:
        return None
    found: dict[str, str] = {}
    target = None
    i = 1
    while i < len(argv):
        a = argv[i]
        if a == "--" or a in _NEVER:
            return None
        if a.startswith("-") and a != "-":
            name, eq, value = a.partition("=")
            if name in VALUED and name.startswith("--") and eq:
                pass
            elif a in VALUED:
                if i + 1 >= len(argv):
                    return None
                value = argv[i + 1]
                i += 1
            elif a not in FLAGS:
                return None  # --help, --version, -iKEY, a typo: the CLI says what it is
            if name in _READ:
                found[_READ[name]] = value
        elif target is None:
            target = a
        i += 1
    return None if target is None else (target, found)


class _HeadStart:
    """The connection made for ``spec`` (``host``), or the error making it raised (``error``)."""

    def __init__(self, spec: "TargetSpec", python: str, connect: "Connect"):
        self.spec, self.python, self.connect = spec, python, connect
        self.host: Host | None = None
        self.error: BaseException | None = None
        self.claimed = False

    def run(self) -> None:
        from eaglepatch.errors import EaglepatchError

        try:
            self.host = self.connect(self.spec)
        except EaglepatchError as exc:  # the command's own error, should it parse to this TARGET (claim)
            self.error = exc
            return
        except Exception:  # noqa: BLE001 - forgotten: the command connects itself, and says what fails
            return
        try:
            from eaglepatch.hosts import bundle

            self.host.agents.agent(self.python, bundle.program).start()
        except Exception:  # noqa: BLE001 - the command's first call starts the agent itself, and says what fails
            self.host.agents.close()


_lock = threading.Lock()
_current: _HeadStart | None = None


def begin(argv: Sequence[str], parse: "Parse", connect: "Connect") -> None:
    """Connect to the SSH TARGET that the command line ``argv`` (without the program's name) names, if it names one
    surely enough (``guess``), and start its agent; returns once the agent's interpreter is starting on the host,
    which then starts while the CLI is imported. ``parse`` and ``connect`` are ``hosts.target``'s (``parse_target``
    and ``connect_ssh``: the command's own way, which imports this module to ``claim``). Never raises but for
    Ctrl-C (``Interrupted``)."""
    global _current
    if os.environ.get("EAGLEPATCH_HEAD_START", "1") == "0":
        return
    got = guess(argv)
    if got is None:
        return
    text, opts = got
    from eaglepatch.errors import EaglepatchError
    from eaglepatch.hosts.spec import SSHOptions

    try:
        port = int(opts["port"]) if "port" in opts else None
        timeout = float(opts["connect_timeout"]) if "connect_timeout" in opts else None
        spec = parse(text, SSHOptions(identity=opts.get("identity"), port=port, jump=opts.get("jump"),
                                      connect_timeout=timeout))
    except (ValueError, EaglepatchError):
        return  # the command line's own parse says what is wrong with it
    if spec.is_local:
        return
    hs = _HeadStart(spec, opts.get("python") or "python3", connect)
    with _lock:
        _current = hs
    hs.run()


def claim(spec: "TargetSpec") -> "Host | None":
    """The head start's connection, when it was made for ``spec`` and not claimed yet; raises its error when
    making it failed (eaglepatch's own error: what connecting now would raise); else None (connect as usual)."""
    with _lock:
        hs = _current
        if hs is None or hs.claimed or hs.spec != spec:
            return None
        hs.claimed = True
    if hs.error is not None:
        raise hs.error
    return hs.host


def end() -> None:
    """Close the head start's connection if no command claimed it (the host's interpreter, its stdin closed, ends)."""
    global _current
    with _lock:
        hs, _current = _current, None
    if hs is not None and not hs.claimed and hs.host is not None:
        try:
            hs.host.close()
        except Exception:  # noqa: BLE001 - closing what nobody used
            pass
