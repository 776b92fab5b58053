"""Episodes: environments whose actions change a screen, each action answered with the next screenshot (GUI agents).

A GRPO rollout of an episode is TRL 1.16's multi-turn tool loop (``environment_factory``, as the zoom's): the row's
image is the first screen; each tool call (``click(x, y)``, ``type_text(text)``, ``press_key(key)``,
``scroll(x, y, direction)``) acts on the environment and its answer is the next screen, fitted to the tool budget
(``tool_max_pixels``), as the image of the next turn; the environment's reward at the end of the episode reaches
GRPO beside the recipe's rewards (TRL's ``get_reward``, logged under the environment's class name). An episode ends on
success, on failure, at ``max_steps`` actions, or when its screens would pass ``max_visual_tokens``.

The contract of one's own environment (docs/episodes.md): a subclass of :class:`ScreenEnvironment` with the action
mixins it takes (:class:`Clicks`, :class:`Types`, :class:`Keys`, :class:`Scrolls`: TRL offers the model every public
method as a tool) and three private hooks:

- ``_start(row) -> Image``: begin the row's episode and return its first screen, the row's own image (a dataset row is
  (task, seed); the screen the environment starts on must be the picture the model was shown, else the episode counts
  as ``diverged``);
- ``_perform(action: Action) -> None``: apply one action (its point already in the screen's pixels); raise
  :class:`suzak.models.tools.ToolError` for one it refuses (the model reads the message), :class:`EpisodeCrashed`
  when the environment itself failed (the episode ends, counted);
- ``_outcome() -> Outcome``: whether the episode is over and its reward so far (1 success, 0 failure, partial
  progress between), and ``_screen() -> Image``: the current screen (None once the episode is over, where the
  environment shows nothing after its end).

Coordinates are **in the model's frame of the screen it saw last** (:mod:`suzak.media.boxes`: relative 0-1000 for
Qwen2-VL, Qwen3-VL and Qwen3.5, the resized image's pixels for Qwen2.5-VL), mapped back to the screen's pixels here.

>>> from suzak.media.vision import PixelBudget
>>> from suzak.media.boxes import BoxFrame
>>> class Lamp(ScreenEnvironment, Clicks):  # one click on the lamp's half lights it
...     def _start(self, row):
...         self.lit = False
...         return Image.new("RGB", (200, 100))
...     def _perform(self, action):
...         self.lit = action.x < 100
...     def _outcome(self):
...         return Outcome(done=self.lit, reward=float(self.lit))
...     def _screen(self):
...         return Image.new("RGB", (200, 100), "yellow" if self.lit else "black")
>>> lamp = Lamp(PixelBudget(3136, 12544, factor=28), max_steps=2)
>>> frame = BoxFrame.of("qwen2_vl", 200, 100, PixelBudget(3136, 50176, factor=28))
>>> lamp.reset(image=Image.new("RGB", (200, 100)), box_frame=frame.as_dict())
>>> lamp.click(750, 500)[0]["image"].size  # the right half: nothing; the next screen, at the tool budget
(140, 56)
>>> lamp.click(250, 500), lamp.get_reward(), [step.point for step in lamp.steps]
('The episode is over: success (reward 1).', 1.0, [(150.0, 50.0), (50.0, 50.0)])
>>> lamp.click(250, 500)
Traceback (most recent call last):
...
suzak.models.tools.ToolError: click: the episode is over; answer without another action
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from PIL import Image

from suzak import SuzakError
from suzak.media.boxes import BOX_FRAME_COLUMN, BoxFrame, box_numbers
from suzak.media.vision import PixelBudget, images_of
from suzak.models.tools import ORIGINAL_IMAGE_COLUMN, ToolError, image_turn_tokens
from suzak.scoring.prompts import question_text

__all__ = [
    "ACTIONS",
    "DEFAULT_MAX_STEPS",
    "EPISODE_PROBLEMS",
    "Action",
    "Clicks",
    "EpisodeCrashed",
    "EpisodeFactory",
    "Keys",
    "Outcome",
    "ScreenEnvironment",
    "Scrolls",
    "Step",
    "Types",
    "episode_columns",
]

logger = logging.getLogger(__name__)

ACTIONS = ("click", "type_text", "press_key", "scroll")
DEFAULT_MAX_STEPS = 8  # an episode's actions when the run sets no max_tool_calling_iterations
SCROLL_DIRECTIONS = ("up", "down")
_said = {"diverged": False}  # warnings given once a process
# Why an action failed or an episode ended early, the keys of ScreenEnvironment.problems (tools/episode_<reason>).
EPISODE_PROBLEMS = ("unparsable", "out_of_range", "refused", "over", "step_cap", "budget", "crashed", "diverged")


class EpisodeCrashed(RuntimeError):
    """The environment itself failed (a browser that died or hung): the episode ends with its reward so far."""


@dataclass(frozen=True)
class Action:
    """One action: ``kind`` (one of :data:`ACTIONS`), its point in the **screen's pixels** (floats), its text (typed,
    or the key's name) and a scroll's direction."""

    kind: str
    x: float | None = None
    y: float | None = None
    text: str | None = None
    direction: str | None = None


@dataclass(frozen=True)
class Outcome:
    """Where an episode stands: ``done`` (success, failure), ``reward`` so far (0-1), ``success``."""

    done: bool
    reward: float
    success: bool | None = None


@dataclass
class Step:
    """One action of an episode as it happened: the action, the model's point (its frame) and the screen's (pixels),
    the screen it acted on (original pixels), what came of it (``problem``, a :data:`EPISODE_PROBLEMS` reason, or
    None)."""

    kind: str
    screen: Image.Image
    model_point: tuple[float, float] | None = None
    point: tuple[float, float] | None = None
    text: str | None = None
    problem: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "model_point": self.model_point, "point": self.point, "text": self.text,
                "problem": self.problem}  # fmt: skip


class ScreenEnvironment(ABC):
    """One rollout's episode (TRL's ``environment_factory`` protocol: ``reset(**row)``, ``get_reward()``, one public
    method per action). ``budget``: the pixel budget of each new screen (bound to the model's patch factor: min
    pixels as training's, max pixels ``tool_max_pixels``); ``max_steps``: the actions an episode may take;
    ``max_visual_tokens``: the visual tokens of all its new screens (None: no cap).

    ``steps`` (:class:`Step`), ``problems`` (a Counter of :data:`EPISODE_PROBLEMS`), ``visual_tokens``, ``outcome`` and
    ``final_screen`` describe the episode since the last reset."""

    def __init__(self, budget: PixelBudget, max_steps: int = DEFAULT_MAX_STEPS, max_visual_tokens: int | None = None):
        if budget.factor is None:
            raise ValueError("an episode's screens need the model's patch factor (PixelBudget.for_model)")
        if max_steps < 1:
            raise SuzakError(f"an episode needs at least one step, got max_steps {max_steps}")
        self._budget = budget
        self.max_steps = max_steps
        self.max_visual_tokens = max_visual_tokens
        self._frame: BoxFrame | None = None
        self._current: Image.Image | None = None
        self.steps: list[Step] = []
        self.problems: Counter = Counter()
        self.visual_tokens = 0
        self.outcome = Outcome(done=False, reward=0.0)
        self.final_screen: Image.Image | None = None
        self.instruction = ""

    # the subclass's hooks (the module's docstring) ------------------------------------------------------------------------------------------
    @abstractmethod
    def _start(self, row: dict[str, Any]) -> Image.Image: ...

    @abstractmethod
    def _perform(self, action: Action) -> None: ...

    @abstractmethod
    def _outcome(self) -> Outcome: ...

    @abstractmethod
    def _screen(self) -> Image.Image | None: ...

    @classmethod
    def bound_to(cls, budget: PixelBudget, max_steps: int | None = None, max_visual_tokens: int | None = None,
                 **options: Any) -> EpisodeFactory:  # fmt: skip
        """This environment's ``environment_factory`` for a run: its screen budget, step cap (None:
        :data:`DEFAULT_MAX_STEPS`) and visual-token cap."""
        return EpisodeFactory(cls, budget, max_steps or DEFAULT_MAX_STEPS, max_visual_tokens, options)

    # TRL's protocol --------------------------------------------------------------------------------------------------
    def reset(self, **row: Any) -> None:
        """Begin the row's episode. The row's image is its first screen as the model sees it; its box frame (the
        column the trainer adds) is the frame of the model's first action."""
        self.steps, self.problems, self.visual_tokens = [], Counter(), 0
        self.instruction = str(row.get("utterance") or question_text(row.get("prompt") or ""))
        self.outcome, self.final_screen = Outcome(done=False, reward=0.0), None
        shown = row.get(ORIGINAL_IMAGE_COLUMN) or next(iter(images_of(row)), None)
        frame = row.get(BOX_FRAME_COLUMN)
        if not isinstance(shown, Image.Image) or not frame:
            raise SuzakError("an episode's row needs its first screen as its one image (column 'image') and its box "
                             "frame (set by the trainer and the evaluation for a vision model)")  # fmt: skip
        self._frame = BoxFrame.from_dict(frame)
        try:
            first = self._start(row).convert("RGB")
        except EpisodeCrashed as crash:
            logger.warning("episode: the environment failed to start (%s); the episode counts as crashed", crash)
            self.problems["crashed"] += 1
            self.outcome = Outcome(done=True, reward=0.0, success=False)
            self._current = shown
            return
        if first.size != shown.size or first.tobytes() != shown.convert("RGB").tobytes():
            self.problems["diverged"] += 1
            if not _said["diverged"]:  # once a process; every one is counted (tools/episode_diverged)
                _said["diverged"] = True
                logger.warning("episode: the environment's first screen is not the row's image (%s against %s): the "
                               "model acts on a screen it was not shown (a dataset built from another version of the "
                               "environment?); counted as tools/episode_diverged", first.size, shown.size)  # fmt: skip
        self._current = first

    def get_reward(self) -> float:
        """The episode's reward: 1 success, 0 failure, the task's partial progress between (0 while it is unfinished,
        unless the environment says otherwise)."""
        return float(self.outcome.reward)

    # the actions' common path -----------------------------------------------------------------------------------------
    def _act(self, kind: str, point: Any = None, text: str | None = None, direction: str | None = None) -> Any:
        if self._current is None or self._frame is None:
            raise ToolError(f"{kind}: no episode is running")
        if self.outcome.done:
            self._fail(kind, "over", "the episode is over; answer without another action")
        model_point = pixels = None
        if point is not None:
            numbers = box_numbers([*point, *point]) if isinstance(point, (list, tuple)) and len(point) == 2 else None
            if numbers is None:
                self._fail(kind, "unparsable", f"x and y must be numbers, got {point!r}")
            model_point = (float(numbers[0]), float(numbers[1]))
            if not self._frame.point_in_frame(model_point):
                top_x, top_y = self._frame.extent
                self._fail(kind, "out_of_range", f"({_number(model_point[0])}, {_number(model_point[1])}) is off the "
                                                 f"screen: x within 0-{top_x}, y within 0-{top_y}")  # fmt: skip
            x, y = self._frame.point_from_model(model_point)
            width, height = self._current.size
            pixels = (min(max(x, 0.0), width - 1.0), min(max(y, 0.0), height - 1.0))
        step = Step(kind, self._current, model_point, pixels, text if text is not None else direction)
        self.steps.append(step)
        action = Action(kind, *(pixels or (None, None)), text=text, direction=direction)
        try:
            self._perform(action)
        except ToolError as refusal:  # nothing happened: not a step of the episode
            self.steps.pop()
            self.problems["refused"] += 1
            raise ToolError(f"{kind}: {refusal}") from None
        except EpisodeCrashed as crash:
            logger.warning("episode: the environment failed during %s (%s); the episode ends", kind, crash)
            self._stop(step, "crashed")
            return f"The screen is gone (the environment failed: {crash}); the episode is over."
        self.outcome = self._outcome()
        if not self.outcome.done and len(self.steps) >= self.max_steps:
            self._stop(step, "step_cap")
            self.final_screen = self._screen()
            return f"The episode is over: its {self.max_steps} steps are used (reward {_number(self.outcome.reward)})."
        if self.outcome.done:
            final = self._screen()  # None where the environment shows nothing after its end (MiniWoB++)
            self.final_screen = final.convert("RGB") if final is not None else None
            verdict = "success" if self.outcome.success or self.outcome.reward >= 1 else "failure"
            return f"The episode is over: {verdict} (reward {_number(self.outcome.reward)})."
        screen = self._screen().convert("RGB")
        tokens = self._budget.tokens(screen.height, screen.width)
        cap = self.max_visual_tokens
        if cap is not None and self.visual_tokens + tokens > cap:
            self._stop(step, "budget")
            self.final_screen = screen
            return (f"The episode is over: its screens may show {cap} visual tokens and the next one would pass them "
                    f"(reward {_number(self.outcome.reward)}).")  # fmt: skip
        self.visual_tokens += tokens
        self._current = screen
        self._frame = BoxFrame.of(self._frame.family, screen.width, screen.height, self._budget)
        return [{"type": "image", "image": self._budget.fit(screen)}]

    def _stop(self, step: Step, reason: str) -> None:
        """End the episode early at ``step`` for ``reason`` (counted), with its reward so far, not a success."""
        step.problem = reason
        self.problems[reason] += 1
        self.outcome = Outcome(done=True, reward=self.outcome.reward, success=False)

    def _fail(self, kind: str, reason: str, message: str):
        self.problems[reason] += 1
        raise ToolError(f"{kind}: {message}")


class Clicks:
    """The ``click`` action."""

    def click(self, x: int, y: int) -> Any:
        """Click a point of the screen you saw last; returns the screen after the click.

        Args:
            x: The point's x, in the same coordinates as a point you answer with.
            y: The point's y, in the same coordinates as a point you answer with.
        """
        return self._act("click", point=[x, y])  # type: ignore[attr-defined]


class Types:
    """The ``type_text`` action (into the focused field)."""

    def type_text(self, text: str) -> Any:
        """Type text into the focused field; returns the screen after typing.

        Args:
            text: The text to type.
        """
        return self._act("type_text", text=str(text))  # type: ignore[attr-defined]


class Keys:
    """The ``press_key`` action."""

    def press_key(self, key: str) -> Any:
        """Press a key (Enter, Tab, Backspace, ArrowUp, ..., or a combination such as Control+a); returns the screen
        after it.

        Args:
            key: The key's name.
        """
        return self._act("press_key", text=str(key))  # type: ignore[attr-defined]


class Scrolls:
    """The ``scroll`` action."""

    def scroll(self, x: int, y: int, direction: str) -> Any:
        """Scroll the part of the screen under a point; returns the screen after scrolling.

        Args:
            x: The point's x, in the same coordinates as a point you answer with.
            y: The point's y, in the same coordinates as a point you answer with.
            direction: "up" or "down".
        """
        if direction not in SCROLL_DIRECTIONS:
            raise ToolError(f"scroll: direction must be one of {', '.join(SCROLL_DIRECTIONS)}, got {direction!r}")
        return self._act("scroll", point=[x, y], direction=direction)  # type: ignore[attr-defined]


@dataclass(frozen=True)
class EpisodeFactory:
    """``environment_factory`` for a :class:`ScreenEnvironment` subclass: TRL calls it with no arguments, once per
    concurrent rollout; each environment gets the run's screen budget, step cap and visual-token cap."""

    environment: type
    budget: PixelBudget
    max_steps: int = DEFAULT_MAX_STEPS
    max_visual_tokens: int | None = None
    options: dict[str, Any] = field(default_factory=dict)
    episode = True  # what suzak.models.tools.resolve_tools reads: an environment factory

    def __call__(self) -> ScreenEnvironment:
        return self.environment(self.budget, self.max_steps, self.max_visual_tokens, **self.options)

    @property
    def __name__(self) -> str:  # a name for logs, as a class has
        return self.environment.__name__

    def check_turn(self, seen: PixelBudget, turn_length: Callable[[list[dict]], int], limit: int) -> None:
        """Before step 1: a screen's tool turn must fit ``limit`` (``max_completion_length``, which holds the whole
        episode: TRL drops a tool turn that does not fit and the episode stops there, unfinished); the screens must
        lie within ``seen``, the budget every image is resized to. A warning when fewer than ``max_steps`` screens
        fit. ``turn_length``: TRL's count of a tool turn's tokens (:func:`suzak.trl_internals.tools.tool_turn_length`)."""
        name = self.__name__
        screens = self.budget
        if not seen.min_pixels <= screens.min_pixels <= screens.max_pixels <= seen.max_pixels:
            raise SuzakError(f"tools: {name}'s screens ({screens.min_pixels}-{screens.max_pixels} pixels) must lie "
                             f"within the pixel budget ({seen.min_pixels}-{seen.max_pixels}), whose bounds the "
                             "processor and vLLM resize every image to")  # fmt: skip
        turn, most = image_turn_tokens(screens, turn_length, "click")
        if turn >= limit:
            raise SuzakError(f"tools: a screen's tool turn takes up to {turn} tokens (up to {most} visual tokens at "
                             f"tool_max_pixels {screens.max_pixels}) and max_completion_length {limit} holds the whole "
                             f"episode: raise max_completion_length well above {turn} or lower tool_max_pixels")  # fmt: skip
        fit = limit // turn
        if fit < self.max_steps:
            logger.warning("tools: %d screens of up to %d tokens fit in max_completion_length %d, and an episode may take "
                           "%d actions: an episode that needs more stops unfinished when its next screen does not "
                           "fit", fit, turn, limit, self.max_steps)  # fmt: skip
        logger.info("tools: %s episodes of up to %d actions, screens fitted to %d-%d pixels (at most %d visual tokens, "
                    "a tool turn of at most %d tokens of max_completion_length %d)", name, self.max_steps,
                    screens.min_pixels, screens.max_pixels, most, turn, limit)  # fmt: skip


def episode_columns(environments: list) -> dict[str, list]:
    """Each rollout's episode beside its completion (``completions.csv``, the W&B table): ``episode_steps`` (JSON:
    each action, the model's point, the screen's point, its text, its problem) and ``episode_reward``; a mixture's
    rollouts of other sources get ``""`` and None there ({} when no rollout is an episode's)."""
    import json

    if not any(isinstance(e, ScreenEnvironment) for e in environments):
        return {}
    episodes = [e if isinstance(e, ScreenEnvironment) else None for e in environments]
    return {"episode_steps": [json.dumps([step.as_dict() for step in e.steps]) if e else "" for e in episodes],
            "episode_reward": [e.get_reward() if e else None for e in episodes]}  # fmt: skip


def _number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else round(float(value), 3)

