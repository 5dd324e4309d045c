"""The steps of the program that runs on the target (eaglepatch/hostside/): ``op_facts``'s (install.py: find the
package, list the worker files, read the manifest and backups, the runtime, take the lock, writability) and
``_execute``'s (execute.py: check what is there, stage temp files and compile, back up, write the manifest, swap in,
undo), ``op_live`` and ``op_logs``, each run here on a temporary folder laid out like an install.

The host-side modules are imported as they are (the host runs the same modules, bundled: eaglepatch.hosts.bundle);
a test that replaces a function or a module global does it with ``monkeypatch`` on the module whose functions look
it up (``execute.replace_file``, ``execute._fault``, ``execute.os``).

The plans executed here are made with ``eaglepatch.ops.plan.Write.payload``, as ``Session.execute`` makes them.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import socket
import stat
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from eaglepatch.hostside import execute, install, live, lock, logs
from unprivileged import as_unprivileged, give, user_folder
from eaglepatch.ops.plan import Write

TOKEN = "0123456789abcdef"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


V1 = (b"class EAGLEWorker(TpModelWorker):\n"
      b"    def forward_batch_generation(self, batch):\n"
      b"        return self.verify(batch, self.draft(batch))\n")
V1_NEW = V1.replace(b"    def forward", b"    @_eaglepatch.entry  # [eaglepatch]\n    def forward")
RUNTIME = b"_CONFIG = {}  # eaglepatch:config\n"


class Install:
    """A temporary install: <root>/lib/python3.10/site-packages/sglang with srt/speculative/eagle_worker.py."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.pkg = root / "lib" / "python3.10" / "site-packages" / "sglang"
        self.spec = self.pkg / "srt" / "speculative"
        self.spec.mkdir(parents=True)
        (self.pkg / "__init__.py").write_text("")
        (self.pkg / "version.py").write_text('__version__ = "0.5.3"\n')
        self.worker = self.spec / "eagle_worker.py"
        self.worker.write_bytes(V1)
        self.worker.chmod(0o640)
        self.runtime = self.spec / "_eaglepatch_runtime.py"
        self.backup_dir = self.spec / ".eaglepatch"
        self.backup = self.backup_dir / "eagle_worker.py.orig"
        self.manifest = self.backup_dir / "manifest.json"
        self.lock = self.spec / ".eaglepatch.lock"

    def take_lock(self, token: str = TOKEN) -> None:
        self.lock.write_text(json.dumps({"token": token, "time": time.time()}))

    def snapshot(self) -> dict[str, str]:
        """Every path under the root: a file's sha256 and mode, a folder's mode."""
        out = {}
        for dirpath, dirs, files in os.walk(self.root):
            for name in dirs + files:
                p = Path(dirpath) / name
                mode = oct(stat.S_IMODE(p.lstat().st_mode))
                out[str(p.relative_to(self.root))] = f"dir {mode}" if p.is_dir() else f"{sha(p.read_bytes())} {mode}"
        return out

    def payload(self, writes: list[Write], manifest: dict[str, Any] | None, **extra: Any) -> dict[str, Any]:
        """An execute request as ``Session.execute`` sends it (the runtime's expected bytes: what is there)."""
        items = []
        for w in writes:
            p = w.payload()
            if w.path == str(self.runtime):
                p["expect_sha256"] = sha(self.runtime.read_bytes()) if self.runtime.exists() else None
            items.append(p)
        return dict({"token": TOKEN, "lock_path": str(self.lock), "writes": items,
                     "manifest": {"path": str(self.manifest), "data": manifest}, "fault": None, "then": None}, **extra)

    def apply_plan(self) -> list[Write]:
        """What ``plan_apply`` plans for a pristine worker: the patched file (backed up first), a new runtime."""
        return [Write(str(self.worker), "sglang/srt/speculative/eagle_worker.py", V1, V1_NEW, backup=str(self.backup)),
                Write(str(self.runtime), "sglang/srt/speculative/_eaglepatch_runtime.py", None, RUNTIME)]

    def revert_plan(self) -> list[Write]:
        """What ``plan_revert`` plans for the install ``apply_plan`` left: the original back, the runtime and the
        backup removed."""
        return [Write(str(self.worker), "sglang/srt/speculative/eagle_worker.py", V1_NEW, V1),
                Write(str(self.runtime), "sglang/srt/speculative/_eaglepatch_runtime.py", None, None, compile=False),
                Write(str(self.backup), "sglang/srt/speculative/.eaglepatch/eagle_worker.py.orig", None, None,
                      compile=False, expect_sha256=sha(V1))]


@pytest.fixture
def inst(tmp_path: Path) -> Install:
    return Install(tmp_path / "host")


def temps(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if ".eaglepatch-tmp-" in p.name)


# ---------------------------------------------------------------------------------------------------------------
# op_facts's steps


def test_the_package_is_found_from_a_prefix_the_package_or_a_file_inside_it(inst: Install) -> None:
    """--sglang-path may name a venv (lib/python3.X/site-packages/sglang below it), the package itself, or a file in
    it: each gives the same package, resolved; a folder without one is an error answered as it is."""
    pkg = str(inst.pkg.resolve())
    for hint in (inst.root, inst.pkg, inst.worker):
        assert install.facts_find_package({"sglang_path": str(hint)}, []) == (pkg, None), hint
    empty = inst.root.parent / "empty"
    empty.mkdir()
    assert install.facts_find_package({"sglang_path": str(empty)}, []) == (
        None, {"error": "no sglang package at %s" % empty})


def _server(pid: int, package_dir: str | None, port: int) -> dict[str, Any]:
    argv = ["python3", "-m", "sglang.launch_server", "--model-path", "/m", "--port", str(port)]
    return {"pid": pid, "argv": argv, "args_index": 3, "package_dir": package_dir, "interpreter": "/venv/bin/python"}


def test_the_package_is_not_guessed_between_two_installs_that_serve(monkeypatch: pytest.MonkeyPatch) -> None:
    """Servers of two installs run and nothing names one: the answer lists both (pid and port each) instead of
    picking one, which could stop the other install's server. One install serving: it is the one, and no
    interpreter is run to find it."""
    servers = [_server(11, "/b/sglang", 30001), _server(10, "/a/sglang", 30000), _server(12, "/a/sglang", 30002)]
    pkg, stop = install.facts_find_package({}, servers)
    assert pkg is None
    assert stop == {"ambiguous": [
        {"package_dir": "/a/sglang", "servers": [{"pid": 10, "port": 30000}, {"pid": 12, "port": 30002}]},
        {"package_dir": "/b/sglang", "servers": [{"pid": 11, "port": 30001}]}]}

    def no_interpreter(python: str) -> None:
        raise AssertionError("an interpreter was run although a server names the package")

    monkeypatch.setattr(install, "_package_of_python", no_interpreter)
    assert install.facts_find_package({}, servers[1:]) == ("/a/sglang", None)


def test_only_the_servers_of_the_package_are_ours() -> None:
    """A server of another install (or of none known) is only listed, by pid, port and package."""
    a, b, c = _server(10, "/a/sglang", 30000), _server(11, "/b/sglang", 30001), _server(12, None, 30002)
    mine, others = install.facts_servers_of([a, b, c], "/a/sglang")
    assert mine == [a]
    assert others == [{"pid": 11, "port": 30001, "package_dir": "/b/sglang"},
                      {"pid": 12, "port": 30002, "package_dir": None}]


def test_worker_files_are_the_entry_files_and_nothing_eaglepatch_made(inst: Install) -> None:
    """Only ``*.py`` files whose text matches the pattern are worker files, sorted, sub-folders included; the
    runtime module, temp files, ``__pycache__`` and the backups folder never are, though they match: patching one
    of them would patch eaglepatch's own files."""
    spec = inst.spec
    (spec / "sub").mkdir()
    (spec / "sub" / "ngram_worker.py").write_bytes(V1.replace(b"EAGLEWorker", b"NGRAMWorker"))
    (spec / "utils.py").write_text("def helper():\n    pass\n")
    (spec / "notes.txt").write_bytes(V1)
    (spec / "_eaglepatch_runtime.py").write_bytes(V1)
    (spec / ".eagle_worker.py.eaglepatch-tmp-0a1b").write_bytes(V1)  # a temp file as _execute names them
    (spec / "x.eaglepatch-tmp-0a1b.py").write_bytes(V1)  # any name with the tag, even one ending in .py
    (spec / "__pycache__").mkdir()
    (spec / "__pycache__" / "cached.py").write_bytes(V1)
    inst.backup_dir.mkdir()
    (inst.backup_dir / "kept.py").write_bytes(V1)
    files = install.facts_worker_files(str(inst.pkg), str(spec), install.ENTRY_NAMES)
    assert [f["path"] for f in files] == ["sglang/srt/speculative/eagle_worker.py",
                                          "sglang/srt/speculative/sub/ngram_worker.py"]
    first = files[0]
    assert base64.b64decode(first["data"]) == V1 and first["sha256"] == sha(V1)
    assert first["abs"] == str(inst.worker) and stat.S_IMODE(first["mode"]) == 0o640
    assert first["mtime"] == inst.worker.stat().st_mtime
    assert install.facts_worker_files(str(inst.pkg), str(spec / "nowhere"), install.ENTRY_NAMES) == []


@pytest.mark.parametrize("text", [
    "import torch\nclass W:\n    def forward_batch_generation(self, batch):\n        pass\n",
    "class W(Base):\n    pass\n",  # begins with a class definition
    "x = 1\nclass W(Base):\n    pass\n",  # a class further down: not by itself
    "def forward_batch_generation_v2(self):\n    pass\n",  # another name that begins with the entry's
    "def forward_batch_generationé(self):\n",  # a word character beyond ASCII after it
    "    def forward_batch_speculative_generation (self):\n",
    "# def forward_batch_generation\n",  # a comment still reads as one (as ever: the transform decides)
    "class  W(x)\n", "", "def helper():\n    pass\n",
])
def test_a_worker_file_is_told_as_the_one_alternation_told_it(text: str) -> None:
    """``worker_text`` is the search the facts request made before, ``def (NAMES)\\b|^class \\w+\\(`` in one
    pattern, split so that the re module can scan for its literal prefix: the same answer on every text."""
    names = ["forward_batch_generation", "forward_batch_speculative_generation"]
    before = re.compile(r"def (" + "|".join(re.escape(n) for n in sorted(names)) + r")\b|^class \w+\(")
    assert install.worker_text(names)(text) == (before.search(text) is not None)


def test_the_manifest_and_the_backups_it_names(inst: Install) -> None:
    """No manifest, or one that does not parse, reads as None (a half-written one must not stop revert); each
    backup the manifest names gets the sha256 of its bytes, None when it is missing or not named at all."""
    assert install.facts_manifest(str(inst.manifest)) is None
    inst.backup_dir.mkdir()
    inst.manifest.write_text('{"files": [')
    assert install.facts_manifest(str(inst.manifest)) is None
    inst.backup.write_bytes(V1)
    gone = str(inst.backup_dir / "gone.py.orig")
    inst.manifest.write_text(json.dumps({"files": [{"path": "a", "backup": str(inst.backup)},
                                                   {"path": "b", "backup": gone}, {"path": "c"}]}))
    manifest = install.facts_manifest(str(inst.manifest))
    assert install.facts_backups(manifest) == {str(inst.backup): sha(V1), gone: None, None: None}
    assert install.facts_backups(None) == {}


def test_the_runtime_module_as_found(inst: Install) -> None:
    """No runtime module: only ``runtime_sha256`` None (the client reads the missing bytes as None); one there:
    its sha256, its bytes (the diff of a --mode change needs them) and its mtime (is a server's code stale?)."""
    assert install.facts_runtime(str(inst.runtime)) == {"runtime_sha256": None}
    inst.runtime.write_bytes(RUNTIME)
    assert install.facts_runtime(str(inst.runtime)) == {
        "runtime_sha256": sha(RUNTIME), "runtime_data": base64.b64encode(RUNTIME).decode(),
        "runtime_mtime": inst.runtime.stat().st_mtime}


OWNER = {"token": TOKEN, "client_host": "laptop", "client_pid": 4242, "user": "me", "what": "apply"}


def test_the_facts_request_takes_the_lock_only_when_asked(inst: Install) -> None:
    """status reads facts without a lock (None); apply's facts take it (its owner and the time written, 0600); a
    second run's owner is refused with the holder named; an install without a speculative folder has no lock."""
    assert install.facts_take_lock(str(inst.spec), None) is None
    assert not inst.lock.exists()
    assert install.facts_take_lock(str(inst.spec), {"owner": OWNER}) == {"ok": True}
    held = json.loads(inst.lock.read_text())
    assert held["token"] == TOKEN and held["client_pid"] == 4242 and abs(held["time"] - time.time()) < 60
    assert stat.S_IMODE(inst.lock.stat().st_mode) == 0o600
    other = dict(OWNER, token="fedcba9876543210", client_pid=4343)
    answer = install.facts_take_lock(str(inst.spec), {"owner": other, "ttl": 7200})
    assert answer["ok"] is False and answer["held"]["token"] == TOKEN and answer["path"] == str(inst.lock)
    assert install.facts_take_lock(str(inst.spec / "nowhere"), {"owner": OWNER}) is None


def test_the_lock_of_a_dead_process_is_taken_over(inst: Install) -> None:
    """The client knows the pid of a run on its own machine is gone (``dead_pids``): its lock is stale and taken
    over at once. The same lock from a live run (not in dead_pids) or another machine is respected."""
    dead = {"token": "deaddeaddeaddead", "client_host": "laptop", "client_pid": 999999, "time": time.time()}
    inst.lock.write_text(json.dumps(dead))
    me = dict(OWNER, token="1111222233334444")
    assert lock.op_lock({"lock_path": str(inst.lock), "owner": me, "ttl": 7200, "dead_pids": []})["ok"] is False
    elsewhere = dict(me, client_host="desktop")
    refused = lock.op_lock({"lock_path": str(inst.lock), "owner": elsewhere, "ttl": 7200, "dead_pids": [999999]})
    assert refused["ok"] is False
    taken = lock.op_lock({"lock_path": str(inst.lock), "owner": me, "ttl": 7200, "dead_pids": [999999]})
    assert taken == {"ok": True}
    assert json.loads(inst.lock.read_text())["token"] == "1111222233334444"


def test_an_old_lock_or_an_old_empty_lock_file_is_stale(inst: Install) -> None:
    """A lock older than its ttl is taken over; an empty lock file (its taker is writing it this instant) is
    respected while fresh and taken over once its file is older than the ttl."""
    me = dict(OWNER, token="1111222233334444")
    req = {"lock_path": str(inst.lock), "owner": me, "ttl": 60, "dead_pids": []}
    inst.lock.write_text(json.dumps({"token": "old", "client_host": "x", "client_pid": 1, "time": time.time() - 61}))
    assert lock.op_lock(req) == {"ok": True}
    inst.lock.write_text("")
    assert lock.op_lock(req)["ok"] is False
    os.utime(inst.lock, (time.time() - 120, time.time() - 120))
    assert lock.op_lock(req) == {"ok": True}


def test_writability_and_owner(inst: Install) -> None:
    """A missing speculative folder cannot be written and has no owner; an existing one is writable by its owner
    (the test's user) and names that owner."""
    import pwd

    assert install.facts_writable(str(inst.spec / "nowhere")) == {"writable": False, "owner": None}
    me = pwd.getpwuid(os.geteuid()).pw_name
    assert install.facts_writable(str(inst.spec)) == {"writable": True, "owner": me}


def test_a_read_only_folder_is_not_writable() -> None:
    """Without write permission on the folder, apply could not create its temp files: ``writable`` says so (its
    owner, without the w bit). As root (CI) the check runs as ``nobody``: root may write a folder whatever its mode."""
    with user_folder() as base:
        spec = base / "speculative"
        spec.mkdir()
        give(spec)

        def writable(path: str) -> bool:
            return install.facts_writable(path)["writable"]

        assert as_unprivileged(writable, str(spec)) is True
        spec.chmod(0o555)
        assert as_unprivileged(writable, str(spec)) is False


def test_op_facts_answers_from_its_steps(inst: Install, monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole facts request, as ``gather`` gets it: the keys in their order, the worker file, the lock taken
    in the same request (and then read back), and the paths the planner uses."""
    monkeypatch.setattr(install, "op_scan", lambda payload: {"servers": []})
    answer = install.op_facts({"sglang_path": str(inst.root), "lock": {"owner": OWNER, "ttl": 7200},
                              "entries": ["forward_batch_generation"]})
    spec = str(inst.spec.resolve())
    assert list(answer) == ["hostname", "self_python", "servers", "user", "euid", "other_servers", "python",
                            "package_dir", "version", "spec_dir", "lock_result", "files", "backup_dir",
                            "manifest_path", "manifest", "backups", "runtime_sha256", "runtime_path", "lock_path",
                            "lock", "stale_temps", "writable", "owner"]
    assert answer["hostname"] == socket.gethostname() and answer["python"] == sys.executable
    assert answer["version"] == "0.5.3" and answer["spec_dir"] == spec
    assert [f["path"] for f in answer["files"]] == ["sglang/srt/speculative/eagle_worker.py"]
    assert answer["lock_result"] == {"ok": True} and answer["lock"]["token"] == TOKEN
    assert answer["manifest"] is None and answer["backups"] == {} and answer["runtime_sha256"] is None
    assert answer["manifest_path"] == spec + "/.eaglepatch/manifest.json"
    json.dumps(answer)  # one JSON document


def test_op_facts_stops_at_an_unknown_path(inst: Install, monkeypatch: pytest.MonkeyPatch) -> None:
    """A --sglang-path without a package answers the error and reads nothing more (no files, no lock taken)."""
    monkeypatch.setattr(install, "op_scan", lambda payload: {"servers": []})
    answer = install.op_facts({"sglang_path": str(inst.root / "nope"), "lock": {"owner": OWNER}})
    assert answer["error"] == "no sglang package at %s" % (inst.root / "nope")
    assert "files" not in answer and not inst.lock.exists()


# ---------------------------------------------------------------------------------------------------------------
# _execute's steps


def test_a_file_changed_since_it_was_read_is_refused_and_nothing_is_touched(inst: Install) -> None:
    """The plan was made from V1; someone edited the file since: the check answers a conflict naming the file and
    both short hashes, and the whole execution writes nothing (no temp file, no backup, no manifest)."""
    inst.take_lock()
    payload = inst.payload(inst.apply_plan(), {"files": []})
    inst.worker.write_bytes(V1 + b"# edited\n")
    before = inst.snapshot()
    run = execute.ExecRun(TOKEN)
    answer = execute.exec_check_unchanged(run, payload["writes"])
    assert answer == {"ok": False, "kind": "conflict", "path": str(inst.worker),
                      "error": "changed since it was read (expected %s, found %s)" % (
                          sha(V1)[:12], sha(V1 + b"# edited\n")[:12])}
    assert execute._execute(payload) == answer
    assert inst.snapshot() == before


def test_a_file_that_appeared_where_none_was_expected_is_refused(inst: Install) -> None:
    """``expect_sha256`` None means "no file there": a runtime module that appeared since the facts were read (a
    concurrent run without the lock) is not overwritten."""
    inst.take_lock()
    payload = inst.payload(inst.apply_plan(), {"files": []})
    inst.runtime.write_bytes(b"someone else's\n")
    answer = execute.exec_check_unchanged(execute.ExecRun(TOKEN), payload["writes"])
    assert answer["kind"] == "conflict" and answer["path"] == str(inst.runtime)
    assert "expected no file" in answer["error"]


def test_staging_writes_temps_with_the_original_s_mode_and_compiles_them(inst: Install) -> None:
    """Each temp file lies beside its destination with the bytes to write and the mode of the file it replaces (a
    new file: 0644); nothing is replaced yet. A removal stages nothing."""
    inst.runtime.write_bytes(RUNTIME)
    payload = inst.payload(inst.revert_plan()[1:2] + inst.apply_plan()[:1], None)
    run = execute.ExecRun(TOKEN)
    assert execute.exec_check_unchanged(run, payload["writes"]) is None
    staged, refused = execute.exec_stage(run, payload["writes"])
    assert refused is None
    assert [(w["path"], tmp) for w, tmp in staged] == [
        (str(inst.runtime), None),
        (str(inst.worker), str(inst.spec / (".eagle_worker.py.eaglepatch-tmp-" + TOKEN)))]
    tmp = Path(staged[1][1])
    assert tmp.read_bytes() == V1_NEW and stat.S_IMODE(tmp.stat().st_mode) == 0o640
    assert inst.worker.read_bytes() == V1 and inst.runtime.read_bytes() == RUNTIME
    new = inst.payload(inst.apply_plan()[1:], None)["writes"]
    inst.runtime.unlink()
    run = execute.ExecRun(TOKEN)
    execute.exec_check_unchanged(run, new)
    (_, tmp_path), = execute.exec_stage(run, new)[0]
    assert stat.S_IMODE(os.stat(tmp_path).st_mode) == 0o644


def test_code_that_does_not_compile_is_refused_before_anything_is_replaced(inst: Install) -> None:
    """The server's interpreter compiles every staged Python file: a syntax error answers ``compile`` with the
    line and the interpreter, its temp files are gone, and the install is as it was (no backup folder made)."""
    inst.take_lock()
    broken = Write(str(inst.worker), "w", V1, b"def broken(:\n", backup=str(inst.backup))
    before = inst.snapshot()
    answer = execute._execute(inst.payload([broken], {"files": []}))
    assert answer["ok"] is False and answer["kind"] == "compile" and answer["path"] == str(inst.worker)
    assert "(line 1)" in answer["error"] and answer["python"] == sys.executable
    assert inst.snapshot() == before and temps(inst.root) == []


def _record_replaces(monkeypatch: pytest.MonkeyPatch,
                     fail: Callable[[str, str], bool] = lambda src, dst: False) -> list[str]:
    """Replace the program's rename (``execute.replace_file``) with one that records each destination, and raises
    EACCES where ``fail`` says."""
    done: list[str] = []
    real = execute.replace_file

    def replace(src: str, dst: str) -> None:
        if fail(src, dst):
            raise PermissionError(13, "Permission denied", dst)
        done.append(dst)
        real(src, dst)

    monkeypatch.setattr(execute, "replace_file", replace)
    return done


def test_backups_and_the_manifest_are_written_before_any_rename(inst: Install, monkeypatch: pytest.MonkeyPatch) -> None:
    """The originals must be safe before a worker file changes: the backup (the original's bytes and mode) and
    the manifest land first, then the worker file, then the runtime, in plan order; the manifest is 0600 JSON."""
    inst.take_lock()
    renames = _record_replaces(monkeypatch)
    answer = execute._execute(inst.payload(inst.apply_plan(), {"files": [], "b": 1, "a": 2}))
    assert answer["ok"] is True, answer
    assert renames == [str(inst.backup), str(inst.manifest), str(inst.worker), str(inst.runtime)]
    assert inst.backup.read_bytes() == V1 and stat.S_IMODE(inst.backup.stat().st_mode) == 0o640
    assert inst.manifest.read_text() == json.dumps({"files": [], "b": 1, "a": 2}, indent=1, sort_keys=True)
    assert stat.S_IMODE(inst.manifest.stat().st_mode) == 0o600
    assert stat.S_IMODE(inst.backup_dir.stat().st_mode) == 0o700
    assert inst.worker.read_bytes() == V1_NEW and inst.runtime.read_bytes() == RUNTIME
    assert temps(inst.root) == [] and inst.lock.exists()  # the lock is op_execute's to release, not _execute's


def test_a_backup_that_already_holds_the_original_is_kept(inst: Install, monkeypatch: pytest.MonkeyPatch) -> None:
    """apply run again after a crash that left the backup: its bytes are the original's, so it is not rewritten
    (no rename onto it)."""
    inst.take_lock()
    inst.backup_dir.mkdir()
    inst.backup.write_bytes(V1)
    renames = _record_replaces(monkeypatch)
    assert execute._execute(inst.payload(inst.apply_plan(), {"files": []}))["ok"] is True
    assert str(inst.backup) not in renames and inst.backup.read_bytes() == V1


def test_a_failed_rename_puts_everything_back(inst: Install, monkeypatch: pytest.MonkeyPatch) -> None:
    """The runtime's rename fails after the worker file was replaced and the backup and manifest written: the
    worker gets its original bytes and mode back, the backup, the manifest and the folder made for them go, no
    temp file stays; the answer names the path that failed and nothing as unrestored."""
    inst.take_lock()
    before = inst.snapshot()
    _record_replaces(monkeypatch, fail=lambda src, dst: dst == str(inst.runtime))
    answer = execute._execute(inst.payload(inst.apply_plan(), {"files": []}))
    assert answer == {"ok": False, "kind": "io", "path": str(inst.runtime), "error": "Permission denied"}
    assert inst.snapshot() == before


def test_what_cannot_be_put_back_is_named(inst: Install, monkeypatch: pytest.MonkeyPatch) -> None:
    """When undoing fails too (the rename that would restore the worker file), the answer lists that path as
    unrestored: the client then tells the user to check it, never "nothing changed"."""
    inst.take_lock()
    _record_replaces(monkeypatch, fail=lambda src, dst: dst == str(inst.runtime) or src.endswith(TOKEN + "r"))
    answer = execute._execute(inst.payload(inst.apply_plan(), {"files": []}))
    assert answer["unrestored"] == [str(inst.worker)]
    assert inst.worker.read_bytes() == V1_NEW


class _OsRemoveFails:
    """``os`` for the host-side program (``execute``), whose ``remove`` fails on the paths ``fail`` names."""

    def __init__(self, fail: Callable[[str], bool]) -> None:
        self._fail = fail

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def remove(self, path: str) -> None:
        if self._fail(path):
            raise PermissionError(13, "Permission denied", path)
        os.remove(path)


def _applied(inst: Install) -> None:
    """The install as ``apply`` leaves it (the lock taken first when nobody holds it)."""
    if not inst.lock.exists():
        inst.take_lock()
    assert execute._execute(inst.payload(inst.apply_plan(), {"files": []}))["ok"] is True


def test_revert_puts_the_original_back_and_removes_what_apply_left(tmp_path: Path) -> None:
    """apply then revert: every byte and mode of the install as before apply (the backup folder goes with the
    manifest, being empty then), and the stale bytecode of the worker file is removed."""
    inst = Install(tmp_path / "host")
    inst.take_lock()
    pristine = inst.snapshot()
    _applied(inst)
    cache = inst.spec / "__pycache__"
    cache.mkdir()
    (cache / "eagle_worker.cpython-310.pyc").write_bytes(b"old")
    (cache / "eagle_worker_v2.cpython-310.pyc").write_bytes(b"other")
    answer = execute._execute(inst.payload(inst.revert_plan(), None))
    assert answer == {"ok": True, "bytecode_removed": ["eagle_worker.cpython-310.pyc"], "stale_temps_removed": []}
    (cache / "eagle_worker_v2.cpython-310.pyc").unlink()
    cache.rmdir()
    assert inst.snapshot() == pristine


def test_a_manifest_marked_last_is_written_only_once_the_files_are_swapped_in(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A multi-node revert leaves a restart's record as its manifest (``"last": true``): the patched manifest stands
    while the files are still patched (a kill at ``execute:after-backup`` leaves it, not a record that says the
    install is not patched), and the record replaces it only after the originals are back; a failure to write it
    puts everything back."""
    inst = Install(tmp_path / "host")
    inst.take_lock()
    _applied(inst)
    patched_manifest = inst.manifest.read_text()
    record = {"restart_record": True, "servers": [{"port": 30001}]}
    order = _record_replaces(monkeypatch)
    payload = inst.payload(inst.revert_plan(), record)
    payload["manifest"]["last"] = True
    assert execute._execute(payload)["ok"] is True
    assert order[-1] == str(inst.manifest) and order.index(str(inst.worker)) < order.index(str(inst.manifest))
    assert json.loads(inst.manifest.read_text()) == record and inst.worker.read_bytes() == V1

    inst2 = Install(tmp_path / "host2")
    inst2.take_lock()
    _applied(inst2)
    class Killed(BaseException):  # the helper killed there: nothing after it runs, nothing is undone
        pass

    def kill(payload, point):
        if point == "execute:after-backup":
            raise Killed

    monkeypatch.setattr(execute, "_fault", kill)
    payload = inst2.payload(inst2.revert_plan(), record)
    payload["manifest"]["last"] = True
    with pytest.raises(Killed):
        execute._execute(payload)
    assert inst2.manifest.read_text() == patched_manifest  # the patched one, beside the files still patched
    assert inst2.worker.read_bytes() == V1_NEW

    monkeypatch.setattr(execute, "_fault", lambda payload, point: None)
    inst3 = Install(tmp_path / "host3")
    inst3.take_lock()
    _applied(inst3)
    before = inst3.snapshot()
    _record_replaces(monkeypatch, fail=lambda src, dst: dst == str(inst3.manifest))
    payload = inst3.payload(inst3.revert_plan(), record)
    payload["manifest"]["last"] = True
    answer = execute._execute(payload)
    assert answer["ok"] is False and answer["path"] == str(inst3.manifest)
    assert inst3.snapshot() == before  # the record not written: the files patched again, the patched manifest back


def test_a_failed_removal_during_revert_puts_everything_back(inst: Install, monkeypatch: pytest.MonkeyPatch) -> None:
    """revert's removal of the runtime fails after the worker file got its original back: the patched worker file
    is put back too, so the install is left patched and whole (never a patched file without its runtime)."""
    _applied(inst)
    before = inst.snapshot()
    monkeypatch.setattr(execute, "os", _OsRemoveFails(lambda p: p == str(inst.runtime)))
    answer = execute._execute(inst.payload(inst.revert_plan(), None))
    assert answer["ok"] is False and answer["path"] == str(inst.runtime) and "unrestored" not in answer
    assert inst.snapshot() == before


def test_the_manifest_folder_stays_while_a_kept_copy_is_in_it(inst: Install) -> None:
    """revert --force keeps a drifted file's copy in .eaglepatch: removing the manifest must not take the folder
    (and the copy) with it."""
    _applied(inst)
    kept = inst.backup_dir / "eagle_worker.py.drifted-1"
    kept.write_bytes(b"drifted\n")
    run = execute.ExecRun(TOKEN)
    assert execute.exec_remove_manifest(run, {"path": str(inst.manifest), "data": None}) is None
    assert not inst.manifest.exists() and kept.read_bytes() == b"drifted\n"
    assert run.touched == [str(inst.manifest)] and run.prev[str(inst.manifest)][0] == b'{\n "files": []\n}'


def test_the_stale_temp_files_of_a_killed_run_are_removed(inst: Install) -> None:
    """A run killed between staging and renaming leaves ``.NAME.eaglepatch-tmp-TOKEN`` (and ``...r`` of an undo)
    beside its destinations and backups; the next run removes those, and only those, before it starts (it holds
    the lock, so none is another run's)."""
    inst.take_lock()
    inst.backup_dir.mkdir()
    stale = [inst.spec / ".eagle_worker.py.eaglepatch-tmp-abc123",
             inst.spec / ".eagle_worker.py.eaglepatch-tmp-abc123r",
             inst.backup_dir / ".manifest.json.eaglepatch-tmp-ff00"]
    kept = [inst.spec / ".eagle_worker.py.eaglepatch-tmp-NOTHEX", inst.spec / "eagle_worker.py.eaglepatch-tmp-abc",
            inst.root / ".x.eaglepatch-tmp-abc"]
    for p in stale + kept:
        p.write_bytes(b"x")
    payload = inst.payload(inst.apply_plan(), {"files": []})
    assert sorted(set(execute.exec_dirs(payload))) == [str(inst.spec), str(inst.backup_dir)]
    answer = execute._execute(payload)
    assert sorted(answer["stale_temps_removed"]) == sorted(str(p) for p in stale)
    assert not any(p.exists() for p in stale) and all(p.exists() for p in kept)


def test_without_the_lock_nothing_is_touched(inst: Install) -> None:
    """The lock expired and another run took it: this one answers a conflict before touching anything, not even
    the stale temp files (they may be that other run's, in flight)."""
    inst.take_lock("another-run-token")
    tmp = inst.spec / ".eagle_worker.py.eaglepatch-tmp-abc123"
    tmp.write_bytes(b"in flight")
    before = inst.snapshot()
    answer = execute._execute(inst.payload(inst.apply_plan(), {"files": []}))
    assert answer == {"ok": False, "kind": "conflict", "error": "lost the lock %s" % inst.lock}
    assert inst.snapshot() == before


class _Killed(Exception):
    pass


@pytest.mark.parametrize("point, expect", [
    ("execute:after-upload", "temps staged; no backup, no manifest; nothing replaced"),
    ("execute:after-backup", "backup and manifest written; nothing replaced"),
    ("execute:between-renames", "the worker file replaced; the runtime not yet"),
])
def test_the_failpoints_fire_where_the_crash_tests_expect(inst: Install, point: str,
                                                          expect: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """tests/e2e/test_crash_safety.py kills the host's helper at these names, and docs/safety.md's table says what
    each leaves: the helper dies (here: raises) at exactly that state, having met the earlier points in order."""
    inst.take_lock()
    met: list[str] = []

    def fault(payload: dict[str, Any], name: str) -> None:
        met.append(name)
        if payload.get("fault") == name:
            raise _Killed(name)

    monkeypatch.setattr(execute, "_fault", fault)
    with pytest.raises(_Killed):
        execute._execute(inst.payload(inst.apply_plan(), {"files": []}, fault=point))
    names = ["execute:after-upload", "execute:after-backup", "execute:between-renames"]
    assert met == names[:names.index(point) + 1]
    staged = temps(inst.root)
    if point == "execute:after-upload":
        assert len(staged) == 2 and not inst.backup_dir.exists()
    if point == "execute:after-backup":
        assert inst.backup.read_bytes() == V1 and inst.manifest.exists() and len(staged) == 2
    assert inst.worker.read_bytes() == (V1_NEW if point == "execute:between-renames" else V1), expect
    assert not inst.runtime.exists(), expect


def test_bytecode_of_exactly_the_written_files_is_dropped(inst: Install) -> None:
    """An old .pyc of a file just replaced could be loaded instead of it: every cached version of that module goes
    (any interpreter tag, .pyo too), a module whose name only starts the same does not."""
    cache = inst.spec / "__pycache__"
    cache.mkdir()
    for name in ("eagle_worker.cpython-310.pyc", "eagle_worker.cpython-38.opt-1.pyc", "eagle_worker.pyo",
                 "eagle_worker_v2.cpython-310.pyc", "eagle_worker.cpython-310.pyc.lock"):
        (cache / name).write_bytes(b"x")
    removed = execute.exec_drop_bytecode([{"path": str(inst.worker)}, {"path": str(inst.backup)}])
    assert sorted(removed) == ["eagle_worker.cpython-310.pyc", "eagle_worker.cpython-38.opt-1.pyc",
                               "eagle_worker.pyo"]
    assert sorted(p.name for p in cache.iterdir()) == ["eagle_worker.cpython-310.pyc.lock",
                                                       "eagle_worker_v2.cpython-310.pyc"]


# ----------------------------------------------------------------------------------------------------------------
# sweep --live: the lease and the config in the timing log folder (op_live)


def test_a_lease_is_written_whole_for_every_process_with_the_hosts_deadline(tmp_path: Path) -> None:
    """The folder is made 0700; each lease lands by a rename (never half written) 0600, its deadline by this
    host's clock; removing them removes exactly them."""
    d = tmp_path / "logs"
    before = time.time()
    res = live.op_live({"action": "write", "log_dir": str(d), "names": ["live-41.json", "live-42.json"],
                          "token": TOKEN, "steps": [0, 3], "lease_s": 60})
    assert res["ok"] is True and stat.S_IMODE(d.stat().st_mode) == 0o700
    for n in ("live-41.json", "live-42.json"):
        doc = json.loads((d / n).read_text())
        assert (doc["v"], doc["token"], doc["steps"]) == (1, TOKEN, [0, 3])
        assert before + 60 <= doc["deadline"] <= time.time() + 60
        assert stat.S_IMODE((d / n).stat().st_mode) == 0o600
    (d / "other.jsonl").write_text("")
    live.op_live({"action": "remove", "log_dir": str(d), "names": ["live-41.json", "live-42.json"]})
    assert sorted(p.name for p in d.iterdir()) == ["other.jsonl"]


def test_a_config_is_written_as_given(tmp_path: Path) -> None:
    d = tmp_path / "logs"
    live.op_live({"action": "write", "log_dir": str(d), "names": ["adaptive-0123456789abcdef.json"],
                    "data": '{"1": {"candidate_steps": [1, 3]}}\n'})
    assert (d / "adaptive-0123456789abcdef.json").read_text() == '{"1": {"candidate_steps": [1, 3]}}\n'


@pytest.mark.parametrize("name", ["../x.json", "live-1.json/..", "live-a.json", "server-30000.log", "adaptive-x.json"])
def test_only_a_live_sweeps_own_names_are_written_or_removed(tmp_path: Path, name: str) -> None:
    d = tmp_path / "logs"
    for action in ("write", "remove"):
        res = live.op_live({"action": action, "log_dir": str(d), "names": [name], "data": "x"})
        assert "not a live sweep's file name" in res["error"]
    assert list(d.iterdir()) == []


def test_a_log_folder_the_runtime_would_not_use_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "logs"
    d.mkdir(mode=0o777)
    os.chmod(d, 0o777)
    res = live.op_live({"action": "write", "log_dir": str(d), "names": ["live-1.json"], "token": TOKEN,
                          "steps": [1], "lease_s": 5})
    assert "only it can write" in res["error"] and list(d.iterdir()) == []
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    assert "only it can write" in live.op_live({"action": "answers", "log_dir": str(link), "launchers": [1]})["error"]


def test_the_runtimes_answers_are_read_for_the_leases_launchers(tmp_path: Path) -> None:
    d = tmp_path / "logs"
    d.mkdir(mode=0o700)
    me = os.getpid()
    (d / f"live-41-{me}.ack").write_text(json.dumps({"v": 1, "token": TOKEN, "pid": me, "rank": 0}))
    (d / "live-41-999999999.ack").write_text(json.dumps({"v": 1, "token": TOKEN, "pid": 999999999, "rank": 1}))
    (d / f"live-77-{me}.ack").write_text(json.dumps({"v": 1, "token": TOKEN}))  # another server's
    (d / "live-41-5.ack").write_text("not json")
    res = live.op_live({"action": "answers", "log_dir": str(d), "launchers": [41]})
    assert res["answers"] == [{"pid": me, "token": TOKEN, "rank": 0, "alive": True},
                              {"pid": 999999999, "token": TOKEN, "rank": 1, "alive": False}]


def test_a_running_servers_config_is_read_where_it_names_it(tmp_path: Path) -> None:
    (tmp_path / "cfg.json").write_text('{"1": {"candidate_steps": [3]}}')
    res = live.op_live({"action": "read_config", "path": "cfg.json", "cwd": str(tmp_path)})
    assert res["text"] == '{"1": {"candidate_steps": [3]}}'
    assert "cannot read" in live.op_live({"action": "read_config", "path": "nope.json", "cwd": str(tmp_path)})["error"]
    (tmp_path / "big.json").write_bytes(b" " * (65 * 1024))
    assert "larger than" in live.op_live({"action": "read_config", "path": str(tmp_path / "big.json")})["error"]


def test_what_op_live_says_is_one_whole_line(tmp_path: Path) -> None:
    """Each refusal as its whole line (eaglepatch shows it as the host's reason); every answer carries the host's
    clock (``now``: leases and deadlines are set by it)."""
    d = tmp_path / "logs"
    res = live.op_live({"action": "write", "log_dir": str(d), "names": ["x.json"], "data": "x"})
    assert res == {"error": "not a live sweep's file name: 'x.json'"}
    (tmp_path / "file").write_text("")
    res = live.op_live({"action": "answers", "log_dir": str(tmp_path / "file"), "launchers": [1]})
    assert res == {"error": "%s is not a directory of this user that only it can write: the server's runtime would "
                            "not follow a live sweep there" % (tmp_path / "file")}
    res = live.op_live({"action": "answers", "log_dir": str(tmp_path / "file" / "logs"), "launchers": [1]})
    assert res == {"error": "cannot make %s: Not a directory" % (tmp_path / "file" / "logs")}
    before = time.time()
    for payload in ({"action": "answers", "log_dir": str(d), "launchers": [1]},
                    {"action": "write", "log_dir": str(d), "names": ["live-1.json"], "token": TOKEN, "steps": [1],
                     "lease_s": 5}):
        res = live.op_live(payload)
        assert before <= res["now"] <= time.time(), res


def test_a_log_folder_that_others_may_enter_is_used(tmp_path: Path) -> None:
    """Only a write bit of group or others makes the folder one the runtime would not use (0o022), not 0711."""
    d = tmp_path / "logs"
    d.mkdir()
    os.chmod(d, 0o711)
    assert live.op_live({"action": "answers", "log_dir": str(d), "launchers": [1]})["answers"] == []


def test_answers_are_read_past_other_files_and_answers_that_are_not_one(tmp_path: Path) -> None:
    d = tmp_path / "logs"
    d.mkdir(mode=0o700)
    (d / "a-first.txt").write_text("")                                    # sorted before the answers
    (d / "live-10-1.ack").write_text("[1, 2]")                            # JSON, not an answer
    over = json.dumps({"token": TOKEN, "pad": ""})
    (d / "live-10-2.ack").write_text(over[:-2] + "x" * (4097 - len(over)) + '"}')  # 4,097 bytes: one too many
    (d / "live-10-3.ack").write_text(json.dumps({"token": TOKEN, "rank": 2}))
    res = live.op_live({"action": "answers", "log_dir": str(d), "launchers": [10]})
    assert res["answers"] == [{"pid": 3, "token": TOKEN, "rank": 2, "alive": os.path.exists("/proc/3")}]


def test_a_config_is_read_up_to_64_kib_as_text_without_following_a_link_or_blocking(tmp_path: Path) -> None:
    exact = tmp_path / "exact.json"
    exact.write_bytes(b"x" * (64 * 1024))
    res = live.op_live({"action": "read_config", "path": str(exact)})
    assert res == {"text": "x" * (64 * 1024), "path": str(exact)}
    big = tmp_path / "big.json"
    big.write_bytes(b"x" * (64 * 1024 + 1))
    assert live.op_live({"action": "read_config", "path": str(big)}) == {
        "error": "cannot read %s: larger than 65536 bytes" % big, "path": str(big)}
    (tmp_path / "bad.json").write_bytes(b'{"a": "\xff"}')
    assert live.op_live({"action": "read_config", "path": str(tmp_path / "bad.json")})["text"] == '{"a": "\ufffd"}'
    missing = tmp_path / "nope.json"
    assert live.op_live({"action": "read_config", "path": "nope.json", "cwd": str(tmp_path)}) == {
        "error": "cannot read %s: No such file or directory" % missing, "path": str(missing)}
    assert live.op_live({"action": "read_config", "path": "no-such-eaglepatch-config.json"})["path"] == \
        "/no-such-eaglepatch-config.json"                                 # relative to / without a cwd
    (tmp_path / "link.json").symlink_to(exact)
    assert live.op_live({"action": "read_config", "path": str(tmp_path / "link.json")})["error"].startswith(
        "cannot read %s: " % (tmp_path / "link.json"))
    os.mkfifo(str(tmp_path / "fifo.json"))
    assert live.op_live({"action": "read_config", "path": str(tmp_path / "fifo.json")})["error"] == (
        "cannot read %s: not a regular file" % (tmp_path / "fifo.json"))


# ----------------------------------------------------------------------------------------------------------------
# report: the timing logs fetched in bounded batches (op_logs), and resumed from the cache (fetch_logs_from)

def _log_lines(n: int) -> bytes:
    return b"".join(b'{"v": 1, "mode": "decode", "bs": %d, "cycle_ms": 10.5}\n' % i for i in range(n))


def test_a_batch_that_ends_inside_a_line_sends_only_the_whole_lines_before_it(tmp_path: Path) -> None:
    """The budget ends in the middle of a record: the host sends the lines before it and says ``more``; asked
    again from there, it sends the rest, so the batches put together are the file."""
    d = tmp_path / "logs"
    d.mkdir(mode=0o700)
    body = _log_lines(10)
    (d / "h-1-rank0.jsonl").write_bytes(body)
    line = body.index(b"\n") + 1
    budget = line * 3 + line // 2  # inside the fourth line
    got, have, rounds = b"", {}, 0
    while True:
        rounds += 1
        res = logs.op_logs({"log_dir": str(d), "have": have, "budget": budget})
        for f, data in zip(res["files"], res["__blobs__"], strict=True):
            data = bytes(data)  # a view of the batch read: the agent writes it as a frame
            assert f["offset"] == len(got) and data.endswith(b"\n") and f["size"] == len(data) <= budget
            got += data
        have = {str(d) + "/h-1-rank0.jsonl": len(got)}
        if not res["more"]:
            break
    assert got == body and rounds == 4  # 3 lines a batch: 3 + 3 + 3 + 1


def test_the_host_never_reads_more_than_one_batch_of_a_log_at_once(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """However big the file, one answer reads at most ``budget`` bytes of it: the host's memory does not grow with
    the log (every read of the open log files is seen through a wrapper)."""
    d = tmp_path / "logs"
    d.mkdir(mode=0o700)
    (d / "h-1-rank0.jsonl").write_bytes(_log_lines(5000))
    (d / "h-2-rank0.jsonl").write_bytes(_log_lines(5000))
    reads: list[int] = []
    real = logs._log_files

    class Counted:
        def __init__(self, f: Any) -> None:
            self.f = f

        def read(self, n: int = -1) -> bytes:
            reads.append(n)
            return self.f.read(n)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.f, name)

    def counted(*args: Any) -> Any:
        for name, f, st in real(*args):
            yield name, Counted(f), st

    monkeypatch.setattr(logs, "_log_files", counted)
    res = logs.op_logs({"log_dir": str(d), "have": {}, "budget": 4096})
    assert reads and all(0 <= n <= 4096 for n in reads), reads
    assert sum(f["size"] for f in res["files"]) == sum(map(len, res["__blobs__"])) <= 4096 and res["more"]


def test_a_fetch_cut_off_keeps_what_it_wrote_and_the_next_run_goes_on_from_there(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The connection breaks after two batches: the cache keeps those whole lines; the next ``report`` asks from
    the cached size (not from 0) and ends with the host's file, byte for byte."""
    from eaglepatch.errors import ConnectionFailed
    from eaglepatch.ops import logs as fetch

    d = tmp_path / "logs"
    d.mkdir(mode=0o700)
    body = _log_lines(400)
    (d / "h-1-rank0.jsonl").write_bytes(body)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    _fetch_in_batches(monkeypatch, 1000, cut_after=2)
    with pytest.raises(ConnectionFailed):
        fetch.fetch_logs_from(None, "gpu1", "python3", str(d), lambda _m: None)  # type: ignore[arg-type]
    cached = list((tmp_path / "cache").rglob("h-1-rank0.jsonl"))
    assert len(cached) == 1
    kept = cached[0].read_bytes()
    assert 0 < len(kept) < len(body) and body.startswith(kept) and kept.endswith(b"\n")
    asked = _fetch_in_batches(monkeypatch, 1000)
    fetch.fetch_logs_from(None, "gpu1", "python3", str(d), lambda _m: None)  # type: ignore[arg-type]
    assert asked[0] == {str(d) + "/h-1-rank0.jsonl": len(kept)} and asked[1:] and not any(asked[1:])
    assert cached[0].read_bytes() == body


@pytest.mark.parametrize("lie", ["fewer attachments", "more bytes than it says", "not bytes", "sizes not one a file",
                                 "a size that is no number"])
def test_log_bytes_that_are_not_what_the_answer_says_are_refused_and_nothing_is_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lie: str) -> None:
    """Each file of a logs answer has its bytes as the attachment at the same place, as many as its ``size``: a host
    that sends fewer attachments, more bytes than it says, or something else, has its whole answer refused
    (BadAnswer) before a byte of it reaches the cache; so has one whose ``sizes`` (of the files it lists: what
    the fetch will bring) are not one whole number per file."""
    from eaglepatch.errors import BadAnswer

    def tamper(res: dict[str, Any], blobs: list[Any]) -> list[Any]:
        if lie == "fewer attachments":
            return blobs[:1]
        if lie == "sizes not one a file":
            res["sizes"] = {d: v[:1] for d, v in res["sizes"].items()}
            return blobs
        if lie == "a size that is no number":
            res["sizes"] = {d: [True] * len(v) for d, v in res["sizes"].items()}
            return blobs
        if lie == "more bytes than it says":
            blobs[1] += b'{"v": 1}\n'
        else:
            blobs[1] = blobs[1].decode()
        return blobs

    with pytest.raises(BadAnswer, match="refused"):
        _fetch_through_a_lying_host(tmp_path, monkeypatch, 2, tamper)
    assert not list((tmp_path / "cache").rglob("*.jsonl"))


def _fetch_through_a_lying_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: int,
                                tamper: Any) -> None:
    """Fetch a folder of ``files`` logs (h-N-rank0.jsonl, 3 records each) through this machine's host-side logs
    step, whose every answer ``tamper(answer, attachments)`` changes first (it returns the attachments to send)."""
    from eaglepatch.ops import logs as fetch

    d = tmp_path / "logs"
    d.mkdir(mode=0o700)
    for i in range(1, files + 1):
        (d / f"h-{i}-rank0.jsonl").write_bytes(_log_lines(3))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))

    def call_each(host: Any, python: str, op: str, /, *, follow: Any, on_result: Any, **payload: Any) -> None:
        res = logs.op_logs(payload)
        blobs = [bytes(b) for b in res.pop("__blobs__")]
        res = json.loads(json.dumps(res))
        blobs = tamper(res, blobs)
        follow(res)
        on_result(dict(res, __blobs__=blobs))

    monkeypatch.setattr(fetch, "call_each", call_each)
    fetch.fetch_logs_from(None, "gpu1", "python3", str(d), lambda _m: None)  # type: ignore[arg-type]


def test_a_folder_of_more_logs_than_one_answer_may_attach_comes_in_several(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """1,100 small logs (a sweep's many launches leave such a folder): an answer attaches at most MAX_LOG_FILES of
    them (the client takes at most MAX_BLOBS attachments), and says ``more``; through the real agent on this machine,
    every file arrives whole."""
    from eaglepatch.hosts.agent import MAX_BLOBS
    from eaglepatch.hosts.local import LocalHost
    from eaglepatch.ops import logs as fetch

    assert logs.MAX_LOG_FILES <= MAX_BLOBS
    d = tmp_path / "logs"
    d.mkdir(mode=0o700)
    for i in range(1100):
        (d / f"h-{i}-rank0.jsonl").write_bytes(_log_lines(1))
    first = logs.op_logs({"log_dir": str(d), "have": {}})
    assert len(first["files"]) == logs.MAX_LOG_FILES and first["more"]
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    host = LocalHost()
    try:
        folder = fetch.fetch_logs_from(host, "local", os.path.realpath(sys.executable), str(d), lambda _m: None)
    finally:
        host.close()
    got = sorted(Path(folder).rglob("*.jsonl"))
    assert len(got) == 1100 and all(p.read_bytes() == _log_lines(1) for p in got)


@pytest.mark.parametrize("lie", ["a file it does not list", "a file twice"])
def test_log_bytes_of_a_file_the_answer_does_not_list_once_are_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lie: str) -> None:
    """Bytes for a file the answer does not list in that folder, or for one file twice in one answer: the whole
    answer refused before a byte of it is written."""
    from eaglepatch.errors import BadAnswer

    def tamper(res: dict[str, Any], blobs: list[Any]) -> list[Any]:
        if lie == "a file it does not list":
            res["files"].append(dict(res["files"][0], name="h-9-rank0.jsonl"))
        else:
            res["files"].append(dict(res["files"][0]))
        return blobs + [blobs[0]]

    with pytest.raises(BadAnswer, match="does not list once"):
        _fetch_through_a_lying_host(tmp_path, monkeypatch, 1, tamper)
    assert not list((tmp_path / "cache").rglob("*.jsonl"))


def _fetch_in_batches(monkeypatch: pytest.MonkeyPatch, budget: int, cut_after: int | None = None) -> list[dict[str, int]]:
    """``ops.logs.call_each`` replaced by the host's logs step on this machine, in batches of ``budget`` bytes (the
    connection broken after ``cut_after`` answers); returns what each request said the cache had."""
    from eaglepatch.errors import ConnectionFailed
    from eaglepatch.ops import logs as fetch

    asked: list[dict[str, int]] = []

    def call_each(host: Any, python: str, op: str, /, *, follow: Any, on_result: Any, **payload: Any) -> None:
        while True:
            if len(asked) == cut_after:
                raise ConnectionFailed("connection reset")
            asked.append(dict(payload.get("have") or {}))
            res = logs.op_logs(dict(payload, budget=budget))
            blobs = [bytes(b) for b in res.pop("__blobs__")]
            res = json.loads(json.dumps(res))
            nxt = follow(res)
            on_result(dict(res, __blobs__=blobs))
            if nxt is None:
                return
            payload = nxt

    monkeypatch.setattr(fetch, "call_each", call_each)
    return asked


def test_a_fetch_tells_its_watch_the_files_it_will_leave_then_each_batch_it_writes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The watch (``report`` aggregates while it fetches) hears once, before a byte is written, which files the
    fetch will leave in the cache, as ``iter_log_files`` lists them afterwards (an empty log on the host leaves
    none), then each batch as it is written, the file's size after it, and of each file once it gets no more: the
    first as soon as the answers go on to the second, not at the fetch's end."""
    from eaglepatch.ops import logs as fetch
    from eaglepatch.report import iter_log_files

    d = tmp_path / "logs"
    d.mkdir(mode=0o700)
    (d / "h-1-rank0.jsonl").write_bytes(_log_lines(300))
    (d / "h-1-rank1.jsonl").write_bytes(_log_lines(200))
    (d / "h-2-rank0.jsonl").write_bytes(b"")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    _fetch_in_batches(monkeypatch, 4000)
    seen: list[Any] = []

    class Watch:
        def begin(self, files: list[str], sizes: dict[str, int]) -> None:
            assert not list((tmp_path / "cache").rglob("*.jsonl"))
            seen.append(("begin", files, sizes))

        def wrote(self, path: str, size: int, replaced: bool) -> None:
            assert os.path.getsize(path) == size and not replaced and ("complete", path) not in seen
            seen.append((path, size))

        def complete(self, path: str) -> None:
            assert ("complete", path) not in seen
            seen.append(("complete", path))

    folder = fetch.fetch_logs_from(None, "gpu1", "python3", str(d), lambda _m: None,  # type: ignore[arg-type]
                                   watch=Watch())
    files = iter_log_files([folder])
    assert [os.path.basename(f) for f in files] == ["h-1-rank0.jsonl", "h-1-rank1.jsonl"]
    assert seen[0] == ("begin", files, dict.fromkeys(files, 0))
    assert len(seen) > 5 and all(s[0] != "begin" for s in seen[1:])
    for f in files:
        sizes = [size for path, size in seen[1:] if path == f]
        assert sizes == sorted(sizes) and sizes[-1] == os.path.getsize(f)
        assert seen.count(("complete", f)) == 1
    first, second = files
    assert seen.index(("complete", first)) < [s[0] for s in seen].index(second)


def test_a_report_aggregated_while_fetching_resumes_after_a_cut_with_the_same_result(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fetch followed by ``ops.follow`` breaks after two batches (its child let go), then goes on from what
    the cache has: the follower's result is that of ``aggregate`` of the finished files, each the host's bytes."""
    from eaglepatch.errors import ConnectionFailed
    from eaglepatch.ops import logs as fetch
    from eaglepatch.report import aggregate, iter_log_files
    from eaglepatch.ops.follow import Follower

    d = tmp_path / "logs"
    d.mkdir(mode=0o700)
    for rank in range(2):
        (d / f"h-1-rank{rank}.jsonl").write_bytes(b"".join(
            b'{"v": 1, "t": %d.5, "host": "h", "pid": 1, "rank": %d, "mode": "decode", "bs": %d, "cycle_ms": %d.25, '
            b'"phases": {"draft": 1.5, "verify": %d.0}, "accepted": %d, "run": "h-1-7-0000abcd"}\n'
            % (1764500000 + i, rank, 1 + i % 3, 10 + i % 7, 5 + i % 4, i % 4) for i in range(300 + 50 * rank)))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))

    class Watch:
        def __init__(self, f: Follower) -> None:
            self.f = f

        def begin(self, files: list[str], sizes: dict[str, int]) -> None:
            self.f.start(files, sizes, {"by": "bs"})

        def wrote(self, path: str, size: int, replaced: bool) -> None:
            self.f.wrote(path, size, replaced)

        def complete(self, path: str) -> None:
            self.f.complete(path)

    _fetch_in_batches(monkeypatch, 5000, cut_after=2)
    f = Follower()
    with pytest.raises(ConnectionFailed):
        fetch.fetch_logs_from(None, "gpu1", "python3", str(d), lambda _m: None,  # type: ignore[arg-type]
                              watch=Watch(f))
    f.close()
    asked = _fetch_in_batches(monkeypatch, 5000)
    f = Follower()
    folder = fetch.fetch_logs_from(None, "gpu1", "python3", str(d), lambda _m: None,  # type: ignore[arg-type]
                                   watch=Watch(f))
    assert any(asked[0].values())  # went on from the cache
    files = iter_log_files([folder])
    assert [Path(p).read_bytes() for p in files] == [(d / f"h-1-rank{r}.jsonl").read_bytes() for r in range(2)]
    got = f.result(files, {"by": "bs"})
    assert f.why is None and got == aggregate(files, by="bs") and got.records == 650 and not got.skipped_lines


def test_a_fetch_brings_each_log_up_to_the_size_it_had_when_the_fetch_began(tmp_path: Path) -> None:
    """What the runtime appends while a fetch goes on, and a log it makes meanwhile (listed, not read), come with
    the next fetch: the first answer's sizes are what the whole fetch brings, and it ends however fast the server
    writes."""
    d = tmp_path / "logs"
    d.mkdir(mode=0o700)
    log = d / "h-1-rank0.jsonl"
    log.write_bytes(_log_lines(100))
    began = log.stat().st_size
    res = logs.op_logs({"log_dir": str(d), "have": {}, "budget": 1000, "fetch": "f1"})
    assert res["sizes"] == {str(d): [began]} and res["more"]
    got = b"".join(bytes(b) for b in res["__blobs__"])
    with open(log, "ab") as f:
        f.write(_log_lines(50))  # the server goes on writing
    (d / "h-2-rank0.jsonl").write_bytes(_log_lines(5))  # and a new log
    while res["more"]:
        res = logs.op_logs({"continue": "f1"})
        assert res["names"] == {str(d): ["h-1-rank0.jsonl", "h-2-rank0.jsonl"]}
        assert all(f["name"] == "h-1-rank0.jsonl" for f in res["files"])
        got += b"".join(bytes(b) for b in res["__blobs__"])
    assert got == log.read_bytes()[:began]
    res = logs.op_logs({"log_dir": str(d), "have": {str(log): began}, "fetch": "f2"})  # the next fetch
    assert [(f["name"], f["offset"]) for f in res["files"]] == [("h-1-rank0.jsonl", began), ("h-2-rank0.jsonl", 0)]
