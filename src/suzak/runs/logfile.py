"""``OUTPUT_DIR/train.log``: the run's console log, kept next to its checkpoints.

The main process (rank 0) appends every log record the console shows (suzak's, TRL's and transformers' loggers,
which has its own handler and does not propagate to the root), each logged metrics dict (the line the Trainer prints
at every logging step), every Python warning the console prints (``warnings.warn``: transformers' and torch's
deprecations and hints, once each as Python shows them) and the one ``error:`` line (or the traceback) a failed run
ends with. Secret values are
masked in every line, tracebacks included (:func:`suzak.runs.redaction.redact`), like every other record a run writes. A resumed run appends to the same
file, under a header naming the launch.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from suzak.runs.redaction import redact, redact_argv

if TYPE_CHECKING:
    from transformers import TrainerCallback

__all__ = ["LOG_FILE", "TrainLog"]

LOG_FILE = "train.log"
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Records only the file gets (metrics lines, the error line): the console already shows them its own way.
FILE_ONLY = "suzak.train_log"


class _RedactingFormatter(logging.Formatter):
    """Masks secret values in the whole formatted record, traceback included (a filter sees the message only)."""

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


class TrainLog:
    """The handler that writes ``train.log``, attached to the console's loggers until :meth:`close`.

    >>> import tempfile; folder = Path(tempfile.mkdtemp())
    >>> log = TrainLog(folder, ["--max_steps", "2"]); logging.getLogger("suzak.demo").warning("hello"); log.close()
    >>> [line.split(" ", 2)[2] for line in (folder / LOG_FILE).read_text().splitlines()]
    ['INFO suzak.train_log: launch: --max_steps 2', 'WARNING suzak.demo: hello']
    """

    def __init__(self, output_dir: str | Path, argv: list[str] | None = None):
        self.path = Path(output_dir) / LOG_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.handler = logging.FileHandler(self.path, mode="a", encoding="utf-8")
        self.handler.setFormatter(_RedactingFormatter(FORMAT))
        self.loggers = [logging.getLogger(), logging.getLogger("transformers"), logging.getLogger(FILE_ONLY)]
        for logger in self.loggers:
            logger.addHandler(self.handler)
        self.file_only = logging.getLogger(FILE_ONLY)
        self.file_only.propagate = False  # the console shows these its own way (or not at all)
        self.file_only.setLevel(logging.INFO)
        self.file_only.info("launch: %s", " ".join(redact_argv(argv or [])))
        self._showwarning = warnings.showwarning  # the console still prints each warning as Python does
        warnings.showwarning = self._show_warning

    def _show_warning(self, message, category, filename, lineno, file=None, line=None) -> None:
        self._showwarning(message, category, filename, lineno, file, line)
        self.file_only.warning("%s: %s (%s:%d)", category.__name__, message, filename, lineno)

    def error(self, message: str) -> None:
        """The ``error: ...`` line the command is about to print and exit with."""
        self.file_only.error("error: %s", message)

    def crash(self) -> None:
        """The traceback of the exception being handled (the console shows it as Python prints it)."""
        self.file_only.error("the run stopped on an exception", exc_info=True)

    def callback(self, raw: bool = False) -> TrainerCallback:
        """A callback that writes each logged step (rank 0's) as one line: the console's readable line
        (:func:`suzak.runs.progress.step_line`), or with ``raw`` the Trainer's metrics dict."""
        from transformers import TrainerCallback  # the Trainer's stack (~4 s of imports): not for `suzak watch`

        from suzak.runs.steps import StepClock, step_line

        file_only, clock = self.file_only, StepClock()

        class MetricsLines(TrainerCallback):
            def on_log(self, args, state, control, logs=None, **kwargs):
                if state.is_world_process_zero and logs:
                    step = state.global_step
                    if raw:
                        file_only.info("step %d: %s", step, logs)
                    else:
                        file_only.info("%s", step_line(logs, step, state.max_steps, clock.tick(step)))

        return MetricsLines()

    def close(self) -> None:
        if warnings.showwarning == self._show_warning:
            warnings.showwarning = self._showwarning
        for logger in self.loggers:
            logger.removeHandler(self.handler)
        self.handler.close()
