"""Faults during a run, injected into real CPU runs (``python -m suzak.train`` or ``tests/faulty_train.py``, which is
the same command with one fault patched in): a stop signal, kill -9 mid-save, a file size limit while saving, a NaN
step, a rank that raises under torchrun, a changed recipe on resume; plus the pieces each relies on (the rank watch,
the checkpoint mirror, the W&B run id). For each: the exit line, and that resuming loses no completed step."""

from __future__ import annotations

import csv
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from suzak import SuzakError
from suzak.runs.checkpoints import MARKER, checkpoint_problem, latest_checkpoint, mark_complete, saved_settings
from suzak.runs.faults import EXIT_PREEMPTED, CheckpointMirror, RankWatch, changed_settings, resume_command

ROOT = Path(__file__).resolve().parents[1]
SMOKE = str(ROOT / "recipes" / "smoke.yaml")
DEMO = str(ROOT / "recipes" / "demo.yaml")
FAULTY = str(ROOT / "tests" / "faulty_train.py")
# The demo's colour task, small: rewards differ between completions from step 1, so the weights move every step.
DEMO_ARGS = ["--config", DEMO, "--eval_rows", "0", "--dataset_options", '{"num_rows": 400}', "--max_steps", "8"]
COMPARED = ("loss", "grad_norm", "reward", "reward_std", "entropy", "num_tokens", "learning_rate")


def train(args: list[str], env: dict, fault: str | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    command = [sys.executable, FAULTY, *args] if fault else [sys.executable, "-m", "suzak.train", *args]
    env = env | ({"SUZAK_TEST_FAULT": fault} if fault else {})
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def steps(path: Path) -> dict[int, dict[str, str]]:
    """metrics.csv's training rows by step (the end-of-training summary rows have no loss)."""
    with path.open(newline="", encoding="utf-8") as handle:
        return {int(row["step"]): row for row in csv.DictReader(handle) if row.get("loss")}


def last_line(text: str) -> str:
    return text.strip().splitlines()[-1]


def wait_for(condition, process: subprocess.Popen, what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None, f"the run ended before {what}"
        assert time.monotonic() < deadline, f"no {what} after {timeout} s"
        time.sleep(0.05)


# --- preemption -----------------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1], ids=["SIGTERM", "SIGUSR1"])
def test_a_stop_signal_saves_and_the_resumed_run_continues_step_by_step(tmp_path, run_env, signum):
    """The signal lands mid-run; the step under way finishes, a checkpoint is written (save_strategy is "no"), the
    run exits 75 with the resume command; that command finishes the run, and every step's metrics and the final
    weights equal those of the same run left alone."""
    whole = tmp_path / "whole"
    assert train([*DEMO_ARGS, "--output_dir", str(whole)], run_env).returncode == 0

    out = tmp_path / "stopped"
    log = tmp_path / "stopped.log"
    with log.open("w") as handle:
        process = subprocess.Popen([sys.executable, "-m", "suzak.train", *DEMO_ARGS, "--output_dir", str(out)],
                                   cwd=ROOT, env=run_env, stdout=handle, stderr=subprocess.STDOUT)  # fmt: skip
        wait_for(lambda: (out / "metrics.csv").is_file() and 3 in steps(out / "metrics.csv"), process, "step 3")
        process.send_signal(signum)
        assert process.wait(timeout=300) == EXIT_PREEMPTED, log.read_text()[-3000:]
    line = last_line(log.read_text())
    note = json.loads((out / "preempted.json").read_text())
    stopped = note["step"]
    assert 3 <= stopped < 8 and note["signal"] == signum.name
    assert line.startswith(f"stopped by {signum.name} after step {stopped}: {out}/checkpoint-{stopped} holds every "
                           "completed step; resume with: python -m suzak.train --config ")  # fmt: skip
    assert (
        line.endswith(f"--output_dir {out} --resume_from_checkpoint latest")
        and line.split(": ", 2)[2] == note["resume"]
    )
    assert latest_checkpoint(out) == str(out / f"checkpoint-{stopped}")
    assert json.loads((out / "run_info.json").read_text())["launches"][-1]["status"] == "preempted"

    command = shlex.split(note["resume"])
    resumed = subprocess.run([sys.executable, *command[1:]], cwd=ROOT, env=run_env, capture_output=True, text=True,
                             timeout=600)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "missing keys" not in resumed.stderr and f"resumed weights: 56 tensors from {out}" in resumed.stderr
    assert not (out / "preempted.json").exists()
    got, want = steps(out / "metrics.csv"), steps(whole / "metrics.csv")
    assert sorted(got) == sorted(want) == list(range(1, 9))  # no step lost, none twice
    for step in want:
        assert {k: got[step][k] for k in COMPARED} == {k: want[step][k] for k in COMPARED}, step
    assert any(float(want[s]["grad_norm"]) > 0 for s in want)  # the weights moved: the comparison means something
    final, alone = load_file(out / "model.safetensors"), load_file(whole / "model.safetensors")
    assert all(final[key].equal(alone[key]) for key in alone)


def test_resume_command_replaces_the_resume_flag_and_masks_secrets(monkeypatch):
    monkeypatch.delenv("SUZAK_LAUNCH", raising=False)
    argv = ["--config", "r.yaml", "--resume_from_checkpoint", "outputs/x/checkpoint-3", "--hub_token", "hf_abcdefgh"]
    command = resume_command("suzak.train", argv)
    assert command.startswith("python -m suzak.train --config r.yaml --hub_token ")
    assert "hf_abcdefgh" not in command and "checkpoint-3" not in command
    assert command.endswith("--resume_from_checkpoint latest")
    monkeypatch.setenv("SUZAK_LAUNCH", "bash src/scripts/run_grpo_clevr.sh --preset demo --resume_from_checkpoint=x")
    assert resume_command("suzak.train", argv) == ("bash src/scripts/run_grpo_clevr.sh --preset demo "
                                                   "--resume_from_checkpoint latest")  # fmt: skip


# --- saves that do not finish -----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_kill_9_mid_save_leaves_no_checkpoint_latest_would_pick(tmp_path, run_env):
    """SIGKILL while checkpoint-3 is being written (its weights and optimizer are on disk, its state is not): no
    checkpoint-3 exists, latest is checkpoint-2, and resuming finishes the run with every checkpoint whole."""
    out = tmp_path / "run"
    args = ["--config", SMOKE, "--output_dir", str(out), "--save_steps", "1", "--max_steps", "5"]
    log = tmp_path / "killed.log"
    staged = out / ".suzak-staging" / "checkpoint-3" / "optimizer.pt"
    with log.open("w") as handle:
        process = subprocess.Popen([sys.executable, FAULTY, *args], cwd=ROOT, env=run_env | {"SUZAK_TEST_FAULT":
                                   "stall_save:3"}, stdout=handle, stderr=subprocess.STDOUT)  # fmt: skip
        wait_for(lambda: "stalling the save of checkpoint-3" in log.read_text(), process, "the stalled save")
        assert staged.is_file()
        process.kill()
        process.wait()
    assert not (out / "checkpoint-3").exists()
    assert latest_checkpoint(out) == str(out / "checkpoint-2")
    result = train([*args, "--resume_from_checkpoint", "latest"], run_env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"resuming from {out / 'checkpoint-2'}" in result.stderr
    assert all(checkpoint_problem(out / f"checkpoint-{step}") is None for step in range(1, 6))
    assert not (out / ".suzak-staging").exists()  # the partial save was cleared by the next save of step 3
    assert sorted(steps(out / "metrics.csv")) == [1, 2, 3, 4, 5]


@pytest.mark.slow
@pytest.mark.parametrize("saving", ["checkpoint", "final"])
def test_a_file_size_limit_while_saving_is_one_line_and_leaves_nothing_partial(
    tmp_path, run_env, saving, tiny_model_dir
):
    """``ulimit -f``: the write of a file over the limit fails (EFBIG; Python ignores SIGXFSZ). A checkpoint save
    (optimizer.pt, 1.6 MB, over 1 MB) and the final model (0.8 MB, over 0.5 MB) each end in one line naming the path,
    the free space and what a save needs; no partial folder or file is left, and the earlier checkpoint is intact."""
    out = tmp_path / "run"
    limit, extra = ("1024", ["--save_steps", "1", "--save_only_model", "false"]) if saving == "checkpoint" else \
        ("512", ["--save_strategy", "no"])  # fmt: skip
    extra += ["--model_name_or_path", str(tiny_model_dir)]  # built before the limit
    if saving == "checkpoint":  # a first, whole checkpoint, written without the limit
        assert train(["--config", SMOKE, "--output_dir", str(out), "--save_steps", "1", "--max_steps", "1",
                      "--lr_scheduler_type", "constant", "--model_name_or_path", str(tiny_model_dir)],
                     run_env).returncode == 0  # fmt: skip
        extra += ["--resume_from_checkpoint", "latest"]
    command = shlex.join([sys.executable, "-m", "suzak.train", "--config", SMOKE, "--output_dir", str(out),
                          "--max_steps", "2", "--lr_scheduler_type", "constant", *extra])  # fmt: skip
    result = subprocess.run(["bash", "-c", f"ulimit -f {limit} && exec {command}"], cwd=ROOT, env=run_env,
                            capture_output=True, text=True, timeout=600)  # fmt: skip
    assert result.returncode == 1
    line = last_line(result.stderr)
    assert "Traceback" not in result.stderr and "SafetensorError" not in line
    if saving == "checkpoint":
        assert line.startswith(f"error: a write failed while saving {out / 'checkpoint-2'} (torch.save could not "
                               "write the whole file, as on a full disk or past a file size limit: ")  # fmt: skip
        assert " MB needed (as checkpoint-1)): " in line and " GB free, about " in line
        assert f"{out / 'checkpoint-1'} is the newest complete checkpoint and is intact" in line
        assert not (out / "checkpoint-2").exists() and checkpoint_problem(out / "checkpoint-1") is None
    else:
        assert line.startswith(f"error: a write failed while saving the final model to {out} (")
        assert "no checkpoint was complete yet" in line and not (out / "model.safetensors").exists()
    assert line.endswith("--resume_from_checkpoint latest") or "run again" in line
    assert not (out / ".suzak-staging").exists()


# --- numerical faults -------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_nan_step_stops_before_any_weight_changes_and_resume_finishes(tmp_path, run_env):
    out = tmp_path / "run"
    args = ["--config", SMOKE, "--output_dir", str(out), "--save_steps", "1", "--max_steps", "5"]
    result = train(args, run_env, fault="nan:3")
    assert result.returncode == 1
    line = last_line(result.stderr)
    assert line.startswith("error: the gradient norm is nan at step 3 (rows of its batch: index ")
    assert line.endswith(f"{out / 'checkpoint-2'} holds the 2 completed step(s): fix the cause, then rerun with "
                         "--resume_from_checkpoint latest")  # fmt: skip
    assert "no weight changed" in line and not (out / "checkpoint-3").exists()
    weights = load_file(out / "checkpoint-2" / "model.safetensors")
    assert all(tensor.isfinite().all() for tensor in weights.values())
    result = train([*args, "--resume_from_checkpoint", "latest"], run_env)  # the cause fixed: no fault this time
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(steps(out / "metrics.csv")) == [1, 2, 3, 4, 5]


@pytest.mark.slow
def test_on_nonfinite_skip_skips_the_step_and_counts_it(tmp_path, run_env):
    out = tmp_path / "run"
    args = [*DEMO_ARGS[:-1], "4", "--output_dir", str(out), "--on_nonfinite", "skip"]
    result = train(args, run_env, fault="nan:2")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "the gradient norm is nan at step 2 (rows of its batch: index " in result.stderr
    rows = steps(out / "metrics.csv")
    assert rows[2]["grad_norm"] == "" and rows[2]["nonfinite/skipped_steps"] == "1"  # nan is an empty cell
    assert rows[3]["grad_norm"] != "" and rows[4]["nonfinite/skipped_steps"] == "1"
    assert all(tensor.isfinite().all() for tensor in load_file(out / "model.safetensors").values())


# --- several processes ------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_rank_that_raises_under_torchrun_stops_the_others_with_one_line(tmp_path, run_env):
    out = tmp_path / "ddp"
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "suzak.runs.launch", "--nproc_per_node", "2", FAULTY, "--config", SMOKE,
         "--max_steps", "4", "--per_device_train_batch_size", "4", "--output_dir", str(out)],
        cwd=ROOT, env=run_env | {"SUZAK_TEST_FAULT": "raise:1:2"}, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 1 and time.monotonic() - start < 300
    assert "ChildFailedError" not in result.stderr  # torchrun's traceback and failure table (suzak.runs.launch)
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.startswith("error: rank 1")]
    assert lines == ["error: rank 1 failed: RuntimeError: injected fault on rank 1 at step 2; rank 0 stops too (the "
                     "newest complete checkpoint holds every step saved; fix the cause, then rerun with "
                     "--resume_from_checkpoint latest)"]  # fmt: skip


WATCH = """
import sys, time
from suzak.runs.faults import RankWatch
watch = RankWatch(sys.argv[1], 0, 2, float(sys.argv[2]))
watch.prepare()
watch.start()
time.sleep(60)
"""


def watched(folder: Path, timeout: float, before=None) -> tuple[subprocess.CompletedProcess, float]:
    """Rank 0's watch in a process of its own; (its result, seconds from when it started watching to its end), so
    the process's start-up (~10 s of imports on a loaded CI machine) is not counted against the timeout."""
    process = subprocess.Popen([sys.executable, "-c", WATCH, str(folder), str(timeout)], cwd=ROOT, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    alive = folder / ".suzak-ranks" / "rank-0.alive"
    deadline = time.monotonic() + 120
    while not alive.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    start = alive.stat().st_mtime if alive.exists() else time.time()  # rank 0 has started watching
    if before is not None:
        time.sleep(1.5)
        before()
    out, err = process.communicate(timeout=120)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err), time.time() - start


def test_a_silent_rank_is_named_after_rank_failure_timeout(tmp_path):
    """Rank 1 never writes a heartbeat (killed, its machine gone): rank 0 stops after the timeout, not NCCL's."""
    result, took = watched(tmp_path, 3)
    assert result.returncode == 1 and 3 <= took < 20
    assert result.stderr.startswith("error: rank 1 has been silent for ")
    assert "(rank_failure_timeout 3): it was killed or its machine is gone; rank 0 stops too" in result.stderr


def test_a_failed_rank_is_named_at_once_and_old_notes_are_ignored(tmp_path):
    folder = tmp_path / ".suzak-ranks"
    folder.mkdir()
    (folder / "rank-1.failed").write_text("an earlier launch's failure\n")
    os.utime(folder / "rank-1.failed", (time.time() - 3600, time.time() - 3600))

    def fail_now():
        (folder / "rank-1.alive").write_text("x")
        (folder / "rank-1.failed").write_text("ValueError: bad row\n")

    result, took = watched(tmp_path, 120, before=fail_now)
    assert result.returncode == 1 and took < 30
    assert result.stderr.startswith("error: rank 1 failed: ValueError: bad row; rank 0 stops too")
    watch = RankWatch(tmp_path, 1, 2, 120)
    watch.prepare()
    assert not (folder / "rank-1.failed").exists()  # a new launch clears its own note


# --- a changed recipe on resume ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_resume_that_changes_the_states_meaning_stops_unless_overridden(tmp_path, run_env):
    out = tmp_path / "run"
    base = ["--config", SMOKE, "--output_dir", str(out), "--save_steps", "1"]
    assert train([*base, "--max_steps", "1"], run_env).returncode == 0
    assert saved_settings(out / "checkpoint-1")["num_generations"] == 4
    resume = [*base, "--resume_from_checkpoint", "latest"]
    changed = train([*resume, "--max_steps", "2", "--per_device_train_batch_size", "4", "--num_generations", "2"],
                    run_env)  # fmt: skip
    assert changed.returncode == 1
    assert last_line(changed.stderr) == (
        f"error: resume_from_checkpoint {out / 'checkpoint-1'}: this run changes 4 setting(s) the checkpoint's state "
        "depends on (per_device_train_batch_size: 8 -> 4; num_generations: 4 -> 2; generation_batch_size: 8 -> 4; "
        "max_steps: 1 -> 2): set them back, or add --resume_override true to continue with the new values"
    )
    assert not (out / "checkpoint-2").exists()
    overridden = train([*resume, "--max_steps", "2", "--logging_steps", "5", "--resume_override", "true"], run_env)
    assert overridden.returncode == 0, overridden.stderr[-3000:]
    assert (
        "this run changes 1 setting(s) the checkpoint's state depends on (max_steps: 1 -> 2); going on "
        "(resume_override)" in overridden.stderr
    )  # logging_steps is not named: it changes no state
    constant = tmp_path / "constant"  # a constant learning rate: max_steps may grow, logging may change
    base = ["--config", SMOKE, "--output_dir", str(constant), "--save_steps", "1", "--lr_scheduler_type", "constant"]
    assert train([*base, "--max_steps", "1"], run_env).returncode == 0
    longer = train([*base, "--max_steps", "2", "--logging_steps", "5", "--resume_from_checkpoint", "latest"], run_env)
    assert longer.returncode == 0 and "this run changes" not in longer.stderr


def test_changed_settings_compare_values_not_spelling():
    saved = {"dataset_options": {"seed": 0, "num_rows": 64}, "learning_rate": 1e-4, "seed": 0}
    assert changed_settings(saved, {"dataset_options": {"num_rows": 64, "seed": 0}, "learning_rate": 0.0001}) == []
    assert changed_settings(saved, {"learning_rate": 2e-4, "world_size": 8}) == ["learning_rate: 0.0001 -> 0.0002"]


# --- off-site copies --------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_checkpoint_mirror_copies_every_checkpoint_whole(tmp_path, run_env):
    out, mirror = tmp_path / "run", tmp_path / "bucket"
    result = train(["--config", SMOKE, "--output_dir", str(out), "--save_steps", "2", "--max_steps", "4",
                    "--save_total_limit", "1", "--checkpoint_mirror", str(mirror)], run_env)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-4"]  # rotated here, kept there
    assert sorted(p.name for p in mirror.iterdir()) == ["checkpoint-2", "checkpoint-4"]
    assert all(checkpoint_problem(mirror / name) is None for name in ("checkpoint-2", "checkpoint-4"))
    assert "checkpoint_mirror: 2 checkpoint(s) copied to" in result.stderr
    assert not (out / ".suzak-mirror").exists() or not any((out / ".suzak-mirror").iterdir())


def test_a_failed_mirror_copy_is_a_warning_and_a_count(tmp_path, caplog):
    folder = tmp_path / "checkpoint-3"
    folder.mkdir()
    (folder / "trainer_state.json").write_text("{}")
    mark_complete(folder, 3)
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the mirror folder should be")

    class State:
        is_world_process_zero, global_step = True, 3

    class Args:
        output_dir = str(tmp_path)

    for target in (str(blocker / "sub"), "hf://nobody/offline"):  # no folder can be made there; no Hub here
        mirror = CheckpointMirror(target, tmp_path)
        with caplog.at_level("WARNING", logger="suzak.runs.faults"):
            mirror.on_save(Args(), State(), None)
            mirror.close(timeout=120)
        assert mirror.failures == 1 and mirror.copied == 0
        assert f"checkpoint_mirror: copying checkpoint-3 to {target} failed (" in caplog.text
        assert "1 failed copy(ies) so far, training goes on" in caplog.text
        assert (folder / MARKER).is_file()  # the checkpoint itself untouched
        caplog.clear()


# --- the W&B run ------------------------------------------------------------------------------------------------------


def test_a_resumed_run_logs_into_the_same_wandb_run(tmp_path, monkeypatch):
    from suzak.runs.record import start_run
    from suzak.training.session import use_wandb_run

    for name in ("WANDB_RUN_ID", "WANDB_RESUME"):
        monkeypatch.delenv(name, raising=False)
    use_wandb_run(str(tmp_path), resumed=False)
    first = os.environ["WANDB_RUN_ID"]
    assert os.environ["WANDB_RESUME"] == "allow"
    start_run(tmp_path, [], (), wandb_id=first)
    monkeypatch.delenv("WANDB_RUN_ID")
    use_wandb_run(str(tmp_path), resumed=True)
    assert os.environ["WANDB_RUN_ID"] == first
    monkeypatch.delenv("WANDB_RUN_ID")
    use_wandb_run(str(tmp_path), resumed=False)
    assert os.environ["WANDB_RUN_ID"] != first  # a new run in the same folder is a new W&B run


def test_bad_fault_settings_are_one_line():
    from suzak.training.configs import parse_args

    with pytest.raises(SuzakError, match=r"^stop_signals: 'SIGFOO' is not a signal name"):
        parse_args(["--config", SMOKE, "--stop_signals", "SIGFOO"])
    with pytest.raises(SuzakError, match=r"^rank_failure_timeout 0.0 must be > 0"):
        parse_args(["--config", SMOKE, "--rank_failure_timeout", "0"])
    with pytest.raises(SuzakError, match=r"^on_nonfinite skip cannot work under DeepSpeed"):
        parse_args(["--config", SMOKE, "--on_nonfinite", "skip", "--deepspeed", "ds_configs/zero2.json"])
