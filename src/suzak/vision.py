"""The pixel budget: one min/max-pixels setting applied identically to training, vLLM generation and evaluation.

Qwen2.5-VL sees an image as (h/28)·(w/28) visual tokens after ``smart_resize``. If the HF processor, vLLM and the
eval script each resize on their own settings, the prompt's image tokens and the image features disagree ("image
features and image tokens do not match", TRL #6401/#6294/#4488). suzak instead resizes every image once with
:func:`fit_image`, before any processor sees it, and configures processors with the same bounds so they never
resize again.

>>> smart_resize(240, 320, min_pixels=3136, max_pixels=401408)  # a CLEVR render
(252, 308)
>>> visual_tokens(240, 320, min_pixels=3136, max_pixels=401408)
99
>>> visual_tokens(480, 640, min_pixels=3136, max_pixels=401408)  # a SuperCLEVR render
391
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image
from qwen_vl_utils import smart_resize as _qwen_smart_resize

__all__ = [
    "DEFAULT_MAX_PIXELS",
    "DEFAULT_MIN_PIXELS",
    "FACTOR",
    "VISION_PLACEHOLDERS",
    "PixelBudget",
    "collapse_runs",
    "configure_processor",
    "fit_image",
    "images_of",
    "pad_left",
    "precheck",
    "processor_bounds",
    "prompt_tokens",
    "smart_resize",
    "to_rgb",
    "vision_token_ids",
    "visual_tokens",
]

logger = logging.getLogger(__name__)

FACTOR = 28  # patch 14 × spatial merge 2: one visual token per 28×28 pixels (Qwen2-VL and Qwen2.5-VL)
DEFAULT_MIN_PIXELS = 3136  # 4 tokens
DEFAULT_MAX_PIXELS = 401408  # 512 tokens, R1-V's CLEVR setting

# Qwen2-VL / Qwen2.5-VL tokens that stand for pixels in a prompt: a policy must never generate them (a sampled
# <|image_pad|> has no image feature, and the training forward fails on the mismatch).
VISION_PLACEHOLDERS = ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>")


@dataclass(frozen=True)
class PixelBudget:
    """The min/max pixels every image is fitted to."""

    min_pixels: int = DEFAULT_MIN_PIXELS
    max_pixels: int = DEFAULT_MAX_PIXELS

    def __post_init__(self):
        if not 0 < self.min_pixels <= self.max_pixels:
            raise ValueError(f"need 0 < min_pixels <= max_pixels, got {self.min_pixels} and {self.max_pixels}")
        if self.max_pixels < FACTOR * FACTOR:
            raise ValueError(f"max_pixels {self.max_pixels} is below one visual token ({FACTOR * FACTOR} pixels)")

    def size(self, height: int, width: int) -> tuple[int, int]:
        return smart_resize(height, width, self.min_pixels, self.max_pixels)

    def tokens(self, height: int, width: int) -> int:
        return visual_tokens(height, width, self.min_pixels, self.max_pixels)

    def fit(self, image: Image.Image) -> Image.Image:
        return fit_image(image, self.min_pixels, self.max_pixels)

    def within(self, min_pixels: int, max_pixels: int) -> bool:
        """True when a processor resizing into [min_pixels, max_pixels] leaves every fitted image as it is.

        A fitted image's area lies in [self.min_pixels, self.max_pixels] and its sides are multiples of 28, so
        another ``smart_resize`` keeps it exactly when those bounds contain the budget's.

        >>> PixelBudget(3136, 401408).within(3136, 12845056), PixelBudget(3136, 1003520).within(3136, 401408)
        (True, False)
        """
        return min_pixels <= self.min_pixels and self.max_pixels <= max_pixels


def smart_resize(
    height: int,
    width: int,
    min_pixels: int = DEFAULT_MIN_PIXELS,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    factor: int = FACTOR,
) -> tuple[int, int]:
    """(h, w) the image is resized to: multiples of ``factor``, area within [min_pixels, max_pixels], aspect kept.

    This is ``qwen_vl_utils.smart_resize`` (the reference implementation), with suzak's argument order.
    """
    return _qwen_smart_resize(height, width, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels)


def visual_tokens(
    height: int,
    width: int,
    min_pixels: int = DEFAULT_MIN_PIXELS,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    factor: int = FACTOR,
) -> int:
    """Visual tokens the model sees for an image of this size under the budget: (h/28)·(w/28)."""
    h, w = smart_resize(height, width, min_pixels, max_pixels, factor)
    return (h // factor) * (w // factor)


def to_rgb(image: Image.Image) -> Image.Image:
    """Any PIL mode to 8-bit RGB: alpha composited on white, palettes expanded, 16/32-bit and float rescaled."""
    if image.mode == "RGB":
        return image
    if image.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I", "F"):
        array = np.asarray(image, dtype=np.float64)
        lo, hi = float(array.min()), float(array.max())
        scaled = (array - lo) / (hi - lo) * 255.0 if hi > lo else np.zeros_like(array)
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
    image: Image.Image, min_pixels: int = DEFAULT_MIN_PIXELS, max_pixels: int = DEFAULT_MAX_PIXELS
) -> Image.Image:
    """The image as RGB at the budget's size, so no processor downstream resizes it again.

    Uses bicubic resampling, as ``qwen_vl_utils.fetch_image`` does. An image already at the target size is only
    converted, never resampled, so fitting twice is a no-op.
    """
    if not isinstance(image, Image.Image):
        raise TypeError(f"fit_image needs a PIL image, got {type(image).__name__}")
    rgb = to_rgb(image)
    h, w = smart_resize(rgb.height, rgb.width, min_pixels, max_pixels)
    if h < FACTOR or w < FACTOR:
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
    """Ids of the vision placeholder tokens this tokenizer has (none for a text-only tokenizer)."""
    tokenizer = getattr(processing_class, "tokenizer", processing_class)
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


def prompt_tokens(tokenizer: Any, text: str, images: list[Image.Image], budget: PixelBudget) -> int:
    """Tokens of a rendered prompt once each image placeholder (one ``<|image_pad|>``) becomes its visual tokens."""
    text_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return len(text_ids) - len(images) + sum(budget.tokens(img.height, img.width) for img in images)


def images_of(row: dict) -> list[Image.Image]:
    """The PIL images of a data row (``images`` list or single ``image``); empty for text rows."""
    if row.get("images") is not None:
        return list(row["images"])
    if row.get("image") is not None:
        return [row["image"]]
    return []


def precheck(
    dataset,
    processing_class: Any,
    budget: PixelBudget,
    *,
    max_completion_length: int = 0,
    context_length: int | None = None,
    num_rows: int | None = 256,
) -> dict[str, Any]:
    """Visual tokens and prompt length over (a sample of) a dataset, with a warning when prompts won't fit.

    Prompt length = text tokens of the chat-templated prompt (one placeholder per image) + visual tokens.
    Returns ``{"rows", "visual_tokens": {min, mean, max}, "prompt_tokens": {min, mean, max}, "too_long"}``.
    """
    tokenizer = getattr(processing_class, "tokenizer", processing_class)
    n = len(dataset) if num_rows is None else min(num_rows, len(dataset))
    visual, prompt_lengths, too_long = [], [], []
    for index in range(n):
        row = dataset[index]
        images = images_of(row)
        text = tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
        length = prompt_tokens(tokenizer, text, images, budget)
        visual.append(sum(budget.tokens(img.height, img.width) for img in images))
        prompt_lengths.append(length)
        if context_length is not None and length + max_completion_length > context_length:
            too_long.append(index)
    report = {
        "rows": n,
        "visual_tokens": _summary(visual),
        "prompt_tokens": _summary(prompt_lengths),
        "too_long": too_long,
    }
    logger.info(
        "pre-check over %d rows: visual tokens/prompt min %d mean %.1f max %d; prompt tokens min %d mean %.1f max %d",
        n, *report["visual_tokens"].values(), *report["prompt_tokens"].values(),
    )  # fmt: skip
    if too_long:
        logger.warning(
            "%d of %d prompts + %d completion tokens exceed the model's context of %s tokens (first rows: %s); "
            "lower max_pixels or max_completion_length, or filter those rows",
            len(too_long), n, max_completion_length, context_length, too_long[:5],
        )  # fmt: skip
    return report


def _summary(values: list[int]) -> dict[str, float]:
    if not values:
        return {"min": 0, "mean": 0.0, "max": 0}
    return {"min": min(values), "mean": statistics.fmean(values), "max": max(values)}
