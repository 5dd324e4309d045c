"""The timing log folder of this test session: every ``apply`` the end-to-end tests run without ``--log-dir`` gets
this one, so that no test writes timing records into the shared /tmp/eaglepatch (or reads another checkout's
there). conftest.py makes the folder (0700, under pytest's base temp) and names it in ``EAGLEPATCH_TEST_LOG_DIR``;
one folder for the session, so that every clean apply has the same runtime module (the references compare bytes).
"""

from __future__ import annotations

import os
from typing import Sequence

ENV = "EAGLEPATCH_TEST_LOG_DIR"


def with_log_dir(cmd: str, args: Sequence[str]) -> list[str]:
    """``args`` of an eaglepatch command, with ``--log-dir`` the session's folder for an ``apply`` that names none."""
    args = list(args)
    folder = os.environ.get(ENV)
    if cmd == "apply" and folder and not any(a == "--log-dir" or a.startswith("--log-dir=") for a in args):
        args += ["--log-dir", folder]
    return args
