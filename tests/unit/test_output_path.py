"""Where a restarted server's output goes (issue 42): the scan reads where the server's stdout and stderr go
(regular files only, the very file their path names), the launch spec carries it (kept in apply's manifest), and
the relaunch appends to the same files, after checks (no symlink, the same inode, writable by this user); else
the private log, and the reason said."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from eaglepatch.hostside.control import _open_kept, op_start
from eaglepatch.hostside.discover import output_files
from eaglepatch.server import LaunchSpec, ServerProcess
from eaglepatch.server.control import start_payload, started_result
from eaglepatch.server.restart import output_words

SCAN_ITEM = {
    "pid": 4242,
    "argv": ["/venv/bin/python3", "-m", "sglang.launch_server", "--port", "30007", "--api-key", "s3cret"],
    "args_index": 3,
    "cwd": "/srv",
    "env": {"PATH": "/usr/bin"},
    "exe": "/usr/bin/python3.11",
    "output": {"stdout": {"path": "/srv/server.log", "dev": 2049, "ino": 77},
               "stderr": {"path": "/srv/server.log", "dev": 2049, "ino": 77}},
}


# ------------------------------------------------------------------------------------------------------------
# the launch spec


def test_the_output_files_go_from_the_scan_through_the_launch_spec_and_json_to_the_start_payload():
    srv = ServerProcess.from_scan(SCAN_ITEM)
    spec = srv.launch_spec()
    assert spec.output == SCAN_ITEM["output"]
    again = LaunchSpec.from_json(json.loads(json.dumps(spec.to_json())))  # apply's manifest, revert's read
    assert again == spec and again.output == SCAN_ITEM["output"]
    payload = start_payload(again)
    assert payload["output"] == SCAN_ITEM["output"]
    assert payload["log_path"] is None  # the fallback (and the lock's folder): the host's default, resolved there
    assert "s3cret" not in " ".join(payload["shown_argv"])  # the marker line written into the user's file
    assert srv.output_json() == {"stdout": "/srv/server.log", "stderr": "/srv/server.log", "log": None}


def test_a_server_without_output_files_says_where_a_restart_writes_it():
    srv = ServerProcess.from_scan(dict(SCAN_ITEM, output={"stdout": None, "stderr": None}))
    assert srv.launch_spec().output == {"stdout": None, "stderr": None}
    assert srv.output_json() == {"stdout": None, "stderr": None, "log": "/tmp/eaglepatch/server-30007.log"}
    # a host whose scan names its state folder (EAGLEPATCH_STATE_DIR): that folder's log
    told = ServerProcess.from_scan(dict(SCAN_ITEM, output={"stdout": None, "stderr": None}, state_dir="/srv/state"))
    assert told.output_json()["log"] == "/srv/state/server-30007.log"
    for bad in ("state", 7, "/srv/\0x"):  # a folder that is no absolute path is not used
        assert ServerProcess.from_scan(dict(SCAN_ITEM, state_dir=bad)).state_dir is None
    old = ServerProcess.from_scan({k: v for k, v in SCAN_ITEM.items() if k != "output"})  # an older host side
    assert old.launch_spec().output is None
    assert LaunchSpec.from_json({"argv": ["python3"], "cwd": "/", "env": {}}).output is None  # an older manifest
    # what a host sends that is not such an object is not used
    assert ServerProcess.from_scan(dict(SCAN_ITEM, output={"stdout": {"path": "rel.log", "dev": 1, "ino": 2}})).output \
        is None


@pytest.mark.parametrize("bad", [
    "server.log",
    {"stdout": "/srv/server.log"},
    {"stdout": {"path": "server.log", "dev": 1, "ino": 2}},
    {"stdout": {"path": "/srv/server.log", "dev": "1", "ino": 2}},
    {"stdout": {"path": "/srv/server.log", "dev": 1}},
    {"stdout": None, "stdin": None},
    {"stderr": {"path": "/srv/a\0b", "dev": 1, "ino": 2}},
])
def test_a_damaged_output_in_a_manifest_is_refused_naming_the_field(bad):
    with pytest.raises(ValueError, match="output"):
        LaunchSpec.from_json({"argv": ["python3"], "cwd": "/", "env": {}, "output": bad})


# ------------------------------------------------------------------------------------------------------------
# the scan


def _sleeper(**redirect):
    return subprocess.Popen(["sleep", "30"], stdin=subprocess.DEVNULL, **redirect)


def test_the_scan_keeps_regular_files_only_and_only_while_their_path_names_them(tmp_path):
    log = tmp_path / "server.log"
    err = tmp_path / "err.log"
    with open(log, "ab") as out, open(err, "ab") as e:
        both = _sleeper(stdout=out, stderr=subprocess.STDOUT)
        split = _sleeper(stdout=out, stderr=e)
    piped = _sleeper(stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    gone = tmp_path / "gone.log"
    with open(gone, "ab") as out:
        deleted = _sleeper(stdout=out, stderr=subprocess.DEVNULL)
    gone.unlink()
    # what /proc says of a deleted file is its path and " (deleted)": a file of that name is another file
    (tmp_path / "gone.log (deleted)").write_text("a decoy\n")
    moved = tmp_path / "moved.log"
    with open(moved, "ab") as out:
        replaced = _sleeper(stdout=out, stderr=subprocess.DEVNULL)
    moved.rename(tmp_path / "moved.log.1")
    moved.write_text("another file at the same path\n")
    procs = [both, split, piped, deleted, replaced]
    try:
        st = log.stat()
        entry = {"path": str(log), "dev": st.st_dev, "ino": st.st_ino}
        assert output_files(both.pid) == {"stdout": entry, "stderr": entry}
        assert output_files(split.pid) == {"stdout": entry, "stderr": {"path": str(err), "dev": err.stat().st_dev,
                                                                       "ino": err.stat().st_ino}}
        assert output_files(piped.pid) == {"stdout": None, "stderr": None}  # a pipe, /dev/null
        assert output_files(deleted.pid)["stdout"] is None
        # renamed (logrotate): the path it has now names it; the old path names another file
        assert output_files(replaced.pid)["stdout"]["path"] == str(tmp_path / "moved.log.1")
    finally:
        for p in procs:
            p.kill()
            p.wait()


# ------------------------------------------------------------------------------------------------------------
# the relaunch's open rules


def _entry(path: Path) -> dict:
    st = path.stat()
    return {"path": str(path), "dev": st.st_dev, "ino": st.st_ino}


def _start(tmp_path: Path, output, script: str = "a=line; echo out-$a; echo err-$a >&2") -> dict:
    """op_start of a tiny server (sh) with ``output``; waits for it to end."""
    payload = {"argv": ["/bin/sh", "-c", script], "cwd": str(tmp_path), "env": {"PATH": os.environ["PATH"]},
               "log_path": str(tmp_path / "private" / "server-7.log"), "port": 7, "output": output}
    res = op_start(payload)
    assert res.get("pid"), res
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{res['pid']}") and time.monotonic() < deadline:
        try:
            os.waitpid(res["pid"], os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.02)
    return res


def test_a_regular_file_is_appended_to_after_the_marker_and_is_the_log_read(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("the original server's lines\n")
    res = _start(tmp_path, {"stdout": _entry(log), "stderr": _entry(log)})
    text = log.read_text()
    assert text.startswith("the original server's lines\n")
    after = text[res["offset"]:]
    assert "=== eaglepatch" in text[:res["offset"]] and "out-line" in after and "err-line" in after
    assert (res["log_path"], res["output"], res["kept"], res["notes"]) == (
        str(log), {"stdout": str(log), "stderr": str(log)}, ["stdout", "stderr"], [])
    assert not (tmp_path / "private" / "server-7.log").exists()  # nothing written to the private log
    assert (tmp_path / "private" / "start-7.sh").exists()


def test_stderr_to_a_file_of_its_own_is_appended_there_and_is_the_log_read(tmp_path):
    out, err = tmp_path / "out.log", tmp_path / "err.log"
    out.touch()
    err.touch()
    res = _start(tmp_path, {"stdout": _entry(out), "stderr": _entry(err)})
    assert "out-line" in out.read_text() and "err-line" not in out.read_text()
    assert "err-line" in err.read_text()[res["offset"]:]
    assert res["log_path"] == str(err) and res["kept"] == ["stdout", "stderr"]


def test_stderr_that_was_no_file_goes_with_stdout(tmp_path):
    log = tmp_path / "server.log"
    log.touch()
    res = _start(tmp_path, {"stdout": _entry(log), "stderr": None})
    assert "out-line" in log.read_text() and "err-line" in log.read_text()
    assert res["kept"] == ["stdout"] and res["log_path"] == str(log)


def test_no_output_file_is_the_private_log_as_before(tmp_path):
    res = _start(tmp_path, {"stdout": None, "stderr": None})
    private = tmp_path / "private" / "server-7.log"
    assert res["log_path"] == str(private) and res["kept"] == [] and res["notes"] == []
    assert "out-line" in private.read_text()


def _fell_back(tmp_path: Path, res: dict, original: Path, words: str) -> None:
    private = tmp_path / "private" / "server-7.log"
    assert res["log_path"] == str(private) and res["kept"] == [], res
    assert any(words in n for n in res["notes"]), res["notes"]
    assert "out-line" in private.read_text()
    assert "out-line" not in original.read_text()


def test_a_symlink_in_place_of_the_file_is_not_followed(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("original\n")
    entry = _entry(log)
    log.rename(tmp_path / "elsewhere.log")
    log.symlink_to(tmp_path / "elsewhere.log")  # the same inode, reached through a link
    res = _start(tmp_path, {"stdout": entry, "stderr": entry})
    _fell_back(tmp_path, res, tmp_path / "elsewhere.log", "symlink")


def test_a_file_replaced_by_another_is_not_written(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("original\n")
    entry = _entry(log)
    log.rename(tmp_path / "server.log.1")  # (kept, so that its inode number is not handed out again)
    log.write_text("someone else's file\n")  # another inode at the same path
    res = _start(tmp_path, {"stdout": entry, "stderr": entry})
    _fell_back(tmp_path, res, log, "another file")


def test_a_file_that_is_gone_is_not_created(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("original\n")
    entry = _entry(log)
    log.unlink()
    res = _start(tmp_path, {"stdout": entry, "stderr": entry})
    assert not log.exists() and any("gone" in n for n in res["notes"]), res


def test_a_file_this_user_may_not_write_is_not_written():
    """As another user (root drops to nobody, in a child process): the file is readable, not writable."""
    root = Path(tempfile.mkdtemp(prefix="eaglepatch-output-", dir="/tmp"))
    try:
        root.chmod(0o755)
        log = root / "server.log"
        log.write_text("original\n")
        log.chmod(0o644 if os.geteuid() == 0 else 0o444)
        private = root / "logs"
        private.mkdir()
        if os.geteuid() == 0:
            os.chown(private, 65534, 65534)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: as nobody when root
            try:
                os.close(r)
                if os.geteuid() == 0:
                    os.setgroups([])
                    os.setgid(65534)
                    os.setuid(65534)
                fd, why = _open_kept(_entry(log))
                res = op_start({"argv": ["/bin/sh", "-c", "a=line; echo out-$a"], "cwd": str(root),
                                "env": {"PATH": os.environ["PATH"]}, "log_path": str(private / "server-7.log"),
                                "port": 7, "output": {"stdout": _entry(log), "stderr": None}})
                os.write(w, json.dumps({"fd": fd, "why": why, "res": res}).encode())
            finally:
                os._exit(0)
        os.close(w)
        with os.fdopen(r) as f:
            got = json.loads(f.read())
        os.waitpid(pid, 0)
        assert got["fd"] is None and "may not write" in got["why"], got
        res = got["res"]
        assert res["log_path"] == str(private / "server-7.log") and res["kept"] == [], res
        assert any("may not write" in n for n in res["notes"])
        deadline = time.monotonic() + 10
        while "out-line" not in (private / "server-7.log").read_text() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert "out-line" in (private / "server-7.log").read_text()
        assert log.read_text() == "original\n"
    finally:
        subprocess.run(["rm", "-rf", str(root)], check=False)


# ------------------------------------------------------------------------------------------------------------
# what apply, revert and restart say


def test_what_the_relaunch_says_of_where_the_output_went():
    kept = started_result({"pid": 9, "log_path": "/srv/server.log", "output": {"stdout": "/srv/server.log",
                                                                              "stderr": "/srv/server.log"},
                           "kept": ["stdout", "stderr"], "notes": []})
    assert output_words(30000, kept) == ("its log: /srv/server.log (its own output file, appended to as before)",
                                         None)
    split = started_result({"pid": 9, "log_path": "/srv/err.log", "output": {"stdout": "/srv/out.log",
                                                                            "stderr": "/srv/err.log"},
                            "kept": ["stdout", "stderr"], "notes": []})
    assert output_words(30000, split) == (
        "its log: /srv/err.log (its stderr, appended to as before; its stdout appended to /srv/out.log)", None)
    private = "/tmp/eaglepatch/server-30000.log"
    none = started_result({"pid": 9, "log_path": private, "output": {"stdout": private, "stderr": private},
                           "kept": [], "notes": []})
    where, note = output_words(30000, none)
    assert where == f"its log: {private}" and note is not None and private in note and "no file" in note
    failed = started_result({"pid": 9, "log_path": private, "output": {"stdout": private, "stderr": private},
                             "kept": [], "notes": ["stdout: /srv/server.log is a symlink now"]})
    where, note = output_words(30000, failed)
    assert private in note and "/srv/server.log is a symlink now" in note
    old_host = started_result({"pid": 9, "log_path": private})  # a host side without these fields
    assert output_words(30000, old_host)[0] == f"its log: {private}"

