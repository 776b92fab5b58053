"""Evaluation tasks: where the items come from, which prompt they get and how an answer is scored.

Each task is data loading + a prompt template + a scorer. The scorers call the same parsers as the training rewards
(:mod:`suzak.parsing`), and each names the reward it agrees with, so a test can hold them to it: an eval score and
a training reward can never disagree about what the model answered.

>>> score("superclevr", "<think> five cars </think> <answer> 5 </answer>", 5)
(5, True)
>>> score("geoqa", "<answer>140°</answer>", "140°")
('140°', True)
>>> score("gsm8k", "16 - 3 - 4 = 9 and 9 * 2 = 18\\n#### 18", "18")
('18', True)
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from suzak import SuzakError
from suzak.parsing import extract_tag, gold_answer, math_equal, parse_count, parse_gsm8k_answer, parse_int_answer
from suzak.parsing import parse_number as _parse_number
from suzak.prompts import build_conversation, get_template

__all__ = [
    "CLEVR_HELDOUT_SEED",
    "SCORERS",
    "TASKS",
    "EvalItem",
    "Scorer",
    "Task",
    "get_task",
    "load_items",
    "missing_images",
    "resolve_template",
    "score",
]

logger = logging.getLogger(__name__)

# clevr_synthetic rows depend only on (seed, index); training recipes use small seeds (0, 42), so this one is held
# out. Do not train on it.
CLEVR_HELDOUT_SEED = 1_000_003


# --- scoring -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scorer:
    """How one task scores an output: ``fn(output, gold) -> (extracted_answer, is_correct)``.

    ``reward`` names the training reward (``suzak.rewards.REWARDS``) that gives 1.0 exactly when this says correct.
    """

    name: str
    reward: str
    fn: Callable[[str, Any], tuple[Any, bool]]


def _score_count(output: str, gold) -> tuple[int | None, bool]:
    """The last ``<answer>`` as a count (``clevr_count``'s parser). R1-V took the first ``<answer>\\s*(\\d+)``."""
    answer = parse_count(output)
    return answer, answer is not None and answer == parse_int_answer(gold_answer(gold))


def _score_math(output: str, gold) -> tuple[str, bool]:
    """``math_equal`` (the ``math_accuracy`` reward); the extracted answer is what it compared."""
    tagged = extract_tag(output, "answer")
    return (output.strip() if tagged is None else tagged), math_equal(output, gold)


def _score_gsm8k(output: str, gold) -> tuple[str | None, bool]:
    """The number after the last ``####`` (else in ``<answer>``), compared numerically (``gsm8k_accuracy``)."""
    answer = parse_gsm8k_answer(output)
    correct = answer is not None and answer == _parse_number(gold_answer(gold))
    return (None if answer is None else str(answer)), correct


SCORERS: dict[str, Scorer] = {
    s.name: s
    for s in (
        Scorer("count", "clevr_count", _score_count),
        Scorer("math", "math_accuracy", _score_math),
        Scorer("gsm8k", "gsm8k_accuracy", _score_gsm8k),
    )
}


# --- items ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EvalItem:
    """One question. ``images`` holds file paths (loaded per run) or PIL images; ``record`` is the input line."""

    index: int
    key: str  # index + a hash of question and image paths: a resumed run only reuses an output for the same item
    record: dict
    prompt: list[dict]
    gold: Any
    images: tuple = ()

    @property
    def image_paths(self) -> list[str]:
        return [p for p in self.images if isinstance(p, str)]


def _item_key(index: int, question: str, images: list) -> str:
    payload = json.dumps({"q": question, "images": [p if isinstance(p, str) else "" for p in images]})
    return f"{index}:{hashlib.sha1(payload.encode()).hexdigest()[:12]}"


def _item(index: int, record: dict, question: str, gold, template: str, images: list) -> EvalItem:
    prompt = build_conversation(get_template(template).render(str(question).strip()), num_images=len(images))
    return EvalItem(index, _item_key(index, str(question), images), record, prompt, gold, tuple(images))


def missing_images(items: list[EvalItem]) -> list[str]:
    """Image paths of ``items`` that are not files, in item order."""
    return [p for item in items for p in item.image_paths if not Path(p).is_file()]


# --- tasks ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Task:
    """An eval task: its loader, prompt templates, scorer and R1-V's defaults."""

    name: str
    loader: Callable[..., list[EvalItem]]
    scorer: str
    eval_template: str
    train_template: str
    prompt_path: str | None = None
    batch_size: int = 16
    max_new_tokens: int = 256
    description: str = ""


def _r1v_items(prompt_path: str, *, image_root: str | None, template: str, **_unused) -> list[EvalItem]:
    """R1-V eval lines ``{"image_path", "question", "ground_truth"}``; paths are relative to ``image_root`` (cwd)."""
    from suzak.data import read_jsonl

    root = Path(image_root or ".")
    items = []
    for number, row in read_jsonl(prompt_path):
        missing = {"image_path", "question", "ground_truth"} - set(row)
        if missing:
            raise SuzakError(f"{prompt_path}:{number}: R1-V eval lines need {sorted(missing)}; got keys {sorted(row)}")
        image = str(root / row["image_path"])
        items.append(_item(len(items), row, row["question"], row["ground_truth"], template, [image]))
    return items


def _gsm8k_items(prompt_path: str | None, *, template: str, **_unused) -> list[EvalItem]:
    """GSM8K test: a local JSONL of ``{"question", "answer"}`` rows, else Hub ``openai/gsm8k`` (split test)."""
    from suzak.data import gsm8k

    dataset = gsm8k(split="test", path=prompt_path, template=template)
    return [
        EvalItem(i, _item_key(i, row["question"], []), {"question": row["question"], "answer": row["answer"]},
                 row["prompt"], row["solution"])
        for i, row in enumerate(dataset)
    ]  # fmt: skip


def _clevr_items(prompt_path: str | None, *, template: str, num_rows: int, data_seed: int, **_unused) -> list[EvalItem]:
    """Held-out procedural CLEVR scenes (seed ``data_seed``, disjoint from training seeds)."""
    from suzak.clevr import generate_rows

    items = []
    for row in generate_rows(num_rows, seed=data_seed, progress=False):
        record = {"seed": data_seed, "index": row["index"], "question": row["problem"], "ground_truth": row["count"]}
        item = _item(len(items), record, row["problem"], row["count"], template, [row["image"]])
        items.append(item)
    return items


TASKS: dict[str, Task] = {
    t.name: t
    for t in (
        Task("superclevr", _r1v_items, "count", "r1v_eval", "r1v", "prompts/superclevr_test200_counting_problems.jsonl",
             64, 256, "SuperCLEVR counting, 200 questions (R1-V)"),
        Task("geoqa", _r1v_items, "math", "r1v_geoqa", "r1v", "prompts/geoqa_test_prompts.jsonl", 50, 1024,
             "GeoQA test, 754 questions (R1-V)"),
        Task("gsm8k", _gsm8k_items, "gsm8k", "gsm8k", "gsm8k", None, 16, 512, "GSM8K test, 1319 questions (text)"),
        Task("clevr_synthetic", _clevr_items, "count", "r1v", "r1v", None, 32, 256,
             "held-out procedural CLEVR counting scenes"),
    )
}  # fmt: skip


def get_task(name: str) -> Task:
    try:
        return TASKS[name]
    except KeyError:
        raise SuzakError(f"unknown eval task {name!r}; known: {', '.join(TASKS)}") from None


def resolve_template(task: Task, name: str = "eval") -> str:
    """``eval`` (the task's R1-V eval prompt), ``train`` (the training prompt) or any ``suzak.prompts`` template."""
    template = {"eval": task.eval_template, "train": task.train_template}.get(name, name)
    try:
        get_template(template)
    except ValueError as error:
        raise SuzakError(f"--prompt_template: {error} (or eval, train)") from None
    return template


def load_items(task: Task, prompt_path: str | None = None, **options) -> list[EvalItem]:
    """The task's items; ``options`` go to its loader (``template``, ``image_root``, ``num_rows``, ``data_seed``)."""
    return task.loader(prompt_path or task.prompt_path, **options)


def score(scorer: str, output: str, gold) -> tuple[Any, bool]:
    """``(extracted_answer, is_correct)`` for ``output`` under a scorer (a ``SCORERS`` key or a task name)."""
    name = TASKS[scorer].scorer if scorer in TASKS else scorer
    return SCORERS[name].fn(output, gold)
