"""The acceptance that the models of make_known_models.py give, by construction: the formula, and the exact walk
of a load's prompts (pure Python; used by the GPU stories and by tests/unit/test_known_models.py).

In a cycle whose last verified token is ``c``, draft ``i`` is right exactly when ``c, f(c), ..., f^(i-1)(c)`` are
all members of ``S``; the cycle produces the accepted drafts plus one token of the target's.
"""

from __future__ import annotations

import json
from typing import Sequence


def formula(p: float, steps: int) -> float:
    """The expected accept length at ``steps`` draft steps when each position is a member with probability ``p``:
    ``1 + p + ... + p^steps``."""
    return sum(p ** i for i in range(steps + 1))


def load(path: str) -> tuple[list[int], list[bool], float]:
    """``(f, member, p)`` from a ``known.json``."""
    with open(path) as fh:
        d = json.load(fh)
    return list(d["f"]), [bool(m) for m in d["member"]], float(d["p"])


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
