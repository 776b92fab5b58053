"""The completions log: one row per completion of the newest batch, read from TRL's ``GRPOTrainer._logs`` layout
(its deques ``prompt``, ``completion``, ``rewards``, ``advantages`` and ``extra``; tests/test_trl_contract.py:
``test_logs_layout_read_by_completion_rows``, ``test_logs_images_hold_each_rollouts_tool_images``).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from suzak.scoring.parsing import message_text


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


@contextmanager
def plain_text_logs(logs: dict[str, Any]):
    """Within the block, TRL's ``_logs`` hold their prompts and completions as plain text (:func:`message_text`)."""
    prompts, completions = logs["prompt"], logs["completion"]
    logs["prompt"] = deque((message_text(p) for p in prompts), maxlen=prompts.maxlen)
    logs["completion"] = deque((message_text(c) for c in completions), maxlen=completions.maxlen)
    try:
        yield
    finally:
        logs["prompt"], logs["completion"] = prompts, completions
