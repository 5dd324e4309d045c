# A form feed in a comment inside the entry method (``str.splitlines()`` breaks there, Python does not): every
# begin is directly above its phase statement, never above the "a = N" before it, and accepted follows verify.
# A transform counting lines with ``str.splitlines()`` put each one statement early (test_transform_lines.py).
# ---- before ----
import torch


class EAGLEWorkerV2(BaseSpecWorker):
    def forward_batch_generation(self, batch, on_publish=None):
        # page
        if batch.forward_mode.is_extend():
            a = 1
            batch_output = self.target_worker.forward_batch_generation(batch)
            a = 2
            batch_output.next_draft_input = self.draft_worker._draft_extend_for_prefill(batch, batch_output)
            return batch_output
        a = 3
        verify_input = self.draft_worker.draft(batch)
        a = 4
        batch_output = self.verify(batch)
        a = 5
        self.draft_worker._draft_extend_for_decode(batch, batch_output)
        return batch_output
# ---- after ----
import torch
from . import _eaglepatch_runtime as _eaglepatch  # [eaglepatch]


class EAGLEWorkerV2(BaseSpecWorker):
    @_eaglepatch.entry  # [eaglepatch]
    def forward_batch_generation(self, batch, on_publish=None):
        # page
        if batch.forward_mode.is_extend():
            a = 1
            _eaglepatch.begin("target", "prefill")  # [eaglepatch]
            batch_output = self.target_worker.forward_batch_generation(batch)
            _eaglepatch.end("target")  # [eaglepatch]
            a = 2
            _eaglepatch.begin("draft_extend", "prefill")  # [eaglepatch]
            batch_output.next_draft_input = self.draft_worker._draft_extend_for_prefill(batch, batch_output)
            _eaglepatch.end("draft_extend")  # [eaglepatch]
            return batch_output
        a = 3
        _eaglepatch.begin("draft", "decode")  # [eaglepatch]
        verify_input = self.draft_worker.draft(batch)
        _eaglepatch.end("draft")  # [eaglepatch]
        a = 4
        _eaglepatch.begin("verify", "decode")  # [eaglepatch]
        batch_output = self.verify(batch)
        _eaglepatch.end("verify")  # [eaglepatch]
        _eaglepatch.accepted(batch_output, ("accept_lens",), 0)  # [eaglepatch]
        a = 5
        _eaglepatch.begin("draft_extend", "decode")  # [eaglepatch]
        self.draft_worker._draft_extend_for_decode(batch, batch_output)
        _eaglepatch.end("draft_extend")  # [eaglepatch]
        return batch_output
