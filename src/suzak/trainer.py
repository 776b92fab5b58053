"""``VLMGRPOTrainer``: TRL's ``GRPOTrainer`` with the pixel budget, the pre-step checks and the completions stream.

It is built on :class:`suzak.trl_internals.GRPOHooks`, the one place that overrides TRL's private hooks (each calls
``super()``; no TRL method is copied), and fills in what those hooks hand over:

- ``prepare_batch``: every image of a batch (``image``, ``images``, images inline in the messages) is fitted once to
  the budget, before TRL's two processor calls, vLLM and the reward kwargs see it, so all of them see the same
  pixels and token counts (the copies of a prompt's image share one resize);
- ``batch_scored``: the scored batch's rows go to the ``completion_listeners`` (``completions.csv``);
- ``train()``: the reward pre-flight, the vLLM image-bounds check and the visual-token report run before step 1
  (:mod:`suzak.checks`).

The processor gets the budget's bounds, so it never resizes a fitted image again, and pads on the left. Generation
(HF or vLLM) never samples a vision placeholder token (:data:`suzak.vision.VISION_PLACEHOLDERS`, the ids the
evaluation engines suppress too); with colocated vLLM, prompts reach vLLM with one placeholder per image.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from accelerate.utils import gather_object

from suzak.checks import check_vllm_bounds, precheck, preflight
from suzak.runs.streams import image_reference
from suzak.trl_internals import GRPOHooks
from suzak.vision import PixelBudget, configure_processor, fit_row_images, pad_left, vision_token_ids

__all__ = ["VLMGRPOTrainer"]

logger = logging.getLogger(__name__)


class VLMGRPOTrainer(GRPOHooks):
    """GRPOTrainer for Qwen2-VL/Qwen2.5-VL (and text models) with one pixel budget for every image path.

    Extra arguments (all keyword-only):
        pixel_budget: min/max pixels applied to every image; defaults to :class:`suzak.vision.PixelBudget`'s.
        answer_format: the answer format the prompts ask for (``suzak.prompts.ANSWER_FORMATS``); enables the
            reward pre-flight. ``None`` skips it.
        preflight_rows: rows the pre-flight checks.
        precheck_rows: rows the visual-token pre-check reads (``None``: all of them).

    ``completion_listeners``: callables that receive, on the main process, the rows of every scored training batch
    (:func:`suzak.trl_internals.completion_rows`); set the same list on every rank.
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
        configure_processor(self.processing_class, self.pixel_budget)
        pad_left(self.processing_class)
        self.suppress_in_generation(vision_token_ids(self.processing_class))

    def prepare_batch(self, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        memo: dict = {}  # one resize per distinct image: each prompt is in the batch num_generations times
        return [fit_row_images(row, self.pixel_budget, memo) for row in inputs]

    def batch_scored(self, inputs: list[dict[str, Any]]) -> None:
        """This batch's rows to the listeners, with image references gathered over ranks in TRL's rank order."""
        if not self.completion_listeners:
            return
        references = gather_object([image_reference(row) for row in inputs])
        if not self.accelerator.is_main_process:
            return
        rows = self.newest_completions(references, self.state.global_step + 1)
        for listener in self.completion_listeners:
            listener(rows)

    def train(self, *args, **kwargs):
        self.run_pre_checks()
        return super().train(*args, **kwargs)

    def run_pre_checks(self) -> None:
        """Reward pre-flight (stops the run on a reward/format mismatch), vLLM's image bounds, the visual-token report."""
        dataset = self.train_dataset
        has_images = "image" in dataset.column_names or "images" in dataset.column_names
        if self.use_vllm and has_images:
            check_vllm_bounds(self.model.name_or_path, self.pixel_budget, server=self.vllm_mode == "server")
        if self.answer_format is not None:
            weights = self.args.reward_weights
            preflight(
                dataset, self.reward_funcs, self.answer_format, num_rows=self.preflight_rows, reward_weights=weights
            )
        if has_images:
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
