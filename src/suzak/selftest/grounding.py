"""``--task grounding``: "the green square" (:func:`suzak.data.grounding.grounding_shapes` on a 2x2 grid, one shape
filling one cell), the answer a box in the family's own frame (Qwen2.5-VL: pixels of the resized image; Qwen2/3-VL and
Qwen3.5: 0-1000). The images are drawn 4x larger than the one visual token the budget allows (112x112 pixels shown as
28x28), so every box goes through the resize: a wrong frame scores 0. Trained on the registry's ``rec_accuracy`` at
IoU >= 0.75 and ``box_format``; the figure is the mean ``iou`` (logged at weight 0). A continuous IoU reward pays the
whole-image box 0.25 whatever the image, as much as a guess of one cell, and GRPO settles there; IoU >= 0.5 pays a
two-cell box half the time; at 0.75 only the right cell scores."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from suzak.selftest.priors import answer_rows, sft_prior
from suzak.selftest.spec import TaskSpec, register

if TYPE_CHECKING:
    from pathlib import Path

    from suzak.selftest.config import SelfTestConfig

__all__ = ["GRID", "SPEC", "THRESHOLD", "grounding_dataset", "grounding_task_rows"]

logger = logging.getLogger(__name__)

GRID = 2  # cells per side of the task's images
THRESHOLD = 0.75  # rec_accuracy's IoU threshold (the module's docstring)

# One visual token (2x2 patches), the shape in one of its four patches: the merger's concatenation keeps which patch,
# so the position is the token's content. Measured (docs/selftest.md): the prior (200 SFT steps at 3e-3 on a grey
# image, boxes spread over the four cells) leaves the policy at chance (0.25). Without a KL term GRPO drifts onto one
# box per question before the pixels' signal grows (a group that always answers alike has no gradient left: seeds 0
# and 1 stayed at chance); beta 0.3 to the prior keeps it exploring and aligned climbs from step ~70.
# The tiny Qwen3-VL (the relative 0-1000 frame) learnt late or never at these settings, and at every setting tried on
# one seed or another, while its vision tower was 32 wide: a stuck run told one cell of four apart, the random
# features setting the four cells weakly and unevenly apart (docs/selftest.md, "What held it back"). Its tower is
# 128 wide here, its prior on a cosine schedule (at a constant 3e-3 that prior broke on one seed), with 32 prompts a
# step, lr 2e-3 and beta 0.6: seeds 0-2 pass by their margins.
SPEC = register("grounding", __name__, TaskSpec(120, 1e-3, (1, 1), 40, 0.25, 0.5, (0.0, 0.4), prior_steps=200, prior_lr=3e-3, image_scale=4, beta=0.3,
                vllm_shape=True, heldout_pass_at=0.5, heldout_control_below=0.4,
                families={"qwen3_vl": {"group": (32, 8), "learning_rate": 2e-3, "beta": 0.6,
                                      "prior_schedule": "cosine",
                                      "tiny": {"vision_hidden_size": 128, "vision_intermediate_size": 256}}}))  # fmt: skip


def grounding_dataset(num_rows: int, seed: int, images: str = "aligned", size: int | None = None, start: int = 0):
    """Rows {prompt, image, solution}: a ``size``-pixel square image of 2x2 cells, one shape filling one of them,
    "the <colour> <shape>" and its box in the image's pixels (:func:`suzak.data.grounding.grounding_shapes`);
    ``shuffled`` permutes the images across rows (questions and boxes kept), ``grey`` shows every row one grey image.
    """
    import datasets

    return datasets.Dataset.from_list(grounding_task_rows(num_rows, seed, images, size, start))


def grounding_task_rows(num_rows: int, seed: int, images: str = "aligned", size: int | None = None,
                        start: int = 0) -> list[dict]:  # fmt: skip
    """:func:`grounding_dataset`'s rows as dicts holding PIL images, not yet encoded (the prior's grey rows go to its
    SFT dataset as they are: each image encoded once, not three times)."""
    from PIL import Image

    from suzak.data.grounding import grounding_rows

    if images not in ("aligned", "shuffled", "grey"):
        raise ValueError(f"images must be aligned, shuffled or grey, got {images!r}")
    size = size or SPEC.drawn_size()[0]
    rows = grounding_rows(num_rows, seed=seed, start=start, grid=GRID, width=size, height=size, distractors=(0, 0),
                          images="aligned" if images == "grey" else images)  # fmt: skip
    grey = Image.new("RGB", (size, size), (128, 128, 128)) if images == "grey" else None
    return [
        {"prompt": row["prompt"], "image": row["image"] if grey is None else grey, "solution": row["solution"]}
        for row in rows
    ]


def datasets(config: SelfTestConfig, images: str, cache_dir: Path, factor: int):
    side = config.spec.drawn_size(factor)[0]
    return (grounding_dataset(config.rows, config.seed, images, side),
            grounding_dataset(config.heldout_rows, config.seed, "aligned", side, start=config.rows))  # fmt: skip


def rewards(config: SelfTestConfig, tokenizer) -> tuple[list, list[float] | None, str]:
    """The registry's box rewards; the mean IoU logged at weight 0 is the figure (the module's docstring)."""
    from suzak.scoring.rewards import resolve_reward

    funcs = [resolve_reward("rec_accuracy", {"threshold": THRESHOLD}), resolve_reward("box_format"),
             resolve_reward("iou")]  # fmt: skip
    return funcs, [1.0, 0.5, 0.0], "rewards/iou/mean"


def score(config: SelfTestConfig, outputs: list[str], rows: list[dict]) -> list[float]:
    """IoU in the family's frame (the held-out rows carry their box frame: :func:`suzak.selftest.runner.heldout`)."""
    from suzak.scoring.rewards import iou

    return iou(outputs, [row["solution"] for row in rows], [row["box_frame"] for row in rows])


def prior(config, condition, model, processor, budget, video_budget, crops, output_dir) -> None:
    """A grey image, the question and a box spread evenly over the four cells, in the family's frame and answer form
    (:func:`suzak.media.boxes.model_answer`): a pretrained model's habit of answering with a box, and nothing about
    where the shape is."""
    from suzak.media.boxes import model_answer, with_box_frame

    logger.info("%s run: answer prior (%d SFT steps on a grey image)", condition, config.spec.prior_steps)
    side = config.spec.drawn_size(budget.factor)[0]
    grey = grounding_task_rows(config.spec.prior_steps * 32, config.seed + 20_000, "grey", side)
    boxes = [model_answer(with_box_frame(row, model.config.model_type, budget)) for row in grey]
    sft_prior(config, answer_rows(grey, boxes), model, processor, budget, output_dir)
