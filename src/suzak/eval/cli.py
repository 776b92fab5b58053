"""Command line for evaluation: ``python -m suzak.eval TASK …``, ``python -m suzak.eval rescore FILE …`` and R1-V's
scripts in ``src/eval/``.

    python -m suzak.eval superclevr --model_path outputs/run/checkpoint-100 --batch_size 64
    python -m suzak.eval rescore logs/geoqa_results_run.json --task geoqa --json rescored.json
    cd src/eval && python test_qwen2vl_counting_superclevr.py --model_path Qwen/Qwen2-VL-2B-Instruct --batch_size 64

An evaluation prints R1-V's ``Accuracy: XX.XX%`` line (greedy pass, under ``--scoring``) and the other rule's figure,
and writes R1-V's JSON, a markdown summary beside it with the published reference numbers beside the ``r1v`` figure,
and one JSON per seeded pass. ``--scoring`` defaults to ``strict`` (suzak's rule, the training reward's parser) for
``python -m suzak.eval`` and to ``r1v`` (R1-V's eval rule) for R1-V's scripts, so each prints what its users expect.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from transformers import HfArgumentParser

from suzak import SuzakError
from suzak.eval.report import format_accuracy, mean_std
from suzak.eval.rescore import JSON_KEYS, rescore_file
from suzak.eval.runner import EvalConfig, Listing, evaluate
from suzak.eval.tasks import SCORING_RULES, TASKS

__all__ = ["build_parser", "build_rescore_parser", "main", "rescore_main"]

_SCORING_HELP = "; ".join(f"{rule}: {text}" for rule, text in SCORING_RULES.items())
_RESCORE_TASKS = [name for name, task in TASKS.items() if "r1v" in task.rules]


def build_parser(task: str | None = None, batch_size: int | None = None) -> HfArgumentParser:
    """The evaluation flags, generated from :class:`EvalConfig`; with ``task`` fixed (the R1-V scripts) the task is
    preset and ``--scoring`` defaults to ``r1v``. ``batch_size``: a script's own default (R1-V's multi-GPU script:
    4 per GPU)."""
    prog = "python -m suzak.eval" if task is None else None
    description = "Evaluate a checkpoint" + (f" on {TASKS[task].description}" if task else "")
    epilog = None if task else ("The task can come first, as in R1-V's commands: python -m suzak.eval superclevr "
                                "--model_path M. Re-score a results file without a model: python -m suzak.eval "
                                "rescore RESULTS.json --task TASK (see rescore --help).")  # fmt: skip
    parser = HfArgumentParser(EvalConfig, prog=prog, description=description, epilog=epilog)
    if task is not None:
        parser.set_defaults(task=task, scoring="r1v")
    if batch_size is not None:
        parser.set_defaults(batch_size=batch_size)
    return parser


def _task_first(argv: list[str]) -> list[str]:
    """``TASK --flags`` (R1-V's and suzak's documented form) as ``--task TASK --flags``."""
    return ["--task", argv[0], *argv[1:]] if argv and not argv[0].startswith("-") else argv


def _print_report(report) -> None:
    print(Path(report.summary_path).read_text(encoding="utf-8"))
    for run in report.sampled:
        print(f"seed {run.seed} (T={run.temperature:g}): {format_accuracy(run.accuracy)}")
    if report.sampled:
        mean, std = mean_std([r.accuracy for r in report.sampled])
        print(f"Sampled accuracy over {len(report.sampled)} seed(s): {mean:.2f} ± {std:.2f}%")
    if report.skipped_missing:
        print(f"Skipped {report.skipped_missing} item(s) with missing images, unreadable images or unreadable gold "
              "answers")  # fmt: skip
    print(format_accuracy(report.greedy.accuracy))
    greedy = report.greedy
    if greedy.other_scoring is not None:
        print(f"{greedy.other_scoring} scoring ({SCORING_RULES[greedy.other_scoring]}): {greedy.other_accuracy:.2f}%")
    print(f"Results saved to {greedy.path} (summary: {report.summary_path})")


def main(argv: list[str] | None = None, task: str | None = None) -> None:
    """``python -m suzak.eval TASK …`` (or, with ``task``, an R1-V script); ``rescore`` as the first word re-scores."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if task is None and argv[:1] == ["rescore"]:
        rescore_main(argv[1:])
        return
    parser = build_parser(task)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        (config,) = parser.parse_args_into_dataclasses(_task_first(argv) if task is None else argv)
        report = evaluate(config)
    except Listing as listing:
        print(listing)
        return
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


def build_rescore_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m suzak.eval rescore",
        description="Re-score a results file in R1-V's format (R1-V's own logs or suzak's: an object whose 'results' "
        "list holds 'model_output' and 'ground_truth') under both scoring rules. No model, no images.",
    )
    add = parser.add_argument
    add("results", help="the results JSON")
    add("--task", required=True, choices=_RESCORE_TASKS, help="which task's rules score it")
    add("--scoring", default="r1v", choices=list(SCORING_RULES),
        help=f"the rule behind the Accuracy line (default r1v; {_SCORING_HELP})")  # fmt: skip
    add("--json", metavar="OUT", help="also write {" + ", ".join(f'"{k}"' for k in JSON_KEYS) + "} here")
    return parser


def rescore_main(argv: list[str] | None = None) -> None:
    """``python -m suzak.eval rescore RESULTS.json --task T [--scoring r1v|strict] [--json OUT]``."""
    args = build_rescore_parser().parse_args(argv)
    try:
        rescored = rescore_file(args.results, args.task, args.scoring)
        if args.json:
            _write_json(Path(args.json), rescored.as_json())
    except SuzakError as error:
        raise SystemExit(f"error: {error}") from None
    print("\n".join(rescored.report(args.results)))
    if args.json:
        print(f"Saved to {args.json}")


def _write_json(path: Path, payload: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    except OSError as error:
        raise SuzakError(f"--json {path}: cannot write it ({error.strerror or error})") from None
