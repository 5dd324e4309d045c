# ``after_call``: the accepted count is read after the statement calling that callee (``verify_input.verify``),
# bracketed nowhere: the accepted line follows the statement; the verify phase (``self.target``) is bracketed.
# recipe: after_call.toml
# ---- before ----
class W:
    def forward_batch_generation(self, batch):
        out = self.target(batch)
        num_accepted = verify_input.verify(batch, out)
        return out
# ---- after ----
from . import _eaglepatch_runtime as _eaglepatch  # [eaglepatch]
class W:
    @_eaglepatch.entry  # [eaglepatch]
    def forward_batch_generation(self, batch):
        _eaglepatch.begin("verify", "decode")  # [eaglepatch]
        out = self.target(batch)
        _eaglepatch.end("verify")  # [eaglepatch]
        num_accepted = verify_input.verify(batch, out)
        _eaglepatch.accepted(num_accepted, (), 1)  # [eaglepatch]
        return out
