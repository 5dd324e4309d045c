"""The load's HTTP side: one request (``Request``) on a persistent connection, streamed, and what it measured
(``RequestResult``): token ids or text to sglang's ``/generate``, chat messages to its OpenAI-compatible
``/v1/chat/completions`` (so that the model's chat template applies). ``eaglepatch.tuning.load`` drives the
requests (closed and open loops, windows).

Standard library only.
"""

from __future__ import annotations

import base64
import dataclasses
import http.client
import itertools
import json
import secrets
import socket
import ssl
import threading
import urllib.parse
from typing import Any, Callable, Mapping, Sequence


@dataclasses.dataclass(frozen=True)
class RequestResult:
    """One request: ``ok`` or ``error``; times in seconds (``ttft`` None without streaming)."""

    ok: bool
    start: float
    latency: float
    ttft: float | None = None
    completion_tokens: int = 0
    accept_len: float | None = None
    verify_ct: int | None = None
    error: str | None = None
    streamed: bool = False
    server_ttft: float | None = None  # the server's own view of the first token (its meta_info.e2e_latency)
    # the server's own count of verify steps by drafts accepted (meta_info.spec_correct_drafts_histogram: index =
    # correct drafts, bonus token not counted)
    draft_hist: tuple[int, ...] | None = None
    # the inter-token latencies (seconds): the gaps between successive streamed chunks that carried new output
    itls: tuple[float, ...] = ()
    # an open loop's wait for a free slot (seconds) between the request's arrival and its send
    queued: float = 0.0
    category: str | None = None  # the prompt's category (--prompts)


CHAT_PATH = "/v1/chat/completions"
# Every request eaglepatch's load sends carries an sglang "rid" starting so (a live sweep's window's too:
# ``live.rid_prefix``): the patch's runtime tells the server's own traffic from it (the records' "others").
LOAD_RID = "eaglepatch-"


@dataclasses.dataclass(frozen=True)
class Request:
    """One request of the load: its prompt (``ids``: token ids, or ``text``: to ``/generate``; ``messages``: to
    the chat endpoint), its output length, the sampling sent, and the prompt's category."""

    max_tokens: int
    ids: Sequence[int] | None = None
    text: str | None = None
    messages: Sequence[Mapping[str, Any]] | None = None
    temperature: float = 0.0
    top_p: float = 1.0
    ignore_eos: bool = True
    category: str | None = None

    @property
    def chat(self) -> bool:
        return self.messages is not None

    def body(self, stream: bool, rid: str | None, model: str) -> dict[str, Any]:
        """The request's JSON: sglang's ``/generate`` (``input_ids`` or ``text``, ``sampling_params``), or an OpenAI
        chat completion (``messages``; streamed with ``stream_options.include_usage``, whose last chunk carries the
        token counts). ``top_p`` only when it is not 1, so that the greedy load's body is what it always was."""
        if self.messages is not None:
            doc: dict[str, Any] = {"model": model, "messages": [dict(m) for m in self.messages],
                                   "max_tokens": self.max_tokens, "temperature": self.temperature,
                                   "top_p": self.top_p, "ignore_eos": self.ignore_eos, "stream": stream}
            if stream:
                doc["stream_options"] = {"include_usage": True}
        else:
            sp: dict[str, Any] = {"max_new_tokens": self.max_tokens, "temperature": self.temperature,
                                  "ignore_eos": self.ignore_eos}
            if self.top_p != 1.0:
                sp["top_p"] = self.top_p
            doc = {"text": self.text} if self.ids is None else {"input_ids": list(self.ids)}
            doc.update(sampling_params=sp, stream=stream)
        if rid is not None:
            doc["rid"] = rid
        return doc


class _Client:
    """POSTs to one server, one persistent HTTP/1.1 connection per thread (a concurrency slot): through an SSH
    forward, a new connection is a new SSH channel (a round trip), so each slot opens its connection once, before
    its clock starts, and every request is timed from the moment it is written on an open connection. A server
    that closes the connection after an answer gets a new one, opened again before the next request's clock.

    Each request goes out in one write on a TCP_NODELAY socket: http.client writes a request's head and body
    separately, and through a forward Nagle's algorithm and a delayed ACK then hold the body back by up to 40 ms
    (measured: TTFT 86 ms through loopback SSH against 42 ms locally, one request at a time). No proxies (the
    target is a loopback address or a tunnel).

    ``base_url``: what the requests name (``http://127.0.0.1:PORT``, or ``--url``: its host in ``Host`` and for
    TLS, its path as the endpoints' prefix, its query sent with each, its ``user:password`` as HTTP Basic
    credentials instead of ``api_key``'s Bearer); ``connect``: the (host, port) the connections open instead (a
    port forwarded to the URL's host), None for the URL's own."""

    def __init__(self, base_url: str, api_key: str | None, timeout: float,
                 connect: tuple[str, int] | None = None):
        parts = urllib.parse.urlsplit(base_url)
        self.tls = parts.scheme.lower() == "https"
        self.hostname = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if self.tls else 80)
        self.host, self.connect_port = connect if connect is not None else (self.hostname, self.port)
        self.prefix = parts.path.rstrip("/") or ""
        query = f"?{parts.query}" if parts.query else ""
        netloc = f"[{self.hostname}]" if ":" in self.hostname else self.hostname
        # the port as the URL gave it (a server's own address always names one)
        self.host_header = f"{netloc}:{parts.port}" if parts.port else netloc
        self.api_key = api_key
        if parts.username:
            pair = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
            self.auth: str | None = "Basic " + base64.b64encode(pair.encode()).decode("ascii")
        else:
            self.auth = f"Bearer {api_key}" if api_key else None
        self.query = query
        self.heads = {p: (f"POST {self.prefix}{p}{query} HTTP/1.1\r\nHost: {self.host_header}\r\n"
                          "Content-Type: application/json\r\nConnection: keep-alive\r\n"
                          + (f"Authorization: {self.auth}\r\n" if self.auth else ""))
                      for p in ("/generate", CHAT_PATH)}
        self.timeout = timeout
        self.model = "default"  # the chat endpoint's "model": the served model's name (find_model)
        self._local = threading.local()
        self._lock = threading.Lock()
        self._all: list[socket.socket] = []
        self.connects = 0  # connections opened
        # the ids of requests sent without one: eaglepatch-<8 hex digits of this client>-<n>, unique per request
        self.rid_tag = f"{LOAD_RID}{secrets.token_hex(4)}-"
        self._numbers = itertools.count()

    def _open(self, timeout: float) -> socket.socket:
        """A new connection (TLS for an https URL, checked against the URL's host whatever port it goes through)."""
        sock = socket.create_connection((self.host, self.connect_port), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.tls:
            try:
                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=self.hostname)
            except BaseException:
                sock.close()
                raise
        return sock

    def _sock(self) -> socket.socket:
        sock = getattr(self._local, "sock", None)
        if sock is None:
            sock = self._open(self.timeout)
            self._local.sock = sock
            with self._lock:
                self._all.append(sock)
                self.connects += 1
        return sock

    def _drop(self) -> None:
        sock = getattr(self._local, "sock", None)
        self._local.sock = None
        if sock is not None:
            sock.close()

    def close(self) -> None:
        with self._lock:
            socks, self._all = self._all, []
        for s in socks:
            s.close()

    def find_model(self) -> str:
        """The served model's name (``GET /v1/models``' first), which the chat endpoint's ``"model"`` names; kept in
        ``model``. Asked once, before the load, on a connection of its own; ``"default"`` (sglang's own default
        name) when the server does not say."""
        conn = http.client.HTTPConnection(self.hostname, self.port, timeout=min(self.timeout, 30.0))
        try:
            conn.sock = self._open(min(self.timeout, 30.0))
            heads = {"Host": self.host_header, **({"Authorization": self.auth} if self.auth else {})}
            conn.request("GET", self.prefix + "/v1/models" + self.query, headers=heads)
            resp = conn.getresponse()
            doc = json.loads(resp.read(1 << 20)) if resp.status == 200 else {}
            name = ((doc.get("data") or [{}])[0] or {}).get("id") if isinstance(doc, dict) else None
            if isinstance(name, str) and name:
                self.model = name
        except (OSError, ValueError, AttributeError, IndexError, TypeError, http.client.HTTPException):
            pass
        finally:
            conn.close()
        return self.model

    def generate(self, ids: list[int], max_new_tokens: int, stream: bool, clock: Callable[[], float],
                 rid: str | None = None) -> RequestResult:
        """One request of token ids, greedy, ``ignore_eos`` (``rid``: its request id, sglang's ``"rid"``; one of
        this client's, starting ``LOAD_RID``, when None)."""
        return self.send(Request(max_new_tokens, ids=ids), stream, clock, rid)

    def send(self, req: Request, stream: bool, clock: Callable[[], float], rid: str | None = None) -> RequestResult:
        """One request, to ``/generate`` or, for chat messages, to the chat endpoint."""
        result = self._send(req, stream, clock, rid)
        return dataclasses.replace(result, category=req.category) if req.category is not None else result

    def _send(self, req: Request, stream: bool, clock: Callable[[], float], rid: str | None) -> RequestResult:
        if rid is None:  # every request of the load is marked as eaglepatch's (LOAD_RID)
            rid = f"{self.rid_tag}{next(self._numbers)}"
        body = json.dumps(req.body(stream, rid, self.model)).encode()
        head = self.heads[CHAT_PATH if req.chat else "/generate"]
        request = (head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body
        try:
            sock = self._sock()  # opened (when it must be) before the clock starts
        except OSError as exc:
            return RequestResult(False, clock(), 0.0, error=f"{type(exc).__name__}: {exc}")
        t0 = clock()
        try:
            sock.sendall(request)
            resp = http.client.HTTPResponse(sock, method="POST")
            try:
                resp.begin()
                if resp.status >= 400:
                    detail = resp.read()[:200].decode("utf-8", "replace").strip()
                    result = RequestResult(False, t0, clock() - t0,
                                           error=f"HTTP {resp.status}: {detail or resp.reason}")
                elif stream and "event-stream" in (resp.getheader("Content-Type") or ""):
                    result = (read_chat_stream(resp, t0, clock) if req.chat else self._read_stream(resp, t0, clock))
                else:
                    data = resp.read()
                    latency = clock() - t0
                    doc = json.loads(data)
                    if isinstance(doc, list):
                        doc = doc[0] if doc else {}
                    result = (finish_chat(doc, {}, t0, latency, None, streamed=False) if req.chat
                              else _finish(doc, t0, latency, None, streamed=False))
                resp.read()  # the rest of the answer: the connection is reused only once it is read whole
                if resp.will_close:
                    self._drop()
            finally:
                resp.close()
            return result
        except (OSError, ValueError, http.client.HTTPException) as exc:
            self._drop()
            return RequestResult(False, t0, clock() - t0, error=f"{type(exc).__name__}: {exc}")

    def _read_stream(self, resp: Any, t0: float, clock: Callable[[], float]) -> RequestResult:
        """sglang's streamed ``/generate``: ``data: {json}`` lines (cumulative text and meta_info), then
        ``data: [DONE]``. TTFT: the first chunk whose ``completion_tokens`` is above 0 (or that has text). The
        inter-token latencies: the gaps between the arrivals of successive chunks that carry new output (their
        ``completion_tokens`` grew, or, without a count, their text changed), the first gap after the first token's
        chunk. A chunk may carry several tokens (speculative decoding): its gap is still one inter-token latency, as
        sglang's and vLLM's bench_serving count it (per token it would be TPOT). One float per chunk is kept."""
        ttft = server_ttft = None
        last: dict[str, Any] = {}
        marks: list[float] = []  # the arrival of each chunk that carried new output
        seen_tokens, seen_text = 0, None
        while True:
            line = resp.readline()
            now = clock()  # the chunk's arrival, before it is parsed
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                break
            doc = json.loads(payload)
            if isinstance(doc, list):
                doc = doc[0] if doc else {}
            if not isinstance(doc, dict):
                continue
            if doc.get("error"):
                return RequestResult(False, t0, clock() - t0, error=f"server error: {str(doc['error'])[:200]}")
            meta = doc.get("meta_info") or {}
            tokens = meta.get("completion_tokens")
            tokens = tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else None
            text = doc.get("text")
            if tokens is not None:
                new = tokens > seen_tokens
                seen_tokens = max(seen_tokens, tokens)
            else:
                new = bool(text) and text != seen_text
            seen_text = text
            if ttft is None and ((tokens or 0) > 0 or text):
                ttft = now - t0
                e2e = meta.get("e2e_latency")
                server_ttft = float(e2e) if isinstance(e2e, (int, float)) and not isinstance(e2e, bool) else None
                marks.append(now)
            elif new and marks:
                marks.append(now)
            last = doc
        latency = clock() - t0
        if not last:
            return RequestResult(False, t0, latency, error="the stream ended without a result")
        itls = tuple(b - a for a, b in zip(marks, marks[1:]))
        return dataclasses.replace(_finish(last, t0, latency, ttft, streamed=True), server_ttft=server_ttft,
                                   itls=itls)


def _finish(doc: Any, t0: float, latency: float, ttft: float | None, streamed: bool) -> RequestResult:
    meta = (doc.get("meta_info") or {}) if isinstance(doc, dict) else {}
    tokens = meta.get("completion_tokens")
    if not isinstance(tokens, int):
        return RequestResult(False, t0, latency, error="no meta_info.completion_tokens in the answer", streamed=streamed)
    acc = meta.get("spec_accept_length")
    ct = meta.get("spec_verify_ct")
    hist = meta.get("spec_correct_drafts_histogram", meta.get("spec_accept_histogram"))  # the older name: an alias
    ok_hist = isinstance(hist, list) and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in hist)
    return RequestResult(
        True, t0, latency, ttft=ttft, completion_tokens=tokens,
        accept_len=float(acc) if isinstance(acc, (int, float)) and not isinstance(acc, bool) and acc > 0 else None,
        verify_ct=int(ct) if isinstance(ct, int) and not isinstance(ct, bool) and ct > 0 else None,
        streamed=streamed, draft_hist=tuple(hist) if ok_hist and hist else None,
    )


def read_chat_stream(resp: Any, t0: float, clock: Callable[[], float]) -> RequestResult:
    """An OpenAI-compatible streamed chat completion: ``data: {json}`` chunks whose ``choices[0].delta.content``
    carries new text, then (``stream_options.include_usage``) a chunk with ``usage`` and no choices, then ``data:
    [DONE]``. TTFT: the first chunk with content (the first chunk, the role alone, carries none); the inter-token
    latencies: the gaps between the chunks with content. A chunk's ``meta_info`` (sglang's, when a release sends
    one) is kept for the accept length (``finish_chat``)."""
    ttft = None
    marks: list[float] = []
    usage: dict[str, Any] = {}
    meta: dict[str, Any] = {}
    chunks = 0
    while True:
        line = resp.readline()
        now = clock()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            break
        doc = json.loads(payload)
        if not isinstance(doc, dict):
            continue
        chunks += 1
        if doc.get("error"):
            return RequestResult(False, t0, clock() - t0, error=f"server error: {str(doc['error'])[:200]}")
        choices = doc.get("choices") or []
        if any(isinstance(c, dict) and isinstance(c.get("delta"), dict)
               and (c["delta"].get("content") or c["delta"].get("reasoning_content")) for c in choices):
            if ttft is None:
                ttft = now - t0
            marks.append(now)
        if isinstance(doc.get("usage"), dict):
            usage = doc["usage"]
        for m in [doc.get("meta_info")] + [c.get("meta_info") for c in choices if isinstance(c, dict)]:
            if isinstance(m, dict):
                meta.update(m)
    latency = clock() - t0
    if not chunks:
        return RequestResult(False, t0, latency, error="the stream ended without a result")
    itls = tuple(b - a for a, b in zip(marks, marks[1:]))
    return dataclasses.replace(finish_chat({"usage": usage}, meta, t0, latency, ttft, streamed=True), itls=itls)


def finish_chat(doc: Any, meta: dict[str, Any], t0: float, latency: float, ttft: float | None,
                streamed: bool) -> RequestResult:
    """A chat completion's result: its completion tokens from ``usage`` (else sglang's ``meta_info``); the accept
    length from sglang's ``meta_info`` when a chunk carried one, else from ``usage``: ``spec_accept_length`` /
    ``spec_verify_ct`` when there, else ``completion_tokens_details.accepted_prediction_tokens`` (the drafts
    accepted: verify steps = completion tokens - 1 - accepted drafts, the first token coming from prefill); else
    null, as sglang's chat endpoint gives none in some releases."""
    usage = (doc.get("usage") or {}) if isinstance(doc, dict) else {}
    if isinstance(doc, dict):  # a whole answer's: at the top, or its choice's (sglang's return_meta_info)
        choices = doc.get("choices") if isinstance(doc.get("choices"), list) else []
        for m in [doc.get("meta_info")] + [c.get("meta_info") for c in choices[:1] if isinstance(c, dict)]:
            if isinstance(m, dict):
                meta = {**m, **meta}
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if not isinstance(tokens, int) or isinstance(tokens, bool):
        tokens = meta.get("completion_tokens")
    if not isinstance(tokens, int) or isinstance(tokens, bool):
        return RequestResult(False, t0, latency, streamed=streamed,
                             error="no usage.completion_tokens in the answer (stream_options.include_usage)")
    spec = {k: meta[k] for k in ("spec_accept_length", "spec_verify_ct", "spec_correct_drafts_histogram",
                                 "spec_accept_histogram") if k in meta}
    if not spec and isinstance(usage, dict):
        spec = {k: usage[k] for k in ("spec_accept_length", "spec_verify_ct") if k in usage}
        details = usage.get("completion_tokens_details")
        accepted = details.get("accepted_prediction_tokens") if isinstance(details, dict) else None
        if (not spec and isinstance(accepted, int) and not isinstance(accepted, bool) and accepted >= 0
                and tokens - 1 - accepted > 0):
            spec = {"spec_verify_ct": tokens - 1 - accepted}
    return _finish({"meta_info": dict(spec, completion_tokens=tokens)}, t0, latency, ttft, streamed=streamed)
