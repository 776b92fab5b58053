"""The training entry point and launch script as a user runs them: recipes, overrides, .env, resume, launchers."""

from __future__ import annotations

import csv
import json
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import last_trainer_state, run_ok
from suzak import SuzakError
from suzak.runs.checkpoints import checkpoint_problem, latest_checkpoint
from suzak.scoring.rewards import resolve_rewards
from suzak.training.configs import parse_args
from suzak.training.session import setup_reporting

ROOT = Path(__file__).resolve().parents[1]
SMOKE = str(ROOT / "recipes" / "smoke.yaml")


# --- parsing -----------------------------------------------------------------------------------------------------


def test_recipe_then_cli_overrides():
    suzak_args, grpo, model = parse_args(["--config", SMOKE, "--max_steps", "7", "--max_pixels", "100352"])
    assert grpo.max_steps == 7 and suzak_args.max_pixels == 100352
    assert model.model_name_or_path == "tiny" and suzak_args.rewards == ["clevr_count", "think_format"]
    assert suzak_args.dataset_options["num_rows"] == 64


def test_json_dataset_options_on_the_cli():
    """--dataset_options updates the recipe's options for its own dataset key by key: the recipe's seed stays."""
    suzak_args, _, _ = parse_args(["--config", SMOKE, "--dataset_options", '{"num_rows": 5}'])
    assert suzak_args.dataset_options == {"num_rows": 5, "seed": 0, "min_objects": 3, "max_objects": 6}
    suzak_args, _, _ = parse_args(["--config", SMOKE, "--dataset_options={\"seed\": 3}", "--dataset_name",
                                   "clevr_synthetic"])  # fmt: skip
    assert suzak_args.dataset_options == {"num_rows": 64, "seed": 3, "min_objects": 3, "max_objects": 6}
    with pytest.raises(SuzakError, match="JSON object"):
        parse_args(["--config", SMOKE, "--dataset_options", "{num_rows"])


def test_reward_kwargs_on_the_cli_update_the_recipes_reward_by_reward(tmp_path, caplog):
    """gsm8k_smoke.yaml runs [gsm8k_accuracy, gsm8k_format] with {gsm8k_format: {style: hash}}."""
    import yaml

    recipe = ["--config", "recipes/gsm8k_smoke.yaml"]
    assert parse_args(recipe)[0].reward_kwargs == {"gsm8k_format": {"style": "hash"}}
    assert parse_args([*recipe, "--reward_kwargs", '{"gsm8k_format": {"style": "think"}}'])[0].reward_kwargs == {
        "gsm8k_format": {"style": "think"}}  # fmt: skip
    two = yaml.safe_load(Path(SMOKE).read_text()) | {"rewards": ["clevr_count", "gsm8k_format"],
                                                     "reward_kwargs": {"gsm8k_format": {"style": "hash"}}}  # fmt: skip
    (tmp_path / "two.yaml").write_text(yaml.safe_dump(two))
    merged = parse_args(["--config", str(tmp_path / "two.yaml"), "--reward_kwargs",
                         '{"clevr_count": {"answer_format": "plain"}}'])[0]  # fmt: skip
    assert merged.reward_kwargs == {"gsm8k_format": {"style": "hash"}, "clevr_count": {"answer_format": "plain"}}
    resolve_rewards(merged.rewards, merged.reward_kwargs)  # the recipe's other reward keeps its kwargs
    dropped = parse_args([*recipe, '--reward_kwargs={"gsm8k_format": null}'])[0]
    assert dropped.reward_kwargs is None
    with caplog.at_level("INFO", logger="suzak.training.configs"):
        fewer = parse_args([*recipe, "--rewards", "gsm8k_accuracy", "--reward_weights", "1.0"])[0]
    assert fewer.reward_kwargs is None and "the recipe's reward_kwargs for it are not applied" in caplog.text
    resolve_rewards(fewer.rewards, fewer.reward_kwargs)  # runs: no stray kwargs for the reward left out
    stray = parse_args([*recipe, "--rewards", "gsm8k_accuracy", "--reward_weights", "1.0", "--reward_kwargs",
                        '{"gsm8k_format": {"style": "hash"}}'])[0]  # fmt: skip
    with pytest.raises(SuzakError, match="reward kwargs given for gsm8k_format, which is not among the rewards"):
        resolve_rewards(stray.rewards, stray.reward_kwargs)  # the CLI's own kwargs for a reward not run: an error


def test_env_overrides_recipe_and_cli_overrides_env(monkeypatch):
    monkeypatch.setenv("MODEL", "/models/from-env")
    monkeypatch.setenv("OUTPUT_DIR", "/runs/from-env")
    _, grpo, model = parse_args(["--config", SMOKE])
    assert model.model_name_or_path == "/models/from-env" and grpo.output_dir == "/runs/from-env"
    _, _, model = parse_args(["--config", SMOKE, "--model_name_or_path", "/models/cli"])
    assert model.model_name_or_path == "/models/cli"


# --- input mistakes: one line each, before anything loads -------------------------------------------------------

MINIMAL = "model_name_or_path: tiny\nmax_steps: 2\n"
# (case, recipe text or None for no file, flags after --config, the error line, whether suzak.sft runs it too: one
# parser reads both commands' recipes, so SFT runs the key, flag and pixel cases, not every one)
CLI_MISTAKES = [
    ("recipe_key_typo", MINIMAL + "lerning_rate: 1.0e-4\n", [],
     "recipe {recipe} line 3: unknown key 'lerning_rate' (did you mean learning_rate?)", True),
    ("flag_typo", MINIMAL, ["--lerning_rate", "1e-4"], "unknown flag --lerning_rate (did you mean --learning_rate?)",
     True),
    ("missing_recipe", None, [], "recipe {recipe}: no such file", False),
    ("malformed_yaml", MINIMAL + "  max_pixels: 50176\n", [],
     "recipe {recipe} line 3 column 13: malformed YAML (mapping values are not allowed here)", False),
    ("num_generations", MINIMAL + "num_generations: 3\nper_device_train_batch_size: 8\n", [],
     "num_generations 3 does not divide the generation batch of 8 completions (per_device_train_batch_size 8 x 1 "
     "process(es) x 1 step(s) per generation): make the batch a multiple of 3 (e.g. per_device_train_batch_size 9), "
     "or num_generations a divisor of 8 (e.g. 4)", False),
    ("max_pixels_below_one_token", MINIMAL, ["--max_pixels", "500", "--min_pixels", "100"],
     "max_pixels 500 is below one visual token (28x28 = 784 pixels): set max_pixels to at least 784 (default 401408)",
     True),
]  # fmt: skip


def _assert_one_error_line(result: subprocess.CompletedProcess, expected: str) -> None:
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "loaded " not in result.stderr  # no traceback, no model loaded
    assert [line for line in result.stderr.splitlines() if line.strip()] == [f"error: {expected}"], result.stderr


@pytest.mark.parametrize(("recipe_text", "flags", "expected", "sft"), [c[1:] for c in CLI_MISTAKES],
                         ids=[c[0] for c in CLI_MISTAKES])  # fmt: skip
def test_input_mistakes_are_one_line_from_the_command_line(tmp_path, run_env, recipe_text, flags, expected, sft):
    """python -m suzak.train and python -m suzak.sft (run side by side): exit 1, one ``error:`` line naming the key or
    flag and the closest valid name, nothing loaded."""
    recipe = tmp_path / "recipe.yaml"
    if recipe_text is not None:
        recipe.write_text(recipe_text)
    commands = ["suzak.train"] + (["suzak.sft"] if sft else [])
    runs = [subprocess.Popen([sys.executable, "-m", module, "--config", str(recipe), *flags], cwd=ROOT, env=run_env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for module in commands]  # fmt: skip
    for run in runs:
        stdout, stderr = run.communicate(timeout=300)
        _assert_one_error_line(subprocess.CompletedProcess(run.args, run.returncode, stdout, stderr),
                               expected.format(recipe=recipe))  # fmt: skip


@pytest.mark.parametrize(
    ("recipe_text", "flags", "message"),
    [
        (MINIMAL + "max_steps: 3\n", [], r"recipe \S+ line 3: key 'max_steps' is set twice \(first on line 2\)"),
        ("", [], r"recipe \S+ is empty"),
        ("- max_steps\n", [], r"recipe \S+ must be a mapping of `field: value` lines, not a list"),
        (MINIMAL, ["--max_step", "3"], r"unknown flag --max_step \(did you mean --max_steps\?\)"),
        (MINIMAL, ["--max_steps", "three"], r"argument --max_steps/--max-steps: invalid int value: 'three'"),
        (MINIMAL, ["--max_steps", "3", "4"], r"unexpected value '4' on the command line"),
        (MINIMAL, ["--config", "other.yaml"], r"--config is given twice"),
        (MINIMAL, ["--num_generations", "4", "--generation_batch_size", "6"],
         r"num_generations 4 does not divide the generation batch of 6 completions \(set by generation_batch_size\): "
         r"make the batch a multiple of 4 \(e.g. generation_batch_size 8\), "
         r"or num_generations a divisor of 6 \(e.g. 3\)"),
        (MINIMAL, ["--num_generations", "1"], r"invalid settings: GRPO requires at least 2 generations per prompt"),
        (MINIMAL, ["--load_best_model_at_end", "true", "--eval_strategy", "epoch"],
         r"invalid settings: --load_best_model_at_end requires the save and eval strategy to match"),
        (MINIMAL, ["--max_pixels", "784", "--min_pixels", "0"], r"min_pixels 0 must be at least 1"),
        (MINIMAL, ["--sampler_check_steps", "-1"], r"sampler_check_steps -1: give a number of steps, or 0"),
        (MINIMAL, ["--sampler_logp_tolerance", "0"], r"sampler_logp_tolerance 0.0 must be > 0"),
        pytest.param(MINIMAL, ["--use_vllm", "true", "--vllm_mode", "server"],
                     r"vllm_mode server needs a CUDA GPU: TRL syncs the weights to `trl vllm-serve` over NCCL",
                     marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU can run server mode")),
    ],
)  # fmt: skip
def test_recipe_and_flag_mistakes_are_one_line(tmp_path, recipe_text, flags, message):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(recipe_text)
    with pytest.raises(SuzakError, match=message):
        parse_args(["--config", str(recipe), *flags])


def test_config_equals_form_and_exact_flags(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(MINIMAL + "env: {SUZAK_TEST_RECIPE_ENV: set}\n")
    argv = [f"--config={recipe}", "--max_steps=5", "--max-pixels", "784", "--min_pixels", "1"]
    suzak_args, grpo, _ = parse_args(argv)
    assert (grpo.max_steps, suzak_args.max_pixels, suzak_args.min_pixels) == (5, 784, 1)  # 784 pixels: one token
    assert os.environ.pop("SUZAK_TEST_RECIPE_ENV") == "set"  # TrlParser's env mapping still applies


@pytest.mark.parametrize("recipe", ["clevr_qwen2.5vl_7b.yaml", "clevr_qwen2.5vl_3b.yaml", "clevr_qwen2vl_2b.yaml",
                                    "clevr_qwen3vl_2b.yaml"])  # fmt: skip
def test_h100_recipes_parse(recipe):
    suzak_args, grpo, model = parse_args(["--config", str(ROOT / "recipes" / recipe)])
    assert model.model_name_or_path.startswith(("Qwen/Qwen2.5-VL-", "Qwen/Qwen2-VL-", "Qwen/Qwen3-VL-"))
    assert suzak_args.max_pixels == 401408 and suzak_args.prompt_template == "r1v"
    assert suzak_args.dataset_name == "clevr_cogen" and suzak_args.rewards == ["clevr_count", "think_format"]
    assert (grpo.num_generations, grpo.learning_rate, grpo.beta) == (8, 1e-6, 0.04)


# min/max pixels the families' Hub checkpoints' processor configs ship (vLLM resizes into them).
HUB_PROCESSOR_BOUNDS = {"qwen2_vl": (3136, 12845056), "qwen2_5_vl": (3136, 12845056), "qwen3_vl": (65536, 16777216)}
# R1-V's published runs as recipes: (recipe, model, dataset, rewards, (steps, epochs), pixels, published numbers in the
# header, the per-step settings R1-V ran with: gradient accumulation, completion tokens)
R1V_RUNS = [
    ("clevr_qwen2vl_2b.yaml", "Qwen/Qwen2-VL-2B-Instruct", "clevr_cogen", ["clevr_count", "think_format"], (100, None),
     (3136, 401408), ["48.0 (96/200) -> 82.5 (165/200)"], (2, 256)),
    ("geoqa_qwen2.5vl_3b.yaml", "Qwen/Qwen2.5-VL-3B-Instruct", "geoqa_r1v", ["math_accuracy", "think_format"],
     (-1, 1.0), (3136, 501760), ["35.41 (267/754) -> 47.48 (358/754)", "1 epoch"], (4, 2048)),
    ("clevr_qwen3vl_2b.yaml", "Qwen/Qwen3-VL-2B-Instruct", "clevr_cogen", ["clevr_count", "think_format"], (100, None),
     (65536, 401408), ["Published: none for Qwen3-VL", "48.0 -> 82.5"], (2, 512)),
]  # fmt: skip


@pytest.mark.parametrize(("recipe", "model_name", "dataset", "rewards", "length", "pixels", "published", "per_step"),
                         R1V_RUNS, ids=[r[0] for r in R1V_RUNS])  # fmt: skip
def test_r1v_run_recipes(recipe, model_name, dataset, rewards, length, pixels, published, per_step):
    from transformers import AutoConfig

    from suzak.media.vision import PixelBudget

    path = ROOT / "recipes" / recipe
    suzak_args, grpo, model = parse_args(["--config", str(path)])
    assert (model.model_name_or_path, suzak_args.dataset_name, suzak_args.rewards) == (model_name, dataset, rewards)
    assert grpo.max_steps == length[0] and (length[1] is None or grpo.num_train_epochs == length[1])
    assert (suzak_args.min_pixels, suzak_args.max_pixels) == pixels and suzak_args.prompt_template == "r1v"
    assert (grpo.num_generations, grpo.per_device_train_batch_size, grpo.learning_rate, grpo.beta) == (8, 8, 1e-6, 0.04)
    assert (grpo.gradient_accumulation_steps, grpo.max_completion_length) == per_step
    header = "".join(line for line in path.read_text().splitlines(keepends=True) if line.startswith("#"))
    assert all(text in header for text in published)
    # The budget on the model's own patch grid (transformers' config of its family), inside the bounds its
    # checkpoints' processor ships (3136..12845056 for Qwen2/2.5-VL, 65536..16777216 for Qwen3-VL): vLLM agrees.
    model_type = {"Qwen2-VL": "qwen2_vl", "Qwen2.5-VL": "qwen2_5_vl", "Qwen3-VL": "qwen3_vl"}[model_name[5:-12]]
    budget = PixelBudget(*pixels).for_model(AutoConfig.for_model(model_type))
    assert budget.factor == (32 if model_type == "qwen3_vl" else 28)
    assert budget.within(*HUB_PROCESSOR_BOUNDS[model_type])  # so check_vllm_bounds lets use_vllm run


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


def test_a_missing_relative_folder_with_one_slash_names_the_folder(tmp_path, monkeypatch):
    """``models/qwen3`` (no such folder, but ``models/`` exists) is read as a Hub id: the line says why."""
    from trl import ModelConfig

    from suzak.models.loading import load_model_and_processor

    (tmp_path / "models").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(SuzakError) as error:
        load_model_and_processor(ModelConfig(model_name_or_path="models/qwen3"), None)
    message = str(error.value)
    assert message.startswith("cannot load model 'models/qwen3':") and "\n" not in message
    assert "no folder 'models/qwen3' here" in message and "'models/' is one" in message
    assert "./models/qwen3" in message


EMPTY_SAFETENSORS = struct.pack("<Q", 2) + b"{}"  # a valid safetensors file of 10 bytes: header length, no tensors


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (lambda root: root / "models" / "absent", "no such folder (check model_name_or_path, or MODEL in .env)"),
        (lambda root: root, "the folder is empty (an unfinished download or copy?)"),
        (lambda root: (root / "README.md").write_text("x") and root,
         "the folder has no config.json (it holds README.md)"),
        (lambda root: (root / "config.json").write_text("{}") and root, "the folder has config.json but no weights"),
        (lambda root: (root / "model.bin").write_text("x") and root / "model.bin", "it is a file, not a model folder"),
    ],
    ids=["missing", "empty", "no-config", "no-weights", "a-file"],
)  # fmt: skip
def test_a_local_model_folder_is_named_not_sent_to_the_hub(tmp_path, make, problem):
    from trl import ModelConfig

    from suzak.models.loading import load_model_and_processor

    path = str(make(tmp_path))
    with pytest.raises(SuzakError) as error:
        load_model_and_processor(ModelConfig(model_name_or_path=path), None)
    assert str(error.value).startswith(f"cannot load model {path!r}: {problem}")
    assert "hf download" not in str(error.value) and "Hub" not in str(error.value)


def _checkpoint(root: Path, step: int, state: str = "{}", weights: bool = True) -> Path:
    folder = root / f"checkpoint-{step}"
    folder.mkdir()
    (folder / "trainer_state.json").write_text(state)
    if weights:
        (folder / "model.safetensors").write_bytes(EMPTY_SAFETENSORS)
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
    from suzak.runs.checkpoints import MARKER, SENTINEL, mark_complete

    mark_complete(_checkpoint(tmp_path, 1))
    truncated = mark_complete(_checkpoint(tmp_path, 2)).parent
    (truncated / "model.safetensors").write_bytes(b"x" * 3)  # damaged after it was written
    overwriting = mark_complete(_checkpoint(tmp_path, 3)).parent
    (overwriting / SENTINEL).write_text("")  # an older suzak saving in place into it again, killed
    (overwriting / MARKER).unlink()
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
    assert f"output {out}" in result.stdout
    assert f"checkpoints: 1 (newest {out}/checkpoint-2)   final model + processor: {out}" in result.stdout
    assert "reward pre-flight passed" in result.stderr
    assert last_trainer_state(out)["global_step"] == 2
    model = AutoModelForImageTextToText.from_pretrained(out)
    processor = AutoProcessor.from_pretrained(out)
    assert type(model).__name__ == "Qwen2_5_VLForConditionalGeneration"
    assert processor.image_processor.size["longest_edge"] == 50176  # the recipe's budget travels with the model


@pytest.mark.slow
def test_resume_from_latest_checkpoint(tmp_path, run_env):
    out = tmp_path / "resume"
    base = [
        sys.executable,
        "-m",
        "suzak.train",
        "--config",
        SMOKE,
        "--output_dir",
        str(out),
        "--save_steps",
        "1",
        "--lr_scheduler_type",
        "constant",
    ]  # a longer constant schedule: max_steps may change on resume
    run_ok(base + ["--max_steps", "2"], run_env)
    result = run_ok(base + ["--max_steps", "3", "--resume_from_checkpoint", "latest"], run_env)
    assert f"resuming from {out / 'checkpoint-2'}" in result.stderr
    assert last_trainer_state(out)["global_step"] == 3


@pytest.mark.slow
def test_torchrun_two_processes_gloo(tmp_path, run_env):
    """Two ranks, each with one group of 4, and dynamic sampling on: the ranks run the same refill rounds (decided
    from the rewards TRL gathers; a rank doing another would hang the other's next collective). The tiny model's
    cache starts empty, so both ranks build it at once (rank 1's build once left a folder without config.json)."""
    out = tmp_path / "ddp"
    env = {**run_env, "SUZAK_CACHE": str(tmp_path / "cache")}
    run_ok([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "suzak.train", "--config",
          SMOKE, "--max_steps", "2", "--per_device_train_batch_size", "4", "--output_dir", str(out),
          "--dynamic_sampling", "true", "--dynamic_sampling_max_rounds", "1"], env, timeout=600)  # fmt: skip
    assert last_trainer_state(out)["global_step"] == 2
    with open(out / "metrics.csv", newline="") as file:
        rows = [row for row in csv.DictReader(file) if row.get("dynamic_sampling/extra_rounds")]
    assert len(rows) == 2 and all(0 <= float(row["dynamic_sampling/kept_groups"]) <= 2 for row in rows)
    assert all(float(r["dynamic_sampling/kept_groups"]) == 2 or float(r["dynamic_sampling/extra_rounds"]) == 1
               for r in rows)  # fmt: skip


@pytest.mark.slow
def test_deepspeed_zero2_on_cpu(tmp_path, run_env):
    out = tmp_path / "zero2"
    run_ok([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1", "-m", "suzak.train", "--config",
          SMOKE, "--max_steps", "2", "--deepspeed", "ds_configs/zero2.json", "--output_dir", str(out)], run_env)  # fmt: skip
    assert last_trainer_state(out)["global_step"] == 2
    assert any((out / "checkpoint-2").glob("global_step*"))
    assert checkpoint_problem(out / "checkpoint-2") is None  # ZeRO shards are whole torch archives


def test_tiny_cache_is_keyed_by_family_and_builder_and_built_whole(tmp_path, monkeypatch):
    import json

    from suzak import SuzakError
    from suzak.models.loading import resolve_model_path, tiny_model_cache

    monkeypatch.setenv("SUZAK_CACHE", str(tmp_path))
    path = Path(resolve_model_path("tiny"))
    assert path == tiny_model_cache() == tiny_model_cache("qwen2_5_vl") and (path / "config.json").is_file()
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no scratch folder left behind
    assert path.name.startswith("tiny-qwen2_5_vl-") and len(path.name) == len("tiny-qwen2_5_vl-") + 10
    other = Path(resolve_model_path("tiny:qwen3_vl"))
    assert other == tiny_model_cache("qwen3_vl") != path and other.name.endswith(path.name[-10:])  # same builder
    assert json.loads((other / "config.json").read_text())["model_type"] == "qwen3_vl"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([path.name, other.name])
    assert resolve_model_path("Qwen/Qwen2.5-VL-7B-Instruct") == "Qwen/Qwen2.5-VL-7B-Instruct"
    with pytest.raises(SuzakError, match=r"no tiny model of family 'qwen4_vl'; the tiny families are tiny:qwen2_vl"):
        resolve_model_path("tiny:qwen4_vl")


def test_a_rank_other_than_0_builds_the_tiny_model_whole(tmp_path, monkeypatch):
    """Under torch.distributed transformers saves weights and config on rank 0 only: a rank 1 that builds the tiny
    model (here: a one-process gloo group whose rank reads 1) must still leave a whole folder in the cache."""
    import socket

    import torch.distributed as dist
    import transformers.distributed.utils as transformers_distributed

    from suzak.models.loading import resolve_model_path

    monkeypatch.setenv("SUZAK_CACHE", str(tmp_path))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        monkeypatch.setattr(transformers_distributed.torch.distributed, "get_rank", lambda *a, **k: 1)
        path = Path(resolve_model_path("tiny"))
    finally:
        monkeypatch.undo()
        dist.destroy_process_group()
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in path.iterdir()}


def test_recipe_dataset_options_stay_with_the_recipe_dataset(monkeypatch, caplog):
    """The smoke recipe's options are for gsm8k_synthetic: another dataset (flag or DATASET) does not inherit them."""
    recipe = ["--config", "recipes/gsm8k_smoke.yaml"]
    assert parse_args(recipe)[0].dataset_options  # the recipe's own dataset: its options apply
    with caplog.at_level("INFO", logger="suzak.training.configs"):
        other = parse_args([*recipe, "--dataset_name", "tests/fixtures/gsm8k_tiny.jsonl"])[0]
    assert other.dataset_options is None and "the recipe's dataset_options" in caplog.text
    monkeypatch.setenv("DATASET", "tests/fixtures/gsm8k_tiny.jsonl")
    assert parse_args(recipe)[0].dataset_options is None
    given = parse_args([*recipe, "--dataset_options", '{"template": "gsm8k_think"}'])[0]
    assert given.dataset_options == {"template": "gsm8k_think"}  # options given with the new dataset apply


def test_suzak_arguments_docstring_lists_every_field_under_its_heading_in_order():
    """SuzakArguments is grouped as TRL's GRPOConfig is: its docstring's "> Parameters that control ..." headings name
    every field, in the order ``--help`` lists them."""
    import dataclasses
    import re

    from suzak.training.configs import SuzakArguments

    named = re.findall(r"``(\w+)``", SuzakArguments.__doc__.split("> Parameters", 1)[1])
    assert named == [f.name for f in dataclasses.fields(SuzakArguments)]


@pytest.mark.parametrize(("flags", "said"), [
    (["--eval_rows", "8"], "eval_rows needs eval_steps: how often to generate the held-out answers"),
    (["--eval_rows", "8", "--eval_strategy", "steps", "--eval_steps", "0.25"], "eval_steps 0.25 is a share of the run"),
])  # fmt: skip
def test_held_out_rows_without_a_whole_eval_cadence_stop_before_the_model_loads(flags, said):
    """Checked by the parser, before any weight loads (issue 51: after the weights, and a raw error for a ratio)."""
    with pytest.raises(SuzakError, match=f"^{re.escape(said)}"):
        parse_args(["--config", SMOKE, *flags])
