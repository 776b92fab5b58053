"""The trainer of a run built top to bottom (suzak.training.build): each part worked out once, in order, for GRPO and
SFT alike; the held-out eval runs with the budgets the trainer runs with."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def calls(monkeypatch):
    """How often each step of the build ran, in order: the model's config read, the rewards resolved, the rows
    validated, the policy loaded."""
    import suzak.models.loading as loading
    import suzak.scoring.rewards as rewards
    import suzak.training.build as build
    import suzak.training.checks as checks

    seen: list[str] = []

    def counted(module, name, label):
        original = getattr(module, name)

        def wrapper(*args, **kwargs):
            seen.append(label)
            return original(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapper)

    counted(loading, "model_config", "config")
    counted(rewards, "resolve_rewards", "rewards")
    counted(checks, "validate_rows", "validate")
    counted(build, "load_policy", "policy")
    return seen


def _grpo(tmp_path, model_dir, *flags):
    from suzak.training.configs import parse_args

    return parse_args(["--config", str(ROOT / "recipes" / "smoke.yaml"), "--model_name_or_path", str(model_dir),
                       "--output_dir", str(tmp_path / "out"), "--dataset_options", '{"num_rows": 8, "seed": 0}',
                       "--eval_rows", "4", "--eval_steps", "2", "--max_steps", "1", "--save_strategy", "no", *flags])  # fmt: skip


def test_grpo_trainer_works_each_part_out_once_in_order(tiny_model_dir, tmp_path, calls):
    """One config read, one reward resolution, one validation of the rows, then the policy: nothing of it twice.
    The trainer's rewards are those resolved; the held-out eval (first callback) scores with the first of them and
    holds the trainer's own budgets."""
    from suzak.runs.generation_eval import GenerationEvalCallback
    from suzak.training.build import grpo_trainer

    trainer = grpo_trainer(*_grpo(tmp_path, tiny_model_dir))
    assert calls == ["config", "rewards", "validate", "policy"]
    first = trainer.callback_handler.callbacks[0]
    assert isinstance(first, GenerationEvalCallback) and len(first.rows) == 4
    assert first.budget is trainer.pixel_budget and first.budget.factor == 28
    assert first.video_budget is trainer.video_budget and first.video_budget.factor == 28
    assert [f.__name__ for f in trainer.reward_funcs] == ["clevr_count", "think_format"]
    assert first.scorer is trainer.reward_funcs[0]
    assert callable(first.trainer_log)  # the step-0 baseline logs through the Trainer's own log


def test_sft_trainer_works_each_part_out_once_in_order(tiny_model_dir, tmp_path, calls):
    """SFT takes the same path: one config read, rewards, validation, the same policy loader; targets in the
    template's answer format, images on the model's grid, the eval with the budget the images were fitted to."""
    from suzak.training.build import sft_trainer
    from suzak.training.configs import parse_sft_args

    trainer = sft_trainer(*parse_sft_args([
        "--config", str(ROOT / "recipes" / "sft_clevr_smoke.yaml"), "--model_name_or_path", str(tiny_model_dir),
        "--dataset_options", '{"num_rows": 8}', "--eval_rows", "2", "--eval_steps", "1", "--max_steps", "1",
        "--save_strategy", "no", "--output_dir", str(tmp_path / "sft")]))  # fmt: skip
    assert calls == ["config", "rewards", "validate", "policy"]
    row = trainer.train_dataset[0]
    assert row["image"].size[0] % 28 == 0 and "<answer>" in row["completion"][0]["content"]
    first = trainer.callback_handler.callbacks[0]
    assert first.budget.factor == 28
    assert trainer.processing_class.image_processor.size["longest_edge"] == first.budget.max_pixels == 50176


def test_a_bad_row_stops_the_build_before_the_weights_load(tiny_model_dir, tmp_path, calls):
    """A dataset row the rewards cannot read stops the build at validation, one line naming the row; the policy
    is never loaded."""
    from suzak import SuzakError
    from suzak.training.build import grpo_trainer

    bad = tmp_path / "bad.jsonl"
    image = tmp_path / "red.png"
    from PIL import Image

    Image.new("RGB", (56, 56), "red").save(image)
    bad.write_text(f'{{"image": "{image}", "problem": "How many?", "solution": "<answer> 2 </answer>"}}\n'
                   f'{{"image": "{image}", "problem": "How many?", "solution": "<answer> none of them </answer>"}}\n')  # fmt: skip
    with pytest.raises(SuzakError, match=r"line 2, column solution: clevr_count cannot read the gold answer"):
        grpo_trainer(*_grpo(tmp_path, tiny_model_dir, "--dataset_name", str(bad), "--dataset_options", "{}",
                            "--eval_rows", "0"))  # fmt: skip
    assert calls == ["config", "rewards", "validate"]
