"""Properties of the transform on every worker file of every pinned sglang release (downloaded into the cache).

For each file: the instrumented text compiles; it only adds lines (every original line is still there, in order,
byte for byte) and every added line carries the marker; stripping gives back the original bytes; instrumenting
twice equals instrumenting once (and says nothing changed); CRLF line endings go through the same way. And the
transform finds what ``EXPECTED`` says, per release, file and class.

``EXPECTED`` was read off the files themselves (the entry method's branches, its ``with`` blocks, the helpers that
hold the prefill path from 0.5.21, the pipeline-parallel tail draft, NGRAM's lookup/verify/accept steps) and is
frozen here: a change of what the transform finds on a real file is a change to review, not to accept silently.
Every pinned release, from 0.4.1.post4 (the oldest on PyPI with an EAGLE worker), gets its decode phases timed.
Collecting these tests needs no network; the download happens (once per cache) when a test runs.
"""

from __future__ import annotations

import dataclasses
import re

import pytest

import sglang_releases
from eaglepatch.transform.engine import instrument, strip
from eaglepatch.transform.marks import MARKER
from eaglepatch.transform.results import Instrumented, NotApplicable

pytestmark = pytest.mark.real


@dataclasses.dataclass(frozen=True)
class Supported:
    """A class the transform instruments: its entry method, the distinct phases found (sorted), the number of
    phase call sites (entry method and helpers together), whether it reads the accepted-token count, and the
    optional phases of the recipe it lacks (listed as missing, with a warning)."""

    method: str
    phases: list[str]
    sites: int
    accepted: bool
    missing: tuple[str, ...] = ()


INHERITS = "inherits"  # no entry method of its own: timed through its base class's instrumented method
UNSUPPORTED = "unsupported"  # listed by `show` with the recipe's reason, never patched

_ALL4 = ["draft", "draft_extend", "target", "verify"]
V1 = Supported("forward_batch_generation", _ALL4, sites=5, accepted=True)
V1_OLD = Supported("forward_batch_speculative_generation", _ALL4, sites=5, accepted=True)  # up to 0.5.1
# Up to 0.4.3.post2 the prefill target forward is a plain self.target_worker.forward_batch_generation(...) (the call
# later releases make on their idle path): not timed, listed as missing. 0.4.1.post4: the draft is a loop of
# self.forward_draft_decode(batch) steps, the decode draft extend self.forward_extend_after_decode(batch), and
# verify's tuple holds no accept counts; 0.4.1.post5: forward_draft_extend_after_decode, and verify's tuple holds
# accept_length_cpu; 0.4.2.post2: one self.draft(batch) call.
_NO_TARGET = ["draft", "draft_extend", "verify"]
V1_LOOP = Supported("forward_batch_speculative_generation", _NO_TARGET, sites=4, accepted=False,
                    missing=("prefill target",))
V1_NO_TARGET = Supported("forward_batch_speculative_generation", _NO_TARGET, sites=4, accepted=True,
                         missing=("prefill target",))
V2 = Supported("forward_batch_generation", _ALL4, sites=5, accepted=True)
# 0.5.21+: draft / verify / draft extend in the entry method, plus the pipeline-parallel tail draft
# (with_topology=True); target + draft extend in _forward_prefill_batch; draft, verify and draft extend of a
# heterogeneous DP rank in _forward_dp_spec_prefill_coordination (which reads accepted a second time).
V2_HELPERS = Supported("forward_batch_generation", _ALL4, sites=9, accepted=True)
# NGRAM: draft = the CPU trie lookup, verify = the target forward with is_verify=True, target = the prefill forward;
# accepted from verify_input.verify(...) up to 0.5.13, from eagle_sample(...) from 0.5.14.
NGRAM = Supported("forward_batch_generation", ["draft", "target", "verify"], sites=3, accepted=True)

EXPECTED: dict[str, dict[str, dict[str, object]]] = {
    "0.4.1.post4": {
        "eagle_worker.py": {"EAGLEWorker": V1_LOOP},
    },
    "0.4.1.post5": {
        "eagle_worker.py": {"EAGLEWorker": V1_NO_TARGET},
    },
    "0.4.2.post2": {
        "eagle_worker.py": {"EAGLEWorker": V1_NO_TARGET},
    },
    "0.4.3.post3": {
        "eagle_worker.py": {"EAGLEWorker": V1_OLD},
    },
    "0.4.6": {
        "eagle_worker.py": {"EAGLEWorker": V1_OLD},
    },
    "0.4.10.post2": {
        "eagle_worker.py": {"EAGLEWorker": V1_OLD},
    },
    "0.5.3": {
        "eagle_worker.py": {"EAGLEWorker": V1},
        "ngram_worker.py": {"NGRAMWorker": NGRAM},
        "standalone_worker.py": {"StandaloneWorker": INHERITS},
    },
    "0.5.6": {
        "eagle_worker.py": {"EAGLEWorker": V1},
        "eagle_worker_v2.py": {"EAGLEWorkerV2": V2},
        "ngram_worker.py": {"NGRAMWorker": NGRAM},
        "standalone_worker.py": {"StandaloneWorker": INHERITS},
    },
    "0.5.10": {
        "eagle_worker.py": {"EAGLEWorker": V1},
        "eagle_worker_v2.py": {"EAGLEWorkerV2": V2},
        "multi_layer_eagle_worker.py": {"MultiLayerEagleWorker": V1},
        "multi_layer_eagle_worker_v2.py": {"MultiLayerEagleWorkerV2": V2},
        "ngram_worker.py": {"NGRAMWorker": NGRAM},
        "standalone_worker.py": {"StandaloneWorker": INHERITS},
        "standalone_worker_v2.py": {"StandaloneWorkerV2": INHERITS},
    },
    "0.5.12": {
        "dflash_worker.py": {"DFlashWorker": UNSUPPORTED},
        "eagle_worker.py": {"EAGLEWorker": V1},
        "eagle_worker_v2.py": {"EAGLEWorkerV2": V2},
        "frozen_kv_mtp_worker.py": {"FrozenKVMTPWorker": V1},
        # 0.5.12's FrozenKVMTPWorkerV2 subclasses the V1 FrozenKVMTPWorker and has no entry method of its own.
        "frozen_kv_mtp_worker_v2.py": {"FrozenKVMTPWorkerV2": INHERITS},
        "multi_layer_eagle_worker.py": {"MultiLayerEagleWorker": V1},
        "multi_layer_eagle_worker_v2.py": {"MultiLayerEagleWorkerV2": V2},
        "ngram_worker.py": {"NGRAMWorker": NGRAM},
        "standalone_worker.py": {"StandaloneWorker": INHERITS},
        "standalone_worker_v2.py": {"StandaloneWorkerV2": INHERITS},
    },
    "0.5.16": {
        "dflash_worker_v2.py": {"DFlashWorkerV2": UNSUPPORTED},
        "dspark_components/dspark_worker_v2.py": {"DSparkWorkerV2": UNSUPPORTED},
        "eagle_worker_v2.py": {"EAGLEWorkerV2": V2},
        "frozen_kv_mtp_worker_v2.py": {"FrozenKVMTPWorkerV2": V2},  # overrides the method from 0.5.14
        "multi_layer_eagle_worker_v2.py": {"MultiLayerEagleWorkerV2": V2},
        "ngram_worker.py": {"NGRAMWorker": NGRAM},
        "standalone_worker_v2.py": {"StandaloneWorkerV2": INHERITS},
    },
    "0.5.21": {
        "dflash_worker_v2.py": {"DFlashWorkerV2": UNSUPPORTED},
        "dspark_components/dspark_worker_v2.py": {"DSparkWorkerV2": UNSUPPORTED},
        "eagle_worker_v2.py": {"EAGLEWorkerV2": V2_HELPERS},
        "frozen_kv_mtp_worker_v2.py": {"FrozenKVMTPWorkerV2": V2},
        # _draft_extend_plan_for_decode (before verify) is a look-alike, not a fourth decode phase.
        "multi_layer_eagle_worker_v2.py": {"MultiLayerEagleWorkerV2": V2},
        "ngram_worker.py": {"NGRAMWorker": NGRAM},
        "standalone_worker_v2.py": {"StandaloneWorkerV2": INHERITS},
        "uno_worker_v2.py": {"UnoWorkerV2": UNSUPPORTED},
    },
    "0.5.23": {
        "dflash_worker_v2.py": {"DFlashWorkerV2": UNSUPPORTED},
        "dspark_components/dspark_worker_v2.py": {"DSparkWorkerV2": UNSUPPORTED},
        "eagle_worker_v2.py": {"EAGLEWorkerV2": V2_HELPERS},
        "frozen_kv_mtp_worker_v2.py": {"FrozenKVMTPWorkerV2": V2},
        "multi_layer_eagle_worker_v2.py": {"MultiLayerEagleWorkerV2": V2},
        "ngram_worker.py": {"NGRAMWorker": NGRAM},
        "standalone_worker_v2.py": {"StandaloneWorkerV2": INHERITS},
        "uno_worker_v2.py": {"UnoWorkerV2": UNSUPPORTED},
    },
}

CASES = [(v, f) for v in sglang_releases.PINNED for f in EXPECTED[v]]
_ADDED = re.compile(r"^[ \t]*\S.*  " + re.escape(MARKER) + r"(\r\n|\n)$")


def _source(sglang_release, version: str, rel: str) -> str:
    """The file's exact text: bytes decoded as UTF-8, line endings untouched (no universal newlines)."""
    site = sglang_release(version)
    return (site / "sglang" / "srt" / "speculative" / rel).read_bytes().decode("utf-8")


_RESULTS: dict[tuple[str, str], tuple[str, object]] = {}


def _instrumented(sglang_release, recipe, version: str, rel: str):
    """(source, instrument(source)) of a release file, computed once per session (the transform is pure)."""
    key = (version, rel)
    if key not in _RESULTS:
        src = _source(sglang_release, version, rel)
        _RESULTS[key] = (src, instrument(src, rel, recipe))
    return _RESULTS[key]


def _added_lines(original: str, new: str) -> list[str]:
    """The lines of ``new`` that are not the lines of ``original`` walked in order; fails if ``new`` lost or
    changed any original line (two-pointer walk: every original line must come back, in order, byte for byte)."""
    old_lines = original.splitlines(keepends=True)
    added: list[str] = []
    i = 0
    for line in new.splitlines(keepends=True):
        if i < len(old_lines) and line == old_lines[i]:
            i += 1
        else:
            added.append(line)
    assert i == len(old_lines), f"original line {i + 1} is missing or changed: {old_lines[i]!r}"
    return added


def test_pinned_releases_include_the_required_ones():
    """The issue pins at least these releases (and the newest on PyPI, 0.5.23 when this was written), and the
    oldest release on PyPI with an EAGLE worker, 0.4.1.post4 (0.4.1.post3 and older have no eagle_worker.py)."""
    required = ["0.4.1.post4", "0.4.6", "0.4.10.post2", "0.5.3", "0.5.6", "0.5.10", "0.5.12", "0.5.16", "0.5.23"]
    assert set(required) <= set(sglang_releases.PINNED)
    assert set(EXPECTED) == set(sglang_releases.PINNED)
    assert sglang_releases.PINNED[0] == "0.4.1.post4"


@pytest.mark.parametrize("version", sglang_releases.PINNED)
def test_worker_files_are_the_expected_ones(sglang_release, version):
    """Every file with an entry method (or a class inheriting one) is covered by EXPECTED, and nothing else:
    a new worker file in a pinned release must be looked at, not skipped."""
    sglang_release(version)
    found = [sglang_releases.relpath(version, p) for p in sglang_releases.worker_files(version)]
    assert sorted(found) == sorted(EXPECTED[version])


@pytest.mark.parametrize("version", sglang_releases.PINNED)
def test_site_keeps_the_wheel_layout(sglang_release, version):
    """The extracted site has the files eaglepatch reads and invents none: no release ships
    sglang/srt/__init__.py or sglang/srt/speculative/__init__.py (namespace packages)."""
    site = sglang_release(version)
    assert (site / "sglang" / "__init__.py").is_file()
    assert (site / "sglang" / "version.py").is_file()
    assert not (site / "sglang" / "srt" / "__init__.py").exists()
    assert not (site / "sglang" / "srt" / "speculative" / "__init__.py").exists()
    assert list(site.glob("sglang-*.dist-info/METADATA"))


@pytest.mark.parametrize("version,rel", CASES, ids=[f"{v}-{f}" for v, f in CASES])
def test_finds_the_expected_phases(sglang_release, recipe, version, rel):
    """What the transform finds per class matches the frozen expectation for this release."""
    src, res = _instrumented(sglang_release, recipe, version, rel)
    expected = EXPECTED[version][rel]
    assert isinstance(res, (Instrumented, NotApplicable)), getattr(res, "message", lambda: res)()
    got: dict[str, object] = {}
    for w in res.workers:
        if w.status == "supported":
            got[w.cls] = Supported(w.method, sorted({p.phase for p in w.phases}), len(w.phases), bool(w.facts),
                                   w.missing)
        else:
            got[w.cls] = w.status
            assert w.reason, f"{w.cls}: a class that is not instrumented needs a reason for `show`"
    assert got == expected
    if any(isinstance(e, Supported) for e in expected.values()):
        assert isinstance(res, Instrumented)
    else:
        assert isinstance(res, NotApplicable)


@pytest.mark.parametrize("version,rel", CASES, ids=[f"{v}-{f}" for v, f in CASES])
def test_instrumented_file_only_adds_marked_lines(sglang_release, recipe, version, rel):
    """Compiles; every original line is still there, in order, byte for byte; each added line is ours
    (ends with the marker); strip gives back the original; instrumenting again changes nothing."""
    src, res = _instrumented(sglang_release, recipe, version, rel)
    if isinstance(res, NotApplicable):
        assert strip(src) == src
        return
    assert isinstance(res, Instrumented), res.message()
    assert res.changed and not res.was_patched
    compile(res.source, rel, "exec", dont_inherit=True)
    added = _added_lines(src, res.source)
    assert added, "nothing was added"
    for line in added:
        assert _ADDED.match(line), f"added line without the marker: {line!r}"
    # One import, one decorator per class, begin (and end, except the return form) per phase, one accepted
    # line per fact site.
    n_classes = sum(1 for w in res.workers if w.status == "supported")
    n_begin = sum(len(w.phases) for w in res.workers)
    n_end = sum(1 for w in res.workers for p in w.phases if p.form == "statement")
    n_facts = sum(len(w.facts) for w in res.workers)
    assert len(added) == 1 + n_classes + n_begin + n_end + n_facts
    assert sum("import _eaglepatch_runtime as _eaglepatch" in line for line in added) == 1

    assert strip(res.source).encode("utf-8") == src.encode("utf-8")

    again = instrument(res.source, rel, recipe)
    assert isinstance(again, Instrumented)
    assert again.source == res.source
    assert again.changed is False and again.was_patched is True


@pytest.mark.parametrize("version,rel", CASES, ids=[f"{v}-{f}" for v, f in CASES])
def test_crlf_copy_instruments_the_same_way(sglang_release, recipe, version, rel):
    """The same file with CRLF line endings: the output is the LF output with CRLF on every line (added lines
    included), and strip gives the CRLF bytes back."""
    src, lf_res = _instrumented(sglang_release, recipe, version, rel)
    assert "\r" not in src
    crlf = src.replace("\n", "\r\n")
    res = instrument(crlf, rel, recipe)
    assert type(res) is type(lf_res)
    if isinstance(res, Instrumented):
        assert res.source == lf_res.source.replace("\n", "\r\n")
        assert strip(res.source) == crlf


# The decode phases of each family, and where the release has a decode draft extend (NGRAM never does).
DECODE = {"eagle-v1": {"draft", "verify", "draft_extend"}, "eagle-v2": {"draft", "verify", "draft_extend"},
          "ngram": {"draft", "verify"}}


@pytest.mark.parametrize("version", sglang_releases.PINNED)
def test_every_pinned_release_gets_its_decode_phases_timed(sglang_release, recipe, version):
    """Every pinned release has at least one EAGLE worker the transform instruments, and each instrumented class
    has all its decode phases (draft, verify, and draft extend where the family has it) bracketed: the line after
    each decode begin starts the phase statement, whose lines hold the callee, followed by its end."""
    instrumented = 0
    for rel, classes in EXPECTED[version].items():
        src, res = _instrumented(sglang_release, recipe, version, rel)
        if not isinstance(res, Instrumented):
            continue
        out = res.source.splitlines()
        lines = src.splitlines()
        for w in res.workers:
            if w.status != "supported":
                continue
            instrumented += 1
            decode = [p for p in w.phases if p.mode == "decode"]
            assert {p.phase for p in decode} == DECODE[w.family], (rel, w.cls)
            for p in decode:
                stmt = lines[p.line - 1: p.end_line]
                at = next(i for i in range(len(out)) if out[i + 1: i + 1 + len(stmt)] == stmt
                          and out[i].strip() == f'_eaglepatch.begin("{p.phase}", "decode")  {MARKER}')
                assert p.call.rsplit(".", 1)[-1] + "(" in "".join(stmt).replace(" ", "")
                if p.form == "statement":
                    assert out[at + 1 + len(stmt)].strip() == f'_eaglepatch.end("{p.phase}")  {MARKER}'
    assert instrumented >= 1
    assert any(f.startswith("eagle_worker") for f in EXPECTED[version])


@pytest.mark.parametrize("version", ["0.4.1.post4", "0.4.1.post5", "0.4.2.post2"])
def test_a_release_without_the_prefill_target_call_says_so(sglang_release, recipe, version):
    """Up to 0.4.3.post2 the prefill target forward has no shape of its own (the optional target phase): the file
    is instrumented with what is found, and the result says prefill records carry no target phase (a warning
    for apply and show). The prefill draft extend is still timed, so those cycles are still prefill cycles."""
    src, res = _instrumented(sglang_release, recipe, version, "eagle_worker.py")
    assert isinstance(res, Instrumented)
    (w,) = res.workers
    assert w.missing == ("prefill target",)
    assert ("eagle_worker.py: prefill target: not found in EAGLEWorker.forward_batch_speculative_generation of this "
            "release: prefill records carry no target phase") in res.warnings
    assert [(p.phase, p.call) for p in w.phases if p.mode == "prefill"] == [("draft_extend", "self.forward_draft_extend")]


@pytest.mark.parametrize("version", ["0.4.1.post4", "0.4.1.post5"])
def test_the_draft_loop_of_the_oldest_releases_is_timed_step_by_step(sglang_release, recipe, version):
    """Before 0.4.2.post2 the draft is ``for i in range(speculative_num_steps): self.forward_draft_decode(batch)``:
    begin/end go inside the loop, around each step, so the steps accumulate into one draft phase and the loop's
    own bookkeeping stays out."""
    src, res = _instrumented(sglang_release, recipe, version, "eagle_worker.py")
    assert isinstance(res, Instrumented)
    assert ("            for i in range(self.server_args.speculative_num_steps):\n"
            '                _eaglepatch.begin("draft", "decode")  # [eaglepatch]\n'
            "                self.forward_draft_decode(batch)\n"
            '                _eaglepatch.end("draft")  # [eaglepatch]\n') in res.source
