"""Stand-in for ``python -m sglang.launch_server`` (standard library only): see ../README.md.

It binds its port at once and answers 503 while "loading" (``--startup-delay``), then 200; it has ``--tp N``
children like TP ranks; it imports the worker modules of its tree, so a broken patched worker crashes it at
startup with a traceback and exit status 1; SIGTERM stops it with its children.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# A TP-rank-like child: sleeps, exits on SIGTERM, and exits by itself when its parent is gone.
CHILD = r"""
import os, signal, sys, time
parent = int(sys.argv[1])
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
while os.getppid() == parent:
    time.sleep(0.2)
"""


def log(msg: str) -> None:
    print(f"[stand-in {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(prog="python -m sglang.launch_server (stand-in)", allow_abbrev=False)
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--model-path", "--model", dest="model_path", default="stand-in/model")
    p.add_argument("--served-model-name")
    p.add_argument("--tp", "--tp-size", "--tensor-parallel-size", dest="tp", type=int, default=1)
    p.add_argument("--api-key")
    p.add_argument("--speculative-algorithm")
    # the stand-in's own
    p.add_argument("--startup-delay", type=float, default=0.0)
    p.add_argument("--ignore-sigterm", action="store_true")
    p.add_argument("--ready-endpoint", action="store_true")
    p.add_argument("--accept-length", type=float, default=3.0)
    return p.parse_known_args(argv)


def import_workers() -> list[str]:
    """Import every ``sglang/srt/speculative/*worker*.py`` of this tree (``eagle_worker`` first)."""
    spec_dir = pathlib.Path(__file__).resolve().parent / "srt" / "speculative"
    if not spec_dir.is_dir():
        return []
    names = sorted(p.stem for p in spec_dir.glob("*worker*.py"))
    names.sort(key=lambda n: n != "eagle_worker")
    for name in names:
        importlib.import_module(f"sglang.srt.speculative.{name}")
        log(f"imported sglang.srt.speculative.{name}")
    return names


class State:
    def __init__(self, args: argparse.Namespace, unknown: list[str]):
        self.args = args
        self.unknown = unknown
        self.t0 = time.monotonic()
        self.requests = 0
        self.lock = threading.Lock()
        self.imported = False  # the worker modules are imported (the "model" is loaded)

    @property
    def ready(self) -> bool:
        return self.imported and time.monotonic() - self.t0 >= self.args.startup_delay


def make_handler(state: State) -> type[BaseHTTPRequestHandler]:
    args = state.args

    class Handler(BaseHTTPRequestHandler):
        server_version = "stand-in-sglang/0.0.0"
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt: str, *a: object) -> None:  # one line per request, on stdout
            log(f"{self.address_string()} {fmt % a}")

        def _send(self, code: int, body: object = None) -> None:
            data = b"" if body is None else json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorized(self) -> bool:
            if not args.api_key or self.path.startswith("/health"):
                return True
            return self.headers.get("Authorization", "") == f"Bearer {args.api_key}"

        def _health(self) -> None:
            self._send(200 if state.ready else 503, {} if state.ready else {"detail": "loading"})

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if not self._authorized():
                return self._send(401, {"error": "unauthorized"})
            if path == "/health":
                return self._health()
            if path == "/health_generate":
                return self._send(404, {"detail": "Not Found"}) if args.ready_endpoint else self._health()
            if path == "/ready":
                return self._health() if args.ready_endpoint else self._send(404, {"detail": "Not Found"})
            if path in ("/get_server_info", "/server_info"):
                return self._send(
                    200,
                    {
                        "version": "0.0.0+stand-in",
                        "model_path": args.model_path,
                        "tp_size": args.tp,
                        "port": args.port,
                        "speculative_algorithm": args.speculative_algorithm,
                        "pid": os.getpid(),
                        "argv": sys.argv,
                        "internal_states": [{"avg_spec_accept_length": args.accept_length}],
                    },
                )
            if path == "/v1/models":
                return self._send(200, {"object": "list", "data": [{"id": args.served_model_name or args.model_path}]})
            return self._send(404, {"detail": "Not Found"})

        def do_POST(self) -> None:
            path = self.path.split("?", 1)[0]
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            if not self._authorized():
                return self._send(401, {"error": "unauthorized"})
            if path == "/flush_cache":
                return self._send(200, {})
            if path != "/generate":
                return self._send(404, {"detail": "Not Found"})
            if not state.ready:
                return self._send(503, {"detail": "loading"})
            try:
                req = json.loads(raw or b"{}")
            except ValueError:
                return self._send(400, {"error": "bad JSON"})
            texts = req.get("text", req.get("input_ids", ""))
            batch = isinstance(texts, list) and (not texts or not isinstance(texts[0], int))
            items = texts if batch else [texts]
            n = int((req.get("sampling_params") or {}).get("max_new_tokens", 16))
            out = []
            for item in items:
                with state.lock:
                    state.requests += 1
                    rid = state.requests
                t = time.monotonic()
                prompt_tokens = len(item) if isinstance(item, list) else max(1, len(str(item).split()))
                out.append(
                    {
                        "text": " tok" * n,
                        "meta_info": {
                            "id": f"stand-in-{rid}",
                            "prompt_tokens": prompt_tokens,
                            "completion_tokens": n,
                            "spec_accept_length": args.accept_length,
                            "spec_verify_ct": math.ceil(n / args.accept_length) if args.accept_length else 0,
                            "e2e_latency": time.monotonic() - t,
                        },
                    }
                )
            return self._send(200, out if batch else out[0])

    return Handler


def main(argv: list[str] | None = None) -> int:
    args, unknown = parse(sys.argv[1:] if argv is None else argv)
    log(f"starting pid={os.getpid()} port={args.port} tp={args.tp} cwd={os.getcwd()} argv={sys.argv!r}")
    if unknown:
        log(f"ignoring flags: {' '.join(unknown)}")
    stop = threading.Event()
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    state = State(args, unknown)
    # bind at once (a second server on the port fails here, like sglang's), answer 503 while "loading"
    httpd = ThreadingHTTPServer((args.host, args.port), make_handler(state))
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, name="http", daemon=True).start()

    children = [
        subprocess.Popen([sys.executable, "-c", CHILD, str(os.getpid()), f"tp_rank={rank}"], stdin=subprocess.DEVNULL)
        for rank in range(max(0, args.tp))
    ]
    log(f"TP ranks: {' '.join(str(c.pid) for c in children)}")

    def shutdown(code: int) -> int:
        for c in children:
            if c.poll() is None:
                c.terminate()
        deadline = time.monotonic() + 5
        for c in children:
            try:
                c.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                c.kill()
        httpd.shutdown()
        httpd.server_close()
        return code

    try:
        import_workers()
        state.imported = True
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        log("worker import failed: exiting")
        return shutdown(1)

    log(f"loading weights for {args.startup_delay:.1f} s")
    announced = False
    while not stop.wait(0.1):
        if not announced and state.ready:
            log("The server is fired up and ready to roll!")
            announced = True
    log(f"stopping: {len(children)} TP ranks")
    return shutdown(0)


if __name__ == "__main__":
    sys.exit(main())
