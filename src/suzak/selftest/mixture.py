"""``--task mixture``: one run on two sources of two tasks, each scored by its own verifier (docs/mixtures.md): the
colour task's squares (``colour``: images) and the video task's clips of a ball that turns red or blue (``video``:
clips), each with its task's 0/1 reward on the first answer token, mixed 1:1 by
:func:`suzak.data.mixture.combine`, each source's reward routed to its own rows (:func:`suzak.scoring.rewards.routed`).
Every step's batch holds image rows and video rows together. Each source must learn through its own pixels: its
reward over the last 10 steps (``sources/<name>/reward``) and its held-out greedy accuracy reach the bars with
aligned images and stay at chance when each source's images are shuffled among its own rows."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from suzak.selftest import color, video
from suzak.selftest.spec import TaskSpec, register

if TYPE_CHECKING:
    from pathlib import Path

    from suzak.selftest.config import SelfTestConfig

__all__ = ["SOURCES", "SPEC", "mixture_dataset"]

logger = logging.getLogger(__name__)

SOURCES = ("colour", "video")  # the mixture's sources, 1:1

# Each source alone learns in 60 steps at lr 3e-3 (colour: 16 prompts x 8 a step; video: 8 x 16); here a step's 128
# completions are ~half each, and 60 steps left seed 1's held-out video accuracy at 0.77 (its reward 0.97): 100
# steps pass every bar by its margin on seeds 0-2 (docs/selftest.md, the mixture's section).
SPEC = register("mixture", __name__, TaskSpec(100, 3e-3, (2, 2), 2, 0.5, 0.9, (0.3, 0.7), prior_steps=30,
                video_frames=4, group=(16, 8), heldout_pass_at=0.9, heldout_control_below=0.7,
                sources=SOURCES))  # fmt: skip


def mixture_dataset(num_rows: int, seed: int, images: str = "aligned", size: int | None = None, frames: int = 4,
                    start_seed: int = 0):  # fmt: skip
    """``num_rows`` rows of both sources, 1:1 in every stretch (:func:`suzak.data.mixture.combine`): the colour task's
    {prompt, image, solution} and the video task's {prompt, video, video_fps, solution}, each with ``source``; a
    column one source lacks is None on its rows. ``images`` is each source's own condition (``shuffled`` permutes
    a source's images among its own rows)."""
    from suzak.data.mixture import Source, combine

    half = (num_rows + 1) // 2
    parts = [color.color_dataset(half, seed + start_seed, images, size),
             video.video_dataset(half, seed + start_seed + 1, images, size, frames)]  # fmt: skip
    sources = [Source(name=name, dataset=f"selftest:{name}") for name in SOURCES]
    return combine(parts, sources, seed=seed, total=num_rows)


def datasets(config: SelfTestConfig, images: str, cache_dir: Path, factor: int):
    size, frames = config.spec.image_size(factor)[0], config.spec.video_frames
    return (mixture_dataset(config.rows, config.seed, images, size, frames),
            mixture_dataset(config.heldout_rows, config.seed, "aligned", size, frames, start_seed=10_000))  # fmt: skip


def rewards(config: SelfTestConfig, tokenizer) -> tuple[list, list[float] | None, str]:
    """Each source's own task reward (the first answer token's 0/1, as each task alone has it: the registry's
    ``word_match`` would ask for the word and its end within the 2 tokens the priors do not teach), routed to its own
    rows, so each source's reward sees its rows alone and logs as ``rewards/<source>/...``; the figure is the step's
    mean reward (the report reads each source's from ``sources/<name>/reward``)."""
    from suzak.scoring.rewards import routed

    ids = color.answer_ids(tokenizer)
    return [routed(color.first_token_reward(ids), "colour"), routed(video.first_token_reward(ids), "video")], None, \
        "reward"  # fmt: skip


def score(config: SelfTestConfig, outputs: list[str], rows: list[dict]) -> list[float]:
    return color.first_word_scores(outputs, rows)


def prior(config, condition, model, processor, budget, video_budget, crops, output_dir) -> None:
    """Both tasks' answer priors, one after the other: a colour word at random to grey squares, then to clips whose
    ball stays grey (the model leans toward the colour words and knows nothing about either task's pixels)."""
    color.prior(config, condition, model, processor, budget, video_budget, crops, output_dir)
    video.prior(config, condition, model, processor, budget, video_budget, crops, output_dir)
