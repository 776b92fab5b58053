"""One readable line per logged training step, on the console (beside tqdm's bar) and in ``train.log``, instead of
the Trainer's metrics dict: step/total, reward mean ± std, the held-out accuracy when measured, completion length, KL
and clipping when present, loss, seconds per step and the time left (``log_metrics_dict: true`` keeps the dict; every
value is in ``metrics.csv`` either way).
"""

from __future__ import annotations

__all__ = ["StepClock", "duration", "eta_seconds", "readable_steps", "step_line"]


def eta_seconds(step: int, max_steps: int | None, per_step: float | None) -> float | None:
    """Seconds left: the steps still to run times the recent seconds per step; None when either is unknown.

    >>> eta_seconds(87, 150, 0.5), eta_seconds(150, 150, 0.5), eta_seconds(10, None, 0.5), eta_seconds(10, 150, None)
    (31.5, 0.0, None, None)
    """
    if max_steps is None or max_steps <= 0 or per_step is None:
        return None
    return max(max_steps - step, 0) * per_step


def duration(seconds: float) -> str:
    """``seconds`` as a short duration.

    >>> duration(35.2), duration(290), duration(3725)
    ('35s', '4m50s', '1h02m')
    """
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


# (log key, label, format) of the step line, in its order; a key the step did not log is left out.
STEP_FIELDS = (("eval/accuracy", "eval", "{:.3f}"), ("completions/mean_length", "len", "{:.0f}"),
               ("kl", "kl", "{:.4f}"), ("clip_ratio/region_mean", "clip", "{:.3f}"), ("loss", "loss", "{:.4g}"),
               ("mean_token_accuracy", "token acc", "{:.3f}"), ("perf/tokens_per_s", "tok/s", "{:,.0f}"))  # fmt: skip


def step_line(logs: dict, step: int, max_steps: int | None, per_step: float | None) -> str:
    """One readable line for a logged training step (what the console and ``train.log`` show; every value is in
    ``metrics.csv``): step/total, reward mean ± std, the held-out accuracy when measured, completion length, KL and
    clipping when present, loss, tokens/s (EasyR1's metric, this rank's), seconds per step and the time left. The Trainer's summary at the end of training
    (``train_runtime``) becomes a ``done`` line.

    >>> logs = {"reward": 0.53, "reward_std": 0.21, "completions/mean_length": 45.2, "kl": 0.0031, "loss": 0.01}
    >>> step_line(logs, 12, 150, 2.1)
    'step 12/150 | reward 0.530 ± 0.210 | len 45 | kl 0.0031 | loss 0.01 | 2.1 s/step | ETA 4m50s'
    >>> step_line({"train_runtime": 301.5, "train_loss": 0.02}, 150, 150, 2.0)
    'done: 150 steps in 5m02s (2.0 s/step)'

    A mixture's step names each source's reward (``sources/<name>/reward``) and held-out accuracy beside the whole's:

    >>> step_line({"reward": 0.6, "sources/colour/reward": 0.9, "sources/boxes/reward": 0.3, "eval/accuracy": 0.5,
    ...            "eval/colour/accuracy": 0.75, "eval/boxes/accuracy": 0.25}, 3, None, None)
    'step 3 | reward 0.600 (colour 0.900, boxes 0.300) | eval 0.500 (colour 0.750, boxes 0.250)'
    """
    if "train_runtime" in logs:
        runtime = float(logs["train_runtime"])
        return f"done: {step} steps in {duration(runtime)}" + (f" ({runtime / step:.1f} s/step)" if step else "")
    parts = [f"step {step}/{max_steps}" if max_steps and max_steps > 0 else f"step {step}"]
    if "reward" in logs:
        parts.append(f"reward {float(logs['reward']):.3f}" + (f" ± {float(logs['reward_std']):.3f}"
                                                               if "reward_std" in logs else "")
                     + _per_source(logs, "sources/", "/reward"))  # fmt: skip
    parts += [f"{label} {form.format(float(logs[key]))}" + (_per_source(logs, "eval/", "/accuracy")
                                                            if key == "eval/accuracy" else "")
              for key, label, form in STEP_FIELDS if key in logs]  # fmt: skip
    if per_step is not None:
        parts.append(f"{per_step:.1f} s/step")
        if (left := eta_seconds(step, max_steps, per_step)) is not None and left > 0:
            parts.append(f"ETA {duration(left)}")
    return " | ".join(parts)


def _per_source(logs: dict, prefix: str, suffix: str) -> str:
    """`` (a 0.900, b 0.300)``: each source's figure logged as ``<prefix><source><suffix>`` (a mixture's), or ""."""
    figures = [f"{key[len(prefix) : -len(suffix)]} {float(value):.3f}" for key, value in logs.items()
               if key.startswith(prefix) and key.endswith(suffix) and key.count("/") == 2]  # fmt: skip
    return f" ({', '.join(figures)})" if figures else ""


class StepClock:
    """Seconds per optimizer step between logged steps, from the first logged step on (a run's set-up left out).

    >>> clock = StepClock(); clock.tick(1, now=10.0), clock.tick(3, now=14.0), clock.tick(4, now=15.5)
    (None, 2.0, 1.8333333333333333)
    """

    def __init__(self):
        self.first: tuple[int, float] | None = None

    def tick(self, step: int, now: float | None = None) -> float | None:
        import time

        now = time.monotonic() if now is None else now
        if self.first is None or step <= self.first[0]:
            self.first = (step, now)
            return None
        return (now - self.first[1]) / (step - self.first[0])


def readable_steps(trainer) -> None:
    """Replace the Trainer's printed metrics dict per logged step with :func:`step_line` (beside tqdm's bar, or
    printed when the bar is off), on the main process."""
    from transformers import PrinterCallback, ProgressCallback

    clock = StepClock()

    def line(state, logs: dict) -> str:
        return step_line(logs, state.global_step, state.max_steps, clock.tick(state.global_step))

    class StepLines(ProgressCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if state.is_world_process_zero and logs and self.training_bar is not None:
                self.training_bar.write(line(state, logs))

    class StepPrinter(PrinterCallback):  # the console line PrinterCallback prints, as it prints it
        def on_log(self, args, state, control, logs=None, **kwargs):
            if state.is_world_process_zero and logs:
                print(line(state, logs), flush=True)

    for callback in list(trainer.callback_handler.callbacks):
        if type(callback) is ProgressCallback:
            trainer.callback_handler.remove_callback(callback)
            trainer.add_callback(StepLines(max_str_len=callback.max_str_len))
        elif type(callback) is PrinterCallback:
            trainer.callback_handler.remove_callback(callback)
            trainer.add_callback(StepPrinter())
