"""Evaluation without a model: both scoring rules on tables of outputs, scorers agree with the rewards, items,
missing images, partial files, the report."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from suzak import SuzakError
from suzak.eval.report import REFERENCES, RunResult, accuracy, markdown_summary, mean_std, write_results
from suzak.eval.runner import EvalConfig, PartialStore, prepare_items, result_row, seed_output_path, shard
from suzak.eval.tasks import SCORERS, SCORING_RULES, TASKS, EvalItem, get_task, load_items, resolve_template, score
from suzak.scoring.rewards import REWARDS

# Each row's verdicts were worked out from the two rules' definitions (R1-V's: the first <answer>\s*(\d+)\s*</answer>
# as an int; math-verify of the whole output against the raw gold. suzak's: the last tag, read strictly), then
# confirmed by running them.
# (model output, gold, r1v verdict, strict verdict)
COUNT_TABLE = [
    ("<think> I see 3 cars. </think> <answer> 3 </answer>", 3, True, True),
    ("<answer>3</answer>", 3, True, True),
    ("<answer>\n3\n</answer>", 3, True, True),
    ("<answer>\t3\t</answer>", 3, True, True),
    ("<answer>3</answer> and some text after", 3, True, True),
    ("<answer>3</answer>", 4, False, False),
    ("<answer>0</answer>", 0, True, True),
    ("<answer>03</answer>", 3, True, True),
    ("<answer>10</answer>", "10", True, True),
    ("<answer>7</answer>", "<answer> 7 </answer>", True, True),
    ("<answer>3</answer>", 3.0, True, True),
    # first vs last tag
    ("<answer>2</answer> wait, <answer>3</answer>", 3, False, True),
    ("<answer>2</answer> wait, <answer>3</answer>", 2, True, False),
    ("<answer>3</answer><answer>4</answer>", 4, False, True),
    ("<answer>3 </answer>\n<answer> 4</answer>", 4, False, True),
    ("<think>maybe <answer>2</answer></think> <answer>3</answer>", 3, False, True),
    ("<answer>two</answer> no: <answer>3</answer>", 3, True, True),  # R1-V skips a tag holding no bare number
    ("<answer>3</answer> no: <answer>two</answer>", 2, False, True),
    ("<answer>2 <answer>3</answer>", 3, True, True),  # an unclosed tag: both read the closed pair
    # digits: R1-V's \d takes any Unicode decimal digit, suzak ASCII only
    ("<answer>٣</answer>", 3, True, False),  # Arabic-Indic three
    ("<answer>３</answer>", 3, True, False),  # fullwidth three
    ("<answer>١٠</answer>", 10, True, False),  # Arabic-Indic ten
    ("<answer>১০</answer>", 10, True, False),  # Bengali ten
    ("<answer>³</answer>", 3, False, False),  # superscript: not a decimal digit for either
    # what suzak's parser reads and R1-V's integer regex does not
    ("<answer>3.0</answer>", 3, False, True),
    ("<answer>3.</answer>", 3, False, True),
    ("<answer>+3</answer>", 3, False, True),
    ("<answer>three</answer>", 3, False, True),
    ("<answer>Three.</answer>", 3, False, True),
    ("<answer>twenty</answer>", 20, False, True),
    # wrong or unreadable for both
    ("<answer>-3</answer>", 3, False, False),
    ("<answer>3.5</answer>", 3, False, False),
    ("<answer>3 cars</answer>", 3, False, False),
    ("<answer>1 0</answer>", 10, False, False),
    ("<think>5 objects</think><answer>4</answer>", 5, False, False),
    ("There are 3 objects.", 3, False, False),
    ("3", 3, False, False),
    ("<answer></answer>", 3, False, False),
    ("<Answer>3</Answer>", 3, False, False),
    ("", 5, False, False),
]

GEOQA_TABLE = [
    ("<think>180° - 40° = 140°</think> <answer> 140° </answer>", "140°", True, True),
    ("<answer> 140 </answer>", "140°", True, True),
    ("<answer> 25° </answer>", "25°", True, True),
    ("<answer> 40.0 </answer>", "40°", True, True),
    ("<answer> 8.0 </answer>", "8", True, True),
    ("<answer> \\frac{1}{2} </answer>", "0.5", True, True),
    ("<answer> 0.5 </answer>", "\\frac{1}{2}", True, True),
    ("<answer> 2√{3} </answer>", "2√{3}", True, True),
    ("<answer> 10√{2} </answer>", "10√{2}", True, True),
    ("<answer> 4πcm </answer>", "4πcm", True, True),
    ("<answer> 6 </answer>", "6cm", True, True),
    ("The angle is 140°", "140°", True, True),  # no tags: both read the free text
    # a number glued to the tag: math-verify on the whole output does not read it
    ("<answer>140°</answer>", "140°", False, True),
    ("<think>180 - 40</think>\n<answer>140°</answer>", "140°", False, True),
    ("<answer>140</answer>", "140°", False, True),
    ("<answer>40.0</answer>", "40°", False, True),
    ("<answer>6cm</answer>", "6cm", False, True),
    ("<answer>10√{2}</answer>", "10√{2}", False, True),
    ("<answer>\\frac{√{3}}{2}</answer>", "\\frac{√{3}}{2}", False, True),
    # the whole-output parse reads only the leading number of a surd, a π term or a ratio
    ("<answer> 10√{2} </answer>", "10", True, False),
    ("<answer> 10 </answer>", "10√{2}", True, False),
    ("<answer> 2√{5} </answer>", "2√{3}", True, False),
    ("<answer> 4 </answer>", "4πcm", True, False),
    ("<answer> 1:3 </answer>", "1:2", True, False),
    # a number in the reasoning or elsewhere scores when the tag holds a letter or something else
    ("<think>The angle is 140°.</think> <answer> A </answer>", "140°", True, False),
    ("Therefore x = 7. <answer> C </answer>", "7", True, False),
    ("$\\boxed{5}$ then <answer> 3 </answer>", "5", True, False),
    ("<answer> 5 </answer> wait <answer>3</answer>", "5", True, False),
    # wrong for both
    ("<answer> 40° </answer>", "140°", False, False),
    ("<think>x = 35°</think> <answer> 70° </answer>", "35°", False, False),
    ("<answer> 5 </answer> <answer> 3 </answer>", "5", False, False),
    ("no answer at all", "140°", False, False),
    ("", "140°", False, False),
]

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
    ("word", "left", "left"),
    ("word", " Right. ", "right"),
    ("word", "left", "right"),
    ("word", "to the left", "left"),
    ("word", "<answer>left</answer>", "left"),
    ("word", "", "left"),
]


@pytest.mark.parametrize(("scorer", "output", "gold"), AGREEMENT_TABLE)
def test_eval_scorer_agrees_with_the_reward(scorer, output, gold):
    reward = REWARDS[SCORERS[scorer].reward]
    _, correct = score(scorer, output, gold)
    assert correct == (reward([output], solution=[gold])[0] == 1.0)
    assert correct == (reward([[{"role": "assistant", "content": output}]], solution=[gold])[0] == 1.0)


@pytest.mark.parametrize("task", ["superclevr", "clevr_synthetic"])
@pytest.mark.parametrize(("output", "gold", "r1v", "strict"), COUNT_TABLE)
def test_counting_rules(task, output, gold, r1v, strict):
    assert score(task, output, gold, "r1v")[1] is r1v
    assert score(task, output, gold, "strict")[1] is strict


@pytest.mark.parametrize(("output", "gold", "r1v", "strict"), GEOQA_TABLE)
def test_geoqa_rules(output, gold, r1v, strict):
    assert score("geoqa", output, gold, "r1v")[1] is r1v
    assert score("geoqa", output, gold, "strict")[1] is strict


def test_tables_cover_both_directions():
    """Each table holds outputs on which the rules agree and outputs where each rule alone scores."""
    for table in (COUNT_TABLE, GEOQA_TABLE):
        assert {(r1v, strict) for _, _, r1v, strict in table} == {(True, True), (True, False), (False, True),
                                                                   (False, False)}  # fmt: skip


def test_r1v_extracted_answers_are_r1v_scripts():
    """What R1-V's scripts wrote as extracted_answer: an int (counting), str of math-verify's first value (GeoQA)."""
    assert score("superclevr", "<answer>٣</answer> <answer>4</answer>", 3, "r1v") == (3, True)
    assert score("superclevr", "<answer>3.0</answer>", 3, "r1v") == (None, False)
    assert score("geoqa", "<answer> 10√{2} </answer>", "10", "r1v") == ("10", True)
    assert score("geoqa", "<answer> 0.5 </answer>", "\\frac{1}{2}", "r1v") == ("0.500000000000000", True)
    assert score("geoqa", "<answer>140°</answer>", "140°", "r1v") == (None, False)


def test_every_task_has_strict_and_only_gsm8k_the_video_task_and_jsonl_lack_r1v():
    rewards = [s.reward for s in SCORERS.values() if s.reward and s.name not in ("rec", "click")]  # frames: own tasks
    assert TASKS["jsonl"].rules == []  # a user's own file: scored once --reward names the training reward
    assert [TASKS["jsonl"].scored_by(reward).scorer("strict").reward for reward in rewards] == rewards
    for reward in ("rec_accuracy", "click_accuracy"):
        with pytest.raises(SuzakError, match=rf"--reward '{reward}': boxes and clicks are scored .* `suzak.eval rec`"):
            TASKS["jsonl"].scored_by(reward)
    rules = {"gsm8k": ["strict"], "moving_ball": ["strict"], "jsonl": ["strict"], "rec": ["vlm_r1", "strict"],
             "grounding_shapes": ["vlm_r1", "strict"], "gui_click": ["strict"], "miniwob": ["strict"]}  # fmt: skip
    for task in [t for t in TASKS.values() if t.name != "jsonl"] + [TASKS["jsonl"].scored_by(r) for r in rewards]:
        assert task.rules == rules.get(task.name, ["r1v", "strict"])
        if task.name == "miniwob":  # an episode's verdict is its environment's own reward (TRL's get_reward)
            assert SCORERS[task.scorers["strict"]].reward is None
            continue
        assert SCORERS[task.scorers["strict"]].reward in REWARDS  # strict is the training reward's parser
        for rule in task.rules:
            assert task.scorer(rule).rule == rule and rule in SCORING_RULES
    assert all(s.reward is None for s in SCORERS.values() if s.rule in ("r1v", "vlm_r1"))  # no reward is their eval
    with pytest.raises(SuzakError, match=r"^gsm8k has no 'r1v' scoring rule \(R1-V never evaluated GSM8K.*use strict$"):
        get_task("gsm8k").scorer("r1v")
    with pytest.raises(SuzakError, match=r"^moving_ball has no 'r1v' scoring rule \(R1-V has no video task"):
        get_task("moving_ball").scorer("r1v")
    with pytest.raises(SuzakError, match=r"^jsonl has no 'r1v' scoring rule \(R1-V's rules belong to its own test"):
        get_task("jsonl").scored_by("clevr_count").scorer("r1v")
    with pytest.raises(SuzakError, match="unknown scoring rule 'loose'"):
        get_task("geoqa").scorer("loose")
    assert get_task("geoqa").other_rule("r1v") == "strict" and get_task("gsm8k").other_rule("strict") is None


@pytest.mark.parametrize(("task", "gold"), [("superclevr", "many"), ("superclevr", None), ("superclevr", ""),
                                            ("geoqa", None), ("geoqa", " "), ("gsm8k", "lots"),
                                            ("moving_ball", "up and down"), ("moving_ball", "")])  # fmt: skip
def test_bad_gold_raises_under_every_rule(task, gold):
    """A gold that cannot be read is an error, never an output scored wrong (checked before the output is read)."""
    for rule in get_task(task).rules:
        with pytest.raises((ValueError, TypeError)):
            score(task, "no answer", gold, rule)


def test_result_row_carries_both_rules():
    item = EvalItem(0, "0:x", {"question": "q"}, [], 3)
    row = result_row(get_task("superclevr"), item, "<answer>2</answer> no, <answer>3</answer>", "r1v")
    assert (row["extracted_answer"], row["is_correct"], row["is_correct_r1v"], row["is_correct_strict"]) == (
        2, False, False, True)  # fmt: skip
    row = result_row(get_task("superclevr"), item, "<answer>2</answer> no, <answer>3</answer>")
    assert (row["extracted_answer"], row["is_correct"]) == (3, True)
    gsm8k = result_row(get_task("gsm8k"), EvalItem(0, "0:x", {}, [], "18"), "#### 18")
    assert gsm8k["is_correct"] and gsm8k["is_correct_strict"] and "is_correct_r1v" not in gsm8k


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
    with pytest.raises(SuzakError, match="unknown --scoring 'r1-v': use r1v or vlm_r1 or strict"):
        EvalConfig(task="superclevr", model_path="tiny", scoring="r1-v")
    assert EvalConfig(task="superclevr", model_path="tiny").scoring == "strict"


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
    rank1 = PartialStore(out, {"model": "a", "max_new_tokens": 8}, SimpleNamespace(process_index=1, num_processes=2))
    assert rank1.path.name == "res.json.partial.rank1.jsonl"
    rank1.append([("3:dd", "z")])
    assert set(rank1.load()) == {"0:aa", "1:bb", "3:dd"}  # every rank's file is read on resume
    rank1.discard()
    assert store.files() == []


def test_shard_splits_items_by_rank():
    items = list(range(7))
    shards = [shard(items, SimpleNamespace(process_index=rank, num_processes=3)) for rank in range(3)]
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
    assert "30.63 | 38.72 | – |" in geoqa and "35.41 | 47.48 | – |" in geoqa  # no r1v figure: none beside them
    assert "This run has no r1v figure" in geoqa and "UNVERIFIED" not in geoqa and "±" not in geoqa
    assert [r for r in REFERENCES if not r.verified] == [r for r in REFERENCES if r.base == 55.0]


def test_results_file_and_summary_with_both_rules(tmp_path):
    results = [{"is_correct": s, "is_correct_strict": s, "is_correct_r1v": r} for s, r in
               [(True, True), (True, False), (False, True), (False, True)]]  # fmt: skip
    path = tmp_path / "r.json"
    assert write_results(path, results, "strict", "r1v") == 50.0
    saved = json.loads(path.read_text())
    assert list(saved) == ["accuracy", "scoring", "other_scoring", "other_accuracy", "results"]
    assert (saved["scoring"], saved["other_scoring"], saved["other_accuracy"]) == ("strict", "r1v", 75.0)
    write_results(path, [{"is_correct": True, "is_correct_strict": True}], "strict", None)  # gsm8k: one rule
    assert json.loads(path.read_text())["other_accuracy"] is None

    greedy = RunResult(str(path), 35.81, 270, 754, scoring="strict", other_scoring="r1v", other_accuracy=38.73,
                       other_correct=292)  # fmt: skip
    sampled = [RunResult("a", 30.0, 1, 754, 0, 1.0, scoring="strict", other_scoring="r1v", other_accuracy=31.0,
                         other_correct=2),
               RunResult("b", 32.0, 1, 754, 1, 1.0, scoring="strict", other_scoring="r1v", other_accuracy=33.0,
                         other_correct=2)]  # fmt: skip
    text = markdown_summary("geoqa", "m", greedy, sampled, {})
    run_table, references = text.split("## Published reference numbers")
    assert "| run | strict (%) | strict correct / N | r1v (%) | r1v correct / N | file |" in run_table
    assert "| greedy | 35.81 | 270 / 754 | 38.73 | 292 / 754 |" in run_table
    assert "31.00 ± 1.41 (mean ± std) | | 32.00 ± 1.41 (mean ± std)" in run_table
    assert "Scoring: **strict**" in run_table and "r1v is R1-V's eval scripts' rule" in run_table
    assert "| Qwen2-VL-7B | 30.63 | 38.72 | 38.73 |" in references  # the published numbers beside the r1v figure
    assert "35.81" not in references  # and never beside the strict one
    gsm8k = markdown_summary("gsm8k", "m", RunResult("g", 50.0, 1, 2), [], {})
    assert "gsm8k has no R1-V scoring rule" in gsm8k and "Published" not in gsm8k
