"""Finding, stopping, starting the sglang server and waiting until it is ready.

- ``find_servers(host)``: the running servers (``ServerProcess``), from /proc on the host, one round trip.
- ``ServerProcess.launch_spec()`` -> ``LaunchSpec``: how to start it again (JSON, for the backup manifest).
- ``restart(host, current=..., launch=..., options=RestartOptions(...))`` -> ``RestartResult``.
- ``wait_until_ready(host, port, ...)`` -> ``Readiness`` (``.ready``, the state, the last log line).

Everything on the host runs in eaglepatch's host-side program (``eaglepatch.hostside``: standard library only, never
sglang), one request per step through the host's agent (``eaglepatch.hosts.agent.call``), so it works the same on
``LocalHost`` and over SSH.
"""

from eaglepatch.server.control import StopResult, Started, read_log_tail, stop_server
from eaglepatch.server.process import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    LaunchSpec,
    ServerArgs,
    ServerProcess,
    default_log_path,
    find_servers,
    parse_server_args,
    probe_address,
    select_server,
)
from eaglepatch.server.ready import Readiness, ReadyState, wait_until_ready
from eaglepatch.server.restart import NoServerRunning, RestartOptions, RestartResult, Strategy, restart

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "LaunchSpec",
    "NoServerRunning",
    "Readiness",
    "ReadyState",
    "RestartOptions",
    "RestartResult",
    "ServerArgs",
    "ServerProcess",
    "Started",
    "StopResult",
    "Strategy",
    "default_log_path",
    "find_servers",
    "parse_server_args",
    "probe_address",
    "read_log_tail",
    "restart",
    "select_server",
    "stop_server",
    "wait_until_ready",
]
