"""Tests for the procedural CLEVR generator: determinism, answers that match the scene, and pictures that match it."""

from __future__ import annotations

import itertools
import json
import math
import re

import numpy as np
import pytest
from PIL import Image
from scipy import ndimage

from suzak.data.clevr import (
    BORDER_MARGIN,
    CELL_FILL,
    CELL_JITTER,
    COGENT,
    COLORS,
    MATERIALS,
    MIN_GAP,
    R1V_TOTAL_QUESTION,
    SHAPES,
    SIZES,
    Scene,
    SceneObject,
    count_objects,
    describe_scene,
    generate_rows,
    render_scene,
    sample_cell_scene,
    sample_question,
    sample_scene,
    scene_rng,
)

EIGHT_CONNECTED = np.ones((3, 3), dtype=int)
# A rubber object's centre is shaded within ~4% of its colour (measured: at most 10 levels off). 20 levels is less
# than half the closest pair of CLEVR colours (red/brown differ by 44 in green), so a pixel within 20 of its
# colour can be nobody else's.
CENTRE_TOLERANCE = 20


def _pixels(image: Image.Image) -> np.ndarray:
    return np.asarray(image, dtype=np.int16)  # (H, W, 3)


def _foreground(image: Image.Image) -> np.ndarray:
    """(H, W) bool: pixels that differ from the flat background colour (read from the image's corner)."""
    px = _pixels(image)
    return np.any(px != px[0, 0], axis=2)


def _rows(num: int, **kwargs) -> list[dict]:
    return list(generate_rows(num, progress=False, **kwargs))


def _same_rows(a: dict, b: dict) -> bool:
    same_text = all(a[k] == b[k] for k in ("problem", "count", "question_type", "scene", "index"))
    return same_text and a["image"].tobytes() == b["image"].tobytes()


def _attributes(obj: SceneObject) -> dict[str, str]:
    return {"shape": obj.shape, "color": obj.color, "size": obj.size, "material": obj.material}


# --- determinism ------------------------------------------------------------------------------------------------


def test_same_seed_and_index_give_identical_rows():
    first, second = _rows(3, seed=7), _rows(3, seed=7)
    assert all(_same_rows(a, b) for a, b in zip(first, second, strict=True))


def test_different_index_gives_different_scene():
    scenes = [sample_scene(scene_rng(0, i)) for i in range(20)]
    assert len({json.dumps(s.to_dict()) for s in scenes}) == 20


def test_rows_depend_only_on_seed_and_index():
    long = _rows(10, seed=1)
    window = _rows(5, seed=1, start=3)
    assert [r["index"] for r in window] == [3, 4, 5, 6, 7]
    assert all(_same_rows(a, b) for a, b in zip(window, long[3:8], strict=True))


def test_row_columns():
    row = _rows(1, seed=3)[0]
    assert set(row) == {"image", "problem", "count", "question_type", "scene", "index"}
    assert row["image"].mode == "RGB" and row["image"].size == (320, 240)
    assert Scene.from_dict(json.loads(row["scene"])).width == 320


# --- answers agree with the scene -------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(40))
def test_total_answer_matches_description(seed):
    rng = scene_rng(seed, 0)
    scene = sample_scene(rng)
    q = sample_question(scene, rng, question_types=("total",))
    described = int(re.search(r"(\d+) objects? in total\.$", describe_scene(scene)).group(1))
    assert q["answer"] == described == len(scene.objects)
    assert len(re.findall(r"\ba (?:large|small) ", describe_scene(scene))) == len(scene.objects)


@pytest.mark.parametrize("seed", range(60))
def test_attribute_answer_matches_manual_count(seed):
    rng = scene_rng(seed, 1)
    scene = sample_scene(rng)
    q = sample_question(scene, rng, question_types=("attribute",))
    assert 1 <= len(q["filter"]) <= 3
    manual = sum(all(_attributes(o)[k] == v for k, v in q["filter"].items()) for o in scene.objects)
    assert q["answer"] == manual == count_objects(scene, **q["filter"])
    assert re.fullmatch(r"(How many|What number of) [a-z ]+ are there\?", q["question"])


def test_questions_cover_both_wordings_and_zero_answers():
    rngs = [scene_rng(5, i) for i in range(300)]
    questions = [sample_question(sample_scene(rng), rng) for rng in rngs]
    totals = [q["question"] for q in questions if q["question_type"] == "total"]
    assert totals.count(R1V_TOTAL_QUESTION) > len(totals) / 2
    assert len(set(totals)) > 1
    attribute_answers = [q["answer"] for q in questions if q["question_type"] == "attribute"]
    assert 0 in attribute_answers and max(attribute_answers) >= 2


@pytest.mark.parametrize(
    ("filt", "allowed"),
    [
        ({"shape": "sphere"}, {"spheres", "balls"}),
        ({"shape": "cube"}, {"cubes", "blocks"}),
        ({"shape": "cylinder"}, {"cylinders"}),
        ({"color": "red"}, {"things", "objects"}),
        ({"size": "large"}, {"large", "big"}),
        ({"size": "small"}, {"small", "tiny"}),
        ({"material": "metal"}, {"metal", "metallic", "shiny"}),
        ({"material": "rubber"}, {"rubber", "matte"}),
    ],
)
def test_clevr_synonyms_and_plurals(filt, allowed):
    words = set()
    for i in range(200):
        rng = scene_rng(11, i)
        scene = sample_scene(rng)
        q = sample_question(scene, rng, question_types=("attribute",))
        if all(q["filter"].get(k) == v for k, v in filt.items()):
            words |= set(q["question"].rstrip("?").split())
    assert words & allowed


def test_count_objects_rejects_unknown_values():
    scene = sample_scene(scene_rng(0, 0))
    with pytest.raises(ValueError, match="unknown color"):
        count_objects(scene, color="pink")


def test_describe_scene_lists_objects():
    a = SceneObject("cylinder", "red", "large", "metal", x=50.0, y=50.0, radius=20.0)
    b = SceneObject("cube", "gray", "small", "rubber", x=150.0, y=50.0, radius=10.0)
    assert describe_scene(Scene(320, 240, (b, a))) == (
        "There is a large red metal cylinder and a small gray rubber cube. 2 objects in total."
    )
    assert describe_scene(Scene(320, 240, (a,))).endswith("1 object in total.")


# --- sampling ---------------------------------------------------------------------------------------------------


def test_object_counts_uniform_over_range():
    counts = [len(sample_scene(scene_rng(2, i)).objects) for i in range(800)]
    hist = np.bincount(counts, minlength=11)
    assert set(counts) == set(range(3, 11))
    assert hist[3:].min() > 0.6 * 100  # 100 expected per count


@pytest.mark.parametrize(("low", "high"), [(1, 3), (0, 1), (12, 12)])
def test_object_count_range(low, high):
    counts = {len(sample_scene(scene_rng(3, i), min_objects=low, max_objects=high).objects) for i in range(60)}
    assert counts == set(range(low, high + 1))


def test_objects_keep_apart_and_inside_the_border():
    for i in range(100):
        scene = sample_scene(scene_rng(4, i), min_objects=10, max_objects=12)
        for a, b in itertools.combinations(scene.objects, 2):
            assert math.hypot(a.x - b.x, a.y - b.y) >= a.radius + b.radius + MIN_GAP
        for o in scene.objects:
            m = o.radius + BORDER_MARGIN
            assert m <= o.x <= scene.width - m and m <= o.y <= scene.height - m


def test_small_objects_about_half_large():
    objects = [o for i in range(50) for o in sample_scene(scene_rng(6, i)).objects]
    mean = {s: np.mean([o.radius for o in objects if o.size == s]) for s in SIZES}
    assert mean["small"] / mean["large"] == pytest.approx(0.5, rel=0.1)  # both spread alike over near and far


@pytest.mark.parametrize(("split", "other"), [("A", "B"), ("B", "A")])
def test_cogent_colour_rules(split, other):
    for i in range(200):
        for o in sample_scene(scene_rng(8, i), split=split).objects:
            assert o.color in COGENT[split][o.shape]
    assert set(COGENT[split]["cube"]) == set(COGENT[other]["cylinder"])
    assert set(COGENT[split]["cube"]) | set(COGENT[split]["cylinder"]) == set(COLORS)
    assert set(COGENT[split]["sphere"]) == set(COLORS)


def test_cogent_a_is_clevr_cogent_a():
    assert set(COGENT["A"]["cube"]) == {"gray", "blue", "brown", "yellow"}
    assert set(COGENT["A"]["cylinder"]) == {"red", "green", "purple", "cyan"}


def test_sizes_restrict_and_zoom_scales_objects():
    base = [sample_scene(scene_rng(5, i), min_objects=1, max_objects=3, width=112, height=84) for i in range(40)]
    large = [sample_scene(scene_rng(5, i), min_objects=1, max_objects=3, width=112, height=84, sizes=["large"],
                          zoom=2.0) for i in range(40)]  # fmt: skip
    assert {o.size for s in large for o in s.objects} == {"large"}
    assert [len(s.objects) for s in large] == [len(s.objects) for s in base]  # the count draw is unchanged
    big = np.mean([o.radius for s in large for o in s.objects])
    plain_large = np.mean([o.radius for s in base for o in s.objects if o.size == "large"])
    assert big / plain_large == pytest.approx(2.0, rel=0.1)
    for scene in large:  # still apart and inside the border, and every object is one blob in the picture
        for a, b in itertools.combinations(scene.objects, 2):
            assert math.hypot(a.x - b.x, a.y - b.y) >= a.radius + b.radius + MIN_GAP
        fg = _foreground(render_scene(scene, background="plain", shadows=False))
        assert ndimage.label(fg, structure=EIGHT_CONNECTED)[1] == len(scene.objects)
    default = sample_scene(scene_rng(5, 0))  # the defaults draw exactly what they drew before the options existed
    assert default == sample_scene(scene_rng(5, 0), sizes=tuple(SIZES), zoom=1.0)
    rows = _rows(3, seed=5, min_objects=1, max_objects=3, width=112, height=84, sizes=["large"], zoom=2.0)
    assert all(o["size"] == "large" for r in rows for o in json.loads(r["scene"])["objects"])


def test_cell_scenes_put_one_whole_object_in_each_chosen_cell():
    """``cells``: every object in its own cell (a visual token's square), crossing its edge by at most the jitter's
    excess (0.03 of a side: under a pixel at 28); the count over the whole range; one blob per object in the
    picture."""
    scenes = [
        sample_cell_scene(scene_rng(3, i), cells=(2, 2), cell=28, min_objects=1, max_objects=3) for i in range(60)
    ]
    assert {len(s.objects) for s in scenes} == {1, 2, 3} and all((s.width, s.height) == (56, 56) for s in scenes)
    for scene in scenes:
        cells = [(int(o.x // 28), int(o.y // 28)) for o in scene.objects]
        assert len(set(cells)) == len(cells)
        spill = (CELL_FILL + CELL_JITTER - 0.5) * 28 + 1e-9
        for o, (column, row) in zip(scene.objects, cells, strict=True):
            assert o.size == "large" and o.radius == CELL_FILL * 28
            assert column * 28 - spill <= o.x - o.radius and o.x + o.radius <= (column + 1) * 28 + spill
            assert row * 28 - spill <= o.y - o.radius and o.y + o.radius <= (row + 1) * 28 + spill
        fg = _foreground(render_scene(scene, background="plain", shadows=False))
        assert ndimage.label(fg, structure=EIGHT_CONNECTED)[1] == len(scene.objects)
    rows = _rows(4, seed=3, min_objects=1, max_objects=3, width=64, height=64, cells=(2, 2))
    assert all(r["image"].size == (64, 64) for r in rows)  # 2x2 cells of 32 pixels: Qwen3-VL's token
    with pytest.raises(ValueError, match="cells"):
        sample_cell_scene(scene_rng(0, 0), cells=(2, 1), cell=28, min_objects=3, max_objects=3)
    with pytest.raises(ValueError, match=r"cells \[2, 2\] do not divide the 64x48 image into squares"):
        _rows(1, seed=0, width=64, height=48, cells=(2, 2))


def test_clevr_synthetic_refuses_cells_that_are_not_squares_in_one_line(tmp_path, capsys):
    from suzak.data.builders import main

    with pytest.raises(SystemExit, match=r"^error: cells \[3, 3\] do not divide the 320x240 image into squares"):
        main(["clevr_synthetic", "--cells", "3", "3", "--num_rows", "2", "--output", str(tmp_path / "out")])


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="split"):
        sample_scene(scene_rng(0, 0), split="C")
    with pytest.raises(ValueError, match="min_objects"):
        sample_scene(scene_rng(0, 0), min_objects=5, max_objects=2)
    with pytest.raises(ValueError, match="question_types"):
        sample_question(sample_scene(scene_rng(0, 0)), scene_rng(0, 0), question_types=("colour",))
    with pytest.raises(ValueError, match="sizes"):
        sample_scene(scene_rng(0, 0), sizes=["huge"])
    with pytest.raises(ValueError, match="sizes"):
        sample_scene(scene_rng(0, 0), sizes=[])
    with pytest.raises(ValueError, match="zoom"):
        sample_scene(scene_rng(0, 0), zoom=0)
    with pytest.raises(ValueError, match="lower max_objects or zoom"):
        sample_scene(scene_rng(0, 0), min_objects=10, max_objects=10, width=112, height=84, zoom=3.0)


# --- rendering --------------------------------------------------------------------------------------------------


def test_scene_dict_round_trip_renders_identically():
    scene = sample_scene(scene_rng(9, 0))
    again = Scene.from_dict(json.loads(json.dumps(scene.to_dict())))
    assert again == scene
    assert render_scene(again).tobytes() == render_scene(scene).tobytes()


@pytest.mark.parametrize("index", range(30))
def test_connected_components_equal_object_count(index):
    scene = sample_scene(scene_rng(10, index), min_objects=3, max_objects=12)
    fg = _foreground(render_scene(scene, background="plain", shadows=False))
    _, components = ndimage.label(fg, structure=EIGHT_CONNECTED)
    assert components == len(scene.objects)
    for o in scene.objects:
        assert fg[round(o.y), round(o.x)]


@pytest.mark.parametrize(("shape", "material"), list(itertools.product(SHAPES, MATERIALS)))
@pytest.mark.parametrize("shadows", [False, True])
def test_everything_drawn_stays_inside_the_footprint(shape, material, shadows):
    obj = SceneObject(shape, "yellow", "large", material, x=60.3, y=50.7, radius=24.0)
    fg = _foreground(render_scene(Scene(120, 100, (obj,)), background="plain", shadows=shadows))
    ys, xs = np.nonzero(fg)
    assert np.hypot(xs - obj.x, ys - obj.y).max() <= obj.radius
    assert fg.sum() > 200  # CLEVR's own visibility rule for a large object


@pytest.mark.parametrize(("shape", "color"), list(itertools.product(SHAPES, COLORS)))
def test_rubber_centre_shows_its_clevr_colour(shape, color):
    obj = SceneObject(shape, color, "small", "rubber", x=30.0, y=30.0, radius=12.0)
    centre = _pixels(render_scene(Scene(60, 60, (obj,))))[30, 30]
    assert np.abs(centre - np.array(COLORS[color])).max() <= CENTRE_TOLERANCE


def test_metal_has_more_contrast_than_rubber():
    def spread(material: str) -> float:
        obj = SceneObject("sphere", "blue", "large", material, x=30.0, y=30.0, radius=24.0)
        px = _pixels(render_scene(Scene(60, 60, (obj,)), background="plain", shadows=False))
        inside = px[_foreground(render_scene(Scene(60, 60, (obj,)), background="plain", shadows=False))]
        return float(inside.sum(axis=1).std())

    assert spread("metal") > 1.5 * spread("rubber")


def test_shaded_background_is_a_vertical_gradient_and_shadows_darken():
    empty = _pixels(render_scene(Scene(320, 240, ())))
    assert empty[5, 160].mean() > empty[235, 160].mean() + 10
    obj = SceneObject("sphere", "red", "large", "rubber", x=160.0, y=120.0, radius=24.0)
    with_shadow = _pixels(render_scene(Scene(320, 240, (obj,)), background="plain"))
    without = _pixels(render_scene(Scene(320, 240, (obj,)), background="plain", shadows=False))
    assert (with_shadow.sum(axis=2) < without.sum(axis=2)).sum() > 30


def test_unknown_background_raises():
    with pytest.raises(ValueError, match="background"):
        render_scene(Scene(10, 10, ()), background="checker")
