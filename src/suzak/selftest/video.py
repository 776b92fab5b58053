"""``--task video``: 4-frame clips of a ball that is grey in the first two frames and turns red or blue in the last
two (:mod:`suzak.data.motion`, 2x2 tokens a frame), "What color does the ball turn?", with the colour task's reward:
the proof that training learns through the video path (the clip's later frames, read to the video budget). The
control shuffles the clips across rows."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np

from suzak.data.colors import COLORS
from suzak.selftest.color import answer_ids, first_token_reward, first_word_scores
from suzak.selftest.spec import VIDEO_FPS, TaskSpec, register

if TYPE_CHECKING:
    from pathlib import Path

    from suzak.media.video import VideoBudget
    from suzak.media.vision import PixelBudget
    from suzak.selftest.config import SelfTestConfig

__all__ = ["SPEC", "answer_prior", "video_dataset"]

logger = logging.getLogger(__name__)

# Without a prior both runs first learn to answer with a colour word (~90 steps), then aligned learns the frames after
# 30 steps (seeds 1, 2) or over 150 (seed 0: 0.59 at 241-250 with one thread a run), and at 16 prompts x 8
# completions a policy leaning to one colour leaves most groups without signal. With the answer prior (30 steps on
# clips that stay grey) and 8 prompts x 16 completions (the same 128 a step) aligned climbs from step 1: at lr 1e-3 it
# passed 0.9 by step ~100, at 3e-3 by ~40 on the tiny Qwen2.5-VL, the shuffled control at chance. The tiny Qwen3-VL
# with vLLM generating collapsed onto one colour at 3e-3 (aligned = shuffled = 0.583 at 51-60, CI of 4f14e9b): it keeps
# the measured 150 steps at 1e-3 (0.99 at 141-150 with vLLM; docs/selftest.md).
SPEC = register("video", __name__, TaskSpec(60, 3e-3, (2, 2), 2, 0.5, 0.9, (0.3, 0.7), prior_steps=30, video_frames=4, group=(8, 16),
                heldout_pass_at=0.9, heldout_control_below=0.7,
                families={"qwen3_vl": {"steps": 150, "learning_rate": 1e-3}}))  # fmt: skip


def video_dataset(num_rows: int, seed: int, images: str = "aligned", size: int | None = None, frames: int = 4):
    """Rows {prompt, video, video_fps, solution}: ``frames`` frames of a ball that turns red or blue halfway
    (:func:`suzak.data.motion.moving_ball`, question ``color``, at 4 fps) and the colour word. ``shuffled`` permutes
    the clips across rows; ``grey`` shows a still ball that stays grey."""
    from suzak.data.motion import moving_ball

    size = size or SPEC.drawn_size()[0]
    dataset = moving_ball(num_rows, seed=seed, question="color", videos="still" if images == "grey" else images,
                          frames=frames, size=size, fps=VIDEO_FPS)  # fmt: skip
    return dataset.select_columns(["prompt", "video", "video_fps", "solution"])


def datasets(config: SelfTestConfig, images: str, cache_dir: Path, factor: int):
    size, frames = config.spec.image_size(factor)[0], config.spec.video_frames
    return (video_dataset(config.rows, config.seed, images, size, frames),
            video_dataset(config.heldout_rows, config.seed + 10_000, "aligned", size, frames))  # fmt: skip


def rewards(config: SelfTestConfig, tokenizer) -> tuple[list, list[float] | None, str]:
    return [first_token_reward(answer_ids(tokenizer))], None, "reward"


def score(config: SelfTestConfig, outputs: list[str], rows: list[dict]) -> list[float]:
    return first_word_scores(outputs, rows)


def prior(config, condition, model, processor, budget, video_budget, crops, output_dir) -> None:
    logger.info("%s run: answer prior (%d steps on clips that stay grey)", condition, config.spec.prior_steps)
    answer_prior(config, model, processor, budget, video_budget)


def answer_prior(config: SelfTestConfig, model, processor, budget: PixelBudget, video_budget: VideoBudget) -> None:
    """The counting prior's starting point for "What color does the ball turn?": a red or blue answer at random to
    clips of a ball that stays grey, so the model leans toward the colour words (0.13 of the first token's probability
    after the task's 30 steps, split evenly) and knows nothing about the frames yet.

    TRL 1.16's SFTTrainer takes no videos, so these are plain cross-entropy steps on the first answer token over the
    evaluation engine's model inputs (each clip read to the training's video budget, the prompt as it templates it).
    """
    import torch
    import torch.nn.functional as F

    from suzak.eval.engine import HFEngine

    batch, steps = 32, config.spec.prior_steps
    width = config.spec.image_size(budget.factor)[0]
    rows = list(video_dataset(steps * batch, config.seed + 20_000, "grey", width, config.spec.video_frames))
    words = np.random.default_rng(config.seed + 20_000).choice(sorted(COLORS), len(rows))
    ids = answer_ids(processor.tokenizer)
    engine = HFEngine(model, processor, budget, batch_size=batch, max_new_tokens=1, progress=False)
    engine.use_video_budget(video_budget)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.train()
    for step in range(steps):
        inputs = engine.encode(rows[step * batch : (step + 1) * batch]).to(model.device)
        logits = model(**inputs).logits[:, -1]  # left-padded: the last position predicts the answer's first token
        targets = torch.tensor([ids[word] for word in words[step * batch : (step + 1) * batch]])
        F.cross_entropy(logits, targets.to(logits.device)).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
