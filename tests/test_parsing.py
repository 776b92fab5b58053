"""Tables for suzak.scoring.parsing: hand-built (input, expected) rows, as open-r1 tests its rewards."""

from decimal import Decimal

import pytest

from suzak.scoring.formats import has_gsm8k_hash_line, is_think_format
from suzak.scoring.parsing import (
    completion_text,
    extract_tag,
    gold_answer,
    math_equal,
    parse_count,
    parse_gsm8k_answer,
    parse_int_answer,
    parse_number,
    r1v_accuracy,
    r1v_count,
    r1v_math_verify,
)

GSM8K_NATALIA = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"
)


@pytest.mark.parametrize(
    "completion",
    [
        "<answer>3</answer>",
        [{"role": "assistant", "content": "<answer>3</answer>"}],
        [{"content": "<answer>3</answer>"}],
        [{"role": "assistant", "content": [{"type": "text", "text": "<answer>3</answer>"}]}],
        [
            {
                "role": "assistant",
                "content": [{"type": "text", "text": "<answer>"}, {"type": "text", "text": "3</answer>"}],
            }
        ],
        [
            {"role": "assistant", "content": "first try"},
            {"role": "tool", "content": "result"},
            {"role": "assistant", "content": "<answer>3</answer>"},
        ],
    ],
)
def test_completion_text_forms(completion):
    assert completion_text(completion) == "<answer>3</answer>"


@pytest.mark.parametrize(
    ("completion", "error"),
    [(3, "int"), (None, "NoneType"), ({"content": "x"}, "dict"), ([], "assistant"), ([{"role": "assistant"}], "None")],
)
def test_completion_text_rejects(completion, error):
    with pytest.raises(TypeError, match=error):
        completion_text(completion)


@pytest.mark.parametrize(
    ("text", "tag", "expected"),
    [
        ("<answer> 3 </answer>", "answer", "3"),
        ("<answer>1</answer> on second thought <answer>\n2\n</answer>", "answer", "2"),
        ("<answer>1<answer>2</answer>", "answer", "2"),
        ("<answer>3</answer> trailing </answer>", "answer", "3"),
        ("<answer></answer>", "answer", ""),
        ("<think> a </think>", "think", "a"),
        ("<answer>3", "answer", None),
        ("3</answer>", "answer", None),
        ("3", "answer", None),
    ],
)
def test_extract_tag(text, tag, expected):
    assert extract_tag(text, tag) == expected


@pytest.mark.parametrize(
    ("solution", "expected"),
    [
        (3, "3"),
        (2.5, "2.5"),
        ("3", "3"),
        ("  3 \n", "3"),
        ("<answer> 3 </answer>", "3"),
        ("<answer> 140° </answer>", "140°"),
        ("140°", "140°"),
        ("\\frac{1}{2}", "\\frac{1}{2}"),
        (GSM8K_NATALIA, "72"),
        ("She pays 1,000 + 234 = <<1000+234=1234>>1,234 dollars.\n#### 1,234", "1234"),
        ("He loses 5.\n#### -5", "-5"),
        ("Half of 5 is 2.5\n#### 2.5", "2.5"),
    ],
)
def test_gold_answer(solution, expected):
    assert gold_answer(solution) == expected


@pytest.mark.parametrize("solution", [None, "", "   ", "<answer>  </answer>", "so the answer is\n#### ?"])
def test_gold_answer_rejects_empty(solution):
    with pytest.raises(ValueError):
        gold_answer(solution)


@pytest.mark.parametrize("solution", [True, [3], {"answer": 3}])
def test_gold_answer_rejects_types(solution):
    with pytest.raises(TypeError):
        gold_answer(solution)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("3", 3),
        (" 3 ", 3),
        ("\n10\n", 10),
        ("3.0", 3),
        ("3.", 3),
        ("+3", 3),
        ("-2", -2),
        ("03", 3),
        ("three", 3),
        ("Three", 3),
        ("TWENTY.", 20),
        ("zero", 0),
        ("3.5", None),
        ("abc", None),
        ("", None),
        ("3 cubes", None),
        ("twenty-one", None),
        ("1,000", None),
    ],
)
def test_parse_int_answer(text, expected):
    assert parse_int_answer(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<think>I count 5, no, 3.</think> <answer> 3 </answer>", 3),
        ("<answer>3</answer>", 3),
        ("<answer>\n7\n</answer>", 7),
        ("<answer>four</answer>", 4),
        ("<answer>2</answer> wait <answer>3</answer>", 3),
        ("3", None),
        ("The answer is 3.", None),
        ("<answer>3", None),
        ("<answer>3 objects</answer>", None),
        ("<answer></answer>", None),
    ],
)
def test_parse_count(text, expected):
    assert parse_count(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("18", Decimal(18)),
        ("18.", Decimal(18)),
        ("18.0", Decimal(18)),
        ("$18", Decimal(18)),
        ("$1,234.50", Decimal("1234.50")),
        ("-3", Decimal(-3)),
        ("-$3", Decimal(-3)),
        ("+3", Decimal(3)),
        (".5", Decimal("0.5")),
        (" 2.5 ", Decimal("2.5")),
        ("50%", None),
        ("18 apples", None),
        ("eighteen", None),
        ("", None),
        ("1e3", None),
    ],
)
def test_parse_number(text, expected):
    assert parse_number(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (GSM8K_NATALIA, Decimal(72)),
        ("#### 1,234", Decimal(1234)),
        ("#### -5", Decimal(-5)),
        ("#### 2.5", Decimal("2.5")),
        ("#### $18.", Decimal(18)),
        ("#### 18 apples", Decimal(18)),
        ("####18", Decimal(18)),
        ("#### 17\nno wait\n#### 18", Decimal(18)),
        ("<think>16 + 2</think><answer>18</answer>", Decimal(18)),
        ("<answer>$1,234.50</answer>", Decimal("1234.50")),
        ("The answer is 18.", None),
        ("#### eighteen", None),
        ("18", None),
        ("<answer>eighteen</answer>", None),
    ],
)
def test_parse_gsm8k_answer(text, expected):
    assert parse_gsm8k_answer(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<think>three cubes</think><answer>3</answer>", True),
        ("<think> a </think> <answer> 3 </answer>", True),
        ("<think>\nline one\nline two\n</think>\n\n<answer>\n3\n</answer>", True),
        ("\n  <think>a</think><answer>3</answer>  \n", True),
        ("<answer>3</answer>", False),
        ("<think>a</think>", False),
        ("<think>a</think><answer>3</answer> That is all.", False),
        ("Sure! <think>a</think><answer>3</answer>", False),
        ("<think>a</think> so <answer>3</answer>", False),
        ("<answer>3</answer><think>a</think>", False),
        ("<think>a<answer>3</answer>", False),
        ("", False),
    ],
)
def test_is_think_format(text, expected):
    assert is_think_format(text) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (GSM8K_NATALIA, True),
        ("#### 18", True),
        ("steps\n#### $1,234\n\n", True),
        ("steps\n  #### -5  ", True),
        ("#### 2.5", True),
        ("#### 18\nHope this helps!", False),
        ("#### eighteen", False),
        ("#### 18 apples", False),
        ("The answer is 18", False),
        ("", False),
    ],
)
def test_has_gsm8k_hash_line(text, expected):
    assert has_gsm8k_hash_line(text) is expected


@pytest.mark.parametrize(
    ("completion", "solution", "expected"),
    [
        # GeoQA golds with degrees, in both gold forms.
        ("<think>180 - 40</think> <answer>140°</answer>", "140°", True),
        ("<answer>140°</answer>", "<answer> 140° </answer>", True),
        ("<answer>140</answer>", "140°", True),
        ("<answer>40°</answer>", "140°", False),
        ("<answer>40°</answer>", "<answer> 140° </answer>", False),
        # A number in the reasoning must not score when the answer tag says otherwise.
        ("<think>maybe 140°</think><answer>40°</answer>", "140°", False),
        # Fractions and roots: math-verify equivalence.
        ("<answer>\\frac{1}{2}</answer>", "\\frac{1}{2}", True),
        ("<answer>0.5</answer>", "\\frac{1}{2}", True),
        ("<answer>1/2</answer>", "\\frac{1}{2}", True),
        ("<answer>\\frac{1}{3}</answer>", "\\frac{1}{2}", False),
        ("<answer>2√{3}</answer>", "2√{3}", True),
        ("<answer>2\\sqrt{3}</answer>", "2√{3}", True),
        ("<answer>\\sqrt{12}</answer>", "2√{3}", True),
        ("<answer>2√{5}</answer>", "2√{3}", False),
        ("<answer>2</answer>", "2√{3}", False),
        # No tags: math-verify reads the free text, as R1-V's GeoQA eval does.
        ("The angle is 140°.", "140°", True),
        ("The angle is 40°.", "140°", False),
        # String fallback: golds math-verify cannot parse.
        ("<answer>A</answer>", "A", True),
        ("<answer>B</answer>", "A", False),
        ("<answer>A</answer>", "<answer> A </answer>", True),
        ("<answer>an isosceles triangle</answer>", "an isosceles triangle", True),
        ("<answer>a right triangle</answer>", "an isosceles triangle", False),
        # Malformed completions.
        ("<answer></answer>", "140°", False),
        ("", "140°", False),
        ("<answer>???</answer>", "3", False),
        # Numeric golds.
        ("<answer>3</answer>", 3, True),
        ("<answer>3.0</answer>", "3", True),
    ],
)
def test_math_equal(completion, solution, expected):
    assert math_equal(completion, solution) is expected


def test_math_equal_bad_gold_raises():
    with pytest.raises(ValueError):
        math_equal("<answer>3</answer>", "<answer> </answer>")


# --- R1-V's rules ----------------------------------------------------------------------------------------------------
# The eval rules are tabled with their gold answers in tests/test_eval_scoring.py; here the parsers themselves.


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<answer> 4 </answer>", 4),
        ("<answer>\n4\n</answer>", 4),
        ("<answer>2</answer> no, <answer>4</answer>", 2),  # the first tag
        ("<answer>two</answer> no, <answer>4</answer>", 4),  # the first tag holding a bare number
        ("<answer>٤</answer>", 4),  # any Unicode decimal digit
        ("<answer>４２</answer>", 42),
        ("<answer>4.0</answer>", None),
        ("<answer>+4</answer>", None),
        ("<answer>four</answer>", None),
        ("4", None),
    ],
)
def test_r1v_count(text, expected):
    assert r1v_count(text) == expected


def test_r1v_math_verify_reads_the_whole_output():
    assert r1v_math_verify("<think>x = 7</think> <answer> C </answer>", "7") == ("7", True)
    assert r1v_math_verify("<answer> 5 </answer> <answer> 3 </answer>", "3") == ("3", True)  # the rightmost number
    assert r1v_math_verify("$\\boxed{5}$ <answer> 3 </answer>", "5") == ("5", True)  # math-verify's priorities
    assert r1v_math_verify("<answer> 2 </answer>", "√{3}") == ("2", False)  # a gold R1-V's parse cannot read: 0


@pytest.mark.parametrize(
    ("completion", "solution", "expected"),
    [
        ("<think>I see 3 cubes</think> <answer> 3 </answer>", "<answer> 3 </answer>", True),
        ("<answer> 3.0 </answer>", "<answer> 3 </answer>", True),  # math-verify: 3.0 == 3
        ("<answer>\n3\n</answer>", "<answer> 3 </answer>", True),
        ("<answer>140°</answer>", "<answer> 140° </answer>", True),  # math-verify misses it, the string match not
        ("<answer>C</answer>", "<answer> C </answer>", True),
        ("<answer> C </answer>", "C", True),  # a side without tags: its whole stripped text
        ("3", "<answer> 3 </answer>", True),  # no tags needed: math-verify reads the bare number
        ("There are 3 objects.", "<answer> 3 </answer>", True),
        ("<think>I see 3 cubes</think> <answer>many</answer>", "<answer> 3 </answer>", True),  # the known hole
        ("<answer>3</answer> <answer>2</answer>", "<answer> 3 </answer>", True),  # the first tag's string
        ("<answer>2</answer> <answer>3</answer>", "<answer> 3 </answer>", False),
        ("<answer>3.0</answer>", "<answer> 3 </answer>", False),  # glued: math-verify reads nothing, strings differ
        ("<answer>three</answer>", "<answer> 3 </answer>", False),
        ("<answer>٣</answer>", "<answer> 3 </answer>", False),  # R1-V's training reward takes no Unicode digits
        ("<answer>\nC\n</answer>", "<answer> C </answer>", False),  # R1-V's string match stops at a newline
        ("<think>I count 3</think> <answer> 4 </answer>", "<answer> 3 </answer>", False),  # the rightmost number
        ("<answer>D</answer>", "C", False),
        ("", "<answer> 3 </answer>", False),
    ],
)
def test_r1v_accuracy(completion, solution, expected):
    assert r1v_accuracy(completion, solution) is expected
