# The last import spreads over two lines with a backslash, its second line indented: the runtime import
# goes after its last line and still starts at column 0 (only the added lines inside the class copy
# indentation).
# ---- before ----
"""A V1 worker: every statement form of the decode path in one method."""
import torch

from sglang.srt.managers.tp_worker import TpModelWorker, \
    Other


class EAGLEWorker(TpModelWorker):
    def forward_batch_generation(self, batch):
        if batch.forward_mode.is_extend():
            logits_output, next_token_ids = self.forward_target_extend(batch)
            self.forward_draft_extend(batch, logits_output.hidden_states, next_token_ids)
            return logits_output, next_token_ids
        else:
            spec_info = self.draft(batch)
            logits_output, verify_output, _ = self.verify(batch, spec_info)
            if batch.spec_info.verified_id is not None:
                self.forward_draft_extend_after_decode(batch)
            return logits_output, verify_output.verified_id
# ---- after ----
"""A V1 worker: every statement form of the decode path in one method."""
import torch

from sglang.srt.managers.tp_worker import TpModelWorker, \
    Other
from . import _eaglepatch_runtime as _eaglepatch  # [eaglepatch]


class EAGLEWorker(TpModelWorker):
    @_eaglepatch.entry  # [eaglepatch]
    def forward_batch_generation(self, batch):
        if batch.forward_mode.is_extend():
            _eaglepatch.begin("target", "prefill")  # [eaglepatch]
            logits_output, next_token_ids = self.forward_target_extend(batch)
            _eaglepatch.end("target")  # [eaglepatch]
            _eaglepatch.begin("draft_extend", "prefill")  # [eaglepatch]
            self.forward_draft_extend(batch, logits_output.hidden_states, next_token_ids)
            _eaglepatch.end("draft_extend")  # [eaglepatch]
            return logits_output, next_token_ids
        else:
            _eaglepatch.begin("draft", "decode")  # [eaglepatch]
            spec_info = self.draft(batch)
            _eaglepatch.end("draft")  # [eaglepatch]
            _eaglepatch.begin("verify", "decode")  # [eaglepatch]
            logits_output, verify_output, _ = self.verify(batch, spec_info)
            _eaglepatch.end("verify")  # [eaglepatch]
            _eaglepatch.accepted(verify_output, ("accept_length_per_req_cpu", "num_correct_drafts_per_req_cpu",), 1)  # [eaglepatch]
            if batch.spec_info.verified_id is not None:
                _eaglepatch.begin("draft_extend", "decode")  # [eaglepatch]
                self.forward_draft_extend_after_decode(batch)
                _eaglepatch.end("draft_extend")  # [eaglepatch]
            return logits_output, verify_output.verified_id
