"""The held-out eval's verdict (issue 67): a continuous reward's answer is correct at the reward's own threshold
(IoU and ANLS >= 0.5, as VLM-R1 / R1-V and DocVQA count them), not only at full marks; a recipe may set the threshold
(``eval_correct_at``, per source in a mixture); the mean score is logged beside the accuracy; and ``dynamic_iou``,
whose training threshold moves with the step, is scored the same at every step and by ``suzak heldout``."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from suzak import SuzakError
from suzak.scoring.rewards import iou, resolve_reward, routed

ROOT = Path(__file__).resolve().parents[1]
QWEN3_FRAME = {"family": "qwen3_vl", "width": 200, "height": 100, "resized_width": 192, "resized_height": 96}


def _callback(scorer, scorers=None):
    from suzak.runs.generation_eval import GenerationEvalCallback

    return GenerationEvalCallback([], scorer, None, eval_steps=1, scorers=scorers)


def test_a_near_perfect_box_is_a_correct_held_out_answer():
    """The brief's case: a box one unit short of the gold on Qwen3-VL's 0-1000 frame has IoU 0.998 and was counted
    wrong (only 1.0 counted): the held-out accuracy of an IoU-scored source was the rate of pixel-exact boxes."""
    [score] = iou(['{"bbox_2d":[0,0,499,1000]}'], ["[0,0,100,100]"], [QWEN3_FRAME])
    assert score == pytest.approx(0.998)
    assert _callback(iou)._correct({}, score)


@pytest.mark.parametrize(("reward", "kwargs", "verdicts"), [
    ("iou", None, {0.998: True, 0.5: True, 0.49: False, None: False}),  # VLM-R1 / R1-V's REC accuracy
    ("dynamic_iou", {"answer_format": "think_answer"}, {0.6: True, 0.49: False}),  # scored as iou (below)
    ("anls", {"threshold": 0.4}, {0.5: True, 0.49: False}),  # DocVQA's: within its tolerance
    ("box_f1", None, {0.5: True, 0.49: False}),
    ("box_map", None, {0.5: True, 0.49: False}),
    ("word_match", None, {1.0: True, 0.998: False}),  # a 0/1 reward: full marks, as before
    ("rec_accuracy", None, {1.0: True, 0.0: False}),
    ("judge", {"model": "j"}, {0.7: True, 0.5: False}),  # a judge's P(yes): above one half, as before
])  # fmt: skip
def test_each_reward_counts_an_answer_correct_at_its_own_threshold(reward, kwargs, verdicts):
    scorer = resolve_reward(reward, kwargs)
    alone, mixed = _callback(scorer), _callback(scorer, scorers={"a": routed(scorer, "a")})
    assert {score: alone._correct({}, score) for score in verdicts} == verdicts
    assert {score: mixed._correct({"source": "a"}, score) for score in verdicts} == verdicts


class _Model:
    """What the held-out eval reads off a model besides the engine's answers: its family (the box frame)."""

    training = False

    def __init__(self, family: str = "qwen2_5_vl"):
        self.config = SimpleNamespace(model_type=family)

    def eval(self):
        return self

    def train(self, mode=True):
        return self


def _answering(answer):
    """An engine class that answers each row with ``answer(row)`` in place of the HF engine's greedy generation."""

    class Engine:
        def __init__(self, model, processing_class, budget=None, *args, **kwargs):
            self.budget = budget

        def use_template(self, *args):
            pass

        def use_video_budget(self, budget):
            pass

        def generate(self, rows):
            return [answer(row) for row in rows]

    return Engine


def graded(completions, **kwargs):
    """A user's continuous reward: the answer is its own score; it declares its threshold as the registry's do."""
    return [float(c) for c in completions]


graded.correct_at = 0.5


def test_the_held_out_eval_logs_the_mean_score_beside_the_accuracy(monkeypatch):
    """eval/score (and eval/<source>/score) is the mean reward over the held-out rows; eval/accuracy the share of
    rows at the reward's threshold."""
    from suzak.runs.generation_eval import GenerationEvalCallback

    monkeypatch.setattr("suzak.eval.engine.HFEngine", _answering(lambda row: row["solution"]))
    rows = [{"prompt": "q", "solution": s, "source": src} for s, src in [("0.9", "a"), ("0.3", "a"), ("0.6", "b")]]
    callback = GenerationEvalCallback(rows, graded, None, eval_steps=1)
    accuracy, table = callback.evaluate(_Model("text"), step=3)
    assert accuracy == pytest.approx(2 / 3) and [row[-1] for row in table] == [True, False, True]
    assert callback.figures["eval/score"] == pytest.approx(0.6)
    mixed = GenerationEvalCallback(rows, graded, None, eval_steps=1, scorers={"a": graded, "b": graded})
    mixed.evaluate(_Model("text"), step=3)
    assert mixed.figures["eval/a/accuracy"] == 0.5 and mixed.figures["eval/a/score"] == pytest.approx(0.6)
    assert mixed.figures["eval/b/accuracy"] == 1.0 and mixed.figures["eval/b/score"] == pytest.approx(0.6)


COLOUR = {"name": "colour", "dataset": "color_squares", "options": {"num_rows": 40, "seed": 0},
          "prompt_template": "plain", "rewards": ["word_match"]}  # fmt: skip
BOXES = {"name": "boxes", "dataset": "grounding_shapes", "options": {"num_rows": 20, "seed": 0, "max_side": 900},
         "prompt_template": "rec", "rewards": ["iou"]}  # fmt: skip


# --- a recipe's threshold ------------------------------------------------------------------------------------------

TWO = [COLOUR, BOXES | {"eval_correct_at": 0.75}]


@pytest.mark.parametrize("value", [0, 1.5, "high", True, float("nan")])
def test_a_bad_threshold_is_one_line_naming_the_source_or_the_flag(value):
    from suzak.data.mixture import parse_sources
    from suzak.training.configs import SuzakArguments

    assert [s.eval_correct_at for s in parse_sources(TWO)] == [None, 0.75]
    with pytest.raises(
        SuzakError, match=r"^datasets\[1\] \('boxes'\): eval_correct_at .* must be a number in \(0, 1\]"
    ):
        parse_sources([TWO[0], {**TWO[1], "eval_correct_at": value}])
    with pytest.raises(SuzakError, match=r"^--eval_correct_at .* must be a number in \(0, 1\]"):
        SuzakArguments(eval_correct_at=value)


def test_a_one_dataset_threshold_beside_a_mixture_is_one_line(tmp_path):
    from suzak.training.configs import parse_args

    recipe = tmp_path / "mix.yaml"
    recipe.write_text(yaml.safe_dump({"model_name_or_path": "tiny", "datasets": TWO, "eval_correct_at": 0.9,
                                      "output_dir": str(tmp_path / "out")}))  # fmt: skip
    with pytest.raises(SuzakError, match=r"and eval_correct_at is set beside them"):
        parse_args(["--config", str(recipe)])


# --- training's eval and suzak heldout: the same verdicts at every step --------------------------------------------


def _near_box(row) -> str:
    """The row's gold box in its model frame with the right edge pulled in: IoU about 0.9 (a box answer), or the gold
    word (a colour row)."""
    from suzak.media.boxes import BoxFrame, render_boxes
    from suzak.scoring.parsing import gold_answer, gold_boxes

    gold = gold_answer(row["solution"])
    if not gold_boxes(gold):
        return gold
    frame = BoxFrame.from_dict(row["box_frame"])
    x1, y1, x2, y2 = frame.to_model(gold_boxes(gold)[0])
    return render_boxes([[x1, y1, x1 + round((x2 - x1) * 0.9), y2]], frame.spec.form)


def _recipe(tmp_path, model_dir, change: dict, base: str = "recipes/grounding_smoke.yaml") -> str:
    recipe = (
        yaml.safe_load((ROOT / base).read_text())
        | {"model_name_or_path": str(model_dir), "output_dir": str(tmp_path)}
        | change
    )
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return str(path)


def _training_eval(recipe: str, step: int, max_steps: int) -> tuple[float, dict, list]:
    """The held-out eval as training builds it (suzak.training.build.grpo_trainer) and runs it at ``step``."""
    from suzak.training.build import RunInputs, build_datasets, eval_callback
    from suzak.training.configs import parse_args

    suzak_args, args, model_args = parse_args(["--config", recipe])
    inputs = RunInputs.read(suzak_args, model_args)
    _, heldout = build_datasets(suzak_args, args, inputs)
    callback = eval_callback(suzak_args, args, heldout, inputs.scorer, None, inputs.budget, inputs.video_budget,
                             None, inputs.scorers)  # fmt: skip
    accuracy, table = callback.evaluate(_Model(), step, SimpleNamespace(global_step=step, max_steps=max_steps))
    return accuracy, callback.figures, [row[-1] for row in table]


ONE_DATASET, MIXTURE = "recipes/grounding_smoke.yaml", "recipes/mixture_smoke.yaml"
DYNAMIC = {"rewards": ["dynamic_iou", "box_format"]}


@pytest.mark.parametrize(("base", "change", "accuracy", "figure"), [
    (ONE_DATASET, DYNAMIC, 1.0, "eval/score"),
    (MIXTURE, {"datasets": [COLOUR, BOXES | {"rewards": ["dynamic_iou"]}]}, 1.0, "eval/boxes/score"),
    (ONE_DATASET, DYNAMIC | {"eval_correct_at": 0.95}, 0.0, "eval/score"),  # a recipe's threshold
    (MIXTURE, {"datasets": [COLOUR, BOXES | {"rewards": ["dynamic_iou"], "eval_correct_at": 0.95}]}, 0.5,
     "eval/boxes/score"),  # a source's threshold: its rows wrong, the colour rows right
])  # fmt: skip
def test_training_eval_at_any_step_and_suzak_heldout_agree(base, change, accuracy, figure, tiny_model_dir, tmp_path,
                                                           monkeypatch):  # fmt: skip
    """Boxes at IoU ~0.9 scored by dynamic_iou (0.85 to 10 % of max_steps, 0.95 to 25 %, 0.99 after): the held-out
    verdicts were 1 before 10 %, 0 after, and 0 in ``suzak heldout`` (no step: the strictest). Now every step and
    ``suzak heldout`` agree: correct at IoU 0.5 (a recipe's ``eval_correct_at`` where set), the mean IoU as the score."""
    from suzak.training.heldout import evaluate_heldout

    monkeypatch.setattr("suzak.eval.engine.HFEngine", _answering(_near_box))
    monkeypatch.setattr("suzak.eval.models.load_eval_model", lambda path: (_Model(), None))
    recipe = _recipe(tmp_path, tiny_model_dir, change, base)
    found = evaluate_heldout(["--config", recipe, "--model_path", str(tiny_model_dir)])
    assert found["accuracy"] == pytest.approx(100 * accuracy)
    verdicts = [row["is_correct"] for row in found["results"]]
    for step in (0, 5, 20, 90):
        trained, figures, correct = _training_eval(recipe, step, max_steps=100)
        assert (trained, correct) == (pytest.approx(accuracy), verdicts), step
        assert figures[figure] == pytest.approx(found["figures"][figure]) == pytest.approx(0.9, abs=0.05)
