"""Training curves as PNG files, from a run's ``metrics.csv``.

    suzak plot OUTPUT_DIR                      # writes OUTPUT_DIR/plots/*.png (also run at the end of training)

One figure per quantity, each over the optimizer step: every reward's mean with the weighted total, a mixture's
sources (each one's mean reward and share of groups without reward variance), accuracy from evaluation (any logged
column named ``*accuracy*``, each source's too), KL to the reference model, completion length, clip ratios,
learning rate, step time and loss. A figure whose metrics were never logged (KL with ``beta: 0``) is skipped. A run
without ``metrics.csv`` (trained before suzak wrote it) is read from its newest ``trainer_state.json`` instead.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from suzak import SuzakError

__all__ = ["FIGURES", "Figure", "load_metrics", "main", "plot_run"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Figure:
    """One PNG: which logged columns it draws (a function of the available columns), its title and y label."""

    name: str
    title: str
    ylabel: str
    select: Callable[[list[str]], list[str]]


def _exact(*names: str) -> Callable[[list[str]], list[str]]:
    return lambda columns: [n for n in names if n in columns]


def _rewards(columns: list[str]) -> list[str]:
    means = sorted(c for c in columns if c.startswith("rewards/") and c.endswith("/mean"))
    return means + (["reward"] if "reward" in columns else [])


def _sources(columns: list[str]) -> list[str]:
    return sorted(c for c in columns if c.startswith("sources/") and c.endswith(("/reward", "/zero_std_groups")))


def _accuracy(columns: list[str]) -> list[str]:
    return sorted(c for c in columns if "accuracy" in c.lower())


def _clip(columns: list[str]) -> list[str]:
    return sorted(c for c in columns if c.startswith("clip_ratio/") and c.endswith("_mean")) + _exact(
        "completions/clipped_ratio"
    )(columns)


FIGURES: tuple[Figure, ...] = (
    Figure("rewards", "Rewards: each function's mean and the weighted total", "reward", _rewards),
    Figure("sources", "Sources: each one's mean reward and groups without reward variance", "reward", _sources),
    Figure("accuracy", "Accuracy from evaluation", "accuracy", _accuracy),
    Figure("kl", "KL divergence to the reference model", "KL", _exact("kl", "eval_kl")),
    Figure(
        "completion_length",
        "Completion length",
        "tokens",
        _exact(
            "completions/mean_length",
            "completions/min_length",
            "completions/max_length",
            "completions/mean_terminated_length",
        ),
    ),  # fmt: skip
    Figure("clip_ratio", "Clip ratios (and truncated completions)", "fraction", _clip),
    Figure("learning_rate", "Learning rate", "learning rate", _exact("learning_rate")),
    Figure("step_time", "Step time", "seconds per step", _exact("step_time")),
    Figure("loss", "Loss", "loss", _exact("loss")),
)


def _number(text: str | None) -> float | None:
    try:
        value = float(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) else value


def _from_trainer_state(output_dir: Path) -> list[dict]:
    states = sorted(output_dir.glob("checkpoint-*/trainer_state.json"), key=lambda p: p.stat().st_mtime)
    if not states:
        raise SuzakError(
            f"no metrics.csv (or checkpoint-*/trainer_state.json) in {output_dir}: is it a run's output dir?"
        )
    logger.info("no metrics.csv in %s: reading %s", output_dir, states[-1])
    return json.loads(states[-1].read_text())["log_history"]


def load_metrics(output_dir: str | Path) -> dict[str, list[tuple[float, float]]]:
    """Column → (step, value) points, skipping empty cells."""
    output_dir = Path(output_dir)
    path = output_dir / "metrics.csv"
    if path.is_file():
        with path.open(newline="", encoding="utf-8") as handle:
            rows: list[dict] = list(csv.DictReader(handle))
    else:
        rows = _from_trainer_state(output_dir)
    series: dict[str, list[tuple[float, float]]] = {}
    for row in rows:
        step = _number(str(row.get("step")))
        for key, cell in row.items():
            value = _number(None if cell is None else str(cell))
            if key not in ("step", "time") and step is not None and value is not None:
                series.setdefault(key, []).append((step, value))
    return series


def _draw(figure: Figure, columns: list[str], series: dict, run_name: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    for column in columns:
        steps, values = zip(*series[column], strict=True)
        ax.plot(steps, values, marker="o" if len(steps) <= 30 else None, markersize=3, label=column)
    ax.set_title(f"{figure.title}\n{run_name}", fontsize=11)
    ax.set_xlabel("optimizer step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(figure.ylabel)
    ax.grid(True, alpha=0.3)
    if len(columns) > 1:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_run(output_dir: str | Path, out: str | Path | None = None) -> list[Path]:
    """Draw every figure whose metrics exist into ``out`` (default ``output_dir/plots``); returns the PNG paths."""
    output_dir = Path(output_dir)
    series = load_metrics(output_dir)
    out = Path(out) if out else output_dir / "plots"
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for figure in FIGURES:
        columns = [c for c in figure.select(sorted(series)) if series.get(c)]
        if not columns:
            logger.info("plot %s skipped: none of its metrics were logged", figure.name)
            continue
        path = out / f"{figure.name}.png"
        _draw(figure, columns, series, output_dir.resolve().name, path)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["episode"]:
        return _episode_main(argv[1:])
    parser = argparse.ArgumentParser(prog="suzak plot", description=__doc__.split("\n\n")[0],
                                     epilog="suzak plot episode RUN [--step N]: the strip of a step's episodes")  # fmt: skip
    parser.add_argument("output_dir", help="a run's output dir (holds metrics.csv)")
    parser.add_argument("--out", help="folder for the PNGs (default: OUTPUT_DIR/plots)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        written = plot_run(args.output_dir, args.out)
    except SuzakError as error:
        raise SystemExit(f"error: {error}") from None
    print(f"{len(written)} plot(s) in {Path(args.out or Path(args.output_dir) / 'plots')}: "
          + ", ".join(p.name for p in written))  # fmt: skip


def _episode_main(argv: list[str]) -> None:
    """``suzak plot episode RUN [--step N] [--out PNG]``: the strip of the episodes a run kept at a step
    (:func:`suzak.runs.episodes.draw_episode`)."""
    from suzak.runs.episodes import draw_episode

    parser = argparse.ArgumentParser(prog="suzak plot episode", description="draw the episodes a run kept at a step: "
                                     "each screen, each click where it landed, each typed text under it")  # fmt: skip
    parser.add_argument("output_dir", help="a run's output dir (holds episodes/)")
    parser.add_argument("--step", type=int, help="the training step (default: the last one kept)")
    parser.add_argument("--out", help="the PNG (default: OUTPUT_DIR/plots/episode-step-<N>.png)")
    args = parser.parse_args(argv)
    try:
        path = draw_episode(args.output_dir, args.step, args.out)
    except SuzakError as error:
        raise SystemExit(f"error: {error}") from None
    print(f"episode strip: {path}")
