"""A timing-log line longer than a fetch's batch (issue: over SSH one line over 8 MB stopped that file's fetch for
good, silently): the host skips it, never holding it, says so, and goes on with the records after it; the client
puts a line of as many bytes in the cache that the report counts as a skipped line, as it counts a local line that
does not parse. A last line still being written waits for its newline, however long."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from eaglepatch.hostside import logs

NAME = "h-1-rank0.jsonl"


def _records(first: int, n: int) -> bytes:
    return b"".join(
        b'{"v": 1, "t": %d.5, "host": "h", "pid": 1, "rank": 0, "mode": "decode", "bs": %d, "cycle_ms": 10.25, '
        b'"phases": {"draft": 1.5, "verify": 5.0}, "accepted": %d, "run": "h-1-7-0000abcd"}\n'
        % (1764500000 + i, 1 + i % 3, i % 4) for i in range(first, first + n))


def _folder(tmp_path: Path) -> Path:
    d = tmp_path / "logs"
    d.mkdir(mode=0o700)
    return d


def _fetch_all(d: Path, have: dict[str, int], budget: int | None = None) -> tuple[bytes, list[dict[str, Any]], int]:
    """Every answer of the host's logs step from ``have`` until it says no more: the bytes of NAME that came (each
    answer's from where the one before ended), its entries, and the rounds."""
    key = str(d) + "/" + NAME
    got, entries, rounds = b"", [], 0
    while True:
        rounds += 1
        assert rounds < 100
        payload: dict[str, Any] = {"log_dir": str(d), "have": have}
        if budget is not None:
            payload["budget"] = budget
        res = logs.op_logs(payload)
        for f, data in zip(res["files"], res["__blobs__"], strict=True):
            data = bytes(data)
            assert f["name"] == NAME and f["offset"] == have.get(key, 0) and f["size"] == len(data)
            got += data
            entries.append(f)
            have = dict(have, **{key: f["offset"] + f["size"] + (f["skipped"]["length"] if "skipped" in f else 0)})
        if not res["more"]:
            return got, entries, rounds


def _check_skipped_once(d: Path, before: bytes, line: bytes, after: bytes, budget: int | None) -> None:
    (d / NAME).write_bytes(before + line + after)
    got, entries, _rounds = _fetch_all(d, {}, budget)
    assert got == before + after  # every record after the long line arrives, the line itself never
    skips = [f["skipped"] for f in entries if "skipped" in f]
    assert skips == [{"offset": len(before), "length": len(line)}]
    # a second fetch from where this one ended brings nothing new
    res = logs.op_logs({"log_dir": str(d), "have": {str(d) + "/" + NAME: len(before + line + after)}})
    assert res["files"] == [] and not res["more"]


def test_a_line_of_9_mb_is_skipped_once_and_the_records_after_it_arrive(tmp_path: Path) -> None:
    """At the real batch limit (LOG_BATCH, 8 MB): a 9 MB line between records. Before, the fetch stopped at it
    (no newline in the batch: the offset never moved) and never brought another record of the file."""
    assert logs.LOG_BATCH == 8 << 20
    d = _folder(tmp_path)
    line = b'{"v": 1, "junk": "' + b"x" * (9 << 20) + b'"}\n'
    _check_skipped_once(d, _records(0, 50), line, _records(50, 70), None)


@pytest.mark.parametrize("budget", [4096, 1 << 14])
def test_a_line_over_a_small_batch_is_skipped_without_being_held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 budget: int) -> None:
    """With a smaller batch, several long lines (one right at the start, two in a row): each skipped once, every
    record around them arrives, and no read of the file is ever longer than a batch (the line is never held)."""
    d = _folder(tmp_path)
    long1 = b"y" * (budget * 5 + 3) + b"\n"
    long2 = b"z" * budget + b"\n"  # a batch without its newline: the newline only comes right after it
    body = long1 + _records(0, 40) + long2 + long1 + _records(40, 3)
    (d / NAME).write_bytes(body)
    reads: list[int] = []
    real = logs._log_files

    class Counted:
        def __init__(self, f: Any) -> None:
            self.f = f

        def read(self, n: int = -1) -> bytes:
            reads.append(n)
            return self.f.read(n)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.f, name)

    def counted(*args: Any) -> Any:
        for name, f, st in real(*args):
            yield name, Counted(f), st

    monkeypatch.setattr(logs, "_log_files", counted)
    got, entries, _rounds = _fetch_all(d, {}, budget)
    assert got == _records(0, 40) + _records(40, 3)
    at2 = len(long1) + len(_records(0, 40))
    assert [f["skipped"] for f in entries if "skipped" in f] == [
        {"offset": 0, "length": len(long1)}, {"offset": at2, "length": len(long2)},
        {"offset": at2 + len(long2), "length": len(long1)}]
    assert all(f["size"] == 0 for f in entries if "skipped" in f)
    assert reads and all(0 <= n <= budget for n in reads), max(reads)


def test_the_batch_limit_is_the_module_constant_when_the_request_names_none(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """LOG_BATCH made small: the same skip, with no budget in the request (as the client asks)."""
    monkeypatch.setattr(logs, "LOG_BATCH", 2048)
    d = _folder(tmp_path)
    _check_skipped_once(d, _records(0, 5), b"q" * 5000 + b"\n", _records(5, 5), None)


def test_a_line_that_does_not_fit_what_is_left_of_a_batch_is_not_skipped(tmp_path: Path) -> None:
    """Only a line no whole batch can hold is skipped: one that does not fit what an earlier file left of this
    answer's batch (no newline in the bytes read) comes whole with the next answer."""
    d = _folder(tmp_path)
    (d / "a-1-rank0.jsonl").write_bytes(_records(0, 10))
    first = len(_records(0, 10))
    budget = first + 100  # the next file's first line (some 170 bytes) does not fit what is left
    (d / NAME).write_bytes(_records(10, 20))
    have: dict[str, int] = {}
    got: dict[str, bytes] = {}
    for _ in range(50):
        res = logs.op_logs({"log_dir": str(d), "have": have, "budget": budget})
        for f, data in zip(res["files"], res["__blobs__"], strict=True):
            assert "skipped" not in f
            got[f["name"]] = got.get(f["name"], b"") + bytes(data)
            have[str(d) + "/" + f["name"]] = f["offset"] + f["size"]
        if not res["more"]:
            break
    assert got == {"a-1-rank0.jsonl": _records(0, 10), NAME: _records(10, 20)}


@pytest.mark.parametrize("budget", [4096, None])
def test_a_last_line_being_written_waits_for_its_newline_however_long(tmp_path: Path, budget: int | None) -> None:
    """A last line without its newline yet, short or longer than a batch: not skipped, nothing of it sent, the
    offset stays before it; once the runtime ends it, a short one arrives whole, a long one is skipped then, and
    the records written after it arrive."""
    limit = budget or logs.LOG_BATCH
    d = _folder(tmp_path)
    key = str(d) + "/" + NAME
    log = d / NAME
    short = _records(5, 1)
    log.write_bytes(_records(0, 5) + short[:-30])
    got, entries, _ = _fetch_all(d, {}, budget)
    assert got == _records(0, 5) and not any("skipped" in f for f in entries)
    have = {key: len(got)}
    got, entries, _ = _fetch_all(d, have, budget)
    assert got == b"" and entries == []  # asked again: still waiting, nothing sent, nothing skipped
    with open(log, "ab") as f:
        f.write(short[-30:])
    got, entries, _ = _fetch_all(d, have, budget)
    assert got == short and not any("skipped" in f for f in entries)  # the completed line arrives once
    have = {key: log.stat().st_size}
    long = b"w" * (limit + limit // 2)
    with open(log, "ab") as f:
        f.write(long)  # longer than a batch, but still being written
    for _ in range(2):
        got, entries, _ = _fetch_all(d, have, budget)
        assert got == b"" and entries == []
    with open(log, "ab") as f:
        f.write(b"w" * 10 + b"\n" + _records(6, 4))
    got, entries, _ = _fetch_all(d, have, budget)
    assert got == _records(6, 4)
    assert [f["skipped"] for f in entries if "skipped" in f] == [{"offset": have[key], "length": len(long) + 11}]


# ----------------------------------------------------------------------------------------------------------------
# the client: the cache keeps the host's offsets, the report counts the skipped line


def _local_fetch(monkeypatch: pytest.MonkeyPatch, tamper: Any = None) -> list[dict[str, int]]:
    """``ops.logs.call_each`` replaced by the host's logs step on this machine (each answer through JSON, as the
    agent sends it, then ``tamper(answer)``); returns what each request said the cache had."""
    from eaglepatch.ops import logs as fetch

    asked: list[dict[str, int]] = []

    def call_each(host: Any, python: str, op: str, /, *, follow: Any, on_result: Any, **payload: Any) -> None:
        while True:
            asked.append(dict(payload.get("have") or {}))
            res = logs.op_logs(payload)
            blobs = [bytes(b) for b in res.pop("__blobs__")]
            res = json.loads(json.dumps(res))
            if tamper is not None:
                tamper(res)
            nxt = follow(res)
            on_result(dict(res, __blobs__=blobs))
            if nxt is None:
                return
            payload = nxt

    monkeypatch.setattr(fetch, "call_each", call_each)
    return asked


def test_the_client_keeps_the_hosts_offsets_and_the_report_counts_the_line_as_skipped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fetch (batch limit made small) into the cache: the copy has the host's size (a line of as many bytes
    stands for the skipped one), the records after it are there, byte for byte, and ``aggregate`` counts every
    record and one skipped line, as it does for a local line that does not parse; the next fetch asks from the
    host's size and brings nothing."""
    from eaglepatch.ops import logs as fetch
    from eaglepatch.report import aggregate, iter_log_files

    monkeypatch.setattr(logs, "LOG_BATCH", 4096)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    d = _folder(tmp_path)
    before, line, after = _records(0, 30), b'{"v": 1, "junk": "' + b"x" * 20000 + b'"}\n', _records(30, 40)
    (d / NAME).write_bytes(before + line + after)
    _local_fetch(monkeypatch)
    said: list[str] = []
    folder = fetch.fetch_logs_from(None, "gpu1", "python3", str(d), said.append)  # type: ignore[arg-type]
    (cached,) = iter_log_files([folder])
    data = Path(cached).read_bytes()
    assert len(data) == (d / NAME).stat().st_size
    assert data.startswith(before) and data.endswith(after)
    stand_in = data[len(before): len(before) + len(line)]
    assert stand_in.endswith(b"\n") and stand_in.count(b"\n") == 1 and stand_in.startswith(b"eaglepatch fetch: ")
    got = aggregate([cached])
    assert got.records == 70 and got.skipped_lines == 1
    assert any(f"a line of {len(line)} bytes" in m and "skipped line" in m for m in said), said
    asked = _local_fetch(monkeypatch)
    fetch.fetch_logs_from(None, "gpu1", "python3", str(d), said.append)  # type: ignore[arg-type]
    assert asked == [{str(d) + "/" + NAME: len(before + line + after)}]
    assert Path(cached).read_bytes() == data
    # the same file read here: the same records; its long line parses, so only the fetched copy skips it
    assert aggregate([str(d / NAME)]).records == 70


def test_the_fetch_through_the_real_agent_at_the_real_limit_goes_past_a_9_mb_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the agent on this machine (the bundled host side, its frames: an entry with no bytes has an empty
    attachment), at LOG_BATCH: a 9 MB line that is no JSON between records; the report of the cache has every record
    and one skipped line, as the report of the host's file itself."""
    from eaglepatch.hosts.local import LocalHost
    from eaglepatch.ops import logs as fetch
    from eaglepatch.report import aggregate, iter_log_files

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    d = _folder(tmp_path)
    (d / NAME).write_bytes(_records(0, 20) + b"x" * (9 << 20) + b"\n" + _records(20, 25))
    host = LocalHost()
    try:
        folder = fetch.fetch_logs_from(host, "local", os.path.realpath(sys.executable), str(d), lambda _m: None)
    finally:
        host.close()
    (cached,) = iter_log_files([folder])
    assert os.path.getsize(cached) == (d / NAME).stat().st_size
    got = aggregate([cached])
    assert got.records == 45 and got.skipped_lines == 1
    here = aggregate([str(d / NAME)])
    assert (here.records, here.skipped_lines) == (45, 1)


@pytest.mark.parametrize("lie", ["not after its bytes", "past the file", "no length"])
def test_a_skipped_line_that_is_not_one_is_refused_and_nothing_is_written(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch,
                                                                          lie: str) -> None:
    """The host's word on a skipped line is checked as its bytes are: it begins right after the entry's bytes and
    ends within the file's size the answer says; else the whole answer is refused before a byte is written."""
    from eaglepatch.errors import BadAnswer
    from eaglepatch.ops import logs as fetch

    monkeypatch.setattr(logs, "LOG_BATCH", 2048)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    d = _folder(tmp_path)
    (d / NAME).write_bytes(b"x" * 5000 + b"\n" + _records(0, 3))

    def tamper(res: dict[str, Any]) -> None:
        for f in res["files"]:
            if "skipped" in f:
                if lie == "not after its bytes":
                    f["skipped"]["offset"] += 1
                elif lie == "past the file":
                    f["skipped"]["length"] += 10 << 20
                else:
                    f["skipped"] = {"offset": 0, "length": "5001"}

    _local_fetch(monkeypatch, tamper)
    with pytest.raises(BadAnswer, match="skipped line"):
        fetch.fetch_logs_from(None, "gpu1", "python3", str(d), lambda _m: None)  # type: ignore[arg-type]
    assert not [p for p in (tmp_path / "cache").rglob("*.jsonl") if p.stat().st_size]
