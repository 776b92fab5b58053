"""Boxes in each Qwen family's own frame: the one place a box is mapped between an image and a model.

A box in a dataset is in **original-image pixels** ``[x1, y1, x2, y2]`` (RefCOCO's convention; datasets in
normalised [0, 1] or 0-1000 coordinates say so with an explicit option, :func:`to_pixels`, never by a guess). A model
reads and writes boxes in its own frame, which differs by family (docs/grounding.md has the sources):

==============  ========================================================  ============================================
family          frame                                                     native answer form
==============  ========================================================  ============================================
qwen2_vl        relative, integers on [0, 1000)                           ``<|box_start|>(x1,y1),(x2,y2)<|box_end|>``
qwen2_5_vl      absolute pixels of the image **as the processor resized   ``{"bbox_2d": [x1, y1, x2, y2]}``
                it** (the pixel budget's ``smart_resize``), not of the
                original
qwen3_vl        relative, integers on [0, 1000]                           ``{"bbox_2d": [x1, y1, x2, y2]}``
qwen3_5         relative, integers on [0, 1000] (as Qwen3-VL)             ``{"bbox_2d": [x1, y1, x2, y2]}``
==============  ========================================================  ============================================

A click (GUI grounding) is a point in the same frame, written ``{"point_2d": [x, y]}`` in every family
(:meth:`BoxFrame.click_point`, :func:`render_point`); a row whose gold box is to be clicked says so in
:data:`ANSWER_KIND_COLUMN`.

:class:`BoxFrame` is one image's frame: the family, the original size and the size the pixel budget gives it (the
exact size training, vLLM and evaluation feed the model: :meth:`suzak.media.vision.PixelBudget.size`). Changing the budget
moves the boxes with the image. A model-frame box maps to original pixels and back to the same integers exactly;
an original-pixel box maps to the model frame and back within half a model unit.

    suzak boxes --family qwen2_5_vl --width 1920 --height 1080 --box 100 200 500 600
    {"family": "qwen2_5_vl", "size": [1920, 1080], "resized": [840, 448], "frame": "pixels of the resized image",
     "box": [100, 200, 500, 600], "model_box": [44, 83, 219, 249], "answer": "{\"bbox_2d\": [44, 83, 219, 249]}"}
    suzak boxes --family qwen2_5_vl --width 1920 --height 1080 --box 44 83 219 249 --from_model
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from suzak import SuzakError
from suzak.media.vision import DEFAULT_MAX_PIXELS, DEFAULT_MIN_PIXELS, PixelBudget, family_factors, images_of
from suzak.scoring.parsing import gold_answer, gold_boxes, gold_texts

__all__ = [
    "ANSWER_KIND_COLUMN",
    "BOX_FRAME_COLUMN",
    "DATASET_FRAMES",
    "FRAMES",
    "BoxFrame",
    "FrameSpec",
    "box_iou",
    "box_numbers",
    "box_problem",
    "coco_map",
    "match_f1",
    "model_answer",
    "render_boxes",
    "render_point",
    "to_pixels",
    "with_box_frame",
]

BOX_FRAME_COLUMN = "box_frame"  # the column the trainer adds to a row with one image: its frame, for the rewards
QUESTION_BOXES_COLUMN = "question_boxes"  # boxes a row's question names ({box}, {box2}, ...), in original pixels
# What a row's answer is, when its gold is a box: the box itself ("box", the default) or a point inside it ("point": a
# GUI click, scored by click_accuracy). model_answer renders the ideal answer (pre-flight, SFT targets) by it.
ANSWER_KIND_COLUMN = "answer_kind"
ANSWER_KINDS = ("box", "point")
_QUESTION_MARK = re.compile(r"\{box(\d*)\}")
Box = tuple[float, float, float, float]


@dataclass(frozen=True)
class FrameSpec:
    """How a family writes a box: ``relative`` integers on [0, ``top``] of the image's width and height, or absolute
    pixels of the resized image (``top`` None); and its native answer form (``tokens`` or ``json``)."""

    relative: bool
    top: int | None
    form: str
    description: str


_RELATIVE_1000 = FrameSpec(True, 1000, "json", "relative, integers on [0, 1000]")
FRAMES: dict[str, FrameSpec] = {
    "qwen2_vl": FrameSpec(True, 999, "tokens", "relative, integers on [0, 1000)"),
    "qwen2_5_vl": FrameSpec(False, None, "json", "pixels of the resized image"),
    "qwen3_vl": _RELATIVE_1000,
    "qwen3_vl_moe": _RELATIVE_1000,
    "qwen3_5": _RELATIVE_1000,
    "qwen3_5_moe": _RELATIVE_1000,
}
DATASET_FRAMES = ("pixels", "normalized", "relative1000")  # how a dataset's boxes may be given (builder option)


def _spec(family: str) -> FrameSpec:
    try:
        return FRAMES[family]
    except KeyError:
        raise SuzakError(f"no box frame for model type {family!r}; suzak knows {', '.join(FRAMES)}") from None


@dataclass(frozen=True)
class BoxFrame:
    """One image's box frame: the model family (its ``model_type``), the original size and the resized one.

    >>> frame = BoxFrame.of("qwen2_5_vl", 1920, 1080, PixelBudget(3136, 401408, factor=28))
    >>> (frame.resized_width, frame.resized_height), frame.to_model((100, 200, 500, 600))
    ((840, 448), (44, 83, 219, 249))
    >>> BoxFrame.of("qwen3_vl", 1920, 1080, PixelBudget(3136, 401408, factor=32)).to_model((100, 200, 500, 600))
    (52, 185, 260, 556)
    """

    family: str
    width: int
    height: int
    resized_width: int
    resized_height: int
    # an image past Qwen's 200:1 is padded, centred, on its short side before the resize (suzak.media.vision.fit_image):
    # the padding on the left and on top, in original pixels; the model sees the padded image
    pad_x: int = 0
    pad_y: int = 0

    def __post_init__(self):
        _spec(self.family)
        if min(self.width, self.height, self.resized_width, self.resized_height) <= 0:
            raise SuzakError(f"a box frame needs positive sizes, got {self.width}x{self.height} resized to "
                             f"{self.resized_width}x{self.resized_height}")  # fmt: skip

    @classmethod
    def of(cls, family: str, width: int, height: int, budget: PixelBudget) -> BoxFrame:
        """The frame of a ``width`` x ``height`` image fed to a ``family`` model under ``budget`` (bound to the model's
        patch factor: :meth:`suzak.media.vision.PixelBudget.for_model`), the ratio padding included.

        >>> frame = BoxFrame.of("qwen3_vl", 4000, 10, PixelBudget(3136, 401408, factor=32))  # 400:1, padded to 200:1
        >>> frame.pad_y, frame.to_model((0, 0, 4000, 10))  # the image is the middle quarter of the padded height
        (5, (0, 250, 1000, 750))
        """
        from suzak.media.vision import ratio_padded_size

        resized_height, resized_width = budget.size(height, width)
        padded_height, padded_width = ratio_padded_size(int(height), int(width), budget.min_pixels, budget.max_pixels,
                                                        factor=budget.factor)  # fmt: skip
        return cls(family, int(width), int(height), int(resized_width), int(resized_height),
                   (padded_width - int(width)) // 2, (padded_height - int(height)) // 2)  # fmt: skip

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> BoxFrame:
        sizes = ("family", "width", "height", "resized_width", "resized_height")
        return cls(**{key: values[key] for key in sizes}, pad_x=values.get("pad_x", 0), pad_y=values.get("pad_y", 0))

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def spec(self) -> FrameSpec:
        return _spec(self.family)

    @property
    def extent(self) -> tuple[int, int]:
        """The largest x and y a box may have in the model frame."""
        if self.spec.relative:
            return self.spec.top, self.spec.top
        return self.resized_width, self.resized_height

    @property
    def _units(self) -> tuple[float, float]:
        """Model-frame units per pixel of the padded image along x and y."""
        width, height = self.width + 2 * self.pad_x, self.height + 2 * self.pad_y
        if self.spec.relative:
            return 1000 / width, 1000 / height
        return self.resized_width / width, self.resized_height / height

    def to_model(self, box: Sequence[float]) -> tuple[int, int, int, int]:
        """An original-pixel box in this frame: integers, as the model writes them (clamped to the frame)."""
        (ux, uy), (top_x, top_y) = self._units, self.extent
        x1, y1, x2, y2 = (float(v) for v in box)
        px, py = self.pad_x, self.pad_y
        return (_clamp(round((x1 + px) * ux), top_x), _clamp(round((y1 + py) * uy), top_y),
                _clamp(round((x2 + px) * ux), top_x), _clamp(round((y2 + py) * uy), top_y))  # fmt: skip

    def from_model(self, box: Sequence[float]) -> Box:
        """A model-frame box in original pixels (floats)."""
        ux, uy = self._units
        x1, y1, x2, y2 = (float(v) for v in box)
        return x1 / ux - self.pad_x, y1 / uy - self.pad_y, x2 / ux - self.pad_x, y2 / uy - self.pad_y

    def in_frame(self, box: Sequence[float]) -> bool:
        """Whether a model-frame box is a real box of this frame: inside it, x1 < x2 and y1 < y2."""
        top_x, top_y = self.extent
        x1, y1, x2, y2 = box
        return 0 <= x1 < x2 <= top_x and 0 <= y1 < y2 <= top_y

    def render(self, boxes: Sequence[Sequence[float]], label: str | None = None) -> str:
        """The original-pixel ``boxes`` in this frame, in the family's native answer form (:func:`render_boxes`)."""
        return render_boxes([self.to_model(box) for box in boxes], self.spec.form, label)

    def point_in_frame(self, point: Sequence[float]) -> bool:
        """Whether a model-frame point (a click) lies in this frame, its edges included.

        >>> frame = BoxFrame("qwen2_5_vl", 200, 100, 196, 98)
        >>> frame.point_in_frame((196, 0)), frame.point_in_frame((197, 0)), frame.point_in_frame((-1, 5))
        (True, False, False)
        """
        top_x, top_y = self.extent
        x, y = point
        return 0 <= x <= top_x and 0 <= y <= top_y

    def point_from_model(self, point: Sequence[float]) -> tuple[float, float]:
        """A model-frame point in original pixels (floats), as :meth:`from_model` maps a box's corners.

        >>> BoxFrame("qwen3_vl", 200, 100, 192, 96).point_from_model((500, 250))
        (100.0, 25.0)
        """
        x, y = (float(v) for v in point)
        return self.from_model((x, y, x, y))[:2]

    def point_in_box(self, point: Sequence[float], box: Sequence[float]) -> bool:
        """Whether a model-frame point is a click on an original-pixel ``box``: inside the box as this frame rounds it
        (:meth:`to_model`), its edges included.

        >>> frame = BoxFrame("qwen2_5_vl", 200, 100, 196, 98)
        >>> frame.point_in_box((98, 0), (0, 0, 100, 100)), frame.point_in_box((99, 0), (0, 0, 100, 100))
        (True, False)
        """
        x1, y1, x2, y2 = self.to_model(box)
        x, y = point
        return x1 <= x <= x2 and y1 <= y <= y2

    def click_point(self, box: Sequence[float]) -> tuple[int, int]:
        """Where a model should click an original-pixel ``box``: the box's centre in this frame, integers (always a
        click on the box, :meth:`point_in_box`).

        >>> BoxFrame("qwen2_5_vl", 200, 100, 196, 98).click_point((0, 0, 100, 100))
        (49, 49)
        """
        x1, y1, x2, y2 = self.to_model(box)
        return round((x1 + x2) / 2), round((y1 + y2) / 2)


def with_box_frame(row: dict[str, Any], family: str | None, budget: PixelBudget) -> dict[str, Any]:
    """``row`` with its :data:`BOX_FRAME_COLUMN`: the frame of its one image (:meth:`BoxFrame.as_dict`) for a model
    ``family`` that has one, None for a row with no image or several (every row of a batch has the column: TRL hands
    rewards each column of the batch's first row). A text model's row (``family`` without a frame) is left as it is.
    A row with :data:`QUESTION_BOXES_COLUMN` also gets its prompt's ``{box}`` marks in that frame
    (:func:`put_question_boxes`): the question's boxes and the answer's are worked out in this one place.

    >>> from PIL import Image
    >>> row = with_box_frame({"image": Image.new("RGB", (640, 480))}, "qwen2_5_vl", PixelBudget(3136, 50176, factor=28))
    >>> row["box_frame"]
    {'family': 'qwen2_5_vl', 'width': 640, 'height': 480, 'resized_width': 252, 'resized_height': 168, 'pad_x': 0, 'pad_y': 0}
    """
    if family not in FRAMES:
        return row
    budget = budget.of_row(row)  # a mixture source's own bounds, where its rows carry them
    images = images_of(row)
    frame = BoxFrame.of(family, images[0].width, images[0].height, budget) if len(images) == 1 else None
    if row.get(QUESTION_BOXES_COLUMN) is not None:
        if frame is None:
            raise SuzakError(f"{QUESTION_BOXES_COLUMN}: a box in a question needs the row's one image, and it has "
                             f"{len(images)}")  # fmt: skip
        row = {**row, "prompt": put_question_boxes(row["prompt"], question_boxes_of(row), frame)}
    return {**row, BOX_FRAME_COLUMN: frame.as_dict() if frame else None}


def question_boxes_of(row: dict[str, Any]) -> list[list[float]]:
    """The boxes a row's question names (:data:`QUESTION_BOXES_COLUMN`: one box or a list of them, as a list or its
    JSON text; original-image pixels), [] for a row without.

    >>> question_boxes_of({"question_boxes": "[10, 20, 30, 40]"}), question_boxes_of({"question_boxes": [[1, 2, 3, 4]]})
    ([[10, 20, 30, 40]], [[1, 2, 3, 4]])
    """
    value = row.get(QUESTION_BOXES_COLUMN)
    if value is None:
        return []
    value = json.loads(value) if isinstance(value, str) else value
    return [list(box) for box in value] if value and isinstance(value[0], list | tuple) else [list(value)]


def question_box_text(box: Sequence[float], frame: BoxFrame) -> str:
    """A box inside a question as the family reads one: Qwen2-VL's box tokens, else ``[x1, y1, x2, y2]``, in the
    model's frame at the image's budgeted size (what the model answers in, so a question's box and an answer's
    box are in one frame).

    >>> frame = BoxFrame.of("qwen2_5_vl", 1920, 1080, PixelBudget(3136, 401408, factor=28))
    >>> question_box_text([960, 540, 1920, 1080], frame), (frame.resized_width, frame.resized_height)
    ('[420, 224, 840, 448]', (840, 448))
    >>> question_box_text([960, 540, 1920, 1080], BoxFrame.of("qwen2_vl", 1920, 1080, PixelBudget(3136, 401408, 28)))
    '<|box_start|>(500,500),(999,999)<|box_end|>'
    """
    model = frame.to_model(box)
    return render_boxes([model], "tokens") if frame.spec.form == "tokens" else "[{}, {}, {}, {}]".format(*model)


def put_question_boxes(prompt: Any, boxes: list[list[float]], frame: BoxFrame) -> Any:
    """``prompt`` (text or chat messages) with each ``{box}`` / ``{box1}`` (the first box), ``{box2}`` ... replaced by
    that box in the model's frame (:func:`question_box_text`). A mark with no box is one line.

    >>> frame = BoxFrame.of("qwen3_vl", 200, 100, PixelBudget(1024, 65536, factor=32))
    >>> put_question_boxes([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is in {box}?"}]}],
    ...                    [[0, 0, 100, 50]], frame)[0]["content"][1]["text"]
    'What is in [0, 0, 500, 500]?'
    """

    def text(value: str) -> str:
        def one(match: re.Match) -> str:
            number = int(match.group(1) or 1)
            if not 1 <= number <= len(boxes):
                raise SuzakError(f"the question names {match.group(0)} and the row's {QUESTION_BOXES_COLUMN} holds "
                                 f"{len(boxes)} box(es)")  # fmt: skip
            return question_box_text(boxes[number - 1], frame)

        return _QUESTION_MARK.sub(one, value)

    if isinstance(prompt, str):
        return text(prompt)
    out = []
    for message in prompt:
        content = message.get("content")
        if isinstance(content, str):
            content = text(content)
        elif isinstance(content, list):
            content = [part | {"text": text(part["text"])} if part.get("type") == "text" else part for part in content]
        out.append({**message, "content": content})
    return out


def model_answer(row: dict[str, Any], label: str | None = None) -> str:
    """The gold answer of ``row`` as its model should write it: a grounding row's gold boxes (original pixels) in its
    frame (:data:`BOX_FRAME_COLUMN`) and the family's form; a click row's (:data:`ANSWER_KIND_COLUMN` ``point``) the
    centre of its gold box in its frame as ``{"point_2d": [x, y]}`` (:meth:`BoxFrame.click_point`); the first of a
    list of accepted answers (OCR's, :func:`suzak.scoring.parsing.gold_texts`); any other row's gold answer as it is
    (:func:`suzak.scoring.parsing.gold_answer`). The reward pre-flight's and SFT's target.

    >>> frame = {"family": "qwen2_vl", "width": 200, "height": 100, "resized_width": 196, "resized_height": 98}
    >>> model_answer({"solution": "[20, 10, 120, 60]", "box_frame": frame}), model_answer({"solution": "<answer> 3 </answer>"})
    ('<|box_start|>(100,100),(600,600)<|box_end|>', '3')
    >>> model_answer({"solution": "[20, 10, 120, 60]", "box_frame": frame, "answer_kind": "point"})
    '{"point_2d": [350, 350]}'
    >>> model_answer({"solution": '["1 mg", "1mg"]'})
    '1 mg'
    """
    gold = gold_answer(row["solution"])
    kind = row.get(ANSWER_KIND_COLUMN) or "box"
    if kind not in ANSWER_KINDS:
        raise ValueError(f"{ANSWER_KIND_COLUMN} {kind!r} is none of {', '.join(ANSWER_KINDS)}")
    frame = row.get(BOX_FRAME_COLUMN)
    boxes = gold_boxes(gold) if frame is not None else None
    if kind == "point" and not boxes:
        why = "no box frame (a click is read on the row's one image)" if frame is None else f"no box in {gold!r:.80}"
        raise ValueError(f"a click row ({ANSWER_KIND_COLUMN} 'point') has {why}")
    if not boxes:
        return (gold_texts(gold) or [gold])[0]
    frame = frame if isinstance(frame, BoxFrame) else BoxFrame.from_dict(frame)
    return render_point(frame.click_point(boxes[0])) if kind == "point" else frame.render(boxes, label)


def _clamp(value: int, top: int) -> int:
    return min(max(value, 0), top)


def render_boxes(model_boxes: Sequence[Sequence[int]], form: str, label: str | None = None) -> str:
    """Model-frame boxes as a family writes them: Qwen2-VL's box tokens, or JSON objects with ``bbox_2d`` (one object
    for one box, a list for several).

    >>> render_boxes([(1, 2, 3, 4)], "tokens"), render_boxes([(1, 2, 3, 4)], "json")
    ('<|box_start|>(1,2),(3,4)<|box_end|>', '{"bbox_2d": [1, 2, 3, 4]}')
    >>> render_boxes([(1, 2, 3, 4), (5, 6, 7, 8)], "json", "cup")
    '[{"bbox_2d": [1, 2, 3, 4], "label": "cup"}, {"bbox_2d": [5, 6, 7, 8], "label": "cup"}]'
    """
    ints = [[int(v) for v in box] for box in model_boxes]
    if form == "tokens":
        ref = f"<|object_ref_start|>{label}<|object_ref_end|>" if label else ""
        return "".join(f"{ref}<|box_start|>({a},{b}),({c},{d})<|box_end|>" for a, b, c, d in ints)
    if form != "json":
        raise ValueError(f"unknown box form {form!r}: tokens or json")
    objects = [{"bbox_2d": box} | ({"label": label} if label else {}) for box in ints]
    return json.dumps(objects[0] if len(objects) == 1 else objects)


def render_point(model_point: Sequence[int]) -> str:
    """A model-frame point (a click) as Qwen2.5-VL and Qwen3-VL write one, the form every family's click is read in.

    >>> render_point((12, 40))
    '{"point_2d": [12, 40]}'
    """
    return json.dumps({"point_2d": [int(v) for v in model_point]})


def to_pixels(box: Sequence[float], frame: str, width: int, height: int) -> Box:
    """A dataset box given in ``frame`` (:data:`DATASET_FRAMES`) in original pixels of a ``width`` x ``height`` image.

    >>> to_pixels([0.25, 0.5, 0.75, 1.0], "normalized", 640, 480), to_pixels([250, 500, 750, 1000], "relative1000", 640, 480)
    ((160.0, 240.0, 480.0, 480.0), (160.0, 240.0, 480.0, 480.0))
    """
    x1, y1, x2, y2 = (float(v) for v in box)
    if frame == "pixels":
        return x1, y1, x2, y2
    if frame == "normalized":
        return x1 * width, y1 * height, x2 * width, y2 * height
    if frame == "relative1000":
        return x1 * width / 1000, y1 * height / 1000, x2 * width / 1000, y2 * height / 1000
    raise SuzakError(f"unknown box frame {frame!r}: {', '.join(DATASET_FRAMES)}")


def box_numbers(box: Any) -> Box | None:
    """``box`` as four floats when it is a list or tuple of 4 finite numbers (not booleans), else None.

    >>> box_numbers([1, 2, 3.5, 4]), box_numbers([1, 2, 3]), box_numbers(["a", 2, 3, 4]), box_numbers("1234")
    ((1.0, 2.0, 3.5, 4.0), None, None, None)
    """
    if not isinstance(box, list | tuple) or len(box) != 4:
        return None
    if not all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in box):
        return None
    return tuple(float(v) for v in box)  # type: ignore[return-value]


def box_problem(box: Any, width: int, height: int) -> str:
    """Why ``box`` is not an original-pixel box of a ``width`` x ``height`` image ('' when it is one).

    >>> box_problem([10, 10, 5, 20], 100, 100), box_problem([0, 0, 100, 120], 100, 100), box_problem([1, 2, 3], 9, 9)
    ('x2 5 is not right of x1 10', 'y2 120 is outside the image (height 100)', 'a box needs 4 numbers, got 3')
    """
    if not isinstance(box, list | tuple) or isinstance(box, str):
        return f"a box is a list of 4 numbers [x1, y1, x2, y2], got {box!r:.60}"
    if len(box) != 4:
        return f"a box needs 4 numbers, got {len(box)}"
    if box_numbers(box) is None:
        return f"a box needs 4 finite numbers, got {list(box)!r:.80}"
    x1, y1, x2, y2 = box
    for name, value, size, side in (("x1", x1, width, "width"), ("y1", y1, height, "height"),
                                     ("x2", x2, width, "width"), ("y2", y2, height, "height")):  # fmt: skip
        if not 0 <= value <= size:
            return f"{name} {value:g} is outside the image ({side} {size})"
    if x2 <= x1:
        return f"x2 {x2:g} is not right of x1 {x1:g}"
    if y2 <= y1:
        return f"y2 {y2:g} is not below y1 {y1:g}"
    return ""


def box_iou(a: Sequence[float], b: Sequence[float]) -> float:
    """Intersection over union of two boxes in one frame (continuous coordinates: area (x2 - x1) * (y2 - y1)); 0 for a
    degenerate box.

    >>> box_iou((0, 0, 10, 10), (5, 0, 15, 10)), box_iou((0, 0, 10, 10), (20, 20, 30, 30)), box_iou((0, 0, 0, 9), (0, 0, 9, 9))
    (0.3333333333333333, 0.0, 0.0)
    """
    ax1, ay1, ax2, ay2 = a
    bx1, by1, bx2, by2 = b
    area_a, area_b = max(ax2 - ax1, 0) * max(ay2 - ay1, 0), max(bx2 - bx1, 0) * max(by2 - by1, 0)
    if area_a <= 0 or area_b <= 0:
        return 0.0
    inter = max(min(ax2, bx2) - max(ax1, bx1), 0) * max(min(ay2, by2) - max(ay1, by1), 0)
    return inter / (area_a + area_b - inter)


def match_f1(predicted: Sequence[Sequence[float]], gold: Sequence[Sequence[float]], threshold: float = 0.5) -> float:
    """F1 of ``predicted`` against ``gold`` boxes, a prediction matching at most one gold box at IoU >= ``threshold``
    (greedy on the highest IoU first, as detection metrics match); 1.0 when both are empty.

    >>> match_f1([(0, 0, 10, 10), (20, 20, 30, 30)], [(0, 0, 10, 10)]), match_f1([], [(0, 0, 1, 1)])
    (0.6666666666666666, 0.0)
    """
    if not predicted and not gold:
        return 1.0
    pairs = sorted(((box_iou(p, g), i, j) for i, p in enumerate(predicted) for j, g in enumerate(gold)), reverse=True)
    used_p, used_g = set(), set()
    for iou, i, j in pairs:
        if iou >= threshold and i not in used_p and j not in used_g:
            used_p.add(i)
            used_g.add(j)
    matched = len(used_p)
    return 2 * matched / (len(predicted) + len(gold))


def coco_map(predicted: Sequence[Sequence[float] | None], gold: Sequence[Sequence[float]]) -> float:
    """COCO's mAP@[.5:.95] of ``predicted`` boxes against the ``gold`` boxes of one image, all in one frame, computed by
    pycocotools itself (``COCOeval(...).stats[0]``: one category, at most 100 predictions). An answer has no
    confidences, so the predictions rank in the order given (the first written, the surest); a None among them (a
    box that is none) is a wrong prediction at its rank. 0.0 with no prediction, and where COCO leaves the figure
    undefined (-1: no gold box). Half the gold found scores 51/101: precision 1 at COCO's recall points 0, 0.01 .. 0.5.

    >>> coco_map([(0, 0, 10, 10), (50, 50, 60, 60)], [(0, 0, 10, 10)]), coco_map([(50, 50, 60, 60), (0, 0, 10, 10)], [(0, 0, 10, 10)])
    (1.0, 0.5)
    >>> round(coco_map([(0, 0, 10, 10)], [(0, 0, 10, 10), (50, 50, 60, 60)]), 4), coco_map([None], [(0, 0, 1, 1)])
    (0.505, 0.0)
    """
    from pycocotools.coco import COCO  # imported here: only box_map needs it
    from pycocotools.cocoeval import COCOeval

    if not predicted or not gold:
        return 0.0
    ground = COCO()
    ground.dataset = {
        "images": [{"id": 1}],
        "categories": [{"id": 1, "name": "object"}],
        "annotations": [{"id": i, "image_id": 1, "category_id": 1, "bbox": _xywh(box), "area": _area(box), "iscrowd": 0}
                        for i, box in enumerate(gold, start=1)],
    }  # fmt: skip
    found = [{"image_id": 1, "category_id": 1, "bbox": _xywh(box or (0, 0, 0, 0)), "score": float(len(predicted) - rank)}
             for rank, box in enumerate(predicted)]  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints each stage and the summary table
        ground.createIndex()
        evaluation = COCOeval(ground, ground.loadRes(found), "bbox")
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
    value = float(evaluation.stats[0])
    if value < 0:  # -1: COCO found no gold box to average over
        return 0.0
    # COCOeval's precision is tp / (tp + fp + np.spacing(1)), so a perfect answer comes out at 1 - 2e-16: rounded off,
    # it is the 1.0 the pre-flight and the eval's accuracy (a score >= 1.0) expect
    return round(value, 12)


def _xywh(box: Sequence[float]) -> list[float]:
    x1, y1, x2, y2 = (float(v) for v in box)
    return [x1, y1, x2 - x1, y2 - y1]


def _area(box: Sequence[float]) -> float:
    return max(float(box[2]) - float(box[0]), 0.0) * max(float(box[3]) - float(box[1]), 0.0)


# --- suzak boxes (python -m suzak.media.boxes) ------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="suzak boxes",
        description="Where a box lands in a Qwen family's frame at the size the pixel budget gives the image (or, "
        "with --from_model, where a model's box lands on the original image): one JSON line.",
    )  # fmt: skip
    parser.add_argument("--family", required=True, choices=list(FRAMES), help="the model's model_type")
    parser.add_argument("--width", type=int, required=True, help="the original image's width in pixels")
    parser.add_argument("--height", type=int, required=True, help="the original image's height in pixels")
    parser.add_argument("--box", type=float, nargs=4, required=True, metavar=("X1", "Y1", "X2", "Y2"),
                        help="the box: original-image pixels, or the model's frame with --from_model")  # fmt: skip
    parser.add_argument("--min_pixels", type=int, default=DEFAULT_MIN_PIXELS,
                        help=f"the pixel budget's lower bound (default {DEFAULT_MIN_PIXELS}, the recipes')")  # fmt: skip
    parser.add_argument("--max_pixels", type=int, default=DEFAULT_MAX_PIXELS,
                        help=f"the pixel budget's upper bound (default {DEFAULT_MAX_PIXELS}, the recipes')")  # fmt: skip
    parser.add_argument("--from_model", action="store_true", help="--box is in the model's frame: print it in pixels")
    args = parser.parse_args(argv)
    try:
        print(json.dumps(describe(args.family, args.width, args.height, args.box, args.min_pixels, args.max_pixels,
                                  from_model=args.from_model)))  # fmt: skip
    except (SuzakError, ValueError) as error:
        raise SystemExit(f"error: {error}") from None


def describe(family: str, width: int, height: int, box: Sequence[float], min_pixels: int = DEFAULT_MIN_PIXELS,
             max_pixels: int = DEFAULT_MAX_PIXELS, *, from_model: bool = False) -> dict[str, Any]:  # fmt: skip
    """What ``suzak boxes`` prints: the frame, the resized size and the box on the other side."""
    budget = PixelBudget(min_pixels, max_pixels, factor=family_factors()[family])
    frame = BoxFrame.of(family, width, height, budget)
    line: dict[str, Any] = {"family": family, "size": [width, height],
                            "resized": [frame.resized_width, frame.resized_height], "frame": frame.spec.description}  # fmt: skip
    if from_model:
        if not frame.in_frame(box):
            top_x, top_y = frame.extent
            raise SuzakError(f"box {_shown(box)} is not a box of this frame (0 <= x1 < x2 <= {top_x}, "
                             f"0 <= y1 < y2 <= {top_y})")  # fmt: skip
        return line | {"model_box": [_number(v) for v in box], "box": [round(v, 2) for v in frame.from_model(box)]}
    if problem := box_problem(list(box), width, height):
        raise SuzakError(f"box {_shown(box)}: {problem}")
    return line | {"box": [_number(v) for v in box], "model_box": list(frame.to_model(box)),
                   "answer": frame.render([box])}  # fmt: skip


def _shown(box: Sequence[float]) -> str:
    return "[" + ", ".join(f"{v:g}" for v in box) + "]"


def _number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


if __name__ == "__main__":
    main()
