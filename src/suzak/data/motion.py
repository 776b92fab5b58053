"""A ball crossing the frame and "Which way does the ball move?": a procedural video task, offline, deterministic.

Each clip is ``frames`` frames of a disc moving left or right over a jittered grey background; the answer is the
direction word. One frame cannot tell the direction (the ball starts anywhere in its half and ends in the other
half), the order of the frames can: it is the task the video self-test and ``recipes/video_smoke.yaml`` train on.

Rows hold their frames as images (a ``video`` column of ``datasets.Image`` lists) and their frame rate
(``video_fps``), as a decoded video set would; the trainer reads them to the video budget like a video file.
"""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw

__all__ = ["DIRECTIONS", "QUESTION", "ball_frames", "moving_ball"]

QUESTION = "Which way does the ball move? Answer left or right."
DIRECTIONS = ("left", "right")
BACKGROUND = (110, 110, 110)


def ball_frames(rng: np.random.Generator, direction: str | None, frames: int = 8, size: int = 56) -> list[Image.Image]:
    """``frames`` images of a ball moving ``direction`` (``left``/``right``; None: standing still in the middle)."""
    radius = max(3, size // 7)
    colour = tuple(int(c) for c in rng.integers(180, 256, size=3))
    y = int(rng.integers(radius, size - radius))
    start = float(rng.uniform(radius, size / 2 - radius))  # anywhere in the left half
    end = float(rng.uniform(size / 2 + radius, size - radius))  # anywhere in the right half
    xs = np.full(frames, size / 2) if direction is None else np.linspace(start, end, frames)
    if direction == "left":
        xs = xs[::-1]
    out = []
    for x in xs:
        noise = rng.integers(-12, 13, size=(size, size, 1))
        image = Image.fromarray(np.clip(np.array(BACKGROUND) + noise, 0, 255).astype(np.uint8), "RGB")
        ImageDraw.Draw(image).ellipse([x - radius, y - radius, x + radius, y + radius], fill=colour)
        out.append(image)
    return out


def moving_ball(num_rows: int = 1000, *, seed: int = 0, videos: str = "aligned", frames: int = 8, size: int = 56,
                fps: float = 4.0, template: str = "plain"):  # fmt: skip
    """Rows {prompt, video, video_fps, solution, index}: a clip of a ball moving left or right, and the direction.

    ``videos`` picks a control: ``shuffled`` permutes the clips across rows (answers kept), ``still`` shows a ball
    that does not move; then nothing in the frames predicts the answer.

    >>> rows = moving_ball(4, seed=0)
    >>> [row["solution"] for row in rows], len(rows[0]["video"]), rows[0]["video"][0].size, rows[0]["video_fps"]
    (['right', 'right', 'right', 'left'], 8, (56, 56), 4.0)
    """
    import datasets

    from suzak.prompts import get_template

    if videos not in ("aligned", "shuffled", "still"):
        raise ValueError(f"videos must be aligned, shuffled or still, got {videos!r}")
    rng = np.random.default_rng(seed)
    labels = [str(label) for label in rng.choice(DIRECTIONS, size=num_rows)]
    clips = [ball_frames(rng, None if videos == "still" else label, frames, size) for label in labels]
    if videos == "shuffled":
        clips = [clips[i] for i in rng.permutation(num_rows)]
    text = get_template(template).render(QUESTION)
    prompt = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": text}]}]
    rows = [{"prompt": prompt, "video": clip, "video_fps": fps, "solution": label, "index": i}
            for i, (clip, label) in enumerate(zip(clips, labels, strict=True))]  # fmt: skip
    return datasets.Dataset.from_list(rows)
