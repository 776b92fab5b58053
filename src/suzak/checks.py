"""Checks before step 1: what would otherwise fail, or silently train on the wrong thing, hours into a run.

- :func:`preflight`: every reward scores 1.0 on the ideal completion of a few rows (the gold answer rendered in the
  recipe's answer format); a parser/format mismatch, the usual cause of "reward stuck at 0", stops the run;
- :func:`check_vllm_bounds`: vLLM resizes images into the bounds of the processor saved in the model folder, so a
  pixel budget outside them would give vLLM other image sizes than training;
- :func:`precheck`: visual tokens and prompt lengths over a sample of the dataset, with a warning when prompt +
  completion would not fit the model's context.

>>> from suzak.rewards import clevr_count, think_format
>>> rows = [{"prompt": [{"role": "user", "content": "How many?"}], "solution": "<answer> 3 </answer>"}]
>>> preflight(rows, [clevr_count, think_format], "think_answer")
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import math
import statistics
from collections.abc import Callable, Iterable
from typing import Any

from suzak import SuzakError
from suzak.parsing import gold_answer
from suzak.prompts import render_answer
from suzak.trl_internals import reward_call_kwargs
from suzak.vision import PixelBudget, images_of, processor_bounds, prompt_tokens

__all__ = ["check_vllm_bounds", "precheck", "preflight"]

logger = logging.getLogger(__name__)


def preflight(
    dataset: Iterable[dict],
    reward_funcs: list[Callable],
    answer_format: str,
    *,
    num_rows: int = 8,
    reward_weights: list[float] | None = None,
) -> None:
    """Check that every reward gives 1.0 to the ideal completion of the first ``num_rows`` rows, before training.

    The ideal completion is ``render_answer(answer_format, gold)``. Each reward is called as GRPOTrainer calls it
    (every dataset column as a keyword list), with plain-string and with conversational completions. A reward with
    weight 0 is skipped. A mismatch between rewards and prompt template otherwise shows up only as a flat reward
    curve hours later; here it raises ``SuzakError`` at once.

    >>> from suzak.rewards import clevr_count, think_format
    >>> rows = [{"prompt": [{"role": "user", "content": "How many?"}], "solution": "<answer> 3 </answer>"}]
    >>> preflight(rows, [clevr_count, think_format], "think_answer")
    >>> preflight(rows, [clevr_count], "gsm8k_hash")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    suzak.SuzakError: reward pre-flight failed: reward 'clevr_count' returned 0.0 (expected 1.0) ...
    """
    rows = _head_rows(dataset, num_rows)
    ideals = _ideal_completions(rows, answer_format)
    weights = [1.0] * len(reward_funcs) if reward_weights is None else list(reward_weights)
    if len(weights) != len(reward_funcs):
        raise SuzakError(f"{len(weights)} reward weights for {len(reward_funcs)} reward functions")
    checked = [f for f, w in zip(reward_funcs, weights, strict=True) if w != 0]
    for func in checked:
        for form in ("plain", "conversational"):
            _check_reward(func, rows, ideals, form, answer_format)
    logger.info(
        "reward pre-flight passed: %s give 1.0 to the ideal %r completion of %d rows (plain and conversational)",
        ", ".join(_name(f) for f in checked) or "(no weighted rewards)",
        answer_format,
        len(rows),
    )


def _head_rows(dataset: Iterable[dict], num_rows: int) -> list[dict]:
    rows = list(itertools.islice(iter(dataset), num_rows))
    if not rows:
        raise SuzakError("reward pre-flight: the dataset has no rows")
    missing = {"prompt", "solution"} - set(rows[0])
    if missing:
        raise SuzakError(f"reward pre-flight: the dataset lacks the column(s) {', '.join(sorted(missing))}")
    return rows


def _ideal_completions(rows: list[dict], answer_format: str) -> list[str]:
    ideals = []
    for i, row in enumerate(rows):
        try:
            ideals.append(render_answer(answer_format, gold_answer(row["solution"])))
        except (ValueError, TypeError) as exc:
            raise SuzakError(f"reward pre-flight: row {i} (solution {row['solution']!r:.200}): {exc}") from exc
    return ideals


def _check_reward(func: Callable, rows: list[dict], ideals: list[str], form: str, answer_format: str) -> None:
    """Raise ``SuzakError`` unless ``func`` scores every ideal completion (in ``form``) 1.0."""
    completions = ideals if form == "plain" else [[{"role": "assistant", "content": t}] for t in ideals]
    rewards = _call_reward(func, rows, completions, form)
    failed = [i for i, r in enumerate(rewards) if r is None or not math.isclose(r, 1.0)]
    if failed:
        i = failed[0]
        raise SuzakError(
            f"reward pre-flight failed: reward {_name(func)!r} returned {rewards[i]!r} (expected 1.0) for row {i}"
            f" ({len(failed)} of {len(rows)} rows failed) with {form} completions; gold {rows[i]['solution']!r:.200},"
            f" ideal completion {ideals[i]!r:.300} (answer format {answer_format!r}): the reward and the answer"
            " format / prompt template disagree."
        )


def _call_reward(func: Callable, rows: list[dict], completions: list, form: str) -> list:
    """Call ``func`` as GRPOTrainer's ``_calculate_rewards`` does (:func:`suzak.trl_internals.reward_call_kwargs`)."""
    try:
        rewards = func(**reward_call_kwargs(rows, completions, _discard))
        if inspect.isawaitable(rewards):
            rewards = asyncio.run(rewards)
    except Exception as exc:
        raise SuzakError(f"reward pre-flight: reward {_name(func)!r} raised on {form} completions: {exc}") from exc
    if len(rewards) != len(rows):
        raise SuzakError(f"reward pre-flight: {_name(func)!r} returned {len(rewards)} values for {len(rows)} rows")
    return rewards


def _discard(*args, **kwargs) -> None:
    """Stands in for TRL's ``log_extra``/``log_metric`` during the pre-flight."""


def _name(func: Callable) -> str:
    return getattr(func, "__name__", type(func).__name__)


def check_vllm_bounds(model_path: str, budget: PixelBudget, *, server: bool = False) -> None:
    """Stop before step 1 when vLLM would resize the images the trainer fitted to ``budget``.

    TRL starts vLLM on the model's folder with no processor settings, so vLLM resizes images into the bounds of the
    processor config saved there (Qwen's Hub checkpoints: 3136..12845056 pixels). A budget reaching past them makes
    vLLM generate from an image of another size than the one trained on, without an error (seen with vLLM 0.24:
    tests/test_vllm_boundary.py).
    """
    from transformers import AutoProcessor

    try:
        bounds = processor_bounds(AutoProcessor.from_pretrained(model_path))
    except (OSError, ValueError) as error:
        logger.warning("use_vllm: cannot read vLLM's processor bounds from %s (%s); not checked", model_path, error)
        return
    if bounds is None or budget.within(*bounds):
        return
    raise SuzakError(
        f"use_vllm: vLLM resizes images into {bounds[0]}..{bounds[1]} pixels (the processor config saved in "
        f"{model_path}) but the pixel budget is {budget.min_pixels}..{budget.max_pixels}: vLLM would generate from "
        f"other image sizes than training uses. Set min_pixels >= {bounds[0]} and max_pixels <= {bounds[1]}, or "
        "save the model's processor with the budget's bounds"
        + (" (and start the vLLM server on that folder)" if server else "")
    )


def precheck(
    dataset,
    processing_class: Any,
    budget: PixelBudget,
    *,
    max_completion_length: int = 0,
    context_length: int | None = None,
    num_rows: int | None = 256,
) -> dict[str, Any]:
    """Visual tokens and prompt length over (a sample of) a dataset, with a warning when prompts won't fit.

    Prompt length = text tokens of the chat-templated prompt (one placeholder per image) + visual tokens.
    Returns ``{"rows", "visual_tokens": {min, mean, max}, "prompt_tokens": {min, mean, max}, "too_long"}``.
    """
    tokenizer = getattr(processing_class, "tokenizer", processing_class)
    n = len(dataset) if num_rows is None else min(num_rows, len(dataset))
    visual, prompt_lengths, too_long = [], [], []
    for index in range(n):
        row = dataset[index]
        images = images_of(row)
        text = tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
        length = prompt_tokens(tokenizer, text, images, budget)
        visual.append(sum(budget.tokens(img.height, img.width) for img in images))
        prompt_lengths.append(length)
        if context_length is not None and length + max_completion_length > context_length:
            too_long.append(index)
    report = {
        "rows": n,
        "visual_tokens": _summary(visual),
        "prompt_tokens": _summary(prompt_lengths),
        "too_long": too_long,
    }
    logger.info(
        "pre-check over %d rows: visual tokens/prompt min %d mean %.1f max %d; prompt tokens min %d mean %.1f max %d",
        n, *report["visual_tokens"].values(), *report["prompt_tokens"].values(),
    )  # fmt: skip
    if too_long:
        logger.warning(
            "%d of %d prompts + %d completion tokens exceed the model's context of %s tokens (first rows: %s); "
            "lower max_pixels or max_completion_length, or filter those rows",
            len(too_long), n, max_completion_length, context_length, too_long[:5],
        )  # fmt: skip
    return report


def _summary(values: list[int]) -> dict[str, float]:
    if not values:
        return {"min": 0, "mean": 0.0, "max": 0}
    return {"min": min(values), "mean": statistics.fmean(values), "max": max(values)}
