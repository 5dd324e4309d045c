"""The one entry point of the program that runs on the host: ``main(payload)`` answers one request by its ``op``.

``eaglepatch.hosts.bundle`` ships this package to the host as one program, and the agent (``eaglepatch.hosts.agent``)
calls ``main`` once per request; every op answers one JSON-able value.
"""

from __future__ import annotations

from eaglepatch.hostside.control import op_relaunch, op_start, op_stop
from eaglepatch.hostside.discover import op_scan
from eaglepatch.hostside.doctor import op_doctor
from eaglepatch.hostside.execute import op_execute
from eaglepatch.hostside.install import op_facts, op_read
from eaglepatch.hostside.live import op_live
from eaglepatch.hostside.lock import op_lock, op_unlock
from eaglepatch.hostside.logs import op_logs
from eaglepatch.hostside.probe import op_probe, op_tail

OPS = {
    "scan": op_scan,
    "stop": op_stop,
    "start": op_start,
    "relaunch": op_relaunch,
    "probe": op_probe,
    "tail": op_tail,
    "facts": op_facts,
    "read": op_read,
    "lock": op_lock,
    "unlock": op_unlock,
    "execute": op_execute,
    "logs": op_logs,
    "live": op_live,
    "doctor": op_doctor,
}


def main(payload):
    """The answer of the op ``payload["op"]`` to ``payload``."""
    return OPS[payload["op"]](payload)
