"""Small hand-written before/after cases for the transform (LibCST codemod-test style).

Each test is one shape from shared/reference/sglang-workers.md ("Shapes that break a naive transform"), a file
property (CRLF, tabs, a hand-edited or already instrumented file), or a refusal. Each docstring says why the
expectation holds. ``assert_codemod`` checks the exact output text, and with it the properties every output must
have: it compiles, stripping it gives back the input byte for byte, and instrumenting it again changes nothing.
"""

from __future__ import annotations

import sys
import textwrap

import pytest

from eaglepatch.transform.engine import (
    MARKER,
    Instrumented,
    NotApplicable,
    Refused,
    analyze,
    instrument,
    is_instrumented,
    strip,
)

PATH = "sglang/srt/speculative/w.py"


def _ok(source: str, recipe) -> Instrumented:
    res = instrument(source, PATH, recipe)
    assert isinstance(res, Instrumented), res.message() if isinstance(res, Refused) else res
    return res


def assert_codemod(before: str, after: str, recipe) -> Instrumented:
    """``instrument(before)`` is exactly ``after``; ``after`` compiles, strips back to ``before`` and is stable."""
    res = _ok(before, recipe)
    assert res.source == after
    assert res.changed is True and res.was_patched is False
    compile(after, PATH, "exec", dont_inherit=True)
    assert strip(after) == before
    again = _ok(after, recipe)
    assert again.source == after and again.changed is False and again.was_patched is True
    return res


def _refused(source: str, recipe) -> Refused:
    res = instrument(source, PATH, recipe)
    assert isinstance(res, Refused), f"expected a refusal, got {type(res).__name__}"
    msg = res.message()
    assert "\n" not in msg, "the refusal is one line"
    assert msg.startswith(PATH), msg
    return res


def _lines_of(res: Instrumented, cls: str) -> list[tuple[str, str, int, str]]:
    w = next(w for w in res.workers if w.cls == cls)
    return [(p.phase, p.mode, p.line, p.form) for p in w.phases]


def _in(block: str, indent: int) -> str:
    return textwrap.indent(textwrap.dedent(block), " " * indent)


# ---------------------------------------------------------------------------------------------------------------
# Sources


V1_BEFORE = '''\
"""A V1 worker: every statement form of the decode path in one method."""
import torch

from sglang.srt.managers.tp_worker import TpModelWorker


class EAGLEWorker(TpModelWorker):
    def forward_batch_generation(self, batch):
        if batch.forward_mode.is_extend():
            logits_output, next_token_ids = self.forward_target_extend(batch)
            self.forward_draft_extend(batch, logits_output.hidden_states, next_token_ids)
            return logits_output, next_token_ids
        else:
            spec_info = self.draft(batch)
            logits_output, verify_output, _ = self.verify(batch, spec_info)
            if batch.spec_info.verified_id is not None:
                self.forward_draft_extend_after_decode(batch)
            return logits_output, verify_output.verified_id
'''

V1_AFTER = '''\
"""A V1 worker: every statement form of the decode path in one method."""
import torch

from sglang.srt.managers.tp_worker import TpModelWorker
from . import _eaglepatch_runtime as _eaglepatch  # [eaglepatch]


class EAGLEWorker(TpModelWorker):
    @_eaglepatch.entry  # [eaglepatch]
    def forward_batch_generation(self, batch):
        if batch.forward_mode.is_extend():
            _eaglepatch.begin("target", "prefill")  # [eaglepatch]
            logits_output, next_token_ids = self.forward_target_extend(batch)
            _eaglepatch.end("target")  # [eaglepatch]
            _eaglepatch.begin("draft_extend", "prefill")  # [eaglepatch]
            self.forward_draft_extend(batch, logits_output.hidden_states, next_token_ids)
            _eaglepatch.end("draft_extend")  # [eaglepatch]
            return logits_output, next_token_ids
        else:
            _eaglepatch.begin("draft", "decode")  # [eaglepatch]
            spec_info = self.draft(batch)
            _eaglepatch.end("draft")  # [eaglepatch]
            _eaglepatch.begin("verify", "decode")  # [eaglepatch]
            logits_output, verify_output, _ = self.verify(batch, spec_info)
            _eaglepatch.end("verify")  # [eaglepatch]
            _eaglepatch.accepted(verify_output, ("accept_length_per_req_cpu", "num_correct_drafts_per_req_cpu",), 1)  # [eaglepatch]
            if batch.spec_info.verified_id is not None:
                _eaglepatch.begin("draft_extend", "decode")  # [eaglepatch]
                self.forward_draft_extend_after_decode(batch)
                _eaglepatch.end("draft_extend")  # [eaglepatch]
            return logits_output, verify_output.verified_id
'''  # noqa: E501


def v2(decode: str, prefill: str | None = None, extra: str = "") -> str:
    """An EAGLEWorkerV2 module whose entry method runs ``prefill`` / ``decode`` (8-space bodies given dedented)."""
    prefill = prefill if prefill is not None else """\
        batch_output = self.target_worker.forward_batch_generation(batch)
        batch_output.next_draft_input = self.draft_worker._draft_extend_for_prefill(batch, batch_output)
        return batch_output
        """
    return (
        "import torch\n"
        "\n"
        "\n"
        "class EAGLEWorkerV2(BaseSpecWorker):\n"
        "    def forward_batch_generation(self, batch, on_publish=None):\n"
        "        if batch.forward_mode.is_extend():\n"
        + _in(prefill, 12)
        + "        else:\n"
        + _in(decode, 12)
        + (("\n" + _in(extra, 4)) if extra else "")
    )


V2_DECODE = """\
verify_input: EagleVerifyInput = self.draft_worker.draft(batch)
batch_output = self.verify(batch)
self.draft_worker._draft_extend_for_decode(batch, batch_output)
return batch_output
"""


# ---------------------------------------------------------------------------------------------------------------
# Statement forms


def test_v1_plain_call_assign_and_tuple_unpack(recipe):
    """The V1 shapes: a plain call (draft extend), an Assign (draft), a tuple unpack (target, verify), a phase
    under an ``if`` (decode draft extend). begin/end wrap each statement at its own indentation, the import goes
    after the last top-level import, the decorator above the def, and accepted is read right after verify from
    the name the recipe names (verify_output), with the bonus token (1 per request)."""
    res = assert_codemod(V1_BEFORE, V1_AFTER, recipe)
    assert _lines_of(res, "EAGLEWorker") == [
        ("target", "prefill", 10, "statement"),
        ("draft_extend", "prefill", 11, "statement"),
        ("draft", "decode", 14, "statement"),
        ("verify", "decode", 15, "statement"),
        ("draft_extend", "decode", 17, "statement"),
    ]
    (fact,) = res.workers[0].facts
    assert (fact.expr, fact.line, fact.bonus_per_req) == ("verify_output", 15, 1)
    assert res.warnings == ()


def test_annassign_is_one_statement(recipe):
    """``verify_input: EagleVerifyInput = self.draft_worker.draft(batch)`` (V2) is an AnnAssign: one
    SimpleStatementLine, wrapped like an Assign."""
    res = _ok(v2(V2_DECODE), recipe)
    assert _in("""\
        _eaglepatch.begin("draft", "decode")  # [eaglepatch]
        verify_input: EagleVerifyInput = self.draft_worker.draft(batch)
        _eaglepatch.end("draft")  # [eaglepatch]
        _eaglepatch.begin("verify", "decode")  # [eaglepatch]
        batch_output = self.verify(batch)
        _eaglepatch.end("verify")  # [eaglepatch]
        _eaglepatch.accepted(batch_output, ("accept_lens",), 0)  # [eaglepatch]
        """, 12) in res.source


def test_tuple_unpack_parenthesised_on_the_left(recipe):
    """``(a, b, c) = call(...)`` over several lines is still one statement: begin goes before its first line
    (the ``(``), end after its last (the call)."""
    src = V1_BEFORE.replace(
        "            logits_output, next_token_ids = self.forward_target_extend(batch)\n",
        "            (\n"
        "                logits_output,\n"
        "                next_token_ids,\n"
        "            ) = self.forward_target_extend(batch)\n",
    )
    res = _ok(src, recipe)
    assert _in("""\
        _eaglepatch.begin("target", "prefill")  # [eaglepatch]
        (
            logits_output,
            next_token_ids,
        ) = self.forward_target_extend(batch)
        _eaglepatch.end("target")  # [eaglepatch]
        """, 12) in res.source
    assert strip(res.source) == src


def test_tuple_unpack_parenthesised_on_the_right(recipe):
    """``a, b, c = (\\n self.verify(...)\\n)``: the statement ends at the closing parenthesis; end and the
    accepted read come after it, never between the parentheses."""
    src = V1_BEFORE.replace(
        "            logits_output, verify_output, _ = self.verify(batch, spec_info)\n",
        "            logits_output, verify_output, _ = (\n"
        "                self.verify(batch, spec_info)\n"
        "            )\n",
    )
    res = _ok(src, recipe)
    assert _in("""\
        _eaglepatch.begin("verify", "decode")  # [eaglepatch]
        logits_output, verify_output, _ = (
            self.verify(batch, spec_info)
        )
        _eaglepatch.end("verify")  # [eaglepatch]
        _eaglepatch.accepted(verify_output, ("accept_length_per_req_cpu", "num_correct_drafts_per_req_cpu",), 1)  # [eaglepatch]
        """, 12) in res.source  # noqa: E501
    site = next(p for p in res.workers[0].phases if p.phase == "verify")
    assert (site.line, site.end_line) == (15, 17)


def test_attribute_target(recipe):
    """``batch_output.next_draft_input = self.draft_worker._draft_extend_for_prefill(...)`` assigns to an
    attribute: still a statement of its own, wrapped whole."""
    res = _ok(v2(V2_DECODE), recipe)
    assert _in("""\
        _eaglepatch.begin("draft_extend", "prefill")  # [eaglepatch]
        batch_output.next_draft_input = self.draft_worker._draft_extend_for_prefill(batch, batch_output)
        _eaglepatch.end("draft_extend")  # [eaglepatch]
        return batch_output
        """, 12) in res.source


def test_call_inside_return_gets_begin_only(recipe):
    """``return self.verify(batch)``: nothing can run after the return, so only begin is inserted; the runtime
    closes a phase still open at the end of the cycle. No accepted read is possible (nothing is bound), which is
    a warning, not a refusal."""
    decode = """\
        verify_input: EagleVerifyInput = self.draft_worker.draft(batch)
        self.draft_worker._draft_extend_for_decode(batch, None)
        return self.verify(batch)
        """
    res = _ok(v2(decode), recipe)
    assert _in("""\
        _eaglepatch.begin("verify", "decode")  # [eaglepatch]
        return self.verify(batch)
        """, 12) in res.source
    assert '_eaglepatch.end("verify")' not in res.source
    assert ("verify", "decode", 13, "return") in _lines_of(res, "EAGLEWorkerV2")
    assert res.workers[0].facts == ()
    assert any("accepted tokens not found" in w for w in res.warnings)


def test_with_block_followed_by_return(recipe):
    """V2 0.5.7-0.5.19: the prefill draft extend sits in a ``with`` block that ends with ``return``. End goes
    right after the statement, inside the with and before the return (after the with it would never run)."""
    prefill = """\
        batch_output = self.target_worker.forward_batch_generation(batch)
        with self.draft_worker.draft_tp_context(self.draft_worker.draft_runner.tp_group):
            batch_output.next_draft_input = self.draft_worker._draft_extend_for_prefill(
                batch,
                batch_output.logits_output.hidden_states,
            )
            return batch_output
        """
    res = _ok(v2(V2_DECODE, prefill), recipe)
    assert _in("""\
        with self.draft_worker.draft_tp_context(self.draft_worker.draft_runner.tp_group):
            _eaglepatch.begin("draft_extend", "prefill")  # [eaglepatch]
            batch_output.next_draft_input = self.draft_worker._draft_extend_for_prefill(
                batch,
                batch_output.logits_output.hidden_states,
            )
            _eaglepatch.end("draft_extend")  # [eaglepatch]
            return batch_output
        """, 12) in res.source


def test_parenthesised_multi_item_with(recipe):
    """``with (a, b, c):`` (0.5.12+) spreads its header over several lines; the phase is in the body, so the
    lines go inside the body, after the header's closing ``):``."""
    decode = """\
        with (
            draft_tp_context(self.draft_worker.parallel_layout),
            speculative_moe_backend_context(),
            spec_stage_span("draft"),
        ):
            verify_input: EagleVerifyInput = self.draft_worker.draft(batch)
        batch_output = self.verify(batch)
        self.draft_worker._draft_extend_for_decode(batch, batch_output)
        return batch_output
        """
    res = _ok(v2(decode), recipe)
    assert _in("""\
            spec_stage_span("draft"),
        ):
            _eaglepatch.begin("draft", "decode")  # [eaglepatch]
            verify_input: EagleVerifyInput = self.draft_worker.draft(batch)
            _eaglepatch.end("draft")  # [eaglepatch]
        """, 12) in res.source


def test_tail_draft_with_topology_is_a_second_draft_site(recipe):
    """0.5.21+: ``self.draft_worker.draft(batch, with_topology=True)`` under the pipeline-parallel ``if`` is the
    next round's draft. The recipe allows it besides the plain draft (it accumulates into "draft"), so the draft
    call appearing twice is not ambiguous here; both are wrapped."""
    decode = """\
        verify_input: EagleVerifyInput = self.draft_worker.draft(batch)
        batch_output = self.verify(batch)
        self.draft_worker._draft_extend_for_decode(batch, batch_output)
        if get_parallel().pp_size > 1:
            next_verify_input, parent_list, top_scores_index = (
                self.draft_worker.draft(batch, with_topology=True)
            )
        return batch_output
        """
    res = _ok(v2(decode), recipe)
    assert [p[0] for p in _lines_of(res, "EAGLEWorkerV2")].count("draft") == 2
    assert _in("""\
        if get_parallel().pp_size > 1:
            _eaglepatch.begin("draft", "decode")  # [eaglepatch]
            next_verify_input, parent_list, top_scores_index = (
                self.draft_worker.draft(batch, with_topology=True)
            )
            _eaglepatch.end("draft")  # [eaglepatch]
        return batch_output
        """, 12) in res.source


def test_plan_for_decode_lookalike_is_not_a_phase(recipe):
    """MultiLayer V2 0.5.21+: ``self.draft_worker._draft_extend_plan_for_decode(batch)`` runs before verify. It is
    not ``_draft_extend_for_decode`` (callees are matched by their full dotted name, not a prefix), so it gets no
    lines, and the real draft extend after verify is still the one timed."""
    decode = V2_DECODE.replace(
        "batch_output = self.verify(batch)\n",
        "staged = self.draft_worker._draft_extend_plan_for_decode(batch)\nbatch_output = self.verify(batch)\n",
    ).replace("_draft_extend_for_decode(batch, batch_output)", "_draft_extend_for_decode(batch, batch_output, staged=staged)")
    src = v2(decode).replace("class EAGLEWorkerV2", "class MultiLayerEagleWorkerV2")
    res = _ok(src, recipe)
    before_plan = res.source.split("staged = self.draft_worker._draft_extend_plan_for_decode(batch)")[0]
    assert before_plan.endswith('_eaglepatch.end("draft")  # [eaglepatch]\n            ')
    assert _in("""\
        staged = self.draft_worker._draft_extend_plan_for_decode(batch)
        _eaglepatch.begin("verify", "decode")  # [eaglepatch]
        """, 12) in res.source
    assert [p[0] for p in _lines_of(res, "MultiLayerEagleWorkerV2")] == [
        "target", "draft_extend", "draft", "verify", "draft_extend"]


def test_prefill_helpers_hold_the_phases(recipe):
    """0.5.21+: the entry method's prefill is only ``return self._forward_prefill_batch(...)``; the target and
    draft-extend calls are found in the recipe's helper methods. Only the entry method is decorated (one record
    per cycle); the helper's phases are timed inside it."""
    extra = """\
    def _forward_prefill_batch(self, batch, on_publish=None):
        batch_output = self.target_worker.forward_batch_generation(batch)
        batch_output.next_draft_input = self.draft_worker._draft_extend_for_prefill(batch, batch_output)
        return batch_output
    """
    src = v2(V2_DECODE, prefill="return self._forward_prefill_batch(batch, on_publish)\n", extra=extra)
    res = _ok(src, recipe)
    assert res.source.count("@_eaglepatch.entry") == 1
    sites = [(p.phase, p.method) for p in res.workers[0].phases]
    assert ("target", "_forward_prefill_batch") in sites and ("draft_extend", "_forward_prefill_batch") in sites
    assert _in("""\
    def _forward_prefill_batch(self, batch, on_publish=None):
        _eaglepatch.begin("target", "prefill")  # [eaglepatch]
        batch_output = self.target_worker.forward_batch_generation(batch)
        _eaglepatch.end("target")  # [eaglepatch]
        """, 4) in res.source
    # The return of the helper's result is not a phase: nothing before it.
    assert "            return self._forward_prefill_batch(batch, on_publish)\n" in res.source
    assert '_eaglepatch.begin("target", "prefill")  # [eaglepatch]\n            return self._forward' not in res.source


def test_early_return_after_target_forward(recipe):
    """0.5.19+: a pipeline rank without a draft worker returns right after the target forward. The target phase
    has ended before that return (end comes right after the statement), so the cycle record is complete with
    just the target phase."""
    prefill = """\
        batch_output = self.target_worker.forward_batch_generation(batch)
        if self._draft_worker is None:
            return batch_output
        batch_output.next_draft_input = self.draft_worker._draft_extend_for_prefill(batch, batch_output)
        return batch_output
        """
    res = _ok(v2(V2_DECODE, prefill), recipe)
    assert _in("""\
        _eaglepatch.begin("target", "prefill")  # [eaglepatch]
        batch_output = self.target_worker.forward_batch_generation(batch)
        _eaglepatch.end("target")  # [eaglepatch]
        if self._draft_worker is None:
            return batch_output
        _eaglepatch.begin("draft_extend", "prefill")  # [eaglepatch]
        """, 12) in res.source


def test_several_worker_classes_share_one_import(recipe):
    """A file with two recipe classes (V1 and MultiLayer V1 shapes) gets one import and one decorator per class."""
    second = V1_BEFORE.split("class EAGLEWorker(TpModelWorker):\n")[1]
    src = V1_BEFORE + "\n\nclass MultiLayerEagleWorker(TpModelWorker):\n" + second
    res = _ok(src, recipe)
    assert res.source.count("from . import _eaglepatch_runtime as _eaglepatch") == 1
    assert res.source.count("@_eaglepatch.entry") == 2
    assert [w.cls for w in res.workers] == ["EAGLEWorker", "MultiLayerEagleWorker"]
    assert strip(res.source) == src


# ---------------------------------------------------------------------------------------------------------------
# Where the import goes


_MIN_V2_BODY = '''\
class EAGLEWorkerV2(B):
    def forward_batch_generation(self, b):
        x = self.target_worker.forward_batch_generation(b)
        y = self.draft_worker._draft_extend_for_prefill(b)
        v = self.draft_worker.draft(b)
        o = self.verify(b)
        self.draft_worker._draft_extend_for_decode(b, o)
'''


@pytest.mark.parametrize(
    "head,expected_head",
    [
        ("", "from . import _eaglepatch_runtime as _eaglepatch  # [eaglepatch]\n"),
        ('"""Doc\nstring."""\n\n', '"""Doc\nstring."""\nfrom . import _eaglepatch_runtime as _eaglepatch  # [eaglepatch]\n\n'),
        ('"""Doc."""\nfrom __future__ import annotations\n\n',
         '"""Doc."""\nfrom __future__ import annotations\nfrom . import _eaglepatch_runtime as _eaglepatch  # [eaglepatch]\n\n'),
    ],
    ids=["no-docstring-no-imports", "docstring-only", "future-import"],
)
def test_import_placement(recipe, head, expected_head):
    """The runtime import goes after the last top-level import before the first class (after a module docstring
    when there is no import, at the very top when there is neither): never before a ``__future__`` import, never
    inside the docstring."""
    res = _ok(head + _MIN_V2_BODY, recipe)
    assert res.source.startswith(expected_head + "class EAGLEWorkerV2(B):\n    @_eaglepatch.entry  # [eaglepatch]\n")
    compile(res.source, PATH, "exec", dont_inherit=True)


# ---------------------------------------------------------------------------------------------------------------
# Line endings, indentation, edited files


def test_crlf_line_endings(recipe):
    """A CRLF file: every added line ends with CRLF too (each copies the line ending of the line it sits by),
    nothing else changes, and strip gives the CRLF bytes back."""
    crlf = V1_BEFORE.replace("\n", "\r\n")
    res = _ok(crlf, recipe)
    assert res.source == V1_AFTER.replace("\n", "\r\n")
    assert all(line.endswith("\r\n") for line in res.source.splitlines(keepends=True))
    assert strip(res.source).encode() == crlf.encode()
    again = _ok(res.source, recipe)
    assert again.source == res.source and again.changed is False


@pytest.mark.parametrize("indent", ["\t", "  "], ids=["tabs", "two-spaces"])
def test_tab_and_two_space_indentation(recipe, indent):
    """A file indented with tabs (or two spaces): the added lines copy the indentation of the statement they wrap,
    so the output is the 4-space output with that indentation."""
    def reindent(text: str) -> str:
        out = []
        for line in text.splitlines(keepends=True):
            n = len(line) - len(line.lstrip(" "))
            out.append(indent * (n // 4) + line[n:])
        return "".join(out)

    assert_codemod(reindent(V1_BEFORE), reindent(V1_AFTER), recipe)


def test_file_edited_by_hand_before_patching(recipe):
    """Someone added their own lines (a log call, a comment, a timer of their own) to the worker: the phase calls
    are found by shape, not by line number, so the file is still instrumented, and strip gives back their
    edited file, not the release's."""
    edited = V1_BEFORE.replace(
        "            spec_info = self.draft(batch)\n",
        "            # local change: log every decode\n"
        "            logger.info('decode bs=%d', len(batch.reqs))\n"
        "            t0 = time.perf_counter()\n"
        "            spec_info = self.draft(batch)\n"
        "            draft_s = time.perf_counter() - t0\n",
    )
    res = _ok(edited, recipe)
    assert _in("""\
        t0 = time.perf_counter()
        _eaglepatch.begin("draft", "decode")  # [eaglepatch]
        spec_info = self.draft(batch)
        _eaglepatch.end("draft")  # [eaglepatch]
        draft_s = time.perf_counter() - t0
        """, 12) in res.source
    assert strip(res.source) == edited


def test_patched_file_edited_by_hand_is_patched_again(recipe):
    """A patched file that someone then edited (one of our end lines deleted, a line of their own added): strip
    keeps their line and drops ours; instrumenting again gives exactly what instrumenting their edited original
    gives, and reports a change."""
    patched = V1_AFTER.replace('            _eaglepatch.end("draft")  # [eaglepatch]\n', "")
    patched = patched.replace(
        "            return logits_output, verify_output.verified_id\n",
        "            stats.decode_cycles += 1\n            return logits_output, verify_output.verified_id\n",
    )
    their_original = V1_BEFORE.replace(
        "            return logits_output, verify_output.verified_id\n",
        "            stats.decode_cycles += 1\n            return logits_output, verify_output.verified_id\n",
    )
    assert strip(patched) == their_original
    res = _ok(patched, recipe)
    assert res.was_patched is True and res.changed is True
    assert res.source == _ok(their_original, recipe).source


def test_already_instrumented_input_changes_nothing(recipe):
    """Instrumenting an instrumented file is a no-op: same text, changed False, was_patched True (the patch is
    recognised by its marked lines and re-derived from the stripped original, which gives the same lines)."""
    res = _ok(V1_AFTER, recipe)
    assert res.source == V1_AFTER
    assert res.changed is False and res.was_patched is True
    assert is_instrumented(V1_AFTER) and not is_instrumented(V1_BEFORE)


def test_strip_of_an_untouched_file_is_the_identity(recipe):
    """strip only removes lines that end with the marker; a file without it comes back as it is."""
    assert strip(V1_BEFORE) == V1_BEFORE
    assert MARKER not in V1_BEFORE


def test_strip_works_on_a_patched_file_that_no_longer_parses(recipe):
    """If someone broke the patched file's syntax, strip still removes exactly our lines (by their shape)."""
    broken = V1_AFTER.replace("    def forward_batch_generation(self, batch):\n", "    def forward_batch_generation(self, batch)\n")
    expected = V1_BEFORE.replace("    def forward_batch_generation(self, batch):\n", "    def forward_batch_generation(self, batch)\n")
    assert strip(broken) == expected


def test_analyze_reports_without_changing(recipe):
    """analyze finds what instrument would, with the lines of the source as given, and returns it unchanged."""
    res = analyze(V1_BEFORE, PATH, recipe)
    assert isinstance(res, Instrumented)
    assert res.source == V1_BEFORE and res.changed is False
    assert _lines_of(res, "EAGLEWorker") == _lines_of(_ok(V1_BEFORE, recipe), "EAGLEWorker")


def test_decorated_entry_method(recipe):
    """An entry method that already has a decorator: ours goes above it (outermost, so the whole decorated call is
    the cycle), and the phase lines stay where they belong."""
    before = V1_BEFORE.replace(
        "    def forward_batch_generation(self, batch):\n", "    @torch.no_grad()\n    def forward_batch_generation(self, batch):\n"
    )
    after = V1_AFTER.replace(
        "    @_eaglepatch.entry  # [eaglepatch]\n",
        "    @_eaglepatch.entry  # [eaglepatch]\n    @torch.no_grad()\n",
    )
    assert_codemod(before, after, recipe)


# ---------------------------------------------------------------------------------------------------------------
# Not ours


def test_subclass_without_entry_method_inherits(recipe):
    """StandaloneWorker(EAGLEWorker) defines no entry method: the base class's instrumented method times it, so the
    file is not applicable (nothing to patch), and show can say why."""
    src = "from sglang.srt.speculative.eagle_worker import EAGLEWorker\n\n\nclass StandaloneWorker(EAGLEWorker):\n    pass\n"
    res = instrument(src, PATH, recipe)
    assert isinstance(res, NotApplicable)
    (w,) = res.workers
    assert (w.cls, w.status) == ("StandaloneWorker", "inherits")


def test_known_unsupported_class_is_listed_with_its_reason(recipe):
    """DFlashWorker has no draft()/verify() call to time: not applicable, with the recipe's reason, never a
    refusal (it must not make apply fail for the other files)."""
    src = "class DFlashWorker(TpModelWorker):\n    def forward_batch_generation(self, batch):\n        return self.x(batch)\n"
    res = instrument(src, PATH, recipe)
    assert isinstance(res, NotApplicable)
    (w,) = res.workers
    assert w.status == "unsupported" and "DFlash" in w.reason


def test_file_without_workers_is_not_applicable(recipe):
    """A module with no recipe class and no entry method is simply not ours."""
    res = instrument("import os\n\n\nclass Foo:\n    pass\n", PATH, recipe)
    assert isinstance(res, NotApplicable) and res.workers == ()


# ---------------------------------------------------------------------------------------------------------------
# Refusals: one line, naming the file, the class and the line


def test_refuses_a_missing_phase(recipe):
    """No verify call where the recipe requires one: an unknown layout. Nothing is instrumented; the message
    names the class and the entry method's line."""
    src = V1_BEFORE.replace(
        "            logits_output, verify_output, _ = self.verify(batch, spec_info)\n",
        "            logits_output, verify_output, _ = self.check(batch, spec_info)\n",
    )
    r = _refused(src, recipe)
    assert (r.cls, r.line) == ("EAGLEWorker", 8)
    assert "'verify'" in r.reason and "not found" in r.reason
    assert r.message().startswith(f"{PATH}:8 (EAGLEWorker): ")


def test_refuses_a_phase_present_twice(recipe):
    """Two draft calls in one method where the recipe expects one: which to time is ambiguous. The message names
    both lines."""
    src = V1_BEFORE.replace(
        "            spec_info = self.draft(batch)\n",
        "            spec_info = self.draft(batch)\n            spec_info = self.draft(batch)\n",
    )
    r = _refused(src, recipe)
    assert (r.cls, r.line) == ("EAGLEWorker", 15)
    assert "twice" in r.reason and "14" in r.reason and "15" in r.reason


def test_refuses_a_phase_call_in_an_if_header(recipe):
    """``if self.draft(batch):``: no line can be put around a call in a compound statement's header."""
    src = V1_BEFORE.replace(
        "            spec_info = self.draft(batch)\n", "            if self.draft(batch):\n                pass\n"
    )
    r = _refused(src, recipe)
    assert (r.cls, r.line) == ("EAGLEWorker", 14)
    assert "header" in r.reason


def test_refuses_a_phase_call_in_an_elif_header(recipe):
    """``elif self.draft(batch):`` is a header like ``if``: refused, not ignored."""
    src = V1_BEFORE.replace(
        "        else:\n            spec_info = self.draft(batch)\n",
        "        elif self.draft(batch):\n            pass\n        else:\n            spec_info = self.draft(batch)\n",
    )
    r = _refused(src, recipe)
    assert (r.cls, r.line) == ("EAGLEWorker", 13)


def test_refuses_a_phase_call_in_a_one_line_suite(recipe):
    """``if x: self.forward_draft_extend_after_decode(batch)`` on one line: begin/end cannot be added inside it."""
    src = V1_BEFORE.replace(
        "            if batch.spec_info.verified_id is not None:\n                self.forward_draft_extend_after_decode(batch)\n",
        "            if batch.spec_info.verified_id is not None: self.forward_draft_extend_after_decode(batch)\n",
    )
    r = _refused(src, recipe)
    assert (r.cls, r.line) == ("EAGLEWorker", 16)
    assert "one-line" in r.reason


def test_refuses_two_phase_calls_in_one_statement(recipe):
    """``self.verify(batch, self.draft(batch))``: two phases in one statement cannot be timed apart."""
    src = V1_BEFORE.replace(
        "            spec_info = self.draft(batch)\n            logits_output, verify_output, _ = self.verify(batch, spec_info)\n",
        "            logits_output, verify_output, _ = self.verify(batch, self.draft(batch))\n",
    )
    r = _refused(src, recipe)
    assert (r.cls, r.line) == ("EAGLEWorker", 14)
    assert "several phase calls" in r.reason


def test_refuses_a_file_that_does_not_parse(recipe):
    """A syntax error: refused with the file and a line, nothing else attempted."""
    src = V1_BEFORE.replace("    def forward_batch_generation(self, batch):\n", "    def forward_batch_generation(self, batch)\n")
    r = _refused(src, recipe)
    assert "does not parse" in r.reason and r.line is not None


@pytest.mark.parametrize(
    "tail",
    ["x = '\x00'\n"] + (["type Alias = int\n"] if sys.version_info < (3, 12) else []),
    ids=["nul-byte"] + (["pep695-on-old-python"] if sys.version_info < (3, 12) else []),
)
def test_refuses_source_this_python_cannot_parse(recipe, tail):
    """Whatever the parser that rejects it, a file that does not parse is a refusal (a value), never an
    exception out of the pure core."""
    r = _refused(V1_BEFORE + tail, recipe)
    assert "parse" in r.reason


def test_refuses_both_entry_names(recipe):
    """A class defining both forward_batch_generation and forward_batch_speculative_generation: which one the
    scheduler calls depends on the release, so which to time is ambiguous."""
    src = V1_BEFORE + "\n    def forward_batch_speculative_generation(self, batch):\n        return None\n"
    r = _refused(src, recipe)
    assert r.cls == "EAGLEWorker" and r.line == 20
    assert "both" in r.reason


def test_refuses_an_async_entry_method(recipe):
    """An ``async def`` entry method is not a shape the runtime's decorator can time."""
    r = _refused(V1_BEFORE.replace("    def forward_batch_generation", "    async def forward_batch_generation"), recipe)
    assert (r.cls, r.line) == ("EAGLEWorker", 8)


def test_refusal_line_is_a_line_of_the_file_given(recipe):
    """A patched file someone edited so that verify is gone: the refusal's line points at the entry method in
    the file as it is (the patched one), so a person can go there."""
    edited = V1_AFTER.replace(
        "            logits_output, verify_output, _ = self.verify(batch, spec_info)\n",
        "            logits_output, verify_output, _ = self.check(batch, spec_info)\n",
    )
    r = _refused(edited, recipe)
    line = edited.splitlines()[r.line - 1].strip()
    assert line.startswith(("def forward_batch_generation", "@_eaglepatch.entry")), line


def test_strip_leaves_a_marker_inside_a_string_alone():
    """A line that looks like one of ours but sits inside a string literal is the user's text: strip finds what to
    remove with libcst (statements and decorators carrying the marker comment), so only the real added line goes."""
    from eaglepatch.transform.engine import strip

    src = 'x = 1\ns = """\ny = 2  # [eaglepatch]\n"""\n_eaglepatch.begin("draft", "decode")  # [eaglepatch]\n'
    assert strip(src) == 'x = 1\ns = """\ny = 2  # [eaglepatch]\n"""\n'


# ---------------------------------------------------------------------------------------------------------------
# libcst parses only the methods it scans (the entry method and the family's helpers), each with the lines around
# it that the file has: what stands before the method in its class must not change what is found or where.

_V1_METHOD = V1_BEFORE[V1_BEFORE.index("    def forward_batch_generation"):]
_V1_HEAD = V1_BEFORE[: V1_BEFORE.index("class EAGLEWorker")]

_LAYOUTS = {
    # the method first in its class, under a class header of several lines with comments in it and after it
    "first-under-a-long-header": _V1_HEAD + "@some.decorator(\n    1)\nclass EAGLEWorker(  # a comment\n"
    "    TpModelWorker,\n    metaclass=type,\n):\n    # a comment before the method\n\n" + _V1_METHOD,
    # after a docstring, an attribute of several lines, blank lines, comments, a method with a decorator
    "after-other-statements": _V1_HEAD + 'class EAGLEWorker(TpModelWorker):\n    """Doc."""\n\n    table = {\n'
    '        "a": 1,\n    }  # trailing\n\n    @staticmethod\n    def helper(x):\n        return x\n\n'
    "    # about the entry method\n" + _V1_METHOD,
    # a decorator whose expression is in parentheses on lines of its own (ast puts its line below the "@")
    "parenthesised-decorator": _V1_HEAD + "class EAGLEWorker(TpModelWorker):\n    @(\n        lambda f: f\n    )\n"
    + _V1_METHOD,
    # the entry method last in the file, without a final newline
    "no-final-newline": V1_BEFORE.rstrip("\n"),
    # a method after it, and a second definition of a helper name before it
    "methods-after": V1_BEFORE + "\n    def other(self):\n        return self.draft(None)\n",
}


@pytest.mark.parametrize("layout", sorted(_LAYOUTS))
def test_what_stands_around_the_entry_method_changes_nothing_found(recipe, layout):
    """The same entry method in other surroundings: the same lines are added, each at the same statement, the
    decorator above the method's first decorator, and the output strips back to the input."""
    src = _LAYOUTS[layout]
    res = _ok(src, recipe)
    marked = [line.strip() for line in res.source.splitlines() if MARKER in line]
    assert marked == [line.strip() for line in V1_AFTER.splitlines() if MARKER in line]
    assert strip(res.source) == src
    compile(res.source, PATH, "exec", dont_inherit=True)
    out = res.source.splitlines()
    src_lines = src.splitlines()
    w = next(w for w in res.workers if w.cls == "EAGLEWorker")
    assert src_lines[w.method_start - 1].lstrip().startswith("def forward_batch_generation")
    assert src_lines[w.method_end - 1].strip() == "return logits_output, verify_output.verified_id"
    for p in w.phases:  # each phase line of the input holds its call
        assert f"self.{p.call.split('.')[-1]}(" in src_lines[p.line - 1], (p, src_lines[p.line - 1])
    for i, line in enumerate(out):  # each begin line sits right above its call, at its indentation
        if "_eaglepatch.begin(" in line:
            nxt = out[i + 1]
            assert MARKER not in nxt and nxt[: len(nxt) - len(nxt.lstrip())] == line[: len(line) - len(line.lstrip())]
    entry = out.index("    @_eaglepatch.entry  # [eaglepatch]")
    assert out[entry + 1].lstrip().startswith(("def forward_batch_generation", "@"))


def test_a_tab_indented_class_after_a_statement(recipe):
    src = _V1_HEAD + "class EAGLEWorker(TpModelWorker):\n\tx = 1\n" + _V1_METHOD.replace("    ", "\t")
    res = _ok(src, recipe)
    assert strip(res.source) == src
    assert "\t@_eaglepatch.entry  # [eaglepatch]\n\tdef forward_batch_generation" in res.source
    assert "\t\t\t_eaglepatch.begin(\"draft\", \"decode\")  # [eaglepatch]\n\t\t\tspec_info = self.draft(batch)" \
        in res.source


def test_calls_are_found_in_source_order_as_a_visitor_finds_them(monkeypatch):
    """``_positions`` walks the nodes' fields itself: the same calls as a CSTVisitor, in the same (source) order,
    including those inside lambdas, comprehensions, nested defs and classes, each with why it may not run once
    with its statement; ``a if b else c`` in that order though its fields say b, a, c."""
    import libcst as cst

    from eaglepatch.transform import engine
    from eaglepatch.transform.engine import _positions

    monkeypatch.setattr(engine, "_FIELDS", {})  # the fields of each node type, computed afresh for this test

    class Visitor(cst.CSTVisitor):
        def __init__(self):
            super().__init__()
            self.found = []

        def visit_Call(self, n):
            self.found.append(n)

    src = ("x = a(b(c), k=d()) if e(f) else g[h()]((lambda: i()), *j(), **k())\n"
           "y: T[m()] = [n(o) for p in q() if r()] + {s(): t() for u in v()}\n"
           "z = f'{w()!r:{x()}}' and (yield aa()) or not bb(cc := dd())\n"
           "del ee()[ff()]; assert gg(), hh()\n"
           "with ii() as jj, kk(): pass\n"
           "@dec(xx())\ndef ll(a=yy(), /, p=mm(), *q, r=zz()) -> ww():\n    return nn()\n"
           "class oo(pp()):\n    qq = rr()\n")
    module = cst.parse_module(src)
    found = []
    for stmt in module.body:
        v = Visitor()
        stmt.visit(v)
        ours = _positions(stmt, frozenset(), frozenset()).calls
        assert [id(c) for c, _why in ours] == [id(c) for c in v.found]
        found += [(module.code_for_node(c.func), why) for c, why in ours]
    names = [n for n, _why in found]
    assert names[:5] == ["a", "b", "d", "e", "g[h()]"]
    why = dict(found)
    assert why["e"] is None and why["b"] and "conditional" in why["b"] and "conditional" in why["i"]
    assert "lambda" not in why["i"]  # the outermost reason wins: the lambda sits in the else branch
    assert "annotation" in why["m"] and "comprehension" in why["n"] and "comprehension" in why["q"]
    assert "f-string" in why["w"] and why["bb"] and "'and'/'or'" in why["bb"]
    assert why["ee"] is None and why["ii"] is None
    assert "default argument" in why["mm"] and "defined in the method" in why["nn"]
    assert "defined in the method" in why["pp"] and "defined in the method" in why["rr"]
