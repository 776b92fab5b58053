"""Peak GPU memory and step time of suzak's GRPO on random-init Qwen2.5-VL-3B/7B shapes (GPU only).

No real weights are reachable here, so the model is the real architecture at the real size with random weights,
the tokenizer/processor are the offline tiny ones, and every completion is forced to a fixed length
(``min_new_tokens``), which makes memory and time comparable to a real run at that completion length.

    python bench/bench_grpo_memory.py --shape 3b --mode full --steps 3              # one configuration
    python bench/bench_grpo_memory.py --shape 7b --mode qlora --steps 3             # LoRA r64 on a 4-bit nf4 base
    torchrun --nproc_per_node 1 bench/bench_grpo_memory.py --shape 3b --deepspeed ds_configs/zero2.json
    python bench/bench_grpo_memory.py --table results.jsonl                         # print the comparison table

Each run appends one JSON line to --results (default bench/results_grpo_memory.jsonl).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
from shapes import SHAPES, make_random_model
from transformers import TrainerCallback


class StepStats(TrainerCallback):
    """Wall time per optimizer step and the peak GPU memory over the run."""

    def __init__(self):
        self.step_times: list[float] = []
        self._start = None

    def on_step_begin(self, args, state, control, **kwargs):
        torch.cuda.synchronize()
        self._start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        torch.cuda.synchronize()
        self.step_times.append(time.perf_counter() - self._start)


def run(args) -> dict:
    from suzak.training.build import grpo_trainer
    from suzak.training.configs import parse_args

    folder = make_random_model(args.shape, Path(args.model_dir) / f"qwen2.5-vl-{args.shape}-random")
    cli = [
        "--config", "recipes/clevr_qwen2.5vl_7b.yaml", "--model_name_or_path", str(folder),
        "--dataset_name", "clevr_synthetic", "--dataset_options", json.dumps({"num_rows": 256, "progress": False}),
        "--output_dir", str(Path(args.model_dir) / "bench-out"), "--max_steps", str(args.steps),
        "--report_to", "none", "--save_strategy", "no", "--logging_steps", "1", "--log_completions", "false",
        "--max_completion_length", str(args.completion), "--per_device_train_batch_size", str(args.batch),
        "--gradient_accumulation_steps", "1", "--preflight_rows", "0", "--attn_implementation", "sdpa",
    ]  # fmt: skip
    if args.deepspeed:
        cli += ["--deepspeed", args.deepspeed]
    if args.mode in ("lora", "qlora"):
        cli += ["--use_peft", "true", "--lora_r", "64", "--lora_alpha", "128", "--lora_target_modules", "q_proj", "k_proj", "v_proj", "o_proj"]  # fmt: skip
    if args.mode == "qlora":  # the same adapters on an nf4 base (vision tower and lm_head unquantized)
        cli += ["--load_in_4bit", "true", "--bnb_4bit_quant_type", "nf4"]
    if args.mode == "freeze_vision":
        cli += ["--freeze_vision_tower", "true"]
    suzak_args, grpo_args, model_args = parse_args(cli)
    grpo_args.generation_kwargs = {"min_new_tokens": args.completion}  # fixed completion length
    stats = StepStats()
    trainer = grpo_trainer(suzak_args, grpo_args, model_args, callbacks=[stats])
    torch.cuda.reset_peak_memory_stats()
    trainer.train()
    completions = args.batch * torch.distributed.get_world_size() if torch.distributed.is_initialized() else args.batch
    steady = stats.step_times[1:] or stats.step_times
    weights = (
        "nf4 + bf16 vision/embeddings + fp32 adapters"
        if args.mode == "qlora"
        else next(trainer.model.parameters()).dtype
    )
    return {
        "shape": args.shape, "mode": args.mode, "weights": str(weights).removeprefix("torch."),
        "deepspeed": Path(args.deepspeed).stem if args.deepspeed else "none",
        "gpus": int(os.environ.get("WORLD_SIZE", "1")), "batch_completions": args.batch, "completion_tokens": args.completion,
        "beta": grpo_args.beta, "gradient_checkpointing": grpo_args.gradient_checkpointing,
        "peak_allocated_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1),
        "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / 2**30, 1),
        "s_per_step": round(sum(steady) / len(steady), 2),
        "completion_tokens_per_s": round(completions * args.completion / (sum(steady) / len(steady)), 1),
        "device": torch.cuda.get_device_name(),
    }  # fmt: skip


def print_table(path: Path) -> None:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    cols = ["shape", "mode", "weights", "deepspeed", "gpus", "batch_completions", "completion_tokens", "peak_allocated_gib",
            "peak_reserved_gib", "s_per_step", "completion_tokens_per_s", "status"]  # fmt: skip
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for row in rows:
        print("| " + " | ".join(str(row.get(c, "")) for c in cols) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="3b")
    parser.add_argument("--mode", choices=["full", "lora", "qlora", "freeze_vision"], default="full")
    parser.add_argument("--deepspeed", default=None, help="DeepSpeed config (run under torchrun)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8, help="completions per GPU per step (8 = 1 prompt x 8)")
    parser.add_argument("--completion", type=int, default=256, help="fixed completion length in tokens")
    parser.add_argument("--model_dir", default="/tmp/suzak-bench", help="where random models are saved")
    parser.add_argument("--results", default="bench/results_grpo_memory.jsonl")
    parser.add_argument("--table", default=None, help="print the table of a results file and exit")
    args = parser.parse_args()
    if args.table:
        return print_table(Path(args.table))
    try:
        result = run(args) | {"status": "ok"}
    except torch.OutOfMemoryError as error:
        result = {"shape": args.shape, "mode": args.mode, "deepspeed": args.deepspeed or "none",
                  "gpus": int(os.environ.get("WORLD_SIZE", "1")), "batch_completions": args.batch,
                  "completion_tokens": args.completion, "status": f"OOM ({str(error).splitlines()[0][:80]})"}  # fmt: skip
    if int(os.environ.get("RANK", "0")) == 0:
        with open(args.results, "a") as handle:
            handle.write(json.dumps(result) + "\n")
        print(json.dumps(result))


if __name__ == "__main__":
    main()
