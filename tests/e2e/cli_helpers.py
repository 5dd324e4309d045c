"""The CLI scenarios shared by ``test_cli_ssh.py`` and ``test_cli_local.py``: the same scenario runs against an
SSH target (the real sshd of conftest.py, ``--sglang-path`` pointing into a fake host tree) and a local target
(the fake host tree's path), through the INSTALLED ``eaglepatch`` command run as a subprocess.

A fake host tree is a folder laid out like a prefix (``<root>/lib/python3.11/site-packages/sglang``) holding a
real sglang release copied from the test cache (``tests/sglang_releases.py``). Every step is checked on bytes:
``snapshot(root)`` maps every file under the tree to its sha256 and mode (and every folder to its mode), so
"nothing changed" and "the original bytes are back" are dictionary equalities.

Pieces:

- ``Via``: how a scenario reaches a tree (``SSHVia`` / ``LocalVia``): ``via.run("apply", "--no-restart",
  target=tree.root)`` builds the command line (target + options) and returns a ``Result``.
- ``Tree`` / ``make_tree``: a fresh fake host tree of a release.
- ``clean_apply_snapshot``: the tree after one clean ``apply --no-restart`` (the reference for "the result is
  correct"), computed once per release and session.
- ``scenario_*``: the scenarios themselves; each test module parametrises them with its ``Via``.
"""

from __future__ import annotations

import dataclasses
import difflib
import glob
import hashlib
import json
import os
import re
import secrets
import shutil
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import pytest

import sglang_releases
from logdir import with_log_dir

# ------------------------------------------------------------------------------------------------------------
# The installed command

_BIN = Path(sys.executable).with_name("eaglepatch")
EAGLEPATCH: list[str] = [str(_BIN)] if _BIN.is_file() else [sys.executable, "-m", "eaglepatch"]

MARK = "# [eaglepatch]"
TMP_TAG = ".eaglepatch-tmp-"
BACKUP_DIR = ".eaglepatch"
RUNTIME = "_eaglepatch_runtime.py"
LOCK = ".eaglepatch.lock"
PHASES = {"target", "draft_extend", "draft", "verify"}

NEW_RELEASE = "0.5.16"  # spec v2 workers (EAGLEWorkerV2 & co)
OLD_RELEASE = "0.5.3"  # spec v1 (EAGLEWorker)
RELEASES = (NEW_RELEASE, OLD_RELEASE)

#: Per release: the main worker file, its class, and every worker file apply must patch (speculative/...).
MAIN = {
    NEW_RELEASE: ("eagle_worker_v2.py", "EAGLEWorkerV2"),
    OLD_RELEASE: ("eagle_worker.py", "EAGLEWorker"),
}
PATCHED = {
    NEW_RELEASE: {"eagle_worker_v2.py", "frozen_kv_mtp_worker_v2.py", "multi_layer_eagle_worker_v2.py",
                  "ngram_worker.py"},
    OLD_RELEASE: {"eagle_worker.py", "ngram_worker.py"},
}

# ------------------------------------------------------------------------------------------------------------
# Trees and snapshots


def release_site(version: str) -> Path:
    try:
        return sglang_releases.release_site(version)
    except sglang_releases.ReleaseUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)


@dataclasses.dataclass(frozen=True)
class Tree:
    """A fake host tree: ``root`` is what a target names (a prefix: lib/python3.11/site-packages/sglang).
    ``patched_names``: the worker files (in speculative/) that apply patches in it."""

    root: Path
    version: str
    patched_names: frozenset[str]

    @property
    def site(self) -> Path:
        return self.root / "lib" / "python3.11" / "site-packages"

    @property
    def pkg(self) -> Path:
        return self.site / "sglang"

    @property
    def spec(self) -> Path:
        return self.pkg / "srt" / "speculative"

    @property
    def backup_dir(self) -> Path:
        return self.spec / BACKUP_DIR

    @property
    def runtime(self) -> Path:
        return self.spec / RUNTIME

    @property
    def lock(self) -> Path:
        return self.spec / LOCK

    @property
    def main_file(self) -> Path:
        return self.spec / MAIN[self.version][0]

    @property
    def main_class(self) -> str:
        return MAIN[self.version][1]

    def rel(self, p: Path) -> str:
        return p.relative_to(self.root).as_posix()

    def worker(self, name: str) -> Path:
        return self.spec / name



#: What ``make_tree(..., full=False)`` drops from 0.5.16: the worker files besides the main one and ngram's
#: (each costs a libcst parse per command; the full release is the subject of the cycle, diff and show tests).
_TRIM = ("frozen_kv_mtp_worker_v2.py", "multi_layer_eagle_worker_v2.py", "dflash_worker_v2.py",
         "dspark_components/dspark_worker_v2.py")


def make_tree(dest: Path, version: str = NEW_RELEASE, full: bool = True) -> Tree:
    """A fresh fake host tree at ``dest`` (created; its parents too) holding the real release ``version``;
    ``full=False``: without the worker files of ``_TRIM`` (the rest of the release stays)."""
    patched = set(PATCHED[version])
    tree = Tree(dest, version, frozenset(patched))
    src = release_site(version)
    tree.site.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src, tree.site, ignore=shutil.ignore_patterns(".eaglepatch-site-complete"))
    if not full:
        for name in _TRIM:
            if (tree.spec / name).exists():
                (tree.spec / name).unlink()
                patched.discard(name)
        tree = Tree(dest, version, frozenset(patched))
    assert tree.main_file.is_file(), f"{version}: no {tree.main_file}"
    return tree


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_sha(p: Path) -> str:
    return sha256(p.read_bytes())


def snapshot(root: Path) -> dict[str, str]:
    """Every file under ``root`` -> "sha256 mode", every folder -> "dir mode" (relative POSIX paths)."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        base = Path(dirpath)
        for d in dirnames:
            st = os.lstat(base / d)
            out[(base / d).relative_to(root).as_posix() + "/"] = f"dir {stat.S_IMODE(st.st_mode):o}"
        for f in filenames:
            p = base / f
            st = os.lstat(p)
            kind = "link" if stat.S_ISLNK(st.st_mode) else file_sha(p)
            out[p.relative_to(root).as_posix()] = f"{kind} {stat.S_IMODE(st.st_mode):o}"
    return out


def assert_same(now: dict[str, str], then: dict[str, str], what: str) -> None:
    """Snapshots equal; else a message listing what appeared, went, and changed."""
    if now == then:
        return
    added = sorted(set(now) - set(then))
    gone = sorted(set(then) - set(now))
    changed = sorted(k for k in set(now) & set(then) if now[k] != then[k])
    pytest.fail(f"{what}: the tree differs:\n  appeared: {added}\n  gone: {gone}\n  changed: {changed}",
                pytrace=False)


def leftovers(root: Path) -> list[str]:
    """Temp files and locks eaglepatch must never leave behind."""
    out = []
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            if TMP_TAG in f or f == LOCK:
                out.append(os.path.join(dirpath, f))
    return sorted(out)


def strip_marked(data: bytes) -> bytes:
    """The file minus every line eaglepatch marked."""
    return b"".join(ln for ln in data.splitlines(keepends=True) if not ln.rstrip(b"\r\n").endswith(MARK.encode()))


def only_added_marked_lines(before: bytes, after: bytes) -> None:
    """``after`` is ``before`` plus lines that all end with the marker: nothing else changed."""
    a = before.decode().splitlines(keepends=True)
    b = after.decode().splitlines(keepends=True)
    ops = difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
    inserted = 0
    for tag, i1, i2, j1, j2 in ops:
        assert tag in ("equal", "insert"), f"apply changed or removed original lines: {tag} {a[i1:i2]!r} -> {b[j1:j2]!r}"
        if tag == "insert":
            for ln in b[j1:j2]:
                assert ln.rstrip("\n").endswith(MARK), f"added line without the marker: {ln!r}"
                inserted += 1
    assert inserted > 0, "apply added no line"
    assert strip_marked(after) == before


# ------------------------------------------------------------------------------------------------------------
# Running the CLI


@dataclasses.dataclass
class Result:
    argv: list[str]
    rc: int
    out: str
    err: str

    def json(self) -> Any:
        try:
            return json.loads(self.out)
        except ValueError:
            pytest.fail(f"stdout is not JSON:\n{self}", pytrace=False)

    def expect(self, rc: int) -> "Result":
        assert self.rc == rc, f"expected exit {rc}:\n{self}"
        return self

    def error_line(self) -> str:
        """The one-line error message: stderr's last line, 'eaglepatch: ...', with no traceback."""
        assert "Traceback" not in self.err, f"a traceback on stderr:\n{self}"
        lines = [ln for ln in self.err.splitlines() if ln.strip()]
        assert lines, f"no message on stderr:\n{self}"
        last = lines[-1]
        assert last.startswith("eaglepatch: "), f"the last stderr line is not the error:\n{self}"
        return last

    def __str__(self) -> str:
        return (f"$ {' '.join(self.argv)}\nexit {self.rc}\n--- stdout (tail)\n{self.out[-3000:]}\n"
                f"--- stderr (tail)\n{self.err[-3000:]}")


class Via:
    """How scenarios reach a tree: ``run(cmd, *args, target=...)`` runs the installed CLI."""

    kind = "?"

    def __init__(self, env: dict[str, str], cwd: Path):
        self.env = dict(env)
        self.env.pop("EAGLEPATCH_FAILPOINT", None)
        self.env.pop("EAGLEPATCH_DEBUG", None)
        self.cwd = cwd

    # what a target looks like on the command line, and how results name it
    def target_args(self, path: Path) -> list[str]:
        raise NotImplementedError

    def name(self, path: Path) -> str:
        raise NotImplementedError

    def argv(self, cmd: str, args: Sequence[str], target: Path | None) -> list[str]:
        return [*EAGLEPATCH, cmd, *with_log_dir(cmd, args), *(self.target_args(target) if target is not None else [])]

    def run(self, cmd: str, *args: str, target: Path | None, env: dict[str, str] | None = None,
            timeout: float = 120) -> Result:
        argv = self.argv(cmd, args, target)
        proc = subprocess.run(argv, env=dict(self.env, **(env or {})), cwd=self.cwd, capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        return Result(argv, proc.returncode, proc.stdout, proc.stderr)

    def popen(self, cmd: str, *args: str, target: Path,
              env: dict[str, str] | None = None) -> tuple[list[str], subprocess.Popen]:
        argv = self.argv(cmd, args, target)
        return argv, subprocess.Popen(argv, env=dict(self.env, **(env or {})), cwd=self.cwd, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)


class LocalVia(Via):
    kind = "local"

    def __init__(self, cwd: Path):
        env = dict(os.environ)
        # "python3" (the default interpreter on the target) is this venv's, not a pyenv shim that costs a
        # tenth of a second per call: eaglepatch runs several calls per command
        here = Path(sys.executable).parent
        if (here / "python3").exists():
            env["PATH"] = f"{here}{os.pathsep}{env.get('PATH', '')}"
        super().__init__(env, cwd)

    def target_args(self, path: Path) -> list[str]:
        return [str(path)]

    def name(self, path: Path) -> str:
        return str(path)


class SSHVia(Via):
    """``user@127.0.0.1:PORT -i KEY --sglang-path DIR`` (or, with ``alias``, the ~/.ssh/config alias)."""

    kind = "ssh"

    def __init__(self, sshd: Any, cwd: Path, home: str | None = None, alias: bool = False,
                 identity: str | None = None):
        super().__init__(sshd.env(home), cwd)
        self.sshd = sshd
        self.alias = alias
        self.identity = identity or sshd.client_key

    def with_home(self, home: str, identity: str | None = None) -> "SSHVia":
        return SSHVia(self.sshd, self.cwd, home=home, alias=self.alias, identity=identity or self.identity)

    @property
    def destination(self) -> str:
        return self.sshd.alias if self.alias else self.sshd.target

    def target_args(self, path: Path) -> list[str]:
        ident = [] if self.alias else ["-i", self.identity]
        return [self.destination, *ident, "--sglang-path", str(path)]

    def name(self, path: Path) -> str:
        return self.destination


# ------------------------------------------------------------------------------------------------------------
# The reference: one clean apply of a fresh tree

_REFERENCE: dict[tuple[str, bool, str], dict[str, str]] = {}
_RUNTIME_SRC = Path(__file__).resolve().parents[2] / "eaglepatch" / "runtime" / RUNTIME


def clean_apply_snapshot(version: str, workdir: Path, full: bool = True) -> dict[str, str]:
    """The snapshot of a fresh tree after one clean local ``apply --no-restart``, without the manifest (it holds
    times and absolute paths); computed once per release per session."""
    # a changed runtime module (while the project is being worked on) makes a new reference
    key = (version, full, file_sha(_RUNTIME_SRC) if _RUNTIME_SRC.is_file() else "")
    if key not in _REFERENCE:
        tree = make_tree(workdir / f"reference-{version}-{secrets.token_hex(3)}", version, full)
        LocalVia(workdir).run("apply", "--no-restart", target=tree.root).expect(0)
        snap = snapshot(tree.root)
        snap.pop(f"{tree.rel(tree.backup_dir)}/manifest.json")
        _REFERENCE[key] = snap
        shutil.rmtree(tree.root)
    return dict(_REFERENCE[key])


def assert_clean_apply(tree: Tree, workdir: Path, what: str) -> None:
    snap = snapshot(tree.root)
    assert snap.pop(f"{tree.rel(tree.backup_dir)}/manifest.json", None), f"{what}: no manifest"
    full = tree.patched_names == PATCHED[tree.version]
    assert_same(snap, clean_apply_snapshot(tree.version, workdir, full), f"{what} (against one clean apply)")


def manifest(tree: Tree) -> dict[str, Any]:
    return json.loads((tree.backup_dir / "manifest.json").read_text())


# ------------------------------------------------------------------------------------------------------------
# Things the host does not normally do: older interpreters, immutable folders, weird names


def older_python() -> str:
    """An absolute path of a Python 3.10 interpreter (pyenv's, or the system's); the test FAILS without one."""
    cands: list[str] = []
    found = shutil.which("python3.10")
    if found:
        cands.append(found)
    root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    cands += sorted(glob.glob(os.path.join(root, "versions", "3.10*", "bin", "python3.10")), reverse=True)
    cands += ["/usr/bin/python3.10", "/usr/local/bin/python3.10"]
    for c in cands:
        try:
            out = subprocess.run([c, "-c", "import sys;print(sys.executable);print(sys.version_info[:2]==(3,10))"],
                                 capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired):
            continue
        lines = out.stdout.split()
        if out.returncode == 0 and lines[-1:] == ["True"]:
            return lines[0]  # the real binary, not a pyenv shim (the SSH session's PATH may lack pyenv)
    pytest.fail("no working Python 3.10 interpreter (python3.10 on PATH or under ~/.pyenv/versions/3.10*): the "
                "compile-on-the-host test needs one older than eaglepatch's", pytrace=False)


def _try(argv: list[str]) -> bool:
    try:
        return subprocess.run(argv, capture_output=True, stdin=subprocess.DEVNULL, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _refuses_writes(d: Path) -> bool:
    probe = d / f".probe-{secrets.token_hex(4)}"
    try:
        probe.write_bytes(b"x")
    except OSError:
        return True
    probe.unlink()
    return False


class Unwritable:
    """Make a folder (or a file) refuse changes even to root: ``chattr +i``, else a read-only bind mount of a
    folder; ``how`` says which; ``skip_reason`` is set when neither works here."""

    def __init__(self, path: Path):
        self.path = path
        self.how: str | None = None
        self.skip_reason: str | None = None

    def __enter__(self) -> "Unwritable":
        p = str(self.path)
        if shutil.which("chattr") and _try(["chattr", "+i", p]):
            if self.path.is_file() or _refuses_writes(self.path):
                self.how = "chattr +i"
                return self
            _try(["chattr", "-i", p])
        if shutil.which("mount"):
            if _try(["mount", "--bind", p, p]):
                if _try(["mount", "-o", "remount,ro,bind", p]) and (self.path.is_file() or _refuses_writes(self.path)):
                    self.how = "read-only bind mount"
                    return self
                _try(["umount", p])
        self.skip_reason = (f"cannot make {p} refuse writes as uid {os.geteuid()}: chattr +i is not supported on "
                            "this file system (or not permitted) and a read-only bind mount is not permitted")
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.how == "chattr +i":
            _try(["chattr", "-i", str(self.path)])
        elif self.how == "read-only bind mount":
            _try(["umount", str(self.path)])


# ------------------------------------------------------------------------------------------------------------
# Scenarios

def _patched_by(doc: dict[str, Any]) -> set[str]:
    return {f["path"].rsplit("/", 1)[-1] for f in doc["files"]}


def check_change_doc(doc: Any, via: Via, tree: Tree, changed: bool) -> None:
    """``apply --json`` / ``revert --json`` shape of CONTRACT.md."""
    assert isinstance(doc, dict), doc
    assert {"target", "changed", "files", "restarted"} <= set(doc), doc
    assert doc["target"] == via.name(tree.root)
    assert doc["changed"] is changed
    assert doc["restarted"] is False
    for f in doc["files"]:
        assert set(f) >= {"path", "before_sha256", "after_sha256", "backup"}, f
        assert f["path"].startswith("srt/speculative/") and f["path"].endswith(".py"), f
        assert re.fullmatch(r"[0-9a-f]{64}", f["before_sha256"]) and re.fullmatch(r"[0-9a-f]{64}", f["after_sha256"])


def scenario_cycle(via: Via, tree: Tree) -> None:
    """apply, apply again, status, revert, revert again: bytes and sha256 after every step."""
    before = snapshot(tree.root)
    originals = {n: tree.worker(n).read_bytes() for n in tree.patched_names}
    modes = {n: stat.S_IMODE(tree.worker(n).stat().st_mode) for n in tree.patched_names}

    # apply
    r = via.run("apply", "--no-restart", "--json", target=tree.root).expect(0)
    doc = r.json()
    check_change_doc(doc, via, tree, changed=True)
    assert _patched_by(doc) == tree.patched_names, doc
    for f in doc["files"]:
        name = f["path"].rsplit("/", 1)[-1]
        now = tree.worker(name).read_bytes()
        assert f["path"] == tree.worker(name).relative_to(tree.pkg).as_posix()
        assert f["before_sha256"] == sha256(originals[name])
        assert f["after_sha256"] == sha256(now)
        only_added_marked_lines(originals[name], now)
        assert stat.S_IMODE(tree.worker(name).stat().st_mode) == modes[name], "apply changed the file's mode"
        assert Path(f["backup"]).parent.resolve() == tree.backup_dir.resolve(), f
        assert Path(f["backup"]).read_bytes() == originals[name], "the backup is not the original"
    assert "_CONFIG = " in tree.runtime.read_text()
    compile(tree.runtime.read_bytes(), str(tree.runtime), "exec")
    man = manifest(tree)
    assert {Path(f["path"]).name for f in man["files"]} == tree.patched_names
    assert {f["before_sha256"] for f in man["files"]} == {f["before_sha256"] for f in doc["files"]}
    assert leftovers(tree.root) == []
    after = snapshot(tree.root)
    # nothing else changed: only the patched files, the runtime module and the backup folder
    expected_new = {tree.rel(tree.runtime), tree.rel(tree.backup_dir) + "/", tree.rel(tree.backup_dir / "manifest.json")}
    expected_new |= {tree.rel(tree.backup_dir / (n + ".orig")) for n in tree.patched_names}
    assert set(after) - set(before) == expected_new
    assert set(before) - set(after) == set()
    assert {k for k in before if before[k] != after[k]} == {tree.rel(tree.worker(n)) for n in tree.patched_names}

    # apply again: nothing to change, not a byte
    r = via.run("apply", "--no-restart", "--json", target=tree.root).expect(0)
    doc2 = r.json()
    check_change_doc(doc2, via, tree, changed=False)
    assert [(f["path"], f["after_sha256"]) for f in doc2["files"]] == [(f["path"], f["after_sha256"]) for f in doc["files"]]
    assert "already patched" in r.err
    assert_same(snapshot(tree.root), after, "apply on a patched tree")

    # status
    st = via.run("status", "--json", target=tree.root).expect(0).json()
    assert st["target"] == via.name(tree.root)
    assert st["sglang_version"] == tree.version
    assert os.path.realpath(st["package_dir"]) == os.path.realpath(tree.pkg)
    states = {f["path"].rsplit("/", 1)[-1]: f["state"] for f in st["files"]}
    assert {n for n, s in states.items() if s == "patched"} == tree.patched_names, states
    assert set(states.values()) <= {"patched", "pristine"}, states
    main = next(f for f in st["files"] if f["path"] == tree.main_file.relative_to(tree.pkg).as_posix())
    w = next(w for w in main["workers"] if w["class"] == tree.main_class)
    assert {"draft", "verify", "draft_extend"} <= set(w["phases"]) <= PHASES, w
    assert st["server"] is None or (isinstance(st["server"]["pid"], int) and isinstance(st["server"]["argv"], list))
    if via.kind == "local":  # the rendering does not depend on the transport: checked once
        human = via.run("status", target=tree.root).expect(0).out
        for n in tree.patched_names:
            assert re.search(rf"^\s*patched\s+srt/speculative/{re.escape(n)}\b", human, re.M), human
    assert_same(snapshot(tree.root), after, "status")

    # revert: the original bytes, nothing of eaglepatch left
    r = via.run("revert", "--no-restart", "--json", target=tree.root).expect(0)
    doc3 = r.json()
    check_change_doc(doc3, via, tree, changed=True)
    assert _patched_by(doc3) == tree.patched_names
    for f in doc3["files"]:
        name = f["path"].rsplit("/", 1)[-1]
        assert f["after_sha256"] == sha256(originals[name])
    assert_same(snapshot(tree.root), before, "after revert")
    assert not tree.runtime.exists() and not tree.backup_dir.exists()

    # revert again: nothing to do
    r = via.run("revert", "--no-restart", "--json", target=tree.root).expect(0)
    check_change_doc(r.json(), via, tree, changed=False)
    assert r.json()["files"] == []
    assert_same(snapshot(tree.root), before, "revert on a pristine tree")


def _diff_chunks(text: str) -> dict[str, str]:
    """A unified diff split per file (keyed by the +++ path), each chunk's text."""
    chunks: dict[str, list[str]] = {}
    cur: list[str] | None = None
    lines = text.splitlines(keepends=True)
    for i, ln in enumerate(lines):
        if ln.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            cur = [ln]
            chunks[lines[i + 1][4:].rstrip("\n")] = cur
        elif cur is not None:
            cur.append(ln)
        else:
            pytest.fail(f"diff output does not start with a file header: {ln!r}", pytrace=False)
    return {k: "".join(v) for k, v in chunks.items()}


def scenario_diff(via: Via, tree: Tree) -> None:
    """diff: a unified diff with sglang/srt/... paths, only + lines, changes nothing; it is exactly what apply
    then does; after apply it prints nothing and says so."""
    before = snapshot(tree.root)
    originals = {n: tree.worker(n).read_bytes() for n in tree.patched_names}
    r = via.run("diff", target=tree.root).expect(0)
    assert r.out.strip(), f"empty diff:\n{r}"
    assert_same(snapshot(tree.root), before, "diff")
    chunks = _diff_chunks(r.out)
    runtime_rel = f"sglang/srt/speculative/{RUNTIME}"
    assert set(chunks) == {f"sglang/srt/speculative/{n}" for n in tree.patched_names} | {runtime_rel}
    for path, chunk in chunks.items():
        lines = chunk.splitlines()
        assert lines[0] == f"--- {'/dev/null' if path == runtime_rel else path}"
        assert lines[1] == f"+++ {path}"
        for ln in lines[2:]:
            assert ln[:1] in ("@", "+", " "), f"{path}: a line that is not context or added: {ln!r}"
            if ln.startswith("@@"):
                assert re.match(r"^@@ -\d+(,\d+)? \+\d+(,\d+)? @@", ln), ln
            elif ln.startswith("+") and path != runtime_rel:
                assert ln.endswith(MARK), f"{path}: an added line without the marker: {ln!r}"

    # diff renders the runtime for the default log folder: apply names it too (no server runs this tree: nothing
    # is ever written there)
    via.run("apply", "--no-restart", "--log-dir", "/tmp/eaglepatch", target=tree.root).expect(0)
    # the diff is exactly what apply did
    for n, orig in originals.items():
        rel = f"sglang/srt/speculative/{n}"
        want = "".join(difflib.unified_diff(orig.decode().splitlines(True),
                                            tree.worker(n).read_text().splitlines(True), rel, rel))
        assert chunks[rel] == want, f"diff of {n} is not what apply did"
    want = "".join(difflib.unified_diff([], tree.runtime.read_text().splitlines(True), "/dev/null", runtime_rel))
    assert chunks[runtime_rel] == want

    patched = snapshot(tree.root)
    r = via.run("diff", target=tree.root).expect(0)
    assert r.out == ""
    assert "already patched" in r.err
    assert_same(snapshot(tree.root), patched, "diff on a patched tree")


def scenario_dry_run(via: Via, tree: Tree) -> None:
    before = snapshot(tree.root)
    r = via.run("apply", "--no-restart", "--dry-run", target=tree.root).expect(0)
    assert r.out.startswith("--- "), r
    chunks = _diff_chunks(r.out)
    assert f"sglang/srt/speculative/{tree.main_file.name}" in chunks
    plan = [ln for ln in r.err.splitlines() if ln.startswith("plan: ")]
    assert any(tree.main_file.name in ln and "replace" in ln for ln in plan), r
    assert any(RUNTIME in ln and "new" in ln for ln in plan), r
    assert any("back up originals" in ln and "no restart" in ln for ln in plan), r
    assert_same(snapshot(tree.root), before, "apply --dry-run")
    if via.kind == "local":  # the JSON form does not depend on the transport: checked once
        doc = via.run("apply", "--no-restart", "--dry-run", "--json", target=tree.root).expect(0).json()
        assert doc["changed"] is False and doc.get("dry_run") is True
        assert doc["diff"] == r.out
        assert_same(snapshot(tree.root), before, "apply --dry-run --json")


HAND_EDIT = b"# a line added by hand after the patch\n"


def scenario_drift(via: Via, tree: Tree) -> None:
    before = snapshot(tree.root)
    original = tree.main_file.read_bytes()
    via.run("apply", "--no-restart", target=tree.root).expect(0)
    patched = tree.main_file.read_bytes()
    with open(tree.main_file, "ab") as f:
        f.write(HAND_EDIT)
    drifted = snapshot(tree.root)
    rel = tree.main_file.relative_to(tree.pkg).as_posix()

    st = via.run("status", "--json", target=tree.root).expect(0).json()
    states = {f["path"]: f["state"] for f in st["files"]}
    assert states[rel] == "drifted", states
    assert {p for p, s in states.items() if s == "patched"} == {f"srt/speculative/{n}" for n in tree.patched_names} - {rel}

    r = via.run("revert", "--no-restart", target=tree.root).expect(5)
    line = r.error_line()
    assert tree.main_file.name in line and "--force" in line, line
    assert_same(snapshot(tree.root), drifted, "refused revert of a drifted file")

    r = via.run("revert", "--no-restart", "--force", "--json", target=tree.root).expect(0)
    assert r.json()["changed"] is True
    assert tree.main_file.read_bytes() == original + HAND_EDIT, "revert --force did not remove only eaglepatch's lines"
    copies = sorted(tree.backup_dir.glob(tree.main_file.name + ".drifted-*"))
    assert len(copies) == 1, sorted(os.listdir(tree.backup_dir)) if tree.backup_dir.exists() else "no backup dir"
    assert copies[0].read_bytes() == patched + HAND_EDIT, "the kept copy is not the drifted file"
    assert "copy" in r.err
    # everything else is as before apply; the backup folder holds only the kept copy
    now = snapshot(tree.root)
    now.pop(tree.rel(copies[0]))
    now.pop(tree.rel(tree.backup_dir) + "/")
    expect = dict(before)
    expect[tree.rel(tree.main_file)] = f"{sha256(original + HAND_EDIT)} {expect[tree.rel(tree.main_file)].split()[1]}"
    assert_same(now, expect, "after revert --force")


def scenario_lost_backup(via: Via, tree: Tree) -> None:
    before = snapshot(tree.root)
    via.run("apply", "--no-restart", target=tree.root).expect(0)
    shutil.rmtree(tree.backup_dir)
    st = via.run("status", "--json", target=tree.root).expect(0).json()
    assert {f["path"].rsplit("/", 1)[-1] for f in st["files"] if f["state"] == "patched"} == tree.patched_names
    r = via.run("revert", "--no-restart", "--json", target=tree.root).expect(0)
    assert r.json()["changed"] is True
    assert "no backup" in r.err
    assert_same(snapshot(tree.root), before, "revert without the backup")


def scenario_no_sglang(via: Via, workdir: Path) -> None:
    """A folder without sglang, then one with a sglang package but no speculative worker: exit 4, one line."""
    empty = workdir / "no sglang here"
    (empty / "lib").mkdir(parents=True)
    (empty / "lib" / "README").write_text("not a python prefix\n")
    before = snapshot(empty)
    r = via.run("apply", "--no-restart", target=empty).expect(4)
    assert r.out == "", r
    assert len(r.err.strip().splitlines()) == 1, f"not one line:\n{r}"
    assert "sglang" in r.error_line()
    assert_same(snapshot(empty), before, "apply on a tree without sglang")

    bare = workdir / "bare sglang"
    (bare / "sglang" / "srt" / "speculative").mkdir(parents=True)
    (bare / "sglang" / "__init__.py").write_text("__version__ = '0.0.1'\n")
    (bare / "sglang" / "srt" / "speculative" / "spec_info.py").write_text("class SpecInfo:\n    pass\n")
    before = snapshot(bare)
    r = via.run("apply", "--no-restart", target=bare).expect(4)
    assert len(r.err.strip().splitlines()) == 1, f"not one line:\n{r}"
    assert "no recognisable speculative worker" in r.error_line()
    assert_same(snapshot(bare), before, "apply on sglang without workers")


NEWER_SYNTAX = b"""

def _added_by_the_test():
    # except* is Python 3.11+: eaglepatch (3.11) reads it, the host's 3.10 cannot compile it
    try:
        pass
    except* ValueError:
        pass
"""


def scenario_compile_fails(via: Via, tree: Tree) -> None:
    py310 = older_python()
    with open(tree.main_file, "ab") as f:
        f.write(NEWER_SYNTAX)
    before = snapshot(tree.root)
    r = via.run("apply", "--no-restart", "--python", py310, target=tree.root).expect(6)
    line = r.error_line()
    assert tree.main_file.name in line and "compile" in line and py310 in line, line
    assert_same(snapshot(tree.root), before, "apply whose patched file does not compile on the host")
    assert leftovers(tree.root) == [] and not tree.backup_dir.exists() and not tree.runtime.exists()


def scenario_cut_connection(via: Via, tree: Tree, workdir: Path) -> None:
    """eaglepatch and its helper on the host are killed between writing the temp files and renaming them
    (failpoint execute:after-upload): the originals stay, the temp files and the lock (held by a client that is
    gone) are left; status names the lock, and a re-run takes it over, succeeds and is correct."""
    before = snapshot(tree.root)
    originals = {n: tree.worker(n).read_bytes() for n in tree.patched_names}
    r = via.run("apply", "--no-restart", target=tree.root, env={"EAGLEPATCH_FAILPOINT": "execute:after-upload"})
    assert r.rc == -9, f"expected eaglepatch to be killed at the failpoint:\n{r}"
    for n, data in originals.items():
        assert tree.worker(n).read_bytes() == data, f"{n} changed by the interrupted apply"
    assert not tree.runtime.exists() and not tree.backup_dir.exists()
    temps = [p for p in leftovers(tree.root) if TMP_TAG in p]
    assert temps, "the fault hook left no temp file: it did not fire where expected"
    held = json.loads(tree.lock.read_text())
    assert (held["what"], held["client_host"]) == ("apply", socket.gethostname()), held
    doc = via.run("status", "--json", target=tree.root).expect(0).json()
    assert doc["lock"]["client_pid"] == held["client_pid"] and doc["lock"]["what"] == "apply", doc["lock"]
    assert {f["state"] for f in doc["files"]} == {"pristine"}
    # the staged temp files are named too, in the JSON and in the text (the next apply or revert removes them)
    assert sorted(os.path.realpath(p) for p in doc["leftovers"]) == sorted(os.path.realpath(p) for p in temps)
    text = via.run("status", target=tree.root).expect(0).out
    assert sum(1 for ln in text.splitlines() if ln.strip().startswith("leftover: ")) == len(temps), text
    only_originals = {k: v for k, v in snapshot(tree.root).items() if TMP_TAG not in k and not k.endswith(LOCK)}
    assert_same(only_originals, before, "after the interrupted apply (temp files and lock aside)")

    r = via.run("apply", "--no-restart", "--json", target=tree.root).expect(0)
    assert r.json()["changed"] is True
    assert leftovers(tree.root) == [], "stale temp files or the lock survived a successful apply"
    assert_clean_apply(tree, workdir, "re-run after a cut")
    via.run("revert", "--no-restart", target=tree.root).expect(0)
    assert_same(snapshot(tree.root), before, "revert after the re-run")


def scenario_refused_dir(via: Via, tree: Tree) -> None:
    """The speculative folder refuses every write (even root's): a one-line error, nothing changed."""
    before = snapshot(tree.root)
    with Unwritable(tree.spec) as u:
        if u.skip_reason:
            pytest.skip(u.skip_reason)
        r = via.run("apply", "--no-restart", target=tree.root)
        assert r.rc == 2, f"expected exit 2 (usage: an install this user cannot write, unchanged):\n{r}"
        line = r.error_line()
        assert "not permitted" in line or "denied" in line or "Read-only" in line, line
        assert "cannot write" in line and "make it writable" in line, line
        assert_same(snapshot(tree.root), before, f"apply into a folder that refuses writes ({u.how})")
    via.run("apply", "--no-restart", target=tree.root).expect(0)


def scenario_refused_file(via: Via, tree: Tree, workdir: Path) -> None:
    """One worker file refuses to be replaced (the last one swapped in): apply fails after replacing the others
    and must put every byte back; then revert of a patched tree fails the same way and must put it back too."""
    last = tree.worker("ngram_worker.py")
    before = snapshot(tree.root)
    with Unwritable(last) as u:
        if u.skip_reason:
            pytest.skip(u.skip_reason)
        r = via.run("apply", "--no-restart", target=tree.root)
        assert r.rc == 1, f"expected exit 1 (internal error, rolled back):\n{r}"
        line = r.error_line()
        assert "ngram_worker.py" in line and "nothing changed" in line, line
        assert_same(snapshot(tree.root), before, f"apply with one file that refuses the rename ({u.how})")
    via.run("apply", "--no-restart", target=tree.root).expect(0)
    assert_clean_apply(tree, workdir, "apply after the failed one")
    patched = snapshot(tree.root)
    with Unwritable(last) as u:
        assert u.how, u.skip_reason
        r = via.run("revert", "--no-restart", target=tree.root)
        assert r.rc == 1, f"expected exit 1 (internal error, rolled back):\n{r}"
        line = r.error_line()
        assert "ngram_worker.py" in line and "nothing changed" in line, line
        assert_same(snapshot(tree.root), patched, f"revert with one file that refuses the rename ({u.how})")
    via.run("revert", "--no-restart", target=tree.root).expect(0)
    assert_same(snapshot(tree.root), before, "revert after the failed one")


def scenario_concurrent(via: Via, tree: Tree, workdir: Path) -> None:
    """Two applies on one install, the second started while the first holds the install's lock (the first is held
    there by the failpoint ``apply:after-lock:pause``, so the race is not left to the machine's timing: on a busy
    machine two applies started together often ran one after the other): the second exits 5 naming the lock and
    changes nothing; the first patches; the result is one clean apply and nothing left behind. The first is let go
    by a file once the second is checked (a fixed pause ran out under CI's load before the check, and the first's
    own changes were taken for the second's)."""
    release = workdir / f"release-{os.getpid()}-{time.monotonic_ns()}"  # the first goes on once this exists
    first_argv, first = via.popen("apply", "--no-restart", "--json", target=tree.root,
                                  env={"EAGLEPATCH_FAILPOINT": "apply:after-lock:pause",
                                       "EAGLEPATCH_FAILPOINT_PAUSE": "240",
                                       "EAGLEPATCH_FAILPOINT_RELEASE": str(release)})
    try:
        deadline = time.monotonic() + 60
        while not leftovers(tree.root):  # the lock file: the first apply holds the install now
            assert first.poll() is None and time.monotonic() < deadline, "the first apply never took the lock"
            time.sleep(0.05)
        before = snapshot(tree.root)
        second = via.run("apply", "--no-restart", "--json", target=tree.root)
        assert second.rc == 5, f"the second apply, while the first held the lock:\n{second}"
        line = second.error_line()
        assert "lock" in line, line
        assert snapshot(tree.root) == before, "the second apply changed something"
        release.touch()
        out, err = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(10)
    done = Result(first_argv, first.returncode, out, err)
    assert done.rc == 0 and done.json()["changed"] is True, f"the first apply:\n{done}"
    assert leftovers(tree.root) == []
    assert_clean_apply(tree, workdir, "an apply beside another one that met its lock")


def scenario_links(via: Via, tree: Tree, workdir: Path) -> None:
    """A worker file that is a symlink (to a file outside the package) and one that has a second hard link: apply
    patches through the link (the link stays a link, to the same file, whose bytes are the clean apply's) and
    into the hard-linked inode (both names see the patched bytes); revert puts back every original byte the same
    way. Before, each came back from revert as a regular file of its own: the link was gone."""
    linked, hard = tree.main_file, tree.worker("ngram_worker.py")
    elsewhere = workdir / "checkout elsewhere" / linked.name
    elsewhere.parent.mkdir(parents=True)
    shutil.move(str(linked), elsewhere)
    linked.symlink_to(elsewhere)
    twin = workdir / "a second name.py"
    os.link(hard, twin)
    original = {p: p.read_bytes() for p in (elsewhere, hard)}
    inode = hard.stat().st_ino

    def check(expect: dict[Path, bytes], what: str) -> None:
        assert linked.is_symlink() and os.readlink(linked) == str(elsewhere), f"{what}: the symlink is gone"
        assert elsewhere.read_bytes() == expect[elsewhere], f"{what}: the link's target"
        assert hard.stat().st_ino == inode == twin.stat().st_ino and hard.stat().st_nlink == 2, \
            f"{what}: the hard link is broken"
        assert hard.read_bytes() == twin.read_bytes() == expect[hard], f"{what}: the hard-linked file"
        assert leftovers(tree.root) == [] and not [p for p in elsewhere.parent.iterdir() if TMP_TAG in p.name]

    via.run("apply", "--no-restart", target=tree.root).expect(0)
    patched = {p: p.read_bytes() for p in (elsewhere, hard)}
    for p in patched:
        only_added_marked_lines(original[p], patched[p])
    check(patched, "after apply")
    states = {f["path"].rsplit("/", 1)[-1]: f["state"] for f in via.run("status", "--json", target=tree.root)
              .expect(0).json()["files"]}
    assert states[linked.name] == states[hard.name] == "patched", states
    via.run("revert", "--no-restart", target=tree.root).expect(0)
    check(original, "after revert")


def scenario_full_disk(via: Via, tree: Tree) -> None:
    """The speculative folder on a file system with no space left (a tmpfs filled up): creating the lock works,
    writing it does not. apply and revert fail in one line, the lock is removed at once and nothing changed;
    with space again, apply and revert work at once. Before: a 0-byte lock blocked every apply and revert for
    two hours (and the error was a traceback's last line)."""
    if os.geteuid() != 0:
        pytest.skip("mounts a small tmpfs: run as root (CI does)")
    spec = tree.spec
    held = spec.with_name(spec.name + ".held")
    spec.rename(held)
    spec.mkdir()
    if not _try(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(spec)]):
        held.rename(spec)
        pytest.skip("cannot mount a tmpfs here")
    try:
        for p in held.iterdir():
            if p.is_dir():
                shutil.copytree(p, spec / p.name, symlinks=True)
            else:
                shutil.copy2(p, spec / p.name)
        before = snapshot(tree.root)
        filler = spec / ".filler"
        with open(filler, "wb") as f:
            try:
                while True:
                    f.write(b"\0" * (1 << 16))
                    f.flush()
            except OSError:
                pass
        full = snapshot(tree.root)
        for cmd in ("apply", "revert"):
            r = via.run(cmd, "--no-restart", target=tree.root)
            assert r.rc == 1, f"{cmd} on a full disk:\n{r}"
            line = r.error_line()
            assert "cannot write the lock" in line and "No space left" in line and "removed" in line, line
            assert not tree.lock.exists(), f"{cmd} left its lock behind"
            assert_same(snapshot(tree.root), full, f"{cmd} on a full disk")
        filler.unlink()
        assert_same(snapshot(tree.root), before, "the tree with space again")
        via.run("apply", "--no-restart", target=tree.root).expect(0)
        via.run("revert", "--no-restart", target=tree.root).expect(0)
        assert_same(snapshot(tree.root), before, "apply and revert with space again")
    finally:
        _try(["umount", str(spec)])
        spec.rmdir()
        held.rename(spec)


def weird_root(workdir: Path) -> Path:
    return workdir / "host root" / "it's a $(touch pwned) `touch pwned` ;dir"


def scenario_weird_path(via: Via, workdir: Path, homes: Sequence[str] = ()) -> None:
    tree = make_tree(weird_root(workdir), full=False)
    watch = [via.cwd, workdir, workdir / "host root", tree.root, *map(Path, homes)]
    assert not any((d / "pwned").exists() for d in watch)
    before = snapshot(tree.root)
    via.run("apply", "--no-restart", target=tree.root).expect(0)
    assert tree.runtime.is_file() and len(manifest(tree)["files"]) == len(tree.patched_names)
    assert_clean_apply(tree, workdir, "apply under a path with spaces and shell characters")
    st = via.run("status", "--json", target=tree.root).expect(0).json()
    assert {f["path"].rsplit("/", 1)[-1] for f in st["files"] if f["state"] == "patched"} == tree.patched_names
    assert os.path.realpath(st["package_dir"]) == os.path.realpath(tree.pkg)
    via.run("revert", "--no-restart", target=tree.root).expect(0)
    assert_same(snapshot(tree.root), before, "revert under a path with spaces and shell characters")
    found = [str(d / "pwned") for d in watch if (d / "pwned").exists()]
    found += [os.path.join(dp, f) for dp, _d, fs in os.walk(workdir) for f in fs if f == "pwned"]
    assert not found, f"a shell ran part of the path: {found}"


def scenario_show(via: Via, tree: Tree, target: Path | None = None) -> None:
    """show and show --json: the worker class, entry method line range, phase call lines, numbered source."""
    import ast

    target = target or tree.root
    before = snapshot(tree.root)
    src = tree.main_file.read_text()
    lines = src.splitlines()
    cls = next(n for n in ast.parse(src).body if isinstance(n, ast.ClassDef) and n.name == tree.main_class)
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "forward_batch_generation")
    rel = tree.main_file.relative_to(tree.pkg).as_posix()

    doc = via.run("show", "--json", target=target).expect(0).json()
    assert {"target", "sglang_version", "package_dir", "files", "server"} <= set(doc), doc.keys()
    assert doc["target"] == via.name(target)
    assert doc["sglang_version"] == tree.version
    assert os.path.realpath(doc["package_dir"]) == os.path.realpath(tree.pkg)
    assert doc["server"] is None or (isinstance(doc["server"]["pid"], int) and isinstance(doc["server"]["argv"], list))
    paths = [f["path"] for f in doc["files"]]
    assert {f"srt/speculative/{n}" for n in tree.patched_names} <= set(paths), paths
    for f in doc["files"]:
        assert re.fullmatch(r"srt/speculative/[\w/]+\.py", f["path"]), f["path"]
        assert f["state"] == "pristine"
        for w in f["workers"]:
            assert {"class", "method", "phases"} <= set(w) and set(w["phases"]) <= PHASES, w
    main = next(f for f in doc["files"] if f["path"] == rel)
    w = next(w for w in main["workers"] if w["class"] == tree.main_class)
    assert w["method"] == "forward_batch_generation"
    assert {"draft", "verify", "draft_extend"} <= set(w["phases"]), w
    start, end = w["lines"]
    assert lines[start - 1].lstrip().startswith("def forward_batch_generation"), lines[start - 1]
    assert (start, end) == (fn.lineno, fn.end_lineno)
    # each call site is the statement that makes the phase's call
    calls = {"draft": "draft(", "verify": "verify(", "target": "target", "draft_extend": "draft_extend"}
    stmts = {n.lineno: ast.get_source_segment(src, n) for n in ast.walk(fn) if isinstance(n, ast.stmt)}
    assert w["call_sites"], w
    for site in w["call_sites"]:
        assert start <= site["line"] <= end, site
        assert calls[site["phase"]] in (stmts.get(site["line"]) or ""), (site, lines[site["line"] - 1])

    human = via.run("show", target=target).expect(0).out
    assert f"sglang {tree.version}" in human
    assert re.search(rf"^  {tree.main_class}\.forward_batch_generation \(lines {start}-{end}\): phases ", human, re.M), human
    for site in w["call_sites"]:
        assert re.search(rf"^    {site['phase']}\s+{site['mode']}\s+line {site['line']} in ", human, re.M), site
    # the numbered source of the entry method, as in the file
    for n in (start, (start + end) // 2, end):
        assert re.search(rf"^ *{n}  {re.escape(lines[n - 1])}", human, re.M), f"line {n} not in the slice"
    for site in w["call_sites"]:
        assert re.search(rf"^ *{site['line']}  .*<- {site['phase']}$", human, re.M), site
    assert_same(snapshot(tree.root), before, "show")


def python_seeing(site: Path, workdir: Path) -> str:
    """An interpreter whose sys.path finds sglang in ``site`` (PYTHONPATH; PYTHONSAFEPATH keeps the working
    directory off sys.path), so discovery without --sglang-path finds the tree."""
    import shlex

    b = workdir / "bin"
    b.mkdir(exist_ok=True)
    w = b / "python3"
    w.write_text(f"#!/bin/sh\nPYTHONSAFEPATH=1 PYTHONPATH={shlex.quote(str(site))} exec {shlex.quote(sys.executable)} \"$@\"\n")
    w.chmod(0o755)
    return str(w)


def scenario_many_targets(via: Via, workdir: Path) -> None:
    """Two TARGETs in one apply: both patched, one result line each. Then a revert of those two plus a target
    without sglang: the two are reverted, the third fails, the exit code is the worst (4).

    Local: two local trees. SSH: the SSH target (discovering its tree through the interpreter's sys.path, since
    --sglang-path would name one folder for every target) plus a local tree, in one command."""
    t1 = make_tree(workdir / "t1", full=False)
    t2 = make_tree(workdir / "t2", full=False)
    empty = workdir / "empty"
    empty.mkdir()
    b1, b2 = snapshot(t1.root), snapshot(t2.root)

    def run(*args: str) -> Result:
        argv = [*EAGLEPATCH, args[0], *with_log_dir(args[0], args[1:])]
        p = subprocess.run(argv, env=via.env, cwd=via.cwd, capture_output=True, text=True, timeout=120,
                           stdin=subprocess.DEVNULL)
        return Result(argv, p.returncode, p.stdout, p.stderr)

    if via.kind == "ssh":
        assert isinstance(via, SSHVia)
        opts = ["--python", python_seeing(t1.site, workdir)]
        # -i is an SSH option: with a local TARGET beside the SSH one it is a usage error, found before the SSH
        # target is touched
        bad = [*opts, via.sshd.target, "-i", via.sshd.client_key, str(t2.root)]
        first, name1 = [via.sshd.alias], via.sshd.alias  # the alias's IdentityFile instead
    else:
        opts = []
        bad = [str(t1.root), str(t2.root), str(workdir / "no such tree")]
        first, name1 = [str(t1.root)], str(t1.root)
    r = run("apply", "--no-restart", *bad).expect(2)
    r.error_line()
    assert r.out == ""
    assert_same(snapshot(t1.root), b1, "apply with a usage error in one TARGET: t1")
    assert_same(snapshot(t2.root), b2, "apply with a usage error in one TARGET: t2")

    r = run("apply", "--no-restart", *opts, *first, str(t2.root)).expect(0)
    out = r.out.splitlines()
    assert len(out) == 2, f"one result line per target:\n{r}"
    assert out[0].startswith(f"{name1}: apply: changed (") and out[1].startswith(f"{t2.root}: apply: changed ("), r
    for t in (t1, t2):
        assert_clean_apply(t, workdir, f"apply of two targets: {t.root.name}")

    r = run("revert", "--no-restart", "--json", *opts, *first, str(t2.root), str(empty)).expect(4)
    docs = r.json()
    assert isinstance(docs, list) and len(docs) == 3, docs
    assert [d["target"] for d in docs] == [name1, str(t2.root), str(empty)]
    assert docs[0]["changed"] is True and docs[1]["changed"] is True
    assert docs[2]["exit_code"] == 4 and "sglang" in docs[2]["error"]
    assert_same(snapshot(t1.root), b1, "revert of several targets: t1")
    assert_same(snapshot(t2.root), b2, "revert of several targets: t2")
