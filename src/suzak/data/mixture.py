"""Mixtures: one run over several sources, each a dataset of its own task with its own weight, rewards, prompt
template, held-out rows and pixel budget (issue 52; V-Triune/Orsta's sample-level formatting, verifier-level rewards
and source-level metrics, verl's per-``data_source`` rewards, open-r1's dataset mixtures).

A recipe's ``datasets:`` list holds one mapping per source (:class:`Source`; :func:`parse_sources` checks each and
says what is wrong in one line naming the entry).

A **pass** over the mixture holds as many rows as the sources' training rows together, each source's share of them
(its weight over the weights' sum, largest remainders), the sources interleaved so that every stretch of the pass
keeps the shares. Each source's rows come from its own stream of permutations, seeded by ``(seed, source)``, which
goes on from one pass to the next: a source is drawn row by row through a permutation of all its rows, then the next
one, so every row of it is drawn before any row is drawn again, across passes (a large source at a small share needs
several passes to be gone through). An **epoch** (:class:`Epoch`) is the fewest passes in which every row of every
source is drawn: the dataset the trainer iterates (:func:`combine`), which TRL's sampler reshuffles at each of its
epochs. Everything depends on the seed alone, so a resumed run, and every rank under torchrun, draws the same rows.
Every row carries its source's name in ``source`` (:data:`suzak.scoring.rewards.SOURCE_COLUMN`), which the rewards
are routed by (:func:`suzak.scoring.rewards.routed`), and its row within the source in ``source_row``
(:data:`SOURCE_ROW_COLUMN`, counted by :class:`RowsSeen`).

>>> sources = parse_sources([{"name": "colour", "dataset": "color_squares", "weight": 3, "rewards": ["accuracy"]},
...                          {"name": "boxes", "dataset": "grounding_shapes", "rewards": ["iou"]}])
>>> [(s.name, s.share) for s in sources]
[('colour', 0.75), ('boxes', 0.25)]
>>> picks, rows = mixture_order([6, 2], [3, 1], seed=0)  # a pass of 8 rows: 6 + 2, one epoch
>>> picks.tolist()
[0, 0, 1, 0, 0, 0, 1, 0]
>>> sorted(rows[picks == 0].tolist()), sorted(rows[picks == 1].tolist())
([0, 1, 2, 3, 4, 5], [0, 1])
>>> picks, rows = mixture_order([10, 2], [1, 1], seed=0)  # 6 rows of 10 a pass: an epoch of 2 passes draws all
>>> len(picks), sorted(rows[picks == 0][:10].tolist()) == list(range(10))
(24, True)
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from suzak import SuzakError

__all__ = ["EPOCH_ROWS_CAP", "SOURCE_ROW_COLUMN", "Epoch", "RowsSeen", "Source", "combine", "mixture_counts",
           "mixture_order", "parse_sources"]  # fmt: skip

logger = logging.getLogger(__name__)

SOURCE_ROW_COLUMN = "source_row"  # a mixture row's position among its source's training rows
EPOCH_ROWS_CAP = 1 << 22  # rows an epoch may hold (32 MiB of row indices): an extreme skew is cut there, and said


@dataclass(frozen=True)
class Source:
    """One entry of a recipe's ``datasets:`` list. ``None``: the recipe's own setting of that name."""

    name: str  # names the source in metrics (sources/<name>/...), completions.csv and messages
    dataset: str  # a builder, Hub alias, .jsonl file or dataset folder (suzak.data.build_dataset)
    options: dict = field(default_factory=dict)  # the builder's options (a recipe's dataset_options)
    weight: float = 1.0  # the source's share of the rows is its weight over the weights' sum
    rewards: tuple[str, ...] = ()  # this source's rewards (registry names or dotted paths)
    reward_weights: tuple[float, ...] | None = None  # one per reward (default: 1 each)
    reward_kwargs: dict = field(default_factory=dict)  # reward name -> its keyword arguments
    prompt_template: str | None = None
    eval_rows: int | None = None  # held-out rows of this source
    eval_correct_at: float | None = None  # its held-out answers' threshold (None: its first reward's own)
    min_pixels: int | None = None  # this source's pixel budget (OCR and screens want more than geometry)
    max_pixels: int | None = None
    tools: tuple[str, ...] = ()  # this source's environment (an episode's, the zoom): its rows alone act with it
    tool_max_pixels: int | None = None  # its screens' (crops') pixels; None: the recipe's tool_max_pixels
    tool_max_visual_tokens: int | None = None  # its episode's visual tokens over all screens; None: the recipe's
    max_tool_calling_iterations: int | None = None  # its episode's actions (an episode's environment); None: the run's
    share: float = 0.0  # worked out by parse_sources: weight / sum of weights

    @property
    def settings(self) -> dict[str, Any]:
        """The entry's fields as a recipe writes them (for records and messages)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "share"}

    def held_out_rows(self, recipe_eval_rows: int) -> int:
        """This source's held-out rows: its own ``eval_rows``, else the recipe's."""
        return recipe_eval_rows if self.eval_rows is None else self.eval_rows

    def rows_settings(self, recipe_eval_rows: int) -> dict[str, Any]:
        """What decides the source's training rows and their order in the mixture (a resume that changes one draws
        other rows: :func:`suzak.runs.faults.state_settings`); its rewards and pixel budget change no row."""
        return {"name": self.name, "dataset": self.dataset, "options": self.options, "weight": self.weight,
                "prompt_template": self.prompt_template, "eval_rows": self.held_out_rows(recipe_eval_rows)}  # fmt: skip


KEYS = tuple(f.name for f in fields(Source) if f.name != "share")
NAME = re.compile(r"[A-Za-z0-9_-]+")  # a source's name is part of metric names (sources/<name>/...) and file names


def _where(index: int, entry: Mapping) -> str:
    name = entry.get("name") if isinstance(entry, Mapping) else None
    return f"datasets[{index}]" + (f" ({name!r})" if isinstance(name, str) else "")


def parse_sources(entries: Sequence[Mapping], *, default_template: str | None = None) -> list[Source]:
    """The recipe's ``datasets:`` list as :class:`Source` entries, every mistake one line naming the entry.

    >>> parse_sources([{"name": "a", "dataset": "color_squares", "rewards": ["accuracy"], "wieght": 2}])
    Traceback (most recent call last):
    ...
    suzak.SuzakError: datasets[0] ('a'): unknown key 'wieght' (did you mean 'weight'?); a source's keys: name, dataset, options, weight, rewards, reward_weights, reward_kwargs, prompt_template, eval_rows, eval_correct_at, min_pixels, max_pixels, tools, tool_max_pixels, tool_max_visual_tokens, max_tool_calling_iterations
    >>> parse_sources([{"name": "a", "dataset": "color_squares", "rewards": []}])
    Traceback (most recent call last):
    ...
    suzak.SuzakError: datasets[0] ('a'): no rewards: each source names the rewards that score its rows (or, with tools, an environment that scores its episodes)
    >>> parse_sources([{"name": "a", "dataset": "x.jsonl", "rewards": ["iou"]},
    ...                {"name": "a", "dataset": "y.jsonl", "rewards": ["iou"]}])
    Traceback (most recent call last):
    ...
    suzak.SuzakError: datasets[1] ('a'): a second source named 'a' (datasets[0]); each source needs its own name
    >>> parse_sources([{"name": "a", "dataset": "x.jsonl", "rewards": ["iou"], "weight": 0}])
    Traceback (most recent call last):
    ...
    suzak.SuzakError: datasets[0] ('a'): weight 0 must be a number above 0 (a source not to train on is left out)
    >>> parse_sources([{"name": "my source", "dataset": "x.jsonl", "rewards": ["iou"]}])
    Traceback (most recent call last):
    ...
    suzak.SuzakError: datasets[0] ('my source'): name 'my source' names metric columns (sources/<name>/...): letters, digits, '_' and '-' only
    """
    if isinstance(entries, (str, bytes)) or not isinstance(entries, Sequence) or not entries:
        raise SuzakError("datasets: a list of sources, one mapping each (name, dataset, rewards, ...)")
    sources, seen = [], {}
    for index, entry in enumerate(entries):
        where = _where(index, entry)
        _check_entry(where, entry, seen)
        seen[entry["name"]] = index
        tools = _tools_of(where, entry)
        rewards, reward_weights, kwargs = _rewards_of(where, entry, scored_by_tools=bool(tools))
        options = entry.get("options") or {}
        if not isinstance(options, Mapping):
            raise SuzakError(f"{where}: options must be a mapping of the builder's options, got {options!r}")
        sources.append(Source(
            name=entry["name"], dataset=entry["dataset"], options=dict(options), weight=float(entry.get("weight", 1.0)),
            rewards=rewards, reward_weights=reward_weights, reward_kwargs=kwargs,
            prompt_template=entry.get("prompt_template") or default_template, eval_rows=entry.get("eval_rows"),
            eval_correct_at=entry.get("eval_correct_at"), min_pixels=entry.get("min_pixels"),
            max_pixels=entry.get("max_pixels"), tools=tools, **_tool_settings_of(where, entry, tools),
        ))  # fmt: skip
    total = sum(source.weight for source in sources)
    return [Source(**source.settings, share=source.weight / total) for source in sources]


def _check_entry(where: str, entry: Any, seen: Mapping[str, int]) -> None:
    """An entry's keys, name, dataset, weight and whole numbers, each mistake one line (``where`` names the entry)."""
    import difflib

    if not isinstance(entry, Mapping):
        raise SuzakError(f"{where}: a mapping (name, dataset, rewards, ...), got {type(entry).__name__}")
    for key in entry:
        if key not in KEYS:
            near = difflib.get_close_matches(str(key), KEYS, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise SuzakError(f"{where}: unknown key {key!r}{hint}; a source's keys: {', '.join(KEYS)}")
    for key in ("name", "dataset"):
        if not isinstance(entry.get(key), str) or not entry[key]:
            raise SuzakError(f"{where}: {key!r} is required (a non-empty string)")
    name = entry["name"]
    if name in seen:
        raise SuzakError(f"{where}: a second source named {name!r} (datasets[{seen[name]}]); each source needs its "
                         "own name")  # fmt: skip
    if not NAME.fullmatch(name):
        raise SuzakError(f"{where}: name {name!r} names metric columns (sources/<name>/...): letters, digits, '_' "
                         "and '-' only")  # fmt: skip
    weight = entry.get("weight", 1.0)
    if not _is_number(weight) or weight <= 0:
        raise SuzakError(f"{where}: weight {weight!r} must be a number above 0 (a source not to train on is left "
                         "out)")  # fmt: skip
    for key in ("eval_rows", "min_pixels", "max_pixels"):
        value = entry.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise SuzakError(f"{where}: {key} {value!r} must be a whole number of 0 or more")
    from suzak.scoring.rewards import check_correct_at

    check_correct_at(entry.get("eval_correct_at"), f"{where}: eval_correct_at")
    low, high = entry.get("min_pixels"), entry.get("max_pixels")
    if low == 0 or (low is not None and high is not None and low > high):
        raise SuzakError(f"{where}: min_pixels {low} must be at least 1 and at most max_pixels ({high})")


def _is_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def _tools_of(where: str, entry: Mapping) -> tuple[str, ...]:
    """An entry's ``tools``: a list of names (:func:`suzak.models.tools.resolve_tools` resolves them when the run is
    built, knowing the model's budget).

    >>> _tools_of("datasets[0] ('a')", {"tools": "miniwob"}), _tools_of("datasets[0] ('a')", {})
    (('miniwob',), ())
    >>> _tools_of("datasets[0] ('a')", {"tools": [3]})
    Traceback (most recent call last):
    ...
    suzak.SuzakError: datasets[0] ('a'): tools [3] must be a list of tool names (zoom, miniwob or dotted paths)
    """
    tools = entry.get("tools") or []
    tools = [tools] if isinstance(tools, str) else tools
    if not isinstance(tools, (list, tuple)) or not all(isinstance(name, str) and name for name in tools):
        raise SuzakError(f"{where}: tools {tools!r} must be a list of tool names (zoom, miniwob or dotted paths)")
    return tuple(tools)


TOOL_SETTINGS = ("tool_max_pixels", "tool_max_visual_tokens", "max_tool_calling_iterations")


def _tool_settings_of(where: str, entry: Mapping, tools: tuple[str, ...]) -> dict[str, int]:
    """An entry's own tool settings (:data:`TOOL_SETTINGS`, the recipe's names), whole numbers, only beside its own
    ``tools``; checked against its budget and the run's when the run is built (:func:`suzak.training.build.run_tools`).

    >>> _tool_settings_of("datasets[0] ('a')", {"tool_max_pixels": 3136}, ())
    Traceback (most recent call last):
    ...
    suzak.SuzakError: datasets[0] ('a'): tool_max_pixels is a setting of the source's own tools, and it names none (tools: [...]); the recipe's tool_max_pixels is the run's
    >>> _tool_settings_of("datasets[0] ('a')", {"max_tool_calling_iterations": 0}, ("miniwob",))
    Traceback (most recent call last):
    ...
    suzak.SuzakError: datasets[0] ('a'): max_tool_calling_iterations 0 must be a whole number of 1 or more
    """
    settings = {key: entry[key] for key in TOOL_SETTINGS if entry.get(key) is not None}
    for key, value in settings.items():
        if not tools:
            raise SuzakError(f"{where}: {key} is a setting of the source's own tools, and it names none (tools: "
                             f"[...]); the recipe's {key} is the run's")  # fmt: skip
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SuzakError(f"{where}: {key} {value!r} must be a whole number of 1 or more")
    return settings


def _rewards_of(where: str, entry: Mapping, *, scored_by_tools: bool = False
                ) -> tuple[tuple[str, ...], tuple[float, ...] | None, dict]:  # fmt: skip
    """(rewards, reward weights or None, reward kwargs) of an entry, each a list, numbers or mappings as the recipe
    must write them; anything else is one line naming the entry, not a traceback further on. No rewards only where
    the source has tools (``scored_by_tools``), whose environment must then score its episodes (checked when the run
    is built: :func:`suzak.models.tools.source_tools`).

    >>> _rewards_of("datasets[0] ('a')", {"rewards": ["iou"], "reward_weights": 0.5})
    Traceback (most recent call last):
    ...
    suzak.SuzakError: datasets[0] ('a'): reward_weights 0.5 must be a list of numbers, one per reward (iou)
    >>> _rewards_of("datasets[0] ('a')", {"rewards": ["iou"], "reward_kwargs": ["iou"]})
    Traceback (most recent call last):
    ...
    suzak.SuzakError: datasets[0] ('a'): reward_kwargs ['iou'] must be a mapping of reward name to its keyword arguments
    """
    rewards = entry.get("rewards") or []
    rewards = [rewards] if isinstance(rewards, str) else rewards
    if not isinstance(rewards, (list, tuple)) or not all(isinstance(name, str) and name for name in rewards):
        raise SuzakError(f"{where}: rewards {rewards!r} must be a list of reward names (registry names or dotted "
                         "paths)")  # fmt: skip
    if not rewards and not scored_by_tools:
        raise SuzakError(f"{where}: no rewards: each source names the rewards that score its rows (or, with tools, "
                         "an environment that scores its episodes)")  # fmt: skip
    named = ", ".join(rewards)
    weights = entry.get("reward_weights")
    if weights is not None:
        if not isinstance(weights, (list, tuple)) or not all(_is_number(w) for w in weights):
            raise SuzakError(f"{where}: reward_weights {weights!r} must be a list of numbers, one per reward "
                             f"({named})")  # fmt: skip
        if len(weights) != len(rewards):
            raise SuzakError(f"{where}: {len(weights)} reward_weights for {len(rewards)} rewards ({named})")
        weights = tuple(float(w) for w in weights)
    kwargs = entry.get("reward_kwargs") or {}
    if not isinstance(kwargs, Mapping):
        raise SuzakError(f"{where}: reward_kwargs {kwargs!r} must be a mapping of reward name to its keyword "
                         "arguments")  # fmt: skip
    stray = sorted(set(kwargs) - set(rewards))
    if stray:
        raise SuzakError(f"{where}: reward_kwargs for {', '.join(map(str, stray))}, which is not among its rewards "
                         f"({named})")  # fmt: skip
    for name, value in kwargs.items():
        if value is not None and not isinstance(value, Mapping):
            raise SuzakError(f"{where}: reward_kwargs of {name} {value!r} must be a mapping of its keyword arguments")
    return tuple(rewards), weights, dict(kwargs)


def mixture_counts(weights: Sequence[float], total: int) -> list[int]:
    """Rows each source gives a pass of ``total`` rows: ``total`` split by weight, the remainders to the largest
    fractions (ties to the earlier source); every source at least one row.

    >>> mixture_counts([3, 1], 10), mixture_counts([1, 1, 1], 10), mixture_counts([1000, 1], 10)
    ([8, 2], [4, 3, 3], [9, 1])
    """
    if total < len(weights):
        raise SuzakError(f"a pass of {total} rows cannot hold one row of each of {len(weights)} sources")
    exact = [total * weight / sum(weights) for weight in weights]
    counts = [math.floor(x) for x in exact]
    by_remainder = sorted(range(len(weights)), key=lambda i: (counts[i] - exact[i], i))
    for i in by_remainder[: total - sum(counts)]:
        counts[i] += 1
    for i in range(len(counts)):  # a source too light for one row still gives one, taken from the largest
        if counts[i] == 0:
            counts[max(range(len(counts)), key=lambda k: (counts[k], -k))] -= 1
            counts[i] = 1
    return counts


@dataclass(frozen=True)
class Epoch:
    """What the dataset a mixture trains on holds: one **epoch**, the fewest passes in which every row of every source
    is drawn (each source's stream of permutations goes on from pass to pass).

    Why an epoch, not a stream as long as the run: it depends on the sources, their weights and the seed alone, not on
    ``max_steps`` or ``num_train_epochs``, so a run resumed with a longer ``max_steps`` (a constant learning rate
    allows it), a run counted in epochs and an SFT run draw the same rows; TRL's sampler reshuffles it at each of its
    epochs, so each of those draws every row again; dynamic sampling's refills draw from it by index, by the weights.
    Its size is set by the source that takes longest to go through (``n`` rows at a share ``s`` take about ``n / s``
    draws), rounded up to whole ``batch``es (TRL's GRPO sampler drops a last partial generation batch, and with it
    rows the epoch would not draw), and capped at :data:`EPOCH_ROWS_CAP` rows for a large source at a tiny weight,
    whose rows are then drawn in part each epoch (:meth:`describe` says which, at start).

    >>> epoch = Epoch.of([10000, 100], [1, 1])
    >>> epoch.counts, epoch.passes, epoch.rows
    ((5050, 5050), 2, 20200)
    >>> epoch.describe(["large", "small"])
    'mixture: one epoch = 2 passes of 10,100 rows (large 5,050 a pass, small 5,050); every row of every source drawn at least once per epoch'
    >>> print(Epoch.of([1_000_000, 100], [1, 1000]).describe(["web", "small"]))  # doctest: +NORMALIZE_WHITESPACE
    mixture: one epoch = 4 passes of 1,000,100 rows (web 999 a pass, small 999,101), cut at 4,194,304 rows
    (every row of every source takes 1,002 passes): an epoch draws web 3,996 of its 1,000,000 rows; raise its weight,
    or give it fewer rows, to draw them all
    """

    sizes: tuple[int, ...]  # each source's training rows: a pass holds them all together
    counts: tuple[int, ...]  # each source's rows in a pass (its share)
    passes: int  # passes in an epoch
    needed: int  # passes in which every row of every source is drawn (more than ``passes``: the cap cut the epoch)
    rows: int  # draws in an epoch: its passes' rows, rounded up to whole batches

    @classmethod
    def of(cls, sizes: Sequence[int], weights: Sequence[float], batch: int = 1) -> Epoch:
        """The epoch of sources of ``sizes`` rows at ``weights``, in whole ``batch``es of rows."""
        if any(size <= 0 for size in sizes):
            empty = next(i for i, size in enumerate(sizes) if size <= 0)
            raise SuzakError(f"datasets[{empty}]: the source has no rows")
        pass_rows = sum(sizes)
        counts = mixture_counts(weights, pass_rows)
        needed = max(-(-size // count) for size, count in zip(sizes, counts, strict=True))
        passes = max(1, min(needed, EPOCH_ROWS_CAP // pass_rows))
        rows = -(-passes * pass_rows // batch) * batch
        return cls(tuple(sizes), tuple(counts), passes, needed, rows)

    @property
    def pass_rows(self) -> int:
        return sum(self.sizes)

    @property
    def whole(self) -> bool:
        """Every row of every source is drawn in an epoch (the cap did not cut it)."""
        return self.passes >= self.needed

    def describe(self, names: Sequence[str]) -> str:
        """The line a run logs at start: what a pass and an epoch hold, and the sources an epoch draws in part."""
        shares = ", ".join(f"{name} {count:,}" + (" a pass" if i == 0 else "")
                           for i, (name, count) in enumerate(zip(names, self.counts, strict=True)))  # fmt: skip
        line = f"mixture: one epoch = {self.passes:,} pass{'es' if self.passes > 1 else ''} of {self.pass_rows:,} rows"
        line += f" ({shares})"
        if self.rows != self.passes * self.pass_rows:
            line += f", {self.rows:,} rows in whole generation batches"
        if self.whole:
            return line + "; every row of every source drawn at least once per epoch"
        part = [(name, count * self.passes, size) for name, count, size in zip(names, self.counts, self.sizes,
                                                                               strict=True) if count * self.passes < size]  # fmt: skip
        return (line + f", cut at {EPOCH_ROWS_CAP:,} rows (every row of every source takes {self.needed:,} passes): "
                "an epoch draws " + ", ".join(f"{name} {drawn:,} of its {size:,} rows" for name, drawn, size in part)
                + f"; raise {'its' if len(part) == 1 else 'their'} weight, or give {'it' if len(part) == 1 else 'them'}"
                " fewer rows, to draw them all")  # fmt: skip


def _pass_pattern(counts: Sequence[int]) -> np.ndarray:
    """The source of each row of a pass holding ``counts`` rows of each source, interleaved by smooth weighted round
    robin (every stretch keeps the shares); a pattern that repeats within the pass (counts with a common divisor) is
    worked out once.

    >>> _pass_pattern([4, 2, 2]).tolist(), _pass_pattern([5050, 5050])[:4].tolist()
    ([0, 1, 2, 0, 0, 1, 2, 0], [0, 1, 0, 1])
    """
    repeats = math.gcd(*counts)
    unit = [count // repeats for count in counts]
    total, credit, picks = sum(unit), [0] * len(unit), []
    for _ in range(total):
        credit = [c + n for c, n in zip(credit, unit, strict=True)]
        pick = max(range(len(unit)), key=lambda i: (credit[i], -i))
        credit[pick] -= total
        picks.append(pick)
    return np.tile(np.asarray(picks, dtype=np.int64), repeats)


def _stream(size: int, count: int, seed: int, source: int) -> np.ndarray:
    """The first ``count`` rows a source of ``size`` rows gives: permutation after permutation of its rows, seeded
    by ``(seed, source)`` (every row drawn before any is drawn again)."""
    rng = np.random.default_rng([seed, source])
    blocks = [rng.permutation(size) for _ in range(-(-count // size))]
    return np.concatenate(blocks)[:count] if blocks else np.zeros(0, dtype=np.int64)


def mixture_order(sizes: Sequence[int], weights: Sequence[float], *, seed: int, total: int | None = None
                  ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """The mixture's draws as (source index, row of that source) arrays: pass after pass (:class:`Epoch`), each
    source's rows from its own stream of permutations; ``total`` draws (default: one epoch).

    >>> picks, rows = mixture_order([10, 10, 10], [2, 1, 1], seed=0, total=8)
    >>> picks.tolist()
    [0, 1, 2, 0, 0, 1, 2, 0]
    >>> same = mixture_order([3], [1], seed=1)
    >>> (same[1] == mixture_order([3], [1], seed=1)[1]).all(), (same[1] == mixture_order([3], [1], seed=2)[1]).all()
    (np.True_, np.False_)
    """
    epoch = Epoch.of(sizes, weights)
    total = epoch.rows if total is None else total
    picks = np.resize(_pass_pattern(epoch.counts), total)  # the pass's pattern, again and again
    rows = np.zeros(total, dtype=np.int64)
    for source, size in enumerate(sizes):
        mine = picks == source
        rows[mine] = _stream(size, int(mine.sum()), seed, source)
    return picks, rows


def _with_columns(dataset, features: dict):
    """``dataset`` with every column of ``features`` (a column it lacks: None in each row, of that column's type), in
    ``features``' order."""
    for name, feature in features.items():
        if name not in dataset.column_names:
            dataset = dataset.add_column(name, [None] * len(dataset), feature=feature)
    return dataset.select_columns(list(features))


def _prompts_as_parts(datasets: Sequence) -> list:
    """The datasets with a text source's messages (``content`` a string) as one text part each, when another source's
    messages hold parts (an image source's): one ``prompt`` type for the mixture, rendered alike by Qwen's chat
    templates (a content list's text parts are its text)."""
    import datasets as hf

    def string_content(dataset) -> bool:
        feature = dataset.features.get("prompt")
        inner = getattr(feature, "feature", None)
        return isinstance(inner, dict) and inner.get("content") == hf.Value("string")

    kinds = [string_content(dataset) for dataset in datasets]
    if not any(kinds) or all(kinds):
        return list(datasets)

    from suzak.media.vision import content_as_parts

    def as_parts(row):
        return {"prompt": content_as_parts(row["prompt"])}

    return [dataset.map(as_parts, desc="prompt as parts") if text else dataset
            for dataset, text in zip(datasets, kinds, strict=True)]  # fmt: skip


def combine(datasets: Sequence, sources: Sequence[Source], *, seed: int, total: int | None = None):
    """The mixture as one dataset: each source's rows (``datasets``, in ``sources``' order) with ``source`` naming it
    and ``source_row`` its position among them, a column one source lacks filled with None, in
    :func:`mixture_order`'s order (``total`` rows; default: one :class:`Epoch`). Two sources with a column of
    different types is one line.

    >>> import datasets as hf
    >>> colour = hf.Dataset.from_list([{"solution": "red"}, {"solution": "blue"}])
    >>> boxes = hf.Dataset.from_list([{"solution": "[0, 0, 1, 1]", "question_boxes": [[0, 0, 1, 1]]}])
    >>> sources = parse_sources([{"name": "colour", "dataset": "a.jsonl", "rewards": ["accuracy"]},
    ...                          {"name": "boxes", "dataset": "b.jsonl", "rewards": ["iou"]}])
    >>> mixed = combine([colour, boxes], sources, seed=0)
    >>> [(row["source"], row["source_row"], row["solution"], row["question_boxes"]) for row in mixed]  # doctest: +NORMALIZE_WHITESPACE
    [('colour', 0, 'red', None), ('boxes', 0, '[0, 0, 1, 1]', [[0, 0, 1, 1]]), ('colour', 1, 'blue', None)]
    """
    import datasets as hf

    from suzak.scoring.rewards import SOURCE_COLUMN as column

    datasets = _prompts_as_parts(datasets)
    features: dict = {}
    for dataset, source in zip(datasets, sources, strict=True):
        for own in (column, SOURCE_ROW_COLUMN):
            if own in dataset.column_names:
                raise SuzakError(f"source {source.name!r}: its rows have a {own!r} column of their own; the mixture "
                                 "names each row's source and its row there")  # fmt: skip
        for name, feature in dataset.features.items():
            if name in features and features[name] != feature:
                first = next(s.name for d, s in zip(datasets, sources, strict=False) if name in d.column_names)
                raise SuzakError(f"sources {first!r} and {source.name!r}: column {name!r} is {features[name]} in one "
                                 f"and {feature} in the other; a mixture's sources give a column one type")  # fmt: skip
            features.setdefault(name, feature)
    features[column], features[SOURCE_ROW_COLUMN] = hf.Value("string"), hf.Value("int64")
    parts = [_with_columns(dataset.add_column(column, [source.name] * len(dataset))
                           .add_column(SOURCE_ROW_COLUMN, list(range(len(dataset)))), features)
             for dataset, source in zip(datasets, sources, strict=True)]  # fmt: skip
    offsets = np.cumsum([0] + [len(part) for part in parts[:-1]])
    picks, rows = mixture_order([len(p) for p in parts], [s.weight for s in sources], seed=seed, total=total)
    return hf.concatenate_datasets(parts).select(offsets[picks] + rows)


class RowsSeen:
    """Which of each source's training rows have been drawn into a training batch (``sources/<name>/rows_seen``),
    saved in each checkpoint (:attr:`FILE`, as runs of rows) so that a resumed run counts on from there.

    >>> seen = RowsSeen({"a": 4, "b": 2})
    >>> seen.add([("a", 1), ("a", 1), ("b", 0), ("a", 2)])
    >>> seen.fractions(), seen.state()["seen"]
    ({'a': 0.5, 'b': 0.5}, {'a': [[1, 3]], 'b': [[0, 1]]})
    """

    FILE = "suzak_rows_seen.json"

    def __init__(self, sizes: Mapping[str, int]):
        self.seen = {name: np.zeros(size, dtype=bool) for name, size in sizes.items()}

    def add(self, rows: Iterable[tuple[str, int]]) -> None:
        for name, row in rows:
            self.seen[name][row] = True

    def fractions(self) -> dict[str, float]:
        return {name: float(mask.mean()) for name, mask in self.seen.items()}

    def state(self) -> dict[str, Any]:
        """Each source's size and the runs ``[start, stop)`` of its rows seen (one run once an epoch is through)."""

        def runs(mask: np.ndarray) -> list[list[int]]:
            edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.view(np.int8), [0]])))
            return edges.reshape(-1, 2).tolist()

        return {"sizes": {name: len(mask) for name, mask in self.seen.items()},
                "seen": {name: runs(mask) for name, mask in self.seen.items()}}  # fmt: skip

    def save(self, folder: str | Path) -> None:
        (Path(folder) / self.FILE).write_text(json.dumps(self.state()) + "\n", encoding="utf-8")

    def load(self, folder: str | Path) -> None:
        """The rows seen up to the checkpoint ``folder`` (from before suzak saved them, or of other sources: from
        here on)."""
        path = Path(folder) / self.FILE
        state = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
        sizes = {name: len(mask) for name, mask in self.seen.items()}
        if state is None or state.get("sizes") != sizes:
            logger.warning("sources/<name>/rows_seen: %s holds no count of these sources' rows; they are counted "
                           "from this step", folder)  # fmt: skip
            return
        for name, runs in state["seen"].items():
            for start, stop in runs:
                self.seen[name][start:stop] = True
