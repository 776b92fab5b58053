"""What every run writes to its output dir as it trains, whatever ``report_to`` says.

- ``metrics.csv``: one row per ``Trainer.log`` call (each logging step, plus the end-of-training summary), every
  logged scalar, appended and flushed as it is logged.
- ``completions.csv``: one row per completion of every training generation batch (step, prompt text, image
  reference, completion, each reward, the weighted total, the advantage, and the columns rewards add through TRL's
  ``log_extra``), appended as soon as the batch is scored. ``step`` is the optimizer step the batch trains
  (``global_step + 1`` when it is generated), so it lines up with that step's row in ``metrics.csv``.
- ``checkpoint-N/.suzak-complete.json``: the completion marker of :mod:`suzak.runs.checkpoints`.

A process killed at any point loses nothing already written. When a run resumes from ``checkpoint-N``, rows past
step N (logged by the run that died, and about to be produced again) are dropped, so each file holds one history.
"""

from __future__ import annotations

import csv
import hashlib
import logging
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from PIL import Image
from transformers import TrainerCallback

from suzak.media.vision import images_of
from suzak.runs.checkpoints import mark_complete

__all__ = [
    "CSVStream",
    "CheckpointMarkerCallback",
    "CompletionsCSVCallback",
    "MetricsCSVCallback",
    "ROW_ID_COLUMNS",
    "add_run_callbacks",
    "image_reference",
    "row_id",
]

logger = logging.getLogger(__name__)

# Row columns that name a dataset row (and its image, better than a hash of the pixels), in order of preference.
ROW_ID_COLUMNS = ("image_path", "image_id", "index", "line", "id")


class CSVStream:
    """A CSV file that grows a row at a time, flushed on every write; a row with new columns rewrites the header.

    >>> import tempfile; path = Path(tempfile.mkdtemp()) / "m.csv"
    >>> stream = CSVStream(path); stream.append([{"step": 1, "loss": 0.5}]); stream.append([{"step": 2, "kl": 0.1}])
    >>> print(path.read_text().strip())
    step,loss,kl
    1,0.5,
    2,,0.1
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.columns: list[str] = self._read()[0] if self.path.is_file() else []

    def _read(self) -> tuple[list[str], list[dict[str, str]]]:
        with self.path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            rows = list(reader)
            return list(reader.fieldnames or []), rows

    def _rewrite(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Replace the file in one step (a crash mid-rewrite leaves the old file, never a truncated one)."""
        tmp = self.path.with_name(self.path.name + ".tmp")
        with tmp.open("w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, self.columns, restval="", extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
        os.replace(tmp, self.path)

    def append(self, rows: Sequence[Mapping[str, Any]]) -> None:
        new = [key for key in dict.fromkeys(k for row in rows for k in row) if key not in self.columns]
        if new or not self.path.is_file():
            old_rows = self._read()[1] if self.path.is_file() else []
            self.columns += new
            self._rewrite(old_rows)
        with self.path.open("a", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, self.columns, restval="", extrasaction="ignore")
            writer.writerows(rows)
            handle.flush()

    def drop_after(self, step: int) -> int:
        """Remove rows whose ``step`` is greater than ``step``; returns how many were removed."""
        if not self.path.is_file():
            return 0
        columns, rows = self._read()
        kept = [row for row in rows if not _after(row.get("step"), step)]
        if len(kept) < len(rows):
            self.columns = columns
            self._rewrite(kept)
        return len(rows) - len(kept)


def _after(value: str | None, step: int) -> bool:
    try:
        return int(float(value)) > step
    except (TypeError, ValueError):
        return False


def _scalar(value: Any) -> float | int | str | None:
    """A CSV cell for a logged value: numbers as they are, None/NaN empty; anything else is not a scalar (None)."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int | float):
        return "" if isinstance(value, float) and math.isnan(value) else value
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:  # 0-d tensors / numpy scalars
        return _scalar(value.item())
    return "" if value is None else None


class _StreamCallback(TrainerCallback):
    """A CSV stream in the output dir, written by the main process, cut back to the resumed step at train start."""

    filename = ""

    def __init__(self, output_dir: str | Path):
        self.stream = CSVStream(Path(output_dir) / self.filename)

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            Path(args.output_dir).mkdir(parents=True, exist_ok=True)
            dropped = self.stream.drop_after(state.global_step)
            if dropped:
                logger.info("%s: dropped %d row(s) past step %d (the run resumes from there)",
                            self.stream.path, dropped, state.global_step)  # fmt: skip


class MetricsCSVCallback(_StreamCallback):
    """``metrics.csv``: a row per log call with ``step``, ``time`` (UTC, ISO) and every scalar logged."""

    filename = "metrics.csv"

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        row: dict[str, Any] = {"step": state.global_step, "time": datetime.now(UTC).isoformat(timespec="seconds")}
        for key, value in logs.items():
            cell = _scalar(value)
            if cell is not None:
                row[key] = cell
        self.stream.append([row])


class CompletionsCSVCallback(_StreamCallback):
    """``completions.csv``; :class:`suzak.training.trainer.VLMGRPOTrainer` calls :meth:`write` after each scored batch."""

    filename = "completions.csv"

    def write(self, rows: list[dict[str, Any]]) -> None:
        self.stream.append(rows)


class CheckpointMarkerCallback(TrainerCallback):
    """Marks each checkpoint complete once the Trainer has written all of it (see :mod:`suzak.runs.checkpoints`).

    ``saving`` is the checkpoint folder being written, None between saves: a run that fails while saving names it.
    ``settings`` (:func:`suzak.runs.faults.state_settings`) go into each marker, for the resume check.
    """

    def __init__(self, settings: dict | None = None):
        self.saving: Path | str | None = None
        self.settings = settings

    def _folder(self, args, state) -> Path:
        return Path(args.output_dir) / f"checkpoint-{state.global_step}"

    def _before_save(self, args, state, control) -> None:
        if not control.should_save:
            return
        self.saving = self._folder(args, state)

    def on_step_end(self, args, state, control, **kwargs):
        self._before_save(args, state, control)

    def on_epoch_end(self, args, state, control, **kwargs):
        self._before_save(args, state, control)

    def on_save(self, args, state, control, **kwargs):
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.barrier()  # every rank has written its shards
        folder = self._folder(args, state)
        if state.is_world_process_zero and folder.is_dir():
            mark_complete(folder, state.global_step, settings=self.settings)
        self.saving = None


def add_run_callbacks(trainer, settings: dict | None = None) -> CheckpointMarkerCallback:
    """The CSV streams and checkpoint markers on a trainer (call on every rank); returns the marker callback.

    ``completions.csv`` needs :class:`suzak.training.trainer.VLMGRPOTrainer`'s ``completion_listeners``; other trainers (SFT)
    get ``metrics.csv`` and the markers.
    """
    output_dir = trainer.args.output_dir
    markers = CheckpointMarkerCallback(settings)
    trainer.add_callback(MetricsCSVCallback(output_dir))
    trainer.add_callback(markers)
    if hasattr(trainer, "completion_listeners"):
        completions = CompletionsCSVCallback(output_dir)
        trainer.add_callback(completions)
        trainer.completion_listeners.append(completions.write)
    return markers


# --- image references ---------------------------------------------------------------------------------------------


def _image_hash(image: Image.Image) -> str:
    digest = hashlib.sha1(f"{image.mode}{image.size}".encode())
    digest.update(image.tobytes())
    return "sha1:" + digest.hexdigest()[:12]


def image_reference(row: Mapping[str, Any]) -> str:
    """How a completion row names its image: a path or id column of the dataset row, else hashes of the pixels.

    >>> image_reference({"image_path": "./images/superCLEVR_new_025000.png"}), image_reference({"index": 7})
    ('./images/superCLEVR_new_025000.png', 'index:7')
    >>> image_reference({"image": Image.new("RGB", (2, 2))}), image_reference({"problem": "text only"})
    ('sha1:6a2aac554758', '')
    """
    found = row_id(row)
    if found is not None:
        column, value = found
        return str(value) if column == "image_path" else f"{column}:{value}"
    return ";".join(_image_hash(img) for img in images_of(row))


def row_id(row: Mapping[str, Any]) -> tuple[str, Any] | None:
    """The first of :data:`ROW_ID_COLUMNS` a row has a value in, as (column, value); None when it has none.

    >>> row_id({"line": 14, "problem": "..."}), row_id({"problem": "..."})
    (('line', 14), None)
    """
    for column in ROW_ID_COLUMNS:
        value = row.get(column)
        if value is not None and value != "":
            return column, value
    return None
