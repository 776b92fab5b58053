"""``judge``: a reward scored by a vision-language model that sees the row's image (docs/judge.md).

Rule verifiers cover numbers, options and boxes; a free-form answer (a chart's trend, a caption, an open question)
needs a model to read it. Other frameworks hand their judge text only (the question, the gold answer, the
completion), so it cannot tell an answer true of the picture from one that only sounds like the gold, and cannot
judge at all without a gold answer. suzak sends the judge the picture, at the judge's own pixel budget, resized from
the row's original (in training, where the policy's batch holds its images fitted to the policy's budget, from
:data:`ORIGINAL_IMAGES_COLUMN`), so a judge may look closer than the policy does.

Where the judge runs (:class:`JudgeSettings`, a recipe's ``reward_kwargs: {judge: {...}}``):

- ``base_url``: an OpenAI-compatible ``/v1/chat/completions`` endpoint (``vllm serve``, SGLang, TGI, a hosted API);
  ``model`` is the served model's name, the image goes as an ``image_url`` part holding a base64 PNG data URL, the
  key (if any) is read from the environment variable ``api_key_env`` (``.env``), never from the recipe. The calls
  of one batch run concurrently (``concurrency`` at once; TRL awaits async rewards), each with ``timeout_s`` and
  ``retries`` with backoff (the ``openai`` client's own).
- no ``base_url``: ``model`` is a local model folder (a small judge, tests), loaded once in this process.

The score: the verdict in the reply's text (yes/no → 1/0, read at the reply's first word or, for a judge that says
what it sees first, its last yes or no; with ``verdict: grade`` an integer 0..``grade_max`` scaled to 0..1); with
``logprobs``, P(yes) read at the verdict's own token (the reply token that is the verdict word, markup and quotes
aside: ``**No**`` is read at ``No``, not at ``**``) where the server returns that token's log-probabilities and
they agree with the word. The judge sees the row's image, or the picture in ``image_column``. A call that fails
after its retries, or whose reply has no verdict, scores None and is counted (``judge/failed``, and
``rewards/judge/nonfinite_frac`` as every None is); when more than ``max_failed_fraction`` of a batch's calls fail
the reward raises, and the run stops in one line after a checkpoint of the last completed step
(:class:`suzak.trl_internals.rewards.RewardFault`). Identical (image, question, answer, reference) items of one batch are
judged once (a group repeats its answers: ``judge/cached``). Its figures (``judge/calls``, ``cached``, ``failed``:
summed over the ranks; ``judge/seconds``: the slowest rank's wall time) are :class:`suzak.trl_internals.rewards.RankTotal`
values; in a mixture they are named per source (``judge/<source>/calls``, :func:`suzak.scoring.rewards.routed`).

Every setting is checked before the policy's weights load (:class:`JudgeSettings` for the values, :func:`check_judge`
for the key in the environment and a local judge's folder or Hub id), whatever ``preflight_rows`` says.
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
from suzak.media.vision import DEFAULT_MAX_PIXELS, DEFAULT_MIN_PIXELS, PixelBudget, images_of
from suzak.runs.redaction import is_secret_name
from suzak.scoring.parsing import completion_text, gold_answer, text_parser
from suzak.scoring.prompts import question_text

__all__ = [
    "ORIGINAL_IMAGES_COLUMN",
    "PROMPTS",
    "SETTINGS",
    "JudgeItem",
    "JudgeSettings",
    "check_judge",
    "judge",
    "judge_settings",
    "parse_verdict",
    "score_reply",
    "verdict_probability",
    "with_original_images",
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

# A training batch's rows hold their pictures fitted to the POLICY's budget; the trainer keeps each row's pictures as
# they were before that here (:func:`with_original_images`), for the judge to fit to its own.
ORIGINAL_IMAGES_COLUMN = "original_images"

# A reply as the judge's ``ask`` returns it: its text, and each of its tokens with that token's top log-probabilities
# (token text -> log-probability; empty without ``logprobs``).
Reply = tuple[str, list[tuple[str, dict[str, float]]]]


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
        default=None, metadata={"help": "show the judge the row's gold answer (default: where the row has one)"}
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
        default=DEFAULT_MIN_PIXELS, metadata={"help": "the judge's own pixel budget: fewest pixels an image gets"}
    )
    max_pixels: int = field(
        default=DEFAULT_MAX_PIXELS, metadata={"help": "the judge's own pixel budget: most pixels an image gets"}
    )
    factor: int = field(
        default=28,
        metadata={"help": "a served judge's pixels per visual token along a side (28: Qwen2.5-VL, 32: Qwen3-VL)"},
    )
    logprobs: bool = field(default=True, metadata={"help": "score yes/no as P(yes) from the verdict token's log-probs"})
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
        self._check_budget()
        self._check_endpoint()

    def _check_budget(self) -> None:
        """The judge's own pixel budget (a served judge's on its ``factor``; a local one's grid is checked on its
        config by :func:`check_judge`): a max below its min would otherwise stop the run at step 1 in words that do
        not say whose budget it is."""
        if self.min_pixels <= 0:
            raise SuzakError(f"judge: min_pixels {self.min_pixels} must be above 0")
        if self.max_pixels < self.min_pixels:
            raise SuzakError(f"judge: max_pixels {self.max_pixels} is below the judge's min_pixels {self.min_pixels} "
                             f"(the judge's own pixel budget, not the run's; its min_pixels is {DEFAULT_MIN_PIXELS} "
                             "unless set)")  # fmt: skip
        if self.base_url and self.max_pixels < self.factor**2:
            raise SuzakError(f"judge: max_pixels {self.max_pixels} is below one of the judge's visual tokens "
                             f"(factor {self.factor}: {self.factor**2} pixels)")  # fmt: skip

    def _check_endpoint(self) -> None:
        """``base_url`` an http(s) URL; ``api_key_env`` a name suzak masks (``*_KEY``, ``*_TOKEN``, ...), so the
        key's value is masked in every log line, record and CSV stream (:mod:`suzak.runs.redaction`), like
        ``HF_TOKEN``'s."""
        if self.base_url is not None and urlparse(self.base_url).scheme not in ("http", "https"):
            raise SuzakError(f"judge: base_url {self.base_url!r} is not an http(s) URL")
        if self.api_key_env and not is_secret_name(self.api_key_env):
            raise SuzakError(f"judge: api_key_env {self.api_key_env!r} is not a name suzak masks in its logs and "
                             "records: name the variable *_KEY, *_TOKEN, *_SECRET or *_PASSWORD (e.g. "
                             "JUDGE_API_KEY)")  # fmt: skip

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
    found = _verdict_word(text)
    return None if found is None else 1.0 if found.group().lower() == "yes" else 0.0


def _verdict_word(text: str) -> re.Match | None:
    """Where a reply's verdict is read: its first word when that is "yes" or "no", else its last "yes" or "no"."""
    words = list(re.finditer(r"\w+", text))
    verdicts = [word for word in words if word.group().lower() in ("yes", "no")]
    if not verdicts:
        return None
    return words[0] if words[0].group().lower() in ("yes", "no") else verdicts[-1]


def _bare(token: str) -> str:
    """A token's text without markup, quotes, punctuation or whitespace, in lower case: ``**No`` and `` "yes`` are
    the words no and yes."""
    return re.sub(r"[\W_]+", "", token).lower()


def yes_probability(top_logprobs: dict[str, float] | None) -> float | None:
    """P(yes) / (P(yes) + P(no)) from one reply token's top log-probabilities (tokens compared bare, :func:`_bare`,
    variants summed); None when neither word is among them.

    >>> round(yes_probability({"Yes": math.log(0.6), " yes": math.log(0.1), "No": math.log(0.3)}), 3)
    0.7
    >>> yes_probability({"Maybe": 0.0}) is None
    True
    """
    if not top_logprobs:
        return None
    mass = {"yes": 0.0, "no": 0.0}
    for token, logprob in top_logprobs.items():
        word = _bare(token)
        if word in mass and logprob is not None and math.isfinite(logprob):
            mass[word] += math.exp(logprob)
    total = mass["yes"] + mass["no"]
    return mass["yes"] / total if total > 0 else None


def verdict_probability(tokens: list[tuple[str, dict[str, float]]]) -> float | None:
    """P(yes) at the verdict's own token: the reply token that is the verdict word (:func:`_verdict_word` of the
    tokens' text, bare of markup and quotes), from that token's top log-probabilities; None where no token is the
    whole verdict word or its log-probabilities name neither yes nor no. Markup before the verdict (``**No**``, a
    quote, a newline) is its own token, whose runners-up say nothing of the verdict.

    >>> bold_no = [("**", {"**": -0.1, "Yes": -2.5, "No": -5.0}), ("No", {"No": -0.1, "Yes": -2.4}), ("**", {})]
    >>> round(verdict_probability(bold_no), 3), verdict_probability([("**", {"Yes": -2.5}), ("Nope", {})]) is None
    (0.091, True)
    """
    found = _verdict_word("".join(token for token, _ in tokens))
    if found is None:
        return None
    start = 0
    for token, top in tokens:
        if start <= found.start() < start + len(token):
            return yes_probability(top) if _bare(token) == found.group().lower() else None
        start += len(token)
    return None


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


def check_judge(settings: dict | JudgeSettings) -> JudgeSettings:
    """A judge's settings, every one that can be checked without asking it, before the policy's weights load: the
    values (:class:`JudgeSettings`), a served judge's key in the environment, a local judge's folder or Hub id and
    its pixel budget on its model's patch grid (its config read, no weights). One line naming the setting."""
    settings = judge_settings(settings)
    if settings.base_url:
        _endpoint_key(settings)
    else:
        _local_budget(settings, _local_config(settings))
    return settings


def _endpoint_key(settings: JudgeSettings) -> str | None:
    """A served judge's key, from the environment variable ``api_key_env`` names (None: no key)."""
    if not settings.api_key_env:
        return None
    key = os.environ.get(settings.api_key_env)
    if not key:
        raise SuzakError(f"judge: {settings.api_key_env} (api_key_env) is not set in the environment or .env")
    return key


def _local_config(settings: JudgeSettings):
    """A local judge's transformers config (no weights): a folder that does not exist, or a Hub id that cannot be
    fetched (offline: not in the cache), is one line naming the judge's ``model`` rather than a Hub repo-id error."""
    from suzak.models.loading import model_source_config

    try:
        return model_source_config(settings.model, setting="the judge's model, a local folder without base_url")
    except SuzakError as error:
        raise SuzakError(f"judge: {error}") from None


def _local_budget(settings: JudgeSettings, source: Any) -> PixelBudget:
    """A local judge's pixel budget on its model's patch grid (``source``: its config or processor)."""
    try:
        return PixelBudget(settings.min_pixels, settings.max_pixels).for_model(source)
    except SuzakError as error:
        raise SuzakError(f"judge: {error} (the judge's max_pixels)") from None


class ServedJudge:
    """An OpenAI-compatible endpoint (``vllm serve``, SGLang, TGI, a hosted API)."""

    _warned: set[str] = set()

    def __init__(self, settings: JudgeSettings):
        self.settings = settings
        self.budget = PixelBudget(settings.min_pixels, settings.max_pixels, factor=settings.factor)
        self.key = _endpoint_key(settings)
        url = settings.base_url
        if urlparse(url).scheme == "http" and not _is_loopback(url) and url not in self._warned:
            self._warned.add(url)
            logger.warning("judge: %s is plain http off this machine: the images and answers travel unencrypted", url)

    async def ask(self, items: Sequence[JudgeItem]) -> list[Reply | Exception]:
        """Each item's reply (its text, and with ``logprobs`` each token's top log-probabilities), or the exception
        its call ended in."""
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
                # every reply token's top 5: the verdict need not be the first token (``**No**``)
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
                tokens = getattr(getattr(choice, "logprobs", None), "content", None) or []
                return choice.message.content or "", [
                    (t.token, {**{top.token: top.logprob for top in t.top_logprobs or []}, t.token: t.logprob})
                    for t in tokens
                ]

            return list(await asyncio.gather(*(one(item) for item in items)))


class LocalJudge:
    """A model folder loaded in this process (a small judge; the tests' tiny one): greedy replies, each token's top
    log-probabilities from its logits."""

    def __init__(self, settings: JudgeSettings):
        from transformers import AutoModelForImageTextToText, AutoProcessor

        from suzak.data.hub import offline_unless_reachable

        self.settings = settings
        _local_config(settings)  # a folder that does not exist is one line, not a Hub repo-id error
        try:
            with offline_unless_reachable():
                self.processor = AutoProcessor.from_pretrained(settings.model)
                self.model = AutoModelForImageTextToText.from_pretrained(settings.model).eval()
        except (OSError, ValueError) as error:
            raise SuzakError(f"judge: cannot load the local judge {settings.model!r} (no base_url given): "
                             f"{' '.join(str(error).split())[:300]}") from error  # fmt: skip
        self.budget = _local_budget(settings, self.processor)
        self.lock = threading.Lock()  # one model, one batch at a time (async rewards may overlap)

    async def ask(self, items: Sequence[JudgeItem]) -> list[Reply | Exception]:
        return await asyncio.to_thread(self._ask, list(items))

    def _ask(self, items: list[JudgeItem]) -> list[Reply | Exception]:
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
        new = out.sequences[:, inputs["input_ids"].shape[1] :]  # (B, T)
        tops = [torch.log_softmax(scores.float(), dim=-1).topk(5) for scores in out.scores]  # T x (B, 5)
        special = set(tokenizer.all_special_ids)
        replies: list = []
        for row, ids in enumerate(new.tolist()):
            tokens = []
            for step, token_id in enumerate(ids):
                if token_id in special:  # the reply ended (its end token, then padding)
                    break
                top = tops[step]
                alternatives = zip(top.values[row].tolist(), top.indices[row].tolist(), strict=True)
                tokens.append((tokenizer.decode([token_id]), {tokenizer.decode([i]): v for v, i in alternatives}))
            replies.append((tokenizer.decode(ids, skip_special_tokens=True), tokens))
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
    if settings.reference and solution is None:
        raise SuzakError("judge: reference: true but the rows have no solution column (reference: false judges "
                         "without a gold answer)")  # fmt: skip
    read = text_parser(settings.answer_format)
    items: list[JudgeItem | None] = []
    for i, completion in enumerate(completions):
        gold = None if solution is None else solution[i]
        if settings.reference and gold is None:
            raise SuzakError("judge: reference: true but a row has no gold answer (a JSONL line without solution, "
                             "or a mixture's source without one; reference: false judges without it)")  # fmt: skip
        reference = settings.reference if settings.reference is not None else gold is not None  # default: per row
        template = settings.template(reference)
        answer = read(completion_text(completion))
        if answer is None:
            items.append(None)
            continue
        row = {"prompt": prompts[i], **{name: values[i] for name, values in columns.items()}}
        pictures = _row_pictures(row) if settings.image_column is None else _column_images(settings, columns, i)
        text = template.format(question=question_text(prompts[i]), answer=answer, grade_max=settings.grade_max,
                               reference=gold_answer(gold) if reference else "")  # fmt: skip
        items.append(JudgeItem(text, pictures[0] if pictures else None))
    return items


def with_original_images(row: dict[str, Any]) -> dict[str, Any]:
    """The row with :data:`ORIGINAL_IMAGES_COLUMN`: its pictures (:func:`suzak.media.vision.images_of`) before the
    policy's budget fits them, which the trainer adds to a judged batch's rows before it fits their images.

    >>> row = with_original_images({"image": Image.new("RGB", (640, 480))})
    >>> [image.size for image in row[ORIGINAL_IMAGES_COLUMN]], with_original_images({"prompt": "text"})[ORIGINAL_IMAGES_COLUMN]
    ([(640, 480)], [])
    """
    return {**row, ORIGINAL_IMAGES_COLUMN: images_of(row)}


def _row_pictures(row: dict[str, Any]) -> list[Image.Image]:
    """The row's pictures as they were before the policy's budget fitted them (:func:`with_original_images`; the
    pre-flight's and the held-out eval's rows hold them as they are), for the judge to fit to its own budget."""
    original = row.get(ORIGINAL_IMAGES_COLUMN)
    return images_of(row) if original is None else list(original)


def _column_images(settings: JudgeSettings, columns: dict, i: int) -> list[Image.Image]:
    """The pictures in row ``i``'s ``image_column`` (one image or a list of them)."""
    if settings.image_column not in columns:
        raise SuzakError(f"judge: image_column {settings.image_column!r} is not a column of the rows; their columns: "
                         f"{', '.join(sorted(columns))}")  # fmt: skip
    value = columns[settings.image_column][i]
    return images_of({"images": value} if isinstance(value, list) else {"image": value})


def score_reply(settings: JudgeSettings, reply: Reply) -> float | None:
    """A reply's score: the verdict in its text (:func:`parse_verdict`); with ``verdict: yes_no`` and ``logprobs``,
    P(yes) at the verdict's own token (:func:`verdict_probability`) instead, where the reply's tokens carry it and it
    says what the word says (above one half for a yes, below for a no: never a 0.92 for a reply that says no).

    >>> judge, bold_no = JudgeSettings("j"), [("**", {"**": -0.1, "Yes": -2.5, "No": -5.0}), ("No", {"No": -0.1,
    ...     "Yes": -2.4}), ("**", {"**": 0.0})]
    >>> round(score_reply(judge, ("**No**", bold_no)), 3), score_reply(judge, ("**No**", bold_no[:1]))
    (0.091, 0.0)
    >>> score_reply(JudgeSettings("j", logprobs=False), ("**No**", bold_no)), score_reply(judge, ("blue, so no", []))
    (0.0, 0.0)
    >>> score_reply(judge, ("No", [("No", {"No": -2.0, "yes": -0.2})])), score_reply(JudgeSettings("j", verdict="grade"), ("7", []))
    (0.0, 0.7)
    """
    text, tokens = reply
    verdict = parse_verdict(text, settings.verdict, settings.grade_max)
    if verdict is None or settings.verdict != "yes_no" or not settings.logprobs:
        return verdict
    p_yes = verdict_probability(tokens)
    agrees = p_yes is not None and (p_yes > 0.5 if verdict == 1.0 else p_yes < 0.5)
    return p_yes if agrees else verdict


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
        _log_cost(log_metric, time.monotonic() - start, len(unique), sum(item is not None for item in items), len(bad))
    if bad:
        logger.warning("judge at %s: %d of %d calls gave no score (first: %s)", settings.where, len(bad), len(unique),
                       "; ".join(bad[:3]))  # fmt: skip
    if unique and len(bad) > settings.max_failed_fraction * len(unique):
        raise SuzakError(f"the judge at {settings.where} failed {len(bad)} of {len(unique)} calls, more than "
                         f"max_failed_fraction {settings.max_failed_fraction:g} (first: {bad[0]})")  # fmt: skip
    return [0.0 if item is None else scored[item.key()] for item in items]


def _log_cost(log_metric: Callable, seconds: float, calls: int, asked: int, failed: int) -> None:
    """The batch's ``judge/calls``, ``cached`` and ``failed``, summed over the ranks, and ``judge/seconds``, the slowest
    rank's wall time (:class:`suzak.trl_internals.rewards.RankTotal`: TRL would average each over the ranks)."""
    from suzak.trl_internals.rewards import RankTotal

    log_metric("judge/seconds", RankTotal(seconds, "max"))
    log_metric("judge/calls", RankTotal(calls))
    log_metric("judge/cached", RankTotal(asked - calls))
    log_metric("judge/failed", RankTotal(failed))


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
