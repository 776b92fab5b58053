"""Cost of validating a whole dataset before step 1 (suzak.training.checks.validate_rows) on procedural CLEVR rows.

    python bench/bench_validation.py                  # 70,000 rows (R1-V's CLEVR set is ~70k), every core
    python bench/bench_validation.py --rows 5000 --num_proc 1

The rows are drawn once into datasets' cache (``--cache_dir``) and not timed; the validation (every image decoded
and fitted to the budget, every gold answer read by clevr_count's parser) is timed cold, with datasets' own cache of
the validation result disabled. One JSON line per run goes to --results; the table compares the time with one
epoch at the only measured H100 step time (13.3 s per prompt of 8 completions x 256 tokens, docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
H100_S_PER_PROMPT = 13.3  # docs/benchmarks.md: 3B, zero2_offload, 8 completions x 256 tokens per step, one H100


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=70_000)
    parser.add_argument("--num_proc", type=int, default=None, help="default: every core")
    parser.add_argument("--cache_dir", default="/tmp/suzak-bench-validation")
    parser.add_argument("--results", default=str(ROOT / "bench" / "results_validation.jsonl"))
    args = parser.parse_args()

    import datasets
    from transformers import AutoConfig

    from suzak.data.builders import clevr_synthetic
    from suzak.media.vision import PixelBudget
    from suzak.scoring.rewards import clevr_count, gold_parser
    from suzak.training.checks import validate_rows

    start = time.perf_counter()
    dataset = clevr_synthetic(args.rows, seed=0, cache_dir=args.cache_dir)
    built = time.perf_counter() - start
    datasets.disable_caching()  # time the validation itself, not a cached result
    num_proc = args.num_proc or os.cpu_count()
    start = time.perf_counter()
    budget = PixelBudget().for_model(AutoConfig.for_model("qwen2_5_vl"))  # Qwen2.5-VL's patch grid, as R1-V's runs
    problems = validate_rows(dataset, budget, {"clevr_count": gold_parser(clevr_count)}, num_proc=num_proc)
    seconds = time.perf_counter() - start
    epoch = args.rows * H100_S_PER_PROMPT
    row = {"rows": args.rows, "num_proc": num_proc, "cpus": os.cpu_count(), "seconds": round(seconds, 1),
           "ms_per_row": round(1000 * seconds / args.rows, 3), "bad_rows": len(problems),
           "build_seconds": round(built, 1), "epoch_fraction_1xH100": round(seconds / epoch, 6),
           "epoch_fraction_8xH100": round(seconds / (epoch / 8), 6), "date": datetime.date.today().isoformat()}  # fmt: skip
    with open(args.results, "a") as handle:
        handle.write(json.dumps(row) + "\n")
    print("| rows | processes | seconds | ms/row | bad | share of one epoch (1 H100 / 8 H100) |")
    print("|---:|---:|---:|---:|---:|---|")
    print(f"| {row['rows']:,} | {num_proc} | {row['seconds']} | {row['ms_per_row']} | {row['bad_rows']} | "
          f"{row['epoch_fraction_1xH100']:.4%} / {row['epoch_fraction_8xH100']:.4%} |")  # fmt: skip


if __name__ == "__main__":
    main()
