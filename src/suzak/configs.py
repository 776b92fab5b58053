"""Run configuration: suzak's recipe fields and the parsing of YAML recipe + ``.env`` + CLI flags.

A recipe sets suzak's :class:`SuzakArguments` next to every field of TRL's ``GRPOConfig`` (or ``SFTConfig``) and
``ModelConfig`` as TRL defines them, parsed by TRL's ``TrlParser``. Priority, lowest first: the recipe, CPU
defaults (no bf16 without a GPU), ``MODEL``/``DATASET``/``OUTPUT_DIR`` from the environment (``.env``), CLI flags.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import dataclass, field

from suzak import SuzakError
from suzak.prompts import DEFAULT_TEMPLATE
from suzak.vision import DEFAULT_MAX_PIXELS, DEFAULT_MIN_PIXELS

__all__ = ["SuzakArguments", "full_argv", "parse_args", "parse_sft_args"]

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
        default=DEFAULT_TEMPLATE,
        metadata={"help": "Prompt template (suzak.prompts.TEMPLATES); also sets the answer format."},
    )
    min_pixels: int = field(
        default=DEFAULT_MIN_PIXELS,
        metadata={
            "help": f"Pixel budget lower bound ({DEFAULT_MIN_PIXELS} = {DEFAULT_MIN_PIXELS // 784} visual tokens)."
        },
    )
    max_pixels: int = field(
        default=DEFAULT_MAX_PIXELS,
        metadata={"help": f"Pixel budget upper bound; {DEFAULT_MAX_PIXELS} = {DEFAULT_MAX_PIXELS // 784} visual tokens "
                          "(R1-V's CLEVR run)."},
    )  # fmt: skip
    rewards: list[str] = field(
        default_factory=lambda: ["clevr_count", "think_format"],
        metadata={"help": "Reward names (suzak.rewards.REWARDS) or dotted import paths; weights: reward_weights."},
    )
    reward_kwargs: dict | str | None = field(
        default=None, metadata={"help": "Per-reward keyword arguments, e.g. {gsm8k_format: {style: hash}}."}
    )
    freeze_vision_tower: bool = field(default=False, metadata={"help": "Do not train the vision encoder."})
    preflight_rows: int = field(default=8, metadata={"help": "Rows the reward pre-flight checks (0 disables it)."})
    skip_bad_rows: bool = field(
        default=False,
        metadata={"help": "Rows that fail the validation before step 1 (an image that does not decode or fit, a gold "
                          "answer a reward cannot read) are dropped and listed in OUTPUT_DIR/skipped_rows.jsonl "
                          "instead of stopping the run."},
    )  # fmt: skip
    max_bad_fraction: float = field(
        default=0.05, metadata={"help": "With skip_bad_rows: stop anyway when more than this fraction of rows is bad."}
    )
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


def _parse(config_class, argv: list[str] | None):
    from trl import ModelConfig, TrlParser

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = TrlParser((SuzakArguments, config_class, ModelConfig))
    suzak_args, config, model_args = parser.parse_args_and_config(full_argv(argv))
    if model_args.model_name_or_path is None:
        raise SuzakError("no model: set model_name_or_path in the recipe, MODEL in .env, or --model_name_or_path")
    _drop_recipe_options_of_another_dataset(suzak_args, argv)
    return suzak_args, config, model_args


def _drop_recipe_options_of_another_dataset(suzak_args: SuzakArguments, argv: list[str]) -> None:
    """The recipe's ``dataset_options`` belong to the recipe's ``dataset_name``: when DATASET or ``--dataset_name``
    picks another dataset and no ``--dataset_options`` are given, they are not applied to it (the new builder would
    reject them, or worse, take them)."""
    import yaml

    from suzak.runs.record import config_path

    recipe_file = config_path(argv)
    if recipe_file is None or any(a == "--dataset_options" or a.startswith("--dataset_options=") for a in argv):
        return
    with open(recipe_file, encoding="utf-8") as handle:
        recipe = yaml.safe_load(handle) or {}
    own = recipe.get("dataset_name")
    if own is not None and own != suzak_args.dataset_name and suzak_args.dataset_options:
        logger.info("dataset_name %s replaces the recipe's %s: the recipe's dataset_options %s are not applied",
                    suzak_args.dataset_name, own, suzak_args.dataset_options)  # fmt: skip
        suzak_args.dataset_options = None


def parse_args(argv: list[str] | None = None):
    """(SuzakArguments, GRPOConfig, ModelConfig) from YAML + environment + CLI, in increasing priority."""
    from trl import GRPOConfig

    return _parse(GRPOConfig, argv)


def parse_sft_args(argv: list[str] | None = None):
    """(SuzakArguments, SFTConfig, ModelConfig), the same way as :func:`parse_args`."""
    from trl import SFTConfig

    return _parse(SFTConfig, argv)
