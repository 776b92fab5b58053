"""TRL's vLLM engine, made a faithful sampler of the policy: the encoder cache after a sync, and vLLM's CPU build.

- :func:`forget_vision_features_on_sync`: TRL's ``VLLMGeneration.sync_weights`` followed by vLLM's
  ``reset_encoder_cache`` (vLLM reuses an image's vision features across requests, from older weights);
- :func:`colocated_vllm_on_cpu` / :func:`keep_vllm_cpu_weights_live`: vLLM's own internals, on its CPU platform
  only: the unquantized linear and embedding layers keep computing from the weights TRL's weight sync writes into
  (vLLM packs a copy at load, ``vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm``), and TRL's
  ``vllm.LLM`` (``trl.generation.vllm_generation.LLM``) gets the policy's dtype and :func:`vllm_cpu_settings`.

Contract tests: tests/test_trl_contract.py (``test_weight_sync_resets_the_prefix_cache_but_not_vllms_encoder_cache``,
``test_colocated_vllm_is_built_from_the_module_name_with_no_dtype``); vLLM's layers in tests/test_vllm_tier.py.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

import torch

from suzak import SuzakError
from suzak.media.video import vllm_video
from suzak.media.vision import collapse_runs, collapse_video_blocks
from suzak.trl_internals.prompts import _none_for_empty
from suzak.trl_internals.video import vllm_requests_with_videos

logger = logging.getLogger(__name__)


def forget_vision_features_on_sync(generation, main_process: bool) -> None:
    """After each of TRL's weight syncs, make vLLM drop the vision encoder outputs it keeps across requests.

    vLLM caches an image's encoder output by the image's hash and reuses it for any later request with the same image;
    TRL's ``sync_weights`` resets the prefix cache but not this one, so once an image comes back (the second epoch,
    or any repeated image) vLLM's prompt carries vision features of the weights of the step the image was first
    seen, silently. Found here by the stale-sampler guard: the self-test's gap jumped from 1e-7 to 0.19 nats per
    token at step 131, five steps after its 2,000 images started their second epoch. vLLM documents
    ``reset_encoder_cache`` for exactly this ("when model weights are updated"); the server takes it over HTTP in the
    dev mode ``trl vllm-serve`` runs vLLM in.
    """
    sync = generation.sync_weights

    def sync_and_forget() -> None:
        sync()
        if generation.mode == "colocate":
            generation.llm.llm_engine.reset_encoder_cache()
        elif main_process:
            client = generation.vllm_client
            response = client.session.post(f"{client.base_url}/reset_encoder_cache")
            if response.status_code != 200:
                raise SuzakError(f"the vLLM server at {client.base_url} refused /reset_encoder_cache "
                                 f"({response.status_code}): it would reuse vision features of older weights")  # fmt: skip

    generation.sync_weights = sync_and_forget


@contextmanager
def colocated_vllm_on_cpu(model: torch.nn.Module):
    """While TRL builds its colocated ``vllm.LLM``: on vLLM's CPU platform, make it a sampler of the policy.

    - every linear layer and the LM head keep computing from the weights TRL's sync writes into
      (:func:`keep_vllm_cpu_weights_live`);
    - vLLM runs the policy's dtype: left to ``dtype="auto"`` it downcasts an fp32 checkpoint (the CPU policy's) to
      bf16 and samples from a rounded copy of the policy (TRL passes no dtype; on a GPU the policy is bf16 anyway);
    - and eager, as suzak's evaluation engine does there (:func:`vllm_cpu_settings`: the compile
      took over half the engine's start and gained nothing a step);
    - a model with Gated DeltaNet layers (Qwen3.5) is one line: vLLM 0.24's CPU kernel for them fails on a dtype
      mismatch, and on AMX CPUs it prepacks their convolution weights where the sync cannot write.

    Elsewhere (a GPU platform) nothing changes.
    """
    try:
        from vllm.platforms import current_platform
    except ImportError:  # TRL says vLLM is missing itself
        current_platform = None
    if current_platform is None or not current_platform.is_cpu():
        yield
        return
    config = getattr(model, "config", None)
    text_config = getattr(config, "text_config", config)
    if "linear_attention" in (getattr(text_config, "layer_types", None) or []):
        raise SuzakError(f"use_vllm on the CPU: vLLM {_vllm_version()}'s CPU build cannot run {config.model_type}'s "
                         "Gated DeltaNet (linear attention) layers (its CPU kernel stops on a dtype mismatch, and on "
                         "AMX CPUs it prepacks their weights out of the weight sync's reach): train without vLLM on "
                         "a CPU (use_vllm false), or with vLLM on a GPU")  # fmt: skip
    keep_vllm_cpu_weights_live()
    import trl.generation.vllm_generation as generation

    build = generation.LLM
    dtype = next(model.parameters()).dtype

    def build_in_policy_dtype(*args, **kwargs):
        for key, value in {"dtype": dtype, **vllm_cpu_settings()}.items():
            kwargs.setdefault(key, value)
        return build(*args, **kwargs)

    generation.LLM = build_in_policy_dtype
    logger.info("vLLM on the CPU samples in the policy's dtype (%s), eager (no torch.compile at start-up)", dtype)
    try:
        yield
    finally:
        generation.LLM = build


def vllm_cpu_settings() -> dict[str, Any]:
    """``vllm.LLM`` settings suzak gives vLLM's CPU build (the engine of CPU machines: tests, demos); none elsewhere.

    ``enforce_eager``: at start-up vLLM compiles the model with ``torch.compile``, which on the CPU took ~12 s of a
    ~21 s engine start (tiny Qwen2.5-VL, 2 cores, 2026-11-27; the colour self-test's training run 120 s compiled,
    104 s eager over 40 steps) and bought nothing after: the model's share of those 40 steps was 4.4 s compiled,
    4.8 s eager, with the same held-out answers. On a GPU vLLM's compiled graphs stay (CUDA graphs pay there).
    """
    try:
        from vllm.platforms import current_platform
    except ImportError:  # no vLLM (a fake module in tests): nothing to set
        return {}
    return {"enforce_eager": True} if current_platform.is_cpu() else {}


def _vllm_version() -> str:
    import vllm

    return vllm.__version__


def keep_vllm_cpu_weights_live() -> bool:
    """On vLLM's CPU platform, keep every unquantized linear layer and the LM head computing from its live weight.

    At load, vLLM's CPU platform repacks each 2-D weight for oneDNN/SGL kernels
    (``UnquantizedLinearMethod``/``UnquantizedEmbeddingMethod.process_weights_after_loading`` call
    ``dispatch_cpu_unquantized_gemm``): linear layers lose the weight (TRL's sync then fails, ``'Parameter' object
    has no attribute 'weight_loader'``), and the LM head keeps it but computes from the packed copy, so the sync
    writes weights the sampler never reads. Here that dispatch leaves 2-D weights in place with
    ``torch.nn.functional.linear`` over them (slower kernels, right samples); other layers (missing ones, causal
    convolutions) go through vLLM's own dispatch. Returns whether vLLM runs on its CPU platform (patched once).
    """
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    from vllm.model_executor.layers import utils as layer_utils

    vllms = layer_utils.dispatch_cpu_unquantized_gemm
    if getattr(vllms, "keeps_weights_live", False):
        return True

    def dispatch_live(layer: torch.nn.Module, remove_weight: bool) -> None:
        if layer.weight.ndim != 2 or layer.weight.is_meta:
            return vllms(layer, remove_weight)
        layer.cpu_linear = _linear

    dispatch_live.keeps_weights_live = True
    dispatch_live.vllm_dispatch = vllms  # vLLM's own (tests restore it for one kind of layer)
    layer_utils.dispatch_cpu_unquantized_gemm = dispatch_live
    logger.info("vLLM on the CPU: linear layers and the LM head compute from their live weights (torch linear), so "
                "TRL's weight sync reaches the sampler; vLLM's packed CPU kernels would keep a copy made at load")  # fmt: skip
    return True


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``layer.cpu_linear`` as vLLM calls it, over the layer's own (live) weight."""
    return torch.nn.functional.linear(x, weight, bias)


def generate_single_turn(trainer, generate: Callable, prompt_ids, images, *args, **kwargs):
    """TRL's ``generate`` (``_generate_single_turn``) with colocated vLLM's prompts as vLLM expands them itself: one
    placeholder per image, and each video row's clip in its request; other generation as it is."""
    images = _none_for_empty(images)
    colocated = trainer.use_vllm and trainer.vllm_mode == "colocate"
    if colocated and images is not None:
        # TRL hands colocated vLLM the processor-expanded prompt ids and vLLM expands every <|image_pad|> again
        # (TRL #6294): one placeholder per image instead. The server path places precomputed image features on
        # the runs of image tokens, so it keeps them expanded.
        token = trainer.processing_class.image_token_id
        prompt_ids = [collapse_runs(list(ids), token) for ids in prompt_ids]
    clips = trainer._batch_clips
    if not colocated or clips is None:  # (server mode with video rows stops before step 1)
        return generate(prompt_ids, images, *args, **kwargs)
    # TRL's colocated call sends vLLM images only: each video row's request gets its clip, and its prompt ids
    # with the video back to the placeholder vLLM expands itself (to the same ids: tests/test_vllm_boundary.py).
    token = trainer.processing_class.tokenizer.convert_tokens_to_ids
    start, end, pad = token("<|vision_start|>"), token("<|vision_end|>"), token("<|video_pad|>")
    prompt_ids = [list(ids) if clip is None else collapse_video_blocks(list(ids), start, end, pad)
                  for ids, clip in zip(prompt_ids, clips, strict=True)]  # fmt: skip
    videos = [None if clip is None else vllm_video(clip, trainer.processing_class) for clip in clips]
    with vllm_requests_with_videos(trainer.vllm_generation.llm, videos):
        return generate(prompt_ids, images, *args, **kwargs)
