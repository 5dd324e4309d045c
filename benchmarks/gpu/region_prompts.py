#!/usr/bin/env python3
"""Two prompt sets for the models of two regions (make_known_models.py ``--regions pA,pB``), as ``eaglepatch bench
--prompts`` reads them (JSONL): ``codeish`` (text prompts, to /generate) whose every word is an id of region A, and
``chatty`` (chat messages, to /v1/chat/completions through the tokenizer's chat template, which appends nothing)
whose every word is an id of region B. A request's walk starts at its prompt's last token and stays in that
token's region, so each set has its region's acceptance: known_truth.expected gives the exact figure of a load.

    python3 benchmarks/gpu/region_prompts.py --known /tmp/known_regions/known.json --out /tmp/region_prompts

writes ``codeish.jsonl`` and ``chatty.jsonl`` there (deterministic: the same known.json, ``--n``, ``--max-tokens``
and ``--seed`` give the same bytes) and prints their paths and regions as JSON. Every prompt has ``"max_tokens"``
(the same for all) and its ``"category"`` (the set's name).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import known_truth  # noqa: E402

SETS = (("codeish", "A", "text"), ("chatty", "B", "chat"))  # (name, region, how it is sent)


def words(rng: random.Random, lo: int, hi: int, n: int) -> str:
    return " ".join(known_truth.word(rng.randrange(lo, hi)) for _ in range(n))


def make_sets(regions: list[dict], n: int = 32, max_tokens: int = 256, seed: int = 0) -> dict[str, list[dict]]:
    """``{"codeish": [...], "chatty": [...]}``: ``n`` prompts each, their words drawn from region A (codeish, text
    prompts of 12 to 40 words) and from region B (chatty, a system message of 4 to 10 words and a user message of 8
    to 30)."""
    by = {r["name"]: r for r in regions}
    out: dict[str, list[dict]] = {}
    for name, region, how in SETS:
        r = by[region]
        rng = random.Random(f"region-prompts:{seed}:{name}")
        rows = []
        for _ in range(n):
            if how == "text":
                row: dict = {"prompt": words(rng, r["lo"], r["hi"], rng.randint(12, 40))}
            else:
                row = {"messages": [{"role": "system", "content": words(rng, r["lo"], r["hi"], rng.randint(4, 10))},
                                    {"role": "user", "content": words(rng, r["lo"], r["hi"], rng.randint(8, 30))}]}
            row.update(max_tokens=max_tokens, category=name)
            rows.append(row)
        out[name] = rows
    return out


def write_sets(known_path: str, out: str, n: int = 32, max_tokens: int = 256, seed: int = 0) -> dict[str, dict]:
    """Write the sets of the regions of ``known_path`` to ``out``; ``{name: {"path", "region", "lo", "hi", "p",
    "chat", "prompts", "max_tokens"}}``."""
    known = known_truth.load_known(known_path)
    if not known.get("regions"):
        raise SystemExit(f"{known_path}: models of one region (made without --regions): no sets to make")
    os.makedirs(out, exist_ok=True)
    by = {r["name"]: r for r in known["regions"]}
    info = {}
    for name, rows in make_sets(known["regions"], n, max_tokens, seed).items():
        path = os.path.join(out, f"{name}.jsonl")
        with open(path, "w") as fh:
            fh.writelines(json.dumps(row) + "\n" for row in rows)
        region = next(reg for nm, reg, _ in SETS if nm == name)
        r = by[region]
        info[name] = {"path": path, "region": region, "lo": r["lo"], "hi": r["hi"], "p": r["p"],
                      "chat": "messages" in rows[0], "prompts": len(rows), "max_tokens": max_tokens}
    return info


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--known", required=True, help="the models' known.json (made with --regions)")
    ap.add_argument("--out", required=True, help="folder for codeish.jsonl and chatty.jsonl")
    ap.add_argument("--n", type=int, default=32, help="prompts per set")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    print(json.dumps(write_sets(a.known, a.out, a.n, a.max_tokens, a.seed), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
