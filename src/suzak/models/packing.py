"""Padding-free passes: the rows of a model call packed into one sequence without padding (docs/padding_free.md).

TRL pads every row of a generation batch to the widest prompt (left) and the widest completion (right), and each
training pass (old log-probabilities, reference, loss) computes that whole width. :func:`packing_rows` packs each
call instead: the attended tokens of its rows, in order, in one row of ``sum(lengths)`` tokens, with

- each row's positions restarted: text positions ``0..n-1`` per row, and for the Qwen VL families the multimodal
  rotary positions the padded call gives the same tokens (the model's own ``compute_3d_position_ids``, so
  Qwen2-VL/2.5-VL's 3-D M-RoPE, Qwen3-VL's interleaved layout and :mod:`suzak.models.positions`' video fix alike), the
  text row first, as transformers takes packed rows (shape ``(4, 1, total)``);
- images and clips in place (pixel values in row order, as the padded call has them);
- attention confined to each row: with ``flash_attention_2`` transformers' varlen path (it reads the restarts in the
  text positions); with ``sdpa`` each row's own causal ``scaled_dot_product_attention`` (:data:`ROW_ATTENTION`,
  registered with transformers' ``AttentionInterface``: no mask of ``total²`` is built); ``eager`` gets transformers'
  packed block mask.
- labels shifted within each row (TRL's fused LM head takes ``shift_labels``), so no row predicts the next one's
  first token; the per-token outputs are put back where the padded call has them (zeros elsewhere, as TRL's head
  gives for unlabelled positions).

A model the packing cannot keep exact runs padded (:func:`packing_refusal` says why, once): Qwen3.5's
linear-attention layers (their short convolution reads across rows on the CPU path), a model with sliding-window
attention on, or a family whose positions this module does not compute.
"""

from __future__ import annotations

import contextvars
import inspect
import logging
from contextlib import contextmanager
from dataclasses import dataclass

import torch

__all__ = ["ROW_ATTENTION", "PackingCount", "packing_refusal", "packing_rows", "use_row_attention"]

logger = logging.getLogger(__name__)

ROW_ATTENTION = "sdpa_rows"  # the attention implementation packed sdpa calls use (one causal sdpa per row)
ROWS_KWARG = "suzak_packed_rows"  # the packed rows' lengths, handed to every attention call (survives recomputation)
_PACKED = contextvars.ContextVar("suzak_packed", default=False)  # a packed call's mask is not built
_ROW_MODEL_TYPES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "qwen2", "qwen3", "qwen3_moe", "qwen2_moe")


@dataclass
class PackingCount:
    """Real tokens and positions computed by the model calls since the last :meth:`take` (``perf/real_token_fraction``)."""

    real: int = 0
    computed: int = 0

    def add(self, real: int, computed: int) -> None:
        self.real += int(real)
        self.computed += int(computed)

    def take(self) -> tuple[int, int]:
        taken = (self.real, self.computed)
        self.real = self.computed = 0
        return taken


def _row_attention(module, query, key, value, attention_mask, **kwargs):
    """sdpa, one causal call per packed row when the call is packed; transformers' sdpa otherwise."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    lengths = kwargs.pop(ROWS_KWARG, None)
    if lengths is None or query.shape[0] != 1 or sum(lengths) != query.shape[2]:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    kwargs.pop("is_causal", None)
    outputs, start = [], 0
    for n in lengths:
        rows = slice(start, start + n)
        out, _ = sdpa_attention_forward(module, query[:, :, rows], key[:, :, rows], value[:, :, rows], None,
                                        is_causal=True, **kwargs)  # fmt: skip
        outputs.append(out)
        start += n
    return torch.cat(outputs, dim=1), None


def _row_mask(*args, **kwargs):
    """sdpa's mask, none for a packed call (each row attends causally to itself in :func:`_row_attention`)."""
    from transformers.masking_utils import sdpa_mask

    return None if _PACKED.get() else sdpa_mask(*args, **kwargs)


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ROW_ATTENTION, _row_attention)
    AttentionMaskInterface.register(ROW_ATTENTION, _row_mask)


def _unwrapped(model):
    """The transformers model inside DDP/DeepSpeed (``.module``) and PEFT (``get_base_model``) wrappers."""
    seen = set()
    while id(model) not in seen:
        seen.add(id(model))
        if hasattr(model, "get_base_model"):
            model = model.get_base_model()
        elif isinstance(getattr(model, "module", None), torch.nn.Module):
            model = model.module
    return model


def _text_config(model):
    config = _unwrapped(model).config
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def packing_refusal(model) -> str | None:
    """Why this model's calls cannot be packed exactly (they then run padded), or None."""
    inner = _unwrapped(model)
    config = inner.config
    text = _text_config(model)
    if "linear_attention" in (getattr(text, "layer_types", None) or []):
        return (f"{config.model_type}'s linear-attention layers would read across packed rows (their short "
                "convolution takes no row boundaries on this path): its passes run padded")  # fmt: skip
    if getattr(text, "use_sliding_window", False) and getattr(text, "sliding_window", None):
        return f"{config.model_type} with sliding-window attention on: its passes run padded"
    if config.model_type not in _ROW_MODEL_TYPES and text.model_type not in _ROW_MODEL_TYPES:
        return f"{config.model_type}: suzak computes no per-row positions for this family, its passes run padded"
    implementation = getattr(text, "_attn_implementation", None)
    if implementation not in ("sdpa", ROW_ATTENTION, "eager", "flash_attention_2", "flash_attention_3"):
        return f"attention implementation {implementation!r} takes no packed rows here: the passes run padded"
    return None


def use_row_attention(model) -> None:
    """Give ``model``'s language layers :data:`ROW_ATTENTION` where they use sdpa: the same sdpa where a call is not
    packed, each row's own where it is. The vision tower keeps its own implementation."""
    _register()
    text = _text_config(model)
    if getattr(text, "_attn_implementation", None) == "sdpa":
        text._attn_implementation_internal = ROW_ATTENTION


def _positions_core(model):
    """The module with the family's ``compute_3d_position_ids`` (a Qwen VL model's ``.model``), or None (text)."""
    inner = _unwrapped(model)
    for candidate in (inner, getattr(inner, "model", None)):
        if candidate is not None and hasattr(candidate, "compute_3d_position_ids"):
            return candidate
    return None


def _rope_positions(core, kwargs: dict) -> torch.Tensor | None:
    """The 3-D positions of the padded call's tokens (3, rows, width), as the model computes them; None: text."""
    method = core.compute_3d_position_ids
    accepted = inspect.signature(method).parameters
    given = {"input_ids": kwargs["input_ids"], "inputs_embeds": None, "attention_mask": kwargs["attention_mask"],
             "past_key_values": None}  # fmt: skip
    for name in ("image_grid_thw", "video_grid_thw", "second_per_grid_ts", "mm_token_type_ids"):
        given[name] = kwargs.get(name)
    saved = getattr(core, "rope_deltas", None)
    try:
        return method(**{k: v for k, v in given.items() if k in accepted})
    finally:
        core.rope_deltas = saved


@dataclass
class _Plan:
    rows: int
    width: int
    columns: torch.Tensor  # each packed token's column in the padded call
    row_of: torch.Tensor  # each packed token's row


def _pack(core, kwargs: dict) -> tuple[dict, _Plan] | None:
    """The packed call's kwargs for TRL's fused-head call on padded rows, and how to put its outputs back; None where
    the rows are not one contiguous run of attended tokens each (the call then runs as it came)."""
    ids, mask, labels = kwargs.get("input_ids"), kwargs.get("attention_mask"), kwargs.get("labels")
    if ids is None or mask is None or labels is None or ids.dim() != 2 or kwargs.get("position_ids") is not None:
        return None
    rows, width = ids.shape
    attended = mask.bool()
    lengths = attended.sum(1)
    first = attended.int().argmax(1)
    columns = torch.arange(width, device=ids.device)
    contiguous = (attended == ((columns >= first[:, None]) & (columns < (first + lengths)[:, None]))).all()
    if not bool(contiguous) or bool((lengths == 0).any()) or int(lengths.sum()) == rows * width:
        return None  # (no padding to leave out: packing would only add the per-row attention calls)
    row_of, col_of = attended.nonzero(as_tuple=True)
    packed = {k: v for k, v in kwargs.items() if k not in ("attention_mask", "labels")}
    for name, value in kwargs.items():
        if name not in packed or not torch.is_tensor(value):  # the mask and labels: replaced below
            continue
        if value.dim() >= 2 and value.shape[:2] == (rows, width):
            packed[name] = value[row_of, col_of][None]
    text = torch.cat([torch.arange(int(n), device=ids.device) for n in lengths.tolist()])
    rope = _rope_positions(core, kwargs) if core is not None else None
    if core is not None:
        spatial = rope[:, row_of, col_of][:, None] if rope is not None else text.view(1, 1, -1).expand(3, 1, -1)
        packed["position_ids"] = torch.cat([text.view(1, 1, -1), spatial.to(text.dtype)], dim=0)
    else:
        packed["position_ids"] = text[None]
    # each row's label of its next token, -100 at its last: no row predicts the next row's first token
    shifted = torch.full_like(labels, -100)
    shifted[:, :-1] = labels[:, 1:]
    packed["shift_labels"] = shifted[row_of, col_of][None]
    packed[ROWS_KWARG] = tuple(int(n) for n in lengths.tolist())
    packed["use_cache"] = False  # a cache object would keep transformers from building the packed mask
    return packed, _Plan(rows, width, col_of, row_of)


def _unpack(value, plan: _Plan):
    """A packed per-token output (1, total) in the padded call's layout: (rows, width - 1), column ``c`` the
    prediction made at column ``c`` (TRL's fused head drops the last column)."""
    if not torch.is_tensor(value) or value.dim() != 2 or value.shape[0] != 1 or value.shape[1] != plan.row_of.numel():
        return value
    keep = plan.columns < plan.width - 1
    flat = value.new_zeros(plan.rows * (plan.width - 1))
    index = plan.row_of[keep] * (plan.width - 1) + plan.columns[keep]
    flat = flat.index_put((index,), value[0][keep])
    return flat.view(plan.rows, plan.width - 1)


_PER_TOKEN = (
    "log_probs",
    "entropy",
    "log_sum_sq_probs",
    "mean_logits",
    "is_top1",
    "label_mask",
)  # TRL's FusedCausalLMOutput


@contextmanager
def packing_rows(model: torch.nn.Module, count: PackingCount | None = None, enabled: bool = True):
    """Within the block, every fused-head call of ``model`` (TRL's ``model(..., labels=, fused_lm_head=True)``) runs
    packed (module docstring), its outputs in the padded layout TRL reads; ``count`` adds each call's real tokens and
    the positions it computed. Calls of another shape, and calls without padding, run as they came.
    ``enabled=False``: counted, not packed."""
    core = _positions_core(model)
    plans: list[_Plan | None] = []
    tokens: list[contextvars.Token] = []

    def before(module, args, kwargs):
        if not kwargs.get("fused_lm_head"):
            plans.append(None)
            return args, kwargs
        ids, mask = kwargs.get("input_ids"), kwargs.get("attention_mask")
        packed = _pack(core, kwargs) if enabled else None
        if count is not None and ids is not None:
            real = int(mask.sum()) if mask is not None else ids.numel()
            count.add(real, real if packed is not None else ids.numel())
        if packed is None:
            plans.append(None)
            return args, kwargs
        plans.append(packed[1])
        tokens.append(_PACKED.set(True))
        return args, packed[0]

    def after(module, args, kwargs, output):
        plan = plans.pop() if plans else None
        if plan is None:
            return output
        _PACKED.reset(tokens.pop())
        for name in _PER_TOKEN:
            value = getattr(output, name, None)
            if value is not None:
                output[name] = _unpack(value, plan)
        return output

    pre = model.register_forward_pre_hook(before, with_kwargs=True)
    post = model.register_forward_hook(after, with_kwargs=True)
    try:
        yield
    finally:
        pre.remove()
        post.remove()
        while tokens:
            _PACKED.reset(tokens.pop())
