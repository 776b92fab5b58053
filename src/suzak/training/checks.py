"""Checks before step 1: what would otherwise fail, or silently train on the wrong thing, hours into a run.

- :func:`preflight`: every reward scores 1.0 on the ideal completion of a few rows (the gold answer rendered in the
  recipe's answer format); a parser/format mismatch, the usual cause of "reward stuck at 0", stops the run;
- :func:`check_answer_opening`: a chat template that opens the answer format's first tag in the prompt (Qwen3.5's
  thinking mode opens ``<think>``) would leave every completion without it, and its format reward at 0;
- :func:`check_vllm_bounds`: vLLM resizes images into the bounds of the processor saved in the model folder, so a
  pixel budget outside them would give vLLM other image sizes than training;
- :func:`precheck`: visual tokens and prompt lengths over a sample of the dataset, with a warning when prompt +
  completion would not fit the model's context;
- :func:`validate_rows`: every row of the dataset, on all cores: each image opens, decodes to the last byte, converts
  and fits the budget; each gold answer parses for every reward that reads one (:func:`suzak.scoring.rewards.gold_parser`).

>>> from suzak.scoring.rewards import clevr_count, think_format
>>> rows = [{"prompt": [{"role": "user", "content": "How many?"}], "solution": "<answer> 3 </answer>"}]
>>> preflight(rows, [clevr_count, think_format], "think_answer")
"""

from __future__ import annotations

import asyncio
import inspect
import io
import itertools
import logging
import math
import os
import re
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from PIL import Image

from suzak import SuzakError
from suzak.media.boxes import QUESTION_BOXES_COLUMN, box_problem, model_answer, question_boxes_of
from suzak.media.video import VIDEO_COLUMN, VideoBudget, row_clip, video_problem
from suzak.media.vision import (
    PIXEL_BUDGET_COLUMN,
    PixelBudget,
    image_columns,
    images_of,
    processor_bounds,
    prompt_tokens,
    to_rgb,
)
from suzak.scoring.judge import judge_settings
from suzak.scoring.parsing import gold_answer, gold_boxes
from suzak.scoring.prompts import after_opening, render_answer, template_opening
from suzak.scoring.rewards import bound_kwargs, is_judge, reads_rollout
from suzak.trl_internals.rewards import reward_call_kwargs, reward_name

__all__ = ["RowProblem", "check_answer_opening", "check_vllm_bounds", "precheck", "preflight", "validate_rows"]

logger = logging.getLogger(__name__)


def preflight(
    dataset: Iterable[dict],
    reward_funcs: list[Callable],
    answer_format: str,
    *,
    num_rows: int = 8,
    reward_weights: list[float] | None = None,
    opening: str = "",
) -> None:
    """Check that every reward gives 1.0 to the ideal completion of the first ``num_rows`` rows, before training.

    The ideal completion is ``render_answer(answer_format, gold)``. Each reward is called as GRPOTrainer calls it
    (every dataset column as a keyword list), with plain-string and with conversational completions. A reward with
    weight 0 is skipped. A mismatch between rewards and prompt template otherwise shows up only as a flat reward
    curve hours later; here it raises ``SuzakError`` at once. A reward of the rollout rather than the answer
    (:func:`suzak.scoring.rewards.reads_rollout`: ``zoom_used``, or one that takes TRL's ``environments``, e.g. an
    episode's own reward) is skipped. ``opening``: the chat template's opening of the
    assistant turn that the rewards read each completion after (``opening_in_completion``); the completions checked
    are then what the model writes after it (:func:`suzak.scoring.prompts.after_opening`).

    >>> from suzak.scoring.rewards import clevr_count, think_format
    >>> rows = [{"prompt": [{"role": "user", "content": "How many?"}], "solution": "<answer> 3 </answer>"}]
    >>> preflight(rows, [clevr_count, think_format], "think_answer")
    >>> preflight(rows, [clevr_count], "gsm8k_hash")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    suzak.SuzakError: reward pre-flight failed: reward 'clevr_count' returned 0.0 (expected 1.0) ...
    """
    weights = [1.0] * len(reward_funcs) if reward_weights is None else list(reward_weights)
    if len(weights) != len(reward_funcs):
        raise SuzakError(f"{len(weights)} reward weights for {len(reward_funcs)} reward functions")
    checked = [f for f, w in zip(reward_funcs, weights, strict=True) if w != 0 and not reads_rollout(f)]
    if not checked:  # an environment scores the rollouts (an episode's reward): no answer to check
        return
    if checked and all(is_judge(f) for f in checked) and not _has_gold(dataset):
        logger.info("reward pre-flight skipped: the rows have no gold answer (solution) to tell the judge's right "
                    "answer from a wrong one with (its settings were checked before the weights load)")  # fmt: skip
        return
    rows = _head_rows(dataset, num_rows)
    ideals = [after_opening(ideal, opening) for ideal in _ideal_completions(rows, answer_format)]
    for func in checked:
        if is_judge(func):
            _check_judge(func, rows, ideals, answer_format, opening)
            continue
        for form in ("plain", "conversational"):
            _check_reward(func, rows, ideals, form, answer_format)
    logger.info(
        "reward pre-flight passed: %s give 1.0 to the ideal %r completion of %d rows (plain and conversational)",
        ", ".join(reward_name(f) for f in checked) or "(no weighted rewards)",
        answer_format,
        len(rows),
    )


def _has_gold(dataset) -> bool:
    """Whether the rows carry gold answers: a ``solution`` column whose first row has one (a reference-free judge's
    rows may have none: a JSONL file without them)."""
    first = next(iter(dataset), None)
    return first is not None and first.get("solution") is not None


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
            ideals.append(render_answer(answer_format, model_answer(row)))
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
            f"reward pre-flight failed: reward {reward_name(func)!r} returned {rewards[i]!r} (expected 1.0) for row {i}"
            f" ({len(failed)} of {len(rows)} rows failed) with {form} completions; gold {rows[i]['solution']!r:.200},"
            f" ideal completion {ideals[i]!r:.300} (answer format {answer_format!r}): the reward and the answer"
            " format / prompt template disagree."
        )


def _check_judge(func: Callable, rows: list[dict], ideals: list[str], answer_format: str, opening: str) -> None:
    """A judge scores an ideal answer with a probability, not 1.0: it must score each row's ideal completion above a
    wrong one (the next row's different gold answer, else "none") on more than half the rows, and above it on
    average; otherwise it does not tell right from wrong (a wrong model or URL, a prompt it does not follow) and
    the run stops before step 1."""
    golds = [model_answer(row) for row in rows]
    wrongs = []
    for i, gold in enumerate(golds):
        other = next((g for g in golds[i + 1 :] + golds[:i] if g != gold), "none")
        wrongs.append(after_opening(render_answer(answer_format, other), opening))
    conversational = [[{"role": "assistant", "content": text}] for text in ideals + wrongs]
    scores = _call_reward(func, rows + rows, conversational, "conversational")
    right, wrong = scores[: len(rows)], scores[len(rows) :]
    prefers = sum(r is not None and w is not None and r > w for r, w in zip(right, wrong, strict=True))
    mean = [sum(v for v in part if v is not None) / len(part) for part in (right, wrong)]
    where = judge_settings(bound_kwargs(func)).where  # its own, under read_after_opening too; the call checked them
    if prefers * 2 <= len(rows) or mean[0] <= mean[1]:
        raise SuzakError(
            f"judge pre-flight: {reward_name(func)!r} at {where} scored the right answer above a wrong one on "
            f"{prefers} of {len(rows)} rows (mean {mean[0]:.2f} against {mean[1]:.2f}): it does not tell them apart "
            "(check its base_url and model, and the prompt)"
        )
    logger.info("judge pre-flight passed: %s at %s prefers the right answer on %d of %d rows (mean %.2f against %.2f)",
                reward_name(func), where, prefers, len(rows), mean[0], mean[1])  # fmt: skip


def _call_reward(func: Callable, rows: list[dict], completions: list, form: str) -> list:
    """Call ``func`` as GRPOTrainer's ``_calculate_rewards`` does (:func:`suzak.trl_internals.rewards.reward_call_kwargs`)."""
    try:
        rewards = func(**reward_call_kwargs(rows, completions))
        if inspect.isawaitable(rewards):
            rewards = asyncio.run(rewards)
    except Exception as exc:
        raise SuzakError(
            f"reward pre-flight: reward {reward_name(func)!r} raised on {form} completions: {exc}"
        ) from exc
    if len(rewards) != len(rows):
        raise SuzakError(
            f"reward pre-flight: {reward_name(func)!r} returned {len(rewards)} values for {len(rows)} rows"
        )
    return rewards


def check_answer_opening(processing_class: Any, answer_format: str, chat_template_kwargs: dict | None = None) -> None:
    """Stop before step 1 when the chat template opens, at the end of every generation prompt, the tag the answer
    format's completions start with, and the run does not count that opening as part of each completion.

    Qwen3.5's template ends the prompt with ``<think>\\n`` (its thinking mode): the policy continues inside the
    thinking block and never writes ``<think>`` itself, so R1-V's ``think_answer`` format (``<think>…</think>
    <answer>…</answer>``, scored by ``think_format``) would score every completion 0, silently. Two ways out, per
    recipe: ``opening_in_completion: true`` (rewards and evaluation read each completion after the template's
    opening, :func:`suzak.scoring.prompts.template_opening`) or the template's own switch (``chat_template_kwargs:
    {enable_thinking: false}``). ``chat_template_kwargs`` are TRL's, applied as training applies them.
    """
    tag = re.match(r"\s*<([A-Za-z_][\w-]*)>", render_answer(answer_format, "1"))
    if tag is None:
        return
    opening = template_opening(processing_class, chat_template_kwargs)
    if opening.strip() == f"<{tag.group(1)}>":
        raise SuzakError(
            f"the model's chat template ends every generation prompt with <{tag.group(1)}> (Qwen3.5's thinking mode): "
            f"completions start inside it and never write <{tag.group(1)}> themselves, so the {answer_format!r} answer "
            f"format (prompt_template) would get a format reward of 0 for every completion. Set "
            f"opening_in_completion: true (the rewards and the evaluation read each completion after the template's "
            f"{opening!r}), or turn the template's thinking off with chat_template_kwargs: {{enable_thinking: false}}, "
            f"or use a prompt template whose answers do not open with <{tag.group(1)}> (e.g. plain)"
        )


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
    video_budget: VideoBudget | None = None,
) -> dict[str, Any]:
    """Visual tokens and prompt length over (a sample of) a dataset, with a warning when prompts won't fit.

    Prompt length = text tokens of the chat-templated prompt (one placeholder per image or video) + visual tokens (a
    video's: its clip read to ``video_budget``, as training reads it). Returns ``{"rows", "visual_tokens": {min,
    mean, max}, "video_tokens": {...}, "prompt_tokens": {...}, "too_long", "not_one_image", "longest_row"}``
    (``not_one_image``: rows with no image or several, what a zoom cannot crop; ``longest_row``: the longest prompt's). A video prompt that cannot fit the
    model's context with ``max_completion_length`` stops the run (one line naming the row): lower the video budget.
    """
    budget = budget.for_model(processing_class)  # the visual tokens of this model's patch grid
    tokenizer = getattr(processing_class, "tokenizer", processing_class)
    n = len(dataset) if num_rows is None else min(num_rows, len(dataset))
    videos = (video_budget or VideoBudget()).for_model(processing_class)
    visual, video_tokens, prompt_lengths, too_long = [], [], [], []
    not_one_image = 0
    for index in range(n):
        row = dataset[index]
        images = images_of(row)
        not_one_image += len(images) != 1
        text = tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
        own = budget.of_row(row)  # a mixture source's own bounds, where its rows carry them
        length = prompt_tokens(tokenizer, text, images, own)
        visual.append(sum(own.tokens(img.height, img.width) for img in images))
        clip = row_clip(row, videos)
        if clip is not None:
            frames, height, width, _ = clip.frames.shape
            video_tokens.append(videos.tokens(frames, height, width))
            length += video_tokens[-1] - 1
        prompt_lengths.append(length)
        if context_length is not None and length + max_completion_length > context_length:
            too_long.append(index)
            if clip is not None:
                raise SuzakError(f"row {index}: its prompt is {length} tokens ({video_tokens[-1]} of them video), "
                                 f"which with max_completion_length {max_completion_length} exceeds the model's context "
                                 f"of {context_length}: lower video_max_frames or video_max_pixels")  # fmt: skip
    report = {
        "rows": n,
        "visual_tokens": _summary(visual),
        "video_tokens": _summary(video_tokens),
        "prompt_tokens": _summary(prompt_lengths),
        "too_long": too_long,
        "not_one_image": not_one_image,
        "longest_row": max(range(n), key=prompt_lengths.__getitem__) if n else None,  # the longest prompt's row
    }
    logger.info(
        "pre-check over %d rows: visual tokens/prompt min %d mean %.1f max %d; prompt tokens min %d mean %.1f max %d",
        n, *report["visual_tokens"].values(), *report["prompt_tokens"].values(),
    )  # fmt: skip
    if video_tokens:
        logger.info("pre-check: %d of %d rows have a video: video tokens/prompt min %d mean %.1f max %d",
                    len(video_tokens), n, *report["video_tokens"].values())  # fmt: skip
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


# --- the whole dataset --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RowProblem:
    """Why one dataset row cannot be trained on: the row (and its source file's line), the column, the reason."""

    index: int
    line: int | None
    column: str
    reason: str
    image: str | None = None  # the image file, when the row names one

    def where(self, source: str) -> str:
        """``source line 12`` (a JSONL file's own line) or ``source row 12`` (the dataset's index)."""
        return f"{source} line {self.line}" if self.line is not None else f"{source} row {self.index}"


def validate_rows(dataset, budget: PixelBudget, gold_parsers: dict[str, Callable[[str], Any]] | None = None, *,
                  num_proc: int | None = None, family: str | None = None) -> list[RowProblem]:  # fmt: skip
    """Every row of a ``datasets.Dataset`` that would fail in training, in index order (empty: all rows are good).

    Images are read from the stored bytes or files themselves (not through datasets' decoding, which would raise
    out of the loop): opened, decoded to the last byte (a truncated PNG fails here, not at row 280 of step 40),
    converted to RGB and sized for ``budget`` (what :func:`suzak.media.vision.fit_image` does before resampling). ``gold_parsers`` (reward name -> parser of the gold answer) each read every
    row's ``solution``; with the model's ``family``, a gold box must also stay a box in that family's frame at this
    budget (a thin one can round to x1 == x2 there, and then every answer on the row scores 0). Runs on ``num_proc`` processes (default: every core for large datasets) with a progress bar;
    datasets caches the result, so a second run on the same data costs nothing.
    """
    import datasets

    images = image_columns(dataset.column_names)
    if images and budget.factor is None:
        raise ValueError("validate_rows sizes images for a model: pass PixelBudget.for_model(processor or config)")
    columns = images + [c for c in (VIDEO_COLUMN, "solution", "line", "image_path", QUESTION_BOXES_COLUMN)
                               if c in dataset.column_names]  # fmt: skip
    raw = dataset.select_columns(columns)
    for column in images:
        feature = raw.features[column]
        if isinstance(feature, datasets.Image):
            raw = raw.cast_column(column, datasets.Image(decode=False))
        elif isinstance(getattr(feature, "feature", None), datasets.Image):
            raw = raw.cast_column(column, datasets.List(datasets.Image(decode=False)))
    if VIDEO_COLUMN in columns and isinstance(getattr(raw.features[VIDEO_COLUMN], "feature", None), datasets.Image):
        raw = raw.cast_column(VIDEO_COLUMN, datasets.List(datasets.Image(decode=False)))  # frames: checked, not decoded
    if num_proc is None:
        num_proc = max(1, min(os.cpu_count() or 1, len(raw) // 2000))
    checked = raw.map(
        _row_problem, with_indices=True, remove_columns=columns, num_proc=num_proc if num_proc > 1 else None,
        fn_kwargs={"budget": budget, "gold_parsers": gold_parsers or {}, "image_columns": images, "family": family},
        desc="validating rows",
    )  # fmt: skip
    found = checked.filter(lambda row: bool(row["column"]), desc="collecting bad rows")
    return [RowProblem(r["index"], r["line"], r["column"], r["reason"], r["image_file"]) for r in found]


def _row_problem(row: dict, index: int, budget: PixelBudget, gold_parsers: dict, image_columns: list[str],
                 family: str | None = None) -> dict:  # fmt: skip
    problem = {"index": index, "line": row.get("line"), "column": "", "reason": "", "image_file": None}
    try:
        budget = budget.of_row(row)  # a row's own bounds (a mixture source's), inside the run's
    except SuzakError as error:
        return problem | {"column": PIXEL_BUDGET_COLUMN, "reason": str(error)}
    video = row.get(VIDEO_COLUMN)
    if video is not None or not image_columns:  # a video row (in a video dataset, or one mixing image and video rows)
        file = video if isinstance(video, str) else None
        if any(row[column] not in (None, []) for column in image_columns):
            return problem | {"column": VIDEO_COLUMN, "image_file": file,
                              "reason": "the row holds images and a video: suzak trains on rows with one or the other"}  # fmt: skip
        reason = video_problem(video) if VIDEO_COLUMN in row else ""
        if reason:
            return problem | {"column": VIDEO_COLUMN, "reason": reason, "image_file": file}
    sizes: list[tuple[int, int]] = []
    if video is None and image_columns:  # an image row
        for column in image_columns:
            values = row[column] if isinstance(row[column], list) else [row[column]]
            for value in values:
                path = value.get("path") if isinstance(value, dict) else value if isinstance(value, str) else None
                reason = _image_problem(value, budget, sizes)
                if reason:
                    return problem | {"column": column, "reason": reason, "image_file": path or row.get("image_path")}
    if row.get(QUESTION_BOXES_COLUMN) is not None and (reason := _question_boxes_problem(row, sizes)):
        return problem | {"column": QUESTION_BOXES_COLUMN, "reason": reason}
    if gold_parsers:
        gold = row.get("solution")
        if gold is None:  # a line without one (for a reference-free judge) under a reward that reads one
            return problem | {"column": "solution", "reason": f"no gold answer, which {', '.join(gold_parsers)} "
                              "read(s) (a JSONL line's solution, ground_truth or answer)"}  # fmt: skip
        for name, parse in gold_parsers.items():
            try:
                value = parse(gold_answer(gold))
            except (ValueError, TypeError) as error:
                return problem | {"column": "solution", "reason": f"{name} cannot read the gold answer {gold!r:.80} "
                                  f"({error})"}  # fmt: skip
            if value is None:
                return problem | {"column": "solution", "reason": f"{name} cannot read the gold answer {gold!r:.80}"}
            if parse is gold_boxes and (reason := _boxes_problem(value, sizes, name, family, budget)):
                return problem | {"column": "solution", "reason": reason}
    return problem


def _boxes_problem(boxes: list, sizes: list[tuple[int, int]], reward: str, family: str | None = None,
                   budget: PixelBudget | None = None) -> str:  # fmt: skip
    """Why a grounding row's gold boxes (original pixels) cannot be trained on ('' when they can): the row needs one
    image, and each box must lie inside it with x1 < x2 and y1 < y2 (:func:`suzak.media.boxes.box_problem`); with a
    model ``family`` that has a box frame, still a box once rounded into that frame at ``budget``."""
    from suzak.media.boxes import FRAMES, BoxFrame

    if len(sizes) != 1:
        return f"{reward} reads boxes on one image, and the row has {len(sizes)}"
    width, height = sizes[0]
    frame = BoxFrame.of(family, width, height, budget) if family in FRAMES and budget is not None else None
    for box in boxes:
        if reason := box_problem(list(box), width, height):
            return f"gold box {[round(v, 2) for v in box]}: {reason} ({reward} reads boxes in original-image pixels)"
        if frame is not None and not frame.in_frame(model := frame.to_model(box)):
            return (
                f"gold box {[round(v, 2) for v in box]} is {list(model)} in {family}'s frame at this pixel budget, "
                f"no box at all: every answer on this row would score 0 (a box thinner than the frame's unit)"
            )
    return ""


def _question_boxes_problem(row: dict, sizes: list[tuple[int, int]]) -> str:
    """Why a row's question boxes (original pixels, :data:`suzak.media.boxes.QUESTION_BOXES_COLUMN`) cannot be put in its
    question ('' when they can): one image, each box inside it."""
    try:
        boxes = question_boxes_of(row)
    except (ValueError, TypeError, IndexError) as error:
        return f"cannot read {row[QUESTION_BOXES_COLUMN]!r:.80} as boxes ({error})"
    if len(sizes) != 1:
        return f"a box in a question is drawn on the row's one image, and the row has {len(sizes)}"
    for box in boxes:
        if reason := box_problem(box, *sizes[0]):
            return f"question box {box!r:.60}: {reason} (question boxes are in original-image pixels)"
    return ""


def _image_problem(value: Any, budget: PixelBudget, sizes: list | None = None) -> str:
    """Why an image cell cannot be trained on ('' when it can): stored bytes, a file path or a decoded image. The
    image's (width, height) goes to ``sizes`` when it can."""
    if value is None or (isinstance(value, dict) and not value.get("bytes") and not value.get("path")):
        return "no image"
    try:
        if isinstance(value, Image.Image):
            image = value
        else:
            data = value.get("bytes") if isinstance(value, dict) else None
            path = value.get("path") if isinstance(value, dict) else value
            image = Image.open(io.BytesIO(data) if data else path)
            image.load()  # decode every byte: a truncated file fails here
        to_rgb(image)  # every mode converts (fit_image's first step); the resampling itself cannot fail
        budget.size(image.height, image.width)
        if sizes is not None:
            sizes.append(image.size)
    except FileNotFoundError:
        return "image file not found"
    except Image.UnidentifiedImageError:
        return "not an image PIL can read"
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as error:
        return f"unreadable image ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})"
    return ""
