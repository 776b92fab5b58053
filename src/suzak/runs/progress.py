"""A run's progress read back from its output dir while it trains (or after): what ``python -m suzak.watch`` shows
and the before/after line a run ends with.

Everything comes from the files a run writes anyway (:mod:`suzak.runs.streams`, :mod:`suzak.runs.record`,
:mod:`suzak.runs.logfile`): ``metrics.csv`` (one row per log call), the tail of ``completions.csv``, the target
``max_steps`` and the end marker from ``run_info.json`` (written by :func:`suzak.runs.record.finish_run`), and the
last lines of ``train.log``, which say when a run stopped on an error.
"""

from __future__ import annotations

import csv
import io
import math
import os
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from suzak import SuzakError
from suzak.runs.logfile import LOG_FILE
from suzak.runs.record import RUN_INFO_FILE, read_run_info
from suzak.runs.steps import eta_seconds

__all__ = ["CSVTail", "Progress", "before_after", "eta_seconds", "read_metrics", "read_progress", "seconds_per_step"]

METRICS_FILE = "metrics.csv"
COMPLETIONS_FILE = "completions.csv"
# train.log lines a failed run ends with (suzak.runs.logfile.TrainLog.error / .crash).
FAILURE_MARKERS = ("suzak.train_log: error: ", "suzak.train_log: the run stopped on an exception")


def _number(text) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) else value


def read_metrics(path: str | Path) -> list[dict[str, float | str]]:
    """Rows of ``metrics.csv``: numbers as floats, ``time`` as text, empty cells left out."""
    with Path(path).open(newline="", encoding="utf-8") as handle:
        rows = []
        for row in csv.DictReader(handle):
            parsed: dict[str, float | str] = {}
            for key, cell in row.items():
                if key == "time" and cell:
                    parsed[key] = cell
                elif key is not None and (value := _number(cell)) is not None:
                    parsed[key] = value
            if "step" in parsed:
                rows.append(parsed)
        return rows


class CSVTail:
    """The newest rows of a CSV file that grows by appends, read incrementally (a run's ``completions.csv`` reaches
    hundreds of MB): each :meth:`read` parses only the bytes added since the last, up to the last whole record (a
    quoted cell may hold newlines). A file replaced by a rewrite (new columns, a resume cutting rows) is read again
    from its start.
    """

    def __init__(self, path: str | Path, keep: int = 64):
        self.path = Path(path)
        self.keep = keep
        self.rows: list[dict[str, str]] = []
        self._header: list[str] | None = None
        self._offset = 0
        self._identity: tuple[int, int] | None = None

    def _restart(self) -> None:
        self.rows, self._header, self._offset = [], None, 0

    def read(self) -> list[dict[str, str]]:
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            self._restart()
            self._identity = None
            return self.rows
        identity = (stat.st_dev, stat.st_ino)
        if identity != self._identity or stat.st_size < self._offset:
            self._restart()
            self._identity = identity
        with self.path.open("rb") as handle:
            handle.seek(self._offset)
            data = handle.read()
        end = _last_record_end(data)
        if end == 0:
            return self.rows
        self._offset += end
        records = list(csv.reader(io.StringIO(data[:end].decode("utf-8", errors="replace"), newline="")))
        if self._header is None and records:
            self._header, records = records[0], records[1:]
        self.rows = (self.rows + [dict(zip(self._header or [], r, strict=False)) for r in records])[-self.keep :]
        return self.rows


def _last_record_end(data: bytes) -> int:
    """Length of the longest prefix of ``data`` that ends a CSV record: at a newline outside quotes.

    >>> _last_record_end(b'a,b\\n1,"x\\ny"\\n2,"z'), _last_record_end(b"half")
    (12, 0)
    """
    end, quoted = 0, False
    for i, byte in enumerate(data):
        if byte == 0x22:  # '"' (a doubled "" inside quotes flips twice: no change)
            quoted = not quoted
        elif byte == 0x0A and not quoted:
            end = i + 1
    return end


def seconds_per_step(rows: list[dict], window: int = 20) -> float | None:
    """Wall-clock seconds per optimizer step over the last ``window`` logged steps (evaluation and saving
    included, as the rest of the run will have them), from the ``time`` column; None before two timed steps.

    >>> rows = [{"step": s, "time": f"2026-01-01T00:00:{2 * s:02d}+00:00"} for s in range(1, 6)]
    >>> seconds_per_step(rows)
    2.0
    """
    timed = [(row["step"], datetime.fromisoformat(row["time"])) for row in rows if "time" in row and row["step"] > 0]
    timed = timed[-window:]
    if len(timed) < 2 or timed[-1][0] <= timed[0][0]:
        return None
    return (timed[-1][1] - timed[0][1]).total_seconds() / (timed[-1][0] - timed[0][0])


@dataclass
class Progress:
    """One look at a run: its metrics rows, the newest completions, how far it is, and whether it has ended."""

    output_dir: Path
    rows: list[dict] = field(default_factory=list)
    completions: list[dict[str, str]] = field(default_factory=list)
    max_steps: int | None = None
    status: str = "starting"  # starting | running | completed | failed
    detail: str = ""  # the error line of a failed run

    @property
    def step(self) -> int:
        return int(max((row["step"] for row in self.rows), default=0))

    @property
    def ended(self) -> bool:
        return self.status in ("completed", "failed")

    def series(self, column: str) -> list[tuple[int, float]]:
        """(step, value) of every row that logged ``column``."""
        return [(int(row["step"]), float(row[column])) for row in self.rows if column in row]

    def columns(self) -> list[str]:
        return list(dict.fromkeys(key for row in self.rows for key in row if key not in ("step", "time")))


def _status(output_dir: Path, info: dict) -> tuple[str, str]:
    """(status, detail) from run_info.json's newest launch and the end of train.log."""
    launches = info.get("launches") or []
    if not launches:
        return "starting", ""
    if launches[-1].get("end"):
        return launches[-1].get("status", "completed"), ""
    log = output_dir / LOG_FILE
    if log.is_file():
        with log.open("rb") as handle:
            handle.seek(max(log.stat().st_size - 4096, 0))
            tail = handle.read().decode("utf-8", errors="replace").splitlines()
        for line in reversed(tail[-20:]):
            if "suzak.train_log: launch: " in line:
                break  # a newer launch (a resume) started after any earlier failure
            if any(marker in line for marker in FAILURE_MARKERS):
                return "failed", line.split("suzak.train_log: ", 1)[1]
    return "running", ""


def read_progress(output_dir: str | Path, completions: CSVTail | None = None) -> Progress:
    """The run in ``output_dir`` as its files show it now; one line when it holds no run."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        raise SuzakError(f"{output_dir}: no such folder (give a run's output_dir)")
    metrics, run_info = output_dir / METRICS_FILE, output_dir / RUN_INFO_FILE
    if not metrics.is_file() and not run_info.is_file():
        raise SuzakError(f"{output_dir}: no {METRICS_FILE} or {RUN_INFO_FILE}: not a suzak run's output dir (yet)")
    info = read_run_info(output_dir)
    max_steps = (info.get("settings") or {}).get("max_steps")
    status, detail = _status(output_dir, info)
    tail = completions or CSVTail(output_dir / COMPLETIONS_FILE)
    progress = Progress(output_dir, read_metrics(metrics) if metrics.is_file() else [], tail.read(),
                        int(max_steps) if isinstance(max_steps, int | float) and max_steps > 0 else None,
                        status, detail)  # fmt: skip
    if progress.status == "starting" and progress.rows:
        progress.status = "running"
    return progress


def before_after(output_dir: str | Path) -> str | None:
    """One line: held-out accuracy (each ``eval/*accuracy*`` column: the generation eval's) and mean reward, at the
    start and at the end of the run; None when ``metrics.csv`` has neither.

    Training's own columns that name an accuracy (``rewards/gsm8k_accuracy/mean``, SFT's ``mean_token_accuracy``) are
    not held out, so they are not in the line. The reward is averaged over the first and the last 10 logged steps (one
    step's batch is noisy).
    """
    path = Path(output_dir) / METRICS_FILE
    if not path.is_file():
        return None
    progress = Progress(Path(output_dir), read_metrics(path))
    parts = []
    for column in sorted(c for c in progress.columns() if c.startswith("eval/") and "accuracy" in c.lower()):
        points = progress.series(column)
        if len(points) >= 2:
            (first_step, first), (last_step, last) = points[0], points[-1]
            parts.append(f"held-out {column} {first:.3f} at step {first_step} -> {last:.3f} at step {last_step}")
    rewards = progress.series("reward")
    if len(rewards) >= 2:
        head, tail = rewards[:10], rewards[-10:]
        parts.append(f"reward {_mean(head):.3f} (steps {head[0][0]}-{head[-1][0]}) -> {_mean(tail):.3f} "
                     f"(steps {tail[0][0]}-{tail[-1][0]})")  # fmt: skip
    return "; ".join(parts) or None


def _mean(points: list[tuple[int, float]]) -> float:
    return sum(value for _, value in points) / len(points)
