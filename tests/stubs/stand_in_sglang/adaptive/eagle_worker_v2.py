"""Stand-in of sglang 0.5.16's ``sglang/srt/speculative/eagle_worker_v2.py``, written for eaglepatch's tests (not
copied from sglang): ``EAGLEWorkerV2`` with the entry method in the real file's shape (the same phase calls, so the
built-in recipe instruments it as it does the real one) and the adaptive protocol (``adaptive_controller``,
``activate_step_by_batch``, ``on_verify_complete_cpu``, ``build_adaptive_runtime_state``,
``apply_runtime_state``). The stand-in server (launch_server.py) subclasses it with simulated phases. Standard
library only.
"""

from __future__ import annotations

from sglang.srt.speculative.adaptive_runtime_state import AdaptiveController, SpecRuntimeState

# sglang 0.5.16 sizes its shared logits buffer for the launch's --speculative-num-steps: a state for more steps
# crashes at start-up. The stand-in does the same.
_CRASH = "shared logits buffer holds {have} rows but caller needs {need}"


class EAGLEWorkerV2:
    def __init__(self, server_args, target_worker, draft_worker):
        self.server_args = server_args
        self.topk = 1
        self.speculative_num_steps = server_args.speculative_num_steps
        self.speculative_num_draft_tokens = server_args.speculative_num_draft_tokens
        self._target_worker = target_worker
        self._draft_worker = draft_worker
        self.adaptive_controller = None
        if server_args.speculative_adaptive:
            self.adaptive_controller = AdaptiveController(self, config_path=server_args.speculative_adaptive_config)
            self.adaptive_controller.register(SpecRuntimeState(self.speculative_num_steps,
                                                               self.speculative_num_draft_tokens))
            self.adaptive_controller.init_states()

    @property
    def target_worker(self):
        return self._target_worker

    @property
    def draft_worker(self):
        return self._draft_worker

    def forward_batch_generation(self, batch, on_publish=None):
        if batch.forward_mode.is_extend() or batch.is_extend_in_batch:
            batch_output = self.target_worker.forward_batch_generation(batch)
            batch_output.next_draft_input = self.draft_worker._draft_extend_for_prefill(batch, batch_output)
            return batch_output
        else:
            self.activate_step_by_batch(batch.seq_lens.shape[0])
            if self.speculative_num_steps == 0:
                verify_input = self._build_trivial_verify_input(batch)
            else:
                verify_input = self.draft_worker.draft(batch)
            batch.spec_info = verify_input
            batch_output = self.verify(batch)
            if on_publish is not None:
                on_publish(batch_output)
            self.draft_worker._draft_extend_for_decode(batch, batch_output)
            return batch_output

    def _build_trivial_verify_input(self, batch):
        return None

    def verify(self, batch):
        raise NotImplementedError

    def on_verify_complete_cpu(self, num_correct_drafts_per_req, batch_size=0):
        if self.adaptive_controller is not None:
            self.adaptive_controller.on_verify_complete(num_correct_drafts_per_req, batch_size=batch_size)

    def activate_step_by_batch(self, batch_size):
        if self.adaptive_controller is not None:
            self.adaptive_controller.activate_step_by_batch(batch_size)

    def build_adaptive_runtime_state(self, speculative_num_steps, speculative_num_draft_tokens, cuda_graph_bs=None):
        launched = self.server_args.speculative_num_steps
        if speculative_num_steps > launched:
            raise RuntimeError(_CRASH.format(have=64 * launched, need=64 * speculative_num_steps))
        return SpecRuntimeState(speculative_num_steps, speculative_num_draft_tokens)

    def apply_runtime_state(self, state):
        if self.speculative_num_steps == state.speculative_num_steps:
            return
        self.speculative_num_steps = state.speculative_num_steps
        self.speculative_num_draft_tokens = state.speculative_num_draft_tokens
        self._draft_worker.speculative_num_steps = state.speculative_num_steps
