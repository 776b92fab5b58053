"""Kill a run with SIGKILL between saves, resume with ``--resume_from_checkpoint latest``: it reaches the same final
step, completed checkpoints stay intact, half-written ones are never picked (nor deleted), and the CSV streams hold
one row history."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from suzak.runs.checkpoints import MARKER, checkpoint_problem

ROOT = Path(__file__).resolve().parents[1]
SMOKE = str(ROOT / "recipes" / "smoke.yaml")


def digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha1(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def start_and_kill_after(command: list[str], env: dict, marker: Path, log: Path, timeout: float = 600) -> None:
    """Start the run, SIGKILL it as soon as ``marker`` exists (the step-2 checkpoint is complete)."""
    with log.open("w") as handle:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while not marker.is_file():
            assert process.poll() is None, f"run ended before {marker} appeared:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"no {marker} after {timeout} s"
            time.sleep(0.1)
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
    assert process.returncode == -signal.SIGKILL


def fake_half_written(out: Path) -> None:
    """What a kill mid-save leaves: checkpoint-3 with truncated weights and no state; a stray checkpoint-99."""
    partial = out / "checkpoint-3"
    partial.mkdir(exist_ok=True)
    (partial / "model.safetensors").write_bytes((out / "checkpoint-2" / "model.safetensors").read_bytes()[:1000])
    shutil.copy2(out / "checkpoint-2" / "config.json", partial)
    stray = out / "checkpoint-99"
    stray.mkdir()
    shutil.copy2(out / "checkpoint-2" / "config.json", stray)
    (stray / "trainer_state.json").write_text('{"global_step": 99, "log_hist')


@pytest.mark.slow
def test_sigkill_between_saves_then_resume_latest(tmp_path, tiny_model_dir):
    out = tmp_path / "run"
    env = os.environ | {"SUZAK_ENV_FILE": str(tmp_path / "absent.env"), "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "suzak.train", "--config", SMOKE, "--model_name_or_path", str(tiny_model_dir),
               "--output_dir", str(out), "--save_steps", "1", "--max_steps", "6"]  # fmt: skip
    start_and_kill_after(command, env, out / "checkpoint-2" / MARKER, tmp_path / "killed.log")
    fake_half_written(out)
    before = {step: digests(out / f"checkpoint-{step}") for step in (1, 2)}

    result = subprocess.run(command + ["--resume_from_checkpoint", "latest"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=900)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"resuming from {out / 'checkpoint-2'}" in result.stderr
    assert f"skipping incomplete checkpoint {out / 'checkpoint-99'}: trainer_state.json is truncated" in result.stderr
    assert f"skipping incomplete checkpoint {out / 'checkpoint-3'}: no trainer_state.json" in result.stderr

    assert json.loads((out / "checkpoint-6" / "trainer_state.json").read_text())["global_step"] == 6
    for step in range(1, 7):  # every completed checkpoint is intact and loads
        folder = out / f"checkpoint-{step}"
        assert checkpoint_problem(folder) is None, step
        assert load_file(folder / "model.safetensors")
    assert all(digests(out / f"checkpoint-{step}") == before[step] for step in (1, 2))
    assert checkpoint_problem(out / "checkpoint-99") is not None  # skipped, left where it was

    metrics = rows(out / "metrics.csv")
    assert [r["step"] for r in metrics if r["loss"]] == [str(s) for s in range(1, 7)]  # one history, no duplicates
    completions = rows(out / "completions.csv")
    assert sorted({int(r["step"]) for r in completions}) == list(range(1, 7))
    assert all(sum(r["step"] == str(s) for r in completions) == 8 for s in range(1, 7))
    launches = json.loads((out / "run_info.json").read_text())["launches"]
    assert len(launches) == 2 and "end" not in launches[0] and launches[1]["resumed_from"] == str(out / "checkpoint-2")
    assert launches[1]["final_step"] == 6
