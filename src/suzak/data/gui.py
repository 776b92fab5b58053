"""Procedural GUI clicks: "the blue round button" on an app-like screen, its box in the screen's pixels. Offline, by seed.

Each screen has a real screen's aspect ratio (4:3 to 21:9) and a size from 1280x800 to 2560x1440 by default, all
larger than the recipes' 401,408-pixel budget, so the resize matters. It is drawn flat, as an app is: a title bar, a
sidebar of grey text-like bars, a toolbar, a panel or two and more grey bars as distractors, in a light or a dark
theme; then several buttons (``buttons``: 3 to 8 by default), each a distinct (colour, shape) pair, so the one the
question names ("the blue round button") is the only one of its kind on its screen. Buttons are 40 to 160 pixels,
never overlapping nor touching (at least ``GAP`` pixels apart); only buttons have colour (the chrome is grey), so a
button's box is tight around its colour. The row's ``solution`` is the target's box ``[x1, y1, x2, y2]`` in the
screen's own pixels (x2, y2 exclusive), which a click answer is checked against in the model's frame
(:mod:`suzak.media.boxes`). Row ``i`` depends only on ``(seed, start + i)``, so disjoint ``start`` ranges are disjoint
splits; ``images="shuffled"`` permutes the screens across rows (questions and boxes kept), the control where nothing
on the screen tells where to click.

    python -m suzak.data gui_click --num_rows 2000 --output data/gui --format parquet
"""

from __future__ import annotations

import io
import json

import numpy as np
from PIL import Image, ImageDraw

from suzak import SuzakError
from suzak.media.boxes import ANSWER_KIND_COLUMN
from suzak.scoring.prompts import build_conversation, get_template

__all__ = ["ASPECTS", "COLORS", "GAP", "SHAPES", "draw_button", "gui_click"]

COLORS = {"red": (220, 50, 60), "orange": (245, 130, 30), "yellow": (235, 190, 20), "green": (40, 160, 70),
          "blue": (30, 110, 230), "purple": (130, 70, 200)}  # fmt: skip
SHAPES = ("round", "square", "pill")
ASPECTS = (4 / 3, 3 / 2, 16 / 10, 16 / 9, 21 / 9)  # width / height of real screens
GAP = 12  # pixels at least between two buttons' boxes
LABEL = (255, 255, 255)  # a button's label (a white bar or dot): never a button's colour
# (window, sidebar, title bar, panel, panel border, text bars' greys low..high): greys only, so colour means button
THEMES = (((246, 246, 248), (232, 233, 236), (60, 62, 68), (255, 255, 255), (214, 216, 220), (110, 190)),
          ((36, 37, 41), (27, 28, 31), (18, 18, 20), (48, 49, 54), (70, 72, 78), (95, 150)))  # fmt: skip
_PADDING = 16  # between the content area's edge and a button


def draw_button(draw: ImageDraw.ImageDraw, shape: str, box: tuple[int, int, int, int], fill: tuple[int, int, int]):
    """A ``shape`` button filling ``box`` (x1, y1, x2, y2; x2 and y2 exclusive) with a white label inside, so the
    box is the button's tight box: a circle (``round``), a square with slightly rounded corners, or a ``pill``."""
    x1, y1, x2, y2 = box
    w, h = x2 - x1, y2 - y1
    cx, cy = (x1 + x2 - 1) / 2, (y1 + y2 - 1) / 2
    if shape == "round":
        draw.ellipse([x1, y1, x2 - 1, y2 - 1], fill=fill)
        r = w / 6
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=LABEL)
        return
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; known: {', '.join(SHAPES)}")
    radius = h // 2 if shape == "pill" else h // 8
    draw.rounded_rectangle([x1, y1, x2 - 1, y2 - 1], radius=radius, fill=fill)
    half_w, half_h = w * (0.3 if shape == "pill" else 0.25), max(2, h // 12)
    draw.rectangle([round(cx - half_w), round(cy - half_h), round(cx + half_w), round(cy + half_h)], fill=LABEL)


def _screen_size(rng: np.random.Generator, width: tuple[int, int], height: tuple[int, int]) -> tuple[int, int]:
    """A real screen's aspect ratio that fits the bounds, then a width for it, the height following."""
    fitting = [a for a in ASPECTS if max(width[0], height[0] * a) <= min(width[1], height[1] * a)]
    aspect = fitting[int(rng.integers(len(fitting)))]
    low, high = max(width[0], height[0] * aspect), min(width[1], height[1] * aspect)
    w = int(rng.integers(int(np.ceil(low)), int(high) + 1))
    return w, int(np.clip(round(w / aspect), height[0], height[1]))


def _button_size(rng: np.random.Generator, shape: str) -> tuple[int, int]:
    if shape == "pill":
        h = int(rng.integers(40, 57))
        return min(160, int(h * rng.uniform(2.2, 3.6))), h
    side = int(rng.integers(40, 89))
    return side, side


def _apart(box: tuple, taken: list[tuple], gap: int) -> bool:
    return all(box[2] + gap <= t[0] or t[2] + gap <= box[0] or box[3] + gap <= t[1] or t[3] + gap <= box[1]
               for t in taken)  # fmt: skip


def _spot(rng: np.random.Generator, area: tuple, size: tuple[int, int], taken: list, gap: int) -> tuple | None:
    """A box of ``size`` inside ``area`` at least ``gap`` pixels from every box in ``taken``; None after 50 tries."""
    (x1, y1, x2, y2), (w, h) = area, size
    if x2 - x1 < w or y2 - y1 < h:
        return None
    for _ in range(50):
        x, y = int(rng.integers(x1, x2 - w + 1)), int(rng.integers(y1, y2 - h + 1))
        if _apart((x, y, x + w, y + h), taken, gap):
            return (x, y, x + w, y + h)
    return None


def _text_bars(draw: ImageDraw.ImageDraw, rng: np.random.Generator, area: tuple, count: int, taken: list,
               greys: tuple[int, int]):  # fmt: skip
    """Up to ``count`` text-like grey bars in ``area``, clear of the boxes in ``taken`` (the buttons, the bars drawn
    so far), each added to it."""
    for _ in range(count):
        width = int(rng.integers(40, max(41, min(400, (area[2] - area[0]) * 2 // 3))))
        bar = _spot(rng, area, (width, int(rng.integers(8, 15))), taken, 8)
        if bar is not None:
            grey = int(rng.integers(greys[0], greys[1] + 1))
            draw.rectangle([bar[0], bar[1], bar[2] - 1, bar[3] - 1], fill=(grey, grey, grey))
            taken.append(bar)


def _menu(draw: ImageDraw.ImageDraw, rng: np.random.Generator, sidebar: tuple, greys: tuple[int, int]):
    """The sidebar's items: a column of grey bars, left-aligned, one a row."""
    step, x = int(rng.integers(28, 41)), sidebar[0] + 16
    for y in range(sidebar[1] + 16, sidebar[3] - 24, step):
        width = int(rng.integers(30, 71) * (sidebar[2] - sidebar[0] - 32) // 100)
        grey = int(rng.integers(greys[0], greys[1] + 1))
        draw.rectangle([x, y, x + width - 1, y + 9], fill=(grey, grey, grey))


def _screen(rng: np.random.Generator, width: tuple[int, int], height: tuple[int, int],
            count: tuple[int, int]) -> tuple[Image.Image, list[dict]]:  # fmt: skip
    """A screen and its buttons ({colour, shape, box}), the target first: the only button of its colour and shape."""
    w, h = _screen_size(rng, width, height)
    window, side_fill, title_fill, panel_fill, border, greys = THEMES[int(rng.random() < 0.3)]
    image = Image.new("RGB", (w, h), window)
    draw = ImageDraw.Draw(image)
    title, toolbar, side = int(rng.integers(28, 41)), int(rng.integers(44, 61)), int(rng.integers(w // 8, w // 5 + 1))
    left = bool(rng.integers(2))
    sidebar = (0, title, side, h) if left else (w - side, title, w, h)
    main = (side, title, w, h) if left else (0, title, w - side, h)
    draw.rectangle([0, 0, w - 1, title - 1], fill=title_fill)
    draw.rectangle([sidebar[0], sidebar[1], sidebar[2] - 1, sidebar[3] - 1], fill=side_fill)
    draw.line([main[0], title + toolbar, main[2] - 1, title + toolbar], fill=border)
    content = (main[0] + _PADDING, title + toolbar + _PADDING, main[2] - _PADDING, h - _PADDING)
    for _ in range(int(rng.integers(1, 3))):  # panels (cards) under the buttons
        pw, ph = (int(rng.integers(s // 4, s // 2 + 1)) for s in (content[2] - content[0], content[3] - content[1]))
        panel = _spot(rng, content, (pw, ph), [], 0)
        if panel is not None:
            draw.rectangle([panel[0], panel[1], panel[2] - 1, panel[3] - 1], fill=panel_fill, outline=border)
    pairs = [(c, s) for c in COLORS for s in SHAPES]
    kinds = [pairs[i] for i in rng.choice(len(pairs), size=int(rng.integers(count[0], count[1] + 1)), replace=False)]
    buttons: list[dict] = []
    for colour, shape in kinds:
        box = _spot(rng, content, _button_size(rng, shape), [b["box"] for b in buttons], GAP)
        if box is None:  # no room left: fewer distractors (the target, placed first, always fits)
            continue
        buttons.append({"colour": colour, "shape": shape, "box": box})
    _menu(draw, rng, sidebar, greys)
    _text_bars(draw, rng, (main[0] + 12, title + 8, main[2] - 12, title + toolbar - 8), 4, [], greys)  # toolbar
    _text_bars(draw, rng, content, int(rng.integers(6, 16)), [b["box"] for b in buttons], greys)
    for button in buttons:
        draw_button(draw, button["shape"], button["box"], COLORS[button["colour"]])
    return image, buttons


def _png(image: Image.Image) -> dict:
    """``image`` as the PNG a ``datasets.Image`` column holds: zlib level 1, ~1.7x faster than Pillow's default 6 on
    these flat screens (~30 ms a 2-megapixel screen against ~50), the files ~35 kB against ~12."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=1)
    return {"bytes": buffer.getvalue(), "path": None}


def _check(min_width: int, max_width: int, min_height: int, max_height: int, buttons, images: str) -> tuple[int, int]:
    """The options' errors, each one line naming the option, before any screen is drawn; the (min, max) buttons."""
    if images not in ("aligned", "shuffled"):
        raise SuzakError(f"gui_click: images must be aligned or shuffled, got {images!r}")
    if not 480 <= min_width <= max_width or not 320 <= min_height <= max_height:
        raise SuzakError(f"gui_click: need 480 <= min_width <= max_width and 320 <= min_height <= max_height, got "
                         f"{min_width}..{max_width} x {min_height}..{max_height}")  # fmt: skip
    if not any(max(min_width, min_height * a) <= min(max_width, max_height * a) for a in ASPECTS):
        raise SuzakError(f"gui_click: no real screen's aspect ratio ({', '.join(f'{a:.2f}' for a in ASPECTS)}) fits "
                         f"{min_width}..{max_width} x {min_height}..{max_height}")  # fmt: skip
    try:
        low, high = (int(v) for v in buttons)
    except (TypeError, ValueError):
        raise SuzakError(f"gui_click: buttons must be (min, max), got {buttons!r}") from None
    if not 1 <= low <= high <= len(COLORS) * len(SHAPES):
        raise SuzakError(f"gui_click: buttons must be (min, max) with 1 <= min <= max <= "
                         f"{len(COLORS) * len(SHAPES)} (distinct colour and shape), got {list(buttons)}")  # fmt: skip
    return low, high


def gui_click(num_rows: int = 1000, *, seed: int = 0, start: int = 0, min_width: int = 1280, max_width: int = 2560,
              min_height: int = 800, max_height: int = 1440, buttons: tuple[int, int] | list[int] = (3, 8),
              images: str = "aligned", template: str = "click"):  # fmt: skip
    """Rows {prompt, image, solution, problem, width, height, index, buttons}: an app-like screen, the question naming
    one button by colour and shape (``problem``: "the blue round button"), and its box ``[x1, y1, x2, y2]`` in the
    screen's pixels; ``buttons`` is the JSON list of the buttons drawn on the row's image (colour, shape, box).

    >>> rows = gui_click(1, seed=0)
    >>> rows[0]["problem"], rows[0]["solution"], rows[0]["image"].size
    ('the purple pill button', '[1435, 696, 1556, 750]', (2309, 990))
    """
    import datasets

    low, high = _check(min_width, max_width, min_height, max_height, buttons, images)
    prompt_template = get_template(template)
    rows = []
    for index in range(start, start + num_rows):
        image, drawn = _screen(np.random.default_rng([seed, index]), (min_width, max_width), (min_height, max_height),
                               (low, high))  # fmt: skip
        target = drawn[0]
        problem = f"the {target['colour']} {target['shape']} button"
        rows.append({"prompt": build_conversation(prompt_template.render(problem)), "image": _png(image),
                     "solution": json.dumps(list(target["box"])), "problem": problem, "width": image.width,
                     "height": image.height, "index": index, "buttons": json.dumps(drawn),
                     ANSWER_KIND_COLUMN: "point" if template == "click" else "box"})  # fmt: skip
    if images == "shuffled":  # the screens permuted across rows: each row's question and box kept
        order = np.random.default_rng([seed, start, 1]).permutation(num_rows)
        screens = [{k: rows[i][k] for k in ("image", "width", "height", "buttons")} for i in order]
        rows = [row | screen for row, screen in zip(rows, screens, strict=True)]
    return datasets.Dataset.from_list(rows).cast_column("image", datasets.Image())
