"""R1-V's multi-GPU GeoQA command line: --gpu_ids, the torchrun command built for several GPUs, and a real two-process
run of that command on the CPU (the one-process CPU path runs in tests/test_eval_cli.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from suzak import SuzakError
from suzak.eval import multigpu
from suzak.eval.tasks import TASKS

SRC = Path(__file__).resolve().parents[1] / "src"
R1V_ARGV = ["--model_path", "M", "--batch_size", "4", "--output_path", "O.json", "--prompt_path", "P.jsonl",
            "--gpu_ids", "0,1"]  # fmt: skip  # R1-V's README command (its --image_root is optional here)


@pytest.mark.parametrize(
    ("text", "count", "expected"),
    [("0,1", 2, [0, 1]), ("1", 2, [1]), ("3,0", 4, [3, 0]), (None, 3, [0, 1, 2]), (None, 0, []), ("0,1", 0, [0, 1])],
)
def test_parse_gpu_ids(text, count, expected):
    assert multigpu.parse_gpu_ids(text, count) == expected


@pytest.mark.parametrize(
    ("text", "count", "message"),
    [
        ("0,2", 2, "--gpu_ids: no GPU 2; 2 GPU(s) visible, indices 0..1"),
        ("a,b", 2, "--gpu_ids: expected comma-separated GPU indices such as 0,1; got 'a,b'"),
        ("", 0, "--gpu_ids: expected comma-separated GPU indices"),
        ("0,,1", 2, "--gpu_ids: expected comma-separated GPU indices"),
        ("1,1", 2, "--gpu_ids: a GPU is listed twice in '1,1'"),
        ("-1", 0, "--gpu_ids: GPU indices are >= 0; got -1"),
    ],
)
def test_parse_gpu_ids_errors(text, count, message):
    with pytest.raises(SuzakError, match="^" + message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        multigpu.parse_gpu_ids(text, count)


def test_visible_devices_follow_the_parents_list():
    assert multigpu.visible_devices([0, 1], None) == "0,1"
    assert multigpu.visible_devices([2, 0], "") == "2,0"
    assert multigpu.visible_devices([2, 0], "3, 5,7") == "7,3"  # --gpu_ids index the GPUs this process sees


class Spawned:
    """Stands in for subprocess.run: records the command and environment, returns ``returncode``."""

    def __init__(self, returncode: int = 0):
        self.returncode, self.calls = returncode, []

    def __call__(self, command, env):
        self.calls.append((command, env))
        return subprocess.CompletedProcess(command, self.returncode)


def test_several_gpus_become_one_torchrun_process_each(monkeypatch):
    spawned = Spawned()
    monkeypatch.setattr(multigpu.subprocess, "run", spawned)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    multigpu.main([*R1V_ARGV[:-1], "2,0", "--image_root", "data"], device_count=3)
    [(command, env)] = spawned.calls
    assert command == [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                       "-m", "suzak.eval", "geoqa", "--model_path", "M", "--batch_size", "4", "--output_path",
                       "O.json", "--prompt_path", "P.jsonl", "--image_root", "data", "--batch_size", "4",
                       "--scoring", "r1v"]  # fmt: skip
    assert env["CUDA_VISIBLE_DEVICES"] == "6,4"
    spawned.calls.clear()
    multigpu.main(["--model_path", "M", "--gpu_ids=1", "--scoring", "strict"], device_count=2)  # defaults passed on
    [(command, env)] = spawned.calls
    assert command[command.index("--nproc_per_node"):] == [
        "--nproc_per_node", "1", "-m", "suzak.eval", "geoqa", "--model_path", "M", "--scoring", "strict",
        "--batch_size", "4", "--scoring", "strict"]  # fmt: skip
    assert "--gpu_ids=1" not in command and env["CUDA_VISIBLE_DEVICES"] == "5"


def test_no_gpu_ids_means_every_visible_gpu(monkeypatch):
    spawned = Spawned()
    monkeypatch.setattr(multigpu.subprocess, "run", spawned)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    multigpu.main(R1V_ARGV[:-2], device_count=4)
    [(command, env)] = spawned.calls
    assert command[command.index("--nproc_per_node") + 1] == "4" and env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"


def test_errors_are_one_line(monkeypatch):
    spawned = Spawned(returncode=3)
    monkeypatch.setattr(multigpu.subprocess, "run", spawned)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(SystemExit, match=r"^error: --gpu_ids: no GPU 1; 1 GPU\(s\) visible"):
        multigpu.main(R1V_ARGV, device_count=1)
    with pytest.raises(SystemExit) as info:  # a failed worker's exit status is the script's
        multigpu.main(R1V_ARGV, device_count=2)
    assert info.value.code == 3
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SystemExit, match="^error: already running under torchrun"):
        multigpu.main(R1V_ARGV, device_count=2)
    with pytest.raises(SystemExit):  # argparse refuses an abbreviation of --gpu_ids (it would reach the workers)
        multigpu.main(["--model_path", "M", "--gpu", "0"], device_count=2)


@pytest.mark.slow
def test_two_processes_on_the_cpu(tiny_model_dir, eval_fixture_dir, tmp_path):
    """The exact command built for --gpu_ids 0,1, run for real: two torchrun ranks (gloo on this CPU machine), each a
    shard of the items, rank 0 writing every result once."""
    out = tmp_path / "dp.json"
    argv = ["--model_path", str(tiny_model_dir), "--batch_size", "2", "--output_path", str(out), "--prompt_path",
            str(eval_fixture_dir / TASKS["geoqa"].prompt_path), "--image_root", str(eval_fixture_dir), "--gpu_ids",
            "0,1", "--max_new_tokens", "4"]  # fmt: skip
    code = f"from suzak.eval.multigpu import main; main({argv!r}, device_count=2)"
    env = {**os.environ, "PYTHONPATH": str(SRC), "TQDM_DISABLE": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "torch.distributed.run --standalone --nproc_per_node 2" in proc.stderr
    data = json.loads(out.read_text())
    assert data["scoring"] == "r1v" and len(data["results"]) == 6
    assert [r["question"]["image_path"] for r in data["results"]] == [
        f"./Geo170K/images/test/{i}.png" for i in range(6)]  # fmt: skip
    assert proc.stdout.count("Accuracy: ") == 1  # printed by rank 0 only
