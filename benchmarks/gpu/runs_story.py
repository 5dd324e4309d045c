#!/usr/bin/env python3
"""Runs kept apart, the default timer, a slow log disk and sglang's own benchmark, on a real SGLang 0.5.16 EAGLE3
server (the H200 testbed), with the real commands.

Run by benchmarks/gpu/runs_story.sh on the GPU machine (the testbed's bundle unpacked in /tmp/site, eaglepatch
installed in /tmp/ep). One device call:

1. launch the agreeing-draft EAGLE3 server as a user would (detached), with ``/tmp/slowfs`` first on its
   PYTHONPATH: a ``sitecustomize`` there makes every ``os.write`` to a file under /tmp/eplogs sleep 1.5 s while
   the file /tmp/slow_on exists (the slow or hung log disk of issue 13, switched on and off without a relaunch);
2. ``eaglepatch show --json``: which timer ``--mode auto`` gives each worker, and why;
3. three applies into ONE log dir (/tmp/eplogs): ``--mode sync``, ``--mode events``, and the default (``auto``),
   each followed by ``eaglepatch bench`` (its own window);
4. on the last one: the same bench with the slow disk on (decode cycle and tok/s against the bench before);
5. sglang's own serving benchmark (``python -m sglang.bench_serving``, random token ids, the same shape as
   eaglepatch's bench: input 128, output 128, 32 requests, 4 at a time) and ``eaglepatch bench`` back to back on
   the same server;
6. ``eaglepatch report --json /tmp/eplogs`` (every run, one table each), ``report TARGET`` (the current run),
   ``report --merge-runs``; then ``revert --no-restart`` and the package's bytes compared.

Everything goes to ``$OUT/runs_story.json``. Env: OUT, T0, BUDGET (seconds from T0, default 540).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

G = os.environ.get("GPU_DIR", os.path.join(os.getcwd(), ".gpu"))
sys.path.insert(0, G)
import orchestrate  # noqa: E402  (the testbed's launch flags and models)

OUT = os.environ.get("OUT", "/tmp/eagle_out")
T0 = float(os.environ.get("T0", time.time()))
BUDGET = float(os.environ.get("BUDGET", "540"))
PY = sys.executable
SITE = "/tmp/site"
TARGET = f"{SITE}/sglang"
LOGS = "/tmp/eplogs"
SLOW_FLAG = "/tmp/slow_on"
EP_ENV = dict(os.environ, PYTHONPATH="/tmp/ep", XDG_CACHE_HOME="/tmp/epcache")
LOAD = ["--requests", "32", "--concurrency", "4", "--input-len", "128", "--max-new-tokens", "128"]
RESTART_S = 110  # a warm relaunch (65-75 s) and a bench
story: dict = {"steps": [], "runs": []}

SITECUSTOMIZE = '''
# eaglepatch runs_story: a slow log disk, switched by the file %(flag)r (only writes to files under %(logs)r).
import os, time
_real_write = os.write
def _slow_write(fd, data):
    if os.path.exists(%(flag)r):
        try:
            if os.readlink("/proc/self/fd/%%d" %% fd).startswith(%(logs)r):
                time.sleep(1.5)
        except OSError:
            pass
    return _real_write(fd, data)
os.write = _slow_write
''' % {"flag": SLOW_FLAG, "logs": LOGS}


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def left() -> float:
    return T0 + BUDGET - time.time()


def ep(*args: str, timeout: float = 330) -> tuple[int, str, str]:
    t = time.time()
    p = subprocess.run([PY, "-m", "eaglepatch", *args], env=EP_ENV, cwd="/tmp", stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=timeout)
    log(f"$ eaglepatch {' '.join(args)}: exit {p.returncode} in {time.time() - t:.1f}s")
    for line in p.stderr.strip().splitlines()[-6:]:
        print("  | " + line, flush=True)
    story["steps"].append({"cmd": "eaglepatch " + " ".join(args), "rc": p.returncode,
                           "seconds": round(time.time() - t, 1), "stderr_tail": p.stderr[-1500:]})
    return p.returncode, p.stdout, p.stderr


def ep_json(*args: str, timeout: float = 330) -> dict | None:
    rc, out, _ = ep(*args, "--json", timeout=timeout)
    try:
        return json.loads(out) if rc == 0 else None
    except ValueError:
        return None


def digest(root: str) -> dict[str, str]:
    out = {}
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if x != "__pycache__"]
        for f in files:
            p = os.path.join(d, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, root)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def health() -> bool:
    try:
        with urllib.request.urlopen(orchestrate.URL + "/health_generate", timeout=10) as r:
            return r.status == 200
    except Exception:
        return False


def launch() -> subprocess.Popen:
    mdir = "/tmp/models_agree"
    orchestrate.ensure_models(mdir, ["--agree"])
    os.makedirs("/tmp/slowfs", exist_ok=True)
    with open("/tmp/slowfs/sitecustomize.py", "w") as f:
        f.write(SITECUSTOMIZE)
    argv = [PY, "-m", "sglang.launch_server", "--model-path", f"{mdir}/target", *orchestrate.spec_args(mdir),
            *orchestrate.COMMON]
    env = dict(os.environ, PYTHONPATH=f"/tmp/slowfs:{SITE}")
    logf = open(f"{OUT}/server_runs.log", "a")
    log("launching the agreeing-draft EAGLE3 server (detached)")
    p = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, env=env, cwd="/tmp", start_new_session=True)
    story["launch_argv"] = argv
    t = time.time()
    while time.time() - t < 300:
        if p.poll() is not None:
            raise SystemExit("the server died: see server_runs.log")
        if health():
            story["first_ready_s"] = round(time.time() - t, 1)
            log(f"ready after {time.time() - t:.0f}s")
            return p
        time.sleep(2)
    raise SystemExit("the server was not ready in 300 s")


def bench(label: str, load: list[str] = LOAD) -> dict | None:
    """``eaglepatch bench`` with ``load``: its JSON, labelled, and one line of it in the story's log."""
    doc = ep_json("bench", *load, TARGET, timeout=240)
    if doc is not None:
        doc["label"] = label
        c = doc["client"]
        log(f"bench {label}: {c['tokens_per_s']} tok/s, TTFT p50 {c['ttft_ms']['p50']} ms, accept {c['accept_len']}")
    return doc


# sglang.benchmark as shipped in the 0.5.16 wheel (the testbed's bundle leaves it out): carried as
# .devcarry/bsext.tar.xz, unpacked beside the install and added to the sglang package's __path__ for the
# benchmark's process only, so the install itself is not touched.
BSEXT = os.path.join(os.getcwd(), ".devcarry", "bsext.tar.xz")
RUN_MODULE = ("import sys, runpy, sglang; sglang.__path__.append('/tmp/bsext/sglang'); "
              "sys.argv[0] = sys.argv[1]; del sys.argv[1]; runpy.run_module(sys.argv[0], run_name='__main__')")


def bench_serving(prompts: int = 32, label: str = "") -> dict:
    """sglang's serving benchmark, the same load shape as eaglepatch's bench."""
    outf = f"{OUT}/bench_serving{label}.jsonl"
    args = ["--backend", "sglang", "--host", "127.0.0.1", "--port", str(orchestrate.PORT), "--dataset-name",
            "random-ids", "--num-prompts", str(prompts), "--random-input-len", "128", "--random-output-len", "128",
            "--random-range-ratio", "1.0", "--max-concurrency", "4", "--seed", "0", "--output-file", outf,
            "--tokenizer", "/tmp/models_agree/target"]
    if os.path.exists(BSEXT) and not os.path.exists("/tmp/bsext"):
        os.makedirs("/tmp/bsext")
        subprocess.run(["tar", "-C", "/tmp/bsext", "-xJf", BSEXT], check=True)
    res: dict = {"argv": args, "stubbed": []}
    # sglang.benchmark.datasets imports every dataset module at its top, among them the image and MMMU sets
    # (PIL, Hugging Face's datasets), which the random-ids set never calls: a module missing from this image is
    # stood in for by one that raises if called. aiohttp and its needs come as wheels in /tmp/ep.
    os.makedirs("/tmp/bsstub", exist_ok=True)
    for mod, body in (("datasets", "def load_dataset(*a, **k):\n    raise RuntimeError('not on this testbed')\n"),
                      ("PIL", "")):
        probe = subprocess.run([PY, "-c", f"import {mod}"], env=dict(os.environ, PYTHONPATH=SITE),
                               capture_output=True)
        if probe.returncode:
            os.makedirs(f"/tmp/bsstub/{mod}", exist_ok=True)
            with open(f"/tmp/bsstub/{mod}/__init__.py", "w") as f:
                f.write(body)
            if mod == "PIL":
                with open("/tmp/bsstub/PIL/Image.py", "w") as f:
                    f.write("class Image(object):\n    pass\n")
            res["stubbed"].append(mod)
    env = dict(os.environ, PYTHONPATH=f"{SITE}:/tmp/ep:/tmp/bsstub")
    for module in ("sglang.bench_serving", "sglang.benchmark.serving"):
        t = time.time()
        p = subprocess.run([PY, "-c", RUN_MODULE, module, *args], env=env, cwd="/tmp",
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240)
        res[module] = {"rc": p.returncode, "seconds": round(time.time() - t, 1), "tail": p.stdout[-3000:]}
        log(f"python -m {module}: exit {p.returncode} in {time.time() - t:.1f}s")
        if p.returncode == 0:
            try:
                with open(outf) as f:
                    res["result"] = json.loads(f.read().strip().splitlines()[-1])
            except (OSError, ValueError, IndexError) as e:
                res["result_error"] = repr(e)
            break
    return res


def stop_all() -> None:
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if len(argv) > 2 and argv[1] == b"-m" and argv[2] == b"sglang.launch_server":
            try:
                os.killpg(os.getpgid(int(name)), signal.SIGKILL)  # only launchers exist here: the one we started
            except OSError:
                pass


def main() -> int:
    os.makedirs(OUT, exist_ok=True)
    before = digest(TARGET)
    story["package_files"] = len(before)
    launch()
    story["show"] = ep_json("show", TARGET)
    for mode in ("sync", "events", None):
        if left() < RESTART_S:
            log(f"skipping the apply of mode {mode or 'auto'}: {left():.0f}s left")
            story["runs"].append({"mode": mode or "auto", "skipped": "budget"})
            continue
        args = ["apply", "--log-dir", LOGS, "--timeout", "240"] + (["--mode", mode] if mode else []) + [TARGET]
        run = {"mode": mode or "auto", "apply": ep_json(*args, timeout=300)}
        run["bench"] = bench(f"apply-{mode or 'auto'}")
        story["runs"].append(run)
    last = story["runs"][-1]
    if "bench" in last and left() > 60:
        open(SLOW_FLAG, "w").close()
        try:
            last["bench_slow_disk"] = bench("slow-disk")
        finally:
            os.unlink(SLOW_FLAG)
    if left() > 90:
        story["bench_serving"] = bench_serving()
        story["bench_beside_bench_serving"] = bench("beside-bench_serving")
    time.sleep(2.5)  # the runtime writes every 2 s
    story["report_all"] = ep_json("report", LOGS)
    rc, text, _ = ep("report", LOGS)
    story["report_all_text"] = text
    story["report_target"] = ep_json("report", TARGET)
    story["report_merged"] = ep_json("report", "--merge-runs", LOGS)
    rc, text, _ = ep("report", "--merge-runs", LOGS)
    story["report_merged_text"] = text
    story["revert"] = ep_json("revert", "--no-restart", TARGET)
    story["byte_identical"] = digest(TARGET) == before
    log(f"byte identical after revert: {story['byte_identical']} ({len(before)} files)")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:
        with open(f"{OUT}/runs_story.json", "w") as f:
            json.dump(story, f, indent=1)
        stop_all()
