"""The perception verifiers (suzak.scoring.rewards): a GUI click in each family's frame, COCO mAP of several boxes,
DocVQA's ANLS, V-Triune's dynamic IoU; each passes the reward pre-flight on a row of its kind."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import pytest
from PIL import Image

from suzak import SuzakError
from suzak.media.boxes import BoxFrame, box_iou, render_boxes, with_box_frame
from suzak.media.vision import PixelBudget, family_factors
from suzak.scoring.parsing import gold_texts, parse_point, point_parser
from suzak.scoring.rewards import anls, box_f1, box_map, click_accuracy, dynamic_iou, ocr_exact, resolve_reward
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


# --- box_map -----------------------------------------------------------------------------------------------------

CUPS = [[100, 100, 400, 300], [900, 500, 1300, 1000], [1500, 80, 1800, 400]]  # original pixels of a 1920x1080 photo


def _direct_map(predicted: list, gold: list) -> float:
    """COCO mAP@[.5:.95] straight from pycocotools, the predictions scored 1.0, 0.99, ... in the order given."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    def xywh(box):
        return [box[0], box[1], box[2] - box[0], box[3] - box[1]]

    ground = COCO()
    ground.dataset = {"images": [{"id": 7}], "categories": [{"id": 3}],
                      "annotations": [{"id": i + 1, "image_id": 7, "category_id": 3, "bbox": xywh(box),
                                       "area": (box[2] - box[0]) * (box[3] - box[1]), "iscrowd": 0}
                                      for i, box in enumerate(gold)]}  # fmt: skip
    ground.createIndex()
    found = ground.loadRes([{"image_id": 7, "category_id": 3, "bbox": xywh(box), "score": 1.0 - i / 100}
                            for i, box in enumerate(predicted)])  # fmt: skip
    evaluation = COCOeval(ground, found, "bbox")
    evaluation.evaluate()
    evaluation.accumulate()
    evaluation.summarize()
    return float(evaluation.stats[0])


def _shifted(box, dx):
    return [box[0] + dx, box[1], box[2] + dx, box[3]]


@pytest.mark.parametrize("family", FAMILIES)
def test_box_map_is_pycocotools_map_in_the_models_frame(family):
    """box_map equals pycocotools run directly on the model-frame boxes (the gold mapped with to_model), in the
    written order; perfect boxes score 1.0 and boxes shifted further score less."""
    frame = BoxFrame.from_dict(_row(family, str(CUPS))["box_frame"])
    gold = [list(frame.to_model(box)) for box in CUPS]
    unit = max(gold[0][2] - gold[0][0], 1)  # the first cup's width in model units
    answers = {
        "perfect": gold,
        "reversed": gold[::-1],
        "one shifted a tenth": [_shifted(gold[0], unit // 10)] + gold[1:],
        "all shifted a tenth": [_shifted(box, unit // 10) for box in gold],
        "all shifted a third": [_shifted(box, unit // 3) for box in gold],
        "a miss first": [[0, 0, 5, 5]] + gold[:2],
        "two of three": gold[:2],
    }
    completions = [render_boxes(boxes, frame.spec.form) for boxes in answers.values()]
    scores = dict(zip(answers, box_map(completions, [str(CUPS)] * len(completions), [frame.as_dict()] * len(completions)),
                      strict=True))  # fmt: skip
    for name, boxes in answers.items():
        assert scores[name] == pytest.approx(_direct_map(boxes, gold), abs=1e-9), name
    assert scores["perfect"] == scores["reversed"] == 1.0
    assert 1.0 > scores["one shifted a tenth"] > scores["all shifted a tenth"] > scores["all shifted a third"]
    assert 0 < scores["a miss first"] < scores["two of three"] < 1.0


def test_box_map_edge_cases_and_counts():
    frame = BoxFrame("qwen3_vl", 100, 100, 96, 96).as_dict()
    gold = "[[0, 0, 10, 10], [50, 50, 60, 60]]"  # [0, 0, 100, 100] and [500, 500, 600, 600] in the frame
    completions = ["no box", "[0, 0, 100, 100] [0, 0, 2000, 2000]", "[0, 0, 2000, 2000] [0, 0, 100, 100]",
                   "[0, 0, 100, 100]"]  # fmt: skip
    logged = {}
    scores = box_map(
        completions, [gold] * 4, [frame] * 4, log_metric=lambda name, value: logged.__setitem__(name, value)
    )
    assert scores[0] == 0.0
    assert scores[1] == scores[3] == pytest.approx(51 / 101, abs=1e-9)  # a miss after every hit is free
    assert box_f1(completions[1:2], [gold], [frame]) == [0.5]  # which box_f1 charges for
    # the box outside the frame is a wrong prediction at its rank
    outside_first = _direct_map([[0, 0, 0, 0], [0, 0, 100, 100]], [[0, 0, 100, 100], [500, 500, 600, 600]])
    assert scores[2] == pytest.approx(outside_first, abs=1e-9) and scores[2] < scores[1]
    assert logged == {"box_map/unparsed_frac": 0.25, "box_map/invalid_frac": 0.4}  # 2 of the 5 boxes


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("answer_format", ["box", "think_answer"])
def test_preflight_passes_detection_rows(family, answer_format):
    rows = [_row(family, str(CUPS)), _row(family, str(CUPS[:1]), (640, 480))]
    preflight(rows, [resolve_reward("box_map", {"answer_format": answer_format})], answer_format)


# --- OCR: anls, ocr_exact ----------------------------------------------------------------------------------------

DOCVQA_GOLD = '["$ 2,500", "2,500"]'  # a DocVQA-style row: the accepted answers of "What is the total cost?"


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("2,500", 1.0),  # exact, the second accepted answer
        ("$ 2,500", 1.0),
        ("  $  2,500\n", 1.0),  # whitespace runs and outer whitespace do not count
        ("2.500", 1 - 1 / 5),  # one substitution in 5 characters: NL 0.2
        ("$2,500", 1 - 1 / 7),  # the best of the golds: one space short of "$ 2,500" (NL 1/7; 1/6 to "2,500")
        ("25", 0.0),  # NL 0.6 to "2,500" and 5/7 to "$ 2,500": past tau
        ("2,5", 1 - 2 / 5),  # NL 0.4 is kept
        ("the total cost is 2,500 dollars", 0.0),  # the plain format reads the whole completion
        ("Roche", 0.0),
    ],
)  # fmt: skip
def test_anls_on_docvqa_style_answers(answer, expected):
    assert anls([answer], [DOCVQA_GOLD]) == [pytest.approx(expected)]
    assert ocr_exact([answer], [DOCVQA_GOLD]) == [float(expected == 1.0)]


def test_anls_case_threshold_and_formats():
    assert anls(["UNIVERSITY OF IOWA"], ["university of iowa"]) == [1.0]  # case never counts
    assert anls(["ab"], ["ax"]) == [0.5]  # NL exactly 0.5 keeps its 0.5, as DocVQA's evaluation script scores it
    assert anls(["abcd"], ["abxy"], threshold=0.4) == [0.0]  # a stricter tau drops NL 0.5
    assert anls(["abcde"], ["abxde"], threshold=0.2) == [pytest.approx(0.8)]
    tagged = ["<think> it says 2,500 </think> <answer> 2,500 </answer>", "2,500"]
    assert anls(tagged, [DOCVQA_GOLD] * 2, answer_format="think_answer") == [1.0, 0.0]
    assert ocr_exact(tagged, [DOCVQA_GOLD] * 2, answer_format="think_answer") == [1.0, 0.0]
    logged = {}
    anls(["", "2,500", "Roche"], [DOCVQA_GOLD] * 3, log_metric=lambda name, value: logged.__setitem__(name, value))
    assert logged == {"anls/unparsed_frac": pytest.approx(1 / 3)}
    with pytest.raises(ValueError, match="anls threshold must be in"):
        anls(["a"], ["a"], threshold=0)
    with pytest.raises(ValueError, match="ocr_exact: cannot parse the gold solution in batch row 1"):
        ocr_exact(["a", "b"], ["a", "[]"])


def test_gold_texts_reads_one_answer_or_a_list():
    assert gold_texts(DOCVQA_GOLD) == ["$ 2,500", "2,500"]
    assert gold_texts("Roche") == ["Roche"] and gold_texts("[3]") == ["[3]"] and gold_texts('["a", 1]') == ['["a", 1]']


@pytest.mark.parametrize("answer_format", ["plain", "think_answer"])
def test_preflight_passes_ocr_rows(answer_format):
    """The ideal answer of a row with several accepted answers is the first (model_answer), which both rewards score
    1.0."""
    prompt = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is the total cost?"}]}]
    rows = [{"prompt": prompt, "solution": solution} for solution in (DOCVQA_GOLD, "Roche", "<answer> R&D </answer>")]
    rewards = [resolve_reward(name, {"answer_format": answer_format}) for name in ("anls", "ocr_exact")]
    preflight(rows, rewards, answer_format)


# --- dynamic_iou -------------------------------------------------------------------------------------------------

DOG = [400, 200, 1200, 900]  # original pixels of a 1920x1080 photo


def _state(step: int, max_steps: int = 200) -> SimpleNamespace:
    return SimpleNamespace(global_step=step, max_steps=max_steps)  # what TRL hands every reward as trainer_state


def _narrowed(box, iou: float) -> list[int]:
    """``box`` (model frame) with its right edge pulled in so its IoU with ``box`` is about ``iou``."""
    x1, y1, x2, y2 = box
    return [x1, y1, x1 + round((x2 - x1) * iou), y2]


@pytest.mark.parametrize("family", FAMILIES)
def test_dynamic_iou_follows_v_triunes_schedule(family):
    """0.85 up to 10 % of max_steps, 0.95 up to 25 %, 0.99 after (V-Triune's): a box at IoU ~0.9 pays only early, one
    at ~0.97 until a quarter of the run, the gold box always; outside training the strictest threshold applies."""
    frame = BoxFrame.from_dict(_row(family, str(DOG))["box_frame"])
    gold = frame.to_model(DOG)
    loose, close = _narrowed(gold, 0.9), _narrowed(gold, 0.97)
    assert 0.85 <= box_iou(loose, gold) < 0.95 <= box_iou(close, gold) < 0.99  # the boxes are what their names say
    completions = [render_boxes([box], frame.spec.form) for box in (loose, close, gold)]
    steps = {0: [1.0, 1.0, 1.0], 20: [1.0, 1.0, 1.0], 21: [0.0, 1.0, 1.0], 50: [0.0, 1.0, 1.0], 51: [0.0, 0.0, 1.0],
             200: [0.0, 0.0, 1.0]}  # fmt: skip
    thresholds = []
    for step, expected in steps.items():
        scores = dynamic_iou(completions, [str(DOG)] * 3, [frame.as_dict()] * 3, trainer_state=_state(step),
                             log_metric=lambda name, value: thresholds.append((name, value)))  # fmt: skip
        assert scores == expected, step
    logged = [value for name, value in thresholds if name == "dynamic_iou/threshold"]
    assert logged == [0.85, 0.85, 0.95, 0.95, 0.99, 0.99]
    rows = ([str(DOG)] * 3, [frame.as_dict()] * 3)
    assert dynamic_iou(completions, *rows) == [0.0, 0.0, 1.0]  # no trainer_state: the evaluation, the pre-flight
    assert dynamic_iou(completions, *rows, trainer_state=_state(0, max_steps=0)) == [0.0, 0.0, 1.0]


def test_dynamic_iou_schedule_from_the_recipe():
    frame = BoxFrame("qwen3_vl", 100, 100, 96, 96).as_dict()
    reward = resolve_reward("dynamic_iou", {"schedule": [[0.5, 0.5], [1.0, 0.75]]})
    half = "[0, 0, 600, 1000]"  # IoU 0.6 with the gold box
    scores = [reward([half], ["[0, 0, 100, 100]"], [frame], trainer_state=_state(step, 10)) for step in (5, 6)]
    assert scores == [[1.0], [0.0]]
    assert pickle.loads(pickle.dumps(reward)).__name__ == "dynamic_iou"  # TRL's async worker pickles rewards


@pytest.mark.parametrize(
    "schedule",
    [
        [[0.5, 0.9]],  # ends before the end of training
        [[0.1, 0.95], [1.0, 0.9]],  # falls
        [[0.3, 0.8], [0.2, 0.9], [1.0, 0.95]],  # fractions out of order
        [[0.0, 0.8], [1.0, 0.95]],  # a fraction of 0 holds for no step
        [[0.1, 1.5], [1.0, 1.5]],
        [[0.1, True], [1.0, 1.0]],
        [0.1, 0.85],
        [],
        "0.9",
    ],
)  # fmt: skip
def test_a_bad_schedule_is_one_line_when_the_recipe_is_read(schedule):
    with pytest.raises(SuzakError, match=r"reward 'dynamic_iou': schedule must be .*; got ") as info:
        resolve_reward("dynamic_iou", {"schedule": schedule})
    assert "\n" not in str(info.value)
    with pytest.raises(SuzakError, match="'trainer_state' is passed by the trainer"):
        resolve_reward("dynamic_iou", {"trainer_state": _state(1)})


@pytest.mark.parametrize("family", FAMILIES)
def test_preflight_passes_dynamic_iou(family):
    """The pre-flight has no trainer_state: the gold box must pass the strictest threshold, and does."""
    rows = [_row(family, str(DOG)), _row(family, "[3, 5, 40, 300]", (57, 913))]
    preflight(rows, [resolve_reward("dynamic_iou", {"schedule": [[0.2, 0.5], [1.0, 0.99]]})], "box")
    preflight(rows, [dynamic_iou], "box")
