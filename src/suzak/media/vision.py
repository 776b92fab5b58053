"""The pixel budget: one min/max-pixels setting applied identically to training, vLLM generation and evaluation.

A Qwen VL model sees an image as (h/f)·(w/f) visual tokens after ``smart_resize``, where the factor f is its patch
size times its spatial merge size: 14 × 2 = 28 for Qwen2-VL and Qwen2.5-VL, 16 × 2 = 32 for Qwen3-VL and Qwen3.5.
The factor is read from the model (:func:`patch_factor`: its processor or config), never assumed. If the HF
processor, vLLM and the eval script each resize on their own settings, the prompt's image tokens and the image
features disagree ("image features and image tokens do not match", TRL #6401/#6294/#4488). suzak instead resizes
every image once with :func:`fit_image`, before any processor sees it, and configures processors with the same
bounds so they never resize again.

>>> smart_resize(240, 320, min_pixels=3136, max_pixels=401408, factor=28)  # a CLEVR render, Qwen2.5-VL
(252, 308)
>>> visual_tokens(240, 320, min_pixels=3136, max_pixels=401408, factor=28)
99
>>> visual_tokens(480, 640, min_pixels=3136, max_pixels=401408, factor=28)  # a SuperCLEVR render
391
>>> visual_tokens(480, 640, min_pixels=3136, max_pixels=401408, factor=32)  # the same render, Qwen3-VL
300

A video's budget sits beside the rest of video in :mod:`suzak.media.video` (:class:`~suzak.media.video.VideoBudget`:
its frames fitted like images, by the same factor).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
from PIL import Image
from qwen_vl_utils import smart_resize as _qwen_smart_resize

from suzak import SuzakError

__all__ = [
    "DEFAULT_MAX_PIXELS",
    "DEFAULT_MIN_PIXELS",
    "FAMILIES",
    "IMAGE_COLUMNS",
    "MAX_ASPECT_RATIO",
    "PIXEL_BUDGET_COLUMN",
    "VISION_PLACEHOLDERS",
    "PixelBudget",
    "collapse_runs",
    "configure_processor",
    "content_as_parts",
    "family_factors",
    "fit_image",
    "fit_row_images",
    "image_columns",
    "image_gaps_filled",
    "images_of",
    "map_row_images",
    "pad_left",
    "patch_factor",
    "processor_bounds",
    "processor_name",
    "ratio_padded_size",
    "prompt_tokens",
    "smart_resize",
    "to_rgb",
    "vision_family",
    "vision_token_ids",
    "visual_tokens",
]

logger = logging.getLogger(__name__)

DEFAULT_MIN_PIXELS = 3136  # 4 tokens of 28×28 pixels (Qwen2-VL, Qwen2.5-VL), 3 of 32×32 (Qwen3-VL, Qwen3.5)
DEFAULT_MAX_PIXELS = 401408  # R1-V's CLEVR setting: 512 tokens of 28×28 pixels, 392 of 32×32
# A row's own [min_pixels, max_pixels] (a mixture source's: suzak.data.mixture); None or absent: the run's budget.
PIXEL_BUDGET_COLUMN = "pixel_budget"
MAX_ASPECT_RATIO = 200  # qwen-vl-utils' and transformers' smart_resize refuse longer sides beyond 200x the shorter

# The vision-language families whose images suzak sizes: transformers' model_type -> name. Each resizes images to
# multiples of patch size × spatial merge size with smart_resize; the MoE variants share their family's vision tower
# and processor.
FAMILIES = {
    "qwen2_vl": "Qwen2-VL",
    "qwen2_5_vl": "Qwen2.5-VL",
    "qwen3_vl": "Qwen3-VL",
    "qwen3_vl_moe": "Qwen3-VL MoE",
    "qwen3_5": "Qwen3.5",
    "qwen3_5_moe": "Qwen3.5 MoE",
}

# Tokens that stand for pixels in a prompt, the same five in every family above: a policy must never generate them
# (a sampled <|image_pad|> has no image feature, and the training forward fails on the mismatch).
VISION_PLACEHOLDERS = ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>")


def _supported() -> str:
    return ", ".join(f"{model_type} ({name})" for model_type, name in FAMILIES.items())


def vision_family(config: Any) -> str | None:
    """The family name of a model config (``FAMILIES``); None for a text-only model.

    A vision-language model of another family is one :class:`~suzak.SuzakError` line: its images would be sized on
    a patch grid suzak cannot vouch for.

    >>> from transformers import AutoConfig
    >>> vision_family(AutoConfig.for_model("qwen3_vl")), vision_family(AutoConfig.for_model("qwen2"))
    ('Qwen3-VL', None)
    >>> vision_family(AutoConfig.for_model("llava"))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    suzak.SuzakError: model type 'llava' is a vision-language model of a family suzak does not support...
    """
    model_type = getattr(config, "model_type", None)
    if model_type in FAMILIES:
        return FAMILIES[model_type]
    if getattr(config, "vision_config", None) is None:
        return None
    raise SuzakError(
        f"model type {model_type!r} is a vision-language model of a family suzak does not support: its pixel budget "
        f"and visual-token counts are those of the Qwen VL families {_supported()}"
    )


def _side(size: Any) -> int:
    """A patch size as one int (configs may hold ``[h, w]``); suzak's budget needs square patches."""
    if isinstance(size, (list, tuple)):
        if len(set(size)) != 1:
            raise SuzakError(f"patch size {list(size)} is not square: suzak's pixel budget needs square patches")
        size = size[0]
    return int(size)


def patch_factor(source: Any) -> int | None:
    """Pixels per visual token along each side (patch size × spatial merge size), read from the model itself.

    ``source``: a processor (its ``image_processor``), an image processor (``patch_size``, ``merge_size``), a model
    config (``vision_config.patch_size``, ``vision_config.spatial_merge_size``; its family is checked with
    :func:`vision_family`) or a model (its config). None for a text-only model or tokenizer.

    >>> from transformers import AutoConfig
    >>> patch_factor(AutoConfig.for_model("qwen2_5_vl")), patch_factor(AutoConfig.for_model("qwen3_5"))
    (28, 32)
    """
    config = getattr(source, "config", None)
    if hasattr(config, "model_type"):  # a model
        source = config
    if hasattr(source, "model_type") and hasattr(source, "to_dict"):  # a config
        if vision_family(source) is None:
            return None
        vision = source.vision_config
        return _side(vision.patch_size) * int(vision.spatial_merge_size)
    image_processor = getattr(source, "image_processor", None)
    if image_processor is None and not hasattr(source, "patch_size"):
        return None  # a tokenizer: no images
    image_processor = image_processor or source
    patch, merge = getattr(image_processor, "patch_size", None), getattr(image_processor, "merge_size", None)
    if not patch or not merge:
        raise SuzakError(
            f"{type(image_processor).__name__} has no patch_size and merge_size: suzak sizes images for the Qwen VL "
            f"processors only ({_supported()})"
        )
    return _side(patch) * int(merge)


@cache
def family_factors() -> dict[str, int]:
    """Each supported model type's factor as transformers' config class defines it (its published checkpoints').

    >>> family_factors()["qwen2_vl"], family_factors()["qwen3_vl"]
    (28, 32)
    """
    from transformers import AutoConfig

    return {model_type: patch_factor(AutoConfig.for_model(model_type)) for model_type in FAMILIES}


@dataclass(frozen=True)
class PixelBudget:
    """The min/max pixels every image is fitted to, and the model's pixels per visual token along a side.

    ``factor`` (patch size × spatial merge size) belongs to the model: :meth:`for_model` sets it from the model's
    processor or config (:func:`patch_factor`). A budget without one cannot size an image: sizing for a guessed
    factor is how a Qwen3-VL run would silently get Qwen2-VL's token counts.

    >>> from transformers import AutoConfig
    >>> budget = PixelBudget(3136, 401408)
    >>> [budget.for_model(AutoConfig.for_model(t)).tokens(240, 320) for t in ("qwen2_5_vl", "qwen3_vl")]  # a CLEVR render
    [99, 80]
    """

    min_pixels: int = DEFAULT_MIN_PIXELS
    max_pixels: int = DEFAULT_MAX_PIXELS
    factor: int | None = None

    def __post_init__(self):
        if not 0 < self.min_pixels <= self.max_pixels:
            raise ValueError(f"need 0 < min_pixels <= max_pixels, got {self.min_pixels} and {self.max_pixels}")
        if self.factor is not None and self.max_pixels < self.factor * self.factor:
            raise ValueError(f"max_pixels {self.max_pixels} is below one visual token ({self.factor}x{self.factor} = "
                             f"{self.factor * self.factor} pixels)")  # fmt: skip

    def for_model(self, source: Any) -> PixelBudget:
        """This budget with the factor of the model behind ``source`` (processor, config or model; see
        :func:`patch_factor`). Unchanged for a text-only model, which sees no images.

        A budget already bound to another factor (a processor that disagrees with its model's config), or whose
        max_pixels is below one of the model's visual tokens, is one :class:`~suzak.SuzakError` line.
        """
        factor = patch_factor(source)
        if factor is None or factor == self.factor:
            return self
        if self.factor is not None:
            raise SuzakError(f"the pixel budget was set for {self.factor}x{self.factor}-pixel visual tokens but "
                             f"{processor_name(source)} makes {factor}x{factor}: the processor and the model disagree")  # fmt: skip
        if self.max_pixels < factor * factor:
            raise SuzakError(f"max_pixels {self.max_pixels} is below one visual token of this model ({factor}x{factor}"
                             f" = {factor * factor} pixels): set max_pixels to at least {factor * factor}")  # fmt: skip
        return dataclasses.replace(self, factor=factor)

    def for_crops(self, max_pixels: int | None) -> PixelBudget | None:
        """The budget of a zoom's crops (``tool_max_pixels``; None: this budget's max): this budget's min pixels and
        factor. None for a text model's budget (no factor: it sees no images).

        >>> PixelBudget(3136, 401408, factor=28).for_crops(200704)
        PixelBudget(min_pixels=3136, max_pixels=200704, factor=28)
        """
        if self.factor is None:
            return None
        return dataclasses.replace(self, max_pixels=self.max_pixels if max_pixels is None else max_pixels)

    def _factor(self) -> int:
        if self.factor is None:
            raise ValueError("this pixel budget has no patch factor yet: PixelBudget.for_model(processor) sets the "
                             "model's")  # fmt: skip
        return self.factor

    def size(self, height: int, width: int) -> tuple[int, int]:
        return smart_resize(height, width, self.min_pixels, self.max_pixels, factor=self._factor())

    def tokens(self, height: int, width: int) -> int:
        return visual_tokens(height, width, self.min_pixels, self.max_pixels, factor=self._factor())

    def fit(self, image: Image.Image) -> Image.Image:
        return fit_image(image, self.min_pixels, self.max_pixels, factor=self._factor())

    def of_row(self, row: Mapping[str, Any]) -> PixelBudget:
        """The budget of one data row's images: the row's own bounds (:data:`PIXEL_BUDGET_COLUMN`, set on the rows of
        a mixture source with its own ``min_pixels``/``max_pixels``) on this budget's patch factor, else this budget.

        This budget is the one processors and vLLM are configured with, so it must enclose the row's: an image
        fitted to the row's bounds is then left at its size by every processor downstream.

        >>> run = PixelBudget(3136, 401408, factor=28)
        >>> run.of_row({"pixel_budget": [3136, 50176]}).tokens(480, 640), run.of_row({}).tokens(480, 640)
        (54, 391)
        """
        own = row.get(PIXEL_BUDGET_COLUMN)
        if own is None:
            return self
        low, high = (int(value) for value in own)
        if (low, high) == (self.min_pixels, self.max_pixels):
            return self
        if not (self.min_pixels <= low <= high <= self.max_pixels):
            raise SuzakError(f"a row's {PIXEL_BUDGET_COLUMN} [{low}, {high}] is not inside the run's pixel budget "
                             f"[{self.min_pixels}, {self.max_pixels}], which the processors resize into")  # fmt: skip
        return dataclasses.replace(self, min_pixels=low, max_pixels=high)

    def enclosing(self, others: Sequence[PixelBudget]) -> PixelBudget:
        """The smallest budget containing this one and ``others`` (same factor): what the processors and vLLM are
        set to when a mixture's sources fit their rows to budgets of their own.

        >>> PixelBudget(3136, 50176).enclosing([PixelBudget(12544, 1003520)])
        PixelBudget(min_pixels=3136, max_pixels=1003520, factor=None)
        """
        budgets = [self, *others]
        return dataclasses.replace(self, min_pixels=min(b.min_pixels for b in budgets),
                                   max_pixels=max(b.max_pixels for b in budgets))  # fmt: skip

    def within(self, min_pixels: int, max_pixels: int) -> bool:
        """True when a processor resizing into [min_pixels, max_pixels] leaves every fitted image as it is.

        A fitted image's area lies in [self.min_pixels, self.max_pixels] and its sides are multiples of the factor,
        so another ``smart_resize`` with that factor keeps it exactly when those bounds contain the budget's.

        >>> PixelBudget(3136, 401408).within(3136, 12845056), PixelBudget(3136, 1003520).within(3136, 401408)
        (True, False)
        """
        return min_pixels <= self.min_pixels and self.max_pixels <= max_pixels


def processor_name(source: Any) -> str:
    """The class name of ``source``'s image processor (or of ``source``), for error lines about a model's patch grid."""
    return type(getattr(source, "image_processor", source)).__name__


def smart_resize(
    height: int,
    width: int,
    min_pixels: int = DEFAULT_MIN_PIXELS,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    *,
    factor: int,
) -> tuple[int, int]:
    """(h, w) the image is resized to: multiples of ``factor``, area within [min_pixels, max_pixels], aspect kept.

    This is ``qwen_vl_utils.smart_resize`` (the reference implementation), with suzak's argument order, applied to
    the size :func:`fit_image` pads an image beyond Qwen's 200:1 aspect ratio to (Qwen's own refuses it).

    >>> smart_resize(1, 500, factor=28)  # a 500x1 line of pixels: padded to 500x3 first
    (28, 504)
    """
    height, width = ratio_padded_size(height, width, min_pixels, max_pixels, factor=factor)
    return _qwen_smart_resize(height, width, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels)


def ratio_padded_size(
    height: int,
    width: int,
    min_pixels: int = DEFAULT_MIN_PIXELS,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    *,
    factor: int,
) -> tuple[int, int]:
    """(h, w) with the short side grown until the image, once resized for the budget, is at most
    ``MAX_ASPECT_RATIO`` times longer than wide: the processors refuse more, before and after resizing.

    >>> ratio_padded_size(1, 500, factor=28), ratio_padded_size(700, 2, factor=28), ratio_padded_size(240, 320, factor=28)
    ((3, 500), (700, 4), (240, 320))
    >>> ratio_padded_size(20, 7000, factor=28)  # 35 would round back down to 28 px against 7000: 250:1
    (42, 7000)
    """
    long_side, short = max(height, width), min(height, width)
    short = max(short, math.ceil(long_side / MAX_ASPECT_RATIO))
    while True:
        h, w = (short, long_side) if height <= width else (long_side, short)
        out_h, out_w = _qwen_smart_resize(h, w, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels)
        if max(out_h, out_w) <= MAX_ASPECT_RATIO * min(out_h, out_w):
            return h, w
        short += 1  # past the next rounding boundary within factor/2 steps


def visual_tokens(
    height: int,
    width: int,
    min_pixels: int = DEFAULT_MIN_PIXELS,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    *,
    factor: int,
) -> int:
    """Visual tokens the model sees for an image of this size under the budget: (h/factor)·(w/factor)."""
    h, w = smart_resize(height, width, min_pixels, max_pixels, factor=factor)
    return (h // factor) * (w // factor)


def _nominal_range(mode: str, hi: float) -> float:
    """The full-scale value of a wide image mode: 1.0 for float images within [0, 1], else the 16-bit 65535 (PIL
    opens 16-bit PNG/TIFF as ``I;16`` or ``I``)."""
    return 1.0 if mode == "F" and hi <= 1.0 else 65535.0


def to_rgb(image: Image.Image) -> Image.Image:
    """Any PIL mode to 8-bit RGB: alpha composited on white, palettes expanded, 16/32-bit and float rescaled.

    A 16/32-bit or float image is stretched from its darkest to its brightest pixel (16-bit scans rarely fill the
    range). A uniform one has no range to stretch: it keeps its level, scaled from the mode's full range, so a white
    16-bit image stays white.

    >>> to_rgb(Image.fromarray(np.full((2, 2), 65535, dtype=np.uint16))).getpixel((0, 0))
    (255, 255, 255)
    >>> to_rgb(Image.fromarray(np.full((2, 2), 32768, dtype=np.uint16))).getpixel((0, 0))
    (128, 128, 128)
    """
    if image.mode == "RGB":
        return image
    if image.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I", "F"):
        array = np.asarray(image, dtype=np.float64)
        lo, hi = float(array.min()), float(array.max())
        if hi > lo:
            scaled = (array - lo) / (hi - lo) * 255.0
        else:
            scaled = np.full_like(array, np.clip(lo / _nominal_range(image.mode, hi), 0.0, 1.0) * 255.0)
        return Image.fromarray(scaled.round().astype(np.uint8), mode="L").convert("RGB")
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = image.convert("RGBA")
        background = Image.new("RGB", rgba.size, (255, 255, 255))
        background.paste(rgba, mask=rgba.getchannel("A"))
        return background
    return image.convert("RGB")


def fit_image(
    image: Image.Image, min_pixels: int = DEFAULT_MIN_PIXELS, max_pixels: int = DEFAULT_MAX_PIXELS, *, factor: int
) -> Image.Image:
    """The image as RGB at the budget's size, so no processor downstream resizes it again.

    Uses bicubic resampling, as ``qwen_vl_utils.fetch_image`` does. An image already at the target size is only
    converted, never resampled, so fitting twice is a no-op. An image more elongated than Qwen's 200:1 limit (which
    Qwen's processors refuse) is first padded with white, centred, on its short side up to that ratio.
    """
    if not isinstance(image, Image.Image):
        raise TypeError(f"fit_image needs a PIL image, got {type(image).__name__}")
    rgb = to_rgb(image)
    height, width = ratio_padded_size(rgb.height, rgb.width, min_pixels, max_pixels, factor=factor)
    if (height, width) != (rgb.height, rgb.width):
        canvas = Image.new("RGB", (width, height), (255, 255, 255))
        canvas.paste(rgb, ((width - rgb.width) // 2, (height - rgb.height) // 2))
        rgb = canvas
    h, w = smart_resize(rgb.height, rgb.width, min_pixels, max_pixels, factor=factor)
    if h < factor or w < factor:
        raise ValueError(f"image of {rgb.width}x{rgb.height} is too elongated to fit {max_pixels} pixels")
    if (rgb.height, rgb.width) == (h, w):
        return rgb
    return rgb.resize((w, h), Image.Resampling.BICUBIC)


def configure_processor(processor: Any, budget: PixelBudget) -> Any:
    """Set the processor's image (and video) bounds to the budget, in place; returns the processor.

    transformers 5 keeps the bounds in ``size={"shortest_edge", "longest_edge"}`` (min/max pixels). With the images
    already fitted, the processor's own smart_resize then leaves them at their size.
    """
    for name in ("image_processor", "video_processor"):
        sub = getattr(processor, name, None)
        if sub is None or not hasattr(sub, "size"):
            continue
        sub.size = {"shortest_edge": budget.min_pixels, "longest_edge": budget.max_pixels}
        for attr, value in (("min_pixels", budget.min_pixels), ("max_pixels", budget.max_pixels)):
            if hasattr(sub, attr):
                setattr(sub, attr, value)
    return processor


def pad_left(processing_class: Any) -> Any:
    """Left padding for a processor or tokenizer, in place; a tokenizer without a pad token pads with EOS.

    Generation needs every prompt of a batch to end where new tokens start. And in training TRL left-pads prompt ids
    but takes ``mm_token_type_ids`` from the processor's own padding, setting left padding only when it loads the
    processor itself: with a right-padding processor the two disagree as soon as prompts differ in length (mixed
    image sizes) and Qwen2.5-VL's M-RoPE index fails with a shape mismatch (the R1-V #137 crash class).
    """
    for obj in (processing_class, getattr(processing_class, "tokenizer", None)):
        if obj is not None and hasattr(obj, "padding_side"):
            obj.padding_side = "left"
            obj.truncation_side = "left"
    tokenizer = getattr(processing_class, "tokenizer", processing_class)
    if getattr(tokenizer, "pad_token", None) is None and getattr(tokenizer, "eos_token", None) is not None:
        tokenizer.pad_token = tokenizer.eos_token
    return processing_class


def processor_bounds(processor: Any) -> tuple[int, int] | None:
    """(min_pixels, max_pixels) an image processor (or a processor holding one) resizes into; None if it has none."""
    sub = getattr(processor, "image_processor", processor)
    size = getattr(sub, "size", None) or {}
    low = size.get("shortest_edge", getattr(sub, "min_pixels", None))
    high = size.get("longest_edge", getattr(sub, "max_pixels", None))
    return (int(low), int(high)) if low is not None and high is not None else None


def vision_token_ids(processing_class: Any) -> list[int]:
    """Ids of the vision placeholder tokens of a VL model's processor: what generation may never sample.

    None for a text model's tokenizer, though Qwen's text tokenizers hold the placeholders too: a text model reads
    them as any other token (no image features to mismatch), so its generation stays exactly TRL's.
    """
    if getattr(processing_class, "image_processor", None) is None:
        return []
    tokenizer = processing_class.tokenizer
    vocab = tokenizer.get_vocab()
    return [vocab[t] for t in VISION_PLACEHOLDERS if t in vocab]


def collapse_runs(ids: list[int], token_id: int) -> list[int]:
    """``ids`` with every run of ``token_id`` shortened to one token: an image placeholder before expansion.

    The HF processor expands each image's ``<|image_pad|>`` into one token per visual token. vLLM expands
    placeholders itself, so a prompt that is already expanded gets expanded again (TRL #6294).

    >>> collapse_runs([1, 7, 7, 7, 2, 7, 7, 3], 7)
    [1, 7, 2, 7, 3]
    """
    return [t for i, t in enumerate(ids) if t != token_id or i == 0 or ids[i - 1] != token_id]


def collapse_video_blocks(ids: list[int], start: int, end: int, video: int) -> list[int]:
    """Processor-expanded prompt ids with each video back to the placeholder vLLM 0.24 expands itself.

    ``start``/``end`` are ``<|vision_start|>``/``<|vision_end|>``, ``video`` is ``<|video_pad|>``. Qwen2-VL and
    Qwen2.5-VL expand a video to ``start, video × n, end``: it becomes ``start, video, end`` and vLLM expands the
    ``video`` token. Qwen3-VL and Qwen3.5 (transformers 5.x) keep the template's ``start … end`` around one
    ``<t seconds> start, video × n, end`` block per pair of frames: it becomes ``start, start, video, end, end``, and
    vLLM replaces the inner ``start, video, end`` with its blocks (it replaces that whole string, transformers only
    the ``video`` token: vllm-project/vllm#46817), so both give the same ids. Image blocks are left as they are.

    >>> collapse_video_blocks([1, 8, 5, 5, 5, 9, 2], 8, 9, 5)  # Qwen2.5-VL
    [1, 8, 5, 9, 2]
    >>> collapse_video_blocks([1, 8, 3, 8, 5, 5, 9, 4, 8, 5, 5, 9, 9, 2], 8, 9, 5)  # Qwen3-VL: timestamps 3 and 4
    [1, 8, 8, 5, 9, 9, 2]
    >>> collapse_video_blocks([1, 8, 6, 6, 9, 2], 8, 9, 5)  # an image (6) is not touched
    [1, 8, 6, 6, 9, 2]
    """
    out: list[int] = []
    i = 0
    while i < len(ids):
        if ids[i] != start:
            out.append(ids[i])
            i += 1
            continue
        depth, j = 0, i
        while j < len(ids):  # the matching end, counting nested blocks
            depth += (ids[j] == start) - (ids[j] == end)
            if depth == 0:
                break
            j += 1
        inner = ids[i + 1 : j]
        if video not in inner:
            out += ids[i : j + 1]
        else:
            out += [start, start, video, end, end] if start in inner else [start, video, end]
        i = j + 1
    return out


def prompt_tokens(tokenizer: Any, text: str, images: list[Image.Image], budget: PixelBudget) -> int:
    """Tokens of a rendered prompt once each image placeholder (one ``<|image_pad|>``) becomes its visual tokens."""
    text_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return len(text_ids) - len(images) + sum(budget.tokens(img.height, img.width) for img in images)


IMAGE_COLUMNS = ("image", "images")  # TRL's: one image, a list of images (a prompt may also hold them inline)


def image_columns(column_names: Sequence[str]) -> list[str]:
    """The columns of a dataset with these ``column_names`` that hold images (:data:`IMAGE_COLUMNS`, in that order).

    >>> image_columns(["prompt", "images", "solution"]), image_columns(["prompt", "video"])
    (['images'], [])
    """
    return [column for column in IMAGE_COLUMNS if column in column_names]


def map_row_images(row: Mapping[str, Any], fn: Callable[[Image.Image], Image.Image]) -> dict:
    """A copy of a data row with ``fn`` applied to each of its PIL images, wherever TRL takes images from: the
    ``image`` column, the ``images`` list and ``{"type": "image", "image": <PIL>}`` parts inline in the prompt.

    The one place that knows where a row's images are (:func:`images_of`, :func:`fit_row_images` use it).
    """
    row = dict(row)
    if isinstance(row.get("image"), Image.Image):
        row["image"] = fn(row["image"])
    if isinstance(row.get("images"), list):
        row["images"] = [fn(img) if isinstance(img, Image.Image) else img for img in row["images"]]
    if isinstance(row.get("prompt"), list):
        row["prompt"] = [_map_message_images(message, fn) for message in row["prompt"]]
    return row


def content_as_parts(prompt: list) -> list:
    """Chat messages with a string ``content`` as one text part each (Qwen's chat templates render both alike), the
    form a message holding an image or video part has; other messages as they are.

    >>> content_as_parts([{"role": "user", "content": "How many?"}, {"role": "user", "content": [{"type": "image"}]}])
    [{'role': 'user', 'content': [{'type': 'text', 'text': 'How many?'}]}, {'role': 'user', 'content': [{'type': 'image'}]}]
    """
    return [{**m, "content": [{"type": "text", "text": m["content"]}]}
            if isinstance(m, dict) and isinstance(m.get("content"), str) else m for m in prompt]  # fmt: skip


def _map_message_images(message: Any, fn: Callable[[Image.Image], Image.Image]) -> Any:
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, list):
        return message
    parts = [{**part, "image": fn(part["image"])}
             if isinstance(part, dict) and isinstance(part.get("image"), Image.Image) else part
             for part in content]  # fmt: skip
    return {**message, "content": parts}


def image_gaps_filled(rows: list[dict]) -> list[dict]:
    """A batch's rows as TRL's GRPOTrainer can take them when some have no image (a video row, a text row): an
    ``images`` list that is None becomes ``[]``, and an ``image`` column that is None in every row is left out (TRL
    treats ``[]`` as no image but hands ``None`` to the processor, which refuses it).

    >>> image = Image.new("RGB", (4, 4))
    >>> image_gaps_filled([{"image": None, "p": 1}, {"image": None, "p": 2}])
    [{'p': 1}, {'p': 2}]
    >>> [sorted(row) for row in image_gaps_filled([{"image": image}, {"image": None}])], image_gaps_filled([{"images": None}])
    ([['image'], ['image']], [{'images': []}])
    """
    rows = [{**row, "images": []} if "images" in row and row["images"] is None else row for row in rows]
    if rows and all("image" in row and row["image"] is None for row in rows):
        rows = [{k: v for k, v in row.items() if k != "image"} for row in rows]
    return rows


def images_of(row: Mapping[str, Any]) -> list[Image.Image]:
    """The PIL images of a data row, in ``image``, ``images``, inline-prompt order; empty for a text row.

    >>> image = Image.new("RGB", (4, 4))
    >>> len(images_of({"image": image})), len(images_of({"prompt": [{"role": "user", "content": [{"type": "image",
    ...     "image": image}, {"type": "text", "text": "?"}]}]})), images_of({"prompt": "text only"})
    (1, 1, [])
    """
    found: list[Image.Image] = []
    map_row_images(row, lambda image: found.append(image) or image)
    return found


def fit_row_images(row: Mapping[str, Any], budget: PixelBudget, memo: dict | None = None) -> dict:
    """A copy of a data row with every image fitted to ``budget`` (:func:`map_row_images`), or to the row's own
    bounds where it has them (:meth:`PixelBudget.of_row`).

    Rows fitted with the same ``memo`` dict resize an image they share (by content: mode, size, pixels) once: a GRPO
    batch holds each prompt ``num_generations`` times, each a separately decoded copy of the same image.
    """
    budget = budget.of_row(row)  # a mixture source's own bounds, where its rows carry them
    if memo is None:
        return map_row_images(row, budget.fit)

    def fit(image: Image.Image) -> Image.Image:
        key = (image.mode, image.size, image.tobytes(), budget.min_pixels, budget.max_pixels)
        if key not in memo:
            memo[key] = budget.fit(image)
        return memo[key]

    return map_row_images(row, fit)
