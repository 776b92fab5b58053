"""A training run from recipe to published model, shared by GRPO (``suzak.train``) and SFT (``suzak.sft``).

Parse the recipe, check the checkpoint to resume from (before any weights load), build the trainer (GRPO's or SFT's,
:mod:`suzak.training.build`: budgets, rewards, validated datasets, policy), start the run's records, train, save,
then close the record, draw the plots and publish when ``push_to_hub`` is set. A run that made no optimizer step is an error
(:func:`check_trained`), never exit 0. Besides checkpoints, every run writes to its output dir:
``recipe.yaml`` (the recipe as run, secrets masked), ``run_info.json`` (times, hardware, versions), ``train.log``
(rank 0's console log, :mod:`suzak.runs.logfile`), ``metrics.csv`` and ``completions.csv`` (streamed,
:mod:`suzak.runs.streams`) and, at the end, ``plots/*.png``
(:mod:`suzak.runs.plots`). ``push_to_hub: true`` publishes the final model once, at the end, with suzak's model card
(:mod:`suzak.release.publish`); the Trainer's own per-save pushes are turned off. The Hub token is taken for that
release before the Trainer exists and cleared from the arguments it pickles into ``training_args.bin``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

from suzak import SuzakError
from suzak.runs.checkpoints import checkpoint_step, resume_checkpoint, write_failure
from suzak.training.configs import full_argv

__all__ = [
    "check_resume_settings",
    "check_trained",
    "main",
    "resolve_resume",
    "run",
    "save_final_model",
    "setup_reporting",
    "use_wandb_run",
]

logger = logging.getLogger(__name__)


def setup_reporting(train_args, recipe: str | None = None) -> None:
    """Run name from the recipe; W&B without an API key runs offline (said once) instead of prompting or crashing."""
    if train_args.run_name is None:
        train_args.run_name = Path(recipe).stem if recipe else Path(train_args.output_dir).name
    if "wandb" not in (train_args.report_to or []):
        return
    logged_in = os.environ.get("WANDB_API_KEY") or (Path.home() / ".netrc").is_file()
    if not logged_in and os.environ.get("WANDB_MODE") not in ("offline", "disabled"):
        os.environ["WANDB_MODE"] = "offline"
        logger.warning("no WANDB_API_KEY: W&B runs offline (sync later with `wandb sync wandb/offline-run-*`)")
    os.environ.setdefault("WANDB_PROJECT", "suzak")


def resolve_resume(train_args) -> str | None:
    """The checked checkpoint ``resume_from_checkpoint`` names (``latest``/``last``: the newest complete one in
    output_dir), or None to start fresh (:func:`suzak.runs.checkpoints.resume_checkpoint`)."""
    return resume_checkpoint(train_args.resume_from_checkpoint, train_args.output_dir)


def _start_records(trainer, argv: list[str], parsed: tuple, resume: str | None, start_step: int):
    """recipe.yaml and run_info.json (main process), and the CSV streams and checkpoint markers (every rank); returns
    the marker callback (it knows which checkpoint is being saved)."""
    from suzak.runs.faults import PREEMPTED_FILE, state_settings
    from suzak.runs.record import save_recipe, start_run
    from suzak.runs.streams import add_run_callbacks

    markers = add_run_callbacks(trainer, state_settings(parsed))
    if trainer.accelerator.is_main_process:
        output_dir = trainer.args.output_dir
        (Path(output_dir) / PREEMPTED_FILE).unlink(missing_ok=True)  # the stop it recorded is over
        save_recipe(output_dir, full_argv(argv), parsed)
        start_run(output_dir, argv, parsed, resume, start_step, wandb_id=os.environ.get("WANDB_RUN_ID"))
    return markers


def _train_and_save(trainer, resume: str | None, markers, start_step: int, stop) -> None:
    """Train, then save the final model; a failed write (a full disk) is one line naming what was being saved and the
    intact checkpoint to resume from; a run that made no optimizer step saves nothing (:func:`check_trained`); a
    run stopped by a signal (``stop``, :class:`suzak.runs.faults.StopOnSignal`) ends in
    :class:`suzak.runs.faults.Preempted` after the Trainer's checkpoint."""
    output_dir = trainer.args.output_dir
    try:
        trainer.train(resume_from_checkpoint=resume)
        if stop is not None and stop.stopped_at is not None:
            return
        check_trained(trainer, start_step)
        markers.saving = output_dir
        save_final_model(trainer, output_dir)
        markers.saving = None
    except Exception as error:
        message = write_failure(error, markers.saving, output_dir)
        if message is None:
            raise
        raise SuzakError(message) from None


def save_final_model(trainer, output_dir: str) -> None:
    """``trainer.save_model`` into ``OUTPUT/.suzak-staging/final``, then each file renamed into ``output_dir``: a save
    that fails (a full disk, a file size limit) leaves no half-written weights there, only what was there before."""
    import shutil

    from suzak.trl_internals.checkpoints import STAGING

    staging = Path(output_dir) / STAGING / "final"
    writer = trainer.args.should_save
    if writer:
        shutil.rmtree(staging, ignore_errors=True)
    trainer.accelerator.wait_for_everyone()
    try:
        trainer.save_model(str(staging))
    except BaseException:
        if writer:
            shutil.rmtree(staging, ignore_errors=True)
            with contextlib.suppress(OSError):
                staging.parent.rmdir()
        raise
    trainer.accelerator.wait_for_everyone()
    if writer:
        for path in sorted(staging.iterdir()):
            target = Path(output_dir) / path.name
            if path.is_dir() and target.is_dir():
                shutil.rmtree(target)
            os.replace(path, target)
        shutil.rmtree(staging, ignore_errors=True)
        with contextlib.suppress(OSError):
            staging.parent.rmdir()  # when empty


def check_trained(trainer, start_step: int) -> None:
    """A run that made no optimizer step is an error, not a finished run (exit 0) that saves an untrained model.

    The Trainer ends such a run quietly: a dataset smaller than one batch, ``num_train_epochs`` 0, or a resume from
    a checkpoint already at ``max_steps``.
    """
    args = trainer.args
    if trainer.state.global_step > start_step:
        return
    if start_step and 0 < args.max_steps <= start_step:
        raise SuzakError(f"nothing to train: the run resumed at step {start_step} and max_steps is {args.max_steps}; "
                         "raise max_steps to train on")  # fmt: skip
    dataset = trainer.train_dataset
    rows = f"{len(dataset)} training row(s)" if hasattr(dataset, "__len__") else "an iterable training dataset"
    batch, generations = "", getattr(args, "num_generations", None)
    if generations:  # GRPO: a step takes generation_batch_size / num_generations prompts
        size = args.generation_batch_size
        batch = (f"; a generation batch takes {size // generations} prompts (generation_batch_size {size} / "
                 f"num_generations {generations})")  # fmt: skip
    raise SuzakError(
        f"training ran no optimizer step: {rows}, max_steps {args.max_steps}, num_train_epochs "
        f"{args.num_train_epochs:g}{batch}; nothing was trained and no model was saved"
    )


def _finish(trainer, release) -> None:
    """Main process, after the final save: draw the plots, say how the run's accuracy and reward moved, close
    run_info.json, publish when asked."""
    from suzak.runs.episodes import draw_episode, episode_steps
    from suzak.runs.plots import plot_run
    from suzak.runs.progress import before_after
    from suzak.runs.record import finish_run

    output_dir = trainer.args.output_dir
    try:
        written = plot_run(output_dir)
        if episode_steps(output_dir):  # an episode run: its last step's strip (suzak plot episode RUN --step N)
            written.append(draw_episode(output_dir))
        logger.info("plots: %s", ", ".join(str(path) for path in written))
    except Exception as error:  # noqa: BLE001 - a plotting failure must not fail a finished run; said, not hidden
        logger.warning("plots failed (%s: %s); retry with `suzak plot %s`", type(error).__name__, error,
                       output_dir)  # fmt: skip
    summary = before_after(output_dir)
    if summary:
        logger.info("before -> after: %s", summary)
    finish_run(output_dir, trainer.state.global_step)  # last: `python -m suzak.watch` stops when it sees this
    if release is not None:
        release.publish(output_dir)


def run(argv: list[str] | None, parse: Callable, build: Callable, command: str) -> str:
    """Parse, train, save, record, publish; returns the output dir.

    ``parse(argv) -> (SuzakArguments, training config, ModelConfig)`` (:mod:`suzak.training.configs`) and
    ``build(suzak_args, config, model_args) -> trainer`` (:mod:`suzak.training.build`) are the trainer's own, GRPO's or
    SFT's; ``command`` is the module the user ran (``suzak.train``), named in the resume line after a stop.
    """
    from dotenv import load_dotenv

    from suzak.release.publish import release_request
    from suzak.runs.faults import Preempted, RankWatch
    from suzak.runs.logfile import TrainLog
    from suzak.runs.record import config_path
    from suzak.runs.redaction import clear_secret_fields

    load_dotenv(os.environ.get("SUZAK_ENV_FILE", ".env"), override=False)
    argv = list(sys.argv[1:] if argv is None else argv)
    suzak_args, train_args, model_args = parse(argv)
    release = release_request(train_args, dry_run=suzak_args.release_dry_run)  # repo id and token checked up front
    clear_secret_fields(suzak_args, train_args, model_args)  # the release keeps its token; training_args.bin never
    train_args.push_to_hub = False  # one suzak release at the end, not a Trainer push at every save
    setup_reporting(train_args, recipe=config_path(argv))
    log = TrainLog(train_args.output_dir, full_argv(argv)) if train_args.process_index == 0 else None
    watch = None
    if train_args.world_size > 1:  # several processes: a rank that dies is named, the others do not hang
        watch = RankWatch(train_args.output_dir, train_args.process_index, train_args.world_size,
                          suzak_args.rank_failure_timeout)  # fmt: skip
        watch.prepare()
        watch.start()
    try:
        _run(argv, (suzak_args, train_args, model_args), build, release, log, command)
    except Preempted:
        if watch is not None:
            watch.stop()
        raise
    except SuzakError as error:
        if watch is not None:
            watch.failed(str(error))
        if log is not None:
            log.error(str(error))
        raise
    except Exception as error:
        if watch is not None:
            watch.exit_if_another_failed()  # this rank's error is the other's consequence
            watch.failed(f"{type(error).__name__}: {' '.join(str(error).split())[:500]}")
        if log is not None:
            log.crash()
        raise
    else:
        if watch is not None:
            watch.stop()
    finally:
        if log is not None:
            log.close()
    return train_args.output_dir


def _run(argv: list[str], parsed: tuple, build: Callable, release, log, module: str) -> None:
    """Resume, build, train, save and finish a parsed run; rank 0's ``log`` (train.log) records it."""
    from suzak.runs.faults import CheckpointMirror, StopOnSignal, state_settings
    from suzak.runs.steps import readable_steps

    suzak_args, train_args, model_args = parsed
    resume = resolve_resume(train_args)  # a bad checkpoint stops the run before the model loads
    check_resume_settings(resume, state_settings(parsed), suzak_args.resume_override)
    if "wandb" in (train_args.report_to or []):
        use_wandb_run(train_args.output_dir, resumed=resume is not None)
    trainer = build(suzak_args, train_args, model_args)
    trainer.on_nonfinite = suzak_args.on_nonfinite
    if not suzak_args.log_metrics_dict:
        readable_steps(trainer)  # one line per logged step instead of the metrics dict
    if log is not None:
        trainer.add_callback(log.callback(raw=suzak_args.log_metrics_dict))
    stop = StopOnSignal(suzak_args.stop_signals) if suzak_args.stop_signals else None
    if stop is not None:
        trainer.add_callback(stop)  # before the markers: it decides at a step's end whether that step saves
    start_step = (checkpoint_step(Path(resume)) or 0) if resume else 0
    markers = _start_records(trainer, argv, parsed, resume, start_step)
    mirror = None
    if suzak_args.checkpoint_mirror and trainer.accelerator.is_main_process:
        mirror = CheckpointMirror(suzak_args.checkpoint_mirror, train_args.output_dir, os.environ.get("HF_TOKEN"))
        trainer.add_callback(mirror)  # after the markers: a copy carries its checkpoint's marker
    try:
        _train_and_save(trainer, resume, markers, start_step, stop)
    finally:
        if mirror is not None:
            mirror.close()
    if stop is not None and stop.stopped_at is not None:
        _stopped(trainer, stop, argv, module)
    if trainer.accelerator.is_main_process:
        trainer.processing_class.save_pretrained(train_args.output_dir)
        logger.info("model and processor saved to %s", train_args.output_dir)
        _finish(trainer, release)
        logger.info("done: model and processor, train.log, metrics.csv and plots in %s", train_args.output_dir)


def _stopped(trainer, stop, argv: list[str], module: str):
    """After a signal: record it (``preempted.json``, run_info.json) and raise :class:`~suzak.runs.faults.Preempted`
    with the resume command."""
    import json

    from suzak.runs.faults import PREEMPTED_FILE, Preempted, resume_command
    from suzak.runs.record import finish_run

    output_dir, step = trainer.args.output_dir, stop.stopped_at
    command = resume_command(module, argv)
    checkpoint = Path(output_dir) / f"checkpoint-{step}"
    if trainer.accelerator.is_main_process:
        note = {"signal": stop.received, "step": step, "checkpoint": str(checkpoint), "resume": command}
        (Path(output_dir) / PREEMPTED_FILE).write_text(json.dumps(note, indent=1) + "\n", encoding="utf-8")
        finish_run(output_dir, step, status="preempted")
    raise Preempted(
        f"stopped by {stop.received} after step {step}: {checkpoint} holds every completed step; resume with: {command}"
    )


def check_resume_settings(resume: str | None, settings: dict, override: bool) -> None:
    """Before the model loads: a resume whose recipe changes a setting the checkpoint's state depends on (recorded in
    its marker; :func:`suzak.runs.faults.state_settings`) stops with the list, unless ``override``."""
    from suzak.runs.checkpoints import saved_settings
    from suzak.runs.faults import changed_settings

    saved = saved_settings(resume) if resume else None
    changes = changed_settings(saved, settings) if saved else []
    if not changes:
        return
    message = (f"resume_from_checkpoint {resume}: this run changes {len(changes)} setting(s) the checkpoint's state "
               f"depends on ({'; '.join(changes)})")  # fmt: skip
    if override:
        logger.warning("%s; going on (resume_override)", message)
        return
    raise SuzakError(f"{message}: set them back, or add --resume_override true to continue with the new values")


def use_wandb_run(output_dir: str, resumed: bool) -> None:
    """One W&B run per training run: a resumed run logs into the W&B run it started (its id is in run_info.json),
    a new one gets a new id (``WANDB_RUN_ID`` from the environment wins)."""
    import uuid

    from suzak.runs.record import read_run_info

    known = read_run_info(output_dir).get("wandb_run_id") if resumed else None
    os.environ.setdefault("WANDB_RUN_ID", known or uuid.uuid4().hex[:12])
    os.environ.setdefault("WANDB_RESUME", "allow")
    if known:
        logger.info("W&B: resuming run %s", os.environ["WANDB_RUN_ID"])


def main(argv: list[str] | None, parse: Callable, build: Callable, command: str) -> None:
    """A training command: logging, secrets redacted in every log line, one ``error:`` line for bad input; a run
    stopped by a signal prints its resume line and exits with :data:`suzak.runs.faults.EXIT_PREEMPTED` (75)."""
    from suzak.runs.faults import EXIT_PREEMPTED, Preempted
    from suzak.runs.redaction import install_log_redaction

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    install_log_redaction()
    try:
        run(argv, parse, build, command)
    except Preempted as stopped:
        print(stopped, file=sys.stderr, flush=True)
        raise SystemExit(EXIT_PREEMPTED) from None
    except SuzakError as error:
        raise SystemExit(f"error: {error}") from None
