"""QLoRA: a 4-bit (bitsandbytes, nf4) base with LoRA adapters on top, for GRPO, SFT, evaluation, export and release.

bitsandbytes 0.50 has a CPU backend, so these are real 4-bit runs on the tiny model: the base's linear layers are
``Linear4bit`` with packed uint8 weights that never change, the adapters train (in fp32), the vision tower and the
output head stay unquantized, the adapter merges into the unquantized base, and settings that cannot work are one
line before anything loads.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from suzak import SuzakError
from suzak.media.vision import PixelBudget

ROOT = Path(__file__).resolve().parents[1]
SMOKE = str(ROOT / "recipes" / "smoke.yaml")
QLORA = {"use_peft": True, "load_in_4bit": True, "lora_r": 4, "lora_alpha": 8,
         "lora_target_modules": ["q_proj", "v_proj", "o_proj", "gate_proj"]}  # fmt: skip

bnb = pytest.importorskip("bitsandbytes")


def _linear4bit(model) -> dict[str, torch.nn.Module]:
    return {name: module for name, module in model.named_modules() if isinstance(module, bnb.nn.Linear4bit)}


def test_qlora_grpo_trains_the_adapters_on_a_frozen_4bit_base(tiny_model_dir, tmp_path):
    """GRPO steps on the 4-bit tiny model: every adapter matrix moves (fp32), the packed base never does, the vision
    tower and lm_head are not quantized."""
    from test_trainer import image_dataset, length_reward, make_trainer

    trainer = make_trainer(tiny_model_dir, tmp_path, image_dataset(8), [length_reward], model_overrides=QLORA,
                           budget=PixelBudget(3136, 50176), max_steps=3, learning_rate=1e-2)  # fmt: skip
    quantized = _linear4bit(trainer.model)
    assert quantized and all(".language_model." in name for name in quantized)
    assert not any(".visual." in n for n in quantized) and not any("lm_head" in n for n in quantized)
    packed = {name: module.weight.data.clone() for name, module in quantized.items()}
    assert all(w.dtype == torch.uint8 for w in packed.values())
    adapters = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert adapters and all("lora_" in n for n in adapters)
    assert all(p.dtype == torch.float32 for p in adapters.values())  # TRL casts them to bf16; suzak's trainers back
    trainer.train()
    assert trainer.state.global_step == 3
    moved = {n: not torch.equal(adapters[n], p.detach()) for n, p in trainer.model.named_parameters() if n in adapters}
    assert all(moved.values()), [n for n, m in moved.items() if not m]  # lora_A moves from step 2 (lora_B starts at 0)
    after = _linear4bit(trainer.model)
    assert after.keys() == packed.keys()
    assert all(torch.equal(after[n].weight.data, packed[n]) and after[n].weight.dtype == torch.uint8 for n in packed)


def test_quantize_vision_tower_quantizes_it_too(tiny_model_dir, tmp_path):
    from types import SimpleNamespace

    from trl import ModelConfig

    from suzak.models.loading import load_model_and_processor

    model_args = ModelConfig(model_name_or_path=str(tiny_model_dir), **QLORA)
    model, _ = load_model_and_processor(model_args, SimpleNamespace(bf16=False, fp16=False), quantize_vision_tower=True)
    assert any(".visual." in name for name in _linear4bit(model))


def test_qlora_sft_step(tmp_path):
    """suzak.sft on the 4-bit tiny model: an optimizer step, adapters only."""
    from suzak.sft import build_sft_trainer
    from suzak.training.configs import parse_sft_args

    parsed = parse_sft_args(["--config", str(ROOT / "recipes" / "sft_clevr_smoke.yaml"), "--dataset_options",
                             '{"num_rows": 8}', "--eval_rows", "0", "--max_steps", "1", "--save_strategy", "no",
                             "--output_dir", str(tmp_path / "sft"), "--load_in_4bit", "true", "--use_peft", "true",
                             "--lora_target_modules", "q_proj", "v_proj"])  # fmt: skip
    trainer = build_sft_trainer(*parsed)
    assert _linear4bit(trainer.model)
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters() if p.requires_grad)  # TRL's were bf16
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if n.endswith("lora_B.default.weight")}
    trainer.train()
    assert trainer.state.global_step == 1
    after = dict(trainer.model.named_parameters())
    assert before and all(not torch.equal(before[n], after[n].detach()) for n in before)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--load_in_4bit", "true"], "load_in_4bit freezes the model .* set use_peft: true"),
        (["--load_in_4bit", "true", "--use_peft", "true", "--use_vllm", "true"], "load_in_4bit with use_vllm"),
        (["--load_in_4bit", "true", "--use_peft", "true", "--bnb_4bit_quant_type", "int4"], "invalid choice: 'int4'"),
        (["--quantize_vision_tower", "true"], "quantize_vision_tower needs load_in_4bit"),
    ],
)
def test_qlora_settings_that_cannot_work_are_one_line(flags, message):
    from suzak.training.configs import parse_args

    with pytest.raises(SuzakError, match=message):
        parse_args(["--config", SMOKE, *flags])


def test_eval_with_vllm_and_4bit_is_one_line():
    from suzak.eval.runner import EvalConfig

    with pytest.raises(SuzakError, match="bitsandbytes for the hf engine"):
        EvalConfig(model_path="tiny", task="superclevr", engine="vllm", load_in_4bit=True)


@pytest.mark.slow
def test_qlora_command_export_eval_and_release(tmp_path, run_env, eval_fixture_dir):
    """The train command with --load_in_4bit writes an adapter; it merges into the unquantized base (the merged
    model gives the adapter's outputs on that base), evaluates on the 4-bit base with the adapter unmerged, and its
    release card says it was trained as QLoRA."""
    from huggingface_hub import ModelCard
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText

    from conftest import run_ok
    from suzak.eval.tasks import get_task

    out = tmp_path / "qlora"
    env = run_env | {"PYTHONPATH": str(ROOT / "tests")}  # a reward that varies within a group: non-zero gradients
    run_ok([sys.executable, "-m", "suzak.train", "--config", SMOKE, "--max_steps", "2", "--save_steps", "2",
            "--rewards", "test_trainer.length_reward", "--reward_weights", "1.0", "--preflight_rows", "0",
            "--learning_rate", "1e-2", "--output_dir", str(out), "--load_in_4bit", "true", "--use_peft", "true",
            "--lora_target_modules", "q_proj", "v_proj"], env)  # fmt: skip
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["target_modules"] and not (out / "model.safetensors").exists()
    run_info = json.loads((out / "run_info.json").read_text())
    assert run_info["launches"][-1]["status"] == "completed"

    merged = tmp_path / "merged"
    run_ok([sys.executable, "-m", "suzak", "export", "lora", str(out), "--output", str(merged)], run_env)
    assert "quantization_config" not in json.loads((merged / "config.json").read_text())
    base = AutoModelForImageTextToText.from_pretrained(config["base_model_name_or_path"])  # the unquantized tiny
    adapted = PeftModel.from_pretrained(base, str(out)).eval()
    full = AutoModelForImageTextToText.from_pretrained(merged).eval()
    ids = torch.tensor([[5, 17, 42, 99, 7]])
    with torch.no_grad():
        assert torch.allclose(full(input_ids=ids).logits, adapted(input_ids=ids).logits, atol=1e-5)
        with adapted.disable_adapter():
            assert not torch.allclose(full(input_ids=ids).logits, adapted(input_ids=ids).logits, atol=1e-5)

    results = tmp_path / "sc.json"
    prompts = eval_fixture_dir / get_task("superclevr").prompt_path
    run_ok([sys.executable, "-m", "suzak.eval", "superclevr", "--model_path", str(out), "--load_in_4bit", "true",
            "--image_root", str(eval_fixture_dir), "--prompt_path", str(prompts), "--output_path", str(results),
            "--max_new_tokens", "8", "--batch_size", "4", "--no_progress"], run_env)  # fmt: skip
    assert len(json.loads(results.read_text())["results"]) == 8
    assert json.loads((tmp_path / "sc.summary.json").read_text())["settings"]["quantization"] == "nf4 4-bit"

    run_ok([sys.executable, "-m", "suzak.release", "--checkpoint", str(out), "--repo_id", "me/tiny-qlora", "--dry_run"],
           run_env)  # fmt: skip
    card = ModelCard.load(out / "release" / "README.md").text
    assert "QLoRA" in card and "nf4" in card
    assert (out / "release" / "adapter_model.safetensors").is_file()


@pytest.mark.parametrize(
    ("gpus", "args", "deepspeed"),
    [
        ("0", ["--recipe", "recipes/clevr_qwen2.5vl_7b_qlora.yaml"], None),
        ("0,1", ["--recipe", "recipes/clevr_qwen2.5vl_7b.yaml", "--load_in_4bit", "true", "--use_peft", "true"], None),
        ("0", ["--recipe", "recipes/clevr_qwen2.5vl_7b_qlora.yaml", "--load_in_4bit", "false"], "auto"),
        (
            "0",
            ["--recipe", "recipes/clevr_qwen2.5vl_7b.yaml", "--deepspeed", "ds_configs/zero2_offload.json"],
            "ds_configs/zero2_offload.json",
        ),
        ("0,1", ["--recipe", "recipes/clevr_qwen2.5vl_7b.yaml", "--deepspeed", "none"], None),
    ],
)
def test_launch_script_runs_qlora_without_deepspeed(run_env, gpus, args, deepspeed):
    """The QLoRA recipe's adapters fit any GPU: the launch script leaves DeepSpeed (and its CPU offload) out."""
    from conftest import run_ok

    env = run_env | {"CUDA_VISIBLE_DEVICES": gpus, "SUZAK_DRY_RUN": "1"}
    line = next(x for x in run_ok(["bash", "src/scripts/run_grpo_clevr.sh", *args], env).stdout.splitlines()
                if x.startswith("dry run: "))  # fmt: skip
    assert (
        line.startswith("dry run: python -m suzak.runs.launch ") and f"--nproc_per_node {len(gpus.split(','))}" in line
    )
    assert ("--deepspeed" in line) == (deepspeed is not None)
    if deepspeed:
        assert line.count("--deepspeed") == 1 and f"--deepspeed {deepspeed}" in line.split(" --config ")[1]
