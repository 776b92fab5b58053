"""One colocated-vLLM GRPO step with images per vLLM importance-sampling mode (TRL 1.16's
``vllm_importance_sampling_mode``, switched between steps of one run: one engine start):
``python tests/vllm_is_modes.py MODEL_DIR OUTPUT.json``. Writes each step's mode, log and first-order reward change
(tests/test_loss_options.py's check: sum_i A_i dlog p_i over the step's batch) for tests/test_vllm_tier.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from transformers import AutoModelForImageTextToText, AutoProcessor, TrainerCallback
from trl import GRPOConfig

from suzak.media.vision import PixelBudget
from suzak.selftest import color_dataset
from suzak.training.trainer import VLMGRPOTrainer
from test_loss_options import completion_logps
from test_trainer import length_reward

MODES = ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]


def main(model_dir: str, output: str) -> None:
    torch.manual_seed(0)
    processor = AutoProcessor.from_pretrained(model_dir)
    model = AutoModelForImageTextToText.from_pretrained(model_dir)
    budget = PixelBudget(3136, 3136).for_model(processor)  # 56-pixel squares at 2x2 tokens
    args = GRPOConfig(output_dir=str(Path(output).parent / "grpo"), max_steps=len(MODES), per_device_train_batch_size=8,
                      num_generations=4, max_completion_length=8, learning_rate=1e-4, logging_steps=1,
                      save_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True, bf16=False, beta=0.0,
                      use_vllm=True, vllm_mode="colocate", vllm_max_model_length=1024,
                      vllm_importance_sampling_correction=True, vllm_importance_sampling_mode=MODES[0])  # fmt: skip
    trainer = VLMGRPOTrainer(model=model, reward_funcs=[length_reward], args=args, processing_class=processor,
                             train_dataset=color_dataset(32, 0, size=56), pixel_budget=budget)  # fmt: skip
    steps: list[dict] = []

    class Mode(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            trainer.vllm_importance_sampling_mode = MODES[state.global_step]

    score = trainer._generate_and_score_completions

    def spy(inputs):
        finish_last()
        batch = score(inputs)
        steps.append({"mode": trainer.vllm_importance_sampling_mode, "batch": batch,
                      "before": completion_logps(trainer.model, batch)})  # fmt: skip
        return batch

    def finish_last():  # the previous step's batch under the weights its update left
        if steps and "gain" not in steps[-1]:
            last = steps[-1]
            after = completion_logps(trainer.model, last["batch"])
            last["gain"] = float((last["batch"]["advantages"].reshape(-1) * (after - last["before"])).sum())

    trainer.add_callback(Mode())
    trainer._generate_and_score_completions = spy
    trainer.train()
    finish_last()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    record = [{"mode": step["mode"], "gain": step["gain"], "log": log} for step, log in zip(steps, logs, strict=True)]
    Path(output).write_text(json.dumps(record), encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
