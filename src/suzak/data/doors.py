"""A procedural two-action episode (the episodes self-test's task, :mod:`suzak.selftest.episodes`): a door, then a key.

The first screen is a 2x2 grid whose one white cell is the door; a click on the door opens it and the next screen
shows the key, a yellow cell placed independently of the door; a click on the key wins (reward 1). Opening the door
and missing the key ends the episode at 0.5; missing the door ends it at 0. The second action depends on what the
second screen shows: :class:`BlankDoorsEnvironment` (the control) opens the same door onto a blank screen, where the
key can only be guessed (at most 0.5 + 0.5 / 4 on average).

>>> from suzak.media.vision import PixelBudget
>>> from suzak.media.boxes import BoxFrame
>>> row = doors_rows(1, seed=0, side=56)[0]
>>> (row["door"], row["key"]), row["image"].size
((3, 2), (56, 56))
>>> env = DoorsEnvironment.bound_to(PixelBudget(3136, 3136, factor=28), max_steps=2)()
>>> env.reset(**row, box_frame=BoxFrame.of("qwen2_5_vl", 56, 56, PixelBudget(3136, 3136, factor=28)).as_dict())
>>> env.click(*cell_point(row["door"], 56))[0]["image"].getpixel(cell_point(row["key"], 56))  # the key's cell
(255, 220, 0)
>>> env.click(*cell_point(row["key"], 56)), env.get_reward()
('The episode is over: success (reward 1).', 1.0)
"""

from __future__ import annotations

from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from suzak.models.episodes import Action, Clicks, Outcome, ScreenEnvironment
from suzak.scoring.prompts import episode_prompt

__all__ = ["BlankDoorsEnvironment", "CELLS", "DoorsEnvironment", "INSTRUCTION", "cell_box", "cell_of", "cell_point", "doors_rows",
           "draw_cell"]  # fmt: skip

GRID = 2
CELLS = GRID * GRID
INSTRUCTION = "Open the door, then click the key."
BACKGROUND, DOOR, KEY = (40, 40, 40), (255, 255, 255), (255, 220, 0)


def draw_cell(cell: int | None, side: int, colour: tuple[int, int, int]) -> Image.Image:
    """A ``side``-pixel square screen, its 2x2 cell ``cell`` (0-3, row by row) filled with ``colour`` (None: blank)."""
    image = Image.new("RGB", (side, side), BACKGROUND)
    if cell is not None:
        left, top, right, bottom = cell_box(cell, side)
        ImageDraw.Draw(image).rectangle((left, top, right - 1, bottom - 1), fill=colour)
    return image


def cell_of(x: float, y: float, side: int) -> int:
    """The cell under a point of a ``side``-pixel screen."""
    size = side / GRID
    column, row = min(int(x // size), GRID - 1), min(int(y // size), GRID - 1)
    return row * GRID + column


def cell_box(cell: int, side: int) -> tuple[int, int, int, int]:
    """``cell``'s box [left, top, right, bottom] in a ``side``-pixel screen's pixels (what a click must land in; the
    model's point for it: ``BoxFrame.click_point(cell_box(...))``)."""
    size = side // GRID
    left, top = (cell % GRID) * size, (cell // GRID) * size
    return left, top, left + size, top + size


def cell_point(cell: int, side: int) -> tuple[int, int]:
    """The centre of ``cell`` in a ``side``-pixel screen's pixels."""
    left, top, right, bottom = cell_box(cell, side)
    return (left + right) // 2, (top + bottom) // 2


def doors_rows(num_rows: int, seed: int = 0, side: int = 56, template: str = "episode") -> list[dict[str, Any]]:
    """Rows {prompt, image (the first screen: the door), door, key, side, solution ("")}: door and key cells drawn
    independently, uniformly; ``side`` the screens' pixels (the image a model sees is fitted to its budget)."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(num_rows):
        door, key = (int(v) for v in rng.integers(0, CELLS, 2))
        rows.append({"prompt": episode_prompt(INSTRUCTION, template), "image": draw_cell(door, side, DOOR),
                     "door": door, "key": key, "side": side, "solution": ""})  # fmt: skip
    return rows


class DoorsEnvironment(ScreenEnvironment, Clicks):
    """The door-then-key episode (``tools: [suzak.data.doors.DoorsEnvironment]``): the row's ``door`` and ``key``
    cells, its image the first screen."""

    blank = False  # the control's: the opened door shows a blank screen

    def _start(self, row: dict[str, Any]) -> Image.Image:
        self.door, self.key = int(row["door"]), int(row["key"])
        self.side = int(row["side"])
        self.opened, self.won, self.lost = False, False, False
        return draw_cell(self.door, self.side, DOOR)

    def _perform(self, action: Action) -> None:
        cell = cell_of(action.x, action.y, self.side)
        if not self.opened:
            self.opened = cell == self.door
            self.lost = not self.opened
        else:
            self.won, self.lost = cell == self.key, cell != self.key

    def _outcome(self) -> Outcome:
        done = self.won or self.lost
        reward = 1.0 if self.won else 0.5 if self.opened else 0.0
        return Outcome(done=done, reward=reward, success=self.won)

    def _screen(self) -> Image.Image | None:
        if self.won or self.lost:
            return None
        if self.opened:
            return draw_cell(None if self.blank else self.key, self.side, KEY)
        return draw_cell(self.door, self.side, DOOR)


class BlankDoorsEnvironment(DoorsEnvironment):
    """The control: the same door opens onto a blank screen (no key shown)."""

    blank = True
