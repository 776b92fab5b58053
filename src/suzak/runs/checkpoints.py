"""Checkpoints that are complete or ignored: a completion marker, and ``latest_checkpoint`` that trusts only that.

suzak's trainers write ``checkpoint-N/`` into ``OUTPUT/.suzak-staging`` and rename it into place once every rank has
written its part (:class:`suzak.trl_internals.hooks.TrainerHooks`), so a process killed mid-save leaves no ``checkpoint-N``
at all. Then suzak adds a marker (``CheckpointMarkerCallback`` in :mod:`suzak.runs.streams`): ``.suzak-complete.json``
listing every file and its size, and the run's settings for the resume check (:func:`saved_settings`). A folder is
complete when it has no ``.suzak-saving`` sentinel (left by suzak versions that saved in place) and

- it has the marker and every listed file exists with its listed size (a later truncation or a half-done deletion
  fails the check), or it has no marker (a checkpoint from a plain Trainer run) and ``trainer_state.json`` exists:
  the Trainer writes the state last, so it only exists when the rest was written; and
- its contents read, since sizes prove nothing about garbage of the right size: ``trainer_state.json`` parses to a
  JSON object, every safetensors file's header reads and its tensors fit the file, every shard a
  ``*.safetensors.index.json`` lists is there, and every torch file (optimizer, scheduler, RNG state, DeepSpeed
  shards) is a whole zip archive. None of this reads the tensors themselves: checking a 7B checkpoint takes
  milliseconds.

Incomplete folders (a plain Trainer's, a copy cut short) are skipped with a warning and left in place.
:func:`resume_checkpoint` turns ``--resume_from_checkpoint`` into a checkpoint that passes these checks, or one line
saying why there is none.

A disk that fills up mid-save leaves the earlier checkpoints as they were (the Trainer deletes old checkpoints,
``save_total_limit``, only after a save completes) and the partial one is removed; :func:`write_failure` says so in
one line, with the free space and about how much was needed.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import zipfile
from pathlib import Path

from suzak import SuzakError

__all__ = [
    "MARKER",
    "SENTINEL",
    "checkpoint_folders",
    "checkpoint_problem",
    "checkpoint_step",
    "folder_bytes",
    "latest_checkpoint",
    "mark_complete",
    "resume_checkpoint",
    "saved_settings",
    "write_failure",
]

logger = logging.getLogger(__name__)

MARKER = ".suzak-complete.json"
SENTINEL = ".suzak-saving"
_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "adapter_model.safetensors", "pytorch_model.bin")
_TORCH_FILES = ("*.pt", "*.pth", "*.bin")  # torch.save writes zip archives (optimizer, scheduler, RNG, args, ZeRO)


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


def mark_complete(folder: str | Path, global_step: int | None = None, settings: dict | None = None) -> Path:
    """Write the marker (file list with sizes, and the run's ``settings`` for the resume check) into a fully written
    checkpoint and drop the sentinel."""
    folder = Path(folder)
    marker = folder / MARKER
    tmp = folder / (MARKER + ".tmp")
    content = {"global_step": global_step, "files": _files(folder), "settings": settings}
    tmp.write_text(json.dumps(content, indent=1) + "\n")
    os.replace(tmp, marker)  # the marker itself is never half-written
    (folder / SENTINEL).unlink(missing_ok=True)
    return marker


def saved_settings(folder: str | Path) -> dict | None:
    """The run settings a checkpoint's marker recorded, or None (no marker, or one from before settings were kept)."""
    try:
        settings = json.loads((Path(folder) / MARKER).read_text()).get("settings")
    except (OSError, ValueError, AttributeError):
        return None
    return settings if isinstance(settings, dict) else None


def folder_bytes(folder: str | Path, pattern: str = "*") -> int:
    """Bytes of the files under ``folder`` whose names match ``pattern``."""
    return sum(p.stat().st_size for p in Path(folder).rglob(pattern) if p.is_file())


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


def _json_problem(path: Path, name: str) -> str | None:
    """Why ``path`` is not a readable JSON object, or None."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return f"no {name}"
    except OSError as error:
        return f"{name} cannot be read ({error.strerror})"
    except UnicodeDecodeError:
        return f"{name} is truncated or corrupt (not UTF-8 text)"
    except json.JSONDecodeError as error:
        return f"{name} is truncated or corrupt ({error.msg} at line {error.lineno} column {error.colno})"
    return None if isinstance(value, dict) else f"{name} is truncated or corrupt (not a JSON object)"


def _safetensors_problem(path: Path, name: str) -> str | None:
    """Why a safetensors file's header does not read (or its tensors do not fit the file), or None. Reads the header
    only: the library checks every tensor's byte range against the file's size."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(path, framework="pt"):
            return None
    except (SafetensorError, OSError) as error:
        return f"{name} is corrupt ({' '.join(str(error).split())})"


def _shards_problem(folder: Path, index: Path) -> str | None:
    """Why the shards a ``*.safetensors.index.json`` lists are not all there, or None."""
    name = index.relative_to(folder).as_posix()
    problem = _json_problem(index, name)
    if problem is not None:
        return problem
    weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map")
    if not isinstance(weight_map, dict):
        return f"{name} is corrupt (no weight_map)"
    for shard in sorted(set(weight_map.values())):
        if not (index.parent / shard).is_file():
            return f"{shard}, listed in {name}, is missing"
    return None


def _weights_problem(folder: Path) -> str | None:
    """Why the weights and torch files do not read, or None."""
    if not any((folder / w).is_file() for w in _WEIGHTS) and not any(folder.glob("global_step*")):
        return "no model weights"
    for index in sorted(folder.glob("*.safetensors.index.json")):
        if problem := _shards_problem(folder, index):
            return problem
    for path in sorted(folder.glob("*.safetensors")):
        if problem := _safetensors_problem(path, path.name):
            return problem
    for path in sorted(p for pattern in _TORCH_FILES for p in folder.rglob(pattern) if p.is_file()):
        if not zipfile.is_zipfile(path):
            return f"{path.relative_to(folder).as_posix()} is truncated or corrupt (not a whole torch archive)"
    return None


def checkpoint_problem(folder: str | Path) -> str | None:
    """Why ``folder`` is not a complete checkpoint, or None when it is."""
    folder = Path(folder)
    if (folder / SENTINEL).exists():
        return "a save into it did not finish"
    if (folder / MARKER).exists() and (problem := _marker_problem(folder)):
        return problem
    return _json_problem(folder / "trainer_state.json", "trainer_state.json") or _weights_problem(folder)


def checkpoint_folders(output_dir: str | Path) -> list[Path]:
    """Every ``checkpoint-N`` folder in ``output_dir``, newest first, complete or not."""
    folders = [p for p in Path(output_dir).glob("checkpoint-*") if p.is_dir() and checkpoint_step(p) is not None]
    return sorted(folders, key=checkpoint_step, reverse=True)


def latest_checkpoint(output_dir: str | Path, warn: bool = True) -> str | None:
    """The newest complete ``checkpoint-N`` in ``output_dir``; incomplete ones are skipped with a warning, kept."""
    for folder in checkpoint_folders(output_dir):
        problem = checkpoint_problem(folder)
        if problem is None:
            return str(folder)
        if warn:
            logger.warning("skipping incomplete checkpoint %s: %s", folder, problem)
    return None


def resume_checkpoint(value: str | None, output_dir: str | Path) -> str | None:
    """The checkpoint ``--resume_from_checkpoint value`` resumes from, checked; None to start fresh.

    ``latest``/``last``: the newest complete checkpoint in ``output_dir`` (damaged newer ones skipped with a
    warning), None when there is no checkpoint folder at all, and an error when there are some but none is usable:
    a silent fresh start would train from step 0 into the folder of a run the user meant to continue. A path: that
    folder, or an error naming what is wrong with it.
    """
    if not value:
        return None
    if value not in ("latest", "last"):
        if not Path(value).is_dir():
            raise SuzakError(f"resume_from_checkpoint {value}: no such checkpoint folder (`latest` resumes from the "
                             "newest complete checkpoint in output_dir)")  # fmt: skip
        if problem := checkpoint_problem(value):
            raise SuzakError(f"resume_from_checkpoint {value} cannot be resumed: {problem}")
        return str(value)
    found = latest_checkpoint(output_dir)
    folders = checkpoint_folders(output_dir)
    if found is None and folders:
        raise SuzakError(f"resume_from_checkpoint=latest: none of the {len(folders)} checkpoint folder(s) in "
                         f"{output_dir} is usable (newest, {folders[0].name}: {checkpoint_problem(folders[0])}); "
                         "resume from an intact copy with --resume_from_checkpoint PATH, or move them away to start "
                         "afresh")  # fmt: skip
    if found is None:
        logger.warning("resume_from_checkpoint=latest: no checkpoint in %s, starting fresh", output_dir)
    else:
        logger.info("resuming from %s", found)
    return found


# How a full disk shows: an errno on OSError; safetensors' Rust writer and others keep only the text.
_DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_DISK_FULL_TEXT = ("No space left on device", "Disk quota exceeded", "StorageFull", "QuotaExceeded")
# torch.save's zip writer reports a failed write (a full disk above all) as a RuntimeError with no errno, worded
# differently across versions ("file write failed", "unexpected pos …", "iostream error").
_TORCH_WRITER_TEXT = ("inline_container.cc", "PytorchStreamWriter", "file write failed")
_NEARLY_FULL = 100 * 2**20  # bytes free below which a failed write is taken for a full disk


def _chain(error: BaseException) -> list[BaseException]:
    found: list[BaseException] = []
    while error is not None and error not in found:
        found.append(error)
        error = error.__cause__ or error.__context__
    return found


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def _free_bytes(path: str | Path) -> int | None:
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def _failed_write(error: BaseException, saving: bool, free: int | None) -> tuple[bool, str] | None:
    """(disk full?, reason) when ``error`` is a failed write; None for anything else (a bug keeps its traceback)."""
    for cause in _chain(error):
        if isinstance(cause, OSError) and cause.errno in _DISK_FULL_ERRNOS:
            return True, os.strerror(cause.errno)
        if any(text in str(cause) for text in _DISK_FULL_TEXT):
            return True, _first_line(cause)
    if not saving:
        return None
    for cause in _chain(error):  # while a checkpoint is written, an I/O error is the machine's, not a bug
        if isinstance(cause, OSError) or type(cause).__name__ == "SafetensorError" or \
                any(text in str(cause) for text in _TORCH_WRITER_TEXT):  # fmt: skip
            reason = cause.strerror if isinstance(cause, OSError) and cause.strerror else _first_line(cause)
            if any(text in str(cause) for text in _TORCH_WRITER_TEXT):
                reason = (
                    f"torch.save could not write the whole file, as on a full disk or past a file size limit: {reason}"
                )
            return free is not None and free < _NEARLY_FULL, reason
    return None


def _size(count: int) -> str:
    """A byte count as MB or GB, as the failure line says it.

    >>> _size(2_500_000), _size(64_000_000_000)
    ('2.5 MB', '64.0 GB')
    """
    return f"{count / 1e9:.1f} GB" if count >= 1e9 else f"{count / 1e6:.1f} MB"


def write_failure(error: BaseException, saving: str | Path | None, output_dir: str | Path) -> str | None:
    """One line for a run stopped by a failed write (a full disk above all), or None when ``error`` is not one.

    ``saving`` is the checkpoint folder being written when it failed (``output_dir`` itself: the final model; None:
    between saves). The line names it, the free space, about how much the write needed (the newest complete
    checkpoint's size, or its weights' for the final model) and that checkpoint, checked again here, which the failed
    save left as it was.
    """
    free = _free_bytes(output_dir)
    failed = _failed_write(error, saving is not None, free)
    if failed is None:
        return None
    disk_full, reason = failed
    final = saving is not None and Path(saving) == Path(output_dir)
    what = "saving the final model to" if final else "saving" if saving is not None else "writing to"
    what = f"{what} {saving if saving is not None else output_dir}"
    space = f"; {_size(free)} free" if free is not None else ""
    fix = "free space (or lower save_total_limit)" if disk_full else "fix the cause"
    intact = latest_checkpoint(output_dir, warn=False)
    if intact and saving is not None:  # what the failed write needed, judged by the newest whole checkpoint
        needed = folder_bytes(intact, "*.safetensors") if final else folder_bytes(intact)
        space += f", about {_size(needed)} needed ({'its weights in ' if final else 'as '}{Path(intact).name})"
    if intact:
        after = f"{intact} is the newest complete checkpoint and is intact (the partial write was removed); {fix}, " \
                "then rerun with --resume_from_checkpoint latest"  # fmt: skip
    else:
        after = f"no checkpoint was complete yet; {fix} and run again"
    return f"{'disk full' if disk_full else 'a write failed'} while {what} ({reason}{space}): {after}"
