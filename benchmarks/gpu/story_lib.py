"""What the GPU stories of the known-acceptance testbed share: the clock and budget, running the installed
eaglepatch, launching and stopping an sglang server as a user would, and a bench through eaglepatch.

Run on the GPU machine after benchmarks/gpu/prelude.sh (the testbed's bundle in /tmp/site, eaglepatch installed in
/tmp/ep). Env: OUT (results), T0 (epoch start), BUDGET (seconds from T0).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

OUT = Path(os.environ.get("OUT", "/tmp/eagle_out"))
T0 = float(os.environ.get("T0", time.time()))
BUDGET = float(os.environ.get("BUDGET", "520"))
PY = sys.executable
SITE = Path("/tmp/site")
TARGET = str(SITE / "sglang")
LOG_DIR = "/tmp/eplogs"
PORT = 30000
# eaglepatch as installed (cwd /tmp: python -m puts the cwd first, and the checkout's source tree lacks the recipes)
EP_ENV = dict(os.environ, PYTHONPATH="/tmp/ep", XDG_CACHE_HOME="/tmp/epcache")
COMMON = ["--attention-backend", "triton", "--sampling-backend", "pytorch", "--grammar-backend", "none",
          "--port", str(PORT), "--mem-fraction-static", "0.5", "--trust-remote-code"]
story: dict = {"steps": [], "launches": []}


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def left() -> float:
    return T0 + BUDGET - time.time()


def ep(*args: str, timeout: float = 300) -> tuple[int, str, str]:
    """Run ``eaglepatch ARGS`` (the installed one), record it in the story; (exit code, stdout, stderr)."""
    t = time.time()
    try:
        p = subprocess.run([PY, "-m", "eaglepatch", *args], env=EP_ENV, cwd="/tmp", stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, timeout=timeout)
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as exc:
        out, err = exc.stdout or "", exc.stderr or ""  # bytes, even with text=True (CPython's TimeoutExpired)
        out = out.decode(errors="replace") if isinstance(out, bytes) else out
        err = (err.decode(errors="replace") if isinstance(err, bytes) else err) + "\n(timed out)"
        rc = 124
    log(f"$ eaglepatch {' '.join(args)}: exit {rc} in {time.time() - t:.1f}s")
    for line in err.strip().splitlines()[-5:]:
        print("  | " + line, flush=True)
    story["steps"].append({"cmd": "eaglepatch " + " ".join(args), "rc": rc, "seconds": round(time.time() - t, 1),
                           "stderr_tail": err[-1500:]})
    return rc, out, err


def health() -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health_generate", timeout=10) as r:
            return r.status == 200
    except Exception:
        return False


def server_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_CACHE_HOME", "PYTHONPATH")}
    env["PYTHONPATH"] = str(SITE)
    env["SGLANG_ENABLE_JIT_DEEPGEMM"] = "0"
    return env


def spec_flags(mdir: str, steps: int) -> list[str]:
    """EAGLE3 at ``steps`` draft steps, top-k 1 (a chain: steps + 1 draft tokens); none at 0 steps."""
    if steps == 0:
        return []
    return ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", f"{mdir}/draft",
            "--speculative-num-steps", str(steps), "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", str(steps + 1)]


class Server:
    """One launch: ``python -m sglang.launch_server`` detached in its own session, its output in
    ``$OUT/server_<name>.log``; ``up()`` waits for /health_generate."""

    def __init__(self, name: str, argv: list[str]):
        self.name, self.argv = name, argv
        self.rec: dict = {"name": name, "argv": argv}
        story["launches"].append(self.rec)
        self.logpath = OUT / f"server_{name}.log"
        self.p: subprocess.Popen | None = None

    def up(self, limit: float) -> bool:
        logf = open(self.logpath, "a")
        t = time.time()
        log(f"{self.name}: launching")
        self.p = subprocess.Popen(self.argv, stdout=logf, stderr=subprocess.STDOUT, env=server_env(), cwd="/tmp",
                                  start_new_session=True)
        while time.time() - t < limit:
            if self.p.poll() is not None:
                self.rec.update(status="died", log_tail=tail(self.logpath))
                log(f"{self.name}: died at start (exit {self.p.returncode})")
                return False
            if health():
                self.rec["ready_s"] = round(time.time() - t, 1)
                self.rec["status"] = "ok"
                log(f"{self.name}: ready after {self.rec['ready_s']} s")
                return True
            time.sleep(1)
        self.rec.update(status="timeout", log_tail=tail(self.logpath))
        log(f"{self.name}: not ready in {limit:.0f} s")
        return False

    def down(self) -> None:
        if self.p is None:
            return
        for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.p.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.p.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        for _ in range(40):
            if not health():
                break
            time.sleep(0.5)
        time.sleep(1)


def tail(path: Path, n: int = 40) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-n:]
    except OSError:
        return []


def bench(requests: int, concurrency: int, max_new: int, warmup: int = 2, timeout: float = 240) -> dict | None:
    """``eaglepatch bench --json`` against the target: the client's figures and the timing report (with the
    prediction) of the same window; None when it failed."""
    rc, out, _ = ep("bench", TARGET, "--requests", str(requests), "--concurrency", str(concurrency),
                    "--max-new-tokens", str(max_new), "--input-len", "64", "--warmup", str(warmup),
                    "--log-wait", "3", "--json", timeout=timeout)
    if rc != 0:
        return None
    return json.loads(out)


def decode_group(b: dict | None) -> dict | None:
    """The decode group of a bench's timing report."""
    groups = ((b or {}).get("timings") or {}).get("groups") or []
    return next((g for g in groups if g["mode"] == "decode"), None)


def make_known(mdir: str, p: float, shape: str) -> dict | None:
    """The models of known acceptance ``p`` (benchmarks/gpu/make_known_models.py, ``--shape``) in ``mdir``, made
    unless there; what making them took (``{"seconds", "rc", "out_tail"}``), None when they were there. Exits when
    they could not be made."""
    if os.path.exists(f"{mdir}/known.json"):
        return None
    t = time.time()
    r = subprocess.run([PY, str(Path(__file__).resolve().parent / "make_known_models.py"), "--out", mdir, "--p",
                        str(p), "--check", "--shape", shape], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, env=dict(os.environ, PYTHONPATH=str(SITE)))
    print(r.stdout[-1500:], flush=True)
    if r.returncode:
        raise SystemExit(f"make_known_models ({shape}, p {p}) failed")
    return {"seconds": round(time.time() - t, 1), "rc": r.returncode, "out_tail": r.stdout[-800:]}


def save(name: str) -> None:
    story["elapsed_s"] = round(time.time() - T0, 1)
    (OUT / f"{name}.json").write_text(json.dumps(story, indent=1))


def make_known_regions(mdir: str, regions: str, shape: str, seed: str | None = None) -> dict | None:
    """``make_known`` for the models of two regions (make_known_models.py ``--regions PA,PB``; ``seed``: its
    ``--seed``, else it picks one): made unless ``mdir/known.json`` is there (None then), else what making them took
    (``{"seconds", "rc", "out_tail"}``). Exits when they could not be made."""
    if os.path.exists(f"{mdir}/known.json"):
        return None
    t = time.time()
    args = [PY, str(Path(__file__).resolve().parent / "make_known_models.py"), "--out", mdir, "--regions", regions,
            "--check", "--shape", shape, *(["--seed", seed] if seed else [])]
    r = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       env=dict(os.environ, PYTHONPATH=str(SITE)))
    print(r.stdout[-1500:], flush=True)
    if r.returncode:
        raise SystemExit(f"make_known_models ({shape}, regions {regions}) failed")
    return {"seconds": round(time.time() - t, 1), "rc": r.returncode, "out_tail": r.stdout[-800:]}


def bench_prompts(prompts: str, requests: int, concurrency: int, max_new: int, warmup: int = 4,
                  log_wait: float = 3, timeout: float = 240, extra: tuple[str, ...] = ()) -> tuple[dict | None, str]:
    """``eaglepatch bench --prompts PROMPTS --ignore-eos --json`` against the target, ``requests`` exactly:
    (its JSON, None when it failed; its stderr)."""
    rc, out, err = ep("bench", TARGET, "--prompts", prompts, "--ignore-eos", "--requests", str(requests),
                      "--concurrency", str(concurrency), "--max-new-tokens", str(max_new), "--warmup", str(warmup),
                      "--log-wait", str(log_wait), *extra, "--json", timeout=timeout)
    if rc != 0:
        return None, err
    return json.loads(out), err


def server_pid() -> int | None:
    """The pid of the target's server now running (``eaglepatch status --json``), None when none runs."""
    rc, out, _ = ep("status", TARGET, "--json", timeout=60)
    if rc != 0:
        return None
    doc = json.loads(out)
    doc = doc[0] if isinstance(doc, list) and doc else doc
    return ((doc or {}).get("server") or {}).get("pid")


def stop_pid_group(pid: int) -> None:
    """Stop a server this story's eaglepatch launched (its own session: the whole group), as Server.down does."""
    try:
        pgid = os.getpgid(pid)
    except ProcessLookupError:
        return
    own = pgid == os.getpgid(0)  # not in a session of its own: the server's process alone, never this story's group
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.kill(pid, sig) if own else os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        end = time.time() + wait
        while time.time() < end and health():
            time.sleep(0.5)
        if not health():
            break
    time.sleep(1)
