"""Stand-in of sglang 0.5.16's ``sglang/srt/speculative/adaptive_spec_params.py``, written for eaglepatch's tests
(not copied from sglang): the same names and behaviour where eaglepatch looks (``DEFAULT_ADAPTIVE_CONFIG``,
``adaptive_unsupported_reason``, ``_load_adaptive_config`` with batch-size tiers, a policy with
``get_steps_for_batch`` / ``on_verify_complete`` that moves by a moving average of accepted drafts), in fewer
lines. Standard library only.
"""

from __future__ import annotations

import bisect
import json

DEFAULT_ADAPTIVE_CONFIG = {
    "1": {"candidate_steps": [1, 3, 7]},
    "8": {"candidate_steps": [0, 1, 3]},
    "32": {"candidate_steps": [0, 1]},
    "64": {"candidate_steps": [0]},
}


def adaptive_unsupported_reason(server_args):
    """Why adaptive speculation cannot run under these server args, or None."""
    if server_args.speculative_algorithm not in ("EAGLE", "EAGLE3"):
        return f"speculative_algorithm={server_args.speculative_algorithm} (only EAGLE/EAGLE3 are supported)"
    if server_args.speculative_eagle_topk is not None and server_args.speculative_eagle_topk != 1:
        return f"speculative_eagle_topk={server_args.speculative_eagle_topk} (only topk=1 is supported)"
    if server_args.enable_dp_attention:
        return "enable_dp_attention=True is not supported"
    if server_args.enable_multi_layer_eagle:
        return "enable_multi_layer_eagle=True is not supported"
    if server_args.enable_two_batch_overlap:
        return "enable_two_batch_overlap=True is not supported"
    if server_args.enable_pdmux:
        return "enable_pdmux=True is not supported"
    return None


def _load_adaptive_config(cfg_path):
    if cfg_path is not None:
        with open(cfg_path) as f:
            cfg = json.load(f)
    else:
        cfg = DEFAULT_ADAPTIVE_CONFIG
    bs_entries = {}
    for key, entry in cfg.items():
        if not key.isdigit():
            continue
        steps = entry.get("candidate_steps")
        if not isinstance(steps, list) or not steps or not all(isinstance(s, int) and s >= 0 for s in steps):
            raise ValueError(f"BS {key}: candidate_steps must be a list of non-negative ints, got {steps!r}")
        bs_entries[int(key)] = entry
    if not bs_entries:
        raise ValueError("speculative_adaptive_config must contain at least one integer-string BS key")
    return cfg, bs_entries


def resolve_candidate_steps_from_config(cfg_path=None):
    _, bs_entries = _load_adaptive_config(cfg_path)
    return sorted({s for e in bs_entries.values() for s in e["candidate_steps"]})


class AdaptiveStepSlot:
    """One tier: a moving average of accepted drafts, and the step count it points at (one above it)."""

    def __init__(self, initial_steps, cfg):
        self.candidate_steps = sorted(set(cfg["candidate_steps"]))
        self.ema_alpha = cfg.get("ema_alpha", 0.2)
        self.update_interval = cfg.get("update_interval", 5)
        self.warmup_batches = cfg.get("warmup_batches", 10)
        if initial_steps in self.candidate_steps:
            self.current_steps = initial_steps
        else:
            self.current_steps = self.candidate_steps[len(self.candidate_steps) // 2]
        self.ema_accept_len = float(self.current_steps - 1)
        self._batch_count = 0

    def update(self, num_correct_drafts_per_req):
        if not num_correct_drafts_per_req:
            return False
        if self.current_steps > 0:
            avg = sum(num_correct_drafts_per_req) / len(num_correct_drafts_per_req)
            self.ema_accept_len = (1 - self.ema_alpha) * self.ema_accept_len + self.ema_alpha * avg
        self._batch_count += 1
        if self._batch_count <= self.warmup_batches:
            return False
        if (self._batch_count - self.warmup_batches) % self.update_interval:
            return False
        target = min(self.candidate_steps, key=lambda s: abs(s - (self.ema_accept_len + 1)))
        if self.current_steps == 0:
            target = next((s for s in self.candidate_steps if s > 0), 0)  # probe again after speculation off
        if target != self.current_steps:
            self.current_steps = target
            return True
        return False


class AdaptiveSpeculativeParams:
    """Routes a batch size to its tier (the largest tier key not above it)."""

    def __init__(self, initial_steps, cfg_path=None):
        cfg, bs_entries = _load_adaptive_config(cfg_path)
        self._bs_list = sorted(bs_entries)
        self._slots = {bs: AdaptiveStepSlot(initial_steps, {**cfg, **e}) for bs, e in sorted(bs_entries.items())}
        self._cuda_graph_bs = None

    @property
    def candidate_steps(self):
        return sorted({s for p in self._slots.values() for s in p.candidate_steps})

    def set_cuda_graph_bs(self, cuda_graph_bs):
        self._cuda_graph_bs = sorted(cuda_graph_bs) if cuda_graph_bs else None

    def get_steps_for_batch(self, batch_size):
        return self._route(batch_size).current_steps

    def on_verify_complete(self, num_correct_drafts_per_req, batch_size):
        params = self._route(batch_size)
        if params.update(num_correct_drafts_per_req):
            return params.current_steps
        return None

    def cuda_graph_bs_for_step(self, step):
        return None

    def _route(self, batch_size):
        idx = bisect.bisect_right(self._bs_list, batch_size) - 1
        return self._slots[self._bs_list[max(0, idx)]]
