"""GSM8K and SFT paths as a user runs them: SFT warm start -> GRPO, both rewards logged, eval-by-generation callback."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

from conftest import last_trainer_state, run_ok
from suzak.rewards import REWARDS
from suzak.sft import sft_completion

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("template", ["gsm8k", "gsm8k_think"])
def test_gsm8k_sft_targets_score_full_marks(gsm8k_jsonl, template):
    from suzak.data.builders import gsm8k
    from suzak.prompts import get_template

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


@pytest.mark.parametrize("recipe", sorted(p.name for p in (ROOT / "recipes").glob("*.yaml")))
def test_every_recipe_parses(recipe):
    from suzak.configs import parse_args, parse_sft_args

    parse = parse_sft_args if recipe.startswith("sft_") else parse_args
    suzak_args, args, model = parse(["--config", str(ROOT / "recipes" / recipe)])
    assert model.model_name_or_path and suzak_args.rewards
    assert suzak_args.eval_rows == 0 or args.eval_steps  # an eval sample needs a cadence
