"""GPU-only checks (skipped without CUDA): the smoke recipe in bf16 on the GPU, attention fallback."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_attn_auto_falls_back_to_sdpa_without_flash_attn(caplog):
    import importlib.util
    import logging

    caplog.set_level(logging.INFO, logger="suzak.modeling")
    from suzak.modeling import pick_attn_implementation

    expected = "flash_attention_2" if importlib.util.find_spec("flash_attn") else "sdpa"
    assert pick_attn_implementation("auto") == expected
    assert f"attention implementation: {expected}" in caplog.text


def test_tiny_grpo_in_bf16_on_gpu(tmp_path, tiny_model_dir):
    from suzak.train import build_trainer, parse_args

    suzak_args, grpo, model = parse_args([
        "--config", "recipes/smoke.yaml", "--use_cpu", "false", "--bf16", "true", "--max_steps", "2",
        "--output_dir", str(tmp_path), "--model_name_or_path", str(tiny_model_dir), "--save_strategy", "no",
    ])  # fmt: skip
    trainer = build_trainer(suzak_args, grpo, model)
    assert next(trainer.model.parameters()).dtype == torch.bfloat16
    assert next(trainer.model.parameters()).device.type == "cuda"
    trainer.train()
    assert trainer.state.global_step == 2
