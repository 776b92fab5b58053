"""Exports that round-trip: a LoRA adapter merged into its base, a DeepSpeed ZeRO checkpoint consolidated; both reload
with the Auto classes, give the same outputs as the trained model, and evaluate with suzak.eval."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image
from transformers import AutoModelForImageTextToText, AutoProcessor

from suzak import SuzakError
from suzak.release.export import export_lora, export_zero

ROOT = Path(__file__).resolve().parents[1]
SMOKE = str(ROOT / "recipes" / "smoke.yaml")


def model_inputs(processor) -> dict:
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many items?"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    return processor(text=[text], images=[Image.new("RGB", (112, 84), (200, 30, 30))], return_tensors="pt")


def logits(model, inputs) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(**inputs).logits


def evaluate_folder(model_dir: Path, eval_fixture_dir: Path, out: Path):
    """suzak's SuperCLEVR evaluation (R1-V protocol, HF engine) on two fixture items."""
    from suzak.eval import EvalConfig, evaluate

    config = EvalConfig(task="superclevr", model_path=str(model_dir), image_root=str(eval_fixture_dir),
                        prompt_path=str(eval_fixture_dir / "prompts" / "superclevr_test200_counting_problems.jsonl"),
                        output_path=str(out), limit=2, batch_size=2, max_new_tokens=8, progress=False)  # fmt: skip
    report = evaluate(config)
    assert report.greedy.total == 2 and 0.0 <= report.greedy.accuracy <= 100.0
    assert out.is_file()
    return report


def test_lora_adapter_merges_reloads_and_evaluates(tiny_model_dir, tmp_path, eval_fixture_dir):
    from peft import LoraConfig, get_peft_model

    processor = AutoProcessor.from_pretrained(tiny_model_dir)
    base = AutoModelForImageTextToText.from_pretrained(tiny_model_dir)
    inputs = model_inputs(processor)
    base_logits = logits(base, inputs)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    adapted = get_peft_model(base, config)  # random, non-zero adapters: merging must change the outputs
    expected = logits(adapted, inputs)
    adapter = tmp_path / "run-lora"
    adapted.save_pretrained(adapter)
    processor.save_pretrained(adapter)

    merged_dir = export_lora(adapter)
    assert merged_dir == tmp_path / "run-lora-merged"
    assert not (merged_dir / "adapter_config.json").exists() and (merged_dir / "model.safetensors").is_file()
    merged = AutoModelForImageTextToText.from_pretrained(merged_dir)
    assert not any("lora" in name for name in merged.state_dict())
    got = logits(merged, model_inputs(AutoProcessor.from_pretrained(merged_dir)))
    assert torch.allclose(got, expected, atol=1e-4) and not torch.allclose(got, base_logits, atol=1e-3)
    evaluate_folder(merged_dir, eval_fixture_dir, tmp_path / "eval" / "superclevr_results_merged.json")


def test_export_errors_are_one_line(tmp_path, tiny_model_dir):
    with pytest.raises(SuzakError, match="not a LoRA adapter folder"):
        export_lora(tiny_model_dir, tmp_path / "out")
    with pytest.raises(SuzakError, match="holds no DeepSpeed ZeRO checkpoint"):
        export_zero(tiny_model_dir, tmp_path / "out")


@pytest.mark.slow
@pytest.mark.parametrize("config", ["zero2.json", "zero3.json"])
def test_zero_checkpoint_exports_reloads_and_evaluates(tmp_path, tiny_model_dir, eval_fixture_dir, config):
    out = tmp_path / "run"
    # The tiny model is built beforehand: built inside a ZeRO-3 run it would be saved from partitioned (empty) weights.
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1", "-m", "suzak.train", "--config", SMOKE,
         "--model_name_or_path", str(tiny_model_dir), "--max_steps", "1", "--save_steps", "1", "--deepspeed",
         f"ds_configs/{config}", "--output_dir", str(out)],
        cwd=ROOT, env=os.environ | {"SUZAK_ENV_FILE": str(tmp_path / "absent.env")}, capture_output=True, text=True,
        timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    checkpoint = out / "checkpoint-1"
    assert any(checkpoint.glob("global_step*"))
    saved = AutoModelForImageTextToText.from_pretrained(checkpoint).state_dict()  # what the Trainer saved
    (checkpoint / "model.safetensors").unlink()  # the export must rebuild the weights from the shards alone

    exported = export_zero(checkpoint)
    assert exported == out / "checkpoint-1-hf"
    model = AutoModelForImageTextToText.from_pretrained(exported)
    state = model.state_dict()
    assert state.keys() == saved.keys()
    for name, tensor in saved.items():
        assert torch.allclose(state[name].float(), tensor.float(), atol=1e-6), name
    processor = AutoProcessor.from_pretrained(exported)
    assert processor.image_processor.size["longest_edge"] == 50176  # the recipe's budget travels along
    evaluate_folder(exported, eval_fixture_dir, tmp_path / "eval" / "superclevr_results_zero.json")
