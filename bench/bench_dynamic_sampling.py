"""Sample efficiency of dynamic sampling on the CPU: generated tokens and training time to held-out accuracy 0.9.

    python bench/bench_dynamic_sampling.py                   # demo and sparse, seeds 0-2, off and on
    python bench/bench_dynamic_sampling.py --tasks demo --seeds 0
    python bench/bench_dynamic_sampling.py --table bench/results_dynamic_sampling.jsonl

Each run is ``suzak train`` (the command a user runs), one thread, held-out accuracy every ``--eval_steps`` steps:

- ``demo``: recipes/demo.yaml as the quickstart runs it (150 steps; the run's seed varies, the data does not);
- ``sparse``: the same with the colour self-test's completion length (``suzak.selftest.TASKS["color"]``: 2 tokens),
  data drawn from the run's seed: ``word_match`` then pays only a completion that is the colour word and ends, which
  the random-init model almost never writes (the self-test itself pays the first token, a denser reward).

A row per run: ``dynamic_sampling`` off or on (``dynamic_sampling_max_rounds`` as given), the first step whose
held-out accuracy reached 0.9 (None: never), the tokens generated up to it (``generated_tokens``, every round's)
and the training seconds up to it (``step_time`` summed: generation, scoring and the update; the held-out
evaluations left out), the held-out accuracy at the end, and the totals. The table sums each setting over its seeds.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from stamp import commit, markdown_table  # bench/stamp.py (the script's folder is on sys.path)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results_dynamic_sampling.jsonl"
TARGET = 0.9
FIELDS = ("task", "dynamic_sampling", "seed", "steps_to_target", "tokens_to_target", "seconds_to_target",
          "final_heldout", "steps", "tokens", "seconds", "commit", "date")  # fmt: skip


def task_flags(task: str, seed: int) -> list[str]:
    """``suzak train`` flags of a task (beside the run's own)."""
    if task == "demo":
        return ["--config", "recipes/demo.yaml", "--seed", str(seed)]
    if task != "sparse":
        raise SystemExit(f"unknown task {task!r}: demo or sparse")
    from suzak.selftest import TASKS

    spec = TASKS["color"]
    return ["--config", "recipes/demo.yaml", "--seed", str(seed), "--max_completion_length",
            str(spec.max_completion_length), "--dataset_options", json.dumps({"num_rows": 2200, "seed": seed})]  # fmt: skip


def run_one(task: str, seed: int, dynamic: bool, args, tmp: Path) -> dict:
    out = tmp / f"{task}-{seed}-{'on' if dynamic else 'off'}"
    command = [sys.executable, "-m", "suzak", "train", *task_flags(task, seed), "--output_dir", str(out),
               "--eval_steps", str(args.eval_steps), "--dynamic_sampling", str(dynamic).lower(),
               "--dynamic_sampling_max_rounds", str(args.max_rounds)]  # fmt: skip
    command += ["--max_steps", str(args.max_steps)] if args.max_steps else []
    env = dict(os.environ, OMP_NUM_THREADS="1")
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")
    with open(out / "metrics.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    steps = [r for r in rows if r.get("generated_tokens")]
    heldout = {int(r["step"]): float(r["eval/accuracy"]) for r in rows if r.get("eval/accuracy")}
    reached = next((step for step, accuracy in sorted(heldout.items()) if accuracy >= TARGET), None)
    upto = [r for r in steps if reached is not None and int(r["step"]) <= reached]
    return {
        "task": task, "dynamic_sampling": dynamic, "seed": seed, "steps_to_target": reached,
        "tokens_to_target": sum(float(r["generated_tokens"]) for r in upto) if reached is not None else None,
        "seconds_to_target": sum(float(r["step_time"]) for r in upto) if reached is not None else None,
        "final_heldout": heldout[max(heldout)], "steps": len(steps),
        "tokens": sum(float(r["generated_tokens"]) for r in steps), "seconds": sum(float(r["step_time"]) for r in steps),
        "max_rounds": args.max_rounds if dynamic else None, "cpus": os.cpu_count(), "commit": commit(),
        "date": datetime.date.today().isoformat(),
    }  # fmt: skip


def table(rows: list[dict]) -> str:
    """Per run, then per (task, setting): runs that reached the target, and the mean over those of each figure."""
    lines = [markdown_table(rows, FIELDS, digits=4), "", "| task | dynamic_sampling | reached 0.9 | mean steps | mean tokens | mean seconds | mean final |",
              "|---|---|---|---|---|---|---|"]  # fmt: skip
    for key in sorted({(r["task"], r["dynamic_sampling"]) for r in rows}):
        runs = [r for r in rows if (r["task"], r["dynamic_sampling"]) == key]
        done = [r for r in runs if r["steps_to_target"] is not None]

        def mean(name: str, done=done) -> str:
            return f"{statistics.fmean(r[name] for r in done):.4g}" if done else "-"

        final = statistics.fmean(r["final_heldout"] for r in runs)
        lines.append(f"| {key[0]} | {key[1]} | {len(done)}/{len(runs)} | {mean('steps_to_target')} | "
                     f"{mean('tokens_to_target')} | {mean('seconds_to_target')} | {final:.3f} |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="+", default=["demo", "sparse"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--eval_steps", type=int, default=10, help="steps between held-out evaluations")
    parser.add_argument("--max_rounds", type=int, default=3, help="dynamic_sampling_max_rounds of the runs with it")
    parser.add_argument("--max_steps", type=int, default=None, help="steps of every run (default: the task's)")
    parser.add_argument("--results", default=str(RESULTS))
    parser.add_argument("--table", default=None, help="print the table of a results file and exit")
    args = parser.parse_args()
    if args.table:
        print(table([json.loads(line) for line in Path(args.table).read_text().splitlines() if line.strip()]))
        return
    tmp = Path(tempfile.mkdtemp(prefix="suzak-bench-ds-"))
    rows = []
    for task in args.tasks:
        for seed in args.seeds:
            for dynamic in (False, True):  # each seed's pair back to back: the same machine load for both
                row = run_one(task, seed, dynamic, args, tmp)
                with open(args.results, "a", encoding="utf-8") as file:
                    file.write(json.dumps(row) + "\n")
                rows.append(row)
                print(json.dumps(row), flush=True)
    print(table(rows))


if __name__ == "__main__":
    sys.exit(main())
