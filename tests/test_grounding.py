"""Grounding data and evaluation: RefCOCO in VLM-R1's files and in the Hub layout (small hand-made files, no Hub
here), the procedural task through suzak.train, and `suzak.eval rec` / `grounding_shapes` with VLM-R1's rule beside
the strict one, the frame named in the report and a picture of the boxes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import datasets
import pytest
from PIL import Image

from suzak import SuzakError
from suzak.data.grounding import grounding_shapes
from suzak.data.refcoco import VLM_R1_PREFIX, refcoco
from suzak.eval.tasks import box_gold, get_task, score
from suzak.media.boxes import BoxFrame
from suzak.media.vision import PixelBudget
from suzak.scoring.rewards import rec_accuracy

ROOT = Path(__file__).resolve().parents[1]


def write_vlm_r1_files(root: Path, rows: int = 4) -> tuple[Path, Path]:
    """VLM-R1's layout by hand: images under ``coco/train2014/``, an evaluation JSON list and a training JSONL."""
    scenes = list(grounding_shapes(rows, seed=5, max_side=700))
    (root / "coco" / "train2014").mkdir(parents=True)
    records, lines = [], []
    for i, scene in enumerate(scenes):
        name = f"train2014/COCO_train2014_{i:012d}.jpg"
        scene["image"].save(root / "coco" / name, quality=95)
        box = json.loads(scene["solution"])
        records.append({"height": scene["height"], "width": scene["width"], "id": i, "image": name,
                        "problem": f"{VLM_R1_PREFIX} {scene['problem']}.", "normal_caption": scene["problem"],
                        "solution": box, "normalized_solution": [0, 0, 0, 0]})  # fmt: skip
        lines.append({"id": i, "image": name, "conversations": [
            {"from": "human", "value": f"<image>{VLM_R1_PREFIX} {scene['problem']}."},
            {"from": "gpt", "value": json.dumps(box)}]})  # fmt: skip
    evaluation, training = root / "refcoco_val.json", root / "refcoco_train.jsonl"
    evaluation.write_text(json.dumps(records))
    training.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return evaluation, training


def test_vlm_r1_files_read_as_rows_in_original_pixels(tmp_path):
    evaluation, training = write_vlm_r1_files(tmp_path)
    for path in (evaluation, training):
        rows = refcoco(path=str(path), image_root=str(tmp_path / "coco"))
        assert len(rows) == 4 and rows[0]["problem"].startswith("the ") and not rows[0]["problem"].endswith(".")
        text = rows[0]["prompt"][0]["content"][1]["text"]
        assert text == f"Locate {rows[0]['problem']} in this image and output the bbox coordinates in JSON format."
        assert json.loads(rows[0]["solution"]) == json.loads(evaluation.read_text())[0]["solution"]
    r1 = refcoco(path=str(evaluation), image_root=str(tmp_path / "coco"), template="rec_r1")
    text = r1[0]["prompt"][0]["content"][1]["text"]
    assert text == (f"{VLM_R1_PREFIX} {r1[0]['problem']}. First output the thinking process in <think> </think> tags "
                    "and then output the final answer in <answer> </answer> tags. Output the final answer in JSON format.")  # fmt: skip


def test_the_hub_layout_one_row_per_sentence_xywh_to_corners(tmp_path):
    image = Image.new("RGB", (640, 480))
    hub = datasets.Dataset.from_list([
        {"question_id": "7", "image": image, "question": "", "answer": ["the cat", "a cat on the left."],
         "segmentation": [0.0], "bbox": [10.0, 20.0, 100.0, 50.0], "iscrowd": 0, "file_name": "a.jpg"}])  # fmt: skip
    hub.save_to_disk(str(tmp_path / "refcoco-val"))
    rows = refcoco(path=str(tmp_path / "refcoco-val"))
    assert [r["problem"] for r in rows] == ["the cat", "a cat on the left"]
    assert [json.loads(r["solution"]) for r in rows] == [[10.0, 20.0, 110.0, 70.0]] * 2


def test_bad_records_and_an_offline_hub_are_one_line(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"image": "a.jpg", "normal_caption": "x", "solution": [1, 2, 3]}]))
    with pytest.raises(SuzakError, match=r"bad.json:1: a box is 4 numbers \[x1, y1, x2, y2\], got \[1, 2, 3\]"):
        refcoco(path=str(bad), image_root=str(tmp_path))
    with pytest.raises(SuzakError, match="set image_root"):
        refcoco(path=str(bad))
    with pytest.raises(SuzakError, match="box_frame 'xywh'"):
        refcoco(path=str(bad), image_root=str(tmp_path), box_frame="xywh")
    with pytest.raises(SuzakError) as error:
        refcoco("refcoco", "val")
    assert "\n" not in str(error.value) and "lmms-lab/RefCOCO" in str(error.value)


def test_a_normalized_file_says_so_and_is_read_against_each_image(tmp_path):
    evaluation, _ = write_vlm_r1_files(tmp_path, rows=2)
    records = json.loads(evaluation.read_text())
    for record in records:
        x1, y1, x2, y2 = record["solution"]
        record["solution"] = [x1 / record["width"], y1 / record["height"], x2 / record["width"], y2 / record["height"]]
    normalized = tmp_path / "normalized.json"
    normalized.write_text(json.dumps(records))
    rows = refcoco(path=str(normalized), image_root=str(tmp_path / "coco"), box_frame="normalized")
    pixels = refcoco(path=str(evaluation), image_root=str(tmp_path / "coco"))
    for a, b in zip(rows, pixels, strict=True):
        assert json.loads(a["solution"]) == pytest.approx(json.loads(b["solution"]), abs=0.01)


# --- scoring ---------------------------------------------------------------------------------------------------------


FRAME = BoxFrame("qwen2_5_vl", 427, 640, 420, 644).as_dict()  # a RefCOCO-sized image, resized by the budget
GOLD = [103.93, 299.99, 238.15, 477.41]  # VLM-R1 issue #11's record, original pixels

# (output, VLM-R1's verdict, strict verdict): their rule needs the first <answer> block, braces and integers.
REC_TABLE = [
    ('<think>x</think><answer>{"bbox_2d": [102, 302, 234, 480]}</answer>', True, True),
    ("<think>x</think><answer>[102, 302, 234, 480]</answer>", False, True),  # no braces: VLM-R1 reads [0, 0, 0, 0]
    ('<answer>{"bbox_2d": [102.0, 302, 234, 480]}</answer>', False, True),  # a float: not VLM-R1's \\d+
    ('<answer>{"bbox_2d": [0, 0, 10, 10]}</answer> <answer>{"bbox_2d": [102, 302, 234, 480]}</answer>', False, True),
    ('<answer>{"bbox_2d": [0, 0, 50, 50]}</answer>', False, False),
    ('{"bbox_2d": [102, 302, 234, 480]}', False, False),  # rec_r1 asks for <answer>: strict reads the tag too
]  # fmt: skip


@pytest.mark.parametrize(("output", "vlm_r1", "strict"), REC_TABLE)
def test_vlm_r1_rule_beside_the_strict_one(output, vlm_r1, strict):
    gold = box_gold([GOLD], "think_answer", FRAME)
    assert score("rec", output, gold, "vlm_r1")[1] is vlm_r1
    assert score("rec", output, gold, "strict")[1] is strict
    reward = rec_accuracy([output], [json.dumps([GOLD])], [FRAME], answer_format="think_answer")
    assert strict == (reward == [1.0])  # the strict rule is the training reward


def test_rec_table_covers_both_directions():
    assert {(v, s) for _, v, s in REC_TABLE} == {(True, True), (False, True), (False, False)}  # VLM-R1 reads less


def test_vlm_r1_reads_the_resized_frame_as_it_does():
    """VLM-R1 maps the box from the resized input size to the original (its resize_bbox), as the frame does."""
    output = '<answer>{"bbox_2d": [102, 302, 234, 480]}</answer>'
    extracted, correct = score("rec", output, box_gold([GOLD], "think_answer", FRAME), "vlm_r1")
    assert extracted == [103.7, 300.12, 237.9, 477.02] and correct  # 102 * 427 / 420, 302 * 640 / 644, ...


# --- end to end -------------------------------------------------------------------------------------------------------


def test_suzak_eval_rec_on_vlm_r1s_file_names_the_frame_and_draws_the_boxes(tmp_path, tiny_model_dir):
    from suzak.eval import cli

    evaluation, _ = write_vlm_r1_files(tmp_path)
    out = tmp_path / "rec.json"
    cli.main(["rec", "--model_path", str(tiny_model_dir), "--prompt_path", str(evaluation), "--image_root",
              str(tmp_path / "coco"), "--max_new_tokens", "12", "--output_path", str(out), "--no_progress",
              "--max_pixels", "200704"])  # fmt: skip
    results = json.loads(out.read_text())
    assert results["scoring"] == "strict" and results["other_scoring"] == "vlm_r1" and len(results["results"]) == 4
    first = results["results"][0]
    assert {"is_correct_strict", "is_correct_vlm_r1"} <= set(first)
    assert first["ground_truth"]["frame"]["family"] == "qwen2_5_vl"
    frame = BoxFrame.from_dict(first["ground_truth"]["frame"])
    assert frame == BoxFrame.of("qwen2_5_vl", frame.width, frame.height, PixelBudget(3136, 200704, factor=28))
    summary = (tmp_path / "rec.md").read_text()
    assert "box_frame=qwen2_5_vl: pixels of the resized image" in summary and "boxes_plot=rec.png" in summary
    assert Image.open(tmp_path / "rec.png").size[0] >= 256


def test_the_box_picture_marks_gold_and_predicted_and_shows_each_question(tmp_path):
    """`suzak eval`'s picture of boxes: the gold box green, the answer red (a point as a cross), each named on the
    picture and in a legend, the item's question under its image."""
    from suzak.eval.report import GOLD_COLOUR, PREDICTED_COLOUR, draw_boxes

    images = [Image.new("RGB", (512, 256), (255, 255, 255)), Image.new("RGB", (256, 256), (255, 255, 255))]
    results = [{"ground_truth": {"boxes": [[0, 0, 256, 256]]}, "extracted_answer": [256, 0, 512, 256]},
               {"ground_truth": {"boxes": [[0, 0, 128, 128]]}, "extracted_answer": [200, 200]}]  # fmt: skip
    path = draw_boxes(tmp_path / "boxes.png", images, results, ["Locate the blue circle.", "Click the red button."])
    sheet = Image.open(path).convert("RGB")
    legend, size, caption = 20, 256, 30
    assert sheet.size == (2 * size, legend + size + caption)
    pixels = sheet.load()
    assert pixels[64, legend + 64] == (255, 255, 255)  # inside the gold box: the image itself
    assert pixels[1, legend + 100] == GOLD_COLOUR and pixels[size // 2 + 1, legend + 100] == PREDICTED_COLOUR
    assert pixels[size + 200, legend + 200] == PREDICTED_COLOUR  # the point's cross, at (200, 200) of a 256 image
    colours = {pixels[x, y] for x in range(size) for y in range(legend)}  # the legend names both (antialiased text)
    assert any(g - r > 100 for r, g, _ in colours) and any(r - g > 100 for r, g, _ in colours)
    under = [pixels[x, y] for x in range(size) for y in range(legend + size + 2, legend + size + caption)]
    assert any(p != (255, 255, 255) for p in under)  # the question is written under the image


def test_grounding_shapes_task_and_the_rule_a_task_lacks(tiny_model_dir, tmp_path):
    from suzak.eval import cli

    out = tmp_path / "shapes.json"
    cli.main(["grounding_shapes", "--model_path", str(tiny_model_dir), "--num_rows", "3", "--max_new_tokens", "8",
              "--output_path", str(out), "--no_progress", "--scoring", "vlm_r1"])  # fmt: skip
    assert json.loads(out.read_text())["scoring"] == "vlm_r1"
    with pytest.raises(SuzakError, match=r"superclevr has no 'vlm_r1' scoring rule; use r1v or strict"):
        get_task("superclevr").scorer("vlm_r1")


@pytest.mark.slow
def test_grounding_trains_through_suzak_train_on_the_procedural_task_and_vlm_r1s_file(tmp_path, run_env):
    """`python -m suzak.train` with the grounding recipe: the rows get their frames, the pre-flight passes the ideal
    box answers, the box rewards are logged; then the same on VLM-R1's training layout."""
    from conftest import last_trainer_state, run_ok

    out = tmp_path / "run"
    run_ok([sys.executable, "-m", "suzak.train", "--config", "recipes/grounding_smoke.yaml", "--max_steps", "2",
            "--save_steps", "2", "--output_dir", str(out)], run_env)  # fmt: skip
    logs = [log for log in last_trainer_state(out)["log_history"] if "reward" in log]
    assert len(logs) == 2 and all("rewards/iou/mean" in log and "rewards/box_format/mean" in log for log in logs)
    _, training = write_vlm_r1_files(tmp_path)
    run_ok([sys.executable, "-m", "suzak.train", "--config", "recipes/grounding_smoke.yaml", "--max_steps", "1",
            "--dataset_name", "refcoco", "--dataset_options", json.dumps({"path": str(training),
            "image_root": str(tmp_path / "coco")}), "--eval_rows", "0", "--save_strategy", "no",
            "--output_dir", str(tmp_path / "refcoco")], run_env)  # fmt: skip
