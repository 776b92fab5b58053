"""Checkpoints that are complete or ignored: a completion marker, and ``latest_checkpoint`` that trusts only that.

transformers writes ``checkpoint-N/`` in place (weights, optimizer, scheduler, RNG, then ``trainer_state.json``), not
to a temporary folder that is renamed, so a process killed mid-save leaves a half-written folder. suzak adds a
marker once the Trainer has finished (``CheckpointMarkerCallback`` in :mod:`suzak.runs.streams`): ``.suzak-complete.json``
listing every file and its size. A folder is complete when

- it has the marker and every listed file exists with its listed size (a later truncation or a half-done deletion
  fails the check), or
- it has no marker and no ``.suzak-saving`` sentinel (a checkpoint from a plain Trainer run) and its
  ``trainer_state.json`` parses and weights exist: the Trainer writes the state last, so it only exists when the
  rest was written.

When a save is about to overwrite an existing ``checkpoint-N`` (a resumed run reaching the step of a half-written
folder), the marker is removed and the sentinel written first, so the old state file cannot vouch for new,
half-written weights. Incomplete folders are skipped with a warning and left in place: the run overwrites them when
it reaches their step again.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

__all__ = [
    "MARKER",
    "SENTINEL",
    "begin_overwrite",
    "checkpoint_problem",
    "checkpoint_step",
    "latest_checkpoint",
    "mark_complete",
]

logger = logging.getLogger(__name__)

MARKER = ".suzak-complete.json"
SENTINEL = ".suzak-saving"
_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "adapter_model.safetensors", "pytorch_model.bin")


def checkpoint_step(folder: Path) -> int | None:
    """N for a ``checkpoint-N`` folder name, else None."""
    prefix, _, step = folder.name.rpartition("-")
    return int(step) if prefix == "checkpoint" and step.isdigit() else None


def _files(folder: Path) -> dict[str, int]:
    """Relative path → size of every file under ``folder`` except the marker and sentinel."""
    sizes = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and path.name not in (MARKER, SENTINEL):
            sizes[path.relative_to(folder).as_posix()] = path.stat().st_size
    return sizes


def mark_complete(folder: str | Path, global_step: int | None = None) -> Path:
    """Write the marker (file list with sizes) into a fully written checkpoint and drop the sentinel."""
    folder = Path(folder)
    marker = folder / MARKER
    tmp = folder / (MARKER + ".tmp")
    tmp.write_text(json.dumps({"global_step": global_step, "files": _files(folder)}, indent=1) + "\n")
    os.replace(tmp, marker)  # the marker itself is never half-written
    (folder / SENTINEL).unlink(missing_ok=True)
    return marker


def begin_overwrite(folder: str | Path) -> None:
    """Before a save into an existing folder: drop its marker and leave the sentinel until the save completes."""
    folder = Path(folder)
    if folder.is_dir():
        (folder / SENTINEL).write_text("a save into this folder started and has not finished\n")
        (folder / MARKER).unlink(missing_ok=True)


def _marker_problem(folder: Path) -> str | None:
    try:
        listed = json.loads((folder / MARKER).read_text())["files"]
    except (OSError, ValueError, KeyError) as error:
        return f"unreadable completion marker ({type(error).__name__})"
    present = _files(folder)
    for name, size in listed.items():
        if name not in present:
            return f"{name} is missing"
        if present[name] != size:
            return f"{name} has {present[name]} bytes, {size} when the checkpoint was written"
    return None


def _unmarked_problem(folder: Path) -> str | None:
    try:
        json.loads((folder / "trainer_state.json").read_text())
    except OSError:
        return "no trainer_state.json"
    except ValueError:
        return "trainer_state.json is truncated"
    if not any((folder / w).is_file() for w in _WEIGHTS) and not any(folder.glob("global_step*")):
        return "no model weights"
    return None


def checkpoint_problem(folder: str | Path) -> str | None:
    """Why ``folder`` is not a complete checkpoint, or None when it is."""
    folder = Path(folder)
    if (folder / SENTINEL).exists():
        return "a save into it did not finish"
    if (folder / MARKER).exists():
        return _marker_problem(folder)
    return _unmarked_problem(folder)


def latest_checkpoint(output_dir: str | Path) -> str | None:
    """The newest complete ``checkpoint-N`` in ``output_dir``; incomplete ones are skipped with a warning, kept."""
    folders = [p for p in Path(output_dir).glob("checkpoint-*") if p.is_dir() and checkpoint_step(p) is not None]
    for folder in sorted(folders, key=checkpoint_step, reverse=True):
        problem = checkpoint_problem(folder)
        if problem is None:
            return str(folder)
        logger.warning("skipping incomplete checkpoint %s: %s", folder, problem)
    return None
