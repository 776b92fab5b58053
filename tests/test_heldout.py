"""``suzak heldout``: a recipe's held-out evaluation on a checkpoint gives exactly what training logs for that model
(the same rows, scorers, budgets and answers), each mixture source by its own first reward."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run_ok

ROOT = Path(__file__).resolve().parents[1]


def test_heldout_of_a_checkpoint_is_what_training_logs_for_it_source_by_source(tmp_path, run_env):
    """A tiny model taught the colour words by SFT (20 steps) answers the mixture's colour rows and not its box rows;
    ``suzak heldout`` of the mixture recipe on it gives the figures and the answers, row for row, that a training run
    from it logs before its first step (eval/accuracy, eval/<source>/accuracy, eval_samples.csv)."""
    sft = tmp_path / "sft"
    run_ok([sys.executable, "-m", "suzak.sft", "--config", "recipes/sft_smoke.yaml", "--dataset_name", "color_squares",
            "--dataset_options", '{"num_rows": 128, "seed": 3}', "--prompt_template", "plain", "--rewards",
            "word_match", "--max_steps", "20", "--eval_rows", "0", "--max_length", "128", "--save_strategy", "no",
            "--output_dir", str(sft)], run_env)  # fmt: skip
    report = tmp_path / "heldout.json"
    result = run_ok([sys.executable, "-m", "suzak", "heldout", "--config", "recipes/mixture_smoke.yaml",
                     "--model_path", str(sft), "--output_path", str(report)], run_env)  # fmt: skip
    assert f"results saved to {report}" in result.stdout
    found = json.loads(report.read_text())
    run_ok([sys.executable, "-m", "suzak.train", "--config", "recipes/mixture_smoke.yaml", "--model_name_or_path",
            str(sft), "--max_steps", "1", "--output_dir", str(tmp_path / "run")], run_env)  # fmt: skip
    with open(tmp_path / "run" / "metrics.csv", newline="") as file:
        logged = next(row for row in csv.DictReader(file) if row.get("eval/accuracy") and row["step"] == "0")
    with open(tmp_path / "run" / "eval_samples.csv", newline="") as file:
        samples = [row for row in csv.DictReader(file) if row["step"] == "0"]
    assert found["sources"]["colour"]["accuracy"] > 50 and found["sources"]["colour"]["total"] == 8  # it answers
    assert found["accuracy"] == pytest.approx(100 * float(logged["eval/accuracy"]))
    assert {name: figures["accuracy"] for name, figures in found["sources"].items()} == pytest.approx({
        name: 100 * float(logged[f"eval/{name}/accuracy"]) for name in ("colour", "boxes")})  # fmt: skip
    assert [row["model_output"] for row in found["results"]] == [row["output"] for row in samples]
    assert [row["is_correct"] for row in found["results"]] == [row["correct"] == "True" for row in samples]
    assert [row["source"] for row in found["results"]] == ["colour"] * 8 + ["boxes"] * 8
    assert found["recipe"] == "recipes/mixture_smoke.yaml" and found["model_path"] == str(sft)
    # suzak eval's results format: suzak release reads it for the model card
    from suzak.release.model_card import load_eval_result

    entry = load_eval_result(report, "eval/heldout.json")
    assert entry.task == "heldout (mixture_smoke)" and entry.scores == {None: (found["accuracy"], found["correct"])}


def test_a_recipe_without_held_out_rows_is_one_line(run_env):
    result = subprocess.run([sys.executable, "-m", "suzak", "heldout", "--config", "recipes/mixture_smoke.yaml",
                             "--eval_rows", "0", "--model_path", "tiny"], cwd=ROOT, env=run_env, capture_output=True,
                            text=True, timeout=600)  # fmt: skip
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1] == (
        "error: the recipe holds out no rows (eval_rows 0): set eval_rows (e.g. --eval_rows 64)")  # fmt: skip
