"""The parsers of ``eaglepatch doctor`` (eaglepatch/doctor/facts.py) on REAL sglang log lines
(tests/data/sglang_logs/, written by sglang 0.5.16 on an H200) and on the command lines, configs and
``nvidia-smi`` output doctor reads.

Each test can fail: a regex that stops matching the real lines, a prefill line counted as a decode line, the
lines of an earlier launch counted for the current one, a flag alias not folded, a context length derived
differently from sglang's ``get_context_length``.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from eaglepatch.doctor.collect import facts_for_log
from eaglepatch.server.argv import parse_flags, server_args_of
from eaglepatch.doctor.facts import (
    LOG_FILTER,
    ModelConfig,
    ServerFacts,
    parse_decode_line,
    parse_gpu_list,
    parse_log,
    parse_server_args_line,
    parse_topo,
)

LOGS = Path(__file__).resolve().parents[1] / "data" / "sglang_logs" / "0.5.16"


def lines(name: str) -> list[str]:
    return (LOGS / name).read_text().splitlines()


def test_the_real_decode_lines_give_their_numbers():
    """Every line of the random-draft corpus is a decode line with 8 running requests, accept len 1.00, CUDA
    graphs on, and its throughput; the agreeing draft's give 4.00."""
    rand = [parse_decode_line(ln) for ln in lines("eagle3_random_draft_decode.log")]
    assert len(rand) == 12 and all(d is not None for d in rand)
    assert {(d.running, d.accept, d.graph) for d in rand} == {(8, 1.0, True)}
    assert rand[0].gen_tps == pytest.approx(707.14)
    agree = [parse_decode_line(ln) for ln in lines("eagle3_agree_draft_decode.log")]
    assert {d.accept for d in agree} == {4.0} and {d.running for d in agree} == {1, 8}


def test_prefill_lines_that_say_cuda_graph_false_are_not_decode_lines():
    """sglang prints ``cuda graph: False`` on one-token prefills (real lines of the venv server): they are not
    decode batches, or a healthy server would get the cuda-graph-off finding."""
    text = lines("eagle3_venv_startup_and_shutdown.log")
    assert any("Prefill batch" in ln and "cuda graph: False" in ln for ln in text)
    assert [parse_decode_line(ln) for ln in text if "Prefill batch" in ln] == [None, None]
    log = parse_log(text)
    assert log.decode == () and log.server_args is not None


def test_the_server_args_line_gives_the_resolved_settings():
    """The real start-up line of 0.5.16: the speculative settings, TP, and the decode CUDA graph's max batch
    (given as --cuda-graph-max-bs 16, shown as cuda_graph_max_bs_decode and in cuda_graph_config)."""
    line = next(ln for ln in lines("eagle3_venv_startup_and_shutdown.log") if "server_args=" in ln)
    sa = parse_server_args_line(line)
    assert sa["speculative_algorithm"] == "EAGLE3"
    assert sa["speculative_draft_model_path"] == "/tmp/models/draft"
    assert (sa["speculative_num_steps"], sa["speculative_eagle_topk"], sa["speculative_num_draft_tokens"]) == (3, 1, 4)
    assert sa["tp_size"] == 1 and sa["cuda_graph_max_bs_decode"] == 16
    assert sa["disable_cuda_graph"] is False and sa["disable_overlap_schedule"] is False
    assert sa["context_length"] is None and sa["decode_log_interval"] == 40
    assert "speculative_algorithm" not in (parse_server_args_line(line.replace("server_args=", "args=")) or {})


def test_only_the_current_launch_counts_in_a_log_of_two_launches():
    """eaglepatch's server log appends every launch: the decode lines before the last server_args line belong to
    an earlier launch. The real two-launch log: the second launch has decoded nothing yet."""
    text = lines("eagle3_random_draft_two_launches.log")
    first_end = [i for i, ln in enumerate(text) if "server_args=" in ln][1]
    whole, first = parse_log(text), parse_log(text[:first_end])
    assert whole.decode == () and whole.server_args is not None
    assert len(first.decode) == 29 and {d.accept for d in first.decode} == {1.0}
    assert {d.running for d in first.decode} == {4}


def test_the_capture_lines_give_the_largest_decode_batch_in_a_graph():
    """0.5.16 logs verify/draft captures with ``bs=[...]`` (16 here) and prefill captures with num_tokens up to
    8192, which must not count."""
    log = parse_log(lines("eagle3_random_draft_two_launches.log"))
    assert log.captured_max_bs == 16 and "verify CUDA graph begin" in log.capture_line
    older = parse_log(["[2025-01-01 00:00:00] Capture cuda graph bs [1, 2, 4, 8, 16, 24, 32]"])
    assert older.captured_max_bs == 32


def test_the_hosts_filter_keeps_what_the_parser_needs():
    """The host sends only the lines matching LOG_FILTER: the parse of the filtered log equals the parse of the
    whole one (decode lines, server args, capture lines)."""
    text = lines("eagle3_random_draft_two_launches.log")
    first_end = [i for i, ln in enumerate(text) if "server_args=" in ln][1]
    kept = [ln for ln in text[:first_end] if re.search(LOG_FILTER, ln)]
    assert len(kept) < first_end
    assert facts_for_log(text[:first_end]) == parse_log(kept)


@pytest.mark.parametrize("line,running,accept,graph", [
    # the f-strings of 0.5.3 ("Decode batch." and cuda graph) and 0.4.6 (no graph), as those releases print them
    ("[2025-06-01 10:00:00 TP0] Decode batch. #running-req: 3, #token: 900, token usage: 0.01, accept len: 2.41, "
     "cuda graph: False, gen throughput (token/s): 120.00, #queue-req: 0", 3, 2.41, False),
    ("[2025-03-01 10:00:00] Decode batch. #running-req: 1, #token: 90, token usage: 0.00, accept len: 1.05, "
     "gen throughput (token/s): 88.10, #queue-req: 0", 1, 1.05, None),
    ("[2026-01-01 10:00:00] Decode batch, #running-req: 2, #token: 9, token usage: 0.00, cpu graph: False, "
     "gen throughput (token/s): 8.10, #queue-req: 0", 2, None, None),
])
def test_decode_lines_of_other_releases(line, running, accept, graph):
    """The decode line of older releases (``Decode batch.``), without ``cuda graph`` (0.4.6), and a CPU server's
    ``cpu graph`` (not a CUDA graph finding)."""
    d = parse_decode_line(line)
    assert (d.running, d.accept, d.graph) == (running, accept, graph)


def test_flags_fold_aliases_and_read_both_forms():
    """``--x V`` and ``--x=V``; flags without a value; aliases (--tp, --model, --speculative-draft-model,
    --cuda-graph-max-bs-decode); ``sglang serve MODEL``'s positional model."""
    f = parse_flags(["--model", "/m", "--tp=4", "--speculative-draft-model", "/d", "--disable-cuda-graph",
                     "--cuda-graph-max-bs-decode", "8", "--trust-remote-code", "--port", "30000"])
    assert f == {"model-path": "/m", "tp-size": "4", "speculative-draft-model-path": "/d",
                 "disable-cuda-graph": True, "cuda-graph-max-bs": "8", "trust-remote-code": True, "port": "30000"}
    assert parse_flags(["org/model", "--tp", "2"]) == {"model-path": "org/model", "tp-size": "2"}
    assert server_args_of(["/v/bin/python", "-m", "sglang.launch_server", "--port", "1"]) == ["--port", "1"]
    assert server_args_of(["/v/bin/python", "/v/bin/sglang", "serve", "m"]) == ["m"]


def test_the_context_length_is_derived_as_sglang_derives_it():
    """sglang's get_context_length: the first of its keys, times the rope-scaling factor, except llama3's or one
    with original_max_position_embeddings; a multimodal config's text_config."""
    assert ModelConfig("m", data={"max_position_embeddings": 4096}).context_length() == (4096, "max_position_embeddings")
    assert ModelConfig("m", data={"max_position_embeddings": 4096, "rope_scaling": {"factor": 4.0}}
                       ).context_length()[0] == 16384
    assert ModelConfig("m", data={"max_position_embeddings": 8192, "rope_scaling": {"factor": 8.0, "rope_type": "llama3"}}
                       ).context_length()[0] == 8192
    assert ModelConfig("m", data={"seq_length": 2048, "max_position_embeddings": 9999}).context_length() == (2048, "seq_length")
    vl = ModelConfig("m", data={"architectures": ["X"], "text_config": {"hidden_size": 4096, "vocab_size": 152064,
                                                                       "max_position_embeddings": 32768}})
    assert (vl.hidden_size, vl.vocab_size, vl.context_length()[0]) == (4096, 152064, 32768)


TOPO = """\
\tGPU0\tGPU1\tGPU2\tGPU3\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID
GPU0\t X \tNV18\tSYS\tSYS\tPXB\t0-47\t0\t\tN/A
GPU1\tNV18\t X \tSYS\tSYS\tPXB\t0-47\t0\t\tN/A
GPU2\tSYS\tSYS\t X \tPIX\tSYS\t48-95\t1\t\tN/A
GPU3\tSYS\tSYS\tPIX\t X \tSYS\t48-95\t1\t\tN/A
NIC0\tPXB\tPXB\tSYS\tSYS\t X \t\t\t\t

Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NV#  = Connection traversing a bonded set of # NVLinks
"""


def test_nvidia_smi_output():
    """``nvidia-smi topo -m``'s GPU matrix (NIC columns and the legend left out) and ``nvidia-smi -L``."""
    topo = parse_topo(TOPO)
    assert topo[(0, 1)] == "NV18" and topo[(2, 3)] == "PIX" and topo[(0, 2)] == "SYS"
    assert len(topo) == 12 and all(i != j for i, j in topo)
    assert parse_gpu_list("GPU 0: NVIDIA H200 (UUID: GPU-1)\nGPU 1: NVIDIA H200 (UUID: GPU-2)\n") == [
        "GPU 0: NVIDIA H200 (UUID: GPU-1)", "GPU 1: NVIDIA H200 (UUID: GPU-2)"]


def test_settings_prefer_what_sglang_resolved():
    """/server_info over the log's server_args line over the command line; each with evidence naming it."""
    log = parse_log(lines("eagle3_venv_startup_and_shutdown.log"))
    f = ServerFacts(target="t", flags={"speculative-algorithm": "EAGLE", "cuda-graph-max-bs": "4"}, log=log)
    assert f.algorithm()[0] == "EAGLE3" and f.algorithm()[1]["source"] == "server-log"
    assert f.max_bs()[0] == 16
    f = dataclasses.replace(f, server_info={"speculative_algorithm": "EAGLE",
                                            "cuda_graph_config": {"decode": {"max_bs": 24}}})
    assert f.algorithm() == ("EAGLE", {"source": "server-info", "text": "speculative_algorithm = 'EAGLE'"})
    assert f.max_bs()[0] == 24
    bare = ServerFacts(target="t", flags={"cuda-graph-max-bs": "4"})
    assert bare.max_bs() == (4, {"source": "command-line", "text": "--cuda-graph-max-bs 4"})
