"""Cost of a zoom tool turn in a GRPO step, on the CPU (the GPU row is in bench/gpu/README.md's plan).

    python bench/bench_tool_turn.py                 # tiny Qwen2.5-VL, 16 rollouts a step, 6 steps per condition
    python bench/bench_tool_turn.py --table bench/results_tool_turn.jsonl

The tiny model is first taught the zoom call on one place of the zoom task (``suzak.selftest.small_zoom_prior``, 80
SFT steps, untimed), so every rollout calls the zoom. Then, from copies of that model, two conditions with the same
prompts (the tools' system turn included), the same first turn and the same settings:

- ``tool_turn``: ``max_tool_calling_iterations`` 1: the call is answered with a crop and the model writes a second
  turn after it (TRL's ``_tool_call_loop``);
- ``no_tool_turn``: ``max_tool_calling_iterations`` 0: the call is parsed and never answered.

Columns: median s/step after ``--warmup`` steps, the time in TRL's tool loop per step (the zoom itself, the next
turn's prompt and generation), the zoom's own time per call (crop and fit), tool calls and tool-turn tokens per
rollout, and the overhead of the tool turn on the step ((tool_turn - no_tool_turn) / no_tool_turn).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from stamp import commit, markdown_table  # bench/stamp.py (the script's folder is on sys.path)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results_tool_turn.jsonl"
FIELDS = ("condition", "rollouts", "s_per_step", "tool_loop_s", "zoom_ms_per_call", "calls_per_rollout",
          "tool_tokens_per_rollout", "overhead", "cpus", "commit", "date")  # fmt: skip


def run(args) -> list[dict]:
    from suzak.selftest import small_zoom_prior

    tmp = Path(tempfile.mkdtemp(prefix="suzak-bench-tools-"))
    prior, processor, budget = small_zoom_prior(tmp)  # the default tiny model's vocabulary
    rows = [_condition(name, iterations, prior, processor, budget, args, tmp)
            for name, iterations in (("no_tool_turn", 0), ("tool_turn", 1))]  # fmt: skip
    base = rows[0]["s_per_step"]
    for row in rows:
        row |= {"overhead": row["s_per_step"] / base - 1, "cpus": os.cpu_count(), "commit": commit(),
                "date": datetime.date.today().isoformat()}  # fmt: skip
    return rows


def _condition(condition: str, iterations: int, prior, processor, budget, args, tmp: Path) -> dict:
    """One condition's GRPO steps from a copy of the prior, timed."""
    from transformers import TrainerCallback
    from trl import GRPOConfig

    from suzak.models.tools import ZoomEnvironment, resolve_tools
    from suzak.scoring.rewards import word_match
    from suzak.selftest import zoom_dataset
    from suzak.training.trainer import VLMGRPOTrainer

    steps: list[float] = []
    loop: list[float] = []
    zooms: list[float] = []
    lengths: list[tuple[int, int, int]] = []  # (rollouts, tool tokens, calls) per step

    class StepTimes(TrainerCallback):
        def on_log(self, _args, state, control, logs=None, **kwargs):
            if logs and "step_time" in logs:
                steps.append(logs["step_time"])

    config = GRPOConfig(output_dir=str(tmp / condition), max_steps=args.steps, seed=0, bf16=False,
                        per_device_train_batch_size=args.rollouts, num_generations=min(8, args.rollouts),
                        max_completion_length=160, max_tool_calling_iterations=iterations, temperature=0.5,
                        learning_rate=1e-4, logging_steps=1, save_strategy="no", report_to="none", use_cpu=True,
                        disable_tqdm=True, gradient_checkpointing=False)  # fmt: skip
    trainer = VLMGRPOTrainer(model=copy.deepcopy(prior), reward_funcs=[word_match], args=config,
                             processing_class=processor, pixel_budget=budget, callbacks=[StepTimes()],
                             train_dataset=zoom_dataset(args.rollouts * args.steps, 2, slots=1),
                             **resolve_tools(["zoom"], budget).trainer_kwargs())  # fmt: skip
    tool_loop = trainer._tool_call_loop

    def timed_loop(*a, **k):
        start = time.perf_counter()
        out = tool_loop(*a, **k)
        loop.append(time.perf_counter() - start)
        mask, calls = out[0], out[4]
        lengths.append((len(mask), sum(len(m) - sum(m) for m in mask), calls))
        return out

    zoom = ZoomEnvironment.zoom

    @functools.wraps(zoom)  # the name TRL looks the call up by, the schema the model was taught
    def timed_zoom(self, bbox_2d: list[int]) -> list[dict]:
        start = time.perf_counter()
        try:
            return zoom(self, bbox_2d)
        finally:
            zooms.append(time.perf_counter() - start)

    trainer._tool_call_loop = timed_loop
    ZoomEnvironment.zoom = timed_zoom
    try:
        trainer.train()
    finally:
        ZoomEnvironment.zoom = zoom
    kept = slice(args.warmup, None)
    rollouts = sum(r for r, _, _ in lengths[kept])
    return {
        "condition": condition, "rollouts": args.rollouts, "s_per_step": statistics.median(steps[kept]),
        "tool_loop_s": statistics.median(loop[kept]), "zoom_ms_per_call": 1000 * statistics.fmean(zooms) if zooms else 0.0,
        "calls_per_rollout": sum(c for _, _, c in lengths[kept]) / rollouts,
        "tool_tokens_per_rollout": sum(t for _, t, _ in lengths[kept]) / rollouts,
    }  # fmt: skip


def table(rows: list[dict]) -> str:
    return markdown_table(rows, FIELDS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=16, help="rollouts per step (8 per prompt)")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=1, help="first steps left out")
    parser.add_argument("--results", default=str(RESULTS))
    parser.add_argument("--table", default=None, help="print the table of a results file and exit")
    args = parser.parse_args()
    if args.table:
        print(table([json.loads(line) for line in Path(args.table).read_text().splitlines() if line.strip()]))
        return
    rows = run(args)
    with open(args.results, "a", encoding="utf-8") as file:
        for row in rows:
            file.write(json.dumps(row) + "\n")
    print(table(rows))


if __name__ == "__main__":
    sys.exit(main())
