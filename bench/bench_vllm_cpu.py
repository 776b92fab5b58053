"""vLLM's CPU build against HF generation on the demo recipe, and vLLM's engine start, on this machine's CPU.

    .venv-vllm/bin/python bench/bench_vllm_cpu.py                 # both generations, 50 steps each, + engine start
    .venv-vllm/bin/python bench/bench_vllm_cpu.py --steps 150 --generations vllm
    python bench/bench_vllm_cpu.py --table bench/results_vllm_cpu.jsonl

A fact about the CPU tier, not a target: what matters is the GPU ratio (bench/bench_grpo_speed.py on the H100). Each
run is ``python -m suzak.train --config recipes/demo.yaml`` on the vLLM-ready tiny Qwen2.5-VL (both generations on
the same model, fp32, 16 prompts x 8 one-token completions a step), in its own process; the row has the median
step time after the first 5 steps (TRL's ``step_time``), the wall time of the whole command, and the reward and
held-out accuracy it reached. ``engine`` rows time ``vllm.LLM`` as TRL's colocate mode builds it (external launcher,
in the calling process, the policy's dtype, eager as suzak runs vLLM's CPU build) from the call to a ready engine,
twice: the first start of a fresh machine also compiles vLLM's sampler (cached under ~/.cache/vllm), the second reads
the cache. Rows before 2026-11-27 were taken with vLLM's start-up torch.compile of the model (suzak's default then).
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
import time
from pathlib import Path

from stamp import commit  # bench/stamp.py (the script's folder is on sys.path)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results_vllm_cpu.jsonl"


def train_row(generation: str, steps: int, model: str) -> dict:
    output_dir = Path(tempfile.mkdtemp(prefix=f"suzak-vllm-cpu-{generation}-"))
    command = [sys.executable, "-m", "suzak.train", "--config", "recipes/demo.yaml", "--model_name_or_path", model,
               "--max_steps", str(steps), "--output_dir", str(output_dir), "--use_vllm", str(generation == "vllm")]  # fmt: skip
    start = time.monotonic()
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - start
    if result.returncode != 0:
        return {"kind": "train", "generation": generation, "status": result.stderr.strip().splitlines()[-1][:200]}
    with open(output_dir / "metrics.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    steps_rows = [r for r in rows if r.get("step_time")]
    times = [float(r["step_time"]) for r in steps_rows[5:]]
    rewards = [float(r["reward"]) for r in steps_rows]
    heldout = [float(r["eval/accuracy"]) for r in rows if r.get("eval/accuracy")]
    return {"kind": "train", "generation": generation, "steps": steps, "s_per_step": round(statistics.median(times), 3),
            "wall_s": round(wall, 1), "reward_first10": round(statistics.fmean(rewards[:10]), 3),
            "reward_last10": round(statistics.fmean(rewards[-10:]), 3),
            "heldout_final": heldout[-1] if heldout else None, "status": "ok"}  # fmt: skip


def engine_row(model: str, attempt: int) -> dict:
    """``vllm.LLM`` built as TRL's colocate mode builds it, in a child process (one engine per process)."""
    code = f"""
import os, time, torch
os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
from suzak.trl_internals.vllm_engine import keep_vllm_cpu_weights_live, vllm_cpu_settings
keep_vllm_cpu_weights_live()
from vllm import LLM
start = time.monotonic()
LLM(model={model!r}, distributed_executor_backend="external_launcher", max_num_batched_tokens=4096, seed=0,
    logprobs_mode="processed_logprobs", dtype=torch.float32, max_model_len=1024, **vllm_cpu_settings())
print("ENGINE_START", time.monotonic() - start)
"""
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    seconds = [line.split()[1] for line in result.stdout.splitlines() if line.startswith("ENGINE_START")]
    if not seconds:
        return {"kind": "engine", "attempt": attempt, "status": (result.stderr.strip().splitlines() or ["?"])[-1][:200]}
    return {"kind": "engine", "attempt": attempt, "start_s": round(float(seconds[0]), 1), "status": "ok"}


def table(path: Path) -> str:
    lines = ["| date | commit | kind | generation | steps | s/step | wall s | reward first 10 -> last 10 | held-out | "
             "engine start s | status |", "|---" * 11 + "|"]  # fmt: skip
    for line in path.read_text().splitlines():
        r = json.loads(line)
        reward = f"{r['reward_first10']} -> {r['reward_last10']}" if "reward_last10" in r else ""
        lines.append(f"| {r['date']} | {r['commit']} | {r['kind']} | {r.get('generation', '')} | {r.get('steps', '')} | "
                     f"{r.get('s_per_step', '')} | {r.get('wall_s', '')} | {reward} | {r.get('heldout_final', '')} | "
                     f"{r.get('start_s', '')} | {r['status']} |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--generations", nargs="+", choices=["hf", "vllm"], default=["hf", "vllm"])
    parser.add_argument("--engine_starts", type=int, default=2, help="engine rows (0: none)")
    parser.add_argument("--results", default=str(RESULTS))
    parser.add_argument("--table", default=None, help="print the table of a results file and exit")
    args = parser.parse_args()
    if args.table:
        print(table(Path(args.table)))
        return
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from suzak.models.loading import resolve_model_path

    model = resolve_model_path("tiny", for_vllm=True)  # the same model for both generations
    stamp = {"date": datetime.date.today().isoformat(), "commit": commit(), "cpus": os.cpu_count()}
    rows = [engine_row(model, i + 1) for i in range(args.engine_starts)]
    rows += [train_row(generation, args.steps, model) for generation in args.generations]
    with open(args.results, "a") as file:
        for row in rows:
            file.write(json.dumps(stamp | row) + "\n")
    print(table(Path(args.results)))


if __name__ == "__main__":
    main()
