"""Run a check as a user without privileges, also when the tests run as root (CI does).

Root may write a folder whatever its mode, so a test of "this folder cannot be written" proves nothing as root,
and skipping it there left such checks unrun in CI. ``as_unprivileged(fn, *args)`` calls ``fn(*args)`` in this
process when it runs as an ordinary user; as root it forks, and the child drops to ``nobody`` (its groups, then its
group, then its user) before the call. The answer (or the exception's text) comes back through a pipe, pickled.

``user_folder()`` makes a folder that user owns, reachable by it (pytest's own temp folders are root's, 0700), and
removes it afterwards: the paths the check opens go there.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import pwd
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

NOBODY = "nobody"


def _ids() -> tuple[int, int]:
    try:
        pw = pwd.getpwnam(NOBODY)
        return pw.pw_uid, pw.pw_gid
    except KeyError:
        return 65534, 65534


def is_root() -> bool:
    return os.geteuid() == 0


@contextlib.contextmanager
def user_folder() -> Iterator[Path]:
    """A new folder under the system's temp folder, owned by the unprivileged user when this is root."""
    path = Path(tempfile.mkdtemp(prefix="eaglepatch-test-unpriv-"))
    try:
        if is_root():
            uid, gid = _ids()
            os.chown(path, uid, gid)
        path.chmod(0o755)
        yield path
    finally:
        for p in [path, *path.rglob("*")]:
            with contextlib.suppress(OSError):
                if p.is_dir() and not p.is_symlink():
                    p.chmod(0o755)
        shutil.rmtree(path, ignore_errors=True)


def give(path: Path) -> Path:
    """``path`` owned by the unprivileged user (when this is root), for a check whose subject is its mode."""
    if is_root():
        uid, gid = _ids()
        os.chown(path, uid, gid)
    return path


def as_unprivileged(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` as an unprivileged user: here when this process is one, else in a child that dropped root."""
    if not is_root():
        return fn(*args)
    uid, gid = _ids()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop root for good, call, answer, and leave without running the parent's cleanup
        code = 0
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            try:
                answer = ("ok", fn(*args))
            except BaseException as e:  # noqa: BLE001 - every failure goes back to the test as text
                answer = ("error", f"{type(e).__name__}: {e}")
            with os.fdopen(w, "wb") as f:
                pickle.dump(answer, f)
        except BaseException:  # noqa: BLE001
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    assert data, f"the unprivileged child answered nothing (wait status {status})"
    kind, value = pickle.loads(data)
    if kind == "error":
        raise AssertionError(f"as {NOBODY}: {value}")
    return value
