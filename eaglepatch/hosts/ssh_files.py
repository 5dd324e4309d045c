"""Files over SSH: ``SSHHost``'s reads, writes, stats and renames, on one SFTP session opened on first use.

Errors are those of ``LocalHost`` (``FileNotFoundError``, ``PermissionError``, ``OSError`` naming the operation);
a lost connection is a ``ConnectionFailed``. ``SSHFiles`` is mixed into ``SSHHost``, which gives it the connection.
"""

from __future__ import annotations

import errno
import socket
import threading
from typing import Callable, TypeVar

from eaglepatch.hosts.paramiko_import import paramiko
from paramiko.ssh_exception import SSHException

from eaglepatch.errors import ConnectionFailed
from eaglepatch.hosts.base import CommandResult, FileStat

T = TypeVar("T")

_CHUNK = 1 << 15  # a file larger than this is read with prefetch


class SSHFiles:
    """The file calls of ``SSHHost`` (see ``eaglepatch.hosts.base.Host``); ``SSHHost`` gives them what is declared
    here."""

    name: str
    _lock: threading.RLock
    _sftp: paramiko.SFTPClient | None
    _live_transport: Callable[[], paramiko.Transport]
    _lost: Callable[..., ConnectionFailed]
    run: Callable[..., CommandResult]

    def _sftp_call(self, op: str, path: str, fn: Callable[[paramiko.SFTPClient], T]) -> T:
        with self._lock:
            transport = self._live_transport()
            try:
                if self._sftp is None:
                    self._sftp = transport.open_sftp_client()
                    if self._sftp is None:
                        raise SSHException("the server refused the sftp subsystem")
                return fn(self._sftp)
            except (EOFError, SSHException, paramiko.SFTPError) as exc:
                if not transport.is_active():
                    raise self._lost(exc) from exc
                if isinstance(exc, paramiko.SFTPError) or self._sftp is None:
                    raise ConnectionFailed(f"SFTP on {self.name} failed ({op} {path}): {exc}") from exc
                raise self._lost(exc) from exc
            except OSError as exc:
                if isinstance(exc, (ConnectionError, socket.timeout)) or not transport.is_active():
                    raise self._lost(exc) from exc
                raise sftp_os_error(exc, op, path, self.name) from None

    def read_bytes(self, path: str) -> bytes:
        def read(sftp: paramiko.SFTPClient) -> bytes:
            with sftp.open(path, "rb") as f:
                size = f.stat().st_size or 0
                if size > _CHUNK:
                    f.prefetch(size)
                return f.read()

        return self._sftp_call("read", path, read)

    def write_bytes(self, path: str, data: bytes, mode: int | None = None) -> None:
        perm = 0o600 if mode is None else (mode & 0o7777)

        def write(sftp: paramiko.SFTPClient) -> None:
            f = _sftp_create(sftp, path, perm)
            with f:
                f.set_pipelined(True)
                f.write(bytes(data))
                f.flush()
                _sftp_fsync(sftp, f)
            if mode is not None:
                sftp.chmod(path, mode & 0o7777)

        self._sftp_call("write", path, write)

    def stat(self, path: str) -> FileStat | None:
        def stat(sftp: paramiko.SFTPClient) -> FileStat | None:
            try:
                st = sftp.stat(path)
            except FileNotFoundError:
                return None
            return FileStat(
                mode=st.st_mode or 0,
                uid=st.st_uid or 0,
                gid=st.st_gid or 0,
                size=st.st_size or 0,
                mtime=float(st.st_mtime or 0),
            )

        return self._sftp_call("stat", path, stat)

    def rename(self, src: str, dst: str) -> None:
        def rename(sftp: paramiko.SFTPClient) -> bool:
            try:
                sftp.posix_rename(src, dst)
                return True
            except OSError as exc:
                if exc.errno is None and "unsupported" in str(exc).lower():
                    return False  # no posix-rename@openssh.com: fall back to mv below
                raise

        if not self._sftp_call("rename", src, rename):
            result = self.run(["mv", "-f", "--", src, dst])
            if not result.ok:
                text = result.stderr.decode("utf-8", "replace").strip()
                if "No such file" in text:
                    raise FileNotFoundError(errno.ENOENT, "No such file or directory", src)
                raise OSError(errno.EIO, f"rename failed on {self.name}: {text}", src)

    def remove(self, path: str) -> None:
        def remove(sftp: paramiko.SFTPClient) -> None:
            try:
                sftp.remove(path)
            except FileNotFoundError:
                pass

        self._sftp_call("remove", path, remove)

    def listdir(self, path: str) -> list[str]:
        return self._sftp_call("listdir", path, lambda sftp: sorted(sftp.listdir(path)))


def sftp_os_error(exc: OSError, op: str, path: str, host: str) -> OSError:
    """The ``OSError`` an SFTP call raised, as ``LocalHost`` would raise it (``FileNotFoundError``,
    ``PermissionError``, else one naming the operation and the host)."""
    if exc.errno == errno.ENOENT or isinstance(exc, FileNotFoundError):
        return FileNotFoundError(errno.ENOENT, "No such file or directory", path)
    if exc.errno in (errno.EACCES, errno.EPERM) or isinstance(exc, PermissionError):
        return PermissionError(errno.EACCES, "Permission denied", path)
    text = exc.strerror or str(exc) or type(exc).__name__
    return OSError(exc.errno or errno.EIO, f"{op} failed on {host}: {text}", path)


def _sftp_create(sftp: paramiko.SFTPClient, path: str, perm: int) -> paramiko.SFTPFile:
    """Open ``path`` for writing (create, truncate) with ``perm`` as the creation mode, like os.open(..., perm);
    paramiko's ``open`` sends no mode, so a new file would get the server's default 0666 & umask."""
    from paramiko import sftp as proto
    from paramiko.sftp_attr import SFTPAttributes
    from paramiko.sftp_file import SFTPFile

    try:
        attrs = SFTPAttributes()
        attrs.st_mode = perm
        flags = proto.SFTP_FLAG_WRITE | proto.SFTP_FLAG_CREATE | proto.SFTP_FLAG_TRUNC
        t, msg = sftp._request(proto.CMD_OPEN, sftp._adjust_cwd(path), flags, attrs)
        if t != proto.CMD_HANDLE:
            raise proto.SFTPError("Expected handle")
        return SFTPFile(sftp, msg.get_binary(), "wb", -1)
    except AttributeError:  # paramiko moved its internals: fall back to the public call
        return sftp.open(path, "wb")


def _sftp_fsync(sftp: paramiko.SFTPClient, f: paramiko.SFTPFile) -> None:
    """OpenSSH's ``fsync@openssh.com`` on an open file, when the server has it; silently nothing otherwise."""
    from paramiko import sftp as proto

    try:
        sftp._request(proto.CMD_EXTENDED, "fsync@openssh.com", f.handle)
    except (IOError, proto.SFTPError, AttributeError):
        pass
