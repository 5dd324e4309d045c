"""What ``doctor`` knows of one server, as plain data, and the parsers that turn what it read into it.

Nothing here touches a host: ``collect`` reads the host and fills a ``ServerFacts``; ``rules`` reads one. Every
parser is pure and tested on real sglang lines (tests/data/sglang_logs/).

Where a setting comes from, in order of trust: the server's own ``/server_info`` (``/get_server_info`` before
0.5.6: sglang's resolved ``ServerArgs``, defaults filled in), then the ``server_args=ServerArgs(...)`` line that
sglang logs at start (the same, resolved), then the command line as launched (only what was given). ``setting``
returns the value with the evidence that names where it came from.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Mapping, Sequence

from eaglepatch.server.argv import quote_flag

# ----------------------------------------------------------------------------------------------------------------
# Evidence


def evidence(source: str, text: str, line: str | None = None, path: str | None = None) -> dict[str, Any]:
    """One piece of evidence: where it came from (``source``: command-line, server-info, server-log, config,
    timing-log, sweep, environment, nvidia-smi, install), what it says (``text``, with the numbers), and the line
    it was read from (``line``: a log line as sglang wrote it, trimmed) or the file (``path``)."""
    out: dict[str, Any] = {"source": source, "text": text}
    if line is not None:
        out["line"] = line if len(line) <= 400 else line[:397] + "..."
    if path is not None:
        out["path"] = path
    return out


# ----------------------------------------------------------------------------------------------------------------
# sglang's log


_DECODE_RE = re.compile(r"Decode batch\b")
_RUNNING_RE = re.compile(r"#running-req:\s*(\d+)")
_ACCEPT_RE = re.compile(r"accept len: ([0-9.]+)")
_GRAPH_RE = re.compile(r"\b(cuda|cpu|npu|musa) graph: (True|False)\b")
_GEN_RE = re.compile(r"gen throughput \(token/s\): ([0-9.]+)")
_SERVER_ARGS_RE = re.compile(r"server_args=ServerArgs\(")
# decode CUDA graph captures: "Capture cuda graph bs [1, 2, 4, ...]" (to 0.5.10) and "Capture target verify CUDA
# graph begin. backend=full, num_tokens_per_req=4, bs=[1, 2, ...]" (0.5.16); prefill captures list num_tokens
_CAPTURE_RE = re.compile(r"Capture (?:cuda graph bs |(?!.*prefill).*CUDA graph begin\..*\bbs=)\[([0-9, ]+)\]")
_OVERRIDE_CTX_RE = re.compile(r"Overriding the draft model's max_position_embeddings to (\d+)")
# The lines the host keeps from a server's log (a filter applied there, before anything is sent)
LOG_FILTER = (r"Decode batch|server_args=ServerArgs\(|Capture (cuda graph bs|.*CUDA graph begin)|"
              r"Overriding the draft model's max_position_embeddings")


@dataclasses.dataclass(frozen=True)
class DecodeLine:
    """One ``Decode batch`` line of sglang's scheduler (printed every ``--decode-log-interval`` decode steps):
    the running requests (the batch size), the accept length of those steps, whether they ran in a CUDA graph,
    the throughput; None where the release does not print it."""

    line: str
    running: int | None
    accept: float | None
    graph: bool | None
    gen_tps: float | None


def parse_decode_line(line: str) -> DecodeLine | None:
    """A ``Decode batch`` line's numbers, or None when ``line`` is not one. Matches every release from 0.4 (``Decode
    batch.`` before 0.5.6, ``Decode batch,`` since; ``accept len: X`` with speculation; ``cuda graph: True|False``
    from 0.4.10, also ``cpu graph``/``npu graph`` on those devices)."""
    if not _DECODE_RE.search(line):
        return None
    run = _RUNNING_RE.search(line)
    acc = _ACCEPT_RE.search(line)
    graph = _GRAPH_RE.search(line)
    gen = _GEN_RE.search(line)
    try:
        accept = float(acc.group(1)) if acc else None
        gen_tps = float(gen.group(1)) if gen else None
    except ValueError:
        return None
    return DecodeLine(line=line.strip(), running=int(run.group(1)) if run else None, accept=accept,
                      graph=None if not graph or graph.group(1) != "cuda" else graph.group(2) == "True",
                      gen_tps=gen_tps)


_ARG_VALUE = r"('(?:[^'\\]|\\.)*'|\"[^\"]*\"|None|True|False|-?[0-9][0-9.e+-]*)"
SERVER_ARGS_KEYS = (
    "model_path", "speculative_algorithm", "speculative_draft_model_path", "speculative_num_steps",
    "speculative_eagle_topk", "speculative_num_draft_tokens", "tp_size", "cuda_graph_max_bs",
    "cuda_graph_max_bs_decode", "disable_cuda_graph", "disable_decode_cuda_graph", "disable_overlap_schedule",
    "context_length", "decode_log_interval", "disable_custom_all_reduce", "base_gpu_id", "gpu_id_step",
)


def _literal(text: str) -> Any:
    if text == "None":
        return None
    if text in ("True", "False"):
        return text == "True"
    if text[:1] in ("'", '"'):
        return text[1:-1].replace("\\'", "'")
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text


def parse_server_args_line(line: str) -> dict[str, Any] | None:
    """The few ``ServerArgs`` fields doctor uses (``SERVER_ARGS_KEYS``) from sglang's ``server_args=ServerArgs(...)``
    start-up line (the resolved arguments, defaults included); ``cuda_graph_max_bs_decode`` also from the decode
    phase of 0.5.16's ``cuda_graph_config=CudaGraphConfig(decode=PhaseConfig(..., max_bs=N, ...))``."""
    m = _SERVER_ARGS_RE.search(line)
    if not m:
        return None
    body = line[m.end():]
    out: dict[str, Any] = {}
    for key in SERVER_ARGS_KEYS:
        km = re.search(r"(?:^|[ (,])" + key + r"=" + _ARG_VALUE, body)
        if km:
            out[key] = _literal(km.group(1))
    pm = re.search(r"decode=PhaseConfig\(([^)]*)\)", body)
    if pm:
        mb = re.search(r"\bmax_bs=(\d+)", pm.group(1))
        if mb and out.get("cuda_graph_max_bs_decode") is None:
            out["cuda_graph_max_bs_decode"] = int(mb.group(1))
    return out


@dataclasses.dataclass(frozen=True)
class LogFacts:
    """What a server's log says of its current launch (the lines after its last ``server_args=`` line)."""

    path: str
    decode: tuple[DecodeLine, ...] = ()
    server_args: Mapping[str, Any] | None = None
    server_args_line: str | None = None
    captured_max_bs: int | None = None
    capture_line: str | None = None
    ctx_override_line: str | None = None
    ctx_override: int | None = None

    def spec_decode(self) -> tuple[DecodeLine, ...]:
        """The decode lines that carry an accept length (speculation on)."""
        return tuple(d for d in self.decode if d.accept is not None)


def parse_log(lines: Sequence[str], path: str = "") -> LogFacts:
    """A server log's lines (as the host's filter kept them, in order) into ``LogFacts``: only the lines after the
    last ``server_args=`` line count (a log that several launches appended to holds older launches before it)."""
    start = 0
    for i, line in enumerate(lines):
        if _SERVER_ARGS_RE.search(line):
            start = i
    decode: list[DecodeLine] = []
    sargs = sargs_line = None
    cap_bs = cap_line = over_line = None
    over = None
    for line in lines[start:]:
        d = parse_decode_line(line)
        if d is not None:
            decode.append(d)
            continue
        if sargs is None and _SERVER_ARGS_RE.search(line):
            sargs, sargs_line = parse_server_args_line(line), line.strip()
            continue
        cm = _CAPTURE_RE.search(line)
        if cm:
            sizes = [int(x) for x in cm.group(1).replace(" ", "").split(",") if x]
            if sizes and (cap_bs is None or max(sizes) > cap_bs):
                cap_bs, cap_line = max(sizes), line.strip()
            continue
        om = _OVERRIDE_CTX_RE.search(line)
        if om:
            over, over_line = int(om.group(1)), line.strip()
    return LogFacts(path=path, decode=tuple(decode), server_args=sargs, server_args_line=sargs_line,
                    captured_max_bs=cap_bs, capture_line=cap_line, ctx_override_line=over_line, ctx_override=over)


# ----------------------------------------------------------------------------------------------------------------
# Model configs


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """A model's ``config.json`` as read on the host (``path``: where), or why it was not (``error``)."""

    name: str  # what the command line gave (a folder, or a Hugging Face repo id)
    path: str | None = None
    data: Mapping[str, Any] | None = None
    error: str | None = None

    def _text(self) -> Mapping[str, Any]:
        d = self.data or {}
        tc = d.get("text_config")
        return tc if isinstance(tc, Mapping) else d

    def get(self, key: str) -> Any:
        """A field of the config, or of its ``text_config`` (multimodal models keep the language model's there)."""
        d = self.data or {}
        if key in d:
            return d[key]
        return self._text().get(key)

    @property
    def architectures(self) -> list[str]:
        a = (self.data or {}).get("architectures") or []
        return [str(x) for x in a] if isinstance(a, list) else []

    @property
    def hidden_size(self) -> int | None:
        v = self.get("hidden_size")
        return v if isinstance(v, int) else None

    @property
    def vocab_size(self) -> int | None:
        v = self.get("vocab_size")
        return v if isinstance(v, int) else None

    def context_length(self) -> tuple[int | None, str | None]:
        """The context length sglang derives from the config (``get_context_length`` of sglang: the first of
        max_sequence_length, seq_length, max_seq_len, model_max_length, max_position_embeddings, times the
        rope-scaling factor unless it is llama3's or gives original_max_position_embeddings), and the key."""
        cfg = self._text()
        factor: float = 1
        rs = cfg.get("rope_scaling")
        if isinstance(rs, Mapping) and rs:
            factor = rs.get("factor", 1) or 1
            if "original_max_position_embeddings" in rs or rs.get("rope_type") == "llama3":
                factor = 1
        for key in ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length", "max_position_embeddings"):
            v = cfg.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                return int(factor * v), key
        return None, None


def model_config(name: str, raw: Mapping[str, Any] | None) -> ModelConfig:
    """A ``ModelConfig`` from what the host answered for one model path (``{"path", "text"}`` or ``{"error"}``)."""
    if not raw:
        return ModelConfig(name=name, error="not read")
    if raw.get("error"):
        return ModelConfig(name=name, path=raw.get("path"), error=raw["error"])
    try:
        data = json.loads(raw.get("text") or "")
    except ValueError as exc:
        return ModelConfig(name=name, path=raw.get("path"), error=f"not JSON: {exc}")
    if not isinstance(data, dict):
        return ModelConfig(name=name, path=raw.get("path"), error="not a JSON object")
    return ModelConfig(name=name, path=raw.get("path"), data=data)


# ----------------------------------------------------------------------------------------------------------------
# GPUs


def parse_gpu_list(text: str) -> list[str]:
    """``nvidia-smi -L``: one line per GPU (``GPU 0: NVIDIA H200 (UUID: GPU-...)``)."""
    return [ln.strip() for ln in text.splitlines() if ln.strip().startswith("GPU ")]


_TOPO_CELL = re.compile(r"^(X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC)$")


def parse_topo(text: str) -> dict[tuple[int, int], str]:
    """``nvidia-smi topo -m``'s GPU-to-GPU matrix as ``{(i, j): link}`` (``NV18`` NVLink, ``PIX``/``PXB`` PCIe
    switches, ``PHB`` a host bridge, ``NODE``/``SYS`` across host bridges or CPU sockets)."""
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    header = None
    out: dict[tuple[int, int], str] = {}
    for ln in lines:
        cells = ln.split()
        if header is None:
            gpus = [c for c in cells if re.fullmatch(r"GPU\d+", c)]
            if gpus:
                header = [int(c[3:]) for c in gpus]
            continue
        m = re.fullmatch(r"GPU(\d+)", cells[0]) if cells else None
        if not m:
            continue
        row = int(m.group(1))
        for col, cell in zip(header, cells[1:1 + len(header)]):
            if _TOPO_CELL.match(cell) and col != row:
                out[(row, col)] = cell
    return out


# ----------------------------------------------------------------------------------------------------------------
# Everything about one server


@dataclasses.dataclass(frozen=True)
class ServerFacts:
    """What doctor read about one server. Every field may be missing (None or empty): a rule decides only from
    what is there, and says nothing otherwise.

    - ``argv``, ``flags`` (``parse_flags`` of its sglang arguments), ``env`` (the variables doctor looks at:
      ``SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN``, ``NCCL_*``, ``CUDA_VISIBLE_DEVICES``);
    - ``server_info``: its ``/server_info`` document; ``log``: its log (``LogFacts``);
    - ``target_config``, ``draft_config``: the models' config.json;
    - ``patch``: ``patched`` (the server runs the patched files), ``not-patched``, ``stale`` (the files are
      patched, the server started before: it runs the original code); ``log_dir``: the timing log folder;
    - ``decode``: the ``report --json`` decode group of its timing records (one group over all of them),
      ``by_rank``/``by_bs``: the decode groups per rank and per batch size, ``timer``: the timer that wrote them,
      ``records``: how many;
    - ``sweep``: the newest sweep of this server kept on this machine (``sweep --json``'s summary, plus ``path``,
      ``load`` and ``current``: the index of the point that ran this very command line, or None);
    - ``model``: the prediction from its timing records (``collect.model_of``: ``report --predict``'s points for
      the decode group, with ``steps``, the step count measured);
    - ``gpus`` (``nvidia-smi -L``), ``topo`` (``parse_topo``); ``overlap_workers``: the install has the overlap
      scheduler's workers (EAGLEWorkerV2 & co);
    - ``traffic``: ``tuning.traffic.split`` of its decode records, where some carried requests not eaglepatch's.
    """

    target: str
    version: str | None = None
    pid: int | None = None
    port: int | None = None
    argv: list[str] = dataclasses.field(default_factory=list)
    flags: dict[str, Any] = dataclasses.field(default_factory=dict)
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    server_info: dict[str, Any] | None = None
    log: LogFacts | None = None
    target_config: ModelConfig | None = None
    draft_config: ModelConfig | None = None
    patch: str | None = None
    log_dir: str | None = None
    decode: dict[str, Any] | None = None
    by_rank: tuple[dict[str, Any], ...] = ()
    by_bs: tuple[dict[str, Any], ...] = ()
    timer: str | None = None
    records: int = 0
    sweep: dict[str, Any] | None = None
    sweep_other_load: str | None = None  # why the sweep does not count for this server's load (then not used)
    model: dict[str, Any] | None = None
    gpus: tuple[str, ...] = ()
    topo: Mapping[tuple[int, int], str] = dataclasses.field(default_factory=dict)
    overlap_workers: bool = False
    # the decode cycles of eaglepatch's load against the server's own traffic (``tuning.traffic.split``), where its
    # records hold both
    traffic: dict[str, Any] | None = None

    # -- settings ------------------------------------------------------------------------------------------------

    def setting(self, key: str, flag: str | None = None, use_flag: bool = True) -> tuple[Any, dict[str, Any] | None]:
        """``(value, evidence)`` of a ServerArgs field (``key``, e.g. ``speculative_algorithm``): from
        ``/server_info``, else the log's ``server_args`` line, else (unless not ``use_flag``) the command line's
        ``--flag`` (default: the key with dashes); ``(None, None)`` when none of them has it."""
        si = self.server_info or {}
        if key in si and si[key] is not None:
            return si[key], evidence("server-info", f"{key} = {si[key]!r}")
        sa = (self.log.server_args if self.log else None) or {}
        if key in sa and sa[key] is not None:
            return sa[key], evidence("server-log", f"{key}={sa[key]!r} in the server_args line",
                                     line=self.log.server_args_line if self.log else None)
        name = flag or key.replace("_", "-")
        if use_flag and name in self.flags:
            return self.flags[name], evidence("command-line", quote_flag(name, self.flags[name]))
        return None, None

    def int_setting(self, key: str, flag: str | None = None,
                    use_flag: bool = True) -> tuple[int | None, dict[str, Any] | None]:
        v, ev = self.setting(key, flag, use_flag)
        try:
            return (int(v), ev) if v is not None and v is not True else (None, None)
        except (TypeError, ValueError):
            return None, None

    def flag_on(self, key: str, flag: str | None = None) -> tuple[bool, dict[str, Any] | None]:
        """Whether a boolean ServerArgs field is set (``disable_cuda_graph``...), with its evidence."""
        v, ev = self.setting(key, flag)
        on = v is True or (isinstance(v, str) and v.lower() in ("true", "1", "yes"))
        return on, ev

    def algorithm(self) -> tuple[str | None, dict[str, Any] | None]:
        v, ev = self.setting("speculative_algorithm")
        return (str(v).upper(), ev) if v not in (None, True, "", "None") else (None, None)

    def max_bs(self) -> tuple[int | None, dict[str, Any] | None]:
        """The largest decode batch captured in a CUDA graph: ``--cuda-graph-max-bs`` as sglang resolved it
        (``cuda_graph_config.decode.max_bs`` in 0.5.16, ``cuda_graph_max_bs_decode``, ``cuda_graph_max_bs``), else
        the largest batch size of the capture lines in the log."""
        si = self.server_info or {}
        cfg = si.get("cuda_graph_config")
        if isinstance(cfg, Mapping) and isinstance(cfg.get("decode"), Mapping):
            mb = cfg["decode"].get("max_bs")
            if isinstance(mb, int):
                return mb, evidence("server-info", f"cuda_graph_config.decode.max_bs = {mb}")
        for i, key in enumerate(("cuda_graph_max_bs_decode", "cuda_graph_max_bs")):
            v, ev = self.int_setting(key, "cuda-graph-max-bs", use_flag=i == 1)
            if v is not None:
                return v, ev
        if self.log and self.log.captured_max_bs is not None:
            return self.log.captured_max_bs, evidence(
                "server-log", f"decode CUDA graphs captured up to batch size {self.log.captured_max_bs}",
                line=self.log.capture_line)
        return None, None

    def accept_lengths(self) -> list[tuple[float, dict[str, Any]]]:
        """Every measure of the accept length there is, each with its evidence: the timing records (decode
        cycles), the log's ``accept len`` (mean over the current launch's decode lines), ``/server_info``'s
        ``avg_spec_accept_length`` (in ``internal_states[0]`` from 0.4.8), the sweep's run of this command line."""
        out: list[tuple[float, dict[str, Any]]] = []
        d = self.decode or {}
        if isinstance(d.get("accept_len"), (int, float)):
            out.append((float(d["accept_len"]), evidence(
                "timing-log", f"accept length {d['accept_len']:.2f} over {d.get('n')} decode cycles"
                + (f" ({self.log_dir})" if self.log_dir else ""))))
        lines = self.log.spec_decode() if self.log else ()
        if lines:
            mean = sum(x.accept for x in lines if x.accept is not None) / len(lines)
            out.append((mean, evidence("server-log", f"accept len {mean:.2f} (mean of {len(lines)} decode batch "
                                                     f"line(s)); the last:", line=lines[-1].line)))
        si = self.server_info or {}
        states = si.get("internal_states")
        v = None
        if isinstance(states, list) and states and isinstance(states[0], Mapping):
            v = states[0].get("avg_spec_accept_length")
        if v is None:
            v = si.get("avg_spec_accept_length")
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
            out.append((float(v), evidence("server-info", f"avg_spec_accept_length = {v:.2f}")))
        sw = self.sweep or {}
        cur = sw.get("current")
        if cur is not None:
            p = sw["points"][cur]
            if isinstance(p.get("accept_len"), (int, float)):
                out.append((float(p["accept_len"]), evidence(
                    "sweep", f"accept length {p['accept_len']:.2f} in the sweep's runs of this command line",
                    path=sw.get("path"))))
        return out
