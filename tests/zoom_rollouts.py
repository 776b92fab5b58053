"""Multi-turn GRPO with the zoom on a tiny model taught the call by a short SFT (conftest.zoom_prior_model):
``python tests/zoom_rollouts.py PRIOR_MODEL_DIR OUTPUT.json [--vllm]``. Writes what tests/test_tools.py and tests/test_vllm_tier.py check: each step's log,
the original image sizes the zoom got, and per scored batch whether any tool turn was trained around (``tool_mask``
zeros inside the completion), how many images the forward took against how many rows, the stale-sampler guard's
gaps (with vLLM), and how far each packed training pass (``padding_free``, the crops inside the completions) is from
the same pass run padded."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from transformers import AutoModelForImageTextToText, AutoProcessor
from trl import GRPOConfig

from suzak.media.vision import PixelBudget, configure_processor
from suzak.models.packing import PackingCount
from suzak.models.tool_calling import prepare_tool_calling
from suzak.models.tools import ORIGINAL_IMAGE_COLUMN, ZoomEnvironment, resolve_tools
from suzak.scoring.rewards import word_match
from suzak.selftest import zoom_dataset
from suzak.training.trainer import VLMGRPOTrainer
from suzak.trl_internals.sampler_guard import SamplerGuard


def main(model_dir: str, output: str, vllm: bool) -> None:
    torch.manual_seed(0)
    out = Path(output).parent
    processor = AutoProcessor.from_pretrained(model_dir)
    model = AutoModelForImageTextToText.from_pretrained(model_dir)
    prepare_tool_calling(processor, model.config.model_type)
    budget = PixelBudget(3136, 3136).for_model(processor)  # the 8-token-a-side images seen at 2x2 tokens (vLLM keeps
    # the checkpoint processor's bounds, 3136 pixels and up)
    configure_processor(processor, budget)
    factor = budget.factor
    settings = {"use_vllm": True, "vllm_mode": "colocate", "vllm_max_model_length": 1024} if vllm else {}
    for name in ("WANDB_DIR", "WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR"):  # an offline W&B run's table
        os.environ[name] = str(out / name.lower())
        os.makedirs(os.environ[name], exist_ok=True)
    os.environ["WANDB_MODE"] = "offline"
    args = GRPOConfig(output_dir=str(out / "grpo"), max_steps=2, per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=160, max_tool_calling_iterations=1, temperature=0.5, learning_rate=1e-4,
                      logging_steps=1, save_strategy="no", report_to="wandb", log_completions=True, use_cpu=True,
                      disable_tqdm=True, bf16=False, **settings)  # fmt: skip
    trainer = VLMGRPOTrainer(model=model, reward_funcs=[word_match], args=args, processing_class=processor,
                             train_dataset=zoom_dataset(16, 2, factor=factor, slots=1), pixel_budget=budget,
                             sampler_guard=SamplerGuard(every=1, rows=4),
                             **resolve_tools(["zoom"], budget).trainer_kwargs())  # fmt: skip
    seen, batches = [], []
    reset = ZoomEnvironment.reset

    def spy_reset(self, **row):
        seen.append(list(row[ORIGINAL_IMAGE_COLUMN].size))
        return reset(self, **row)

    score = trainer._generate_and_score_completions

    def spy_score(inputs):
        batch = score(inputs)
        inside = batch["completion_mask"].bool()
        batches.append({"tool_tokens": int((inside & (batch["tool_mask"] == 0)).sum()) if "tool_mask" in batch else 0,
                        "images": int(batch["image_grid_thw"].size(0)), "rows": len(batch["num_images"]),
                        "post_tool_tokens": _post_tool_tokens(batch)})  # fmt: skip
        return batch

    passes = trainer._get_per_token_logps_and_entropies
    packed_gaps = []

    def padded_too(model, *args, **kwargs):
        """Each training pass as it ran (packed), then again padded (no gradient, not counted): the largest gap."""
        logps = passes(model, *args, **kwargs)
        counted, trainer.packing_count, trainer.padding_free = trainer.packing_count, PackingCount(), False
        try:
            with torch.no_grad():
                padded = passes(model, *args, **kwargs)
        finally:
            trainer.packing_count, trainer.padding_free = counted, True
        packed_gaps.append(float((logps[0].detach() - padded[0]).abs().max()))
        return logps

    trainer._get_per_token_logps_and_entropies = padded_too
    crops = []
    trainer.completion_listeners.append(lambda rows: crops.extend(json.loads(row["zoom_crops"]) for row in rows))
    trainer._generate_and_score_completions = spy_score
    ZoomEnvironment.reset = spy_reset
    trainer.train()
    record = {"logs": trainer.state.log_history, "seen": seen, "batches": batches,
              "gaps": [list(gap) for gap in trainer.sampler_guard.gaps], "crops": crops, "packed_gaps": packed_gaps,
              "tables": [json.loads(path.read_text()) for path in sorted((out / "wandb_dir").rglob("completions_*.table.json"))]}  # fmt: skip
    Path(output).write_text(json.dumps(record), encoding="utf-8")


def _post_tool_tokens(batch) -> int:
    """Model tokens after a tool turn (what the guard compares there, which depend on the crop's features)."""
    if "tool_mask" not in batch:
        return 0
    mask, inside = batch["tool_mask"], batch["completion_mask"].bool()
    after = (mask == 0).int().cummax(dim=1).values.bool()  # at or after the first tool token
    return int((after & (mask == 1) & inside).sum())


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], "--vllm" in sys.argv[3:])
