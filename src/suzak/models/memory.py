"""GPU memory arithmetic for a GRPO run, and the DeepSpeed setup ``deepspeed: auto`` picks from it.

A full fine-tuning GRPO step holds, per GPU (bytes, P the model's parameters, N the GPUs):

- the bf16 policy (2P) and, when ``beta > 0``, the bf16 reference model (2P);
- DeepSpeed ZeRO-2's gradient buckets (``reduce_bucket_size`` 5e8 elements in bf16, twice: ~1.9 GiB);
- with the optimizer on the GPU (``ds_configs/zero2.json``): the fp32 master weights and the fp32 gradient partition
  (8P/N) and the optimizer's state (AdamW's two fp32 moments: 8P/N, 16P/N in all; 8-bit AdamW's: 2P/N; the recipe's
  ``optim``, :data:`OPTIMIZER_STATE_BYTES`); with ``zero2_offload.json`` those live in host RAM and each step copies
  the gradients out and the weights back, which is what makes it slower;
- colocated vLLM: ``vllm_gpu_memory_utilization`` of the card (its weights, KV cache and graphs). With
  ``vllm_enable_sleep_mode`` vLLM drops its weights and KV cache while the policy trains (TRL wakes it to generate),
  so its share and the training pass's activations are never held at once: the peak is the larger of the two;
- activations: with gradient checkpointing one bf16 hidden state per layer per token, plus the completion tokens'
  logits (bf16, and the fp32 working copies of the log-softmax: 2.74 bytes per vocabulary entry, fitted), plus 1.2
  GiB. Without checkpointing every layer keeps ~(6h + 4i) bf16 values per token (an estimate, not measured). The
  tokens are a micro-batch's rows at full length, or with ``max_tokens_per_micro_batch`` the budget (one row at least:
  :func:`pass_tokens`; the budget counts what a pass computes, real tokens packed or the batch's width a row padded,
  so the bound holds whatever the completions' lengths).

The constants were fitted on, and the predictions checked against, every measured row of
``bench/results_grpo_speed.jsonl`` and ``bench/results_grpo_memory.jsonl`` (``tests/test_memory_plan.py``: each
within 6%). ``deepspeed: auto`` (the launch scripts' default on GPUs) takes the fastest setup whose predicted peak
fits with room to spare (:data:`RESERVE_FRACTION` of the GPU plus :data:`RESERVE_GIB`, what CUDA, NCCL and the
caching allocator held beyond torch's peak in those rows): the optimizer on the GPU (11.7 s/step against 14.6 with
offload, same H200, 3B, 64 × 256 tokens: docs/benchmarks.md), else optimizer offload, saying which recipe change
(an 8-bit optimizer, vLLM's sleep mode) would keep it on the GPU. The AdamW rows measured the 16P/N term; the 8-bit
state and the sleep-mode peak are arithmetic not yet checked against a GPU row (issue 55 item 3).

``gpu_memory_gib`` caps what the run may use of each GPU (torch's allocator, and the room the plan counts), for a GPU
shared with another job or an H200 standing in for an H100; ``vllm_gpu_memory_utilization`` stays vLLM's own
meaning, a fraction of the card.
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
ZERO_MASTER_BYTES = 8  # ZeRO-2 with bf16: each trained parameter's fp32 master copy and fp32 gradient partition
# the optimizer's state per trained parameter (bytes), by transformers' ``optim`` name: two fp32 moments for AdamW,
# one byte a state for bitsandbytes' and torchao's 8-bit ones; a name not here is counted as AdamW's (said once)
OPTIMIZER_STATE_BYTES = {
    **dict.fromkeys(("adamw_torch", "adamw_torch_fused", "adamw_torch_xla", "adamw_torch_npu_fused",
                     "adamw_anyprecision", "paged_adamw_32bit", "stable_adamw", "schedule_free_adamw",
                     "schedule_free_radam"), 8.0),  # fmt: skip
    **dict.fromkeys(("adamw_bnb_8bit", "adamw_8bit", "paged_adamw_8bit", "adamw_torch_8bit"), 2.0),
    "adamw_torch_4bit": 1.0,
    **dict.fromkeys(("ademamix", "paged_ademamix_32bit", "grokadamw"), 12.0),
    **dict.fromkeys(("ademamix_8bit", "paged_ademamix_8bit"), 3.0),
    **dict.fromkeys(("lion_32bit", "paged_lion_32bit", "rmsprop", "rmsprop_bnb", "rmsprop_bnb_32bit", "adagrad",
                     "schedule_free_sgd"), 4.0),  # fmt: skip
    **dict.fromkeys(("lion_8bit", "paged_lion_8bit", "rmsprop_bnb_8bit"), 1.0),
    **dict.fromkeys(("sgd", "adafactor", "lomo", "adalomo"), 0.0),  # no momentum / factored (a few bytes a row)
}
EIGHT_BIT_ADAMW = "adamw_bnb_8bit"  # what the plan suggests when AdamW's state does not fit


def optimizer_state_bytes(optim: str | None) -> float:
    """Bytes of optimizer state per trained parameter for transformers' ``optim`` (AdamW's 8 for a name not known).

    >>> optimizer_state_bytes("adamw_torch_fused"), optimizer_state_bytes("adamw_bnb_8bit"), optimizer_state_bytes(None)
    (8.0, 2.0, 8.0)
    """
    name = str(getattr(optim, "value", optim) or "adamw_torch")
    if name not in OPTIMIZER_STATE_BYTES:
        logger.info("memory plan: optim %s's state size is not known; counted as AdamW's (8 bytes a parameter)", name)
    return OPTIMIZER_STATE_BYTES.get(name, 8.0)


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
    optimizer_state_bytes: float = 8.0  # per trained parameter: :func:`optimizer_state_bytes` of the recipe's optim
    vllm_sleeps: bool = False  # vllm_enable_sleep_mode: vLLM's share is released while the policy trains
    tokens_per_pass: int | None = None  # max_tokens_per_micro_batch: a pass holds at most this many (or one row)


def pass_tokens(work: Workload) -> tuple[int, int]:
    """The tokens one training pass holds at most, and of them the completion tokens (whose logits it keeps): a
    micro-batch's rows at full length, or with ``max_tokens_per_micro_batch`` that many (one row at least).

    >>> pass_tokens(Workload(completions=8, prompt_tokens=300, completion_tokens=100))
    (3200, 800)
    >>> pass_tokens(Workload(completions=8, prompt_tokens=300, completion_tokens=100, tokens_per_pass=1000))
    (1000, 800)
    """
    row = work.prompt_tokens + work.completion_tokens
    tokens = work.completions * row
    completion = work.completions * work.completion_tokens
    if work.tokens_per_pass is None:
        return tokens, completion
    cap = max(work.tokens_per_pass, row)
    return min(tokens, cap), min(completion, cap)


def activation_gib(shape: ModelShape, work: Workload) -> float:
    tokens, completion = pass_tokens(work)
    per_token = (
        2 * shape.hidden_size
        if work.gradient_checkpointing
        else 2 * (6 * shape.hidden_size + 4 * shape.intermediate_size)
    )
    logits = completion * shape.vocab_size * LOGIT_BYTES
    return FIXED_ACTIVATION_GIB + (tokens * per_token * shape.num_layers + logits) / GIB


def peak_gib(shape: ModelShape, work: Workload, deepspeed: str, gpu_gib: float) -> float:
    """Predicted peak of torch's allocations on each GPU (what ``torch.cuda.max_memory_allocated`` reports; colocated
    vLLM allocates through torch in the same process), under ``deepspeed`` (``zero2`` or ``zero2_offload``)."""
    weights = 2 * shape.params * (2 if work.beta else 1)
    optimizer = optimizer_gib(shape, work) * GIB if deepspeed == "zero2" and work.trains_all_weights else 0
    fixed = (weights + optimizer) / GIB + BUCKETS_GIB
    vllm = work.vllm_share * gpu_gib
    activations = activation_gib(shape, work)
    return fixed + (max(vllm, activations) if work.vllm_sleeps else vllm + activations)


def optimizer_gib(shape: ModelShape, work: Workload) -> float:
    """One rank's ZeRO-2 optimizer partition: fp32 master weights and gradients, and the optimizer's state."""
    return (ZERO_MASTER_BYTES + work.optimizer_state_bytes) * shape.params / work.gpus / GIB


def host_gib(shape: ModelShape, work: Workload, gpus_per_node: int) -> float:
    """Host RAM a node needs for ``zero2_offload``: every rank's optimizer partition, plus the processes."""
    return optimizer_gib(shape, work) * gpus_per_node + OFFLOAD_HOST_GIB * gpus_per_node


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
                    f"{slow:.0f} GiB and copy {optimizer_gib(shape, work):.0f} GiB of optimizer state per step)")  # fmt: skip
    host = host_gib(shape, work, gpus_per_node)
    why = (
        f"the optimizer on the GPU would peak at {fast:.0f} GiB, over the {room:.0f} GiB usable, so it goes to host RAM"
    )
    if (keep := _keeps_it_on_the_gpu(shape, work, gpu_gib, room)) is not None:
        why += f" ({keep})"
    if slow > room:
        why += f"; even so over the usable {room:.0f} GiB: use LoRA (use_peft: true), more GPUs or fewer completions per step"
    if host > host_ram_gib:
        why += f"; host RAM {host_ram_gib:.0f} GiB is below the ~{host:.0f} GiB offload needs: use LoRA or more GPUs"
    return Plan("zero2_offload", slow, gpu_gib, slow <= room and host <= host_ram_gib, why)


def _keeps_it_on_the_gpu(shape: ModelShape, work: Workload, gpu_gib: float, room: float) -> str | None:
    """The smallest recipe change that would fit the optimizer on the GPU, in words: vLLM's sleep mode, an 8-bit
    AdamW, or both; None when neither would."""
    from dataclasses import replace

    changes = []
    if work.vllm_share and not work.vllm_sleeps:
        changes.append(({"vllm_sleeps": True}, "vllm_enable_sleep_mode: true"))
    if work.optimizer_state_bytes > OPTIMIZER_STATE_BYTES[EIGHT_BIT_ADAMW]:
        changes.append(({"optimizer_state_bytes": OPTIMIZER_STATE_BYTES[EIGHT_BIT_ADAMW]}, f"optim: {EIGHT_BIT_ADAMW}"))
    tries = [[change] for change in changes] + ([changes] if len(changes) == 2 else [])
    for chosen in tries:
        peak = peak_gib(shape, replace(work, **{k: v for fields, _ in chosen for k, v in fields.items()}), "zero2",
                        gpu_gib)  # fmt: skip
        if peak <= room:
            return f"with {' and '.join(words for _, words in chosen)} it would stay on the GPU: {peak:.0f} GiB"
    return None


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


def cap_gpu_memory(gib: float, device: int = 0) -> float:
    """Cap torch's allocator on GPU ``device`` to ``gib`` GiB (``gpu_memory_gib``); returns the fraction of the card.
    vLLM colocated in the process allocates its share (``vllm_gpu_memory_utilization`` of the card) through the same
    allocator; with its sleep mode, through its own pool, which the cap does not bind."""
    import torch

    if gib <= 0:
        raise SuzakError(f"gpu_memory_gib {gib:g}: a GPU memory cap must be above 0 GiB")
    if not torch.cuda.is_available():
        raise SuzakError(f"gpu_memory_gib {gib:g}: no GPU here; leave it unset on the CPU")
    card = torch.cuda.get_device_properties(device).total_memory / GIB
    if gib > card:
        raise SuzakError(f"gpu_memory_gib {gib:g} is more than GPU {device} has ({card:.1f} GiB): leave it unset to "
                         "use the whole card")  # fmt: skip
    torch.cuda.set_per_process_memory_fraction(gib / card, device)
    if os.environ.get("RANK", "0") == "0":
        logger.info("gpu_memory_gib: torch may allocate %.1f of GPU %d's %.1f GiB (%.3f of it)", gib, device, card,
                    gib / card)  # fmt: skip
    return gib / card


def plan_for(namespace, config) -> Plan:
    """:func:`choose` for a parsed recipe (argparse namespace of suzak's, GRPOConfig's and ModelConfig's fields) and
    its model's config, on this machine's GPU (``LOCAL_RANK``'s) and ``WORLD_SIZE`` ranks."""
    import psutil
    import torch

    from suzak.media.vision import patch_factor

    if not torch.cuda.is_available():
        raise SuzakError("deepspeed auto: no GPU here (DeepSpeed trains on GPUs); leave --deepspeed unset on the CPU")
    device = int(os.environ.get("LOCAL_RANK", "0"))
    card_gib = torch.cuda.get_device_properties(device).total_memory / GIB
    gpu_gib = getattr(namespace, "gpu_memory_gib", None) or card_gib
    gpus = int(os.environ.get("WORLD_SIZE", "1"))
    colocated = getattr(namespace, "use_vllm", False) and getattr(namespace, "vllm_mode", "") == "colocate"
    # SFT (SFTConfig) has no completion length, beta or vLLM: its sequences are max_length tokens, all with logits
    length = getattr(namespace, "max_completion_length", None) or getattr(namespace, "max_length", None) or 1024
    work = Workload(
        completions=namespace.per_device_train_batch_size,
        prompt_tokens=prompt_tokens_bound(_largest_max_pixels(namespace), patch_factor(config)),
        completion_tokens=length,
        beta=getattr(namespace, "beta", 0.0),
        # vLLM's share is of the card; the plan's room is the cap's (gpu_memory_gib), so it is restated against it
        vllm_share=namespace.vllm_gpu_memory_utilization * card_gib / gpu_gib if colocated else 0.0,
        gradient_checkpointing=bool(namespace.gradient_checkpointing),
        trains_all_weights=not namespace.use_peft,
        gpus=gpus,
        optimizer_state_bytes=optimizer_state_bytes(getattr(namespace, "optim", None)),
        vllm_sleeps=colocated and bool(getattr(namespace, "vllm_enable_sleep_mode", False)),
        tokens_per_pass=getattr(namespace, "max_tokens_per_micro_batch", None),
    )
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", str(gpus)))
    return choose(ModelShape.of(config), work, gpu_gib, psutil.virtual_memory().total / GIB, per_node)
