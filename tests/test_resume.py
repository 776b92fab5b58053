"""Faults of the machine. Kill a run with SIGKILL between saves, resume with ``--resume_from_checkpoint latest``: it
reaches the same final step, completed checkpoints stay intact, half-written ones are never picked (nor deleted), and
the CSV streams hold one row history. A checkpoint counts as complete by its contents, not its sizes (garbage of the
right size is caught), for ``latest`` and explicit paths alike; a full disk mid-save leaves the previous checkpoint
intact and says so in one line."""

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

from suzak import SuzakError
from suzak.runs.checkpoints import MARKER, checkpoint_problem, resume_checkpoint

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


# --- what counts as complete: contents, not sizes ------------------------------------------------------------------


def make_checkpoint(root: Path, step: int, sharded: bool = False, mark: bool = True) -> Path:
    """A small checkpoint as the Trainer writes one: safetensors weights (or two shards and an index), a torch
    optimizer archive and trainer_state.json; marked complete unless ``mark`` is False (a plain Trainer run)."""
    import torch
    from safetensors.torch import save_file

    from suzak.runs.checkpoints import mark_complete

    folder = root / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    tensors = {"a": torch.arange(64.0).reshape(8, 8), "b": torch.ones(16)}
    if sharded:
        shards = {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}
        for name, shard in shards.items():
            save_file({name: tensors[name]}, folder / shard)
        (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": shards}))
    else:
        save_file(tensors, folder / "model.safetensors")
    torch.save({"state": {}, "param_groups": [{"lr": 1e-6}]}, folder / "optimizer.pt")
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step, "log_history": []}))
    if mark:
        mark_complete(folder, step)
    return folder


def garble(path: Path) -> None:
    """Replace a file with garbage of exactly its size: a size check cannot tell."""
    import random

    path.write_bytes(random.Random(path.name).randbytes(path.stat().st_size))


@pytest.mark.parametrize("mark", [True, False], ids=["marked", "plain-trainer"])
@pytest.mark.parametrize(
    ("sharded", "damage", "problem"),
    [
        (False, "trainer_state.json", "trainer_state.json is truncated or corrupt ("),
        (False, "model.safetensors", "model.safetensors is corrupt (Error while deserializing header"),
        (False, "optimizer.pt", "optimizer.pt is truncated or corrupt (not a whole torch archive)"),
        (True, "model-00002-of-00002.safetensors", "model-00002-of-00002.safetensors is corrupt ("),
        (True, "model.safetensors.index.json", "model.safetensors.index.json is truncated or corrupt ("),
    ],
)
def test_garbage_of_the_right_size_is_not_complete(tmp_path, mark, sharded, damage, problem):
    folder = make_checkpoint(tmp_path, 5, sharded=sharded, mark=mark)
    assert checkpoint_problem(folder) is None
    garble(folder / damage)
    assert checkpoint_problem(folder).startswith(problem)


def test_weights_cut_short_or_a_missing_shard_are_not_complete(tmp_path):
    """No marker to compare sizes with: the safetensors header says where each tensor ends, the index which shards
    exist."""
    cut = make_checkpoint(tmp_path, 1, mark=False) / "model.safetensors"
    cut.write_bytes(cut.read_bytes()[:-4])
    assert checkpoint_problem(cut.parent).startswith("model.safetensors is corrupt (")
    sharded = make_checkpoint(tmp_path, 2, sharded=True, mark=False)
    (sharded / "model-00001-of-00002.safetensors").unlink()
    assert checkpoint_problem(sharded) == (
        "model-00001-of-00002.safetensors, listed in model.safetensors.index.json, is missing"
    )


def test_latest_skips_a_corrupt_newest_checkpoint_with_a_warning(tmp_path, caplog):
    caplog.set_level("INFO", logger="suzak.runs.checkpoints")
    make_checkpoint(tmp_path, 1)
    garble(make_checkpoint(tmp_path, 2) / "model.safetensors")
    assert resume_checkpoint("latest", tmp_path) == str(tmp_path / "checkpoint-1")
    assert f"skipping incomplete checkpoint {tmp_path / 'checkpoint-2'}: model.safetensors is corrupt" in caplog.text
    assert f"resuming from {tmp_path / 'checkpoint-1'}" in caplog.text


def test_latest_with_checkpoints_but_none_usable_is_an_error_not_a_fresh_start(tmp_path, caplog):
    assert resume_checkpoint("latest", tmp_path) is None  # no checkpoint at all: a fresh start, said
    assert "no checkpoint in" in caplog.text and "starting fresh" in caplog.text
    garble(make_checkpoint(tmp_path, 1) / "trainer_state.json")
    garble(make_checkpoint(tmp_path, 2) / "optimizer.pt")
    with pytest.raises(SuzakError) as error:
        resume_checkpoint("latest", tmp_path)
    assert str(error.value) == (
        f"resume_from_checkpoint=latest: none of the 2 checkpoint folder(s) in {tmp_path} is usable (newest, "
        "checkpoint-2: optimizer.pt is truncated or corrupt (not a whole torch archive)); resume from an intact copy "
        "with --resume_from_checkpoint PATH, or move them away to start afresh"
    )


def test_an_explicit_checkpoint_path_is_checked_like_latest(tmp_path):
    good = make_checkpoint(tmp_path, 1)
    assert resume_checkpoint(str(good), tmp_path) == str(good)
    assert resume_checkpoint(None, tmp_path) is None
    garble(make_checkpoint(tmp_path, 2) / "trainer_state.json")
    with pytest.raises(SuzakError, match=r"resume_from_checkpoint \S+checkpoint-2 cannot be resumed: trainer_state"):
        resume_checkpoint(str(tmp_path / "checkpoint-2"), tmp_path)
    with pytest.raises(SuzakError, match=r"resume_from_checkpoint \S+checkpoint-9: no such checkpoint folder"):
        resume_checkpoint(str(tmp_path / "checkpoint-9"), tmp_path)


def test_damaged_resume_is_one_line_from_the_command_line(tmp_path, run_env):
    """Both forms through ``python -m suzak.train``: exit 1, one ``error:`` line, before the model loads."""
    explicit, every = tmp_path / "explicit", tmp_path / "every"
    garble(make_checkpoint(explicit, 3) / "model.safetensors")
    garble(make_checkpoint(every, 3) / "model.safetensors")
    runs = {
        out: subprocess.Popen([sys.executable, "-m", "suzak.train", "--config", SMOKE, "--output_dir", str(out),
                               "--resume_from_checkpoint", value], cwd=ROOT, env=run_env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
        for out, value in ((explicit, str(explicit / "checkpoint-3")), (every, "latest"))
    }  # fmt: skip
    for out, run in runs.items():
        _, stderr = run.communicate(timeout=300)
        lines = [line for line in stderr.splitlines() if line.startswith("error:")]
        assert run.returncode == 1 and "Traceback" not in stderr and "loaded " not in stderr, stderr[-3000:]
        assert len(lines) == 1 and "model.safetensors is corrupt" in lines[0], stderr[-3000:]
        assert ("cannot be resumed" if out == explicit else "none of the 1 checkpoint folder(s)") in lines[0]


# --- a full disk mid-save, a corrupt newest checkpoint: end to end on the tiny model --------------------------------


@pytest.mark.slow
def test_disk_full_mid_save_and_a_corrupt_newest_checkpoint_then_resume(tmp_path, tiny_model_dir, monkeypatch, caplog):
    """The disk fills while checkpoint-2's optimizer state is written (the Trainer's own torch.save raising ENOSPC,
    after a partial file): one line naming checkpoint-2 and the intact checkpoint-1, which is untouched; the partial
    checkpoint-2 is removed. Resuming ``latest`` finishes; later checkpoint-2's weights turn to garbage of the same
    size, and the next resume skips it by name and continues from checkpoint-1."""
    import errno

    import torch

    from suzak.runs.checkpoints import latest_checkpoint
    from suzak.train import main

    caplog.set_level("INFO")
    monkeypatch.setenv("SUZAK_ENV_FILE", str(tmp_path / "absent.env"))
    out = tmp_path / "run"
    argv = ["--config", SMOKE, "--model_name_or_path", str(tiny_model_dir), "--output_dir", str(out),
            "--save_steps", "1", "--lr_scheduler_type", "constant", "--max_steps", "2"]  # fmt: skip
    failing, real_save, kept = out / ".suzak-staging" / "checkpoint-2" / "optimizer.pt", torch.save, {}

    def save_on_a_full_disk(obj, f, *args, **kwargs):
        if Path(f) == failing:
            kept.update(digests(out / "checkpoint-1"))
            failing.write_bytes(b"PK\x03\x04" + bytes(1000))  # what was written before the disk filled
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(f))
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save_on_a_full_disk)
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    line = str(stopped.value.code)
    assert "\n" not in line and line.startswith(
        f"error: disk full while saving {out / 'checkpoint-2'} (No space left on device; "
    ), line
    assert line.endswith(f"MB needed (as checkpoint-1)): {out / 'checkpoint-1'} is the newest complete checkpoint "
                         "and is intact (the partial write was removed); free space (or lower save_total_limit), "
                         "then rerun with --resume_from_checkpoint latest")  # fmt: skip
    assert kept and digests(out / "checkpoint-1") == kept and checkpoint_problem(out / "checkpoint-1") is None
    assert not (out / "checkpoint-2").exists() and not (out / ".suzak-staging").exists()  # nothing half-written

    monkeypatch.setattr(torch, "save", real_save)  # space freed
    main(argv + ["--resume_from_checkpoint", "latest"])
    assert f"resuming from {out / 'checkpoint-1'}" in caplog.text
    assert latest_checkpoint(out) == str(out / "checkpoint-2") and digests(out / "checkpoint-1") == kept

    garble(out / "checkpoint-2" / "model.safetensors")  # marked complete, sizes unchanged
    caplog.clear()
    main([*argv[:-1], "3", "--resume_from_checkpoint", "latest"])
    assert f"skipping incomplete checkpoint {out / 'checkpoint-2'}: model.safetensors is corrupt" in caplog.text
    assert f"resuming from {out / 'checkpoint-1'}" in caplog.text
    assert json.loads((out / "checkpoint-3" / "trainer_state.json").read_text())["global_step"] == 3
    assert all(checkpoint_problem(out / f"checkpoint-{step}") is None for step in (1, 2, 3))


@pytest.mark.slow
def test_a_resume_past_the_first_epoch_trains_the_rows_the_uninterrupted_run_did(tmp_path, tiny_model_dir):
    """TRL's sampler draws each epoch's order from one generator, advanced once an epoch, and a resume never ran the
    epochs before its own: a run resumed in its third epoch trained the first epoch's order again (the long mixture
    bench: 0 of 200 steps after the resume matched). Two-step epochs here (4 rows, 2 prompts a step): resumed at
    step 5, the run trains what the uninterrupted one trained at steps 6 to 8, row for row."""
    options = '{"num_rows": 4, "seed": 0, "min_objects": 3, "max_objects": 6}'
    command = [sys.executable, "-m", "suzak.train", "--config", SMOKE, "--model_name_or_path", str(tiny_model_dir),
               "--dataset_options", options, "--max_steps", "8", "--save_steps", "5"]  # fmt: skip
    env = os.environ | {"SUZAK_ENV_FILE": str(tmp_path / "absent.env")}
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    for out, extra in ((whole, []), (resumed, ["--resume_from_checkpoint", "latest"])):
        if extra:
            resumed.mkdir()
            shutil.copytree(whole / "checkpoint-5", resumed / "checkpoint-5")
        result = subprocess.run([*command, "--output_dir", str(out), *extra], cwd=ROOT, env=env, capture_output=True,
                                text=True, timeout=900)  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]

    def drawn(out: Path) -> list[tuple[str, str]]:
        return [(r["step"], r["image"]) for r in rows(out / "completions.csv") if int(r["step"]) > 5]

    assert len(drawn(whole)) == 3 * 8 and drawn(resumed) == drawn(whole)
