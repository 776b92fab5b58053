"""A ball crossing the frame: procedural video tasks, offline, deterministic by seed.

Each clip is ``frames`` frames of a disc moving left or right over a jittered grey background. Two questions:

- ``direction``: "Which way does the ball move?", answered ``left`` or ``right``. One frame cannot tell (the ball
  starts anywhere in one half and ends anywhere in the other), the order of the frames can; ``recipes/video_smoke.yaml``
  trains on it;
- ``color``: "What color does the ball turn?": the ball is grey in the first half of the clip and red or blue in the
  second, so only the later frames answer it; the video self-test's task (``python -m suzak.selftest --task video``),
  with one-token answers the tiny model can learn on a CPU.

Rows hold their frames as images (a ``video`` column of ``datasets.Image`` lists) and their frame rate
(``video_fps``), as a decoded video set would; the trainer reads them to the video budget like a video file.
"""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw

__all__ = ["COLORS", "DIRECTIONS", "QUESTIONS", "ball_frames", "moving_ball"]

QUESTIONS = {"direction": "Which way does the ball move? Answer left or right.",
             "color": "What color does the ball turn?"}  # fmt: skip
DIRECTIONS = ("left", "right")
COLORS = {"red": (210, 30, 30), "blue": (30, 30, 210)}
BALL_GREY = (200, 200, 200)
BACKGROUND = (110, 110, 110)


def ball_frames(rng: np.random.Generator, direction: str | None, frames: int = 8, size: int = 56,
                turns: tuple[int, int, int] | None = None) -> list[Image.Image]:  # fmt: skip
    """``frames`` images of a ball moving ``direction`` (``left``/``right``; None: standing still in the middle);
    with ``turns``, the ball is grey for the first half of the frames and that colour for the rest."""
    radius = max(3, size // 7) if turns is None else max(4, size * 2 // 5)  # a ball that turns fills the frame
    margin = radius if turns is None else 0  # a direction: start and end in opposite halves, the ball within each
    colour = tuple(int(c) for c in rng.integers(180, 256, size=3))
    y = int(rng.integers(radius, size - radius + 1))
    start = float(rng.uniform(radius, size / 2 - margin))  # in the left half
    end = float(rng.uniform(size / 2 + margin, size - radius))  # in the right half
    xs = np.full(frames, size / 2) if direction is None else np.linspace(start, end, frames)
    if direction == "left":
        xs = xs[::-1]
    out = []
    for i, x in enumerate(xs):
        noise = rng.integers(-12, 13, size=(size, size, 1))
        image = Image.fromarray(np.clip(np.array(BACKGROUND) + noise, 0, 255).astype(np.uint8), "RGB")
        fill = colour if turns is None else BALL_GREY if i < frames // 2 else turns
        ImageDraw.Draw(image).ellipse([x - radius, y - radius, x + radius, y + radius], fill=fill)
        out.append(image)
    return out


def moving_ball(num_rows: int = 1000, *, seed: int = 0, question: str = "direction", videos: str = "aligned",
                frames: int = 8, size: int = 56, fps: float = 4.0, template: str = "plain"):  # fmt: skip
    """Rows {prompt, video, video_fps, solution, index}: a clip of a ball moving left or right, and the answer to
    ``question`` (``direction``: left or right; ``color``: red or blue, the colour the ball turns).

    ``videos`` picks a control: ``shuffled`` permutes the clips across rows (answers kept), ``still`` shows a ball
    that does not move (and, for ``color``, stays grey); then nothing in the frames predicts the answer.

    >>> rows = moving_ball(4, seed=0)
    >>> [row["solution"] for row in rows], len(rows[0]["video"]), rows[0]["video"][0].size, rows[0]["video_fps"]
    (['right', 'right', 'right', 'left'], 8, (56, 56), 4.0)
    >>> [row["solution"] for row in moving_ball(4, seed=0, question="color", frames=4)]
    ['blue', 'blue', 'blue', 'red']
    """
    import datasets

    from suzak.scoring.prompts import build_conversation, get_template

    if videos not in ("aligned", "shuffled", "still"):
        raise ValueError(f"videos must be aligned, shuffled or still, got {videos!r}")
    if question not in QUESTIONS:
        raise ValueError(f"question must be {' or '.join(QUESTIONS)}, got {question!r}")
    rng = np.random.default_rng(seed)
    answers = DIRECTIONS if question == "direction" else tuple(COLORS)
    labels = [str(label) for label in rng.choice(answers, size=num_rows)]
    clips = []
    for label in labels:
        if question == "direction":
            clips.append(ball_frames(rng, None if videos == "still" else label, frames, size))
        else:
            direction = str(rng.choice(DIRECTIONS))
            turns = BALL_GREY if videos == "still" else COLORS[label]
            clips.append(ball_frames(rng, None if videos == "still" else direction, frames, size, turns))
    if videos == "shuffled":
        clips = [clips[i] for i in rng.permutation(num_rows)]
    text = get_template(template).render(QUESTIONS[question])
    prompt = build_conversation(text, 0, video=True)
    rows = [{"prompt": prompt, "video": clip, "video_fps": fps, "solution": label, "index": i}
            for i, (clip, label) in enumerate(zip(clips, labels, strict=True))]  # fmt: skip
    return datasets.Dataset.from_list(rows)
