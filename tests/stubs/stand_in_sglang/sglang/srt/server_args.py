"""The stand-in's server arguments, in the shape of sglang 0.5.16's ``sglang/srt/server_args.py``: one dataclass
whose fields are annotated ``A[type, "help"]`` or ``A[type, Arg(help=..., aliases=[...])]``; a field ``foo_bar``
is the flag ``--foo-bar``, and ``aliases`` are more names for it.

Only the flags eaglepatch's tests use are declared. eaglepatch reads this file as text; the stand-in server does
not use it (its launcher takes any flag).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from sglang.srt.arg_groups.arg_utils import A, Arg


@dataclasses.dataclass
class ServerArgs:
    """What the stand-in server is started with (``python -m sglang.launch_server`` / ``sglang serve``)."""

    # the model
    model_path: A[str, Arg(help="Where the model weights are (a folder or a hub name).", aliases=["--model"])]

    # the HTTP server
    host: A[str, "The address the HTTP server listens on."] = "127.0.0.1"
    port: A[int, "The port the HTTP server listens on."] = 30000
    api_key: A[Optional[str], Arg(help="Requests must carry this key (Authorization: Bearer).")] = None

    # parallelism and memory
    tp_size: A[
        int,
        Arg(
            help="How many GPUs one copy of the model spans.",
            aliases=["--tensor-parallel-size", "--tp"],
        ),
    ] = 1
    mem_fraction_static: A[Optional[float], "The share of GPU memory for weights and the KV cache."] = None
    max_running_requests: A[Optional[int], "At most this many requests run at once."] = None

    # kernels
    attention_backend: A[
        Optional[str],
        Arg(help="Which attention kernels to use.", choices=["triton", "flashinfer", "fa3"]),
    ] = None
    disable_cuda_graph: A[bool, "Run without CUDA graphs."] = False
    cuda_graph_max_bs: A[Optional[int], "The largest batch size captured in a CUDA graph."] = None
    disable_overlap_schedule: A[bool, "Do not overlap the CPU scheduler with the GPU."] = False
    disable_custom_all_reduce: A[bool, "Use NCCL's all-reduce instead of the custom one."] = False

    # speculative decoding
    speculative_algorithm: A[
        Optional[str],
        Arg(help="The speculative decoding algorithm.", choices=["EAGLE", "EAGLE3", "NEXTN"]),
    ] = None
    speculative_draft_model_path: A[Optional[str], "Where the draft model's weights are."] = None
    speculative_num_steps: A[Optional[int], "How many draft steps per decode cycle."] = None
    speculative_eagle_topk: A[Optional[int], "How many tokens the draft keeps at each step."] = None
    speculative_num_draft_tokens: A[Optional[int], "How many draft tokens the target verifies per cycle."] = None
    speculative_adaptive: A[bool, "Switch the number of draft steps at run time (adaptive runtime states)."] = False
    speculative_adaptive_config: A[Optional[str], "The adaptive candidates per batch-size tier (a JSON file)."] = None

    # shapes adaptive speculation does not run with
    enable_dp_attention: A[bool, "Data-parallel attention."] = False
    enable_two_batch_overlap: A[bool, "Overlap two micro-batches."] = False
    enable_multi_layer_eagle: A[bool, "A multi-layer EAGLE draft."] = False
    enable_pdmux: A[bool, "Prefill/decode multiplexing."] = False
