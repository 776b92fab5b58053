"""Evaluation speed: suzak's HF engine (R1-V's protocol, batch 64) against its vLLM engine on SuperCLEVR-shaped items.

    python bench/bench_eval_speed.py --device cuda --shape 3b             # hf batch 64, then vllm (when it imports)
    python bench/bench_eval_speed.py --device cuda --rows vllm:64 vllm:200
    python bench/bench_eval_speed.py --device cpu --shape tiny --items 32   # the same script on the CPU (hf)
    VLLM_CPU_KVCACHE_SPACE=1 .venv-vllm/bin/python bench/bench_eval_speed.py --device cpu --rows hf:8 vllm:8 --items 32
    python bench/bench_eval_speed.py --table bench/results_eval_speed.jsonl

The items are R1-V's SuperCLEVR format (``python -m suzak.eval superclevr``: its question, prompt and scorer) with
procedural scenes rendered at 480x320 (187 visual tokens under the recipe budget); every answer is exactly
``--answer_tokens`` long (HF ``min_new_tokens``, vLLM ``min_tokens``), so both engines generate the same number of
tokens. The model is a random-init real shape (bench/shapes.py) or the tiny model. Each engine runs in its own
process: ``load_s`` is loading the model (and starting vLLM), ``items_per_s`` the evaluation proper (generation,
scoring, R1-V's JSON written) after a warm-up batch.
"""

from __future__ import annotations

import argparse
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
RESULTS = ROOT / "bench" / "results_eval_speed.jsonl"
ROW_MARK = "BENCH_ROW "
RENDER = (480, 320)  # (w, h), the SuperCLEVR-shaped renders


def measure(engine_name: str, batch_size: int, args) -> dict:
    import torch

    from suzak.eval.fixtures import write_superclevr
    from suzak.eval.runner import EvalConfig, build_engine, default_budget, engine_row, evaluate, prepare_items
    from suzak.eval.tasks import get_task

    root = Path(tempfile.mkdtemp(prefix="suzak-eval-speed-"))
    prompts = write_superclevr(root, args.items, sizes=(RENDER,))
    model_path = _model_path(args)
    task = get_task("superclevr")
    config = EvalConfig(task="superclevr", model_path=model_path, prompt_path=str(prompts), image_root=str(root),
                        output_path=str(root / "results.json"), engine=engine_name, batch_size=batch_size,
                        max_new_tokens=args.answer_tokens, progress=False, fresh=True)  # fmt: skip
    items, _ = prepare_items(config, task)
    start = time.perf_counter()
    engine = build_engine(config, task, default_budget(config), items)
    engine.min_new_tokens = args.answer_tokens
    engine.generate([engine_row(item) for item in items[: min(8, len(items))]])  # warm-up (and vLLM's start)
    load_s = time.perf_counter() - start
    start = time.perf_counter()
    report = evaluate(config, engine=engine)
    seconds = time.perf_counter() - start
    outputs = [r["model_output"] for r in json.loads(Path(report.greedy.path).read_text())["results"]]
    tokenizer = getattr(engine.processing_class, "tokenizer", engine.processing_class)
    lengths = [len(tokenizer(o, add_special_tokens=False)["input_ids"]) for o in outputs]
    return {
        "engine": engine_name, "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "shape": args.shape, "items": len(items), "batch_size": batch_size, "answer_tokens": args.answer_tokens,
        "items_per_s": round(len(items) / seconds, 2), "seconds": round(seconds, 1), "load_s": round(load_s, 1),
        "answer_tokens_per_s": round(len(items) * args.answer_tokens / seconds, 1),
        "decoded_tokens_median": statistics.median(lengths), "render": f"{RENDER[0]}x{RENDER[1]}",
    }  # fmt: skip


def _model_path(args) -> str:
    if args.shape == "tiny":  # the vLLM-ready tiny (head_dim 32: vLLM's CPU attention refuses the default's 16)
        from suzak.models.loading import resolve_model_path

        return resolve_model_path("tiny", for_vllm=True)  # for both engines: one model, comparable rows
    from shapes import make_random_model

    return str(make_random_model(args.shape, Path(args.model_dir) / f"qwen2.5-vl-{args.shape}-random"))


def child(args) -> None:
    engine_name, batch_size = args.child.split(":")
    try:
        row = measure(engine_name, int(batch_size), args) | {"status": "ok"}
    except Exception as error:  # noqa: BLE001 - a failed engine is a row of the table
        row = {"engine": engine_name, "device": args.device, "shape": args.shape, "items": args.items,
               "batch_size": int(batch_size), "status": f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"}  # fmt: skip
    print(ROW_MARK + json.dumps(row), flush=True)


COLUMNS = ["engine", "device", "shape", "items", "batch_size", "answer_tokens", "items_per_s", "answer_tokens_per_s",
           "seconds", "load_s", "status"]  # fmt: skip


def table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(str(r.get(c, "")) for c in COLUMNS) + " |" for r in rows]
    speeds = {r["engine"]: r["items_per_s"] for r in rows if r.get("status") == "ok"}
    if {"hf", "vllm"} <= set(speeds):
        lines.append(f"\nvLLM / HF items/s: {speeds['vllm'] / speeds['hf']:.2f}x")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    parser.add_argument("--shape", choices=["tiny", "3b", "7b"], default=None, help="default: 3b on cuda, tiny on cpu")
    parser.add_argument("--rows", nargs="+", help="ENGINE:BATCH, e.g. hf:64 vllm:64 (default: hf:64, vllm:64)")
    parser.add_argument("--items", type=int, default=200, help="SuperCLEVR-shaped items (R1-V's test set: 200)")
    parser.add_argument("--answer_tokens", type=int, default=128, help="fixed answer length in tokens")
    parser.add_argument("--model_dir", default="/tmp/suzak-bench", help="where random-init models are saved")
    parser.add_argument("--results", default=str(RESULTS))
    parser.add_argument("--log_dir", default=None, help="one log per engine here (default: a new temp folder)")
    parser.add_argument("--table", default=None, help="print the table of a results file and exit")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.shape = args.shape or ("3b" if args.device == "cuda" else "tiny")
    if args.child:
        return child(args)
    if args.table:
        print(table([json.loads(line) for line in Path(args.table).read_text().splitlines() if line.strip()]))
        return
    import importlib.util

    rows = args.rows or ["hf:64"] + (["vllm:64"] if importlib.util.find_spec("vllm") and args.device == "cuda" else [])
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="suzak-eval-speed-logs-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    measured = []
    for spec in rows:
        command = [sys.executable, str(Path(__file__).resolve()), "--child", spec, "--device", args.device,
                   "--shape", args.shape, "--items", str(args.items), "--answer_tokens", str(args.answer_tokens),
                   "--model_dir", args.model_dir]  # fmt: skip
        log = log_dir / f"eval-{args.shape}-{spec.replace(':', '-')}-{int(time.time())}.log"
        with log.open("w") as handle:  # streamed: a run killed at a time limit leaves its log
            result = subprocess.run(command, cwd=ROOT, env=os.environ | {"PYTHONUNBUFFERED": "1"}, stdout=handle,
                                    stderr=subprocess.STDOUT)  # fmt: skip
        output = log.read_text()
        found = [line[len(ROW_MARK) :] for line in output.splitlines() if line.startswith(ROW_MARK)]
        tail = " | ".join(output.strip().splitlines()[-3:])[-300:]
        row = json.loads(found[-1]) if found else {"engine": spec, "status": f"exit {result.returncode}: {tail}"}
        row |= {"date": datetime.date.today().isoformat(), "commit": commit()}
        measured.append(row)
        with open(args.results, "a") as handle:
            handle.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)
    print(table(measured))
    print(f"rows appended to {args.results}; logs in {log_dir}")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/shapes.py
    main()
