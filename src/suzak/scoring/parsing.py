"""Answer parsers: the one place rewards, evaluation and data builders read an answer out of text. A rule that only
rewards read lives beside them instead (the think/answer format: :mod:`suzak.scoring.formats`; ANLS:
:mod:`suzak.scoring.ocr`).

Pure functions on strings (no torch). Rewards call them per completion; evaluation calls the same ones, so a
training reward and an eval score can never disagree about what the model answered.

Two families of rules live here. suzak's own (``parse_count``, ``math_equal``, ``parse_gsm8k_answer``): the last
``<answer>`` tag, read strictly. And R1-V's, reproduced exactly so numbers can be compared with its published table
(``r1v_count``, ``r1v_math_verify``: its eval scripts; ``r1v_accuracy``: its training reward). They differ on
purpose: R1-V reads the first tag, math-verifies the whole output (a number in the reasoning can score) and takes
any Unicode digit.

>>> parse_count("<think> I see three cubes. </think> <answer> 3 </answer>")
3
>>> parse_gsm8k_answer("48 / 2 = 24 and 48 + 24 = 72\\n#### 72")
Decimal('72')
>>> gold_answer("<answer> 140° </answer>")
'140°'
"""

from __future__ import annotations

import functools
import json
import logging
import re
import threading
from collections.abc import Callable
from decimal import Decimal

__all__ = [
    "box_parser",
    "completion_text",
    "content_text",
    "count_parser",
    "extract_tag",
    "gold_answer",
    "gold_boxes",
    "gold_texts",
    "is_box_answer",
    "math_equal",
    "message_text",
    "parse_boxes",
    "parse_count",
    "parse_gsm8k_answer",
    "parse_int_answer",
    "parse_number",
    "parse_point",
    "parse_word",
    "point_parser",
    "r1v_accuracy",
    "r1v_count",
    "r1v_math_verify",
    "text_parser",
    "vlm_r1_box",
    "vlm_r1_iou",
    "with_opening",
]

logger = logging.getLogger(__name__)

_NUMBER_WORDS = {
    w: i
    for i, w in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
        "seventeen eighteen nineteen twenty".split()
    )
}
_INT_RE = re.compile(r"([+-]?[0-9]+)(?:\.0+)?")  # "3", "+3", "3.0" (a trailing "." is stripped first)
_NUMBER_RE = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)")
# A number-looking token in free text: "-$1,234.50", "18", ".5". Commas and "$" are removed by parse_number.
_NUMBER_TOKEN_RE = re.compile(r"-?\$?-?(?:[0-9][0-9,]*(?:\.[0-9]+)?|\.[0-9]+)")
# openai/grade-school-math's own extractor for the gold answer (commas removed afterwards).
_GSM8K_GOLD_RE = re.compile(r"#### (\-?[0-9\.\,]+)")
# R1-V's eval scripts' count: the first match; \d is any Unicode decimal digit (٣, ３), no sign, no decimals.
_R1V_COUNT_RE = re.compile(r"<answer>\s*(\d+)\s*</answer>")
# R1-V's training reward reads tag contents with this: the first pair on one line ("." stops at a newline).
_R1V_TAG_RE = re.compile(r"<answer>(.*?)</answer>")
# A box as the Qwen families write one: Qwen2-VL's tokens, or 4 numbers in brackets (JSON "bbox_2d" values, VLM-R1's
# plain lists). A list of 3 or 5 numbers is no box. Qwen2-VL's <|box_start|> and <|box_end|> are special tokens, which
# TRL's and the evaluation's decoding (skip_special_tokens=True) drop: the pair of points alone is its box too.
_BOX_NUMBER = r"\s*(-?[0-9]+(?:\.[0-9]+)?)\s*"
_BOX_RE = re.compile(
    rf"(?:<\|box_start\|>)?\s*\({_BOX_NUMBER},{_BOX_NUMBER}\)\s*,\s*\({_BOX_NUMBER},{_BOX_NUMBER}\)\s*(?:<\|box_end\|>)?"
    rf"|\[{_BOX_NUMBER},{_BOX_NUMBER},{_BOX_NUMBER},{_BOX_NUMBER}\]"
)
# math-verify's own defaults (what R1-V ran with). Its timeouts use signal.alarm, which only works in the main thread.
_PARSE_TIMEOUT_S = 5
_VERIFY_TIMEOUT_S = 5


def completion_text(completion) -> str:
    """The text of one completion, in any form TRL hands to a reward function.

    Accepts a plain string, a conversation (the last assistant message is taken; a message without a role counts,
    as in TRL's own examples), and content given as a list of parts (the text parts are joined).

    >>> completion_text("<answer>3</answer>")
    '<answer>3</answer>'
    >>> completion_text([{"role": "assistant", "content": "<answer>3</answer>"}])
    '<answer>3</answer>'
    >>> completion_text([{"role": "assistant", "content": [{"type": "text", "text": "<answer>3</answer>"}]}])
    '<answer>3</answer>'
    >>> completion_text(3)
    Traceback (most recent call last):
    ...
    TypeError: a completion must be a string or a list of messages, not int
    """
    if isinstance(completion, str):
        return completion
    if not isinstance(completion, list):
        raise TypeError(f"a completion must be a string or a list of messages, not {type(completion).__name__}")
    replies = [m for m in completion if isinstance(m, dict) and m.get("role", "assistant") == "assistant"]
    if not replies:
        raise TypeError(f"a completion given as a list must hold an assistant message, got {completion!r:.200}")
    content = replies[-1].get("content")
    if content is None:
        raise TypeError("a completion's message content must be a string or a list of parts, not None")
    return content_text(content)


def with_opening(completion, opening: str):
    """``completion`` (any form :func:`completion_text` reads) with ``opening`` in front of its text: the whole
    assistant turn when the chat template wrote ``opening`` at its start (:func:`suzak.scoring.prompts.template_opening`).

    >>> with_opening(" 3 </think> <answer>3</answer>", "<think>\\n")
    '<think>\\n 3 </think> <answer>3</answer>'
    >>> with_opening([{"role": "assistant", "content": "x"}], "<think>\\n")
    [{'role': 'assistant', 'content': '<think>\\nx'}]
    >>> with_opening([{"role": "assistant", "content": [{"type": "text", "text": "x"}]}], "<t>")
    [{'role': 'assistant', 'content': [{'type': 'text', 'text': '<t>x'}]}]
    """
    if not opening:
        return completion
    if isinstance(completion, str):
        return opening + completion
    completion_text(completion)  # the same TypeError for a form it cannot read
    messages = [dict(m) if isinstance(m, dict) else m for m in completion]
    reply = next(m for m in reversed(messages) if isinstance(m, dict) and m.get("role", "assistant") == "assistant")
    content = reply.get("content")
    if isinstance(content, list):
        parts = [dict(p) if isinstance(p, dict) else p for p in content]
        first = next((p for p in parts if isinstance(p, dict) and p.get("type") == "text"), None)
        if first is None:
            parts.insert(0, {"type": "text", "text": opening})
        else:
            first["text"] = opening + (first.get("text") or "")
        reply["content"] = parts
    else:
        reply["content"] = opening + (content or "")
    return messages


def content_text(content, image: str = "", video: str = "") -> str:
    """The text of one message's content: a string, or its parts' text with ``image`` standing for an image part
    and ``video`` for a video part.

    >>> content_text([{"type": "image"}, {"type": "text", "text": "How many?"}], image="<image>")
    '<image>How many?'
    """
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list):
        parts = [part for part in content if isinstance(part, dict)]
        stand_in = {"image": image, "video": video}
        return "".join(stand_in.get(part.get("type"), str(part.get("text") or "")) for part in parts)
    raise TypeError(f"message content must be a string or a list of parts, not {type(content).__name__}")


def message_text(messages) -> str:
    """Plain text of a prompt or completion for people to read: a string, or chat messages, ``<image>`` for images
    and ``<video>`` for a video; a multi-turn completion shows each tool call and each tool's answer.

    >>> message_text([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many?"}]}])
    '<image>How many?'
    >>> message_text([{"role": "assistant", "content": "<answer>3</answer>"}])
    '<answer>3</answer>'
    >>> print(message_text([{"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function":
    ...     {"name": "zoom", "arguments": {"bbox_2d": [1, 2, 30, 40]}}}]}, {"role": "tool", "name": "zoom",
    ...     "content": [{"type": "image"}]}, {"role": "assistant", "content": "red"}]))
    <tool_call>{"name": "zoom", "arguments": {"bbox_2d": [1, 2, 30, 40]}}</tool_call>
    [zoom] <image>
    red
    """
    if isinstance(messages, str):
        return messages
    return "\n".join(_one_message_text(m) for m in messages or [])


def _one_message_text(message) -> str:
    if not isinstance(message, dict):
        return content_text(message, image="<image>", video="<video>")
    text = content_text(message.get("content"), image="<image>", video="<video>")
    calls = [call.get("function", call) for call in message.get("tool_calls") or [] if isinstance(call, dict)]
    shown = [json.dumps({"name": c.get("name"), "arguments": c.get("arguments")}, default=str) for c in calls]
    text = "\n".join([text] * bool(text) + [f"<tool_call>{call}</tool_call>" for call in shown])
    return f"[{message.get('name', 'tool')}] {text}" if message.get("role") == "tool" else text


def extract_tag(text: str, tag: str = "answer") -> str | None:
    """The stripped content of the last ``<tag>…</tag>`` pair (newlines allowed inside), or None.

    >>> extract_tag("<answer> 2 </answer> no, <answer>\\n3\\n</answer>")
    '3'
    >>> extract_tag("<answer>1<answer>2</answer>")
    '2'
    >>> extract_tag("3") is None
    True
    """
    open_, close = f"<{tag}>", f"</{tag}>"
    # Content may not contain another opening tag, so a stray "<answer>" before the last pair is not swallowed.
    pattern = rf"{re.escape(open_)}((?:(?!{re.escape(open_)}).)*?){re.escape(close)}"
    matches = re.findall(pattern, text, re.DOTALL)
    return matches[-1].strip() if matches else None


def gold_answer(solution) -> str:
    """The gold answer text of a ``solution`` value, in any of the forms suzak's datasets use.

    >>> gold_answer(3), gold_answer("<answer> 3 </answer>"), gold_answer(" 140° ")
    ('3', '3', '140°')
    >>> gold_answer("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\\n#### 1,234")
    '1234'
    >>> gold_answer("<answer>  </answer>")
    Traceback (most recent call last):
    ...
    ValueError: empty gold answer in solution '<answer>  </answer>'
    """
    if solution is None:
        raise ValueError("gold solution is None")
    if isinstance(solution, bool) or not isinstance(solution, str | int | float | Decimal):
        raise TypeError(f"a gold solution must be a string or a number, not {type(solution).__name__}")
    text = str(solution).strip()
    if (tagged := extract_tag(text)) is not None:
        text = tagged
    elif "####" in text:
        match = _GSM8K_GOLD_RE.search(text)
        if match is None:
            raise ValueError(f"gold solution has '####' but no number after it: {solution!r:.200}")
        text = match.group(1).replace(",", "")
    if not text:
        raise ValueError(f"empty gold answer in solution {solution!r:.200}")
    return text


def parse_int_answer(text: str) -> int | None:
    """An integer from an answer string, or None: digits (``3``, ``+3``, ``3.0``, ``3.``) or a word zero..twenty.

    >>> [parse_int_answer(s) for s in [" 3 ", "3.0", "3.", "+3", "Three", "3.5", "abc", "", "3 cubes"]]
    [3, 3, 3, 3, 3, None, None, None, None]
    """
    text = text.strip().lower()
    if text.endswith("."):
        text = text[:-1].rstrip()
    if text in _NUMBER_WORDS:
        return _NUMBER_WORDS[text]
    match = _INT_RE.fullmatch(text)
    return int(match.group(1)) if match else None


def parse_word(text: str) -> str | None:
    """A one-word answer, normalised: stripped, lower case, one trailing full stop dropped; None when empty or more
    than one word.

    >>> [parse_word(s) for s in [" Red ", "red.", "blue sky", "", "<answer>red</answer>"]]
    ['red', 'red', None, None, '<answer>red</answer>']
    """
    text = text.strip().lower()
    if text.endswith("."):
        text = text[:-1].rstrip()
    return text if text and len(text.split()) == 1 else None


def parse_count(completion_text: str, answer_format: str = "think_answer") -> int | None:
    """The count a completion answers, in the prompt template's answer format, or None.

    ``think_answer`` (R1-V's answer format): the count inside the last ``<answer>`` tag; None without the tag, as in
    R1-V's eval. ``plain``: the whole completion is the answer (the ``plain`` template asks for the bare value).
    This is suzak's strict rule; R1-V's eval reads the first tag instead (``r1v_count``).

    >>> parse_count("<think>...</think><answer> 4 </answer>"), parse_count("4"), parse_count("<answer>four</answer>")
    (4, None, 4)
    >>> parse_count("4", "plain"), parse_count(" Four.", "plain"), parse_count("4 cubes", "plain")
    (4, 4, None)
    """
    return count_parser(answer_format)(completion_text)


def _tagged_count(completion_text: str) -> int | None:
    answer = extract_tag(completion_text, "answer")
    return None if answer is None else parse_int_answer(answer)


_COUNT_PARSERS = {"think_answer": _tagged_count, "plain": parse_int_answer}


def count_parser(answer_format: str) -> Callable[[str], int | None]:
    """``parse_count`` for one answer format, checked once (rewards bind it before scoring a batch).

    >>> count_parser("plain")("3"), count_parser("think_answer")("3")
    (3, None)
    """
    try:
        return _COUNT_PARSERS[answer_format]
    except KeyError:
        raise ValueError(
            f"count answer_format must be one of {', '.join(_COUNT_PARSERS)}, got {answer_format!r}"
        ) from None


def parse_boxes(text: str) -> list[tuple[float, float, float, float]]:
    """Every box in ``text``, in the order written, in whatever frame the writer used: Qwen2-VL's
    ``<|box_start|>(x1,y1),(x2,y2)<|box_end|>`` (or ``(x1,y1),(x2,y2)`` alone: decoding with
    ``skip_special_tokens=True``, as TRL and the evaluation do, drops its special tokens), JSON ``bbox_2d`` values (one
    object or a list of them) or a plain ``[x1, y1, x2, y2]`` (also several, as ``[[...], [...]]``). A list of
    another length is no box.

    >>> parse_boxes('<|box_start|>(12,40),(300, 512)<|box_end|>'), parse_boxes("(12,40),(300,512)")
    ([(12.0, 40.0, 300.0, 512.0)], [(12.0, 40.0, 300.0, 512.0)])
    >>> parse_boxes('```json\\n[{"bbox_2d": [1, 2, 30, 40], "label": "cup"}, {"bbox_2d": [5, 6, 7.5, 8]}]\\n```')
    [(1.0, 2.0, 30.0, 40.0), (5.0, 6.0, 7.5, 8.0)]
    >>> parse_boxes("[1, 2, 3]"), parse_boxes("[1, 2, 3, 4, 5]"), parse_boxes("[[1, 2, 3, 4], [5, 6, 7, 8]]")
    ([], [], [(1.0, 2.0, 3.0, 4.0), (5.0, 6.0, 7.0, 8.0)])
    """
    boxes = []
    for match in _BOX_RE.finditer(text):
        values = [v for v in match.groups() if v is not None]
        boxes.append(tuple(float(v) for v in values))
    return boxes


def gold_boxes(text: str) -> list[tuple[float, float, float, float]] | None:
    """The gold boxes of a grounding row's solution (original-image pixels: ``[x1, y1, x2, y2]``, or a list of them
    for several objects); None when it holds none.

    >>> gold_boxes("[10, 20, 110, 220]"), gold_boxes("[[1, 2, 3, 4], [5, 6, 7, 8]]"), gold_boxes("7")
    ([(10.0, 20.0, 110.0, 220.0)], [(1.0, 2.0, 3.0, 4.0), (5.0, 6.0, 7.0, 8.0)], None)
    """
    return parse_boxes(text) or None


_BOX_TOKENS_ONLY_RE = re.compile(
    rf"(?:(?:<\|object_ref_start\|>[^<]*<\|object_ref_end\|>)?(?:<\|box_start\|>)?\s*\({_BOX_NUMBER},{_BOX_NUMBER}\)\s*,"
    rf"\s*\({_BOX_NUMBER},{_BOX_NUMBER}\)\s*(?:<\|box_end\|>)?\s*)+"
)
_CODE_FENCE_RE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


def is_box_answer(text: str) -> bool:
    """Whether ``text`` is a box answer and nothing else: JSON ``{"bbox_2d": [x1, y1, x2, y2], ...}`` or a list of such
    objects (in a ```json fence or not), a plain ``[x1, y1, x2, y2]`` or a list of them, or Qwen2-VL's box tokens
    (each optionally after its ``<|object_ref_start|>…<|object_ref_end|>``; the special tokens may be decoded away).

    >>> [is_box_answer(t) for t in ['{"bbox_2d": [1, 2, 3, 4], "label": "cup"}', "[1, 2, 3, 4]", "[[1, 2, 3, 4]]",
    ...  "<|box_start|>(1,2),(3,4)<|box_end|>", "(1,2),(3,4)", "[1, 2, 3, 4] and more", '{"bbox_2d": [1, 2, 3]}', "[]"]]
    [True, True, True, True, True, False, False, False]
    """
    text = text.strip()
    if _BOX_TOKENS_ONLY_RE.fullmatch(text):
        return True
    fenced = _CODE_FENCE_RE.match(text)
    try:
        value = json.loads(fenced.group(1) if fenced else text)
    except ValueError:
        return False
    items = value if isinstance(value, list) and value and isinstance(value[0], dict | list) else [value]
    return bool(items) and all(_is_box_value(item.get("bbox_2d") if isinstance(item, dict) else item) for item in items)


def _is_box_value(value) -> bool:
    return isinstance(value, list) and len(value) == 4 and all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in value)  # fmt: skip


def box_parser(answer_format: str) -> Callable[[str], list[tuple[float, float, float, float]]]:
    """The boxes of a completion in ``answer_format``: ``box`` reads the whole text, ``think_answer`` the last
    ``<answer>`` tag (VLM-R1's form; no tag: no box).

    >>> box_parser("think_answer")("<think> [0, 0, 1, 1] </think> <answer>[4, 5, 6, 7]</answer>")
    [(4.0, 5.0, 6.0, 7.0)]
    """
    if answer_format == "think_answer":
        return lambda text: parse_boxes(extract_tag(text) or "")
    if answer_format in ("box", "plain"):
        return parse_boxes
    raise ValueError(f"boxes are read in the box or think_answer answer formats, not {answer_format!r}")


# A point (a GUI click): "(x, y)" or "[x, y]" (JSON "point_2d" values among them). Boxes are taken out first, so the
# corners of Qwen2-VL's "(x1,y1),(x2,y2)" are never read as points.
_POINT_RE = re.compile(rf"\({_BOX_NUMBER},{_BOX_NUMBER}\)|\[{_BOX_NUMBER},{_BOX_NUMBER}\]")


def parse_point(text: str) -> tuple[float, float] | None:
    """The first point in ``text``, in whatever frame the writer used: JSON ``{"point_2d": [x, y]}`` (also in a list,
    or with a ``label``), ``(x, y)`` or ``[x, y]``; None when it holds none. A box is no point.

    >>> parse_point('[{"point_2d": [120, 45], "label": "OK button"}]'), parse_point("click (12.5, 40)")
    ((120.0, 45.0), (12.5, 40.0))
    >>> parse_point("(1,2),(3,4)"), parse_point("[1, 2, 3, 4]"), parse_point("[1, 2, 3]")
    (None, None, None)
    """
    match = _POINT_RE.search(_BOX_RE.sub(" ", text))
    if match is None:
        return None
    x, y = (float(v) for v in match.groups() if v is not None)
    return x, y


def point_parser(answer_format: str) -> Callable[[str], tuple[float, float] | None]:
    """The point of a completion in ``answer_format``, as :func:`box_parser` reads boxes: ``box`` or ``plain`` read
    the whole text, ``think_answer`` the last ``<answer>`` tag (no tag: no point).

    >>> point_parser("think_answer")('<think> (5, 5)? </think> <answer>{"point_2d": [7, 8]}</answer>')
    (7.0, 8.0)
    """
    if answer_format == "think_answer":
        return lambda text: parse_point(extract_tag(text) or "")
    if answer_format in ("box", "plain"):
        return parse_point
    raise ValueError(f"points are read in the box, plain or think_answer answer formats, not {answer_format!r}")


# --- OCR: DocVQA's answers and ANLS -----------------------------------------------------------------------------


def gold_texts(text: str) -> list[str] | None:
    """The accepted answers of an OCR row's gold: a JSON list of strings (DocVQA's ``answers``: any one is right), else
    the text itself as the one answer (so ``[3]``, a footnote mark, stays an answer); None when there is none.

    >>> gold_texts('["1 mg", "1mg"]'), gold_texts("Total: 42"), gold_texts("[3]"), gold_texts("[]")
    (['1 mg', '1mg'], ['Total: 42'], ['[3]'], None)
    """
    text = text.strip()
    if text.startswith("["):
        try:
            value = json.loads(text)
        except ValueError:
            value = None
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return value or None
    return [text] if text else None


def text_parser(answer_format: str) -> Callable[[str], str | None]:
    """The free-text answer of a completion in ``answer_format``: ``plain`` the whole completion, ``think_answer`` the
    last ``<answer>`` tag; None when it is empty or missing.

    >>> text_parser("plain")(" Total: 42 "), text_parser("think_answer")("<think>.</think> <answer> 42 </answer>")
    ('Total: 42', '42')
    """
    if answer_format == "plain":
        return lambda text: text.strip() or None
    if answer_format == "think_answer":
        return lambda text: extract_tag(text, "answer") or None
    raise ValueError(f"no text parser for answer format {answer_format!r}; known: plain, think_answer")


# VLM-R1's REC evaluation (om-ai-lab/VLM-R1 src/eval/test_rec_r1.py): the first <answer> block, then the last
# quadruple of whole numbers inside braces (its greedy ".*"), else [0, 0, 0, 0].
_VLM_R1_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_VLM_R1_BOX_RE = re.compile(r"\{.*\[(\d+),\s*(\d+),\s*(\d+),\s*(\d+)]\s*.*\}", re.DOTALL)


def vlm_r1_box(text: str) -> list[int]:
    """The box VLM-R1's REC evaluation reads from an output, exactly (``extract_bbox_answer``): only the first
    ``<answer>`` block, whole numbers only, braces around them required; [0, 0, 0, 0] when none.

    >>> vlm_r1_box('<answer>{"bbox_2d": [1, 2, 3, 4]}</answer>'), vlm_r1_box("<answer>[1, 2, 3, 4]</answer>")
    ([1, 2, 3, 4], [0, 0, 0, 0])
    """
    answer = _VLM_R1_ANSWER_RE.search(text)
    box = _VLM_R1_BOX_RE.search(answer.group(1)) if answer else None
    return [int(v) for v in box.groups()] if box else [0, 0, 0, 0]


def vlm_r1_iou(box1, box2) -> float:
    """VLM-R1's IoU function, exactly (its -1/+1 cancel, except that an overlap of at most one pixel counts as none).

    >>> vlm_r1_iou([0, 0, 10, 10], [5, 0, 15, 10]), vlm_r1_iou([0, 0, 10, 10], [9, 9, 20, 20])
    (0.3333333333333333, 0.0)
    """
    inter_x1, inter_y1 = max(box1[0], box2[0]), max(box1[1], box2[1])
    inter_x2, inter_y2 = min(box1[2] - 1, box2[2] - 1), min(box1[3] - 1, box2[3] - 1)
    if inter_x1 < inter_x2 and inter_y1 < inter_y2:
        inter = (inter_x2 - inter_x1 + 1) * (inter_y2 - inter_y1 + 1)
    else:
        inter = 0
    union = (box1[2] - box1[0]) * (box1[3] - box1[1]) + (box2[2] - box2[0]) * (box2[3] - box2[1]) - inter
    return float(inter) / union if union else 0.0


def parse_number(text: str) -> Decimal | None:
    """A number from an answer string: ``$`` and commas are dropped, so is one trailing ``.``; else None.

    A ``%`` or a unit makes it unparseable: a bare number is expected here (see ``parse_gsm8k_answer`` for free text).

    >>> parse_number("$1,234.50"), parse_number("-3"), parse_number("18."), parse_number(".5")
    (Decimal('1234.50'), Decimal('-3'), Decimal('18'), Decimal('0.5'))
    >>> parse_number("50%") is None, parse_number("18 apples") is None, parse_number("") is None
    (True, True, True)
    """
    text = text.replace(",", "").replace("$", "").strip()
    if text.endswith("."):
        text = text[:-1]
    return Decimal(text) if _NUMBER_RE.fullmatch(text) else None


def parse_gsm8k_answer(completion_text: str) -> Decimal | None:
    """The first number after the last ``####``; without ``####``, the first number in the last ``<answer>`` tag.

    >>> parse_gsm8k_answer("So she has 2 + 16 = 18 eggs.\\n#### $18.")
    Decimal('18')
    >>> parse_gsm8k_answer("<think>2 + 16</think><answer> 1,234 dollars </answer>")
    Decimal('1234')
    >>> parse_gsm8k_answer("The answer is 18.") is None
    True
    """
    if "####" in completion_text:
        region = completion_text[completion_text.rfind("####") + 4 :]
    else:
        region = extract_tag(completion_text, "answer")
        if region is None:
            return None
    match = _NUMBER_TOKEN_RE.search(region)
    return parse_number(match.group()) if match else None


def math_equal(completion_text: str, solution) -> bool:
    """suzak's strict math rule: an exact string match, or math-verify equivalence, of the last ``<answer>`` contents.

    Modelled on R1-V's training reward (the OR of the same two tests) but stricter, and so not R1-V's rule
    (``r1v_accuracy``, ``r1v_math_verify`` are): each side's answer is the stripped content of its *last*
    ``<answer>`` tag (the whole stripped text without one), and math-verify sees only that content, read as LaTeX,
    so a number in the reasoning cannot score and ``10√{2}`` is not read as 10. A completion math-verify cannot
    parse is simply wrong; a gold it cannot parse has only the string test.

    >>> math_equal("<think>...</think> <answer>140°</answer>", "<answer> 140° </answer>")
    True
    >>> math_equal("<answer>40°</answer>", "140°"), math_equal("<answer>0.5</answer>", "\\\\frac{1}{2}")
    (False, True)
    >>> math_equal("<answer>\\\\sqrt{12}</answer>", "2√{3}"), math_equal("<answer>2√{5}</answer>", "2√{3}")
    (True, False)
    """
    gold = gold_answer(solution)
    tagged = extract_tag(completion_text, "answer")
    if (completion_text.strip() if tagged is None else tagged) == gold:
        return True
    # Without tags math-verify finds the answer in the free text itself (as R1-V's GeoQA eval does for every output).
    predicted = completion_text if tagged is None else _as_latex(tagged)
    return _math_verify_equal(gold, predicted)


def _as_latex(answer: str) -> str:
    """A bare answer as a LaTeX formula: bare ``2\\sqrt{3}`` parses as just ``2`` in math-verify, ``$2\\sqrt{3}$`` whole."""
    answer = answer.replace("√", "\\sqrt")  # GeoQA writes 2√{3}; math-verify only knows \sqrt
    return answer if "$" in answer or "\\(" in answer or "\\[" in answer else f"${answer}$"


def _math_verify_equal(gold: str, predicted: str) -> bool:
    from math_verify import parse, verify  # imported here: math-verify pulls in sympy (~1 s)
    from math_verify.errors import TimeoutException

    try:
        gold_parsed = _parse_gold(gold)
        if not gold_parsed:
            logger.debug("math-verify cannot parse gold %r; exact string match only", gold)
            return False
        predicted_parsed = parse(predicted, parsing_timeout=_timeout(_PARSE_TIMEOUT_S))
        return bool(predicted_parsed) and verify(
            list(gold_parsed), predicted_parsed, timeout_seconds=_timeout(_VERIFY_TIMEOUT_S)
        )
    except (Exception, TimeoutException):  # math-verify catches its own errors; this is a second net, logged
        logger.warning("math-verify failed on gold %r; exact string match only", gold, exc_info=True)
        return False


@functools.lru_cache(maxsize=4096)
def _parse_gold(gold: str) -> tuple:
    """math-verify's parse of a gold answer, cached: each gold is scored against num_generations completions."""
    from math_verify import parse

    return tuple(parse(_as_latex(gold), parsing_timeout=_timeout(_PARSE_TIMEOUT_S)))


def _timeout(seconds: int) -> int | None:
    """math-verify's timeouts use signal.alarm, which raises outside the main thread: there, run without one."""
    return seconds if threading.current_thread() is threading.main_thread() else None


# --- R1-V's rules, exactly ------------------------------------------------------------------------------------------


def r1v_count(text: str) -> int | None:
    """The count R1-V's SuperCLEVR eval reads: the first ``<answer>`` holding only digits (spaces around allowed).

    ``\\d`` is any Unicode decimal digit, so ``٣`` and ``３`` read as 3; ``3.0``, ``+3`` and number words read as
    nothing. A tag that holds no bare number is skipped, so the first *numeric* tag wins.

    >>> r1v_count("<answer> 2 </answer> no: <answer>3</answer>"), r1v_count("<answer>٣</answer>")
    (2, 3)
    >>> r1v_count("<answer>3.0</answer>") is None, r1v_count("<answer>three</answer> <answer>4</answer>")
    (True, 4)
    """
    match = _R1V_COUNT_RE.search(text)
    return int(match.group(1)) if match else None


def r1v_math_verify(text: str, gold: str) -> tuple[str | None, bool]:
    """R1-V's GeoQA eval rule: math-verify parses the *whole* text and verifies it against the parsed raw gold.

    Returns ``(str of the first parsed value or None, is_correct)``, the ``extracted_answer`` R1-V's scripts wrote.
    math-verify picks its answer anywhere in the text (by its priorities, e.g. ``\\boxed`` first, else the rightmost
    match), so ``10√{2}`` reads as 10, ``4πcm`` as 4, a number in the reasoning can score when the tag holds a
    letter, and a number glued to the tag (``<answer>140°</answer>``) is not read at all. That is R1-V's rule,
    kept for comparable numbers.

    >>> r1v_math_verify("<think>180 - 40</think> <answer> 140° </answer>", "140°")
    ('140', True)
    >>> r1v_math_verify("<answer> 10√{2} </answer>", "10"), r1v_math_verify("<answer>140°</answer>", "140°")
    (('10', True), (None, False))
    """
    from math_verify import parse, verify

    gold_parsed = _parse_raw(gold)
    predicted = _safe_math_verify(lambda: parse(text, parsing_timeout=_timeout(_PARSE_TIMEOUT_S)), [], gold)
    if not predicted:
        return None, False
    correct = gold_parsed and _safe_math_verify(
        lambda: verify(predicted, list(gold_parsed), timeout_seconds=_timeout(_VERIFY_TIMEOUT_S)), False, gold
    )
    return str(predicted[0]), bool(correct)


def r1v_accuracy(text: str, solution: str) -> bool:
    """R1-V's training ``accuracy_reward``: ``r1v_math_verify`` of the whole text against the raw solution, else an
    exact match of the stripped first one-line ``<answer>…</answer>`` contents (the whole stripped text on a side
    without one).

    Known hole, kept because it is R1-V's rule: math-verify reads the whole completion, so a right number in
    ``<think>`` can score while the ``<answer>`` tag holds something else.

    >>> r1v_accuracy("<think>3 cubes</think> <answer>3</answer>", "<answer> 3 </answer>")
    True
    >>> r1v_accuracy("<think>maybe 3</think> <answer>many</answer>", "<answer> 3 </answer>")
    True
    >>> r1v_accuracy("<answer>C</answer>", "<answer> C </answer>"), r1v_accuracy("<answer>D</answer>", "C")
    (True, False)
    """
    return r1v_math_verify(text, solution)[1] or _r1v_tag_text(text) == _r1v_tag_text(solution)


def _r1v_tag_text(text: str) -> str:
    match = _R1V_TAG_RE.search(text)
    return (match.group(1) if match else text).strip()


def _safe_math_verify(call: Callable, failed, gold: str):
    """``call()``, or ``failed`` when math-verify raises (it catches its own errors; this second net logs)."""
    from math_verify.errors import TimeoutException

    try:
        return call()
    except (Exception, TimeoutException):
        logger.warning("math-verify failed on an output scored against gold %r; counted wrong", gold, exc_info=True)
        return failed


@functools.lru_cache(maxsize=4096)
def _parse_raw(gold: str) -> tuple:
    """math-verify's parse of a raw gold string, as R1-V's scripts ran it (no LaTeX wrapping), cached."""
    from math_verify import parse

    return tuple(parse(gold, parsing_timeout=_timeout(_PARSE_TIMEOUT_S)))
