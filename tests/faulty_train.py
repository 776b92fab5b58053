"""``python tests/faulty_train.py ARGS...``: ``python -m suzak.train ARGS...`` with one fault injected into the real run,
chosen by ``SUZAK_TEST_FAULT`` (the fault tests in tests/test_faults.py start it as a user would start training):

- ``raise:RANK:STEP``: rank RANK raises ``RuntimeError`` in its training step STEP (1-based), outside any reward;
- ``stall_save:STEP``: the save of ``checkpoint-STEP`` stalls after its weights and optimizer are written (before the
  RNG state and trainer state), so a test can ``kill -9`` the run mid-save;
- ``nan:STEP``: the policy's training forward returns NaN log-probabilities at step STEP (a model hook: generation
  is untouched), so the loss and the gradients of that step are NaN.
"""

from __future__ import annotations

import os
import time

import torch


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def inject(fault: str) -> None:
    from suzak.training.trainer import VLMGRPOTrainer

    kind, *where = fault.split(":")
    original = VLMGRPOTrainer.training_step

    def training_step(self, model, inputs, *args, **kwargs):
        step = self.state.global_step + 1
        if kind == "raise" and _rank() == int(where[0]) and step == int(where[1]):
            raise RuntimeError(f"injected fault on rank {_rank()} at step {step}")
        if kind == "nan" and step == int(where[0]):
            handle = model.register_forward_hook(lambda module, args, output: _poison(output))
            try:
                return original(self, model, inputs, *args, **kwargs)
            finally:
                handle.remove()
        return original(self, model, inputs, *args, **kwargs)

    VLMGRPOTrainer.training_step = training_step
    if kind == "stall_save":
        save_rng = VLMGRPOTrainer._save_rng_state

        def stalled(self, output_dir):
            if self.state.global_step == int(where[0]):
                print(f"stalling the save of checkpoint-{self.state.global_step} in {output_dir}", flush=True)
                time.sleep(600)
            return save_rng(self, output_dir)

        VLMGRPOTrainer._save_rng_state = stalled


def _poison(output):
    """NaN in what the training forward returns (TRL 1.16 asks for log-probabilities, ``fused_lm_head``)."""
    if torch.is_grad_enabled():
        for name in ("log_probs", "logits"):
            if getattr(output, name, None) is not None:
                setattr(output, name, getattr(output, name) * float("nan"))
    return output


if __name__ == "__main__":
    inject(os.environ["SUZAK_TEST_FAULT"])
    from suzak.train import main

    main()
