"""GRPO training entry point.

    python -m suzak.train --config recipes/smoke.yaml [--any_field value ...]

Parsed with TRL's ``TrlParser`` from three dataclasses: suzak's :class:`SuzakArguments` (data, pixel budget,
rewards), TRL's ``GRPOConfig`` (every GRPO/TrainingArguments field as TRL defines it) and TRL's ``ModelConfig``
(model, dtype, attention, LoRA). The YAML recipe sets values; CLI flags override it. ``.env`` (python-dotenv) holds
secrets and machine paths; MODEL, DATASET and OUTPUT_DIR there override the recipe (CLI flags still win).

Besides checkpoints, every run writes to its output dir: ``recipe.yaml`` (the recipe as run, secrets masked),
``run_info.json`` (times, hardware, versions), ``metrics.csv`` and ``completions.csv`` (streamed, see
:mod:`suzak.callbacks`) and, at the end, ``plots/*.png`` (:mod:`suzak.plot`). ``push_to_hub: true`` publishes the
final model once, at the end, with suzak's model card (:mod:`suzak.release`); the Trainer's own per-save pushes
are turned off.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from suzak import SuzakError
from suzak.checkpoints import checkpoint_step, latest_checkpoint

__all__ = ["SuzakArguments", "latest_checkpoint", "main", "parse_args"]

logger = logging.getLogger(__name__)


@dataclass
class SuzakArguments:
    """suzak's own recipe fields; everything else is TRL's GRPOConfig / ModelConfig."""

    dataset_name: str = field(
        default="clevr_synthetic",
        metadata={
            "help": "Dataset builder (suzak.data.DATASETS), Hub alias, local save_to_disk/parquet folder or .jsonl file."
        },
    )
    dataset_options: dict | str | None = field(
        default=None,
        metadata={
            "help": "Options for the builder (YAML mapping, or JSON on the CLI), e.g. {num_rows: 2000, seed: 0}."
        },
    )
    max_train_rows: int | None = field(default=None, metadata={"help": "Keep only the first N rows (after shuffling)."})
    prompt_template: str = field(
        default="r1v", metadata={"help": "Prompt template (suzak.prompts.TEMPLATES); also sets the answer format."}
    )
    min_pixels: int = field(default=3136, metadata={"help": "Pixel budget lower bound (4 visual tokens)."})
    max_pixels: int = field(
        default=401408, metadata={"help": "Pixel budget upper bound; 401408 = 512 visual tokens (R1-V's CLEVR run)."}
    )
    rewards: list[str] = field(
        default_factory=lambda: ["clevr_count", "think_format"],
        metadata={"help": "Reward names (suzak.rewards.REWARDS) or dotted import paths; weights: reward_weights."},
    )
    reward_kwargs: dict | str | None = field(
        default=None, metadata={"help": "Per-reward keyword arguments, e.g. {gsm8k_format: {style: hash}}."}
    )
    freeze_vision_tower: bool = field(default=False, metadata={"help": "Do not train the vision encoder."})
    preflight_rows: int = field(default=8, metadata={"help": "Rows the reward pre-flight checks (0 disables it)."})
    eval_rows: int = field(
        default=0,
        metadata={"help": "Held-out rows answered by greedy generation every eval_steps and scored by the first "
                          "reward (eval/accuracy); 0 turns it off. Synthetic datasets draw them past the training "
                          "range, others hold out their last eval_rows rows."},
    )  # fmt: skip
    eval_max_new_tokens: int = field(default=256, metadata={"help": "Token limit of the held-out generations."})
    eval_batch_size: int = field(default=16, metadata={"help": "Batch size of the held-out generations."})
    release_dry_run: bool = field(
        default=False,
        metadata={"help": "With push_to_hub: write the release folder (OUTPUT_DIR/release) and upload nothing."},
    )

    def __post_init__(self):
        for name in ("dataset_options", "reward_kwargs"):
            value = getattr(self, name)
            if isinstance(value, str):
                try:
                    setattr(self, name, json.loads(value))
                except json.JSONDecodeError as error:
                    raise SuzakError(f"--{name} must be a JSON object: {error.msg}") from None
        if self.min_pixels > self.max_pixels:
            raise SuzakError(f"min_pixels {self.min_pixels} > max_pixels {self.max_pixels}")


# --- arguments ---------------------------------------------------------------------------------------------------


def _env_overrides() -> list[str]:
    """CLI flags for MODEL / DATASET / OUTPUT_DIR from the environment (.env); placed before the user's flags."""
    mapping = {"MODEL": "--model_name_or_path", "DATASET": "--dataset_name", "OUTPUT_DIR": "--output_dir"}
    flags = []
    for env, flag in mapping.items():
        if os.environ.get(env):
            flags += [flag, os.environ[env]]
    return flags


def _cpu_overrides() -> list[str]:
    """fp32 on CPU: recipes default to bf16 for H100s, which TrainingArguments refuses without a GPU."""
    import torch

    return [] if torch.cuda.is_available() else ["--bf16", "false"]


def full_argv(argv: list[str]) -> list[str]:
    """The flags the parser sees: CPU defaults, then .env overrides, then the user's flags (last wins)."""
    return _cpu_overrides() + _env_overrides() + argv


def parse_args(argv: list[str] | None = None):
    """(SuzakArguments, GRPOConfig, ModelConfig) from YAML + environment + CLI, in increasing priority."""
    from trl import GRPOConfig, ModelConfig, TrlParser

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = TrlParser((SuzakArguments, GRPOConfig, ModelConfig))
    suzak_args, grpo_args, model_args = parser.parse_args_and_config(full_argv(argv))
    if model_args.model_name_or_path is None:
        raise SuzakError("no model: set model_name_or_path in the recipe, MODEL in .env, or --model_name_or_path")
    return suzak_args, grpo_args, model_args


# --- run setup ---------------------------------------------------------------------------------------------------


def setup_reporting(grpo_args, recipe: str | None = None) -> None:
    """Run name from the recipe; W&B without an API key runs offline (said once) instead of prompting or crashing."""
    if grpo_args.run_name is None:
        grpo_args.run_name = Path(recipe).stem if recipe else Path(grpo_args.output_dir).name
    if "wandb" not in (grpo_args.report_to or []):
        return
    logged_in = os.environ.get("WANDB_API_KEY") or (Path.home() / ".netrc").is_file()
    if not logged_in and os.environ.get("WANDB_MODE") not in ("offline", "disabled"):
        os.environ["WANDB_MODE"] = "offline"
        logger.warning("no WANDB_API_KEY: W&B runs offline (sync later with `wandb sync wandb/offline-run-*`)")
    os.environ.setdefault("WANDB_PROJECT", "suzak")


def resolve_resume(grpo_args) -> str | bool | None:
    """``resume_from_checkpoint`` with ``latest``/``last`` replaced by the newest complete checkpoint (or None)."""
    value = grpo_args.resume_from_checkpoint
    if value not in ("latest", "last"):
        return value
    found = latest_checkpoint(grpo_args.output_dir)
    if found is None:
        logger.warning(
            "resume_from_checkpoint=latest: no complete checkpoint in %s, starting fresh", grpo_args.output_dir
        )
    else:
        logger.info("resuming from %s", found)
    return found


SYNTHETIC_DATASETS = ("clevr_synthetic", "gsm8k_synthetic")  # row i depends on (seed, start + i) alone


def build_datasets(suzak_args, seed: int):
    """(train dataset, held-out rows or None). Held-out rows are never trained on."""
    import inspect

    from suzak.data import DATASETS, build_dataset

    options = dict(suzak_args.dataset_options or {})
    options.setdefault("template", suzak_args.prompt_template)
    dataset = build_dataset(suzak_args.dataset_name, **options)
    heldout = None
    if suzak_args.eval_rows > 0 and suzak_args.dataset_name in SYNTHETIC_DATASETS:
        builder = DATASETS[suzak_args.dataset_name]
        num_rows = options.get("num_rows", inspect.signature(builder).parameters["num_rows"].default)
        after = {**options, "num_rows": suzak_args.eval_rows, "start": options.get("start", 0) + num_rows}
        heldout = list(build_dataset(suzak_args.dataset_name, **after))
    elif suzak_args.eval_rows > 0:
        count = min(suzak_args.eval_rows, len(dataset) // 2)
        if count < suzak_args.eval_rows:
            logger.warning("eval_rows=%d: only %d of %d rows held out", suzak_args.eval_rows, count, len(dataset))
        heldout = list(dataset.select(range(len(dataset) - count, len(dataset))))
        dataset = dataset.select(range(len(dataset) - count))
    if suzak_args.max_train_rows is not None:
        dataset = dataset.shuffle(seed=seed).select(range(min(suzak_args.max_train_rows, len(dataset))))
    return dataset, heldout


def build_eval_callback(suzak_args, args, heldout, processing_class, budget):
    """The generation-eval callback for the held-out rows (None without them), scored by the first reward."""
    from suzak.eval_callback import GenerationEvalCallback
    from suzak.rewards import resolve_reward

    if not heldout:
        return None
    if not args.eval_steps:
        raise SuzakError("eval_rows needs eval_steps: how often to generate the held-out answers")
    name = suzak_args.rewards[0]
    scorer = resolve_reward(name, (suzak_args.reward_kwargs or {}).get(name))
    return GenerationEvalCallback(
        heldout, scorer, processing_class, eval_steps=int(args.eval_steps), budget=budget,
        batch_size=suzak_args.eval_batch_size, max_new_tokens=suzak_args.eval_max_new_tokens,
    )  # fmt: skip


def add_first(trainer, callback) -> None:
    """Add ``callback`` ahead of the reporters, so values it adds to a log line reach W&B/TensorBoard."""
    if callback is not None:
        trainer.callback_handler.callbacks.insert(0, callback)


def build_trainer(suzak_args, grpo_args, model_args, train_dataset=None, **trainer_kwargs):
    """The configured :class:`VLMGRPOTrainer` (model, processor, rewards, data, budget, LoRA)."""
    from trl import get_peft_config

    from suzak.modeling import freeze_vision_tower, load_model_and_processor
    from suzak.prompts import get_template
    from suzak.rewards import resolve_rewards
    from suzak.trainer import VLMGRPOTrainer
    from suzak.vision import PixelBudget

    template = get_template(suzak_args.prompt_template)
    reward_funcs = resolve_rewards(suzak_args.rewards, suzak_args.reward_kwargs)
    heldout = None
    if train_dataset is None:
        train_dataset, heldout = build_datasets(suzak_args, grpo_args.seed)
    model, processing_class = load_model_and_processor(model_args, grpo_args)
    if suzak_args.freeze_vision_tower:
        freeze_vision_tower(model)
    budget = PixelBudget(suzak_args.min_pixels, suzak_args.max_pixels)
    trainer = VLMGRPOTrainer(
        model=model,
        reward_funcs=reward_funcs,
        args=grpo_args,
        train_dataset=train_dataset,
        processing_class=processing_class,
        peft_config=get_peft_config(model_args),
        pixel_budget=budget,
        answer_format=template.answer_format if suzak_args.preflight_rows > 0 else None,
        preflight_rows=suzak_args.preflight_rows,
        **trainer_kwargs,
    )
    add_first(trainer, build_eval_callback(suzak_args, grpo_args, heldout, trainer.processing_class, budget))
    return trainer


def _start_records(trainer, argv: list[str], parsed: tuple, resume: str | None) -> None:
    """recipe.yaml and run_info.json (main process), and the CSV streams and checkpoint markers (every rank)."""
    from suzak.callbacks import add_run_callbacks
    from suzak.run_record import save_recipe, start_run

    add_run_callbacks(trainer)
    if trainer.accelerator.is_main_process:
        output_dir = trainer.args.output_dir
        save_recipe(output_dir, full_argv(argv), parsed)
        start_step = (checkpoint_step(Path(resume)) or 0) if resume else 0
        start_run(output_dir, argv, parsed, resume, start_step)


def _finish(trainer, release) -> None:
    """Main process, after the final save: close run_info.json, draw the plots, publish when asked."""
    from suzak.plot import plot_run
    from suzak.run_record import finish_run

    output_dir = trainer.args.output_dir
    finish_run(output_dir, trainer.state.global_step)
    try:
        plot_run(output_dir)
    except Exception as error:  # noqa: BLE001 - a plotting failure must not fail a finished run; said, not hidden
        logger.warning("plots failed (%s: %s); retry with `python -m suzak.plot %s`", type(error).__name__, error,
                       output_dir)  # fmt: skip
    if release is not None:
        release.publish(output_dir)


def run(argv: list[str] | None = None, *, parse=None, build=None) -> str:
    """Parse, train, save, record, publish; returns the output dir. ``suzak.sft`` passes its own parse/build."""
    from dotenv import load_dotenv

    from suzak.release import release_request
    from suzak.run_record import config_path

    load_dotenv(os.environ.get("SUZAK_ENV_FILE", ".env"), override=False)
    argv = list(sys.argv[1:] if argv is None else argv)
    suzak_args, grpo_args, model_args = (parse or parse_args)(argv)
    release = release_request(grpo_args, dry_run=suzak_args.release_dry_run)  # repo id and token checked up front
    grpo_args.push_to_hub = False  # one suzak release at the end, not a Trainer push at every save
    setup_reporting(grpo_args, recipe=config_path(argv))
    trainer = (build or build_trainer)(suzak_args, grpo_args, model_args)
    resume = resolve_resume(grpo_args)
    _start_records(trainer, argv, (suzak_args, grpo_args, model_args), resume)
    trainer.train(resume_from_checkpoint=resume)
    trainer.save_model(grpo_args.output_dir)
    if trainer.accelerator.is_main_process:
        trainer.processing_class.save_pretrained(grpo_args.output_dir)
        logger.info("model and processor saved to %s", grpo_args.output_dir)
        _finish(trainer, release)
    return grpo_args.output_dir


def main(argv: list[str] | None = None, **run_kwargs) -> None:
    from suzak.redaction import install_log_redaction

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    install_log_redaction()
    try:
        output_dir = run(argv, **run_kwargs)
    except SuzakError as error:
        raise SystemExit(f"error: {error}") from None
    if int(os.environ.get("RANK", "0")) == 0:
        logger.info("done: checkpoints, trainer_state.json and logs in %s", output_dir)


if __name__ == "__main__":
    main()
