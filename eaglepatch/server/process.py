"""Finding the running sglang server: what runs, with what arguments, where, and how to start it again.

``find_servers`` reads the host's /proc in one round trip; ``ServerProcess`` is what it found, ``LaunchSpec`` what
starting it again takes (and what ``apply`` keeps in its backup manifest, so that ``revert`` can start the server
even after it crashed).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from eaglepatch.errors import UsageError
from eaglepatch.hostside import launchers, state
from eaglepatch.hostside.launchers import DEFAULT_HOST, DEFAULT_PORT
from eaglepatch.hosts.agent import call
from eaglepatch.hosts.base import Host
from eaglepatch.redact import mask_argv

# where eaglepatch keeps its files on a host whose environment names no other folder: the host resolves it
# (``hostside.state``: EAGLEPATCH_STATE_DIR), the client only falls back on it when the host did not say
LOG_DIR = state.DEFAULT

# addresses a server listens on that are not addresses to connect to: probe the loopback instead
_WILDCARDS = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1", "[::]": "::1"}


def default_log_path(port: int, state_dir: str | None = None) -> str:
    """Where a server that eaglepatch starts writes its output on a host whose state folder is ``state_dir`` (as
    that host said; None: the default, /tmp/eaglepatch). What is started sends no log path for it: the host
    resolves its own (``hostside.state``)."""
    return f"{state_dir or LOG_DIR}/server-{port}.log"


def parse_state_dir(value: Any) -> str | None:
    """The host's state folder as its scan said of a server (its ``state_dir``: an absolute path), or None when it
    did not say (an older host side) or sent something else."""
    if isinstance(value, str) and value.startswith("/") and "\0" not in value and len(value) <= 4096:
        return value
    return None


def parse_output(value: Any) -> dict[str, Any] | None:
    """The scan's ``output`` (where a server's stdout and stderr go, each ``{"path", "dev", "ino"}`` of a regular
    file or None), checked; None for None. Raises ValueError for anything else."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or not set(value) <= {"stdout", "stderr"}:
        raise ValueError("'output' must be an object of 'stdout' and 'stderr'")
    out: dict[str, Any] = {}
    for name in ("stdout", "stderr"):
        entry = value.get(name)
        if entry is None:
            out[name] = None
            continue
        path = entry.get("path") if isinstance(entry, Mapping) else None
        ok = (isinstance(path, str) and path.startswith("/") and "\0" not in path
              and all(type(entry.get(k)) is int and entry[k] >= 0 for k in ("dev", "ino")))
        if not ok:
            raise ValueError(f"'output' {name!r} must be null or a file: an absolute 'path', its 'dev' and 'ino'")
        out[name] = {"path": entry["path"], "dev": entry["dev"], "ino": entry["ino"]}
    return out


def probe_address(host: str) -> str:
    """The address to connect to for a server started with ``--host host`` (a wildcard becomes the loopback)."""
    return _WILDCARDS.get(host, host)


@dataclasses.dataclass(frozen=True)
class ServerArgs:
    """The few sglang server arguments eaglepatch needs: where it listens, and its API key."""

    port: int = DEFAULT_PORT
    host: str = DEFAULT_HOST
    api_key: str | None = None


def parse_server_args(args: Sequence[str]) -> ServerArgs:
    """Read ``--port``, ``--host`` and ``--api-key`` from sglang's arguments (``--x V`` or ``--x=V``; last wins).

    A malformed ``--port`` value leaves the default, as the server itself would have refused to start with it.
    (The same function runs on the host, in ``eaglepatch.hostside.launchers``.)
    """
    parsed = launchers.parse_server_args(list(args))
    return ServerArgs(port=parsed["port"], host=parsed["host"], api_key=parsed["api_key"])


@dataclasses.dataclass(frozen=True)
class LaunchSpec:
    """How to start a server: the exact argv, working directory and environment, and where its output goes.

    ``log_path`` "" (the default) is the host's default log, ``server-PORT.log`` in its state folder
    (``hostside.state``), resolved there when the server starts. JSON round-trippable (``to_json``/``from_json``)
    so ``apply`` can keep it in the backup manifest (its ``log_path`` null for the default).
    """

    argv: list[str]
    cwd: str
    env: dict[str, str]
    port: int = DEFAULT_PORT
    host: str = DEFAULT_HOST
    log_path: str = ""
    launcher: str | None = None  # what argv[0] resolved to when it was read: a relaunch must find the same file
    sig_ign: tuple[str, ...] | None = None  # the signals the original ignored (nohup: SIGHUP): the relaunch too
    # the original's own output files (``parse_output``): a relaunch appends to them, else writes ``log_path``
    output: Mapping[str, Any] | None = None

    @property
    def probe_host(self) -> str:
        return probe_address(self.host)

    @property
    def api_key(self) -> str | None:
        return parse_server_args(self.argv).api_key

    def to_json(self) -> dict[str, Any]:
        return {
            "argv": list(self.argv),
            "cwd": self.cwd,
            "env": dict(self.env),
            "port": self.port,
            "host": self.host,
            "log_path": self.log_path or None,
            "launcher": self.launcher,
            "sig_ign": None if self.sig_ign is None else list(self.sig_ign),
            "output": None if self.output is None else {k: None if v is None else dict(v)
                                                        for k, v in self.output.items()},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LaunchSpec:
        """Build from ``to_json``'s dict; raises ValueError naming the field that is missing or of the wrong type.

        A manifest of an earlier eaglepatch names the default log itself (/tmp/eaglepatch/server-PORT.log): that
        is read as the default, so that the host's state folder holds it now."""
        if not isinstance(data, Mapping):
            raise ValueError("launch spec: expected an object")
        argv, env = data.get("argv"), data.get("env")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise ValueError("launch spec: 'argv' must be a non-empty list of strings")
        if not isinstance(data.get("cwd"), str) or not data["cwd"]:
            raise ValueError("launch spec: 'cwd' must be a path")
        if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise ValueError("launch spec: 'env' must be an object of strings")
        port = data.get("port", DEFAULT_PORT)
        if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
            raise ValueError("launch spec: 'port' must be a TCP port number")
        host = data.get("host", DEFAULT_HOST)
        log_path = data.get("log_path") or ""
        if not isinstance(host, str) or not isinstance(log_path, str):
            raise ValueError("launch spec: 'host' and 'log_path' must be strings")
        if log_path == default_log_path(port):
            log_path = ""
        launcher = data.get("launcher")
        if launcher is not None and not isinstance(launcher, str):
            raise ValueError("launch spec: 'launcher' must be a path")
        sig_ign = data.get("sig_ign")
        if sig_ign is not None and (not isinstance(sig_ign, list) or not all(isinstance(x, str) for x in sig_ign)):
            raise ValueError("launch spec: 'sig_ign' must be a list of signal names")
        try:
            output = parse_output(data.get("output"))
        except ValueError as exc:
            raise ValueError(f"launch spec: {exc}") from None
        return cls(argv=list(argv), cwd=data["cwd"], env=dict(env), port=port, host=host, log_path=log_path,
                   launcher=launcher, sig_ign=None if sig_ign is None else tuple(sig_ign), output=output)



@dataclasses.dataclass(frozen=True)
class Nodes:
    """Where a server of several nodes (``--nnodes N --node-rank R --dist-init-addr ADDR``) stands: ``count`` nodes,
    this process is node ``rank``; the nodes of one server share ``dist_init_addr`` and ``count``."""

    count: int
    rank: int
    dist_init_addr: str | None

    @property
    def key(self) -> tuple[str | None, int]:
        """What the nodes of one server have in common."""
        return (self.dist_init_addr, self.count)

    def to_json(self) -> dict[str, Any]:
        return {"count": self.count, "rank": self.rank, "dist_init_addr": self.dist_init_addr}


def nodes_of(args: Sequence[str]) -> Nodes | None:
    """The multi-node settings of sglang's arguments, or None for a server of one node (``--nnodes`` absent, 1, or
    not a number: sglang itself would refuse that)."""
    from eaglepatch.server.argv import parse_flags

    flags = parse_flags(args)
    try:
        count = int(flags.get("nnodes", 1))
        rank = int(flags.get("node-rank", 0))
    except (TypeError, ValueError):
        return None
    if count <= 1:
        return None
    addr = flags.get("dist-init-addr")
    return Nodes(count=count, rank=rank, dist_init_addr=addr if isinstance(addr, str) else None)


def disaggregation_of(args: Sequence[str]) -> str | None:
    """``prefill`` or ``decode`` for one side of a prefill/decode pair (``--disaggregation-mode``), else None (the
    flag absent, or sglang's ``null``)."""
    from eaglepatch.server.argv import parse_flags

    mode = parse_flags(args).get("disaggregation-mode")
    return mode if mode in ("prefill", "decode") else None


@dataclasses.dataclass(frozen=True)
class ServerProcess:
    """A running sglang server: its launcher process (the top one), as read from /proc on the host.

    ``env`` is None and ``cwd`` None when /proc would not tell (another user's process); ``children`` are all its
    descendants (TP ranks, scheduler, detokenizer). ``host`` is the ``--host`` it was given; ``probe_host`` is
    where to connect to it. ``start`` is the kernel's start time of the process (with the pid, its identity);
    ``started_at`` the same on the wall clock. ``launcher`` is the file argv[0] named (resolved against the
    process's cwd and PATH: a venv's ``bin/python`` stays itself, where ``exe`` is the base interpreter it links
    to); ``interpreter`` what runs the server's Python; ``package_dir`` the sglang package it imports (None when
    not asked or not found); ``launch`` how it was launched (``describe_launch``); ``systemd`` its service unit.
    """

    pid: int
    argv: list[str]
    cwd: str | None
    env: dict[str, str] | None
    exe: str | None
    port: int = DEFAULT_PORT
    host: str = DEFAULT_HOST
    children: tuple[int, ...] = ()
    pgid: int = 0
    sid: int = 0
    start: int | None = None
    same_mount_ns: bool | None = True
    launcher: str | None = None
    interpreter: str | None = None
    package_dir: str | None = None
    started_at: float | None = None
    uid: int | None = None
    launch: Mapping[str, Any] | None = None
    systemd: Mapping[str, Any] | None = None
    same_user: bool | None = True
    sig_ign: tuple[str, ...] | None = None
    nodes: Nodes | None = None  # one node of a multi-node server, else None
    disaggregation: str | None = None  # "prefill" or "decode": one side of a PD pair (``disaggregation_of``)
    output: Mapping[str, Any] | None = None  # its stdout and stderr files (``parse_output``); None: not known
    state_dir: str | None = None  # the host's state folder, as its scan said (``parse_state_dir``); None: not said

    @property
    def probe_host(self) -> str:
        return probe_address(self.host)

    @property
    def api_key(self) -> str | None:
        return parse_server_args(self.argv).api_key

    @property
    def unit(self) -> str | None:
        """The systemd service whose own process it is (a system unit; it restarts with the unit), else None."""
        s = self.systemd
        return s["unit"] if s and not s.get("user") and s.get("main", True) else None

    def describe_launch(self) -> str:
        """How it was launched, in a few words: ``systemd unit sglang.service; /opt/venv/bin/python -m
        sglang.launch_server (venv /opt/venv, not activated); sglang from site-packages``."""
        return describe_launch(self)

    def to_json(self) -> dict[str, Any]:
        """The ``server`` object of ``status --json`` / ``show --json``: pid and argv (docs/contract.md), plus the port,
        working directory, what argv[0] resolved to, how it was launched, and its start on the wall clock; ``nodes``
        for one node of a multi-node server."""
        doc = {"pid": self.pid, "argv": list(self.argv), "port": self.port, "cwd": self.cwd,
               "launcher": self.launcher, "launched": self.describe_launch(), "started_at": self.started_at,
               "systemd_unit": self.systemd["unit"] if self.systemd else None}
        if self.nodes is not None:
            doc["nodes"] = self.nodes.to_json()
        if self.disaggregation is not None:
            doc["disaggregation"] = self.disaggregation
        return doc

    def output_json(self) -> dict[str, Any]:
        """``status --json``'s ``output`` of the server: the regular files its ``stdout`` and ``stderr`` write to
        (null: a terminal, a pipe, a socket, /dev/null, or not readable), which a relaunch appends to; ``log``:
        where a relaunch writes its output instead when stdout is not a file (else null; a null stderr goes with
        stdout)."""
        out = self.output or {}
        doc = {name: (out.get(name) or {}).get("path") for name in ("stdout", "stderr")}
        doc["log"] = None if doc["stdout"] else default_log_path(self.port, self.state_dir)
        return doc

    def launch_spec(self, log_path: str | None = None) -> LaunchSpec:
        """What starting this server again takes (its output to ``log_path`` where it goes to no file of its own;
        None: the host's default log).

        Raises UsageError when it cannot be relaunched from here: its working directory or environment is not
        readable (another user's process: run as that user or root), it runs in another mount namespace
        (a container), or systemd runs it (relaunching it behind systemd's back would start a second one).
        ``--restart-cmd`` or ``--systemd-unit`` says how to restart it instead.
        """
        how = "pass --restart-cmd CMD or --systemd-unit NAME to say how to restart it"
        if self.same_user is False:
            raise UsageError(
                f"the sglang server (pid {self.pid}) runs as another user (uid {self.uid}): started again by this "
                f"user it would not be the same server: run eaglepatch as that user, or {how}"
            )
        if self.cwd is None or self.env is None:
            raise UsageError(
                f"cannot read the working directory or environment of the sglang server (pid {self.pid}): "
                f"run as its user or root, or {how}"
            )
        if self.same_mount_ns is False:
            raise UsageError(
                f"the sglang server (pid {self.pid}) runs in a container (another mount namespace), "
                f"so eaglepatch cannot start it again from the host: {how} (e.g. 'docker restart NAME')"
            )
        if self.systemd:
            unit = self.systemd["unit"]
            cmd = f"systemctl --user restart {unit}" if self.systemd.get("user") else f"systemctl restart {unit}"
            if not self.systemd.get("main", True):
                raise UsageError(
                    f"the sglang server (pid {self.pid}) runs inside the systemd unit {unit} without being its main "
                    f"process (started from a shell or a job of that service): neither restarting the unit nor "
                    f"starting it by hand beside systemd is safe: {how}"
                )
            raise UsageError(
                f"the sglang server (pid {self.pid}) runs under systemd ({unit}): starting its command line "
                f"by hand would race systemd; it is restarted with '{cmd}' (or {how})"
            )
        return LaunchSpec(
            argv=list(self.argv),
            cwd=self.cwd,
            env=dict(self.env),
            port=self.port,
            host=self.host,
            log_path=log_path or "",
            launcher=self.launcher,
            sig_ign=self.sig_ign,
            output=self.output,
        )

    @classmethod
    def from_scan(cls, item: Mapping[str, Any]) -> ServerProcess:
        argv = list(item["argv"])
        sglang_args = argv[int(item.get("args_index", 0)) :]
        args = parse_server_args(sglang_args)
        return cls(
            pid=int(item["pid"]),
            argv=argv,
            cwd=item.get("cwd"),
            env=item.get("env"),
            exe=item.get("exe"),
            port=args.port,
            host=args.host,
            children=tuple(int(c) for c in item.get("children") or ()),
            pgid=int(item.get("pgid") or 0),
            sid=int(item.get("sid") or 0),
            start=item.get("start"),
            same_mount_ns=item.get("same_mount_ns"),
            launcher=item.get("launcher"),
            interpreter=item.get("interpreter"),
            package_dir=item.get("package_dir"),
            started_at=item.get("started_at"),
            uid=item.get("uid"),
            launch=item.get("launch"),
            systemd=item.get("systemd"),
            same_user=item.get("same_user", True),
            sig_ign=None if item.get("sig_ign") is None else tuple(item["sig_ign"]),
            nodes=nodes_of(sglang_args),
            disaggregation=disaggregation_of(sglang_args),
            output=_scanned_output(item.get("output")),
            state_dir=parse_state_dir(item.get("state_dir")),
        )


def _scanned_output(value: Any) -> dict[str, Any] | None:
    """The scan's ``output``, or None when the host sent something else (nothing of it is used then)."""
    try:
        return parse_output(value)
    except ValueError:
        return None


def describe_launch(server: ServerProcess) -> str:
    """See ``ServerProcess.describe_launch``."""
    parts = []
    if server.systemd:
        parts.append(("systemd user unit " if server.systemd.get("user") else "systemd unit ")
                     + str(server.systemd["unit"]))
    launch = server.launch or {}
    idx = launchers.launcher_args_index(list(server.argv))
    argv = mask_argv(server.argv)  # what is printed of a command line (status's "launched" too): eaglepatch.redact
    head = " ".join(argv[:idx]) if idx > 0 else (argv[0] if argv else "?")
    venv = launch.get("venv")
    where = ""
    if venv:
        where = f" (venv {venv}, {'activated' if launch.get('activated') else 'not activated'})"
    elif server.launcher and server.argv and server.launcher != server.argv[0]:
        where = f" ({argv[0]} is {server.launcher})"
    parts.append(("console script: " if launch.get("console_script") else "") + head + where)
    imports = launch.get("imports")
    if imports:
        parts.append({"PYTHONPATH": "sglang from PYTHONPATH", "editable": "sglang as an editable install",
                      "cwd": "sglang from its working directory",
                      "site-packages": "sglang from site-packages"}.get(imports, f"sglang from {imports}"))
    return "; ".join(parts)


def find_servers(host: Host, python: str = "python3", package_dir: str | None = None,
                 settle: LaunchSpec | None = None, settle_wait: float = 150.0) -> list[ServerProcess]:
    """The running sglang servers on ``host`` (launcher processes only), by pid; one round trip.

    With ``settle``, read once no relaunch of its port runs on the host (one whose client was cut off goes on
    there), waiting ``settle_wait`` s at most (``server.control.lock_wait``: the time one relaunch takes); raises
    ``Conflict`` when one still runs then.

    Each carries the sglang package its own interpreter imports (``package_dir``) and how it was launched; with
    ``package_dir`` only the servers of that package are returned: the servers of a target's install, the only
    ones eaglepatch may stop or start. Raises ``Unsupported`` when ``python`` cannot run there, ``HelperFailed``
    when the scan fails, ``ConnectionFailed`` when the connection breaks.
    """
    payload: dict[str, Any] = {"identify": True}
    if package_dir is not None:
        payload["package_dir"] = package_dir
    wait = 0.0
    if settle is not None:
        wait = settle_wait
        payload["settle"] = {"port": settle.port, "log_path": settle.log_path or None, "wait": wait}
    result = call(host, python, "scan", timeout=90 + wait, **payload)
    if result.get("unsettled") and settle is not None:
        from eaglepatch.errors import Conflict

        raise Conflict(f"a relaunch of the server on :{settle.port} still runs on {host.name} after {wait:.0f} s: "
                       "nothing was read or changed; wait for it, then run the command again")
    return [ServerProcess.from_scan(item) for item in result["servers"]]


def select_servers(servers: Sequence[ServerProcess], ports: Sequence[int] = ()) -> list[ServerProcess]:
    """The servers to act on: all of ``servers``, or those listening on ``ports`` (``--server-port``).

    Raises UsageError naming the servers that do run when a port in ``ports`` has none of them.
    """
    if not ports:
        return list(servers)
    missing = [p for p in ports if not any(s.port == p for s in servers)]
    if missing:
        have = ", ".join(f":{s.port} (pid {s.pid})" for s in servers) or "none"
        raise UsageError(f"--server-port {missing[0]}: no server of this sglang install listens there "
                         f"(its servers: {have})")
    return [s for s in servers if s.port in ports]


def select_server(servers: Sequence[ServerProcess], port: int | None = None) -> ServerProcess | None:
    """The one server to act on: the one on ``port`` when given, else the only one; None when there is none.

    Raises UsageError when several run and ``port`` does not pick one.
    """
    chosen = [s for s in servers if port is None or s.port == port]
    if len(chosen) > 1:
        listing = ", ".join(f"pid {s.pid} on :{s.port}" for s in chosen)
        raise UsageError(f"several sglang servers of this install run ({listing}): pick one with --server-port N")
    return chosen[0] if chosen else None
