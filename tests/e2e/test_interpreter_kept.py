"""The interpreter ``python3`` started as on a host, kept by the client (eaglepatch/hosts/interpreters.py), over the
real sshd: the first command keeps it, the next ones start it directly, and one that no longer exists on the host
(exit 127 through the login shell) costs one more start by the name, never a failed command."""

from __future__ import annotations

import json

import pytest

from safety import CLI, cli_env, make_install

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def test_the_kept_interpreter_is_started_directly_and_a_stale_one_falls_back(sshd, standins, tmp_path):
    env = cli_env(tmp_path, sshd.env())
    cli = CLI("ssh", env, ssh=[sshd.target, "-i", sshd.client_key])
    kept = tmp_path / "client cache" / "eaglepatch" / "interpreters.json"
    install = make_install(standins, tmp_path / "install", "pythonpath")

    first = cli.run("status", install.pkg, "--json").expect(0).json()
    assert first["package_dir"] and first["package_dir"].endswith("sglang")
    [(key, names)] = json.loads(kept.read_text()).items()
    assert key.startswith("ssh ") and "127.0.0.1" in key
    exe = names["python3"]
    assert exe.startswith("/") and "python" in exe

    again = cli.run("status", install.pkg, "--json").expect(0).json()
    assert again["package_dir"] == first["package_dir"]
    assert json.loads(kept.read_text()) == {key: {"python3": exe}}

    kept.write_text(json.dumps({key: {"python3": str(tmp_path / "gone" / "python3")}}))
    stale = cli.run("status", install.pkg, "--json").expect(0).json()
    assert stale["package_dir"] == first["package_dir"]
    assert json.loads(kept.read_text()) == {key: {"python3": exe}}  # what the name runs, kept again

    off = cli.run("status", install.pkg, "--json", env={"EAGLEPATCH_INTERPRETER_CACHE": "0"}).expect(0).json()
    assert off["package_dir"] == first["package_dir"]
