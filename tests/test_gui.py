"""The procedural GUI-click data (`gui_click`): rows by (seed, index) alone, real screens' sizes, the named button the
only one of its kind with its box tight around its pixels, no two buttons touching, the shuffled control, and the
builder's options through the registry, `python -m suzak.data` and a run's held-out rows."""

from __future__ import annotations

import json

import numpy as np
import pytest

from suzak import SuzakError
from suzak.data import build_dataset
from suzak.data.gui import ASPECTS, COLORS, GAP, SHAPES, gui_click
from suzak.eval.tasks import get_task
from suzak.scoring.parsing import gold_boxes
from suzak.scoring.prompts import render_prompt


@pytest.fixture(scope="module")
def screens():
    return gui_click(10, seed=7)


def _pixels(row) -> np.ndarray:
    return np.asarray(row["image"].convert("RGB"))  # (H, W, 3)


def test_a_row_depends_on_seed_and_index_alone(screens):
    later = gui_click(3, seed=7, start=6)
    assert later["index"] == [6, 7, 8]
    for row, same in zip(later, screens.select(range(6, 9)), strict=True):
        assert (row["problem"], row["solution"], row["buttons"]) == (same["problem"], same["solution"], same["buttons"])
        assert np.array_equal(_pixels(row), _pixels(same))
    assert gui_click(3, seed=8, start=6)["solution"] != later["solution"]


def test_screens_have_real_screens_sizes_within_the_bounds(screens):
    for row in screens:
        width, height = row["image"].size
        assert (width, height) == (row["width"], row["height"])
        assert 1280 <= width <= 2560 and 800 <= height <= 1440
        assert min(abs(width / height - aspect) for aspect in ASPECTS) < 0.01
    assert len({row["image"].size for row in screens}) > 5  # sizes vary
    small = gui_click(4, seed=1, min_width=1500, max_width=1600, min_height=900, max_height=1000)
    assert all(1500 <= w <= 1600 and 900 <= h <= 1000 for w, h in zip(small["width"], small["height"], strict=True))


def test_the_question_names_one_button_whose_box_is_tight_around_its_pixels(screens):
    for row in screens:
        buttons = json.loads(row["buttons"])
        kinds = [(b["colour"], b["shape"]) for b in buttons]
        assert 3 <= len(buttons) <= 8 and len(set(kinds)) == len(kinds)  # each (colour, shape) once a screen
        target = buttons[0]
        assert row["problem"] == f"the {target['colour']} {target['shape']} button"
        assert gold_boxes(row["solution"]) == [tuple(float(v) for v in target["box"])]
        pixels = _pixels(row)
        for colour in {b["colour"] for b in buttons}:
            mask = np.all(pixels == COLORS[colour], axis=-1)  # (H, W)
            for button in (b for b in buttons if b["colour"] == colour):
                x1, y1, x2, y2 = button["box"]
                assert 40 <= x2 - x1 <= 160 and 40 <= y2 - y1 <= 160
                assert mask[y1:y2, x1:x2].mean() > 0.5, button  # the button's colour fills it
                mask[y1:y2, x1:x2] = False
                wx, wy = max(0, x1 - 1), max(0, y1 - 1)  # the box and a pixel around it
                ys, xs = np.nonzero(np.all(pixels[wy : y2 + 1, wx : x2 + 1] == COLORS[colour], axis=-1))
                assert (wx + xs.min(), wy + ys.min(), wx + xs.max() + 1, wy + ys.max() + 1) == (x1, y1, x2, y2), button
            assert not mask.any(), colour  # the colour nowhere but on its buttons: the chrome is grey


def test_no_two_buttons_overlap_or_touch(screens):
    crowded = gui_click(20, seed=0, min_width=480, max_width=640, min_height=320, max_height=420, buttons=(12, 18))
    assert sum(len(json.loads(b)) for b in crowded["buttons"]) > 100  # small screens, many buttons: near each other
    for row in [*screens, *crowded]:
        boxes = [b["box"] for b in json.loads(row["buttons"])]
        for i, a in enumerate(boxes):
            assert 0 <= a[0] < a[2] <= row["width"] and 0 <= a[1] < a[3] <= row["height"]
            for b in boxes[i + 1 :]:
                assert a[2] + GAP <= b[0] or b[2] + GAP <= a[0] or a[3] + GAP <= b[1] or b[3] + GAP <= a[1], (a, b)


def test_every_shape_and_colour_is_drawn_and_asked_for(screens):
    drawn = {(b["colour"], b["shape"]) for row in screens for b in json.loads(row["buttons"])}
    assert {c for c, _ in drawn} == set(COLORS) and {s for _, s in drawn} == set(SHAPES)
    assert len(set(screens["problem"])) > 5


def test_shuffled_permutes_the_screens_and_keeps_questions_and_boxes(screens):
    shuffled = gui_click(10, seed=7, images="shuffled")
    for column in ("problem", "solution", "index", "prompt"):
        assert shuffled[column] == screens[column]
    pictures = [_pixels(row).tobytes() for row in screens]
    moved = [_pixels(row).tobytes() for row in shuffled]
    assert sorted(moved) == sorted(pictures) and moved != pictures
    for row in shuffled:  # a screen keeps its own size and buttons
        assert row["image"].size == (row["width"], row["height"])
        assert pictures.index(_pixels(row).tobytes()) == screens["buttons"].index(row["buttons"])


def test_prompt_is_the_click_template_and_columns_match_grounding_shapes(screens):
    from suzak.data.grounding import grounding_shapes

    row = screens[0]
    assert row["prompt"][0]["content"][0] == {"type": "image", "text": None}
    assert row["prompt"][0]["content"][1]["text"] == render_prompt("click", row["problem"])
    assert gui_click(1, template="rec")[0]["prompt"][0]["content"][1]["text"].startswith("Locate the ")
    shapes = grounding_shapes(1, grid=2).features
    assert {k: v for k, v in screens.features.items() if k in shapes} == shapes  # a mixture gives a column one type


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"images": "blank"}, "images must be aligned or shuffled, got 'blank'"),
        ({"buttons": [0, 3]}, "buttons must be (min, max) with 1 <= min <= max <= 18"),
        ({"buttons": [3, 19]}, "buttons must be (min, max) with 1 <= min <= max <= 18"),
        ({"buttons": 3}, "buttons must be (min, max), got 3"),
        ({"min_width": 2600}, "need 480 <= min_width <= max_width"),
        ({"min_width": 1500, "max_width": 1500, "min_height": 1400}, "no real screen's aspect ratio"),
        ({"template": "clik"}, "unknown prompt template 'clik'"),
    ],
)
def test_a_bad_option_is_one_line_naming_it(options, said):
    with pytest.raises((SuzakError, ValueError)) as info:  # ValueError: an unknown template, as every builder says it
        build_dataset("gui_click", **{"num_rows": 1, **options})
    assert said in str(info.value) and "\n" not in str(info.value)


def test_python_m_suzak_data_writes_gui_click(tmp_path):
    from suzak.data.builders import main

    main(["gui_click", "--output", str(tmp_path / "gui"), "--num_rows", "2", "--seed", "4", "--start", "5"])
    back, built = build_dataset(str(tmp_path / "gui")), gui_click(2, seed=4, start=5)
    assert back["index"] == [5, 6] and back["solution"] == built["solution"] and back["prompt"] == built["prompt"]
    assert np.array_equal(_pixels(back[1]), _pixels(built[1]))


def test_a_runs_held_out_rows_are_the_next_indices():
    from suzak.training.build import _held_out

    train, held = _held_out("gui_click", {"num_rows": 2, "seed": 3}, gui_click(2, seed=3), 2)
    assert train["index"] == [0, 1] and [row["index"] for row in held] == [2, 3]
    assert [row["solution"] for row in held] == gui_click(2, seed=3, start=2)["solution"]


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5"])
def test_click_rows_pass_the_checks_and_click_accuracy_gives_the_ideal_click_full_marks(family):
    """With the `click` prompt a row asks for a point (``answer_kind: point``): the rows pass the checks before step 1
    at a recipe's budget, the pre-flight's ideal answer is the gold box's centre as ``{"point_2d": [x, y]}`` in the
    family's frame, and click_accuracy gives it 1.0 (and a box reward would not: the answer is a point)."""
    from suzak.media.boxes import model_answer, with_box_frame
    from suzak.media.vision import PixelBudget, family_factors
    from suzak.scoring.rewards import click_accuracy, resolve_reward
    from suzak.training.checks import preflight, validate_rows

    budget = PixelBudget(3136, 401408, factor=family_factors()[family])
    dataset = gui_click(4, seed=2)
    assert validate_rows(dataset, budget, family=family) == [] and set(dataset["answer_kind"]) == {"point"}
    rows = [with_box_frame(row, family, budget) for row in dataset]
    assert all('"point_2d"' in model_answer(row) for row in rows)
    preflight(rows, [resolve_reward("click_accuracy")], "box")
    wrong = [model_answer(rows[(i + 1) % 4]) for i in range(4)]  # another screen's button: somewhere else
    assert click_accuracy(wrong, [r["solution"] for r in rows], [r["box_frame"] for r in rows]) != [1.0] * 4


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_with_the_rec_prompt_the_rows_train_as_boxes(family):
    """With the `rec` prompt the rows are grounding rows: they pass the checks before step 1 at a recipe's budget
    (every gold box still a box in the family's frame) and the box rewards give the ideal answer 1.0."""
    from suzak.media.boxes import with_box_frame
    from suzak.media.vision import PixelBudget, family_factors
    from suzak.scoring.rewards import resolve_reward
    from suzak.training.checks import preflight, validate_rows

    budget = PixelBudget(3136, 401408, factor=family_factors()[family])
    dataset = gui_click(4, seed=2, template="rec")
    assert validate_rows(dataset, budget, family=family) == []
    rows = [with_box_frame(row, family, budget) for row in dataset]
    assert all(row["box_frame"]["resized_width"] < row["width"] for row in rows)  # larger than the budget
    preflight(rows, [resolve_reward(name, {"answer_format": "box"}) for name in ("iou", "rec_accuracy")], "box")


def test_the_click_scorer_reads_the_point_in_the_items_frame_as_click_accuracy_does():
    """`suzak eval gui_click`'s strict rule: the answer's point in the item's frame, inside the gold box there; the
    extracted answer is the point on the original screen."""
    from suzak.eval.tasks import box_gold, score_rules
    from suzak.media.boxes import BoxFrame
    from suzak.media.vision import PixelBudget

    frame = BoxFrame.of("qwen2_5_vl", 2000, 1000, PixelBudget(3136, 401408, factor=28))
    gold = box_gold([[1000, 500, 1100, 600]], "box", frame.as_dict())
    x, y = frame.click_point([1000, 500, 1100, 600])
    ((point, right),) = [v for v in score_rules(get_task("gui_click"), f'{{"point_2d": [{x}, {y}]}}', gold).values()]
    assert right and 1000 <= point[0] <= 1100 and 500 <= point[1] <= 600
    assert score_rules(get_task("gui_click"), '{"point_2d": [2, 2]}', gold)["strict"] == (
        [4.46, 4.46],
        False,
    )  # 2 x 2000/896
    assert score_rules(get_task("gui_click"), "no point", gold)["strict"] == (None, False)


def test_suzak_eval_gui_click_answers_held_out_screens_and_draws_the_clicks(tmp_path, tiny_model_dir):
    from suzak.eval import cli

    out = tmp_path / "clicks.json"
    cli.main(["gui_click", "--model_path", str(tiny_model_dir), "--num_rows", "3", "--max_new_tokens", "8",
              "--output_path", str(out), "--no_progress"])  # fmt: skip
    results = json.loads(out.read_text())
    assert results["scoring"] == "strict" and len(results["results"]) == 3
    assert results["results"][0]["ground_truth"]["frame"]["family"] == "qwen2_5_vl"
    assert "boxes_plot=clicks.png" in (tmp_path / "clicks.md").read_text() and (tmp_path / "clicks.png").is_file()
