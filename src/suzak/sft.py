"""SFT warm starts with TRL's ``SFTTrainer`` (loss on the completion only), for GSM8K and CLEVR counting.

    python -m suzak.sft --config recipes/sft_smoke.yaml [--any_field value ...]
    bash src/scripts/run_sft.sh --preset smoke

Same conventions as ``suzak.train``: ``TrlParser`` over suzak's :class:`~suzak.training.configs.SuzakArguments`, TRL's
``SFTConfig`` and ``ModelConfig``; YAML recipe, then ``.env`` (MODEL/DATASET/OUTPUT_DIR), then CLI flags. The
trainer is :func:`suzak.training.build.sft_trainer`'s. The targets (:mod:`suzak.data.targets`) are built from the
prompt template's answer format, so an SFT model answers in exactly the format the GRPO rewards score
(``model_name_or_path`` of a GRPO recipe can point at the SFT output):

- GSM8K rows: the worked answer ending ``#### N`` with the ``<<…>>`` calculator spans removed (``gsm8k``
  template), or the same steps inside ``<think>`` and the number in ``<answer>`` (``gsm8k_think``);
- CLEVR scenes: ``<think>`` + the scene description + ``</think> <answer> N </answer>``;
- anything else: the gold answer in the template's answer format.
"""

from __future__ import annotations

from suzak.data.targets import sft_completion, to_sft_dataset
from suzak.training import session
from suzak.training.build import sft_trainer as build_sft_trainer
from suzak.training.configs import parse_sft_args

__all__ = ["build_sft_trainer", "main", "parse_sft_args", "sft_completion", "to_sft_dataset"]


def main(argv: list[str] | None = None) -> None:
    """The training run of :mod:`suzak.training.session` (records, CSV streams, plots, resume, release) with SFT's trainer."""
    session.main(argv, parse_sft_args, build_sft_trainer, command="suzak.sft")


if __name__ == "__main__":
    main()
