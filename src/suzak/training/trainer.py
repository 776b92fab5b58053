"""``VLMGRPOTrainer``: TRL's ``GRPOTrainer`` with the pixel budget, the pre-step checks and the completions stream.

It is built on :class:`suzak.trl_internals.hooks.GRPOHooks`, the one place that overrides TRL's private hooks (each calls
``super()``; no TRL method is copied), and fills in what those hooks hand over:

- ``prepare_batch``: every image of a batch (``image``, ``images``, images inline in the messages) is fitted once to
  the budget, before TRL's two processor calls, vLLM and the reward kwargs see it, so all of them see the same
  pixels and token counts (the copies of a prompt's image share one resize); a judge gets the row's pictures as
  they were too (:func:`suzak.scoring.judge.with_original_images`), to fit to its own budget; a row's video
  (``video`` column, or a video part of the prompt) is read once to the video budget
  (:func:`suzak.media.video.read_clip`) and placed in the prompt as a clip, which generation and the training
  forward both take their frames from;
- ``batch_scored``: the scored batch's rows go to the ``completion_listeners`` (``completions.csv``);
- ``row_names``: a batch row is named by its dataset row, an id column (``line``, ``index``, ``image_path``...)
  or, in a dataset without one, its position (``ROW_COLUMN``, added for training and removed before TRL sees a row);
- ``train()``: the reward pre-flight, the vLLM image-bounds check and the visual-token report run before step 1
  (:mod:`suzak.training.checks`); a reward that fails mid-run (:class:`suzak.trl_internals.rewards.RewardFault`), a vLLM sampler
  that does not follow the policy (:class:`suzak.trl_internals.sampler_guard.StaleSampler`) or a nan/inf gradient norm
  (:class:`suzak.trl_internals.precision.NonFiniteStep`) stops it after a checkpoint of the last completed step, so
  ``--resume_from_checkpoint latest`` continues from there.

The budget takes the model's patch factor from the processor (:meth:`suzak.media.vision.PixelBudget.for_model`: 28 pixels
per visual token for Qwen2-VL/Qwen2.5-VL, 32 for Qwen3-VL/Qwen3.5). The processor gets the budget's bounds, so it
never resizes a fitted image again, and pads on the left. Generation (HF or vLLM) never samples a vision placeholder
token (:data:`suzak.media.vision.VISION_PLACEHOLDERS`, the ids the evaluation engines suppress too); with colocated vLLM,
prompts reach vLLM with one placeholder per image and per video, and each video row's request carries its clip
(:func:`suzak.trl_internals.video.vllm_requests_with_videos`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import datasets
import torch
from accelerate.utils import broadcast_object_list, gather_object
from transformers.trainer_callback import ProgressCallback

from suzak import SuzakError
from suzak.data.mixture import SOURCE_ROW_COLUMN, RowsSeen
from suzak.media.boxes import with_box_frame
from suzak.media.video import VIDEO_COLUMN, VideoBudget, row_clip, video_of, with_video
from suzak.media.vision import (
    PixelBudget,
    configure_processor,
    fit_row_images,
    image_columns,
    image_gaps_filled,
    images_of,
    pad_left,
    vision_token_ids,
)
from suzak.models.episodes import EPISODE_PROBLEMS, EpisodeFactory, ScreenEnvironment, episode_columns
from suzak.models.packing import PackingCount, packing_refusal, packing_rows, use_row_attention
from suzak.models.positions import use_qwen_video_positions
from suzak.models.tool_calling import prepare_tool_calling
from suzak.models.tools import (
    ENVIRONMENT_COLUMN,
    ZOOM,
    ZOOM_PROBLEMS,
    ZoomEnvironment,
    ZoomFactory,
    with_original_image,
)
from suzak.models.vision_reuse import share_vision_encodings
from suzak.runs.checkpoints import checkpoint_problem
from suzak.runs.episodes import record_episodes
from suzak.runs.streams import ROW_ID_COLUMNS, image_reference, row_id
from suzak.scoring.judge import with_original_images
from suzak.scoring.parsing import message_text
from suzak.scoring.prompts import template_opening
from suzak.scoring.rewards import SOURCE_COLUMN, is_judge, read_after_opening
from suzak.training.checks import check_answer_opening, check_vllm_bounds, precheck, preflight
from suzak.training.configs import check_whole_groups
from suzak.trl_internals.hooks import GRPOHooks
from suzak.trl_internals.micro_batches import budget_refusal
from suzak.trl_internals.precision import NonFiniteStep
from suzak.trl_internals.rewards import RewardFault
from suzak.trl_internals.rounds import DynamicSampling
from suzak.trl_internals.sampler_guard import SamplerGuard, StaleSampler

__all__ = ["ROW_COLUMN", "VLMGRPOTrainer", "number_rows", "row_name"]

logger = logging.getLogger(__name__)

ROW_COLUMN = "suzak_row"  # a row's position in the training dataset, when no column of its own names it


def number_rows(dataset):
    """``dataset`` with each row's position in :data:`ROW_COLUMN`, unless a column already names its rows.

    suzak's builders name rows themselves (``line`` for JSONL, ``index`` for synthetic CLEVR); Hub datasets do not.
    The column is one int per row, beside the table (a dataset that was shuffled or subset is flattened first).
    """
    if not isinstance(dataset, datasets.Dataset) or {*ROW_ID_COLUMNS, ROW_COLUMN} & set(dataset.column_names):
        return dataset
    return dataset.add_column(ROW_COLUMN, list(range(len(dataset))))


def row_name(row: dict[str, Any]) -> str:
    """How a message names the dataset row a batch row came from.

    >>> row_name({"line": 14}), row_name({ROW_COLUMN: 3}), row_name({"problem": "?"})
    ('line 14', 'position 3', 'an unnamed row')
    """
    found = row_id(row)
    if found is not None:
        return f"{found[0]} {found[1]}"
    return f"position {row[ROW_COLUMN]}" if ROW_COLUMN in row else "an unnamed row"


class VLMGRPOTrainer(GRPOHooks):
    """GRPOTrainer for the Qwen VL families (and text models) with one pixel budget for every image path.

    Extra arguments (all keyword-only):
        pixel_budget: min/max pixels applied to every image; defaults to :class:`suzak.media.vision.PixelBudget`'s. Its
            factor is the processor's.
        answer_format: the answer format the prompts ask for (``suzak.scoring.prompts.ANSWER_FORMATS``); enables the
            reward pre-flight. ``None`` skips it.
        preflight_rows: rows the pre-flight checks.
        precheck_rows: rows the visual-token pre-check reads (``None``: all of them).
        video_budget: fps, frame bounds and per-frame pixels of every video (:class:`suzak.media.video.VideoBudget`);
            its factor is the processor's.
        sampler_guard: with vLLM, when and how far vLLM's log-probabilities of its samples may drift from the
            policy's before the run stops (:class:`suzak.trl_internals.sampler_guard.SamplerGuard`; default: every 10 steps, 0.1).
        opening_in_completion: the rewards (and the pre-flight) read each completion after the chat template's
            opening of the assistant turn (Qwen3.5's ``<think>\\n``, :func:`suzak.scoring.prompts.template_opening`);
            without it, a template that opens the answer format's first tag stops the run before step 1.
        dynamic_sampling: DAPO's dynamic sampling (:class:`suzak.trl_internals.rounds.DynamicSampling`); None: off.
        vision_reuse: each distinct image or clip of a forward pass encoded once, its features shared by the rows that
            show it (:mod:`suzak.models.vision_reuse`), and micro-batches cut by whole groups; ``vision/encoded_fraction``
            logs the images encoded over those handed to the policy's tower since the last log.
        padding_free: each training pass's chunk of rows packed into one sequence without padding
            (:mod:`suzak.models.packing`); a model it cannot keep exact runs padded, said in one info line.
            ``perf/real_token_fraction`` logs the real tokens over the positions the passes computed since the last log.
        max_tokens_per_micro_batch: micro-batches cut by tokens instead of rows (:mod:`suzak.trl_internals.micro_batches`):
            a generation batch's micro-batches balanced by real tokens, each computed in passes of at most this many
            tokens, as are the old-log-prob and reference passes; None: TRL's rows. A loss it cannot keep exact
            (an entropy bonus, ``top_entropy_quantile``) stops before step 1; so does a row the pre-check finds longer.
        source_rows: a mixture's training rows per source: ``sources/<name>/rows_seen`` logs the fraction of them
            drawn into a training batch so far (:class:`suzak.data.mixture.RowsSeen`, saved in each checkpoint).

    ``completion_listeners``: callables that receive, on the main process, the rows of every scored training batch
    (:func:`suzak.trl_internals.completions.completion_rows`); set the same list on every rank.
    """

    def __init__(
        self,
        *args,
        pixel_budget: PixelBudget | None = None,
        video_budget: VideoBudget | None = None,
        answer_format: str | None = None,
        preflight_rows: int = 8,
        precheck_rows: int | None = 256,
        sampler_guard: SamplerGuard | None = None,
        opening_in_completion: bool = False,
        dynamic_sampling: DynamicSampling | None = None,
        vision_reuse: bool = True,
        padding_free: bool = True,
        max_tokens_per_micro_batch: int | None = None,
        source_rows: Mapping[str, int] | None = None,
        **kwargs,
    ):
        use_qwen_video_positions()  # before TRL loads a reference model
        if kwargs.get("tools") or kwargs.get("environment_factory"):  # before TRL checks the template renders tools
            model = kwargs.get("model", args[0] if args else None)
            prepare_tool_calling(
                kwargs["processing_class"], getattr(getattr(model, "config", None), "model_type", None)
            )
        super().__init__(*args, **kwargs)
        self.sampler_guard = sampler_guard or self.sampler_guard
        # each distinct image encoded once per forward pass, in every model TRL runs (policy, reference)
        self.vision_reuse = share_vision_encodings(self.model) if vision_reuse else None
        if self.vision_reuse is not None and getattr(self, "ref_model", None) is not None:
            share_vision_encodings(self.ref_model)
        # micro-batches of whole groups: each holds a group's image once (TRL's shuffle would spread its rows)
        self.keep_groups_together = self.vision_reuse is not None
        self.padding_free = padding_free and self._packable()
        self.packing_count = PackingCount()
        self.max_tokens_per_micro_batch = self._token_budget(max_tokens_per_micro_batch)
        self.dynamic_sampling = dynamic_sampling
        self.pixel_budget = (pixel_budget or PixelBudget()).for_model(self.processing_class)
        self.video_budget = (video_budget or VideoBudget()).for_model(self.processing_class)
        self.answer_format = answer_format
        self.preflight_rows = preflight_rows
        self.precheck_rows = precheck_rows
        self.precheck_report: dict | None = None
        self.completion_listeners: list[Callable[[list[dict]], None]] = []
        self.rows_seen = RowsSeen(source_rows) if source_rows else None
        configure_processor(self.processing_class, self.pixel_budget)
        pad_left(self.processing_class)
        self.suppress_in_generation(vision_token_ids(self.processing_class))
        self.opening_in_completion = opening_in_completion
        self.completion_opening = self._read_after_opening() if opening_in_completion else ""

    def _packable(self) -> bool:
        """Whether the policy's (and the reference model's) passes can run packed; one info line where not."""
        refusal = packing_refusal(self.model)
        if refusal is not None:
            logger.info("padding_free: %s", refusal)
            return False
        for model in (self.model, getattr(self, "ref_model", None)):
            if model is not None:
                use_row_attention(model)
        return True

    def _token_budget(self, budget: int | None) -> int | None:
        if budget is None:
            return None
        if budget < 1:
            raise SuzakError(f"max_tokens_per_micro_batch {budget} must be >= 1 (real tokens a pass)")
        refusal = budget_refusal(self)
        if refusal is not None:
            raise SuzakError(f"max_tokens_per_micro_batch: {refusal}; leave the budget unset for this run")
        logger.info("max_tokens_per_micro_batch: micro-batches balanced by tokens, passes of at most %d tokens", budget)
        return budget

    @property
    def padded(self) -> bool:
        return not self.padding_free

    def packed_calls(self, model: torch.nn.Module):
        """TRL's calls of a chunk of rows packed without padding where :attr:`padding_free` (else counted only)."""
        return packing_rows(model, self.packing_count, enabled=self.padding_free)

    def _read_after_opening(self) -> str:
        """The chat template's opening of the assistant turn (:func:`suzak.scoring.prompts.template_opening`); every reward
        function then reads each completion after it (reward models score TRL's own prompt + completion text)."""
        opening = template_opening(self.processing_class, self.chat_template_kwargs)
        if not opening:
            logger.warning("opening_in_completion: the chat template opens no tag at the end of the generation prompt "
                           "(chat_template_kwargs %s): completions are scored as generated", self.chat_template_kwargs)  # fmt: skip
            return ""
        self.reward_funcs = [
            f if isinstance(f, torch.nn.Module) else read_after_opening(f, opening) for f in self.reward_funcs
        ]
        logger.info("opening_in_completion: the rewards read every completion after the chat template's %r", opening)
        return opening

    def row_names(self, inputs: list[dict[str, Any]]) -> list[str]:
        return [row_name(row) for row in inputs]

    def plain_text(self, messages: Any) -> str:
        """The completions log's text: ``<image>`` for an image, each tool call and tool turn on its own line."""
        return message_text(messages)

    def prepare_batch(self, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        memo: dict = {}  # one resize per distinct image: each prompt is in the batch num_generations times
        clips: dict = {}  # one read per distinct video, likewise
        rows = ({k: v for k, v in row.items() if k != ROW_COLUMN} for row in inputs)  # rewards get the dataset's own
        framed = (self.with_box_frame(row) for row in rows)  # from the original image, before it is fitted
        if self.environment_factories is not None:  # an environment (the zoom) gets each row's image as it is
            framed = (with_original_image(row) for row in framed)
        if self.environment_factories is not None and None not in self.environment_factories:
            # a mixture with tools per source (TRL's environments by name): each row acts with its source's
            framed = ({**row, ENVIRONMENT_COLUMN: row.get(SOURCE_COLUMN)} for row in framed)
        if self.judged:  # a judge fits each row's pictures to its own budget, not to the policy's
            framed = (with_original_images(row) for row in framed)
        fitted = image_gaps_filled([fit_row_images(row, self.pixel_budget, memo) for row in framed])
        return [self._with_clip(row, name, clips) for row, name in zip(fitted, self.row_names(inputs), strict=True)]

    @property
    def judged(self) -> bool:
        """Whether a judge is among the rewards (:func:`suzak.scoring.rewards.is_judge`)."""
        return any(is_judge(func) for func in self.reward_funcs)

    def with_box_frame(self, row: dict[str, Any]) -> dict[str, Any]:
        """The row with its image's box frame for the box rewards (:func:`suzak.media.boxes.with_box_frame`): this model's
        family, the image's size and the size the pixel budget gives it."""
        return with_box_frame(row, self.model_type, self.pixel_budget)

    @property
    def model_type(self) -> str | None:
        return getattr(getattr(self.model, "config", None), "model_type", None)

    def _with_clip(self, row: dict[str, Any], name: str, clips: dict) -> dict[str, Any]:
        if video_of(row) is None:
            return row
        if images_of(row):
            raise SuzakError(f"{name} holds images and a video: suzak trains on rows with one or the other")
        try:
            clip = row_clip(row, self.video_budget, clips)
        except SuzakError as error:
            raise SuzakError(f"{name}: {error}") from None
        return with_video(row, clip)

    def _factory(self, kind: type) -> Any:
        """The run's environment factory of ``kind`` (a mixture's: any source's), None without one."""
        factories = (self.environment_factories or {}).values()
        return next((factory for factory in factories if isinstance(factory, kind)), None)

    @property
    def zoom_factory(self) -> ZoomFactory | None:
        """The run's zoom (:class:`suzak.models.tools.ZoomFactory`), None without one."""
        return self._factory(ZoomFactory)

    @property
    def episode_factory(self) -> EpisodeFactory | None:
        """The run's episode environment (:class:`suzak.models.episodes.EpisodeFactory`), None without one."""
        return self._factory(EpisodeFactory)

    def tool_problem_counts(self, environments: list) -> dict[str, int]:
        """The zoom's failed calls of this batch by reason (``tools/zoom_<reason>`` in the step's log); an episode's
        failed actions and early ends (``tools/episode_<reason>``, :data:`suzak.models.episodes.EPISODE_PROBLEMS`),
        its actions (``tools/episode_actions``) and its episodes (``tools/episodes``). A mixture's rollouts count
        where their environment is of that kind."""
        counts: dict[str, int] = {}
        if self.episode_factory is not None:
            episodes = [e for e in environments if isinstance(e, ScreenEnvironment)]
            counts |= {f"episode_{reason}": sum(e.problems[reason] for e in episodes) for reason in EPISODE_PROBLEMS}
            counts |= {"episode_actions": sum(len(e.steps) for e in episodes), "episodes": len(episodes)}
        if self.zoom_factory is not None:
            zooms = [e for e in environments if isinstance(e, ZoomEnvironment)]
            counts |= {f"{ZOOM}_{reason}": sum(e.problems[reason] for e in zooms) for reason in ZOOM_PROBLEMS}
        return counts

    def rollout_columns(self, environments: list) -> dict[str, list]:
        """With the zoom: ``zoom_crops``, each rollout's crops as boxes of the original image's pixels (JSON; ``[]``
        when it zoomed into nothing); with an episode, ``episode_steps`` and ``episode_reward``
        (:func:`suzak.models.episodes.episode_columns`); beside each completion in ``completions.csv`` and the W&B
        table (a mixture's other rollouts: empty there). An episode run also keeps each training step's best and
        worst episode of its first group of episodes (:func:`suzak.runs.episodes.record_episodes`, drawn by ``suzak
        plot episode``)."""
        columns: dict[str, list] = {}
        if self.episode_factory is not None:
            first = next((i for i, e in enumerate(environments) if isinstance(e, ScreenEnvironment)), None)
            if self.accelerator.is_main_process and self.model.training and first is not None:
                start = first - first % self.num_generations  # a group's rollouts are consecutive
                record_episodes(environments[start:], self.num_generations, self.args.output_dir,
                                self.state.global_step + 1, getattr(environments[first], "instruction", ""))  # fmt: skip
            columns |= episode_columns(environments)
        if self.zoom_factory is not None:
            zoomed = [isinstance(e, ZoomEnvironment) for e in environments]
            columns[f"{ZOOM}_crops"] = [json.dumps(getattr(e, "crops", [])) if z else ""
                                        for e, z in zip(environments, zoomed, strict=True)]  # fmt: skip
        return columns

    def row_columns(self, inputs: list[dict[str, Any]]) -> dict[str, list]:
        """A mixture's rows: ``source`` and ``source_row`` (each completion's source, and its row there) in
        completions.csv and the W&B table."""
        if not inputs or SOURCE_COLUMN not in inputs[0]:
            return {}
        return {column: [row[column] for row in inputs] for column in (SOURCE_COLUMN, SOURCE_ROW_COLUMN)
                if column in inputs[0]}  # fmt: skip

    def reward_rows(self, inputs: list[dict[str, Any]]) -> torch.Tensor | None:
        """A mixture's: each reward scores its own source's rows (:func:`suzak.scoring.rewards.routed`), over ranks."""
        sources = [getattr(func, "source", None) for func in self.reward_funcs]
        if not inputs or SOURCE_COLUMN not in inputs[0] or all(source is None for source in sources):
            return None
        rows = gather_object([row[SOURCE_COLUMN] for row in inputs])
        return torch.tensor([[source is None or source == row for source in sources] for row in rows])

    def log(self, logs: dict[str, float], *args, **kwargs) -> None:
        """With ``vision_reuse``, each training log adds ``vision/encoded_fraction``: of the images and clips handed
        to the policy's vision tower since the last log (HF generation's prefill, the policy's passes; the reference
        model's tower shares alike), the fraction it encoded (1/num_generations where each micro-batch holds whole
        groups; docs/vision_reuse.md)."""
        if self.vision_reuse is not None and "loss" in logs:
            images, encoded = self.vision_reuse.take()
            if images:
                logs["vision/encoded_fraction"] = encoded / images
        if "loss" in logs:
            real, computed = self.packing_count.take()
            if computed:
                logs["perf/real_token_fraction"] = real / computed
        if self.rows_seen is not None and "loss" in logs:  # so far, every rank's rows (batch_metrics gathers them)
            logs.update({f"sources/{name}/rows_seen": value for name, value in self.rows_seen.fractions().items()})
        super().log(logs, *args, **kwargs)

    def batch_metrics(self, inputs: list[dict[str, Any]], rewards: torch.Tensor, lengths: list[int] | None
                      ) -> dict[str, float]:  # fmt: skip
        """A mixture's figures per source, over every rank's rows of the batch: ``sources/<name>/rows`` (prompts),
        ``reward`` (its rows' weighted reward), ``zero_std_groups`` (its groups without reward variance),
        ``completion_length`` and ``clipped_ratio`` (completions that reached max_completion_length); a source
        without rows in the batch logs nothing for it. A training batch's rows count as seen (:attr:`rows_seen`)."""
        if not inputs or SOURCE_COLUMN not in inputs[0]:
            return {}
        drawn = gather_object([(row[SOURCE_COLUMN], row.get(SOURCE_ROW_COLUMN)) for row in inputs])
        if self.rows_seen is not None and self.model.training:
            self.rows_seen.add(drawn)
        rows = [source for source, _ in drawn]
        weighted = (rewards * self.reward_weights.to(rewards.device).unsqueeze(0)).nansum(dim=1).cpu()
        every = gather_object(lengths) if lengths is not None else None
        size, figures = self.num_generations, {}
        for source in dict.fromkeys(rows):
            mine = torch.tensor([row == source for row in rows])
            groups = weighted[mine].view(-1, size) if int(mine.sum()) % size == 0 else None
            prefix = f"sources/{source}"
            figures[f"{prefix}/rows"] = float(mine.sum()) / size
            figures[f"{prefix}/reward"] = weighted[mine].mean().item()
            if groups is not None:
                figures[f"{prefix}/zero_std_groups"] = (groups.std(dim=1) < 1e-6).float().mean().item()
            if every is not None and len(every) == len(rows):
                length = torch.tensor(every, dtype=torch.float32)[mine]
                figures[f"{prefix}/completion_length"] = length.mean().item()
                figures[f"{prefix}/clipped_ratio"] = (length >= self.max_completion_length).float().mean().item()
        return figures

    def check_tool_turns(self) -> None:
        """With the zoom: its largest crop's tool turn against ``max_completion_length``
        (:meth:`suzak.models.tools.ZoomFactory.check_turn`, with TRL's own count of a tool turn's tokens). ``suzak
        train`` checks the same before the weights load; this is for a trainer built by hand."""
        factory = self.zoom_factory or self.episode_factory
        if factory is not None:
            factory.check_turn(self.pixel_budget, self.tool_turn_length, self.args.max_completion_length)

    def check_dynamic_sampling(self) -> None:
        """With dynamic sampling: each rank's generation batch holds whole groups (a rank keeps or drops its own), and
        the training set is indexable (extra prompts are drawn from it by index)."""
        sampling = self.dynamic_sampling
        if sampling is None:
            return
        check_whole_groups(self.args.per_device_train_batch_size, self.args.steps_per_generation, self.num_generations)
        if not isinstance(self.train_dataset, datasets.Dataset):
            raise SuzakError("dynamic_sampling draws its extra prompts from the training set by index; a streamed "
                             f"dataset ({type(self.train_dataset).__name__}) has none: load it whole")  # fmt: skip
        logger.info("dynamic sampling: groups with a reward std of at most %g are dropped and refilled, up to %d extra "
                    "generation round(s) a batch", sampling.min_std, sampling.max_rounds)  # fmt: skip

    def check_token_budget(self) -> None:
        """With ``max_tokens_per_micro_batch``: the longest prompt the pre-check read, with ``max_completion_length``,
        fits in one pass (a longer row would be a pass of its own, over the memory the budget was set for)."""
        budget, report = self.max_tokens_per_micro_batch, self.precheck_report
        if budget is None or report is None or report.get("longest_row") is None:
            return
        longest = report["prompt_tokens"]["max"] + self.args.max_completion_length
        if longest > budget:
            raise SuzakError(f"row {report['longest_row']}: its prompt of {report['prompt_tokens']['max']} tokens "
                             f"with max_completion_length {self.args.max_completion_length} is {longest} tokens, over "
                             f"max_tokens_per_micro_batch {budget}: raise the budget (or lower max_pixels)")  # fmt: skip

    def count_rows_without_one_image(self) -> None:
        """With the zoom: the rows the visual-token pre-check read that have no single image to zoom into, in one
        warning (a dataset without images, where the pre-check does not run: every row)."""
        if self.zoom_factory is None:
            return
        report = self.precheck_report
        if report is None:
            logger.warning("tools: the dataset has no images, so every zoom call gets a tool error (counted as "
                           "tools/zoom_no_image)")  # fmt: skip
        elif report["not_one_image"]:
            logger.warning("tools: %d of %d rows checked have no single image to zoom into; their zoom calls get a "
                           "tool error (counted as tools/zoom_no_image)", report["not_one_image"], report["rows"])  # fmt: skip

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

    def save_run_state(self, folder) -> None:
        """A mixture's rows seen so far go into each checkpoint, for a resumed run to count on from."""
        if self.rows_seen is not None:
            self.rows_seen.save(folder)

    def train(self, *args, **kwargs):
        self.run_pre_checks()
        resume = kwargs.get("resume_from_checkpoint", args[0] if args else None)
        if self.rows_seen is not None and isinstance(resume, str):
            self.rows_seen.load(resume)
        self.train_dataset = number_rows(self.train_dataset)
        try:
            return super().train(*args, **kwargs)
        except (RewardFault, StaleSampler, NonFiniteStep) as fault:  # raised on every rank alike, before an
            # optimizer step (a non-finite norm is the same on every rank): the weights are those of the steps done
            if isinstance(fault, NonFiniteStep) and self.is_deepspeed_enabled:
                raise  # DeepSpeed applied the step already: nothing of this state is saved
            raise type(fault)(f"{fault}. {self.save_before_stopping()}") from fault.__cause__
        finally:
            self._close_progress_bar()

    def _close_progress_bar(self) -> None:
        """Close the training bar as the Trainer does at the end of training; after an error it would otherwise be
        drawn again when the process exits, below the ``error:`` line."""
        for callback in self.callback_handler.callbacks:
            if isinstance(callback, ProgressCallback) and callback.training_bar is not None:
                callback.on_train_end(self.args, self.state, self.control)

    def save_before_stopping(self) -> str:
        """Keep every completed step: save ``checkpoint-{global_step}`` unless it is already complete; says what it did.

        Rank 0 looks at the folder and every rank follows (a save is collective).
        """
        step = self.state.global_step
        if step == 0:
            return "No step had completed, so there is no checkpoint"
        folder = Path(self.args.output_dir) / f"checkpoint-{step}"
        missing = [checkpoint_problem(folder) is not None]
        broadcast_object_list(missing)
        if missing[0]:
            try:
                self.save_checkpoint()
            except OSError as error:
                return f"Saving {folder} failed ({type(error).__name__}: {error}); older checkpoints are as they were"
        resume = "--resume_from_checkpoint latest"
        return f"{folder} holds the {step} completed step(s): fix the cause, then rerun with {resume}"

    def run_pre_checks(self) -> None:
        """Reward pre-flight (stops the run on a reward/format mismatch or a chat template that opens the answer's
        first tag itself), vLLM's image bounds, the visual-token report."""
        dataset = self.train_dataset
        has_images = bool(image_columns(dataset.column_names))
        if self.use_vllm and VIDEO_COLUMN in dataset.column_names:
            if self.vllm_mode == "server":
                raise SuzakError("use_vllm with video rows runs in vllm_mode colocate: TRL's server mode sends the "
                                 "server image features only; set vllm_mode: colocate (or use_vllm: false)")  # fmt: skip
            if self.args.vllm_tensor_parallel_size > 1:
                raise SuzakError("use_vllm with video rows runs with vllm_tensor_parallel_size 1 (each rank's vLLM "
                                 f"gets its own rows' videos), got {self.args.vllm_tensor_parallel_size}")  # fmt: skip
        if self.tools and VIDEO_COLUMN in dataset.column_names:
            videos = [i for i, video in enumerate(dataset[VIDEO_COLUMN]) if video is not None]
            if videos:
                raise SuzakError(f"tools with video rows ({len(videos)} of {len(dataset)}, first: row {videos[0]}): a "
                                 "tool turn's images and a clip cannot share a rollout batch yet (TRL indexes the "
                                 "video tensors by batch row, vLLM's requests by calling row); train the tools on "
                                 "image rows, or the video rows without tools")  # fmt: skip
        self.check_tool_turns()
        self.check_dynamic_sampling()
        if self.use_vllm and has_images:
            check_vllm_bounds(self.model.name_or_path, self.pixel_budget, server=self.vllm_mode == "server")
        if self.answer_format is not None:
            if not self.opening_in_completion:
                check_answer_opening(self.processing_class, self.answer_format, self.chat_template_kwargs)
            weights = self.args.reward_weights
            rows = (self.with_box_frame(row) for row in dataset)  # what the rewards read in training
            preflight(rows, self.reward_funcs, self.answer_format, num_rows=self.preflight_rows,
                      reward_weights=weights, opening=self.completion_opening)  # fmt: skip
        if has_images or VIDEO_COLUMN in dataset.column_names:
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
                video_budget=self.video_budget,
            )
        self.check_token_budget()
        self.count_rows_without_one_image()
