"""What every task's rewards share: the marks a reward declares itself with, which the registry reads
(:mod:`suzak.scoring.rewards`: ``gold_parser``, ``reads_rollout``, ``correct_at``, ``heldout_scorer``, and the kwargs
check of ``resolve_reward``), and reading a batch's gold answers, where a bad gold raises naming its row."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from suzak.scoring.parsing import gold_answer


def _reads_gold(parse: Callable[[str], Any]) -> Callable[[Callable], Callable]:
    """Mark a reward with the parser it reads gold answers with: ``parse(gold_answer(solution))``, None when the gold
    does not parse. The dataset validation checks every row's gold with it before step 1
    (:func:`suzak.scoring.rewards.gold_parser`)."""

    def mark(func: Callable) -> Callable:
        func.gold_parser = parse
        return func

    return mark


def _reads_rollout(func: Callable) -> Callable:
    """Mark a reward that scores how a rollout went (its tool calls, read from TRL's ``environments``), not the
    answer: the reward pre-flight, which scores ideal answers, skips it
    (:func:`suzak.scoring.rewards.reads_rollout`)."""
    func.reads_rollout = True
    return func


def _checks_kwargs(check: Callable[[dict], None]) -> Callable[[Callable], Callable]:
    """Mark a reward with a check of the values a recipe binds to it (``check(kwargs)`` raises ``SuzakError``), which
    :func:`suzak.scoring.rewards.resolve_reward` runs: a bad value is one line before step 1, not an error at the
    first batch."""

    def mark(func: Callable) -> Callable:
        func.check_kwargs = check
        return func

    return mark


def _correct_at(threshold: float) -> Callable[[Callable], Callable]:
    """Mark a reward whose score is continuous with the score at which the held-out eval counts an answer correct
    (:func:`suzak.scoring.rewards.correct_at`); an unmarked reward's answer is correct at full marks, 1.0."""

    def mark(func: Callable) -> Callable:
        func.correct_at = threshold
        return func

    return mark


def _heldout_as(stand_in: Callable) -> Callable[[Callable], Callable]:
    """Mark a reward whose score moves with the training step with the reward the held-out eval scores it by instead
    (:func:`suzak.scoring.rewards.heldout_scorer`), so that training's eval at any step and ``suzak heldout`` give
    the same figures."""

    def mark(func: Callable) -> Callable:
        func.heldout_as = stand_in
        return func

    return mark


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


def _log_unparsed(answers: list, name: str, log_metric: Callable | None, log_extra: Callable | None) -> None:
    """Report the parsed answers to TRL's completions table and the fraction that had none."""
    if log_metric is not None:
        log_metric(f"{name}/unparsed_frac", sum(a is None for a in answers) / max(len(answers), 1))
    if log_extra is not None:
        log_extra(f"{name}/answer", [None if a is None else str(a) for a in answers])


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
