"""Results files and the summary: R1-V's JSON, the markdown table beside the published numbers, seeds mean ± std.

``REFERENCES`` is the one list of published numbers (from R1-V's README, logs and issues) that reports and model
cards read. The Qwen2.5-VL-3B SuperCLEVR figure circulates in a derived README and appears in none of R1-V's own
sources, so it is carried, and always printed, as unverified.

>>> accuracy([{"is_correct": True}, {"is_correct": False}, {"is_correct": True}, {"is_correct": True}])
75.0
>>> format_accuracy(75.0)
'Accuracy: 75.00%'
>>> mean_std([40.0, 50.0, 60.0])
(50.0, 10.0)
"""

from __future__ import annotations

import json
import logging
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "REFERENCES",
    "Reference",
    "RunResult",
    "accuracy",
    "format_accuracy",
    "markdown_summary",
    "mean_std",
    "references_for",
    "write_results",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Reference:
    """One published (or reported) result: accuracy in % before and after GRPO training."""

    task: str
    model: str
    base: float | None
    trained: float | None
    setting: str
    source: str
    verified: bool = True


REFERENCES: tuple[Reference, ...] = (
    Reference("superclevr", "Qwen2-VL-2B-Instruct", 48.0, 82.5, "100 GRPO steps on CLEVR-CoGenT-A (96/200 → 165/200)",
              "R1-V README and logs"),
    Reference("superclevr", "Qwen2.5-VL-3B-Instruct", 55.0, 89.5, "as quoted",
              "a derived README; in none of R1-V's sources", verified=False),
    Reference("superclevr", "Qwen2-VL-2B-Instruct, user reproduction", None, 71.5, "R1-V recipe", "R1-V issue #170"),
    Reference("superclevr", "Qwen2-VL-2B-Instruct, user runs of the base model", 42.5, None, "R1-V eval script",
              "R1-V issues #100, #156"),
    Reference("geoqa", "Qwen2-VL-7B", 30.63, 38.72, "2 epochs on GeoQA 8K (231/754 → 292/754)", "R1-V README"),
    Reference("geoqa", "Qwen2.5-VL-3B", 35.41, 47.48, "1 epoch on GeoQA 8K (267/754 → 358/754)", "R1-V README"),
)  # fmt: skip

# Facts that belong beside the table but are not a before/after pair.
NOTES: dict[str, tuple[str, ...]] = {
    "superclevr": (
        "Answering directly, without the thinking prompt, the 2B base model scores 79–86% (R1-V issues #72, #113).",
    ),
}


def references_for(task: str) -> list[Reference]:
    return [r for r in REFERENCES if r.task == task]


def accuracy(results: list[dict]) -> float:
    """Correct / N × 100 (R1-V's figure); 0.0 for no results."""
    return 100.0 * sum(bool(r["is_correct"]) for r in results) / len(results) if results else 0.0


def format_accuracy(value: float) -> str:
    return f"Accuracy: {value:.2f}%"


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0.0 for fewer than two values)."""
    if not values:
        return 0.0, 0.0
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def write_results(path: str | Path, results: list[dict]) -> float:
    """R1-V's output file ``{"accuracy", "results"}``; returns the accuracy, computed from ``results`` alone."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    value = accuracy(results)
    text = json.dumps({"accuracy": value, "results": results}, indent=2, ensure_ascii=False, default=str)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text + "\n", encoding="utf-8")
    tmp.replace(path)  # a crash mid-write never leaves a truncated results file
    return value


@dataclass
class RunResult:
    """One pass over the items: greedy (``seed`` None) or sampled with a seed."""

    path: str
    accuracy: float
    correct: int
    total: int
    seed: int | None = None
    temperature: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def _reference_rows(task: str) -> list[str]:
    rows = []
    for ref in references_for(task):
        model = ref.model if ref.verified else f"{ref.model} **(UNVERIFIED)**"
        rows.append(f"| {model} | {_fmt(ref.base)} | {_fmt(ref.trained)} | {ref.setting} | {ref.source} |")
    return rows


def markdown_summary(task: str, model: str, greedy: RunResult, sampled: list[RunResult],
                     settings: dict[str, Any]) -> str:  # fmt: skip
    """The run's accuracy (greedy, and sampled mean ± std over seeds) above the published reference numbers."""
    lines = [f"# {task}: {model}", "", "| run | accuracy (%) | correct / N | file |", "|---|---|---|---|"]
    lines.append(f"| greedy | {greedy.accuracy:.2f} | {greedy.correct} / {greedy.total} | `{greedy.path}` |")
    for run in sampled:
        lines.append(f"| seed {run.seed}, T={run.temperature:g} | {run.accuracy:.2f} | {run.correct} / {run.total} "
                     f"| `{run.path}` |")  # fmt: skip
    if sampled:
        mean, std = mean_std([r.accuracy for r in sampled])
        lines.append(f"| sampled, {len(sampled)} seed(s) | {mean:.2f} ± {std:.2f} (mean ± std) | | |")
    lines += ["", "Settings: " + ", ".join(f"{k}={v}" for k, v in settings.items())]
    references = _reference_rows(task)
    if references:
        lines += ["", "## Published reference numbers", "",
                  "| model | base (%) | trained (%) | setting | source |", "|---|---|---|---|---|", *references]  # fmt: skip
        if any(not r.verified for r in references_for(task)):
            lines += ["", "UNVERIFIED: quoted in a derived README, found in none of R1-V's sources."]
        lines += [f"- {note}" for note in NOTES.get(task, ())]
    return "\n".join(lines) + "\n"
