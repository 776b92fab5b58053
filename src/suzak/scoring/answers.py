"""Rewards for an answer checked against the gold one: a CLEVR count, a GSM8K number, a math expression (GeoQA),
R1-V's training reward exactly, a one-word answer."""

from __future__ import annotations

from collections.abc import Callable

from suzak.scoring.marks import _golds, _log_unparsed, _reads_gold
from suzak.scoring.parsing import (
    completion_text,
    count_parser,
    extract_tag,
    math_equal,
    parse_gsm8k_answer,
    parse_int_answer,
    parse_number,
    parse_word,
)
from suzak.scoring.parsing import r1v_accuracy as _r1v_accuracy


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


def word_parser(answer_format: str) -> Callable[[str], str | None]:
    """The one-word answer of a completion in ``answer_format``: ``plain`` reads the whole completion,
    ``think_answer`` the last ``<answer>`` tag.

    >>> word_parser("plain")("Blue"), word_parser("think_answer")("<think>.</think> <answer> Blue </answer>")
    ('blue', 'blue')
    """
    if answer_format == "plain":
        return parse_word
    if answer_format == "think_answer":
        return lambda text: None if (tag := extract_tag(text, "answer")) is None else parse_word(tag)
    raise ValueError(f"no word parser for answer format {answer_format!r}; known: plain, think_answer")


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
