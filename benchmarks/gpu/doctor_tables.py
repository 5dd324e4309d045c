#!/usr/bin/env python3
"""doctor's findings on each launch of a GPU story, from its timing logs, with this checkout's rules (the table of
docs/real-gpu.md's p = 0.2 section): per timing log (one launch), its step count and what doctor's rules find in
its records, as ``eaglepatch doctor`` would on that server with no sweep kept (the findings that need the
server's log or model configs are not read here).

    python benchmarks/gpu/doctor_tables.py docs/gpu/restart_story_big_p20_eplogs.tar.xz
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

from eaglepatch.doctor.collect import load_records
from eaglepatch.doctor.facts import ServerFacts
from eaglepatch.doctor.rules import diagnose
from tables_lib import unpack_logs


def main(logs: str) -> None:
    print("| timing log | steps | decode cycles | findings (id, severity: title) |")
    print("|---|---|---|---|")
    for path in unpack_logs(logs):
        header = json.loads(open(path, encoding="utf-8").readline())
        flags = dict(header.get("flags") or {})
        argv = header.get("argv") or []
        if "--speculative-adaptive" in argv:
            flags["speculative-adaptive"] = True
        pid = int(header["pid"])
        f = ServerFacts(target="gpu", version="0.5.16", pid=pid, port=30000, argv=argv, flags=flags,
                        patch="patched", log_dir=os.path.dirname(path))
        f = dataclasses.replace(f, **load_records(os.path.dirname(path), {pid}, sweep=None, flags=flags))
        n = sum(1 for line in open(path, encoding="utf-8") if '"mode": "decode"' in line)
        found = "; ".join(f"`{x.id}`, {x.severity}: {x.title}" for x in diagnose(f)) or "none"
        print(f"| {os.path.basename(path)} | {flags.get('speculative-num-steps')} | {n} | {found} |")


if __name__ == "__main__":
    main(sys.argv[1])
