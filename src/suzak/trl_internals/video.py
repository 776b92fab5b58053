"""Video rows through TRL's image-only paths (TRL has no video path).

- ``_tokenize_prompts``: the clips' metadata through ``chat_template_kwargs`` (:func:`_with_frames`: the frames in
  place of each clip);
- ``_compute_loss`` and ``_get_per_token_logps_and_entropies``: each chunk's video tensors added to the model call,
  image marks aligned, no empty image tensors (:func:`feeding_videos`); the rows' tensors ride in the scored batch
  under :data:`VIDEO_FIELDS`;
- :func:`vllm_requests_with_videos`: the requests TRL's colocated ``VLLMGeneration.generate`` hands
  ``vllm.LLM.generate`` (``{"prompt_token_ids", "multi_modal_data"}``, one per prompt), each given its row's video.

Contract tests (tests/test_trl_contract.py): ``test_tokenize_prompts_hands_chat_template_kwargs_to_the_processor``,
``test_per_token_logps_calls_the_model_with_keyword_inputs_per_chunk``,
``test_colocated_generation_sends_llm_generate_one_request_per_prompt``,
``test_a_list_in_the_scored_batch_is_shuffled_and_split_with_the_rows``; tests/test_video.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

import torch

from suzak import SuzakError
from suzak.media.video import Clip, processor_kwargs, video_of

# The key of the scored batch that carries each row's video tensors (a list, one entry per row: TRL shuffles and
# splits lists along the rows with everything else).
VIDEO_FIELDS = "suzak_video_fields"


def _parts(prompt: list) -> list[dict]:
    return [part for message in prompt if isinstance(message, dict) and isinstance(message.get("content"), list)
            for part in message["content"] if isinstance(part, dict)]  # fmt: skip


def _with_frames(prompt: Any) -> Any:
    """A prompt whose video parts hold their clip's frames array (what a processor takes) instead of the clip."""
    if not isinstance(prompt, list):
        return prompt
    return [{**m, "content": [{**p, "video": p["video"].frames} if isinstance(p, dict) and isinstance(p.get("video"), Clip)
                              else p for p in m["content"]]}
            if isinstance(m, dict) and isinstance(m.get("content"), list) else m for m in prompt]  # fmt: skip


@contextmanager
def vllm_requests_with_videos(llm: Any, videos: Sequence[tuple[Any, dict] | None]):
    """Within the block, each request TRL's colocated generation hands ``llm.generate`` (one per prompt, in order:
    ``{"prompt_token_ids": ...}`` and images in ``multi_modal_data``) gets its row's video: ``videos[i]`` is the
    (``multi_modal_data["video"]`` item, ``mm_processor_kwargs``) pair of :func:`suzak.media.video.vllm_video`, or None for
    a row without one."""
    generate, own = llm.generate, vars(llm).get("generate")

    def with_videos(prompts, *args, **kwargs):
        if len(prompts) != len(videos):
            raise SuzakError(f"vLLM was handed {len(prompts)} prompts for {len(videos)} rows with their videos "
                             "(vllm_tensor_parallel_size > 1 gathers other ranks' prompts: not with video rows)")  # fmt: skip
        requests = []
        for prompt, video in zip(prompts, videos, strict=True):
            if video is not None:
                data = {**(prompt.get("multi_modal_data") or {}), "video": video[0]}
                prompt = {**prompt, "multi_modal_data": data, "mm_processor_kwargs": video[1]}
            requests.append(prompt)
        return generate(requests, *args, **kwargs)

    llm.generate = with_videos  # this instance only, for this block
    try:
        yield
    finally:
        if own is None:
            del llm.generate
        else:
            llm.generate = own


@contextmanager
def feeding_videos(model: torch.nn.Module, rows: Sequence[dict | None], video_token_id: int):
    """Within the block, the calls of ``model`` on these rows (one call for all, or TRL's chunks of them in row order:
    each call takes the next ``input_ids.size(0)`` rows) get those rows' video tensors (rows without a video add none)
    and ``mm_token_type_ids`` marking their video placeholder tokens (2), which the Qwen models' M-RoPE needs; the image
    marks (1) the call already has stay where the images are.

    TRL builds each chunk's model call from image arguments only; this adds the video ones to the same call.
    """
    taken = 0

    def add_videos(module, args, kwargs):
        nonlocal taken
        ids = kwargs.get("input_ids")
        if ids is None:
            return args, kwargs
        if taken + ids.size(0) > len(rows):
            raise SuzakError(f"the model was called on more rows than the {len(rows)} given video tensors for")
        present = [row for row in rows[taken : taken + ids.size(0)] if row is not None]
        taken += ids.size(0)
        grids = kwargs.get("image_grid_thw")
        if grids is not None and grids.numel() == 0:  # a chunk of a mixed batch without images: TRL slices none
            kwargs = {k: v for k, v in kwargs.items() if k not in ("pixel_values", "image_grid_thw")}
        given = kwargs.get("mm_token_type_ids")
        if not present and (given is None or given.shape == ids.shape):
            return args, kwargs
        fields = {key: torch.cat([row[key] for row in present]) for key in present[0]} if present else {}
        types = torch.zeros_like(ids)
        if given is not None:  # a batch with images: TRL's image marks, from prompts whose videos were not expanded
            types[:, types.size(1) - given.size(1) :] = given.masked_fill(given == 2, 0)  # (left padded: they end
        types[ids == video_token_id] = 2  # where the expanded ones do); the video marks come from the ids
        return args, {**kwargs, **fields, "mm_token_type_ids": types}

    handle = model.register_forward_pre_hook(add_videos, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def clips_of(prompts: list) -> list[Clip]:
    """The video clips of a batch's prompts, in order."""
    return [part["video"] for prompt in prompts if isinstance(prompt, list) for part in _parts(prompt)
            if part.get("type") == "video" and isinstance(part.get("video"), Clip)]  # fmt: skip


def feeding_videos_of(processing_class: Any, model: torch.nn.Module, rows: Sequence[dict | None]):
    """:func:`feeding_videos` for a VL model's processor (``processing_class``); nothing for a text model, whose
    tokenizer has no video placeholder (a dataset with images or video for a text model stops before step 1:
    ``suzak.training.session``)."""
    video_token = getattr(processing_class, "video_token_id", None)  # a VL processor's; a tokenizer has none
    if video_token is None:
        if any(row is not None for row in rows):
            raise SuzakError(f"{type(processing_class).__name__} has no video placeholder: a text model "
                             "cannot take video rows")  # fmt: skip
        return nullcontext()
    return feeding_videos(model, rows, video_token)


@contextmanager
def holding_videos(trainer, rows: list[dict | None] | None):
    """Within the block, ``trainer._video_rows`` are these rows' video tensors (what TRL's model calls get)."""
    saved, trainer._video_rows = trainer._video_rows, rows
    try:
        yield
    finally:
        trainer._video_rows = saved


def video_fields(processor: Any, device: Any, inputs: list[dict[str, Any]]) -> list[dict | None] | None:
    """Each row's video tensors for the model (``pixel_values_videos``, ``video_grid_thw`` and, for Qwen2.5-VL,
    ``second_per_grid_ts``), from the processor on the row's clip; None for a batch without video. The copies of
    a prompt share one clip, and one set of tensors."""
    clips = [video_of(row) for row in inputs]
    if not any(isinstance(clip, Clip) for clip in clips):
        return None
    computed: dict[int, dict] = {}
    for clip in clips:
        if isinstance(clip, Clip) and id(clip) not in computed:
            out = processor(text=[processor.video_token], videos=[clip.frames], return_tensors="pt",
                            **processor_kwargs([clip]))  # fmt: skip
            fields = {k: torch.as_tensor(out[k]).to(device)
                      for k in ("pixel_values_videos", "video_grid_thw", "second_per_grid_ts") if k in out}  # fmt: skip
            computed[id(clip)] = fields
    return [computed[id(clip)] if isinstance(clip, Clip) else None for clip in clips]


def tokenized_with_frames(trainer, tokenize: Callable, clips: list, prompts: list):
    """TRL's ``tokenize`` (``_tokenize_prompts``) on prompts with video ``clips``: they reach the processor as their
    frames, with the clips' metadata (through ``apply_chat_template``'s ``processor_kwargs``, which TRL passes on from
    ``chat_template_kwargs``)."""
    saved = trainer.chat_template_kwargs
    given = dict(saved.get("processor_kwargs") or {})
    trainer.chat_template_kwargs = {**saved, "processor_kwargs": {**given, **processor_kwargs(clips)}}
    try:
        prompt_ids, images, fields = tokenize([_with_frames(prompt) for prompt in prompts])
    finally:
        trainer.chat_template_kwargs = saved
    return prompt_ids, images, fields
