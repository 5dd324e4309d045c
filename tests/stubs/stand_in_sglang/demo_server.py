"""``make demo-server``: the tests' stand-in sglang server, started on this machine for a newcomer to try every
command against (no GPU); ``make demo-server-stop`` stops it.

The server is the stand-in of tests/stubs/stand_in_sglang with ``--sim-batch``: one scheduler batches the requests
in flight, each forward costs more with the tokens it processes, and a request's draft guesses pass by its prompt
and by position. In that world speculation pays at a few requests at a time and stops paying from about 16, so
bench, ``report --predict``, doctor and a sweep with ``--baseline`` over ``--concurrency 4,16`` have something to
disagree about. ``--adaptive``: the stand-in of sglang 0.5.16's adaptive ``EAGLEWorkerV2`` instead (the one
``sweep --live`` needs; it runs the requests one by one).

It lives under ``$XDG_CACHE_HOME/eaglepatch/demo-server`` (default ``~/.cache``): the install (a PYTHONPATH
checkout, ``site/sglang`` the TARGET), the server's output ``server.log`` and ``server.json`` (its port). Stopping
finds the server by its port and its environment (``PYTHONPATH`` naming this install): it stops no other process,
whatever eaglepatch restarted in between.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import standin_harness as H  # noqa: E402

# the world of tests/e2e/test_batched_world.py, with every time x2 (its docstring gives the truth)
BATCHED = ("--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "5", "--speculative-eagle-topk", "1",
           "--speculative-num-draft-tokens", "6", "--sim-batch", "--sim-base-ms", "6", "--cuda-graph-max-bs", "16",
           "--tp", "1")
ADAPTIVE = ("--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
            "--tp", "1")
LOAD = "--requests 32 --input-len 16 --max-new-tokens 80"  # each load 5 s or more, as bench asks


def home() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "eaglepatch" / "demo-server"


def ours(state: dict) -> list[int]:
    """The live processes of the demo server: those on its port whose PYTHONPATH is its install."""
    out = []
    for pid in H._processes():
        argv = H.proc_argv(pid) or []
        if "sglang.launch_server" not in argv or str(state["port"]) not in argv:
            continue
        if (H.proc_env(pid) or {}).get("PYTHONPATH") == state["site"]:
            out.append(pid)
    return out


def commands(state: dict) -> str:
    t = "$T"
    if state.get("adaptive"):
        body = [
            f"eaglepatch apply {t}     # patch the worker, restart the server, wait until it is ready",
            f"eaglepatch sweep {t} --live --grid speculative-num-steps=0,1,3,7 --rounds 2 --window 2 "
            "--emit-adaptive-config adaptive.json   # every step count inside one launch",
            f"eaglepatch revert {t}",
        ]
    else:
        body = [
            f"eaglepatch apply {t}     # patch the worker, restart the server, wait until it is ready",
            f"eaglepatch bench {t} --concurrency 4,16 {LOAD}",
            f"eaglepatch report {t} --predict     # the best step count per batch size, from that one run",
            f"eaglepatch doctor {t}    # findings, each with its evidence and the next step",
            f"eaglepatch sweep {t} --grid speculative-num-steps=2,5 --baseline --concurrency 4,16 {LOAD}",
            f"eaglepatch bench {t} --concurrency 4,16 {LOAD}     # the server put back, loaded again",
            f"eaglepatch doctor {t}    # again: now with no speculation measured at each load",
            f"eaglepatch revert {t}",
        ]
    return "\n".join(["", "Try, in order (each takes seconds to a few minutes; eaglepatch is .venv/bin/eaglepatch):",
                      f"  T={state['target']}",
                      *("  " + b for b in body),
                      "", "Stop it: make demo-server-stop", f"Its output: {state['log']}"])


def start(adaptive: bool) -> int:
    d = home()
    path = d / "server.json"
    if path.exists():
        state = json.loads(path.read_text())
        if ours(state):
            print(f"the demo server already runs on :{state['port']}")
            print(commands(state))
            return 0
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    site = H.make_tree(d / "site", None if adaptive else H.V1_WORKER)
    if adaptive:
        H.add_adaptive(site / "sglang")
    port = H.free_port()
    env = dict(os.environ, PYTHONPATH=str(site), PYTHONDONTWRITEBYTECODE="1", STANDIN_SLOWDOWN="2")
    env.pop("PYTHONHOME", None)
    log = d / "server.log"
    argv = [H.base_python(), "-m", "sglang.launch_server", "--port", str(port), "--startup-delay", "0.3",
            *(ADAPTIVE if adaptive else BATCHED)]
    with open(log, "ab") as out:
        subprocess.Popen(argv, cwd=d, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                         start_new_session=True)
    H.wait_http(port, timeout=30)
    state = {"port": port, "site": str(site), "target": str(site / "sglang"), "log": str(log), "adaptive": adaptive}
    path.write_text(json.dumps(state))
    print(f"the demo server (the tests' stand-in sglang{', adaptive' if adaptive else ''}) runs on :{port}: "
          + " ".join(argv[1:]))
    print(commands(state))
    return 0


def stop() -> int:
    path = home() / "server.json"
    if not path.exists():
        print("no demo server was started (make demo-server starts one)")
        return 0
    state = json.loads(path.read_text())
    pids = ours(state)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
    deadline = time.monotonic() + 10
    while pids and time.monotonic() < deadline and any(H.alive(p) for p in pids):
        time.sleep(0.1)
    path.unlink()
    print(f"stopped the demo server on :{state['port']}" if pids else "the demo server was not running")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=("start", "stop"))
    ap.add_argument("--adaptive", action="store_true")
    args = ap.parse_args()
    return start(args.adaptive) if args.action == "start" else stop()


if __name__ == "__main__":
    sys.exit(main())
