"""Dataset builders: same columns from every source, clear errors for bad input and for the Hub offline."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from PIL import Image

from suzak import SuzakError
from suzak.data.builders import build_dataset, clevr_synthetic, gsm8k, gsm8k_gold, jsonl, save_dataset
from suzak.scoring.prompts import render_prompt


def _user_text(prompt: list[dict]) -> str:
    content = prompt[0]["content"]
    return content if isinstance(content, str) else next(p["text"] for p in content if p["type"] == "text")


def test_gsm8k_local_jsonl(gsm8k_jsonl):
    ds = gsm8k(path=str(gsm8k_jsonl))
    assert {"prompt", "solution", "problem", "question", "answer"} <= set(ds.column_names)
    assert ds["solution"] == ["37", "3600", "10.5", "-5"]
    row = ds[0]
    assert row["prompt"][0]["role"] == "user" and isinstance(row["prompt"][0]["content"], str)
    assert row["prompt"][0]["content"] == render_prompt("gsm8k", row["question"])
    assert "image" not in ds.column_names
    assert build_dataset(str(gsm8k_jsonl))["solution"] == ds["solution"]


@pytest.mark.parametrize(
    "answer,gold",
    [("so 72.\n#### 72", "72"), ("#### 1,234", "1234"), ("#### -5", "-5"), ("#### 2.5", "2.5")],
)
def test_gsm8k_gold(answer, gold):
    assert gsm8k_gold(answer) == gold


def test_gsm8k_row_without_gold_names_the_row(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(
        json.dumps({"question": "q", "answer": "#### 3"}) + "\n" + json.dumps({"question": "q", "answer": "no"})
    )
    with pytest.raises(SuzakError, match="row 1"):
        gsm8k(path=str(path))


def _write_r1v_eval(tmp_path, n=3, missing=()):
    (tmp_path / "images").mkdir()
    lines = []
    for i in range(n):
        name = f"images/superCLEVR_new_{25000 + i:06d}.png"
        if i not in missing:
            Image.new("RGB", (64 + 10 * i, 48), (i * 40, 0, 0)).save(tmp_path / name)
        lines.append({"image_path": f"./{name}", "question": "How many different items are there in the image?",
                      "ground_truth": i + 3})  # fmt: skip
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return path


def test_jsonl_r1v_eval_format(tmp_path):
    ds = jsonl(_write_r1v_eval(tmp_path), template="r1v_eval")
    assert {"prompt", "image", "solution", "problem", "image_path", "line"} <= set(ds.column_names)
    assert ds["solution"] == ["3", "4", "5"]
    row = ds[1]
    assert isinstance(row["image"], Image.Image) and row["image"].size == (74, 48)
    assert row["prompt"][0]["content"][0]["type"] == "image"
    assert _user_text(row["prompt"]) == render_prompt("r1v_eval", "How many different items are there in the image?")


def test_jsonl_gold_lists_stay_json(tmp_path):
    """A line's list gold reaches the rewards as JSON: OCR's accepted answers (Python's str() would quote them with
    ', which no reward reads as a list) and a box."""
    from suzak.scoring.parsing import gold_texts

    Image.new("RGB", (8, 8)).save(tmp_path / "page.png")
    lines = [{"image": "page.png", "question": "Total?", "solution": ["$ 2,500", "2,500"]},
             {"image": "page.png", "question": "Where?", "solution": [1, 2.5, 3, 4]}]  # fmt: skip
    (tmp_path / "ocr.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    ds = jsonl(tmp_path / "ocr.jsonl", template="plain")
    assert ds["solution"] == ['["$ 2,500", "2,500"]', "[1, 2.5, 3, 4]"]
    assert gold_texts(ds["solution"][0]) == ["$ 2,500", "2,500"]


def test_jsonl_image_root(tmp_path):
    path = _write_r1v_eval(tmp_path)
    moved = tmp_path / "elsewhere.jsonl"
    moved.write_text(path.read_text())
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "x.jsonl").write_text(path.read_text())
    with pytest.raises(SuzakError, match="3 image"):
        jsonl(tmp_path / "sub" / "x.jsonl")
    assert len(jsonl(tmp_path / "sub" / "x.jsonl", image_root=tmp_path)) == 3


def test_jsonl_missing_images_named_and_counted(tmp_path):
    path = _write_r1v_eval(tmp_path, n=4, missing=(1, 3))
    with pytest.raises(SuzakError, match=r"2 image\(s\) missing, first .*superCLEVR_new_025001\.png"):
        jsonl(path)


@pytest.mark.parametrize(
    "line,message",
    [
        ("{not json", r"prompts\.jsonl:2: not valid JSON"),
        ('{"image": "a.png", "solution": "3"}', r"prompts\.jsonl:2: need a question"),
        ('{"question": "q"}', r"prompts\.jsonl:2: no image"),
    ],  # gold: optional
)
def test_jsonl_bad_lines_named(tmp_path, line, message):
    path = _write_r1v_eval(tmp_path, n=1)
    path.write_text(path.read_text() + line + "\n")
    with pytest.raises(SuzakError, match=message):
        jsonl(path)


def test_hub_builder_offline_is_one_clear_line():
    start = time.monotonic()
    with pytest.raises(SuzakError) as info:
        build_dataset("clevr_cogen")
    assert time.monotonic() - start < 15
    message = str(info.value)
    assert "leonardPKU/clevr_cogen_a_train" in message and "\n" not in message
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_unknown_dataset_lists_builders():
    with pytest.raises(SuzakError, match="clevr_synthetic"):
        build_dataset("no_such_dataset")


def test_clevr_synthetic_columns_and_determinism(tmp_path):
    ds = clevr_synthetic(6, seed=5, progress=False, cache_dir=str(tmp_path / "c1"))
    assert {"prompt", "image", "solution", "problem", "count", "scene", "question_type"} <= set(ds.column_names)
    for row in ds:
        assert row["solution"] == f"<answer> {row['count']} </answer>"
        assert _user_text(row["prompt"]) == render_prompt("r1v", row["problem"])
        assert row["prompt"][0]["content"][0]["type"] == "image"
        assert isinstance(row["image"], Image.Image) and row["image"].size == (320, 240)
    again = clevr_synthetic(3, seed=5, start=3, progress=False, cache_dir=str(tmp_path / "c2"))
    assert again["scene"] == ds["scene"][3:] and again["problem"] == ds["problem"][3:]
    assert list(again[0]["image"].getdata()) == list(ds[3]["image"].getdata())


def test_data_cli_clevr_sizes_and_zoom(tmp_path, monkeypatch):
    """`python -m suzak.data clevr_synthetic --sizes large --zoom 2` reaches the generator."""
    import json

    from suzak.data.builders import main

    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    main(["clevr_synthetic", "--output", str(tmp_path / "out"), "--num_rows", "4", "--min_objects", "1",
          "--max_objects", "2", "--sizes", "large", "--zoom", "2", "--template", "plain"])  # fmt: skip
    back = build_dataset(str(tmp_path / "out"))
    objects = [o for scene in back["scene"] for o in json.loads(scene)["objects"]]
    assert objects and {o["size"] for o in objects} == {"large"} and set(back["count"]) <= {1, 2}
    assert _user_text(back[0]["prompt"]) == back[0]["problem"]  # the plain template: the question alone


@pytest.mark.parametrize("fmt", ["disk", "parquet"])
def test_saved_dataset_reloads(tmp_path, fmt):
    ds = clevr_synthetic(4, seed=1, progress=False, cache_dir=str(tmp_path / "cache"))
    out = save_dataset(ds, tmp_path / "saved", fmt)
    back = build_dataset(str(out))
    assert back["solution"] == ds["solution"] and back["problem"] == ds["problem"]
    assert isinstance(back[0]["image"], Image.Image)


def test_gsm8k_synthetic_rows_are_valid_gsm8k(tmp_path):
    import re

    from suzak.data.builders import gsm8k_synthetic

    ds = gsm8k_synthetic(60, seed=3)
    assert {"prompt", "solution", "question", "answer"} <= set(ds.column_names)
    assert ds["question"] == gsm8k_synthetic(60, seed=3)["question"]  # deterministic
    assert len(set(ds["question"])) == 60
    for row in ds:
        calcs = re.findall(r"<<([^=<>]+)=(-?\d+)>>", row["answer"])
        assert calcs, row["answer"]
        for expression, value in calcs:  # every calculator annotation is right
            assert eval(expression) == int(value)  # noqa: S307 - digits and + - * only
        assert row["solution"] == calcs[-1][1]
        assert row["answer"].splitlines()[-1] == f"#### {int(row['solution']):,}"
    out = tmp_path / "wp.jsonl"
    result = subprocess.run(
        [sys.executable, "-m", "suzak.data", "gsm8k_synthetic", "--num_rows", "3", "--output", str(out), "--format", "jsonl"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "wrote 3 rows" in result.stdout
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [sorted(line) for line in lines] == [["answer", "question"]] * 3
    assert build_dataset(str(out))["solution"] == gsm8k_synthetic(3)["solution"]


@pytest.mark.parametrize(
    ("name", "options", "valid"),
    [
        ("gsm8k_synthetic", {"num_row": 5}, "num_rows, seed, start, template"),
        ("gui_click", {"num_row": 5}, "num_rows, seed, start, min_width, max_width"),
        ("clevr_synthetic", {"num_row": 5}, "num_rows, seed, start, min_objects"),
        ("clevr_cogen", {"splits": "train"}, "split, template, revision, cache_dir"),
        ("geoqa_r1v", {"streaming": True}, "split, template, revision, cache_dir"),
        ("gsm8k", {"paths": "x.jsonl"}, "split, path, template, revision, cache_dir"),
        ("jsonl", {"root": "."}, "path, image_root, template"),
        ("openai/gsm8k", {"seed": 1}, "split, path, template"),
    ],
)
def test_every_builder_rejects_an_unknown_option_by_name(name, options, valid):
    with pytest.raises(SuzakError) as info:
        build_dataset(name, **options)
    message = str(info.value)
    (unknown,) = options
    assert f"dataset {name!r}: unknown option {unknown!r}" in message and valid in message and "\n" not in message


def test_local_files_and_folders_reject_unknown_options(gsm8k_jsonl, tmp_path):
    with pytest.raises(SuzakError, match=r"unknown option 'num_rows' .*its options: image_root, template$"):
        build_dataset(str(gsm8k_jsonl), num_rows=5)
    clevr_synthetic(4, progress=False).save_to_disk(str(tmp_path / "saved"))
    with pytest.raises(SuzakError, match=r"unknown option 'seed' .*its options: template, split$"):
        build_dataset(str(tmp_path / "saved"), seed=0)
    assert len(build_dataset(str(tmp_path / "saved"), template="r1v")) == 4


def test_a_dataset_options_typo_in_training_is_one_line(tmp_path):
    result = subprocess.run([sys.executable, "-m", "suzak.train", "--config", "recipes/smoke.yaml", "--output_dir",
                             str(tmp_path), "--dataset_options", '{"num_row": 5}'], capture_output=True, text=True,
                            timeout=300)  # fmt: skip
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert (
        result.stderr.strip().splitlines()[-1].startswith("error: dataset 'clevr_synthetic': unknown option 'num_row'")
    )
