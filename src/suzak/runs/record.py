"""What a run records about itself in its output dir: the recipe as run and ``run_info.json``.

- ``recipe.yaml``: every field the recipe file, ``.env`` overrides or CLI flags set, with the value the run actually
  used (after parsing), secrets masked. ``python -m suzak.train --config OUTPUT_DIR/recipe.yaml`` runs it again.
- ``run_info.json``: one entry per launch of the run (a resume adds one): start and end time, the steps covered,
  the hardware (GPU model and count, or CPU) and the library versions. Model cards read training time and hardware
  from it.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from dataclasses import fields, is_dataclass
from datetime import UTC, datetime
from enum import Enum
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from suzak.runs.redaction import is_secret_name, redact, redact_argv

__all__ = [
    "RECIPE_FILE",
    "RUN_INFO_FILE",
    "SETTINGS",
    "config_path",
    "finish_run",
    "hardware",
    "plain_value",
    "read_run_info",
    "recipe_as_run",
    "save_recipe",
    "start_run",
    "training_seconds",
    "versions",
]

RECIPE_FILE = "recipe.yaml"
RUN_INFO_FILE = "run_info.json"
# Effective values recorded in run_info.json (defaults included), for model cards.
SETTINGS = ("model_name_or_path", "dataset_name", "dataset_options", "datasets", "prompt_template", "min_pixels",
            "max_pixels",
            "rewards", "reward_weights", "reward_kwargs", "learning_rate", "beta", "loss_type", "num_generations",
            "per_device_train_batch_size", "gradient_accumulation_steps", "max_completion_length", "temperature",
            "max_steps", "num_train_epochs", "use_peft", "lora_r", "load_in_4bit", "load_in_8bit", "bnb_4bit_quant_type",
            "opening_in_completion", "deepspeed", "use_vllm", "bf16", "seed")  # fmt: skip
_PACKAGES = (
    "suzak",
    "torch",
    "transformers",
    "trl",
    "accelerate",
    "datasets",
    "peft",
    "bitsandbytes",
    "deepspeed",
    "vllm",
)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def plain_value(value: Any) -> Any:
    """A YAML/JSON-safe form of a parsed argument value (enums by value, unknown objects as text)."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {str(k): plain_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain_value(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def _flag_names(argv: list[str]) -> list[str]:
    """Field names set by ``--name value`` / ``--name=value`` flags, in order (``--config`` excluded)."""
    names = [token[2:].split("=", 1)[0].replace("-", "_") for token in argv if token.startswith("--")]
    return [name for name in dict.fromkeys(names) if name != "config"]


def config_path(argv: list[str]) -> str | None:
    """The ``--config`` recipe file named in ``argv``, if any."""
    for i, token in enumerate(argv):
        if token == "--config" and i + 1 < len(argv):
            return argv[i + 1]
        if token.startswith("--config="):
            return token.split("=", 1)[1]
    return None


def _values(keys: list[str] | tuple[str, ...], parsed: tuple) -> dict[str, Any]:
    """The parsed value of each key (from whichever argument dataclass has that field), secrets masked."""
    values = {}
    for key in keys:
        owner = next((args for args in parsed if is_dataclass(args) and key in {f.name for f in fields(args)}), None)
        if owner is not None:
            values[key] = plain_value(getattr(owner, key))
    return redact(values)


def recipe_as_run(argv: list[str], parsed: tuple) -> dict[str, Any]:
    """The recipe's keys plus every flag's, each with the parsed value the run used, secrets masked.

    Credential fields (``hub_token``) are left out, so the file runs again as it is (tokens come from ``.env``).
    """
    config = config_path(argv)
    keys = list(yaml.safe_load(Path(config).read_text()) or {}) if config else []
    keys = [key for key in dict.fromkeys(keys + _flag_names(argv)) if not is_secret_name(key)]
    return _values(keys, parsed)


def save_recipe(output_dir: str | Path, argv: list[str], parsed: tuple) -> Path:
    """Write ``recipe.yaml`` (see :func:`recipe_as_run`) with a header naming the source recipe and the flags."""
    path = Path(output_dir) / RECIPE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    header = [
        "# Recipe as run by suzak.train (values after parsing; secrets masked, credential fields left out).",
        f"# Source: {config_path(argv) or '(no recipe file)'}; command-line flags: {' '.join(redact_argv(argv))}",
        f"# Re-run: python -m suzak.train --config {path}",
    ]
    body = yaml.safe_dump(recipe_as_run(argv, parsed), sort_keys=False, allow_unicode=True, width=120)
    path.write_text("\n".join(header) + "\n" + body, encoding="utf-8")
    return path


def hardware() -> dict[str, Any]:
    """GPU model and count (this node; ``world_size`` processes in all), or the CPU."""
    import torch

    world = int(os.environ.get("WORLD_SIZE", "1"))
    info: dict[str, Any] = {"world_size": world, "processes_per_node": int(os.environ.get("LOCAL_WORLD_SIZE", world))}
    if torch.cuda.is_available():
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        return info | {"accelerator": "cuda", "gpu": names[0], "gpus_per_node": len(names)}
    cpu = platform.processor() or platform.machine()
    return info | {"accelerator": "cpu", "cpu": cpu, "cpu_count": os.cpu_count()}


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def read_run_info(output_dir: str | Path) -> dict[str, Any]:
    path = Path(output_dir) / RUN_INFO_FILE
    return json.loads(path.read_text()) if path.is_file() else {"launches": []}


def _write_run_info(output_dir: str | Path, info: dict) -> None:
    path = Path(output_dir) / RUN_INFO_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(redact(info), indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def start_run(output_dir: str | Path, argv: list[str], parsed: tuple, resumed_from: str | None = None,
              start_step: int = 0, wandb_id: str | None = None) -> None:  # fmt: skip
    """Append this launch to ``run_info.json``; settings, hardware and versions of the newest launch (and the W&B
    run id, which a resume reuses) at the top."""
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    info = read_run_info(output_dir)
    if wandb_id:
        info["wandb_run_id"] = wandb_id
    info["settings"], info["hardware"], info["versions"] = _values(SETTINGS, parsed), hardware(), versions()
    command = " ".join([Path(sys.executable).name, "-m", "suzak.train", *redact_argv(argv)])
    info["launches"].append({"start": _now(), "command": command, "resumed_from": resumed_from,
                             "start_step": start_step, "hardware": info["hardware"]})  # fmt: skip
    _write_run_info(output_dir, info)


def finish_run(output_dir: str | Path, global_step: int, status: str = "completed") -> None:
    """Close the newest launch: end time, duration, final step."""
    info = read_run_info(output_dir)
    if not info["launches"]:
        return
    launch = info["launches"][-1]
    launch |= {"end": _now(), "final_step": global_step, "status": status}
    start = datetime.fromisoformat(launch["start"])
    launch["seconds"] = round((datetime.fromisoformat(launch["end"]) - start).total_seconds(), 1)
    _write_run_info(output_dir, info)


def training_seconds(info: dict[str, Any]) -> float:
    """Wall-clock seconds over every finished launch."""
    return sum(launch.get("seconds", 0.0) for launch in info.get("launches", []))
