"""Re-scoring a results file in R1-V's format under both scoring rules: no model, no images.

R1-V's own logs (its ``src/eval/logs/``) and suzak's results files hold every model output and gold answer, so
either can be scored again with R1-V's rule (``r1v``) and suzak's (``strict``). That is how a figure becomes
comparable with R1-V's table, and how the stored ``accuracy`` of a file can be checked.

>>> results = [{"model_output": "<answer> 3 </answer>", "ground_truth": 3},
...            {"model_output": "<answer>3.0</answer>", "ground_truth": 3}]
>>> scored = rescore_results(results, "superclevr")
>>> scored.accuracy, scored.other_scoring, scored.other_accuracy, scored.disagreements
(50.0, 'strict', 100.0, [1])
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from suzak import SuzakError
from suzak.eval.report import format_accuracy
from suzak.eval.tasks import SCORING_RULES, get_task, score_rules

__all__ = ["JSON_KEYS", "Rescored", "read_results", "rescore_file", "rescore_results"]

# The keys of ``--json OUT``, in order.
JSON_KEYS = ("task", "scoring", "accuracy", "correct", "total", "other_scoring", "other_accuracy", "disagreements")


@dataclass
class Rescored:
    """A results file scored again: the selected rule's figures, the other rule's, and where they disagree."""

    task: str
    scoring: str
    accuracy: float
    correct: int
    total: int
    other_scoring: str | None
    other_accuracy: float | None
    other_correct: int | None
    disagreements: list[int]  # indices into ``results`` where the two rules give different verdicts
    flags: dict[str, list[bool]] = field(default_factory=dict)  # rule -> is_correct of each result
    extracted: dict[str, list] = field(default_factory=dict)  # rule -> extracted_answer of each result
    stored_accuracy: float | None = None  # the file's own ``accuracy``, when it has one

    def as_json(self) -> dict:
        """The ``--json`` record: ``JSON_KEYS``, ``disagreements`` as a count."""
        values = {"disagreements": len(self.disagreements)}
        return {key: values.get(key, getattr(self, key)) for key in JSON_KEYS}

    def report(self, source: str) -> list[str]:
        """The lines the command prints; R1-V's ``Accuracy: XX.XX%`` line is the selected rule's."""
        stored = "" if self.stored_accuracy is None else f", stored accuracy {self.stored_accuracy:.2f}%"
        lines = [f"{source}: {self.total} results, task {self.task}{stored}",
                 f"{self.scoring} scoring ({SCORING_RULES[self.scoring]}): {self.correct} / {self.total}",
                 format_accuracy(self.accuracy)]  # fmt: skip
        if self.other_scoring is not None:
            lines.append(f"{self.other_scoring} scoring ({SCORING_RULES[self.other_scoring]}): "
                         f"{self.other_accuracy:.2f}% ({self.other_correct} / {self.total})")  # fmt: skip
            shown = ", ".join(map(str, self.disagreements[:10])) + (", …" if len(self.disagreements) > 10 else "")
            lines.append(f"The rules disagree on {len(self.disagreements)} result(s)"
                         + (f" (indices {shown})" if self.disagreements else ""))  # fmt: skip
        return lines


def read_results(path: str | Path) -> tuple[list[dict], float | None]:
    """The ``results`` list of an R1-V-format file and its stored ``accuracy``; bad input is one line naming the file
    (and the result's index)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SuzakError(f"{path}: no such file") from None
    except OSError as error:
        raise SuzakError(f"{path}: cannot read it ({error.strerror or error})") from None
    except UnicodeDecodeError as error:
        raise SuzakError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from None
    except json.JSONDecodeError as error:
        raise SuzakError(f"{path}: not JSON (line {error.lineno}, column {error.colno}: {error.msg})") from None
    if not isinstance(data, dict) or not isinstance(data.get("results"), list):
        raise SuzakError(f"{path}: not a results file: expected an object with a 'results' list "
                         "(R1-V's {\"accuracy\", \"results\"} format)")  # fmt: skip
    for index, result in enumerate(data["results"]):
        _check_result(path, index, result)
    stored = data.get("accuracy")
    return data["results"], float(stored) if isinstance(stored, int | float) and not isinstance(stored, bool) else None


def _check_result(path: Path, index: int, result) -> None:
    if not isinstance(result, dict):
        raise SuzakError(f"{path}: results[{index}] is a {type(result).__name__}, not an object")
    for key in ("model_output", "ground_truth"):
        if result.get(key) is None:
            raise SuzakError(f"{path}: results[{index}] has no {key!r}" + (" (null)" if key in result else ""))
    if not isinstance(result["model_output"], str):
        raise SuzakError(f"{path}: results[{index}]: 'model_output' is a {type(result['model_output']).__name__}, "
                         "not text")  # fmt: skip


def rescore_results(results: list[dict], task: str, scoring: str = "r1v", source: str = "results") -> Rescored:
    """Score every result's ``model_output`` against its ``ground_truth`` under each rule of ``task``."""
    spec = get_task(task)
    spec.scorer(scoring)  # the task must have the selected rule
    if not results:
        raise SuzakError(f"{source}: the 'results' list is empty; nothing to score")
    other = spec.other_rule(scoring)
    flags: dict[str, list[bool]] = {rule: [] for rule in spec.rules}
    extracted: dict[str, list] = {rule: [] for rule in spec.rules}
    for index, result in enumerate(results):
        try:
            verdicts = score_rules(spec, result["model_output"], result["ground_truth"])
        except (ValueError, TypeError) as error:
            raise SuzakError(f"{source}: results[{index}]: cannot score it: {error}") from None
        for rule, (answer, correct) in verdicts.items():
            flags[rule].append(bool(correct))
            extracted[rule].append(answer)
    total = len(results)
    disagreements = [] if other is None else [i for i in range(total) if flags[scoring][i] != flags[other][i]]
    correct = sum(flags[scoring])
    other_correct = None if other is None else sum(flags[other])
    return Rescored(task, scoring, 100.0 * correct / total, correct, total, other,
                    None if other is None else 100.0 * other_correct / total, other_correct, disagreements, flags,
                    extracted)  # fmt: skip


def rescore_file(path: str | Path, task: str, scoring: str = "r1v") -> Rescored:
    """``rescore_results`` of a results file, with its stored ``accuracy`` kept for comparison."""
    results, stored = read_results(path)
    rescored = rescore_results(results, task, scoring, source=str(path))
    rescored.stored_accuracy = stored
    return rescored
