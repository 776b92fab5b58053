"""SFT warm starts with TRL's ``SFTTrainer`` (loss on the completion only), for GSM8K and CLEVR counting.

    python -m suzak.sft --config recipes/sft_smoke.yaml [--any_field value ...]
    bash src/scripts/run_sft.sh --preset smoke

Same conventions as ``suzak.train``: ``TrlParser`` over suzak's :class:`~suzak.training.configs.SuzakArguments`, TRL's
``SFTConfig`` and ``ModelConfig``; YAML recipe, then ``.env`` (MODEL/DATASET/OUTPUT_DIR), then CLI flags. The
targets are built from the prompt template's answer format, so an SFT model answers in exactly the format the GRPO
rewards score (``model_name_or_path`` of a GRPO recipe can point at the SFT output):

- GSM8K rows: the worked answer ending ``#### N`` with the ``<<…>>`` calculator spans removed (``gsm8k``
  template), or the same steps inside ``<think>`` and the number in ``<answer>`` (``gsm8k_think``);
- CLEVR scenes: ``<think>`` + the scene description + ``</think> <answer> N </answer>``;
- anything else: the gold answer in the template's answer format.
"""

from __future__ import annotations

import json
import logging
import re

from suzak import SuzakError
from suzak.media.boxes import QUESTION_BOXES_COLUMN, model_answer, with_box_frame
from suzak.scoring.prompts import get_template, render_answer
from suzak.training import session
from suzak.training.configs import parse_sft_args
from suzak.training.session import add_first, build_datasets, build_eval_callback

__all__ = ["build_sft_trainer", "main", "parse_sft_args", "sft_completion", "to_sft_dataset"]

logger = logging.getLogger(__name__)

CALCULATOR_SPAN = re.compile(r"\$?<<[^>]+>>")  # GSM8K's "<<48/2=24>>" annotations (and a "$" glued before them)


def _gsm8k_steps(answer: str) -> str:
    """The worked steps of a GSM8K answer, calculator spans removed, without the final ``#### N`` line."""
    lines = CALCULATOR_SPAN.sub("", answer).strip().splitlines()
    return "\n".join(line for line in lines if not line.startswith("####")).strip()


def _clevr_reasoning(row: dict) -> str:
    from suzak.data.clevr import Scene, describe_scene

    scene = Scene.from_dict(json.loads(row["scene"]))
    return f"{describe_scene(scene)} Counting the objects the question asks about gives {row['count']}."


def sft_completion(row: dict, answer_format: str) -> str:
    """The target completion for one row in ``answer_format`` (see the module docstring); a grounding row's boxes in
    its model's frame (:func:`suzak.media.boxes.model_answer`, from the row's ``box_frame``)."""
    gold = model_answer(row)
    if isinstance(row.get("answer"), str) and "####" in row["answer"]:
        return render_answer(answer_format, gold, _gsm8k_steps(row["answer"]))
    if row.get("scene"):
        return render_answer(answer_format, gold, _clevr_reasoning(row))
    return render_answer(answer_format, gold)


def to_sft_dataset(dataset, answer_format: str, family: str | None = None, budget=None):
    """Add TRL's prompt-completion ``completion`` column (one assistant turn) to a suzak dataset; with the model's
    ``family`` and pixel ``budget``, a grounding row's target boxes are in that model's frame at the size the budget
    gives its image."""

    def add_completion(row: dict, index: int) -> dict:
        try:
            framed = with_box_frame(row, family, budget) if budget is not None else row
            text = sft_completion(framed, answer_format)
        except (ValueError, TypeError, KeyError) as error:
            raise SuzakError(f"cannot build the SFT target of row {index}: {error}") from None
        completion = {"completion": [{"role": "assistant", "content": text}]}
        return completion | ({"prompt": framed["prompt"]} if questions_with_boxes else {})  # boxes put in the frame

    questions_with_boxes = QUESTION_BOXES_COLUMN in dataset.column_names and budget is not None
    return dataset.map(add_completion, with_indices=True, desc="SFT targets")


def build_sft_trainer(suzak_args, sft_args, model_args, **trainer_kwargs):
    """The configured TRL ``SFTTrainer`` (with suzak's atomic checkpoints: :class:`suzak.trl_internals.SFTHooks`):
    images fitted to the budget, completion-only loss, optional eval callback."""
    from trl import get_peft_config

    from suzak.media.vision import configure_processor, fit_row_images, image_columns
    from suzak.models.loading import freeze_vision_tower, load_model_and_processor, model_budget, model_type
    from suzak.models.lora_targets import check_lora_targets
    from suzak.trl_internals import SFTHooks

    budget = model_budget(model_args, suzak_args.min_pixels, suzak_args.max_pixels)  # the model's patch factor
    template = get_template(suzak_args.prompt_template)
    dataset, heldout = build_datasets(suzak_args, sft_args, budget)
    dataset = to_sft_dataset(dataset, template.answer_format, model_type(model_args), budget)
    if image_columns(dataset.column_names):
        dataset = dataset.map(lambda row: fit_row_images(row, budget), desc="fit images")
    sft_args.completion_only_loss = True
    model, processing_class = load_model_and_processor(
        model_args, sft_args, quantize_vision_tower=suzak_args.quantize_vision_tower
    )
    budget = budget.for_model(processing_class)  # the loader checked that processor and config agree
    configure_processor(processing_class, budget)
    peft_config = get_peft_config(model_args)
    check_lora_targets(model, peft_config)  # a LoRA target that matches nothing stops here, not silently
    if suzak_args.freeze_vision_tower:
        freeze_vision_tower(model)
    trainer = SFTHooks(
        model=model,
        args=sft_args,
        train_dataset=dataset,
        processing_class=processing_class,
        peft_config=peft_config,
        **trainer_kwargs,
    )
    add_first(trainer, build_eval_callback(suzak_args, sft_args, heldout, processing_class, budget))
    return trainer


def main(argv: list[str] | None = None) -> None:
    """The training run of :mod:`suzak.training.session` (records, CSV streams, plots, resume, release) with SFT's trainer."""
    session.main(argv, parse_sft_args, build_sft_trainer)


if __name__ == "__main__":
    main()
