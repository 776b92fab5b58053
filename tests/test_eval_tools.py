"""``python -m suzak.eval ... --tools zoom``: the evaluation's tool loop (suzak.eval.tool_loop) on the tiny model taught
the zoom call by a short SFT, its flags' checks, and the tool settings in the resume check."""

from __future__ import annotations

import json

import numpy as np
import pytest

from suzak import SuzakError
from suzak.eval.runner import EvalConfig, PartialStore, _settings, default_budget, eval_task
from suzak.media.vision import PixelBudget, images_of

BUDGET = PixelBudget(3136, 3136)  # the 224-pixel images seen at 2x2 visual tokens; crops at the same budget


def zoom_jsonl(folder, num_rows: int = 4):
    """zoom_checks rows as suzak.eval's jsonl task reads them (images as PNGs, the question's box kept)."""
    from suzak.data.zoom import QUESTION
    from suzak.selftest import zoom_dataset

    folder.mkdir(parents=True, exist_ok=True)
    rows = list(zoom_dataset(num_rows, 5, factor=28, slots=1))
    with open(folder / "zoom.jsonl", "w") as handle:
        for i, row in enumerate(rows):
            row["image"].save(folder / f"{i}.png")
            line = {"problem": QUESTION, "solution": row["solution"], "image_path": f"{i}.png",
                    "question_boxes": row["question_boxes"]}  # fmt: skip
            handle.write(json.dumps(line) + "\n")
    return folder / "zoom.jsonl", rows


def eval_config(model_path, data, output, **overrides) -> EvalConfig:
    settings = dict(task="jsonl", model_path=str(model_path), prompt_path=str(data), reward="word_match",
                    prompt_template="plain", output_path=str(output), min_pixels=3136, max_pixels=3136,
                    max_new_tokens=160, batch_size=4, progress=False, tools=["zoom"], max_tool_calling_iterations=1)  # fmt: skip
    return EvalConfig(**(settings | overrides))


@pytest.fixture(scope="module")
def zoom_prior(zoom_prior_dir):
    return zoom_prior_dir


def test_hf_eval_with_zoom_calls_crops_the_original_and_counts(zoom_prior, tmp_path, monkeypatch):
    """Every row zooms; the next turn's images are the row's image and a crop of the *original* image (the checks
    pixel for pixel, which the 56-pixel view has averaged to grey); the results keep every turn and the report the
    counts."""
    from suzak.eval import engine as engine_module
    from suzak.eval.runner import evaluate

    data, rows = zoom_jsonl(tmp_path / "data")
    rounds = []
    generate_ids = engine_module.HFEngine.generate_ids

    def spy(self, batch, prompts, temperature, seed):
        rounds.append([images_of(row) for row in batch])
        return generate_ids(self, batch, prompts, temperature, seed)

    monkeypatch.setattr(engine_module.HFEngine, "generate_ids", spy)
    report = evaluate(eval_config(zoom_prior, data, tmp_path / "out.json"))
    results = json.loads((tmp_path / "out.json").read_text())["results"]
    assert [r["tool_calls"] for r in results] == [1] * len(rows)
    assert all("<tool_call>" in r["turns"] and "[zoom] <image>" in r["turns"] for r in results)
    assert all(r["turns"].endswith(r["model_output"]) for r in results)  # the last turn is what is scored
    assert len(rounds) == 2 and all(len(images) == 1 for images in rounds[0])
    for row, images in zip(rows, rounds[1], strict=True):
        view, crop = images
        assert view.tobytes() == row["image"].tobytes()  # the original, fitted by the engine as in training
        x1, y1, x2, y2 = row["question_boxes"][0]
        expected = row["image"].crop((x1, y1, x2, y2))  # the call the prior teaches: the question's box
        assert crop.size == expected.size and crop.tobytes() == expected.tobytes()
        seen = np.asarray(PixelBudget(3136, 3136, factor=28).fit(row["image"]), dtype=int)
        assert np.asarray(crop, dtype=int).std() > 5 * seen.std()  # detail the whole view cannot show
    counts = report.greedy.extra["tools"]
    assert counts["tool_calls_per_row"] == 1.0 and counts["rows_with_calls"] == len(rows)
    summary = json.loads((tmp_path / "out.summary.json").read_text())
    assert summary["greedy"]["extra"]["tools"] == counts and summary["settings"]["tools"] == ["zoom"]
    assert "| greedy | 1.00 | 4 / 4 |" in (tmp_path / "out.md").read_text()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"tool_max_pixels": 1000}, "--tool_max_pixels 1000 must lie between min_pixels 3136 and max_pixels 3136"),
        ({"tool_max_visual_tokens": 0}, "--tool_max_visual_tokens must be at least 1, got 0"),
        ({"max_tool_calling_iterations": -1}, "--max_tool_calling_iterations must be at least 0, got -1"),
        ({"tools": ["zoomm"]}, "--tools: unknown tool 'zoomm'"),
        ({"tools": ["zoom", "zoom"]}, "--tools: 'zoom' is listed twice"),
        ({"tools": [], "max_tool_calling_iterations": 2}, "--tools is empty"),
    ],
)
def test_bad_tool_flags_are_one_line_before_any_model_loads(tmp_path, flags, message):
    with pytest.raises(SuzakError, match=message):
        eval_config(tmp_path / "no_model", tmp_path / "none.jsonl", tmp_path / "out.json", **flags)


def test_bad_tool_flag_on_the_command_line(tmp_path):
    from suzak.eval.cli import main

    with pytest.raises(SystemExit, match="^error: --tool_max_pixels 1000 must lie between"):
        main(["jsonl", "--model_path", "tiny", "--reward", "word_match", "--tools", "zoom", "--min_pixels", "3136",
              "--tool_max_pixels", "1000"])  # fmt: skip


def test_a_resumed_run_with_other_tools_is_refused(tmp_path):
    data = tmp_path / "none.jsonl"
    with_tools = eval_config("m", data, tmp_path / "out.json")
    without = eval_config("m", data, tmp_path / "out.json", tools=[], max_tool_calling_iterations=None)
    task = eval_task(with_tools)
    budget = default_budget(with_tools)
    record = {"model_output": "red", "turns": "<tool_call>...\n[zoom] <image>\nred", "tool_calls": 1,
              "tool_failures": {}}  # fmt: skip
    PartialStore(tmp_path / "out.json", _settings(with_tools, task, budget)).append([("0:a", record)])
    assert PartialStore(tmp_path / "out.json", _settings(with_tools, task, budget)).load() == {"0:a": record}
    with pytest.raises(SuzakError, match=r"other settings \(.*tools: \['zoom'\] → None"):
        PartialStore(tmp_path / "out.json", _settings(without, task, budget)).load()
