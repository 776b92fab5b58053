"""Padding-free training passes (``padding_free``): the time of GRPO's training passes on a generation batch padded
as TRL pads it, against the same rows packed (``suzak.models.packing``), on a CPU shape with Qwen2.5-VL-3B's
vision/language proportions (``bench_vision_reuse.py``'s).

    python bench/bench_padding_free.py                        # both scenarios, 3 runs of each way (and budgets)
    python bench/bench_padding_free.py --whole_step               # the whole GRPO step of a suzak train run, both ways
    python bench/bench_padding_free.py --table bench/results_padding_free.jsonl

Scenarios (``--batches`` generation batches of two groups of 8 completions each, micro-batches of 8 rows, as the GPU
recipes):

- ``geoqa``: one task; every prompt an image of ``--image_tokens`` visual tokens and a question, ~400 tokens in
  all; completion lengths drawn from R1-V's GeoQA outputs (``bench/geoqa_completion_tokens.json``: 754 answers of
  Qwen2-VL-7B, mean ~130 tokens, max ~1,220);
- ``mixture``: one group of screens with 2.5x the visual tokens beside one group of geometry, lengths drawn alike.

Each scenario three ways: padded (TRL), packed (``padding_free``), and packed with each ``--budgets`` value as
``max_tokens_per_micro_batch`` (the no-gradient calls in runs of at most that many tokens, the loss passes dealt by
tokens and cut to the budget, as the trainer does: :func:`plan`).

The passes timed are what padding changes: the old log-probabilities and the reference (no gradient) and the loss
pass with its backward, through TRL's fused LM head (``model(..., labels=, fused_lm_head=True)``), as TRL calls
them: every micro-batch at the width of the whole generation batch (prompts left-padded, completions right-padded).
Generation, scoring and the optimizer step are left out (padding-free does not touch them; the whole step's share
of them is the training log's ``step_time`` in a real run). Each row: the median over ``--runs`` of the passes'
seconds, the real-token fraction of the positions computed, EasyR1's tokens/s (prompt with its visual tokens +
completion, over the passes' time), and the largest difference of a log-probability from the padded run's.

``--whole_step``: the whole GRPO step (TRL's ``step_time``: generation, scoring, the reference and loss passes; the
optimizer step is outside it) of ``suzak train`` on ``recipes/mixture_smoke.yaml`` (colour squares of 64 visual
tokens beside boxes of 128, 16 completions a step) with the same model shape, ``--padding_free`` false and true in
turn, ``--runs`` runs each; the median over runs of the mean over steps 3 on of ``step_time``, and the run's
``perf/real_token_fraction`` and ``perf/tokens_per_s``. The random-init model's completions run to
``max_completion_length`` (it rarely samples its end token), so the padding this run leaves out is the prompts' (the
two sources' images) and a few early ends: less than the GeoQA lengths give.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from bench_vision_reuse import TINY  # noqa: E402  the 3B's vision/language proportions
from stamp import append_rows, commit, markdown_table  # noqa: E402

RESULTS = ROOT / "bench" / "results_padding_free.jsonl"
LENGTHS = ROOT / "bench" / "geoqa_completion_tokens.json"
FIELDS = ("scenario", "mode", "passes_s", "speedup", "real_token_fraction", "tokens_per_s", "max_logp_diff",
          "positions", "real_tokens", "runs", "commit", "date")  # fmt: skip
STEP_FIELDS = ("scenario", "mode", "step_s", "speedup", "real_token_fraction", "tokens_per_s", "steps", "runs",
               "commit", "date")  # fmt: skip


def whole_step(folder: Path, packed: bool, steps: int, tmp: Path, budget: int | None = None) -> dict:
    """One ``suzak train`` run of the mixture smoke recipe on ``folder``'s model (with ``budget`` as
    ``max_tokens_per_micro_batch``): its mean ``step_time`` over steps 3 on, real-token fraction and tokens/s (means
    over the same steps)."""
    import csv

    out = tmp / f"step-{packed}-{budget}"
    shutil.rmtree(out, ignore_errors=True)
    command = [sys.executable, "-m", "suzak", "train", "--config", "recipes/mixture_smoke.yaml", "--model_name_or_path",
               str(folder), "--eval_rows", "0", "--eval_steps", "0", "--max_steps", str(steps), "--beta", "0.04",
               "--max_completion_length", "128", "--padding_free", str(packed).lower(), "--output_dir", str(out)]  # fmt: skip
    if budget is not None:
        command += ["--max_tokens_per_micro_batch", str(budget)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=dict(os.environ))
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")
    with open(out / "metrics.csv", newline="") as file:
        rows = [row for row in csv.DictReader(file) if row.get("step_time")]
    timed = rows[2:] or rows
    return {name: statistics.fmean(float(r[column]) for r in timed)
            for name, column in (("step_s", "step_time"), ("real_token_fraction", "perf/real_token_fraction"),
                                 ("tokens_per_s", "perf/tokens_per_s"))}  # fmt: skip


def _picture(side: int, seed: int):
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8), "RGB")


def batch(processor, groups: list[tuple[int, int]], lengths: list[int], rng: random.Random, vocab: int) -> dict:
    """A generation batch as TRL pads it: ``groups`` of (image side in merged patches, prompt words), 8 rows each,
    completions of lengths drawn from ``lengths``."""
    texts, images = [], []
    for number, (side, words) in enumerate(groups):
        picture = _picture(28 * side, number)
        question = " ".join(["what is the angle of the figure"] * (words // 7))
        content = [{"type": "image"}, {"type": "text", "text": question}]
        text = processor.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                             add_generation_prompt=True)  # fmt: skip
        texts += [text] * 8
        images += [picture] * 8
    processor.tokenizer.padding_side = "left"
    prompt = processor(text=texts, images=images, padding=True, return_tensors="pt")
    drawn = [rng.choice(lengths) for _ in texts]
    width = max(drawn)
    completion = torch.randint(10, vocab - 10, (len(texts), width))
    mask = (torch.arange(width)[None] < torch.tensor(drawn)[:, None]).long()
    completion = completion.masked_fill(mask == 0, processor.tokenizer.pad_token_id)
    return {"input_ids": torch.cat([prompt["input_ids"], completion], 1),
            "attention_mask": torch.cat([prompt["attention_mask"], mask], 1),
            "mm_token_type_ids": torch.cat([prompt["mm_token_type_ids"], torch.zeros_like(completion)], 1),
            "pixel_values": prompt["pixel_values"], "image_grid_thw": prompt["image_grid_thw"],
            "completion_width": width}  # fmt: skip


def rows_of(full: dict, index: list[int]) -> dict:
    """The rows ``index`` of a batch (one image a row), each with its image, at the batch's width (as TRL's)."""
    per_image = full["image_grid_thw"].prod(-1)
    starts = torch.cat([torch.zeros(1, dtype=torch.long), per_image.cumsum(0)])
    pixels = torch.cat([full["pixel_values"][starts[i] : starts[i + 1]] for i in index])
    chosen = torch.tensor(index)
    return {"input_ids": full["input_ids"][chosen], "attention_mask": full["attention_mask"][chosen],
            "mm_token_type_ids": full["mm_token_type_ids"][chosen], "pixel_values": pixels,
            "image_grid_thw": full["image_grid_thw"][chosen]}  # fmt: skip


def plan(full: dict, rows: int, budget: int | None) -> tuple[list[list[int]], list[list[int]]]:
    """The rows of each no-gradient call (old log-probs and reference) and of each loss pass over a generation batch:
    TRL's micro-batches of ``rows`` rows for both; with a ``budget`` (``max_tokens_per_micro_batch``), as suzak's
    trainer cuts them (:mod:`suzak.trl_internals.micro_batches`): no-gradient calls in runs of at most the budget's
    tokens, the batch dealt into its micro-batches by tokens (whole groups of 8), each in the fewest passes of at most
    the budget (by rows where a group is over it)."""
    from suzak.trl_internals.micro_batches import balanced_parts, contiguous_runs, grouped, passes_of

    count = full["input_ids"].size(0)
    if budget is None:
        chunks = [list(range(first, min(first + rows, count))) for first in range(0, count, rows)]
        return chunks, chunks
    tokens = full["attention_mask"].sum(1).tolist()
    groups = grouped(tokens, 8)
    loss = []
    for step in balanced_parts([sum(tokens[r] for r in g) for g in groups], count // rows):
        step_rows = [r for g in step for r in groups[g]]
        for part in passes_of([tokens[r] for r in step_rows], budget, group_size=8):
            loss.append([step_rows[i] for i in part])
    return contiguous_runs(tokens, budget), loss


def passes(model, fulls: list[dict], packed: bool, rows: int, budget: int | None = None
           ) -> tuple[float, torch.Tensor, tuple[int, int]]:  # fmt: skip
    """Seconds of the old-log-prob, reference and loss (+ backward) passes over the batches (:func:`plan`); the
    log-probs in row order; counts."""
    from suzak.models.packing import PackingCount, packing_rows

    count = PackingCount()
    logps = []
    model.zero_grad(set_to_none=True)

    def labelled(inputs, keep):
        labels = inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, -100)
        labels[:, :-keep] = -100
        return labels

    start = time.perf_counter()
    with packing_rows(model, count, enabled=packed):
        for full in fulls:
            keep = full["completion_width"]
            free, loss = plan(full, rows, budget)
            with torch.no_grad():
                for _ in range(2):  # old log-probs, reference
                    for index in free:
                        inputs = rows_of(full, index)
                        model(**inputs, labels=labelled(inputs, keep), fused_lm_head=True)
            by_row = {}
            for index in loss:
                inputs = rows_of(full, index)
                labels = labelled(inputs, keep)
                out = model(**inputs, labels=labels, fused_lm_head=True)
                (out.log_probs[:, -keep:].sum() / labels.ne(-100).sum()).backward()
                by_row.update(zip(index, out.log_probs[:, -keep:].detach(), strict=True))
            logps.append(torch.stack([by_row[r] for r in sorted(by_row)]).flatten())
    return time.perf_counter() - start, torch.cat(logps), count.take()


def step_rows(folder: Path, args, tmp: Path) -> list[dict]:
    """``--whole_step``'s rows: padded, packed and packed with each of ``--step_budgets`` runs interleaved, ``--runs``
    of each."""
    modes = {"padded": (False, None), "padding_free": (True, None),
             **{f"padding_free + {b} tokens": (True, b) for b in args.step_budgets}}  # fmt: skip
    runs = {mode: [] for mode in modes}
    for _ in range(args.runs):
        for mode, (packed, budget) in modes.items():
            runs[mode].append(whole_step(folder, packed, args.steps, tmp, budget))
            print(f"step, {mode}: {runs[mode][-1]}", flush=True)
    median = {mode: statistics.median(run["step_s"] for run in runs[mode]) for mode in runs}
    return [{"scenario": "mixture_smoke step", "mode": mode, "step_s": median[mode],
             "speedup": median["padded"] / median[mode],
             "real_token_fraction": statistics.median(run["real_token_fraction"] for run in runs[mode]),
             "tokens_per_s": statistics.median(run["tokens_per_s"] for run in runs[mode]), "steps": args.steps,
             "runs": args.runs, "step_seconds": [run["step_s"] for run in runs[mode]],
             "max_tokens_per_micro_batch": modes[mode][1], "tiny": TINY, "cpus": os.cpu_count(), "commit": commit(),
             "date": datetime.date.today().isoformat()}
            for mode in modes]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--image_tokens", type=int, default=256, help="visual tokens of a geometry image")
    parser.add_argument("--batches", type=int, default=4, help="generation batches drawn for each scenario")
    parser.add_argument("--rows", type=int, default=8, help="rows a micro-batch (per_device_train_batch_size)")
    parser.add_argument("--budgets", type=int, nargs="*", default=[2048, 8192],
                        help="max_tokens_per_micro_batch values timed beside (padding-free passes cut by tokens)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--results", default=str(RESULTS))
    parser.add_argument("--whole_step", action="store_true", help="time suzak train's whole step instead")
    parser.add_argument("--steps", type=int, default=8, help="--whole_step: steps a run (the first 2 not timed)")
    parser.add_argument("--step_budgets", type=int, nargs="*", default=[2048],
                        help="--whole_step: max_tokens_per_micro_batch values run beside (16 rows of ~270 tokens)")  # fmt: skip
    parser.add_argument("--table", default=None, help="print the table of a results file and stop")
    args = parser.parse_args()
    if args.table:
        rows = [json.loads(line) for line in Path(args.table).read_text().splitlines()]
        print(markdown_table([row for row in rows if "passes_s" in row], FIELDS))
        print(markdown_table([row for row in rows if "step_s" in row], STEP_FIELDS))
        return
    from transformers import AutoModelForImageTextToText, AutoProcessor
    from trl.trainer.utils import add_fused_lm_head

    from suzak.models.packing import use_row_attention

    lengths = json.loads(LENGTHS.read_text())["tokens"]
    side = round(args.image_tokens**0.5)
    screen = round((2.5 * args.image_tokens) ** 0.5)
    scenarios = {"geoqa": [(side, 63), (side, 63)], "mixture": [(screen, 63), (side, 63)]}  # ~400-token prompts
    torch.manual_seed(args.seed)
    out = []
    with tempfile.TemporaryDirectory(prefix="suzak-bench-pf-") as tmp:
        folder = Path(tmp) / "tiny"
        flags = [f"--{key}={value}" for key, value in TINY.items()]
        subprocess.run([sys.executable, "-m", "suzak", "tiny", "--output", str(folder), *flags], cwd=ROOT, check=True,
                       capture_output=True)  # fmt: skip
        processor = AutoProcessor.from_pretrained(folder)
        if args.whole_step:
            out = step_rows(folder, args, Path(tmp))
            append_rows(args.results, out)
            print(markdown_table(out, STEP_FIELDS))
            return
        model = AutoModelForImageTextToText.from_pretrained(folder, attn_implementation="sdpa")
        add_fused_lm_head(model, outputs=("log_probs", "entropy"))
        use_row_attention(model)
        model.train()
        vocab = model.config.get_text_config().vocab_size
        for name, groups in scenarios.items():
            draw = random.Random(args.seed)
            fulls = [batch(processor, groups, lengths, draw, vocab) for _ in range(args.batches)]
            passes(model, fulls[:1], True, args.rows)  # warm-up
            modes = {"padded": (False, None), "padding_free": (True, None),
                     **{f"padding_free + {b} tokens": (True, b) for b in args.budgets}}  # fmt: skip
            timed = {mode: [] for mode in modes}
            logps, counts = {}, {}
            for _ in range(args.runs):
                for mode, (packed, budget) in modes.items():
                    seconds, logps[mode], counts[mode] = passes(model, fulls, packed, args.rows, budget)
                    timed[mode].append(seconds)
            real = sum(int(full["attention_mask"].sum()) for full in fulls)
            for mode, (_, budget) in modes.items():
                median = statistics.median(timed[mode])
                diff = float((logps[mode] - logps["padded"]).abs().max())
                row = {"scenario": name, "mode": mode, "passes_s": median,
                       "speedup": statistics.median(timed["padded"]) / median,
                       "real_token_fraction": counts[mode][0] / counts[mode][1],
                       "tokens_per_s": real / median, "max_logp_diff": diff,
                       "positions": counts[mode][1] // 3, "real_tokens": real, "runs": args.runs,
                       "seconds": timed[mode], "batches": args.batches, "rows": 16, "micro_batch_rows": args.rows,
                       "max_tokens_per_micro_batch": budget, "visual_tokens": [s * s for s, _ in groups],
                       "tiny": TINY, "cpus": os.cpu_count(), "threads": torch.get_num_threads(), "commit": commit(),
                       "date": datetime.date.today().isoformat()}  # fmt: skip
                out.append(row)
                print(f"{name} {row['mode']}: {median:.2f} s ({row['speedup']:.2f}x), real tokens "
                      f"{row['real_token_fraction']:.0%} of the positions", flush=True)  # fmt: skip
    append_rows(args.results, out)
    print(markdown_table(out, FIELDS))


if __name__ == "__main__":
    main()
