"""RefCOCO, RefCOCO+ and RefCOCOg (referring-expression comprehension) in the two layouts they are shared in.

- **VLM-R1's annotation files** (``rec_jsons_processed`` from Hub ``omlab/VLM-R1``: ``refcoco_val.json`` ...): a JSON
  list of records ``{"image": "train2014/COCO_train2014_....jpg", "problem": "Please provide the bounding box
  coordinate of the region this sentence describes: <sentence>.", "normal_caption": "<sentence>", "solution": [x1,
  y1, x2, y2], ...}`` with boxes in original-image pixels and paths relative to the COCO root; their training files
  are JSON lines ``{"image", "conversations": [{"from": "human", "value": "<image>..."}, {"from": "gpt", "value":
  "[x1, y1, x2, y2]"}]}``.
- **The Hub layout** lmms-eval reads (``lmms-lab/RefCOCO``, ``lmms-lab/RefCOCOplus``, ``lmms-lab/RefCOCOg``): one row
  per annotated object, columns ``question_id, image, question, answer (its sentences), segmentation, bbox,
  iscrowd, file_name``, ``bbox`` COCO's ``[x, y, width, height]`` in original pixels; a row per sentence here.

Both give rows of suzak's columns: ``prompt`` (the sentence under a grounding template, ``rec`` by default),
``image``, ``solution`` ``"[x1, y1, x2, y2]"`` in original pixels (the trainer maps it to each model's frame:
:mod:`suzak.media.boxes`), ``problem`` (the sentence) and the source's line or row. A box given in another frame says
so with ``box_frame`` (``normalized`` or ``relative1000``), never guessed; a box outside its image is caught by the
dataset validation before step 1 (:func:`suzak.training.checks.validate_rows`), by row.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from suzak import SuzakError
from suzak.data.files import read_jsonl
from suzak.media.boxes import DATASET_FRAMES, to_pixels
from suzak.scoring.prompts import build_conversation, get_template

__all__ = ["REFCOCO_REPOS", "VLM_R1_PREFIX", "refcoco", "refcoco_hub_rows", "refcoco_vlm_r1_rows"]

REFCOCO_REPOS = {"refcoco": "lmms-lab/RefCOCO", "refcoco+": "lmms-lab/RefCOCOplus", "refcocog": "lmms-lab/RefCOCOg"}
# What VLM-R1 puts in front of each sentence in its ``problem`` field (src/eval/test_rec_r1.py's data).
VLM_R1_PREFIX = "Please provide the bounding box coordinate of the region this sentence describes:"
_SENTENCE_RE = re.compile(rf"^(?:<image>)?\s*(?:{re.escape(VLM_R1_PREFIX)})?\s*(.*?)\.?\s*$", re.DOTALL)


def sentence_of(problem: str) -> str:
    """The referring sentence of a VLM-R1 ``problem`` (its instruction and final full stop removed).

    >>> sentence_of("<image>Please provide the bounding box coordinate of the region this sentence describes: the lady.")
    'the lady'
    """
    return _SENTENCE_RE.match(problem).group(1).strip()


def _box_values(value: Any, where: str) -> list[float]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise SuzakError(f"{where}: the box {value!r:.60} is not a JSON list [x1, y1, x2, y2]") from None
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], list):
        value = value[0]
    if not (isinstance(value, list) and len(value) == 4 and all(isinstance(v, int | float) for v in value)):
        raise SuzakError(f"{where}: a box is 4 numbers [x1, y1, x2, y2], got {value!r:.80}")
    return [float(v) for v in value]


def _row(sentence: str, image: Any, box: list[float], template: str, **own) -> dict:
    text = get_template(template).render(sentence)
    return {"prompt": build_conversation(text), "image": image, "solution": json.dumps([round(v, 2) for v in box]),
            "problem": sentence, **own}  # fmt: skip


def _image_size(image: Any) -> tuple[int, int]:
    from PIL import Image

    if isinstance(image, Image.Image):
        return image.size
    with Image.open(image) as opened:  # the header only
        return opened.size


def _in_pixels(box: list[float], box_frame: str, image: Any) -> list[float]:
    if box_frame == "pixels":
        return box
    return list(to_pixels(box, box_frame, *_image_size(image)))


def refcoco_vlm_r1_rows(path: str | Path, image_root: str | Path, *, template: str = "rec",
                        box_frame: str = "pixels") -> list[dict]:  # fmt: skip
    """Rows of one of VLM-R1's files: a JSON list (its evaluation files) or JSON lines (its training files), image
    paths relative to ``image_root``. A record that cannot be read is one line naming the file and record."""
    path, root = Path(path), Path(image_root)
    if path.suffix == ".jsonl":
        records = list(read_jsonl(path))
    else:
        if not path.is_file():
            raise SuzakError(f"annotation file not found: {path}")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as error:
            raise SuzakError(f"{path}: not valid JSON ({error})") from None
        if not isinstance(data, list):
            raise SuzakError(f"{path}: VLM-R1's annotation files hold a JSON list, not a {type(data).__name__}")
        records = list(enumerate(data, start=1))
    rows = []
    for number, record in records:
        where = f"{path}:{number}"
        if not isinstance(record, dict) or "image" not in record:
            raise SuzakError(f"{where}: a record needs 'image' and a box; got {record!r:.80}")
        if "conversations" in record:  # a training line
            turns = record["conversations"]
            if not (isinstance(turns, list) and len(turns) >= 2 and all(isinstance(t, dict) for t in turns)):
                raise SuzakError(f"{where}: 'conversations' must hold the question turn and the box turn")
            sentence, box = sentence_of(str(turns[0].get("value", ""))), turns[1].get("value")
        else:
            sentence = str(record.get("normal_caption") or sentence_of(str(record.get("problem", ""))))
            box = record.get("solution")
        if box is None or not sentence:
            raise SuzakError(f"{where}: a record needs a sentence (normal_caption / problem) and a box (solution)")
        image, box = str(root / record["image"]), _box_values(box, where)
        if box_frame != "pixels":
            if not Path(image).is_file():
                raise SuzakError(f"{where}: image {image} not found (a {box_frame} box is read against its size)")
            box = _in_pixels(box, box_frame, image)
        rows.append(_row(sentence, image, box, template, line=number, image_path=record["image"]))
    if not rows:
        raise SuzakError(f"{path}: no records")
    return rows


def refcoco_hub_rows(dataset, *, template: str = "rec", source: str = "RefCOCO") -> list[dict]:
    """Rows of a dataset in the Hub layout (``image``, ``bbox`` as [x, y, width, height], ``answer``: the sentences,
    or ``question``), one per sentence."""
    missing = {"image", "bbox"} - set(dataset.column_names)
    if missing or not {"answer", "question"} & set(dataset.column_names):
        raise SuzakError(f"{source}: the Hub layout has image, bbox and answer (or question) columns; it has "
                         f"{dataset.column_names}")  # fmt: skip
    rows = []
    for index, record in enumerate(dataset):
        x, y, width, height = _box_values(record["bbox"], f"{source} row {index}")
        sentences = record.get("answer") or [record.get("question")]
        for sentence in [sentences] if isinstance(sentences, str) else sentences:
            rows.append(_row(str(sentence).strip().rstrip("."), record["image"], [x, y, x + width, y + height],
                             template, index=len(rows), question_id=str(record.get("question_id", index))))  # fmt: skip
    return rows


def refcoco(name: str = "refcoco", split: str = "val", *, path: str | list[str] | None = None,
            image_root: str | None = None, template: str = "rec", box_frame: str = "pixels",
            revision: str | None = None, cache_dir: str | None = None):  # fmt: skip
    """RefCOCO/RefCOCO+/RefCOCOg: VLM-R1's annotation file at ``path`` (.json or .jsonl, or a list of them, as VLM-R1
    trains on its three; images under ``image_root``, the COCO root), a local copy of the Hub layout at ``path`` (a
    ``save_to_disk`` or parquet folder), or without ``path`` the Hub's ``lmms-lab`` copy of ``name`` (``refcoco``,
    ``refcoco+``, ``refcocog``), ``split`` (``val``, ``test``, ``testA``, ``testB``)."""
    import datasets

    if box_frame not in DATASET_FRAMES:
        raise SuzakError(f"box_frame {box_frame!r}: one of {', '.join(DATASET_FRAMES)}")
    if isinstance(path, list):
        parts = [refcoco(name, split, path=p, image_root=image_root, template=template, box_frame=box_frame)
                 for p in path]  # fmt: skip
        return datasets.concatenate_datasets(parts)
    if path is not None and Path(path).suffix in (".json", ".jsonl"):
        if image_root is None:
            raise SuzakError(f"{path}: VLM-R1's files name images relative to the COCO root: set image_root")
        rows = refcoco_vlm_r1_rows(path, image_root, template=template, box_frame=box_frame)
        dataset = datasets.Dataset.from_list(rows)
        return dataset.cast_column("image", datasets.Image())
    if path is not None:
        dataset = datasets.load_from_disk(path) if Path(path, "state.json").is_file() else datasets.load_dataset(
            path, split=split)  # fmt: skip
        return datasets.Dataset.from_list(refcoco_hub_rows(dataset, template=template, source=str(path)))
    if name not in REFCOCO_REPOS:
        raise SuzakError(f"refcoco: name {name!r}; one of {', '.join(REFCOCO_REPOS)} (or path=...)")
    from suzak.data.hub import load_hub_dataset

    repo = REFCOCO_REPOS[name]
    hint = (f"With network, save it once (`python -c \"import datasets; datasets.load_dataset('{repo}', split='{split}')"
            f".save_to_disk('data/{name}-{split}')\"`) and pass dataset_options {{path: data/{name}-{split}}}; or use "
            "VLM-R1's annotation files (path: refcoco_val.json, image_root: the COCO folder)")  # fmt: skip
    dataset = load_hub_dataset(repo, split=split, hint=hint, revision=revision, cache_dir=cache_dir)
    return datasets.Dataset.from_list(refcoco_hub_rows(dataset, template=template, source=repo))
