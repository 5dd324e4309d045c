# 0.5.21+: the entry method's prefill is only ``return self._forward_prefill_batch(...)``; the target and
# draft-extend calls are found in the recipe's helper methods. Only the entry method is decorated (one record
# per cycle); the helper's phases are timed inside it. The return of the helper's result is not a phase: nothing
# is added around it.
# ---- before ----
import torch


class EAGLEWorkerV2(BaseSpecWorker):
    def forward_batch_generation(self, batch, on_publish=None):
        if batch.forward_mode.is_extend():
            return self._forward_prefill_batch(batch, on_publish)
        else:
            verify_input: EagleVerifyInput = self.draft_worker.draft(batch)
            batch_output = self.verify(batch)
            self.draft_worker._draft_extend_for_decode(batch, batch_output)
            return batch_output

    def _forward_prefill_batch(self, batch, on_publish=None):
        batch_output = self.target_worker.forward_batch_generation(batch)
        batch_output.next_draft_input = self.draft_worker._draft_extend_for_prefill(batch, batch_output)
        return batch_output
# ---- after ----
import torch
from . import _eaglepatch_runtime as _eaglepatch  # [eaglepatch]


class EAGLEWorkerV2(BaseSpecWorker):
    @_eaglepatch.entry  # [eaglepatch]
    def forward_batch_generation(self, batch, on_publish=None):
        if batch.forward_mode.is_extend():
            return self._forward_prefill_batch(batch, on_publish)
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

    def _forward_prefill_batch(self, batch, on_publish=None):
        _eaglepatch.begin("target", "prefill")  # [eaglepatch]
        batch_output = self.target_worker.forward_batch_generation(batch)
        _eaglepatch.end("target")  # [eaglepatch]
        _eaglepatch.begin("draft_extend", "prefill")  # [eaglepatch]
        batch_output.next_draft_input = self.draft_worker._draft_extend_for_prefill(batch, batch_output)
        _eaglepatch.end("draft_extend")  # [eaglepatch]
        return batch_output
