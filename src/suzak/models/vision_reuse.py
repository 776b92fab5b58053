"""Encode each distinct image once per forward pass: the vision tower runs on a batch's distinct images (or clips)
only, and the rows that show the same picture share its features (``vision_reuse``, on by default; docs/vision_reuse.md).

In GRPO each prompt's image is in the batch ``num_generations`` times (8-16): TRL, EasyR1 and verl encode it again
for every completion, in every pass (the reference model, the old policy where it is computed, the policy's forward
and backward). Here the tower's ``forward`` is wrapped: the images of one call are told apart by their pixels and
grid (an exact comparison, after a cheap fingerprint), the tower runs on the distinct ones, and each output it
returns per patch or per merged token (``last_hidden_state``, ``pooler_output``, Qwen3-VL's ``deepstack_features``)
is gathered back to every image, in the order the call gave them (two hooks on the tower module). The gather is an ``index_select``: its backward
adds the gradients of the rows that share a picture, exactly what separate encodings give the tower. So per-token
log-probabilities and every gradient equal the unshared path's up to float round-off (``tests/test_vision_reuse.py``,
per family), with a trainable tower, a frozen one, LoRA on it, gradient checkpointing and ZeRO (DeepSpeed's own
hooks on the tower run beside these).

Only a call the hooks can read is shared: a ``grid_thw`` per image and no per-image tensor in its keyword
arguments (a caller's precomputed ``cu_seqlens`` would no longer match); any other call runs as it came.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["VisionReuse", "share_vision_encodings", "vision_tower"]

logger = logging.getLogger(__name__)


@dataclass
class VisionReuse:
    """What the wrapped tower did since it was installed: images it was handed, and how many it encoded."""

    images: int = 0
    encoded: int = 0

    def take(self) -> tuple[int, int]:
        """(images, encoded) since the last call, and start counting again."""
        counts = (self.images, self.encoded)
        self.images = self.encoded = 0
        return counts


def vision_tower(model) -> torch.nn.Module | None:
    """The model's vision tower: the module every supported family calls ``visual`` (under a PEFT wrapper too)."""
    for name, module in model.named_modules():
        if name == "visual" or name.endswith(".visual"):
            return module
    return None


def share_vision_encodings(model) -> VisionReuse | None:
    """Make ``model``'s vision tower encode the distinct images of each call once; returns the counters (the same
    ones if it does already), or None for a model without a tower (a text model).

    Two hooks on the tower, not a new ``forward``: one before it hands the tower the distinct images (and keeps
    which image shows which on the module), one after it gathers the outputs back; a copy of the model (TRL's
    reference model) carries them along and keeps its own plans."""
    tower = vision_tower(model)
    if tower is None:
        return None
    if isinstance(getattr(tower, "_suzak_vision_reuse", None), VisionReuse):
        return tower._suzak_vision_reuse
    tower._suzak_vision_reuse = VisionReuse()
    tower._suzak_vision_plans = []
    tower.register_forward_pre_hook(_before, with_kwargs=True)
    tower.register_forward_hook(_after, with_kwargs=True)
    return tower._suzak_vision_reuse


def _before(tower, args: tuple, kwargs: dict):
    """The tower's call with its distinct images only, and the plan to gather its outputs back (None: as it came)."""
    plan, call = None, None
    hidden = args[0] if args else kwargs.get("hidden_states")
    positional = len(args) > 1
    grid = args[1] if positional else kwargs.get("grid_thw")
    extra = {key: value for key, value in kwargs.items() if key not in ("hidden_states", "grid_thw")}
    readable = torch.is_tensor(hidden) and torch.is_tensor(grid) and not any(map(torch.is_tensor, extra.values()))
    if readable and int(grid.prod(-1).sum()) == hidden.shape[0]:
        patches = grid.prod(-1).tolist()
        distinct, which = _distinct(hidden, grid, patches)
        stats = tower._suzak_vision_reuse
        stats.images += len(patches)
        stats.encoded += len(distinct)
        if len(distinct) < len(patches):
            starts = _offsets(patches)
            pixels = torch.cat([hidden[starts[i] : starts[i] + patches[i]] for i in distinct])
            plan = ([patches[i] for i in distinct], which, int(getattr(tower, "spatial_merge_size", 2)), pixels.device)
            grid = grid[distinct]
            if positional:
                call = ((pixels, grid, *args[2:]), kwargs)
            elif args:
                call = ((pixels, *args[1:]), {**kwargs, "grid_thw": grid})
            else:
                call = (args, {**kwargs, "hidden_states": pixels, "grid_thw": grid})
    tower._suzak_vision_plans.append(plan)
    return call


def _after(tower, args: tuple, kwargs: dict, output: Any):
    plan = tower._suzak_vision_plans.pop()
    return None if plan is None else _gathered(output, *plan)


def _offsets(sizes: list[int]) -> list[int]:
    """Where each of consecutive blocks of ``sizes`` rows starts.

    >>> _offsets([4, 16, 4])
    [0, 4, 20]
    """
    out, total = [], 0
    for size in sizes:
        out.append(total)
        total += size
    return out


def _distinct(pixels: torch.Tensor, grid_thw: torch.Tensor, patches: list[int]) -> tuple[list[int], list[int]]:
    """(the index of each distinct image's first occurrence, for each image the position of its picture among those
    distinct ones). Two images are one picture when their grids and every pixel value are equal: a fingerprint (two
    weighted sums, read in one transfer) finds the candidates, ``torch.equal`` decides."""
    chunks = torch.split(pixels, patches)
    weights = torch.linspace(1.0, 2.0, pixels.shape[-1], device=pixels.device, dtype=torch.float64)
    prints = torch.stack([torch.stack([c.double().sum(), (c.double() @ weights).sum()]) for c in chunks]).tolist()
    grids = [tuple(row) for row in grid_thw.tolist()]
    distinct: list[int] = []
    seen: dict[tuple, list[int]] = {}  # fingerprint -> positions in ``distinct``
    which: list[int] = []
    for i, chunk in enumerate(chunks):
        key = (grids[i], *prints[i])
        match = next((k for k in seen.get(key, []) if torch.equal(chunks[distinct[k]], chunk)), None)
        if match is None:
            match = len(distinct)
            distinct.append(i)
            seen.setdefault(key, []).append(match)
        which.append(match)
    return distinct, which


def _gathered(out: Any, sizes: list[int], which: list[int], merge: int, device: torch.device) -> Any:
    """``out`` of the tower on the distinct images (``sizes`` patches each), each per-patch or per-merged-token output
    gathered back to every image (``which``: the distinct picture each shows)."""
    per_patch = _index(sizes, which, device)
    merged = _index([size // merge**2 for size in sizes], which, device)
    total = sum(sizes)

    def gather(value):
        if torch.is_tensor(value) and value.dim() >= 1:
            if value.shape[0] == total:
                return value.index_select(0, per_patch)
            if value.shape[0] == total // merge**2:
                return value.index_select(0, merged)
            return value
        if isinstance(value, (list, tuple)):
            return type(value)(gather(item) for item in value)
        return value

    if isinstance(out, dict):  # a ModelOutput (BaseModelOutputWithPooling, ...WithDeepstackFeatures)
        for key in list(out.keys()):
            out[key] = gather(out[key])
        return out
    return gather(out)


def _index(sizes: list[int], which: list[int], device: torch.device) -> torch.Tensor:
    """The rows of each image's block, taken from its distinct picture's block (blocks of ``sizes`` rows).

    >>> _index([2, 3], [0, 1, 0], torch.device("cpu")).tolist()
    [0, 1, 2, 3, 4, 0, 1]
    """
    starts = _offsets(sizes)
    return torch.cat([torch.arange(starts[k], starts[k] + sizes[k], device=device) for k in which])
