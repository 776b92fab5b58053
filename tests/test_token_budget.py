"""Micro-batches cut by tokens (``max_tokens_per_micro_batch``; :mod:`suzak.trl_internals.micro_batches`): the same
update as TRL's rows for every loss type (bnpo: the same as one pass per micro-batch), the partition arithmetic, the
checks before step 1, and a VL run whose passes are cut (images split between passes, reference pass by tokens).
"""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from trl import GRPOConfig, GRPOTrainer

from suzak import SuzakError
from suzak.training.trainer import VLMGRPOTrainer
from suzak.trl_internals.micro_batches import (
    NOMINAL_ROWS,
    balanced_parts,
    contiguous_runs,
    fewest_parts,
    grouped,
    loss_share,
    row_tokens,
    select_rows,
    split_by_tokens,
)
from test_text_dropin import DEFAULTS, zen

LOSSES = ["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"]


def length_reward(completions, **kwargs) -> list[float]:
    return [float(len(completion)) for completion in completions]


def _train(model_dir, tmp_path, cls, name, budget=None, padding_free=False, **config):
    """Two optimizer steps of 2 accumulated micro-batches (one generation batch of 2 groups of 3 each step), float64,
    plain SGD at learning rate 0.1 (the weights move by the gradient itself: Adam's first steps would turn the
    round-off of gradients that are zero in theory, an embedding row every row of a group shares, into ~1e-6 moves);
    the trainer after."""
    torch.manual_seed(0)
    args = GRPOConfig(output_dir=str(tmp_path / name), **(DEFAULTS | {
        "gradient_accumulation_steps": 2, "max_completion_length": 32, "max_steps": 2, "learning_rate": 0.1,
        "optim": "sgd", "temperature": 1.5, "model_init_kwargs": {"dtype": torch.float64}} | config))  # fmt: skip
    extra = {"max_tokens_per_micro_batch": budget, "padding_free": padding_free} if cls is VLMGRPOTrainer else {}
    trainer = cls(model=model_dir, reward_funcs=length_reward, args=args, train_dataset=zen(), **extra)
    trainer.train()
    return trainer


def _same_weights(a, b) -> None:
    """The same weights to 1e-5 relative, 1e-7 absolute: TRL's fused head takes its log-softmax in float32 whatever the
    model's dtype, so two float64 runs whose rows share a call differently differ by float32 round-off."""
    other = dict(b.model.named_parameters())
    for name, param in a.model.named_parameters():
        torch.testing.assert_close(param, other[name], rtol=1e-5, atol=1e-7, msg=name)


def _losses(trainer) -> list[float]:
    return [log["loss"] for log in trainer.state.log_history if "loss" in log]


@pytest.fixture(scope="module")
def text_dir(family_model_dir) -> str:
    return str(family_model_dir("qwen2_5_text"))


@pytest.mark.parametrize("loss_type", LOSSES)
def test_each_loss_type_trains_as_trl_does(text_dir, tmp_path, loss_type):
    """A budget of 24 tokens cuts every micro-batch (rows of 6-40 tokens) into passes and deals the generation batch
    into micro-batches by tokens: the weights after two steps are TRL's in float64, the logged loss too (``bnpo``,
    whose normalizer is a micro-batch's tokens: the weights of one pass per balanced micro-batch)."""
    extra = {"importance_sampling_level": "sequence"} if loss_type == "luspo" else {}
    cut = _train(text_dir, tmp_path, VLMGRPOTrainer, "cut", budget=24, loss_type=loss_type, **extra)
    if loss_type == "bnpo":
        reference = _train(text_dir, tmp_path, VLMGRPOTrainer, "whole", budget=10**6, loss_type=loss_type)
    else:
        reference = _train(text_dir, tmp_path, GRPOTrainer, "trl", loss_type=loss_type, **extra)
    _same_weights(cut, reference)
    assert _losses(cut) == pytest.approx(_losses(reference), rel=1e-5, abs=1e-6)  # ~0 on policy: float32 round-off
    grad_norms = [[log["grad_norm"] for log in t.state.log_history if "grad_norm" in log] for t in (cut, reference)]
    assert grad_norms[0] == pytest.approx(grad_norms[1], rel=1e-6)


def test_packed_passes_cut_by_tokens_train_as_trl_does(text_dir, tmp_path):
    """suzak's default, padding-free passes, with a budget: TRL's weights (to the packed passes' own tolerance)."""
    cut = _train(text_dir, tmp_path, VLMGRPOTrainer, "cut", budget=24, padding_free=True)
    assert cut.padding_free
    _same_weights(cut, _train(text_dir, tmp_path, GRPOTrainer, "trl"))


def test_two_optimizer_steps_a_generation_batch_train_as_trl_does(text_dir, tmp_path):
    """steps_per_generation 4 over gradient_accumulation_steps 2: each optimizer step deals TRL's rows of that step
    between its two micro-batches, so both steps end with TRL's weights."""
    extra = {"steps_per_generation": 4, "max_steps": 2, "loss_type": "grpo"}  # a mean over each step's rows
    cut = _train(text_dir, tmp_path, VLMGRPOTrainer, "cut", budget=24, padding_free=True, **extra)
    reference = _train(text_dir, tmp_path, GRPOTrainer, "trl", **extra)
    _same_weights(cut, reference)
    grad_norms = [[log["grad_norm"] for log in t.state.log_history if "grad_norm" in log] for t in (cut, reference)]
    assert grad_norms[0] == pytest.approx(grad_norms[1], rel=1e-5)


def test_passes_are_cut_and_the_micro_batches_balanced(text_dir, tmp_path, monkeypatch):
    """The budget run makes more model calls than TRL's rows (its loss passes hold at most 24 tokens, or one row);
    its two micro-batches of a generation batch hold rows of about the same tokens."""
    from suzak.trl_internals import micro_batches

    passes, splits = [], []
    loss_in_passes, split = micro_batches.loss_in_passes, micro_batches.split_by_tokens

    def counting(trainer, compute, model, inputs, budget, group_size=1, padded=False):
        def each(model, rows):
            passes.append(micro_batches.row_tokens(rows))
            return compute(model, rows)

        return loss_in_passes(trainer, each, model, inputs, budget, group_size, padded)

    def recording(batch, chunks, group_size=1, window=1, padded=False):
        parts = split(batch, chunks, group_size, window, padded)
        splits.append([micro_batches.row_tokens(part) for part in parts])
        return parts

    monkeypatch.setattr("suzak.trl_internals.hooks.loss_in_passes", counting)
    monkeypatch.setattr(micro_batches, "split_by_tokens", recording)
    _train(text_dir, tmp_path, VLMGRPOTrainer, "cut", budget=24, max_steps=1, padding_free=True)
    assert len(passes) > 2 and all(sum(p) <= 24 or len(p) == 1 for p in passes)
    assert len(splits) == 1 and len(splits[0]) == 2
    rows = sorted(t for part in splits[0] for t in part)
    heaviest = max(sum(part) for part in splits[0])
    assert heaviest - min(sum(part) for part in splits[0]) <= max(rows)  # within one row of even


def test_padded_passes_count_the_width_and_each_optimizer_step_keeps_trls_rows():
    """Passes that run padded compute every row at the batch's width: the budget counts that. With two optimizer steps
    a generation batch (steps_per_generation 4, gradient_accumulation_steps 2), each step's two micro-batches hold
    the rows TRL gives that step (the first 4 of the shuffled 8), dealt between them by tokens."""
    lengths = [30, 2, 2, 2, 9, 9, 9, 1]
    batch = {"prompt_mask": torch.ones(8, 2, dtype=torch.long),
             "completion_mask": (torch.arange(30)[None] < torch.tensor(lengths)[:, None]).long(),
             "row": list(range(8))}  # fmt: skip
    assert row_tokens(batch, padded=True) == [32] * 8 and row_tokens(batch)[:2] == [32, 4]
    parts = split_by_tokens(batch, 4, window=2)
    assert [sorted(part["row"]) for part in parts[:2]] == [[0], [1, 2, 3]] and sorted(
        parts[2]["row"] + parts[3]["row"]
    ) == [4, 5, 6, 7]
    assert all(float(part[NOMINAL_ROWS]) == 2.0 for part in parts)
    assert [len(part["row"]) for part in split_by_tokens(batch, 4, padded=True)] == [2, 2, 2, 2]


def test_a_moe_aux_loss_with_a_global_loss_is_refused():
    from types import SimpleNamespace

    from suzak.trl_internals.micro_batches import budget_refusal

    trainer = SimpleNamespace(loss_type="dapo", entropy_coef=0.0, use_adaptive_entropy=False, top_entropy_quantile=1.0,
                              aux_loss_enabled=True)  # fmt: skip
    assert "router's aux loss" in budget_refusal(trainer)
    assert budget_refusal(SimpleNamespace(**{**vars(trainer), "loss_type": "grpo"})) is None


def test_refused_combinations_stop_before_training(text_dir, tmp_path):
    for config, words in (({"entropy_coef": 0.01}, "entropy bonus"), ({"top_entropy_quantile": 0.5}, "quantile")):
        args = GRPOConfig(output_dir=str(tmp_path), **(DEFAULTS | config))
        with pytest.raises(SuzakError, match=words):
            VLMGRPOTrainer(model=text_dir, reward_funcs=length_reward, args=args, train_dataset=zen(),
                           max_tokens_per_micro_batch=64)  # fmt: skip


def test_a_flag_below_one_is_one_line(run_env, tmp_path):
    result = subprocess.run([sys.executable, "-m", "suzak", "train", "--config", "recipes/smoke.yaml",
                             "--max_tokens_per_micro_batch", "0", "--output_dir", str(tmp_path)],
                            env=run_env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.returncode != 0
    assert "max_tokens_per_micro_batch 0 must be >= 1" in result.stderr and "Traceback" not in result.stderr


# --- the arithmetic -------------------------------------------------------------------------------------------------


def test_balanced_parts_are_even_and_keep_every_unit_once():
    weights = [40, 7, 33, 12, 9, 25, 31, 6, 18]
    parts = balanced_parts(weights, 3)
    assert sorted(i for part in parts for i in part) == list(range(len(weights)))
    loads = [sum(weights[i] for i in part) for part in parts]
    assert max(loads) - min(loads) <= max(weights)
    assert balanced_parts([5, 1], 4) == [[0], [1]]  # fewer units than parts: no empty part


def test_fewest_parts_and_runs_respect_the_budget():
    assert fewest_parts([10, 10, 10], 30) == 1
    assert fewest_parts([10, 10, 10], 29) == 2
    assert fewest_parts([50, 1, 1], 10) == 2  # a unit over the budget is a part of its own
    assert contiguous_runs([50, 1, 1], 10) == [[0], [1, 2]]
    assert contiguous_runs([3, 3, 3, 3], 100, parts=3) == [[0], [1], [2, 3]]
    assert grouped([1, 2, 3, 4, 5, 6], 3) == [[0, 1, 2], [3, 4, 5]]


def test_loss_shares_sum_to_one_micro_batch():
    for loss_type in LOSSES:
        shares = [loss_share(loss_type, rows, 4, tokens, 50) for rows, tokens in ((1, 20), (3, 30))]
        expected = {"dapo": 2.0, "cispo": 2.0, "vespo": 2.0}.get(loss_type, 1.0)  # global normalizers: each pass 1
        assert sum(shares) == pytest.approx(expected)
    with pytest.raises(SuzakError, match="no known per-pass share"):
        loss_share("new_loss", 1, 4, 1, 4)


def test_rows_are_selected_with_their_images():
    """A VL micro-batch's rows (pixel values joined, TRL's layout) split into passes: each pass holds its rows' images."""
    grid = torch.tensor([[1, 2, 2], [1, 2, 4], [1, 2, 2]])  # 4, 8 and 4 patches
    batch = {
        "prompt_ids": torch.arange(9).view(3, 3), "prompt_mask": torch.ones(3, 3, dtype=torch.long),
        "completion_ids": torch.zeros(3, 2, dtype=torch.long), "completion_mask": torch.ones(3, 2, dtype=torch.long),
        "pixel_values": torch.arange(16.0)[:, None], "image_grid_thw": grid, "num_images": [1, 1, 1],
        "num_items_in_batch": torch.tensor(6), "sampling_per_token_logps": None,
    }  # fmt: skip
    rows = select_rows(batch, [1, 2])
    assert rows["pixel_values"].flatten().tolist() == list(range(4, 16))
    assert rows["image_grid_thw"].tolist() == grid[1:].tolist() and rows["num_images"] == [1, 1]
    assert rows["prompt_ids"].tolist() == [[3, 4, 5], [6, 7, 8]] and rows["sampling_per_token_logps"] is None
    assert int(rows["num_items_in_batch"]) == 6
    from trl.trainer.utils import split_pixel_values_by_grid

    parts = split_by_tokens(split_pixel_values_by_grid(batch), 2)
    assert sorted(len(part["num_images"]) for part in parts) == [1, 2]
    assert all(float(part[NOMINAL_ROWS]) == 1.0 for part in parts)


# --- a VL run -------------------------------------------------------------------------------------------------------


# the smoke recipe (tiny Qwen2.5-VL, pictures) with a reference pass, 2 groups of 4 rows of different lengths, a
# length reward (non-zero advantages: tests/test_trainer.py); its flags after ``-m suzak.train`` / ``suzak train``
RUN_FLAGS = ["--config", "recipes/smoke.yaml", "--max_steps", "2", "--beta", "0.04", "--loss_type", "grpo",
             "--temperature", "1.5", "--save_strategy", "no", "--gradient_accumulation_steps", "2",
             "--per_device_train_batch_size", "4", "--preflight_rows", "0", "--rewards", "test_trainer.length_reward",
             "--reward_weights", "1.0"]  # fmt: skip


def _same_update_with_and_without_a_budget(tmp_path, run_env, launcher: list[str], extra: list[str] = ()) -> dict:
    """``launcher`` + :data:`RUN_FLAGS` run without a budget and with 200 tokens a pass (which cuts each micro-batch
    and the reference pass into several): the same completions, loss and gradient norm (non-zero) step after step
    (the second step sampled from the first step's weights). Returns each run's logged steps."""
    env = {**run_env, "PYTHONPATH": str(Path(__file__).parent)}
    runs = {}
    for name, flags in (("rows", []), ("tokens", ["--max_tokens_per_micro_batch", "200"])):
        out = tmp_path / name
        command = [*launcher, *RUN_FLAGS, *extra, *flags, "--output_dir", str(out)]
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        with open(out / "metrics.csv", newline="") as file:
            runs[name] = [row for row in csv.DictReader(file) if row.get("loss")]
    assert len(runs["rows"]) == len(runs["tokens"]) == 2
    for rows, tokens in zip(runs["rows"], runs["tokens"], strict=True):
        assert float(rows["grad_norm"]) > 0
        assert tokens["completions/mean_length"] == rows["completions/mean_length"]
        for name in ("loss", "grad_norm"):
            assert float(tokens[name]) == pytest.approx(float(rows[name]), rel=1e-4, abs=1e-7), name
    return runs


def test_a_vl_run_with_a_budget_logs_trls_update(tmp_path, run_env):
    """``suzak train`` (:data:`RUN_FLAGS`) with a budget: TRL's update (:func:`_same_update_with_and_without_a_budget`);
    the reference pass runs cut by tokens too."""
    runs = _same_update_with_and_without_a_budget(tmp_path, run_env, [sys.executable, "-m", "suzak", "train"])
    assert all(float(row["kl"]) >= 0 for row in runs["rows"])
    assert float(runs["rows"][1]["kl"]) > 0  # the second step's reference pass saw changed weights


def test_a_row_over_the_budget_stops_before_step_1(tmp_path, run_env):
    result = subprocess.run([sys.executable, "-m", "suzak", "train", "--config", "recipes/smoke.yaml",
                             "--max_tokens_per_micro_batch", "50", "--output_dir", str(tmp_path)],
                            env=run_env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.returncode != 0
    assert "over max_tokens_per_micro_batch 50" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "metrics.csv").exists() or "loss" not in (tmp_path / "metrics.csv").read_text()


@pytest.mark.slow
@pytest.mark.parametrize(("ranks", "deepspeed"), [(2, None), (1, "zero3")])
def test_ranks_and_zero3_cut_by_tokens_log_trls_update(tmp_path, run_env, ranks, deepspeed):
    """Two DDP ranks (gloo; each rank's rows cut into its own number of passes, every rank making the most any
    needs, the passes but the last outside DDP's all-reduce) and DeepSpeed ZeRO-3 (the passes but the last not a
    gradient-accumulation boundary, so the engine steps once): the same loss and gradient norm as without a budget."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks), "-m", "suzak.train"]
    extra = ["--deepspeed", f"ds_configs/{deepspeed}.json"] if deepspeed else []
    _same_update_with_and_without_a_budget(tmp_path, run_env, launcher, extra)
