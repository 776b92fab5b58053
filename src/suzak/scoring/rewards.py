"""The ``REWARDS`` registry and the wrappers around a reward, as open-r1 keeps its registry beside TRL's rewards.

The rewards themselves live by task (:mod:`suzak.scoring.answers`, :mod:`~suzak.scoring.formats`,
:mod:`~suzak.scoring.ocr`, :mod:`~suzak.scoring.grounding`, :mod:`~suzak.scoring.tools`, :mod:`~suzak.scoring.judge`),
each a plain function with TRL's signature ``f(completions, solution, **kwargs) -> list[float | None]`` scoring
0.0..1.0; this module names them (``REWARDS``, or a dotted path ``pkg.module.func``), binds a recipe's kwargs to them,
wraps them (a mixture's :func:`routed`, :func:`read_after_opening`) and reads what they declare
(:mod:`suzak.scoring.marks`: :func:`gold_parser`, :func:`reads_rollout`, :func:`correct_at`, :func:`heldout_scorer`).
Every registered reward is importable from here too.

>>> completions = [[{"role": "assistant", "content": "<think> 3 cubes </think> <answer> 3 </answer>"}]]
>>> clevr_count(completions, solution=["<answer> 3 </answer>"]), think_format(completions)
([1.0], [1.0])
>>> [f.__name__ for f in resolve_rewards(["clevr_count", "gsm8k_format"], {"gsm8k_format": {"style": "think"}})]
['clevr_count', 'gsm8k_format']
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable
from typing import Any

from suzak import SuzakError
from suzak.scoring.answers import clevr_count, gsm8k_accuracy, math_accuracy, r1v_accuracy, word_match
from suzak.scoring.formats import gsm8k_format, think_format
from suzak.scoring.grounding import box_f1, box_format, box_map, click_accuracy, dynamic_iou, iou, rec_accuracy
from suzak.scoring.judge import judge
from suzak.scoring.marks import _is_number
from suzak.scoring.ocr import anls, ocr_exact
from suzak.scoring.parsing import with_opening
from suzak.scoring.tools import zoom_used

__all__ = [
    # the registry and its wrappers
    "REWARDS",
    "SOURCE_COLUMN",
    "base_reward",
    "bound_kwargs",
    "check_correct_at",
    "correct_at",
    "counts_correct",
    "gold_parser",
    "heldout_scorer",
    "is_async",
    "is_judge",
    "read_after_opening",
    "reads_rollout",
    "resolve_reward",
    "resolve_rewards",
    "routed",
    # the rewards it registers, from their task modules
    "anls",
    "box_f1",
    "box_format",
    "box_map",
    "clevr_count",
    "click_accuracy",
    "dynamic_iou",
    "gsm8k_accuracy",
    "gsm8k_format",
    "iou",
    "judge",
    "math_accuracy",
    "ocr_exact",
    "r1v_accuracy",
    "rec_accuracy",
    "think_format",
    "word_match",
    "zoom_used",
]


def _layers(reward: Callable):
    """``reward``, then each wrapper's inner reward down to the registry's function: recipe kwargs
    (``functools.partial``), a mixture's :func:`routed`, :func:`read_after_opening` (both keep it as ``__wrapped__``),
    in any order and depth."""
    while reward is not None:
        yield reward
        inner = getattr(reward, "__wrapped__", None)
        reward = inner or (reward.func if isinstance(reward, functools.partial) else None)


def base_reward(reward: Callable) -> Callable:
    """The registry's function under a reward's wrappers (:func:`_layers`).

    >>> counted = resolve_reward("clevr_count", {"answer_format": "plain"})
    >>> base_reward(read_after_opening(routed(counted, "a"), "<t>")) is clevr_count
    True
    """
    *_, base = _layers(reward)
    return base


def bound_kwargs(reward: Callable) -> dict:
    """The settings a recipe bound to a reward (its ``functools.partial``'s keywords, an outer one's over an inner
    one's), under its wrappers (:func:`_layers`): a judge read after the template's opening is asked with its own.

    >>> judged = read_after_opening(routed(resolve_reward("judge", {"model": "j"}), "a"), "<t>")
    >>> bound_kwargs(judged), bound_kwargs(word_match)
    ({'model': 'j'}, {})
    """
    bound: dict = {}
    for layer in reversed(list(_layers(reward))):
        bound |= layer.keywords if isinstance(layer, functools.partial) else {}
    return bound


def is_async(reward: Callable) -> bool:
    """True when ``reward`` is awaited (``judge``): TRL runs such rewards in its event loop, so every wrapper of one
    must be a coroutine function too."""
    return inspect.iscoroutinefunction(reward.func if isinstance(reward, functools.partial) else reward)


def reads_rollout(reward: Callable) -> bool:
    """True for a reward marked by ``_reads_rollout`` (also through recipe kwargs and wrappers), or one that takes
    TRL's ``environments`` (the rollouts' environments: an environment's own ``get_reward`` as TRL wraps it, a user's
    reward of an episode): it scores the rollout, not an answer.

    >>> reads_rollout(zoom_used), reads_rollout(routed(zoom_used, "a")), reads_rollout(word_match)
    (True, True, False)
    >>> reads_rollout(lambda environments, **kwargs: [1.0])
    True
    """
    base = base_reward(reward)
    if getattr(base, "reads_rollout", False):
        return True
    try:
        return "environments" in inspect.signature(base).parameters
    except (TypeError, ValueError):
        return False


def is_judge(reward: Callable) -> bool:
    """True for a reward a model scores (``judge``, also through recipe kwargs and wrappers): its score of an ideal
    answer is a probability, not 1.0, so the pre-flight asks it to prefer the right answer over a wrong one instead,
    and the held-out eval counts it correct above one half.

    >>> judged = resolve_reward("judge", {"model": "judge"})
    >>> is_judge(judged), is_judge(read_after_opening(routed(judged, "a"), "<think>\\n")), is_judge(word_match)
    (True, True, False)
    """
    return base_reward(reward) is judge


def correct_at(reward: Callable) -> float:
    """The score at which the held-out eval counts an answer correct (:func:`counts_correct`): a recipe's
    ``eval_correct_at`` (:func:`heldout_scorer`), else what the reward declares (``_correct_at``: IoU and ANLS 0.5),
    else full marks, 1.0 (a 0/1 reward), or one half for a judge's P(yes). Seen through wrappers as
    :func:`base_reward` sees, the outermost declaration first.

    >>> correct_at(iou), correct_at(routed(resolve_reward("anls", {"threshold": 0.4}), "docs")), correct_at(word_match)
    (0.5, 0.5, 1.0)
    """
    for layer in _layers(reward):
        if (threshold := getattr(layer, "correct_at", None)) is not None:
            return threshold
    return 0.5 if is_judge(reward) else 1.0


def counts_correct(reward: Callable, score: float | None) -> bool:
    """Whether the held-out eval counts ``reward``'s ``score`` of an answer correct: at least :func:`correct_at`
    (a judge's P(yes): above it, as it leans to yes); no score (None) is wrong.

    >>> [counts_correct(iou, score) for score in (0.998, 0.5, 0.49, None)], counts_correct(word_match, 0.998)
    ([True, True, False, False], False)
    """
    value, threshold = float(score or 0.0), correct_at(reward)
    return value > threshold if is_judge(reward) else value >= threshold


def heldout_scorer(reward: Callable, threshold: float | None = None) -> Callable:
    """``reward`` as the held-out eval scores it. A reward whose score moves with the training step gives way to the
    reward it declares (``_heldout_as``; ``dynamic_iou``: :func:`iou`, bound to the recipe's kwargs ``iou`` takes, not
    routed: the eval hands a source's scorer its own rows alone), so that training's eval at any step and ``suzak
    heldout`` agree; ``threshold`` (a recipe's ``eval_correct_at``) replaces the one :func:`correct_at` reads.

    >>> scorer = heldout_scorer(routed(resolve_reward("dynamic_iou", {"answer_format": "think_answer"}), "boxes"))
    >>> base_reward(scorer) is iou, scorer.keywords, correct_at(scorer), correct_at(heldout_scorer(scorer, 0.75))
    (True, {'answer_format': 'think_answer'}, 0.5, 0.75)
    """
    stand_in = getattr(base_reward(reward), "heldout_as", None)
    if stand_in is not None:
        taken = inspect.signature(stand_in).parameters
        kwargs = {key: value for key, value in bound_kwargs(reward).items() if key in taken}
        reward = resolve_reward(stand_in.__name__, kwargs)
    if threshold is None:
        return reward
    scorer = functools.update_wrapper(functools.partial(reward), reward)
    scorer.correct_at = threshold
    return scorer


def check_correct_at(value: Any, where: str) -> float | None:
    """``value`` as a held-out threshold (None: the reward's own, :func:`correct_at`), or ``SuzakError`` in one line
    naming ``where`` (a flag, a mixture's source): a number in (0, 1].

    >>> check_correct_at(0.5, "--eval_correct_at"), check_correct_at(None, "--eval_correct_at")
    (0.5, None)
    >>> check_correct_at(50, "--eval_correct_at")
    Traceback (most recent call last):
    ...
    suzak.SuzakError: --eval_correct_at 50 must be a number in (0, 1]: the score at which the held-out eval counts an answer correct
    """
    if value is None:
        return None
    if not _is_number(value) or not 0 < value <= 1:
        raise SuzakError(f"{where} {value!r} must be a number in (0, 1]: the score at which the held-out eval counts "
                         "an answer correct")  # fmt: skip
    return float(value)


def gold_parser(reward: Callable) -> Callable[[str], Any] | None:
    """The parser a reward reads gold answers with (also through recipe kwargs), or None when it declares none.

    >>> gold_parser(clevr_count)("3"), gold_parser(resolve_reward("clevr_count", {"answer_format": "plain"}))("3")
    (3, 3)
    >>> gold_parser(think_format) is None
    True
    """
    return getattr(base_reward(reward), "gold_parser", None)


# --- registry ----------------------------------------------------------------------------------------------------

REWARDS: dict[str, Callable] = {
    f.__name__: f
    for f in (clevr_count, think_format, gsm8k_accuracy, gsm8k_format, math_accuracy, r1v_accuracy, word_match,
              anls, ocr_exact, iou, rec_accuracy, dynamic_iou, box_format, box_f1, box_map, click_accuracy,
              zoom_used, judge)
}  # fmt: skip


def resolve_reward(name: str, kwargs: dict | None = None) -> Callable:
    """The reward named ``name`` (a ``REWARDS`` key or a dotted path ``pkg.module.func``), bound to ``kwargs``.

    With kwargs the result is a ``functools.partial`` that keeps the reward's ``__name__`` (TRL logs rewards under
    it); each kwarg must be a named parameter of the reward, so a typo fails here rather than being ignored, and a
    reward that checks its values (``_checks_kwargs``: ``dynamic_iou``'s schedule) checks them here too.

    >>> resolve_reward("suzak.scoring.rewards.think_format") is think_format
    True
    >>> resolve_reward("gsm8k_format", {"style": "think"}).__name__
    'gsm8k_format'
    >>> resolve_reward("gsm8k_format", {"styel": "think"})
    Traceback (most recent call last):
    ...
    suzak.SuzakError: reward 'gsm8k_format' has no parameter 'styel'; its parameters: style
    """
    func = REWARDS.get(name) or _import_reward(name)
    if not kwargs:
        return func
    _check_reward_kwargs(name, func, kwargs)
    bound = functools.update_wrapper(functools.partial(func, **kwargs), func)
    bound.__name__ = name if name in REWARDS else func.__name__
    return bound


def _import_reward(name: str) -> Callable:
    module_name, _, attr = name.rpartition(".")
    if not module_name:
        raise SuzakError(
            f"unknown reward {name!r}; known: {', '.join(REWARDS)} (or a dotted path such as 'my_pkg.rewards.my_reward')"
        )
    try:
        func = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise SuzakError(
            f"cannot import reward {name!r} ({exc}); known rewards: {', '.join(REWARDS)} (or a dotted path)"
        ) from exc
    if not callable(func):
        raise SuzakError(f"reward {name!r} is a {type(func).__name__}, not a function")
    return func


def _check_reward_kwargs(name: str, func: Callable, kwargs: dict) -> None:
    # GRPOTrainer passes these itself: a recipe must not set them
    from suzak.trl_internals.rewards import REWARD_CALL_KWARGS

    params = inspect.signature(func).parameters
    settable = [
        p
        for p, spec in params.items()
        if spec.kind in (spec.POSITIONAL_OR_KEYWORD, spec.KEYWORD_ONLY) and p not in REWARD_CALL_KWARGS
    ]
    for key in kwargs:
        if key in REWARD_CALL_KWARGS:
            raise SuzakError(f"reward {name!r}: {key!r} is passed by the trainer and cannot be set in a recipe")
        if key not in settable:
            raise SuzakError(
                f"reward {name!r} has no parameter {key!r}; its parameters: {', '.join(settable) or '(none)'}"
            )
    if (check := getattr(func, "check_kwargs", None)) is not None:
        check(kwargs)


def read_after_opening(reward: Callable, opening: str) -> Callable:
    """``reward`` reading every completion with ``opening`` in front (:func:`suzak.scoring.parsing.with_opening`): the chat
    template's opening of the assistant turn (Qwen3.5's ``<think>\\n``), which the policy never generates itself.

    Keeps what TRL and suzak read off a reward: its ``__name__`` (metric names), its gold parser, async or not.

    >>> written = [" 3 cubes </think> <answer>3</answer>"]  # what the policy generated after "<think>\\n"
    >>> reward = read_after_opening(think_format, "<think>\\n")
    >>> reward.__name__, reward(written), think_format(written)
    ('think_format', [1.0], [0.0])
    """
    if not opening:
        return reward

    def opened(completions: list) -> list:
        return [with_opening(c, opening) for c in completions]

    if is_async(reward):

        async def wrapper(completions, *args, **kwargs):
            return await reward(*args, completions=opened(completions), **kwargs)
    else:

        def wrapper(completions, *args, **kwargs):
            return reward(*args, completions=opened(completions), **kwargs)

    functools.update_wrapper(wrapper, reward)
    wrapper.__name__ = getattr(reward, "__name__", type(reward).__name__)
    if (parse := gold_parser(reward)) is not None:
        wrapper.gold_parser = parse
    wrapper.opening = opening
    return wrapper


def resolve_rewards(names: list[str], reward_kwargs: dict[str, dict] | None = None) -> list[Callable]:
    """``resolve_reward`` for each name, with that name's kwargs from ``reward_kwargs`` (keys must be in ``names``).

    >>> [f.__name__ for f in resolve_rewards(["clevr_count", "think_format"])]
    ['clevr_count', 'think_format']
    """
    reward_kwargs = reward_kwargs or {}
    stray = sorted(set(reward_kwargs) - set(names))
    if stray:
        raise SuzakError(f"reward kwargs given for {', '.join(stray)}, which is not among the rewards {names}")
    return [resolve_reward(name, reward_kwargs.get(name)) for name in names]


SOURCE_COLUMN = "source"  # a mixture row's source name (suzak.data.mixture): which rewards score its completions
_SHARED_KWARGS = ("trainer_state", "log_metric")  # TRL's reward kwargs that are not one value per row


def routed(func: Callable, source: str) -> Callable:
    """``func`` scoring only the completions of ``source``'s rows (a mixture's, by :data:`SOURCE_COLUMN`) and None
    for every other row (TRL's "this reward does not score it": its weighted sum leaves the reward out there), so no
    reward ever sees another task's rows. Named ``<source>/<reward>``, TRL logs it as ``rewards/<source>/<reward>``.
    A column the reward logs with ``log_extra`` gets None on the other sources' rows; a figure it logs with
    ``log_metric`` is named for the source (``judge/calls`` as ``judge/<source>/calls``: two judged sources' calls
    are two figures, not one mean).

    >>> def first(completions, solution, **kwargs):
    ...     return [float(c == s) for c, s in zip(completions, solution)]
    >>> scored = routed(first, "colour")
    >>> scored.__name__
    'colour/first'
    >>> scored(completions=["red", "[1, 2]", "blue"], solution=["red", "[1, 2]", "red"],
    ...        source=["colour", "boxes", "colour"], trainer_state=None)
    [1.0, None, 0.0]
    """
    name = f"{source}/{func.__name__}"

    def split(kwargs: dict) -> tuple[list[int], int, dict]:
        sources = kwargs.get(SOURCE_COLUMN)
        if sources is None:
            raise SuzakError(f"reward {name}: the rows carry no {SOURCE_COLUMN!r} column (a mixture's rows do)")
        count = len(sources)
        mine = [i for i, row_source in enumerate(sources) if row_source == source]
        sub = {}
        for key, value in kwargs.items():
            if key == "log_metric" and value is not None:
                sub[key] = functools.partial(_source_metric, value, source)
            elif key in _SHARED_KWARGS:
                sub[key] = value
            elif key == "log_extra":
                sub[key] = functools.partial(_scattered_extra, value, mine, count)
            elif isinstance(value, list) and len(value) == count:
                sub[key] = [value[i] for i in mine]
            else:
                sub[key] = value
        return mine, count, sub

    def scattered(mine: list[int], count: int, values: list) -> list[float | None]:
        scores: list[float | None] = [None] * count
        for i, value in zip(mine, values, strict=True):
            scores[i] = value
        return scores

    if is_async(func):  # the judge: awaited by TRL, so the wrapper is a coroutine function too

        @functools.wraps(func)
        async def score(**kwargs: Any) -> list[float | None]:
            mine, count, sub = split(kwargs)
            return scattered(mine, count, await func(**sub) if mine else [])
    else:

        @functools.wraps(func)
        def score(**kwargs: Any) -> list[float | None]:
            mine, count, sub = split(kwargs)
            return scattered(mine, count, func(**sub) if mine else [])

    score.__name__ = score.__qualname__ = name
    score.source = source  # the rows it scores (the trainer counts its None and NaN over them alone)
    return score


def _source_metric(log_metric: Callable, source: str, name: str, value: float) -> None:
    """``log_metric`` of a routed reward: ``<kind>/<rest>`` as ``<kind>/<source>/<rest>`` (TRL's own figures of a
    source's reward read ``rewards/<source>/<reward>``)."""
    kind, _, rest = name.partition("/")
    log_metric(f"{kind}/{source}/{rest}" if rest else f"{source}/{name}", value)


def _scattered_extra(log_extra: Callable, rows: list[int], count: int, column: str, values: list) -> None:
    full: list = [None] * count
    for i, value in zip(rows, values, strict=True):
        full[i] = value
    log_extra(column, full)
