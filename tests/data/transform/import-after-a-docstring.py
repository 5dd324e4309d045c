# A module docstring (of several lines) and no import: the runtime import goes right after the docstring,
# never inside it (a docstring must stay the first statement).
# ---- before ----
"""Doc
string."""

class EAGLEWorkerV2(B):
    def forward_batch_generation(self, b):
        x = self.target_worker.forward_batch_generation(b)
        y = self.draft_worker._draft_extend_for_prefill(b)
        v = self.draft_worker.draft(b)
        o = self.verify(b)
        self.draft_worker._draft_extend_for_decode(b, o)
# ---- after ----
"""Doc
string."""
from . import _eaglepatch_runtime as _eaglepatch  # [eaglepatch]

class EAGLEWorkerV2(B):
    @_eaglepatch.entry  # [eaglepatch]
    def forward_batch_generation(self, b):
        _eaglepatch.begin("target", "prefill")  # [eaglepatch]
        x = self.target_worker.forward_batch_generation(b)
        _eaglepatch.end("target")  # [eaglepatch]
        _eaglepatch.begin("draft_extend", "prefill")  # [eaglepatch]
        y = self.draft_worker._draft_extend_for_prefill(b)
        _eaglepatch.end("draft_extend")  # [eaglepatch]
        _eaglepatch.begin("draft", "decode")  # [eaglepatch]
        v = self.draft_worker.draft(b)
        _eaglepatch.end("draft")  # [eaglepatch]
        _eaglepatch.begin("verify", "decode")  # [eaglepatch]
        o = self.verify(b)
        _eaglepatch.end("verify")  # [eaglepatch]
        _eaglepatch.accepted(o, ("accept_lens",), 0)  # [eaglepatch]
        _eaglepatch.begin("draft_extend", "decode")  # [eaglepatch]
        self.draft_worker._draft_extend_for_decode(b, o)
        _eaglepatch.end("draft_extend")  # [eaglepatch]
