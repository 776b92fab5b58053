"""Throughput of the procedural CLEVR generator: full rows (scene, question, rendered image) on one process.

    python bench/bench_clevr.py              # 2000 scenes, 320x240, 3-10 objects
    python bench/bench_clevr.py --num 500 --max-objects 12

Prints a markdown table; the target is at least 3000 scenes per minute on one core.
"""

from __future__ import annotations

import argparse
import json
import time

from suzak.data.clevr import generate_rows


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num", type=int, default=2000, help="scenes to generate")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min-objects", type=int, default=3)
    parser.add_argument("--max-objects", type=int, default=10)
    parser.add_argument("--width", type=int, default=320)
    parser.add_argument("--height", type=int, default=240)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    rows = generate_rows(
        args.num,
        seed=args.seed,
        min_objects=args.min_objects,
        max_objects=args.max_objects,
        width=args.width,
        height=args.height,
    )
    start = time.perf_counter()
    objects = sum(len(json.loads(row["scene"])["objects"]) for row in rows)
    seconds = time.perf_counter() - start
    print("| scenes | seconds | scenes/minute | mean objects |")
    print("|---:|---:|---:|---:|")
    print(f"| {args.num} | {seconds:.2f} | {60 * args.num / seconds:,.0f} | {objects / args.num:.2f} |")


if __name__ == "__main__":
    main()
