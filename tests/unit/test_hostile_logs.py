"""Hostile or broken timing logs (issue 41; docs/safety.md, "Hostile logs"): every value a log holds is bounded
before it costs memory or time. A record out of bounds (an ``accepts`` entry above the spec's draft tokens + 1 or
64, a list longer than ``bs`` or 4096, an integer over 10**12, a time that is no finite number from 0 to an hour)
is a skipped line like any other; a line over the cap is skipped without being held; only regular files are read
(a FIFO or a device beside the logs is skipped with a note, as is a loop of symbolic links, and the files beside it
are read); runs are grouped in linear time. Each case is read by the batch path, the line loop and the standard
library alone, with the same result. A seeded fuzz test throws a few hundred mangled records at ``report``: it
never raises, and every number it writes is finite and not negative.

Run as a script (``python tests/unit/test_hostile_logs.py``) it builds the corpus at full size (a 100 MB line, a
link to /dev/zero, 10,000 and 20,000 runs) in a temporary folder and measures ``eaglepatch report`` on each case:
the table of docs/safety.md, "Hostile logs"."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any, Callable

import pytest

from eaglepatch.report import aggregate, iter_log_files, render_table
from eaglepatch.report import batch as batch_mod
from eaglepatch.report import record as record_mod
from eaglepatch.report import scan as scan_mod

T0 = 1764500000.0
RUN = "gpu1-42-100-0000abcd"


def rec(t: float, **kw: Any) -> dict[str, Any]:
    """A valid decode record at ``t`` (2 requests, draft tokens 4), with ``kw`` over its fields."""
    r = {"v": 1, "t": round(t, 6), "host": "gpu1", "pid": 42, "rank": 0, "run": RUN, "worker": "EAGLEWorker",
         "mode": "decode", "bs": 2, "cycle_ms": 10.5, "timer": "sync",
         "phases": {"draft": 3.25, "verify": 6.25, "draft_extend": 1.0}, "accepted": 5, "accepts": [3, 2],
         "spec": {"steps": 3, "topk": 1, "draft_tokens": 4}}
    r.update(kw)
    return r


def valid(n: int, t0: float = T0) -> list[str]:
    return [json.dumps(rec(t0 + i * 0.012)) for i in range(n)]


def write(path: Path, lines: list[str]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(ln + "\n" for ln in lines))
    return str(path)


def spoiled(**kw: Any) -> str:
    return json.dumps({**rec(T0 + 1.0), **kw})


# One record out of bounds each (the cases first), as the line a host could serve.
BAD = {
    "accepts entry 1e7": spoiled(accepts=[1, 10 ** 7]),
    "accepts entry 1e8": spoiled(accepts=[1, 10 ** 8]),
    "accepts entry over draft tokens + 1": spoiled(accepts=[1, 6]),
    "accepts entry over 64 (no spec)": spoiled(accepts=[1, 65], spec=None),
    "accepts longer than bs": spoiled(accepts=[1, 1, 1]),
    "accepts longer than 4096": spoiled(accepts=[1] * 4097, bs=None),
    "accept_hist key 1e7": json.dumps({k: v for k, v in rec(T0 + 1.0, accept_hist={"10000000": 1}).items()
                                       if k != "accepts"}),
    "accept_hist over bs": json.dumps({k: v for k, v in rec(T0 + 1.0, accept_hist={"2": 3}).items()
                                       if k != "accepts"}),
    "400-digit accepted": spoiled(accepted=int("9" * 400)),
    "400-digit bs": spoiled(bs=int("9" * 400)),
    "400-digit pid": spoiled(pid=int("9" * 400)),
    "accepted over 10**12": spoiled(accepted=10 ** 12 + 1),
    "cycle 1e308": spoiled(cycle_ms=1e308),
    "cycle 1e400": spoiled(cycle_ms=12345.5).replace("12345.5", "1e400"),
    "cycle NaN": spoiled(cycle_ms=12345.5).replace("12345.5", "NaN"),
    "negative cycle": spoiled(cycle_ms=-5.0),
    "negative phase": spoiled(phases={"draft": -3.0, "verify": 6.0}),
    "phase over an hour": spoiled(phases={"draft": 3600000.5, "verify": 6.0}),
    "host cycle 1e308": spoiled(host_cycle_ms=1e308, timer="events"),
    "t 1e308": spoiled(t=1e308),
    "negative t": spoiled(t=-1.0),
}

PARSERS = ["batches", "line loop", "json"]


def read(files: list[str], parser: str, monkeypatch: pytest.MonkeyPatch, **kw: Any) -> Any:
    """``aggregate(files)`` read in batches, by the line loop (msgspec), or by the standard library alone."""
    with monkeypatch.context() as m:
        if parser == "line loop":
            m.setattr(scan_mod, "Batches", lambda st: None)
        elif parser == "json":
            m.setenv("EAGLEPATCH_JSON_PARSER", "json")
        return aggregate(files, **kw)


def numbers(doc: Any, path: str = "") -> list[tuple[str, Any]]:
    """Every number of a report's JSON with where it is, but the hosts' own flags (not the report's numbers)."""
    if isinstance(doc, bool):
        return []
    if isinstance(doc, (int, float)):
        return [(path, doc)]
    if isinstance(doc, dict):
        return [x for k, v in doc.items() if k != "flags" for x in numbers(v, f"{path}.{k}")]
    if isinstance(doc, (list, tuple)):
        return [x for i, v in enumerate(doc) for x in numbers(v, f"{path}[{i}]")]
    return []


def assert_sane(doc: Any) -> None:
    bad = [(p, v) for p, v in numbers(doc) if not (math.isfinite(v) and v >= 0)]
    assert bad == []


@pytest.mark.parametrize("parser", PARSERS)
@pytest.mark.parametrize("case", sorted(BAD))
def test_a_record_out_of_bounds_is_a_skipped_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str,
                                                  parser: str) -> None:
    f = write(tmp_path / "a.jsonl", valid(30) + [BAD[case]] + valid(30, T0 + 2.0))
    got = read([f], parser, monkeypatch, by="bs")
    want = read([write(tmp_path / "b.jsonl", valid(30) + valid(30, T0 + 2.0))], parser, monkeypatch, by="bs")
    assert (got.records, got.skipped_lines) == (60, 1)
    assert [g.to_json() for g in got.groups] == [g.to_json() for g in want.groups]
    (g,) = got.groups
    assert g.acceptance is not None and max(t for t, _n in g.acceptance.hist) == 3
    assert_sane(got.to_json())


@pytest.mark.parametrize("parser", PARSERS)
def test_a_skipped_cycle_out_of_bounds_is_a_skipped_line_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              parser: str) -> None:
    """--skip drops a process's first cycles: one out of bounds among them is no cycle, and is counted."""
    f = write(tmp_path / "a.jsonl", [BAD["accepts entry 1e7"], BAD["phase over an hour"]] + valid(30))
    got = read([f], parser, monkeypatch, skip=5)
    assert (got.records, got.skipped_lines, got.groups[0].n) == (30, 2, 25)


def test_values_at_the_bounds_are_taken(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lines = [json.dumps(rec(T0 + i * 0.012, cycle_ms=3600000, phases={"draft": 0, "verify": 3.6e6},
                            accepts=[5, 0], accepted=10 ** 12, bs=2)) for i in range(20)]
    for parser in PARSERS:
        got = read([write(tmp_path / "a.jsonl", lines)], parser, monkeypatch)
        assert (got.records, got.skipped_lines) == (20, 0), parser


def test_a_rate_too_large_for_a_float_is_null(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each value in bounds, their quotient need not be: 10**12 tokens over cycles of a denormal number of ms."""
    lines = [json.dumps(rec(T0 + i * 0.012, cycle_ms=5e-324, accepted=10 ** 12, bs=5e-324, accepts=[],
                            phases={"draft": 5e-324})) for i in range(120)]
    for parser in PARSERS:
        got = read([write(tmp_path / "a.jsonl", lines)], parser, monkeypatch)
        (g,) = got.groups
        assert (got.records, g.tokens_per_s, g.accept_len) == (120, None, None), parser
        assert_sane(got.to_json())


@pytest.mark.parametrize("parser", PARSERS + ["small pieces"])
def test_a_line_over_the_cap_is_skipped_and_the_records_after_it_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                      parser: str) -> None:
    """The cap made 4096 bytes: a line of exactly 4096 bytes (a record padded with blanks) is read, one of 4097 is
    skipped, so is a line of 100,000 and the file's last line, over the cap and without a newline."""
    monkeypatch.setattr(record_mod, "LINE_CAP", 4096)
    pad = json.dumps(rec(T0 + 1.0))
    exact = pad + " " * (4096 - len(pad))
    lines = valid(20) + [exact, exact + " ", '{"v": 1, "pad": "' + "x" * 100_000 + '"}'] + valid(20, T0 + 2.0)
    f = tmp_path / "a.jsonl"
    f.write_text("\n".join(lines) + "\n" + json.dumps(rec(T0 + 9.0, pad="y" * 5000)))
    if parser == "small pieces":
        monkeypatch.setattr(batch_mod, "PIECE", 300)
        parser = "batches"
    got = read([str(f)], parser, monkeypatch)
    assert (got.records, got.skipped_lines) == (41, 3)


@pytest.mark.parametrize("parser", PARSERS)
def test_the_reader_never_holds_a_line_over_the_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    parser: str) -> None:
    """A line of 8 MiB, the cap made 64 KiB: the report's Python memory never grows by a fraction of that line (the
    reader held it whole before its cap: 8 MiB and more)."""
    monkeypatch.setattr(record_mod, "LINE_CAP", 64 << 10)
    f = tmp_path / "a.jsonl"
    with f.open("w") as out:
        out.write("\n".join(valid(50)) + '\n{"v": 1, "pad": "')
        for _ in range(128):
            out.write("x" * (64 << 10))
        out.write('"}\n' + "\n".join(valid(50, T0 + 2.0)) + "\n")
    read([str(f)], parser, monkeypatch)  # imports and decoders made before the count starts
    tracemalloc.start()
    try:
        got = read([str(f)], parser, monkeypatch)
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (got.records, got.skipped_lines) == (100, 1)
    assert peak < 1 << 20, peak


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``eaglepatch report ARGS`` in a child: a hang fails the test (TimeoutExpired) rather than blocking it."""
    return subprocess.run([sys.executable, "-m", "eaglepatch", "report", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_a_fifo_and_a_device_beside_the_logs_are_skipped_with_a_note(tmp_path: Path) -> None:
    """A FIFO named like a log hung the report for good (nobody writes to it); a link to /dev/zero grew until the
    memory ran out. Both are named in a note and left; the log beside them is read. ``aggregate`` given them itself
    (a file put in a listed one's place) skips them too, with the same notes."""
    logs = tmp_path / "logs"
    write(logs / "a.jsonl", valid(40))
    os.mkfifo(logs / "b.jsonl")
    os.symlink("/dev/zero", logs / "c.jsonl")
    r = cli(str(logs), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["records"] == 40
    assert f"note: skipped {logs / 'b.jsonl'}: a FIFO (named pipe), not a log file to read" in r.stderr
    assert f"note: skipped {logs / 'c.jsonl'}: a character device, not a log file to read" in r.stderr
    code = ("import json, sys; from eaglepatch.report import aggregate; r = aggregate(sys.argv[1:]); "
            "print(json.dumps([r.records, list(r.unread)]))")
    paths = [str(logs / n) for n in ("b.jsonl", "a.jsonl", "c.jsonl")]
    r = subprocess.run([sys.executable, "-c", code, *paths], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    records, unread = json.loads(r.stdout)
    assert records == 40 and [u.split(": ")[-1] for u in unread] == [
        "a FIFO (named pipe), not a log file to read", "a character device, not a log file to read"]


def test_a_loop_of_links_beside_valid_files_is_skipped_with_a_note(tmp_path: Path) -> None:
    """A link to itself, two links to each other and a link to nothing stopped the whole report ("cannot read");
    now each is named in a note, and the valid files beside them are read."""
    logs = tmp_path / "logs"
    write(logs / "a.jsonl", valid(40))
    write(logs / "sub" / "d.jsonl", valid(10, T0 + 5.0))
    os.symlink("self.jsonl", logs / "self.jsonl")
    os.symlink("y.jsonl", logs / "x.jsonl")
    os.symlink("x.jsonl", logs / "y.jsonl")
    os.symlink("gone.jsonl", logs / "z.jsonl")
    os.symlink(".", logs / "sub" / "again")  # a loop of folders: os.walk does not follow it
    notes: list[str] = []
    files = iter_log_files([str(logs)], notes)
    assert files == [str(logs / "a.jsonl"), str(logs / "sub" / "d.jsonl")]
    assert [n.rsplit("/", 1)[-1] for n in notes] == [
        "self.jsonl: a loop of symbolic links, not a log file to read",
        "x.jsonl: a loop of symbolic links, not a log file to read",
        "y.jsonl: a loop of symbolic links, not a log file to read",
        "z.jsonl: No such file or directory, not a log file to read"]
    got = aggregate([str(logs / "self.jsonl"), *files])
    assert got.records == 50 and len(got.unread) == 1 and "a loop of symbolic links" in got.unread[0]
    assert got.unread[0] in render_table(got)
    r = cli(str(logs), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["records"] == 50 and r.stderr.count("a loop of symbolic links") == 3


def runs_log(path: Path, n: int) -> str:
    """``n`` runs in one file: each a header line and two records of its own process."""
    lines = []
    for i in range(n):
        rid, t = f"gpu1-{1000 + i}-{100 + i}-{i:08x}", T0 + i
        lines.append(json.dumps({"v": 1, "kind": "run", "run": rid, "t": t, "timer": "sync", "flags": {"x": 1}}))
        lines += [json.dumps(rec(t + k * 0.012, run=rid, pid=1000 + i)) for k in range(2)]
    return write(path, lines)


def opcodes(fn: Callable[[], Any]) -> int:
    """The bytecode instructions that ``fn()`` runs in eaglepatch's report package (its comprehensions too): the
    work of the grouping and rendering, counted (never timed)."""
    import eaglepatch.report as pkg

    where = os.path.dirname(pkg.__file__)
    count = 0

    def local(frame: Any, event: str, _arg: Any) -> Any:
        nonlocal count
        if event == "opcode":
            count += 1
        return local

    def tracer(frame: Any, event: str, _arg: Any) -> Any:
        if event == "call" and frame.f_code.co_filename.startswith(where):
            frame.f_trace_opcodes = True
            return local
        return None

    sys.settrace(tracer)
    try:
        fn()
    finally:
        sys.settrace(None)
    return count


def test_runs_are_grouped_and_shown_in_linear_work(tmp_path: Path) -> None:
    """20,000 runs took 6 times as long as 10,000 (each run's groups were looked for among all the groups, in the
    table and in --compare's columns). The work of aggregating, rendering and comparing twice the runs is about twice
    as much, not four times."""
    from eaglepatch.report import compare

    work = []
    for n in (150, 300):
        f = runs_log(tmp_path / f"runs{n}.jsonl", n)
        res = aggregate([f])
        assert len(res.runs) == n and len(res.groups) == n
        work.append(opcodes(lambda: (render_table(aggregate([f])), compare([res, res], ["a", "b"]))))
    assert work[1] < 2.3 * work[0], work


# ---------------------------------------------------------------------------------------------------------------
# The fuzz test: a fixed seed, a few hundred records mangled every way a host could.

def hostile_value(rng: random.Random) -> Any:
    """A JSON value of a random kind, often extreme; a str starting with RAW is written into the line as it is."""
    kind = rng.randrange(14)
    if kind == 0:
        return rng.choice([1, -1]) * 10 ** rng.randrange(12, 420)
    if kind == 1:
        return rng.choice([1e308, -1e308, 5e-324, -0.0, 1e-300, 3.6e6 + 1, 1.7976931348623157e308])
    if kind == 2:
        return RAW + rng.choice(["NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1" * 5000, "0.0e99999"])
    if kind == 3:
        return rng.choice(["", "x" * rng.randrange(1, 3000), "\u202e\x1b[31m", "\ud800", "1"])
    if kind == 4:
        return rng.choice([True, False, None])
    if kind == 5:
        return RAW + "[" * rng.choice([10, 600, 3000]) + "]" * rng.choice([0, 10, 600, 3000])
    if kind == 6:
        return [rng.randrange(-3, 10 ** rng.randrange(1, 9)) for _ in range(rng.choice([0, 1, 3, 300, 5000]))]
    if kind == 7:
        return {rng.choice(["1", "2", "draft", "9" * 50, "x", "\u00b2", "-1"]): hostile_value(rng)
                for _ in range(rng.randrange(4))}
    if kind == 8:
        return rng.uniform(-1e6, 1e6)
    if kind == 9:
        return rng.randrange(-5, 70)
    return rng.choice([rng.uniform(0, 20), rng.randrange(0, 9), rng.random() * 1e-6])


RAW = "\0raw:"
FIELDS = ["v", "t", "host", "pid", "rank", "run", "mode", "bs", "cycle_ms", "timer", "phases", "accepted", "accepts",
          "accept_hist", "spec", "host_phases", "host_cycle_ms", "kind", "flags"]


def mangled(rng: random.Random, t: float) -> str:
    """A record, or a run header, with a few fields set to hostile values (or a whole line of garbage)."""
    roll = rng.random()
    if roll < 0.05:
        return rng.choice(["", "\r", "not json", "{", '{"v": 1}' * 3, "\x00\xff", "}" * 100, "[" * 100000])
    if roll < 0.12:
        r: dict[str, Any] = {"v": 1, "kind": "run", "run": rng.choice([RUN, "r2", ""]), "t": t, "timer": "sync",
                             "flags": {"speculative_num_steps": 3}}
    else:
        r = rec(t, run=rng.choice([RUN, "r2", None]), bs=rng.choice([1, 2, 3, None]), pid=rng.choice([42, 43]),
                timer=rng.choice(["sync", "events"]), mode=rng.choice(["decode", "prefill"]))
        if rng.random() < 0.3:
            r["host_cycle_ms"], r["host_phases"] = 9.5, {"draft": 3.0, "verify": 5.0}
    raws = {}
    for _ in range(rng.choice([0, 1, 1, 2, 3])):
        field = rng.choice(FIELDS)
        value = hostile_value(rng)
        if rng.random() < 0.3 and isinstance(r.get(field), dict) and r[field]:
            r[field] = dict(r[field], **{rng.choice(list(r[field])): value})  # a value inside phases, spec, ...
        elif isinstance(value, str) and value.startswith(RAW):
            raws[f"@raw{len(raws)}@"] = value[len(RAW):]
            r[field] = f"@raw{len(raws) - 1}@"
        else:
            r[field] = value
    line = json.dumps(r, ensure_ascii=rng.random() < 0.5)
    for key, text in raws.items():
        line = line.replace(f'"{key}"', text)
    return line


def test_fuzz_report_never_raises_and_every_number_is_finite_and_not_negative(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from eaglepatch.report.predict import predict
    from eaglepatch.report.predict_bs import for_runs

    rng = random.Random(41)
    for k in range(3):
        lines, t = [], T0
        for i in range(300):
            t += rng.choice([0.012, 0.012, 0.0, -0.5, 2.0])
            lines.append(json.dumps(rec(t)) if i % 3 == 0 else mangled(rng, t))
        f = tmp_path / f"fuzz{k}.jsonl"
        f.write_bytes("\n".join(lines).encode("utf-8", "surrogatepass"))
        for kw in ({}, {"by": "bs"}, {"skip": 3, "by": "rank"}, {"merge_runs": True}):
            seen = {}
            for parser in PARSERS:
                res = read([str(f)], parser, monkeypatch, **kw)
                seen[parser] = repr(res)
                doc = res.to_json()
                assert_sane(doc)
                assert res.records + res.skipped_lines <= len(lines)
                preds = predict(res)
                text = render_table(res, predictions=preds, by_bs=for_runs(read([str(f)], parser, monkeypatch,
                                                                                by="bs")))
                assert "nan" not in text.lower().split() and "inf" not in text.lower().split()
                for p in preds:
                    if p is not None:
                        assert all(math.isfinite(v) for _k, v in numbers(p.to_json())), p.to_json()
            assert seen["batches"] == seen["line loop"] == seen["json"], kw


# ---------------------------------------------------------------------------------------------------------------
# The corpus at full size, measured through the CLI: docs/safety.md's table.

def corpus(folder: Path) -> dict[str, tuple[str, ...]]:
    """The issue's cases at full size in ``folder``: case name -> ``eaglepatch report`` arguments."""
    cases: dict[str, tuple[str, ...]] = {}

    def case(name: str, lines: list[str]) -> None:
        write(folder / name / "a.jsonl", lines)
        cases[name] = (str(folder / name),)

    for name in ("accepts entry 1e7", "accepts entry 1e8", "400-digit accepted", "cycle 1e308", "cycle 1e400",
                 "negative cycle", "t 1e308"):
        case(name, valid(1000) + [BAD[name]] + valid(1000, T0 + 20.0))
    long = folder / "100 MB line" / "a.jsonl"
    long.parent.mkdir(parents=True)
    with long.open("w") as out:
        out.write("\n".join(valid(1000)) + '\n{"v": 1, "pad": "')
        for _ in range(100):
            out.write("x" * (1 << 20))
        out.write('"}\n' + "\n".join(valid(1000, T0 + 20.0)) + "\n")
    cases["100 MB line"] = (str(long.parent),)
    for name, make in (("FIFO", lambda p: os.mkfifo(p)), ("link to /dev/zero", lambda p: os.symlink("/dev/zero", p)),
                       ("symlink loop", lambda p: os.symlink(p.name, p))):
        case(name, valid(2000))
        make(folder / name / "b.jsonl")
    for n in (10_000, 20_000):
        cases[f"{n:,} runs"] = (runs_log(folder / f"{n} runs" / "a.jsonl", n),)
    return cases


def measure(args: tuple[str, ...], timeout: float) -> tuple[float, float, int, str]:
    """(seconds, peak resident MB, exit status, what it said) of ``eaglepatch report ARGS`` in a child (killed after
    ``timeout`` seconds): its notes and errors (stderr, and the table's ``note:`` lines), and with ``--json`` its
    records and skipped lines."""
    import tempfile
    import time

    # The peak is the child's VmHWM (its own image: ru_maxrss would keep this process's size, forked), written by
    # the child as it exits, and sampled meanwhile (for a child killed at the timeout).
    child = ("import atexit, sys\n"
             "def hwm():\n"
             "    with open('/proc/self/status') as f, open(sys.argv[1], 'w') as out:\n"
             "        out.write(next(ln for ln in f if ln.startswith('VmHWM:')).split()[1])\n"
             "atexit.register(hwm)\n"
             "sys.argv = ['eaglepatch', 'report', *sys.argv[2:]]\n"
             "from eaglepatch.entry import main\n"
             "main()\n")
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err, \
            tempfile.NamedTemporaryFile("r") as peak:
        start = time.monotonic()
        p = subprocess.Popen([sys.executable, "-c", child, peak.name, *args], stdout=out, stderr=err)
        kb = 0
        while p.poll() is None:
            try:
                with open(f"/proc/{p.pid}/status") as f:
                    kb = max(kb, int(next(ln for ln in f if ln.startswith("VmHWM:")).split()[1]))
            except (OSError, StopIteration, ValueError):
                pass
            if time.monotonic() - start > timeout:
                p.kill()
                p.wait()
                break
            time.sleep(0.02)
        secs = time.monotonic() - start
        kb = max([kb] + [int(x) for x in peak.read().split()])
        out.seek(0)
        err.seek(0)
        said = [ln.strip() for ln in err.read().splitlines() if ln.strip()]
        text = out.read()
    if p.returncode == -9:
        said.append(f"killed after {timeout:.0f} s")
    elif "--json" in args:
        try:
            doc = json.loads(text)
            said.append(f"records {doc['records']}, skipped_lines {doc['skipped_lines']}")
        except ValueError:
            pass
    else:
        said += [ln for ln in text.splitlines() if ln.startswith("note:") and "lines did not parse" in ln]
    return secs, kb / 1024, p.returncode, "; ".join(said)


if __name__ == "__main__":  # the table of docs/safety.md, "Hostile logs"; argument: the timeout (s, default 300)
    import tempfile

    limit = float(sys.argv[1]) if len(sys.argv) > 1 else 300.0
    options: dict[str, tuple[tuple[str, ...], ...]] = {"20,000 runs": ((), ("--json",))}  # --predict: see the doc
    # cases that took all the memory before: a shorter leash, so that measuring an old tree is safe
    greedy = {"accepts entry 1e8": 20.0, "link to /dev/zero": 20.0}
    with tempfile.TemporaryDirectory() as tmp:
        print("| case | options | time | peak memory | exit | message |")
        print("|---|---|---|---|---|---|")
        for name, args in corpus(Path(tmp)).items():
            for extra in options.get(name, ((), ("--json",), ("--json", "--predict"))):
                secs, mb, rc, msg = measure(args + extra, timeout=min(limit, greedy.get(name, limit)))
                print(f"| {name} | {' '.join(extra) or '(table)'} | {secs:.2f} s | {mb:.0f} MB | {rc} | "
                      f"{msg.replace(tmp, '…').replace('|', '/')} |", flush=True)
