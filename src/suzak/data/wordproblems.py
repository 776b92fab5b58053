"""Made-up grade-school word problems in GSM8K's exact row format, drawn procedurally (offline).

Rows are ``{"question": str, "answer": str}`` where the answer is worked steps with ``<<a+b=c>>`` calculator
annotations ending in ``"\\n#### N"``, as in openai/grade-school-math. None of the text is copied from GSM8K; the
problems are generated from a few templates with random names, items and numbers, deterministic per
``(seed, index)``. They exist so the GSM8K paths (SFT, GRPO, evaluation) run offline and in tests.

>>> row = word_problem(0, 0)
>>> row["answer"].splitlines()[-1].startswith("#### ")
True
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

__all__ = ["word_problem", "word_problems"]

_NAMES = ["Mara", "Theo", "Lena", "Omar", "Priya", "Jonas", "Ada", "Kofi", "Mei", "Ravi", "Sofia", "Tariq"]
_ITEMS = ["pencils", "apples", "stickers", "marbles", "cookies", "books", "shells", "cards", "eggs", "plants"]


def _fmt(n: int) -> str:
    """Numbers the way GSM8K answers write them in the text: thousands separated by commas."""
    return f"{n:,}"


def _add_then_give(rng: random.Random, name: str, item: str) -> tuple[str, list[str], int]:
    a, b = rng.randint(5, 60), rng.randint(2, 40)
    c = rng.randint(1, a + b - 1)
    s, r = a + b, a + b - c
    question = f"{name} has {a} {item}. {name} gets {b} more {item} and then gives {c} to a friend. How many {item} does {name} have now?"  # noqa: E501
    steps = [f"After getting more, {name} has {a}+{b} = <<{a}+{b}={s}>>{s} {item}.",
             f"After giving some away, {name} has {s}-{c} = <<{s}-{c}={r}>>{r} {item}."]  # fmt: skip
    return question, steps, r


def _boxes(rng: random.Random, name: str, item: str) -> tuple[str, list[str], int]:
    boxes, each, extra = rng.randint(2, 12), rng.randint(3, 25), rng.randint(0, 9)
    total = boxes * each
    question = f"{name} packs {boxes} boxes with {each} {item} in each box and keeps {extra} more {item} aside. How many {item} does {name} have in all?"  # noqa: E501
    steps = [f"The boxes hold {boxes}*{each} = <<{boxes}*{each}={total}>>{total} {item}.",
             f"With the ones aside that is {total}+{extra} = <<{total}+{extra}={total + extra}>>{total + extra} {item}."]  # fmt: skip
    return question, steps, total + extra


def _change(rng: random.Random, name: str, item: str) -> tuple[str, list[str], int]:
    price, count = rng.randint(2, 15), rng.randint(2, 9)
    cost = price * count
    bill = next(b for b in (20, 50, 100, 200) if b >= cost)
    question = f"One bag of {item} costs ${price}. {name} buys {count} bags and pays with a ${bill} bill. How much change does {name} get in dollars?"  # noqa: E501
    steps = [f"The bags cost {count}*{price} = $<<{count}*{price}={cost}>>{cost}.",
             f"The change is {bill}-{cost} = $<<{bill}-{cost}={bill - cost}>>{bill - cost}."]  # fmt: skip
    return question, steps, bill - cost


def _per_day(rng: random.Random, name: str, item: str) -> tuple[str, list[str], int]:
    per_day, days = rng.randint(120, 900), rng.randint(7, 30)
    total = per_day * days
    question = f"A shop sells {per_day} {item} every day. How many {item} does it sell in {days} days?"
    steps = [f"In {days} days it sells {per_day}*{days} = <<{per_day}*{days}={total}>>{_fmt(total)} {item}."]
    return question, steps, total


def _temperature(rng: random.Random, name: str, item: str) -> tuple[str, list[str], int]:
    start, drop = rng.randint(0, 9), rng.randint(10, 20)
    question = f"At noon the temperature was {start} degrees. By night it had fallen by {drop} degrees. What was the temperature at night?"  # noqa: E501
    steps = [f"The temperature at night was {start}-{drop} = <<{start}-{drop}={start - drop}>>{start - drop} degrees."]
    return question, steps, start - drop


_TEMPLATES: list[Callable[[random.Random, str, str], tuple[str, list[str], int]]] = [
    _add_then_give, _boxes, _change, _per_day, _temperature,
]  # fmt: skip


def word_problem(seed: int, index: int) -> dict[str, str]:
    """One GSM8K-format row, determined by ``(seed, index)`` alone."""
    rng = random.Random(f"{seed}:{index}")
    template = _TEMPLATES[rng.randrange(len(_TEMPLATES))]
    question, steps, answer = template(rng, rng.choice(_NAMES), rng.choice(_ITEMS))
    return {"question": question, "answer": "\n".join(steps) + f"\n#### {_fmt(answer)}"}


def word_problems(num: int, *, seed: int = 0, start: int = 0) -> Iterator[dict[str, str]]:
    """Rows ``start .. start + num - 1``; disjoint ranges (or seeds) give disjoint splits."""
    for index in range(start, start + num):
        yield word_problem(seed, index)
