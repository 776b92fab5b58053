"""Reward tables (open-r1 style), the registry, and the reward pre-flight."""

import functools
import pickle

import pytest

from suzak import SuzakError
from suzak.scoring.rewards import (
    REWARDS,
    clevr_count,
    gsm8k_accuracy,
    gsm8k_format,
    math_accuracy,
    r1v_accuracy,
    resolve_reward,
    resolve_rewards,
    think_format,
)
from suzak.training.checks import preflight

GSM8K_NATALIA = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"
)


def as_text(text):
    return text


def as_conversation(text):
    return [{"role": "assistant", "content": text}]


# Every reward is tested on both completion forms TRL produces.
FORMS = pytest.mark.parametrize("form", [as_text, as_conversation], ids=["text", "conversational"])


def score(reward, completion, form, **kwargs):
    """One completion through a reward, as a batch of one."""
    [value] = reward([form(completion)], **kwargs)
    return value


def my_reward(completions, bonus=0.5, **kwargs):
    """A reward defined in a test module, resolved by dotted path."""
    return [bonus for _ in completions]


# --- clevr_count -------------------------------------------------------------------------------------------------


@FORMS
@pytest.mark.parametrize("gold", [3, "3", "<answer> 3 </answer>", " 3 ", 3.0])
@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("<think>I count three cubes.</think> <answer> 3 </answer>", 1.0),
        ("<answer>3</answer>", 1.0),
        ("<answer>three</answer>", 1.0),
        ("<answer>3.0</answer>", 1.0),
        ("<think>I see 3</think><answer>4</answer>", 0.0),
        ("<answer>2</answer> no wait <answer>3</answer>", 1.0),
        ("<answer>3</answer> no wait <answer>4</answer>", 0.0),
        ("3", 0.0),
        ("There are 3 objects.", 0.0),
        ("<answer>3 objects</answer>", 0.0),
        ("<answer>3.5</answer>", 0.0),
        ("<answer></answer>", 0.0),
        ("", 0.0),
    ],
)
def test_clevr_count(completion, expected, gold, form):
    assert score(clevr_count, completion, form, solution=[gold]) == expected


@pytest.mark.parametrize("gold", ["three cubes", "<answer> </answer>", "", None, "3.5", [3]])
def test_clevr_count_bad_gold_names_row(gold):
    with pytest.raises(ValueError, match=r"clevr_count.*row 1"):
        clevr_count(["<answer>3</answer>"] * 2, solution=["<answer> 3 </answer>", gold])


def test_clevr_count_logs_unparsed_fraction():
    metrics, extras = {}, {}
    rewards = clevr_count(
        ["<answer>3</answer>", "3", "<answer>x</answer>", "<answer>4</answer>"],
        solution=[3] * 4,
        log_metric=metrics.__setitem__,
        log_extra=extras.__setitem__,
    )
    assert rewards == [1.0, 0.0, 0.0, 0.0]
    assert metrics == {"clevr_count/unparsed_frac": 0.5}
    assert extras == {"clevr_count/answer": ["3", None, None, "4"]}


def test_clevr_count_plain_answer_format():
    """The ``plain`` template's bare answers, set from a recipe's reward_kwargs; the pre-flight then agrees."""
    reward = resolve_reward("clevr_count", {"answer_format": "plain"})
    assert reward.__name__ == "clevr_count"
    assert reward(["3", " three.", "<answer>3</answer>", "3 cubes", "4"], solution=["3"] * 5) == [1, 1, 0, 0, 0]
    rows = [{"prompt": [{"role": "user", "content": "How many?"}], "solution": str(n)} for n in (1, 2, 3)]
    preflight(rows, [reward], "plain")
    with pytest.raises(SuzakError, match="clevr_count"):
        preflight(rows, [clevr_count], "plain")  # the default reads <answer> tags: a plain recipe must say so
    with pytest.raises(ValueError, match="answer_format"):
        clevr_count(["3"], solution=["3"], answer_format="tagged")


def test_clevr_count_takes_trl_kwargs():
    """GRPOTrainer passes prompts, completion_ids, every column and its own helpers: all must be accepted."""
    rewards = clevr_count(
        prompts=[[{"role": "user", "content": "How many?"}]],
        completions=[as_conversation("<answer>3</answer>")],
        completion_ids=[[1, 2, 3]],
        solution=["<answer> 3 </answer>"],
        problem=["How many items are there in the image?"],
        image=[None],
        trainer_state=None,
        log_extra=lambda *a: None,
        log_metric=lambda *a: None,
    )
    assert rewards == [1.0]


# --- think_format ------------------------------------------------------------------------------------------------


@FORMS
@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("<think>three cubes</think><answer>3</answer>", 1.0),
        ("<think>\nI count:\n1, 2, 3\n</think>\n<answer>\n3\n</answer>", 1.0),
        ("  <think>a</think> <answer>3</answer>\n", 1.0),
        ("<answer>3</answer>", 0.0),
        ("<think>a</think>", 0.0),
        ("<think>a</think><answer>3</answer> Hope this helps.", 0.0),
        ("Let me see. <think>a</think><answer>3</answer>", 0.0),
        ("<think>a</think> therefore <answer>3</answer>", 0.0),
        ("3", 0.0),
        ("", 0.0),
    ],
)
def test_think_format(completion, expected, form):
    assert score(think_format, completion, form) == expected


# --- gsm8k_accuracy ----------------------------------------------------------------------------------------------


@FORMS
@pytest.mark.parametrize(
    ("completion", "gold", "expected"),
    [
        ("48 / 2 = 24, 48 + 24 = 72\n#### 72", GSM8K_NATALIA, 1.0),
        ("#### 72", "72", 1.0),
        ("#### 72", 72, 1.0),
        ("#### 72.0", GSM8K_NATALIA, 1.0),
        ("#### $72", GSM8K_NATALIA, 1.0),
        ("#### 72.", GSM8K_NATALIA, 1.0),
        ("#### 72 clips", GSM8K_NATALIA, 1.0),
        ("<think>48 + 24</think><answer>72</answer>", GSM8K_NATALIA, 1.0),
        ("#### 1234", "So it costs 1,234 dollars.\n#### 1,234", 1.0),
        ("#### 1,234", "So it costs 1,234 dollars.\n#### 1,234", 1.0),
        ("#### $1,234.00", "#### 1,234", 1.0),
        ("#### -5", "He is 5 below.\n#### -5", 1.0),
        ("#### 5", "He is 5 below.\n#### -5", 0.0),
        ("#### 2.5", "Half of 5.\n#### 2.5", 1.0),
        ("#### 2.50", "<answer> 2.5 </answer>", 1.0),
        ("#### 2", "Half of 5.\n#### 2.5", 0.0),
        ("#### 71", GSM8K_NATALIA, 0.0),
        ("#### 70\nOops, recount.\n#### 72", GSM8K_NATALIA, 1.0),
        ("#### 72\nOops, recount.\n#### 70", GSM8K_NATALIA, 0.0),
        ("The answer is 72.", GSM8K_NATALIA, 0.0),
        ("72", GSM8K_NATALIA, 0.0),
        ("#### seventy-two", GSM8K_NATALIA, 0.0),
        ("", GSM8K_NATALIA, 0.0),
    ],
)
def test_gsm8k_accuracy(completion, gold, expected, form):
    assert score(gsm8k_accuracy, completion, form, solution=[gold]) == expected


@pytest.mark.parametrize("gold", ["no final line", "#### ?", "", None, "<answer> seventy </answer>"])
def test_gsm8k_accuracy_bad_gold_names_row(gold):
    with pytest.raises(ValueError, match=r"gsm8k_accuracy.*row 2"):
        gsm8k_accuracy(["#### 1"] * 3, solution=["#### 1", "#### 1", gold])


def test_gsm8k_accuracy_logs_unparsed_fraction():
    metrics = {}
    gsm8k_accuracy(["#### 72", "72", "#### 70", "none"], solution=["#### 72"] * 4, log_metric=metrics.__setitem__)
    assert metrics == {"gsm8k_accuracy/unparsed_frac": 0.5}


# --- gsm8k_format ------------------------------------------------------------------------------------------------


@FORMS
@pytest.mark.parametrize(
    ("completion", "style", "expected"),
    [
        (GSM8K_NATALIA, "hash", 1.0),
        ("#### 18", "hash", 1.0),
        ("steps\n#### $1,234\n", "hash", 1.0),
        ("#### 18\nDone!", "hash", 0.0),
        ("The answer is 18.", "hash", 0.0),
        ("#### eighteen", "hash", 0.0),
        ("<think>a</think><answer>18</answer>", "hash", 0.0),
        ("<think>a</think><answer>18</answer>", "think", 1.0),
        ("#### 18", "think", 0.0),
    ],
)
def test_gsm8k_format(completion, style, expected, form):
    assert score(gsm8k_format, completion, form, style=style) == expected


def test_gsm8k_format_unknown_style():
    with pytest.raises(ValueError, match="unknown style 'xml'"):
        gsm8k_format(["#### 1"], style="xml")


# --- math_accuracy -----------------------------------------------------------------------------------------------


@FORMS
@pytest.mark.parametrize(
    ("completion", "gold", "expected"),
    [
        ("<think>180° - 40° = 140°</think> <answer>140°</answer>", "140°", 1.0),
        ("<answer>140°</answer>", "<answer> 140° </answer>", 1.0),
        ("<answer>140</answer>", "140°", 1.0),
        ("<answer>40°</answer>", "140°", 0.0),
        ("<think>140°?</think><answer>40°</answer>", "<answer> 140° </answer>", 0.0),
        ("<answer>\\frac{1}{2}</answer>", "\\frac{1}{2}", 1.0),
        ("<answer>0.5</answer>", "\\frac{1}{2}", 1.0),
        ("<answer>\\frac{2}{3}</answer>", "\\frac{1}{2}", 0.0),
        ("<answer>2√{3}</answer>", "2√{3}", 1.0),
        ("<answer>2\\sqrt{3}</answer>", "<answer> 2√{3} </answer>", 1.0),
        ("<answer>2√{5}</answer>", "2√{3}", 0.0),
        ("<answer>A</answer>", "A", 1.0),
        ("<answer>C</answer>", "A", 0.0),
        ("<answer>3</answer>", 3, 1.0),
        ("<answer></answer>", "140°", 0.0),
        ("no answer at all", "140°", 0.0),
    ],
)
def test_math_accuracy(completion, gold, expected, form):
    assert score(math_accuracy, completion, form, solution=[gold]) == expected


def test_math_accuracy_bad_gold_names_row():
    with pytest.raises(ValueError, match=r"math_accuracy.*row 0"):
        math_accuracy(["<answer>3</answer>"], solution=["<answer> </answer>"])


# --- r1v_accuracy ------------------------------------------------------------------------------------------------


@FORMS
@pytest.mark.parametrize(
    ("completion", "gold", "expected", "strict"),
    [
        ("<think>I count three cubes.</think> <answer> 3 </answer>", "<answer> 3 </answer>", 1.0, 1.0),
        ("<answer>3</answer>", "<answer> 3 </answer>", 1.0, 1.0),
        ("<think>I see 3 cubes</think> <answer>many</answer>", "<answer> 3 </answer>", 1.0, 0.0),  # the hole
        ("There are 3 objects.", "<answer> 3 </answer>", 1.0, 0.0),
        ("<answer>3</answer> no wait <answer>4</answer>", "<answer> 3 </answer>", 1.0, 0.0),  # the first tag
        ("<answer>2</answer> no wait <answer>3</answer>", "<answer> 3 </answer>", 0.0, 1.0),
        ("<answer>three</answer>", "<answer> 3 </answer>", 0.0, 1.0),
        ("<answer>3.0</answer>", "<answer> 3 </answer>", 0.0, 1.0),
        ("<answer>4</answer>", "<answer> 3 </answer>", 0.0, 0.0),
        ("", "<answer> 3 </answer>", 0.0, 0.0),
    ],
)
def test_r1v_accuracy(completion, gold, expected, strict, form):
    """R1-V's training reward, beside suzak's strict clevr_count on the same completions."""
    assert score(r1v_accuracy, completion, form, solution=[gold]) == expected
    assert score(clevr_count, completion, form, solution=[gold]) == strict


@pytest.mark.parametrize("gold", [None, "", "<answer> </answer>", [3]])
def test_r1v_accuracy_bad_gold_names_row(gold):
    with pytest.raises(ValueError, match=r"r1v_accuracy.*row 1"):
        r1v_accuracy(["<answer>3</answer>"] * 2, solution=["<answer> 3 </answer>", gold])


# --- registry ----------------------------------------------------------------------------------------------------


def test_registry_names():
    assert set(REWARDS) == {"clevr_count", "think_format", "gsm8k_accuracy", "gsm8k_format", "math_accuracy",
                            "r1v_accuracy", "word_match", "anls", "ocr_exact", "iou", "rec_accuracy", "box_format",
                            "box_f1", "box_map", "click_accuracy", "dynamic_iou", "zoom_used", "judge"}  # fmt: skip
    for name, func in REWARDS.items():
        assert callable(func) and func.__name__ == name
        assert resolve_reward(name) is func


def test_resolve_dotted_paths():
    assert resolve_reward("suzak.scoring.rewards.think_format") is think_format
    assert resolve_reward(f"{__name__}.my_reward") is my_reward


@pytest.mark.parametrize("name", ["clevr", "suzak.scoring.rewards.nope", "no_such_pkg.reward"])
def test_resolve_unknown_lists_known(name):
    with pytest.raises(SuzakError) as info:
        resolve_reward(name)
    message = str(info.value)
    assert "\n" not in message and name in message
    assert all(known in message for known in REWARDS)


def test_resolve_not_callable():
    with pytest.raises(SuzakError, match="not a function"):
        resolve_reward("suzak.scoring.rewards.REWARDS")


def test_resolve_kwargs_partial_keeps_name():
    reward = resolve_reward("gsm8k_format", {"style": "think"})
    assert isinstance(reward, functools.partial) and reward.__name__ == "gsm8k_format"
    assert reward(["<think>a</think><answer>1</answer>", "#### 1"]) == [1.0, 0.0]
    assert pickle.loads(pickle.dumps(reward)).__name__ == "gsm8k_format"  # TRL's async worker pickles rewards
    custom = resolve_reward(f"{__name__}.my_reward", {"bonus": 0.25})
    assert custom.__name__ == "my_reward" and custom(["x"]) == [0.25]


@pytest.mark.parametrize(
    ("name", "kwargs", "error"),
    [
        ("gsm8k_format", {"styel": "think"}, "'gsm8k_format' has no parameter 'styel'"),
        ("think_format", {"style": "hash"}, "'think_format' has no parameter 'style'"),
        ("clevr_count", {"completions": []}, "passed by the trainer"),
        ("clevr_count", {"log_metric": print}, "passed by the trainer"),
    ],
)
def test_resolve_bad_kwargs(name, kwargs, error):
    with pytest.raises(SuzakError, match=error):
        resolve_reward(name, kwargs)


def test_resolve_rewards():
    rewards = resolve_rewards(["clevr_count", "gsm8k_format"], {"gsm8k_format": {"style": "think"}})
    assert rewards[0] is clevr_count and rewards[1].keywords == {"style": "think"}
    assert resolve_rewards(["think_format"], None) == [think_format]
    with pytest.raises(SuzakError, match="gsm8k_format"):
        resolve_rewards(["clevr_count"], {"gsm8k_format": {"style": "think"}})


def test_word_match_reads_one_word_answers_in_either_format():
    from suzak.scoring.rewards import gold_parser, word_match

    logged = {}
    scores = word_match(["red", " Blue.", "red blue", "", "<answer>red</answer>"], solution=["red", "blue", "red",
                        "red", "red"], log_metric=logged.__setitem__)  # fmt: skip
    assert scores == [1.0, 1.0, 0.0, 0.0, 0.0] and logged == {"word_match/unparsed_frac": 0.4}
    tagged = resolve_reward("word_match", {"answer_format": "think_answer"})
    assert tagged(["<think>it is red</think> <answer> Red </answer>", "red"], solution=["red", "red"]) == [1.0, 0.0]
    assert gold_parser(tagged)(" Blue ") == "blue"  # the dataset validation reads gold words with it
    with pytest.raises(ValueError, match="no word parser for answer format 'gsm8k_hash'"):
        word_match(["red"], solution=["red"], answer_format="gsm8k_hash")
