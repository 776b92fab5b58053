"""Model and processor loading: the Qwen VL families (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5) through the Auto
classes, text models too.

- ``model_name_or_path: tiny`` builds (once, cached) the offline tiny Qwen2.5-VL of :mod:`suzak.models.tiny`;
  ``tiny:qwen2_vl``, ``tiny:qwen3_vl``, ``tiny:qwen3_5`` the tiny model of that family. A run that generates with
  vLLM (``use_vllm``, ``--engine vllm``) gets the family's vLLM-ready tiny instead (head_dim 32, which vLLM's CPU
  attention takes: :meth:`suzak.models.tiny.TinyConfig.shaped`), logged.
- A vision-language checkpoint of a family suzak does not size images for is one line naming its model type and the
  supported families (:func:`suzak.media.vision.vision_family`), as is a processor whose patch grid disagrees with its
  model's config; :func:`model_budget` reads the pixel budget's factor from the checkpoint's config.
- ``attn_implementation: auto`` picks flash_attention_2 when flash-attn imports and a CUDA GPU is present, else
  sdpa, and logs which.
- dtype: bf16 weights when the run trains in bf16 under DeepSpeed or LoRA (fp32 master weights exist there);
  fp32 weights + bf16 autocast for plain full fine-tuning (pure-bf16 AdamW loses lr-1e-6 updates); float32 on CPU.
- QLoRA: TRL's ``ModelConfig`` fields ``load_in_4bit`` (``bnb_4bit_quant_type``, ``use_bnb_nested_quant``,
  ``bnb_4bit_quant_storage``) or ``load_in_8bit`` load the language model's linear layers through bitsandbytes, computing
  in the run's dtype (:func:`quantization_config`); the vision tower and ``lm_head`` stay in that dtype unless
  ``quantize_vision_tower`` (docs/qlora.md says why). The adapters train in fp32 (:class:`suzak.trl_internals.hooks.TrainerHooks`).
- ``trust_remote_code`` stays off: every supported family is a native transformers model.
- A ``model_name_or_path`` that is a local folder (it exists, or it is written as a path: ``/``, ``./``, ``../``,
  ``~`` or more than one ``/``) is checked as one: missing, empty, without ``config.json`` or without weights is one
  line about the folder. Only a Hub id (``NAME`` or ``ORG/NAME``) gets the advice to download it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch

from suzak import SuzakError
from suzak.media.vision import PixelBudget, patch_factor, vision_family
from suzak.models.positions import use_qwen_video_positions

__all__ = [
    "TINY_MODEL",
    "adapter_base",
    "freeze_vision_tower",
    "load_model_and_processor",
    "load_processor",
    "local_model_problem",
    "model_budget",
    "model_source_config",
    "model_type",
    "pick_attn_implementation",
    "quantization_config",
    "quantized",
    "resolve_model_path",
    "tiny_family",
]

logger = logging.getLogger(__name__)

TINY_MODEL = "tiny"  # the default family's; "tiny:<family>" names another


def tiny_family(name: str) -> str | None:
    """The tiny model family ``name`` asks for (``tiny``, ``tiny:<family>``), None for any other model name.

    >>> tiny_family("tiny"), tiny_family("tiny:qwen3_vl"), tiny_family("Qwen/Qwen3-VL-2B-Instruct")
    ('qwen2_5_vl', 'qwen3_vl', None)
    """
    from suzak.models.tiny import DEFAULT_FAMILY, FAMILIES

    if name == TINY_MODEL:
        return DEFAULT_FAMILY
    if not name.startswith(TINY_MODEL + ":"):
        return None
    family = name.split(":", 1)[1]
    if family not in FAMILIES:
        raise SuzakError(f"model {name!r}: no tiny model of family {family!r}; the tiny families are "
                         f"{', '.join(f'{TINY_MODEL}:{f}' for f in FAMILIES)}")  # fmt: skip
    return family


def tiny_model_cache(family: str | None = None, *, for_vllm: bool = False) -> Path:
    """Where the tiny model of ``family`` (its vLLM-ready size with ``for_vllm``) is built: keyed by the family, the
    size and a hash of the builder's source and chat templates, so a changed builder never reuses a stale model (a
    tokenizer built by older code would not match the prompts)."""
    import hashlib

    import suzak.models.tiny
    import suzak.scoring.prompts
    from suzak.models.tiny import DEFAULT_FAMILY, TEMPLATES_DIR

    files = [Path(m.__file__) for m in (suzak.models.tiny, suzak.scoring.prompts)] + sorted(
        TEMPLATES_DIR.glob("*.jinja")
    )
    source = "".join(path.read_text(encoding="utf-8") for path in files)
    root = os.environ.get("SUZAK_CACHE") or Path.home() / ".cache" / "suzak"
    size = "-vllm" if for_vllm else ""
    return Path(root) / f"tiny-{family or DEFAULT_FAMILY}{size}-{hashlib.sha256(source.encode()).hexdigest()[:10]}"


def resolve_model_path(name: str, *, for_vllm: bool = False) -> str:
    """A local path for ``tiny`` / ``tiny:<family>`` (building that tiny model once; with ``for_vllm``, its vLLM-ready
    size), otherwise ``name`` unchanged."""
    family = tiny_family(name)
    if family is None:
        return name
    path = tiny_model_cache(family, for_vllm=for_vllm)
    if not (path / "config.json").is_file():
        import shutil

        from suzak.models.tiny import TinyConfig

        logger.info("building the offline tiny %s%s in %s", family, " (vLLM-ready: head_dim 32)" * for_vllm, path)
        scratch = _build_whole(
            path.with_name(f"{path.name}.tmp-{os.getpid()}"), TinyConfig.shaped(family, for_vllm=for_vllm)
        )
        try:
            scratch.rename(path)  # whole or absent: torchrun ranks may build at the same time
        except OSError:
            shutil.rmtree(scratch)  # another process finished first; its copy is identical
    elif for_vllm:
        logger.info("%s with vLLM generation: the vLLM-ready tiny %s (head_dim 32) in %s", name, family, path)
    return str(path)


def _build_whole(folder: Path, config) -> Path:
    """``build_tiny_model(folder, config)`` with every file written, also on a rank of a torch.distributed run.

    Under an initialized process group transformers' ``save_pretrained`` writes the weights and config on global
    rank 0 only (``should_save_on_this_rank``), silently: a torchrun rank 1 that built the tiny model first left a
    folder of tokenizer files without ``config.json`` in the cache, and both ranks stopped at loading it. A rank
    therefore builds in a fresh process of its own, which has no process group."""
    from suzak.models.tiny import build_tiny_model

    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return build_tiny_model(folder, config)
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(build_tiny_model, folder, config).result()


def pick_attn_implementation(requested: str | None) -> str:
    """``auto``/None → flash_attention_2 when usable (CUDA + flash-attn imports), else sdpa. Others pass through."""
    if requested not in (None, "auto"):
        return requested
    if torch.cuda.is_available():
        try:
            import flash_attn  # noqa: F401

            choice = "flash_attention_2"
        except Exception as error:  # noqa: BLE001 - a broken flash-attn build must fall back, not crash
            logger.warning("flash-attn unavailable (%s): using sdpa attention", type(error).__name__)
            choice = "sdpa"
    else:
        choice = "sdpa"
    logger.info("attention implementation: %s", choice)
    return choice


def _dtype(model_args, training_args) -> torch.dtype:
    """Weights dtype. Half precision only where something keeps fp32 master weights.

    A bf16 weight near 0.02 moves in steps of ~1e-4, so pure-bf16 AdamW at GRPO's lr 1e-6 rounds every update
    away and trains nothing, silently. DeepSpeed's bf16 mode keeps fp32 master weights and LoRA trains fp32
    adapters, so those load in half precision; plain full fine-tuning loads fp32 and computes in bf16 autocast.
    """
    half = torch.bfloat16 if getattr(training_args, "bf16", False) else None
    half = torch.float16 if half is None and getattr(training_args, "fp16", False) else half
    if half is None:
        name = model_args.dtype if model_args.dtype not in (None, "auto") else "float32"
        return getattr(torch, name)
    if getattr(training_args, "deepspeed", None) or getattr(model_args, "use_peft", False) or quantized(model_args):
        return half
    logger.warning(
        "full fine-tuning without DeepSpeed: fp32 master weights with %s autocast (pure %s AdamW would round "
        "updates at lr %.0e away); use a DeepSpeed config to keep half-precision weights on the GPU",
        half, half, getattr(training_args, "learning_rate", 0.0),
    )  # fmt: skip
    return torch.float32


def _looks_like_a_path(name: str) -> bool:
    """Whether ``name`` is written as a filesystem path rather than a Hub id (``NAME`` or ``ORG/NAME``).

    >>> [_looks_like_a_path(n) for n in ("Qwen/Qwen2.5-VL-7B-Instruct", "/models/qwen", "./qwen", "~/m", "a/b/c")]
    [False, True, True, True, True]
    """
    return name.startswith(("/", "./", "../", "~")) or name in (".", "..") or name.count("/") > 1


POLICY_SETTING = "model_name_or_path, or MODEL in .env"  # where a run names its policy model


def local_model_problem(name: str, setting: str = POLICY_SETTING) -> str | None:
    """Why ``name``, as a local model folder, cannot be loaded; None for a loadable folder or a Hub id. ``setting``:
    where the user wrote ``name``."""
    folder = Path(name).expanduser()
    if not folder.exists():
        return f"no such folder (check {setting})" if _looks_like_a_path(name) else None
    if not folder.is_dir():
        return "it is a file, not a model folder"
    names = sorted(p.name for p in folder.iterdir())
    if not names:
        return "the folder is empty (an unfinished download or copy?): it needs config.json, the weights and the " \
               "processor files"  # fmt: skip
    if "config.json" not in names:
        shown = ", ".join(names[:5]) + (", …" if len(names) > 5 else "")
        return f"the folder has no config.json (it holds {shown}): point at the folder save_pretrained wrote"
    if not any(n.endswith(".safetensors") or n.startswith("pytorch_model") and n.endswith(".bin") for n in names):
        return "the folder has config.json but no weights (*.safetensors or *.bin): an unfinished download or copy?"
    return None


def model_source_config(name: str, revision: str | None = None, setting: str = POLICY_SETTING):
    """The transformers config of model ``name``, a local folder or a Hub id (no weights): a folder that does not
    exist or cannot be loaded, or an id that cannot be fetched (offline: not in the cache), is one line naming
    ``setting``, where the user wrote ``name``."""
    if problem := local_model_problem(name, setting):
        raise SuzakError(f"cannot load model {name!r}: {problem}")
    return _load_config(name, revision, setting)


def _load_config(path: str, revision: str | None, setting: str = POLICY_SETTING):
    from transformers import AutoConfig

    from suzak.data.hub import offline_unless_reachable

    with offline_unless_reachable() as offline:
        try:
            return AutoConfig.from_pretrained(path, revision=revision)
        except (OSError, ValueError) as error:
            why = "the Hub is unreachable and it is not in the local cache" if offline else str(error).splitlines()[0]
            raise SuzakError(
                f"cannot load model {path!r}: {why}.{_relative_folder_hint(path)} Download it where there is network "
                f"(`hf download {path} --local-dir /models/NAME`) and set {setting}, to that folder"
            ) from None


def _relative_folder_hint(name: str) -> str:
    """For an ``ORG/NAME`` id whose ``ORG`` is a folder here (``models/qwen3``): it was read as a Hub id because
    ``models/qwen3`` does not exist; say so, since a relative folder path was the likely intent."""
    parent = Path(name).expanduser().parent
    if name.count("/") != 1 or not parent.is_dir():
        return ""
    return (f" It was read as a Hub id because there is no folder {name!r} here (in {Path.cwd()}), though "
            f"{str(parent) + '/'!r} is one: check the folder name, or write the path as ./{name}.")  # fmt: skip


def _checked_config(model_args, for_vllm: bool = False):
    """(local path or Hub id, config) of the recipe's model: a folder that cannot be loaded, or a vision-language
    model of a family suzak does not support, is one line."""
    path = resolve_model_path(model_args.model_name_or_path, for_vllm=for_vllm)
    config = model_source_config(path, model_args.model_revision)
    try:
        vision_family(config)
    except SuzakError as error:
        raise SuzakError(f"model {model_args.model_name_or_path!r}: {error}") from None
    return path, config


def model_budget(model_args, min_pixels: int, max_pixels: int, *, for_vllm: bool = False) -> PixelBudget:
    """The pixel budget for the recipe's model, its factor read from the model's config (no weights loaded): what
    the data checks size images with before the model loads (text models: no factor, they see no images)."""
    _, config = _checked_config(model_args, for_vllm)
    return PixelBudget(min_pixels, max_pixels).for_model(config)


def model_config(model_args, *, for_vllm: bool = False):
    """The recipe's model's transformers config (no weights loaded); bad paths and unsupported families are one line."""
    return _checked_config(model_args, for_vllm)[1]


def model_type(model_args, *, for_vllm: bool = False) -> str | None:
    """The recipe's model's ``model_type`` (``qwen2_5_vl``, ``qwen2``, ...), read from its config (no weights loaded):
    what its box frame depends on (:mod:`suzak.media.boxes`)."""
    return getattr(_checked_config(model_args, for_vllm)[1], "model_type", None)


def quantized(model_args) -> str | None:
    """The flag (``load_in_4bit`` or ``load_in_8bit``) that loads the model through bitsandbytes, else None; any
    object with those fields (TRL's ``ModelConfig``, an evaluation's settings), None included.

    >>> from types import SimpleNamespace
    >>> quantized(SimpleNamespace(load_in_4bit=True)), quantized(SimpleNamespace(load_in_8bit=False)), quantized(None)
    ('load_in_4bit', None, None)
    """
    if getattr(model_args, "load_in_4bit", False):
        return "load_in_4bit"
    return "load_in_8bit" if getattr(model_args, "load_in_8bit", False) else None


# Modules kept out of bitsandbytes: transformers matches each pattern at the start of a module's full name (or as its
# end), so the vision tower of every supported family (``model.visual``, ``visual``) and the output head.
_VISION_MODULES = r"(?:.*\.)?visual"
_ALWAYS_UNQUANTIZED = ["lm_head"]


def quantization_config(model_args, compute_dtype: torch.dtype, *, quantize_vision_tower: bool = False):
    """transformers' ``BitsAndBytesConfig`` for TRL's ``ModelConfig`` fields (``load_in_4bit``, ``bnb_4bit_quant_type``,
    ``use_bnb_nested_quant``, ``bnb_4bit_quant_storage``, ``load_in_8bit``: TRL's ``get_quantization_config``), or None.

    It computes in ``compute_dtype`` (the run's: bf16 on a GPU, fp32 on the CPU; TRL's would take the ``dtype`` field,
    ``auto`` included) and keeps ``lm_head`` and, unless ``quantize_vision_tower``, the vision tower unquantized.
    """
    flag = quantized(model_args)
    if flag is None:
        return None
    from trl import get_quantization_config

    config = get_quantization_config(model_args)
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        raise SuzakError(f"{flag} needs bitsandbytes: pip install bitsandbytes==0.50.2 (bash setup.sh installs "
                         "it)") from None  # fmt: skip
    config.bnb_4bit_compute_dtype = compute_dtype
    config.llm_int8_skip_modules = _ALWAYS_UNQUANTIZED + ([] if quantize_vision_tower else [_VISION_MODULES])
    return config


def _device_map(training_args) -> dict[str, int | str]:
    """Where a quantized model's weights go (bitsandbytes quantizes them as they load there): this process's GPU, or
    the CPU (bitsandbytes' CPU backend) without one or with ``use_cpu``."""
    if not torch.cuda.is_available() or getattr(training_args, "use_cpu", False):
        return {"": "cpu"}
    from accelerate import PartialState

    return {"": PartialState().local_process_index}


def load_processor(model_args, *, for_vllm: bool = False):
    """The processor of the recipe's ``model_name_or_path`` (a VLM's, whose patch grid must be the model's; a text
    model's tokenizer), read before any weight loads: checks that need the chat template run on it first."""
    from transformers import AutoProcessor, AutoTokenizer

    from suzak.data.hub import offline_unless_reachable

    path, config = _checked_config(model_args, for_vllm)
    with offline_unless_reachable():
        if getattr(config, "vision_config", None) is None:
            return AutoTokenizer.from_pretrained(path, revision=model_args.model_revision)
        processing_class = AutoProcessor.from_pretrained(path, revision=model_args.model_revision)
    if patch_factor(processing_class) != patch_factor(config):
        raise SuzakError(f"model {path!r}: its processor makes {patch_factor(processing_class)}-pixel visual "
                         f"tokens but the model's vision tower {patch_factor(config)}-pixel ones (patch size x "
                         "merge size): the folder's processor config belongs to another model")  # fmt: skip
    return processing_class


def load_model_and_processor(model_args, training_args, *, quantize_vision_tower: bool = False, processing_class=None):
    """(model, processing_class) for the recipe's ``model_name_or_path``: the processor first (:func:`load_processor`,
    or the one given, already read by it), then the weights. ``load_in_4bit``/``load_in_8bit`` load it through
    bitsandbytes (:func:`quantization_config`)."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    from suzak.data.hub import offline_unless_reachable

    for_vllm = bool(getattr(training_args, "use_vllm", False))
    path, config = _checked_config(model_args, for_vllm)
    is_vlm = getattr(config, "vision_config", None) is not None
    kwargs = {
        "revision": model_args.model_revision,
        "dtype": _dtype(model_args, training_args),
        "attn_implementation": pick_attn_implementation(model_args.attn_implementation),
        "trust_remote_code": False,
    }
    quantization = quantization_config(model_args, kwargs["dtype"], quantize_vision_tower=quantize_vision_tower)
    if quantization is not None:
        kwargs |= {"quantization_config": quantization, "device_map": _device_map(training_args)}
    if is_vlm:
        use_qwen_video_positions()
    if processing_class is None:  # the processor first: its patch grid is checked before any weight loads
        processing_class = load_processor(model_args, for_vllm=for_vllm)
    with offline_unless_reachable():
        if is_vlm:
            model = AutoModelForImageTextToText.from_pretrained(path, **kwargs)
        else:
            model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    how = ""
    if quantization is not None:
        bits = "4-bit " + model_args.bnb_4bit_quant_type if model_args.load_in_4bit else "8-bit"
        how = f", {bits} through bitsandbytes" + (", vision tower too" if quantize_vision_tower else "")
    logger.info("loaded %s (%s, %s%s)", path, type(model).__name__, kwargs["dtype"], how)
    return model, processing_class


def adapter_base(path: str | Path) -> str | None:
    """The base model a LoRA adapter folder names (``adapter_config.json``), or None when ``path`` is not one."""
    import json

    config_file = Path(path) / "adapter_config.json"
    if not config_file.is_file():
        return None
    base = json.loads(config_file.read_text()).get("base_model_name_or_path")
    if not base:
        raise SuzakError(f"{config_file} names no base_model_name_or_path: cannot tell which model the adapter is for "
                         "(`suzak export lora` takes --base_model)")  # fmt: skip
    return base


def vision_parameters(model) -> list[tuple[str, torch.nn.Parameter]]:
    """The vision tower's parameters (every supported family keeps it under a ``visual`` module)."""
    return [(n, p) for n, p in model.named_parameters() if ".visual." in f".{n}"]


def freeze_vision_tower(model) -> int:
    """Stop gradients into the vision tower; returns how many parameters were frozen."""
    params = vision_parameters(model)
    if not params:
        raise SuzakError("freeze_vision_tower is set but the model has no vision tower ('visual' module)")
    for _, param in params:
        param.requires_grad_(False)
    count = sum(p.numel() for _, p in params)
    logger.info("froze the vision tower: %d parameters", count)
    return count
