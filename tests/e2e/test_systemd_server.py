"""A server that systemd runs is recognised as such and restarted through ``systemctl restart UNIT``, never by hand
behind systemd's back (which would start a second server when systemd restarts its unit).

No systemd runs on these machines, so this is the part that can be real: the stand-in server is put in a real
cgroup named like a service unit (``eaglepatch-test-<token>.service``, in the cgroup v2 hierarchy or the v1
``name=systemd`` one, which is where systemd keeps a unit's processes) with the ``INVOCATION_ID`` systemd gives a
service; ``systemctl`` is a stand-in script on PATH that restarts the "unit" the way systemd does (SIGTERM to every
process of its cgroup, then ExecStart again in the cgroup, with a fresh INVOCATION_ID) and answers ``show -p
MainPID``. The product reads the unit from /proc as it would on a systemd host. Needs root (CI runs as root).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from safety import CLI, PY, H, cli_env, make_install

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

# What the stand-in systemctl does for the unit described in $EAGLEPATCH_TEST_UNITS/<unit>.json
# ({"cgroup", "argv", "cwd", "env"}): restart = stop every process of the cgroup, start ExecStart in it.
SYSTEMCTL = textwrap.dedent('''\
    #!{python}
    import json, os, signal, subprocess, sys, time, uuid
    units = os.environ["EAGLEPATCH_TEST_UNITS"]
    args = sys.argv[1:]
    if args[:1] == ["show"]:
        unit = args[-1]
        path = os.path.join(units, unit + ".main")
        print("MainPID=" + (open(path).read().strip() if os.path.exists(path) else "0"))
        sys.exit(0)
    if args[:1] != ["restart"]:
        sys.exit("stand-in systemctl: only restart and show")
    unit = args[1]
    spec = json.load(open(os.path.join(units, unit + ".json")))
    procs = os.path.join(spec["cgroup"], "cgroup.procs")
    for pid in [int(p) for p in open(procs).read().split()]:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.time() + 20
    while open(procs).read().split() and time.time() < deadline:
        time.sleep(0.05)
    env = dict(spec["env"], INVOCATION_ID=uuid.uuid4().hex)
    log = open(os.path.join(units, unit + ".log"), "ab")
    p = subprocess.Popen([sys.executable, "-c",
                          "import os,sys; open(sys.argv[1], 'w').write(str(os.getpid())); "
                          "os.execvpe(sys.argv[2], sys.argv[2:], os.environ)", procs, *spec["argv"]],
                         cwd=spec["cwd"], env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                         start_new_session=True)
    open(os.path.join(units, unit + ".main"), "w").write(str(p.pid))
''')


def _cgroup_root() -> Path:
    """A cgroup hierarchy where systemd keeps units: v2 (0::) or v1 name=systemd, whichever this machine mounts
    writable; fails the test (never skips) when neither is."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        mount, fstype = fields[4], line.split(" - ")[1].split()[0]
        opts = line.split(" - ")[1].split()[2] if len(line.split(" - ")[1].split()) > 2 else ""
        if (fstype == "cgroup2" or (fstype == "cgroup" and "name=systemd" in opts)) and os.access(mount, os.W_OK):
            return Path(mount)
    pytest.fail("no writable cgroup hierarchy (cgroup2, or v1 name=systemd) to put a stand-in 'unit' in: run as root",
                pytrace=False)


@pytest.fixture
def unit_cgroup():
    assert os.geteuid() == 0, "this test makes a cgroup: run it as root (CI does)"
    name = f"eaglepatch-test-{secrets.token_hex(4)}.service"
    path = _cgroup_root() / name
    path.mkdir()
    try:
        yield name, path
    finally:
        for pid in (path / "cgroup.procs").read_text().split():
            try:
                os.kill(int(pid), 9)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while (path / "cgroup.procs").read_text().split() and time.monotonic() < deadline:
            time.sleep(0.05)
        path.rmdir()


@pytest.fixture
def standins():
    s = H.StandIns(PY)
    yield s
    s.cleanup()


def test_a_systemd_server_is_named_and_restarted_through_systemctl(standins, unit_cgroup, tmp_path):
    """status says which unit runs the server; apply and revert restart it with systemctl (the unit's own
    ExecStart, in its cgroup), not by relaunching its command line; a sweep, which must change the command line,
    is refused with the reason."""
    unit, cgroup = unit_cgroup
    install = make_install(standins, tmp_path / "install", "venv-by-path")
    port = standins.port()
    units = tmp_path / "units"
    units.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text(SYSTEMCTL.format(python=sys.executable))
    (bin_dir / "systemctl").chmod(0o755)
    venv = install.pkg.parents[3]
    argv = [str(venv / "bin" / "python"), "-m", "sglang.launch_server", "--port", str(port), "--startup-delay",
            "0.3", "--tp", "1"]
    env = dict(standins.venv_env(venv), INVOCATION_ID=secrets.token_hex(16))
    (units / f"{unit}.json").write_text(json.dumps({"cgroup": str(cgroup), "argv": argv, "cwd": str(tmp_path),
                                                   "env": env}))
    cli = CLI("local", dict(cli_env(tmp_path), PATH=f"{bin_dir}:{os.environ['PATH']}",
                            EAGLEPATCH_TEST_UNITS=str(units)))
    # "systemctl start": the unit's first process
    subprocess.run([str(bin_dir / "systemctl"), "restart", unit], check=True, env=cli.env)
    H.wait_http(port, timeout=30)
    first = int((units / f"{unit}.main").read_text())

    doc = cli.run("status", install.pkg, "--json").expect(0).json()
    [srv] = doc["servers"]
    assert srv["pid"] == first and srv["systemd_unit"] == unit and srv["launched"].startswith(f"systemd unit {unit}")

    r = cli.run("apply", install.pkg, "--timeout", "60").expect(0)
    assert "systemctl restart " + unit in r.err and "starting sglang on" not in r.err, r
    second = int((units / f"{unit}.main").read_text())
    assert second != first and not H.alive(first)
    [srv] = cli.run("status", install.pkg, "--json").expect(0).json()["servers"]
    assert (srv["pid"], srv["systemd_unit"], srv["code"]) == (second, unit, "current")
    assert str(second) in (cgroup / "cgroup.procs").read_text().split()

    r = cli.run("sweep", install.pkg, "--grid", "speculative-num-steps=1,2")
    assert r.rc == 2 and "runs under systemd" in r.err and unit in r.err, r
    assert int((units / f"{unit}.main").read_text()) == second and H.alive(second)

    r = cli.run("revert", install.pkg, "--timeout", "60").expect(0)
    assert "systemctl restart " + unit in r.err, r
    third = int((units / f"{unit}.main").read_text())
    assert third != second and H.launcher_pids(port) == [third]
    assert "[eaglepatch]" not in install.worker.read_text()
