"""The one entry point of the program that runs on the host: ``main(payload)`` answers one request by its ``op``.

``eaglepatch.hosts.bundle`` ships this package to the host as one program, and the agent (``eaglepatch.hosts.agent``)
calls ``main`` once per request; every op answers one JSON-able value.
"""

from __future__ import annotations

# op -> (module of this package, function): a module is imported, so compiled on the host, by the first request
# that needs it (an apply or a revert compiles neither doctor, live, logs nor probe: about a quarter of the
# program's source, and of the 20-30 ms its compiling took on the host)
OPS = {
    "scan": ("discover", "op_scan"),
    "stop": ("control", "op_stop"),
    "start": ("control", "op_start"),
    "relaunch": ("control", "op_relaunch"),
    "probe": ("probe", "op_probe"),
    "tail": ("probe", "op_tail"),
    "facts": ("install", "op_facts"),
    "read": ("install", "op_read"),
    "lock": ("lock", "op_lock"),
    "unlock": ("lock", "op_unlock"),
    "execute": ("execute", "op_execute"),
    "logs": ("logs", "op_logs"),
    "log_times": ("logs", "op_log_times"),
    "live": ("live", "op_live"),
    "doctor": ("doctor", "op_doctor"),
    "loads": ("doctor", "op_loads"),
}


def op(name):
    """The function that answers op ``name`` (its module imported on the first use); KeyError for no such op."""
    module, function = OPS[name]
    return getattr(__import__("eaglepatch.hostside." + module, fromlist=[function]), function)


def main(payload):
    """The answer of the op ``payload["op"]`` to ``payload``."""
    return op(payload["op"])(payload)
