"""GPU memory arithmetic for a GRPO run, and the DeepSpeed setup ``deepspeed: auto`` picks from it.

A full fine-tuning GRPO step holds, per GPU (bytes, P the model's parameters, N the GPUs):

- the bf16 policy (2P) and, when ``beta > 0``, the bf16 reference model (2P);
- DeepSpeed ZeRO-2's gradient buckets (``reduce_bucket_size`` 5e8 elements in bf16, twice: ~1.9 GiB);
- with the optimizer on the GPU (``ds_configs/zero2.json``): the fp32 master weights, Adam's two moments and the fp32
  gradient partition, 16P/N; with ``zero2_offload.json`` those live in host RAM (16P per node) and each step copies
  the gradients out and the weights back, which is what makes it slower;
- colocated vLLM: ``vllm_gpu_memory_utilization`` of the GPU (its weights, KV cache and graphs);
- activations: with gradient checkpointing one bf16 hidden state per layer per token, plus the completion tokens'
  logits (bf16, and the fp32 working copies of the log-softmax: 2.74 bytes per vocabulary entry, fitted), plus 1.2
  GiB. Without checkpointing every layer keeps ~(6h + 4i) bf16 values per token (an estimate, not measured).

The constants were fitted on, and the predictions checked against, every measured row of
``bench/results_grpo_speed.jsonl`` and ``bench/results_grpo_memory.jsonl`` (``tests/test_memory_plan.py``: each
within 6%). ``deepspeed: auto`` (the launch scripts' default on GPUs) takes the fastest setup whose predicted peak
fits with room to spare (:data:`RESERVE_FRACTION` of the GPU plus :data:`RESERVE_GIB`, what CUDA, NCCL and the
caching allocator held beyond torch's peak in those rows): the optimizer on the GPU (11.7 s/step against 14.6 with
offload, same H200, 3B, 64 × 256 tokens: docs/benchmarks.md), else optimizer offload.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from suzak import SuzakError

logger = logging.getLogger(__name__)

GIB = 2**30
BUCKETS_GIB = 2 * 5e8 * 2 / GIB  # ZeRO-2's reduce and all-gather buckets (ds_configs: 5e8 elements), bf16
LOGIT_BYTES = 2.74  # per completion token and vocabulary entry: bf16 logits + the log-softmax's fp32 chunks (fitted)
FIXED_ACTIVATION_GIB = 1.2  # fitted: what a step holds beyond the terms above (fitted on the measured rows)
RESERVE_FRACTION, RESERVE_GIB = 0.05, 2.0  # beyond torch's peak: CUDA context, NCCL, allocator caches (5-10 GiB seen)
OFFLOAD_HOST_GIB = 8.0  # host RAM beyond the offloaded optimizer: the process, pinned staging buffers
DEEPSPEED_CONFIGS = {"zero2": "ds_configs/zero2.json", "zero2_offload": "ds_configs/zero2_offload.json"}
FASTEST_FIRST = ("zero2", "zero2_offload")


@dataclass(frozen=True)
class ModelShape:
    """What the arithmetic needs of a model: its parameters and its language model's sizes."""

    params: int
    hidden_size: int
    num_layers: int
    intermediate_size: int
    vocab_size: int

    @classmethod
    def of(cls, config) -> ModelShape:
        """From a transformers config (no weights: the model is built on the meta device to count parameters)."""
        import torch
        from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

        text = getattr(config, "text_config", None) or config
        auto = AutoModelForImageTextToText if hasattr(config, "vision_config") else AutoModelForCausalLM
        with torch.device("meta"):
            model = auto.from_config(config)
        return cls(sum(p.numel() for p in model.parameters()), text.hidden_size, text.num_hidden_layers,
                   text.intermediate_size, text.vocab_size)  # fmt: skip


@dataclass(frozen=True)
class Workload:
    """One GRPO step on one GPU: the batch (completions per forward: ``per_device_train_batch_size``), its lengths
    (prompt with its visual tokens; completion), and the recipe settings that move memory."""

    completions: int
    prompt_tokens: int
    completion_tokens: int
    beta: float = 0.0
    vllm_share: float = 0.0  # vllm_gpu_memory_utilization when vLLM is colocated, else 0
    gradient_checkpointing: bool = True
    trains_all_weights: bool = True  # False for LoRA/QLoRA: the optimizer holds the adapters only
    gpus: int = 1


def activation_gib(shape: ModelShape, work: Workload) -> float:
    tokens = work.completions * (work.prompt_tokens + work.completion_tokens)
    per_token = (
        2 * shape.hidden_size
        if work.gradient_checkpointing
        else 2 * (6 * shape.hidden_size + 4 * shape.intermediate_size)
    )
    logits = work.completions * work.completion_tokens * shape.vocab_size * LOGIT_BYTES
    return FIXED_ACTIVATION_GIB + (tokens * per_token * shape.num_layers + logits) / GIB


def peak_gib(shape: ModelShape, work: Workload, deepspeed: str, gpu_gib: float) -> float:
    """Predicted peak of torch's allocations on each GPU (what ``torch.cuda.max_memory_allocated`` reports; colocated
    vLLM allocates through torch in the same process), under ``deepspeed`` (``zero2`` or ``zero2_offload``)."""
    weights = 2 * shape.params * (2 if work.beta else 1)
    optimizer = 16 * shape.params / work.gpus if deepspeed == "zero2" and work.trains_all_weights else 0
    fixed = (weights + optimizer) / GIB + BUCKETS_GIB + work.vllm_share * gpu_gib
    return fixed + activation_gib(shape, work)


def host_gib(shape: ModelShape, work: Workload, gpus_per_node: int) -> float:
    """Host RAM a node needs for ``zero2_offload``: every rank's optimizer partition, plus the processes."""
    return 16 * shape.params / GIB * (gpus_per_node / work.gpus) + OFFLOAD_HOST_GIB * gpus_per_node


def usable_gib(gpu_gib: float) -> float:
    return gpu_gib * (1 - RESERVE_FRACTION) - RESERVE_GIB


@dataclass(frozen=True)
class Plan:
    deepspeed: str  # a key of DEEPSPEED_CONFIGS
    peak_gib: float
    gpu_gib: float
    fits: bool
    why: str

    @property
    def config_path(self) -> str:
        return DEEPSPEED_CONFIGS[self.deepspeed]

    def line(self) -> str:
        return (f"deepspeed auto -> {self.config_path}: predicted peak {self.peak_gib:.0f} GiB of {self.gpu_gib:.0f} "
                f"GiB per GPU; {self.why} (--deepspeed PATH overrides)")  # fmt: skip


def choose(shape: ModelShape, work: Workload, gpu_gib: float, host_ram_gib: float, gpus_per_node: int = 1) -> Plan:
    """The fastest DeepSpeed setup predicted to fit (:data:`FASTEST_FIRST`), and why, in words."""
    fast = peak_gib(shape, work, "zero2", gpu_gib)
    slow = peak_gib(shape, work, "zero2_offload", gpu_gib)
    room = usable_gib(gpu_gib)
    if not work.trains_all_weights:
        return Plan("zero2", fast, gpu_gib, fast <= room, "adapters only: their optimizer is small, kept on the GPU")
    if fast <= room:
        return Plan("zero2", fast, gpu_gib, True, f"the optimizer fits on the GPU (fastest; offload would peak at "
                    f"{slow:.0f} GiB and copy {16 * shape.params / work.gpus / GIB:.0f} GiB of optimizer state per step)")  # fmt: skip
    host = host_gib(shape, work, gpus_per_node)
    why = (
        f"the optimizer on the GPU would peak at {fast:.0f} GiB, over the {room:.0f} GiB usable, so it goes to host RAM"
    )
    if slow > room:
        why += f"; even so over the usable {room:.0f} GiB: use LoRA (use_peft: true), more GPUs or fewer completions per step"
    if host > host_ram_gib:
        why += f"; host RAM {host_ram_gib:.0f} GiB is below the ~{host:.0f} GiB offload needs: use LoRA or more GPUs"
    return Plan("zero2_offload", slow, gpu_gib, slow <= room and host <= host_ram_gib, why)


def _largest_max_pixels(namespace) -> int:
    """The largest image budget of a recipe: its max_pixels, or a mixture source's own where that is larger.

    >>> from types import SimpleNamespace
    >>> _largest_max_pixels(SimpleNamespace(max_pixels=50176, datasets='[{"name": "a"}, {"max_pixels": 1003520}]'))
    1003520
    """
    import json

    sources = getattr(namespace, "datasets", None) or []
    if isinstance(sources, str):
        sources = json.loads(sources)
    return max([namespace.max_pixels, *(s.get("max_pixels") or 0 for s in sources if isinstance(s, dict))])


def prompt_tokens_bound(max_pixels: int, factor: int | None, text_tokens: int = 128) -> int:
    """An upper bound on a prompt's tokens: a full pixel budget of visual tokens (one image) plus the text."""
    return (max_pixels // (factor * factor) if factor else 0) + text_tokens


def plan_for(namespace, config) -> Plan:
    """:func:`choose` for a parsed recipe (argparse namespace of suzak's, GRPOConfig's and ModelConfig's fields) and
    its model's config, on this machine's GPU (``LOCAL_RANK``'s) and ``WORLD_SIZE`` ranks."""
    import psutil
    import torch

    from suzak.media.vision import patch_factor

    if not torch.cuda.is_available():
        raise SuzakError("deepspeed auto: no GPU here (DeepSpeed trains on GPUs); leave --deepspeed unset on the CPU")
    device = int(os.environ.get("LOCAL_RANK", "0"))
    gpu_gib = torch.cuda.get_device_properties(device).total_memory / GIB
    gpus = int(os.environ.get("WORLD_SIZE", "1"))
    colocated = getattr(namespace, "use_vllm", False) and getattr(namespace, "vllm_mode", "") == "colocate"
    # SFT (SFTConfig) has no completion length, beta or vLLM: its sequences are max_length tokens, all with logits
    length = getattr(namespace, "max_completion_length", None) or getattr(namespace, "max_length", None) or 1024
    work = Workload(
        completions=namespace.per_device_train_batch_size,
        prompt_tokens=prompt_tokens_bound(_largest_max_pixels(namespace), patch_factor(config)),
        completion_tokens=length,
        beta=getattr(namespace, "beta", 0.0),
        vllm_share=namespace.vllm_gpu_memory_utilization if colocated else 0.0,
        gradient_checkpointing=bool(namespace.gradient_checkpointing),
        trains_all_weights=not namespace.use_peft,
        gpus=gpus,
    )
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", str(gpus)))
    return choose(ModelShape.of(config), work, gpu_gib, psutil.virtual_memory().total / GIB, per_node)
