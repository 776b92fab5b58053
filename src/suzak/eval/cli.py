"""Command line for evaluation: ``python -m suzak.eval TASK …`` and R1-V's two scripts in ``src/eval/``.

    python -m suzak.eval superclevr --model_path outputs/run/checkpoint-100 --batch_size 64
    cd src/eval && python test_qwen2vl_counting_superclevr.py --model_path Qwen/Qwen2-VL-2B-Instruct --batch_size 64

Prints R1-V's ``Accuracy: XX.XX%`` line (greedy pass) and writes R1-V's JSON, a markdown summary beside it with the
published reference numbers, and one JSON per seeded pass.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from suzak import SuzakError
from suzak.eval.report import format_accuracy, mean_std
from suzak.eval.runner import EvalConfig, evaluate
from suzak.eval.tasks import CLEVR_HELDOUT_SEED, TASKS

__all__ = ["build_parser", "main"]


def build_parser(task: str | None = None) -> argparse.ArgumentParser:
    """The evaluation flags; with ``task`` fixed (the R1-V scripts) there is no task argument."""
    prog = "python -m suzak.eval" if task is None else None
    description = "Evaluate a checkpoint" + (f" on {TASKS[task].description}" if task else "")
    parser = argparse.ArgumentParser(prog=prog, description=description)
    if task is None:
        parser.add_argument("task", choices=list(TASKS), help="what to evaluate on")
    add = parser.add_argument
    add("--model_path", required=True, help="model folder, Hub id, 'tiny', LoRA adapter folder or checkpoint-N")
    add("--prompt_path", help="R1-V eval JSONL (default: R1-V's file name under prompts/); gsm8k: local JSONL")
    add("--image_root", help="folder the image_path entries are relative to (default: the working directory)")
    add("--output_path", help="results JSON (default: logs/<task>_results_<model>.json)")
    add("--engine", default="hf", choices=["hf", "vllm"], help="hf: batched transformers generate; vllm: GPU only")
    add("--batch_size", type=int, help="prompts per batch (default: R1-V's, 64 SuperCLEVR / 50 GeoQA)")
    add("--max_new_tokens", type=int, help="completion tokens (default: R1-V's, 256 SuperCLEVR / 1024 GeoQA)")
    add("--min_pixels", type=int, help="pixel budget lower bound (default: the training recipe's, 3136)")
    add("--max_pixels", type=int, help="pixel budget upper bound (default: the training recipe's, 401408)")
    add("--limit", type=int, help="evaluate only the first N items")
    add("--seeds", type=int, nargs="+", default=[], help="sampled passes (after the greedy one), one per seed")
    add("--temperature", type=float, default=1.0, help="temperature of the seeded passes")
    add("--prompt_template", default="eval", help="eval (R1-V's eval prompt), train (the training prompt) or a name")
    add("--skip_missing", action="store_true", help="skip items whose image is missing (counted in the summary)")
    add("--fresh", action="store_true", help="discard partial results of an earlier run instead of resuming")
    add("--num_rows", type=int, default=200, help="clevr_synthetic: scenes to draw")
    add("--data_seed", type=int, default=CLEVR_HELDOUT_SEED, help="clevr_synthetic: scene seed (held out)")
    add("--dtype", help="model dtype (default: bfloat16 on a GPU, float32 on the CPU)")
    add("--tensor_parallel_size", type=int, default=1, help="vLLM: GPUs per model")
    add("--no_progress", action="store_true", help="no progress bar")
    return parser


def _print_report(report) -> None:
    print(Path(report.summary_path).read_text(encoding="utf-8"))
    for run in report.sampled:
        print(f"seed {run.seed} (T={run.temperature:g}): {format_accuracy(run.accuracy)}")
    if report.sampled:
        mean, std = mean_std([r.accuracy for r in report.sampled])
        print(f"Sampled accuracy over {len(report.sampled)} seed(s): {mean:.2f} ± {std:.2f}%")
    if report.skipped_missing:
        print(f"Skipped {report.skipped_missing} item(s) with missing images")
    print(format_accuracy(report.greedy.accuracy))
    print(f"Results saved to {report.greedy.path} (summary: {report.summary_path})")


def main(argv: list[str] | None = None, task: str | None = None) -> None:
    args = vars(build_parser(task).parse_args(argv))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args["progress"] = not args.pop("no_progress")
    args.setdefault("task", task)
    try:
        report = evaluate(EvalConfig(**args))
    except SuzakError as error:
        raise SystemExit(f"error: {error}") from None
    except KeyboardInterrupt:
        raise SystemExit("interrupted: finished items are saved in the .partial.jsonl file; run the same command "
                         "again to resume") from None  # fmt: skip
    finally:
        _end_process_group()
    if report is not None:
        _print_report(report)


def _end_process_group() -> None:
    """Leave torchrun's process group cleanly (torch warns at exit otherwise)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
