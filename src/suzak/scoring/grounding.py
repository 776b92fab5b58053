"""Grounding rewards: boxes and clicks in the model's own frame (:class:`suzak.media.boxes.BoxFrame`): one box's IoU
(``iou``, ``rec_accuracy``, V-Triune's ``dynamic_iou``), several boxes' F1 and COCO mAP, the box answer's format, a
GUI click on its target."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from suzak import SuzakError
from suzak.media.boxes import BOX_FRAME_COLUMN, BoxFrame, box_iou, coco_map, match_f1
from suzak.scoring.formats import is_think_format
from suzak.scoring.marks import _checks_kwargs, _correct_at, _golds, _heldout_as, _is_number, _reads_gold
from suzak.scoring.parsing import (
    box_parser,
    completion_text,
    extract_tag,
    gold_boxes,
    is_box_answer,
    point_parser,
)


def _box_frames(box_frame: list | None, count: int, name: str) -> list[BoxFrame]:
    """Each completion's :class:`suzak.media.boxes.BoxFrame`, from the column VLMGRPOTrainer adds to a row with one image."""
    if box_frame is None or len(box_frame) != count or any(f is None for f in box_frame):
        raise ValueError(f"{name} reads each row's box frame (the {BOX_FRAME_COLUMN!r} column suzak's trainer and "
                         "evaluation add to a row with one image: the model family and the size it sees); it has "
                         "none here: train with suzak.training.trainer.VLMGRPOTrainer, one image a row")  # fmt: skip
    return [f if isinstance(f, BoxFrame) else BoxFrame.from_dict(f) for f in box_frame]


def _predicted_boxes(name: str, completions: list, frames: list[BoxFrame], answer_format: str,
                     log_metric: Callable | None) -> list[list | None]:  # fmt: skip
    """Each completion's boxes in its model's frame; None for a completion without a box, and a box outside its frame
    or degenerate (x2 <= x1) as None within the list. Both are counted (``<name>/unparsed_frac``,
    ``<name>/invalid_frac``), never raised."""
    parse = box_parser(answer_format)
    found, unparsed, invalid, total = [], 0, 0, 0
    for completion, frame in zip(completions, frames, strict=True):
        boxes = parse(completion_text(completion))
        if not boxes:
            unparsed += 1
            found.append(None)
            continue
        total += len(boxes)
        valid = [box if frame.in_frame(box) else None for box in boxes]
        invalid += sum(box is None for box in valid)
        found.append(valid)
    if log_metric is not None:
        log_metric(f"{name}/unparsed_frac", unparsed / max(len(completions), 1))
        log_metric(f"{name}/invalid_frac", invalid / max(total, 1))
    return found


def _first_box_ious(name: str, completions: list, solution: list, box_frame: list | None, answer_format: str,
                    log_metric: Callable | None) -> list[float]:  # fmt: skip
    frames = _box_frames(box_frame, len(completions), name)
    golds = _golds(solution, gold_boxes, name)
    predicted = _predicted_boxes(name, completions, frames, answer_format, log_metric)
    return [0.0 if not boxes or boxes[0] is None else box_iou(boxes[0], frame.to_model(gold[0]))
            for boxes, gold, frame in zip(predicted, golds, frames, strict=True)]  # fmt: skip


# R1-V's and VLM-R1's referring-expression accuracy: a box is right at IoU >= 0.5 (VLM-R1's own script: > 0.5, kept
# by suzak eval's vlm_r1 rule); rec_accuracy's default threshold and the held-out eval's for iou and dynamic_iou
REC_IOU = 0.5


@_correct_at(REC_IOU)
@_reads_gold(gold_boxes)
def iou(completions: list, solution: list, box_frame: list | None = None, answer_format: str = "box",
        log_metric: Callable | None = None, **kwargs) -> list[float | None]:  # fmt: skip
    """The IoU of the first box of the completion with the first gold box, both in the model's frame (the row's
    :class:`suzak.media.boxes.BoxFrame`; the gold box rounded to the frame's integers as the model would write it, so the
    best answer scores 1.0; per-axis scaling leaves IoU as in original pixels): continuous, 0.0..1.0. No box, a box
    outside the frame or a degenerate one: 0.0, counted in ``iou/unparsed_frac`` / ``iou/invalid_frac``.

    ``answer_format``: ``box`` (a box anywhere in the completion) or ``think_answer`` (in the last ``<answer>`` tag).
    The held-out eval counts an answer correct at :data:`REC_IOU` (0.5), as :func:`rec_accuracy` and ``suzak eval``
    do, and logs the mean IoU beside that accuracy.

    >>> frame = {"family": "qwen3_vl", "width": 200, "height": 100, "resized_width": 192, "resized_height": 96}
    >>> iou(['{"bbox_2d": [0, 0, 500, 1000]}', "[250, 0, 750, 1000]", "no box"], ["[0, 0, 100, 100]"] * 3, [frame] * 3)
    [1.0, 0.3333333333333333, 0.0]
    """
    return _first_box_ious("iou", completions, solution, box_frame, answer_format, log_metric)


@_reads_gold(gold_boxes)
def rec_accuracy(completions: list, solution: list, box_frame: list | None = None, answer_format: str = "box",
                 log_metric: Callable | None = None, threshold: float = REC_IOU, **kwargs) -> list[float | None]:  # fmt: skip
    """1.0 when the first box's IoU with the gold box is at least ``threshold`` (:data:`REC_IOU`, 0.5: R1-V's and
    VLM-R1's referring-expression accuracy; ``reward_kwargs: {rec_accuracy: {threshold: 0.75}}`` for a stricter one),
    else 0.0; boxes read as :func:`iou` reads them.

    A box covering two of four equal cells has IoU exactly 0.5 with either: where the gold boxes are cells, 0.5 pays
    that hedge half the time, more than a guess of one cell (the self-test's grid uses 0.75).

    >>> frame = {"family": "qwen2_5_vl", "width": 200, "height": 100, "resized_width": 196, "resized_height": 98}
    >>> rec_accuracy(["[0, 0, 98, 98]", "[0, 0, 196, 98]", "[0, 0, 300, 98]"], ["[0, 0, 100, 100]"] * 3, [frame] * 3)
    [1.0, 1.0, 0.0]
    >>> rec_accuracy(["[0, 0, 98, 98]", "[0, 0, 196, 98]"], ["[0, 0, 100, 100]"] * 2, [frame] * 2, threshold=0.75)
    [1.0, 0.0]
    """
    if not 0 < threshold <= 1:
        raise ValueError(f"rec_accuracy threshold must be in (0, 1], got {threshold}")
    ious = _first_box_ious("rec_accuracy", completions, solution, box_frame, answer_format, log_metric)
    return [float(value >= threshold) for value in ious]


# V-Triune's dynamic IoU (Ma et al., "One RL to See Them All", MiniMax 2025, arXiv:2505.18129; its code,
# MiniMax-AI/One-RL-to-See-Them-All reward_server/verify.py: step / total_steps <= 0.1 -> 0.85, <= 0.25 -> 0.95, else
# 0.99): [fraction of max_steps up to which it holds, IoU threshold]
V_TRIUNE_SCHEDULE = ((0.1, 0.85), (0.25, 0.95), (1.0, 0.99))


def _iou_schedule(schedule: Any) -> list[tuple[float, float]]:
    """``schedule`` as (fraction, threshold) pairs, or ``SuzakError`` in one line: fractions rising to 1.0, thresholds in
    (0, 1] that never fall."""
    rows = list(schedule) if isinstance(schedule, list | tuple) else []
    pairs = [tuple(p) for p in rows if isinstance(p, list | tuple) and len(p) == 2 and all(map(_is_number, p))]
    good = bool(pairs) and len(pairs) == len(rows) and pairs[-1][0] == 1.0 and all(0 < t <= 1 for _, t in pairs)
    if not good or not all(0 < f1 < f2 and t1 <= t2 for (f1, t1), (f2, t2) in itertools.pairwise(pairs)):
        raise SuzakError(f"reward 'dynamic_iou': schedule must be [[fraction of max_steps, IoU threshold], ...] with "
                         f"fractions rising to 1.0 and thresholds in (0, 1] that never fall, e.g. "
                         f"{[list(p) for p in V_TRIUNE_SCHEDULE]}; got {schedule!r:.120}")  # fmt: skip
    return [(float(f), float(t)) for f, t in pairs]


def _scheduled_threshold(schedule: list[tuple[float, float]], trainer_state: Any) -> float:
    """The threshold at ``trainer_state``'s progress (global_step / max_steps); the last one outside training."""
    max_steps = getattr(trainer_state, "max_steps", 0) or 0
    if max_steps <= 0:
        return schedule[-1][1]
    progress = trainer_state.global_step / max_steps
    return next((threshold for fraction, threshold in schedule if progress <= fraction), schedule[-1][1])


def _check_schedule(kwargs: dict) -> None:
    if "schedule" in kwargs:
        _iou_schedule(kwargs["schedule"])


@_heldout_as(iou)  # its threshold moves with the step: held out, the plain IoU, correct at REC_IOU
@_checks_kwargs(_check_schedule)  # a named function: a bound reward carries it, and TRL's async worker pickles those
@_reads_gold(gold_boxes)
def dynamic_iou(completions: list, solution: list, box_frame: list | None = None, answer_format: str = "box",
                schedule: Any = V_TRIUNE_SCHEDULE, trainer_state: Any = None, log_metric: Callable | None = None,
                **kwargs) -> list[float | None]:  # fmt: skip
    """V-Triune's dynamic IoU reward: 1.0 when the first box's IoU with the gold box (read as :func:`iou` reads it)
    reaches a threshold that rises with training, else 0.0. Loose early (a reward the policy can reach), strict late
    (no credit for a sloppy box): V-Triune's answer to the ambiguity of a low threshold and the sparsity of a high one.

    ``schedule``: ``[[fraction of max_steps, threshold], ...]``, each threshold holding up to its fraction of training
    (progress = TRL's ``trainer_state.global_step / max_steps``), V-Triune's by default: 0.85 for the first 10 % of the
    steps, 0.95 to 25 %, 0.99 after (``reward_kwargs: {dynamic_iou: {schedule: [[0.1, 0.85], [0.25, 0.95], [1.0,
    0.99]]}}``; checked when the recipe is read). Outside training (no ``trainer_state``: the pre-flight) the last,
    strictest threshold applies. The threshold in use is logged (``dynamic_iou/threshold``). The held-out eval, in
    training and ``suzak heldout`` alike, scores its rows by :func:`iou` instead
    (:func:`suzak.scoring.rewards.heldout_scorer`): a moving threshold would move the held-out accuracy at 10 % and
    25 % of the run for no reason of the model's.
    V-Triune scores its detection rows with it through a matching of several boxes; here it is the one-box
    :func:`rec_accuracy` with the moving threshold.

    >>> from types import SimpleNamespace
    >>> frame = {"family": "qwen3_vl", "width": 100, "height": 100, "resized_width": 96, "resized_height": 96}
    >>> box = ["[0, 0, 900, 1000]"]  # IoU 0.9 with the gold box
    >>> [dynamic_iou(box, ["[0, 0, 100, 100]"], [frame], trainer_state=SimpleNamespace(global_step=step, max_steps=100))
    ...  for step in (0, 10, 11, 100)], dynamic_iou(box, ["[0, 0, 100, 100]"], [frame])
    ([[1.0], [1.0], [0.0], [0.0]], [0.0])
    """
    threshold = _scheduled_threshold(_iou_schedule(schedule), trainer_state)
    if log_metric is not None:
        log_metric("dynamic_iou/threshold", threshold)
    ious = _first_box_ious("dynamic_iou", completions, solution, box_frame, answer_format, log_metric)
    return [float(value >= threshold) for value in ious]


def box_format(completions: list, box_frame: list | None = None, answer_format: str = "box",
               **kwargs) -> list[float | None]:  # fmt: skip
    """1.0 when the answer is a box answer and nothing else (:func:`suzak.scoring.parsing.is_box_answer`: JSON ``bbox_2d``
    objects, plain lists or Qwen2-VL's box tokens; with ``think_answer``, R1-V's think/answer format with that in the
    last ``<answer>`` tag) and every box in it is a box of the row's frame (inside it, x1 < x2, y1 < y2), else 0.0.

    >>> frame = {"family": "qwen2_vl", "width": 64, "height": 64, "resized_width": 56, "resized_height": 56}
    >>> box_format(["<|box_start|>(0,0),(999,999)<|box_end|>", "[0, 0, 1000, 5]", "[9, 0, 1, 5]", "[1, 1, 5, 5] ok"],
    ...            [frame] * 4)
    [1.0, 0.0, 0.0, 0.0]
    """
    frames = _box_frames(box_frame, len(completions), "box_format")
    parse = box_parser(answer_format)
    scores = []
    for completion, frame in zip(completions, frames, strict=True):
        text = completion_text(completion)
        answer = extract_tag(text) if answer_format == "think_answer" and is_think_format(text) else text
        boxes = parse(text)
        good = answer is not None and is_box_answer(answer) and bool(boxes)
        scores.append(float(good and all(frame.in_frame(box) for box in boxes)))
    return scores


@_correct_at(0.5)  # half F1: 2 * matched >= missed + extra boxes; one object: found at IoU >= 0.5, at most 2 extras
@_reads_gold(gold_boxes)
def box_f1(completions: list, solution: list, box_frame: list | None = None, answer_format: str = "box",
           threshold: float = 0.5, log_metric: Callable | None = None, **kwargs) -> list[float | None]:  # fmt: skip
    """F1 of every predicted box against every gold box, a prediction matching one gold box at IoU >= ``threshold``
    (:func:`suzak.media.boxes.match_f1`): the reward for several objects (detection). A box outside the frame counts as a
    wrong prediction.

    >>> frame = {"family": "qwen3_vl", "width": 100, "height": 100, "resized_width": 96, "resized_height": 96}
    >>> box_f1(['[{"bbox_2d": [0, 0, 100, 100]}, {"bbox_2d": [500, 500, 600, 600]}]'], ["[[0, 0, 10, 10], [50, 50, 60, 60]]"], [frame])
    [1.0]
    """
    frames = _box_frames(box_frame, len(completions), "box_f1")
    golds = _golds(solution, gold_boxes, "box_f1")
    predicted = _predicted_boxes("box_f1", completions, frames, answer_format, log_metric)
    return [match_f1([] if boxes is None else [b if b is not None else (0, 0, 0, 0) for b in boxes],
                     [frame.to_model(box) for box in gold], threshold)
            for boxes, gold, frame in zip(predicted, golds, frames, strict=True)]  # fmt: skip


@_correct_at(0.5)  # half of COCO's mAP@[.5:.95]; one object, one box: IoU >= 0.7 (5 of COCO's 10 thresholds)
@_reads_gold(gold_boxes)
def box_map(completions: list, solution: list, box_frame: list | None = None, answer_format: str = "box",
            log_metric: Callable | None = None, **kwargs) -> list[float | None]:  # fmt: skip
    """COCO mAP@[.5:.95] of every predicted box against every gold box of the row, in the model's frame, computed by
    pycocotools (:func:`suzak.media.boxes.coco_map`; V-Triune weighs the same figure into its detection reward, with
    labels as categories and a penalty on the box count; here labels are ignored, one category). A completion has no
    confidences, so its boxes rank in the order written; a box outside the frame is a wrong prediction at its rank
    (``box_map/invalid_frac``); no box: 0.0 (``box_map/unparsed_frac``).

    AP does not charge for wrong boxes written after all the right ones (they rank below every hit): pair it with
    :func:`box_f1`, which does, or the policy may learn to add guesses at the end.

    >>> frame = {"family": "qwen3_vl", "width": 100, "height": 100, "resized_width": 96, "resized_height": 96}
    >>> scores = box_map(['[{"bbox_2d": [0, 0, 100, 100]}, {"bbox_2d": [500, 500, 600, 600]}]', "[500, 500, 600, 600]",
    ...                   "none"], ["[[0, 0, 10, 10], [50, 50, 60, 60]]"] * 3, [frame] * 3)
    >>> [round(score, 3) for score in scores]  # half the gold found: 51 of COCO's 101 recall points
    [1.0, 0.505, 0.0]
    """
    frames = _box_frames(box_frame, len(completions), "box_map")
    golds = _golds(solution, gold_boxes, "box_map")
    predicted = _predicted_boxes("box_map", completions, frames, answer_format, log_metric)
    return [0.0 if boxes is None else coco_map(boxes, [frame.to_model(box) for box in gold])
            for boxes, gold, frame in zip(predicted, golds, frames, strict=True)]  # fmt: skip


# --- GUI grounding: a click in the model's own frame ---------------------------------------------------------------


@_reads_gold(gold_boxes)
def click_accuracy(completions: list, solution: list, box_frame: list | None = None, answer_format: str = "box",
                   log_metric: Callable | None = None, **kwargs) -> list[float | None]:  # fmt: skip
    """1.0 when the completion's point (a GUI click: ``{"point_2d": [x, y]}``, ``(x, y)`` or ``[x, y]``, the first one:
    :func:`suzak.scoring.parsing.parse_point`) lies on the gold box (the first; original pixels), both in the model's
    frame (:meth:`suzak.media.boxes.BoxFrame.point_in_box`: the box as the frame rounds it, edges included), else 0.0.
    No point: 0.0, counted in ``click_accuracy/unparsed_frac``; a point outside the frame: 0.0, counted in
    ``click_accuracy/invalid_frac``. ``answer_format``: ``box`` (a point anywhere in the completion) or
    ``think_answer`` (in the last ``<answer>`` tag).

    A click row carries ``answer_kind: point`` (:data:`suzak.media.boxes.ANSWER_KIND_COLUMN`): its ideal answer, for the
    pre-flight and SFT, is then the box's centre in the frame as ``{"point_2d": [x, y]}`` rather than the box.

    >>> frame = {"family": "qwen2_5_vl", "width": 200, "height": 100, "resized_width": 196, "resized_height": 98}
    >>> click_accuracy(['{"point_2d": [49, 49]}', "(150, 20)", "[300, 20]", "no click"], ["[0, 0, 100, 100]"] * 4,
    ...                [frame] * 4)
    [1.0, 0.0, 0.0, 0.0]
    """
    frames = _box_frames(box_frame, len(completions), "click_accuracy")
    golds = _golds(solution, gold_boxes, "click_accuracy")
    parse = point_parser(answer_format)
    points = [parse(completion_text(c)) for c in completions]
    clicks = [p if p is not None and frame.point_in_frame(p) else None for p, frame in zip(points, frames, strict=True)]
    if log_metric is not None:
        parsed = sum(p is not None for p in points)
        log_metric("click_accuracy/unparsed_frac", 1 - parsed / max(len(points), 1))
        log_metric("click_accuracy/invalid_frac", (parsed - sum(c is not None for c in clicks)) / max(parsed, 1))
    return [float(click is not None and frame.point_in_box(click, gold[0]))
            for click, gold, frame in zip(clicks, golds, frames, strict=True)]  # fmt: skip
