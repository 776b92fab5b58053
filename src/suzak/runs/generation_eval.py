"""Accuracy by generation during training: a ``TrainerCallback`` for GRPO and SFT, text and image prompts.

Before the first step of a fresh run and every ``eval_steps`` it generates greedy answers for a fixed held-out sample with the evaluation engine
(:class:`suzak.eval.engine.HFEngine`: same pixel budget, same vision-token suppression; a run with tools answers
through the evaluation's tool loop, :mod:`suzak.eval.tool_loop`, and also logs ``eval/tool_calls``, calls per row),
scores them with the same reward function training uses, and

- logs ``eval/accuracy``, the share of answers the reward counts correct (:func:`suzak.scoring.rewards.counts_correct`:
  full marks for a 0/1 reward, IoU or ANLS >= 0.5 for a continuous one, or the recipe's ``eval_correct_at``), and
  ``eval/score``, the reward's mean over the rows (a mixture: also ``eval/<source>/accuracy`` and
  ``eval/<source>/score``), in the trainer's own log line of that step (it asks the trainer to log at that step and
  joins the line before the reporters see it), so W&B, TensorBoard and ``trainer_state.json`` get one row per
  step and no two writers ever claim the same W&B step;
- logs a W&B table of (step, prompt, output, gold, correct) when W&B is active;
- appends the same rows to ``<output_dir>/eval_samples.csv`` as they are produced.

Teacher-forced argmax "accuracy" overstates what a model does when it has to generate; this measures the latter.
"""

from __future__ import annotations

import asyncio
import csv
import inspect
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from suzak import SuzakError
from suzak.media.boxes import with_box_frame
from suzak.media.video import VideoBudget
from suzak.media.vision import PixelBudget
from suzak.scoring.parsing import message_text
from suzak.scoring.rewards import SOURCE_COLUMN, counts_correct, heldout_scorer

__all__ = ["GenerationEvalCallback"]

logger = logging.getLogger(__name__)

CSV_NAME = "eval_samples.csv"
CSV_COLUMNS = ["step", "index", "prompt", "output", "gold", "correct"]


def _mean(scores: list) -> float:
    """The mean score of the rows, a row without one (None) at 0.0 as :meth:`GenerationEvalCallback._correct`
    counts it wrong."""
    return sum(float(score or 0.0) for score in scores) / len(scores)


class GenerationEvalCallback(TrainerCallback):
    """Greedy generation on ``rows`` every ``eval_steps``, scored by ``scorer`` (a reward function, max 1.0) as the
    held-out eval scores it (:func:`suzak.scoring.rewards.heldout_scorer`: the same at every step)."""

    def __init__(
        self,
        rows: list[dict],
        scorer: Callable,
        processing_class,
        *,
        eval_steps: int,
        budget: PixelBudget | None = None,
        video_budget: VideoBudget | None = None,
        batch_size: int = 16,
        max_new_tokens: int = 256,
        name: str = "eval/accuracy",
        chat_template_kwargs: dict | None = None,
        opening_in_completion: bool = False,
        toolset=None,
        max_tool_calling_iterations: int | None = None,
        scorers: dict[str, Callable] | None = None,
    ):
        if eval_steps <= 0:
            raise ValueError(f"eval_steps must be positive, got {eval_steps}")
        self.rows = rows
        self.scorer = heldout_scorer(scorer) if scorer is not None else None  # None: episodes, scored by their env
        self.processing_class = processing_class
        self.eval_steps = eval_steps
        self.budget = budget
        self.video_budget = video_budget
        self.batch_size = batch_size
        self.max_new_tokens = max_new_tokens
        self.name = name
        self.chat_template_kwargs = chat_template_kwargs
        self.opening_in_completion = opening_in_completion  # outputs are scored after the template's opening
        # a run with tools answers through the evaluation's tool loop, as its rollouts do (suzak.eval.tool_loop)
        self.toolset = toolset if toolset is not None and toolset.names else None
        self.max_tool_calling_iterations = max_tool_calling_iterations
        # a mixture's held-out rows: each scored by its own source's scorer (the row's ``source``), each source's
        # accuracy logged as eval/<source>/accuracy beside the whole set's
        self.scorers = {source: heldout_scorer(func) for source, func in scorers.items()} if scorers else scorers
        self.figures: dict[str, float] = {}  # the last evaluation's figures beside the accuracy (tool calls per row)
        self._pending: dict[str, float] = {}
        self._pending_table: list[list] = []
        # The trainer's ``log`` (set by :func:`suzak.training.build.add_first`): with it, a fresh run is also evaluated
        # before its first step.
        self.trainer_log: Callable[[dict[str, float]], None] | None = None
        self._baseline_due = False

    # --- evaluation ----------------------------------------------------------------------------------------------

    def evaluate(self, model, step: int, state=None) -> tuple[float, list[list]]:
        """(accuracy, CSV rows) of greedy answers on the held-out rows with ``model`` as it is now; the mean scores
        go to :attr:`figures`."""
        from suzak.eval.engine import HFEngine

        engine = HFEngine(
            model, self.processing_class, self.budget, self.batch_size, self.max_new_tokens, progress=False
        )
        engine.use_template(self.chat_template_kwargs, self.opening_in_completion)  # as the training rewards read
        if self.video_budget is not None:
            engine.use_video_budget(self.video_budget)  # training's frames and frame sizes
        family = getattr(getattr(model, "config", None), "model_type", None)
        engine.model_type = family  # (the tool loop's template and box frame)
        # boxes in the question ({box}) and the rewards' frame: each row as training puts it to the model
        rows = [with_box_frame(row, family, engine.budget) for row in self.rows]
        was_training = model.training
        model.eval()
        try:
            outputs, episodes = self._answer(engine, rows)
        finally:
            model.train(was_training)
        scores: list = [None] * len(rows)
        verdicts: list = [None] * len(rows)
        for i, episode in episodes.items():  # an episode's score is its environment's reward, correct when it succeeded
            scores[i], verdicts[i] = episode["reward"], bool(episode["success"])
        if episodes:
            self.figures["eval/episode_actions"] = _mean([len(episode["steps"]) for episode in episodes.values()])
        answered = [i for i in range(len(rows)) if i not in episodes]
        if answered:
            found = self._scores([rows[i] for i in answered], [outputs[i] for i in answered], state)
            for i, score in zip(answered, found, strict=True):
                scores[i], verdicts[i] = score, self._correct(rows[i], score)
        table = [
            [step, i, message_text(row["prompt"]), output, row.get("solution"), verdict]
            for i, (row, output, verdict) in enumerate(zip(rows, outputs, verdicts, strict=True))
        ]
        correct = [r[-1] for r in table]
        self._keep_means(rows, scores, correct)
        return _mean(correct), table

    def _answer(self, engine, rows: list[dict]) -> tuple[list[str], dict[int, dict]]:
        """Each row's output, and the episodes among them by row index (scored by their environment): rows without
        tools answered by ``engine``, the others through the evaluation's tool loop as their rollouts are, with the
        run's tools (a mixture with tools per source: the row's source's). A tool-less source's rows of such a
        mixture go through the loop too, with no tools, as TRL's loop runs them in training: a call there is
        answered "not found" and the row answers again."""
        groups: dict[int, tuple[Any, list[int]]] = {}
        for i, row in enumerate(rows):
            toolset = self.toolset.for_source(row.get(SOURCE_COLUMN)) if self.toolset is not None else None
            toolset = toolset if toolset is not None and (toolset.names or self.toolset.by_source) else None
            groups.setdefault(id(toolset), (toolset, []))[1].append(i)
        outputs: list[str] = [""] * len(rows)
        episodes: dict[int, dict] = {}
        calls: list[int] = []
        for toolset, positions in groups.values():
            part = [rows[i] for i in positions]
            if toolset is None:
                found = engine.generate(part)
            else:
                from suzak.eval.tool_loop import ToolLoop, episodes_of

                records = ToolLoop(engine, toolset, self.max_tool_calling_iterations).generate(part)
                found = [record["model_output"] for record in records]
                calls += [record["tool_calls"] for record in records]
                episodes.update(zip(positions, episodes_of(records) or [], strict=False))
            for i, output in zip(positions, found, strict=True):
                outputs[i] = output
        if calls:
            self.figures["eval/tool_calls"] = sum(calls) / len(calls)
        return outputs, episodes

    def _keep_means(self, rows: list[dict], scores: list, correct: list[bool]) -> None:
        """The mean score of all rows (``eval/score``) and each mixture source's accuracy and mean score
        (``eval/<source>/accuracy``, ``eval/<source>/score``; an episode source's: its episodes' success and reward),
        kept in :attr:`figures`."""
        self.figures["eval/score"] = _mean(scores)
        sources = dict.fromkeys(row.get(SOURCE_COLUMN) for row in rows) if self.scorers is not None else {}
        for source in sources:
            mine = [i for i, row in enumerate(rows) if row.get(SOURCE_COLUMN) == source]
            if source is not None and mine:
                self.figures[f"eval/{source}/accuracy"] = _mean([correct[i] for i in mine])
                self.figures[f"eval/{source}/score"] = _mean([scores[i] for i in mine])

    def _correct(self, row: dict, score) -> bool:
        """A held-out answer is correct at its reward's threshold (:func:`suzak.scoring.rewards.counts_correct`):
        full marks for a 0/1 reward, IoU or ANLS >= 0.5, a judge's P(yes) above one half, or the recipe's."""
        scorer = self.scorers.get(row.get(SOURCE_COLUMN), self.scorer) if self.scorers else self.scorer
        return counts_correct(scorer, score)

    def _scores(self, rows: list[dict], outputs: list[str], state=None) -> list:
        """Each output's score by the scorer of its row (a mixture: its source's), called as training calls it: every
        column of the rows (images and clips included: a reward may look at the picture), ``trainer_state``, and a
        conversation's completion as the assistant message TRL hands over. A reward that raises or returns what
        training could not use stops the run in one line (:class:`suzak.trl_internals.rewards.RewardFault`, as a failed
        reward does in a training step). What it logs with ``log_metric`` (a judge's ``judge/calls``, ``judge/seconds``,
        ``judge/failed``) is logged beside the accuracy as ``eval/<name>`` (a mixture: ``eval/<source>/<name>``);
        its ``log_extra`` columns are not."""
        from suzak.runs.streams import row_id
        from suzak.trl_internals.rewards import RewardFault, RewardGuard, reward_call_kwargs, reward_name

        groups = {None: list(range(len(rows)))}
        if self.scorers:
            groups = {}
            for i, row in enumerate(rows):
                groups.setdefault(row.get(SOURCE_COLUMN), []).append(i)
        names = [
            f"{found[0]} {found[1]}" if (found := row_id(row)) else f"held-out row {i}" for i, row in enumerate(rows)
        ]
        scores: list = [None] * len(rows)
        step = getattr(state, "global_step", 0)
        for source, positions in groups.items():
            scorer = self.scorer if source is None else self.scorers.get(source)
            if scorer is None:  # no reward, and an environment that did not keep its rows' episodes
                where = "its held-out rows" if source is None else f"the held-out rows of source {source!r}"
                raise SuzakError(f"no reward scores {where} and its environment keeps no episodes (a "
                                 "ScreenEnvironment): name a reward, or set eval_rows to 0")  # fmt: skip
            part = [rows[i] for i in positions]
            completions = [outputs[i] for i in positions]
            if isinstance(part[0]["prompt"], list):  # a conversation: TRL hands each completion as its message
                completions = [[{"role": "assistant", "content": text}] for text in completions]
            guard = RewardGuard([names[i] for i in positions])
            metrics: dict[str, float] = {}  # what the reward logs of its own work (a judge's calls, time, failures)
            kwargs = reward_call_kwargs(part, completions) | {"trainer_state": state,
                                                              "log_metric": metrics.__setitem__}  # fmt: skip
            called = guard.wrap(scorer, reward_name(scorer))(**kwargs)
            found = asyncio.run(called) if inspect.isawaitable(called) else called
            if guard.failures:
                where = f"the held-out evaluation {'before step 1' if step == 0 else f'after step {step}'}"
                raise RewardFault(guard.failures[0].message(where)) from (guard.errors[0] if guard.errors else None)
            for i, score in zip(positions, found, strict=True):
                scores[i] = score
            where = "eval/" if source is None else f"eval/{source}/"
            self.figures.update({where + name: float(value) for name, value in metrics.items()})
        return scores

    def _append_csv(self, output_dir: str, table: list[list]) -> None:
        path = Path(output_dir) / CSV_NAME
        path.parent.mkdir(parents=True, exist_ok=True)
        new = not path.exists()
        with path.open("a", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            if new:
                writer.writerow(CSV_COLUMNS)
            writer.writerows(table)

    # --- trainer hooks -------------------------------------------------------------------------------------------

    def on_train_begin(self, args, state, control, **kwargs):
        self._baseline_due = state.global_step == 0 and self.trainer_log is not None  # a resumed run has its own
        return control

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        """A fresh run's step-0 accuracy, the baseline of the curve, logged as its own line at step 0.

        Before the first step rather than before ``train()`` or at ``on_train_begin``: only now is the model where
        training puts it (on its device, inside DeepSpeed) and every reporter set up (TensorBoard's writer is made
        in its own ``on_train_begin``; a line logged earlier would make it write elsewhere).
        """
        if not self._baseline_due:
            return control
        self._baseline_due = False
        self._evaluate_and_keep(args, state, model)
        self.trainer_log(dict(self._pending))  # every callback's on_log, reporters included, at step 0
        return control

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step % self.eval_steps != 0:
            return control
        self._evaluate_and_keep(args, state, model)
        control.should_log = True  # log at this very step, so the value joins this step's line
        return control

    def _evaluate_and_keep(self, args, state, model) -> None:
        accuracy, table = self.evaluate(model, state.global_step, state)
        if state.is_world_process_zero:
            self._append_csv(args.output_dir, table)
        logger.info("step %d: %s = %.4f on %d held-out rows", state.global_step, self.name, accuracy, len(table))
        self._pending = {self.name: accuracy, **self.figures}
        self._pending_table = table

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not self._pending or logs is None:
            return control
        logs.update(self._pending)
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(self._pending)
        self._log_wandb_table(args, state)
        self._pending, self._pending_table = {}, []
        return control

    def _log_wandb_table(self, args, state) -> None:
        if "wandb" not in (args.report_to or []) or not state.is_world_process_zero:
            return
        import wandb

        if wandb.run is not None:  # commit=False: joins the row the reporters write for this step
            wandb.log({"eval/samples": wandb.Table(columns=CSV_COLUMNS, data=self._pending_table)}, commit=False)
