"""Small evaluation files in R1-V's formats, with drawn images: for tests and for a dry run of the scripts.

The layout mirrors R1-V's ``src/eval/``, so the scripts run on it with their default file names:

    DIR/prompts/superclevr_test200_counting_problems.jsonl   DIR/images/superCLEVR_new_025000.png …
    DIR/prompts/geoqa_test_prompts.jsonl                     DIR/Geo170K/images/test/0.png …

    python -m suzak.eval.fixtures --output /tmp/eval-fixture
    cd /tmp/eval-fixture && python /path/to/suzak/src/eval/test_qwen2vl_counting_superclevr.py --model_path tiny

SuperCLEVR-like images are procedural CLEVR scenes (:mod:`suzak.data.clevr`) at SuperCLEVR's 640×480, with some at other
sizes so one batch mixes image sizes; the answer is the number of objects drawn. GeoQA-like images are triangles
with their angles written on; ground truths are strings such as ``"140°"``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from PIL import Image, ImageDraw

from suzak.data.clevr import render_scene, sample_scene, scene_rng

__all__ = ["SUPERCLEVR_QUESTION", "write_fixtures", "write_geoqa", "write_superclevr"]

SUPERCLEVR_QUESTION = "How many different items are there in the image?"  # R1-V's SuperCLEVR question, verbatim
SUPERCLEVR_SIZES = ((640, 480), (640, 480), (320, 240), (480, 640))  # (w, h), cycled over the items
GEOQA_SIZES = ((224, 160), (300, 300), (180, 256))


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    return path


def write_superclevr(root: str | Path, num: int = 8, *, seed: int = 0,
                     sizes: tuple[tuple[int, int], ...] = SUPERCLEVR_SIZES) -> Path:  # fmt: skip
    """``num`` SuperCLEVR-format lines (ids 25000…) and their images under ``root``; returns the JSONL path.

    Images are drawn at 640×480 and resized to ``sizes`` (width, height), cycled over the items.
    """
    root = Path(root)
    (root / "images").mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(num):
        scene = sample_scene(scene_rng(seed, i), width=640, height=480)
        image = render_scene(scene).resize(sizes[i % len(sizes)], Image.Resampling.BICUBIC)
        name = f"superCLEVR_new_{25000 + i:06d}.png"
        image.save(root / "images" / name)
        rows.append(
            {"image_path": f"./images/{name}", "question": SUPERCLEVR_QUESTION, "ground_truth": len(scene.objects)}
        )
    return _write_jsonl(root / "prompts" / "superclevr_test200_counting_problems.jsonl", rows)


def _triangle(size: tuple[int, int], angles: tuple[int, int]) -> Image.Image:
    w, h = size
    image = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(image)
    a, b, c = (w * 0.1, h * 0.85), (w * 0.9, h * 0.85), (w * 0.4, h * 0.15)
    draw.polygon([a, b, c], outline="black", width=2)
    for (x, y), text in zip((a, b, c), ("A", "B", "C"), strict=True):
        draw.text((x - 8, y - 4), text, fill="black")
    draw.text((a[0] + 14, a[1] - 16), f"{angles[0]}°", fill="black")
    draw.text((b[0] - 34, b[1] - 16), f"{angles[1]}°", fill="black")
    return image


def write_geoqa(root: str | Path, num: int = 6) -> Path:
    """``num`` GeoQA-format lines (exterior-angle questions, answers like ``"140°"``) and their images."""
    root = Path(root)
    folder = root / "Geo170K" / "images" / "test"
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(num):
        angles = (40 + 5 * i, 60 + 3 * i)
        _triangle(GEOQA_SIZES[i % len(GEOQA_SIZES)], angles).save(folder / f"{i}.png")
        question = (f"As shown in the figure, in triangle ABC, angle A = {angles[0]}.0, angle B = {angles[1]}.0, "
                    "then the exterior angle at C is ()")  # fmt: skip
        rows.append({"image_path": f"./Geo170K/images/test/{i}.png", "question": question,
                     "ground_truth": f"{angles[0] + angles[1]}°"})  # fmt: skip
    return _write_jsonl(root / "prompts" / "geoqa_test_prompts.jsonl", rows)


def write_fixtures(root: str | Path, superclevr: int = 8, geoqa: int = 6) -> dict[str, Path]:
    return {"superclevr": write_superclevr(root, superclevr), "geoqa": write_geoqa(root, geoqa)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m suzak.eval.fixtures", description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", required=True, help="folder to write (laid out like R1-V's src/eval/)")
    parser.add_argument("--superclevr", type=int, default=8, help="SuperCLEVR-like items")
    parser.add_argument("--geoqa", type=int, default=6, help="GeoQA-like items")
    args = parser.parse_args(argv)
    for task, path in write_fixtures(args.output, args.superclevr, args.geoqa).items():
        print(f"{task}: {path}")


if __name__ == "__main__":
    main()
