"""Stand-in for ``python -m sglang.launch_server`` (standard library only): see ../README.md.

It binds its port at once and answers 503 while "loading" (``--startup-delay``), then 200; it has ``--tp N``
children like TP ranks; it imports the worker modules of its tree, so a broken patched worker crashes it at
startup with a traceback and exit status 1; SIGTERM stops it with its children.

``/generate`` takes simulated time that depends on the launch flags (``Speed``), so that a sweep over them has a
best point known in advance; with speculation on it drives the tree's ``EAGLEWorker`` (patched or not) through
its entry method once per simulated cycle, so a patched worker writes real timing records. It takes token ids
(``input_ids``) or ``text``; ``/v1/chat/completions`` serves chat messages the same way (OpenAI's shape, streamed
with a last ``usage`` chunk under ``stream_options.include_usage``, the drafts accepted in
``usage.completion_tokens_details`` as recent sglang releases give them). ``--record-requests FILE``: each POST's
path and JSON body appended to FILE, one line each (``--disaggregation-mode prefill|decode``: recorded, then refused
with 400, as one side of a prefill/decode pair serves no request alone). ``--sim-eos``: a request that does not ``ignore_eos`` stops at
a length its prompt decides (from half its ``max_new_tokens`` to all of it), as a model's end of sequence would.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import pathlib
import queue
import random
import signal
import socket
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
    p.add_argument("--speculative-num-steps", type=int)
    # sglang flags the stand-in reflects in /server_info and in its sglang-like log lines (--sim-sglang-log)
    p.add_argument("--speculative-draft-model-path", "--speculative-draft-model", dest="speculative_draft_model_path")
    p.add_argument("--speculative-eagle-topk", type=int)
    p.add_argument("--speculative-num-draft-tokens", type=int)
    p.add_argument("--speculative-adaptive", action="store_true")
    p.add_argument("--speculative-adaptive-config")
    for flag in ("--enable-dp-attention", "--enable-two-batch-overlap", "--enable-multi-layer-eagle",
                 "--enable-pdmux"):
        p.add_argument(flag, action="store_true")
    p.add_argument("--cuda-graph-max-bs", type=int)
    p.add_argument("--disable-cuda-graph", action="store_true")
    p.add_argument("--disable-overlap-schedule", action="store_true")
    p.add_argument("--disable-custom-all-reduce", action="store_true")
    p.add_argument("--context-length", type=int)
    p.add_argument("--decode-log-interval", type=int, default=40)
    # the stand-in's own
    p.add_argument("--startup-delay", type=float, default=0.0)
    p.add_argument("--ignore-sigterm", action="store_true")
    p.add_argument("--stop-delay", type=float, default=0.0)
    p.add_argument("--ready-endpoint", action="store_true")
    p.add_argument("--accept-length", type=float, default=None)
    p.add_argument("--fail-if-exists", metavar="PATH")
    p.add_argument("--sim-sglang-log", action="store_true")
    p.add_argument("--sim-between-ms", type=float, default=0.0)
    p.add_argument("--record-requests", metavar="FILE")
    p.add_argument("--sim-eos", action="store_true")
    # one side of a prefill/decode pair: it records what it is sent, and serves no request alone (see do_POST)
    p.add_argument("--disaggregation-mode", choices=("null", "prefill", "decode"), default="null")
    # the simulated speed (milliseconds), see Speed
    p.add_argument("--sim-base-ms", type=float, default=5.0)
    p.add_argument("--sim-verify-ms", type=float, default=6.0)
    p.add_argument("--sim-draft-ms", type=float, default=2.0)
    p.add_argument("--sim-extend-ms", type=float, default=1.0)
    p.add_argument("--sim-prefill-ms", type=float, default=2.0)
    # real batching (see Batcher): one scheduler runs every request's cycle together, costs growing with the work
    p.add_argument("--sim-batch", action="store_true")
    p.add_argument("--sim-verify-per-token-ms", type=float, default=0.25)
    p.add_argument("--sim-draft-per-token-ms", type=float, default=0.05)
    p.add_argument("--sim-extend-per-token-ms", type=float, default=0.02)
    p.add_argument("--sim-base-per-req-ms", type=float, default=0.05)
    p.add_argument("--sim-between-per-req-ms", type=float, default=0.02)
    # a multi-node server's flags; they act only with --standin-rendezvous (see Rendezvous)
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--dist-init-addr", "--nccl-init-addr", dest="dist_init_addr")
    p.add_argument("--standin-rendezvous", action="store_true")
    # the server's own count of the requests it holds: sglang's /v1/loads (0.5.x: also the older /get_load);
    # "legacy": /get_load alone, as before /v1/loads; "none": neither, as releases before both
    p.add_argument("--standin-loads", choices=("both", "legacy", "none"), default="both")
    return p.parse_known_args(argv)


class Rendezvous:
    """``--standin-rendezvous`` with ``--nnodes N`` > 1, the nodes of one server meeting as sglang's do at
    ``--dist-init-addr``: node rank 0 listens there and is not ready until the N - 1 other nodes have connected; a
    node of another rank connects to it, retrying until it can, and serves no HTTP. Once met, a node whose peer
    connection is lost exits 1 (``lost``), as a rank whose collective's peer died. Node rank 0 keeps listening, as
    torch's store does: a node that connects later believes it joined, and exits once that old node 0 is gone (a
    node started before the old server was stopped never joins the new one)."""

    def __init__(self, args: argparse.Namespace):
        host, _, port = (args.dist_init_addr or "127.0.0.1:29500").rpartition(":")
        self.addr = (host or "127.0.0.1", int(port))
        self.args = args
        self.done = threading.Event()  # every node met
        self.lost = threading.Event()  # a peer's connection ended after that
        self.listener: socket.socket | None = None
        if args.node_rank == 0:  # bound at start: an address in use fails the start, as torch's store does
            self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.listener.bind(self.addr)
            self.listener.listen(16)

    def start(self) -> None:
        threading.Thread(target=self._accept if self.listener else self._connect, daemon=True).start()

    def _accept(self) -> None:
        peers = []
        while len(peers) < self.args.nnodes - 1:
            conn, _ = self.listener.accept()
            peers.append(conn)
        log(f"all {self.args.nnodes} nodes joined at {self.addr[0]}:{self.addr[1]}")
        self.done.set()
        for conn in peers:
            threading.Thread(target=self._watch, args=(conn,), daemon=True).start()
        while True:  # late joiners: held, never part of this server
            conn, _ = self.listener.accept()
            peers.append(conn)
            log("a node connected to this running server late: it is not part of it")

    def _connect(self) -> None:
        while True:
            try:
                conn = socket.create_connection(self.addr, timeout=1.0)
                break
            except OSError:
                time.sleep(0.2)
        conn.settimeout(None)
        log(f"node rank {self.args.node_rank} joined node rank 0 at {self.addr[0]}:{self.addr[1]}")
        self.done.set()
        self._watch(conn)

    def _watch(self, conn: socket.socket) -> None:
        try:
            while conn.recv(64):
                pass
        except OSError:
            pass
        log("RuntimeError: lost the connection to another node of this server: exiting")
        self.lost.set()


MAX_STEPS = 16  # more speculative steps than this: the stand-in refuses to start (exit 1), as a bad flag would


class Speed:
    """How long the stand-in takes per request, from its launch flags (all times x ``STANDIN_SLOWDOWN`` from the
    environment, default 1).

    - No ``--speculative-algorithm``: one token per ``--sim-base-ms`` (5 ms: 200 tok/s per request).
    - With it, ``--speculative-num-steps K`` (default 3): a decode cycle is draft ``K x --sim-draft-ms`` (2),
      verify ``--sim-verify-ms`` (6) and draft extend ``--sim-extend-ms`` (1) and yields ``min(K, 2.2) + 1``
      tokens (``--accept-length`` overrides): K=1 222 tok/s, K=2 273 (the best), K=3 246, K=5 188.
    - The first token comes from prefill (``--sim-prefill-ms`` + 5 us per input token).
    """

    def __init__(self, args: argparse.Namespace, env: dict):
        self.slow = float(env.get("STANDIN_SLOWDOWN") or 1.0)
        self.spec = bool(args.speculative_algorithm)
        self.steps = args.speculative_num_steps if args.speculative_num_steps is not None else 3
        if args.accept_length is not None:
            self.accept = float(args.accept_length)
        else:
            self.accept = min(self.steps, 2.2) + 1 if self.spec else None
        ms = 0.001 * self.slow
        self.base_s = args.sim_base_ms * ms
        self.verify_s = args.sim_verify_ms * ms
        self.draft_s = args.sim_draft_ms * self.steps * ms
        self.draft_step_s = args.sim_draft_ms * ms  # per draft step (the V2 worker's steps change at run time)
        self.accept_cap = float(args.accept_length) if args.accept_length is not None else 3.2
        self.extend_s = args.sim_extend_ms * ms
        self.between_s = args.sim_between_ms * ms  # the scheduler's own work before each decode cycle
        self.prefill_ms = args.sim_prefill_ms

    def prefill_s(self, input_len: int) -> float:
        return (self.prefill_ms + 0.005 * input_len) * 0.001 * self.slow

    @property
    def cycle_s(self) -> float:
        return self.verify_s + self.draft_s + self.extend_s if self.spec else self.base_s

    def cycles(self, n: int):
        """Tokens produced by each decode cycle after the first (prefill) token, ``n`` tokens in all."""
        left = n - 1
        if not self.spec:
            return [1] * max(0, left)
        out, i = [], 0
        while left > 0:
            k = max(1, int((i + 1) * self.accept) - int(i * self.accept))
            out.append(min(k, left))
            left -= out[-1]
            i += 1
        return out


class _Mode:
    def __init__(self, extend: bool):
        self.extend = extend

    def is_extend(self) -> bool:
        return self.extend

    def is_decode(self) -> bool:
        return not self.extend


class _Batch:
    def __init__(self, extend: bool, produced: int):
        self.forward_mode = _Mode(extend)
        self.reqs = [None]
        self.produced = produced


class _VerifyOut:
    def __init__(self, drafts: int):
        self.accept_length_per_req_cpu = [drafts]


def sglang_log(msg: str) -> None:
    """A line in sglang's own log format (``[YYYY-mm-dd HH:MM:SS] msg``)."""
    print(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {msg}", flush=True)


class DecodeLog:
    """sglang's ``Decode batch`` line, every ``--decode-log-interval`` simulated decode cycles (of any request):
    ``#running-req`` is the number of requests in flight, ``accept len`` the stand-in's accept length (with
    speculation), ``cuda graph`` False with ``--disable-cuda-graph`` or more requests in flight than
    ``--cuda-graph-max-bs``. Only with ``--sim-sglang-log``."""

    def __init__(self, args: argparse.Namespace, speed: Speed):
        self.on = args.sim_sglang_log
        self.args, self.speed = args, speed
        self.lock = threading.Lock()
        self.active = 0
        self.cycles = 0
        self.tokens = 0
        self.since = time.monotonic()

    def request(self, delta: int) -> None:
        with self.lock:
            self.active += delta

    def cycle(self, produced: int) -> None:
        if not self.on:
            return
        with self.lock:
            self.cycles += 1
            self.tokens += produced
            if self.cycles % max(1, self.args.decode_log_interval):
                return
            now = time.monotonic()
            tps = self.tokens / max(now - self.since, 1e-6)
            self.tokens, self.since = 0, now
            running = self.active
        graph = not self.args.disable_cuda_graph and (self.args.cuda_graph_max_bs is None
                                                      or running <= self.args.cuda_graph_max_bs)
        spec = ""
        if self.speed.spec:
            acc = self.speed.accept
            spec = f"accept len: {acc:.2f}, accept rate: {(acc - 1) / max(1, self.speed.steps):.2f}, "
        sglang_log(f"Decode batch, #running-req: {running}, #token: {running * 64}, token usage: 0.00, {spec}"
                   f"cuda graph: {graph}, gen throughput (token/s): {tps:.2f}, #queue-req: 0")


def server_args_line(args: argparse.Namespace) -> str:
    """sglang's start-up ``server_args=ServerArgs(...)`` line, with the fields the stand-in knows."""
    fields = [("model_path", args.model_path), ("context_length", args.context_length), ("port", args.port),
              ("tp_size", args.tp), ("disable_overlap_schedule", args.disable_overlap_schedule),
              ("decode_log_interval", args.decode_log_interval), ("cuda_graph_max_bs", args.cuda_graph_max_bs),
              ("disable_cuda_graph", args.disable_cuda_graph),
              ("disable_custom_all_reduce", args.disable_custom_all_reduce),
              ("speculative_algorithm", args.speculative_algorithm),
              ("speculative_draft_model_path", args.speculative_draft_model_path),
              ("speculative_num_steps", args.speculative_num_steps),
              ("speculative_eagle_topk", args.speculative_eagle_topk),
              ("speculative_num_draft_tokens", args.speculative_num_draft_tokens)]
    return "server_args=ServerArgs(" + ", ".join(f"{k}={v!r}" for k, v in fields) + ")"


class BatchCost:
    """With ``--sim-batch``: what one cycle of ``bs`` requests costs (seconds), growing with the tokens each forward
    processes, as a GPU's forward does (a floor while memory-bound, then per token):

    - verify: ``max(--sim-verify-ms, --sim-verify-per-token-ms x bs x (K + 1))``;
    - the draft: ``K x (--sim-draft-ms / 2 + --sim-draft-per-token-ms x bs)``, a forward per step;
    - the draft extend: ``--sim-extend-ms + --sim-extend-per-token-ms x bs x (K + 1)``;
    - without speculation, a plain decode: ``max(--sim-base-ms, --sim-base-per-req-ms x bs)``, cheaper than verify
      at one token per request;
    - the scheduler's time before each decode cycle: ``--sim-between-ms + --sim-between-per-req-ms x bs``.
    """

    def __init__(self, args: argparse.Namespace, speed: Speed):
        self.a, self.speed = args, speed

    def _s(self, ms: float) -> float:
        return ms * 0.001 * self.speed.slow

    def verify(self, bs: int, k: int) -> float:
        return self._s(max(self.a.sim_verify_ms, self.a.sim_verify_per_token_ms * bs * (k + 1)))

    def draft(self, bs: int, k: int) -> float:
        return self._s(k * (self.a.sim_draft_ms / 2 + self.a.sim_draft_per_token_ms * bs))

    def extend(self, bs: int, k: int) -> float:
        return self._s(self.a.sim_extend_ms + self.a.sim_extend_per_token_ms * bs * (k + 1))

    def plain(self, bs: int) -> float:
        return self._s(max(self.a.sim_base_ms, self.a.sim_base_per_req_ms * bs))

    def between(self, bs: int) -> float:
        return self._s(self.a.sim_between_ms + self.a.sim_between_per_req_ms * bs)


# With --sim-batch the draft's guesses pass by prompt and by position: a request whose prompt hashes even passes
# its first guess at 0.8, odd at 0.5, and each later position at 0.9 times the one before (a chain: the first miss
# ends it). Seeded by the request's prompt and its cycle, so a load is the same each time it is sent.
PASS_RATES = (0.8, 0.5)
PASS_DECAY = 0.9


class _Running:
    """A request in the scheduler's batch: its key (``"<prompt>:<request number>"``: the prompt sets its pass rate,
    the number tells repeats apart), the tokens it wants and has, its decode cycles so far; ``events`` gets
    ``(tokens, cycles)`` after each of its cycles, ``None`` when it is done."""

    def __init__(self, key: str, n: int, prefill_s: float):
        self.key, self.n, self.prefill_s = key, n, prefill_s
        self.done, self.cycles = 0, 0
        self.events: "queue.Queue[tuple[int, int] | None]" = queue.Queue()


class Batcher:
    """``--sim-batch``: one scheduler thread, as sglang's, with continuous batching: each turn it runs one prefill
    cycle of every request that arrived (an extend batch), else one decode cycle of every running request (a decode
    batch of them all, through the worker's entry method with ``len(batch.reqs)`` requests and their per-request
    accepted drafts), priced by ``BatchCost``, the scheduler's own time before each decode cycle. A request leaves
    the batch once it has its tokens."""

    def __init__(self, state: "State"):
        self.state = state
        self.cost = BatchCost(state.args, state.speed)
        self.cond = threading.Condition()
        self.arrived: list[_Running] = []
        self.running: list[_Running] = []
        threading.Thread(target=self._loop, name="scheduler", daemon=True).start()

    def generate(self, key: str, prefill_s: float, n: int, emit, rid: str | None = None) -> tuple[int, int]:
        """One request: ``emit(done, cycles)`` after its prefill (the first token) and once it has its ``n`` tokens
        (a stream of two events, as sglang's ``--stream-interval`` above the output length sends: an event per
        token for every request of a large batch would make the stand-in's own threads, not its simulated GPU, set
        its pace); returns (tokens, decode cycles)."""
        r = _Running(key, n, prefill_s)
        r.req = _Req(rid or key)  # the batch's reqs carry the client's rid (the runtime reads whose each is)
        with self.cond:
            self.arrived.append(r)
            self.cond.notify_all()
        last = None
        while True:
            ev = r.events.get()
            if ev is None:
                if last is not None and last[0] > 1:
                    emit(*last)
                return r.done, r.cycles
            if ev[0] == 1:
                emit(*ev)
            last = ev

    def _tokens(self, r: _Running, k: int) -> int:
        rng = random.Random(f"{r.key}:{r.cycles}")
        rate = PASS_RATES[int(r.key.split(":", 1)[0], 16) % 2]
        n = 1
        while n <= k and rng.random() < rate * PASS_DECAY ** (n - 1):
            n += 1
        return n

    def _loop(self) -> None:
        speed = self.state.speed
        while True:
            with self.cond:
                while not self.arrived and not self.running:
                    self.cond.wait()
                new, self.arrived = self.arrived, []
            if new:
                run_cycle(self.state, True, len(new), sum(r.prefill_s for r in new))
                for r in new:
                    r.done = 1
                    r.events.put((r.done, r.cycles))
                    if r.done >= r.n:
                        r.events.put(None)
                    else:
                        self.running.append(r)
                continue
            batch, bs, k = self.running, len(self.running), speed.steps
            time.sleep(self.cost.between(bs))
            t0 = time.monotonic()
            if speed.spec:
                produced = [self._tokens(r, k) for r in batch]
                seconds = self.cost.draft(bs, k) + self.cost.verify(bs, k) + self.cost.extend(bs, k)
                engine = self.state.engine
                if engine is not None:
                    b = _Batch(False, 0)
                    b.reqs = [getattr(r, "req", None) for r in batch]
                    b.drafts = [p - 1 for p in produced]
                    b.phase_s = (self.cost.draft(bs, k), self.cost.verify(bs, k), self.cost.extend(bs, k))
                    engine(b)
            else:
                produced = [1] * bs
                seconds = self.cost.plain(bs)
            left = seconds - (time.monotonic() - t0)
            if left > 0:
                time.sleep(left)
            still = []
            for r, p in zip(batch, produced):
                r.done += min(p, r.n - r.done)
                r.cycles += 1
                self.state.decode_log.cycle(p)
                r.events.put((r.done, r.cycles))
                if r.done >= r.n:
                    r.events.put(None)
                else:
                    still.append(r)
            self.running = still


def make_engine(speed: Speed):
    """The tree's ``EAGLEWorker`` with simulated phases (each sleeps its share of the cycle), or None when the
    tree has none or speculation is off. Whatever the worker's entry method does, the cycle takes its full time
    (the rest is slept after the call)."""
    if not speed.spec:
        return None
    mod = sys.modules.get("sglang.srt.speculative.eagle_worker")
    base = getattr(mod, "EAGLEWorker", None)
    if not isinstance(base, type):
        return None

    class SimWorker(base):  # type: ignore[misc,valid-type]
        def __init__(self):  # the real one loads models
            pass

        def forward_target_extend(self, batch):
            time.sleep(batch.prefill_s)
            return None, None, None

        def forward_draft_extend(self, batch, *rest):
            return None

        def draft(self, batch):
            time.sleep(batch.phase_s[0] if hasattr(batch, "phase_s") else speed.draft_s)
            return None

        def verify(self, batch, spec_info=None):
            time.sleep(batch.phase_s[1] if hasattr(batch, "phase_s") else speed.verify_s)
            out = _VerifyOut(batch.produced - 1)
            if hasattr(batch, "drafts"):  # a batch of several requests (--sim-batch): each one's accepted drafts
                out.accept_length_per_req_cpu = list(batch.drafts)
            return None, out, None

        def forward_draft_extend_after_decode(self, batch):
            time.sleep(batch.phase_s[2] if hasattr(batch, "phase_s") else speed.extend_s)

    worker = SimWorker()
    entry = getattr(worker, "forward_batch_generation", None)
    return entry if callable(entry) else None


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
        self.speed = Speed(args, os.environ)
        self.decode_log = DecodeLog(args, self.speed)
        self.engine = None  # the worker's entry method, once imported (make_engine)
        self.v2 = None  # the tree's EAGLEWorkerV2 with simulated phases, when it has one (make_v2)
        self.t0 = time.monotonic()
        self.requests = 0
        self.lock = threading.Lock()
        self.imported = False  # the worker modules are imported (the "model" is loaded)
        self.batcher: Batcher | None = None  # --sim-batch: the scheduler, once the worker is imported
        self.rendezvous: Rendezvous | None = None  # --standin-rendezvous of a multi-node server

    @property
    def ready(self) -> bool:
        met = self.rendezvous is None or self.rendezvous.done.is_set()
        return self.imported and met and time.monotonic() - self.t0 >= self.args.startup_delay


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
                        "speculative_draft_model_path": args.speculative_draft_model_path,
                        "speculative_num_steps": (state.speed.steps if args.speculative_algorithm else None),
                        "speculative_eagle_topk": args.speculative_eagle_topk,
                        "cuda_graph_max_bs": args.cuda_graph_max_bs,
                        "disable_cuda_graph": args.disable_cuda_graph,
                        "disable_overlap_schedule": args.disable_overlap_schedule,
                        "disable_custom_all_reduce": args.disable_custom_all_reduce,
                        "context_length": args.context_length,
                        "disaggregation_mode": args.disaggregation_mode,
                        "pid": os.getpid(),
                        "argv": sys.argv,
                        "internal_states": [{"avg_spec_accept_length": state.speed.accept or 0.0}],
                    },
                )
            if path == "/v1/loads" and args.standin_loads == "both":
                return self._send(200, {"timestamp": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
                                        "version": "0.0.0+stand-in",
                                        "loads": [{"dp_rank": 0, "num_running_reqs": state.decode_log.active,
                                                   "num_waiting_reqs": 0, "num_total_tokens": 0}]})
            if path == "/get_load" and args.standin_loads != "none":
                return self._send(200, [{"dp_rank": 0, "num_reqs": state.decode_log.active, "num_waiting_reqs": 0,
                                         "num_tokens": 0, "num_pending_tokens": 0, "ts_tic": time.monotonic()}])
            if path == "/v1/models":
                return self._send(200, {"object": "list", "data": [{"id": args.served_model_name or args.model_path}]})
            return self._send(404, {"detail": "Not Found"})

        def setup(self) -> None:
            super().setup()
            # as uvicorn does: a streamed answer's small chunks go out at once, not after the last one's ACK
            self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def parse_request(self) -> bool:
            # e2e_latency counts from the request's arrival (its first line read), as sglang counts from its
            # tokenizer manager's receipt of it
            self.arrived = time.monotonic()
            return super().parse_request()

        def do_POST(self) -> None:
            path = self.path.split("?", 1)[0]
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            if not self._authorized():
                return self._send(401, {"error": "unauthorized"})
            if path == "/flush_cache":
                return self._send(200, {})
            if path not in ("/generate", "/v1/chat/completions"):
                return self._send(404, {"detail": "Not Found"})
            if not state.ready:
                return self._send(503, {"detail": "loading"})
            try:
                req = json.loads(raw or b"{}")
            except ValueError:
                return self._send(400, {"error": "bad JSON"})
            record(state, path, req)
            if args.disaggregation_mode != "null":
                # as sglang's side of a pair answers a request that no router prepared (no bootstrap room)
                return self._send(400, {"error": f"the {args.disaggregation_mode} side of a prefill/decode pair "
                                                 "serves no request alone: send it through the router"})
            name = req.get("rid") if isinstance(req.get("rid"), str) else None
            if path == "/v1/chat/completions":
                return self._chat(req, name)
            texts = req.get("text", req.get("input_ids", ""))
            batch = isinstance(texts, list) and (not texts or not isinstance(texts[0], int))
            items = texts if batch else [texts]
            sp = req.get("sampling_params") or {}
            n = max(1, int(sp.get("max_new_tokens", 16)))
            if req.get("stream") and not batch:
                return self._stream(items[0], eos_cut(state, items[0], n, sp.get("ignore_eos")), name)
            out = [self._generate(item, eos_cut(state, item, n, sp.get("ignore_eos")), name=name if not batch else None)
                   for item in items]
            return self._send(200, out if batch else out[0])

        def _chat(self, req: dict, name: str | None) -> None:
            """OpenAI's chat completion: the messages are the prompt (their text hashed as /generate's is); streamed,
            a chunk with the role, one per decode step with the new text as ``delta.content``, a last one with
            ``finish_reason``, then (``stream_options.include_usage``) one with ``usage`` and no choices."""
            msgs = req.get("messages")
            if not isinstance(msgs, list) or not msgs:
                return self._send(400, {"object": "error", "message": "messages: a non-empty list", "code": 400})
            n = max(1, int(req.get("max_tokens") or req.get("max_completion_tokens") or 16))
            n = eos_cut(state, msgs, n, req.get("ignore_eos"))
            cid, model = f"chatcmpl-stand-in-{state.requests + 1}", args.served_model_name or args.model_path

            def usage(d: dict) -> dict:
                meta = d["meta_info"]
                u = {"prompt_tokens": meta["prompt_tokens"], "completion_tokens": meta["completion_tokens"],
                     "total_tokens": meta["prompt_tokens"] + meta["completion_tokens"]}
                if "spec_verify_ct" in meta:  # the drafts accepted: every token but prefill's and each cycle's own
                    accepted = max(0, meta["completion_tokens"] - 1 - meta["spec_verify_ct"])
                    u["completion_tokens_details"] = {"accepted_prediction_tokens": accepted,
                                                      "rejected_prediction_tokens": 0}
                return u

            def chunk_doc(choices: list, **more) -> dict:
                return {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
                        "choices": choices, **more}

            if not req.get("stream"):
                d = self._generate(msgs, n, name=name)
                return self._send(200, {
                    "id": cid, "object": "chat.completion", "created": int(time.time()), "model": model,
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": d["text"]},
                                 "finish_reason": "length"}], "usage": usage(d)})
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()

            def send(doc: dict) -> None:
                data = b"data: " + json.dumps(doc).encode() + b"\n\n"
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

            seen = {"text": ""}

            def step(d: dict) -> None:
                new = d["text"][len(seen["text"]):]
                seen["text"] = d["text"]
                if new:
                    send(chunk_doc([{"index": 0, "delta": {"content": new}, "finish_reason": None}]))

            try:
                send(chunk_doc([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]))
                last = self._generate(msgs, n, step, name)
                send(chunk_doc([{"index": 0, "delta": {}, "finish_reason": "length"}]))
                if (req.get("stream_options") or {}).get("include_usage"):
                    send(chunk_doc([], usage=usage(last)))
                data = b"data: [DONE]\n\n"
                self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data))
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

        def _generate(self, item: object, n: int, emit=None, name: str | None = None) -> dict:
            """Simulate one request (prefill, then decode cycles), calling ``emit(doc)`` after each step; ``name``:
            the request id the client gave (``"rid"``)."""
            speed = state.speed
            with state.lock:
                state.requests += 1
                rid = state.requests
            t = self.arrived
            prompt_tokens = prompt_len(item)

            def doc(done: int, cycles: int) -> dict:
                meta = {"id": name or f"stand-in-{rid}", "prompt_tokens": prompt_tokens, "completion_tokens": done,
                        "e2e_latency": time.monotonic() - t}
                if speed.accept is not None:  # the V2 worker's steps change at run time: what its cycles gave
                    meta["spec_accept_length"] = (done / cycles if (state.v2 is not None or state.batcher is not None)
                                                  and cycles else speed.accept)
                    meta["spec_verify_ct"] = cycles
                return {"text": " tok" * done, "meta_info": meta}

            state.decode_log.request(1)
            if state.batcher is not None:
                key = f"{prompt_key(item)}:{rid}"  # the prompt decides the pass rates; rid tells repeats apart
                try:
                    done, cycles = state.batcher.generate(
                        key, speed.prefill_s(prompt_tokens), n,
                        lambda done, cycles: emit(doc(done, cycles)) if emit else None, name or f"stand-in-{rid}")
                    return doc(done, cycles)
                finally:
                    state.decode_log.request(-1)
            if state.v2 is not None:
                try:
                    return run_v2_request(state, _Req(name or f"stand-in-{rid}"), speed.prefill_s(prompt_tokens),
                                          n, lambda done, cycles: emit(doc(done, cycles)) if emit else None,
                                          lambda done, cycles: doc(done, cycles))
                finally:
                    state.decode_log.request(-1)
            try:
                run_cycle(state, True, 1, speed.prefill_s(prompt_tokens))
                done = 1
                if emit is not None:
                    emit(doc(done, 0))
                cycles = speed.cycles(n)
                for i, k in enumerate(cycles):
                    run_cycle(state, False, k, speed.cycle_s)
                    state.decode_log.cycle(k)
                    done += k
                    if emit is not None:
                        emit(doc(done, i + 1))
                return doc(done, len(cycles))
            finally:
                state.decode_log.request(-1)

        def _stream(self, item: object, n: int, name: str | None = None) -> None:
            """sglang's streamed /generate: server-sent events, ``data: {...}`` per step, then ``data: [DONE]``,
            in HTTP/1.1 chunks on a connection that stays open for the next request (as uvicorn serves it)."""
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()

            def chunk(data: bytes) -> None:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

            try:
                self._generate(item, n, lambda d: chunk(b"data: " + json.dumps(d).encode() + b"\n\n"), name)
                chunk(b"data: [DONE]\n\n")
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

    return Handler


class _Req:
    """sglang's ``Req``, as far as a worker looks at it: its id (the client's ``rid``), and here the fraction of a
    token its accept length has left over."""

    def __init__(self, rid: str):
        self.rid = rid
        self.frac = 0.0


class _Lens:
    def __init__(self, n: int):
        self.shape = (n,)


class _V2Batch:
    """A ``ScheduleBatch`` of one request, as EAGLEWorkerV2's entry method reads it."""

    def __init__(self, extend: bool, req: _Req, prefill_s: float = 0.0):
        self.forward_mode = _Mode(extend)
        self.is_extend_in_batch = extend
        self.reqs = [req]
        self.seq_lens = _Lens(1)
        self.spec_info = None
        self.prefill_s = prefill_s


class _V2Out:
    def __init__(self):
        self.accept_lens = None
        self.next_draft_input = None


def make_v2(args: argparse.Namespace, speed: Speed):
    """The tree's ``EAGLEWorkerV2`` (sglang/srt/speculative/eagle_worker_v2.py) with simulated phases, or None when
    the tree has none or speculation is off. Its draft takes ``--sim-draft-ms`` per step of the steps it runs at
    that cycle (they change at run time with ``--speculative-adaptive``), verify ``--sim-verify-ms``, the draft
    extend ``--sim-extend-ms``; a cycle at K steps yields ``min(K + 1, X)`` tokens on average (X:
    ``--accept-length``, default 3.2). As sglang 0.5.16 does: adaptive mode is turned off, with a warning, for the
    shapes ``adaptive_unsupported_reason`` names; ``--speculative-num-steps`` must be a candidate; a candidate
    above it crashes the start-up (the worker's build_adaptive_runtime_state)."""
    if not speed.spec:
        return None
    mod = sys.modules.get("sglang.srt.speculative.eagle_worker_v2")
    base = getattr(mod, "EAGLEWorkerV2", None)
    if not isinstance(base, type):
        return None
    algo = {"NEXTN": "EAGLE"}.get((args.speculative_algorithm or "").upper(), args.speculative_algorithm)
    sa = argparse.Namespace(
        speculative_algorithm=algo, speculative_eagle_topk=args.speculative_eagle_topk,
        speculative_num_steps=args.speculative_num_steps, speculative_adaptive=args.speculative_adaptive,
        speculative_adaptive_config=args.speculative_adaptive_config,
        enable_dp_attention=args.enable_dp_attention, enable_two_batch_overlap=args.enable_two_batch_overlap,
        enable_multi_layer_eagle=args.enable_multi_layer_eagle, enable_pdmux=args.enable_pdmux)
    if sa.speculative_adaptive:
        params = importlib.import_module("sglang.srt.speculative.adaptive_spec_params")
        reason = params.adaptive_unsupported_reason(sa)
        if reason is not None:
            log(f"WARNING speculative_adaptive disabled: {reason}. Falling back to static speculative params.")
            sa.speculative_adaptive = False
        else:
            candidates = params.resolve_candidate_steps_from_config(sa.speculative_adaptive_config)
            if sa.speculative_num_steps is None:
                sa.speculative_num_steps = candidates[len(candidates) // 2]
            if sa.speculative_num_steps not in candidates:
                raise ValueError(f"--speculative-num-steps={sa.speculative_num_steps} is not in the adaptive config "
                                 f"candidate_steps {candidates}. Pass one of those values.")
    if sa.speculative_num_steps is None:
        sa.speculative_num_steps = speed.steps
    sa.speculative_num_draft_tokens = sa.speculative_num_steps + 1

    class SimTarget:
        def forward_batch_generation(self, batch):
            time.sleep(batch.prefill_s)
            return _V2Out()

    class SimDraft:
        speculative_num_steps = sa.speculative_num_steps

        def draft(self, batch):
            time.sleep(speed.draft_step_s * self.speculative_num_steps)
            return None

        def _draft_extend_for_prefill(self, batch, batch_output):
            return None

        def _draft_extend_for_decode(self, batch, batch_output):
            time.sleep(speed.extend_s)

    class SimWorkerV2(base):  # type: ignore[misc,valid-type]
        def verify(self, batch):
            time.sleep(speed.verify_s)
            req = batch.reqs[0]
            req.frac += min(self.speculative_num_steps + 1.0, speed.accept_cap)
            tokens = max(1, int(req.frac))
            req.frac -= tokens
            out = _V2Out()
            out.accept_lens = [tokens]
            return out

    worker = SimWorkerV2(sa, SimTarget(), SimDraft())
    log(f"EAGLEWorkerV2: steps {worker.speculative_num_steps}, adaptive "
        f"{'on: candidates ' + str(worker.adaptive_controller.candidate_steps) if worker.adaptive_controller else 'off'}")
    return worker


def run_v2_request(state: "State", req: _Req, prefill_s: float, n: int, emit, doc) -> dict:
    """One request through the V2 worker: a prefill cycle (the first token), then decode cycles until ``n`` tokens,
    each followed by what sglang's scheduler does with its result (``on_verify_complete_cpu``: the adaptive
    policy learns); ``emit(done, cycles)`` after each step. Returns ``doc(done, cycles)`` at the end."""
    worker = state.v2
    worker.forward_batch_generation(_V2Batch(True, req, prefill_s))
    done, cycles = 1, 0
    emit(done, cycles)
    while done < n:
        if state.speed.between_s > 0:
            time.sleep(state.speed.between_s)
        out = worker.forward_batch_generation(_V2Batch(False, req))
        produced = out.accept_lens[0]
        worker.on_verify_complete_cpu([produced - 1], batch_size=1)
        done += min(produced, n - done)
        cycles += 1
        state.decode_log.cycle(produced)
        emit(done, cycles)
    return doc(done, cycles)


def prompt_len(item: object) -> int:
    """A prompt's tokens: token ids counted, a text's or chat messages' words."""
    if isinstance(item, list) and all(isinstance(x, int) for x in item):
        return len(item)
    if isinstance(item, list):
        return max(1, sum(len(str(m.get("content", "")).split()) if isinstance(m, dict) else 1 for m in item))
    return max(1, len(str(item).split()))


def eos_cut(state: "State", item: object, n: int, ignore_eos: object) -> int:
    """With ``--sim-eos``, a request that does not ignore the end of sequence ends where its prompt decides: from
    half of ``n`` to ``n`` tokens; else ``n``."""
    if not state.args.sim_eos or ignore_eos or n < 2:
        return n
    return n // 2 + int(prompt_key(item), 16) % (n - n // 2 + 1)


def record(state: "State", path: str, body: object) -> None:
    """``--record-requests FILE``: the request's path and JSON body appended to FILE, a line each."""
    if not state.args.record_requests:
        return
    line = json.dumps({"path": path, "body": body}) + "\n"
    with state.lock:
        with open(state.args.record_requests, "a", encoding="utf-8") as f:
            f.write(line)


def prompt_key(item: object) -> str:
    """A request's prompt as a key (its token ids or its text)."""
    return hashlib.sha256(json.dumps(item, sort_keys=True).encode()).hexdigest()[:16]


def run_cycle(state: "State", extend: bool, produced: int, seconds: float) -> None:
    """One simulated forward step that takes ``seconds``: through the worker's entry method when there is one
    (its phases sleep their parts), the rest slept after it; a decode cycle is preceded by the scheduler's own work
    (``--sim-between-ms``, outside the entry method)."""
    if not extend and state.speed.between_s > 0:
        time.sleep(state.speed.between_s)
    t0 = time.monotonic()
    engine = state.engine
    if engine is not None:
        b = _Batch(extend, produced)
        b.prefill_s = seconds
        try:
            engine(b)
        except Exception as exc:  # a worker of another shape: the cycle is still simulated
            if not getattr(state, "engine_error", None):
                state.engine_error = exc
                log(f"the worker's entry method failed ({type(exc).__name__}: {exc}); simulating without it")
            state.engine = None
    left = seconds - (time.monotonic() - t0)
    if left > 0:
        time.sleep(left)


def main(argv: list[str] | None = None) -> int:
    args, unknown = parse(sys.argv[1:] if argv is None else argv)
    log(f"starting pid={os.getpid()} port={args.port} tp={args.tp} cwd={os.getcwd()} argv={sys.argv!r}")
    if args.fail_if_exists and os.path.exists(args.fail_if_exists):
        log(f"RuntimeError: {args.fail_if_exists} exists: this server cannot start again")
        return 1
    if unknown:
        log(f"ignoring flags: {' '.join(unknown)}")
    stop = threading.Event()
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    state = State(args, unknown)
    if args.sim_sglang_log:
        sglang_log(server_args_line(args))
    if args.standin_rendezvous and args.nnodes > 1:
        try:
            state.rendezvous = Rendezvous(args)
        except OSError as exc:
            log(f"RuntimeError: cannot listen at --dist-init-addr {args.dist_init_addr}: {exc}")
            return 1
    httpd = None
    if state.rendezvous is None or args.node_rank == 0:  # a node of another rank serves no HTTP
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
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()
        return code

    if state.speed.spec and not 1 <= state.speed.steps <= MAX_STEPS:
        log(f"ValueError: --speculative-num-steps {state.speed.steps} is out of range (1..{MAX_STEPS})")
        return shutdown(1)
    try:
        import_workers()
        state.v2 = make_v2(args, state.speed)
        state.engine = None if state.v2 is not None else make_engine(state.speed)
        if args.sim_batch and state.v2 is None:
            state.batcher = Batcher(state)
        state.imported = True
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        log("worker import failed: exiting")
        return shutdown(1)

    log(f"loading weights for {args.startup_delay:.1f} s")
    if state.rendezvous is not None:
        state.rendezvous.start()
    announced = False
    while not stop.wait(0.1):
        if state.rendezvous is not None and state.rendezvous.lost.is_set():
            time.sleep(max(0.0, args.stop_delay))  # --stop-delay: it lets go of its ports slowly here too
            return shutdown(1)
        if not announced and state.ready:
            log("The server is fired up and ready to roll!")
            announced = True
    log(f"stopping: {len(children)} TP ranks")
    if args.stop_delay > 0:  # a model server that takes its time to let go of the GPU and its port
        time.sleep(args.stop_delay)
    return shutdown(0)


if __name__ == "__main__":
    sys.exit(main())
