"""``VLMGRPOTrainer``: TRL's ``GRPOTrainer`` with the pixel budget, the reward pre-flight and the pre-check report.

It overrides five small hooks and calls ``super()`` in each; no TRL method is copied:

- ``_generate_and_score_completions(inputs)``: the single entry point before TRL's two processor calls, vLLM
  generation and the reward kwargs. Every image of the batch (``image``, ``images`` and images inline in the
  messages) is fitted once to the budget here, so all of those see the same pixels and token counts. After TRL has
  scored the batch, its rows (from TRL's ``_logs``) go to the ``completion_listeners`` (``completions.csv``).
- ``_generate_single_turn(prompt_ids, images, …)``: with colocated vLLM, each image's run of ``<|image_pad|>``
  tokens is collapsed to one placeholder for the vLLM call. TRL 1.16 hands vLLM the processor-expanded prompt ids
  and vLLM expands them a second time, silently generating from a corrupted prompt (TRL #6294, checked with vLLM
  0.24 in tests/test_vllm_boundary.py); the training forward keeps the expanded ids.
- ``_log_completion_extra(column, values)``: notes which ``log_extra`` columns this batch wrote.
- ``log(logs)``: with ``log_completions``, prompts are plain text (``<image>`` for an image) while TRL builds its
  completions table: W&B types a table column from its values and rejects VLM prompts, whose content parts differ
  in shape (``{"type": "image"}`` beside ``{"type": "text", "text": …}``), failing the run at the first log step.
- ``train()``: runs the reward pre-flight and the visual-token pre-check before step 1.

The processor is configured with the same bounds, so it never resizes a fitted image again, and pads on the left.
Generation (HF or vLLM) never samples a vision placeholder token: TRL suppresses ``<|image_pad|>`` in HF generation
only, and a placeholder sampled by vLLM fails the training forward (image features and tokens no longer match).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from accelerate.utils import gather_object
from PIL import Image
from trl import GRPOTrainer

from suzak import SuzakError
from suzak.callbacks import completion_rows, image_reference, message_text
from suzak.rewards import preflight
from suzak.vision import (
    PixelBudget,
    collapse_runs,
    configure_processor,
    pad_left,
    precheck,
    processor_bounds,
    vision_token_ids,
)

__all__ = ["VLMGRPOTrainer", "fit_row_images"]

logger = logging.getLogger(__name__)


def _fit_message_images(messages: Any, fit: Callable[[Image.Image], Image.Image]) -> Any:
    """Messages with every inline ``{"type": "image", "image": <PIL>}`` part fitted; other parts untouched."""
    if not isinstance(messages, list):
        return messages
    fitted = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            content = [
                {**part, "image": fit(part["image"])}
                if isinstance(part, dict) and isinstance(part.get("image"), Image.Image)
                else part
                for part in content
            ]
            message = {**message, "content": content}
        fitted.append(message)
    return fitted


def _memo_fit(budget: PixelBudget, memo: dict | None) -> Callable[[Image.Image], Image.Image]:
    """``budget.fit``, resizing each distinct image of ``memo``'s scope once.

    A GRPO batch holds every prompt ``num_generations`` times, each a separately decoded copy of the same image:
    keyed by content (mode, size, pixel bytes), the copies share one resize.
    """
    if memo is None:
        return budget.fit

    def fit(image: Image.Image) -> Image.Image:
        key = (image.mode, image.size, image.tobytes())
        if key not in memo:
            memo[key] = budget.fit(image)
        return memo[key]

    return fit


def fit_row_images(row: dict, budget: PixelBudget, memo: dict | None = None) -> dict:
    """A copy of a batch row with its ``image``, ``images`` and inline message images fitted to ``budget``.

    Rows fitted with the same ``memo`` dict resize an image they share (by content) only once.
    """
    fit = _memo_fit(budget, memo)
    row = dict(row)
    if isinstance(row.get("image"), Image.Image):
        row["image"] = fit(row["image"])
    if isinstance(row.get("images"), list):
        row["images"] = [fit(img) if isinstance(img, Image.Image) else img for img in row["images"]]
    if "prompt" in row:
        row["prompt"] = _fit_message_images(row["prompt"], fit)
    return row


class VLMGRPOTrainer(GRPOTrainer):
    """GRPOTrainer for Qwen2-VL/Qwen2.5-VL (and text models) with one pixel budget for every image path.

    Extra arguments (all keyword-only):
        pixel_budget: min/max pixels applied to every image; defaults to R1-V's CLEVR budget (3136..401408).
        answer_format: the answer format the prompts ask for (``suzak.prompts.ANSWER_FORMATS``); enables the
            reward pre-flight. ``None`` skips it.
        preflight_rows: rows the pre-flight checks.
        precheck_rows: rows the visual-token pre-check reads (``None``: all of them).

    ``completion_listeners``: callables that receive, on the main process, the rows of every scored training batch
    (:func:`suzak.callbacks.completion_rows`); set the same list on every rank.
    """

    def __init__(
        self,
        *args,
        pixel_budget: PixelBudget | None = None,
        answer_format: str | None = None,
        preflight_rows: int = 8,
        precheck_rows: int | None = 256,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        self.pixel_budget = pixel_budget or PixelBudget()
        self.answer_format = answer_format
        self.preflight_rows = preflight_rows
        self.precheck_rows = precheck_rows
        self.precheck_report: dict | None = None
        self.completion_listeners: list[Callable[[list[dict]], None]] = []
        self._batch_extra_columns: set[str] = set()
        configure_processor(self.processing_class, self.pixel_budget)
        pad_left(self.processing_class)
        self._suppress_vision_tokens()

    def _suppress_vision_tokens(self) -> None:
        """Keep the vision placeholders (``suzak.vision.VISION_PLACEHOLDERS``) out of every sampled completion.

        The same ids the evaluation engines suppress: with HF generation they join TRL's ``suppress_tokens``; with
        vLLM (colocate or server) they get a -100 logit bias, which vLLM also accepts over its OpenAI API.
        """
        ids = vision_token_ids(self.processing_class)
        if not ids:
            return
        if self.use_vllm:
            kwargs = dict(self.vllm_generation.generation_kwargs)  # a copy: never the user's args.generation_kwargs
            kwargs["logit_bias"] = {**dict.fromkeys(ids, -100.0), **(kwargs.get("logit_bias") or {})}
            self.vllm_generation.generation_kwargs = kwargs
        else:
            suppressed = sorted(set(self.generation_config.suppress_tokens or []) | set(ids))
            self.generation_config.suppress_tokens = suppressed
            self.generation_kwargs["suppress_tokens"] = suppressed

    @property
    def suppressed_token_ids(self) -> list[int]:
        """Token ids the trainer's generation can never sample, read from what TRL hands HF generate or vLLM."""
        if self.use_vllm:
            bias = self.vllm_generation.generation_kwargs.get("logit_bias") or {}
            return sorted(int(token) for token, value in bias.items() if value <= -100)
        return sorted(self.generation_config.suppress_tokens or [])

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        self._batch_extra_columns.clear()
        memo: dict = {}  # one resize per distinct image: each prompt is in the batch num_generations times
        output = super()._generate_and_score_completions([fit_row_images(r, self.pixel_budget, memo) for r in inputs])
        if self.model.training and self.completion_listeners:
            self._publish_completions(inputs)
        return output

    def _generate_single_turn(self, prompt_ids, images, *args, **kwargs):
        if self.use_vllm and self.vllm_mode == "colocate" and images is not None:
            # vLLM expands each image's single placeholder itself; the server mode instead places precomputed image
            # features on the runs of image tokens, so it keeps the expanded ids.
            token = self.processing_class.image_token_id
            prompt_ids = [collapse_runs(list(ids), token) for ids in prompt_ids]
        return super()._generate_single_turn(prompt_ids, images, *args, **kwargs)

    def _log_completion_extra(self, column: str, values: list):
        self._batch_extra_columns.add(column)
        super()._log_completion_extra(column, values)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if not self.log_completions:
            return super().log(logs, start_time)
        prompts = self._logs["prompt"]
        self._logs["prompt"] = deque((message_text(p) for p in prompts), maxlen=prompts.maxlen)
        try:
            super().log(logs, start_time)
        finally:
            self._logs["prompt"] = prompts

    def _publish_completions(self, inputs: list[dict[str, Any]]) -> None:
        """This batch's rows to the listeners. TRL gathers ``_logs`` over ranks in rank order; so do the references."""
        references = gather_object([image_reference(row) for row in inputs])
        if not self.accelerator.is_main_process:
            return
        weights = self.reward_weights.tolist()
        rows = completion_rows(self._logs, references, self.state.global_step + 1, weights, self._batch_extra_columns)
        for listener in self.completion_listeners:
            listener(rows)

    def train(self, *args, **kwargs):
        self.run_pre_checks()
        return super().train(*args, **kwargs)

    def run_pre_checks(self) -> None:
        """Reward pre-flight (stops the run on a reward/format mismatch), vLLM's image bounds, the visual-token report."""
        dataset = self.train_dataset
        if self.use_vllm and ("image" in dataset.column_names or "images" in dataset.column_names):
            self.check_vllm_bounds()
        if self.answer_format is not None:
            weights = self.args.reward_weights
            preflight(
                dataset, self.reward_funcs, self.answer_format, num_rows=self.preflight_rows, reward_weights=weights
            )
        if "image" in dataset.column_names or "images" in dataset.column_names:
            model_config = getattr(self.model, "config", None)
            text_config = getattr(model_config, "text_config", model_config)
            context = getattr(text_config, "max_position_embeddings", None)
            self.precheck_report = precheck(
                dataset,
                self.processing_class,
                self.pixel_budget,
                max_completion_length=self.args.max_completion_length,
                context_length=context,
                num_rows=self.precheck_rows,
            )

    def check_vllm_bounds(self) -> None:
        """Stop before step 1 when vLLM would resize the images the trainer fitted to the budget.

        TRL starts vLLM on the model's folder with no processor settings, so vLLM resizes images into the bounds of
        the processor config saved there (Qwen's Hub checkpoints: 3136..12845056 pixels). A budget reaching past
        them makes vLLM generate from an image of another size than the one trained on, without an error (seen
        with vLLM 0.24: tests/test_vllm_boundary.py).
        """
        from transformers import AutoProcessor

        path = self.model.name_or_path  # the folder TRL starts vLLM on
        try:
            bounds = processor_bounds(AutoProcessor.from_pretrained(path))
        except (OSError, ValueError) as error:
            logger.warning("use_vllm: cannot read vLLM's processor bounds from %s (%s); not checked", path, error)
            return
        if bounds is None or self.pixel_budget.within(*bounds):
            return
        budget = self.pixel_budget
        raise SuzakError(
            f"use_vllm: vLLM resizes images into {bounds[0]}..{bounds[1]} pixels (the processor config saved in "
            f"{path}) but the pixel budget is {budget.min_pixels}..{budget.max_pixels}: vLLM would generate from "
            f"other image sizes than training uses. Set min_pixels >= {bounds[0]} and max_pixels <= {bounds[1]}, or "
            "save the model's processor with the budget's bounds"
            + (" (and start the vLLM server on that folder)" if self.vllm_mode == "server" else "")
        )
