"""A procedural CLEVR-like scene generator: sample a tabletop scene, render it, ask a counting question.

R1-V trains counting on CLEVR-CoGenT-A renders made with Blender. Blender is slow and heavy, so suzak draws
scenes that look like CLEVR (soft gray floor, shaded cubes, spheres and cylinders, rubber and metal, drop
shadows) with numpy and Pillow alone, at thousands of scenes per minute on one core. Every row depends only on
``(seed, index)``, so any slice of a data set can be rebuilt anywhere, in any order.

Objects never overlap and keep a gap between their footprints, so the number of objects is always what a
person (or a connected-components count) sees in the picture.

>>> scene = sample_scene(scene_rng(0, 0))
>>> image = render_scene(scene)
>>> image.size
(320, 240)
>>> count_objects(scene) == len(scene.objects)
True
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any

import numpy as np
from PIL import Image
from tqdm.auto import tqdm

__all__ = [
    "ATTRIBUTES",
    "BORDER_MARGIN",
    "COGENT",
    "COLORS",
    "MATERIALS",
    "MIN_GAP",
    "QUESTION_TYPES",
    "R1V_TOTAL_QUESTION",
    "SHAPES",
    "SIZES",
    "Scene",
    "SceneObject",
    "check_cells",
    "count_objects",
    "describe_scene",
    "generate_rows",
    "render_scene",
    "sample_cell_scene",
    "sample_question",
    "sample_scene",
    "scene_rng",
]

logger = logging.getLogger(__name__)

# CLEVR's palette (facebookresearch/clevr-dataset-gen, data/properties.json).
COLORS: dict[str, tuple[int, int, int]] = {
    "gray": (87, 87, 87),
    "red": (173, 35, 35),
    "blue": (42, 75, 215),
    "green": (29, 105, 20),
    "brown": (129, 74, 25),
    "purple": (129, 38, 192),
    "cyan": (41, 208, 208),
    "yellow": (255, 238, 51),
}
SHAPES = ("cube", "sphere", "cylinder")
SIZES: dict[str, float] = {"large": 0.7, "small": 0.35}
MATERIALS = ("rubber", "metal")

_COLORS_A = ("gray", "blue", "brown", "yellow")
_COLORS_B = ("red", "green", "purple", "cyan")
# CoGenT: condition A and B give cubes and cylinders disjoint colour sets; spheres may take any colour.
COGENT: dict[str, dict[str, tuple[str, ...]]] = {
    "A": {"cube": _COLORS_A, "cylinder": _COLORS_B, "sphere": tuple(COLORS)},
    "B": {"cube": _COLORS_B, "cylinder": _COLORS_A, "sphere": tuple(COLORS)},
}

MIN_GAP = 4.0  # px between two footprints, so shadows and anti-aliasing never join two objects
BORDER_MARGIN = 4.0  # px between a footprint and the image border
_SCALE = 0.13  # footprint radius of a size-1.0 object, as a fraction of min(width, height)
_PERSPECTIVE = (0.85, 1.15)  # size factor at the top (far) and bottom (near) of the image
_CANDIDATES = 64  # positions tried at once for one object
_ROUNDS = 4  # candidate batches per object before the whole placement restarts
_RESTARTS = 100  # placements tried before giving up on a scene

ATTRIBUTES = ("size", "color", "material", "shape")


@dataclass(frozen=True)
class SceneObject:
    """One object on the table; ``radius`` bounds everything drawn for it, shadow included."""

    shape: str
    color: str
    size: str
    material: str
    x: float  # centre, px
    y: float
    radius: float  # footprint radius, px


@dataclass(frozen=True)
class Scene:
    """A scene is all a render needs: the same Scene always gives the same pixels."""

    width: int
    height: int
    objects: tuple[SceneObject, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"width": self.width, "height": self.height, "objects": [asdict(o) for o in self.objects]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Scene:
        objects = tuple(SceneObject(**o) for o in d["objects"])
        return cls(width=int(d["width"]), height=int(d["height"]), objects=objects)


# ---------------------------------------------------------------------------------------------------------------
# Sampling
# ---------------------------------------------------------------------------------------------------------------


def scene_rng(seed: int, index: int) -> np.random.Generator:
    """The generator for row ``index``: rows depend only on (seed, index), never on what came before."""
    return np.random.default_rng([seed, index])


def _check_split(split: str | None) -> None:
    if split is not None and split not in COGENT:
        raise ValueError(f"split must be one of {sorted(COGENT)} or None, got {split!r}")


def _check_sizes(sizes: Sequence[str] | None) -> tuple[str, ...]:
    if sizes is None:
        return tuple(SIZES)
    sizes = tuple(sizes)
    unknown = [s for s in sizes if s not in SIZES]
    if not sizes or unknown:
        raise ValueError(f"sizes must be a non-empty subset of {tuple(SIZES)}, got {sizes!r}")
    return sizes


def _sample_attributes(
    rng: np.random.Generator, split: str | None, sizes: Sequence[str] = tuple(SIZES)
) -> dict[str, str]:
    """Shape first, then a colour the CoGenT split allows for it (any colour when split is None)."""
    shape = SHAPES[rng.integers(len(SHAPES))]
    colors = tuple(COLORS) if split is None else COGENT[split][shape]
    return {
        "shape": shape,
        "color": colors[rng.integers(len(colors))],
        "size": sizes[rng.integers(len(sizes))],
        "material": MATERIALS[rng.integers(len(MATERIALS))],
    }


def _footprint_radius(
    size: str, y: np.ndarray | float, width: int, height: int, zoom: float = 1.0
) -> np.ndarray | float:
    """Footprint radius at height ``y``: objects further back (smaller y) look smaller, as on a tabletop."""
    near, far = _PERSPECTIVE[1], _PERSPECTIVE[0]
    return zoom * SIZES[size] * _SCALE * min(width, height) * (far + (near - far) * np.asarray(y) / height)


def _try_spot(
    rng: np.random.Generator,
    size: str,
    placed: list[tuple[float, float, float]],
    width: int,
    height: int,
    zoom: float,
) -> tuple[float, float, float] | None:
    """A free (x, y, radius) for one object, or None; candidates are drawn in batches to keep numpy busy."""
    for _ in range(_ROUNDS):
        x = rng.uniform(0.0, width, _CANDIDATES)
        y = rng.uniform(0.0, height, _CANDIDATES)
        r = _footprint_radius(size, y, width, height, zoom)
        m = r + BORDER_MARGIN
        ok = (x >= m) & (x <= width - m) & (y >= m) & (y <= height - m)
        for px, py, pr in placed:
            ok &= np.hypot(x - px, y - py) >= r + pr + MIN_GAP
        hits = np.flatnonzero(ok)
        if hits.size:
            i = hits[0]
            return float(x[i]), float(y[i]), float(r[i])
    return None


def _place(
    rng: np.random.Generator, sizes: Sequence[str], width: int, height: int, zoom: float
) -> list[tuple[float, float, float]] | None:
    """Rejection-sample positions for objects of the given sizes, or None when one does not fit."""
    placed: list[tuple[float, float, float]] = []
    for size in sizes:
        spot = _try_spot(rng, size, placed, width, height, zoom)
        if spot is None:
            return None
        placed.append(spot)
    return placed


def sample_scene(
    rng: np.random.Generator,
    *,
    min_objects: int = 3,
    max_objects: int = 10,
    width: int = 320,
    height: int = 240,
    split: str | None = "A",
    sizes: Sequence[str] | None = None,
    zoom: float = 1.0,
) -> Scene:
    """A random scene with a uniform object count in [min_objects, max_objects].

    Placement restarts from scratch when an object does not fit, so a scene never holds fewer objects than
    sampled; it raises only when the image is far too small for the count. ``split=None`` lifts the CoGenT
    colour rules. ``sizes`` restricts the object sizes (default: all of ``SIZES``); ``zoom`` scales every object
    relative to the image, like a camera zooming in (2.0: twice the footprint radius). Objects are stored back
    to front (by y), the order they are drawn in.
    """
    if not 0 <= min_objects <= max_objects:
        raise ValueError(f"need 0 <= min_objects <= max_objects, got {min_objects}, {max_objects}")
    _check_split(split)
    sizes = _check_sizes(sizes)
    if not zoom > 0:
        raise ValueError(f"zoom must be > 0, got {zoom}")
    n = int(rng.integers(min_objects, max_objects + 1))
    # Large objects first: they are the hard ones to fit, and the attributes are i.i.d. so order is free.
    attrs = sorted(
        (_sample_attributes(rng, split, sizes) for _ in range(n)), key=lambda a: SIZES[a["size"]], reverse=True
    )
    for attempt in range(_RESTARTS):
        spots = _place(rng, [a["size"] for a in attrs], width, height, zoom)
        if spots is not None:
            if attempt:
                logger.debug("placed %d objects after %d restarts", n, attempt)
            objects = [SceneObject(**a, x=x, y=y, radius=r) for a, (x, y, r) in zip(attrs, spots, strict=True)]
            return Scene(width, height, tuple(sorted(objects, key=lambda o: (o.y, o.x))))
    raise ValueError(
        f"could not place {n} objects on {width}x{height} (zoom {zoom}) after {_RESTARTS} tries; lower max_objects"
        " or zoom"
    )


CELL_FILL = 0.45  # footprint radius / cell side of a cell scene's objects
CELL_JITTER = 0.08  # a cell scene's object centres move up to this share of the cell side from the cell's centre
# (so an object crosses its cell's edge by at most CELL_FILL + CELL_JITTER - 0.5 = 0.03 of the side: under a pixel)


def sample_cell_scene(
    rng: np.random.Generator,
    *,
    cells: tuple[int, int],
    cell: int,
    min_objects: int = 1,
    max_objects: int = 3,
    split: str | None = None,
) -> Scene:
    """A scene whose objects sit one to a cell of a ``cells`` = (columns, rows) grid of ``cell``-pixel squares, each
    object large, centred in its cell (moved by up to :data:`CELL_JITTER` of the side), filling most of it.

    With ``cell`` the side of the model's visual token, every token shows one object (all but a sliver) or the table: counting
    then asks how many tokens hold an object, which a model of a few hundred thousand parameters learns in a CPU
    run (``python -m suzak.selftest --task counting``); objects placed freely (:func:`sample_scene`) straddle tokens
    and such a model plateaus near two thirds (docs/selftest.md).

    >>> scene = sample_cell_scene(scene_rng(0, 1), cells=(2, 2), cell=28)
    >>> scene.width, scene.height, 1 <= len(scene.objects) <= 3
    (56, 56, True)
    >>> len({(int(o.x) // 28, int(o.y) // 28) for o in scene.objects}) == len(scene.objects)  # one to a cell
    True
    """
    columns, rows = cells
    if not 0 <= min_objects <= max_objects <= columns * rows:
        raise ValueError(f"need 0 <= min_objects <= max_objects <= {columns * rows} cells, got {min_objects}, "
                         f"{max_objects}")  # fmt: skip
    _check_split(split)
    n = int(rng.integers(min_objects, max_objects + 1))
    objects = []
    for index in sorted(rng.choice(columns * rows, n, replace=False)):
        attrs = _sample_attributes(rng, split, ("large",))
        dx, dy = rng.uniform(-CELL_JITTER, CELL_JITTER, 2) * cell
        x, y = (index % columns + 0.5) * cell + dx, (index // columns + 0.5) * cell + dy
        objects.append(SceneObject(**attrs, x=float(x), y=float(y), radius=CELL_FILL * cell))
    return Scene(columns * cell, rows * cell, tuple(sorted(objects, key=lambda o: (o.y, o.x))))


# ---------------------------------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------------------------------


def _unit(v: Sequence[float]) -> np.ndarray:
    a = np.asarray(v, dtype=np.float64)
    return a / np.linalg.norm(a)


# Image axes: x right, y down, z towards the viewer. The light comes from the upper left, in front.
_LIGHT = _unit((-0.4, -0.55, 0.73))
_HALF = _unit(_LIGHT + np.array([0.0, 0.0, 1.0]))  # Blinn half vector for a viewer straight ahead


@dataclass(frozen=True)
class _Finish:
    """How a material turns light into a shading factor; metal has more contrast and a sharp highlight."""

    ambient: float
    diffuse: float
    spec: float  # strength of the white highlight
    shininess: float  # highlight exponent: larger is smaller and sharper
    floor: float  # darkening of downward-facing parts (metal reflects the darker floor)
    faces: tuple[float, float, float]  # flat-face factors: front, top, side
    gradient: float  # brightness drop across flat faces, upper left to lower right
    sheen: float  # white mixed into the top faces


_FINISHES = {
    "rubber": _Finish(0.55, 0.6, 0.05, 6.0, 0.0, (0.96, 1.08, 0.66), 0.15, 0.15),
    "metal": _Finish(0.2, 1.05, 0.9, 40.0, 0.35, (0.95, 1.3, 0.45), 0.6, 0.25),
}

_SPHERE_FILL = 0.85  # sphere radius / footprint radius: the rest of the footprint holds its shadow
_CUBE_DEPTH = 0.3  # receding edge of the cube's top and side faces / front edge
_CYL_CAP = 0.4  # cap ellipse height / cylinder radius (the camera looks down at about 25 degrees)
_CYL_HEIGHT = 1.6  # body height / cylinder radius
_SHADOW = 0.5  # darkness at the centre of a shadow
_PLAIN_RGB = (118, 124, 132)  # bluish gray: no shading of a CLEVR colour gives exactly this, so tests can find it
_CANVAS_DTYPE = np.float32


def _cylinder_extent() -> float:
    """Farthest outline point of a unit-radius cylinder from its centre, so a cylinder fits its footprint."""
    t = np.linspace(0.0, np.pi, 721)
    return float(np.max(np.hypot(np.cos(t), _CYL_HEIGHT / 2 + _CYL_CAP * np.sin(t))))


_CYL_EXTENT = _cylinder_extent()


@lru_cache(maxsize=8)
def _background(width: int, height: int, kind: str) -> np.ndarray:
    """The empty table as (H, W, 3) float: CLEVR's soft gray floor, lit at the back and fading to the corners."""
    if kind == "plain":
        canvas = np.empty((height, width, 3), _CANVAS_DTYPE)
        canvas[:] = _PLAIN_RGB
    elif kind == "shaded":
        v = np.linspace(0.0, 1.0, height)[:, None]  # (H, 1)
        u = np.linspace(-1.0, 1.0, width)[None, :]  # (1, W)
        gray = 150.0 - 28.0 * v - 14.0 * u**2 * (0.4 + v)  # (H, W)
        canvas = (gray[:, :, None] + np.array([0.0, 1.0, 3.0])).astype(_CANVAS_DTYPE)  # (H, W, 3), a touch cool
    else:
        raise ValueError(f"background must be 'shaded' or 'plain', got {kind!r}")
    canvas.flags.writeable = False  # cached and shared: render_scene draws on a copy
    return canvas


def _patch(obj: SceneObject, width: int, height: int) -> tuple[slice, slice, np.ndarray, np.ndarray]:
    """Slices of the canvas around an object and pixel offsets from its centre (pixel centres at integers)."""
    x0, x1 = max(0, math.floor(obj.x - obj.radius)), min(width, math.ceil(obj.x + obj.radius) + 1)
    y0, y1 = max(0, math.floor(obj.y - obj.radius)), min(height, math.ceil(obj.y + obj.radius) + 1)
    dx = (np.arange(x0, x1, dtype=_CANVAS_DTYPE) - obj.x)[None, :]  # (1, w)
    dy = (np.arange(y0, y1, dtype=_CANVAS_DTYPE) - obj.y)[:, None]  # (h, 1)
    return slice(y0, y1), slice(x0, x1), dx, dy


def _coverage(sdf: np.ndarray) -> np.ndarray:
    """Anti-aliased coverage from a signed distance in px (negative inside)."""
    return np.clip(0.5 - sdf, 0.0, 1.0)


def _shade(color: str, factor: np.ndarray, spec: np.ndarray | float) -> np.ndarray:
    """(h, w, 3) RGB: the CLEVR colour scaled by ``factor`` and mixed towards white by ``spec``."""
    base = np.asarray(COLORS[color], dtype=_CANVAS_DTYPE)
    factor, spec = np.asarray(factor)[..., None], np.asarray(spec)[..., None]
    return base * factor * (1.0 - spec) + 255.0 * spec


def _polygon_sdf(dx: np.ndarray, dy: np.ndarray, vertices: Sequence[tuple[float, float]]) -> np.ndarray:
    """Signed distance to a convex polygon, exact along edges (the max of the edge half-plane distances)."""
    v = np.asarray(vertices, dtype=np.float64)
    centroid = v.mean(axis=0)
    sdf = None
    for a, b in zip(v, np.roll(v, -1, axis=0), strict=True):
        n = _unit((b[1] - a[1], a[0] - b[0]))
        if np.dot(n, centroid - a) > 0:
            n = -n
        d = n[0] * (dx - a[0]) + n[1] * (dy - a[1])
        sdf = d if sdf is None else np.maximum(sdf, d)
    return sdf


def _ellipse_sdf(dx: np.ndarray, dy: np.ndarray, a: float, b: float) -> np.ndarray:
    """Approximate signed distance to an axis-aligned ellipse (first-order: f / |grad f|)."""
    f = (dx / a) ** 2 + (dy / b) ** 2 - 1.0
    grad = 2.0 * np.sqrt((dx / a**2) ** 2 + (dy / b**2) ** 2) + 1e-6
    return f / grad


def _sphere(dx: np.ndarray, dy: np.ndarray, r: float, color: str, fin: _Finish) -> tuple[np.ndarray, np.ndarray]:
    """A ball: Lambert plus Blinn shading from the sphere's normal, computed only on the object's patch."""
    big_r = _SPHERE_FILL * r - 1.0
    nx, ny = dx / big_r, dy / big_r
    nz = np.sqrt(np.clip(1.0 - nx * nx - ny * ny, 0.0, 1.0))
    lambert = np.clip(nx * _LIGHT[0] + ny * _LIGHT[1] + nz * _LIGHT[2], 0.0, None)
    factor = (fin.ambient + fin.diffuse * lambert) * (1.0 - fin.floor * np.clip(ny, 0.0, 1.0))
    spec = fin.spec * np.clip(nx * _HALF[0] + ny * _HALF[1] + nz * _HALF[2], 0.0, 1.0) ** fin.shininess
    alpha = _coverage(np.sqrt(dx * dx + dy * dy) - big_r)
    return _shade(color, factor, spec), alpha


def _cube(dx: np.ndarray, dy: np.ndarray, r: float, color: str, fin: _Finish) -> tuple[np.ndarray, np.ndarray]:
    """A 3/4-view block: front square, lighter top and darker right side receding up and to the right.

    The outline is a centrally symmetric hexagon; its farthest corners sit (s + d) / sqrt(2) from the centre,
    which is what fits the footprint. The centre pixel lies on the front face.
    """
    extent = (r - 1.0) * math.sqrt(2.0)  # s + d
    s = extent / (1.0 + _CUBE_DEPTH)
    d = extent - s
    x0, y0, x1, y1 = -extent / 2, -extent / 2, extent / 2, extent / 2  # bounding box
    hexagon = [(x0, y1), (x0, y1 - s), (x0 + d, y0), (x1, y0), (x1, y1 - d), (x0 + s, y1)]
    top = [(x0, y1 - s), (x0 + d, y0), (x1, y0), (x0 + s, y1 - s)]
    side = [(x0 + s, y1 - s), (x1, y0), (x1, y1 - d), (x0 + s, y1)]
    front_f, top_f, side_f = fin.faces
    tilt = 1.0 - 0.5 * fin.gradient * (dx + dy) / extent  # 1 at the centre, brighter to the upper left
    on_top = _coverage(_polygon_sdf(dx, dy, top))
    on_side = _coverage(_polygon_sdf(dx, dy, side))
    factor = (front_f + (side_f - front_f) * on_side + (top_f - front_f) * on_top) * tilt
    spec = fin.sheen * on_top * np.clip(tilt, 0.0, 1.5)
    return _shade(color, factor, spec), _coverage(_polygon_sdf(dx, dy, hexagon))


def _cylinder(dx: np.ndarray, dy: np.ndarray, r: float, color: str, fin: _Finish) -> tuple[np.ndarray, np.ndarray]:
    """An upright cylinder: body shaded across its width, a lighter elliptical cap and a rounded bottom rim."""
    a = (r - 1.0) / _CYL_EXTENT  # cylinder radius in px
    cap, half = _CYL_CAP * a, _CYL_HEIGHT * a / 2
    nx = np.clip(dx / a, -1.0, 1.0)
    nz = np.sqrt(1.0 - nx * nx)
    lambert = np.clip(nx * _LIGHT[0] + nz * _LIGHT[2], 0.0, None)
    body_f = (fin.ambient + fin.diffuse * lambert) * (1.0 - 0.5 * fin.floor * np.clip(dy / half, 0.0, 1.0))
    body_spec = fin.spec * np.clip(nx * _HALF[0] + nz * _HALF[2], 0.0, 1.0) ** fin.shininess
    on_cap = _coverage(_ellipse_sdf(dx, dy + half, a, cap))
    cap_f = fin.faces[1] * (1.0 - 0.3 * fin.gradient * dx / a)
    factor = body_f + (cap_f - body_f) * on_cap
    spec = body_spec * (1.0 - on_cap) + fin.sheen * on_cap
    body = np.maximum(np.abs(dx) - a, np.abs(dy) - half)
    alpha = np.maximum(_coverage(body), np.maximum(on_cap, _coverage(_ellipse_sdf(dx, dy - half, a, cap))))
    return _shade(color, factor, spec), alpha


_DRAWERS = {"cube": _cube, "sphere": _sphere, "cylinder": _cylinder}


def _draw_shadow(canvas: np.ndarray, obj: SceneObject) -> None:
    """A soft shadow down and to the right of the object, faded out before the footprint's edge.

    Keeping it inside the footprint is what guarantees a shadow never bridges the gap between two objects.
    """
    ys, xs, dx, dy = _patch(obj, canvas.shape[1], canvas.shape[0])
    r = obj.radius
    q = ((dx - 0.4 * r) / (0.8 * r)) ** 2 + ((dy - 0.4 * r) / (0.55 * r)) ** 2
    fade = np.clip((r - 1.0 - np.sqrt(dx * dx + dy * dy)) / 3.0, 0.0, 1.0)
    dark = _SHADOW * np.clip(1.0 - q, 0.0, 1.0) ** 1.5 * fade  # (h, w)
    canvas[ys, xs] *= (1.0 - dark)[..., None]


def _draw_object(canvas: np.ndarray, obj: SceneObject) -> None:
    """Composite one object over the canvas, touching only its patch."""
    ys, xs, dx, dy = _patch(obj, canvas.shape[1], canvas.shape[0])
    rgb, alpha = _DRAWERS[obj.shape](dx, dy, obj.radius, obj.color, _FINISHES[obj.material])
    alpha = alpha[..., None]  # (h, w, 1)
    canvas[ys, xs] = canvas[ys, xs] * (1.0 - alpha) + rgb * alpha


def render_scene(scene: Scene, *, background: str = "shaded", shadows: bool = True) -> Image.Image:
    """Draw the scene back to front (by y) so nearer objects sit in front, like a tabletop seen from above.

    ``background="plain"`` fills the table with one flat colour that no object pixel can take, for pixel tests.
    """
    canvas = _background(scene.width, scene.height, background).copy()
    ordered = sorted(scene.objects, key=lambda o: (o.y, o.x))
    if shadows:
        for obj in ordered:
            _draw_shadow(canvas, obj)
    for obj in ordered:
        _draw_object(canvas, obj)
    return Image.fromarray(np.clip(np.rint(canvas), 0, 255).astype(np.uint8), "RGB")


# ---------------------------------------------------------------------------------------------------------------
# Questions and descriptions
# ---------------------------------------------------------------------------------------------------------------

_VALUES = {"size": tuple(SIZES), "color": tuple(COLORS), "material": MATERIALS, "shape": SHAPES}

R1V_TOTAL_QUESTION = "How many items are there in the image?"  # R1-V's CLEVR counting question, verbatim
_TOTAL_VARIANTS = (
    "How many objects are there?",
    "What number of things are there?",
    "How many things are there?",
    "What number of objects are there?",
)
_R1V_SHARE = 0.7  # how often a total question uses R1-V's exact wording
_ABSENT_SHARE = 0.15  # how often an attribute question names something not in the scene (answer 0)

# CLEVR's synonyms (clevr-dataset-gen question_generation/synonyms.json), per canonical value.
_WORDS: dict[str, tuple[str, ...]] = {
    "large": ("large", "big"),
    "small": ("small", "tiny"),
    "rubber": ("rubber", "matte"),
    "metal": ("metal", "metallic", "shiny"),
}
_PLURALS: dict[str | None, tuple[str, ...]] = {
    "cube": ("cubes", "blocks"),
    "sphere": ("spheres", "balls"),
    "cylinder": ("cylinders",),
    None: ("things", "objects"),
}
_ATTRIBUTE_TEMPLATES = ("How many {} are there?", "What number of {} are there?")
QUESTION_TYPES = ("total", "attribute")


def count_objects(
    scene: Scene,
    *,
    shape: str | None = None,
    color: str | None = None,
    size: str | None = None,
    material: str | None = None,
) -> int:
    """Objects matching every given attribute; an unknown value raises rather than silently counting 0."""
    wanted = {"shape": shape, "color": color, "size": size, "material": material}
    for key, value in wanted.items():
        if value is not None and value not in _VALUES[key]:
            raise ValueError(f"unknown {key} {value!r}; expected one of {_VALUES[key]}")
    filters = {k: v for k, v in wanted.items() if v is not None}
    return sum(all(getattr(o, k) == v for k, v in filters.items()) for o in scene.objects)


def _pick(rng: np.random.Generator, options: Sequence[str]) -> str:
    return options[int(rng.integers(len(options)))]


def _attribute_filter(scene: Scene, rng: np.random.Generator) -> dict[str, str]:
    """1-3 attributes, usually those of an object in the scene, sometimes a combination that is absent."""
    keys = [ATTRIBUTES[i] for i in sorted(rng.choice(len(ATTRIBUTES), int(rng.integers(1, 4)), replace=False))]
    if scene.objects and rng.random() >= _ABSENT_SHARE:
        ref = scene.objects[int(rng.integers(len(scene.objects)))]
        return {k: getattr(ref, k) for k in keys}
    filt: dict[str, str] = {}
    for _ in range(10):  # look for an absent combination; a scene holding every single value keeps the last one
        filt = {k: _pick(rng, _VALUES[k]) for k in keys}
        if count_objects(scene, **filt) == 0:
            break
    return filt


def _phrase_attributes(filt: dict[str, str], rng: np.random.Generator) -> str:
    """'How many big shiny balls are there?': CLEVR's word order (size colour material shape) and synonyms."""
    words = [_pick(rng, _WORDS.get(filt[k], (filt[k],))) for k in ("size", "color", "material") if k in filt]
    words.append(_pick(rng, _PLURALS[filt.get("shape")]))
    return _pick(rng, _ATTRIBUTE_TEMPLATES).format(" ".join(words))


def sample_question(
    scene: Scene, rng: np.random.Generator, question_types: Sequence[str] = QUESTION_TYPES
) -> dict[str, Any]:
    """A counting question about the scene, its answer, its type and the attribute filter it counts."""
    unknown = set(question_types) - set(QUESTION_TYPES)
    if not question_types or unknown:
        raise ValueError(f"question_types must be a non-empty subset of {QUESTION_TYPES}, got {question_types!r}")
    qtype = _pick(rng, tuple(question_types))
    if qtype == "total":
        text = R1V_TOTAL_QUESTION if rng.random() < _R1V_SHARE else _pick(rng, _TOTAL_VARIANTS)
        return {"question": text, "answer": len(scene.objects), "question_type": qtype, "filter": {}}
    filt = _attribute_filter(scene, rng)
    answer = count_objects(scene, **filt)
    return {"question": _phrase_attributes(filt, rng), "answer": answer, "question_type": qtype, "filter": filt}


def _noun_phrase(obj: SceneObject) -> str:
    return f"a {obj.size} {obj.color} {obj.material} {obj.shape}"


def describe_scene(scene: Scene) -> str:
    """Every object from left to right, then the total: the reasoning a counting answer can be taught with."""
    n = len(scene.objects)
    if n == 0:
        return "There are no objects. 0 objects in total."
    phrases = [_noun_phrase(o) for o in sorted(scene.objects, key=lambda o: (o.x, o.y))]
    listing = phrases[0] if n == 1 else ", ".join(phrases[:-1]) + " and " + phrases[-1]
    return f"There is {listing}. {n} object{'s' if n != 1 else ''} in total."


# ---------------------------------------------------------------------------------------------------------------
# Rows
# ---------------------------------------------------------------------------------------------------------------


def check_cells(cells: Sequence[int] | None, width: int, height: int) -> None:
    """Raise ValueError unless ``cells`` (None, or [columns, rows]) divides a ``width`` x ``height`` image into square
    cells (:func:`sample_cell_scene`'s grid).

    >>> check_cells([3, 3], 320, 240)
    Traceback (most recent call last):
    ValueError: cells [3, 3] do not divide the 320x240 image into squares: columns must divide the width and rows the height by the same side
    """
    if cells is not None and (len(cells) != 2 or min(cells) < 1 or width % cells[0] or height % cells[1]
                              or width // cells[0] != height // cells[1]):  # fmt: skip
        raise ValueError(f"cells {list(cells)} do not divide the {width}x{height} image into squares: columns must "
                         "divide the width and rows the height by the same side")  # fmt: skip


def generate_rows(
    num: int,
    *,
    seed: int = 0,
    start: int = 0,
    min_objects: int = 3,
    max_objects: int = 10,
    width: int = 320,
    height: int = 240,
    split: str | None = "A",
    question_types: Sequence[str] = QUESTION_TYPES,
    sizes: Sequence[str] | None = None,
    zoom: float = 1.0,
    cells: tuple[int, int] | None = None,
    progress: bool = True,
) -> Iterator[dict[str, Any]]:
    """Rows ``start .. start+num-1``: image, question (``problem``), answer (``count``) and the scene as JSON.

    Row i uses only ``scene_rng(seed, i)``, so any range can be made alone and equals the same rows of a longer run.
    ``sizes`` and ``zoom`` are :func:`sample_scene`'s (object sizes allowed, objects scaled relative to the image);
    ``cells`` = (columns, rows) places the objects one to a cell of that grid over the image instead
    (:func:`sample_cell_scene`; ``width`` must be ``columns`` cells wide and ``height`` ``rows`` cells high).
    """
    check_cells(cells, width, height)
    for index in tqdm(range(start, start + num), desc="CLEVR scenes", disable=not progress):
        rng = scene_rng(seed, index)
        if cells is not None:
            scene = sample_cell_scene(rng, cells=tuple(cells), cell=width // cells[0], min_objects=min_objects,
                                      max_objects=max_objects, split=split)  # fmt: skip
        else:
            scene = sample_scene(
                rng,
                min_objects=min_objects,
                max_objects=max_objects,
                width=width,
                height=height,
                split=split,
                sizes=sizes,
                zoom=zoom,
            )
        question = sample_question(scene, rng, question_types)
        yield {
            "image": render_scene(scene),
            "problem": question["question"],
            "count": question["answer"],
            "question_type": question["question_type"],
            "scene": json.dumps(scene.to_dict()),
            "index": index,
        }
