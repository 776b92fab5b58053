"""GRPO step speed: suzak's trainer against the plain TRL GRPOTrainer a user would write, HF generation and vLLM.

    python bench/bench_grpo_speed.py --device cpu                       # tiny model on CPU: the suzak / TRL ratio
    python bench/bench_grpo_speed.py --device cuda --shape 3b           # {trl, suzak} x {hf, vllm} x {8, 64} on a GPU
    python bench/bench_grpo_speed.py --device cuda --shape 3b --rows suzak:vllm:64 suzak:hf:64 --steps 4
    python bench/bench_grpo_speed.py --device cuda --rows suzak:vllm:64 --set beta=0 gradient_checkpointing=false
    python bench/bench_grpo_speed.py --table bench/results_grpo_speed.jsonl

Both trainers run from the same recipe (recipes/smoke.yaml on the CPU, the shape's CLEVR recipe on a GPU) with the
same model, rows, rewards and GRPOConfig, and every completion has exactly ``--completion_tokens`` tokens (HF
``min_new_tokens``, vLLM ``min_tokens``), so the rows do the same work; ``--completion_lengths geoqa`` then cuts each
to a length drawn from R1-V's GeoQA answers (at most ``--completion_tokens``), the long tail of real answers that
TRL pads and ``padding_free`` does not compute (``--set padding_free=false`` for the padded row; ``--set
max_tokens_per_micro_batch=N`` for a token budget):

- ``suzak``: ``suzak.training.build.grpo_trainer`` plus the run's CSV streams, the path ``python -m suzak.train`` takes (pixel
  budget fitting, vLLM prompt fix, pre-checks, metrics.csv and completions.csv all included);
- ``trl``: ``trl.GRPOTrainer`` given the model, the dataset, the rewards and the config, the processor loaded by hand
  with the budget and left padding as Qwen's docs show; TRL's vLLM path as it is (image tokens expanded twice,
  TRL #6294, and vision placeholders not suppressed).

Each configuration runs in its own process (fresh memory, one vLLM engine; under torchrun when DeepSpeed is on).
Columns: s/step (median over the steps after ``--warmup``), completion and prompt+completion tokens/s, peak memory
(torch's peak allocation; device memory in use at the end, which includes vLLM's KV cache), MFU, and the split of
a step into generation (``_generate_single_turn``), scoring (``_calculate_rewards``) and the rest (logprob
forwards, forward/backward, optimizer); ``actor_s`` is the part after TRL's ``_generate_and_score_completions``
(the policy's forward/backward and the optimizer step: what EasyR1 times as ``update_policy``).

EasyR1's figures, computed as EasyR1 computes them (hiyouga/EasyR1 ``verl/trainer/metrics.py`` and
``verl/utils/flops_counter.py``), so a row compares with its published 1,800 tokens/s/GPU for Qwen2.5-VL-3B:
``easyr1_tokens_per_s_per_gpu`` = all tokens of a step (prompt with its vision tokens + completion) / step time /
GPUs; ``easyr1_actor_mfu`` = (6·N·tokens + 12·Σ seqlen²·head_dim·heads·layers) · num_iterations / (actor_s · 989e12
· GPUs), N the language model's dense parameters (MLP, attention projections, embedding and LM head counted twice,
as EasyR1 does, tied or not), seqlen each sequence's prompt + completion tokens. EasyR1 knows no H200 (its MFU is 0
there); both H100 and H200 are 989 TFLOP/s dense bf16, used here for both. MFU = (6 + 2·F)·P·T / (s/step · 989e12), P the parameters, T the prompt +
completion tokens of a step and F the extra forward passes (reference model when beta > 0, old policy when TRL
computes it), against the H100's 989 TFLOP/s dense bf16; none on the CPU. On the CPU each configuration is repeated
(``--repeats``, interleaved trl/suzak) and the median is reported with the suzak / trl ratio, of wall time and of
the process's CPU time per step (which a busy host or a stolen virtual CPU does not inflate; most stable with
``--threads 1``).
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
from dataclasses import asdict, dataclass, field
from pathlib import Path

from stamp import commit  # bench/stamp.py (the script's folder is on sys.path)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results_grpo_speed.jsonl"
H100_BF16_FLOPS = 989e12  # dense bf16, NVIDIA's H100 SXM figure (the H200's is the same)
RECIPES = {
    "tiny": "recipes/smoke.yaml",
    "3b": "recipes/clevr_qwen2.5vl_3b.yaml",
    "7b": "recipes/clevr_qwen2.5vl_7b.yaml",
}
ROW_MARK = "BENCH_ROW "


@dataclass
class Spec:
    """One configuration (a row of the table)."""

    trainer: str  # trl | suzak
    generation: str  # hf | vllm
    completions: int  # per step (per device), 8 per prompt
    shape: str = "tiny"
    threads: int | None = None  # torch's CPU threads (None: torch's default)
    device: str = "cpu"
    completion_tokens: int = 32
    steps: int = 6
    warmup: int = 2
    deepspeed: str | None = None
    overrides: list[str] = field(default_factory=list)  # extra recipe flags, e.g. ["--beta", "0"]
    model_dir: str = "/tmp/suzak-bench"
    completion_lengths: str | None = None  # "geoqa": each completion cut to a length drawn from R1-V's GeoQA outputs


def geoqa_lengths(cap: int, seed: int = 0):
    """Completion lengths drawn from R1-V's GeoQA outputs (``bench/geoqa_completion_tokens.json``: 754 answers of
    Qwen2-VL-7B, mean ~130 tokens, max ~1,220), each at most ``cap``: an endless iterator."""
    import random

    lengths = json.loads((ROOT / "bench" / "geoqa_completion_tokens.json").read_text())["tokens"]
    draw = random.Random(seed)
    while True:
        yield max(1, min(cap, draw.choice(lengths)))


def cut_to_lengths(trainer, lengths) -> None:
    """Each completion TRL's ``_generate_single_turn`` returns cut to the next of ``lengths`` (with its sampler
    log-probabilities): the rows then have the long-tailed lengths of real answers, which a random-init model never
    gives by itself (it runs to ``max_completion_length``), so the padding TRL adds and ``padding_free`` leaves out
    is there to measure. Everything after generation (rewards, the passes, EasyR1's token count) sees the cut rows."""
    original = trainer._generate_single_turn

    def cut(*args, **kwargs):
        completion_ids, logprobs = original(*args, **kwargs)
        sizes = [next(lengths) for _ in completion_ids]
        completion_ids = [list(ids[:n]) for ids, n in zip(completion_ids, sizes, strict=True)]
        if logprobs is not None:
            logprobs = [None if lp is None else list(lp[:n]) for lp, n in zip(logprobs, sizes, strict=True)]
        return completion_ids, logprobs

    trainer._generate_single_turn = cut


# --- one configuration, in its own process ---------------------------------------------------------------------


def recipe_cli(spec: Spec, model_path: str, output_dir: str) -> list[str]:
    """The recipe plus the benchmark's fixed settings, as ``python -m suzak.train`` flags."""
    prompts = max(1, spec.completions // 8)
    cli = [
        "--config", RECIPES[spec.shape], "--model_name_or_path", model_path, "--output_dir", output_dir,
        "--dataset_name", "clevr_synthetic",
        "--dataset_options", json.dumps({"num_rows": 16 * prompts * (spec.steps + 1), "seed": 0, "progress": False}),
        "--max_steps", str(spec.steps), "--per_device_train_batch_size", str(spec.completions),
        "--num_generations", str(min(8, spec.completions)), "--gradient_accumulation_steps", "1",
        "--max_completion_length", str(spec.completion_tokens), "--report_to", "none", "--save_strategy", "no",
        "--logging_steps", "1", "--log_completions", "false", "--use_vllm", str(spec.generation == "vllm").lower(),
        "--vllm_mode", "colocate", "--attn_implementation", "sdpa",
    ]  # fmt: skip
    if spec.deepspeed:
        cli += ["--deepspeed", spec.deepspeed]
    return cli + spec.overrides


class StepClock:
    """Wall time of every optimizer step, and of the generation and scoring inside it (TRL's own hooks, wrapped on
    the trainer instance: nothing of TRL is edited)."""

    def __init__(self, device: str):
        from transformers import TrainerCallback

        self.device = device
        self.steps: list[dict[str, float]] = []
        clock = self

        class Callback(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                clock.sync()
                clock.steps.append({"start": time.perf_counter(), "cpu_start": time.process_time(), "gen": 0.0,
                                    "score": 0.0, "prepare": 0.0, "seqlens": []})  # fmt: skip

            def on_step_end(self, args, state, control, **kwargs):
                clock.sync()
                step = clock.steps[-1]
                step["total"] = time.perf_counter() - step["start"]
                step["cpu"] = time.process_time() - step["cpu_start"]

        self.callback = Callback()

    def sync(self) -> None:
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()

    def wrap(self, trainer) -> None:
        for method, key in (
            ("_generate_single_turn", "gen"),
            ("_calculate_rewards", "score"),
            ("_generate_and_score_completions", "prepare"),
        ):
            original = getattr(trainer, method)

            def timed(*args, _original=original, _key=key, **kwargs):
                self.sync()
                start = time.perf_counter()
                try:
                    result = _original(*args, **kwargs)
                    if _key == "prepare" and self.steps and isinstance(result, dict) and "completion_mask" in result:
                        lengths = result["prompt_mask"].sum(1) + result["completion_mask"].sum(1)
                        self.steps[-1]["seqlens"] += [int(n) for n in lengths.tolist()]
                    return result
                finally:
                    self.sync()
                    if self.steps:
                        self.steps[-1][_key] += time.perf_counter() - start

            setattr(trainer, method, timed)


def plain_trl_trainer(suzak_args, grpo_args, model_args, callbacks):
    """What a user writes with TRL alone for the same recipe: model, processor with the budget, data, rewards."""
    from transformers import AutoProcessor
    from trl import GRPOTrainer, get_peft_config

    from suzak.models.loading import load_model_and_processor
    from suzak.training.build import RunInputs, build_datasets

    model, _ = load_model_and_processor(model_args, grpo_args)  # the same weights, dtype and attention as suzak's
    processor = AutoProcessor.from_pretrained(model_args.model_name_or_path, min_pixels=suzak_args.min_pixels,
                                              max_pixels=suzak_args.max_pixels, padding_side="left")  # fmt: skip
    inputs = RunInputs.read(suzak_args, model_args)  # the same rewards and rows as suzak's
    dataset, _ = build_datasets(suzak_args, grpo_args, inputs)
    return GRPOTrainer(model=model, reward_funcs=inputs.rewards, args=grpo_args, train_dataset=dataset,
                       processing_class=processor, peft_config=get_peft_config(model_args), callbacks=callbacks)  # fmt: skip


def training_flops(params: int, trainable: int, forwards: int, tokens: float) -> float:
    """A step's model FLOPs: forward 2P and the backward's input gradients 2P per token for every weight, the weight
    gradients 2P for the trained ones only (LoRA's adapters, not its frozen base), 2P per extra forward.

    >>> training_flops(10, 10, 0, 1), training_flops(10, 0, 1, 1)
    (60, 60)
    """
    return (4 * params + 2 * trainable + 2 * forwards * params) * tokens


def extra_forwards(trainer) -> int:
    """Forward passes per step besides the policy's own: the reference model (beta > 0) and the old policy, which
    TRL computes when generation and optimisation steps are misaligned or for vLLM's importance sampling."""
    args = trainer.args
    reference = trainer.beta != 0.0
    generate_every = args.steps_per_generation * trainer.num_iterations
    old_policy = args.gradient_accumulation_steps % generate_every != 0 or (
        trainer.use_vllm and trainer.vllm_importance_sampling_correction
    )
    return int(reference) + int(old_policy)


def easyr1_actor_flops(text_config, seqlens: list[int]) -> float:
    """FLOPs of one actor update over sequences of these lengths, as EasyR1's ``FlopsCounter`` estimates them for
    Qwen2/2.5-VL (``_estimate_llama_flops``: dense parameters incl. embedding and LM head, plus attention).

    >>> from types import SimpleNamespace as C
    >>> easyr1_actor_flops(C(hidden_size=4, vocab_size=10, num_hidden_layers=1, num_key_value_heads=1,
    ...                      num_attention_heads=2, intermediate_size=8), [3, 1])
    5856
    """
    c = text_config
    head_dim = c.hidden_size // c.num_attention_heads
    q = c.num_attention_heads * head_dim
    kv = c.num_key_value_heads * head_dim
    per_layer = c.hidden_size * c.intermediate_size * 3 + c.hidden_size * (q + 2 * kv + q)
    dense = per_layer * c.num_hidden_layers + c.vocab_size * c.hidden_size * 2
    attention = 12 * sum(n * n for n in seqlens) * head_dim * c.num_attention_heads * c.num_hidden_layers
    return 6 * dense * sum(seqlens) + attention


def _peak_memory(device: str) -> tuple[float, float | None]:
    """(peak GiB, device GiB in use now): torch's peak allocation and the whole GPU's use (vLLM included); RSS on CPU."""
    if device == "cuda":
        import torch

        free, total = torch.cuda.mem_get_info()
        return torch.cuda.max_memory_allocated() / 2**30, (total - free) / 2**30
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, None


def _model_path(spec: Spec) -> str:
    if spec.shape == "tiny":
        from suzak.models.loading import resolve_model_path

        return resolve_model_path("tiny")
    from shapes import make_random_model

    return str(make_random_model(spec.shape, Path(spec.model_dir) / f"qwen2.5-vl-{spec.shape}-random"))


def measure(spec: Spec) -> dict:
    """Train ``spec.steps`` steps and return the row (rank 0's view under torchrun)."""
    import torch

    from suzak.runs.streams import add_run_callbacks
    from suzak.training.build import grpo_trainer
    from suzak.training.configs import parse_args

    torch.manual_seed(0)
    if spec.threads:
        torch.set_num_threads(spec.threads)
    output_dir = tempfile.mkdtemp(prefix="suzak-speed-")
    suzak_args, grpo_args, model_args = parse_args(recipe_cli(spec, _model_path(spec), output_dir))
    key = "min_tokens" if spec.generation == "vllm" else "min_new_tokens"
    grpo_args.generation_kwargs = {key: spec.completion_tokens}  # every completion exactly this long
    clock = StepClock(spec.device)
    if spec.trainer == "suzak":
        trainer = grpo_trainer(suzak_args, grpo_args, model_args, callbacks=[clock.callback])
        add_run_callbacks(trainer)  # metrics.csv and completions.csv, as a suzak run writes them
    else:
        trainer = plain_trl_trainer(suzak_args, grpo_args, model_args, [clock.callback])
    if spec.completion_lengths == "geoqa":
        cut_to_lengths(trainer, geoqa_lengths(spec.completion_tokens))  # before the clock wraps it: generation time
    clock.wrap(trainer)
    if spec.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    steady = clock.steps[spec.warmup :] or clock.steps
    s_per_step = statistics.median(s["total"] for s in steady)  # a stray slow step (a busy host) does not count
    cumulative = [0] + [log["num_tokens"] for log in trainer.state.log_history if "num_tokens" in log]
    tokens = [b - a for a, b in zip(cumulative, cumulative[1:], strict=False)][spec.warmup :] or [cumulative[-1]]
    step_tokens = statistics.fmean(tokens)  # prompt + completion tokens of a step (TRL's num_tokens, per step)
    lengths = [log["completions/mean_length"] for log in trainer.state.log_history if "completions/mean_length" in log]
    mean_length = statistics.fmean(lengths[spec.warmup :] or lengths) if lengths else spec.completion_tokens
    completion_tokens = spec.completions * mean_length  # a step's (all spec.completion_tokens unless cut)
    params = sum(p.numel() for p in trainer.model.parameters())
    forwards = extra_forwards(trainer)
    peak, in_use = _peak_memory(spec.device)
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    flops = training_flops(params, trainable, forwards, step_tokens)
    gpus = int(os.environ.get("WORLD_SIZE", "1"))
    actor_s = statistics.fmean(s["total"] - s["prepare"] for s in steady)
    config = trainer.model.config
    text_config = getattr(config, "text_config", None) or config
    actor_flops = statistics.fmean(easyr1_actor_flops(text_config, s["seqlens"]) for s in steady)
    return {
        "trainer": spec.trainer, "generation": spec.generation, "shape": spec.shape,
        "device": torch.cuda.get_device_name() if spec.device == "cuda" else "cpu",
        "completions": spec.completions, "completion_tokens": spec.completion_tokens,
        "completion_lengths": spec.completion_lengths or "fixed", "mean_completion_tokens": round(mean_length, 1),
        "padding_free": bool(getattr(trainer, "padding_free", False)),
        "max_tokens_per_micro_batch": getattr(trainer, "max_tokens_per_micro_batch", None),
        "prompt_tokens": round((step_tokens - completion_tokens) / spec.completions, 1),
        "s_per_step": round(s_per_step, 3),
        "cpu_s_per_step": round(statistics.median(s["cpu"] for s in steady), 3),  # process CPU time: host noise-free
        "completion_tokens_per_s": round(completion_tokens / s_per_step, 1),
        "tokens_per_s": round(step_tokens / s_per_step, 1),
        "peak_gib": round(peak, 2), "device_used_gib": None if in_use is None else round(in_use, 1),
        "mfu": round(flops / s_per_step / H100_BF16_FLOPS, 4) if spec.device == "cuda" else None,
        "easyr1_tokens_per_s_per_gpu": round(step_tokens / s_per_step / gpus, 1),
        "easyr1_actor_mfu": round(actor_flops * trainer.num_iterations / (actor_s * H100_BF16_FLOPS * gpus), 4)
        if spec.device == "cuda" else None,
        "actor_s": round(actor_s, 3),
        "gen_s": round(statistics.fmean(s["gen"] for s in steady), 3),
        "score_s": round(statistics.fmean(s["score"] for s in steady), 3),
        "rest_s": round(statistics.fmean(s["total"] - s["gen"] - s["score"] for s in steady), 3),
        "steps": spec.steps, "warmup": spec.warmup, "params": params, "trainable_params": trainable,
        "extra_forwards": forwards,
        "beta": trainer.beta, "deepspeed": Path(grpo_args.deepspeed).stem if grpo_args.deepspeed else "none",
        "overrides": " ".join(spec.overrides), "torch_threads": torch.get_num_threads(),
        "memory_cap_gib": suzak_args.gpu_memory_gib, "optim": str(getattr(grpo_args.optim, "value", grpo_args.optim)),
        "vllm_sleep_mode": bool(grpo_args.use_vllm and grpo_args.vllm_enable_sleep_mode),
    }  # fmt: skip


def child(spec_json: str) -> None:
    spec = Spec(**json.loads(spec_json))
    try:
        row = measure(spec) | {"status": "ok"}
    except Exception as error:  # noqa: BLE001 - a failed configuration is a row of the table, not a crashed bench
        row = {"trainer": spec.trainer, "generation": spec.generation, "shape": spec.shape, "device": spec.device,
               "completions": spec.completions, "completion_tokens": spec.completion_tokens,
               "completion_lengths": spec.completion_lengths or "fixed",
               "status": f"{type(error).__name__}: {str(error).splitlines()[0][:160] if str(error) else ''}"}  # fmt: skip
    if int(os.environ.get("RANK", "0")) == 0:
        print(ROW_MARK + json.dumps(row), flush=True)


# --- the driver: one process per configuration, rows appended, one table -----------------------------------------


def run_spec(spec: Spec, log_dir: Path) -> dict:
    """Run one configuration in a fresh process; its row (or why it produced none)."""
    launcher = [sys.executable]
    if spec.deepspeed:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1"]
    command = [*launcher, str(Path(__file__).resolve()), "--child", json.dumps(asdict(spec))]
    name = f"{spec.shape}-{spec.trainer}-{spec.generation}-{spec.completions}-{int(time.time())}.log"
    log = log_dir / name
    env = os.environ | {"PYTHONUNBUFFERED": "1"}
    with log.open("w") as handle:
        result = subprocess.run(command, cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT)
    rows = [line[len(ROW_MARK) :] for line in log.read_text().splitlines() if line.startswith(ROW_MARK)]
    if rows:
        return json.loads(rows[-1])
    tail = " | ".join(log.read_text().strip().splitlines()[-3:])[-300:]
    row = asdict(spec) | {"overrides": " ".join(spec.overrides), "status": f"exit {result.returncode}: {tail}"}
    if spec.deepspeed:
        row["deepspeed"] = Path(spec.deepspeed).stem
    return row


def recipe_flags(assignments: list[str]) -> list[str]:
    """``["beta=0"]`` -> ``["--beta", "0"]``: recipe fields as ``python -m suzak.train`` flags.

    >>> recipe_flags(["beta=0", "vllm_gpu_memory_utilization=0.2"])
    ['--beta', '0', '--vllm_gpu_memory_utilization', '0.2']
    """
    flags = []
    for text in assignments:
        field_name, sep, value = text.partition("=")
        if not sep or not field_name:
            raise SystemExit(f"--set {text}: expected FIELD=VALUE, e.g. beta=0")
        flags += [f"--{field_name.removeprefix('--')}", value]
    return flags


def matrix(args) -> list[Spec]:
    rows = args.rows or [f"{t}:{g}:{n}" for n in args.completions for g in args.generations for t in ("trl", "suzak")]
    specs = []
    for text in rows:
        trainer, generation, completions = text.split(":")
        specs.append(Spec(trainer, generation, int(completions), shape=args.shape, device=args.device,
                          completion_tokens=args.completion_tokens, steps=args.steps, warmup=args.warmup,
                          deepspeed=args.deepspeed, overrides=recipe_flags(args.set), model_dir=args.model_dir,
                          threads=args.threads, completion_lengths=args.completion_lengths))  # fmt: skip
    return specs


def vllm_importable() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


COLUMNS = ["trainer", "generation", "shape", "completions", "completion_tokens", "prompt_tokens", "s_per_step",
           "cpu_s_per_step", "completion_tokens_per_s", "tokens_per_s", "easyr1_tokens_per_s_per_gpu", "peak_gib",
           "device_used_gib", "mfu", "easyr1_actor_mfu", "gen_s", "score_s", "rest_s", "actor_s", "deepspeed", "overrides", "status"]  # fmt: skip


def table(rows: list[dict]) -> str:
    """Markdown table of rows; repeated configurations (CPU) are folded into their median, with the run count."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        key = tuple(row.get(c) for c in ("device", "trainer", "generation", "shape", "completions",
                                         "completion_tokens", "steps", "deepspeed", "overrides", "date"))  # fmt: skip
        groups.setdefault(key, []).append(row)
    lines = ["| device | runs | " + " | ".join(COLUMNS) + " |", "|---|---|" + "---|" * len(COLUMNS)]
    for group in groups.values():
        ok = [r for r in group if r.get("status") == "ok"] or group
        cells = []
        for column in COLUMNS:
            values = [r.get(column) for r in ok]
            numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
            if numbers and len(numbers) == len(values):
                integral = all(isinstance(v, int) for v in numbers)
                cells.append(str(statistics.median_low(numbers) if integral else round(statistics.median(numbers), 4)))
            else:
                cells.append(str(values[0] if values[0] is not None else ""))
        lines.append(f"| {group[0].get('device', '')} | {len(ok)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ratios(rows: list[dict]) -> list[str]:
    """suzak / trl median step time for each (device, generation, shape, completions) both trainers measured."""
    medians: dict[tuple, dict[str, float]] = {}
    for row in rows:
        if row.get("status") != "ok":
            continue
        key = tuple(row.get(c) for c in ("device", "generation", "shape", "completions", "overrides", "steps", "date"))
        medians.setdefault(key, {}).setdefault(row["trainer"], []).append(row["s_per_step"])
        if row.get("device") == "cpu" and row.get("cpu_s_per_step") is not None:
            medians.setdefault(key + ("cpu",), {}).setdefault(row["trainer"], []).append(row["cpu_s_per_step"])
    lines = []
    for key, by in medians.items():
        device, generation, shape, completions, overrides, _, date = key[:7]
        measure = "CPU time per step" if key[7:] == ("cpu",) else "step time"
        if {"trl", "suzak"} <= set(by):
            suzak, trl = statistics.median(by["suzak"]), statistics.median(by["trl"])
            spread = f"runs {min(by['suzak']):.3f}-{max(by['suzak']):.3f} and {min(by['trl']):.3f}-{max(by['trl']):.3f}"
            lines.append(f"suzak / trl {measure}, {shape} on {device}, {generation}, {completions} completions"
                         f"{' ' + overrides if overrides else ''} ({date}): {suzak:.3f} / {trl:.3f} s = "
                         f"{suzak / trl:.3f} (medians of {len(by['suzak'])} and {len(by['trl'])} runs; {spread})")  # fmt: skip
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--shape", choices=sorted(RECIPES), default=None, help="default: tiny on cpu, 3b on cuda")
    parser.add_argument("--rows", nargs="+", help="TRAINER:GENERATION:COMPLETIONS, e.g. suzak:vllm:64 (default: "
                        "{trl,suzak} x --generations x --completions)")  # fmt: skip
    parser.add_argument("--generations", nargs="+", choices=["hf", "vllm"], default=None,
                        help="default: hf, plus vllm where it imports (GPU)")  # fmt: skip
    parser.add_argument("--completions", nargs="+", type=int, default=[8, 64], help="completions per step")
    parser.add_argument("--completion_tokens", type=int, default=None, help="fixed length (default: 32 cpu, 256 gpu)")
    parser.add_argument("--completion_lengths", choices=["geoqa"], default=None,
                        help="cut each completion to a length drawn from R1-V's GeoQA outputs (at most "
                        "--completion_tokens): long-tailed rows, the padding padding_free leaves out")  # fmt: skip
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default: 8 cpu, 5 gpu)")
    parser.add_argument("--warmup", type=int, default=None, help="first steps left out (default: 2 cpu, 1 gpu)")
    parser.add_argument("--repeats", type=int, default=None, help="runs per configuration (default: 3 cpu, 1 gpu)")
    parser.add_argument("--deepspeed", default=None,
                        help="DeepSpeed config (default on a GPU for 3b/7b: auto, what the launch script passes: the "
                        "fastest config predicted to fit, suzak.models.memory; the row names the one used; 'none' for none)")  # fmt: skip
    parser.add_argument("--set", nargs="+", default=[], metavar="FIELD=VALUE",
                        help="recipe fields for every row, e.g. --set beta=0 vllm_gpu_memory_utilization=0.2")  # fmt: skip
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--model_dir", default="/tmp/suzak-bench", help="where random-init models are saved")
    parser.add_argument("--results", default=str(RESULTS))
    parser.add_argument("--log_dir", default=None, help="one log per configuration here (default: a new temp folder)")
    parser.add_argument("--table", default=None, help="print the table of a results file and exit")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child)
    if args.table:
        rows = [json.loads(line) for line in Path(args.table).read_text().splitlines() if line.strip()]
        print(table(rows))
        print("\n".join(ratios(rows)))
        return
    gpu = args.device == "cuda"
    args.shape = args.shape or ("3b" if gpu else "tiny")
    args.generations = args.generations or (["hf", "vllm"] if gpu and vllm_importable() else ["hf"])
    args.completion_tokens = args.completion_tokens or (256 if gpu else 32)
    args.steps = args.steps or (5 if gpu else 8)
    args.warmup = args.warmup if args.warmup is not None else (1 if gpu else 2)
    repeats = args.repeats or (1 if gpu else 3)
    if args.deepspeed is None and gpu and args.shape != "tiny":
        args.deepspeed = "auto"
    args.deepspeed = None if args.deepspeed == "none" else args.deepspeed
    date = datetime.date.today().isoformat()
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="suzak-speed-logs-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    measured = []
    for repeat in range(repeats):
        for spec in matrix(args):  # trl and suzak alternate, so a slow spell of the machine hits both
            row = run_spec(spec, log_dir) | {"date": date, "commit": commit(), "repeat": repeat}
            measured.append(row)
            with open(args.results, "a") as handle:
                handle.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)
    print(table(measured))
    print("\n".join(ratios(measured)))
    print(f"rows appended to {args.results}; logs in {log_dir}")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/shapes.py
    main()
