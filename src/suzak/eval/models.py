"""Loading a checkpoint for evaluation: base models, full suzak checkpoints, LoRA adapters, DeepSpeed output dirs.

- A model folder, a Hub id or ``tiny`` loads through :func:`suzak.models.loading.load_model_and_processor` (the training
  loader), in bfloat16 on a GPU and float32 on the CPU.
- A LoRA adapter folder (``adapter_config.json``) loads its base model (``base_model_name_or_path``), applies the
  adapter and merges it, so generation runs at full speed.
- ``quantization`` (``"4bit"``/``"8bit"``, with ``nf4``/``fp4``): the model loads through bitsandbytes as QLoRA training
  loads it (:func:`suzak.models.loading.quantization_config`); an adapter then stays unmerged on the quantized base,
  computing as in training (merging into 4-bit weights would round them again).
- A DeepSpeed ``checkpoint-N`` folder with ``model.safetensors`` beside ``global_step*/`` loads like any folder;
  one with ZeRO shards only is an error that says how to consolidate it with ``zero_to_fp32.py``.
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from suzak import SuzakError
from suzak.media.vision import PixelBudget
from suzak.models.loading import adapter_base, load_model_and_processor, quantized, resolve_model_path

__all__ = ["Quantization", "eval_device", "eval_dtype", "load_eval_model", "merged_model_dir", "saved_budget"]

logger = logging.getLogger(__name__)

_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
_PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json", "tokenizer_config.json")


def eval_device() -> torch.device:
    """This process's GPU (``LOCAL_RANK`` under torchrun), else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def _check_not_zero_shards(path: Path) -> None:
    shards = sorted(path.glob("global_step*"))
    if shards and not any((path / w).is_file() for w in _WEIGHTS):
        raise SuzakError(
            f"{path} holds DeepSpeed ZeRO shards ({shards[-1].name}/) but no model weights. Consolidate them first: "
            f"`python {path}/zero_to_fp32.py {path} {path} --safe_serialization` writes model.safetensors beside its "
            "config.json; then evaluate the same folder."
        )


@dataclass(frozen=True)
class Quantization:
    """How an evaluation loads the model through bitsandbytes (TRL's ``ModelConfig`` fields of the same names)."""

    load_in_4bit: bool = False
    load_in_8bit: bool = False
    bnb_4bit_quant_type: str = "nf4"
    use_bnb_nested_quant: bool = False
    bnb_4bit_quant_storage: str | None = None


def _load(path: str, dtype: str, quantization: Quantization | None = None) -> tuple[Any, Any]:
    model_args = SimpleNamespace(model_name_or_path=path, model_revision=None, dtype=dtype, attn_implementation=None,
                                 **asdict(quantization or Quantization()))  # fmt: skip
    no_mixed_precision = SimpleNamespace(bf16=False, fp16=False)
    return load_model_and_processor(model_args, no_mixed_precision)


def _load_adapter(path: Path, base: str, dtype: str, quantization: Quantization | None = None) -> tuple[Any, Any]:
    from peft import PeftModel

    unmerged = quantized(quantization) is not None
    logger.info("LoRA adapter %s on base model %s: loading both and %s", path, base,
                "keeping the adapter unmerged on the quantized base" if unmerged else "merging")  # fmt: skip
    model, processing_class = _load(base, dtype, quantization)
    model = PeftModel.from_pretrained(model, str(path))
    if not unmerged:
        model = model.merge_and_unload()
    if any((path / f).is_file() for f in _PROCESSOR_FILES):  # the trainer saves the processor with the adapter
        from transformers import AutoProcessor, AutoTokenizer

        loader = AutoProcessor if hasattr(processing_class, "tokenizer") else AutoTokenizer
        processing_class = loader.from_pretrained(str(path))
    return model, processing_class


def eval_dtype(dtype: str | None = None, device: torch.device | None = None) -> str:
    """The dtype an evaluation runs the model in, on either engine: ``dtype``, else bfloat16 on a GPU and float32
    on the CPU (vLLM left to ``auto`` would run an fp32 checkpoint in bf16 and answer differently from HF)."""
    return dtype or ("bfloat16" if (device or eval_device()).type == "cuda" else "float32")


def load_eval_model(model_path: str, *, dtype: str | None = None, device: torch.device | None = None,
                    quantization: Quantization | None = None):  # fmt: skip
    """(model in eval mode on ``device``, processing class) for any checkpoint kind suzak writes; ``quantization``
    loads it through bitsandbytes (already on its device)."""
    device = device or eval_device()
    dtype = eval_dtype(dtype, device)
    path = resolve_model_path(model_path)
    local = Path(path)
    if local.is_dir():
        _check_not_zero_shards(local)
    base = adapter_base(local) if local.is_dir() else None
    if base:
        model, processing_class = _load_adapter(local, base, dtype, quantization)
    else:
        model, processing_class = _load(path, dtype, quantization)
    if quantized(quantization) is None:  # else bitsandbytes placed (and packed) the weights itself
        model = model.to(device)
    return model.eval(), processing_class


def merged_model_dir(model_path: str) -> str:
    """A folder vLLM can load: ``model_path`` itself (``tiny``: the vLLM-ready tiny), or for a LoRA adapter its merge,
    written once beside it."""
    path = Path(resolve_model_path(model_path, for_vllm=True))
    if not path.is_dir():
        return str(path)
    _check_not_zero_shards(path)
    base = adapter_base(path)
    if base is None:
        return str(path)
    merged = path.with_name(path.name + "-merged")
    if not (merged / "config.json").is_file():
        model, processing_class = _load_adapter(path, base, "bfloat16")
        model.save_pretrained(merged)
        processing_class.save_pretrained(merged)
        logger.info("merged LoRA adapter %s into %s (vLLM loads full models)", path, merged)
    return str(merged)


def saved_budget(processing_class: Any) -> PixelBudget | None:
    """The min/max pixels a checkpoint's image processor was saved with (None for a text tokenizer)."""
    image_processor = getattr(processing_class, "image_processor", None)
    size = getattr(image_processor, "size", None)
    if size is None:
        return None
    lo, hi = (getattr(size, key, None) or (size.get(key) if isinstance(size, dict) else None)
              for key in ("shortest_edge", "longest_edge"))  # fmt: skip
    return PixelBudget(lo, hi) if lo and hi and lo <= hi else None
