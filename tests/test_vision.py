"""The pixel budget: smart_resize agrees with qwen-vl-utils, fit_image handles every mode and extreme size."""

from __future__ import annotations

import copy
import random

import numpy as np
import pytest
import qwen_vl_utils
from PIL import Image

from suzak.media.vision import PixelBudget, configure_processor, fit_image, smart_resize, visual_tokens

QWEN2 = 28  # Qwen2-VL/Qwen2.5-VL's patch factor (14 x 2), as the tiny Qwen2.5-VL's processor says

BUDGETS = [(3136, 401408), (3136, 501760), (56 * 56, 28 * 28 * 1280), (200704, 200704 * 4)]


@pytest.mark.parametrize("factor", [28, 32])  # Qwen2-VL/Qwen2.5-VL, Qwen3-VL/Qwen3.5
@pytest.mark.parametrize("min_pixels,max_pixels", BUDGETS)
def test_smart_resize_matches_qwen_vl_utils(min_pixels, max_pixels, factor):
    rng = random.Random(min_pixels + max_pixels)
    for _ in range(500):
        h, w = rng.randint(1, 5000), rng.randint(1, 5000)
        if max(h, w) / min(h, w) > 200:
            continue
        expected = qwen_vl_utils.smart_resize(h, w, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels)
        got = smart_resize(h, w, min_pixels, max_pixels, factor=factor)
        assert got == expected
        assert got[0] % factor == 0 and got[1] % factor == 0
        tokens = visual_tokens(h, w, min_pixels, max_pixels, factor=factor)
        assert tokens == (got[0] // factor) * (got[1] // factor)
        assert PixelBudget(min_pixels, max_pixels, factor).tokens(h, w) == tokens


def _image(mode: str, size=(37, 23)) -> Image.Image:
    rng = np.random.default_rng(0)
    w, h = size
    if mode in ("I;16", "I"):
        image = Image.fromarray(rng.integers(0, 65535, (h, w), dtype=np.uint16 if mode == "I;16" else np.int32))
        assert image.mode == mode
        return image
    if mode == "F":
        return Image.fromarray(rng.random((h, w), dtype=np.float32))
    base = Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8), "RGB")
    if mode == "P":
        return base.convert("P", palette=Image.Palette.ADAPTIVE)
    if mode == "PA":  # palette with transparency
        image = base.convert("P", palette=Image.Palette.ADAPTIVE)
        image.info["transparency"] = 0
        return image
    return base.convert(mode)


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "LA", "L", "1", "P", "PA", "CMYK", "YCbCr", "HSV", "I;16", "I", "F"])
def test_fit_image_any_mode_to_rgb(mode):
    image = _image(mode)
    fitted = fit_image(image, 3136, 401408, factor=QWEN2)
    assert fitted.mode == "RGB"
    assert (fitted.height, fitted.width) == smart_resize(image.height, image.width, 3136, 401408, factor=QWEN2)
    assert np.asarray(fitted).std() > 0  # content survived the conversion


def test_fit_image_rgba_composites_on_white():
    image = Image.new("RGBA", (56, 56), (255, 0, 0, 0))  # fully transparent red
    assert fit_image(image, factor=QWEN2).getpixel((10, 10)) == (255, 255, 255)


def test_fit_image_sixteen_bit_uses_full_range():
    array = np.array([[0, 65535] * 28] * 56, dtype=np.uint16)
    fitted = np.asarray(fit_image(Image.fromarray(array), factor=QWEN2))
    assert fitted.min() == 0 and fitted.max() == 255


@pytest.mark.parametrize(
    ("array", "level"),
    [
        (np.full((56, 56), 65535, dtype=np.uint16), 255),  # white stays white (was stretched to black)
        (np.full((56, 56), 32768, dtype=np.uint16), 128),
        (np.full((56, 56), 0, dtype=np.uint16), 0),
        (np.full((56, 56), 65535, dtype=np.int32), 255),  # mode I, as PIL opens many 16-bit PNGs
        (np.full((56, 56), 1.0, dtype=np.float32), 255),  # mode F in [0, 1]
    ],
)
def test_fit_image_uniform_wide_image_keeps_its_level(array, level):
    image = Image.fromarray(array)
    assert image.mode in ("I;16", "I", "F")
    assert np.unique(np.asarray(fit_image(image, factor=QWEN2))).tolist() == [level]


@pytest.mark.parametrize(
    "size,factor,expected",
    [
        ((10, 10), 28, (56, 56)),
        ((10000, 10000), 28, (616, 616)),
        ((10, 10), 32, (64, 64)),
        ((10000, 10000), 32, (608, 608)),
    ],
)
def test_fit_image_extreme_sizes(size, factor, expected):
    fitted = fit_image(Image.new("RGB", size, (1, 2, 3)), 3136, 401408, factor=factor)
    assert (fitted.height, fitted.width) == expected
    assert fitted.width * fitted.height <= 401408


def test_fit_image_is_idempotent():
    image = Image.new("RGB", (320, 240), (9, 9, 9))
    once = fit_image(image, factor=QWEN2)
    assert fit_image(once, factor=QWEN2) is once


def test_fit_image_rejects_non_images():
    with pytest.raises(TypeError, match="PIL image"):
        fit_image(np.zeros((4, 4, 3)), factor=QWEN2)


def test_budget_validation():
    with pytest.raises(ValueError, match="min_pixels <= max_pixels"):
        PixelBudget(min_pixels=1000, max_pixels=10)
    with pytest.raises(ValueError, match="one visual token"):
        PixelBudget(min_pixels=10, max_pixels=100, factor=28)
    with pytest.raises(ValueError, match=r"no patch factor yet: PixelBudget.for_model"):
        PixelBudget(3136, 401408).tokens(240, 320)  # never a guessed factor


def test_processor_sees_budget_tokens_after_fit(tiny_processor):
    """After fit_image + configure_processor, the processor's token count equals the budget's prediction."""
    budget = PixelBudget(3136, 100352).for_model(tiny_processor)
    processor = configure_processor(copy.deepcopy(tiny_processor), budget)  # the session's processor stays as loaded
    sizes = [(320, 240), (640, 480), (17, 900), (1000, 1000)]
    images = [budget.fit(Image.new("RGB", s, (50, 60, 70))) for s in sizes]
    out = processor.image_processor(images=images, return_tensors="pt")
    tokens = (out["image_grid_thw"].prod(-1) // 4).tolist()
    assert tokens == [budget.tokens(h, w) for (w, h) in sizes]


@pytest.mark.parametrize("size", [(500, 1), (1, 500), (2000, 3), (3, 2000), (7000, 20)])
def test_beyond_qwens_aspect_ratio_is_padded_and_counted_alike(size, tiny_processor):
    """Qwen's processors refuse an aspect ratio over 200:1; fit_image pads such an image (white, centred) to 200:1,
    and the budget's token count is the processor's for the padded image."""
    budget = PixelBudget(3136, 401408).for_model(tiny_processor)
    configure_processor(tiny_processor, budget)  # the session's processor may hold another test's bounds
    image = Image.new("RGB", size, (10, 200, 30))
    fitted = budget.fit(image)
    assert max(fitted.size) / min(fitted.size) <= 200 and fitted.size[0] % 28 == fitted.size[1] % 28 == 0
    tiny_processor = configure_processor(copy.deepcopy(tiny_processor), budget)
    grid = tiny_processor.image_processor(images=[fitted], return_tensors="pt")["image_grid_thw"]
    assert int(grid.prod() // 4) == budget.tokens(size[1], size[0])
    middle = fitted.getpixel((fitted.width // 2, fitted.height // 2))
    assert middle[1] > 150  # the image's own pixels sit in the middle of the padding
