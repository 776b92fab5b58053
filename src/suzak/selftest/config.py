"""A self-test run's settings (:class:`SelfTestConfig`), its task's measured defaults filled in (``TASKS``)."""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from suzak.media.video import VideoBudget
from suzak.media.vision import PixelBudget
from suzak.models.tiny import DEFAULT_FAMILY
from suzak.selftest.spec import SELFTEST_FAMILIES, TASKS, VIDEO_FPS, TaskSpec, task_module

__all__ = ["TASKS", "SelfTestConfig"]


@dataclass
class SelfTestConfig:
    """Run settings; ``steps`` and ``learning_rate`` left at None take the task's measured defaults for the family
    (``TASKS``, :meth:`TaskSpec.for_family`)."""

    task: str = "color"
    family: str = DEFAULT_FAMILY  # the tiny model's (suzak.models.tiny.FAMILIES)
    seed: int = 0
    steps: int | None = None
    learning_rate: float | None = None
    rows: int | None = None  # None: the task's (TaskSpec.rows), else 2000
    heldout_rows: int = 200
    prompts_per_step: int | None = None  # None: the task's (TaskSpec.group)
    generations: int | None = None
    temperature: float | None = None  # None: the task's (TaskSpec.temperature)
    loss_type: str = "dapo"
    device: str = "cpu"
    vllm: bool = False  # training generates with vLLM colocated (each run in its own process), on the GPU or CPU
    prior_cache: str | None = (
        None  # a folder of priors kept by their key (priors.prior_key); None: each run trains its own
    )
    judge: str | None = None  # the judge task's judge, a local model folder; None: the colour judge trained first

    def __post_init__(self):
        if self.task not in TASKS:
            raise ValueError(f"unknown self-test task {self.task!r}; known: {', '.join(TASKS)}")
        if self.family not in SELFTEST_FAMILIES:
            raise ValueError(
                f"unknown model family {self.family!r}; known: {', '.join(SELFTEST_FAMILIES)} (the tiny "
                "MoE model is for LoRA-target tests: its schedule is not measured)"
            )
        self.steps = self.spec.steps if self.steps is None else self.steps
        self.learning_rate = self.spec.learning_rate if self.learning_rate is None else self.learning_rate
        self.temperature = self.spec.temperature if self.temperature is None else self.temperature
        self.rows = (self.spec.rows or 2000) if self.rows is None else self.rows
        prompts, generations = self.spec.group
        self.prompts_per_step = prompts if self.prompts_per_step is None else self.prompts_per_step
        self.generations = generations if self.generations is None else self.generations

    @property
    def spec(self) -> TaskSpec:
        """The task's settings for the run's family (:meth:`TaskSpec.for_family`)."""
        return TASKS[self.task].for_family(self.family)

    @property
    def task_module(self) -> ModuleType:
        """The task's module (:class:`suzak.selftest.spec.Task`)."""
        return task_module(self.task)

    def budgets(self, processor) -> tuple[PixelBudget, VideoBudget]:
        """The task's image budget (its images' exact size on ``processor``'s patch grid) and video budget (its
        frames at that size)."""
        from suzak.media.vision import patch_factor

        width, height = self.spec.image_size(patch_factor(processor))
        budget = PixelBudget(width * height, width * height).for_model(processor)
        frames = self.spec.video_frames or 4
        video_budget = VideoBudget(fps=VIDEO_FPS, min_frames=frames, max_frames=frames, min_pixels=width * height,
                                   max_pixels=width * height)  # fmt: skip
        return budget, video_budget
