# ``return self.verify(batch)``: nothing can run after the return, so only begin is inserted; the runtime
# closes a phase still open at the end of the cycle. No accepted read is possible (nothing is bound): a warning,
# not a refusal (test_transform_cases.py checks the warning).
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
            self.draft_worker._draft_extend_for_decode(batch, None)
            return self.verify(batch)
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
            _eaglepatch.begin("draft_extend", "decode")  # [eaglepatch]
            self.draft_worker._draft_extend_for_decode(batch, None)
            _eaglepatch.end("draft_extend")  # [eaglepatch]
            _eaglepatch.begin("verify", "decode")  # [eaglepatch]
            return self.verify(batch)
