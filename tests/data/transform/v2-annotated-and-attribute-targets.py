# The V2 shapes. ``verify_input: EagleVerifyInput = self.draft_worker.draft(batch)`` is an AnnAssign: one
# SimpleStatementLine, wrapped like an Assign. ``batch_output.next_draft_input = ..._draft_extend_for_prefill(...)``
# assigns to an attribute: still a statement of its own, wrapped whole. V2 reads accepted from the one name verify
# assigns (``$``: batch_output), without a bonus token.
# ---- before ----
import torch


class EAGLEWorkerV2(BaseSpecWorker):
    def forward_batch_generation(self, batch, on_publish=None):
        if batch.forward_mode.is_extend():
            batch_output = self.target_worker.forward_batch_generation(batch)
            batch_output.next_draft_input = self.draft_worker._draft_extend_for_prefill(batch, batch_output)
            return batch_output
        else:
            verify_input: EagleVerifyInput = self.draft_worker.draft(batch)
            batch_output = self.verify(batch)
            self.draft_worker._draft_extend_for_decode(batch, batch_output)
            return batch_output
# ---- after ----
import torch
from . import _eaglepatch_runtime as _eaglepatch  # [eaglepatch]


class EAGLEWorkerV2(BaseSpecWorker):
    @_eaglepatch.entry  # [eaglepatch]
    def forward_batch_generation(self, batch, on_publish=None):
        if batch.forward_mode.is_extend():
            _eaglepatch.begin("target", "prefill")  # [eaglepatch]
            batch_output = self.target_worker.forward_batch_generation(batch)
            _eaglepatch.end("target")  # [eaglepatch]
            _eaglepatch.begin("draft_extend", "prefill")  # [eaglepatch]
            batch_output.next_draft_input = self.draft_worker._draft_extend_for_prefill(batch, batch_output)
            _eaglepatch.end("draft_extend")  # [eaglepatch]
            return batch_output
        else:
            _eaglepatch.begin("draft", "decode")  # [eaglepatch]
            verify_input: EagleVerifyInput = self.draft_worker.draft(batch)
            _eaglepatch.end("draft")  # [eaglepatch]
            _eaglepatch.begin("verify", "decode")  # [eaglepatch]
            batch_output = self.verify(batch)
            _eaglepatch.end("verify")  # [eaglepatch]
            _eaglepatch.accepted(batch_output, ("accept_lens",), 0)  # [eaglepatch]
            _eaglepatch.begin("draft_extend", "decode")  # [eaglepatch]
            self.draft_worker._draft_extend_for_decode(batch, batch_output)
            _eaglepatch.end("draft_extend")  # [eaglepatch]
            return batch_output
