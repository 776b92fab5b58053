"""GSM8K and SFT paths as a user runs them: SFT warm start -> GRPO, both rewards logged, eval-by-generation callback."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest

from conftest import last_trainer_state, run_ok
from suzak import SuzakError
from suzak.scoring.rewards import REWARDS
from suzak.sft import sft_completion

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("template", ["gsm8k", "gsm8k_think"])
def test_gsm8k_sft_targets_score_full_marks(gsm8k_jsonl, template):
    from suzak.data.builders import gsm8k
    from suzak.scoring.prompts import get_template

    answer_format = get_template(template).answer_format
    for row in gsm8k(path=str(gsm8k_jsonl), template=template):
        target = sft_completion(row, answer_format)
        assert "<<" not in target and ">>" not in target  # calculator spans removed
        assert REWARDS["gsm8k_accuracy"]([target], solution=[row["solution"]]) == [1.0]
        style = "hash" if answer_format == "gsm8k_hash" else "think"
        assert REWARDS["gsm8k_format"]([target], style=style) == [1.0]


def test_clevr_sft_targets_think_then_answer():
    from suzak.data.builders import clevr_synthetic

    for row in clevr_synthetic(4, seed=2, progress=False):
        target = sft_completion(row, "think_answer")
        assert target.startswith("<think> There is") and target.endswith(f"<answer> {row['count']} </answer>")
        assert REWARDS["clevr_count"]([target], solution=[row["solution"]]) == [1.0]
        assert REWARDS["think_format"]([target]) == [1.0]


def test_sft_smoke_then_grpo_gsm8k_from_it(tmp_path, run_env):
    sft_out, grpo_out, my_jsonl = tmp_path / "sft", tmp_path / "grpo", tmp_path / "my.jsonl"
    run_ok([sys.executable, "-m", "suzak.data", "gsm8k_synthetic", "--num_rows", "40", "--seed", "7", "--format", "jsonl",
          "--output", str(my_jsonl)], run_env)  # fmt: skip
    run_ok(
        ["bash", "src/scripts/run_sft.sh", "--preset", "smoke", "--output_dir", str(sft_out), "--eval_rows", "0"],
        run_env,
    )
    losses = [log["loss"] for log in last_trainer_state(sft_out)["log_history"] if "loss" in log]
    assert len(losses) == 20 and sum(losses[-3:]) / 3 < 0.7 * sum(losses[:3]) / 3  # it learns its training rows
    assert (sft_out / "model.safetensors").is_file() and (sft_out / "tokenizer.json").is_file()

    run_ok(["bash", "src/scripts/run_grpo_gsm8k.sh", "--preset", "smoke", "--model_name_or_path", str(sft_out),
          "--dataset_name", str(my_jsonl), "--output_dir", str(grpo_out)], run_env)  # fmt: skip
    history = last_trainer_state(grpo_out)["log_history"]
    step_logs = [log for log in history if "reward" in log]
    assert len(step_logs) == 4
    assert all("rewards/gsm8k_accuracy/mean" in log and "rewards/gsm8k_format/mean" in log for log in step_logs)

    # the eval callback's logged accuracy is the one its own CSV rows give
    with (grpo_out / "eval_samples.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    logged = {log["step"]: log["eval/accuracy"] for log in history if "eval/accuracy" in log}
    assert sorted(logged) == [0, 2, 4]  # step 0: the baseline before training
    for step, accuracy in logged.items():
        mine = [r for r in rows if int(r["step"]) == step]
        assert len(mine) == 8  # the recipe's eval_rows, held out of the 40-row file
        assert accuracy == pytest.approx(sum(r["correct"] == "True" for r in mine) / len(mine))
    assert len({log["step"] for log in history if "reward" in log}) == 4  # one log line per step, no collisions


@pytest.mark.slow
def test_clevr_sft_smoke_starts_clevr_grpo(tmp_path, run_env):
    from transformers import AutoModelForImageTextToText

    sft_out = tmp_path / "sft-clevr"
    run_ok(
        [sys.executable, "-m", "suzak.sft", "--config", "recipes/sft_clevr_smoke.yaml", "--output_dir", str(sft_out)],
        run_env,
    )
    history = last_trainer_state(sft_out)["log_history"]
    losses = [log["loss"] for log in history if "loss" in log]
    assert losses[-1] < losses[0]
    assert sorted(log["step"] for log in history if "eval/accuracy" in log) == [0, 4, 8]  # image prompts evaluated
    assert type(AutoModelForImageTextToText.from_pretrained(sft_out)).__name__ == "Qwen2_5_VLForConditionalGeneration"
    run_ok(["bash", "src/scripts/run_grpo_clevr.sh", "--preset", "smoke", "--model_name_or_path", str(sft_out),
          "--max_steps", "2", "--output_dir", str(tmp_path / "grpo")], run_env)  # fmt: skip


# --- on a text-only model (a user's Qwen2.5-1.5B-Instruct or Qwen3; here their tiny stand-ins) -----------------------


def test_gsm8k_grpo_on_a_text_model_trains_and_saves(family_model_dir, tmp_path, run_env):
    """The command of the report that GRPO on a text model died at step 1 (``processing_class.tokenizer``: a text
    model's processing class is its tokenizer), with a local folder of a plain ``Qwen2ForCausalLM``."""
    out = tmp_path / "out"
    run_ok([sys.executable, "-m", "suzak.train", "--config", "recipes/gsm8k_smoke.yaml", "--model_name_or_path",
            str(family_model_dir("qwen2_5_text")), "--max_steps", "2", "--save_strategy", "no", "--bf16", "false",
            "--output_dir", str(out)], run_env)  # fmt: skip
    with (out / "metrics.csv").open() as handle:
        assert [int(r["step"]) for r in csv.DictReader(handle) if r.get("loss")] == [1, 2]
    assert json.loads((out / "config.json").read_text())["architectures"] == ["Qwen2ForCausalLM"]
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    assert not (out / "processor_config.json").exists()  # a tokenizer, as loaded


@pytest.mark.slow
def test_text_model_grpo_resume_sft_lora_eval_and_release(tmp_path, run_env):
    """What a user runs on a text model, end to end: GSM8K GRPO through the launch script on tiny Qwen3 (dr_grpo,
    num_iterations 2, held-out accuracy), stopped after step 2 and resumed with ``latest``; an SFT warm start of tiny
    Qwen2.5, GRPO with LoRA from it, the adapter merged, evaluated and released."""
    grpo = tmp_path / "grpo"
    flags = ["bash", "src/scripts/run_grpo_gsm8k.sh", "--preset", "smoke", "--model_name_or_path", "tiny:qwen3_text",
             "--loss_type", "dr_grpo", "--num_iterations", "2", "--save_steps", "2", "--lr_scheduler_type", "constant",
             "--output_dir", str(grpo)]  # fmt: skip
    run_ok(flags + ["--max_steps", "2"], run_env)
    result = run_ok(flags + ["--max_steps", "4", "--resume_from_checkpoint", "latest", "--resume_override", "true"],
                    run_env)  # fmt: skip
    assert f"resuming from {grpo / 'checkpoint-2'}" in result.stderr
    state = last_trainer_state(grpo)
    assert state["global_step"] == 4 and [log["step"] for log in state["log_history"] if "loss" in log] == [1, 2, 3, 4]
    assert sorted(log["step"] for log in state["log_history"] if "eval/accuracy" in log) == [0, 2, 4]
    assert json.loads((grpo / "config.json").read_text())["architectures"] == ["Qwen3ForCausalLM"]

    sft, lora = tmp_path / "sft", tmp_path / "lora"
    run_ok(["bash", "src/scripts/run_sft.sh", "--preset", "smoke", "--model_name_or_path", "tiny:qwen2_5_text",
            "--max_steps", "4", "--save_strategy", "no", "--eval_rows", "0", "--output_dir", str(sft)], run_env)  # fmt: skip
    run_ok(["bash", "src/scripts/run_grpo_gsm8k.sh", "--preset", "smoke", "--model_name_or_path", str(sft),
            "--use_peft", "true", "--lora_r", "4", "--lora_alpha", "8", "--lora_target_modules", "q_proj", "v_proj",
            "--max_steps", "2", "--save_strategy", "no", "--output_dir", str(lora)], run_env)  # fmt: skip
    assert json.loads((lora / "adapter_config.json").read_text())["base_model_name_or_path"] == str(sft)
    result = run_ok([sys.executable, "-m", "suzak", "export", "lora", str(lora)], run_env)
    merged = Path(f"{lora}-merged")
    assert "load with AutoModelForCausalLM" in result.stdout and "suzak.eval gsm8k" in result.stdout
    results = tmp_path / "gsm8k.json"
    run_ok([sys.executable, "-m", "suzak.eval", "gsm8k", "--model_path", str(merged), "--prompt_path",
            str(ROOT / "tests" / "fixtures" / "gsm8k_tiny.jsonl"), "--max_new_tokens", "8", "--output_path",
            str(results), "--no_progress"], run_env)  # fmt: skip
    assert len(json.loads(results.read_text())["results"]) == 4
    run_ok([sys.executable, "-m", "suzak.release", "--checkpoint", str(lora), "--repo_id", "me/tiny-gsm8k",
            "--eval_results", str(results), "--dry_run"], run_env)  # fmt: skip
    card = (lora / "release" / "README.md").read_text()
    assert "pipeline_tag: text-generation" in card and "none (a text model: no images)" in card


@pytest.mark.parametrize("recipe", sorted(p.name for p in (ROOT / "recipes").glob("*.yaml")))
def test_every_recipe_parses(recipe):
    from suzak.training.configs import parse_args, parse_sft_args

    parse = parse_sft_args if recipe.startswith("sft_") else parse_args
    suzak_args, args, model = parse(["--config", str(ROOT / "recipes" / recipe)])
    assert model.model_name_or_path and (suzak_args.rewards or suzak_args.tools)  # an episode: its environment scores
    assert suzak_args.eval_rows == 0 or args.eval_steps  # an eval sample needs a cadence


@pytest.mark.parametrize(("flags", "named"), [
    (["--tools", "zoom"], "tools"),
    (["--tool_max_pixels", "50176"], "tool_max_pixels"),
    (["--dynamic_sampling", "true", "--dynamic_sampling_max_rounds", "2"], "dynamic_sampling, dynamic_sampling_max_rounds"),
])  # fmt: skip
def test_sft_refuses_grpo_only_settings_in_one_line(flags, named):
    """Tools and dynamic sampling shape GRPO's rollouts; SFT has none, and said nothing of them before (issue 51)."""
    from suzak.training.configs import parse_sft_args

    with pytest.raises(SuzakError, match=rf"^{named}: GRPO settings .* that SFT does not use"):
        parse_sft_args(["--config", str(ROOT / "recipes" / "sft_smoke.yaml"), *flags])
