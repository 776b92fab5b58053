"""Dataset builders: one per source, all returning the same columns.

Every builder returns a ``datasets.Dataset`` with

- ``prompt``: TRL's conversational form, one user turn, image placeholders first (as Qwen2.5-VL is trained);
- ``image`` (one PIL image) for image tasks, absent for text tasks;
- ``solution``: the gold answer, in the form the source ships it (``"<answer> 3 </answer>"``, ``"18"``, ``"140°"``);
- ``problem``: the bare question, plus the source's own fields.

The question text always goes through :mod:`suzak.scoring.prompts`, so training, SFT and evaluation prompts agree.

    python -m suzak.data clevr_synthetic --num_rows 5000 --seed 0 --output data/clevr5k          # save_to_disk
    python -m suzak.data clevr_synthetic --num_rows 5000 --output data/clevr5k --format parquet  # Hub layout
    python -m suzak.data gsm8k_synthetic --num_rows 500 --output data/wordproblems.jsonl --format jsonl
"""

from __future__ import annotations

import argparse
import inspect
import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from suzak import SuzakError
from suzak.data.colors import color_squares
from suzak.data.files import read_jsonl
from suzak.data.grounding import grounding_shapes
from suzak.data.gui import gui_click
from suzak.data.miniwob import miniwob_rows
from suzak.data.motion import moving_ball
from suzak.data.refcoco import refcoco
from suzak.data.video_r1 import VIDEO_R1_REPO, video_r1
from suzak.data.zoom import zoom_checks
from suzak.scoring.parsing import gold_answer
from suzak.scoring.prompts import DEFAULT_TEMPLATE, build_conversation, get_template

__all__ = [
    "DATASETS",
    "build_dataset",
    "clevr_cogen",
    "clevr_synthetic",
    "color_squares",
    "moving_ball",
    "refcoco",
    "video_r1",
    "geoqa_r1v",
    "grounding_shapes",
    "gsm8k",
    "gui_click",
    "jsonl",
    "jsonl_record",
    "read_jsonl",
    "save_dataset",
]

logger = logging.getLogger(__name__)

CLEVR_COGEN_REPO = "leonardPKU/clevr_cogen_a_train"
GEOQA_REPO = "leonardPKU/GEOQA_R1V_Train_8K"
GSM8K_REPO = "openai/gsm8k"


def _with_prompt(row: dict, template: str, num_images: int, question_key: str = "problem", *,
                 video: bool = False) -> dict:  # fmt: skip
    text = get_template(template).render(str(row[question_key]).strip())
    return {"prompt": build_conversation(text, num_images=num_images, video=video)}


# --- procedural CLEVR -------------------------------------------------------------------------------------------


def _clevr_rows(template: str, solution_format: str, **options) -> Iterator[dict]:
    from suzak.data.clevr import generate_rows

    for row in generate_rows(**options):
        problem = row["problem"]
        yield {
            **_with_prompt({"problem": problem}, template, num_images=1),
            "image": row["image"],
            "solution": solution_format.format(n=row["count"]),
            "problem": problem,
            "count": row["count"],
            "question_type": row["question_type"],
            "scene": row["scene"],
            "index": row["index"],
        }


def clevr_synthetic(
    num_rows: int = 2000,
    *,
    seed: int = 0,
    start: int = 0,
    min_objects: int = 3,
    max_objects: int = 10,
    split: str = "A",
    question_types: tuple[str, ...] | list[str] = ("total", "attribute"),
    width: int = 320,
    height: int = 240,
    sizes: tuple[str, ...] | list[str] | None = None,
    zoom: float = 1.0,
    cells: tuple[int, int] | list[int] | None = None,
    template: str = DEFAULT_TEMPLATE,
    solution_format: str = "<answer> {n} </answer>",
    progress: bool = True,
    cache_dir: str | None = None,
):
    """Procedurally drawn CLEVR-like counting scenes (offline). Row ``i`` depends only on ``(seed, start + i)``.

    Use disjoint ``start`` ranges (or seeds) for a held-out split. The ``scene`` column is the JSON scene description.
    ``sizes`` (e.g. ``["large"]``) and ``zoom`` (objects scaled relative to the image) make easier counting scenes
    for small images and small models; ``cells`` ([columns, rows]) puts the objects one to a cell of that grid, each
    cell a visual token's square, the easiest, as ``python -m suzak.selftest --task counting`` uses.
    """
    import datasets

    from suzak.data.clevr import check_cells

    try:
        check_cells(cells, width, height)  # before any row is drawn: one line naming the option
    except ValueError as error:
        raise SuzakError(str(error)) from None
    features = datasets.Features(
        {
            "prompt": [{"role": datasets.Value("string"), "content": [{"type": datasets.Value("string"), "text": datasets.Value("string")}]}],
            "image": datasets.Image(),
            "solution": datasets.Value("string"),
            "problem": datasets.Value("string"),
            "count": datasets.Value("int32"),
            "question_type": datasets.Value("string"),
            "scene": datasets.Value("string"),
            "index": datasets.Value("int64"),
        }
    )  # fmt: skip
    options = {
        "num": num_rows, "seed": seed, "start": start, "min_objects": min_objects, "max_objects": max_objects,
        "split": split, "question_types": tuple(question_types), "width": width, "height": height, "progress": progress,
        "sizes": None if sizes is None else tuple(sizes), "zoom": zoom, "cells": None if cells is None else tuple(cells),
    }  # fmt: skip
    return datasets.Dataset.from_generator(
        _clevr_rows,
        gen_kwargs={"template": template, "solution_format": solution_format, **options},
        features=features,
        cache_dir=cache_dir,
    )


# --- Hub sources -------------------------------------------------------------------------------------------------


def _r1v_hub(repo_id: str, split: str, template: str, revision: str | None, cache_dir: str | None):
    from suzak.data.hub import load_hub_dataset

    hint = (
        f"With network, run once `python -c \"import datasets; datasets.load_dataset('{repo_id}')"
        ".save_to_disk('data/" + repo_id.split("/")[-1] + "')\"` and set dataset_name to that folder; "
        "offline, use dataset_name=clevr_synthetic or a JSONL file"
    )
    dataset = load_hub_dataset(repo_id, split=split, hint=hint, revision=revision, cache_dir=cache_dir)
    return _r1v_columns(dataset, template)


def _r1v_columns(dataset, template: str):
    """R1-V's Hub layout (``image``, ``problem``, ``solution``) to suzak's columns."""
    missing = {"image", "problem", "solution"} - set(dataset.column_names)
    if missing:
        raise SuzakError(f"dataset lacks R1-V column(s) {sorted(missing)}; it has {dataset.column_names}")
    return dataset.map(lambda row: _with_prompt(row, template, num_images=1), desc="prompts")


def clevr_cogen(split: str = "train", *, template: str = DEFAULT_TEMPLATE, revision: str | None = None,
                cache_dir: str | None = None):  # fmt: skip
    """R1-V's CLEVR-CoGenT-A counting set from the Hub (``leonardPKU/clevr_cogen_a_train``, ~70k rows)."""
    return _r1v_hub(CLEVR_COGEN_REPO, split, template, revision, cache_dir)


def geoqa_r1v(split: str = "train", *, template: str = DEFAULT_TEMPLATE, revision: str | None = None,
              cache_dir: str | None = None):  # fmt: skip
    """R1-V's GeoQA training set from the Hub (``leonardPKU/GEOQA_R1V_Train_8K``)."""
    return _r1v_hub(GEOQA_REPO, split, template, revision, cache_dir)


def gsm8k_gold(answer: str) -> str:
    """The gold number of a GSM8K worked answer (official ``#### N`` extractor, commas removed)."""
    if "####" not in answer:
        raise ValueError(f"no '#### <number>' in GSM8K answer {answer[-80:]!r}")
    return gold_answer(answer)


def _gsm8k_columns(dataset, template: str, source: str):
    missing = {"question", "answer"} - set(dataset.column_names)
    if missing:
        raise SuzakError(f"{source}: GSM8K rows need 'question' and 'answer', missing {sorted(missing)}")

    def convert(row: dict, index: int) -> dict:
        try:
            gold = gsm8k_gold(row["answer"])
        except ValueError as error:
            raise SuzakError(f"{source} row {index}: {error}") from None
        return {**_with_prompt(row, template, 0, "question"), "solution": gold, "problem": row["question"]}

    return dataset.map(convert, with_indices=True, desc="prompts")


def gsm8k(split: str = "train", *, path: str | None = None, template: str = "gsm8k", revision: str | None = None,
          cache_dir: str | None = None):  # fmt: skip
    """GSM8K (Hub ``openai/gsm8k``, config ``main``) or a local JSONL of the same rows (``path``).

    ``solution`` is the gold number; the worked ``answer`` is kept (SFT targets use it).
    """
    import datasets

    if path is not None:
        rows = [row for _, row in read_jsonl(path)]
        return _gsm8k_columns(datasets.Dataset.from_list(rows), template, str(path))
    from suzak.data.hub import load_hub_dataset

    hint = "Offline, pass a local JSONL of GSM8K rows ({'question', 'answer'}) as dataset_name"
    dataset = load_hub_dataset(GSM8K_REPO, "main", split=split, hint=hint, revision=revision, cache_dir=cache_dir)
    return _gsm8k_columns(dataset, template, GSM8K_REPO)


def gsm8k_synthetic(num_rows: int = 256, *, seed: int = 0, start: int = 0, template: str = "gsm8k"):
    """Made-up word problems in GSM8K's row format (:mod:`suzak.data.wordproblems`), offline; same columns as ``gsm8k``."""
    import datasets

    from suzak.data.wordproblems import word_problems

    rows = list(word_problems(num_rows, seed=seed, start=start))
    return _gsm8k_columns(datasets.Dataset.from_list(rows), template, "gsm8k_synthetic")


# --- local files -------------------------------------------------------------------------------------------------


_QUESTION_KEYS = ("problem", "question")
_GOLD_KEYS = ("solution", "ground_truth", "answer")
_IMAGE_KEYS = ("image", "image_path")


def _first_key(row: dict, keys: tuple[str, ...]) -> str | None:
    return next((k for k in keys if k in row), None)


def jsonl(path: str | Path, *, image_root: str | Path | None = None, template: str = DEFAULT_TEMPLATE):
    """A local JSONL file of image or video questions.

    Accepts R1-V's eval lines (``{"image_path", "question", "ground_truth"}``) and training-style lines
    (``image``/``images``, ``problem``, ``solution``); a line with ``video`` (a video file, or a list of frame files
    with an optional ``video_fps``, their rate) instead of an image is a video question, and one file may mix image
    lines and video lines. Paths are relative to ``image_root`` when given, else to the file's folder. Images and
    videos load lazily; every path is checked up front, and a missing one is an error that names the first missing
    path and how many are missing.
    """
    import datasets

    path = Path(path)
    root = Path(image_root) if image_root is not None else path.parent
    records, missing = [], []
    for number, row in read_jsonl(path):  # a line without a gold answer is for a reference-free judge: the rewards
        records.append(jsonl_record(row, number, path, root, template, missing, need_gold=False))  # that read one say so
    if not records:
        raise SuzakError(f"{path}: no rows")
    if all(r["solution"] is None for r in records):  # no gold anywhere: no column (a judge then judges without one)
        records = [{k: v for k, v in r.items() if k != "solution"} for r in records]
    videos = [r for r in records if "video" in r]
    if missing:
        kind = "image or video file(s)" if videos else "image(s)"
        raise SuzakError(f"{path}: {len(missing)} {kind} missing, first {missing[0]} (image_root={root})")
    frame_lists = [r["line"] for r in videos if isinstance(r["video"], list)]
    if frame_lists and len(frame_lists) < len(videos):
        first = next(r["line"] for r in videos if isinstance(r["video"], str))
        raise SuzakError(f"{path}:{first}: a video file, where line {frame_lists[0]} has a list of frames: one file "
                         "holds video files or frame lists, not both")  # fmt: skip
    if videos:  # image lines and video lines: each has None in the other's column
        columns = dict.fromkeys(c for r in records for c in r)
        records = [{c: r.get(c) for c in columns} for r in records]
    dataset = datasets.Dataset.from_list(records)
    features = {"image": datasets.Image(), "images": datasets.List(datasets.Image())}
    features |= {"video": datasets.List(datasets.Image())} if frame_lists else {}  # frames decode lazily, as images do
    for column, feature in features.items():
        if column in dataset.column_names:
            dataset = dataset.cast_column(column, feature)
    return dataset


def _gold_text(gold) -> str:
    """A line's gold answer as the ``solution`` string: a list as JSON (a box ``[x1, y1, x2, y2]``, or OCR's accepted
    answers ``["$ 2,500", "2,500"]``, which ``str`` would write in Python's quotes), anything else as ``str``.

    >>> _gold_text(["$ 2,500", "2,500"]), _gold_text([1, 2.5, 3, 4]), _gold_text(3)
    ('["$ 2,500", "2,500"]', '[1, 2.5, 3, 4]', '3')
    """
    return json.dumps(gold) if isinstance(gold, list) else str(gold)


def jsonl_record(row: dict, number: int, path: Path, root: Path, template: str, missing: list[str], *,
                 need_gold: bool = True) -> dict:  # fmt: skip
    """One JSONL line (``number`` of ``path``) as a data row: its prompt rendered with ``template``, its media paths
    resolved against ``root`` (``image``, ``images``, or ``video`` with ``video_fps``), ``problem``, ``solution`` and
    the line's own keys; a line it cannot read is one line naming file and line. Paths that are not files are added
    to ``missing``. Training's :func:`jsonl` and ``suzak.eval jsonl`` read lines with it; training's takes a line
    without a gold answer (``need_gold`` False: ``solution`` None, for a reference-free judge; the validation names a
    line whose gold a reward reads), the eval's needs one."""
    question_key, gold_key = _first_key(row, _QUESTION_KEYS), _first_key(row, _GOLD_KEYS)
    gold = None if gold_key is None else row[gold_key]
    if question_key is None or (gold is None and need_gold):
        raise SuzakError(f"{path}:{number}: need a question ({'/'.join(_QUESTION_KEYS)}) and a gold answer "
                         f"({'/'.join(_GOLD_KEYS)}); got keys {sorted(row)}")  # fmt: skip
    image_key = "images" if "images" in row else _first_key(row, _IMAGE_KEYS)
    if image_key is not None and "video" in row:
        raise SuzakError(f"{path}:{number}: an image and a video: a line holds one or the other")
    if "video" in row:
        video = row["video"]
        if isinstance(video, list) and video and all(isinstance(p, str) for p in video):
            paths = [str(root / p) for p in video]
            media = {"video": paths}
        elif isinstance(video, str):
            paths = [str(root / video)]
            media = {"video": paths[0]}
        else:
            raise SuzakError(f"{path}:{number}: video must be a file path or a list of frame paths, got {video!r:.60}")
        fps = row.get("video_fps")
        if fps is not None and (not isinstance(fps, int | float) or isinstance(fps, bool) or fps <= 0):
            raise SuzakError(f"{path}:{number}: video_fps must be a positive number, got {fps!r}")
        media |= {"video_fps": float(fps)} if fps is not None else {}
    elif image_key == "images":
        media = {"images": [str(root / p) for p in row["images"]]}
        paths = media["images"]
    elif image_key is not None:
        media = {"image": str(root / row[image_key])}
        paths = [media["image"]]
    else:
        raise SuzakError(f"{path}:{number}: no image ({'/'.join(_IMAGE_KEYS)}/images) or video; got keys {sorted(row)}")
    missing.extend(p for p in paths if not Path(p).is_file())
    own = {k: v for k, v in row.items() if k not in {"image", "images", "video", "video_fps", question_key, gold_key}}
    is_video = "video" in media
    return {
        **_with_prompt({"problem": row[question_key]}, template, 0 if is_video else len(paths), video=is_video),
        **media,
        "problem": str(row[question_key]),
        "solution": None if gold is None else _gold_text(gold),
        "line": number,
        **{k: json.dumps(v) if isinstance(v, dict | list) else v for k, v in own.items()},
    }


# --- registry ----------------------------------------------------------------------------------------------------

DATASETS: dict[str, Callable[..., Any]] = {
    "clevr_synthetic": clevr_synthetic,
    "color_squares": color_squares,
    "clevr_cogen": clevr_cogen,
    "geoqa_r1v": geoqa_r1v,
    "gsm8k": gsm8k,
    "gsm8k_synthetic": gsm8k_synthetic,
    "grounding_shapes": grounding_shapes,
    "gui_click": gui_click,
    "zoom_checks": zoom_checks,
    "jsonl": jsonl,
    "miniwob": miniwob_rows,
    "moving_ball": moving_ball,
    "refcoco": refcoco,
    "video_r1": video_r1,
}


def build_dataset(name: str, **options):
    """A dataset by builder name, Hub alias, local folder (``save_to_disk``/parquet) or JSONL file.

    An option the builder does not take is one line naming it and the builder's options (never silently ignored).
    """
    aliases = {CLEVR_COGEN_REPO: clevr_cogen, GEOQA_REPO: geoqa_r1v, GSM8K_REPO: gsm8k, VIDEO_R1_REPO: video_r1}
    builder = DATASETS.get(name) or aliases.get(name)
    if builder is not None:
        return builder(**_checked(name, builder, options))
    path = Path(name)
    if path.suffix == ".jsonl":
        return _local_jsonl(path, **_checked(name, _local_jsonl, options, taken=("path",)))
    if path.is_dir():
        return _local_folder(path, **_checked(name, _local_folder, options, taken=("path",)))
    raise SuzakError(
        f"unknown dataset {name!r}: not a builder ({', '.join(DATASETS)}), a Hub alias "
        f"({', '.join(aliases)}), a .jsonl file or a local dataset folder"
    )


def _checked(name: str, builder: Callable, options: dict, taken: tuple[str, ...] = ()) -> dict:
    """``options``, once each is a keyword parameter of ``builder`` (``taken``: set by suzak, not an option)."""
    params = inspect.signature(builder).parameters.values()
    valid = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in taken]
    unknown = [key for key in options if key not in valid]
    if unknown:
        raise SuzakError(f"dataset {name!r}: unknown option {unknown[0]!r} (dataset_options); its options: "
                         f"{', '.join(valid)}")  # fmt: skip
    return options


def _local_jsonl(path: Path, *, image_root: str | Path | None = None, template: str | None = None):
    """A JSONL file: GSM8K rows (question + answer, no image) or image questions."""
    first = next((row for _, row in read_jsonl(path)), {})
    if "answer" in first and "question" in first and not set(_IMAGE_KEYS + ("images", "video")) & set(first):
        return gsm8k(path=str(path), **({"template": template} if template else {}))
    return jsonl(path, image_root=image_root, template=template or DEFAULT_TEMPLATE)


def _local_folder(path: Path, *, template: str = DEFAULT_TEMPLATE, split: str = "train"):
    """A folder written by ``save_to_disk`` (prompts included) or a Hub-layout parquet/R1-V copy."""
    import datasets

    if (path / "dataset_info.json").is_file() or (path / "state.json").is_file():
        dataset = datasets.load_from_disk(str(path))
    elif (path / "dataset_dict.json").is_file():
        dataset = datasets.load_from_disk(str(path))[split]
    else:
        dataset = datasets.load_dataset(str(path), split=split)
    if "prompt" in dataset.column_names:
        return dataset
    if {"question", "answer"} <= set(dataset.column_names):
        return _gsm8k_columns(dataset, template if template != DEFAULT_TEMPLATE else "gsm8k", str(path))
    return _r1v_columns(dataset, template)


def save_dataset(dataset, output: str | Path, fmt: str = "disk") -> Path:
    """Write ``dataset`` as ``save_to_disk`` output or in the Hub's parquet layout (``data/train-*.parquet``)."""
    output = Path(output)
    if fmt == "disk":
        dataset.save_to_disk(str(output))
    elif fmt == "jsonl":
        output.parent.mkdir(parents=True, exist_ok=True)
        dataset.to_json(str(output), lines=True, force_ascii=False)
    elif fmt == "parquet":
        (output / "data").mkdir(parents=True, exist_ok=True)
        dataset.to_parquet(str(output / "data" / "train-00000-of-00001.parquet"))
    else:
        raise SuzakError(f"unknown format {fmt!r}: use 'disk', 'parquet' or 'jsonl'")
    return output


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m suzak.data", description="Build a dataset and write it to disk.")
    parser.add_argument("name", choices=sorted(DATASETS), help="builder")
    parser.add_argument("--output", required=True, help="folder to write")
    parser.add_argument(
        "--format", default="disk", choices=["disk", "parquet", "jsonl"], help="save_to_disk, Hub parquet or JSONL"
    )
    parser.add_argument("--num_rows", type=int, default=2000, help="synthetic builders: rows to draw")
    parser.add_argument("--seed", type=int, default=0, help="synthetic builders: seed")
    parser.add_argument("--start", type=int, default=0, help="synthetic builders: first row index")
    parser.add_argument("--min_objects", type=int, default=3)
    parser.add_argument("--max_objects", type=int, default=10)
    parser.add_argument("--sizes", nargs="+", default=None, help="clevr_synthetic: object sizes (default: all)")
    parser.add_argument("--zoom", type=float, default=1.0, help="clevr_synthetic: objects scaled to the image")
    parser.add_argument("--cells", type=int, nargs=2, default=None, metavar=("COLUMNS", "ROWS"),
                        help="clevr_synthetic: objects one to a cell of this grid of squares over the 320x240 image "
                        "(e.g. 4 3); the self-test's counting scenes use cells of one visual token")  # fmt: skip
    parser.add_argument("--path", help="jsonl/gsm8k: local file")
    parser.add_argument("--template", default=None, help="prompt template (suzak.scoring.prompts.TEMPLATES)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    options: dict[str, Any] = {"template": args.template} if args.template else {}
    if args.name == "clevr_synthetic":
        options |= {"num_rows": args.num_rows, "seed": args.seed, "start": args.start,
                    "min_objects": args.min_objects, "max_objects": args.max_objects, "sizes": args.sizes,
                    "zoom": args.zoom, "cells": args.cells}  # fmt: skip
    elif args.name in ("gsm8k_synthetic", "grounding_shapes", "gui_click"):
        options |= {"num_rows": args.num_rows, "seed": args.seed, "start": args.start}
    elif args.name == "zoom_checks":
        options |= {"num_rows": args.num_rows, "seed": args.seed}
    elif args.path:
        options["path"] = args.path
    try:
        dataset = build_dataset(args.name, **options)
        if args.format == "jsonl" and args.name.startswith("gsm8k"):
            dataset = dataset.select_columns(["question", "answer"])  # GSM8K's own row format
        out = save_dataset(dataset, args.output, args.format)
    except SuzakError as error:
        raise SystemExit(f"error: {error}") from None
    print(f"wrote {len(dataset)} rows ({', '.join(dataset.column_names)}) to {out}")
