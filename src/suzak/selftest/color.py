"""``--task color`` (the default, the install check): "What color is the image?" over small red or blue squares, each
channel jittered so no two images are equal, with a 0/1 reward on the first answer token; the control shuffles the
squares across rows. A short answer prior on grey squares makes the colour words the likely first tokens, as a
pretrained model's are; which colour is GRPO's to learn from the pixels (docs/selftest.md)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from suzak.data.colors import COLORS
from suzak.selftest.priors import answer_rows, sft_prior
from suzak.selftest.spec import TaskSpec, register

if TYPE_CHECKING:
    from pathlib import Path

    from suzak.selftest.config import SelfTestConfig

__all__ = ["SPEC", "answer_ids", "color_dataset", "first_token_reward"]

logger = logging.getLogger(__name__)

# Without a prior GRPO first has to find the colour words among the vocabulary's: at lr 2e-3 and above it collapsed onto
# one colour, at 1e-3 it passed by ~130 steps (the tiny Qwen3-VL and Qwen3.5 only at 5e-4, by ~200). After 30 SFT
# steps on grey squares (either colour word, at random) lr 3e-3 passes 0.9 by step ~40 on every family and the
# shuffled control stays at chance (docs/selftest.md).
SPEC = register("color", __name__, TaskSpec(60, 3e-3, (2, 2), 2, 0.5, 0.9, (0.3, 0.7), prior_steps=30,
                                            heldout_pass_at=0.9, heldout_control_below=0.7))  # fmt: skip


def color_dataset(num_rows: int, seed: int, images: str = "aligned", size: int | None = None):
    """Rows {prompt, image, solution}: a red or blue square (``size`` pixels a side; default: the default family's)
    and its colour word (``images`` picks the control); the ``color_squares`` builder's rows
    (:mod:`suzak.data.colors`), which the demo recipe trains on too."""
    from suzak.data.colors import color_squares

    size = size or SPEC.drawn_size()[0]
    return color_squares(num_rows, seed=seed, images=images, size=size).select_columns(["prompt", "image", "solution"])


def first_token_reward(ids: dict[str, int]):
    """0/1 reward: the first generated token is the gold colour word (a single token in the tiny vocabulary).

    Partial credit for any colour word made one seed collapse onto a single answer and stall: keep it 0/1.
    """

    def color_first_token(completions, completion_ids, solution, **kwargs) -> list[float]:
        return [float(bool(row) and row[0] == ids[gold]) for row, gold in zip(completion_ids, solution, strict=True)]

    return color_first_token


def answer_ids(tokenizer) -> dict[str, int]:
    """Each colour word's single token in ``tokenizer``'s vocabulary (a word split in several is an error)."""
    ids = {}
    for word in COLORS:
        pieces = tokenizer(word, add_special_tokens=False)["input_ids"]
        if len(pieces) != 1:
            raise RuntimeError(
                f"the tiny vocabulary splits {word!r} into {len(pieces)} tokens; the self-test needs one"
            )
        ids[word] = pieces[0]
    return ids


def first_word_scores(outputs: list[str], rows: list[dict]) -> list[float]:
    """1 where a greedy answer starts with the row's colour word (the colour and video tasks' held-out score)."""
    return [float(out.strip().startswith(row["solution"])) for out, row in zip(outputs, rows, strict=True)]


def datasets(config: SelfTestConfig, images: str, cache_dir: Path, factor: int):
    size = config.spec.image_size(factor)[0]
    return (color_dataset(config.rows, config.seed, images, size),
            color_dataset(config.heldout_rows, config.seed + 10_000, "aligned", size))  # fmt: skip


def rewards(config: SelfTestConfig, tokenizer) -> tuple[list, list[float] | None, str]:
    return [first_token_reward(answer_ids(tokenizer))], None, "reward"


def score(config: SelfTestConfig, outputs: list[str], rows: list[dict]) -> list[float]:
    return first_word_scores(outputs, rows)


def prior(config, condition, model, processor, budget, video_budget, crops, output_dir) -> None:
    """Grey squares with a colour word at random (:func:`suzak.selftest.priors.sft_prior`): the first answer token
    leans toward the colour words, either as likely, and nothing tells a red square from a blue one yet."""
    logger.info("%s run: answer prior (%d SFT steps on grey squares)", condition, config.spec.prior_steps)
    size = config.spec.image_size(budget.factor)[0]
    grey = color_dataset(config.spec.prior_steps * 32, config.seed + 20_000, "grey", size)
    sft_prior(config, answer_rows(grey, grey["solution"]), model, processor, budget, output_dir)
