"""Tool-use rewards: how a rollout used its tools (read from TRL's ``environments``), not what it answered."""

from __future__ import annotations

from suzak import SuzakError
from suzak.scoring.marks import _reads_rollout


@_reads_rollout
def zoom_used(completions: list, environments: list | None = None, **kwargs) -> list[float | None]:
    """1.0 for a rollout that got at least one crop back from the zoom (a call the zoom answered with an image),
    else 0.0: a tool-use shaping reward, off unless a recipe lists it (docs/tools.md). It pays the call whatever the
    answer, so weight it well below the accuracy reward (``reward_weights``); TRL hands it each rollout's
    environment (``environments``). A run without the zoom is stopped before step 1 (:func:`suzak.train`).

    >>> class Rollout:
    ...     def __init__(self, crops): self.crops = crops
    >>> zoom_used(["red", "red", "blue"], environments=[Rollout([[0, 0, 56, 56]]), Rollout([]), Rollout([])])
    [1.0, 0.0, 0.0]
    """
    if environments is None or len(environments) != len(completions):
        raise SuzakError("reward 'zoom_used' reads each rollout's zoom: it needs a run with tools: [zoom]")
    return [float(bool(getattr(env, "crops", None))) for env in environments]
