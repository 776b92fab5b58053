"""Running an evaluation: items → generation (resumable, sharded over ranks) → scored R1-V results → summary.

Each pass (greedy, then one sampled pass per seed) appends every finished item to ``<output>.partial.jsonl`` as its
batch completes; a crash or Ctrl-C loses at most the batch in flight, and re-running the same command skips what is
there. The partial file starts with the run's settings: a re-run with different settings stops instead of mixing
outputs (``fresh=True`` discards it). Once the final JSON is written the partial files are deleted, since the JSON
holds every output.

Under torchrun (``WORLD_SIZE`` > 1) each rank generates ``items[rank::world]`` into its own partial file; rank 0
gathers the outputs and writes the results.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image

from suzak import SuzakError
from suzak.eval.engine import HFEngine, VLLMEngine
from suzak.eval.models import eval_device, load_eval_model, merged_model_dir, saved_budget
from suzak.eval.report import RunResult, accuracy, markdown_summary, mean_std, rule_flag, write_results
from suzak.eval.tasks import (
    CLEVR_HELDOUT_SEED,
    SCORING_RULES,
    EvalItem,
    Task,
    get_task,
    load_items,
    missing_images,
    resolve_template,
    score_rules,
)
from suzak.vision import PixelBudget

__all__ = [
    "Distributed",
    "EvalConfig",
    "EvalReport",
    "PartialStore",
    "build_engine",
    "default_budget",
    "evaluate",
    "prepare_items",
    "result_row",
    "run_pass",
]

logger = logging.getLogger(__name__)


@dataclass
class EvalConfig:
    """Everything one evaluation needs; ``None`` means the task's R1-V default (``suzak.eval.tasks.TASKS``)."""

    task: str
    model_path: str
    prompt_path: str | None = None
    image_root: str | None = None  # folder the image_path entries are relative to; default: the working directory
    output_path: str | None = None
    engine: str = "hf"
    batch_size: int | None = None
    max_new_tokens: int | None = None
    min_pixels: int | None = None  # default: the training recipe's budget (suzak.train.SuzakArguments)
    max_pixels: int | None = None
    limit: int | None = None
    seeds: list[int] = field(default_factory=list)
    temperature: float = 1.0  # for the seeded passes; the first pass is always greedy
    prompt_template: str = "eval"  # "eval", "train" or a suzak.prompts template name
    skip_missing: bool = False
    fresh: bool = False
    num_rows: int = 200  # clevr_synthetic
    data_seed: int = CLEVR_HELDOUT_SEED  # clevr_synthetic
    dtype: str | None = None  # default: bfloat16 on a GPU, float32 on the CPU
    tensor_parallel_size: int = 1  # vLLM
    progress: bool = True
    scoring: str = "strict"  # the rule behind `accuracy`; the task's other rule is reported beside it

    def __post_init__(self):
        if self.engine not in ("hf", "vllm"):
            raise SuzakError(f"unknown engine {self.engine!r}: use hf or vllm")
        if self.scoring not in SCORING_RULES:
            raise SuzakError(f"unknown --scoring {self.scoring!r}: use {' or '.join(SCORING_RULES)}")
        if self.seeds and self.temperature <= 0:
            raise SuzakError("seeded passes sample: --temperature must be > 0 with --seeds")
        if self.limit is not None and self.limit < 1:
            raise SuzakError(f"--limit must be >= 1, got {self.limit}")


@dataclass
class EvalReport:
    """What an evaluation produced (rank 0 only)."""

    task: str
    model: str
    greedy: RunResult
    sampled: list[RunResult]
    summary_path: str
    skipped_missing: int
    budget: PixelBudget


# --- ranks ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Distributed:
    """This process's rank and the world size; single-process unless torchrun set ``WORLD_SIZE`` > 1."""

    rank: int = 0
    world: int = 1

    @classmethod
    def from_env(cls) -> Distributed:
        if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
            return cls()
        import torch
        import torch.distributed as dist

        if not dist.is_initialized():
            if torch.cuda.is_available():
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        return cls(dist.get_rank(), dist.get_world_size())

    def shard(self, items: list) -> list:
        return items[self.rank :: self.world]

    def gather(self, obj: Any) -> list | None:
        """Every rank's ``obj`` on rank 0 (in rank order), None elsewhere."""
        if self.world == 1:
            return [obj]
        import torch.distributed as dist

        gathered = [None] * self.world if self.rank == 0 else None
        dist.gather_object(obj, gathered, dst=0)
        return gathered

    def barrier(self) -> None:
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()


# --- partial results -----------------------------------------------------------------------------------------------


class PartialStore:
    """Finished outputs of one pass as JSON lines, one file per rank; the first line holds the pass's settings."""

    def __init__(self, output_path: str | Path, settings: dict, dist: Distributed | None = None):
        self.output_path = Path(output_path)
        self.settings = settings
        dist = dist or Distributed()
        suffix = ".partial.jsonl" if dist.world == 1 else f".partial.rank{dist.rank}.jsonl"
        self.path = self.output_path.with_name(self.output_path.name + suffix)

    def files(self) -> list[Path]:
        return sorted(self.output_path.parent.glob(self.output_path.name + ".partial*.jsonl"))

    def load(self) -> dict[str, str]:
        """``{item key: output}`` from every rank's file of an earlier, interrupted run with the same settings."""
        done: dict[str, str] = {}
        for path in self.files():
            done |= self._read(path)
        return done

    def _read(self, path: Path) -> dict[str, str]:
        lines = path.read_text(encoding="utf-8").splitlines()
        if not lines:
            return {}
        self._check_settings(path, json.loads(lines[0]).get("settings", {}))
        done = {}
        for number, line in enumerate(lines[1:], start=2):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:  # the line being written when the run died
                logger.warning("%s:%d: incomplete line skipped (that item is generated again)", path, number)
                continue
            done[record["key"]] = record["model_output"]
        return done

    def _check_settings(self, path: Path, saved: dict) -> None:
        changed = sorted(k for k in set(saved) | set(self.settings) if saved.get(k) != self.settings.get(k))
        if changed:
            diff = ", ".join(f"{k}: {saved.get(k)!r} → {self.settings.get(k)!r}" for k in changed)
            raise SuzakError(
                f"{path} holds outputs of a run with other settings ({diff}); re-run with the same settings to "
                "resume, or pass --fresh to discard it"
            )

    def append(self, records: list[tuple[str, str]]) -> None:
        """Add finished ``(key, output)`` pairs; flushed to disk before returning."""
        new = not self.path.exists()
        with self.path.open("a", encoding="utf-8") as handle:
            if new:
                handle.write(json.dumps({"settings": self.settings}) + "\n")
            for key, output in records:
                handle.write(json.dumps({"key": key, "model_output": output}, ensure_ascii=False) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def discard(self) -> None:
        for path in self.files():
            path.unlink()


# --- items and engines ---------------------------------------------------------------------------------------------


def prepare_items(config: EvalConfig, task: Task) -> tuple[list[EvalItem], int]:
    """The items to evaluate (``limit`` applied) and how many were skipped for missing images."""
    template = resolve_template(task, config.prompt_template)
    items = load_items(task, config.prompt_path, template=template, image_root=config.image_root,
                       num_rows=config.num_rows, data_seed=config.data_seed)  # fmt: skip
    if config.limit is not None:
        items = items[: config.limit]
    missing = missing_images(items)
    if not missing:
        return items, 0
    if not config.skip_missing:
        raise SuzakError(
            f"{len(missing)} image(s) missing, first {missing[0]} (image_root={config.image_root or '.'}); fetch "
            "the images (docs/evaluate.md) or pass --skip_missing to evaluate the others"
        )
    lost = set(missing)
    kept = [item for item in items if not lost & set(item.image_paths)]
    logger.warning("skipping %d of %d items whose images are missing (first: %s)",
                   len(items) - len(kept), len(items), missing[0])  # fmt: skip
    return kept, len(items) - len(kept)


def _load_image(source) -> Image.Image:
    if isinstance(source, Image.Image):
        return source
    with Image.open(source) as image:
        image.load()
        return image.copy()


def engine_row(item: EvalItem) -> dict:
    """The generation input of an item (images loaded), in the data builders' row form."""
    images = [_load_image(source) for source in item.images]
    row: dict[str, Any] = {"prompt": item.prompt}
    if len(images) == 1:
        row["image"] = images[0]
    elif images:
        row["images"] = images
    return row


def default_budget(config: EvalConfig) -> PixelBudget:
    """``--min_pixels/--max_pixels`` when given, else the training recipe's defaults (``SuzakArguments``)."""
    from suzak.train import SuzakArguments

    return PixelBudget(config.min_pixels or SuzakArguments.min_pixels, config.max_pixels or SuzakArguments.max_pixels)


def _warn_budget(model_path: str, saved: PixelBudget | None, budget: PixelBudget) -> None:
    logger.info("pixel budget: min_pixels=%d max_pixels=%d", budget.min_pixels, budget.max_pixels)
    if saved is not None and saved != budget:
        logger.warning(
            "%s's processor was saved with min_pixels=%d max_pixels=%d; evaluating with %d..%d (--min_pixels/"
            "--max_pixels, else the recipe default): pass them to evaluate at the checkpoint's budget",
            model_path, saved.min_pixels, saved.max_pixels, budget.min_pixels, budget.max_pixels,
        )  # fmt: skip


def build_engine(config: EvalConfig, task: Task, budget: PixelBudget, items: list[EvalItem], *,
                 dist: Distributed | None = None, vllm_module: Any = None) -> HFEngine | VLLMEngine:  # fmt: skip
    """The generation engine ``config.engine`` names, with the task's batch size and token limit as defaults."""
    dist = dist or Distributed()
    batch_size = config.batch_size or task.batch_size
    max_new_tokens = config.max_new_tokens or task.max_new_tokens
    progress = config.progress and dist.rank == 0
    if config.engine == "hf":
        model, processing_class = load_eval_model(config.model_path, dtype=config.dtype, device=eval_device())
        _warn_budget(config.model_path, saved_budget(processing_class), budget)
        return HFEngine(model, processing_class, budget, batch_size, max_new_tokens, progress=progress)
    if dist.world > 1:
        raise SuzakError("--engine vllm runs as one process: use --tensor_parallel_size instead of torchrun")
    from transformers import AutoProcessor, GenerationConfig

    path = merged_model_dir(config.model_path)
    processing_class = AutoProcessor.from_pretrained(path)
    _warn_budget(config.model_path, saved_budget(processing_class), budget)
    try:
        repetition_penalty = GenerationConfig.from_pretrained(path).repetition_penalty or 1.0
    except OSError:  # no generation_config.json
        repetition_penalty = 1.0
    return VLLMEngine(path, processing_class, budget, batch_size, max_new_tokens,
                      max_images_per_prompt=max((len(i.images) for i in items), default=0),
                      repetition_penalty=repetition_penalty, vllm_module=vllm_module, progress=progress,
                      tensor_parallel_size=config.tensor_parallel_size)  # fmt: skip


# --- passes --------------------------------------------------------------------------------------------------------


def result_row(task: Task, item: EvalItem, output: str, scoring: str = "strict") -> dict:
    """One entry of R1-V's ``results`` list: ``extracted_answer`` and ``is_correct`` under ``scoring``, then
    ``is_correct_<rule>`` for every rule of the task (so a reader sees where the rules disagree)."""
    verdicts = score_rules(task, output, item.gold)
    extracted, correct = verdicts[scoring]
    row = {"question": item.record, "ground_truth": item.gold, "model_output": output,
           "extracted_answer": extracted, "is_correct": bool(correct)}  # fmt: skip
    return row | {rule_flag(rule): bool(ok) for rule, (_, ok) in verdicts.items()}


def _scored_rows(task: Task, items: list[EvalItem], outputs: dict[str, str], scoring: str, source: str) -> list[dict]:
    """``result_row`` for each item; a gold answer that cannot be scored is one line naming the item."""
    rows = []
    for item in items:
        try:
            rows.append(result_row(task, item, outputs[item.key], scoring))
        except (ValueError, TypeError) as error:
            raise SuzakError(f"{source}: item {item.index}: cannot score it: {error} (the outputs are kept in the "
                             ".partial.jsonl file)") from None  # fmt: skip
    return rows


def run_pass(task: Task, items: list[EvalItem], engine, output_path: Path, settings: dict, *, temperature: float = 0.0,
             seed: int | None = None, dist: Distributed | None = None, fresh: bool = False,
             scoring: str = "strict") -> RunResult | None:  # fmt: skip
    """Generate what the partial file lacks, then (rank 0) score everything under every rule and write R1-V's JSON
    (``accuracy`` under ``scoring``)."""
    dist = dist or Distributed()
    store = PartialStore(output_path, {**settings, "temperature": temperature, "seed": seed}, dist)
    if fresh and dist.rank == 0:
        store.discard()
    dist.barrier()
    done = store.load()
    dist.barrier()  # every rank has read the old files before any rank appends
    todo = dist.shard([item for item in items if item.key not in done])
    if done:
        reused = sum(item.key in done for item in items)
        logger.info("%s: resuming, %d of %d items already done", output_path, reused, len(items))
    new: dict[str, str] = {}

    def save_batch(indices: list[int], outputs: list[str]) -> None:
        records = [(todo[i].key, text) for i, text in zip(indices, outputs, strict=True)]
        store.append(records)
        new.update(records)

    engine.generate([engine_row(item) for item in todo], temperature=temperature, seed=seed, on_batch=save_batch)
    gathered = dist.gather(new)
    result = None
    if dist.rank == 0:
        outputs = done | {k: v for shard in gathered for k, v in shard.items()}
        results = _scored_rows(task, items, outputs, scoring, str(settings.get("data", output_path)))
        other = task.other_rule(scoring)
        value = write_results(output_path, results, scoring, other)
        store.discard()
        result = RunResult(str(output_path), value, sum(r["is_correct"] for r in results), len(results), seed,
                           temperature, scoring=scoring, other_scoring=other)  # fmt: skip
        if other is not None:
            result.other_accuracy = accuracy(results, rule_flag(other))
            result.other_correct = sum(r[rule_flag(other)] for r in results)
    dist.barrier()
    return result


def _default_output(task: Task, model_path: str) -> Path:
    name = Path(model_path.rstrip("/")).name or model_path.replace("/", "_")
    return Path("logs") / f"{task.name}_results_{name}.json"


def seed_output_path(output_path: Path, seed: int) -> Path:
    return output_path.with_name(f"{output_path.stem}.seed{seed}{output_path.suffix}")


def _settings(config: EvalConfig, task: Task, budget: PixelBudget) -> dict:
    """What makes two runs' outputs interchangeable (the resume check compares these)."""
    return {
        "task": task.name,
        "model": config.model_path,
        "engine": config.engine,
        "template": resolve_template(task, config.prompt_template),
        "max_new_tokens": config.max_new_tokens or task.max_new_tokens,
        "min_pixels": budget.min_pixels,
        "max_pixels": budget.max_pixels,
        "data": config.prompt_path or task.prompt_path or f"seed {config.data_seed}",
    }


def evaluate(config: EvalConfig, engine=None) -> EvalReport | None:
    """Greedy pass + one sampled pass per seed; R1-V JSON per pass, markdown + JSON summary. None off rank 0."""
    task = get_task(config.task)
    task.scorer(config.scoring)  # a rule the task lacks stops here, before any model loads
    budget = default_budget(config)
    items, skipped = prepare_items(config, task)
    dist = Distributed.from_env()
    engine = engine or build_engine(config, task, budget, items, dist=dist)
    output = Path(config.output_path) if config.output_path else _default_output(task, config.model_path)
    output.parent.mkdir(parents=True, exist_ok=True)
    settings = _settings(config, task, budget)
    greedy = run_pass(task, items, engine, output, settings, dist=dist, fresh=config.fresh, scoring=config.scoring)
    sampled = [
        run_pass(task, items, engine, seed_output_path(output, s), settings, temperature=config.temperature,
                 seed=s, dist=dist, fresh=config.fresh, scoring=config.scoring)
        for s in config.seeds
    ]  # fmt: skip
    if dist.rank != 0:
        return None
    summary_path = output.with_suffix(".md")
    shown = {**settings, "batch_size": engine.batch_size, "items": len(items), "skipped_missing": skipped}
    summary_path.write_text(markdown_summary(task.name, config.model_path, greedy, sampled, shown), encoding="utf-8")
    report = EvalReport(task.name, config.model_path, greedy, sampled, str(summary_path), skipped, budget)
    _write_summary_json(output.with_suffix(".summary.json"), report, shown)
    return report


def _write_summary_json(path: Path, report: EvalReport, settings: dict) -> None:
    mean, std = mean_std([r.accuracy for r in report.sampled])
    payload = {
        "task": report.task,
        "model": report.model,
        "greedy": asdict(report.greedy),
        "sampled": [asdict(r) for r in report.sampled],
        "sampled_mean": mean if report.sampled else None,
        "sampled_std": std if report.sampled else None,
        "settings": settings,
    }
    path.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
