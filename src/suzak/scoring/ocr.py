"""OCR rewards: DocVQA's ANLS and an exact match, each against the row's accepted answers."""

from __future__ import annotations

import functools
from collections.abc import Callable

from suzak.scoring.marks import _correct_at, _golds, _log_unparsed, _reads_gold
from suzak.scoring.parsing import completion_text, gold_texts, text_parser


def ocr_normal(text: str) -> str:
    """An OCR answer as DocVQA's evaluation compares it: lower case, whitespace runs as one space, stripped.

    >>> ocr_normal("  Total:\\n 42  ")
    'total: 42'
    """
    return " ".join(text.lower().split())


def anls_score(answer: str, golds: list[str], threshold: float = 0.5) -> float:
    """DocVQA's ANLS of one answer: for each accepted answer the normalised Levenshtein similarity 1 - NL of the two
    :func:`ocr_normal` forms (NL from ``rapidfuzz.distance.Levenshtein.normalized_distance``), the best of them, kept
    when NL <= ``threshold`` (tau, 0.5) and 0.0 beyond.

    As DocVQA's official evaluation script (the RRC's, for DocVQA and InfographicVQA: ``1 - min(NL)``, zeroed when
    below 0.5), so a distance of exactly 0.5 keeps its 0.5 where the ST-VQA paper's formula (NL < tau) would give 0.
    One difference: the script divides the distance by the longer *raw* string, so stray whitespace or a case change
    that alters a length (``ß``) lowers its NL; here both sides are normalised first.

    >>> anls_score("Total 4", ["Total: 42", "total 42"]), anls_score("TOTAL  42", ["total 42"]), anls_score("no", ["42"])
    (0.875, 1.0, 0.0)
    """
    from rapidfuzz.distance import Levenshtein  # imported here: only the OCR rewards need it

    distance = min(Levenshtein.normalized_distance(ocr_normal(answer), ocr_normal(gold)) for gold in golds)
    return 1.0 - distance if distance <= threshold else 0.0


def ocr_equal(answer: str, golds: list[str]) -> bool:
    """Whether ``answer`` is one of the accepted ``golds`` once both are :func:`ocr_normal`.

    >>> ocr_equal(" Total:  42", ["total: 42"]), ocr_equal("total 42", ["total: 42"])
    (True, False)
    """
    return ocr_normal(answer) in {ocr_normal(gold) for gold in golds}


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
    (:func:`anls_score`). ``answer_format``: ``plain`` (the whole completion, the default) or
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
