"""Every use of TRL's internals (trl 1.16), in one module; tests/test_trl_contract.py holds a contract test for each.

suzak extends TRL's ``GRPOTrainer`` only through the names below, so a TRL upgrade that moves one of them fails there,
by name, instead of somewhere in a training run:

- :class:`GRPOHooks` overrides TRL's private hooks ``_generate_and_score_completions``, ``_generate_single_turn``
  and ``_log_completion_extra`` (each calls ``super()`` and hands suzak's part to a public method of the subclass),
  reads the scored batch from ``_logs``, and sets the vision-token suppression where TRL's two generation paths
  read it (``generation_config``/``generation_kwargs`` for HF, ``vllm_generation.generation_kwargs`` for vLLM);
- :data:`REWARD_CALL_KWARGS` and :func:`reward_call_kwargs`: the keyword arguments ``GRPOTrainer`` calls every reward
  function with, which the reward pre-flight reproduces and recipes must not set;
- :func:`completion_rows`: one row per completion of the newest batch in TRL's ``_logs`` layout.

Everything here imports TRL and nothing of suzak but :mod:`suzak.parsing` and :mod:`suzak.vision` (leaves).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from trl import GRPOTrainer

from suzak.parsing import message_text
from suzak.vision import collapse_runs

__all__ = ["REWARD_CALL_KWARGS", "GRPOHooks", "completion_rows", "reward_call_kwargs"]

# Keyword arguments GRPOTrainer._calculate_rewards passes to every reward itself (beside the dataset's columns).
REWARD_CALL_KWARGS = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric")


def reward_call_kwargs(rows: list[dict], completions: list, log: Callable[..., None]) -> dict[str, Any]:
    """The keyword arguments GRPOTrainer would call a reward with for ``rows`` and their ``completions``.

    Every dataset column but the prompt goes in as a list, as ``_calculate_rewards`` does; ``completion_ids`` are
    empty (no tokenizer here) and ``log`` stands in for ``log_extra``/``log_metric``.
    """
    columns = {k: [row[k] for row in rows] for k in rows[0] if k not in ("prompt", "completion", "completion_ids")}
    return {"prompts": [row["prompt"] for row in rows], "completions": completions,
            "completion_ids": [[] for _ in rows], "trainer_state": None, "log_extra": log, "log_metric": log,
            **columns}  # fmt: skip


class GRPOHooks(GRPOTrainer):
    """``GRPOTrainer`` with TRL's private hooks overridden; a subclass fills in the public methods they call.

    - ``prepare_batch(inputs) -> inputs``: the rows TRL then tokenizes, generates from and scores;
    - ``batch_scored(inputs)``: after TRL has scored a training batch (:meth:`newest_completions` reads it);
    - colocated vLLM gets each image's placeholder unexpanded (below).
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._batch_extra_columns: set[str] = set()

    # --- hooks ---------------------------------------------------------------------------------------------------

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        self._batch_extra_columns.clear()
        output = super()._generate_and_score_completions(self.prepare_batch(inputs))
        if self.model.training:
            self.batch_scored(inputs)
        return output

    def _generate_single_turn(self, prompt_ids, images, *args, **kwargs):
        if self.use_vllm and self.vllm_mode == "colocate" and images is not None:
            # TRL hands colocated vLLM the processor-expanded prompt ids and vLLM expands every <|image_pad|> again
            # (TRL #6294): one placeholder per image instead. The server path places precomputed image features on
            # the runs of image tokens, so it keeps them expanded.
            token = self.processing_class.image_token_id
            prompt_ids = [collapse_runs(list(ids), token) for ids in prompt_ids]
        return super()._generate_single_turn(prompt_ids, images, *args, **kwargs)

    def _log_completion_extra(self, column: str, values: list):
        self._batch_extra_columns.add(column)
        super()._log_completion_extra(column, values)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """With ``log_completions``, prompts are plain text (``<image>`` for an image) while TRL builds its table:
        W&B types a table column from its values and rejects VLM prompts, whose content parts differ in shape."""
        if not self.log_completions:
            return super().log(logs, start_time)
        prompts = self._logs["prompt"]
        self._logs["prompt"] = deque((message_text(p) for p in prompts), maxlen=prompts.maxlen)
        try:
            super().log(logs, start_time)
        finally:
            self._logs["prompt"] = prompts

    def prepare_batch(self, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return inputs

    def batch_scored(self, inputs: list[dict[str, Any]]) -> None:
        """Called on every rank after a training batch is scored."""

    # --- reading and setting TRL's state -------------------------------------------------------------------------

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
