"""GRPO training: ``python -m suzak.train --config recipes/smoke.yaml [--any_field value ...]``.

Parsed with TRL's ``TrlParser`` from three dataclasses: suzak's :class:`~suzak.training.configs.SuzakArguments` (data, pixel
budget, rewards), TRL's ``GRPOConfig`` (every GRPO/TrainingArguments field as TRL defines it) and TRL's
``ModelConfig`` (model, dtype, attention, LoRA). The YAML recipe sets values; CLI flags override it. ``.env``
(python-dotenv) holds secrets and machine paths; MODEL, DATASET and OUTPUT_DIR there override the recipe (CLI flags
still win). The run itself (records, resume, plots, publishing) is :mod:`suzak.training.session`'s, shared with SFT.
"""

from __future__ import annotations

from suzak.training import session
from suzak.training.configs import SuzakArguments, parse_args
from suzak.training.session import build_datasets, build_eval_callback

__all__ = ["SuzakArguments", "build_trainer", "main", "parse_args"]


def build_trainer(suzak_args, grpo_args, model_args, train_dataset=None, **trainer_kwargs):
    """The configured :class:`VLMGRPOTrainer` (model, processor, rewards, data, budget, LoRA)."""
    from trl import get_peft_config

    from suzak.models.loading import freeze_vision_tower, load_model_and_processor, model_budget
    from suzak.models.lora_targets import check_lora_targets
    from suzak.models.tools import resolve_tools
    from suzak.scoring.prompts import get_template
    from suzak.scoring.rewards import resolve_rewards
    from suzak.training.trainer import VLMGRPOTrainer
    from suzak.trl_internals import DynamicSampling, SamplerGuard

    template = get_template(suzak_args.prompt_template)
    reward_funcs = resolve_rewards(suzak_args.rewards, suzak_args.reward_kwargs)
    budget = model_budget(
        model_args, suzak_args.min_pixels, suzak_args.max_pixels, for_vllm=grpo_args.use_vllm
    )  # the model's patch factor
    toolset = resolve_tools(suzak_args.tools, budget.for_crops(suzak_args.tool_max_pixels),
                            suzak_args.tool_max_visual_tokens)  # fmt: skip
    heldout = None
    if train_dataset is None:
        train_dataset, heldout = build_datasets(suzak_args, grpo_args, budget)
    model, processing_class = load_model_and_processor(
        model_args, grpo_args, quantize_vision_tower=suzak_args.quantize_vision_tower
    )
    peft_config = get_peft_config(model_args)
    check_lora_targets(model, peft_config)  # a LoRA target that matches nothing stops here, not silently
    if suzak_args.freeze_vision_tower:
        freeze_vision_tower(model)
    sampling = None
    if suzak_args.dynamic_sampling:
        sampling = DynamicSampling(suzak_args.dynamic_sampling_min_std, suzak_args.dynamic_sampling_max_rounds)
    trainer = VLMGRPOTrainer(
        model=model,
        reward_funcs=reward_funcs,
        args=grpo_args,
        train_dataset=train_dataset,
        processing_class=processing_class,
        peft_config=peft_config,
        pixel_budget=budget,
        video_budget=suzak_args.video_budget(),
        answer_format=template.answer_format if suzak_args.preflight_rows > 0 else None,
        preflight_rows=suzak_args.preflight_rows,
        sampler_guard=SamplerGuard(suzak_args.sampler_check_steps, suzak_args.sampler_logp_tolerance),
        opening_in_completion=suzak_args.opening_in_completion,
        dynamic_sampling=sampling,
        **toolset.trainer_kwargs(),
        **trainer_kwargs,
    )
    session.add_first(trainer, build_eval_callback(suzak_args, grpo_args, heldout, trainer.processing_class,
                                                   trainer.pixel_budget, toolset))  # fmt: skip
    return trainer


def main(argv: list[str] | None = None) -> None:
    session.main(argv, parse_args, build_trainer)


if __name__ == "__main__":
    main()
