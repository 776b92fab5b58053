"""The perception verifiers (suzak.scoring.rewards): a GUI click in each family's frame, COCO mAP of several boxes,
DocVQA's ANLS, V-Triune's dynamic IoU; each passes the reward pre-flight on a row of its kind."""

from __future__ import annotations

import pytest
from PIL import Image

from suzak import SuzakError
from suzak.media.boxes import BoxFrame, with_box_frame
from suzak.media.vision import PixelBudget, family_factors
from suzak.scoring.parsing import parse_point, point_parser
from suzak.scoring.rewards import click_accuracy, resolve_reward
from suzak.training.checks import preflight

FAMILIES = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5"]
PROMPT = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Click the OK button."}]}]


def _budget(family: str) -> PixelBudget:
    return PixelBudget(3136, 401408, factor=family_factors()[family])


def _row(family: str, solution: str, size=(1920, 1080), **columns) -> dict:
    """A training row as the trainer hands it to the rewards: its image's box frame added (with_box_frame)."""
    row = {"prompt": PROMPT, "image": Image.new("RGB", size), "solution": solution, **columns}
    return with_box_frame(row, family, _budget(family))


# --- click_accuracy ----------------------------------------------------------------------------------------------

BUTTON = [1500, 900, 1700, 960]  # original pixels of a 1920x1080 screenshot


@pytest.mark.parametrize("family", FAMILIES)
def test_a_click_scores_in_its_models_frame(family):
    """The button's centre in the model's frame scores 1.0 and lands on the button in original pixels; a point one
    unit past the box's rounded edge scores 0.0; the same click written in original pixels (the wrong frame for every
    family here) misses."""
    row = _row(family, str(BUTTON))
    frame = BoxFrame.from_dict(row["box_frame"])
    x, y = frame.click_point(BUTTON)
    px, py = frame.point_from_model((x, y))
    assert BUTTON[0] <= px <= BUTTON[2] and BUTTON[1] <= py <= BUTTON[3]
    x2 = frame.to_model(BUTTON)[2]
    completions = [f'{{"point_2d": [{x}, {y}]}}', f"({x2}, {y})", f"({x2 + 1}, {y})", "(1600, 930)"]
    assert click_accuracy(completions, [str(BUTTON)] * 4, [row["box_frame"]] * 4) == [1.0, 1.0, 0.0, 0.0]


@pytest.mark.parametrize(
    ("text", "point"),
    [
        ('{"point_2d": [120, 45]}', (120.0, 45.0)),
        ('```json\n[{"point_2d": [120, 45], "label": "OK"}]\n```', (120.0, 45.0)),
        ("(120, 45)", (120.0, 45.0)),
        ("[120.5, 45]", (120.5, 45.0)),
        ("click at (120,45) then (5, 5)", (120.0, 45.0)),  # the first point
        ("<|box_start|>(1,2),(3,4)<|box_end|>", None),  # a box, not a point
        ("(1,2),(3,4)", None),  # Qwen2-VL's box with its special tokens decoded away
        ("[1, 2, 3, 4]", None),
        ("[1, 2, 3]", None),
        ("no point", None),
    ],
)  # fmt: skip
def test_point_answer_forms(text, point):
    assert parse_point(text) == point
    assert point_parser("think_answer")(f"<think> (9, 9) </think> <answer> {text} </answer>") == point
    assert point_parser("think_answer")(text) is None  # no tag: no point


def test_click_misses_are_counted_not_raised():
    frame = BoxFrame("qwen3_vl", 200, 100, 192, 96).as_dict()
    logged = {}
    scores = click_accuracy(["(250, 250)", "none", "(1001, 5)", "(-1, 5)"], ["[0, 0, 100, 100]"] * 4, [frame] * 4,
                            log_metric=lambda name, value: logged.__setitem__(name, value))  # fmt: skip
    assert scores == [1.0, 0.0, 0.0, 0.0]
    assert logged == {"click_accuracy/unparsed_frac": 0.25, "click_accuracy/invalid_frac": pytest.approx(2 / 3)}
    with pytest.raises(ValueError, match="reads each row's box frame"):
        click_accuracy(["(1, 1)"], ["[0, 0, 1, 1]"])
    with pytest.raises(ValueError, match="click_accuracy: cannot parse the gold solution in batch row 0"):
        click_accuracy(["(1, 1)"], ["(1, 1)"], [frame])


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("answer_format", ["box", "think_answer"])
def test_preflight_passes_click_rows(family, answer_format):
    """A click row (answer_kind point) gets the box's centre as its ideal answer, which click_accuracy scores 1.0 in
    every frame; without answer_kind the ideal is the box, which is no click: the pre-flight stops."""
    sizes = [(1920, 1080), (640, 480), (1080, 2340), (57, 913)]
    rows = [_row(family, str([w // 4, h // 3, w // 2, h // 2]), (w, h), answer_kind="point") for w, h in sizes]
    reward = resolve_reward("click_accuracy", {"answer_format": answer_format})
    preflight(rows, [reward], answer_format)
    boxes = [{key: value for key, value in row.items() if key != "answer_kind"} for row in rows]
    with pytest.raises(SuzakError, match="reward 'click_accuracy' returned 0.0"):
        preflight(boxes, [reward], answer_format)


def test_a_click_row_without_a_box_is_one_line():
    with pytest.raises(SuzakError, match="a click row .answer_kind 'point'. has no box frame"):
        preflight([{"prompt": PROMPT, "solution": "[0, 0, 5, 5]", "answer_kind": "point"}], [click_accuracy], "box")
    with pytest.raises(SuzakError, match="answer_kind 'points' is none of box, point"):
        preflight([_row("qwen3_vl", "[0, 0, 5, 5]", answer_kind="points")], [click_accuracy], "box")
