"""The ``judge`` reward (docs/judge.md): a vision-language model that sees the row's image scores free-form answers,
from a local folder (here: the tiny model taught to answer "Is the image red?") or an OpenAI-compatible server. Its
cost is logged, identical questions of a batch are asked once, failures score None and stop the run past a bar, and
a judge that cannot tell right from wrong stops the run before step 1."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from suzak import SuzakError
from suzak.scoring.rewards import is_judge, resolve_reward
from suzak.selftest.judge import picture_judge_settings, train_picture_judge

ROOT = Path(__file__).resolve().parents[1]
FACTOR = 28  # the tiny Qwen2.5-VL's pixels per visual token along a side


@pytest.fixture(scope="module")
def picture_judge(tmp_path_factory) -> tuple[Path, float]:
    """The tiny Qwen2.5-VL taught to answer "Is the image red?" (and its accuracy on unseen squares)."""
    return train_picture_judge(tmp_path_factory.mktemp("picture-judge"))


def squares(count: int, images: str = "aligned", seed: int = 5):
    from suzak.selftest.color import color_dataset

    return list(color_dataset(count, seed, images, 2 * FACTOR))


def called_as_trl_calls(reward, rows: list[dict], completions: list[str], metrics: dict | None = None) -> list:
    """``reward`` with what GRPOTrainer hands a reward for ``rows`` (one completion each), awaited."""
    from suzak.trl_internals import reward_call_kwargs

    def log(name, value):
        if metrics is not None:
            metrics[name] = value

    conversation = [[{"role": "assistant", "content": text}] for text in completions]
    return asyncio.run(reward(**reward_call_kwargs(rows, conversation, log)))


def _a_local_judge_sees_the_picture_at_its_own_budget(picture_judge):
    """The judge's P(yes) comes from its first reply token's log-probabilities, about the image the reward hands it
    (each row's square): above one half for the red squares, below for the blue ones, on squares it never saw."""
    folder, accuracy = picture_judge
    assert accuracy >= 0.95, accuracy
    reward = resolve_reward("judge", picture_judge_settings(folder, FACTOR))
    rows = squares(8)
    scores = called_as_trl_calls(reward, rows, ["anything"] * 8)
    assert all((score > 0.5) == (row["solution"] == "red") for score, row in zip(scores, rows, strict=True)), scores
    assert all(0 < score < 1 for score in scores)  # a probability, not a parsed 0/1


def _the_reward_asks_each_distinct_question_once_and_logs_its_cost(picture_judge):
    folder, _ = picture_judge
    reward = resolve_reward("judge", picture_judge_settings(folder, FACTOR))
    assert is_judge(reward)
    group = [row for row in squares(4) for _ in range(4)]  # a group of 4 completions per prompt, as GRPO samples
    metrics: dict = {}
    scores = called_as_trl_calls(reward, group, ["red", "blue", "red", ""] * 4, metrics)
    assert metrics["judge/calls"] == 4 and metrics["judge/cached"] == 8 and metrics["judge/failed"] == 0, metrics
    assert metrics["judge/seconds"] > 0
    assert scores[3::4] == [0.0] * 4  # no answer: 0.0 without a call, as a rule reward scores a missing answer


def _a_judge_that_cannot_tell_right_from_wrong_stops_before_step_1(picture_judge, run_env, tmp_path):
    """``suzak train --rewards judge`` with a judge whose question holds no answer: it scores a right and a wrong
    answer alike, so the judge pre-flight stops the run in one line before the first step."""
    folder, _ = picture_judge
    kwargs = json.dumps({"judge": picture_judge_settings(folder, FACTOR)})
    result = subprocess.run([sys.executable, "-m", "suzak", "train", "--config", "recipes/demo.yaml", "--rewards",
                             "judge", "--reward_kwargs", kwargs, "--max_steps", "2", "--output_dir",
                             str(tmp_path / "run")], cwd=ROOT, env=run_env, capture_output=True, text=True,
                            timeout=900)  # fmt: skip
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and re.fullmatch(
        rf"error: judge pre-flight: 'judge' at {re.escape(str(folder))} scored the right answer above a wrong one on "
        r"0 of (\d+) rows \(mean (\S+) against \2\): it does not tell them apart \(check its base_url and model, and "
        r"the prompt\)", errors[0]), errors  # fmt: skip


def _a_judge_scores_its_own_source_in_a_mixture(picture_judge, run_env, tmp_path):
    """A mixture with a judged source beside a rule-scored one (``suzak train``, 2 steps): the judge (awaited by TRL,
    so its routed wrapper is awaited too) scores its own source's rows alone, its cost is logged, and the held-out
    eval counts its source's answers correct above one half. The picture judge asks about the picture alone, so it
    cannot pass the judge pre-flight (the check above): ``preflight_rows: 0`` here."""
    import csv

    import yaml

    from conftest import run_ok

    folder, _ = picture_judge
    judged = {"name": "judged", "dataset": "color_squares", "options": {"num_rows": 32, "seed": 1},
              "prompt_template": "plain", "rewards": ["judge"],
              "reward_kwargs": {"judge": picture_judge_settings(folder, FACTOR)}}  # fmt: skip
    ruled = {"name": "ruled", "dataset": "color_squares", "options": {"num_rows": 32, "seed": 2},
             "prompt_template": "plain", "rewards": ["word_match"]}  # fmt: skip
    recipe = yaml.safe_load((ROOT / "recipes" / "mixture_smoke.yaml").read_text())
    recipe |= {"datasets": [judged, ruled], "preflight_rows": 0, "max_steps": 2, "eval_steps": 2,
               "output_dir": str(tmp_path / "mixed")}  # fmt: skip
    (tmp_path / "mixed.yaml").write_text(yaml.safe_dump(recipe))
    run_ok([sys.executable, "-m", "suzak.train", "--config", str(tmp_path / "mixed.yaml")], run_env)
    with open(tmp_path / "mixed" / "metrics.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    steps = [row for row in rows if row.get("reward")]
    assert len(steps) == 2 and all(0 <= float(row["rewards/judged/judge/mean"]) <= 1 for row in steps), steps
    assert all(float(row["judge/calls"]) > 0 for row in steps if row.get("sources/judged/rows"))
    with open(tmp_path / "mixed" / "completions.csv", newline="") as file:
        completions = list(csv.DictReader(file))
    assert {row["source"] for row in completions} == {"judged", "ruled"}
    assert all((row["reward/judged/judge"] == "") == (row["source"] == "ruled") for row in completions)
    # 8 held-out squares of each source, each scored by its own source's first reward (the untrained policy's greedy
    # answers are blank, which a judge scores 0 without a call: which scores count is the unit test below)
    evals = [row for row in rows if row.get("eval/accuracy")]
    # the judge's own figures of each evaluation (calls, time), beside the accuracy, under the source's name
    assert all(float(row["eval/judged/judge/calls"]) >= 0 and float(row["eval/judged/judge/seconds"]) >= 0
               for row in evals)  # fmt: skip
    assert [row["step"] for row in evals] == ["0", "2"] and all(
        float(row["eval/accuracy"]) == pytest.approx((float(row["eval/judged/accuracy"]) +
                                                      float(row["eval/ruled/accuracy"])) / 2) for row in evals)  # fmt: skip


def test_the_local_picture_judge(picture_judge, run_env, tmp_path):
    """The checks on one trained picture judge (``picture_judge``, ~30 s), in one test so that it is trained once
    (dealt one at a time to two workers, tests sharing a module fixture train it on both)."""
    _a_local_judge_sees_the_picture_at_its_own_budget(picture_judge)
    _the_reward_asks_each_distinct_question_once_and_logs_its_cost(picture_judge)
    _a_judge_that_cannot_tell_right_from_wrong_stops_before_step_1(picture_judge, run_env, tmp_path)
    _a_judge_scores_its_own_source_in_a_mixture(picture_judge, run_env, tmp_path)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_an_unreachable_served_judge_scores_none_counts_it_and_stops_past_the_bar():
    """A served judge that does not answer (nothing listens at its URL): each call fails after its retries and
    scores None, counted in ``judge/failed``; past ``max_failed_fraction`` of a batch the reward raises one line
    naming the URL and what the client got."""
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    rows = squares(2)
    settings = {"model": "judge", "base_url": url, "retries": 0, "timeout_s": 5, "reference": False}
    metrics: dict = {}
    lenient = resolve_reward("judge", settings | {"max_failed_fraction": 1.0})
    assert called_as_trl_calls(lenient, rows, ["red", "blue"], metrics) == [None, None]
    assert metrics["judge/failed"] == 2 and metrics["judge/calls"] == 2
    strict = resolve_reward("judge", settings)
    with pytest.raises(SuzakError, match=rf"^the judge at {url} failed 2 of 2 calls, more than max_failed_fraction "
                       r"0.5 \(first: APIConnectionError: Connection error"):  # fmt: skip
        called_as_trl_calls(strict, rows, ["red", "blue"])


def test_settings_mistakes_are_one_line_before_any_call(monkeypatch):
    with pytest.raises(SuzakError, match=r"^reward 'judge' has no parameter 'verdcit'; its parameters: .*model"):
        resolve_reward("judge", {"model": "j", "verdcit": "grade"})
    reward = resolve_reward("judge", {"model": "j", "verdict": "stars"})
    with pytest.raises(SuzakError, match=r"^judge: verdict 'stars'; one of: yes_no, grade$"):
        called_as_trl_calls(reward, squares(1), ["red"])
    monkeypatch.delenv("JUDGE_KEY", raising=False)
    reward = resolve_reward("judge", {"model": "j", "base_url": "https://judge.example/v1", "api_key_env": "JUDGE_KEY"})
    with pytest.raises(SuzakError, match=r"^judge: JUDGE_KEY \(api_key_env\) is not set in the environment or \.env$"):
        called_as_trl_calls(reward, squares(1), ["red"])
    reward = resolve_reward("judge", {"model": "j", "reference": True})
    with pytest.raises(SuzakError, match=r"^judge: reference: true but the rows have no solution column"):
        asyncio.run(reward(prompts=["What color?"], completions=["red"], image=[None]))


def test_the_judge_sees_the_picture_in_image_column_and_a_missing_column_is_one_line():
    """``image_column`` shows the judge another picture than the policy's (the judge self-test's control: a grey
    square); without it the judge sees the row's own image; a column the rows lack stops in one line."""
    from suzak.scoring.judge import judge_items, judge_settings

    rows, grey = squares(2), squares(2, "grey")
    prompts, pictures = [row["prompt"] for row in rows], [row["image"] for row in rows]
    shown = judge_settings({"model": "j", "reference": False, "image_column": "judge_image"})
    items = judge_items(shown, prompts, ["red", "blue"], None, {"image": pictures,
                                                               "judge_image": [row["image"] for row in grey]})  # fmt: skip
    assert [item.image for item in items] == [row["image"] for row in grey]
    own = judge_items(judge_settings({"model": "j", "reference": False}), prompts, ["red", "blue"], None,
                      {"image": pictures, "judge_image": [row["image"] for row in grey]})  # fmt: skip
    assert [item.image for item in own] == pictures
    with pytest.raises(SuzakError, match=r"^judge: image_column 'judge_image' is not a column of the rows; their "
                       r"columns: image$"):  # fmt: skip
        judge_items(shown, prompts, ["red", "blue"], None, {"image": pictures})


def test_a_judge_that_names_what_it_sees_first_is_scored_by_its_last_verdict():
    """A reply that opens with its verdict is scored by P(yes) (or the word); a judge that first says what it sees
    ("blue no", the self-test's colour judge) by its last yes or no, never by its first token's P(yes)."""
    from suzak.scoring.judge import JudgeSettings, score_reply

    judge = JudgeSettings("j")
    assert score_reply(judge, ("Yes", 0.8)) == 0.8 and score_reply(judge, ("red yes", 0.1)) == 1.0
    assert score_reply(judge, ("The square is red, so no.", 0.9)) == 0.0 and score_reply(judge, ("red", 0.9)) is None


def test_the_held_out_eval_counts_a_judges_answer_correct_above_one_half():
    """A rule reward's full marks are 1.0; a judge's score is its P(yes): the held-out eval (``eval_rows``) counts it
    correct above one half, rule rewards at 1.0 as before."""
    from suzak.runs.generation_eval import GenerationEvalCallback

    judge, word_match = resolve_reward("judge", {"model": "j"}), resolve_reward("word_match")
    judged = GenerationEvalCallback([], judge, None, eval_steps=1)
    ruled = GenerationEvalCallback([], word_match, None, eval_steps=1)
    assert [judged._correct({}, s) for s in (0.7, 0.5, None)] == [True, False, False]
    assert [ruled._correct({}, s) for s in (1.0, 0.7)] == [True, False]
    # a mixture: each row by its source's scorer
    mixed = GenerationEvalCallback([], word_match, None, eval_steps=1, scorers={"a": judge, "b": word_match})
    assert [mixed._correct({"source": source}, 0.7) for source in ("a", "b")] == [True, False]


def test_the_judge_recipe_names_a_served_judge_whose_settings_resolve():
    """recipes/judge_qwen2.5vl_3b.yaml: the judge behind base_url, every setting known to the reward (a misspelt one
    would be one line here, as at the start of a run)."""
    from suzak.scoring.judge import judge_settings
    from suzak.scoring.rewards import resolve_rewards
    from suzak.training.configs import parse_args

    suzak_args, _, _ = parse_args(["--config", str(ROOT / "recipes" / "judge_qwen2.5vl_3b.yaml")])
    funcs = resolve_rewards(suzak_args.rewards, suzak_args.reward_kwargs)
    settings = judge_settings(funcs[0].keywords)
    assert is_judge(funcs[0]) and settings.base_url == "http://127.0.0.1:8000/v1" and settings.reference
    assert settings.answer_format == "think_answer" and settings.where == settings.base_url
