#!/usr/bin/env python3
"""`eaglepatch apply/revert --no-restart` over loopback SSH against one bare `ssh host true`.

Starts its own OpenSSH server on 127.0.0.1 (``/usr/sbin/sshd``, a free port, fresh ed25519 host and client keys
in a temporary folder, the same set-up as the end-to-end tests: tests/e2e/sshd_server.py, whose helpers it imports), a client HOME whose
``~/.ssh/known_hosts`` knows the server's key, and a fake host tree (``<tmp>/host/lib/python3.11/site-packages``)
holding a real sglang release (default 0.5.16, all its files, from the release cache). Then, after one untimed
warm-up round, ``--runs`` interleaved rounds of five whole commands, each a subprocess timed by its wall clock:

* ``ssh``: ``ssh -F CONFIG -i KEY -p PORT -o BatchMode=yes -o UserKnownHostsFile=KNOWN user@127.0.0.1 true``
  (OpenSSH's client, the same key and known_hosts), the baseline;
* ``apply_ssh`` / ``revert_ssh``: ``eaglepatch apply|revert --no-restart user@127.0.0.1:PORT -i KEY
  --sglang-path TREE`` (the installed console script, HOME = the client HOME, no ssh-agent);
* ``apply_local`` / ``revert_local``: the same on the local target ``TREE``, for reference.

Every apply must patch and every revert must restore the release's bytes (checked by sha256 after each round).
Ratios are ``median(command) / median(ssh)``; the pair's is ``(median(apply_ssh) + median(revert_ssh)) /
median(ssh)``, target at most 4x (``apply`` alone: at most 3x). With ``--breakdown`` (default on), it then runs the SSH apply and
revert ``--breakdown-runs`` times in an instrumented process (the CLI's own ``main()`` with timers wrapped around
its SSH round trips, connect, remote ops, transform calls and imports) and probes, over one connection, what one
remote command costs (a channel and the login shell; ``python3 -c pass``), to show where the time goes.

Prints one JSON object on stdout. ``python benchmarks/bench_ssh.py [--runs 5] [--release 0.5.16]``
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import platform
import pwd
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for _p in (str(ROOT), str(ROOT / "tests")):
    if _p not in sys.path:
        sys.path.insert(0, _p)
if not os.environ.get("EAGLEPATCH_TEST_CACHE") and (ROOT / ".cache" / "sites").is_dir():
    os.environ["EAGLEPATCH_TEST_CACHE"] = str(ROOT / ".cache")

TARGET = 3.0  # apply alone
PAIR_TARGET = 4.0  # apply + revert, against one bare ssh (issue 25)
_BIN = Path(sys.executable).with_name("eaglepatch")
EAGLEPATCH = [str(_BIN)] if _BIN.is_file() else [sys.executable, "-m", "eaglepatch"]


def sshd_helpers():
    """tests/e2e/sshd_server.py as a module (SSHServer, keygen, free_port, wait_for_banner, stop_sshd, env_for):
    the end-to-end tests' own sshd, outside pytest."""
    name = "_eaglepatch_bench_sshd_server"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "tests" / "e2e" / "sshd_server.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses looks its module up while the class is made
    spec.loader.exec_module(mod)
    return mod


class Loopback:
    """A real sshd on 127.0.0.1 with its own keys (the end-to-end tests' recipe, outside pytest); ``with`` stops it."""

    def __init__(self, root: Path):
        c = sshd_helpers()
        self.c = c
        if not os.access(c.SSHD, os.X_OK):
            raise SystemExit(f"{c.SSHD} not found: install openssh-server (make sshd)")
        root.mkdir(parents=True, exist_ok=True)
        os.chmod(root, 0o755)
        host_pub = c.keygen(root / "ssh_host_ed25519_key", "eaglepatch-bench-host")
        client_pub = c.keygen(root / "client_key", "eaglepatch-bench-client")
        (root / "authorized_keys").write_text(client_pub + "\n")
        os.chmod(root / "authorized_keys", 0o600)
        user = pwd.getpwuid(os.geteuid()).pw_name
        if os.geteuid() == 0:
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        log = root / "sshd.log"
        self.proc = None
        for _attempt in range(5):
            port = c.free_port()
            cfg = root / "sshd_config"
            cfg.write_text(
                f"ListenAddress 127.0.0.1\nPort {port}\nHostKey {root / 'ssh_host_ed25519_key'}\n"
                f"PidFile {root / 'sshd.pid'}\nAuthorizedKeysFile {root / 'authorized_keys'}\n"
                "PermitRootLogin yes\nPubkeyAuthentication yes\nPasswordAuthentication no\n"
                "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nSubsystem sftp internal-sftp\n"
                "X11Forwarding no\nPrintMotd no\nPrintLastLog no\nUseDNS no\nMaxStartups 100\nMaxSessions 100\n"
            )
            with open(log, "ab") as logf:
                proc = subprocess.Popen([c.SSHD, "-D", "-e", "-f", str(cfg)], stdin=subprocess.DEVNULL,
                                        stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
            if c.wait_for_banner(proc, port, time.monotonic() + 15):
                self.proc = proc
                break
            c.stop_sshd(proc)
            if "Address already in use" not in log.read_text(errors="replace"):
                break
        if self.proc is None:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
            raise SystemExit(f"sshd did not start on 127.0.0.1:\n{tail}")
        self.server = c.SSHServer(
            host="127.0.0.1", port=port, user=user, client_key=str(root / "client_key"), other_key="",
            host_pub_key=" ".join(host_pub.split()[:2]), wrong_host_pub_key="", home=str(root / "home"),
            root=str(root), log=str(log))
        self.server.make_home(self.server.home, known="ok")
        self.env = c.env_for(self.server)
        ssh_dir = Path(self.server.home) / ".ssh"
        # OpenSSH reads ~/.ssh of the passwd entry, not $HOME: name the client HOME's files explicitly.
        self.ssh_argv = [
            shutil.which("ssh") or "/usr/bin/ssh", "-F", str(ssh_dir / "config"), "-i", self.server.client_key,
            "-p", str(port), "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
            "-o", f"UserKnownHostsFile={ssh_dir / 'known_hosts'}", f"{user}@127.0.0.1",
        ]

    def __enter__(self) -> "Loopback":
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            self.c.stop_sshd(self.proc)
            self.proc = None


def make_tree(dest: Path, version: str) -> Path:
    """A fake host tree (a prefix: lib/python3.11/site-packages/sglang) holding the real release ``version``."""
    from eaglepatch.releases import release_site

    site = dest / "lib" / "python3.11" / "site-packages"
    site.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(release_site(version), site, ignore=shutil.ignore_patterns(".eaglepatch-site-complete"))
    return dest


def tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in sorted(os.walk(root)):
        dirnames.sort()
        for f in sorted(filenames):
            p = Path(dirpath, f)
            h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def byte_compile() -> dict:
    """Byte-compile eaglepatch's own modules (``compileall``), as pip does when it installs a package, so that the
    timed commands run the bytecode an installed eaglepatch runs. The checkout is an editable install, whose
    modules are otherwise compiled on first import and cached; an environment with PYTHONDONTWRITEBYTECODE=1
    (this machine's) never caches them, and every command would compile eaglepatch from source again. Returns
    what was done, for the report."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "eaglepatch")], check=True,
                   stdin=subprocess.DEVNULL)
    return {"compiled": "eaglepatch/", "seconds": round(time.perf_counter() - t0, 3),
            "PYTHONDONTWRITEBYTECODE": os.environ.get("PYTHONDONTWRITEBYTECODE", "")}


def run_timed(argv: list[str], env: dict, cwd: str, expect: str | None = None) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          timeout=300)
    dt = time.perf_counter() - t0
    if proc.returncode != 0 or (expect is not None and expect not in proc.stdout):
        raise SystemExit(f"benchmark command failed (exit {proc.returncode}): {' '.join(argv)}\n"
                         f"--- stdout\n{proc.stdout[-2000:]}\n--- stderr\n{proc.stderr[-2000:]}")
    return dt


# ------------------------------------------------------------------------------------------------------------
# Where the time goes: the CLI's main() in a process with timers around its pieces.

_HARNESS = r"""
import functools, json, sys, time
t_start = time.perf_counter()
out_path = sys.argv[1]
mode = sys.argv[2]
events = []

def wrap(obj, name, what, label=None):
    orig = getattr(obj, name)
    @functools.wraps(orig)
    def w(*a, **k):
        t = time.perf_counter()
        try:
            return orig(*a, **k)
        finally:
            events.append([what, label(a, k) if label else name, time.perf_counter() - t])
    setattr(obj, name, w)

t0 = time.perf_counter()
import eaglepatch.cli as cli, eaglepatch.entry as entry
t1 = time.perf_counter()
import eaglepatch.hosts.ssh as S   # paramiko (the CLI imports it on the first SSH target)
from eaglepatch.hosts.ssh_process import SSHProcess
t2 = time.perf_counter()
import eaglepatch.ops.lazy_engine as lazy_engine, eaglepatch.ops.facts as facts, eaglepatch.ops.session as session
import eaglepatch.ops.target as ops_target, eaglepatch.ops.change as change
# Not imported here: the transform (libcst). The CLI imports it on a thread of its own while the facts round trip
# waits on the host (lazy_engine.preload_transform); the wrapper of lazy_engine.engine below times that import.
imports = {"eaglepatch.cli (typer, ops)": t1 - t0, "paramiko (eaglepatch.hosts.ssh)": t2 - t1}

def exec_label(a, k):
    cmd = a[1]
    rest = cmd.split("exec ", 1)[-1].split()
    return " ".join(rest[:2]) if rest else cmd[:40]

if mode == "cli":
    import threading
    wrap(S.SSHHost, "connect", "connect")
    io = {}  # channel -> [stdin bytes, stdout bytes]
    _run = S.SSHHost._exec
    def _exec_io(self, command, stdin, deadline):
        t = time.perf_counter()
        r = _run(self, command, stdin, deadline)
        events.append(["channel", exec_label((self, command), {}), time.perf_counter() - t])
        io[len(io)] = [len(stdin or b""), len(r[1])]
        return r
    S.SSHHost._exec = _exec_io
    _spawn = S.SSHHost.spawn
    def _spawn_io(self, argv):
        proc = _spawn(self, argv)
        events.append(["channel", " ".join(argv[:2]), 0.0])  # kept open: every op of the command is a request on it
        io[id(proc)] = [0, 0]
        return proc
    S.SSHHost.spawn = _spawn_io
    _send, _read = SSHProcess.send, SSHProcess.read
    def _send_io(self, data, deadline):
        io[id(self)][0] += len(data)
        return _send(self, data, deadline)
    def _read_io(self, deadline):
        r = _read(self, deadline)
        io[id(self)][1] += len(r or b"")
        return r
    SSHProcess.send, SSHProcess.read = _send_io, _read_io
    wrap(S.SSHHost, "_sftp_call", "sftp", lambda a, k: a[1])
    for mod in (facts, session):  # the modules that call the host for apply and revert
        wrap(mod, "call", "remote_op", lambda a, k: a[2])
    for mod, n in ((ops_target, "gather"), (change, "plan_apply"), (change, "plan_revert")):
        wrap(mod, n, "step", (lambda n: lambda a, k: n)(n))
    _engine = lazy_engine.engine
    def _engine_timed():
        t = time.perf_counter()
        first = "eaglepatch.transform.engine" not in sys.modules
        eng = _engine()
        dt = time.perf_counter() - t
        if threading.current_thread() is not threading.main_thread():
            events.append(["transform_import", "background", dt])
        elif dt > 0.0005:
            events.append(["transform_import", "main thread waits" if not first else "main thread", dt])
        if not getattr(eng, "_bench_wrapped", False):
            eng._bench_wrapped = True
            for n in ("instrument", "analyze", "strip"):
                wrap(eng, n, "transform", (lambda n: lambda a, k: n)(n))
            import libcst
            wrap(libcst, "parse_module", "libcst_parse")
        return eng
    lazy_engine.engine = _engine_timed
    sys.argv = ["eaglepatch", *sys.argv[3:]]
    t3 = time.perf_counter()
    rc = 0
    try:
        entry.main()
    except SystemExit as e:
        rc = e.code or 0
    t4 = time.perf_counter()
    from eaglepatch.hosts import bundle
    prog = bundle.program()  # made once in the run above: the host-side package, bundled
    modules = [(name.replace(".", "/") + ".py", src) for name, (_pkg, src) in bundle.sources().items()]
    cts = []
    for _ in range(5):  # what the host compiles on the first frame: the program, then each module it imports
        t = time.perf_counter()
        compile(prog, "<eaglepatch-remote>", "exec", dont_inherit=True)
        for filename, src in modules:
            compile(src, filename, "exec", dont_inherit=True)
        cts.append(time.perf_counter() - t)
    doc = {"rc": rc, "imports": imports, "main_s": t4 - t3, "harness_s": t4 - t_start, "events": events,
           "io": list(io.values()), "remote_program_bytes": len(prog.encode()), "remote_compile_s": sorted(cts)[2]}
else:  # probe: what one remote command costs on an open connection
    from eaglepatch.hosts.spec import SSHOptions
    from eaglepatch.hosts.target import open_host, parse_target
    target, key, n = sys.argv[3], sys.argv[4], int(sys.argv[5])
    t3 = time.perf_counter()
    host = open_host(parse_target(target, SSHOptions(identity=key)))
    connect_s = time.perf_counter() - t3
    probes = {}
    def probe(name, argv):
        ts = []
        for _ in range(n):
            t = time.perf_counter()
            r = host.run(argv)
            ts.append(time.perf_counter() - t)
            assert r.rc == 0, (argv, r)
        probes[name] = ts
        return r
    probe("true", ["true"])
    probe("python3 -c pass", ["python3", "-c", "pass"])
    exe = probe("python3 -c print(sys.executable)", ["python3", "-c", "import sys; print(sys.executable)"])
    exe = exe.stdout.decode().strip()
    probe("EXE -c pass", [exe, "-c", "pass"])
    # what sourcing the login user's ~/.bashrc takes, timed inside the remote shell itself (bash 5)
    rc_ts = []
    for _ in range(n):
        r = host.run(["bash", "-c", "s=$EPOCHREALTIME; . ~/.bashrc >/dev/null 2>&1; echo $s $EPOCHREALTIME"])
        try:
            a, b = r.stdout.decode().split()[-2:]
            rc_ts.append(float(b.replace(",", ".")) - float(a.replace(",", ".")))
        except ValueError:
            pass
    env = host.run(["sh", "-c", "echo $PYENV_ROOT; command -v python3"]).stdout.decode().split("\n")
    host.close()
    doc = {"connect_s": connect_s, "imports": imports, "probes": probes, "bashrc_s": rc_ts, "python3_is": env[1] if len(env) > 1 else "",
           "rc_sourced": bool(env[0].strip()), "remote_exe": exe}
with open(out_path, "w") as f:
    json.dump(doc, f)
"""


def _harness(lb: Loopback, cwd: str, mode: str, args: list[str]) -> dict:
    out = Path(cwd) / f"harness-{mode}.json"
    proc = subprocess.run([sys.executable, "-c", _HARNESS, str(out), mode, *args], env=lb.env, cwd=cwd,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=300)
    if proc.returncode != 0 or not out.is_file():
        raise SystemExit(f"breakdown harness failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    doc = json.loads(out.read_text())
    out.unlink()
    if mode == "cli" and doc["rc"] != 0:
        raise SystemExit(f"breakdown: eaglepatch {' '.join(args)} exited {doc['rc']}:\n{proc.stderr[-3000:]}")
    return doc


def _summarise_cli(docs: list[dict]) -> dict:
    """Medians over runs of: imports, connect, each SSH channel (in order), SFTP, remote ops, transform, total."""
    med = statistics.median

    def total(doc, what, label=None):
        return sum(e[2] for e in doc["events"] if e[0] == what and (label is None or e[1] == label))

    def count(doc, what):
        return sum(1 for e in doc["events"] if e[0] == what)

    first = docs[0]
    channels = [e[1] for e in first["events"] if e[0] == "channel"]
    ops = [e[1] for e in first["events"] if e[0] == "remote_op"]
    per_op = {}
    for i, op in enumerate(ops):
        per_op[f"{i + 1}. {op}"] = round(med([[e for e in d["events"] if e[0] == "remote_op"][i][2]
                                               for d in docs]), 4)
    transforms = {}
    for d in docs:
        for e in d["events"]:
            if e[0] == "transform":
                transforms.setdefault(e[1], []).append(e)
    out = {
        "runs": len(docs),
        "whole_main_s": round(med([d["main_s"] for d in docs]), 4),
        "harness_s": round(med([d["harness_s"] for d in docs]), 4),
        "imports_s": {k: round(med([d["imports"][k] for d in docs]), 4) for k in first["imports"]},
        "connect_s": round(med([total(d, "connect") for d in docs]), 4),
        "ssh_channels": len(channels),
        "channel_programs": channels,
        # time in the remote round trips (ops), plus one-shot channels outside them
        "remote_s": round(med([total(d, "remote_op") for d in docs]), 4),
        "channel_io_bytes": first["io"],
        "remote_program_bytes": first["remote_program_bytes"],
        "remote_compile_s": round(med([d["remote_compile_s"] for d in docs]), 4),
        "sftp_calls": count(first, "sftp"),
        "sftp_s": round(med([total(d, "sftp") for d in docs]), 4),
        "remote_ops": per_op,
        "transform_calls": {k: len(v) // len(docs) for k, v in transforms.items()},
        "transform_s": round(med([total(d, "transform") for d in docs]), 4),
        "libcst_parses": count(first, "libcst_parse"),
        "libcst_parse_s": round(med([total(d, "libcst_parse") for d in docs]), 4),
        # the transform's import: on its own thread while facts wait on the host, and what main() waited for it
        "transform_import_s": round(med([total(d, "transform_import", "background") + total(d, "transform_import",
                                                                                          "main thread")
                                         for d in docs]), 4),
        "transform_import_wait_s": round(med([total(d, "transform_import", "main thread waits") for d in docs]), 4),
        "steps_s": {n: round(med([total(d, "step", n) for d in docs]), 4)
                    for n in sorted({e[1] for e in first["events"] if e[0] == "step"})},
    }
    accounted = (out["connect_s"] + out["remote_s"] + out["sftp_s"] + out["transform_s"]
                 + out["transform_import_wait_s"])
    out["other_in_main_s"] = round(out["whole_main_s"] - accounted, 4)
    return out


def breakdown(lb: Loopback, tree: Path, cwd: str, runs: int, probe_n: int) -> dict:
    srv = lb.server
    ssh_args = [srv.target, "-i", srv.client_key, "--sglang-path", str(tree)]
    apply_docs, revert_docs = [], []
    for _ in range(runs):
        apply_docs.append(_harness(lb, cwd, "cli", ["apply", "--no-restart", *ssh_args]))
        revert_docs.append(_harness(lb, cwd, "cli", ["revert", "--no-restart", *ssh_args]))
    probe = _harness(lb, cwd, "probe", [srv.target, srv.client_key, str(probe_n)])
    # a bare interpreter, and the imports of the CLI, each as a whole process
    py_start = [run_timed([sys.executable, "-c", "pass"], lb.env, cwd) for _ in range(probe_n)]
    cli_import = [run_timed([sys.executable, "-c", "import eaglepatch.cli"], lb.env, cwd) for _ in range(probe_n)]
    help_t = [run_timed([*EAGLEPATCH, "--version"], lb.env, cwd) for _ in range(probe_n)]
    med = statistics.median
    return {
        "apply": _summarise_cli(apply_docs),
        "revert": _summarise_cli(revert_docs),
        "probe": {
            "connect_s": round(probe["connect_s"], 4),
            "per_command_s": {k: round(med(v), 4) for k, v in probe["probes"].items()},
            "remote_python3": probe["python3_is"],
            "remote_exe": probe["remote_exe"],
            "login_shell_sources_bashrc": probe["rc_sourced"],
            "bashrc_source_s": round(med(probe["bashrc_s"]), 4) if probe["bashrc_s"] else None,
            "n": probe_n,
        },
        "local_process_s": {
            "python -c pass": round(med(py_start), 4),
            "python -c 'import eaglepatch.cli'": round(med(cli_import), 4),
            "eaglepatch --version": round(med(help_t), 4),
        },
    }


# ------------------------------------------------------------------------------------------------------------


def measure(runs: int, version: str, do_breakdown: bool, breakdown_runs: int) -> dict:
    bytecode = byte_compile()
    tmp = Path(tempfile.mkdtemp(prefix="ep-bench-ssh-"))  # not /tmp/eaglepatch*: other tools clean those up
    try:
        with Loopback(tmp / "sshd") as lb:
            srv = lb.server
            tree = make_tree(tmp / "host", version)
            cwd = tmp / "cwd"
            cwd.mkdir()
            pristine = tree_digest(tree)
            target = [srv.target, "-i", srv.client_key, "--sglang-path", str(tree)]
            cmds = {
                "ssh": (lb.ssh_argv + ["true"], None),
                "apply_ssh": ([*EAGLEPATCH, "apply", "--no-restart", *target], "apply: changed"),
                "revert_ssh": ([*EAGLEPATCH, "revert", "--no-restart", *target], "revert: changed"),
                "apply_local": ([*EAGLEPATCH, "apply", "--no-restart", str(tree)], "apply: changed"),
                "revert_local": ([*EAGLEPATCH, "revert", "--no-restart", str(tree)], "revert: changed"),
                # the first apply of this release from this client: the transform's results not yet cached
                "apply_ssh_cold": ([*EAGLEPATCH, "apply", "--no-restart", *target], "apply: changed"),
                "revert_ssh_again": ([*EAGLEPATCH, "revert", "--no-restart", *target], "revert: changed"),
            }
            times: dict[str, list[float]] = {k: [] for k in cmds}
            for rnd in range(runs + 1):  # round 0: warm-up, not counted
                for name, (argv, expect) in cmds.items():
                    env = lb.env
                    if name == "apply_ssh_cold":  # an empty client cache of its own, every round
                        env = dict(lb.env, XDG_CACHE_HOME=str(tmp / f"cold-cache-{rnd}"))
                    dt = run_timed(argv, env, str(cwd), expect)
                    if rnd:
                        times[name].append(dt)
                if tree_digest(tree) != pristine:
                    raise SystemExit("revert did not give back the release's bytes")
            med = {k: statistics.median(v) for k, v in times.items()}
            base = med["ssh"]
            res = {
                "release": version,
                "runs": runs,
                "bytecode": bytecode,
                "median_s": {k: round(v, 4) for k, v in med.items()},
                "all_s": {k: [round(x, 4) for x in v] for k, v in times.items()},
                "ratio_to_ssh": {k: round(v / base, 3) for k, v in med.items() if k != "ssh"},
                "target": TARGET,
                "apply_met": med["apply_ssh"] / base <= TARGET,
                # the pair: median(apply) + median(revert), over median(ssh)
                "pair_s": round(med["apply_ssh"] + med["revert_ssh"], 4),
                "pair_ratio": round((med["apply_ssh"] + med["revert_ssh"]) / base, 3),
                "pair_target": PAIR_TARGET,
                "pair_met": (med["apply_ssh"] + med["revert_ssh"]) / base <= PAIR_TARGET,
                "pair_cold_s": round(med["apply_ssh_cold"] + med["revert_ssh"], 4),
                "pair_cold_ratio": round((med["apply_ssh_cold"] + med["revert_ssh"]) / base, 3),
                "commands": {
                    "ssh": "ssh -F HOME/.ssh/config -i KEY -p PORT -o BatchMode=yes -o IdentitiesOnly=yes "
                           "-o UserKnownHostsFile=HOME/.ssh/known_hosts USER@127.0.0.1 true",
                    "apply_ssh": "eaglepatch apply --no-restart USER@127.0.0.1:PORT -i KEY --sglang-path TREE",
                    "revert_ssh": "eaglepatch revert --no-restart USER@127.0.0.1:PORT -i KEY --sglang-path TREE",
                    "apply_local": "eaglepatch apply --no-restart TREE",
                    "revert_local": "eaglepatch revert --no-restart TREE",
                    "apply_ssh_cold": "eaglepatch apply --no-restart USER@127.0.0.1:PORT -i KEY --sglang-path TREE "
                                      "(XDG_CACHE_HOME an empty folder)",
                    "revert_ssh_again": "eaglepatch revert --no-restart USER@127.0.0.1:PORT -i KEY --sglang-path "
                                        "TREE",
                },
                "openssh": subprocess.run([lb.ssh_argv[0], "-V"], capture_output=True, text=True).stderr.strip(),
                "python": platform.python_version(),
            }
            if do_breakdown:
                res["breakdown"] = breakdown(lb, tree, str(cwd), breakdown_runs, 5)
                if tree_digest(tree) != pristine:
                    raise SystemExit("breakdown: revert did not give back the release's bytes")
            return res
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--release", default="0.5.16")
    ap.add_argument("--no-breakdown", action="store_true")
    ap.add_argument("--breakdown-runs", type=int, default=3)
    args = ap.parse_args(argv)
    res = measure(max(1, args.runs), args.release, not args.no_breakdown, max(1, args.breakdown_runs))
    print(json.dumps(res))
    m = res["median_s"]
    print(f"apply over SSH {m['apply_ssh']:.3f} s, revert {m['revert_ssh']:.3f} s, bare ssh true {m['ssh']:.3f} s: "
          f"apply {res['ratio_to_ssh']['apply_ssh']:.2f}x (target <= {TARGET}x: "
          f"{'met' if res['apply_met'] else 'MISSED'}); apply + revert {res['pair_s']:.3f} s, "
          f"{res['pair_ratio']:.2f}x (target <= {PAIR_TARGET}x: {'met' if res['pair_met'] else 'MISSED'})",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
