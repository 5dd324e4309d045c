"""``ops.follow``: ``aggregate`` of timing logs while a fetch is still writing them, in a child process that reads
each file as its bytes come. Its result is ``aggregate``'s of the finished files, or there is none (and the caller
aggregates them itself): never another."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from eaglepatch.errors import UsageError
from eaglepatch.report import aggregate
from eaglepatch.ops import follow

T0 = 1764500000.0


def _line(i: int, pid: int, rank: int, run: str) -> bytes:
    doc = {"v": 1, "t": T0 + i * 0.02, "host": "gpu1", "pid": pid, "rank": rank, "worker": "EAGLEWorker",
           "mode": "decode" if i % 7 else "prefill", "bs": 1 + i % 4, "cycle_ms": 10.0 + i % 13, "timer": "sync",
           "phases": {"draft": 3.0 + i % 3, "verify": 6.0, "draft_extend": 1.0}, "accepted": i % 5, "run": run}
    return json.dumps(doc).encode() + b"\n"


def _bodies(n: int = 3000) -> dict[str, bytes]:
    """Two ranks of one launch (a header, records, a line that is not a record), and a log of an older launch."""
    out = {}
    for name, pid, rank, run in (("gpu1-10-rank0.jsonl", 10, 0, "gpu1-10-500-aaaaaaaa"),
                                 ("gpu1-10-rank1.jsonl", 10, 1, "gpu1-10-500-aaaaaaaa"),
                                 ("gpu1-9-rank0.jsonl", 9, 0, "gpu1-9-400-bbbbbbbb")):
        head = json.dumps({"v": 1, "kind": "run", "run": run, "t": T0 - 1, "host": "gpu1", "pid": pid,
                           "rank": rank, "timer": "sync", "flags": {"speculative-num-steps": "3"}}).encode() + b"\n"
        out[name] = head + b"".join(_line(i, pid, rank, run) for i in range(n)) + b"not json\n"
    return out


def _write_in_pieces(paths: list[str], bodies: list[bytes], f: follow.Follower, piece: int) -> None:
    """What a fetch does: each file appended a batch at a time (some cut inside a line), the follower told after
    each write, and once the file gets no more."""
    for path, body in zip(paths, bodies):
        with open(path, "ab") as out:
            for at in range(0, len(body), piece):
                out.write(body[at : at + piece])
                out.flush()
                f.wrote(path, min(at + piece, len(body)), False)
                time.sleep(0.001)
        f.complete(path)


@pytest.mark.parametrize("kwargs", [{}, {"by": "bs", "skip": 5}, {"latest": True},
                                    {"launches": frozenset({(10, 500)}), "run_ids": None}])
def test_files_read_while_they_are_written_give_aggregates_own_result(tmp_path: Path, kwargs: dict[str, Any]) -> None:
    bodies = _bodies()
    paths = [str(tmp_path / n) for n in sorted(bodies)]
    f = follow.Follower()
    try:
        f.start(paths, {}, kwargs)
        writer = threading.Thread(target=_write_in_pieces, args=(paths, [bodies[os.path.basename(p)] for p in paths],
                                                                 f, 100_003))
        writer.start()
        writer.join()
        got = f.result(paths, kwargs)
    finally:
        f.close()
    assert f.why is None and got is not None
    assert got == aggregate(paths, **kwargs)


def test_what_the_cache_had_is_read_at_once_and_the_trace_is_the_same(tmp_path: Path) -> None:
    """A file the cache already holds (a warm cache, the fetch brings only its new bytes): read from the start; the
    trace the child writes is the one ``aggregate`` writes."""
    bodies = _bodies(500)
    paths = [str(tmp_path / n) for n in sorted(bodies)]
    half = {p: bodies[os.path.basename(p)][: len(bodies[os.path.basename(p)]) // 2] for p in paths}
    for p in paths:
        cut = half[p].rfind(b"\n") + 1
        Path(p).write_bytes(half[p][:cut])
        half[p] = half[p][:cut]
    kwargs = {"trace_path": str(tmp_path / "trace.json")}
    f = follow.Follower()
    try:
        f.start(paths, {p: len(half[p]) for p in paths}, kwargs)
        for p in paths:
            with open(p, "ab") as out:
                out.write(bodies[os.path.basename(p)][len(half[p]) :])
            f.wrote(p, len(bodies[os.path.basename(p)]), False)
        got = f.result(paths, kwargs)
    finally:
        f.close()
    traced = (tmp_path / "trace.json").read_bytes()
    assert got == aggregate(paths, trace_path=str(tmp_path / "again.json"))
    assert traced == (tmp_path / "again.json").read_bytes()


def test_a_file_written_again_from_its_start_gives_no_result_and_ends_the_child(tmp_path: Path) -> None:
    bodies = _bodies(200)
    paths = [str(tmp_path / n) for n in sorted(bodies)]
    for p in paths:
        Path(p).write_bytes(bodies[os.path.basename(p)])
    f = follow.Follower()
    proc = f.proc
    assert proc is not None
    f.start(paths, {p: os.path.getsize(p) for p in paths}, {})
    f.wrote(paths[1], 10, True)
    assert f.result(paths, {}) is None and "written again" in str(f.why)
    assert f.proc is None and proc.poll() is not None


@pytest.mark.parametrize("change", ["files", "arguments"])
def test_other_files_or_arguments_than_the_jobs_give_no_result(tmp_path: Path, change: str) -> None:
    """The forecast of the fetch was wrong (a file came or went, or the choice of runs changed): no result."""
    bodies = _bodies(100)
    paths = [str(tmp_path / n) for n in sorted(bodies)]
    for p in paths:
        Path(p).write_bytes(bodies[os.path.basename(p)])
    f = follow.Follower()
    f.start(paths, {p: os.path.getsize(p) for p in paths}, {"latest": True})
    if change == "files":
        assert f.result(paths[:2], {"latest": True}) is None
    else:
        assert f.result(paths, {"latest": False}) is None
    assert "differ" in str(f.why) and f.proc is None


def test_an_error_of_the_aggregation_is_raised_as_aggregate_raises_it(tmp_path: Path) -> None:
    bodies = _bodies(100)
    paths = [str(tmp_path / n) for n in sorted(bodies)]
    for p in paths:
        Path(p).write_bytes(bodies[os.path.basename(p)])
    with pytest.raises(UsageError) as own:
        aggregate(paths, run_ids=["nope"])
    f = follow.Follower()
    f.start(paths, {p: os.path.getsize(p) for p in paths}, {"run_ids": ["nope"]})
    with pytest.raises(UsageError) as child:
        f.result(paths, {"run_ids": ["nope"]})
    assert str(child.value) == str(own.value)


def test_a_file_that_never_came_gives_no_result(tmp_path: Path) -> None:
    """The host listed a file whose bytes never came (no whole line yet): the child cannot read it, and says so."""
    bodies = _bodies(100)
    paths = [str(tmp_path / n) for n in sorted(bodies)]
    for p in paths[1:]:
        Path(p).write_bytes(bodies[os.path.basename(p)])
    f = follow.Follower()
    f.start(paths, {p: os.path.getsize(p) for p in paths[1:]}, {})
    assert f.result(paths, {}) is None and f.proc is None


def test_the_child_ends_when_its_parent_is_gone_before_the_fetch_is_over(tmp_path: Path) -> None:
    """Its stdin closed (the parent ended: a Ctrl-C, a lost connection) while it waits for bytes: it ends, and
    writes nothing."""
    p = tmp_path / "gpu1-10-rank0.jsonl"
    p.write_bytes(_bodies(10)["gpu1-10-rank0.jsonl"])
    f = follow.Follower()
    proc = f.proc
    assert proc is not None and proc.stdin is not None and proc.stdout is not None
    f.start([str(p)], {str(p): 0}, {})
    proc.stdin.close()
    assert proc.wait(timeout=30) == 0 and proc.stdout.read() == b""
    f.close()


def test_the_reader_waits_at_what_is_written_until_more_is_said(tmp_path: Path) -> None:
    """``_Growing`` (in this process): a read past the bytes said to be written waits for the next word, and the
    end of the file is the end only once the fetch is over; each opening's end is recorded where it was."""
    p = tmp_path / "log.jsonl"
    p.write_bytes(b"")
    r, w = os.pipe()
    os.set_blocking(r, False)
    news = follow._News(r, b"", [0])
    open_ = follow._open_for(news, [str(p)])
    got: list[str] = []

    def feed() -> None:
        for i in range(5):
            time.sleep(0.02)
            with open(p, "ab") as out:
                out.write(b"line %d\n" % i)
            os.write(w, b"0 %d\n" % p.stat().st_size)
        time.sleep(0.02)
        os.write(w, b"done\n")

    t = threading.Thread(target=feed)
    t.start()
    with open_(str(p), encoding="utf-8") as fh:
        got.extend(fh)
        assert fh.read() == ""  # asked again at the end: the same end
    t.join()
    os.close(w)
    os.close(r)
    assert got == [f"line {i}\n" for i in range(5)]
    assert news.opened == [1] and news.ends == [[p.stat().st_size]]
    with open_(str(p), "rb") as fh:  # in pieces, as a scan of bytes reads: the same bytes, a second opening
        assert b"".join(iter(lambda: fh.read(7), b"")) == p.read_bytes()
    assert news.opened == [2] and news.ends == [[p.stat().st_size] * 2]
    with open_(str(tmp_path / "other.txt"), "w") as fh:  # any other file: the real open
        fh.write("x")
    assert (tmp_path / "other.txt").read_text() == "x"


def test_a_file_said_to_get_no_more_ends_there_before_the_fetch_is_over(tmp_path: Path) -> None:
    """``"<i> end"``: the reader gives the end of that file at once (the scan goes on to the next one while the
    fetch brings it); a file written after it was said to get no more spoils the result."""
    p = tmp_path / "log.jsonl"
    p.write_bytes(b"a\nb\n")
    r, w = os.pipe()
    os.set_blocking(r, False)
    news = follow._News(r, b"", [0, 0])
    open_ = follow._open_for(news, [str(p), str(tmp_path / "next.jsonl")])
    os.write(w, b"0 4\n0 end\n")
    with open_(str(p), encoding="utf-8") as fh:
        assert list(fh) == ["a\n", "b\n"]  # no "done" yet
    assert news.ends == [[4], []] and not news.done
    os.close(w)
    os.close(r)

    bodies = _bodies(50)
    paths = [str(tmp_path / n) for n in sorted(bodies)]
    for q in paths:
        Path(q).write_bytes(bodies[os.path.basename(q)])
    f = follow.Follower()
    f.start(paths, {q: os.path.getsize(q) for q in paths}, {})
    f.complete(paths[0])
    f.wrote(paths[0], os.path.getsize(paths[0]), False)
    assert f.result(paths, {}) is None and "said to get no more" in str(f.why)
