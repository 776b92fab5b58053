"""``--task zoom``: thinking with images (docs/tools.md). "What colour are the checks in [box]?" over 448-pixel images
seen at 4x4 tokens, where the square checked in two colours that average to grey is grey (:mod:`suzak.data.zoom`);
the policy may call the zoom, whose crop of the original (4x4 tokens too) shows the checks. Multi-turn GRPO with the
registry's ``word_match``; the tiny tokenizer also learns the family's tool format (:func:`zoom_corpus`); a call
prior first (:func:`zoom_call_prior`). The control (``no_tool``) answers the same images without the tool: the whole
view cannot tell the colours apart, so it stays at chance, and the aligned run's held-out accuracy (answered through
the evaluation's tool loop) must pass the best it reached."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

import numpy as np

from suzak.media.vision import PixelBudget, family_factors
from suzak.selftest.priors import ToolTurns, answer_rows, sft_prior, tool_prior
from suzak.selftest.spec import NO_TOOL, TaskSpec, register

if TYPE_CHECKING:
    from pathlib import Path

    from suzak.selftest.config import SelfTestConfig

__all__ = ["PRIOR_ROWS", "SLOTS", "SPEC", "small_zoom_prior", "zoom_call_prior", "zoom_corpus", "zoom_dataset"]

logger = logging.getLogger(__name__)

SLOTS = 4  # places of the checked square (the four central cells of its 4x4 grid)
PRIOR_ROWS = 1280  # distinct grey rows of the priors (448-pixel images: held in memory at once)

# 448-pixel images seen at 4x4 tokens, where the checked square is grey; the zoom's crop of it (4x4 tokens, the same
# budget) shows the checks. The prior teaches the call (300 SFT steps, cosine) and a colour at random after a grey
# crop; beta 0.3 keeps the calls; the control answers the same images without the tool, after a colour-word prior.
# Measured (docs/tools.md): 250 steps, since on an AVX-512 host 150 read the red checks and not yet the green and
# blue ones (0.58 over the last 10 steps, held-out 0.65; the AVX2 and Intel hosts: 0.77-0.95); at 250 the cosine
# schedule's rate stays up while the policy learns them: 0.975 and 0.983 there (seeds 0, 1; held-out 1.000), 0.97 on
# the Intel host. At 8x8 tokens the reward stayed at chance for ~110 steps; at constant lr the policy collapsed after
# step ~220, as counting does, so cosine.
SPEC = register("zoom", __name__, TaskSpec(
    250, 1e-3, (4, 4), 256, 1 / 3, 0.55, (0.2, 0.47), prior_steps=300, prior_lr=3e-3, image_scale=4, beta=0.3,
    vllm_shape=True, temperature=0.7, prior_schedule="cosine", lr_scheduler_type="cosine", tools=("zoom",),
    control=NO_TOOL, group=(8, 8), rows=1200, heldout_pass_at=0.6,
))  # fmt: skip


def zoom_dataset(num_rows: int, seed: int, images: str = "aligned", factor: int = 28, slots: int = 4, scale: int = 1,
                 tokens: int = 8):  # fmt: skip
    """Rows {prompt, image, solution, question_boxes} of the zoom task (:func:`suzak.data.zoom.zoom_checks`): images
    ``tokens`` visual tokens of ``factor`` pixels a side (drawn ``scale`` times larger), the checked square (a
    quarter of the side) in one of ``slots`` places."""
    from suzak.data.zoom import zoom_checks

    return zoom_checks(num_rows, seed=seed, images=images, side=tokens * factor * scale, slots=slots)


def zoom_corpus(family: str, repeats: int = 4) -> list[str]:
    """Text the zoom task's tiny tokenizer also learns from (``TinyConfig.extra_corpus``): zoom conversations as the
    family's tool template renders them (the tools' system turn, a call, a tool turn, an answer), as a pretrained
    tokenizer knows its own template. The default tiny vocabulary spells them out nearly letter by letter (the
    tools' system turn alone ~670 tokens, "zoom" four), which makes every step ~3x longer than it need be and the
    call's repeated letters hard to write ("zom", "bbbox").

    >>> texts = zoom_corpus("qwen2_5_vl", repeats=1)
    >>> len(texts), '"name": "zoom"' in texts[0] and "<tool_response>" in texts[0]
    (3, True)
    """
    from transformers.utils import get_json_schema

    from suzak.data.zoom import CHECKS, QUESTION
    from suzak.models.tiny import TinyConfig, build_tokenizer
    from suzak.models.tool_calling import prepare_tool_calling
    from suzak.models.tools import ZOOM, ZoomEnvironment

    tokenizer = build_tokenizer(TinyConfig.shaped(family))
    prepare_tool_calling(tokenizer, family)
    tools = [get_json_schema(ZoomEnvironment(PixelBudget(factor=family_factors()[family])).zoom)]
    texts = []
    for word, box in zip(CHECKS, ([56, 56, 112, 112], [250, 250, 500, 500], [112, 56, 168, 112]), strict=True):
        user = {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION.format(box=box)}]}
        call = {"type": "function", "function": {"name": ZOOM, "arguments": {"bbox_2d": box}}}
        turns = [
            user,
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "name": ZOOM, "content": [{"type": "image"}]},
            {"role": "assistant", "content": word},
        ]
        texts.append(tokenizer.apply_chat_template(turns, tools=tools, tokenize=False))  # fmt: skip
    return texts * repeats


def small_zoom_prior(folder: Path, tiny=None, steps: int = 80):
    """(model, processor, budget): a tiny Qwen2.5-VL (``tiny``, a :class:`~suzak.models.tiny.TinyConfig`; default the
    default tiny model) taught the zoom call on the question's box of 224-pixel zoom rows seen at 2x2 tokens (one
    place, ``steps`` SFT steps: its rollouts then call the zoom), built under ``folder``; the tests' and the tool-turn
    bench's model with a call, the processor set up for tool calls at that budget."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from suzak.media.vision import configure_processor
    from suzak.models.tiny import build_tiny_model
    from suzak.models.tool_calling import prepare_tool_calling

    model_dir = build_tiny_model(folder / "tiny", tiny)
    torch.manual_seed(0)
    processor = AutoProcessor.from_pretrained(model_dir)
    model = AutoModelForImageTextToText.from_pretrained(model_dir)
    prepare_tool_calling(processor, model.config.model_type)
    budget = PixelBudget(3136, 3136).for_model(processor)
    configure_processor(processor, budget)
    zoom_call_prior(model, processor, budget, list(zoom_dataset(64, 1, "grey", budget.factor, slots=1)), steps, folder)
    return model, processor, budget


def zoom_call_prior(model, processor, budget: PixelBudget, rows: list[dict], steps: int, output_dir: Path, *,
                    crops: PixelBudget | None = None, answers: bool = False, batch_size: int = 4,
                    learning_rate: float = 3e-3, lr_scheduler_type: str = "constant", seed: int = 0) -> None:  # fmt: skip
    """SFT steps (TRL's SFTTrainer, fp32) that teach ``model`` the zoom call on each row's question box, in its
    family's frame and call form: a pretrained model's habit of calling a tool it is offered, nothing about the
    answer. With ``answers`` every other row is the turn after the call instead: the crop (of these grey rows: grey,
    at the ``crops`` budget) and a colour word picked at random, the habit of answering once it has looked.

    Prompts are rendered text with the tools' schemas (TRL's SFT collator for VL models passes no ``tools`` to the
    template), the row's image fitted to ``budget`` and the crop as the images; the processor must already carry the
    tool template (:func:`suzak.models.tool_calling.prepare_tool_calling`)."""
    from transformers.utils import get_json_schema

    from suzak.data.zoom import CHECKS
    from suzak.media.boxes import model_answer, with_box_frame
    from suzak.models.tools import ZOOM, ZoomEnvironment, with_original_image

    zoom = ZoomEnvironment(crops or budget)
    turns = ToolTurns(processor, [get_json_schema(zoom.zoom)], "zoom prior")
    words = np.random.default_rng(seed).choice(sorted(CHECKS), len(rows))
    for i, row in enumerate(rows):
        framed = with_box_frame(row, model.config.model_type, budget)
        box = json.loads(model_answer({**framed, "solution": json.dumps(row["question_boxes"][0])}))["bbox_2d"]
        call = {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": ZOOM, "arguments": {"bbox_2d": box}}}]}  # fmt: skip
        if not answers or i % 2 == 0:
            turns.add(framed["prompt"], call, [budget.fit(row["image"])])
            continue
        zoom.reset(**with_original_image(framed))
        crop = zoom.zoom(box)[0]["image"]
        looked = [*framed["prompt"], call, {"role": "tool", "name": ZOOM, "content": [{"type": "image"}]}]
        turns.add(looked, {"role": "assistant", "content": str(words[i])}, [budget.fit(row["image"]), crop])
    tool_prior(model, processor, turns.rows, steps, output_dir, batch_size=batch_size, learning_rate=learning_rate,
               lr_scheduler_type=lr_scheduler_type, seed=seed)


def datasets(config: SelfTestConfig, images: str, cache_dir: Path, factor: int):
    """The same images for both conditions (the control, no_tool, differs in its tools, not its images)."""
    spec = config.spec
    shape = (factor, SLOTS, spec.image_scale, spec.image_tokens[0])
    return (zoom_dataset(config.rows, config.seed, "aligned", *shape),
            zoom_dataset(config.heldout_rows, config.seed + 10_000, "aligned", *shape))  # fmt: skip


def rewards(config: SelfTestConfig, tokenizer) -> tuple[list, list[float] | None, str]:
    from suzak.scoring.rewards import resolve_reward

    return [resolve_reward("word_match")], None, "reward"  # the one-word reward on the answer after the last tool turn


def score(config: SelfTestConfig, outputs: list[str], rows: list[dict]) -> list[float]:
    from suzak.scoring.rewards import word_match

    return word_match(outputs, [row["solution"] for row in rows])


def prior_rows(config: SelfTestConfig, budget: PixelBudget) -> list[dict]:
    """The grey rows of both priors (:data:`PRIOR_ROWS` of them, cycled over the prior's steps)."""
    spec = config.spec
    return list(zoom_dataset(PRIOR_ROWS, config.seed + 20_000, "grey", budget.factor, SLOTS, spec.image_scale,
                             spec.image_tokens[0]))  # fmt: skip


def prior(config, condition, model, processor, budget, video_budget, crops, output_dir) -> None:
    """With the tool (:func:`zoom_call_prior`): the call, and a random colour after a grey crop; without it (the
    control): a random colour word to the grey rows (:func:`suzak.selftest.priors.sft_prior`)."""
    from suzak.data.zoom import CHECKS

    spec = config.spec
    tool = condition != spec.control
    logger.info("%s run: %s prior (%d SFT steps on grey squares)", condition, "call" if tool else "answer",
                spec.prior_steps)  # fmt: skip
    rows = prior_rows(config, budget)
    if tool:
        zoom_call_prior(model, processor, budget, rows, spec.prior_steps, output_dir, crops=crops, answers=True,
                        batch_size=32, learning_rate=spec.prior_lr, lr_scheduler_type=spec.prior_schedule,
                        seed=config.seed)  # fmt: skip
        return
    words = np.random.default_rng(config.seed + 20_000).choice(sorted(CHECKS), PRIOR_ROWS)
    fitted = [row | {"image": budget.fit(row["image"])} for row in rows]
    sft_prior(config, answer_rows(fitted, words), model, processor, budget, output_dir)
