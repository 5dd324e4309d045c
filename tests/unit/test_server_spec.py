"""LaunchSpec (kept in the backup manifest) and ServerProcess: JSON shapes and when relaunching is refused."""

from __future__ import annotations

import json

import pytest

from eaglepatch.errors import UsageError
from eaglepatch.server import LaunchSpec, ServerProcess, default_log_path, select_server

SCAN_ITEM = {
    "pid": 4242,
    "argv": ["/venv/bin/python3", "-m", "sglang.launch_server", "--model-path", "/m/a b", "--port", "30007",
             "--host", "0.0.0.0"],
    "args_index": 3,
    "cwd": "/srv/dir with spaces",
    "env": {"CUDA_VISIBLE_DEVICES": "0,1", "PATH": "/venv/bin:/usr/bin", "ODD": "x=y\tz"},
    "exe": "/usr/bin/python3.11",
    "children": [4300, 4301],
    "pgid": 4242,
    "sid": 4242,
    "start": 123456,
    "same_mount_ns": True,
}


def test_scan_item_becomes_a_server_process():
    proc = ServerProcess.from_scan(SCAN_ITEM)
    assert proc.pid == 4242
    assert proc.port == 30007
    assert proc.host == "0.0.0.0"
    assert proc.probe_host == "127.0.0.1"
    assert proc.children == (4300, 4301)
    assert (proc.pgid, proc.sid, proc.exe) == (4242, 4242, "/usr/bin/python3.11")


def test_to_json_is_the_server_object_of_status_and_show():
    """The contract's pid and argv, plus where it listens, runs from, and how it was launched."""
    proc = ServerProcess.from_scan(dict(SCAN_ITEM, launcher="/venv/bin/python3", interpreter="/venv/bin/python3",
                                        launch={"venv": "/venv", "activated": False, "imports": "site-packages"},
                                        started_at=1764500000.25))
    assert proc.to_json() == {
        "pid": 4242, "argv": SCAN_ITEM["argv"], "port": 30007, "cwd": "/srv/dir with spaces",
        "launcher": "/venv/bin/python3", "started_at": 1764500000.25, "systemd_unit": None,
        "launched": "/venv/bin/python3 -m sglang.launch_server (venv /venv, not activated); sglang from "
                    "site-packages"}


def test_a_systemd_server_is_described_and_not_relaunched_by_hand():
    """systemd would start a second server behind a hand relaunch: launch_spec refuses and names the unit."""
    proc = ServerProcess.from_scan(dict(SCAN_ITEM, systemd={"unit": "sglang.service", "user": False}))
    assert proc.unit == "sglang.service"
    assert proc.describe_launch().startswith("systemd unit sglang.service; ")
    with pytest.raises(UsageError, match="systemctl restart sglang.service"):
        proc.launch_spec()
    user = ServerProcess.from_scan(dict(SCAN_ITEM, systemd={"unit": "llm.service", "user": True}))
    assert user.unit is None  # a user unit: eaglepatch does not restart it by itself
    with pytest.raises(UsageError, match="systemctl --user restart llm.service"):
        user.launch_spec()


def test_launch_spec_takes_argv_cwd_env_port_and_leaves_the_default_log_to_the_host():
    """The default log is the host's (``server-PORT.log`` in its EAGLEPATCH_STATE_DIR): the spec names none, its
    JSON says null, and the client's fallback for a host that did not say is /tmp/eaglepatch."""
    spec = ServerProcess.from_scan(SCAN_ITEM).launch_spec()
    assert spec.argv == SCAN_ITEM["argv"]
    assert spec.cwd == "/srv/dir with spaces"
    assert spec.env == SCAN_ITEM["env"]
    assert (spec.port, spec.host) == (30007, "0.0.0.0")
    assert spec.log_path == "" and spec.to_json()["log_path"] is None
    assert default_log_path(30007) == "/tmp/eaglepatch/server-30007.log"
    assert default_log_path(30007, "/srv/state") == "/srv/state/server-30007.log"


def test_launch_spec_json_round_trip_is_exact():
    """What apply writes into the manifest is what revert reads back, through real JSON text."""
    spec = ServerProcess.from_scan(SCAN_ITEM).launch_spec(log_path="/var/log/x.log")
    again = LaunchSpec.from_json(json.loads(json.dumps(spec.to_json())))
    assert again == spec
    assert again.log_path == "/var/log/x.log"


def test_launch_spec_round_trip_keeps_bytes_that_are_not_utf8():
    """/proc gives bytes; a non-UTF-8 value decodes with surrogateescape and must survive JSON both ways."""
    spec = LaunchSpec(argv=["python3", "-m", "sglang.launch_server"], cwd="/", env={"X": "caf\udce9"})
    assert LaunchSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec


def test_launch_spec_from_json_defaults_port_host_and_log():
    spec = LaunchSpec.from_json({"argv": ["python3", "-m", "sglang.launch_server"], "cwd": "/", "env": {}})
    assert (spec.port, spec.host, spec.log_path) == (30000, "127.0.0.1", "")


def test_a_manifest_of_an_earlier_eaglepatch_naming_the_default_log_means_the_hosts_default():
    """Earlier manifests wrote the default log out (/tmp/eaglepatch/server-PORT.log): it reads as the default, so
    a revert writes where the host's EAGLEPATCH_STATE_DIR says now; a log of the user's own stays theirs."""
    base = {"argv": ["python3", "-m", "sglang.launch_server"], "cwd": "/", "env": {}, "port": 30001}
    assert LaunchSpec.from_json(dict(base, log_path="/tmp/eaglepatch/server-30001.log")).log_path == ""
    assert LaunchSpec.from_json(dict(base, log_path=None)).log_path == ""
    assert LaunchSpec.from_json(dict(base, log_path="/var/log/sglang.log")).log_path == "/var/log/sglang.log"
    # another port's default is a path like any other
    assert LaunchSpec.from_json(dict(base, log_path="/tmp/eaglepatch/server-30000.log")).log_path \
        == "/tmp/eaglepatch/server-30000.log"


@pytest.mark.parametrize(
    "bad,field",
    [
        ({"cwd": "/", "env": {}}, "argv"),
        ({"argv": [], "cwd": "/", "env": {}}, "argv"),
        ({"argv": ["python3", 3], "cwd": "/", "env": {}}, "argv"),
        ({"argv": ["python3"], "env": {}}, "cwd"),
        ({"argv": ["python3"], "cwd": "/", "env": {"A": 1}}, "env"),
        ({"argv": ["python3"], "cwd": "/", "env": {}, "port": "30000"}, "port"),
        ({"argv": ["python3"], "cwd": "/", "env": {}, "port": 70000}, "port"),
        ({"argv": ["python3"], "cwd": "/", "env": {}, "port": True}, "port"),
    ],
)
def test_a_damaged_manifest_entry_is_refused_naming_the_field(bad, field):
    with pytest.raises(ValueError, match=field):
        LaunchSpec.from_json(bad)


def test_another_users_server_cannot_be_relaunched_and_the_message_says_what_to_do():
    """Without its cwd and environment (unreadable in /proc), a relaunch would start a different server."""
    proc = ServerProcess.from_scan(dict(SCAN_ITEM, cwd=None, env=None))
    with pytest.raises(UsageError, match="--restart-cmd"):
        proc.launch_spec()


def test_a_server_in_a_container_cannot_be_relaunched_from_the_host():
    proc = ServerProcess.from_scan(dict(SCAN_ITEM, same_mount_ns=False))
    with pytest.raises(UsageError, match="container"):
        proc.launch_spec()


def test_unknown_namespace_does_not_block_a_relaunch():
    """Reading /proc/PID/ns needs the same rights as the environment; None there is not evidence of a container."""
    assert ServerProcess.from_scan(dict(SCAN_ITEM, same_mount_ns=None)).launch_spec().cwd == SCAN_ITEM["cwd"]


def test_select_server_by_port_or_the_only_one():
    a = ServerProcess.from_scan(SCAN_ITEM)
    b = ServerProcess.from_scan(dict(SCAN_ITEM, pid=5000, argv=["python3", "-m", "sglang.launch_server"]))
    assert select_server([]) is None
    assert select_server([a]) is a
    assert select_server([a, b], port=30000) is b
    assert select_server([a, b], port=1) is None
    with pytest.raises(UsageError, match="several"):
        select_server([a, b])
