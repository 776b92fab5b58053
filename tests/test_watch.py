"""``python -m suzak.watch``: the live view of a run, from the files the run's own writers produce."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import defaultdict, deque
from pathlib import Path
from types import SimpleNamespace

import pytest

from suzak import SuzakError
from suzak.runs.logfile import TrainLog
from suzak.runs.progress import CSVTail, before_after, eta_seconds, read_progress, seconds_per_step
from suzak.runs.record import finish_run, start_run
from suzak.runs.streams import CompletionsCSVCallback, MetricsCSVCallback
from suzak.scoring.parsing import message_text
from suzak.training.configs import parse_args
from suzak.trl_internals.completions import completion_rows
from suzak.watch import render, sparkline

ROOT = Path(__file__).resolve().parents[1]
DEMO = str(ROOT / "recipes" / "demo.yaml")


def _state(step: int) -> SimpleNamespace:
    return SimpleNamespace(is_world_process_zero=True, global_step=step)


def _batch(step: int, answers: list[str], golds: list[str]) -> list[dict]:
    """completions.csv rows of one scored batch, as VLMGRPOTrainer hands them over (TRL's ``_logs`` layout)."""
    scores = [float(a == g) for a, g in zip(answers, golds, strict=True)]
    logs = {"prompt": deque([[{"role": "user", "content": "What color is the image?"}]] * len(answers)),
            "completion": deque([[{"role": "assistant", "content": a}] for a in answers]),
            "rewards": defaultdict(deque, {"word_match": deque(scores)}), "advantages": deque([0.5] * len(answers)),
            "extra": {}}  # fmt: skip
    return completion_rows(
        logs, [f"index:{i}" for i in range(len(answers))], step, reward_weights=[1.0], text=message_text
    )


def make_run(folder: Path, steps: int = 6, max_steps: int = 10, seconds: int = 3) -> Path:
    """A run's output dir written by the run's own writers: run_info.json (recipe demo.yaml, max_steps), then per step
    a metrics row (time ``seconds`` apart) and a batch of completions."""
    argv = ["--config", DEMO, "--max_steps", str(max_steps), "--output_dir", str(folder)]
    start_run(folder, argv, parse_args(argv))
    metrics, completions = MetricsCSVCallback(folder), CompletionsCSVCallback(folder)
    args = SimpleNamespace(output_dir=str(folder))
    metrics.stream.append([{"step": 0, "time": "2026-11-23T10:00:00+00:00", "eval/accuracy": 0.0}])
    for step in range(1, steps + 1):
        reward = step / steps
        metrics.on_log(args, _state(step), None, logs={"reward": reward, "rewards/word_match/mean": reward,
                                                         "completions/mean_length": 1.0, "step_time": 2.5,
                                                         "loss": 0.01, "learning_rate": 1e-3})  # fmt: skip
        # the real callback stamps the wall clock; rewrite it so the speed is known
        rows = metrics.stream._read()[1]
        rows[-1]["time"] = f"2026-11-23T10:00:{seconds * step:02d}+00:00"
        metrics.stream._rewrite(rows)
        completions.write(_batch(step, ["red", "blue", "red, no"], ["red", "red", "red"]))
    metrics.stream.append([{"step": steps, "time": f"2026-11-23T10:00:{seconds * steps:02d}+00:00",
                            "eval/accuracy": 0.9}])  # fmt: skip
    return folder


def test_render_a_running_run(tmp_path):
    run = make_run(tmp_path / "run")
    progress = read_progress(run)
    assert (progress.status, progress.step, progress.max_steps) == ("running", 6, 10)
    frame = render(progress, width=100)
    assert "running · step 6/10 (60%) · 3.00 s/step · ETA 0:12" in frame  # 4 steps left at 3 s
    lines = {line.split()[0]: line for line in frame.splitlines() if line}
    assert lines["reward"].split()[1] == "1.000" and "▁▂▄▅▇█" in lines["reward"]  # 1/6 .. 6/6 rising
    assert lines["eval/accuracy"].split()[1] == "0.900" and "min 0.000 max 0.900 @6" in lines["eval/accuracy"]
    assert "newest completions (step 6; reward = weighted total of word_match)" in frame
    newest = frame.split("newest completions")[1].splitlines()[1:]
    assert [[cell.strip() for cell in line.split("|")] for line in newest] == [
        ["1.0", "red", "What color is the image?"], ["0.0", "blue", "What color is the image?"],
        ["0.0", "red, no", "What color is the image?"]]  # fmt: skip
    assert "\x1b[" not in frame and "\x1b[33mrunning" in render(progress, colour=True)


def test_eta_arithmetic():
    assert eta_seconds(87, 150, 0.5) == 31.5
    assert eta_seconds(200, 150, 0.5) == 0.0  # past max_steps: nothing left, never negative
    assert eta_seconds(3, None, 1.0) is None and eta_seconds(3, 0, 1.0) is None and eta_seconds(3, 10, None) is None
    rows = [{"step": 0.0, "time": "2026-11-23T10:00:00+00:00"}]  # the step-0 evaluation does not count as a step
    rows += [{"step": float(s), "time": f"2026-11-23T10:{s:02d}:00+00:00"} for s in range(1, 31)]  # 60 s per step
    rows[-1]["time"] = "2026-11-23T10:40:00+00:00"  # the newest step took longer: the recent pace counts
    assert seconds_per_step(rows, window=20) == pytest.approx((40 - 11) * 60 / 19)
    assert seconds_per_step(rows[:2]) is None  # one timed step: no pace yet


def test_sparkline_buckets_and_flat_series():
    assert sparkline(list(range(100)), 10) == "▁▁▂▃▄▅▆▇██"  # bucket means 4.5, 14.5, ... 94.5
    assert len(sparkline([0.0] * 50 + [1.0] * 50, 20)) == 20 and sparkline([0.0] * 50 + [1.0] * 50, 20)[0] == "▁"


def test_completions_tail_reads_only_new_whole_records(tmp_path):
    path = tmp_path / "completions.csv"
    path.write_text('step,prompt,completion\n1,"two\nlines",a\n2,p,"unfinis')
    tail = CSVTail(path, keep=3)
    assert [r["completion"] for r in tail.read()] == ["a"]  # the half-written record waits
    with path.open("a") as handle:
        handle.write('hed"\n3,p,c\n4,p,d\n')
    assert [r["completion"] for r in tail.read()] == ["unfinished", "c", "d"]  # keep=3 newest
    path.write_text("step,prompt,completion,reward\n1,p,z,1.0\n")  # rewritten (new column, or a resume cut it)
    assert tail.read() == [{"step": "1", "prompt": "p", "completion": "z", "reward": "1.0"}]


def test_watch_stops_when_the_run_finishes(tmp_path):
    run = make_run(tmp_path / "run")
    screen = tmp_path / "screen.txt"
    with screen.open("w") as out:
        watcher = subprocess.Popen([sys.executable, "-m", "suzak.watch", str(run), "--interval", "0.2"], stdout=out,
                                   stderr=subprocess.PIPE, text=True)  # fmt: skip
        deadline = time.monotonic() + 60
        while screen.read_text().count("suzak.watch ") < 2 and time.monotonic() < deadline:
            time.sleep(0.2)  # until it has drawn the running run twice (it keeps watching)
        assert watcher.poll() is None, watcher.communicate()
        finish_run(run, 6)
        _, err = watcher.communicate(timeout=30)
    assert watcher.returncode == 0, err
    frames = screen.read_text().split("suzak.watch ")
    assert "running · step 6/10" in frames[1] and "completed · step 6/10" in frames[-1]
    assert "ETA" not in frames[-1]


def test_a_failed_run_ends_the_view_with_its_error(tmp_path):
    run = make_run(tmp_path / "run")
    log = TrainLog(run, [])
    log.error("reward word_match raised ValueError at step 7")
    log.close()
    result = subprocess.run([sys.executable, "-m", "suzak.watch", str(run), "--interval", "0.2"],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "failed · step 6/10" in result.stdout and "error: reward word_match raised ValueError" in result.stdout
    TrainLog(run, ["--resume_from_checkpoint", "latest"]).close()  # a resume starts: running again
    assert read_progress(run).status == "running"


def test_train_log_keeps_python_warnings_and_the_console_still_shows_them(tmp_path, monkeypatch):
    import warnings

    monkeypatch.setenv("HF_TOKEN", "hf_secretvalue123")
    console = []  # stands for Python's own printing (pytest records warnings instead of printing them)
    monkeypatch.setattr(warnings, "showwarning", lambda message, category, *rest: console.append(str(message)))
    before = warnings.showwarning
    log = TrainLog(tmp_path, [])
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("use_cache=True is incompatible with gradient checkpointing", UserWarning, stacklevel=1)
        warnings.warn("token hf_secretvalue123 in a warning", FutureWarning, stacklevel=1)
        log.close()
        assert warnings.showwarning is before  # restored: nothing after the run writes to its file
        warnings.warn("after close", UserWarning, stacklevel=1)
    assert console == ["use_cache=True is incompatible with gradient checkpointing",
                       "token hf_secretvalue123 in a warning", "after close"]  # fmt: skip
    text = (tmp_path / "train.log").read_text()
    assert "WARNING suzak.train_log: UserWarning: use_cache=True is incompatible with gradient checkpointing (" in text
    assert "FutureWarning: token" in text and "hf_secretvalue123" not in text and "after close" not in text


def test_watch_on_a_folder_without_a_run_is_one_line(tmp_path):
    result = subprocess.run([sys.executable, "-m", "suzak.watch", str(tmp_path), "--once"],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 1 and result.stderr.strip() == (
        f"error: {tmp_path}: no metrics.csv or run_info.json: not a suzak run's output dir (yet)"
    )
    with pytest.raises(SuzakError, match="no such folder"):
        read_progress(tmp_path / "absent")


def test_before_after_line(tmp_path):
    run = make_run(tmp_path / "run")
    assert before_after(run) == ("held-out eval/accuracy 0.000 at step 0 -> 0.900 at step 6; "
                                 "reward 0.583 (steps 1-6) -> 0.583 (steps 1-6)")  # fmt: skip
    assert before_after(tmp_path) is None


def test_before_after_says_held_out_of_held_out_columns_only(tmp_path):
    """A reward named after accuracy (GSM8K's) and SFT's token accuracy are training metrics, not held-out ones."""
    folder = tmp_path / "run"
    argv = ["--config", DEMO, "--max_steps", "2", "--output_dir", str(folder)]
    start_run(folder, argv, parse_args(argv))
    metrics = MetricsCSVCallback(folder)
    for step in (1, 2):
        metrics.on_log(SimpleNamespace(output_dir=str(folder)), _state(step), None,
                       logs={"reward": 0.5 * step, "rewards/gsm8k_accuracy/mean": 0.5 * step,
                             "gsm8k_accuracy/unparsed_frac": 1.0, "mean_token_accuracy": 0.1 * step})  # fmt: skip
    assert before_after(folder) == "reward 0.750 (steps 1-2) -> 0.750 (steps 1-2)"
