"""The completions log: one row per completion of the newest batch, read from TRL's ``GRPOTrainer._logs`` layout
(its deques ``prompt``, ``completion``, ``rewards``, ``advantages`` and ``extra``; tests/test_trl_contract.py:
``test_logs_layout_read_by_completion_rows``, ``test_logs_images_hold_each_rollouts_tool_images``).

How a prompt or completion reads as text is the caller's (``text``: the trainer's
:meth:`~suzak.trl_internals.hooks.GRPOHooks.plain_text`), so this package reads no message format of suzak's own.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import contextmanager
from typing import Any


def _tail(values: Sequence | Iterable, count: int) -> list:
    values = list(values)
    return values[-count:] if count else []


def completion_rows(logs: Mapping[str, Any], image_refs: Sequence[str], step: int,
                    reward_weights: Sequence[float] | None = None, extra_columns: Iterable[str] = (), *,
                    text: Callable[[Any], str]) -> list[dict]:  # fmt: skip
    """CSV rows for the newest generation batch held in TRL's ``GRPOTrainer._logs``.

    TRL appends every scored batch (gathered over ranks) to ``_logs`` deques; the last ``len(image_refs)`` entries
    are this batch. ``extra_columns`` are the ``log_extra`` columns written for this batch (older ones may be stale);
    ``text`` reads a prompt or completion as plain text.
    """
    count = min(len(image_refs), len(logs["prompt"]))
    rewards = {name: _tail(values, count) for name, values in logs["rewards"].items()}
    columns: dict[str, list] = {
        "prompt": [text(p) for p in _tail(logs["prompt"], count)],
        "image": list(image_refs[-count:]) if count else [],
        "completion": [text(c) for c in _tail(logs["completion"], count)],
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
def plain_text_logs(logs: dict[str, Any], text: Callable[[Any], str]):
    """Within the block, TRL's ``_logs`` hold their prompts and completions as plain text (read by ``text``)."""
    prompts, completions = logs["prompt"], logs["completion"]
    logs["prompt"] = deque((text(p) for p in prompts), maxlen=prompts.maxlen)
    logs["completion"] = deque((text(c) for c in completions), maxlen=completions.maxlen)
    try:
        yield
    finally:
        logs["prompt"], logs["completion"] = prompts, completions
