"""Exporting checkpoints to plain Hugging Face model folders that the Auto classes, vLLM and ``suzak.eval`` load.

    suzak export zero outputs/run/checkpoint-100 [--output DIR] [--dtype bfloat16]             # DeepSpeed ZeRO shards
    suzak export lora outputs/run-lora [--output DIR] [--base_model M]                        # LoRA adapter → merged

- ``zero``: consolidates the ZeRO-2/3 shards of ``checkpoint-N/global_stepN/`` with DeepSpeed's own
  ``get_fp32_state_dict_from_zero_checkpoint`` (the fp32 master weights, not a 16-bit copy), loads them into the
  model class of the checkpoint's ``config.json`` and saves safetensors with the checkpoint's processor and
  generation config. Default output ``<checkpoint>-hf``; default dtype the one in ``config.json``.
- ``lora``: loads the adapter's base model, applies the adapter with PEFT, merges it (``merge_and_unload``) and saves
  the full model with the processor. Default output ``<adapter>-merged``.

Both folders then load with ``AutoModelForImageTextToText`` / ``AutoProcessor`` (a text model's with
``AutoModelForCausalLM`` / ``AutoTokenizer``) and evaluate with ``python -m suzak.eval TASK --model_path DIR``;
``python -m suzak.release --checkpoint DIR`` publishes them.
"""

from __future__ import annotations

import argparse
import logging
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from tqdm.auto import tqdm

from suzak import SuzakError

__all__ = ["export_lora", "export_zero", "main"]

logger = logging.getLogger(__name__)


def _dtype(name: str | None, config: Any) -> torch.dtype:
    """``name`` (``float32``, ``bfloat16``, ``float16``), else the config's dtype, else float32."""
    chosen = name or getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or "float32"
    if isinstance(chosen, torch.dtype):
        return chosen
    dtype = getattr(torch, str(chosen).replace("torch.", ""), None)
    if not isinstance(dtype, torch.dtype):
        raise SuzakError(f"unknown dtype {chosen!r}: use float32, bfloat16 or float16")
    return dtype


def _model_class(config: Any):
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    return AutoModelForImageTextToText if getattr(config, "vision_config", None) is not None else AutoModelForCausalLM


def _save_processor(sources: list[Path | str], output: Path) -> None:
    """The processor (or tokenizer) from the first source that has one, saved beside the weights."""
    from transformers import AutoProcessor, AutoTokenizer

    for source in sources:
        for loader in (AutoProcessor, AutoTokenizer):
            try:
                loader.from_pretrained(str(source)).save_pretrained(output)
                return
            except (OSError, ValueError, TypeError, KeyError) as error:
                logger.debug("no %s in %s: %s", loader.__name__, source, error)
    raise SuzakError(f"no processor or tokenizer found in {', '.join(map(str, sources))}")


def _copy_generation_config(source: Path, output: Path) -> None:
    if (source / "generation_config.json").is_file():
        shutil.copy2(source / "generation_config.json", output / "generation_config.json")


def _zero_state_dict(checkpoint: Path, tag: str | None) -> dict[str, torch.Tensor]:
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    if tag is None and not (checkpoint / "latest").is_file() and not any(checkpoint.glob("global_step*")):
        raise SuzakError(f"{checkpoint} holds no DeepSpeed ZeRO checkpoint (no global_step*/ folder or 'latest' file)")
    logger.info("consolidating ZeRO shards in %s", checkpoint)
    return get_fp32_state_dict_from_zero_checkpoint(str(checkpoint), tag=tag)


def _load_into_empty_model(config: Any, state: dict[str, torch.Tensor], dtype: torch.dtype):
    """The config's model with ``state`` as its weights, built on the meta device (no second copy in memory)."""
    with torch.device("meta"):
        model = _model_class(config).from_config(config, dtype=dtype)
    converted = {name: tensor.to(dtype) for name, tensor in tqdm(state.items(), desc="weights", unit="tensor")}
    result = model.load_state_dict(converted, strict=False, assign=True)
    model.tie_weights()
    empty = [name for name, p in model.named_parameters() if p.device.type == "meta"]
    if empty or result.unexpected_keys:
        raise SuzakError(f"the ZeRO checkpoint does not match {type(model).__name__}: missing {empty[:5]}, "
                         f"unexpected {result.unexpected_keys[:5]}")  # fmt: skip
    return model


def export_zero(checkpoint: str | Path, output: str | Path | None = None, *, dtype: str | None = None,
                tag: str | None = None) -> Path:  # fmt: skip
    """A DeepSpeed ZeRO ``checkpoint-N`` as a plain model folder (safetensors + processor + generation config)."""
    from transformers import AutoConfig

    checkpoint = Path(checkpoint)
    output = Path(output) if output else checkpoint.with_name(checkpoint.name + "-hf")
    if not (checkpoint / "config.json").is_file():
        raise SuzakError(f"no config.json in {checkpoint}: export needs the checkpoint the Trainer wrote")
    config = AutoConfig.from_pretrained(checkpoint)
    target = _dtype(dtype, config)
    model = _load_into_empty_model(config, _zero_state_dict(checkpoint, tag), target)
    output.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(output)
    _save_processor([checkpoint, checkpoint.parent], output)
    _copy_generation_config(checkpoint, output)
    logger.info("exported %s (%s) to %s", checkpoint, target, output)
    return output


def _adapter_base(adapter: Path, base_model: str | None) -> str:
    from suzak.models.loading import adapter_base

    if not (adapter / "adapter_config.json").is_file():
        raise SuzakError(f"{adapter} is not a LoRA adapter folder (no adapter_config.json)")
    return base_model or adapter_base(adapter)


def export_lora(adapter: str | Path, output: str | Path | None = None, *, base_model: str | None = None,
                dtype: str | None = None) -> Path:  # fmt: skip
    """A LoRA adapter merged into its base model, saved as a full model folder with the processor."""
    from peft import PeftModel
    from transformers import AutoConfig

    from suzak.models.loading import load_model_and_processor, resolve_model_path

    adapter = Path(adapter)
    base = resolve_model_path(_adapter_base(adapter, base_model))
    output = Path(output) if output else adapter.with_name(adapter.name + "-merged")
    target = _dtype(dtype, AutoConfig.from_pretrained(base))
    model_args = SimpleNamespace(model_name_or_path=base, model_revision=None, dtype=str(target).replace("torch.", ""),
                                 attn_implementation=None)  # fmt: skip
    model, _ = load_model_and_processor(model_args, SimpleNamespace(bf16=False, fp16=False))
    merged = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload(progressbar=True)
    output.mkdir(parents=True, exist_ok=True)
    merged.save_pretrained(output)
    _save_processor([adapter, base], output)
    _copy_generation_config(Path(base), output)
    logger.info("merged adapter %s into %s, saved to %s", adapter, base, output)
    return output


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="suzak export", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="kind", required=True)
    zero = sub.add_parser("zero", help="DeepSpeed ZeRO checkpoint → plain HF model folder")
    zero.add_argument("checkpoint", help="checkpoint-N folder with global_stepN/ shards")
    zero.add_argument("--tag", help="shard folder to use (default: the one named in 'latest')")
    lora = sub.add_parser("lora", help="LoRA adapter → merged full model")
    lora.add_argument("checkpoint", help="adapter folder (adapter_config.json)")
    lora.add_argument("--base_model", help="base model (default: the adapter's base_model_name_or_path)")
    for command in (zero, lora):
        command.add_argument("--output", help="output folder (default: CHECKPOINT-hf / CHECKPOINT-merged)")
        command.add_argument("--dtype", help="float32, bfloat16 or float16 (default: the model config's)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if args.kind == "zero":
            output = export_zero(args.checkpoint, args.output, dtype=args.dtype, tag=args.tag)
        else:
            output = export_lora(args.checkpoint, args.output, base_model=args.base_model, dtype=args.dtype)
    except SuzakError as error:
        raise SystemExit(f"error: {error}") from None
    print(loading_hint(output))


def loading_hint(folder: Path) -> str:
    """What the export printed: how to load the folder and a task to evaluate it on (GSM8K for a text model)."""
    from transformers import AutoConfig

    model_class = _model_class(AutoConfig.from_pretrained(folder))
    task = "superclevr" if model_class.__name__ == "AutoModelForImageTextToText" else "gsm8k"
    return (f"exported to {folder}: load with {model_class.__name__}.from_pretrained('{folder}'); evaluate with "
            f"`python -m suzak.eval {task} --model_path {folder}`")  # fmt: skip
