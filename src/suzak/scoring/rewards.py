"""Reward functions for GRPO, grouped by task, the ``REWARDS`` registry, and the reward pre-flight.

Every reward is a plain function with TRL's signature ``f(completions, solution, **kwargs) -> list[float | None]``
scoring 0.0..1.0; the answer parsing lives in :mod:`suzak.scoring.parsing`, shared with evaluation. A gold ``solution``
that cannot be parsed raises ``ValueError`` naming the batch row: bad data must never become a silent zero.

>>> completions = [[{"role": "assistant", "content": "<think> 3 cubes </think> <answer> 3 </answer>"}]]
>>> clevr_count(completions, solution=["<answer> 3 </answer>"]), think_format(completions)
([1.0], [1.0])
>>> [f.__name__ for f in resolve_rewards(["clevr_count", "gsm8k_format"], {"gsm8k_format": {"style": "think"}})]
['clevr_count', 'gsm8k_format']
"""

from __future__ import annotations

import functools
import importlib
import inspect
import itertools
import logging
from collections.abc import Callable
from typing import Any

from suzak import SuzakError
from suzak.media.boxes import BOX_FRAME_COLUMN, BoxFrame, box_iou, coco_map, match_f1
from suzak.scoring.judge import judge
from suzak.scoring.parsing import (
    anls_score,
    box_parser,
    completion_text,
    count_parser,
    extract_tag,
    gold_answer,
    gold_boxes,
    gold_texts,
    has_gsm8k_hash_line,
    is_box_answer,
    is_think_format,
    math_equal,
    ocr_equal,
    parse_gsm8k_answer,
    parse_int_answer,
    parse_number,
    parse_word,
    point_parser,
    text_parser,
    with_opening,
    word_parser,
)
from suzak.scoring.parsing import r1v_accuracy as _r1v_accuracy

__all__ = [
    "REWARDS",
    "anls",
    "box_f1",
    "box_format",
    "box_map",
    "click_accuracy",
    "iou",
    "rec_accuracy",
    "read_after_opening",
    "REC_IOU",
    "word_match",
    "clevr_count",
    "dynamic_iou",
    "gsm8k_accuracy",
    "gsm8k_format",
    "gold_parser",
    "base_reward",
    "bound_kwargs",
    "check_correct_at",
    "correct_at",
    "counts_correct",
    "heldout_scorer",
    "is_async",
    "is_judge",
    "judge",
    "math_accuracy",
    "ocr_exact",
    "r1v_accuracy",
    "resolve_reward",
    "resolve_rewards",
    "reads_rollout",
    "routed",
    "SOURCE_COLUMN",
    "think_format",
    "V_TRIUNE_SCHEDULE",
    "zoom_used",
]

logger = logging.getLogger(__name__)


def _reads_gold(parse: Callable[[str], Any]) -> Callable[[Callable], Callable]:
    """Mark a reward with the parser it reads gold answers with: ``parse(gold_answer(solution))``, None when the gold
    does not parse. The dataset validation checks every row's gold with it before step 1 (:func:`gold_parser`)."""

    def mark(func: Callable) -> Callable:
        func.gold_parser = parse
        return func

    return mark


def _reads_rollout(func: Callable) -> Callable:
    """Mark a reward that scores how a rollout went (its tool calls, read from TRL's ``environments``), not the
    answer: the reward pre-flight, which scores ideal answers, skips it (:func:`reads_rollout`)."""
    func.reads_rollout = True
    return func


def _checks_kwargs(check: Callable[[dict], None]) -> Callable[[Callable], Callable]:
    """Mark a reward with a check of the values a recipe binds to it (``check(kwargs)`` raises ``SuzakError``), which
    :func:`resolve_reward` runs: a bad value is one line before step 1, not an error at the first batch."""

    def mark(func: Callable) -> Callable:
        func.check_kwargs = check
        return func

    return mark


def _correct_at(threshold: float) -> Callable[[Callable], Callable]:
    """Mark a reward whose score is continuous with the score at which the held-out eval counts an answer correct
    (:func:`correct_at`); an unmarked reward's answer is correct at full marks, 1.0."""

    def mark(func: Callable) -> Callable:
        func.correct_at = threshold
        return func

    return mark


def _heldout_as(stand_in: Callable) -> Callable[[Callable], Callable]:
    """Mark a reward whose score moves with the training step with the reward the held-out eval scores it by instead
    (:func:`heldout_scorer`), so that training's eval at any step and ``suzak heldout`` give the same figures."""

    def mark(func: Callable) -> Callable:
        func.heldout_as = stand_in
        return func

    return mark


def _layers(reward: Callable):
    """``reward``, then each wrapper's inner reward down to the registry's function: recipe kwargs
    (``functools.partial``), a mixture's :func:`routed`, :func:`read_after_opening` (both keep it as ``__wrapped__``),
    in any order and depth."""
    while reward is not None:
        yield reward
        inner = getattr(reward, "__wrapped__", None)
        reward = inner or (reward.func if isinstance(reward, functools.partial) else None)


def base_reward(reward: Callable) -> Callable:
    """The registry's function under a reward's wrappers (:func:`_layers`).

    >>> counted = resolve_reward("clevr_count", {"answer_format": "plain"})
    >>> base_reward(read_after_opening(routed(counted, "a"), "<t>")) is clevr_count
    True
    """
    *_, base = _layers(reward)
    return base


def bound_kwargs(reward: Callable) -> dict:
    """The settings a recipe bound to a reward (its ``functools.partial``'s keywords, an outer one's over an inner
    one's), under its wrappers (:func:`_layers`): a judge read after the template's opening is asked with its own.

    >>> judged = read_after_opening(routed(resolve_reward("judge", {"model": "j"}), "a"), "<t>")
    >>> bound_kwargs(judged), bound_kwargs(word_match)
    ({'model': 'j'}, {})
    """
    bound: dict = {}
    for layer in reversed(list(_layers(reward))):
        bound |= layer.keywords if isinstance(layer, functools.partial) else {}
    return bound


def is_async(reward: Callable) -> bool:
    """True when ``reward`` is awaited (``judge``): TRL runs such rewards in its event loop, so every wrapper of one
    must be a coroutine function too."""
    return inspect.iscoroutinefunction(reward.func if isinstance(reward, functools.partial) else reward)


def reads_rollout(reward: Callable) -> bool:
    """True for a reward marked by ``_reads_rollout`` (also through recipe kwargs and wrappers).

    >>> reads_rollout(zoom_used), reads_rollout(routed(zoom_used, "a")), reads_rollout(word_match)
    (True, True, False)
    """
    return bool(getattr(base_reward(reward), "reads_rollout", False))


def is_judge(reward: Callable) -> bool:
    """True for a reward a model scores (``judge``, also through recipe kwargs and wrappers): its score of an ideal
    answer is a probability, not 1.0, so the pre-flight asks it to prefer the right answer over a wrong one instead,
    and the held-out eval counts it correct above one half.

    >>> judged = resolve_reward("judge", {"model": "judge"})
    >>> is_judge(judged), is_judge(read_after_opening(routed(judged, "a"), "<think>\\n")), is_judge(word_match)
    (True, True, False)
    """
    return base_reward(reward) is judge


def correct_at(reward: Callable) -> float:
    """The score at which the held-out eval counts an answer correct (:func:`counts_correct`): a recipe's
    ``eval_correct_at`` (:func:`heldout_scorer`), else what the reward declares (``_correct_at``: IoU and ANLS 0.5),
    else full marks, 1.0 (a 0/1 reward), or one half for a judge's P(yes). Seen through wrappers as
    :func:`base_reward` sees, the outermost declaration first.

    >>> correct_at(iou), correct_at(routed(resolve_reward("anls", {"threshold": 0.4}), "docs")), correct_at(word_match)
    (0.5, 0.5, 1.0)
    """
    for layer in _layers(reward):
        if (threshold := getattr(layer, "correct_at", None)) is not None:
            return threshold
    return 0.5 if is_judge(reward) else 1.0


def counts_correct(reward: Callable, score: float | None) -> bool:
    """Whether the held-out eval counts ``reward``'s ``score`` of an answer correct: at least :func:`correct_at`
    (a judge's P(yes): above it, as it leans to yes); no score (None) is wrong.

    >>> [counts_correct(iou, score) for score in (0.998, 0.5, 0.49, None)], counts_correct(word_match, 0.998)
    ([True, True, False, False], False)
    """
    value, threshold = float(score or 0.0), correct_at(reward)
    return value > threshold if is_judge(reward) else value >= threshold


def heldout_scorer(reward: Callable, threshold: float | None = None) -> Callable:
    """``reward`` as the held-out eval scores it. A reward whose score moves with the training step gives way to the
    reward it declares (``_heldout_as``; ``dynamic_iou``: :func:`iou`, bound to the recipe's kwargs ``iou`` takes, not
    routed: the eval hands a source's scorer its own rows alone), so that training's eval at any step and ``suzak
    heldout`` agree; ``threshold`` (a recipe's ``eval_correct_at``) replaces the one :func:`correct_at` reads.

    >>> scorer = heldout_scorer(routed(resolve_reward("dynamic_iou", {"answer_format": "think_answer"}), "boxes"))
    >>> base_reward(scorer) is iou, scorer.keywords, correct_at(scorer), correct_at(heldout_scorer(scorer, 0.75))
    (True, {'answer_format': 'think_answer'}, 0.5, 0.75)
    """
    stand_in = getattr(base_reward(reward), "heldout_as", None)
    if stand_in is not None:
        taken = inspect.signature(stand_in).parameters
        kwargs = {key: value for key, value in bound_kwargs(reward).items() if key in taken}
        reward = resolve_reward(stand_in.__name__, kwargs)
    if threshold is None:
        return reward
    scorer = functools.update_wrapper(functools.partial(reward), reward)
    scorer.correct_at = threshold
    return scorer


def check_correct_at(value: Any, where: str) -> float | None:
    """``value`` as a held-out threshold (None: the reward's own, :func:`correct_at`), or ``SuzakError`` in one line
    naming ``where`` (a flag, a mixture's source): a number in (0, 1].

    >>> check_correct_at(0.5, "--eval_correct_at"), check_correct_at(None, "--eval_correct_at")
    (0.5, None)
    >>> check_correct_at(50, "--eval_correct_at")
    Traceback (most recent call last):
    ...
    suzak.SuzakError: --eval_correct_at 50 must be a number in (0, 1]: the score at which the held-out eval counts an answer correct
    """
    if value is None:
        return None
    if not _is_number(value) or not 0 < value <= 1:
        raise SuzakError(f"{where} {value!r} must be a number in (0, 1]: the score at which the held-out eval counts "
                         "an answer correct")  # fmt: skip
    return float(value)


def gold_parser(reward: Callable) -> Callable[[str], Any] | None:
    """The parser a reward reads gold answers with (also through recipe kwargs), or None when it declares none.

    >>> gold_parser(clevr_count)("3"), gold_parser(resolve_reward("clevr_count", {"answer_format": "plain"}))("3")
    (3, 3)
    >>> gold_parser(think_format) is None
    True
    """
    return getattr(base_reward(reward), "gold_parser", None)


def _golds(solution: list, parse: Callable, reward: str) -> list:
    """``parse(gold_answer(s))`` for each gold; a gold that fails raises ``ValueError`` naming its batch row."""
    parsed = []
    for row, value in enumerate(solution):
        try:
            gold = parse(gold_answer(value))
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{reward}: bad gold solution in batch row {row}: {value!r:.200} ({exc})") from exc
        if gold is None:
            raise ValueError(f"{reward}: cannot parse the gold solution in batch row {row}: {value!r:.200}")
        parsed.append(gold)
    return parsed


def _answer_match(
    name: str,
    completions: list,
    solution: list,
    parse_gold: Callable,
    parse_answer: Callable,
    log_metric: Callable | None,
    log_extra: Callable | None,
) -> list[float]:
    """1.0 where ``parse_answer(completion)`` equals ``parse_gold(gold)``; an unparseable answer scores 0.0."""
    golds = _golds(solution, parse_gold, name)
    answers = [parse_answer(completion_text(c)) for c in completions]
    _log_unparsed(answers, name, log_metric, log_extra)
    return [float(a is not None and a == g) for a, g in zip(answers, golds, strict=True)]


def _log_unparsed(answers: list, name: str, log_metric: Callable | None, log_extra: Callable | None) -> None:
    """Report the parsed answers to TRL's completions table and the fraction that had none."""
    if log_metric is not None:
        log_metric(f"{name}/unparsed_frac", sum(a is None for a in answers) / max(len(answers), 1))
    if log_extra is not None:
        log_extra(f"{name}/answer", [None if a is None else str(a) for a in answers])


# --- CLEVR counting (R1-V) ---------------------------------------------------------------------------------------


@_reads_gold(parse_int_answer)
def clevr_count(
    completions: list,
    solution: list,
    answer_format: str = "think_answer",
    log_metric: Callable | None = None,
    log_extra: Callable | None = None,
    **kwargs,
) -> list[float | None]:
    """1.0 when the count in the last ``<answer>`` tag equals the gold count, else 0.0 (no tag: 0.0).

    suzak's strict counting reward, not R1-V's: R1-V trained with ``r1v_accuracy`` (math-verify of the whole
    completion, so a number in ``<think>`` can score) and evaluated the first ``<answer>`` tag.

    ``answer_format="plain"`` (for the ``plain`` template; a recipe sets it with
    ``reward_kwargs: {clevr_count: {answer_format: plain}}``) reads the whole completion as the count instead.

    >>> clevr_count(["<answer>3</answer>", "<answer>4</answer>", "3"], solution=[3, "3", "<answer> 3 </answer>"])
    [1.0, 0.0, 0.0]
    >>> clevr_count(["3", "three", "<answer>3</answer>"], solution=[3, 3, 3], answer_format="plain")
    [1.0, 1.0, 0.0]
    """
    parse_answer = count_parser(answer_format)  # an unknown format raises here, even for an empty batch
    golds = clevr_count.gold_parser
    return _answer_match("clevr_count", completions, solution, golds, parse_answer, log_metric, log_extra)


def think_format(completions: list, **kwargs) -> list[float | None]:
    """1.0 for R1-V's ``<think>…</think> <answer>…</answer>`` format and nothing else, else 0.0.

    Same pattern as R1-V's format reward, except that outer whitespace is stripped first (R1-V gives 0.0 to a
    completion with a leading space or a trailing newline).

    >>> think_format(["<think>\\n3 cubes\\n</think>\\n<answer>3</answer>", "<answer>3</answer>"])
    [1.0, 0.0]
    """
    return [float(is_think_format(completion_text(c))) for c in completions]


# --- GSM8K -------------------------------------------------------------------------------------------------------


@_reads_gold(parse_number)
def gsm8k_accuracy(
    completions: list,
    solution: list,
    log_metric: Callable | None = None,
    log_extra: Callable | None = None,
    **kwargs,
) -> list[float | None]:
    """1.0 when the completion's final number (after ``####``, else in ``<answer>``) equals the gold numerically.

    >>> gsm8k_accuracy(["#### 18", "#### $18.00", "#### 17", "18"], solution=["Janet ...\\n#### 18"] * 4)
    [1.0, 1.0, 0.0, 0.0]
    """
    golds = gsm8k_accuracy.gold_parser
    return _answer_match("gsm8k_accuracy", completions, solution, golds, parse_gsm8k_answer, log_metric, log_extra)


_GSM8K_FORMATS = {"hash": has_gsm8k_hash_line, "think": is_think_format}


def gsm8k_format(completions: list, style: str = "hash", **kwargs) -> list[float | None]:
    """1.0 when the completion is in the answer format: ``style="hash"`` ends in ``#### N``, ``"think"`` is R1-V's.

    >>> gsm8k_format(["2 + 16 = 18\\n#### 18", "The answer is 18."]), gsm8k_format(["#### 18"], style="think")
    ([1.0, 0.0], [0.0])
    """
    if style not in _GSM8K_FORMATS:
        raise ValueError(f"gsm8k_format: unknown style {style!r}; known: {', '.join(_GSM8K_FORMATS)}")
    is_format = _GSM8K_FORMATS[style]
    return [float(is_format(completion_text(c))) for c in completions]


# --- math (GeoQA and other free-form answers) --------------------------------------------------------------------


@_reads_gold(str)
def math_accuracy(completions: list, solution: list, **kwargs) -> list[float | None]:
    """suzak's strict math reward: math-verify equivalence, or an exact string match, of the last ``<answer>``
    contents (``math_equal``). R1-V's reward runs the same two tests on the whole completion (``r1v_accuracy``).

    >>> math_accuracy(["<answer>140°</answer>", "<answer>40°</answer>"], solution=["<answer> 140° </answer>"] * 2)
    [1.0, 0.0]
    """
    golds = _golds(solution, math_accuracy.gold_parser, "math_accuracy")
    return [float(math_equal(completion_text(c), g)) for c, g in zip(completions, golds, strict=True)]


# --- R1-V's training reward, exactly -----------------------------------------------------------------------------


@_reads_gold(str)
def r1v_accuracy(completions: list, solution: list, **kwargs) -> list[float | None]:
    """R1-V's training ``accuracy_reward``, exactly, for reproducing R1-V's run (counting and GeoQA alike).

    1.0 when math-verify, parsing the *whole* completion, verifies it against the parsed raw solution; else 1.0 when
    the stripped contents of the first one-line ``<answer>…</answer>`` are the same string on both sides (the whole
    stripped text on a side without the tag); else 0.0 (``suzak.scoring.parsing.r1v_accuracy``).

    Known hole, kept because it is R1-V's rule: math-verify reads the reasoning too, so a right number in ``<think>``
    can score while the ``<answer>`` tag holds something else, and the policy can learn that. suzak's recipes use the
    strict ``clevr_count`` / ``math_accuracy`` instead.

    >>> r1v_accuracy(["<think>3 cubes</think> <answer>3</answer>", "<think>I see 3 cubes</think> <answer>many</answer>"],
    ...              solution=["<answer> 3 </answer>"] * 2)
    [1.0, 1.0]
    """
    _golds(solution, r1v_accuracy.gold_parser, "r1v_accuracy")  # a missing or empty gold raises naming its row
    return [float(_r1v_accuracy(completion_text(c), str(s))) for c, s in zip(completions, solution, strict=True)]


# --- one-word answers --------------------------------------------------------------------------------------------


@_reads_gold(parse_word)
def word_match(
    completions: list,
    solution: list,
    answer_format: str = "plain",
    log_metric: Callable | None = None,
    log_extra: Callable | None = None,
    **kwargs,
) -> list[float | None]:
    """1.0 when the answer is the gold word (case and a trailing full stop ignored), else 0.0.

    For one-word answers (a colour, yes/no); the quickstart's demo recipe trains the colour questions of
    ``color_squares`` with it. ``answer_format``: ``plain`` (the whole completion is the answer, the default) or
    ``think_answer`` (the last ``<answer>`` tag).

    >>> word_match(["red", "Blue.", "red blue", "<answer>red</answer>"], solution=["red", "blue", "red", "red"])
    [1.0, 1.0, 0.0, 0.0]
    """
    parse_answer = word_parser(answer_format)
    return _answer_match("word_match", completions, solution, parse_word, parse_answer, log_metric, log_extra)


# --- OCR: DocVQA's answers (suzak.scoring.parsing.anls_score) ------------------------------------------------------


def _ocr_scores(name: str, completions: list, solution: list, answer_format: str, score: Callable[[str, list], float],
                log_metric: Callable | None, log_extra: Callable | None) -> list[float]:  # fmt: skip
    """``score(answer, accepted answers)`` for each completion's answer; no answer: 0.0, counted."""
    parse_answer = text_parser(answer_format)  # an unknown format raises here, even for an empty batch
    golds = _golds(solution, gold_texts, name)
    answers = [parse_answer(completion_text(c)) for c in completions]
    _log_unparsed(answers, name, log_metric, log_extra)
    return [0.0 if a is None else score(a, g) for a, g in zip(answers, golds, strict=True)]


@_correct_at(0.5)  # DocVQA's: an answer within ANLS's tolerance (at tau 0.5 every score above 0 is at least 0.5)
@_reads_gold(gold_texts)
def anls(completions: list, solution: list, answer_format: str = "plain", threshold: float = 0.5,
         log_metric: Callable | None = None, log_extra: Callable | None = None, **kwargs) -> list[float | None]:  # fmt: skip
    """DocVQA's ANLS of the answer against the row's accepted answers (the gold: one string, or a JSON list of
    strings): the best normalised Levenshtein similarity after lower-casing and collapsing whitespace, 0.0 when the
    distance is past ``threshold`` (tau, 0.5), as DocVQA's evaluation script scores it
    (:func:`suzak.scoring.parsing.anls_score`). ``answer_format``: ``plain`` (the whole completion, the default) or
    ``think_answer`` (the last ``<answer>`` tag); no answer: 0.0, counted in ``anls/unparsed_frac``.

    >>> anls(["Total 42", "total  42 ", "Total 4", "Invoice", ""], solution=['["Total: 42", "total 42"]'] * 5)
    [1.0, 1.0, 0.875, 0.0, 0.0]
    """
    if not 0 < threshold <= 1:
        raise ValueError(f"anls threshold must be in (0, 1], got {threshold}")
    score = functools.partial(anls_score, threshold=threshold)
    return _ocr_scores("anls", completions, solution, answer_format, score, log_metric, log_extra)


def _exact(answer: str, golds: list[str]) -> float:
    return float(ocr_equal(answer, golds))


@_reads_gold(gold_texts)
def ocr_exact(completions: list, solution: list, answer_format: str = "plain", log_metric: Callable | None = None,
              log_extra: Callable | None = None, **kwargs) -> list[float | None]:  # fmt: skip
    """1.0 when the answer is one of the row's accepted answers after :func:`anls`'s normalisation (lower case,
    whitespace collapsed), else 0.0; answers read as :func:`anls` reads them.

    >>> ocr_exact(["TOTAL:  42", "Total 42", "<answer>total: 42</answer>"], solution=['["Total: 42"]'] * 3)
    [1.0, 0.0, 0.0]
    """
    return _ocr_scores("ocr_exact", completions, solution, answer_format, _exact, log_metric, log_extra)


# --- grounding: boxes in the model's own frame (suzak.media.boxes) ------------------------------------------------------


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


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


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
    training and ``suzak heldout`` alike, scores its rows by :func:`iou` instead (:func:`heldout_scorer`): a moving
    threshold would move the held-out accuracy at 10 % and 25 % of the run for no reason of the model's.
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


# --- tool use: an optional shaping reward ----------------------------------------------------------------------


@_reads_rollout
def zoom_used(completions: list, environments: list | None = None, **kwargs) -> list[float | None]:
    """1.0 for a rollout that got at least one crop back from the zoom (a call the zoom answered with an image),
    else 0.0: a tool-use shaping reward, off unless a recipe lists it (docs/tools.md). It pays the call whatever the
    answer, so weight it well below the accuracy reward (``reward_weights``); TRL hands it each rollout's
    environment (``environments``). A run without the zoom is stopped before step 1 (:func:`suzak.train`).

    >>> class Rollout:
    ...     def __init__(self, crops): self.crops = crops
    >>> zoom_used(["red", "red", "blue"], environments=[Rollout([[0, 0, 56, 56]]), Rollout([]), Rollout([])])
    [1.0, 0.0, 0.0]
    """
    if environments is None or len(environments) != len(completions):
        raise SuzakError("reward 'zoom_used' reads each rollout's zoom: it needs a run with tools: [zoom]")
    return [float(bool(getattr(env, "crops", None))) for env in environments]


# --- registry ----------------------------------------------------------------------------------------------------

REWARDS: dict[str, Callable] = {
    f.__name__: f
    for f in (clevr_count, think_format, gsm8k_accuracy, gsm8k_format, math_accuracy, r1v_accuracy, word_match,
              anls, ocr_exact, iou, rec_accuracy, dynamic_iou, box_format, box_f1, box_map, click_accuracy,
              zoom_used, judge)
}  # fmt: skip


def resolve_reward(name: str, kwargs: dict | None = None) -> Callable:
    """The reward named ``name`` (a ``REWARDS`` key or a dotted path ``pkg.module.func``), bound to ``kwargs``.

    With kwargs the result is a ``functools.partial`` that keeps the reward's ``__name__`` (TRL logs rewards under
    it); each kwarg must be a named parameter of the reward, so a typo fails here rather than being ignored, and a
    reward that checks its values (``_checks_kwargs``: ``dynamic_iou``'s schedule) checks them here too.

    >>> resolve_reward("suzak.scoring.rewards.think_format") is think_format
    True
    >>> resolve_reward("gsm8k_format", {"style": "think"}).__name__
    'gsm8k_format'
    >>> resolve_reward("gsm8k_format", {"styel": "think"})
    Traceback (most recent call last):
    ...
    suzak.SuzakError: reward 'gsm8k_format' has no parameter 'styel'; its parameters: style
    """
    func = REWARDS.get(name) or _import_reward(name)
    if not kwargs:
        return func
    _check_reward_kwargs(name, func, kwargs)
    bound = functools.update_wrapper(functools.partial(func, **kwargs), func)
    bound.__name__ = name if name in REWARDS else func.__name__
    return bound


def _import_reward(name: str) -> Callable:
    module_name, _, attr = name.rpartition(".")
    if not module_name:
        raise SuzakError(
            f"unknown reward {name!r}; known: {', '.join(REWARDS)} (or a dotted path such as 'my_pkg.rewards.my_reward')"
        )
    try:
        func = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise SuzakError(
            f"cannot import reward {name!r} ({exc}); known rewards: {', '.join(REWARDS)} (or a dotted path)"
        ) from exc
    if not callable(func):
        raise SuzakError(f"reward {name!r} is a {type(func).__name__}, not a function")
    return func


def _check_reward_kwargs(name: str, func: Callable, kwargs: dict) -> None:
    from suzak.trl_internals import REWARD_CALL_KWARGS  # GRPOTrainer passes these itself: a recipe must not set them

    params = inspect.signature(func).parameters
    settable = [
        p
        for p, spec in params.items()
        if spec.kind in (spec.POSITIONAL_OR_KEYWORD, spec.KEYWORD_ONLY) and p not in REWARD_CALL_KWARGS
    ]
    for key in kwargs:
        if key in REWARD_CALL_KWARGS:
            raise SuzakError(f"reward {name!r}: {key!r} is passed by the trainer and cannot be set in a recipe")
        if key not in settable:
            raise SuzakError(
                f"reward {name!r} has no parameter {key!r}; its parameters: {', '.join(settable) or '(none)'}"
            )
    if (check := getattr(func, "check_kwargs", None)) is not None:
        check(kwargs)


def read_after_opening(reward: Callable, opening: str) -> Callable:
    """``reward`` reading every completion with ``opening`` in front (:func:`suzak.scoring.parsing.with_opening`): the chat
    template's opening of the assistant turn (Qwen3.5's ``<think>\\n``), which the policy never generates itself.

    Keeps what TRL and suzak read off a reward: its ``__name__`` (metric names), its gold parser, async or not.

    >>> written = [" 3 cubes </think> <answer>3</answer>"]  # what the policy generated after "<think>\\n"
    >>> reward = read_after_opening(think_format, "<think>\\n")
    >>> reward.__name__, reward(written), think_format(written)
    ('think_format', [1.0], [0.0])
    """
    if not opening:
        return reward

    def opened(completions: list) -> list:
        return [with_opening(c, opening) for c in completions]

    if is_async(reward):

        async def wrapper(completions, *args, **kwargs):
            return await reward(*args, completions=opened(completions), **kwargs)
    else:

        def wrapper(completions, *args, **kwargs):
            return reward(*args, completions=opened(completions), **kwargs)

    functools.update_wrapper(wrapper, reward)
    wrapper.__name__ = getattr(reward, "__name__", type(reward).__name__)
    if (parse := gold_parser(reward)) is not None:
        wrapper.gold_parser = parse
    wrapper.opening = opening
    return wrapper


def resolve_rewards(names: list[str], reward_kwargs: dict[str, dict] | None = None) -> list[Callable]:
    """``resolve_reward`` for each name, with that name's kwargs from ``reward_kwargs`` (keys must be in ``names``).

    >>> [f.__name__ for f in resolve_rewards(["clevr_count", "think_format"])]
    ['clevr_count', 'think_format']
    """
    reward_kwargs = reward_kwargs or {}
    stray = sorted(set(reward_kwargs) - set(names))
    if stray:
        raise SuzakError(f"reward kwargs given for {', '.join(stray)}, which is not among the rewards {names}")
    return [resolve_reward(name, reward_kwargs.get(name)) for name in names]


SOURCE_COLUMN = "source"  # a mixture row's source name (suzak.data.mixture): which rewards score its completions
_SHARED_KWARGS = ("trainer_state", "log_metric")  # TRL's reward kwargs that are not one value per row


def routed(func: Callable, source: str) -> Callable:
    """``func`` scoring only the completions of ``source``'s rows (a mixture's, by :data:`SOURCE_COLUMN`) and None
    for every other row (TRL's "this reward does not score it": its weighted sum leaves the reward out there), so no
    reward ever sees another task's rows. Named ``<source>/<reward>``, TRL logs it as ``rewards/<source>/<reward>``.
    A column the reward logs with ``log_extra`` gets None on the other sources' rows; a figure it logs with
    ``log_metric`` is named for the source (``judge/calls`` as ``judge/<source>/calls``: two judged sources' calls
    are two figures, not one mean).

    >>> def first(completions, solution, **kwargs):
    ...     return [float(c == s) for c, s in zip(completions, solution)]
    >>> scored = routed(first, "colour")
    >>> scored.__name__
    'colour/first'
    >>> scored(completions=["red", "[1, 2]", "blue"], solution=["red", "[1, 2]", "red"],
    ...        source=["colour", "boxes", "colour"], trainer_state=None)
    [1.0, None, 0.0]
    """
    name = f"{source}/{func.__name__}"

    def split(kwargs: dict) -> tuple[list[int], int, dict]:
        sources = kwargs.get(SOURCE_COLUMN)
        if sources is None:
            raise SuzakError(f"reward {name}: the rows carry no {SOURCE_COLUMN!r} column (a mixture's rows do)")
        count = len(sources)
        mine = [i for i, row_source in enumerate(sources) if row_source == source]
        sub = {}
        for key, value in kwargs.items():
            if key == "log_metric" and value is not None:
                sub[key] = functools.partial(_source_metric, value, source)
            elif key in _SHARED_KWARGS:
                sub[key] = value
            elif key == "log_extra":
                sub[key] = functools.partial(_scattered_extra, value, mine, count)
            elif isinstance(value, list) and len(value) == count:
                sub[key] = [value[i] for i in mine]
            else:
                sub[key] = value
        return mine, count, sub

    def scattered(mine: list[int], count: int, values: list) -> list[float | None]:
        scores: list[float | None] = [None] * count
        for i, value in zip(mine, values, strict=True):
            scores[i] = value
        return scores

    if is_async(func):  # the judge: awaited by TRL, so the wrapper is a coroutine function too

        @functools.wraps(func)
        async def score(**kwargs: Any) -> list[float | None]:
            mine, count, sub = split(kwargs)
            return scattered(mine, count, await func(**sub) if mine else [])
    else:

        @functools.wraps(func)
        def score(**kwargs: Any) -> list[float | None]:
            mine, count, sub = split(kwargs)
            return scattered(mine, count, func(**sub) if mine else [])

    score.__name__ = score.__qualname__ = name
    score.source = source  # the rows it scores (the trainer counts its None and NaN over them alone)
    return score


def _source_metric(log_metric: Callable, source: str, name: str, value: float) -> None:
    """``log_metric`` of a routed reward: ``<kind>/<rest>`` as ``<kind>/<source>/<rest>`` (TRL's own figures of a
    source's reward read ``rewards/<source>/<reward>``)."""
    kind, _, rest = name.partition("/")
    log_metric(f"{kind}/{source}/{rest}" if rest else f"{source}/{name}", value)


def _scattered_extra(log_extra: Callable, rows: list[int], count: int, column: str, values: list) -> None:
    full: list = [None] * count
    for i, value in zip(rows, values, strict=True):
        full[i] = value
    log_extra(column, full)
