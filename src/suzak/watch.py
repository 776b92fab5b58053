"""A live view of a run in the terminal: ``python -m suzak.watch OUTPUT_DIR``.

    python -m suzak.watch outputs/demo                # redraws every 2 s until the run ends, then prints the last frame
    python -m suzak.watch outputs/demo --once         # one frame (a finished run, a script, a log)
    python -m suzak.watch runs/clevr7b --interval 10  # over SSH, from any node that sees the output dir

Reads only the files the run writes (:mod:`suzak.runs.progress`): each metric's newest value, a sparkline of its
whole history and its range (rewards, held-out accuracy, KL, completion length, step time, loss); steps done out of
``max_steps``, seconds per step and the ETA; the newest completions with their rewards. Plain text and ANSI escape
codes only, so it works in any terminal and over SSH; colour only on a terminal (and not with ``NO_COLOR``). It
stops by itself when the run ends (``run_info.json`` closed, or an error at the end of ``train.log``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

from suzak import SuzakError
from suzak.runs.progress import COMPLETIONS_FILE, CSVTail, Progress, eta_seconds, read_progress, seconds_per_step

__all__ = ["main", "metric_columns", "render", "sparkline"]

BARS = "▁▂▃▄▅▆▇█"
CLEAR = "\x1b[H\x1b[2J"
STYLE = {"bold": "\x1b[1m", "dim": "\x1b[2m", "green": "\x1b[32m", "red": "\x1b[31m", "yellow": "\x1b[33m"}
RESET = "\x1b[0m"


def sparkline(values: list[float], width: int) -> str:
    """``values`` as block characters, at most ``width`` of them (each the mean of its share of the values).

    >>> sparkline([0, 1, 2, 3, 4, 5, 6, 7], 8), sparkline([0, 0, 1, 1], 2), sparkline([3, 3], 5), sparkline([], 4)
    ('▁▂▃▄▅▆▇█', '▁█', '▄▄', '')
    """
    if not values or width <= 0:
        return ""
    if len(values) > width:  # mean of each bucket, so a spike shows as a bump, not a missing sample
        edges = [round(i * len(values) / width) for i in range(width + 1)]
        values = [sum(values[a:b]) / (b - a) for a, b in zip(edges, edges[1:], strict=False) if b > a]
    low, high = min(values), max(values)
    if high - low < 1e-12:
        return BARS[len(BARS) // 2 - 1] * len(values)
    return "".join(BARS[min(int((v - low) / (high - low) * len(BARS)), len(BARS) - 1)] for v in values)


def metric_columns(columns: list[str]) -> list[tuple[str, str]]:
    """(label, column) of the metrics the view shows, in this order, for those the run logged.

    >>> metric_columns(["loss", "reward", "rewards/clevr_count/mean", "eval/accuracy", "kl", "step_time", "epoch"])
    [('reward', 'reward'), ('clevr_count', 'rewards/clevr_count/mean'), ('eval/accuracy', 'eval/accuracy'), \
('KL', 'kl'), ('step time (s)', 'step_time'), ('loss', 'loss')]

    A mixture's sources: each one's reward, its rewards by source, its held-out accuracy:

    >>> metric_columns(["reward", "sources/colour/reward", "rewards/colour/word_match/mean", "eval/colour/accuracy"])
    [('reward', 'reward'), ('colour reward', 'sources/colour/reward'), ('colour/word_match', \
'rewards/colour/word_match/mean'), ('eval/colour/accuracy', 'eval/colour/accuracy')]
    """
    shown = [("reward", "reward")]
    shown += [(f"{c.split('/')[1]} reward", c) for c in columns if c.startswith("sources/") and c.endswith("/reward")]
    shown += [(c.removeprefix("rewards/").removesuffix("/mean"), c) for c in columns
              if c.startswith("rewards/") and c.endswith("/mean")]  # fmt: skip
    shown += [(c, c) for c in columns if "accuracy" in c.lower()]
    shown += [("KL", "kl"), ("completion length", "completions/mean_length"), ("entropy", "entropy"),
              ("step time (s)", "step_time"), ("loss", "loss"), ("learning rate", "learning_rate")]  # fmt: skip
    return [(label, column) for label, column in shown if column in columns]


def _clock(seconds: float | None) -> str:
    """h:mm:ss (or m:ss); ``?`` when unknown.

    >>> _clock(31.5), _clock(3725), _clock(None)
    ('0:32', '1:02:05', '?')
    """
    if seconds is None:
        return "?"
    hours, rest = divmod(round(seconds), 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def _value(value: float) -> str:
    return (
        f"{value:.3g}" if abs(value) < 1e-3 and value != 0 else f"{value:.3f}" if abs(value) < 1e3 else f"{value:.4g}"
    )


def _header(progress: Progress, paint) -> list[str]:
    step, total = progress.step, progress.max_steps
    per_step = seconds_per_step(progress.rows)
    colour = {"completed": "green", "failed": "red"}.get(progress.status, "yellow")
    done = f"step {step}/{total} ({100 * step / total:.0f}%)" if total else f"step {step}"
    eta = "" if progress.ended else f" · ETA {_clock(eta_seconds(step, total, per_step))}"
    speed = f" · {per_step:.2f} s/step" if per_step else ""
    lines = [f"{paint('suzak.watch', 'bold')} {progress.output_dir} · {paint(progress.status, colour)} · {done}"
             f"{speed}{eta}"]  # fmt: skip
    if total:
        width = 50
        filled = round(width * min(step / total, 1))
        lines.append("[" + "#" * filled + "." * (width - filled) + "]")
    if progress.detail:
        lines.append(paint(progress.detail, "red"))
    return lines


def _metrics(progress: Progress, width: int, paint) -> list[str]:
    shown = metric_columns(progress.columns())
    if not shown:
        return [paint("no metrics logged yet", "dim")]
    label_width = max(len(label) for label, _ in shown)
    spark_width = max(width - label_width - 42, 10)
    lines = []
    for label, column in shown:
        points = progress.series(column)
        values = [v for _, v in points]
        spark = sparkline(values, spark_width)
        lines.append(f"{label:<{label_width}}  {_value(values[-1]):>9}  {spark:<{spark_width}}  "
                     f"{paint(f'min {_value(min(values))} max {_value(max(values))} @{points[-1][0]}', 'dim')}")  # fmt: skip
    return lines


def _completions(progress: Progress, count: int, width: int, paint) -> list[str]:
    rows = progress.completions
    if not rows:
        return []
    step = rows[-1].get("step", "?")
    newest = [row for row in rows if row.get("step") == step][-count:]
    reward_columns = [c for c in rows[-1] if c.startswith("reward/")]
    lines = [paint(f"newest completions (step {step}; reward = weighted total"
                   + (f" of {', '.join(c[7:] for c in reward_columns)}" if reward_columns else "") + ")", "bold")]  # fmt: skip
    for row in newest:
        reward = row.get("reward") or (row.get(reward_columns[0]) if reward_columns else "") or ""
        text = " ".join(str(row.get("completion", "")).split())
        prompt = " ".join(str(row.get("prompt", "")).split())
        line = f"{reward:>6.6} | {text[: max(width // 2, 20)]!s:<{min(width // 2, 40)}} | {prompt}"
        lines.append(line[:width])
    return lines


def render(progress: Progress, width: int = 100, completions: int = 6, colour: bool = False) -> str:
    """One frame of the view as text (ANSI colour codes only when ``colour``)."""

    def paint(text: str, style: str) -> str:
        return f"{STYLE[style]}{text}{RESET}" if colour else text

    sections = [_header(progress, paint), _metrics(progress, width, paint),
                _completions(progress, completions, width, paint)]  # fmt: skip
    return "\n".join("\n".join(section) + "\n" for section in sections if section)


def _uses_colour(stream) -> bool:
    return stream.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


def watch(output_dir: str, interval: float, once: bool, completions: int, stream=None) -> Progress:
    """Draw frames until the run ends (or once); returns the last look at the run."""
    stream = stream or sys.stdout
    tail = CSVTail(Path(output_dir) / COMPLETIONS_FILE)
    live = not once and stream.isatty()
    while True:
        progress = read_progress(output_dir, tail)
        width = shutil.get_terminal_size((100, 40)).columns
        frame = render(progress, width, completions, _uses_colour(stream))
        stream.write((CLEAR if live else "") + frame)
        stream.flush()
        if once or progress.ended:
            return progress
        if not live:
            stream.write("\n")
        time.sleep(interval)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m suzak.watch", description=__doc__.split("\n\n")[0])
    parser.add_argument("output_dir", help="a run's output dir (holds metrics.csv and run_info.json)")
    parser.add_argument("--once", action="store_true", help="print one frame and exit")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between frames (default 2)")
    parser.add_argument("--completions", type=int, default=6, help="newest completions shown (default 6)")
    args = parser.parse_args(argv)
    if args.interval <= 0:
        parser.error("--interval must be positive")
    try:
        watch(args.output_dir, args.interval, args.once, args.completions)
    except SuzakError as error:
        raise SystemExit(f"error: {error}") from None
    except KeyboardInterrupt:
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
