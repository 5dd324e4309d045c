"""The timing runtime's summary line on stderr (eaglepatch/runtime/_eaglepatch_runtime.py): one line per worker and
mode every summary_every records, with the mean cycle, each phase's mean and share, the accept length and in-cycle
tok/s (the tokens over the time inside the entry method: labels.CYCLE, whose tok/s it is), and the records dropped
in its window.

Several of these tests were written to kill mutants of the runtime (docs/mutation-runtime.md).
"""
import re

import pytest

from runtime_helpers import Batch, Obj, decode_worker, scripted_worker


SUMMARY_RE = re.compile(
    r"^\[eaglepatch\] rank(\d+) (\w+) (decode|prefill) n=(\d+) cycle ([0-9.]+) ms"
    r"(?: \| ((?:\w+ [0-9.]+ \(\d+%\) ?)+))?(?: \| accept len ([0-9.]+))?(?: \| ([0-9.]+) in-cycle tok/s)?$")


def test_summary_line_every_k_records(load, capsys):
    rt = load(summary_every=3)
    w = decode_worker(rt, sleeps=(0.001, 0.002, 0.0), out=Obj(accept_lens=[3, 3, 3, 3]), name="EAGLEWorkerV2")
    for i in range(7):
        w.forward_batch_generation(Batch(4))
        if i == 1:
            rt.flush()
            assert capsys.readouterr().err == ""
    rt.flush()
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2, lines
    for line in lines:
        m = SUMMARY_RE.match(line)
        assert m, line
        rank, worker, mode, n, cycle, phases, accept_len, tps = m.groups()
        assert (rank, worker, mode, n) == ("0", "EAGLEWorkerV2", "decode", "3")
        assert [p.split()[0] for p in re.findall(r"\w+ [0-9.]+ \(", phases)] == ["draft", "verify", "draft_extend"]
        assert float(accept_len) == 3.0
        assert float(tps) > 0 and float(cycle) >= 3.0
        # tok/s = sum(accepted) / sum(cycle_ms) * 1000 (loosely: the cycle is printed rounded)
        assert abs(float(tps) - 12 / float(cycle) * 1000) / float(tps) < 0.05


def test_summary_has_one_line_per_worker_and_mode(load, capsys):
    rt = load(summary_every=4)

    class W(object):
        @rt.entry
        def forward_batch_generation(self, batch, prefill):
            rt.begin("target" if prefill else "draft", "prefill" if prefill else "decode")
            rt.end("target" if prefill else "draft")

    for prefill in (True, False, False, False):
        W().forward_batch_generation(Batch(), prefill)
    rt.flush()
    lines = capsys.readouterr().err.splitlines()
    assert [SUMMARY_RE.match(l).group(3, 4) for l in lines] == [("prefill", "1"), ("decode", "3")]
    assert all("accept len" not in l and "tok/s" not in l for l in lines)


def test_summary_off_with_zero(load, capsys):
    rt = load(summary_every=0)
    w = decode_worker(rt)
    for _ in range(10):
        w.forward_batch_generation(Batch())
    rt.flush()
    assert capsys.readouterr().err == ""


def test_the_summary_line_is_exact(load, capsys, monkeypatch):
    """Per phase the mean ms and its share of the cycle, the accept length (accepted / batch size), tok/s
    (accepted / cycle time): from the window's sums, which start at zero."""
    rt = load(mode="cpu", summary_every=2)
    rt._WRITER_THREAD = False
    clock = [10.0]
    monkeypatch.setattr(rt, "_perf", lambda: clock[0])

    class EAGLEWorker(object):
        @rt.entry
        def forward_batch_generation(self, batch):
            rt.begin("draft", "decode")
            clock[0] += 0.010
            rt.end("draft")
            rt.begin("verify", "decode")
            clock[0] += 0.0025
            rt.end("verify")
            rt.accepted(Obj(accept_lens=[2, 3]), ("accept_lens",))
            clock[0] += 0.0005

    for _ in range(2):
        EAGLEWorker().forward_batch_generation(Batch(2))
    rt.flush()
    assert capsys.readouterr().err == ("[eaglepatch] rank0 EAGLEWorker decode n=2 cycle 13.00 ms | draft 10.00 (77%) "
                                       "verify 2.50 (19%) | accept len 2.50 | 384.6 in-cycle tok/s\n")


@pytest.mark.parametrize("steps, after, line", [
    ([("draft", 0.0001), ("verify", 0.0002)], 0.0001,
     "cycle 0.40 ms | draft 0.10 (25%) verify 0.20 (50%) | accept len 2.00 | 10000.0 in-cycle tok/s"),
    ([("draft", 0.0), ("verify", 0.0)], 0.0,
     "cycle 0.00 ms | draft 0.00 (0%) verify 0.00 (0%) | accept len 2.00"),
], ids=["sub-millisecond cycles", "cycles that took no time"])
def test_a_summary_of_short_cycles_keeps_its_shares_and_rate(load, monkeypatch, capsys, steps, after, line):
    """Two cycles on a scripted clock, 4 tokens accepted in each: cycles of 0.4 ms (under 1 ms in all) still get
    each phase's share and tok/s; cycles that took no time get 0 % and no tok/s, and nothing raises."""
    rt = load(mode="cpu", summary_every=2)
    rt._WRITER_THREAD = False
    clock = [10.0]
    monkeypatch.setattr(rt, "_perf", lambda: clock[0])
    w = scripted_worker(rt, clock, steps, after=after, out=Obj(accept_lens=[2, 2]))
    for _ in range(2):
        w.forward_batch_generation(Batch(2))
    rt.flush()
    assert capsys.readouterr().err == "[eaglepatch] rank0 W decode n=2 " + line + "\n"
    assert rt._stats()["errors"] == 0


def test_each_summary_counts_the_drops_of_its_own_window(load, capsys):
    """The buffer full (1 record, nothing written until the flush): the second record of each window is dropped;
    each summary says its own one drop."""
    rt = load(mode="cpu", summary_every=2, buffer_records=1)
    rt._WRITER_THREAD = False
    w = decode_worker(rt)
    for _ in range(2):
        w.forward_batch_generation(Batch())
        w.forward_batch_generation(Batch())
        rt.flush()
    dropped = [line for line in capsys.readouterr().err.splitlines() if "dropped" in line]
    assert dropped == ["[eaglepatch] rank0 dropped 1 record(s) since the last summary (the log writer fell "
                       "behind)"] * 2
    assert rt._stats()["errors"] == 0 and rt._stats()["dropped"] == 2


def test_a_summary_that_cannot_be_printed_is_said_as_a_summary_error(load, monkeypatch, capsys):
    """A summary line that cannot be made is said as a `summary` internal error; the server goes on."""
    rt = load(mode="cpu", summary_every=1)
    rt._WRITER_THREAD = False

    def broken(*args):
        raise RuntimeError("no summary today")

    monkeypatch.setattr(rt, "_summary_lines", broken)
    decode_worker(rt).forward_batch_generation(Batch())
    rt.flush()
    err = capsys.readouterr().err
    assert err.startswith("[eaglepatch] internal error in summary (the server goes on;") and "no summary today" in err
