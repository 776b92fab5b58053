"""Evaluation without a model: scorers agree with the rewards, items, missing images, partial files, the report."""

from __future__ import annotations

import json

import pytest

from suzak import SuzakError
from suzak.eval.report import REFERENCES, RunResult, accuracy, markdown_summary, mean_std, write_results
from suzak.eval.runner import Distributed, EvalConfig, PartialStore, prepare_items, seed_output_path
from suzak.eval.tasks import SCORERS, TASKS, get_task, load_items, resolve_template, score
from suzak.rewards import REWARDS

# (scorer, model output, gold as the eval file gives it)
AGREEMENT_TABLE = [
    ("count", "<think> I see 3 cars. </think> <answer> 3 </answer>", 3),
    ("count", "<answer>3</answer>", 4),
    ("count", "<answer>3.0</answer>", 3),
    ("count", "<answer>three</answer>", 3),
    ("count", "<answer> 2 </answer> wait, <answer>3</answer>", 3),
    ("count", "<answer> 2 </answer> wait, <answer>3</answer>", 2),
    ("count", "3", 3),
    ("count", "<answer>3 cars</answer>", 3),
    ("count", "<answer>10</answer>", "10"),
    ("count", "<answer>7</answer>", "<answer> 7 </answer>"),
    ("count", "", 5),
    ("math", "<think>180 - 40</think><answer>140°</answer>", "140°"),
    ("math", "<answer>140</answer>", "140°"),
    ("math", "<answer>40°</answer>", "140°"),
    ("math", "<answer>0.5</answer>", "\\frac{1}{2}"),
    ("math", "<answer>\\sqrt{12}</answer>", "2√{3}"),
    ("math", "The angle is 140°.", "140°"),
    ("math", "no answer at all", "140°"),
    ("gsm8k", "16 - 3 - 4 = 9, 9 * 2 = 18\n#### 18", "18"),
    ("gsm8k", "#### $1,234.00", "1234"),
    ("gsm8k", "#### 17", "18"),
    ("gsm8k", "<answer> 18 dollars </answer>", "18"),
    ("gsm8k", "The answer is 18.", "18"),
]


@pytest.mark.parametrize(("scorer", "output", "gold"), AGREEMENT_TABLE)
def test_eval_scorer_agrees_with_the_reward(scorer, output, gold):
    reward = REWARDS[SCORERS[scorer].reward]
    _, correct = score(scorer, output, gold)
    assert correct == (reward([output], solution=[gold])[0] == 1.0)
    assert correct == (reward([[{"role": "assistant", "content": output}]], solution=[gold])[0] == 1.0)


def test_every_task_scores_with_a_registered_reward():
    for task in TASKS.values():
        assert SCORERS[task.scorer].reward in REWARDS


def test_count_scorer_takes_the_last_answer_unlike_r1v():
    """Documented difference: R1-V's eval regex took the first <answer>N</answer>; suzak's parser takes the last."""
    assert score("superclevr", "<answer>2</answer> no: <answer>3</answer>", 3) == (3, True)
    assert score("superclevr", "<answer>3.0</answer>", 3) == (3, True)  # R1-V's \d+ regex would miss this


def test_resolve_template():
    assert resolve_template(get_task("superclevr")) == "r1v_eval"
    assert resolve_template(get_task("superclevr"), "train") == "r1v"
    assert resolve_template(get_task("geoqa")) == "r1v_geoqa"
    assert resolve_template(get_task("gsm8k"), "gsm8k_think") == "gsm8k_think"
    with pytest.raises(SuzakError, match="unknown prompt template"):
        resolve_template(get_task("geoqa"), "nope")


def test_r1v_items(eval_fixture_dir):
    task = get_task("superclevr")
    path = eval_fixture_dir / task.prompt_path
    items = load_items(task, str(path), template="r1v_eval", image_root=str(eval_fixture_dir))
    assert len(items) == 8 and [i.index for i in items] == list(range(8))
    first = json.loads(path.read_text().splitlines()[0])
    assert items[0].record == first and items[0].gold == first["ground_truth"]
    text = items[0].prompt[0]["content"][-1]["text"]
    assert text.startswith("How many different items are there in the image? First output the thinking process")
    assert items[0].prompt[0]["content"][0] == {"type": "image"}
    assert len({i.key for i in items}) == 8


def _config(eval_fixture_dir, **kwargs) -> EvalConfig:
    return EvalConfig(task="superclevr", model_path="tiny", image_root=str(eval_fixture_dir),
                      prompt_path=str(eval_fixture_dir / TASKS["superclevr"].prompt_path), **kwargs)  # fmt: skip


def test_missing_images_error_and_skip(eval_fixture_dir, tmp_path):
    lines = (eval_fixture_dir / TASKS["superclevr"].prompt_path).read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    rows[2]["image_path"] = "./images/gone_1.png"
    rows[5]["image_path"] = "./images/gone_2.png"
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = _config(eval_fixture_dir, skip_missing=False)
    config.prompt_path = str(path)
    with pytest.raises(SuzakError, match=r"2 image\(s\) missing, first .*gone_1\.png.*--skip_missing"):
        prepare_items(config, get_task("superclevr"))
    config.skip_missing = True
    items, skipped = prepare_items(config, get_task("superclevr"))
    assert skipped == 2 and [i.index for i in items] == [0, 1, 3, 4, 6, 7]
    config.limit, config.skip_missing = 2, False  # the missing ones are beyond the limit
    assert [i.index for i in prepare_items(config, get_task("superclevr"))[0]] == [0, 1]


def test_config_validation():
    with pytest.raises(SuzakError, match="temperature must be > 0"):
        EvalConfig(task="superclevr", model_path="tiny", seeds=[0], temperature=0.0)
    with pytest.raises(SuzakError, match="unknown engine"):
        EvalConfig(task="superclevr", model_path="tiny", engine="tgi")


def test_partial_store_resume_and_settings_check(tmp_path):
    out = tmp_path / "res.json"
    store = PartialStore(out, {"model": "a", "max_new_tokens": 8})
    store.append([("0:aa", "x"), ("1:bb", "y")])
    with store.path.open("a") as handle:
        handle.write('{"key": "2:cc", "model_o')  # the line being written when the run died
    assert store.path.name == "res.json.partial.jsonl"
    assert PartialStore(out, {"model": "a", "max_new_tokens": 8}).load() == {"0:aa": "x", "1:bb": "y"}
    with pytest.raises(SuzakError, match=r"other settings \(max_new_tokens: 8 → 16\).*--fresh"):
        PartialStore(out, {"model": "a", "max_new_tokens": 16}).load()
    rank1 = PartialStore(out, {"model": "a", "max_new_tokens": 8}, Distributed(rank=1, world=2))
    assert rank1.path.name == "res.json.partial.rank1.jsonl"
    rank1.append([("3:dd", "z")])
    assert set(rank1.load()) == {"0:aa", "1:bb", "3:dd"}  # every rank's file is read on resume
    rank1.discard()
    assert store.files() == []


def test_shard_splits_items_by_rank():
    items = list(range(7))
    shards = [Distributed(rank, 3).shard(items) for rank in range(3)]
    assert shards == [[0, 3, 6], [1, 4], [2, 5]]
    assert sorted(x for s in shards for x in s) == items


def test_report_files(tmp_path):
    results = [{"is_correct": c} for c in (True, False, False, True, True)]
    path = tmp_path / "out" / "r.json"
    assert write_results(path, results) == 60.0
    saved = json.loads(path.read_text())
    assert saved["accuracy"] == 60.0 == accuracy(saved["results"])
    assert mean_std([50.0]) == (50.0, 0.0)
    assert seed_output_path(path, 3).name == "r.seed3.json"
    greedy = RunResult(str(path), 60.0, 3, 5)
    sampled = [RunResult("a", 40.0, 2, 5, seed=0, temperature=1.0), RunResult("b", 60.0, 3, 5, seed=1, temperature=1.0)]
    text = markdown_summary("superclevr", "m", greedy, sampled, {"template": "r1v_eval"})
    assert "| greedy | 60.00 | 3 / 5 |" in text
    assert "50.00 ± 14.14 (mean ± std)" in text
    assert "48.00 | 82.50" in text and "**(UNVERIFIED)**" in text and "55.00 | 89.50" in text
    assert "71.50" in text and "42.50" in text
    geoqa = markdown_summary("geoqa", "m", greedy, [], {})
    assert "30.63 | 38.72" in geoqa and "35.41 | 47.48" in geoqa and "UNVERIFIED" not in geoqa and "±" not in geoqa
    assert [r for r in REFERENCES if not r.verified] == [r for r in REFERENCES if r.base == 55.0]
