"""What a self-test task is: its measured settings (:class:`TaskSpec`) and the names its conditions go by.

Each task module (:mod:`~suzak.selftest.color`, :mod:`~suzak.selftest.counting`, :mod:`~suzak.selftest.video`,
:mod:`~suzak.selftest.grounding`, :mod:`~suzak.selftest.zoom`) holds its ``SPEC`` and the four things that differ
between tasks (:class:`Task`), and registers them here (:func:`register`; the package imports every task module).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import TYPE_CHECKING, Protocol

from suzak.models.tiny import DEFAULT_FAMILY, FAMILIES, MOE, TEXT

if TYPE_CHECKING:
    from pathlib import Path

    from suzak.media.video import VideoBudget
    from suzak.media.vision import PixelBudget

__all__ = ["NO_TOOL", "SELFTEST_FAMILIES", "TASKS", "VIDEO_FPS", "Task", "TaskSpec", "register", "task_module"]

# the families whose schedules docs/selftest.md measured (the self-test proves learning through images: VL only)
SELFTEST_FAMILIES = [f for f in FAMILIES if f not in MOE + TEXT]

NO_TOOL = "no_tool"  # the zoom task's control: the same images, no tools (its prior: a colour word at random)

VIDEO_FPS = 4.0  # the video task's clips, read whole (every frame) by its video budget


@dataclass(frozen=True)
class TaskSpec:
    """What one self-test task trains with and what PASS needs; measured settings are in docs/selftest.md."""

    steps: int
    learning_rate: float
    image_tokens: tuple[int, int]  # (width, height) in visual tokens; the pixel budget is exactly the image's area
    max_completion_length: int
    chance: float
    pass_at: float  # the aligned run's mean reward over its last 10 steps must reach this
    control_band: tuple[float, float]  # a control run's must stay inside this
    prior_steps: int = 0  # SFT steps that give the random-init model a pretrained model's answer prior
    lr_scheduler_type: str = "constant"
    families: dict[str, dict] = field(default_factory=dict)  # family -> the fields measured otherwise for its model
    video_frames: int = 0  # a video task: frames per clip, each image_tokens in size
    group: tuple[int, int] = (16, 8)  # (prompts, completions of each) per step: 128 completions a step
    prior_lr: float = 1e-3  # the answer prior's SFT learning rate
    beta: float = 0.0  # GRPO's KL to the reference model, which is the policy after the prior (saved and reloaded)
    image_scale: int = 1  # images drawn this many times larger per side than image_tokens (the budget shrinks them)
    vllm_shape: bool = False  # the tiny model shaped as vLLM's CPU build runs it (head_dim 32) with HF generation too
    temperature: float = 1.0  # GRPO's sampling temperature
    prior_schedule: str = "constant"  # the prior's learning-rate schedule
    tools: tuple[str, ...] = ()  # the aligned run's tools (suzak.models.tools.resolve_tools); its control has none
    control_tools: tuple[str, ...] = ()  # the control's own tools where it has some (episodes: the blank screens')
    tool_rounds: int = 1  # TRL's max_tool_calling_iterations (an episode's actions)
    control: str = "shuffled"  # the control condition: shuffled (or grey) images, or no_tool (same images, no tools)
    rows: int | None = None  # training rows (None: SelfTestConfig.rows)
    tiny: dict[str, int] = field(default_factory=dict)  # the tiny model's sizes where the task's differ (TinyConfig)
    heldout_pass_at: float | None = None  # the aligned run's held-out greedy accuracy must reach this (None: no bar)
    heldout_control_below: float | None = None  # a control's held-out accuracy must stay below this (None: no bar)
    sources: tuple[str, ...] = ()  # a mixture's sources: every bar applies to each source's rows (condition/source)

    def for_family(self, family: str) -> TaskSpec:
        """The settings for the tiny model of ``family``: the task's, with the fields measured otherwise for it.

        >>> from suzak.selftest import TASKS
        >>> spec = TASKS["grounding"].for_family("qwen3_vl")
        >>> spec.group, spec.learning_rate, spec.beta, spec.tiny["vision_hidden_size"], spec.families
        ((32, 8), 0.002, 0.6, 128, {})
        >>> TASKS["grounding"].for_family("qwen2_5_vl").group
        (16, 8)
        """
        return replace(self, **self.families.get(family, {}), families={})

    def image_size(self, factor: int) -> tuple[int, int]:
        """(width, height) in pixels for a model with ``factor`` pixels per visual token along a side.

        >>> from suzak.selftest import TASKS
        >>> TASKS["color"].image_size(28), TASKS["counting"].image_size(32)
        ((56, 56), (64, 64))
        """
        return self.image_tokens[0] * factor, self.image_tokens[1] * factor

    def drawn_size(self, factor: int | None = None) -> tuple[int, int]:
        """(width, height) the task's images are drawn at (``image_scale`` times the budget's), for ``factor`` pixels
        per visual token (default: the default family's).

        >>> from suzak.selftest import TASKS
        >>> TASKS["color"].drawn_size(), TASKS["counting"].drawn_size(), TASKS["grounding"].drawn_size()
        ((56, 56), (56, 56), (112, 112))
        """
        from suzak.media.vision import family_factors

        width, height = self.image_size(factor or family_factors()[DEFAULT_FAMILY])
        return width * self.image_scale, height * self.image_scale


class Task(Protocol):
    """What a task module provides beside its ``SPEC`` (the runner, :mod:`suzak.selftest.runner`, calls these;
    ``config`` is the run's :class:`suzak.selftest.config.SelfTestConfig`)."""

    SPEC: TaskSpec

    def datasets(self, config, images: str, cache_dir: Path, factor: int):
        """(training rows of the ``images`` condition, held-out aligned rows never trained on), sized for ``factor``
        pixels per visual token."""

    def rewards(self, config, tokenizer) -> tuple[list, list[float] | None, str]:
        """(reward functions, their weights, the logged figure the report reads)."""

    def score(self, config, outputs: list[str], rows: list[dict]) -> list[float]:
        """Held-out scores of decoded greedy answers, by the same rules as the training reward."""

    def prior(self, config, condition: str, model, processor, budget: PixelBudget,
              video_budget: VideoBudget, crops: PixelBudget, output_dir: Path) -> None:  # fmt: skip
        """Train the ``condition``'s prior in place on ``model`` (a task without one does nothing)."""

    # optional: prepare(config, tmp) -> (config, report entry, {bar: (value, floor)}): work the conditions share, done
    # once before them (the judge task trains its judge and names it in the config; its bars join the verdicts)


# name -> the task's settings, in the order the package imports the task modules (--help lists them so)
TASKS: dict[str, TaskSpec] = {}
_MODULES: dict[str, str] = {}


def register(name: str, module: str, spec: TaskSpec) -> TaskSpec:
    """Make ``module`` (a task module's ``__name__``: a :class:`Task`) the task ``name`` with ``spec``; returns
    ``spec`` (a task module's ``SPEC = register(...)``)."""
    TASKS[name] = spec
    _MODULES[name] = module
    return spec


def task_module(name: str) -> ModuleType:
    """The module of the task ``name`` (:class:`Task`)."""
    return sys.modules[_MODULES[name]]
