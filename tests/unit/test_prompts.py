"""The load's prompts (``--prompts``, eaglepatch/tuning/prompts.py): each source format, the built-in sets, the seeded
order, categories, bad files; the requests the load builds from them and sends (eaglepatch/tuning/load.py,
load_http.py: text to ``/generate``, messages to ``/v1/chat/completions``), read back from small in-process servers;
and the per-category figures. End to end against the stand-in server: tests/e2e/test_prompts_e2e.py."""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from eaglepatch.errors import UsageError
from eaglepatch.tuning import prompts as pr
from eaglepatch.tuning.bench import BenchOptions, render_bench
from eaglepatch.tuning.load import LoadResult, LoadSpec, run_load, run_window
from eaglepatch.tuning.load_http import Request, RequestResult

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str | bytes, name: str = "p.jsonl") -> str:
    path = tmp_path / name
    (path.write_bytes if isinstance(text, bytes) else path.write_text)(text)
    return str(path)


# ----------------------------------------------------------------------------------------------------------------
# the formats


def test_a_jsonl_file_of_text_prompts_and_chat_messages(tmp_path):
    src = write(tmp_path, "\n".join([
        json.dumps({"prompt": "Once upon a time", "max_tokens": 40, "category": "story"}),
        "",  # blank lines are skipped
        json.dumps({"messages": [{"role": "system", "content": "Be brief."},
                                 {"role": "user", "content": "What is 2 + 2?"}], "category": "math"}),
        json.dumps({"prompt": "no category, no length"}),
    ]) + "\n")
    ps = pr.load_prompts(src)
    assert ps is not None and ps.source == src and len(ps.prompts) == 3
    a, b, c = ps.prompts
    assert (a.text, a.messages, a.max_tokens, a.category) == ("Once upon a time", None, 40, "story")
    assert b.text is None and b.messages[1] == {"role": "user", "content": "What is 2 + 2?"}
    assert (b.max_tokens, b.category) == (None, "math")
    assert (c.max_tokens, c.category) == (None, pr.UNCATEGORIZED)
    assert ps.categories == ("math", "story", "uncategorized") and ps.has_chat and ps.has_text


def test_a_sharegpt_file_gives_each_first_human_turn_and_its_replys_length(tmp_path):
    convs = [
        {"id": "a", "conversations": [{"from": "system", "value": "You are helpful."},
                                      {"from": "human", "value": "Tell me about tides."},
                                      {"from": "gpt", "value": "x" * 402},
                                      {"from": "human", "value": "And about waves?"},
                                      {"from": "gpt", "value": "short"}]},
        {"id": "b", "conversations": []},  # nothing to send: skipped, as ShareGPT's dumps hold many
        {"id": "c", "conversations": [{"from": "gpt", "value": "a reply with no question"}]},  # skipped
        {"id": "d", "conversations": [{"from": "human", "value": "Unanswered?"}], "category": "open"},
    ]
    ps = pr.load_prompts(write(tmp_path, json.dumps(convs), "sharegpt.json"))
    assert [p.messages for p in ps.prompts] == [({"role": "user", "content": "Tell me about tides."},),
                                                ({"role": "user", "content": "Unanswered?"},)]
    # the reply's length in characters / 4, its estimate in tokens; no reply: --max-new-tokens
    assert [p.max_tokens for p in ps.prompts] == [round(402 / 4), None]
    assert [p.category for p in ps.prompts] == [pr.UNCATEGORIZED, "open"]


def test_a_json_list_may_hold_prompt_objects_too(tmp_path):
    ps = pr.load_prompts(write(tmp_path, json.dumps([{"prompt": "a"}, {"messages": [{"role": "user",
                                                                                      "content": "b"}]}]), "l.json"))
    assert [p.text for p in ps.prompts] == ["a", None]


def test_the_built_in_sets(tmp_path):
    sizes = {}
    for name in pr.SETS:
        ps = pr.load_prompts(name)
        sizes[name] = len(ps.prompts)
        assert 100 <= len(ps.prompts) <= 300, name
        assert ps.categories == (name,)  # every line marked with its set
        assert len({json.dumps(p.to_json()) for p in ps.prompts}) == len(ps.prompts), f"{name}: duplicates"
        assert all(p.max_tokens is None for p in ps.prompts)  # --max-new-tokens caps them
    # chat, summarize and reasoning go through the chat template; code holds editor-like text completions too
    assert not pr.load_prompts("chat").has_text and pr.load_prompts("chat").has_chat
    assert pr.load_prompts("code").has_text and pr.load_prompts("code").has_chat
    assert any(len(m["content"]) > 1000 for p in pr.load_prompts("summarize").prompts for m in p.messages)
    assert any(len(p.messages) == 3 for p in pr.load_prompts("chat").prompts)  # multi-turn
    mixed = pr.load_prompts("mixed")
    assert len(mixed.prompts) == sum(sizes.values()) and mixed.categories == tuple(sorted(pr.SETS))
    assert pr.load_prompts("random-ids") is None and pr.DEFAULT == "mixed"
    # small enough to ship, and what tools/make_prompt_sets.py writes
    folder = ROOT / "eaglepatch" / "tuning" / "prompt_sets"
    assert sum(f.stat().st_size for f in folder.glob("*.jsonl")) < 400_000
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "make_prompt_sets.py"), "--check"], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr


def test_the_sets_ship_in_the_package():
    text = (ROOT / "pyproject.toml").read_text()
    assert '"eaglepatch.tuning" = ["prompt_sets/*.jsonl"]' in text


# ----------------------------------------------------------------------------------------------------------------
# the seeded order


def test_the_order_is_seeded_and_each_prompt_comes_once_a_pass():
    ps = pr.load_prompts("reasoning")
    n = len(ps.prompts)
    a = ps.draw(seed=3, n=2 * n + 5)
    assert a == ps.draw(seed=3, n=2 * n + 5)  # the same seed, the same prompts
    assert a != ps.draw(seed=4, n=2 * n + 5)
    assert a[:n] != list(ps.prompts)  # shuffled
    # every prompt once in each pass over the set, each pass in an order of its own
    assert collections.Counter(map(id, a[:n])) == collections.Counter(map(id, ps.prompts))
    assert collections.Counter(map(id, a[n:2 * n])) == collections.Counter(map(id, ps.prompts))
    assert a[:n] != a[n:2 * n]
    # prompt k depends only on the seed and k: a window at an offset draws what a longer draw holds there
    assert ps.draw(seed=3, n=7, offset=n - 2) == a[n - 2:n + 5]


def test_the_load_draws_its_requests_from_the_set(tmp_path):
    src = write(tmp_path, "".join(json.dumps(d) + "\n" for d in (
        {"prompt": "t1", "category": "x"}, {"prompt": "t2", "max_tokens": 9, "category": "y"},
        {"messages": [{"role": "user", "content": "m1"}], "category": "x"})))
    spec = LoadSpec(prompt_source=src, max_new_tokens=50, seed=1, temperature=0.6, top_p=0.9)
    reqs = spec.draw(6)
    assert reqs == spec.draw(6) and reqs[2:] == spec.draw(4, offset=2)
    assert sorted(r.text or r.messages[0]["content"] for r in reqs) == ["m1", "m1", "t1", "t1", "t2", "t2"]
    by = {r.text or r.messages[0]["content"]: r for r in reqs}
    assert (by["t2"].max_tokens, by["t1"].max_tokens, by["m1"].max_tokens) == (9, 50, 50)
    assert by["m1"].chat and not by["t1"].chat and by["t1"].category == "x"
    # text honours the end of sequence unless told; the sampling is as given
    assert all((r.temperature, r.top_p, r.ignore_eos) == (0.6, 0.9, False) for r in reqs)
    assert LoadSpec(prompt_source=src, ignore_eos=True).draw(1)[0].ignore_eos is True
    ids = LoadSpec(input_len=5, seed=2).draw(2)
    assert [r.ids for r in ids] == LoadSpec(input_len=5, seed=2).prompts(2)
    assert all(r.ignore_eos and r.category == "random-ids" and r.temperature == 0.0 for r in ids)
    assert LoadSpec(ignore_eos=False).draw(1)[0].ignore_eos is False


def test_the_loads_identity(tmp_path):
    """A sweep's identity (LoadSpec.to_json): the random token ids, greedy, keep the shape they always had; a set
    adds the prompts, their digest and the sampling (and drops --input-len, which it does not use)."""
    assert LoadSpec().to_json() == {"requests": 32, "concurrency": 4, "input_len": 128, "max_new_tokens": 128,
                                    "warmup": 4, "seed": 0}
    mixed = LoadSpec(prompt_source="mixed").to_json()
    assert mixed["prompts"] == "mixed" and len(mixed["prompts_digest"]) == 16 and "input_len" not in mixed
    assert (mixed["temperature"], mixed["top_p"], mixed["ignore_eos"]) == (0.0, 1.0, False)
    assert LoadSpec(prompt_source="mixed", input_len=7).to_json() == mixed
    assert LoadSpec(prompt_source="mixed", temperature=0.7).to_json() != mixed
    sampled = LoadSpec(temperature=1.0).to_json()
    assert sampled["prompts"] == "random-ids" and sampled["input_len"] == 128 and "prompts_digest" not in sampled
    # a file changed between two runs is another load
    src = write(tmp_path, '{"prompt": "a"}\n')
    before = LoadSpec(prompt_source=src).to_json()
    write(tmp_path, '{"prompt": "b"}\n')
    assert LoadSpec(prompt_source=src).to_json() != before
    # bench's load names the prompts and the sampling always
    assert LoadSpec().sampling_json() == {"prompts": "random-ids", "temperature": 0.0, "top_p": 1.0,
                                          "ignore_eos": True}
    # a replaced spec keeps its set (and reads another when the source changes)
    spec = LoadSpec(prompt_source="code")
    assert BenchOptions(load=spec).each()[0].load.prompt_set is spec.prompt_set
    import dataclasses

    assert dataclasses.replace(spec, prompt_source="chat").prompt_set.source == "chat"


@pytest.mark.parametrize("kw, match", [
    (dict(temperature=-0.1), "--temperature"), (dict(temperature=float("nan")), "--temperature"),
    (dict(top_p=0.0), "--top-p"), (dict(top_p=1.5), "--top-p"), (dict(prompt_source="nosuch"), "--prompts"),
])
def test_bad_sampling_and_sources_are_usage_errors(kw, match):
    with pytest.raises(UsageError, match=match):
        LoadSpec(**kw)


# ----------------------------------------------------------------------------------------------------------------
# bad input: one line, before anything is sent


@pytest.mark.parametrize("content, match", [
    ("not json at all\n", r"line 1: not JSON"),
    ('{"prompt": "ok"}\n{"prompt": "ok", \n', r"line 2: not JSON"),
    ('{"text": "no prompt here"}\n', r"line 1: no prompt"),
    ('{"prompt": ""}\n', r"line 1: no prompt"),
    ('{"prompt": "a", "messages": []}\n', r"both"),
    ('{"messages": []}\n', r"non-empty list"),
    ('{"messages": [{"role": "user"}]}\n', r"message 0"),
    ('{"prompt": "a", "max_tokens": 0}\n', r"max_tokens"),
    ('{"prompt": "a", "max_tokens": "9"}\n', r"max_tokens"),
    ('{"prompt": "a", "category": 3}\n', r"category"),
    ('["a", "b"]\n', r"item 0: not a JSON object"),
    ('[{"conversations": [{"from": "gpt", "value": "x"}]}]', r"no conversation with a human turn"),
    ('[{"conversations": "nope"}]', r"conversations"),
    ('[1, 2', r"not JSON"),
    ("", r"empty"),
    ("\n  \n\n", r"empty"),
    ("[]", r"no prompt"),
    (b"\xff\xfe\x00bad", r"not UTF-8"),
])
def test_a_bad_file_is_one_line(tmp_path, content, match):
    src = write(tmp_path, content)
    with pytest.raises(UsageError, match=match) as err:
        pr.load_prompts(src)
    assert "\n" not in str(err.value) and src in str(err.value)


def test_a_huge_file_is_refused_after_a_bounded_read(tmp_path, monkeypatch):
    """A 1 GB file: read no further than MAX_BYTES + 1, then one line (a sparse file: no disk is used)."""
    big = tmp_path / "huge.jsonl"
    with open(big, "wb") as f:
        f.truncate(1 << 30)
    monkeypatch.setattr(pr, "MAX_BYTES", 1 << 20)
    with pytest.raises(UsageError, match=r"larger than 1 MiB: give a sample") as err:
        pr.load_prompts(str(big))
    assert "\n" not in str(err.value)
    # and too many lines
    monkeypatch.setattr(pr, "MAX_LINES", 3)
    with pytest.raises(UsageError, match="more than 3 lines"):
        pr.load_prompts(write(tmp_path, '{"prompt": "a"}\n' * 4))
    assert len(pr.load_prompts(write(tmp_path, '{"prompt": "a"}\n' * 3)).prompts) == 3


def test_an_unknown_name_or_a_folder_is_one_line(tmp_path):
    with pytest.raises(UsageError, match=r"no such file, and no built-in set .*mixed, chat, code, summarize, "
                                         r"reasoning, random-ids"):
        pr.load_prompts("reasonig")
    with pytest.raises(UsageError, match="a folder"):
        pr.load_prompts(str(tmp_path))


# ----------------------------------------------------------------------------------------------------------------
# what is sent, and what is read back


def test_the_request_bodies():
    ids = Request(16, ids=[11, 12], category="random-ids").body(True, None, "m")
    # the token-id load's body is what it always was
    assert ids == {"input_ids": [11, 12], "sampling_params": {"max_new_tokens": 16, "temperature": 0.0,
                                                               "ignore_eos": True}, "stream": True}
    text = Request(8, text="hi", temperature=0.5, top_p=0.8, ignore_eos=False).body(True, "r1", "m")
    assert text == {"text": "hi", "sampling_params": {"max_new_tokens": 8, "temperature": 0.5, "ignore_eos": False,
                                                       "top_p": 0.8}, "stream": True, "rid": "r1"}
    chat = Request(8, messages=[{"role": "user", "content": "hi"}], ignore_eos=False).body(True, "r2", "served")
    assert chat == {"model": "served", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
                    "temperature": 0.0, "top_p": 1.0, "ignore_eos": False, "stream": True,
                    "stream_options": {"include_usage": True}, "rid": "r2"}
    assert "stream_options" not in Request(8, messages=[{"role": "user", "content": "x"}]).body(False, None, "m")


class _Server:
    """``/generate`` and ``/v1/chat/completions`` as sglang streams them, recording each request (``bodies``:
    (path, body)). A chat answer: a role chunk without content, then ``chunks`` of text, a finish chunk, and (with
    ``include_usage``) a usage chunk whose ``completion_tokens_details`` counts the accepted drafts (``details``
    False: a release that gives none); ``usage`` False: a server that never sends one."""

    def __init__(self, chunks: int = 4, tokens_per_chunk: int = 3, usage: bool = True, details: bool = True,
                 meta: dict | None = None):
        self.bodies: list[tuple[str, dict]] = []
        self.lock = threading.Lock()
        outer = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_GET(self):
                data = json.dumps({"object": "list", "data": [{"id": "my-model"}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def send_chunk(self, doc):
                data = b"data: " + (doc if isinstance(doc, bytes) else json.dumps(doc).encode()) + b"\n\n"
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer.lock:
                    outer.bodies.append((self.path, body))
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                tokens = 1 + chunks * tokens_per_chunk  # the first from prefill
                if self.path == "/generate":
                    for k in range(chunks + 1):
                        done = 1 + k * tokens_per_chunk
                        self.send_chunk({"text": "x" * done, "meta_info": {
                            "completion_tokens": done, "spec_verify_ct": k}})
                else:
                    self.send_chunk({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
                    self.send_chunk({"choices": [{"index": 0, "delta": {"content": "a"}}]})
                    for _ in range(chunks):
                        self.send_chunk({"choices": [{"index": 0, "delta": {"content": "bbb"}}],
                                         **({"meta_info": meta} if meta else {})})
                    self.send_chunk({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
                    if usage and (body.get("stream_options") or {}).get("include_usage"):
                        u = {"prompt_tokens": 5, "completion_tokens": tokens, "total_tokens": tokens + 5}
                        if details:  # chunks cycles of tokens_per_chunk: that many minus one accepted each
                            u["completion_tokens_details"] = {"accepted_prediction_tokens": chunks * (tokens_per_chunk - 1)}
                        self.send_chunk({"choices": [], "usage": u})
                self.send_chunk(b"[DONE]")
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def make_server():
    made: list[_Server] = []

    def make(**kw) -> _Server:
        made.append(_Server(**kw))
        return made[-1]

    yield make
    for s in made:
        s.close()


def mixed_file(tmp_path) -> str:
    return write(tmp_path, "".join(json.dumps(d) + "\n" for d in (
        {"prompt": "complete this", "category": "code"},
        {"messages": [{"role": "user", "content": "hello"}], "category": "chat", "max_tokens": 20})))


def test_text_goes_to_generate_and_messages_to_the_chat_endpoint(make_server, tmp_path):
    srv = make_server()
    spec = LoadSpec(requests=6, concurrency=2, warmup=1, prompt_source=mixed_file(tmp_path), max_new_tokens=30,
                    temperature=0.3, top_p=0.95, seed=5)
    res = run_load(srv.url, spec)
    assert res.failed == 0 and len(res.results) == 6
    sent = srv.bodies[1:]  # after the warm-up's one
    paths = collections.Counter(p for p, _ in sent)
    assert set(paths) == {"/generate", "/v1/chat/completions"} and sum(paths.values()) == 6
    for path, body in sent:
        if path == "/generate":
            assert body["text"] == "complete this" and "input_ids" not in body
            assert body["sampling_params"] == {"max_new_tokens": 30, "temperature": 0.3, "ignore_eos": False,
                                               "top_p": 0.95}
        else:
            assert body["messages"] == [{"role": "user", "content": "hello"}] and body["model"] == "my-model"
            assert (body["max_tokens"], body["temperature"], body["top_p"], body["ignore_eos"]) == (20, 0.3, 0.95,
                                                                                                  False)
            assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    # the seeded order: the same seed sends the same requests
    again = make_server()
    run_load(again.url, spec)
    # (each request's "rid" is eaglepatch's own, unique per client: not part of what the seed draws)
    assert all(b[1]["rid"].startswith("eaglepatch-") for b in again.bodies + srv.bodies)
    key = lambda b: json.dumps({k: v for k, v in b[1].items() if k != "rid"}, sort_keys=True)  # noqa: E731
    assert sorted(map(key, again.bodies)) == sorted(map(key, srv.bodies))
    # both endpoints read alike: 13 tokens, 4 verify steps each (accept length 13 / 4), TTFT from the first content
    for r in res.ok:
        assert r.completion_tokens == 13 and r.verify_ct == 4 and r.streamed and r.ttft is not None
        assert len(r.itls) == 4 and r.category in ("code", "chat")
    assert res.accept_len == pytest.approx(13 / 4)
    cats = res.categories()
    assert set(cats) == {"chat", "code"} and sum(c["requests"] for c in cats.values()) == 6
    for c in cats.values():
        assert c["accept_len"] == pytest.approx(3.25) and c["failed"] == 0
        assert c["tokens_per_s"] == pytest.approx(c["output_tokens"] / res.seconds, rel=1e-3)
    assert res.to_json()["output_len"] == {"min": 13, "mean": 13.0, "p50": 13.0, "p90": 13.0, "p99": 13.0,
                                           "max": 13.0}


def test_a_chat_answer_without_the_drafts_has_no_accept_length(make_server):
    """sglang's chat endpoint gives no accept length in some releases: the tokens still count, the accept length is
    null; a chunk's meta_info (when a release sends one) gives it; no usage at all: the request failed, says why."""
    chat = [Request(10, messages=[{"role": "user", "content": "x"}])]
    from eaglepatch.tuning.load_http import _Client
    import time

    for kw, tokens, verify in ((dict(details=False), 13, None), (dict(details=False, meta={"spec_verify_ct": 5}),
                                                                13, 5)):
        srv = make_server(**kw)
        r = _Client(srv.url, None, 10).send(chat[0], True, time.perf_counter)
        assert r.ok and r.completion_tokens == tokens and r.verify_ct == verify and r.accept_len is None
    srv = make_server(usage=False)
    r = _Client(srv.url, None, 10).send(chat[0], True, time.perf_counter)
    assert not r.ok and "usage.completion_tokens" in r.error


def test_a_window_sends_chat_with_its_request_ids(make_server, tmp_path):
    srv = make_server()
    spec = LoadSpec(concurrency=1, warmup=0, prompt_source=mixed_file(tmp_path))
    res = run_window(srv.url, spec, 0.2, "eaglepatch-t-s3-w0-", offset=100)
    assert res.failed == 0
    rids = [b["rid"] for _p, b in srv.bodies]
    assert rids[:2] == ["eaglepatch-t-s3-w0-0", "eaglepatch-t-s3-w0-1"]
    assert {p for p, _b in srv.bodies} == {"/generate", "/v1/chat/completions"}


def test_the_categories_and_output_lengths_in_bench(tmp_path):
    def rr(cat, tokens, hist=None, ok=True):
        return RequestResult(ok, 0.0, 0.5, ttft=0.1, completion_tokens=tokens, verify_ct=tokens // 2 or None,
                             streamed=True, draft_hist=hist, category=cat)

    lr = LoadResult(LoadSpec(prompt_source="mixed"), 0.0, 2.0, (
        rr("code", 40, (1, 3)), rr("code", 20, (1, 1)), rr("chat", 10), rr("chat", 0, ok=False),
    ), streamed=True, elapsed=2.0)
    cats = lr.categories()
    assert cats["code"] == {"requests": 2, "failed": 0, "output_tokens": 60, "tokens_per_s": 30.0,
                            "accept_len": 2.0, "acceptance": {"samples": 6, "at_least": [1.0, 0.6667]}}
    assert cats["chat"]["requests"] == 2 and cats["chat"]["failed"] == 1 and cats["chat"]["acceptance"] is None
    assert cats["chat"]["tokens_per_s"] == 5.0
    assert lr.to_json()["output_len"]["min"] == 10 and lr.to_json()["output_len"]["max"] == 40.0
    spec = lr.spec
    doc = {"target": "gpu1", "load": dict(spec.to_json(), request_rate=None, **spec.sampling_json()),
           "categories": cats, "client": lr.to_json(), "timings": None, "notes": []}
    text = render_bench(doc)
    assert "prompts mixed, up to 128 out" in text and "by prompt category:" in text
    assert "end of sequence honoured" in text and "p50 20" in text
    assert "code" in text and "30.0 client tok/s  accept length 2.00  acceptance, at least 2: 0.67" in text
    sampled = dict(doc, load=dict(doc["load"], temperature=0.7, top_p=0.9))
    assert "temperature 0.7, top-p 0.9" in render_bench(sampled)
