"""Which EAGLE draft shapes sglang refuses: ``check_speculative_point(flags)`` says why sglang would refuse (or crash
on) the EAGLE speculative flags a sweep point would launch with, as one line naming the numbers; None when it would
start.

Pure: launch flags in (name without ``--`` -> value as written), one line or None out; the rules hold in every pinned
release, and the comments say where sglang enforces each.
"""

from __future__ import annotations

from typing import Mapping

_EAGLE_FAMILY = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE")
_ON = ("on", "true", "yes", "1")


def _int(flags: Mapping[str, str], name: str) -> tuple[int | None, str | None]:
    """(value, error) of ``--name`` as argparse's ``type=int`` reads it (Python's ``int(text)``)."""
    text = flags.get(name)
    if text is None:
        return None, None
    try:
        return int(text), None
    except ValueError:
        return None, f"--{name} {text!r} is not an integer: sglang's argparse (type=int) refuses it at start"


def draft_tree_candidates(steps: int, topk: int) -> int:
    """How many draft tokens an EAGLE tree of ``steps`` steps and top-k ``topk`` proposes per request: ``topk`` at
    the first step, then ``topk * topk`` at each later one, of which sglang keeps the best num_draft_tokens - 1."""
    return topk + (steps - 1) * topk * topk


def check_speculative_point(flags: Mapping[str, str]) -> str | None:
    """Why sglang would refuse to run EAGLE speculative decoding with these launch flags, or None when it would run.

    ``flags``: flag name (without ``--``) -> value as written on the command line, for the flags a sweep point would
    launch with (the original command line with the point applied); an absent flag was not given. It reads
    ``speculative-num-steps``, ``speculative-eagle-topk``, ``speculative-num-draft-tokens``, and, where given,
    ``speculative-algorithm`` (only the EAGLE family is checked: EAGLE, EAGLE3, NEXTN, STANDALONE; NGRAM, DFLASH and
    others set these numbers themselves), ``speculative-adaptive``, ``speculative-use-rejection-sampling`` and the
    attention backends. The rules hold in every pinned release (0.4.6 to 0.5.23); see the comments for where sglang
    enforces each. Returns one line naming the flags and numbers; never raises.
    """
    algorithm = flags.get("speculative-algorithm")
    if algorithm is not None and algorithm.upper() not in _EAGLE_FAMILY:
        return None
    # Integers: every release declares the three `type=int` (add_argument up to 0.5.12; an `Optional[int]` field
    # from 0.5.16, which arg_utils._infer_type_func maps to int), so argparse exits at start on anything else.
    values: dict[str, int | None] = {}
    for name in ("speculative-num-steps", "speculative-eagle-topk", "speculative-num-draft-tokens"):
        value, error = _int(flags, name)
        if error:
            return error
        values[name] = value
    steps = values["speculative-num-steps"]
    topk = values["speculative-eagle-topk"]
    draft = values["speculative-num-draft-tokens"]
    adaptive = (flags.get("speculative-adaptive") or "off").lower() in _ON

    # Steps missing: sglang chooses all three itself, and asserts the other two were not given
    # (server_args.py ServerArgs.__post_init__ in 0.4.x, ServerArgs._handle_speculative_decoding 0.5.3-0.5.12,
    # arg_groups/speculative_hook.py _handle_eagle_family 0.5.16+: `assert speculative_eagle_topk is None and
    # speculative_num_draft_tokens is None`); --speculative-adaptive (0.5.16+) picks steps from its config instead.
    if steps is None:
        given = [f"--{n} {flags[n]}" for n in ("speculative-eagle-topk", "speculative-num-draft-tokens")
                 if values[n] is not None]
        if given and not adaptive:
            return (f"{' and '.join(given)} without --speculative-num-steps: sglang chooses all three itself then, "
                    "and asserts at start that none was given")
        return None
    # Non-positive: a draft of no step or a top-k of none builds no tree (the draft loop of EAGLEWorker.draft_forward
    # appends nothing to score_list and torch.cat fails; topk_p.view(-1, topk, topk) fails on 0).
    if steps < 1:
        return f"--speculative-num-steps {steps} must be 1 or more: sglang drafts no token with it and fails"
    if topk is None:
        if adaptive:
            return None  # _init_adaptive_speculative_params: top-k 1, draft tokens = steps + 1
        # Top-k missing: sglang compares it with 1 (`speculative_eagle_topk > 1 and page_size > 1`: TypeError on None
        # in _handle_speculative_decoding 0.5.3-0.5.12 and _handle_eagle_family 0.5.16+; in 0.4.x the EAGLE worker
        # sizes its buffers with it).
        return (f"--speculative-num-steps {steps} without --speculative-eagle-topk: sglang does not choose a top-k "
                "when the steps are given, and fails at start on the missing one (give --speculative-eagle-topk 1 "
                "for a chain)")
    if topk < 1:
        return f"--speculative-eagle-topk {topk} must be 1 or more: sglang cannot draft a tree of width {topk}"
    backends = {flags.get(n) for n in ("attention-backend", "decode-attention-backend", "prefill-attention-backend")}
    if topk > 1 and "trtllm_mha" in backends:
        # _handle_speculative_decoding 0.5.3-0.5.12, _handle_eagle_family 0.5.16+ (trtllm_mha is not a choice before).
        return (f"--speculative-eagle-topk {topk} with the trtllm_mha attention backend: sglang allows only top-k 1 "
                "there (ValueError at start)")
    if topk != 1 and (flags.get("speculative-use-rejection-sampling") or "off").lower() in _ON:
        # speculative_hook.py _handle_eagle_family (0.5.16+, the releases that have the flag).
        return (f"--speculative-eagle-topk {topk} with --speculative-use-rejection-sampling: sglang requires "
                "top-k 1 for rejection sampling (ValueError at start)")
    if topk == 1:
        # Top-k 1 is a chain: every release sets draft tokens to steps + 1 with a warning, never an error
        # (`speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when speculative_eagle_topk == 1`).
        return None
    if draft is None:
        # Only top-k 1 fills it in; a tree needs it given (EAGLEWorker passes None on to organize_draft_results /
        # the CUDA graph runners' buffer sizes).
        return (f"--speculative-eagle-topk {topk} without --speculative-num-draft-tokens: sglang fills the draft "
                "tokens in only for top-k 1, and fails at start on the missing value")
    candidates = draft_tree_candidates(steps, topk)
    # The tree: organize_draft_results (speculative/eagle_utils.py, 0.5.6+; build_tree_kernel_efficient_preprocess
    # in speculative/build_eagle_tree.py before) keeps `torch.topk(score_list, num_draft_token - 1)` of the
    # topk + (steps - 1) * topk * topk scores per request (select_top_k_tokens, speculative/spec_utils.py from 0.5.3,
    # eagle_utils.py before: (b, 1, topk) at the first step, (b, topk, topk) at each later one); torch.topk fails
    # when k exceeds them, and on k < 0.
    if draft < 1:
        return (f"--speculative-num-draft-tokens {draft} must be 1 or more: sglang keeps the best "
                f"num_draft_tokens - 1 = {draft - 1} of the draft tree's candidates, and torch.topk fails on it")
    if draft - 1 > candidates:
        return (f"--speculative-num-draft-tokens {draft} is too many for --speculative-num-steps {steps} and "
                f"--speculative-eagle-topk {topk}: the draft tree has {topk} + ({steps}-1)*{topk}*{topk} = "
                f"{candidates} candidates, so at most 1 + {candidates} = {candidates + 1} draft tokens (sglang's "
                f"torch.topk of {draft - 1} among {candidates} fails)")
    return None
