"""Boxes in each family's frame (suzak.media.boxes): exact round trips at many budgets and aspect ratios, the frame equal to
what the processor feeds the model, the answer forms parsed, the box rewards, ``suzak boxes``, and bad
boxes named before step 1."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw

from suzak.media.boxes import FRAMES, BoxFrame, box_iou, match_f1, model_answer, render_boxes, to_pixels, with_box_frame
from suzak.media.vision import PixelBudget, family_factors
from suzak.scoring.parsing import box_parser, parse_boxes
from suzak.scoring.rewards import REWARDS, box_f1, box_format, iou, rec_accuracy

ROOT = Path(__file__).resolve().parents[1]
BUDGETS = [(3136, 12845056), (3136, 401408), (3136, 50176), (200704, 1003520), (65536, 262144)]
SIZES = [(640, 480), (1920, 1080), (1080, 1920), (4000, 300), (300, 4000), (57, 913), (8000, 6000), (33, 29)]


def _frames():
    for family in FRAMES:
        factor = family_factors()[family]
        for low, high in BUDGETS:
            budget = PixelBudget(low, max(high, factor * factor), factor=factor)
            for width, height in SIZES:
                yield BoxFrame.of(family, width, height, budget)


@pytest.mark.parametrize("family", list(FRAMES))
def test_model_boxes_round_trip_exactly_and_pixel_boxes_within_half_a_unit(family):
    """Every integer box of a model's frame maps to original pixels and back to the same integers, at 5 budgets and 8
    sizes (a 4000x300 strip, an 8000x6000 photo downscaled ~120x); an original-pixel box comes back within half a
    model unit (the frame's rounding)."""
    rng = np.random.default_rng(0)
    frames = [f for f in _frames() if f.family == family]
    assert len(frames) == len(BUDGETS) * len(SIZES)
    for frame in frames:
        top_x, top_y = frame.extent
        for _ in range(200):
            x1, x2 = sorted(rng.choice(top_x + 1, size=2, replace=False).tolist())
            y1, y2 = sorted(rng.choice(top_y + 1, size=2, replace=False).tolist())
            assert frame.to_model(frame.from_model((x1, y1, x2, y2))) == (x1, y1, x2, y2), frame
            box = (float(rng.uniform(0, frame.width / 2)), float(rng.uniform(0, frame.height / 2)),
                   float(rng.uniform(frame.width / 2, frame.width)), float(rng.uniform(frame.height / 2, frame.height)))  # fmt: skip
            model = frame.to_model(box)
            back = frame.from_model(model)
            unit_x, unit_y = frame.from_model((1, 1, 1, 1))[:2]  # original pixels per model unit
            tops = (top_x, top_y, top_x, top_y)  # Qwen2-VL's [0, 1000) clamps the last half unit onto 999
            assert all(abs(a - b) <= (1.0 if m == t and frame.spec.top == 999 else 0.5) * unit + 1e-9
                       for a, b, m, t, unit in zip(box, back, model, tops, (unit_x, unit_y, unit_x, unit_y), strict=True)), (
                frame, box, back)  # fmt: skip


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5"])
def test_the_frame_is_the_image_the_processor_feeds_the_model(family_model_dir, family):
    """A red box drawn at known pixels of images of several sizes (large downscales among them): in the image the
    family's processor hands the model (its grid times the patch), the drawn box lands where ``to_model`` says,
    within a pixel of resampling (Qwen2.5-VL) or a unit of 1000 (the relative frames)."""
    from transformers import AutoProcessor

    from suzak.media.vision import configure_processor

    processor = AutoProcessor.from_pretrained(family_model_dir(family))
    factor = family_factors()[family]
    patch = processor.image_processor.patch_size
    for (width, height), (low, high) in zip([(640, 480), (1920, 1080), (300, 1700), (2048, 2048)],
                                            [(3136, 50176), (3136, 401408), (3136, 200704), (3136, 50176)], strict=True):  # fmt: skip
        budget = PixelBudget(low, high, factor=factor)
        configure_processor(processor, budget)
        box = (round(width * 0.21), round(height * 0.33), round(width * 0.62), round(height * 0.81))
        image = Image.new("RGB", (width, height), (128, 128, 128))
        ImageDraw.Draw(image).rectangle([box[0], box[1], box[2] - 1, box[3] - 1], fill=(255, 0, 0))
        grid = processor.image_processor(images=[image], return_tensors="pt")["image_grid_thw"][0].tolist()
        frame = BoxFrame.of(family, width, height, budget)
        assert (frame.resized_height, frame.resized_width) == (grid[1] * patch, grid[2] * patch)  # what the model sees
        resized = np.asarray(budget.fit(image))  # the pixels training feeds the processor, which keeps their size
        red = np.argwhere((resized[..., 0] > 190) & (resized[..., 1] < 70))
        drawn = (red[:, 1].min(), red[:, 0].min(), red[:, 1].max() + 1, red[:, 0].max() + 1)  # (x1, y1, x2, y2)
        model = frame.to_model(box)
        if frame.spec.relative:
            seen = [drawn[0] / frame.resized_width * 1000, drawn[1] / frame.resized_height * 1000,
                    drawn[2] / frame.resized_width * 1000, drawn[3] / frame.resized_height * 1000]  # fmt: skip
            tolerance = [1000 / frame.resized_width + 1, 1000 / frame.resized_height + 1] * 2
        else:
            seen, tolerance = list(drawn), [1.5] * 4
        assert all(abs(a - b) <= t for a, b, t in zip(model, seen, tolerance, strict=True)), (family, model, seen)


def test_each_familys_native_form_parses_back():
    frame = BoxFrame("qwen2_vl", 640, 480, 644, 476)
    assert frame.render([(64, 48, 320, 240)]) == "<|box_start|>(100,100),(500,500)<|box_end|>"
    assert BoxFrame("qwen2_5_vl", 640, 480, 644, 476).render([(64, 48, 320, 240)], "cup") == (
        '{"bbox_2d": [64, 48, 322, 238], "label": "cup"}')  # fmt: skip
    for text in ('{"bbox_2d": [1, 2, 3, 4]}', '[{"bbox_2d": [1, 2, 3, 4], "label": "x"}]', "[1,2,3,4]",
                 "<|object_ref_start|>x<|object_ref_end|><|box_start|>(1,2),(3,4)<|box_end|>", "box: [1.0, 2, 3, 4.0]"):  # fmt: skip
        assert parse_boxes(text) == [(1.0, 2.0, 3.0, 4.0)], text
    assert box_parser("think_answer")("<think>[9, 9, 9, 9]</think> <answer> [1, 2, 3, 4] </answer>") == [(1, 2, 3, 4)]
    assert box_parser("think_answer")("[1, 2, 3, 4]") == []
    with pytest.raises(ValueError, match="box or think_answer"):
        box_parser("gsm8k_hash")
    assert render_boxes([(1, 2, 3, 4)] * 2, "tokens") == "<|box_start|>(1,2),(3,4)<|box_end|>" * 2


def test_a_qwen2_vl_box_decoded_as_trl_decodes_it_still_scores(family_model_dir):
    """Qwen2-VL's ``<|box_start|>`` and ``<|box_end|>`` are special tokens (in the real tokenizer and the tiny one),
    and TRL decodes completions with ``skip_special_tokens=True`` (so does the evaluation): what the rewards read is
    the pair of points alone, which must score as the box it is. Before the fix every such completion scored 0 (the
    tiny Qwen2-VL's grounding self-test: IoU 0.000 from step 1 on two seeds)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(family_model_dir("qwen2_vl"))
    answer = "<|box_start|>(0,0),(500,500)<|box_end|>"
    ids = tokenizer(answer, add_special_tokens=False)["input_ids"]
    decoded = tokenizer.decode(ids, skip_special_tokens=True)
    assert decoded == "(0,0),(500,500)"  # what the reward functions get
    assert parse_boxes(decoded) == parse_boxes(answer) == [(0.0, 0.0, 500.0, 500.0)]
    frame = {"family": "qwen2_vl", "width": 112, "height": 112, "resized_width": 28, "resized_height": 28}
    assert iou([decoded], ["[0, 0, 56, 56]"], [frame]) == [1.0]
    assert box_format([decoded], box_frame=[frame]) == [1.0]


def test_dataset_frames_are_explicit():
    assert to_pixels([0.5, 0.5, 1, 1], "normalized", 200, 100) == (100.0, 50.0, 200.0, 100.0)
    assert to_pixels([500, 500, 1000, 1000], "relative1000", 200, 100) == (100.0, 50.0, 200.0, 100.0)
    from suzak import SuzakError

    with pytest.raises(SuzakError, match="unknown box frame 'xywh'"):
        to_pixels([0, 0, 1, 1], "xywh", 10, 10)


# --- rewards -----------------------------------------------------------------------------------------------------


def _frame(family="qwen2_5_vl", size=(200, 100), resized=(196, 98)):
    return BoxFrame(family, *size, *resized).as_dict()


@pytest.mark.parametrize(
    ("completion", "expected_iou"),
    [
        ('{"bbox_2d": [0, 0, 98, 98]}', 1.0),  # the gold box (original [0, 0, 100, 100]) in the resized frame
        ("[0, 0, 196, 98]", 0.5),
        ("[98, 0, 196, 98]", 0.0),
        ("[0, 0, 300, 98]", 0.0),  # outside the frame: counted invalid
        ("[50, 50, 10, 60]", 0.0),  # x2 < x1
        ("[0, 0, 98]", 0.0),  # three numbers: no box
        ("no box at all", 0.0),
        ('[{"bbox_2d": [0, 0, 49, 98]}, {"bbox_2d": [0, 0, 98, 98]}]', 0.5),  # the first box counts
    ],
)  # fmt: skip
def test_iou_and_rec_accuracy_read_the_first_box_in_the_rows_frame(completion, expected_iou):
    assert iou([completion], ["[0, 0, 100, 100]"], [_frame()]) == [pytest.approx(expected_iou)]
    assert rec_accuracy([completion], ["[0, 0, 100, 100]"], [_frame()]) == [float(expected_iou >= 0.5)]


def test_invalid_and_unparsed_boxes_are_counted_not_raised():
    logged = {}
    iou(["[0, 0, 300, 98]", "none", "[0, 0, 98, 98]", "[5, 5, 5, 5]"], ["[0, 0, 100, 100]"] * 4, [_frame()] * 4,
        log_metric=lambda name, value: logged.__setitem__(name, value))  # fmt: skip
    assert logged == {"iou/unparsed_frac": 0.25, "iou/invalid_frac": pytest.approx(2 / 3)}


def test_box_rewards_need_the_trainers_frame():
    with pytest.raises(ValueError, match="reads each row's box frame .*VLMGRPOTrainer"):
        iou(["[0, 0, 1, 1]"], ["[0, 0, 1, 1]"])


def test_format_and_f1_rewards():
    frames = [_frame("qwen3_vl", (100, 100), (96, 96))] * 3
    assert box_format(['{"bbox_2d": [0, 0, 1000, 1000]}', "[0, 0, 1001, 5]", "nothing"], frames) == [1.0, 0.0, 0.0]
    golds = ["[[0, 0, 10, 10], [50, 50, 60, 60]]"] * 3
    completions = ['[{"bbox_2d": [0, 0, 100, 100]}, {"bbox_2d": [500, 500, 600, 600]}]', "[0, 0, 100, 100]",
                   "[0, 0, 100, 100] [0, 0, 2000, 2000]"]  # fmt: skip
    assert box_f1(completions, golds, frames) == [1.0, pytest.approx(2 / 3), 0.5]
    assert box_iou((0, 0, 2, 2), (1, 1, 3, 3)) == pytest.approx(1 / 7) and match_f1([], []) == 1.0
    assert {"iou", "rec_accuracy", "box_format", "box_f1"} <= set(REWARDS)


# --- the trainer's frames, the pre-flight, SFT targets, validation ------------------------------------------------


def test_a_batchs_rows_all_get_the_column_and_text_models_none():
    budget = PixelBudget(3136, 50176, factor=28)
    image = Image.new("RGB", (640, 480))
    rows = [with_box_frame(r, "qwen2_5_vl", budget) for r in ({"image": image}, {"images": [image, image]}, {"p": 1})]
    assert rows[0]["box_frame"]["resized_width"] == 252 and [rows[1]["box_frame"], rows[2]["box_frame"]] == [None, None]
    assert with_box_frame({"image": image}, "qwen2", budget) == {"image": image}
    assert model_answer(rows[0] | {"solution": "[64, 48, 320, 240]"}) == '{"bbox_2d": [25, 17, 126, 84]}'


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5"])
@pytest.mark.parametrize("template", ["rec", "rec_r1"])
def test_preflight_passes_grounding_rows_in_every_frame(family, template):
    """The pre-flight renders each row's gold box in the row's frame (Qwen2-VL's tokens, the others' JSON), in the
    template's answer format; every box reward gives it 1.0. The box read from the wrong answer format fails."""
    from suzak import SuzakError
    from suzak.data.grounding import grounding_shapes
    from suzak.scoring.prompts import get_template
    from suzak.scoring.rewards import resolve_reward
    from suzak.training.checks import preflight

    factor = family_factors()[family]
    rows = [with_box_frame(row, family, PixelBudget(3136, 401408, factor=factor))
            for row in grounding_shapes(4, seed=1, max_side=900, template=template)]  # fmt: skip
    answer_format = get_template(template).answer_format
    rewards = [resolve_reward(name, {"answer_format": answer_format}) for name in ("iou", "rec_accuracy", "box_format")]
    preflight(rows, rewards, answer_format)
    if template == "rec_r1":
        with pytest.raises(SuzakError, match="reward 'iou' returned 0.0"):
            preflight(rows, [resolve_reward("iou", {"answer_format": "think_answer"})], "box")


def test_sft_targets_are_in_the_models_frame():
    from suzak.data.grounding import grounding_shapes
    from suzak.sft import to_sft_dataset

    dataset = grounding_shapes(2, seed=3, min_side=1500, max_side=1600)  # larger than the budget: the resize matters
    budget = PixelBudget(3136, 401408, factor=28)
    targets = to_sft_dataset(dataset, "box", "qwen2_5_vl", budget)
    for row, target in zip(dataset, targets, strict=True):
        frame = BoxFrame.of("qwen2_5_vl", row["width"], row["height"], budget)
        gold = json.loads(row["solution"])
        assert json.loads(target["completion"][0]["content"]) == {"bbox_2d": list(frame.to_model(gold))}
        assert frame.resized_width < row["width"]


@pytest.mark.parametrize(
    ("solution", "reason"),
    [
        ("[10, 10, 700, 20]", "gold box [10.0, 10.0, 700.0, 20.0]: x2 700 is outside the image (width 640)"),
        ("[50, 10, 20, 20]", "x2 20 is not right of x1 50"),
        ("[50, 10, 60]", "iou cannot read the gold answer '[50, 10, 60]'"),
        (None, "no gold answer, which iou read(s)"),
    ],
)  # fmt: skip
def test_bad_gold_boxes_are_named_before_step_1(tmp_path, solution, reason):
    import datasets

    from suzak.scoring.rewards import gold_parser
    from suzak.training.checks import validate_rows

    image = Image.new("RGB", (640, 480))
    rows = [{"image": image, "solution": "[1, 1, 9, 9]", "line": 1}, {"image": image, "solution": solution, "line": 2}]
    dataset = datasets.Dataset.from_list(rows)
    problems = validate_rows(dataset, PixelBudget(3136, 401408, factor=28), {"iou": gold_parser(iou)})
    assert [(p.line, p.column) for p in problems] == [(2, "solution")] and reason in problems[0].reason


# --- suzak boxes (python -m suzak.media.boxes) ------------------------------------------------------------------


def _boxes(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "suzak.media.boxes", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def test_the_boxes_command_prints_one_json_line_both_ways():
    out = _boxes("--family", "qwen2_5_vl", "--width", "1920", "--height", "1080", "--box", "100", "200", "500", "600")
    assert out.returncode == 0, out.stderr
    line = json.loads(out.stdout)
    assert line["resized"] == [840, 448] and line["model_box"] == [44, 83, 219, 249] and out.stdout.count("\n") == 1
    back = _boxes("--family", "qwen2_5_vl", "--width", "1920", "--height", "1080", "--box", *map(str, line["model_box"]),
                  "--from_model")  # fmt: skip
    assert back.returncode == 0 and json.loads(back.stdout)["box"] == [100.57, 200.09, 500.57, 600.27]
    small = _boxes("--family", "qwen3_vl", "--width", "640", "--height", "480", "--box", "64", "48", "320", "240",
                   "--max_pixels", "50176")  # fmt: skip
    assert json.loads(small.stdout)["model_box"] == [100, 100, 500, 500]  # relative: the budget does not matter
    bad = _boxes("--family", "qwen2_vl", "--width", "640", "--height", "480", "--box", "10", "10", "700", "20")
    assert bad.returncode == 1
    assert bad.stderr.strip() == "error: box [10, 10, 700, 20]: x2 700 is outside the image (width 640)"


# --- a box in the question ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5"])
def test_a_box_in_the_question_is_put_in_the_models_frame(family):
    """``{box}`` / ``{box2}`` in a question become the row's ``question_boxes`` (original pixels) in the frame the
    model answers in, at the budget's size: the same numbers as a gold box there (changing the budget moves them)."""
    from suzak.media.boxes import question_box_text

    image = Image.new("RGB", (1600, 900))  # larger than the budget: the resize matters
    prompt = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Compare {box} with {box2}."}]}]
    row = {"image": image, "prompt": prompt, "question_boxes": "[[0, 0, 800, 450], [800, 450, 1600, 900]]"}
    for budget in (PixelBudget(3136, 401408, factor=family_factors()[family]),
                   PixelBudget(3136, 100352, factor=family_factors()[family])):  # fmt: skip
        framed = with_box_frame(row, family, budget)
        frame = BoxFrame.from_dict(framed["box_frame"])
        text = framed["prompt"][0]["content"][1]["text"]
        first, second = (question_box_text(box, frame) for box in ([0, 0, 800, 450], [800, 450, 1600, 900]))
        assert text == f"Compare {first} with {second}." and "{box" not in text
        assert (
            model_answer({"solution": "[0, 0, 800, 450]", "box_frame": frame}).count(
                str(frame.to_model([0, 0, 800, 450])[2])
            )
            >= 1
        )
        assert row["prompt"][0]["content"][1]["text"] == "Compare {box} with {box2}."  # the dataset's row unchanged


def test_question_boxes_that_cannot_be_put_are_one_line(tmp_path):
    import datasets

    from suzak import SuzakError
    from suzak.training.checks import validate_rows

    image = Image.new("RGB", (640, 480))
    with pytest.raises(SuzakError, match=r"names \{box2\} and the row's question_boxes holds 1 box"):
        with_box_frame({"image": image, "prompt": "What is in {box2}?", "question_boxes": [1, 1, 9, 9]}, "qwen2_5_vl",
                       PixelBudget(3136, 401408, factor=28))  # fmt: skip
    rows = [{"image": image, "prompt": "{box}?", "question_boxes": "[1, 1, 9, 9]", "line": 1},
            {"image": image, "prompt": "{box}?", "question_boxes": "[1, 1, 900, 9]", "line": 2}]  # fmt: skip
    problems = validate_rows(datasets.Dataset.from_list(rows), PixelBudget(3136, 401408, factor=28))
    assert [(p.line, p.column) for p in problems] == [(2, "question_boxes")]
    assert "question box [1, 1, 900, 9]: x2 900 is outside the image (width 640)" in problems[0].reason


def test_sft_prompts_get_their_question_boxes_in_the_frame():
    import datasets

    from suzak.sft import to_sft_dataset

    image = Image.new("RGB", (1600, 900))
    prompt = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is in {box}?"}]}]
    dataset = datasets.Dataset.from_list([{"image": image, "prompt": prompt, "question_boxes": "[0, 0, 800, 450]",
                                           "solution": "[0, 0, 800, 450]"}])  # fmt: skip
    budget = PixelBudget(3136, 401408, factor=28)
    row = to_sft_dataset(dataset, "box", "qwen2_5_vl", budget)[0]
    box = BoxFrame.of("qwen2_5_vl", 1600, 900, budget).to_model([0, 0, 800, 450])
    assert row["prompt"][0]["content"][1]["text"] == "What is in [{}, {}, {}, {}]?".format(*box)
    assert json.loads(row["completion"][0]["content"]) == {"bbox_2d": list(box)}


def test_eval_items_get_their_question_boxes_in_the_engines_frame():
    from suzak.eval.runner import with_box_frames
    from suzak.eval.tasks import EvalItem

    image = Image.new("RGB", (1600, 900))
    prompt = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is in {box}?"}]}]
    item = EvalItem(0, "k", {"question_boxes": [0, 0, 800, 450]}, prompt, "a cat", (image,))
    for family, expected in (("qwen2_vl", "<|box_start|>(0,0),(500,500)<|box_end|>"), ("qwen3_vl", "[0, 0, 500, 500]")):
        framed = with_box_frames([item], family, PixelBudget(3136, 401408, factor=family_factors()[family]))[0]
        assert framed.prompt[0]["content"][1]["text"] == f"What is in {expected}?" and framed.gold == "a cat"


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_a_box_on_an_image_past_200_to_1_lands_where_the_padded_image_shows_it(family):
    """An image past Qwen's 200:1 is padded, centred, before the resize: the frame maps boxes through that padding
    (issue 51: plain scaling put them off by the padding, and so the zoom's crops too)."""
    import numpy as np
    from PIL import Image

    from suzak.media.vision import PixelBudget, family_factors

    budget = PixelBudget(3136, 401408, factor=family_factors()[family])
    image = Image.new("RGB", (4000, 10), (255, 255, 255))
    gold = (1000, 2, 2000, 8)
    image.paste((255, 0, 0), gold)
    frame = BoxFrame.of(family, 4000, 10, budget)
    assert frame.pad_y > 0 and frame.pad_x == 0
    fitted = np.asarray(budget.fit(image)).astype(int)
    red = np.argwhere((fitted[..., 0] > 200) & (fitted[..., 1] < 80))  # (y, x) of the red pixels after the resize
    shown = (red[:, 1].min(), red[:, 0].min(), red[:, 1].max() + 1, red[:, 0].max() + 1)
    x1, y1, x2, y2 = frame.to_model(gold)
    sx, sy = (1000 / fitted.shape[1], 1000 / fitted.shape[0]) if frame.spec.relative else (1, 1)
    assert abs(x1 - shown[0] * sx) <= 2 * sx and abs(x2 - shown[2] * sx) <= 2 * sx  # within the resize's blur
    assert abs(y1 - shown[1] * sy) <= 2 * sy and abs(y2 - shown[3] * sy) <= 2 * sy
    assert frame.from_model(frame.to_model(gold)) == pytest.approx(gold, abs=max(4000, 10) / 500)
