"""``--task counting``: the procedural CLEVR generator's scenes of 1-3 large objects, one to a cell of a 2x2 grid whose
cells are the model's visual tokens (``clevr_synthetic(cells=...)``), "How many items are there in the image?" with the
``plain`` template and the registry's ``clevr_count`` reward on the bare answer: the proof that a real reward on
real-looking scenes trains. Objects placed freely straddle tokens, and the tiny model's count plateaued near two
thirds there, seed and host deciding whether it passed (docs/selftest.md)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np

from suzak.selftest.priors import answer_rows, sft_prior
from suzak.selftest.spec import TaskSpec, register

if TYPE_CHECKING:
    from pathlib import Path

    from suzak.selftest.config import SelfTestConfig

__all__ = ["OBJECTS", "SPEC", "counting_dataset"]

logger = logging.getLogger(__name__)

OBJECTS = (1, 3)

# Without the answer prior GRPO collapses onto one digit. On the 2x2 cells (one token each) at constant lr 1e-3 aligned
# left chance at step ~60 and passed 0.9 by ~130 on the AVX2 host, but on an AVX-512 host it peaked at 0.90 over steps
# 111-120 and fell to 0.73 by 140 (the collapse the 3x2 grid showed after ~120 at that rate); a cosine schedule from
# 2e-3 over 180 steps reaches 0.985 and 0.959 there (seeds 0, 1) and stays (docs/selftest.md).
SPEC = register("counting", __name__, TaskSpec(180, 2e-3, (2, 2), 1, 1 / 3, 0.7, (0.2, 0.47), prior_steps=80,
                                               heldout_pass_at=0.8, heldout_control_below=0.5,
                                               lr_scheduler_type="cosine"))  # fmt: skip


def counting_dataset(num_rows: int, seed: int, images: str = "aligned", start: int = 0, cache_dir: str | None = None,
                     size: tuple[int, int] | None = None):  # fmt: skip
    """Rows {prompt, image, solution}: CLEVR scenes of 1-3 large objects, one to a cell of the task's token grid,
    "How many ...?" and the bare count, drawn at ``size`` (width, height; default: the default family's).

    Made by ``suzak.data.clevr_synthetic`` (template ``plain``, ``cells`` the task's visual tokens). ``shuffled``
    permutes the images across rows and keeps the counts; ``grey`` shows every row the empty table.
    """
    import datasets

    from suzak.data.builders import clevr_synthetic
    from suzak.data.clevr import Scene, render_scene

    if images not in ("aligned", "shuffled", "grey"):
        raise ValueError(f"images must be aligned, shuffled or grey, got {images!r}")
    width, height = size or SPEC.drawn_size()
    dataset = clevr_synthetic(
        num_rows, seed=seed, start=start, min_objects=OBJECTS[0], max_objects=OBJECTS[1],
        question_types=("total",), width=width, height=height, cells=SPEC.image_tokens, template="plain",
        solution_format="{n}", progress=False, cache_dir=cache_dir,
    ).select_columns(["prompt", "image", "solution"])  # fmt: skip
    if images == "aligned":
        return dataset
    rows = list(dataset)  # decoded once
    if images == "shuffled":
        pictures = [rows[i]["image"] for i in np.random.default_rng(seed).permutation(num_rows)]
    else:
        pictures = [render_scene(Scene(width, height, ()))] * num_rows
    return datasets.Dataset.from_list([row | {"image": picture} for row, picture in zip(rows, pictures, strict=True)])


def datasets(config: SelfTestConfig, images: str, cache_dir: Path, factor: int):
    size = config.spec.image_size(factor)
    train = counting_dataset(config.rows, config.seed, images, cache_dir=str(cache_dir), size=size)
    heldout = counting_dataset(config.heldout_rows, config.seed, "aligned", start=config.rows, cache_dir=str(cache_dir),
                               size=size)  # fmt: skip
    return train, heldout


def rewards(config: SelfTestConfig, tokenizer) -> tuple[list, list[float] | None, str]:
    from suzak.scoring.rewards import resolve_reward

    return [resolve_reward("clevr_count", {"answer_format": "plain"})], None, "reward"  # the registry's reward


def score(config: SelfTestConfig, outputs: list[str], rows: list[dict]) -> list[float]:
    from suzak.scoring.rewards import clevr_count

    return clevr_count(outputs, [row["solution"] for row in rows], answer_format="plain")


def prior(config, condition, model, processor, budget, video_budget, crops, output_dir) -> None:
    """The empty table with a count of 1-3 at random (:func:`suzak.selftest.priors.sft_prior`): ~80 % of the first
    answer token's probability on the three digits, spread evenly, and nothing about counting (nothing to count)."""
    logger.info("%s run: answer prior (%d SFT steps on the empty table)", condition, config.spec.prior_steps)
    rng = np.random.default_rng(config.seed + 20_000)
    empty = counting_dataset(config.spec.prior_steps * 32, config.seed + 20_000, "grey", cache_dir=str(output_dir),
                             size=config.spec.image_size(budget.factor))  # fmt: skip
    counts = [int(rng.integers(1, 4)) for _ in range(len(empty))]
    sft_prior(config, answer_rows(empty, counts), model, processor, budget, output_dir)
