"""Qwen3.5's thinking mode with R1-V's think/answer rewards (``opening_in_completion``).

Qwen3.5's chat template ends every generation prompt with ``<think>\\n``: the policy writes the rest of the thinking
block, ``</think>`` and the answer. With ``opening_in_completion: true`` the rewards, the reward pre-flight, the
generation eval during training and ``suzak.eval`` read each completion after that opening, so a well-formed turn
scores as R1-V's format reward means; without it, the run stops before step 1 (tests/test_families.py).
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from suzak import SuzakError
from suzak.media.vision import PixelBudget
from suzak.scoring.prompts import after_opening, render_answer, template_opening
from suzak.scoring.rewards import REWARDS, read_after_opening

ROOT = Path(__file__).resolve().parents[1]
SMOKE = str(ROOT / "recipes" / "smoke.yaml")
WELL_FORMED_TAIL = " I count 3 objects. </think>\n<answer> 3 </answer>"  # what the policy writes after "<think>\n"


@pytest.fixture(scope="module")
def processors(family_model_dir):
    from transformers import AutoProcessor

    return {f: AutoProcessor.from_pretrained(family_model_dir(f)) for f in ("qwen2_5_vl", "qwen3_vl", "qwen3_5")}


def test_template_opening_is_qwen3_5s_think_and_nothing_elsewhere(processors):
    assert template_opening(processors["qwen3_5"]) == "<think>\n"
    assert template_opening(processors["qwen3_5"], {"enable_thinking": False}) == ""  # closed: <think>\n\n</think>
    assert template_opening(processors["qwen2_5_vl"]) == template_opening(processors["qwen3_vl"]) == ""


def test_rewards_read_the_completion_after_the_opening():
    think_format, clevr_count = REWARDS["think_format"], REWARDS["clevr_count"]
    opened = [read_after_opening(f, "<think>\n") for f in (think_format, clevr_count)]
    conversational = [[{"role": "assistant", "content": WELL_FORMED_TAIL}]]
    assert think_format(completions=[WELL_FORMED_TAIL]) == [0.0]  # as generated, the format reward is 0
    for form in ([WELL_FORMED_TAIL], conversational):
        assert [f(completions=form, solution=["<answer> 3 </answer>"]) for f in opened] == [[1.0], [1.0]]
    assert opened[0](completions=[" no closing tag <answer> 3 </answer>"]) == [0.0]  # a bad turn still scores 0
    assert opened[1].gold_parser is clevr_count.gold_parser and opened[1].__name__ == "clevr_count"


def test_preflight_passes_with_the_opening_and_fails_without_it():
    from suzak.training.checks import preflight

    rows = [{"prompt": [{"role": "user", "content": "How many?"}], "solution": "<answer> 3 </answer>"}]
    rewards = [
        read_after_opening(REWARDS["think_format"], "<think>\n"),
        read_after_opening(REWARDS["clevr_count"], "<think>\n"),
    ]
    preflight(rows, rewards, "think_answer", opening="<think>\n")
    assert after_opening(render_answer("think_answer", "3"), "<think>\n").startswith(" Let me think")
    with pytest.raises(SuzakError, match="think_format"):  # the ideal completion gets <think> twice: not the format
        preflight(rows, [REWARDS["think_format"]], "think_answer", opening="<think>\n")


def test_qwen3_5_grpo_with_opening_in_completion_trains(family_model_dir, tmp_path):
    """The run that stopped before step 1 now trains; every reward call sees completions that start with <think>."""
    from test_trainer import image_dataset, length_reward, make_trainer

    seen: list[str] = []

    def recording(completions, **kwargs):
        seen.extend(c[0]["content"] if isinstance(c, list) else c for c in completions)
        return length_reward(completions)

    from suzak.training.trainer import VLMGRPOTrainer

    trainer = make_trainer(family_model_dir("qwen3_5"), tmp_path, image_dataset(4), [REWARDS["think_format"], recording],
                           cls=_opening_trainer(VLMGRPOTrainer), budget=PixelBudget(3136, 50176), max_steps=1,
                           reward_weights=[1.0, 0.0])  # the pre-flight checks the weighted think_format  # fmt: skip
    trainer.answer_format = "think_answer"
    assert trainer.completion_opening == "<think>\n" and trainer.reward_func_names == ["think_format", "recording"]
    trainer.train()
    assert trainer.state.global_step == 1
    assert seen and all(text.startswith("<think>\n") for text in seen)
    assert any("rewards/think_format/mean" in log for log in trainer.state.log_history)


def _opening_trainer(base):
    class OpeningTrainer(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, opening_in_completion=True, **kwargs)

    return OpeningTrainer


def test_evaluation_scores_the_turn_as_training_rewards_it(family_model_dir, monkeypatch):
    """The eval engine puts the opening in front of each output; the strict score of that output and the training
    rewards of the generated tail agree (a well-formed turn: correct and well formatted)."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from suzak.eval.engine import HFEngine
    from suzak.eval.tasks import get_task, score_rules
    from suzak.scoring.formats import is_think_format
    from suzak.scoring.prompts import build_conversation, render_prompt

    path = family_model_dir("qwen3_5")
    engine = HFEngine(AutoModelForImageTextToText.from_pretrained(path), AutoProcessor.from_pretrained(path),
                      PixelBudget(3136, 50176), batch_size=2, max_new_tokens=4, progress=False)  # fmt: skip
    engine.use_template(opening_in_completion=True)
    rows = [{"prompt": build_conversation(render_prompt("r1v_eval", "How many objects?"), 0)}]
    assert engine.prompt_text(rows[0]).endswith("<think>\n")
    generated = engine.generate(rows)  # real generation: the opening comes first
    assert generated[0].startswith("<think>\n")
    monkeypatch.setattr(engine, "_generate_batch", lambda batch, prompts, t, s: [WELL_FORMED_TAIL] * len(batch))
    output = engine.generate(rows)[0]
    assert output == "<think>\n" + WELL_FORMED_TAIL and is_think_format(output)
    assert score_rules(get_task("superclevr"), output, 3)["strict"] == (3, True)
    opened = read_after_opening(REWARDS["clevr_count"], "<think>\n")
    assert opened(completions=[WELL_FORMED_TAIL], solution=["<answer> 3 </answer>"]) == [1.0]

    engine.use_template({"enable_thinking": False})
    assert engine.opening == "" and engine.prompt_text(rows[0]).endswith("</think>\n\n")


def test_a_stop_names_both_ways_out(family_model_dir):
    from transformers import AutoProcessor

    from suzak.training.checks import check_answer_opening

    with pytest.raises(SuzakError, match=r"opening_in_completion: true .*{enable_thinking: false}"):
        check_answer_opening(AutoProcessor.from_pretrained(family_model_dir("qwen3_5")), "think_answer")


@pytest.mark.slow
def test_qwen3_5_train_and_eval_commands_with_opening_in_completion(tmp_path, run_env, eval_fixture_dir):
    """The smoke recipe on the tiny Qwen3.5: without the setting one line before step 1, with it a finished run
    whose held-out generation eval and suzak.eval both keep the opening in front of every output."""
    from conftest import run_ok
    from suzak.eval.tasks import get_task

    out = tmp_path / "q35"
    base = [sys.executable, "-m", "suzak.train", "--config", SMOKE, "--model_name_or_path", "tiny:qwen3_5",
            "--max_steps", "1", "--save_strategy", "no", "--output_dir", str(out)]  # fmt: skip
    stopped = subprocess.run(base, cwd=ROOT, env=run_env, capture_output=True, text=True, timeout=600)
    assert stopped.returncode != 0 and "opening_in_completion: true" in stopped.stderr
    assert "Traceback" not in stopped.stderr
    run_ok(base + ["--opening_in_completion", "true", "--eval_rows", "4", "--eval_steps", "1",
                   "--eval_max_new_tokens", "4"], run_env)  # fmt: skip
    with (out / "eval_samples.csv").open(newline="") as handle:
        samples = list(csv.DictReader(handle))
    assert samples and all(row["output"].startswith("<think>\n") for row in samples)  # step 0 and step 1
    assert json.loads((out / "run_info.json").read_text())["settings"]["opening_in_completion"] is True

    results = tmp_path / "sc.json"
    prompts = eval_fixture_dir / get_task("superclevr").prompt_path
    run_ok([sys.executable, "-m", "suzak.eval", "superclevr", "--model_path", str(out), "--opening_in_completion",
            "true", "--image_root", str(eval_fixture_dir), "--prompt_path", str(prompts), "--output_path",
            str(results), "--max_new_tokens", "4", "--batch_size", "4", "--limit", "2", "--no_progress"], run_env)  # fmt: skip
    rows = json.loads(results.read_text())["results"]
    assert rows and all(r["model_output"].startswith("<think>\n") for r in rows)
