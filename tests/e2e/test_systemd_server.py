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

from safety import CLI, REJECTS_PATCH, WORKER, H, cli_env, digest, make_install  # the fixture standins: conftest.py

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


class Unit:
    """A stand-in "service": its spec file for the stand-in systemctl, which (re)starts it in the unit's cgroup."""

    def __init__(self, standins, unit_cgroup, tmp_path, worker: str = WORKER):
        self.name, self.cgroup = unit_cgroup
        self.install = make_install(standins, tmp_path / "install", "venv-by-path", worker=worker)
        self.port = standins.port()
        self.units = tmp_path / "units"
        self.units.mkdir()
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        (bin_dir / "systemctl").write_text(SYSTEMCTL.format(python=sys.executable))
        (bin_dir / "systemctl").chmod(0o755)
        venv = self.install.pkg.parents[3]
        argv = [str(venv / "bin" / "python"), "-m", "sglang.launch_server", "--port", str(self.port),
                "--startup-delay", "0.3", "--tp", "1"]
        env = dict(standins.venv_env(venv), INVOCATION_ID=secrets.token_hex(16))
        (self.units / f"{self.name}.json").write_text(json.dumps({"cgroup": str(self.cgroup), "argv": argv,
                                                                  "cwd": str(tmp_path), "env": env}))
        self.cli = CLI("local", dict(cli_env(tmp_path), PATH=f"{bin_dir}:{os.environ['PATH']}",
                                     EAGLEPATCH_TEST_UNITS=str(self.units)))
        # "systemctl start": the unit's first process
        subprocess.run([str(bin_dir / "systemctl"), "restart", self.name], check=True, env=self.cli.env)
        H.wait_http(self.port, timeout=30)

    @property
    def main(self) -> int:
        return int((self.units / f"{self.name}.main").read_text())


def test_a_systemd_server_is_named_and_restarted_through_systemctl(standins, unit_cgroup, tmp_path):
    """status says which unit runs the server; apply and revert restart it with systemctl (the unit's own
    ExecStart, in its cgroup), not by relaunching its command line; a sweep, which must change the command line,
    is refused with the reason."""
    u = Unit(standins, unit_cgroup, tmp_path)
    unit, cgroup, install, cli, port = u.name, u.cgroup, u.install, u.cli, u.port
    first = u.main

    doc = cli.run("status", install.pkg, "--json").expect(0).json()
    [srv] = doc["servers"]
    assert srv["pid"] == first and srv["systemd_unit"] == unit and srv["launched"].startswith(f"systemd unit {unit}")

    r = cli.run("apply", install.pkg, "--timeout", "60").expect(0)
    assert "systemctl restart " + unit in r.err and "starting sglang on" not in r.err, r
    second = u.main
    assert second != first and not H.alive(first)
    [srv] = cli.run("status", install.pkg, "--json").expect(0).json()["servers"]
    assert (srv["pid"], srv["systemd_unit"], srv["code"]) == (second, unit, "current")
    assert str(second) in (cgroup / "cgroup.procs").read_text().split()

    r = cli.run("sweep", install.pkg, "--grid", "speculative-num-steps=1,2")
    assert r.rc == 2 and "runs under systemd" in r.err and unit in r.err, r
    assert u.main == second and H.alive(second)

    r = cli.run("revert", install.pkg, "--timeout", "60").expect(0)
    assert "systemctl restart " + unit in r.err, r
    third = u.main
    assert third != second and standins.launcher_pids(port) == [third]
    assert "[eaglepatch]" not in install.worker.read_text()


def test_a_patched_unit_that_crashes_is_rolled_back_through_systemctl(standins, unit_cgroup, tmp_path):
    """The patched server of a unit crashes at start: the rollback puts the files back and restarts the unit
    again (systemctl: never by hand), and the original comes up."""
    u = Unit(standins, unit_cgroup, tmp_path, worker=WORKER + REJECTS_PATCH)
    before = digest(u.install.pkg)
    r = u.cli.run("apply", u.install.pkg, "--timeout", "30")
    assert r.rc == 7 and "original files restored" in r.err and "the original server is up again" in r.err, r
    assert digest(u.install.pkg) == before
    assert r.err.count("systemctl restart " + u.name) == 2 and "starting sglang on" not in r.err
    assert standins.launcher_pids(u.port) == [u.main]


def test_a_server_started_inside_a_unit_is_not_restarted_with_it(standins, unit_cgroup, tmp_path):
    """A server started from a shell of a service (a Jupyter terminal, a CI job) sits in that unit's cgroup with
    its INVOCATION_ID, but is not the unit's main process: restarting the unit would stop everything else it
    runs, and relaunching the server by hand beside systemd is not safe either: apply refuses (exit 2), nothing
    changes."""
    u = Unit(standins, unit_cgroup, tmp_path)
    # the unit's main process is now something else (the service itself); the server merely runs inside it
    service = subprocess.Popen([sys.executable, "-c", "import sys,time; open(sys.argv[1],'a').write('%d ' % "
                                "__import__('os').getpid()); time.sleep(120)", str(u.cgroup / "cgroup.procs")],
                               start_new_session=True)
    standins.orphans.append(service.pid)
    (u.units / f"{u.name}.main").write_text(str(service.pid))
    server = standins.launcher_pids(u.port)[0]
    [srv] = u.cli.run("status", u.install.pkg, "--json").expect(0).json()["servers"]
    assert srv["pid"] == server and srv["systemd_unit"] == u.name
    before = digest(u.install.pkg)
    r = u.cli.run("apply", u.install.pkg, "--timeout", "30")
    assert r.rc == 2 and "without being its main process" in r.err, r
    assert digest(u.install.pkg) == before and standins.launcher_pids(u.port) == [server]
