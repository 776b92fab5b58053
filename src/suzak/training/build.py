"""The trainer of a run, built top to bottom: GRPO's (:func:`grpo_trainer`) and SFT's (:func:`sft_trainer`).

Each reads in the order a run needs its parts, every part worked out once:

1. :class:`RunInputs` from the recipe and the model's config (no weights yet): the pixel and video budgets on the
   model's patch grid, the resolved rewards, the prompt template, the model family;
2. :func:`training_data`: the training set and the held-out rows, every row validated against that budget and those
   rewards (one line naming the first bad row, before any weights load; ``skip_bad_rows`` lists and drops them), a
   mixture's epoch (:class:`suzak.data.mixture.Epoch`), held-out rows without ``eval_steps`` stopped;
3. the processor (:func:`suzak.models.loading.load_processor`), the zoom's tool turn checked on it
   (:func:`check_zoom_turn`), then :func:`load_policy`, shared by GRPO and SFT: the weights, the PEFT config and its
   targets checked, the vision tower frozen when the recipe says so;
4. the trainer, then the held-out generation eval (:func:`eval_callback`) with the budgets the trainer runs with.

:mod:`suzak.training.session` runs what these return (records, resume, train, save, plots, release).
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from suzak import SuzakError
from suzak.media.video import VideoBudget
from suzak.media.vision import PixelBudget
from suzak.training.configs import check_eval_cadence

__all__ = [
    "SYNTHETIC_DATASETS",
    "RunInputs",
    "TrainingData",
    "add_first",
    "build_datasets",
    "check_judges",
    "check_zoom_turn",
    "eval_callback",
    "grpo_trainer",
    "load_policy",
    "sft_trainer",
    "training_data",
]

logger = logging.getLogger(__name__)

# row i depends on (seed, start + i) alone: held-out rows are the next indices
SYNTHETIC_DATASETS = ("clevr_synthetic", "gsm8k_synthetic", "gui_click", "zoom_checks")
SKIPPED_ROWS = "skipped_rows.jsonl"  # in OUTPUT_DIR: the rows skip_bad_rows dropped, every source's


@dataclass(frozen=True)
class RunInputs:
    """What a run's trainer is built from before any weights load, each read once (:meth:`read`)."""

    budget: PixelBudget  # on the model's patch grid (no factor for a text model)
    video_budget: VideoBudget  # likewise, with the model's temporal patch
    rewards: list[Callable]  # the recipe's rewards, resolved with their kwargs, in its order
    template: Any  # the prompt template (its answer format)
    family: str | None  # the model's model_type: its box frame
    sources: tuple = ()  # a mixture's (Source, its rewards unrouted, its template) per source; () for one dataset
    # a mixture's budget per source name when any source sets its own min_pixels/max_pixels (each row is fitted to
    # its source's, and ``budget`` is then the one enclosing them all, for the processors and vLLM); else empty
    source_budgets: dict = field(default_factory=dict)
    eval_correct_at: float | None = None  # one dataset's held-out threshold (a mixture's: each source's entry)

    @classmethod
    def read(cls, suzak_args, model_args, *, for_vllm: bool = False) -> RunInputs:
        """The inputs of the recipe's run, from ``suzak_args`` and the model's config (one read, no weights)."""
        from suzak.models.loading import model_config
        from suzak.scoring.prompts import get_template
        from suzak.scoring.rewards import resolve_rewards, routed

        config = model_config(model_args, for_vllm=for_vllm)
        rewards = resolve_rewards(suzak_args.rewards, suzak_args.reward_kwargs)
        sources = tuple(
            (source, resolve_rewards(list(source.rewards), source.reward_kwargs), get_template(source.prompt_template))
            for source in suzak_args.mixture() or []
        )
        check_judges(rewards, sources)
        if sources:  # every source's rewards, each scoring its own source's rows alone
            rewards = [routed(func, source.name) for source, funcs, _ in sources for func in funcs]
        budget = PixelBudget(suzak_args.min_pixels, suzak_args.max_pixels).for_model(config)
        source_budgets = _source_budgets([source for source, _, _ in sources], suzak_args, config)
        if source_budgets:
            first, *rest = source_budgets.values()
            budget = first.enclosing(rest)
            logger.info("pixel budgets per source: %s; processors and vLLM resize into %d..%d pixels", ", ".join(
                f"{name} {b.min_pixels}..{b.max_pixels}" for name, b in source_budgets.items()), budget.min_pixels,
                budget.max_pixels)  # fmt: skip
        return cls(
            budget=budget,
            source_budgets=source_budgets,
            video_budget=suzak_args.video_budget().for_model(config),
            rewards=rewards,
            template=get_template(suzak_args.prompt_template),
            family=getattr(config, "model_type", None),
            sources=sources,
            eval_correct_at=suzak_args.eval_correct_at,
        )

    @property
    def scorers(self) -> dict[str, Callable] | None:
        """A mixture's held-out score per source: its first reward as the held-out eval scores it, at the source's
        ``eval_correct_at`` (:func:`suzak.scoring.rewards.heldout_scorer`; an episode source without rewards has
        none: its environment scores its rows; None: one dataset, :attr:`scorer`)."""
        from suzak.scoring.rewards import heldout_scorer

        # an episode source without rewards has none: its environment's verdict scores its rows
        scorers = {source.name: heldout_scorer(f[0], source.eval_correct_at) for source, f, _ in self.sources if f}
        return scorers if self.sources else None

    @property
    def reward_weights(self) -> list[float] | None:
        """A mixture's reward weights, source by source in :attr:`rewards`' order (None: the recipe's own)."""
        if not self.sources:
            return None
        return [w for source, funcs, _ in self.sources for w in (source.reward_weights or [1.0] * len(funcs))]

    @property
    def scorer(self) -> Callable | None:
        """The held-out generation eval's score: the first reward as the held-out eval scores it, at the recipe's
        ``eval_correct_at`` (:func:`suzak.scoring.rewards.heldout_scorer`); None without rewards (an episode run: its
        environment scores each held-out episode)."""
        from suzak.scoring.rewards import heldout_scorer

        return heldout_scorer(self.rewards[0], self.eval_correct_at) if self.rewards else None


def _source_budgets(sources, suzak_args, config) -> dict[str, PixelBudget]:
    """Each source's pixel budget (its own min_pixels/max_pixels, the recipe's where it sets none) on the model's
    patch grid, when any source sets one; else {} (every row on the recipe's budget)."""
    if not any(source.min_pixels is not None or source.max_pixels is not None for source in sources):
        return {}
    budgets = {}
    for index, source in enumerate(sources):
        low = suzak_args.min_pixels if source.min_pixels is None else source.min_pixels
        high = suzak_args.max_pixels if source.max_pixels is None else source.max_pixels
        if low > high:
            whose = " (the recipe's: set the source's min_pixels too)" if source.min_pixels is None else ""
            raise SuzakError(f"datasets[{index}] ({source.name!r}): max_pixels {high} is below min_pixels {low}{whose}")
        try:
            budgets[source.name] = PixelBudget(low, high).for_model(config)
        except (ValueError, SuzakError) as error:
            raise SuzakError(f"datasets[{index}] ({source.name!r}): {error}") from None
    return budgets


def grpo_trainer(suzak_args, grpo_args, model_args, **trainer_kwargs):
    """The configured :class:`~suzak.training.trainer.VLMGRPOTrainer` of a GRPO recipe (``trainer_kwargs``: more
    of its arguments, ``callbacks`` for one)."""
    from suzak.models.loading import load_processor
    from suzak.training.trainer import VLMGRPOTrainer
    from suzak.trl_internals.rounds import DynamicSampling
    from suzak.trl_internals.sampler_guard import SamplerGuard

    inputs = RunInputs.read(suzak_args, model_args, for_vllm=grpo_args.use_vllm)
    if inputs.sources:
        if grpo_args.reward_weights is not None:
            raise SuzakError("reward_weights: a mixture's sources give their own (datasets[i].reward_weights); "
                             "leave the recipe's unset")  # fmt: skip
        grpo_args.reward_weights = inputs.reward_weights
    toolset = run_tools(suzak_args, inputs, grpo_args.max_tool_calling_iterations)
    if not inputs.rewards and not toolset.scores_rollouts:
        raise SuzakError(f"rewards is empty and tools ({', '.join(toolset.names)}) has no environment that scores its "
                         "episodes (get_reward): name at least one reward")  # fmt: skip
    data = training_data(suzak_args, grpo_args, inputs)
    processing_class = load_processor(model_args, for_vllm=grpo_args.use_vllm)
    check_zoom_turn(toolset, processing_class, inputs, grpo_args)
    check_sources_opening(inputs, processing_class, suzak_args, grpo_args)
    model, processing_class, peft_config = load_policy(suzak_args, grpo_args, model_args, processing_class)
    sampling = None
    if suzak_args.dynamic_sampling:
        sampling = DynamicSampling(suzak_args.dynamic_sampling_min_std, suzak_args.dynamic_sampling_max_rounds)
    trainer = VLMGRPOTrainer(
        model=model,
        reward_funcs=list(inputs.rewards),  # TRL appends an environment's get_reward to the list it is given
        args=grpo_args,
        train_dataset=data.train,
        processing_class=processing_class,
        peft_config=peft_config,
        source_rows=data.source_rows,
        pixel_budget=inputs.budget,
        video_budget=inputs.video_budget,
        answer_format=inputs.template.answer_format if suzak_args.preflight_rows > 0 and not inputs.sources else None,
        preflight_rows=suzak_args.preflight_rows,
        sampler_guard=SamplerGuard(suzak_args.sampler_check_steps, suzak_args.sampler_logp_tolerance),
        opening_in_completion=suzak_args.opening_in_completion,
        dynamic_sampling=sampling,
        vision_reuse=suzak_args.vision_reuse,
        padding_free=suzak_args.padding_free,
        max_tokens_per_micro_batch=suzak_args.max_tokens_per_micro_batch,
        **toolset.trainer_kwargs(),
        **trainer_kwargs,
    )
    add_first(trainer, eval_callback(suzak_args, grpo_args, data.heldout, inputs.scorer, trainer.processing_class,
                                     trainer.pixel_budget, trainer.video_budget, toolset,
                                     inputs.scorers))  # fmt: skip
    return trainer


def _check_sft_sources_all_show_images(dataset) -> None:
    """TRL's SFT collator for a vision-language model puts one image placeholder per image of a row and needs them
    in every row of a batch: a mixture's text source beside image sources stops it at the first mixed batch. One
    line, before the weights load (GRPO mixes them: ``suzak.train``)."""
    from suzak.media.vision import image_columns, images_of
    from suzak.scoring.rewards import SOURCE_COLUMN

    columns = [*image_columns(dataset.column_names), SOURCE_COLUMN]
    bare = sorted({row[SOURCE_COLUMN] for row in dataset.select_columns(columns) if not images_of(row)})
    if bare:
        raise SuzakError(f"suzak.sft on a mixture: source(s) {', '.join(map(repr, bare))} have rows without an image "
                         "beside image sources, which TRL's SFT collator cannot batch together: warm-start them in "
                         "an SFT run of their own (suzak.train's GRPO mixes them)")  # fmt: skip


def check_sources_opening(inputs: RunInputs, processing_class, suzak_args, grpo_args) -> None:
    """A mixture's :func:`suzak.training.checks.check_answer_opening`, each source's template in turn, before the
    weights load (the trainer checks a single dataset's itself): Qwen3.5's thinking prompt would give a
    ``think_answer`` source a format reward of 0 on every row, silently, beside sources that learn."""
    from suzak.training.checks import check_answer_opening

    if suzak_args.opening_in_completion or suzak_args.preflight_rows <= 0:
        return
    for source, _, template in inputs.sources:
        try:
            check_answer_opening(processing_class, template.answer_format, grpo_args.chat_template_kwargs)
        except SuzakError as error:
            raise SuzakError(f"source {source.name!r}: {error}") from None


def sft_trainer(suzak_args, sft_args, model_args, **trainer_kwargs):
    """TRL's ``SFTTrainer`` for an SFT recipe (with suzak's atomic checkpoints: :class:`suzak.trl_internals.hooks.SFTHooks`):
    targets in the template's answer format (:func:`suzak.data.targets.to_sft_dataset`), images fitted to the budget,
    completion-only loss."""
    from suzak.data.targets import to_sft_dataset
    from suzak.media.vision import configure_processor, fit_row_images, image_columns
    from suzak.trl_internals.hooks import SFTHooks

    inputs = RunInputs.read(suzak_args, model_args)
    acting = [(i, source.name) for i, (source, _, _) in enumerate(inputs.sources) if source.tools]
    if acting:  # an episode has no target answer to learn; a zoom's calls are not in the gold answers either
        raise SuzakError(f"datasets[{acting[0][0]}] ({acting[0][1]!r}): tools: suzak sft trains gold answers, not "
                         "episodes or tool calls; leave this source out of the SFT recipe")  # fmt: skip
    dataset, heldout = build_datasets(suzak_args, sft_args, inputs)
    if inputs.sources and image_columns(dataset.column_names):
        _check_sft_sources_all_show_images(dataset)
    # a mixture's rows are each in its own source's answer format, as its rewards score them
    formats = {source.name: template.answer_format for source, _, template in inputs.sources}
    dataset = to_sft_dataset(dataset, formats or inputs.template.answer_format, inputs.family, inputs.budget)
    if image_columns(dataset.column_names):
        dataset = dataset.map(lambda row: fit_row_images(row, inputs.budget), desc="fit images")
    sft_args.completion_only_loss = True
    model, processing_class, peft_config = load_policy(suzak_args, sft_args, model_args)
    configure_processor(processing_class, inputs.budget)  # the loader checked that processor and config agree
    trainer = SFTHooks(
        model=model,
        args=sft_args,
        train_dataset=dataset,
        processing_class=processing_class,
        peft_config=peft_config,
        **trainer_kwargs,
    )
    add_first(trainer, eval_callback(suzak_args, sft_args, heldout, inputs.scorer, processing_class, inputs.budget,
                                     inputs.video_budget, scorers=inputs.scorers))  # fmt: skip
    return trainer


def load_policy(suzak_args, train_args, model_args, processing_class=None):
    """(model, processing_class, peft_config) for GRPO and SFT alike: the model loaded as the recipe says
    (:func:`suzak.models.loading.load_model_and_processor`; ``processing_class``: its processor, when already read),
    a LoRA target that matches nothing stopped here (:func:`suzak.models.lora_targets.check_lora_targets`), the
    vision tower frozen when ``freeze_vision_tower``."""
    from trl import get_peft_config

    from suzak.models.loading import freeze_vision_tower, load_model_and_processor
    from suzak.models.lora_targets import check_lora_targets

    model, processing_class = load_model_and_processor(
        model_args, train_args, quantize_vision_tower=suzak_args.quantize_vision_tower,
        processing_class=processing_class,
    )  # fmt: skip
    peft_config = get_peft_config(model_args)
    check_lora_targets(model, peft_config)
    if suzak_args.freeze_vision_tower:
        freeze_vision_tower(model)
    return model, processing_class, peft_config


def run_tools(suzak_args, inputs: RunInputs, max_steps: int | None):
    """The run's tools (:class:`suzak.models.tools.ToolSet`): the recipe's ``tools`` for every row, or, where a
    mixture's sources name their own (``datasets[i].tools``), each source's for its rows alone
    (:func:`suzak.models.tools.source_tools`); both at once is one line."""
    from suzak.models.tools import check_tool_settings, resolve_tools, source_tools

    budget = inputs.budget.for_crops(suzak_args.tool_max_pixels)
    sources = [source for source, _, _ in inputs.sources]
    if any(source.tools for source in sources):
        if suzak_args.tools:
            raise SuzakError(f"tools: {', '.join(suzak_args.tools)} for the whole run, and the mixture's sources name "
                             "their own (datasets[i].tools): give each source its tools, or leave them to the run")  # fmt: skip
        own = {}  # a source's own pixel budget is its screens' too, within it its own tool_max_pixels where set
        for source in sources:
            own_budget = inputs.source_budgets.get(source.name)
            if own_budget is None and source.tool_max_pixels is None:
                continue
            within = own_budget or inputs.budget
            tool_max_pixels = source.tool_max_pixels or suzak_args.tool_max_pixels
            try:
                check_tool_settings(within.min_pixels, within.max_pixels, tool_max_pixels, None)
            except SuzakError as error:
                whose = "its own pixel budget" if own_budget else "the run's pixel budget"
                raise SuzakError(f"source {source.name!r}: {error} ({whose})") from None
            own[source.name] = within.for_crops(tool_max_pixels)
        heldout = {source.name: source.held_out_rows(suzak_args.eval_rows) for source in sources}
        return source_tools(sources, budget, suzak_args.tool_max_visual_tokens, max_steps, own, heldout)
    return resolve_tools(suzak_args.tools, budget, suzak_args.tool_max_visual_tokens, max_steps)


def check_zoom_turn(toolset, processing_class, inputs: RunInputs, grpo_args) -> None:
    """With the zoom or an episode: its largest image's tool turn against ``max_completion_length``, before any weights
    load (:meth:`suzak.models.tools.ZoomFactory.check_turn`, :meth:`suzak.models.episodes.EpisodeFactory.check_turn`), on the processor as the trainer will render with it: the
    family's tool template and the pixel budget put in, the tool turn counted by TRL's own code
    (:func:`suzak.trl_internals.tools.tool_turn_length`)."""
    from suzak.media.vision import configure_processor
    from suzak.models.episodes import EpisodeFactory
    from suzak.models.tool_calling import prepare_tool_calling
    from suzak.models.tools import ZoomFactory
    from suzak.trl_internals.tools import tool_turn_length

    checked = [factory for factory in toolset.factories if isinstance(factory, ZoomFactory | EpisodeFactory)]
    if not checked:  # (a mixture's: each source's environment, within the budget the processors resize into)
        return
    prepare_tool_calling(processing_class, inputs.family)
    configure_processor(processing_class, inputs.budget)
    turn_length = functools.partial(
        tool_turn_length, processing_class, chat_template_kwargs=grpo_args.chat_template_kwargs
    )
    for factory in checked:
        factory.check_turn(inputs.budget, turn_length, grpo_args.max_completion_length)


@dataclass(frozen=True)
class TrainingData:
    """What a run trains on and holds out (:func:`training_data`)."""

    train: Any  # the training rows: one dataset's, or a mixture's epoch
    heldout: list | None  # the held-out rows (None: none)
    source_rows: dict[str, int] = field(default_factory=dict)  # a mixture's training rows per source; {}: one dataset


def build_datasets(suzak_args, train_args, inputs: RunInputs):
    """(train dataset, held-out rows or None) of :func:`training_data`."""
    data = training_data(suzak_args, train_args, inputs)
    return data.train, data.heldout


def training_data(suzak_args, train_args, inputs: RunInputs) -> TrainingData:
    """The training rows and the held-out rows (never trained on), every row validated before step 1 against
    ``inputs``' budget and rewards; the rows ``skip_bad_rows`` drops, every source's, listed once
    (:func:`_list_skipped`); held-out rows without ``eval_steps`` stopped here, before the weights load."""
    skipped: list[dict] = []
    if inputs.sources:
        data = _mixture(suzak_args, train_args, inputs, skipped)
    else:
        data = _one_dataset(suzak_args, train_args, inputs, skipped)
    _list_skipped(skipped, train_args)
    if data.heldout:
        check_eval_cadence(len(data.heldout), train_args.eval_steps)
    return data


def _one_dataset(suzak_args, train_args, inputs: RunInputs, skipped: list[dict]) -> TrainingData:
    from suzak.data import build_dataset

    options = dict(suzak_args.dataset_options or {})
    options.setdefault("template", suzak_args.prompt_template)
    dataset = _validated(build_dataset(suzak_args.dataset_name, **options), suzak_args, train_args, inputs, skipped)
    dataset, heldout = _held_out(suzak_args.dataset_name, options, dataset, suzak_args.eval_rows)
    if suzak_args.max_train_rows is not None:
        dataset = _first_rows(dataset, suzak_args.max_train_rows, train_args.seed)
    return TrainingData(dataset, heldout)


def _first_rows(dataset, count: int, seed: int):
    """The rows ``max_train_rows`` keeps of ``dataset``: its first ``count`` after a shuffle by ``seed``."""
    return dataset.shuffle(seed=seed).select(range(min(count, len(dataset))))


def _held_out(name: str, options: dict, dataset, eval_rows: int):
    """(training rows, held-out rows or None) of dataset ``name``: a procedural builder's next ``eval_rows`` rows
    (never trained on), otherwise its last ``eval_rows`` rows (at most half), taken out of training."""
    from suzak.data import DATASETS, build_dataset

    if eval_rows <= 0:
        return dataset, None
    if name in SYNTHETIC_DATASETS:
        builder = DATASETS[name]
        num_rows = options.get("num_rows", inspect.signature(builder).parameters["num_rows"].default)
        after = {**options, "num_rows": eval_rows, "start": options.get("start", 0) + num_rows}
        return dataset, list(build_dataset(name, **after))
    count = min(eval_rows, len(dataset) // 2)
    if count < eval_rows:
        logger.warning("eval_rows=%d: only %d of %d rows of %s held out", eval_rows, count, len(dataset), name)
    return dataset.select(range(len(dataset) - count)), list(dataset.select(range(len(dataset) - count, len(dataset))))


def _mixture(suzak_args, train_args, inputs: RunInputs, skipped: list[dict]) -> TrainingData:
    """A mixture's epoch (:func:`suzak.data.mixture.combine`) and held-out rows: each source built with its options
    and template, its rows validated against its own rewards, its rewards' pre-flight run on its own rows, its
    held-out rows (its ``eval_rows``, else the recipe's) named by their source, ``max_train_rows`` split among the
    sources (:func:`_max_train_rows`)."""
    from dataclasses import replace

    from suzak.data import build_dataset
    from suzak.data.mixture import Epoch, combine
    from suzak.media.boxes import with_box_frame
    from suzak.media.vision import PIXEL_BUDGET_COLUMN
    from suzak.scoring.rewards import SOURCE_COLUMN
    from suzak.training.checks import preflight

    parts, heldout = [], []
    for source, funcs, template in inputs.sources:
        options = {"template": source.prompt_template, **source.options}
        budget = inputs.source_budgets.get(source.name, inputs.budget)
        own = replace(inputs, rewards=funcs, sources=(), source_budgets={}, budget=budget)
        try:
            dataset = _validated(build_dataset(source.dataset, **options), suzak_args, train_args, own, skipped,
                                 source.name)  # fmt: skip
            if suzak_args.preflight_rows > 0:
                rows = (with_box_frame(row, inputs.family, budget) for row in dataset)
                preflight(rows, funcs, template.answer_format, num_rows=suzak_args.preflight_rows,
                          reward_weights=list(source.reward_weights) if source.reward_weights else None)  # fmt: skip
        except SuzakError as error:
            raise SuzakError(f"source {source.name!r}: {error}") from None
        dataset, held = _held_out(source.dataset, options, dataset, source.held_out_rows(suzak_args.eval_rows))
        named = {SOURCE_COLUMN: source.name}
        if inputs.source_budgets:  # each row fitted to its source's budget, in training, vLLM and the held-out eval
            if PIXEL_BUDGET_COLUMN in dataset.column_names:
                raise SuzakError(f"source {source.name!r}: its rows have a {PIXEL_BUDGET_COLUMN!r} column of their "
                                 "own; the mixture puts each row's source budget there")  # fmt: skip
            named[PIXEL_BUDGET_COLUMN] = [budget.min_pixels, budget.max_pixels]
            dataset = dataset.add_column(PIXEL_BUDGET_COLUMN, [named[PIXEL_BUDGET_COLUMN]] * len(dataset))
        heldout += [{**row, **named} for row in held or []]
        parts.append(dataset)
    sources = [source for source, _, _ in inputs.sources]
    if suzak_args.max_train_rows is not None:
        parts = _max_train_rows(parts, sources, suzak_args.max_train_rows, train_args.seed)
    epoch = Epoch.of([len(part) for part in parts], [source.weight for source in sources], _batch_prompts(train_args))
    mixed = combine(parts, sources, seed=train_args.seed, total=epoch.rows)
    logger.info("mixture of %d rows: %s", epoch.pass_rows, ", ".join(
        f"{source.name} {source.share:.0%} ({len(part)} rows of {source.dataset})"
        for source, part in zip(sources, parts, strict=True)))  # fmt: skip
    logger.log(logging.INFO if epoch.whole else logging.WARNING, "%s", epoch.describe([s.name for s in sources]))
    return TrainingData(mixed, heldout or None, {source.name: len(part) for source, part in zip(sources, parts,
                                                                                                  strict=True)})  # fmt: skip


def _max_train_rows(parts: list, sources: list, max_rows: int, seed: int) -> list:
    """``max_train_rows`` for a mixture: at most ``max_rows`` training rows in all, split among the sources by weight
    (:func:`suzak.data.mixture.mixture_counts`, at least one each), each source keeping its first rows after a
    shuffle by the seed, as one dataset keeps its own (:func:`_first_rows`)."""
    from suzak.data.mixture import mixture_counts

    counts = mixture_counts([source.weight for source in sources], max_rows)
    kept = [_first_rows(part, count, seed) for part, count in zip(parts, counts, strict=True)]
    logger.info("max_train_rows %d: %s", max_rows, ", ".join(f"{source.name} keeps {len(mine)} of its {len(part)} rows"
                for source, mine, part in zip(sources, kept, parts, strict=True)))  # fmt: skip
    return kept


def _batch_prompts(train_args) -> int:
    """Prompts GRPO's sampler draws at once (``generation_batch_size / num_generations``; TRL drops a last partial
    batch of an epoch); 1 for SFT, whose sampler keeps it."""
    generations = getattr(train_args, "num_generations", None)
    size = getattr(train_args, "generation_batch_size", None)
    return size // generations if generations and size else 1


def _validated(dataset, suzak_args, train_args, inputs: RunInputs, skipped: list[dict], name: str | None = None):
    """``dataset`` once every row passes :func:`suzak.training.checks.validate_rows`; else one line naming the first bad row,
    or, with ``skip_bad_rows``, the good rows (the bad ones added to ``skipped``, for ``OUTPUT_DIR/skipped_rows.jsonl``).
    Images for a text-only model (a budget without a patch factor) are one line too."""
    from suzak.media.video import VIDEO_COLUMN
    from suzak.media.vision import image_columns
    from suzak.scoring.rewards import gold_parser
    from suzak.training.checks import validate_rows

    media = image_columns(dataset.column_names) + [c for c in [VIDEO_COLUMN] if c in dataset.column_names]
    if media and inputs.budget.factor is None:
        raise SuzakError(f"dataset {name or suzak_args.dataset_name} has images or video (column {media[0]}) but the model has "
                         "no vision tower: use a vision-language model, or a text dataset")  # fmt: skip
    parsers = {getattr(r, "__name__", type(r).__name__): p for r in inputs.rewards if (p := gold_parser(r)) is not None}
    start = time.monotonic()
    with train_args.main_process_first(desc="dataset validation"):  # the other ranks then read datasets' cache
        problems = validate_rows(dataset, inputs.budget, parsers, family=inputs.family)
    logger.info("validated %d rows (images decoded and fitted, gold answers read by %s) in %.1f s", len(dataset),
                ", ".join(parsers) or "no reward", time.monotonic() - start)  # fmt: skip
    if not problems:
        return dataset
    source, first = name or suzak_args.dataset_name, problems[0]
    bad = f"{len(problems)} of {len(dataset)} rows bad"
    if not suzak_args.skip_bad_rows:
        raise SuzakError(f"{first.where(source)}, column {first.column}: {first.reason} ({bad}; --skip_bad_rows "
                         "true drops them and lists each in OUTPUT_DIR/skipped_rows.jsonl)")  # fmt: skip
    if len(problems) > suzak_args.max_bad_fraction * len(dataset):
        raise SuzakError(f"{bad}, more than max_bad_fraction {suzak_args.max_bad_fraction:g} of them: fix the data "
                         f"(first: {first.where(source)}, column {first.column}: {first.reason})")  # fmt: skip
    listing = Path(train_args.output_dir) / SKIPPED_ROWS
    skipped += [{"source": source, **vars(p)} for p in problems]
    logger.warning("skip_bad_rows: %s dropped (first: %s, column %s: %s); all listed in %s", bad,
                   first.where(source), first.column, first.reason, listing)  # fmt: skip
    dropped = {p.index for p in problems}
    return dataset.select([i for i in range(len(dataset)) if i not in dropped])


def _list_skipped(skipped: list[dict], train_args) -> None:
    """``OUTPUT_DIR/skipped_rows.jsonl``: every row ``skip_bad_rows`` dropped, every source's, written once per run
    (main process): it replaces an earlier run's list in that folder, and a run that dropped none removes it."""
    if train_args.process_index != 0:
        return
    listing = Path(train_args.output_dir) / SKIPPED_ROWS
    if not skipped:
        listing.unlink(missing_ok=True)
        return
    listing.parent.mkdir(parents=True, exist_ok=True)
    listing.write_text("".join(json.dumps(row) + "\n" for row in skipped), encoding="utf-8")


def check_judges(rewards: list[Callable], sources: tuple = ()) -> None:
    """Every setting of every judge among the rewards (a mixture's: each source's), before any weights load and
    whatever ``preflight_rows`` says (:func:`suzak.scoring.judge.check_judge`): a bad value, a key not in the
    environment or a local judge's folder that does not exist is one line here, naming the source in a mixture, not
    a stop at step 1.

    >>> from suzak.scoring.rewards import resolve_reward
    >>> served = {"model": "j", "base_url": "http://127.0.0.1:8000/v1"}
    >>> check_judges([resolve_reward("judge", served)])
    >>> check_judges([resolve_reward("judge", served | {"max_pixels": 784})])
    Traceback (most recent call last):
    ...
    suzak.SuzakError: judge: max_pixels 784 is below the judge's min_pixels 3136 (the judge's own pixel budget, not the run's; its min_pixels is 3136 unless set)
    """
    from suzak.scoring.judge import check_judge
    from suzak.scoring.rewards import bound_kwargs, is_judge

    named = [("", func) for func in rewards] + [(f"source {source.name!r}: ", func) for source, funcs, _ in sources
                                                for func in funcs]  # fmt: skip
    for where, func in named:
        if not is_judge(func):
            continue
        try:
            check_judge(bound_kwargs(func))
        except SuzakError as error:
            raise SuzakError(f"{where}{error}") from None


def eval_callback(suzak_args, args, heldout, scorer: Callable, processing_class, budget: PixelBudget,
                  video_budget: VideoBudget, toolset=None, scorers: dict[str, Callable] | None = None):  # fmt: skip
    """The generation-eval callback for the held-out rows (None without them; :func:`training_data` checked their
    ``eval_steps``), scored by ``scorer`` (the first reward) with the budgets the trainer runs with; with
    ``toolset``, answered through the tool loop as the rollouts are."""
    from suzak.runs.generation_eval import GenerationEvalCallback

    if not heldout:
        return None
    return GenerationEvalCallback(
        heldout, scorer, processing_class, eval_steps=int(args.eval_steps), budget=budget, video_budget=video_budget,
        batch_size=suzak_args.eval_batch_size, max_new_tokens=suzak_args.eval_max_new_tokens,
        chat_template_kwargs=getattr(args, "chat_template_kwargs", None),
        opening_in_completion=suzak_args.opening_in_completion, toolset=toolset,
        max_tool_calling_iterations=getattr(args, "max_tool_calling_iterations", None), scorers=scorers,
    )  # fmt: skip


def add_first(trainer, callback) -> None:
    """Add ``callback`` ahead of the reporters, so values it adds to a log line reach W&B/TensorBoard; a callback
    with a ``trainer_log`` slot (the generation eval's step-0 baseline) gets the Trainer's ``log``: transformers'
    own, which adds the line to the log history and hands it to every callback; TRL's GRPO and SFT ``log`` would
    also average and clear the step's training metrics, and print or save completions, none of which exist yet."""
    from transformers import Trainer

    if callback is not None:
        trainer.callback_handler.callbacks.insert(0, callback)
        if hasattr(callback, "trainer_log"):
            callback.trainer_log = functools.partial(Trainer.log, trainer)
