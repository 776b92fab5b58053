"""Red or blue squares and "What color is the image?": the easiest task that needs the image.

The self-test's colour task (``python -m suzak.selftest``) and the quickstart's demo recipe (``recipes/demo.yaml``,
builder ``color_squares``) read the same rows from here. Each square's channels are jittered by up to ±25, so no two
images are equal; the answer is the colour word, a single token in the tiny model's vocabulary.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from suzak.scoring.prompts import build_conversation, get_template

__all__ = ["COLORS", "GREY", "QUESTION", "color_squares"]

QUESTION = "What color is the image?"
COLORS = {"red": (200, 30, 30), "blue": (30, 30, 200)}
GREY = (120, 120, 120)


def _square(rng: np.random.Generator, rgb: tuple[int, int, int], size: int) -> Image.Image:
    jitter = rng.integers(-25, 26, size=3)  # per image, so no two images are equal
    color = np.clip(np.array(rgb) + jitter, 0, 255).astype(np.uint8)
    return Image.fromarray(np.broadcast_to(color, (size, size, 3)).copy(), "RGB")


def color_squares(num_rows: int = 2000, *, seed: int = 0, images: str = "aligned", size: int = 56,
                  template: str = "plain"):  # fmt: skip
    """Rows {prompt, image, solution, index}: a ``size`` x ``size`` red or blue square and its colour word.

    ``images`` picks a control: ``shuffled`` permutes the squares across rows (labels kept), ``grey`` shows every
    row the same grey square; then nothing in the pixels predicts the answer. Rows are drawn in order from one
    generator, so a held-out split is the last rows of a larger set (``eval_rows`` in a recipe does that).

    >>> rows = color_squares(4, seed=0)
    >>> [row["solution"] for row in rows], rows[0]["image"].size, rows[0]["prompt"][0]["content"][1]["text"]
    (['red', 'red', 'red', 'blue'], (56, 56), 'What color is the image?')
    """
    import datasets

    if images not in ("aligned", "shuffled", "grey"):
        raise ValueError(f"images must be aligned, shuffled or grey, got {images!r}")
    rng = np.random.default_rng(seed)
    labels = rng.choice(sorted(COLORS), size=num_rows)
    pictures = [_square(rng, GREY if images == "grey" else COLORS[label], size) for label in labels]
    if images == "shuffled":
        pictures = [pictures[i] for i in rng.permutation(num_rows)]
    prompt = build_conversation(get_template(template).render(QUESTION))
    rows = [{"prompt": prompt, "image": image, "solution": str(label), "index": i}
            for i, (image, label) in enumerate(zip(pictures, labels, strict=True))]  # fmt: skip
    return datasets.Dataset.from_list(rows)
