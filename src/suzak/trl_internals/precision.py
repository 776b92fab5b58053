"""The numbers a run trains with: fp32 adapters, no earlier trainer's autocast, the fused LM head, non-finite steps.

- :func:`keep_adapters_fp32`: TRL's trainers cast a 4/8-bit model's trainable parameters to bf16 in ``__init__``;
  cast back before the optimizer exists (``test_trl_casts_a_quantized_models_adapters_to_bf16``);
- :func:`drop_earlier_autocast`: accelerate's ``_original_forward``, the forward an earlier trainer's mixed-precision
  wrapper replaced (taken off before this run's trainer wraps the model);
- :func:`score_labelled_positions_only`: ``trl.trainer.utils._use_triton``, which TRL's fused LM head
  (``add_fused_lm_head``'s forward) asks whether to score only the positions with a label (Triton devices) or every
  position (elsewhere, for compiled backends' fixed shapes): on the CPU, only the labelled ones too
  (``test_the_fused_lm_head_asks_use_triton_whether_to_score_labelled_positions_only``);
- :class:`NonFiniteStep`: what transformers' ``Trainer._get_grad_norm`` override raises on a nan or inf norm
  (``test_trainer_hooks``).

The tests named are in tests/test_trl_contract.py.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch

from suzak import SuzakError

logger = logging.getLogger(__name__)


class NonFiniteStep(SuzakError):
    """A step's gradient norm was nan or inf (``on_nonfinite: stop``); raised before the optimizer step."""


def keep_adapters_fp32(model) -> int:
    """Cast a quantized model's trainable (adapter) parameters back to fp32; returns how many were cast.

    TRL's trainers cast every trainable parameter of a 4/8-bit model to bf16 in ``__init__`` (QLoRA's paper; GRPO and
    SFT alike, a contract test checks it). A bf16 lora_A entry
    near its init scale (1/sqrt(in_features), ~0.017 for a 7B) moves in steps of ~6e-5, so Adam updates at GRPO's
    learning rates (1e-6..1e-5) round away and lora_A never trains, silently; fp32 adapters cost a few MB and the
    layer casts its input to the adapter's dtype (PEFT), so nothing else changes.
    """
    if not (getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False)):
        return 0
    count = 0
    for param in model.parameters():
        if param.requires_grad and param.dtype in (torch.bfloat16, torch.float16):
            param.data = param.data.float()
            count += param.numel()
    if count:
        logger.info("QLoRA: %d adapter parameters train in fp32 (a bf16 adapter rounds small updates away)", count)
    return count


def drop_earlier_autocast(model: Any) -> bool:
    """Take an earlier trainer's mixed-precision wrapper off ``model``'s forward (accelerate keeps the original as
    ``_original_forward``); returns whether there was one.

    A model trained in the same process before (an SFT prior: TRL's ``SFTConfig`` turns bf16 on even on a CPU) keeps
    running its forward under that trainer's bf16 autocast, whatever this run's precision: the policy then scores
    in bf16 what colocated vLLM sampled in fp32 (measured: 0.03-0.09 nats on uncertain tokens). This run's own
    accelerator wraps it again when its precision asks for it.
    """
    if not isinstance(model, torch.nn.Module) or "_original_forward" not in vars(model):
        return False
    from accelerate.utils import extract_model_from_parallel

    extract_model_from_parallel(model, keep_fp32_wrapper=False)
    logger.info("the model came with an earlier trainer's autocast wrapper on its forward; removed, so this run's "
                "precision is its own")  # fmt: skip
    return True


def score_labelled_positions_only() -> None:
    """TRL's fused LM head scores only the positions with a label on the CPU too (patched once, for the process).

    TRL 1.16's ``add_fused_lm_head`` projects every position of a batch through the LM head, prompt and padding
    included, on devices without Triton (``compact = _use_triton(device)``: elsewhere a changing count of labelled
    positions would recompile a compiled backend's tiles), and masks the results afterwards. On the CPU, in eager
    PyTorch, nothing recompiles, and a GRPO batch's prompts are most of its positions: the forward and backward of the
    LM head on the prompt were ~40 % of a self-test prior's SFT step on the tiny model. Every labelled position gets
    the same log-probability and entropy either way (each row of the projection is its own); the other positions are
    0 in both. GPUs (Triton) are unchanged, and so is a CPU forward that torch.compile traces (``torch_compile``: there
    TRL's fixed shapes avoid a recompile per batch).
    """
    import trl.trainer.utils as trl_utils

    tritons = trl_utils._use_triton
    if getattr(tritons, "compact_on_cpu", False):
        return

    def compact(device: torch.device) -> bool:
        return (device.type == "cpu" and not torch.compiler.is_compiling()) or tritons(device)

    compact.compact_on_cpu = True
    compact.trl_use_triton = tritons
    trl_utils._use_triton = compact


def checked_grad_norm(trainer, model, norm):
    """A step's gradient ``norm`` (transformers' ``_get_grad_norm``) checked before the optimizer step: nan or inf
    raises :class:`NonFiniteStep`, or with ``on_nonfinite = "skip"`` drops the step's gradients (counted)."""
    value = norm.item() if isinstance(norm, torch.Tensor) else norm
    if value is None or math.isfinite(value):
        return norm
    step = trainer.state.global_step + 1
    rows = trainer.step_rows()
    where = f"step {step}" + (f" (rows of its batch: {', '.join(rows[:8])}{', ...' if len(rows) > 8 else ''})"
                              if rows else "")  # fmt: skip
    if trainer.on_nonfinite == "skip" and not trainer.is_deepspeed_enabled:
        trainer.nonfinite_skipped += 1
        model.zero_grad(set_to_none=True)  # the optimizer skips parameters without a gradient
        logger.warning("the gradient norm is %s at %s: the optimizer step is skipped, every weight stays as it "
                       "was (%d step(s) skipped so far; nonfinite/skipped_steps)", value, where,
                       trainer.nonfinite_skipped)  # fmt: skip
        return norm
    if trainer.is_deepspeed_enabled:
        raise NonFiniteStep(f"the gradient norm is {value} at {where}; DeepSpeed has already applied it, so "
                            "nothing is saved from this run state")  # fmt: skip
    raise NonFiniteStep(f"the gradient norm is {value} at {where} (a nan or inf loss); the step was not applied "
                        "and no weight changed (on_nonfinite skip would skip such steps and count them)")  # fmt: skip
