"""SFT target completions: TRL's prompt-completion ``completion`` column for a suzak dataset (``suzak.sft``).

The targets are built from the prompt template's answer format, so an SFT model answers in exactly the format the GRPO
rewards score:

- GSM8K rows: the worked answer ending ``#### N`` with the ``<<…>>`` calculator spans removed (``gsm8k``
  template), or the same steps inside ``<think>`` and the number in ``<answer>`` (``gsm8k_think``);
- CLEVR scenes: ``<think>`` + the scene description + ``</think> <answer> N </answer>``;
- anything else: the gold answer in the template's answer format.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from suzak import SuzakError
from suzak.media.boxes import QUESTION_BOXES_COLUMN, model_answer, with_box_frame
from suzak.scoring.prompts import render_answer

__all__ = ["sft_completion", "to_sft_dataset"]

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


def to_sft_dataset(dataset, answer_format: str | Mapping[str, str], family: str | None = None, budget=None):
    """Add TRL's prompt-completion ``completion`` column (one assistant turn) to a suzak dataset; with the model's
    ``family`` and pixel ``budget``, a grounding row's target boxes are in that model's frame at the size the budget
    (or the row's own, a mixture source's) gives its image. A mixture's ``answer_format`` is each source's, by name:
    each row's target is in its own source's format (the row's ``source``)."""
    from suzak.scoring.rewards import SOURCE_COLUMN

    def add_completion(row: dict, index: int) -> dict:
        try:
            framed = with_box_frame(row, family, budget) if budget is not None else row
            own = answer_format if isinstance(answer_format, str) else answer_format[row[SOURCE_COLUMN]]
            text = sft_completion(framed, own)
        except (ValueError, TypeError, KeyError) as error:
            raise SuzakError(f"cannot build the SFT target of row {index}: {error}") from None
        completion = {"completion": [{"role": "assistant", "content": text}]}
        return completion | ({"prompt": framed["prompt"]} if questions_with_boxes else {})  # boxes put in the frame

    questions_with_boxes = QUESTION_BOXES_COLUMN in dataset.column_names and budget is not None
    return dataset.map(add_completion, with_indices=True, desc="SFT targets")
