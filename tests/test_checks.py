"""The checks before step 1 (suzak.training.checks): the reward pre-flight, the visual-token pre-check (vLLM's bounds check is
in tests/test_vllm_colocate.py and, against vLLM itself, tests/test_vllm_boundary.py)."""

from __future__ import annotations

import logging

import pytest
from PIL import Image

from suzak import SuzakError
from suzak.media.vision import PixelBudget
from suzak.scoring.rewards import (
    clevr_count,
    gsm8k_accuracy,
    gsm8k_format,
    resolve_reward,
    resolve_rewards,
    think_format,
)
from suzak.training.checks import precheck, preflight
from test_rewards import GSM8K_NATALIA

# --- pre-flight --------------------------------------------------------------------------------------------------


def clevr_rows(n=10):
    prompt = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many items?"}]}]
    return [{"prompt": prompt, "image": None, "solution": f"<answer> {3 + i % 8} </answer>"} for i in range(n)]


def gsm8k_rows():
    prompt = [{"role": "user", "content": "Natalia sold clips..."}]
    return [
        {"prompt": prompt, "solution": GSM8K_NATALIA},
        {"prompt": prompt, "solution": "18"},
        {"prompt": prompt, "solution": "It costs 1,234 dollars.\n#### 1,234"},
        {"prompt": prompt, "solution": "#### -5"},
    ]


def test_preflight_clevr_passes(caplog):
    with caplog.at_level(logging.INFO, logger="suzak.training.checks"):
        preflight(clevr_rows(), resolve_rewards(["clevr_count", "think_format"]), "think_answer")
    assert "clevr_count, think_format" in caplog.text and "8 rows" in caplog.text


def test_preflight_clevr_fails_on_mismatched_format():
    with pytest.raises(SuzakError) as info:
        preflight(clevr_rows(), [clevr_count, think_format], "gsm8k_hash")
    message = str(info.value)
    assert "'clevr_count'" in message and "row 0" in message and "<answer> 3 </answer>" in message
    assert "#### 3" in message and "0.0" in message
    assert "the reward and the answer format / prompt template disagree" in message


def test_preflight_accepts_datasets_dataset():
    datasets = pytest.importorskip("datasets")
    rows = clevr_rows(4)
    dataset = datasets.Dataset.from_list([{"prompt": r["prompt"], "solution": r["solution"]} for r in rows])
    preflight(dataset, [clevr_count, think_format], "think_answer", num_rows=3)


def test_preflight_gsm8k():
    rewards = [gsm8k_accuracy, gsm8k_format]
    preflight(gsm8k_rows(), rewards, "gsm8k_hash")
    with pytest.raises(SuzakError, match=r"'gsm8k_format' returned 0.0 .* row 0 \(4 of 4 rows failed\)"):
        preflight(gsm8k_rows(), resolve_rewards(["gsm8k_format"], {"gsm8k_format": {"style": "think"}}), "gsm8k_hash")


def test_preflight_skips_zero_weight():
    think = resolve_reward("gsm8k_format", {"style": "think"})
    preflight(gsm8k_rows(), [gsm8k_accuracy, think], "gsm8k_hash", reward_weights=[1.0, 0.0])
    with pytest.raises(SuzakError, match="2 reward weights for 1"):
        preflight(gsm8k_rows(), [gsm8k_accuracy], "gsm8k_hash", reward_weights=[1.0, 0.0])


def test_preflight_checks_conversational_form():
    def text_only(completions, **kwargs):
        return [1.0 if isinstance(c, str) else 0.0 for c in completions]

    with pytest.raises(SuzakError, match="conversational completions"):
        preflight(clevr_rows(2), [text_only], "think_answer")


def test_preflight_none_counts_as_failure():
    def skips(completions, **kwargs):
        return [None for _ in completions]

    with pytest.raises(SuzakError, match="returned None"):
        preflight(clevr_rows(2), [skips], "think_answer")


def test_preflight_bad_gold_and_data_errors():
    rows = clevr_rows(3)
    rows[2]["solution"] = "<answer> many </answer>"
    with pytest.raises(SuzakError, match=r"'clevr_count' raised.*row 2"):
        preflight(rows, [clevr_count], "think_answer")
    with pytest.raises(SuzakError, match="no rows"):
        preflight([], [clevr_count], "think_answer")
    with pytest.raises(SuzakError, match="solution"):
        preflight([{"prompt": "x"}], [clevr_count], "think_answer")
    with pytest.raises(SuzakError, match="unknown answer format"):
        preflight(clevr_rows(1), [clevr_count], "xml")


def test_preflight_passes_columns_like_trl():
    seen = {}

    def spy(prompts, completions, completion_ids, solution, image, **kwargs):
        seen.update(kwargs, prompts=prompts, solution=solution, image=image)
        return [1.0 for _ in completions]

    preflight(clevr_rows(3), [spy], "think_answer")
    assert seen["solution"] == [r["solution"] for r in clevr_rows(3)] and seen["image"] == [None] * 3
    assert len(seen["prompts"]) == 3 and {"trainer_state", "log_extra", "log_metric"} <= set(seen)


def test_r1v_accuracy_passes_the_preflight():
    preflight(clevr_rows(), resolve_rewards(["r1v_accuracy", "think_format"]), "think_answer")


# --- visual-token pre-check ----------------------------------------------------------------------------------


def test_precheck_reports_and_warns(tiny_processor, caplog):
    from suzak.scoring.prompts import build_conversation

    rows = [
        {"prompt": build_conversation("How many items are there in the image?"), "image": Image.new("RGB", (320, 240))},
        {"prompt": build_conversation("How many items are there in the image?"), "image": Image.new("RGB", (640, 480))},
    ]
    budget = PixelBudget(3136, 401408)
    report = precheck(rows, tiny_processor, budget)
    assert report["visual_tokens"] == {"min": 99, "mean": 245.0, "max": 391}
    assert report["prompt_tokens"]["max"] - report["prompt_tokens"]["min"] == 391 - 99
    assert report["too_long"] == []
    report = precheck(rows, tiny_processor, budget, max_completion_length=256, context_length=500)
    assert report["too_long"] == [1]
    assert "exceed the model's context" in caplog.text
    assert report["not_one_image"] == 0  # what a zoom cannot crop: rows with no image or several
    two = {"prompt": build_conversation("Which is larger?", 2), "images": [rows[0]["image"], rows[1]["image"]]}
    assert precheck([*rows, two], tiny_processor, budget)["not_one_image"] == 1
