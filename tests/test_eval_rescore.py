"""Re-scoring results files: R1-V's own logs reproduce R1-V's stored figures under ``r1v`` and suzak's under
``strict``; a file suzak wrote reproduces its own flags; the command and its one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from suzak.eval import cli
from suzak.eval.report import write_results
from suzak.eval.rescore import JSON_KEYS, read_results, rescore_file, rescore_results
from suzak.eval.runner import result_row
from suzak.eval.tasks import EvalItem, get_task

R1V_LOGS = Path(__file__).parent / "fixtures" / "r1v"
GEOQA_TRAINED = R1V_LOGS / "geoqa_test_qwen2vl_7b_grpo_2epochs_legacy.json"

# (R1-V's log, task, R1-V's stored correct count, suzak's strict count on the same outputs)
LOGS = [
    ("counting_results_superclevr_200_qwen2vl_2b_instruct_legacy.json", "superclevr", 96, 96),
    ("counting_results_superclevr_200_qwen2vl_2b_instruct_grpo100_legacy.json", "superclevr", 165, 165),
    ("geoqa_test_qwen2vl_7b_instruct_legacy.json", "geoqa", 231, 226),
    ("geoqa_test_qwen2vl_7b_grpo_2epochs_legacy.json", "geoqa", 292, 270),
]


@pytest.fixture(scope="module")
def rescored_logs() -> dict:
    """Each R1-V log re-scored once (both rules are computed either way)."""
    return {name: rescore_file(R1V_LOGS / name, task) for name, task, _, _ in LOGS}


def stored_flags(result: dict) -> bool:
    """R1-V's verdict on one result: ``is_correct`` (GeoQA); the counting script compared extracted with gold."""
    return result["is_correct"] if "is_correct" in result else result["extracted_answer"] == result["ground_truth"]


@pytest.mark.parametrize(("name", "task", "r1v_correct", "strict_correct"), LOGS)
def test_r1v_rule_reproduces_r1v_logs(rescored_logs, name, task, r1v_correct, strict_correct):
    data = json.loads((R1V_LOGS / name).read_text())
    rescored = rescored_logs[name]
    assert rescored.accuracy == pytest.approx(data["accuracy"], abs=0.005)  # R1-V's stored accuracy, to 0.01 points
    assert (rescored.correct, rescored.total) == (r1v_correct, len(data["results"]))
    assert rescored.flags["r1v"] == [stored_flags(r) for r in data["results"]]  # every verdict, not just the count
    assert (rescored.other_scoring, rescored.other_correct) == ("strict", strict_correct)
    assert rescored.disagreements == [
        i for i, (a, b) in enumerate(zip(*rescored.flags.values(), strict=True)) if a != b
    ]


@pytest.mark.parametrize(("name", "task"), [(name, task) for name, task, _, _ in LOGS])
def test_r1v_rule_reproduces_r1v_extracted_answers(rescored_logs, name, task):
    stored = [r["extracted_answer"] for r in json.loads((R1V_LOGS / name).read_text())["results"]]
    extracted = rescored_logs[name].extracted["r1v"]
    if task == "superclevr":
        assert extracted == stored
    else:  # math-verify 0.9 writes one symbol-only answer in lower case ((c*d)/((a*b)) for (C*D)/((A*B)))
        assert [None if e is None else e.lower() for e in extracted] == [None if e is None else e.lower()
                                                                         for e in stored]  # fmt: skip


def test_published_figures_under_each_rule(rescored_logs):
    """The issue's numbers: GeoQA 38.73 / 30.64 under R1-V's rule, 35.81 / 29.97 under suzak's; SuperCLEVR equal."""
    figures = {name: (round(r.accuracy, 2), round(r.other_accuracy, 2)) for name, r in rescored_logs.items()}
    assert [figures[name] for name, *_ in LOGS] == [(48.0, 48.0), (82.5, 82.5), (30.64, 29.97), (38.73, 35.81)]
    assert [len(rescored_logs[name].disagreements) for name, *_ in LOGS] == [0, 0, 25, 24]


def test_file_written_by_suzak_reproduces_its_flags(tmp_path):
    """suzak's own results (both rules' flags) re-score to the same verdicts under either rule."""
    outputs = json.loads(GEOQA_TRAINED.read_text())["results"][100:300]  # a span where the two rules disagree
    task = get_task("geoqa")
    rows = [result_row(task, EvalItem(i, str(i), r["question"], [], r["ground_truth"]), r["model_output"], "strict")
            for i, r in enumerate(outputs)]  # fmt: skip
    path = tmp_path / "geoqa_results_run.json"
    stored = write_results(path, rows, "strict", "r1v")
    rescored = rescore_file(path, "geoqa", "strict")  # the rule that wrote it
    assert rescored.flags["strict"] == [r["is_correct"] for r in rows] == [r["is_correct_strict"] for r in rows]
    assert rescored.flags["r1v"] == [r["is_correct_r1v"] for r in rows]
    assert rescored.accuracy == rescored.stored_accuracy == stored
    assert round(rescored.other_accuracy, 9) == round(json.loads(path.read_text())["other_accuracy"], 9)
    assert len(rescored.disagreements) > 0  # the span really does hold outputs the two rules score differently


def test_rescore_command_prints_both_rules_and_writes_json(tmp_path, capsys):
    out = tmp_path / "nested" / "rescored.json"
    cli.main(["rescore", str(GEOQA_TRAINED), "--task", "geoqa", "--json", str(out)])
    printed = capsys.readouterr().out.splitlines()
    assert "Accuracy: 38.73%" in printed
    assert any(line.startswith("strict scoring (suzak's") and "35.81% (270 / 754)" in line for line in printed)
    assert any(line.startswith("The rules disagree on 24 result(s) (indices 117,") for line in printed)
    assert "stored accuracy 38.73%" in printed[0]
    data = json.loads(out.read_text())
    assert tuple(data) == JSON_KEYS
    assert (data["task"], data["scoring"], data["correct"], data["total"]) == ("geoqa", "r1v", 292, 754)
    assert round(data["accuracy"], 2) == 38.73 and round(data["other_accuracy"], 2) == 35.81
    assert (data["other_scoring"], data["disagreements"]) == ("strict", 24)
    cli.main(["rescore", str(GEOQA_TRAINED), "--task", "geoqa", "--scoring", "strict"])
    assert "Accuracy: 35.81%" in capsys.readouterr().out.splitlines()


def test_python_m_suzak_eval_rescore_beside_the_task_commands(tmp_path):
    """The subcommand dispatch leaves task parsing alone: both work through python -m suzak.eval."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    log = R1V_LOGS / LOGS[1][0]
    proc = subprocess.run([sys.executable, "-m", "suzak.eval", "rescore", str(log), "--task", "superclevr"],
                          capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Accuracy: 82.50%" in proc.stdout.splitlines()
    proc = subprocess.run([sys.executable, "-m", "suzak.eval", "rescore_me", "--model_path", "m"],
                          capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert proc.returncode == 2 and "invalid choice: 'rescore_me'" in proc.stderr  # still a task name position


def _results_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "results.json"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, "results.json: no such file"),
        ('{"accuracy": 50.0, "results": [', "results.json: not JSON (line 1, column 32: Expecting value)"),
        ('{"accuracy": 50.0}', "results.json: not a results file: expected an object with a 'results' list"),
        ('[{"model_output": "x", "ground_truth": 3}]', "results.json: not a results file"),
        ('{"results": []}', "results.json: the 'results' list is empty"),
        ('{"results": [{"model_output": "<answer>3</answer>", "ground_truth": 3}, {"ground_truth": 3}]}',
         "results.json: results[1] has no 'model_output'"),
        ('{"results": [{"model_output": "<answer>3</answer>"}]}', "results.json: results[0] has no 'ground_truth'"),
        ('{"results": [{"model_output": "x", "ground_truth": null}]}',
         "results.json: results[0] has no 'ground_truth' (null)"),
        ('{"results": [{"model_output": 3, "ground_truth": 3}]}', "results[0]: 'model_output' is a int, not text"),
        ('{"results": ["x"]}', "results.json: results[0] is a str, not an object"),
        ('{"results": [{"model_output": "x", "ground_truth": 3}, {"model_output": "x", "ground_truth": "lots"}]}',
         "results.json: results[1]: cannot score it: gold answer 'lots' is not a count"),
    ],
)  # fmt: skip
def test_bad_results_file_is_one_line(tmp_path, text, message):
    path = tmp_path / "results.json" if text is None else _results_file(tmp_path, text)
    with pytest.raises(SystemExit) as info:
        cli.main(["rescore", str(path), "--task", "superclevr"])
    error = str(info.value)
    assert error.startswith(f"error: {tmp_path}") and message in error and "\n" not in error


def test_rescore_refuses_what_a_task_lacks(tmp_path):
    with pytest.raises(SystemExit):  # argparse: gsm8k has no r1v rule, so it is not a rescore task
        cli.main(["rescore", str(GEOQA_TRAINED), "--task", "gsm8k"])
    results, stored = read_results(R1V_LOGS / LOGS[0][0])
    assert len(results) == 200 and stored == 48.0
    gsm8k = rescore_results([{"model_output": "#### 18", "ground_truth": "18"}], "gsm8k", "strict")
    assert (gsm8k.accuracy, gsm8k.other_scoring, gsm8k.disagreements) == (100.0, None, [])
