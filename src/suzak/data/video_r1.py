"""Video-R1's RL set (``Video-R1/Video-R1-data`` on the Hub): its video questions (and, on request, its image
questions) as suzak rows.

The Hub repository holds ``Video-R1-260k.json`` (263k rows mixing images and videos) and the media as zip archives
(CLEVRER, LLaVA-Video-178K, NeXT-QA, PerceptionTest, STAR, and image sets). Download it once and extract the zips in
place, then point ``data_root`` at the folder::

    hf download Video-R1/Video-R1-data --repo-type dataset --local-dir data/video-r1
    (cd data/video-r1 && for z in *.zip; do unzip -q -n "$z"; done)

Each row's ``path`` (``./CLEVRER/....mp4``) is resolved under ``data_root``; rows whose video is missing are
counted and left out with one warning, never silently. Without ``data_root`` the JSON is fetched from the Hub (its
videos must then be extracted beside it); offline that is one line saying how to get a local copy.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

from suzak import SuzakError
from suzak.scoring.prompts import DEFAULT_TEMPLATE, build_conversation, get_template

__all__ = ["VIDEO_R1_FILE", "VIDEO_R1_REPO", "video_r1", "video_r1_rows"]

logger = logging.getLogger(__name__)

VIDEO_R1_REPO = "Video-R1/Video-R1-data"
VIDEO_R1_FILE = "Video-R1-260k.json"
_ANSWER = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.DOTALL)


def _manifest(data_root: str | None) -> Path:
    if data_root is not None:
        path = Path(data_root) / VIDEO_R1_FILE
        if not path.is_file():
            raise SuzakError(f"video_r1: {path} does not exist (data_root must hold {VIDEO_R1_FILE} and the "
                             "extracted media folders)")  # fmt: skip
        return path
    from huggingface_hub import hf_hub_download

    from suzak.data.hub import offline_unless_reachable

    with offline_unless_reachable() as offline:
        try:
            return Path(hf_hub_download(VIDEO_R1_REPO, VIDEO_R1_FILE, repo_type="dataset"))
        except Exception as error:  # noqa: BLE001 - any download failure becomes the one line below
            why = "the Hub is unreachable and no cached copy exists" if offline else type(error).__name__
            raise SuzakError(
                f"cannot load Hub dataset {VIDEO_R1_REPO!r} ({VIDEO_R1_FILE}): {why}. With network, run `hf "
                f"download {VIDEO_R1_REPO} --repo-type dataset --local-dir data/video-r1`, extract its zips there and "
                "set dataset_options: {data_root: data/video-r1}"
            ) from None


def video_r1_rows(entries: list[dict], root: Path, *, problem_types: tuple[str, ...], sources: tuple[str, ...] | None,
                  template: str, data_types: tuple[str, ...] = ("video",)) -> tuple[list[dict], int]:  # fmt: skip
    """(rows, how many had no media file) from Video-R1 JSON entries: the rows of ``data_types`` (``video``,
    ``image``) and ``problem_types``; a video row has ``video`` (a path), an image row ``image`` (a path).

    >>> rows, missing = video_r1_rows([{"problem_id": 7, "problem": "What moves?", "data_type": "video",
    ...     "problem_type": "multiple choice", "options": ["A. cube", "B. ball"], "solution": "<answer>B</answer>",
    ...     "path": "./CLEVRER/v.mp4", "data_source": "CLEVRER"}], Path("/nowhere"), problem_types=("multiple choice",),
    ...     sources=None, template="plain")
    >>> rows, missing
    ([], 1)
    """
    render = get_template(template).render
    rows, missing = [], 0
    for line, entry in enumerate(entries):
        kind = entry.get("data_type")
        if kind not in data_types or entry.get("problem_type") not in problem_types:
            continue
        if sources is not None and entry.get("data_source") not in sources:
            continue
        media = (root / str(entry["path"])).resolve()
        if not media.is_file():
            missing += 1
            continue
        question = str(entry["problem"]).strip()
        if entry.get("options"):
            question += "\nOptions:\n" + "\n".join(str(option) for option in entry["options"])
            question += "\nAnswer with the option's letter."  # Video-R1's instruction; word_match reads the letter
        found = _ANSWER.search(str(entry["solution"]))
        rows.append({
            "prompt": build_conversation(render(question), int(kind == "image"), video=kind == "video"),
            kind: str(media), "solution": found.group(1) if found else str(entry["solution"]).strip(),
            "problem": question, "problem_type": entry["problem_type"], "line": line,
        })  # fmt: skip
    return rows, missing


def video_r1(data_root: str | None = None, *, problem_types: tuple[str, ...] | list[str] = ("multiple choice",),
             sources: tuple[str, ...] | list[str] | None = None, template: str = DEFAULT_TEMPLATE,
             max_rows: int | None = None, data_types: tuple[str, ...] | list[str] = ("video",)):  # fmt: skip
    """Video-R1-260k's questions: rows {prompt, video or image (a path), solution, problem, problem_type, line}.

    ``problem_types``: Video-R1's ``problem_type`` values to keep (``multiple choice``: the gold answer is a letter,
    scored by ``word_match``; ``numerical``: a number, ``math_accuracy``). ``sources``: its ``data_source`` values
    (e.g. ``[CLEVRER, STAR]``); all by default. ``data_types``: its video rows (default), or ``[image, video]`` for
    the mix Video-R1 trains on (image rows and video rows in one dataset; a batch may hold both). ``line`` is the
    row's index in the JSON list.
    """
    import datasets

    unknown = [kind for kind in data_types if kind not in ("image", "video")]
    if unknown or not data_types:
        raise SuzakError(f"video_r1: data_types are image and/or video, got {list(data_types)}")
    manifest = _manifest(data_root)
    root = manifest.parent
    entries = json.loads(manifest.read_text(encoding="utf-8"))
    rows, missing = video_r1_rows(entries, root, problem_types=tuple(problem_types), data_types=tuple(data_types),
                                  sources=tuple(sources) if sources else None, template=template)  # fmt: skip
    kinds = " or ".join(data_types)
    if missing:
        logger.warning("video_r1: %d %s rows left out: their file is not under %s (extract the media zips there)",
                       missing, kinds, root)  # fmt: skip
    if not rows:
        raise SuzakError(f"video_r1: no {kinds} rows of {list(problem_types)} with their file under {root}"
                         + (f" ({missing} rows name a missing file: extract the media zips there)" if missing else ""))  # fmt: skip
    rows = rows[:max_rows] if max_rows else rows
    columns = [c for c in ("image", "video") if any(c in row for row in rows)]
    dataset = datasets.Dataset.from_list([{c: None for c in columns} | row for row in rows])
    return dataset.cast_column("image", datasets.Image()) if "image" in columns else dataset
