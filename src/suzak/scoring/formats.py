"""Format rewards: the answer written in the form the prompt asks for, whatever it says (R1-V's think/answer
format, GSM8K's ``#### N`` line). The box answer's format, which reads the row's frame, is
:func:`suzak.scoring.grounding.box_format`."""

from __future__ import annotations

import re

from suzak.scoring.parsing import completion_text, parse_number

# R1-V's format reward's pattern (R1-V full-matches the raw text; suzak strips outer whitespace first).
_THINK_FORMAT_RE = re.compile(r"<think>.*?</think>\s*<answer>.*?</answer>", re.DOTALL)


def is_think_format(text: str) -> bool:
    """R1-V's format pattern: ``<think>…</think>`` then ``<answer>…</answer>`` and nothing else.

    One deliberate difference: R1-V full-matches the raw text, so a leading space or a trailing newline scores 0
    there; here outer whitespace is stripped first (it says nothing about the format the model learnt).

    >>> is_think_format(" <think>\\nthree cubes\\n</think>\\n<answer>3</answer>\\n")
    True
    >>> is_think_format("<answer>3</answer>"), is_think_format("<think>a</think><answer>3</answer> done")
    (False, False)
    """
    return _THINK_FORMAT_RE.fullmatch(text.strip()) is not None


def has_gsm8k_hash_line(text: str) -> bool:
    """Whether the last non-empty line is ``#### <number>`` (the GSM8K answer format).

    >>> has_gsm8k_hash_line("2 + 16 = 18\\n#### 18\\n"), has_gsm8k_hash_line("#### $1,234")
    (True, True)
    >>> has_gsm8k_hash_line("#### 18\\nDone."), has_gsm8k_hash_line("#### eighteen")
    (False, False)
    """
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines or not lines[-1].startswith("####"):
        return False
    return parse_number(lines[-1][4:]) is not None


def think_format(completions: list, **kwargs) -> list[float | None]:
    """1.0 for R1-V's ``<think>…</think> <answer>…</answer>`` format and nothing else, else 0.0.

    Same pattern as R1-V's format reward, except that outer whitespace is stripped first (R1-V gives 0.0 to a
    completion with a leading space or a trailing newline).

    >>> think_format(["<think>\\n3 cubes\\n</think>\\n<answer>3</answer>", "<answer>3</answer>"])
    [1.0, 0.0]
    """
    return [float(is_think_format(completion_text(c))) for c in completions]


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
