"""Faults that show up only mid-run: a reward that raises or returns what TRL cannot use, non-finite rewards, and a
run that trains no step. Each ends in one line naming the reward, the step and the dataset rows (after a checkpoint
of the last completed step, so ``--resume_from_checkpoint latest`` continues), or is handled and counted
(``rewards/<name>/nonfinite_frac``); a run with no optimizer step never exits 0."""

from __future__ import annotations

import asyncio
import csv
import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from suzak import SuzakError
from suzak.runs.checkpoints import MARKER, checkpoint_problem, latest_checkpoint
from suzak.runs.streams import add_run_callbacks
from suzak.scoring.parsing import completion_text
from suzak.training.session import check_trained
from suzak.training.trainer import ROW_COLUMN, number_rows
from suzak.trl_internals.rewards import RewardFault, RewardGuard
from test_trainer import image_dataset, length_reward, make_trainer

ROOT = Path(__file__).resolve().parents[1]
SMOKE = str(ROOT / "recipes" / "smoke.yaml")


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def keyed_dataset():
    """image_dataset's rows (prompt, solution and image all encode key k) with an id column ``index`` = 100 + k."""
    return image_dataset(8).add_column("index", [100 + key for key in range(8)])


# --- the guard around each reward call (no model) -----------------------------------------------------------------


def reward_kwargs(count: int = 4) -> dict:
    """What TRL's ``_calculate_rewards`` passes a reward for ``count`` completions (two prompts, two each)."""
    return {"prompts": [f"q{i // 2}" for i in range(count)], "completions": [f"c{i}" for i in range(count)],
            "completion_ids": [[i] for i in range(count)], "solution": ["3", "3", "many", "many"][:count],
            "trainer_state": None, "log_extra": None, "log_metric": None}  # fmt: skip


ROWS = ["index 7", "index 7", "index 9", "index 9"]


def parses_solution(completions, solution, **kwargs):
    return [float(int(s)) for s in solution]


def test_a_raising_reward_is_recorded_with_the_rows_it_fails_on_alone():
    logged = []
    guard = RewardGuard(ROWS)
    wrapped = guard.wrap(parses_solution, "parses_solution")
    assert wrapped(**reward_kwargs() | {"log_metric": lambda *a: logged.append(a)}) == [None] * 4
    [failure] = guard.failures
    assert failure.message("step 3") == (
        "reward 'parses_solution' raised ValueError at step 3 (dataset row: index 9): invalid literal for int() "
        "with base 10: 'many'"
    )
    assert isinstance(guard.errors[0], ValueError) and logged == []  # the reward's own log calls are not repeated


def test_a_reward_that_fails_only_on_the_whole_batch_names_the_batch():
    def one_at_a_time(completions, **kwargs):
        if len(completions) > 1:
            raise RuntimeError("rate limited:\n  4 requests")
        return [1.0]

    guard = RewardGuard(ROWS)
    guard.wrap(one_at_a_time, "one_at_a_time")(**reward_kwargs())
    assert guard.failures[0].message("step 1") == (
        "reward 'one_at_a_time' raised RuntimeError at step 1 (a batch of dataset rows: index 7, index 9): "
        "rate limited: 4 requests"
    )


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([1.0, 0.0, 1.0], "returned 3 values for 4 completions at step 2 (a batch of dataset rows: index 7, index 9)"),
        ([1.0, 0.0, "1", 0.0], "returned '1' (str), not a number or None at step 2 (dataset row: index 9)"),
        (0.5, "returned a float, not 4 values at step 2 (a batch of dataset rows: index 7, index 9)"),
    ],
)
def test_output_trl_cannot_use_is_recorded(values, expected):
    guard = RewardGuard(ROWS)
    assert guard.wrap(lambda **kwargs: values, "odd")(**reward_kwargs()) == [None] * 4
    assert guard.failures[0].message("step 2") == f"reward 'odd' {expected}"


def test_non_finite_values_are_noted_and_passed_on():
    values = [1.0, math.nan, None, -math.inf]
    guard = RewardGuard(ROWS)
    assert guard.wrap(lambda **kwargs: values, "odd")(**reward_kwargs()) == values
    assert guard.nonfinite == {"odd": [1, 3]} and guard.failures == []


def test_async_rewards_stay_async_and_are_guarded():
    async def judge(completions, **kwargs):
        raise TimeoutError("judge did not answer")

    from trl.trainer.utils import is_async_callable

    guard = RewardGuard(ROWS)
    wrapped = guard.wrap(judge, "judge")
    assert is_async_callable(wrapped)
    assert asyncio.run(wrapped(**reward_kwargs())) == [None] * 4
    assert guard.failures[0].message("step 1").startswith("reward 'judge' raised TimeoutError at step 1 (a batch of")


def test_rows_are_numbered_only_where_no_column_names_them():
    assert number_rows(keyed_dataset()).column_names == keyed_dataset().column_names
    numbered = number_rows(image_dataset(3))
    assert numbered[2][ROW_COLUMN] == 2 and number_rows(numbered) is numbered


# --- in training ---------------------------------------------------------------------------------------------------


def fails_on_key_5(completions, solution, trainer_state, **kwargs):
    """Raises for the row whose gold is 5, from the third step on (the first epoch may or may not meet it earlier)."""
    if trainer_state.global_step >= 2 and any(s == "<answer> 5 </answer>" for s in solution):
        raise ValueError("no such scene")
    return [float(len(c[0]["content"])) for c in completions]


def test_a_reward_raising_in_training_stops_after_a_checkpoint_and_resume_continues(tiny_model_dir, tmp_path):
    trainer = make_trainer(tiny_model_dir, tmp_path, keyed_dataset(), [fails_on_key_5], max_steps=8,
                           save_strategy="steps", save_steps=100)  # fmt: skip
    add_run_callbacks(trainer)
    with pytest.raises(RewardFault) as caught:
        trainer.train()
    done = trainer.state.global_step
    out = Path(trainer.args.output_dir)
    assert done >= 2 and str(caught.value) == (
        f"reward 'fails_on_key_5' raised ValueError at step {done + 1} (dataset row: index 105): no such scene. "
        f"{out / f'checkpoint-{done}'} holds the {done} completed step(s): fix the cause, then rerun with "
        "--resume_from_checkpoint latest"
    )
    assert isinstance(caught.value.__cause__, ValueError)
    checkpoint = out / f"checkpoint-{done}"
    assert checkpoint_problem(checkpoint) is None and (checkpoint / MARKER).is_file()
    saved = load_file(checkpoint / "model.safetensors")
    assert all(torch.equal(saved[name], p.detach()) for name, p in trainer.model.named_parameters() if name in saved)
    assert latest_checkpoint(out) == str(checkpoint)

    resumed = make_trainer(tiny_model_dir, tmp_path, keyed_dataset(), [length_reward], max_steps=8,
                           save_strategy="steps", save_steps=100)  # fmt: skip
    add_run_callbacks(resumed)
    resumed.train(resume_from_checkpoint=latest_checkpoint(out))
    assert resumed.state.global_step == 8
    assert [r["step"] for r in read_csv(out / "metrics.csv") if r["loss"]] == [str(s) for s in range(1, 9)]


def nan_for_odd(completions, **kwargs):
    return [math.nan if i % 2 else float(len(c[0]["content"])) for i, c in enumerate(completions)]


def inf_for_first(completions, **kwargs):
    return [math.inf if i == 0 else 1.0 for i in range(len(completions))]


def test_non_finite_rewards_are_counted_in_metrics_csv(tiny_model_dir, tmp_path, caplog):
    trainer = make_trainer(tiny_model_dir, tmp_path, keyed_dataset(), [nan_for_odd, inf_for_first, length_reward])
    add_run_callbacks(trainer)
    with caplog.at_level("WARNING", logger="suzak.trl_internals"):
        trainer.train()
    rows = [r for r in read_csv(Path(trainer.args.output_dir) / "metrics.csv") if r["loss"]]
    assert [r["step"] for r in rows] == ["1", "2"] and all(math.isfinite(float(r["loss"])) for r in rows)
    for row in rows:  # 4 completions a step
        assert float(row["rewards/nan_for_odd/nonfinite_frac"]) == 0.5
        assert float(row["rewards/inf_for_first/nonfinite_frac"]) == 0.25
        assert float(row["rewards/length_reward/nonfinite_frac"]) == 0.0
        assert math.isfinite(float(row["rewards/inf_for_first/mean"]))  # inf is skipped like None, not averaged in
    said = [r.getMessage() for r in caplog.records if "nan or inf" in r.getMessage()]
    assert len(said) == 2 and "reward 'nan_for_odd' returned nan or inf for 2 of 4 completions at step 1" in said[0]


@pytest.mark.parametrize(
    ("value", "weights"), [(math.nan, None), (None, None), (math.inf, None), (math.nan, [1.0, 0.0])]
)
def test_a_step_no_reward_scores_is_an_error(tiny_model_dir, tmp_path, value, weights):
    def scores_nothing(completions, **kwargs):
        return [value] * len(completions)

    rewards = [scores_nothing] if weights is None else [scores_nothing, length_reward]
    trainer = make_trainer(tiny_model_dir, tmp_path, keyed_dataset(), rewards, reward_weights=weights)
    with pytest.raises(RewardFault) as caught:
        trainer.train()
    assert str(caught.value) == (
        "no reward scored any completion at step 1: 'scores_nothing' gave None, nan or inf for all 4 completions, "
        "so the step would train on nothing (loss 0). No step had completed, so there is no checkpoint"
    )
    assert trainer.state.global_step == 0


# --- a run that trains nothing --------------------------------------------------------------------------------------


def test_a_run_that_made_no_step_is_an_error():
    def trainer(step, max_steps=4, epochs=3.0, rows=1):
        args = SimpleNamespace(max_steps=max_steps, num_train_epochs=epochs, num_generations=4,
                               generation_batch_size=8)  # fmt: skip
        return SimpleNamespace(args=args, state=SimpleNamespace(global_step=step), train_dataset=[{}] * rows)

    check_trained(trainer(1), start_step=0)
    check_trained(trainer(5, max_steps=6), start_step=4)
    with pytest.raises(SuzakError, match=r"^training ran no optimizer step: 1 training row\(s\), max_steps 4, "
                                         r"num_train_epochs 3; a generation batch takes 2 prompts \("):  # fmt: skip
        check_trained(trainer(0), start_step=0)
    with pytest.raises(SuzakError, match="^nothing to train: the run resumed at step 6 and max_steps is 6; raise"):
        check_trained(trainer(6, max_steps=6), start_step=6)


# --- through the command --------------------------------------------------------------------------------------------

FAULTY = """
def explodes_at_step_2(completions, trainer_state=None, **kwargs):
    if trainer_state is not None and trainer_state.global_step == 1:
        raise RuntimeError("scoring service down")
    return [1.0] * len(completions)
"""


def train_command(tiny_model_dir, out: Path, *flags: str) -> list[str]:
    return [sys.executable, "-m", "suzak.train", "--config", SMOKE, "--model_name_or_path", str(tiny_model_dir),
            "--output_dir", str(out), *flags]  # fmt: skip


def with_module_dir(env: dict, folder: Path) -> dict:
    return env | {"PYTHONPATH": os.pathsep.join(p for p in (str(folder), env.get("PYTHONPATH")) if p)}


def test_a_reward_raising_in_training_is_one_line_from_the_command(tiny_model_dir, tmp_path, run_env):
    (tmp_path / "faulty_rewards.py").write_text(FAULTY)
    out = tmp_path / "run"
    command = train_command(tiny_model_dir, out, "--rewards", "faulty_rewards.explodes_at_step_2", "think_format")
    result = subprocess.run(command, cwd=ROOT, env=with_module_dir(run_env, tmp_path), capture_output=True, text=True,
                            timeout=900)  # fmt: skip
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert last.startswith("error: reward 'explodes_at_step_2' raised RuntimeError at step 2 (dataset rows: index ")
    assert last.endswith(f"): scoring service down. {out / 'checkpoint-1'} holds the 1 completed step(s): fix the "
                         "cause, then rerun with --resume_from_checkpoint latest")  # fmt: skip
    assert checkpoint_problem(out / "checkpoint-1") is None and not (out / "model.safetensors").exists()


@pytest.mark.slow
def test_after_a_reward_fault_resume_latest_finishes_the_run(tiny_model_dir, tmp_path, run_env):
    (tmp_path / "faulty_rewards.py").write_text(FAULTY)
    out = tmp_path / "run"
    env = with_module_dir(run_env, tmp_path)
    faulty = train_command(tiny_model_dir, out, "--rewards", "faulty_rewards.explodes_at_step_2", "think_format")
    assert subprocess.run(faulty, cwd=ROOT, env=env, capture_output=True, timeout=900).returncode == 1
    result = subprocess.run(train_command(tiny_model_dir, out, "--resume_from_checkpoint", "latest"), cwd=ROOT,
                            env=env, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"resuming from {out / 'checkpoint-1'}" in result.stderr
    assert checkpoint_problem(out / "checkpoint-4") is None and (out / "model.safetensors").is_file()
    assert [r["step"] for r in read_csv(out / "metrics.csv") if r["loss"]] == ["1", "2", "3", "4"]


def test_a_run_that_trains_no_step_exits_non_zero(tiny_model_dir, tmp_path, run_env):
    out = tmp_path / "run"
    options = '{"num_rows": 1, "seed": 0, "min_objects": 3, "max_objects": 6}'  # one prompt; a step takes two
    result = subprocess.run(train_command(tiny_model_dir, out, "--dataset_options", options), cwd=ROOT, env=run_env,
                            capture_output=True, text=True, timeout=900)  # fmt: skip
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == (
        "error: training ran no optimizer step: 1 training row(s), max_steps 4, num_train_epochs 3; a generation "
        "batch takes 2 prompts (generation_batch_size 8 / num_generations 4); nothing was trained and no model was "
        "saved"
    )
    assert not (out / "model.safetensors").exists()


FAULTY_ON_RANK_1 = """
import os

def explodes_on_rank_1(completions, trainer_state=None, **kwargs):
    if trainer_state is not None and trainer_state.global_step == 1 and os.environ.get("RANK") == "1":
        raise RuntimeError("only rank 1 fails")
    return [1.0] * len(completions)
"""


@pytest.mark.slow
def test_a_reward_raising_on_one_rank_stops_every_rank_after_one_checkpoint(tiny_model_dir, tmp_path, run_env):
    """Without the gather of failures the other rank would wait for rank 1 in TRL's next collective, for ever."""
    (tmp_path / "faulty_rewards.py").write_text(FAULTY_ON_RANK_1)
    out = tmp_path / "ddp"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "suzak.train", "--config",
               SMOKE, "--model_name_or_path", str(tiny_model_dir), "--per_device_train_batch_size", "4",
               "--output_dir", str(out), "--rewards", "faulty_rewards.explodes_on_rank_1", "think_format"]  # fmt: skip
    result = subprocess.run(command, cwd=ROOT, env=with_module_dir(run_env, tmp_path), capture_output=True, text=True,
                            timeout=600)  # fmt: skip
    # each rank's one line; rank 0's progress bar may leave its last frame on the line rank 1's error lands on
    errors = [line[line.index("error: ") :] for line in result.stderr.splitlines() if "error: reward" in line]
    assert result.returncode != 0 and len(errors) == 2, result.stderr[-3000:]
    assert errors[0] == errors[1] and errors[0].startswith(
        "error: reward 'explodes_on_rank_1' raised RuntimeError at step 2 (dataset row: index "  # rank 1's prompt
    )
    assert f"only rank 1 fails. {out / 'checkpoint-1'} holds the 1 completed step(s)" in errors[0]
    assert checkpoint_problem(out / "checkpoint-1") is None


# --- the held-out evaluation calls rewards as training does -------------------------------------------------------


def sees_its_image(prompts, completions, image, trainer_state, **kwargs):
    """A user's reward that looks at the row's picture (as a judge does): 1.0 where the completion names the colour
    of the image's first pixel (image_dataset's red channel is 10 x the row's key)."""
    assert trainer_state is not None and all(isinstance(c, list) for c in completions), completions
    keys = [str(img.getpixel((0, 0))[0] // 10) for img in image]
    return [float(key in completion_text(c)) for key, c in zip(keys, completions, strict=True)]


def test_the_held_out_eval_hands_rewards_what_training_does_images_included(tiny_model_dir, tmp_path):
    """Tried as a user: a reward reading ``image`` worked in training and ended the run in a traceback at the step-0
    held-out eval, which called it without the rows' images. Now the eval passes every column, ``trainer_state``
    and a conversation's completions as messages, as TRL's ``_calculate_rewards`` does."""
    from suzak.runs.generation_eval import GenerationEvalCallback
    from suzak.training.build import add_first

    rows = list(image_dataset(4))
    trainer = make_trainer(tiny_model_dir, tmp_path, image_dataset(8), [sees_its_image, length_reward], max_steps=1)
    callback = GenerationEvalCallback(rows, sees_its_image, trainer.processing_class, eval_steps=1, max_new_tokens=4)
    add_first(trainer, callback)
    trainer.train()
    history = [entry for entry in trainer.state.log_history if "eval/accuracy" in entry]
    assert [entry["step"] for entry in history] == [0, 1] and all(0 <= e["eval/accuracy"] <= 1 for e in history)


def test_a_reward_failing_in_the_held_out_eval_stops_in_one_line_naming_it(tiny_model_dir, tmp_path):
    from suzak.runs.generation_eval import GenerationEvalCallback
    from suzak.training.build import add_first

    def needs_gold(completions, solution, **kwargs):
        return [float(int(s)) for s in solution]  # the held-out rows' gold is "<answer> k </answer>"

    trainer = make_trainer(tiny_model_dir, tmp_path, keyed_dataset(), [length_reward], max_steps=1)
    add_first(trainer, GenerationEvalCallback(list(keyed_dataset())[:2], needs_gold, trainer.processing_class,
                                              eval_steps=1, max_new_tokens=4))  # fmt: skip
    with pytest.raises(RewardFault) as stopped:
        trainer.train()
    assert str(stopped.value).startswith(
        "reward 'needs_gold' raised ValueError at the held-out evaluation before step 1 (dataset rows: index 100, "
        "index 101): invalid literal for int() with base 10: '<answer> 0 </answer>'. No step had completed"
    ), str(stopped.value)
