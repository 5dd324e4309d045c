"""``--prompts``, ``--temperature``, ``--top-p`` and ``--ignore-eos`` end to end through the installed CLI against the
stand-in sglang server, which records every request it is sent (``--record-requests``): text prompts go to
``/generate`` as ``text``, chat messages to ``/v1/chat/completions`` (streamed, usage asked for), with the sampling
given, in the seed's order; bench --json reports the load, the categories and the output lengths; bad input is one
line and exit 2 before any request is sent. The formats and the parsing in detail: tests/unit/test_prompts.py."""

from __future__ import annotations

import collections
import json
import subprocess
from pathlib import Path

import pytest

from eaglepatch.tuning.load import LoadSpec
from safety import PY, H, cli_env  # the fixture standins: conftest.py

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

SPEC_ARGS = ("--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
             "--tp", "1")
N = 24  # output tokens per request


def decode_cycles(n: int = N, acc: float = 3.2) -> int:
    """The stand-in's decode cycles for ``n`` tokens at 3 steps (accept length min(3, 2.2) + 1)."""
    left, i = n - 1, 0
    while left > 0:
        left -= max(1, int((i + 1) * acc) - int(i * acc))
        i += 1
    return i


class Server:
    """A stand-in server (unpatched: bench gives the client's figures) that records what it is sent."""

    def __init__(self, standins, tmp_path: Path, *extra: str):
        self.tree = H.make_tree(tmp_path / "site", H.V1_WORKER)
        self.record = tmp_path / "sent.jsonl"
        self.port = standins.port()
        standins.launch(self.tree, tmp_path / "work", self.port, *SPEC_ARGS, "--record-requests", str(self.record),
                        *extra)
        H.wait_http(self.port, timeout=30)
        self.env = cli_env(tmp_path)

    def cli(self, cmd: str, *args: str, timeout: float = 200) -> subprocess.CompletedProcess:
        return subprocess.run([PY, "-m", "eaglepatch", cmd, str(self.tree / "sglang"), *args], capture_output=True,
                              text=True, timeout=timeout, env=self.env)

    def bench(self, *args: str) -> dict:
        r = self.cli("bench", "--concurrency", "2", "--max-new-tokens", str(N), "--log-wait", "0", *args, "--json")
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    def sent(self) -> list[tuple[str, dict]]:
        """(path, body) of every request recorded, and forget them."""
        if not self.record.exists():
            return []
        out = [(d["path"], d["body"]) for d in map(json.loads, self.record.read_text().splitlines())]
        self.record.unlink()
        return out


def prompt_of(path: str, body: dict) -> str:
    return json.dumps(body["messages"] if path == "/v1/chat/completions" else body.get("text", body.get("input_ids")))


def test_the_default_load_sends_text_to_generate_and_messages_to_the_chat_endpoint(standins, tmp_path):
    srv = Server(standins, tmp_path)
    doc = srv.bench("--requests", "16", "--warmup", "2")
    sent = srv.sent()
    assert len(sent) == 18
    by_path = collections.Counter(p for p, _ in sent)
    assert set(by_path) == {"/generate", "/v1/chat/completions"}, by_path
    for path, body in sent:
        if path == "/generate":  # the code set's completions: text, no token ids
            assert isinstance(body["text"], str) and "input_ids" not in body
            assert body["sampling_params"] == {"max_new_tokens": N, "temperature": 0.0, "ignore_eos": False}
            assert body["stream"] is True
        else:  # through the model's chat template
            assert body["messages"][-1]["role"] == "user" and body["model"] == "stand-in/model"
            assert (body["max_tokens"], body["temperature"], body["top_p"], body["ignore_eos"]) == (N, 0.0, 1.0,
                                                                                                  False)
            assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    # the seed's order: the warm-up's 2, then the load's 16, as the load draws them (2 at a time: in any order)
    spec = LoadSpec(prompt_source="mixed", max_new_tokens=N)
    want = [prompt_of("/v1/chat/completions" if r.chat else "/generate",
                      {"messages": r.messages} if r.chat else {"text": r.text})
            for r in spec.draw(2, offset=1_000_000) + spec.draw(16)]
    assert sorted(prompt_of(p, b) for p, b in sent[:2]) == sorted(want[:2])
    assert sorted(prompt_of(p, b) for p, b in sent[2:]) == sorted(want[2:])
    # bench --json: the load, the categories, the output lengths
    load = doc["load"]
    assert (load["prompts"], load["temperature"], load["top_p"], load["ignore_eos"]) == ("mixed", 0.0, 1.0, False)
    assert "input_len" not in load and len(load["prompts_digest"]) == 16
    cats = doc["categories"]
    assert set(cats) <= {"chat", "code", "summarize", "reasoning"} and len(cats) >= 2
    assert sum(c["requests"] for c in cats.values()) == 16
    for name, c in cats.items():  # the stand-in's accept length, through either endpoint
        assert c["accept_len"] == pytest.approx(N / decode_cycles(), abs=0.01), name
        assert c["tokens_per_s"] > 0 and c["failed"] == 0
    cl = doc["client"]
    assert cl["failed"] == 0 and cl["output_tokens"] == 16 * N
    assert cl["output_len"]["min"] == cl["output_len"]["max"] == N
    assert cl["accept_len"] == pytest.approx(N / decode_cycles(), abs=0.01)
    # the same seed: the same requests; another: others
    srv.bench("--requests", "16", "--warmup", "2")
    assert sorted(prompt_of(p, b) for p, b in srv.sent()) == sorted(want)
    srv.bench("--requests", "16", "--warmup", "2", "--seed", "1")
    assert sorted(prompt_of(p, b) for p, b in srv.sent()) != sorted(want)
    # and the text output says it
    r = srv.cli("bench", "--requests", "4", "--warmup", "0", "--max-new-tokens", "8", "--log-wait", "0")
    assert r.returncode == 0, r.stderr
    assert "prompts mixed, up to 8 out" in r.stdout and "output tokens per request" in r.stdout


def test_a_file_of_prompts_with_its_lengths_categories_and_the_sampling_given(standins, tmp_path):
    srv = Server(standins, tmp_path)
    lines = [{"prompt": "The quick brown fox", "max_tokens": 10, "category": "prose"},
             {"messages": [{"role": "user", "content": "Hi there"}], "max_tokens": 14, "category": "greeting"},
             {"messages": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "2+2?"}],
              "category": "math"}]
    src = tmp_path / "traffic.jsonl"
    src.write_text("".join(json.dumps(d) + "\n" for d in lines))
    doc = srv.bench("--prompts", str(src), "--requests", "9", "--warmup", "0", "--temperature", "0.8", "--top-p",
                    "0.9", "--ignore-eos", "--seed", "7")
    sent = srv.sent()
    assert len(sent) == 9
    for path, body in sent:
        if path == "/generate":
            assert body["text"] == "The quick brown fox"
            assert body["sampling_params"] == {"max_new_tokens": 10, "temperature": 0.8, "ignore_eos": True,
                                               "top_p": 0.9}
        else:
            assert path == "/v1/chat/completions"
            want = 14 if body["messages"][-1]["content"] == "Hi there" else N
            assert (body["max_tokens"], body["temperature"], body["top_p"], body["ignore_eos"]) == (want, 0.8, 0.9,
                                                                                                  True)
    # each prompt three times (the set's three passes), each answered at its own length
    assert collections.Counter(prompt_of(p, b) for p, b in sent) == {prompt_of(p, b): 3 for p, b in sent}
    cats = doc["categories"]
    assert {k: (c["requests"], c["output_tokens"]) for k, c in cats.items()} == {
        "prose": (3, 30), "greeting": (3, 42), "math": (3, 3 * N)}
    assert doc["load"]["prompts"] == str(src) and (doc["load"]["temperature"], doc["load"]["top_p"]) == (0.8, 0.9)
    assert doc["load"]["ignore_eos"] is True


def test_a_sharegpt_file_sends_each_first_human_turn_as_chat(standins, tmp_path):
    srv = Server(standins, tmp_path)
    src = tmp_path / "sharegpt.json"
    src.write_text(json.dumps([
        {"conversations": [{"from": "human", "value": "What is a tide?"}, {"from": "gpt", "value": "y" * 40},
                           {"from": "human", "value": "And a wave?"}]},
        {"conversations": []},
    ]))
    doc = srv.bench("--prompts", str(src), "--requests", "2", "--warmup", "0")
    sent = srv.sent()
    assert [p for p, _ in sent] == ["/v1/chat/completions"] * 2
    assert all(b["messages"] == [{"role": "user", "content": "What is a tide?"}] and b["max_tokens"] == 10
               for _, b in sent)
    assert doc["client"]["output_tokens"] == 20 and set(doc["categories"]) == {"uncategorized"}


def test_the_end_of_sequence_is_honoured_for_text_and_the_lengths_reported(standins, tmp_path):
    """A server whose requests end at their end of sequence (the stand-in's --sim-eos: a length each prompt
    decides): the output lengths vary, and are reported; --ignore-eos asks for every token."""
    srv = Server(standins, tmp_path, "--sim-eos")
    doc = srv.bench("--prompts", "chat", "--requests", "12", "--warmup", "0")
    lens = doc["client"]["output_len"]
    assert N // 2 <= lens["min"] < lens["max"] <= N, lens
    assert all(b["ignore_eos"] is False for _, b in srv.sent())
    doc = srv.bench("--prompts", "chat", "--requests", "12", "--warmup", "0", "--ignore-eos")
    assert doc["client"]["output_len"]["min"] == doc["client"]["output_len"]["max"] == N
    assert all(b["ignore_eos"] is True for _, b in srv.sent())
    # random token ids ignore it unless told
    srv.bench("--prompts", "random-ids", "--requests", "2", "--warmup", "0", "--input-len", "5")
    sent = srv.sent()
    assert all(len(b["input_ids"]) == 5 and b["sampling_params"]["ignore_eos"] is True for _, b in sent)
    doc = srv.bench("--prompts", "random-ids", "--requests", "2", "--warmup", "0", "--no-ignore-eos")
    assert all(b["sampling_params"]["ignore_eos"] is False for _, b in srv.sent())
    assert doc["load"]["ignore_eos"] is False


@pytest.mark.parametrize("content", ["not json\n", '{"text": "no prompt"}\n', "", "HUGE", "NAME"])
def test_bad_input_is_one_line_and_exit_2_before_any_request(standins, tmp_path, content):
    srv = Server(standins, tmp_path)
    src = tmp_path / "bad.jsonl"
    if content == "HUGE":  # 1 GiB, sparse: read no further than the limit
        with open(src, "wb") as f:
            f.truncate(1 << 30)
    elif content == "NAME":
        src = Path("reasonnig")
    else:
        src.write_text(content)
    for cmd, extra in (("bench", ()), ("sweep", ("--grid", "speculative-num-steps=1,2")),
                       ("sweep", ("--live", "--grid", "speculative-num-steps=1,2"))):
        r = srv.cli(cmd, *extra, "--prompts", str(src), "--requests", "2")
        assert r.returncode == 2, (cmd, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("eaglepatch: --prompts"), (cmd, r.stderr)
    assert srv.sent() == []
    for bad in (["--temperature", "-1"], ["--top-p", "0"], ["--top-p", "2"]):
        r = srv.cli("bench", *bad)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert srv.sent() == []


def test_a_sweep_sends_the_prompts_and_the_sampling_given(standins, tmp_path):
    srv = Server(standins, tmp_path)
    r = srv.cli("sweep", "--grid", "speculative-num-steps=2", "--prompts", "code", "--temperature", "0.5",
                "--requests", "3", "--concurrency", "1", "--max-new-tokens", "8", "--warmup", "0", "--log-wait", "0",
                "--timeout", "60", "--json")
    assert r.returncode == 0, r.stderr
    sent = srv.sent()
    assert len(sent) == 3
    spec = LoadSpec(prompt_source="code", max_new_tokens=8)
    want = [prompt_of("/v1/chat/completions" if q.chat else "/generate",
                      {"messages": q.messages} if q.chat else {"text": q.text}) for q in spec.draw(3)]
    assert [prompt_of(p, b) for p, b in sent] == want  # one at a time: in the seed's order
    for path, body in sent:
        t = body["temperature"] if path != "/generate" else body["sampling_params"]["temperature"]
        assert t == 0.5
    doc = json.loads(r.stdout)
    assert doc["points"][0]["status"] == "ok"
