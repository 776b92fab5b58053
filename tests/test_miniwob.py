"""MiniWoB++ in a real Chromium (suzak.data.miniwob): episodes acted in the model's frame, the task's reward, a hung or
killed browser counted and restarted. setup.sh installs Debian's chromium and chromium-driver; these tests run them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time

import pytest

from suzak import SuzakError
from suzak.data.miniwob import MiniWoBEnvironment, _key_name, browser_paths, miniwob_rows, miniwob_tasks
from suzak.media.boxes import BoxFrame
from suzak.media.vision import PixelBudget

SEEN = PixelBudget(3136, 50176, factor=28)  # the first screen, as training fits it
SCREENS = PixelBudget(3136, 25088, factor=28)  # the next screens, tool_max_pixels


def _element_box(observation: dict, tag: str, text: str | None = None) -> tuple[float, float, float, float]:
    """The screen-pixel box of the first DOM element with ``tag`` (and ``text``) in a MiniWoB++ observation."""
    for element in observation["dom_elements"]:
        if element["tag"] == tag and (text is None or element["text"] == text):
            left, top = float(element["left"][0]), float(element["top"][0])
            return left, top, left + float(element["width"][0]), top + float(element["height"][0])
    raise AssertionError(f"no {tag} {text!r} on the screen")


def _button_call(environment: MiniWoBEnvironment, named: bool = True) -> str:
    """A click-button turn: a call clicking the button the task's utterance names (``named``) or another one, in the
    model's frame of the episode's screen."""
    observation = environment._task.observation
    name = re.search(r'"(.+?)"', observation["utterance"]).group(1)
    buttons = [e["text"] for e in observation["dom_elements"] if e["tag"] == "button"]
    target = name if named else next(text for text in buttons if text != name)
    x, y = environment._frame.click_point(_element_box(observation, "button", target))
    return f'<tool_call>\n{{"name": "click", "arguments": {{"x": {x}, "y": {y}}}}}\n</tool_call>'


def _start(environment: MiniWoBEnvironment, task: str, seed: int, family: str = "qwen2_5_vl"):
    row = miniwob_rows([task], [seed])[0]
    frame = BoxFrame.of(family, *row["image"].size, SEEN)
    environment.reset(**row, box_frame=frame.as_dict())
    return row, frame


@pytest.fixture
def environment():
    env = MiniWoBEnvironment.bound_to(SCREENS, 4)()
    yield env
    env._close()


def _browsers() -> set[int]:
    """Running chromedriver and chromium processes (not the zombies a container's init has yet to reap)."""
    found = [subprocess.run(["pgrep", "-x", name], capture_output=True, text=True).stdout.split()
             for name in ("chromedriver", "chromium")]  # fmt: skip
    return {int(pid) for pids in found for pid in pids if _state(int(pid)) not in ("Z", "X", None)}


def _state(pid: int) -> str | None:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_click_button_is_won_by_clicking_the_named_button_in_the_model_frame(environment, family):
    row, frame = _start(environment, "click-button", 3, family)
    assert row["utterance"] == 'Click on the "no" button.' and environment.problems["diverged"] == 0
    observation = environment._task.observation
    answer = environment.click(*frame.click_point(_element_box(observation, "button", "no")))
    assert answer == "The episode is over: success (reward 1)."
    assert environment.get_reward() == 1.0 and environment.restarts == 0


def test_enter_text_takes_a_click_typing_and_a_submit_on_the_next_screen(environment):
    row, frame = _start(environment, "enter-text", 1)
    word = re.search(r'"(.+?)"', row["utterance"]).group(1)
    first = environment._task.observation
    screen = environment.click(*frame.click_point(_element_box(first, "input_text")))[0]["image"]
    assert screen.size == SCREENS.fit(row["image"]).size  # the next screen at the tool budget
    environment.type_text(word)
    second = BoxFrame.of("qwen2_5_vl", *row["image"].size, SCREENS)  # the frame of the screen seen last
    submit = second.click_point(_element_box(environment._task.observation, "button", "Submit"))
    assert environment.click(*submit) == "The episode is over: success (reward 1)."
    assert [step.kind for step in environment.steps] == ["click", "type_text", "click"]


def test_a_wrong_answer_is_a_failure_and_unknown_keys_are_tool_errors(environment):
    _, frame = _start(environment, "click-button", 3)
    from suzak.models.tools import ToolError

    with pytest.raises(ToolError, match="unknown key 'Hyper'"):
        environment.press_key("Hyper")
    screen = environment.press_key("Enter")[0]["image"]
    frame = BoxFrame.of("qwen2_5_vl", 160, 210, SCREENS)  # the frame of the screen seen last
    assert screen.size == (frame.resized_width, frame.resized_height)
    other = next(e["text"] for e in environment._task.observation["dom_elements"] if e["tag"] == "button" and
                 e["text"] != "no")  # fmt: skip
    wrong = frame.click_point(_element_box(environment._task.observation, "button", other))
    answer = environment.click(*wrong)
    assert "failure (reward 0)" in answer and environment.get_reward() == 0.0
    assert environment.problems["refused"] == 1 and [step.kind for step in environment.steps] == ["press_key", "click"]
    assert _key_name("enter", ["<Enter>"]) == "<Enter>" and _key_name("ctrl+a", ["C-a"]) == "C-a"


def test_a_hung_browser_is_killed_counted_and_restarted(environment, monkeypatch):
    _start(environment, "click-button", 3)
    hung = environment._task
    hung.timeout_s = 2.0
    tree = list(hung._tree)  # its driver and Chromium
    monkeypatch.setattr(hung._env, "step", lambda action: time.sleep(30))  # the browser's own call hangs
    started = time.monotonic()
    answer = environment.click(5, 200)
    assert "did not answer click within 2 s" in answer and time.monotonic() - started < 20
    assert environment.problems["crashed"] == 1 and environment.restarts == 1 and environment.outcome.done
    monkeypatch.undo()
    hung.timeout_s = 30.0
    assert hung._env is None and tree and not set(tree) & _browsers()  # its browser is gone
    _, frame = _start(environment, "click-button", 3)  # the next episode starts a new browser, not held up by the
    answer = environment.click(*frame.click_point(_element_box(environment._task.observation, "button", "no")))
    assert answer.endswith("success (reward 1).") and time.monotonic() - started < 20  # hung call's thread


def test_a_killed_browser_ends_its_episode_and_the_next_one_restarts_it(environment):
    _start(environment, "click-button", 3)
    driver = environment._task._env.unwrapped.instance.driver.service.process
    driver.kill()
    driver.wait(timeout=10)
    answer = environment.click(5, 200)
    assert "the environment failed" in answer and environment.problems["crashed"] == 1
    _, frame = _start(environment, "click-button", 3)
    assert environment.problems["crashed"] == 0 and environment.restarts == 1
    answer = environment.click(*frame.click_point(_element_box(environment._task.observation, "button", "no")))
    assert answer.endswith("success (reward 1).")


def test_a_missing_browser_and_an_unknown_task_are_one_line(monkeypatch):
    assert {"click-button", "enter-text", "click-checkboxes"} <= set(miniwob_tasks())
    with pytest.raises(SuzakError, match=r"unknown task\(s\) click-buton"):
        miniwob_rows(["click-buton"], 1)
    monkeypatch.setenv("MINIWOB_CHROME_BINARY", "/nowhere/chromium")
    monkeypatch.setenv("MINIWOB_CHROMEDRIVER", "/nowhere/chromedriver")
    with pytest.raises(SuzakError, match="missing: chromium, chromedriver .*bash setup.sh installs"):
        browser_paths()
    monkeypatch.delenv("MINIWOB_CHROMEDRIVER")
    with pytest.raises(SuzakError, match="set both"):
        browser_paths()


def test_the_dataset_rows_hold_each_seeds_first_screen_and_its_prompt():
    rows = miniwob_rows(["click-button", "enter-text"], 2, start=10)
    assert [(row["task"], row["seed"]) for row in rows] == [("click-button", 10), ("enter-text", 10),
                                                            ("click-button", 11), ("enter-text", 11)]  # fmt: skip
    assert all(row["image"].size == (160, 210) for row in rows)
    text = rows[1]["prompt"][0]["content"][1]["text"]
    assert text.startswith(rows[1]["utterance"]) and "tools" in text
    assert os.environ.get("MINIWOB_CHROME_BINARY") is None or browser_paths()


def test_environments_swap_browsers_by_task_instead_of_starting_new_ones(monkeypatch):
    """TRL reuses its environments across batches whose rows mix tasks: a browser goes back to the process's idle
    ones and the next row of its task takes it."""
    from suzak.data import miniwob

    rows = {row["task"]: row for row in miniwob_rows(["click-button", "enter-text"], [1])}
    frame = BoxFrame.of("qwen2_5_vl", 160, 210, SEEN).as_dict()
    opened = []
    real_open = miniwob._Task._open
    monkeypatch.setattr(miniwob._Task, "_open", lambda self: opened.append(self.task) or real_open(self))
    first, second = (MiniWoBEnvironment.bound_to(SCREENS, 4)() for _ in range(2))
    try:
        rounds = [("click-button", "enter-text"), ("enter-text", "click-button")] * 4
        for number, (a, b) in enumerate(rounds):
            first.reset(**rows[a], box_frame=frame)
            second.reset(**rows[b], box_frame=frame)
            if number == 3:
                warm = list(opened)
        # at most two browsers per task (the one an environment holds, one idle), none started in the last four rounds
        assert len(opened) <= 4 and opened == warm
        assert first.problems["diverged"] == second.problems["diverged"] == 0
    finally:
        first._close()
        second._close()
        for browsers in miniwob._IDLE.values():
            for browser in browsers:
                browser.close()
        miniwob._IDLE.clear()


def test_grpo_trains_on_miniwob_episodes_whose_reward_reaches_the_advantages(tiny_model_dir, tmp_path):
    """recipes/miniwob_smoke.yaml through suzak's trainer and TRL's tool loop, with a scripted policy (the random-init
    tiny model rarely writes a call): in each group half the rollouts click the named button, in the model's frame of
    the first screen, and half click another one; MiniWoB++ scores each episode in Chromium, and its reward makes the
    group's advantages. The completions log holds each episode's actions."""
    import json

    import torch

    from suzak.training.build import grpo_trainer
    from suzak.training.configs import parse_args

    out = tmp_path / "run"
    trainer = grpo_trainer(*parse_args([
        "--config", "recipes/miniwob_smoke.yaml", "--model_name_or_path", str(tiny_model_dir), "--output_dir", str(out),
        "--dataset_options", '{"tasks": ["click-button"], "seeds": 4}', "--max_steps", "1",
        "--per_device_train_batch_size", "4", "--num_generations", "4", "--log_completions", "true"]))  # fmt: skip
    tokenizer = trainer.processing_class.tokenizer
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    advantages, calls = [], []

    def scripted(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        texts = []
        for i in range(len(prompt_ids)):
            if num_generations == 1:  # TRL's turn after the tool's answer: stop
                texts.append("Done.")
                continue
            calls.append(i % 2 == 0)
            texts.append(_button_call(trainer.environments[i], named=i % 2 == 0))
        return [tokenizer.encode(text, add_special_tokens=False) + [end] for text in texts], None

    trainer._generate_single_turn = scripted
    score = trainer._generate_and_score_completions

    def spy(inputs):
        batch = score(inputs)
        advantages.append(batch["advantages"])
        return batch

    trainer._generate_and_score_completions = spy
    rollouts = []
    trainer.completion_listeners.append(rollouts.extend)  # what completions.csv gets
    trainer.train()
    assert calls == [True, False] * 2
    rewards = [float(row["reward/MiniWoBEnvironment"]) for row in rollouts]
    assert rewards == [1.0, 0.0] * 2  # MiniWoB++'s verdicts in Chromium
    assert torch.equal(advantages[0].sign().cpu(), torch.tensor([1.0, -1.0] * 2))
    steps = [json.loads(row["episode_steps"]) for row in rollouts]
    assert all(len(s) == 1 and s[0]["kind"] == "click" for s in steps)
    log = next(entry for entry in trainer.state.log_history if "reward" in entry)
    assert float(log["tools/episodes"]) == float(log["tools/episode_actions"]) == len(calls)
    assert float(log["rewards/MiniWoBEnvironment/mean"]) == 0.5
    from suzak.runs.episodes import draw_episode, episode_steps

    kept = json.loads((out / "episodes" / "step-000001.json").read_text())  # the first group's best and worst
    assert episode_steps(out) == [1] and kept["instruction"].startswith("Click on the")
    assert [(r["rollout"] % 2, r["reward"], r["success"]) for r in kept["rollouts"]] == [(0, 1.0, True),
                                                                                          (1, 0.0, False)]  # fmt: skip
    assert [len(r["screens"]) for r in kept["rollouts"]] == [1, 1]  # the screen each click acted on
    strip = draw_episode(out)
    assert strip == out / "plots" / "episode-step-1.png" and strip.stat().st_size > 1000


def _script_the_eval_engine(monkeypatch) -> None:
    """The evaluation's HF engine answers each episode's first turn with a click on the named button (even seeds) or
    on another button (odd seeds), read from the episode's own browser, and "Done." after the tool's answer."""
    from suzak.eval import engine as engine_module
    from suzak.eval import tool_loop

    started = {}
    start = tool_loop.ToolLoop.start

    def spy_start(self, row):
        rollout = start(self, row)
        started[(row["task"], row["seed"])] = rollout
        return rollout

    def scripted(self, batch, prompts, temperature, seed):
        tokenizer = self.processing_class.tokenizer
        texts = []
        for row in batch:
            if row["prompt"][-1]["role"] != "user":  # after the tool's answer
                texts.append("Done.")
                continue
            environment = started[(row["task"], row["seed"])].environment
            observation = environment._task.observation
            named = re.search(r'"(.+?)"', observation["utterance"]).group(1)
            others = [e["text"] for e in observation["dom_elements"] if e["tag"] == "button" and e["text"] != named]
            frame = environment._frame
            if row["seed"] % 2 == 0:
                x, y = frame.click_point(_element_box(observation, "button", named))
            elif others:
                x, y = frame.click_point(_element_box(observation, "button", others[0]))
            else:  # every button says the name: a wrong answer is a click on the page below them
                x, y = frame.click_point((2, 205, 4, 207))
            texts.append(f'<tool_call>\n{{"name": "click", "arguments": {{"x": {x}, "y": {y}}}}}\n</tool_call>')
        end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        return [tokenizer.encode(text, add_special_tokens=False) + [end] for text in texts]

    monkeypatch.setattr(tool_loop.ToolLoop, "start", spy_start)
    monkeypatch.setattr(engine_module.HFEngine, "generate_ids", scripted)


def test_the_held_out_eval_during_training_scores_episodes_by_their_environment(tiny_model_dir, tmp_path,
                                                                                monkeypatch):  # fmt: skip
    """eval_rows on a miniwob run: the held-out episodes run through the tool loop in Chromium, each correct when it
    succeeded, its score its reward (not the recipe's first reward, which an episode run may not have)."""
    from suzak.training.build import grpo_trainer
    from suzak.training.configs import parse_args

    _script_the_eval_engine(monkeypatch)
    trainer = grpo_trainer(*parse_args([
        "--config", "recipes/miniwob_smoke.yaml", "--model_name_or_path", str(tiny_model_dir),
        "--output_dir", str(tmp_path / "run"), "--dataset_options", '{"tasks": ["click-button"], "seeds": 8}',
        "--eval_rows", "4", "--eval_steps", "1", "--max_steps", "1"]))  # fmt: skip
    callback = trainer.callback_handler.callbacks[0]
    seeds = [row["seed"] for row in callback.rows]
    accuracy, table = callback.evaluate(trainer.model, step=0)
    assert [row[-1] for row in table] == [seed % 2 == 0 for seed in seeds]
    assert accuracy == sum(seed % 2 == 0 for seed in seeds) / 4
    assert callback.figures["eval/score"] == accuracy and callback.figures["eval/episode_actions"] == 1.0


def test_suzak_eval_miniwob_scores_each_episode_by_its_environment(tiny_model_dir, tmp_path, monkeypatch):
    """`suzak eval --task miniwob`: each item an episode in Chromium, acted through the evaluation's tool loop on the
    HF engine (a scripted turn here: the named button on even seeds, another button on odd ones), scored by
    MiniWoB++'s verdict; the summary has a table by task."""
    from suzak.eval.runner import EvalConfig, evaluate

    _script_the_eval_engine(monkeypatch)
    output = tmp_path / "miniwob.json"
    config = EvalConfig(task="miniwob", model_path=str(tiny_model_dir), tasks=["click-button"], episodes=4,
                        data_seed=10, output_path=str(output), min_pixels=3136, max_pixels=12544, progress=False)  # fmt: skip
    assert config.tools == ["miniwob"] and config.max_tool_calling_iterations == 8
    report = evaluate(config)
    results = json.loads(output.read_text())["results"]
    assert [r["question"]["seed"] for r in results] == [10, 11, 12, 13]
    assert [r["is_correct"] for r in results] == [True, False, True, False]
    assert [r["episode"]["reward"] for r in results] == [1.0, 0.0, 1.0, 0.0]
    assert all(len(r["episode"]["steps"]) == 1 and r["tool_calls"] == 1 for r in results)
    assert report.greedy.accuracy == 50.0
    assert report.greedy.extra["episodes"]["click-button"] == {"episodes": 4, "success_rate": 0.5, "mean_reward": 0.5,
                                                               "mean_actions": 1.0}  # fmt: skip
    summary = output.with_suffix(".md").read_text()
    assert "| greedy | click-button | 4 | 50.0% | 0.500 | 1.00 |" in summary
    assert "Scoring: each episode by its environment" in summary and "parser" not in summary


def test_tasks_list_prints_the_tasks_and_ends(capsys):
    """``--tasks list`` answers on stdout and ends there, exit 0 (no ``error:`` line, no model loaded)."""
    from suzak.eval.cli import main

    main(["miniwob", "--model_path", "no/such/model", "--tasks", "list"])
    out = capsys.readouterr().out
    assert out.startswith("MiniWoB++ ships: ") and "click-button" in out and "enter-text" in out


@pytest.mark.parametrize(("flags", "message"), [
    ({"tasks": ["click-buton"]}, r"unknown task\(s\) click-buton"),
    ({"episodes": 0}, "--episodes must be at least 1"),
])  # fmt: skip
def test_bad_miniwob_eval_flags_are_one_line(tmp_path, flags, message):
    from suzak.eval.runner import EvalConfig

    with pytest.raises(SuzakError, match=message):
        EvalConfig(task="miniwob", model_path="tiny", **flags)
    with pytest.raises(SuzakError, match="--tasks/--episodes are miniwob's"):
        EvalConfig(task="gsm8k", model_path="tiny", tasks=["click-button"])


def test_a_mixture_trains_episodes_beside_single_turn_clicks_each_row_with_its_sources_tools(tiny_model_dir, tmp_path,
                                                                                             monkeypatch):  # fmt: skip
    """recipes/miniwob_mixture_smoke.yaml: a source of MiniWoB++ episodes (its own tools: the browser) beside
    single-turn clicks on app screens (no tools). Each row acts with its source's tools only: the episodes' prompts
    hold the tools' turn and their calls act in Chromium, scored by MiniWoB++ alone; the clicks' prompts have no
    tools' turn, a call there is a tool error, and click_accuracy alone scores them. The held-out eval answers each
    source as training does: the episodes through the tool loop, scored by their environment, the clicks in one turn,
    scored by their reward; a call there is "not found" and the row answers again, in training (TRL's loop) and
    in the held-out eval alike."""
    import math

    import torch

    from suzak.eval import engine as engine_module
    from suzak.eval import tool_loop
    from suzak.training.build import grpo_trainer
    from suzak.training.configs import parse_args

    out = tmp_path / "run"
    trainer = grpo_trainer(*parse_args([
        "--config", "recipes/miniwob_mixture_smoke.yaml", "--model_name_or_path", str(tiny_model_dir),
        "--output_dir", str(out), "--per_device_train_batch_size", "16", "--max_steps", "1",
        "--eval_rows", "2", "--eval_steps", "1", "--log_completions", "true"]))  # fmt: skip
    tokenizer = trainer.processing_class.tokenizer
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    prompts, advantages = {}, []

    def scripted(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        texts = []
        for i, ids in enumerate(prompt_ids):
            environment = trainer.environments[i]
            if num_generations == 1:  # TRL's turn after a tool's answer: stop
                texts.append("Done.")
                continue
            episode = isinstance(environment, MiniWoBEnvironment)
            prompts.setdefault(episode, []).append(tokenizer.decode(ids))
            if not episode:  # a click row calls the browser's tool: it has none
                texts.append('<tool_call>\n{"name": "click", "arguments": {"x": 1, "y": 1}}\n</tool_call>')
                continue
            texts.append(_button_call(environment, named=i % 2 == 0))
        return [tokenizer.encode(text, add_special_tokens=False) + [end] for text in texts], None

    trainer._generate_single_turn = scripted
    score = trainer._generate_and_score_completions

    def spy(inputs):
        batch = score(inputs)
        advantages.append(batch["advantages"])
        return batch

    trainer._generate_and_score_completions = spy
    rollouts = []
    trainer.completion_listeners.append(rollouts.extend)
    trainer.callback_handler.callbacks[0].eval_steps = 10**6  # the held-out eval is called below
    trainer.train()
    assert set(prompts) == {True, False}  # both sources in the batch
    assert all("<tools>" in text for text in prompts[True]) and not any("<tools>" in text for text in prompts[False])
    episodes = [row for row in rollouts if row["source"] == "episodes"]
    clicks = [row for row in rollouts if row["source"] == "clicks"]
    assert len(episodes) + len(clicks) == 16 and episodes and clicks
    assert [float(row["reward/MiniWoBEnvironment"]) for row in episodes] == [1.0, 0.0] * (len(episodes) // 2)

    def unscored(value) -> bool:  # TRL's "this reward does not score the row": NaN, logged empty
        return value in ("", None) or math.isnan(float(value))

    assert all(unscored(row["reward/clicks/click_accuracy"]) for row in episodes)
    assert all(len(json.loads(row["episode_steps"])) == 1 for row in episodes)
    assert all(float(row["reward/clicks/click_accuracy"]) == 0.0 for row in clicks)
    assert all(unscored(row["reward/MiniWoBEnvironment"]) and row["episode_steps"] == "" for row in clicks)
    assert all("Tool click not found" in row["completion"] for row in clicks)
    signs = torch.tensor([1.0, -1.0] * (len(episodes) // 2))
    assert torch.equal(advantages[0][[i for i, row in enumerate(rollouts) if row["source"] == "episodes"]].sign(),
                       signs)  # fmt: skip
    log = next(entry for entry in trainer.state.log_history if "reward" in entry)
    assert float(log["tools/episodes"]) == float(log["tools/episode_actions"]) == len(episodes)

    started, answered = {}, []
    start = tool_loop.ToolLoop.start

    def spy_start(self, row):
        rollout = start(self, row)
        if row["source"] == "episodes":
            started[(row["task"], row["seed"])] = rollout
        return rollout

    def answers(self, batch, prompts, temperature, seed):
        texts = []
        for row, prompt in zip(batch, prompts, strict=True):
            answered.append((row["source"], "<tools>" in prompt))
            if row["source"] == "clicks" and row["prompt"][-1]["role"] == "user":  # a call, as in training: none
                texts.append('<tool_call>\n{"name": "click", "arguments": {"x": 1, "y": 1}}\n</tool_call>')
            elif row["source"] == "clicks":  # after "not found": the point of the gold box's centre
                x1, y1, x2, y2 = json.loads(row["solution"])
                x, y = BoxFrame.from_dict(row["box_frame"]).click_point((x1, y1, x2, y2))
                texts.append(f'{{"point_2d": [{x}, {y}]}}')
            elif row["prompt"][-1]["role"] != "user":
                texts.append("Done.")
            else:  # the named button: won
                texts.append(_button_call(started[(row["task"], row["seed"])].environment))
        return [self.processing_class.tokenizer.encode(text, add_special_tokens=False) + [end] for text in texts]

    monkeypatch.setattr(tool_loop.ToolLoop, "start", spy_start)
    monkeypatch.setattr(engine_module.HFEngine, "generate_ids", answers)
    callback = trainer.callback_handler.callbacks[0]
    accuracy, table = callback.evaluate(trainer.model, step=1)
    assert sorted({row.get("source") for row in callback.rows}) == ["clicks", "episodes"]
    assert accuracy == 1.0 and all(row[-1] for row in table)
    assert callback.figures["eval/episodes/accuracy"] == callback.figures["eval/clicks/accuracy"] == 1.0
    assert callback.figures["eval/episode_actions"] == 1.0 and callback.figures["eval/tool_calls"] == 1.0
    assert {("clicks", False), ("episodes", True)} == set(answered)  # each source's prompts as in training
    clicked = [row for row in table if "point_2d" in row[3]]
    assert len(clicked) == 2 and all(row[-1] for row in clicked)  # answered again after the call, as TRL's loop does


@pytest.mark.parametrize(("change", "message"), [
    ({"tools": ["miniwob"]}, r"^tools: miniwob for the whole run, and the mixture's sources name their own"),
    ({"datasets": [{"name": "a", "dataset": "color_squares", "tools": ["zoom"], "rewards": []}]},
     r"^datasets\[0\] \('a'\): no rewards, and its tools \(zoom\) have no environment that scores its episodes"),
    ({"datasets": [{"name": "a", "dataset": "color_squares", "tools": ["suzak.scoring.rewards.is_async"],
                    "rewards": ["word_match"]}]},
     r"^datasets\[0\] \('a'\): tools suzak.scoring.rewards.is_async: a source's tools are one environment"),
    ({"datasets": [{"name": "a", "dataset": "color_squares", "tools": ["nowhere.tool"], "rewards": ["word_match"]}]},
     r"^datasets\[0\] \('a'\): cannot import tool 'nowhere.tool'"),
])  # fmt: skip
def test_a_mixtures_bad_tools_are_one_line_before_any_row_or_weight_loads(tiny_model_dir, tmp_path, monkeypatch, change,
                                                                          message):  # fmt: skip
    """Tools per source, checked before the rows are built (no browser starts) and before the weights load."""
    import yaml

    from suzak.training.build import grpo_trainer
    from suzak.training.configs import parse_args

    recipe = yaml.safe_load(open("recipes/miniwob_mixture_smoke.yaml")) | change
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    _no_rows_built(monkeypatch)
    with pytest.raises(SuzakError, match=message):
        grpo_trainer(*parse_args(["--config", str(path), "--model_name_or_path", str(tiny_model_dir)]))


def _no_rows_built(monkeypatch) -> None:
    """Any dataset built from here on fails the test (a refusal must come before the rows, and their browsers)."""
    from suzak.data import builders

    def built(*args, **kwargs):
        raise AssertionError("rows were built before the refusal")

    for name in list(builders.DATASETS):
        monkeypatch.setitem(builders.DATASETS, name, built)


def test_sft_on_a_mixture_with_an_episode_source_is_one_line(tiny_model_dir, tmp_path, monkeypatch):
    """An episode has no gold answer to learn: `suzak sft` names the source and stops, before any row is built."""
    import yaml

    from suzak.training.build import sft_trainer
    from suzak.training.configs import parse_sft_args

    mixture = yaml.safe_load(open("recipes/miniwob_mixture_smoke.yaml"))["datasets"]
    path = tmp_path / "sft.yaml"
    path.write_text(yaml.safe_dump({"datasets": mixture, "use_cpu": True, "bf16": False}))
    _no_rows_built(monkeypatch)
    with pytest.raises(SuzakError, match=r"^datasets\[1\] \('episodes'\): tools: suzak sft trains gold answers"):
        sft_trainer(*parse_sft_args(["--config", str(path), "--model_name_or_path", str(tiny_model_dir),
                                     "--output_dir", str(tmp_path / "sft")]))  # fmt: skip


class ScoringEnvironment:
    """A user's environment that scores its rollouts but keeps no episodes (not a ScreenEnvironment)."""

    def reset(self, **kwargs) -> None:
        return None

    def press(self, button: str) -> str:
        """Press a button.

        Args:
            button: Its label.
        """
        return "pressed"

    def get_reward(self) -> float:
        return 0.0


def _mixture_recipe(tmp_path, **changes) -> str:
    import yaml

    recipe = yaml.safe_load(open("recipes/miniwob_mixture_smoke.yaml"))
    for index, change in changes.pop("sources", {}).items():
        recipe["datasets"][index] |= change
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe | changes))
    return str(path)


def test_an_episode_sources_screens_keep_its_own_pixel_budget(tiny_model_dir, tmp_path):
    """A source's own max_pixels is its screens' budget too (every next screen as large as its first), not the
    budget enclosing the other sources'; a tool_max_pixels below a source's own min_pixels is one line naming it; a
    source's own tool_max_pixels sets its screens' budget, within its pixel budget (or the run's)."""
    from suzak.training.build import RunInputs, run_tools
    from suzak.training.configs import parse_args

    recipe = _mixture_recipe(tmp_path, max_pixels=200704, sources={1: {"max_pixels": 12544}})
    suzak_args, args, model_args = parse_args(["--config", recipe, "--model_name_or_path", str(tiny_model_dir),
                                               "--tool_max_pixels", "null"])  # fmt: skip
    inputs = RunInputs.read(suzak_args, model_args)
    toolset = run_tools(suzak_args, inputs, 3)
    assert toolset.by_source["episodes"].environment_factory.budget.max_pixels == 12544  # not 200,704
    suzak_args.tool_max_pixels = 3136
    suzak_args.datasets[1]["min_pixels"] = 6272
    inputs = RunInputs.read(suzak_args, model_args)
    with pytest.raises(SuzakError, match=r"^source 'episodes': tool_max_pixels 3136 must lie between min_pixels 6272"):
        run_tools(suzak_args, inputs, 3)
    suzak_args.datasets[1] |= {"min_pixels": None, "tool_max_pixels": 6272}  # the source's own, within its budget
    inputs = RunInputs.read(suzak_args, model_args)
    assert run_tools(suzak_args, inputs, 3).by_source["episodes"].environment_factory.budget.max_pixels == 6272
    suzak_args.datasets[1] |= {"max_pixels": None, "tool_max_pixels": 401408}  # above the run's max_pixels
    inputs = RunInputs.read(suzak_args, model_args)
    with pytest.raises(SuzakError, match=r"^source 'episodes': tool_max_pixels 401408 must lie .*\(the run's pixel"):
        run_tools(suzak_args, inputs, 3)


def test_a_source_scored_by_an_environment_without_episodes_holds_no_rows_out(tiny_model_dir, tmp_path):
    """Without rewards, a source's held-out rows are scored by their episodes: an environment that keeps none (a
    user's class with get_reward) is one line when the source holds rows out, and trains where it does not."""
    from suzak.training.build import RunInputs, run_tools
    from suzak.training.configs import parse_args

    tool = f"{__name__}.ScoringEnvironment"
    for rows, refused in ((2, True), (0, False)):
        recipe = _mixture_recipe(tmp_path, sources={1: {"tools": [tool], "eval_rows": rows}})
        flags = ["--config", recipe, "--model_name_or_path", str(tiny_model_dir), "--eval_steps", "1"]
        suzak_args, _, model_args = parse_args(flags)
        inputs = RunInputs.read(suzak_args, model_args)
        if refused:
            with pytest.raises(SuzakError, match=r"^datasets\[1\] \('episodes'\): no rewards, and its environment "
                                                 r"keeps no episodes"):  # fmt: skip
                run_tools(suzak_args, inputs, 3)
        else:
            assert run_tools(suzak_args, inputs, 3).by_source["episodes"].scores_rollouts


def test_suzak_heldout_scores_an_episode_runs_held_out_rows_by_their_environment(tiny_model_dir, monkeypatch):
    """`suzak heldout` on recipes/miniwob_smoke.yaml (rewards: [], the environment scores): each held-out episode in
    Chromium, correct when it succeeded (it raised IndexError on the empty rewards before)."""
    from suzak.training.heldout import evaluate_heldout

    _script_the_eval_engine(monkeypatch)
    payload = evaluate_heldout(["--config", "recipes/miniwob_smoke.yaml", "--model_path", str(tiny_model_dir),
                                "--dataset_options", '{"tasks": ["click-button"], "seeds": 8}', "--eval_rows", "4"])  # fmt: skip
    assert payload["total"] == 4 and payload["correct"] == sum(r["is_correct"] for r in payload["results"])
    assert payload["figures"]["eval/episode_actions"] == 1.0 and 0 < payload["correct"] < 4
