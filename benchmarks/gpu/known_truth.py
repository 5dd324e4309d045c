"""The acceptance that the models of make_known_models.py give, by construction: the formula, and the exact walk
of a load's prompts (pure Python; used by the GPU stories and by tests/unit/test_known_models.py).

In a cycle whose last verified token is ``c``, draft ``i`` is right exactly when ``c, f(c), ..., f^(i-1)(c)`` are
all members of ``S``; the cycle produces the accepted drafts plus one token of the target's.

Models made with ``--regions pA,pB`` have ``f`` in separate cycles (region A, region B, and the ids below A), so a
walk never leaves the region its prompt's last token is in: ``expected`` gives a prompt set's exact figure (the
walk of its requests' last tokens) beside its region's formula. ``word`` and ``token`` are the tokenizer's mapping
(make_known_models.write_tokenizer), ``last_token`` a prompt's last token as the server sees it, text or chat.
"""

from __future__ import annotations

import json
from typing import Sequence


def formula(p: float, steps: int) -> float:
    """The expected accept length at ``steps`` draft steps when each position is a member with probability ``p``:
    ``1 + p + ... + p^steps``."""
    return sum(p ** i for i in range(steps + 1))


def load(path: str) -> tuple[list[int], list[bool], float | None]:
    """``(f, member, p)`` from a ``known.json`` (``p`` None for models of two regions: ``load_known``)."""
    d = load_known(path)
    return d["f"], d["member"], d["p"]


def load_known(path: str) -> dict:
    """A ``known.json``: ``{"f", "member", "p", "regions"}`` (``regions`` None, ``p`` the share, for models of one
    region; else ``p`` None and ``regions`` ``[{"name", "lo", "hi", "p", "members"}, ...]``), and what else it
    holds."""
    with open(path) as fh:
        d = json.load(fh)
    d["f"], d["member"] = list(d["f"]), [bool(m) for m in d["member"]]
    d["p"] = None if d.get("p") is None else float(d["p"])
    d["regions"] = d.get("regions")
    return d


SPECIALS = 4  # ids 1-4: <unk>, <s>, </s>, <pad> (make_known_models.write_tokenizer)


def word(t: int) -> str:
    """The tokenizer's word for token id ``t`` (``w0`` for 0, ``w<t - 4>`` from 5 on)."""
    if 1 <= t <= SPECIALS:
        raise ValueError(f"id {t} is a special token, not a word")
    return "w0" if t == 0 else f"w{t - SPECIALS}"


def token(w: str) -> int:
    """The token id of the tokenizer's word ``w`` (``word``'s inverse)."""
    if not w.startswith("w") or not w[1:].isdigit():
        raise ValueError(f"{w!r} is not a word of the tokenizer (w<number>)")
    j = int(w[1:])
    return 0 if j == 0 else j + SPECIALS


def chat_text(messages: Sequence[dict]) -> str:
    """What the tokenizer's chat template (make_known_models.CHAT_TEMPLATE) makes of ``messages``: each content and
    a space, no generation prompt."""
    return "".join(f"{m['content']} " for m in messages)


def last_token(prompt: dict) -> int:
    """The last token id of a prompt as the server sees it: ``{"prompt": text}`` (to /generate) or ``{"messages":
    [...]}`` (to /v1/chat/completions, through the chat template, which appends nothing): the walk starts there."""
    text = prompt["prompt"] if prompt.get("messages") is None else chat_text(prompt["messages"])
    return token(text.split()[-1])


def region_of(t: int, regions: Sequence[dict] | None) -> str | None:
    """The name of the region holding token ``t`` (None: outside them all, or no regions)."""
    for r in regions or ():
        if r["lo"] <= t < r["hi"]:
            return r["name"]
    return None


def expected(last_tokens: Sequence[int], known: dict, steps: int, max_new: int) -> dict:
    """The exact accept length of a load whose requests' prompts end in ``last_tokens`` (``walk``), ``max_new``
    tokens each, at ``steps`` draft steps, with the models of ``known`` (``load_known``); ``regions``: how many
    requests start in each region (``"-"``: in none), ``formula``: the formula of the one region (or the one ``p``)
    they all start in, else None."""
    w = walk(last_tokens, known["f"], known["member"], steps, max_new)
    regs = known.get("regions")
    counts: dict[str, int] = {}
    for t in last_tokens:
        name = region_of(t, regs) if regs else "all"
        counts[name or "-"] = counts.get(name or "-", 0) + 1
    p = known.get("p")
    if regs and len(counts) == 1 and "-" not in counts:
        p = next(r["p"] for r in regs if r["name"] in counts)
    elif regs:
        p = None
    return {"steps": steps, "max_new": max_new, "requests": len(last_tokens), "regions": counts,
            "accept_len": w["accept_len"], "server_accept_len": w["server_accept_len"], "at_least": w["at_least"],
            "cycles": w["cycles"], "formula": None if p is None else formula(p, steps)}


def stays_in_region(t: int, f: Sequence[int], regions: Sequence[dict], n: int) -> bool:
    """Whether ``n`` steps of the walk from ``t`` stay in ``t``'s region."""
    r = region_of(t, regions)
    for _ in range(n):
        t = f[t]
        if region_of(t, regions) != r:
            return False
    return True


def walk(last_tokens: Sequence[int], f: Sequence[int], member: Sequence[bool], steps: int,
         max_new: int) -> dict:
    """The exact decode of greedy requests whose prompts end in ``last_tokens``, ``max_new`` tokens each (the first
    from the prefill): ``{"tokens", "cycles", "accept_len"}`` (tokens per verify cycle, the first token left out,
    as sglang's ``completion_tokens / spec_verify_ct`` counts it with it: ``server_accept_len``) and ``at_least``
    (the share of cycles that produced at least 1, 2, ... tokens), over all requests. With ``steps`` 0: one token
    a cycle."""
    hist = [0] * (steps + 2)
    tokens = cycles = 0
    for x in last_tokens:
        cur = f[x]  # the prefill's token
        made = 1
        while made < max_new:
            a = 0
            c = cur
            while a < steps and member[c]:
                a += 1
                c = f[c]
            n = min(a + 1, max_new - made)
            for _ in range(a + 1):
                cur = f[cur]
            made += n
            hist[n] += 1
            cycles += 1
            tokens += n
    total = sum(hist)
    at_least = [round(sum(hist[i:]) / total, 4) if total else 0.0 for i in range(1, steps + 2)]
    return {"tokens": tokens, "cycles": cycles, "accept_len": tokens / cycles if cycles else None,
            "server_accept_len": (tokens + len(last_tokens)) / cycles if cycles else None, "at_least": at_least}
