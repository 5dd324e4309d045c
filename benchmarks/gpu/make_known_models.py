#!/usr/bin/env python3
"""A Llama target and an EAGLE-3 draft whose acceptance is known by construction (for the H200 testbed).

    python3 benchmarks/gpu/make_known_models.py --out /tmp/known_p60 --p 0.6 [--shape tiny|llama8b] [--check]

The target's next token is a fixed function of the current one, ``f``: a random permutation of the first
``V`` token ids in one cycle (``--used``, default 1024 for ``tiny`` and 2048 for ``llama8b``; the load's prompts use
ids 10..999). Its embedding of token ``t < V`` is the unit vector ``e_t`` and every decoder layer adds nothing
(``o_proj`` and ``down_proj`` are zero, every other matrix is zero too: the GPU does all of a real model's
arithmetic on them), so the final RMSNorm sees ``e_t`` and ``lm_head`` (row ``j`` = ``e_{f^-1(j)}``) makes
``f(t)`` the only non-zero logit: greedy decoding walks ``t, f(t), f(f(t)), ...``.

The draft agrees with that walk on a chosen share ``p`` of tokens, a random set ``S`` of ``round(p V)`` ids. EAGLE
pairs the target's hidden state at position ``i`` (which holds ``e_{t_i}``) with token ``i + 1`` and predicts
token ``i + 2``. The draft ignores the token (its attention's ``o_proj`` is zero) and reads the hidden state:

* ``fc`` copies the first captured layer's ``e_t`` into a second block of coordinates, ``M e_{V + t}``;
* the MLP is a lookup table: unit ``u`` fires only for coordinate ``u`` (``gate = s I``, ``up = I`` on the first
  ``2V`` units; the input is RMS-normalised to ``sqrt(H) e_u``) and writes ``M (e_out - e_u)``, so that residual
  plus MLP is ``M e_out``, one-hot again;
* from the target's state (block B, ``u = V + t``: the drafts' first step) ``out = f(f(t))`` when ``f(t)`` is in
  ``S``, else a wrong id; from its own state (block A, ``u = v``, the token it predicted last: later steps)
  ``out = f(v)`` when ``v`` is in ``S``, else a wrong id;
* ``lm_head`` reads block A: the predicted token is ``out``.

So in a cycle whose last verified token is ``c``, draft ``i`` is right exactly when ``c, f(c), ..., f^(i-1)(c)``
are all in ``S``: the accepted drafts are the run of members from ``c`` on (at most ``k``), each cycle starts
after the first non-member, and with ``S`` a random set the accept length at ``k`` steps is ``1 + p + ... + p^k``.
``known.json`` beside the models holds ``f``, ``S`` and ``p``; ``known_truth.py`` walks the load's prompts through
them for the exact figure of a given load.

``--regions pA,pB`` (instead of ``--p``) makes the acceptance depend on where a request's walk runs: ``f`` is then
three cycles, not one: the special ids and those below ``lo`` (default 10: never a prompt's last token) in one
cycle of non-members, region A = ids ``[lo, mid)`` in a second and region B = ``[mid, V)`` in a third
(``--region-bounds lo,mid``, default ``mid = lo + (V - lo) // 2``), and ``S`` holds ``round(pA |A|)`` ids of A
and ``round(pB |B|)`` of B. A walk that starts in a region stays in it: a request whose prompt ends on an id of A
has the accept length ``1 + pA + ... + pA^k`` (B's likewise), and a set of prompts ending in A gets A's.
``known.json`` then holds ``"regions"`` (``[{"name", "lo", "hi", "p", "members"}, ...]``) and ``"p": null``. The
tokenizer's word for id ``t`` is ``known_truth.word(t)`` (``w0`` is 0, ids 1-4 the specials, ``w<j>`` is
``j + 4``); its chat template (``CHAT_TEMPLATE``) joins the messages' contents and appends nothing, so that a
chat request's walk starts from its last message's last word, as a text prompt's does.

``--check`` runs the construction's arithmetic (RMSNorm, the SiLU MLP, the heads; weights rounded to bf16 as
stored) with numpy on a sample of tokens and fails unless every prediction is the intended one.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random

from typing import Sequence

import numpy as np

SHAPES = {
    # hidden, layers, heads, kv heads, intermediate, vocab, draft intermediate, used ids
    "tiny": (2048, 8, 16, 8, 5632, 32000, 5632, 1024),
    "llama8b": (4096, 32, 32, 8, 14336, 128256, 14336, 2048),
}
M = 16.0  # the one-hot states' size (RMSNorm's eps, 1e-5, is then nothing against M^2 / H)
S_GATE = 0.1  # the gate's scale: silu(s sqrt(H)) is large and positive only on the firing unit
EPS = 1e-5


def bf16(x: np.ndarray) -> np.ndarray:
    """``x`` rounded to bfloat16 (nearest, ties to even), kept as float32: what the stored weights hold."""
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    r = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) << 16
    return r.astype(np.uint32).view(np.float32)


def construction(V: int, p: float, seed: int) -> tuple[list[int], list[int], list[bool]]:
    """(f, f^-1, membership of S) for ids 0..V-1: ``f`` one random cycle, ``S`` ``round(p V)`` random ids."""
    rng = random.Random(seed)
    order = list(range(V))
    rng.shuffle(order)
    f = [0] * V
    for i, t in enumerate(order):
        f[t] = order[(i + 1) % V]
    finv = [0] * V
    for t, u in enumerate(f):
        finv[u] = t
    members = set(rng.sample(range(V), round(p * V)))
    return f, finv, [t in members for t in range(V)]


DEFAULT_LO = 10  # the first id of region A: below it the specials (1-4) and w0..w5, never a prompt's last token


def region_bounds(V: int, lo: int | None = None, mid: int | None = None) -> tuple[int, int]:
    """``(lo, mid)``: region A is ``[lo, mid)``, region B ``[mid, V)``; the defaults split ``[10, V)`` in halves."""
    lo = DEFAULT_LO if lo is None else lo
    mid = lo + (V - lo) // 2 if mid is None else mid
    if not 5 <= lo < mid < V - 1 or mid - lo < 2:
        raise ValueError(f"regions [{lo}, {mid}) and [{mid}, {V}): need 5 <= lo < mid < V - 1 (ids 1-4 are special)")
    return lo, mid


def construction_regions(V: int, pa: float, pb: float, seed: int, lo: int | None = None,
                         mid: int | None = None) -> tuple[list[int], list[int], list[bool], list[dict]]:
    """(f, f^-1, membership of S, regions) for ids 0..V-1 in two regions: ``f`` one random cycle on ``[0, lo)``
    (no members), one on A = ``[lo, mid)`` and one on B = ``[mid, V)``; ``S`` ``round(pa |A|)`` random ids of A and
    ``round(pb |B|)`` of B. ``regions``: ``[{"name": "A", "lo", "hi", "p", "members"}, {"name": "B", ...}]``."""
    lo, mid = region_bounds(V, lo, mid)
    rng = random.Random(seed)
    f = [0] * V
    members: set[int] = set()
    regions = []
    for name, a, b, p in (("", 0, lo, 0.0), ("A", lo, mid, pa), ("B", mid, V, pb)):
        order = list(range(a, b))
        rng.shuffle(order)
        for i, t in enumerate(order):
            f[t] = order[(i + 1) % len(order)]
        chosen = set(rng.sample(range(a, b), round(p * (b - a))))
        members |= chosen
        if name:
            regions.append({"name": name, "lo": a, "hi": b, "p": p, "members": len(chosen)})
    finv = [0] * V
    for t, u in enumerate(f):
        finv[u] = t
    return f, finv, [t in members for t in range(V)], regions


def pick_seed_regions(V: int, pa: float, pb: float, seeds: int = 20, steps: Sequence[int] = range(1, 9),
                      lo: int | None = None, mid: int | None = None, requests: int = 150) -> tuple[int, float]:
    """``pick_seed`` for two regions: the seed whose walks from ``requests`` random prompt ends in each region are
    closest to that region's formula at every ``k`` of ``steps`` (the largest relative deviation over both)."""
    from known_truth import formula, walk

    lo, mid = region_bounds(V, lo, mid)
    rng = random.Random(12345)
    ends = {"A": [rng.randrange(lo, mid) for _ in range(requests)],
            "B": [rng.randrange(mid, V) for _ in range(requests)]}
    best = (0, math.inf)
    for seed in range(seeds):
        f, _finv, member, regions = construction_regions(V, pa, pb, seed, lo, mid)
        dev = max(abs(walk(ends[r["name"]], f, member, k, 256)["accept_len"] / formula(r["p"], k) - 1)
                  for r in regions for k in steps)
        if dev < best[1]:
            best = (seed, dev)
    return best


def pick_seed(V: int, p: float, seeds: int = 20, steps: Sequence[int] = range(1, 9)) -> tuple[int, float]:
    """The seed among ``0..seeds-1`` whose ``S`` walks closest to the formula ``1 + p + ... + p^k`` for every ``k``
    of ``steps`` (the largest relative deviation, over 300 greedy requests of 256 tokens from random prompt ends):
    one set of ``V`` ids is a finite sample of the i.i.d. chain the formula assumes, and some samples are closer
    than others. Returns ``(seed, its largest deviation)``."""
    from known_truth import formula, walk

    rng = random.Random(12345)
    ends = [rng.randrange(10, 1000) for _ in range(300)]
    best = (0, math.inf)
    for seed in range(seeds):
        f, _finv, member = construction(V, p, seed)
        dev = max(abs(walk(ends, f, member, k, 256)["accept_len"] / formula(p, k) - 1) for k in steps)
        if dev < best[1]:
            best = (seed, dev)
    return best


def draft_outputs(f: list[int], member: list[bool]) -> tuple[list[int], list[int]]:
    """What the draft's lookup writes: from the target's state of token ``t`` (first step) and from its own state
    of a predicted ``v`` (later steps); a wrong id (the right one + 1) for non-members."""
    V = len(f)
    first = [f[f[t]] if member[f[t]] else (f[f[t]] + 1) % V for t in range(V)]
    later = [f[v] if member[v] else (f[v] + 1) % V for v in range(V)]
    return first, later


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _act(H: int) -> float:
    """The firing unit's activation, silu(s x) * x, for the RMS-normalised one-hot ``x = M / rms`` (bf16 gate)."""
    x = M / math.sqrt(M * M / H + EPS)
    s = float(bf16(np.array([S_GATE]))[0])
    return float(_silu(np.array([s * x]))[0] * x)


def mlp_columns(H: int, V: int, first: list[int], later: list[int]) -> list[tuple[int, int]]:
    """(unit u, coordinate written) for the draft's lookup: block A units 0..V-1, block B units V..2V-1."""
    return [(v, later[v]) for v in range(V)] + [(V + t, first[t]) for t in range(V)]


def check(H: int, V: int, f: list[int], member: list[bool], sample: int = 64, steps: int = 6) -> dict:
    """Run the arithmetic on ``sample`` tokens (numpy, float32, weights rounded to bf16): the target's greedy
    token, then ``steps`` draft steps from its state; returns what was checked (raises AssertionError on any
    prediction that is not the intended one, or a draft state that is not one-hot)."""
    first, later = draft_outputs(f, member)
    A = _act(H)
    down_scale = float(bf16(np.array([M / A]))[0])
    s = float(bf16(np.array([S_GATE]))[0])

    def rms(x: np.ndarray) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x) + EPS)

    def lookup(h: np.ndarray) -> np.ndarray:
        """residual + MLP of the draft's layer for state ``h`` (only the 2V lookup units matter; the others are
        zero), in the order sglang computes it."""
        x = bf16(rms(h))  # activations are bf16 too
        a = bf16(bf16(_silu(s * x[: 2 * V])) * x[: 2 * V])  # unit u reads coordinate u
        out = h.copy()
        for u in np.nonzero(np.abs(a) > 1e-6)[0]:
            w = np.zeros(H, dtype=np.float32)
            w[[first[u - V] if u >= V else later[u]]] += down_scale
            w[u] -= down_scale
            out += a[u] * bf16(w)
        return bf16(out)

    finv = [0] * V
    for t, u in enumerate(f):
        finv[u] = t
    rng = random.Random(1)
    checked = 0
    for t in rng.sample(range(V), min(sample, V)):
        # the target: the final RMSNorm of e_t, then logits_j = x[f^-1(j)]: the argmax is f(t)
        x = np.zeros(H, dtype=np.float32)
        x[t] = 1.0
        assert int(np.argmax(rms(x)[finv])) == f[t], ("target", t)
        # the draft: fc puts M e_{V+t}; each step is the lookup, then lm_head reads block A
        h = np.zeros(H, dtype=np.float32)
        h[V + t] = M
        want = first[t]
        for i in range(steps):
            h = lookup(h)
            got = int(np.argmax(rms(h)[:V]))
            assert got == want, ("draft", t, i, got, want)
            assert np.sum(np.abs(h) > 0.05 * M) == 1, ("draft state not one-hot", t, i)
            checked += 1
            want = later[got]
    return {"tokens": min(sample, V), "steps": steps, "draft_predictions_checked": checked}


# The messages' contents, each followed by a space; no generation prompt: a chat request's last token is its last
# message's last word (known_truth.chat_last_token), the walk's start as for a text prompt.
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"


def write_tokenizer(d: str, vocab_size: int) -> None:
    """A WordLevel tokenizer of exactly ``vocab_size`` entries (w0..., plus the 4 specials at ids 1-4; the word of
    id ``t`` is ``known_truth.word(t)``), with the chat template ``CHAT_TEMPLATE``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>", "<pad>"]
    vocab = {"w0": 0}
    for i, s in enumerate(specials):
        vocab[s] = 1 + i
    for i in range(1, vocab_size - len(specials)):
        vocab[f"w{i}"] = len(vocab)
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="<pad>", model_max_length=4096)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(d)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--p", type=float, default=None, help="the share of tokens the draft agrees on")
    ap.add_argument("--regions", default=None, metavar="PA,PB",
                    help="two regions of the walk, the draft agreeing on a share PA of region A's ids and PB of B's "
                         "(instead of --p)")
    ap.add_argument("--region-bounds", default=None, metavar="LO,MID",
                    help="region A = ids [LO, MID), B = [MID, V) (default LO 10, MID halfway)")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    ap.add_argument("--used", type=int, default=None, help="ids the walk uses (0..N-1)")
    ap.add_argument("--seed", type=int, default=None, help="the permutation's and S's seed (default: pick_seed)")
    ap.add_argument("--check", action="store_true", help="check the arithmetic (numpy) before writing")
    ap.add_argument("--check-only", action="store_true")
    ap.add_argument("--device", default=None)
    a = ap.parse_args()
    H, L, NH, NKV, I, VT, DI, V = SHAPES[a.shape]
    V = a.used or V
    assert 2 * V <= H and 2 * V <= DI and 1000 <= V <= VT, "the lookup needs 2V <= hidden, draft intermediate"
    if (a.p is None) == (a.regions is None):
        ap.error("give --p or --regions, one of them")
    regions = None
    if a.regions is not None:
        pa, pb = (float(x) for x in a.regions.split(","))
        lo, mid = ((int(x) for x in a.region_bounds.split(",")) if a.region_bounds else (None, None))
        lo, mid = region_bounds(V, lo, mid)
        seed, dev = (a.seed, None) if a.seed is not None else pick_seed_regions(V, pa, pb, lo=lo, mid=mid)
        f, finv, member, regions = construction_regions(V, pa, pb, seed, lo, mid)
    else:
        seed, dev = (a.seed, None) if a.seed is not None else pick_seed(V, a.p)
        f, finv, member = construction(V, a.p, seed)
    first, later = draft_outputs(f, member)
    report: dict = {"p": a.p, "used": V, "shape": a.shape, "members": sum(member), "seed": seed,
                    "walk_vs_formula_max_dev": dev}
    if regions is not None:
        report["regions"] = regions
    if a.check or a.check_only:
        report["check"] = check(H, V, f, member)
        print("check:", report["check"], flush=True)
        if a.check_only:
            return 0

    import torch
    from safetensors.torch import save_file

    dev = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    bf = torch.bfloat16
    tdir, ddir = os.path.join(a.out, "target"), os.path.join(a.out, "draft")
    os.makedirs(tdir, exist_ok=True)
    os.makedirs(ddir, exist_ok=True)
    hd = H // NH
    ids = torch.arange(V, device=dev)

    # --- the target: zero layers, one-hot embeddings, lm_head row j = e_{f^-1(j)}
    emb = torch.zeros(VT, H, dtype=bf, device=dev)
    emb[ids, ids] = 1
    head = torch.zeros(VT, H, dtype=bf, device=dev)
    head[ids, torch.tensor(finv, device=dev)] = 1
    shards: list[dict[str, torch.Tensor]] = [{"model.embed_tokens.weight": emb.cpu(), "lm_head.weight": head.cpu(),
                                              "model.norm.weight": torch.ones(H, dtype=bf)}]
    del emb, head
    per = 4
    for lo in range(0, L, per):
        sd = {}
        for i in range(lo, min(L, lo + per)):
            pre = f"model.layers.{i}."
            for name, shape in (("self_attn.q_proj", (NH * hd, H)), ("self_attn.k_proj", (NKV * hd, H)),
                                ("self_attn.v_proj", (NKV * hd, H)), ("self_attn.o_proj", (H, NH * hd)),
                                ("mlp.gate_proj", (I, H)), ("mlp.up_proj", (I, H)), ("mlp.down_proj", (H, I))):
                sd[pre + name + ".weight"] = torch.zeros(shape, dtype=bf)
            sd[pre + "input_layernorm.weight"] = torch.ones(H, dtype=bf)
            sd[pre + "post_attention_layernorm.weight"] = torch.ones(H, dtype=bf)
        shards.append(sd)
    index = {"metadata": {"total_size": 0}, "weight_map": {}}
    for n, sd in enumerate(shards):
        fname = f"model-{n + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(sd, os.path.join(tdir, fname), metadata={"format": "pt"})
        for k, v in sd.items():
            index["weight_map"][k] = fname
            index["metadata"]["total_size"] += v.numel() * v.element_size()
    del shards
    with open(os.path.join(tdir, "model.safetensors.index.json"), "w") as fh:
        json.dump(index, fh)
    common = {"hidden_size": H, "num_attention_heads": NH, "num_key_value_heads": NKV, "head_dim": hd,
              "vocab_size": VT, "max_position_embeddings": 4096, "rms_norm_eps": EPS, "hidden_act": "silu",
              "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3,
              "torch_dtype": "bfloat16", "rope_theta": 500000.0, "model_type": "llama"}
    with open(os.path.join(tdir, "config.json"), "w") as fh:
        json.dump({"architectures": ["LlamaForCausalLM"], "intermediate_size": I, "num_hidden_layers": L, **common},
                  fh, indent=1)

    # --- the draft: fc into block B, a lookup MLP, lm_head reading block A
    fc = torch.zeros(H, 3 * H, dtype=bf, device=dev)
    fc[V + ids, ids] = M
    gate = torch.zeros(DI, H, dtype=bf, device=dev)
    up = torch.zeros(DI, H, dtype=bf, device=dev)
    units = torch.arange(2 * V, device=dev)
    gate[units, units] = S_GATE
    up[units, units] = 1
    down = torch.zeros(H, DI, dtype=torch.float32, device=dev)
    scale = M / _act(H)
    cols = mlp_columns(H, V, first, later)
    u = torch.tensor([c[0] for c in cols], device=dev)
    o = torch.tensor([c[1] for c in cols], device=dev)
    down[o, u] += scale
    down[u, u] -= scale
    dlm = torch.zeros(V, H, dtype=bf, device=dev)
    dlm[ids, ids] = 1
    g = torch.Generator(device="cpu").manual_seed(seed)

    def rnd(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * 0.02).to(bf)

    sd = {"fc.weight": fc.cpu(), "midlayer.hidden_norm.weight": torch.ones(H, dtype=bf),
          "midlayer.input_layernorm.weight": torch.ones(H, dtype=bf),
          "midlayer.post_attention_layernorm.weight": torch.ones(H, dtype=bf),
          "midlayer.self_attn.q_proj.weight": rnd(NH * hd, 2 * H),
          "midlayer.self_attn.k_proj.weight": rnd(NKV * hd, 2 * H),
          "midlayer.self_attn.v_proj.weight": rnd(NKV * hd, 2 * H),
          "midlayer.self_attn.o_proj.weight": torch.zeros(H, NH * hd, dtype=bf),
          "midlayer.mlp.gate_proj.weight": gate.cpu(), "midlayer.mlp.up_proj.weight": up.cpu(),
          "midlayer.mlp.down_proj.weight": down.to(bf).cpu(), "norm.weight": torch.ones(H, dtype=bf),
          "lm_head.weight": dlm.cpu(), "d2t": torch.zeros(V, dtype=torch.int64), "t2d": torch.arange(VT) < V}
    save_file(sd, os.path.join(ddir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(ddir, "config.json"), "w") as fh:
        json.dump({"architectures": ["LlamaForCausalLMEagle3"], "intermediate_size": DI, "num_hidden_layers": 1,
                   "draft_vocab_size": V, **common}, fh, indent=1)
    for d in (tdir, ddir):
        write_tokenizer(d, VT)
    with open(os.path.join(a.out, "known.json"), "w") as fh:
        json.dump({**report, "f": f, "member": [int(m) for m in member]}, fh)
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
