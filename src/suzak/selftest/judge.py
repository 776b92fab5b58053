"""``--task judge``: the policy learns the colour task rewarded only by a vision-language judge that sees the square
(the ``judge`` reward, docs/judge.md), and the tiny judges the reward's tests use.

The judge is the offline tiny Qwen2.5-VL taught by SFT (:func:`train_colour_judge`, its accuracy on unseen squares
reported and barred) to answer "Is the image {answer}?" about a red or blue square, naming the square's colour before
its verdict ("blue: no"). Whether a colour word is the square's colour is an XOR of the picture and the word: asked
for the verdict alone, this tiny model stayed at chance after 600 SFT steps; naming the colour first, it is right on
every unseen square after 120 (docs/judge.md). The judge is reference-free: it is shown the candidate answer and
the picture, never the gold answer.

The policy answers "What color is the image?" (the colour task's squares and answer prior) and is rewarded by the
judge alone; its answers are scored by rule only to be reported (the colour task's first-token reward, logged at
weight 0: the figure) and on the held-out squares. The control (``judge_grey``) shows the policy the same squares
and the judge a grey one in place of each row's (the judge's ``image_column``): the judge still answers, but nothing
it sees tells red from blue, so the policy stays at chance.

The picture judge (:func:`train_picture_judge`) answers "Is the image red?": it sees the picture and has no answer
to judge, so it gives every completion of a row the same score: the tests' judge for the reward's plumbing, the
served judge of the vLLM tier, and a judge the pre-flight must refuse.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
from pathlib import Path
from typing import TYPE_CHECKING

from suzak.models.tiny import DEFAULT_FAMILY
from suzak.selftest import color
from suzak.selftest.spec import TaskSpec, register

if TYPE_CHECKING:
    from collections.abc import Callable

    from suzak.selftest.config import SelfTestConfig

__all__ = [
    "COLOUR_QUESTION",
    "CONTROL",
    "JUDGE_IMAGE",
    "QUESTION",
    "SPEC",
    "colour_judge_items",
    "colour_judge_settings",
    "judge_task_dataset",
    "picture_judge_items",
    "picture_judge_settings",
    "train_colour_judge",
    "train_picture_judge",
]

logger = logging.getLogger(__name__)

QUESTION = "Is the image red?"  # the picture judge's whole prompt (no {answer}: it judges the picture alone)
COLOUR_QUESTION = "Is the image {answer}?"  # the colour judge's prompt: the candidate answer and the picture
JUDGE_IMAGE = "judge_image"  # the judge task's column with the picture its judge sees (image_column)
CONTROL = "judge_grey"  # the judge task's control: the policy sees the squares, the judge a grey square
JUDGE_FAMILY = DEFAULT_FAMILY  # the judges' tiny model, whatever the policy's family
JUDGE_STEPS = 300  # the colour judge's SFT steps: its verdicts click at steps 80-150 (seeds 0-3; docs/judge.md)
JUDGE_BAR = 0.95  # the colour judge's accuracy on unseen squares the task asks before its runs count

# The colour task's settings and bars (its prior, lr 3e-3, 16 prompts x 8), over 100 steps: the judge pays the
# colour word alone (not a colour word and a stray token, as the colour task's first-token reward does), and the
# aligned run crossed 0.9 by step 50-70 on seeds 0-2, 0.992-0.996 over its last 10 (docs/selftest.md, the judge).
SPEC = register("judge", __name__, TaskSpec(100, 3e-3, (2, 2), 2, 0.5, 0.9, (0.3, 0.7), prior_steps=30,
                                            heldout_pass_at=0.9, heldout_control_below=0.7,
                                            control=CONTROL))  # fmt: skip


# --- the judges ---------------------------------------------------------------------------------------------------


def _square_budget(folder: Path | str, factor: int) -> dict:
    """A judge's settings for the squares: the local model in ``folder``, 2x2 visual tokens of ``factor`` pixels."""
    side = 2 * factor
    return {"model": str(folder), "min_pixels": side * side, "max_pixels": side * side, "factor": factor}


def picture_judge_settings(folder: Path | str, factor: int) -> dict:
    """The ``judge`` reward's settings for the picture judge in ``folder``: a local model, its own question, the
    squares at their 2x2 visual tokens of ``factor`` pixels.

    >>> picture_judge_settings("j", 28)["max_pixels"], picture_judge_settings("j", 28)["prompt"]
    (3136, 'Is the image red?')
    """
    return _square_budget(folder, factor) | {"reference": False, "verdict": "yes_no", "prompt": QUESTION}


def colour_judge_settings(folder: Path | str, factor: int) -> dict:
    """The ``judge`` reward's settings for the colour judge in ``folder``: reference-free, "Is the image {answer}?",
    the verdict read from its reply after the colour it names (``logprobs`` off: its first token is the colour), the
    picture from the :data:`JUDGE_IMAGE` column.

    >>> settings = colour_judge_settings("j", 28)
    >>> settings["prompt"], settings["image_column"], settings["logprobs"]
    ('Is the image {answer}?', 'judge_image', False)
    """
    return _square_budget(folder, factor) | {"reference": False, "verdict": "yes_no", "prompt": COLOUR_QUESTION,
                                             "logprobs": False, "image_column": JUDGE_IMAGE}  # fmt: skip


def picture_judge_items(num_rows: int, seed: int, settings: dict) -> tuple[list, list[str]]:
    """(the judge's question about ``num_rows`` red or blue squares, built by the reward's own code; the verdict each
    should get: yes for a red square)."""
    from suzak.scoring.judge import judge_items, judge_settings

    rows = list(color.color_dataset(num_rows, seed, "aligned", 2 * settings["factor"]))
    items = judge_items(judge_settings(settings), [row["prompt"] for row in rows], [row["solution"] for row in rows],
                        None, {"image": [row["image"] for row in rows]})  # fmt: skip
    return items, ["yes" if row["solution"] == "red" else "no" for row in rows]


def colour_judge_items(num_rows: int, seed: int, settings: dict, tokenizer=None) -> tuple[list, list[str], list[str]]:
    """(the judge's question about ``num_rows`` red or blue squares, each with a candidate answer, built by the
    reward's own code; the verdict each should get; each square's colour). The candidates: a colour word at random,
    or for half the rows with ``tokenizer`` one or two of its tokens at random (a colour word among them at times),
    which a policy samples before it learns to answer; the verdict is yes only for the square's colour word alone."""
    from suzak.scoring.judge import judge_items, judge_settings

    rows = list(color.color_dataset(num_rows, seed, "aligned", 2 * settings["factor"]))
    rng = random.Random(seed)
    words = [_candidate(rng, tokenizer) for _ in rows]
    items = judge_items(judge_settings(settings), [row["prompt"] for row in rows], words, None,
                        {JUDGE_IMAGE: [row["image"] for row in rows]})  # fmt: skip
    colours = [row["solution"] for row in rows]
    verdicts = ["yes" if word.strip() == colour else "no" for word, colour in zip(words, colours, strict=True)]
    keep = [i for i, item in enumerate(items) if item is not None]  # a blank candidate is not asked (it scores 0)
    return [items[i] for i in keep], [verdicts[i] for i in keep], [colours[i] for i in keep]


def _candidate(rng: random.Random, tokenizer) -> str:
    """A colour word, or (with ``tokenizer``, half the time) one or two tokens drawn from its vocabulary: a colour
    word and any token, or any tokens."""
    from suzak.data.colors import COLORS

    if tokenizer is None or rng.random() < 0.5:
        return rng.choice(sorted(COLORS))
    ids = [rng.randrange(tokenizer.vocab_size) for _ in range(rng.choice((1, 2)))]
    text = tokenizer.decode(ids, skip_special_tokens=True)
    return rng.choice(sorted(COLORS)) + text if rng.random() < 0.25 else text


def _train_judge(folder: Path, settings_for: Callable[[Path, int], dict], examples: Callable, heldout: Callable,
                 name: str, steps: int, seed: int, for_vllm: bool) -> tuple[Path, float]:  # fmt: skip
    """The tiny :data:`JUDGE_FAMILY` model taught by ``steps`` SFT steps of 32 of ``examples(settings, n, seed)``'s
    (items, replies) (TRL's SFTTrainer, completion-only loss, lr 3e-3), saved with its processor in ``folder /
    "judge"``; returns (that folder, its accuracy on ``heldout(settings, n, seed)``'s (items, verdicts), asked
    through the reward's local judge and scored as the reward scores: above one half is a yes)."""
    import datasets
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor
    from trl import SFTConfig, SFTTrainer

    from suzak.media.vision import PixelBudget, configure_processor, patch_factor
    from suzak.models.tiny import TinyConfig, build_tiny_model
    from suzak.scoring.judge import LocalJudge, judge_settings, score_reply
    from suzak.selftest.report import quiet_progress
    from suzak.trl_internals.precision import score_labelled_positions_only

    folder = Path(folder)
    model_dir = build_tiny_model(
        folder / "tiny", TinyConfig.shaped(JUDGE_FAMILY, for_vllm=for_vllm, extra_corpus=["yes no"] * 50)
    )
    torch.manual_seed(seed)
    processor = AutoProcessor.from_pretrained(model_dir)
    model = AutoModelForImageTextToText.from_pretrained(model_dir)
    settings = settings_for(folder / "judge", patch_factor(processor))
    budget = PixelBudget(settings["min_pixels"], settings["max_pixels"]).for_model(processor)
    configure_processor(processor, budget)
    tokenizer = processor.tokenizer
    items, replies = examples(settings, steps * 32, seed + 30_000, tokenizer)
    rows = [{"prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": item.text}]}],
             "image": budget.fit(item.image), "completion": [{"role": "assistant", "content": reply}]}
            for item, reply in zip(items, replies, strict=True)]  # fmt: skip
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
    questions, truth = heldout(settings, 128, seed + 40_000, tokenizer)
    parsed = judge_settings(settings)
    answers = asyncio.run(LocalJudge(parsed).ask(questions))
    scores = [None if isinstance(reply, Exception) else score_reply(parsed, reply) for reply in answers]
    said = ["yes" if score is not None and score > 0.5 else "no" for score in scores]
    accuracy = sum(a == b for a, b in zip(said, truth, strict=True)) / len(truth)
    losses = [round(entry["loss"], 3) for entry in trainer.state.log_history if "loss" in entry]
    logger.info("%s judge: %d SFT steps (loss every 10: %s), accuracy %.3f on %d unseen squares", name, steps, losses,
                accuracy, len(truth))  # fmt: skip
    return saved, accuracy


def train_picture_judge(folder: Path, steps: int = 60, seed: int = 0, for_vllm: bool = False) -> tuple[Path, float]:
    """The tiny model taught to answer :data:`QUESTION` (yes for a red square), in ``folder / "judge"``; returns (that
    folder, its accuracy on 128 unseen squares: P(yes) above one half); ``for_vllm``: the tiny model's shape vLLM's CPU
    build serves (head_dim 32)."""

    def examples(settings: dict, num_rows: int, seed: int, tokenizer) -> tuple[list, list[str]]:
        return picture_judge_items(num_rows, seed, settings)

    return _train_judge(folder, picture_judge_settings, examples, examples, "picture", steps, seed, for_vllm)


def train_colour_judge(folder: Path, steps: int = JUDGE_STEPS, seed: int = 0, for_vllm: bool = False,
                       learning_rate: float = 3e-3) -> tuple[Path, float]:  # fmt: skip
    """The tiny model taught to answer :data:`COLOUR_QUESTION` about a square and a colour word, naming the square's
    colour first ("red: yes", "blue: no"), in ``folder / "judge"``; returns (that folder, its accuracy on 128 unseen
    squares and words, scored as the reward scores its replies)."""

    def examples(settings: dict, num_rows: int, seed: int, tokenizer) -> tuple[list, list[str]]:
        items, verdicts, colours = colour_judge_items(num_rows, seed, settings, tokenizer)
        return items, [f"{colour} {verdict}" for colour, verdict in zip(colours, verdicts, strict=True)]

    def heldout(settings: dict, num_rows: int, seed: int, tokenizer) -> tuple[list, list[str]]:
        return colour_judge_items(num_rows, seed, settings, tokenizer)[:2]

    return _train_judge(folder, colour_judge_settings, examples, heldout, "colour", steps, seed, for_vllm)


# --- the task -----------------------------------------------------------------------------------------------------


def judge_task_dataset(num_rows: int, seed: int, images: str = "aligned", size: int | None = None):
    """The colour task's rows {prompt, image, solution} with :data:`JUDGE_IMAGE`, the picture the judge sees: each
    row's own square, or with ``images`` :data:`CONTROL` a grey square (jittered as the squares are) in its place.

    >>> rows = judge_task_dataset(4, seed=0, images=CONTROL)
    >>> rows[0]["image"] == judge_task_dataset(4, seed=0)[0]["image"], rows[0][JUDGE_IMAGE].getpixel((0, 0))
    (True, (108, 123, 122))
    """
    if images not in ("aligned", CONTROL):
        raise ValueError(f"images must be aligned or {CONTROL}, got {images!r}")
    import datasets

    rows = list(color.color_dataset(num_rows, seed, "aligned", size))
    grey = color.color_dataset(num_rows, seed + 50_000, "grey", size)["image"] if images == CONTROL else None
    return datasets.Dataset.from_list([row | {JUDGE_IMAGE: row["image"] if grey is None else grey[i]}
                                       for i, row in enumerate(rows)])  # fmt: skip


def prepare(config: SelfTestConfig, tmp: Path) -> tuple[SelfTestConfig, dict, dict[str, bool]]:
    """The conditions' judge: ``config.judge``'s folder, or the colour judge trained here first (~15 s); returns
    (the config naming it, the report's ``judge`` entry, its bar: ``{name: (accuracy on unseen squares, JUDGE_BAR)}``)."""
    if config.judge is not None:
        return config, {"folder": config.judge, "accuracy": None, "sft_steps": 0}, {}
    logger.info("the judge: %d SFT steps of the tiny colour judge", JUDGE_STEPS)
    folder, accuracy = train_colour_judge(tmp / "judge", seed=config.seed)
    entry = {"folder": None, "accuracy": accuracy, "sft_steps": JUDGE_STEPS, "needs": f">= {JUDGE_BAR:g}"}
    return dataclasses.replace(config, judge=str(folder)), entry, {"judge_accuracy": (accuracy, JUDGE_BAR)}


def datasets(config: SelfTestConfig, images: str, cache_dir: Path, factor: int):
    size = config.spec.image_size(factor)[0]
    return (judge_task_dataset(config.rows, config.seed, images, size),
            color.color_dataset(config.heldout_rows, config.seed + 10_000, "aligned", size))  # fmt: skip


def rewards(config: SelfTestConfig, tokenizer) -> tuple[list, list[float] | None, str]:
    """The judge (weight 1, the only reward), and the colour task's first-token reward logged at weight 0: the figure
    the bars read."""
    from suzak.media.vision import family_factors
    from suzak.scoring.rewards import resolve_reward

    if config.judge is None:
        raise ValueError("the judge task's rewards need config.judge, the judge's folder (prepare trains one)")
    judge = resolve_reward("judge", colour_judge_settings(config.judge, family_factors()[JUDGE_FAMILY]))
    return [judge, color.first_token_reward(color.answer_ids(tokenizer))], [1.0, 0.0], \
        "rewards/color_first_token/mean"  # fmt: skip


def score(config: SelfTestConfig, outputs: list[str], rows: list[dict]) -> list[float]:
    return color.first_word_scores(outputs, rows)


def prior(config, condition, model, processor, budget, video_budget, crops, output_dir) -> None:
    """The colour task's answer prior (a colour word at random to grey squares)."""
    color.prior(config, condition, model, processor, budget, video_budget, crops, output_dir)
