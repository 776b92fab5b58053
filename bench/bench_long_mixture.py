"""A long mixed run holds (issue 67): resident memory, rows seen and the data order across a resume, on the CPU.

    python bench/bench_long_mixture.py                       # 400 steps, resumed once from step 200
    python bench/bench_long_mixture.py --max_steps 40 --resume_at 20   # a quick look
    python bench/bench_long_mixture.py --table bench/results_long_mixture.jsonl

The run is ``suzak train`` (the command a user runs) on ``recipes/mixture_smoke.yaml`` with a third source scored by
the local picture judge (``suzak.selftest.judge``: the tiny model taught "Is the image red?", trained here first),
``dynamic_sampling`` and ``vision_reuse`` on, a checkpoint at ``--resume_at``; then the same recipe is resumed from
that checkpoint (a copy of the run's folder, ``--resume_from_checkpoint latest``) to the same ``max_steps``.

Measured, per step, from outside (no change to what the run does): the training process's resident memory
(``VmRSS`` of /proc, sampled every 0.25 s; a step's figure is the largest sample between its end and the previous
step's, by metrics.csv's ``time``), for the first run and the resumed one. A row per run holds:

- ``rss_slope_mib_per_100_steps``: the least-squares slope of the step's RSS over the steps after warm-up
  (``--warmup`` steps), with ``rss_first``/``rss_last`` (MiB, medians of the first and last 20 steps after warm-up);
- ``rows_seen``: each source's distinct training rows drawn by the end, over its rows (completions.csv names each
  row's source and its row; :func:`suzak.data.mixture.mixture_order` says every row is drawn once an epoch);
- ``same_order_after_resume`` (the resumed row): whether the resumed run's steps after the checkpoint trained the same
  rows, in the same order, as the first run's (completions.csv: source and row per step), and how many steps match.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml
from stamp import commit, markdown_table  # bench/stamp.py (the script's folder is on sys.path)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results_long_mixture.jsonl"
FIELDS = ("run", "steps", "wall_s", "rss_first_mib", "rss_last_mib", "rss_slope_mib_per_100_steps", "rows_seen",
          "same_order_after_resume", "commit", "date")  # fmt: skip


def recipe(judge: Path, args) -> dict:
    """recipes/mixture_smoke.yaml with a judged third source, dynamic sampling, vision reuse and a checkpoint."""
    from transformers import AutoConfig

    from suzak.media.vision import patch_factor
    from suzak.selftest.judge import picture_judge_settings

    base = yaml.safe_load((ROOT / "recipes" / "mixture_smoke.yaml").read_text())
    judged = {"name": "judged", "dataset": "color_squares", "options": {"num_rows": 48, "seed": 7},
              "prompt_template": "plain", "rewards": ["judge"],
              "reward_kwargs": {"judge": picture_judge_settings(judge, patch_factor(AutoConfig.from_pretrained(judge)))}}  # fmt: skip
    return base | {
        "datasets": [*base["datasets"], judged],
        "preflight_rows": 0,  # the picture judge asks about the picture alone: it cannot pass the answer pre-flight
        "dynamic_sampling": True, "vision_reuse": True,
        "max_steps": args.max_steps, "eval_steps": args.eval_steps,
        "save_strategy": "steps", "save_steps": args.resume_at,
    }  # fmt: skip


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def run_sampled(command: list[str], log: Path) -> tuple[list[tuple[float, float]], float]:
    """Run ``command``, its output to ``log``; ((unix time, RSS MiB) samples every 0.25 s, wall seconds)."""
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"), TQDM_DISABLE="1")
    samples: list[tuple[float, float]] = []
    start = time.monotonic()
    with open(log, "w") as out:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)

        def sample() -> None:
            while process.poll() is None:
                if (rss := rss_mib(process.pid)) is not None:
                    samples.append((time.time(), rss))
                time.sleep(0.25)

        thread = threading.Thread(target=sample, daemon=True)
        thread.start()
        process.wait()
        thread.join()
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({process.returncode}):\n{log.read_text()[-3000:]}")
    return samples, time.monotonic() - start


def step_rss(out: Path, samples: list[tuple[float, float]]) -> dict[int, float]:
    """Each training step's peak RSS: the largest sample up to its metrics.csv ``time`` since the previous step's."""
    with open(out / "metrics.csv", newline="") as file:
        rows = [r for r in csv.DictReader(file) if r.get("step_time")]
    ends = {int(r["step"]): datetime.datetime.fromisoformat(r["time"]).timestamp() + 1 for r in rows}  # 1 s ticks
    peaks, previous = {}, 0.0
    for step in sorted(ends):
        inside = [rss for t, rss in samples if previous < t <= ends[step]]
        if inside:
            peaks[step] = max(inside)
        previous = ends[step]
    return peaks


def slope(points: dict[int, float], warmup: int) -> tuple[float, float, float]:
    """(MiB per 100 steps by least squares, median of the first 20 steps, of the last 20) after ``warmup`` steps."""
    steps = sorted(s for s in points if s > warmup)
    xs, ys = steps, [points[s] for s in steps]
    if len(xs) < 3:
        return float("nan"), float("nan"), float("nan")
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    beta = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sum((x - mean_x) ** 2 for x in xs)
    return 100 * beta, statistics.median(ys[:20]), statistics.median(ys[-20:])


def drawn(out: Path) -> dict[int, list[tuple[str, str]]]:
    """Each step's (source, row) pairs from completions.csv, one per prompt (a group's completions name one row)."""
    with open(out / "completions.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    key = "source_row" if rows and "source_row" in rows[0] else "image"
    steps: dict[int, list[tuple[str, str]]] = {}
    for row in rows:
        pair = (row["source"], row[key])
        mine = steps.setdefault(int(row["step"]), [])
        if not mine or mine[-1] != pair:
            mine.append(pair)
    return steps


def rows_seen(out: Path, sizes: dict[str, int]) -> dict[str, float]:
    seen: dict[str, set] = {}
    for pairs in drawn(out).values():
        for source, row in pairs:
            seen.setdefault(source, set()).add(row)
    return {name: round(len(seen.get(name, ())) / size, 3) for name, size in sizes.items()}


def source_sizes(config: dict) -> dict[str, int]:
    """Each source's training rows: its num_rows less its held-out rows (the recipe's eval_rows where it sets none)."""
    return {s["name"]: s["options"]["num_rows"] - (s.get("eval_rows") or config.get("eval_rows") or 0)
            for s in config["datasets"]}  # fmt: skip


def measure(args) -> list[dict]:
    tmp = Path(tempfile.mkdtemp(prefix="long-mixture-"))
    from suzak.selftest.judge import train_picture_judge

    judge, accuracy = train_picture_judge(tmp / "judge")
    print(f"picture judge trained: accuracy {accuracy:.2f} on unseen squares", flush=True)
    config = recipe(judge, args)
    path = tmp / "long_mixture.yaml"
    path.write_text(yaml.safe_dump(config))
    first, resumed = tmp / "first", tmp / "resumed"
    train = [sys.executable, "-m", "suzak", "train", "--config", str(path)]
    samples, wall = run_sampled([*train, "--output_dir", str(first)], tmp / "first.log")
    checkpoint = first / f"checkpoint-{args.resume_at}"
    if not checkpoint.is_dir():
        raise SystemExit(f"no {checkpoint}: the run saved {sorted(p.name for p in first.glob('checkpoint-*'))}")
    resumed.mkdir()  # a folder holding the checkpoint alone, as a run stopped right after saving it leaves
    shutil.copytree(checkpoint, resumed / checkpoint.name)
    for name in ("metrics.csv", "completions.csv", "train.log", "recipe.yaml", "run_info.json"):
        _copy_upto(first / name, resumed / name, args.resume_at)
    resumed_samples, resumed_wall = run_sampled(
        [*train, "--output_dir", str(resumed), "--resume_from_checkpoint", "latest"], tmp / "resumed.log"
    )
    sizes = source_sizes(config)
    a, b = drawn(first), drawn(resumed)
    after = [s for s in sorted(a) if s > args.resume_at]
    matching = sum(a[s] == b.get(s) for s in after)
    rows = []
    for name, out, points, seconds in (("first", first, samples, wall), ("resumed", resumed, resumed_samples,
                                                                       resumed_wall)):  # fmt: skip
        per_step = step_rss(out, points)
        beta, low, high = slope(per_step, args.warmup if name == "first" else args.resume_at + 5)
        rows.append({
            "run": name, "steps": len(per_step), "wall_s": round(seconds, 1), "rss_first_mib": round(low, 1),
            "rss_last_mib": round(high, 1), "rss_slope_mib_per_100_steps": round(beta, 2),
            "rows_seen": rows_seen(out, sizes), "same_order_after_resume":
                f"{matching}/{len(after)} steps" if name == "resumed" else "",
            "rss_per_step": {str(k): round(v, 1) for k, v in sorted(per_step.items())},
            "max_steps": args.max_steps, "resume_at": args.resume_at, "warmup": args.warmup,
            "cpus": os.cpu_count(), "commit": commit(), "date": datetime.date.today().isoformat(),
        })  # fmt: skip
    print(f"outputs in {tmp}", flush=True)
    return rows


def _copy_upto(src: Path, dst: Path, step: int) -> None:
    """A run's CSV/log as it stood at ``step`` (a CSV's rows up to that step; other files whole)."""
    if not src.is_file():
        return
    if src.suffix != ".csv":
        shutil.copy(src, dst)
        return
    with open(src, newline="") as file:
        reader = csv.DictReader(file)
        kept = [r for r in reader if int(r["step"] or 0) <= step]
        fields = reader.fieldnames or []
    with open(dst, "w", newline="") as file:
        writer = csv.DictWriter(file, fields)
        writer.writeheader()
        writer.writerows(kept)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max_steps", type=int, default=400)
    parser.add_argument("--resume_at", type=int, default=200, help="the checkpoint's step the second run resumes")
    parser.add_argument("--eval_steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=20, help="steps left out of the RSS slope")
    parser.add_argument("--table", help="print the table of this results file and exit")
    args = parser.parse_args()
    if args.table:
        rows = [json.loads(line) for line in Path(args.table).read_text().splitlines() if line.strip()]
        print(markdown_table(rows, FIELDS))
        return
    rows = measure(args)
    with open(RESULTS, "a") as file:
        for row in rows:
            file.write(json.dumps(row) + "\n")
    print(markdown_table(rows, FIELDS))


if __name__ == "__main__":
    main()
