"""Every TRL 1.16 loss and importance-sampling option trains with images (issue 39's matrix): one GRPO step of the
tiny Qwen2.5-VL on image rows for each ``loss_type`` at the token or sequence level TRL allows it, and the loss
options suzak inherits (``top_entropy_quantile``, ``mask_truncated_completions``, ``off_policy_mask_threshold``).
Each step's loss is finite and the update moves the policy towards the completions the reward preferred: over the
step's batch, sum_i A_i (log p_after(y_i) - log p_before(y_i)) > 0, the first-order change of the expected reward
(log-probabilities over the completion's own tokens, under its image). The vLLM importance-sampling modes run in the
vLLM tier (tests/test_vllm_tier.py), where vLLM's sampling log-probabilities exist."""

from __future__ import annotations

import inspect
import math

import pytest
import torch

from suzak.trl_internals.sampler_guard import _row_model_inputs
from test_trainer import image_dataset, length_reward, make_trainer

# (loss_type, importance_sampling_level): each loss at the levels TRL defines it for (luspo: sequence only, vespo:
# token only); grpo and dapo at both (GSPO is grpo at the sequence level)
LOSSES = [("grpo", "token"), ("grpo", "sequence"), ("bnpo", "token"), ("dr_grpo", "token"), ("dapo", "token"),
          ("dapo", "sequence"), ("cispo", "token"), ("sapo", "token"), ("luspo", "sequence"), ("vespo", "token")]  # fmt: skip
OPTIONS = [{"top_entropy_quantile": 0.2}, {"off_policy_mask_threshold": 0.5}]


def completion_logps(model, batch: dict) -> torch.Tensor:
    """Each row's log-probability of its completion (its own tokens: tool turns and padding left out), under the
    row's prompt and images."""
    totals = []
    mask = batch["completion_mask"] * batch.get("tool_mask", torch.ones_like(batch["completion_mask"]))
    length = batch["completion_ids"].size(1)
    with torch.no_grad():
        for row in range(batch["completion_ids"].size(0)):
            logits = model(**_row_model_inputs(batch, row)).logits[0, -length - 1 : -1].float()
            logps = logits.log_softmax(-1).gather(-1, batch["completion_ids"][row][:, None])[:, 0]
            totals.append((logps * mask[row]).sum())
    return torch.stack(totals)


def one_step(tiny_model_dir, tmp_path, **options) -> tuple[dict, float, dict]:
    """One GRPO step (8 completions of 4 image rows, ``length_reward``) with ``options``: (the step's log, the
    first-order reward change sum_i A_i dlog p_i over its batch, the batch)."""
    trainer = make_trainer(tiny_model_dir, tmp_path, image_dataset(4), [length_reward], max_steps=1,
                           per_device_train_batch_size=8, num_generations=4, learning_rate=1e-4, **options)  # fmt: skip
    seen = {}
    score = trainer._generate_and_score_completions

    def spy(inputs):
        batch = score(inputs)
        seen["batch"], seen["before"] = batch, completion_logps(trainer.model, batch)
        return batch

    trainer._generate_and_score_completions = spy
    trainer.train()
    batch = seen["batch"]
    after = completion_logps(trainer.model, batch)
    advantages = batch["advantages"].reshape(-1)
    assert advantages.abs().sum() > 0, "every group's completions scored alike: the step had nothing to learn"
    log = next(entry for entry in trainer.state.log_history if "loss" in entry)
    return log, float((advantages * (after - seen["before"])).sum()), batch


@pytest.mark.parametrize(("loss_type", "level"), LOSSES)
def test_each_loss_trains_with_images(tiny_model_dir, tmp_path, loss_type, level):
    log, gain, _ = one_step(tiny_model_dir, tmp_path, loss_type=loss_type, importance_sampling_level=level)
    assert math.isfinite(log["loss"]) and math.isfinite(log["grad_norm"]) and log["grad_norm"] > 0
    assert gain > 0, f"{loss_type} ({level}): the step moved the policy away from the preferred completions"


@pytest.mark.parametrize("options", OPTIONS, ids=lambda options: next(iter(options)))
def test_each_loss_option_trains_with_images(tiny_model_dir, tmp_path, options):
    log, gain, _ = one_step(tiny_model_dir, tmp_path, **options)
    assert math.isfinite(log["loss"]) and gain > 0


def test_mask_truncated_completions_trains_on_none_of_a_batch_cut_short(tiny_model_dir, tmp_path):
    """The random tiny model never ends within 8 tokens: with ``mask_truncated_completions`` every completion is
    masked and the step leaves the policy as it was (the same batch trains without it: the tests above)."""
    log, gain, batch = one_step(tiny_model_dir, tmp_path, mask_truncated_completions=True)
    assert batch["completion_mask"].sum() == 0  # every completion cut at max_completion_length, all masked
    assert math.isfinite(log["loss"]) and log["grad_norm"] == 0 and gain == 0


def test_sequence_ratios_count_the_completions_own_tokens_only():
    """GSPO's sequence-level ratio averages the log-ratio over ``completion_mask * tool_mask``: the completion's own
    tokens, no tool turn (vision tokens are the prompt's, never in the completion)."""
    from trl import GRPOTrainer

    source = inspect.getsource(GRPOTrainer._compute_loss)
    assert 'mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]' in source
    assert "log_importance_weights = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)" in source
