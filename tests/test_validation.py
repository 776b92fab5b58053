"""The whole dataset is validated before step 1: bad images and unreadable gold answers are one line naming the file,
line and column, or, with --skip_bad_rows, dropped, listed and counted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import datasets
import pytest
from PIL import Image

from conftest import ROOT
from suzak.data import build_dataset
from suzak.media.vision import PixelBudget
from suzak.scoring.rewards import clevr_count, gold_parser, resolve_reward
from suzak.training.checks import RowProblem, validate_rows

BUDGET = PixelBudget(3136, 50176, factor=28)  # the tiny Qwen2.5-VL's 28-pixel visual tokens
PARSERS = {"clevr_count": gold_parser(clevr_count)}


def write_dataset(folder: Path, rows: list[tuple[str, str]]) -> Path:
    """A JSONL of R1-V eval lines over image files made here: good, truncated, text-as-PNG, 500x1, missing."""
    Image.new("RGB", (320, 240), (200, 10, 10)).save(folder / "good.png")
    data = (folder / "good.png").read_bytes()
    (folder / "truncated.png").write_bytes(data[: len(data) // 2])
    (folder / "text.png").write_text("this is not an image")
    Image.new("RGB", (500, 1), (0, 90, 0)).save(folder / "thin.png")
    Image.new("I;16", (64, 48)).save(folder / "sixteen_bit.png")
    path = folder / "data.jsonl"
    lines = [json.dumps({"image_path": image, "question": "How many items are there?", "ground_truth": gold})
             for image, gold in rows]  # fmt: skip
    path.write_text("\n".join(lines) + "\n")
    return path


def test_every_kind_of_bad_row_is_named_by_line_and_column(tmp_path):
    rows = [("good.png", "3"), ("truncated.png", "3"), ("text.png", "4"), ("thin.png", "5"), ("good.png", "many"),
            ("sixteen_bit.png", "6"), ("good.png", "<answer> 7 </answer>")]  # fmt: skip
    dataset = build_dataset(str(write_dataset(tmp_path, rows)))
    problems = validate_rows(dataset, BUDGET, PARSERS)
    assert [(p.line, p.column) for p in problems] == [(2, "image"), (3, "image"), (5, "solution")]
    truncated, text, gold = problems
    assert truncated.reason == "unreadable image (OSError: image file is truncated)"
    assert truncated.image.endswith("truncated.png") and text.reason == "not an image PIL can read"
    assert gold.reason == "clevr_count cannot read the gold answer 'many'" and gold.image is None
    assert truncated.where("data.jsonl") == "data.jsonl line 2"
    assert validate_rows(dataset.select([0, 3, 5, 6]), BUDGET, PARSERS) == []  # 500x1 and 16-bit images train


def test_rows_without_a_line_are_named_by_index_and_images_lists_checked(tmp_path):
    data = tmp_path / "x.png"
    Image.effect_noise((64, 64), 40).convert("RGB").save(data)  # noise: a PNG too big to survive halving
    (tmp_path / "bad.png").write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    rows = [{"images": [str(data), str(data)], "solution": "2"}, {"images": [str(data), str(tmp_path / "bad.png")],
                                                                   "solution": "2"}]  # fmt: skip
    dataset = datasets.Dataset.from_list(rows).cast_column("images", datasets.List(datasets.Image()))
    (problem,) = validate_rows(dataset, BUDGET, PARSERS)
    assert problem == RowProblem(1, None, "images", problem.reason, str(tmp_path / "bad.png"))
    assert problem.where("my_set") == "my_set row 1" and problem.reason.startswith("unreadable image")


def test_gold_parsers_follow_the_recipes_reward_kwargs_and_skip_gold_free_rewards():
    assert gold_parser(resolve_reward("clevr_count", {"answer_format": "plain"})) is gold_parser(clevr_count)
    assert gold_parser(resolve_reward("think_format")) is None  # reads no gold: nothing to check
    dataset = datasets.Dataset.from_list([{"solution": "#### 18"}, {"solution": "18"}, {"solution": "eighteen"}])
    gsm8k = {"gsm8k_accuracy": gold_parser(resolve_reward("gsm8k_accuracy"))}
    assert [p.index for p in validate_rows(dataset, BUDGET, gsm8k)] == [2]


def test_validation_runs_on_several_processes(tmp_path):
    rows = [("good.png", str(n % 7 + 1)) for n in range(40)] + [("text.png", "3")]
    dataset = build_dataset(str(write_dataset(tmp_path, rows)))
    (problem,) = validate_rows(dataset, BUDGET, PARSERS, num_proc=2)
    assert (problem.index, problem.line, problem.column) == (40, 41, "image")


def _train(tmp_path: Path, data: Path, *flags: str) -> subprocess.CompletedProcess:
    out = tmp_path / "run"
    return subprocess.run([sys.executable, "-m", "suzak.train", "--config", "recipes/smoke.yaml", "--dataset_name",
                           str(data), "--output_dir", str(out), "--max_steps", "1", "--save_strategy", "no", *flags],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)  # fmt: skip


def test_a_bad_row_stops_the_run_before_step_1_in_one_line(tmp_path):
    rows = [("good.png", "3")] * 10 + [("truncated.png", "3")] + [("good.png", "many")] + [("good.png", "4")] * 8
    result = _train(tmp_path, write_dataset(tmp_path, rows))
    assert result.returncode != 0 and "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {tmp_path / 'data.jsonl'} line 11, column image: unreadable image")
    assert "(2 of 20 rows bad; --skip_bad_rows true drops them" in last
    assert not (tmp_path / "run" / "metrics.csv").exists()  # nothing trained


@pytest.mark.slow
def test_skip_bad_rows_drops_lists_and_counts_them(tmp_path):
    rows = [("good.png", "3")] * 10 + [("text.png", "3"), ("good.png", "many")] + [("good.png", "4")] * 8
    data = write_dataset(tmp_path, rows)
    result = _train(tmp_path, data, "--skip_bad_rows", "true", "--max_bad_fraction", "0.2")
    assert result.returncode == 0, result.stderr[-3000:]
    listed = [json.loads(line) for line in (tmp_path / "run" / "skipped_rows.jsonl").read_text().splitlines()]
    assert [(r["line"], r["column"]) for r in listed] == [(11, "image"), (12, "solution")]
    assert "skip_bad_rows: 2 of 20 rows bad dropped" in result.stderr
    too_many = _train(tmp_path, data, "--skip_bad_rows", "true", "--max_bad_fraction", "0.05")
    assert too_many.returncode != 0 and "Traceback" not in too_many.stderr
    assert "2 of 20 rows bad, more than max_bad_fraction 0.05" in too_many.stderr.strip().splitlines()[-1]


# --- evaluation validates at load, like training ---------------------------------------------------------------


def test_evaluation_checks_images_and_gold_answers_before_any_model_loads(eval_fixture_dir, tmp_path):
    from suzak import SuzakError
    from suzak.eval.runner import EvalConfig, prepare_items
    from suzak.eval.tasks import get_task

    task = get_task("superclevr")
    rows = [json.loads(line) for line in (eval_fixture_dir / task.prompt_path).read_text().splitlines()]
    image = eval_fixture_dir / rows[2]["image_path"]
    (tmp_path / "truncated.png").write_bytes(image.read_bytes()[: image.stat().st_size // 2])
    rows[2]["image_path"] = str(tmp_path / "truncated.png")
    rows[4]["ground_truth"] = "many"
    prompts = tmp_path / "problems.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))

    def config(**kw):
        return EvalConfig(task="superclevr", model_path="no-model-needed", prompt_path=str(prompts),
                          image_root=str(eval_fixture_dir), **kw)  # fmt: skip

    with pytest.raises(SuzakError) as info:
        prepare_items(config(), task)
    assert str(info.value).startswith(f"{prompts}:3: {tmp_path / 'truncated.png'}: unreadable image (OSError")
    assert "(2 of 8 items bad; --skip_missing evaluates the others" in str(info.value)
    items, skipped = prepare_items(config(skip_missing=True), task)
    assert skipped == 2 and [item.source for item in items] == [f"{prompts}:{n}" for n in (1, 2, 4, 6, 7, 8)]
    rows[2]["image_path"] = rows[0]["image_path"]  # the image fixed, the gold answer is next
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(SuzakError, match=r":5: cannot read the gold answer 'many' .*\(1 of 8 items bad"):
        prepare_items(config(), task)


@pytest.mark.parametrize(("family", "model_box"), [("qwen2_5_vl", [112, 1, 112, 56]), ("qwen3_vl", [250, 5, 250, 500])])
def test_a_gold_box_thinner_than_the_model_frames_unit_is_a_bad_row(family, model_box):
    """A 1-pixel-wide gold box on a 4000-pixel image rounds to x1 == x2 in the model's frame at this budget: no box,
    so every answer on the row would score 0 (issue 51: validation said nothing). A box the frame can hold passes."""
    from suzak.media.vision import family_factors
    from suzak.scoring.rewards import iou

    image = Image.new("RGB", (4000, 1000))
    rows = [{"image": image, "solution": "[1000, 5, 1001, 500]"}, {"image": image, "solution": "[1000, 5, 1400, 500]"}]
    budget = PixelBudget(3136, 50176, factor=family_factors()[family])
    parsers = {"iou": gold_parser(iou)}
    (problem,) = validate_rows(datasets.Dataset.from_list(rows), budget, parsers, family=family)
    assert problem.index == 0 and problem.column == "solution"
    assert problem.reason.startswith(f"gold box [1000.0, 5.0, 1001.0, 500.0] is {model_box} in {family}'s frame")
    assert validate_rows(datasets.Dataset.from_list(rows), budget, parsers) == []  # without the family: as before
