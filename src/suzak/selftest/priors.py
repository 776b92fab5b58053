"""Answer priors: the short supervised start a random-init tiny model gets before GRPO (a pretrained model's habit of
answering in the task's form, nothing about the images), and ``--prior_cache``, which keeps a trained prior under a
key of everything that makes it so a later run loads it instead of training it again."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from suzak.selftest.report import quiet_progress

if TYPE_CHECKING:
    from suzak.media.video import VideoBudget
    from suzak.media.vision import PixelBudget
    from suzak.selftest.config import SelfTestConfig

__all__ = [
    "ToolTurns",
    "answer_rows",
    "cached_prior",
    "keep_prior",
    "prior_folder",
    "prior_key",
    "sft_prior",
    "shared_prior",
    "tool_prior",
    "train_prior",
]

logger = logging.getLogger(__name__)


def answer_rows(rows, answers) -> list[dict]:
    """The rows of an answer prior: each of ``rows``' prompt and image, and its answer from ``answers`` as the
    assistant's turn ({prompt, image, completion}, what :func:`sft_prior` trains on).

    >>> answer_rows([{"prompt": "p", "image": None, "solution": "red"}], ["blue"])
    [{'prompt': 'p', 'image': None, 'completion': [{'role': 'assistant', 'content': 'blue'}]}]
    """
    return [{"prompt": row["prompt"], "image": row["image"],
             "completion": [{"role": "assistant", "content": str(answer)}]}
            for row, answer in zip(rows, answers, strict=True)]  # fmt: skip


class ToolTurns:
    """A tool prior's rows (:func:`tool_prior`): each conversation rendered with the tools' schemas (TRL's SFT collator
    for VL models passes no ``tools`` to the template), its last turn the completion.

    >>> turns = ToolTurns(None, [], "zoom prior")
    >>> turns.after("<s>a", "<s>ab")
    'b'
    """

    def __init__(self, processor, tools: list[dict], what: str):
        self.processor, self.tools, self.what = processor, tools, what
        self.rows: list[dict] = []

    def render(self, messages: list[dict], **kwargs) -> str:
        return self.processor.apply_chat_template(messages, tools=self.tools, tokenize=False, **kwargs)

    def after(self, prefix: str, text: str) -> str:
        if not text.startswith(prefix):
            from suzak import SuzakError

            raise SuzakError(f"{self.what}: the chat template does not render the conversation's turns as prefixes")
        return text[len(prefix) :]

    def add(self, messages: list[dict], completion: dict, images: list) -> None:
        """A row: ``messages`` as the prompt (with the generation prompt), ``completion`` the turn it learns."""
        prompt = self.render(messages, add_generation_prompt=True)
        self.rows.append({"prompt": prompt, "images": images,
                          "completion": self.after(prompt, self.render([*messages, completion]))})  # fmt: skip


def tool_prior(model, processor, rows: list[dict], steps: int, output_dir: Path, *, batch_size: int,
               learning_rate: float, lr_scheduler_type: str, seed: int) -> None:  # fmt: skip
    """``steps`` SFT steps (TRL's SFTTrainer, fp32, completion-only loss) on a tool prior's ``rows``
    ({prompt, images, completion} as :class:`ToolTurns` makes them), in place on ``model``."""
    import datasets
    from trl import SFTConfig, SFTTrainer

    from suzak.trl_internals.precision import score_labelled_positions_only

    args = SFTConfig(output_dir=str(output_dir / "prior"), seed=seed, max_steps=steps,
                     per_device_train_batch_size=batch_size, learning_rate=learning_rate,
                     lr_scheduler_type=lr_scheduler_type, completion_only_loss=True, save_strategy="no",
                     report_to="none", use_cpu=model.device.type == "cpu", disable_tqdm=True, logging_steps=steps,
                     bf16=False, gradient_checkpointing=False)  # fmt: skip
    score_labelled_positions_only()  # TRL's SFTTrainer, not suzak's: its fused LM head scores the completions only
    SFTTrainer(
        model=model, args=args, train_dataset=datasets.Dataset.from_list(rows), processing_class=processor
    ).train()


def sft_prior(
    config: SelfTestConfig, rows: list[dict], model, processor, budget: PixelBudget, output_dir: Path
) -> None:
    """``config.spec.prior_steps`` steps of TRL's SFTTrainer (batch 32, completion-only loss, the spec's learning rate
    and schedule) on ``rows`` ({prompt, image, completion}), in place on ``model``.

    A pretrained Qwen answers "How many ...?" with a number and "Where is ...?" with a box; the random-init tiny
    model first has to find those tokens among ~600, and GRPO then piles onto whichever answer it found first and
    stops exploring (docs/selftest.md). The task's rows show pictures with nothing to read (the empty table, a grey
    image) and answers spread evenly, so the model gets the answer's form and knows nothing about the images yet.
    """
    import datasets
    from trl import SFTConfig, SFTTrainer

    from suzak.media.vision import configure_processor
    from suzak.trl_internals.precision import score_labelled_positions_only

    spec = config.spec
    args = SFTConfig(
        output_dir=str(output_dir / "prior"), seed=config.seed, max_steps=spec.prior_steps,
        per_device_train_batch_size=32, learning_rate=spec.prior_lr, lr_scheduler_type=spec.prior_schedule,
        completion_only_loss=True, logging_steps=10, save_strategy="no", report_to="none", bf16=False,
        gradient_checkpointing=False, use_cpu=config.device == "cpu", disable_tqdm=True,
    )  # fmt: skip
    configure_processor(processor, budget)
    score_labelled_positions_only()  # TRL's SFTTrainer, not suzak's: its fused LM head scores the completions only
    trainer = SFTTrainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(rows),
                         processing_class=processor)  # fmt: skip
    quiet_progress(trainer)
    trainer.train()


def train_prior(config: SelfTestConfig, condition: str, model, processor, budget: PixelBudget,
                video_budget: VideoBudget, crops: PixelBudget, output_dir: Path) -> None:  # fmt: skip
    """The task's prior for ``condition`` (one condition's name, or several joined by "and" when they share it), in
    place on ``model``; none for a task without ``prior_steps``."""
    if not config.spec.prior_steps:
        return
    config.task_module.prior(config, condition, model, processor, budget, video_budget, crops, output_dir)


def prior_key(config: SelfTestConfig, model_dir: Path, role: str) -> str:
    """The key a prior is kept under in ``--prior_cache``: everything that makes it, hashed: the task's settings
    (``TaskSpec``), family, seed, device and the condition it is for (``role``), the tiny model's files, suzak's code
    (every file of the package) and transformers' and TRL's versions. Not torch's: a prior is saved weights, and the
    vLLM tier's torch (2.11, vLLM's) changes only the float sums of the same steps that the main suite's (2.14) runs,
    so a prior trained beside one serves a run in the other (CI trains the zoom and grounding priors once for both)."""
    import transformers
    import trl

    settings = {"task": config.task, "family": config.family, "seed": config.seed, "device": config.device,
                "role": role, "spec": dataclasses.asdict(config.spec), "transformers": transformers.__version__,
                "trl": trl.__version__}  # fmt: skip
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    package = Path(__file__).parents[1]  # suzak's
    files = [(model_dir, path) for path in model_dir.rglob("*")] + [
        (package, path) for path in package.rglob("*") if "__pycache__" not in path.parts
    ]
    for root, path in sorted(files):
        if path.is_file():
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:20]


def prior_folder(config: SelfTestConfig, model_dir: Path, role: str) -> Path | None:
    """Where ``config.prior_cache`` keeps this run's prior for ``role`` (its key, :func:`prior_key`); None without
    a cache."""
    return None if config.prior_cache is None else Path(config.prior_cache) / prior_key(config, model_dir, role)


def cached_prior(folder: Path | None, role: str) -> Path | None:
    """``folder`` (:func:`prior_folder`) if a prior is kept there."""
    if folder is None or not (folder / "config.json").is_file():
        return None
    logger.info("%s prior from %s (kept by an earlier run with the same key)", role, folder)
    return folder


def keep_prior(folder: Path | None, saved: Path) -> None:
    """Copy the prior saved in ``saved`` (model and processor) to ``folder`` (:func:`prior_folder`; None: no cache);
    a copy is made beside it and renamed into place, so a run reading the cache sees a whole prior or none."""
    if folder is None:
        return
    folder.parent.mkdir(parents=True, exist_ok=True)
    partial = folder.parent / f"{folder.name}.partial-{os.getpid()}"
    shutil.copytree(saved, partial)
    try:
        partial.rename(folder)
    except OSError:  # another run kept the same prior first
        shutil.rmtree(partial, ignore_errors=True)


def shared_prior(config: SelfTestConfig, model_dir: Path, conditions: tuple[str, ...], folder: Path,
                 threads: int) -> Path | None:  # fmt: skip
    """The conditions' common prior, trained once on ``threads`` threads and saved in ``folder`` (model and
    processor), when they have one: colour, counting, grounding and video give the aligned run and its control the same
    answer prior (the same grey rows, seed and steps), so each condition starts from this copy instead of training it
    again. None when the task has no prior or its conditions' differ (zoom: the call prior with the tool, an answer
    prior without)."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    spec = config.spec
    if not spec.prior_steps or spec.tools:
        return None
    kept = prior_folder(config, model_dir, "shared")
    if cached_prior(kept, "shared") is not None:
        return kept
    processor = AutoProcessor.from_pretrained(model_dir)
    model = AutoModelForImageTextToText.from_pretrained(model_dir)
    budget, video_budget = config.budgets(processor)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        train_prior(config, " and ".join(conditions), model, processor, budget, video_budget, budget, folder)
    finally:
        torch.set_num_threads(before)
    model.save_pretrained(folder / "model")
    processor.save_pretrained(folder / "model")
    keep_prior(kept, folder / "model")
    return folder / "model"
