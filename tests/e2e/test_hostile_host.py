"""Everything a host sends is data from a stranger (docs/safety.md, "Trust boundaries"), end to end over the real
sshd of conftest.py: a host-side interpreter that lies (``--python`` naming tests/e2e/liar.py: the real helper, its
answers rewritten), a log folder that another local user owns (a second uid this test creates and removes), and
a real stand-in server launched with an API key.

Each test fails on the code before issue 24: log names that are paths wrote outside the client's cache (and
appended to an existing file), the client took in whatever the host sent (660 MB of memory for 100 MB before the
marker, 3.2 GB for a 1 MB zlib frame), host text reached the terminal raw and argv unmasked, another user's log
folder was read as the server's (fake runs shown, a root-only file copied through a link), and a folder the user
may not read ended in a remote traceback.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import secrets
import shutil
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest

from safety import CLI, EAGLEPATCH, H, cli_env, make_install, up

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

LIAR = Path(__file__).with_name("liar.py")
RSS_LIMIT_KIB = 300 * 1024  # the client's peak memory with every bound in force (it takes ~60 MiB to start)


def record(t: float, pid: int, draft: float, run: str, host: str = "gpu1") -> str:
    phases = {"draft": draft, "verify": 2.0, "draft_extend": 0.5}
    return json.dumps({"v": 1, "t": t, "host": host, "pid": pid, "rank": 0, "worker": "EAGLEWorkerV2",
                       "mode": "decode", "bs": 1, "cycle_ms": round(sum(phases.values()) + 0.1, 4), "timer": "sync",
                       "phases": phases, "accepted": 3, "run": run}) + "\n"


def liar(root: Path, lie: tuple) -> str:
    """An interpreter for --python that runs the real helper and lies as ``lie`` says (see liar.py)."""
    root.mkdir(parents=True, exist_ok=True)
    src = LIAR.read_text().replace("LIE = None", f"LIE = {lie!r}", 1).replace("REAL = None",
                                                                             f"REAL = {sys.executable!r}", 1)
    path = root / "python3"
    path.write_text(f"#!{sys.executable}\n" + src)
    path.chmod(0o755)
    return str(path)


def run_measured(argv: list[str], env: dict[str, str], tmp_path: Path) -> tuple[subprocess.CompletedProcess, int]:
    """Run ``argv``; also return its peak resident memory (KiB), read by a parent process of its own."""
    out = tmp_path / f"rss-{secrets.token_hex(3)}"
    parent = ("import resource,subprocess,sys;r=subprocess.run(sys.argv[2:]);"
              "open(sys.argv[1],'w').write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss));"
              "sys.exit(r.returncode)")
    p = subprocess.run([sys.executable, "-c", parent, str(out), *argv], env=env, capture_output=True, text=True,
                       timeout=240, stdin=subprocess.DEVNULL)
    return p, int(out.read_text())


def one_line_error(p: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in p.stderr, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert lines and lines[-1].startswith("eaglepatch: "), p.stderr
    return lines[-1]


def bare_install(root: Path) -> Path:
    """An sglang package that no server runs (the TARGET's install: other checkouts' servers are not its)."""
    pkg = root / "bare install" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("__version__ = '0.0.0'\n")
    return pkg


# ----------------------------------------------------------------------------------------------------------------
# the log fetch: names, offsets


@pytest.mark.parametrize("how", ["absolute", "dotdot"])
def test_log_names_that_are_paths_are_refused_and_nothing_is_written(ssh_cli, tmp_path, how):
    """The ``logs`` answer names ``/abs/authorized_keys`` at offset 1 (append), or ``../../...`` out of the cache:
    refused in one line (exit 1), nothing written anywhere, not even in the cache. Before: the victim got the
    host's bytes appended, or a file was created beside it."""
    remote = tmp_path / "remote logs"
    remote.mkdir()
    (remote / "gpu1-10-rank0.jsonl").write_text("".join(record(100 + i, 10, 1.0, "gpu1-10-1-a") for i in range(5)))
    victim = tmp_path / "victim" / ("authorized_keys" if how == "absolute" else "escaped-1-rank0.jsonl")
    victim.parent.mkdir()
    if how == "absolute":
        victim.write_text("ssh-ed25519 AAAA the user's own key\n")
    before = victim.read_bytes() if victim.exists() else None
    python = liar(tmp_path / "liar", ("names", how, str(victim)))
    r = ssh_cli.run("report", bare_install(tmp_path), "--log-dir", str(remote), "--python", python)
    assert (victim.read_bytes() if victim.exists() else None) == before, f"the host wrote {victim}"
    cache = tmp_path / "client cache"
    assert not list(cache.rglob("*.jsonl")), "a refused answer left bytes in the cache"
    assert r.rc == 1, r
    line = one_line_error(subprocess.CompletedProcess([], r.rc, r.out, r.err))
    assert "refused" in line and "not a plain <host>-<pid>-rank<r>[.<i>].jsonl" in line, line


# ----------------------------------------------------------------------------------------------------------------
# the agent protocol: sizes


@pytest.fixture(scope="module")
def zip_bomb(tmp_path_factory) -> str:
    """One frame of the agent protocol: 1 GiB of JSON-ish zeros in about 1 MiB of zlib."""
    path = tmp_path_factory.mktemp("bomb") / "frame"
    chunk = b"0" * (1 << 20)

    def deflated(data: bytes, mode: int) -> bytes:  # raw deflate; a full flush ends byte-aligned with no history
        z = zlib.compressobj(9, zlib.DEFLATED, -15)
        return z.compress(data) + z.flush(mode)

    # the chunk deflated once and repeated (not 1 GiB deflated: ~6 s of CPU), in a zlib stream with its checksum
    adler = zlib.adler32(b'{"result": "')
    for _ in range(1024):
        adler = zlib.adler32(chunk, adler)
    body = (b"\x78\xda" + deflated(b'{"result": "', zlib.Z_FULL_FLUSH) + deflated(chunk, zlib.Z_FULL_FLUSH) * 1024
            + deflated(b'"}', zlib.Z_FINISH) + struct.pack(">I", zlib.adler32(b'"}', adler)))
    path.write_bytes(b"z%d\n" % len(body) + body)
    return str(path)


@pytest.mark.parametrize("lie,words", [
    (("preamble", 100 << 20), "came before its marker"),
    (("frame", 10 << 30), "a frame of 10737418240 bytes"),
    ("bomb", "inflates to more than 64 MiB"),
], ids=["100 MB before the marker", "a 10 GB frame", "a zip bomb"])
def test_what_a_host_floods_is_bounded(sshd, tmp_path, zip_bomb, lie, words):
    """100 MB before the marker, a frame announced as 10 GB, 1 MiB of zlib that inflates to 1 GiB: each refused in
    one line (exit 1) with the bound it passed, the client's memory within bounds (before: 660 MB and 3.2 GB)."""
    lie = ("bomb", zip_bomb) if lie == "bomb" else lie
    python = liar(tmp_path / "liar", lie)
    argv = [*EAGLEPATCH, "status", sshd.target, "-i", sshd.client_key, "--sglang-path",
            str(bare_install(tmp_path)), "--python", python]
    p, rss = run_measured(argv, cli_env(tmp_path, sshd.env()), tmp_path)
    assert p.returncode == 1, (p.returncode, p.stderr)
    line = one_line_error(p)
    print(f"{lie[0]}: exit {p.returncode}, client peak RSS {rss / 1024:.0f} MiB: {line}")
    assert "refused" in line and words in line, line
    assert rss < RSS_LIMIT_KIB, f"the client took {rss / 1024:.0f} MiB"


# ----------------------------------------------------------------------------------------------------------------
# text from the host: escaped, secrets masked

ESC_ARGV = ["/usr/bin/python3", "-m", "sglang.launch_server", "--port", "30999", "--api-key", "sk-live-0123456789",
            "--served-model-name", "m\x1b[2J\x1b]0;owned\x07\nserver: pid 1 on :30000: forged"]


def test_control_characters_and_secrets_from_the_host_are_escaped_and_masked(ssh_cli, tmp_path):
    """The facts answer carries a server whose argv holds an API key, terminal escapes and a newline that would
    forge a line, a lock whose user and host do too, another install's path with a bell: status and show print
    them escaped and masked, one line each; their JSON masks the key too."""
    pkg = bare_install(tmp_path)
    fake = {"pid": 999999, "argv": ESC_ARGV, "args_index": 1, "cwd": "/srv\nlock: forged", "env": {},
            "children": [], "start": 1, "started_at": time.time(), "launcher": "/usr/bin/python3",
            "launch": {}, "package_dir": str(pkg), "same_user": True}
    extra = {"servers": [fake], "version": "0.5.16\x1b[31m",
             "other_servers": [{"pid": 2, "port": 30001, "package_dir": "/opt\x07\nother server: forged"}],
             "lock": {"user": "root\x1b[2J", "client_host": "laptop\nserver: forged", "client_pid": 1,
                      "time": "not a time", "what": "apply"}}
    python = liar(tmp_path / "liar", ("facts", extra))
    for cmd in ("status", "show"):
        r = ssh_cli.run(cmd, pkg, "--python", python)
        assert r.rc == 0, r
        text = r.out + r.err
        assert "sk-live-0123456789" not in text and "--api-key ***" in text, text
        assert not re.search("[\x00-\x08\x0b-\x1f\x7f]", text), repr(text)
        assert "\\e[2J" in text and "\\x07" in text and "\\n" in text, text
        assert not re.search(r"^\s*(server|lock|other server): forged", text, re.M), text
        doc = ssh_cli.run(cmd, pkg, "--python", python, "--json").expect(0).json()
        assert doc["servers"][0]["argv"][6] == "***" and "sk-live" not in json.dumps(doc), doc["servers"]


def test_a_real_servers_api_key_is_masked_by_every_command(ssh_cli, standins, tmp_path):
    """A stand-in server launched with --api-key: apply (its restart line), status, show, restart and doctor
    print the command line with the key masked, in text and JSON; --speculative-num-draft-tokens, a count, shown."""
    install = make_install(standins, tmp_path / "install", "venv-by-path")
    key = "sk-test-" + secrets.token_hex(8)
    port, _proc = up(install, standins, tmp_path / "work", "--api-key", key, "--speculative-num-draft-tokens", "4")
    outputs = []
    for args in (("apply", "--timeout", "60"), ("status",), ("status", "--json"), ("show",), ("show", "--json"),
                 ("restart", "--timeout", "60"), ("doctor",), ("doctor", "--json"), ("revert", "--timeout", "60")):
        r = ssh_cli.run(args[0], install.pkg, *args[1:])
        assert r.rc == 0, r
        outputs.append(r.out + r.err)
    text = "\n".join(outputs)
    assert key not in text
    assert "--api-key ***" in text and '"***"' in text and "--speculative-num-draft-tokens 4" in text
    assert "starting sglang on" in outputs[0] and "its log:" in outputs[0], outputs[0]


# ----------------------------------------------------------------------------------------------------------------
# a log folder another local user owns


@pytest.fixture
def other_user():
    """A local user of its own (useradd), removed at the end: (name, uid, gid). Root only: it skips otherwise."""
    if os.geteuid() != 0:
        pytest.skip("creates a second local user (useradd): run as root (CI does)")
    useradd, userdel = shutil.which("useradd"), shutil.which("userdel")
    assert useradd and userdel, "useradd/userdel (passwd) are missing"
    name = "ep24-" + secrets.token_hex(4)
    subprocess.run([useradd, "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True,
                   capture_output=True)
    try:
        pw = pwd.getpwnam(name)
        yield name, pw.pw_uid, pw.pw_gid
    finally:
        subprocess.run([userdel, name], capture_output=True)


def _wait_for(pattern: str, folder: Path, deadline_s: float = 60) -> list[Path]:
    deadline = time.monotonic() + deadline_s
    while True:
        found = sorted(folder.glob(pattern))
        if found:
            return found
        assert time.monotonic() < deadline, f"nothing matches {pattern} in {folder}"
        time.sleep(0.1)


FAKE_DRAFT_MS = 3_000_000.0  # the fake runs' draft: far above any real cycle's, yet a valid record's (MAX_MS: an hour)


def test_a_log_folder_another_user_made_is_not_read_and_the_real_records_are(ssh_cli, standins, tmp_path, other_user):
    """Another user pre-creates the configured log folder (in a world-writable temp folder, as /tmp) with fake
    runs (draft 3,000,000 ms: 50 minutes, no real cycle's, under the parser's hour) and a link to a root-only file. The server (root) rightly writes to a private folder
    instead. report and doctor read the real records there, say why the configured folder is not read, show no
    fake run, and copy nothing through the link. Before: the fake run was shown, the real ones hidden, the
    root-only file copied into the client's cache, and doctor said the patched server had timed no cycle."""
    name, uid, gid = other_user
    shared = tmp_path / "shared tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    planted = shared / "eaglepatch"
    planted.mkdir()
    secret = tmp_path / "root only"
    secret.write_text("root's secret\n")
    secret.chmod(0o600)
    (planted / "gpu1-4242-rank0.jsonl").write_text(
        json.dumps({"v": 1, "kind": "run", "run": "gpu1-4242-1-fake", "t": time.time(), "host": "gpu1", "pid": 4242,
                    "rank": 0, "timer": "sync", "flags": {}}) + "\n"
        + "".join(record(time.time() + i, 4242, FAKE_DRAFT_MS, "gpu1-4242-1-fake") for i in range(20)))
    (planted / "gpu1-4243-rank0.jsonl").symlink_to(secret)
    for p in (planted, *planted.iterdir()):
        os.lchown(p, uid, gid)
    server_tmp = tmp_path / "server tmp"
    server_tmp.mkdir(mode=0o700)

    install = make_install(standins, tmp_path / "install", "pythonpath")
    port, _proc = up(install, standins, tmp_path / "work", "--speculative-algorithm", "EAGLE3",
                     "--speculative-num-steps", "3", TMPDIR=str(server_tmp))
    ssh_cli.run("apply", install.pkg, "--log-dir", str(planted), "--timeout", "60").expect(0)
    load = ["--requests", "4", "--concurrency", "2", "--input-len", "16", "--max-new-tokens", "16", "--warmup", "0",
            "--log-wait", "0"]
    ssh_cli.run("bench", install.pkg, *load).expect(0)
    [private] = {p.parent for p in _wait_for("eaglepatch-*/*.jsonl", server_tmp)}

    r = ssh_cli.run("report", install.pkg, "--json").expect(0)
    doc = r.json()
    assert doc["records"] > 0 and all(run["id"] != "gpu1-4242-1-fake" for run in doc["runs"]), doc["runs"]
    draft = [g["phases"]["draft"]["max"] for g in doc["groups"] if g["mode"] == "decode"]
    assert draft and max(draft) < FAKE_DRAFT_MS / 2, draft  # a stand-in's draft ran 1,008 ms on a loaded host
    assert f"not reading {planted}: owned by uid {uid} ({name})" in r.err, r.err
    assert str(private) in r.err, r.err
    cache = tmp_path / "client cache"
    assert not any("root's secret" in p.read_text(errors="replace") for p in cache.rglob("*") if p.is_file())

    doc = ssh_cli.run("doctor", install.pkg, "--json").expect(0).json()
    ids = {f["id"] for f in doc["findings"]}
    assert "no-timing-records" not in ids and "not-patched" not in ids, ids
    assert doc["sources"]["timing_log"]["records"] > 0, doc["sources"]
    ssh_cli.run("revert", install.pkg, "--timeout", "60").expect(0)
    shutil.rmtree(private)


def test_a_log_folder_this_user_may_not_read_is_one_line(sshd, tmp_path, other_user):
    """eaglepatch logged in as a user that is not root (a ForceCommand drops to it), the log folder root's (0700,
    as the runtime makes it): report says in one line which folder and why, exit 2; before, a remote traceback
    (PermissionError, exit 1)."""
    from sshd_server import start_sshd, stop_sshd

    name, uid, gid = other_user
    logs = tmp_path / "root logs"
    logs.mkdir(mode=0o700)
    (logs / "gpu1-10-rank0.jsonl").write_text(record(100.0, 10, 1.0, "gpu1-10-1-a"))
    setpriv = shutil.which("setpriv")
    assert setpriv, "setpriv (util-linux) is missing"
    (tmp_path / "sshd").mkdir()
    proc, srv = start_sshd(sshd, f'ForceCommand exec {setpriv} --reuid={uid} --regid={gid} --clear-groups '
                             '/bin/sh -c "$SSH_ORIGINAL_COMMAND"', tmp_path / "sshd")
    try:
        cli = CLI("ssh", cli_env(tmp_path, srv.env()), ssh=[srv.target, "-i", srv.client_key])
        r = cli.run("report", Path("/nonexistent/sglang"), "--log-dir", str(logs))
    finally:
        stop_sshd(proc)
    assert r.rc == 2, r
    line = one_line_error(subprocess.CompletedProcess([], r.rc, r.out, r.err))
    assert str(logs) in line and "Permission denied" in line, line


def test_logs_larger_than_a_frame_come_in_batches(ssh_cli, tmp_path):
    """40 MB of timing logs: the host sends them in batches of 8 MB, each whole lines, the next asked for before
    the last is written (pipelined), until the client has them all, its memory bounded;
    the next report fetches nothing new."""
    remote = tmp_path / "remote logs"
    remote.mkdir()
    line = record(100.0, 10, 1.0, "gpu1-10-1-a")
    n = (40 << 20) // len(line) + 1
    with open(remote / "gpu1-10-rank0.jsonl", "w") as f:
        f.writelines(record(100 + i * 0.001, 10, 1.0, "gpu1-10-1-a") for i in range(n))
    size = (remote / "gpu1-10-rank0.jsonl").stat().st_size
    argv = [*EAGLEPATCH, "report", "--json", "--all-runs", *ssh_cli.target(bare_install(tmp_path)), "--log-dir",
            str(remote)]
    p, rss = run_measured(argv, ssh_cli.env, tmp_path)
    print(f"{size} bytes of logs: client peak RSS {rss / 1024:.0f} MiB")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["records"] == n and f"{size} new bytes" in p.stderr, p.stderr[-500:]
    assert rss < RSS_LIMIT_KIB, f"the client took {rss / 1024:.0f} MiB"
    again = subprocess.run(argv, env=ssh_cli.env, capture_output=True, text=True, timeout=240)
    assert again.returncode == 0 and " 0 new bytes" in again.stderr, again.stderr
