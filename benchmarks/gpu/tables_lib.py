"""What the table scripts of docs/real-gpu.md (``*_tables.py``, run here with this checkout's code) share: a
story's timing logs unpacked, and the runs its sweep state files hold."""

from __future__ import annotations

import json
import tarfile
import tempfile
from pathlib import Path


def unpack_logs(logs_tgz: str) -> list[str]:
    """The timing logs of a story's ``*_eplogs.tar.xz``, unpacked into a new temporary folder, sorted."""
    tmp = Path(tempfile.mkdtemp())
    with tarfile.open(logs_tgz) as tf:
        tf.extractall(tmp, filter="data")
    return sorted(str(f) for f in tmp.rglob("*.jsonl"))


def state_runs(text: str) -> list[dict]:
    """The runs (``"kind":"run"`` lines) of a sweep's state file."""
    return [json.loads(x) for x in text.splitlines() if '"kind":"run"' in x]
