# ``with (a, b, c):`` (0.5.12+) spreads its header over several lines; the phase is in the body, so the
# lines go inside the body, after the header's closing ``):``.
# ---- before ----
import torch


class EAGLEWorkerV2(BaseSpecWorker):
    def forward_batch_generation(self, batch, on_publish=None):
        if batch.forward_mode.is_extend():
            batch_output = self.target_worker.forward_batch_generation(batch)
            batch_output.next_draft_input = self.draft_worker._draft_extend_for_prefill(batch, batch_output)
            return batch_output
        else:
            with (
                draft_tp_context(self.draft_worker.parallel_layout),
                speculative_moe_backend_context(),
                spec_stage_span("draft"),
            ):
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
            with (
                draft_tp_context(self.draft_worker.parallel_layout),
                speculative_moe_backend_context(),
                spec_stage_span("draft"),
            ):
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
