"""What a new user runs first: the demo preset (a run that visibly learns on CPU), its train.log, TensorBoard
reporting, and the SLURM example's torchrun lines."""

from __future__ import annotations

import csv
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, run_ok

SECRET = "hf_FAKEsecret123"


def metrics_rows(out: Path) -> list[dict]:
    with (out / "metrics.csv").open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_smoke_run_writes_train_log_without_secrets(tmp_path, run_env):
    """train.log holds the console's log lines and the metrics lines; a secret in the environment that shows up in
    a logged path (here the output dir's name) is masked there."""
    out = tmp_path / f"smoke-{SECRET}"
    env = run_env | {"HF_TOKEN": SECRET}
    result = run_ok(["bash", "src/scripts/run_grpo_clevr.sh", "--preset", "smoke", "--max_steps", "2",
                     "--output_dir", str(out)], env)  # fmt: skip
    log = (out / "train.log").read_text()
    assert "reward pre-flight passed" in result.stderr and "reward pre-flight passed" in log
    # one readable line per logged step, on the console and in train.log (the metrics dict: log_metrics_dict)
    step_2 = r"step 2/2 \| reward \d\.\d{3} ± \d\.\d{3} \| len \d+ \| clip \d\.\d{3} \| loss \S+ \| tok/s [\d,]+ \| \d+\.\d s/step"
    assert re.search(r"INFO suzak\.train_log: " + step_2 + "$", log, re.M), log
    assert re.search("^" + step_2 + "$", result.stdout, re.M) and "{'loss'" not in result.stdout + log, result.stdout
    assert re.search(r"INFO suzak\.train_log: done: 2 steps in \d+s \(\d+\.\d s/step\)$", log, re.M)
    assert "model and processor saved to" in log and "smoke-***" in log
    assert SECRET not in log
    assert f"log: {out}/train.log" in result.stdout and f"python -m suzak.watch {out}" in result.stdout


def test_log_metrics_dict_prints_the_trainers_dict_instead_of_the_step_line(tmp_path, run_env):
    out = tmp_path / "raw"
    result = run_ok([sys.executable, "-m", "suzak.train", "--config", "recipes/smoke.yaml", "--max_steps", "1",
                     "--log_metrics_dict", "true", "--output_dir", str(out)], run_env)  # fmt: skip
    assert re.search(r"^\{'loss': .*'reward': ", result.stdout, re.M) and "step 1/1 |" not in result.stdout
    assert re.search(r"INFO suzak\.train_log: step 1: \{.*'reward': ", (out / "train.log").read_text())


def test_a_failed_run_ends_its_train_log_with_the_error(tmp_path, run_env):
    out = tmp_path / "bad"
    result = subprocess.run([sys.executable, "-m", "suzak.train", "--config", "recipes/smoke.yaml", "--output_dir",
                             str(out), "--resume_from_checkpoint", str(tmp_path / "nowhere")],
                            cwd=ROOT, env=run_env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.returncode == 1
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("error: ")
    assert (out / "train.log").read_text().strip().endswith(error)


def test_unknown_preset_is_one_line(run_env):
    result = subprocess.run(["bash", "src/scripts/run_grpo_clevr.sh", "--preset", "nope"], cwd=ROOT, env=run_env,
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 2 and result.stderr.strip() == "unknown preset nope (known: smoke demo)"


def test_demo_preset_logs_a_step_zero_baseline(tmp_path, run_env):
    """Two steps of the demo: the held-out accuracy is measured before the first step (its own line at step 0) and
    the run ends with the before/after line."""
    out = tmp_path / "demo"
    result = run_ok(["bash", "src/scripts/run_grpo_clevr.sh", "--preset", "demo", "--max_steps", "2", "--eval_steps",
                     "2", "--eval_rows", "20", "--output_dir", str(out)], run_env)  # fmt: skip
    rows = metrics_rows(out)
    assert rows[0]["step"] == "0" and rows[0]["eval/accuracy"] != "" and rows[0]["reward"] == ""
    assert [r["step"] for r in rows if r["eval/accuracy"]] == ["0", "2"]
    with (out / "eval_samples.csv").open(newline="") as handle:
        samples = list(csv.DictReader(handle))
    assert [int(r["step"]) for r in samples] == [0] * 20 + [2] * 20
    assert re.search(r"before -> after: held-out eval/accuracy \d\.\d{3} at step 0 -> \d\.\d{3} at step 2; reward "
                     r"\d\.\d{3} \(steps 1-2\) -> \d\.\d{3} \(steps 1-2\)", result.stderr)  # fmt: skip
    assert f"plots: {out}/plots/*.png" in result.stdout and (out / "plots" / "accuracy.png").is_file()
    assert "checkpoints: none saved   final model + processor:" in result.stdout  # the demo's save_strategy: no


@pytest.mark.slow
def test_demo_preset_learns(tmp_path, run_env):
    """The quickstart's run, whole: held-out accuracy from ~0 to >= 0.9 and the reward well above chance (0.5 once
    the model answers with a colour word); the live view shows the finished run."""
    out = tmp_path / "demo"
    # ~2 min on an idle 2-core machine is the aim; 14 min was measured with other jobs loading it (docs/benchmarks.md)
    result = run_ok(["bash", "src/scripts/run_grpo_clevr.sh", "--preset", "demo", "--output_dir", str(out)], run_env,
                    timeout=2400)  # fmt: skip
    accuracy = [(int(r["step"]), float(r["eval/accuracy"])) for r in metrics_rows(out) if r["eval/accuracy"]]
    assert [step for step, _ in accuracy] == [0, 25, 50, 75, 100, 125, 150]
    assert accuracy[0][1] <= 0.1 and accuracy[-1][1] >= 0.9, accuracy
    rewards = [float(r["reward"]) for r in metrics_rows(out) if r["reward"]]
    assert len(rewards) == 150 and sum(rewards[:10]) / 10 < 0.1 and sum(rewards[-10:]) / 10 >= 0.8
    assert "before -> after: held-out eval/accuracy 0.0" in result.stderr
    frame = run_ok([sys.executable, "-m", "suzak.watch", str(out), "--once"], run_env).stdout
    assert "completed · step 150/150 (100%)" in frame and "newest completions (step 150" in frame


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None,
                    reason="tensorboard is not installed: `bash setup.sh` installs it (pyproject.toml)")  # fmt: skip
def test_report_to_tensorboard_writes_events(tmp_path, run_env):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "tb"
    run_ok([sys.executable, "-m", "suzak.train", "--config", "recipes/smoke.yaml", "--max_steps", "2", "--report_to",
            "tensorboard", "--eval_rows", "4", "--eval_steps", "2", "--eval_max_new_tokens", "4", "--output_dir",
            str(out)], run_env)  # fmt: skip
    events = list(out.glob("runs/*/events.out.tfevents.*"))
    assert len(events) == 1, sorted(p.relative_to(out) for p in out.rglob("*tfevents*"))
    accumulator = EventAccumulator(str(events[0].parent))
    accumulator.Reload()
    assert [e.step for e in accumulator.Scalars("train/reward")] == [1, 2]
    assert [e.step for e in accumulator.Scalars("train/eval/accuracy")] == [0, 2]  # the baseline reaches it too


def _fake_slurm(bin_dir: Path) -> None:
    """``scontrol`` that lists two hosts and ``srun`` that runs its command once per node, as SLURM sets each task."""
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text('#!/bin/sh\n[ "$1 $2" = "show hostnames" ] && [ "$3" = "gpu-[07-08]" ] '
                                      '&& printf "gpu-07\\ngpu-08\\n"\n')  # fmt: skip
    (bin_dir / "srun").write_text(
        "#!/usr/bin/env bash\n"
        'while [ "${1#-}" != "$1" ]; do case $1 in --nodes|--ntasks-per-node) shift 2 ;; *) shift ;; esac; done\n'
        'for ((i = 0; i < SLURM_NNODES; i++)); do SLURM_NODEID=$i SLURM_PROCID=$i "$@" || exit $?; done\n'
    )
    for tool in ("scontrol", "srun"):
        (bin_dir / tool).chmod(0o755)


def test_slurm_example_starts_torchrun_once_per_node(tmp_path, run_env):
    _fake_slurm(tmp_path / "bin")
    env = run_env | {"PATH": f"{tmp_path / 'bin'}{os.pathsep}{run_env['PATH']}", "SLURM_NNODES": "2",
                     "SLURM_JOB_NODELIST": "gpu-[07-08]", "SLURM_SUBMIT_DIR": str(ROOT), "CUDA_VISIBLE_DEVICES": "0,1,2,3",
                     "SUZAK_DRY_RUN": "1"}  # fmt: skip
    # the script's defaults, not a test worker's rendezvous port (tests/conftest.py)
    for name in ("MASTER_ADDR", "MASTER_PORT", "NNODES", "NODE_RANK"):
        env.pop(name, None)
    result = run_ok(["bash", "src/scripts/slurm/grpo_multinode.sbatch", "--max_steps", "5"], env)
    lines = [line for line in result.stdout.splitlines() if line.startswith("dry run: ")]
    assert lines == [
        f"dry run: python -m suzak.runs.launch --nnodes 2 --node_rank {rank} --nproc_per_node 4 --master_addr gpu-07 --master_port 29500 "
        "-m suzak.train --config recipes/clevr_qwen2.5vl_7b.yaml --deepspeed auto --max_steps 5"
        for rank in (0, 1)
    ]
    assert "suzak: 2 node(s) (gpu-[07-08]), rendezvous gpu-07:29500" in result.stdout


def test_ci_runs_the_readmes_test_commands():
    """`.ci/run` runs the README's test commands as written (the main suite's `-n auto` included), plus `-q`."""
    readme = (ROOT / "README.md").read_text()
    commands = {line.split("#")[0].strip() for line in readme.splitlines() if re.match(r"\S*python -m pytest", line)}
    ci = {
        line.replace(" -q", "").strip() for line in (ROOT / ".ci/run").read_text().splitlines() if "-m pytest" in line
    }
    assert ci == {".venv/bin/python -m pytest -n auto", ".venv-vllm/bin/python -m pytest -n auto -m vllm"}
    assert ci <= commands
