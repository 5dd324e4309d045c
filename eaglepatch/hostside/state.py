"""Where eaglepatch keeps its own files on the host: the folder ``EAGLEPATCH_STATE_DIR`` of the host-side process
names (over SSH: the login's environment; for a local target: the CLI's own), else /tmp/eaglepatch. A relaunched
server's log (``server-PORT.log``) goes there, its start script (``start-PORT.sh``) and the relaunch lock of its
port (``relaunch-PORT.lock``, ``lock.relaunch_lock``). The client does not know the folder: it sends no log path
for "the default", and the host's answers say which path was used. (The timing logs have a folder of their own,
``apply --log-dir``.)
"""

from __future__ import annotations

import os

ENV = "EAGLEPATCH_STATE_DIR"
DEFAULT = "/tmp/eaglepatch"


def state_dir(environ=None):
    """The folder ``EAGLEPATCH_STATE_DIR`` names in ``environ`` (default: this process's environment), made
    absolute (a relative one from this process's working directory, ``~`` expanded); /tmp/eaglepatch when it is
    unset, empty or only blanks."""
    value = (os.environ if environ is None else environ).get(ENV, "").strip()
    if not value:
        return DEFAULT
    return os.path.abspath(os.path.expanduser(value))


def server_log_path(port, environ=None):
    """The log of a server that eaglepatch starts on ``port`` when its output goes to no file of its own."""
    return os.path.join(state_dir(environ), "server-%s.log" % port)


def log_path_of(payload):
    """The log path of a start or relaunch ``payload`` (its ``log_path``; null, empty or absent: the default,
    ``server_log_path`` of its ``port``)."""
    return payload.get("log_path") or server_log_path(payload.get("port", "server"))
