"""The reward-call convention and the reward guard: how ``GRPOTrainer._calculate_rewards`` calls a reward, what it
does with what comes back, and how a figure a reward logs is totalled over the ranks.

- :data:`REWARD_CALL_KWARGS` and :func:`reward_call_kwargs`: the keyword arguments ``GRPOTrainer`` calls every reward
  function with, which the reward pre-flight reproduces and recipes must not set
  (``test_reward_call_kwargs_match_calculate_rewards``);
- :func:`reward_name`: TRL's ``trl.trainer.utils.get_callable_name``, the name ``rewards/<name>/mean`` is logged under
  (``test_reward_name_is_the_name_trl_logs_a_reward_under``);
- :class:`RewardFault`: what ``_calculate_rewards`` raises, on every rank at once, when a reward raises or returns
  what TRL cannot use (each recorded by :class:`RewardGuard`, which wraps ``self.reward_funcs`` for one call of it),
  or when no reward scored any completion of a training batch; TRL's ``is_async_callable`` tells the guard which
  rewards TRL awaits (``test_calculate_rewards_calls_self_reward_funcs_by_keyword_at_call_time``,
  ``test_generate_and_score_completions_uses_the_screened_rewards_then_flushes_log_metric``);
- :class:`RankTotal`: a figure a reward logs as a total over the ranks (a judge's calls), which
  :meth:`~suzak.trl_internals.hooks.GRPOHooks.total_over_ranks` writes into TRL's ``_pending_metrics`` as that total
  on every rank, before TRL averages each name over the ranks
  (``test_log_metric_is_flushed_as_each_names_mean_over_every_ranks_values``).

The tests named are in tests/test_trl_contract.py.
"""

from __future__ import annotations

import logging
import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from accelerate.utils import gather_object
from trl.trainer.utils import get_callable_name, is_async_callable

from suzak import SuzakError

logger = logging.getLogger(__name__)

# Keyword arguments GRPOTrainer._calculate_rewards passes to every reward itself (beside the dataset's columns).
REWARD_CALL_KWARGS = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric",
                      "environments")  # fmt: skip


def _discard(*args, **kwargs) -> None:
    """Stands in for TRL's ``log_extra``/``log_metric`` where a reward is called outside a training step (the
    pre-flight, the held-out eval, a reward called again to find its failing rows)."""


def reward_call_kwargs(rows: list[dict], completions: list, log: Callable[..., None] = _discard) -> dict[str, Any]:
    """The keyword arguments GRPOTrainer would call a reward with for ``rows`` and their ``completions``.

    Every dataset column but the prompt goes in as a list, as ``_calculate_rewards`` does; ``completion_ids`` are
    empty (no tokenizer here) and ``log`` stands in for ``log_extra``/``log_metric`` (default: nothing is logged).
    """
    columns = {k: [row[k] for row in rows] for k in rows[0] if k not in ("prompt", "completion", "completion_ids")}
    return {"prompts": [row["prompt"] for row in rows], "completions": completions,
            "completion_ids": [[] for _ in rows], "trainer_state": None, "log_extra": log, "log_metric": log,
            **columns}  # fmt: skip


class RankTotal(float):
    """A figure a reward logs (``log_metric``) as the total over every rank of a batch, not TRL's mean over them:
    ``RankTotal(calls)`` is summed, ``RankTotal(seconds, "max")`` the largest. TRL averages each ``log_metric`` name
    over the values the ranks logged, so a judge's calls under torchrun would read as one rank's share; the trainer
    hands TRL this total on every rank instead (:meth:`.hooks.GRPOHooks.total_over_ranks`). Outside training it is the float.

    >>> RankTotal(3) + 1, RankTotal(2.5, "max").over
    (4.0, 'max')
    """

    over: str

    def __new__(cls, value: float, over: str = "sum"):
        if over not in ("sum", "max"):
            raise ValueError(f"RankTotal over {over!r}: sum or max")
        total = super().__new__(cls, value)
        total.over = over
        return total


def reward_name(func: Callable) -> str:
    """A reward function's name as TRL logs it (``rewards/<name>/mean``; ``trl.trainer.utils.get_callable_name``:
    a ``functools.partial`` by its function's, a callable object by its class's)."""
    return get_callable_name(func)


class RewardFault(SuzakError):
    """A reward failed during a run, or no reward scored a training batch: the run stops (after a checkpoint)."""


@dataclass(frozen=True)
class RewardFailure:
    """One failed reward call, in plain strings (gathered over ranks).

    ``rows`` name the rows the reward fails on alone when ``narrowed``, else every row of the batch.
    """

    reward: str
    what: str  # "raised ValueError", "returned 3 values for 4 completions", ...
    detail: str
    rows: tuple[str, ...]
    narrowed: bool

    def message(self, where: str) -> str:
        """One line: the reward, what it did, where in the run, and the dataset rows to look at.

        >>> RewardFailure("acc", "raised KeyError", "'solution'", ("line 3", "line 3"), True).message("step 2")
        "reward 'acc' raised KeyError at step 2 (dataset row: line 3): 'solution'"
        """
        names = list(dict.fromkeys(self.rows))
        listed = ", ".join(names[:8]) + (f", ... ({len(names)} rows)" if len(names) > 8 else "")
        rows = f"dataset row{'s' * (len(names) > 1)}: {listed}"
        if not self.narrowed:
            rows = f"a batch of {rows}"
        return f"reward {self.reward!r} {self.what} at {where} ({rows})" + (f": {self.detail}" if self.detail else "")


class RewardGuard:
    """The reward functions of one ``_calculate_rewards`` call, wrapped so that bad output never crashes one rank.

    A reward that raises, or returns what TRL cannot turn into a tensor (a wrong count, a string), is recorded as a
    :class:`RewardFailure` and scores None, so every rank reaches TRL's gather and then stops together; the rows a
    synchronous reward fails on are found by calling it on each completion alone. NaN and inf are noted (positions
    per reward in ``nonfinite``). ``rows`` name the batch's rows, one per completion.
    """

    def __init__(self, rows: Sequence[str]):
        self.rows = list(rows)
        self.failures: list[RewardFailure] = []
        self.errors: list[Exception] = []
        self.nonfinite: dict[str, list[int]] = {}

    def wrap(self, func: Callable, name: str) -> Callable:
        """``func`` guarded (async when it is); a reward model (a module TRL runs itself) is left as it is."""
        if isinstance(func, torch.nn.Module):
            return func
        if is_async_callable(func):

            async def guarded_async(**kwargs):
                try:
                    values = await func(**kwargs)
                except Exception as error:  # noqa: BLE001 - recorded, then raised on every rank as a RewardFault
                    return self._raised(name, error, kwargs, probe=None)
                return self._checked(name, values, len(kwargs["completions"]))

            return guarded_async

        def guarded(**kwargs):
            try:
                values = func(**kwargs)
            except Exception as error:  # noqa: BLE001 - recorded, then raised on every rank as a RewardFault
                return self._raised(name, error, kwargs, probe=func)
            return self._checked(name, values, len(kwargs["completions"]))

        return guarded

    def _fail(self, failure: RewardFailure, count: int) -> list[None]:
        self.failures.append(failure)
        return [None] * count

    def _raised(self, name: str, error: Exception, kwargs: dict, probe: Callable | None) -> list[None]:
        alone = _failing_alone(probe, kwargs) if probe is not None else []
        rows = tuple(self.rows[i] for i in alone) or tuple(self.rows)
        self.errors.append(error)
        detail = " ".join(str(error).split())
        detail = detail if len(detail) <= 300 else detail[:299] + "..."
        failure = RewardFailure(name, f"raised {type(error).__name__}", detail, rows, bool(alone))
        return self._fail(failure, len(kwargs["completions"]))

    def _checked(self, name: str, values: Any, count: int) -> Any:
        try:
            values = list(values)
        except TypeError:
            what = f"returned a {type(values).__name__}, not {count} values"
            return self._fail(RewardFailure(name, what, "", tuple(self.rows), False), count)
        if len(values) != count:
            what = f"returned {len(values)} values for {count} completions"
            return self._fail(RewardFailure(name, what, "", tuple(self.rows), False), count)
        for i, value in enumerate(values):
            number = _as_number(value)
            if isinstance(number, str):
                return self._fail(RewardFailure(name, f"returned {number}", "", (self.rows[i],), True), count)
            if number is not None and not math.isfinite(number):
                self.nonfinite.setdefault(name, []).append(i)
        return values


def _as_number(value: Any) -> float | str | None:
    """A reward value as TRL's tensor holds it: a float, None (no score), or why it is neither.

    >>> _as_number(True), _as_number(None), _as_number(float("nan")), _as_number("1.0")
    (1.0, None, nan, "'1.0' (str), not a number or None")
    """
    if value is None:
        return None
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):  # 0-d tensors / numpy scalars
        value = value.item()
    if isinstance(value, numbers.Real):
        return float(value)
    return f"{value!r:.60} ({type(value).__name__}), not a number or None"


def _failing_alone(func: Callable, kwargs: dict) -> list[int]:
    """The completions ``func`` raises on when called on each alone (every per-completion list cut to one entry)."""
    count = len(kwargs["completions"])
    failing = []
    for i in range(count):
        single = {k: v[i : i + 1] if isinstance(v, list) and len(v) == count else v for k, v in kwargs.items()}
        single.update({k: _discard for k in ("log_extra", "log_metric") if k in single})
        try:
            func(**single)
        except Exception:  # noqa: BLE001 - only which completions fail is wanted here
            failing.append(i)
    return failing


def batch_positions(count: int) -> list[str]:
    return [f"batch row {i}" for i in range(count)]


def screened_rewards(trainer, calculate: Callable, inputs, *args, **kwargs):
    """TRL's ``calculate`` (``_calculate_rewards``) with every reward guarded (:class:`RewardGuard`), the rollouts'
    and rows' columns logged, the rewards screened (:func:`screen_rewards`), each :class:`RankTotal` totalled over the
    ranks and the subclass's batch figures logged."""
    rows = trainer._batch_rows if len(trainer._batch_rows) == len(inputs) else batch_positions(len(inputs))
    guard = RewardGuard(rows)
    funcs = trainer.reward_funcs
    trainer.reward_funcs = [guard.wrap(f, name) for f, name in zip(funcs, trainer.reward_func_names, strict=True)]
    try:
        rewards = calculate(inputs, *args, **kwargs)  # (completions of every rank, rewards)
    finally:
        trainer.reward_funcs = funcs
    environments = trainer.environments or []
    if len(environments) == len(inputs):  # one per rollout, in the rollouts' order (TRL draws them per batch)
        for column, values in trainer.rollout_columns(environments).items():
            trainer._log_completion_extra(column, values)
    for column, values in trainer.row_columns(inputs).items():
        trainer._log_completion_extra(column, values)
    rewards = screen_rewards(trainer, rewards, guard, trainer.reward_rows(inputs))
    ids = args[2] if len(args) > 2 else kwargs.get("completion_ids_list")
    lengths = [len(row) for row in ids] if ids is not None and len(ids) == len(inputs) else None
    total_over_ranks(trainer)
    for name, value in trainer.batch_metrics(inputs, rewards, lengths).items():
        trainer._log_metric(name, value)
    return rewards


def total_over_ranks(trainer) -> None:
    """Each :class:`RankTotal` the rewards logged this batch becomes its total over every rank, on every rank
    (TRL flushes ``_pending_metrics`` after scoring as ``sum / count`` over the ranks' values, so it then logs
    that total); a rank that logged none of a name (a mixture's rank without that source's rows) counts 0."""
    pending = trainer._pending_metrics
    mine = sorted({(name, values[0].over) for name, values in pending.items()
                   if values and isinstance(values[0], RankTotal)})  # fmt: skip
    totals = dict(sorted(set(map(tuple, gather_object(mine)))))  # name -> over, alike on every rank
    device = trainer.accelerator.device
    for name, over in totals.items():
        values = [float(value) for value in pending.get(name, [])]
        local = sum(values) if over == "sum" else max(values, default=0.0)
        gathered = trainer.accelerator.gather(torch.tensor([local], dtype=torch.float64, device=device))  # (ranks,)
        total = gathered.sum() if over == "sum" else gathered.max()
        pending[name] = [RankTotal(total.item(), over)]


def screen_rewards(trainer, rewards: torch.Tensor, guard: RewardGuard, scored: torch.Tensor | None = None
                   ) -> torch.Tensor:  # fmt: skip
    """What TRL goes on with after scoring a batch; ``rewards`` (completions of every rank, rewards) is the same
    on every rank, and so is every decision here.

    Stops on a failed reward call (any rank's); logs ``rewards/<name>/nonfinite_frac`` (None, NaN or inf) for each
    reward, over the rows it scores (``scored``: (completions of every rank, rewards), True where a reward scores
    the row; None: every row); in training, stops when no weighted reward scored any completion (TRL would train on advantages of
    0: loss 0, no warning); hands TRL inf as NaN, which it skips like None (inf would turn its group's
    advantages into NaN).
    """
    training = trainer.model.training
    where = (
        f"step {trainer.state.global_step + 1}" if training else f"evaluation after step {trainer.state.global_step}"
    )
    failures = gather_object(guard.failures)
    if failures:
        more = f" (and {len(failures) - 1} more failed reward call(s))" if len(failures) > 1 else ""
        raise RewardFault(failures[0].message(where) + more) from (guard.errors[0] if guard.errors else None)
    say_nonfinite(trainer, guard, where)
    finite = torch.isfinite(rewards)  # (N, R)
    scored = torch.ones_like(finite) if scored is None else scored.to(finite.device)
    for i, name in enumerate(trainer.reward_func_names):
        if scored[:, i].any():
            trainer._log_metric(f"rewards/{name}/nonfinite_frac", 1.0 - finite[scored[:, i], i].float().mean().item())
    weighted = [i for i, weight in enumerate(trainer.reward_weights.tolist()) if weight != 0]
    if training and weighted and not finite[:, weighted].any():
        names = ", ".join(repr(trainer.reward_func_names[i]) for i in weighted)
        raise RewardFault(
            f"no reward scored any completion at {where}: {names} gave None, nan or inf for all {len(rewards)} "
            "completions, so the step would train on nothing (loss 0)"
        )
    return rewards.masked_fill(~finite, float("nan"))


def say_nonfinite(trainer, guard: RewardGuard, where: str) -> None:
    for name, positions in guard.nonfinite.items():
        if name not in trainer._nonfinite_said:
            trainer._nonfinite_said.add(name)
            logger.warning(
                "reward %r returned nan or inf for %d of %d completions at %s (first: %s); such values are "
                "skipped like None and counted in rewards/%s/nonfinite_frac (said once per reward)",
                name, len(positions), len(guard.rows), where, guard.rows[positions[0]], name,
            )  # fmt: skip
