"""GRPO training: ``python -m suzak.train --config recipes/smoke.yaml [--any_field value ...]`` (``suzak train``).

Parsed with TRL's ``TrlParser`` from three dataclasses: suzak's :class:`~suzak.training.configs.SuzakArguments` (data, pixel
budget, rewards), TRL's ``GRPOConfig`` (every GRPO/TrainingArguments field as TRL defines it) and TRL's
``ModelConfig`` (model, dtype, attention, LoRA). The YAML recipe sets values; CLI flags override it. ``.env``
(python-dotenv) holds secrets and machine paths; MODEL, DATASET and OUTPUT_DIR there override the recipe (CLI flags
still win). The trainer is :func:`suzak.training.build.grpo_trainer`'s; the run itself (records, resume, plots,
publishing) is :mod:`suzak.training.session`'s, shared with SFT.
"""

from __future__ import annotations

from suzak.training import session
from suzak.training.build import grpo_trainer as build_trainer
from suzak.training.configs import SuzakArguments, parse_args

__all__ = ["SuzakArguments", "build_trainer", "main", "parse_args"]


def main(argv: list[str] | None = None) -> None:
    session.main(argv, parse_args, build_trainer, command="suzak.train")


if __name__ == "__main__":
    main()
