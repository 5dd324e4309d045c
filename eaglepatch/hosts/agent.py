"""The agent: one long-lived interpreter per host and binary that runs eaglepatch's host-side program, and ``call``,
the one way every call on a host goes (facts, lock, execute, logs, the /proc scan, stop, start, relaunch, the
readiness probes, the log tail).

The first call for an interpreter starts it (``python -S -c AGENT``, one SSH channel and one login shell for the whole
connection) and sends it the program (``hosts.bundle.program()``: the package ``eaglepatch.hostside``) once; each
later call is one request on the same process: length-prefixed JSON frames on its stdin and stdout, bounded as
``hosts.base`` says. A request cut short on the client (Ctrl-C, a lost client) is never read again nor killed: it
finishes on the host (a relaunch, a plan with its relaunches), and ``eaglepatch.progress`` records that host.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import zlib
from typing import Any, Callable, NoReturn

from eaglepatch import progress
from eaglepatch.errors import EaglepatchError, HelperFailed, Unsupported
from eaglepatch.failpoints import failpoint
from eaglepatch.hosts import bundle, interpreters
from eaglepatch.hosts.base import (
    MAX_ANSWER,
    MAX_FRAME,
    MAX_HEADER,
    MAX_PREAMBLE,
    CommandResult,
    Host,
    HostProcess,
    Program,
    mib,
)

# Written by the agent on the host before anything else: the bytes a login shell prints on stdout before the
# interpreter starts (a banner in ~/.bashrc, a ForceCommand's echo) come before it and are skipped.
MARKER = b"\x1eeaglepatch\x1e\n"


class RemoteScriptError(Exception):
    """A remote helper program failed; carries its result for the message."""

    def __init__(self, python: str, result: CommandResult, started: bool = False):
        tail = (result.stderr or result.stdout).decode("utf-8", "replace").strip().splitlines()[-3:]
        super().__init__(f"{python} exited {result.rc}: {' | '.join(tail) or 'no output'}")
        self.result = result
        # the interpreter ran eaglepatch's code (its marker came): a failure is the program's, not a missing python
        self.started = started


class AnswerRefused(RemoteScriptError):
    """What a host's helper sent is refused unread: past a bound (``MAX_PREAMBLE``, ``MAX_FRAME``, ``MAX_ANSWER``),
    or not a frame at all. ``str()`` is one line saying which."""

    def __init__(self, python: str, why: str):
        Exception.__init__(self, f"the answer of {python} on the host was refused: {why}: is --python an "
                                 "interpreter that runs eaglepatch's helper as it is?")
        self.result = CommandResult(1, b"", why.encode())
        self.started = True


def inflate(data: bytes, limit: int = MAX_ANSWER) -> bytes:
    """``zlib.decompress(data)``, never more than ``limit`` bytes of it (a zip bomb is refused, not inflated);
    raises ``ValueError`` saying which bound was passed, ``zlib.error`` for bytes that are not zlib's."""
    d = zlib.decompressobj()
    out = d.decompress(data, limit + 1)
    if len(out) > limit or d.unconsumed_tail:
        raise ValueError(f"a frame that inflates to more than {mib(limit)} ({len(data)} bytes compressed)")
    if not d.eof:
        raise zlib.error("truncated zlib stream")
    return out


PIECE = 1 << 20  # an attachment comes as pieces of at most this many bytes
_FEED = 1 << 16  # compressed bytes given to zlib at a time: what it leaves over (copied) stays small


def inflate_pieces(data: bytes, limit: int = MAX_ANSWER) -> list[bytes]:
    """``inflate``, as pieces of at most ``PIECE`` bytes (joined, ``inflate(data, limit)``): a big attachment is
    never one block of memory, nor copied again to join it (an 8 MB batch of logs inflated at once took some
    21 MB, and 0.4 s more a GB of the client's CPU); the same bounds and errors."""
    d = zlib.decompressobj()
    out: list[bytes] = []
    total = 0
    with memoryview(data) as view:
        for at in range(0, len(view), _FEED):
            chunk: Any = view[at : at + _FEED]
            while chunk and not d.eof:
                piece = d.decompress(chunk, PIECE)
                total += len(piece)
                if total > limit:
                    raise ValueError(f"a frame that inflates to more than {mib(limit)} ({len(data)} bytes "
                                     "compressed)")
                if piece:
                    out.append(piece)
                chunk = d.unconsumed_tail
            if d.eof:
                break
    if not d.eof:
        raise zlib.error("truncated zlib stream")
    return out


# The agent's own code: python -c AGENT. It reads length-prefixed frames on stdin (the program first, then one
# JSON request per frame) and answers each request with one length-prefixed JSON frame on what was its stdout.
# A frame is "<length>\n<bytes>", or "z<length>\n<zlib bytes>" when it is worth compressing (the worker files
# travel base64-encoded inside JSON: a third of the bytes on the wire, which paramiko moves at some 8 MB/s).
# An op whose answer holds bytes (the timing logs) gives them as "__blobs__", a list: the JSON frame then says how
# many ("blobs": n) and n raw frames follow it, each compressed as a frame is (no base64, no JSON around them).
# Every frame of an answer is made before any is written: an error making one is answered as an error, never in the
# middle of an answer. An answer is let go once written: the next request's batch of logs is read without it.
# stdin and stdout are moved out of the way first, so that the program and any child it starts read /dev/null
# and print on stderr, never into the frames. Python 3.8+, standard library only.
_AGENT_SOURCE = r"""
import os,sys,json,traceback,zlib
i=os.fdopen(os.dup(0),'rb');o=os.fdopen(os.dup(1),'wb')
n=os.open(os.devnull,os.O_RDONLY);os.dup2(n,0);os.close(n);os.dup2(2,1)
o.write(b'\x1eeaglepatch\x1e\n');o.flush()
def r():
    l=i.readline().strip()
    if not l:return None
    z=l[:1]==b'z';d=i.read(int(l[1:] if z else l))
    return zlib.decompress(d) if z else d
def f(d):
    z=len(d)>4096
    if z:d=zlib.compress(d,1)
    return (b'z%d\n' if z else b'%d\n')%len(d),d
def w(d,b=()):
    x=[f(y) for y in b]
    for h,y in [f(json.dumps(d).encode())]+x:o.write(h);o.write(y)
    o.flush()
g={'__name__':'__main__'}
exec(compile(r(),'<eaglepatch-remote>','exec'),g)
w({'pid':os.getpid(),'exe':sys.executable,'real':os.path.realpath(sys.executable)})
while 1:
    d=r()
    if d is None:break
    d=json.loads(d)
    try:
        if '__realpath__' in d:
            w({'result':os.path.realpath(d['__realpath__'])});continue
        x=g['main'](d);b=x.pop('__blobs__',()) if type(x) is dict else ()
        w({'result':x,'blobs':len(b)},b) if b else w({'result':x})
        x=b=None
    except SystemExit as e:
        c=e.code;sys.stderr.write('' if c is None or isinstance(c,int) else str(c)+'\n');sys.stderr.flush()
        w({'exit':c if isinstance(c,int) else (0 if c is None else 1)});break
    except Exception:
        w({'error':traceback.format_exc()})
"""
# What goes on the command line: one line of characters that every login shell passes through unchanged inside
# single quotes (sh, bash, zsh, and csh/tcsh, which refuse a newline there): the source, zlib-compressed and
# base64-encoded (letters, digits, "+", "/", "="), unpacked by a one-line bootstrap.
AGENT = 'import base64,zlib;exec(zlib.decompress(base64.b64decode("%s")))' % base64.b64encode(
    zlib.compress(_AGENT_SOURCE.encode(), 9)).decode("ascii")


# An answer's attachments (``"blobs"``): at most this many frames, and MAX_ANSWER inflated in all.
MAX_BLOBS = 1024

_COMPRESS_OVER = 4096


def _frame(data: bytes) -> bytes:
    if len(data) > _COMPRESS_OVER:
        data = zlib.compress(data, 1)
        return b"z%d\n" % len(data) + data
    return b"%d\n" % len(data) + data


class PythonAgent:
    """``program`` running in one ``python`` process on ``host`` (``python -S -c AGENT``), answering ``call``s.

    Failures are ``RemoteScriptError``, with the exit status of a process that died (127 when the interpreter does
    not exist), 124 after a timeout (the process is killed: a hung request never leaves a hung helper), 1 with the
    traceback when the program raised. After a failure that ended the process, ``dead`` is True and the agent is not
    used again. ``program`` may be a function that makes the source: it is called once the process is started, so
    that making it overlaps the interpreter's start on the host.
    """

    def __init__(self, host: Host, python: str, program: Program, kept: str | None = None):
        self.host, self.python, self.program = host, python, program
        #: the binary ``python`` started as last time on this host (``hosts.interpreters``), started instead of it
        self.kept = kept
        self._from_kept = False  # this process is that binary
        self._first_payload: Any = None  # the request that started the process (sent again to a plain start)
        self.proc: HostProcess | None = None
        self.info: dict[str, Any] | None = None  # pid, exe (sys.executable), real (its realpath)
        self.dead = False
        self._started = False  # its marker came: the interpreter runs eaglepatch's code
        self._buf = bytearray()
        self._lock = threading.RLock()  # close() may come from inside a call (a lost connection closes all)

    def call(self, payload: Any, timeout: float | None = None) -> Any:
        with self._lock:
            try:
                return self._call(payload, timeout)
            except RemoteScriptError:
                raise  # answered (an error of the program), or the process is already gone
            except BaseException:
                # cut short mid-request (Ctrl-C, an error of ours): its answer may still come, and must never be
                # read as the next request's; the process is let go, not killed (it finishes the request it has)
                progress.cut_short(self.host.name)
                if not self.dead:
                    self.close(abandon=True)
                raise

    def _call(self, payload: Any, timeout: float | None) -> Any:
        deadline = None if timeout is None else time.monotonic() + timeout
        self._send(payload, deadline)
        answer = self._receive(deadline)
        result = answer.get("result")
        if self._from_kept and isinstance(result, dict) and result.get("need_plain"):
            # the answer would depend on which interpreter ``python`` is now: ask it of that one
            self._start_plain()
            self._send(payload, deadline)
            answer = self._receive(deadline)
        return self._attachments(answer, deadline)

    def _start_plain(self) -> None:
        """Let the kept binary's process go and forget it; the next request starts ``python`` by its name."""
        interpreters.forget(_host_key(self.host), self.python)
        if self.proc is not None:
            try:
                self.proc.close()  # its stdin closed: it ends (already ended, when it did not start)
            except Exception:  # noqa: BLE001 - the process is let go whatever its channel says
                pass
        self.proc, self.info, self.kept, self._from_kept = None, None, None, False
        self.dead, self._started, self._buf = False, False, bytearray()

    def call_each(self, payload: Any, follow: Callable[[Any], Any], on_result: Callable[[Any], None],
                  timeout: float | None = None) -> None:
        """Requests in a row, each sent before the answer to the one before is read whole: ``payload`` first, then
        ``follow(result)`` of each answer (its JSON, before its attachments are read) until that is None; every
        result, attachments included, goes to ``on_result``. So the host works on the next request while this side
        reads and handles the answer to the last one (the timing logs' batches). Read-only requests only: when this
        side fails while a request is on its way (``on_result`` raised, Ctrl-C), the process is let go, its answer
        never read, and the host's later calls go to a new one (unlike ``call``'s, such a request changes nothing
        there, so the host is not marked cut short). ``timeout`` is per request."""
        with self._lock:
            pending = True  # a request was (or is being) sent whose answer is not read whole yet
            try:
                self._send(payload, None if timeout is None else time.monotonic() + timeout)
                while True:
                    deadline = None if timeout is None else time.monotonic() + timeout
                    answer = self._receive(deadline)
                    nxt = follow(answer["result"])
                    if nxt is not None:
                        self._send(nxt, deadline)
                    result = self._attachments(answer, deadline)
                    pending = nxt is not None
                    on_result(result)
                    del answer, result  # this batch's bytes are let go before the next one is read
                    if nxt is None:
                        return
            except RemoteScriptError:
                raise  # answered (an error of the program), or the process is already gone
            except BaseException:
                if pending and not self.dead:
                    # let go, its answer never read; not "cut short": the request only reads, so nothing may be
                    # under way on the host that a later request (the lock's release) would disturb
                    self.close(abandon=True)
                raise

    def start(self) -> None:
        """Start the process and send it the program now, before the first request (``hosts.head_start``: while
        the client still imports what it needs to make that request); idempotent. Raises as ``call`` does."""
        with self._lock:
            if self.proc is None and not self.dead:
                out = self._spawn()
                assert self.proc is not None
                self.proc.send(out, None)

    def _spawn(self) -> bytes:
        """Start the process; return the program's frame, to be sent first."""
        # the binary the name started as last time (``hosts.interpreters``), when the client kept one
        self._from_kept = self.kept is not None
        try:
            # -S: the program needs the standard library alone, and the site module's work (every .pth file
            # of the interpreter's site-packages, a sitecustomize) is all it would add to each start: 12 ms of
            # this project's own venv, more in a server's (docs/design.md)
            try:
                self.proc = self.host.spawn([self.kept if self._from_kept else self.python, "-S", "-c", AGENT])
            except FileNotFoundError:
                if not self._from_kept:
                    raise
                self._start_plain()  # the kept binary is gone (a local host says so at once): the name
                self.proc = self.host.spawn([self.python, "-S", "-c", AGENT])
        except FileNotFoundError as exc:
            self.dead = True
            raise RemoteScriptError(self.python, CommandResult(127, b"", str(exc).encode())) from None
        program = self.program() if callable(self.program) else self.program
        return _frame(program.encode("utf-8"))

    def _send(self, payload: Any, deadline: float | None) -> None:
        """Start the process (and send the program) on the first request, unless ``start`` did; send ``payload``."""
        if self.dead:
            raise RuntimeError("this agent's process has ended")
        out = self._spawn() if self.proc is None else b""
        if self.info is None and self._first_payload is None:
            self._first_payload = payload  # sent again to a plain start, should the kept binary not start
        if self._from_kept and isinstance(payload, dict) and payload.get("op") == "facts":
            payload = dict(payload, self_ok=False)  # not its own interpreter's install: answer need_plain
        out += _frame(json.dumps(payload).encode())
        assert self.proc is not None
        if not self.proc.send(out, deadline) and deadline is not None and time.monotonic() >= deadline:
            self._fail_timeout()

    def _receive(self, deadline: float | None) -> dict[str, Any]:
        """The next answer's JSON frame (``{"result": ..., "blobs": n}``); raises what the program raised, or what
        ended the process."""
        assert self.proc is not None
        if self.info is None:
            try:
                self._skip_to_marker(deadline)
                self.info = self._read_frame(deadline)
            except RemoteScriptError:
                if not self._from_kept:
                    raise
                # the kept binary did not start the program (gone, or no Python 3.8 any more): the name, once
                self._start_plain()
                self._send(self._first_payload, deadline)
                self._skip_to_marker(deadline)
                self.info = self._read_frame(deadline)
            self._first_payload = None
            if not self._from_kept:
                interpreters.remember(_host_key(self.host), self.python, self.info.get("exe"))
        answer = self._read_frame(deadline)
        if "result" in answer:
            return answer
        if "error" in answer:
            raise self._error(CommandResult(1, b"", str(answer["error"]).encode()))
        # SystemExit: the process ends, as a one-shot run would have
        rc, err = self.proc.wait(deadline)
        self.dead = True
        self.proc.close()
        raise self._error(CommandResult(int(answer.get("exit", rc) or 0), b"", err))

    def _attachments(self, answer: dict[str, Any], deadline: float | None) -> Any:
        """The answer's result, with its attachments (``"blobs"``: raw frames after the JSON one) read into its
        ``"__blobs__"``, within MAX_BLOBS frames and MAX_ANSWER inflated bytes in all: each a list of pieces of
        at most ``PIECE`` bytes (``inflate_pieces``; joined, the bytes the host sent; none for an empty one)."""
        result = answer["result"]
        n = answer.get("blobs", 0)
        if n == 0:
            return result
        if not isinstance(n, int) or isinstance(n, bool) or not 0 < n <= MAX_BLOBS or not isinstance(result, dict):
            self._fail_protocol()
        blobs: list[list[bytes]] = []
        left = MAX_ANSWER
        for _ in range(n):
            data = self._read_data(deadline, left, pieces=True)
            left -= sum(map(len, data))
            blobs.append(data)
        result["__blobs__"] = blobs
        return result

    def _error(self, result: CommandResult) -> RemoteScriptError:
        return RemoteScriptError(self.python, result, started=self._started)

    def _skip_to_marker(self, deadline: float | None) -> None:
        """Drop what came before the agent's marker (a login shell's output)."""
        assert self.proc is not None
        while True:
            at = self._buf.find(MARKER)
            if at >= 0:
                del self._buf[: at + len(MARKER)]
                self._started = True
                return
            if len(self._buf) > MAX_PREAMBLE + len(MARKER):
                self._refuse(f"more than {mib(MAX_PREAMBLE)} came before its marker")
            chunk = self.proc.read(deadline)
            if chunk is None:
                self._fail_timeout()
            if not chunk:
                rc, err = self.proc.wait(deadline)
                self.dead = True
                self.proc.close()
                raise self._error(CommandResult(rc, bytes(self._buf), err))
            self._buf.extend(chunk)

    def _read_frame(self, deadline: float | None) -> dict[str, Any]:
        """The next frame, a JSON object."""
        data = self._read_data(deadline, MAX_ANSWER)
        try:
            doc = json.loads(data.decode("utf-8", "replace"))
        except (ValueError, RecursionError):  # JSONDecodeError is a ValueError
            self._fail_protocol()
        if not isinstance(doc, dict):
            self._fail_protocol()
        return doc

    def _read_data(self, deadline: float | None, limit: int, pieces: bool = False) -> Any:
        """The next frame's bytes, inflated (with ``pieces``, as a list of pieces: ``inflate_pieces``); past a bound
        (its header, MAX_FRAME on the wire, ``limit`` inflated) the process is killed and the answer refused."""
        assert self.proc is not None
        while True:
            nl = self._buf.find(b"\n", 0, MAX_HEADER)
            if nl < 0 and len(self._buf) >= MAX_HEADER:
                self._refuse(f"a frame header longer than {MAX_HEADER} bytes ({bytes(self._buf[:MAX_HEADER])!r})")
            if nl >= 0:
                packed = self._buf[:1] == b"z"
                head = bytes(self._buf[1 if packed else 0 : nl])
                if not head.isdigit():  # int() would take "+5", " 5", "5_0"
                    self._refuse(f"a frame header that is no length ({bytes(self._buf[:nl])!r})")
                size = int(head)
                if size > MAX_FRAME:
                    # refused before its bytes are read: the length alone is the host's word
                    self._refuse(f"a frame of {size} bytes (at most {mib(MAX_FRAME)})")
                if len(self._buf) >= nl + 1 + size:
                    with memoryview(self._buf) as view:  # one copy of the frame, not two
                        data = bytes(view[nl + 1 : nl + 1 + size])
                    del self._buf[: nl + 1 + size]
                    try:
                        if packed:
                            return inflate_pieces(data, limit) if pieces else inflate(data, limit)
                        if size > limit:
                            raise ValueError(f"an answer of {size} bytes (at most {mib(limit)})")
                        if pieces:
                            return [data[at : at + PIECE] for at in range(0, len(data), PIECE)]
                        return data
                    except ValueError as exc:
                        self._refuse(str(exc))
                    except zlib.error:
                        self._fail_protocol()
            chunk = self.proc.read(deadline)
            if chunk is None:
                self._fail_timeout()
            if not chunk:  # the process ended without answering: its status and stderr say why
                rc, err = self.proc.wait(deadline)
                self.dead = True
                self.proc.close()
                stdout = bytes(self._buf)
                raise self._error(CommandResult(rc, stdout, err))
            self._buf.extend(chunk)

    def _kill(self) -> bytes:
        assert self.proc is not None
        self.dead = True
        self.proc.kill(self.info.get("pid") if self.info else None)
        _rc, err = self.proc.wait(time.monotonic() + 5)
        self.proc.close()
        return err

    def _fail_timeout(self) -> NoReturn:
        err = self._kill()
        raise self._error(CommandResult(124, bytes(self._buf), err + b"\ntimed out"))

    def _fail_protocol(self) -> NoReturn:
        err = self._kill()
        raise self._error(CommandResult(1, bytes(self._buf[:2000]), err or b"garbled answer"))

    def _refuse(self, why: str) -> NoReturn:
        """Past a bound: the process is killed, what it sent dropped, and the answer refused in one line."""
        self._kill()
        self._buf = bytearray()
        raise AnswerRefused(self.python, why)

    def realpath(self, path: str, timeout: float | None = 30) -> str | None:
        """``os.path.realpath(path)`` as the host sees it, asked of this (already started) process."""
        if self.info is None or self.dead:
            return None
        try:
            return self.call({"__realpath__": path}, timeout)
        except RemoteScriptError:
            return None

    def close(self, abandon: bool = False) -> None:
        """Let the process go (idempotent): its stdin closed, so it ends after its last request; with ``abandon``
        (a request cut short) nothing waits for it either."""
        with self._lock:
            self.dead = True
            if self.proc is not None:
                try:
                    self.proc.abandon() if abandon else self.proc.close()
                except Exception:
                    pass


class Agents:
    """A host's agents, one per (interpreter, program); a call for an interpreter that is the same binary as a
    running agent's (same ``realpath`` of ``sys.executable`` on the host) is answered by that agent."""

    def __init__(self, host: Host):
        self.host = host
        self._agents: list[PythonAgent] = []
        self._names: dict[int, set[str]] = {}
        self._lock = threading.RLock()

    def agent(self, python: str, program: Program) -> PythonAgent:
        with self._lock:
            self._agents = [a for a in self._agents if not a.dead]
            same = [a for a in self._agents if a.program == program]
            for a in same:
                if python in self._names[id(a)] or (a.info is not None and python == a.info.get("exe")):
                    return a
            if python.startswith("/"):
                for a in same:
                    if a.info is not None and a.info.get("real") and a.realpath(python) == a.info["real"]:
                        self._names[id(a)].add(python)
                        return a
            a = PythonAgent(self.host, python, program, kept=interpreters.lookup(_host_key(self.host), python))
            self._agents.append(a)
            self._names[id(a)] = {python}
            return a

    def call(self, python: str, program: Program, payload: Any, timeout: float | None = None) -> Any:
        """``program``'s ``main(payload)`` on the agent for ``python``; raises ``RemoteScriptError``."""
        return self.agent(python, program).call(payload, timeout)

    def call_each(self, python: str, program: Program, payload: Any, follow: Callable[[Any], Any],
                  on_result: Callable[[Any], None], timeout: float | None = None) -> None:
        """``PythonAgent.call_each`` on the agent for ``python``; raises ``RemoteScriptError``."""
        self.agent(python, program).call_each(payload, follow, on_result, timeout)

    def close(self) -> None:
        with self._lock:
            agents, self._agents = self._agents, []
            self._names.clear()
        for a in agents:
            a.close()


def _host_key(host: Host) -> str | None:
    """The host's key for what the client keeps about it; None for a local target (not kept)."""
    return getattr(host, "interpreter_key", None)


def call(host: Host, python: str, op: str, /, *, timeout: float | None = 120, **payload: Any) -> Any:
    """The answer of the host-side op ``op`` (``eaglepatch.hostside.main.OPS``) to ``payload``, run by ``python`` on
    ``host``; a failure to run it becomes a one-line error (``call_error``: ``Unsupported`` when ``python`` cannot
    run there, ``HelperFailed`` otherwise).

    The calls of one command share one process on the host per interpreter (``host.agents``): the first call starts
    it and sends the program, later calls (lock, execute, unlock, the restart's stop and start, every readiness poll)
    are requests on it. A call for the interpreter that the first one turned out to be (``facts`` run with
    ``python3`` finds the server runs that very binary) goes to the same process."""
    try:
        return host.agents.call(python, bundle.program, dict(payload, op=op), timeout=timeout)
    except RemoteScriptError as exc:
        if payload.get("fault"):
            failpoint(payload["fault"])  # the host's helper died at the armed failpoint: so does the client
        raise call_error(host.name, python, exc) from None


def call_each(host: Host, python: str, op: str, /, *, follow: Callable[[Any], dict[str, Any] | None],
              on_result: Callable[[Any], None], timeout: float | None = 120, **payload: Any) -> None:
    """``call`` of ``op`` with ``payload``, then of ``op`` with each ``follow(result)`` until that is None, every
    result to ``on_result``: pipelined (``PythonAgent.call_each``), for read-only ops that answer in rounds (the
    timing logs). Errors as ``call``'s."""

    def next_payload(result: Any) -> dict[str, Any] | None:
        nxt = follow(result)
        return None if nxt is None else dict(nxt, op=op)

    try:
        host.agents.call_each(python, bundle.program, dict(payload, op=op), next_payload, on_result, timeout)
    except RemoteScriptError as exc:
        raise call_error(host.name, python, exc) from None


def call_error(name: str, interp: str, exc: RemoteScriptError) -> EaglepatchError:
    """What a failed remote call means: the interpreter could not be run (exit 4, say so), or the program failed.
    "No such file" counts only before the interpreter ran eaglepatch's code: after that it is the program's own
    error (a FileNotFoundError's traceback), or a login shell's complaint kept in the process's stderr."""
    if exc.result.rc == 127 or (not exc.started and b"No such file" in exc.result.stderr[:500]):
        return Unsupported(f"{name}: cannot run {interp}: give the interpreter with --python")
    return HelperFailed(f"{name}: {exc}")
