"""DAPO's dynamic sampling (``dynamic_sampling``, :class:`suzak.trl_internals.rounds.DynamicSampling`): groups whose
completions all score alike are dropped and refilled with new prompts, up to a cap of extra rounds; the merged batch
is the usual size, its kept groups exactly as generated and scored, the rest masked out. Real GRPO steps of the tiny
Qwen2.5-VL with images and gradient accumulation; two ranks in tests/test_train_cli.py, colocated vLLM in the vLLM
tier, the efficiency measurement in bench/bench_dynamic_sampling.py."""

from __future__ import annotations

import logging
import math
import re

import pytest
import torch

from conftest import ROOT
from suzak import SuzakError
from suzak.scoring.parsing import completion_text
from suzak.trl_internals.rounds import DynamicSampling, merge_scored_rows
from test_trainer import image_dataset, make_trainer

SIGNAL_KEYS = {6, 7}  # of image_dataset(8)'s rows, the only ones whose completions score differently


def key_of(solution: str) -> int:
    return int(re.search(r"\d+", solution).group())


def signal_only_on_some_rows(completions, solution, **kwargs) -> list[float]:
    """The completion's length on rows 6 and 7 (varies within a group), 1 on every other row (no signal)."""
    return [float(len(completion_text(c))) if key_of(s) in SIGNAL_KEYS else 1.0
            for c, s in zip(completions, solution, strict=True)]  # fmt: skip


def no_signal(completions, **kwargs) -> list[float]:
    return [1.0] * len(completions)


def spied_trainer(tiny_model_dir, tmp_path, reward, max_rounds: int, **args):
    """A trainer with dynamic sampling whose rounds (inputs, scored batch) and merged batches are recorded."""
    trainer = make_trainer(tiny_model_dir, tmp_path, image_dataset(8), [reward], per_device_train_batch_size=4,
                           num_generations=4, gradient_accumulation_steps=2, learning_rate=1e-3, **args)  # fmt: skip
    trainer.dynamic_sampling = DynamicSampling(max_rounds=max_rounds)
    seen = {"rounds": [], "merged": []}
    one_round, merged = trainer._generate_and_score_round, trainer._generate_and_score_completions

    def round_spy(inputs):
        output = one_round(inputs)
        seen["rounds"].append(([key_of(row["solution"]) for row in inputs], output))
        return output

    def merged_spy(inputs):
        seen["rounds"].append("generation")
        output = merged(inputs)
        seen["merged"].append(output)
        return output

    trainer._generate_and_score_round, trainer._generate_and_score_completions = round_spy, merged_spy
    return trainer, seen


def generations(seen) -> list[list]:
    """The rounds of each generation, in order."""
    out = []
    for item in seen["rounds"]:
        if item == "generation":
            out.append([])
        else:
            out[-1].append(item)
    return out


def row_signature(batch: dict, row: int, pad_id: int) -> tuple:
    """A row's prompt and completion tokens (padding and masked tokens dropped) and its advantage."""
    prompt = batch["prompt_ids"][row][batch["prompt_mask"][row].bool()].tolist()
    completion = batch["completion_ids"][row][batch["completion_mask"][row].bool()].tolist()
    return tuple(prompt), tuple(completion), round(float(batch["advantages"][row]), 5)


def test_dropped_groups_are_refilled_and_kept_groups_reach_the_loss_as_scored(tiny_model_dir, tmp_path):
    trainer, seen = spied_trainer(tiny_model_dir, tmp_path, signal_only_on_some_rows, max_rounds=3, max_steps=2)
    trainer.train()
    pad = trainer.processing_class.tokenizer.pad_token_id
    rounds_per_generation = generations(seen)
    assert len(rounds_per_generation) == len(seen["merged"]) == 2  # one generation batch of 8 rows per step
    extra_rounds = [len(rounds) - 1 for rounds in rounds_per_generation]
    assert max(extra_rounds) >= 1, "no batch needed a refill: the test does not reach the extra rounds"
    for rounds, merged in zip(rounds_per_generation, seen["merged"], strict=True):
        assert merged["completion_ids"].size(0) == 8 and merged["pixel_values"].size(0) == sum(
            int(grid.prod()) for grid in merged["image_grid_thw"]
        )
        for keys, _ in rounds[1:]:  # extra rounds: two drawn rows, each num_generations times in a row
            assert len(keys) == 8 and all(keys[g * 4 : g * 4 + 4] == [keys[g * 4]] * 4 for g in range(2))
        scored = {}
        for keys, batch in rounds:
            for row, key in enumerate(keys):
                scored[row_signature(batch, row, pad)] = key
        live = merged["completion_mask"].sum(1) > 0
        signal_groups = sum(1 for keys, _ in rounds for g in range(2) if keys[g * 4] in SIGNAL_KEYS)
        assert int(live.sum()) == 4 * min(2, signal_groups)  # whole groups, as many as were found (at most 2)
        assert live[: int(live.sum())].all()  # kept groups first, then masked filler
        for row in torch.nonzero(live)[:, 0].tolist():  # every kept row: exactly a row some round scored, with signal
            assert scored.get(row_signature(merged, row, pad)) in SIGNAL_KEYS
        assert merged["num_items_in_batch"] == merged["completion_mask"].sum()
        if not live.all():  # the cap was reached: the last round's dropped groups fill the batch, masked
            assert len(rounds) == 4
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logs) == 2 and all(math.isfinite(entry["loss"]) for entry in logs)
    for entry, rounds in zip(logs, rounds_per_generation, strict=True):
        assert entry["dynamic_sampling/extra_rounds"] == len(rounds) - 1
        groups = [keys[g * 4] for keys, _ in rounds for g in range(2)]
        assert entry["dynamic_sampling/dropped_groups"] == sum(key not in SIGNAL_KEYS for key in groups)
        assert entry["dynamic_sampling/kept_groups"] == min(2, sum(key in SIGNAL_KEYS for key in groups))
        assert entry["generated_tokens"] == sum(int(batch["completion_mask"].sum()) for _, batch in rounds)
        held = sum(batch["completion_ids"].numel() * 8 + batch["pixel_values"].numel() * 4 for _, batch in rounds)
        assert entry["dynamic_sampling/rounds_mib"] * 2**20 > held  # every round's tensors, until the merge


def test_the_logged_reward_is_the_kept_batchs_and_every_rounds_is_logged_apart(tiny_model_dir, tmp_path):
    """TRL logs ``reward`` once per round over all its rows; with dynamic sampling the step's ``reward``,
    ``reward_std``, ``frac_reward_zero_std`` and ``rewards/<name>/mean`` are the trained groups' (issue 51: they
    mixed in the dropped rounds), the all-rounds figures under ``dynamic_sampling/all_rounds/``; completions.csv keeps
    every round's rows, each marked ``group_signal`` 1 (its group has a signal) or 0 (dropped)."""
    calls = []

    def recorded(completions, solution, **kwargs) -> list[float]:
        values = signal_only_on_some_rows(completions, solution)
        calls.append([(key_of(s), v) for s, v in zip(solution, values, strict=True)])
        return values

    recorded.__name__ = "recorded"
    trainer, seen = spied_trainer(tiny_model_dir, tmp_path, recorded, max_rounds=3, max_steps=2)
    csv_rows = []
    trainer.completion_listeners.append(csv_rows.extend)  # completions.csv's rows: every round's, marked
    trainer.train()
    assert len(csv_rows) == sum(len(call) for call in calls)
    assert all(row["group_signal"] == (key_of(row["prompt"]) in SIGNAL_KEYS) for row in csv_rows)
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    first = 0
    for entry, rounds in zip(logs, generations(seen), strict=True):
        scored = [row for call in calls[first : first + len(rounds)] for row in call]
        first += len(rounds)
        kept = [value for key, value in scored if key in SIGNAL_KEYS][: 4 * int(entry["dynamic_sampling/kept_groups"])]
        assert entry["reward"] == pytest.approx(sum(kept) / len(kept), rel=1e-5)
        assert entry["rewards/recorded/mean"] == pytest.approx(entry["reward"], rel=1e-5)
        assert entry["frac_reward_zero_std"] == 0  # a kept group has a signal
        everything = sum(value for _, value in scored) / len(scored)
        assert entry["dynamic_sampling/all_rounds/reward"] == pytest.approx(everything, rel=1e-5)


def test_a_batch_without_signal_stops_refilling_at_the_cap_and_trains_nothing(tiny_model_dir, tmp_path, caplog):
    """The demo's first steps: every group scores alike. The refill ends at dynamic_sampling_max_rounds, the batch
    is all masked (loss 0, no update), and the log says so."""
    trainer, seen = spied_trainer(tiny_model_dir, tmp_path, no_signal, max_rounds=2, max_steps=1)
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    with caplog.at_level(logging.INFO, logger="suzak.trl_internals"):
        trainer.train()
    assert len(generations(seen)[0]) == 3 and seen["merged"][0]["completion_mask"].sum() == 0
    log = next(entry for entry in trainer.state.log_history if "loss" in entry)
    assert log["loss"] == 0 and log["grad_norm"] == 0 and log["dynamic_sampling/kept_groups"] == 0
    assert log["dynamic_sampling/dropped_groups"] == 6 and log["dynamic_sampling/extra_rounds"] == 2
    assert all(torch.equal(before[name], p) for name, p in trainer.model.named_parameters())
    assert "the batch for step 1 trains on 0 of 2 groups after 2 extra round(s)" in caplog.text


def constant(completions, **kwargs) -> list[float]:
    return [0.3] * len(completions)  # 0.3 is no sum of powers of two: six of them have a float32 std of ~3e-8


def test_a_constant_reward_drops_every_group_whatever_float32_rounding_leaves(tiny_model_dir, tmp_path):
    """A reward the same for every completion that float32 does not sum exactly ([0.3] * 6): every group dropped,
    the refills too, as a reward of 1.0 is (issue: kept 8, dropped 0 at the default min_std 0)."""
    trainer = make_trainer(tiny_model_dir, tmp_path, image_dataset(8), [constant], per_device_train_batch_size=6,
                           num_generations=6, gradient_accumulation_steps=2, max_steps=1)  # fmt: skip
    trainer.dynamic_sampling = DynamicSampling(max_rounds=1)
    trainer.train()
    log = next(entry for entry in trainer.state.log_history if "loss" in entry)
    assert log["dynamic_sampling/kept_groups"] == 0 and log["dynamic_sampling/dropped_groups"] == 4
    assert log["loss"] == 0


def test_a_step_without_a_kept_group_leaves_weights_and_optimizer_state_as_they_were(tiny_model_dir, tmp_path):
    """Step 1 trains (a reward with signal), step 2 keeps no group: AdamW's momentum and weight decay would still
    move every weight at a zero loss (issue 51, item 6); the step is skipped and counted instead."""
    from transformers import TrainerCallback

    calls = []

    def signal_once(completions, **kwargs) -> list[float]:
        calls.append(1)
        return [float(len(completion_text(c))) for c in completions] if len(calls) == 1 else [1.0] * len(completions)

    class AfterStep1(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 1:
                kept["weights"] = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
                kept["state"] = {k: v["exp_avg"].clone() for k, v in trainer.optimizer.state.items()}

    kept = {}
    trainer, _ = spied_trainer(tiny_model_dir, tmp_path, signal_once, max_rounds=0, max_steps=2, weight_decay=0.1)
    trainer.add_callback(AfterStep1())
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert [entry["dynamic_sampling/kept_groups"] for entry in logs] == [2, 0]
    assert [entry["dynamic_sampling/skipped_steps"] for entry in logs] == [0, 1]
    assert any(state.abs().sum() > 0 for state in kept["state"].values())  # step 1 left momentum to apply
    assert all(torch.equal(kept["weights"][n], p) for n, p in trainer.model.named_parameters())
    assert all(torch.equal(kept["state"][k], v["exp_avg"]) for k, v in trainer.optimizer.state.items())


def test_extra_prompts_depend_on_seed_step_round_and_rank_only(tiny_model_dir, tmp_path):
    """A resumed run draws the same extra prompts at the same step."""
    trainer = make_trainer(tiny_model_dir, tmp_path, image_dataset(8), [no_signal], num_generations=4)
    first = [key_of(row["solution"]) for row in trainer.extra_prompts(2, 1)]
    assert first == [key_of(row["solution"]) for row in trainer.extra_prompts(2, 1)]
    assert len(first) == 8 and first[:4] == [first[0]] * 4 and first[4:] == [first[4]] * 4 and first[0] != first[4]
    draws = {tuple(key_of(row["solution"]) for row in trainer.extra_prompts(2, extra)) for extra in range(1, 9)}
    assert len(draws) > 1
    by_step = set()
    for step in range(1, 6):
        trainer.state.global_step = step
        by_step.add(tuple(key_of(row["solution"]) for row in trainer.extra_prompts(2, 1)))
    assert len(by_step) > 1


def test_two_generations_in_one_step_refill_from_different_rows(tiny_model_dir, tmp_path):
    """steps_per_generation 1 under gradient_accumulation_steps 2: two generations a step, each refilled with rows
    of its own (issue 51: both drew the seed (seed, step, round, rank) and so the same rows)."""
    trainer, seen = spied_trainer(tiny_model_dir, tmp_path, no_signal, max_rounds=3, max_steps=1,
                                  steps_per_generation=1)  # fmt: skip
    trainer.train()
    first, second = generations(seen)
    assert len(first) == len(second) == 4  # one group a generation, three refills each (nothing has a signal)
    assert [keys for keys, _ in first[1:]] != [keys for keys, _ in second[1:]]


def test_a_rank_batch_of_part_groups_stops_before_step_1(tiny_model_dir, tmp_path):
    """Two ranks of 2 rows each make a global batch TRL accepts for num_generations 4, but each rank holds half a
    group (one process here: the rank's batch size set as two ranks would have it)."""
    trainer = make_trainer(tiny_model_dir, tmp_path, image_dataset(8), [no_signal], num_generations=4)
    trainer.dynamic_sampling = DynamicSampling()
    trainer.args.per_device_train_batch_size = 2
    with pytest.raises(SuzakError, match=r"per_device_train_batch_size x steps_per_generation \(2\) must be a "
                                         r"multiple of num_generations \(4\)"):  # fmt: skip
        trainer.check_dynamic_sampling()


@pytest.mark.parametrize(("flags", "said"), [
    (["--scale_rewards", "batch"], "dynamic_sampling with scale_rewards batch: each generation round"),
    (["--multi_objective_aggregation", "normalize_then_sum"], "dynamic_sampling with multi_objective_aggregation"),
])  # fmt: skip
def test_advantages_scaled_over_the_whole_batch_stop_dynamic_sampling_before_the_model_loads(flags, said):
    """Each round's advantages stay as TRL computed them on its own batch (issue 51, item 5): a batch-wide std there
    counts the groups dynamic sampling drops, so those settings are refused, not trained mis-scaled."""
    from suzak.training.configs import parse_args

    base = ["--config", str(ROOT / "recipes" / "smoke.yaml"), "--dynamic_sampling", "true"]
    with pytest.raises(SuzakError, match=f"^{re.escape(said)}"):
        parse_args([*base, *flags])
    parse_args([*base, "--scale_rewards", "none"])  # per group: merged as scored


@pytest.mark.parametrize(("flag", "value", "said"), [
    ("--dynamic_sampling_max_rounds", "-1", "dynamic_sampling_max_rounds -1 must be >= 0"),
    ("--dynamic_sampling_min_std", "-0.5", "dynamic_sampling_min_std -0.5 must be >= 0"),
])  # fmt: skip
def test_bad_dynamic_sampling_flags_are_one_line(flag, value, said):
    from suzak.training.configs import parse_args

    with pytest.raises(SuzakError, match=re.escape(said)):
        parse_args(["--config", "recipes/smoke.yaml", "--dynamic_sampling", "true", flag, value])


def _scored(prompt_width: int, completion_width: int, rows: int, start: int) -> dict:
    """A scored batch as TRL returns it for Qwen VL rows of one 2x2-patch image each, values numbered from
    ``start`` so rows can be traced."""
    ids = torch.arange(rows * prompt_width).view(rows, prompt_width) + start
    completion = torch.arange(rows * completion_width).view(rows, completion_width) + start
    return {
        "prompt_ids": ids, "prompt_mask": torch.ones_like(ids), "completion_ids": completion,
        "completion_mask": torch.ones_like(completion), "tool_mask": torch.ones_like(completion),
        "sampling_per_token_logps": completion.float(), "importance_sampling_ratio": torch.ones(rows, 1),
        "mm_token_type_ids": torch.cat([torch.ones_like(ids), torch.zeros_like(completion)], dim=1),
        "advantages": torch.arange(rows, dtype=torch.float) + start, "num_items_in_batch": torch.tensor(99),
        "pixel_values": torch.arange(rows * 4 * 3, dtype=torch.float).view(rows * 4, 3) + start,
        "image_grid_thw": torch.tensor([[1, 2, 2]] * rows), "num_images": [1] * rows,
    }  # fmt: skip


def test_merging_rounds_pads_each_field_on_its_side_and_keeps_rows_whole():
    wide, narrow = _scored(5, 3, 2, start=100), _scored(3, 6, 2, start=200)
    merged = merge_scored_rows([wide, narrow], [(1, 0), (0, 1)], masked=[1], pad_id=-1)
    assert merged["prompt_ids"].tolist() == [[-1, -1, 200, 201, 202], [105, 106, 107, 108, 109]]  # left-padded
    assert merged["prompt_mask"].tolist() == [[0, 0, 1, 1, 1], [1] * 5]
    assert merged["completion_ids"].tolist() == [[200, 201, 202, 203, 204, 205], [103, 104, 105, -1, -1, -1]]
    # row 1 masked out of the loss through tool_mask, its attention kept: a masked row's crops keep their positions
    assert merged["completion_mask"].tolist() == [[1] * 6, [1, 1, 1, 0, 0, 0]]
    assert merged["tool_mask"].tolist() == [[1] * 6, [0] * 6]
    untooled = [{k: v for k, v in batch.items() if k != "tool_mask"} for batch in (wide, narrow)]
    plain = merge_scored_rows(untooled, [(1, 0), (0, 1)], masked=[1], pad_id=-1)
    assert plain["completion_mask"].tolist() == [[1] * 6, [0] * 6]  # no tools, no images in a completion
    assert merged["sampling_per_token_logps"][1].tolist() == [103.0, 104.0, 105.0, 0.0, 0.0, 0.0]
    assert merged["importance_sampling_ratio"].shape == (2, 1)  # one per row: sequence level
    assert merged["mm_token_type_ids"].tolist() == [[0, 0, 1, 1, 1] + [0] * 6, [1] * 5 + [0] * 6]
    assert merged["advantages"].tolist() == [200.0, 101.0] and merged["num_images"] == [1, 1]
    assert merged["pixel_values"][:, 0].tolist() == [200, 203, 206, 209, 112, 115, 118, 121]  # each row's own
    assert merged["image_grid_thw"].tolist() == [[1, 2, 2], [1, 2, 2]] and "num_items_in_batch" not in merged


def test_merging_a_round_without_images_or_videos_fills_its_rows_fields_empty():
    """A refill round of text-only rows (no image fields at all) beside an image round, and a round without the
    clips' field beside one with it: every row keeps its own media, the others none (issue 51: the merge refused)."""
    from suzak.trl_internals.video import VIDEO_FIELDS

    images = _scored(3, 2, 2, start=100) | {VIDEO_FIELDS: [None, {"pixel_values_videos": torch.ones(2, 3)}]}
    text = {name: value for name, value in _scored(4, 2, 2, start=200).items()
            if name not in ("pixel_values", "image_grid_thw", "num_images", "mm_token_type_ids")}  # fmt: skip
    merged = merge_scored_rows([images, text], [(1, 0), (0, 0), (1, 1), (0, 1)], masked=[], pad_id=-1)
    assert merged["num_images"] == [0, 1, 0, 1] and merged["image_grid_thw"].tolist() == [[1, 2, 2], [1, 2, 2]]
    assert merged["pixel_values"][:, 0].tolist() == [100, 103, 106, 109, 112, 115, 118, 121]  # rows 0 and 1 of images
    assert merged["mm_token_type_ids"].shape == (4, 6) and merged["mm_token_type_ids"][0].tolist() == [0] * 6
    assert merged[VIDEO_FIELDS][:3] == [None, None, None] and merged[VIDEO_FIELDS][3] is not None
    alone = merge_scored_rows([images, text], [(1, 0), (0, 0)], masked=[], pad_id=-1)
    assert VIDEO_FIELDS not in alone  # no kept row with a clip: a batch without video
    # a round with clips: TRL's marks span its prompts before the clips' expansion, narrower than its prompt ids
    clips = _scored(7, 2, 2, start=300)
    clips["mm_token_type_ids"] = clips["mm_token_type_ids"][:, 3:]
    merged = merge_scored_rows([images, clips], [(0, 0), (1, 0)], masked=[], pad_id=-1)
    assert merged["mm_token_type_ids"].shape == merged["prompt_ids"].shape[:1] + (7 + 2,)  # the ids' full width
    assert merged["mm_token_type_ids"][1].tolist() == [0, 0, 0] + [1] * 4 + [0, 0]  # right-aligned, as fed
    assert merged["mm_token_type_ids"][0].tolist() == [0] * 4 + [1] * 3 + [0, 0]


def test_merging_a_field_it_does_not_know_stops_by_name():
    batch = _scored(3, 3, 2, start=0) | {"spatial_shapes": torch.ones(2, 2)}
    with pytest.raises(SuzakError, match=r"cannot merge TRL's scored-batch field\(s\) \['spatial_shapes'\]"):
        merge_scored_rows([batch], [(0, 0)], masked=[], pad_id=0)
