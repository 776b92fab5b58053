"""Run configuration: suzak's recipe fields and the parsing of YAML recipe + ``.env`` + CLI flags.

A recipe sets suzak's :class:`SuzakArguments` next to every field of TRL's ``GRPOConfig`` (or ``SFTConfig``) and
``ModelConfig`` as TRL defines them, parsed by TRL's ``TrlParser``. Priority, lowest first: the recipe, CPU
defaults (no bf16 without a GPU), ``MODEL``/``DATASET``/``OUTPUT_DIR`` from the environment (``.env``), CLI flags.

Every mistake in a recipe or a flag is one :class:`~suzak.SuzakError` line before anything loads: a missing or
malformed recipe (file, line, column), an unknown or doubled key (its line, and the closest field name), an unknown
flag (and the closest one; flags are never abbreviated), a value argparse cannot convert, a batch that
``num_generations`` does not divide (the numbers and what to change), a pixel budget below one visual token, and
any other setting TRL's or transformers' configs refuse.
"""

from __future__ import annotations

import difflib
import json
import logging
import os
import sys
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path

from suzak import SuzakError
from suzak.media.video import VideoBudgetArguments
from suzak.media.vision import DEFAULT_MAX_PIXELS, DEFAULT_MIN_PIXELS, family_factors
from suzak.scoring.prompts import DEFAULT_TEMPLATE

__all__ = [
    "SuzakArguments",
    "SuzakGRPOArguments",
    "TrainingPassArguments",
    "check_eval_cadence",
    "check_whole_groups",
    "closest",
    "full_argv",
    "parse_args",
    "parse_sft_args",
]

logger = logging.getLogger(__name__)


@dataclass
class SuzakArguments(VideoBudgetArguments):
    """suzak's own recipe fields; everything else is TRL's GRPOConfig / ModelConfig. Grouped as TRL groups
    ``GRPOConfig``'s (``python -m suzak.train --help`` lists them in this order, each with its help):

    > Parameters that control the video budget (:class:`~suzak.media.video.VideoBudgetArguments`, shared with the
    evaluation): ``video_fps``, ``video_min_frames``, ``video_max_frames``, ``video_min_pixels``,
    ``video_max_pixels``, ``video_total_pixels``

    > Parameters that control the data: ``dataset_name``, ``dataset_options``, ``datasets`` (a mixture),
    ``max_train_rows``, ``skip_bad_rows``, ``max_bad_fraction``

    > Parameters that control the prompt and the pixel budget: ``prompt_template``, ``opening_in_completion``,
    ``min_pixels``, ``max_pixels``

    > Parameters that control the vision tower: ``freeze_vision_tower``, ``vision_reuse``, ``quantize_vision_tower``

    > Parameters that control the rewards: ``rewards``, ``reward_kwargs``, ``preflight_rows``

    > Parameters that control tools: ``tools``, ``tool_max_pixels``, ``tool_max_visual_tokens``

    > Parameters that control dynamic sampling: ``dynamic_sampling``, ``dynamic_sampling_min_std``,
    ``dynamic_sampling_max_rounds``

    > Parameters that control the vLLM sampler check: ``sampler_check_steps``, ``sampler_logp_tolerance``

    > Parameters that control the held-out evaluation during training: ``eval_rows``, ``eval_correct_at``,
    ``eval_max_new_tokens``, ``eval_batch_size``

    > Parameters that control faults, stops and resume: ``on_nonfinite``, ``stop_signals``,
    ``rank_failure_timeout``, ``checkpoint_mirror``, ``resume_override``

    > Parameters that control GPU memory: ``gpu_memory_gib``

    > Parameters that control logging and release: ``log_metrics_dict``, ``release_dry_run``
    """

    # > Parameters that control the data

    dataset_name: str = field(
        default="clevr_synthetic",
        metadata={
            "help": "Dataset builder (suzak.data.DATASETS), Hub alias, local save_to_disk/parquet folder or .jsonl file."
        },
    )
    dataset_options: dict | str | None = field(
        default=None,
        metadata={
            "help": "Options for the builder (YAML mapping, or JSON on the CLI), e.g. {num_rows: 2000, seed: 0}. "
            "On the CLI they update the recipe's options for the recipe's own dataset key by key; another dataset "
            "gets only the CLI's."
        },
    )
    datasets: list | str | None = field(
        default=None,
        metadata={
            "help": "A mixture in place of dataset_name: one mapping per source with its name, dataset (a builder, "
            "Hub alias, folder or .jsonl), options, weight, rewards, reward_weights, reward_kwargs, prompt_template, "
            "eval_rows, eval_correct_at, min_pixels, max_pixels, tools (an environment its rows alone act with: an "
            "episode source; docs/mixtures.md; a YAML list, or JSON on the CLI)."
        },
    )
    max_train_rows: int | None = field(
        default=None,
        metadata={"help": "Keep only the first N rows (after shuffling); a mixture keeps N in all, split among its "
                          "sources by weight (at least one each)."},
    )  # fmt: skip
    skip_bad_rows: bool = field(
        default=False,
        metadata={"help": "Rows that fail the validation before step 1 (an image that does not decode or fit, a gold "
                          "answer a reward cannot read) are dropped and listed in OUTPUT_DIR/skipped_rows.jsonl "
                          "instead of stopping the run."},
    )  # fmt: skip
    max_bad_fraction: float = field(
        default=0.05, metadata={"help": "With skip_bad_rows: stop anyway when more than this fraction of rows is bad."}
    )

    # > Parameters that control the prompt and the pixel budget

    prompt_template: str = field(
        default=DEFAULT_TEMPLATE,
        metadata={"help": "Prompt template (suzak.scoring.prompts.TEMPLATES); also sets the answer format."},
    )
    opening_in_completion: bool = field(
        default=False,
        metadata={"help": "Rewards, the reward pre-flight and evaluation read each completion after the chat "
                          "template's opening of the assistant turn (Qwen3.5's <think>, its thinking mode), which the "
                          "policy never writes itself. Without it, a template that opens the answer format's first "
                          "tag stops the run before step 1 (or turn thinking off: chat_template_kwargs: "
                          "{enable_thinking: false})."},
    )  # fmt: skip
    min_pixels: int = field(
        default=DEFAULT_MIN_PIXELS,
        metadata={
            "help": f"Pixel budget lower bound ({DEFAULT_MIN_PIXELS} pixels = {DEFAULT_MIN_PIXELS // 784} visual tokens of "
            f"28x28 pixels for Qwen2-VL/Qwen2.5-VL, {DEFAULT_MIN_PIXELS // 1024} of 32x32 for Qwen3-VL/Qwen3.5: the "
            "model's patch size x merge size, read from its processor)."
        },
    )
    max_pixels: int = field(
        default=DEFAULT_MAX_PIXELS,
        metadata={"help": f"Pixel budget upper bound; {DEFAULT_MAX_PIXELS} = {DEFAULT_MAX_PIXELS // 784} visual tokens "
                          f"of 28x28 pixels, {DEFAULT_MAX_PIXELS // 1024} of 32x32 (R1-V's CLEVR run)."},
    )  # fmt: skip

    # > Parameters that control the vision tower

    freeze_vision_tower: bool = field(default=False, metadata={"help": "Do not train the vision encoder."})
    vision_reuse: bool = field(
        default=True,
        metadata={"help": "Encode each distinct image (or clip) once per forward pass and share its features with the "
                          "rows that show it (a GRPO group repeats its image num_generations times); gradients are "
                          "exactly the unshared path's (docs/vision_reuse.md)."},
    )  # fmt: skip
    quantize_vision_tower: bool = field(
        default=False,
        metadata={"help": "With load_in_4bit/load_in_8bit: quantize the vision encoder too (default: it stays in the "
                          "compute dtype; docs/qlora.md says why)."},
    )  # fmt: skip

    # > Parameters that control the rewards

    rewards: list[str] = field(
        default_factory=lambda: ["clevr_count", "think_format"],
        metadata={
            "help": "Reward names (suzak.scoring.rewards.REWARDS) or dotted import paths; weights: reward_weights."
        },
    )
    reward_kwargs: dict | str | None = field(
        default=None,
        metadata={"help": "Per-reward keyword arguments, e.g. {gsm8k_format: {style: hash}}. On the command line "
                          "they update the recipe's reward by reward, key by key ({reward: null} drops the recipe's)."},
    )  # fmt: skip
    preflight_rows: int = field(default=8, metadata={"help": "Rows the reward pre-flight checks (0 disables it)."})

    # > Parameters that control tools

    tools: list[str] = field(
        default_factory=list,
        metadata={"help": "Tools the policy may call during a rollout (multi-turn, docs/tools.md): zoom (built in: "
                          "crops the original image at a box in the model's own frame and shows the crop next turn) "
                          "or dotted paths to a tool function or an environment class. TRL's "
                          "max_tool_calling_iterations caps the turns; tool turns count against max_completion_length "
                          "and carry no loss."},
    )  # fmt: skip
    tool_max_pixels: int | None = field(
        default=None,
        metadata={"help": "Pixel budget upper bound of each zoom crop (default: max_pixels; between min_pixels and "
                          "max_pixels). The crop is cut from the original image, then fitted to this budget."},
    )  # fmt: skip
    tool_max_visual_tokens: int | None = field(
        default=None,
        metadata={"help": "Visual tokens all zoom crops of one rollout may show; a zoom past it is a tool error the "
                          "model reads (default: no cap beyond max_completion_length)."},
    )  # fmt: skip

    # > Parameters that control dynamic sampling

    dynamic_sampling: bool = field(
        default=False,
        metadata={"help": "DAPO's dynamic sampling: groups whose completions all score alike (reward std at most "
                          "dynamic_sampling_min_std) are dropped after scoring and the batch is refilled with new "
                          "prompts of the training set, up to dynamic_sampling_max_rounds extra generation rounds; a "
                          "batch still short then trains on the groups it has (said in the log)."},
    )  # fmt: skip
    dynamic_sampling_min_std: float = field(
        default=0.0,
        metadata={"help": "With dynamic_sampling: a group whose reward std is at most this is dropped (0: only "
                          "groups whose completions all got the same reward)."},
    )  # fmt: skip
    dynamic_sampling_max_rounds: int = field(
        default=3,
        metadata={"help": "With dynamic_sampling: extra generation rounds a batch may take to refill its dropped "
                          "groups (0: drop them and train on the rest)."},
    )  # fmt: skip

    # > Parameters that control the vLLM sampler check

    sampler_check_steps: int = field(
        default=10,
        metadata={"help": "With use_vllm: compare vLLM's log-probabilities of its samples with the policy's at the "
                          "first generation and then every N steps, and stop when they drift apart (a weight sync "
                          "that does not reach vLLM's sampler); 0 turns the check off."},
    )  # fmt: skip
    sampler_logp_tolerance: float = field(
        default=0.1,
        metadata={"help": "With use_vllm: the largest mean |log p(vLLM) - log p(policy)| per completion token the "
                          "sampler check accepts (nats; numerical noise measures ~0.01, a stale sampler ~1)."},
    )  # fmt: skip

    # > Parameters that control the held-out evaluation during training

    eval_rows: int = field(
        default=0,
        metadata={"help": "Held-out rows answered by greedy generation every eval_steps and scored by the first "
                          "reward (eval/accuracy); 0 turns it off. Synthetic datasets draw them past the training "
                          "range, others hold out their last eval_rows rows."},
    )  # fmt: skip
    eval_correct_at: float | None = field(
        default=None,
        metadata={"help": "The first reward's score at which a held-out answer counts correct in eval/accuracy (a "
                          "number in (0, 1]); default: the reward's own (full marks for a 0/1 reward, 0.5 for iou, "
                          "dynamic_iou, anls, box_f1 and box_map, a judge's P(yes) above 0.5). A mixture's sources "
                          "set theirs in their entries. eval/score logs the mean score beside it."},
    )  # fmt: skip
    eval_max_new_tokens: int = field(default=256, metadata={"help": "Token limit of the held-out generations."})
    eval_batch_size: int = field(default=16, metadata={"help": "Batch size of the held-out generations."})

    # > Parameters that control faults, stops and resume

    on_nonfinite: str = field(
        default="stop",
        metadata={"help": "A step whose gradient norm is nan or inf (a nan/inf loss): 'stop' (one line naming the "
                          "step, its rows and the newest good checkpoint; no nan weights are written) or 'skip' (the "
                          "optimizer step is skipped and counted in nonfinite/skipped_steps).",
                  "choices": ["stop", "skip"]},
    )  # fmt: skip
    stop_signals: list[str] = field(
        default_factory=lambda: ["SIGTERM", "SIGUSR1"],
        metadata={"help": "Signals that stop training gracefully (preemption: SLURM's --signal, a cloud shutdown): "
                          "the current optimizer step finishes, a complete checkpoint is written, one line gives the "
                          "resume command, and the run exits with code 75. [] turns this off."},
    )  # fmt: skip
    rank_failure_timeout: float = field(
        default=120.0,
        metadata={"help": "Several processes: seconds a rank may go silent (killed, its machine gone) before the "
                          "others stop with one line naming it; a rank that raises is named at once. Needs an "
                          "output_dir every rank sees."},
    )  # fmt: skip
    checkpoint_mirror: str | None = field(
        default=None,
        metadata={"help": "Copy every saved checkpoint, in the background, to this folder (a mounted bucket, NFS) "
                          "or to the Hub as hf://USER/REPO (a folder per checkpoint; HF_TOKEN from .env). A failed "
                          "copy is a warning and a count, never a stop."},
    )  # fmt: skip
    resume_override: bool = field(
        default=False,
        metadata={
            "help": "Resume even when the recipe differs from the checkpoint's in a field that changes what the "
            "saved state means (batch size, num_generations, model, dataset, learning-rate schedule)."
        },
    )

    # > Parameters that control GPU memory

    gpu_memory_gib: float | None = field(
        default=None,
        metadata={"help": "Use at most this many GiB of each GPU: torch's allocator is capped to it and deepspeed "
                          "auto plans against it (a GPU shared with another job; an H200 standing in for an H100: "
                          "80). vllm_gpu_memory_utilization stays a fraction of the whole card. None: the card's."},
    )  # fmt: skip

    # > Parameters that control logging and release

    log_metrics_dict: bool = field(
        default=False,
        metadata={"help": "Print the Trainer's metrics dict at each logging step (console and train.log) instead of "
                          "suzak's one line (step/total, reward ± std, eval accuracy, length, KL, clip, loss, s/step, "
                          "ETA); every metric is in metrics.csv either way."},
    )  # fmt: skip
    release_dry_run: bool = field(
        default=False,
        metadata={"help": "With push_to_hub: write the release folder (OUTPUT_DIR/release) and upload nothing."},
    )

    def mixture(self):
        """The recipe's ``datasets:`` as :class:`suzak.data.mixture.Source` entries (None: one ``dataset_name``)."""
        from suzak.data.mixture import parse_sources

        if self.datasets is None:
            return None
        return parse_sources(self.datasets, default_template=self.prompt_template)

    def held_out_rows(self) -> int:
        """Held-out rows the recipe asks for: ``eval_rows``, or a mixture's sources' own (each its ``eval_rows``, else
        the recipe's), together."""
        sources = self.mixture()
        return sum(s.held_out_rows(self.eval_rows) for s in sources) if sources else self.eval_rows

    def __post_init__(self):
        for name in ("dataset_options", "reward_kwargs", "datasets"):
            value = getattr(self, name)
            if isinstance(value, str):
                try:
                    setattr(self, name, json.loads(value))
                except json.JSONDecodeError as error:
                    shape = "a JSON list of objects" if name == "datasets" else "a JSON object"
                    raise SuzakError(f"--{name} must be {shape}: {error.msg}") from None
        if self.datasets is not None:
            self.mixture()  # every source's mistake, one line, before anything loads
        from suzak.scoring.rewards import check_correct_at

        check_correct_at(self.eval_correct_at, "--eval_correct_at")  # a bad threshold is one line, not a wrong figure
        # The model is not loaded yet: below the smallest token of every supported family is wrong for any model
        # (PixelBudget.for_model checks the model's own factor once its processor is loaded).
        factor = min(family_factors().values())
        one_token = factor * factor
        if self.max_pixels < one_token:  # checked first: a small min_pixels must not hide it
            raise SuzakError(f"max_pixels {self.max_pixels} is below one visual token ({factor}x{factor} = {one_token} "
                             f"pixels): set max_pixels to at least {one_token} (default {DEFAULT_MAX_PIXELS})")  # fmt: skip
        if self.min_pixels < 1:
            raise SuzakError(f"min_pixels {self.min_pixels} must be at least 1 (default {DEFAULT_MIN_PIXELS})")
        if self.min_pixels > self.max_pixels:
            raise SuzakError(f"min_pixels {self.min_pixels} > max_pixels {self.max_pixels}")
        try:
            self.video_budget()
        except ValueError as error:
            raise SuzakError(f"video budget: {error} (the video_* fields)") from None
        if self.sampler_check_steps < 0:
            raise SuzakError(f"sampler_check_steps {self.sampler_check_steps}: give a number of steps, or 0 to turn "
                             "the sampler check off")  # fmt: skip
        if not self.sampler_logp_tolerance > 0:
            raise SuzakError(f"sampler_logp_tolerance {self.sampler_logp_tolerance} must be > 0 (nats per token; "
                             "default 0.1)")  # fmt: skip
        if not self.dynamic_sampling_min_std >= 0:
            raise SuzakError(f"dynamic_sampling_min_std {self.dynamic_sampling_min_std} must be >= 0 (a reward std)")
        if self.dynamic_sampling_max_rounds < 0:
            raise SuzakError(f"dynamic_sampling_max_rounds {self.dynamic_sampling_max_rounds} must be >= 0 (extra "
                             "generation rounds a batch)")  # fmt: skip
        if self.on_nonfinite not in ("stop", "skip"):
            raise SuzakError(f"on_nonfinite {self.on_nonfinite!r}: 'stop' or 'skip'")
        if not self.rank_failure_timeout > 0:
            raise SuzakError(f"rank_failure_timeout {self.rank_failure_timeout} must be > 0 (seconds)")
        import signal

        for name in self.stop_signals:
            if not isinstance(getattr(signal, str(name), None), signal.Signals):
                raise SuzakError(f"stop_signals: {name!r} is not a signal name (e.g. SIGTERM, SIGUSR1)")


@dataclass(kw_only=True)
class TrainingPassArguments:
    """> Parameters that control the training passes (GRPO's old log-probs, reference and loss passes; ``suzak
    train`` only: SFT's ``padding_free`` is TRL's own ``SFTConfig`` field): ``padding_free``,
    ``max_tokens_per_micro_batch``"""

    padding_free: bool = field(
        default=True,
        metadata={"help": "Pack the rows of each training pass (old log-probs, reference, loss) into one sequence "
                          "without padding, each row's positions restarted and its attention confined to itself: no "
                          "compute on the padding TRL adds to every row of a generation batch. Exact against the padded "
                          "path; a model it cannot keep exact (Qwen3.5's linear attention) runs padded, said in one "
                          "line (docs/padding_free.md)."},
    )  # fmt: skip
    max_tokens_per_micro_batch: int | None = field(
        default=None,
        metadata={"help": "Cut micro-batches by tokens (EasyR1's dynamic batching): each rank's generation batch is "
                          "dealt into its micro-batches by real tokens (prompt with visual tokens + completion), whole "
                          "groups together where vision_reuse keeps them, and each micro-batch (and the old-log-prob "
                          "and reference passes) runs in passes of at most this many tokens, the same update as TRL's "
                          "rows for every loss_type (bnpo's normalizer is per micro-batch, as in TRL). The "
                          "memory plan counts a pass's tokens; the pre-check stops on a row longer than this. "
                          "None: TRL's fixed rows (docs/padding_free.md)."},
    )  # fmt: skip

    def __post_init__(self):
        if self.max_tokens_per_micro_batch is not None and self.max_tokens_per_micro_batch < 1:
            raise SuzakError(f"max_tokens_per_micro_batch {self.max_tokens_per_micro_batch} must be >= 1 (real "
                             "tokens a pass), or unset")  # fmt: skip
        parent = getattr(super(), "__post_init__", None)
        if parent is not None:
            parent()


@dataclass
class SuzakGRPOArguments(TrainingPassArguments, SuzakArguments):
    """:class:`SuzakArguments` and, for GRPO, :class:`TrainingPassArguments` (listed last in ``suzak train --help``)."""


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


# Top-level recipe keys besides the fields: TrlParser sets the ``env`` mapping as environment variables.
RECIPE_EXTRA_KEYS = ("env",)


def closest(name: str, names) -> str | None:
    """The valid name a typo most likely meant (difflib), or None.

    >>> closest("lerning_rate", ["learning_rate", "lr_scheduler_type"]), closest("zzz", ["learning_rate"])
    ('learning_rate', None)
    """
    found = difflib.get_close_matches(name, sorted(names), n=1, cutoff=0.6)
    return found[0] if found else None


def _did_you_mean(name: str, names, prefix: str = "") -> str:
    match = closest(name, names)
    return f" (did you mean {prefix}{match}?)" if match else ""


def _load_recipe(path: str) -> tuple[dict, dict[str, int]]:
    """(the recipe's mapping, the line of each key); a missing, unreadable, malformed or doubled-key file is one line.

    YAML itself lets a later key silently replace an earlier one; a recipe must not, so a doubled key is refused with
    both lines.
    """
    import yaml

    file = Path(path)
    if not file.is_file():
        raise SuzakError(f"recipe {path}: {'not a file' if file.exists() else 'no such file'}")
    try:
        text = file.read_text(encoding="utf-8")
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        recipe = yaml.safe_load(text)
    except UnicodeDecodeError as error:
        raise SuzakError(f"recipe {path}: not UTF-8 text (byte {error.start})") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        raise SuzakError(f"recipe {path}{where}: malformed YAML ({getattr(error, 'problem', None) or error})") from None
    if recipe is None:
        raise SuzakError(f"recipe {path} is empty: write one `field: value` per line")
    if not isinstance(recipe, dict):
        raise SuzakError(f"recipe {path} must be a mapping of `field: value` lines, not a {type(recipe).__name__}")
    first_line: dict[str, int] = {}
    for key_node, _ in node.value:
        line = key_node.start_mark.line + 1
        if key_node.value in first_line:
            raise SuzakError(f"recipe {path} line {line}: key {key_node.value!r} is set twice (first on line "
                             f"{first_line[key_node.value]})")  # fmt: skip
        first_line[key_node.value] = line
    return recipe, first_line


def _check_recipe_keys(path: str, recipe: dict, lines: dict[str, int], names: set[str]) -> None:
    """Every key of the recipe is a field (or ``env``): a typo would otherwise stop TRL with a traceback."""
    for key in recipe:
        if str(key) not in names and key not in RECIPE_EXTRA_KEYS:
            raise SuzakError(f"recipe {path} line {lines.get(str(key), '?')}: unknown key {str(key)!r}"
                             f"{_did_you_mean(str(key), names)}")  # fmt: skip


def _split_config(argv: list[str]) -> tuple[str | None, list[str]]:
    """(the ``--config`` recipe path or None, the other flags); ``--config=PATH`` is taken like ``--config PATH``."""
    path, rest, i = None, [], 0
    while i < len(argv):
        token = argv[i]
        if token == "--config" or token.startswith("--config="):
            if path is not None:
                raise SuzakError("--config is given twice: one recipe per run (flags override its fields)")
            if token == "--config":
                if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                    raise SuzakError("--config needs a recipe file, e.g. --config recipes/smoke.yaml")
                path, i = argv[i + 1], i + 2
                continue
            path = token.split("=", 1)[1]
        else:
            rest.append(token)
        i += 1
    return path, rest


class _OneLineErrors:
    """argparse reports a value it cannot convert by printing its usage and exiting; suzak's commands say it in one
    line (``ArgumentParser.error`` is documented to be overridden this way)."""

    def error(self, message: str):
        raise SuzakError(message)


def _check_flags(unknown: list[str], names: set[str]) -> None:
    """The first command-line token no field takes: a flag typo (with the closest flag) or a stray value."""
    if not unknown:
        return
    token = unknown[0]
    if token.startswith("-"):
        flag = token.split("=", 1)[0]
        raise SuzakError(f"unknown flag {flag}{_did_you_mean(flag.lstrip('-').replace('-', '_'), names, '--')}")
    raise SuzakError(f"unexpected value {token!r} on the command line: values follow a --flag (one per flag, lists "
                     "excepted)")  # fmt: skip


def _next_multiple(value: int, step: int, divisor: int) -> int:
    """The smallest ``v >= value`` with ``v * step`` divisible by ``divisor``."""
    while (value * step) % divisor:
        value += 1
    return value


def _check_generation_batch(ns) -> None:
    """GRPO scores each prompt's ``num_generations`` completions as a group inside one generation batch, so the batch
    must hold whole groups. TRL refuses it in a traceback; this names the numbers and what to change."""
    groups = getattr(ns, "num_generations", None)
    if groups is None or groups < 2:  # SFT has none; TRL's own line covers fewer than 2
        return
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    if ns.generation_batch_size is not None:
        batch, how = ns.generation_batch_size, "set by generation_batch_size"
        example = f"generation_batch_size {-(-batch // groups) * groups}"
    else:
        steps = ns.steps_per_generation or ns.gradient_accumulation_steps
        batch = ns.per_device_train_batch_size * processes * steps
        how = (f"per_device_train_batch_size {ns.per_device_train_batch_size} x {processes} process(es) x {steps} "
               "step(s) per generation")  # fmt: skip
        better = _next_multiple(ns.per_device_train_batch_size, processes * steps, groups)
        example = f"per_device_train_batch_size {better}"
    if batch % groups == 0:
        return
    divisors = [d for d in range(2, batch + 1) if batch % d == 0]
    nearest = min(divisors, key=lambda d: (abs(d - groups), -d)) if divisors else None
    other = f", or num_generations a divisor of {batch} (e.g. {nearest})" if nearest else ""
    raise SuzakError(f"num_generations {groups} does not divide the generation batch of {batch} completions ({how}): "
                     f"make the batch a multiple of {groups} (e.g. {example}){other}")  # fmt: skip


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split())


def _parse(config_class, argv: list[str] | None, arguments: type = SuzakArguments):
    argv = list(sys.argv[1:] if argv is None else argv)
    recipe_file, flags = _split_config(argv)
    recipe, lines = _load_recipe(recipe_file) if recipe_file else ({}, {})  # before TRL's slow import

    from trl import ModelConfig, TrlParser

    class RecipeParser(_OneLineErrors, TrlParser):
        pass

    types = (arguments, config_class, ModelConfig)
    names = {f.name for t in types for f in fields(t) if f.init}
    _check_recipe_keys(recipe_file, recipe, lines, names)
    parser = RecipeParser(types, allow_abbrev=False)
    parser.set_defaults_with_config(**{k: v for k, v in recipe.items() if k not in RECIPE_EXTRA_KEYS})
    namespace, unknown = parser.parse_known_args(full_argv(flags))  # argparse only: no config object built yet
    _check_flags(unknown, names)
    _check_generation_batch(namespace)
    _cap_gpu_memory(namespace)
    flags = _resolve_auto_deepspeed(namespace, flags)
    try:
        suzak_args, config, model_args = parser.parse_args_and_config(
            full_argv((["--config", recipe_file] if recipe_file else []) + flags)
        )
    except ValueError as error:  # TRL's and transformers' config checks (__post_init__)
        raise SuzakError(f"invalid settings: {_one_line(error)}") from None
    if model_args.model_name_or_path is None:
        raise SuzakError("no model: set model_name_or_path in the recipe, MODEL in .env, or --model_name_or_path")
    _check_mixture(suzak_args, recipe, flags)
    _recipe_dataset_options(suzak_args, recipe, flags)
    _recipe_reward_kwargs(suzak_args, recipe, flags)
    _check_vllm_server(config)
    _check_quantization(suzak_args, config, model_args)
    _check_tools(suzak_args, config)
    _check_dynamic_sampling(suzak_args, config)
    check_eval_cadence(suzak_args.held_out_rows(), config.eval_steps)
    _check_mixture_rows(suzak_args)
    if suzak_args.on_nonfinite == "skip" and config.deepspeed:
        raise SuzakError("on_nonfinite skip cannot work under DeepSpeed: the engine applies the step before the "
                         "gradient norm is known; use on_nonfinite stop (the default) or run without --deepspeed")  # fmt: skip
    return suzak_args, config, model_args


def check_eval_cadence(eval_rows: int, eval_steps: float | None) -> None:
    """Held-out rows need a whole number of steps between their evaluations (before the model loads; the trainer's
    builder asks again for callers that skip the parser).

    >>> check_eval_cadence(8, 0.25)
    Traceback (most recent call last):
    suzak.SuzakError: eval_steps 0.25 is a share of the run (transformers' ratio); the held-out evaluation of eval_rows needs a whole number of steps: set eval_steps to one
    """
    if eval_rows <= 0:
        return
    if not eval_steps:
        raise SuzakError("eval_rows needs eval_steps: how often to generate the held-out answers")
    if eval_steps != int(eval_steps) or eval_steps < 1:
        raise SuzakError(f"eval_steps {eval_steps:g} is a share of the run (transformers' ratio); the held-out "
                         "evaluation of eval_rows needs a whole number of steps: set eval_steps to one")  # fmt: skip


def check_whole_groups(per_device_train_batch_size: int, steps_per_generation: int, num_generations: int) -> None:
    """Dynamic sampling keeps or drops whole groups on each rank: a rank's generation batch must hold whole groups
    (before the model loads; the trainer asks again for callers that skip the parser)."""
    rows = per_device_train_batch_size * steps_per_generation
    if rows % num_generations:
        raise SuzakError(f"dynamic_sampling keeps or drops whole groups on each rank: per_device_train_batch_size "
                         f"x steps_per_generation ({rows}) must be a multiple of num_generations "
                         f"({num_generations})")  # fmt: skip


def _check_dynamic_sampling(suzak_args: SuzakArguments, config) -> None:
    """Dynamic sampling keeps each round's advantages as TRL computed them on that round's batch: right where they
    are per group (scale_rewards group or none, sum_then_normalize), wrong where a batch-wide std scales them (its
    dropped groups included): those settings stop here, before the model loads."""
    if not suzak_args.dynamic_sampling or not hasattr(config, "num_generations"):  # SFT refuses it (GRPO_ONLY)
        return
    check_whole_groups(config.per_device_train_batch_size, config.steps_per_generation, config.num_generations)
    if getattr(config, "scale_rewards", "group") == "batch":
        raise SuzakError("dynamic_sampling with scale_rewards batch: each generation round would scale its advantages "
                         "by its own batch's std, dropped groups included, not the kept batch's; use scale_rewards "
                         "group (DAPO's) or none")  # fmt: skip
    if getattr(config, "multi_objective_aggregation", None) == "normalize_then_sum":
        raise SuzakError("dynamic_sampling with multi_objective_aggregation normalize_then_sum: each generation round "
                         "would normalize its summed rewards over its own batch, dropped groups included, not the "
                         "kept batch; use sum_then_normalize (the default)")  # fmt: skip


def _check_tools(suzak_args: SuzakArguments, config) -> None:
    """The tool settings against the pixel budget and the completion length, before the model loads."""
    from suzak.models.tools import check_tool_settings

    crop, cap = suzak_args.tool_max_pixels, suzak_args.tool_max_visual_tokens
    check_tool_settings(suzak_args.min_pixels, suzak_args.max_pixels, crop, cap)
    if not suzak_args.rewards and not suzak_args.datasets and not suzak_args.tools:
        raise SuzakError("rewards is empty: name at least one reward (docs/data.md#rewards), or an environment among "
                         "tools that scores its episodes (tools: [miniwob], docs/episodes.md)")  # fmt: skip
    if "zoom_used" in suzak_args.rewards and "zoom" not in suzak_args.tools:
        raise SuzakError("--rewards zoom_used pays a rollout's zoom calls: it needs --tools zoom")
    sources_tools = any(source.tools for source in suzak_args.mixture() or [])  # an episode source's, say
    if not suzak_args.tools and not sources_tools and (crop is not None or cap is not None):
        logger.warning("tool_max_pixels / tool_max_visual_tokens are set but tools is empty: they do nothing")
    if suzak_args.tools and getattr(config, "max_tool_calling_iterations", 0) is None:
        logger.info("tools: max_tool_calling_iterations is unset, so a rollout calls tools until it answers or "
                    "reaches max_completion_length (%s tokens)", config.max_completion_length)  # fmt: skip


def _cap_gpu_memory(namespace) -> None:
    """``gpu_memory_gib``: this rank's GPU capped to it (:func:`suzak.models.memory.cap_gpu_memory`), before anything
    is allocated on it."""
    gib = getattr(namespace, "gpu_memory_gib", None)
    if gib is None:
        return
    from suzak.models.memory import cap_gpu_memory

    cap_gpu_memory(gib, int(os.environ.get("LOCAL_RANK", "0")))


def _resolve_auto_deepspeed(namespace, flags: list[str]) -> list[str]:
    """``deepspeed: auto`` (the launch scripts' default on GPUs): the fastest DeepSpeed config predicted to fit this
    GPU (:mod:`suzak.models.memory`), said in one line on rank 0, appended to the flags (the last one wins)."""
    if getattr(namespace, "deepspeed", None) != "auto":
        return flags
    from suzak.models.loading import model_config
    from suzak.models.memory import plan_for

    plan = plan_for(namespace, model_config(namespace, for_vllm=bool(getattr(namespace, "use_vllm", False))))
    if os.environ.get("RANK", "0") == "0":
        logger.info("%s", plan.line())
    if not plan.fits:
        logger.warning("deepspeed auto: nothing is predicted to fit this run (%s)", plan.why)
    return [*flags, "--deepspeed", plan.config_path]


def _check_quantization(suzak_args, config, model_args) -> None:
    """QLoRA settings that cannot work, before anything loads: a quantized model without adapters to train,
    colocated or served vLLM (TRL sends vLLM the merged weights, which for a bitsandbytes base are packed 4-bit
    tensors its bf16 model cannot take), ``quantize_vision_tower`` alone. (TRL's ``ModelConfig`` already refuses both
    bit widths at once and a 4-bit type other than nf4 or fp4.)"""
    from suzak.models.loading import quantized

    flag = quantized(model_args)
    if flag is None:
        if suzak_args.quantize_vision_tower:
            raise SuzakError("quantize_vision_tower needs load_in_4bit or load_in_8bit: nothing else is quantized")
        return
    if not model_args.use_peft:
        raise SuzakError(f"{flag} freezes the model in bitsandbytes' {flag[8:]} format: it trains LoRA adapters on "
                         "top (QLoRA), so set use_peft: true (and lora_target_modules)")  # fmt: skip
    if getattr(config, "use_vllm", False):
        raise SuzakError(f"{flag} with use_vllm: TRL hands vLLM the policy's weights with the adapter merged, and a "
                         "bitsandbytes base holds packed quantized tensors there that vLLM's model cannot load; "
                         "generate with transformers (use_vllm: false), or train LoRA on the bf16 model with vLLM")  # fmt: skip


def _check_vllm_server(config) -> None:
    """TRL 1.16 syncs weights to a ``trl vllm-serve`` process over vLLM's NCCL weight-transfer engine only, and
    refuses a trainer that is not on a CUDA device (``VLLMClient.init_communicator``) after waiting for the server:
    on a machine without a GPU, say so before anything loads. Colocated vLLM runs on the CPU."""
    import torch

    if getattr(config, "use_vllm", False) and config.vllm_mode == "server" and not torch.cuda.is_available():
        raise SuzakError("vllm_mode server needs a CUDA GPU: TRL syncs the weights to `trl vllm-serve` over NCCL "
                         "(vLLM's NCCL weight-transfer engine), which a CPU cannot join; use vllm_mode colocate "
                         "here (vLLM's CPU build runs it)")  # fmt: skip


ONE_SOURCE_FIELDS = ("dataset_name", "dataset_options", "rewards", "reward_kwargs", "reward_weights", "eval_correct_at")


def _check_mixture(suzak_args: SuzakArguments, recipe: dict, flags: list[str]) -> None:
    """A recipe with ``datasets:`` sets each source's dataset and rewards there; the one-dataset fields beside it
    would be ignored, so they are one line (DATASET in .env reads as --dataset_name)."""
    if suzak_args.datasets is None:
        return
    argv = full_argv(flags)
    given = [name for name in ONE_SOURCE_FIELDS if name in recipe or _given(argv, name)]
    if given:
        raise SuzakError(f"datasets: each source sets its own dataset and rewards, and {', '.join(given)} "
                         f"{'is' if len(given) == 1 else 'are'} set beside them (recipe, flags or .env): move "
                         "them into the sources' entries (options, rewards, reward_weights, reward_kwargs, "
                         "eval_correct_at) or drop them")  # fmt: skip


def _check_mixture_rows(suzak_args: SuzakArguments) -> None:
    """``max_train_rows`` split among a mixture's sources gives each at least one row: fewer rows than sources is one
    line."""
    sources = suzak_args.mixture()
    rows = suzak_args.max_train_rows
    if sources and rows is not None and rows < len(sources):
        raise SuzakError(f"max_train_rows {rows}: a mixture keeps at least one row of each of its {len(sources)} "
                         f"sources; set it to {len(sources)} or more")  # fmt: skip


def _given(flags: list[str], name: str) -> bool:
    return any(a == f"--{name}" or a.startswith(f"--{name}=") for a in flags)


def _recipe_dataset_options(suzak_args: SuzakArguments, recipe: dict, flags: list[str]) -> None:
    """The recipe's ``dataset_options`` belong to the recipe's ``dataset_name``.

    When DATASET or ``--dataset_name`` picks another dataset, they are not applied to it (the new builder would reject
    them, or worse, take them). For the recipe's own dataset, ``--dataset_options`` updates the recipe's mapping key
    by key (``'{"num_rows": 5}'`` keeps the recipe's seed) instead of replacing it.
    """
    own, mine = recipe.get("dataset_name"), recipe.get("dataset_options")
    same_dataset = own is None or own == suzak_args.dataset_name
    if not isinstance(mine, dict) or not mine:
        return
    if _given(flags, "dataset_options"):
        if same_dataset and isinstance(suzak_args.dataset_options, dict):
            suzak_args.dataset_options = {**mine, **suzak_args.dataset_options}
        return
    if not same_dataset:
        logger.info("dataset_name %s replaces the recipe's %s: the recipe's dataset_options %s are not applied",
                    suzak_args.dataset_name, own, mine)  # fmt: skip
        suzak_args.dataset_options = None


def _recipe_reward_kwargs(suzak_args: SuzakArguments, recipe: dict, flags: list[str]) -> None:
    """The recipe's ``reward_kwargs`` are per reward, and the CLI's update them reward by reward, key by key.

    ``--reward_kwargs '{"clevr_count": {"answer_format": "plain"}}'`` keeps the recipe's kwargs of its other rewards;
    a reward given as null there drops the recipe's kwargs for it. When ``--rewards`` leaves one of the recipe's
    rewards out, the recipe's kwargs for it are not applied (logged); kwargs the CLI gives for a reward that is not
    run, or a recipe's kwargs for a reward the recipe does not run, stay an error
    (:func:`suzak.scoring.rewards.resolve_rewards`).
    """
    mine = recipe.get("reward_kwargs")
    if not isinstance(mine, dict) or not mine:
        return
    given = suzak_args.reward_kwargs if _given(flags, "reward_kwargs") else {}
    if not isinstance(given, dict) or not all(isinstance(v, dict) or v is None for v in mine.values()):
        return  # not per-reward mappings: resolve_rewards names what is wrong
    merged = dict(mine)
    for name, kwargs in given.items():
        if kwargs is None:
            merged.pop(name, None)
        else:
            merged[name] = {**(mine.get(name) or {}), **kwargs} if isinstance(kwargs, dict) else kwargs
    # only what --rewards leaves out: a recipe naming a reward it does not run stays an error
    if _given(flags, "rewards"):
        dropped = sorted(name for name in mine if name not in given and name not in suzak_args.rewards)
        if dropped:
            logger.info("rewards %s leave out %s: the recipe's reward_kwargs for it are not applied",
                        suzak_args.rewards, ", ".join(dropped))  # fmt: skip
        merged = {name: kwargs for name, kwargs in merged.items() if name not in dropped}
    suzak_args.reward_kwargs = merged or None


def parse_args(argv: list[str] | None = None):
    """(SuzakGRPOArguments, GRPOConfig, ModelConfig) from YAML + environment + CLI, in increasing priority."""
    from trl import GRPOConfig

    return _parse(GRPOConfig, argv, SuzakGRPOArguments)


# suzak's settings only GRPO reads (rollouts): SFT refuses them rather than train as if they were not there
GRPO_ONLY = ("tools", "tool_max_pixels", "tool_max_visual_tokens", "dynamic_sampling", "dynamic_sampling_min_std",
             "dynamic_sampling_max_rounds")  # fmt: skip


def parse_sft_args(argv: list[str] | None = None):
    """(SuzakArguments, SFTConfig, ModelConfig), the same way as :func:`parse_args`; the settings of
    :data:`GRPO_ONLY` (rollouts: tools, dynamic sampling) set away from their defaults stop it in one line."""
    from trl import SFTConfig

    suzak_args, config, model_args = _parse(SFTConfig, argv)
    defaults = SuzakArguments.__dataclass_fields__
    grpo = [name for name in GRPO_ONLY if getattr(suzak_args, name) != (
        defaults[name].default_factory() if defaults[name].default_factory is not MISSING else defaults[name].default)]  # fmt: skip
    if grpo:
        raise SuzakError(f"{', '.join(grpo)}: GRPO settings (suzak.train's rollouts) that SFT does not use; remove "
                         "them from the recipe or the flags")  # fmt: skip
    return suzak_args, config, model_args
