"""Micro-batches cut by tokens (``max_tokens_per_micro_batch``; docs/padding_free.md, "Micro-batches cut by tokens").

TRL cuts each rank's generation batch into ``steps_per_generation`` micro-batches of the same number of rows, and each
training pass computes a micro-batch (the loss) or ``per_device_train_batch_size`` rows (old log-probs, reference)
in one model call, however long its rows are. With a token budget:

- :func:`split_by_tokens` (TRL's ``split_tensor_dict`` while :func:`splitting_by_tokens` is on): the micro-batches
  hold about the same number of real tokens rather than of rows (whole groups kept together where vision reuse
  wants them), each marked with the rows a micro-batch of TRL's would hold (:data:`NOMINAL_ROWS`);
- :func:`loss_in_passes` (``_compute_loss``): a micro-batch over the budget is computed in the fewest passes of at most
  that many tokens (the same number on every rank: the loss pass's metrics are collective, as ZeRO-3's weights are),
  each pass's loss scaled by :func:`loss_share` so that their sum is the loss TRL computes for the micro-batch, and
  back-propagated at once (:func:`backward_now`, its gradients accumulated as the next micro-step's are): the
  activations of one pass at a time;
- :func:`per_token_logps_by_tokens` (``_get_per_token_logps_and_entropies`` with a chunk size: the old-log-prob and
  reference passes): the rows in order, in runs of at most the budget's tokens instead of TRL's fixed rows.

Each loss type's update is TRL's for the same rows (tests/test_token_budget.py, float64): ``grpo``, ``sapo``,
``dr_grpo`` and ``luspo`` average over a micro-batch's rows (share: the pass's rows over TRL's micro-batch rows), ``dapo``,
``cispo`` and ``vespo`` divide by the generation batch's tokens (share 1), ``bnpo`` by its micro-batch's tokens
(share: the pass's over the micro-batch's) - so ``bnpo``'s update depends on which rows share a micro-batch, in TRL as
here, where the micro-batches are balanced by tokens rather than by rows. An entropy bonus and
``top_entropy_quantile`` are computed over a whole micro-batch: not with a budget (:func:`budget_refusal`). A MoE's
router aux loss is computed per pass and weighted by the pass's share (refused with the global losses, whose share
is 1). Where the passes run padded, a row weighs the batch's width (:func:`row_tokens`).

The arithmetic, on each row's real tokens (:func:`balanced_parts`, :func:`fewest_parts`, :func:`contiguous_runs`):

>>> balanced_parts([5, 1, 4, 2, 3, 3], 2)
[[0, 1, 5], [2, 3, 4]]
>>> fewest_parts([5, 1, 4, 2, 3, 3], 9)
2
>>> contiguous_runs([5, 1, 4, 2, 3, 3], 6, parts=3)
[[0, 1], [2, 3], [4, 5]]

Contract tests (tests/test_trl_contract.py): ``test_split_tensor_dict_cuts_the_shuffled_generation_batch``,
``test_training_step_divides_the_loss_by_the_accumulation_steps``, ``test_accelerate_gradient_state_sets_sync``.
"""

from __future__ import annotations

import heapq
import logging
import math
from collections.abc import Sequence
from contextlib import contextmanager
from typing import Any

import torch

from suzak import SuzakError
from suzak.trl_internals.rounds import rows_at

__all__ = [
    "NOMINAL_ROWS",
    "passes_of",
    "balanced_parts",
    "contiguous_runs",
    "fewest_parts",
    "grouped",
    "backward_now",
    "budget_refusal",
    "loss_in_passes",
    "loss_share",
    "per_token_logps_by_tokens",
    "row_tokens",
    "select_rows",
    "split_by_tokens",
    "splitting_by_tokens",
]

logger = logging.getLogger(__name__)

NOMINAL_ROWS = "suzak_nominal_rows"  # a micro-batch's 0-d tensor: the rows TRL's equal split would give it
ROW_MEAN_LOSSES = ("grpo", "sapo", "dr_grpo", "luspo")  # a micro-batch's loss is a mean (or a sum / rows) over rows
GLOBAL_LOSSES = ("dapo", "cispo", "vespo")  # divided by the generation batch's tokens (num_items_in_batch)
TOKEN_MEAN_LOSSES = ("bnpo",)  # divided by the micro-batch's tokens


# --- the arithmetic: rows (or whole groups) dealt into passes by their real tokens ----------------------------------


def grouped(tokens: Sequence[int], size: int) -> list[list[int]]:
    """The rows as units: runs of ``size`` consecutive rows (whole groups) where the rows are whole groups, else one
    row a unit.

    >>> grouped([1, 2, 3, 4], 2), grouped([1, 2, 3], 2)
    ([[0, 1], [2, 3]], [[0], [1], [2]])
    """
    count = len(tokens)
    if size > 1 and count % size == 0:
        return [list(range(start, start + size)) for start in range(0, count, size)]
    return [[row] for row in range(count)]


def balanced_parts(weights: Sequence[int], parts: int) -> list[list[int]]:
    """``weights``' indices dealt into ``parts`` parts, heaviest first, each to the lightest part so far (ties: the
    lower part); each part's indices in increasing order, parts ordered by their first index. Empty parts are left
    out (fewer units than parts)."""
    if parts < 1:
        raise ValueError(f"parts {parts} must be >= 1")
    order = sorted(range(len(weights)), key=lambda i: (-weights[i], i))
    heap = [(0, part) for part in range(parts)]
    dealt: list[list[int]] = [[] for _ in range(parts)]
    for index in order:
        load, part = heapq.heappop(heap)
        dealt[part].append(index)
        heapq.heappush(heap, (load + weights[index], part))
    return sorted((sorted(part) for part in dealt if part), key=lambda part: part[0])


def fewest_parts(weights: Sequence[int], budget: int) -> int:
    """The fewest parts :func:`balanced_parts` deals ``weights`` into with none over ``budget`` (a part holding a
    single unit may be: it cannot be cut)."""
    if budget < 1:
        raise ValueError(f"budget {budget} must be >= 1")
    if not weights:
        return 1
    over = [w for w in weights if w > budget]  # each a part of its own; the rest need at least their sum's parts
    parts = min(len(weights), max(1, len(over) + math.ceil((sum(weights) - sum(over)) / budget)))
    while parts < len(weights):
        dealt = balanced_parts(weights, parts)
        if all(len(part) == 1 or sum(weights[i] for i in part) <= budget for part in dealt):
            return parts
        parts += 1
    return len(weights)


def contiguous_runs(tokens: Sequence[int], budget: int, parts: int | None = None) -> list[list[int]]:
    """The rows in order, cut into runs of at most ``budget`` tokens (a row over it alone); with ``parts``, cut further
    (the heaviest run of two or more rows halved by tokens) until there are that many runs, or one row each (every
    rank of a ZeRO-3 run makes the same number of model calls)."""
    if budget < 1:
        raise ValueError(f"budget {budget} must be >= 1")
    runs: list[list[int]] = []
    load = 0
    for row, count in enumerate(tokens):
        if runs and load + count <= budget:
            runs[-1].append(row)
            load += count
        else:
            runs.append([row])
            load = count
    while parts is not None and len(runs) < parts:
        splittable = [i for i, run in enumerate(runs) if len(run) > 1]
        if not splittable:
            break
        heaviest = max(splittable, key=lambda i: sum(tokens[row] for row in runs[i]))
        run = runs[heaviest]
        half, cut = sum(tokens[row] for row in run) / 2, 1
        while cut < len(run) - 1 and sum(tokens[row] for row in run[: cut + 1]) <= half:
            cut += 1
        runs[heaviest : heaviest + 1] = [run[:cut], run[cut:]]
    return runs


# --- TRL's micro-batches ------------------------------------------------------------------------------------------


def budget_refusal(trainer) -> str | None:
    """Why this run's loss cannot be cut into passes exactly (the run then stops before step 1), or None."""
    if trainer.loss_type not in (*ROW_MEAN_LOSSES, *GLOBAL_LOSSES, *TOKEN_MEAN_LOSSES):
        return f"loss_type {trainer.loss_type!r} has no known per-pass share"
    if trainer.entropy_coef != 0.0 or trainer.use_adaptive_entropy:
        return "the entropy bonus (entropy_coef, use_adaptive_entropy) is a mean over a whole micro-batch's tokens"
    if trainer.top_entropy_quantile < 1.0:
        return "top_entropy_quantile < 1 takes its quantile over a whole micro-batch"
    if trainer.aux_loss_enabled and trainer.loss_type in GLOBAL_LOSSES:
        return (f"the router's aux loss (output_router_logits) would count once a pass with loss_type "
                f"{trainer.loss_type} (each pass's share is 1): set router_aux_loss_coef 0, or a grpo-type loss")  # fmt: skip
    return None


def row_tokens(batch: dict[str, Any], padded: bool = False) -> list[int]:
    """Each row's tokens as a pass computes them: its real tokens (prompt with its visual tokens, completion with its
    tool turns) when the passes are packed (``padding_free``); the batch's whole width when they run ``padded``
    (every row of a padded call is computed at the width of the generation batch)."""
    if padded:
        width = batch["prompt_mask"].shape[1] + batch["completion_mask"].shape[1]
        return [int(width)] * batch["prompt_mask"].shape[0]
    return (batch["prompt_mask"].sum(1) + batch["completion_mask"].sum(1)).tolist()


def select_rows(batch: dict[str, Any], index: list[int]) -> dict[str, Any]:
    """The rows ``index`` of a micro-batch as the loss pass takes it (pixel values joined): split by TRL's
    ``split_pixel_values_by_grid``, selected, joined again."""
    from trl.trainer.utils import split_pixel_values_by_grid, unsplit_pixel_values_by_grid

    present = {key: value for key, value in batch.items() if value is not None}
    split = split_pixel_values_by_grid(present)
    chosen = {key: rows_at(value, index) for key, value in split.items()}
    return {**dict.fromkeys(batch), **unsplit_pixel_values_by_grid(chosen)}


def split_by_tokens(batch: dict[str, Any], chunks: int, group_size: int = 1, window: int = 1,
                    padded: bool = False) -> list[dict[str, Any]]:  # fmt: skip
    """TRL's ``split_tensor_dict(batch, chunks)`` (``batch`` shuffled, pixel values split per row), by tokens: the
    rows (whole groups of ``group_size`` where the batch is whole groups; weighed by :func:`row_tokens`) dealt into
    ``chunks`` micro-batches of about the same tokens (:func:`balanced_parts`), each in the shuffled order, each with
    :data:`NOMINAL_ROWS`. The micro-batches of one optimizer step (``window``: the accumulation steps) share TRL's
    rows of that step: the batch is cut into windows of equal rows first (in TRL's order), the rows dealt within each,
    so every optimizer step averages over as many rows as TRL's. Fewer units than micro-batches: TRL's split."""
    from trl.trainer.utils import split_tensor_dict

    tokens = row_tokens(batch, padded)
    rows = len(tokens)
    nominal = torch.tensor(float(rows // chunks))
    units = grouped(tokens, group_size)
    windows = chunks // window if window > 0 and chunks % window == 0 and len(units) % (chunks // window) == 0 else 1
    per_window, steps = len(units) // windows, chunks // windows
    if per_window < steps:
        return [{**part, NOMINAL_ROWS: nominal} for part in split_tensor_dict(batch, chunks)]
    out = []
    for first in range(0, len(units), per_window):
        mine = units[first : first + per_window]
        for part in balanced_parts([sum(tokens[row] for row in unit) for unit in mine], steps):
            index = [row for unit in part for row in mine[unit]]
            out.append({**{key: rows_at(value, index) for key, value in batch.items()}, NOMINAL_ROWS: nominal})
    return out


@contextmanager
def splitting_by_tokens(group_size: int, window: int = 1, padded: bool = False):
    """While TRL prepares a generation batch, its cut into micro-batches is :func:`split_by_tokens`."""
    from trl.trainer import grpo_trainer

    trls = grpo_trainer.split_tensor_dict
    grpo_trainer.split_tensor_dict = lambda batch, chunks: split_by_tokens(batch, chunks, group_size, window, padded)
    try:
        yield
    finally:
        grpo_trainer.split_tensor_dict = trls


def _mask(batch: dict[str, Any]) -> torch.Tensor:
    mask = batch["completion_mask"]
    return mask * batch["tool_mask"] if batch.get("tool_mask") is not None else mask


def loss_share(loss_type: str, rows: int, nominal_rows: float, tokens: float, batch_tokens: float) -> float:
    """The factor on TRL's loss of a pass of ``rows`` rows (``tokens`` loss tokens) so that the passes of a micro-batch
    (``batch_tokens`` loss tokens; TRL's equal split gives a micro-batch ``nominal_rows`` rows) sum to TRL's loss.

    >>> loss_share("grpo", 3, 4, 30, 50), loss_share("bnpo", 3, 4, 30, 50), loss_share("dapo", 3, 4, 30, 50)
    (0.75, 0.6, 1.0)
    """
    if loss_type in ROW_MEAN_LOSSES:
        return rows / nominal_rows
    if loss_type in TOKEN_MEAN_LOSSES:
        return max(tokens, 1.0) / max(batch_tokens, 1.0) if batch_tokens else 1.0
    if loss_type in GLOBAL_LOSSES:
        return 1.0
    raise SuzakError(f"max_tokens_per_micro_batch: loss_type {loss_type!r} has no known per-pass share")


@contextmanager
def _without_sync(trainer, model):
    """A pass whose gradients accumulate without an optimizer step or a gradient all-reduce (DDP's ``no_sync``;
    accelerate's ``sync_gradients`` off, which DeepSpeed's engine reads as "not a boundary")."""
    state = trainer.accelerator.gradient_state
    synced = state.sync_gradients
    state._set_sync_gradients(False)
    try:
        with trainer.accelerator.no_sync(model):
            yield
    finally:
        state._set_sync_gradients(synced)


def backward_now(trainer, loss: torch.Tensor) -> None:
    """Back-propagate a pass's ``loss`` as transformers' ``Trainer.training_step`` back-propagates the loss
    ``compute_loss`` returns: divided by the accumulation steps unless the trainer scales it itself (TRL's GRPO does:
    ``loss_is_scaled_for_ga``, read as a non-None ``compute_loss_func`` before transformers 5.19; GRPO's batches
    carry no labels, so the Trainer's ``num_items_in_batch`` is None), DeepSpeed's engine told not to divide again."""
    scaled = trainer.compute_loss_func is not None or bool(getattr(trainer, "loss_is_scaled_for_ga", False))
    if not scaled:
        loss = loss / trainer.current_gradient_accumulation_steps
    kwargs = {"scale_wrt_gas": False} if trainer.is_deepspeed_enabled else {}
    trainer.accelerator.backward(loss, **kwargs)


def _passes_over_ranks(trainer, passes: int) -> int:
    """The most passes any rank needs: every rank makes as many (collectives in each pass)."""
    if trainer.accelerator.num_processes == 1:
        return passes
    count = torch.tensor([passes], device=trainer.accelerator.device)
    return int(trainer.accelerator.gather(count).max().item())


def passes_of(tokens: Sequence[int], budget: int, group_size: int = 1, at_least: int = 1) -> list[list[int]]:
    """The rows of each pass of a micro-batch whose rows weigh ``tokens``: whole groups of ``group_size`` (rows where
    a group is over the budget, or where ``at_least`` asks for more passes than there are groups) dealt into the
    fewest passes of at most ``budget`` tokens (:func:`fewest_parts`; a row over it alone), or ``at_least`` passes
    (as many as the rows allow).

    >>> passes_of([5, 5, 5, 5], 10, group_size=2), passes_of([5, 5, 5, 5], 10, group_size=2, at_least=3)
    ([[0, 1], [2, 3]], [[0, 3], [1], [2]])
    """
    units = grouped(tokens, group_size)
    if any(sum(tokens[row] for row in unit) > budget for unit in units):
        units = grouped(tokens, 1)  # a group over the budget: its rows go to separate passes
    weights = [sum(tokens[row] for row in unit) for unit in units]
    count = max(fewest_parts(weights, budget), at_least)
    if count > len(units):  # more passes than groups: go by rows
        units, weights = grouped(tokens, 1), list(tokens)
    return [[row for unit in part for row in units[unit]] for part in balanced_parts(weights, min(count, len(units)))]


def loss_in_passes(trainer, compute, model, inputs: dict[str, Any], budget: int, group_size: int = 1,
                   padded: bool = False):  # fmt: skip
    """TRL's loss of a micro-batch (``compute(model, inputs)``: ``_compute_loss``) in the fewest passes of at most
    ``budget`` real tokens, the same number on every rank; every pass but the last back-propagated here, the last's
    loss returned for the Trainer to back-propagate (with the others' values added, detached, for its logged loss).
    Each pass's loss is scaled by :func:`loss_share`. A rank with fewer rows than the passes another rank needs
    makes the extra passes on its first row at weight 0 (no gradient; the pass's metrics are logged as TRL's).
    ``padded``: the passes compute every row at the batch's width, which is what the budget then counts."""
    tokens = row_tokens(inputs, padded)
    nominal = float(inputs.get(NOMINAL_ROWS, torch.tensor(float(len(tokens)))))
    mine = passes_of(tokens, budget, group_size)
    passes = _passes_over_ranks(trainer, len(mine))
    parts: list[list[int] | None] = passes_of(tokens, budget, group_size, passes) if passes > len(mine) else mine
    parts += [None] * (passes - len(parts))
    loss_type = trainer.loss_type
    batch_tokens = float(_mask(inputs).sum())
    done, loss = None, None
    for number, index in enumerate(parts):
        rows = inputs if len(parts) == 1 else select_rows(inputs, index or [0])
        share = 0.0 if index is None else loss_share(loss_type, len(index), nominal, float(_mask(rows).sum()),
                                                     batch_tokens)  # fmt: skip
        if number == len(parts) - 1:
            loss = compute(model, rows)
            loss = loss * share if share != 1.0 else loss
            break
        with _without_sync(trainer, model):
            loss = compute(model, rows) * share
            backward_now(trainer, loss)
        done = loss.detach() if done is None else done + loss.detach()
    return loss if done is None else loss + done


def per_token_logps_by_tokens(trainer, compute, input_ids, attention_mask, budget: int, fields: dict[str, Any],
                              video_rows: list | None, padded: bool = False):  # fmt: skip
    """TRL's ``_get_per_token_logps_and_entropies`` over the rows in order, in runs of at most ``budget`` real tokens
    (:func:`contiguous_runs`; every rank the same number of runs, a rank with too few rows calling its first row
    again and dropping the output), each run one call of ``compute(input_ids, attention_mask, fields, video_rows)``;
    the outputs joined in row order. ``padded``: every row weighs the batch's width (what a padded call computes)."""
    tokens = [attention_mask.shape[1]] * attention_mask.shape[0] if padded else attention_mask.sum(1).tolist()
    runs = contiguous_runs(tokens, budget)
    passes = _passes_over_ranks(trainer, len(runs))
    if passes > len(runs):
        runs = contiguous_runs(tokens, budget, parts=passes)
    calls: list[list[int] | None] = [*runs, *[None] * (passes - len(runs))]
    batch = {"input_ids": input_ids, "attention_mask": attention_mask, **fields}
    logps, entropies, aux = [], [], []
    for run in calls:
        rows = batch if len(calls) == 1 else select_rows(batch, run or [0])
        videos = [video_rows[i] for i in (run or [0])] if video_rows is not None else None
        rows = dict(rows)
        out = compute(rows.pop("input_ids"), rows.pop("attention_mask"), rows, videos)
        if run is None:
            continue
        logps.append(out[0])
        if out[1] is not None:
            entropies.append(out[1])
        if out[2] is not None:
            aux.append(out[2])
    return (torch.cat(logps), torch.cat(entropies) if entropies else None,
            torch.stack(aux).mean() if aux else None)  # fmt: skip
