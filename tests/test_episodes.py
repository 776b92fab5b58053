"""Episodes (suzak.models.episodes): the contract of an environment whose actions change a screen, and MiniWoB++ in a
real Chromium (suzak.data.miniwob)."""

from __future__ import annotations

import inspect

import pytest
from PIL import Image, ImageDraw

from suzak import SuzakError
from suzak.media.boxes import BoxFrame
from suzak.media.vision import PixelBudget
from suzak.models.episodes import (
    Action,
    Clicks,
    EpisodeCrashed,
    EpisodeFactory,
    Outcome,
    ScreenEnvironment,
    Types,
    episode_columns,
)
from suzak.models.tools import ToolError, resolve_tools

SEEN = {"qwen2_vl": 28, "qwen2_5_vl": 28, "qwen3_vl": 32}


class Doors(ScreenEnvironment, Clicks, Types):
    """Two steps: click the door (a white square somewhere), then the key shown behind it; typing "skip" is refused."""

    crash_on: str | None = None

    def _start(self, row):
        self.door, self.key, self.opened, self.won, self.lost = row["door"], row["key"], False, False, False
        return self._draw(self.door)

    def _draw(self, box, colour="white"):
        image = Image.new("RGB", (320, 240))
        ImageDraw.Draw(image).rectangle(box, fill=colour)
        return image

    def _perform(self, action: Action):
        if self.crash_on == action.kind:
            raise EpisodeCrashed("the screen went dark")
        if action.kind == "type_text":
            raise ToolError("nothing to type into")
        left, top, right, bottom = self.key if self.opened else self.door
        inside = left <= action.x <= right and top <= action.y <= bottom
        if self.opened:
            self.won, self.lost = inside, not inside
        else:
            self.opened = inside

    def _outcome(self):
        done = self.won or self.lost
        return Outcome(done=done, reward=1.0 if self.won else 0.5 * self.opened, success=self.won if done else None)

    def _screen(self):
        return self._draw(self.key, "yellow") if self.opened else self._draw(self.door)


ROW = {"door": (20, 20, 80, 80), "key": (240, 160, 300, 220)}


def _episode(family="qwen2_5_vl", max_steps=4, cap=None, environment=Doors):
    factor = SEEN[family]
    seen = PixelBudget(factor * factor, 64 * factor * factor, factor=factor)
    screens = PixelBudget(factor * factor, 16 * factor * factor, factor=factor)
    env = environment.bound_to(screens, max_steps, cap)()
    first = Doors._draw(None, ROW["door"])
    frame = BoxFrame.of(family, 320, 240, seen)
    env.reset(**ROW, image=first, box_frame=frame.as_dict())
    return env, frame, screens


@pytest.mark.parametrize("family", sorted(SEEN))
def test_an_episode_clicks_in_the_model_frame_of_the_screen_it_saw_last(family):
    """The first click is read in the first screen's frame (the training budget), the second in the next screen's
    (the tool budget): for Qwen2.5-VL those are different pixel grids; the reward is the environment's."""
    env, frame, screens = _episode(family)
    answer = env.click(*frame.click_point(ROW["door"]))
    screen = answer[0]["image"]
    assert screen.size == screens.fit(Image.new("RGB", (320, 240))).size
    assert env.get_reward() == 0.5 and not env.outcome.done
    second = BoxFrame.of(family, 320, 240, screens)
    if family == "qwen2_5_vl":  # absolute pixels: the first frame's point would land elsewhere on the second screen
        assert not second.point_in_box(frame.click_point(ROW["key"]), ROW["key"])
    assert env.click(*second.click_point(ROW["key"])) == "The episode is over: success (reward 1)."
    assert env.get_reward() == 1.0 and env.outcome.success
    assert [step.kind for step in env.steps] == ["click", "click"]
    assert ROW["key"][0] <= env.steps[1].point[0] <= ROW["key"][2]
    assert env.visual_tokens == screens.tokens(screen.height, screen.width)
    columns = episode_columns([env])
    assert columns["episode_reward"] == [1.0] and '"kind": "click"' in columns["episode_steps"][0]


def test_bad_actions_are_tool_errors_counted_by_reason_and_the_episode_goes_on():
    env, frame, _ = _episode("qwen2_vl")
    with pytest.raises(ToolError, match="x and y must be numbers"):
        env.click("left", 5)
    with pytest.raises(ToolError, match=r"off the screen: x within 0-999"):
        env.click(1200, 5)
    with pytest.raises(ToolError, match="type_text: nothing to type into"):
        env.type_text("skip")
    assert dict(env.problems) == {"unparsable": 1, "out_of_range": 1, "refused": 1}
    env.click(*frame.click_point(ROW["door"]))
    assert env.click(0, 0) == "The episode is over: failure (reward 0.5)."  # a wrong key: over, with the door's half
    with pytest.raises(ToolError, match="the episode is over"):
        env.click(0, 0)
    assert env.problems["over"] == 1 and env.get_reward() == 0.5


def test_the_step_cap_and_the_visual_token_cap_end_an_episode():
    env, _, _ = _episode("qwen2_vl", max_steps=2)
    env.click(999, 999)
    assert env.click(999, 999) == "The episode is over: its 2 steps are used (reward 0)."
    assert env.problems["step_cap"] == 1 and env.outcome.done and env.final_screen is not None
    env, _, screens = _episode("qwen2_vl", cap=20)  # one screen of 12 tokens fits, a second does not
    assert isinstance(env.click(999, 999), list)
    assert "screens may show 20 visual tokens" in env.click(999, 999)
    assert env.problems["budget"] == 1 and env.visual_tokens == 12


def test_a_crashed_environment_ends_the_episode_and_a_diverged_first_screen_is_counted(caplog, monkeypatch):
    from suzak.models import episodes

    monkeypatch.setitem(episodes._said, "diverged", False)  # the warning is given once a process
    class Fragile(Doors):
        crash_on = "click"

    env, _, _ = _episode("qwen2_vl", environment=Fragile)
    assert "the environment failed: the screen went dark" in env.click(5, 5)
    assert env.problems["crashed"] == 1 and env.outcome.done and env.get_reward() == 0.0
    env = Doors.bound_to(PixelBudget(784, 12544, factor=28))()
    frame = BoxFrame.of("qwen2_vl", 320, 240, PixelBudget(784, 50176, factor=28))
    env.reset(**ROW, image=Image.new("RGB", (320, 240), "red"), box_frame=frame.as_dict())
    assert env.problems["diverged"] == 1 and "not the row's image" in caplog.text
    with pytest.raises(SuzakError, match="first screen as its one image"):
        env.reset(**ROW)


def test_trl_offers_the_model_the_mixins_actions_only():
    """TRL makes every public function of the class a tool (GRPOTrainer.__init__): the hooks stay private, and
    bound_to (a classmethod) is not a function of the class."""
    exposed = sorted(name for name, _ in inspect.getmembers(Doors, predicate=inspect.isfunction)
                     if name not in ("reset", "get_reward") and not name.startswith("_"))  # fmt: skip
    assert exposed == ["click", "type_text"]
    from suzak.data.miniwob import MiniWoBEnvironment

    exposed = sorted(name for name, _ in inspect.getmembers(MiniWoBEnvironment, predicate=inspect.isfunction)
                     if name not in ("reset", "get_reward") and not name.startswith("_"))  # fmt: skip
    assert exposed == ["click", "press_key", "scroll", "type_text"]


def test_resolve_tools_binds_an_episode_to_the_screen_budget_and_the_step_cap():
    budget = PixelBudget(784, 12544, factor=28)
    toolset = resolve_tools(["miniwob"], budget, 64, max_steps=3)
    factory = toolset.environment_factory
    assert isinstance(factory, EpisodeFactory) and toolset.tools == []
    assert (factory.budget, factory.max_steps, factory.max_visual_tokens) == (budget, 3, 64)
    assert resolve_tools([f"{__name__}.Doors"], budget).environment_factory.max_steps == 8
    with pytest.raises(SuzakError, match="shows screens, and this model has no vision tower"):
        resolve_tools(["miniwob"], None)


def test_a_run_without_rewards_needs_an_environment_that_scores(tmp_path, tiny_model_dir):
    """rewards: [] is an episode run's (its environment scores); without one it is one line, not TRL's traceback."""
    import yaml

    from suzak.training.build import grpo_trainer
    from suzak.training.configs import parse_args

    recipe = yaml.safe_load(open("recipes/smoke.yaml"))
    recipe.update(rewards=[], output_dir=str(tmp_path / "run"), model_name_or_path=str(tiny_model_dir))
    for key in ("reward_weights", "reward_kwargs"):
        recipe.pop(key, None)
    path = tmp_path / "norewards.yaml"
    path.write_text(yaml.safe_dump(recipe))
    with pytest.raises(SuzakError, match=r"rewards is empty: name at least one reward .*tools: \[miniwob\]"):
        parse_args(["--config", str(path)])
    with pytest.raises(SuzakError, match=r"rewards is empty and tools \(zoom\) has no environment that scores"):
        grpo_trainer(*parse_args(["--config", str(path), "--tools", "zoom"]))


@pytest.mark.parametrize("family", sorted(SEEN))
def test_the_doors_episode_needs_the_second_screen_to_find_the_key(family):
    """suzak.data.doors (the episodes self-test's task): the door's click opens the key's screen, the key's click
    wins; the control's door opens onto a blank screen, the same rewards otherwise."""
    from suzak.data.doors import BlankDoorsEnvironment, DoorsEnvironment, cell_box, cell_point, doors_rows

    factor = SEEN[family]
    side = 2 * factor
    budget = PixelBudget(side * side, side * side, factor=factor)
    rows = doors_rows(40, seed=1, side=side)
    assert {row["door"] for row in rows} == {0, 1, 2, 3} and len({(r["door"], r["key"]) for r in rows}) > 8
    frame = BoxFrame.of(family, side, side, budget)

    def to_model(cell: int) -> tuple[int, int]:
        return frame.click_point(cell_box(cell, side))

    for environment, shows_key in ((DoorsEnvironment, True), (BlankDoorsEnvironment, False)):
        for row in rows[:8]:
            env = environment.bound_to(budget, max_steps=2)()
            env.reset(**row, box_frame=frame.as_dict())
            screen = env.click(*to_model(row["door"]))[0]["image"]
            key_pixel = screen.getpixel(cell_point(row["key"], side))
            assert (key_pixel == (255, 220, 0)) == shows_key and env.get_reward() == 0.5
            wrong = (row["key"] + 1) % 4
            assert env.click(*to_model(wrong)).startswith("The episode is over: failure") and env.get_reward() == 0.5
            env.reset(**row, box_frame=frame.as_dict())
            env.click(*to_model((row["door"] + 1) % 4))
            assert env.outcome.done and env.get_reward() == 0.0  # a missed door ends it at once


def test_the_episodes_self_test_gives_both_conditions_the_tool_and_scores_by_the_environment():
    from suzak.selftest import TASKS, episode_corpus

    spec = TASKS["episodes"]
    assert spec.control == "blank" and spec.tools == ("suzak.data.doors.DoorsEnvironment",)
    assert spec.control_tools == ("suzak.data.doors.BlankDoorsEnvironment",) and spec.tool_rounds == 2
    texts = episode_corpus("qwen3_vl", repeats=1)
    assert len(texts) == 4 and all(text.count('"name": "click"') >= 2 for text in texts)


class ScoresItself:
    """A user's environment class (not a ScreenEnvironment) that scores its rollouts."""

    def reset(self, **row):
        return None

    def get_reward(self) -> float:
        return 1.0


def test_an_environment_scores_its_rollouts_when_it_has_get_reward_and_a_missing_hook_fails_at_once():
    budget = PixelBudget(784, 12544, factor=28)
    assert resolve_tools(["miniwob"], budget).scores_rollouts
    assert resolve_tools([f"{__name__}.ScoresItself"], budget).scores_rollouts  # a plain class, by dotted path
    assert not resolve_tools(["zoom"], budget).scores_rollouts

    class NoScreen(ScreenEnvironment, Clicks):
        def _start(self, row):
            return Image.new("RGB", (8, 8))

        def _perform(self, action):
            pass

        def _outcome(self):
            return Outcome(done=False, reward=0.0)

    with pytest.raises(TypeError, match="_screen"):  # when TRL makes its first one, before any rollout
        NoScreen.bound_to(budget)()


def test_two_sources_of_one_environment_each_act_with_their_own_tool_settings(tmp_path, tiny_model_dir):
    """Two sources of the doors episode in one GRPO run, each with its own tool settings: 'small' sees its next screen
    at its own tool_max_pixels (56x56 where the first is 112x112) and finds the key in two actions; 'capped' stops
    at its own max_tool_calling_iterations 1 after the door (0.5), where the run allows 2. A scripted policy that
    reads each screen it is given (the door's white cell, then the key's yellow one) acts for the model."""
    import json

    import datasets
    import numpy as np
    import yaml

    from suzak.data.doors import doors_rows
    from suzak.training.build import grpo_trainer
    from suzak.training.configs import parse_args

    datasets.Dataset.from_list(doors_rows(16, seed=3, side=112)).save_to_disk(str(tmp_path / "doors"))
    source = {"dataset": str(tmp_path / "doors"), "prompt_template": "episode", "rewards": [],
              "tools": ["suzak.data.doors.DoorsEnvironment"]}  # fmt: skip
    recipe = yaml.safe_load(open("recipes/miniwob_mixture_smoke.yaml"))
    recipe.update(datasets=[source | {"name": "small", "tool_max_pixels": 3136},
                            source | {"name": "capped", "max_tool_calling_iterations": 1}],
                  max_pixels=12544, tool_max_pixels=12544, max_tool_calling_iterations=2, output_dir=str(tmp_path / "run"),
                  max_steps=1, per_device_train_batch_size=8)  # fmt: skip
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    trainer = grpo_trainer(*parse_args(["--config", str(path), "--model_name_or_path", str(tiny_model_dir)]))
    tokenizer = trainer.processing_class.tokenizer
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    screens_seen = []

    def sees(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        texts = []
        for ids, shown in zip(prompt_ids, images, strict=True):
            if "The episode is over" in tokenizer.decode(ids[-40:]):
                texts.append("Done.")
                continue
            screen = np.asarray(shown[-1].convert("RGB"))  # the screen it saw last, in the model's frame (pixels)
            screens_seen.append(shown[-1].size)
            lit = np.argwhere(screen.sum(-1) > 3 * 100)  # the door's (white) or the key's (yellow) cell
            y, x = lit.mean(0)
            call = {"name": "click", "arguments": {"x": int(x), "y": int(y)}}
            texts.append(f"<tool_call>\n{json.dumps(call)}\n</tool_call>")
        return [tokenizer.encode(text, add_special_tokens=False) + [end] for text in texts], None

    trainer._generate_single_turn = sees
    rollouts = []
    trainer.completion_listeners.append(rollouts.extend)
    trainer.train()
    rewards = {name: [float(r["reward/DoorsEnvironment"]) for r in rollouts if r["source"] == name]
               for name in ("small", "capped")}  # fmt: skip
    assert rewards["small"] and set(rewards["small"]) == {1.0}  # door, then the key on its small next screen
    assert rewards["capped"] and set(rewards["capped"]) == {0.5}  # its own cap: the door alone
    assert set(screens_seen) == {(112, 112), (56, 56)}  # the first screens, and 'small''s next ones alone
    assert screens_seen.count((56, 56)) == len(rewards["small"])


def test_a_sources_own_tool_settings_are_checked_against_the_run_and_its_tools():
    """A source's own step cap above the run's (TRL's loop would cut it) and a step cap on the zoom (whose rounds are
    the run's) are each one line naming the source; its own visual-token cap reaches its episodes."""
    from suzak.data.mixture import parse_sources
    from suzak.models.tools import source_tools

    budget = PixelBudget(3136, 12544, factor=28)

    def sources(**own):
        return parse_sources([{"name": "gui", "dataset": "x.jsonl", "rewards": [], "tools": [own.pop("tool", "miniwob")],
                               **own}])  # fmt: skip

    factory = source_tools(sources(tool_max_visual_tokens=24), budget, 64, 3).by_source["gui"].environment_factory
    assert (factory.max_visual_tokens, factory.max_steps) == (24, 3)
    with pytest.raises(SuzakError, match=r"^datasets\[0\] \('gui'\): max_tool_calling_iterations 4 is above the run"):
        source_tools(sources(max_tool_calling_iterations=4), budget, None, 3)
    with pytest.raises(SuzakError, match=r"^datasets\[0\] \('gui'\): max_tool_calling_iterations 2: a source's own step "
                                         r"cap is an episode's .* zoom calls tools"):  # fmt: skip
        source_tools(sources(max_tool_calling_iterations=2, tool="zoom", rewards=["accuracy"]), budget, None, 3)
