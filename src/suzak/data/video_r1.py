"""Video-R1's RL set (``Video-R1/Video-R1-data`` on the Hub): its video questions as suzak video rows.

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
from suzak.prompts import DEFAULT_TEMPLATE, get_template

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

    from suzak.hub import offline_unless_reachable

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
                  template: str) -> tuple[list[dict], int]:  # fmt: skip
    """(rows, how many had no video file) from Video-R1 JSON entries: the video rows of ``problem_types``.

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
        if entry.get("data_type") != "video" or entry.get("problem_type") not in problem_types:
            continue
        if sources is not None and entry.get("data_source") not in sources:
            continue
        video = (root / str(entry["path"])).resolve()
        if not video.is_file():
            missing += 1
            continue
        question = str(entry["problem"]).strip()
        if entry.get("options"):
            question += "\nOptions:\n" + "\n".join(str(option) for option in entry["options"])
            question += "\nAnswer with the option's letter."  # Video-R1's instruction; word_match reads the letter
        found = _ANSWER.search(str(entry["solution"]))
        rows.append({
            "prompt": [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": render(question)}]}],
            "video": str(video), "solution": found.group(1) if found else str(entry["solution"]).strip(),
            "problem": question, "problem_type": entry["problem_type"], "line": line,
        })  # fmt: skip
    return rows, missing


def video_r1(data_root: str | None = None, *, problem_types: tuple[str, ...] | list[str] = ("multiple choice",),
             sources: tuple[str, ...] | list[str] | None = None, template: str = DEFAULT_TEMPLATE,
             max_rows: int | None = None):  # fmt: skip
    """Video-R1-260k's video questions: rows {prompt, video (a path), solution, problem, problem_type, line}.

    ``problem_types``: Video-R1's ``problem_type`` values to keep (``multiple choice``: the gold answer is a letter,
    scored by ``word_match``; ``numerical``: a number, ``math_accuracy``). ``sources``: its ``data_source`` values
    (e.g. ``[CLEVRER, STAR]``); all by default. ``line`` is the row's index in the JSON list.
    """
    import datasets

    manifest = _manifest(data_root)
    root = manifest.parent
    entries = json.loads(manifest.read_text(encoding="utf-8"))
    rows, missing = video_r1_rows(entries, root, problem_types=tuple(problem_types),
                                  sources=tuple(sources) if sources else None, template=template)  # fmt: skip
    if missing:
        logger.warning("video_r1: %d video rows left out: their file is not under %s (extract the media zips there)",
                       missing, root)  # fmt: skip
    if not rows:
        raise SuzakError(f"video_r1: no video rows of {list(problem_types)} with their file under {root}"
                         + (f" ({missing} rows name a missing video: extract the media zips there)" if missing else ""))  # fmt: skip
    return datasets.Dataset.from_list(rows[:max_rows] if max_rows else rows)
