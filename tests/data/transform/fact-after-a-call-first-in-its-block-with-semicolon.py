# The statement an after_call fact follows may be the first of its block (no begin before it), and may share its line with others: the accepted line follows the line.
# recipe: after_call.toml
# ---- before ----
class W:
    def forward_batch_generation(self, batch):
        out = self.target(batch)
        if ok:
            num_accepted = verify_input.verify(batch, out); n = 1
        return out
# ---- after ----
from . import _eaglepatch_runtime as _eaglepatch  # [eaglepatch]
class W:
    @_eaglepatch.entry  # [eaglepatch]
    def forward_batch_generation(self, batch):
        _eaglepatch.begin("verify", "decode")  # [eaglepatch]
        out = self.target(batch)
        _eaglepatch.end("verify")  # [eaglepatch]
        if ok:
            num_accepted = verify_input.verify(batch, out); n = 1
            _eaglepatch.accepted(num_accepted, (), 1)  # [eaglepatch]
        return out
