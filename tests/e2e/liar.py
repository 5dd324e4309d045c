"""A host-side interpreter that lies: ``--python <this script>`` on a target runs the real helper program of
eaglepatch (the agent: ``python -c AGENT``) and rewrites its answers before they reach the client, the way a
compromised host could. Any other use (the package and server identification runs ``--python`` too) runs the real
interpreter as it is.

How it lies is its first line after the shebang, written by ``tests/e2e/test_hostile_host.py`` (``LIE = ...``):

- ``("names", how, victim)``: the log files of the ``logs`` answer renamed: ``how`` "absolute" names ``victim``
  itself and asks to append there (offset 1), "dotdot" names ``../`` enough times to leave the client's cache for
  ``victim``'s folder;
- ``("preamble", n)``: ``n`` bytes of junk before the marker (a login shell that never stops talking);
- ``("frame", n)``: the first answer announced as a frame of ``n`` bytes, then junk for as long as it is read;
- ``("bomb", path)``: the first answer replaced by the zlib frame in ``path`` (a zip bomb);
- ``("facts", extra)``: ``extra`` merged into the ``facts`` answer (servers, lock, version... with control
  characters and secrets).

Standard library only; it runs with the real interpreter's own Python.
"""

import json
import os
import sys
import threading
import zlib

LIE = None  # replaced: see above
REAL = None  # replaced: the real interpreter
AGENT_HEAD = "import base64,zlib;exec(zlib.decompress(base64.b64decode("


def read_frame(f):
    line = f.readline()
    if not line:
        return None
    packed = line[:1] == b"z"
    data = f.read(int(line[1:] if packed else line))
    return zlib.decompress(data) if packed else data


def write_frame(f, data):
    if len(data) > 4096:
        data = zlib.compress(data, 1)
        f.write(b"z%d\n" % len(data) + data)
    else:
        f.write(b"%d\n" % len(data) + data)
    f.flush()


def junk(out, n):
    chunk = b"x" * (1 << 20)
    try:
        while n > 0:
            out.write(chunk[: min(n, len(chunk))])
            n -= len(chunk)
        out.flush()
    except OSError:
        os._exit(0)  # the client stopped reading: it refused


def lie_logs(answer):
    kind, how, victim = LIE
    result = answer.get("result")
    if not isinstance(result, dict):
        return answer
    for f in result.get("files") or ():
        if how == "absolute":
            f["name"], f["offset"] = victim, 1  # append to the victim (a file that does exist)
        else:
            f["name"] = "../" * 32 + os.path.relpath(victim, "/")  # up to / from any depth, then down
            f["offset"] = 0
    return answer


def main():
    args = sys.argv[1:]
    if not (len(args) >= 2 and args[-2] == "-c" and args[-1].startswith(AGENT_HEAD)):  # python [-S] -c AGENT
        os.execv(REAL, [REAL] + args)
    import subprocess

    proc = subprocess.Popen([REAL] + args, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    ops = []

    def pump():
        first = True
        while True:
            data = read_frame(sys.stdin.buffer)
            if data is None:
                proc.stdin.close()
                return
            if not first:
                ops.append(json.loads(data).get("op"))
            first = False
            write_frame(proc.stdin, data)

    threading.Thread(target=pump, daemon=True).start()
    out = sys.stdout.buffer
    marker = proc.stdout.readline()
    if LIE[0] == "preamble":
        junk(out, LIE[1])
    out.write(marker)
    out.flush()
    write_frame(out, read_frame(proc.stdout))  # the agent's pid and interpreter
    n = 0
    while True:
        data = read_frame(proc.stdout)
        if data is None:
            return
        op = ops[n] if n < len(ops) else None
        n += 1
        if LIE[0] == "frame":
            out.write(b"%d\n" % LIE[1])
            junk(out, LIE[1])
            return
        if LIE[0] == "bomb":
            with open(LIE[1], "rb") as f:
                out.write(f.read())
            out.flush()
            return
        answer = json.loads(data)
        if LIE[0] == "names" and op == "logs":
            answer = lie_logs(answer)
        elif LIE[0] == "facts" and op == "facts" and isinstance(answer.get("result"), dict):
            answer["result"].update(LIE[1])
        write_frame(out, json.dumps(answer).encode())
        for _ in range(answer.get("blobs") or 0):  # the answer's attachments (the logs' bytes), as they are
            write_frame(out, read_frame(proc.stdout))


if __name__ == "__main__":
    main()
