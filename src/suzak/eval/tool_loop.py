"""The tool loop of an evaluation (``python -m suzak.eval TASK --tools zoom``): each question answered in turns, as
``GRPOTrainer`` rolls out in a training run with tools, on either engine (HF or vLLM).

Per round, every unfinished row's conversation (its prompt, then its assistant and tool turns so far) is rendered by
the chat template with the tools' schemas (:func:`suzak.models.tool_calling.prepare_tool_calling` first, as training
does), the engine generates the next turn of all of them in one batch (the row's image(s) and the crops so far, one
placeholder each), and TRL's parser reads each turn's text and calls (:func:`suzak.trl_internals.tools.parse_turn`). A call
runs on the row's own environment (a fresh one per row: the zoom is reset with the row's ``original_image`` and
``box_frame`` exactly as training resets it) or on a tool function; its answer (a crop, or TRL's ``{"error": ...}``
text for a call the tool cannot answer) becomes a tool turn. A row ends with a turn that calls nothing, after
``max_tool_calling_iterations`` tool rounds, or when a tool turn would pass ``max_new_tokens``.

Token budget, as training's ``max_completion_length``: ``max_new_tokens`` holds the whole multi-turn completion (every
turn, the tool turns with their crops' visual tokens included); a turn is cut where the budget ends, and a tool turn
that would not fit is dropped and the row ends with its call unanswered (counted as ``dropped``).

What is scored is the last assistant turn's text, what training's rewards read (:func:`suzak.scoring.parsing.completion_text`);
the whole multi-turn completion is kept beside it for people (:func:`suzak.scoring.parsing.message_text`).

One difference from training: TRL builds each next turn by concatenating token ids (the prompt, the model's own ids,
the tool turn); here the conversation is rendered again each round, so a turn with a call reads as the template
writes the parsed call. The two agree when the model writes its calls the template's way.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from tqdm.auto import tqdm

from suzak import SuzakError
from suzak.media.boxes import with_box_frame
from suzak.models.episodes import ScreenEnvironment
from suzak.models.tool_calling import prepare_tool_calling
from suzak.models.tools import ZOOM_PROBLEMS, ToolSet, with_original_image
from suzak.scoring.parsing import completion_text, message_text

__all__ = ["FAILURES", "ToolLoop", "ToolRollout", "crops_per_prompt", "episode_counts", "episodes_of", "tool_counts"]

logger = logging.getLogger(__name__)

# Why a call failed, beside the zoom's own reasons: "error", the call raised without a zoom reason (an unknown tool
# name, arguments the tool does not take, a user tool's exception); "dropped", its tool turn would pass max_new_tokens
# (or vLLM's images per prompt) and the row ended with the call unanswered, as training drops it.
FAILURES = (*ZOOM_PROBLEMS, "error", "dropped")


@dataclass
class ToolRollout:
    """One row's multi-turn completion: ``messages`` (assistant and tool turns), its tools and its environment."""

    row: dict
    tools: list[Callable]
    environment: Any = None
    messages: list[dict] = field(default_factory=list)
    calls: int = 0
    failures: Counter = field(default_factory=Counter)
    start_length: int = 0  # prompt tokens before the first turn (visual tokens expanded)

    def conversation(self) -> dict:
        """The row with its prompt followed by the turns so far (crops inline in the tool turns)."""
        return {**self.row, "prompt": [*self.row["prompt"], *self.messages]}

    def record(self, opening: str = "") -> dict:
        """What the results keep: the scored answer, every turn as text, the calls and the failed calls by reason;
        for an episode (:class:`suzak.models.episodes.ScreenEnvironment`) its ``episode``: reward, success and
        actions, what the task is scored by."""
        failures = self.failures + Counter(getattr(self.environment, "problems", None) or {})
        record = {"model_output": opening + completion_text(self.messages),
                  "turns": opening + message_text(self.messages), "tool_calls": self.calls,
                  "tool_failures": {k: v for k, v in sorted(failures.items()) if v}}  # fmt: skip
        if isinstance(self.environment, ScreenEnvironment):
            outcome = self.environment.outcome
            record["episode"] = {"reward": float(outcome.reward), "success": bool(outcome.success),
                                 "done": bool(outcome.done),
                                 "steps": [step.as_dict() for step in self.environment.steps]}  # fmt: skip
        return record


def crops_per_prompt(max_iterations: int | None) -> int:
    """Crops one answer may add to its prompt, for vLLM's images-per-prompt limit: two calls a round (unbounded
    rounds: 8); a row that would pass it ends as a tool turn past the token budget does (``dropped``).

    >>> crops_per_prompt(1), crops_per_prompt(None)
    (2, 8)
    """
    return 8 if max_iterations is None else 2 * max_iterations


def tool_counts(records: Sequence[dict]) -> dict[str, Any]:
    """A pass's tool figures from its rows' records: calls per row (mean), rows with at least one call, failed calls
    by reason.

    >>> tool_counts([{"tool_calls": 2, "tool_failures": {"too_small": 1}}, {"tool_calls": 0, "tool_failures": {}}])
    {'tool_calls_per_row': 1.0, 'rows_with_calls': 1, 'tool_calls': 2, 'failed_calls': {'too_small': 1}}
    """
    failed: Counter = Counter()
    for record in records:
        failed.update(record.get("tool_failures") or {})
    calls = [record.get("tool_calls", 0) for record in records]
    return {"tool_calls_per_row": sum(calls) / len(calls) if calls else 0.0,
            "rows_with_calls": sum(1 for n in calls if n), "tool_calls": sum(calls),
            "failed_calls": dict(sorted(failed.items()))}  # fmt: skip


def episodes_of(records: Sequence[dict]) -> list[dict] | None:
    """Each record's ``episode`` (:meth:`ToolRollout.record`) when every record is an episode's, which its environment
    scores; None otherwise (answers, scored by a reward).

    >>> episodes_of([{"episode": {"reward": 1.0}}]), episodes_of([{"model_output": "4"}]), episodes_of([])
    ([{'reward': 1.0}], None, None)
    """
    if not records or not all("episode" in record for record in records):
        return None
    return [record["episode"] for record in records]


def episode_counts(results: Sequence[dict]) -> dict[str, dict[str, float]]:
    """A pass's episodes by MiniWoB++ task (or ``all`` for rows without one): episodes, success rate, mean reward,
    mean actions.

    >>> episode_counts([{"question": {"task": "a"}, "episode": {"reward": 1.0, "success": True, "steps": [{}]}},
    ...                 {"question": {"task": "a"}, "episode": {"reward": 0.0, "success": False, "steps": [{}, {}]}}])
    {'a': {'episodes': 2, 'success_rate': 0.5, 'mean_reward': 0.5, 'mean_actions': 1.5}}
    """
    tasks: dict[str, list[dict]] = {}
    for result in results:
        episode = result.get("episode")
        if episode is not None:
            question = result.get("question") if isinstance(result.get("question"), dict) else {}
            tasks.setdefault(str(question.get("task", "all")), []).append(episode)
    return {task: {"episodes": len(found), "success_rate": sum(e["success"] for e in found) / len(found),
                   "mean_reward": sum(e["reward"] for e in found) / len(found),
                   "mean_actions": sum(len(e["steps"]) for e in found) / len(found)}
            for task, found in sorted(tasks.items())}  # fmt: skip


class ToolLoop:
    """Multi-turn generation with ``toolset`` on ``engine`` (:class:`suzak.eval.engine.HFEngine` or ``VLLMEngine``):
    :meth:`generate` takes the rows an engine takes and returns one :meth:`ToolRollout.record` per row."""

    def __init__(self, engine: Any, toolset: ToolSet, max_iterations: int | None = None):
        prepare_tool_calling(engine.processing_class, engine.model_type)  # the template and parser training uses
        self.engine = engine
        self.toolset = toolset
        self.max_iterations = sys.maxsize if max_iterations is None else max_iterations
        self.tokenizer = getattr(engine.processing_class, "tokenizer", engine.processing_class)

    def start(self, row: dict) -> ToolRollout:
        """A row's rollout: a fresh environment reset with the row as training resets it (its box frame at this
        budget, its original image)."""
        if not isinstance(row.get("prompt"), list):
            raise SuzakError("--tools: a tool conversation needs chat-format prompts (this task's are plain text)")
        environment, tools = None, list(self.toolset.tools)
        if self.toolset.environment_factory is not None:
            from suzak.trl_internals.tools import environment_tools  # TRL's trainer stack: only where tools run

            environment = self.toolset.environment_factory()
            environment.reset(**with_original_image(with_box_frame(row, self.engine.model_type, self.engine.budget)))
            tools += environment_tools(environment)
        rollout = ToolRollout(row, tools, environment)
        rollout.start_length = self.engine.prompt_length(row, self.engine.prompt_text(row, tools))
        return rollout

    def generate(self, rows: Sequence[dict], temperature: float = 0.0, seed: int | None = None,
                 on_batch: Callable[[list[int], list[dict]], None] | None = None) -> list[dict]:  # fmt: skip
        """One record per row, in order; ``on_batch(row_indices, records)`` after each batch of rows."""
        if seed is not None:
            torch.manual_seed(seed)  # the HF engine's sampling; vLLM seeds each request
        records: list[dict] = []
        size = self.engine.batch_size
        with tqdm(total=len(rows), desc="generate (tools)", unit="q", disable=not self.engine.progress) as bar:
            for begin in range(0, len(rows), size):
                indices = list(range(begin, min(begin + size, len(rows))))
                rollouts = [self.start(rows[i]) for i in indices]
                self.roll(rollouts, temperature, seed)
                batch = [rollout.record(self.engine.opening) for rollout in rollouts]
                records += batch
                if on_batch is not None:
                    on_batch(indices, batch)
                bar.update(len(indices))
        return records

    def roll(self, rollouts: list[ToolRollout], temperature: float, seed: int | None) -> None:
        """Generate, call, generate again until every rollout has ended (see the module docstring)."""
        # TRL's trainer stack (~3 s of imports): not for a tool-less eval
        from suzak.trl_internals.tools import parse_turn

        active, rounds = list(rollouts), 0
        while active:
            rows = [rollout.conversation() for rollout in active]
            prompts = [self.engine.prompt_text(row, r.tools) for row, r in zip(rows, active, strict=True)]
            turns = self.engine.generate_ids(rows, prompts, temperature, seed)
            for rollout, row, prompt, ids in zip(active, rows, prompts, turns, strict=True):
                room = self.engine.max_new_tokens - self.used(rollout, row, prompt)
                prefix = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
                rollout.messages.append(parse_turn(self.tokenizer, ids[: max(room, 0)], prefix, rollout.tools))
            callers = [rollout for rollout in active if rollout.messages[-1].get("tool_calls")]
            if rounds >= self.max_iterations:
                break
            active = [rollout for rollout in callers if self.answer(rollout)]
            rounds += 1

    def used(self, rollout: ToolRollout, row: dict, prompt: str) -> int:
        """Completion tokens so far (every turn, crops' visual tokens included)."""
        return self.engine.prompt_length(row, prompt) - rollout.start_length

    def answer(self, rollout: ToolRollout) -> bool:
        """Run the last turn's calls and append their tool turns; False (the turns taken back, the row ended) when
        they would pass the token budget or the engine's images per prompt."""
        before = len(rollout.messages)
        for call in rollout.messages[-1]["tool_calls"]:
            rollout.messages.append(self.call(rollout, call))
        row = rollout.conversation()
        images = getattr(self.engine, "max_images_per_prompt", None)
        too_many = images is not None and len(self.engine.fitted_images(row)) > images
        if (
            too_many
            or self.used(rollout, row, self.engine.prompt_text(row, rollout.tools)) >= self.engine.max_new_tokens
        ):
            rollout.failures["dropped"] += len(rollout.messages) - before
            del rollout.messages[before:]
            return False
        return True

    def call(self, rollout: ToolRollout, call: dict) -> dict:
        """One call's tool turn: the tool's answer, or TRL's error text (counted by the zoom's reason, else
        ``error``)."""
        from suzak.trl_internals.tools import tool_message

        rollout.calls += 1
        function = call.get("function") or {}
        name = function.get("name", call.get("name", "unknown"))
        problems = getattr(rollout.environment, "problems", None)
        before = sum(problems.values()) if problems is not None else 0
        try:
            if call.get("type") != "function":
                raise ValueError(f"Unsupported tool call type: {call.get('type')}")
            tool = next((t for t in rollout.tools if t.__name__ == name), None)
            if tool is None:
                raise ValueError(f"Tool {name} not found.")
            result = tool(**function["arguments"])
            if inspect.isawaitable(result):
                result = asyncio.run(result)
        except Exception as error:  # noqa: BLE001 (any failure goes back to the model as the tool's error, as in TRL)
            problems = getattr(rollout.environment, "problems", None)
            if problems is None or sum(problems.values()) == before:
                rollout.failures["error"] += 1
            return tool_message(name, error=error)
        return tool_message(name, result)
