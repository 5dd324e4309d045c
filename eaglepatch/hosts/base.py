"""The one narrow interface to the outside world: run a command, read, write, stat, rename, remove.

Two implementations: ``LocalHost`` (this machine's filesystem and processes) and ``SSHHost`` (``hosts.ssh``, on
paramiko; ``hosts.ssh_config`` says where and how to connect). Everything above this layer (discovery, plans, restart, report fetching)
talks to a ``Host`` and never knows which one it has, so a local target runs the same code path as a remote one.

Batched work: steps that must happen on the host in one round trip are small Python programs shipped on stdin to
the host's interpreter: ``run_python`` (one process per call) or an ``Agents`` pool (``host.agents``: one process
per interpreter for the whole connection, each call one request on it).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import threading
import time
import zlib
from typing import Any, NoReturn, Protocol, Sequence, runtime_checkable

from eaglepatch import progress


@dataclasses.dataclass(frozen=True)
class CommandResult:
    """What a command returned: exit status and raw output bytes."""

    rc: int
    stdout: bytes
    stderr: bytes

    @property
    def ok(self) -> bool:
        return self.rc == 0


@dataclasses.dataclass(frozen=True)
class FileStat:
    """The parts of ``stat`` that eaglepatch keeps when it replaces a file."""

    mode: int  # full st_mode
    uid: int
    gid: int
    size: int
    mtime: float


@runtime_checkable
class Host(Protocol):
    """A machine eaglepatch acts on. Paths are absolute POSIX paths on that machine.

    Every method raises ``eaglepatch.errors.ConnectionFailed`` when the connection breaks, and ``OSError``
    (``FileNotFoundError``, ``PermissionError``...) for filesystem failures on the host.
    """

    name: str  # how messages name it: "root@gpu1", "local"
    is_local: bool

    def run(
        self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float | None = None,
        max_output: int | None = None,
    ) -> CommandResult:
        """Run ``argv`` (no shell; quoting is the implementation's job) and return its result; never raises on rc != 0.
        ``max_output``: the most bytes of stdout and stderr together to take in; past it the command is killed and
        ``OutputLimit`` raised (what a host sends is bounded: docs/safety.md)."""
        ...

    def read_bytes(self, path: str) -> bytes:
        """Return the file's bytes; raises FileNotFoundError."""
        ...

    def write_bytes(self, path: str, data: bytes, mode: int | None = None) -> None:
        """Create or truncate ``path`` with ``data``; ``mode`` (permission bits) when given."""
        ...

    def stat(self, path: str) -> FileStat | None:
        """Return the file's stat, or None when it does not exist."""
        ...

    def rename(self, src: str, dst: str) -> None:
        """Atomically replace ``dst`` with ``src`` (POSIX rename within one filesystem)."""
        ...

    def remove(self, path: str) -> None:
        """Remove a file; no error when it is already gone."""
        ...

    def listdir(self, path: str) -> list[str]:
        """Names in a directory; raises FileNotFoundError."""
        ...

    def spawn(self, argv: Sequence[str]) -> "HostProcess":
        """Start ``argv`` (as ``run`` would) with pipes to talk to it while it runs; raises FileNotFoundError
        when the program does not exist here (on SSH that shows later, as exit status 127)."""
        ...

    def close(self) -> None:
        """Release the connection; idempotent."""
        ...


# Written by eaglepatch's programs on the host before anything else: the bytes a login shell prints on stdout
# before the interpreter starts (a banner in ~/.bashrc, a ForceCommand's echo) come before it and are skipped.
MARKER = b"\x1eeaglepatch\x1e\n"

# What a host's helper may send, at most (everything a host sends is data from a stranger: docs/safety.md, "Trust
# boundaries"). The largest real answers are the facts of an install (every worker file, base64: a few MB) and a
# batch of timing logs (``ops/_remote.py``'s LOG_BATCH, 4 MB before base64); these leave room for both.
MAX_PREAMBLE = 1 << 20  # what a login shell prints before the marker
MAX_FRAME = 64 << 20  # one frame of the agent protocol on the wire, compressed or not
MAX_ANSWER = 64 << 20  # one answer, decompressed
MAX_STDERR = 64 << 10  # the tail of a helper's stderr that is kept (for messages)
_MAX_HEADER = 24  # b"z67108864\n" and the like


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.0f} MiB" if n >= 1 << 20 else f"{n} bytes"


class OutputLimit(Exception):
    """A command printed more than the ``max_output`` it was given; it was killed."""

    def __init__(self, limit: int):
        super().__init__(f"more than {_mib(limit)} of output")
        self.limit = limit


def inflate(data: bytes, limit: int = MAX_ANSWER) -> bytes:
    """``zlib.decompress(data)``, never more than ``limit`` bytes of it (a zip bomb is refused, not inflated);
    raises ``ValueError`` saying which bound was passed, ``zlib.error`` for bytes that are not zlib's."""
    d = zlib.decompressobj()
    out = d.decompress(data, limit + 1)
    if len(out) > limit or d.unconsumed_tail:
        raise ValueError(f"a frame that inflates to more than {_mib(limit)} ({len(data)} bytes compressed)")
    if not d.eof:
        raise zlib.error("truncated zlib stream")
    return out


def run_python(host: Host, python: str, program: str, payload: Any = None, timeout: float | None = None) -> Any:
    """Run ``program`` (Python source) with ``python`` on ``host``, payload as JSON on stdin; return its JSON stdout.

    The program reads ``json.load(sys.stdin)`` and prints exactly one JSON document. Raises ``RemoteScriptError``
    when it exits non-zero or prints something that is not JSON.
    """
    # The program text travels as the first line of stdin's JSON, so no quoting of source code on a command line.
    # The marker first: what a login shell prints before the interpreter starts is skipped, not parsed.
    wrapper = (
        "import json,sys;sys.stdout.write('\\x1eeaglepatch\\x1e\\n');sys.stdout.flush();"
        "_d=json.loads(sys.stdin.read());"
        "sys.argv=['eaglepatch-remote'];_g={'__name__':'__main__','PAYLOAD':_d['payload']};"
        "exec(compile(_d['program'],'<eaglepatch-remote>','exec'),_g)"
    )
    data = json.dumps({"program": program, "payload": payload}).encode()
    try:
        result = host.run([python, "-c", wrapper], stdin=data, timeout=timeout,
                          max_output=MAX_PREAMBLE + MAX_ANSWER + MAX_STDERR)
    except OutputLimit as exc:
        raise AnswerRefused(python, f"it printed {exc} (eaglepatch takes at most {_mib(MAX_ANSWER)})") from None
    except BaseException:
        progress.cut_short(host.name)  # Ctrl-C mid-request: the host may still be at it; ask it nothing more
        raise
    out = result.stdout
    at = out.find(MARKER)
    if at > MAX_PREAMBLE:
        raise AnswerRefused(python, f"{at} bytes came before its marker (at most {_mib(MAX_PREAMBLE)})")
    if result.rc != 0:
        raise RemoteScriptError(python, result, started=at >= 0)
    try:
        return json.loads((out[at + len(MARKER):] if at >= 0 else out).decode("utf-8", "replace"))
    except ValueError as exc:
        raise RemoteScriptError(python, result, started=at >= 0) from exc


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


# ----------------------------------------------------------------------------------------------------------------
# One long-lived interpreter per host: the program is sent and compiled once, every later call is a request on
# the same process (no new SSH channel, no second login shell, no second interpreter start).


class HostProcess(Protocol):
    """A process started by ``Host.spawn``: bytes to its stdin, bytes from its stdout; its stderr is kept."""

    def send(self, data: bytes, deadline: float | None) -> bool:
        """Write ``data`` to its stdin; False when it is gone or the deadline passed (what it said is read next)."""
        ...

    def read(self, deadline: float | None) -> bytes | None:
        """Some bytes of its stdout; ``b""`` at end of file; None when the deadline passed first."""
        ...

    def wait(self, deadline: float | None) -> tuple[int, bytes]:
        """Its exit status (124 when the deadline passed first) and all it wrote on stderr."""
        ...

    def kill(self, pid: int | None) -> None:
        """Kill it (``pid``: its process id on the host, when known); ``wait`` and ``close`` follow."""
        ...

    def close(self) -> None:
        """Close its stdin (it ends by itself then) and let go of it; idempotent."""
        ...

    def abandon(self) -> None:
        """Let go of it at once, never waiting or killing: it finishes what it was asked on its own."""
        ...


# The agent's own code: python -c AGENT. It reads length-prefixed frames on stdin (the program first, then one
# JSON request per frame) and answers each request with one length-prefixed JSON frame on what was its stdout.
# A frame is "<length>\n<bytes>", or "z<length>\n<zlib bytes>" when it is worth compressing (the worker files
# travel base64-encoded inside JSON: a third of the bytes on the wire, which paramiko moves at some 8 MB/s).
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
def w(d):
    d=json.dumps(d).encode();z=len(d)>4096
    if z:d=zlib.compress(d,1)
    o.write((b'z%d\n' if z else b'%d\n')%len(d)+d);o.flush()
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
        w({'result':g['main'](d)})
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


_COMPRESS_OVER = 4096


def _frame(data: bytes) -> bytes:
    if len(data) > _COMPRESS_OVER:
        data = zlib.compress(data, 1)
        return b"z%d\n" % len(data) + data
    return b"%d\n" % len(data) + data


class PythonAgent:
    """``program`` running in one ``python`` process on ``host`` (``python -c AGENT``), answering ``call``s.

    Failures read as ``run_python``'s do: ``RemoteScriptError`` with the exit status of a process that died (127
    when the interpreter does not exist), 124 after a timeout (the process is killed), 1 with the traceback when
    the program raised. After a failure that ended the process, ``dead`` is True and the agent is not used again.
    """

    def __init__(self, host: Host, python: str, program: str):
        self.host, self.python, self.program = host, python, program
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
        if self.dead:
            raise RuntimeError("this agent's process has ended")
        deadline = None if timeout is None else time.monotonic() + timeout
        out = b""
        if self.proc is None:
            try:
                self.proc = self.host.spawn([self.python, "-c", AGENT])
            except FileNotFoundError as exc:
                self.dead = True
                raise RemoteScriptError(self.python, CommandResult(127, b"", str(exc).encode())) from None
            out = _frame(self.program.encode("utf-8"))
        out += _frame(json.dumps(payload).encode())
        if not self.proc.send(out, deadline) and deadline is not None and time.monotonic() >= deadline:
            self._fail_timeout()
        if self.info is None:
            self._skip_to_marker(deadline)
            self.info = self._read_frame(deadline)
        answer = self._read_frame(deadline)
        if "result" in answer:
            return answer["result"]
        if "error" in answer:
            raise self._error(CommandResult(1, b"", str(answer["error"]).encode()))
        # SystemExit: the process ends, as a one-shot run would have
        rc, err = self.proc.wait(deadline)
        self.dead = True
        self.proc.close()
        raise self._error(CommandResult(int(answer.get("exit", rc) or 0), b"", err))

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
                self._refuse(f"more than {_mib(MAX_PREAMBLE)} came before its marker")
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
        assert self.proc is not None
        while True:
            nl = self._buf.find(b"\n", 0, _MAX_HEADER)
            if nl < 0 and len(self._buf) >= _MAX_HEADER:
                self._refuse(f"a frame header longer than {_MAX_HEADER} bytes ({bytes(self._buf[:_MAX_HEADER])!r})")
            if nl >= 0:
                packed = self._buf[:1] == b"z"
                head = bytes(self._buf[1 if packed else 0 : nl])
                if not head.isdigit():  # int() would take "+5", " 5", "5_0"
                    self._refuse(f"a frame header that is no length ({bytes(self._buf[:nl])!r})")
                size = int(head)
                if size > MAX_FRAME:
                    # refused before its bytes are read: the length alone is the host's word
                    self._refuse(f"a frame of {size} bytes (at most {_mib(MAX_FRAME)})")
                if len(self._buf) >= nl + 1 + size:
                    data = bytes(self._buf[nl + 1 : nl + 1 + size])
                    del self._buf[: nl + 1 + size]
                    try:
                        if packed:
                            data = inflate(data)
                        elif size > MAX_ANSWER:
                            raise ValueError(f"an answer of {size} bytes (at most {_mib(MAX_ANSWER)})")
                        doc = json.loads(data.decode("utf-8", "replace"))
                    except ValueError as exc:  # JSONDecodeError is one
                        if isinstance(exc, json.JSONDecodeError):
                            self._fail_protocol()
                        self._refuse(str(exc))
                    except (zlib.error, RecursionError):
                        self._fail_protocol()
                    if not isinstance(doc, dict):
                        self._fail_protocol()
                    return doc
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

    def agent(self, python: str, program: str) -> PythonAgent:
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
            a = PythonAgent(self.host, python, program)
            self._agents.append(a)
            self._names[id(a)] = {python}
            return a

    def call(self, python: str, program: str, payload: Any, timeout: float | None = None) -> Any:
        return self.agent(python, program).call(payload, timeout)

    def close(self) -> None:
        with self._lock:
            agents, self._agents = self._agents, []
            self._names.clear()
        for a in agents:
            a.close()
