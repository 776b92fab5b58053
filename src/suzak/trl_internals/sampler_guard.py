"""The stale-sampler guard: a few of vLLM's sampled completions scored with the policy, and compared.

:class:`SamplerGuard` / :class:`StaleSampler` read the batch ``_generate_and_score_completions`` returns (its ids,
masks, images and vLLM's ``sampling_per_token_logps``; :func:`_row_model_inputs` builds one row's model call from
it) and TRL's sampling settings (``temperature``, ``top_k``, ``top_p``, ``min_p``, ``repetition_penalty``, and the
``logit_bias`` in ``vllm_generation.generation_kwargs``), which :func:`sampling_logps` applies as vLLM's sampler does
(tests/test_trl_contract.py: ``test_the_scored_batch_holds_what_the_sampler_guard_reads``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from suzak import SuzakError
from suzak.trl_internals.video import VIDEO_FIELDS, feeding_videos_of

logger = logging.getLogger(__name__)


class StaleSampler(SuzakError):
    """vLLM's log-probabilities of its own samples are far from the policy's: it samples from other weights (or other
    inputs) than the ones being trained. The run stops (after a checkpoint)."""


@dataclass
class SamplerGuard:
    """Stops a run whose vLLM sampler does not follow the policy.

    A weight sync that misses a layer (a wrong name, a layer vLLM computes from a copy made at load, a skipped
    tensor) raises nothing: vLLM keeps sampling from old weights and GRPO trains on their samples. At the first
    generation after the first weight sync, then every ``every`` steps, the trainer scores ``rows`` of vLLM's sampled
    completions with the policy, under vLLM's sampling rule (the temperature, and the tokens generation may not
    sample taken out and the rest renormalised, as vLLM's processed log-probabilities are), and compares them with
    the log-probabilities vLLM returned for them: past ``tolerance`` (mean nats per completion token, over ranks), the
    run stops. Noise measures ~1e-7 with both sides in fp32; a sampler whose LM head stayed at the initial weights
    drifted past 0.1 by step 31 of the demo recipe (docs/benchmarks.md, "Stale-sampler guard").

    TRL's own ``sampling/sampling_logp_difference`` compares with the policy's unrestricted distribution, so it also
    counts the mass the policy puts on the vision placeholders vLLM may not sample (which sampling never penalises:
    a tiny policy here once greedily answered ``<|image_pad|>`` on half its prompts), and every top-k/top-p/min-p cut.
    With ``repetition_penalty`` other than 1 the check is off (said once): vLLM's penalty depends on each prefix.
    """

    every: int = 10  # steps between checks after the first; 0 turns the guard off
    tolerance: float = 0.1
    rows: int = 16  # completions scored per rank at a check, spread over the batch's prompts
    checked_at: int | None = None  # the optimizer step of the last check
    gaps: list[tuple[int, float, float, float]] = field(default_factory=list)  # (step, mean, max, suppressed mass)

    def due(self, step: int) -> bool:
        return self.every > 0 and (self.checked_at is None or step - self.checked_at >= self.every)

    def check(self, step: int, mean_gap: float, max_gap: float, suppressed: float = 0.0) -> None:
        """Record the gap of the batch generated for optimizer step ``step``; past the tolerance, raise."""
        first = self.checked_at is None
        self.checked_at = step
        self.gaps.append((step, mean_gap, max_gap, suppressed))
        logger.log(logging.INFO if first else logging.DEBUG,
                   "sampler check at step %d: mean |log p(vLLM) - log p(policy)| %.2g per token (max %.2g), the "
                   "policy's mass on the suppressed tokens %.2g; next every %d steps (sampler_check/* in the metrics)",
                   step, mean_gap, max_gap, suppressed, self.every)  # fmt: skip
        if not mean_gap > self.tolerance:  # NaN (no token scored) passes
            return
        gap = (f"mean |log p(vLLM) - log p(policy)| = {mean_gap:.3f} per completion token at step {step} (max "
               f"{max_gap:.2f}; tolerance {self.tolerance:g}, sampler_logp_tolerance)")  # fmt: skip
        if first:
            cause = ("before any update the two already disagree: vLLM sees other prompt tokens or images than "
                     "training (an image placeholder expanded twice, TRL #6294; another pixel budget), or another "
                     "model or dtype")  # fmt: skip
        else:
            cause = ("vLLM samples from weights the sync did not reach (a layer vLLM computes from a copy made at "
                     "load, weights under names vLLM does not load, a skipped layer): GRPO would train on samples "
                     "of the old policy")  # fmt: skip
        raise StaleSampler(f"vLLM's sampler does not follow the policy: {gap}; {cause}")


def sampling_logps(logits: torch.Tensor, *, temperature: float, logit_bias: Mapping | None = None, top_k: int = 0,
                   top_p: float = 1.0, min_p: float | None = None) -> torch.Tensor:  # fmt: skip
    """Log-probabilities over the vocabulary as vLLM's sampler reports them (``processed_logprobs``): the logit bias,
    the temperature, then min-p, top-k and top-p cuts (vLLM's order), renormalised. ``logits``: (T, V).

    >>> logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    >>> sampling_logps(logits, temperature=1.0, logit_bias={0: -100.0}, top_k=2).exp().round(decimals=3)
    tensor([[0.0000, 0.7310, 0.2690, 0.0000]])
    """
    logits = logits.float().clone()
    for token, bias in (logit_bias or {}).items():
        logits[:, int(token)] += bias
    logits = logits / temperature
    if min_p:
        probs = logits.softmax(-1)
        logits = logits.masked_fill(probs < min_p * probs.max(-1, keepdim=True).values, -torch.inf)
    if top_k and top_k > 0:
        kth = logits.topk(min(top_k, logits.size(-1)), dim=-1).values[:, -1:]  # (T, 1)
        logits = logits.masked_fill(logits < kth, -torch.inf)
    if top_p < 1.0:
        ordered, order = logits.sort(-1, descending=True)
        before = ordered.softmax(-1).cumsum(-1) - ordered.softmax(-1)  # mass of the tokens ranked above each
        logits = logits.scatter(-1, order, ordered.masked_fill(before > top_p, -torch.inf))
    return logits.log_softmax(-1)


def _row_model_inputs(batch: dict[str, Any], row: int) -> dict[str, Any]:
    """The policy's forward inputs for one row of TRL's scored batch (``_generate_and_score_completions``'s output):
    prompt + completion ids and mask, and the row's images (Qwen VL layout: ``pixel_values`` rows per image are its
    ``image_grid_thw`` product)."""
    ids = torch.cat([batch["prompt_ids"][row], batch["completion_ids"][row]])[None]  # (1, P + C)
    mask = torch.cat([batch["prompt_mask"][row], batch["completion_mask"][row]])[None]
    inputs: dict[str, Any] = {"input_ids": ids, "attention_mask": mask}
    if "mm_token_type_ids" in batch:
        inputs["mm_token_type_ids"] = batch["mm_token_type_ids"][row : row + 1]
    counts = list(batch.get("num_images") or [])
    if "image_grid_thw" in batch and "pixel_values" in batch and counts[row]:  # (a video row has none)
        first, count = sum(counts[:row]), counts[row]
        rows_per_image = batch["image_grid_thw"].prod(dim=-1).tolist()  # (images,)
        start = sum(rows_per_image[:first])
        inputs["pixel_values"] = batch["pixel_values"][start : start + sum(rows_per_image[first : first + count])]
        inputs["image_grid_thw"] = batch["image_grid_thw"][first : first + count]
    return inputs


def check_sampler(trainer, batch: dict[str, Any]) -> None:
    """The stale-sampler guard (:class:`SamplerGuard`) on the batch TRL just generated with vLLM and scored:
    a few completions of each rank, the gap averaged over ranks, so every rank decides alike."""
    step = trainer.state.global_step + 1
    guard = trainer.sampler_guard
    if not trainer.use_vllm or not guard.due(step):
        return
    if (trainer.repetition_penalty or 1.0) != 1.0:
        logger.warning("the stale-sampler guard is off: with repetition_penalty %g vLLM's log-probabilities "
                       "depend on each prefix's penalties, which it does not reproduce", trainer.repetition_penalty)  # fmt: skip
        guard.every = 0
        return
    sums = torch.zeros(4, device=trainer.accelerator.device)  # |gap| summed, tokens, suppressed mass summed, max |gap|
    if batch.get("sampling_per_token_logps") is not None:
        count = batch["completion_ids"].size(0)
        for row in sorted({i * count // guard.rows for i in range(min(guard.rows, count))}):  # across prompts
            part = sampler_gap(trainer, batch, row)
            sums[:3] += part[:3]
            sums[3] = torch.maximum(sums[3], part[3])
    totals = trainer.accelerator.gather(sums[None])  # (ranks, 4)
    tokens = totals[:, 1].sum().item()
    if tokens == 0:
        return
    gap, largest, mass = (
        totals[:, 0].sum().item() / tokens,
        totals[:, 3].max().item(),
        totals[:, 2].sum().item() / tokens,
    )
    for name, value in (("logp_gap", gap), ("logp_gap_max", largest), ("suppressed_mass", mass)):
        trainer._metrics["train"][f"sampler_check/{name}"].append(value)  # this step's log line: metrics.csv, W&B
    guard.check(step, gap, largest, mass)


@torch.no_grad()
def sampler_gap(trainer, batch: dict[str, Any], row: int) -> torch.Tensor:
    """(sum of |log p_vLLM - log p_policy|, tokens, sum of the suppressed mass, max gap) over one row's completion:
    the policy's log-probability of each sampled token under vLLM's sampling rule (:func:`sampling_logps`),
    against what vLLM returned."""
    length = batch["completion_ids"].size(1)
    videos = batch.get(VIDEO_FIELDS)
    with trainer.accelerator.autocast(), (nullcontext() if videos is None else
                                       feeding_videos_of(trainer.processing_class, trainer.model, [videos[row]])):  # fmt: skip
        logits = trainer.model(**_row_model_inputs(batch, row), logits_to_keep=length + 1).logits[0, :-1]  # (C, V)
    bias = trainer.vllm_generation.generation_kwargs.get("logit_bias") or {}
    logps = sampling_logps(logits, temperature=trainer.temperature, logit_bias=bias, top_k=trainer.top_k or 0,
                           top_p=trainer.top_p if trainer.top_p is not None else 1.0, min_p=trainer.min_p)  # fmt: skip
    suppressed = trainer.suppressed_token_ids  # the biased-out ones, read from the same logit bias
    mass = (logits.float() / trainer.temperature).softmax(-1)[:, suppressed].sum(-1)  # (C,) the policy's own
    sampled = logps.gather(-1, batch["completion_ids"][row][:, None])[:, 0]  # (C,)
    vllm = batch["sampling_per_token_logps"][row].float()
    mask = batch["completion_mask"][row].bool() & ~torch.isnan(vllm)
    if "tool_mask" in batch:  # tool turns (TRL's 0 for logps vLLM never sampled) are not the sampler's
        mask &= batch["tool_mask"][row].bool()
    gap = (sampled - vllm).abs()[mask]
    if gap.numel() == 0:
        return torch.zeros(4, device=logits.device)
    return torch.stack([gap.sum(), torch.tensor(float(gap.numel()), device=gap.device), mass[mask].sum(),
                        gap.max()])  # fmt: skip
