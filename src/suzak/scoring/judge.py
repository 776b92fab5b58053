"""``judge``: a reward scored by a vision-language model that sees the row's image (docs/judge.md).

Rule verifiers cover numbers, options and boxes; a free-form answer (a chart's trend, a caption, an open question)
needs a model to read it. Other frameworks hand their judge text only (the question, the gold answer, the
completion), so it cannot tell an answer true of the picture from one that only sounds like the gold, and cannot
judge at all without a gold answer. suzak sends the judge the picture, at the judge's own pixel budget.

Where the judge runs (:class:`JudgeSettings`, a recipe's ``reward_kwargs: {judge: {...}}``):

- ``base_url``: an OpenAI-compatible ``/v1/chat/completions`` endpoint (``vllm serve``, SGLang, TGI, a hosted API);
  ``model`` is the served model's name, the image goes as an ``image_url`` part holding a base64 PNG data URL, the
  key (if any) is read from the environment variable ``api_key_env`` (``.env``), never from the recipe. The calls
  of one batch run concurrently (``concurrency`` at once; TRL awaits async rewards), each with ``timeout_s`` and
  ``retries`` with backoff (the ``openai`` client's own).
- no ``base_url``: ``model`` is a local model folder (a small judge, tests), loaded once in this process.

The score: P(yes) from the first reply token's log-probabilities where the server returns them (``logprobs``) and
the reply opens with its verdict, else the verdict in the reply's text (yes/no → 1/0, read at the reply's first word
or, for a judge that says what it sees first, its last yes or no; with ``verdict: grade`` an integer 0..``grade_max``
scaled to 0..1). The judge sees the row's image, or the picture in ``image_column``. A call that fails after its
retries, or whose reply has no verdict, scores None and is counted (``judge/failed``, and
``rewards/judge/nonfinite_frac`` as every None is); when more than ``max_failed_fraction`` of a batch's calls fail
the reward raises, and the run stops in one line after a checkpoint of the last completed step
(:class:`suzak.trl_internals.RewardFault`). Identical (image, question, answer, reference) items of one batch are
judged once (a group repeats its answers: ``judge/cached``).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import inspect
import io
import ipaddress
import logging
import math
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from PIL import Image

from suzak import SuzakError
from suzak.media.vision import PixelBudget, images_of
from suzak.scoring.parsing import completion_text, gold_answer, text_parser
from suzak.scoring.prompts import question_text

__all__ = [
    "PROMPTS",
    "SETTINGS",
    "JudgeItem",
    "JudgeSettings",
    "judge",
    "judge_settings",
    "parse_verdict",
    "score_reply",
    "yes_probability",
]

logger = logging.getLogger(__name__)

# The judge's question, by ``verdict`` and whether a gold answer is shown (``reference``). ``{question}`` is the
# row's question, ``{answer}`` the completion's answer read with the run's ``answer_format``, ``{reference}`` the
# row's gold answer; ``{grade_max}`` the top of the grade scale.
PROMPTS: dict[tuple[str, bool], str] = {
    ("yes_no", True): (
        "Look at the image. A question about it, its reference answer and a candidate answer follow.\n"
        "Question: {question}\nReference answer: {reference}\nCandidate answer: {answer}\n"
        "Is the candidate answer correct for this image? Answer yes or no."
    ),
    ("yes_no", False): (
        "Look at the image. A question about it and a candidate answer follow.\n"
        "Question: {question}\nCandidate answer: {answer}\n"
        "Is the candidate answer correct for this image? Answer yes or no."
    ),
    ("grade", True): (
        "Look at the image. A question about it, its reference answer and a candidate answer follow.\n"
        "Question: {question}\nReference answer: {reference}\nCandidate answer: {answer}\n"
        "Grade the candidate answer from 0 (wrong) to {grade_max} (fully correct for this image). Reply with the "
        "number only."
    ),
    ("grade", False): (
        "Look at the image. A question about it and a candidate answer follow.\n"
        "Question: {question}\nCandidate answer: {answer}\n"
        "Grade the candidate answer from 0 (wrong) to {grade_max} (fully correct for this image). Reply with the "
        "number only."
    ),
}

VERDICTS = ("yes_no", "grade")


@dataclass(frozen=True)
class JudgeSettings:
    """Where the judge runs and how it is asked (a recipe's ``reward_kwargs: {judge: {...}}``; docs/judge.md)."""

    model: str = field(metadata={"help": "the served model's name (with base_url), or a local model folder"})
    base_url: str | None = field(
        default=None, metadata={"help": "an OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1 (vllm serve)"}
    )
    api_key_env: str | None = field(
        default=None, metadata={"help": "the environment variable (.env) holding the endpoint's key; none: no key"}
    )
    reference: bool | None = field(
        default=None, metadata={"help": "show the judge the row's gold answer (default: where the rows have one)"}
    )
    verdict: str = field(default="yes_no", metadata={"help": "yes_no (P(yes) or the reply's yes/no) or grade"})
    grade_max: int = field(default=10, metadata={"help": "the top of the grade scale (verdict: grade)"})
    prompt: str | None = field(
        default=None,
        metadata={"help": "the judge's question with {question}, {answer}, {reference} (default: PROMPTS)"},
    )
    answer_format: str = field(
        default="plain", metadata={"help": "how the completion's answer is read: plain (all of it) or think_answer"}
    )
    image_column: str | None = field(
        default=None,
        metadata={"help": "the column with the picture the judge sees (default: the row's image, the policy's)"},
    )
    min_pixels: int = field(
        default=3136, metadata={"help": "the judge's own pixel budget: fewest pixels an image gets"}
    )
    max_pixels: int = field(
        default=401408, metadata={"help": "the judge's own pixel budget: most pixels an image gets"}
    )
    factor: int = field(
        default=28,
        metadata={"help": "a served judge's pixels per visual token along a side (28: Qwen2.5-VL, 32: Qwen3-VL)"},
    )
    logprobs: bool = field(default=True, metadata={"help": "score yes/no as P(yes) from the first token's log-probs"})
    max_tokens: int = field(default=8, metadata={"help": "the judge's reply length"})
    concurrency: int = field(default=8, metadata={"help": "a served judge's calls at once"})
    timeout_s: float = field(default=60.0, metadata={"help": "seconds per call before it counts as failed (retried)"})
    retries: int = field(default=2, metadata={"help": "retries of a failed call, with backoff"})
    max_failed_fraction: float = field(
        default=0.5, metadata={"help": "stop the run when more of a batch's calls fail than this"}
    )

    def __post_init__(self):
        if self.verdict not in VERDICTS:
            raise SuzakError(f"judge: verdict {self.verdict!r}; one of: {', '.join(VERDICTS)}")
        if self.grade_max < 1:
            raise SuzakError(f"judge: grade_max {self.grade_max} must be at least 1")
        if not 0 <= self.max_failed_fraction <= 1:
            raise SuzakError(f"judge: max_failed_fraction {self.max_failed_fraction} must be between 0 and 1")
        if self.concurrency < 1 or self.retries < 0 or self.timeout_s <= 0:
            raise SuzakError("judge: concurrency must be at least 1, retries at least 0, timeout_s above 0")
        text_parser(self.answer_format)  # an unknown answer format is one line here, not at the first batch
        if self.prompt is not None:
            unknown = set(re.findall(r"{(\w*)}", self.prompt)) - {"question", "answer", "reference", "grade_max"}
            if unknown:
                raise SuzakError(f"judge: prompt has {{{sorted(unknown)[0]}}}; it may use {{question}}, {{answer}}, "
                                 "{reference}, {grade_max}")  # fmt: skip

    @property
    def where(self) -> str:
        """The judge as messages name it: its URL, or its folder."""
        return self.base_url or self.model

    def template(self, reference: bool) -> str:
        return self.prompt or PROMPTS[(self.verdict, reference)]


def judge_settings(settings: dict | JudgeSettings) -> JudgeSettings:
    """``settings`` (a recipe's mapping) as :class:`JudgeSettings`, a wrong key in one line naming it.

    >>> judge_settings({"model": "judge", "base_url": "http://127.0.0.1:8000/v1"}).where
    'http://127.0.0.1:8000/v1'
    >>> judge_settings({"model": "judge", "verdcit": "grade"})
    Traceback (most recent call last):
    ...
    suzak.SuzakError: judge: unknown setting 'verdcit'; known: model, base_url, api_key_env, reference, verdict, grade_max, prompt, answer_format, image_column, min_pixels, max_pixels, factor, logprobs, max_tokens, concurrency, timeout_s, retries, max_failed_fraction
    """
    if isinstance(settings, JudgeSettings):
        return settings
    known = [f.name for f in dataclasses.fields(JudgeSettings)]
    for key in settings:
        if key not in known:
            raise SuzakError(f"judge: unknown setting {key!r}; known: {', '.join(known)}")
    if not settings.get("model"):
        raise SuzakError("judge: set model (the served model's name with base_url, or a local model folder)")
    return JudgeSettings(**settings)


# --- what the judge is asked --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JudgeItem:
    """One question to the judge: the text and the image it is about (None for a text row)."""

    text: str
    image: Image.Image | None

    def key(self) -> tuple:
        """Identical items of one batch are judged once (a group repeats its answers)."""
        picture = None if self.image is None else hashlib.sha1(self.image.tobytes()).hexdigest()
        return self.text, picture, None if self.image is None else self.image.size


def parse_verdict(text: str, verdict: str = "yes_no", grade_max: int = 10) -> float | None:
    """The score in a judge's reply text: yes/no → 1/0, or a grade 0..``grade_max`` scaled to 0..1; None when the
    reply holds no verdict.

    A yes/no reply is read at its first word when that is the verdict, else at its last "yes" or "no" (a judge that
    says what it sees first: "The square is blue, so no.").

    >>> parse_verdict("Yes."), parse_verdict(" no, the bar is red"), parse_verdict("maybe")
    (1.0, 0.0, None)
    >>> parse_verdict("blue yes"), parse_verdict("The square is blue, so no."), parse_verdict("Not sure, yes or no?")
    (1.0, 0.0, 0.0)
    >>> parse_verdict("7", "grade"), parse_verdict("Grade: 10/10", "grade"), parse_verdict("12", "grade")
    (0.7, 1.0, None)
    """
    if verdict == "grade":
        found = re.search(r"\d+", text)
        if found is None or int(found.group()) > grade_max:
            return None
        return int(found.group()) / grade_max
    words = re.findall(r"\w+", text.lower())
    verdicts = [word for word in words if word in ("yes", "no")]
    if not verdicts:
        return None
    return 1.0 if (words[0] if _opens_with_verdict(text) else verdicts[-1]) == "yes" else 0.0


def _opens_with_verdict(text: str) -> bool:
    """Whether a reply's first word is "yes" or "no"."""
    first = re.match(r"\W*(\w+)", text.lower())
    return first is not None and first.group(1) in ("yes", "no")


def yes_probability(top_logprobs: dict[str, float] | None) -> float | None:
    """P(yes) / (P(yes) + P(no)) from the first reply token's top log-probabilities (tokens compared stripped and in
    lower case, variants summed); None when neither word is among them.

    >>> round(yes_probability({"Yes": math.log(0.6), " yes": math.log(0.1), "No": math.log(0.3)}), 3)
    0.7
    >>> yes_probability({"Maybe": 0.0}) is None
    True
    """
    if not top_logprobs:
        return None
    mass = {"yes": 0.0, "no": 0.0}
    for token, logprob in top_logprobs.items():
        word = token.strip().lower()
        if word in mass and logprob is not None and math.isfinite(logprob):
            mass[word] += math.exp(logprob)
    total = mass["yes"] + mass["no"]
    return mass["yes"] / total if total > 0 else None


def data_url(image: Image.Image) -> str:
    """``image`` as a base64 PNG data URL (an OpenAI ``image_url`` part)."""
    buffer = io.BytesIO()
    image.convert("RGB").save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _is_loopback(url: str) -> bool:
    host = urlparse(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# --- where the judge runs -----------------------------------------------------------------------------------------


class ServedJudge:
    """An OpenAI-compatible endpoint (``vllm serve``, SGLang, TGI, a hosted API)."""

    _warned: set[str] = set()

    def __init__(self, settings: JudgeSettings):
        self.settings = settings
        self.budget = PixelBudget(settings.min_pixels, settings.max_pixels, factor=settings.factor)
        self.key = None
        if settings.api_key_env:
            self.key = os.environ.get(settings.api_key_env)
            if not self.key:
                raise SuzakError(f"judge: {settings.api_key_env} (api_key_env) is not set in the environment or .env")
        url = settings.base_url or ""
        if urlparse(url).scheme not in ("http", "https"):
            raise SuzakError(f"judge: base_url {url!r} is not an http(s) URL")
        if urlparse(url).scheme == "http" and not _is_loopback(url) and url not in self._warned:
            self._warned.add(url)
            logger.warning("judge: %s is plain http off this machine: the images and answers travel unencrypted", url)

    async def ask(self, items: Sequence[JudgeItem]) -> list[tuple[str, float | None] | Exception]:
        """Each item's (reply text, P(yes) from its first token or None), or the exception its call ended in."""
        from openai import APIError, AsyncOpenAI  # every OpenAI-compatible server's client: retries, backoff, timeouts

        settings = self.settings
        gate = asyncio.Semaphore(settings.concurrency)
        # a client per batch: TRL awaits async rewards in its own event loop, the pre-flight in another
        async with AsyncOpenAI(base_url=settings.base_url, api_key=self.key or "EMPTY", timeout=settings.timeout_s,
                               max_retries=settings.retries) as client:  # fmt: skip

            async def one(item: JudgeItem):
                content: list[dict] = [{"type": "text", "text": item.text}]
                if item.image is not None:
                    picture = self.budget.fit(item.image)
                    content.insert(0, {"type": "image_url", "image_url": {"url": data_url(picture)}})
                extra = (
                    {"logprobs": True, "top_logprobs": 5} if settings.logprobs and settings.verdict == "yes_no" else {}
                )
                async with gate:
                    try:
                        reply = await client.chat.completions.create(
                            model=settings.model,
                            messages=[{"role": "user", "content": content}],
                            max_tokens=settings.max_tokens,
                            temperature=0.0,
                            **extra,
                        )
                    except APIError as error:  # refused, timed out or unreachable after its retries: counted
                        return error
                if not reply.choices:
                    return ValueError(f"a reply with no choices: {str(reply)[:200]}")
                choice = reply.choices[0]
                first = getattr(getattr(choice, "logprobs", None), "content", None) or []
                top = {t.token: t.logprob for t in first[0].top_logprobs} if first and first[0].top_logprobs else None
                return choice.message.content or "", yes_probability(top) if extra else None

            return list(await asyncio.gather(*(one(item) for item in items)))


class LocalJudge:
    """A model folder loaded in this process (a small judge; the tests' tiny one): greedy replies, P(yes) from the
    first token's logits."""

    def __init__(self, settings: JudgeSettings):
        from transformers import AutoModelForImageTextToText, AutoProcessor

        self.settings = settings
        try:
            self.processor = AutoProcessor.from_pretrained(settings.model)
            self.model = AutoModelForImageTextToText.from_pretrained(settings.model).eval()
        except (OSError, ValueError) as error:
            raise SuzakError(f"judge: cannot load the local judge {settings.model!r} (no base_url given): "
                             f"{' '.join(str(error).split())[:300]}") from error  # fmt: skip
        self.budget = PixelBudget(settings.min_pixels, settings.max_pixels).for_model(self.processor)
        self.lock = threading.Lock()  # one model, one batch at a time (async rewards may overlap)

    async def ask(self, items: Sequence[JudgeItem]) -> list[tuple[str, float | None] | Exception]:
        return await asyncio.to_thread(self._ask, list(items))

    def _ask(self, items: list[JudgeItem]) -> list[tuple[str, float | None] | Exception]:
        import torch

        tokenizer = getattr(self.processor, "tokenizer", self.processor)
        texts, images = [], []
        for item in items:
            content = ([{"type": "image"}] if item.image is not None else []) + [{"type": "text", "text": item.text}]
            texts.append(self.processor.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                                            add_generation_prompt=True))  # fmt: skip
            if item.image is not None:
                images.append(self.budget.fit(item.image.convert("RGB")))
        with self.lock, torch.inference_mode():
            side, tokenizer.padding_side = tokenizer.padding_side, "left"
            try:
                inputs = self.processor(text=texts, images=images or None, padding=True, return_tensors="pt")
            finally:
                tokenizer.padding_side = side
            out = self.model.generate(**inputs.to(self.model.device), max_new_tokens=self.settings.max_tokens,
                                      do_sample=False, output_scores=True, return_dict_in_generate=True)  # fmt: skip
        new = out.sequences[:, inputs["input_ids"].shape[1] :]
        first = torch.log_softmax(out.scores[0].float(), dim=-1)
        replies: list = []
        for row, ids in enumerate(new):
            top = first[row].topk(5)
            logprobs = {tokenizer.decode([int(i)]): float(v) for v, i in zip(top.values, top.indices, strict=True)}
            replies.append((tokenizer.decode(ids, skip_special_tokens=True), yes_probability(logprobs)))
        return replies


_JUDGES: dict[JudgeSettings, Any] = {}


def _judge_for(settings: JudgeSettings):
    """One judge per settings in a process (a local model loads once)."""
    if settings not in _JUDGES:
        _JUDGES[settings] = ServedJudge(settings) if settings.base_url else LocalJudge(settings)
    return _JUDGES[settings]


# --- the reward ---------------------------------------------------------------------------------------------------


def judge_items(settings: JudgeSettings, prompts: list, completions: list, solution: list | None, columns: dict
           ) -> list[JudgeItem | None]:  # fmt: skip
    """Each completion's question to the judge; None where the completion has no answer to judge (in the run's
    answer format), which scores 0.0 without a call, as a rule reward scores a missing answer."""
    reference = settings.reference if settings.reference is not None else solution is not None
    if reference and solution is None:
        raise SuzakError("judge: reference: true but the rows have no solution column (reference: false judges "
                         "without a gold answer)")  # fmt: skip
    read = text_parser(settings.answer_format)
    template = settings.template(reference)
    items: list[JudgeItem | None] = []
    for i, completion in enumerate(completions):
        answer = read(completion_text(completion))
        if answer is None:
            items.append(None)
            continue
        row = {"prompt": prompts[i], **{name: values[i] for name, values in columns.items()}}
        pictures = images_of(row) if settings.image_column is None else _column_images(settings, columns, i)
        text = template.format(question=question_text(prompts[i]), answer=answer, grade_max=settings.grade_max,
                               reference=gold_answer(solution[i]) if reference else "")  # fmt: skip
        items.append(JudgeItem(text, pictures[0] if pictures else None))
    return items


def _column_images(settings: JudgeSettings, columns: dict, i: int) -> list[Image.Image]:
    """The pictures in row ``i``'s ``image_column`` (one image or a list of them)."""
    if settings.image_column not in columns:
        raise SuzakError(f"judge: image_column {settings.image_column!r} is not a column of the rows; their columns: "
                         f"{', '.join(sorted(columns))}")  # fmt: skip
    value = columns[settings.image_column][i]
    return images_of({"images": value} if isinstance(value, list) else {"image": value})


def score_reply(settings: JudgeSettings, reply: tuple[str, float | None]) -> float | None:
    """A reply's score: P(yes) where the verdict is yes/no, ``logprobs`` is on and the reply opens with its verdict
    (the first token's P(yes) is the verdict's; the local judge computes it for every reply), else the verdict in the
    reply's text (a judge that names what it sees before its verdict: :func:`parse_verdict`).

    >>> score_reply(JudgeSettings("j"), ("no", 0.9)), score_reply(JudgeSettings("j", verdict="grade"), ("7", 0.9))
    (0.9, 0.7)
    >>> judge = JudgeSettings("j")
    >>> score_reply(JudgeSettings("j", logprobs=False), ("no", 0.9)), score_reply(judge, ("blue, so no", 0.9))
    (0.0, 0.0)
    """
    text, p_yes = reply
    if p_yes is not None and settings.verdict == "yes_no" and settings.logprobs and _opens_with_verdict(text):
        return p_yes
    return parse_verdict(text, settings.verdict, settings.grade_max)


SETTINGS = tuple(f.name for f in dataclasses.fields(JudgeSettings))


async def judge(prompts: list, completions: list, solution: list | None = None, log_metric: Callable | None = None,
                **kwargs) -> list[float | None]:  # fmt: skip
    """A vision-language judge's score of each completion's answer, looking at the row's image (module docstring).

    Its settings are :class:`JudgeSettings`' fields, bound by a recipe's ``reward_kwargs: {judge: {model: ...,
    base_url: ...}}`` (its signature lists them, so a misspelt one is one line before the model loads); every other
    keyword is a dataset column, as TRL passes them (``image``, ``images``: the picture the judge sees)."""
    settings = judge_settings({key: kwargs.pop(key) for key in SETTINGS if key in kwargs})
    start = time.monotonic()
    columns = {name: values for name, values in kwargs.items() if isinstance(values, list)}
    items = judge_items(settings, prompts, completions, solution, columns)
    unique: dict[tuple, JudgeItem] = {}
    for item in items:
        if item is not None:
            unique.setdefault(item.key(), item)
    replies = await _judge_for(settings).ask(list(unique.values())) if unique else []
    scored: dict[tuple, float | None] = {}
    bad: list[str] = []
    for key, reply in zip(unique, replies, strict=True):
        if isinstance(reply, Exception):
            bad.append(f"{type(reply).__name__}: {' '.join(str(reply).split())[:200]}")
            scored[key] = None
            continue
        scored[key] = score_reply(settings, reply)
        if scored[key] is None:
            bad.append(f"no verdict in {reply[0]!r:.200}")
    if log_metric is not None:
        log_metric("judge/seconds", time.monotonic() - start)
        log_metric("judge/calls", float(len(unique)))
        log_metric("judge/cached", float(sum(item is not None for item in items) - len(unique)))
        log_metric("judge/failed", float(len(bad)))
    if bad:
        logger.warning("judge at %s: %d of %d calls gave no score (first: %s)", settings.where, len(bad), len(unique),
                       "; ".join(bad[:3]))  # fmt: skip
    if unique and len(bad) > settings.max_failed_fraction * len(unique):
        raise SuzakError(f"the judge at {settings.where} failed {len(bad)} of {len(unique)} calls, more than "
                         f"max_failed_fraction {settings.max_failed_fraction:g} (first: {bad[0]})")  # fmt: skip
    return [0.0 if item is None else scored[item.key()] for item in items]


def _signature() -> inspect.Signature:
    """``judge``'s parameters: the reward call's, then each setting as a keyword with its default (``model``: None,
    checked when called), so ``resolve_reward`` checks a recipe's kwargs against them."""
    keyword = inspect.Parameter.KEYWORD_ONLY
    settings = [
        inspect.Parameter(f.name, keyword, default=None if f.default is dataclasses.MISSING else f.default)
        for f in dataclasses.fields(JudgeSettings)
    ]
    call = list(inspect.signature(judge).parameters.values())
    return inspect.Signature([*call[:-1], *settings, call[-1]])


judge.__signature__ = _signature()
