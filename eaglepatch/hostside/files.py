"""Files on the host: read them, hash and encode them, and replace them safely (a temp file beside the
destination, fsync'd, renamed over it; through a symlink to its target; into the inode of a hard-linked file).

Shared by the steps that write (``execute``, ``live``) and those that read (``install``, ``logs``, ``doctor``).
"""

from __future__ import annotations

import base64
import errno
import hashlib
import json
import os
import re
import stat


TMP_TAG = ".eaglepatch-tmp-"
STALE_TMP = re.compile(r"^\..+" + re.escape(TMP_TAG) + r"[0-9a-f]+r?$")


def read_or_none(path):
    """The bytes of ``path``, or None when it cannot be read (a process gone, another user's)."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def read_file(path):
    """The bytes of ``path``; raises OSError."""
    with open(path, "rb") as f:
        return f.read()


def read_json(path):
    """The JSON document in the file ``path``, or None when it is absent, cannot be read or is not JSON."""
    try:
        return json.loads(read_file(path).decode())
    except (OSError, ValueError):
        return None


def sha256_of(data):
    """The sha256 of ``data``, in hex."""
    return hashlib.sha256(data).hexdigest()


def b64(data):
    """``data`` as base64 text (bytes travel so inside JSON)."""
    return base64.b64encode(data).decode("ascii")


def unb64(text):
    """The bytes of ``b64``'s text."""
    return base64.b64decode(text.encode("ascii"))


def real_file(path):
    """Where the bytes of ``path`` live: a symlink's target (its links resolved), else the path itself. A worker
    file that is a symlink is patched through it: the link stays a link (docs/safety.md)."""
    return os.path.realpath(path) if os.path.islink(path) else path


def tmp_name(path, token):
    """The temp file for ``path``: beside the file its bytes go to (a symlink's target), so that the rename stays
    on one file system."""
    d, name = os.path.split(real_file(path))
    return os.path.join(d, "." + name + TMP_TAG + token)


def write_new(path, data, like_stat=None, mode=0o644):
    """Write ``data`` to ``path`` (a new temp file), fsync'd, with the mode and owner of ``like_stat``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    if like_stat is not None:
        os.chmod(path, like_stat.st_mode & 0o7777)
        try:
            os.chown(path, like_stat.st_uid, like_stat.st_gid)
        except OSError:
            pass  # not root: the file is ours, as the original was writable by us
    else:
        os.chmod(path, mode)


def replace_file(src_tmp, dst):
    """Put the bytes of the temp file ``src_tmp`` at ``dst``, keeping what ``dst`` is: a rename over it (atomic);
    through a symlink, a rename over its target (the link untouched); into a file with other hard links, a write
    into its own inode (every name keeps seeing the same file), after which the temp file goes."""
    real = real_file(dst)
    try:
        st = os.lstat(real)
    except FileNotFoundError:
        st = None
    if st is not None and stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
        _write_into(real, read_file(src_tmp))
        os.remove(src_tmp)
        return
    os.replace(src_tmp, real)


def _write_into(path, data):
    """Overwrite the regular file ``path`` in place with ``data`` (one write from its start, then cut to length,
    then fsync): its inode, links, mode and owner stay. Not atomic as a rename is (see docs/safety.md)."""
    fd = os.open(path, os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        done = 0
        view = memoryview(data)
        while done < len(data):
            done += os.pwrite(fd, view[done:], done)
        os.ftruncate(fd, len(data))
        os.fsync(fd)
    finally:
        os.close(fd)


def private_dir(path):
    """``path`` if it is (or can be made, 0700) a folder of this user that nobody else may write; else a private
    folder of this user's beside it (``<path>-<uid>``), made the same way; raises OSError when neither can be."""
    for cand in (path, "%s-%d" % (path, os.geteuid())):
        try:
            os.makedirs(cand, mode=0o700, exist_ok=True)
            st = os.lstat(cand)
        except OSError:
            continue
        if os.path.isdir(cand) and not os.path.islink(cand) and st.st_uid == os.geteuid() and not st.st_mode & 0o022:
            return cand
    raise OSError(errno.EACCES, "neither %s nor %s-%d is a folder of this user's only" % (path, path, os.geteuid()))


def open_private(path, flags, mode=0o600):
    """Open ``path`` without following a symlink, and only if it is a regular file."""
    fd = os.open(path, flags | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), mode)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", path)
    return fd
