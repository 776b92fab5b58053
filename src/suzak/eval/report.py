"""Results files and the summary: R1-V's JSON, both scoring rules, the published numbers, seeds mean ± std.

``REFERENCES`` is the one list of published numbers (from R1-V's README, logs and issues) that reports and model
cards read. They were scored with R1-V's rule, so they are printed only beside a run's ``r1v`` figure, never beside
the ``strict`` one. The Qwen2.5-VL-3B SuperCLEVR figure circulates in a derived README and appears in none of R1-V's
own sources, so it is carried, and always printed, as unverified.

>>> accuracy([{"is_correct": True}, {"is_correct": False}, {"is_correct": True}, {"is_correct": True}])
75.0
>>> accuracy([{"is_correct": True, "is_correct_r1v": False}], "is_correct_r1v")
0.0
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
    "reference_lines",
    "references_for",
    "rule_flag",
    "scoring_note",
    "tool_lines",
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


def accuracy(results: list[dict], flag: str = "is_correct") -> float:
    """Correct / N × 100 (R1-V's figure) counting ``flag``; 0.0 for no results."""
    return 100.0 * sum(bool(r[flag]) for r in results) / len(results) if results else 0.0


def rule_flag(rule: str) -> str:
    """The per-result key holding one rule's verdict: ``is_correct_r1v``, ``is_correct_strict``."""
    return f"is_correct_{rule}"


def format_accuracy(value: float) -> str:
    return f"Accuracy: {value:.2f}%"


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0.0 for fewer than two values)."""
    if not values:
        return 0.0, 0.0
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def write_results(path: str | Path, results: list[dict], scoring: str | None = None,
                  other_scoring: str | None = None) -> float:  # fmt: skip
    """R1-V's output file ``{"accuracy", "results"}``; returns the accuracy, computed from ``results`` alone.

    With ``scoring`` (the rule behind ``is_correct``) the file also says ``scoring``, ``other_scoring`` and
    ``other_accuracy`` (from each result's ``is_correct_<other>``; both None for a task with one rule). R1-V's
    readers only look at ``accuracy`` and ``results``, so the file stays R1-V's format.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    value = accuracy(results)
    payload: dict[str, Any] = {"accuracy": value}
    if scoring is not None:
        other = accuracy(results, rule_flag(other_scoring)) if other_scoring else None
        payload |= {"scoring": scoring, "other_scoring": other_scoring, "other_accuracy": other}
    text = json.dumps(payload | {"results": results}, indent=2, ensure_ascii=False, default=str)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text + "\n", encoding="utf-8")
    tmp.replace(path)  # a crash mid-write never leaves a truncated results file
    return value


@dataclass
class RunResult:
    """One pass over the items: greedy (``seed`` None) or sampled with a seed.

    ``accuracy``/``correct`` are under ``scoring``; ``other_*`` under the task's other rule (None when it has one).
    """

    path: str
    accuracy: float
    correct: int
    total: int
    seed: int | None = None
    temperature: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    scoring: str = "strict"
    other_scoring: str | None = None
    other_accuracy: float | None = None
    other_correct: int | None = None

    def by_rule(self) -> dict[str, tuple[float, int]]:
        """``{rule: (accuracy, correct)}``, the selected rule first."""
        figures = {self.scoring: (self.accuracy, self.correct)}
        if self.other_scoring is not None and self.other_accuracy is not None:
            figures[self.other_scoring] = (self.other_accuracy, self.other_correct)
        return figures


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def scoring_note(rules: list[str], task: str) -> str:
    """One sentence naming the rules shown: which one is the results file's ``accuracy`` and what each means."""
    from suzak.eval.tasks import SCORING_RULES, TASKS

    first, *others = rules
    if task in TASKS and TASKS[task].scorers.get(first) == "episode":  # no answer to parse: the environment scores
        return (
            "Scoring: each episode by its environment; the results file's `accuracy` is the share of episodes "
            f"won (success), beside each one's reward and actions. {task} has no R1-V scoring rule."
        )
    text = f"Scoring: **{first}** ({SCORING_RULES[first]}) is the results file's `accuracy`"
    text += "".join(f"; {rule} is {SCORING_RULES[rule]}" for rule in others) + "."
    if "r1v" not in rules:
        has_r1v = task in TASKS and "r1v" in TASKS[task].rules
        text += " This run has no r1v figure." if has_r1v else f" {task} has no R1-V scoring rule."
    return text


def reference_lines(figures: dict[str, float | None], *, task_column: bool = False, heading: str = "##",
                    subject: str = "this run") -> list[str]:  # fmt: skip
    """The published numbers of each task in ``figures``, each row beside that task's ``r1v`` figure (None: the run
    has none, shown as –). R1-V scored its numbers with its own rule, so no other figure is ever put beside them."""
    tasks = [task for task in figures if references_for(task)]
    if not tasks:
        return []
    lead = "| task " if task_column else ""
    lines = ["", f"{heading} Published reference numbers (R1-V's scoring rule: compare them with the r1v figure only)",
             "", f"{lead}| model | base (%) | trained (%) | {subject}, r1v scoring (%) | setting | source |",
             "|---" * (6 + task_column) + "|"]  # fmt: skip
    for task in tasks:
        for ref in references_for(task):
            model = ref.model if ref.verified else f"{ref.model} **(UNVERIFIED)**"
            cell = f"| {task} " if task_column else ""
            lines.append(f"{cell}| {model} | {_fmt(ref.base)} | {_fmt(ref.trained)} | {_fmt(figures[task])} | "
                         f"{ref.setting} | {ref.source} |")  # fmt: skip
    if any(not r.verified for task in tasks for r in references_for(task)):
        lines += ["", "UNVERIFIED: quoted in a derived README, found in none of R1-V's sources."]
    return lines + [f"- {note}" for task in tasks for note in NOTES.get(task, ())]


def _run_cells(run: RunResult, rules: list[str]) -> str:
    """``accuracy | correct / N`` under each of ``rules`` (– where the run has no figure for one)."""
    figures = run.by_rule()
    cells = [f"{figures[r][0]:.2f} | {figures[r][1]} / {run.total}" if r in figures else "– | –" for r in rules]
    return " | ".join(cells)


def markdown_summary(task: str, model: str, greedy: RunResult, sampled: list[RunResult],
                     settings: dict[str, Any]) -> str:  # fmt: skip
    """The run's accuracy under each rule (greedy, and sampled mean ± std over seeds), then the published numbers
    beside the run's ``r1v`` figure."""
    rules = list(greedy.by_rule())
    header = "".join(f" {rule} (%) | {rule} correct / N |" for rule in rules)
    lines = [f"# {task}: {model}", "", f"| run |{header} file |", "|---" * (2 + 2 * len(rules)) + "|"]
    lines.append(f"| greedy | {_run_cells(greedy, rules)} | `{greedy.path}` |")
    for run in sampled:
        lines.append(f"| seed {run.seed}, T={run.temperature:g} | {_run_cells(run, rules)} | `{run.path}` |")
    if sampled:
        spreads = [mean_std([r.by_rule()[rule][0] for r in sampled if rule in r.by_rule()]) for rule in rules]
        cells = "".join(f" {mean:.2f} ± {std:.2f} (mean ± std) | |" for mean, std in spreads)
        lines.append(f"| sampled, {len(sampled)} seed(s) |{cells} |")
    lines += tool_lines([greedy, *sampled])
    lines += episode_lines([greedy, *sampled])
    lines += ["", scoring_note(rules, task), "", "Settings: " + ", ".join(f"{k}={v}" for k, v in settings.items())]
    r1v = greedy.by_rule().get("r1v")
    return "\n".join(lines + reference_lines({task: r1v[0] if r1v else None})) + "\n"


def tool_lines(runs: list[RunResult]) -> list[str]:
    """A table of each pass's tool calls (runs with ``--tools``; none otherwise): calls per row, rows with a call,
    failed calls by reason.

    >>> run = RunResult("r.json", 50.0, 1, 2, extra={"tools": {"tool_calls_per_row": 1.5, "rows_with_calls": 2,
    ...     "tool_calls": 3, "failed_calls": {"too_small": 1}}})
    >>> print("\\n".join(tool_lines([run])))
    <BLANKLINE>
    | run | tool calls per row | rows with a call | failed calls |
    |---|---|---|---|
    | greedy | 1.50 | 2 / 2 | 1 (too_small 1) |
    """
    shown = [run for run in runs if "tools" in run.extra]
    if not shown:
        return []
    lines = ["", "| run | tool calls per row | rows with a call | failed calls |", "|---|---|---|---|"]
    for run in shown:
        counts = run.extra["tools"]
        failed = counts["failed_calls"]
        reasons = f" ({', '.join(f'{k} {v}' for k, v in failed.items())})" if failed else ""
        name = "greedy" if run.seed is None else f"seed {run.seed}, T={run.temperature:g}"
        lines.append(f"| {name} | {counts['tool_calls_per_row']:.2f} | {counts['rows_with_calls']} / {run.total} | "
                     f"{sum(failed.values())}{reasons} |")  # fmt: skip
    return lines


def episode_lines(runs: list[RunResult]) -> list[str]:
    """A table of each pass's episodes by task (``miniwob``; none otherwise): success rate, mean reward, actions.

    >>> run = RunResult("r.json", 50.0, 1, 2, extra={"episodes": {"click-button": {"episodes": 2,
    ...     "success_rate": 0.5, "mean_reward": 0.5, "mean_actions": 1.5}}})
    >>> print("\\n".join(episode_lines([run])))
    <BLANKLINE>
    | run | task | episodes | success | mean reward | actions per episode |
    |---|---|---|---|---|---|
    | greedy | click-button | 2 | 50.0% | 0.500 | 1.50 |
    """
    shown = [run for run in runs if "episodes" in run.extra]
    if not shown:
        return []
    lines = ["", "| run | task | episodes | success | mean reward | actions per episode |", "|---|---|---|---|---|---|"]
    for run in shown:
        name = "greedy" if run.seed is None else f"seed {run.seed}, T={run.temperature:g}"
        for task, counts in run.extra["episodes"].items():
            lines.append(f"| {name} | {task} | {counts['episodes']} | {100 * counts['success_rate']:.1f}% | "
                         f"{counts['mean_reward']:.3f} | {counts['mean_actions']:.2f} |")  # fmt: skip
    return lines


GOLD_COLOUR, PREDICTED_COLOUR = (0, 170, 0), (230, 0, 0)


def draw_boxes(path: Path, images: list, results: list[dict], questions: list[str] | None = None,
               size: int = 256) -> Path:  # fmt: skip
    """A PNG of the first items' images (up to 8): each with its gold box in green marked "gold" and the model's
    answer in red marked "predicted" (the selected rule's extracted answer in original pixels: a box, or a point as a
    cross), the item's question under it; a legend on top says which colour is which. Written to ``path``."""
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.load_default(size=11)
    caption, legend = 30, 20  # pixels: two lines of question under each tile, the legend's strip on top
    tiles = []
    for i, (image, result) in enumerate(zip(images, results, strict=False)):
        scale = size / max(image.size)
        tile = Image.new("RGB", (size, size + caption), (255, 255, 255))
        tile.paste(
            image.convert("RGB").resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))))
        )
        draw = ImageDraw.Draw(tile)
        marks = [(box, GOLD_COLOUR, "gold") for box in result["ground_truth"]["boxes"]]
        if result.get("extracted_answer"):
            marks.append((result["extracted_answer"], PREDICTED_COLOUR, "predicted"))
        for mark, colour, name in marks:
            values = [v * scale for v in mark]
            if len(values) == 2:  # a point (a click): a cross
                x, y = values
                draw.line([x - 6, y, x + 6, y], fill=colour, width=2)
                draw.line([x, y - 6, x, y + 6], fill=colour, width=2)
                draw.text((x + 4, y + 2), name, fill=colour, font=font)
            elif len(values) == 4 and values[2] > values[0] and values[3] > values[1]:
                x1, y1, x2, y2 = values
                draw.rectangle([x1, y1, x2, y2], outline=colour, width=2)
                draw.text((x1 + 2, y1 + 1 if name == "gold" else max(y2 - 13, 0)), name, fill=colour, font=font)
        question = (questions[i] if questions and i < len(questions) else "") or ""
        words, lines = question.split(), [""]
        for word in words:  # wrap to the tile's width, two lines at most
            if draw.textlength(f"{lines[-1]} {word}".strip(), font=font) > size - 6 and lines[-1]:
                lines.append("")
            lines[-1] = f"{lines[-1]} {word}".strip()
        text = "\n".join(lines[:2]) + ("…" if len(lines) > 2 else "")
        draw.multiline_text((3, size + 2), text, fill=(0, 0, 0), font=font, spacing=2)
        tiles.append(tile)
    columns, rows = max(1, min(4, len(tiles))), max(1, -(-len(tiles) // 4))
    sheet = Image.new("RGB", (size * columns, legend + (size + caption) * rows), (255, 255, 255))
    draw = ImageDraw.Draw(sheet)
    draw.text((4, 4), "gold", fill=GOLD_COLOUR, font=font)
    draw.text((4 + draw.textlength("gold ", font=font), 4), "predicted (the model's answer)", fill=PREDICTED_COLOUR,
              font=font)  # fmt: skip
    for i, tile in enumerate(tiles):
        sheet.paste(tile, ((i % 4) * size, legend + (i // 4) * (size + caption)))
    sheet.save(path)
    return path
