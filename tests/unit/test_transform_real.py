"""The transform's new guarantees on REAL worker files of the pinned releases, each mutated to hold the case.

test_transform_lines.py, test_transform_positions.py and test_transform_marker.py hold the small hand-written cases;
here the same cases are put into real files (downloaded into the release cache, like tests/real/), so that what
holds on a toy also holds amid the decorators, ``with`` blocks, comments and strings of real sglang code:

- a form feed, U+2028 or ``\\x85`` above the worker class shifts nothing (Python does not break lines there);
- a phase call moved into a conditional or lazy position is refused with file, class, line and reason;
- a user's line ending with the marker comment is refused by instrument and kept by strip;
- a BOM stays first and the rest is instrumented exactly as without it.
"""

from __future__ import annotations

import pytest

from eaglepatch.transform.engine import instrument, strip
from eaglepatch.transform.marks import split_lines, strip_lines
from eaglepatch.transform.results import Instrumented, Refused, WorkerInfo

pytestmark = pytest.mark.real

# (release, file, worker class line as it starts in the file)
FILES = [
    ("0.5.16", "eagle_worker_v2.py", "class EAGLEWorkerV2(BaseSpecWorker):\n"),
    ("0.5.3", "eagle_worker.py", "class EAGLEWorker(TpModelWorker):\n"),
]
IDS = [f"{v}-{f}" for v, f, _ in FILES]


def _source(sglang_release, version: str, rel: str) -> str:
    site = sglang_release(version)
    return (site / "sglang" / "srt" / "speculative" / rel).read_bytes().decode("utf-8")


def _insert_before(text: str, anchor: str, block: str) -> str:
    """``text`` with ``block`` (whole lines) inserted right before the line ``anchor`` (which occurs once)."""
    assert text.count(anchor) == 1, anchor
    return text.replace(anchor, block + anchor)


def _check_bracketing(res: Instrumented, original: str) -> None:
    """Each begin is followed by the lines of its phase statement as they are in ``original`` (the site's lines),
    which hold the phase's callee; a statement-form phase is followed by its end."""
    out = split_lines(res.source)
    src = split_lines(original)
    sites = sorted((p for w in res.workers for p in w.phases), key=lambda p: p.line)
    begins = [i for i, line in enumerate(out) if "_eaglepatch.begin(" in line]
    assert len(begins) == len(sites)
    for i, site in zip(begins, sites):
        assert f'_eaglepatch.begin("{site.phase}", "{site.mode}")' in out[i]
        n = site.end_line - site.line + 1
        stmt = out[i + 1: i + 1 + n]
        assert stmt == src[site.line - 1: site.end_line], (site, stmt)
        assert site.call.rsplit(".", 1)[-1] + "(" in "".join(stmt).replace("\n", "").replace(" ", "")
        if site.form == "statement":
            assert f'_eaglepatch.end("{site.phase}")' in out[i + 1 + n]


# ---------------------------------------------------------------------------------------------------------------
# Lines as Python counts them


@pytest.mark.parametrize("mutation", [
    "# page break\x0c\n",
    "# a line\u2028separator in a comment\n",
    "NEL = 'a next-line \x85 in a string'\n",
    "\x0c\n",
], ids=["form-feed-comment", "u2028-comment", "x85-string", "form-feed-alone"])
@pytest.mark.parametrize("version,rel,cls_line", FILES, ids=IDS)
def test_a_break_character_above_the_worker_class_shifts_nothing(sglang_release, recipe, version, rel, cls_line,
                                                                  mutation):
    """The mutated file is instrumented exactly as the original, with the inserted line in its place: every
    begin/end, accepted and the decorator sit where they sit without it (each begin right above its phase
    statement, which holds the call), the sites' lines are one further down, and strip gives back the bytes."""
    original = _source(sglang_release, version, rel)
    base = instrument(original, rel, recipe)
    assert isinstance(base, Instrumented)
    src = _insert_before(original, cls_line, mutation)
    assert len(src.splitlines()) > len(original.splitlines()) + 1 or "\x0c\n" == mutation  # the trap is set
    res = instrument(src, rel, recipe)
    assert isinstance(res, Instrumented), res
    assert res.source == _insert_before(base.source, cls_line, mutation)
    assert [p.line for w in res.workers for p in w.phases] == [p.line + 1 for w in base.workers for p in w.phases]
    _check_bracketing(res, src)
    out = split_lines(res.source)
    at = next(i for i, line in enumerate(out) if "@_eaglepatch.entry" in line)
    assert out[at + 1].lstrip().startswith("def forward_batch_generation")
    assert strip(res.source).encode("utf-8") == src.encode("utf-8")
    assert strip_lines(res.source) == src


# ---------------------------------------------------------------------------------------------------------------
# Conditional and lazy positions

V2_DRAFT = "                    verify_input: EagleVerifyInput = self.draft_worker.draft(batch)\n"
V2_VERIFY = "            batch_output = self.verify(batch)\n"
V1_DRAFT = "                spec_info = self.draft(batch)\n"
V2_CALL = "phase call self.draft_worker.draft(...) "
VERIFY_CALL = "phase call self.verify(...) "
V1_CALL = "phase call self.draft(...) "

MUTATIONS = {
    "v2-draft-ifexp": ("0.5.16", "eagle_worker_v2.py", V2_DRAFT, V2_DRAFT.replace(
        "self.draft_worker.draft(batch)\n", "self.draft_worker.draft(batch) if batch.reqs else None\n"),
        V2_CALL + "sits in a conditional expression (a if c else b): it may not run"),
    "v2-verify-or": ("0.5.16", "eagle_worker_v2.py", V2_VERIFY, V2_VERIFY.replace(
        "= self.verify(batch)", "= batch.cached or self.verify(batch)"),
        VERIFY_CALL + "sits on the right of 'and'/'or': it may not run"),
    "v2-verify-break": ("0.5.16", "eagle_worker_v2.py", V2_VERIFY,
                        "            for _ in range(1):\n    " + V2_VERIFY.rstrip("\n") + "; break\n",
                        VERIFY_CALL + "is followed on its line by 'break': the end line would never run"),
    "v1-draft-lambda": ("0.5.3", "eagle_worker.py", V1_DRAFT,
                        V1_DRAFT.replace("self.draft(batch)", "(lambda: self.draft(batch))()"),
                        V1_CALL + "sits inside a lambda: it runs when the lambda is called, if ever, not where the "
                        "lambda is written"),
    "v1-draft-generator": ("0.5.3", "eagle_worker.py", V1_DRAFT,
                           V1_DRAFT.replace("self.draft(batch)", "next(self.draft(b) for b in [batch])"),
                           V1_CALL + "sits inside a comprehension or generator expression: it runs once per item, or "
                           "later (lazily)"),
    "v1-draft-fstring": ("0.5.3", "eagle_worker.py", V1_DRAFT,
                         V1_DRAFT.replace("self.draft(batch)", "f'{self.draft(batch)}'"),
                         V1_CALL + "sits inside an f-string: not a place eaglepatch brackets (in doubt, it refuses)"),
    "v1-draft-default": ("0.5.3", "eagle_worker.py", V1_DRAFT,
                         "                def _d(b=self.draft(batch)):\n                    return b\n"
                         "                spec_info = _d()\n", V1_CALL + "sits in a default argument"),
}


@pytest.mark.parametrize("case", sorted(MUTATIONS))
def test_a_phase_call_moved_into_a_conditional_or_lazy_position_is_refused(sglang_release, recipe, case):
    """A real worker with one phase call moved where begin/end would not bracket exactly one run of it: refused,
    naming the file, the class and the call's own line, with the reason; the unmutated file is instrumented."""
    version, rel, old, new, reason = MUTATIONS[case]
    original = _source(sglang_release, version, rel)
    assert isinstance(instrument(original, rel, recipe), Instrumented)
    assert original.count(old) == 1
    src = original.replace(old, new)
    res = instrument(src, rel, recipe)
    assert isinstance(res, Refused), res
    # The call's line: the line of ``old`` in the file, plus where the call sits among the lines of ``new``.
    line = original[: original.index(old)].count("\n") + 1 + next(
        i for i, text in enumerate(split_lines(new)) if "self.draft" in text or "self.verify" in text)
    cls = "EAGLEWorkerV2" if rel.endswith("_v2.py") else "EAGLEWorker"
    assert res.message() == f"{rel}:{line} ({cls}): {reason}"


def test_a_return_in_a_real_helper_is_refused(sglang_release, recipe):
    """0.5.23's _forward_prefill_batch (a helper the recipe scans) with its target forward turned into
    ``return self.target_worker.forward_batch_generation(...)``: the phase would stay open while the entry method
    goes on after the helper; refused, naming the helper."""
    original = _source(sglang_release, "0.5.23", "eagle_worker_v2.py")
    old = "        batch_output = self.target_worker.forward_batch_generation(\n            batch,\n" \
          "            pp_proxy_tensors=pp_proxy_tensors,\n"
    assert original.count(old) == 1
    src = original.replace(old, old.replace("batch_output = self.target", "return self.target"))
    res = instrument(src, "eagle_worker_v2.py", recipe)
    assert isinstance(res, Refused), res
    assert split_lines(src)[res.line - 1].strip().startswith("return self.target_worker.forward_batch_generation(")
    assert res.message() == (f"eagle_worker_v2.py:{res.line} (EAGLEWorkerV2): phase call "
                             "self.target_worker.forward_batch_generation(...) sits in a return statement of "
                             "_forward_prefill_batch, not of the entry method forward_batch_generation: no end line "
                             "can follow it, and the phase would stay open while forward_batch_generation goes on")


# ---------------------------------------------------------------------------------------------------------------
# The marker and the BOM


@pytest.mark.parametrize("version,rel,cls_line", FILES, ids=IDS)
def test_a_users_marked_line_in_a_real_file(sglang_release, recipe, version, rel, cls_line):
    """A real file with a user's own ``# [eaglepatch]`` line above the worker class: instrument refuses it (with
    that line); strip and strip_lines of the file eaglepatch had patched before the line was added keep it."""
    original = _source(sglang_release, version, rel)
    user = "RETRIES = 3  # [eaglepatch]\n"
    src = _insert_before(original, cls_line, user)
    res = instrument(src, rel, recipe)
    assert isinstance(res, Refused), res
    assert split_lines(src)[res.line - 1] == user
    assert res.message() == (f"{rel}:{res.line}: this line ends with '# [eaglepatch]', the comment eaglepatch puts "
                             "on the lines it adds, but it is not a line eaglepatch writes: eaglepatch could not tell "
                             "its own lines from it; change that comment")
    patched = instrument(original, rel, recipe)
    assert isinstance(patched, Instrumented)
    with_user = _insert_before(patched.source, cls_line, user)
    assert strip(with_user) == src and strip_lines(with_user) == src


@pytest.mark.parametrize("version,rel,cls_line", FILES, ids=IDS)
def test_a_real_file_with_a_bom(sglang_release, recipe, version, rel, cls_line):
    """The real file saved with a UTF-8 BOM: instrumented as without it, the BOM first; strip gives the bytes."""
    original = _source(sglang_release, version, rel)
    base = instrument(original, rel, recipe)
    res = instrument("\ufeff" + original, rel, recipe)
    assert isinstance(res, Instrumented), res
    assert res.source == "\ufeff" + base.source
    assert strip(res.source).encode("utf-8") == b"\xef\xbb\xbf" + original.encode("utf-8")


# ---------------------------------------------------------------------------------------------------------------
# The timer of each worker


@pytest.mark.parametrize("version,rel,expected", [
    ("0.5.12", "eagle_worker.py", {"EAGLEWorker": "sync"}),
    ("0.5.12", "eagle_worker_v2.py", {"EAGLEWorkerV2": "events"}),
    ("0.5.12", "ngram_worker.py", {"NGRAMWorker": "sync"}),
    ("0.5.12", "frozen_kv_mtp_worker_v2.py", {"FrozenKVMTPWorkerV2": "events"}),
    ("0.5.16", "frozen_kv_mtp_worker_v2.py", {"FrozenKVMTPWorkerV2": "events"}),
    ("0.5.16", "standalone_worker_v2.py", {"StandaloneWorkerV2": "events"}),
    ("0.5.16", "dflash_worker_v2.py", {"DFlashWorkerV2": None}),
])
def test_each_real_worker_gets_its_familys_timer(sglang_release, recipe, version, rel, expected):
    """--mode auto's choice per worker class: V1 and NGRAM sync, V2 events, whoever defines the entry method: a
    class the recipe names gets its family's timer (0.5.12's FrozenKVMTPWorkerV2 inherits the V1
    FrozenKVMTPWorker's method, but it is an overlap-scheduler class of the V2 family: events; in that release its
    __init__ raises NotImplementedError anyway); a subclass no family names gets its base's family's
    (StandaloneWorkerV2: events); an unsupported class none."""
    res = instrument(_source(sglang_release, version, rel), rel, recipe)
    workers: tuple[WorkerInfo, ...] = res.workers  # type: ignore[union-attr]
    assert {w.cls: w.timer for w in workers} == expected
