"""Stand-in of sglang 0.5.16's ``sglang/srt/speculative/adaptive_runtime_state.py``, written for eaglepatch's tests
(not copied from sglang): ``SpecRuntimeState`` (here only the step counts; sglang's also holds the attention
backends and CUDA graphs of the state) and ``AdaptiveController`` with the same attributes and methods
(``params``, ``_states``, ``register``, ``init_states``, ``activate_step_by_batch``, ``on_verify_complete``,
``_activate``). Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass

from sglang.srt.speculative.adaptive_spec_params import AdaptiveSpeculativeParams


@dataclass
class SpecRuntimeState:
    speculative_num_steps: int
    speculative_num_draft_tokens: int


class AdaptiveController:
    def __init__(self, worker, config_path=None):
        self.worker = worker
        self.params = AdaptiveSpeculativeParams(initial_steps=worker.speculative_num_steps, cfg_path=config_path)
        self._states = {}

    @property
    def candidate_steps(self):
        return self.params.candidate_steps

    def register(self, state, steps=None):
        self._states[steps if steps is not None else state.speculative_num_steps] = state

    def init_states(self, cuda_graph_bs=None):
        self.params.set_cuda_graph_bs(cuda_graph_bs)
        for steps in self.candidate_steps:
            if steps not in self._states:
                self._states[steps] = self.worker.build_adaptive_runtime_state(
                    speculative_num_steps=steps, speculative_num_draft_tokens=steps + 1, cuda_graph_bs=None)
        self._activate(self.worker.speculative_num_steps)

    def activate_step_by_batch(self, batch_size):
        target = self.params.get_steps_for_batch(batch_size)
        if target != self.worker.speculative_num_steps:
            self._activate(target)

    def on_verify_complete(self, num_correct_drafts_per_req, batch_size):
        new_step = self.params.on_verify_complete(num_correct_drafts_per_req, batch_size)
        if new_step is not None:
            self._activate(new_step)

    def _activate(self, speculative_num_steps):
        state = self._states.get(speculative_num_steps)
        if state is None:
            raise ValueError(f"Missing adaptive runtime state for steps={speculative_num_steps}")
        self.worker.apply_runtime_state(state)
