"""Procedural grounding: "the blue circle" among distractors, its box in original-image pixels. Offline, by seed.

Each image has a random size and aspect ratio (by default 160 to 1280 pixels a side, up to 2.5:1, so many are
larger than the recipes' 401,408-pixel budget and the resize matters), a jittered background and a few coloured
shapes; exactly one of them has the colour and shape the question names, and the row's ``solution`` is its box
``[x1, y1, x2, y2]`` in the image's own pixels (the trainer maps it to each model's frame: :mod:`suzak.media.boxes`).
Row ``i`` depends only on ``(seed, start + i)``, so disjoint ``start`` ranges are disjoint splits.

``grid=N`` draws the self-test's form of the task instead: an image of a fixed size cut into N x N cells, the target
filling one cell, each distractor another; the answer is one of N² boxes, so a tiny model can learn it on a CPU
(``python -m suzak.selftest --task grounding``). ``images`` picks a control as the other procedural tasks do:
``shuffled`` permutes the images across rows (questions and boxes kept), ``blank`` shows the background alone.

    python -m suzak.data grounding_shapes --num_rows 2000 --output data/shapes --format parquet
"""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw

from suzak.scoring.prompts import build_conversation, get_template

__all__ = ["COLORS", "SHAPES", "draw_shape", "grounding_rows", "grounding_shapes"]

COLORS = {"red": (215, 40, 40), "green": (40, 170, 60), "blue": (40, 60, 215), "yellow": (230, 200, 40)}
SHAPES = ("circle", "square", "triangle")
BACKGROUND = (150, 150, 150)


def draw_shape(draw: ImageDraw.ImageDraw, shape: str, box: tuple[int, int, int, int], fill: tuple[int, int, int]):
    """``shape`` filling ``box`` (x1, y1, x2, y2; x2 and y2 exclusive), so the box is the shape's tight box."""
    x1, y1, x2, y2 = box
    if shape == "circle":
        draw.ellipse([x1, y1, x2 - 1, y2 - 1], fill=fill)
    elif shape == "square":
        draw.rectangle([x1, y1, x2 - 1, y2 - 1], fill=fill)
    elif shape == "triangle":
        draw.polygon([((x1 + x2 - 1) / 2, y1), (x1, y2 - 1), (x2 - 1, y2 - 1)], fill=fill)
    else:
        raise ValueError(f"unknown shape {shape!r}; known: {', '.join(SHAPES)}")


def _background(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    noise = rng.integers(-10, 11, size=(height, width, 1))
    return Image.fromarray(np.clip(np.array(BACKGROUND) + noise, 0, 255).astype(np.uint8), "RGB")


def _kinds(rng: np.random.Generator, count: int) -> list[tuple[str, str]]:
    """``count`` distinct (colour, shape) pairs: the first is the target, the others its distractors."""
    pairs = [(c, s) for c in COLORS for s in SHAPES]
    return [pairs[i] for i in rng.choice(len(pairs), size=count, replace=False)]


def _free_spot(rng: np.random.Generator, width: int, height: int, side: int, taken: list) -> tuple | None:
    for _ in range(50):
        x, y = int(rng.integers(0, width - side + 1)), int(rng.integers(0, height - side + 1))
        box = (x, y, x + side, y + side)
        if all(box[2] <= t[0] or t[2] <= box[0] or box[3] <= t[1] or t[3] <= box[1] for t in taken):
            return box
    return None


def _scene(rng: np.random.Generator, min_side: int, max_side: int, max_aspect: float,
           distractors: tuple[int, int]) -> tuple[Image.Image, str, tuple]:  # fmt: skip
    """A free-form scene: random size and aspect ratio, shapes at random places and sizes, none overlapping."""
    aspect = float(np.exp(rng.uniform(-np.log(max_aspect), np.log(max_aspect))))  # width / height
    long_side = int(rng.integers(min_side, max_side + 1))
    width, height = (long_side, max(16, round(long_side / aspect))) if aspect >= 1 else (max(16, round(long_side * aspect)), long_side)  # fmt: skip
    image = _background(rng, width, height)
    draw = ImageDraw.Draw(image)
    kinds = _kinds(rng, 1 + int(rng.integers(distractors[0], distractors[1] + 1)))
    short = min(width, height)
    taken: list[tuple] = []
    for colour, shape in kinds:
        side = int(rng.integers(max(8, short // 8), max(9, short // 3) + 1))
        box = _free_spot(rng, width, height, side, taken)
        if box is None:  # no room left: fewer distractors
            continue
        draw_shape(draw, shape, box, COLORS[colour])
        taken.append(box)
    colour, shape = kinds[0]
    return image, f"the {colour} {shape}", taken[0]


def _grid_scene(rng: np.random.Generator, width: int, height: int, grid: int,
                distractors: tuple[int, int]) -> tuple[Image.Image, str, tuple]:  # fmt: skip
    """The self-test's scene: ``grid`` x ``grid`` cells of a ``width`` x ``height`` image, the target filling one."""
    image = _background(rng, width, height)
    draw = ImageDraw.Draw(image)
    cells = rng.permutation(grid * grid)
    count = 1 + int(rng.integers(distractors[0], min(distractors[1], grid * grid - 1) + 1))
    kinds = _kinds(rng, count)
    boxes = []
    for (colour, shape), cell in zip(kinds, cells, strict=False):
        row, col = divmod(int(cell), grid)
        box = (col * width // grid, row * height // grid, (col + 1) * width // grid, (row + 1) * height // grid)
        draw_shape(draw, shape, box, COLORS[colour])
        boxes.append(box)
    colour, shape = kinds[0]
    return image, f"the {colour} {shape}", boxes[0]


def grounding_shapes(num_rows: int = 1000, *, seed: int = 0, start: int = 0, min_side: int = 160,
                     max_side: int = 1280, max_aspect: float = 2.5, distractors: tuple[int, int] | list[int] = (1, 4),
                     grid: int = 0, width: int = 112, height: int = 112, images: str = "aligned",
                     template: str = "rec"):  # fmt: skip
    """Rows {prompt, image, solution, problem, width, height, index}: a scene, the question naming one shape by colour
    and kind (``problem``: "the blue circle"), and its box ``[x1, y1, x2, y2]`` in the image's pixels.

    Free-form scenes by default (sizes ``min_side``..``max_side``, aspect up to ``max_aspect``, 1 + ``distractors``
    shapes); with ``grid`` > 0, ``width`` x ``height`` images of ``grid`` x ``grid`` cells (the self-test's form).

    >>> rows = grounding_shapes(2, seed=0, grid=2, distractors=(0, 0))
    >>> rows[0]["problem"], rows[0]["solution"], rows[0]["image"].size
    ('the green square', '[56, 56, 112, 112]', (112, 112))
    """
    import datasets

    return datasets.Dataset.from_list(grounding_rows(
        num_rows, seed=seed, start=start, min_side=min_side, max_side=max_side, max_aspect=max_aspect,
        distractors=distractors, grid=grid, width=width, height=height, images=images, template=template))  # fmt: skip


def grounding_rows(num_rows: int = 1000, *, seed: int = 0, start: int = 0, min_side: int = 160, max_side: int = 1280,
                   max_aspect: float = 2.5, distractors: tuple[int, int] | list[int] = (1, 4), grid: int = 0,
                   width: int = 112, height: int = 112, images: str = "aligned", template: str = "rec") -> list[dict]:  # fmt: skip
    """:func:`grounding_shapes`' rows as a list of dicts holding PIL images, before a Dataset encodes each image to
    PNG (~1 ms an image): for a caller that changes the rows first (the self-test's grey prior draws 6,400 of
    them and shows a grey image instead), so the images are encoded once, as the caller leaves them."""
    if images not in ("aligned", "shuffled", "blank"):
        raise ValueError(f"images must be aligned, shuffled or blank, got {images!r}")
    if grid < 0 or (grid and (width < grid or height < grid)):
        raise ValueError(f"grid must be >= 0 and at most the image's sides, got {grid} for {width}x{height}")
    low, high = (int(v) for v in distractors)
    if not 0 <= low <= high:
        raise ValueError(f"distractors must be (min, max) with 0 <= min <= max, got {list(distractors)}")
    rows = []
    for index in range(start, start + num_rows):
        rng = np.random.default_rng([seed, index])
        if grid:
            image, problem, box = _grid_scene(rng, width, height, grid, (low, high))
        else:
            image, problem, box = _scene(rng, min_side, max_side, max_aspect, (low, high))
        prompt = build_conversation(get_template(template).render(problem))
        rows.append({"prompt": prompt, "image": image, "solution": f"[{box[0]}, {box[1]}, {box[2]}, {box[3]}]",
                     "problem": problem, "width": image.width, "height": image.height, "index": index})  # fmt: skip
    if images == "shuffled":
        order = np.random.default_rng([seed, start, 1]).permutation(num_rows)
        pictures = [rows[i]["image"] for i in order]
        rows = [row | {"image": picture, "width": picture.width, "height": picture.height}
                for row, picture in zip(rows, pictures, strict=True)]  # fmt: skip
    elif images == "blank":
        rows = [row | {"image": _background(np.random.default_rng([seed, row["index"], 2]), row["width"],
                                            row["height"])} for row in rows]  # fmt: skip
    return rows
