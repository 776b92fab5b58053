"""The evaluation commands end to end on the tiny model: R1-V's scripts, python -m suzak.eval, resume, checkpoints."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from suzak import SuzakError
from suzak.eval import cli
from suzak.eval.engine import HFEngine
from suzak.eval.models import load_eval_model, merged_model_dir
from suzak.eval.report import accuracy
from suzak.eval.rescore import rescore_file
from suzak.eval.runner import EvalConfig, evaluate, run_pass
from suzak.eval.tasks import CLEVR_HELDOUT_SEED, TASKS, get_task, load_items

EVAL_DIR = Path(__file__).resolve().parents[1] / "src" / "eval"
RESULT_KEYS = {"question", "ground_truth", "model_output", "extracted_answer", "is_correct"}
ACCURACY_LINE = re.compile(r"^Accuracy: (\d+\.\d\d)%$", re.MULTILINE)
FILE_KEYS = ["accuracy", "scoring", "other_scoring", "other_accuracy", "results"]  # R1-V's two keys + the rules


def _run(args: list[str], cwd: Path, timeout: int = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "TQDM_DISABLE": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def check_results(path: Path, n: int, scoring: str = "strict", other: str | None = "r1v") -> dict:
    """R1-V's schema plus both rules' verdicts; accuracy == 100 · mean(is_correct) under ``scoring``."""
    data = json.loads(path.read_text())
    assert list(data) == FILE_KEYS and (data["scoring"], data["other_scoring"]) == (scoring, other)
    assert len(data["results"]) == n
    flags = {f"is_correct_{rule}" for rule in (scoring, other) if rule}
    assert all(set(r) == RESULT_KEYS | flags and isinstance(r["is_correct"], bool) for r in data["results"])
    assert all(r["is_correct"] == r[f"is_correct_{scoring}"] for r in data["results"])
    assert data["accuracy"] == pytest.approx(100 * sum(r["is_correct"] for r in data["results"]) / n)
    if other:
        assert data["other_accuracy"] == pytest.approx(100 * sum(r[f"is_correct_{other}"] for r in data["results"]) / n)
    assert not list(path.parent.glob(path.name + ".partial*"))  # finished runs leave no partial file
    return data


def test_superclevr_script_with_r1v_defaults_and_seeds(tiny_model_dir, eval_fixture_dir, tmp_path):
    """Run from the fixture folder: R1-V's default file names, --limit, two seeded passes."""
    out = tmp_path / "sc.json"
    args = [str(EVAL_DIR / "test_qwen2vl_counting_superclevr.py"), "--model_path", str(tiny_model_dir),
            "--batch_size", "3", "--max_new_tokens", "6", "--limit", "5", "--seeds", "0", "1", "--output_path", str(out)]  # fmt: skip
    proc = _run(args, cwd=eval_fixture_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = check_results(out, 5, scoring="r1v", other="strict")  # R1-V's script: R1-V's rule by default
    assert float(ACCURACY_LINE.findall(proc.stdout)[-1]) == pytest.approx(data["accuracy"], abs=0.005)
    assert re.search(r"^strict scoring \(suzak's rule.*\): \d+\.\d\d%$", proc.stdout, re.MULTILINE)
    assert data["results"][0]["question"]["image_path"] == "./images/superCLEVR_new_025000.png"
    for seed in (0, 1):
        check_results(tmp_path / f"sc.seed{seed}.json", 5, scoring="r1v", other="strict")
    summary = (tmp_path / "sc.md").read_text()
    assert "(mean ± std)" in summary and "**(UNVERIFIED)**" in summary
    assert f"48.00 | 82.50 | {data['accuracy']:.2f} |" in summary  # published numbers beside the r1v figure
    assert "template=r1v_eval" in summary and "max_new_tokens=6" in summary
    assert "Sampled accuracy over 2 seed(s)" in proc.stdout


def test_geoqa_script_from_src_eval(tiny_model_dir, eval_fixture_dir, tmp_path):
    out = tmp_path / "geoqa.json"
    args = ["test_qwen2vl_geoqa.py", "--model_path", str(tiny_model_dir), "--batch_size", "4", "--max_new_tokens", "6",
            "--prompt_path", str(eval_fixture_dir / TASKS["geoqa"].prompt_path), "--image_root", str(eval_fixture_dir),
            "--output_path", str(out)]  # fmt: skip
    proc = _run(args, cwd=EVAL_DIR)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = check_results(out, 6, scoring="r1v", other="strict")
    assert data["results"][0]["ground_truth"] == "100°"
    assert ACCURACY_LINE.search(proc.stdout)
    summary = (tmp_path / "geoqa.md").read_text()
    assert "30.63 | 38.72" in summary and "35.41 | 47.48" in summary and "template=r1v_geoqa" in summary
    rescored = rescore_file(out, "geoqa")  # the file re-scores to its own figures
    assert (rescored.accuracy, rescored.other_accuracy) == (data["accuracy"], data["other_accuracy"])


def test_geoqa_multigpu_script_runs_one_cpu_process(tiny_model_dir, eval_fixture_dir, tmp_path):
    """R1-V's multi-GPU command line, unchanged, on a machine without a GPU: one process, R1-V's files."""
    out = tmp_path / "multi.json"
    args = ["test_qwen2vl_geoqa_multigpu.py", "--model_path", str(tiny_model_dir), "--batch_size", "4",
            "--output_path", str(out), "--prompt_path", str(eval_fixture_dir / TASKS["geoqa"].prompt_path),
            "--image_root", str(eval_fixture_dir), "--gpu_ids", "0,1", "--max_new_tokens", "6"]  # fmt: skip
    proc = _run(args, cwd=EVAL_DIR)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "no CUDA GPU: evaluating in one process on the CPU (--gpu_ids 0,1 ignored)" in proc.stderr
    check_results(out, 6, scoring="r1v", other="strict")
    assert "batch_size=4" in (tmp_path / "multi.md").read_text()
    assert len(ACCURACY_LINE.findall(proc.stdout)) == 1


def test_missing_image_stops_the_run(eval_fixture_dir, tmp_path, monkeypatch):
    """Run where the images are not: one clear line naming the first missing path and the count, no model load."""
    (tmp_path / "prompts").mkdir()
    shutil.copy(eval_fixture_dir / TASKS["superclevr"].prompt_path, tmp_path / TASKS["superclevr"].prompt_path)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--model_path", "no-such-model"], task="superclevr")
    message = str(exit_info.value)
    assert message.startswith("error: 8 image(s) missing, first images/superCLEVR_new_025000.png")
    assert "--skip_missing" in message


def test_clevr_synthetic_via_python_m(tiny_model_dir, tmp_path):
    out = tmp_path / "cs.json"
    args = ["-m", "suzak.eval", "clevr_synthetic", "--model_path", str(tiny_model_dir), "--num_rows", "4",
            "--batch_size", "4", "--max_new_tokens", "6", "--output_path", str(out)]  # fmt: skip
    proc = _run(args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = check_results(out, 4)  # python -m suzak.eval: strict by default, r1v beside it
    assert {r["question"]["seed"] for r in data["results"]} == {CLEVR_HELDOUT_SEED}
    assert "Published reference numbers" not in (tmp_path / "cs.md").read_text()  # none exist for this task


def test_gsm8k_task(tiny_model_dir, gsm8k_jsonl, tmp_path, capsys):
    out = tmp_path / "gsm8k.json"
    cli.main(["gsm8k", "--model_path", str(tiny_model_dir), "--prompt_path", str(gsm8k_jsonl), "--batch_size", "4",
              "--max_new_tokens", "6", "--limit", "3", "--output_path", str(out), "--no_progress"])  # fmt: skip
    data = check_results(out, 3, other=None)  # GSM8K has one rule
    first = data["results"][0]
    assert set(first["question"]) == {"question", "answer"}
    assert first["ground_truth"] == first["question"]["answer"].split("#### ")[-1].replace(",", "")
    assert ACCURACY_LINE.search(capsys.readouterr().out)
    with pytest.raises(SystemExit, match=r"^error: gsm8k has no 'r1v' scoring rule \(R1-V never evaluated GSM8K"):
        cli.main(["gsm8k", "--model_path", "no-such-model", "--prompt_path", str(gsm8k_jsonl), "--scoring", "r1v"])


class CrashAfter:
    """Wraps an engine; raises KeyboardInterrupt (a Ctrl-C) after ``crash_after`` batches have been saved."""

    def __init__(self, engine, crash_after: int | None):
        self.engine, self.crash_after, self.generated = engine, crash_after, 0
        self.batch_size = engine.batch_size

    def generate(self, rows, temperature=0.0, seed=None, on_batch=None):
        batches = 0

        def save(indices, outputs):
            nonlocal batches
            on_batch(indices, outputs)
            self.generated += len(indices)
            batches += 1
            if self.crash_after is not None and batches >= self.crash_after:
                raise KeyboardInterrupt

        return self.engine.generate(rows, temperature, seed, on_batch=save)


def test_resume_after_an_interrupted_run(tiny_model_dir, eval_fixture_dir, tmp_path):
    model, processor = load_eval_model(str(tiny_model_dir))
    engine = HFEngine(model, processor, batch_size=3, max_new_tokens=5, progress=False)
    out = tmp_path / "resume.json"
    config = EvalConfig(task="superclevr", model_path=str(tiny_model_dir), image_root=str(eval_fixture_dir),
                        prompt_path=str(eval_fixture_dir / TASKS["superclevr"].prompt_path), output_path=str(out),
                        max_new_tokens=5, progress=False)  # fmt: skip
    with pytest.raises(KeyboardInterrupt):
        evaluate(config, engine=CrashAfter(engine, crash_after=1))
    partial = tmp_path / "resume.json.partial.jsonl"
    saved = [json.loads(line) for line in partial.read_text().splitlines()[1:]]
    assert len(saved) == 3 and not out.exists()
    with pytest.raises(SuzakError, match="other settings"):  # changed settings never mix into the partial results
        evaluate(EvalConfig(**{**config.__dict__, "max_new_tokens": 7}), engine=CrashAfter(engine, None))
    resumed = CrashAfter(engine, crash_after=None)
    report = evaluate(config, engine=resumed)
    assert resumed.generated == 8 - 3  # the saved items were not generated again
    data = check_results(out, 8)
    outputs = {r["question"]["image_path"]: r["model_output"] for r in data["results"]}
    items = {i.key: i for i in load_items(get_task("superclevr"), config.prompt_path, template="r1v_eval",
                                          image_root=config.image_root)}  # fmt: skip
    for record in saved:
        assert outputs[items[record["key"]].record["image_path"]] == record["model_output"]
    assert report.greedy.accuracy == accuracy(data["results"])


class FakeDist:
    """Rank ``rank`` of 2 without a process group (accelerate's state, as far as the runner reads it); the gather
    (patched below) hands every rank both ranks' outputs, as accelerate's ``gather_object`` does."""

    other: dict = {}

    def __init__(self, rank, world):
        self.process_index, self.num_processes, self.is_main_process = rank, world, rank == 0

    def wait_for_everyone(self):
        pass


def test_ranks_generate_their_shard_and_rank0_merges(tiny_model_dir, eval_fixture_dir, tmp_path, monkeypatch):
    import suzak.eval.runner

    monkeypatch.setattr(suzak.eval.runner, "gather_object", lambda objs: [*objs, FakeDist.other])
    model, processor = load_eval_model(str(tiny_model_dir))
    engine = HFEngine(model, processor, batch_size=4, max_new_tokens=4, progress=False)
    task = get_task("superclevr")
    items = load_items(task, str(eval_fixture_dir / task.prompt_path), template="r1v_eval",
                       image_root=str(eval_fixture_dir))  # fmt: skip
    out = tmp_path / "ranks.json"
    rank1 = CrashAfter(engine, None)
    assert run_pass(task, items, rank1, out, {"s": 1}, state=FakeDist(1, 2)) is None
    assert rank1.generated == 4 and not out.exists()
    partial = tmp_path / "ranks.json.partial.rank1.jsonl"
    lines = partial.read_text().splitlines()[1:]
    partial.unlink()  # in a real run rank 0 read the (absent) old files before rank 1 wrote this one
    FakeDist.other = {json.loads(line)["key"]: json.loads(line)["model_output"] for line in lines}
    assert set(FakeDist.other) == {i.key for i in items[1::2]}
    rank0 = CrashAfter(engine, None)
    result = run_pass(task, items, rank0, out, {"s": 1}, state=FakeDist(0, 2))
    assert rank0.generated == 4 and result.total == 8
    data = check_results(out, 8)
    assert [r["question"] for r in data["results"]] == [i.record for i in items]


def test_torchrun_two_cpu_ranks(tiny_model_dir, tmp_path):
    """A real 2-process gloo run: each rank a shard, rank 0 writes every result."""
    out = tmp_path / "dp.json"
    args = ["-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "suzak.eval", "clevr_synthetic",
            "--model_path", str(tiny_model_dir), "--num_rows", "6", "--batch_size", "2", "--max_new_tokens", "4",
            "--output_path", str(out)]  # fmt: skip
    proc = _run(args, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = check_results(out, 6)
    assert [r["question"]["index"] for r in data["results"]] == list(range(6))
    assert len(ACCURACY_LINE.findall(proc.stdout)) == 1  # printed by rank 0 only


def test_lora_adapter_dir_evaluates(tiny_model_dir, eval_fixture_dir, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForImageTextToText, AutoProcessor

    base = AutoModelForImageTextToText.from_pretrained(tiny_model_dir)
    peft_model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    adapter = tmp_path / "checkpoint-5"
    peft_model.save_pretrained(adapter)
    AutoProcessor.from_pretrained(tiny_model_dir).save_pretrained(adapter)
    assert (adapter / "adapter_config.json").is_file() and not (adapter / "config.json").is_file()
    model, _ = load_eval_model(str(adapter))
    assert type(model).__name__ == "Qwen2_5_VLForConditionalGeneration"  # merged, no PEFT wrapper left
    merged_q = model.model.language_model.layers[0].self_attn.q_proj.weight
    assert not merged_q.equal(base.model.language_model.layers[0].self_attn.q_proj.base_layer.weight)
    out = tmp_path / "lora.json"
    cli.main(["superclevr", "--model_path", str(adapter), "--prompt_path", str(eval_fixture_dir / TASKS["superclevr"].prompt_path),
              "--image_root", str(eval_fixture_dir), "--limit", "2", "--max_new_tokens", "4", "--output_path", str(out),
              "--no_progress"])  # fmt: skip
    check_results(out, 2)
    merged = merged_model_dir(str(adapter))  # what --engine vllm loads: the adapter merged once into a full folder
    assert merged == str(tmp_path / "checkpoint-5-merged") and (Path(merged) / "config.json").is_file()
    assert merged_model_dir(str(tiny_model_dir)) == str(tiny_model_dir)


def test_skip_missing_is_counted(tiny_model_dir, eval_fixture_dir, tmp_path, capsys):
    rows = [json.loads(line) for line in (eval_fixture_dir / TASKS["superclevr"].prompt_path).read_text().splitlines()]
    rows[1]["image_path"] = "./images/not_downloaded.png"
    prompts = tmp_path / "problems.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows[:4]))
    out = tmp_path / "skip.json"
    cli.main(["superclevr", "--model_path", str(tiny_model_dir), "--prompt_path", str(prompts), "--image_root",
              str(eval_fixture_dir), "--skip_missing", "--max_new_tokens", "3", "--output_path", str(out),
              "--no_progress"])  # fmt: skip
    data = check_results(out, 3)
    assert "not_downloaded" not in json.dumps(data)
    assert "Skipped 1 item(s) with missing images" in capsys.readouterr().out
    assert "skipped_missing=1" in (tmp_path / "skip.md").read_text()


def test_deepspeed_output_dirs(tiny_model_dir, tmp_path):
    checkpoint = tmp_path / "checkpoint-100"
    shutil.copytree(tiny_model_dir, checkpoint)
    (checkpoint / "global_step100").mkdir()
    model, _ = load_eval_model(str(checkpoint))  # weights beside the ZeRO shards: loads like any folder
    assert model.training is False
    (checkpoint / "model.safetensors").unlink()
    with pytest.raises(SuzakError, match=r"ZeRO shards \(global_step100/\).*zero_to_fp32\.py .*--safe_serialization"):
        load_eval_model(str(checkpoint))
