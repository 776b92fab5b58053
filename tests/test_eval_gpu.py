"""Evaluation on a CUDA GPU (skipped without one): bf16 weights, inputs on the GPU, the same R1-V output."""

from __future__ import annotations

import json

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_superclevr_in_bf16_on_gpu(tiny_model_dir, eval_fixture_dir, tmp_path):
    from suzak.eval.runner import EvalConfig, build_engine, default_budget, evaluate, prepare_items
    from suzak.eval.tasks import TASKS, get_task

    task = get_task("superclevr")
    config = EvalConfig(task="superclevr", model_path=str(tiny_model_dir), image_root=str(eval_fixture_dir),
                        prompt_path=str(eval_fixture_dir / TASKS["superclevr"].prompt_path),
                        output_path=str(tmp_path / "gpu.json"), batch_size=4, max_new_tokens=16, seeds=[0],
                        progress=False)  # fmt: skip
    items, _ = prepare_items(config, task)
    engine = build_engine(config, task, default_budget(config), items)
    assert engine.model.dtype == torch.bfloat16 and engine.model.device.type == "cuda"
    report = evaluate(config, engine=engine)
    data = json.loads((tmp_path / "gpu.json").read_text())
    assert report.greedy.total == len(data["results"]) == 8 and report.sampled[0].total == 8
    assert data["accuracy"] == pytest.approx(100 * sum(r["is_correct"] for r in data["results"]) / 8)
