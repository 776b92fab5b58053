"""Run outputs: metrics.csv and completions.csv streamed during training, checkpoint markers, plots, secrets."""

from __future__ import annotations

import csv
import logging
import subprocess
import sys
from collections import defaultdict, deque
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from suzak.runs.checkpoints import MARKER, checkpoint_problem
from suzak.runs.plots import plot_run
from suzak.runs.record import recipe_as_run, save_recipe, start_run
from suzak.runs.redaction import MASK, RedactingFilter, is_secret_name, redact, secret_values
from suzak.runs.streams import CSVStream, MetricsCSVCallback, add_run_callbacks
from suzak.scoring.parsing import message_text
from suzak.training.configs import parse_args
from suzak.trl_internals.completions import completion_rows
from test_trainer import image_dataset, length_reward, make_trainer

ROOT = Path(__file__).resolve().parents[1]
SMOKE = str(ROOT / "recipes" / "smoke.yaml")


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


# --- CSV streams ---------------------------------------------------------------------------------------------------


def test_csv_stream_adds_columns_and_keeps_rows(tmp_path):
    stream = CSVStream(tmp_path / "m.csv")
    stream.append([{"step": 1, "loss": 0.5}])
    stream.append([{"step": 2, "loss": 0.4, "kl": 0.01}, {"step": 3, "kl": 0.02}])
    rows = read_csv(tmp_path / "m.csv")
    assert [r["step"] for r in rows] == ["1", "2", "3"]
    assert rows[0] == {"step": "1", "loss": "0.5", "kl": ""} and rows[2]["loss"] == ""
    again = CSVStream(tmp_path / "m.csv")  # a resumed run picks up the header
    assert again.columns == ["step", "loss", "kl"]
    assert again.drop_after(1) == 2 and [r["step"] for r in read_csv(tmp_path / "m.csv")] == ["1"]


def test_metrics_callback_writes_every_scalar_each_log(tmp_path):
    callback = MetricsCSVCallback(tmp_path)
    args = SimpleNamespace(output_dir=str(tmp_path))
    state = SimpleNamespace(global_step=0, is_world_process_zero=True)
    callback.on_train_begin(args, state, None)
    for step in (1, 2):
        state.global_step = step
        callback.on_log(
            args, state, None, logs={"loss": 0.1 * step, "reward": None, "note": "text", "kl": float("nan")}
        )
    rows = read_csv(tmp_path / "metrics.csv")
    assert [(r["step"], r["loss"], r["reward"], r["kl"]) for r in rows] == [("1", "0.1", "", ""), ("2", "0.2", "", "")]
    assert "note" not in rows[0] and rows[0]["time"].endswith("+00:00")
    state.global_step = 1  # resumed from checkpoint-1: step 2 will be logged again
    callback.on_train_begin(args, state, None)
    assert [r["step"] for r in read_csv(tmp_path / "metrics.csv")] == ["1"]


def trl_logs(batches: list[int]) -> dict:
    """TRL's ``GRPOTrainer._logs`` layout (deques sized to the generation batch), filled with numbered rows."""
    size = 4
    logs = {
        "images": deque(maxlen=size), "prompt": deque(maxlen=size), "completion": deque(maxlen=size),
        "rewards": defaultdict(lambda: deque(maxlen=size)), "advantages": deque(maxlen=size),
        "extra": defaultdict(lambda: deque(maxlen=size)),
    }  # fmt: skip
    for batch in batches:
        for i in range(size):
            logs["prompt"].append(
                [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": f"q{batch}"}]}]
            )
            logs["completion"].append([{"role": "assistant", "content": f"<answer>{i}</answer>"}])
            logs["rewards"]["accuracy"].append(float(i % 2))
            logs["rewards"]["format"].append(float("nan") if i == 3 else 1.0)
            logs["advantages"].append(i - 1.5)
            logs["extra"]["accuracy/answer"].append(str(i))
    return logs


def test_completion_rows_take_the_newest_batch_from_trl_logs():
    rows = completion_rows(trl_logs([1, 2]), [f"index:{i}" for i in range(4)], step=7, reward_weights=[1.0, 0.5],
                           extra_columns={"accuracy/answer"}, text=message_text)  # fmt: skip
    assert len(rows) == 4 and {r["step"] for r in rows} == {7}
    first = rows[1]
    assert (
        first["prompt"] == "<image>q2" and first["completion"] == "<answer>1</answer>" and first["image"] == "index:1"
    )
    assert (first["reward/accuracy"], first["reward/format"], first["reward"]) == (1.0, 1.0, 1.5)
    assert rows[3]["reward/format"] == "" and rows[3]["reward"] == 1.0  # a skipped (None) reward counts as nothing
    assert first["advantage"] == -0.5 and first["accuracy/answer"] == "1"
    newer = completion_rows(trl_logs([1]), ["a"] * 4, step=1, text=message_text)
    assert "accuracy/answer" not in newer[0]  # not written this batch


def test_training_streams_completions_and_metrics(tiny_model_dir, tmp_path):
    """The hook on TRL's ``_logs`` (a private structure): fails loudly if a TRL upgrade changes it."""
    dataset = image_dataset().add_column("index", list(range(8)))
    trainer = make_trainer(tiny_model_dir, tmp_path, dataset, [length_reward], save_strategy="steps", save_steps=1,
                           log_completions=True)  # fmt: skip
    add_run_callbacks(trainer)
    trainer.train()
    out = Path(trainer.args.output_dir)
    # TRL's own completions table (parquet here, W&B when reporting) gets text prompts; its _logs are left as they were
    table = pd.read_parquet(sorted((out / "completions").glob("*.parquet"))[0])
    assert all(isinstance(p, str) and p.startswith("<image>") for p in table["prompt"])
    assert isinstance(trainer._logs["prompt"][0], list)
    completions = read_csv(out / "completions.csv")
    assert len(completions) == 2 * 4  # 2 steps x (2 prompts x 2 generations)
    assert [r["step"] for r in completions] == ["1"] * 4 + ["2"] * 4
    assert {"prompt", "image", "completion", "reward/length_reward", "reward", "advantage"} <= set(completions[0])
    assert all(r["image"].startswith("index:") and "scene" in r["prompt"] for r in completions)
    lengths = [float(r["reward/length_reward"]) for r in completions]
    assert lengths == [float(len(r["completion"])) for r in completions]  # the reward of that very completion
    metrics = read_csv(out / "metrics.csv")
    assert [r["step"] for r in metrics if r["loss"]] == ["1", "2"]
    assert all(r["rewards/length_reward/mean"] for r in metrics if r["loss"])
    assert any(r["train_runtime"] for r in metrics)  # the end-of-training summary is a row too
    for step in (1, 2):
        assert (out / f"checkpoint-{step}" / MARKER).is_file() and checkpoint_problem(
            out / f"checkpoint-{step}"
        ) is None


# --- plots ---------------------------------------------------------------------------------------------------------


def write_metrics(folder: Path, steps: int = 5) -> Path:
    stream = CSVStream(folder / "metrics.csv")
    for step in range(1, steps + 1):
        stream.append([{"step": step, "loss": 0.1, "learning_rate": 1e-6 * step, "rewards/clevr_count/mean": step / 10,
                        "rewards/think_format/mean": 0.5, "reward": step / 10 + 0.5, "kl": 0.01 * step,
                        "completions/mean_length": 100 + step, "clip_ratio/region_mean": 0.0, "step_time": 3.0}])  # fmt: skip
    stream.append([{"step": 5, "eval/accuracy": 0.4}, {"step": 5, "train_runtime": 15.0}])
    return folder


def test_plot_command_writes_nonempty_pngs(tmp_path):
    write_metrics(tmp_path)
    result = subprocess.run([sys.executable, "-m", "suzak", "plot", str(tmp_path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    pngs = sorted(p.name for p in (tmp_path / "plots").glob("*.png"))
    assert pngs == sorted(["rewards.png", "accuracy.png", "kl.png", "completion_length.png", "clip_ratio.png",
                           "learning_rate.png", "step_time.png", "loss.png"])  # fmt: skip
    for png in (tmp_path / "plots").glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert "8 plot(s)" in result.stdout


def test_plot_skips_unlogged_metrics_and_reads_old_runs(tmp_path):
    import json

    (tmp_path / "checkpoint-3").mkdir()
    history = [{"step": s, "loss": 0.1, "learning_rate": 1e-6} for s in (1, 2, 3)]
    (tmp_path / "checkpoint-3" / "trainer_state.json").write_text(json.dumps({"log_history": history}))
    assert sorted(p.name for p in plot_run(tmp_path)) == ["learning_rate.png", "loss.png"]


def test_plot_without_metrics_is_one_line(tmp_path):
    result = subprocess.run([sys.executable, "-m", "suzak", "plot", str(tmp_path)], capture_output=True, text=True)
    assert result.returncode == 1 and result.stderr.strip().startswith("error: no metrics.csv")


# --- secrets -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "secret"),
    [("HF_TOKEN", True), ("WANDB_API_KEY", True), ("MY_SERVICE_TOKEN", True), ("AWS_SECRET", True),
     ("DB_PASSWORD", True), ("OPENAI_API_KEY", True), ("hub_token", True), ("pad_token", False),
     ("max_new_tokens", False), ("WANDB_PROJECT", False), ("TOKENIZERS_PARALLELISM", False), ("KEY", False)],
)  # fmt: skip
def test_secret_names(name, secret):
    assert is_secret_name(name) is secret


def test_redaction_of_env_values_in_text_dicts_and_logs(monkeypatch, capsys):
    monkeypatch.setenv("MY_SERVICE_TOKEN", "svc-FAKE-0001")
    monkeypatch.setenv("SHORT_KEY", "abc")  # too short to be masked without mangling ordinary text
    assert "svc-FAKE-0001" in secret_values() and "abc" not in secret_values()
    assert redact({"a": ["x svc-FAKE-0001 y"], "hub_token": "anything"}) == {"a": [f"x {MASK} y"], "hub_token": MASK}
    logger = logging.getLogger("test-redaction")
    handler = logging.StreamHandler(sys.stdout)
    handler.addFilter(RedactingFilter())
    logger.addHandler(handler)
    try:
        logger.warning("token is %s", "svc-FAKE-0001")
    finally:
        logger.removeHandler(handler)
    assert capsys.readouterr().out.strip() == f"token is {MASK}"


def test_recipe_as_run_masks_secrets_and_keeps_overrides(monkeypatch, tmp_path):
    from suzak.training.configs import full_argv

    monkeypatch.setenv("HF_TOKEN", "hf_FAKEsecret123")
    argv = ["--config", SMOKE, "--max_steps", "3", "--hub_token", "hf_typedONCLI", "--run_name", "x-hf_FAKEsecret123"]
    recipe = recipe_as_run(full_argv(argv), parse_args(argv))
    assert recipe["max_steps"] == 3 and "hub_token" not in recipe and recipe["run_name"] == f"x-{MASK}"
    assert recipe["model_name_or_path"] == "tiny" and recipe["rewards"] == ["clevr_count", "think_format"]
    save_recipe(tmp_path, full_argv(argv), parse_args(argv))
    start_run(tmp_path, argv, parse_args(argv))
    for name in ("recipe.yaml", "run_info.json"):
        text = (tmp_path / name).read_text()
        assert "hf_typedONCLI" not in text and "hf_FAKEsecret123" not in text and MASK in text
    rerun = parse_args(["--config", str(tmp_path / "recipe.yaml")])  # the saved recipe runs again
    assert rerun[1].max_steps == 3 and rerun[0].max_pixels == 50176


def test_run_name_comes_from_the_recipe():
    from suzak.training.session import setup_reporting

    _, grpo, _ = parse_args(["--config", SMOKE])
    setup_reporting(grpo, recipe=SMOKE)
    assert grpo.run_name == "smoke"
    _, grpo, _ = parse_args(["--config", SMOKE, "--run_name", "mine"])
    setup_reporting(grpo, recipe=SMOKE)
    assert grpo.run_name == "mine"
