"""Faults during a run, and what the run does about each (docs/reliability.md has the table):

- :class:`StopOnSignal`: preemption. SIGTERM or SIGUSR1 (``stop_signals``) lets the current optimizer step finish
  on every rank, has the Trainer write a complete checkpoint, and ends the run with :class:`Preempted`: one line with
  the resume command, exit code :data:`EXIT_PREEMPTED` (75), and ``OUTPUT/preempted.json`` for scripts (the SLURM
  example requeues itself on it).
- :class:`RankWatch`: several processes. A rank that raises leaves its one-line error in ``OUTPUT/.suzak-ranks``;
  every other rank sees it within seconds and exits with one line naming it, instead of waiting in a collective for
  NCCL's 30-minute timeout. A rank that dies without a word (SIGKILL, the OOM killer, a lost machine) stops
  refreshing its heartbeat there and is named after ``rank_failure_timeout`` seconds.
- :class:`CheckpointMirror`: every complete checkpoint copied, in the background, to a second folder or to a Hub
  repository (``checkpoint_mirror``), for machines whose disks go with them. Training waits for no copy: the
  checkpoint's files are hard-linked into a snapshot in one pass (or copied when links are not possible), then copied
  from the snapshot by a thread. A failed copy is a warning and a count, never a stop.
- :func:`state_settings` / :func:`changed_settings`: the settings that give a checkpoint's state its meaning, saved in
  each checkpoint's completion marker and compared when a run resumes from it (``resume_override`` goes on).
"""

from __future__ import annotations

import json
import logging
import os
import queue
import shlex
import shutil
import signal
import socket
import sys
import threading
import time
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from suzak import SuzakError
from suzak.runs.redaction import redact_argv

__all__ = [
    "EXIT_PREEMPTED",
    "PREEMPTED_FILE",
    "CheckpointMirror",
    "Preempted",
    "RankWatch",
    "StopOnSignal",
    "changed_settings",
    "resume_command",
    "state_settings",
]

logger = logging.getLogger(__name__)

EXIT_PREEMPTED = 75  # EX_TEMPFAIL: stopped on request after a complete checkpoint; resuming continues the run
PREEMPTED_FILE = "preempted.json"


class Preempted(SuzakError):
    """The run stopped on a signal after writing a complete checkpoint (exit :data:`EXIT_PREEMPTED`)."""


def resume_command(module: str, argv: list[str]) -> str:
    """The command that resumes this run: the launch script's command line when one started it (``SUZAK_LAUNCH``),
    else ``python -m MODULE ARGV``, with ``--resume_from_checkpoint latest`` in place of any resume flag given;
    secrets masked."""
    launch = os.environ.get("SUZAK_LAUNCH")
    words = shlex.split(launch) if launch else ["python", "-m", module, *argv]
    kept, skip = [], False
    for word in words:
        if skip:
            skip = False
        elif word == "--resume_from_checkpoint":
            skip = True
        elif not word.startswith("--resume_from_checkpoint="):
            kept.append(word)
    return shlex.join(redact_argv([*kept, "--resume_from_checkpoint", "latest"]))


class StopOnSignal(TrainerCallback):
    """Stop after the current optimizer step, with a checkpoint, when one of ``signals`` arrives.

    The handler only records the signal (a second one is ignored: SLURM and torchrun may both deliver it). At each
    step's end the ranks agree (one all-reduce of one number) so that every rank saves and stops at the same step.
    Handlers are installed for the training loop only, in the main thread, and the previous ones restored after.
    """

    def __init__(self, signals: list[str]):
        self.signals = [getattr(signal, name) for name in signals]
        self.received: str | None = None
        self.stopped_at: int | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum, frame) -> None:
        if self.received is None:
            self.received = signal.Signals(signum).name
            logger.warning("%s received: finishing this optimizer step, then saving a checkpoint and stopping",
                           self.received)  # fmt: skip

    def on_train_begin(self, args, state, control, **kwargs):
        if threading.current_thread() is not threading.main_thread():
            logger.warning("stop_signals: training runs outside the main thread, signals cannot be caught")
            return
        for signum in self.signals:
            self._previous[signum] = signal.signal(signum, self._handle)

    def on_train_end(self, args, state, control, **kwargs):
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()

    def _agreed(self, args) -> bool:
        import torch
        import torch.distributed as dist

        flag = self.received is not None
        if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
            return flag
        value = torch.tensor([float(flag)], device=args.device)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return bool(value.item())

    def on_step_end(self, args, state, control, **kwargs):
        if self._previous and self._agreed(args):
            control.should_save = True
            control.should_training_stop = True
            self.stopped_at = state.global_step
            self.received = self.received or "a stop signal (on another rank)"


def state_settings(parsed: tuple) -> dict[str, Any]:
    """The settings that give a checkpoint's state its meaning, with the values this run uses: a resume that changes
    one of them continues a different run (:func:`changed_settings`). ``max_steps``/``num_train_epochs`` count unless
    the learning rate is constant (they set the schedule's length). A mixture's ``datasets`` count by what decides
    each source's rows and their order (:meth:`suzak.data.mixture.Source.rows_settings`: name, dataset, options,
    weight, template, held-out rows), not by its rewards."""
    from suzak.runs.record import plain_value

    names = ["model_name_or_path", "dataset_name", "dataset_options", "max_train_rows", "prompt_template",
             "per_device_train_batch_size", "gradient_accumulation_steps", "num_generations", "generation_batch_size",
             "steps_per_generation", "learning_rate", "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_steps",
             "warmup_ratio", "max_steps", "num_train_epochs", "use_peft", "lora_r", "lora_alpha",
             "lora_target_modules", "lora_target_parameters", "load_in_4bit", "load_in_8bit", "bnb_4bit_quant_type",
             "opening_in_completion", "seed"]  # fmt: skip
    found: dict[str, Any] = {}
    for args in parsed:
        if is_dataclass(args):
            own = {f.name for f in fields(args)}
            found |= {name: plain_value(getattr(args, name)) for name in names if name in own and name not in found}
        if callable(getattr(args, "mixture", None)) and (sources := args.mixture()):
            found["datasets"] = plain_value([source.rows_settings(args.eval_rows) for source in sources])
    if (found.get("max_steps") or 0) > 0:
        found.pop("num_train_epochs", None)  # max_steps decides the length
    if found.get("lr_scheduler_type") == "constant":
        found.pop("max_steps", None), found.pop("num_train_epochs", None)
    found["world_size"] = int(os.environ.get("WORLD_SIZE", "1"))  # the data each rank reads
    return found


def changed_settings(saved: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """``name: old -> new`` for each setting the checkpoint recorded that this run changes; in a list of mappings of
    the same length (a mixture's sources), each entry's key that changes (``datasets[0].weight: 3.0 -> 1.0``).

    >>> changed_settings({"datasets": [{"name": "a", "weight": 3.0}], "seed": 0},
    ...                  {"datasets": [{"name": "a", "weight": 1.0}], "seed": 0, "world_size": 1})
    ['datasets[0].weight: 3.0 -> 1.0']
    """
    return [line for name in now if name in saved for line in _differences(name, saved[name], now[name])]


def _differences(name: str, old: Any, new: Any) -> list[str]:
    entries = isinstance(old, list) and isinstance(new, list) and len(old) == len(new)
    if entries and all(isinstance(item, dict) for item in old + new):
        return [line for i, (a, b) in enumerate(zip(old, new, strict=True)) for key in dict.fromkeys([*a, *b])
                for line in _differences(f"{name}[{i}].{key}", a.get(key), b.get(key))]  # fmt: skip
    if json.dumps(old, sort_keys=True) == json.dumps(new, sort_keys=True):
        return []
    return [f"{name}: {old!r} -> {new!r}"]


# --- several processes ----------------------------------------------------------------------------------------------

RANKS_FOLDER = ".suzak-ranks"


class RankWatch:
    """Heartbeats and failure notes of every rank in ``OUTPUT/.suzak-ranks``, watched by a thread on every rank.

    Each rank refreshes ``rank-R.alive`` every few seconds; a rank that raises writes ``rank-R.failed`` (one line) and
    a rank that finishes writes ``rank-R.done``. A rank that sees another's failure, or a heartbeat older than
    ``timeout`` seconds, prints one line naming it and exits (code 1) at once: a collective with a dead rank never
    returns. :meth:`start` runs on every rank after a barrier, so each heartbeat is this launch's.
    """

    def __init__(self, output_dir: str | Path, rank: int, world_size: int, timeout: float):
        self.folder = Path(output_dir) / RANKS_FOLDER
        self.rank, self.world_size, self.timeout = rank, world_size, timeout
        self.period = max(0.5, min(5.0, timeout / 6))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _path(self, rank: int, kind: str) -> Path:
        return self.folder / f"rank-{rank}.{kind}"

    def prepare(self) -> None:
        """This rank's notes from an earlier launch removed, a fresh heartbeat written. Notes older than this moment
        are another launch's; a rank not heard from since is silent once ``timeout`` has passed."""
        self.started = time.time()
        self.folder.mkdir(parents=True, exist_ok=True)
        for kind in ("failed", "done"):
            self._path(self.rank, kind).unlink(missing_ok=True)
        self._beat()

    def _beat(self) -> None:
        self._path(self.rank, "alive").write_text(f"{socket.gethostname()} pid {os.getpid()}\n")

    def start(self) -> None:
        self._thread = threading.Thread(target=self._watch, name="suzak-rank-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """This rank finished: say so (its heartbeat stops) and stop watching."""
        self._stop.set()
        self._path(self.rank, "done").write_text("done\n")

    def failed(self, error: str) -> None:
        """This rank raised: leave the one line for the others."""
        self._stop.set()
        try:
            self._path(self.rank, "failed").write_text(error + "\n")
        except OSError as problem:  # the others then find this rank by its silence, after the timeout
            logger.warning("rank watch: could not leave this rank's failure note (%s)", problem)

    def first_failure(self) -> tuple[int, str] | None:
        """(rank, line) of another rank's failure note, the earliest written, or None."""
        notes = [
            (p.stat().st_mtime, p) for p in self.folder.glob("rank-*.failed") if p != self._path(self.rank, "failed")
        ]
        for _, note in sorted(n for n in notes if n[0] >= self.started - 1):
            try:
                return int(note.name.split(".")[0].split("-")[1]), note.read_text().strip()
            except (OSError, ValueError):
                continue
        return None

    def _silent(self) -> tuple[int, float] | None:
        now = time.time()
        for rank in range(self.world_size):
            if rank == self.rank or self._fresh(self._path(rank, "done")):
                continue
            try:
                age = now - max(self._path(rank, "alive").stat().st_mtime, self.started)
            except OSError:
                age = now - self.started
            if age > self.timeout:
                return rank, age
        return None

    def _fresh(self, path: Path) -> bool:
        try:
            return path.stat().st_mtime >= self.started - 1
        except OSError:
            return False

    def _watch(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self._beat()
                failure = self.first_failure()
                if failure is not None and not self._stop.wait(5.0):  # an error every rank raises at once stops
                    self._exit(f"rank {failure[0]} failed: {failure[1]}")  # this rank itself within the grace
                silent = self._silent()
                if silent is not None:
                    self._exit(f"rank {silent[0]} has been silent for {silent[1]:.0f} s (rank_failure_timeout "
                               f"{self.timeout:g}): it was killed or its machine is gone")  # fmt: skip
            except OSError as error:  # the output dir went away: nothing to watch with
                logger.warning("rank watch stopped: %s", error)
                return

    def exit_if_another_failed(self) -> None:
        """When this rank raises after another rank failed (its collective broke), name the first failure instead."""
        failure = self.first_failure()
        if failure is not None:
            self._stop.clear()
            self._exit(f"rank {failure[0]} failed: {failure[1]}")

    def _exit(self, why: str) -> None:
        if self._stop.is_set():
            return
        print(f"error: {why}; rank {self.rank} stops too (the newest complete checkpoint holds every step saved; "
              "fix the cause, then rerun with --resume_from_checkpoint latest)", file=sys.stderr, flush=True)  # fmt: skip
        logging.shutdown()
        os._exit(1)


# --- off-site copies ------------------------------------------------------------------------------------------------


class CheckpointMirror(TrainerCallback):
    """Copy each complete checkpoint to ``target``, a folder or ``hf://USER/REPO``, in a background thread.

    Runs on the main process, after the completion marker (add it after :class:`~suzak.runs.streams.
    CheckpointMarkerCallback`). A folder target gets ``checkpoint-N.partial`` renamed to ``checkpoint-N`` once whole
    (an older copy of the same step is replaced), so a half-done copy is never taken for a checkpoint there either.
    """

    def __init__(self, target: str, output_dir: str | Path, token: str | None = None):
        self.target = target
        self.snapshots = Path(output_dir) / ".suzak-mirror"
        self.token = token
        self.copied = 0
        self.failures = 0
        self._queue: queue.Queue[Path | None] = queue.Queue()
        self._thread = threading.Thread(target=self._work, name="suzak-mirror", daemon=True)
        self._thread.start()

    def on_save(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if folder.is_dir():
            try:
                self._queue.put(self._snapshot(folder))
            except OSError as error:
                self._failed(folder.name, error)

    def _snapshot(self, folder: Path) -> Path:
        """The checkpoint's files, hard-linked (copied where links are refused) into a folder rotation cannot touch."""
        snapshot = self.snapshots / folder.name
        shutil.rmtree(snapshot, ignore_errors=True)

        def link(source, destination):
            try:
                os.link(source, destination)
            except OSError:
                shutil.copy2(source, destination)

        shutil.copytree(folder, snapshot, copy_function=link)
        return snapshot

    def _work(self) -> None:
        while (snapshot := self._queue.get()) is not None:
            try:
                start = time.monotonic()
                self._copy(snapshot)
                self.copied += 1
                logger.info("checkpoint_mirror: %s copied to %s in %.1f s", snapshot.name, self.target,
                            time.monotonic() - start)  # fmt: skip
            except Exception as error:  # noqa: BLE001 - a failed copy must never stop training: said and counted
                self._failed(snapshot.name, error)
            finally:
                shutil.rmtree(snapshot, ignore_errors=True)
                self._queue.task_done()

    def _copy(self, snapshot: Path) -> None:
        if self.target.startswith("hf://"):
            from huggingface_hub import upload_folder

            upload_folder(repo_id=self.target[len("hf://"):], folder_path=snapshot, path_in_repo=snapshot.name,
                          token=self.token, commit_message=f"suzak: {snapshot.name}")  # fmt: skip
            return
        target = Path(self.target)
        target.mkdir(parents=True, exist_ok=True)
        partial = target / f"{snapshot.name}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        shutil.copytree(snapshot, partial)
        final = target / snapshot.name
        if final.exists():
            old = target / f"{snapshot.name}.old"
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            os.replace(partial, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(partial, final)

    def _failed(self, name: str, error: BaseException) -> None:
        self.failures += 1
        reason = " ".join(str(error).split())[:300] or type(error).__name__
        logger.warning("checkpoint_mirror: copying %s to %s failed (%s: %s); %d failed copy(ies) so far, training "
                       "goes on", name, self.target, type(error).__name__, reason, self.failures)  # fmt: skip

    def close(self, timeout: float | None = None) -> None:
        """Wait for the copies under way (at the end of training), then stop the thread."""
        pending = self._queue.qsize()
        if pending:
            logger.info("checkpoint_mirror: waiting for %d copy(ies) to %s", pending, self.target)
        self._queue.put(None)
        self._thread.join(timeout)
        summary = f"{self.copied} checkpoint(s) copied to {self.target}"
        if self.failures:
            logger.warning("checkpoint_mirror: %s, %d failed (see the warnings above)", summary, self.failures)
        else:
            logger.info("checkpoint_mirror: %s", summary)
