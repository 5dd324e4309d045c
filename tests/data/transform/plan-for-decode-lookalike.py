# MultiLayer V2 0.5.21+: ``self.draft_worker._draft_extend_plan_for_decode(batch)`` runs before verify. It is
# not ``_draft_extend_for_decode`` (callees are matched by their full dotted name, not a prefix), so it gets no
# lines, and the real draft extend after verify is still the one timed.
# ---- before ----
import torch


class MultiLayerEagleWorkerV2(BaseSpecWorker):
    def forward_batch_generation(self, batch, on_publish=None):
        if batch.forward_mode.is_extend():
            batch_output = self.target_worker.forward_batch_generation(batch)
            batch_output.next_draft_input = self.draft_worker._draft_extend_for_prefill(batch, batch_output)
            return batch_output
        else:
            verify_input: EagleVerifyInput = self.draft_worker.draft(batch)
            staged = self.draft_worker._draft_extend_plan_for_decode(batch)
            batch_output = self.verify(batch)
            self.draft_worker._draft_extend_for_decode(batch, batch_output, staged=staged)
            return batch_output
# ---- after ----
import torch
from . import _eaglepatch_runtime as _eaglepatch  # [eaglepatch]


class MultiLayerEagleWorkerV2(BaseSpecWorker):
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
            staged = self.draft_worker._draft_extend_plan_for_decode(batch)
            _eaglepatch.begin("verify", "decode")  # [eaglepatch]
            batch_output = self.verify(batch)
            _eaglepatch.end("verify")  # [eaglepatch]
            _eaglepatch.accepted(batch_output, ("accept_lens",), 0)  # [eaglepatch]
            _eaglepatch.begin("draft_extend", "decode")  # [eaglepatch]
            self.draft_worker._draft_extend_for_decode(batch, batch_output, staged=staged)
            _eaglepatch.end("draft_extend")  # [eaglepatch]
            return batch_output
