"""Generation batches as whole groups: DAPO's dynamic sampling, the merge of its rounds, and the shuffle by groups.

- :class:`DynamicSampling` / :func:`merge_scored_rows`: rounds of ``_generate_and_score_completions`` merged into
  one scored batch, field by field of its output (TRL's ``split_pixel_values_by_grid`` and
  ``unsplit_pixel_values_by_grid`` for the images; a field it does not know stops by name: the field tables
  :data:`PROMPT_FIELDS`, :data:`COMPLETION_FIELDS`, :data:`SEQUENCE_FIELDS`, :data:`ROW_FIELDS`), each group's reward
  std with TRL's ``nanstd`` (:func:`group_reward_std`, over TRL's weighted sum: :func:`weighted_rewards`);
- :func:`masked_out_of_the_loss`: TRL's ``mask_truncated_completions`` applied to ``tool_mask`` instead;
- :func:`shuffle_groups` / :func:`groups_kept_together`: ``trl.trainer.grpo_trainer.shuffle_sequence_dict``, TRL's
  shuffle of a generation batch, by whole groups while it runs.

Contract tests (tests/test_trl_contract.py): ``test_scored_batch_fields_are_the_ones_dynamic_sampling_merges``,
``test_pixel_values_split_and_merge_by_image_grid``,
``test_the_generation_batch_is_shuffled_through_the_modules_shuffle_sequence_dict``,
``test_step_counts_training_step_calls_and_picks_the_buffered_batch`` (the extra rounds' draws),
``test_mask_truncated_completions_is_read_at_call_time_and_zeroes_completion_mask``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from trl.trainer.utils import nanstd, split_pixel_values_by_grid, unsplit_pixel_values_by_grid

from suzak import SuzakError
from suzak.trl_internals.video import VIDEO_FIELDS

logger = logging.getLogger(__name__)


@dataclass
class DynamicSampling:
    """DAPO's dynamic sampling (Yu et al. 2025, "DAPO", section 3.2; TRL lacks it: huggingface/trl#3708).

    A group whose completions all score alike (reward std at most ``min_std``; a group no reward scored) has zero
    advantage and teaches nothing. After TRL scores a generation batch, such groups are dropped and new prompts of the
    training set generated, scored and kept in their place, up to ``max_rounds`` extra rounds a batch; a batch still
    short of groups then trains on what it has: the rest of it is dropped groups with their completions masked out
    (no loss, no KL), and it is said in the log. Each rank keeps its own groups (a rank's generation batch holds whole
    groups); every rank runs the same rounds, decided from the rewards TRL gathers over ranks.

    >>> DynamicSampling().kept(torch.tensor([0.0, 0.5, float("nan")])).tolist()
    [False, True, False]
    """

    min_std: float = 0.0
    max_rounds: int = 3

    def kept(self, group_std: torch.Tensor) -> torch.Tensor:
        """Which groups carry a signal: reward std above ``min_std`` (NaN, a group no reward scored: dropped)."""
        return group_std > self.min_std


def shuffle_groups(batch: dict[str, Any], size: int) -> dict[str, Any]:
    """TRL's shuffle of a scored generation batch before it cuts it into micro-batches (``shuffle_sequence_dict``:
    every sequence of ``batch`` permuted in unison), by whole groups: the ``size`` consecutive rows of a group stay
    together and in order, the groups in the order TRL's own row permutation (the same draw from torch's generator)
    first reaches one of their rows. A micro-batch of a multiple of ``size`` rows then holds whole groups, whose
    rows show one image: the vision tower encodes it once (:mod:`suzak.models.vision_reuse`). A batch that is not
    whole groups is shuffled by rows, as TRL does.

    >>> torch.manual_seed(0) and None
    >>> shuffle_groups({"row": list(range(6)), "none": None}, 2)["row"]
    [2, 3, 4, 5, 0, 1]
    """
    count = len(next(value for value in batch.values() if value is not None))
    permutation = torch.randperm(count)  # as TRL draws it, so the generator's next draws are the unshuffled run's
    if size > 1 and count % size == 0:
        first = torch.full((count // size,), count)
        first.scatter_reduce_(0, permutation // size, torch.arange(count), reduce="amin")
        permutation = (torch.argsort(first)[:, None] * size + torch.arange(size)).flatten()

    return {key: rows_at(value, permutation) for key, value in batch.items()}


def rows_at(value: Any, index: Sequence[int] | torch.Tensor) -> Any:
    """One field of a scored batch (a list or a row-first tensor, pixel values split per row) at the rows ``index``,
    as TRL's ``shuffle_sequence_dict`` permutes it; a 0-d tensor (``num_items_in_batch``) and None as they are.

    >>> rows_at(torch.tensor([5, 6, 7]), [2, 0]).tolist(), rows_at(["a", "b"], [1]), rows_at(None, [0])
    ([7, 5], ['b'], None)
    """
    if value is None or (isinstance(value, torch.Tensor) and value.ndim == 0):
        return value
    if isinstance(value, torch.Tensor):
        return value[torch.as_tensor(index, dtype=torch.long, device=value.device)]
    return [value[int(i)] for i in index]


@contextmanager
def groups_kept_together(size: int):
    """While TRL prepares a generation batch, its shuffle is :func:`shuffle_groups` (groups of ``size`` rows)."""
    from trl.trainer import grpo_trainer

    trls = grpo_trainer.shuffle_sequence_dict
    grpo_trainer.shuffle_sequence_dict = lambda batch: shuffle_groups(batch, size)
    try:
        yield
    finally:
        grpo_trainer.shuffle_sequence_dict = trls


def weighted_rewards(rewards_per_func: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Each completion's reward as TRL sums it (the weighted functions that scored it; NaN where none did).

    >>> weighted_rewards(torch.tensor([[1.0, float("nan")], [float("nan")] * 2]), torch.tensor([0.5, 1.0])).tolist()
    [0.5, nan]
    """
    rewards = (rewards_per_func * weights.to(rewards_per_func.device)[None]).nansum(dim=1)
    rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
    return rewards


ROUNDOFF = 1e-6  # a group's reward std at most this share of its largest reward is float32 round-off: zero


def group_reward_std(rewards_per_func: torch.Tensor, weights: torch.Tensor, size: int) -> torch.Tensor:
    """Each group's std of the weighted reward, over the completions some reward scored (TRL's own reward sum; NaN
    for a group with fewer than two scored completions). A std within float32 round-off of the group's rewards
    (:data:`ROUNDOFF` of its largest magnitude) is 0: six rewards of 0.3 sum to a std of ~3e-8 in float32, which
    no ``dynamic_sampling_min_std`` (default 0) would drop otherwise (only sums of powers of two are exact).

    >>> group_reward_std(torch.tensor([[1.0], [1.0], [0.0], [1.0]]), torch.tensor([1.0]), 2).tolist()
    [0.0, 0.7071067690849304]
    >>> group_reward_std(torch.full((6, 1), 0.3), torch.tensor([1.0]), 6).tolist()
    [0.0]
    """
    groups = weighted_rewards(rewards_per_func, weights).view(-1, size)
    std = nanstd(groups, dim=1)
    scale = groups.abs().nan_to_num(nan=0.0).amax(dim=1)
    return torch.where(std <= ROUNDOFF * scale, torch.zeros_like(std), std)


# How each 2-D field of TRL's scored batch is padded when batches of different widths are merged (prompt fields on
# the left, completion fields on the right, fields over the whole sequence both ways), and with what ("pad": the
# tokenizer's pad id); fields of one entry a row follow their rows. Anything else stops the merge by name.
PROMPT_FIELDS = {"prompt_ids": "pad", "prompt_mask": 0}


COMPLETION_FIELDS = {"completion_ids": "pad", "completion_mask": 0, "tool_mask": 1, "old_per_token_logps": 0.0,
                     "ref_per_token_logps": 0.0, "sampling_per_token_logps": 0.0, "importance_sampling_ratio": 1.0}  # fmt: skip


SEQUENCE_FIELDS = ("mm_token_type_ids", "token_type_ids")


ROW_FIELDS = ("advantages", "num_images", "pixel_values", "image_grid_thw", VIDEO_FIELDS)


def _widened(name: str, value: Any, prompt: tuple[int, int], completion: tuple[int, int], pad_id: int) -> Any:
    """One field of a scored batch padded from (prompt, completion) widths ``(own, target)``."""
    if not isinstance(value, torch.Tensor) or value.ndim < 2:
        return value
    left, right = prompt[1] - prompt[0], completion[1] - completion[0]
    if name in PROMPT_FIELDS:
        fill = PROMPT_FIELDS[name]
        return torch.nn.functional.pad(value, (left, 0), value=pad_id if fill == "pad" else fill)
    if name in COMPLETION_FIELDS:
        if value.size(1) == 1 and completion[0] != 1:  # a sequence-level ratio: one per row
            return value
        fill = COMPLETION_FIELDS[name]
        return torch.nn.functional.pad(value, (0, right), value=pad_id if fill == "pad" else fill)
    # over the prompt and the completion, ending where the ids end: a video round's prompt part is narrower than its
    # prompt ids (TRL's marks come from prompts whose clips were not expanded; feeding_videos aligns them right), so
    # the split is the completion's width from the right, and every row ends up the merged ids' full width
    split = value.size(1) - completion[0]
    head = torch.nn.functional.pad(value[:, :split], (prompt[1] - split, 0))
    return torch.cat([head, torch.nn.functional.pad(value[:, split:], (0, right))], dim=1)


def merge_scored_rows(batches: list[dict[str, Any]], rows: list[tuple[int, int]], masked: Sequence[int],
                      pad_id: int) -> dict[str, Any]:  # fmt: skip
    """One scored batch (``_generate_and_score_completions``' output) of ``rows``, each ``(batch, row)`` of
    ``batches``, padded to common widths; the rows at positions ``masked`` of the result keep no completion token in
    the loss: ``tool_mask`` 0 where the batch has one (tools), else ``completion_mask`` 0. Not the attention of a
    row whose completion may hold images: the Qwen models' ``get_rope_index`` skips attention-0 tokens but takes
    image grids from one iterator over the micro-batch, so a masked row's crops would shift every later row's image
    positions (:func:`masked_out_of_the_loss`). ``num_items_in_batch`` is left to the caller (a sum over ranks).
    """
    names = list(dict.fromkeys(name for batch in batches for name in batch))  # every round's, first seen first
    known = {*PROMPT_FIELDS, *COMPLETION_FIELDS, *SEQUENCE_FIELDS, *ROW_FIELDS, "num_items_in_batch"}
    if unknown := [name for name in names if name not in known]:
        raise SuzakError(f"dynamic sampling cannot merge TRL's scored-batch field(s) {unknown} (this model's inputs)")
    split = [dict(split_pixel_values_by_grid(batch)) for batch in batches]  # filled below: copies
    for name in names:  # a round without images (or videos) lacks their fields: its rows get empty ones
        like = next(batch[name] for batch in split if name in batch)
        for batch in split:
            if name not in batch:
                batch[name] = _absent(name, like, batch)
    prompt = max(batch["prompt_ids"].size(1) for batch in batches)
    completion = max(batch["completion_ids"].size(1) for batch in batches)
    merged: dict[str, Any] = {}
    for name in names:
        if name == "num_items_in_batch":
            continue
        parts = [_widened(name, batch[name], (batch["prompt_ids"].size(1), prompt),
                          (batch["completion_ids"].size(1), completion), pad_id) for batch in split]  # fmt: skip
        picked = [parts[b][r] for b, r in rows]
        merged[name] = torch.stack(picked) if isinstance(parts[0], torch.Tensor) else picked
    if masked:  # out of the loss; with tools through the loss mask only (masked_out_of_the_loss)
        index = torch.tensor(list(masked), device=merged["completion_mask"].device)
        field = "tool_mask" if "tool_mask" in merged else "completion_mask"
        merged[field] = merged[field].index_fill(0, index, 0)
    if VIDEO_FIELDS in merged and all(video is None for video in merged[VIDEO_FIELDS]):
        del merged[VIDEO_FIELDS]  # kept rows without a video: a batch without video, as the trainer builds it
    return unsplit_pixel_values_by_grid(merged)


def masked_out_of_the_loss(batch: dict[str, Any], eos_ids: Sequence[int], pad_id: int) -> dict[str, Any]:
    """TRL's ``mask_truncated_completions`` for a scored batch of tool rollouts: a completion that ends in neither EOS
    nor padding leaves the loss through ``tool_mask``, its attention kept. TRL zeroes ``completion_mask``, from which
    it builds the attention mask, and the Qwen models' ``get_rope_index`` drops attention-0 tokens while it takes
    image grids from one iterator over the micro-batch: a truncated row that zoomed would leave its crops' grids
    unread and shift the image positions of every row after it (a shape error, or silently wrong positions).

    >>> batch = {"completion_ids": torch.tensor([[5, 6, 7], [5, 2, 0]]), "completion_mask": torch.tensor([[1, 1, 1],
    ...          [1, 1, 0]]), "tool_mask": torch.ones(2, 3, dtype=torch.long)}
    >>> masked_out_of_the_loss(batch, [2], 0)["tool_mask"].tolist()  # row 0 ran out of tokens; row 1 ended (EOS 2)
    [[0, 0, 0], [1, 1, 1]]
    """
    ids, mask = batch["completion_ids"], batch["completion_mask"]
    lengths = mask.sum(1)
    last = ids.gather(1, (lengths - 1).clamp(min=0)[:, None])[:, 0]
    ends = torch.tensor([*eos_ids, pad_id], device=ids.device)
    truncated = (lengths > 0) & ~torch.isin(last, ends)
    return {**batch, "tool_mask": batch["tool_mask"] * (~truncated)[:, None].to(batch["tool_mask"].dtype)}


def trained_groups(signals: Sequence[torch.Tensor], rank: int, groups: int) -> list[tuple[int, int]]:
    """(round, group) of the groups ``rank`` trains on: its first ``groups`` with a signal, in round order, given each
    round's (ranks, groups) decisions (the merge keeps these; the reward figures are theirs).

    >>> trained_groups([torch.tensor([[False, True]]), torch.tensor([[True, True]])], rank=0, groups=2)
    [(0, 1), (1, 0)]
    """
    return [(r, g) for r, signal in enumerate(signals) for g in range(groups) if signal[rank, g]][:groups]


def _tensor_bytes(value: Any) -> int:
    """Bytes of the tensors in ``value`` (a scored batch: tensors, lists and dicts of them).

    >>> _tensor_bytes({"a": torch.zeros(4, dtype=torch.float32), "b": [torch.zeros(2, dtype=torch.int64), None]})
    32
    """
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(_tensor_bytes(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(_tensor_bytes(v) for v in value)
    return 0


def _absent(name: str, like: Any, batch: dict[str, Any]) -> Any:
    """The field ``name`` for the rows of a scored ``batch`` that has none (a round of rows without images, or
    without videos), shaped as another round's (``like``, split per row where it is a list): no image, no video,
    zeros for a per-token type field."""
    rows = batch["prompt_ids"].size(0)
    if name == "num_images":
        return [0] * rows
    if name == VIDEO_FIELDS:
        return [None] * rows
    if name in ("pixel_values", "image_grid_thw"):  # split per row: each row's (0, ...) slice
        return [like[0].new_zeros((0, *like[0].shape[1:])) for _ in range(rows)]
    if name in SEQUENCE_FIELDS:  # over the prompt and the completion: no vision token
        width = batch["prompt_ids"].size(1) + batch["completion_ids"].size(1)
        return like.new_zeros((rows, width))
    raise SuzakError(f"dynamic sampling: a generation round returned no {name!r} where another did; suzak cannot "
                     "fill it for that round's rows")  # fmt: skip


def dynamically_sampled(trainer, inputs: list[dict[str, Any]]) -> dict[str, Any]:
    """GRPOHooks._generate_and_score_completions in training with :class:`DynamicSampling`: rounds of generation until every rank holds as many groups with a signal as its
    batch has groups (or the cap), merged into one scored batch of the usual size."""
    sampling, size = trainer.dynamic_sampling, trainer.num_generations
    groups, rank = len(inputs) // size, trainer.accelerator.process_index
    batches, spare = [], []  # the rounds' scored batches; (round, group) dropped on this rank
    held = torch.zeros(trainer.accelerator.num_processes, dtype=torch.long)  # kept groups so far, each rank
    dropped = tokens = 0
    logged = {key: len(values) for key, values in trainer._metrics["train"].items()}  # before this batch's rounds
    signals, round_rewards = [], []  # each round's (ranks, groups) decisions and (ranks x rows, functions) rewards
    for extra in range(sampling.max_rounds + 1):
        batch = inputs if extra == 0 else trainer.extra_prompts(groups, extra)
        batches.append(trainer._generate_and_score_round(batch))
        tokens += trainer._generated_tokens
        signal = sampling.kept(trainer._group_std.cpu()).view(-1, groups)  # (ranks, groups): alike on every rank
        signals.append(signal)
        round_rewards.append(trainer._round_rewards)
        held += signal.sum(1)
        dropped += int((~signal).sum())
        spare += [(extra, g) for g in range(groups) if not signal[rank, g]]
        if bool((held >= groups).all()):
            break
    picked = trained_groups(signals, rank, groups)
    filler = spare[len(spare) - (groups - len(picked)) :] if len(picked) < groups else []
    rows = [(b, g * size + i) for b, g in picked + filler for i in range(size)]
    pad_id = getattr(trainer.processing_class, "tokenizer", trainer.processing_class).pad_token_id  # TRL's padding
    output = merge_scored_rows(batches, rows, range(len(picked) * size, len(rows)), pad_id)
    output["num_items_in_batch"] = loss_tokens(trainer, output)
    trained = int(held.clamp(max=groups).sum())
    trainer._generation_trains = trained > 0  # alike on every rank (held is gathered)
    short = held.numel() * groups - trained
    metrics = trainer._metrics["train"]
    # what the rounds held until the merge (every round's scored tensors, this rank): the memory max_rounds costs
    metrics["dynamic_sampling/rounds_mib"].append(sum(_tensor_bytes(batch) for batch in batches) / 2**20)
    log_kept_rewards(trainer, signals, round_rewards, groups, logged)
    for name, value in (("kept_groups", trained), ("dropped_groups", dropped), ("extra_rounds", extra)):
        metrics[f"dynamic_sampling/{name}"].append(float(value))
    metrics["generated_tokens"].append(float(tokens))  # every round's
    if short:
        logger.log(logging.INFO if not trainer._short_batches else logging.DEBUG,
                   "dynamic sampling: the batch for step %d trains on %d of %d groups after %d extra round(s) "
                   "(dynamic_sampling_max_rounds); the other %d have one reward for all their completions and "
                   "are masked out (dynamic_sampling/kept_groups in the metrics)", trainer.state.global_step + 1,
                   trained, trained + short, extra, short)  # fmt: skip
        trainer._short_batches += 1
    return output


def loss_tokens(trainer, output: dict[str, Any]) -> torch.Tensor:
    """Tokens of a scored batch in the loss, over every rank: TRL's ``num_items_in_batch``, recounted where suzak
    changed the masks (``completion_mask × tool_mask``, as TRL's loss reads them)."""
    loss_mask = output["completion_mask"] * output.get("tool_mask", 1)
    return trainer.accelerator.gather(loss_mask.sum()).sum()


def log_kept_rewards(trainer, signals: list[torch.Tensor], round_rewards: list[torch.Tensor], groups: int,
                     logged: dict[str, int]) -> None:  # fmt: skip
    """TRL logged ``reward``, ``reward_std``, ``frac_reward_zero_std`` and ``rewards/<name>/mean|std`` once per
    round, over every round's rows, dropped groups included. They become the figures of the groups this step
    trains on, over every rank (each rank's first ``groups`` kept groups, in round order: what the merge keeps);
    the all-rounds ones move to ``dynamic_sampling/all_rounds/<name>``. A batch that kept no group keeps
    TRL's."""
    size = trainer.num_generations
    rows = []  # (round, row of the gathered rewards) of every kept completion, every rank
    for rank in range(signals[0].size(0)):
        kept = trained_groups(signals, rank, groups)
        rows += [(r, (rank * groups + g) * size + i) for r, g in kept for i in range(size)]
    if not rows:
        return
    per_func = torch.stack([round_rewards[r][row] for r, row in rows])  # (kept completions, functions)
    total = weighted_rewards(per_func, trainer.reward_weights)
    group_std = nanstd(total.view(-1, size), dim=1)
    figures = {"reward": torch.nanmean(total).item(), "reward_std": nanstd(total).item(),
               "frac_reward_zero_std": torch.isclose(group_std, torch.zeros_like(group_std)).float().mean().item()}  # fmt: skip
    for i, name in enumerate(trainer.reward_func_names):
        figures[f"rewards/{name}/mean"] = torch.nanmean(per_func[:, i]).item()
        figures[f"rewards/{name}/std"] = nanstd(per_func[:, i]).item()
    metrics = trainer._metrics["train"]
    for key, value in figures.items():
        rounds = metrics[key][logged.get(key, 0) :]
        if not rounds:
            continue
        del metrics[key][logged.get(key, 0) :]
        metrics[key].append(value)
        metrics[f"dynamic_sampling/all_rounds/{key}"].append(sum(rounds) / len(rounds))


def extra_prompts(trainer, groups: int, extra: int) -> list[dict[str, Any]]:
    """``groups`` rows of the training set drawn for an extra round of dynamic sampling, each ``num_generations``
    times: drawn from the seed, the step, the generation within the step, the round and the rank, so a resumed
    run draws the same. A step may hold several generations (``steps_per_generation × num_iterations`` below
    ``gradient_accumulation_steps``): TRL's micro-step counter ``_step`` (0 at a step's start, also after a
    resume) tells them apart, or each would draw the same refill rows."""
    dataset = trainer.train_dataset
    accumulation = getattr(trainer, "current_gradient_accumulation_steps", trainer.args.gradient_accumulation_steps)
    within = trainer._step % accumulation  # TRL's count of training_step calls (tests/test_trl_contract.py)
    seed = [trainer.args.seed, trainer.state.global_step, within, extra, trainer.accelerator.process_index]
    picks = np.random.default_rng(seed).choice(len(dataset), size=groups, replace=len(dataset) < groups)
    return [dict(row) for row in (dataset[int(i)] for i in picks) for _ in range(trainer.num_generations)]


def note_group_signals(trainer, rewards: torch.Tensor, inputs: list[dict]) -> None:
    """After a training batch's rewards (dynamic sampling): each group's reward std (over ranks), the rewards kept for
    the step's figures, and completions.csv's ``group_signal`` column."""
    trainer._group_std = group_reward_std(rewards, trainer.reward_weights, trainer.num_generations)
    trainer._round_rewards = rewards.detach().cpu()
    # completions.csv's group_signal: 1 where the row's group has a reward signal (kept, unless the batch
    # already had its groups), 0 where dynamic sampling drops it; this rank's rows, in order
    signal = trainer.dynamic_sampling.kept(trainer._group_std.cpu()).repeat_interleave(trainer.num_generations)
    start = trainer.accelerator.process_index * len(inputs)
    trainer._log_completion_extra("group_signal", [int(v) for v in signal[start : start + len(inputs)]])
