"""Every use of TRL's internals (trl 1.16), in one module; tests/test_trl_contract.py holds a contract test for each.

suzak extends TRL's ``GRPOTrainer`` only through the names below, so a TRL upgrade that moves one of them fails there,
by name, instead of somewhere in a training run:

- :class:`TrainerHooks` (both trainers; :class:`SFTHooks` for SFT) overrides transformers' ``Trainer._save_checkpoint``
  and ``_get_output_dir`` (checkpoints written to a staging folder, renamed when whole), ``_get_grad_norm`` (a nan/inf
  step stopped or skipped before the optimizer applies it) and ``_load_from_checkpoint``/``_issue_warnings_after_load``
  (a resume's weights loaded with the model's key conversion, which transformers 5.17's resume leaves out), and
  ``_load_best_model`` (load_best_model_at_end's load, the same flaw);
- :class:`GRPOHooks` overrides TRL's private hooks ``_generate_and_score_completions``, ``_generate_single_turn``,
  ``_log_completion_extra``, ``_calculate_rewards`` and ``_generate`` (each calls ``super()`` and hands suzak's part
  to a public method of the subclass; ``_generate``'s completion ids and tool masks count the tokens sampled), reads
  the per-rollout tool ``environments``, overrides ``_get_tool_suffix_ids`` (each distinct tool turn rendered once:
  :func:`tool_turn_key`) and calls it (a tool turn's length, for the pre-check; :func:`tool_turn_length` calls it
  before the trainer exists, on the attributes it reads: ``processing_class``, ``chat_template``,
  ``chat_template_kwargs``, ``_is_vlm``, ``_tokenizer``), masks ``tool_mask``'s tool turns out of the stale-sampler
  guard, calls
  ``_tokenize_prompts`` once per distinct prompt of a batch (with ``environment_factories``, per prompt and
  ``_batch_environments`` entry: :func:`prompt_keys`, :func:`expand_tokenized_prompts`), and for video rows (TRL has no video path) ``_tokenize_prompts`` (the clips' metadata
  through ``chat_template_kwargs``; a batch's rows without images as ``[]`` for the processor, None for vLLM),
  ``_compute_loss`` and ``_get_per_token_logps_and_entropies`` (each chunk's video tensors added to the model call,
  image marks aligned, no empty image tensors: :func:`feeding_videos`), reads the scored batch from ``_logs``, logs
  through ``_log_metric``, saves a checkpoint
  with transformers' ``Trainer._save_checkpoint``, and sets the vision-token suppression where TRL's two generation
  paths read it (``generation_config``/``generation_kwargs`` for HF, ``vllm_generation.generation_kwargs`` for vLLM);
- :class:`DynamicSampling` / :func:`merge_scored_rows`: rounds of ``_generate_and_score_completions`` merged into
  one scored batch, field by field of its output (TRL's ``split_pixel_values_by_grid`` and
  ``unsplit_pixel_values_by_grid`` for the images; a field it does not know stops by name), each group's reward std
  with TRL's ``nanstd``;
- :class:`RewardFault`: what ``_calculate_rewards`` raises, on every rank at once, when a reward raises or returns
  what TRL cannot use (each recorded by :class:`RewardGuard`), or when no reward scored any completion of a
  training batch;
- :data:`REWARD_CALL_KWARGS` and :func:`reward_call_kwargs`: the keyword arguments ``GRPOTrainer`` calls every reward
  function with, which the reward pre-flight reproduces and recipes must not set;
- :class:`RankTotal`: a figure a reward logs as a total over the ranks (a judge's calls), which
  :meth:`GRPOHooks.total_over_ranks` writes into TRL's ``_pending_metrics`` as that total on every rank, before TRL
  averages each name over the ranks;
- :func:`completion_rows`: one row per completion of the newest batch in TRL's ``_logs`` layout;
- :class:`SamplerGuard` / :class:`StaleSampler`: the stale-sampler guard, which scores a few of vLLM's sampled
  completions with the policy, from the batch ``_generate_and_score_completions`` returns (its ids, masks, images
  and vLLM's ``sampling_per_token_logps``), and compares;
- :func:`vllm_requests_with_videos`: the requests TRL's colocated ``VLLMGeneration.generate`` hands ``vllm.LLM.generate``
  (``{"prompt_token_ids", "multi_modal_data"}``, one per prompt), each given its row's video;
- :func:`forget_vision_features_on_sync`: TRL's ``VLLMGeneration.sync_weights`` followed by vLLM's
  ``reset_encoder_cache`` (vLLM reuses an image's vision features across requests, from older weights);
- :func:`drop_earlier_autocast`: accelerate's ``_original_forward``, the forward an earlier trainer's mixed-precision
  wrapper replaced (taken off before this run's trainer wraps the model);
- :func:`tool_call_parser`: TRL's response templates for Qwen's two tool-call forms (``trl.chat_template_utils``'s
  ``qwen3_template``, the ``<tool_call>`` JSON form, and ``qwen3_5_template``, the XML form), which
  ``tokenizer.parse_response`` reads the model's calls with;
- :func:`parse_turn`, :func:`environment_tools` and :func:`tool_message`: how ``GRPOTrainer._tool_call_loop`` reads a
  turn (``trl.chat_template_utils.parse_response``), which of an environment's methods it offers as tools, and the
  tool turn it appends for a result or a failed call (``{"error": ...}``), for the evaluation's tool loop
  (:mod:`suzak.eval.tool_loop`) to run the same loop outside the trainer;
- :func:`score_labelled_positions_only`: ``trl.trainer.utils._use_triton``, which TRL's fused LM head
  (``add_fused_lm_head``'s forward) asks whether to score only the positions with a label (Triton devices) or every
  position (elsewhere, for compiled backends' fixed shapes): on the CPU, only the labelled ones too;
- :func:`colocated_vllm_on_cpu` / :func:`keep_vllm_cpu_weights_live`: vLLM's own internals, on its CPU platform
  only: the unquantized linear and embedding layers keep computing from the weights TRL's weight sync writes into
  (vLLM packs a copy at load, ``vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm``), and TRL's
  ``vllm.LLM`` (``trl.generation.vllm_generation.LLM``) gets the policy's dtype.

Everything here imports TRL and nothing of suzak but ``SuzakError``, :mod:`suzak.scoring.parsing`, :mod:`suzak.media.vision` and
:mod:`suzak.media.video` (leaves).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import numbers
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from accelerate.utils import gather_object
from trl import GRPOTrainer, SFTTrainer
from trl.trainer.utils import (
    get_callable_name,
    is_async_callable,
    nanstd,
    split_pixel_values_by_grid,
    unsplit_pixel_values_by_grid,
)

from suzak import SuzakError
from suzak.media.video import Clip, processor_kwargs, video_of, vllm_video
from suzak.media.vision import collapse_runs, collapse_video_blocks
from suzak.scoring.parsing import message_text

__all__ = [
    "REWARD_CALL_KWARGS",
    "GRPOHooks",
    "NonFiniteStep",
    "STAGING",
    "TrainerHooks",
    "RewardFailure",
    "RewardFault",
    "RankTotal",
    "RewardGuard",
    "SFTHooks",
    "SamplerGuard",
    "StaleSampler",
    "DynamicSampling",
    "colocated_vllm_on_cpu",
    "drop_earlier_autocast",
    "environment_tools",
    "completion_rows",
    "feeding_videos",
    "forget_vision_features_on_sync",
    "keep_adapters_fp32",
    "keep_vllm_cpu_weights_live",
    "merge_scored_rows",
    "parse_turn",
    "reward_call_kwargs",
    "reward_name",
    "sampling_logps",
    "score_labelled_positions_only",
    "tool_call_parser",
    "tool_message",
    "tool_turn_key",
    "tool_turn_length",
    "vllm_requests_with_videos",
]

logger = logging.getLogger(__name__)

# Keyword arguments GRPOTrainer._calculate_rewards passes to every reward itself (beside the dataset's columns).
REWARD_CALL_KWARGS = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric",
                      "environments")  # fmt: skip

# The key of the scored batch that carries each row's video tensors (a list, one entry per row: TRL shuffles and
# splits lists along the rows with everything else).
VIDEO_FIELDS = "suzak_video_fields"


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
    hands TRL this total on every rank instead (:meth:`GRPOHooks.total_over_ranks`). Outside training it is the float.

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


def _batch_positions(count: int) -> list[str]:
    return [f"batch row {i}" for i in range(count)]


class StaleSampler(SuzakError):
    """vLLM's log-probabilities of its own samples are far from the policy's: it samples from other weights (or other
    inputs) than the ones being trained. The run stops (after a checkpoint)."""


@dataclass
class SamplerGuard:
    """Stops a run whose vLLM sampler does not follow the policy.

    A weight sync that misses a layer (a wrong name, a layer vLLM computes from a copy made at load, a skipped
    tensor) raises nothing: vLLM keeps sampling from old weights and GRPO trains on their samples. At the first
    generation after the first weight sync, then every ``every`` steps, the trainer scores ``rows`` of vLLM's sampled
    completions with the policy, under vLLM's sampling rule (the temperature, and the tokens generation may not
    sample taken out and the rest renormalised, as vLLM's processed log-probabilities are), and compares them with
    the log-probabilities vLLM returned for them: past ``tolerance`` (mean nats per completion token, over ranks), the
    run stops. Noise measures ~1e-7 with both sides in fp32; a sampler whose LM head stayed at the initial weights
    drifted past 0.1 by step 31 of the demo recipe (docs/benchmarks.md, "Stale-sampler guard").

    TRL's own ``sampling/sampling_logp_difference`` compares with the policy's unrestricted distribution, so it also
    counts the mass the policy puts on the vision placeholders vLLM may not sample (which sampling never penalises:
    a tiny policy here once greedily answered ``<|image_pad|>`` on half its prompts), and every top-k/top-p/min-p cut.
    With ``repetition_penalty`` other than 1 the check is off (said once): vLLM's penalty depends on each prefix.
    """

    every: int = 10  # steps between checks after the first; 0 turns the guard off
    tolerance: float = 0.1
    rows: int = 16  # completions scored per rank at a check, spread over the batch's prompts
    checked_at: int | None = None  # the optimizer step of the last check
    gaps: list[tuple[int, float, float, float]] = field(default_factory=list)  # (step, mean, max, suppressed mass)

    def due(self, step: int) -> bool:
        return self.every > 0 and (self.checked_at is None or step - self.checked_at >= self.every)

    def check(self, step: int, mean_gap: float, max_gap: float, suppressed: float = 0.0) -> None:
        """Record the gap of the batch generated for optimizer step ``step``; past the tolerance, raise."""
        first = self.checked_at is None
        self.checked_at = step
        self.gaps.append((step, mean_gap, max_gap, suppressed))
        logger.log(logging.INFO if first else logging.DEBUG,
                   "sampler check at step %d: mean |log p(vLLM) - log p(policy)| %.2g per token (max %.2g), the "
                   "policy's mass on the suppressed tokens %.2g; next every %d steps (sampler_check/* in the metrics)",
                   step, mean_gap, max_gap, suppressed, self.every)  # fmt: skip
        if not mean_gap > self.tolerance:  # NaN (no token scored) passes
            return
        gap = (f"mean |log p(vLLM) - log p(policy)| = {mean_gap:.3f} per completion token at step {step} (max "
               f"{max_gap:.2f}; tolerance {self.tolerance:g}, sampler_logp_tolerance)")  # fmt: skip
        if first:
            cause = ("before any update the two already disagree: vLLM sees other prompt tokens or images than "
                     "training (an image placeholder expanded twice, TRL #6294; another pixel budget), or another "
                     "model or dtype")  # fmt: skip
        else:
            cause = ("vLLM samples from weights the sync did not reach (a layer vLLM computes from a copy made at "
                     "load, weights under names vLLM does not load, a skipped layer): GRPO would train on samples "
                     "of the old policy")  # fmt: skip
        raise StaleSampler(f"vLLM's sampler does not follow the policy: {gap}; {cause}")


@dataclass
class DynamicSampling:
    """DAPO's dynamic sampling (Yu et al. 2025, "DAPO", section 3.2; TRL lacks it: huggingface/trl#3708).

    A group whose completions all score alike (reward std at most ``min_std``; a group no reward scored) has zero
    advantage and teaches nothing. After TRL scores a generation batch, such groups are dropped and new prompts of the
    training set generated, scored and kept in their place, up to ``max_rounds`` extra rounds a batch; a batch still
    short of groups then trains on what it has: the rest of it is dropped groups with their completions masked out
    (no loss, no KL), and it is said in the log. Each rank keeps its own groups (a rank's generation batch holds whole
    groups); every rank runs the same rounds, decided from the rewards TRL gathers over ranks.

    >>> DynamicSampling().kept(torch.tensor([0.0, 0.5, float("nan")])).tolist()
    [False, True, False]
    """

    min_std: float = 0.0
    max_rounds: int = 3

    def kept(self, group_std: torch.Tensor) -> torch.Tensor:
        """Which groups carry a signal: reward std above ``min_std`` (NaN, a group no reward scored: dropped)."""
        return group_std > self.min_std


def shuffle_groups(batch: dict[str, Any], size: int) -> dict[str, Any]:
    """TRL's shuffle of a scored generation batch before it cuts it into micro-batches (``shuffle_sequence_dict``:
    every sequence of ``batch`` permuted in unison), by whole groups: the ``size`` consecutive rows of a group stay
    together and in order, the groups in the order TRL's own row permutation (the same draw from torch's generator)
    first reaches one of their rows. A micro-batch of a multiple of ``size`` rows then holds whole groups, whose
    rows show one image: the vision tower encodes it once (:mod:`suzak.models.vision_reuse`). A batch that is not
    whole groups is shuffled by rows, as TRL does.

    >>> torch.manual_seed(0) and None
    >>> shuffle_groups({"row": list(range(6)), "none": None}, 2)["row"]
    [2, 3, 4, 5, 0, 1]
    """
    count = len(next(value for value in batch.values() if value is not None))
    permutation = torch.randperm(count)  # as TRL draws it, so the generator's next draws are the unshuffled run's
    if size > 1 and count % size == 0:
        first = torch.full((count // size,), count)
        first.scatter_reduce_(0, permutation // size, torch.arange(count), reduce="amin")
        permutation = (torch.argsort(first)[:, None] * size + torch.arange(size)).flatten()

    def permuted(value: Any) -> Any:
        if value is None or (isinstance(value, torch.Tensor) and value.ndim == 0):
            return value
        if isinstance(value, torch.Tensor):
            return value[permutation]
        return [value[i] for i in permutation]

    return {key: permuted(value) for key, value in batch.items()}


@contextmanager
def groups_kept_together(size: int):
    """While TRL prepares a generation batch, its shuffle is :func:`shuffle_groups` (groups of ``size`` rows)."""
    from trl.trainer import grpo_trainer

    trls = grpo_trainer.shuffle_sequence_dict
    grpo_trainer.shuffle_sequence_dict = lambda batch: shuffle_groups(batch, size)
    try:
        yield
    finally:
        grpo_trainer.shuffle_sequence_dict = trls


def weighted_rewards(rewards_per_func: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Each completion's reward as TRL sums it (the weighted functions that scored it; NaN where none did).

    >>> weighted_rewards(torch.tensor([[1.0, float("nan")], [float("nan")] * 2]), torch.tensor([0.5, 1.0])).tolist()
    [0.5, nan]
    """
    rewards = (rewards_per_func * weights.to(rewards_per_func.device)[None]).nansum(dim=1)
    rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
    return rewards


ROUNDOFF = 1e-6  # a group's reward std at most this share of its largest reward is float32 round-off: zero


def group_reward_std(rewards_per_func: torch.Tensor, weights: torch.Tensor, size: int) -> torch.Tensor:
    """Each group's std of the weighted reward, over the completions some reward scored (TRL's own reward sum; NaN
    for a group with fewer than two scored completions). A std within float32 round-off of the group's rewards
    (:data:`ROUNDOFF` of its largest magnitude) is 0: six rewards of 0.3 sum to a std of ~3e-8 in float32, which
    no ``dynamic_sampling_min_std`` (default 0) would drop otherwise (only sums of powers of two are exact).

    >>> group_reward_std(torch.tensor([[1.0], [1.0], [0.0], [1.0]]), torch.tensor([1.0]), 2).tolist()
    [0.0, 0.7071067690849304]
    >>> group_reward_std(torch.full((6, 1), 0.3), torch.tensor([1.0]), 6).tolist()
    [0.0]
    """
    groups = weighted_rewards(rewards_per_func, weights).view(-1, size)
    std = nanstd(groups, dim=1)
    scale = groups.abs().nan_to_num(nan=0.0).amax(dim=1)
    return torch.where(std <= ROUNDOFF * scale, torch.zeros_like(std), std)


# How each 2-D field of TRL's scored batch is padded when batches of different widths are merged (prompt fields on
# the left, completion fields on the right, fields over the whole sequence both ways), and with what ("pad": the
# tokenizer's pad id); fields of one entry a row follow their rows. Anything else stops the merge by name.
PROMPT_FIELDS = {"prompt_ids": "pad", "prompt_mask": 0}
COMPLETION_FIELDS = {"completion_ids": "pad", "completion_mask": 0, "tool_mask": 1, "old_per_token_logps": 0.0,
                     "ref_per_token_logps": 0.0, "sampling_per_token_logps": 0.0, "importance_sampling_ratio": 1.0}  # fmt: skip
SEQUENCE_FIELDS = ("mm_token_type_ids", "token_type_ids")
ROW_FIELDS = ("advantages", "num_images", "pixel_values", "image_grid_thw", VIDEO_FIELDS)


def _widened(name: str, value: Any, prompt: tuple[int, int], completion: tuple[int, int], pad_id: int) -> Any:
    """One field of a scored batch padded from (prompt, completion) widths ``(own, target)``."""
    if not isinstance(value, torch.Tensor) or value.ndim < 2:
        return value
    left, right = prompt[1] - prompt[0], completion[1] - completion[0]
    if name in PROMPT_FIELDS:
        fill = PROMPT_FIELDS[name]
        return torch.nn.functional.pad(value, (left, 0), value=pad_id if fill == "pad" else fill)
    if name in COMPLETION_FIELDS:
        if value.size(1) == 1 and completion[0] != 1:  # a sequence-level ratio: one per row
            return value
        fill = COMPLETION_FIELDS[name]
        return torch.nn.functional.pad(value, (0, right), value=pad_id if fill == "pad" else fill)
    # over the prompt and the completion, ending where the ids end: a video round's prompt part is narrower than its
    # prompt ids (TRL's marks come from prompts whose clips were not expanded; feeding_videos aligns them right), so
    # the split is the completion's width from the right, and every row ends up the merged ids' full width
    split = value.size(1) - completion[0]
    head = torch.nn.functional.pad(value[:, :split], (prompt[1] - split, 0))
    return torch.cat([head, torch.nn.functional.pad(value[:, split:], (0, right))], dim=1)


def merge_scored_rows(batches: list[dict[str, Any]], rows: list[tuple[int, int]], masked: Sequence[int],
                      pad_id: int) -> dict[str, Any]:  # fmt: skip
    """One scored batch (``_generate_and_score_completions``' output) of ``rows``, each ``(batch, row)`` of
    ``batches``, padded to common widths; the rows at positions ``masked`` of the result keep no completion token in
    the loss: ``tool_mask`` 0 where the batch has one (tools), else ``completion_mask`` 0. Not the attention of a
    row whose completion may hold images: the Qwen models' ``get_rope_index`` skips attention-0 tokens but takes
    image grids from one iterator over the micro-batch, so a masked row's crops would shift every later row's image
    positions (:func:`masked_out_of_the_loss`). ``num_items_in_batch`` is left to the caller (a sum over ranks).
    """
    names = list(dict.fromkeys(name for batch in batches for name in batch))  # every round's, first seen first
    known = {*PROMPT_FIELDS, *COMPLETION_FIELDS, *SEQUENCE_FIELDS, *ROW_FIELDS, "num_items_in_batch"}
    if unknown := [name for name in names if name not in known]:
        raise SuzakError(f"dynamic sampling cannot merge TRL's scored-batch field(s) {unknown} (this model's inputs)")
    split = [dict(split_pixel_values_by_grid(batch)) for batch in batches]  # filled below: copies
    for name in names:  # a round without images (or videos) lacks their fields: its rows get empty ones
        like = next(batch[name] for batch in split if name in batch)
        for batch in split:
            if name not in batch:
                batch[name] = _absent(name, like, batch)
    prompt = max(batch["prompt_ids"].size(1) for batch in batches)
    completion = max(batch["completion_ids"].size(1) for batch in batches)
    merged: dict[str, Any] = {}
    for name in names:
        if name == "num_items_in_batch":
            continue
        parts = [_widened(name, batch[name], (batch["prompt_ids"].size(1), prompt),
                          (batch["completion_ids"].size(1), completion), pad_id) for batch in split]  # fmt: skip
        picked = [parts[b][r] for b, r in rows]
        merged[name] = torch.stack(picked) if isinstance(parts[0], torch.Tensor) else picked
    if masked:  # out of the loss; with tools through the loss mask only (masked_out_of_the_loss)
        index = torch.tensor(list(masked), device=merged["completion_mask"].device)
        field = "tool_mask" if "tool_mask" in merged else "completion_mask"
        merged[field] = merged[field].index_fill(0, index, 0)
    if VIDEO_FIELDS in merged and all(video is None for video in merged[VIDEO_FIELDS]):
        del merged[VIDEO_FIELDS]  # kept rows without a video: a batch without video, as the trainer builds it
    return unsplit_pixel_values_by_grid(merged)


def masked_out_of_the_loss(batch: dict[str, Any], eos_ids: Sequence[int], pad_id: int) -> dict[str, Any]:
    """TRL's ``mask_truncated_completions`` for a scored batch of tool rollouts: a completion that ends in neither EOS
    nor padding leaves the loss through ``tool_mask``, its attention kept. TRL zeroes ``completion_mask``, from which
    it builds the attention mask, and the Qwen models' ``get_rope_index`` drops attention-0 tokens while it takes
    image grids from one iterator over the micro-batch: a truncated row that zoomed would leave its crops' grids
    unread and shift the image positions of every row after it (a shape error, or silently wrong positions).

    >>> batch = {"completion_ids": torch.tensor([[5, 6, 7], [5, 2, 0]]), "completion_mask": torch.tensor([[1, 1, 1],
    ...          [1, 1, 0]]), "tool_mask": torch.ones(2, 3, dtype=torch.long)}
    >>> masked_out_of_the_loss(batch, [2], 0)["tool_mask"].tolist()  # row 0 ran out of tokens; row 1 ended (EOS 2)
    [[0, 0, 0], [1, 1, 1]]
    """
    ids, mask = batch["completion_ids"], batch["completion_mask"]
    lengths = mask.sum(1)
    last = ids.gather(1, (lengths - 1).clamp(min=0)[:, None])[:, 0]
    ends = torch.tensor([*eos_ids, pad_id], device=ids.device)
    truncated = (lengths > 0) & ~torch.isin(last, ends)
    return {**batch, "tool_mask": batch["tool_mask"] * (~truncated)[:, None].to(batch["tool_mask"].dtype)}


def trained_groups(signals: Sequence[torch.Tensor], rank: int, groups: int) -> list[tuple[int, int]]:
    """(round, group) of the groups ``rank`` trains on: its first ``groups`` with a signal, in round order, given each
    round's (ranks, groups) decisions (the merge keeps these; the reward figures are theirs).

    >>> trained_groups([torch.tensor([[False, True]]), torch.tensor([[True, True]])], rank=0, groups=2)
    [(0, 1), (1, 0)]
    """
    return [(r, g) for r, signal in enumerate(signals) for g in range(groups) if signal[rank, g]][:groups]


def _tensor_bytes(value: Any) -> int:
    """Bytes of the tensors in ``value`` (a scored batch: tensors, lists and dicts of them).

    >>> _tensor_bytes({"a": torch.zeros(4, dtype=torch.float32), "b": [torch.zeros(2, dtype=torch.int64), None]})
    32
    """
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(_tensor_bytes(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(_tensor_bytes(v) for v in value)
    return 0


def _absent(name: str, like: Any, batch: dict[str, Any]) -> Any:
    """The field ``name`` for the rows of a scored ``batch`` that has none (a round of rows without images, or
    without videos), shaped as another round's (``like``, split per row where it is a list): no image, no video,
    zeros for a per-token type field."""
    rows = batch["prompt_ids"].size(0)
    if name == "num_images":
        return [0] * rows
    if name == VIDEO_FIELDS:
        return [None] * rows
    if name in ("pixel_values", "image_grid_thw"):  # split per row: each row's (0, ...) slice
        return [like[0].new_zeros((0, *like[0].shape[1:])) for _ in range(rows)]
    if name in SEQUENCE_FIELDS:  # over the prompt and the completion: no vision token
        width = batch["prompt_ids"].size(1) + batch["completion_ids"].size(1)
        return like.new_zeros((rows, width))
    raise SuzakError(f"dynamic sampling: a generation round returned no {name!r} where another did; suzak cannot "
                     "fill it for that round's rows")  # fmt: skip


def sampling_logps(logits: torch.Tensor, *, temperature: float, logit_bias: Mapping | None = None, top_k: int = 0,
                   top_p: float = 1.0, min_p: float | None = None) -> torch.Tensor:  # fmt: skip
    """Log-probabilities over the vocabulary as vLLM's sampler reports them (``processed_logprobs``): the logit bias,
    the temperature, then min-p, top-k and top-p cuts (vLLM's order), renormalised. ``logits``: (T, V).

    >>> logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    >>> sampling_logps(logits, temperature=1.0, logit_bias={0: -100.0}, top_k=2).exp().round(decimals=3)
    tensor([[0.0000, 0.7310, 0.2690, 0.0000]])
    """
    logits = logits.float().clone()
    for token, bias in (logit_bias or {}).items():
        logits[:, int(token)] += bias
    logits = logits / temperature
    if min_p:
        probs = logits.softmax(-1)
        logits = logits.masked_fill(probs < min_p * probs.max(-1, keepdim=True).values, -torch.inf)
    if top_k and top_k > 0:
        kth = logits.topk(min(top_k, logits.size(-1)), dim=-1).values[:, -1:]  # (T, 1)
        logits = logits.masked_fill(logits < kth, -torch.inf)
    if top_p < 1.0:
        ordered, order = logits.sort(-1, descending=True)
        before = ordered.softmax(-1).cumsum(-1) - ordered.softmax(-1)  # mass of the tokens ranked above each
        logits = logits.scatter(-1, order, ordered.masked_fill(before > top_p, -torch.inf))
    return logits.log_softmax(-1)


def _row_model_inputs(batch: dict[str, Any], row: int) -> dict[str, Any]:
    """The policy's forward inputs for one row of TRL's scored batch (``_generate_and_score_completions``'s output):
    prompt + completion ids and mask, and the row's images (Qwen VL layout: ``pixel_values`` rows per image are its
    ``image_grid_thw`` product)."""
    ids = torch.cat([batch["prompt_ids"][row], batch["completion_ids"][row]])[None]  # (1, P + C)
    mask = torch.cat([batch["prompt_mask"][row], batch["completion_mask"][row]])[None]
    inputs: dict[str, Any] = {"input_ids": ids, "attention_mask": mask}
    if "mm_token_type_ids" in batch:
        inputs["mm_token_type_ids"] = batch["mm_token_type_ids"][row : row + 1]
    counts = list(batch.get("num_images") or [])
    if "image_grid_thw" in batch and "pixel_values" in batch and counts[row]:  # (a video row has none)
        first, count = sum(counts[:row]), counts[row]
        rows_per_image = batch["image_grid_thw"].prod(dim=-1).tolist()  # (images,)
        start = sum(rows_per_image[:first])
        inputs["pixel_values"] = batch["pixel_values"][start : start + sum(rows_per_image[first : first + count])]
        inputs["image_grid_thw"] = batch["image_grid_thw"][first : first + count]
    return inputs


def drop_earlier_autocast(model: Any) -> bool:
    """Take an earlier trainer's mixed-precision wrapper off ``model``'s forward (accelerate keeps the original as
    ``_original_forward``); returns whether there was one.

    A model trained in the same process before (an SFT prior: TRL's ``SFTConfig`` turns bf16 on even on a CPU) keeps
    running its forward under that trainer's bf16 autocast, whatever this run's precision: the policy then scores
    in bf16 what colocated vLLM sampled in fp32 (measured: 0.03-0.09 nats on uncertain tokens). This run's own
    accelerator wraps it again when its precision asks for it.
    """
    if not isinstance(model, torch.nn.Module) or "_original_forward" not in vars(model):
        return False
    from accelerate.utils import extract_model_from_parallel

    extract_model_from_parallel(model, keep_fp32_wrapper=False)
    logger.info("the model came with an earlier trainer's autocast wrapper on its forward; removed, so this run's "
                "precision is its own")  # fmt: skip
    return True


def tool_call_parser(form: str) -> dict:
    """TRL's response template for a tool-call ``form``: ``json`` (Qwen2.5, Qwen3, Qwen3-VL and suzak's Qwen2-VL /
    Qwen2.5-VL template) or ``xml`` (Qwen3.5)."""
    from trl import chat_template_utils

    return {"json": chat_template_utils.qwen3_template, "xml": chat_template_utils.qwen3_5_template}[form]


def parse_turn(tokenizer: Any, ids: list[int], prefix: list[int], tools: list) -> dict:
    """One generated turn as the assistant message TRL's tool loop reads it (``content``, ``tool_calls``): its ids
    parsed by ``parse_response`` with the tokenizer's response template, after the prompt ids ``prefix``, the
    arguments typed by ``tools``' schemas (an unparsable call falls back to plain text, as in training)."""
    from trl.chat_template_utils import parse_response

    if not ids:
        return {"role": "assistant", "content": ""}
    return parse_response(tokenizer, ids, prefix=prefix, tools=tools)


def environment_tools(environment: Any) -> list[Callable]:
    """The methods of ``environment`` that TRL offers the policy as tools: its class's public functions but ``reset``
    and ``get_reward``, in name order (``GRPOTrainer``'s rule, per rollout)."""
    import inspect

    return [getattr(environment, name) for name, _ in inspect.getmembers(type(environment), predicate=inspect.isfunction)
            if name not in ("reset", "get_reward") and not name.startswith("_")]  # fmt: skip


def tool_message(name: str, result: Any = None, error: Exception | str | None = None) -> dict:
    """The tool turn TRL appends for a call: a list of content blocks (an image crop) as it is, anything else as its
    ``str``; a failed call as ``str({"error": ...})``, the text the policy reads in training.

    >>> tool_message("zoom", error=ValueError("zoom: no image"))
    {'role': 'tool', 'name': 'zoom', 'content': "{'error': 'zoom: no image'}"}
    """
    if error is not None:
        result = {"error": str(error)}
    return {"role": "tool", "name": name, "content": result if isinstance(result, list) else str(result)}


def tool_turn_key(tool_messages: list[dict], chat_template_kwargs: Mapping | None) -> tuple | None:
    """What the tokens of a tool turn (``GRPOTrainer._get_tool_suffix_ids``) depend on: each message's role, name and
    texts, an image by its size alone (a Qwen processor gives an image one token per patch of its size, resized by
    size), and the template's keyword arguments; None where a message holds anything else (then nothing is reused).

    >>> from PIL import Image
    >>> turn = lambda size: [{"role": "tool", "name": "zoom", "content": [{"type": "image", "image": Image.new("RGB", size)}]}]
    >>> tool_turn_key(turn((56, 28)), {}) == tool_turn_key(turn((56, 28)), {}) != tool_turn_key(turn((28, 56)), {})
    True
    >>> tool_turn_key([{"role": "tool", "name": "zoom", "content": [{"type": "image", "image": "crop.png"}]}], {}) is None
    True
    """
    from PIL import Image

    key = []
    for message in tool_messages:
        if not set(message) <= {"role", "name", "content"}:
            return None
        content = message.get("content")
        if isinstance(content, list):
            blocks = []
            for block in content:
                if block.get("type") == "text" and set(block) == {"type", "text"}:
                    blocks.append(("text", block["text"]))
                elif (
                    block.get("type") == "image"
                    and set(block) == {"type", "image"}
                    and isinstance(block["image"], Image.Image)
                ):
                    blocks.append(("image", block["image"].size))
                else:
                    return None
            content = tuple(blocks)
        elif not isinstance(content, str):
            return None
        key.append((message.get("role"), message.get("name"), content))
    return tuple(key), repr(chat_template_kwargs)


def tool_turn_length(processing_class: Any, tool_messages: list[dict], chat_template_kwargs: dict | None = None) -> int:
    """What :meth:`GRPOHooks.tool_turn_length` counts, before any trainer or weights exist: TRL's own
    ``GRPOTrainer._get_tool_suffix_ids`` on the attributes it reads, set as ``GRPOTrainer.__init__`` sets them for a
    run with tools on a VLM (the processor's template, or TRL's prefix-preserving training template in its place).
    ``processing_class`` must already render tool calls (:func:`suzak.models.tool_calling.prepare_tool_calling`)."""
    from types import SimpleNamespace

    from trl.chat_template_utils import get_training_chat_template, is_chat_template_prefix_preserving

    preserving = is_chat_template_prefix_preserving(processing_class)
    reader = SimpleNamespace(
        processing_class=processing_class,
        chat_template=None if preserving else get_training_chat_template(processing_class),
        chat_template_kwargs=chat_template_kwargs or {},
        _is_vlm=True,
        _tokenizer=processing_class.tokenizer,
    )
    return len(GRPOTrainer._get_tool_suffix_ids(reader, tool_messages))


def forget_vision_features_on_sync(generation, main_process: bool) -> None:
    """After each of TRL's weight syncs, make vLLM drop the vision encoder outputs it keeps across requests.

    vLLM caches an image's encoder output by the image's hash and reuses it for any later request with the same image;
    TRL's ``sync_weights`` resets the prefix cache but not this one, so once an image comes back (the second epoch,
    or any repeated image) vLLM's prompt carries vision features of the weights of the step the image was first
    seen, silently. Found here by the stale-sampler guard: the self-test's gap jumped from 1e-7 to 0.19 nats per
    token at step 131, five steps after its 2,000 images started their second epoch. vLLM documents
    ``reset_encoder_cache`` for exactly this ("when model weights are updated"); the server takes it over HTTP in the
    dev mode ``trl vllm-serve`` runs vLLM in.
    """
    sync = generation.sync_weights

    def sync_and_forget() -> None:
        sync()
        if generation.mode == "colocate":
            generation.llm.llm_engine.reset_encoder_cache()
        elif main_process:
            client = generation.vllm_client
            response = client.session.post(f"{client.base_url}/reset_encoder_cache")
            if response.status_code != 200:
                raise SuzakError(f"the vLLM server at {client.base_url} refused /reset_encoder_cache "
                                 f"({response.status_code}): it would reuse vision features of older weights")  # fmt: skip

    generation.sync_weights = sync_and_forget


def score_labelled_positions_only() -> None:
    """TRL's fused LM head scores only the positions with a label on the CPU too (patched once, for the process).

    TRL 1.16's ``add_fused_lm_head`` projects every position of a batch through the LM head, prompt and padding
    included, on devices without Triton (``compact = _use_triton(device)``: elsewhere a changing count of labelled
    positions would recompile a compiled backend's tiles), and masks the results afterwards. On the CPU, in eager
    PyTorch, nothing recompiles, and a GRPO batch's prompts are most of its positions: the forward and backward of the
    LM head on the prompt were ~40 % of a self-test prior's SFT step on the tiny model. Every labelled position gets
    the same log-probability and entropy either way (each row of the projection is its own); the other positions are
    0 in both. GPUs (Triton) are unchanged, and so is a CPU forward that torch.compile traces (``torch_compile``: there
    TRL's fixed shapes avoid a recompile per batch).
    """
    import trl.trainer.utils as trl_utils

    tritons = trl_utils._use_triton
    if getattr(tritons, "compact_on_cpu", False):
        return

    def compact(device: torch.device) -> bool:
        return (device.type == "cpu" and not torch.compiler.is_compiling()) or tritons(device)

    compact.compact_on_cpu = True
    compact.trl_use_triton = tritons
    trl_utils._use_triton = compact


@contextmanager
def colocated_vllm_on_cpu(model: torch.nn.Module):
    """While TRL builds its colocated ``vllm.LLM``: on vLLM's CPU platform, make it a sampler of the policy.

    - every linear layer and the LM head keep computing from the weights TRL's sync writes into
      (:func:`keep_vllm_cpu_weights_live`);
    - vLLM runs the policy's dtype: left to ``dtype="auto"`` it downcasts an fp32 checkpoint (the CPU policy's) to
      bf16 and samples from a rounded copy of the policy (TRL passes no dtype; on a GPU the policy is bf16 anyway);
    - and eager, as suzak's evaluation engine does there (:func:`vllm_cpu_settings`: the compile
      took over half the engine's start and gained nothing a step);
    - a model with Gated DeltaNet layers (Qwen3.5) is one line: vLLM 0.24's CPU kernel for them fails on a dtype
      mismatch, and on AMX CPUs it prepacks their convolution weights where the sync cannot write.

    Elsewhere (a GPU platform) nothing changes.
    """
    try:
        from vllm.platforms import current_platform
    except ImportError:  # TRL says vLLM is missing itself
        current_platform = None
    if current_platform is None or not current_platform.is_cpu():
        yield
        return
    config = getattr(model, "config", None)
    text_config = getattr(config, "text_config", config)
    if "linear_attention" in (getattr(text_config, "layer_types", None) or []):
        raise SuzakError(f"use_vllm on the CPU: vLLM {_vllm_version()}'s CPU build cannot run {config.model_type}'s "
                         "Gated DeltaNet (linear attention) layers (its CPU kernel stops on a dtype mismatch, and on "
                         "AMX CPUs it prepacks their weights out of the weight sync's reach): train without vLLM on "
                         "a CPU (use_vllm false), or with vLLM on a GPU")  # fmt: skip
    keep_vllm_cpu_weights_live()
    import trl.generation.vllm_generation as generation

    build = generation.LLM
    dtype = next(model.parameters()).dtype

    def build_in_policy_dtype(*args, **kwargs):
        for key, value in {"dtype": dtype, **vllm_cpu_settings()}.items():
            kwargs.setdefault(key, value)
        return build(*args, **kwargs)

    generation.LLM = build_in_policy_dtype
    logger.info("vLLM on the CPU samples in the policy's dtype (%s), eager (no torch.compile at start-up)", dtype)
    try:
        yield
    finally:
        generation.LLM = build


def vllm_cpu_settings() -> dict[str, Any]:
    """``vllm.LLM`` settings suzak gives vLLM's CPU build (the engine of CPU machines: tests, demos); none elsewhere.

    ``enforce_eager``: at start-up vLLM compiles the model with ``torch.compile``, which on the CPU took ~12 s of a
    ~21 s engine start (tiny Qwen2.5-VL, 2 cores, 2026-11-27; the colour self-test's training run 120 s compiled,
    104 s eager over 40 steps) and bought nothing after: the model's share of those 40 steps was 4.4 s compiled,
    4.8 s eager, with the same held-out answers. On a GPU vLLM's compiled graphs stay (CUDA graphs pay there).
    """
    try:
        from vllm.platforms import current_platform
    except ImportError:  # no vLLM (a fake module in tests): nothing to set
        return {}
    return {"enforce_eager": True} if current_platform.is_cpu() else {}


def _vllm_version() -> str:
    import vllm

    return vllm.__version__


def keep_vllm_cpu_weights_live() -> bool:
    """On vLLM's CPU platform, keep every unquantized linear layer and the LM head computing from its live weight.

    At load, vLLM's CPU platform repacks each 2-D weight for oneDNN/SGL kernels
    (``UnquantizedLinearMethod``/``UnquantizedEmbeddingMethod.process_weights_after_loading`` call
    ``dispatch_cpu_unquantized_gemm``): linear layers lose the weight (TRL's sync then fails, ``'Parameter' object
    has no attribute 'weight_loader'``), and the LM head keeps it but computes from the packed copy, so the sync
    writes weights the sampler never reads. Here that dispatch leaves 2-D weights in place with
    ``torch.nn.functional.linear`` over them (slower kernels, right samples); other layers (missing ones, causal
    convolutions) go through vLLM's own dispatch. Returns whether vLLM runs on its CPU platform (patched once).
    """
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    from vllm.model_executor.layers import utils as layer_utils

    vllms = layer_utils.dispatch_cpu_unquantized_gemm
    if getattr(vllms, "keeps_weights_live", False):
        return True

    def dispatch_live(layer: torch.nn.Module, remove_weight: bool) -> None:
        if layer.weight.ndim != 2 or layer.weight.is_meta:
            return vllms(layer, remove_weight)
        layer.cpu_linear = _linear

    dispatch_live.keeps_weights_live = True
    dispatch_live.vllm_dispatch = vllms  # vLLM's own (tests restore it for one kind of layer)
    layer_utils.dispatch_cpu_unquantized_gemm = dispatch_live
    logger.info("vLLM on the CPU: linear layers and the LM head compute from their live weights (torch linear), so "
                "TRL's weight sync reaches the sampler; vLLM's packed CPU kernels would keep a copy made at load")  # fmt: skip
    return True


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``layer.cpu_linear`` as vLLM calls it, over the layer's own (live) weight."""
    return torch.nn.functional.linear(x, weight, bias)


STAGING = ".suzak-staging"  # in output_dir: checkpoints are written here, then renamed into place when whole


class NonFiniteStep(SuzakError):
    """A step's gradient norm was nan or inf (``on_nonfinite: stop``); raised before the optimizer step."""


def keep_adapters_fp32(model) -> int:
    """Cast a quantized model's trainable (adapter) parameters back to fp32; returns how many were cast.

    TRL's trainers cast every trainable parameter of a 4/8-bit model to bf16 in ``__init__`` (QLoRA's paper; GRPO and
    SFT alike, a contract test checks it). A bf16 lora_A entry
    near its init scale (1/sqrt(in_features), ~0.017 for a 7B) moves in steps of ~6e-5, so Adam updates at GRPO's
    learning rates (1e-6..1e-5) round away and lora_A never trains, silently; fp32 adapters cost a few MB and the
    layer casts its input to the adapter's dtype (PEFT), so nothing else changes.
    """
    if not (getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False)):
        return 0
    count = 0
    for param in model.parameters():
        if param.requires_grad and param.dtype in (torch.bfloat16, torch.float16):
            param.data = param.data.float()
            count += param.numel()
    if count:
        logger.info("QLoRA: %d adapter parameters train in fp32 (a bf16 adapter rounds small updates away)", count)
    return count


class TrainerHooks:
    """A transformers ``Trainer`` mixin (put it before the Trainer class) for every suzak trainer, GRPO and SFT:

    - **atomic checkpoints**: ``_save_checkpoint`` writes ``checkpoint-N`` into ``OUTPUT/.suzak-staging`` (through
      ``_get_output_dir``, which the Trainer asks for the folder) and renames it into place once every rank has
      written its part; ``save_total_limit`` then rotates in output_dir (``transformers.trainer_utils.
      rotate_checkpoints``, as the Trainer does). A save that fails or is killed leaves no ``checkpoint-N`` at all,
      and the folders before it as they were; the half-written one in staging is removed (at once, or at the next
      save). :meth:`save_run_state` adds suzak's own state to the folder before it is renamed into place.
    - **non-finite steps**: ``_get_grad_norm`` (after clipping, before the optimizer step) sees a nan or inf norm and
      either raises :class:`NonFiniteStep` (``on_nonfinite = "stop"``: no weight has changed) or drops the step's
      gradients so the optimizer leaves every weight as it was (``"skip"``, counted in ``nonfinite/skipped_steps``).
      Under DeepSpeed the engine has already stepped when the norm is known: such a run stops and saves nothing.
    - **fp32 adapters on a quantized base**: TRL's ``__init__`` casts a 4/8-bit model's trainable parameters to bf16;
      :func:`keep_adapters_fp32` casts them back before the optimizer exists.
    """

    def __init__(self, *args, **kwargs):
        score_labelled_positions_only()
        super().__init__(*args, **kwargs)
        keep_adapters_fp32(self.model)

    on_nonfinite = "stop"
    nonfinite_skipped = 0
    _staging_dir: str | None = None

    def _get_output_dir(self, trial) -> str:
        return self._staging_dir or super()._get_output_dir(trial)

    def _save_checkpoint(self, model, trial) -> None:
        import os
        import shutil
        from pathlib import Path

        from transformers.trainer_utils import rotate_checkpoints

        run_dir = Path(super()._get_output_dir(trial))
        name = f"checkpoint-{self.state.global_step}"
        staging = run_dir / STAGING
        writer = self.args.should_save
        if writer:
            shutil.rmtree(staging / name, ignore_errors=True)  # a save killed earlier
        self.accelerator.wait_for_everyone()
        self._staging_dir = str(staging)
        try:
            super()._save_checkpoint(model, trial)
            if writer:
                self.save_run_state(staging / name)
        except BaseException:
            if writer:
                shutil.rmtree(staging / name, ignore_errors=True)
                with contextlib.suppress(OSError):
                    staging.rmdir()
            raise
        finally:
            self._staging_dir = None
        self.accelerator.wait_for_everyone()  # every rank's files (RNG states, ZeRO shards) are in staging
        if writer:
            if (self.state.best_model_checkpoint or "").startswith(str(staging)):
                self.state.best_model_checkpoint = str(run_dir / Path(self.state.best_model_checkpoint).name)
                self.state.save_to_json(str(staging / name / "trainer_state.json"))
            final = run_dir / name
            if final.exists():  # a resumed run at the step of an older folder: swap, then drop the old one
                old = staging / f"{name}.old"
                shutil.rmtree(old, ignore_errors=True)
                os.replace(final, old)
                os.replace(staging / name, final)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(staging / name, final)
            with contextlib.suppress(OSError):
                staging.rmdir()  # when empty
            rotate_checkpoints(output_dir=str(run_dir), save_total_limit=self.args.save_total_limit,
                               best_model_checkpoint=self.state.best_model_checkpoint, use_mtime=True)  # fmt: skip
        self.accelerator.wait_for_everyone()

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        """The Trainer's resume, then the weights loaded again with the model's key conversion.

        transformers 5.17's ``Trainer._load_from_checkpoint`` reads ``model.safetensors`` (or its shards) into the
        model with a plain ``load_state_dict(strict=False)``, but ``save_pretrained`` writes the keys with the model's
        conversion reverted (Qwen2.5-VL: ``visual.*``, ``model.layers.*``): every key missed, the run went on from
        the base model's weights with the checkpoint's optimizer state, after a warning. Here each key is renamed as
        ``from_pretrained`` renames it (``transformers.core_model_loading.rename_source_key``), and a key still
        missing is an error, never a silent fresh start.
        """
        with self._reloading_weights():
            super()._load_from_checkpoint(resume_from_checkpoint, model)
        self._load_converted_weights(resume_from_checkpoint, self.model if model is None else model,
                                     "resume_from_checkpoint", "resumed")  # fmt: skip

    def _load_best_model(self) -> None:
        """The Trainer's ``load_best_model_at_end``, then the best checkpoint's weights loaded again with the model's
        key conversion: the Trainer's own load has the resume's flaw (:meth:`_load_from_checkpoint`), so the model
        saved at the end was the last step's, not the best one's, after a warning."""
        with self._reloading_weights():
            super()._load_best_model()
        self._load_converted_weights(self.state.best_model_checkpoint, self.model, "load_best_model_at_end",
                                     "best model's")  # fmt: skip

    @contextmanager
    def _reloading_weights(self):
        """While the Trainer's own load runs: its "missing keys" warning is about the load repaired after it."""
        self._reloading = True
        try:
            yield
        finally:
            self._reloading = False

    def _load_converted_weights(self, folder: str, model, flag: str, what: str) -> None:
        """``folder``'s ``model.safetensors`` (or shards) into ``model``, each key renamed as ``from_pretrained``
        renames it; a weight the folder lacks stops the run (one line naming ``flag``). DeepSpeed, FSDP and PEFT
        models load their own formats (PEFT models are no ``PreTrainedModel``: adapters load themselves)."""
        import json
        import os

        from safetensors.torch import load_file
        from transformers import PreTrainedModel
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

        if self.is_deepspeed_enabled or self.is_fsdp_enabled or not isinstance(model, PreTrainedModel):
            return
        single = os.path.join(folder, "model.safetensors")
        index = os.path.join(folder, "model.safetensors.index.json")
        if os.path.isfile(single):
            files = [single]
        elif os.path.isfile(index):
            with open(index, encoding="utf-8") as handle:
                shards = sorted(set(json.load(handle)["weight_map"].values()))
            files = [os.path.join(folder, shard) for shard in shards]
        else:
            return
        transforms = get_model_conversion_mapping(model)
        renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
        converters = [t for t in transforms if isinstance(t, WeightConverter)]
        own = model.state_dict()
        loaded: set[str] = set()
        for path in files:
            state = {rename_source_key(key, renamings, converters, model.base_model_prefix, own)[0]: tensor
                     for key, tensor in load_file(path, device="cpu").items()}  # fmt: skip
            result = model.load_state_dict(state, strict=False)
            loaded |= set(state) - set(result.unexpected_keys)
        tied = set(getattr(model, "all_tied_weights_keys", None) or {})
        missing = sorted(key for key in own if key not in loaded and key not in tied)
        if missing:
            raise SuzakError(f"{flag} {folder}: {len(missing)} of the model's weights are not in the checkpoint (first: "
                             f"{missing[0]}); it was saved from another model")  # fmt: skip
        logger.info("%s weights: %d tensors from %s", what, len(loaded), folder)

    def _issue_warnings_after_load(self, load_result) -> None:
        if not getattr(self, "_reloading", False):
            super()._issue_warnings_after_load(load_result)

    def _get_grad_norm(self, model, grad_norm=None):
        norm = super()._get_grad_norm(model, grad_norm=grad_norm)
        value = norm.item() if isinstance(norm, torch.Tensor) else norm
        if value is None or math.isfinite(value):
            return norm
        step = self.state.global_step + 1
        rows = self.step_rows()
        where = f"step {step}" + (f" (rows of its batch: {', '.join(rows[:8])}{', ...' if len(rows) > 8 else ''})"
                                  if rows else "")  # fmt: skip
        if self.on_nonfinite == "skip" and not self.is_deepspeed_enabled:
            self.nonfinite_skipped += 1
            model.zero_grad(set_to_none=True)  # the optimizer skips parameters without a gradient
            logger.warning("the gradient norm is %s at %s: the optimizer step is skipped, every weight stays as it "
                           "was (%d step(s) skipped so far; nonfinite/skipped_steps)", value, where,
                           self.nonfinite_skipped)  # fmt: skip
            return norm
        if self.is_deepspeed_enabled:
            raise NonFiniteStep(f"the gradient norm is {value} at {where}; DeepSpeed has already applied it, so "
                                "nothing is saved from this run state")  # fmt: skip
        raise NonFiniteStep(f"the gradient norm is {value} at {where} (a nan or inf loss); the step was not applied "
                            "and no weight changed (on_nonfinite skip would skip such steps and count them)")  # fmt: skip

    def step_rows(self) -> list[str]:
        """Names of the dataset rows the current step trains on, when the trainer knows them."""
        return []

    def save_run_state(self, folder) -> None:
        """Write more of the run's state into the checkpoint ``folder`` being saved (the main process, after the
        Trainer's files, before the folder is renamed into place and marked complete)."""

    def log(self, logs: dict[str, float], *args, **kwargs) -> None:
        if self.nonfinite_skipped and "loss" in logs:
            logs["nonfinite/skipped_steps"] = self.nonfinite_skipped
        super().log(logs, *args, **kwargs)


class GRPOHooks(TrainerHooks, GRPOTrainer):
    """``GRPOTrainer`` with TRL's private hooks overridden; a subclass fills in the public methods they call.

    - ``row_names(inputs) -> names``: how messages name each row of a batch (the dataset row it came from);
    - ``prepare_batch(inputs) -> inputs``: the rows TRL then tokenizes, generates from and scores;
    - ``batch_scored(inputs)``: after TRL has scored a training batch (:meth:`newest_completions` reads it);
    - colocated vLLM gets each image's placeholder unexpanded (below).

    Rewards are screened as TRL scores a batch (:meth:`screen_rewards`); a failure raises :class:`RewardFault`.
    """

    def __init__(self, *args, **kwargs):
        config = kwargs.get("args", args[2] if len(args) > 2 else None)
        model = kwargs.get("model", args[0] if args else None)
        drop_earlier_autocast(model)
        colocated = getattr(config, "use_vllm", False) and config.vllm_mode == "colocate"
        with colocated_vllm_on_cpu(model) if colocated and isinstance(model, torch.nn.Module) else nullcontext():
            super().__init__(*args, **kwargs)  # TRL builds vllm.LLM in here
        if self.use_vllm:
            forget_vision_features_on_sync(self.vllm_generation, self.accelerator.is_main_process)
        self._batch_extra_columns: set[str] = set()
        self._batch_rows: list[str] = []
        self._nonfinite_said: set[str] = set()
        self.sampler_guard = SamplerGuard()
        self._video_rows: list[dict | None] | None = None  # the rows' video tensors while TRL runs the model
        self._batch_clips: list[Clip | None] | None = None  # the rows' clips while TRL generates (vLLM takes them)
        self.dynamic_sampling: DynamicSampling | None = None
        self._group_std = torch.zeros(0)  # the last scored batch's reward std per group, over ranks
        self._round_rewards = torch.zeros(0)  # the last scored batch's rewards (ranks x rows, functions)
        self._generated_tokens = 0  # completion tokens the last generation sampled, over ranks
        self._short_batches = 0
        self._generation_trains = True  # the last generation batch kept a group on some rank (dynamic sampling)
        self._step_trains = False  # some micro-batch of the current optimizer step came from such a batch
        self.skipped_empty_steps = 0  # optimizer steps skipped: dynamic sampling kept no group for them
        self._tool_suffixes: dict[tuple, list[int]] = {}  # each distinct tool turn's tokens (_get_tool_suffix_ids)
        self.keep_groups_together = False  # shuffle a generation batch by whole groups (vision_reuse: shuffle_groups)

    # --- hooks ---------------------------------------------------------------------------------------------------

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        if not self.model.training:
            return self._generate_and_score_round(inputs)
        if self.dynamic_sampling is None:
            output = self._generate_and_score_round(inputs)
            self._metrics["train"]["generated_tokens"].append(float(self._generated_tokens))
            return output
        return self._dynamically_sampled(inputs)

    def _dynamically_sampled(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        """:class:`DynamicSampling`: rounds of generation until every rank holds as many groups with a signal as its
        batch has groups (or the cap), merged into one scored batch of the usual size."""
        sampling, size = self.dynamic_sampling, self.num_generations
        groups, rank = len(inputs) // size, self.accelerator.process_index
        batches, spare = [], []  # the rounds' scored batches; (round, group) dropped on this rank
        held = torch.zeros(self.accelerator.num_processes, dtype=torch.long)  # kept groups so far, each rank
        dropped = tokens = 0
        logged = {key: len(values) for key, values in self._metrics["train"].items()}  # before this batch's rounds
        signals, round_rewards = [], []  # each round's (ranks, groups) decisions and (ranks x rows, functions) rewards
        for extra in range(sampling.max_rounds + 1):
            batch = inputs if extra == 0 else self.extra_prompts(groups, extra)
            batches.append(self._generate_and_score_round(batch))
            tokens += self._generated_tokens
            signal = sampling.kept(self._group_std.cpu()).view(-1, groups)  # (ranks, groups): alike on every rank
            signals.append(signal)
            round_rewards.append(self._round_rewards)
            held += signal.sum(1)
            dropped += int((~signal).sum())
            spare += [(extra, g) for g in range(groups) if not signal[rank, g]]
            if bool((held >= groups).all()):
                break
        picked = trained_groups(signals, rank, groups)
        filler = spare[len(spare) - (groups - len(picked)) :] if len(picked) < groups else []
        rows = [(b, g * size + i) for b, g in picked + filler for i in range(size)]
        pad_id = getattr(self.processing_class, "tokenizer", self.processing_class).pad_token_id  # TRL's padding
        output = merge_scored_rows(batches, rows, range(len(picked) * size, len(rows)), pad_id)
        output["num_items_in_batch"] = self._loss_tokens(output)
        trained = int(held.clamp(max=groups).sum())
        self._generation_trains = trained > 0  # alike on every rank (held is gathered)
        short = held.numel() * groups - trained
        metrics = self._metrics["train"]
        # what the rounds held until the merge (every round's scored tensors, this rank): the memory max_rounds costs
        metrics["dynamic_sampling/rounds_mib"].append(sum(_tensor_bytes(batch) for batch in batches) / 2**20)
        self.log_kept_rewards(signals, round_rewards, groups, logged)
        for name, value in (("kept_groups", trained), ("dropped_groups", dropped), ("extra_rounds", extra)):
            metrics[f"dynamic_sampling/{name}"].append(float(value))
        metrics["generated_tokens"].append(float(tokens))  # every round's
        if short:
            logger.log(logging.INFO if not self._short_batches else logging.DEBUG,
                       "dynamic sampling: the batch for step %d trains on %d of %d groups after %d extra round(s) "
                       "(dynamic_sampling_max_rounds); the other %d have one reward for all their completions and "
                       "are masked out (dynamic_sampling/kept_groups in the metrics)", self.state.global_step + 1,
                       trained, trained + short, extra, short)  # fmt: skip
            self._short_batches += 1
        return output

    def _loss_tokens(self, output: dict[str, Any]) -> torch.Tensor:
        """Tokens of a scored batch in the loss, over every rank: TRL's ``num_items_in_batch``, recounted where suzak
        changed the masks (``completion_mask × tool_mask``, as TRL's loss reads them)."""
        loss_mask = output["completion_mask"] * output.get("tool_mask", 1)
        return self.accelerator.gather(loss_mask.sum()).sum()

    def log_kept_rewards(self, signals: list[torch.Tensor], round_rewards: list[torch.Tensor], groups: int,
                         logged: dict[str, int]) -> None:  # fmt: skip
        """TRL logged ``reward``, ``reward_std``, ``frac_reward_zero_std`` and ``rewards/<name>/mean|std`` once per
        round, over every round's rows, dropped groups included. They become the figures of the groups this step
        trains on, over every rank (each rank's first ``groups`` kept groups, in round order: what the merge keeps);
        the all-rounds ones move to ``dynamic_sampling/all_rounds/<name>``. A batch that kept no group keeps
        TRL's."""
        size = self.num_generations
        rows = []  # (round, row of the gathered rewards) of every kept completion, every rank
        for rank in range(signals[0].size(0)):
            kept = trained_groups(signals, rank, groups)
            rows += [(r, (rank * groups + g) * size + i) for r, g in kept for i in range(size)]
        if not rows:
            return
        per_func = torch.stack([round_rewards[r][row] for r, row in rows])  # (kept completions, functions)
        total = weighted_rewards(per_func, self.reward_weights)
        group_std = nanstd(total.view(-1, size), dim=1)
        figures = {"reward": torch.nanmean(total).item(), "reward_std": nanstd(total).item(),
                   "frac_reward_zero_std": torch.isclose(group_std, torch.zeros_like(group_std)).float().mean().item()}  # fmt: skip
        for i, name in enumerate(self.reward_func_names):
            figures[f"rewards/{name}/mean"] = torch.nanmean(per_func[:, i]).item()
            figures[f"rewards/{name}/std"] = nanstd(per_func[:, i]).item()
        metrics = self._metrics["train"]
        for key, value in figures.items():
            rounds = metrics[key][logged.get(key, 0) :]
            if not rounds:
                continue
            del metrics[key][logged.get(key, 0) :]
            metrics[key].append(value)
            metrics[f"dynamic_sampling/all_rounds/{key}"].append(sum(rounds) / len(rounds))

    def _prepare_inputs(self, generation_batch: dict[str, Any]) -> dict[str, Any]:
        with groups_kept_together(self.num_generations) if self.keep_groups_together else nullcontext():
            inputs = super()._prepare_inputs(generation_batch)  # a slice of the last generation batch, in training
        if self.model.training:
            self._step_trains |= self._generation_trains
        return inputs

    def _get_grad_norm(self, model, grad_norm=None):
        """Dynamic sampling that kept no group on any rank for any micro-batch of this optimizer step leaves a zero
        loss; TRL would still step the optimizer, and AdamW's momentum and weight decay would move the weights. The
        gradients are dropped instead, so the optimizer leaves every weight and its state as they were (counted in
        ``dynamic_sampling/skipped_steps``; the learning-rate schedule still counts the step, as global_step does).
        Under DeepSpeed the engine has stepped already (docs/reliability.md)."""
        norm = super()._get_grad_norm(model, grad_norm=grad_norm)
        trains, self._step_trains = self._step_trains, False
        if self.dynamic_sampling is not None and not trains and not self.is_deepspeed_enabled:
            model.zero_grad(set_to_none=True)  # the optimizer skips parameters without a gradient
            self.skipped_empty_steps += 1
        return norm

    def extra_prompts(self, groups: int, extra: int) -> list[dict[str, Any]]:
        """``groups`` rows of the training set drawn for an extra round of dynamic sampling, each ``num_generations``
        times: drawn from the seed, the step, the generation within the step, the round and the rank, so a resumed
        run draws the same. A step may hold several generations (``steps_per_generation × num_iterations`` below
        ``gradient_accumulation_steps``): TRL's micro-step counter ``_step`` (0 at a step's start, also after a
        resume) tells them apart, or each would draw the same refill rows."""
        dataset = self.train_dataset
        accumulation = getattr(self, "current_gradient_accumulation_steps", self.args.gradient_accumulation_steps)
        within = self._step % accumulation  # TRL's count of training_step calls (tests/test_trl_contract.py)
        seed = [self.args.seed, self.state.global_step, within, extra, self.accelerator.process_index]
        picks = np.random.default_rng(seed).choice(len(dataset), size=groups, replace=len(dataset) < groups)
        return [dict(row) for row in (dataset[int(i)] for i in picks) for _ in range(self.num_generations)]

    def _generate(self, prompts: list):
        generated = super()._generate(prompts)
        completion_ids, tool_mask = generated[1], generated[2]
        counts = [sum(mask) for mask in tool_mask] if tool_mask is not None else [len(ids) for ids in completion_ids]
        total = torch.tensor(float(sum(counts)), device=self.accelerator.device)
        self._generated_tokens = int(self.accelerator.gather(total).sum().item())  # sampled, not tool turns: all ranks
        return generated

    def _generate_and_score_round(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        self._batch_extra_columns.clear()
        self._batch_rows = self.row_names(inputs)
        prepared = self.prepare_batch(inputs)
        videos = self.video_fields(prepared)
        clips = [clip if isinstance(clip := video_of(row), Clip) else None for row in prepared]
        self._batch_clips = clips if any(clip is not None for clip in clips) else None
        truncation = bool(self.mask_truncated_completions and self.tools)  # TRL's would zero attention: done below
        try:
            if truncation:
                self.mask_truncated_completions = False
            with self._videos(videos):
                output = super()._generate_and_score_completions(prepared)
        finally:
            self._batch_clips = None
            if truncation:
                self.mask_truncated_completions = True
        if truncation:
            pad_id = getattr(self.processing_class, "tokenizer", self.processing_class).pad_token_id
            output = masked_out_of_the_loss(output, self.eos_token_ids, pad_id)
            output["num_items_in_batch"] = self._loss_tokens(output)
        if videos is not None:
            output[VIDEO_FIELDS] = videos
        self._log_tool_problems()
        if self.model.training:
            self._check_sampler(output)
            self.batch_scored(inputs)
        return output

    def _log_tool_problems(self) -> None:
        """This batch's failed tool calls by reason (:meth:`tool_problem_counts` over TRL's per-rollout
        ``environments``), summed over ranks into the step's log as ``tools/<reason>``."""
        counts = self.tool_problem_counts(self.environments or [])
        if not counts:
            return
        totals = self.accelerator.gather(torch.tensor([list(counts.values())], device=self.accelerator.device))
        mode = "train" if self.model.training else "eval"
        for reason, total in zip(counts, totals.sum(0).tolist(), strict=True):
            self._metrics[mode][f"tools/{reason}"].append(float(total))

    def _get_tool_suffix_ids(self, tool_messages):
        # TRL renders a dummy conversation twice for every tool call, the processor going over the result's images;
        # a turn's tokens depend on its texts and its images' sizes alone, so each distinct turn is rendered once
        key = tool_turn_key(tool_messages, self.chat_template_kwargs)
        if key is None:
            return super()._get_tool_suffix_ids(tool_messages)
        rendered = self._tool_suffixes
        if len(rendered) >= 4096:  # failed calls' texts differ call by call: keep the memo bounded
            rendered.clear()
        if key not in rendered:
            rendered[key] = list(super()._get_tool_suffix_ids(tool_messages))
        return list(rendered[key])

    def tool_turn_length(self, tool_messages: list[dict]) -> int:
        """Tokens TRL adds to a completion for these tool messages (the tool turn and the next assistant header),
        from TRL's own ``_get_tool_suffix_ids``."""
        return len(self._get_tool_suffix_ids(tool_messages))

    def _generate_single_turn(self, prompt_ids, images, *args, **kwargs):
        images = _none_for_empty(images)
        colocated = self.use_vllm and self.vllm_mode == "colocate"
        if colocated and images is not None:
            # TRL hands colocated vLLM the processor-expanded prompt ids and vLLM expands every <|image_pad|> again
            # (TRL #6294): one placeholder per image instead. The server path places precomputed image features on
            # the runs of image tokens, so it keeps them expanded.
            token = self.processing_class.image_token_id
            prompt_ids = [collapse_runs(list(ids), token) for ids in prompt_ids]
        clips = self._batch_clips
        if not colocated or clips is None:  # (server mode with video rows stops before step 1)
            return super()._generate_single_turn(prompt_ids, images, *args, **kwargs)
        # TRL's colocated call sends vLLM images only: each video row's request gets its clip, and its prompt ids
        # with the video back to the placeholder vLLM expands itself (to the same ids: tests/test_vllm_boundary.py).
        token = self.processing_class.tokenizer.convert_tokens_to_ids
        start, end, pad = token("<|vision_start|>"), token("<|vision_end|>"), token("<|video_pad|>")
        prompt_ids = [list(ids) if clip is None else collapse_video_blocks(list(ids), start, end, pad)
                      for ids, clip in zip(prompt_ids, clips, strict=True)]  # fmt: skip
        videos = [None if clip is None else vllm_video(clip, self.processing_class) for clip in clips]
        with vllm_requests_with_videos(self.vllm_generation.llm, videos):
            return super()._generate_single_turn(prompt_ids, images, *args, **kwargs)

    def _tokenize_prompts(self, prompts: list):
        """Prompts with video clips reach the processor as their frames, with the clips' metadata (through
        ``apply_chat_template``'s ``processor_kwargs``, which TRL passes on from ``chat_template_kwargs``)."""
        clips = [part["video"] for prompt in prompts if isinstance(prompt, list) for part in _parts(prompt)
                 if part.get("type") == "video" and isinstance(part.get("video"), Clip)]  # fmt: skip
        if not clips:
            prompt_ids, images, fields = self._tokenize_each_prompt_once(prompts)
            return prompt_ids, _empty_for_none(images), fields
        saved = self.chat_template_kwargs
        given = dict(saved.get("processor_kwargs") or {})
        self.chat_template_kwargs = {**saved, "processor_kwargs": {**given, **processor_kwargs(clips)}}
        try:
            prompt_ids, images, fields = super()._tokenize_prompts([_with_frames(prompt) for prompt in prompts])
        finally:
            self.chat_template_kwargs = saved
        return prompt_ids, _empty_for_none(images), fields

    def _tokenize_each_prompt_once(self, prompts: list):
        """TRL's ``_tokenize_prompts`` on each distinct prompt once, its output then laid out for every row as TRL's
        own call on all rows gives it (the same ids, pixel values and grids, tested to the bit): a batch holds each
        prompt ``num_generations`` times (the sampler repeats it), and the processor resized and patched every copy
        of its images again (the counting self-test: 166 ms a step for 128 rows, 12 ms for their 16 prompts). Prompts
        are the same when their messages' text and images' pixels are (and, with ``environment_factory``, their
        environment, whose tools TRL renders into each): :func:`prompt_keys`. Anything else falls back to TRL's call."""
        environments = self._batch_environments if self.environment_factories is not None else None
        keys = prompt_keys(prompts, environments)
        if keys is None or len(set(keys)) == len(keys):
            return super()._tokenize_prompts(prompts)
        first: dict = {}
        for row, key in enumerate(keys):
            first.setdefault(key, row)
        if environments is not None:
            self._batch_environments = [environments[row] for row in first.values()]
        try:
            prompt_ids, images, fields = super()._tokenize_prompts([prompts[row] for row in first.values()])
        finally:
            if environments is not None:
                self._batch_environments = environments
        position = {key: index for index, key in enumerate(first)}
        rows = [position[key] for key in keys]
        expanded = expand_tokenized_prompts(prompt_ids, images, fields, rows)
        return expanded if expanded is not None else super()._tokenize_prompts(prompts)

    def _compute_loss(self, model, inputs):
        with self._videos(inputs.get(VIDEO_FIELDS)):
            return super()._compute_loss(model, inputs)

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        """TRL's model call for each chunk of rows gets the chunk's video tensors added, and no empty image tensors
        for a chunk of rows without images (:func:`feeding_videos`); TRL itself gives each chunk its rows' images."""
        rows = self._video_rows if self._video_rows is not None else [None] * input_ids.size(0)
        if len(rows) != input_ids.size(0):
            raise SuzakError(f"a batch of {input_ids.size(0)} rows came with {len(rows)} rows of video tensors")
        with self._feeding_videos(model, rows):
            return super()._get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep,
                                                              *args, **kwargs)  # fmt: skip

    def _feeding_videos(self, model: torch.nn.Module, rows: Sequence[dict | None]):
        """:func:`feeding_videos` for a VL model's processor; nothing for a text model, whose tokenizer has no video
        placeholder (a dataset with images or video for a text model stops before step 1: ``suzak.training.session``)."""
        video_token = getattr(self.processing_class, "video_token_id", None)  # a VL processor's; a tokenizer has none
        if video_token is None:
            if any(row is not None for row in rows):
                raise SuzakError(f"{type(self.processing_class).__name__} has no video placeholder: a text model "
                                 "cannot take video rows")  # fmt: skip
            return nullcontext()
        return feeding_videos(model, rows, video_token)

    @contextmanager
    def _videos(self, rows: list[dict | None] | None):
        saved, self._video_rows = self._video_rows, rows
        try:
            yield
        finally:
            self._video_rows = saved

    def video_fields(self, inputs: list[dict[str, Any]]) -> list[dict | None] | None:
        """Each row's video tensors for the model (``pixel_values_videos``, ``video_grid_thw`` and, for Qwen2.5-VL,
        ``second_per_grid_ts``), from the processor on the row's clip; None for a batch without video. The copies of
        a prompt share one clip, and one set of tensors."""
        clips = [video_of(row) for row in inputs]
        if not any(isinstance(clip, Clip) for clip in clips):
            return None
        processor = self.processing_class
        computed: dict[int, dict] = {}
        for clip in clips:
            if isinstance(clip, Clip) and id(clip) not in computed:
                out = processor(text=[processor.video_token], videos=[clip.frames], return_tensors="pt",
                                **processor_kwargs([clip]))  # fmt: skip
                fields = {k: torch.as_tensor(out[k]).to(self.accelerator.device)
                          for k in ("pixel_values_videos", "video_grid_thw", "second_per_grid_ts") if k in out}  # fmt: skip
                computed[id(clip)] = fields
        return [computed[id(clip)] if isinstance(clip, Clip) else None for clip in clips]

    def _calculate_rewards(self, inputs, *args, **kwargs):
        rows = self._batch_rows if len(self._batch_rows) == len(inputs) else _batch_positions(len(inputs))
        guard = RewardGuard(rows)
        funcs = self.reward_funcs
        self.reward_funcs = [guard.wrap(f, name) for f, name in zip(funcs, self.reward_func_names, strict=True)]
        try:
            rewards = super()._calculate_rewards(inputs, *args, **kwargs)  # (completions of every rank, rewards)
        finally:
            self.reward_funcs = funcs
        environments = self.environments or []
        if len(environments) == len(inputs):  # one per rollout, in the rollouts' order (TRL draws them per batch)
            for column, values in self.rollout_columns(environments).items():
                self._log_completion_extra(column, values)
        for column, values in self.row_columns(inputs).items():
            self._log_completion_extra(column, values)
        rewards = self.screen_rewards(rewards, guard, self.reward_rows(inputs))
        ids = args[2] if len(args) > 2 else kwargs.get("completion_ids_list")
        lengths = [len(row) for row in ids] if ids is not None and len(ids) == len(inputs) else None
        self.total_over_ranks()
        for name, value in self.batch_metrics(inputs, rewards, lengths).items():
            self._log_metric(name, value)
        if self.dynamic_sampling is not None and self.model.training:  # (ranks x rows, functions) -> group std
            self._group_std = group_reward_std(rewards, self.reward_weights, self.num_generations)
            self._round_rewards = rewards.detach().cpu()
            # completions.csv's group_signal: 1 where the row's group has a reward signal (kept, unless the batch
            # already had its groups), 0 where dynamic sampling drops it; this rank's rows, in order
            signal = self.dynamic_sampling.kept(self._group_std.cpu()).repeat_interleave(self.num_generations)
            start = self.accelerator.process_index * len(inputs)
            self._log_completion_extra("group_signal", [int(v) for v in signal[start : start + len(inputs)]])
        return rewards

    def total_over_ranks(self) -> None:
        """Each :class:`RankTotal` the rewards logged this batch becomes its total over every rank, on every rank
        (TRL flushes ``_pending_metrics`` after scoring as ``sum / count`` over the ranks' values, so it then logs
        that total); a rank that logged none of a name (a mixture's rank without that source's rows) counts 0."""
        pending = self._pending_metrics
        mine = sorted({(name, values[0].over) for name, values in pending.items()
                       if values and isinstance(values[0], RankTotal)})  # fmt: skip
        totals = dict(sorted(set(map(tuple, gather_object(mine)))))  # name -> over, alike on every rank
        device = self.accelerator.device
        for name, over in totals.items():
            values = [float(value) for value in pending.get(name, [])]
            local = sum(values) if over == "sum" else max(values, default=0.0)
            gathered = self.accelerator.gather(torch.tensor([local], dtype=torch.float64, device=device))  # (ranks,)
            total = gathered.sum() if over == "sum" else gathered.max()
            pending[name] = [RankTotal(total.item(), over)]

    def _log_completion_extra(self, column: str, values: list):
        self._batch_extra_columns.add(column)
        super()._log_completion_extra(column, values)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """With ``log_completions``, prompts and completions are plain text (``<image>`` for an image, each tool call
        and tool turn on its own line) while TRL builds its table: W&B types a table column from its values and
        rejects VLM prompts, whose content parts differ in shape, and TRL's parquet copy of the table fails on a
        multi-turn completion (pyarrow: "cannot mix list and non-list"). TRL's image column already holds each
        rollout's tool images (the zoom's crops) after its prompt's."""
        if self.dynamic_sampling is not None and "loss" in logs:
            logs["dynamic_sampling/skipped_steps"] = self.skipped_empty_steps
        if not self.log_completions:
            return super().log(logs, start_time)
        prompts, completions = self._logs["prompt"], self._logs["completion"]
        self._logs["prompt"] = deque((message_text(p) for p in prompts), maxlen=prompts.maxlen)
        self._logs["completion"] = deque((message_text(c) for c in completions), maxlen=completions.maxlen)
        try:
            super().log(logs, start_time)
        finally:
            self._logs["prompt"], self._logs["completion"] = prompts, completions

    def _check_sampler(self, batch: dict[str, Any]) -> None:
        """The stale-sampler guard (:class:`SamplerGuard`) on the batch TRL just generated with vLLM and scored:
        a few completions of each rank, the gap averaged over ranks, so every rank decides alike."""
        step = self.state.global_step + 1
        guard = self.sampler_guard
        if not self.use_vllm or not guard.due(step):
            return
        if (self.repetition_penalty or 1.0) != 1.0:
            logger.warning("the stale-sampler guard is off: with repetition_penalty %g vLLM's log-probabilities "
                           "depend on each prefix's penalties, which it does not reproduce", self.repetition_penalty)  # fmt: skip
            guard.every = 0
            return
        sums = torch.zeros(4, device=self.accelerator.device)  # |gap| summed, tokens, suppressed mass summed, max |gap|
        if batch.get("sampling_per_token_logps") is not None:
            count = batch["completion_ids"].size(0)
            for row in sorted({i * count // guard.rows for i in range(min(guard.rows, count))}):  # across prompts
                part = self._sampler_gap(batch, row)
                sums[:3] += part[:3]
                sums[3] = torch.maximum(sums[3], part[3])
        totals = self.accelerator.gather(sums[None])  # (ranks, 4)
        tokens = totals[:, 1].sum().item()
        if tokens == 0:
            return
        gap, largest, mass = (
            totals[:, 0].sum().item() / tokens,
            totals[:, 3].max().item(),
            totals[:, 2].sum().item() / tokens,
        )
        for name, value in (("logp_gap", gap), ("logp_gap_max", largest), ("suppressed_mass", mass)):
            self._metrics["train"][f"sampler_check/{name}"].append(value)  # this step's log line: metrics.csv, W&B
        guard.check(step, gap, largest, mass)

    @torch.no_grad()
    def _sampler_gap(self, batch: dict[str, Any], row: int) -> torch.Tensor:
        """(sum of |log p_vLLM - log p_policy|, tokens, sum of the suppressed mass, max gap) over one row's completion:
        the policy's log-probability of each sampled token under vLLM's sampling rule (:func:`sampling_logps`),
        against what vLLM returned."""
        length = batch["completion_ids"].size(1)
        videos = batch.get(VIDEO_FIELDS)
        with self.accelerator.autocast(), (nullcontext() if videos is None else
                                           self._feeding_videos(self.model, [videos[row]])):  # fmt: skip
            logits = self.model(**_row_model_inputs(batch, row), logits_to_keep=length + 1).logits[0, :-1]  # (C, V)
        bias = self.vllm_generation.generation_kwargs.get("logit_bias") or {}
        logps = sampling_logps(logits, temperature=self.temperature, logit_bias=bias, top_k=self.top_k or 0,
                               top_p=self.top_p if self.top_p is not None else 1.0, min_p=self.min_p)  # fmt: skip
        suppressed = self.suppressed_token_ids  # the biased-out ones, read from the same logit bias
        mass = (logits.float() / self.temperature).softmax(-1)[:, suppressed].sum(-1)  # (C,) the policy's own
        sampled = logps.gather(-1, batch["completion_ids"][row][:, None])[:, 0]  # (C,)
        vllm = batch["sampling_per_token_logps"][row].float()
        mask = batch["completion_mask"][row].bool() & ~torch.isnan(vllm)
        if "tool_mask" in batch:  # tool turns (TRL's 0 for logps vLLM never sampled) are not the sampler's
            mask &= batch["tool_mask"][row].bool()
        gap = (sampled - vllm).abs()[mask]
        if gap.numel() == 0:
            return torch.zeros(4, device=logits.device)
        return torch.stack([gap.sum(), torch.tensor(float(gap.numel()), device=gap.device), mass[mask].sum(),
                            gap.max()])  # fmt: skip

    def tool_problem_counts(self, environments: list) -> dict[str, int]:
        """Failed tool calls of this batch by reason, the same keys on every rank ({} : nothing to log)."""
        return {}

    def rollout_columns(self, environments: list) -> dict[str, list]:
        """Columns of the completions log (``completions.csv``, the W&B table) read from each rollout's environment,
        the same keys on every rank ({}: none)."""
        return {}

    def row_columns(self, inputs: list[dict]) -> dict[str, list]:
        """Columns of the completions log read from each completion's row, the same keys on every rank ({}: none)."""
        return {}

    def batch_metrics(self, inputs: list[dict], rewards: torch.Tensor, lengths: list[int] | None) -> dict[str, float]:
        """More of the step's figures from a scored batch: ``rewards`` (completions of every rank, rewards) after
        the screen, ``lengths`` this rank's completion lengths; the same keys on every rank ({}: none)."""
        return {}

    def reward_rows(self, inputs: list[dict]) -> torch.Tensor | None:
        """(completions of every rank, rewards): True where a reward scores the row (a mixture's reward scores its
        own source's rows alone); None: every reward scores every row."""
        return None

    def step_rows(self) -> list[str]:
        return list(dict.fromkeys(self._batch_rows))  # each prompt is in the batch num_generations times

    def row_names(self, inputs: list[dict[str, Any]]) -> list[str]:
        return _batch_positions(len(inputs))

    def prepare_batch(self, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return inputs

    def batch_scored(self, inputs: list[dict[str, Any]]) -> None:
        """Called on every rank after a training batch is scored."""

    # --- reading and setting TRL's state -------------------------------------------------------------------------

    def screen_rewards(self, rewards: torch.Tensor, guard: RewardGuard, scored: torch.Tensor | None = None
                       ) -> torch.Tensor:  # fmt: skip
        """What TRL goes on with after scoring a batch; ``rewards`` (completions of every rank, rewards) is the same
        on every rank, and so is every decision here.

        Stops on a failed reward call (any rank's); logs ``rewards/<name>/nonfinite_frac`` (None, NaN or inf) for each
        reward, over the rows it scores (``scored``: (completions of every rank, rewards), True where a reward scores
        the row; None: every row); in training, stops when no weighted reward scored any completion (TRL would train on advantages of
        0: loss 0, no warning); hands TRL inf as NaN, which it skips like None (inf would turn its group's
        advantages into NaN).
        """
        training = self.model.training
        where = f"step {self.state.global_step + 1}" if training else f"evaluation after step {self.state.global_step}"
        failures = gather_object(guard.failures)
        if failures:
            more = f" (and {len(failures) - 1} more failed reward call(s))" if len(failures) > 1 else ""
            raise RewardFault(failures[0].message(where) + more) from (guard.errors[0] if guard.errors else None)
        self._say_nonfinite(guard, where)
        finite = torch.isfinite(rewards)  # (N, R)
        scored = torch.ones_like(finite) if scored is None else scored.to(finite.device)
        for i, name in enumerate(self.reward_func_names):
            if scored[:, i].any():
                self._log_metric(f"rewards/{name}/nonfinite_frac", 1.0 - finite[scored[:, i], i].float().mean().item())
        weighted = [i for i, weight in enumerate(self.reward_weights.tolist()) if weight != 0]
        if training and weighted and not finite[:, weighted].any():
            names = ", ".join(repr(self.reward_func_names[i]) for i in weighted)
            raise RewardFault(
                f"no reward scored any completion at {where}: {names} gave None, nan or inf for all {len(rewards)} "
                "completions, so the step would train on nothing (loss 0)"
            )
        return rewards.masked_fill(~finite, float("nan"))

    def _say_nonfinite(self, guard: RewardGuard, where: str) -> None:
        for name, positions in guard.nonfinite.items():
            if name not in self._nonfinite_said:
                self._nonfinite_said.add(name)
                logger.warning(
                    "reward %r returned nan or inf for %d of %d completions at %s (first: %s); such values are "
                    "skipped like None and counted in rewards/%s/nonfinite_frac (said once per reward)",
                    name, len(positions), len(guard.rows), where, guard.rows[positions[0]], name,
                )  # fmt: skip

    def save_checkpoint(self) -> None:
        """Save ``checkpoint-{global_step}`` now, as the Trainer does at a save step: ``_save_checkpoint`` (model,
        optimizer, scheduler, RNG, trainer state; then the ``save_total_limit`` rotation), then the ``on_save``
        callbacks (suzak's completion marker among them). Every rank calls it."""
        self._save_checkpoint(self.model_wrapped, trial=None)
        self.control = self.callback_handler.on_save(self.args, self.state, self.control)

    def newest_completions(self, image_refs: Sequence[str], step: int) -> list[dict]:
        """Rows of the batch just scored (TRL gathers ``_logs`` over ranks, in rank order; so must ``image_refs``)."""
        weights = self.reward_weights.tolist()
        return completion_rows(self._logs, image_refs, step, weights, self._batch_extra_columns)

    def suppress_in_generation(self, ids: Iterable[int]) -> None:
        """Never sample ``ids``: TRL's ``suppress_tokens`` for HF generation, a -100 logit bias for vLLM.

        TRL itself suppresses ``<|image_pad|>`` in HF generation only. vLLM takes the bias in colocate mode and over
        its OpenAI API in server mode. The recipe's own ``generation_kwargs`` are copied, never modified.
        """
        ids = list(ids)
        if self.use_vllm:
            kwargs = dict(self.vllm_generation.generation_kwargs)
            kwargs["logit_bias"] = {**dict.fromkeys(ids, -100.0), **(kwargs.get("logit_bias") or {})}
            self.vllm_generation.generation_kwargs = kwargs
        else:
            suppressed = sorted(set(self.generation_config.suppress_tokens or []) | set(ids))
            self.generation_config.suppress_tokens = suppressed
            self.generation_kwargs["suppress_tokens"] = suppressed

    @property
    def suppressed_token_ids(self) -> list[int]:
        """Token ids generation can never sample, read from what TRL hands HF generate or vLLM."""
        if self.use_vllm:
            bias = self.vllm_generation.generation_kwargs.get("logit_bias") or {}
            return sorted(int(token) for token, value in bias.items() if value <= -100)
        return sorted(self.generation_config.suppress_tokens or [])


def prompt_keys(prompts: list, environments: Sequence | None = None) -> list[tuple] | None:
    """One key per prompt, equal for prompts the processor renders alike: each message's role and text, each
    image's mode, size and pixels (a hash of them), and the row's environment where there is one; None when a prompt
    holds anything else (a video, a message with other fields), which is then not compared."""
    import hashlib

    from PIL import Image

    keys, hashed = [], {}  # a batch's copies of one prompt mostly share their (fitted) image objects: hashed once
    for row, prompt in enumerate(prompts):
        if not isinstance(prompt, list):
            return None
        key: list = [environments[row] if environments is not None else None]
        for message in prompt:
            if not isinstance(message, dict) or set(message) - {"role", "content"}:
                return None
            content = message.get("content")
            if isinstance(content, str):
                key.append((message.get("role"), content))
                continue
            if not isinstance(content, list):
                return None
            parts = []
            for part in content:  # TRL's parts may carry the other kind's key as None ({"type": "image", "text": None})
                part = (
                    {name: value for name, value in part.items() if value is not None} if isinstance(part, dict) else {}
                )
                kind = part.get("type")
                if kind == "text" and set(part) == {"type", "text"}:
                    parts.append(("text", part["text"]))
                elif kind == "image" and set(part) == {"type", "image"} and isinstance(part["image"], Image.Image):
                    image = part["image"]
                    if id(image) not in hashed:
                        hashed[id(image)] = hashlib.blake2b(image.tobytes(), digest_size=16).digest()
                    parts.append(("image", image.mode, image.size, hashed[id(image)]))
                else:
                    return None
            key.append((message.get("role"), tuple(parts)))
        keys.append(tuple(key))
    return keys


def expand_tokenized_prompts(prompt_ids: list, images: list | None, fields: dict, rows: list[int]):
    """``_tokenize_prompts``' output for distinct prompts laid out for the batch's ``rows`` (row ``i`` is distinct
    prompt ``rows[i]``): ids and per-token fields copied per row, images per row, and ``pixel_values`` /
    ``image_grid_thw`` (Qwen's layout: each image's patches, one after another) concatenated in row order. None for
    any other field (the caller then tokenizes every row)."""
    images_fields = {"pixel_values", "image_grid_thw"}
    per_row = {key: value for key, value in fields.items()
               if key not in images_fields and isinstance(value, list) and len(value) == len(prompt_ids)}  # fmt: skip
    if set(fields) - set(per_row) - images_fields:
        return None
    out_fields: dict[str, Any] = {key: [list(value[row]) for row in rows] for key, value in per_row.items()}
    if "pixel_values" in fields:
        grids = fields.get("image_grid_thw")
        counts = [len(row or []) for row in images or []]
        if grids is None or len(counts) != len(prompt_ids) or sum(counts) != grids.size(0):
            return None
        patches = grids.prod(-1).tolist()
        if sum(patches) != fields["pixel_values"].size(0):
            return None
        starts = np.cumsum([0, *counts]).tolist()
        pixels = torch.split(fields["pixel_values"], [sum(patches[a:b]) for a, b in itertools.pairwise(starts)])
        out_fields["pixel_values"] = torch.cat([pixels[row] for row in rows])
        out_fields["image_grid_thw"] = torch.cat([grids[starts[row] : starts[row + 1]] for row in rows])
    elif "image_grid_thw" in fields:
        return None
    return (
        [list(prompt_ids[row]) for row in rows],
        None if images is None else [images[row] for row in rows],
        out_fields,
    )


def _empty_for_none(images: list | None) -> list | None:
    """TRL's per-row image lists with ``[]`` for a row without images where the batch has some: the processor TRL
    calls on the batch takes an empty list for such a row, not None (TRL builds None)."""
    return images if images is None else [[] if row is None else row for row in images]


def _none_for_empty(images: list | None) -> list | None:
    """TRL's per-row image lists with None for a row without images: TRL's vLLM requests send ``row[0]`` unless the
    row is None."""
    return images if images is None else [row or None for row in images]


def _parts(prompt: list) -> list[dict]:
    return [part for message in prompt if isinstance(message, dict) and isinstance(message.get("content"), list)
            for part in message["content"] if isinstance(part, dict)]  # fmt: skip


def _with_frames(prompt: Any) -> Any:
    """A prompt whose video parts hold their clip's frames array (what a processor takes) instead of the clip."""
    if not isinstance(prompt, list):
        return prompt
    return [{**m, "content": [{**p, "video": p["video"].frames} if isinstance(p, dict) and isinstance(p.get("video"), Clip)
                              else p for p in m["content"]]}
            if isinstance(m, dict) and isinstance(m.get("content"), list) else m for m in prompt]  # fmt: skip


@contextmanager
def vllm_requests_with_videos(llm: Any, videos: Sequence[tuple[Any, dict] | None]):
    """Within the block, each request TRL's colocated generation hands ``llm.generate`` (one per prompt, in order:
    ``{"prompt_token_ids": ...}`` and images in ``multi_modal_data``) gets its row's video: ``videos[i]`` is the
    (``multi_modal_data["video"]`` item, ``mm_processor_kwargs``) pair of :func:`suzak.media.video.vllm_video`, or None for
    a row without one."""
    generate, own = llm.generate, vars(llm).get("generate")

    def with_videos(prompts, *args, **kwargs):
        if len(prompts) != len(videos):
            raise SuzakError(f"vLLM was handed {len(prompts)} prompts for {len(videos)} rows with their videos "
                             "(vllm_tensor_parallel_size > 1 gathers other ranks' prompts: not with video rows)")  # fmt: skip
        requests = []
        for prompt, video in zip(prompts, videos, strict=True):
            if video is not None:
                data = {**(prompt.get("multi_modal_data") or {}), "video": video[0]}
                prompt = {**prompt, "multi_modal_data": data, "mm_processor_kwargs": video[1]}
            requests.append(prompt)
        return generate(requests, *args, **kwargs)

    llm.generate = with_videos  # this instance only, for this block
    try:
        yield
    finally:
        if own is None:
            del llm.generate
        else:
            llm.generate = own


@contextmanager
def feeding_videos(model: torch.nn.Module, rows: Sequence[dict | None], video_token_id: int):
    """Within the block, the calls of ``model`` on these rows (one call for all, or TRL's chunks of them in row order:
    each call takes the next ``input_ids.size(0)`` rows) get those rows' video tensors (rows without a video add none)
    and ``mm_token_type_ids`` marking their video placeholder tokens (2), which the Qwen models' M-RoPE needs; the image
    marks (1) the call already has stay where the images are.

    TRL builds each chunk's model call from image arguments only; this adds the video ones to the same call.
    """
    taken = 0

    def add_videos(module, args, kwargs):
        nonlocal taken
        ids = kwargs.get("input_ids")
        if ids is None:
            return args, kwargs
        if taken + ids.size(0) > len(rows):
            raise SuzakError(f"the model was called on more rows than the {len(rows)} given video tensors for")
        present = [row for row in rows[taken : taken + ids.size(0)] if row is not None]
        taken += ids.size(0)
        grids = kwargs.get("image_grid_thw")
        if grids is not None and grids.numel() == 0:  # a chunk of a mixed batch without images: TRL slices none
            kwargs = {k: v for k, v in kwargs.items() if k not in ("pixel_values", "image_grid_thw")}
        given = kwargs.get("mm_token_type_ids")
        if not present and (given is None or given.shape == ids.shape):
            return args, kwargs
        fields = {key: torch.cat([row[key] for row in present]) for key in present[0]} if present else {}
        types = torch.zeros_like(ids)
        if given is not None:  # a batch with images: TRL's image marks, from prompts whose videos were not expanded
            types[:, types.size(1) - given.size(1) :] = given.masked_fill(given == 2, 0)  # (left padded: they end
        types[ids == video_token_id] = 2  # where the expanded ones do); the video marks come from the ids
        return args, {**kwargs, **fields, "mm_token_type_ids": types}

    handle = model.register_forward_pre_hook(add_videos, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def _tail(values: Sequence | Iterable, count: int) -> list:
    values = list(values)
    return values[-count:] if count else []


def completion_rows(logs: Mapping[str, Any], image_refs: Sequence[str], step: int,
                    reward_weights: Sequence[float] | None = None, extra_columns: Iterable[str] = ()) -> list[dict]:  # fmt: skip
    """CSV rows for the newest generation batch held in TRL's ``GRPOTrainer._logs``.

    TRL appends every scored batch (gathered over ranks) to ``_logs`` deques; the last ``len(image_refs)`` entries
    are this batch. ``extra_columns`` are the ``log_extra`` columns written for this batch (older ones may be stale).
    """
    count = min(len(image_refs), len(logs["prompt"]))
    rewards = {name: _tail(values, count) for name, values in logs["rewards"].items()}
    columns: dict[str, list] = {
        "prompt": [message_text(p) for p in _tail(logs["prompt"], count)],
        "image": list(image_refs[-count:]) if count else [],
        "completion": [message_text(c) for c in _tail(logs["completion"], count)],
        **{f"reward/{name}": values for name, values in rewards.items()},
    }
    if reward_weights is not None and rewards:
        weighted = zip(*rewards.values(), strict=True)
        columns["reward"] = [sum(w * r for w, r in zip(reward_weights, rs, strict=True) if not math.isnan(r))
                             for rs in weighted]  # fmt: skip
    columns["advantage"] = _tail(logs["advantages"], count)
    for name in extra_columns:
        if name in logs["extra"]:
            columns[name] = _tail(logs["extra"][name], count)
    return [{"step": step} | {key: _cell(values[i]) for key, values in columns.items()} for i in range(count)]


def _cell(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return ""
    return "" if value is None else value


class SFTHooks(TrainerHooks, SFTTrainer):
    """TRL's ``SFTTrainer`` with suzak's atomic checkpoints and non-finite-step handling (:class:`TrainerHooks`)."""
