"""The prompts of the load (``--prompts SOURCE``): a built-in set shipped with eaglepatch, a JSONL file, a
ShareGPT-format JSON file, or ``random-ids`` (seeded random token ids: no set at all, ``LoadSpec.prompts``).

- JSONL: one object a line, ``{"prompt": "text"}`` (sent to ``/generate`` as ``text``) or ``{"messages": [{"role":
  "user", "content": "..."}]}`` (sent to the OpenAI-compatible ``/v1/chat/completions``, so that the model's own chat
  template applies), each with an optional ``"max_tokens"`` (its output length; else ``--max-new-tokens``) and
  ``"category"`` (the figures are given per category).
- ShareGPT: a JSON list of ``{"conversations": [{"from": "human", "value": "..."}, {"from": "gpt", "value":
  "..."}]}``: each conversation's first human turn, sent as chat messages, its reply's length as ``max_tokens``
  (in characters / 4: an estimate of its tokens, no tokenizer being at hand). Conversations without a human turn
  are skipped. A JSON list may hold ``prompt``/``messages`` objects too.
- The built-in sets (``eaglepatch/tuning/prompt_sets/*.jsonl``, made by ``tools/make_prompt_sets.py``): ``chat``,
  ``code``, ``summarize``, ``reasoning``, and ``mixed``, all four together.

A set is drawn in a seeded order (``PromptSet.draw``): request ``i`` of a load gets a prompt that depends only on
the seed and ``i``, every prompt of the set once before any comes again. Bad input (not JSON, a line without a
prompt, an empty file, a file over ``MAX_BYTES`` or ``MAX_LINES``, an unknown name) raises ``UsageError`` with one
line, before any request is sent.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import random
from typing import Any

from eaglepatch.errors import UsageError

RANDOM_IDS = "random-ids"
SETS = ("chat", "code", "summarize", "reasoning")  # the built-in sets, each a category
MIXED = "mixed"
NAMES = (MIXED, *SETS, RANDOM_IDS)
DEFAULT = MIXED
UNCATEGORIZED = "uncategorized"
# a file larger than this (or of more lines) is refused: give a sample of your traffic
MAX_BYTES = 64 << 20
MAX_LINES = 1_000_000
# ShareGPT replies: their length in characters over this is the output length's estimate in tokens
CHARS_PER_TOKEN = 4
_REPLIES = frozenset({"gpt", "assistant", "chatgpt", "bard", "model", "bing"})
_HUMAN = frozenset({"human", "user"})


@dataclasses.dataclass(frozen=True)
class Prompt:
    """One prompt: ``text`` (to ``/generate``) or ``messages`` (to ``/v1/chat/completions``); ``max_tokens``:
    its output length, None for the load's ``--max-new-tokens``."""

    text: str | None = None
    messages: tuple[dict[str, Any], ...] | None = None
    max_tokens: int | None = None
    category: str = UNCATEGORIZED

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = ({"prompt": self.text} if self.messages is None
                               else {"messages": [dict(m) for m in self.messages]})
        if self.max_tokens is not None:
            doc["max_tokens"] = self.max_tokens
        doc["category"] = self.category
        return doc


@dataclasses.dataclass(frozen=True)
class PromptSet:
    """The prompts of ``source`` (a built-in set's name, or the file as given), in the file's order."""

    source: str
    prompts: tuple[Prompt, ...]

    @functools.cached_property
    def digest(self) -> str:
        """What the prompts are (their JSON's SHA-256, 16 hex digits): a sweep's identity carries it, so that a file
        changed between two runs is another load."""
        h = hashlib.sha256()
        for p in self.prompts:
            h.update(json.dumps(p.to_json(), sort_keys=True).encode())
            h.update(b"\n")
        return h.hexdigest()[:16]

    @functools.cached_property
    def categories(self) -> tuple[str, ...]:
        return tuple(sorted({p.category for p in self.prompts}))

    @functools.cached_property
    def has_chat(self) -> bool:
        return any(p.messages is not None for p in self.prompts)

    @functools.cached_property
    def has_text(self) -> bool:
        return any(p.messages is None for p in self.prompts)

    def draw(self, seed: int, n: int, offset: int = 0) -> list[Prompt]:
        """``n`` prompts, the ``offset + i``-th for ``i`` in ``range(n)``: the set in a seeded order, each pass over it
        in an order of its own (prompt ``k`` depends only on ``seed`` and ``k``)."""
        size = len(self.prompts)
        return [self.prompts[_order(seed, k // size, size)[k % size]] for k in range(offset, offset + n)]


@functools.lru_cache(maxsize=64)
def _order(seed: int, rnd: int, size: int) -> tuple[int, ...]:
    order = list(range(size))
    random.Random(f"eaglepatch-prompts:{seed}:{rnd}").shuffle(order)
    return tuple(order)


def load_prompts(source: str) -> PromptSet | None:
    """The prompts ``--prompts SOURCE`` names; None for ``random-ids``. Raises UsageError (one line)."""
    if source == RANDOM_IDS:
        return None
    if source in SETS or source == MIXED:
        return builtin(source)
    if not os.path.exists(source):
        raise UsageError(f"--prompts {source!r}: no such file, and no built-in set of that name (the built-in sets: "
                         f"{', '.join(NAMES)})")
    if os.path.isdir(source):
        raise UsageError(f"--prompts {source}: a folder; give a JSONL or ShareGPT JSON file")
    try:
        with open(source, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"--prompts {source}: cannot read it: {exc.strerror or exc}") from None
    return parse(source, data)


@functools.lru_cache(maxsize=None)
def builtin(name: str) -> PromptSet:
    """A built-in set (``mixed``: every set's prompts, in the order of ``SETS``)."""
    if name == MIXED:
        return PromptSet(MIXED, tuple(p for s in SETS for p in builtin(s).prompts))
    from importlib import resources

    data = resources.files("eaglepatch.tuning").joinpath("prompt_sets", f"{name}.jsonl").read_bytes()
    got = parse(f"built-in set {name}", data)
    return PromptSet(name, got.prompts)


def parse(source: str, data: bytes) -> PromptSet:
    """The prompts of a file's bytes ``data`` (``source`` names it in errors): JSONL, or a JSON list (ShareGPT)."""
    where = f"--prompts {source}"
    if len(data) > MAX_BYTES:
        raise UsageError(f"{where}: larger than {MAX_BYTES >> 20} MiB: give a sample of at most {MAX_BYTES >> 20} "
                         f"MiB and {MAX_LINES:,} lines")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{where}: not UTF-8 text (byte {exc.start})") from None
    body = text.strip()
    if not body:
        raise UsageError(f"{where}: empty: no prompt in it")
    if body.startswith("["):
        try:
            doc = json.loads(body)
        except ValueError as exc:
            raise UsageError(f"{where}: not JSON: {_why(exc)}") from None
        prompts = _from_list(where, doc)
    else:
        prompts = _from_lines(where, text)
    if not prompts:
        raise UsageError(f"{where}: no prompt in it")
    return PromptSet(source, tuple(prompts))


def _why(exc: ValueError) -> str:
    return " ".join(str(exc).split())[:200]


def _from_lines(where: str, text: str) -> list[Prompt]:
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        if i > MAX_LINES:
            raise UsageError(f"{where}: more than {MAX_LINES:,} lines: give a sample of at most {MAX_LINES:,}")
        line = line.strip()
        if not line:
            continue
        try:
            doc = json.loads(line)
        except ValueError as exc:
            raise UsageError(f"{where}: line {i}: not JSON ({_why(exc)}); give one JSON object a line, or a "
                             "ShareGPT JSON list") from None
        out.append(_prompt(f"{where}: line {i}", doc))
    return out


def _from_list(where: str, doc: Any) -> list[Prompt]:
    if not isinstance(doc, list):
        raise UsageError(f"{where}: not a JSON list")
    if len(doc) > MAX_LINES:
        raise UsageError(f"{where}: more than {MAX_LINES:,} items: give a sample of at most {MAX_LINES:,}")
    out = []
    for i, item in enumerate(doc):
        if isinstance(item, dict) and "conversations" in item and "prompt" not in item and "messages" not in item:
            p = _sharegpt(f"{where}: item {i}", item)
            if p is not None:
                out.append(p)
        else:
            out.append(_prompt(f"{where}: item {i}", item))
    if doc and not out:
        raise UsageError(f"{where}: no conversation with a human turn in it")
    return out


def _prompt(where: str, doc: Any) -> Prompt:
    """One ``{"prompt"}`` or ``{"messages"}`` object, with its optional ``max_tokens`` and ``category``."""
    if not isinstance(doc, dict):
        raise UsageError(f"{where}: not a JSON object; give {{\"prompt\": \"...\"}} or {{\"messages\": [...]}}")
    if "prompt" in doc and "messages" in doc:
        raise UsageError(f"{where}: both \"prompt\" and \"messages\": give one")
    max_tokens = _max_tokens(where, doc.get("max_tokens"))
    category = _category(where, doc.get("category"))
    if "messages" in doc:
        return Prompt(messages=_messages(where, doc["messages"]), max_tokens=max_tokens, category=category)
    text = doc.get("prompt")
    if not isinstance(text, str) or not text.strip():
        raise UsageError(f"{where}: no prompt: give \"prompt\" (a non-empty text) or \"messages\"")
    return Prompt(text=text, max_tokens=max_tokens, category=category)


def _messages(where: str, msgs: Any) -> tuple[dict[str, Any], ...]:
    if not isinstance(msgs, list) or not msgs:
        raise UsageError(f"{where}: \"messages\" must be a non-empty list of {{\"role\", \"content\"}} objects")
    for j, m in enumerate(msgs):
        if (not isinstance(m, dict) or not isinstance(m.get("role"), str)
                or not isinstance(m.get("content"), (str, list))):
            raise UsageError(f"{where}: message {j}: give {{\"role\": \"user\", \"content\": \"...\"}}")
    return tuple(dict(m) for m in msgs)


def _max_tokens(where: str, value: Any) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise UsageError(f"{where}: \"max_tokens\" must be a whole number from 1, not {value!r}")
    return value


def _category(where: str, value: Any) -> str:
    if value is None:
        return UNCATEGORIZED
    if not isinstance(value, str) or not value.strip():
        raise UsageError(f"{where}: \"category\" must be a non-empty text, not {value!r}")
    return value.strip()


def _sharegpt(where: str, item: dict[str, Any]) -> Prompt | None:
    """A ShareGPT conversation's first human turn (as chat messages) and its reply's length in characters / 4 as
    ``max_tokens``; None when it has no human turn."""
    turns = item.get("conversations")
    if not isinstance(turns, list):
        raise UsageError(f"{where}: \"conversations\" must be a list of {{\"from\", \"value\"}} turns")
    for j, turn in enumerate(turns):
        if not isinstance(turn, dict):
            continue
        value = turn.get("value")
        if str(turn.get("from", "")).lower() not in _HUMAN or not isinstance(value, str) or not value.strip():
            continue
        reply = turns[j + 1] if j + 1 < len(turns) else None
        max_tokens = None
        if (isinstance(reply, dict) and str(reply.get("from", "")).lower() in _REPLIES
                and isinstance(reply.get("value"), str) and reply["value"].strip()):
            max_tokens = max(1, round(len(reply["value"]) / CHARS_PER_TOKEN))
        return Prompt(messages=({"role": "user", "content": value},), max_tokens=max_tokens,
                      category=_category(where, item.get("category")))
    return None
