"""The training entry point and launch script as a user runs them: recipes, overrides, .env, resume, launchers."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from conftest import last_trainer_state, run_ok
from suzak import SuzakError
from suzak.configs import parse_args
from suzak.runs.checkpoints import latest_checkpoint
from suzak.session import setup_reporting

ROOT = Path(__file__).resolve().parents[1]
SMOKE = str(ROOT / "recipes" / "smoke.yaml")


# --- parsing -----------------------------------------------------------------------------------------------------


def test_recipe_then_cli_overrides():
    suzak_args, grpo, model = parse_args(["--config", SMOKE, "--max_steps", "7", "--max_pixels", "100352"])
    assert grpo.max_steps == 7 and suzak_args.max_pixels == 100352
    assert model.model_name_or_path == "tiny" and suzak_args.rewards == ["clevr_count", "think_format"]
    assert suzak_args.dataset_options["num_rows"] == 64


def test_json_dataset_options_on_the_cli():
    suzak_args, _, _ = parse_args(["--config", SMOKE, "--dataset_options", '{"num_rows": 5}'])
    assert suzak_args.dataset_options == {"num_rows": 5}
    with pytest.raises(SuzakError, match="JSON object"):
        parse_args(["--config", SMOKE, "--dataset_options", "{num_rows"])


def test_env_overrides_recipe_and_cli_overrides_env(monkeypatch):
    monkeypatch.setenv("MODEL", "/models/from-env")
    monkeypatch.setenv("OUTPUT_DIR", "/runs/from-env")
    _, grpo, model = parse_args(["--config", SMOKE])
    assert model.model_name_or_path == "/models/from-env" and grpo.output_dir == "/runs/from-env"
    _, _, model = parse_args(["--config", SMOKE, "--model_name_or_path", "/models/cli"])
    assert model.model_name_or_path == "/models/cli"


@pytest.mark.parametrize("recipe", ["clevr_qwen2.5vl_7b.yaml", "clevr_qwen2.5vl_3b.yaml"])
def test_h100_recipes_parse(recipe):
    suzak_args, grpo, model = parse_args(["--config", str(ROOT / "recipes" / recipe)])
    assert model.model_name_or_path.startswith("Qwen/Qwen2.5-VL-")
    assert suzak_args.max_pixels == 401408 and suzak_args.prompt_template == "r1v"
    assert suzak_args.rewards == ["clevr_count", "think_format"]
    assert (grpo.num_generations, grpo.learning_rate, grpo.beta) == (8, 1e-6, 0.04)


@pytest.mark.parametrize("name", ["zero2.json", "zero2_offload.json", "zero3.json"])
def test_deepspeed_configs_use_auto_fields(name):
    config = json.loads((ROOT / "ds_configs" / name).read_text())
    assert config["train_micro_batch_size_per_gpu"] == "auto" and config["gradient_accumulation_steps"] == "auto"
    assert config["zero_optimization"]["stage"] in (2, 3)


def test_wandb_without_key_goes_offline(monkeypatch, tmp_path, caplog):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    _, grpo, _ = parse_args(["--config", SMOKE, "--report_to", "wandb"])
    setup_reporting(grpo)
    assert os.environ["WANDB_MODE"] == "offline" and "W&B runs offline" in caplog.text


def test_missing_model_is_one_clear_line(tmp_path):
    from trl import ModelConfig

    from suzak.models.loading import load_model_and_processor

    with pytest.raises(SuzakError, match="cannot load model 'Qwen/Qwen2.5-VL-7B-Instruct'.*local"):
        load_model_and_processor(ModelConfig(model_name_or_path="Qwen/Qwen2.5-VL-7B-Instruct"), None)


def _checkpoint(root: Path, step: int, state: str = "{}", weights: bool = True) -> Path:
    folder = root / f"checkpoint-{step}"
    folder.mkdir()
    (folder / "trainer_state.json").write_text(state)
    if weights:
        (folder / "model.safetensors").write_bytes(b"x" * 10)
    return folder


def test_latest_checkpoint_skips_incomplete(tmp_path):
    """Plain Trainer checkpoints (no marker): trainer_state.json, written last, must parse and weights must exist."""
    _checkpoint(tmp_path, 10)
    _checkpoint(tmp_path, 20)
    _checkpoint(tmp_path, 30, weights=False)  # weights never written
    _checkpoint(tmp_path, 40, state='{"global_st')  # killed while writing the state
    assert latest_checkpoint(tmp_path) == str(tmp_path / "checkpoint-20")
    assert latest_checkpoint(tmp_path / "nothing-here") is None


def test_latest_checkpoint_trusts_only_intact_marked_checkpoints(tmp_path, caplog):
    from suzak.runs.checkpoints import begin_overwrite, mark_complete

    mark_complete(_checkpoint(tmp_path, 1))
    truncated = mark_complete(_checkpoint(tmp_path, 2)).parent
    (truncated / "model.safetensors").write_bytes(b"x" * 3)  # damaged after it was written
    overwriting = mark_complete(_checkpoint(tmp_path, 3)).parent
    begin_overwrite(overwriting)  # a resumed run started saving into it again and died
    assert latest_checkpoint(tmp_path) == str(tmp_path / "checkpoint-1")
    assert "checkpoint-2: model.safetensors has 3 bytes, 10 when" in caplog.text
    assert "checkpoint-3: a save into it did not finish" in caplog.text
    assert (tmp_path / "checkpoint-3").is_dir()  # skipped, never deleted
    mark_complete(overwriting)  # that save finished after all
    assert latest_checkpoint(tmp_path) == str(tmp_path / "checkpoint-3")


# --- end to end --------------------------------------------------------------------------------------------------


def test_smoke_preset_through_launch_script(tmp_path, run_env):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    out = tmp_path / "smoke"
    result = run_ok(["bash", "src/scripts/run_grpo_clevr.sh", "--preset", "smoke", "--max_steps", "2",
                   "--output_dir", str(out)], run_env)  # fmt: skip
    assert f"output {out}" in result.stdout and "checkpoints:" in result.stdout
    assert "reward pre-flight passed" in result.stderr
    assert last_trainer_state(out)["global_step"] == 2
    model = AutoModelForImageTextToText.from_pretrained(out)
    processor = AutoProcessor.from_pretrained(out)
    assert type(model).__name__ == "Qwen2_5_VLForConditionalGeneration"
    assert processor.image_processor.size["longest_edge"] == 50176  # the recipe's budget travels with the model


@pytest.mark.slow
def test_resume_from_latest_checkpoint(tmp_path, run_env):
    out = tmp_path / "resume"
    base = [sys.executable, "-m", "suzak.train", "--config", SMOKE, "--output_dir", str(out), "--save_steps", "1"]
    run_ok(base + ["--max_steps", "2"], run_env)
    result = run_ok(base + ["--max_steps", "3", "--resume_from_checkpoint", "latest"], run_env)
    assert f"resuming from {out / 'checkpoint-2'}" in result.stderr
    assert last_trainer_state(out)["global_step"] == 3


@pytest.mark.slow
def test_torchrun_two_processes_gloo(tmp_path, run_env):
    out = tmp_path / "ddp"
    run_ok([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "suzak.train", "--config",
          SMOKE, "--max_steps", "2", "--per_device_train_batch_size", "4", "--output_dir", str(out)], run_env)  # fmt: skip
    assert last_trainer_state(out)["global_step"] == 2


@pytest.mark.slow
def test_deepspeed_zero2_on_cpu(tmp_path, run_env):
    out = tmp_path / "zero2"
    run_ok([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1", "-m", "suzak.train", "--config",
          SMOKE, "--max_steps", "2", "--deepspeed", "ds_configs/zero2.json", "--output_dir", str(out)], run_env)  # fmt: skip
    assert last_trainer_state(out)["global_step"] == 2
    assert any((out / "checkpoint-2").glob("global_step*"))


def test_tiny_cache_is_keyed_by_the_builder_and_built_whole(tmp_path, monkeypatch):
    from suzak.models.loading import resolve_model_path, tiny_model_cache

    monkeypatch.setenv("SUZAK_CACHE", str(tmp_path))
    path = Path(resolve_model_path("tiny"))
    assert path == tiny_model_cache() and (path / "config.json").is_file()
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no scratch folder left behind
    assert path.name.startswith("tiny-qwen2.5-vl-") and len(path.name) == len("tiny-qwen2.5-vl-") + 10
    assert resolve_model_path("Qwen/Qwen2.5-VL-7B-Instruct") == "Qwen/Qwen2.5-VL-7B-Instruct"


def test_recipe_dataset_options_stay_with_the_recipe_dataset(monkeypatch, caplog):
    """The smoke recipe's options are for gsm8k_synthetic: another dataset (flag or DATASET) does not inherit them."""
    recipe = ["--config", "recipes/gsm8k_smoke.yaml"]
    assert parse_args(recipe)[0].dataset_options  # the recipe's own dataset: its options apply
    with caplog.at_level("INFO", logger="suzak.configs"):
        other = parse_args([*recipe, "--dataset_name", "tests/fixtures/gsm8k_tiny.jsonl"])[0]
    assert other.dataset_options is None and "the recipe's dataset_options" in caplog.text
    monkeypatch.setenv("DATASET", "tests/fixtures/gsm8k_tiny.jsonl")
    assert parse_args(recipe)[0].dataset_options is None
    given = parse_args([*recipe, "--dataset_options", '{"template": "gsm8k_think"}'])[0]
    assert given.dataset_options == {"template": "gsm8k_think"}  # options given with the new dataset apply
