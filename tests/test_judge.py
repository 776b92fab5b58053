"""The ``judge`` reward (docs/judge.md): a vision-language model that sees the row's image scores free-form answers,
from a local folder (here: the tiny model taught to answer "Is the image red?") or an OpenAI-compatible server. Its
cost is logged, identical questions of a batch are asked once, failures score None and stop the run past a bar, and
a judge that cannot tell right from wrong stops the run before step 1."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import socket
import subprocess
import sys
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
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


def squares(count: int, images: str = "aligned", seed: int = 5, size: int = 2 * FACTOR):
    from suzak.selftest.color import color_dataset

    return list(color_dataset(count, seed, images, size))


def called_as_trl_calls(reward, rows: list[dict], completions: list[str], metrics: dict | None = None) -> list:
    """``reward`` with what GRPOTrainer hands a reward for ``rows`` (one completion each), awaited."""
    from suzak.trl_internals.rewards import reward_call_kwargs

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
    assert all(float(row["judge/judged/calls"]) > 0 for row in steps if row.get("sources/judged/rows"))
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

    judge, yes = JudgeSettings("j"), {"Yes": math.log(0.8), "No": math.log(0.2)}
    assert score_reply(judge, ("Yes", [("Yes", yes)])) == pytest.approx(0.8)
    assert score_reply(judge, ("red yes", [("red", yes), (" yes", {})])) == 1.0  # red's runners-up: not the verdict's
    assert score_reply(judge, ("The square is red, so no.", [])) == 0.0 and score_reply(judge, ("red", [])) is None


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


# --- a served judge (issue 67): an OpenAI-compatible fake that records what it is sent ------------------------------


class _FakeServer(BaseHTTPRequestHandler):
    """``/v1/chat/completions`` answering with ``tokens(text)``'s reply, each token with its top log-probabilities,
    and recording the size of every image it is sent (``sizes``)."""

    tokens: Callable[[str], list[tuple[str, dict[str, float]]]]
    sizes: list

    def do_POST(self):
        import base64
        import io

        from PIL import Image

        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        parts = request["messages"][0]["content"]
        text = next(part["text"] for part in parts if part["type"] == "text")
        for part in parts:
            if part["type"] == "image_url":
                data = base64.b64decode(part["image_url"]["url"].split(",", 1)[1])
                self.sizes.append(Image.open(io.BytesIO(data)).size)
        tokens = type(self).tokens(text)
        logprobs = {"content": [{"token": token, "logprob": top.get(token, 0.0), "bytes": None,
                                 "top_logprobs": [{"token": t, "logprob": v, "bytes": None} for t, v in top.items()]}
                                for token, top in tokens]} if request.get("logprobs") else None  # fmt: skip
        body = json.dumps({"id": "c", "object": "chat.completion", "created": 0, "model": request["model"],
                           "choices": [{"index": 0, "finish_reason": "stop", "logprobs": logprobs, "message": {
                               "role": "assistant", "content": "".join(token for token, _ in tokens)}}]}).encode()  # fmt: skip
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        return


@contextlib.contextmanager
def served_judge(tokens: Callable[[str], list]):
    """(base_url, sizes): a fake served judge replying ``tokens(question)``; ``sizes`` fills with each image's size."""
    import threading
    from http.server import ThreadingHTTPServer

    sizes: list = []
    handler = type("Judge", (_FakeServer,), {"tokens": staticmethod(tokens), "sizes": sizes})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/v1", sizes
    finally:
        server.shutdown()


def referee(question: str) -> list:
    """A judge that says yes where the candidate answer is the reference answer, as one token: "Yes" or "No"."""
    reference = re.search(r"Reference answer: (.*)", question).group(1).strip().lower()
    candidate = re.search(r"Candidate answer: (.*)", question).group(1).strip().lower()
    return [("Yes", {"Yes": -0.1, "No": -2.4})] if reference == candidate else [("No", {"No": -0.1, "Yes": -2.4})]


def test_p_yes_is_read_at_the_verdicts_own_token():
    """A served judge that answers "**No**" (first token ``**``, whose runners-up are Yes -2.5 and No -5.0) scored
    0.92 on every completion: P(yes) was read at the first token. It is read at the verdict's own token ("No"), and
    where no token's log-probabilities carry the verdict, the reply's word scores it (0 or 1), never a P(yes) that
    says otherwise."""
    from suzak.scoring.judge import JudgeSettings, score_reply

    bold_no = [("**", {"**": -0.1, "Yes": -2.5, "No": -5.0}), ("No", {"No": -0.05, "Yes": -3.0}), ("**", {"**": 0.0})]
    with served_judge(lambda question: bold_no) as (url, _):
        reward = resolve_reward("judge", {"model": "j", "base_url": url, "reference": False})
        scores = called_as_trl_calls(reward, squares(2), ["red", "blue"])
    assert all(score < 0.1 for score in scores), scores
    judge = JudgeSettings("j")
    assert score_reply(judge, ("**No**", bold_no[:1])) == 0.0  # no token is the verdict: the word
    assert score_reply(judge, ('"Yes"', [('"', {"No": -0.1}), ("Yes", {"Yes": -0.7, "No": -0.9})])) > 0.5
    assert score_reply(judge, ("Yes", [("Yes", {"No": -0.1, "Yes": -2.0})])) == 1.0  # contradicts the word: the word
    assert score_reply(judge, ("\nred yes", [("\n", {}), ("red", {}), (" yes", {" yes": -0.2, " no": -1.8})])) > 0.5


def test_the_judge_sees_the_original_picture_at_its_own_budget(tmp_path, monkeypatch):
    """A served judge with a budget of 50176 pixels beside a policy at 3136 (300-pixel squares): in a training step
    it was shown the picture already fitted to the policy's budget (56x56), so it could never look closer than the
    policy. In the pre-flight, a training step and the held-out eval it now gets the original, fitted to its own
    budget (196x196)."""
    import csv

    from suzak.media.vision import PixelBudget
    from suzak.runs.generation_eval import GenerationEvalCallback
    from suzak.train import main

    monkeypatch.setenv("SUZAK_ENV_FILE", str(tmp_path / "absent.env"))
    with served_judge(referee) as (url, sizes):
        judge = {"model": "referee", "base_url": url, "max_pixels": 50176, "retries": 0}
        main(["--config", "recipes/demo.yaml", "--dataset_options", '{"num_rows": 24, "seed": 0, "size": 300}',
              "--rewards", "judge", "--reward_kwargs", json.dumps({"judge": judge}), "--eval_rows", "0",
              "--max_steps", "1", "--per_device_train_batch_size", "16", "--num_generations", "4",
              "--preflight_rows", "4", "--output_dir", str(tmp_path / "run")])  # fmt: skip
        with open(tmp_path / "run" / "metrics.csv", newline="") as file:
            step = next(row for row in csv.DictReader(file) if row.get("judge/calls"))
        assert float(step["judge/calls"]) > 0, step  # the training step asked it too, beside the pre-flight
        rows = squares(2, seed=7, size=300)
        held_out = GenerationEvalCallback(rows, resolve_reward("judge", judge), None, eval_steps=1)
        asked = len(sizes)
        held_out._scores(rows, ["red", "blue"])
    judges = PixelBudget(3136, 50176, factor=FACTOR).size(300, 300)  # (196, 196), where the policy's is (56, 56)
    assert len(sizes) > asked and set(sizes) == {judges}, sizes


def _train_stops_before_the_weights_load(argv: list[str], tmp_path, monkeypatch, recipe: str = "demo") -> str:
    """``suzak train``'s one ``error:`` line for ``argv`` (``recipes/<recipe>.yaml``, no held-out rows), raised before
    the policy's weights load (loading them fails the test)."""
    import suzak.training.build as build
    from suzak.train import main

    def loaded(*args, **kwargs):
        raise AssertionError("the policy's weights loaded before the judge's settings were checked")

    monkeypatch.setenv("SUZAK_ENV_FILE", str(tmp_path / "absent.env"))
    monkeypatch.setattr(build, "load_policy", loaded)
    with pytest.raises(SystemExit) as stop:
        main(["--config", f"recipes/{recipe}.yaml", "--eval_rows", "0", "--output_dir", str(tmp_path / "run"), *argv])
    message = str(stop.value.code)
    assert message.startswith("error: ") and "\n" not in message, message
    return message


@pytest.mark.parametrize("preflight_rows", ["0", "4"])
def test_a_judges_budget_below_its_own_min_is_one_line_before_the_weights_load(preflight_rows, tmp_path, monkeypatch):
    """A judge at ``max_pixels: 784`` (its own min_pixels 3136) stopped at step 1 with "need 0 < min_pixels <=
    max_pixels, got 3136 and 784" (whose budget?), or with the pre-flight on there, both after the weights load. It
    is one line naming the judge's setting before they load, whatever ``preflight_rows`` says; in a mixture naming
    the source."""
    judged = json.dumps({"judge": {"model": "j", "base_url": "http://127.0.0.1:8000/v1", "max_pixels": 784}})
    said = ("judge: max_pixels 784 is below the judge's min_pixels 3136 (the judge's own pixel budget, not the run's; "
            "its min_pixels is 3136 unless set)")  # fmt: skip
    line = _train_stops_before_the_weights_load(["--dataset_options", '{"num_rows": 16}', "--rewards", "judge",
                                                 "--reward_kwargs", judged, "--preflight_rows", preflight_rows],
                                                tmp_path, monkeypatch)  # fmt: skip
    assert line == f"error: {said}"
    sources = [{"name": "judged", "dataset": "color_squares", "options": {"num_rows": 16}, "rewards": ["judge"],
                "reward_kwargs": json.loads(judged)},
               {"name": "ruled", "dataset": "color_squares", "options": {"num_rows": 16}, "rewards": ["word_match"]}]  # fmt: skip
    line = _train_stops_before_the_weights_load(["--datasets", json.dumps(sources), "--preflight_rows",
                                                 preflight_rows], tmp_path, monkeypatch, "mixture_smoke")  # fmt: skip
    assert line == f"error: source 'judged': {said}"


@pytest.mark.parametrize("folder", ["/path/that/does/not/exist", "./judge_model"])
def test_a_local_judges_folder_that_does_not_exist_is_one_line(folder, tmp_path, monkeypatch):
    """A local judge (no base_url) whose folder does not exist read as a Hub repo-id error ("Repo id must be in the
    form ..."), after the weights loaded; offline, a Hub id that cannot be fetched likewise."""
    import suzak.data.hub as hub

    judged = json.dumps({"judge": {"model": folder, "reference": False}})
    line = _train_stops_before_the_weights_load(["--dataset_options", '{"num_rows": 16}', "--rewards", "judge",
                                                 "--reward_kwargs", judged, "--preflight_rows", "0"], tmp_path,
                                                monkeypatch)  # fmt: skip
    assert line == (f"error: judge: cannot load model {folder!r}: no such folder (check the judge's model, a local "
                    "folder without base_url)")  # fmt: skip
    from suzak.scoring.judge import check_judge

    monkeypatch.setattr(hub, "hub_reachable", lambda: False)
    with pytest.raises(SuzakError, match=r"^judge: cannot load model 'someone/judge-7b': the Hub is unreachable and it "
                       r"is not in the local cache\. .* set the judge's model, a local folder without base_url, to "
                       "that folder$"):  # fmt: skip
        check_judge({"model": "someone/judge-7b"})


def test_a_judge_read_after_the_templates_opening_is_pre_flighted_with_its_own_settings():
    """``opening_in_completion`` (Qwen3.5's thinking prompt) wraps each reward to read after ``<think>\\n``; the
    judge pre-flight then looked for the judge's settings on the wrapper and stopped with "judge: set model"."""
    from suzak.scoring.rewards import read_after_opening
    from suzak.training.checks import preflight

    with served_judge(referee) as (url, _):
        judged = resolve_reward("judge", {"model": "referee", "base_url": url, "answer_format": "think_answer"})
        preflight(squares(4), [read_after_opening(judged, "<think>\n")], "think_answer", num_rows=4,
                  opening="<think>\n")  # fmt: skip


def test_a_mixtures_judges_are_named_per_source_and_count_as_totals_over_ranks():
    """Two judged sources of a mixture logged one ``judge/calls`` (TRL's mean of the two); each source's judge now
    logs ``judge/<source>/...``, as :class:`suzak.trl_internals.rewards.RankTotal` values the trainer totals over the ranks
    (test_trl_contract.py and test_judge_figures_are_summed_over_two_ranks)."""
    from suzak.scoring.rewards import routed

    rows = squares(4)
    metrics: dict = {}
    with served_judge(referee) as (url, _):
        judged = resolve_reward("judge", {"model": "referee", "base_url": url})
        charts = routed(judged, "charts")
        kwargs = {"prompts": [row["prompt"] for row in rows], "completions": ["red", "blue", "red", "red"],
                  "image": [row["image"] for row in rows], "solution": [row["solution"] for row in rows],
                  "source": ["charts", "charts", "other", "charts"], "log_metric": metrics.__setitem__}  # fmt: skip
        asyncio.run(charts(**kwargs))
    assert sorted(metrics) == ["judge/charts/cached", "judge/charts/calls", "judge/charts/failed",
                               "judge/charts/seconds"], metrics  # fmt: skip
    from suzak.trl_internals.rewards import RankTotal

    assert metrics["judge/charts/calls"] == 3 and metrics["judge/charts/calls"].over == "sum"
    assert isinstance(metrics["judge/charts/seconds"], RankTotal) and metrics["judge/charts/seconds"].over == "max"


@pytest.mark.slow
def test_judge_figures_are_summed_over_two_ranks(tmp_path, run_env):
    """torchrun, 2 CPU ranks (gloo): rank 0 logged 3 judge calls and 2.0 s, rank 1 5 calls and 1.5 s, a third name
    on rank 1 alone; after :meth:`~suzak.trl_internals.hooks.GRPOHooks.total_over_ranks` TRL's flush (its mean over the
    ranks' values) logs the sums and the max on both ranks, where it logged 4 calls before."""
    from conftest import run_ok

    run_ok([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "tests/rank_totals.py",
            str(tmp_path)], run_env, timeout=600)  # fmt: skip
    for rank in (0, 1):
        logged = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert logged == {"judge/a/calls": 8.0, "judge/a/seconds": 2.0, "judge/b/calls": 4.0}, logged


def _squares_without_gold(folder: Path, count: int = 16) -> Path:
    """A JSONL file of red and blue squares with a question and no gold answer (rows for a reference-free judge)."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(count):
        Image.new("RGB", (56, 56), (255, 0, 0) if i % 2 else (0, 0, 255)).save(folder / f"{i}.png")
        lines.append(json.dumps({"image": f"{i}.png", "problem": "What color is the image?"}) + "\n")
    (folder / "rows.jsonl").write_text("".join(lines))
    return folder / "rows.jsonl"


@pytest.mark.parametrize("preflight_rows", ["0", "4"])
def test_a_reference_free_judge_trains_on_rows_without_a_gold_answer(preflight_rows, tmp_path, monkeypatch):
    """``reference: false`` still needed a gold answer on every path: the JSONL builder refused a line without one,
    the pre-flight wanted a ``solution`` column, and in a mixture (a gold column from the other source, None in the
    judged one's rows) the judge read the missing gold at step 1 ("gold solution is None"). A gold-less source now
    trains, alone and beside a rule-scored one, pre-flight on or off; a rule reward on gold-less rows is one line
    naming the file's line before the weights load."""
    import csv

    from suzak.train import main

    rows = _squares_without_gold(tmp_path / "data")
    monkeypatch.setenv("SUZAK_ENV_FILE", str(tmp_path / "absent.env"))
    with served_judge(lambda question: [("Yes", {"Yes": -0.1, "No": -2.4})]) as (url, _):
        judge = {"model": "j", "base_url": url, "reference": False, "retries": 0}
        main(["--config", "recipes/demo.yaml", "--dataset_name", str(rows), "--rewards", "judge", "--reward_kwargs",
              json.dumps({"judge": judge}), "--eval_rows", "4", "--max_steps", "1", "--per_device_train_batch_size",
              "8", "--num_generations", "4", "--max_completion_length", "8", "--preflight_rows", preflight_rows,
              "--output_dir", str(tmp_path / "alone")])  # fmt: skip
        sources = [{"name": "judged", "dataset": str(rows), "prompt_template": "plain", "rewards": ["judge"],
                    "reward_kwargs": {"judge": judge}},
                   {"name": "ruled", "dataset": "color_squares", "options": {"num_rows": 16}, "prompt_template": "plain",
                    "rewards": ["word_match"]}]  # fmt: skip
        main(["--config", "recipes/mixture_smoke.yaml", "--datasets", json.dumps(sources), "--eval_rows", "4",
              "--max_steps", "1", "--per_device_train_batch_size", "8", "--max_completion_length", "8",
              "--preflight_rows", preflight_rows, "--output_dir", str(tmp_path / "mixed")])  # fmt: skip
    for run in ("alone", "mixed"):
        with open(tmp_path / run / "metrics.csv", newline="") as file:
            steps = [row for row in csv.DictReader(file) if row.get("step_time")]
        assert len(steps) == 1, run
    line = _train_stops_before_the_weights_load(["--dataset_name", str(rows), "--rewards", "word_match"], tmp_path,
                                                monkeypatch)  # fmt: skip
    assert line.startswith(f"error: {rows} line 1, column solution: no gold answer, which word_match read(s)"), line
