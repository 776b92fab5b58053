"""Evaluation tasks: where the items come from, which prompt they get and how an answer is scored.

Each task is data loading + a prompt template + its scoring rules, each a scorer built on :mod:`suzak.scoring.parsing`:

- ``strict``: suzak's rule, the training reward's own parser (each strict scorer names the reward it agrees with, so
  a test holds them to it: an eval score and a training reward never disagree about what the model answered);
- ``r1v``: R1-V's eval scripts' rule, exactly, so a figure can stand beside R1-V's published table.

GSM8K has only ``strict``: R1-V never evaluated GSM8K, so there is no R1-V rule to reproduce.
``jsonl`` (a user's own file of image or video questions) has only ``strict``, scored by the training reward the
run names (``--reward``).

>>> score("superclevr", "<think> five cars </think> <answer> 5 </answer>", 5)
(5, True)
>>> score("superclevr", "<answer>5.0</answer>", 5), score("superclevr", "<answer>5.0</answer>", 5, "r1v")
((5, True), (None, False))
>>> score("geoqa", "<answer>140°</answer>", "140°"), score("geoqa", "<answer>140°</answer>", "140°", "r1v")
(('140°', True), (None, False))
>>> score("gsm8k", "16 - 3 - 4 = 9 and 9 * 2 = 18\\n#### 18", "18")
('18', True)
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from suzak import SuzakError
from suzak.media.boxes import BoxFrame
from suzak.scoring.parsing import (
    box_parser,
    extract_tag,
    gold_answer,
    gold_boxes,
    math_equal,
    parse_count,
    parse_gsm8k_answer,
    parse_int_answer,
    parse_word,
    r1v_count,
    r1v_math_verify,
    vlm_r1_box,
    vlm_r1_iou,
)
from suzak.scoring.parsing import parse_number as _parse_number
from suzak.scoring.prompts import DEFAULT_TEMPLATE, build_conversation, get_template

__all__ = [
    "CLEVR_HELDOUT_SEED",
    "SCORERS",
    "SCORING_RULES",
    "TASKS",
    "EvalItem",
    "box_gold",
    "Scorer",
    "Task",
    "get_task",
    "item_problem",
    "load_items",
    "missing_images",
    "resolve_template",
    "score",
    "score_rules",
]

logger = logging.getLogger(__name__)

# clevr_synthetic rows depend only on (seed, index); training recipes use small seeds (0, 42), so this one is held
# out. Do not train on it.
CLEVR_HELDOUT_SEED = 1_000_003


# --- scoring -------------------------------------------------------------------------------------------------------


SCORING_RULES: dict[str, str] = {
    "r1v": "R1-V's eval scripts' rule, the one behind R1-V's published numbers",
    "vlm_r1": "VLM-R1's REC eval rule (src/eval/test_rec_r1.py), the one behind VLM-R1's published numbers",
    "strict": "suzak's rule, the training reward's parser",
}


@dataclass(frozen=True)
class Scorer:
    """How one rule scores an output: ``fn(output, gold) -> (extracted_answer, is_correct)``.

    ``reward`` names the training reward (``suzak.scoring.rewards.REWARDS``) that gives 1.0 exactly when this says correct;
    None for R1-V's eval rules, which no training reward matches (R1-V's own training reward differs from its eval).
    A gold answer that cannot be read raises ``ValueError``: bad data is never scored as a wrong answer.
    """

    name: str
    rule: str  # a SCORING_RULES key
    reward: str | None
    fn: Callable[[str, Any], tuple[Any, bool]]


def _gold_count(gold) -> int:
    count = parse_int_answer(gold_answer(gold))
    if count is None:
        raise ValueError(f"gold answer {gold!r:.100} is not a count")
    return count


def _score_count(output: str, gold) -> tuple[int | None, bool]:
    """The last ``<answer>`` as a count (``clevr_count``'s parser): digits, ``3.0``, number words."""
    gold_count, answer = _gold_count(gold), parse_count(output)  # the gold is read first: a bad one always raises
    return answer, answer is not None and answer == gold_count


def _score_r1v_count(output: str, gold) -> tuple[int | None, bool]:
    """R1-V's SuperCLEVR rule: the first ``<answer>\\s*(\\d+)\\s*</answer>`` as an int, equal to the gold count."""
    gold_count, answer = _gold_count(gold), r1v_count(output)
    return answer, answer is not None and answer == gold_count


def _score_math(output: str, gold) -> tuple[str, bool]:
    """``math_equal`` (the ``math_accuracy`` reward); the extracted answer is what it compared."""
    tagged = extract_tag(output, "answer")
    return (output.strip() if tagged is None else tagged), math_equal(output, gold)


def _score_r1v_math(output: str, gold) -> tuple[str | None, bool]:
    """R1-V's GeoQA rule: math-verify of the whole output against the raw gold (``r1v_math_verify``)."""
    gold_answer(gold)  # a missing or empty gold raises instead of scoring every output wrong
    return r1v_math_verify(output, str(gold))


def _score_gsm8k(output: str, gold) -> tuple[str | None, bool]:
    """The number after the last ``####`` (else in ``<answer>``), compared numerically (``gsm8k_accuracy``)."""
    answer = parse_gsm8k_answer(output)
    expected = _parse_number(gold_answer(gold))
    if expected is None:
        raise ValueError(f"gold answer {gold!r:.100} is not a number")
    correct = answer is not None and answer == expected
    return (None if answer is None else str(answer)), correct


def _score_word(output: str, gold) -> tuple[str | None, bool]:
    """The whole output as one word (``word_match``'s parser with ``plain`` answers), equal to the gold word."""
    expected = parse_word(gold_answer(gold))
    if expected is None:
        raise ValueError(f"gold answer {gold!r:.100} is not one word")
    answer = parse_word(output)
    return answer, answer == expected


def _score_episode(output, gold) -> tuple[float | None, bool]:
    """An episode's verdict is its environment's (:mod:`suzak.models.episodes`): the reward, and success. ``output``
    is the tool loop's record of the episode (its ``episode``); a text answer alone is no episode (None, False)."""
    episode = output.get("episode") if isinstance(output, dict) else None
    if not episode:
        return None, False
    return episode["reward"], bool(episode["success"])


def box_gold(boxes: list, answer_format: str = "box", frame: dict | None = None) -> dict:
    """A grounding item's gold: its boxes in original-image pixels, the answer format its prompt asks for, and its
    :class:`suzak.media.boxes.BoxFrame` (set once the engine's model family and pixel budget are known:
    :func:`suzak.eval.runner.with_box_frames`)."""
    return {"boxes": [[float(v) for v in box] for box in boxes], "answer_format": answer_format, "frame": frame}


def _read_box_gold(gold) -> tuple[list[list[float]], str, BoxFrame | None]:
    if not isinstance(gold, dict) or not gold.get("boxes"):
        raise ValueError(f"gold answer {gold!r:.100} holds no boxes")
    for box in gold["boxes"]:
        if not (isinstance(box, list | tuple) and len(box) == 4):
            raise ValueError(f"gold box {box!r:.60} is not 4 numbers")
    frame = BoxFrame.from_dict(gold["frame"]) if gold.get("frame") else None
    return gold["boxes"], gold.get("answer_format", "box"), frame


def _score_rec(output: str, gold) -> tuple[list | None, bool]:
    """The ``rec_accuracy`` reward, called as training calls it: the first box of the answer format in the item's
    frame, IoU >= 0.5 with the gold box in that frame. The extracted answer is that box in original pixels."""
    from suzak.scoring.rewards import rec_accuracy

    boxes, answer_format, frame = _read_box_gold(gold)
    if frame is None:  # the item is only being checked (no model yet)
        return None, False
    [correct] = rec_accuracy([output], [json.dumps(boxes)], [frame.as_dict()], answer_format=answer_format)
    found = box_parser(answer_format)(output)
    return ([round(v, 2) for v in frame.from_model(found[0])] if found else None), correct == 1.0


def _score_vlm_r1(output: str, gold) -> tuple[list | None, bool]:
    """VLM-R1's REC rule: its box (:func:`suzak.scoring.parsing.vlm_r1_box`, [0, 0, 0, 0] when none) mapped to original
    pixels from the model's frame (VLM-R1 maps from Qwen2.5-VL's resized size; the relative frames map from 1000), its
    IoU function (:func:`suzak.scoring.parsing.vlm_r1_iou`) with the gold box strictly above 0.5."""
    boxes, _, frame = _read_box_gold(gold)
    if frame is None:
        return None, False
    box = [round(v, 2) for v in frame.from_model(vlm_r1_box(output))]
    return box, vlm_r1_iou(box, boxes[0]) > 0.5


def _score_click(output: str, gold) -> tuple[list | None, bool]:
    """The ``click_accuracy`` reward, called as training calls it: the answer's point in the item's frame inside the
    gold box there. The extracted answer is that point in original pixels."""
    from suzak.scoring.parsing import point_parser
    from suzak.scoring.rewards import click_accuracy

    boxes, answer_format, frame = _read_box_gold(gold)
    if frame is None:  # the item is only being checked (no model yet)
        return None, False
    [correct] = click_accuracy([output], [json.dumps(boxes[0])], [frame.as_dict()], answer_format=answer_format)
    point = point_parser(answer_format)(output)
    return ([round(v, 2) for v in frame.point_from_model(point)] if point else None), correct == 1.0


SCORERS: dict[str, Scorer] = {
    s.name: s
    for s in (
        Scorer("count", "strict", "clevr_count", _score_count),
        Scorer("r1v_count", "r1v", None, _score_r1v_count),
        Scorer("math", "strict", "math_accuracy", _score_math),
        Scorer("r1v_math", "r1v", None, _score_r1v_math),
        Scorer("gsm8k", "strict", "gsm8k_accuracy", _score_gsm8k),
        Scorer("word", "strict", "word_match", _score_word),
        Scorer("rec", "strict", "rec_accuracy", _score_rec),
        Scorer("vlm_r1_rec", "vlm_r1", None, _score_vlm_r1),
        Scorer("click", "strict", "click_accuracy", _score_click),
        Scorer("episode", "strict", None, _score_episode),  # the environment's own reward (TRL's get_reward)
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
    source: str | None = None  # "file:line" of the input line, when the items come from a file
    video: Any = None  # a video file path, a list of frames or a (T, H, W, 3) array, read to the video budget
    video_fps: float | None = None  # the frame rate of a list or array of frames
    columns: tuple = ()  # (name, value) pairs the generation row also gets: what an episode's environment resets from

    def where(self) -> str:
        return self.source or f"item {self.index}"

    @property
    def image_paths(self) -> list[str]:
        return [p for p in self.images if isinstance(p, str)]


def _item_key(index: int, question: str, images: list) -> str:
    payload = json.dumps({"q": question, "images": [p if isinstance(p, str) else "" for p in images]})
    return f"{index}:{hashlib.sha1(payload.encode()).hexdigest()[:12]}"


def _item(index: int, record: dict, question: str, gold, template: str, images: list,
          source: str | None = None) -> EvalItem:  # fmt: skip
    prompt = build_conversation(get_template(template).render(str(question).strip()), num_images=len(images))
    return EvalItem(index, _item_key(index, str(question), images), record, prompt, gold, tuple(images), source)


def missing_images(items: list[EvalItem]) -> list[str]:
    """Image paths of ``items`` that are not files, in item order."""
    return [p for item in items for p in item.image_paths if not Path(p).is_file()]


def item_problem(item: EvalItem, task: Task) -> str:
    """Why ``item`` cannot be evaluated ('' when it can): an image file that does not decode to the last byte, a video
    that is missing or unreadable (:func:`suzak.media.video.video_problem`), or a gold answer one of the task's scoring rules
    cannot read. Checked at load, before any model loads."""
    from PIL import Image

    from suzak.media.video import video_problem

    if item.video is not None and (reason := video_problem(item.video)):
        return reason
    for path in item.image_paths:
        try:
            with Image.open(path) as image:
                image.load()
        except Image.UnidentifiedImageError:
            return f"{path}: not an image PIL can read"
        except (OSError, ValueError, SyntaxError) as error:
            return (
                f"{path}: unreadable image ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})"
            )
    try:
        score_rules(task, "", item.gold)
    except (ValueError, TypeError) as error:
        return f"cannot read the gold answer {item.gold!r:.80} ({error})"
    return ""


# --- tasks ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Task:
    """An eval task: its loader, scoring rules (``SCORING_RULES`` key → ``SCORERS`` key), prompts, R1-V's defaults."""

    name: str
    loader: Callable[..., list[EvalItem]]
    scorers: dict[str, str]
    eval_template: str
    train_template: str
    prompt_path: str | None = None
    batch_size: int = 16
    max_new_tokens: int = 256
    description: str = ""

    @property
    def rules(self) -> list[str]:
        """The scoring rules this task has, in ``SCORING_RULES`` order."""
        return [rule for rule in SCORING_RULES if rule in self.scorers]

    def scorer(self, rule: str) -> Scorer:
        """The scorer of ``rule``; one line saying why when the task has no such rule."""
        if rule not in SCORING_RULES:
            raise SuzakError(f"unknown scoring rule {rule!r}; known: {', '.join(SCORING_RULES)}")
        if rule not in self.scorers:
            why = f" ({_NO_RULE[(self.name, rule)]})" if (self.name, rule) in _NO_RULE else ""
            raise SuzakError(f"{self.name} has no {rule!r} scoring rule{why}; "
                             f"use {' or '.join(self.rules)}")  # fmt: skip
        return SCORERS[self.scorers[rule]]

    def scored_by(self, reward: str) -> Task:
        """This task scored by the ``strict`` scorer that agrees with training reward ``reward`` (``jsonl``'s
        ``--reward``); one line naming the rewards that have one when it has none."""
        by_reward = {scorer.reward: scorer.name for scorer in SCORERS.values() if scorer.reward}
        if by_reward.get(reward) in ("rec", "click"):
            raise SuzakError(f"--reward {reward!r}: boxes and clicks are scored in each image's frame by `suzak.eval "
                             "rec` (your JSONL of grounding lines, VLM-R1's files or the Hub layout) or `suzak.eval "
                             "gui_click` (docs/grounding.md)")  # fmt: skip
        if reward not in by_reward:
            usable = [name for name, scorer in by_reward.items() if scorer not in ("rec", "click")]
            raise SuzakError(f"--reward {reward!r}: no eval scorer agrees with it; one of: {', '.join(usable)}")
        return replace(self, scorers={"strict": by_reward[reward]})

    def other_rule(self, rule: str) -> str | None:
        """The rule reported beside ``rule`` (None when the task has only one)."""
        return next((r for r in self.rules if r != rule), None)


# Why a task lacks a rule, said where the rule is refused.
_NO_RULE = {
    ("gsm8k", "r1v"): "R1-V never evaluated GSM8K, so there is no R1-V rule to reproduce",
    ("moving_ball", "r1v"): "R1-V has no video task, so there is no R1-V rule to reproduce",
    ("jsonl", "r1v"): "R1-V's rules belong to its own test sets",
    ("rec", "r1v"): "R1-V has no grounding task; VLM-R1's rule is vlm_r1",
    ("grounding_shapes", "r1v"): "R1-V has no grounding task; VLM-R1's rule is vlm_r1",
    ("gui_click", "r1v"): "R1-V has no GUI task",
    ("gui_click", "vlm_r1"): "VLM-R1's rule reads boxes, a click is a point",
    ("miniwob", "r1v"): "R1-V has no GUI task; an episode is scored by its environment",
}


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
        source = f"{prompt_path}:{number}"
        items.append(_item(len(items), row, row["question"], row["ground_truth"], template, [image], source))
    return items


def _gsm8k_items(prompt_path: str | None, *, template: str, **_unused) -> list[EvalItem]:
    """GSM8K test: a local JSONL of ``{"question", "answer"}`` rows, else Hub ``openai/gsm8k`` (split test)."""
    from suzak.data.builders import gsm8k

    dataset = gsm8k(split="test", path=prompt_path, template=template)
    return [
        EvalItem(i, _item_key(i, row["question"], []), {"question": row["question"], "answer": row["answer"]},
                 row["prompt"], row["solution"])
        for i, row in enumerate(dataset)
    ]  # fmt: skip


def _clevr_items(prompt_path: str | None, *, template: str, num_rows: int, data_seed: int, **_unused) -> list[EvalItem]:
    """Held-out procedural CLEVR scenes (seed ``data_seed``, disjoint from training seeds)."""
    from suzak.data.clevr import generate_rows

    items = []
    for row in generate_rows(num_rows, seed=data_seed, progress=False):
        record = {"seed": data_seed, "index": row["index"], "question": row["problem"], "ground_truth": row["count"]}
        item = _item(len(items), record, row["problem"], row["count"], template, [row["image"]])
        items.append(item)
    return items


def _moving_ball_items(prompt_path: str | None, *, template: str, num_rows: int, data_seed: int,
                       **_unused) -> list[EvalItem]:  # fmt: skip
    """Held-out procedural clips of a ball moving left or right (``recipes/video_smoke.yaml``'s task), drawn with
    ``data_seed`` (training draws with small seeds)."""
    from suzak.data.motion import moving_ball

    items = []
    for row in moving_ball(num_rows, seed=data_seed, template=template):
        question = row["prompt"][-1]["content"][-1]["text"]
        record = {"seed": data_seed, "index": row["index"], "question": question, "ground_truth": row["solution"]}
        key = _item_key(len(items), f"{question} {data_seed}:{row['index']}", [])
        items.append(EvalItem(len(items), key, record, row["prompt"], row["solution"], video=row["video"],
                              video_fps=row["video_fps"]))  # fmt: skip
    return items


def _jsonl_items(prompt_path: str | None, *, image_root: str | None, template: str, **_unused) -> list[EvalItem]:
    """A file of image or video questions in training's JSONL format, each line read by the same function as
    training's ``jsonl`` dataset (:func:`suzak.data.builders.jsonl_record`); paths are relative to ``image_root``,
    else to the file's folder (as in training). A missing image or video is found by :func:`prepare_items`' checks
    (one line, or skipped with ``--skip_missing``)."""
    from suzak.data.builders import jsonl_record, read_jsonl

    if prompt_path is None:
        raise SuzakError("jsonl: pass --prompt_path FILE.jsonl (image or video questions in training's format: "
                         "docs/evaluate.md)")  # fmt: skip
    path = Path(prompt_path)
    root = Path(image_root) if image_root is not None else path.parent
    items = []
    for number, line in read_jsonl(path):
        row = jsonl_record(line, number, path, root, template, [])
        images = row.get("images") or ([row["image"]] if row.get("image") else [])
        video = row.get("video")
        key = _item_key(len(items), f"{row['problem']} {json.dumps(video)}", images)
        items.append(EvalItem(len(items), key, line, row["prompt"], row["solution"], tuple(images),
                              f"{prompt_path}:{number}", video, row.get("video_fps")))  # fmt: skip
    if not items:
        raise SuzakError(f"{path}: no rows")
    return items


def _rec_items(prompt_path: str | None, *, image_root: str | None, template: str, **_unused) -> list[EvalItem]:
    """RefCOCO/+/g: one of VLM-R1's annotation files (``refcoco_val.json``: images under ``--image_root``, the COCO
    folder) or a local copy of the Hub layout (a folder), read by training's loader (:mod:`suzak.data.refcoco`)."""
    from suzak.data.refcoco import refcoco

    if prompt_path is None:
        raise SuzakError("rec: pass --prompt_path (VLM-R1's refcoco_val.json with --image_root the COCO folder, or a "
                         "saved copy of lmms-lab/RefCOCO): docs/grounding.md")  # fmt: skip
    suffix = Path(prompt_path).suffix
    dataset = refcoco(path=prompt_path, image_root=image_root if suffix in (".json", ".jsonl") else None,
                      template=template)  # fmt: skip
    if suffix in (".json", ".jsonl"):
        import datasets

        dataset = dataset.cast_column("image", datasets.Image(decode=False))  # files: checked, loaded per batch
    return _box_items(dataset, template, str(prompt_path))


def _grounding_items(prompt_path: str | None, *, template: str, num_rows: int, data_seed: int,
                     **_unused) -> list[EvalItem]:  # fmt: skip
    """Held-out procedural grounding scenes (:func:`suzak.data.grounding.grounding_shapes`, seed ``data_seed``)."""
    from suzak.data.grounding import grounding_shapes

    return _box_items(grounding_shapes(num_rows, seed=data_seed, template=template), template, None)


def _gui_click_items(prompt_path: str | None, *, template: str, num_rows: int, data_seed: int,
                     **_unused) -> list[EvalItem]:  # fmt: skip
    """Held-out procedural GUI screens (:func:`suzak.data.gui.gui_click`, seed ``data_seed``): the named button's box
    is the gold a click must land in."""
    from suzak.data.gui import gui_click

    return _box_items(gui_click(num_rows, seed=data_seed, template=template), template, None)


def _miniwob_items(prompt_path: str | None, *, template: str, data_seed: int, miniwob_tasks: list[str] | None = None,
                   episodes: int = 20, **_unused) -> list[EvalItem]:  # fmt: skip
    """MiniWoB++ episodes in Chromium (:func:`suzak.data.miniwob.miniwob_rows`): ``episodes`` seeds from
    ``data_seed`` on for each of ``miniwob_tasks``, each with its first screen; the environment scores them."""
    from suzak.data.miniwob import miniwob_rows

    items = []
    for row in miniwob_rows(list(miniwob_tasks or ["click-button"]), episodes, start=data_seed, template=template):
        record = {"task": row["task"], "seed": row["seed"], "utterance": row["utterance"]}
        key = _item_key(len(items), f"{row['task']} {row['seed']} {row['utterance']}", [])
        items.append(EvalItem(len(items), key, record, row["prompt"], dict(record), (row["image"],),
                              columns=(("task", row["task"]), ("seed", row["seed"]))))  # fmt: skip
    return items


def _box_items(dataset, template: str, source: str | None) -> list[EvalItem]:
    answer_format = get_template(template).answer_format
    items = []
    for row in dataset:
        image = row["image"]
        image = image["path"] if isinstance(image, dict) else image  # a file (not decoded) or a PIL image
        record = {k: v for k, v in row.items() if k not in ("prompt", "image")}
        where = f"{source}:{row['line']}" if source and "line" in row else source
        key = _item_key(len(items), f"{row['problem']} {row['solution']}", [image] if isinstance(image, str) else [])
        gold = box_gold(gold_boxes(row["solution"]) or [], answer_format)
        items.append(EvalItem(len(items), key, record, row["prompt"], gold, (image,), where))
    return items


_REC_RULES = {"vlm_r1": "vlm_r1_rec", "strict": "rec"}
_COUNT_RULES = {"r1v": "r1v_count", "strict": "count"}  # clevr_synthetic asks R1-V's question: R1-V's rule applies
TASKS: dict[str, Task] = {
    t.name: t
    for t in (
        Task("superclevr", _r1v_items, _COUNT_RULES, "r1v_eval", "r1v",
             "prompts/superclevr_test200_counting_problems.jsonl", 64, 256, "SuperCLEVR counting, 200 questions (R1-V)"),
        Task("geoqa", _r1v_items, {"r1v": "r1v_math", "strict": "math"}, "r1v_geoqa", "r1v",
             "prompts/geoqa_test_prompts.jsonl", 50, 1024, "GeoQA test, 754 questions (R1-V)"),
        Task("gsm8k", _gsm8k_items, {"strict": "gsm8k"}, "gsm8k", "gsm8k", None, 16, 512,
             "GSM8K test, 1319 questions (text)"),
        Task("clevr_synthetic", _clevr_items, _COUNT_RULES, "r1v", "r1v", None, 32, 256,
             "held-out procedural CLEVR counting scenes"),
        Task("moving_ball", _moving_ball_items, {"strict": "word"}, "plain", "plain", None, 32, 8,
             "held-out procedural video: which way does the ball move? (left or right)"),
        Task("jsonl", _jsonl_items, {}, DEFAULT_TEMPLATE, DEFAULT_TEMPLATE, None, 16, 256,
             "your own JSONL of image or video questions (training's format), scored by --reward"),
        Task("rec", _rec_items, _REC_RULES, "rec_r1", "rec_r1", None, 16, 256,
             "RefCOCO/+/g referring expressions (VLM-R1's files or the Hub layout): accuracy at IoU 0.5"),
        Task("grounding_shapes", _grounding_items, _REC_RULES, "rec", "rec", None, 32, 32,
             "held-out procedural grounding: the named shape's box"),
        Task("gui_click", _gui_click_items, {"strict": "click"}, "click", "click", None, 16, 32,
             "held-out procedural GUI screens: a click on the named button"),
        Task("miniwob", _miniwob_items, {"strict": "episode"}, "episode", "episode", None, 8, 512,
             "MiniWoB++ web tasks in Chromium (--tasks, --episodes): the episode's success, acted with tools"),
    )
}  # fmt: skip


def get_task(name: str) -> Task:
    try:
        return TASKS[name]
    except KeyError:
        raise SuzakError(f"unknown eval task {name!r}; known: {', '.join(TASKS)}") from None


def resolve_template(task: Task, name: str = "eval") -> str:
    """``eval`` (the task's R1-V eval prompt), ``train`` (the training prompt) or any ``suzak.scoring.prompts`` template."""
    template = {"eval": task.eval_template, "train": task.train_template}.get(name, name)
    try:
        get_template(template)
    except ValueError as error:
        raise SuzakError(f"--prompt_template: {error} (or eval, train)") from None
    return template


def load_items(task: Task, prompt_path: str | None = None, **options) -> list[EvalItem]:
    """The task's items; ``options`` go to its loader (``template``, ``image_root``, ``num_rows``, ``data_seed``)."""
    return task.loader(prompt_path or task.prompt_path, **options)


def score(scorer: str, output: str, gold, rule: str = "strict") -> tuple[Any, bool]:
    """``(extracted_answer, is_correct)`` for ``output``: ``scorer`` is a ``SCORERS`` key, or a task name whose
    ``rule`` (``strict`` or ``r1v``) is used."""
    if scorer in TASKS:
        return TASKS[scorer].scorer(rule).fn(output, gold)
    return SCORERS[scorer].fn(output, gold)


def score_rules(task: Task, output: str, gold) -> dict[str, tuple[Any, bool]]:
    """``{rule: (extracted_answer, is_correct)}`` under every rule of ``task``.

    >>> score_rules(TASKS["superclevr"], "<answer>2</answer> no, <answer>3</answer>", 3)
    {'r1v': (2, False), 'strict': (3, True)}
    """
    return {rule: task.scorer(rule).fn(output, gold) for rule in task.rules}
