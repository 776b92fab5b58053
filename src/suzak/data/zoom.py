"""Procedural zoom task: a checked square whose colour only a crop can show. Offline, by seed.

A grey square image holds one square (a quarter of the side) in one of ``slots`` places of a 4 x 4 grid, checked in
cells of ``side // 448`` pixels (at least 1) of two colours that average to the grey (red/cyan, green/magenta,
blue/yellow). Fitted whole to a quarter of its side (or less) the square is grey on grey, the same for every colour
to within 2 of 255 (measured: the checks cancel under the resize, where stripes alias); a crop of the square at that
budget shows the checks pixel for pixel. The question names the square's box (``question_boxes``, original pixels,
put in the model's frame by :func:`suzak.media.boxes.with_box_frame`) and asks for the first colour's word, the row's
``solution``. ``images="grey"`` draws the square grey (nothing to read: a prior's rows). Used by ``python -m
suzak.selftest --task zoom`` and ``recipes/zoom_smoke.yaml``.

    python -m suzak.data zoom_checks --num_rows 2000 --output data/zoom --format parquet
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from suzak.scoring.prompts import build_conversation, get_template

__all__ = ["CHECKS", "GREY", "QUESTION", "zoom_checks"]

CHECKS = {"red": ((255, 0, 0), (0, 255, 255)), "green": ((0, 255, 0), (255, 0, 255)),
           "blue": ((0, 0, 255), (255, 255, 0))}  # fmt: skip
GREY = (128, 128, 128)
QUESTION = "What colour are the checks in {box}? Answer red, green or blue."
# The grid places in the order ``slots`` takes them: the four central ones first, then the corners, then the rest.
_PLACES = (5, 10, 6, 9, 0, 15, 3, 12, 1, 2, 4, 7, 8, 11, 13, 14)


def zoom_checks(num_rows: int = 1000, seed: int = 0, images: str = "aligned", side: int = 224, slots: int = 16,
                 start: int = 0, template: str = "plain"):  # fmt: skip
    """Rows {prompt, image, solution, question_boxes} of the zoom task (module docstring); row ``i`` depends only on
    ``(seed, start + i)``, so disjoint ``start`` ranges are disjoint splits. ``template`` wraps the question
    (:data:`suzak.scoring.prompts.TEMPLATES`; ``plain``: the bare colour word is the answer).

    >>> row = zoom_checks(2, seed=0)[0]
    >>> row["image"].size, row["question_boxes"], row["solution"]
    ((224, 224), [[0, 56, 56, 112]], 'blue')
    """
    import datasets

    if images not in ("aligned", "grey"):
        raise ValueError(f"images must be aligned or grey, got {images!r}")
    if not 1 <= slots <= len(_PLACES):
        raise ValueError(f"slots must be 1 to {len(_PLACES)}, got {slots}")
    square, cell = side // 4, max(1, side // 448)  # two cells or more to each pixel of a quarter-size view
    grid = [(x * square, y * square) for y in range(4) for x in range(4)]
    places = [grid[i] for i in _PLACES[:slots]]
    names = list(CHECKS)
    checks = (np.add.outer(np.arange(square) // cell, np.arange(square) // cell) % 2)[..., None]  # (square, square, 1)
    rows = []
    text = get_template(template).render(QUESTION)
    for index in range(start, start + num_rows):
        rng = np.random.default_rng([seed, index])
        name = names[int(rng.integers(len(names)))]
        x, y = places[int(rng.integers(len(places)))]
        pixels = np.full((side, side, 3), GREY, dtype=np.uint8)
        if images == "aligned":
            first, second = (np.array(colour, dtype=np.uint8) for colour in CHECKS[name])
            pixels[y : y + square, x : x + square] = np.where(checks == 0, first, second)
        rows.append({"prompt": build_conversation(text), "image": Image.fromarray(pixels), "solution": name,
                     "question_boxes": [[x, y, x + square, y + square]]})  # fmt: skip
    return datasets.Dataset.from_list(rows)
