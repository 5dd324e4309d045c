"""Findings about the draft model and the algorithm it runs under: an EAGLE-3 draft run as EAGLE, a draft that
does not match the target, a draft trained for a shorter context, an accept length so low that speculation buys
nothing.
"""

from __future__ import annotations

from eaglepatch.doctor.facts import ServerFacts, evidence
from eaglepatch.doctor.finding import Finding
from eaglepatch.doctor.rules.thresholds import ACCEPT_LOW, SPEC_ALGOS_HIDDEN


def eagle3_draft_as_eagle(f: ServerFacts) -> Finding | None:
    """``eagle3-draft-as-eagle`` (high): the server runs ``--speculative-algorithm EAGLE`` (or ``NEXTN``, which
    sglang runs as EAGLE) and the draft's config.json names an EAGLE-3 architecture (a name containing ``Eagle3``,
    e.g. ``LlamaForCausalLMEagle3``).
    sglang then feeds the draft the target's last hidden state instead of the three it was trained on, raises no
    error, and the draft's tokens are (almost) never accepted. Needs the draft's config.json."""
    alg, alg_ev = f.algorithm()
    d = f.draft_config
    if alg not in ("EAGLE", "NEXTN") or d is None or d.data is None:
        return None
    archs = [a for a in d.architectures if "eagle3" in a.lower()]
    if not archs:
        return None
    ev = [alg_ev, evidence("config", f"the draft's architectures: {d.architectures} (an EAGLE-3 draft)",
                           path=d.path)]
    ev += [e for _, e in f.accept_lengths()]
    return Finding("eagle3-draft-as-eagle", "high",
                   f"an EAGLE-3 draft ({archs[0]}) runs under --speculative-algorithm {alg}", ev,
                   f"relaunch the server with --speculative-algorithm EAGLE3 instead of {alg} (to measure it first: "
                   f"eaglepatch sweep {f.target} --grid speculative-algorithm=EAGLE3 --baseline --repeat 3)")


def draft_mismatch(f: ServerFacts) -> Finding | None:
    """``draft-mismatch`` (high): for a draft that runs on the target's hidden states (EAGLE, EAGLE3, NEXTN), the
    draft's ``vocab_size`` differs from the target's, or its hidden size (``target_hidden_size`` when its config
    gives one, else ``hidden_size``) differs from the target's ``hidden_size`` (a multimodal config's
    ``text_config`` counts). Needs both config.json files."""
    alg, alg_ev = f.algorithm()
    t, d = f.target_config, f.draft_config
    if alg not in SPEC_ALGOS_HIDDEN or t is None or d is None or t.data is None or d.data is None:
        return None
    ev = []
    what = []
    if t.vocab_size is not None and d.vocab_size is not None and t.vocab_size != d.vocab_size:
        what.append("vocabulary")
        ev.append(evidence("config", f"vocab_size: target {t.vocab_size}, draft {d.vocab_size}", path=d.path))
    d_hidden = d.get("target_hidden_size")
    key = "target_hidden_size"
    if not isinstance(d_hidden, int):
        d_hidden, key = d.hidden_size, "hidden_size"
    if t.hidden_size is not None and isinstance(d_hidden, int) and t.hidden_size != d_hidden:
        what.append("hidden size")
        ev.append(evidence("config", f"hidden size: target hidden_size {t.hidden_size}, draft {key} {d_hidden}",
                           path=d.path))
    if not what:
        return None
    ev.append(evidence("config", f"target: {t.path or t.name}; draft: {d.path or d.name}"))
    ev.append(alg_ev)
    return Finding("draft-mismatch", "high",
                   f"the draft's {' and '.join(what)} do not match the target's", ev,
                   f"use the draft trained for this target ({t.name}): its config.json should say "
                   + ", ".join(x for x in (f"vocab_size {t.vocab_size}" if t.vocab_size else "",
                                           f"hidden_size {t.hidden_size}" if t.hidden_size else "") if x)
                   + "; check --speculative-draft-model-path")


def draft_context_short(f: ServerFacts) -> Finding | None:
    """``draft-context-short`` (medium): the draft's context length (sglang's derivation from its config.json:
    ``max_position_embeddings`` and the like, times a rope-scaling factor) is shorter than the context the server
    accepts (``--context-length`` as resolved, else the target's own context length). sglang refuses that at start
    unless ``SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1``, and then runs the draft past what it was trained on
    (its log says "Overriding the draft model's max_position_embeddings"): prompts longer than the draft's
    context get drafts that are rarely accepted. Needs the draft's config.json and the server's context."""
    alg, _ = f.algorithm()
    d = f.draft_config
    if alg is None or d is None or d.data is None:
        return None
    d_ctx, d_key = d.context_length()
    if d_ctx is None:
        return None
    ctx, ctx_ev = f.int_setting("context_length")
    if ctx is None and f.target_config is not None and f.target_config.data is not None:
        t_ctx, t_key = f.target_config.context_length()
        if t_ctx is not None:
            ctx, ctx_ev = t_ctx, evidence("config", f"the target's context length {t_ctx} ({t_key})",
                                          path=f.target_config.path)
    if ctx is None or d_ctx >= ctx:
        return None
    ev = [evidence("config", f"the draft's context length {d_ctx} ({d_key})", path=d.path), ctx_ev]
    if f.log and f.log.ctx_override_line:
        ev.append(evidence("server-log", "sglang stretched the draft's context", line=f.log.ctx_override_line))
    if f.env.get("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"):
        ev.append(evidence("environment", "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN="
                           + f.env["SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"]
                           + ": sglang's refusal of a longer context was overridden"))
    return Finding("draft-context-short", "medium",
                   f"the draft was trained for {d_ctx} tokens of context, the server takes up to {ctx}",
                   ev,
                   f"relaunch with --context-length {d_ctx} (longer requests are then refused), or use a draft "
                   f"trained for {ctx} tokens")


def accept_length_low(f: ServerFacts) -> Finding | None:
    """``accept-length-low`` (high): speculation is on and every measure of the accept length that was read
    (timing records, the log's ``accept len``, ``/server_info``'s ``avg_spec_accept_length``, the sweep's run of
    this command line) is at most ``ACCEPT_LOW`` (1.2) tokens per verify: each cycle pays for a draft and a
    verify and yields about the one token the target alone would have. Causes doctor names on their own:
    ``eagle3-draft-as-eagle``, ``draft-mismatch``, ``draft-context-short``; otherwise a draft not trained for
    this target, or a release whose acceptance regressed (the evidence names the release)."""
    alg, alg_ev = f.algorithm()
    if alg is None:
        return None
    found = f.accept_lengths()
    if not found or max(a for a, _ in found) > ACCEPT_LOW:
        return None
    best = max(a for a, _ in found)
    ev = [e for _, e in found] + [alg_ev]
    if f.version:
        ev.append(evidence("install", f"sglang {f.version}"))
    causes = [name for name, rule in (("eagle3-draft-as-eagle", eagle3_draft_as_eagle),
                                      ("draft-mismatch", draft_mismatch),
                                      ("draft-context-short", draft_context_short)) if rule(f)]
    steps, _ = f.int_setting("speculative_num_steps")
    if causes:
        nxt = f"fix {', '.join(causes)} first (see that finding), then run eaglepatch doctor {f.target} again"
    else:
        nxt = ("check that the draft was trained for this very target model (same checkpoint and tokenizer) "
               f"and whether the same draft accepts more under another sglang release; meanwhile compare with no "
               f"speculation: eaglepatch sweep {f.target} --grid speculative-num-steps={steps or 1} --baseline "
               "--repeat 3")
    return Finding("accept-length-low", "high",
                   f"accept length {best:.2f}: the draft's tokens are (almost) never accepted",
                   ev, nxt)
