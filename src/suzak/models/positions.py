"""Where Qwen2-VL and Qwen2.5-VL place the tokens of a prompt with a video: M-RoPE positions as Qwen trained the
models, and as vLLM computes them.

transformers 5.3 to 5.17 rewrote these two families' ``get_rope_index`` (huggingface/transformers#45381, #48669) and
departs from Qwen's own code, which vLLM follows, in two ways that only video shows:

- Qwen2.5-VL's time step between frame pairs is ``int(second_per_grid_ts) * tokens_per_second``: the seconds per
  pair are cut to whole seconds before they are scaled. Qwen rounds ``pair * second_per_grid_ts * tokens_per_second``
  down instead. A clip sampled at 4 fps (0.5 s per pair) then gets one time position for every frame; one at 1.6 fps
  (1.25 s per pair) gets steps of 2 instead of 2 or 3 (Qwen's 0, 2, 5, 7);
- the text after a visual block starts at the block's spatial extent (``max(h, w)`` merged patches) instead of one past
  its largest position: where a clip's time positions outrun its width, the question and the answer sit inside the
  clip's time span.

So the policy trained on positions that neither the pretrained model nor vLLM's sampler uses (vLLM sampled one
model, training scored another), and HF and vLLM evaluation read the same clip differently.

Images (one time step) come out the same either way. Qwen3-VL and Qwen3.5 split a clip into single frames with
timestamps and are not affected. :func:`use_qwen_video_positions` puts :func:`qwen_rope_index` in place of the two
classes' ``get_rope_index``. The policy, TRL's reference model and the HF eval engine all use it, so training,
HF generation and vLLM put every token in the same place. ``tests/test_positions.py`` fails once transformers agrees with
Qwen again, so that this module can go.
"""

from __future__ import annotations

import itertools
import logging

import torch

__all__ = ["qwen_rope_index", "use_qwen_video_positions"]

logger = logging.getLogger(__name__)

_REPLACED: dict[type, object] = {}  # class -> transformers' own get_rope_index, for tests/test_positions.py


def _model_classes() -> list[type]:
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel

    return [Qwen2VLModel, Qwen2_5_VLModel]


def qwen_rope_index(
    self,
    input_ids: torch.LongTensor,
    mm_token_type_ids: torch.IntTensor,
    image_grid_thw: torch.LongTensor | None = None,
    video_grid_thw: torch.LongTensor | None = None,
    second_per_grid_ts: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``get_rope_index`` of Qwen2-VL and Qwen2.5-VL with Qwen's positions (same arguments and results): each text
    run starts one past the largest position before it; a visual block's time positions are
    ``floor(pair * second_per_grid_ts * tokens_per_second)`` (seconds per pair 1 where not given, Qwen2-VL's
    ``tokens_per_second`` 1), its height and width positions its merged patch rows and columns, all offset by the
    block's start. Padding (``attention_mask`` 0) keeps position 0."""
    vision = self.config.vision_config
    merge = vision.spatial_merge_size
    per_second = float(getattr(vision, "tokens_per_second", 1.0))
    grids = {1: iter(image_grid_thw.tolist() if image_grid_thw is not None else []),
             2: iter(video_grid_thw.tolist() if video_grid_thw is not None else [])}  # fmt: skip
    seconds = iter(torch.as_tensor(second_per_grid_ts).tolist() if second_per_grid_ts is not None else [])
    device = input_ids.device
    position_ids = torch.zeros(3, *input_ids.shape, dtype=input_ids.dtype, device=device)
    deltas = []
    for row in range(input_ids.shape[0]):
        kept = attention_mask[row].bool() if attention_mask is not None else torch.ones_like(input_ids[row], dtype=bool)
        pieces, start = [], 0
        for kind, run in itertools.groupby(mm_token_type_ids[row][kept].tolist()):
            if kind == 0:
                pieces.append(torch.arange(len(list(run))).expand(3, -1) + start)
            else:
                t, h, w = next(grids[kind])
                step = next(seconds, 1.0) * per_second if kind == 2 else 1.0
                time = (torch.arange(t, dtype=torch.float64) * step).long()
                grid = torch.meshgrid(time, torch.arange(h // merge), torch.arange(w // merge), indexing="ij")
                pieces.append(torch.stack(grid).reshape(3, -1) + start)
            start = int(pieces[-1].max()) + 1
        position_ids[:, row, kept] = torch.cat(pieces, dim=1).to(device=device, dtype=input_ids.dtype)
        deltas.append(start - int(kept.sum()))
    return position_ids, torch.tensor(deltas, device=device).unsqueeze(1)


def use_qwen_video_positions() -> None:
    """Give Qwen2-VL and Qwen2.5-VL models (every instance, loaded before or after) :func:`qwen_rope_index`. Calling it
    again does nothing."""
    for cls in _model_classes():
        if cls.get_rope_index is not qwen_rope_index:
            _REPLACED[cls] = cls.get_rope_index
            cls.get_rope_index = qwen_rope_index
            logger.debug("%s.get_rope_index: Qwen's positions for video (suzak.models.positions)", cls.__name__)
