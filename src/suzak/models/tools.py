"""Tools a policy calls during a GRPO rollout ("thinking with images"): the built-in ``zoom``, and users' own.

TRL 1.16's ``GRPOTrainer`` runs the tool loop (``tools=``, ``environment_factory=``): it parses each completion's
tool calls, calls the tool, appends its answer (text, or content blocks with images) as a tool turn and generates the
next turn; the tool turns' tokens carry no loss. This module is what suzak adds for Qwen VL models:

- :class:`ZoomEnvironment`, one per rollout (TRL's environment protocol: ``reset(**row)`` and one public method per
  tool). Its ``zoom(bbox_2d)`` takes a box **in the model's own frame** (:mod:`suzak.media.boxes`: relative 0-1000 for
  Qwen2-VL, Qwen3-VL and Qwen3.5, pixels of the resized image for Qwen2.5-VL; always the frame of the row's image as
  the model saw it), crops the **original** image (not the downscaled one the model saw) and returns the crop fitted to
  its own pixel budget (``tool_max_pixels``) as the image of the next turn. A bad call (unparsable, out of the frame,
  smaller than one visual token of the original, past the rollout's visual-token cap, no single image to zoom into)
  goes back to the model as a one-line tool error and is counted by reason (:data:`ZOOM_PROBLEMS`); it never stops
  the run.
- :func:`resolve_tools`: recipe names to TRL's arguments: ``zoom`` (built in), a dotted path to a function (a
  stateless tool, TRL's ``tools=``) or to a class with ``reset`` (an environment, TRL's ``environment_factory``; at
  most one environment per run).

>>> from PIL import Image
>>> from suzak.media.boxes import BoxFrame
>>> budget = PixelBudget(3136, 12544, factor=28)  # crops of at most 16 visual tokens
>>> zoom = ZoomEnvironment(budget)
>>> image = Image.new("RGB", (1000, 500))
>>> frame = BoxFrame.of("qwen2_vl", 1000, 500, PixelBudget(3136, 50176, factor=28))
>>> zoom.reset(original_image=image, box_frame=frame.as_dict())
>>> crop = zoom.zoom([0, 0, 250, 500])[0]["image"]  # the top-left quarter, in Qwen2-VL's 0-1000 frame
>>> crop.size, zoom.visual_tokens
((112, 112), 16)
>>> zoom.zoom([600, 0, 500, 500])
Traceback (most recent call last):
...
suzak.models.tools.ToolError: zoom: bbox_2d [600, 0, 500, 500] is not a box of the image: x1 < x2 and y1 < y2 within 0-999
>>> dict(zoom.problems)
{'out_of_range': 1}
"""

from __future__ import annotations

import importlib
import inspect
import logging
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from PIL import Image

from suzak import SuzakError
from suzak.media.boxes import BOX_FRAME_COLUMN, BoxFrame, box_numbers
from suzak.media.vision import PixelBudget, images_of

__all__ = [
    "ENVIRONMENT_COLUMN",
    "ORIGINAL_IMAGE_COLUMN",
    "ENVIRONMENTS",
    "NoTools",
    "ZOOM",
    "ZOOM_PROBLEMS",
    "ToolError",
    "ToolSet",
    "ZoomEnvironment",
    "ZoomFactory",
    "check_tool_settings",
    "image_turn_tokens",
    "resolve_tools",
    "source_tools",
    "with_original_image",
]

logger = logging.getLogger(__name__)

ZOOM = "zoom"
# Built-in environments a recipe names by a short name (suzak.models.episodes' episodes): their dotted paths.
ENVIRONMENTS = {"miniwob": "suzak.data.miniwob.MiniWoBEnvironment"}
# The column the trainer adds to each row when a run has tools: the row's one image as the dataset holds it, before
# the pixel budget fits it (what a zoom crops).
ORIGINAL_IMAGE_COLUMN = "original_image"
# Why a zoom call failed, the keys of ZoomEnvironment.problems (logged as tools/zoom_<reason> per step).
ZOOM_PROBLEMS = ("unparsable", "out_of_range", "too_small", "budget", "no_image")


def with_original_image(row: dict[str, Any]) -> dict[str, Any]:
    """The row with :data:`ORIGINAL_IMAGE_COLUMN`: its one image before the budget fits it (what a zoom crops), None
    for a row with none or several. Training's rows and the evaluation's get it alike (the trainer's
    ``with_original_image`` and :mod:`suzak.eval.tool_loop`).

    >>> row = with_original_image({"image": Image.new("RGB", (640, 480))})
    >>> row[ORIGINAL_IMAGE_COLUMN].size, with_original_image({"prompt": "text"})[ORIGINAL_IMAGE_COLUMN]
    ((640, 480), None)
    """
    images = images_of(row)
    return {**row, ORIGINAL_IMAGE_COLUMN: images[0] if len(images) == 1 else None}


class ToolError(ValueError):
    """A tool call the tool cannot answer; TRL sends the message back to the model as the tool's error, and counts it
    (``tools/failure_frequency``)."""


class ZoomEnvironment:
    """One rollout's zoom tool (TRL's ``environment_factory`` protocol; one instance per rollout, reset per row).

    ``budget`` is the crop's pixel budget, bound to the model's patch factor (min pixels as training's, max pixels
    ``tool_max_pixels``); ``max_visual_tokens`` caps the visual tokens of all the crops of one rollout (None: no cap).
    ``problems`` counts the failed calls since the last reset by reason (:data:`ZOOM_PROBLEMS`); ``calls``,
    ``visual_tokens`` and ``crops`` (each crop's box in the original image's pixels, [left, top, right, bottom]) what
    was handed out.
    """

    def __init__(self, budget: PixelBudget, max_visual_tokens: int | None = None):
        if budget.factor is None:
            raise ValueError("the zoom's pixel budget needs the model's patch factor (PixelBudget.for_model)")
        self._budget = budget
        self._max_visual_tokens = max_visual_tokens
        self._image: Image.Image | None = None
        self._frame: BoxFrame | None = None
        self.problems: Counter = Counter()
        self.calls = 0
        self.visual_tokens = 0
        self.crops: list[list[int]] = []

    def reset(self, **row: Any) -> None:
        """Take a new row: its original image and its box frame (the columns the trainer adds); no observation."""
        image, frame = row.get(ORIGINAL_IMAGE_COLUMN), row.get(BOX_FRAME_COLUMN)
        self._image = image if isinstance(image, Image.Image) else None
        self._frame = BoxFrame.from_dict(frame) if frame else None
        self.problems = Counter()
        self.calls = 0
        self.visual_tokens = 0
        self.crops = []

    def zoom(self, bbox_2d: list[int]) -> list[dict]:
        """Zoom into a region of the image to see it in more detail: returns that region as a new image.

        Args:
            bbox_2d: The region as [x1, y1, x2, y2], in the same coordinates as a box you answer with.
        """
        self.calls += 1
        if self._image is None or self._frame is None:
            self._fail("no_image", "this question has no single image to zoom into")
        box = box_numbers(bbox_2d)
        if box is None:
            self._fail("unparsable", f"bbox_2d must be four numbers [x1, y1, x2, y2], got {_shown(bbox_2d)}")
        if not self._frame.in_frame(box):
            self._fail("out_of_range", f"bbox_2d {_shown(bbox_2d)} is not a box of the image: x1 < x2 and y1 < y2 "
                                       f"within {_extent(self._frame)}")  # fmt: skip
        crop = self._crop(box)
        factor = self._budget.factor
        if min(crop.size) < factor:
            self._fail("too_small", f"bbox_2d {_shown(bbox_2d)} covers {crop.width}x{crop.height} pixels of the image, "
                                    f"less than one {factor}x{factor} patch: zoom into a larger region")  # fmt: skip
        tokens = self._budget.tokens(crop.height, crop.width)
        cap = self._max_visual_tokens
        if cap is not None and self.visual_tokens + tokens > cap:
            self._fail("budget", f"this answer's zooms may show {cap} visual tokens and {self.visual_tokens} are "
                                 f"used; this one needs {tokens}: answer with what you have seen")  # fmt: skip
        self.visual_tokens += tokens
        self.crops.append(self._crop_box(box))
        return [{"type": "image", "image": self._budget.fit(crop)}]

    def _crop_box(self, box: Sequence[float]) -> list[int]:
        """[left, top, right, bottom]: the whole pixels of the original image covering a model-frame box."""
        assert self._image is not None and self._frame is not None
        x1, y1, x2, y2 = self._frame.from_model(box)
        width, height = self._image.size
        left, top = max(0, math.floor(x1)), max(0, math.floor(y1))
        right, bottom = min(width, math.ceil(x2)), min(height, math.ceil(y2))
        return [left, top, max(right, left), max(bottom, top)]

    def _crop(self, box: Sequence[float]) -> Image.Image:
        """The original image's pixels under a model-frame box (whole pixels covering it, inside the image)."""
        assert self._image is not None
        return self._image.crop(tuple(self._crop_box(box)))

    def _fail(self, reason: str, message: str):
        self.problems[reason] += 1
        raise ToolError(f"{ZOOM}: {message}")


def _shown(value: Any) -> str:
    text = repr(value) if not isinstance(value, list) else "[" + ", ".join(str(v) for v in value) + "]"
    return text if len(text) <= 60 else text[:57] + "..."


def _extent(frame: BoxFrame) -> str:
    top_x, top_y = frame.extent
    return f"0-{top_x}" if top_x == top_y else f"0-{top_x} (x) and 0-{top_y} (y)"


ENVIRONMENT_COLUMN = "environment"  # TRL's: a row's environment, by name, when environment_factory is a dict


class NoTools:
    """The environment of a mixture's row whose source has no tools (TRL's dict ``environment_factory`` names one for
    every row): it offers no tool, so the row's prompt has no tools' turn and its rollout is one turn, as without
    tools."""

    def reset(self, **kwargs) -> None:
        return None


@dataclass
class ToolSet:
    """A run's tools as TRL takes them: ``tools`` (stateless functions) and ``environment_factory`` (None or a
    callable making one environment per rollout); a mixture whose sources name their own tools has one ToolSet per
    source in ``by_source`` (:func:`source_tools`), each row acting with its source's."""

    names: list[str] = field(default_factory=list)
    tools: list[Callable] = field(default_factory=list)
    environment_factory: Callable[[], Any] | None = None
    by_source: dict[str, ToolSet] = field(default_factory=dict)  # source name -> its tools (a tool-less one: empty)

    @property
    def scores_rollouts(self) -> bool:
        """Whether the environment scores its own rollouts (TRL's ``get_reward``: an episode's, or a user's
        environment class that defines one), so a run may name no reward (a mixture: some source's does).

        >>> ToolSet().scores_rollouts, resolve_tools(["zoom"], PixelBudget(factor=28)).scores_rollouts
        (False, False)
        """
        if self.by_source:
            return any(toolset.scores_rollouts for toolset in self.by_source.values())
        environment = getattr(self.environment_factory, "environment", self.environment_factory)
        return callable(getattr(environment, "get_reward", None))

    @property
    def factories(self) -> list[Callable[[], Any]]:
        """Every environment factory of the run (a mixture's, source by source)."""
        toolsets = list(self.by_source.values()) or [self]
        return [toolset.environment_factory for toolset in toolsets if toolset.environment_factory is not None]

    def for_source(self, source: str | None) -> ToolSet:
        """The tools a row of ``source`` acts with: its source's own where the mixture's sources have some (a
        tool-less source's: none), else the run's."""
        return self.by_source.get(source, ToolSet()) if self.by_source else self

    def trainer_kwargs(self) -> dict[str, Any]:
        """``tools`` and ``environment_factory`` for ``GRPOTrainer`` (nothing when the run has no tools); a mixture
        with tools per source: TRL's dict of environments by source name (each row names its own in
        :data:`ENVIRONMENT_COLUMN`, the trainer's ``prepare_batch``), :class:`NoTools` for the tool-less sources.

        >>> from suzak.data.mixture import parse_sources
        >>> sources = parse_sources([{"name": "colour", "dataset": "color_squares", "rewards": ["word_match"]},
        ...                          {"name": "zoomed", "dataset": "zoom_checks", "rewards": ["word_match"],
        ...                           "tools": ["zoom"]}])
        >>> toolset = source_tools(sources, PixelBudget(factor=28))
        >>> factories = toolset.trainer_kwargs()["environment_factory"]
        >>> factories["colour"] is NoTools, type(factories["zoomed"]).__name__
        (True, 'ZoomFactory')
        """
        if self.by_source:
            return {"environment_factory": {name: toolset.environment_factory or NoTools
                                            for name, toolset in self.by_source.items()}}  # fmt: skip
        kwargs: dict[str, Any] = {}
        if self.tools:
            kwargs["tools"] = list(self.tools)
        if self.environment_factory is not None:
            kwargs["environment_factory"] = self.environment_factory
        return kwargs


def source_tools(sources: Sequence[Any], crop_budget: PixelBudget | None, max_visual_tokens: int | None = None,
                 max_steps: int | None = None, crop_budgets: Mapping[str, PixelBudget | None] | None = None,
                 heldout_rows: Mapping[str, int] | None = None) -> ToolSet:  # fmt: skip
    """A mixture's tools where its sources name their own (``datasets[i].tools``): each source's an environment (an
    episode's, the zoom, a class with ``reset``) resolved as :func:`resolve_tools` resolves a run's, with its own caps
    (``tool_max_visual_tokens``, ``max_tool_calling_iterations``: an episode's, at most the run's) where it sets them,
    else the run's, and its screens' (crops') budget: ``crop_budgets[name]`` where the source has its own pixel budget
    or ``tool_max_pixels``, else ``crop_budget``; its rows alone act with it. A source without rewards needs an
    environment that scores its episodes, and one that keeps them (a :class:`suzak.models.episodes.ScreenEnvironment`)
    where it holds rows out (``heldout_rows``: the held-out eval scores those by their episode). Each mistake is one
    line naming the source.

    >>> from suzak.data.mixture import parse_sources
    >>> def one(tools, rewards):
    ...     return parse_sources([{"name": "a", "dataset": "x.jsonl", "tools": tools, "rewards": rewards}])
    >>> source_tools(one(["suzak.scoring.rewards.is_async"], ["accuracy"]), PixelBudget(factor=28))
    Traceback (most recent call last):
    ...
    suzak.SuzakError: datasets[0] ('a'): tools suzak.scoring.rewards.is_async: a source's tools are one environment (zoom, miniwob or a class with reset); plain tool functions go in the recipe's tools, for every source
    >>> source_tools(one(["zoom"], []), PixelBudget(factor=28))
    Traceback (most recent call last):
    ...
    suzak.SuzakError: datasets[0] ('a'): no rewards, and its tools (zoom) have no environment that scores its episodes (get_reward): name at least one reward
    """
    by_source: dict[str, ToolSet] = {}
    for index, source in enumerate(sources):
        where = f"datasets[{index}] ({source.name!r})"
        budget = (crop_budgets or {}).get(source.name, crop_budget)
        own_steps = source.max_tool_calling_iterations
        if own_steps is not None and max_steps is not None and own_steps > max_steps:
            raise SuzakError(f"{where}: max_tool_calling_iterations {own_steps} is above the run's {max_steps}, "
                             "which TRL's tool loop stops every rollout at: raise the run's, or lower the source's")  # fmt: skip
        own_tokens = source.tool_max_visual_tokens
        try:
            toolset = resolve_tools(list(source.tools), budget, own_tokens or max_visual_tokens, own_steps or max_steps)
        except SuzakError as error:
            raise SuzakError(f"{where}: {error}") from None
        if own_steps is not None and not getattr(toolset.environment_factory, "episode", False):
            raise SuzakError(f"{where}: max_tool_calling_iterations {own_steps}: a source's own step cap is an "
                             f"episode's (a ScreenEnvironment ends its episode there); {', '.join(source.tools)} "
                             "calls tools for as many rounds as the run's max_tool_calling_iterations")  # fmt: skip
        if toolset.tools:
            raise SuzakError(f"{where}: tools {', '.join(source.tools)}: a source's tools are one environment (zoom, "
                             "miniwob or a class with reset); plain tool functions go in the recipe's tools, for "
                             "every source")  # fmt: skip
        if source.tools and not source.rewards and not toolset.scores_rollouts:
            raise SuzakError(f"{where}: no rewards, and its tools ({', '.join(source.tools)}) have no environment "
                             "that scores its episodes (get_reward): name at least one reward")  # fmt: skip
        keeps = getattr(toolset.environment_factory, "episode", False)  # an EpisodeFactory: its rollouts' episodes
        if source.tools and not source.rewards and not keeps and (heldout_rows or {}).get(source.name):
            raise SuzakError(f"{where}: no rewards, and its environment keeps no episodes (a ScreenEnvironment) for "
                             "the held-out eval to score its held-out rows by: name a reward, or set its eval_rows "
                             "to 0")  # fmt: skip
        by_source[source.name] = toolset
    names = list(dict.fromkeys(name for toolset in by_source.values() for name in toolset.names))
    return ToolSet(names=names, by_source=by_source)


def resolve_tools(
    names: Sequence[str], crop_budget: PixelBudget | None, max_visual_tokens: int | None = None,
    max_steps: int | None = None,
) -> ToolSet:  # fmt: skip
    """A recipe's ``tools`` as a :class:`ToolSet`: ``zoom`` (with ``crop_budget``, bound to the model), ``miniwob``
    (:data:`ENVIRONMENTS`) or dotted paths ``pkg.module.name`` to a function (a stateless tool) or a class with
    ``reset`` (an environment; one per run). An episode's environment (a :class:`suzak.models.episodes.
    ScreenEnvironment`) gets ``crop_budget`` for its screens, ``max_visual_tokens`` over them and ``max_steps``
    actions (TRL's ``max_tool_calling_iterations``; the environment's default when unset).

    >>> resolve_tools([], None).trainer_kwargs()
    {}
    >>> resolve_tools(["zoom", "zoom"], PixelBudget(factor=28))
    Traceback (most recent call last):
    ...
    suzak.SuzakError: tools: 'zoom' is listed twice
    >>> resolve_tools(["zoom"], None)
    Traceback (most recent call last):
    ...
    suzak.SuzakError: tools: zoom crops images, and this model has no vision tower (no pixel budget)
    """
    toolset = ToolSet()
    for name in names:
        if name in toolset.names:
            raise SuzakError(f"tools: {name!r} is listed twice")
        if name == ZOOM:
            if crop_budget is None or crop_budget.factor is None:
                raise SuzakError("tools: zoom crops images, and this model has no vision tower (no pixel budget)")
            factory: Any = ZoomFactory(crop_budget, max_visual_tokens)
        else:
            factory = _import_tool(ENVIRONMENTS.get(name, name))
            factory = _episode_factory(name, factory, crop_budget, max_visual_tokens, max_steps)
        if inspect.isclass(factory) or isinstance(factory, ZoomFactory) or getattr(factory, "episode", False):
            if toolset.environment_factory is not None:
                raise SuzakError(f"tools: {name!r} is a second environment; a run takes one (TRL's "
                                 "environment_factory), beside any number of plain tool functions")  # fmt: skip
            toolset.environment_factory = factory
        else:
            toolset.tools.append(factory)
        toolset.names.append(name)
    return toolset


def _episode_factory(name: str, found: Any, budget: PixelBudget | None, max_visual_tokens: int | None,
                     max_steps: int | None) -> Any:  # fmt: skip
    """An episode's class (one with ``bound_to``: :class:`suzak.models.episodes.ScreenEnvironment`) bound to the run's
    screen budget, visual-token cap and step cap; anything else as it is."""
    binder = getattr(found, "bound_to", None) if inspect.isclass(found) else None
    if binder is None:
        return found
    if budget is None or budget.factor is None:
        raise SuzakError(f"tools: {name} shows screens, and this model has no vision tower (no pixel budget)")
    return binder(budget, max_steps, max_visual_tokens)


def check_tool_settings(
    min_pixels: int,
    max_pixels: int,
    tool_max_pixels: int | None,
    tool_max_visual_tokens: int | None,
    max_tool_calling_iterations: int | None = None,
) -> None:
    """The tool settings against the pixel budget, before a model loads (training's recipe and the evaluation's
    flags alike); each bad value is one line naming its setting.

    >>> check_tool_settings(3136, 50176, 1000, None)
    Traceback (most recent call last):
    ...
    suzak.SuzakError: tool_max_pixels 1000 must lie between min_pixels 3136 and max_pixels 50176 (processors and vLLM take every image within those bounds)
    """
    if tool_max_pixels is not None and not min_pixels <= tool_max_pixels <= max_pixels:
        raise SuzakError(f"tool_max_pixels {tool_max_pixels} must lie between min_pixels {min_pixels} and max_pixels "
                         f"{max_pixels} (processors and vLLM take every image within those bounds)")  # fmt: skip
    if tool_max_visual_tokens is not None and tool_max_visual_tokens < 1:
        raise SuzakError(f"tool_max_visual_tokens must be at least 1, got {tool_max_visual_tokens}")
    if max_tool_calling_iterations is not None and max_tool_calling_iterations < 0:
        raise SuzakError(f"max_tool_calling_iterations must be at least 0, got {max_tool_calling_iterations}")


@dataclass(frozen=True)
class ZoomFactory:
    """``environment_factory`` for the zoom: TRL calls it with no arguments, once per concurrent rollout."""

    budget: PixelBudget
    max_visual_tokens: int | None

    def __call__(self) -> ZoomEnvironment:
        return ZoomEnvironment(self.budget, self.max_visual_tokens)

    def check_turn(self, seen: PixelBudget, turn_length: Callable[[list[dict]], int], limit: int) -> None:
        """The largest crop's tool turn must fit ``limit`` (``max_completion_length``) with room for an answer (TRL
        silently drops a tool result that does not fit); the crops must lie within ``seen``, the budget every image
        is resized to. ``turn_length``: the tokens TRL adds for a list of tool messages
        (:func:`suzak.trl_internals.tools.tool_turn_length`, before the weights load; the trainer's own after)."""
        crops = self.budget
        if not seen.min_pixels <= crops.min_pixels <= crops.max_pixels <= seen.max_pixels:
            raise SuzakError(f"tools: the zoom's crops ({crops.min_pixels}-{crops.max_pixels} pixels) must lie within "
                             f"the pixel budget ({seen.min_pixels}-{seen.max_pixels}), whose bounds the processor and "
                             "vLLM resize every image to")  # fmt: skip
        turn, most = image_turn_tokens(crops, turn_length, ZOOM)
        if turn >= limit:
            raise SuzakError(f"tools: a zoom's tool turn takes up to {turn} tokens (a crop of up to {most} visual tokens "
                             f"at tool_max_pixels {crops.max_pixels}) and "
                             f"max_completion_length {limit} holds the whole multi-turn completion: raise "
                             f"max_completion_length well above {turn} or lower tool_max_pixels")  # fmt: skip
        if 2 * turn > limit:
            logger.warning("tools: a zoom's tool turn takes up to %d of max_completion_length %d tokens, which also "
                           "hold the calls and the answer; a tool result that does not fit is dropped", turn, limit)  # fmt: skip
        logger.info("tools: zoom crops fitted to %d-%d pixels (at most %d visual tokens, a tool turn of at most %d "
                    "tokens of max_completion_length %d)", crops.min_pixels, crops.max_pixels, most, turn, limit)  # fmt: skip


def image_turn_tokens(budget: PixelBudget, turn_length: Callable[[list[dict]], int], name: str) -> tuple[int, int]:
    """The most tokens one tool turn holding one image fitted to ``budget`` takes (``turn_length``: TRL's count of a
    list of tool messages), and the most visual tokens such an image has."""
    factor = budget.factor
    least = budget.fit(Image.new("RGB", (factor, factor)))  # a tool turn grows by one per visual token of its image
    most = budget.max_pixels // (factor * factor)  # the most visual tokens an image fitted to the budget can have
    turn = turn_length([{"role": "tool", "name": name, "content": [{"type": "image", "image": least}]}])
    return turn + most - budget.tokens(least.height, least.width), most


def _import_tool(name: str) -> Any:
    module_name, _, attr = name.rpartition(".")
    if not module_name:
        raise SuzakError(f"unknown tool {name!r}; built in: {', '.join([ZOOM, *ENVIRONMENTS])} (or a dotted path such as 'my_pkg.tools.my_tool')")
    try:
        found = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise SuzakError(f"cannot import tool {name!r} ({exc})") from exc
    if inspect.isclass(found):
        if not callable(getattr(found, "reset", None)):
            raise SuzakError(f"tool {name!r} is a class without a reset method: an environment needs reset(**row)")
        return found
    if not callable(found):
        raise SuzakError(f"tool {name!r} is a {type(found).__name__}, not a function or an environment class")
    return found
