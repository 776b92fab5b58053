"""Each distinct image encoded once per forward pass (``vision_reuse``): GRPO step time and the vision tower's FLOPs
per step, with and without, at G = 8, on a tiny shape whose vision/language cost per image token is Qwen2.5-VL-3B's.

    python bench/bench_vision_reuse.py                       # the CPU shape, 8 steps each way
    python bench/bench_vision_reuse.py --table bench/results_vision_reuse.jsonl

The shape (``suzak tiny`` with the flags below) is chosen so that the vision tower's FLOPs per merged image token
(4 patches through its blocks and merger) over the language model's per token is the ratio of the real 3B
(``bench/shapes.py``'s Hub config), both counted by :func:`flops` (2 x the weights a token passes through; attention
scores and the LM head left out). Each run is ``suzak train`` (the command a user runs) on ``color_squares`` of
``--image_tokens`` x ``--image_tokens`` visual tokens, ``--prompts`` prompts x 8 completions a step (one
micro-batch: whole groups), ``beta`` 0.04 (a reference pass, as R1-V's), ``max_completion_length`` 16. Step time is
TRL's ``step_time`` (generation, scoring, reference and policy passes, the update), the mean over the steps after
the first two. Vision FLOPs per step: images handed to the tower per step (the generation prefill, the reference
pass, the policy's forward; its backward counted as twice a forward) times ``vision/encoded_fraction`` times one
image's FLOPs.
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

from shapes import SHAPES, VISION  # bench/shapes.py (the script's folder is on sys.path)
from stamp import append_rows, commit, markdown_table

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results_vision_reuse.jsonl"
# The CPU shape: text 4 x 256 (MLP 1024), vision 4 x 128 (MLP 256): vision/text FLOPs per image token 0.920 (the
# 3B's 0.924), the closest of text 4-8 layers and vision 1-4 blocks of 128-256 wide with 2 blocks or more
TINY = {"hidden_size": 256, "num_hidden_layers": 4, "intermediate_size": 1024, "vision_depth": 4,
        "vision_hidden_size": 128, "vision_intermediate_size": 256}  # fmt: skip
FIELDS = ("vision_reuse", "step_seconds", "speedup", "encoded_fraction", "vision_gflops_per_step",
          "vision_share_of_flops", "steps", "commit", "date")  # fmt: skip


def flops(text: dict, vision: dict, heads: int, kv_heads: int) -> tuple[float, float]:
    """(the language model's FLOPs per token, the vision tower's per merged image token): 2 x the weights each
    passes through (a Qwen2.5-VL tower: gated MLP, 2x2 merge, the merger's two layers; patches of 2 x 14 x 14 x 3).

    >>> text, vision = flops(SHAPES["3b"], VISION, 16, 2)
    >>> round(vision / text, 3)
    0.924
    """
    h, inter, layers = text["hidden_size"], text["intermediate_size"], text["num_hidden_layers"]
    kv = 2 * kv_heads * (h // heads)
    per_token = 2 * layers * (h * (h + kv) + h * h + 3 * h * inter)
    vh, vinter, depth = vision["hidden_size"], vision["intermediate_size"], vision["depth"]
    per_patch = 2 * (depth * (4 * vh * vh + 3 * vh * vinter) + 2 * 14 * 14 * 3 * vh)
    merger = 2 * ((4 * vh) ** 2 + 4 * vh * h)
    return per_token, 4 * per_patch + merger


def tiny_flops(folder: Path) -> tuple[float, float]:
    config = json.loads((folder / "config.json").read_text())
    text = config["text_config"]
    vision = config["vision_config"]
    return flops(text, {"hidden_size": vision["hidden_size"], "intermediate_size": vision["intermediate_size"],
                        "depth": vision["depth"]}, text["num_attention_heads"], text["num_key_value_heads"])  # fmt: skip


def run(folder: Path, reuse: bool, args, tmp: Path) -> dict:
    out = tmp / f"reuse-{reuse}"
    side = 28 * args.image_tokens
    command = [sys.executable, "-m", "suzak", "train", "--config", "recipes/demo.yaml", "--model_name_or_path",
               str(folder), "--dataset_options", json.dumps({"num_rows": 400, "seed": 0, "size": side}),
               "--min_pixels", str(side * side), "--max_pixels", str(side * side), "--eval_rows", "0",
               "--per_device_train_batch_size", str(8 * args.prompts), "--max_completion_length", "16",
               "--beta", "0.04", "--max_steps", str(args.steps), "--vision_reuse", str(reuse).lower(),
               "--output_dir", str(out)]  # fmt: skip
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=dict(os.environ))
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")
    with open(out / "metrics.csv", newline="") as file:
        rows = [row for row in csv.DictReader(file) if row.get("step_time")]
    timed = rows[2:] or rows
    text, image = tiny_flops(folder)
    fraction = statistics.fmean(float(r["vision/encoded_fraction"]) for r in rows) if reuse else 1.0
    images = 8 * args.prompts * (1 + 1 + 3)  # prefill, reference, policy forward + backward (2 forwards)
    vision = images * fraction * image * args.image_tokens**2
    tokens = float(rows[-1]["num_tokens"]) / len(rows)  # per step (TRL's count is cumulative)
    return {"vision_reuse": reuse, "step_seconds": statistics.fmean(float(r["step_time"]) for r in timed),
            "encoded_fraction": fraction, "vision_gflops_per_step": vision / 1e9,
            "vision_share_of_flops": vision / (vision + 5 * text * tokens), "steps": len(rows),
            "image_tokens": args.image_tokens**2, "prompts": args.prompts, "generations": 8, "tiny": TINY,
            "flops_ratio": round(image / text, 3), "cpus": os.cpu_count(), "commit": commit(),
            "date": datetime.date.today().isoformat()}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=4, help="prompts a step (8 completions each)")
    parser.add_argument("--image_tokens", type=int, default=8, help="visual tokens along an image's side")
    parser.add_argument("--results", default=str(RESULTS))
    parser.add_argument("--table", default=None, help="print the table of a results file and stop")
    args = parser.parse_args()
    if args.table:
        rows = [json.loads(line) for line in Path(args.table).read_text().splitlines()]
        print(markdown_table(rows, FIELDS))
        return
    with tempfile.TemporaryDirectory(prefix="suzak-bench-reuse-") as tmp:
        folder = Path(tmp) / "tiny"
        flags = [f"--{key}={value}" for key, value in TINY.items()]
        subprocess.run([sys.executable, "-m", "suzak", "tiny", "--output", str(folder), *flags], cwd=ROOT, check=True,
                       capture_output=True)  # fmt: skip
        text, image = tiny_flops(folder)
        reference = flops(SHAPES["3b"], VISION, 16, 2)
        print(f"vision/text FLOPs per image token: this shape {image / text:.3f}, Qwen2.5-VL-3B "
              f"{reference[1] / reference[0]:.3f}")  # fmt: skip
        rows = [run(folder, reuse, args, Path(tmp)) for reuse in (False, True)]
    rows[1]["speedup"] = rows[0]["step_seconds"] / rows[1]["step_seconds"]
    rows[0]["speedup"] = 1.0
    append_rows(args.results, rows)
    print(markdown_table(rows, FIELDS))


if __name__ == "__main__":
    main()
