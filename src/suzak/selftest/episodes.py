"""``--task episodes``: a two-action episode learnt through its screens (docs/episodes.md). The first screen shows a
door in one cell of a 2x2 grid; a click on it opens the next screen, the key in one cell drawn independently; a click
on the key wins (:mod:`suzak.data.doors`: reward 1, 0.5 for the door alone, 0 for a missed door). Multi-turn GRPO
rewarded only by the environment (TRL's ``get_reward``), both conditions with the same tool and prior: the control
(``blank``) opens the same door onto a blank screen, so its second click can only guess the key (at most
0.5 + 0.5/4 = 0.625 on average), and the aligned run's held-out success (answered through the evaluation's tool loop)
must pass the best the control reached. The tiny tokenizer learns the family's tool format (:func:`episode_corpus`);
a prior teaches the calls at random cells first (:func:`episode_call_prior`)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np

from suzak import SuzakError
from suzak.selftest.priors import ToolTurns, tool_prior
from suzak.selftest.spec import TaskSpec, register

if TYPE_CHECKING:
    from pathlib import Path

    from suzak.media.vision import PixelBudget
    from suzak.selftest.config import SelfTestConfig

__all__ = ["BLANK", "SPEC", "click_turn", "episode_call_prior", "episode_corpus"]

logger = logging.getLogger(__name__)

BLANK = "blank"  # the control: the same door opens onto a blank screen
DOORS = "suzak.data.doors.DoorsEnvironment"
BLANK_DOORS = "suzak.data.doors.BlankDoorsEnvironment"

# One-token screens drawn 4x larger (the grounding task's shape: each cell one of the token's 2x2 patches, which the
# merger keeps apart); the screens after the first at the same budget, so both clicks are in one frame.
# NOT YET PASSING (docs/episodes.md, "Status"): seed 0, Qwen2.5-VL, 200 steps, the aligned run stayed at chance on
# these settings (reward 0.06-0.15 a step against 0.16) and on 2x2-token screens (one cell a token: 0.06-0.17); the
# first calls well formed in ~0.7 of rollouts at step 1 and ~0.88 by step 100, but the first click does not learn
# the door. The training pass is exact; after the prior the first call's log-probabilities move by <= 9e-5 when the
# screen is replaced by noise (grounding's answers: 8e-4), and six GRPO variants stayed at a door rate of 0.23-0.27
# for 100-150 steps (docs/episodes.md, "Status", has each). A policy-gradient loop outside TRL and the environment,
# from the same prior, stays at chance for 200 steps too, where supervised clicks learn the door after a 45-65-step
# plateau; without the tools' system turn it leaves chance at step ~220: the cause is the optimisation's speed.
SPEC = register("episodes", __name__, TaskSpec(
    200, 1e-3, (1, 1), 160, 0.16, 0.85, (0.0, 0.7), prior_steps=200, prior_lr=3e-3, beta=0.3, vllm_shape=True,
    image_scale=4,
    temperature=1.0, prior_schedule="cosine", lr_scheduler_type="cosine", tools=(DOORS,), control=BLANK,
    control_tools=(BLANK_DOORS,), tool_rounds=2, group=(8, 8), rows=1200, heldout_pass_at=0.7,
    heldout_control_below=0.45,
))  # fmt: skip


def _cell_click(cell: int, side: int, frame) -> tuple[int, int]:
    """The model's point for a click on ``cell`` of a ``side``-pixel screen seen in ``frame``."""
    from suzak.data.doors import cell_box

    return frame.click_point(cell_box(cell, side))


def episode_corpus(family: str, repeats: int = 4) -> list[str]:
    """Text the task's tiny tokenizer also learns from: door-and-key episodes as the family's tool template renders
    them (the tools' system turn, two calls, their tool turns, the end), as a pretrained tokenizer knows its own
    template.

    >>> texts = episode_corpus("qwen2_5_vl", repeats=1)
    >>> len(texts), '"name": "click"' in texts[0] and "<tool_response>" in texts[0]
    (4, True)
    """
    from transformers.utils import get_json_schema

    from suzak.data.doors import CELLS, INSTRUCTION, DoorsEnvironment
    from suzak.media.boxes import BoxFrame
    from suzak.media.vision import PixelBudget, family_factors
    from suzak.models.tiny import TinyConfig, build_tokenizer
    from suzak.models.tool_calling import prepare_tool_calling

    tokenizer = build_tokenizer(TinyConfig.shaped(family))
    prepare_tool_calling(tokenizer, family)
    tools = [get_json_schema(DoorsEnvironment.bound_to(PixelBudget(factor=family_factors()[family]))().click)]
    factor = family_factors()[family]
    frame = BoxFrame.of(family, 4 * factor, 4 * factor, PixelBudget(factor * factor, factor * factor, factor=factor))
    points = [_cell_click(cell, 4 * factor, frame) for cell in range(CELLS)]  # the task's screens' clicks
    texts = []
    for cell in range(CELLS):
        first, second = points[cell], points[(cell + 1) % CELLS]
        turns = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": INSTRUCTION}]}]
        for x, y in (first, second):
            call = {"type": "function", "function": {"name": "click", "arguments": {"x": x, "y": y}}}
            turns += [{"role": "assistant", "content": "", "tool_calls": [call]},
                      {"role": "tool", "name": "click", "content": [{"type": "image"}]}]  # fmt: skip
        turns[-1] = {"role": "tool", "name": "click", "content": "The episode is over: success (reward 1)."}
        turns.append({"role": "assistant", "content": "Done."})
        texts.append(tokenizer.apply_chat_template(turns, tools=tools, tokenize=False))
    return texts * repeats


def episode_call_prior(model, processor, budget: PixelBudget, environment: type, rows: list[dict], steps: int,
                       output_dir: Path, *, batch_size: int = 32, learning_rate: float = 3e-3,
                       lr_scheduler_type: str = "constant", seed: int = 0) -> None:  # fmt: skip
    """SFT steps (TRL's SFTTrainer, fp32) that teach ``model`` the episode's turns with clicks on cells drawn at
    random (nothing about where the door or the key is): the first click after the first screen, the second after
    the screen the ``environment`` shows next (the key's, or the control's blank one), "Done." after the end. Each
    row is one of the three turns, in turn."""
    from transformers.utils import get_json_schema

    from suzak.data.doors import CELLS
    from suzak.media.boxes import BOX_FRAME_COLUMN, BoxFrame, with_box_frame

    family = model.config.model_type
    turns = ToolTurns(processor, [get_json_schema(environment.bound_to(budget)().click)], "episode prior")
    rng = np.random.default_rng(seed)
    for i, row in enumerate(rows):
        framed = with_box_frame(row, family, budget)
        frame = BoxFrame.from_dict(framed[BOX_FRAME_COLUMN])
        side = row["image"].width
        clicks = [click_turn(_cell_click(int(cell), side, frame)) for cell in rng.integers(0, CELLS, 2)]
        env = environment.bound_to(budget, max_steps=2)()
        env.reset(**framed)
        turn = i % 3
        messages, images = list(framed["prompt"]), [budget.fit(row["image"])]
        if turn >= 1:  # the door opened (the screen after it is the condition's: the key's, or blank)
            door = _cell_click(int(row["door"]), side, frame)
            images.append(env.click(*door)[0]["image"])
            messages += [click_turn(door), {"role": "tool", "name": "click", "content": [{"type": "image"}]}]
        if turn == 2:
            x, y = clicks[1]["tool_calls"][0]["function"]["arguments"].values()
            messages += [clicks[1], {"role": "tool", "name": "click", "content": env.click(x, y)}]
        completion = {"role": "assistant", "content": "Done."} if turn == 2 else clicks[turn]
        turns.add(messages, completion, images)
    tool_prior(model, processor, turns.rows, steps, output_dir, batch_size=batch_size, learning_rate=learning_rate,
               lr_scheduler_type=lr_scheduler_type, seed=seed)  # fmt: skip


def click_turn(point: tuple[int, int]) -> dict:
    """An assistant turn calling ``click`` at ``point``."""
    return {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "click", "arguments": {"x": point[0], "y": point[1]}}}]}  # fmt: skip


def corpus(family: str) -> list[str]:
    """The task's text for the tiny tokenizer (the runner's hook)."""
    return episode_corpus(family)


def datasets(config: SelfTestConfig, images: str, cache_dir: Path, factor: int):
    """The same first screens for both conditions (the control differs in the screen its door opens onto)."""
    import datasets as hf_datasets

    from suzak.data.doors import doors_rows

    side = config.spec.image_tokens[0] * factor * config.spec.image_scale
    return (hf_datasets.Dataset.from_list(doors_rows(config.rows, config.seed, side)),
            hf_datasets.Dataset.from_list(doors_rows(config.heldout_rows, config.seed + 10_000, side)))  # fmt: skip


def rewards(config: SelfTestConfig, tokenizer) -> tuple[list, list[float] | None, str]:
    """None of the recipe's: the environment scores each episode (TRL's get_reward, weight 1)."""
    return [], None, "reward"


def score(config: SelfTestConfig, outputs: list[str], rows: list[dict]) -> list[float]:
    raise SuzakError("the episodes task is scored by its environment (the runner reads each episode's success)")


def prior(config, condition, model, processor, budget, video_budget, crops, output_dir, steps: int | None = None):
    """The calls at random cells (:func:`episode_call_prior`), with the screens of the condition's environment, for
    ``steps`` SFT steps (None: the task's ``prior_steps``)."""
    from suzak.data.doors import BlankDoorsEnvironment, DoorsEnvironment, doors_rows

    spec = config.spec
    environment = BlankDoorsEnvironment if condition == spec.control else DoorsEnvironment
    steps = spec.prior_steps if steps is None else steps
    logger.info("%s run: call prior (%d SFT steps, clicks at random cells)", condition, steps)
    rows = doors_rows(960, config.seed + 20_000, spec.image_tokens[0] * budget.factor * spec.image_scale)
    episode_call_prior(model, processor, budget, environment, rows, steps, output_dir,
                       learning_rate=spec.prior_lr, lr_scheduler_type=spec.prior_schedule, seed=config.seed)  # fmt: skip
