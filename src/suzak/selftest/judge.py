"""A tiny vision-language judge for the ``judge`` reward's tests (docs/judge.md): the offline tiny model taught by
SFT to answer "Is the image red?" about a red or blue square, asked through the reward's own code
(:func:`suzak.scoring.judge.judge_items`, its local judge), with its accuracy on squares it never saw.

It sees the picture, and its question holds no answer to judge: it gives every completion of a row the same score,
so the judge pre-flight must refuse it (it cannot tell a right answer from a wrong one), and every completion of a
row is one distinct question (``judge/cached``). A judge of whether a colour word is the square's colour (what the
learning proof needs) is an XOR of the picture and the word: SFT of this tiny model on it stayed at chance (ln 2 on
the verdict) for 600 steps, also with colour naming mixed in (docs/judge.md); it is not here yet."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

__all__ = ["QUESTION", "picture_judge_items", "picture_judge_settings", "train_picture_judge"]

logger = logging.getLogger(__name__)

QUESTION = "Is the image red?"  # the judge's whole prompt (no {answer}: it judges the picture alone)


def picture_judge_settings(folder: Path | str, factor: int) -> dict:
    """The ``judge`` reward's settings for the picture judge in ``folder``: a local model, its own question, the
    squares at their 2x2 visual tokens of ``factor`` pixels.

    >>> picture_judge_settings("j", 28)["max_pixels"], picture_judge_settings("j", 28)["prompt"]
    (3136, 'Is the image red?')
    """
    side = 2 * factor
    return {"model": str(folder), "reference": False, "verdict": "yes_no", "prompt": QUESTION,
            "min_pixels": side * side, "max_pixels": side * side, "factor": factor}  # fmt: skip


def picture_judge_items(num_rows: int, seed: int, settings: dict) -> tuple[list, list[str]]:
    """(the judge's question about ``num_rows`` red or blue squares, built by the reward's own code; the verdict each
    should get: yes for a red square)."""
    from suzak.scoring.judge import judge_items, judge_settings
    from suzak.selftest.color import color_dataset

    rows = list(color_dataset(num_rows, seed, "aligned", 2 * settings["factor"]))
    items = judge_items(judge_settings(settings), [row["prompt"] for row in rows], [row["solution"] for row in rows],
                        None, {"image": [row["image"] for row in rows]})  # fmt: skip
    return items, ["yes" if row["solution"] == "red" else "no" for row in rows]


def train_picture_judge(folder: Path, family: str = "qwen2_5_vl", steps: int = 60, seed: int = 0,
                        heldout_rows: int = 64, for_vllm: bool = False) -> tuple[Path, float]:  # fmt: skip
    """The tiny ``family`` model taught to answer :data:`QUESTION` (``steps`` SFT steps of 32 squares, TRL's
    SFTTrainer, completion-only loss, lr 3e-3), saved with its processor in ``folder / "judge"``; returns (that folder,
    its accuracy on ``heldout_rows`` unseen squares, asked through the reward's local judge: P(yes) above one half);
    ``for_vllm``: the tiny model's shape vLLM's CPU build serves (head_dim 32)."""
    import datasets
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor
    from trl import SFTConfig, SFTTrainer

    from suzak.media.vision import PixelBudget, configure_processor, patch_factor
    from suzak.models.tiny import TinyConfig, build_tiny_model
    from suzak.scoring.judge import LocalJudge, judge_settings
    from suzak.selftest.report import quiet_progress
    from suzak.trl_internals import score_labelled_positions_only

    folder = Path(folder)
    model_dir = build_tiny_model(
        folder / "tiny", TinyConfig.shaped(family, for_vllm=for_vllm, extra_corpus=["yes no"] * 50)
    )
    torch.manual_seed(seed)
    processor = AutoProcessor.from_pretrained(model_dir)
    model = AutoModelForImageTextToText.from_pretrained(model_dir)
    settings = picture_judge_settings(folder / "judge", patch_factor(processor))
    budget = PixelBudget(settings["min_pixels"], settings["max_pixels"]).for_model(processor)
    configure_processor(processor, budget)
    items, verdicts = picture_judge_items(steps * 32, seed + 30_000, settings)
    rows = [{"prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": item.text}]}],
             "image": budget.fit(item.image), "completion": [{"role": "assistant", "content": verdict}]}
            for item, verdict in zip(items, verdicts, strict=True)]  # fmt: skip
    args = SFTConfig(output_dir=str(folder / "sft"), seed=seed, max_steps=steps, per_device_train_batch_size=32,
                     learning_rate=3e-3, lr_scheduler_type="constant", completion_only_loss=True, save_strategy="no",
                     report_to="none", use_cpu=True, disable_tqdm=True, logging_steps=10, bf16=False,
                     gradient_checkpointing=False)  # fmt: skip
    score_labelled_positions_only()  # TRL's SFTTrainer: its fused LM head scores the completions only
    trainer = SFTTrainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(rows),
                         processing_class=processor)  # fmt: skip
    quiet_progress(trainer)
    trainer.train()
    saved = folder / "judge"
    model.save_pretrained(saved)
    processor.save_pretrained(saved)
    heldout, truth = picture_judge_items(heldout_rows, seed + 40_000, settings)
    replies = asyncio.run(LocalJudge(judge_settings(settings)).ask(heldout))
    said = ["yes" if p is not None and p > 0.5 else "no" for _, p in replies]
    accuracy = sum(a == b for a, b in zip(said, truth, strict=True)) / len(truth)
    losses = [round(entry["loss"], 3) for entry in trainer.state.log_history if "loss" in entry]
    logger.info("picture judge: %d SFT steps (loss every 10: %s), accuracy %.3f on %d held-out squares", steps,
                losses, accuracy, len(truth))  # fmt: skip
    return saved, accuracy
