"""``aggregate`` of timing logs while a fetch is still writing them into the cache: ``Follower`` runs it in a child
process that reads each file as its bytes come, so that a cold ``report TARGET`` aggregates while it fetches
(docs/design.md, "Where report finds the records").

The child (``python -c BOOT``, started before the connection so that its start is hidden) waits for its job: the
files, in order, what each holds now, and the arguments of ``aggregate``. It then runs ``aggregate`` as it is,
``open`` answering for those files with a reader that stops at the bytes written so far and waits there (on its
stdin) until the parent says more are written (``"<index> <size>\\n"``), that the file gets no more
(``"<index> end\\n"``: the scan goes on to the next file while the fetch brings that one) or that the fetch is over
(``"done\\n"``); its answer is a pickle on its stdout. A child of its own (not a thread): the scan holds the GIL,
which paramiko's thread needs for every packet.

The child's result is used only where it is ``aggregate`` of the finished files: the same files and arguments as
the caller's own call (``Follower.result``), no file written again from 0 once the child could have read it (nor
after it was said to get no more), each file read through the reader to exactly its final size at every opening;
anything else (the child failed, or never started) gives None, and the caller aggregates the finished files itself.
"""

from __future__ import annotations

import builtins
import io
import json
import os
import pickle
import select
import signal
import subprocess
import sys
import traceback
from typing import Any, Sequence

from eaglepatch.errors import EaglepatchError

# The child's command line: sys.path as the parent's (the same eaglepatch and msgspec), then the child's main.
BOOT = "import sys,json;sys.path[:]=json.loads(sys.argv[1]);from eaglepatch.ops.follow import child;child()"
_BUFFER = 1 << 20  # the reader's buffer: one call of Python code per MiB read


class _Gone(Exception):
    """The parent is gone, or has given the job up: the child stops."""


class _News:
    """What the parent has said so far: how many bytes of each file are written (``sizes``), which files get no
    more (``complete``), whether the fetch is over (``done``); and what the readers saw: openings of each file,
    and where each reached its end."""

    def __init__(self, fd: int, buf: bytes, sizes: list[int]):
        self.fd, self.buf, self.sizes = fd, buf, sizes
        self.complete = [False] * len(sizes)
        self.done = False
        self.opened = [0] * len(sizes)
        self.ends: list[list[int]] = [[] for _ in sizes]
        self._parse()

    def take(self, block: bool) -> None:
        """Read what the parent has sent; with ``block``, wait until something comes."""
        while not self.done:
            if block:
                select.select([self.fd], [], [])
            try:
                chunk = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return
            if not chunk:
                raise _Gone("the parent is gone before the fetch was over")
            self.buf += chunk
            self._parse()
            if block:
                return

    def _parse(self) -> None:
        *lines, self.buf = self.buf.split(b"\n")
        for line in lines:
            if line == b"done":
                self.done = True
            elif line == b"stop":
                raise _Gone("the parent gave the job up")
            else:
                i, size = line.split()
                if size == b"end":
                    self.complete[int(i)] = True
                else:
                    self.sizes[int(i)] = int(size)


class _Growing(io.RawIOBase):
    """File ``i`` of the job, read up to the bytes the parent says are written, waiting there for more until the
    parent says it gets no more, or that the fetch is over."""

    def __init__(self, news: _News, i: int, path: str):
        super().__init__()
        self.news, self.i, self.name = news, i, path
        self.fd: int | None = None
        self.pos = 0
        self.ended = False
        news.opened[i] += 1

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        news = self.news
        while True:
            limit = news.sizes[self.i]
            if self.pos < limit:
                if self.fd is None:
                    self.fd = os.open(self.name, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
                with memoryview(b) as view:
                    n = os.readv(self.fd, [view[: limit - self.pos]])
                if n <= 0:
                    raise OSError(f"{self.name}: fewer bytes than were written")
                self.pos += n
                news.take(False)
                return n
            if news.done or news.complete[self.i]:
                if not self.ended:  # once an opening (a buffered reader asks again at the end)
                    self.ended = True
                    news.ends[self.i].append(self.pos)
                return 0
            news.take(True)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        super().close()


def _open_for(news: _News, files: Sequence[str]) -> Any:
    """``open`` for the child: the job's files (read-only) through ``_Growing``, anything else as ever."""
    index = {p: i for i, p in enumerate(files)}
    real = builtins.open

    def open_(file: Any, mode: str = "r", buffering: int = -1, encoding: str | None = None,
              errors: str | None = None, newline: str | None = None, closefd: bool = True, opener: Any = None) -> Any:
        i = index.get(file) if isinstance(file, str) else None
        if i is None or mode not in ("r", "rt", "rb") or opener is not None:
            return real(file, mode, buffering, encoding, errors, newline, closefd, opener)
        raw = _Growing(news, i, file)
        if buffering == 0 and mode == "rb":
            return raw
        buf = io.BufferedReader(raw, _BUFFER)
        return buf if mode == "rb" else io.TextIOWrapper(buf, encoding, errors, newline)

    return open_


def _read_job(fd: int) -> tuple[dict[str, Any], bytes]:
    """The job (a length line, then its pickle) and what came after it."""
    buf = b""
    while b"\n" not in buf:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            raise _Gone("no job")
        buf += chunk
    head, buf = buf.split(b"\n", 1)
    size = int(head)
    while len(buf) < size:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            raise _Gone("a job cut short")
        buf += chunk
    return pickle.loads(buf[:size]), buf[size:]


def child() -> None:
    """The child's main: one job, its answer on stdout."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides; a Ctrl-C ends it, and its stdin with it
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # nothing else is ever written into the answer
    from eaglepatch.report.aggregation import aggregate  # imported while the parent connects

    try:
        job, rest = _read_job(0)
        os.set_blocking(0, False)
        news = _News(0, rest, list(job["sizes"]))
        builtins.open = _open_for(news, job["files"])
        try:
            answer: tuple[Any, ...] = ("ok", aggregate(job["files"], **job["kwargs"]))
        except EaglepatchError as exc:
            answer = ("error", exc)
        except _Gone:
            raise
        except BaseException:
            answer = ("failed", traceback.format_exc().strip().splitlines()[-1])
        answer += (news.opened, news.ends)
    except _Gone:
        return
    except BaseException:
        answer = ("failed", traceback.format_exc().strip().splitlines()[-1], [], [])
    try:
        out.write(pickle.dumps(answer))
        out.close()
    except OSError:
        pass


class Follower:
    """``aggregate`` in a child process, over files that a fetch is writing: ``start`` (its job, once the files are
    known), ``wrote`` after each batch (what ``report``'s ``eaglepatch.ops.logs.LogWatch`` passes on), ``result``
    once the fetch is over. Starting the child is the constructor's (before the connection: its interpreter starts
    meanwhile); ``close`` ends it, whatever happened."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.job: tuple[list[str], dict[str, Any]] | None = None
        self.index: dict[str, int] = {}
        self.spoiled = False  # the child's result can no longer be the caller's: it is not waited for
        self.why = "no job"  # why there is no result (for EAGLEPATCH_DEBUG and tests); None once there is one
        self._pending = b""
        self._complete: set[int] = set()  # the files said to get no more
        try:
            self.proc = subprocess.Popen([sys.executable, "-c", BOOT, json.dumps(sys.path)], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
        except (OSError, ValueError) as exc:
            self._spoil(f"the child did not start: {exc}")

    def start(self, files: Sequence[str], sizes: dict[str, int], kwargs: dict[str, Any]) -> None:
        """Give the child its job: ``aggregate(files, **kwargs)``, each file holding ``sizes`` bytes now."""
        if self.proc is None or self.spoiled or self.job is not None:
            return
        self.job = (list(files), dict(kwargs))
        self.index = {p: i for i, p in enumerate(files)}
        data = pickle.dumps({"files": list(files), "sizes": [sizes.get(p, 0) for p in files], "kwargs": kwargs})
        assert self.proc.stdin is not None
        os.set_blocking(self.proc.stdin.fileno(), False)  # the fetch never waits on the child
        self._send(b"%d\n" % len(data) + data)

    def wrote(self, path: str, size: int, replaced: bool) -> None:
        """``path`` now holds ``size`` bytes (``replaced``: written again from 0: the child may have read others)."""
        i = self.index.get(path)
        if i is None or self.spoiled:
            return  # a file outside the job: ``result`` finds that the files differ
        if replaced or i in self._complete:
            self._send(b"stop\n")
            self._spoil(f"{path} was written again from its start" if replaced else
                        f"{path} was written after it was said to get no more")
            return
        self._send(b"%d %d\n" % (i, size))

    def complete(self, path: str) -> None:
        """``path`` gets no more bytes in this fetch: the child's scan may go on past its end."""
        i = self.index.get(path)
        if i is None or self.spoiled or i in self._complete:
            return
        self._complete.add(i)
        self._send(b"%d end\n" % i)

    def _send(self, data: bytes, wait: bool = False) -> None:
        self._pending += data
        assert self.proc is not None and self.proc.stdin is not None
        fd = self.proc.stdin.fileno()
        try:
            while self._pending:
                if wait:
                    select.select([], [fd], [])
                try:
                    n = os.write(fd, self._pending)
                except BlockingIOError:
                    if not wait:
                        return  # sent with the next news
                    continue
                self._pending = self._pending[n:]
        except OSError as exc:  # the child has ended
            self._spoil(f"the child ended early ({exc})")

    def _spoil(self, why: str) -> None:
        if not self.spoiled:
            self.spoiled, self.why = True, why

    def result(self, files: Sequence[str], kwargs: dict[str, Any]) -> Any:
        """The child's ``aggregate``, when it is ``aggregate(files, **kwargs)`` of the files as they are now (the
        fetch over); else None, the child ended first (it may be writing the same trace file). Raises what that
        aggregation raised (a ``UsageError``) once it had read every file to its end."""
        try:
            answer = self._answer(files, kwargs)
        finally:
            self.close()
        if answer is None:
            return None
        self.why = None
        if answer[0] == "error":
            raise answer[1]
        return answer[1]

    def _answer(self, files: Sequence[str], kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
        if self.proc is None or self.spoiled:
            return None
        if self.job is None:
            return None
        if self.job != (list(files), dict(kwargs)):
            self.why = "the files or the aggregation differ from its job"
            return None
        try:
            final = [os.stat(p).st_size for p in files]
        except OSError as exc:
            self.why = str(exc)
            return None
        self._send(b"done\n", wait=True)
        if self.spoiled:
            return None
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        data = self.proc.stdout.read()
        self.proc.wait()
        try:
            answer = pickle.loads(data)
            kind, _value, opened, ends = answer
        except Exception:  # a child that died half-way: no answer
            self.why = "the child gave no answer"
            return None
        # every file read to its final size, at each opening (and opened: read through the reader at all)
        if kind not in ("ok", "error") or len(opened) != len(final) or len(ends) != len(final) or not all(
                n >= 1 and len(at) == n and all(e == size for e in at) for n, at, size in zip(opened, ends, final)):
            self.why = (f"the child failed: {_value}" if kind == "failed" else
                        "the child did not read each file through to its end")
            return None
        return answer

    def close(self) -> None:
        """End the child (idempotent)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        for f in (proc.stdin, proc.stdout):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass
        if proc.poll() is None:
            proc.kill()
        proc.wait()
