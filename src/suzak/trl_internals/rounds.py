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

from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from trl.trainer.utils import nanstd, split_pixel_values_by_grid, unsplit_pixel_values_by_grid

from suzak import SuzakError
from suzak.trl_internals.video import VIDEO_FIELDS


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

    def permuted(value: Any) -> Any:
        if value is None or (isinstance(value, torch.Tensor) and value.ndim == 0):
            return value
        if isinstance(value, torch.Tensor):
            return value[permutation]
        return [value[i] for i in permutation]

    return {key: permuted(value) for key, value in batch.items()}


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
