"""GPU-only checks (skipped without CUDA): the smoke recipe trains on the GPU with the weights dtype the loader
promises (suzak.models.loading._dtype): fp32 master weights under bf16 autocast for plain full fine-tuning, bf16
base weights under LoRA (its adapters train in fp32)."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _train_smoke(tmp_path, tiny_model_dir, *flags):
    from suzak.train import build_trainer, parse_args

    suzak_args, grpo, model = parse_args([
        "--config", "recipes/smoke.yaml", "--use_cpu", "false", "--bf16", "true", "--max_steps", "2",
        "--output_dir", str(tmp_path), "--model_name_or_path", str(tiny_model_dir), "--save_strategy", "no", *flags,
    ])  # fmt: skip
    trainer = build_trainer(suzak_args, grpo, model)
    trainer.train()
    assert trainer.state.global_step == 2
    return trainer


def test_full_fine_tuning_on_gpu_keeps_fp32_master_weights(tmp_path, tiny_model_dir):
    trainer = _train_smoke(tmp_path, tiny_model_dir)
    params = list(trainer.model.parameters())
    assert {p.dtype for p in params} == {torch.float32} and params[0].device.type == "cuda"
    assert trainer.args.bf16  # computed in bf16 autocast


def test_lora_on_gpu_keeps_bf16_base_weights(tmp_path, tiny_model_dir):
    trainer = _train_smoke(tmp_path, tiny_model_dir, "--use_peft", "true", "--lora_r", "4",
                           "--lora_target_modules", "q_proj", "v_proj")  # fmt: skip
    frozen = {p.dtype for p in trainer.model.parameters() if not p.requires_grad}
    trainable = {p.dtype for p in trainer.model.parameters() if p.requires_grad}
    assert frozen == {torch.bfloat16} and trainable == {torch.float32}
