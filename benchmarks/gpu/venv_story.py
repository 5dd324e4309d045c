#!/usr/bin/env python3
"""A real SGLang 0.5.16 EAGLE3 server launched the way systemd units and container entrypoints launch it: a virtual
environment's interpreter by path, not activated, no PYTHONPATH. Then eaglepatch's whole cycle on it.

Run on the H200 machine by benchmarks/gpu/venv_story.sh, after the testbed's bundle (../shared/gpu-sglang, copied to
.gpu/) was unpacked in /tmp/site and eaglepatch installed in /tmp/ep:

1. make /tmp/venv (``python -m venv`` from the machine's base interpreter) and move the bundle into its
   site-packages, so sglang lives in the venv; torch and the rest of the image come from a ``site.addsitedir`` line
   in a .pth file (the image's own environment);
2. launch ``/tmp/venv/bin/python -m sglang.launch_server ...`` (EAGLE3, CUDA graphs on) without VIRTUAL_ENV, without
   the venv on PATH, without PYTHONPATH; check that /proc/PID/exe is the base interpreter, and that the base
   interpreter, with the server's own environment, does not find sglang (what eaglepatch used to ask);
3. ``eaglepatch status`` (the server found, and how it was launched), ``apply --mode events`` (restarted: the new
   process has the same argv[0], argv, cwd and environment), ``bench`` (per-phase timings of the patched server),
   ``revert`` (every byte of the sglang package back, the server the same again), ``status``;
and records it all in $OUT/venv_story.json.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import urllib.request

G = os.environ.get("GPU_DIR", os.path.join(os.getcwd(), ".gpu"))
sys.path.insert(0, G)
import orchestrate  # noqa: E402  (the testbed's launch flags and models)

OUT = os.environ.get("OUT", "/tmp/eagle_out")
SITE = "/tmp/site"
VENV = "/tmp/venv"
VENV_PY = f"{VENV}/bin/python"
EP_ENV = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
EP_ENV["PYTHONPATH"] = "/tmp/ep"
T0 = time.time()
story: dict = {"steps": []}


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def digest(root: str) -> dict[str, str]:
    out = {}
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if x != "__pycache__"]
        for f in files:
            p = os.path.join(d, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, root)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def identity(pid: int) -> dict:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        argv = [a.decode() for a in f.read().rstrip(b"\0").split(b"\0")]
    with open(f"/proc/{pid}/environ", "rb") as f:
        env = dict(item.decode().split("=", 1) for item in f.read().split(b"\0") if b"=" in item)
    return {"argv": argv, "cwd": os.readlink(f"/proc/{pid}/cwd"), "env": env, "exe": os.readlink(f"/proc/{pid}/exe")}


def ep(*args: str, timeout: float = 420) -> tuple[int, str, str]:
    log("$ eaglepatch " + " ".join(args))
    t = time.time()
    # cwd /tmp: the installed eaglepatch, not the checkout's source tree
    p = subprocess.run([sys.executable, "-m", "eaglepatch", *args], env=EP_ENV, cwd="/tmp", capture_output=True,
                       text=True, timeout=timeout)
    log(f"  exit {p.returncode} in {time.time() - t:.1f}s")
    for line in p.stderr.strip().splitlines()[-10:]:
        print("  | " + line, flush=True)
    story["steps"].append({"cmd": "eaglepatch " + " ".join(args), "rc": p.returncode,
                           "seconds": round(time.time() - t, 1), "stderr_tail": p.stderr[-2000:]})
    return p.returncode, p.stdout, p.stderr


def health() -> bool:
    try:
        with urllib.request.urlopen(orchestrate.URL + "/health_generate", timeout=10) as r:
            return r.status == 200
    except Exception:
        return False


def make_venv() -> None:
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", VENV], check=True)
    site = subprocess.run([VENV_PY, "-c", "import sysconfig;print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    for name in os.listdir(SITE):
        shutil.move(os.path.join(SITE, name), os.path.join(site, name))
    image = sysconfig.get_paths()["purelib"]  # this interpreter's (the image's own environment)
    with open(os.path.join(site, "zz_image_env.pth"), "w") as f:
        f.write(f"import site; site.addsitedir({image!r})\n")
    story["venv"] = {"base": base, "site_packages": site, "image_site": image}
    log(f"venv {VENV} (base {base}); sglang moved into {site}")


def launch() -> subprocess.Popen:
    mdir = "/tmp/models"
    orchestrate.ensure_models(mdir, [])
    argv = [VENV_PY, "-m", "sglang.launch_server", "--model-path", f"{mdir}/target", *orchestrate.spec_args(mdir),
            *orchestrate.COMMON]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = ":".join(p for p in env.get("PATH", "").split(":") if not p.startswith(VENV))
    env["SGLANG_ENABLE_JIT_DEEPGEMM"] = "0"
    logf = open(f"{OUT}/server_venv.log", "a")
    log("launching: " + " ".join(argv[:3]) + " ... (no activation, no PYTHONPATH)")
    p = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, env=env, cwd="/tmp", start_new_session=True)
    t = time.time()
    while time.time() - t < 300:
        if p.poll() is not None:
            raise SystemExit("the server died: see server_venv.log")
        if health():
            log(f"ready after {time.time() - t:.0f}s")
            return p
        time.sleep(2)
    raise SystemExit("the server was not ready in 300 s")


def launchers() -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            if len(argv) > 2 and argv[1] == b"-m" and argv[2] == b"sglang.launch_server":
                out.append(int(name))
    return sorted(out)


def main() -> int:
    os.makedirs(OUT, exist_ok=True)
    make_venv()
    pkg = f"{story['venv']['site_packages']}/sglang"
    before = digest(pkg)
    story["package_files"] = len(before)
    proc = launch()
    first = identity(proc.pid)
    story["launched"] = {"pid": proc.pid, "argv0": first["argv"][0], "exe": first["exe"], "cwd": first["cwd"],
                         "env_has_virtual_env": "VIRTUAL_ENV" in first["env"],
                         "env_has_pythonpath": "PYTHONPATH" in first["env"]}
    q = subprocess.run([first["exe"], "-c", "import importlib.util as u; print(u.find_spec('sglang'))"],
                       env=first["env"], cwd=first["cwd"], capture_output=True, text=True)
    story["exe_finds_sglang"] = q.stdout.strip()
    log(f"/proc/PID/exe = {first['exe']}; with the server's environment it finds: {q.stdout.strip()}")

    rc, out, _ = ep("status", "--json", VENV)
    story["status_before"] = json.loads(out) if rc == 0 else None
    rc, out, _ = ep("apply", "--json", "--mode", "events", "--log-dir", "/tmp/eplogs", "--timeout", "300", VENV)
    story["apply"] = {"rc": rc, "result": json.loads(out) if rc == 0 else None}
    [patched_pid] = launchers() or [None]
    story["patched_identity_same"] = patched_pid is not None and {
        k: v for k, v in identity(patched_pid).items() if k != "exe"} == {k: v for k, v in first.items() if k != "exe"}
    story["patched_pid"] = patched_pid
    rc, out, _ = ep("bench", "--json", "--requests", "32", "--concurrency", "4", "--max-new-tokens", "128", VENV)
    story["bench"] = json.loads(out) if rc == 0 else None
    rc, out, _ = ep("revert", "--json", "--timeout", "300", VENV)
    story["revert"] = {"rc": rc, "result": json.loads(out) if rc == 0 else None}
    story["byte_identical"] = digest(pkg) == before
    [back_pid] = launchers() or [None]
    story["reverted_identity_same"] = back_pid is not None and {
        k: v for k, v in identity(back_pid).items() if k != "exe"} == {k: v for k, v in first.items() if k != "exe"}
    story["reverted_argv0"] = identity(back_pid)["argv"][0] if back_pid else None
    rc, out, _ = ep("status", "--json", VENV)
    story["status_after"] = json.loads(out) if rc == 0 else None
    log(f"byte identical: {story['byte_identical']} ({len(before)} files); same argv[0], argv, cwd, env after "
        f"apply: {story['patched_identity_same']}, after revert: {story['reverted_identity_same']}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:
        with open(f"{OUT}/venv_story.json", "w") as f:
            json.dump(story, f, indent=1)
        for pid in launchers():  # only sglang launchers exist on this machine: the one this story started
            try:
                os.killpg(os.getpgid(pid), 9)
            except OSError:
                pass
