"""Prompt templates and answer formats: the one place data builders, rewards, SFT targets and evaluation read them.

R1-V's training and evaluation prompts drifted apart and cost users accuracy (R1-V #155). Everything in suzak that
writes a question for the model or an ideal answer goes through this module, so they cannot drift.

>>> render_prompt("r1v", "How many items are there in the image?")
'How many items are there in the image?  Output the thinking process in <think> </think> and final answer (number) in <answer> </answer> tags.'
>>> render_prompt("click", "the blue round button")
'Click the blue round button in this screenshot. Output the point as JSON {"point_2d": [x, y]}.'
>>> render_answer("think_answer", "3", reasoning="I see 3 objects.")
'<think> I see 3 objects. </think> <answer> 3 </answer>'
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ANSWER_FORMATS",
    "DEFAULT_TEMPLATE",
    "TEMPLATES",
    "PromptTemplate",
    "after_opening",
    "build_conversation",
    "episode_prompt",
    "get_template",
    "question_text",
    "render_answer",
    "render_prompt",
    "template_opening",
]


@dataclass(frozen=True)
class PromptTemplate:
    """A question template (``{problem}`` is the question) and the answer format it asks the model for."""

    name: str
    text: str
    answer_format: str
    description: str = ""

    def render(self, problem: str) -> str:
        return self.text.format(problem=problem)


# R1-V's CLEVR/GeoQA training prompt (src/r1-v/src/open_r1/grpo.py). Note the two spaces before "Output".
_R1V_TRAIN = (
    "{problem}  Output the thinking process in <think> </think> and final answer (number) in <answer> </answer> tags."
)
# R1-V's SuperCLEVR evaluation prompt (src/eval/test_qwen2vl_counting_superclevr.py).
_R1V_EVAL = "{problem} First output the thinking process in <think> </think> and final answer (number) in <answer> </answer> tags."
# R1-V's GeoQA evaluation prompt: the training text with a single space.
_R1V_GEOQA = (
    "{problem} Output the thinking process in <think> </think> and final answer (number) in <answer> </answer> tags."
)
# Grounding. A Qwen maintainer's RefCOCO prompt for Qwen2.5-VL (QwenLM/Qwen3-VL#991), the answer a box in the
# model's own frame (suzak.media.boxes), JSON for every family but Qwen2-VL (its box tokens).
_REC = "Locate {problem} in this image and output the bbox coordinates in JSON format."
# VLM-R1's REC training and evaluation prompt (om-ai-lab/VLM-R1 qwen_module.py and src/eval/test_rec_r1.py), whose
# `problem` is "Please provide the bounding box coordinate of the region this sentence describes: <sentence>.".
_REC_R1 = (
    "Please provide the bounding box coordinate of the region this sentence describes: {problem}. First output the "
    "thinking process in <think> </think> tags and then output the final answer in <answer> </answer> tags. Output "
    "the final answer in JSON format."
)
# GUI clicks (suzak.data.gui): the answer a point in the model's own box frame (suzak.media.boxes), JSON "point_2d"
# (the key Qwen VL models point with); it is right when inside the named element's box.
_CLICK = 'Click {problem} in this screenshot. Output the point as JSON {{"point_2d": [x, y]}}.'
# R1-V's training instruction for any short answer (a word, an option, a number), not only a count.
_THINK = "{problem}  Output the thinking process in <think> </think> and final answer in <answer> </answer> tags."
# Episodes (suzak.models.episodes, MiniWoB++): the task's instruction, acted on with the environment's tools; each
# action's answer is the next screen, and the environment scores the episode (no answer to parse).
_EPISODE = "{problem}\nAct on the screen with the tools, one action at a time; each returns the next screen."
_GSM8K_HASH = (
    "{problem}\nSolve the problem step by step, then write the final answer as a number on its own last line "
    "in the form '#### <number>'."
)

TEMPLATES: dict[str, PromptTemplate] = {
    t.name: t
    for t in (
        PromptTemplate("r1v", _R1V_TRAIN, "think_answer", "R1-V training prompt (default for CLEVR counting)"),
        PromptTemplate("r1v_eval", _R1V_EVAL, "think_answer", "R1-V SuperCLEVR evaluation prompt"),
        PromptTemplate("r1v_geoqa", _R1V_GEOQA, "think_answer", "R1-V GeoQA evaluation prompt"),
        PromptTemplate("gsm8k", _GSM8K_HASH, "gsm8k_hash", "GSM8K: worked steps ending in '#### N'"),
        PromptTemplate("gsm8k_think", _R1V_TRAIN, "think_answer", "GSM8K with R1-V's <think>/<answer> tags"),
        PromptTemplate("plain", "{problem}", "plain", "the question alone; the answer is the bare value"),
        PromptTemplate("think", _THINK, "think_answer", "R1-style <think>/<answer> for any short answer (zoom recipe)"),
        PromptTemplate("rec", _REC, "box", "grounding: the referred object's box in the model's frame"),
        PromptTemplate("rec_r1", _REC_R1, "think_answer", "grounding as VLM-R1 trains it: the box as JSON in <answer>"),
        PromptTemplate("click", _CLICK, "box", "GUI click: a point inside the named element, in the model's frame"),
        PromptTemplate("episode", _EPISODE, "plain", "an episode: the instruction, acted on with the tools"),
    )
}


DEFAULT_TEMPLATE = "r1v"  # R1-V's training prompt: recipes, image data builders and SFT default to it


def get_template(name: str) -> PromptTemplate:
    try:
        return TEMPLATES[name]
    except KeyError:
        raise ValueError(f"unknown prompt template {name!r}; known: {', '.join(sorted(TEMPLATES))}") from None


def render_prompt(template: str, problem: str) -> str:
    """The user text for ``problem`` under the named template."""
    return get_template(template).render(problem)


def _think_answer(answer: str, reasoning: str) -> str:
    return f"<think> {reasoning} </think> <answer> {answer} </answer>"


def _gsm8k_hash(answer: str, reasoning: str) -> str:
    return f"{reasoning}\n#### {answer}" if reasoning else f"#### {answer}"


def _plain(answer: str, reasoning: str) -> str:
    return answer


# name -> f(answer, reasoning) -> completion text that the format's rewards score at their maximum. A box answer is
# rendered in the model's frame first (suzak.media.boxes.BoxFrame.render); ``box`` then is that text alone.
ANSWER_FORMATS = {"think_answer": _think_answer, "gsm8k_hash": _gsm8k_hash, "plain": _plain, "box": _plain}


def render_answer(answer_format: str, answer: str, reasoning: str = "Let me think step by step.") -> str:
    """The ideal completion for ``answer`` in ``answer_format`` (used by the reward pre-flight and SFT targets)."""
    try:
        fmt = ANSWER_FORMATS[answer_format]
    except KeyError:
        raise ValueError(
            f"unknown answer format {answer_format!r}; known: {', '.join(sorted(ANSWER_FORMATS))}"
        ) from None
    return fmt(str(answer).strip(), reasoning.strip())


def build_conversation(text: str, num_images: int = 1, *, video: bool = False) -> list[dict]:
    """A single user turn in TRL's conversational form, the video or image placeholders first (as Qwen VL models
    are trained).

    ``num_images=0`` without ``video`` gives a text-only turn (plain string content), which TRL and every chat
    template accept.

    >>> build_conversation("Which way?", 0, video=True)
    [{'role': 'user', 'content': [{'type': 'video'}, {'type': 'text', 'text': 'Which way?'}]}]
    """
    if num_images == 0 and not video:
        return [{"role": "user", "content": text}]
    parts = [{"type": "video"}] if video else []
    content = parts + [{"type": "image"} for _ in range(num_images)] + [{"type": "text", "text": text}]
    return [{"role": "user", "content": content}]


def episode_prompt(instruction: str, template: str = "episode") -> list[dict]:
    """An episode's prompt (:mod:`suzak.models.episodes`): its instruction under ``template``, after the first screen.

    >>> episode_prompt("Click on the OK button.")[0]["content"][1]["text"].splitlines()[0]
    'Click on the OK button.'
    """
    return build_conversation(render_prompt(template, instruction), 1)


def question_text(prompt: str | list[dict]) -> str:
    """The words of a prompt's user turns (a conversation's text parts joined; a plain prompt as it is), for a
    caption or a log line.

    >>> question_text(build_conversation("Locate the blue circle."))
    'Locate the blue circle.'
    """
    if isinstance(prompt, str):
        return prompt
    texts = []
    for turn in prompt:
        if turn.get("role") != "user":
            continue
        content = turn.get("content")
        parts = [content] if isinstance(content, str) else [p.get("text") for p in content or [] if isinstance(p, dict)]
        texts += [text for text in parts if text]
    return " ".join(texts)


def template_opening(processing_class: Any, chat_template_kwargs: dict | None = None) -> str:
    """What the chat template writes at the start of the assistant turn and leaves open at the end of every generation
    prompt: Qwen3.5's ``<think>\\n`` (its thinking mode), ``""`` for a template that opens no tag (Qwen2.5-VL, Qwen3-VL
    Instruct, Qwen3.5 with ``enable_thinking: false``, whose prompt ends with a closed ``<think>\\n\\n</think>\\n\\n``).

    ``chat_template_kwargs`` are TRL's (``GRPOConfig.chat_template_kwargs``), applied as training applies them. The
    completions a model generates after such a prompt start inside the opened tag; the rewards, the reward pre-flight
    and the evaluation read them after this text when a recipe sets ``opening_in_completion``.
    """
    messages = [{"role": "user", "content": [{"type": "text", "text": "?"}]}]
    prompt = processing_class.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                                  **(chat_template_kwargs or {}))  # fmt: skip
    found = re.search(r"<[A-Za-z_][\w-]*>\s*$", prompt)
    return prompt[found.start() :] if found else ""


def after_opening(answer: str, opening: str) -> str:
    """The part of ``answer`` (a whole answer in its format) a model writes when the template already wrote
    ``opening`` (:func:`template_opening`); ``answer`` itself when it does not start with the opening's tag.

    >>> after_opening("<think> I see 3. </think> <answer> 3 </answer>", "<think>\\n")
    ' I see 3. </think> <answer> 3 </answer>'
    >>> after_opening("<answer> 3 </answer>", "<think>\\n"), after_opening("3", "")
    ('<answer> 3 </answer>', '3')
    """
    tag = opening.strip()
    stripped = answer.lstrip()
    return stripped[len(tag) :] if tag and stripped.startswith(tag) else answer
