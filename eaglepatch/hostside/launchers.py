"""Which command lines start an sglang server, and the few server arguments eaglepatch needs.

Pure functions of an argv: the host's scan uses them to find the servers, and the client
(``eaglepatch.server.process``) to read a server's port, host and API key from the argv the scan returned.
"""

from __future__ import annotations

import os
import re


# python, python3, python3.11, python3.13t, pypy3; the interpreter of a `python -m sglang.launch_server` process
_PYTHON_RE = re.compile(r"^(python|pypy)[0-9.]*[a-z]?$")
# a cluster of CPython's argument-less short options ending in -m: -m, -um, -Bum...; -m's value follows
MODULE_OPT_RE = re.compile(r"^-[bBdEhiIOPqRsSuvVx]*m(.*)$")
# CPython options that take a separate value
OPTS_WITH_VALUE = ("-X", "-W", "--check-hash-based-pycs")
_LAUNCH_MODULE = "sglang.launch_server"
DEFAULT_PORT = 30000
DEFAULT_HOST = "127.0.0.1"


def launcher_args_index(argv):
    """Return the index in ``argv`` where the server's own arguments begin, or -1 when ``argv`` is not a launcher.

    Launchers: ``<python> [opts] -m sglang.launch_server ...``, ``<python> [opts] .../sglang/launch_server.py ...``,
    ``sglang serve ...`` and ``<python> [opts] .../bin/sglang serve ...`` (how a console script's command line
    reads after the kernel ran its shebang). Anything else, ``sh -c "python -m sglang.launch_server"`` included,
    is not.
    """
    if not argv:
        return -1
    first = os.path.basename(argv[0])
    if first == "sglang":
        return 2 if len(argv) > 1 and argv[1] == "serve" else -1
    if not _PYTHON_RE.match(first):
        return -1
    i = 1
    while i < len(argv):
        arg = argv[i]
        m = MODULE_OPT_RE.match(arg)
        if m:
            if m.group(1):
                return i + 1 if m.group(1) == _LAUNCH_MODULE else -1
            return i + 2 if i + 1 < len(argv) and argv[i + 1] == _LAUNCH_MODULE else -1
        if arg == "-c" or arg == "-":
            return -1
        if arg in OPTS_WITH_VALUE:
            i += 2
            continue
        if arg.startswith("-"):
            i += 1
            continue
        # the script
        if os.path.basename(arg) == "sglang":
            return i + 2 if i + 1 < len(argv) and argv[i + 1] == "serve" else -1
        if arg.replace("\\", "/").endswith("sglang/launch_server.py"):
            return i + 1
        return -1
    return -1


def parse_server_args(args):
    """``{"port", "host", "api_key"}`` from sglang's arguments (``--x V`` or ``--x=V``; the last one wins).

    A malformed ``--port`` leaves the default (30000): the server would not have started with it.
    """
    values = {}
    wanted = ("--port", "--host", "--api-key")
    i = 0
    while i < len(args):
        name, eq, value = args[i].partition("=")
        if name in wanted:
            if eq:
                values[name] = value
            elif i + 1 < len(args):
                values[name] = args[i + 1]
                i += 1
        i += 1
    try:
        port = int(values.get("--port", DEFAULT_PORT))
    except ValueError:
        port = DEFAULT_PORT
    return {"port": port, "host": values.get("--host", DEFAULT_HOST), "api_key": values.get("--api-key")}
